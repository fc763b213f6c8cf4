//! Crash: what each contender's delivery guarantee is in practice when its process
//! dies mid-drain and Debezium sends events again.
//!
//! Per contender, on a topic of its own: `--crash-events` outbox events (default
//! 20,000, no duplicates) on 8 partitions, the HTTP handler, a receiver that
//! answers 200 after 2 ms (so that every kill lands with calls in flight). The
//! contender is killed with SIGKILL once its group has committed 25%, 50% and 75%
//! of the messages, and restarted at once each time with the same config, store
//! directory (or PostgreSQL table) and consumer group, so it recovers from its own
//! state. After the third restart the last 30% of the events are produced again at
//! new offsets, with the same ids, keys and payloads: a contiguous range at the end
//! of each partition, as Debezium re-sends rows from its last flushed offset after
//! a connector restart. Then the drain runs to the end: every offset committed and
//! the receiver without a call for a second.
//!
//! Counted by the receiver (it identifies an event by its payload's `seq`, whatever
//! key the call carried):
//!
//! - **lost**: events produced that the receiver never answered 2xx;
//! - **repeated, same `Idempotency-Key`**: 2xx calls whose key the receiver had
//!   already answered 2xx: a second side effect, which a receiver that deduplicates
//!   by the key can recognise;
//! - **repeated, new key / no key**: 2xx calls for an event already answered 2xx
//!   with another key or none: a second side effect nobody can recognise.
//!
//! What to expect: `naive` stores offsets as it consumes and auto-commits them, so
//! a kill loses the events committed but not yet called, and it repeats whatever was
//! called but not committed, and every replay. `pg-table` claims an id in its table
//! before the call, so an event claimed and killed before or during its call is
//! never called again (lost), while replays are suppressed. outboxd claims in memory
//! (`on_uncertain = "retry"`, the default): an event whose call was in flight at the
//! kill is not final, so the restarted process runs it again with the same
//! idempotency key (counted as a same-key repeat when the receiver had answered the
//! first call); events recorded done are suppressed, replays included.
//!
//! Consumers run with `session.timeout.ms = 6000`, so a restart waits about 6 s for
//! the broker to drop the killed member, not librdkafka's default 45 s (Camel's
//! route: `sessionTimeoutMs`). The Camel contenders (`--crash-extra`) restart on
//! their repository topic, which `KafkaIdempotentRepository` reads back at start.

use std::time::{Duration, Instant};

use crate::bench::{order, Bench, Cfg, Contender, Hk};
use crate::procs::ChildProc;
use crate::produce::{preload, replay};
use crate::scenarios::failover::SESSION_TIMEOUT_MS;
use crate::scenarios::QUIET_LOG;
use crate::watch::GroupWatch;
use crate::{KEYS, PARTITIONS};

/// Seeds the event ids of the crash topics.
const CRASH_SALT: u64 = 0xc7a5;
/// Committed share of the messages at which each SIGKILL is sent.
pub(crate) const KILLS: [f64; 3] = [0.25, 0.5, 0.75];
/// The replay: this share of the events, the last ones produced.
pub(crate) const REPLAY_SHARE: f64 = 0.3;
/// The receiver's answer delay.
pub(crate) const RECEIVER_MS: u64 = 2;
/// The end: every offset committed and no call for this long.
const QUIET: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(crate) struct CrashResult {
    pub(crate) who: Contender,
    pub(crate) events: u64,
    /// Messages produced again after the third restart.
    pub(crate) replayed: u64,
    /// Committed share of the first `events` messages when each kill was sent.
    pub(crate) kills_at: Vec<f64>,
    pub(crate) lost: u64,
    pub(crate) repeats_same_key: u64,
    pub(crate) repeats_new_key: u64,
    pub(crate) calls: u64,
    /// First start → the end of the drain.
    pub(crate) secs: f64,
    /// A phase did not reach its committed share within `--drain-cap-secs`: counted
    /// on what had happened by then.
    pub(crate) partial: bool,
}

/// One crash run per contender of `--contenders` and `--crash-extra`.
pub(crate) async fn crash_scenario(b: &Bench) -> anyhow::Result<Vec<CrashResult>> {
    let mut out = Vec::new();
    for who in order(0, &format!("{},{}", b.args.contenders, b.args.crash_extra)) {
        out.push(crash_run(b, who).await?);
    }
    Ok(out)
}

async fn crash_run(b: &Bench, who: Contender) -> anyhow::Result<CrashResult> {
    let n = b.sizes.crash_events;
    let name = format!("crash-{}", who.name());
    let topic = b.topic(&name);
    b.create_topic(&topic, PARTITIONS).await?;
    let (brokers, t) = (b.args.brokers.clone(), topic.clone());
    tokio::task::spawn_blocking(move || preload(&brokers, &t, CRASH_SALT, n, KEYS, false)).await??;
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, _) = b.write_config(&Cfg {
        name: name.clone(),
        group: group.clone(),
        topics: vec![topic.clone()],
        handler: Hk::Http,
        fsync: who.fsync(),
        max_in_flight: 256,
        commit_window: who.window(),
        retention: "7d",
        gc_interval: "10m",
        // outboxd refuses a drain longer than the session timeout.
        drain_timeout: "2s",
        store_extra: who.store_extra().to_owned(),
        kafka_extra: vec![
            ("session.timeout.ms", SESSION_TIMEOUT_MS.to_string()),
            ("heartbeat.interval.ms", "1000".into()),
        ],
        handler_extra: String::new(),
    })?;
    let table = format!("processed_events_{}_{}", b.run_id, name.replace('-', "_"));
    let watch = GroupWatch::new(&b.args.brokers, &group, &topic, PARTITIONS)?;
    b.recv.reset(RECEIVER_MS);
    let t0 = Instant::now();
    let start = || async {
        match who.is_camel() {
            true => {
                crate::camel::spawn(b, who, &name, &group, std::slice::from_ref(&topic), n, Some(SESSION_TIMEOUT_MS))
                    .await
            }
            false => b.spawn(who, &cfg, &table, QUIET_LOG),
        }
    };
    let mut child = start().await?;
    let mut kills_at = Vec::new();
    let mut partial = false;
    for share in KILLS {
        if !committed(&watch, &mut child, (n as f64 * share) as i64, b.sizes.drain_cap).await? {
            partial = true;
            break;
        }
        let at = watch.committed();
        child.kill().await?;
        kills_at.push(at as f64 / n as f64);
        eprintln!("bench: crash {:<16} SIGKILL at {at} of {n} committed; restarting", who.name());
        child = start().await?;
    }
    let mut replayed = 0;
    if !partial {
        let (brokers, t) = (b.args.brokers.clone(), topic.clone());
        let from = n - (n as f64 * REPLAY_SHARE) as u64;
        replayed = tokio::task::spawn_blocking(move || replay(&brokers, &t, CRASH_SALT, from..n, KEYS)).await??;
        partial = !drained(b, &watch, &mut child, (n + replayed) as i64).await?;
    }
    let secs = t0.elapsed().as_secs_f64();
    child.stop(Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = {
        let i = b.recv.inner.lock().unwrap();
        CrashResult {
            who,
            events: n,
            replayed,
            kills_at,
            lost: n - i.events.iter().filter(|&&s| s < n).count() as u64,
            repeats_same_key: i.repeats,
            repeats_new_key: i.repeats_new_key,
            calls: i.calls,
            secs,
            partial,
        }
    };
    let _ = std::fs::remove_dir_all(b.work.join("stores").join(&name));
    eprintln!(
        "bench: crash {:<16} {} lost, {} repeated with the same key, {} with a new key or none; {} calls; {secs:.1} s{}",
        who.name(),
        r.lost,
        r.repeats_same_key,
        r.repeats_new_key,
        r.calls,
        if partial { " [not drained within the cap]" } else { "" }
    );
    Ok(r)
}

/// Waits until the group has committed `target` offsets; false when `cap` passes first.
async fn committed(watch: &GroupWatch, child: &mut ChildProc, target: i64, cap: Duration) -> anyhow::Result<bool> {
    let t0 = Instant::now();
    while watch.committed() < target {
        if t0.elapsed() > cap {
            return Ok(false);
        }
        child.check_alive()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(true)
}

/// Waits until the group has committed all `total` offsets and the receiver has had
/// no call for [`QUIET`]; false when `--drain-cap-secs` passes first.
async fn drained(b: &Bench, watch: &GroupWatch, child: &mut ChildProc, total: i64) -> anyhow::Result<bool> {
    let t0 = Instant::now();
    let (mut calls, mut since) = (b.recv.calls(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = b.recv.calls();
        if now != calls {
            (calls, since) = (now, Instant::now());
        }
        if since.elapsed() >= QUIET && watch.committed() >= total {
            return Ok(true);
        }
        if t0.elapsed() > b.sizes.drain_cap {
            return Ok(false);
        }
        child.check_alive()?;
    }
}
