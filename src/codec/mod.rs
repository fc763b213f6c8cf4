//! The one decoder: Kafka message → [`OutboxEvent`], as the handler's
//! [`Layout`] says. Values and keys in the JSON/text shapes Debezium's
//! EventRouter produces with the String and Json converters (schemas on or
//! off, expanded payloads, JSON header converter), or Avro in the
//! Confluent wire format with schemas from the registry ([`crate::avro`]).
//!
//! [`Decoder::decode`] is what the engine, `outboxd store retry`, the fuzz
//! target and the decode tests all call. Its errors say what the caller does:
//! [`DecodeError::is_transient`] ones (the registry cannot answer) make the
//! event wait; every other one is the message's fault and dead-letters it.

mod json;
#[cfg(test)]
mod tests;
mod trace;

use serde_json::Value;

use crate::avro::{self, AvroError, Part};
use crate::config::{Body, EventIdSource, Format, HandlerConfig};
use crate::event::{OutboxEvent, Payload, RawMessage};

pub use json::{decode_text, decode_value};
pub use trace::trace_context;

/// Longest event id we accept: ids are keys in the store and go into URLs.
pub const MAX_EVENT_ID_LEN: usize = 512;

/// Debezium's semantic type for `json`/`jsonb` columns: the JSON arrives as a string.
const DEBEZIUM_JSON_SCHEMA: &str = "io.debezium.data.Json";

/// Why a message is not an outbox event (dead-lettered, never retried), or,
/// for [`DecodeError::Registry`], why it cannot be decoded yet (it waits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message has no event id header of this name.
    #[error("no {0:?} header (the event id); is Debezium's EventRouter in the pipeline?")]
    MissingIdHeader(String),
    /// The event id header appears this many times, not all with the same value.
    #[error("header {0:?} appears {1} times with different values")]
    ConflictingIdHeaders(String, usize),
    /// The event id is the empty string.
    #[error("event id is empty")]
    EmptyId,
    /// The event id is this many bytes, longer than [`MAX_EVENT_ID_LEN`].
    #[error("event id is {0} bytes, more than {MAX_EVENT_ID_LEN}")]
    IdTooLong(usize),
    /// The event id header's bytes are not UTF-8.
    #[error("event id is not UTF-8")]
    IdNotUtf8,
    /// The value has nothing at the configured event id field (a dotted path).
    #[error("event id field {0:?} not found in the value")]
    MissingIdField(String),
    /// The configured event id field holds an object, an array, a boolean or null.
    #[error("event id field {0:?} is not a string or number")]
    IdFieldNotScalar(String),
    /// The event id is configured as a field, but the value is not JSON.
    #[error("value is not JSON, but the event id is configured as a field of it")]
    ValueNotJson,
    /// A string marked as Debezium's JSON type does not parse as JSON.
    #[error("value says it is JSON ({DEBEZIUM_JSON_SCHEMA}) but is not: {0}")]
    InvalidEmbeddedJson(String),
    /// `format = "avro"`, but the value lacks the Confluent framing.
    #[error("format = \"avro\" but the value is not in the Confluent wire format")]
    NotAvro,
    /// An Avro value or key that cannot be decoded: an unknown schema id, one of
    /// another topic's subjects, a datum that does not match, no registry configured.
    #[error("{}{error}", key_prefix(*part))]
    Avro {
        /// Whether the key or the value failed.
        part: Part,
        /// Why it failed.
        error: AvroError,
    },
    /// The schema registry cannot answer now: unreachable, or refusing us
    /// ([`AvroError::is_transient`]). Not the message's fault: it waits.
    #[error("{}{error}", key_prefix(*part))]
    Registry {
        /// Whether the key's or the value's schema was looked up.
        part: Part,
        /// The schema id from the message's framing.
        schema_id: u32,
        /// What the registry lookup failed with.
        error: AvroError,
    },
}

fn key_prefix(part: Part) -> &'static str {
    match part {
        Part::Key => "key: ",
        Part::Value => "",
    }
}

impl DecodeError {
    /// Waiting can help (the registry cannot answer now): the event and its offset wait.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_transient(&self) -> bool {
        matches!(self, DecodeError::Registry { .. })
    }
}

/// How one handler's messages are read: its `[[handlers]]` entry's `format`,
/// `event_id`, `event_type_header` and `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Auto (Avro when the value has the Confluent framing), JSON, Avro, or raw bytes.
    pub format: Format,
    /// Where the event id (the dedup key) is: a header, or a field of the value.
    pub event_id: EventIdSource,
    /// The header whose value becomes [`OutboxEvent::event_type`].
    pub event_type_header: String,
    /// What the handler gets as the payload: the decoded value, or its original bytes.
    pub body: Body,
}

impl Default for Layout {
    /// A handler entry's defaults: auto format, the `id` header, the `eventType` header, a decoded body.
    fn default() -> Layout {
        Layout {
            format: Format::default(),
            event_id: EventIdSource::default(),
            event_type_header: "eventType".to_owned(),
            body: Body::default(),
        }
    }
}

impl From<&HandlerConfig> for Layout {
    fn from(hc: &HandlerConfig) -> Layout {
        Layout {
            format: hc.format,
            event_id: hc.event_id.clone(),
            event_type_header: hc.event_type_header.clone(),
            body: hc.body,
        }
    }
}

/// Decodes messages; holds the schema registry client (and its cache) when
/// `[schema_registry]` is configured.
#[derive(Default)]
pub struct Decoder {
    registry: Option<avro::Registry>,
}

impl Decoder {
    /// `None`: Avro-framed values cannot be decoded ([`AvroError::NoRegistry`]).
    pub fn new(registry: Option<avro::Registry>) -> Decoder {
        Decoder { registry }
    }

    /// One message as `layout` says. Awaits only for a schema lookup (a value
    /// or key in the Confluent wire format, with a registry configured): a
    /// JSON message decodes without yielding.
    pub async fn decode(&self, msg: &RawMessage, layout: &Layout) -> Result<OutboxEvent, DecodeError> {
        if let Some(decoded) = self.decode_now(msg, layout) {
            return decoded;
        }
        let value = msg.value.as_deref();
        let framed = value.and_then(avro::framing).is_some();
        if layout.format == Format::Avro && !framed {
            return Err(DecodeError::NotAvro);
        }
        let value_json = match value {
            Some(v) if framed => Some(self.avro_json(v, &msg.topic, Part::Value).await?),
            _ => None,
        };
        let key_json = match msg.key.as_deref() {
            Some(k) if avro::framing(k).is_some() => Some(self.avro_json(k, &msg.topic, Part::Key).await?),
            _ => None,
        };
        assemble(msg, layout, value_json, key_json)
    }

    /// [`Decoder::decode`] at once for a message that needs no schema lookup (most:
    /// JSON, text, raw bytes); `None` for one that does. A caller that can take
    /// this path spares an event the future of the other (about a kilobyte).
    pub fn decode_now(&self, msg: &RawMessage, layout: &Layout) -> Option<Result<OutboxEvent, DecodeError>> {
        let framed = |part: Option<&[u8]>| part.and_then(avro::framing).is_some();
        let looks_up = matches!(layout.format, Format::Avro | Format::Auto)
            && (framed(msg.value.as_deref()) || framed(msg.key.as_deref()));
        (!looks_up).then(|| assemble(msg, layout, None, None))
    }

    /// A framed Avro datum as JSON, with its writer schema from the registry.
    async fn avro_json(&self, framed: &[u8], topic: &str, part: Part) -> Result<Value, DecodeError> {
        let avro = |error| DecodeError::Avro { part, error };
        let schema_id = avro::framing(framed).ok_or(avro(AvroError::NotFramed))?;
        let Some(registry) = &self.registry else {
            return Err(avro(AvroError::NoRegistry(schema_id)));
        };
        match registry.schema(schema_id, topic, part).await {
            Ok(schema) => schema.decode(framed).map_err(avro),
            Err(error) if error.is_transient() => Err(DecodeError::Registry { part, schema_id, error }),
            Err(error) => Err(avro(error)),
        }
    }
}

/// The event of a message whose framed Avro value and key (if any) are given as JSON.
fn assemble(
    msg: &RawMessage,
    layout: &Layout,
    value_json: Option<Value>,
    key_json: Option<Value>,
) -> Result<OutboxEvent, DecodeError> {
    let value = msg.value.as_deref();
    let payload = match (layout.format, value_json) {
        (_, Some(json)) => Payload::Json(json.into()),
        (Format::Raw, None) => value.map_or(Payload::Null, |v| Payload::Bytes(v.to_vec())),
        (Format::Avro, None) => return Err(DecodeError::NotAvro),
        (_, None) => decode_value(value)?,
    };
    let aggregate_id = match (key_json, msg.key.as_deref()) {
        (Some(Value::String(s)), _) => Some(s),
        (Some(other), _) => Some(other.to_string()),
        (None, Some(k)) => Some(decode_text(k)),
        (None, None) => None,
    };
    let mut event = event(msg, payload, aggregate_id, &layout.event_id, &layout.event_type_header)?;
    if layout.body == Body::Raw {
        event.payload = msg.value.clone().map_or(Payload::Null, Payload::Bytes);
    }
    Ok(event)
}

/// The event, from the message and its decoded value and key.
fn event(
    msg: &RawMessage,
    payload: Payload,
    aggregate_id: Option<String>,
    id_source: &EventIdSource,
    event_type_header: &str,
) -> Result<OutboxEvent, DecodeError> {
    let id = match id_source {
        EventIdSource::Header(name) => id_from_header(msg, name)?,
        EventIdSource::Field(path) => id_from_field(&payload, path)?,
    };
    check_id(&id)?;
    let event_type = last_header(msg, event_type_header).map(decode_text);
    let traceparent = trace_context(msg).map(|c| c.traceparent);
    Ok(OutboxEvent {
        id,
        aggregate_id,
        event_type,
        payload,
        position: msg.position(),
        timestamp_ms: msg.timestamp_ms,
        traceparent,
        route_key: None,
        headers: Vec::new(),
    })
}

fn check_id(id: &str) -> Result<(), DecodeError> {
    if id.is_empty() {
        return Err(DecodeError::EmptyId);
    }
    if id.len() > MAX_EVENT_ID_LEN {
        return Err(DecodeError::IdTooLong(id.len()));
    }
    Ok(())
}

fn last_header<'a>(msg: &'a RawMessage, name: &str) -> Option<&'a [u8]> {
    msg.headers.iter().rev().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
}

fn id_from_header(msg: &RawMessage, name: &str) -> Result<String, DecodeError> {
    // Walked twice rather than collected: this runs for every message.
    let values = || msg.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_deref().unwrap_or_default());
    let Some(first) = values().next() else {
        return Err(DecodeError::MissingIdHeader(name.to_owned()));
    };
    if values().any(|v| v != first) {
        return Err(DecodeError::ConflictingIdHeaders(name.to_owned(), values().count()));
    }
    if std::str::from_utf8(first).is_err() {
        return Err(DecodeError::IdNotUtf8);
    }
    Ok(decode_text(first))
}

fn id_from_field(payload: &Payload, path: &str) -> Result<String, DecodeError> {
    let Payload::Json(root) = payload else {
        return Err(DecodeError::ValueNotJson);
    };
    let mut at = root.value();
    // A raw change event may still carry Debezium's {"before","after",…} under "payload".
    for segment in path.split('.') {
        at = at.get(segment).ok_or_else(|| DecodeError::MissingIdField(path.to_owned()))?;
    }
    match at {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(DecodeError::IdFieldNotScalar(path.to_owned())),
    }
}
