//! What the store keeps per event id.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::wire::State;

/// Where the version sits in the compact value's flags (`format`): the bits above
/// the flags.
pub(in crate::store) const VERSION_SHIFT: u32 = 16;
/// The highest version a record can carry; a record written more often stays at it.
pub(in crate::store) const MAX_VERSION: u64 = u64::MAX >> VERSION_SHIFT;

/// One event's record. Times are microseconds since the Unix epoch.
///
/// What the store keeps of it is the compact form (`format`); the serde form
/// is the one stores of earlier versions hold, read once when they are converted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The event's id.
    pub event_id: Arc<str>,
    /// The dedup scope the record is kept in (`store::keys`); `None` for a record of
    /// a store written before scopes. Part of the key (as a small id), not of the stored value.
    #[serde(skip)]
    pub scope: Option<Arc<str>>,
    /// Where the event is: `claimed`, `done`, `dead`, `parked` or `held`.
    pub state: State,
    /// Handler executions started (a re-execution after a crash counts).
    pub attempts: u32,
    /// Where the event was last claimed from (shared with the store's dictionary of names).
    pub topic: Arc<str>,
    /// The partition of that message.
    pub partition: i32,
    /// The offset of that message.
    pub offset: i64,
    /// The event's aggregate id (the key whose events run one at a time), if it has one.
    pub key: Option<Arc<str>>,
    /// The event's type, if it has one (shared with the store's dictionary of names).
    pub event_type: Option<Arc<str>>,
    /// When the id was first seen.
    pub first_seen_us: i64,
    /// When it was last claimed (or taken back for a re-run).
    pub claimed_at_us: Option<i64>,
    /// When it last became final (done, dead or parked).
    pub done_at_us: Option<i64>,
    /// When the record was last written (a suppressed duplicate does not count).
    pub updated_at_us: i64,
    /// The handler's outcome, e.g. `http 200`.
    pub outcome: Option<String>,
    /// Why the event is dead or parked.
    pub reason: Option<String>,
    /// Where the dead-letter copy went (`topic/partition@offset`), once the broker acknowledged it.
    pub dead_letter: Option<String>,
    /// Deliveries suppressed because the record was already final, as counted on the
    /// record by earlier versions. A suppressed duplicate no longer writes its record:
    /// it is counted per store (`Stats::duplicates_suppressed`, the duplicates metric).
    pub duplicates: u64,
    /// When the record is removed (its slice is dropped), unless it is written again before.
    pub expires_at_us: Option<i64>,
    /// The Kafka message key of the chain the event belongs to (`on_dead = "hold"`):
    /// set on a dead or parked event that holds its key's later events, and on the
    /// events held behind it. With the record's topic and partition it names the
    /// chain (`store::chains`); `None` for every other record.
    #[serde(skip)]
    pub chain: Option<Vec<u8>>,
    /// How far the record has come: one more than the record it replaced at every
    /// write this store makes of it (a claim or attempt written, a final record, a
    /// hold, a repair, a chain member written again: `Record::next_version`); a
    /// record applied from the changelog keeps the version it carries, and one that
    /// carries a lower version than the record held for its key is refused
    /// (`changelog::apply`). 0: written by a release without versions, or never written.
    #[serde(skip)]
    pub version: u64,
}

impl Record {
    /// A record for an id seen for the first time, at `position`.
    pub fn first_seen(id: &str, state: State, attempts: u32, position: &crate::event::Position, now: i64) -> Record {
        Record::first_seen_in(position.topic.as_str().into(), id, state, attempts, position, now)
    }

    /// As [`Record::first_seen`], with `position`'s topic as the store shares it
    /// (`Names::shared`): the record holds no copy of the name.
    pub fn first_seen_in(
        topic: Arc<str>,
        id: &str,
        state: State,
        attempts: u32,
        position: &crate::event::Position,
        now: i64,
    ) -> Record {
        debug_assert_eq!(*topic, *position.topic);
        Record {
            event_id: id.into(),
            scope: None,
            state,
            attempts,
            topic,
            partition: position.partition,
            offset: position.offset,
            key: None,
            event_type: None,
            first_seen_us: now,
            claimed_at_us: None,
            done_at_us: None,
            updated_at_us: now,
            outcome: None,
            reason: None,
            dead_letter: None,
            duplicates: 0,
            expires_at_us: None,
            chain: None,
            version: 0,
        }
    }

    /// This store writes the record again (it is not applied from the changelog):
    /// its version is one more than that of the record it replaces, which it was
    /// built from. Call it once per write, just before the value is made.
    pub(in crate::store) fn next_version(&mut self) {
        self.version = self.version.saturating_add(1).min(MAX_VERSION);
    }

    /// The record is in its key's chain: it holds the key's later events (dead or
    /// parked), waits behind them (held), or is being run again (claimed). A done
    /// record has left its chain.
    pub fn in_chain(&self) -> bool {
        in_chain(self.chain.is_some(), self.state)
    }
}

/// [`Record::in_chain`] of a record in `state` that has a chain key or not (a
/// restore reads both from a value it does not decode).
pub fn in_chain(has_chain: bool, state: State) -> bool {
    has_chain && state != State::Done
}

/// Now, in µs since the Unix epoch (0 before it).
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}
