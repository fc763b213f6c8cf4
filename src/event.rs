//! The decoded outbox event and where it came from.

use serde_json::Value;

/// Where a message sits in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Position {
    /// The topic the message was consumed from.
    pub topic: String,
    /// The partition within that topic.
    pub partition: i32,
    /// The message's offset within that partition.
    pub offset: i64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// A Kafka message as it arrived, free of any client library's types.
#[derive(Debug, Clone, Default)]
pub struct RawMessage {
    /// The topic it was consumed from.
    pub topic: String,
    /// The partition within that topic.
    pub partition: i32,
    /// Its offset within that partition.
    pub offset: i64,
    /// The message key (Debezium: the aggregate id); `None` when the message has none.
    pub key: Option<Vec<u8>>,
    /// The message value; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in the order they came, a name may repeat; `None` is a header without a value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Kafka timestamp (ms since the epoch), when the broker gave one.
    pub timestamp_ms: Option<i64>,
}

impl RawMessage {
    /// Bytes the message holds in memory (key, value, headers), for the in-flight bound.
    pub fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len)).sum();
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + headers
    }

    pub(crate) fn position(&self) -> Position {
        Position { topic: self.topic.clone(), partition: self.partition, offset: self.offset }
    }
}

/// The W3C trace context a message carries: where the trace of the transaction that
/// wrote the event goes on. Both values are checked to be header-safe and of the W3C
/// shape (`traceparent` as `00-<32 hex>-<16 hex>-<2 hex>`, lower case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`.
    pub traceparent: String,
    /// Vendor entries that travel with it, when there are any.
    pub tracestate: Option<String>,
}

/// The outbox `payload` column, in whichever form the converters left it.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// JSON (objects, arrays, scalars), after unwrapping converter envelopes.
    Json(Value),
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
            Payload::Json(v) => (serde_json::to_vec(v).unwrap_or_default(), Some("application/json")),
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
            Payload::Json(v) => v.serialize(s),
            Payload::Text(t) => s.serialize_str(t),
            Payload::Bytes(b) => s.collect_str(&format_args!("<{} bytes>", b.len())),
            Payload::Null => s.serialize_unit(),
        }
    }
}

/// One outbox event, ready for a handler.
#[derive(Debug, Clone)]
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
}
