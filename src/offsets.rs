//! Per-partition offset tracking: the next offset to commit is the lowest
//! offset still being worked on, or one past the highest finished offset when
//! nothing is pending. Offsets never move past an unfinished event
//! (invariant 3), whatever order events finish in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A partition's identity. Shown as `topic/partition`, as logs and `/readyz` name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId {
    /// The topic.
    pub topic: String,
    /// The partition's number.
    pub partition: i32,
}

impl PartitionId {
    /// Partition `partition` of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32) -> PartitionId {
        PartitionId { topic: topic.into(), partition }
    }
}

impl std::fmt::Display for PartitionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// Partitions named for a log field: `t/0,t/1`.
pub fn describe(parts: &[PartitionId]) -> String {
    parts.iter().map(PartitionId::to_string).collect::<Vec<_>>().join(",")
}

/// The offset tracker as the consumer's rebalance callbacks, the engine and the
/// admin server share it: one lock, one rule for a poisoned lock.
///
/// The rule: a panic while the tracker was held may have left it half-changed,
/// and a tracker that may be wrong could let an offset move past an unfinished
/// event (invariant 3). So every later lock panics too: the process stops
/// rather than commit, offsets stay where they were, and the events after them
/// are delivered again.
#[derive(Debug, Clone, Default)]
pub struct Tracker(Arc<Mutex<OffsetTracker>>);

impl Tracker {
    /// Shares `tracker`.
    pub fn new(tracker: OffsetTracker) -> Tracker {
        Tracker(Arc::new(Mutex::new(tracker)))
    }

    /// The tracker, locked (see the type's poison rule). Hold it for a few
    /// steps, never across an await.
    pub fn lock(&self) -> MutexGuard<'_, OffsetTracker> {
        self.0.lock().expect("the offset tracker was poisoned by a panic: no offset may move from it")
    }
}

#[derive(Debug)]
struct PartitionState {
    /// Bumped on every (re)assignment; work from an older generation is ignored.
    generation: u64,
    /// Offsets consumed and not yet finished, and finished ones still behind
    /// an unfinished one: offset → finished?
    pending: BTreeMap<i64, bool>,
    /// Next offset to commit (one past the highest contiguous finished offset).
    committable: Option<i64>,
    /// Offsets whose execution has begun and not finished.
    running: usize,
    /// Being revoked: no new execution begins.
    revoking: bool,
    /// When the committable offset last moved, or waiting began (readiness: a
    /// partition whose events wait while this grows old is stalled).
    moved_at: Instant,
    /// Its changelog is being restored: none of its events may begin.
    restoring: bool,
}

impl PartitionState {
    fn new(generation: u64, restoring: bool) -> PartitionState {
        PartitionState {
            restoring,
            generation,
            pending: BTreeMap::new(),
            committable: None,
            running: 0,
            revoking: false,
            moved_at: Instant::now(),
        }
    }
}

/// Offsets of all assigned partitions.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    partitions: HashMap<PartitionId, PartitionState>,
    next_generation: u64,
    /// Every assigned partition is restored from its changelog before its events begin.
    restore: bool,
}

impl OffsetTracker {
    /// A tracker whose partitions are each restored (from the changelog) when
    /// assigned, before any of their events may begin.
    pub fn with_restore() -> OffsetTracker {
        OffsetTracker { restore: true, ..OffsetTracker::default() }
    }

    /// Whether assigned partitions are restored first.
    pub fn restores_first(&self) -> bool {
        self.restore
    }

    /// Starts tracking a freshly assigned partition; returns its generation.
    pub fn assign(&mut self, partition: PartitionId) -> u64 {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.partitions.insert(partition, PartitionState::new(generation, self.restore));
        generation
    }

    /// Partitions waiting for their restore, with their generation, in name order.
    pub fn restoring(&self) -> Vec<(PartitionId, u64)> {
        let mut waiting: Vec<(PartitionId, u64)> =
            self.partitions.iter().filter(|(_, p)| p.restoring).map(|(id, p)| (id.clone(), p.generation)).collect();
        waiting.sort();
        waiting
    }

    /// Whether the partition, assigned in `generation`, still waits for its restore.
    pub fn is_restoring(&self, partition: &PartitionId, generation: u64) -> bool {
        self.partitions.get(partition).is_some_and(|p| p.generation == generation && p.restoring)
    }

    /// The restore of the partition (assigned in `generation`) is complete: its
    /// events may begin. False when it was revoked or reassigned meanwhile.
    pub fn restore_done(&mut self, partition: &PartitionId, generation: u64) -> bool {
        match self.partitions.get_mut(partition).filter(|p| p.generation == generation) {
            Some(p) => {
                p.restoring = false;
                p.moved_at = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Forgets a revoked partition; late completions for it are ignored.
    pub fn revoke(&mut self, partition: &PartitionId) {
        self.partitions.remove(partition);
    }

    /// The generation of an assigned partition; `None` when it is not assigned.
    pub fn generation(&self, partition: &PartitionId) -> Option<u64> {
        self.partitions.get(partition).map(|p| p.generation)
    }

    /// A message was consumed and is now being worked on.
    pub fn consumed(&mut self, partition: &PartitionId, generation: u64, offset: i64) {
        if let Some(p) = self.partitions.get_mut(partition).filter(|p| p.generation == generation) {
            if p.pending.is_empty() {
                p.moved_at = Instant::now();
            }
            p.pending.insert(offset, false);
        }
    }

    /// The event starts running: false when the partition is
    /// being revoked or was reassigned since (the next owner handles it).
    pub fn start_running(&mut self, partition: &PartitionId, generation: u64) -> bool {
        match self.partitions.get_mut(partition).filter(|p| p.generation == generation && !p.revoking) {
            Some(p) => {
                p.running += 1;
                true
            }
            None => false,
        }
    }

    /// Whether work of `generation` may still start in the partition (assigned to
    /// us in that generation and not being revoked).
    pub fn owns(&self, partition: &PartitionId, generation: u64) -> bool {
        self.partitions.get(partition).is_some_and(|p| p.generation == generation && !p.revoking)
    }

    /// An execution that began ended without finishing its event (its partition
    /// moved before the claim): it no longer counts as running, its offset stays open.
    pub fn abandon(&mut self, partition: &PartitionId, generation: u64) {
        if let Some(p) = self.partitions.get_mut(partition).filter(|p| p.generation == generation) {
            p.running = p.running.saturating_sub(1);
        }
    }

    /// Partitions with unfinished events whose committable offset has not moved
    /// for longer than `bound` (by `now`).
    pub fn stalled(&self, now: Instant, bound: Duration) -> Vec<PartitionId> {
        let mut stalled: Vec<PartitionId> = self
            .partitions
            .iter()
            .filter(|(_, p)| p.pending.values().any(|done| !*done))
            .filter(|(_, p)| now.saturating_duration_since(p.moved_at) > bound)
            .map(|(id, _)| id.clone())
            .collect();
        stalled.sort();
        stalled
    }

    /// Stops new executions for the partitions; returns how many are still running.
    pub fn start_revoke(&mut self, partitions: &[PartitionId]) -> usize {
        let mut running = 0;
        for id in partitions {
            if let Some(p) = self.partitions.get_mut(id) {
                p.revoking = true;
                running += p.running;
            }
        }
        running
    }

    /// Executions still running in these partitions.
    pub fn running(&self, partitions: &[PartitionId]) -> usize {
        partitions.iter().filter_map(|id| self.partitions.get(id)).map(|p| p.running).sum()
    }

    /// The event at `offset` is durably finished. Returns the new next offset
    /// to commit when it moved forward.
    pub fn finish(&mut self, partition: &PartitionId, generation: u64, offset: i64) -> Option<i64> {
        let p = self.partitions.get_mut(partition).filter(|p| p.generation == generation)?;
        p.running = p.running.saturating_sub(1);
        match p.pending.get_mut(&offset) {
            Some(done) => *done = true,
            None => return None,
        }
        let mut advanced = None;
        while let Some(entry) = p.pending.first_entry() {
            if !*entry.get() {
                break;
            }
            let (finished, _) = entry.remove_entry();
            advanced = Some(finished + 1);
        }
        if let Some(next) = advanced {
            p.committable = Some(next);
            p.moved_at = Instant::now();
        }
        advanced
    }

    /// The next offset to commit for each partition that has one.
    pub fn committable(&self) -> Vec<(PartitionId, i64)> {
        self.partitions.iter().filter_map(|(k, p)| p.committable.map(|o| (k.clone(), o))).collect()
    }

    /// Partitions currently assigned.
    pub fn assigned(&self) -> usize {
        self.partitions.len()
    }

    /// Events consumed and not yet finished, over all partitions.
    pub fn unfinished(&self) -> usize {
        self.partitions.values().map(|p| p.pending.values().filter(|done| !**done).count()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> PartitionId {
        PartitionId::new("t", 0)
    }

    #[test]
    fn in_order_completion_advances_one_by_one() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        for o in 0..3 {
            t.consumed(&tp(), g, o);
        }
        assert_eq!(t.finish(&tp(), g, 0), Some(1));
        assert_eq!(t.finish(&tp(), g, 1), Some(2));
        assert_eq!(t.finish(&tp(), g, 2), Some(3));
        assert_eq!(t.committable(), vec![(tp(), 3)]);
    }

    #[test]
    fn offset_never_passes_an_unfinished_event() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        for o in 10..15 {
            t.consumed(&tp(), g, o);
        }
        assert_eq!(t.finish(&tp(), g, 11), None);
        assert_eq!(t.finish(&tp(), g, 14), None);
        assert_eq!(t.finish(&tp(), g, 12), None);
        assert!(t.committable().is_empty());
        assert_eq!(t.finish(&tp(), g, 10), Some(13), "10..=12 done, 13 still pending");
        assert_eq!(t.unfinished(), 1);
        assert_eq!(t.finish(&tp(), g, 13), Some(15));
        assert_eq!(t.unfinished(), 0);
    }

    #[test]
    fn gaps_between_offsets_do_not_block() {
        // Compacted topics and transaction markers leave holes in offsets.
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        t.consumed(&tp(), g, 3);
        t.consumed(&tp(), g, 7);
        assert_eq!(t.finish(&tp(), g, 7), None);
        assert_eq!(t.finish(&tp(), g, 3), Some(8));
    }

    #[test]
    fn completions_from_a_previous_assignment_are_ignored() {
        let mut t = OffsetTracker::default();
        let old = t.assign(tp());
        t.consumed(&tp(), old, 5);
        t.revoke(&tp());
        assert_eq!(t.finish(&tp(), old, 5), None);
        let new = t.assign(tp());
        t.consumed(&tp(), new, 5);
        assert_eq!(t.finish(&tp(), old, 5), None, "stale generation");
        assert!(t.committable().is_empty());
        assert_eq!(t.finish(&tp(), new, 5), Some(6));
    }

    #[test]
    fn revoking_partition_starts_nothing_new_and_counts_running_work() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        t.consumed(&tp(), g, 0);
        t.consumed(&tp(), g, 1);
        assert!(t.start_running(&tp(), g));
        assert_eq!(t.start_revoke(&[tp()]), 1);
        assert!(!t.start_running(&tp(), g), "no new work on a revoking partition");
        assert_eq!(t.finish(&tp(), g, 0), Some(1));
        assert_eq!(t.running(&[tp()]), 0);
        assert_eq!(t.committable(), vec![(tp(), 1)], "offset 1 never began: not committed");
    }

    #[test]
    fn a_partition_whose_waiting_events_do_not_move_is_stalled() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        let bound = Duration::from_secs(60);
        let later = Instant::now() + Duration::from_secs(61);
        assert!(t.stalled(later, bound).is_empty(), "nothing waits: idle, not stalled");
        t.consumed(&tp(), g, 0);
        t.consumed(&tp(), g, 1);
        assert!(t.stalled(Instant::now(), bound).is_empty());
        assert_eq!(t.stalled(later, bound), vec![tp()]);
        t.finish(&tp(), g, 1);
        assert_eq!(t.stalled(later, bound), vec![tp()], "a later event finishing does not move the offset");
        t.finish(&tp(), g, 0);
        assert!(t.stalled(later, bound).is_empty(), "all done");
    }

    #[test]
    fn an_abandoned_execution_stops_counting_as_running_and_keeps_its_offset_open() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        t.consumed(&tp(), g, 0);
        assert!(t.start_running(&tp(), g));
        assert!(t.owns(&tp(), g));
        t.start_revoke(&[tp()]);
        assert!(!t.owns(&tp(), g));
        t.abandon(&tp(), g);
        assert_eq!(t.running(&[tp()]), 0);
        assert!(t.committable().is_empty());
    }

    #[test]
    fn a_restoring_partition_waits_until_its_restore_of_that_assignment_completes() {
        let mut t = OffsetTracker::with_restore();
        let old = t.assign(tp());
        let g = t.assign(tp());
        assert!(t.is_restoring(&tp(), g) && !t.is_restoring(&tp(), old));
        assert_eq!(t.restoring(), vec![(tp(), g)]);
        assert!(!t.restore_done(&tp(), old), "a restore of an earlier assignment does not count");
        assert!(t.restore_done(&tp(), g));
        assert!(t.restoring().is_empty() && !t.is_restoring(&tp(), g));
        assert!(!OffsetTracker::default().restores_first());
    }

    #[test]
    fn duplicate_finish_is_harmless() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        t.consumed(&tp(), g, 0);
        assert_eq!(t.finish(&tp(), g, 0), Some(1));
        assert_eq!(t.finish(&tp(), g, 0), None);
    }
}
