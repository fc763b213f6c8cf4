//! `outboxd-bench suite [--quick]`: the benchmark suite of outboxd (run it through
//! `bench/run`, which builds the release binaries and brings up the local stack).
//!
//! Contenders, on the same broker, topics, receiver and run, interleaved:
//! `naive` (no dedup, upper bound), `naive-changelog` (naive and a changelog record
//! per event: the floor of outboxd's design), `pg-table` (dedup in a PostgreSQL table),
//! `outboxd` (release binary, `store.fsync = true`), `outboxd-relaxed`
//! (`store.fsync = false`) and Apache Camel's Idempotent Consumer (`camel`, the
//! at-least-once recipe, and `camel-defaults`; HTTP handler only). Scenarios: drain, added latency, slow receiver,
//! overloaded receiver (outboxd with a fixed in-flight limit against adaptive
//! concurrency), store, restore, failover, crash (SIGKILL mid-drain and Debezium
//! replays: events lost and side effects repeated). Writes a markdown report
//! (default `bench/results.md`).
//!
//! The driver's modules: `bench` (the contenders, the configs they run with and
//! `Bench`, what every scenario shares), `camel` (the Camel contenders' JVM), `procs` (contender processes and what
//! /proc says about them), `receiver` (the HTTP receiver the handlers call),
//! `produce` (the outbox messages), `watch` (committed and end offsets),
//! `scenarios` (one module per scenario), `stats` and `report` (the markdown).

mod bench;
mod camel;
mod changelog;
mod procs;
mod produce;
mod receiver;
mod report;
mod report_crash;
mod report_overload;
mod report_restore;
mod report_scale;
mod scenarios;
mod stats;
mod watch;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;

use crate::bench::{client, order, Bench, Contender, Hk, Topics};
use crate::procs::Noise;
use crate::produce::preload;
use crate::receiver::{now_us, on_call, Recv};
use crate::report::{machine, others_running, write_report};
use crate::scenarios::crash::{crash_scenario, CrashResult};
use crate::scenarios::drain::{drain_run, DrainResult};
use crate::scenarios::failover::{failover_scenario, FailoverResult};
use crate::scenarios::latency::{fdatasync_floor, latency_run, LatResult};
use crate::scenarios::overload::{overload_run, Limit};
use crate::scenarios::restore::{restore_scenario, RestoreResult};
use crate::scenarios::slow::slow_run;
use crate::scenarios::store::{store_scenario, StoreResult};
use crate::stats::pct;
use crate::watch::end_offsets;

/// outboxd's allocator (src/main.rs): the scale scenario's child processes measure the
/// store's RSS, and the allocator decides how much of what the store frees stays resident.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: i32 = 8;
const KEYS: u64 = 10_000;
const PAYLOAD_BYTES: usize = 500;
const SLOW_RECEIVER_MS: u64 = 20;

#[derive(Parser, Debug, Clone)]
#[command(about = "outboxd benchmark suite", args_override_self = true)]
struct Args {
    /// Small sizes (a few minutes): 20k drain events, 1 run, 10 s latency, 100k store records, 100k changelog records.
    #[arg(long)]
    quick: bool,
    /// Drain: messages pre-loaded (5% of them duplicates); overloaded receiver: the
    /// backlog drained (no duplicates). Default 200000 (quick 20000).
    #[arg(long)]
    events: Option<u64>,
    /// Interleaved repetitions of drain, latency, slow- and overloaded-receiver runs. Default 3 (quick 1).
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
    /// Slow receiver: the receiver's latencies (ms) at which outboxd (256 in flight),
    /// camel and naive are compared; the full table is at 20 ms.
    #[arg(long, default_value = "1,5,20", value_delimiter = ',')]
    slow_latencies: Vec<u64>,
    /// Store: retained records. Default 1000000 (quick 100000).
    #[arg(long)]
    store_records: Option<u64>,
    /// Restore and failover: records in the changelog partition. Default 1000000 (quick 100000).
    #[arg(long)]
    restore_records: Option<u64>,
    /// Scale: records of the stores made directly. Default 10000000 (quick 200000).
    #[arg(long)]
    scale_records: Option<u64>,
    /// Crash: events per contender (killed at 25%, 50%, 75%; the last 30% replayed). Default 20000 (quick 10000).
    #[arg(long)]
    crash_events: Option<u64>,
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
    /// Comma-separated subset of the contenders for drain and latency: naive, pg-table,
    /// outboxd, outboxd-relaxed, outboxd-park (the handler with `on_uncertain = "park"`:
    /// every claim written, durable and in the changelog before the call), camel (Apache
    /// Camel's Idempotent Consumer, the at-least-once recipe), camel-defaults (the same
    /// route with Camel's defaults),
    /// camel-memory (the recipe with the in-memory repository). The Camel routes run with
    /// the HTTP handler only.
    #[arg(long, default_value = "naive,pg-table,outboxd,outboxd-relaxed")]
    contenders: String,
    /// Extra contenders in the latency scenario only: outboxd with the group-commit
    /// window off (`store.commit_interval = "0ms"`), to show what the window costs.
    #[arg(long, default_value = "outboxd-window0,outboxd-relaxed-window0")]
    latency_extra: String,
    /// Extra contenders in the drain scenario only: outboxd with the changelog off
    /// (`[store.changelog] enabled = false`), to show what the changelog costs;
    /// naive-changelog (naive and one changelog record per event, awaited before its
    /// offset: what the design's changelog costs without a store); Apache Camel's
    /// Idempotent Consumer (recipe and defaults; HTTP handler only).
    #[arg(long, default_value = "outboxd-nochangelog,naive-changelog,camel,camel-defaults")]
    drain_extra: String,
    /// Extra contenders in the crash scenario only: Apache Camel's Idempotent Consumer
    /// (recipe and defaults).
    #[arg(long, default_value = "camel,camel-defaults")]
    crash_extra: String,
    /// Contenders of the overloaded-receiver scenario: outboxd-fixed (`[handlers.concurrency]
    /// adaptive = false`), outboxd-adaptive (`adaptive = true`), outboxd (no such table: as
    /// shipped); each also as `-nocircuit` (`[handlers.circuit] enabled = false`).
    #[arg(long, default_value = "outboxd-fixed,outboxd-adaptive,outboxd-fixed-nocircuit,outboxd-adaptive-nocircuit")]
    overload_contenders: String,
    /// Comma-separated subset of: drain,latency,slow,overload,store,scale,restore,failover,crash
    /// (overload = the overloaded receiver; not in the default set).
    #[arg(long, default_value = "drain,latency,slow,store,scale,restore,failover,crash")]
    scenarios: String,
    #[arg(long, default_value = "127.0.0.1:19092")]
    brokers: String,
    #[arg(long, default_value = "postgresql://postgres@127.0.0.1:15432/outbox")]
    pg: String,
    /// Where the release binaries are (outboxd, naive, pg-table).
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// The Camel contenders' jar (`mvn -f bench/camel/pom.xml package`; bench/run builds it).
    #[arg(long, default_value = "bench/camel/target/outboxd-camel.jar")]
    camel_jar: PathBuf,
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
    restore_records: u64,
    scale_records: u64,
    crash_events: u64,
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
            restore_records: a.restore_records.unwrap_or(if q { 100_000 } else { 1_000_000 }),
            scale_records: a.scale_records.unwrap_or(if q { 200_000 } else { 10_000_000 }),
            crash_events: a.crash_events.unwrap_or(if q { 10_000 } else { 20_000 }),
            drain_cap: Duration::from_secs(a.drain_cap_secs.unwrap_or(if q { 40 } else { 120 })),
            floor_samples: if q { 300 } else { 1000 },
        }
    }
}

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
    /// What the spans of one event cost the CPU with the OTLP exporter off and on
    /// (a loop over the span calls of one event; run the release build).
    SpanCost {
        #[arg(long, default_value_t = 1_000_000)]
        events: u32,
    },
    /// Investigation: append changelog records (done, the first `--claims` of them
    /// preceded by a claim) to partition 0 of an existing changelog topic of `--source`,
    /// e.g. to profile `outboxd store rebuild` by hand.
    FillChangelog {
        #[arg(long)]
        changelog: String,
        #[arg(long)]
        source: String,
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
        #[arg(long, default_value_t = 0)]
        claims: u64,
        #[arg(long, default_value = "127.0.0.1:19092")]
        brokers: String,
    },
    /// The scale scenario's store maker (a process of its own; prints JSON).
    ScaleFabricate {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        records: u64,
        #[arg(long)]
        retention_secs: u64,
        /// Slices whose time has passed as packed runs (else one entry per record).
        #[arg(long)]
        packed: bool,
    },
    /// The scale scenario's measuring process (prints JSON).
    ScaleMeasure {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        retention_secs: u64,
        #[arg(long, default_value_t = 20_000)]
        events: u64,
        /// Then seal what a gc pass would (a store written before runs).
        #[arg(long)]
        seal: bool,
        /// Then pack the largest slice anew, as a merge of a grown live slice does.
        #[arg(long)]
        merge: bool,
        /// sled's page cache, MiB (the shipped default; smaller to see what the cache holds).
        #[arg(long, default_value_t = outboxd_bench::scale::shipped_cache_bytes() >> 20)]
        cache_mib: u64,
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
    // Huge pages off, as outboxd starts: the processes hold memory as the service does.
    outboxd::cli::small_pages();
    let args = match Cli::parse() {
        Cli::Suite(args) => *args,
        Cli::StoreProbe { records, variant, cache_mb, batch, dir } => {
            let v =
                tokio::task::spawn_blocking(move || outboxd_bench::probe::run(&dir, records, variant, cache_mb, batch))
                    .await??;
            println!("{v}");
            return Ok(());
        }
        Cli::SpanCost { events } => {
            let (off, on) = outboxd::engine::spans::cost::spans_of_one_event_with_the_exporter_off_and_on(events);
            println!("spans of one event: {off:.0} ns with the exporter off, {on:.0} ns with it on");
            return Ok(());
        }
        Cli::FillChangelog { changelog, source, records, claims, brokers } => {
            let n = tokio::task::spawn_blocking(move || {
                changelog::fill(&brokers, &changelog, &source, scenarios::restore::CHANGELOG_SALT, records, claims)
            })
            .await??;
            println!("{n} changelog records written");
            return Ok(());
        }
        Cli::ScaleFabricate { dir, records, retention_secs, packed } => {
            let retention = Duration::from_secs(retention_secs);
            let made =
                tokio::task::spawn_blocking(move || outboxd_bench::scale::make(&dir, records, retention, packed))
                    .await??;
            println!("{}", serde_json::to_string(&made)?);
            return Ok(());
        }
        Cli::ScaleMeasure { dir, retention_secs, events, seal, merge, cache_mib } => {
            let retention = Duration::from_secs(retention_secs);
            let m = outboxd_bench::scale::measure(&dir, retention, events, seal, merge, cache_mib << 20).await?;
            println!("{}", serde_json::to_string(&m)?);
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
        anyhow::ensure!(
            ["drain", "latency", "slow", "overload", "store", "scale", "restore", "failover", "crash"]
                .contains(&s.as_str()),
            "unknown scenario {s}"
        );
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
        topics: Topics::default(),
        clk_tck,
    };
    eprintln!("bench: run {} on {}", b.run_id, machine());

    let result = run_suite(&b, &scenarios, started).await;
    // Clean up topics and scratch stores whatever happened.
    let names = b.topics.all();
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
    /// (contender, calls in flight, keys, receiver ms, events/s per run)
    slow: Vec<(String, usize, &'static str, u64, Vec<f64>)>,
    overload: report_overload::Overloaded,
    store: Option<StoreResult>,
    restore: Option<RestoreResult>,
    scale: Option<crate::scenarios::scale::ScaleResult>,
    failover: Option<FailoverResult>,
    crash: Vec<CrashResult>,
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
                let names = format!("{},{}", b.args.contenders, b.args.drain_extra);
                for who in order(r + hk as usize, &names) {
                    // A Camel route calls the receiver; it has no log handler to compare.
                    if who.is_camel() && hk == Hk::Log {
                        continue;
                    }
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
        // Enough for 256 in flight at the shortest latency through the window, warm-up and
        // start (12,800/s at 20 ms; below that at most about what naive drains, 25,000/s).
        let fastest = b.args.slow_latencies.iter().copied().chain([SLOW_RECEIVER_MS]).min().unwrap_or(1).max(1);
        let n_many = (256_000 / fastest).min(25_000) * (s.slow_secs + 4);
        let n_hot = 60 * (s.slow_secs + 4);
        let (br, mt, h) = (b.args.brokers.clone(), many.clone(), hot.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            preload(&br, &mt, 0x51, n_many, KEYS, false)?;
            preload(&br, &h, 0x52, n_hot, 1, false)?;
            Ok(())
        })
        .await??;
        let at = SLOW_RECEIVER_MS;
        let mut configs: Vec<(Contender, usize, &'static str, &String, u64)> = vec![
            (Contender::Outboxd, 1, "many keys", &many, at),
            (Contender::Outboxd, 16, "many keys", &many, at),
            (Contender::Outboxd, 256, "many keys", &many, at),
            (Contender::Outboxd, 1, "one key", &hot, at),
            (Contender::Outboxd, 16, "one key", &hot, at),
            (Contender::Outboxd, 256, "one key", &hot, at),
            (Contender::Naive, 256, "many keys", &many, at),
            // Camel's natural concurrency: one call at a time per consumer.
            (Contender::Camel, camel::CONSUMERS, "many keys", &many, at),
        ];
        let mut others: Vec<u64> = b.args.slow_latencies.iter().copied().filter(|l| *l != at).collect();
        others.sort_unstable();
        others.dedup();
        for l in others {
            configs.push((Contender::Outboxd, 256, "many keys", &many, l));
            configs.push((Contender::Camel, camel::CONSUMERS, "many keys", &many, l));
            configs.push((Contender::Naive, 256, "many keys", &many, l));
        }
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        for r in 0..s.runs {
            for (i, (who, mif, label, topic, lat)) in configs.iter().enumerate() {
                let label = if *label == "one key" { "one-key" } else { "many-keys" };
                results[i].push(slow_run(b, *who, *mif, topic, label, *lat, r).await?);
            }
        }
        m.noise.push(("slow receiver", n0.other_share()));
        for (i, (who, mif, label, _, lat)) in configs.iter().enumerate() {
            m.slow.push((who.name().to_owned(), *mif, label, *lat, results[i].clone()));
        }
    }

    write_report(b, started, &m, false)?;
    // ---- overloaded receiver
    if scenarios.contains("overload") {
        let n0 = Noise::now();
        let who = Limit::parse_list(&b.args.overload_contenders)?;
        anyhow::ensure!(!who.is_empty(), "--overload-contenders names none");
        m.overload = who.iter().map(|w| (*w, Vec::new())).collect();
        for r in 0..s.runs {
            for k in 0..who.len() {
                let i = (k + r) % who.len();
                let res = overload_run(b, who[i], s.events, r).await?;
                m.overload[i].1.push(res);
            }
        }
        m.noise.push(("overloaded receiver", n0.other_share()));
    }

    write_report(b, started, &m, false)?;
    // ---- store
    let n0 = Noise::now();
    m.store = if scenarios.contains("store") { Some(store_scenario(b).await?) } else { None };
    if m.store.is_some() {
        m.noise.push(("store", n0.other_share()));
    }

    write_report(b, started, &m, false)?;
    // ---- scale
    if scenarios.contains("scale") {
        let n0 = Noise::now();
        m.scale = Some(crate::scenarios::scale::scale_scenario(b).await?);
        m.noise.push(("scale", n0.other_share()));
    }

    write_report(b, started, &m, false)?;
    // ---- restore, failover
    if scenarios.contains("restore") {
        let n0 = Noise::now();
        m.restore = Some(restore_scenario(b).await?);
        m.noise.push(("restore", n0.other_share()));
    }
    write_report(b, started, &m, false)?;
    if scenarios.contains("failover") {
        let n0 = Noise::now();
        m.failover = Some(failover_scenario(b).await?);
        m.noise.push(("failover", n0.other_share()));
    }
    write_report(b, started, &m, false)?;
    if scenarios.contains("crash") {
        let n0 = Noise::now();
        m.crash = crash_scenario(b).await?;
        m.noise.push(("crash", n0.other_share()));
    }

    write_report(b, started, &m, true)?;
    Ok(())
}
