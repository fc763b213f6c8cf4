//! The store's methods by role: each caller takes the handle of what it does,
//! so a change to one role's methods shows who can be affected, and no caller
//! reaches what its role does not need.
//!
//! - [`Handling`]: the event path of the engine: claim, attempts, final records.
//! - [`Restore`]: changelog partitions read into the store, their checkpoints.
//! - [`Repairs`]: what a person changes (`outboxd store forget|resolve|retry|gc`).
//! - [`Reads`]: records, counts and message copies as they are.
//! - [`Holds`]: the releaser of held chains: which chains are released, their next event.
//! - [`Audit`]: what people did (`ops` records each repair, `store audit` lists them).
//!
//! What stays on [`Store`] itself is its life: open, close, durability, the
//! changelog it writes to, the admin address it advertises.

use std::collections::BTreeSet;
use std::future::Future;

use super::audit_log::AuditEntry;
use super::chain_index::{ChainId, ChainInfo, Running};
use super::changelog::mac::Authentic;
use super::changelog::Restoring;
#[cfg(test)]
use super::disk::sync::SyncStats;
use super::base::Store;
#[cfg(any(test, feature = "internals"))]
use super::claim::Claim;
use super::claim::{ClaimHow, Claimed, Turn};
use super::disk::record::{Record, State};
use super::error::StoreError;
use super::problem_index::{GroupCount, GroupKey};
use super::read::Stats;
use crate::event::{OutboxEvent, RawMessage};

impl Store {
    /// The event path: claim, attempts, final records.
    pub fn handling(&self) -> Handling<'_> {
        Handling(self)
    }

    /// Changelog partitions read into the store, and their checkpoints.
    pub fn restore(&self) -> Restore<'_> {
        Restore(self)
    }

    /// The repairs a person makes.
    pub fn repairs(&self) -> Repairs<'_> {
        Repairs(self)
    }

    /// Records, counts and message copies.
    pub fn reads(&self) -> Reads<'_> {
        Reads(self)
    }

    /// Held chains, for their releaser.
    pub fn holds(&self) -> Holds<'_> {
        Holds(self)
    }

    /// What people did to the store.
    pub fn audit(&self) -> Audit<'_> {
        Audit(self)
    }
}

/// What people did to the store ([`Store::audit`]): `ops` records every repair
/// it makes (whatever came of it), `store audit` and `/v1/audit` list them.
#[derive(Clone, Copy)]
pub struct Audit<'a>(&'a Store);

impl Audit<'_> {
    /// Records `entry`, durably, and (with a changelog) in the changelog partition
    /// of the events it names, awaited like a repair (`store/audit.rs` says how an
    /// entry naming several partitions is split). A changelog that does not take it
    /// fails the call; the entry is in the local audit even then.
    pub async fn record(&self, entry: AuditEntry) -> Result<(), StoreError> {
        self.0.record_audit(entry).await
    }

    /// Up to `limit` entries, newest first, older than the cursor `before` (the
    /// `next` of an earlier page); answers the cursor of the next page when more follow.
    pub fn list(&self, before: Option<&str>, limit: usize) -> Result<(Vec<AuditEntry>, Option<String>), StoreError> {
        self.0.audit.list(before, limit)
    }

    /// Every entry naming event `id`, newest first (a scan of the audit alone).
    pub fn for_event(&self, id: &str) -> Result<Vec<AuditEntry>, StoreError> {
        self.0.audit.for_event(id)
    }
}

/// The event path of the engine ([`Store::handling`]).
#[derive(Clone, Copy)]
pub struct Handling<'a>(&'a Store);

impl<'a> Handling<'a> {
    /// Claims `event` in `scope` durably (`on_uncertain = verify | park`), or
    /// finds it final or claimed already (step by step: the service claims with
    /// [`Handling::claim_to_run`]).
    #[cfg(any(test, feature = "internals"))]
    pub async fn claim(&self, event: &OutboxEvent, scope: &str) -> Result<Claim, StoreError> {
        self.0.claim(event, scope).await
    }

    /// Claims `event` to run it now, as `how` says: the claim, the hold behind a
    /// dead or parked event of its key, and a durable claim's wait for the group
    /// commit and the changelog, in that order and in one call.
    ///
    /// The claim is made at the call; the future is what it still waits for (nothing,
    /// for a claim in memory). The store's future itself, not one that awaits it (so
    /// for `finish`): a wrapper would hold the arguments a second time, and each
    /// event's future moves whole.
    pub fn claim_to_run<'e>(
        &self,
        event: &OutboxEvent,
        scope: &str,
        how: ClaimHow<'e>,
    ) -> impl Future<Output = Result<Turn, StoreError>> + 'e
    where
        'a: 'e,
    {
        self.0.claim_to_run(event, scope, how)
    }

    /// Claims `event` in memory (`on_uncertain = retry`): see [`Handling::claim`].
    #[cfg(test)]
    pub async fn claim_in_memory(&self, event: &OutboxEvent, scope: &str) -> Result<Claim, StoreError> {
        self.0.claim_in_memory(event, scope).await
    }

    /// Forgets an in-memory claim (the final record, if any, is written already).
    pub fn release(&self, id: &str, scope: &str) {
        self.0.release(id, scope)
    }

    /// An event waited for room to start: more events wait than may run. Group
    /// commits wait up to `store.backlog_commit_interval` meanwhile.
    pub fn backlog_seen(&self) {
        self.0.sync.backlog_seen();
    }

    /// Whether an event ever waited for room since the store opened.
    #[cfg(test)]
    pub fn backlog_ever_seen(&self) -> bool {
        self.0.sync.backlog_ever_seen()
    }

    /// Counts one more attempt of a claimed event; returns the attempt's number.
    pub async fn record_attempt(&self, claimed: &mut Claimed) -> Result<u32, StoreError> {
        self.0.record_attempt(claimed).await
    }

    /// Records the event final (`done`, with the handler's outcome): written when
    /// this is called, durable (and acknowledged by the changelog) when the future is.
    pub fn finish(&self, claimed: Claimed, state: State, text: String) -> impl Future<Output = Result<(), StoreError>> + 'a {
        self.0.finish(claimed, state, text)
    }

    /// Records the event dead or parked, with its message copy and dead-letter position.
    pub async fn finish_failed(
        &self,
        claimed: Claimed,
        state: State,
        reason: String,
        message: &RawMessage,
        dead_letter: Option<String>,
    ) -> Result<(), StoreError> {
        self.0.finish_failed(claimed, state, reason, message, dead_letter).await
    }

    /// Records a message that could not be decoded dead, under `id`, with its copy;
    /// with `hold` it holds the later events of its key.
    pub async fn record_undecodable(
        &self,
        id: &str,
        message: &RawMessage,
        reason: String,
        dead_letter: Option<String>,
        hold: bool,
    ) -> Result<(), StoreError> {
        self.0.record_undecodable(id, message, reason, dead_letter, hold).await
    }

    /// A claimed event whose route's receiver has been away longer than
    /// `circuit.hold_after` is recorded held in its key's chain on its route, with its
    /// message copy (`None`: it is final); handed back when its copy does not fit.
    pub async fn hold_for_receiver(
        &self,
        claimed: Claimed,
        message: &RawMessage,
        reason: &str,
        called: bool,
    ) -> Result<Option<Claimed>, StoreError> {
        self.0.hold_for_receiver(claimed, message, reason, called).await
    }

    /// With `hold`: an undecodable message (`id`) of a held key is recorded held
    /// (true) instead of dead.
    pub async fn hold_message(&self, id: &str, message: &RawMessage, hold: bool) -> Result<bool, StoreError> {
        self.0.hold_message(id, message, hold).await
    }
}

/// Held chains, for the engine's releaser ([`Store::holds`]).
#[derive(Clone, Copy)]
pub struct Holds<'a>(&'a Store);

impl<'a> Holds<'a> {
    /// Chains whose held events may run (none of their members is dead, parked or claimed).
    pub fn released(self) -> Vec<ChainId> {
        self.0.released_chains()
    }

    /// The next held event of a released chain, its message copy, and the guard
    /// under which its claim is allowed; `None` when the chain is not released.
    pub async fn next(self, chain: &ChainId) -> Result<Option<(Record, RawMessage, Running<'a>)>, StoreError> {
        self.0.next_held(chain).await
    }

    /// After a held event's run: its record now (`None`: it ran under another id and was removed).
    pub async fn after_run(self, r: &Record) -> Result<Option<Record>, StoreError> {
        self.0.after_held_run(r).await
    }

    /// Records of held chains last written before `before_us`.
    pub fn aging(self, before_us: i64) -> Result<Vec<Record>, StoreError> {
        self.0.aging_members(before_us)
    }

    /// Writes a chain's record again as it is (locally and to the changelog), so it
    /// outlives `store.retention`; false when it changed since it was read.
    pub async fn refresh(self, r: &Record) -> Result<bool, StoreError> {
        self.0.refresh_member(r).await
    }

    /// Keys whose new events are held now.
    pub fn held_keys(self) -> usize {
        self.0.held_keys()
    }

    /// Whether the releaser runs the held event `id` of `scope` now (see `engine::hold`).
    pub fn runs(self, scope: &str, id: &str) -> bool {
        self.0.runs_held(scope, id)
    }

    /// Waits until a chain may have been released.
    pub async fn released_notified(self) {
        self.0.chains.released_notified().await
    }
}

/// Changelog partitions read into the store ([`Store::restore`]).
#[derive(Clone, Copy)]
pub struct Restore<'a>(&'a Store);

impl Restore<'_> {
    /// The next offset to read of a changelog partition (`None`: never read here).
    pub fn checkpoint(&self, changelog_topic: &str, partition: i32) -> Option<i64> {
        self.0.checkpoint(changelog_topic, partition)
    }

    /// A followed changelog partition's checkpoint, and the offsets above it this
    /// instance wrote itself (`None` when it is not followed).
    pub fn followed_checkpoint(&self, changelog_topic: &str, partition: i32) -> Option<(i64, BTreeSet<i64>)> {
        self.0.followed_checkpoint(changelog_topic, partition)
    }

    /// Starts a read of a changelog partition of `source_topic` that brings about
    /// `records`: see [`Restoring`] (`run_bytes`: `store.changelog.restore_run_bytes`).
    pub fn start(&self, source_topic: &str, run_bytes: u64, records: u64) -> Restoring {
        let mut restoring = self.0.start_restore(source_topic, run_bytes);
        restoring.expect(records);
        restoring
    }

    /// Writes the records `restoring` holds back as packed runs, durably, before the
    /// checkpoint moves past them; returns how many. Blocks: call it off the async runtime.
    pub fn write_unwritten(&self, restoring: &mut Restoring) -> Result<u64, StoreError> {
        self.0.write_unwritten(restoring)
    }

    /// Applies a batch of changelog records (not yet durable: see
    /// [`Restore::restored_to`]); returns how many records changed the store. Only
    /// records whose MAC was checked
    /// ([`Keys::authentic`](crate::store::changelog::mac::Keys::authentic)) come in.
    pub fn apply(&self, source_topic: &str, mut records: Authentic, restoring: &mut Restoring) -> Result<u64, StoreError> {
        self.0.apply_batch(source_topic, &mut records.0, restoring)
    }

    /// Records below `next` are applied: the checkpoint moves, durably with them
    /// (`done`: the read reached the end; own writes move it on from there).
    pub async fn restored_to(
        &self,
        changelog_topic: &str,
        partition: i32,
        next: i64,
        done: bool,
    ) -> Result<(), StoreError> {
        self.0.restored_to(changelog_topic, partition, next, done).await
    }

    /// Others' records below `next` of a followed partition are applied: the
    /// checkpoint moves there, durably with them.
    pub async fn caught_up_to(&self, changelog_topic: &str, partition: i32, next: i64) -> Result<(), StoreError> {
        self.0.caught_up_to(changelog_topic, partition, next).await
    }
}

/// The repairs a person makes ([`Store::repairs`]); each goes to the changelog first.
#[derive(Clone, Copy)]
pub struct Repairs<'a>(&'a Store);

impl Repairs<'_> {
    /// Removes a record, so the event runs again when redelivered; answers the record as it was.
    pub async fn forget(&self, id: &str) -> Result<Record, StoreError> {
        self.0.forget(id).await
    }

    /// Claims a dead or parked event again for a re-run; answers its message copy.
    pub async fn reopen(&self, id: &str) -> Result<RawMessage, StoreError> {
        self.0.reopen(id).await
    }

    /// Claims a final record of `scope` again to replay `message`, its source
    /// message read again from Kafka; answers the record as it was.
    pub async fn reopen_for_replay(&self, scope: &str, id: &str, message: &RawMessage) -> Result<Record, StoreError> {
        self.0.reopen_for_replay(scope, id, message).await
    }

    /// After a replay: the record now, written back as it was (`before`) if the
    /// message did not run under it.
    pub async fn put_back(&self, scope: &str, id: &str, before: &Record) -> Result<Option<super::repair::Replayed>, StoreError> {
        self.0.put_back(scope, id, before).await
    }

    /// After a re-run of an undecodable record: settles it (see the store's docs).
    pub async fn settle_rerun(&self, id: &str) -> Result<Option<Record>, StoreError> {
        self.0.settle_rerun(id).await
    }

    /// Records a parked or dead event done by hand, with `note`.
    pub async fn resolve_done(&self, id: &str, note: String) -> Result<(), StoreError> {
        self.0.resolve_done(id, note).await
    }

    /// Drops the message copy of an event that is done after all.
    pub async fn drop_message(&self, id: &str) -> Result<(), StoreError> {
        self.0.drop_message(id).await
    }

    /// Removes the records whose retention ended before `now_us`; answers how many.
    pub async fn gc(&self, now_us: i64) -> Result<u64, StoreError> {
        self.0.gc(now_us).await
    }

    /// Returns once the current slice's records in memory are many enough to pack
    /// (store/disk/journal.rs).
    pub async fn memory_full(&self) {
        self.0.slices.full().await
    }

    /// Packs the slices due for it ([`Repairs::gc`] without the rest); answers the records packed.
    pub async fn pack(&self, now_us: i64) -> Result<u64, StoreError> {
        self.0.seal(now_us).await
    }
}

/// Records, counts and message copies ([`Store::reads`]).
#[derive(Clone, Copy)]
pub struct Reads<'a>(&'a Store);

impl Reads<'_> {
    /// The record of event `id` in dedup `scope`.
    pub fn get_in(&self, scope: &str, id: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.0.find_in(scope, id)?.map(|f| f.record))
    }

    /// The record of event `id`, in whichever scope it is.
    pub fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        self.0.get(id)
    }

    /// Every record (of one state, of one topic) in id order, handed to `f`.
    pub fn scan<E: From<StoreError>>(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        f: impl FnMut(Record) -> Result<(), E>,
    ) -> Result<(), E> {
        self.0.scan(state, topic, f)
    }

    /// Up to `limit` records after the cursor `after`, in id order, examining at
    /// most `budget` records (when given): see [`super::read::Listed`].
    pub fn list_page(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
        budget: Option<usize>,
    ) -> Result<super::read::Listed, StoreError> {
        self.0.list_page(state, topic, after, limit, budget)
    }

    /// The dead and parked records counted by state, topic and reason group (no
    /// scan); `None` while a store written before the index is still being indexed.
    pub fn problem_groups(&self) -> Option<Vec<(GroupKey, GroupCount)>> {
        self.0.problem_groups()
    }

    /// Ids of the dead or parked records of one group, from their index; `None`
    /// while a store written before the index is still being indexed.
    pub fn problem_ids(&self, state: State, topic: &str, reason: &str) -> Result<Option<Vec<String>>, StoreError> {
        self.0.problem_ids(state, topic, reason)
    }

    /// Records in the store (without a scan).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Records per state without scanning; `claimed` includes in-memory claims.
    pub fn counts(&self) -> [(State, u64); State::ALL.len()] {
        self.0.counts()
    }

    /// Counts per state, duplicates suppressed, size on disk, oldest and newest.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        self.0.stats()
    }

    /// Whether the store is the running service's (whose writers keep running).
    pub fn serves(&self) -> bool {
        self.0.service
    }

    /// The same from what the store keeps, without reading a record (see `kept_stats`).
    pub fn kept_stats(&self) -> Result<Stats, StoreError> {
        self.0.kept_stats()
    }

    /// The store's size on disk.
    pub fn bytes_on_disk(&self) -> Result<u64, StoreError> {
        self.0.bytes_on_disk()
    }

    /// The stored copy of a dead or parked event's message.
    pub fn message(&self, event_id: &str) -> Result<Option<RawMessage>, StoreError> {
        self.0.message(event_id)
    }

    /// The held chain `r` is in (with at most `shown` ids of its held events), if any.
    pub fn chain(&self, r: &Record, shown: usize) -> Option<ChainInfo> {
        self.0.chain_view(r, shown)
    }

    /// Bytes of message copies kept.
    pub fn message_bytes(&self) -> u64 {
        self.0.message_bytes()
    }

    /// Memory held by the slices' lookup filters.
    pub fn filter_bytes(&self) -> usize {
        self.0.filter_bytes()
    }

    /// Packed runs over all slices.
    pub fn packed_runs(&self) -> usize {
        self.0.packed_runs()
    }

    /// The group commit's batches so far.
    #[cfg(test)]
    pub fn sync_stats(&self) -> SyncStats {
        self.0.sync_stats()
    }
}
