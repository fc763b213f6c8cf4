//! Store: a large store's size on disk, RSS, retention pass and cold start.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench::{Bench, Cfg, Contender, Hk};
use crate::produce::preload;
use crate::scenarios::QUIET_LOG;
use crate::watch::{end_offsets, GroupWatch};
use crate::{KEYS, PARTITIONS};

#[derive(Debug, Default)]
pub(crate) struct StoreResult {
    pub(crate) records: u64,
    pub(crate) load_eps: f64,
    pub(crate) load_secs: f64,
    pub(crate) rss_end: u64,
    pub(crate) rss_peak: u64,
    pub(crate) bytes_on_disk: u64,
    pub(crate) du_bytes: u64,
    pub(crate) done: u64,
    pub(crate) stats_secs: f64,
    pub(crate) cold_running: f64,
    pub(crate) cold_assigned: f64,
    pub(crate) cold_handled: f64,
    pub(crate) cold_rss: u64,
    pub(crate) base_running: f64,
    pub(crate) base_assigned: f64,
    pub(crate) base_handled: f64,
    pub(crate) open_secs: f64,
    pub(crate) gc_secs: f64,
    pub(crate) gc_removed: u64,
    pub(crate) relaxed_load_eps: f64,
    pub(crate) relaxed_rss_end: u64,
}

pub(crate) fn dir_bytes(dir: &Path) -> u64 {
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

pub(crate) async fn store_scenario(b: &Bench) -> anyhow::Result<StoreResult> {
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
        store_extra: String::new(),
        kafka_extra: Vec::new(),
        handler_extra: String::new(),
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
        store_extra: String::new(),
        kafka_extra: Vec::new(),
        handler_extra: String::new(),
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
        store_extra: String::new(),
        kafka_extra: Vec::new(),
        handler_extra: String::new(),
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
