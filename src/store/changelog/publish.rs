//! Copying the records the changelog may lack into it (`outboxd store publish`, and
//! the service's start-up with `[store.changelog]` on): records written while the
//! changelog was off, or by a release without one, are in no changelog topic, so
//! an instance that takes their partition over would run those events again.
//!
//! - The meta marker `changelog_complete` says the changelog has every record of
//!   this store: set when a store with the changelog on is found empty, and when a
//!   copy ends; removed (with the copy's cursor) at the first write made without a
//!   changelog attached (the service with `enabled = false`, a repair by `outboxd
//!   store` whose config has it off). It is removed before that write, in the same
//!   sled log, so the write is never durable without the removal.
//! - A copy walks every record in key order (across slices), sends each through the
//!   same path as a final record ([`entry_key`](super::entry::entry_key),
//!   [`entry_value`](super::entry::entry_value), the attached
//!   [`Sink`](super::sink::Sink)), a batch at a time. Once the broker
//!   acknowledged the whole batch, the key of its last record is the cursor, written
//!   to the meta tree and made durable: a copy cut by a crash resumes after it, and
//!   sends again at most one batch.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::entry::Change;
use super::checkpoints::{COMPLETE_KEY, CURSOR_KEY};
use crate::store::base::Store;
use crate::store::disk::record::{now_us, Record};
use crate::store::error::StoreError;


/// How far a copy is, handed to its progress callback after every batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Published {
    /// Records sent and acknowledged (this run).
    pub sent: u64,
    /// Records not sent: past their retention, or of a topic outboxd does not consume now.
    pub skipped: u64,
    /// Records in the store when the copy began (from the kept counts).
    pub total: u64,
    /// The copy went on from the cursor an earlier, cut copy left.
    pub resumed: bool,
    /// Since the copy began.
    pub elapsed: Duration,
}

impl Store {
    /// The changelog has every record of this store (see the module's doc).
    pub fn changelog_complete(&self) -> bool {
        self.changelog.complete.load(Ordering::Acquire)
    }

    /// A store with no record at all has nothing the changelog lacks: marks it
    /// complete and says so. (A store written later without a changelog loses the mark.)
    pub async fn mark_complete_if_empty(&self) -> Result<bool, StoreError> {
        if !self.is_empty() {
            return Ok(false);
        }
        self.mark_complete().await?;
        Ok(true)
    }

    async fn mark_complete(&self) -> Result<(), StoreError> {
        self.meta.remove(CURSOR_KEY)?;
        self.changelog.publishing.store(false, Ordering::Release);
        self.meta.insert(COMPLETE_KEY, &[1u8][..])?;
        self.durable().await?;
        self.changelog.complete.store(true, Ordering::Release);
        Ok(())
    }

    /// A record is about to be written with no changelog attached: the changelog no
    /// longer has everything. Before the write, in the same log, so both are durable
    /// together or the removal alone.
    pub(in crate::store) fn written_without_changelog(&self) -> Result<(), StoreError> {
        // The flags go once the meta tree no longer has what they stand for: a
        // removal that fails leaves them, and the next write tries again.
        let complete = self.changelog.complete.load(Ordering::Acquire);
        if complete || self.changelog.publishing.load(Ordering::Acquire) {
            self.meta.remove(COMPLETE_KEY)?;
            self.meta.remove(CURSOR_KEY)?;
            self.changelog.complete.store(false, Ordering::Release);
            self.changelog.publishing.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Sends every record after the cursor to its changelog partition, `batch`
    /// records at a time, each batch acknowledged before the cursor moves past it;
    /// then marks the store complete. Records of a source partition `wanted` says no
    /// to (a topic outboxd does not consume now: it has no changelog topic) and
    /// records past their retention are skipped. `progress` is called after every
    /// batch. Nothing else may write meanwhile (the service copies before it joins
    /// its group; `outboxd store publish` holds the store).
    pub async fn publish(
        &self,
        batch: usize,
        wanted: &(dyn Fn(&str, i32) -> bool + Sync),
        progress: &mut (dyn FnMut(&Published) + Send),
    ) -> Result<Published, StoreError> {
        assert!(self.has_changelog(), "a copy into the changelog needs the changelog attached first");
        let started = Instant::now();
        let mut cursor = self.meta.get(CURSOR_KEY)?.map(|k| k.to_vec());
        let mut done = Published { total: self.len() as u64, resumed: cursor.is_some(), ..Published::default() };
        let retention_us = self.changelog.retention_us;
        loop {
            let (records, last) = self.next_batch(cursor.as_deref(), batch.max(1))?;
            let Some(last) = last else { break };
            let now = now_us();
            let mut sends = Vec::with_capacity(records.len());
            for r in &records {
                if r.updated_at_us.saturating_add(retention_us) <= now || !wanted(&r.topic, r.partition) {
                    done.skipped += 1;
                    continue;
                }
                let sent = self.send_change(Change::Now(r))?.expect("the changelog is attached (asserted above)");
                sends.push(sent);
            }
            for acked in futures::future::join_all(sends).await {
                self.acknowledged(Some(acked.map_err(StoreError::Changelog)?));
                done.sent += 1;
            }
            self.meta.insert(CURSOR_KEY, last.as_slice())?;
            self.changelog.publishing.store(true, Ordering::Release);
            self.durable().await?;
            cursor = Some(last);
            done.elapsed = started.elapsed();
            progress(&done);
        }
        self.mark_complete().await?;
        done.elapsed = started.elapsed();
        Ok(done)
    }

    /// Up to `limit` records after `after` in key order, and the key of the last one.
    fn next_batch(&self, after: Option<&[u8]>, limit: usize) -> Result<(Vec<Record>, Option<Vec<u8>>), StoreError> {
        let start = after.map_or(std::ops::Bound::Unbounded, |k| std::ops::Bound::Excluded(k.to_vec()));
        let mut records = Vec::with_capacity(limit);
        let mut last = None;
        for item in self.merged(start)?.take(limit) {
            let (k, v, slice) = item?;
            records.push(self.decode(&slice, &k, &v)?);
            last = Some(k.to_vec());
        }
        Ok((records, last))
    }
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;
