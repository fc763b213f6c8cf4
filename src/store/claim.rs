//! What a claim answers: run the event now (and how it is claimed), or not.

use super::disk::record::{Record, State};
use crate::event::RawMessage;

/// What a claim found (the claim's steps one by one: the store's tests; the
/// service claims with `claim_to_run`, which answers a [`Turn`]).
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "made once per event and moved a few times: boxing the record cost an allocation per event"
)]
pub enum Claim {
    /// Claimed now (durably, or in memory: see `store.handling().claim_in_memory`).
    Claimed(Claimed),
    /// Already final: do not run; the duplicate was counted.
    Finished {
        /// The final state the record is in.
        state: State,
        /// The very message came again (a redelivered offset), not the id at a new offset.
        same_offset: bool,
    },
}

/// How an event about to run is claimed (`store.handling().claim_to_run`),
/// from its handler's settings.
#[derive(Debug, Clone, Copy)]
pub struct ClaimHow<'a> {
    /// `on_uncertain = verify | park`: the claim is written, durable here and
    /// acknowledged by the changelog before the call; else it is kept in memory.
    pub durable: bool,
    /// `on_dead = "hold"`: an event of a key whose chain has a dead or parked
    /// event before it is held behind it.
    pub hold: bool,
    /// The event's message: its key names its chain, and a held event keeps its copy.
    pub message: &'a RawMessage,
}

/// What claiming an event about to run came to.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "made once per event and moved a few times: boxing the claim would cost an allocation per event"
)]
pub enum Turn {
    /// Run it under this claim (an earlier attempt's outcome is unknown when it is
    /// a re-execution: [`Claimed::reexecution`]).
    Run(Claimed),
    /// Already final: do not run; the duplicate was counted.
    Finished {
        /// The final state the record is in.
        state: State,
        /// The very message came again (a redelivered offset), not the id at a new offset.
        same_offset: bool,
    },
    /// Recorded held behind an earlier event of its key (durably, and in the changelog): final.
    Held,
}

/// A claimed event: the record as claimed and the slice it is stored in,
/// handed back to `store.handling().finish` so the final write reads nothing again.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub(in crate::store) record: Record,
    /// Start of the slice the record is stored in (the final record replaces it there, or
    /// moves it to a newer one); `None`: nothing is stored yet (an in-memory claim of a new event).
    pub(in crate::store) slice: Option<i64>,
    /// The claim itself is written and durable (`on_uncertain = verify | park`); an
    /// in-memory claim writes nothing before its final record.
    pub(in crate::store) durable: bool,
    /// The state of the record stored in `slice` (`claimed`; `held` for a held
    /// event its released chain runs now), which the final record replaces.
    pub(in crate::store) stored: State,
}

impl Claimed {
    /// Handler executions started, this one included.
    pub fn attempt(&self) -> u32 {
        self.record.attempts
    }

    /// An earlier attempt's outcome is unknown (it was claimed and never finished).
    pub fn reexecution(&self) -> bool {
        self.record.attempts > 1
    }

    /// The claim is on disk (and, with a changelog, acknowledged there).
    #[cfg(test)]
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// With `hold` (`on_dead = "hold"`) and a message key, the event's final record,
    /// should it be dead or parked, holds the later events of its key (`chains`).
    /// A record already in a chain keeps it.
    pub fn holding(mut self, hold: bool, message: &RawMessage) -> Claimed {
        if hold && self.record.chain.is_none() {
            self.record.chain = message.key.clone();
        }
        self
    }
}

