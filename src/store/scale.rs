//! A large store made directly, without Kafka, and the store-side measures of
//! the scale benchmark (`bench/run --scenarios scale`): how long a store of N
//! records takes to open and build its lookup filters, what a claim costs in
//! it, and what dropping its oldest slice costs.
//!
//! [`fabricate`] spreads N records evenly over the retention, less one slice
//! width so that none is about to expire (a done record,
//! every `dead_every`-th one dead), as a store that has run for that long holds
//! them, and writes each slice as a packed run (what gc makes of it), the last
//! records of the current one an entry each, or, with `packed: false`, one entry
//! per record (what stores written before runs hold).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::options::Role;
use super::base::Store;
use super::disk::record::{now_us, Record, State};
use super::disk::format;
use super::disk::keys;
use super::error::StoreError;
use super::options::StoreOptions;
use crate::event::Position;

/// Records of the current slice [`fabricate`] leaves one entry each in a packed store.
const LIVE_TAIL: usize = 65_536;

/// What [`fabricate`] writes.
#[derive(Debug, Clone)]
pub struct Fabricate {
    /// Records in all.
    pub records: u64,
    /// The store's retention: the records' last writes spread over it.
    pub retention: Duration,
    /// The source topic (and dedup scope) of every record.
    pub topic: String,
    /// Partitions the records are spread over.
    pub partitions: i32,
    /// Every this-many-th record is dead (0: none).
    pub dead_every: u64,
    /// Makes the ids (see [`event_id`]).
    pub salt: u64,
    /// Slices whose time has passed as packed runs (else one entry per record).
    pub packed: bool,
}

/// The `i`-th event id of a fabricated store: a UUID (random-looking, so the
/// records of one slice spread over the whole key space, as real ids do).
pub fn event_id(salt: u64, i: u64) -> String {
    let a = mix(salt ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let b = mix(a ^ salt.rotate_left(17));
    let hex = format!("{a:016x}{b:016x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn options(retention: Duration, role: Role, cache_bytes: u64) -> StoreOptions {
    StoreOptions { role, cache_bytes, ..StoreOptions::inspect(Some(retention)) }
}

/// Writes `f.records` records into a new store at `dir`; `progress` gets the
/// records written so far, about every million.
pub fn fabricate(dir: &Path, f: &Fabricate, progress: &mut dyn FnMut(u64)) -> Result<(), StoreError> {
    let store = Store::open(dir, &options(f.retention, Role::Store, super::options::SMALL_CACHE_BYTES))?;
    let scope = store.names.id(&f.topic)?;
    let now = now_us();
    // Over the retention less one slice width (no record is about to expire), from
    // the start of a slice (the oldest slice is a whole one, as a drop meets it).
    let width = super::disk::slices::width_for(f.retention).as_micros() as i64;
    let first = now - (f.retention.as_micros() as i64 - width.min(f.retention.as_micros() as i64 / 2));
    let span = now - (first + width - 1) / width * width;
    let at = |i: u64| now - span + (i128::from(i) * i128::from(span) / i128::from(f.records.max(1))) as i64;
    let mut i = 0;
    let mut reported = 0;
    while i < f.records {
        let slice = store.slices.slice_for(at(i))?;
        let mut entries = Vec::new();
        while i < f.records && at(i) < slice.end() {
            let t = at(i);
            let dead = f.dead_every > 0 && i % f.dead_every == f.dead_every - 1;
            let position = Position { topic: f.topic.clone(), partition: (i % f.partitions.max(1) as u64) as i32, offset: i as i64 };
            let id = event_id(f.salt, i);
            let mut r = Record::first_seen(&id, State::Claimed, 1, &position, t);
            r.scope = Some(r.topic.clone());
            r.claimed_at_us = Some(t);
            if dead {
                r.state = State::Dead;
                r.reason = Some("http 422: fabricated".into());
            } else {
                r.state = State::Done;
                r.done_at_us = Some(t);
                r.outcome = Some("http 200".into());
            }
            entries.push((keys::record_key(&keys::event_key(&id), scope).into_vec(), format::encode(&r, &store.names, slice.start)?.into_vec()));
            slice.moved(None, Some(r.state));
            i += 1;
        }
        // As a service leaves it: the slices packed, the last records of the current
        // one still an entry each (gc seals them once there are enough).
        let tail = if f.packed && slice.end() > now { entries.len().min(LIVE_TAIL) } else { 0 };
        let live = entries.split_off(entries.len() - tail);
        for (mut part, packed) in [(entries, f.packed), (live, false)] {
            if !part.is_empty() {
                part.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                store.slices.load(&slice, part, packed)?;
            }
        }
        if i - reported >= 1_000_000 || i == f.records {
            progress(i);
            reported = i;
        }
    }
    store.slices.persist()?;
    store.db.flush()?;
    Ok(())
}

/// A store opened as the service opens it, for the measures below.
pub struct Probe {
    store: Arc<Store>,
}

impl Probe {
    /// Opens the store at `dir` as `outboxd run` does (lookup filters built on a thread).
    pub fn open(dir: &Path, retention: Duration, cache_bytes: u64) -> Result<Probe, StoreError> {
        let opts = StoreOptions {
            commit_interval: Duration::from_millis(1),
            backlog_commit_interval: Duration::from_millis(1),
            ..options(retention, Role::Run, cache_bytes) };
        Ok(Probe { store: Arc::new(Store::open(dir, &opts)?) })
    }

    /// Waits until every slice's lookup filter holds its keys.
    pub fn wait_for_filters(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.store.slices.filters_filled() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Claims `n` events and records them done, as the handling path does; ids
    /// from `salt` (a new salt: new events, each looked up in every slice first).
    pub async fn handle(&self, topic: &str, salt: u64, n: u64) -> Result<(), StoreError> {
        for i in 0..n {
            let event = crate::event::OutboxEvent {
                id: event_id(salt, i),
                aggregate_id: None,
                event_type: None,
                payload: crate::event::Payload::Null,
                position: Position { topic: topic.to_owned(), partition: 0, offset: i as i64 },
                timestamp_ms: None,
                traceparent: None,
                route_key: None,
                headers: Vec::new(),
            };
            match self.store.handling().claim(&event, topic).await? {
                super::claim::Claim::Claimed(c) => self.store.handling().finish(c, State::Done, "logged".into()).await?,
                super::claim::Claim::Finished { .. } => {}
            }
        }
        Ok(())
    }

    /// Drops the oldest slice (what gc does once it expires), without sealing
    /// anything; returns the records it held.
    pub fn drop_oldest(&self) -> Result<u64, StoreError> {
        let Some(oldest) = self.store.slices.all().into_iter().next() else { return Ok(0) };
        self.store.drop_expired_slices(self.store.slices.expires_at(&oldest))
    }

    /// Packs the slice holding the most records into one run anew, its runs and
    /// overlay together (what a merge of a grown live slice does); returns the
    /// records packed.
    pub async fn merge_largest(&self) -> Result<u64, StoreError> {
        let Some(largest) = self.store.slices.all().into_iter().max_by_key(|s| s.counts.total()) else { return Ok(0) };
        let packing = largest.try_packing().ok_or_else(|| StoreError::Io(std::io::Error::other("the slice is being packed already")))?;
        let packed = self.store.seal_slice(&largest, packing, now_us()).await?;
        self.store.slices.drop_retired()?;
        Ok(packed)
    }

    /// Seals every slice whose time has passed (a gc pass's sealing), as a store
    /// written before runs is converted; returns the records packed.
    pub async fn seal(&self) -> Result<u64, StoreError> {
        self.store.seal(now_us()).await
    }

    /// Slices, and those with a packed run.
    pub fn slices(&self) -> (usize, usize) {
        let all = self.store.slices.all();
        let packed = all.iter().filter(|s| s.packing().0 > 0).count();
        (all.len(), packed)
    }

    /// The store's files, as sled reports them.
    pub fn bytes_on_disk(&self) -> u64 {
        self.store.db.size_on_disk().unwrap_or(0)
    }

    /// Makes everything durable and closes the store.
    pub async fn close(self) -> Result<(), StoreError> {
        self.store.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fabricated_store_holds_its_records_packed_or_not_and_answers_as_a_real_one() {
        for packed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let f = Fabricate {
                records: 20_000,
                // Slices of 7.5 min: no record expires while a slow machine runs the test.
                retention: Duration::from_secs(3_600),
                topic: "t".into(),
                partitions: 4,
                dead_every: 100,
                salt: 7,
                packed,
            };
            let mut seen = Vec::new();
            fabricate(dir.path(), &f, &mut |n| seen.push(n)).unwrap();
            assert_eq!(seen.last(), Some(&20_000));
            let probe = Probe::open(dir.path(), f.retention, super::super::options::SMALL_CACHE_BYTES).unwrap();
            assert!(probe.wait_for_filters(Duration::from_secs(30)));
            let (slices, sealed) = probe.slices();
            assert!(slices >= 6, "{slices} slices: the retention less one slice width");
            assert_eq!(sealed > 0, packed, "{sealed} sealed of {slices}");
            let s = probe.store.stats().unwrap();
            assert_eq!((s.done, s.dead), (19_800, 200));
            // Every fabricated id is a duplicate; new ones are claimed.
            let before = probe.store.stats().unwrap().duplicates_suppressed;
            probe.handle("t", 7, 300).await.unwrap();
            assert_eq!(probe.store.stats().unwrap().duplicates_suppressed - before, 300);
            probe.handle("t", 8, 100).await.unwrap();
            assert_eq!(probe.store.stats().unwrap().done, 19_900);
            let removed = probe.drop_oldest().unwrap();
            assert!(removed > 0 && removed < 20_000, "{removed}");
            if !packed {
                assert!(probe.seal().await.unwrap() > 0, "a store written before runs is sealed");
                assert!(probe.slices().1 > 0);
            }
            probe.close().await.unwrap();
        }
    }
}
