//! outboxd as a child process: generated config in a temporary directory, stderr of
//! every run in its own file (printed when the test fails), or on pipes the test closes
//! ([`Pipes`]), SIGTERM/SIGKILL, and the `outboxd store … --json` CLI.

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use serde::Deserialize;
use serde_json::Value;

use super::kafka::Kafka;
use super::receiver::Receiver;
use super::unique_name;
use super::wait::keep_looking_blocking;

/// What `std::process::abort` ends a process with.
const SIGABRT: i32 = 6;

/// The outboxd binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_outboxd");

/// How long outboxd may take to get its partitions (a restart after SIGKILL without
/// static membership waits for the old member's session timeout, 6 s here).
pub const ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a SIGTERMed outboxd may take to drain and exit (drain_timeout is 5 s).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a wait for outboxd's exit looks whether it exited.
const REAP_EVERY: Duration = Duration::from_millis(20);

/// The config outboxd is started with; tests change fields before [`Outboxd::start`].
#[derive(Clone, Debug)]
pub struct OutboxdConfig {
    pub brokers: String,
    pub group_id: String,
    /// `kafka.commit_interval`: how often stored offsets are committed.
    pub kafka_commit_interval: String,
    pub drain_timeout: String,
    /// More `[kafka]` keys, e.g. `stall_timeout = "2s"`.
    pub kafka_extra: String,
    /// `[kafka.options]`, passed to librdkafka as they are.
    pub kafka_options: BTreeMap<String, String>,
    pub store_path: PathBuf,
    pub retention: String,
    pub store_commit_interval: String,
    pub max_in_flight: u32,
    /// More `[store]` keys, e.g. `max_in_flight_bytes = "1MiB"`.
    pub store_extra: String,
    pub topics: Vec<String>,
    pub url: String,
    pub method: String,
    pub handler_timeout: String,
    pub max_attempts: u32,
    pub initial_backoff: String,
    pub max_backoff: String,
    /// More TOML for the handler, written after its `timeout` line: keys first
    /// (`success_on = [409]`), then sub-tables (`[handlers.dead_letter]`).
    pub handler_extra: String,
    /// More `[handlers.retry]` keys, e.g. `max_elapsed = "5s"`.
    pub retry_extra: String,
    /// `[handlers.circuit]` keys, e.g. `enabled = false` (the table is left out when empty).
    pub circuit_extra: String,
    /// TOML appended after the handler, e.g. more `[[handlers]]` entries.
    pub extra_toml: String,
    /// More `[admin]` keys, e.g. `token = "..."` or `allowed_hosts = [...]`.
    pub admin_extra: String,
    /// Environment variables of every outboxd process started for this config (the
    /// service and one-shot commands); never the test process's own environment, which
    /// every test running at the same time shares.
    pub env: BTreeMap<String, String>,
    /// The process's limit of open files (`prlimit --nofile`), to see what it does
    /// when its descriptors run short; `None`: the test's own.
    pub max_open_files: Option<u64>,
}

/// A TOML basic string (JSON's escaping is valid TOML for what we write).
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("string")
}

impl OutboxdConfig {
    pub fn to_toml(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "[kafka]");
        let _ = writeln!(t, "brokers = {}", q(&self.brokers));
        let _ = writeln!(t, "group_id = {}", q(&self.group_id));
        let _ = writeln!(t, "commit_interval = {}", q(&self.kafka_commit_interval));
        let _ = writeln!(t, "drain_timeout = {}", q(&self.drain_timeout));
        t.push_str(&self.kafka_extra);
        let _ = writeln!(t, "\n[kafka.options]");
        for (k, v) in &self.kafka_options {
            let _ = writeln!(t, "{} = {}", q(k), q(v));
        }
        let _ = writeln!(t, "\n[store]");
        let _ = writeln!(t, "path = {}", q(self.store_path.to_str().expect("utf-8 store path")));
        let _ = writeln!(t, "retention = {}", q(&self.retention));
        let _ = writeln!(t, "commit_interval = {}", q(&self.store_commit_interval));
        let _ = writeln!(t, "max_in_flight = {}", self.max_in_flight);
        t.push_str(&self.store_extra);
        // `OUTBOXD_TEST_CHANGELOG=off` runs every suite as a single instance without
        // changelog topics (today's behaviour); tests that configure it keep theirs.
        if changelog_off() && !self.store_extra.contains("[store.changelog]") {
            let _ = writeln!(t, "[store.changelog]\nenabled = false");
        }
        // Tests run many outboxd processes at once: each admin server on a free port.
        let _ = writeln!(t, "\n[admin]\nlisten = \"127.0.0.1:0\"");
        t.push_str(&self.admin_extra);
        if !self.admin_extra.is_empty() && !self.admin_extra.ends_with('\n') {
            t.push('\n');
        }
        let _ = writeln!(t, "\n[[handlers]]");
        let topics: Vec<String> = self.topics.iter().map(|s| q(s)).collect();
        let _ = writeln!(t, "topics = [{}]", topics.join(", "));
        let _ = writeln!(t, "kind = \"http\"");
        let _ = writeln!(t, "url = {}", q(&self.url));
        let _ = writeln!(t, "method = {}", q(&self.method));
        let _ = writeln!(t, "idempotency_header = \"Idempotency-Key\"");
        let _ = writeln!(t, "timeout = {}", q(&self.handler_timeout));
        t.push_str(&self.handler_extra);
        if !self.handler_extra.is_empty() && !self.handler_extra.ends_with('\n') {
            t.push('\n');
        }
        let _ = writeln!(t, "\n[handlers.retry]");
        let _ = writeln!(t, "max_attempts = {}", self.max_attempts);
        let _ = writeln!(t, "initial_backoff = {}", q(&self.initial_backoff));
        let _ = writeln!(t, "max_backoff = {}", q(&self.max_backoff));
        t.push_str(&self.retry_extra);
        if !self.circuit_extra.is_empty() {
            let _ = writeln!(t, "\n[handlers.circuit]");
            t.push_str(&self.circuit_extra);
            if !self.circuit_extra.ends_with('\n') {
                t.push('\n');
            }
        }
        t.push_str(&self.extra_toml);
        t
    }
}

/// Whether the tests run with `[store.changelog] enabled = false` (`OUTBOXD_TEST_CHANGELOG=off`).
pub fn changelog_off() -> bool {
    std::env::var("OUTBOXD_TEST_CHANGELOG").is_ok_and(|v| v.trim() == "off")
}

/// `[handlers.circuit]` for tests about one event's own retries: every failure is
/// charged to the event, as without a circuit (for [`OutboxdConfig::circuit_extra`]).
pub const NO_CIRCUIT: &str = "enabled = false\n";

/// TOML lines for `[handlers.dead_letter]` (for [`OutboxdConfig::handler_extra`]).
pub fn dead_letter_toml(topic: &str) -> String {
    format!("[handlers.dead_letter]\ntopic = {}\n", q(topic))
}

/// TOML line for a static header naming the instance in every call (for
/// [`OutboxdConfig::handler_extra`]).
pub fn instance_header_toml(name: &str) -> String {
    format!("headers = {{ X-Outboxd-Instance = {} }}\n", q(name))
}

/// One record of `outboxd store get|list --json`.
#[derive(Clone, Debug, Deserialize)]
pub struct Record {
    pub event_id: String,
    pub state: String,
    #[serde(default)]
    pub attempts: u32,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub event_type: Option<String>,
    #[serde(default)]
    pub claimed_at: Option<String>,
    #[serde(default)]
    pub done_at: Option<String>,
    pub updated_at: String,
    #[serde(default)]
    pub outcome: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

impl Record {
    /// Fails the test when a time of the record is not RFC 3339 UTC (the contract of
    /// every time `store … --json` prints).
    fn assert_times(&self) {
        let times = [("claimed_at", self.claimed_at.as_deref()), ("done_at", self.done_at.as_deref())];
        for (field, value) in times.into_iter().chain([("updated_at", Some(self.updated_at.as_str()))]) {
            if let Some(s) = value {
                if let Err(e) = humantime::parse_rfc3339(s) {
                    panic!("record {}: {field} {s:?} is not RFC 3339 UTC: {e}", self.event_id);
                }
            }
        }
    }

    /// `done_at` as a time; fails the test when it is missing or not RFC 3339 UTC.
    pub fn done_at(&self) -> SystemTime {
        let s = self.done_at.as_deref().unwrap_or_else(|| panic!("record {} has no done_at: {self:?}", self.event_id));
        humantime::parse_rfc3339(s)
            .unwrap_or_else(|e| panic!("record {}: done_at {s:?} is not RFC 3339 UTC: {e}", self.event_id))
    }
}

/// outboxd under test. Kills its process when dropped and, when the test is failing,
/// prints the stderr of every run.
pub struct Outboxd {
    pub config: OutboxdConfig,
    dir: tempfile::TempDir,
    config_path: PathBuf,
    child: Option<Child>,
    /// stderr file of each run, in order.
    logs: Vec<PathBuf>,
}

impl Outboxd {
    /// A config for `topics` calling `receiver` at
    /// `/events/{aggregate_id}/{event_id}`, with a fresh group and store; short
    /// timeouts fit for tests.
    pub fn new(kafka: &Kafka, topics: &[&str], receiver: &Receiver) -> Outboxd {
        let dir = tempfile::Builder::new().prefix("outboxd-it-").tempdir().expect("temp dir");
        let config_path = dir.path().join("outboxd.toml");
        let mut kafka_options = BTreeMap::new();
        for (k, v) in
            [("session.timeout.ms", "6000"), ("heartbeat.interval.ms", "1000"), ("auto.offset.reset", "earliest")]
        {
            kafka_options.insert(k.to_string(), v.to_string());
        }
        let config = OutboxdConfig {
            brokers: kafka.brokers().to_string(),
            group_id: unique_name("group"),
            kafka_commit_interval: "200ms".into(),
            drain_timeout: "5s".into(),
            kafka_extra: String::new(),
            kafka_options,
            store_path: dir.path().join("store"),
            retention: "7d".into(),
            store_commit_interval: "2ms".into(),
            max_in_flight: 256,
            store_extra: String::new(),
            topics: topics.iter().map(|s| s.to_string()).collect(),
            url: receiver.events_url(),
            method: "POST".into(),
            handler_timeout: "10s".into(),
            max_attempts: 3,
            initial_backoff: "100ms".into(),
            max_backoff: "2s".into(),
            handler_extra: String::new(),
            retry_extra: String::new(),
            circuit_extra: String::new(),
            extra_toml: String::new(),
            admin_extra: String::new(),
            env: BTreeMap::new(),
            max_open_files: None,
        };
        Outboxd { config, dir, config_path, child: None, logs: Vec::new() }
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Writes the config file (`start` does; one-shot commands before a start need it).
    pub fn write_config(&self) {
        std::fs::write(&self.config_path, self.config.to_toml()).expect("write the config");
    }

    /// Starts `outboxd run` with the current config (written anew).
    pub fn start(&mut self) {
        let (log_path, log) = self.next_log();
        let child = self.spawn(log.try_clone().expect("dup stderr file").into(), log.into());
        self.logs.push(log_path);
        self.child = Some(child);
    }

    /// Starts `outboxd run` like [`Outboxd::start`], but with stdout and stderr on pipes
    /// that the test reads (into the run's log file, so [`Outboxd::log`] shows what came
    /// through) until [`Pipes::close`] closes their read ends while outboxd runs on.
    pub fn start_piped(&mut self) -> Pipes {
        let (log_path, log) = self.next_log();
        let mut child = self.spawn(Stdio::piped(), Stdio::piped());
        let log = Arc::new(Mutex::new(log));
        let stop = CancellationToken::new();
        let stdout = tokio::process::ChildStdout::from_std(child.stdout.take().expect("piped stdout"));
        let stderr = tokio::process::ChildStderr::from_std(child.stderr.take().expect("piped stderr"));
        let readers = vec![
            tokio::spawn(copy_until(stdout.expect("stdout pipe"), log.clone(), stop.clone())),
            tokio::spawn(copy_until(stderr.expect("stderr pipe"), log, stop.clone())),
        ];
        self.logs.push(log_path);
        self.child = Some(child);
        Pipes { stop, readers }
    }

    /// The next run's stderr file.
    fn next_log(&mut self) -> (PathBuf, File) {
        assert!(self.child.is_none(), "outboxd is already running; stop or kill it first");
        self.write_config();
        let log_path = self.dir.path().join(format!("run-{}.stderr", self.logs.len() + 1));
        let log = File::create(&log_path).expect("create the stderr file");
        (log_path, log)
    }

    fn spawn(&self, stdout: Stdio, stderr: Stdio) -> Child {
        // prlimit (util-linux) sets the limit and execs outboxd: the pid stays outboxd's.
        let mut command = match self.config.max_open_files {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        command
            .envs(&self.config.env)
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"))
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("outboxd is not running").id()
    }

    /// How many times outboxd was started.
    pub fn runs(&self) -> usize {
        self.logs.len()
    }

    /// What the current (or last) run wrote to stderr.
    pub fn log(&self) -> String {
        self.logs.last().map(|p| std::fs::read_to_string(p).unwrap_or_default()).unwrap_or_default()
    }

    /// Fails the test when outboxd exited on its own.
    pub fn assert_alive(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                panic!("outboxd exited unexpectedly with {status}");
            }
        } else {
            panic!("outboxd is not running");
        }
    }

    /// Like [`super::wait_until`], but fails at once when outboxd dies meanwhile.
    pub async fn wait_until(&mut self, what: impl Display, timeout: Duration, mut cond: impl FnMut() -> bool) {
        super::wait_until(what, timeout, || {
            cond() || {
                self.assert_alive();
                false
            }
        })
        .await;
    }

    /// Like [`super::wait_for`] with a look at this outboxd (its metrics, its admin
    /// API), but fails at once when it dies meanwhile.
    pub async fn wait_for<T, E: Display>(
        &mut self,
        what: impl Display,
        timeout: Duration,
        mut look: impl AsyncFnMut(&Outboxd) -> Result<T, E>,
    ) -> T {
        super::wait_for(what, timeout, async || {
            let seen = look(self).await;
            if seen.is_err() {
                self.assert_alive();
            }
            seen
        })
        .await
    }

    /// Waits until the current run logged `partitions assigned` and, with the
    /// changelog on, until it restored them (their events are handled only then).
    pub async fn wait_for_assignment(&mut self) {
        let log = self.logs.last().cloned().expect("outboxd was never started");
        self.wait_until("outboxd to log `partitions assigned`", ASSIGNMENT_TIMEOUT, || {
            std::fs::read_to_string(&log).unwrap_or_default().contains("partitions assigned")
        })
        .await;
        self.wait_until("outboxd to restore its partitions", ASSIGNMENT_TIMEOUT, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            !text.contains("restoring their changelog") || text.contains("every assigned partition is restored")
        })
        .await;
    }

    /// SIGKILL, then reap the process.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("outboxd is not running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGTERM, wait for the drain and exit, and require exit status 0.
    pub fn stop(&mut self) {
        let status = self.terminate();
        assert!(status.success(), "outboxd should exit 0 after SIGTERM, got {status}");
    }

    /// Waits (bounded) for outboxd to exit on its own (e.g. refusing to start); returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.take().expect("outboxd is not running");
        reap_within(child, timeout)
            .unwrap_or_else(|| panic!("outboxd did not exit on its own within {timeout:?} (killed it)"))
    }

    /// Waits for the process to end at the debug builds' crash point `step` of `work`
    /// (`seal`, `restore`): aborted (SIGABRT, as `std::process::abort` ends it), having
    /// said so in its log.
    pub fn wait_crashed_at(&mut self, work: &str, step: &str, timeout: Duration) {
        let status = self.wait_exit(timeout);
        assert_eq!(status.signal(), Some(SIGABRT), "outboxd should die at the {work} step {step}: {status}");
        let said = format!("crashing at the {work} step {step:?}");
        assert!(self.log().contains(&said), "no {said:?} in the log:\n{}", self.log_tails(40, 0));
    }

    /// Sends `signal` (a name `kill` takes: `STOP`, `CONT`) to the running process.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("outboxd is not running");
        let sent =
            Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().expect("run kill");
        assert!(sent.success(), "kill -{signal} {} failed", child.id());
    }

    /// SIGTERM and wait (bounded) for the exit; returns its status.
    pub fn terminate(&mut self) -> ExitStatus {
        let child = self.child.take().expect("outboxd is not running");
        let sent = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {} failed", child.id());
        reap_within(child, STOP_TIMEOUT)
            .unwrap_or_else(|| panic!("outboxd did not exit within {STOP_TIMEOUT:?} after SIGTERM (killed it)"))
    }

    /// The store's owner file as the running service wrote it (JSON).
    fn owner(&self) -> Value {
        let path = self.config.store_path.join("outboxd.owner");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
    }

    /// The admin address (`host:port`) the running service recorded next to its store.
    pub fn admin_address(&self) -> String {
        self.owner()["admin"].as_str().expect("an admin address in the owner file").to_owned()
    }

    /// The per-run admin token the running service recorded next to its address.
    pub fn admin_token(&self) -> String {
        self.owner()["admin_token"].as_str().expect("an admin token in the owner file").to_owned()
    }

    /// Runs `outboxd ARGS --config FILE` (one-shot commands such as `store …`).
    pub fn command(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .envs(&self.config.env)
            .args(args)
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {BIN} {args:?}: {e}"))
    }

    /// Runs `outboxd store ARGS --config FILE --json`, requires success, parses stdout.
    pub fn store_json(&self, args: &[&str]) -> Value {
        assert!(self.child.is_none(), "stop outboxd before reading its store");
        let mut full = vec!["store"];
        full.extend_from_slice(args);
        full.push("--json");
        let out = self.command(&full);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "`outboxd {}` failed with {}\nstdout: {stdout}\nstderr: {stderr}",
            full.join(" "),
            out.status
        );
        serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!("`outboxd {}` printed no JSON ({e})\nstdout: {stdout}\nstderr: {stderr}", full.join(" "))
        })
    }

    pub fn store_get(&self, event_id: &str) -> Record {
        let v = self.store_json(&["get", event_id]);
        let record: Record = serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("`store get` record does not match the contract ({e}): {v}"));
        record.assert_times();
        record
    }

    /// `store list [--state STATE] --limit LIMIT --json`
    pub fn store_list(&self, state: Option<&str>, limit: usize) -> Vec<Record> {
        let limit = limit.to_string();
        let mut args = vec!["list"];
        if let Some(s) = state {
            args.extend(["--state", s]);
        }
        args.extend(["--limit", &limit]);
        let v = self.store_json(&args);
        let records: Vec<Record> = serde_json::from_value(v.clone()).unwrap_or_else(|e| {
            let shown: String = v.to_string().chars().take(2000).collect();
            panic!("`store list` output does not match the contract ({e}): {shown}")
        });
        records.iter().for_each(Record::assert_times);
        records
    }

    pub fn store_stats(&self) -> Value {
        self.store_json(&["stats"])
    }

    /// The last `lines` lines of the last run's stderr and the last `earlier` lines of
    /// every earlier run's, each after its first [`HEAD_LINES`] lines: a run that
    /// stalls repeats itself at the end, and what led there is at its start.
    pub fn log_tails(&self, lines: usize, earlier: usize) -> String {
        let mut out = String::new();
        for (i, p) in self.logs.iter().enumerate() {
            let lines = if i + 1 == self.logs.len() { lines } else { earlier };
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            let head = HEAD_LINES.min(from);
            let _ = writeln!(out, "----- outboxd run {} stderr ({} lines) -----", i + 1, all.len());
            for l in &all[..head] {
                let _ = writeln!(out, "{l}");
            }
            if from > head {
                let _ = writeln!(out, "----- ({} lines left out) -----", from - head);
            }
            for l in &all[from..] {
                let _ = writeln!(out, "{l}");
            }
        }
        out
    }
}

/// The lines of each run's start that [`Outboxd::log_tails`] shows besides its tail.
const HEAD_LINES: usize = 150;

/// The read ends of a run's stdout and stderr ([`Outboxd::start_piped`]), read by tasks
/// of the test's runtime.
pub struct Pipes {
    stop: CancellationToken,
    readers: Vec<tokio::task::JoinHandle<u64>>,
}

impl Pipes {
    /// Closes both read ends: outboxd's next write to either fails (EPIPE). Returns the
    /// bytes that came through before.
    pub async fn close(self) -> u64 {
        self.stop.cancel();
        let mut bytes = 0;
        for reader in self.readers {
            bytes += reader.await.expect("pipe reader");
        }
        bytes
    }
}

/// Copies `pipe` into `log` until `stop` (or the end); the pipe is dropped, so closed, on return.
async fn copy_until(mut pipe: impl AsyncRead + Unpin, log: Arc<Mutex<File>>, stop: CancellationToken) -> u64 {
    let mut buf = vec![0u8; 64 * 1024];
    let mut bytes = 0;
    loop {
        let n = tokio::select! {
            () = stop.cancelled() => break,
            read = pipe.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        let _ = log.lock().unwrap_or_else(|e| e.into_inner()).write_all(&buf[..n]);
        bytes += n as u64;
    }
    bytes
}

/// Reaps `child` once it exits, within `timeout`; SIGKILLs and reaps it (and answers
/// `None`) when it does not.
fn reap_within(mut child: Child, timeout: Duration) -> Option<ExitStatus> {
    let exited = keep_looking_blocking(timeout, REAP_EVERY, || child.try_wait().expect("try_wait").ok_or(()));
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    exited.ok()
}

impl Drop for Outboxd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("config:\n{}", self.config.to_toml());
            eprintln!("{}", self.log_tails(300, 60));
        }
    }
}
