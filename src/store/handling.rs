//! The handling path: claiming an event, its attempts, its final record (with
//! the message copy of a failed one), and how a record moves between slices.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::Either;

use super::disk::messages::copy_key;
use super::disk::slices::Slice;
use super::base::Store;
#[cfg(any(test, feature = "internals"))]
use super::claim::Claim;
use super::claim::{ClaimHow, Claimed, Turn};
use super::disk::keys::{self, UNDECODABLE_SCOPE};
use super::disk::format;
use super::disk::names::Loaded;
use super::disk::record::{now_us, Record, State};
use super::error::StoreError;
use crate::event::{OutboxEvent, RawMessage};

/// The record key of `r`: its event's key in its scope, whose id `names` holds.
fn key_in(r: &Record, names: &Loaded<'_>) -> Result<keys::KeyBuf, StoreError> {
    let scope = match &r.scope {
        Some(s) => names.id(s)?,
        None => keys::LEGACY_SCOPE,
    };
    Ok(keys::record_key(&keys::event_key(&r.event_id), scope))
}

impl Store {
    /// The key of `r` (its scope gets an id if it has none yet).
    pub(super) fn key_of(&self, r: &Record) -> Result<keys::KeyBuf, StoreError> {
        key_in(r, &self.names.loaded())
    }

    /// Writes `r` into the slice `to` (by default the current one). `from`: the slice
    /// it was in and its state there; if that is older, the record (and its message
    /// copy) leaves it: written in the new slice first, so a crash in between leaves
    /// the new state found first (newest slice first), never the old one alone.
    pub(super) fn write(
        &self,
        r: &Record,
        from: Option<(&Arc<Slice>, State)>,
        to: Option<Arc<Slice>>,
    ) -> Result<Arc<Slice>, StoreError> {
        // The dictionary loaded once for the key's scope and the value's names.
        let names = self.names.loaded();
        let key = key_in(r, &names)?;
        let to = match to {
            Some(to) => to,
            None => self.slices.current(now_us())?,
        };
        let value = format::encode(r, &names, to.start)?;
        drop(names);
        self.chained(&key, Some(r), || {
            match from {
                Some((old, was)) if Arc::ptr_eq(old, &to) => {
                    to.insert(&key, value.as_slice())?;
                    to.moved(Some(was), Some(r.state));
                }
                Some((old, was)) => {
                    self.messages.moved(&copy_key(old.start, &key), &copy_key(to.start, &key))?;
                    to.insert(&key, value.as_slice())?;
                    old.remove(&key)?;
                    old.moved(Some(was), None);
                    to.moved(None, Some(r.state));
                }
                None => {
                    to.insert(&key, value.as_slice())?;
                    to.moved(None, Some(r.state));
                }
            }
            Ok(())
        })?;
        Ok(to)
    }

    /// Claims the event for execution in its dedup `scope`, durably, unless it is
    /// already final there (then the duplicate is counted and nothing runs). For
    /// `on_uncertain = verify | park`: a crash during the handler must leave the
    /// outcome found uncertain. (The store's tests and its scale helper; the
    /// service claims with [`Store::claim_to_run`].)
    #[cfg(any(test, feature = "internals"))]
    pub(in crate::store) async fn claim(&self, event: &OutboxEvent, scope: &str) -> Result<Claim, StoreError> {
        self.claim_as(event, scope, true).await
    }

    /// A claim, durable (and then awaited: durable here) or in memory.
    #[cfg(any(test, feature = "internals"))]
    pub(super) async fn claim_as(&self, event: &OutboxEvent, scope: &str, durable: bool) -> Result<Claim, StoreError> {
        let written = self.claim_written(event, scope, durable)?;
        match written {
            Written::Finished { state, same_offset, unsettled } => {
                if let Some(r) = unsettled {
                    Box::pin(self.settle(&r)).await?;
                }
                Ok(Claim::Finished { state, same_offset })
            }
            Written::Claimed(c) => {
                if c.durable {
                    self.durable().await?;
                }
                Ok(Claim::Claimed(c))
            }
        }
    }

    /// The whole claim of an event about to run ([`Turn`]): the claim (durable
    /// with `how.durable`), then, with `how.hold`, the hold behind a dead or parked
    /// event of its key, then a durable claim's wait: durable here and, with a
    /// changelog, acknowledged there, in one wait, so that a new owner of the
    /// partition finds the outcome uncertain, not absent, should this one die
    /// during the call.
    ///
    /// The claim is made when this is called, not when the future is first polled:
    /// an event claimed in memory (`on_uncertain = "retry"`, most events) waits for
    /// nothing, and its future is the answer itself; the waits (a durable claim, a
    /// hold, a found record to settle) are a boxed future of their own. Every
    /// event's future would otherwise carry room for all of them (about 1 KB,
    /// moved at each level above).
    pub(in crate::store) fn claim_to_run<'a>(
        &'a self,
        event: &OutboxEvent,
        scope: &str,
        how: ClaimHow<'a>,
    ) -> impl Future<Output = Result<Turn, StoreError>> + 'a {
        type Waits<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Turn, StoreError>> + Send + 'a>>;
        let c = match self.claim_written(event, scope, how.durable) {
            Err(e) => return Either::Left(std::future::ready(Err(e))),
            Ok(Written::Finished { state, same_offset, unsettled: None }) => {
                return Either::Left(std::future::ready(Ok(Turn::Finished { state, same_offset })));
            }
            // A final record it found, sent to the changelog again: it may be here only,
            // written by a run that died before the changelog acknowledged it.
            Ok(Written::Finished { state, same_offset, unsettled: Some(r) }) => {
                let waits: Waits<'a> = Box::pin(async move {
                    self.settle(&r).await?;
                    Ok(Turn::Finished { state, same_offset })
                });
                return Either::Right(waits);
            }
            Ok(Written::Claimed(c)) => c,
        };
        if let Some((chain, behind_head)) = self.holds_behind(&c, how.hold, how.message) {
            // Its held record replaces the claim, in the same group commit or a later one.
            let waits: Waits<'a> = Box::pin(async move {
                self.hold_in(c, chain, behind_head, how.message).await?;
                Ok(Turn::Held)
            });
            return Either::Right(waits);
        }
        if !c.durable {
            return Either::Left(std::future::ready(Ok(Turn::Run(c))));
        }
        let waits: Waits<'a> = Box::pin(async move {
            self.settle(&c.record).await?;
            Ok(Turn::Run(c))
        });
        Either::Right(waits)
    }

    /// A claim's lookup and write, before any wait: the record is written (a
    /// durable claim) or kept in memory, unless the event is final already.
    fn claim_written(&self, event: &OutboxEvent, scope: &str, durable: bool) -> Result<Written, StoreError> {
        let now = now_us();
        let (mut record, from) = match self.find_in_at(scope, &event.id, now)? {
            // A held event is final, except to the releaser of its chain (`chains`), which runs it now.
            Some(f)
                if f.record.state.is_final() && !(f.record.state == State::Held && self.chains.is_running(&f.key)) =>
            {
                let (r, p) = (&f.record, &event.position);
                let same_offset = *r.topic == *p.topic && r.partition == p.partition && r.offset == p.offset;
                self.duplicates.fetch_add(1, Ordering::Relaxed);
                // The record may be here only: written by a run that died before the
                // changelog acknowledged it. The offset moves only once the changelog has it.
                let (state, unsettled) = (r.state, self.has_changelog().then_some(f.record));
                return Ok(Written::Finished { state, same_offset, unsettled });
            }
            // Claimed and never finished: by an earlier run with a durable claim, or reopened by
            // `store retry`; or held, and run by its released chain: a durable claim of it stays
            // `held` (a crash leaves it to the chain, which finds the outcome uncertain), an
            // in-memory one shows as claimed.
            Some(f) => {
                let stored = f.record.state;
                let state = if stored == State::Held && durable { State::Held } else { State::Claimed };
                let r = Record {
                    state,
                    attempts: f.record.attempts + 1,
                    topic: self.names.loaded().shared(&event.position.topic),
                    partition: event.position.partition,
                    offset: event.position.offset,
                    claimed_at_us: Some(now),
                    updated_at_us: now,
                    ..f.record
                };
                (r, Some((f.slice, stored)))
            }
            None => {
                // The dictionary loaded once for the record's scope, type and topic.
                let names = self.names.loaded();
                let r = Record {
                    scope: Some(names.shared(scope)),
                    key: event.aggregate_id.as_deref().map(Arc::from),
                    event_type: event.event_type.as_deref().map(|t| names.shared(t)),
                    claimed_at_us: Some(now),
                    ..Record::first_seen_in(
                        names.shared(&event.position.topic),
                        &event.id,
                        State::Claimed,
                        1,
                        &event.position,
                        now,
                    )
                };
                (r, None)
            }
        };
        let stored = from.as_ref().map_or(State::Claimed, |(_, s)| *s);
        if !durable {
            self.claims.insert(scope, &record, from.is_some());
            let slice = from.map(|(s, _)| s.start);
            return Ok(Written::Claimed(Claimed { record, slice, durable, stored }));
        }
        if !self.has_changelog() {
            self.written_without_changelog()?;
        }
        record.next_version();
        // The current slice at the claim's own reading of the clock (its record's times).
        let to = self.slices.current(now)?;
        let slice = self.write(&record, from.as_ref().map(|(s, was)| (s, *was)), Some(to))?;
        let stored = record.state;
        Ok(Written::Claimed(Claimed { record, slice: Some(slice.start), durable, stored }))
    }

    /// A further attempt within the same claim (a retry after a handler error):
    /// written durably for a durable claim, counted in memory otherwise.
    pub(in crate::store) async fn record_attempt(&self, claimed: &mut Claimed) -> Result<u32, StoreError> {
        let r = &mut claimed.record;
        r.attempts += 1;
        r.updated_at_us = now_us();
        if !claimed.durable {
            self.claims.insert(r.scope.as_deref().unwrap_or_default(), r, claimed.slice.is_some());
            return Ok(r.attempts);
        }
        let from = claimed.slice.and_then(|s| self.slices.get(s));
        r.next_version();
        claimed.slice = Some(self.write(r, from.as_ref().map(|s| (s, claimed.stored)), None)?.start);
        claimed.stored = r.state;
        self.durable().await?;
        Ok(r.attempts)
    }

    /// Records the final state of a claimed event durably; only then may the offset move on.
    ///
    /// The record is written when this is called, not when the future is first
    /// polled: the future holds the written record and its settling only, not the
    /// claim and the text as well (each event's future moves whole, level by level).
    pub(in crate::store) fn finish(
        &self,
        claimed: Claimed,
        state: State,
        text: String,
    ) -> impl Future<Output = Result<(), StoreError>> + '_ {
        match self.finish_written(claimed, state, text) {
            Ok(r) => Either::Left(async move { self.settle(&r).await }),
            Err(e) => Either::Right(std::future::ready(Err(e))),
        }
    }

    /// [`Store::finish`]'s write: the final record, written, its claim released.
    fn finish_written(&self, claimed: Claimed, state: State, text: String) -> Result<Record, StoreError> {
        debug_assert!(state.is_final());
        let from = claimed.slice.and_then(|s| self.slices.get(s));
        let mut r = claimed.record;
        self.finish_record(&mut r, from.as_ref().map(|s| (s, claimed.stored)), None, state, text)?;
        self.release_written(&r);
        Ok(r)
    }

    /// Records a dead or parked event with its message copy and, when one was
    /// produced and acknowledged, its dead-letter position.
    pub(in crate::store) async fn finish_failed(
        &self,
        claimed: Claimed,
        state: State,
        reason: String,
        message: &RawMessage,
        dead_letter: Option<String>,
    ) -> Result<(), StoreError> {
        let from = claimed.slice.and_then(|s| self.slices.get(s));
        let mut r = claimed.record;
        let to = self.slices.current(now_us())?;
        let reason = self.keep_message(&copy_key(to.start, &self.key_of(&r)?), message, reason)?;
        r.dead_letter = dead_letter;
        self.finish_record(&mut r, from.as_ref().map(|s| (s, claimed.stored)), Some(to), state, reason)?;
        self.release_written(&r);
        self.settle(&r).await
    }

    /// `r`, as stored in `from` (`None`: it is new), becomes final in `to` (default:
    /// the current slice), with the next version.
    pub(super) fn finish_record(
        &self,
        r: &mut Record,
        from: Option<(&Arc<Slice>, State)>,
        to: Option<Arc<Slice>>,
        state: State,
        text: String,
    ) -> Result<(), StoreError> {
        let now = now_us();
        r.state = state;
        r.done_at_us = Some(now);
        r.updated_at_us = now;
        r.next_version();
        match state {
            State::Done => r.outcome = Some(text),
            _ => r.reason = Some(text),
        }
        // By default the current slice at the record's own time: one reading of the clock.
        let to = match to {
            Some(to) => to,
            None => self.slices.current(now)?,
        };
        self.write(r, from, Some(to))?;
        Ok(())
    }

    /// Records a message that never became an event (it could not be decoded) as dead;
    /// with `hold` (`on_dead = "hold"`), it holds the later events of its key.
    pub(in crate::store) async fn record_undecodable(
        &self,
        id: &str,
        message: &RawMessage,
        reason: String,
        dead_letter: Option<String>,
        hold: bool,
    ) -> Result<(), StoreError> {
        let now = now_us();
        let (mut r, from) = match self.find_in(UNDECODABLE_SCOPE, id)? {
            Some(f) => (f.record, Some(f.slice)),
            None => {
                let r = Record {
                    scope: Some(UNDECODABLE_SCOPE.into()),
                    ..Record::first_seen(id, State::Dead, 0, &message.position(), now)
                };
                (r, None)
            }
        };
        let was = r.state;
        if hold && r.chain.is_none() {
            r.chain = message.key.clone();
        }
        let to = self.slices.current(now)?;
        let reason = self.keep_message(&copy_key(to.start, &self.key_of(&r)?), message, reason)?;
        r.dead_letter = dead_letter;
        self.finish_record(&mut r, from.as_ref().map(|s| (s, was)), Some(to), State::Dead, reason)?;
        self.settle(&r).await
    }
}

impl Store {
    /// Like [`Store::claim`], but the claim lives in memory only (nothing is written
    /// until the final record). For `on_uncertain = retry`: after a crash during the
    /// handler, a durable claim would lead to the same re-execution with the same
    /// idempotency key as no claim at all. The caller serialises one id (the
    /// executor's live ids) and calls [`Store::release`] when it is done.
    #[cfg(test)]
    pub(in crate::store) async fn claim_in_memory(
        &self,
        event: &OutboxEvent,
        scope: &str,
    ) -> Result<Claim, StoreError> {
        self.claim_as(event, scope, false).await
    }

    /// Forgets the in-memory claim of `id` in `scope` (its final record is written,
    /// or it never will be here: the store failed, the work was abandoned).
    pub(in crate::store) fn release(&self, id: &str, scope: &str) {
        self.claims.remove(id, scope);
    }

    /// The final record `r` is written: lookups find it, its in-memory claim goes.
    pub(super) fn release_written(&self, r: &Record) {
        self.claims.remove(&r.event_id, r.scope.as_deref().unwrap_or_default());
    }
}

/// A claim's lookup and write, before its wait ([`Store::claim_written`]).
enum Written {
    /// Final already; `unsettled`: its record, to be settled with the changelog first.
    Finished { state: State, same_offset: bool, unsettled: Option<Record> },
    /// Claimed (written, not yet durable, when durable).
    Claimed(Claimed),
}
