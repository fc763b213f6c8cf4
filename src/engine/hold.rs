//! The releaser of held chains (`on_dead = "hold"`, `store::chains`): once the dead
//! or parked event a key's later events wait for is done (retried), resolved or
//! forgotten (here, through another instance, or on a stopped store), the held
//! events run one at a time, lowest offset first, each through the same path as a
//! consumed message (decode, claim, handler with retries, final record). One that
//! goes dead again becomes the head of the rest, which keep waiting.
//!
//! Only the instance that owns the partition (assigned, restored, not fenced) runs
//! a chain, so a chain runs in one place; its runs count as running events of the
//! partition, so a revoke waits for them as for any other (`kafka.drain_timeout`).
//! Order against the key's new messages: while the chain has a member, every new
//! event of the key is recorded held behind it (`Store::hold_behind`), so nothing
//! of the key runs outside the chain until its last held event has finished.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::executor::Executed;
use super::worker::{panic_text, Shared};
use crate::metrics::names;
use crate::offsets::PartitionId;
use crate::store::{ChainId, State};

/// How often released chains are looked for when nothing woke the releaser (a
/// chain released by another instance's repair arrives with its changelog record;
/// a partition assigned later has its chains looked at within this).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Chains whose held events run at once (each one event at a time): enough for a
/// `store retry --all-dead` to release many keys at once without one task per key.
const CHAINS_AT_ONCE: usize = 8;

/// How often the records of held chains are looked at for their age: a record
/// half a retention old is written again (`Store::refresh_member`), so a chain
/// outlives `store.retention` on this instance and in its changelog topic.
const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// Runs released chains of owned partitions until `stop` (the service's shutdown),
/// then lets the events being run finish, for up to `drain` (`kafka.drain_timeout`).
pub(super) async fn run(shared: Arc<Shared>, drain: Duration, stop: CancellationToken) {
    let store = shared.exec.store.clone();
    let mut running: JoinSet<ChainId> = JoinSet::new();
    let mut busy: HashSet<ChainId> = HashSet::new();
    let mut refresh = tokio::time::interval(REFRESH_EVERY);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if shared.exec.stopped() {
            break;
        }
        for chain in store.holds().released() {
            if busy.len() >= CHAINS_AT_ONCE {
                break;
            }
            if busy.contains(&chain) || owned(&shared, &partition_of(&chain)).is_none() {
                continue;
            }
            if receiver_away(&shared, &chain) && busy.iter().any(|b| same_route(&shared, b, &chain)) {
                // Its route's receiver is away: one chain of the route runs (its first
                // event waits for the circuit, and probes it); the rest wait for it.
                continue;
            }
            busy.insert(chain.clone());
            running.spawn(release(shared.clone(), chain, stop.clone()));
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = store.holds().released_notified() => {}
            Some(ended) = running.join_next(), if !running.is_empty() => match ended {
                Ok(chain) => { busy.remove(&chain); }
                // `release` catches a handler's panic; this is a bug of its own.
                Err(error) => {
                    error!(%error, "a held chain's release ended unexpectedly; releasing again");
                    busy.clear();
                }
            },
            _ = refresh.tick() => keep(&shared).await,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
    if !running.is_empty() {
        info!(chains = running.len(), "waiting for the held events being run");
        if tokio::time::timeout(drain, async { while running.join_next().await.is_some() {} }).await.is_err() {
            warn!(
                ?drain,
                "held events still running at the drain timeout: left for the next run (same idempotency key)"
            );
            running.abort_all();
        }
    }
}

/// Writes the aging records of the held chains of owned partitions again, so that
/// they outlive `store.retention` (only the owner writes: another instance's view
/// of the chain may be older than the changelog's).
async fn keep(shared: &Shared) {
    let store = &shared.exec.store;
    let retention_us = i64::try_from(shared.exec.config.store.retention.as_micros()).unwrap_or(i64::MAX);
    let aging = match store.holds().aging(crate::store::now_us().saturating_sub(retention_us / 2)) {
        Ok(aging) => aging,
        Err(e) => return shared.exec.fail(e),
    };
    for r in aging {
        if owned(shared, &PartitionId::new(&*r.topic, r.partition)).is_none() {
            continue;
        }
        let _id = shared.exec.hold_id(r.scope.as_deref().unwrap_or_default(), &r.event_id).await;
        match store.holds().refresh(&r).await {
            Ok(true) => info!(event_id = %r.event_id, topic = %r.topic, partition = r.partition, offset = r.offset,
                state = %r.state, "held chain's record written again: it waits past store.retention"),
            Ok(false) => {}
            Err(e) => return shared.exec.fail(e),
        }
    }
}

/// The handler of `chain`'s route: the topic's first route, or the later one it names.
fn handler_of<'a>(shared: &'a Shared, chain: &ChainId) -> Option<&'a crate::config::HandlerConfig> {
    shared.exec.config.route_handler(&chain.topic, chain.route.as_deref())
}

/// Whether the circuit of `chain`'s route is open (its receiver is away).
fn receiver_away(shared: &Shared, chain: &ChainId) -> bool {
    handler_of(shared, chain).is_some_and(|h| shared.exec.circuits().get(h.index).is_open())
}

/// Whether two chains run through the same handler.
fn same_route(shared: &Shared, a: &ChainId, b: &ChainId) -> bool {
    match (handler_of(shared, a), handler_of(shared, b)) {
        (Some(x), Some(y)) => x.index == y.index,
        _ => false,
    }
}

fn partition_of(chain: &ChainId) -> PartitionId {
    PartitionId::new(&chain.topic, chain.partition)
}

/// The partition's generation when this instance may run its events now.
fn owned(shared: &Shared, partition: &PartitionId) -> Option<u64> {
    let mut tracker = shared.tracker.lock();
    let generation = tracker.generation(partition)?;
    (!tracker.is_restoring(partition, generation) && tracker.owns(partition, generation)).then_some(generation)
}

/// Runs `chain`'s held events in offset order while it stays released and ours;
/// returns the chain when it stops.
async fn release(shared: Arc<Shared>, chain: ChainId, stop: CancellationToken) -> ChainId {
    let store = shared.exec.store.clone();
    let partition = partition_of(&chain);
    while !stop.is_cancelled() && !shared.exec.stopped() {
        let Some(generation) = owned(&shared, &partition) else { break };
        let (record, message, running) = match store.holds().next(&chain).await {
            Ok(Some(next)) => next,
            Ok(None) => break,
            Err(e) => {
                error!(error = %e, topic = %chain.topic, partition = chain.partition, "store failed while releasing a held chain; stopping");
                shared.exec.fail(e);
                break;
            }
        };
        if !shared.tracker.lock().start_running(&partition, generation) {
            break;
        }
        info!(event_id = %record.event_id, topic = %record.topic, partition = record.partition, offset = record.offset,
            key = %chain.key_text(), "running a held event: its key's chain is released");
        let owns = || shared.tracker.lock().owns(&partition, generation);
        // A bug while running it is contained as on the consumed path: recorded dead, the chain waits behind it.
        let result = match AssertUnwindSafe(shared.exec.execute_held(&message, &owns)).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                shared.exec.record_panic(&message, &panic_text(panic.as_ref())).await.map(|()| Executed::Final)
            }
        };
        shared.tracker.lock().abandon(&partition, generation);
        drop(running);
        match result {
            Ok(Executed::Final) => {}
            // The partition moved (or may have): its next owner runs the chain, from its changelog.
            Ok(Executed::Abandoned) => break,
            Err(e) => {
                error!(error = %e, event_id = %record.event_id, "store failed while running a held event; stopping");
                shared.exec.fail(e);
                break;
            }
        }
        match store.holds().after_run(&record).await {
            Ok(now) => {
                metrics::counter!(names::RELEASED, "topic" => record.topic.clone()).increment(1);
                match now.map(|r| r.state) {
                    Some(State::Dead | State::Parked) => warn!(event_id = %record.event_id, topic = %record.topic,
                        partition = record.partition, offset = record.offset,
                        "a held event failed when its chain ran it: the rest of the chain waits behind it now"),
                    Some(State::Done) | None => {}
                    Some(state) => {
                        warn!(event_id = %record.event_id, %state, "a held event did not finish; its chain stops here for now")
                    }
                }
            }
            Err(e) => {
                error!(error = %e, event_id = %record.event_id, "store failed after running a held event; stopping");
                shared.exec.fail(e);
                break;
            }
        }
    }
    chain
}
