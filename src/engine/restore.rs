//! Restore on assignment (`[store.changelog]`): every assigned partition is
//! paused by the consumer and marked restoring in the tracker; this task reads
//! its changelog partition into the local store, from the local checkpoint (or
//! from the beginning for a store that never restored it) up to the end offset
//! seen when the restore began, then lets its events begin and resumes it.
//! Partitions are restored one at a time; the others keep flowing meanwhile.
//! Between restores, restored partitions catch up with what other instances
//! wrote to their changelogs (`follow`), and with `store.changelog.standby` the
//! partitions other instances own are tailed (`standby`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::follow::Follow;
use super::standby::Standby;
use super::worker::{lock, Shared};
use crate::config::{ChangelogConfig, KafkaConfig};
use crate::kafka::changelog::{ensure_one, TopicError};
use crate::kafka::Restorer;
use crate::metrics::names;
use crate::offsets::PartitionId;
use crate::store::Store;

/// How often the task looks for partitions to restore when nobody woke it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long one read waits for changelog records before it looks whether the
/// partition is still ours.
pub(super) const READ_WAIT: Duration = Duration::from_millis(500);
/// Pause before a failed restore (broker unreachable, ...) is tried again, from its checkpoint.
const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// What the restore task needs besides the engine.
#[derive(Clone)]
pub struct RestoreSetup {
    /// The brokers and client settings (the restore consumer, topic checks).
    pub kafka: KafkaConfig,
    /// Where the changelog topics are and how to restore them.
    pub changelog: ChangelogConfig,
    /// `store.retention`: the `retention.ms` of changelog topics created on assignment.
    pub retention: Duration,
}

/// What one partition's restore read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Restored {
    /// Changelog records read.
    pub read: u64,
    /// Of those, records that changed the local store.
    pub applied: u64,
    /// The checkpoint now (the changelog's end when the restore began).
    pub checkpoint: i64,
    /// How long the restore took.
    pub seconds: f64,
}

pub(super) async fn run(shared: Arc<Shared>, setup: RestoreSetup, stop: CancellationToken) {
    let wakeup = shared.consumer.restore_wakeup();
    let restorer = match Restorer::build(&setup.kafka) {
        Ok(r) => Arc::new(r),
        Err(e) => return shared.exec.fail(format!("creating the changelog restore consumer: {e:#}")),
    };
    let mut ensured: HashSet<String> = HashSet::new();
    let mut follow = Follow::new(&setup.changelog);
    let mut standby = Standby::new(&setup.changelog);
    // Some partition was restored since the last time none was waiting.
    let mut restored_some = false;
    loop {
        let waiting = lock(&shared.tracker).restoring();
        metrics::gauge!(names::RESTORING).set(waiting.len() as f64);
        standby.hand_over(&waiting, &shared, &setup.changelog);
        if waiting.is_empty() {
            if std::mem::take(&mut restored_some) {
                info!("every assigned partition is restored");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = wakeup.notified() => {}
                () = tokio::time::sleep(LOOK_EVERY.min(follow.interval())) => {}
            }
            follow.check(&shared, &restorer, &setup.changelog, &stop).await;
            standby.check(&shared, &restorer, &setup.changelog, &stop).await;
            continue;
        }
        for (partition, generation) in waiting {
            if stop.is_cancelled() || shared.exec.stopped() {
                return;
            }
            if setup.changelog.is_changelog(&partition.0) {
                // A topic_pattern matched a changelog topic: nothing to restore (its
                // messages are skipped, see `Executor::execute_owned`).
                if lock(&shared.tracker).restored(&partition, generation) {
                    shared.consumer.resume(&partition);
                }
                continue;
            }
            if !ensured.contains(&partition.0) {
                match ensure_one(&setup.kafka, &setup.changelog, setup.retention, &partition.0).await {
                    Ok(()) => {
                        ensured.insert(partition.0.clone());
                    }
                    Err(TopicError::Mismatch(reason)) => {
                        error!(%reason, "the changelog topic does not fit its source topic; stopping, nothing more is handled");
                        return shared.exec.fail(reason);
                    }
                    Err(TopicError::Other(error)) => {
                        warn!(error = %format!("{error:#}"), topic = %partition.0, "changelog topic not ready; trying again");
                        tokio::time::sleep(RETRY_PAUSE).await;
                        break;
                    }
                }
            }
            let task = (shared.clone(), restorer.clone(), setup.changelog.clone(), partition.clone());
            let runtime = tokio::runtime::Handle::current();
            let ended = tokio::task::spawn_blocking(move || {
                let (shared, restorer, changelog, partition) = &task;
                let ours = || lock(&shared.tracker).is_restoring(partition, generation) && !shared.exec.stopped();
                restore_partition(&shared.exec.store, restorer, changelog, partition, &ours, &runtime)
            })
            .await;
            match ended {
                Ok(Ok(Some(_))) => {
                    if lock(&shared.tracker).restored(&partition, generation) {
                        shared.consumer.resume(&partition);
                        restored_some = true;
                        follow.restored(partition.clone(), generation);
                    }
                }
                Ok(Ok(None)) => {}
                Ok(Err(error)) => {
                    warn!(%error, topic = %partition.0, partition = partition.1,
                        "restore failed; trying again from its checkpoint (the partition waits)");
                    // The topic may have changed (gained partitions): check it again first.
                    ensured.remove(&partition.0);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    break;
                }
                Err(panic) => return shared.exec.fail(format!("the restore of {partition:?} failed: {panic}")),
            }
        }
    }
}

/// Where a read of a changelog partition whose records run from `low` to `end`
/// starts: at the local checkpoint, or at `low` when there is none, when retention
/// removed records below it, or when it is past `end` (the topic was recreated).
pub(super) fn read_from(checkpoint: Option<i64>, low: i64, end: i64) -> i64 {
    match checkpoint {
        Some(c) if c <= end => c.max(low),
        _ => low,
    }
}

/// Reads the changelog partition of a source partition into the store, from its
/// checkpoint (or the beginning) up to the end seen now, in durable batches that
/// move the checkpoint. `keep_going` is asked before each batch: `None` when it
/// said no. Blocking: run it off the runtime's workers.
pub fn restore_partition(
    store: &Store,
    restorer: &Restorer,
    changelog: &ChangelogConfig,
    partition: &PartitionId,
    keep_going: &dyn Fn() -> bool,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<Restored>, String> {
    let (topic, p) = (&partition.0, partition.1);
    let changelog_topic = changelog.topic_for(topic);
    let (low, end) = restorer.range(&changelog_topic, p)?;
    let checkpoint = store.checkpoint(&changelog_topic, p);
    let from = read_from(checkpoint, low, end);
    if let Some(c) = checkpoint.filter(|c| *c > end) {
        warn!(
            changelog_topic,
            partition = p,
            checkpoint = c,
            end,
            "the local checkpoint is past the changelog's end (was the topic recreated?); restoring from its beginning"
        );
    }
    let started = Instant::now();
    let labels = [("topic", topic.clone()), ("partition", p.to_string())];
    info!(%topic, partition = p, changelog_topic, from, end, records = end - from, "restoring the partition from its changelog");
    let (mut read, mut applied, mut next) = (0u64, 0u64, from);
    // Where the time goes (reading from the broker, applying, the durable writes), for the log.
    let (mut batches, mut reading, mut applying, mut syncing) = (0u64, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    if from < end {
        restorer.start(&changelog_topic, p, from)?;
        let mut restoring = store.begin_restore(topic);
        loop {
            if !keep_going() {
                restorer.stop();
                info!(%topic, partition = p, read, "restore left off: the partition is no longer ours");
                return Ok(None);
            }
            let t = Instant::now();
            let batch = restorer.next(end, changelog.restore_batch, READ_WAIT)?;
            reading += t.elapsed();
            batches += 1;
            if let Some(last) = batch.records.last() {
                next = last.offset + 1;
            }
            if batch.at_end {
                next = end;
            }
            let t = Instant::now();
            applied += store.apply_restoring(topic, &batch.records, &mut restoring).map_err(|e| e.to_string())?;
            applying += t.elapsed();
            read += batch.records.len() as u64;
            metrics::counter!(names::RESTORED, &labels).increment(batch.records.len() as u64);
            metrics::gauge!(names::RESTORE_LAG, &labels).set((end - next).max(0) as f64);
            if !batch.records.is_empty() || batch.at_end {
                let t = Instant::now();
                runtime
                    .block_on(store.restored_to(&changelog_topic, p, next, batch.at_end))
                    .map_err(|e| e.to_string())?;
                syncing += t.elapsed();
            }
            if batch.at_end {
                break;
            }
        }
        restorer.stop();
    } else {
        runtime.block_on(store.restored_to(&changelog_topic, p, end, true)).map_err(|e| e.to_string())?;
    }
    let seconds = started.elapsed().as_secs_f64();
    metrics::histogram!(names::RESTORE_SECONDS).record(seconds);
    info!(%topic, partition = p, changelog_topic, read, applied, checkpoint = end, seconds, batches,
        reading_seconds = reading.as_secs_f64(), applying_seconds = applying.as_secs_f64(),
        syncing_seconds = syncing.as_secs_f64(), "partition restored");
    Ok(Some(Restored { read, applied, checkpoint: end, seconds }))
}
