//! Applying a batch of changelog records to the local store, for a restore:
//! read (not decoded, see [`Head`]), collapsed per record key (within a batch, the last word on a record
//! wins, except that a final record is never turned back into a claim and an older
//! record never replaces a newer one), looked up in the local store once each (or
//! not at all, see [`Restoring`]), and written.
//!
//! Older: a record carries its version ([`Record::version`]), which every write of
//! it by a store moves on by one. The MAC says who wrote a record and where, not
//! when, so a record outboxd signed can be written to the topic again later (a
//! replay); a record older than the one held for its key ([`Written::is_older`]) is
//! refused: nothing of it is written (record, message copy, chain index). A read
//! from a checkpoint also meets a record's earlier writes before the write the store
//! holds (this instance's own, when its checkpoint lagged them at a crash): those
//! are refused too, but only replays are reported ([`Refusals`]).

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use super::mac::Rejected;
use super::entry::{decode_entry_with_copy, key_parts, peek_entry, peek_value, split_key, ChangelogRecord, Peeked};
use crate::metrics::names;
use crate::store::disk::format::{self, NameIds};
use crate::store::disk::keys::{self, KeyBuf};
use crate::store::disk::messages::copy_key;
use crate::store::disk::filter::Hashed;
use super::unwritten::Unwritten;
use crate::store::problem_index::is_problem_state;
use crate::store::disk::slices::Slice;
use crate::store::base::Store;
use crate::store::disk::record::{self, now_us, Record, State};
use crate::store::error::StoreError;

/// Refusals reported one by one; the rest of them in one line (records written
/// again in a flood must not flood the log), as the reader logs records whose MAC
/// does not check.
const REFUSALS_LOGGED: usize = 10;
/// Refusals a read keeps until its end (about 100 bytes each); past this, each is
/// reported with its batch, history or not.
const MAX_WAITING_REFUSALS: usize = 10_000;

/// At most this many hashes' room is made for the fast path at the start of a read.
const MAX_RESERVED_WRITTEN: u64 = 16 << 20;

/// The state of one partition's restore (or any read) across its batches.
///
/// A restore into a scope the store held no record of when it began (a new or
/// rebuilt store) need not look each record up: the only records of that scope
/// are the ones it wrote itself, and it remembers a hash of each of their keys (8
/// bytes a record, for the length of the restore; a hash that matches only costs
/// a lookup). The fast path ends for good as soon as the store's record count
/// moves by anything but this restore's own writes (the service handled
/// something meanwhile, a retention pass ran).
///
/// On the fast path, records wait to be written as packed runs (`Unwritten`,
/// store/changelog/runs.rs): the reader writes them ([`Restoring::holds_unwritten`])
/// before it moves the checkpoint.
///
/// Records refused as older wait here until the read is over (`Refusals`): when
/// it is dropped, those that were not history are counted and logged.
pub struct Restoring {
    fresh: Option<Fresh>,
    pub(super) unwritten: Unwritten,
    /// The scope the store held no record of when the read began (as for `fresh`, but
    /// for the whole read): every record of it that the store holds, this read wrote.
    new_scope: Option<String>,
    pub(super) refused: Refusals,
}

struct Fresh {
    scope: String,
    /// The `Hashed` hash of each record key written.
    written: FxHashSet<u64>,
    /// The store's record count (all slices) if nobody else wrote since.
    expected: i64,
}

impl Restoring {
    /// Looks every record up (the general case).
    pub fn looking_up() -> Restoring {
        Restoring { fresh: None, new_scope: None, unwritten: Unwritten::default(), refused: Refusals::default() }
    }

    /// Records wait to be written as runs: the checkpoint must not move past them.
    pub fn holds_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// They have reached `store.changelog.restore_run_bytes`: write them now.
    pub fn unwritten_full(&self) -> bool {
        self.unwritten.is_full()
    }

    /// The read brings about `records`: room for them is made once, not grown into.
    pub fn expect(&mut self, records: u64) {
        if let Some(f) = self.fresh.as_mut() {
            f.written.reserve(usize::try_from(records.min(MAX_RESERVED_WRITTEN)).unwrap_or(0));
            self.unwritten.expect(records);
        }
    }

    /// `n` records of this read were added to the store's counts.
    pub(super) fn wrote(&mut self, n: i64) {
        if let Some(f) = self.fresh.as_mut() {
            f.expected += n;
        }
    }

    /// Whether the fast path of a new scope is (still) on.
    #[cfg(test)]
    pub fn is_fresh(&self) -> bool {
        self.fresh.is_some()
    }

    /// Whether the store's record of `scope` was written by this read, if it has one.
    pub(super) fn wrote_every_record_of(&self, scope: Option<&str>) -> bool {
        self.new_scope.is_some() && self.new_scope.as_deref() == scope
    }
}

impl Drop for Restoring {
    /// The read is over (at its end, cut short, or failed): what is still refused
    /// was not met again by the write it was refused for.
    fn drop(&mut self) {
        self.refused.report_all();
    }
}

/// Where a write of a record stands among the writes of that record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    version: u64,
    /// When it was written (µs, the writer's clock).
    at_us: i64,
}

impl Written {
    pub(super) fn of(r: &Record) -> Written {
        Written { version: r.version, at_us: r.updated_at_us }
    }

    /// Whether this write, read from the changelog, is older than `held`, the one
    /// the store holds for the record's key (docs/architecture.md §4, "Versions"):
    /// - both carry a version: when its version is lower (an equal one is the same
    ///   write seen again, and applies as before);
    /// - only `held` does: when it was written more than `skew_us` (the clock skew
    ///   allowed between instances) before `held`. A release without versions writes
    ///   none; during a rolling upgrade it writes over records this release wrote,
    ///   always after them, and those writes must apply;
    /// - `held` carries none: never (without versions the last word wins).
    pub(super) fn is_older(self, held: Written, skew_us: i64) -> bool {
        match (self.version, held.version) {
            (_, 0) => false,
            (0, _) => self.at_us.saturating_add(skew_us) < held.at_us,
            (version, held) => version < held,
        }
    }
}

/// A changelog record refused because it is older than the record held for its key.
pub(super) struct Refused {
    /// The source topic.
    topic: String,
    /// Its partition (the record's own: outboxd writes a record to the changelog
    /// partition of its source partition, and the MAC binds it there).
    partition: i32,
    /// Its offset in the changelog partition.
    offset: i64,
    event_id: String,
    /// Its version.
    version: u64,
    /// The version of the record held for its key when it was refused.
    held: u64,
}

impl Refused {
    /// The record of `event_id` in `partition` of `topic`, read at `offset` as
    /// `written`, refused for `held`.
    pub(super) fn new(topic: &str, partition: i32, offset: i64, event_id: String, written: Written, held: Written) -> Refused {
        Refused { topic: topic.to_owned(), partition, offset, event_id, version: written.version, held: held.version }
    }

    fn reason(&self) -> Rejected {
        Rejected::Stale { version: self.version, held: self.held }
    }
}

/// Records of one read refused as older than the record held for their key, to be
/// reported (counted in `outboxd_changelog_records_rejected_total`, reason `stale`,
/// and logged) unless they were history.
///
/// The writes of a record reach its changelog partition in order, so a record older
/// than one this read applied before it was written to the topic again later (a
/// replay): reported with its batch. A record older than what the store held before
/// the read may be either: reading from a checkpoint meets earlier writes of a record
/// before the write the store holds (its own, when a crash lost the checkpoint's last
/// moves), which comes later in the same read; such a refusal is history, forgotten
/// once that write is applied again. The others are reported when the read ends.
/// Bounded: past [`MAX_WAITING_REFUSALS`], a refusal is reported with its batch.
#[derive(Default)]
pub(super) struct Refusals {
    /// By record key.
    waiting: HashMap<Vec<u8>, Vec<Refused>>,
    /// How many wait, in all.
    count: usize,
    /// Replays, and refusals past the bound: reported at the end of the batch.
    now: Vec<Refused>,
}

impl Refusals {
    /// A refusal; `replay`: the record is older than one this read applied before it.
    pub(super) fn push(&mut self, key: &[u8], refused: Refused, replay: bool) {
        if replay || self.count >= MAX_WAITING_REFUSALS {
            self.now.push(refused);
            return;
        }
        self.count += 1;
        self.waiting.entry(key.to_vec()).or_default().push(refused);
    }

    /// The record under `key` was applied at `version`, read at `offset`: writes of
    /// it before that offset, refused while the store held that version, were history.
    pub(super) fn applied(&mut self, key: &[u8], version: u64, offset: i64) {
        if self.waiting.is_empty() {
            return;
        }
        if let Some(list) = self.waiting.get_mut(key) {
            let before = list.len();
            list.retain(|r| r.held != version || r.offset > offset);
            self.count -= before - list.len();
            if list.is_empty() {
                self.waiting.remove(key);
            }
        }
    }

    /// Reports the replays and the refusals past the bound (at the end of each batch).
    pub(super) fn report_batch(&mut self) {
        report(&std::mem::take(&mut self.now));
    }

    /// Reports every refusal left (the read is over).
    fn report_all(&mut self) {
        let mut all = std::mem::take(&mut self.now);
        all.extend(self.waiting.drain().flat_map(|(_, list)| list));
        self.count = 0;
        all.sort_by_key(|r| r.offset);
        report(&all);
    }
}

/// Counts `refused` in `outboxd_changelog_records_rejected_total` and logs them
/// with their offsets (the first [`REFUSALS_LOGGED`] one by one, the rest in one line).
fn report(refused: &[Refused]) {
    for r in refused {
        let labels = [
            ("topic", r.topic.clone()),
            ("partition", r.partition.to_string()),
            ("reason", r.reason().label().to_owned()),
        ];
        metrics::counter!(names::CHANGELOG_REJECTED, &labels).increment(1);
    }
    for r in refused.iter().take(REFUSALS_LOGGED) {
        tracing::warn!(topic = %r.topic, partition = r.partition, offset = r.offset, event_id = %r.event_id,
            reason = %r.reason(), "changelog record rejected, not applied: it is older than the record held for its \
            key (docs/security.md)");
    }
    if let (Some(first), Some(last)) = (refused.get(REFUSALS_LOGGED), refused.last()) {
        tracing::warn!(topic = %first.topic, more = refused.len() - REFUSALS_LOGGED, from = first.offset,
            to = last.offset, "more changelog records rejected as older, not applied");
    }
}

/// A batch of changelog records read and collapsed (`Store::collapse`), to be
/// written by `Store::apply_collapsed`.
struct Collapsed {
    parts: Vec<Part>,
    /// Records older than a write of the same key before them in the batch.
    refused: Vec<(Vec<u8>, Refused)>,
    /// The batch as it came, for the record-by-record path (a store that may still
    /// hold records under keys without a scope).
    legacy: Option<Vec<ChangelogRecord>>,
}

/// One part of a collapsed batch, in the batch's order.
enum Part {
    /// Collapsed records up to the next tombstone, in the order they came ([`Segment`]).
    Records(Vec<(KeyBuf, Pending)>),
    /// A changelog key whose record is gone.
    Tombstone(Vec<u8>),
    /// An audit entry's key and value.
    Audit(Vec<u8>, Vec<u8>),
}

/// Where the record a batch's write follows is.
enum Held {
    Slice(Arc<Slice>),
    /// Waiting to be written as a run (this read's own).
    Unwritten,
}

/// One write of a record in a batch: enough to replay the batch's writes of a key in order.
#[derive(Debug, Clone, Copy)]
struct Step {
    state: State,
    written: Written,
    offset: i64,
}

/// What collapsing and writing need to know of a changelog record, read without
/// decoding it ([`peek_entry`]).
#[derive(Debug, Clone, Copy)]
struct Head {
    state: State,
    written: Written,
    partition: i32,
    /// No message copy, not in a chain, not dead or parked: on a restore's fast
    /// path it is written straight from its changelog value ([`Peeked::local`]).
    plain: bool,
}

impl Head {
    fn of(peeked: &Peeked<'_>) -> Head {
        let f = &peeked.fields;
        let state = f.state();
        let in_chain = record::in_chain(f.has_chain(), state);
        Head {
            state,
            written: Written { version: f.version(), at_us: f.updated_at_us() },
            partition: f.partition(),
            plain: peeked.copy.is_none() && !in_chain && !is_problem_state(state),
        }
    }
}

/// One record key's record after the batch, and the writes the batch gave it in order.
struct Pending {
    /// The changelog record's key and value as read (taken from the batch): a
    /// record is decoded only where it is not written straight from them.
    entry_key: Vec<u8>,
    value: Vec<u8>,
    head: Head,
    scope_id: u32,
    /// Where the record was read.
    offset: i64,
    /// Earlier records of the same key in this batch, oldest first.
    earlier: Vec<Step>,
}

impl Pending {
    fn step(&self) -> Step {
        Step { state: self.head.state, written: self.head.written, offset: self.offset }
    }
}

/// A batch's records collapsed per record key, until a tombstone ends them.
#[derive(Default)]
struct Segment {
    /// Record key → its place in `list`.
    at: FxHashMap<KeyBuf, usize>,
    list: Vec<(KeyBuf, Pending)>,
}

/// The places of `records` in their keys' order: consecutive writes land in the
/// same nodes of sled's tree (a large store does not fit its cache; random order
/// reads a node back per record). The places are sorted, not the records (a
/// record's entry is about 160 bytes: sorting them was 7% of a restore's CPU), and
/// keys compare by their first 8 bytes first (`keys::prefix`).
fn key_order(records: &[(KeyBuf, Pending)]) -> impl Iterator<Item = usize> {
    let mut order: Vec<(u64, usize)> = records.iter().enumerate().map(|(i, (k, _))| (keys::prefix(k), i)).collect();
    order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| records[a.1].0.cmp(&records[b.1].0)));
    order.into_iter().map(|(_, i)| i)
}

/// The event id a changelog key names (for a refusal's report).
fn event_id(entry_key: &[u8]) -> String {
    split_key(entry_key).map(|(_, id, _)| id.to_string()).unwrap_or_default()
}

fn total(store: &Store) -> i64 {
    store.slices.totals().iter().sum()
}

impl Store {
    /// Begins restoring a changelog partition of `source_topic`: see [`Restoring`];
    /// on its fast path up to `run_bytes` of records wait to be written as runs.
    pub(in crate::store) fn start_restore(&self, source_topic: &str, run_bytes: u64) -> Restoring {
        let fresh = (self.names.find(source_topic).is_none() && now_us() >= self.legacy_until).then(|| Fresh {
            scope: source_topic.to_owned(),
            written: FxHashSet::default(),
            expected: total(self),
        });
        let new_scope = fresh.as_ref().map(|f| f.scope.clone());
        Restoring { fresh, new_scope, unwritten: Unwritten::new(run_bytes), refused: Refusals::default() }
    }

    /// [`Store::apply_changelog`] within a restore: the same outcome, in one pass
    /// per batch ([`Store::collapse`], then [`Store::apply_collapsed`]). Returns how
    /// many records were applied. Takes the records' keys and values.
    pub(in crate::store) fn apply_batch(
        &self,
        source_topic: &str,
        records: &mut [ChangelogRecord],
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        let collapsed = self.collapse(source_topic, records)?;
        self.apply_collapsed(source_topic, collapsed, restoring)
    }

    /// [`Store::apply_batch`] of copies of `records` (the store's tests).
    #[cfg(test)]
    pub(in crate::store) fn apply_restoring(
        &self,
        source_topic: &str,
        records: &[ChangelogRecord],
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        self.apply_batch(source_topic, &mut records.to_vec(), restoring)
    }

    /// The first half of a batch's apply: read, collapsed per record key (walked in
    /// key order by [`Store::apply_collapsed`]), without reading the store's records.
    /// Takes the records' keys and values.
    fn collapse(
        &self,
        source_topic: &str,
        records: &mut [ChangelogRecord],
    ) -> Result<Collapsed, StoreError> {
        let now = now_us();
        if now < self.legacy_until {
            // Records may be kept under keys without a scope: the record-by-record path knows them.
            let records = records.iter_mut().map(std::mem::take).collect();
            return Ok(Collapsed { parts: Vec::new(), refused: Vec::new(), legacy: Some(records) });
        }
        let mut out = Collapsed { parts: Vec::new(), refused: Vec::new(), legacy: None };
        let mut pending = Segment::default();
        let names = format::Remembered::new(&self.names);
        for rec in records {
            let entry_key = std::mem::take(&mut rec.key);
            if crate::store::audit_log::is_audit_key(&entry_key) {
                // An audit entry: its own tree, never a record (store/audit_log.rs).
                if let Some(value) = rec.value.take() {
                    out.parts.push(Part::Audit(entry_key, value));
                }
                continue;
            }
            let Some(value) = rec.value.take() else {
                out.parts.push(Part::Records(std::mem::take(&mut pending).list));
                out.parts.push(Part::Tombstone(entry_key));
                continue;
            };
            let Some(head) = self.live_head(source_topic, &entry_key, &value, rec.offset, now) else { continue };
            let Some((event_key, scope)) = key_parts(&entry_key) else { continue };
            let scope_id = names.id(scope.as_deref().unwrap_or(source_topic))?;
            let (offset, record_key) = (rec.offset, keys::record_key(event_key, scope_id));
            match pending.at.entry(record_key) {
                Slot::Occupied(slot) => {
                    let (key, p) = &mut pending.list[*slot.get()];
                    let before = p.head.written;
                    if head.written.is_older(before, self.changelog.skew_us) {
                        let id = event_id(&entry_key);
                        let refused = Refused::new(source_topic, head.partition, offset, id, head.written, before);
                        out.refused.push((key.to_vec(), refused));
                        continue;
                    }
                    if p.head.state.is_final() && head.state == State::Claimed {
                        continue;
                    }
                    let step = p.step();
                    p.earlier.push(step);
                    (p.entry_key, p.value, p.head, p.offset) = (entry_key, value, head, offset);
                }
                Slot::Vacant(slot) => {
                    let key = slot.key().clone();
                    slot.insert(pending.list.len());
                    let earlier = Vec::new();
                    pending.list.push((key, Pending { entry_key, value, head, scope_id, offset, earlier }));
                }
            }
        }
        out.parts.push(Part::Records(pending.list));
        Ok(out)
    }

    /// The second half of a batch's apply: writes what [`Store::collapse`] made,
    /// in order. Returns how many records were applied.
    fn apply_collapsed(
        &self,
        source_topic: &str,
        collapsed: Collapsed,
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        let Collapsed { parts, refused, legacy } = collapsed;
        if let Some(records) = legacy {
            self.end_fast_path(restoring)?;
            return self.apply_one_by_one(source_topic, &records, restoring);
        }
        if restoring.fresh.as_ref().is_some_and(|f| f.expected != total(self)) {
            self.end_fast_path(restoring)?;
        }
        // Older than a write of the same batch before them: written again later (replays).
        for (key, r) in refused {
            restoring.refused.push(&key, r, true);
        }
        let mut applied = 0;
        let now = now_us();
        for part in parts {
            match part {
                Part::Audit(key, value) => applied += u64::from(self.apply_audit(&key, &value, now)?),
                Part::Records(pending) => applied += self.write_pending(source_topic, pending, restoring)?,
                Part::Tombstone(key) => {
                    if self.unwritten_gone(source_topic, &key, restoring)? {
                        applied += 1;
                    } else if self.apply_tombstone(source_topic, &key)? {
                        applied += 1;
                        // The count moved by a removal: simply look records up from now on.
                        self.end_fast_path(restoring)?;
                    }
                }
            }
        }
        restoring.refused.report_batch();
        Ok(applied)
    }

    /// Writes collapsed records: one lookup each (unless fresh), then the per-slice
    /// counts. (Not a `sled::Batch` per tree: sled 0.34 applies one under a single
    /// epoch guard, which keeps every node version the batch replaced in memory until
    /// its end: gigabytes for a restore.) Returns how many records were applied.
    fn write_pending(
        &self,
        source_topic: &str,
        mut pending: Vec<(KeyBuf, Pending)>,
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        if pending.is_empty() {
            return Ok(0);
        }
        let live = self.slices.live(now_us());
        let names = format::Remembered::new(&self.names);
        let fresh_id = restoring.fresh.as_ref().and_then(|f| self.names.find(&f.scope));
        let new_scope_id = restoring.new_scope.as_deref().and_then(|s| self.names.find(s));
        let mut moves: Vec<(Arc<Slice>, Option<State>, Option<State>)> = Vec::with_capacity(pending.len());
        let (mut applied, mut added) = (0u64, 0i64);
        let mut to: Option<Arc<Slice>> = None;
        for i in key_order(&pending) {
            let (key, p) = &mut pending[i];
            let last = p.step();
            let (entry_key, value, earlier) =
                (std::mem::take(&mut p.entry_key), std::mem::take(&mut p.value), std::mem::take(&mut p.earlier));
            let (head, scope_id) = (p.head, p.scope_id);
            let hashed = Hashed::of(key);
            let known = match &restoring.fresh {
                Some(f) if Some(scope_id) == fresh_id => f.written.contains(&hashed.hash),
                _ => true,
            };
            let found = if known { self.lookup(&live, &hashed, &restoring.unwritten)? } else { None };
            // The batch's records in order, after the local one: the last is written
            // only if it takes the place of what came before it.
            let mut now = found.as_ref().map(|(_, r)| (r.state, Written::of(r)));
            let mut read_here = new_scope_id == Some(scope_id);
            let mut taken = false;
            for s in earlier.into_iter().chain([last]) {
                taken = match now {
                    Some((_, held)) if s.written.is_older(held, self.changelog.skew_us) => {
                        let id = event_id(&entry_key);
                        let refused = Refused::new(source_topic, head.partition, s.offset, id, s.written, held);
                        restoring.refused.push(hashed.key, refused, read_here);
                        false
                    }
                    Some((state, _)) if state.is_final() && s.state == State::Claimed => false,
                    _ => {
                        applied += 1;
                        now = Some((s.state, s.written));
                        read_here = true;
                        restoring.refused.applied(hashed.key, s.written.version, s.offset);
                        true
                    }
                };
            }
            if !taken {
                continue;
            }
            let at = head.written.at_us;
            let slice = match to.take() {
                Some(s) if s.start <= at && at < s.end() => s,
                _ => self.slices.slice_for(at)?,
            };
            to = Some(slice.clone());
            if let Some((Held::Unwritten, _)) = &found {
                // Not in the store yet, nor in its counts: written below as a new record.
                restoring.unwritten.take_out(&hashed);
            }
            if let Some(f) = restoring.fresh.as_mut() {
                f.written.insert(hashed.hash);
            }
            let duplicates = found.as_ref().map(|(_, l)| l.duplicates);
            // Only the new scope's records wait: another scope's may be written by others
            // meanwhile. A plain record ([`Head::plain`]), and the dead-and-parked index is
            // built (a record not in the store, or waiting, is none of its members).
            let ours = restoring.fresh.is_some()
                && Some(scope_id) == fresh_id
                && matches!(found, None | Some((Held::Unwritten, _)));
            if ours && head.plain && self.problems.ready() {
                // Read whole by `collapse`: its key need not be checked again.
                let peeked = peek_value(&entry_key, &value)?;
                let duplicates = duplicates.unwrap_or(peeked.fields.duplicates());
                let local = peeked.local(source_topic, &names, slice.start, duplicates)?;
                restoring.unwritten.put(&slice, &hashed, &local, head.state);
                continue;
            }
            let (mut record, copy) = decode_entry_with_copy(source_topic, &entry_key, &value)?;
            if let Some(duplicates) = duplicates {
                record.duplicates = duplicates;
            }
            let value = format::encode(&record, &names, slice.start)?;
            match found {
                Some((Held::Slice(old), l)) if Arc::ptr_eq(&old, &slice) => {
                    moves.push((slice.clone(), Some(l.state), Some(record.state)))
                }
                Some((Held::Slice(old), l)) => {
                    self.messages.moved(&copy_key(old.start, key), &copy_key(slice.start, key))?;
                    old.remove(key)?;
                    moves.push((old, Some(l.state), None));
                    moves.push((slice.clone(), None, Some(record.state)));
                }
                Some((Held::Unwritten, _)) | None => {
                    moves.push((slice.clone(), None, Some(record.state)));
                    added += 1;
                }
            }
            self.chained(key, Some(&record), || Ok(slice.insert(key, value.as_slice())?))?;
            if let Some(copy) = copy {
                self.keep_copy(&copy_key(slice.start, key), &copy, &record)?;
            }
        }
        for (slice, from, to) in moves {
            slice.moved(from, to);
        }
        if let Some(f) = restoring.fresh.as_mut() {
            f.expected += added;
        }
        Ok(applied)
    }

    /// [`Store::live_entry`] without decoding the record: its [`Head`].
    fn live_head(&self, source_topic: &str, entry_key: &[u8], value: &[u8], offset: i64, now: i64) -> Option<Head> {
        let head = match peek_entry(entry_key, value) {
            Ok(peeked) => Head::of(&peeked),
            Err(error) => {
                tracing::warn!(%error, topic = source_topic, offset, "changelog record skipped");
                return None;
            }
        };
        (head.written.at_us.saturating_add(self.changelog.retention_us) > now).then_some(head)
    }

    /// The record under `key`: waiting to be written, or stored in the first of
    /// `live` slices that has one.
    fn lookup(
        &self,
        live: &[Arc<Slice>],
        key: &Hashed,
        unwritten: &Unwritten,
    ) -> Result<Option<(Held, Record)>, StoreError> {
        if let Some((slice, raw)) = unwritten.get(key) {
            return Ok(Some((Held::Unwritten, self.decode(slice, key.key, raw)?)));
        }
        for slice in live {
            if let Some(raw) = slice.find(key)? {
                return Ok(Some((Held::Slice(slice.clone()), self.decode(slice, key.key, &raw)?)));
            }
        }
        Ok(None)
    }

    /// The fast path of `restoring` ends: what waits is written now, an entry each.
    fn end_fast_path(&self, restoring: &mut Restoring) -> Result<(), StoreError> {
        self.spill_unwritten(restoring)?;
        restoring.fresh = None;
        Ok(())
    }

    /// A tombstone for a record that waits to be written: it is gone. Returns
    /// whether one waited.
    fn unwritten_gone(&self, source_topic: &str, key: &[u8], restoring: &mut Restoring) -> Result<bool, StoreError> {
        let Some((event_key, _, scope)) = split_key(key) else { return Ok(false) };
        let Some(scope_id) = self.names.find(scope.as_deref().unwrap_or(source_topic)) else { return Ok(false) };
        let key = keys::record_key(event_key, scope_id);
        Ok(restoring.unwritten.take_out(&Hashed::of(&key)))
    }
}
