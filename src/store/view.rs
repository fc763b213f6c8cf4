//! What people and the admin API see of the store: records, stats, pages,
//! message copies and the answers of repairs as typed views, whose serde form
//! is the JSON that `store … --json`, `store export` and `/v1` answer with, and
//! the tables `store …` prints from them. Both sides of the admin API read and
//! write these types, so a field renamed on one side fails to deserialize on the
//! other instead of reading as a default. comfy-table is used only here.
//!
//! The fields of each view are declared in alphabetical order: that is the
//! order the JSON has always had (serde_json's map sorts its keys), and the
//! order `store get` and `store stats` print their rows in. Optional fields are
//! still required on the wire (as `null`): a missing one is an error.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::{AuditAction, AuditEntry, ChainInfo, Record, State, Stats, Store, StoreError};
use crate::event::RawMessage;

/// A time in µs since the epoch as RFC 3339 with microseconds (UTC).
pub fn rfc3339(us: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
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
    /// `claimed`, `done`, `dead`, `parked` or `held`.
    pub state: State,
    /// The topic of that message.
    pub topic: String,
    /// When the record was last written.
    pub updated_at: String,
}

impl From<&Record> for RecordView {
    fn from(r: &Record) -> RecordView {
        RecordView {
            attempts: r.attempts,
            chain: None,
            claimed_at: r.claimed_at_us.map(rfc3339),
            dead_letter: r.dead_letter.clone(),
            done_at: r.done_at_us.map(rfc3339),
            duplicates: r.duplicates,
            event_id: r.event_id.clone(),
            event_type: r.event_type.clone(),
            expires_at: r.expires_at_us.map(rfc3339),
            first_seen: rfc3339(r.first_seen_us),
            key: r.key.clone(),
            offset: r.offset,
            outcome: r.outcome.clone(),
            partition: r.partition,
            reason: r.reason.clone(),
            state: r.state,
            topic: r.topic.clone(),
            updated_at: rfc3339(r.updated_at_us),
        }
    }
}

/// A record with its held chain (`store get`, `list`, `export` and `/v1`), with at
/// most `shown` ids of the chain's held events.
pub fn record_view(store: &Store, r: &Record, shown: usize) -> RecordView {
    RecordView { chain: store.reads().chain(r, shown).map(ChainView::from), ..RecordView::from(r) }
}

/// Ids of held events `store get` shows (`held_total` counts them all).
pub const CHAIN_SHOWN: usize = 1000;

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

impl From<ChainInfo> for ChainView {
    fn from(c: ChainInfo) -> ChainView {
        let key = Some(c.chain.key);
        ChainView {
            head: c.head,
            held: c.held,
            held_total: c.held_total,
            key: BytesView::of(&key).expect("a chain has a key"),
        }
    }
}

impl ChainView {
    /// One table cell: the key, what it waits for, and the held events.
    fn cell(&self) -> String {
        let key = match &self.key {
            BytesView::Text(t) => format!("{t:?}"),
            BytesView::Bytes { bytes } => format!("{bytes:02x?}"),
        };
        let waits = match &self.head {
            Some(head) => format!("waits for {head}"),
            None => "released: its held events run now".to_owned(),
        };
        let more = self.held_total.saturating_sub(self.held.len() as u64);
        let mut held = self.held.join(", ");
        if more > 0 {
            held.push_str(&format!("{}{more} more", if held.is_empty() { "" } else { ", " }));
        }
        format!("key {key}; {waits}; {} held: {held}", self.held_total)
    }
}

impl RecordView {
    /// Each field's name and table cell, in the order of its JSON (`store get`).
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("attempts", self.attempts.to_string()),
            ("chain", self.chain.as_ref().map_or_else(|| "-".to_owned(), ChainView::cell)),
            ("claimed_at", cell(&self.claimed_at)),
            ("dead_letter", cell(&self.dead_letter)),
            ("done_at", cell(&self.done_at)),
            ("duplicates", self.duplicates.to_string()),
            ("event_id", self.event_id.clone()),
            ("event_type", cell(&self.event_type)),
            ("expires_at", cell(&self.expires_at)),
            ("first_seen", self.first_seen.clone()),
            ("key", cell(&self.key)),
            ("offset", self.offset.to_string()),
            ("outcome", cell(&self.outcome)),
            ("partition", self.partition.to_string()),
            ("reason", cell(&self.reason)),
            ("state", self.state.to_string()),
            ("topic", self.topic.clone()),
            ("updated_at", self.updated_at.clone()),
        ]
    }
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

impl From<&Stats> for StatsView {
    fn from(s: &Stats) -> StatsView {
        StatsView {
            bytes_on_disk: s.bytes_on_disk,
            claimed: s.claimed,
            dead: s.dead,
            done: s.done,
            duplicates_suppressed: s.duplicates_suppressed,
            held: s.held,
            newest: s.newest_us.map(rfc3339),
            oldest: s.oldest_us.map(rfc3339),
            parked: s.parked,
        }
    }
}

impl StatsView {
    /// Each count's name and table cell, in the order of its JSON (`store stats`).
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("bytes_on_disk", self.bytes_on_disk.to_string()),
            ("claimed", self.claimed.to_string()),
            ("dead", self.dead.to_string()),
            ("done", self.done.to_string()),
            ("duplicates_suppressed", self.duplicates_suppressed.to_string()),
            ("held", self.held.to_string()),
            ("newest", cell(&self.newest)),
            ("oldest", cell(&self.oldest)),
            ("parked", self.parked.to_string()),
        ]
    }
}

/// One page of records in id order (`/v1/events`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PageView {
    /// The cursor to ask for the next page with (`?after=`); `None` on the last page.
    #[serde(deserialize_with = "Option::deserialize")]
    pub next: Option<String>,
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

impl From<&AuditEntry> for AuditView {
    fn from(e: &AuditEntry) -> AuditView {
        AuditView {
            action: e.action,
            at: rfc3339(e.at_us),
            events: e
                .events
                .iter()
                .map(|ev| AuditEventView {
                    id: ev.id.clone(),
                    partition: ev.source.as_ref().map(|s| s.1),
                    topic: ev.source.as_ref().map(|s| s.0.clone()),
                })
                .collect(),
            outcome: e.outcome.clone(),
            reason: e.reason.clone(),
            who: e.who.clone(),
        }
    }
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

/// `store audit`: one row per entry, newest first.
pub fn audit_table(entries: &[AuditView]) -> Table {
    let mut t = table(&["at", "who", "action", "events", "outcome", "reason"]);
    for e in entries {
        let events: Vec<String> = e
            .events
            .iter()
            .map(|ev| match (&ev.topic, ev.partition) {
                (Some(topic), Some(p)) => format!("{} ({topic}/{p})", ev.id),
                _ => ev.id.clone(),
            })
            .collect();
        let events = if events.is_empty() { "-".to_owned() } else { events.join("\n") };
        t.add_row(vec![e.at.clone(), e.who.clone(), e.action.to_string(), events, e.outcome.clone(), cell(&e.reason)]);
    }
    t
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
    fn of(b: &Option<Vec<u8>>) -> Option<BytesView> {
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

impl From<&RawMessage> for MessageView {
    fn from(m: &RawMessage) -> MessageView {
        MessageView {
            headers: m.headers.iter().map(|(k, v)| (k.clone(), BytesView::of(v))).collect(),
            key: BytesView::of(&m.key),
            offset: m.offset,
            partition: m.partition,
            topic: m.topic.clone(),
            value: BytesView::of(&m.value),
        }
    }
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

/// The export line of `r`: the record, plus the message copy of dead, parked and held events.
pub fn export_line(store: &Store, r: &Record) -> Result<ExportLine, StoreError> {
    Ok(ExportLine { record: record_view(store, r, 0), message: store.message_of(r)?.as_ref().map(MessageView::from) })
}

/// An empty table in the style of every `outboxd` table; no header row when
/// every title is empty.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    if header.iter().any(|h| !h.is_empty()) {
        t.set_header(header.to_vec());
    }
    t
}

/// An optional text as a table cell: `-` when there is none.
fn cell(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".to_owned())
}

/// `store stats`: one row per count, no header.
pub fn stats_table(stats: &StatsView) -> Table {
    fields(table(&["", ""]), stats.rows())
}

/// `store get`: one row per field of the record.
pub fn record_table(record: &RecordView) -> Table {
    fields(table(&["field", "value"]), record.rows())
}

fn fields(mut t: Table, rows: Vec<(&'static str, String)>) -> Table {
    for (k, v) in rows {
        t.add_row(vec![k.to_owned(), v]);
    }
    t
}

/// `store list`: one row per record.
pub fn records_table(records: &[RecordView]) -> Table {
    let mut t = table(&["event_id", "state", "attempts", "topic/partition@offset", "updated_at", "outcome / reason"]);
    for r in records {
        let outcome = match (&r.chain, r.state) {
            (Some(c), State::Held) => match &c.head {
                Some(head) => format!("held behind {head}"),
                None => "held; its chain is released, it runs now".to_owned(),
            },
            (Some(c), _) if c.held_total > 0 => format!("{} [holds {} event(s)]", cell(&r.reason), c.held_total),
            _ if r.outcome.is_none() => cell(&r.reason),
            _ => cell(&r.outcome),
        };
        t.add_row(vec![
            r.event_id.clone(),
            r.state.to_string(),
            r.attempts.to_string(),
            format!("{}/{}@{}", r.topic, r.partition, r.offset),
            r.updated_at.clone(),
            outcome,
        ]);
    }
    t
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
