//! Drain: how fast each contender consumes a pre-loaded topic, and at what CPU (from
//! the `partitions assigned` line to the last offset committed).

use std::time::{Duration, Instant};

use crate::bench::{Bench, Cfg, Contender, Hk};
use crate::changelog::{broker_log_dir, topic_bytes};
use crate::procs::{pg_server_ticks, sync_metrics, Noise};
use crate::scenarios::QUIET_LOG;
use crate::watch::{end_offsets, GroupWatch};
use crate::PARTITIONS;

#[derive(Debug, Clone, Default)]
pub(crate) struct DrainResult {
    pub(crate) eps: f64,
    pub(crate) cpu_per_100k: f64,
    pub(crate) pg_cpu_per_100k: f64,
    pub(crate) calls: u64,
    pub(crate) repeats: u64,
    pub(crate) partial: bool,
    pub(crate) committed: i64,
    pub(crate) rss: u64,
    pub(crate) sync: Option<(f64, f64, f64)>,
    /// outboxd with the changelog on: bytes of its changelog topic's log segments
    /// per record in it (as written, before any compaction).
    pub(crate) changelog_bytes: Option<f64>,
}

pub(crate) async fn drain_run(
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
        store_extra: who.store_extra().to_owned(),
        kafka_extra: Vec::new(),
        handler_extra: who.handler_settings().to_owned(),
    })?;
    b.recv.reset(0);
    let table = format!("processed_events_{}_{}_{rep}", b.run_id.replace('-', "_"), hk.name());
    let pg0 = pg_server_ticks();
    let n0 = Noise::now();
    let mut child = match who.is_camel() {
        true => crate::camel::spawn(b, who, &name, &group, &[topic.to_owned()], total as u64, None).await?,
        false => b.spawn(who, &cfg, &table, QUIET_LOG)?,
    };
    let t0 = child.wait_assigned().await?;
    // From the start line on, as events/s: a JVM's start-up is not per-event work.
    let cpu0 = child.cpu_secs(b.clk_tck);
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
    let cpu = child.cpu_secs(b.clk_tck) - cpu0;
    let (rss, _) = child.rss();
    let sync = sync_metrics(admin).await;
    let pg_cpu = (pg_server_ticks().saturating_sub(pg0)) as f64 / b.clk_tck;
    let other = n0.other_share();
    child.stop(Duration::from_secs(30)).await?;
    let changelog_bytes = if who.is_outboxd() && who.store_extra().is_empty() {
        let changelog = format!("{group}.{topic}.outboxd-dedup");
        b.topics.add(changelog.clone());
        let records = end_offsets(&b.args.brokers, &changelog, PARTITIONS)?;
        let dir = broker_log_dir(&b.admin, &b.args.brokers).await?;
        Some(topic_bytes(&dir, &changelog) as f64 / records.max(1) as f64)
    } else {
        None
    };
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
        changelog_bytes,
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
