//! Catching up with the changelogs of owned partitions (`[store.changelog]`):
//! another instance may write to the changelog of a partition this one owns (a
//! repair made through it, or `outboxd store` on a stopped store). This
//! instance's checkpoint follows its own acknowledged writes only while they are
//! contiguous, so such a write shows as the changelog's end beyond the
//! checkpoint. Every `follow_interval`, for each owned and restored partition,
//! the records from the checkpoint up to the end seen at the previous check are
//! read and those this instance did not write are applied, while the partition
//! keeps flowing.
//!
//! Only records at least one interval old are read: by then this instance's own
//! writes among them are acknowledged and known (skipped, so an own record that a
//! later own change replaced is never applied again). A replay arriving within
//! about two intervals of a repair made elsewhere may still meet the state before it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::reader::{Checkpoint, Pass, Reader, Readers, RestoreError};
use crate::config::ChangelogConfig;
use crate::offsets::PartitionId;

/// The partitions followed, and where their changelogs ended at the last check.
pub(super) struct Follow {
    /// `store.changelog.follow_interval`.
    interval: Duration,
    /// Restored partitions with the generation they were restored in; dropped
    /// once that assignment ends.
    restored: HashMap<PartitionId, u64>,
    /// The changelog's end at the previous check: records below it are old
    /// enough for this instance's own among them to be acknowledged.
    seen: HashMap<PartitionId, i64>,
    last: Instant,
}

impl Follow {
    pub(super) fn new(changelog: &ChangelogConfig) -> Follow {
        Follow {
            interval: changelog.follow_interval,
            restored: HashMap::new(),
            seen: HashMap::new(),
            last: Instant::now(),
        }
    }

    /// How long the restore task may sleep before the next check is due.
    pub(super) fn interval(&self) -> Duration {
        self.interval
    }

    /// The partition is restored in `generation`: follow it from now on.
    pub(super) fn restored(&mut self, partition: PartitionId, generation: u64) {
        self.seen.remove(&partition);
        self.restored.insert(partition, generation);
    }

    /// When an interval has passed: applies what other instances wrote to the
    /// changelogs of the partitions still owned. Blocking reads run off the runtime's workers.
    pub(super) async fn check(&mut self, readers: &Readers) {
        if self.last.elapsed() < self.interval {
            return;
        }
        self.last = Instant::now();
        {
            let mut tracker = readers.shared.tracker.lock();
            self.restored.retain(|p, g| tracker.owns(p, *g) && !tracker.is_restoring(p, *g));
        }
        self.seen.retain(|p, _| self.restored.contains_key(p));
        if self.restored.is_empty() {
            return;
        }
        let (readers, restored, mut seen) = (readers.clone(), self.restored.clone(), std::mem::take(&mut self.seen));
        let runtime = tokio::runtime::Handle::current();
        let checked = tokio::task::spawn_blocking(move || {
            for (partition, generation) in &restored {
                let ours = || readers.shared.tracker.lock().owns(partition, *generation) && readers.running();
                if !ours() {
                    continue;
                }
                if let Err(error) = catch_up(&readers.reader(&runtime), partition, &mut seen, &ours) {
                    readers.failed(
                        error,
                        partition,
                        "catching up with the changelog",
                        "trying again at the next check",
                    );
                    seen.clear();
                    break;
                }
            }
            seen
        })
        .await;
        match checked {
            Ok(seen) => self.seen = seen,
            Err(error) => warn!(%error, "catching up with the changelogs failed; trying again at the next check"),
        }
    }
}

/// One partition: reads its changelog from the checkpoint up to the end seen at
/// the previous check, applies the records this instance did not write, and
/// moves the checkpoint there. Returns how many records were applied.
fn catch_up(
    reader: &Reader<'_>,
    partition: &PartitionId,
    seen: &mut HashMap<PartitionId, i64>,
    keep_going: &dyn Fn() -> bool,
) -> Result<u64, RestoreError> {
    let (topic, p) = (&partition.topic, partition.partition);
    let (changelog_topic, _, end) = reader.range(partition)?;
    let Some(upto) = seen.insert(partition.clone(), end) else { return Ok(0) };
    let Some((from, own)) = reader.store.restore().followed_checkpoint(&changelog_topic, p) else { return Ok(0) };
    if from >= upto {
        return Ok(0);
    }
    let pass = Pass {
        partition,
        from,
        upto,
        checkpoint: Checkpoint::AtEnd,
        skip: &own,
        flowing: true,
        keep_going,
        progress: &|_| {},
    };
    let read = reader.read(&pass)?;
    if read.complete && read.applied > 0 {
        info!(%topic, partition = p, changelog_topic, from, to = upto, read = read.read, applied = read.applied,
            "caught up with changelog records written by other instances");
    }
    Ok(read.applied)
}
