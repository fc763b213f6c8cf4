//! Added latency: events at a fixed rate through each contender to the receiver,
//! and the fdatasync floor of the stores' disk to compare outboxd with.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::bench::{Bench, Cfg, Contender, Hk};
use crate::procs::sync_metrics;
use crate::produce::{produce_at_rate, splitmix};
use crate::receiver::now_us;
use crate::scenarios::QUIET_LOG;
use crate::stats::pct;
use crate::PARTITIONS;

#[derive(Debug, Clone, Default)]
pub(crate) struct LatResult {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) samples: usize,
    /// group commits per second, records per commit, ms per flush+fdatasync
    pub(crate) sync: Option<(f64, f64, f64)>,
}

pub(crate) async fn latency_run(b: &Bench, who: Contender, rep: usize) -> anyhow::Result<LatResult> {
    let name = format!("lat-{}-{rep}", who.name());
    let topic = b.topic(&format!("lat.{}.{rep}", who.name()));
    b.create_topic(&topic, PARTITIONS).await?;
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, admin) = b.write_config(&Cfg {
        name: name.clone(),
        group: group.clone(),
        topics: vec![topic.clone()],
        handler: Hk::Http,
        fsync: who.fsync(),
        max_in_flight: 256,
        commit_window: who.window(),
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
        store_extra: who.store_extra().to_owned(),
        kafka_extra: Vec::new(),
        handler_extra: who.handler_settings().to_owned(),
    })?;
    let table = format!("processed_events_{}_lat_{rep}", b.run_id.replace('-', "_"));
    let ids = b.args.rate * b.sizes.latency_secs;
    let mut child = match who.is_camel() {
        true => crate::camel::spawn(b, who, &name, &group, std::slice::from_ref(&topic), ids, None).await?,
        false => b.spawn(who, &cfg, &table, QUIET_LOG)?,
    };
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
pub(crate) fn fdatasync_floor(dir: &Path, samples: usize) -> anyhow::Result<(Vec<i64>, Vec<i64>)> {
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
