//! The records a restore's fast path holds back to write as packed runs (see
//! `runs`): per slice, in arrival order, found by the hash of their key.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::store::disk::filter::Hashed;
use crate::store::disk::keys;
use crate::store::disk::record::State;
use crate::store::disk::slices::Slice;

/// What one waiting record costs beyond its key and value bytes: its entry, its
/// index slot, the arena chunk's unused tail.
const ENTRY_OVERHEAD: usize = 48;
/// The waiting records' key and value bytes live in chunks of this size, not an
/// allocation each: a restore of 1M records made and freed 1M of them, and each
/// chunk's memory is touched once, not grown into.
const CHUNK: usize = 1 << 20;
/// The fewest bytes a waiting record counts for (its key, at least 17 bytes, and
/// `ENTRY_OVERHEAD`), rounded up: `limit` holds at most `limit / SMALLEST_RECORD` records.
const SMALLEST_RECORD: usize = 64;
/// At most this many records' index room is made at the start of a read.
const MAX_RESERVED: u64 = 4 << 20;

/// One waiting record: where its key and value are in the arena.
pub(in crate::store) struct Waiting {
    /// The key's first 8 bytes (big-endian, zero-padded): sorting compares these
    /// first and reads keys from the arena only on a tie. Comparing keys in the
    /// arena read two random places per comparison, 4.5% of a restore's CPU.
    prefix: u64,
    chunk: u32,
    at: u32,
    key_len: u32,
    len: u32,
    /// `None`: taken out (a newer write of it came).
    pub(in crate::store) state: Option<State>,
}

/// The waiting records' key and value bytes, in chunks that never move.
#[derive(Default)]
pub(in crate::store) struct Arena {
    chunks: Vec<Vec<u8>>,
}

impl Arena {
    fn push(&mut self, key: &[u8], value: &[u8]) -> Waiting {
        let len = key.len() + value.len();
        let fits = self.chunks.last().is_some_and(|c| c.capacity() - c.len() >= len);
        if !fits {
            self.chunks.push(Vec::with_capacity(len.max(CHUNK)));
        }
        let chunk = self.chunks.len() - 1;
        let c = &mut self.chunks[chunk];
        let at = c.len();
        c.extend_from_slice(key);
        c.extend_from_slice(value);
        let n = |x: usize| u32::try_from(x).expect("a chunk is far below 4 GiB");
        Waiting { prefix: keys::prefix(key), chunk: n(chunk), at: n(at), key_len: n(key.len()), len: n(len), state: None }
    }

    fn bytes(&self, w: &Waiting) -> &[u8] {
        &self.chunks[w.chunk as usize][w.at as usize..(w.at + w.len) as usize]
    }

    /// A waiting record's key.
    pub(in crate::store) fn key(&self, w: &Waiting) -> &[u8] {
        &self.bytes(w)[..w.key_len as usize]
    }

    /// A waiting record's value.
    pub(in crate::store) fn value(&self, w: &Waiting) -> &[u8] {
        &self.bytes(w)[w.key_len as usize..]
    }
}

/// Where a waiting record is: its slice's start, its place in that slice's list.
type Place = (i64, usize);

/// Records waiting to be written as runs, per slice (by start) in arrival order
/// (sorted once, when written), found by the hash of their key.
#[derive(Default)]
pub(in crate::store) struct Unwritten {
    pub(in crate::store) slices: BTreeMap<i64, (Arc<Slice>, Vec<Waiting>)>,
    arena: Arena,
    /// Key hash (`Hashed`) → place.
    index: FxHashMap<u64, Place>,
    /// Places of keys whose hash another waiting key has already (almost never).
    collided: Vec<(u64, Place)>,
    /// Records waiting (not taken out).
    pub(in crate::store) len: usize,
    pub(in crate::store) bytes: usize,
    /// Bytes past which they are written (`store.changelog.restore_run_bytes`).
    pub(in crate::store) limit: usize,
    /// Index room made each time it starts empty (the read's records, up to what
    /// `limit` holds): growing it by doubling moved it ~20 times and touched twice
    /// its memory.
    reserve: usize,
}

/// What [`Unwritten::take`] hands over: every slice's waiting records, sorted by
/// key, and the bytes they point into.
pub(in crate::store) struct Taken {
    pub(in crate::store) slices: Vec<(Arc<Slice>, Vec<Waiting>)>,
    pub(in crate::store) arena: Arena,
}

impl Unwritten {
    pub(in crate::store) fn new(limit: u64) -> Unwritten {
        Unwritten { limit: usize::try_from(limit).unwrap_or(usize::MAX), ..Unwritten::default() }
    }

    /// The read brings about `records`: make room for them (up to what the limit holds).
    pub(in crate::store) fn expect(&mut self, records: u64) {
        let fit = (self.limit / SMALLEST_RECORD) as u64;
        self.reserve = records.min(fit).min(MAX_RESERVED) as usize;
        self.index.reserve(self.reserve);
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
            self.slices
                .get(&start)
                .and_then(|(_, list)| list.get(i))
                .is_some_and(|w| w.state.is_some() && self.arena.key(w) == key.key)
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
        Some((slice, self.arena.value(&list[i])))
    }

    /// Takes the waiting record under `key` out (a newer write of it came, or its
    /// tombstone); returns whether one waited.
    pub(in crate::store) fn take_out(&mut self, key: &Hashed) -> bool {
        let Some((start, i)) = self.place_of(key) else { return false };
        if let Some(w) = self.slices.get_mut(&start).and_then(|(_, list)| list.get_mut(i)) {
            w.state = None;
            self.len -= 1;
            self.bytes -= w.len as usize + ENTRY_OVERHEAD;
        }
        if self.index.get(&key.hash) == Some(&(start, i)) {
            self.index.remove(&key.hash);
        }
        self.collided.retain(|&(_, p)| p != (start, i));
        true
    }

    /// A record to write into `slice` (the caller took any older one out first).
    pub(in crate::store) fn put(&mut self, slice: &Arc<Slice>, key: &Hashed, value: &[u8], state: State) {
        let mut w = self.arena.push(key.key, value);
        w.state = Some(state);
        self.bytes += w.len as usize + ENTRY_OVERHEAD;
        self.len += 1;
        let reserve = if self.slices.is_empty() { self.reserve } else { 0 };
        let (_, list) = self.slices.entry(slice.start).or_insert_with(|| (slice.clone(), Vec::with_capacity(reserve)));
        let place = (slice.start, list.len());
        list.push(w);
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

    /// Every slice's waiting records, sorted by key, and nothing waits any more
    /// (the index keeps its room for the next ones).
    pub(in crate::store) fn take(&mut self) -> Taken {
        self.index.clear();
        self.collided = Vec::new();
        (self.len, self.bytes) = (0, 0);
        let arena = std::mem::take(&mut self.arena);
        let mut slices: Vec<_> = std::mem::take(&mut self.slices).into_values().collect();
        for (_, list) in &mut slices {
            list.retain(|w| w.state.is_some());
            list.sort_unstable_by(|a, b| a.prefix.cmp(&b.prefix).then_with(|| arena.key(a).cmp(arena.key(b))));
        }
        slices.retain(|(_, list)| !list.is_empty());
        Taken { slices, arena }
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
        let (_, list) = &taken.slices[0];
        let got: Vec<(&[u8], Option<State>)> = list.iter().map(|x| (taken.arena.key(x), x.state)).collect();
        let want: Vec<(&[u8], Option<State>)> =
            vec![(b"a", Some(State::Dead)), (b"b", Some(State::Done)), (b"c", Some(State::Done))];
        assert_eq!(got, want, "in key order, without the one taken out");
    }

    /// Keys are written in key order, also where their first 8 bytes are the same
    /// (sorting compares those first) and where one is a prefix of another.
    #[test]
    fn waiting_records_are_taken_in_key_order_beyond_their_first_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &crate::store::StoreOptions::for_tests(None)).unwrap();
        let slice = store.slices.current(crate::store::now_us()).unwrap();
        let keys: [&'static [u8]; 6] =
            [b"\x01abcdefgz", b"\x01abcdefga", b"\x01abc", b"\x01abcdefg", b"\x00zzzzzzzzzz", b"\x01abcdefgab"];
        let mut w = Unwritten::new(1 << 20);
        for (i, k) in keys.iter().enumerate() {
            w.put(&slice, &Hashed { key: k, hash: i as u64 }, b"v", State::Done);
        }
        let taken = w.take();
        let got: Vec<&[u8]> = taken.slices[0].1.iter().map(|x| taken.arena.key(x)).collect();
        let mut want = keys.to_vec();
        want.sort();
        assert_eq!(got, want);
    }
}
