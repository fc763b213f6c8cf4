//! Per-partition offset tracking: the next offset to commit is the lowest
//! offset still being worked on, or one past the highest finished offset when
//! nothing is pending. Offsets never move past an unfinished event
//! (invariant 3), whatever order events finish in.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tracing::warn;

/// A partition's identity. Shown as `topic/partition`, as logs and `/readyz` name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
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

/// A partition, however its name is held: a [`PartitionId`], or the fields of a
/// message ([`PartitionRef`]). The tracker is looked up by either, so that an
/// event's lookups copy no topic (two `String`s per event before).
pub trait PartitionName {
    /// The partition's topic.
    fn topic(&self) -> &str;
    /// The partition's number in its topic.
    fn number(&self) -> i32;
}

impl PartitionName for PartitionId {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn number(&self) -> i32 {
        self.partition
    }
}

/// A partition named by borrowed fields (a message's topic and partition).
#[derive(Debug, Clone, Copy)]
pub struct PartitionRef<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition's number.
    pub partition: i32,
}

impl PartitionName for PartitionRef<'_> {
    fn topic(&self) -> &str {
        self.topic
    }

    fn number(&self) -> i32 {
        self.partition
    }
}

// A map keyed by `PartitionId` is looked up by any `PartitionName`: equal names hash
// alike (the topic, then the number, as `PartitionId` hashes itself below).
impl Hash for dyn PartitionName + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.topic().hash(state);
        self.number().hash(state);
    }
}

impl PartialEq for dyn PartitionName + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.number() == other.number() && self.topic() == other.topic()
    }
}

impl Eq for dyn PartitionName + '_ {}

impl Hash for PartitionId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn PartitionName).hash(state);
    }
}

impl<'a> Borrow<dyn PartitionName + 'a> for PartitionId {
    fn borrow(&self) -> &(dyn PartitionName + 'a) {
        self
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
#[derive(Debug, Clone)]
pub struct Tracker {
    inner: Arc<Mutex<OffsetTracker>>,
    /// The tracker's alarms, raised without its lock ([`Tracker::raise_alarm`]).
    alarms: Arc<AtomicU64>,
}

impl Default for Tracker {
    fn default() -> Tracker {
        Tracker::new(OffsetTracker::default())
    }
}

impl Tracker {
    /// Shares `tracker`.
    pub fn new(tracker: OffsetTracker) -> Tracker {
        let alarms = tracker.alarms.clone();
        Tracker { inner: Arc::new(Mutex::new(tracker)), alarms }
    }

    /// The tracker, locked (see the type's poison rule). Hold it for a few
    /// steps, never across an await.
    pub fn lock(&self) -> MutexGuard<'_, OffsetTracker> {
        self.inner.lock().expect("the offset tracker was poisoned by a panic: no offset may move from it")
    }

    /// The consumer's client says the group may have moved our partitions (its
    /// session timed out, or the poll interval was exceeded): every partition is
    /// fenced the next time anyone looks at the tracker, before any event
    /// starts or any offset moves. Takes no lock: it is said from inside a poll
    /// (a log line), which need not wait for the tracker.
    pub fn raise_alarm(&self) {
        self.alarms.fetch_add(1, Ordering::SeqCst);
    }
}

/// Why partitions were fenced (a metric label and a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCause {
    /// The consumer's client reported a session timeout or an exceeded poll interval.
    Client,
    /// The poll loop did not confirm ownership for longer than `kafka.fence_after`
    /// (the process was frozen or starved).
    Gap,
    /// A revoke said the assignment was lost.
    Lost,
}

impl FenceCause {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            FenceCause::Client => "client",
            FenceCause::Gap => "gap",
            FenceCause::Lost => "lost",
        }
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
    /// How far its restore has read: (records read, records to read), for the console.
    restore_progress: Option<(u64, u64)>,
    /// What the broker last said of it (librdkafka's statistics), for the console.
    broker: Option<BrokerOffsets>,
}

/// A partition's offsets as librdkafka's statistics last gave them (-1: not known yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerOffsets {
    /// The group's committed offset.
    pub committed: i64,
    /// The partition's end (high watermark).
    pub end: i64,
    /// Messages between the consumed position and the end.
    pub lag: i64,
}

/// One assigned partition as the console shows it ([`OffsetTracker::overview`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionOverview {
    /// Which partition.
    pub id: PartitionId,
    /// Waiting for its changelog restore, with (read, to read) once it has begun.
    pub restoring: Option<(u64, u64)>,
    /// Being revoked (its running events finish; nothing new begins).
    pub revoking: bool,
    /// The next offset to commit, once one finished.
    pub committable: Option<i64>,
    /// The commit gap: the oldest unfinished offset, which holds the committed offset back.
    pub oldest_unfinished: Option<i64>,
    /// Offsets consumed and not finished.
    pub unfinished: usize,
    /// Executions running.
    pub running: usize,
    /// How long since its committable offset moved (or waiting began).
    pub unmoved_for: Duration,
    /// The broker's view, when the statistics have reported it.
    pub broker: Option<BrokerOffsets>,
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
            restore_progress: None,
            broker: None,
        }
    }
}

/// Offsets of all assigned partitions.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Looked up several times per event: Fx, not SipHash (the keys are the consumer's own partitions).
    partitions: FxHashMap<PartitionId, PartitionState>,
    next_generation: u64,
    /// Every assigned partition is restored from its changelog before its events begin.
    restore: bool,
    /// Raised by [`Tracker::raise_alarm`]; `seen_alarms` is how many were handled.
    alarms: Arc<AtomicU64>,
    seen_alarms: u64,
    /// When the poll loop last confirmed that the group still has us
    /// ([`OffsetTracker::confirm`]); `None` before the first confirmation.
    confirmed: Option<Instant>,
    /// A longer gap since the last confirmation fences every partition
    /// (`kafka.fence_after`); `None`: never.
    fence_after: Option<Duration>,
    /// A gap fenced partitions: the consumer must leave and rejoin the group, so
    /// that their ownership is confirmed again (or they go to their new owner).
    rejoin: bool,
    /// Partitions fenced so far.
    fenced: u64,
    /// The group gave this member an assignment (maybe empty) at least once.
    joined: bool,
    /// Partitions whose changelog this instance tails while another owns them (the console shows them).
    standby: Vec<PartitionId>,
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

    /// Fence every partition once the poll loop has not confirmed ownership for
    /// longer than `after` ([`OffsetTracker::confirm`]).
    pub fn fence_after(&mut self, after: Duration) {
        self.fence_after = Some(after);
    }

    /// The poll loop is running and the group has not told it otherwise: what
    /// this instance owns is confirmed as of `now`. A gap since the last
    /// confirmation longer than `kafka.fence_after` fences every partition first.
    pub fn confirm(&mut self, now: Instant) {
        self.check(now);
        self.confirmed = Some(now);
    }

    /// Whether a gap fenced partitions since the last call: the consumer must rejoin.
    pub fn take_rejoin(&mut self) -> bool {
        std::mem::take(&mut self.rejoin)
    }

    /// Partitions fenced since the tracker was made.
    #[cfg(test)]
    pub fn fenced(&self) -> u64 {
        self.fenced
    }

    /// Fences the partitions: each gets a new generation and is being revoked,
    /// so no event of before starts (`start_running`, `owns`), no running one
    /// moves an offset (`finish`), and nothing new starts until they are
    /// revoked and assigned again. Returns how many were fenced.
    pub fn fence(&mut self, partitions: &[PartitionId], cause: FenceCause) -> usize {
        let mut fenced = Vec::new();
        for id in partitions {
            let Some(p) = self.partitions.get_mut(id) else { continue };
            if p.revoking && p.pending.is_empty() && p.running == 0 {
                continue;
            }
            self.next_generation += 1;
            let restoring = p.restoring;
            *p = PartitionState::new(self.next_generation, restoring);
            p.revoking = true;
            fenced.push(id.clone());
        }
        if !fenced.is_empty() {
            self.fenced += fenced.len() as u64;
            metrics::counter!(crate::metrics::names::FENCED, "cause" => cause.label()).increment(fenced.len() as u64);
            fenced.sort();
            warn!(partitions = %describe(&fenced), cause = cause.label(),
                "partitions fenced: they may belong to another member now; nothing of theirs starts or commits here until they are assigned again");
        }
        fenced.len()
    }

    /// Fences every partition assigned before an alarm raised since the last look.
    fn absorb_alarms(&mut self) {
        let alarms = self.alarms.load(Ordering::SeqCst);
        if alarms != self.seen_alarms {
            self.seen_alarms = alarms;
            self.fence(&self.partitions(), FenceCause::Client);
        }
    }

    /// Handles raised alarms and a gap since the last confirmation: both fence
    /// every partition. Called by everything that starts work or moves an offset.
    fn check(&mut self, now: Instant) {
        self.absorb_alarms();
        let gap = match (self.confirmed, self.fence_after) {
            (Some(at), Some(after)) => now.saturating_duration_since(at) > after,
            _ => false,
        };
        if gap {
            // Confirmed again only by the rejoin: a later look must not fence twice.
            self.confirmed = Some(now);
            if self.fence(&self.partitions(), FenceCause::Gap) > 0 {
                self.rejoin = true;
            }
        }
    }

    /// Starts tracking a freshly assigned partition; returns its generation.
    pub fn assign(&mut self, partition: PartitionId) -> u64 {
        // An alarm raised before this assignment is about the session before it:
        // it fences what was assigned then, never this partition.
        self.absorb_alarms();
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
    pub fn is_restoring(&self, partition: &dyn PartitionName, generation: u64) -> bool {
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
    pub fn generation(&self, partition: &dyn PartitionName) -> Option<u64> {
        self.partitions.get(partition).map(|p| p.generation)
    }

    /// A message was consumed and is now being worked on.
    pub fn consumed(&mut self, partition: &dyn PartitionName, generation: u64, offset: i64) {
        if let Some(p) = self.partitions.get_mut(partition).filter(|p| p.generation == generation) {
            if p.pending.is_empty() {
                p.moved_at = Instant::now();
            }
            p.pending.insert(offset, false);
        }
    }

    /// The event starts running: false when the partition is
    /// being revoked or was reassigned since (the next owner handles it).
    pub fn start_running(&mut self, partition: &dyn PartitionName, generation: u64) -> bool {
        self.check(Instant::now());
        match self.partitions.get_mut(partition).filter(|p| p.generation == generation && !p.revoking) {
            Some(p) => {
                p.running += 1;
                true
            }
            None => false,
        }
    }

    /// Whether work of `generation` may still start in the partition (assigned to
    /// us in that generation, not being revoked, not fenced: see [`OffsetTracker::fence`]).
    pub fn owns(&mut self, partition: &dyn PartitionName, generation: u64) -> bool {
        self.check(Instant::now());
        self.partitions.get(partition).is_some_and(|p| p.generation == generation && !p.revoking)
    }

    /// An execution that began ended without finishing its event (its partition
    /// moved before the claim): it no longer counts as running, its offset stays open.
    pub fn abandon(&mut self, partition: &dyn PartitionName, generation: u64) {
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
    pub fn finish(&mut self, partition: &dyn PartitionName, generation: u64, offset: i64) -> Option<i64> {
        let now = Instant::now();
        self.check(now);
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
            p.moved_at = now;
        }
        advanced
    }

    /// The next offset to commit for each partition that has one.
    pub fn committable(&self) -> Vec<(PartitionId, i64)> {
        self.partitions.iter().filter_map(|(k, p)| p.committable.map(|o| (k.clone(), o))).collect()
    }

    /// The partitions assigned, in name order.
    pub fn partitions(&self) -> Vec<PartitionId> {
        let mut all: Vec<PartitionId> = self.partitions.keys().cloned().collect();
        all.sort();
        all
    }

    /// Whether the partition's messages may be fetched: assigned, and not waiting
    /// for its restore (whose end resumes it).
    pub fn may_fetch(&self, partition: &PartitionId) -> bool {
        self.partitions.get(partition).is_some_and(|p| !p.restoring)
    }

    /// The partitions this instance stands by for (tails the changelog of; owned elsewhere).
    pub fn set_standby(&mut self, partitions: impl IntoIterator<Item = PartitionId>) {
        self.standby = partitions.into_iter().collect();
    }

    /// The partitions stood by for, in name order.
    pub fn standby(&self) -> Vec<PartitionId> {
        let mut all = self.standby.clone();
        all.sort();
        all
    }

    /// The group assigned this member partitions (maybe none): it is a member.
    pub fn join(&mut self) {
        self.joined = true;
    }

    /// Whether the group has assigned this member at least once (a spare member
    /// with no partition is still a member, ready to take some).
    pub fn joined(&self) -> bool {
        self.joined
    }

    /// Partitions currently assigned.
    pub fn assigned(&self) -> usize {
        self.partitions.len()
    }

    /// Events consumed and not yet finished, over all partitions.
    pub fn unfinished(&self) -> usize {
        self.partitions.values().map(|p| p.pending.values().filter(|done| !**done).count()).sum()
    }

    /// The restore of an assigned partition has read `read` of `total` records.
    pub fn restore_progress(&mut self, partition: &PartitionId, read: u64, total: u64) {
        if let Some(p) = self.partitions.get_mut(partition) {
            p.restore_progress = Some((read, total));
        }
    }

    /// librdkafka's statistics for an assigned partition.
    pub fn broker_offsets(&mut self, partition: &PartitionId, offsets: BrokerOffsets) {
        if let Some(p) = self.partitions.get_mut(partition) {
            p.broker = Some(offsets);
        }
    }

    /// Every assigned partition, in name order, as of `now`.
    pub fn overview(&self, now: Instant) -> Vec<PartitionOverview> {
        let mut all: Vec<PartitionOverview> = self
            .partitions
            .iter()
            .map(|(id, p)| PartitionOverview {
                id: id.clone(),
                restoring: p.restoring.then_some(p.restore_progress.unwrap_or((0, 0))),
                revoking: p.revoking,
                committable: p.committable,
                oldest_unfinished: p.pending.iter().find(|(_, done)| !**done).map(|(o, _)| *o),
                unfinished: p.pending.values().filter(|done| !**done).count(),
                running: p.running,
                unmoved_for: now.saturating_duration_since(p.moved_at),
                broker: p.broker,
            })
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> PartitionId {
        PartitionId::new("t", 0)
    }

    /// An event's lookups name its partition by the message's fields: they find the
    /// partition tracked under its `PartitionId`, and only that one.
    #[test]
    fn a_partition_is_found_by_its_borrowed_name() {
        let mut t = OffsetTracker::default();
        let g = t.assign(PartitionId::new("orders", 3));
        let other = t.assign(PartitionId::new("orders", 4));
        let named = PartitionRef { topic: "orders", partition: 3 };
        assert_eq!(t.generation(&named), Some(g));
        assert_eq!(t.generation(&PartitionRef { topic: "orders", partition: 4 }), Some(other));
        assert_eq!(t.generation(&PartitionRef { topic: "orders", partition: 5 }), None);
        assert_eq!(t.generation(&PartitionRef { topic: "order", partition: 3 }), None);
        t.consumed(&named, g, 10);
        assert!(t.start_running(&named, g));
        assert_eq!(t.finish(&named, g, 10), Some(11));
        assert_eq!(t.committable(), vec![(PartitionId::new("orders", 3), 11)]);
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

    /// A fenced partition starts nothing it had queued, moves no offset for what
    /// was running, and takes nothing new until it is assigned again.
    #[test]
    fn a_fenced_partition_starts_and_commits_nothing_until_assigned_again() {
        let mut t = OffsetTracker::default();
        let g = t.assign(tp());
        t.consumed(&tp(), g, 0);
        t.consumed(&tp(), g, 1);
        assert!(t.start_running(&tp(), g));
        assert_eq!(t.fence(&[tp()], FenceCause::Lost), 1);
        assert!(!t.start_running(&tp(), g), "a queued event of before the fence starts");
        assert!(!t.owns(&tp(), g));
        assert_eq!(t.finish(&tp(), g, 0), None, "a running event's outcome moved the offset");
        assert!(t.committable().is_empty());
        let now = t.generation(&tp()).unwrap();
        t.consumed(&tp(), now, 2);
        assert!(!t.start_running(&tp(), now), "a message fetched after the fence starts before a new assignment");
        t.revoke(&tp());
        let again = t.assign(tp());
        t.consumed(&tp(), again, 0);
        assert!(t.start_running(&tp(), again));
        assert_eq!(t.finish(&tp(), again, 0), Some(1));
    }

    /// librdkafka's alarm (a session timeout) is raised without the lock; whoever
    /// looks at the tracker next finds every partition fenced.
    #[test]
    fn an_alarm_fences_every_partition_before_the_next_start() {
        let tracker = Tracker::default();
        let (a, b) = (PartitionId::new("t", 0), PartitionId::new("t", 1));
        let (ga, gb) = {
            let mut t = tracker.lock();
            let ga = t.assign(a.clone());
            let gb = t.assign(b.clone());
            t.consumed(&a, ga, 0);
            t.consumed(&b, gb, 0);
            (ga, gb)
        };
        tracker.raise_alarm();
        let mut t = tracker.lock();
        assert!(!t.start_running(&a, ga) && !t.start_running(&b, gb));
        assert_eq!(t.fenced(), 2);
        assert!(!t.take_rejoin(), "librdkafka rejoins by itself after its own alarm");
    }

    /// A gap without confirmation longer than `fence_after` (the process was
    /// frozen, or the poll loop starved) fences every partition, and the
    /// consumer is asked to rejoin; a shorter one does not.
    #[test]
    fn a_gap_in_confirmations_fences_every_partition_and_asks_for_a_rejoin() {
        let mut t = OffsetTracker::default();
        t.fence_after(Duration::from_secs(3));
        let g = t.assign(tp());
        t.consumed(&tp(), g, 0);
        t.consumed(&tp(), g, 1);
        let now = Instant::now();
        t.confirm(now.checked_sub(Duration::from_secs(1)).unwrap());
        assert!(t.start_running(&tp(), g), "a gap shorter than fence_after fenced");
        assert_eq!(t.fenced(), 0);
        t.confirm(now.checked_sub(Duration::from_secs(10)).unwrap());
        assert!(!t.owns(&tp(), g), "a gap of 10 s did not fence");
        assert_eq!(t.finish(&tp(), g, 0), None);
        assert!(t.take_rejoin());
        assert!(!t.take_rejoin());
        assert_eq!(t.fenced(), 1);
    }

    /// librdkafka's session timeout comes with a rejoin of its own: an alarm
    /// raised before the next assignment must not fence the partitions that
    /// assignment brings (they would wait for a rebalance nobody asks for).
    #[test]
    fn an_alarm_raised_before_an_assignment_fences_only_what_came_before_it() {
        let tracker = Tracker::default();
        let (old, new) = (PartitionId::new("t", 0), PartitionId::new("t", 1));
        let g_old = tracker.lock().assign(old.clone());
        tracker.raise_alarm();
        let mut t = tracker.lock();
        let g_new = t.assign(new.clone());
        assert!(!t.owns(&old, g_old), "the partition of before the alarm is not fenced");
        assert!(t.owns(&new, g_new), "the assignment after the alarm is fenced by it");
        t.consumed(&new, g_new, 0);
        assert!(t.start_running(&new, g_new));
    }
}
