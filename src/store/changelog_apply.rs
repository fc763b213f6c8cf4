//! Applying a batch of changelog records to the local store, for a restore:
//! decoded, collapsed per record key (within a batch, the last word on a record
//! wins, except that a final record is never turned back into a claim), looked
//! up in the local store once each (or not at all, see [`Restoring`]), and
//! written.

use std::collections::btree_map::{BTreeMap, Entry as Slot};
use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;

use super::{split_key, ChangelogRecord};
use crate::store::format;
use crate::store::keys;
use crate::store::messages::copy_key;
use crate::store::slices::Slice;
use crate::store::{now_us, Record, State, Store, StoreError};

/// The state of one partition's restore across its batches.
///
/// A restore into a scope the store held no record of when it began (a new or
/// rebuilt store) need not look each record up: the only records of that scope
/// are the ones it wrote itself, and it remembers a hash of each of their keys (8
/// bytes a record, for the length of the restore; a hash that matches only costs
/// a lookup). The fast path ends for good as soon as the store's record count
/// moves by anything but this restore's own writes (the service handled
/// something meanwhile, a retention pass ran).
pub struct Restoring {
    fresh: Option<Fresh>,
}

struct Fresh {
    scope: String,
    written: HashSet<u64>,
    hasher: RandomState,
    /// The store's record count (all slices) if nobody else wrote since.
    expected: i64,
}

impl Restoring {
    /// Looks every record up (the general case).
    pub fn looking_up() -> Restoring {
        Restoring { fresh: None }
    }

    /// Whether the fast path of a new scope is (still) on.
    #[cfg(test)]
    pub fn is_fresh(&self) -> bool {
        self.fresh.is_some()
    }
}

/// One record key's record after the batch, and the states the batch gave it in order.
struct Pending {
    record: Record,
    /// The message copy the record carried (a held chain's record).
    copy: Option<Vec<u8>>,
    scope_id: u32,
    /// Earlier records of the same key in this batch (their states, oldest first).
    earlier: Vec<State>,
}

fn total(store: &Store) -> i64 {
    store.slices.totals().iter().sum()
}

impl Store {
    /// Begins restoring a changelog partition of `source_topic`: see [`Restoring`].
    pub(in crate::store) fn start_restore(&self, source_topic: &str) -> Restoring {
        let fresh = (self.names.find(source_topic).is_none() && now_us() >= self.legacy_until).then(|| Fresh {
            scope: source_topic.to_owned(),
            written: HashSet::new(),
            hasher: RandomState::new(),
            expected: total(self),
        });
        Restoring { fresh }
    }

    /// [`Store::apply_changelog`] within a restore: the same outcome, in one pass
    /// per batch. Returns how many records were applied.
    pub(in crate::store) fn apply_restoring(
        &self,
        source_topic: &str,
        records: &[ChangelogRecord],
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        let now = now_us();
        if now < self.legacy_until {
            // Records may be kept under keys without a scope: the record-by-record path knows them.
            restoring.fresh = None;
            return self.apply_one_by_one(source_topic, records);
        }
        if restoring.fresh.as_ref().is_some_and(|f| f.expected != total(self)) {
            restoring.fresh = None;
        }
        // In key order: consecutive writes land in the same nodes of sled's tree (a
        // large store does not fit its cache; random order reads a node back per record).
        let mut pending: BTreeMap<Vec<u8>, Pending> = BTreeMap::new();
        let mut applied = 0;
        let mut last_scope: Option<(String, u32)> = None;
        for rec in records {
            if crate::store::audit::is_audit_key(&rec.key) {
                // An audit entry: its own tree, never a record (store/audit.rs).
                if let Some(value) = &rec.value {
                    applied += u64::from(self.apply_audit(&rec.key, value, now)?);
                }
                continue;
            }
            let Some(value) = &rec.value else {
                applied += self.write_pending(std::mem::take(&mut pending), restoring)?;
                if self.apply_tombstone(source_topic, &rec.key)? {
                    applied += 1;
                    // The count moved by a removal: simply look records up from now on.
                    restoring.fresh = None;
                }
                continue;
            };
            let Some((r, copy)) = self.live_entry(source_topic, rec, value, now) else { continue };
            let scope = r.scope.as_deref().unwrap_or(source_topic);
            let scope_id = match &last_scope {
                Some((name, id)) if name == scope => *id,
                _ => {
                    let id = self.names.id(scope)?;
                    last_scope = Some((scope.to_owned(), id));
                    id
                }
            };
            let Some((event_key, ..)) = split_key(&rec.key) else { continue };
            match pending.entry(keys::record_key(event_key, scope_id)) {
                Slot::Occupied(mut slot) => {
                    let p = slot.get_mut();
                    if p.record.state.is_final() && r.state == State::Claimed {
                        continue;
                    }
                    p.earlier.push(p.record.state);
                    p.record = r;
                    p.copy = copy;
                }
                Slot::Vacant(slot) => {
                    slot.insert(Pending { record: r, copy, scope_id, earlier: Vec::new() });
                }
            }
        }
        applied += self.write_pending(pending, restoring)?;
        Ok(applied)
    }

    /// Writes collapsed records: one lookup each (unless fresh), then the per-slice
    /// counts. (Not a `sled::Batch` per tree: sled 0.34 applies one under a single
    /// epoch guard, which keeps every node version the batch replaced in memory until
    /// its end: gigabytes for a restore.) Returns how many records were applied.
    fn write_pending(&self, pending: BTreeMap<Vec<u8>, Pending>, restoring: &mut Restoring) -> Result<u64, StoreError> {
        if pending.is_empty() {
            return Ok(0);
        }
        let live = self.slices.live(now_us());
        let fresh_id = restoring.fresh.as_ref().and_then(|f| self.names.find(&f.scope));
        let mut moves: Vec<(Arc<Slice>, Option<State>, Option<State>)> = Vec::with_capacity(pending.len());
        let (mut applied, mut added) = (0u64, 0i64);
        let mut to: Option<Arc<Slice>> = None;
        for (key, p) in pending {
            let Pending { mut record, copy, scope_id, earlier } = p;
            let hash = restoring.fresh.as_ref().map(|f| f.hasher.hash_one(&key));
            let known = match (&restoring.fresh, hash) {
                (Some(f), Some(h)) if Some(scope_id) == fresh_id => f.written.contains(&h),
                _ => true,
            };
            let found = if known { self.lookup(&live, &key)? } else { None };
            let local = found.as_ref().map(|(_, r)| r.state);
            // The batch's records in order, after the local one.
            let mut now = local;
            for s in earlier.into_iter().chain([record.state]) {
                if !(now.is_some_and(State::is_final) && s == State::Claimed) {
                    applied += 1;
                    now = Some(s);
                }
            }
            if local.is_some_and(State::is_final) && record.state == State::Claimed {
                continue;
            }
            if let Some((_, l)) = &found {
                record.duplicates = l.duplicates;
            }
            let slice = match to.take() {
                Some(s) if s.start <= record.updated_at_us && record.updated_at_us < s.end() => s,
                _ => self.slices.slice_for(record.updated_at_us)?,
            };
            to = Some(slice.clone());
            let value = format::encode(&record, &self.names, slice.start)?;
            match found {
                Some((old, l)) if Arc::ptr_eq(&old, &slice) => {
                    moves.push((slice.clone(), Some(l.state), Some(record.state)))
                }
                Some((old, l)) => {
                    self.messages.moved(&copy_key(old.start, &key), &copy_key(slice.start, &key))?;
                    old.remove(&key)?;
                    moves.push((old, Some(l.state), None));
                    moves.push((slice.clone(), None, Some(record.state)));
                }
                None => {
                    moves.push((slice.clone(), None, Some(record.state)));
                    added += 1;
                }
            }
            if let (Some(f), Some(h)) = (restoring.fresh.as_mut(), hash) {
                f.written.insert(h);
            }
            self.chained(&key, Some(&record), || Ok(slice.insert(&key, value)?))?;
            if let Some(copy) = copy {
                self.keep_copy(&copy_key(slice.start, &key), &copy, &record)?;
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

    /// The record stored under `key` in the first of `live` slices that has one.
    fn lookup(&self, live: &[Arc<Slice>], key: &[u8]) -> Result<Option<(Arc<Slice>, Record)>, StoreError> {
        for slice in live {
            if let Some(raw) = slice.get(key)? {
                return Ok(Some((slice.clone(), self.decode(slice, key, &raw)?)));
            }
        }
        Ok(None)
    }
}
