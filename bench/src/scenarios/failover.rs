//! Failover: two outboxd instances in one group on a 1-partition topic whose
//! changelog holds N records; the owner is killed (SIGKILL) and the time until
//! the survivor's first handler call is measured, minus the session timeout (the
//! broker only notices the dead owner after it).

use std::time::Duration;

use crate::bench::{Bench, Contender, Hk};
use crate::produce::preload;
use crate::scenarios::restore::{config, field, filled_changelog, RESTORE_LOG};
use crate::KEYS;

/// `session.timeout.ms` of both instances (the broker's smallest by default).
pub(crate) const SESSION_TIMEOUT_MS: u64 = 6000;

#[derive(Debug, Default, Clone)]
pub(crate) struct FailoverResult {
    pub(crate) records: u64,
    /// Per run: kill → the survivor's first handler call, minus the session timeout (s).
    pub(crate) failover: Vec<f64>,
    /// Per run: the survivor's restore (records read, seconds).
    pub(crate) restores: Vec<(f64, f64)>,
}

pub(crate) async fn failover_scenario(b: &Bench) -> anyhow::Result<FailoverResult> {
    let n = b.sizes.restore_records;
    let group = format!("bench-{}-failover", b.run_id);
    let (source, _) = filled_changelog(b, "failover", &group, n).await?;
    let mut r = FailoverResult { records: n, ..FailoverResult::default() };
    for rep in 0..b.sizes.runs {
        let mut cfgs = Vec::new();
        for who in ["a", "b"] {
            let mut c = config(&format!("failover-{who}-{rep}"), &group, &source, Hk::Http);
            // outboxd refuses a drain longer than the session timeout.
            c.drain_timeout = "2s";
            c.kafka_extra.push(("session.timeout.ms", SESSION_TIMEOUT_MS.to_string()));
            c.kafka_extra.push(("heartbeat.interval.ms", "1000".into()));
            cfgs.push(b.write_config(&c)?.0);
        }
        // The owner restores the partition first; then the standby joins (it gets nothing).
        let mut owner = b.spawn(Contender::Outboxd, &cfgs[0], "", RESTORE_LOG)?;
        owner.wait_mark(|m| m.restored, "partition restored", Duration::from_secs(600)).await?;
        let mut standby = b.spawn(Contender::Outboxd, &cfgs[1], "", RESTORE_LOG)?;
        // Its join done (it logs an empty assignment; cooperative: the owner keeps the partition).
        standby.wait_mark(|m| m.assigned, "partitions assigned", Duration::from_secs(60)).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        standby.check_alive()?;
        b.recv.reset(0);
        let killed = owner.kill().await?;
        let (brokers, t) = (b.args.brokers.clone(), source.clone());
        tokio::task::spawn_blocking(move || preload(&brokers, &t, 0xfa11 + rep as u64, 1, KEYS, false)).await??;
        let first = loop {
            if let Some(t) = b.recv.first_call() {
                break t;
            }
            standby.check_alive()?;
            anyhow::ensure!(killed.elapsed() < Duration::from_secs(600), "the survivor handled nothing in 10 min");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let secs = (first - killed).as_secs_f64() - SESSION_TIMEOUT_MS as f64 / 1000.0;
        let line = standby.marks.lock().unwrap().restored_line.clone().unwrap_or_default();
        let restore = (field(&line, "read"), field(&line, "seconds"));
        standby.stop(Duration::from_secs(30)).await?;
        eprintln!(
            "bench: failover run {rep}: {secs:.2} s after the session timeout ({:.2} s after the kill); the survivor restored {:.0} records in {:.2} s",
            (first - killed).as_secs_f64(),
            restore.0,
            restore.1
        );
        r.failover.push(secs);
        r.restores.push(restore);
        for who in ["a", "b"] {
            let _ = std::fs::remove_dir_all(b.work.join(format!("stores/failover-{who}-{rep}")));
        }
    }
    Ok(r)
}
