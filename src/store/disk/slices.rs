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
//!
//! The current slice keeps the records written into it in memory, journaled one
//! sled value per group commit (store/disk/journal.rs), until they are packed into a
//! run: a *spill* each time memory holds `store.memory_records` of them (a run of
//! their own, added to the slice's), a *merge* of all its runs now and then. A slice
//! whose time has passed is *sealed* (merged) once more, and later writes into it
//! (rare: a record moving out, a repair) go to its tree, an overlay of changes that
//! shadows the run (the steps are under [`Slices::pack`]'s `impl`).
//!
//! A slice may hold several runs: a restore adds one per batch of records it held
//! back ([`Slices::write_run`], [`Slices::add`]), records the slice did not hold, so
//! that each is written once. The overlay shadows every run, a newer run an older
//! one; a seal packs them all, with the overlay, into one, and a slice with more than
//! [`MAX_RUNS`] is sealed again (merged) by the next gc pass.

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

use super::counts::{Counts, STATES};
use super::filter::{Hashed, KeyFilter, RunFilterBuilder};
use super::journal::{Guard, Journal, Table};
use super::record::now_us;
use super::runs::{self, Run, RunIter, RunWriter, TOMBSTONE};
use crate::store::error::StoreError;

/// Slices per retention: lookups check this many trees (plus one), and a record
/// is kept up to `retention / SLICES_PER_RETENTION` longer than the retention.
pub const SLICES_PER_RETENTION: u32 = 8;
/// The narrowest slice: a short retention (tests, benchmarks) must not make a
/// tree per handful of records.
const MIN_SLICE_WIDTH: Duration = Duration::from_secs(1);
const PREFIX: &[u8] = b"slice:";
/// Meta key of a slice's packed runs: this + start → per run, oldest first, its id
/// ++ its records (big-endian u64s).
const RUN_PREFIX: &[u8] = b"run:";
/// A slice with more runs than this is merged into one by the next gc pass. Each run
/// costs a lookup of a new id one filter probe and an iteration one more source to
/// merge; a restore adds a run per `store.changelog.restore_run_bytes` of a slice's
/// records (1.2M of the benchmark's records at the default), so a restore merges
/// only a slice of more than about ten million records (10M took 14 s; a gc pass
/// during a long restore may merge it once more).
pub const MAX_RUNS: usize = 8;
/// A sealed slice is sealed again once its overlay took this many writes, and
/// at least an eighth of its runs' records.
const RESEAL_WRITES: u64 = 4_096;
/// Records a table in memory is sized for at its first write, at most: as many as the
/// last table a pack took held (a slice that reaches `store.memory_records` is
/// followed by one that will), up to the default (131,072: about 9 MB of the table's
/// address space). Beyond, and from nothing after a start, it grows as it fills.
/// Not `store.memory_records` itself: a table's records land anywhere in it, so
/// a table sized for many and given few (slices of a short retention, each holding
/// a few seconds) makes nearly all of its pages resident: about +140 MB of RSS in the
/// store scenario's load at 1 s retention, where a table that grows moves few records.
const PRESIZED_RECORDS: u64 = 131_072;
/// `store.memory_records` as the tests of this file take it (the store's default).
#[cfg(test)]
const LIVE_SEAL_RECORDS: u64 = 131_072;

/// The width of new slices for a retention.
pub fn width_for(retention: Duration) -> Duration {
    (retention / SLICES_PER_RETENTION).max(MIN_SLICE_WIDTH)
}

pub struct Slice {
    /// µs since the epoch; also the tree's name. Records' times are stored relative to it.
    pub start: i64,
    pub width: i64,
    /// The records written while the slice takes live writes, not yet packed into a
    /// run: newer than the tree and the runs, which they shadow (a removal is empty).
    /// Every write into it is journaled in the same order (store/disk/journal.rs).
    /// Shared with the slice's iterators.
    mem: Arc<RwLock<Table>>,
    /// The records a pack under way took out of `mem` ([`Slices::begin`]): newer than
    /// the overlay and the runs, older than `mem`. Taken whole and let go whole, so
    /// that a pack holds no lock for longer than a swap.
    frozen: RwLock<Option<Arc<RwLock<Table>>>>,
    journal: Arc<Journal>,
    full: Arc<Full>,
    /// One entry per record written while the slice does not take live writes (a
    /// record moving out, a repair of an old one; and every record of a store
    /// written before records were kept in memory): changes since its last seal, an
    /// overlay that shadows `runs` (a removal is a [`TOMBSTONE`]). Written only
    /// through [`Slice::insert`] and [`Slice::remove`], which keep `filter` whole.
    tree: sled::Tree,
    /// The slice's packed records (store/disk/runs.rs), oldest run first: its last
    /// seal's, then those a restore added since. A newer run shadows an older one.
    /// Loaded by every lookup without a lock (see [`super::names::Names`]); swapped whole.
    runs: ArcSwap<Vec<Arc<Run>>>,
    /// True once a seal has begun: from then on a removal writes a tombstone (a
    /// seal may have read the record already). Held for reading by each removal,
    /// for writing by a seal as it begins.
    sealing: RwLock<bool>,
    /// Writes into `tree` since the last seal (or since the slice was opened).
    overlay_writes: AtomicU64,
    /// Which keys the overlay may hold (the runs have filters of their own): a lookup
    /// of a new id reads no page of it (store/disk/filter.rs). Memory's keys are not in
    /// it: a lookup there costs what a probe of the filter would.
    filter: KeyFilter,
    /// Set by the first write into memory (or a replay of the journal into it), never
    /// cleared: until then lookups skip `mem` and `frozen` and their locks, as they do
    /// for every slice older than the current one and the one before.
    holds_memory: AtomicBool,
    /// Held by whoever is packing the slice, from its pack to its settle ([`Packing`]).
    packing: AtomicBool,
    /// Opened with a run and an overlay that may repeat it: the last seal may have
    /// stopped (a crash) between its install and its settle. Until a settle, the
    /// overlay would keep one entry per record of the slice for as long as it is kept.
    unsettled: AtomicBool,
    /// Records per state in this slice; persisted with each group commit.
    pub counts: Counts,
    /// The counts changed since they were last persisted.
    dirty: AtomicBool,
}

/// What a slice is made with besides its trees and filter.
struct Parts {
    counts: Counts,
    journal: Arc<Journal>,
    full: Arc<Full>,
}

/// Told when a slice's records in memory reach `store.memory_records`: the service
/// packs them then ([`Slices::full`]), not at its next gc pass, which could be
/// minutes and millions of records away.
pub struct Full {
    at: u64,
    notify: tokio::sync::Notify,
    /// Records the last table taken by a pack held: what a new table is sized for
    /// (see [`PRESIZED_RECORDS`]).
    reached: AtomicU64,
}

impl Full {
    /// Records a new table is sized for at its first write.
    fn presize(&self) -> usize {
        self.reached.load(Ordering::Relaxed).min(self.at).min(PRESIZED_RECORDS) as usize
    }
}

impl Slice {
    fn new(start: i64, width: i64, tree: sled::Tree, runs: Vec<Run>, filter: KeyFilter, parts: Parts) -> Slice {
        let sealed = !runs.is_empty();
        let unsettled = sealed && !tree.is_empty();
        Slice {
            start,
            width,
            mem: Arc::default(),
            frozen: RwLock::new(None),
            journal: parts.journal,
            full: parts.full,
            tree,
            runs: ArcSwap::from_pointee(runs.into_iter().map(Arc::new).collect()),
            sealing: RwLock::new(sealed),
            overlay_writes: AtomicU64::new(0),
            filter,
            holds_memory: AtomicBool::new(false),
            packing: AtomicBool::new(false),
            unsettled: AtomicBool::new(unsettled),
            counts: parts.counts,
            dirty: AtomicBool::new(false),
        }
    }

    fn mem(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.mem.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn mem_mut(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.mem.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn frozen(&self) -> Option<Arc<RwLock<Table>>> {
        self.frozen.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records (and removals) it holds in memory, a pack's included.
    pub fn mem_len(&self) -> usize {
        self.mem().len() + self.frozen().map_or(0, |f| read(&f).len())
    }

    /// Whether a write goes into memory: while the slice is the current one, and
    /// while it holds records there (until a pack takes them). The caller holds the
    /// journal, so that the answer does not change before the write is made.
    fn takes_live_writes(&self) -> bool {
        self.end() > now_us() || !self.mem().is_empty() || self.frozen().is_some()
    }

    /// Whether the slice was opened with a run and an overlay not known to be
    /// settled; cleared by [`Slices::settle`].
    pub fn unsettled(&self) -> bool {
        self.unsettled.load(Ordering::Relaxed)
    }

    /// The right to pack this slice until the answer is dropped; `None` while
    /// another pack of it runs. Two at once (gc's seal, a restore writing its
    /// records as a run) would each install a run without the other's records.
    pub fn try_packing(self: &Arc<Self>) -> Option<Packing> {
        let free = self.packing.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        free.then(|| Packing(self.clone()))
    }

    pub fn end(&self) -> i64 {
        self.start.saturating_add(self.width)
    }

    /// Its runs, oldest first.
    fn runs(&self) -> Arc<Vec<Arc<Run>>> {
        self.runs.load_full()
    }

    /// The value the runs hold under `key`: the newest run's that has it (a removal
    /// there, which a run packed from memory may hold: none).
    fn find_in_runs(&self, key: &Hashed) -> Result<Option<sled::IVec>, sled::Error> {
        for run in self.runs.load().iter().rev() {
            if run.may_contain(key) {
                if let Some(v) = run.get(key.key)? {
                    return Ok((!v.is_empty()).then_some(v));
                }
            }
        }
        Ok(None)
    }

    /// Writes a record: into memory and the journal while the slice takes live
    /// writes, else into its tree (and the overlay's filter first, so that no lookup
    /// ever finds the slice holding a key the filter calls absent).
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), sled::Error> {
        debug_assert!(!value.is_empty(), "no record value is empty: that is a tombstone");
        let mut journal = self.journal.lock();
        self.overlay_writes.fetch_add(1, Ordering::Relaxed);
        if self.takes_live_writes() {
            self.write_in_memory(&mut journal, key, value);
            return Ok(());
        }
        // What memory took before this write is journaled first: a crash keeps a
        // prefix of sled's log, and this write must not be in it without them.
        journal.cut()?;
        self.insert_tree(key, value)
    }

    /// A write (an empty `value`: a removal) into memory and, in the same order, the
    /// journal held by the caller; lookups told first that memory is to be read.
    fn write_in_memory(&self, journal: &mut Guard<'_>, key: &[u8], value: &[u8]) {
        if !self.holds_memory.load(Ordering::Relaxed) {
            self.holds_memory.store(true, Ordering::Release);
        }
        journal.append(self.start, key, value);
        let mut mem = self.mem_mut();
        if mem.is_empty() {
            // Sized at once for what the last pack took (see `PRESIZED_RECORDS`): a hash
            // table that grows moves every entry, holding up every write and lookup of
            // the slice.
            mem.reserve(self.full.presize());
        }
        mem.insert(key, value);
        if mem.len() as u64 >= self.full.at {
            // Coalesced: one wake-up however many writes tell it.
            self.full.notify.notify_one();
        }
    }

    /// Writes a record into the tree, whatever the slice takes: a store made in bulk,
    /// or converted from the earlier format, at its open.
    pub fn insert_tree(&self, key: &[u8], value: impl Into<sled::IVec>) -> Result<(), sled::Error> {
        self.filter.add(&Hashed::of(key));
        self.tree.insert(key, value.into()).map(drop)
    }

    /// The value under `key` (see [`Slice::find`]; callers outside the tests hash once for all slices).
    #[cfg(test)]
    pub fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, sled::Error> {
        self.find(&Hashed::of(key))
    }

    /// The value under `key`: memory's entry if it has one, else the overlay's, else
    /// the newest run's (a removal in any: none). A part whose filter knows the key to
    /// be absent reads no page.
    pub fn find(&self, key: &Hashed) -> Result<Option<sled::IVec>, sled::Error> {
        if self.holds_memory.load(Ordering::Acquire) {
            if let Some(v) = self.mem().get(key.key) {
                return Ok((!v.is_empty()).then(|| v.into()));
            }
            // After `mem`: a pack takes `mem`'s records into `frozen` with `frozen` held.
            if let Some(frozen) = self.frozen() {
                if let Some(v) = read(&frozen).get(key.key) {
                    return Ok((!v.is_empty()).then(|| v.into()));
                }
            }
        }
        if self.filter.may_contain(key) {
            match self.tree.get(key.key)? {
                Some(v) if v.is_empty() => return Ok(None),
                Some(v) => return Ok(Some(v)),
                None => {}
            }
        }
        // Read after the overlay: a seal installs its run before it removes what
        // the run holds from the overlay.
        self.find_in_runs(key)
    }

    /// Removes the record of `key`: in memory (and the journal) while the slice
    /// takes live writes; else in its tree, a tombstone once the slice is (being)
    /// sealed, added to the overlay's filter first (it must shadow the run's record).
    pub fn remove(&self, key: &[u8]) -> Result<(), sled::Error> {
        let mut journal = self.journal.lock();
        self.overlay_writes.fetch_add(1, Ordering::Relaxed);
        if self.takes_live_writes() {
            self.write_in_memory(&mut journal, key, &[]);
            return Ok(());
        }
        journal.cut()?;
        let sealing = self.sealing.read().unwrap_or_else(PoisonError::into_inner);
        if *sealing {
            self.filter.add(&Hashed::of(key));
            self.tree.insert(key, TOMBSTONE).map(drop)
        } else {
            self.tree.remove(key).map(drop)
        }
    }

    /// Every record, in key order.
    pub fn iter(&self) -> SliceIter {
        self.range_from(Bound::Unbounded)
    }

    /// The records from `from` on, in key order.
    pub fn range_from(&self, from: Bound<Vec<u8>>) -> SliceIter {
        self.range_over(self.tables(), from, None)
    }

    /// Its records in memory, newest first.
    fn tables(&self) -> Vec<Arc<RwLock<Table>>> {
        [Some(self.mem.clone()), self.frozen()].into_iter().flatten().collect()
    }

    /// [`Slice::range_from`] with `tables` (newest first, none for its overlay and
    /// runs alone) in place of its records in memory, of which only those with
    /// `prefix` are read.
    fn range_over(&self, tables: Vec<Arc<RwLock<Table>>>, from: Bound<Vec<u8>>, prefix: Option<&[u8]>) -> SliceIter {
        let overlay = match &from {
            Bound::Included(k) => self.tree.range(k.clone()..),
            Bound::Excluded(k) => self.tree.range((Bound::Excluded(k.clone()), Bound::Unbounded)),
            Bound::Unbounded => self.tree.iter(),
        };
        let mem = tables.into_iter().map(|t| Source::Mem(MemIter::new(t, &from, prefix)));
        let held = self.runs();
        let runs = held.iter().rev().map(|r| Source::Run(r.range(from.clone())));
        let sources: Vec<_> = mem.chain([Source::Overlay(overlay)]).chain(runs).map(Some).collect();
        let heads = vec![None; sources.len()];
        SliceIter { sources, heads, held, done: false, prefix: None }
    }

    /// The records whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, prefix: &[u8]) -> SliceIter {
        let all = self.range_over(self.tables(), Bound::Included(prefix.to_vec()), Some(prefix));
        SliceIter { prefix: Some(prefix.to_vec()), ..all }
    }

    /// No record (a read that fails counts as not empty). Memory is looked at first:
    /// an iteration puts its records in order, which a slice holding records need not.
    pub fn is_empty(&self) -> bool {
        if self.tables().iter().any(|t| read(t).has_records()) {
            return false;
        }
        self.iter().next().is_none()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Entries in the overlay (tombstones included).
    #[cfg(test)]
    pub fn overlay_len(&self) -> usize {
        self.tree.len()
    }

    /// The filters' keys and bytes (for the gauge and the filling thread's log line).
    pub fn filter_size(&self) -> (usize, usize) {
        let runs = self.runs();
        let run_keys: u64 = runs.iter().filter(|r| r.has_filter()).map(|r| r.records).sum();
        let run_bytes: usize = runs.iter().map(|r| r.filter_bytes()).sum();
        (self.filter.len() + run_keys as usize, self.filter.bytes() + run_bytes)
    }

    /// Every filter has every key it must have: lookups trust their "absent".
    fn filters_filled(&self) -> bool {
        self.filter.is_filled() && self.runs().iter().all(|r| r.has_filter())
    }

    /// A record left `from` for `to` in this slice (see [`Counts::moved`]).
    pub fn moved(&self, from: Option<super::record::State>, to: Option<super::record::State>) {
        self.counts.moved(from, to);
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Records in its packed runs, and writes into its overlay since its last seal.
    pub fn packing(&self) -> (u64, u64) {
        (self.runs().iter().map(|r| r.records).sum(), self.overlay_writes.load(Ordering::Relaxed))
    }

    /// How many packed runs it has.
    pub fn run_count(&self) -> usize {
        self.runs().len()
    }

    /// Whether `name` is the tree of one of its runs.
    fn holds_run_tree(&self, name: &[u8]) -> bool {
        self.runs().iter().any(|r| runs::tree_name(self.start, r.id) == name)
    }
}

/// The right to pack a slice ([`Slice::try_packing`]), given back when dropped.
pub struct Packing(Arc<Slice>);

/// A pack of a slice under way ([`Slices::begin`]): the records it took out of
/// memory, and how they are packed.
pub struct Fold {
    mem: Arc<RwLock<Table>>,
    /// The last journal chunk holding a record of `mem`.
    seq: u64,
    /// With the slice's runs and overlay, into one run (else into a run of their own).
    pub merge: bool,
    /// The slice's writes when the pack began (a merge packs them all).
    writes: u64,
}

impl Drop for Packing {
    fn drop(&mut self) {
        self.0.packing.store(false, Ordering::Release);
    }
}

type Entry = (sled::IVec, sled::IVec);

/// A slice's records in key order: its records in memory, its overlay and its
/// runs merged, memory's entry winning, then the overlay's, then the newest
/// run's; removals left out.
pub struct SliceIter {
    /// Memory, the overlay, then the runs newest first (on equal keys the first wins);
    /// `None` once read to its end.
    sources: Vec<Option<Source>>,
    /// Keeps the runs from being dropped while they are read (see [`Slices::drop_retired`]).
    #[allow(dead_code)]
    held: Arc<Vec<Arc<Run>>>,
    /// The next entry of each source, once read.
    heads: Vec<Option<Entry>>,
    /// Past the prefix: nothing more.
    done: bool,
    /// Stop at the first key without it (`scan_prefix`).
    prefix: Option<Vec<u8>>,
}

enum Source {
    Mem(MemIter),
    Overlay(sled::Iter),
    Run(RunIter),
}

impl Source {
    fn next(&mut self) -> Option<Result<Entry, sled::Error>> {
        match self {
            Source::Mem(i) => i.next().map(Ok),
            Source::Overlay(i) => i.next(),
            Source::Run(i) => i.next(),
        }
    }
}

fn read(table: &RwLock<Table>) -> std::sync::RwLockReadGuard<'_, Table> {
    table.read().unwrap_or_else(PoisonError::into_inner)
}

/// A slice's records in memory from a bound on (with a prefix, if given), copied out
/// and put in key order at its first read: the table is a hash table, held locked
/// for that copy only. Writes into the table after that read are not seen (those
/// before the iterator was made always are).
struct MemIter {
    /// Until the first read.
    table: Option<Arc<RwLock<Table>>>,
    from: Bound<Vec<u8>>,
    prefix: Option<Vec<u8>>,
    read: std::vec::IntoIter<Entry>,
}

impl MemIter {
    fn new(table: Arc<RwLock<Table>>, from: &Bound<Vec<u8>>, prefix: Option<&[u8]>) -> MemIter {
        let prefix = prefix.map(<[u8]>::to_vec);
        MemIter { table: Some(table), from: from.clone(), prefix, read: Vec::new().into_iter() }
    }
}

impl Iterator for MemIter {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if let Some(table) = self.table.take() {
            let from = self.from.as_ref().map(|k| &k[..]);
            self.read = read(&table).sorted_from(from, self.prefix.as_deref()).into_iter();
        }
        self.read.next()
    }
}

impl SliceIter {
    fn refill(&mut self) -> Result<(), sled::Error> {
        for (head, source) in self.heads.iter_mut().zip(&mut self.sources) {
            if head.is_none() {
                if let Some(s) = source {
                    *head = s.next().transpose()?;
                    if head.is_none() {
                        *source = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// The head with the lowest key (the first source's on equal keys); the other
    /// heads with that key are shadowed and dropped.
    fn take_lowest(&mut self) -> Option<Entry> {
        let mut lowest: Option<usize> = None;
        for (i, head) in self.heads.iter().enumerate() {
            let Some((k, _)) = head else { continue };
            if lowest.is_none_or(|l| self.heads[l].as_ref().is_some_and(|(lk, _)| k < lk)) {
                lowest = Some(i);
            }
        }
        let entry = self.heads[lowest?].take()?;
        for head in &mut self.heads {
            if head.as_ref().is_some_and(|(k, _)| *k == entry.0) {
                *head = None;
            }
        }
        Some(entry)
    }

    fn step(&mut self) -> Result<Option<Entry>, sled::Error> {
        loop {
            if self.done {
                return Ok(None);
            }
            self.refill()?;
            let Some((k, v)) = self.take_lowest() else { return Ok(None) };
            if self.prefix.as_ref().is_some_and(|p| !k.starts_with(p)) {
                self.done = true;
                return Ok(None);
            }
            if v.is_empty() {
                continue;
            }
            return Ok(Some((k, v)));
        }
    }
}

impl Iterator for SliceIter {
    type Item = Result<(sled::IVec, sled::IVec), sled::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step().transpose()
    }
}

impl std::fmt::Debug for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slice({}+{})", self.start, self.width)
    }
}

/// The slices of [`Slices::live`], newest first: held inline, since every
/// lookup of an event asks for them (there are [`SLICES_PER_RETENTION`] and
/// one more while the oldest waits to be dropped, or a few more after the
/// retention was shortened).
pub type LiveSlices = SmallVec<[Arc<Slice>; SLICES_PER_RETENTION as usize + 4]>;

pub struct Slices {
    db: sled::Db,
    meta: sled::Tree,
    /// Of the records in memory (store/disk/journal.rs).
    journal: Arc<Journal>,
    full: Arc<Full>,
    /// Runs a newer seal replaced, dropped once no reader holds them.
    retired: std::sync::Mutex<Vec<Arc<Run>>>,
    /// The id of the next run written: above every run tree this database has
    /// held since it was opened. A name is never reused: with reused names (a
    /// tree dropped, then made again under its name) the model test below lost
    /// records, so a new run never meets the rest of a dropped one.
    next_run: AtomicU64,
    /// `store.memory_records`: the current slice's records in memory are spilled into
    /// a run each time they are this many, and the slice is merged each time it took
    /// this many writes and an eighth of its runs' records since its last merge (each
    /// merge rewrites the slice's runs as one, so the eighth keeps a record's rewrites
    /// to about nine over the slice's life).
    live_seal: u64,
    /// [`RESEAL_WRITES`] (in debug builds, `OUTBOXD_DEBUG_RESEAL_WRITES` if set: the
    /// test of a crash in a merge, tests/it/seal_crashes.rs, reaches one with a few writes).
    reseal_writes: u64,
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
    /// [`Slices::open_with`] the default records in memory.
    #[cfg(test)]
    pub fn open(db: &sled::Db, meta: &sled::Tree, retention: Duration) -> Result<Slices, StoreError> {
        Slices::open_with(db, meta, retention, LIVE_SEAL_RECORDS)
    }

    /// Opens the slices, each with the records the journal holds of it in memory;
    /// the current one's are packed each time they are `memory_records`.
    pub fn open_with(
        db: &sled::Db,
        meta: &sled::Tree,
        retention: Duration,
        memory_records: u64,
    ) -> Result<Slices, StoreError> {
        // Each slice's start, width and meta entry; the journal keeps the records of these.
        let mut entries = Vec::new();
        for item in meta.scan_prefix(PREFIX) {
            let (k, v) = item?;
            let start = k.get(PREFIX.len()..).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(i64::from_be_bytes);
            let width = v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(i64::from_be_bytes);
            if let (Some(start), Some(width)) = (start, width) {
                entries.push((start, width, v));
            }
        }
        let starts: Vec<i64> = entries.iter().map(|(start, _, _)| *start).collect();
        let (journal, mut replay) = Journal::open(db, &starts)?;
        let journal = Arc::new(journal);
        let full = Arc::new(Full { at: memory_records, notify: tokio::sync::Notify::new(), reached: AtomicU64::new(0) });
        let mut list = Vec::new();
        let trees = db.tree_names();
        for (start, width, v) in entries {
            let tree = db.open_tree(tree_name(start))?;
            let mut runs = Vec::new();
            if let Some(v) = meta.get(run_key(start))? {
                let named = decode_run_entry(&v)
                    .ok_or_else(|| StoreError::Corrupt { id: format!("runs of slice {start}"), error: "bad run entry".into() })?;
                for (id, records) in named {
                    // A run is durable before it is named: one named and missing was dropped
                    // by a build that knew one run per slice (opening the tree would make
                    // an empty one, and its records would be gone without a word).
                    let tree = runs::tree_name(start, id);
                    if !trees.iter().any(|t| t.as_ref() == tree.as_slice()) {
                        return Err(StoreError::Corrupt {
                            id: format!("run {id} of slice {start}"),
                            error: "the store names a packed run that is not there (an older release opened this \
                                    store and dropped it); rebuild the store from the changelog"
                                .into(),
                        });
                    }
                    runs.push(Run::open(db, start, id, records)?);
                }
            }
            let kept = v.get(8..).and_then(Counts::decode);
            let counts = kept.map(Counts::from_values).unwrap_or_default();
            // The overlay's, sized for the records beyond the runs and memory, and an
            // eighth more for those still to come.
            let replayed = replay.remove(&start).unwrap_or_default();
            let packed: u64 = runs.iter().map(|r| r.records).sum();
            let beyond = counts.total().saturating_sub(packed).saturating_sub(replayed.len() as u64) as usize;
            let filter = KeyFilter::unfilled(beyond + beyond / 8);
            let parts = Parts { counts, journal: journal.clone(), full: full.clone() };
            let slice = Slice::new(start, width, tree, runs, filter, parts);
            if !replayed.is_empty() {
                slice.holds_memory.store(true, Ordering::Release);
            }
            slice.mem_mut().extend(replayed);
            if kept.is_none() {
                slice.counts.set(count(&slice)?.values());
            }
            list.push(Arc::new(slice));
        }
        let mut next_run = 1;
        for name in db.tree_names() {
            if let Some(id) = runs::id_of(&name) {
                next_run = next_run.max(id + 1);
            }
            if name.starts_with(PREFIX) && !list.iter().any(|s| tree_name(s.start) == name.as_ref()) {
                tracing::info!("dropping the rest of a slice whose drop was interrupted");
                db.drop_tree(&name)?;
            }
            if runs::is_run_tree(&name) && !list.iter().any(|s| s.holds_run_tree(&name)) {
                tracing::info!("dropping a packed run that no slice uses (an interrupted seal or drop)");
                db.drop_tree(&name)?;
            }
        }
        for item in meta.scan_prefix(RUN_PREFIX) {
            let (k, _) = item?;
            if !list.iter().any(|s| run_key(s.start) == k.as_ref()) {
                meta.remove(k)?;
            }
        }
        // The filters of runs dropped above, or of a seal cut short.
        let filters = db.open_tree(runs::FILTERS_TREE)?;
        for name in filters.iter().keys() {
            let name = name?;
            if !list.iter().any(|s| s.holds_run_tree(&name)) {
                filters.remove(name)?;
            }
        }
        Ok(Slices {
            db: db.clone(),
            meta: meta.clone(),
            journal,
            full,
            retired: std::sync::Mutex::default(),
            next_run: AtomicU64::new(next_run),
            live_seal: memory_records,
            reseal_writes: debug_knob("OUTBOXD_DEBUG_RESEAL_WRITES").unwrap_or(RESEAL_WRITES),
            list: RwLock::new(list),
            retention: retention.as_micros() as i64,
            width: width_for(retention).as_micros() as i64,
        })
    }

    /// Builds the overlays' filters of the slices opened with records (and the
    /// filter of a run written before filters were stored), in a thread of its
    /// own: until a filter has every key, lookups read what it stands for.
    pub fn fill_filters(&self) {
        let unfilled: Vec<_> = self.all().iter().filter(|s| !s.filters_filled()).map(Arc::downgrade).collect();
        if unfilled.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new().name("outboxd-filters".into()).spawn(move || fill(unfilled));
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start the thread that builds the lookup filters; lookups read every slice");
        }
    }

    /// Every slice's filter has all its keys (tests and the scale benchmark wait for it).
    #[cfg(any(test, feature = "internals"))]
    pub fn filters_filled(&self) -> bool {
        self.all().iter().all(|s| s.filters_filled())
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
        let filter = if tree.is_empty() { KeyFilter::filled() } else { KeyFilter::unfilled(0) };
        let parts = Parts { counts, journal: self.journal.clone(), full: self.full.clone() };
        let slice = Arc::new(Slice::new(start, width, tree, Vec::new(), filter, parts));
        let at = list.partition_point(|s| s.start < start);
        list.insert(at, slice.clone());
        Ok(slice)
    }

    /// Slices whose records are still retained at `now`, newest first: where lookups look.
    pub fn live(&self, now: i64) -> LiveSlices {
        let list = self.list.read().expect("slices lock");
        list.iter().rev().filter(|s| self.expires_at(s) > now).cloned().collect()
    }

    /// Every slice, oldest first (listing, counting).
    pub fn all(&self) -> Vec<Arc<Slice>> {
        self.list.read().expect("slices lock").clone()
    }

    /// The newest slice holding `key`, with its value there (the key hashed once
    /// for all the slices).
    pub fn newest_with(&self, key: &[u8]) -> Result<Option<(Arc<Slice>, sled::IVec)>, sled::Error> {
        let hashed = Hashed::of(key);
        for slice in self.all().into_iter().rev() {
            if let Some(raw) = slice.find(&hashed)? {
                return Ok(Some((slice, raw)));
            }
        }
        Ok(None)
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
            self.meta.remove(run_key(slice.start))?;
            self.db.drop_tree(&name)?;
            for run in slice.runs().iter() {
                run.drop_tree(&self.db)?;
            }
            self.journal.lock().folded(slice.start, u64::MAX, true)?;
        }
        Ok(dropped)
    }

    /// Returns once a slice's records in memory are `memory_records` (at once if
    /// they reached it since the last call): time to pack them.
    pub async fn full(&self) {
        self.full.notify.notified().await;
    }

    /// Writes the records taken into memory since the last call as one chunk of
    /// the journal (with each group commit, before its flush; and before a write
    /// that must not be kept without them).
    pub fn journal(&self) -> Result<(), sled::Error> {
        self.journal.lock().cut().map(drop)
    }

    /// Chunks in the journal.
    #[cfg(test)]
    pub fn journal_chunks(&self) -> usize {
        self.journal.chunks()
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

fn run_key(start: i64) -> Vec<u8> {
    [RUN_PREFIX, &start.to_be_bytes()].concat()
}

fn run_entry(runs: &[Arc<Run>]) -> Vec<u8> {
    runs.iter().flat_map(|r| [r.id.to_be_bytes(), r.records.to_be_bytes()]).flatten().collect()
}

/// Each run's id and records; an entry of one run is the format of stores that had
/// one run per slice.
fn decode_run_entry(v: &[u8]) -> Option<Vec<(u64, u64)>> {
    if v.is_empty() || v.len() % 16 != 0 {
        return None;
    }
    let word = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
    Some(v.chunks_exact(16).map(|c| (word(&c[..8]), word(&c[8..]))).collect())
}

/// Sealing: a slice's records are packed into a run (store/disk/runs.rs) in steps,
/// each safe to cut short by a crash: [`Slices::begin`] journals what the slice
/// holds in memory and takes it aside whole (lookups still read it; new writes go
/// to an empty table); [`Slices::pack`] writes a new run of it with the slice's
/// runs and overlay (a merge) or of it alone (a spill; nothing finds the run yet;
/// an open drops it); once that is durable, [`Slices::unshadow`] removes from the
/// overlay the keys it holds (memory and, after a crash, the journal still have
/// them) and [`Slices::install`] names the run in the meta tree and hands it to
/// lookups (memory and the overlay still shadow it with the same values); once that
/// is durable, [`Slices::settle`] removes from the overlay what the runs answer the
/// same for, and [`Slices::settle_memory`] lets go of the records taken aside, in
/// memory and in the journal.
impl Slices {
    /// Sealed slices opened with an overlay that may repeat their run, oldest first
    /// ([`Slice::unsettled`]): [`Slices::settle`] them before anything else.
    pub fn to_settle(&self) -> Vec<Arc<Slice>> {
        self.all().into_iter().filter(|s| s.unsettled()).collect()
    }

    /// Slices with records to pack, oldest first ([`Slices::due`]).
    pub fn to_seal(&self, now: i64) -> Result<Vec<Arc<Slice>>, StoreError> {
        let mut found = Vec::new();
        for s in self.all() {
            if self.due(&s, now)?.is_some() {
                found.push(s);
            }
        }
        Ok(found)
    }

    /// Whether `s` is to be packed at `now`, and how. `Some(true)`, a merge of its
    /// runs, overlay and records in memory into one run: a slice whose time has
    /// passed once it holds anything beyond its runs (again once it took
    /// [`RESEAL_WRITES`] and an eighth of its runs' records), the current one each
    /// time it took `memory_records` writes and an eighth of its runs' records since its
    /// last merge, so that a record is rewritten about nine times over the slice's
    /// life, and any slice with more than [`MAX_RUNS`] runs. `Some(false)`, a spill:
    /// the current slice's records in memory written as a run of their own once they
    /// are `memory_records`, so that memory holds about that many at most.
    fn due(&self, s: &Slice, now: i64) -> Result<Option<bool>, StoreError> {
        let (packed, writes) = s.packing();
        let held = s.counts.total();
        // Writes since the open, or the records beyond the runs (kept over a restart).
        let overlay = writes.max(held.saturating_sub(packed));
        let current = s.end() > now;
        let merge = if s.run_count() > MAX_RUNS {
            true
        } else if current {
            overlay >= self.live_seal.max(packed / 8)
        } else if s.run_count() == 0 {
            s.mem_len() > 0 || s.tree.first()?.is_some()
        } else {
            s.mem_len() > 0 || overlay >= self.reseal_writes.max(packed / 8)
        };
        if merge {
            return Ok(Some(true));
        }
        Ok((current && s.mem_len() as u64 >= self.live_seal).then_some(false))
    }

    /// The first step of a pack of `slice` ([`Slices::due`] at `now`; a merge if it is
    /// not due): what the slice holds in memory is journaled, and taken aside whole
    /// (`frozen`, still read by lookups) while new writes go to an empty table. The
    /// caller holds [`Packing`].
    pub fn begin(&self, slice: &Slice, now: i64, _: &Packing) -> Result<Fold, StoreError> {
        let merge = self.due(slice, now)?.unwrap_or(true);
        let writes = slice.overlay_writes.load(Ordering::Relaxed);
        let mut journal = self.journal.lock();
        let seq = journal.cut()?;
        // `frozen` held first: a lookup that missed in `mem` finds the records there.
        let mut frozen = slice.frozen.write().unwrap_or_else(PoisonError::into_inner);
        let taken = std::mem::take(&mut *slice.mem_mut());
        slice.full.reached.store(taken.len() as u64, Ordering::Relaxed);
        let table = match frozen.take() {
            // A pack that did not settle (it failed): its records are older than memory's.
            Some(older) => {
                let mut table = read(&older).clone();
                table.overlay(taken);
                table
            }
            None => taken,
        };
        let table = Arc::new(RwLock::new(table));
        *frozen = Some(table.clone());
        drop((frozen, journal));
        Ok(Fold { mem: table, seq, merge, writes })
    }

    /// Writes a new run of the fold: of the slice's runs, overlay and the records the
    /// fold took out of memory (a merge), or of those records alone, removals kept (a
    /// spill). Returns it, not yet durable, not yet found.
    pub fn pack(&self, slice: &Slice, fold: &Fold, _: &Packing) -> Result<Run, StoreError> {
        // From now on a removal from the tree leaves a tombstone: this pass may read the record before it goes.
        *slice.sealing.write().unwrap_or_else(PoisonError::into_inner) = true;
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        let mut w = RunWriter::new(&self.db, slice.start, id)?;
        if fold.merge {
            // The fold's table read in place (nothing writes it), merged with the
            // overlay and runs: memory's entry wins, a removal is left out.
            let table = read(&fold.mem);
            let mut memory = table.sorted().into_iter().peekable();
            for item in slice.range_over(Vec::new(), Bound::Unbounded, None) {
                let (k, v) = item?;
                let mut shadowed = false;
                while let Some((mk, mv)) = memory.next_if(|(mk, _)| *mk <= &k[..]) {
                    shadowed = mk == &k[..];
                    if !mv.is_empty() {
                        w.push(mk, mv)?;
                    }
                }
                if !shadowed {
                    w.push(&k, &v)?;
                }
            }
            for (k, v) in memory.filter(|(_, v)| !v.is_empty()) {
                w.push(k, v)?;
            }
        } else {
            for (k, v) in read(&fold.mem).sorted() {
                w.push(k, v)?;
            }
        }
        Ok(w.finish()?)
    }

    /// Before the install of a durable run of `fold`: removes from the slice's tree
    /// each key the fold holds in memory. Those entries are older than memory's, and
    /// once the run is found they would shadow it; until then memory shadows them,
    /// and after a crash the journal does (it keeps the fold's records until
    /// [`Slices::settle_memory`]).
    pub fn unshadow(&self, slice: &Slice, fold: &Fold) -> Result<(), StoreError> {
        // Most often empty: a slice holding records in memory writes none into its
        // tree (a store written before memory took the live writes has them there).
        if slice.tree.first()?.is_none() {
            return Ok(());
        }
        for key in read(&fold.mem).keys() {
            slice.tree.remove(key)?;
        }
        Ok(())
    }

    /// Makes a durable `run` of `fold` the slice's only run, in place of the runs it
    /// packed (a merge), or its newest (a spill); the caller makes this durable in
    /// turn. A slice dropped meanwhile drops the run instead.
    pub fn install(&self, slice: &Arc<Slice>, run: Run, fold: &Fold) -> Result<(), StoreError> {
        if !fold.merge {
            return self.add(slice, run);
        }
        let Some(old) = self.name_run(slice, run, true)? else { return Ok(()) };
        let _ = slice.overlay_writes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| Some(w.saturating_sub(fold.writes)));
        self.retired.lock().unwrap_or_else(PoisonError::into_inner).extend(old.iter().cloned());
        Ok(())
    }

    /// After [`Slices::install`] is durable: the fold's records leave memory (the run
    /// has them; later writes are in `mem`, newer), and the journal lets go of the
    /// chunks that held them. The table is freed with the fold, outside any lock.
    pub fn settle_memory(&self, slice: &Slice, fold: Fold) -> Result<(), StoreError> {
        let mut journal = self.journal.lock();
        let taken = {
            let mut frozen = slice.frozen.write().unwrap_or_else(PoisonError::into_inner);
            match &*frozen {
                Some(f) if Arc::ptr_eq(f, &fold.mem) => frozen.take(),
                _ => None,
            }
        };
        journal.folded(slice.start, fold.seq, false)?;
        drop(journal);
        drop((taken, fold));
        Ok(())
    }

    /// Writes `entries` (increasing record keys → values of records `slice` does not
    /// hold: a restore's, store/changelog/runs.rs) as a run of their own, without
    /// reading the slice's runs. Returns it, not yet durable, not yet found; the
    /// caller holds [`Packing`] and, once it is durable, [`Slices::add`]s it.
    ///
    /// An overlay entry of one of their keys is newer than the run and shadows it, a
    /// removal included: the restore held the record back as one the store did not
    /// hold, of a scope it held nothing of when the restore began, so any entry of its
    /// key was written since, by someone else (a move to a newer slice, a `forget`).
    pub fn write_run<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        slice: &Slice,
        entries: impl IntoIterator<Item = (K, V)>,
        _: &Packing,
    ) -> Result<Run, StoreError> {
        // A removal from now on leaves a tombstone: the record may be in this run.
        *slice.sealing.write().unwrap_or_else(PoisonError::into_inner) = true;
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        let mut w = RunWriter::new(&self.db, slice.start, id)?;
        for (k, v) in entries {
            w.push(k.as_ref(), v.as_ref())?;
        }
        Ok(w.finish()?)
    }

    /// Adds a durable `run` from [`Slices::write_run`] to the slice's runs, the
    /// newest (the caller makes this durable in turn). A slice dropped meanwhile
    /// drops the run instead.
    pub fn add(&self, slice: &Arc<Slice>, run: Run) -> Result<(), StoreError> {
        self.name_run(slice, run, false).map(drop)
    }

    /// Names `run` in the slice's meta entry and hands it to lookups: as its only run
    /// (`replace`, a seal's, in place of the runs it packed) or as its newest (a
    /// restore's). The caller holds [`Packing`], so the runs do not change meanwhile.
    /// The slice list stays locked for reading throughout: a slice dropped before
    /// drops the run instead (`None`), one dropped after takes it along. Returns the
    /// runs it replaced.
    fn name_run(&self, slice: &Arc<Slice>, run: Run, replace: bool) -> Result<Option<Arc<Vec<Arc<Run>>>>, StoreError> {
        let list = self.list.read().expect("slices lock");
        if !list.iter().any(|s| Arc::ptr_eq(s, slice)) {
            drop(list);
            run.drop_tree(&self.db)?;
            return Ok(None);
        }
        let kept = if replace { Vec::new() } else { slice.runs().to_vec() };
        let runs = Arc::new(kept.into_iter().chain([Arc::new(run)]).collect::<Vec<_>>());
        self.meta.insert(run_key(slice.start), run_entry(&runs))?;
        Ok(Some(slice.runs.swap(runs)))
    }

    /// After [`Slices::install`] is durable: removes from the slice's overlay each
    /// entry its runs answer the same for (a changed entry stays: it is newer),
    /// and drops replaced runs no reader holds. Returns the entries removed.
    pub fn settle(&self, slice: &Slice) -> Result<u64, StoreError> {
        self.drop_retired()?;
        if slice.run_count() == 0 {
            return Ok(0);
        }
        let mut removed = 0;
        for item in slice.tree.iter() {
            let (k, v) = item?;
            let packed = slice.find_in_runs(&Hashed::of(&k))?;
            let same = if v.is_empty() { packed.is_none() } else { packed.as_ref() == Some(&v) };
            if same && slice.tree.compare_and_swap(&k, Some(&v), None::<&[u8]>)?.is_ok() {
                removed += 1;
            }
        }
        slice.unsettled.store(false, Ordering::Relaxed);
        Ok(removed)
    }

    /// Writes `entries` (increasing record keys → values) into an empty slice made
    /// for them, as one packed run or one entry per record: a store made in bulk
    /// (store/scale.rs). The caller keeps the counts.
    #[cfg(any(test, feature = "internals"))]
    pub fn load(&self, slice: &Arc<Slice>, entries: Vec<(Vec<u8>, Vec<u8>)>, packed: bool) -> Result<(), StoreError> {
        if packed {
            let packing = slice.try_packing().expect("a slice made for a bulk load is packed by nobody else");
            let run = self.write_run(slice, entries, &packing)?;
            return self.add(slice, run);
        }
        for (k, v) in &entries {
            slice.insert_tree(k, v.as_slice())?;
        }
        Ok(())
    }

    /// Drops the trees of replaced runs that no reader holds any more.
    pub fn drop_retired(&self) -> Result<(), StoreError> {
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        let (free, held): (Vec<_>, Vec<_>) = retired.drain(..).partition(|r| Arc::strong_count(r) == 1);
        *retired = held;
        for run in free {
            run.drop_tree(&self.db)?;
        }
        Ok(())
    }
}

/// Keys a filling thread reads from a slice's overlay, and blocks from a run,
/// before it lets go of it (and of the database: a store being closed is not kept
/// open by its filling thread for longer).
const FILL_CHUNK: usize = 16_384;
const FILL_BLOCKS: usize = FILL_CHUNK / super::runs::BLOCK_RECORDS;

/// Reads every key of `slices`' overlays into their filters, and builds the filter
/// of each run that has none, a chunk at a time; stops when the store is closed. A
/// read that fails leaves that filter answering "maybe".
fn fill(slices: Vec<std::sync::Weak<Slice>>) {
    let started = std::time::Instant::now();
    let (mut keys, mut bytes) = (0, 0);
    for weak in slices {
        if let Err(error) = fill_overlay(&weak).and_then(|()| fill_run(&weak)) {
            tracing::warn!(%error, "reading a slice's keys for its lookup filter failed; lookups read the slice");
        }
        if let Some((k, b)) = weak.upgrade().map(|s| s.filter_size()) {
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

/// Adds the keys of the slice's overlay to its filter (tombstones too: a "maybe"
/// costs only a lookup). A key a seal moves into a new run meanwhile is in that
/// run's filter.
fn fill_overlay(weak: &std::sync::Weak<Slice>) -> Result<(), sled::Error> {
    let mut after: Option<sled::IVec> = None;
    loop {
        let Some(slice) = weak.upgrade() else { return Ok(()) };
        let from = after.take().map_or(Bound::Unbounded, Bound::Excluded);
        let mut read = 0;
        for key in slice.tree.range::<sled::IVec, _>((from, Bound::Unbounded)).keys() {
            let key = key?;
            slice.filter.add(&Hashed::of(&key));
            read += 1;
            if read == FILL_CHUNK {
                after = Some(key);
                break;
            }
        }
        if after.is_none() {
            slice.filter.set_filled();
            return Ok(());
        }
    }
}

/// Builds and stores the filter of each of the slice's runs that has none (a run
/// written before filters were stored). A newer seal meanwhile ends it: its run has one.
fn fill_run(weak: &std::sync::Weak<Slice>) -> Result<(), sled::Error> {
    let Some(slice) = weak.upgrade() else { return Ok(()) };
    let ids: Vec<u64> = slice.runs().iter().filter(|r| !r.has_filter()).map(|r| r.id).collect();
    drop(slice);
    for id in ids {
        let (mut filter, mut after) = (RunFilterBuilder::default(), None);
        loop {
            let run = weak.upgrade().and_then(|s| s.runs().iter().find(|r| r.id == id).cloned());
            let Some(run) = run else { break };
            after = run.each_key(after.as_deref(), FILL_BLOCKS, &mut |k| filter.push(k))?;
            if after.is_none() {
                run.set_filter(filter.finish())?;
                break;
            }
        }
    }
    Ok(())
}

/// Records per state of one slice, by reading it (only for a slice whose counts were lost).
fn count(slice: &Slice) -> Result<Counts, StoreError> {
    let counts = Counts::default();
    for item in slice.iter() {
        let (_, v) = item?;
        counts.moved(None, super::format::state(&v));
    }
    Ok(counts)
}

/// Debug builds only: a number from the environment variable `var`, for a test that
/// needs a bound smaller than any a store should run with. Release builds read nothing.
#[cfg(debug_assertions)]
fn debug_knob(var: &str) -> Option<u64> {
    std::env::var(var).ok()?.parse().ok()
}

#[cfg(not(debug_assertions))]
fn debug_knob(_var: &str) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::disk::record::State;

    const S: i64 = 1_000_000;

    /// A database in a new directory (kept while the test runs) and its meta tree.
    fn database() -> (tempfile::TempDir, sled::Db, sled::Tree) {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        let meta = db.open_tree("meta").unwrap();
        (dir, db, meta)
    }

    #[test]
    fn slices_are_made_as_time_passes_and_dropped_whole_after_the_retention() {
        let (_dir, db, meta) = database();
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

    /// Slices of a short retention hold a few seconds of records each: a table sized
    /// for `store.memory_records` would make all its pages resident for them.
    #[test]
    fn a_table_in_memory_is_sized_for_what_the_last_pack_took() {
        let (_dir, db, meta) = database();
        let slices = Slices::open(&db, &meta, Duration::from_secs(80)).unwrap();
        // Slices ending 10 s or more after the test runs: they take live writes into memory.
        let now = now_us() + 10 * S;
        let current = slices.current(now).unwrap();
        let key = |i: u64| [b"k".as_slice(), &i.to_be_bytes()].concat();
        current.insert(&key(0), b"v").unwrap();
        let first = current.mem().capacity();
        assert!((1..100).contains(&first), "in memory, sized for nothing packed yet: {first}");
        for i in 1..300 {
            current.insert(&key(i), b"v").unwrap();
        }
        let packing = current.try_packing().unwrap();
        let fold = slices.begin(&current, now, &packing).unwrap();
        let run = slices.pack(&current, &fold, &packing).unwrap();
        slices.install(&current, run, &fold).unwrap();
        slices.settle_memory(&current, fold).unwrap();
        let next = slices.current(now + 10 * S).unwrap();
        next.insert(&key(300), b"v").unwrap();
        let room = next.mem().capacity();
        assert!((300..1_000).contains(&room), "sized for the 300 packed: {room}");
    }

    #[test]
    fn an_older_record_gets_a_slice_that_does_not_overlap_newer_ones() {
        let (_dir, db, meta) = database();
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

    #[test]
    fn the_current_slice_is_sealed_each_time_its_overlay_holds_enough_records() {
        let (_dir, db, meta) = database();
        let slices = Slices { live_seal: 1_000, ..Slices::open(&db, &meta, Duration::from_secs(80)).unwrap() };
        let now = 1_000 * S + 1;
        let current = slices.current(now).unwrap();
        let key = |i: u64| [b"k".as_slice(), &i.to_be_bytes()].concat();
        let add = |from: u64, to: u64| {
            for i in from..to {
                current.insert(&key(i), b"v").unwrap();
                current.moved(None, Some(State::Done));
            }
        };
        add(0, 1_000 - 1);
        assert!(slices.to_seal(now).unwrap().is_empty(), "not yet");
        add(1_000 - 1, 1_000);
        assert_eq!(slices.to_seal(now).unwrap().len(), 1);
        let packing = current.try_packing().unwrap();
        let fold = slices.begin(&current, now, &packing).unwrap();
        let run = slices.pack(&current, &fold, &packing).unwrap();
        slices.install(&current, run, &fold).unwrap();
        slices.settle(&current).unwrap();
        slices.settle_memory(&current, fold).unwrap();
        assert_eq!((current.packing().0, current.overlay_len()), (1_000, 0));
        assert!(slices.to_seal(now).unwrap().is_empty(), "packed");
        // Reopened: the records beyond the run count, though no write since the open.
        add(1_000, 2 * 1_000);
        slices.persist().unwrap();
        drop((current, slices));
        let slices = Slices { live_seal: 1_000, ..Slices::open(&db, &meta, Duration::from_secs(80)).unwrap() };
        assert_eq!(slices.to_seal(now).unwrap().len(), 1);
        assert_eq!(slices.all()[0].len() as u64, 2 * 1_000);
    }

    /// A slice whose meta entry names a run that is not there (dropped by a build that
    /// knew one run per slice) is refused on open, not opened without its records.
    #[test]
    fn a_named_run_that_is_not_there_is_an_error_on_open() {
        let (_dir, db, meta) = database();
        let slices = Slices::open(&db, &meta, Duration::from_secs(80)).unwrap();
        let slice = slices.current(1_000 * S).unwrap();
        for k in [b"a", b"b"] {
            let run = slices.write_run(&slice, [(k, b"v")], &slice.try_packing().unwrap()).unwrap();
            slices.add(&slice, run).unwrap();
        }
        let second = slice.runs()[1].id;
        assert_eq!(slice.get(b"b").unwrap().as_deref(), Some(&b"v"[..]));
        drop((slice, slices));
        assert!(Slices::open(&db, &meta, Duration::from_secs(80)).is_ok());
        db.drop_tree(runs::tree_name(1_000 * S, second)).unwrap();
        let Err(e) = Slices::open(&db, &meta, Duration::from_secs(80)) else { panic!("opened without its run") };
        assert!(e.to_string().contains("not there"), "{e}");
    }

    /// A seeded model test: random writes, removals, reads and scans of one slice,
    /// with seals and a restore's added runs cut at each of their steps, writes
    /// between the steps, and reopens (a crash: every step is written before the
    /// next begins), checked against a plain map after every operation. Of a slice
    /// past its time (its writes go to its tree) ...
    #[test]
    fn a_slice_answers_as_a_map_through_seals_cut_anywhere_and_reopens() {
        slice_model(1_000 * S, Duration::from_secs(80), RESEAL_WRITES);
    }

    /// ... and of the current slice (its writes go to memory and the journal), with
    /// spills of its records in memory as well as merges.
    #[test]
    fn the_current_slice_answers_as_a_map_through_seals_and_spills_cut_anywhere_and_reopens() {
        let retention = Duration::from_secs(8 * 3_600);
        let width = width_for(retention).as_micros() as i64;
        let now = now_us();
        slice_model(now - now % width, retention, 50);
    }

    fn slice_model(t0: i64, retention: Duration, live_seal: u64) {
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;
        let (_dir, db, meta) = database();
        let open = || Slices { live_seal, ..Slices::open(&db, &meta, retention).unwrap() };
        let now = || if t0 == 1_000 * S { t0 } else { now_us() };
        let mut slices = open();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let key = |i: u32| [b"k".as_slice(), &i.to_be_bytes()].concat();
        const KEYS: u32 = 4_000;
        // Every key ever written or removed: a restore's run takes only others (keys of
        // a scope the store held nothing of when it began).
        let mut ever = std::collections::BTreeSet::new();
        let check = |slices: &Slices, model: &BTreeMap<Vec<u8>, Vec<u8>>, rng: &mut rand::rngs::StdRng| {
            let slice = slices.get(t0).unwrap();
            for _ in 0..20 {
                let k = key(rng.random_range(0..KEYS));
                assert_eq!(slice.get(&k).unwrap().map(|v| v.to_vec()), model.get(&k).cloned(), "{k:?}");
            }
            let from = key(rng.random_range(0..KEYS));
            let got: Vec<_> = slice.range_from(Bound::Excluded(from.clone())).take(50).map(|e| e.unwrap()).collect();
            let want: Vec<_> = model.range((Bound::Excluded(from), Bound::Unbounded)).take(50).collect();
            assert_eq!(got.len(), want.len());
            assert!(got.iter().zip(want).all(|((a, b), (c, d))| a.as_ref() == c.as_slice() && b.as_ref() == d.as_slice()));
            assert_eq!(slice.iter().count(), model.len());
            let prefix = [b"k".as_slice(), &[0, 0, 1]].concat();
            let scanned = slice.scan_prefix(&prefix).count();
            assert_eq!(scanned, model.keys().filter(|k| k.starts_with(&prefix)).count());
        };
        // A write or a removal between two steps of a seal or of an added run.
        let between = |slice: &Slice, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, k: Vec<u8>, remove: bool| {
            if remove {
                slice.remove(&k).unwrap();
                model.remove(&k);
            } else {
                slice.insert(&k, b"between").unwrap();
                model.insert(k, b"between".to_vec());
            }
        };
        slices.current(t0).unwrap();
        let mut most_runs = 0;
        let mut spills = 0;
        for round in 0..300 {
            let slice = slices.get(t0).unwrap();
            for _ in 0..rng.random_range(0..40) {
                let k = key(rng.random_range(0..KEYS));
                ever.insert(k.clone());
                if rng.random_bool(0.3) {
                    slice.remove(&k).unwrap();
                    model.remove(&k);
                } else {
                    let v = format!("v{round}-{}", rng.random::<u16>()).into_bytes();
                    slice.insert(&k, &v).unwrap();
                    model.insert(k, v);
                }
            }
            check(&slices, &model, &mut rng);
            // A seal, cut after a random step (0: none), with writes between its steps.
            let steps = rng.random_range(0..4);
            let mut packed = None;
            let mut installed = None;
            for step in 1..=steps {
                match step {
                    1 => {
                        let packing = slice.try_packing().unwrap();
                        let fold = slices.begin(&slice, now(), &packing).unwrap();
                        spills += usize::from(!fold.merge);
                        packed = Some((slices.pack(&slice, &fold, &packing).unwrap(), fold));
                    }
                    2 => {
                        let (run, fold) = packed.take().unwrap();
                        slices.unshadow(&slice, &fold).unwrap();
                        slices.install(&slice, run, &fold).unwrap();
                        installed = Some(fold);
                    }
                    _ => {
                        slices.settle(&slice).unwrap();
                        slices.settle_memory(&slice, installed.take().unwrap()).unwrap();
                    }
                }
                let k = key(rng.random_range(0..KEYS));
                ever.insert(k.clone());
                let remove = rng.random_bool(0.5);
                between(&slice, &mut model, k, remove);
                check(&slices, &model, &mut rng);
            }
            // A restore's run of records the slice never held, cut after a random step,
            // with writes between: a write of one of its keys is newer and shadows it (a
            // removal of one before the add would be of a record the store does not hold).
            let steps = if rng.random_bool(0.4) { rng.random_range(1..3) } else { 0 };
            // The run written and its entries, until it is added.
            type Written = (Run, Vec<(Vec<u8>, Vec<u8>)>);
            let mut added: Option<Written> = None;
            let mut touched = std::collections::BTreeSet::new();
            for step in 1..=steps {
                if step == 1 {
                    let fresh: std::collections::BTreeSet<Vec<u8>> =
                        (0..rng.random_range(1..60)).map(|_| key(rng.random_range(0..KEYS))).filter(|k| !ever.contains(k)).collect();
                    ever.extend(fresh.iter().cloned());
                    let entries: Vec<_> = fresh.into_iter().map(|k| (k, format!("r{round}").into_bytes())).collect();
                    let run = slices.write_run(&slice, entries.clone(), &slice.try_packing().unwrap()).unwrap();
                    added = Some((run, entries));
                } else {
                    let (run, entries) = added.take().unwrap();
                    slices.add(&slice, run).unwrap();
                    for (k, v) in entries.into_iter().filter(|(k, _)| !touched.contains(k)) {
                        model.insert(k, v);
                    }
                }
                let k = key(rng.random_range(0..KEYS));
                ever.insert(k.clone());
                touched.insert(k.clone());
                let in_run = added.as_ref().is_some_and(|(_, e)| e.iter().any(|(ek, _)| *ek == k));
                // A removal needs a record to remove: the run's key once written since.
                let remove = (!in_run || model.contains_key(&k)) && rng.random_bool(0.5);
                between(&slice, &mut model, k, remove);
                check(&slices, &model, &mut rng);
            }
            most_runs = most_runs.max(slice.run_count());
            if rng.random_bool(0.2) {
                drop(slice);
                drop(packed);
                drop(installed);
                drop(added);
                if rng.random_bool(0.3) {
                    // As a run written before filters were stored: the filling thread builds one.
                    db.open_tree(runs::FILTERS_TREE).unwrap().clear().unwrap();
                }
                // What a group commit would have made durable: the writes in memory too.
                slices.journal().unwrap();
                slices = open();
                slices.fill_filters();
                check(&slices, &model, &mut rng);
                // Once filled, a filter's "absent" is trusted: every key must be in it.
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while !slices.filters_filled() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(slices.filters_filled());
                check(&slices, &model, &mut rng);
            }
        }
        // Runs nobody installed, and replaced ones, are gone once reopened.
        drop(slices);
        let slices = open();
        let runs = db.tree_names().into_iter().filter(|n| runs::is_run_tree(n)).count();
        let slice = slices.get(t0).unwrap();
        assert_eq!(slice.run_count(), runs, "{runs} run trees");
        assert!(most_runs > 1, "the test reached a slice of several runs");
        let filters = db.open_tree(runs::FILTERS_TREE).unwrap().len();
        assert!(filters <= runs, "{filters} stored filters for {runs} runs: none left behind");
        if t0 != 1_000 * S {
            assert!(spills > 0, "the test spilled records from memory");
        }
    }
}
