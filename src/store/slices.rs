//! Retention by time slices: records live in one sled tree per slice of time
//! (by default an eighth of the retention), each written in the slice of its
//! last write. A slice is dropped whole once it ended `retention` ago, so a
//! record is kept at least `retention` and at most `retention` + one slice
//! width after its last write, and expiry never looks at a record.
//!
//! Each slice's start, width and records per state are kept in the meta tree
//! (`slice:` + start → width ++ counts), so a store reopened with another
//! retention keeps the slices it has (new slices take the new width), and the
//! counts of a dropped slice leave with it. The meta entry is written before the
//! slice's tree and removed before the tree is dropped: a tree without an entry
//! is the rest of an interrupted drop, and is dropped on open.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::counts::{Counts, STATES};
use super::filter::KeyFilter;
use super::StoreError;

/// Slices per retention: lookups check this many trees (plus one), and a record
/// is kept up to `retention / SLICES_PER_RETENTION` longer than the retention.
pub const SLICES_PER_RETENTION: u32 = 8;
/// The narrowest slice: a short retention (tests, benchmarks) must not make a
/// tree per handful of records.
const MIN_SLICE_WIDTH: Duration = Duration::from_secs(1);
const PREFIX: &[u8] = b"slice:";

/// The width of new slices for a retention.
pub fn width_for(retention: Duration) -> Duration {
    (retention / SLICES_PER_RETENTION).max(MIN_SLICE_WIDTH)
}

pub struct Slice {
    /// µs since the epoch; also the tree's name. Records' times are stored relative to it.
    pub start: i64,
    pub width: i64,
    /// Written only through [`Slice::insert`], which keeps `filter` whole.
    tree: sled::Tree,
    /// Which keys the tree may hold: a lookup of a new id skips the tree (store/filter.rs).
    filter: KeyFilter,
    /// Records per state in this slice; persisted with each group commit.
    pub counts: Counts,
    /// The counts changed since they were last persisted.
    dirty: AtomicBool,
}

impl Slice {
    pub fn end(&self) -> i64 {
        self.start.saturating_add(self.width)
    }

    /// Writes a record key: into the filter first, so that no lookup ever finds the
    /// tree holding a key the filter calls absent.
    pub fn insert(&self, key: &[u8], value: impl Into<sled::IVec>) -> Result<Option<sled::IVec>, sled::Error> {
        self.filter.add(key);
        self.tree.insert(key, value)
    }

    /// The value under `key`; a key the filter knows to be absent reads no page.
    pub fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, sled::Error> {
        if !self.filter.may_contain(key) {
            return Ok(None);
        }
        self.tree.get(key)
    }

    /// Whether the tree holds `key` (the filter first, as [`Slice::get`]).
    pub fn contains_key(&self, key: &[u8]) -> Result<bool, sled::Error> {
        Ok(self.filter.may_contain(key) && self.tree.contains_key(key)?)
    }

    pub fn remove(&self, key: &[u8]) -> Result<Option<sled::IVec>, sled::Error> {
        self.tree.remove(key)
    }

    /// Every record, in key order.
    pub fn iter(&self) -> sled::Iter {
        self.tree.iter()
    }

    pub fn range(&self, range: impl std::ops::RangeBounds<Vec<u8>>) -> sled::Iter {
        self.tree.range(range)
    }

    pub fn scan_prefix(&self, prefix: &[u8]) -> sled::Iter {
        self.tree.scan_prefix(prefix)
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// The filter's keys and bytes (for the gauge and the filling thread's log line).
    pub fn filter_size(&self) -> (usize, usize) {
        (self.filter.len(), self.filter.bytes())
    }

    /// A record left `from` for `to` in this slice (see [`Counts::moved`]).
    pub fn moved(&self, from: Option<super::State>, to: Option<super::State>) {
        self.counts.moved(from, to);
        self.dirty.store(true, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slice({}+{})", self.start, self.width)
    }
}

pub struct Slices {
    db: sled::Db,
    meta: sled::Tree,
    /// Oldest first; slices never overlap, a newer one starts where the last ended or later.
    list: RwLock<Vec<Arc<Slice>>>,
    /// µs.
    retention: i64,
    /// µs, of slices made from now on.
    width: i64,
}

pub fn tree_name(start: i64) -> Vec<u8> {
    [PREFIX, &start.to_be_bytes()].concat()
}

fn entry(width: i64, counts: &Counts) -> Vec<u8> {
    [&width.to_be_bytes()[..], &counts.encode()].concat()
}

impl Slices {
    pub fn open(db: &sled::Db, meta: &sled::Tree, retention: Duration) -> Result<Slices, StoreError> {
        let mut list = Vec::new();
        for item in meta.scan_prefix(PREFIX) {
            let (k, v) = item?;
            let start = k.get(PREFIX.len()..).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(i64::from_be_bytes);
            let width = v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(i64::from_be_bytes);
            let (Some(start), Some(width)) = (start, width) else { continue };
            let tree = db.open_tree(tree_name(start))?;
            let counts = match v.get(8..).and_then(Counts::decode) {
                Some(values) => Counts::from_values(values),
                None => count(&tree)?,
            };
            let filter = KeyFilter::unfilled();
            list.push(Arc::new(Slice { start, width, tree, filter, counts, dirty: AtomicBool::new(false) }));
        }
        for name in db.tree_names() {
            if name.starts_with(PREFIX) && !list.iter().any(|s| tree_name(s.start) == name.as_ref()) {
                tracing::info!("dropping the rest of a slice whose drop was interrupted");
                db.drop_tree(&name)?;
            }
        }
        Ok(Slices {
            db: db.clone(),
            meta: meta.clone(),
            list: RwLock::new(list),
            retention: retention.as_micros() as i64,
            width: width_for(retention).as_micros() as i64,
        })
    }

    /// Builds the filters of the slices opened with records, in a thread of its own:
    /// until a slice's filter has every key, lookups read that slice's tree.
    pub fn fill_filters(&self) {
        let unfilled: Vec<_> = self.all().iter().filter(|s| !s.filter.is_filled()).map(Arc::downgrade).collect();
        if unfilled.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new().name("outboxd-filters".into()).spawn(move || fill(unfilled));
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start the thread that builds the lookup filters; lookups read every slice");
        }
    }

    /// Every slice's filter has all its keys (tests wait for it).
    #[cfg(test)]
    pub fn filters_filled(&self) -> bool {
        self.all().iter().all(|s| s.filter.is_filled())
    }

    /// When records in `slice` stop being retained.
    pub fn expires_at(&self, slice: &Slice) -> i64 {
        slice.end().saturating_add(self.retention)
    }

    /// The slice records written at `now` go to (made if there is none yet).
    pub fn current(&self, now: i64) -> Result<Arc<Slice>, StoreError> {
        if let Some(last) = self.list.read().expect("slices lock").last() {
            if now < last.end() {
                return Ok(last.clone());
            }
        }
        self.slice_for(now)
    }

    /// The slice for a record last written at `at` (older times: a slice of
    /// their own, for records converted from an earlier format).
    pub fn slice_for(&self, at: i64) -> Result<Arc<Slice>, StoreError> {
        let mut list = self.list.write().expect("slices lock");
        let at = at.max(0);
        if let Some(s) = list.iter().rev().find(|s| s.start <= at && at < s.end()) {
            return Ok(s.clone());
        }
        let mut start = at - at % self.width;
        let mut width = self.width;
        // Never overlap a neighbour: start at the end of an earlier one, end at the start of a later one.
        if let Some(before) = list.iter().rev().find(|s| s.start <= at) {
            start = start.max(before.end());
        }
        if let Some(after) = list.iter().find(|s| s.start > at) {
            width = width.min(after.start - start);
        }
        let counts = Counts::default();
        let key = tree_name(start);
        self.meta.insert(&key, entry(width, &counts))?;
        let tree = self.db.open_tree(&key)?;
        // A tree of that name would be the rest of an interrupted drop (dropped on open): empty.
        let filter = if tree.is_empty() { KeyFilter::filled() } else { KeyFilter::unfilled() };
        let slice = Arc::new(Slice { start, width, tree, filter, counts, dirty: AtomicBool::new(false) });
        let at = list.partition_point(|s| s.start < start);
        list.insert(at, slice.clone());
        Ok(slice)
    }

    /// Slices whose records are still retained at `now`, newest first: where lookups look.
    pub fn live(&self, now: i64) -> Vec<Arc<Slice>> {
        let list = self.list.read().expect("slices lock");
        list.iter().rev().filter(|s| self.expires_at(s) > now).cloned().collect()
    }

    /// Every slice, oldest first (listing, counting).
    pub fn all(&self) -> Vec<Arc<Slice>> {
        self.list.read().expect("slices lock").clone()
    }

    /// The slice that starts at `start`, if it is still there.
    pub fn get(&self, start: i64) -> Option<Arc<Slice>> {
        self.list.read().expect("slices lock").iter().rev().find(|s| s.start == start).cloned()
    }

    /// Records per state over all slices.
    pub fn totals(&self) -> [i64; STATES] {
        let mut t = [0i64; STATES];
        for s in self.list.read().expect("slices lock").iter() {
            for (a, b) in t.iter_mut().zip(s.counts.values()) {
                *a += b;
            }
        }
        t
    }

    /// Drops every slice whose records are past retention at `now`, whole:
    /// no record is read. Returns the dropped slices (their counts say what went).
    /// The slices leave the list under the lock (lookups and writers wait only
    /// for that); their trees are dropped after, which takes longer (sled frees
    /// each page). A crash before the drop leaves them to the next pass.
    pub fn drop_expired(&self, now: i64) -> Result<Vec<Arc<Slice>>, StoreError> {
        let dropped: Vec<Arc<Slice>> = {
            let mut list = self.list.write().expect("slices lock");
            let n = list.iter().take_while(|s| self.expires_at(s) <= now).count();
            list.drain(..n).collect()
        };
        for slice in &dropped {
            let name = tree_name(slice.start);
            self.meta.remove(&name)?;
            self.db.drop_tree(&name)?;
        }
        Ok(dropped)
    }

    /// Writes the counts that changed into the meta tree (with each group commit).
    pub fn persist(&self) -> Result<(), sled::Error> {
        let list = self.list.read().expect("slices lock");
        for s in list.iter() {
            if s.dirty.swap(false, Ordering::Relaxed) {
                self.meta.insert(tree_name(s.start), entry(s.width, &s.counts))?;
            }
        }
        Ok(())
    }

    /// Sets each slice's counts to what a full count found, and stores them.
    pub fn correct(&self, found: &[(i64, [i64; STATES])]) -> Result<bool, StoreError> {
        let mut changed = false;
        for s in self.list.read().expect("slices lock").iter() {
            let values = found.iter().find(|(start, _)| *start == s.start).map_or([0; STATES], |(_, v)| *v);
            if s.counts.values() != values {
                s.counts.set(values);
                self.meta.insert(tree_name(s.start), entry(s.width, &s.counts))?;
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// Keys a filling thread reads from a slice before it lets go of it (and of the
/// database: a store being closed is not kept open by its filling thread for longer).
const FILL_CHUNK: usize = 16_384;

/// Reads every key of `slices` into its filter, a chunk at a time; stops when the
/// store is closed. A read that fails leaves that slice's filter answering "maybe".
fn fill(slices: Vec<std::sync::Weak<Slice>>) {
    let started = std::time::Instant::now();
    let (mut keys, mut bytes) = (0, 0);
    for weak in slices {
        let mut after: Option<sled::IVec> = None;
        let filled = loop {
            let Some(slice) = weak.upgrade() else { return };
            match fill_chunk(&slice, after.take()) {
                Ok(Some(last)) => after = Some(last),
                Ok(None) => {
                    slice.filter.set_filled();
                    break Some(slice);
                }
                Err(error) => {
                    tracing::warn!(%error, "reading a slice's keys for its lookup filter failed; lookups read the slice");
                    break None;
                }
            }
        };
        if let Some((k, b)) = filled.map(|s| s.filter_size()) {
            (keys, bytes) = (keys + k, bytes + b);
        }
    }
    tracing::info!(
        records = keys,
        filter_bytes = bytes,
        took_ms = started.elapsed().as_millis() as u64,
        "lookup filters built from the stored records"
    );
}

/// Adds up to [`FILL_CHUNK`] keys of `slice` after `after` to its filter; returns
/// the last one when there may be more.
fn fill_chunk(slice: &Slice, after: Option<sled::IVec>) -> Result<Option<sled::IVec>, sled::Error> {
    let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
    let mut read = 0;
    for key in slice.tree.range::<sled::IVec, _>((from, std::ops::Bound::Unbounded)).keys() {
        let key = key?;
        slice.filter.add(&key);
        read += 1;
        if read == FILL_CHUNK {
            return Ok(Some(key));
        }
    }
    Ok(None)
}

/// Records per state of one slice, by reading it (only for a slice whose counts were lost).
fn count(tree: &sled::Tree) -> Result<Counts, StoreError> {
    let counts = Counts::default();
    for item in tree.iter() {
        let (_, v) = item?;
        counts.moved(None, super::format::state(&v));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::State;

    const S: i64 = 1_000_000;

    #[test]
    fn slices_are_made_as_time_passes_and_dropped_whole_after_the_retention() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::open_db(dir.path(), crate::store::SMALL_CACHE_BYTES).unwrap();
        let meta = db.open_tree("meta").unwrap();
        let slices = Slices::open(&db, &meta, Duration::from_secs(80)).unwrap();
        assert_eq!(slices.width, 10 * S);
        let a = slices.current(1_000 * S + 3).unwrap();
        assert_eq!((a.start, a.end()), (1_000 * S, 1_010 * S));
        assert!(Arc::ptr_eq(&a, &slices.current(1_009 * S).unwrap()));
        a.insert(b"k", b"v").unwrap();
        a.moved(None, Some(State::Done));
        let b = slices.current(1_035 * S).unwrap();
        assert_eq!(b.start, 1_030 * S);
        assert_eq!(slices.live(1_089 * S).len(), 2);
        assert_eq!(slices.live(1_090 * S).len(), 1, "the first one ended 80 s ago");
        slices.persist().unwrap();
        assert_eq!(slices.totals(), [0, 1, 0, 0, 0]);
        drop((a, b, slices));

        // Reopened with a shorter retention: the slices keep their widths, new ones are narrower.
        let slices = Slices::open(&db, &meta, Duration::from_secs(8)).unwrap();
        assert_eq!((slices.all().len(), slices.totals()), (2, [0, 1, 0, 0, 0]));
        assert_eq!(slices.current(1_035 * S).unwrap().start, 1_030 * S);
        assert_eq!(slices.current(1_041 * S).unwrap().width, S);
        let dropped = slices.drop_expired(1_018 * S).unwrap();
        assert_eq!(dropped.iter().map(|s| s.start).collect::<Vec<_>>(), [1_000 * S]);
        assert_eq!(slices.totals(), [0, 0, 0, 0, 0]);
        assert!(!db.tree_names().iter().any(|n| n.as_ref() == tree_name(1_000 * S)));
    }

    #[test]
    fn an_older_record_gets_a_slice_that_does_not_overlap_newer_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::open_db(dir.path(), crate::store::SMALL_CACHE_BYTES).unwrap();
        let meta = db.open_tree("meta").unwrap();
        let slices = Slices::open(&db, &meta, Duration::from_secs(80)).unwrap();
        slices.current(1_005 * S).unwrap();
        let old = slices.slice_for(995 * S).unwrap();
        assert_eq!((old.start, old.end()), (990 * S, 1_000 * S));
        let newest = slices.current(1_006 * S).unwrap();
        assert_eq!(newest.start, 1_000 * S);
        // An interrupted drop leaves a tree without its entry: dropped on open.
        meta.remove(tree_name(990 * S)).unwrap();
        drop((old, newest, slices));
        let slices = Slices::open(&db, &meta, Duration::from_secs(80)).unwrap();
        assert_eq!(slices.all().len(), 1);
        assert!(!db.tree_names().iter().any(|n| n.as_ref() == tree_name(990 * S)));
    }
}
