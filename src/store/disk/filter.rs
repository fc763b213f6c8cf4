//! The lookup filters of a slice: which record keys it may hold, so that a
//! lookup of an id the slice has never seen (every new event, in every retained
//! slice) touches no sled page. A key is hashed once per lookup ([`Hashed`]) and
//! the same hash probes every slice's filters.
//!
//! Two kinds, answering "maybe" for some absent keys (those cost the sled lookup
//! they would have cost anyway) and never "absent" for a present key (that would
//! run an event again):
//!
//! - [`RunFilter`], a packed run's (store/disk/runs.rs): binary fuse filters built
//!   once from the run's keys as the run is written, one per [`SHARD_KEYS`] keys
//!   so that building them needs little memory, exact in size (about 9 bits a
//!   key, under 0.4% false positives), and stored beside the run, so a start
//!   loads them instead of reading every key.
//! - [`KeyFilter`], a slice's overlay's (the records written since its last
//!   seal): a Bloom filter that grows as keys arrive. Every write into an overlay,
//!   tombstones included, goes through [`super::slices::Slice::insert`] or
//!   [`super::slices::Slice::remove`], which add the key here *before* writing the
//!   tree (a lookup between the two finds "maybe" and reads the tree). An overlay
//!   opened with records answers "maybe" until a thread of the service has read
//!   its keys ([`super::slices::Slices::fill_filters`]). Removals leave the key in
//!   it: a stale "maybe" only costs a lookup.
//!
//! Memory: about 1.2 bytes per key at 1% false positives for an overlay's filter
//! ([`KeyFilter::bytes`] is what it holds now), 1.1 bytes per key for a run's, so
//! ten million retained records cost about 12 MB.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use growable_bloom_filter::{GrowableBloom, GrowableBloomBuilder};
use xorf::{BinaryFuse8, BinaryFuse8Ref, DmaSerializable, Filter, FilterRef};

use super::varint::{put_bytes, put_u64, Reader};

/// A record key and its hash, computed once for all the slices a lookup probes.
#[derive(Debug, Clone, Copy)]
pub struct Hashed<'a> {
    pub key: &'a [u8],
    pub hash: u64,
}

impl<'a> Hashed<'a> {
    pub fn of(key: &'a [u8]) -> Hashed<'a> {
        Hashed { key, hash: hash(key) }
    }
}

/// The hash filters are built from and probed with: xxh3, seed 0. Persisted run
/// filters depend on it: changing it is a change of [`RUN_FILTER_VERSION`].
pub fn hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The share of absent keys the filter answers "maybe" for.
pub const FALSE_POSITIVES: f64 = 0.01;
/// Keys the first step of the filter holds; it grows by [`GROWTH`] each time it fills.
const FIRST_STEP: usize = 65_536;
const GROWTH: usize = 4;
/// Bits per key of a Bloom filter at [`FALSE_POSITIVES`] (k = log2(1/p) bits per
/// key per slice, over ln 2), for [`KeyFilter::bytes`]; later steps are a little
/// tighter, which the estimate leaves out.
const BITS_PER_KEY: f64 = 9.6;

pub struct KeyFilter {
    bloom: RwLock<GrowableBloom>,
    /// Every key of the slice's tree has been added: only now may it answer "absent".
    filled: AtomicBool,
    /// A key has been added. Most slices' overlays never take one (the current slice
    /// keeps its records in memory), and a lookup of those takes no lock.
    added: AtomicBool,
}

impl KeyFilter {
    /// For a slice whose tree is empty now: every key it will hold goes through `add`.
    pub fn filled() -> KeyFilter {
        KeyFilter { bloom: RwLock::new(new_bloom()), filled: AtomicBool::new(true), added: AtomicBool::new(false) }
    }

    /// For a slice that may hold keys already, about `keys` of them: "maybe" for
    /// every key until [`KeyFilter::set_filled`]. Sized for them in one step (each
    /// further step is one more check per lookup, and memory the first did not need).
    pub fn unfilled(keys: usize) -> KeyFilter {
        KeyFilter { bloom: RwLock::new(bloom_for(keys)), filled: AtomicBool::new(false), added: AtomicBool::new(false) }
    }

    /// Every key the slice's tree held when it was opened has been added (by
    /// [`KeyFilter::add`], as the keys written since): from now on the filter
    /// answers "absent" too.
    pub fn set_filled(&self) {
        self.filled.store(true, Ordering::Release);
    }

    /// Whether it has every key of its slice (made filled, or [`KeyFilter::set_filled`]).
    pub fn is_filled(&self) -> bool {
        self.filled.load(Ordering::Acquire)
    }

    /// A key about to be written into the slice's tree.
    pub fn add(&self, key: &Hashed) {
        if !self.added.load(Ordering::Relaxed) {
            self.added.store(true, Ordering::Release);
        }
        self.write().insert(key.hash);
    }

    /// False only if the slice's tree does not hold `key`.
    pub fn may_contain(&self, key: &Hashed) -> bool {
        if !self.is_filled() {
            return true;
        }
        self.added.load(Ordering::Acquire) && self.read().contains(key.hash)
    }

    /// Keys added so far (about: a key it already answered "maybe" for is not counted).
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// About the memory the filter holds now, in bytes.
    pub fn bytes(&self) -> usize {
        (self.read().capacity() as f64 * BITS_PER_KEY / 8.0) as usize
    }

    // A poisoned lock only means a panic happened while it was held. A panic in `add`
    // never reaches the tree: `Slice::insert` writes it only after `add` returned.
    fn read(&self) -> RwLockReadGuard<'_, GrowableBloom> {
        self.bloom.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, GrowableBloom> {
        self.bloom.write().unwrap_or_else(PoisonError::into_inner)
    }
}

fn new_bloom() -> GrowableBloom {
    bloom_for(0)
}

fn bloom_for(keys: usize) -> GrowableBloom {
    GrowableBloomBuilder::new()
        .estimated_insertions(FIRST_STEP.max(keys))
        .desired_error_ratio(FALSE_POSITIVES)
        .growth_factor(GROWTH)
        .build()
}

/// The layout of a persisted [`RunFilter`]: [`hash`] of each key; per shard, in key
/// order, its last key (a varint length and the bytes), the length of its
/// fingerprints (a varint) and a `BinaryFuse8` of xorf 0.12 (its descriptor, then
/// its fingerprints). A value of another version is not used: the run's filter is
/// built again from its keys. Version 1 (one filter for the whole run, no last key)
/// is still read, as one shard without a bound.
const RUN_FILTER_VERSION: u8 = 2;
const RUN_FILTER_V1: u8 = 1;
const DESCRIPTOR_LEN: usize = <BinaryFuse8 as DmaSerializable>::DESCRIPTOR_LEN;

/// Keys per shard of a run's filter. Building a shard holds its keys' hashes (8
/// bytes a key) and xorf's construction (about 25 bytes a key) until the shard is
/// done, so a run of any size is filtered with at most about 35 MB of transient
/// memory (a 15M-record slice at once took about 500 MB). A lookup still probes one
/// shard: the one whose key range holds its key. Smaller shards would cost more
/// last keys to search and store and nothing else; larger ones more transient memory.
pub const SHARD_KEYS: usize = 1 << 20;

/// A packed run's filter: exact in size, immutable, built from every key of the
/// run in key order, one `BinaryFuse8` per [`SHARD_KEYS`] keys.
pub struct RunFilter {
    /// In key order; none: the run has no key.
    shards: Vec<Shard>,
}

/// The filter of consecutive keys of a run, up to and including `last`; `None`:
/// up to the end (a version-1 filter's only shard).
struct Shard {
    last: Option<Box<[u8]>>,
    fuse: Fuse,
}

/// A `BinaryFuse8` as its parts, read through `BinaryFuse8Ref` (what xorf offers
/// for a filter kept as bytes).
struct Fuse {
    descriptor: [u8; DESCRIPTOR_LEN],
    fingerprints: Box<[u8]>,
}

impl Fuse {
    /// Of `hashes` (in any order, repeats allowed; left sorted).
    fn build(hashes: &mut Vec<u64>) -> Result<Fuse, String> {
        hashes.sort_unstable();
        hashes.dedup();
        let fuse = BinaryFuse8::try_from(hashes.as_slice()).map_err(|e| format!("building a run's lookup filter: {e}"))?;
        let mut descriptor = [0; DESCRIPTOR_LEN];
        fuse.dma_copy_descriptor_to(&mut descriptor);
        Ok(Fuse { descriptor, fingerprints: fuse.dma_fingerprints().into() })
    }

    fn contains(&self, hash: u64) -> bool {
        BinaryFuse8Ref::from_dma(&self.descriptor, &self.fingerprints).contains(&hash)
    }
}

impl RunFilter {
    /// False only if the run does not hold `key`.
    pub fn may_contain(&self, key: &Hashed) -> bool {
        // The first shard whose last key is not below the key; past the last one the run holds nothing.
        let i = self.shards.partition_point(|s| s.last.as_deref().is_some_and(|last| last < key.key));
        self.shards.get(i).is_some_and(|s| s.fuse.contains(key.hash))
    }

    /// Its memory, in bytes.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| DESCRIPTOR_LEN + s.fuse.fingerprints.len() + s.last.as_ref().map_or(0, |l| l.len())).sum()
    }

    /// The persisted form (see [`RUN_FILTER_VERSION`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![RUN_FILTER_VERSION];
        for s in &self.shards {
            put_bytes(&mut out, s.last.as_deref().unwrap_or_default());
            put_u64(&mut out, s.fuse.fingerprints.len() as u64);
            out.extend_from_slice(&s.fuse.descriptor);
            out.extend_from_slice(&s.fuse.fingerprints);
        }
        out
    }

    /// A persisted filter; `None` for another version or a value that is not one.
    pub fn decode(v: &[u8]) -> Option<RunFilter> {
        let (&version, rest) = v.split_first()?;
        let fuse = |r: &mut Reader, len: usize| -> Option<Fuse> {
            let descriptor = r.0.get(..DESCRIPTOR_LEN)?.try_into().ok()?;
            let fingerprints = r.0.get(DESCRIPTOR_LEN..DESCRIPTOR_LEN + len)?.into();
            r.0 = &r.0[DESCRIPTOR_LEN + len..];
            Some(Fuse { descriptor, fingerprints })
        };
        let mut r = Reader(rest);
        let mut shards = Vec::new();
        match version {
            RUN_FILTER_V1 if rest.is_empty() => {}
            RUN_FILTER_V1 => {
                let len = rest.len().checked_sub(DESCRIPTOR_LEN).filter(|n| *n > 0)?;
                shards.push(Shard { last: None, fuse: fuse(&mut r, len)? });
            }
            RUN_FILTER_VERSION => {
                while !r.is_empty() {
                    let last = r.bytes()?.into();
                    let len = usize::try_from(r.u64()?).ok().filter(|n| *n > 0)?;
                    shards.push(Shard { last: Some(last), fuse: fuse(&mut r, len)? });
                }
            }
            _ => return None,
        }
        Some(RunFilter { shards })
    }
}

/// Builds a [`RunFilter`] from a run's keys as they are written or read, in
/// increasing order, a shard at a time.
pub struct RunFilterBuilder {
    shard_keys: usize,
    /// Of the keys pushed since the last shard was built.
    hashes: Vec<u64>,
    last: Vec<u8>,
    shards: Vec<Shard>,
    /// A shard could not be built (xorf gives up only on keys it cannot tell apart).
    failed: Option<String>,
}

impl Default for RunFilterBuilder {
    fn default() -> Self {
        RunFilterBuilder::with_shard_keys(SHARD_KEYS)
    }
}

impl RunFilterBuilder {
    fn with_shard_keys(shard_keys: usize) -> RunFilterBuilder {
        RunFilterBuilder { shard_keys, hashes: Vec::new(), last: Vec::new(), shards: Vec::new(), failed: None }
    }

    /// The next key of the run: above every key pushed before.
    pub fn push(&mut self, key: &[u8]) {
        // Record keys are never empty: an empty `last` means nothing was pushed yet.
        debug_assert!(self.last.is_empty() || key > self.last.as_slice(), "keys in increasing order");
        self.last.clear();
        self.last.extend_from_slice(key);
        if self.failed.is_some() {
            return;
        }
        self.hashes.push(hash(key));
        if self.hashes.len() == self.shard_keys {
            self.end_shard();
        }
    }

    /// The last key pushed (empty before the first).
    pub fn last(&self) -> &[u8] {
        &self.last
    }

    fn end_shard(&mut self) {
        match Fuse::build(&mut self.hashes) {
            Ok(fuse) => self.shards.push(Shard { last: Some(self.last.as_slice().into()), fuse }),
            Err(e) => self.failed = Some(e),
        }
        self.hashes.clear();
    }

    /// The filter of every key pushed; an error if a shard could not be built.
    pub fn finish(mut self) -> Result<RunFilter, String> {
        if !self.hashes.is_empty() && self.failed.is_none() {
            self.end_shard();
        }
        match self.failed {
            Some(e) => Err(e),
            None => Ok(RunFilter { shards: self.shards }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Vec<u8> {
        [b"k".as_slice(), &i.to_be_bytes()].concat()
    }

    fn has(f: &KeyFilter, i: u64) -> bool {
        f.may_contain(&Hashed::of(&key(i)))
    }

    #[test]
    fn a_key_added_is_never_reported_absent_and_most_others_are() {
        let f = KeyFilter::filled();
        assert!(!has(&f, 0), "no key added: absent");
        for i in 0..200_000 {
            f.add(&Hashed::of(&key(i)));
        }
        assert!((0..200_000).all(|i| has(&f, i)), "no false negative, across growth steps");
        let maybe = (1_000_000..1_100_000).filter(|i| has(&f, *i)).count();
        assert!(maybe < 3_000, "{maybe} of 100000 absent keys answered maybe");
        // A key the filter already answered "maybe" for is not counted again.
        assert!(f.len() > 195_000 && f.len() <= 200_000, "{}", f.len());
        assert!(f.bytes() > 200_000 && f.bytes() < 2_000_000, "{} bytes", f.bytes());
    }

    #[test]
    fn an_unfilled_filter_answers_maybe_until_it_has_every_key() {
        let f = KeyFilter::unfilled(0);
        f.add(&Hashed::of(&key(1))); // written while the fill runs
        assert!(has(&f, 7), "not filled: it cannot know");
        f.add(&Hashed::of(&key(2)));
        f.add(&Hashed::of(&key(3)));
        f.set_filled();
        assert!([1, 2, 3].iter().all(|i| has(&f, *i)));
        assert!(!has(&f, 7) || !has(&f, 8), "filled: absent keys are answered absent");
    }

    fn run_filter(keys: impl IntoIterator<Item = u64>, shard_keys: usize) -> RunFilter {
        let mut b = RunFilterBuilder::with_shard_keys(shard_keys);
        keys.into_iter().for_each(|i| b.push(&key(i)));
        b.finish().unwrap()
    }

    #[test]
    fn a_run_filter_has_every_key_answers_most_others_absent_and_survives_its_bytes() {
        for (n, shard_keys) in [(0u64, 10), (1, 10), (2, 10), (3, 10), (63, 10), (64, 64), (65, 64), (1_000, 1_000), (100_000, 30_000)] {
            // Keys in order, every other one, so that absent keys fall inside every shard's range too.
            let f = run_filter((0..n).map(|i| i * 2), shard_keys);
            let back = RunFilter::decode(&f.encode()).unwrap();
            assert_eq!(f.shards.len() as u64, n.div_ceil(shard_keys as u64), "{n}");
            for g in [&f, &back] {
                assert!((0..n).all(|i| g.may_contain(&Hashed::of(&key(i * 2)))), "{n}: no false negative");
                let maybe = (0..n).filter(|i| g.may_contain(&Hashed::of(&key(i * 2 + 1)))).count() as u64;
                assert!(maybe <= 3 + n / 100, "{n}: {maybe} of {n} absent keys between present ones answered maybe");
                let above = (1_000_000..1_100_000).filter(|i| g.may_contain(&Hashed::of(&key(*i)))).count();
                assert_eq!(above, 0, "{n}: a key above the run's last is absent without a probe");
            }
            assert!(f.bytes() as u64 <= (64 + 16) * f.shards.len() as u64 + n * 3 / 2, "{n} keys, {} bytes", f.bytes());
        }
        assert!(RunFilter::decode(&[RUN_FILTER_VERSION + 1, 1, 2]).is_none(), "another version is not used");
        assert!(RunFilter::decode(&[RUN_FILTER_VERSION, 1, 2]).is_none(), "too short");
        assert!(RunFilter::decode(&[RUN_FILTER_V1, 1, 2]).is_none(), "too short");
    }

    #[test]
    fn a_version_1_filter_of_a_store_written_before_shards_is_read_as_one_shard() {
        let mut hashes: Vec<u64> = (0..5_000).map(|i| hash(&key(i * 2))).collect();
        let fuse = Fuse::build(&mut hashes).unwrap();
        let v1 = [[RUN_FILTER_V1].as_slice(), &fuse.descriptor, &fuse.fingerprints].concat();
        let f = RunFilter::decode(&v1).unwrap();
        assert!((0..5_000).all(|i| f.may_contain(&Hashed::of(&key(i * 2)))), "no false negative");
        let maybe = (0..5_000).filter(|i| f.may_contain(&Hashed::of(&key(i * 2 + 1)))).count();
        assert!(maybe < 100, "{maybe} of 5000 absent keys answered maybe");
        assert!(RunFilter::decode(&[RUN_FILTER_V1]).unwrap().shards.is_empty(), "an empty run's");
    }

    /// Persisted filters are read by the layout and hash they were written with: a
    /// new version of either (a crate update) must change [`RUN_FILTER_VERSION`].
    #[test]
    fn the_persisted_run_filter_layout_is_the_one_it_was() {
        let bytes = run_filter(0..5_000, 2_000).encode();
        assert_eq!((bytes.len(), hash(&bytes)), (7_137, 7_227_351_052_421_871_801), "the layout of RUN_FILTER_VERSION changed");
    }
}
