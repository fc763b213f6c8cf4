//! The one changelog reader: restore, standby, follow and `store rebuild` all
//! read a changelog partition with [`Reader::read`] (range → start → next batch
//! → apply → checkpoint → stop), and differ only in what they pass in a
//! [`Pass`]: where the read starts and stops, whether each batch moves the
//! checkpoint, which offsets to skip, what to count. A checkpoint or durability
//! fix is one edit here (docs/architecture.md, "The changelog model").
//!
//! Every batch is checked first: with `store.changelog.key`, a record whose MAC
//! does not check ([`Keys::authentic`]) is skipped, counted and logged, and the
//! store's apply path only takes the ones that passed.
//!
//! Every batch goes through the store's one apply path, in two halves: a
//! read-ahead thread reads the next batch, checks it and decodes and collapses it
//! per key (`collapse` of [`Store::restore`], which reads none of the store's records) while
//! this one is applied (`apply`: in key order, one lookup per record,
//! none for a scope the store held nothing of, whose plain records wait to be
//! written as packed runs); a checkpoint is never made durable without the
//! records it covers ([`Store::restored_to`], [`Store::caught_up_to`] wait for the
//! group commit; no checkpoint moves while records wait).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use super::worker::Shared;
use crate::config::ChangelogConfig;
use crate::kafka::{KafkaError, Restorer};
use crate::metrics::names;
use crate::offsets::PartitionId;
use crate::store::changelog::mac::{Authentic, Keys, Rejection};
use crate::store::changelog::Restoring;
use crate::store::{Store, StoreError};

/// How long one read waits for changelog records before it asks whether to go on.
pub(super) const READ_WAIT: Duration = Duration::from_millis(500);
/// How long the read-ahead thread polls the brokers before it asks whether the read
/// is over: a read left off (its partition assigned here, the service stopping)
/// waits this long at most for it.
const AHEAD_WAIT: Duration = Duration::from_millis(20);
/// Rejected records of one batch logged one by one; the rest of them in one line
/// (a flood of forged records must not flood the log).
const REJECTIONS_LOGGED: usize = 10;

/// Why a read of a changelog partition failed. The caller branches on it: the
/// brokers may come back (try again from the checkpoint), a store that failed
/// does not (the service stops).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The brokers did not answer or refused: the checkpoint stays where the
    /// last durable batch left it, and a later read goes on from there.
    #[error("{0}")]
    Kafka(#[from] KafkaError),
    /// The local store failed (after a failed sync every later wait fails too).
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Where the first offset to read is: at the local checkpoint, or at `low` when
/// there is none, when retention removed records below it, or when it is past
/// `end` (the topic was recreated).
pub(super) fn read_from(checkpoint: Option<i64>, low: i64, end: i64) -> i64 {
    match checkpoint {
        Some(c) if c <= end => c.max(low),
        _ => low,
    }
}

/// How a read moves the partition's checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checkpoint {
    /// After every batch, durably with it (restore, standby). `restored`: the
    /// read makes the partition restored once it reaches its end, so that this
    /// instance's own acknowledged writes move the checkpoint on from there; a
    /// restore with nothing to read sets it too.
    EachBatch {
        /// Reaching the end makes the partition restored (a restore, not a standby pass).
        restored: bool,
    },
    /// Once, when the read reached its end (follow: the records skipped as this
    /// instance's own are already covered by its checkpoint).
    AtEnd,
}

/// What one batch did, for the caller's metrics.
#[derive(Debug, Clone, Copy)]
pub(super) struct Progress {
    /// Records read in this batch.
    pub read: u64,
    /// Of those, records that changed the local store.
    pub applied: u64,
    /// The next offset to read.
    pub next: i64,
}

/// What a read is asked to do.
pub(super) struct Pass<'a> {
    /// The source partition whose changelog partition is read.
    pub partition: &'a PartitionId,
    /// The first offset to read.
    pub from: i64,
    /// The offset it stops before (the end seen when the read began, or earlier).
    pub upto: i64,
    /// How the checkpoint moves.
    pub checkpoint: Checkpoint,
    /// Offsets not applied (this instance's own writes).
    pub skip: &'a BTreeSet<i64>,
    /// The partition's events run here meanwhile (follow): every record is looked
    /// up, and the apply path's fast path for a scope the store holds nothing of
    /// (safe only while nothing else writes that partition's records) is not taken.
    pub flowing: bool,
    /// Asked before each batch: a read it stops leaves the checkpoint where the
    /// last durable batch put it.
    pub keep_going: &'a dyn Fn() -> bool,
    /// Told after each batch.
    pub progress: &'a dyn Fn(Progress),
}

/// A batch read ahead, its MACs checked.
struct Ahead {
    /// The records to apply: their MACs checked.
    records: Authentic,
    /// Records read (skipped and rejected ones included).
    read: u64,
    /// Of those, records whose MAC did not check.
    rejected: u64,
    /// The offset of the last record read.
    last: Option<i64>,
    /// The partition's end was reached.
    at_end: bool,
}

/// What a read did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Read {
    /// Records read.
    pub read: u64,
    /// Of those, records that changed the local store.
    pub applied: u64,
    /// Of those, records not applied because their MAC did not check.
    pub rejected: u64,
    /// False when `keep_going` stopped it before its end.
    pub complete: bool,
    /// Batches read.
    pub batches: u64,
    /// Time spent waiting for the brokers.
    pub reading: Duration,
    /// Time spent applying records.
    pub applying: Duration,
    /// Time spent waiting for checkpoints to be durable.
    pub syncing: Duration,
}

/// Reads changelog partitions into the store. Blocking: run it off the runtime's
/// workers (`runtime` waits for the group commit).
pub(super) struct Reader<'a> {
    pub store: &'a Store,
    pub restorer: &'a Restorer,
    pub changelog: &'a ChangelogConfig,
    pub runtime: &'a tokio::runtime::Handle,
}

impl Reader<'_> {
    /// The changelog topic of a source partition, and its first and end offsets now.
    pub(super) fn range(&self, partition: &PartitionId) -> Result<(String, i64, i64), KafkaError> {
        let changelog_topic = self.changelog.topic_for(&partition.topic);
        let (low, end) = self.restorer.range(&changelog_topic, partition.partition)?;
        Ok((changelog_topic, low, end))
    }

    /// Reads `pass.from..pass.upto` of the partition's changelog into the store.
    pub(super) fn read(&self, pass: &Pass<'_>) -> Result<Read, RestoreError> {
        let (topic, p) = (&pass.partition.topic, pass.partition.partition);
        let changelog_topic = self.changelog.topic_for(topic);
        let store = self.store.restore();
        let mut done = Read::default();
        if pass.from >= pass.upto {
            if pass.checkpoint == (Checkpoint::EachBatch { restored: true }) {
                self.synced(&mut done, store.restored_to(&changelog_topic, p, pass.upto, true))?;
            }
            done.complete = true;
            return Ok(done);
        }
        // Before the read-ahead thread names the topic's scope in the store (whether
        // the store held anything of it decides the fast path).
        let mut restoring = if pass.flowing {
            Restoring::looking_up()
        } else {
            let records = u64::try_from(pass.upto - pass.from).unwrap_or(0);
            store.start(topic, self.changelog.restore_run_bytes, records)
        };
        let reading = self.restorer.start(&changelog_topic, p, pass.from)?;
        // While one batch is collapsed and applied, a thread reads the next one from
        // the brokers and checks its MACs; it is one batch ahead, so a read holds
        // about three batches at most. (Collapsing on that thread too left the applier
        // waiting for it: librdkafka's work per message is most of what it does.)
        let stop = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let read = std::thread::scope(|scope| {
            let (reading, stop, changelog, upto) = (&reading, &stop, self.changelog, pass.upto);
            let (skip, partition, changelog_topic) = (pass.skip, pass.partition, &changelog_topic);
            let ahead = std::thread::Builder::new().name("outboxd-restore-read".into()).spawn_scoped(scope, move || {
                let keys = Keys::new(changelog);
                while !stop.load(Ordering::Relaxed) {
                    let batch = reading.next(upto, changelog.restore_batch, changelog.restore_batch_bytes, AHEAD_WAIT);
                    if batch.as_ref().is_ok_and(|b| b.records.is_empty() && !b.at_end) {
                        continue;
                    }
                    let ahead = batch.map_err(RestoreError::from).map(|mut batch| {
                        let read = batch.records.len() as u64;
                        let last = batch.records.last().map(|r| r.offset);
                        batch.records.retain(|r| !skip.contains(&r.offset));
                        let (records, rejected) = keys.authentic(changelog_topic, p, std::mem::take(&mut batch.records));
                        rejections(partition, changelog_topic, &rejected);
                        Ahead { records, read, rejected: rejected.len() as u64, last, at_end: batch.at_end }
                    });
                    let over = ahead.as_ref().map_or(true, |a| a.at_end);
                    if tx.send(ahead).is_err() || over {
                        break;
                    }
                }
            });
            if let Err(error) = ahead {
                return Err(StoreError::Io(error).into());
            }
            let read = self.apply_batches(pass, &rx, &mut restoring, &mut done);
            stop.store(true, Ordering::Relaxed);
            // Lets a read-ahead blocked on a full channel go.
            drop(rx);
            read
        });
        drop(reading);
        read?;
        if done.complete && pass.checkpoint == Checkpoint::AtEnd {
            self.synced(&mut done, store.caught_up_to(&changelog_topic, p, pass.upto))?;
        }
        Ok(done)
    }

    /// Applies the batches `batches` brings (read ahead by another thread) until
    /// the end, moving the checkpoint as `pass` says; `done.complete` once at the end.
    fn apply_batches(
        &self,
        pass: &Pass<'_>,
        batches: &Receiver<Result<Ahead, RestoreError>>,
        restoring: &mut Restoring,
        done: &mut Read,
    ) -> Result<(), RestoreError> {
        let (topic, p) = (&pass.partition.topic, pass.partition.partition);
        let changelog_topic = self.changelog.topic_for(topic);
        let store = self.store.restore();
        let mut next = pass.from;
        loop {
            if !(pass.keep_going)() {
                return Ok(());
            }
            let t = Instant::now();
            let batch = match batches.recv_timeout(READ_WAIT) {
                Ok(batch) => batch?,
                Err(RecvTimeoutError::Timeout) => {
                    done.reading += t.elapsed();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let stopped = std::io::Error::other("the changelog read-ahead thread stopped");
                    return Err(StoreError::Io(stopped).into());
                }
            };
            done.reading += t.elapsed();
            done.batches += 1;
            if let Some(last) = batch.last {
                next = last + 1;
            }
            if batch.at_end {
                next = pass.upto;
            }
            let t = Instant::now();
            let applied = store.apply(topic, batch.records, restoring)?;
            if restoring.unwritten_full() || (batch.at_end && restoring.holds_unwritten()) {
                store.write_unwritten(restoring)?;
            }
            done.applying += t.elapsed();
            done.rejected += batch.rejected;
            done.read += batch.read;
            done.applied += applied;
            (pass.progress)(Progress { read: batch.read, applied, next });
            if let Checkpoint::EachBatch { restored } = pass.checkpoint {
                // Not past records that wait to be written as runs (a crash would lose them).
                if (batch.read > 0 || batch.at_end) && !restoring.holds_unwritten() {
                    let durable = store.restored_to(&changelog_topic, p, next, restored && batch.at_end);
                    self.synced(done, durable)?;
                }
            }
            if batch.at_end {
                done.complete = true;
                return Ok(());
            }
        }
    }

    /// Waits for a checkpoint to be durable, counting the time.
    fn synced(
        &self,
        done: &mut Read,
        durable: impl std::future::Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let t = Instant::now();
        self.runtime.block_on(durable)?;
        done.syncing += t.elapsed();
        Ok(())
    }
}

/// Records of a batch of `partition`'s changelog that were not applied: counted
/// by reason, logged with their offsets (the first [`REJECTIONS_LOGGED`] one by
/// one, the rest in one line).
fn rejections(partition: &PartitionId, changelog_topic: &str, rejected: &[Rejection]) {
    let (topic, p) = (&partition.topic, partition.partition);
    for r in rejected {
        let labels = [("topic", topic.clone()), ("partition", p.to_string()), ("reason", r.reason.label().to_owned())];
        metrics::counter!(names::CHANGELOG_REJECTED, &labels).increment(1);
    }
    for r in rejected.iter().take(REJECTIONS_LOGGED) {
        warn!(changelog_topic, partition = p, offset = r.offset, reason = %r.reason, %topic,
            "changelog record rejected, not applied: it is not signed by an accepted key (docs/security.md)");
    }
    if let (Some(first), Some(last)) = (rejected.get(REJECTIONS_LOGGED), rejected.last()) {
        warn!(changelog_topic, partition = p, more = rejected.len() - REJECTIONS_LOGGED, from = first.offset,
            to = last.offset, %topic, "more changelog records of this batch rejected, not applied");
    }
}

/// What the reads between restores (follow, standby) share; cheap to clone into
/// the blocking thread a pass runs in.
#[derive(Clone)]
pub(super) struct Readers {
    pub shared: Arc<Shared>,
    pub restorer: Arc<Restorer>,
    pub changelog: ChangelogConfig,
    /// Cancelled when the service stops.
    pub stop: CancellationToken,
}

impl Readers {
    /// A reader into the engine's store.
    pub(super) fn reader<'a>(&'a self, runtime: &'a tokio::runtime::Handle) -> Reader<'a> {
        Reader { store: &self.shared.exec.store, restorer: &self.restorer, changelog: &self.changelog, runtime }
    }

    /// Neither is the service stopping nor has the store failed.
    pub(super) fn running(&self) -> bool {
        !self.shared.exec.stopped() && !self.stop.is_cancelled()
    }

    /// A read of `partition` failed while `doing` it: a store failure stops the
    /// service; the brokers end the pass (`again` says when it is tried again),
    /// with one warning a pass, not one a partition.
    pub(super) fn failed(&self, error: RestoreError, partition: &PartitionId, doing: &str, again: &str) {
        let (topic, p) = (&partition.topic, partition.partition);
        match error {
            RestoreError::Store(error) => {
                error!(%error, %topic, partition = p, "store failed while {doing}; stopping, nothing more is handled");
                self.shared.exec.fail(error);
            }
            RestoreError::Kafka(error) => warn!(%error, %topic, partition = p, "{doing} failed; {again}"),
        }
    }
}

impl<'a> Pass<'a> {
    /// A read from `from` to the end seen now, every batch moving the checkpoint
    /// with it (a restore, when `restored`; else a standby pass).
    pub(super) fn to_end(
        partition: &'a PartitionId,
        from: i64,
        end: i64,
        restored: bool,
        keep_going: &'a dyn Fn() -> bool,
        progress: &'a dyn Fn(Progress),
    ) -> Pass<'a> {
        static NONE: BTreeSet<i64> = BTreeSet::new();
        let checkpoint = Checkpoint::EachBatch { restored };
        Pass { partition, from, upto: end, checkpoint, skip: &NONE, flowing: false, keep_going, progress }
    }
}

#[cfg(test)]
mod tests {
    use super::read_from;

    #[test]
    fn a_read_starts_at_the_checkpoint_within_the_records_kafka_still_has() {
        assert_eq!(read_from(None, 0, 10), 0, "never read here: from the beginning");
        assert_eq!(read_from(Some(4), 0, 10), 4);
        assert_eq!(read_from(Some(2), 5, 10), 5, "retention removed records below the checkpoint");
        assert_eq!(read_from(Some(10), 0, 10), 10, "at the end: nothing to read");
        assert_eq!(read_from(Some(12), 0, 10), 0, "past the end: the topic was recreated");
    }
}
