//! Reading records: look-ups by id (newest slice first), pages for `store list`
//! and `/v1/events`, scans for `store export`, and `store stats`. Records are in key order across slices
//! (a merge of the slices' trees); should a key be in two slices (a crash
//! between the two writes of a move, or a claim after its older record expired
//! but before it was dropped), the newest slice's record is the one shown.

use std::ops::Bound;
use std::sync::Arc;

use super::disk::filter::Hashed;
use super::disk::slices::Slice;
use super::base::{Found, Store};
use super::disk::db::{read_i64, DUPLICATES_KEY};
use super::disk::record::{now_us, Record, State};
use super::disk::format;
use super::disk::keys;
use super::error::StoreError;

/// The `next` cursor of a page that ends with `r` (see `list_after`).
pub fn page_cursor(r: &Record) -> String {
    keys::cursor(&r.event_id, r.scope.as_deref())
}

/// Counts for `outboxd store stats`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    /// Records claimed and not finished.
    pub claimed: u64,
    /// Records done.
    pub done: u64,
    /// Records dead.
    pub dead: u64,
    /// Records parked.
    pub parked: u64,
    /// Records held behind a dead or parked event of their key.
    pub held: u64,
    /// Deliveries not run because their record was already final, over the store's
    /// life, those of records removed since included (persisted with each group commit).
    pub duplicates_suppressed: u64,
    /// Size of the store's files, as sled reports it.
    pub bytes_on_disk: u64,
    /// When the oldest record was first seen (µs since the epoch).
    pub oldest_us: Option<i64>,
    /// When the newest record was first seen (µs since the epoch).
    pub newest_us: Option<i64>,
}

/// A page of records, and where to go on when it stopped short.
pub struct Listed {
    /// The records, in id order.
    pub records: Vec<Record>,
    /// Set when the read stopped at its budget before the page was full: the cursor of
    /// the last record it examined. More may match after it.
    pub resume: Option<String>,
}

/// A slice's next entry, the rest of it, and the slice.
type Head = (Option<(sled::IVec, sled::IVec)>, super::disk::slices::SliceIter, Arc<Slice>);

/// The slices' trees from a start key, merged in key order.
pub(super) struct Merged {
    /// One per slice, oldest slice first.
    heads: Vec<Head>,
}

impl Merged {
    fn new(slices: Vec<Arc<Slice>>, start: Bound<Vec<u8>>) -> Result<Merged, StoreError> {
        let mut heads = Vec::with_capacity(slices.len());
        for slice in slices {
            let mut iter = slice.range_from(start.clone());
            let head = iter.next().transpose()?;
            heads.push((head, iter, slice));
        }
        Ok(Merged { heads })
    }
}

impl Iterator for Merged {
    type Item = Result<(sled::IVec, sled::IVec, Arc<Slice>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        // The smallest key; of equal keys the newest slice's (the last one).
        let mut best: Option<usize> = None;
        for (i, (head, _, _)) in self.heads.iter().enumerate() {
            if let Some((k, _)) = head {
                if best.is_none_or(|b| self.heads[b].0.as_ref().is_some_and(|(bk, _)| k <= bk)) {
                    best = Some(i);
                }
            }
        }
        let best = best?;
        let key = self.heads[best].0.as_ref()?.0.clone();
        let mut out = None;
        for (i, (head, iter, slice)) in self.heads.iter_mut().enumerate() {
            if head.as_ref().is_some_and(|(k, _)| *k == key) {
                let taken = head.take();
                match iter.next().transpose() {
                    Ok(next) => *head = next,
                    Err(e) => return Some(Err(e.into())),
                }
                if i == best {
                    out = taken.map(|(k, v)| (k, v, slice.clone()));
                }
            }
        }
        out.map(Ok)
    }
}

impl Store {
    /// The record of `id` in any scope, newest slice first (expired slices not yet
    /// dropped included). An event that several routes of its topic took has a record
    /// in each route's scope: the one that waits for a person (dead, parked, or taken
    /// back for a re-run) is the one found, so that the repairs by id reach it.
    pub(super) fn find_any(&self, id: &str) -> Result<Option<Found>, StoreError> {
        let prefix = keys::event_key(id);
        for slice in self.slices.all().into_iter().rev() {
            let mut first = None;
            for item in slice.scan_prefix(&prefix) {
                let (key, raw) = item?;
                let found = self.found(slice.clone(), key.to_vec(), raw)?;
                if matches!(found.record.state, State::Dead | State::Parked | State::Claimed) {
                    return Ok(Some(found));
                }
                first.get_or_insert(found);
            }
            if first.is_some() {
                return Ok(first);
            }
        }
        Ok(None)
    }

    /// The record of `id` in `scope`, or a legacy record of `id` (from a store
    /// written before scopes), in the slices still retained, newest first.
    pub(super) fn find_in(&self, scope: &str, id: &str) -> Result<Option<Found>, StoreError> {
        self.find_in_at(scope, id, now_us())
    }

    /// [`Store::find_in`] at `now` (µs), the caller's reading of the clock: a claim
    /// reads it once for its lookup and its record.
    pub(super) fn find_in_at(&self, scope: &str, id: &str, now: i64) -> Result<Option<Found>, StoreError> {
        let event = keys::event_key(id);
        let scoped = self.names.find(scope).map(|s| keys::record_key(&event, s));
        let legacy = (now < self.legacy_until).then(|| keys::record_key(&event, keys::LEGACY_SCOPE));
        if scoped.is_none() && legacy.is_none() {
            return Ok(None);
        }
        let hashed = [scoped.as_deref().map(Hashed::of), legacy.as_deref().map(Hashed::of)];
        for slice in self.slices.live(now) {
            for key in hashed.iter().flatten() {
                if let Some(raw) = slice.find(key)? {
                    return self.found(slice, key.key.to_vec(), raw).map(Some);
                }
            }
        }
        Ok(None)
    }

    fn found(&self, slice: Arc<Slice>, key: Vec<u8>, raw: sled::IVec) -> Result<Found, StoreError> {
        let record = self.decode(&slice, &key, &raw)?;
        Ok(Found { record, key, slice })
    }

    pub(super) fn decode(&self, slice: &Slice, key: &[u8], raw: &[u8]) -> Result<Record, StoreError> {
        format::decode(key, raw, &self.names, slice.start, Some(self.slices.expires_at(slice)))
    }

    pub(super) fn merged(&self, start: Bound<Vec<u8>>) -> Result<Merged, StoreError> {
        Merged::new(self.slices.all(), start)
    }

    /// Records in id order, optionally of one state (the store's tests; callers page
    /// with `list_after` or walk with `scan`).
    #[cfg(test)]
    pub(in crate::store) fn list(&self, state: Option<State>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list_filtered(state, None, limit)
    }

    /// Calls `f` for every record of the state and topic, in id order, without
    /// holding them all in memory.
    pub(in crate::store) fn scan<E: From<StoreError>>(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        mut f: impl FnMut(Record) -> Result<(), E>,
    ) -> Result<(), E> {
        for item in self.merged(Bound::Unbounded)? {
            let (k, v, slice) = item?;
            let r = self.decode(&slice, &k, &v)?;
            if state.is_none_or(|s| s == r.state) && topic.is_none_or(|t| t == &*r.topic) {
                f(r)?;
            }
        }
        Ok(())
    }

    /// Number of records (all states) from the kept counts, without a scan: for progress display.
    pub(in crate::store) fn len(&self) -> usize {
        self.counts().iter().map(|(_, n)| *n as usize).sum()
    }

    /// Size of the store's files.
    pub(in crate::store) fn bytes_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }

    /// No record in any slice (looks at the trees, not at the kept counts).
    pub(in crate::store) fn is_empty(&self) -> bool {
        self.slices.all().iter().all(|s| s.is_empty())
    }

    /// Records in id order, optionally of one state and one topic.
    #[cfg(test)]
    pub(in crate::store) fn list_filtered(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.list_after(state, topic, None, limit)
    }

    /// Like [`Store::list_filtered`], starting after `after` (exclusive): the
    /// `next` cursor of the previous page ([`page_cursor`]), or an event id
    /// (the page starts past every record of it).
    #[cfg(test)]
    pub(in crate::store) fn list_after(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        Ok(self.list_page(state, topic, after, limit, None)?.records)
    }

    /// Like [`Store::list_after`], examining at most `budget` records (when given):
    /// a filter that matches few records among many stops there and says where to go
    /// on ([`Listed::resume`]) instead of reading every record. Dead and parked
    /// records come from their index (`problems`), which holds nothing else.
    pub(in crate::store) fn list_page(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
        budget: Option<usize>,
    ) -> Result<Listed, StoreError> {
        let start = self.start_after(after);
        if let Some(s @ (State::Dead | State::Parked)) = state {
            if self.problems.ready() {
                return self.list_problems(s, topic, start, limit, budget);
            }
        }
        let wanted = |r: &Record| state.is_none_or(|s| s == r.state) && topic.is_none_or(|t| t == &*r.topic);
        let mut in_memory = self.in_memory_claims(&start, &wanted).into_iter().peekable();
        let mut out = Vec::new();
        let mut examined = 0usize;
        let mut items = self.merged(start)?.peekable();
        while let Some(item) = items.next() {
            if out.len() >= limit {
                break;
            }
            let (k, v, slice) = item?;
            while let Some((_, r)) = in_memory.next_if(|(mk, _)| mk.as_slice() < k.as_ref()) {
                if out.len() < limit {
                    out.push(r);
                }
            }
            // A claim whose final record was just written: the record is the one shown.
            in_memory.next_if(|(mk, _)| mk.as_slice() == k.as_ref());
            let r = self.decode(&slice, &k, &v)?;
            examined += 1;
            // Stopped by the budget only with records left to examine.
            let stop = budget.is_some_and(|b| examined >= b) && items.peek().is_some();
            let resume = stop.then(|| page_cursor(&r));
            if out.len() < limit && wanted(&r) {
                out.push(r);
            }
            if resume.is_some() && out.len() < limit {
                return Ok(Listed { records: out, resume });
            }
        }
        out.extend(in_memory.map(|(_, r)| r).take(limit.saturating_sub(out.len())));
        Ok(Listed { records: out, resume: None })
    }

    /// The dead or parked records (`state`) after `start`, from their index.
    fn list_problems(
        &self,
        state: State,
        topic: Option<&str>,
        start: Bound<Vec<u8>>,
        limit: usize,
        budget: Option<usize>,
    ) -> Result<Listed, StoreError> {
        let mut out = Vec::new();
        let mut examined = 0usize;
        let mut entries = self.problems.tree.range((start, Bound::Unbounded)).peekable();
        while let Some(item) = entries.next() {
            if out.len() >= limit {
                break;
            }
            let (key, _) = item?;
            // An entry whose record left (a crash between the two writes) is passed over.
            let Some(r) = self.record_under(&key)? else { continue };
            examined += 1;
            let stop = budget.is_some_and(|b| examined >= b) && entries.peek().is_some();
            let resume = stop.then(|| page_cursor(&r));
            if r.state == state && topic.is_none_or(|t| t == &*r.topic) {
                out.push(r);
            }
            if resume.is_some() && out.len() < limit {
                return Ok(Listed { records: out, resume });
            }
        }
        Ok(Listed { records: out, resume: None })
    }

    /// Where a page after the cursor `after` starts.
    fn start_after(&self, after: Option<&str>) -> Bound<Vec<u8>> {
        match after.map(keys::parse_cursor) {
            None => Bound::Unbounded,
            Some((event, Some(scope))) => {
                let scope = match scope {
                    None => Some(keys::LEGACY_SCOPE),
                    Some(s) => self.names.find(&s),
                };
                match scope {
                    Some(scope) => Bound::Excluded(keys::record_key(&event, scope).to_vec()),
                    // A scope this store never had: no record of it, start past the id.
                    None => Bound::Included(keys::past(&event)),
                }
            }
            Some((event, None)) => Bound::Included(keys::past(&event)),
        }
    }

    /// The in-memory claims (of events with no stored record) past `start` that
    /// `wanted` takes, with their keys, in key order: listed with the stored records.
    fn in_memory_claims(&self, start: &Bound<Vec<u8>>, wanted: &dyn Fn(&Record) -> bool) -> Vec<(Vec<u8>, Record)> {
        let mut out: Vec<(Vec<u8>, Record)> = self
            .claims
            .unstored_records()
            .into_iter()
            .filter(|r| wanted(r))
            .filter_map(|r| {
                let scope = self.names.find(r.scope.as_deref()?)?;
                Some((keys::record_key(&keys::event_key(&r.event_id), scope).to_vec(), r))
            })
            .filter(|(k, _)| match start {
                Bound::Unbounded => true,
                Bound::Included(s) => k >= s,
                Bound::Excluded(s) => k > s,
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Records per state without scanning (what the service's gauges show);
    /// `claimed` includes the claims held in memory.
    pub(in crate::store) fn counts(&self) -> [(State, u64); State::ALL.len()] {
        let mut t = self.slices.totals();
        t[0] += self.claims.unstored() as i64;
        State::ALL.map(|s| (s, t[super::disk::counts::slot(s)].max(0) as u64))
    }

    /// What [`Store::stats`] says, from what the store keeps without reading a record:
    /// the counts per state kept with every write (off by a crash's last batch at
    /// most, until `outboxd store stats` on the stopped store recounts), and for the
    /// oldest and newest the bounds of the slices that hold records (to within a
    /// slice: a record is in the slice of its last write). What a running service
    /// answers, so that no request reads every record.
    pub(in crate::store) fn kept_stats(&self) -> Result<Stats, StoreError> {
        let counts = self.counts();
        let count = |state: State| counts.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
        let holding: Vec<Arc<Slice>> = self.slices.all().into_iter().filter(|s| !s.is_empty()).collect();
        let mut duplicates = self.duplicates.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(kept) = read_i64(&self.meta, DUPLICATES_KEY)? {
            duplicates = duplicates.max(kept as u64);
        }
        Ok(Stats {
            claimed: count(State::Claimed),
            done: count(State::Done),
            dead: count(State::Dead),
            parked: count(State::Parked),
            held: count(State::Held),
            duplicates_suppressed: duplicates,
            bytes_on_disk: self.db.size_on_disk()?,
            oldest_us: holding.first().map(|s| s.start),
            newest_us: holding.last().map(|s| s.end().min(now_us())),
        })
    }

    /// Counts every record (a full scan). On a store no service is writing to,
    /// the kept per-slice counts are corrected to what the scan found, and so is
    /// the index of held chains (`chains`).
    pub(in crate::store) fn stats(&self) -> Result<Stats, StoreError> {
        let mut s = Stats::default();
        let mut per_slice = Vec::new();
        let mut members = Vec::new();
        for slice in self.slices.all() {
            let mut counted = [0i64; super::disk::counts::STATES];
            for item in slice.iter() {
                let (k, v) = item?;
                let r = self.decode(&slice, &k, &v)?;
                let total = match r.state {
                    State::Claimed => &mut s.claimed,
                    State::Done => &mut s.done,
                    State::Dead => &mut s.dead,
                    State::Parked => &mut s.parked,
                    State::Held => &mut s.held,
                };
                counted[super::disk::counts::slot(r.state)] += 1;
                *total += 1;
                if r.in_chain() {
                    members.push((k.to_vec(), r.clone()));
                }
                s.oldest_us = Some(s.oldest_us.map_or(r.first_seen_us, |o| o.min(r.first_seen_us)));
                s.newest_us = Some(s.newest_us.map_or(r.first_seen_us, |o| o.max(r.first_seen_us)));
            }
            per_slice.push((slice.start, counted));
        }
        s.claimed += self.claims.unstored();
        s.duplicates_suppressed = self.duplicates.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(kept) = read_i64(&self.meta, DUPLICATES_KEY)? {
            s.duplicates_suppressed = s.duplicates_suppressed.max(kept as u64);
        }
        s.bytes_on_disk = self.db.size_on_disk()?;
        if !self.service && self.slices.correct(&per_slice)? {
            tracing::info!(store = %self.path.display(), "per-state counts corrected from a full count");
            self.db.flush()?;
        }
        if !self.service && self.correct_chains(&members)? {
            tracing::info!(store = %self.path.display(), "index of held chains corrected from a full scan");
            self.db.flush()?;
        }
        Ok(s)
    }
}
