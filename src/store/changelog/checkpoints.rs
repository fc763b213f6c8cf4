//! The store's changelog state: the sink once attached, and the checkpoints of the
//! changelog partitions it holds records of.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustc_hash::FxHashMap;

use super::sink::Sink;
use crate::store::error::StoreError;

/// Meta key: present (`[1]`) when the changelog has every record of this store.
pub(in crate::store) const COMPLETE_KEY: &[u8] = b"changelog_complete";
/// Meta key: the record key up to which a copy got every record acknowledged.
pub(in crate::store) const CURSOR_KEY: &[u8] = b"changelog_publish_cursor";
/// Meta key prefix of a checkpoint: `changelog:` + changelog topic + 0x00 + partition (BE).
const CHECKPOINT_PREFIX: &[u8] = b"changelog:";
/// Acknowledged offsets kept waiting for a gap below them (someone else wrote
/// there): past this, the checkpoint stops following until the next restore.
const MAX_ACKED_AHEAD: usize = 100_000;

#[derive(Debug, Default)]
pub(in crate::store) struct Checkpoint {
    /// Every changelog offset below this is applied to the local store.
    pub(in crate::store) next: i64,
    /// This instance owns the partition and restored it: its own acknowledged
    /// writes move `next` while they are contiguous.
    following: bool,
    /// Acknowledged offsets above `next`, waiting for the ones below.
    pub(in crate::store) acked: BTreeSet<i64>,
    /// Changed since the last group commit.
    pub(in crate::store) dirty: bool,
}

/// Checkpoints of the changelog partitions this store holds records of.
#[derive(Default)]
pub struct Checkpoints {
    /// By changelog topic, then partition (looked up by `&str`: no key is built per acknowledgement).
    pub(in crate::store) parts: Mutex<FxHashMap<String, FxHashMap<i32, Checkpoint>>>,
}

fn checkpoint_key(topic: &str, partition: i32) -> Vec<u8> {
    [CHECKPOINT_PREFIX, topic.as_bytes(), &[0], &partition.to_be_bytes()].concat()
}

impl Checkpoints {
    pub(in crate::store) fn open(meta: &sled::Tree) -> Result<Checkpoints, StoreError> {
        let mut parts = FxHashMap::default();
        for item in meta.scan_prefix(CHECKPOINT_PREFIX) {
            let (k, v) = item?;
            let rest = &k[CHECKPOINT_PREFIX.len()..];
            let Some(split) = rest.len().checked_sub(5).filter(|&i| rest[i] == 0) else { continue };
            let (Ok(topic), Ok(p), Ok(next)) = (
                std::str::from_utf8(&rest[..split]),
                <[u8; 4]>::try_from(&rest[split + 1..]),
                <[u8; 8]>::try_from(v.as_ref()),
            ) else {
                continue;
            };
            let cp = Checkpoint { next: i64::from_be_bytes(next), ..Checkpoint::default() };
            parts.entry(topic.to_owned()).or_insert_with(FxHashMap::default).insert(i32::from_be_bytes(p), cp);
        }
        Ok(Checkpoints { parts: Mutex::new(parts) })
    }

    pub(in crate::store) fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, FxHashMap<i32, Checkpoint>>> {
        self.parts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(in crate::store) fn get(&self, topic: &str, partition: i32) -> Option<i64> {
        self.lock().get(topic).and_then(|t| t.get(&partition)).map(|c| c.next)
    }

    pub(in crate::store) fn set(&self, topic: &str, partition: i32, next: i64, following: bool) {
        let mut parts = self.lock();
        let cp = parts.entry(topic.to_owned()).or_default().entry(partition).or_default();
        *cp = Checkpoint { next, following, acked: BTreeSet::new(), dirty: true };
    }

    /// This instance's write landed at `offset`.
    pub(in crate::store) fn acked(&self, topic: &str, partition: i32, offset: i64) {
        let mut parts = self.lock();
        let Some(cp) = parts.get_mut(topic).and_then(|t| t.get_mut(&partition)).filter(|c| c.following) else {
            return;
        };
        if offset < cp.next {
            return;
        }
        // A partition's acknowledgements come in the order of its writes: the next
        // offset moves the checkpoint without a stop in the set.
        if offset == cp.next {
            cp.next += 1;
            cp.dirty = true;
        } else {
            cp.acked.insert(offset);
        }
        while cp.acked.first() == Some(&cp.next) {
            cp.acked.pop_first();
            cp.next += 1;
            cp.dirty = true;
        }
        if cp.acked.len() > MAX_ACKED_AHEAD {
            tracing::warn!(changelog_topic = topic, partition, checkpoint = cp.next,
                "changelog offsets below this instance's writes were written by another; the checkpoint stays until the next restore reads them");
            cp.following = false;
            cp.acked.clear();
        }
    }

    /// Where a followed partition is (`None` when it is not followed: not
    /// restored here, or it stopped following), and the offsets above it this
    /// instance wrote.
    pub(in crate::store) fn followed(&self, topic: &str, partition: i32) -> Option<(i64, BTreeSet<i64>)> {
        let parts = self.lock();
        parts.get(topic).and_then(|t| t.get(&partition)).filter(|c| c.following).map(|c| (c.next, c.acked.clone()))
    }

    /// Everything below `next` is applied (others' writes read, this instance's
    /// own acknowledged): the checkpoint moves there, and on over own writes above.
    pub(in crate::store) fn caught_up(&self, topic: &str, partition: i32, next: i64) {
        let mut parts = self.lock();
        let Some(cp) = parts.get_mut(topic).and_then(|t| t.get_mut(&partition)).filter(|c| c.following) else {
            return;
        };
        if next > cp.next {
            cp.next = next;
            cp.acked = cp.acked.split_off(&next);
            cp.dirty = true;
        }
        while cp.acked.first() == Some(&cp.next) {
            cp.acked.pop_first();
            cp.next += 1;
            cp.dirty = true;
        }
    }

    /// Writes the checkpoints that moved (with each group commit, before its flush:
    /// every record they cover was written before).
    pub fn persist(&self, meta: &sled::Tree) -> Result<(), sled::Error> {
        let mut parts = self.lock();
        for (topic, partition, cp) in
            parts.iter_mut().flat_map(|(t, ps)| ps.iter_mut().map(move |(p, c)| (t, p, c))).filter(|(_, _, c)| c.dirty)
        {
            meta.insert(checkpoint_key(topic, *partition), &cp.next.to_be_bytes()[..])?;
            cp.dirty = false;
        }
        Ok(())
    }
}

/// The store's changelog state: where entries go (once the service attached a
/// sink) and the checkpoints.
pub struct Changelog {
    pub(in crate::store) sink: RwLock<Option<Arc<dyn Sink>>>,
    pub(crate) checkpoints: Arc<Checkpoints>,
    /// µs: restored records older than this are expired already and not written
    /// (the retention plus the clock skew allowed between instances: the age is
    /// the restorer's clock minus the writer's).
    pub(in crate::store) retention_us: i64,
    /// µs: how far instances' clocks may differ (`store.changelog.max_clock_skew`):
    /// a record without a version is stale only when it was written more than this
    /// before the record held for its key (`changelog::apply`, `Written`).
    pub(in crate::store) skew_us: i64,
    /// The changelog has every record of this store (`publish`): cleared at the
    /// first write made without a sink.
    pub(in crate::store) complete: AtomicBool,
    /// A copy into the changelog (`publish`) left its cursor in the meta tree: a
    /// write without a sink removes it (known here, so a write does not look).
    pub(in crate::store) publishing: AtomicBool,
}

impl Changelog {
    pub(crate) fn open(meta: &sled::Tree, retention: Duration, skew: Duration) -> Result<Changelog, StoreError> {
        let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Ok(Changelog {
            sink: RwLock::new(None),
            checkpoints: Arc::new(Checkpoints::open(meta)?),
            retention_us: us(retention).saturating_add(us(skew)),
            skew_us: us(skew),
            complete: AtomicBool::new(complete_at_open(meta)?),
            publishing: AtomicBool::new(publishing_at_open(meta)?),
        })
    }

    pub(in crate::store) fn sink(&self) -> Option<Arc<dyn Sink>> {
        self.sink.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Whether the meta tree says the changelog has every record (read at open).
fn complete_at_open(meta: &sled::Tree) -> Result<bool, StoreError> {
    Ok(meta.contains_key(COMPLETE_KEY)?)
}

/// Whether a copy into the changelog was cut short and left its cursor.
fn publishing_at_open(meta: &sled::Tree) -> Result<bool, StoreError> {
    Ok(meta.contains_key(CURSOR_KEY)?)
}
