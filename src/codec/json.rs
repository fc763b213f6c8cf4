//! The JSON and text shapes Debezium's String and Json converters give keys,
//! headers and values (schemas on or off, expanded payloads, JSON header
//! converter). Pure functions, no I/O.

use serde_json::Value;

use super::{DecodeError, DEBEZIUM_JSON_SCHEMA};
use crate::event::Payload;

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
