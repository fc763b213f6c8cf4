//! What a person does to records (`outboxd store forget|retry|resolve`, the
//! admin API), and the message copies of failed events they work with.
//!
//! With a changelog attached, every repair goes there first and then to the local
//! store ([`Store::settle_entry`]): a new owner of the partition restores it, and the
//! instance that owns it now catches up with it (`engine::restore`).

use super::changelog::entry::Change;
use super::disk::messages::copy_key;
use super::base::{Found, Store};
use super::disk::keys;
use super::disk::record::{now_us, Record, State};
use super::error::StoreError;
use crate::event::RawMessage;

/// What a retry or resolve of a held event is told instead.
const HELD_RUNS_LATER: &str = "dead or parked: a held event runs by itself once the event its key waits for \
                               (`store get` shows it) is retried to done, resolved or forgotten; `forget` takes it \
                               out of its chain";

/// Takes a record back to `claimed` with no attempt made, for a run a person asked
/// for (a retry, a replay); answers the state it had.
fn claim_again(r: &mut Record) -> State {
    let (was, now) = (r.state, now_us());
    r.state = State::Claimed;
    r.attempts = 0;
    r.claimed_at_us = Some(now);
    r.updated_at_us = now;
    r.next_version();
    was
}

/// What came of a replayed record (`Repairs::put_back`).
#[derive(Debug, Clone, PartialEq)]
pub enum Replayed {
    /// The message ran under it; the record as the run left it.
    Ran(Record),
    /// It did not (its route no longer selects the event): written back as it was.
    NotRun(Record),
}

impl Store {
    /// The record of `id` (any scope), or `NotFound`.
    fn existing(&self, id: &str) -> Result<Found, StoreError> {
        self.find_any(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))
    }

    /// Removes a record so the event may run again (with a changelog, a tombstone
    /// under its key goes there first). Returns what was removed.
    pub(in crate::store) async fn forget(&self, id: &str) -> Result<Record, StoreError> {
        let f = self.existing(id)?;
        self.remove_found(&f).await?;
        Ok(f.record)
    }

    /// Removes a found record, its message copy and its chain entry (with a
    /// changelog, its tombstone goes there first).
    pub(in crate::store) async fn remove_found(&self, f: &Found) -> Result<(), StoreError> {
        self.settle_entry(Change::Gone(&f.record), || {
            self.chained(&f.key, None, || {
                f.slice.remove(&f.key)?;
                // The copy goes after the record in sled's log too (store/disk/journal.rs).
                self.slices.journal()?;
                self.messages.remove(&copy_key(f.slice.start, &f.key))?;
                f.slice.moved(Some(f.record.state), None);
                Ok(())
            })
        })
        .await
    }

    /// Takes a dead or parked event back for a re-run, in one write: it becomes
    /// `claimed` with no attempt yet (so the re-run is not mistaken for an uncertain
    /// re-execution), keeping its message copy, which is returned. A re-run that was
    /// interrupted (the process died, the client went away) leaves it like that, and
    /// it may be reopened again: a reopened event is never lost between the two steps.
    pub(in crate::store) async fn reopen(&self, id: &str) -> Result<RawMessage, StoreError> {
        let f = self.existing(id)?;
        let mut r = f.record;
        let interrupted_rerun = r.state == State::Claimed && r.attempts == 0;
        if r.state == State::Held {
            // Run out of order it would overtake the event its key waits for.
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: HELD_RUNS_LATER });
        }
        if !matches!(r.state, State::Dead | State::Parked) && !interrupted_rerun {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "dead or parked" });
        }
        let message = self
            .messages
            .get(&copy_key(f.slice.start, &f.key), id)?
            .ok_or_else(|| StoreError::NoMessage(id.to_owned()))?;
        let was = claim_again(&mut r);
        self.settle_entry(Change::Now(&r), || self.write(&r, Some((&f.slice, was)), None)).await?;
        Ok(message)
    }

    /// Claims the final (done, dead or parked) record of `id` in `scope` again, to
    /// replay `message`, its source message read again from Kafka (`outboxd store
    /// replay`). The message is kept as the record's copy meanwhile (within the
    /// quota), so that an interrupted replay can be retried from the store. Answers
    /// the record as it was, for [`Store::put_back`].
    pub(in crate::store) async fn reopen_for_replay(
        &self,
        scope: &str,
        id: &str,
        message: &RawMessage,
    ) -> Result<Record, StoreError> {
        let f = self.find_in(scope, id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let mut r = f.record.clone();
        if r.state == State::Held {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: HELD_RUNS_LATER });
        }
        if !matches!(r.state, State::Done | State::Dead | State::Parked) {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "done, dead or parked" });
        }
        let was = claim_again(&mut r);
        self.settle_entry(Change::Now(&r), || {
            let to = self.write(&r, Some((&f.slice, was)), None)?;
            self.messages.put(&copy_key(to.start, &f.key), message)?;
            Ok(())
        })
        .await?;
        Ok(f.record)
    }

    /// After a replay: when the record is still as [`Store::reopen_for_replay`]
    /// left it (the message did not run under it: its route no longer selects it,
    /// or it decodes to another id now), it is written back as it was (`before`);
    /// when it is done, its copy goes. Returns what came of the record of `id` in
    /// `scope` (`None`: it is gone).
    pub(in crate::store) async fn put_back(
        &self,
        scope: &str,
        id: &str,
        before: &Record,
    ) -> Result<Option<Replayed>, StoreError> {
        let Some(f) = self.find_in(scope, id)? else { return Ok(None) };
        if !(f.record.state == State::Claimed && f.record.attempts == 0) {
            if f.record.state == State::Done {
                self.messages.remove(&copy_key(f.slice.start, &f.key))?;
                self.durable().await?;
            }
            return Ok(Some(Replayed::Ran(f.record)));
        }
        let mut r = before.clone();
        r.version = f.record.version;
        r.next_version();
        r.updated_at_us = now_us();
        self.settle_entry(Change::Now(&r), || {
            if r.state == State::Done {
                self.messages.remove(&copy_key(f.slice.start, &f.key))?;
            }
            self.write(&r, Some((&f.slice, State::Claimed)), None)
        })
        .await?;
        Ok(Some(Replayed::NotRun(r)))
    }

    /// After the re-run of a reopened record: if it is still waiting (the message
    /// ran under another id, as an undecodable or failed message does once it
    /// decodes), it is removed with its copy. Returns the record under `id` now.
    pub(in crate::store) async fn settle_rerun(&self, id: &str) -> Result<Option<Record>, StoreError> {
        match self.get(id)? {
            Some(r) if r.state == State::Claimed && r.attempts == 0 => {
                self.forget(id).await?;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// A person resolved a parked (or dead) event as done.
    pub(in crate::store) async fn resolve_done(&self, id: &str, note: String) -> Result<(), StoreError> {
        let f = self.existing(id)?;
        let mut r = f.record;
        if r.state == State::Held {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: HELD_RUNS_LATER });
        }
        if !matches!(r.state, State::Dead | State::Parked) {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "dead or parked" });
        }
        // As `finish_record` makes it, but known before the write: it goes to the changelog first.
        let (was, now) = (r.state, now_us());
        r.state = State::Done;
        r.done_at_us = Some(now);
        r.updated_at_us = now;
        r.outcome = Some(note);
        r.next_version();
        self.settle_entry(Change::Now(&r), || {
            self.messages.remove(&copy_key(f.slice.start, &f.key))?;
            self.write(&r, Some((&f.slice, was)), None)
        })
        .await?;
        Ok(())
    }

    /// Drops the message copy of an event that is done after all.
    pub(in crate::store) async fn drop_message(&self, id: &str) -> Result<(), StoreError> {
        if let Some(f) = self.find_any(id)? {
            self.messages.remove(&copy_key(f.slice.start, &f.key))?;
        }
        self.durable().await
    }

    /// The stored copy of a dead or parked event's message.
    pub(in crate::store) fn message(&self, event_id: &str) -> Result<Option<RawMessage>, StoreError> {
        match self.find_any(event_id)? {
            Some(f) => self.messages.get(&copy_key(f.slice.start, &f.key), event_id),
            None => Ok(None),
        }
    }

    /// The stored copy of this record's message: the record's own key, so equal ids
    /// in two scopes each have theirs.
    pub(in crate::store) fn message_of(&self, r: &Record) -> Result<Option<RawMessage>, StoreError> {
        let scope = match &r.scope {
            Some(s) => match self.names.find(s) {
                Some(id) => id,
                None => return Ok(None),
            },
            None => keys::LEGACY_SCOPE,
        };
        let key = keys::record_key(&keys::event_key(&r.event_id), scope);
        match self.slices.newest_with(&key)? {
            Some((slice, _)) => self.messages.get(&copy_key(slice.start, &key), &r.event_id),
            None => Ok(None),
        }
    }

    /// Keeps the message copy of a failed event, within the quota; the reason
    /// says when the copy could not be kept.
    pub(super) fn keep_message(&self, key: &[u8], message: &RawMessage, reason: String) -> Result<String, StoreError> {
        if self.messages.put(key, message)? {
            return Ok(reason);
        }
        metrics::counter!(crate::metrics::names::COPIES_NOT_KEPT).increment(1);
        tracing::warn!(topic = %message.topic, partition = message.partition, offset = message.offset,
            copies_bytes = self.messages.bytes(),
            "message copy not kept: store.max_message_copy_bytes is reached (the record is kept)");
        Ok(format!("{reason} [message copy not kept: store.max_message_copy_bytes reached]"))
    }

    /// Caps the bytes kept in message copies (`store.max_message_copy_bytes`).
    pub fn set_message_quota(&self, bytes: u64) {
        self.messages.set_quota(bytes);
    }

    /// Bytes kept in message copies.
    pub(in crate::store) fn message_bytes(&self) -> u64 {
        self.messages.bytes()
    }

    /// Memory held by the slices' lookup filters (store/disk/filter.rs).
    pub(in crate::store) fn filter_bytes(&self) -> usize {
        self.slices.all().iter().map(|s| s.filter_size().1).sum()
    }

    /// Packed runs over all slices (store/disk/runs.rs).
    pub(in crate::store) fn packed_runs(&self) -> usize {
        self.slices.all().iter().map(|s| s.run_count()).sum()
    }
}
