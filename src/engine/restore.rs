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

use super::fatal::Fatal;
use super::follow::Follow;
use super::reader::{read_from, Pass, Progress, Reader, Readers, RestoreError};
use super::standby::Standby;
use super::worker::Shared;
use crate::config::{ChangelogConfig, KafkaConfig};
use crate::kafka::changelog::{ensure_one, TopicError};
use crate::kafka::Restorer;
use crate::metrics::names;
use crate::offsets::PartitionId;
use crate::store::Store;

/// How often the task looks for partitions to restore when nobody woke it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
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
    /// Source topics whose changelog topics were created or checked at start-up: the
    /// first assignment of one does not ask the brokers again (a third of a second
    /// of a takeover). A restore that fails on the brokers checks its topic again.
    pub checked: Vec<String>,
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
    /// How long the restore took (the benchmark reads it).
    #[cfg_attr(not(feature = "internals"), expect(dead_code, reason = "only the benchmark reads it"))]
    pub seconds: f64,
}

pub(super) async fn run(shared: Arc<Shared>, setup: RestoreSetup, stop: CancellationToken) {
    let wakeup = shared.consumer.restore_wakeup();
    let restorer = match Restorer::build(&setup.kafka, setup.changelog.restore_batch_bytes) {
        Ok(r) => Arc::new(r),
        Err(e) => return shared.exec.fail(Fatal::Restorer(Arc::new(e))),
    };
    let readers = Readers {
        shared: shared.clone(),
        restorer: restorer.clone(),
        changelog: setup.changelog.clone(),
        stop: stop.clone(),
    };
    let mut ensured: HashSet<String> = setup.checked.iter().cloned().collect();
    let mut follow = Follow::new(&setup.changelog);
    let mut standby = Standby::new(&setup.changelog);
    // Some partition was restored since the last time none was waiting.
    let mut restored_some = false;
    loop {
        let waiting = shared.tracker.lock().restoring();
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
            follow.check(&readers).await;
            standby.check(&readers).await;
            continue;
        }
        for (partition, generation) in waiting {
            if stop.is_cancelled() || shared.exec.stopped() {
                return;
            }
            if setup.changelog.is_changelog(&partition.topic) {
                // A topic_pattern matched a changelog topic: nothing to restore (its
                // messages are skipped, see `Executor::execute_owned`).
                if shared.tracker.lock().restore_done(&partition, generation) {
                    shared.consumer.resume_restored(std::slice::from_ref(&partition));
                }
                continue;
            }
            if !ensured.contains(&partition.topic) {
                match ensure_one(&setup.kafka, &setup.changelog, setup.retention, &partition.topic).await {
                    Ok(()) => {
                        ensured.insert(partition.topic.clone());
                    }
                    Err(mismatch @ TopicError::Mismatch(_)) => {
                        error!(reason = %mismatch, "the changelog topic does not fit its source topic; stopping, nothing more is handled");
                        return shared.exec.fail(Fatal::Changelog(Arc::new(mismatch)));
                    }
                    Err(TopicError::Other(error)) => {
                        warn!(error = %format!("{error:#}"), topic = %partition.topic, "changelog topic not ready; trying again");
                        tokio::time::sleep(RETRY_PAUSE).await;
                        break;
                    }
                }
            }
            let task = (shared.clone(), restorer.clone(), setup.changelog.clone(), partition.clone());
            let runtime = tokio::runtime::Handle::current();
            let ended = tokio::task::spawn_blocking(move || {
                let (shared, restorer, changelog, partition) = &task;
                let ours = || shared.tracker.lock().is_restoring(partition, generation) && !shared.exec.stopped();
                let seen = |read, total| shared.tracker.lock().restore_progress(partition, read, total);
                restore_partition(&shared.exec.store, restorer, changelog, partition, &ours, &seen, &runtime)
            })
            .await;
            match ended {
                Ok(Ok(Some(_))) => {
                    if shared.tracker.lock().restore_done(&partition, generation) {
                        shared.consumer.resume_restored(std::slice::from_ref(&partition));
                        restored_some = true;
                        follow.restored(partition.clone(), generation);
                    }
                }
                Ok(Ok(None)) => {}
                Ok(Err(RestoreError::Store(error))) => {
                    error!(%error, topic = %partition.topic, partition = partition.partition,
                        "store failed during the restore; stopping, nothing more is handled");
                    return shared.exec.fail(error);
                }
                Ok(Err(RestoreError::Kafka(error))) => {
                    warn!(%error, topic = %partition.topic, partition = partition.partition,
                        "restore failed; trying again from its checkpoint (the partition waits)");
                    // The topic may have changed (gained partitions): check it again first.
                    ensured.remove(&partition.topic);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    break;
                }
                Err(panic) => {
                    let partition = partition.to_string();
                    return shared.exec.fail(Fatal::Panicked { partition, message: panic.to_string() });
                }
            }
        }
    }
}

/// Reads the changelog partition of a source partition into the store, from its
/// checkpoint (or the beginning) up to the end seen now, in durable batches that
/// move the checkpoint. `keep_going` is asked before each batch: `None` when it
/// said no. `read_so_far` is told after each batch how many of how many offsets
/// were read. Blocking: run it off the runtime's workers.
pub fn restore_partition(
    store: &Store,
    restorer: &Restorer,
    changelog: &ChangelogConfig,
    partition: &PartitionId,
    keep_going: &dyn Fn() -> bool,
    read_so_far: &dyn Fn(u64, u64),
    runtime: &tokio::runtime::Handle,
) -> Result<Option<Restored>, RestoreError> {
    let (topic, p) = (&partition.topic, partition.partition);
    let reader = Reader { store, restorer, changelog, runtime };
    let (changelog_topic, low, end) = reader.range(partition)?;
    let checkpoint = store.restore().checkpoint(&changelog_topic, p);
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
    let total = (end - from).max(0) as u64;
    read_so_far(0, total);
    let progress = |batch: Progress| {
        read_so_far((batch.next - from).clamp(0, end - from) as u64, total);
        metrics::counter!(names::RESTORED, &labels).increment(batch.read);
        metrics::gauge!(names::RESTORE_LAG, &labels).set((end - batch.next).max(0) as f64);
    };
    let read = reader.read(&Pass::to_end(partition, from, end, true, keep_going, &progress))?;
    if !read.complete {
        info!(%topic, partition = p, read = read.read, "restore left off: the partition is no longer ours");
        return Ok(None);
    }
    let seconds = started.elapsed().as_secs_f64();
    metrics::histogram!(names::RESTORE_SECONDS).record(seconds);
    info!(%topic, partition = p, changelog_topic, read = read.read, applied = read.applied, checkpoint = end, seconds,
        batches = read.batches, reading_seconds = read.reading.as_secs_f64(),
        applying_seconds = read.applying.as_secs_f64(), syncing_seconds = read.syncing.as_secs_f64(),
        "partition restored");
    Ok(Some(Restored { read: read.read, applied: read.applied, checkpoint: end, seconds }))
}
