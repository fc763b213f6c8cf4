//! Kafka message → [`OutboxEvent`]: the JSON/text shapes that Debezium's
//! EventRouter produces with the String and Json converters (schemas on or
//! off, expanded payloads, JSON header converter). Pure functions, no I/O.

use serde_json::Value;

use crate::config::EventIdSource;
use crate::event::{OutboxEvent, Payload, RawMessage};

/// Longest event id we accept: ids are keys in the store and go into URLs.
pub const MAX_EVENT_ID_LEN: usize = 512;

/// Debezium's semantic type for `json`/`jsonb` columns: the JSON arrives as a string.
const DEBEZIUM_JSON_SCHEMA: &str = "io.debezium.data.Json";

/// Why a message is not an outbox event. Such messages are dead-lettered, never retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("no {0:?} header (the event id); is Debezium's EventRouter in the pipeline?")]
    MissingIdHeader(String),
    #[error("header {0:?} appears {1} times with different values")]
    ConflictingIdHeaders(String, usize),
    #[error("event id is empty")]
    EmptyId,
    #[error("event id is {0} bytes, more than {MAX_EVENT_ID_LEN}")]
    IdTooLong(usize),
    #[error("event id is not UTF-8")]
    IdNotUtf8,
    #[error("event id field {0:?} not found in the value")]
    MissingIdField(String),
    #[error("event id field {0:?} is not a string or number")]
    IdFieldNotScalar(String),
    #[error("value is not JSON, but the event id is configured as a field of it")]
    ValueNotJson,
    #[error("value says it is JSON ({DEBEZIUM_JSON_SCHEMA}) but is not: {0}")]
    InvalidEmbeddedJson(String),
}

/// Decodes one message with the handler's event id source and event type header.
pub fn decode(
    msg: &RawMessage,
    id_source: &EventIdSource,
    event_type_header: &str,
) -> Result<OutboxEvent, DecodeError> {
    let payload = decode_value(msg.value.as_deref())?;
    let aggregate_id = msg.key.as_deref().map(decode_text);
    decode_with(msg, payload, aggregate_id, id_source, event_type_header)
}

/// The same, with the value and key already decoded (e.g. from Avro).
pub fn decode_with(
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
    let traceparent = traceparent(msg);
    Ok(OutboxEvent {
        id,
        aggregate_id,
        event_type,
        payload,
        position: msg.position(),
        timestamp_ms: msg.timestamp_ms,
        traceparent,
    })
}

/// A `traceparent` header, or the one inside Debezium's `tracingspancontext`
/// (the outbox column of that name, placed as a header: Java properties text).
fn traceparent(msg: &RawMessage) -> Option<String> {
    let direct = last_header(msg, "traceparent").map(decode_text);
    let from_context = || {
        let text = decode_text(last_header(msg, "tracingspancontext")?);
        text.lines().find_map(|l| l.trim().strip_prefix("traceparent=").map(str::to_owned))
    };
    direct.or_else(from_context).filter(|t| is_traceparent(t))
}

/// `00-<32 hex>-<16 hex>-<2 hex>`: anything else is not forwarded.
fn is_traceparent(t: &str) -> bool {
    let parts: Vec<&str> = t.split('-').collect();
    parts.len() == 4
        && [2, 32, 16, 2].iter().zip(&parts).all(|(n, p)| p.len() == *n && p.bytes().all(|b| b.is_ascii_hexdigit()))
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
    let values: Vec<&[u8]> =
        msg.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_deref().unwrap_or_default()).collect();
    let Some(first) = values.first() else {
        return Err(DecodeError::MissingIdHeader(name.to_owned()));
    };
    if values.iter().any(|v| v != first) {
        return Err(DecodeError::ConflictingIdHeaders(name.to_owned(), values.len()));
    }
    if std::str::from_utf8(first).is_err() {
        return Err(DecodeError::IdNotUtf8);
    }
    Ok(decode_text(first))
}

/// Text from a key or header: plain text, a JSON string (`"abc"`), or a
/// JsonConverter envelope (`{"schema":…,"payload":"abc"}`). Invalid UTF-8 is
/// replaced, never fatal.
pub fn decode_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let trimmed = text.trim();
    if trimmed.starts_with('"') || trimmed.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
            match unwrap_envelope(v) {
                (Value::String(s), _) => return s,
                (v @ (Value::Number(_) | Value::Bool(_)), _) => return v.to_string(),
                _ => {}
            }
        }
    }
    trimmed.to_owned()
}

/// `{"schema":{…},"payload":X}` → (X, schema name); anything else unchanged.
/// Only the JsonConverter's shape counts: `schema` is a Connect schema object
/// (with a `type`) or null. A payload that merely has these two members stays whole.
fn unwrap_envelope(v: Value) -> (Value, Option<String>) {
    let is_connect_schema = |s: &Value| s.is_null() || s.get("type").is_some_and(Value::is_string);
    match v {
        Value::Object(mut map)
            if map.len() == 2 && map.contains_key("payload") && map.get("schema").is_some_and(is_connect_schema) =>
        {
            let name = map.get("schema").and_then(|s| s.get("name")).and_then(Value::as_str).map(str::to_owned);
            (map.remove("payload").unwrap_or(Value::Null), name)
        }
        other => (other, None),
    }
}

/// The value in every form Debezium's converters give the outbox `payload`.
pub fn decode_value(bytes: Option<&[u8]>) -> Result<Payload, DecodeError> {
    let Some(bytes) = bytes else {
        return Ok(Payload::Null);
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(Payload::Bytes(bytes.to_vec()));
    };
    let Ok(json) = serde_json::from_str::<Value>(text) else {
        return Ok(Payload::Text(text.to_owned()));
    };
    let (inner, schema_name) = unwrap_envelope(json);
    match inner {
        // JSON null (a jsonb 'null', or an enveloped null) is sent as JSON, unlike a
        // message without a value (a tombstone).
        // jsonb through the JsonConverter: JSON text inside a JSON string.
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(v) if v.is_object() || v.is_array() || schema_name.as_deref() == Some(DEBEZIUM_JSON_SCHEMA) => {
                Ok(Payload::Json(v))
            }
            Err(e) if schema_name.as_deref() == Some(DEBEZIUM_JSON_SCHEMA) => {
                Err(DecodeError::InvalidEmbeddedJson(e.to_string()))
            }
            _ => Ok(Payload::Json(Value::String(s))),
        },
        other => Ok(Payload::Json(other)),
    }
}

fn id_from_field(payload: &Payload, path: &str) -> Result<String, DecodeError> {
    let Payload::Json(root) = payload else {
        return Err(DecodeError::ValueNotJson);
    };
    let mut at = root;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(value: Option<&[u8]>, headers: &[(&str, &[u8])]) -> RawMessage {
        RawMessage {
            topic: "outbox.event.order".into(),
            partition: 0,
            offset: 7,
            key: Some(b"order-1".to_vec()),
            value: value.map(<[u8]>::to_vec),
            headers: headers.iter().map(|(k, v)| (k.to_string(), Some(v.to_vec()))).collect(),
            timestamp_ms: None,
        }
    }

    fn header_id() -> EventIdSource {
        EventIdSource::Header("id".into())
    }

    fn payload_of(value: &str) -> Payload {
        decode(&msg(Some(value.as_bytes()), &[("id", b"e-1")]), &header_id(), "eventType").unwrap().payload
    }

    #[test]
    fn string_converter_json_text() {
        assert_eq!(payload_of(r#"{"total": 10}"#), Payload::Json(json!({"total": 10})));
    }

    #[test]
    fn json_converter_schema_envelope_with_debezium_json_string() {
        let v = r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"total\": 10}"}"#;
        assert_eq!(payload_of(v), Payload::Json(json!({"total": 10})));
    }

    #[test]
    fn json_converter_without_schemas_gives_json_string() {
        assert_eq!(payload_of(r#""{\"total\": 10}""#), Payload::Json(json!({"total": 10})));
    }

    #[test]
    fn expanded_json_payload_object() {
        let v = r#"{"schema":{"type":"struct","fields":[]},"payload":{"total":10}}"#;
        assert_eq!(payload_of(v), Payload::Json(json!({"total": 10})));
        assert_eq!(payload_of(r#"{"total":10,"items":[1,2]}"#), Payload::Json(json!({"total": 10, "items": [1, 2]})));
    }

    #[test]
    fn plain_text_and_raw_bytes_and_null() {
        assert_eq!(payload_of("hello world"), Payload::Text("hello world".into()));
        let bytes = decode(&msg(Some(&[0xff, 0x00, 0xfe]), &[("id", b"e")]), &header_id(), "eventType").unwrap();
        assert_eq!(bytes.payload, Payload::Bytes(vec![0xff, 0x00, 0xfe]));
        let null = decode(&msg(None, &[("id", b"e")]), &header_id(), "eventType").unwrap();
        assert_eq!(null.payload, Payload::Null);
        assert_eq!(payload_of(r#"{"schema":{"type":"string"},"payload":null}"#), Payload::Json(Value::Null));
        assert_eq!(payload_of("null"), Payload::Json(Value::Null));
    }

    #[test]
    fn payload_shaped_like_an_envelope_stays_whole() {
        let v = r#"{"schema":"order.v2","payload":{"id":1}}"#;
        assert_eq!(payload_of(v), Payload::Json(json!({"schema": "order.v2", "payload": {"id": 1}})));
    }

    #[test]
    fn broken_debezium_json_is_an_error() {
        let v = r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{not json"}"#;
        let e = decode(&msg(Some(v.as_bytes()), &[("id", b"e")]), &header_id(), "eventType").unwrap_err();
        assert!(matches!(e, DecodeError::InvalidEmbeddedJson(_)));
    }

    #[test]
    fn id_header_text_json_and_envelope() {
        for raw in [&b"5f0c"[..], br#""5f0c""#, br#"{"schema":{"type":"string"},"payload":"5f0c"}"#] {
            let ev =
                decode(&msg(Some(b"{}"), &[("id", raw), ("eventType", b"OrderCreated")]), &header_id(), "eventType")
                    .unwrap();
            assert_eq!(ev.id, "5f0c");
            assert_eq!(ev.event_type.as_deref(), Some("OrderCreated"));
            assert_eq!(ev.aggregate_id.as_deref(), Some("order-1"));
        }
    }

    #[test]
    fn json_quoted_and_enveloped_keys_are_unwrapped() {
        let mut m = msg(Some(b"{}"), &[("id", b"e")]);
        m.key = Some(br#""order-9""#.to_vec());
        assert_eq!(decode(&m, &header_id(), "eventType").unwrap().aggregate_id.as_deref(), Some("order-9"));
        m.key = Some(br#"{"schema":{"type":"string"},"payload":"order-9"}"#.to_vec());
        assert_eq!(decode(&m, &header_id(), "eventType").unwrap().aggregate_id.as_deref(), Some("order-9"));
        m.key = Some(vec![0xff, b'a']);
        assert_eq!(decode(&m, &header_id(), "eventType").unwrap().aggregate_id.as_deref(), Some("\u{fffd}a"));
    }

    #[test]
    fn missing_empty_conflicting_or_huge_ids_are_errors() {
        let e = |headers: &[(&str, &[u8])]| decode(&msg(Some(b"{}"), headers), &header_id(), "eventType").unwrap_err();
        assert_eq!(e(&[]), DecodeError::MissingIdHeader("id".into()));
        assert_eq!(e(&[("id", b"")]), DecodeError::EmptyId);
        assert_eq!(e(&[("id", b"a"), ("id", b"b")]), DecodeError::ConflictingIdHeaders("id".into(), 2));
        assert_eq!(e(&[("id", &[0xff])]), DecodeError::IdNotUtf8);
        let long = vec![b'x'; MAX_EVENT_ID_LEN + 1];
        assert_eq!(e(&[("id", &long)]), DecodeError::IdTooLong(MAX_EVENT_ID_LEN + 1));
        // The same id twice is harmless.
        assert!(decode(&msg(Some(b"{}"), &[("id", b"a"), ("id", b"a")]), &header_id(), "eventType").is_ok());
    }

    #[test]
    fn id_from_raw_debezium_envelope_field() {
        let src = EventIdSource::Field("after.id".into());
        let v =
            r#"{"schema":{"type":"struct"},"payload":{"before":null,"after":{"id":"u-1","payload":"{}"},"op":"c"}}"#;
        assert_eq!(decode(&msg(Some(v.as_bytes()), &[]), &src, "eventType").unwrap().id, "u-1");
        let numeric = r#"{"after":{"id":42}}"#;
        assert_eq!(decode(&msg(Some(numeric.as_bytes()), &[]), &src, "eventType").unwrap().id, "42");
        let e = decode(&msg(Some(br#"{"after":{}}"#), &[]), &src, "eventType").unwrap_err();
        assert_eq!(e, DecodeError::MissingIdField("after.id".into()));
        let e = decode(&msg(Some(b"not json"), &[]), &src, "eventType").unwrap_err();
        assert_eq!(e, DecodeError::ValueNotJson);
    }

    #[test]
    fn trace_context_is_taken_from_traceparent_or_debezium_span_context() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let ev = decode(&msg(Some(b"{}"), &[("id", b"e"), ("traceparent", tp.as_bytes())]), &header_id(), "eventType");
        assert_eq!(ev.unwrap().traceparent.as_deref(), Some(tp));
        let props = format!("#Thu Nov 29\ntraceparent={tp}\ntracestate=x=1\n");
        let ev = decode(
            &msg(Some(b"{}"), &[("id", b"e"), ("tracingspancontext", props.as_bytes())]),
            &header_id(),
            "eventType",
        );
        assert_eq!(ev.unwrap().traceparent.as_deref(), Some(tp));
        let ev =
            decode(&msg(Some(b"{}"), &[("id", b"e"), ("traceparent", b"00-zz\r\nX: y")]), &header_id(), "eventType");
        assert_eq!(ev.unwrap().traceparent, None, "malformed contexts are not forwarded");
    }

    #[test]
    fn deeply_nested_json_does_not_crash() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(matches!(payload_of(&deep), Payload::Text(_)));
    }
}
