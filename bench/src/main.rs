//! `outboxd-bench suite [--quick]`: the benchmark suite of outboxd (run it through
//! `bench/run`, which builds the release binaries and brings up the local stack).
//!
//! Contenders, on the same broker, topics, receiver and run, interleaved:
//! `naive` (no dedup, upper bound), `pg-table` (dedup in a PostgreSQL table),
//! `outboxd` (release binary, `store.fsync = true`) and `outboxd-relaxed`
//! (`store.fsync = false`). Scenarios: drain, added latency, slow receiver, store.
//! Writes a markdown report (default `bench/results.md`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::io::AsyncBufReadExt;

const PARTITIONS: i32 = 8;
const KEYS: u64 = 10_000;
const PAYLOAD_BYTES: usize = 500;
const SLOW_RECEIVER_MS: u64 = 20;

#[derive(Parser, Debug, Clone)]
#[command(about = "outboxd benchmark suite", args_override_self = true)]
struct Args {
    /// Small sizes (a few minutes): 20k drain events, 1 run, 10 s latency, 100k store records.
    #[arg(long)]
    quick: bool,
    /// Drain: messages pre-loaded (5% of them duplicates). Default 200000 (quick 20000).
    #[arg(long)]
    events: Option<u64>,
    /// Interleaved repetitions of drain, latency and slow-receiver runs. Default 3 (quick 1).
    #[arg(long)]
    runs: Option<usize>,
    /// Added latency: events per second.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Added latency: seconds per contender and run. Default 60 (quick 10).
    #[arg(long)]
    latency_secs: Option<u64>,
    /// Slow receiver: measuring window per configuration, seconds. Default 10 (quick 4).
    #[arg(long)]
    slow_secs: Option<u64>,
    /// Store: retained records. Default 1000000 (quick 100000).
    #[arg(long)]
    store_records: Option<u64>,
    /// Drain: a contender still running after this many seconds is stopped and
    /// measured on what it committed. Default 120 (quick 40).
    #[arg(long)]
    drain_cap_secs: Option<u64>,
    /// Environment variable for the outboxd processes, KEY=VALUE (repeatable; investigation).
    #[arg(long = "outboxd-env")]
    outboxd_env: Vec<String>,
    /// librdkafka property for every contender's consumer, KEY=VALUE (repeatable).
    #[arg(long = "kafka-option")]
    kafka_options: Vec<String>,
    /// Comma-separated subset of the contenders (naive,pg-table,outboxd,outboxd-relaxed) for drain and latency.
    #[arg(long, default_value = "naive,pg-table,outboxd,outboxd-relaxed")]
    contenders: String,
    /// Extra contenders in the latency scenario only: outboxd with the group-commit
    /// window off (`store.commit_interval = "0ms"`), to show what the window costs.
    #[arg(long, default_value = "outboxd-window0,outboxd-relaxed-window0")]
    latency_extra: String,
    /// Comma-separated subset of: drain,latency,slow,store.
    #[arg(long, default_value = "drain,latency,slow,store")]
    scenarios: String,
    #[arg(long, default_value = "127.0.0.1:19092")]
    brokers: String,
    #[arg(long, default_value = "postgresql://postgres@127.0.0.1:15432/outbox")]
    pg: String,
    /// Where the release binaries are (outboxd, naive, pg-table).
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Scratch space for stores and configs (same disk as the stores: the fdatasync floor is measured here).
    #[arg(long, default_value = "target/bench-work")]
    work_dir: PathBuf,
    #[arg(long, default_value = "bench/results.md")]
    out: PathBuf,
    /// Appended to the report verbatim when it exists (hand-written findings).
    #[arg(long, default_value = "bench/findings.md")]
    findings: PathBuf,
    /// What the outboxd binary was built from, for the report (default: the work tree's git state).
    #[arg(long, default_value = "")]
    built_from: String,
    /// The command as typed, for the report.
    #[arg(long, default_value = "bench/run")]
    command: String,
}

struct Sizes {
    events: u64,
    runs: usize,
    latency_secs: u64,
    slow_secs: u64,
    store_records: u64,
    drain_cap: Duration,
    floor_samples: usize,
}

impl Sizes {
    fn from(a: &Args) -> Sizes {
        let q = a.quick;
        Sizes {
            events: a.events.unwrap_or(if q { 20_000 } else { 200_000 }),
            runs: a.runs.unwrap_or(if q { 1 } else { 3 }).max(1),
            latency_secs: a.latency_secs.unwrap_or(if q { 10 } else { 60 }),
            slow_secs: a.slow_secs.unwrap_or(if q { 4 } else { 10 }),
            store_records: a.store_records.unwrap_or(if q { 100_000 } else { 1_000_000 }),
            drain_cap: Duration::from_secs(a.drain_cap_secs.unwrap_or(if q { 40 } else { 120 })),
            floor_samples: if q { 300 } else { 1000 },
        }
    }
}

// ---------------------------------------------------------------- contenders

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Contender {
    Naive,
    PgTable,
    Outboxd,
    Relaxed,
    OutboxdW0,
    RelaxedW0,
}

/// The default four are in `--contenders`; also selectable with --contenders (investigation): outboxd with `store.commit_interval = "0ms"`.
const ALL: [Contender; 6] = [
    Contender::Naive,
    Contender::PgTable,
    Contender::Outboxd,
    Contender::Relaxed,
    Contender::OutboxdW0,
    Contender::RelaxedW0,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Naive => "naive",
            Contender::PgTable => "pg-table",
            Contender::Outboxd => "outboxd",
            Contender::Relaxed => "outboxd-relaxed",
            Contender::OutboxdW0 => "outboxd-window0",
            Contender::RelaxedW0 => "outboxd-relaxed-window0",
        }
    }
    fn fsync(self) -> bool {
        !matches!(self, Contender::Relaxed | Contender::RelaxedW0)
    }
    /// `store.commit_interval` when not the shipped default.
    fn window(self) -> Option<&'static str> {
        matches!(self, Contender::OutboxdW0 | Contender::RelaxedW0).then_some("0ms")
    }
}

/// Rotates the contender order per run so no contender always goes first.
fn order(rep: usize, only: &str) -> Vec<Contender> {
    let mut v: Vec<Contender> = ALL.iter().copied().filter(|c| only.split(',').any(|o| o.trim() == c.name())).collect();
    let n = v.len();
    if n > 0 {
        v.rotate_left(rep % n);
    }
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Hk {
    Log,
    Http,
}

impl Hk {
    fn name(self) -> &'static str {
        match self {
            Hk::Log => "log",
            Hk::Http => "http",
        }
    }
}

struct Cfg<'a> {
    name: String,
    group: String,
    topics: Vec<String>,
    handler: Hk,
    fsync: bool,
    max_in_flight: usize,
    /// `store.commit_interval`; None = the shipped default.
    commit_window: Option<&'a str>,
    retention: &'a str,
    gc_interval: &'a str,
    drain_timeout: &'a str,
}

struct Bench {
    args: Args,
    sizes: Sizes,
    run_id: String,
    work: PathBuf,
    bin: PathBuf,
    recv: Arc<Recv>,
    recv_port: u16,
    admin: AdminClient<DefaultClientContext>,
    topics: Mutex<Vec<String>>,
    clk_tck: f64,
}

impl Bench {
    fn write_config(&self, c: &Cfg) -> anyhow::Result<(PathBuf, u16)> {
        let admin_port = free_port()?;
        let handler = match c.handler {
            Hk::Log => "kind = \"log\"\n".to_owned(),
            Hk::Http => format!(
                "kind = \"http\"\nurl = \"http://127.0.0.1:{}/e/{{aggregate_id}}\"\ntimeout = \"30s\"\n",
                self.recv_port
            ),
        };
        let topics = c.topics.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ");
        let mut options = String::new();
        for kv in &self.args.kafka_options {
            let (k, v) = kv.split_once('=').context("--kafka-option KEY=VALUE")?;
            options.push_str(&format!("{k:?} = {v:?}\n"));
        }
        let text = format!(
            "[kafka]\nbrokers = {brokers:?}\ngroup_id = {group:?}\ncommit_interval = \"100ms\"\ndrain_timeout = {dt:?}\n[kafka.options]\n{options}\n\
             [store]\npath = {path:?}\nretention = {ret:?}\n{window}max_in_flight = {mif}\ngc_interval = {gc:?}\nfsync = {fsync}\n\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\n\n\
             [[handlers]]\ntopics = [{topics}]\n{handler}",
            // The admin server (metrics) stays on, as shipped, on a free port.
            admin = admin_port,
            brokers = self.args.brokers,
            group = c.group,
            dt = c.drain_timeout,
            // Relative to the working directory of the child (the work dir).
            path = format!("stores/{}", c.name),
            ret = c.retention,
            window = c.commit_window.map(|w| format!("commit_interval = {w:?}\n")).unwrap_or_default(),
            mif = c.max_in_flight,
            gc = c.gc_interval,
            fsync = c.fsync,
        );
        let file = self.work.join("configs").join(format!("{}.toml", c.name));
        std::fs::write(&file, text)?;
        let store = self.work.join("stores").join(&c.name);
        if store.exists() {
            std::fs::remove_dir_all(&store)?;
        }
        Ok((file, admin_port))
    }

    fn spawn(&self, who: Contender, config: &Path, table: &str, log: &str) -> anyhow::Result<ChildProc> {
        let mut cmd = match who {
            Contender::Naive => {
                let mut c = tokio::process::Command::new(self.bin.join("naive"));
                c.arg("--config").arg(config);
                c
            }
            Contender::PgTable => {
                let mut c = tokio::process::Command::new(self.bin.join("pg-table"));
                c.arg("--config").arg(config).args(["--pg", &self.args.pg, "--table", table, "--pool", "32"]);
                c
            }
            Contender::Outboxd | Contender::Relaxed | Contender::OutboxdW0 | Contender::RelaxedW0 => {
                let mut c = tokio::process::Command::new(self.bin.join("outboxd"));
                c.arg("run").arg("--config").arg(config);
                c
            }
        };
        cmd.current_dir(&self.work).env("OUTBOXD_LOG", log);
        if matches!(who, Contender::Outboxd | Contender::Relaxed | Contender::OutboxdW0 | Contender::RelaxedW0) {
            for kv in &self.args.outboxd_env {
                let (k, v) = kv.split_once('=').context("--outboxd-env KEY=VALUE")?;
                cmd.env(k, v);
            }
        }
        ChildProc::spawn(cmd, who.name())
    }

    async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let res = self
            .admin
            .create_topics([&t], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))))
            .await?;
        for r in res {
            if let Err((topic, code)) = r {
                if code != RDKafkaErrorCode::TopicAlreadyExists {
                    bail!("creating topic {topic}: {code}");
                }
            }
        }
        self.topics.lock().unwrap().push(name.to_owned());
        // Wait until the broker serves metadata for every partition.
        let probe: BaseConsumer = client(&self.args.brokers, None).create()?;
        for _ in 0..100 {
            if let Ok(md) = probe.fetch_metadata(Some(name), Duration::from_secs(5)) {
                if md
                    .topics()
                    .first()
                    .is_some_and(|t| t.partitions().len() == partitions as usize && t.error().is_none())
                {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("topic {name} did not become ready")
    }

    fn topic(&self, what: &str) -> String {
        format!("bench.{}.{what}", self.run_id)
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn client(brokers: &str, group: Option<&str>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    if let Some(g) = group {
        c.set("group.id", g).set("enable.auto.commit", "false");
    }
    c
}

// ---------------------------------------------------------------- child processes

struct ChildProc {
    name: &'static str,
    child: tokio::process::Child,
    pid: i32,
    spawned: Instant,
    marks: Arc<Mutex<Marks>>,
}

#[derive(Default)]
struct Marks {
    running: Option<Instant>,
    assigned: Option<Instant>,
    handled: Option<Instant>,
    tail: VecDeque<String>,
}

impl ChildProc {
    fn spawn(mut cmd: tokio::process::Command, name: &'static str) -> anyhow::Result<ChildProc> {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let spawned = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("child pid")? as i32;
        let marks: Arc<Mutex<Marks>> = Arc::default();
        let stderr = child.stderr.take().context("stderr")?;
        let m = marks.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let now = Instant::now();
                let mut m = m.lock().unwrap();
                if line.contains("outboxd running") {
                    m.running.get_or_insert(now);
                }
                if line.contains("partitions assigned") {
                    m.assigned.get_or_insert(now);
                }
                if line.contains("event handled") {
                    m.handled.get_or_insert(now);
                }
                if m.tail.len() >= 40 {
                    m.tail.pop_front();
                }
                m.tail.push_back(line);
            }
        });
        Ok(ChildProc { name, child, pid, spawned, marks })
    }

    fn tail(&self) -> String {
        self.marks.lock().unwrap().tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited early ({status}); its last stderr lines:\n{}", self.name, self.tail());
        }
        Ok(())
    }

    async fn wait_mark(
        &mut self,
        pick: fn(&Marks) -> Option<Instant>,
        what: &str,
        timeout: Duration,
    ) -> anyhow::Result<Instant> {
        let t0 = Instant::now();
        loop {
            if let Some(t) = pick(&self.marks.lock().unwrap()) {
                return Ok(t);
            }
            self.check_alive()?;
            if t0.elapsed() > timeout {
                bail!("{}: no '{what}' after {timeout:?}; last stderr lines:\n{}", self.name, self.tail());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn wait_assigned(&mut self) -> anyhow::Result<Instant> {
        self.wait_mark(|m| m.assigned, "partitions assigned", Duration::from_secs(90)).await
    }

    /// CPU seconds (user + system) so far.
    fn cpu_secs(&self, clk: f64) -> f64 {
        proc_cpu_ticks(self.pid, false).map(|t| t as f64 / clk).unwrap_or(f64::NAN)
    }

    /// (VmRSS, VmHWM) in bytes.
    fn rss(&self) -> (u64, u64) {
        proc_rss(self.pid)
    }

    /// SIGTERM, then SIGKILL after `grace`.
    async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!("bench: {} exited with {status}; last lines:\n{}", self.name, self.tail());
                }
            }
            Err(_) => {
                eprintln!("bench: {} (pid {}) did not stop within {grace:?}: SIGKILL", self.name, self.pid);
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

fn proc_cpu_ticks(pid: i32, with_children: bool) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields from 3 (state): utime = 14, stime = 15, cutime = 16, cstime = 17.
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Some(n(14) + n(15) + if with_children { n(16) + n(17) } else { 0 })
}

fn proc_rss(pid: i32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// CPU ticks of every PostgreSQL server process (backends that exited are in the
/// postmaster's cutime), so a difference covers the pg-table contender's server side.
fn pg_server_ticks() -> u64 {
    let mut sum = 0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "postgres" {
                sum += proc_cpu_ticks(pid, true).unwrap_or(0);
            }
        }
    }
    sum
}

/// CPU used on the machine by processes that are not part of the benchmark
/// (not the driver, its children, the Kafka broker or PostgreSQL): other work
/// sharing the 2 cores makes every number worse and noisier.
#[derive(Clone, Copy)]
struct Noise {
    busy: u64,
    ours: u64,
    at: Instant,
}

impl Noise {
    fn now() -> Noise {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let busy = stat
            .lines()
            .next()
            .map(|l| {
                let f: Vec<u64> = l.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
                // user nice system idle iowait irq softirq steal
                [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum()
            })
            .unwrap_or(0);
        let ru = |who| {
            nix::sys::resource::getrusage(who)
                .map(|u| {
                    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
                    t(u.user_time()) + t(u.system_time())
                })
                .unwrap_or(0.0)
        };
        let own = ru(nix::sys::resource::UsageWho::RUSAGE_SELF) + ru(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
        // Children still running are not in RUSAGE_CHILDREN yet: add them.
        let mut ours = (own * CLK_GUESS) as u64 + pg_server_ticks() + broker_ticks();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            let me = std::process::id().to_string();
            for e in dir.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
                    if rest.split_whitespace().nth(1) == Some(me.as_str()) {
                        ours += proc_cpu_ticks(pid, true).unwrap_or(0);
                    }
                }
            }
        }
        Noise { busy, ours, at: Instant::now() }
    }

    /// Fraction of the machine (all cores) used by other processes since `self`.
    fn other_share(&self) -> f64 {
        let now = Noise::now();
        let secs = (now.at - self.at).as_secs_f64();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let other = now.busy.saturating_sub(self.busy) as f64 - now.ours.saturating_sub(self.ours) as f64;
        (other / CLK_GUESS / (secs * cores)).max(0.0)
    }
}

/// USER_HZ: /proc/stat and /proc/PID/stat count in these ticks (100 on Linux).
const CLK_GUESS: f64 = 100.0;

fn broker_ticks() -> u64 {
    let mut sum = 0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmd.contains("kafka.Kafka") {
                sum += proc_cpu_ticks(pid, true).unwrap_or(0);
            }
        }
    }
    sum
}

/// outboxd's group-commit figures from its Prometheus endpoint: (commits, mean
/// records per commit, mean flush+fdatasync ms).
async fn sync_metrics(port: u16) -> Option<(f64, f64, f64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut text)).await.ok()?.ok()?;
    let val = |name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let commits = val("outboxd_store_sync_seconds_count")?;
    let sync_sum = val("outboxd_store_sync_seconds_sum")?;
    let batch_sum = val("outboxd_store_commit_batch_records_sum")?;
    Some((commits, batch_sum / commits.max(1.0), sync_sum / commits.max(1.0) * 1000.0))
}

// ---------------------------------------------------------------- receiver

#[derive(Default)]
struct Recv {
    delay_ms: AtomicU64,
    inner: Mutex<RecvInner>,
}

#[derive(Default)]
struct RecvInner {
    calls: u64,
    keys: HashSet<String>,
    repeats: u64,
    /// (produce time µs, latency µs)
    lat: Vec<(i64, i64)>,
    first: Option<Instant>,
}

impl Recv {
    fn reset(&self, delay_ms: u64) {
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        *self.inner.lock().unwrap() = RecvInner::default();
    }
    fn calls(&self) -> u64 {
        self.inner.lock().unwrap().calls
    }
}

async fn on_call(State(r): State<Arc<Recv>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let d = r.delay_ms.load(Ordering::Relaxed);
    if d > 0 {
        tokio::time::sleep(Duration::from_millis(d)).await;
    }
    let now = now_us();
    let ts = find_ts(&body);
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let mut i = r.inner.lock().unwrap();
    i.calls += 1;
    i.first.get_or_insert_with(Instant::now);
    if !i.keys.insert(key) {
        i.repeats += 1;
    }
    if let Some(ts) = ts {
        i.lat.push((ts, now - ts));
    }
    StatusCode::OK
}

fn find_ts(body: &[u8]) -> Option<i64> {
    const K: &[u8] = b"\"ts_us\":";
    let at = body.windows(K.len()).position(|w| w == K)? + K.len();
    let digits: Vec<u8> = body[at..].iter().take_while(|b| b.is_ascii_digit()).copied().collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

// ---------------------------------------------------------------- producing

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A UUID-shaped event id for event number `i` of a topic.
fn event_id(salt: u64, i: u64) -> String {
    let a = splitmix(salt ^ i.wrapping_mul(0x1000_0000_0000_0001));
    let b = splitmix(a);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// ~500 bytes of outbox payload (JSON text, as Debezium's String converter gives it).
fn payload(i: u64, key: &str, ts_us: i64) -> Vec<u8> {
    let mut s = format!(
        "{{\"orderId\":\"{key}\",\"seq\":{i},\"ts_us\":{ts_us},\"status\":\"CREATED\",\
         \"customer\":{{\"id\":\"c-{c:06}\",\"name\":\"Customer {c}\",\"email\":\"customer{c}@example.com\"}},\
         \"items\":[{{\"sku\":\"SKU-{s1:05}\",\"qty\":{q1},\"price\":\"19.99\"}},{{\"sku\":\"SKU-{s2:05}\",\"qty\":{q2},\"price\":\"5.49\"}}],\
         \"currency\":\"EUR\",\"total\":\"{t}.{tc:02}\",\"note\":\"",
        c = i % 7919,
        s1 = i % 977,
        s2 = (i * 7) % 977,
        q1 = 1 + i % 3,
        q2 = 1 + i % 5,
        t = 20 + i % 400,
        tc = i % 100,
    );
    while s.len() < PAYLOAD_BYTES - 2 {
        s.push(char::from(b'a' + (s.len() % 26) as u8));
    }
    s.push_str("\"}");
    s.into_bytes()
}

struct ProdCtx {
    errors: AtomicU64,
}
impl ClientContext for ProdCtx {}
impl ProducerContext for ProdCtx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn producer(brokers: &str, linger_ms: u32) -> anyhow::Result<BaseProducer<ProdCtx>> {
    Ok(client(brokers, None)
        .set("linger.ms", linger_ms.to_string())
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "500000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(ProdCtx { errors: AtomicU64::new(0) })?)
}

fn send(p: &BaseProducer<ProdCtx>, topic: &str, key: &str, id: &str, value: &[u8], ts_ms: i64) -> anyhow::Result<()> {
    let headers = OwnedHeaders::new()
        .insert(Header { key: "id", value: Some(id) })
        .insert(Header { key: "eventType", value: Some("OrderCreated") });
    let mut rec = BaseRecord::to(topic).key(key).payload(value).headers(headers).timestamp(ts_ms);
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                p.poll(Duration::from_millis(50));
                rec = r;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Loads `n` messages; with `dups`, every 20th is an earlier event again (same
/// id, key and payload) at a new offset, as Debezium re-sends after a crash.
/// `keys` = 1 puts everything on one hot key. Returns (messages, duplicates).
fn preload(brokers: &str, topic: &str, salt: u64, n: u64, keys: u64, dups: bool) -> anyhow::Result<(u64, u64)> {
    let p = producer(brokers, 20)?;
    let mut events = 0u64;
    let mut dup_count = 0u64;
    for m in 0..n {
        let i = if dups && m % 20 == 19 && events > 1000 {
            dup_count += 1;
            splitmix(salt ^ m) % (events - 500)
        } else {
            events += 1;
            events - 1
        };
        let key = format!("agg-{:06}", splitmix(i ^ 0x55) % keys);
        let ts = now_us();
        send(&p, topic, &key, &event_id(salt, i), &payload(i, &key, ts), ts / 1000)?;
        if m % 1024 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    p.flush(Duration::from_secs(120))?;
    let errors = p.context().errors.load(Ordering::Relaxed);
    anyhow::ensure!(errors == 0, "{errors} messages were not delivered to {topic}");
    Ok((n, dup_count))
}

/// Produces `rate` events per second for `secs` seconds, each stamped with the
/// time of its send (Kafka timestamp and `ts_us` in the payload).
fn produce_at_rate(brokers: &str, topic: &str, salt: u64, rate: u64, secs: u64) -> anyhow::Result<u64> {
    let p = producer(brokers, 0)?;
    let n = rate * secs;
    let start = Instant::now();
    for i in 0..n {
        let due = start + Duration::from_micros(i * 1_000_000 / rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let key = format!("agg-{:06}", splitmix(i ^ 0x77) % KEYS);
        let ts = now_us();
        send(&p, topic, &key, &event_id(salt, i), &payload(i, &key, ts), ts / 1000)?;
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30))?;
    Ok(n)
}

// ---------------------------------------------------------------- offsets

struct GroupWatch {
    consumer: BaseConsumer,
    tpl: TopicPartitionList,
}

impl GroupWatch {
    fn new(brokers: &str, group: &str, topic: &str, partitions: i32) -> anyhow::Result<GroupWatch> {
        let consumer: BaseConsumer = client(brokers, Some(group)).create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        Ok(GroupWatch { consumer, tpl })
    }

    fn committed(&self) -> i64 {
        match self.consumer.committed_offsets(self.tpl.clone(), Duration::from_secs(5)) {
            Ok(t) => t
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .sum(),
            Err(_) => 0,
        }
    }
}

fn end_offsets(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<i64> {
    let c: BaseConsumer = client(brokers, None).create()?;
    let mut sum = 0;
    for p in 0..partitions {
        sum += c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1;
    }
    Ok(sum)
}

// ---------------------------------------------------------------- statistics

fn pct(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    let s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    (s.iter().copied().fold(f64::INFINITY, f64::min), s.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// "median (min–max)" with `digits` decimals; only the median with one sample.
fn mmm(v: &[f64], digits: usize) -> String {
    let m = median(v);
    if !m.is_finite() {
        return "–".into();
    }
    let (lo, hi) = min_max(v);
    if v.len() > 1 {
        format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})")
    } else {
        format!("{m:.digits$}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

// ---------------------------------------------------------------- scenarios

#[derive(Debug, Clone, Default)]
struct DrainResult {
    eps: f64,
    cpu_per_100k: f64,
    pg_cpu_per_100k: f64,
    calls: u64,
    repeats: u64,
    partial: bool,
    committed: i64,
    rss: u64,
    sync: Option<(f64, f64, f64)>,
}

async fn drain_run(
    b: &Bench,
    who: Contender,
    hk: Hk,
    rep: usize,
    topic: &str,
    total: i64,
) -> anyhow::Result<DrainResult> {
    let name = format!("drain-{}-{}-{rep}", who.name(), hk.name());
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, admin) = b.write_config(&Cfg {
        name: name.clone(),
        group: group.clone(),
        topics: vec![topic.to_owned()],
        handler: hk,
        fsync: who.fsync(),
        max_in_flight: 256,
        commit_window: who.window(),
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
    })?;
    b.recv.reset(0);
    let table = format!("processed_events_{}_{}_{rep}", b.run_id.replace('-', "_"), hk.name());
    let pg0 = pg_server_ticks();
    let n0 = Noise::now();
    let mut child = b.spawn(who, &cfg, &table, QUIET_LOG)?;
    let t0 = child.wait_assigned().await?;
    let watch = GroupWatch::new(&b.args.brokers, &group, topic, PARTITIONS)?;
    let mut committed;
    let mut partial = false;
    let t_end = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        committed = watch.committed();
        if committed >= total {
            break Instant::now();
        }
        if t0.elapsed() > b.sizes.drain_cap {
            partial = true;
            break Instant::now();
        }
        child.check_alive()?;
    };
    let cpu = child.cpu_secs(b.clk_tck);
    let (rss, _) = child.rss();
    let sync = sync_metrics(admin).await;
    let pg_cpu = (pg_server_ticks().saturating_sub(pg0)) as f64 / b.clk_tck;
    let other = n0.other_share();
    child.stop(Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (calls, repeats) = {
        let i = b.recv.inner.lock().unwrap();
        (i.calls, i.repeats)
    };
    let secs = (t_end - t0).as_secs_f64();
    let per100k = 100_000.0 / committed.max(1) as f64;
    let r = DrainResult {
        eps: committed as f64 / secs,
        cpu_per_100k: cpu * per100k,
        pg_cpu_per_100k: if who == Contender::PgTable { pg_cpu * per100k } else { f64::NAN },
        calls,
        repeats,
        partial,
        committed,
        rss,
        sync,
    };
    eprintln!(
        "bench: drain {:<16} {:<4} run {rep}: {:>8.0} events/s, {:.2} CPU s/100k{}{} (calls {calls}, repeats {repeats}; other load {:.0}%){}",
        who.name(),
        hk.name(),
        r.eps,
        r.cpu_per_100k,
        if who == Contender::PgTable { format!(" + PostgreSQL {:.2}", r.pg_cpu_per_100k) } else { String::new() },
        if partial { format!(" [stopped after {:?}: {committed} of {total}]", b.sizes.drain_cap) } else { String::new() },
        other * 100.0,
        sync.map(|(c, bsz, ms)| format!(" [{c:.0} group commits, {bsz:.1} records each, {ms:.2} ms each]")).unwrap_or_default(),
    );
    Ok(r)
}

/// outboxd logs: warnings, plus the assignment line the clock starts on (no per-event line).
const QUIET_LOG: &str = "warn,outboxd::kafka::consumer=info";

#[derive(Debug, Clone, Default)]
struct LatResult {
    p50: f64,
    p99: f64,
    p999: f64,
    samples: usize,
    /// group commits per second, records per commit, ms per flush+fdatasync
    sync: Option<(f64, f64, f64)>,
}

async fn latency_run(b: &Bench, who: Contender, rep: usize) -> anyhow::Result<LatResult> {
    let name = format!("lat-{}-{rep}", who.name());
    let topic = b.topic(&format!("lat.{}.{rep}", who.name()));
    b.create_topic(&topic, PARTITIONS).await?;
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, admin) = b.write_config(&Cfg {
        name: name.clone(),
        group,
        topics: vec![topic.clone()],
        handler: Hk::Http,
        fsync: who.fsync(),
        max_in_flight: 256,
        commit_window: who.window(),
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
    })?;
    let table = format!("processed_events_{}_lat_{rep}", b.run_id.replace('-', "_"));
    let mut child = b.spawn(who, &cfg, &table, QUIET_LOG)?;
    child.wait_assigned().await?;
    // Let the consumer's fetchers and the receiver connection settle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.recv.reset(0);
    let salt = splitmix(rep as u64 ^ 0xabc ^ who as u64);
    let (brokers, t, rate, secs) = (b.args.brokers.clone(), topic.clone(), b.args.rate, b.sizes.latency_secs);
    let start_us = now_us();
    let n = tokio::task::spawn_blocking(move || produce_at_rate(&brokers, &t, salt, rate, secs)).await??;
    let t0 = Instant::now();
    while b.recv.calls() < n && t0.elapsed() < Duration::from_secs(30) {
        child.check_alive()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sync = sync_metrics(admin).await;
    let run_secs = (now_us() - start_us) as f64 / 1e6;
    child.stop(Duration::from_secs(30)).await?;
    let warm = start_us + 1_000_000; // the first second is warm-up
    let mut lat: Vec<i64> =
        b.recv.inner.lock().unwrap().lat.iter().filter(|(ts, _)| *ts >= warm).map(|(_, l)| *l).collect();
    lat.sort_unstable();
    let calls = b.recv.calls();
    if calls < n {
        eprintln!("bench: latency {}: only {calls} of {n} events reached the receiver", who.name());
    }
    let sync = sync.map(|(c, bsz, ms)| (c / run_secs, bsz, ms));
    let r = LatResult { p50: pct(&lat, 0.5), p99: pct(&lat, 0.99), p999: pct(&lat, 0.999), samples: lat.len(), sync };
    eprintln!(
        "bench: latency {:<16} run {rep}: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms ({} samples){}",
        who.name(),
        r.p50 / 1000.0,
        r.p99 / 1000.0,
        r.p999 / 1000.0,
        r.samples,
        r.sync
            .map(|(c, bsz, ms)| format!(" [{c:.0} group commits/s, {bsz:.1} records each, {ms:.2} ms each]"))
            .unwrap_or_default(),
    );
    Ok(r)
}

/// Two appends + fdatasync of a small file on the stores' disk, timed as a pair (µs).
fn fdatasync_floor(dir: &Path, samples: usize) -> anyhow::Result<(Vec<i64>, Vec<i64>)> {
    let path = dir.join("floor.dat");
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&path)?;
    f.sync_all()?;
    let buf = [7u8; 256];
    let (mut pairs, mut singles) = (Vec::with_capacity(samples), Vec::with_capacity(samples * 2));
    for _ in 0..samples {
        let t = Instant::now();
        f.write_all(&buf)?;
        f.sync_data()?;
        let mid = t.elapsed();
        f.write_all(&buf)?;
        f.sync_data()?;
        let all = t.elapsed();
        singles.push(mid.as_micros() as i64);
        singles.push((all - mid).as_micros() as i64);
        pairs.push(all.as_micros() as i64);
    }
    std::fs::remove_file(&path)?;
    Ok((pairs, singles))
}

async fn slow_run(b: &Bench, who: Contender, mif: usize, topic: &str, label: &str, rep: usize) -> anyhow::Result<f64> {
    let name = format!("slow-{}-{mif}-{label}-{rep}", who.name());
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, admin) = b.write_config(&Cfg {
        name,
        group,
        topics: vec![topic.to_owned()],
        handler: Hk::Http,
        fsync: who.fsync(),
        max_in_flight: mif,
        commit_window: who.window(),
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "2s",
    })?;
    let _ = admin;
    b.recv.reset(SLOW_RECEIVER_MS);
    let mut child = b.spawn(who, &cfg, "unused", QUIET_LOG)?;
    child.wait_assigned().await?;
    let t0 = Instant::now();
    while b.recv.calls() == 0 {
        child.check_alive()?;
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("{}: no call reached the receiver", who.name());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (c1, t1) = (b.recv.calls(), Instant::now());
    tokio::time::sleep(Duration::from_secs(b.sizes.slow_secs)).await;
    let (c2, t2) = (b.recv.calls(), Instant::now());
    child.check_alive()?;
    child.stop(Duration::from_secs(30)).await?;
    b.recv.reset(0);
    let eps = (c2 - c1) as f64 / (t2 - t1).as_secs_f64();
    eprintln!(
        "bench: slow receiver {:<16} max_in_flight {mif:>3} {label:<9} run {rep}: {eps:>7.0} events/s",
        who.name()
    );
    Ok(eps)
}

#[derive(Debug, Default)]
struct StoreResult {
    records: u64,
    load_eps: f64,
    load_secs: f64,
    rss_end: u64,
    rss_peak: u64,
    bytes_on_disk: u64,
    du_bytes: u64,
    done: u64,
    stats_secs: f64,
    cold_running: f64,
    cold_assigned: f64,
    cold_handled: f64,
    cold_rss: u64,
    base_running: f64,
    base_assigned: f64,
    base_handled: f64,
    open_secs: f64,
    gc_secs: f64,
    gc_removed: u64,
    relaxed_load_eps: f64,
    relaxed_rss_end: u64,
}

fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut sum = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(md) = e.metadata() {
                sum += if md.is_dir() { dir_bytes(&e.path()) } else { md.blocks() * 512 };
            }
        }
    }
    sum
}

/// Runs outboxd over the whole topic; returns (events/s, seconds, RSS at the end, peak RSS).
async fn load_store(
    b: &Bench,
    cfg: &Path,
    group: &str,
    topic: &str,
    total: i64,
) -> anyhow::Result<(f64, f64, u64, u64)> {
    let mut child = b.spawn(Contender::Outboxd, cfg, "", QUIET_LOG)?;
    let t0 = child.wait_assigned().await?;
    let watch = GroupWatch::new(&b.args.brokers, group, topic, PARTITIONS)?;
    let mut last_print = Instant::now();
    let t_end = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let c = watch.committed();
        if c >= total {
            break Instant::now();
        }
        if last_print.elapsed() > Duration::from_secs(15) {
            eprintln!("bench: store load: {c} of {total} committed, RSS {} MB", child.rss().0 >> 20);
            last_print = Instant::now();
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            bail!("store load did not finish in 30 min ({c} of {total})");
        }
        child.check_alive()?;
    };
    // RSS once the last event is handled, with every record retained.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss, hwm) = child.rss();
    child.stop(Duration::from_secs(60)).await?;
    let secs = (t_end - t0).as_secs_f64();
    Ok((total as f64 / secs, secs, rss, hwm))
}

async fn outboxd_cmd(b: &Bench, args: &[&str]) -> anyhow::Result<(f64, std::process::Output)> {
    let t = Instant::now();
    let out = tokio::process::Command::new(b.bin.join("outboxd"))
        .args(args)
        .current_dir(&b.work)
        .env("OUTBOXD_LOG", "warn")
        .output()
        .await?;
    Ok((t.elapsed().as_secs_f64(), out))
}

/// Time from process start to the store open / partitions assigned / first event handled.
async fn cold_start(b: &Bench, cfg: &Path) -> anyhow::Result<(f64, f64, f64, u64)> {
    let mut child = b.spawn(Contender::Outboxd, cfg, "", "info")?;
    let handled = child.wait_mark(|m| m.handled, "event handled", Duration::from_secs(300)).await?;
    let (rss, _) = child.rss();
    let r = {
        let m = child.marks.lock().unwrap();
        let s = |t: Option<Instant>| t.map(|t| (t - child.spawned).as_secs_f64()).unwrap_or(f64::NAN);
        (s(m.running), s(m.assigned), s(Some(handled)), rss)
    };
    child.stop(Duration::from_secs(60)).await?;
    Ok(r)
}

async fn store_scenario(b: &Bench) -> anyhow::Result<StoreResult> {
    let n = b.sizes.store_records;
    let topic = b.topic("store");
    b.create_topic(&topic, PARTITIONS).await?;
    let (brokers, t) = (b.args.brokers.clone(), topic.clone());
    let salt = 0x5707e;
    eprintln!("bench: store: loading {n} events into {topic}");
    tokio::task::spawn_blocking(move || preload(&brokers, &t, salt, n, KEYS, false)).await??;
    let total = end_offsets(&b.args.brokers, &topic, PARTITIONS)?;
    let mut r = StoreResult { records: n, ..Default::default() };

    // A: outboxd as shipped, 7 d retention: RSS, bytes per record, cold start.
    let group_a = format!("bench-{}-store-a", b.run_id);
    let (cfg_a, _) = b.write_config(&Cfg {
        name: "store-a".into(),
        group: group_a.clone(),
        topics: vec![topic.clone()],
        handler: Hk::Log,
        fsync: true,
        max_in_flight: 256,
        commit_window: None,
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
    })?;
    let (eps, secs, rss, hwm) = load_store(b, &cfg_a, &group_a, &topic, total).await?;
    (r.load_eps, r.load_secs, r.rss_end, r.rss_peak) = (eps, secs, rss, hwm);
    eprintln!("bench: store A loaded: {eps:.0} events/s, RSS {} MB (peak {} MB)", rss >> 20, hwm >> 20);
    let cfg_a_s = cfg_a.to_string_lossy().to_string();
    let (stats_secs, out) = outboxd_cmd(b, &["store", "stats", "--config", &cfg_a_s, "--json"]).await?;
    anyhow::ensure!(out.status.success(), "store stats failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("store stats --json output")?;
    r.bytes_on_disk = v["bytes_on_disk"].as_u64().unwrap_or(0);
    r.done = v["done"].as_u64().unwrap_or(0);
    r.stats_secs = stats_secs;
    r.du_bytes = dir_bytes(&b.work.join("stores/store-a"));

    // Cold start on the full store: one new event, same group.
    let (brokers, t) = (b.args.brokers.clone(), topic.clone());
    tokio::task::spawn_blocking(move || preload(&brokers, &t, 0xc01d, 1, KEYS, false)).await??;
    (r.cold_running, r.cold_assigned, r.cold_handled, r.cold_rss) = cold_start(b, &cfg_a).await?;
    // Baseline: the same with an empty store.
    let topic_base = b.topic("cold-base");
    b.create_topic(&topic_base, PARTITIONS).await?;
    let (brokers, t) = (b.args.brokers.clone(), topic_base.clone());
    tokio::task::spawn_blocking(move || preload(&brokers, &t, 0xba5e, 1, KEYS, false)).await??;
    let (cfg_base, _) = b.write_config(&Cfg {
        name: "store-base".into(),
        group: format!("bench-{}-store-base", b.run_id),
        topics: vec![topic_base],
        handler: Hk::Log,
        fsync: true,
        max_in_flight: 256,
        commit_window: None,
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
    })?;
    (r.base_running, r.base_assigned, r.base_handled, _) = cold_start(b, &cfg_base).await?;

    // B: relaxed, 1 s retention: a retention pass over every record.
    let group_b = format!("bench-{}-store-b", b.run_id);
    let (cfg_b, _) = b.write_config(&Cfg {
        name: "store-b".into(),
        group: group_b.clone(),
        topics: vec![topic.clone()],
        handler: Hk::Log,
        fsync: false,
        max_in_flight: 256,
        commit_window: None,
        retention: "1s",
        gc_interval: "24h",
        drain_timeout: "10s",
    })?;
    let total_b = end_offsets(&b.args.brokers, &topic, PARTITIONS)?;
    let (eps_b, _, rss_b, _) = load_store(b, &cfg_b, &group_b, &topic, total_b).await?;
    r.relaxed_load_eps = eps_b;
    r.relaxed_rss_end = rss_b;
    // Records expire retention + min(retention, 1 h) after their claim: 2 s here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cfg_b_s = cfg_b.to_string_lossy().to_string();
    let (open_secs, _) = outboxd_cmd(b, &["store", "get", "bench-no-such-event", "--config", &cfg_b_s]).await?;
    let (gc_secs, out) = outboxd_cmd(b, &["store", "gc", "--config", &cfg_b_s]).await?;
    anyhow::ensure!(out.status.success(), "store gc failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    r.gc_removed = text.split_whitespace().find_map(|w| w.parse().ok()).unwrap_or(0);
    r.open_secs = open_secs;
    r.gc_secs = gc_secs;
    eprintln!("bench: store gc: removed {} in {gc_secs:.2} s (open alone {open_secs:.2} s)", r.gc_removed);
    for d in ["store-a", "store-b", "store-base"] {
        let _ = std::fs::remove_dir_all(b.work.join("stores").join(d));
    }
    Ok(r)
}

// ---------------------------------------------------------------- report

fn machine() -> String {
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
        .map(|kb| format!("{} GiB", kb >> 20))
        .unwrap_or_default();
    format!("nproc {nproc}, CPU {cpu}, kernel {kernel}, memory {mem}")
}

fn git_rev() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rev = run(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "?".into());
    let dirty = run(&["status", "--porcelain", "--", "src", "Cargo.toml"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{rev} + uncommitted changes in src/")
    } else {
        rev
    }
}

fn others_running() -> Vec<String> {
    // Other heavy processes sharing the 2 cores (the local stack's Kafka Connect, if up).
    let mut v = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmd.contains("ConnectDistributed") || cmd.contains("ConnectStandalone") {
                v.push("Kafka Connect (Debezium) was running".to_owned());
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

struct Report {
    md: String,
}

impl Report {
    fn line(&mut self, s: impl AsRef<str>) {
        self.md.push_str(s.as_ref());
        self.md.push('\n');
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

// ---------------------------------------------------------------- main

#[derive(Parser)]
enum Cli {
    /// Run the suite and write the report.
    Suite(Box<Args>),
    /// Investigation: replay the store's writes on sled directly (see probe.rs).
    StoreProbe {
        #[arg(long, default_value_t = 100_000)]
        records: u64,
        #[arg(long, value_enum, default_value = "outboxd")]
        variant: outboxd_bench::probe::Variant,
        /// sled cache_capacity in MiB (sled's default is 1024).
        #[arg(long)]
        cache_mb: Option<u64>,
        /// Events per flush (outboxd's group commit flushes once per batch of waiting writers).
        #[arg(long, default_value_t = 256)]
        batch: u64,
        #[arg(long, default_value = "target/bench-work/probe")]
        dir: PathBuf,
    },
    /// Investigation: append the suite's outbox messages to an existing topic (create it
    /// with `scripts/stack topic-reset TOPIC 8`), e.g. to run outboxd by hand under a profiler.
    Preload {
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 100_000)]
        events: u64,
        /// 5% of the messages repeat an earlier id at a new offset.
        #[arg(long)]
        duplicates: bool,
        /// Seeds the event ids: the same salt gives the same ids.
        #[arg(long, default_value_t = 1)]
        salt: u64,
        #[arg(long, default_value = "127.0.0.1:19092")]
        brokers: String,
    },
}

#[tokio::main(worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = match Cli::parse() {
        Cli::Suite(args) => *args,
        Cli::StoreProbe { records, variant, cache_mb, batch, dir } => {
            let v =
                tokio::task::spawn_blocking(move || outboxd_bench::probe::run(&dir, records, variant, cache_mb, batch))
                    .await??;
            println!("{v}");
            return Ok(());
        }
        Cli::Preload { topic, events, duplicates, salt, brokers } => {
            let (n, dups) =
                tokio::task::spawn_blocking(move || preload(&brokers, &topic, salt, events, KEYS, duplicates))
                    .await??;
            println!("{n} messages written, {dups} of them repeating an earlier id");
            return Ok(());
        }
    };
    let started = Instant::now();
    let sizes = Sizes::from(&args);
    let scenarios: HashSet<String> = args.scenarios.split(',').map(|s| s.trim().to_owned()).collect();
    for s in &scenarios {
        anyhow::ensure!(["drain", "latency", "slow", "store"].contains(&s.as_str()), "unknown scenario {s}");
    }
    for bin in ["outboxd", "naive", "pg-table"] {
        anyhow::ensure!(
            args.bin_dir.join(bin).exists(),
            "{} missing: build the release binaries first (bench/run does)",
            bin
        );
    }
    let work = std::path::absolute(&args.work_dir)?;
    std::fs::create_dir_all(work.join("configs"))?;
    std::fs::create_dir_all(work.join("stores"))?;
    let bin = std::path::absolute(&args.bin_dir)?;

    let recv: Arc<Recv> = Arc::default();
    let app = axum::Router::new().fallback(on_call).with_state(recv.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let recv_port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let run_id = format!("{:x}", now_us() / 1000 % 0xffff_ffff);
    let admin: AdminClient<DefaultClientContext> = client(&args.brokers, None).create()?;
    let clk_tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let b = Bench {
        args: args.clone(),
        sizes,
        run_id,
        work,
        bin,
        recv,
        recv_port,
        admin,
        topics: Mutex::default(),
        clk_tck,
    };
    eprintln!("bench: run {} on {}", b.run_id, machine());

    let result = run_suite(&b, &scenarios, started).await;
    // Clean up topics and scratch stores whatever happened.
    let names = b.topics.lock().unwrap().clone();
    if !names.is_empty() {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let _ = b.admin.delete_topics(&refs, &AdminOptions::new()).await;
    }
    let _ = std::fs::remove_dir_all(b.work.join("stores"));
    result
}

/// Everything measured so far, for the report.
#[derive(Default)]
struct Measured {
    others: Vec<String>,
    noise: Vec<(&'static str, f64)>,
    drain: HashMap<(Contender, Hk), Vec<DrainResult>>,
    drain_info: String,
    lat: HashMap<Contender, Vec<LatResult>>,
    floor_pairs: Vec<i64>,
    floor_singles: Vec<i64>,
    slow: Vec<(String, usize, &'static str, Vec<f64>)>,
    store: Option<StoreResult>,
}

async fn run_suite(b: &Bench, scenarios: &HashSet<String>, started: Instant) -> anyhow::Result<()> {
    let s = &b.sizes;
    let mut m = Measured { others: others_running(), ..Measured::default() };

    // ---- drain
    if scenarios.contains("drain") {
        let n0 = Noise::now();
        let topic = b.topic("drain");
        b.create_topic(&topic, PARTITIONS).await?;
        let (brokers, t, n) = (b.args.brokers.clone(), topic.clone(), s.events);
        let t0 = Instant::now();
        let (msgs, dups) = tokio::task::spawn_blocking(move || preload(&brokers, &t, 0xd7a1, n, KEYS, true)).await??;
        eprintln!(
            "bench: drain topic {topic}: {msgs} messages ({dups} duplicates) in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        let total = end_offsets(&b.args.brokers, &topic, PARTITIONS)?;
        anyhow::ensure!(total == msgs as i64, "end offsets {total} != {msgs} produced");
        m.drain_info = format!("{msgs} messages ({dups} duplicate ids at new offsets, {} distinct events), {PAYLOAD_BYTES} B payloads, {PARTITIONS} partitions, {KEYS} keys", msgs - dups);
        for r in 0..s.runs {
            for hk in [Hk::Log, Hk::Http] {
                for who in order(r + hk as usize, &b.args.contenders) {
                    let res = drain_run(b, who, hk, r, &topic, total).await?;
                    m.drain.entry((who, hk)).or_default().push(res);
                }
            }
        }
        m.noise.push(("drain", n0.other_share()));
    }

    write_report(b, started, &m, false)?;
    // ---- latency
    if scenarios.contains("latency") {
        let n0 = Noise::now();
        for r in 0..s.runs {
            let names = format!("{},{}", b.args.contenders, b.args.latency_extra);
            for who in order(r, &names) {
                let res = latency_run(b, who, r).await?;
                m.lat.entry(who).or_default().push(res);
            }
            let (dir, n) = (b.work.clone(), s.floor_samples / s.runs);
            let (p, single) = tokio::task::spawn_blocking(move || fdatasync_floor(&dir, n.max(100))).await??;
            m.floor_pairs.extend(p);
            m.floor_singles.extend(single);
        }
        m.noise.push(("latency", n0.other_share()));
        m.floor_pairs.sort_unstable();
        m.floor_singles.sort_unstable();
        eprintln!(
            "bench: fdatasync floor: two = p50 {:.2} ms p99 {:.2} ms; one = p50 {:.2} ms p99 {:.2} ms",
            pct(&m.floor_pairs, 0.5) / 1000.0,
            pct(&m.floor_pairs, 0.99) / 1000.0,
            pct(&m.floor_singles, 0.5) / 1000.0,
            pct(&m.floor_singles, 0.99) / 1000.0
        );
    }

    write_report(b, started, &m, false)?;
    // ---- slow receiver
    if scenarios.contains("slow") {
        let n0 = Noise::now();
        let many = b.topic("slow.many");
        let hot = b.topic("slow.hot");
        b.create_topic(&many, PARTITIONS).await?;
        b.create_topic(&hot, PARTITIONS).await?;
        // Enough for 256 in flight at 20 ms (12,800/s) through the window, warm-up and start.
        let n_many = 12_800 * (s.slow_secs + 4);
        let n_hot = 60 * (s.slow_secs + 4);
        let (br, mt, h) = (b.args.brokers.clone(), many.clone(), hot.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            preload(&br, &mt, 0x51, n_many, KEYS, false)?;
            preload(&br, &h, 0x52, n_hot, 1, false)?;
            Ok(())
        })
        .await??;
        let configs: Vec<(Contender, usize, &'static str, &String)> = vec![
            (Contender::Outboxd, 1, "many keys", &many),
            (Contender::Outboxd, 16, "many keys", &many),
            (Contender::Outboxd, 256, "many keys", &many),
            (Contender::Outboxd, 1, "one key", &hot),
            (Contender::Outboxd, 16, "one key", &hot),
            (Contender::Outboxd, 256, "one key", &hot),
            (Contender::Naive, 256, "many keys", &many),
        ];
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        for r in 0..s.runs {
            for (i, (who, mif, label, topic)) in configs.iter().enumerate() {
                results[i].push(
                    slow_run(b, *who, *mif, topic, if *label == "one key" { "one-key" } else { "many-keys" }, r)
                        .await?,
                );
            }
        }
        m.noise.push(("slow receiver", n0.other_share()));
        for (i, (who, mif, label, _)) in configs.iter().enumerate() {
            m.slow.push((who.name().to_owned(), *mif, label, results[i].clone()));
        }
    }

    write_report(b, started, &m, false)?;
    // ---- store
    let n0 = Noise::now();
    m.store = if scenarios.contains("store") { Some(store_scenario(b).await?) } else { None };
    if m.store.is_some() {
        m.noise.push(("store", n0.other_share()));
    }

    write_report(b, started, &m, true)?;
    Ok(())
}

/// Writes the report with whatever has been measured so far (called after every
/// scenario, so a run that is stopped half-way still leaves its numbers).
fn write_report(b: &Bench, started: Instant, m: &Measured, done: bool) -> anyhow::Result<()> {
    let Measured { others, noise, drain, drain_info, lat, floor_pairs, floor_singles, slow, store } = m;
    let s = &b.sizes;
    let mut rep = Report { md: String::new() };
    let mut targets: Vec<(String, String, Option<bool>)> = Vec::new();
    let elapsed = started.elapsed();
    rep.line("# outboxd benchmark results");
    rep.line("");
    if !done {
        rep.line("**Partial: written after each scenario; this run had not finished when the file was last written.**");
        rep.line("");
    }
    rep.line(format!("- command: `{}`", b.args.command));
    rep.line(format!("- machine: {}", machine()));
    rep.line(format!("- outboxd: {}, release build; stack: Apache Kafka 4.4.0 (KRaft, one node) and PostgreSQL 15 on 127.0.0.1, same machine", if b.args.built_from.is_empty() { format!("git {}", git_rev()) } else { b.args.built_from.clone() }));
    if !others.is_empty() {
        rep.line(format!("- also on the machine during the run: {}", others.join(", ")));
    }
    rep.line(format!(
        "- sizes: drain {} messages, {} interleaved run(s) per measurement (median, min–max in brackets), latency {} s at {} events/s, slow receiver window {} s, store {} records{}",
        s.events,
        s.runs,
        s.latency_secs,
        b.args.rate,
        s.slow_secs,
        s.store_records,
        if b.args.quick { " (`--quick`)" } else { "" }
    ));
    rep.line(format!(
        "- CPU taken by other processes on the machine (not the driver, the contenders, Kafka or PostgreSQL; share of both cores): {}",
        noise.iter().map(|(n, f)| format!("{n} {:.0}%", f * 100.0)).collect::<Vec<_>>().join(", ")
    ));
    rep.line(format!("- suite wall time: {:.1} min", elapsed.as_secs_f64() / 60.0));
    rep.line("- every contender: own consumer group, fresh store / fresh PostgreSQL table, `kafka.commit_interval = 100ms`, `max_in_flight = 256`, outboxd's librdkafka defaults (prefetch `queued.max.messages.kbytes = 16384`, `queued.min.messages = 10000`, `fetch.queue.backoff.ms = 20`), mimalloc as the allocator; the receiver (in the driver) answers 200 at once unless said otherwise");
    rep.line("");

    if !drain.is_empty() {
        rep.line("## Drain");
        rep.line("");
        rep.line(format!("Pre-loaded topic: {drain_info}. Time from `partitions assigned` to all offsets committed (polled every 20 ms). CPU = user+system of the contender process; for pg-table the PostgreSQL server processes' CPU in the same interval is shown separately (outboxd's store work is inside its own process)."));
        rep.line("");
        rep.line("| handler | contender | events/s | × naive | CPU s / 100k events | × naive | + PostgreSQL CPU s / 100k | RSS at the end, MB | store: records per group commit, ms per commit | receiver calls (repeats) |");
        rep.line("|---|---|---:|---:|---:|---:|---:|---:|---|---:|");
        for hk in [Hk::Log, Hk::Http] {
            let naive_eps = median(
                &drain
                    .get(&(Contender::Naive, hk))
                    .map(|v| v.iter().map(|r| r.eps).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            let naive_cpu = median(
                &drain
                    .get(&(Contender::Naive, hk))
                    .map(|v| v.iter().map(|r| r.cpu_per_100k).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            for who in ALL {
                let Some(v) = drain.get(&(who, hk)) else { continue };
                let eps: Vec<f64> = v.iter().map(|r| r.eps).collect();
                let cpu: Vec<f64> = v.iter().map(|r| r.cpu_per_100k).collect();
                let pgc: Vec<f64> = v.iter().map(|r| r.pg_cpu_per_100k).collect();
                let rss: Vec<f64> = v.iter().map(|r| mb(r.rss)).collect();
                let syncs: Vec<(f64, f64, f64)> = v.iter().filter_map(|r| r.sync).collect();
                let sync = if syncs.is_empty() {
                    "–".to_owned()
                } else {
                    format!(
                        "{:.1}, {:.2}",
                        median(&syncs.iter().map(|s| s.1).collect::<Vec<_>>()),
                        median(&syncs.iter().map(|s| s.2).collect::<Vec<_>>())
                    )
                };
                let partial = if v.iter().any(|r| r.partial) {
                    format!(
                        " (stopped at the {} s cap, {} of {} committed)",
                        s.drain_cap.as_secs(),
                        v.iter().map(|r| r.committed).max().unwrap_or(0),
                        s.events
                    )
                } else {
                    String::new()
                };
                let calls = if hk == Hk::Http {
                    format!("{} ({})", v.last().map(|r| r.calls).unwrap_or(0), v.last().map(|r| r.repeats).unwrap_or(0))
                } else {
                    "–".into()
                };
                rep.line(format!(
                    "| {} | {}{partial} | {} | {} | {} | {} | {} | {} | {sync} | {calls} |",
                    hk.name(),
                    who.name(),
                    mmm(&eps, 0),
                    ratio(median(&eps), naive_eps),
                    mmm(&cpu, 2),
                    ratio(median(&cpu), naive_cpu),
                    if who == Contender::PgTable { mmm(&pgc, 2) } else { "–".into() },
                    mmm(&rss, 0),
                ));
            }
        }
        rep.line("");
        rep.line("Receiver calls are from the last run; repeats = calls whose `Idempotency-Key` the receiver had already seen (a second side effect).");
        rep.line("");
        let med = |who, hk| {
            median(&drain.get(&(who, hk)).map(|v| v.iter().map(|r| r.eps).collect::<Vec<_>>()).unwrap_or_default())
        };
        let (o, n, p) =
            (med(Contender::Outboxd, Hk::Http), med(Contender::Naive, Hk::Http), med(Contender::PgTable, Hk::Http));
        targets.push((
            "drain, HTTP receiver: outboxd ≥ 0.7× naive events/s".into(),
            format!("{:.2}× ({o:.0} vs {n:.0} events/s)", o / n),
            Some(o >= 0.7 * n),
        ));
        targets.push((
            "drain, HTTP receiver: outboxd ≥ 10× pg-table events/s".into(),
            format!("{:.1}× ({o:.0} vs {p:.0} events/s)", o / p),
            Some(o >= 10.0 * p),
        ));
    }

    if !lat.is_empty() {
        rep.line("## Added latency");
        rep.line("");
        rep.line(format!(
            "{} events/s for {} s per contender and run, 8 partitions, {KEYS} keys, each its own fresh topic; latency = receiver call time − the event's produce time (stamped by the producer at send, µs; the first second is warm-up and not counted). Added = contender − naive (medians over runs). The `-window0` rows are the same outboxd binary with `store.commit_interval = \"0ms\"` (not the shipped default, 2 ms): they isolate what the group-commit window costs.",
            b.args.rate, s.latency_secs
        ));
        rep.line("");
        rep.line("| contender | p50 ms | p99 ms | p99.9 ms | added p50 ms | added p99 ms | added p99.9 ms | store group commits/s, records each, ms each (mean) |");
        rep.line("|---|---:|---:|---:|---:|---:|---:|---|");
        let m = |who: Contender, f: fn(&LatResult) -> f64| -> Vec<f64> {
            lat.get(&who).map(|v| v.iter().map(|r| f(r) / 1000.0).collect()).unwrap_or_default()
        };
        let (n50, n99, n999) = (
            median(&m(Contender::Naive, |r| r.p50)),
            median(&m(Contender::Naive, |r| r.p99)),
            median(&m(Contender::Naive, |r| r.p999)),
        );
        for who in ALL {
            if !lat.contains_key(&who) {
                continue;
            }
            let (p50, p99, p999) = (m(who, |r| r.p50), m(who, |r| r.p99), m(who, |r| r.p999));
            let add = |v: &[f64], base: f64| {
                if who == Contender::Naive {
                    "–".to_owned()
                } else {
                    format!("{:+.2}", median(v) - base)
                }
            };
            let syncs: Vec<(f64, f64, f64)> =
                lat.get(&who).map(|v| v.iter().filter_map(|r| r.sync).collect()).unwrap_or_default();
            let sync = if syncs.is_empty() {
                "–".to_owned()
            } else {
                let m = |f: fn(&(f64, f64, f64)) -> f64| median(&syncs.iter().map(f).collect::<Vec<_>>());
                format!("{:.0}, {:.1}, {:.2}", m(|s| s.0), m(|s| s.1), m(|s| s.2))
            };
            rep.line(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {sync} |",
                who.name(),
                mmm(&p50, 2),
                mmm(&p99, 2),
                mmm(&p999, 2),
                add(&p50, n50),
                add(&p99, n99),
                add(&p999, n999)
            ));
        }
        let (f50, f99) = (pct(floor_pairs, 0.5) / 1000.0, pct(floor_pairs, 0.99) / 1000.0);
        rep.line(format!(
            "| *floor: two fdatasyncs (append 256 B + fdatasync, twice), {} samples* | | | | *{f50:.2}* | *{f99:.2}* | *{:.2}* | |",
            floor_pairs.len(),
            pct(floor_pairs, 0.999) / 1000.0
        ));
        rep.line(format!(
            "| *one fdatasync, {} samples* | | | | *{:.2}* | *{:.2}* | *{:.2}* | |",
            floor_singles.len(),
            pct(floor_singles, 0.5) / 1000.0,
            pct(floor_singles, 0.99) / 1000.0,
            pct(floor_singles, 0.999) / 1000.0
        ));
        rep.line("");
        let relaxed99 = median(&m(Contender::Relaxed, |r| r.p99)) - n99;
        let full99 = median(&m(Contender::Outboxd, |r| r.p99)) - n99;
        let relaxed50 = median(&m(Contender::Relaxed, |r| r.p50)) - n50;
        let full50 = median(&m(Contender::Outboxd, |r| r.p50)) - n50;
        // A negative added p99 means the naive run's tail was worse: scheduler noise on
        // this machine, not a faster contender. Then only the p50 can decide (a p50
        // that already adds more than the bound fails it).
        let noisy = "p99 inconclusive: the naive run's p99 was the higher one (noise)";
        let (m1, v1) = if relaxed99 >= 0.0 {
            (format!("{relaxed99:+.2} ms (p50 {relaxed50:+.2} ms)"), Some(relaxed99 <= 1.0))
        } else if relaxed50 > 1.0 {
            (format!("{noisy}; the p50 alone adds {relaxed50:+.2} ms"), Some(false))
        } else {
            (format!("{noisy} (p50 {relaxed50:+.2} ms)"), None)
        };
        targets.push(("added latency p99 ≤ 1 ms (outboxd-relaxed)".into(), m1, v1));
        let (m2, v2) = if full99 >= 0.0 {
            (format!("{full99:+.2} ms vs floor {f99:.2} ms: {:+.2} ms over (p50 {full50:+.2} ms vs floor p50 {f50:.2} ms)", full99 - f99), Some(full99 - f99 <= 0.5))
        } else if full50 - f50 > 0.5 {
            (
                format!(
                    "{noisy}; the p50 alone adds {full50:+.2} ms, {:+.2} ms over the floor's p50 ({f50:.2} ms)",
                    full50 - f50
                ),
                Some(false),
            )
        } else {
            (format!("{noisy} (p50 {full50:+.2} ms vs floor p50 {f50:.2} ms)"), None)
        };
        targets.push(("added latency p99 within 0.5 ms of the two-fdatasync floor p99 (outboxd)".into(), m2, v2));
    }

    if !slow.is_empty() {
        rep.line("## Slow receiver");
        rep.line("");
        rep.line(format!("The receiver takes {SLOW_RECEIVER_MS} ms per call. Calls per second over a {} s window after 1 s of warm-up; \"many keys\" = {KEYS} keys over 8 partitions, \"one key\" = every event on the same key (kept in order, so one at a time). The naive row (no ordering, same in-flight bound) is the reference.", s.slow_secs));
        rep.line("");
        rep.line("| contender | max_in_flight | keys | events/s | ideal (in flight / 20 ms) |");
        rep.line("|---|---:|---|---:|---:|");
        for (name, mif, label, v) in slow.iter() {
            let ideal = if *label == "one key" { 50.0 } else { *mif as f64 * 1000.0 / SLOW_RECEIVER_MS as f64 };
            rep.line(format!("| {name} | {mif} | {label} | {} | {ideal:.0} |", mmm(v, 0)));
        }
        rep.line("");
        if let Some((_, _, _, v)) = slow.iter().find(|(n, m, l, _)| n == "outboxd" && *m == 256 && *l == "many keys") {
            let e = median(v);
            targets.push((
                "20 ms receiver, 256 in flight: ≥ 5,000 events/s".into(),
                format!("{e:.0} events/s"),
                Some(e >= 5000.0),
            ));
        }
    }

    if let Some(r) = &store {
        rep.line("## Store");
        rep.line("");
        rep.line(format!(
            "{} events consumed by outboxd as shipped (log handler, fsync on) into a fresh store; measured once.",
            r.records
        ));
        rep.line("");
        rep.line("| measure | value |");
        rep.line("|---|---:|");
        let per = r.bytes_on_disk as f64 / r.done.max(1) as f64;
        rep.line(format!("| records done (`store stats`) | {} |", r.done));
        rep.line(format!("| bytes on disk (`store stats` bytes_on_disk) | {:.1} MB |", mb(r.bytes_on_disk)));
        rep.line(format!("| **bytes on disk per retained record** | **{per:.0}** |"));
        rep.line(format!(
            "| disk blocks allocated in the store directory (du) | {:.1} MB ({:.0} B/record) |",
            mb(r.du_bytes),
            r.du_bytes as f64 / r.done.max(1) as f64
        ));
        rep.line(format!("| **RSS of outboxd with {} records retained** (after the last event, process still running) | **{:.0} MB** |", r.records, mb(r.rss_end)));
        rep.line(format!("| peak RSS during that load (VmHWM) | {:.0} MB |", mb(r.rss_peak)));
        rep.line(format!("| RSS of outboxd-relaxed after the same load | {:.0} MB |", mb(r.relaxed_rss_end)));
        rep.line(format!(
            "| load rate into a growing store: outboxd / outboxd-relaxed | {:.0} / {:.0} events/s |",
            r.load_eps, r.relaxed_load_eps
        ));
        rep.line(format!(
            "| `outboxd store stats` wall time (opens the store, scans every record) | {:.2} s |",
            r.stats_secs
        ));
        rep.line(format!(
            "| **retention pass: `outboxd store gc` wall time, {} expired records** | **{:.2} s** (removed {}) |",
            r.records, r.gc_secs, r.gc_removed
        ));
        rep.line(format!(
            "| of which opening the store (`store get` of an absent id, same store) | {:.2} s |",
            r.open_secs
        ));
        rep.line(format!(
            "| **cold start with {} records: process start → first event handled** | **{:.2} s** (store open {:.2} s, partitions assigned {:.2} s) |",
            r.records, r.cold_handled, r.cold_running, r.cold_assigned
        ));
        rep.line(format!(
            "| cold start with an empty store (baseline) | {:.2} s (store open {:.2} s, partitions assigned {:.2} s) |",
            r.base_handled, r.base_running, r.base_assigned
        ));
        rep.line(format!("| RSS right after the cold start with {} records | {:.0} MB |", r.records, mb(r.cold_rss)));
        rep.line("");
        targets.push(("≤ 200 bytes on disk per retained record".into(), format!("{per:.0} B"), Some(per <= 200.0)));
        let note = if r.records < 1_000_000 {
            format!(" (measured with {} records, not 1M)", r.records)
        } else {
            String::new()
        };
        targets.push((
            format!("RSS ≤ 150 MB with 1M records{note}"),
            format!("{:.0} MB", mb(r.rss_end)),
            Some(r.rss_end as f64 <= 150.0 * 1024.0 * 1024.0),
        ));
    }

    if !targets.is_empty() {
        rep.line("## Targets");
        rep.line("");
        rep.line("| target | measured | met? |");
        rep.line("|---|---|---|");
        for (t, m, ok) in &targets {
            let s = match ok {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "inconclusive",
            };
            rep.line(format!("| {t} | {m} | {s} |"));
        }
        rep.line("");
    }

    if let Ok(f) = std::fs::read_to_string(&b.args.findings) {
        rep.line(f.trim_end());
        rep.line("");
    }

    std::fs::write(&b.args.out, &rep.md)?;
    if done {
        println!("{}", rep.md);
    }
    eprintln!("bench: wrote {} ({:.1} min)", b.args.out.display(), elapsed.as_secs_f64() / 60.0);
    Ok(())
}
