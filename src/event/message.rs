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

    /// The id a message without an event id of its own is recorded under, by `kind`
    /// and its position: `undecodable/<topic>/<partition>/<offset>`, `failed/...`.
    pub(crate) fn id_at_position(&self, kind: PositionId) -> String {
        format!("{}/{}/{}/{}", kind.as_str(), self.topic, self.partition, self.offset)
    }
}

/// Why a message is recorded under its position ([`RawMessage::id_at_position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PositionId {
    /// It could not be decoded.
    Undecodable,
    /// Handling it failed unexpectedly (a panic).
    Failed,
}

impl PositionId {
    /// Both kinds.
    pub(crate) const ALL: [PositionId; 2] = [PositionId::Undecodable, PositionId::Failed];

    fn as_str(self) -> &'static str {
        match self {
            PositionId::Undecodable => "undecodable",
            PositionId::Failed => "failed",
        }
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
