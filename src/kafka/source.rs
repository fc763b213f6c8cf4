//! The consumer as the poll loop uses it: messages in, pauses, resumes, stored
//! offsets and commits out. The Kafka [`Consumer`](super::Consumer) implements it;
//! so does the engine's in-memory source, which lets the poll loop be tested in
//! process (paused time, no broker). Assignments and revokes reach the
//! [`Tracker`] inside [`Source::recv`], through [`assigned`] and [`revoked`],
//! whichever source delivers them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::info;

use crate::event::RawMessage;
use crate::offsets::{describe, FenceCause, PartitionId, PartitionName, Tracker};

/// Why the source gave no message.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// librdkafka retries by itself; the poll loop polls again.
    #[error("{0}")]
    Transient(String),
    /// The poll interval was exceeded: the group may have given our partitions away.
    #[error("{0}")]
    PollExceeded(String),
    /// The consumer can do nothing more (a static member fenced by another with its
    /// `group.instance.id`, an authentication failure): the service must stop.
    #[error("{0}")]
    Fatal(String),
}

/// Where the poll loop's messages come from, and what it asks of the consumer.
#[async_trait::async_trait]
pub trait Source: Send + Sync {
    /// The next message. Assignments and revokes are served inside this call.
    async fn recv(&self) -> Result<RawMessage, RecvError>;
    /// Stops delivering these partitions' messages (read-ahead full, a circuit open,
    /// a restore pending); what was fetched of them comes again after [`Source::resume`].
    fn pause(&self, partitions: &[PartitionId]);
    /// Delivers these partitions' messages again.
    fn resume(&self, partitions: &[PartitionId]);
    /// [`Source::resume`] after a restore: the partitions were paused since their
    /// assignment and nothing else wakes their fetcher, so it is woken too.
    fn resume_restored(&self, partitions: &[PartitionId]) {
        self.resume(partitions);
    }
    /// Leaves the group and joins it again (after a fence).
    fn rejoin(&self);
    /// `next` is the next offset to commit of `partition` (committed on an interval).
    fn store_offset(&self, partition: &dyn PartitionName, next: i64);
    /// Commits these offsets now (the end of the drain).
    fn commit_now(&self, offsets: &[(PartitionId, i64)]);
    /// Notified when partitions were assigned that must be restored first.
    fn restore_wakeup(&self) -> Arc<Notify>;
    /// Leaves the group at the end of the drain (its revoke served here, within
    /// `within`), so that closing the client has no assignment left to give back.
    async fn leave(&self, within: std::time::Duration);
}

/// Partitions were assigned: each gets a new generation in `tracker`. When they must
/// be restored first (changelog on), `pause` stops their fetching until the restore
/// resumes each, and the restore task is woken. Returns whether they restore first.
pub fn assigned(
    tracker: &Tracker,
    assigned: &[PartitionId],
    pause: impl FnOnce(&[PartitionId]),
    restore_wakeup: &Notify,
) -> bool {
    let restores = tracker.lock().restores_first() && !assigned.is_empty();
    if restores {
        // Nothing of them is fetched until their changelog is restored (the
        // restore resumes each); what was fetched already is fetched again then.
        // Paused before they are marked as waiting: the restore task may see them
        // as soon as they are, restore an empty changelog in a few milliseconds and
        // resume them, and a pause after that resume would hold them for good.
        pause(assigned);
    }
    {
        let mut tracker = tracker.lock();
        tracker.join();
        for p in assigned {
            tracker.assign(p.clone());
        }
    }
    if restores {
        info!(partitions = %describe(assigned), "partitions assigned; restoring their changelog before handling them");
        restore_wakeup.notify_one();
    }
    info!(partitions = %describe(assigned), "partitions assigned");
    restores
}

/// How often a revoke looks whether running events have finished.
const REVOKE_POLL: Duration = Duration::from_millis(10);

/// Partitions are revoked (`lost`: taken away without a revoke, another member may
/// own them already). No new event of them starts; running ones may finish, up to
/// `drain_timeout`, unless lost; then what finished is committed through `commit`
/// (never for lost ones), and the partitions are forgotten. Blocks the caller
/// while it waits: the consumer calls it inside a poll, where librdkafka keeps the
/// membership meanwhile.
pub fn revoked(
    tracker: &Tracker,
    revoked: &[PartitionId],
    lost: bool,
    drain_timeout: Duration,
    commit: impl FnOnce(&[(PartitionId, i64)]),
) {
    if lost {
        // Another member may own them already: nothing of theirs starts here
        // and no running event's outcome moves an offset from now on.
        tracker.lock().fence(revoked, FenceCause::Lost);
    }
    // No new event starts in these partitions; running ones may finish
    // (bounded by the drain timeout) so their offsets can be committed.
    let mut running = tracker.lock().start_revoke(revoked);
    if running > 0 && !lost {
        info!(partitions = %describe(revoked), running, ?drain_timeout, "revoking: waiting for running events to finish");
    }
    let deadline = Instant::now() + drain_timeout;
    while running > 0 && !lost && Instant::now() < deadline {
        std::thread::sleep(REVOKE_POLL);
        let mut tracker = tracker.lock();
        // The wait is inside the poll, and librdkafka keeps the membership
        // meanwhile: the other partitions stay confirmed.
        tracker.confirm(Instant::now());
        running = tracker.running(revoked);
    }
    let mut tracker = tracker.lock();
    let finished: Vec<_> = tracker.committable().into_iter().filter(|(p, _)| revoked.contains(p)).collect();
    if lost {
        // Another member may own them already: committing could move its offsets.
        tracing::warn!(partitions = %describe(revoked), "partitions lost; not committing for them");
    } else if !finished.is_empty() {
        commit(&finished);
    }
    for p in revoked {
        tracker.revoke(p);
    }
    info!(partitions = %describe(revoked), still_running = running, "partitions revoked");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::OffsetTracker;

    /// The restore task resumes a partition once it sees it waiting and has
    /// restored it; an assignment's pause that came after that resume would hold
    /// the partition paused for good. So the pause comes first: while it is made,
    /// the restore task cannot see the partitions yet.
    #[test]
    fn an_assignment_is_paused_before_its_partitions_wait_for_their_restore() {
        let tracker = Tracker::new(OffsetTracker::with_restore());
        let partitions = [PartitionId::new("t", 0), PartitionId::new("t", 1)];
        let mut waiting_at_pause = None;
        let pause = |_: &[PartitionId]| waiting_at_pause = Some(tracker.lock().restoring().len());
        let restores = assigned(&tracker, &partitions, pause, &Notify::new());
        assert!(restores);
        assert_eq!(waiting_at_pause, Some(0), "no partition waited for its restore when the pause was made");
        assert_eq!(tracker.lock().restoring().len(), 2, "both wait for their restore after the assignment");
    }
}
