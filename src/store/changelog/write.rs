//! The store's writes to the changelog: final records and durable claims, repairs
//! (the changelog first), acknowledgements moving checkpoints, and the restore's
//! checkpoints.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::entry::{
    decode_entry_with_copy, entry_key, entry_value, entry_value_with_copy, split_key, Acked, Change, ChangelogRecord, Entry,
};
use super::settling::{Delivered, Settling};
use super::apply::{self, Restoring};
use super::sink::{SendFuture, Sink};
use crate::store::audit_log;
use crate::store::disk::messages;
use crate::store::base::Store;
use crate::store::disk::record::{now_us, Record, State};
use crate::store::error::StoreError;

impl Store {
    /// From now on final records (and durable claims, see [`Store::log_claim`])
    /// also go to the changelog through `sink`.
    pub fn attach_changelog(&self, sink: Arc<dyn Sink>) {
        *self.changelog.sink.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sink);
    }

    /// A changelog sink is attached ([`Store::attach_changelog`]).
    pub(crate) fn has_changelog(&self) -> bool {
        self.changelog.sink().is_some()
    }

    /// The next offset to restore of a changelog partition (`None`: never restored here).
    pub(in crate::store) fn checkpoint(&self, changelog_topic: &str, partition: i32) -> Option<i64> {
        self.changelog.checkpoints.get(changelog_topic, partition)
    }

    /// Waits until `r`, just written, is durable here and, with a changelog,
    /// acknowledged there: both at once, so the broker's round trip and the
    /// local flush overlap, and the writer is woken once, when both are in
    /// ([`Settling`]). An attempt the client gave up on is sent again (and again)
    /// until the broker takes it or never will.
    pub(in crate::store) async fn settle(&self, r: &Record) -> Result<(), StoreError> {
        let Some(sink) = self.changelog.sink() else {
            self.written_without_changelog()?;
            return self.durable().await;
        };
        let settling = Settling::new();
        sink.send_settling(self.entry(Change::Now(r))?, settling.clone());
        self.sync.durable_then(settling.clone()).await;
        let (local, delivered) = settling.settled().await;
        local.map_err(StoreError::Sync)?;
        let acked = match delivered {
            Delivered::Acked(acked) => acked,
            Delivered::Failed(e) => return Err(StoreError::Changelog(e)),
            Delivered::Again => sink.send_again(self.entry(Change::Now(r))?).await.map_err(StoreError::Changelog)?,
        };
        self.acknowledged(Some(acked));
        Ok(())
    }

    /// A repair a person made: `change` goes to the changelog first (when one is
    /// attached) and only once the broker acknowledged it does `write` change the
    /// local store, which answers when that is durable. This order never loses a
    /// repair: if the broker does not take it, nothing changed anywhere and the
    /// repair can be made again; if the local write fails after the broker took
    /// it, the changelog (which every owner of the partition restores) has it, and
    /// the local record is still there to repair again. The other order could leave
    /// the local record gone and the changelog without its tombstone, a repair no
    /// command can repeat.
    pub(in crate::store) async fn settle_entry<T>(
        &self,
        change: Change<'_>,
        write: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let acked = match self.send_change(change)? {
            Some(sent) => Some(sent.await.map_err(StoreError::Changelog)?),
            None => None,
        };
        let done = write()?;
        self.durable().await?;
        self.acknowledged(acked);
        Ok(done)
    }

    /// Sends `change` to the changelog, when one is attached; without one, the
    /// changelog no longer has every record (`publish`).
    pub(in crate::store) fn send_change(&self, change: Change<'_>) -> Result<Option<SendFuture>, StoreError> {
        let Some(sink) = self.changelog.sink() else {
            self.written_without_changelog()?;
            return Ok(None);
        };
        Ok(Some(sink.send(self.entry(change)?)))
    }

    /// The changelog entry of `change`.
    pub(in crate::store) fn entry(&self, change: Change<'_>) -> Result<Entry, StoreError> {
        let (r, value) = match change {
            Change::Now(r) if r.in_chain() => {
                (r, Some(entry_value_with_copy(r, self.copy_for_changelog(r)?.as_deref())?))
            }
            Change::Now(r) => (r, Some(entry_value(r)?)),
            Change::Gone(r) => (r, None),
        };
        Ok(Entry { topic: r.topic.clone(), partition: r.partition, key: entry_key(r), value })
    }

    /// This instance's write is acknowledged (and durable here): the checkpoint may follow it.
    pub(in crate::store) fn acknowledged(&self, acked: Option<Acked>) {
        if let Some(a) = acked {
            self.changelog.checkpoints.acked(&a.changelog_topic, a.partition, a.offset);
        }
    }

    /// Puts a durable claim into the changelog too, as [`Store::claim_to_run`] does
    /// for an event about to run (tests that take its steps one by one). Without a
    /// changelog, nothing to do.
    #[cfg(test)]
    pub(in crate::store) async fn log_claim(&self, claimed: &crate::store::claim::Claimed) -> Result<(), StoreError> {
        if self.has_changelog() {
            self.settle(&claimed.record).await?;
        }
        Ok(())
    }

    /// Applies records read from a changelog partition of `source_topic` to the
    /// local store (not yet durable: see [`Store::restored_to`]). A record replaces
    /// the local one, except that a final local record is never turned back into a
    /// claim and a record older than the local one (`apply::Written`) is refused;
    /// expired ones are not written. Returns how many were applied. (The store's
    /// tests; a read applies batches with `collapse` and `apply_collapsed`, the same path.)
    #[cfg(test)]
    pub(in crate::store) fn apply_changelog(
        &self,
        source_topic: &str,
        records: &[ChangelogRecord],
    ) -> Result<u64, StoreError> {
        self.apply_restoring(source_topic, records, &mut Restoring::looking_up())
    }

    /// [`Store::apply_changelog`] record by record, each looked up on its own: for
    /// stores that may still hold records under keys without a scope.
    pub(in crate::store) fn apply_one_by_one(
        &self,
        source_topic: &str,
        records: &[ChangelogRecord],
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        let now = now_us();
        let mut applied = 0;
        for rec in records {
            if audit_log::is_audit_key(&rec.key) {
                if let Some(value) = &rec.value {
                    applied += u64::from(self.apply_audit(&rec.key, value, now)?);
                }
                continue;
            }
            let Some(value) = &rec.value else {
                if self.apply_tombstone(source_topic, &rec.key)? {
                    applied += 1;
                }
                continue;
            };
            let Some((mut r, copy)) = self.live_entry(source_topic, rec, value, now) else { continue };
            let scope = r.scope.clone().unwrap_or_default();
            let found = self.find_in(&scope, &r.event_id)?;
            let key = self.key_of(&r)?;
            if let Some(f) = &found {
                let (written, held) = (apply::Written::of(&r), apply::Written::of(&f.record));
                if written.is_older(held, self.changelog.skew_us) {
                    let replay = restoring.wrote_every_record_of(r.scope.as_deref());
                    restoring.refused.push(
                        &key,
                        apply::Refused::new(source_topic, r.partition, rec.offset, r.event_id.to_string(), written, held),
                        replay,
                    );
                    continue;
                }
                if f.record.state.is_final() && r.state == State::Claimed {
                    continue;
                }
                r.duplicates = f.record.duplicates;
            }
            let to = self.slices.slice_for(r.updated_at_us)?;
            let to = self.write(&r, found.as_ref().map(|f| (&f.slice, f.record.state)), Some(to))?;
            if let Some(copy) = copy {
                self.keep_copy(&messages::copy_key(to.start, &key), &copy, &r)?;
            }
            restoring.refused.applied(&key, r.version, rec.offset);
            applied += 1;
        }
        restoring.refused.report_batch();
        Ok(applied)
    }

    /// A changelog record's value decoded, with the message copy it carries (a held
    /// chain's record), unless it is malformed (skipped with a warning) or its
    /// retention ended before `now` (expired records are not written).
    pub(in crate::store) fn live_entry(
        &self,
        source_topic: &str,
        rec: &ChangelogRecord,
        value: &[u8],
        now: i64,
    ) -> Option<(Record, Option<Vec<u8>>)> {
        let (r, copy) = match decode_entry_with_copy(source_topic, &rec.key, value) {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, topic = source_topic, offset = rec.offset, "changelog record skipped");
                return None;
            }
        };
        (r.updated_at_us.saturating_add(self.changelog.retention_us) > now).then_some((r, copy))
    }

    /// A tombstone: the record is gone everywhere.
    pub(in crate::store) fn apply_tombstone(&self, source_topic: &str, key: &[u8]) -> Result<bool, StoreError> {
        let Some((_, id, scope)) = split_key(key) else { return Ok(false) };
        let Some(f) = self.find_in(scope.as_deref().unwrap_or(source_topic), &id)? else { return Ok(false) };
        self.chained(&f.key, None, || {
            f.slice.remove(&f.key)?;
            self.messages.remove(&messages::copy_key(f.slice.start, &f.key))?;
            f.slice.moved(Some(f.record.state), None);
            Ok(())
        })?;
        Ok(true)
    }

    /// A changelog partition this instance owns and restored: its checkpoint, and
    /// the offsets above it that this instance wrote itself. `None` when it is not
    /// followed. Used to catch up with what other instances wrote there (a repair
    /// made on another instance): offsets from the checkpoint up that are not in the set.
    pub(in crate::store) fn followed_checkpoint(
        &self,
        changelog_topic: &str,
        partition: i32,
    ) -> Option<(i64, BTreeSet<i64>)> {
        self.changelog.checkpoints.followed(changelog_topic, partition)
    }

    /// Others' records below `next` of a followed changelog partition are applied
    /// ([`Store::apply_changelog`]): the checkpoint moves there (and on over this
    /// instance's own acknowledged writes), durably with them.
    pub(in crate::store) async fn caught_up_to(
        &self,
        changelog_topic: &str,
        partition: i32,
        next: i64,
    ) -> Result<(), StoreError> {
        self.changelog.checkpoints.caught_up(changelog_topic, partition, next);
        self.durable().await
    }

    /// Records up to `next` (exclusive) of a changelog partition are applied: the
    /// checkpoint moves, durably with them. `done`: the restore reached the end,
    /// and from now on this instance's own acknowledged writes move it further.
    pub(in crate::store) async fn restored_to(
        &self,
        changelog_topic: &str,
        partition: i32,
        next: i64,
        done: bool,
    ) -> Result<(), StoreError> {
        self.changelog.checkpoints.set(changelog_topic, partition, next, done);
        self.durable().await
    }
}

