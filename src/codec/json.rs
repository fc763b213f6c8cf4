//! The JSON and text shapes Debezium's String and Json converters give keys,
//! headers and values (schemas on or off, expanded payloads, JSON header
//! converter). Pure functions, no I/O.

use serde_json::value::RawValue;
use serde_json::Value;

use super::{DecodeError, DEBEZIUM_JSON_SCHEMA};
use crate::event::{Json, Payload};

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
///
/// JSON is kept as its text (checked once, not parsed into a `Value`) when a
/// `Value` would hold it as written (see `plain`); any other JSON takes the path
/// that parses it. Both give the same payloads and the same errors.
pub fn decode_value(bytes: Option<&[u8]>) -> Result<Payload, DecodeError> {
    let Some(bytes) = bytes else {
        return Ok(Payload::Null);
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(Payload::Bytes(bytes.to_vec()));
    };
    match plain(text) {
        true => decode_checked(text),
        false => decode_parsed(text),
    }
}

/// [`decode_value`] of [`plain`] text: checked, kept as text.
pub(super) fn decode_checked(text: &str) -> Result<Payload, DecodeError> {
    match unwrap_plain(text) {
        Some((inner, schema_name)) => inner_payload(inner, schema_name),
        None => Ok(Payload::Text(text.to_owned())),
    }
}

/// [`decode_value`] of any text: parsed into a `Value`.
pub(super) fn decode_parsed(text: &str) -> Result<Payload, DecodeError> {
    let Ok(json) = serde_json::from_str::<Value>(text) else {
        return Ok(Payload::Text(text.to_owned()));
    };
    let (inner, schema_name) = unwrap_envelope(json);
    match inner {
        // JSON null (a jsonb 'null', or an enveloped null) is sent as JSON, unlike a
        // message without a value (a tombstone).
        Value::String(s) => embedded(s, schema_name),
        other => Ok(Payload::Json(other.into())),
    }
}


/// A JSON string's content: JSON inside it is the payload (jsonb through the
/// JsonConverter) when it is an object or an array, or when the schema says it
/// is JSON; else the string itself.
fn embedded(s: String, schema_name: Option<String>) -> Result<Payload, DecodeError> {
    let declared = schema_name.as_deref() == Some(DEBEZIUM_JSON_SCHEMA);
    if plain(&s) {
        return match serde_json::from_str::<&RawValue>(&s) {
            Ok(raw) if declared || raw.get().starts_with(['{', '[']) => {
                let raw = raw.to_owned();
                Ok(Payload::Json(Json::checked(raw)))
            }
            Err(e) if declared => Err(DecodeError::InvalidEmbeddedJson(e.to_string())),
            _ => Ok(Payload::Json(Value::String(s).into())),
        };
    }
    match serde_json::from_str::<Value>(&s) {
        Ok(v) if v.is_object() || v.is_array() || declared => Ok(Payload::Json(v.into())),
        Err(e) if declared => Err(DecodeError::InvalidEmbeddedJson(e.to_string())),
        _ => Ok(Payload::Json(Value::String(s).into())),
    }
}

/// The payload from the unwrapped JSON text of a [`plain`] message.
fn inner_payload(inner: &RawValue, schema_name: Option<String>) -> Result<Payload, DecodeError> {
    if inner.get().starts_with('"') {
        // Checked and free of `\u` escapes, the string unescapes; were it not to,
        // the text is what the message says.
        return match serde_json::from_str::<String>(inner.get()) {
            Ok(s) => embedded(s, schema_name),
            Err(_) => Ok(Payload::Text(inner.get().to_owned())),
        };
    }
    Ok(Payload::Json(Json::checked(inner.to_owned())))
}

/// [`unwrap_envelope`] on text: the JSON inside a JsonConverter envelope and the
/// schema's name, or the whole text; `None` when it is not JSON. Only an object
/// with a `"schema"` member is read for its members: in text without `\u` escapes
/// (`plain`) that name is written out as it is, and any other object is checked
/// once, as a whole.
fn unwrap_plain(text: &str) -> Option<(&RawValue, Option<String>)> {
    if text.trim_start().starts_with('{') && text.contains("\"schema\"") {
        let top: Members<'_> = serde_json::from_str(text).ok()?;
        if let (false, Some(schema), Some(payload)) = (top.others, top.schema, top.payload) {
            let schema: Value = serde_json::from_str(schema.get()).ok()?;
            let is_connect_schema = schema.is_null() || schema.get("type").is_some_and(Value::is_string);
            if is_connect_schema {
                let name = schema.get("name").and_then(Value::as_str).map(str::to_owned);
                return Some((payload, name));
            }
        }
    }
    serde_json::from_str::<&RawValue>(text).ok().map(|whole| (whole, None))
}

/// The members of a JSON object that tell an envelope: `schema`, `payload`, and
/// whether there is any other (the last of a repeated name counts, as in a `Value`).
struct Members<'a> {
    schema: Option<&'a RawValue>,
    payload: Option<&'a RawValue>,
    others: bool,
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> serde::de::Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
        let mut members = Members { schema: None, payload: None, others: false };
        while let Some(name) = map.next_key::<Name>()? {
            match name {
                Name::Schema => members.schema = Some(map.next_value()?),
                Name::Payload => members.payload = Some(map.next_value()?),
                Name::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    members.others = true;
                }
            }
        }
        Ok(members)
    }
}

/// A member's name, as far as an envelope goes (escaped names included).
enum Name {
    Schema,
    Payload,
    Other,
}

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl serde::de::Visitor<'_> for NameVisitor {
            type Value = Name;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a member name")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Name, E> {
                Ok(match name {
                    "schema" => Name::Schema,
                    "payload" => Name::Payload,
                    _ => Name::Other,
                })
            }
        }
        d.deserialize_str(NameVisitor)
    }
}

/// Whether a `Value` holds this JSON text as written, so that checking its syntax
/// is enough: no nesting deeper than 64 (`Value` stops at 128), no number with an
/// exponent or a run of over 300 digits (`Value` refuses those beyond `f64`), no
/// `\u` escape (`Value` refuses a lone surrogate), no line break (the `log`
/// handler writes one line per event). Anything else takes the path that parses.
/// A byte scan (strings' text skipped to their next quote or backslash), no allocation.
pub(super) fn plain(text: &str) -> bool {
    const MAX_DEPTH: usize = 64;
    const MAX_DIGITS: usize = 300;
    let bytes = text.as_bytes();
    let (mut depth, mut digits, mut in_string) = (0usize, 0usize, false);
    let mut i = 0;
    while i < bytes.len() {
        if in_string {
            // A string's text runs to its next quote or backslash: skipped at once.
            let Some(n) = memchr::memchr2(b'"', b'\\', &bytes[i..]) else {
                return true;
            };
            i += n;
            match bytes[i] {
                b'\\' if bytes.get(i + 1) == Some(&b'u') => return false,
                b'\\' => i += 1,
                _ => in_string = false,
            }
        } else {
            let b = bytes[i];
            match b {
                b'0'..=b'9' => {
                    digits += 1;
                    if digits > MAX_DIGITS {
                        return false;
                    }
                }
                b'e' | b'E' if digits > 0 => return false,
                b'\n' | b'\r' => return false,
                b'"' => in_string = true,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return false;
                    }
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
            if !b.is_ascii_digit() {
                digits = 0;
            }
        }
        i += 1;
    }
    true
}
