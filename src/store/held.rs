//! Events recorded `held` (`on_dead = "hold"`): the handling path's side of a held
//! chain (`chains`). A new event of a key whose chain has a member before it is
//! recorded held, with its message copy, instead of running; its offset may move.
//! The releaser (`engine::hold`) runs held events once their chain is released,
//! through the same claim, with these few steps of its own.

use super::chain_index::{route_of, ChainId, Running};
use super::disk::messages::copy_key;
use super::base::Store;
use super::claim::Claimed;
use super::disk::keys::{self, UNDECODABLE_SCOPE};
use super::disk::record::{now_us, Record, State};
use super::error::StoreError;
use crate::event::RawMessage;
use crate::metrics::names;

/// The reason a held record gives, for people (`store get` shows what it waits for).
const HELD: &str = "held: an earlier event of its key is dead or parked (on_dead = \"hold\"); it runs once that \
                    event is retried to done, resolved or forgotten";

/// The reason of an event held behind earlier ones of its key that wait for their receiver.
const WAITING: &str = "held: earlier events of its key on this route wait for its receiver (circuit.hold_after); \
                       it runs after them, in order";

impl Store {
    /// With `hold` (`on_dead = "hold"`), a claimed event whose key's chain has a
    /// member before it is recorded held behind it, with its message copy (durably,
    /// and in the changelog): `None`, the event is final. Anything else is handed
    /// back to run: a claim of a chain's own member (a held event its released chain
    /// runs, a head run again), an event without a key, one of a key that is not held.
    /// [`Store::claim_to_run`]'s step, on its own (tests).
    #[cfg(test)]
    pub(in crate::store) async fn hold_behind(
        &self,
        claim: super::claim::Claim,
        hold: bool,
        message: &RawMessage,
    ) -> Result<Option<super::claim::Claim>, StoreError> {
        let super::claim::Claim::Claimed(c) = claim else { return Ok(Some(claim)) };
        let Some((chain, behind_head)) = self.holds_behind(&c, hold, message) else {
            return Ok(Some(super::claim::Claim::Claimed(c)));
        };
        // Boxed: the rare path, kept out of the size of every event's future.
        Box::pin(self.hold_in(c, chain, behind_head, message)).await?;
        Ok(None)
    }

    /// The chain a claimed event is to be held in ([`Store::hold_behind`]), and
    /// whether it is behind a dead or parked head there; `None`: it runs.
    pub(in crate::store) fn holds_behind(
        &self,
        c: &Claimed,
        hold: bool,
        message: &RawMessage,
    ) -> Option<(ChainId, bool)> {
        if c.record.chain.is_some() || !self.chains.any() {
            return None;
        }
        let route = route_of(c.record.scope.as_deref());
        // Without `hold` only a chain that waits for its receiver holds (no dead head):
        // the key's events must not overtake the ones held there.
        let chain = held_chain(true, message, route)?;
        if !self.chains.holds(&chain, message.offset) {
            return None;
        }
        let behind_head = self.chains.blocked(&chain);
        (hold || !behind_head).then_some((chain, behind_head))
    }

    /// [`Store::hold_behind`]'s claimed event held in `chain`, its message kept.
    pub(in crate::store) async fn hold_in(
        &self,
        c: Claimed,
        chain: ChainId,
        behind_head: bool,
        message: &RawMessage,
    ) -> Result<(), StoreError> {
        let from = c.slice.and_then(|s| self.slices.get(s));
        let mut r = c.record;
        r.chain = Some(chain.key.clone());
        // It never ran: no attempt, no claim to show (the claim only found it new).
        r.attempts = 0;
        r.claimed_at_us = None;
        let to = self.slices.current(now_us())?;
        let why = if behind_head { HELD } else { WAITING };
        let reason = self.keep_message(&copy_key(to.start, &self.key_of(&r)?), message, why.to_owned())?;
        self.finish_record(&mut r, from.as_ref().map(|s| (s, c.stored)), Some(to), State::Held, reason)?;
        self.release_written(&r);
        self.held_now(&r, &chain);
        self.settle(&r).await
    }

    /// A claimed event whose route's receiver has been away longer than
    /// `circuit.hold_after`: recorded held in its key's chain on its route (without a
    /// Kafka key, in the partition's chain of keyless events), with its message copy,
    /// durably and in the changelog, so that its offset may move and the topic's other
    /// routes go on. The releaser runs the chain once the receiver answers again (one
    /// chain of the route at a time while it is away: its first event is the probe);
    /// the key's later events are held behind it meanwhile. A copy that does not fit
    /// `store.max_message_copy_bytes` hands the claim back: the event waits in memory.
    /// `called`: whether a call was made under this claim (else the claim's own
    /// attempt is taken back: it never ran, and its run must not look uncertain).
    pub(in crate::store) async fn hold_for_receiver(
        &self,
        c: Claimed,
        message: &RawMessage,
        reason: &str,
        called: bool,
    ) -> Result<Option<Claimed>, StoreError> {
        let route = route_of(c.record.scope.as_deref());
        let key = message.key.clone().unwrap_or_default();
        let chain = ChainId { topic: message.topic.clone(), partition: message.partition, key, route };
        let mut r = c.record.clone();
        r.chain = Some(chain.key.clone());
        r.claimed_at_us = None;
        if !called {
            r.attempts = r.attempts.saturating_sub(1);
        }
        let to = self.slices.current(now_us())?;
        if !self.messages.put(&copy_key(to.start, &self.key_of(&r)?), message)? {
            metrics::counter!(names::COPIES_NOT_KEPT).increment(1);
            return Ok(Some(c));
        }
        let from = c.slice.and_then(|s| self.slices.get(s));
        self.finish_record(&mut r, from.as_ref().map(|s| (s, c.stored)), Some(to), State::Held, reason.to_owned())?;
        self.release_written(&r);
        metrics::counter!(names::HELD, "topic" => r.topic.clone()).increment(1);
        tracing::debug!(event_id = %r.event_id, topic = %r.topic, partition = r.partition, offset = r.offset,
            key = %chain.key_text(), "event held: its route's receiver is away");
        self.settle(&r).await?;
        Ok(None)
    }

    /// A message that cannot be decoded (recorded under `id`, the undecodable
    /// scope), of a held key: recorded held like an event, not dead-lettered; it
    /// is decoded again when its chain runs it. False when it is not held (no
    /// `hold`, no key, a key that is not held, or it is the chain's member already).
    pub(in crate::store) async fn hold_message(
        &self,
        id: &str,
        message: &RawMessage,
        hold: bool,
    ) -> Result<bool, StoreError> {
        if !self.chains.any() {
            return Ok(false);
        }
        let Some(chain) = held_chain(hold, message, None) else { return Ok(false) };
        if !self.chains.holds(&chain, message.offset) {
            return Ok(false);
        }
        let now = now_us();
        let found = self.find_in(UNDECODABLE_SCOPE, id)?;
        if found.as_ref().is_some_and(|f| f.record.in_chain()) {
            return Ok(false);
        }
        let (mut r, from) = match found {
            Some(f) => (f.record, Some(f.slice)),
            None => {
                let r = Record {
                    scope: Some(UNDECODABLE_SCOPE.into()),
                    ..Record::first_seen(id, State::Held, 0, &message.position(), now)
                };
                (r, None)
            }
        };
        let was = r.state;
        r.chain = Some(chain.key.clone());
        let to = self.slices.current(now)?;
        let reason = self.keep_message(&copy_key(to.start, &self.key_of(&r)?), message, HELD.to_owned())?;
        self.finish_record(&mut r, from.as_ref().map(|s| (s, was)), Some(to), State::Held, reason)?;
        self.held_now(&r, &chain);
        self.settle(&r).await?;
        Ok(true)
    }

    fn held_now(&self, r: &Record, chain: &ChainId) {
        metrics::counter!(names::HELD, "topic" => r.topic.clone()).increment(1);
        match self.chain_view(r, 0).and_then(|c| c.head) {
            Some(head) => tracing::info!(event_id = %r.event_id, topic = %r.topic, partition = r.partition,
                offset = r.offset, key = %chain.key_text(), held_behind = %head,
                "event held: an earlier event of its key is dead or parked"),
            // Behind events that wait for their receiver: many while it is away, said once by the engine.
            None => tracing::debug!(event_id = %r.event_id, topic = %r.topic, partition = r.partition,
                offset = r.offset, key = %chain.key_text(), "event held: earlier events of its key wait for their receiver"),
        }
    }

    /// Released chains (no dead, parked or claimed member), in key order.
    pub(in crate::store) fn released_chains(&self) -> Vec<ChainId> {
        self.chains.released()
    }

    /// The next held event of a released chain, its message copy, and the guard
    /// under which its claim is allowed (`Store::claim_as`). `Ok(None)`: the chain
    /// is not released (any more), or empty. A held event without a copy (the quota
    /// was reached, or it came from another instance whose copy was too large for
    /// the changelog) cannot run: it is recorded dead with the reason, and the rest
    /// of the chain waits behind it.
    pub(in crate::store) async fn next_held(
        &self,
        chain: &ChainId,
    ) -> Result<Option<(Record, RawMessage, Running<'_>)>, StoreError> {
        loop {
            let Some((key, _id)) = self.chains.next_held(chain) else { return Ok(None) };
            let Some(r) = self.record_under(&key)? else {
                // Gone under the index (retention): the index follows.
                self.prune_chains()?;
                continue;
            };
            match self.message_of(&r)? {
                Some(message) => return Ok(Some((r, message, self.run_held(&key)))),
                None => {
                    self.held_without_copy(r).await?;
                    return Ok(None);
                }
            }
        }
    }

    async fn held_without_copy(&self, mut r: Record) -> Result<(), StoreError> {
        let Some(f) = self.find_in(r.scope.as_deref().unwrap_or_default(), &r.event_id)? else { return Ok(()) };
        let reason = "held, and no copy of its message is kept on this instance (store.max_message_copy_bytes was \
                      reached, or the copy was too large for the changelog): it cannot run from the store; the \
                      events behind it wait. Forget it (it runs again if it is delivered again) or resolve it"
            .to_owned();
        tracing::error!(event_id = %r.event_id, topic = %r.topic, partition = r.partition, offset = r.offset,
            "a released held event has no message copy: recorded dead, the rest of its chain waits behind it");
        metrics::counter!(names::DEAD, "topic" => r.topic.clone()).increment(1);
        // One more than the record stored now, which may have been written since `r` was read.
        r.version = r.version.max(f.record.version);
        self.finish_record(&mut r, Some((&f.slice, f.record.state)), None, State::Dead, reason)?;
        self.settle(&r).await
    }

    /// After the releaser ran `r`'s message: what its record is now. A record still
    /// held ran under another id (an undecodable message that decodes now, a panic
    /// recorded under its position, an id found final elsewhere): it is removed
    /// (with the changelog first, like `forget`), so the chain goes on.
    pub(in crate::store) async fn after_held_run(&self, r: &Record) -> Result<Option<Record>, StoreError> {
        let scope = r.scope.as_deref().unwrap_or_default();
        let Some(f) = self.find_in(scope, &r.event_id)? else { return Ok(None) };
        match f.record.state {
            State::Held => {
                self.remove_found(&f).await?;
                Ok(None)
            }
            State::Done => {
                self.messages.remove(&copy_key(f.slice.start, &f.key))?;
                self.durable().await?;
                Ok(Some(f.record))
            }
            _ => Ok(Some(f.record)),
        }
    }

    /// The message copy a chain member's changelog record carries: the stored
    /// copy, encoded as kept, unless it is larger than
    /// [`MAX_COPY_BYTES`](super::changelog::entry::MAX_COPY_BYTES) (then it stays here only).
    pub(super) fn copy_for_changelog(&self, r: &Record) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.key_of(r)?;
        let Some((slice, _)) = self.slices.newest_with(&key)? else { return Ok(None) };
        let Some(copy) = self.messages.get_encoded(&copy_key(slice.start, &key))? else { return Ok(None) };
        if copy.len() > super::changelog::entry::MAX_COPY_BYTES {
            tracing::warn!(event_id = %r.event_id, topic = %r.topic, partition = r.partition, offset = r.offset,
                copy_bytes = copy.len(), "the message copy of a held chain's event is too large for the \
                changelog: another owner of the partition will not have it");
            return Ok(None);
        }
        Ok(Some(copy.to_vec()))
    }

    /// Keeps the message copy a changelog record carried, within the quota.
    pub(super) fn keep_copy(&self, key: &[u8], copy: &[u8], r: &Record) -> Result<(), StoreError> {
        if !self.messages.put_encoded(key, copy)? {
            metrics::counter!(names::COPIES_NOT_KEPT).increment(1);
            tracing::warn!(event_id = %r.event_id, topic = %r.topic, partition = r.partition, offset = r.offset,
                "restored message copy not kept: store.max_message_copy_bytes is reached (the record is kept)");
        }
        Ok(())
    }

    /// Records of held chains last written before `before_us` (the releaser writes
    /// them again before their retention ends: [`Store::refresh_member`]).
    pub(in crate::store) fn aging_members(&self, before_us: i64) -> Result<Vec<Record>, StoreError> {
        let mut aging = Vec::new();
        for key in self.chains.member_keys() {
            if let Some(r) = self.record_under(&key)?.filter(|r| r.in_chain() && r.updated_at_us < before_us) {
                aging.push(r);
            }
        }
        Ok(aging)
    }

    /// Writes a record of a held chain again as it is, into the current slice and
    /// the changelog: a chain waits for a person however long that takes, instead
    /// of expiring with `store.retention` (its held events would be lost, or run
    /// once their head was gone). Left alone (false) when the record changed since
    /// `r` was read; the caller holds the event's id (the handling path's guard).
    pub(in crate::store) async fn refresh_member(&self, r: &Record) -> Result<bool, StoreError> {
        let Some(f) = self.find_in(r.scope.as_deref().unwrap_or_default(), &r.event_id)? else { return Ok(false) };
        if f.record.state != r.state || f.record.updated_at_us != r.updated_at_us || !f.record.in_chain() {
            return Ok(false);
        }
        let mut kept = Record { updated_at_us: now_us(), ..f.record };
        kept.next_version();
        self.write(&kept, Some((&f.slice, kept.state)), None)?;
        self.settle(&kept).await?;
        Ok(true)
    }

    /// Keys whose new events are held now (chains that wait for a dead or parked event).
    pub(in crate::store) fn held_keys(&self) -> usize {
        self.chains.held_keys()
    }

    /// Whether the releaser runs the held event `id` of `scope` now.
    pub(in crate::store) fn runs_held(&self, scope: &str, id: &str) -> bool {
        if !self.chains.any() {
            return false;
        }
        let Some(scope) = self.names.find(scope) else { return false };
        self.chains.is_running(&keys::record_key(&keys::event_key(id), scope))
    }
}

/// The chain a message would be held in on `route` (`None`: the topic's first): with
/// `hold`, and only when it has a key (without one there is no order of a key to keep).
fn held_chain(hold: bool, message: &RawMessage, route: Option<String>) -> Option<ChainId> {
    let key = message.key.clone().filter(|_| hold)?;
    Some(ChainId { topic: message.topic.clone(), partition: message.partition, key, route })
}
