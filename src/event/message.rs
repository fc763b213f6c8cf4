//! A consumed Kafka message as the decoder takes it, and the trace context it carries.

use super::Position;

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
