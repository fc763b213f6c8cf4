//! A restore into a new scope writes packed runs, not one sled entry per record.
//!
//! While a read restores a scope the store held no record of (the fast path of
//! [`Restoring`]), the records it would write one entry each ("unwritten") wait
//! in memory, by slice and in key order, and are written as part of each slice's
//! next run ([`Slices::pack_with`]): the slice's records and these, in one pass of
//! sequential block writes (store/runs.rs). sled's per-record insert was most of
//! a restore's time (bench/findings.md, "the changelog — restore, failover").
//!
//! Only plain records wait: a record with a message copy, a held chain's member or
//! a dead or parked record is written at once, with its indexes, as before.
//!
//! Durability: the partition's checkpoint does not move while records wait. When
//! they reach `store.changelog.restore_run_bytes`, or the read its end, each slice
//! is packed with them, the run made durable, then installed and made durable
//! again (a seal's steps, store/slices.rs); only then does the reader move the
//! checkpoint. A crash before that loses nothing: the next read starts from the
//! old checkpoint. A read stopped early drops what waits, for the same reason.
//!
//! When the fast path ends (something else wrote to the store meanwhile, or a
//! tombstone came), what waits is written an entry each at once
//! ([`Store::spill_unwritten`]), as the fast path wrote it before runs.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::Restoring;
use crate::store::filter::Hashed;
use crate::store::slices::{Packing, Slice};
use crate::store::{State, Store, StoreError};

/// What one waiting record costs beyond its key and value bytes: its entry, its
/// index slot, allocator rounding.
const ENTRY_OVERHEAD: usize = 48;
/// How long a restore waits between tries for a slice that gc is sealing.
const PACKING_WAIT: Duration = Duration::from_millis(5);

/// One waiting record: its key and value in one allocation.
struct Waiting {
    bytes: Box<[u8]>,
    key_len: usize,
    /// `None`: taken out (a newer write of it came).
    state: Option<State>,
}

impl Waiting {
    fn key(&self) -> &[u8] {
        &self.bytes[..self.key_len]
    }
}

/// Where a waiting record is: its slice's start, its place in that slice's list.
type Place = (i64, usize);

/// Records waiting to be written as runs, per slice (by start) in arrival order
/// (sorted once, when written), found by the hash of their key.
#[derive(Default)]
pub(in crate::store) struct Unwritten {
    slices: BTreeMap<i64, (Arc<Slice>, Vec<Waiting>)>,
    /// Key hash (`Hashed`) → place.
    index: HashMap<u64, Place>,
    /// Places of keys whose hash another waiting key has already (almost never).
    collided: Vec<(u64, Place)>,
    /// Records waiting (not taken out).
    len: usize,
    bytes: usize,
    /// Bytes past which they are written (`store.changelog.restore_run_bytes`).
    limit: usize,
}

impl Unwritten {
    pub(super) fn new(limit: u64) -> Unwritten {
        Unwritten { limit: usize::try_from(limit).unwrap_or(usize::MAX), ..Unwritten::default() }
    }

    pub(in crate::store) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// They have reached their bytes: write them before the next batch.
    pub(in crate::store) fn is_full(&self) -> bool {
        self.bytes >= self.limit
    }

    fn place_of(&self, key: &Hashed) -> Option<Place> {
        let is_it = |&(start, i): &Place| {
            self.slices.get(&start).and_then(|(_, list)| list.get(i)).is_some_and(|w| w.state.is_some() && w.key() == key.key)
        };
        if let Some(place) = self.index.get(&key.hash).filter(|p| is_it(p)) {
            return Some(*place);
        }
        self.collided.iter().filter(|(h, _)| *h == key.hash).map(|(_, p)| *p).find(is_it)
    }

    /// The waiting record under `key`, and its slice.
    pub(super) fn get(&self, key: &Hashed) -> Option<(&Arc<Slice>, &[u8])> {
        let (start, i) = self.place_of(key)?;
        let (slice, list) = self.slices.get(&start)?;
        Some((slice, &list[i].bytes[list[i].key_len..]))
    }

    /// Takes the waiting record under `key` out (a newer write of it came, or its
    /// tombstone); returns whether one waited.
    pub(super) fn take_out(&mut self, key: &Hashed) -> bool {
        let Some((start, i)) = self.place_of(key) else { return false };
        if let Some(w) = self.slices.get_mut(&start).and_then(|(_, list)| list.get_mut(i)) {
            w.state = None;
            self.len -= 1;
            self.bytes -= w.bytes.len() + ENTRY_OVERHEAD;
        }
        if self.index.get(&key.hash) == Some(&(start, i)) {
            self.index.remove(&key.hash);
        }
        self.collided.retain(|&(_, p)| p != (start, i));
        true
    }

    /// A record to write into `slice` (the caller took any older one out first).
    pub(super) fn put(&mut self, slice: &Arc<Slice>, key: &Hashed, value: &[u8], state: State) {
        let bytes: Box<[u8]> = [key.key, value].concat().into_boxed_slice();
        self.bytes += bytes.len() + ENTRY_OVERHEAD;
        self.len += 1;
        let (_, list) = self.slices.entry(slice.start).or_insert_with(|| (slice.clone(), Vec::new()));
        let place = (slice.start, list.len());
        list.push(Waiting { bytes, key_len: key.key.len(), state: Some(state) });
        match self.index.entry(key.hash) {
            Entry::Vacant(slot) => {
                slot.insert(place);
            }
            Entry::Occupied(mut slot) => {
                // A key taken out leaves its slot to the next key of the same hash.
                let (s, i) = *slot.get();
                let live = self.slices.get(&s).and_then(|(_, l)| l.get(i)).is_some_and(|w| w.state.is_some());
                if live {
                    self.collided.push((key.hash, place));
                } else {
                    slot.insert(place);
                }
            }
        }
    }

    /// Every slice's waiting records, sorted by key, and nothing waits any more.
    fn take(&mut self) -> Vec<(Arc<Slice>, Vec<Waiting>)> {
        self.index = HashMap::new();
        self.collided = Vec::new();
        (self.len, self.bytes) = (0, 0);
        let mut out: Vec<_> = std::mem::take(&mut self.slices).into_values().collect();
        for (_, list) in &mut out {
            list.retain(|w| w.state.is_some());
            list.sort_unstable_by(|a, b| a.key().cmp(b.key()));
        }
        out.retain(|(_, list)| !list.is_empty());
        out
    }
}

impl Store {
    /// Writes the records `restoring` holds back into their slices' runs, each
    /// run durable before the store names it and durable again after. Blocks
    /// (call it off the async runtime). The caller then moves the checkpoint.
    /// Returns the records written.
    pub(in crate::store) fn write_unwritten(&self, restoring: &mut Restoring) -> Result<u64, StoreError> {
        let mut written = 0;
        for (slice, records) in restoring.unwritten.take() {
            let packing = wait_for_packing(&slice);
            let states: Vec<State> = records.iter().filter_map(|w| w.state).collect();
            let entries = records.iter().map(|w| w.bytes.split_at(w.key_len));
            let (run, writes) = self.slices.pack_with(&slice, entries, &packing)?;
            drop(records);
            self.durable_blocking()?;
            self.slices.install(&slice, run, writes)?;
            for state in &states {
                slice.moved(None, Some(*state));
            }
            self.durable_blocking()?;
            self.slices.settle(&slice)?;
            drop(packing);
            written += states.len() as u64;
            restoring.wrote(states.len() as i64);
        }
        Ok(written)
    }

    /// Writes the records `restoring` holds back an entry each, now (its fast
    /// path ends). Returns the records written.
    pub(super) fn spill_unwritten(&self, restoring: &mut Restoring) -> Result<u64, StoreError> {
        let mut written = 0;
        for (slice, records) in restoring.unwritten.take() {
            for w in records {
                slice.insert(w.key(), &w.bytes[w.key_len..])?;
                slice.moved(None, w.state);
                written += 1;
            }
        }
        restoring.wrote(written as i64);
        Ok(written)
    }
}

/// The right to pack `slice`, once gc's seal of it (if one runs) is over.
fn wait_for_packing(slice: &Arc<Slice>) -> Packing {
    loop {
        if let Some(packing) = slice.try_packing() {
            return packing;
        }
        std::thread::sleep(PACKING_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys whose hashes collide are each found, taken out and written on their own.
    #[test]
    fn waiting_records_are_found_by_key_even_when_their_hashes_collide() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &crate::store::StoreOptions::for_tests(None)).unwrap();
        let slice = store.slices.current(crate::store::now_us()).unwrap();
        let key = |k: &'static [u8]| Hashed { key: k, hash: 7 };
        let mut w = Unwritten::new(1 << 20);
        w.put(&slice, &key(b"b"), b"1", State::Done);
        w.put(&slice, &key(b"a"), b"2", State::Dead);
        assert_eq!(w.get(&key(b"a")).map(|(_, v)| v), Some(&b"2"[..]));
        assert_eq!(w.get(&key(b"b")).map(|(_, v)| v), Some(&b"1"[..]));
        assert!(w.get(&key(b"c")).is_none());
        assert!(w.take_out(&key(b"b")));
        assert!(!w.take_out(&key(b"b")), "taken out once");
        assert!(w.get(&key(b"b")).is_none());
        assert_eq!(w.get(&key(b"a")).map(|(_, v)| v), Some(&b"2"[..]), "the other key of the hash stays");
        w.put(&slice, &key(b"c"), b"3", State::Done);
        w.put(&slice, &key(b"b"), b"4", State::Done);
        assert_eq!(w.get(&key(b"b")).map(|(_, v)| v), Some(&b"4"[..]));
        let taken = w.take();
        assert!(w.is_empty() && w.get(&key(b"a")).is_none());
        let (_, list) = &taken[0];
        let got: Vec<(&[u8], Option<State>)> = list.iter().map(|x| (x.key(), x.state)).collect();
        let want: Vec<(&[u8], Option<State>)> =
            vec![(b"a", Some(State::Dead)), (b"b", Some(State::Done)), (b"c", Some(State::Done))];
        assert_eq!(got, want, "in key order, without the one taken out");
    }
}
