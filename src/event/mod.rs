//! The decoded outbox event and where it came from: what a handler is given.
//! (The message it was decoded from, `RawMessage`, is the crate's own.)

mod json;
mod message;

pub use json::Json;
internal_use!(message::{RawMessage, TraceContext});
pub(crate) use message::PositionId;

/// Where a message sits in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Position {
    /// The topic the message was consumed from.
    pub topic: String,
    /// The partition within that topic.
    pub partition: i32,
    /// The message's offset within that partition.
    pub offset: i64,
}

impl Position {
    /// The message at `offset` of `partition` of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32, offset: i64) -> Position {
        Position { topic: topic.into(), partition, offset }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// The outbox `payload` column, in whichever form the converters left it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Payload {
    /// JSON (objects, arrays, scalars), after unwrapping converter envelopes:
    /// its text as it came and its value on demand.
    Json(Json),
    /// Text that is not JSON.
    Text(String),
    /// Bytes that are not UTF-8.
    Bytes(Vec<u8>),
    /// A null value (tombstone, or an empty payload column).
    Null,
}

impl Payload {
    /// The body to send and its content type.
    pub fn to_body(&self) -> (Vec<u8>, Option<&'static str>) {
        match self {
            Payload::Json(j) => (j.text().as_bytes().to_vec(), Some("application/json")),
            Payload::Text(s) => (s.clone().into_bytes(), Some("text/plain; charset=utf-8")),
            Payload::Bytes(b) => (b.clone(), Some("application/octet-stream")),
            Payload::Null => (Vec::new(), None),
        }
    }
}

/// The JSON rendering of the `log` handler: JSON as is, text as a string,
/// bytes as `"<N bytes>"`, null as null.
impl serde::Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Payload::Json(j) => j.serialize(s),
            Payload::Text(t) => s.serialize_str(t),
            Payload::Bytes(b) => s.collect_str(&format_args!("<{} bytes>", b.len())),
            Payload::Null => s.serialize_unit(),
        }
    }
}

/// One outbox event, ready for a handler.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutboxEvent {
    /// The dedup key (outbox `id`).
    pub id: String,
    /// The aggregate id (Kafka key), unwrapped from JSON quoting or envelopes.
    pub aggregate_id: Option<String>,
    /// The event type, from the handler's `event_type_header` (Debezium: `eventType`).
    pub event_type: Option<String>,
    /// The value, decoded (or its original bytes with `body = "raw"`).
    pub payload: Payload,
    /// Where the message sits in Kafka.
    pub position: Position,
    /// Kafka timestamp (ms since the epoch), when the broker gave one.
    pub timestamp_ms: Option<i64>,
    /// W3C trace context of the transaction that wrote the event, when the pipeline carries it.
    pub traceparent: Option<String>,
    /// Set for a topic's second and later routes: the idempotency key this route
    /// sends instead of the event id (the id, `#`, the route's name). Read it with
    /// [`OutboxEvent::idempotency_key`].
    pub route_key: Option<String>,
    /// The message's headers in the order they came (a name may repeat; `None` is a
    /// header without a value), given only to a handler that reads them (a `postgres`
    /// statement's `header.NAME` parameter); empty for every other.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl OutboxEvent {
    /// An event with id `id` at `position`: no aggregate id, type, timestamp or trace
    /// context (set the fields), e.g. to test a handler of your own.
    pub fn new(id: impl Into<String>, payload: Payload, position: Position) -> OutboxEvent {
        OutboxEvent {
            id: id.into(),
            aggregate_id: None,
            event_type: None,
            payload,
            position,
            timestamp_ms: None,
            traceparent: None,
            route_key: None,
            headers: Vec::new(),
        }
    }

    /// What the receiver is given to recognise a repeated delivery: the event id, or on
    /// a topic's later routes the id with the route's name ([`OutboxEvent::route_key`]).
    pub fn idempotency_key(&self) -> &str {
        self.route_key.as_deref().unwrap_or(&self.id)
    }
}
