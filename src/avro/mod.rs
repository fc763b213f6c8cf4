//! Avro in the Confluent wire format (`0x00`, 4-byte big-endian schema id,
//! Avro binary datum) → JSON, with schemas from a Confluent-compatible
//! registry or local files. apache-avro is used only here.
//!
//! JSON mapping: records → objects, unions without the type wrapper, enums as
//! their symbol, bytes and fixed as base64 strings, decimals as decimal
//! strings, dates as `YYYY-MM-DD`, timestamps as RFC 3339 in UTC with
//! microseconds, times as `HH:MM:SS.ffffff`, uuids as strings. A string whose schema is Debezium's
//! `io.debezium.data.Json` (the outbox `payload` column) is parsed as JSON.
//!
//! Dates and timestamps outside the years 0000–9999 (which RFC 3339 cannot
//! write) are not shifted or clamped: a timestamp at or beyond PostgreSQL's
//! infinities as Debezium sends them (±9223372036825200000 and beyond, so also
//! `i64::MAX` / `i64::MIN`) becomes the string `"infinity"` / `"-infinity"`, and
//! any other such date or timestamp the plain number it was sent as (days, or
//! milli/micro/nanoseconds since 1970 as its logical type says). Likewise a
//! time of day outside 00:00–24:00 stays the number it was sent as.

mod check;
mod json;
mod registry;

use std::collections::{HashMap, HashSet};

use apache_avro::schema::{Name, Schema};
use serde_json::Value;

use json::{to_json, Ctx};
pub use registry::{Registry, RegistrySetupError};

/// Debezium's semantic type for json/jsonb columns.
const DEBEZIUM_JSON: &str = "io.debezium.data.Json";

/// Records, arrays and maps a value may nest (the JSON nesting of the result).
/// A bound because a recursive schema (a linked list, a tree) lets the input
/// nest as deep as it likes, and decoding recurses per level: apache-avro up to
/// three calls per level (record, union, named reference). In a debug build one
/// level of a linked list takes ~55 KiB of stack all told: in the service, 36
/// levels overflowed a tokio worker (2 MiB stack) and 32 did not. 24 keeps a
/// margin (release builds need far less). Debezium's envelopes nest a handful.
pub const MAX_DEPTH: usize = 24;

/// Why an Avro value could not be decoded. `Unavailable` and `Registry` make
/// the event wait ([`AvroError::is_transient`]); the others dead-letter it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AvroError {
    /// Unreachable, 5xx, 429: heals by itself.
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
    /// The registry answers, but refuses us or not with a registry's answer: the
    /// credentials or URL need fixing. Not the event's fault, so it waits.
    #[error("schema registry {fault}: {detail}")]
    Registry {
        /// How the registry fails.
        fault: RegistryFault,
        /// The request and its answer, the URL without its credentials.
        detail: String,
    },
    /// Neither the registry nor the local schema files know this schema id.
    #[error("schema id {0} is unknown to the registry")]
    UnknownSchema(u32),
    /// The id exists but belongs to other topics' subjects.
    #[error(
        "schema id {id} is not registered under subject {subject} (registered under: {}); \
         with subjects not named after topics set [schema_registry] check_subjects = false",
        some(registered)
    )]
    WrongSubject {
        /// The schema id from the message.
        id: u32,
        /// The subject it was expected under (`<topic>-value` or `<topic>-key`).
        subject: String,
        /// The subjects it is registered under.
        registered: Vec<String>,
    },
    /// The schema is not Avro (the registry's `schemaType`, e.g. `PROTOBUF`).
    #[error("schema id {id} is a {kind} schema; only Avro is decoded")]
    NotAvro {
        /// The schema id from the message.
        id: u32,
        /// The schema type the registry names.
        kind: String,
    },
    /// The schema's text (or one of its references) is not a valid Avro schema.
    #[error("schema id {id} cannot be parsed: {error}")]
    BadSchema {
        /// The schema id from the message.
        id: u32,
        /// apache-avro's complaint.
        error: String,
    },
    /// The datum is not one value of its writer schema within the decoding bounds
    /// (cut short, bytes left over, nested deeper than [`MAX_DEPTH`]), or cannot be written as JSON.
    #[error("datum does not match schema id {id}: {error}")]
    Datum {
        /// The schema id from the message.
        id: u32,
        /// What does not match.
        error: String,
    },
    /// The bytes lack the framing: magic byte `0x00` and a 4-byte schema id.
    #[error("value is not in the Confluent wire format (magic byte 0, 4-byte schema id)")]
    NotFramed,
    /// The value is framed with this schema id, but no `[schema_registry]` is configured.
    #[error("value is Avro (Confluent framing, schema id {0}) but no [schema_registry] is configured")]
    NoRegistry(u32),
}

impl AvroError {
    /// Waiting can help: the event waits instead of being dead-lettered.
    pub fn is_transient(&self) -> bool {
        matches!(self, AvroError::Unavailable(_) | AvroError::Registry { .. })
    }

    /// Waiting helps only once a person fixed the configuration: log as an error.
    pub fn needs_operator(&self) -> bool {
        matches!(self, AvroError::Registry { .. })
    }

    /// The `reason` label of `outboxd_schema_registry_errors_total`, for the
    /// errors that make an event wait.
    pub fn registry_reason(&self) -> Option<&'static str> {
        match self {
            AvroError::Unavailable(_) => Some("unavailable"),
            AvroError::Registry { fault, .. } => Some(fault.label()),
            _ => None,
        }
    }
}

/// How a reachable registry fails us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegistryFault {
    /// 401 or 403.
    #[error("refuses the credentials")]
    Auth,
    /// Another status that is neither success, 404, 429 nor 5xx.
    #[error("answers with an unexpected status")]
    Status,
    /// Success, but not the JSON a registry sends (a wrong URL, a proxy page).
    #[error("answers with something that is not a schema registry's answer")]
    Unparsable,
}

impl RegistryFault {
    pub(crate) fn label(self) -> &'static str {
        match self {
            RegistryFault::Auth => "auth",
            RegistryFault::Status => "status",
            RegistryFault::Unparsable => "unparsable",
        }
    }
}

/// The first few of a list, for an error message.
fn some(items: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = items.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    if text.is_empty() {
        text.push_str("none");
    }
    text
}

/// Which part of a Kafka message a framed Avro datum is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The message key.
    Key,
    /// The message value.
    Value,
}

impl Part {
    /// As in TopicNameStrategy subjects: `<topic>-key`, `<topic>-value`.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Key => "key",
            Part::Value => "value",
        }
    }
}

/// `Some(schema id)` when the bytes carry the Confluent framing.
pub fn framing(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [0, a, b, c, d, _rest @ ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// A writer schema ready for decoding.
#[derive(Debug)]
pub struct ParsedSchema {
    id: u32,
    schema: Schema,
    /// Named types from referenced schemas.
    schemata: Vec<Schema>,
    /// Whether the top-level type is declared `connect.name = io.debezium.data.Json`.
    top_is_json: bool,
    /// (record name, field name) of fields so declared.
    json_fields: HashSet<(String, String)>,
}

impl ParsedSchema {
    /// Parses the registry's schema text with the texts of its references.
    pub fn parse(id: u32, text: &str, references: &[String]) -> Result<ParsedSchema, AvroError> {
        let bad = |e: apache_avro::Error| AvroError::BadSchema { id, error: e.to_string() };
        let (schema, schemata) = if references.is_empty() {
            (Schema::parse_str(text).map_err(bad)?, Vec::new())
        } else {
            Schema::parse_str_with_list(text, references).map_err(bad)?
        };
        let mut json_fields = HashSet::new();
        let mut top_is_json = false;
        for t in std::iter::once(text).chain(references.iter().map(String::as_str)) {
            if let Ok(v) = serde_json::from_str::<Value>(t) {
                find_json_fields(&v, &mut json_fields);
                if t == text {
                    top_is_json = is_debezium_json(&v);
                }
            }
        }
        Ok(ParsedSchema { id, schema, schemata, top_is_json, json_fields })
    }

    /// Decodes the datum after the 5-byte framing into JSON. Hostile bytes give
    /// [`AvroError::Datum`]: the datum is checked (lengths, truncation, depth)
    /// before apache-avro decodes it; see `check.rs`.
    pub fn decode(&self, framed: &[u8]) -> Result<Value, AvroError> {
        let mut datum = framed.get(5..).ok_or(AvroError::NotFramed)?;
        let id = self.id;
        let names = self.names();
        check::check(&self.schema, &names, datum).map_err(|e| AvroError::Datum { id, error: e.to_string() })?;
        // The top-level schema too (after the references it uses): its named
        // types may be used again inside it.
        let schemata = self.schemata.iter().chain(std::iter::once(&self.schema)).collect();
        let value = apache_avro::from_avro_datum_schemata(&self.schema, schemata, &mut datum, None)
            .map_err(|e| AvroError::Datum { id, error: e.to_string() })?;
        if !datum.is_empty() {
            return Err(AvroError::Datum { id, error: format!("{} bytes left after the datum", datum.len()) });
        }
        let ctx = Ctx { names: &names, json_fields: &self.json_fields };
        let json = to_json(&value, &self.schema, &ctx, 0).map_err(|e| AvroError::Datum { id, error: e.to_string() })?;
        match json {
            Value::String(s) if self.top_is_json => serde_json::from_str(&s)
                .map_err(|e| AvroError::Datum { id, error: format!("{DEBEZIUM_JSON} string is not JSON: {e}") }),
            other => Ok(other),
        }
    }

    /// The full name of the top-level type, when it is named (a record, enum or fixed).
    pub fn record_name(&self) -> Option<String> {
        self.schema.name().map(|n| n.fullname(None))
    }

    fn names(&self) -> HashMap<Name, &Schema> {
        let mut names = HashMap::new();
        for s in std::iter::once(&self.schema).chain(&self.schemata) {
            collect_names(s, &mut names);
        }
        names
    }
}

/// `{"connect.name": "io.debezium.data.Json"}` on a type, or on a member of a union.
fn is_debezium_json(t: &Value) -> bool {
    match t {
        Value::Object(o) => o.get("connect.name").and_then(Value::as_str) == Some(DEBEZIUM_JSON),
        Value::Array(members) => members.iter().any(is_debezium_json),
        _ => false,
    }
}

fn find_json_fields(schema: &Value, out: &mut HashSet<(String, String)>) {
    match schema {
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) == Some("record") {
                let record = o.get("name").and_then(Value::as_str).unwrap_or_default();
                let record = record.rsplit('.').next().unwrap_or(record).to_owned();
                for f in o.get("fields").and_then(Value::as_array).into_iter().flatten() {
                    let (Some(name), Some(t)) = (f.get("name").and_then(Value::as_str), f.get("type")) else {
                        continue;
                    };
                    if is_debezium_json(t) {
                        out.insert((record.clone(), name.to_owned()));
                    }
                    find_json_fields(t, out);
                }
            } else {
                for key in ["type", "items", "values"] {
                    if let Some(inner) = o.get(key) {
                        find_json_fields(inner, out);
                    }
                }
            }
        }
        Value::Array(members) => members.iter().for_each(|m| find_json_fields(m, out)),
        _ => {}
    }
}

fn collect_names<'a>(schema: &'a Schema, names: &mut HashMap<Name, &'a Schema>) {
    match schema {
        Schema::Record(r) => {
            names.insert(r.name.clone(), schema);
            for f in &r.fields {
                collect_names(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.clone(), schema);
        }
        Schema::Fixed(f) => {
            names.insert(f.name.clone(), schema);
        }
        Schema::Array(a) => collect_names(&a.items, names),
        Schema::Map(m) => collect_names(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, names)),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
