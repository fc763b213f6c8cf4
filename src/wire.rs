//! The admin API's wire format: what the server writes, its client reads, the CLI
//! prints and the console shows of the store (records, stats, pages, the audit,
//! message copies, repair answers), as typed views whose serde form is the JSON of
//! `/v1`, `store … --json` and `store export`. Both sides read and write these types,
//! so a field renamed on one side fails to deserialize on the other instead of
//! reading as a default. A leaf: the store turns its records into these views
//! (`store::view`), the CLI turns them into tables (`cli::tables`).
//!
//! The fields of each view are declared in alphabetical order: that is the
//! order the JSON has always had (serde_json's map sorts its keys), and the
//! order `store get` and `store stats` print their rows in. Optional fields are
//! still required on the wire (as `null`): a missing one is an error.

use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// `absent → claimed → done | dead | parked | held`. A `claimed` record found later means an
/// earlier attempt's outcome is unknown (only durable claims are stored: see `Store::claim`).
/// `held` waits behind an earlier dead or parked event of its Kafka key (`on_dead = "hold"`):
/// final for its offset, run once that event is done, resolved or forgotten (`store::chains`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Claimed for execution and not final: its handler runs now, or an earlier
    /// attempt's outcome is unknown (or a re-run was taken back and not run yet).
    Claimed,
    /// Handled: the handler's outcome is in the record's `outcome`.
    Done,
    /// Given up (or never decodable): the record's `reason` says why.
    Dead,
    /// An uncertain event under `on_uncertain = "park"`: a person decides.
    Parked,
    /// Not run yet: an earlier event of its Kafka key is dead or parked
    /// (`on_dead = "hold"`). Its offset may move; it runs once that event is done,
    /// resolved or forgotten.
    Held,
}

impl State {
    /// The state as text (`claimed`, `done`, `dead`, `parked`, `held`), as in JSON and `--state`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Claimed => "claimed",
            State::Done => "done",
            State::Dead => "dead",
            State::Parked => "parked",
            State::Held => "held",
        }
    }

    /// Finished states let the offset move on and are never executed again automatically
    /// (a held event runs only when its key's chain is released: `store::chains`).
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Dead | State::Parked | State::Held)
    }

    /// Every state, in the order counts are kept and shown.
    pub const ALL: [State; 5] = [State::Claimed, State::Done, State::Dead, State::Parked, State::Held];
}

/// A state's name that is none of [`State`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}; one of: claimed, done, dead, parked, held")]
pub struct UnknownState(pub String);

impl std::str::FromStr for State {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<State, UnknownState> {
        match s {
            "claimed" => Ok(State::Claimed),
            "done" => Ok(State::Done),
            "dead" => Ok(State::Dead),
            "parked" => Ok(State::Parked),
            "held" => Ok(State::Held),
            other => Err(UnknownState(other.to_owned())),
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a person did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditAction {
    /// Removed a record (`store forget`).
    Forget,
    /// Recorded a dead or parked event done by hand (`store resolve --done`).
    Resolve,
    /// Ran a dead or parked event again (`store retry`, `store resolve --retry`).
    Retry,
    /// Removed expired records now (`store gc`).
    Gc,
    /// Ran a final event again from its source message, read again from Kafka (`store replay`).
    Replay,
}

impl AuditAction {
    /// As the audit shows it: `forget`, `resolve`, `retry`, `gc`, `replay`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::Forget => "forget",
            AuditAction::Resolve => "resolve",
            AuditAction::Retry => "retry",
            AuditAction::Gc => "gc",
            AuditAction::Replay => "replay",
        }
    }
}

impl std::fmt::Display for AuditAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A time in µs since the epoch as RFC 3339 with microseconds (UTC).
pub fn rfc3339(us: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

/// The route a record scope names: what follows `#` in a topic's later route's scope
/// (`outbox.event.order#mailer`; Kafka topic names cannot hold a `#`), none on its
/// first route. The config makes these scopes (`config::Route::scope`).
pub fn route_of_scope(scope: &str) -> Option<&str> {
    scope.split_once('#').map(|(_, route)| route)
}

/// A record, times as RFC 3339: what `store get|list --json`, `store export`
/// and the admin API show of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordView {
    /// Handler executions started.
    pub attempts: u32,
    /// The held chain of its Kafka key (`on_dead = "hold"`), when it is in one: the
    /// dead or parked event that holds it, or a held event.
    #[serde(deserialize_with = "Option::deserialize")]
    pub chain: Option<ChainView>,
    /// When it was last claimed (or taken back for a re-run).
    #[serde(deserialize_with = "Option::deserialize")]
    pub claimed_at: Option<String>,
    /// Where the dead-letter copy went (`topic/partition@offset`).
    #[serde(deserialize_with = "Option::deserialize")]
    pub dead_letter: Option<String>,
    /// When it last became final (done, dead or parked).
    #[serde(deserialize_with = "Option::deserialize")]
    pub done_at: Option<String>,
    /// Deliveries suppressed, as counted on the record by earlier versions.
    pub duplicates: u64,
    /// The event's id.
    pub event_id: String,
    /// The event's type, if it has one.
    #[serde(deserialize_with = "Option::deserialize")]
    pub event_type: Option<String>,
    /// When the record is removed, unless it is written again before.
    #[serde(deserialize_with = "Option::deserialize")]
    pub expires_at: Option<String>,
    /// When the id was first seen.
    pub first_seen: String,
    /// The event's aggregate id, if it has one.
    #[serde(deserialize_with = "Option::deserialize")]
    pub key: Option<String>,
    /// The offset of the message it was last claimed from.
    pub offset: i64,
    /// The handler's outcome, e.g. `http 200`.
    #[serde(deserialize_with = "Option::deserialize")]
    pub outcome: Option<String>,
    /// The partition of that message.
    pub partition: i32,
    /// Why the event is dead or parked.
    #[serde(deserialize_with = "Option::deserialize")]
    pub reason: Option<String>,
    /// The dedup scope of the record: its topic (or `""`, shared), and for a
    /// topic's later routes `#` and the route's name. `null` from older versions.
    #[serde(default)]
    pub scope: Option<String>,
    /// `claimed`, `done`, `dead`, `parked` or `held`.
    pub state: State,
    /// The topic of that message.
    pub topic: String,
    /// When the record was last written.
    pub updated_at: String,
}

impl RecordView {
    /// The route of the record, on a topic's later route ([`route_of_scope`]).
    pub fn route(&self) -> Option<&str> {
        self.scope.as_deref().and_then(route_of_scope)
    }
}

/// A held chain as a record shows it: the Kafka key whose events wait, what they
/// wait for, and the held events in offset order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainView {
    /// The event the key's events wait for: dead, parked, or being run again
    /// (`claimed`). `None`: nothing any more; the held events run now, in order,
    /// at the partition's owner.
    #[serde(deserialize_with = "Option::deserialize")]
    pub head: Option<String>,
    /// Ids of the held events in offset order (`store get`: up to 1,000; lists: none).
    pub held: Vec<String>,
    /// Held events in the chain.
    pub held_total: u64,
    /// The Kafka message key.
    pub key: BytesView,
}

/// `store stats`, times as RFC 3339.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsView {
    /// Size of the store's files, as sled reports it.
    pub bytes_on_disk: u64,
    /// Records claimed and not finished.
    pub claimed: u64,
    /// Records dead.
    pub dead: u64,
    /// Records done.
    pub done: u64,
    /// Deliveries not run because their record was already final, over the store's life.
    pub duplicates_suppressed: u64,
    /// Records held behind a dead or parked event of their key.
    pub held: u64,
    /// When the newest record was first seen.
    #[serde(deserialize_with = "Option::deserialize")]
    pub newest: Option<String>,
    /// When the oldest record was first seen.
    #[serde(deserialize_with = "Option::deserialize")]
    pub oldest: Option<String>,
    /// Records parked.
    pub parked: u64,
}

/// One page of records in id order (`/v1/events`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PageView {
    /// The cursor to ask for the next page with (`?after=`); `None` on the last page.
    #[serde(deserialize_with = "Option::deserialize")]
    pub next: Option<String>,
    /// The page stopped at the service's read budget before it was full: more records
    /// may match after `next` (absent from earlier services: false).
    #[serde(default)]
    pub partial: bool,
    /// The records of this page.
    pub records: Vec<RecordView>,
}

/// One entry of the audit (`store audit`, `/v1/audit`): what a person did, times as RFC 3339.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditView {
    /// `forget`, `resolve`, `retry` or `gc`.
    pub action: AuditAction,
    /// When.
    pub at: String,
    /// The events it was done to (none for gc).
    pub events: Vec<AuditEventView>,
    /// What came of it: `done`, `dead again`, `error: …`, …
    pub outcome: String,
    /// Why, as the person said.
    #[serde(deserialize_with = "Option::deserialize")]
    pub reason: Option<String>,
    /// The credential's name, or `cli:<user>` for `outboxd store` on the store itself.
    pub who: String,
}

/// An event an audit entry names, and where its record was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEventView {
    /// The event id.
    pub id: String,
    /// The partition of its record; `None`: there was no record of it.
    #[serde(deserialize_with = "Option::deserialize")]
    pub partition: Option<i32>,
    /// The topic of its record; `None`: there was no record of it.
    #[serde(deserialize_with = "Option::deserialize")]
    pub topic: Option<String>,
}

/// One page of the audit, newest first (`/v1/audit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    /// The entries of this page.
    pub entries: Vec<AuditView>,
    /// The cursor to ask for the next (older) page with (`?before=`); `None` on the last page.
    #[serde(deserialize_with = "Option::deserialize")]
    pub next: Option<String>,
}

/// What `gc` removed (`/v1/gc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcView {
    /// Expired records removed.
    pub removed: u64,
}

/// The answer of a re-run (`/v1/retry`): the record it ended in, or the note
/// that an undecodable message now decoded and ran under its decoded id.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RetryView {
    /// It ran and ended in this record: `done`, or `dead` or `parked` again.
    Finished(Box<RecordView>),
    /// The stored message now decodes; it ran and is recorded under its decoded event id.
    Redecoded(RedecodedView),
}

/// The answer of the replay of one record (`/v1/replay`): the record it ended in,
/// or why its source message could not be read again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "replay", rename_all = "snake_case")]
pub enum ReplayView {
    /// It ran again and ended in this record (`done`, or `dead` or `parked`).
    Ran {
        /// The record now.
        record: Box<RecordView>,
    },
    /// The source topic no longer holds the message: its retention deleted it.
    Expired {
        /// The partition's first offset now.
        first_offset: i64,
    },
    /// The partition does not hold the offset (a compacted topic removed it).
    Missing,
    /// No route ran it under this record (its route no longer selects the event, the
    /// config changed): the record is as it was.
    NotRun {
        /// The record, as it was.
        record: Box<RecordView>,
    },
    /// The partition holds another event at the offset (the topic was deleted and
    /// created again, so its offsets started over): nothing ran.
    Other {
        /// The id of the event found there.
        event_id: String,
    },
}

/// `{"event_id": …, "note": …, "state": "rerun"}`: the stored message of an
/// undecodable record decoded and ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RedecodedView {
    /// The id the re-run was asked for (the undecodable record's).
    pub event_id: String,
    /// What became of it, for people.
    pub note: String,
    /// Always `rerun`: tells this answer from a record.
    pub state: RerunState,
}

/// The one value of [`RedecodedView::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RerunState {
    /// Not a record's state: the event ran under another id.
    Rerun,
}

impl RedecodedView {
    /// The answer for a re-run of the undecodable record `id`.
    pub fn new(id: &str) -> RedecodedView {
        RedecodedView {
            event_id: id.to_owned(),
            note: "recorded under its decoded event id".to_owned(),
            state: RerunState::Rerun,
        }
    }
}

// By hand, not untagged: a record with a missing field says which field,
// where an untagged enum would say only that no variant matched.
impl<'de> Deserialize<'de> for RetryView {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RetryView, D::Error> {
        let answer = Value::deserialize(d)?;
        if answer.get("state").and_then(Value::as_str) == Some("rerun") {
            serde_json::from_value(answer).map(RetryView::Redecoded).map_err(D::Error::custom)
        } else {
            serde_json::from_value(answer).map(|r| RetryView::Finished(Box::new(r))).map_err(D::Error::custom)
        }
    }
}

/// Bytes of a stored message: text when they are UTF-8, else `{"bytes": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BytesView {
    /// UTF-8 bytes, as text.
    Text(String),
    /// Other bytes, as numbers.
    Bytes {
        /// The bytes.
        bytes: Vec<u8>,
    },
}

impl BytesView {
    /// The view of optional bytes (a message's key, value or header value).
    pub fn of(b: &Option<Vec<u8>>) -> Option<BytesView> {
        let b = b.as_ref()?;
        Some(match std::str::from_utf8(b) {
            Ok(s) => BytesView::Text(s.to_owned()),
            Err(_) => BytesView::Bytes { bytes: b.clone() },
        })
    }
}

/// A stored message copy (of a dead or parked event), as `store export` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageView {
    /// Header names and values in the order they came (`[name, value]`); a value may be `null`.
    pub headers: Vec<(String, Option<BytesView>)>,
    /// The message key; `None` when it has none.
    #[serde(deserialize_with = "Option::deserialize")]
    pub key: Option<BytesView>,
    /// Its offset.
    pub offset: i64,
    /// Its partition.
    pub partition: i32,
    /// The topic it was consumed from.
    pub topic: String,
    /// The message value; `None` for a tombstone.
    #[serde(deserialize_with = "Option::deserialize")]
    pub value: Option<BytesView>,
}

/// One JSON Lines row of `store export`: the record's fields, plus `message`,
/// the message copy of dead and parked events.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ExportLine {
    /// The record.
    #[serde(flatten)]
    pub record: RecordView,
    /// Its message copy, when one is stored.
    #[serde(default)]
    pub message: Option<MessageView>,
}

// By hand: `message` goes in among the record's fields, in key order, as it
// always has (a flattened record would put it last).
impl Serialize for ExportLine {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let mut line = serde_json::to_value(&self.record).map_err(S::Error::custom)?;
        if let (Some(m), Value::Object(fields)) = (&self.message, &mut line) {
            fields.insert("message".to_owned(), serde_json::to_value(m).map_err(S::Error::custom)?);
        }
        line.serialize(s)
    }
}

/// The line as `store export` writes it: compact JSON.
impl std::fmt::Display for ExportLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}
