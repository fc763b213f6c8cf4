//! The negative-lookup filter of one slice: a Bloom filter of the record keys
//! written into the slice's tree, so that a lookup of an id the slice has never
//! seen (every new event, in every retained slice) touches no sled page.
//!
//! It may answer "maybe" for a key that is absent (about [`FALSE_POSITIVES`] of
//! absent keys: those cost the sled lookup they would have cost anyway), and
//! must never answer "absent" for a key that is present: that would run an
//! event again. So every write of a record key into a slice goes through
//! [`super::slices::Slice::insert`], which adds the key here *before* it writes
//! the tree (a lookup between the two finds "maybe" and reads the tree), and a
//! slice opened with records answers "maybe" until a thread of the service has
//! read every key it holds ([`super::slices::Slices::fill_filters`]). Removals
//! leave the key in the filter: a stale "maybe" only costs a lookup.
//!
//! Memory: about 1.2 bytes per key of the slice at 1% false positives (the filter
//! grows in steps as keys arrive; [`KeyFilter::bytes`] is what it holds now), so
//! a million retained records cost about 1.5 MB.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use growable_bloom_filter::{GrowableBloom, GrowableBloomBuilder};

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
    pub fn add(&self, key: &[u8]) {
        self.write().insert(key);
    }

    /// False only if the slice's tree does not hold `key`.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        !self.is_filled() || self.read().contains(key)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Vec<u8> {
        [b"k".as_slice(), &i.to_be_bytes()].concat()
    }

    #[test]
    fn a_key_added_is_never_reported_absent_and_most_others_are() {
        let f = KeyFilter::filled();
        for i in 0..200_000 {
            f.add(&key(i));
        }
        assert!((0..200_000).all(|i| f.may_contain(&key(i))), "no false negative, across growth steps");
        let maybe = (1_000_000..1_100_000).filter(|i| f.may_contain(&key(*i))).count();
        assert!(maybe < 3_000, "{maybe} of 100000 absent keys answered maybe");
        // A key the filter already answered "maybe" for is not counted again.
        assert!(f.len() > 195_000 && f.len() <= 200_000, "{}", f.len());
        assert!(f.bytes() > 200_000 && f.bytes() < 2_000_000, "{} bytes", f.bytes());
    }

    #[test]
    fn an_unfilled_filter_answers_maybe_until_it_has_every_key() {
        let f = KeyFilter::unfilled(0);
        f.add(&key(1)); // written while the fill runs
        assert!(f.may_contain(&key(7)), "not filled: it cannot know");
        f.add(&key(2));
        f.add(&key(3));
        f.set_filled();
        assert!([1, 2, 3].iter().all(|i| f.may_contain(&key(*i))));
        assert!(!f.may_contain(&key(7)) || !f.may_contain(&key(8)), "filled: absent keys are answered absent");
    }
}
