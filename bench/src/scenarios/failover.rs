//! Failover: two outboxd instances in one group on a 1-partition topic whose
//! changelog holds N records; the owner is killed (SIGKILL) and the time until
//! the survivor's first handler call is measured, minus the session timeout (the
//! broker only notices the dead owner after it). Each run is measured twice: the
//! survivor with an empty store (it restores the whole partition on takeover), and
//! with `store.changelog.standby = true` (it has tailed the changelog before the
//! kill, so its restore reads only what is new).

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
    /// The same with `store.changelog.standby = true`.
    pub(crate) standby_failover: Vec<f64>,
    pub(crate) standby_restores: Vec<(f64, f64)>,
}

/// With a standby, outboxd's standby lines too.
const STANDBY_LOG: &str =
    "warn,outboxd::engine::restore=info,outboxd::engine::standby=info,outboxd::kafka::source=info";

pub(crate) async fn failover_scenario(b: &Bench) -> anyhow::Result<FailoverResult> {
    let n = b.sizes.restore_records;
    let group = format!("bench-{}-failover", b.run_id);
    let (source, _) = filled_changelog(b, "failover", &group, n).await?;
    let mut r = FailoverResult { records: n, ..FailoverResult::default() };
    for rep in 0..b.sizes.runs {
        for standby in [false, true] {
            let (secs, restore) = failover_run(b, &group, &source, rep, standby).await?;
            let (f, rs) = if standby {
                (&mut r.standby_failover, &mut r.standby_restores)
            } else {
                (&mut r.failover, &mut r.restores)
            };
            f.push(secs);
            rs.push(restore);
        }
    }
    Ok(r)
}

/// One failover: returns the seconds after the session timeout and the survivor's restore (read, seconds).
async fn failover_run(
    b: &Bench,
    group: &str,
    source: &str,
    rep: usize,
    standby: bool,
) -> anyhow::Result<(f64, (f64, f64))> {
    let tag = if standby { "standby-" } else { "" };
    {
        let mut cfgs = Vec::new();
        for who in ["a", "b"] {
            let mut c = config(&format!("failover-{tag}{who}-{rep}"), group, source, Hk::Http);
            if standby {
                c.store_extra = "[store.changelog]\nstandby = true\n".into();
            }
            // outboxd refuses a drain longer than the session timeout.
            c.drain_timeout = "2s";
            c.kafka_extra.push(("session.timeout.ms", SESSION_TIMEOUT_MS.to_string()));
            c.kafka_extra.push(("heartbeat.interval.ms", "1000".into()));
            cfgs.push(b.write_config(&c)?.0);
        }
        // The owner restores the partition first; then the standby joins (it gets nothing).
        let log = if standby { STANDBY_LOG } else { RESTORE_LOG };
        let mut owner = b.spawn(Contender::Outboxd, &cfgs[0], "", log)?;
        owner.wait_mark(|m| m.restored, "partition restored", Duration::from_secs(600)).await?;
        let mut survivor = b.spawn(Contender::Outboxd, &cfgs[1], "", log)?;
        // Its join done (it logs an empty assignment; cooperative: the owner keeps the partition).
        survivor.wait_mark(|m| m.assigned, "partitions assigned", Duration::from_secs(60)).await?;
        if standby {
            survivor.wait_mark(|m| m.standby_caught_up, "standby caught up", Duration::from_secs(600)).await?;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        survivor.check_alive()?;
        b.recv.reset(0);
        let killed = owner.kill().await?;
        // A new event id each time (one id per seed): one handled in an earlier run is in
        // the changelog, and the survivor would rightly suppress it.
        let (brokers, t) = (b.args.brokers.clone(), source.to_owned());
        tokio::task::spawn_blocking(move || {
            preload(&brokers, &t, 0xfa11 + 2 * rep as u64 + u64::from(standby), 1, KEYS, false)
        })
        .await??;
        let first = loop {
            if let Some(t) = b.recv.first_call() {
                break t;
            }
            survivor.check_alive()?;
            anyhow::ensure!(killed.elapsed() < Duration::from_secs(600), "the survivor handled nothing in 10 min");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let secs = (first - killed).as_secs_f64() - SESSION_TIMEOUT_MS as f64 / 1000.0;
        let line = survivor.marks.lock().unwrap().restored_line.clone().unwrap_or_default();
        let restore = (field(&line, "read"), field(&line, "seconds"));
        survivor.stop(Duration::from_secs(30)).await?;
        eprintln!(
            "bench: failover {tag}run {rep}: {secs:.2} s after the session timeout ({:.2} s after the kill); the survivor restored {:.0} records in {:.2} s",
            (first - killed).as_secs_f64(),
            restore.0,
            restore.1
        );
        for who in ["a", "b"] {
            let _ = std::fs::remove_dir_all(b.work.join(format!("stores/failover-{tag}{who}-{rep}")));
        }
        Ok((secs, restore))
    }
}
