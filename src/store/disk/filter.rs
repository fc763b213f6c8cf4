//! The lookup filters of a slice: which record keys it may hold, so that a
//! lookup of an id the slice has never seen (every new event, in every retained
//! slice) touches no sled page. A key is hashed once per lookup ([`Hashed`]) and
//! the same hash probes every slice's filters.
//!
//! Two kinds, answering "maybe" for some absent keys (those cost the sled lookup
//! they would have cost anyway) and never "absent" for a present key (that would
//! run an event again):
//!
//! - [`RunFilter`], a packed run's (store/disk/runs.rs): a binary fuse filter built
//!   once from the run's keys when the run is written, exact in size (about 9
//!   bits a key, under 0.4% false positives), and stored beside the run, so a
//!   start loads it instead of reading every key.
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
}

impl KeyFilter {
    /// For a slice whose tree is empty now: every key it will hold goes through `add`.
    pub fn filled() -> KeyFilter {
        KeyFilter { bloom: RwLock::new(new_bloom()), filled: AtomicBool::new(true) }
    }

    /// For a slice that may hold keys already, about `keys` of them: "maybe" for
    /// every key until [`KeyFilter::set_filled`]. Sized for them in one step (each
    /// further step is one more check per lookup, and memory the first did not need).
    pub fn unfilled(keys: usize) -> KeyFilter {
        KeyFilter { bloom: RwLock::new(bloom_for(keys)), filled: AtomicBool::new(false) }
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
        self.write().insert(key.hash);
    }

    /// False only if the slice's tree does not hold `key`.
    pub fn may_contain(&self, key: &Hashed) -> bool {
        !self.is_filled() || self.read().contains(key.hash)
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

/// The layout of a persisted [`RunFilter`]: [`hash`] of each key, a `BinaryFuse8` of
/// xorf 0.12 (its descriptor, then its fingerprints). A value of another version is
/// not used: the run's filter is built again from its keys.
const RUN_FILTER_VERSION: u8 = 1;
const DESCRIPTOR_LEN: usize = <BinaryFuse8 as DmaSerializable>::DESCRIPTOR_LEN;

/// A packed run's filter: exact in size, immutable, built from every key of the run.
pub struct RunFilter {
    /// `None`: the run has no key.
    fuse: Option<Fuse>,
}

/// A `BinaryFuse8` as its parts, read through `BinaryFuse8Ref` (what xorf offers
/// for a filter kept as bytes).
struct Fuse {
    descriptor: [u8; DESCRIPTOR_LEN],
    fingerprints: Box<[u8]>,
}

impl RunFilter {
    /// The filter of the keys whose hashes are `hashes` (in any order, repeats allowed).
    pub fn build(mut hashes: Vec<u64>) -> Result<RunFilter, String> {
        if hashes.is_empty() {
            return Ok(RunFilter { fuse: None });
        }
        hashes.sort_unstable();
        hashes.dedup();
        let fuse = BinaryFuse8::try_from(&hashes).map_err(|e| format!("building a run's lookup filter: {e}"))?;
        let mut descriptor = [0; DESCRIPTOR_LEN];
        fuse.dma_copy_descriptor_to(&mut descriptor);
        Ok(RunFilter { fuse: Some(Fuse { descriptor, fingerprints: fuse.dma_fingerprints().into() }) })
    }

    /// False only if the run does not hold `key`.
    pub fn may_contain(&self, key: &Hashed) -> bool {
        match &self.fuse {
            Some(f) => BinaryFuse8Ref::from_dma(&f.descriptor, &f.fingerprints).contains(&key.hash),
            None => false,
        }
    }

    /// Its memory, in bytes.
    pub fn bytes(&self) -> usize {
        self.fuse.as_ref().map_or(0, |f| DESCRIPTOR_LEN + f.fingerprints.len())
    }

    /// The persisted form (see [`RUN_FILTER_VERSION`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![RUN_FILTER_VERSION];
        if let Some(f) = &self.fuse {
            out.extend_from_slice(&f.descriptor);
            out.extend_from_slice(&f.fingerprints);
        }
        out
    }

    /// A persisted filter; `None` for another version or a value too short to be one.
    pub fn decode(v: &[u8]) -> Option<RunFilter> {
        match v.split_first()? {
            (&RUN_FILTER_VERSION, []) => Some(RunFilter { fuse: None }),
            (&RUN_FILTER_VERSION, rest) if rest.len() > DESCRIPTOR_LEN => {
                let (descriptor, fingerprints) = rest.split_at(DESCRIPTOR_LEN);
                let descriptor = descriptor.try_into().ok()?;
                Some(RunFilter { fuse: Some(Fuse { descriptor, fingerprints: fingerprints.into() }) })
            }
            _ => None,
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

    #[test]
    fn a_run_filter_has_every_key_answers_most_others_absent_and_survives_its_bytes() {
        for n in [0u64, 1, 2, 3, 63, 64, 65, 1_000, 100_000] {
            let hashes: Vec<u64> = (0..n).map(|i| hash(&key(i))).collect();
            let mut repeated = hashes.clone();
            repeated.extend(hashes.iter().take(10));
            let f = RunFilter::build(repeated).unwrap();
            let back = RunFilter::decode(&f.encode()).unwrap();
            for g in [&f, &back] {
                assert!((0..n).all(|i| g.may_contain(&Hashed::of(&key(i)))), "{n}: no false negative");
                let maybe = (1_000_000..1_100_000).filter(|i| g.may_contain(&Hashed::of(&key(*i)))).count();
                assert!(maybe < 1_000, "{n}: {maybe} of 100000 absent keys answered maybe");
            }
            assert!(f.bytes() as u64 <= 64 + n * 3 / 2, "{n} keys, {} bytes", f.bytes());
        }
        assert!(RunFilter::decode(&[RUN_FILTER_VERSION + 1, 1, 2]).is_none(), "another version is not used");
        assert!(RunFilter::decode(&[RUN_FILTER_VERSION, 1, 2]).is_none(), "too short");
    }

    /// Persisted filters are read by the layout and hash they were written with: a
    /// new version of either (a crate update) must change [`RUN_FILTER_VERSION`].
    #[test]
    fn the_persisted_run_filter_layout_is_the_one_it_was() {
        let hashes: Vec<u64> = (0..5_000).map(|i| hash(&key(i))).collect();
        let bytes = RunFilter::build(hashes).unwrap().encode();
        assert_eq!((bytes.len(), hash(&bytes)), (6_677, 144_451_989_068_167_567), "the layout of RUN_FILTER_VERSION changed");
    }
}
