//! The scale scenario's child processes: one makes a store of N records
//! directly (`outboxd::store::scale::fabricate`), another opens it as the
//! service does and measures it, each in a process of its own so that its RSS
//! is the store's and nothing else's. Both print one JSON object.

use std::path::Path;
use std::time::{Duration, Instant};

use outboxd::store::scale::{fabricate, Fabricate, Probe};
use serde::{Deserialize, Serialize};

/// The records' topic and dedup scope.
pub const TOPIC: &str = "scale";
/// Ids of the fabricated records.
pub const SALT: u64 = 0x5ca1e;
/// sled's page cache in the measured process: `store.cache_size` as a config that does
/// not set it gets it (the shipped default, read from outboxd's own config parser).
pub fn shipped_cache_bytes() -> u64 {
    let minimal = "[kafka]\nbrokers = \"b\"\ngroup_id = \"g\"\n[store]\npath = \"p\"\n[[handlers]]\ntopics = [\"t\"]\nkind = \"log\"\n";
    outboxd::config::Config::parse(minimal, &|_| None).expect("a minimal config parses").store.cache_bytes
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Fabricated {
    pub records: u64,
    pub secs: f64,
}

/// Makes the store (a dead record every 1,000, the rest done).
pub fn make(dir: &Path, records: u64, retention: Duration, packed: bool) -> anyhow::Result<Fabricated> {
    let f = Fabricate { records, retention, topic: TOPIC.into(), partitions: 8, dead_every: 1_000, salt: SALT, packed };
    let t = Instant::now();
    fabricate(dir, &f, &mut |n| eprintln!("bench: scale: {n} of {records} records written"))?;
    Ok(Fabricated { records, secs: t.elapsed().as_secs_f64() })
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Measured {
    /// `Store::open` returned.
    pub open_secs: f64,
    /// Every slice's lookup filter holds its keys (from the start of the open).
    pub filters_secs: f64,
    /// VmRSS when `Store::open` returned.
    #[serde(default)]
    pub rss_opened: u64,
    /// VmRSS once the filters are built.
    pub rss_open: u64,
    /// Store CPU per new event handled (claim, then the final record), µs.
    pub cpu_per_event_us: f64,
    /// VmRSS after the events.
    pub rss_live: u64,
    /// Dropping the oldest slice: records, seconds, VmHWM during it minus VmRSS before.
    pub drop_records: u64,
    pub drop_secs: f64,
    pub drop_rss_rise: i64,
    /// Sealing the slices whose time has passed (a store written before runs): records, seconds.
    pub sealed_records: u64,
    pub seal_secs: f64,
    /// Packing the largest slice anew (a merge, as a grown live slice's): records,
    /// seconds, VmHWM during it minus VmRSS before.
    #[serde(default)]
    pub merge_records: u64,
    #[serde(default)]
    pub merge_secs: f64,
    #[serde(default)]
    pub merge_rss_rise: i64,
    /// Slices, and those with a packed run, at the open.
    pub slices: usize,
    pub packed_slices: usize,
}

fn status_kb(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn cpu_secs() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

/// Opens the store at `dir`, handles `events` new events through it (64 at a
/// time, as handlers finish in the service), drops its oldest slice, and with
/// `seal` then seals what a gc pass would, with `merge` packs the largest slice
/// anew; sled's page cache is `cache_bytes`.
pub async fn measure(
    dir: &Path,
    retention: Duration,
    events: u64,
    seal: bool,
    merge: bool,
    cache_bytes: u64,
) -> anyhow::Result<Measured> {
    let mut m = Measured::default();
    let t = Instant::now();
    let probe = std::sync::Arc::new(Probe::open(dir, retention, cache_bytes)?);
    m.open_secs = t.elapsed().as_secs_f64();
    m.rss_opened = status_kb("VmRSS:");
    anyhow::ensure!(probe.wait_for_filters(Duration::from_secs(1_800)), "lookup filters not built in 30 min");
    m.filters_secs = t.elapsed().as_secs_f64();
    m.rss_open = status_kb("VmRSS:");
    (m.slices, m.packed_slices) = probe.slices();

    const TASKS: u64 = 64;
    let cpu = cpu_secs();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..TASKS {
        let probe = probe.clone();
        tasks.spawn(async move { probe.handle(TOPIC, SALT + 1 + k, events / TASKS).await });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    m.cpu_per_event_us = (cpu_secs() - cpu) * 1e6 / (events / TASKS * TASKS) as f64;
    m.rss_live = status_kb("VmRSS:");

    let before = status_kb("VmRSS:");
    // Resets VmHWM to the current RSS, so the peak below is the drop's.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let t = Instant::now();
    m.drop_records = probe.drop_oldest()?;
    m.drop_secs = t.elapsed().as_secs_f64();
    m.drop_rss_rise = status_kb("VmHWM:") as i64 - before as i64;

    if seal {
        let t = Instant::now();
        m.sealed_records = probe.seal().await?;
        m.seal_secs = t.elapsed().as_secs_f64();
    }
    if merge {
        let before = status_kb("VmRSS:");
        std::fs::write("/proc/self/clear_refs", "5")?;
        let t = Instant::now();
        m.merge_records = probe.merge_largest().await?;
        m.merge_secs = t.elapsed().as_secs_f64();
        m.merge_rss_rise = status_kb("VmHWM:") as i64 - before as i64;
    }
    let probe = std::sync::Arc::into_inner(probe).expect("every task ended");
    probe.close().await?;
    Ok(m)
}
