//! A decoded Avro value → JSON, as the module documentation describes.

use std::collections::{HashMap, HashSet};

use apache_avro::schema::{Name, Schema};
use apache_avro::types::Value as Avro;
use base64::Engine;
use serde_json::{json, Value};

use super::{DEBEZIUM_JSON, MAX_DEPTH};

/// What the conversion needs besides the value and its schema.
pub(super) struct Ctx<'a> {
    pub names: &'a HashMap<Name, &'a Schema>,
    pub json_fields: &'a HashSet<(String, String)>,
}

/// Days from 1970-01-01 to 0000-01-01 and to 9999-12-31: the years RFC 3339 can write.
const FIRST_DAY: i64 = -719_528;
const LAST_DAY: i64 = 2_932_896;

/// At or beyond these, a timestamp is PostgreSQL's `infinity` / `-infinity`: Debezium
/// (through the PostgreSQL JDBC driver) sends 9223372036825200000 and
/// -9223372036832400000, and `i64::MAX` / `i64::MIN` mean the same to anyone.
const POSITIVE_INFINITY: i64 = 9_223_372_036_825_200_000;
const NEGATIVE_INFINITY: i64 = -9_223_372_036_832_400_000;

/// Microseconds in a day: times of day are below it.
const DAY_MICROS: i64 = 86_400 * 1_000_000;

/// Digits after the decimal point a decimal may declare: PostgreSQL's limit for
/// `numeric`. A schema may claim any number, and the digits are written out.
const MAX_DECIMAL_SCALE: usize = 1000;

/// Ticks per second of a timestamp's logical type.
#[derive(Debug, Clone, Copy)]
pub(super) enum Unit {
    Millis,
    Micros,
    Nanos,
}

/// Why a decoded value cannot be written as JSON.
#[derive(Debug, thiserror::Error)]
pub(super) enum JsonError {
    /// A reference to a named type that neither the schema nor its references define.
    #[error("unknown named type {0}")]
    UnknownName(Name),
    /// Records, arrays and maps nested deeper than [`MAX_DEPTH`].
    #[error("value nests deeper than {MAX_DEPTH} records, arrays and maps")]
    TooDeep,
    /// A union value whose index has no variant in the union's schema.
    #[error("union index out of range")]
    UnionIndex,
    /// A record value whose schema is not a record.
    #[error("record value without a record schema")]
    NotARecord,
    /// A field declared as Debezium JSON whose string does not parse as JSON.
    #[error("field {field}: {DEBEZIUM_JSON} string is not JSON: {error}")]
    NotJson {
        /// The field's name.
        field: String,
        /// serde_json's complaint.
        error: serde_json::Error,
    },
    /// A decimal value apache-avro cannot turn back into its bytes.
    #[error(transparent)]
    DecimalBytes(apache_avro::Error),
    /// A decimal's unscaled value takes more bytes than an `i128`.
    #[error("decimal of {0} bytes is larger than supported (16)")]
    DecimalTooLong(usize),
    /// A decimal's scale is beyond [`MAX_DECIMAL_SCALE`].
    #[error("decimal scale {0} is larger than supported ({MAX_DECIMAL_SCALE})")]
    DecimalScale(usize),
}

/// `depth`: records, arrays and maps around `value`; bounded by [`MAX_DEPTH`].
pub(super) fn to_json(value: &Avro, schema: &Schema, ctx: &Ctx<'_>, depth: usize) -> Result<Value, JsonError> {
    let schema = match schema {
        Schema::Ref { name } => ctx.names.get(name).copied().ok_or_else(|| JsonError::UnknownName(name.clone()))?,
        s => s,
    };
    if matches!(value, Avro::Record(_) | Avro::Array(_) | Avro::Map(_)) && depth >= MAX_DEPTH {
        return Err(JsonError::TooDeep);
    }
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
            let Schema::Union(u) = schema else { return to_json(inner, schema, ctx, depth) };
            let variant = u.variants().get(*index as usize).ok_or(JsonError::UnionIndex)?;
            to_json(inner, variant, ctx, depth)?
        }
        Avro::Array(items) => {
            let item_schema = match schema {
                Schema::Array(a) => &*a.items,
                other => other,
            };
            Value::Array(items.iter().map(|v| to_json(v, item_schema, ctx, depth + 1)).collect::<Result<_, _>>()?)
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
                out.insert(k.clone(), to_json(&map[k], value_schema, ctx, depth + 1)?);
            }
            Value::Object(out)
        }
        Avro::Record(fields) => {
            let Schema::Record(r) = schema else { return Err(JsonError::NotARecord) };
            let mut out = serde_json::Map::new();
            for ((name, v), field) in fields.iter().zip(&r.fields) {
                let mut json = to_json(v, &field.schema, ctx, depth + 1)?;
                let declared_json = ctx.json_fields.contains(&(r.name.name.clone(), name.clone()));
                if let (Value::String(s), true) = (&json, declared_json) {
                    json =
                        serde_json::from_str(s).map_err(|error| JsonError::NotJson { field: name.clone(), error })?;
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
            let bytes: Vec<u8> = Vec::try_from(d).map_err(JsonError::DecimalBytes)?;
            decimal(&bytes, scale)?
        }
        Avro::BigDecimal(d) => json!(d.to_string()),
        Avro::TimeMillis(ms) => match time_of_day(i64::from(*ms) * 1000) {
            Value::Number(_) => json!(ms),
            text => text,
        },
        Avro::TimeMicros(us) => time_of_day(*us),
        Avro::TimestampMillis(n) | Avro::LocalTimestampMillis(n) => timestamp(*n, Unit::Millis),
        Avro::TimestampMicros(n) | Avro::LocalTimestampMicros(n) => timestamp(*n, Unit::Micros),
        Avro::TimestampNanos(n) | Avro::LocalTimestampNanos(n) => timestamp(*n, Unit::Nanos),
        Avro::Duration(d) => {
            json!({"months": u32::from(d.months()), "days": u32::from(d.days()), "millis": u32::from(d.millis())})
        }
        Avro::Uuid(u) => json!(u.to_string()),
    })
}

fn b64(bytes: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// RFC 3339 in UTC with microseconds (nanoseconds are floored to them) for years
/// 0000–9999; `"infinity"` / `"-infinity"` for PostgreSQL's infinities; any other
/// value RFC 3339 cannot write, the number as it came.
pub(super) fn timestamp(n: i64, unit: Unit) -> Value {
    if n >= POSITIVE_INFINITY {
        return json!("infinity");
    }
    if n <= NEGATIVE_INFINITY {
        return json!("-infinity");
    }
    let per_second = match unit {
        Unit::Millis => 1_000,
        Unit::Micros => 1_000_000,
        Unit::Nanos => 1_000_000_000,
    };
    let (seconds, fraction) = (n.div_euclid(per_second), n.rem_euclid(per_second));
    let micros = match unit {
        Unit::Millis => fraction * 1_000,
        Unit::Micros => fraction,
        Unit::Nanos => fraction / 1_000,
    };
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let Some((y, m, d)) = civil(days) else { return json!(n) };
    let (h, min, s) = (second_of_day / 3_600, second_of_day % 3_600 / 60, second_of_day % 60);
    json!(format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{micros:06}Z"))
}

/// `HH:MM:SS.ffffff` within a day, else the number as it came.
pub(super) fn time_of_day(micros: i64) -> Value {
    if !(0..DAY_MICROS).contains(&micros) {
        return json!(micros);
    }
    let (h, rest) = (micros / 3_600_000_000, micros % 3_600_000_000);
    let (m, rest) = (rest / 60_000_000, rest % 60_000_000);
    json!(format!("{h:02}:{m:02}:{:02}.{:06}", rest / 1_000_000, rest % 1_000_000))
}

/// `YYYY-MM-DD` for years 0000–9999, else the day number as it came.
pub(super) fn date(days: i32) -> Value {
    match civil(i64::from(days)) {
        Some((y, m, d)) => json!(format!("{y:04}-{m:02}-{d:02}")),
        None => json!(days),
    }
}

/// (year, month, day) of a day counted from 1970-01-01 (proleptic Gregorian), for
/// the years 0000–9999 only.
fn civil(days: i64) -> Option<(i64, i64, i64)> {
    if !(FIRST_DAY..=LAST_DAY).contains(&days) {
        return None;
    }
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    Some((yoe + era * 400 + i64::from(m <= 2), m, d))
}

/// A two's-complement big-endian unscaled value with `scale` digits after the point.
pub(super) fn decimal(bytes: &[u8], scale: usize) -> Result<Value, JsonError> {
    if bytes.len() > 16 {
        return Err(JsonError::DecimalTooLong(bytes.len()));
    }
    if scale > MAX_DECIMAL_SCALE {
        return Err(JsonError::DecimalScale(scale));
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
