//! Avro in the Confluent wire format (`0x00`, 4-byte big-endian schema id,
//! Avro binary datum) → JSON, with schemas from a Confluent-compatible
//! registry or local files. apache-avro is used only here.
//!
//! JSON mapping: records → objects, unions without the type wrapper, enums as
//! their symbol, bytes and fixed as base64 strings, decimals as decimal
//! strings, dates as `YYYY-MM-DD`, timestamps as RFC 3339, times as
//! `HH:MM:SS.ffffff`, uuids as strings. A string whose schema is Debezium's
//! `io.debezium.data.Json` (the outbox `payload` column) is parsed as JSON.

mod registry;

use std::collections::{HashMap, HashSet};

use apache_avro::schema::{Name, Schema};
use apache_avro::types::Value as Avro;
use base64::Engine;
use serde_json::{json, Value};

pub use registry::{Registry, RegistryOptions};

/// Debezium's semantic type for json/jsonb columns.
const DEBEZIUM_JSON: &str = "io.debezium.data.Json";

/// Why an Avro value could not be decoded. Only `Unavailable` can heal by waiting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AvroError {
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
    #[error("schema id {0} is unknown to the registry")]
    UnknownSchema(u32),
    #[error("schema id {id} is a {kind} schema; only Avro is decoded")]
    NotAvro { id: u32, kind: String },
    #[error("schema id {id} cannot be parsed: {error}")]
    BadSchema { id: u32, error: String },
    #[error("datum does not match schema id {id}: {error}")]
    Datum { id: u32, error: String },
    #[error("value is not in the Confluent wire format (magic byte 0, 4-byte schema id)")]
    NotFramed,
    #[error("value is Avro (Confluent framing, schema id {0}) but no [schema_registry] is configured")]
    NoRegistry(u32),
}

impl AvroError {
    pub fn is_transient(&self) -> bool {
        matches!(self, AvroError::Unavailable(_))
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

    /// Decodes the datum after the 5-byte framing into JSON.
    pub fn decode(&self, framed: &[u8]) -> Result<Value, AvroError> {
        let mut datum = framed.get(5..).ok_or(AvroError::NotFramed)?;
        let id = self.id;
        let value =
            apache_avro::from_avro_datum_schemata(&self.schema, self.schemata.iter().collect(), &mut datum, None)
                .map_err(|e| AvroError::Datum { id, error: e.to_string() })?;
        if !datum.is_empty() {
            return Err(AvroError::Datum { id, error: format!("{} bytes left after the datum", datum.len()) });
        }
        let names = self.names();
        let ctx = Ctx { names: &names, json_fields: &self.json_fields };
        let json = to_json(&value, &self.schema, &ctx).map_err(|error| AvroError::Datum { id, error })?;
        match json {
            Value::String(s) if self.top_is_json => serde_json::from_str(&s)
                .map_err(|e| AvroError::Datum { id, error: format!("{DEBEZIUM_JSON} string is not JSON: {e}") }),
            other => Ok(other),
        }
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

/// What the conversion needs besides the value and its schema.
struct Ctx<'a> {
    names: &'a HashMap<Name, &'a Schema>,
    json_fields: &'a HashSet<(String, String)>,
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

fn b64(bytes: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn rfc3339(micros: i64) -> Value {
    let t = if micros >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros as u64)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_micros(micros.unsigned_abs())
    };
    Value::String(humantime::format_rfc3339_micros(t).to_string())
}

fn time_of_day(micros: i64) -> Value {
    let (h, rest) = (micros / 3_600_000_000, micros % 3_600_000_000);
    let (m, rest) = (rest / 60_000_000, rest % 60_000_000);
    json!(format!("{h:02}:{m:02}:{:02}.{:06}", rest / 1_000_000, rest % 1_000_000))
}

fn date(days: i32) -> Value {
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = i64::from(days) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    json!(format!("{y:04}-{m:02}-{d:02}"))
}

/// A two's-complement big-endian unscaled value with `scale` digits after the point.
fn decimal(bytes: &[u8], scale: usize) -> Result<Value, String> {
    if bytes.len() > 16 {
        return Err(format!("decimal of {} bytes is larger than supported (16)", bytes.len()));
    }
    let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) { 0xff } else { 0 };
    let mut buf = [fill; 16];
    buf[16 - bytes.len()..].copy_from_slice(bytes);
    let n = i128::from_be_bytes(buf);
    let digits = n.unsigned_abs().to_string();
    let sign = if n < 0 { "-" } else { "" };
    if scale == 0 {
        return Ok(json!(format!("{sign}{digits}")));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    Ok(json!(format!("{sign}{int}.{frac}")))
}

fn to_json(value: &Avro, schema: &Schema, ctx: &Ctx<'_>) -> Result<Value, String> {
    let schema = match schema {
        Schema::Ref { name } => ctx.names.get(name).copied().ok_or_else(|| format!("unknown named type {name}"))?,
        s => s,
    };
    Ok(match value {
        Avro::Null => Value::Null,
        Avro::Boolean(b) => json!(b),
        Avro::Int(i) => json!(i),
        Avro::Long(l) => json!(l),
        Avro::Float(f) => serde_json::Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number),
        Avro::Double(d) => serde_json::Number::from_f64(*d).map_or(Value::Null, Value::Number),
        Avro::Bytes(b) | Avro::Fixed(_, b) => b64(b),
        Avro::String(s) => json!(s),
        Avro::Enum(_, symbol) => json!(symbol),
        Avro::Union(index, inner) => {
            let Schema::Union(u) = schema else { return to_json(inner, schema, ctx) };
            let variant = u.variants().get(*index as usize).ok_or("union index out of range")?;
            to_json(inner, variant, ctx)?
        }
        Avro::Array(items) => {
            let item_schema = match schema {
                Schema::Array(a) => &*a.items,
                other => other,
            };
            Value::Array(items.iter().map(|v| to_json(v, item_schema, ctx)).collect::<Result<_, _>>()?)
        }
        Avro::Map(map) => {
            let value_schema = match schema {
                Schema::Map(m) => &*m.types,
                other => other,
            };
            let mut out = serde_json::Map::new();
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for k in keys {
                out.insert(k.clone(), to_json(&map[k], value_schema, ctx)?);
            }
            Value::Object(out)
        }
        Avro::Record(fields) => {
            let Schema::Record(r) = schema else { return Err("record value without a record schema".into()) };
            let mut out = serde_json::Map::new();
            for ((name, v), field) in fields.iter().zip(&r.fields) {
                let mut json = to_json(v, &field.schema, ctx)?;
                let declared_json = ctx.json_fields.contains(&(r.name.name.clone(), name.clone()));
                if let (Value::String(s), true) = (&json, declared_json) {
                    json = serde_json::from_str(s)
                        .map_err(|e| format!("field {name}: {DEBEZIUM_JSON} string is not JSON: {e}"))?;
                }
                out.insert(name.clone(), json);
            }
            Value::Object(out)
        }
        Avro::Date(days) => date(*days),
        Avro::Decimal(d) => {
            let scale = match schema {
                Schema::Decimal(ds) => ds.scale,
                _ => 0,
            };
            let bytes: Vec<u8> = Vec::try_from(d).map_err(|e| e.to_string())?;
            decimal(&bytes, scale)?
        }
        Avro::BigDecimal(d) => json!(d.to_string()),
        Avro::TimeMillis(ms) => time_of_day(i64::from(*ms) * 1000),
        Avro::TimeMicros(us) => time_of_day(*us),
        Avro::TimestampMillis(ms) | Avro::LocalTimestampMillis(ms) => rfc3339(ms.saturating_mul(1000)),
        Avro::TimestampMicros(us) | Avro::LocalTimestampMicros(us) => rfc3339(*us),
        Avro::TimestampNanos(ns) | Avro::LocalTimestampNanos(ns) => rfc3339(ns / 1000),
        Avro::Duration(d) => {
            json!({"months": u32::from(d.months()), "days": u32::from(d.days()), "millis": u32::from(d.millis())})
        }
        Avro::Uuid(u) => json!(u.to_string()),
    })
}

#[cfg(test)]
mod tests;
