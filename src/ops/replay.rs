//! `outboxd store replay`: run a window of final events again. The records name
//! the source topic, partition and offset of each event, and Kafka keeps the
//! messages: a replay selects records ([`Window`]), reads each one's message again
//! ([`Rereads`]) and runs it through the normal path under its record
//! ([`crate::engine::Executor::replay`]), once each, in offset order (so per key
//! in the order the events came). Each replayed event is audited like a retry.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::audit::{self, Actor};
use super::changelog::explain;
use super::{OpsError, StoreApi};
use crate::config::KafkaConfig;
use crate::engine::Executor;
use crate::kafka::{Reread, Rereader};
use crate::store::{AuditAction, Replayed, State, StoreError};
use crate::wire::{RecordView, ReplayView};

/// The idempotency-key suffix of a replay with `--new-key`: `#replay-` and
/// `token` (what the replay names itself by, e.g. the time it began, in ms),
/// refused unless it is 1 to 32 letters, digits, `-` or `_`.
pub fn new_key_suffix(token: &str) -> Result<String, OpsError> {
    let fits = (1..=32).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    match fits {
        true => Ok(format!("#replay-{token}")),
        false => Err(OpsError::BadNewKey(token.to_owned())),
    }
}

/// How long reading one message again may wait for the brokers.
const REREAD_WAIT: Duration = Duration::from_secs(30);

/// Which records a replay takes: of one topic, optionally of one event type and
/// some states, first seen within `[since, until)`.
#[derive(Debug, Clone)]
pub struct Window {
    /// The source topic.
    pub topic: String,
    /// Only events of this type.
    pub event_type: Option<String>,
    /// Only records in these states (done, dead, parked); empty: all three.
    pub states: Vec<State>,
    /// First seen at or after this time (µs since the epoch).
    pub since_us: i64,
    /// First seen before this time (µs since the epoch).
    pub until_us: i64,
}

/// The states a replay may take: final, and not waiting in a held chain.
pub const REPLAYABLE: [State; 3] = [State::Done, State::Dead, State::Parked];

/// Why a window as people wrote it is refused (the CLI's flags, the console's form).
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// A state a replay does not take.
    #[error("state {0}: a replay takes done, dead or parked records (a held event runs by itself once its chain is released; a claimed one is in flight)")]
    State(State),
    /// A bound that is neither a time nor a time ago (`which`: since or until).
    #[error("{which}: {text:?} is neither a time (2026-12-04T10:00:00Z) nor a time ago (6h, 90m)")]
    Time {
        /// `since` or `until`.
        which: &'static str,
        /// As written.
        text: String,
    },
    /// `since` is not before `until`.
    #[error("since must be before until")]
    Empty,
}

impl Window {
    /// The window people asked for: `since` and `until` (now when `None`) each an
    /// RFC 3339 time or a time ago (`6h`, `90m`).
    pub fn new(
        topic: &str,
        event_type: Option<&str>,
        states: Vec<State>,
        since: &str,
        until: Option<&str>,
    ) -> Result<Window, WindowError> {
        if let Some(s) = states.iter().find(|s| !REPLAYABLE.contains(s)) {
            return Err(WindowError::State(*s));
        }
        let now = std::time::SystemTime::now();
        let since_us = bound(since, now).ok_or_else(|| WindowError::Time { which: "since", text: since.to_owned() })?;
        let until_us = match until {
            None => micros(now),
            Some(u) => bound(u, now).ok_or_else(|| WindowError::Time { which: "until", text: u.to_owned() })?,
        };
        if since_us >= until_us {
            return Err(WindowError::Empty);
        }
        let event_type = event_type.map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned);
        Ok(Window { topic: topic.trim().to_owned(), event_type, states, since_us, until_us })
    }

    /// Whether the replay takes `record`.
    pub fn selects(&self, record: &RecordView) -> bool {
        let seen = parse_time(&record.first_seen);
        self.takes(&record.topic, record.state, record.event_type.as_deref(), seen)
    }

    /// Whether the replay takes the record of an event with these fields (first seen
    /// at `seen_us`).
    fn takes(&self, topic: &str, state: State, event_type: Option<&str>, seen_us: Option<i64>) -> bool {
        let states: &[State] = if self.states.is_empty() { &REPLAYABLE } else { &self.states };
        topic == self.topic
            && states.contains(&state)
            && self.event_type.as_deref().is_none_or(|t| event_type == Some(t))
            && seen_us.is_some_and(|us| self.since_us <= us && us < self.until_us)
    }
}

/// The records `window` takes, in the order they replay: by partition and offset
/// (per key, the order the events came), a topic's routes in the order of their scopes.
/// Only the selected records are kept while the topic's records are read, so a window
/// costs memory for what it holds, not for the topic.
pub async fn select(api: &impl StoreApi, window: &Window) -> Result<Vec<RecordView>, OpsError> {
    Ok(in_order(api.replay_window(window).await?))
}

/// [`select`] on the store itself, blocking (a scan of the topic's records): the console's.
pub fn select_here(local: &super::Local, window: &Window) -> Result<Vec<RecordView>, OpsError> {
    Ok(in_order(taken_here(local, window)?))
}

/// The records `window` takes on the store itself, in no order (blocking: a scan of the
/// topic's records, judged on each record's own fields before a view is made of it).
pub(super) fn taken_here(local: &super::Local, window: &Window) -> Result<Vec<RecordView>, StoreError> {
    local.matching(&window.topic, |r| window.takes(&r.topic, r.state, r.event_type.as_deref(), Some(r.first_seen_us)))
}

/// `records`, taken already, in the order they replay.
fn in_order(mut records: Vec<RecordView>) -> Vec<RecordView> {
    records.sort_by(|a, b| (a.partition, a.offset, &a.scope).cmp(&(b.partition, b.offset, &b.scope)));
    records
}

/// The dedup scope of `record` (its topic for a record of a release before scopes).
pub fn scope_of(record: &RecordView) -> &str {
    record.scope.as_deref().unwrap_or(&record.topic)
}

/// A bound of a window in µs: an RFC 3339 time, or a time ago before `now`.
fn bound(text: &str, now: std::time::SystemTime) -> Option<i64> {
    let text = text.trim();
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Some(micros(t));
    }
    let ago = humantime::parse_duration(text).ok()?;
    Some(micros(now.checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH)))
}

fn micros(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The token of a replay's new keys: when it began, in ms since the epoch.
pub fn new_key_token() -> String {
    (micros(std::time::SystemTime::now()) / 1000).to_string()
}

/// A record view's time (RFC 3339, as [`crate::wire::rfc3339`] writes it) in µs.
fn parse_time(text: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339(text).ok()?;
    i64::try_from(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_micros()).ok()
}

/// One reader of source messages, shared by the replays of a process and built at
/// the first read (a store command that replays nothing needs no brokers).
#[derive(Clone, Default)]
pub struct Rereads(Arc<Mutex<Option<Rereader>>>);

impl Rereads {
    /// The message at `offset` of `topic`/`partition` now, read off the runtime's workers.
    pub async fn read(&self, kafka: &KafkaConfig, topic: &str, partition: i32, offset: i64) -> Result<Reread, OpsError> {
        let t = topic.to_owned();
        let read = self.with_reader(kafka, move |reader| reader.read(&t, partition, offset)).await;
        joined(read, |error| OpsError::Reread { topic: topic.to_owned(), partition, offset, error })
    }

    /// The first offset of each partition of `records` now, asked of the brokers
    /// (what the topic still holds of a window, before a replay runs).
    pub async fn first_offsets(
        &self,
        kafka: &KafkaConfig,
        records: &[RecordView],
    ) -> Result<std::collections::BTreeMap<(String, i32), i64>, OpsError> {
        let mut partitions: Vec<(String, i32)> = records.iter().map(|r| (r.topic.clone(), r.partition)).collect();
        partitions.sort();
        partitions.dedup();
        let asked = self
            .with_reader(kafka, move |reader| {
                partitions.into_iter().map(|(t, p)| reader.first_offset(&t, p).map(|first| ((t, p), first))).collect()
            })
            .await;
        joined(asked, |error| OpsError::Config { what: "asking the brokers for the topic's first offsets".into(), error })
    }

    /// Runs `f` with the reader (built at the first use) on a blocking task.
    async fn with_reader<T: Send + 'static>(
        &self,
        kafka: &KafkaConfig,
        f: impl FnOnce(&mut Rereader) -> Result<T, crate::kafka::KafkaError> + Send + 'static,
    ) -> Result<Result<T, crate::kafka::KafkaError>, tokio::task::JoinError> {
        let (reader, kafka) = (self.0.clone(), kafka.clone());
        tokio::task::spawn_blocking(move || {
            let mut reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            if reader.is_none() {
                *reader = Some(Rereader::build(&kafka, REREAD_WAIT)?);
            }
            f(reader.as_mut().expect("built above"))
        })
        .await
    }
}

/// The answer of a Kafka request made on a blocking task; its failure, or the task's,
/// told by `failed`.
fn joined<T>(
    answer: Result<Result<T, crate::kafka::KafkaError>, tokio::task::JoinError>,
    failed: impl FnOnce(super::error::BoxError) -> OpsError,
) -> Result<T, OpsError> {
    match answer {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(failed(e.into())),
        Err(e) => Err(failed(e.into())),
    }
}

/// Replays the record of `id` in `scope` through `exec`: its source message read
/// again by `rereads`, run under the record, with `key_suffix` appended to the
/// idempotency key when given. Audited under `actor` with what it came to, also
/// when it fails or the message is gone.
pub async fn replay_by(
    exec: &Executor,
    rereads: &Rereads,
    scope: &str,
    id: &str,
    key_suffix: Option<&str>,
    actor: &Actor,
) -> Result<ReplayView, OpsError> {
    let event = audit::event(&exec.store, id);
    let answer = replay_one(exec, rereads, scope, id, key_suffix).await;
    let outcome = match &answer {
        Ok(view) => outcome(view, key_suffix),
        Err(e) => audit::failed(e),
    };
    audit::record(&exec.store, actor, AuditAction::Replay, vec![event], outcome).await;
    answer.map_err(|e| OpsError::Replay { id: id.to_owned(), error: Box::new(e) })
}

async fn replay_one(
    exec: &Executor,
    rereads: &Rereads,
    scope: &str,
    id: &str,
    key_suffix: Option<&str>,
) -> Result<ReplayView, OpsError> {
    let record = exec.store.reads().get_in(scope, id)?.ok_or_else(|| OpsError::NotFound(id.to_owned()))?;
    match rereads.read(&exec.config.kafka, &record.topic, record.partition, record.offset).await? {
        Reread::Expired { first } => Ok(ReplayView::Expired { first_offset: first }),
        Reread::Missing => Ok(ReplayView::Missing),
        Reread::Found(message) => {
            // Offsets start over when a topic is deleted and created again: what is there
            // now may be another event, which must not run under this record (nor at all).
            // (A record named by its position, of a message that could not be decoded or
            // handled, is that message whatever it decodes to now.)
            if !named_by_position(id, &message) {
                if let Some(Ok(found)) = exec.decode_copy(&message).await {
                    if found.id != id {
                        return Ok(ReplayView::Other { event_id: found.id });
                    }
                }
            }
            match exec.replay(scope, id, &message, key_suffix).await.map_err(|e| explain(id, e))? {
                Some(Replayed::Ran(now)) => Ok(ReplayView::Ran { record: Box::new(RecordView::from(&now)) }),
                Some(Replayed::NotRun(was)) => Ok(ReplayView::NotRun { record: Box::new(RecordView::from(&was)) }),
                None => Err(OpsError::NotFound(id.to_owned())),
            }
        }
    }
}

/// Whether `id` is the record of an undecodable or failed message at `message`'s
/// position (`undecodable/<topic>/<partition>/<offset>`, `failed/...`): such a record
/// has no event id of its own.
fn named_by_position(id: &str, message: &crate::event::RawMessage) -> bool {
    crate::event::PositionId::ALL.iter().any(|kind| id == message.id_at_position(*kind))
}

/// What a replay came to, as its audit entry says.
fn outcome(view: &ReplayView, key_suffix: Option<&str>) -> String {
    match view {
        ReplayView::Ran { record } => {
            let key = key_suffix.map_or_else(|| "its own key".to_owned(), |s| format!("key suffix {s}"));
            format!("{} (replayed with {key})", record.state)
        }
        ReplayView::Expired { first_offset } => {
            format!("not replayed: the topic no longer holds the message (its first offset is {first_offset})")
        }
        ReplayView::Missing => "not replayed: the partition does not hold the message's offset".to_owned(),
        ReplayView::NotRun { .. } => "not replayed: no route takes the event under this record now".to_owned(),
        ReplayView::Other { event_id } => {
            format!("not replayed: the partition holds another event ({event_id}) at that offset now")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rfc3339;

    fn record(state: State, event_type: Option<&str>, seen_us: i64) -> RecordView {
        let json = serde_json::json!({
            "attempts": 1, "chain": null, "claimed_at": null, "dead_letter": null, "done_at": null,
            "duplicates": 0, "event_id": "e1", "event_type": event_type, "expires_at": null,
            "first_seen": rfc3339(seen_us), "key": null, "offset": 7, "outcome": null, "partition": 0,
            "reason": null, "scope": "orders", "state": state, "topic": "orders", "updated_at": rfc3339(seen_us),
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_window_is_written_as_times_or_times_ago_and_refused_with_its_reason() {
        let w = Window::new(" orders ", Some(" "), vec![State::Dead], "2026-12-04T10:00:00Z", Some("2026-12-04T11:00:00Z"))
            .unwrap();
        assert_eq!((w.topic.as_str(), w.event_type.as_deref()), ("orders", None));
        assert_eq!(w.until_us - w.since_us, 3_600_000_000);
        let ago = Window::new("orders", Some("OrderPaid"), Vec::new(), "6h", None).unwrap();
        assert!((ago.until_us - ago.since_us - 6 * 3_600_000_000).abs() < 1_000_000, "6 hours until now");
        let e = Window::new("orders", None, vec![State::Held], "6h", None).unwrap_err().to_string();
        assert!(e.starts_with("state held: a replay takes done, dead or parked"), "{e}");
        let e = Window::new("orders", None, Vec::new(), "yesterday", None).unwrap_err().to_string();
        assert!(e.starts_with("since: \"yesterday\" is neither a time"), "{e}");
        let e = Window::new("orders", None, Vec::new(), "1h", Some("2h")).unwrap_err().to_string();
        assert_eq!(e, "since must be before until");
    }

    #[test]
    fn records_of_undecodable_and_failed_messages_are_named_by_their_position() {
        let m = crate::event::RawMessage {
            topic: "orders".into(),
            partition: 2,
            offset: 41,
            key: None,
            value: None,
            headers: Vec::new(),
            timestamp_ms: None,
        };
        assert!(named_by_position("undecodable/orders/2/41", &m));
        assert!(named_by_position("failed/orders/2/41", &m));
        assert!(!named_by_position("undecodable/orders/2/40", &m));
        assert!(!named_by_position("e1", &m));
    }

    #[test]
    fn a_window_takes_final_records_of_its_topic_type_and_time_only() {
        let hour = 3_600_000_000;
        let w = Window {
            topic: "orders".into(),
            event_type: Some("OrderPaid".into()),
            states: Vec::new(),
            since_us: 10 * hour,
            until_us: 11 * hour,
        };
        assert!(w.selects(&record(State::Done, Some("OrderPaid"), 10 * hour)));
        assert!(w.selects(&record(State::Dead, Some("OrderPaid"), 10 * hour + 5)));
        assert!(!w.selects(&record(State::Done, Some("OrderPaid"), 11 * hour)), "until is exclusive");
        assert!(!w.selects(&record(State::Done, Some("OrderPaid"), 10 * hour - 1)));
        assert!(!w.selects(&record(State::Done, Some("OrderShipped"), 10 * hour)));
        assert!(!w.selects(&record(State::Done, None, 10 * hour)));
        assert!(!w.selects(&record(State::Held, Some("OrderPaid"), 10 * hour)), "held runs later, by itself");
        assert!(!w.selects(&record(State::Claimed, Some("OrderPaid"), 10 * hour)), "claimed is in flight");
        let dead_only = Window { states: vec![State::Dead], event_type: None, ..w };
        assert!(dead_only.selects(&record(State::Dead, None, 10 * hour)));
        assert!(!dead_only.selects(&record(State::Done, None, 10 * hour)));
    }
}
