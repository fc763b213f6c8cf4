//! The records a restore's fast path holds back to write as packed runs (see
//! `runs`): per slice, in arrival order, found by the hash of their key.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::store::disk::filter::Hashed;
use crate::store::disk::record::State;
use crate::store::disk::slices::Slice;

/// What one waiting record costs beyond its key and value bytes: its entry, its
/// index slot, allocator rounding.
const ENTRY_OVERHEAD: usize = 48;
/// One waiting record: its key and value in one allocation.
pub(in crate::store) struct Waiting {
    pub(in crate::store) bytes: Box<[u8]>,
    pub(in crate::store) key_len: usize,
    /// `None`: taken out (a newer write of it came).
    pub(in crate::store) state: Option<State>,
}

impl Waiting {
    pub(in crate::store) fn key(&self) -> &[u8] {
        &self.bytes[..self.key_len]
    }
}

/// Where a waiting record is: its slice's start, its place in that slice's list.
type Place = (i64, usize);

/// Records waiting to be written as runs, per slice (by start) in arrival order
/// (sorted once, when written), found by the hash of their key.
#[derive(Default)]
pub(in crate::store) struct Unwritten {
    pub(in crate::store) slices: BTreeMap<i64, (Arc<Slice>, Vec<Waiting>)>,
    /// Key hash (`Hashed`) → place.
    pub(in crate::store) index: HashMap<u64, Place>,
    /// Places of keys whose hash another waiting key has already (almost never).
    collided: Vec<(u64, Place)>,
    /// Records waiting (not taken out).
    pub(in crate::store) len: usize,
    pub(in crate::store) bytes: usize,
    /// Bytes past which they are written (`store.changelog.restore_run_bytes`).
    pub(in crate::store) limit: usize,
}

impl Unwritten {
    pub(in crate::store) fn new(limit: u64) -> Unwritten {
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
    pub(in crate::store) fn get(&self, key: &Hashed) -> Option<(&Arc<Slice>, &[u8])> {
        let (start, i) = self.place_of(key)?;
        let (slice, list) = self.slices.get(&start)?;
        Some((slice, &list[i].bytes[list[i].key_len..]))
    }

    /// Takes the waiting record under `key` out (a newer write of it came, or its
    /// tombstone); returns whether one waited.
    pub(in crate::store) fn take_out(&mut self, key: &Hashed) -> bool {
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
    pub(in crate::store) fn put(&mut self, slice: &Arc<Slice>, key: &Hashed, value: &[u8], state: State) {
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
    pub(in crate::store) fn take(&mut self) -> Vec<(Arc<Slice>, Vec<Waiting>)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

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
