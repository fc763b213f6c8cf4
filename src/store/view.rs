//! What people and the admin API see of the store: records, stats and message
//! copies as JSON (the shape `store … --json`, `store export` and `/v1` answer
//! with), and the tables `store …` prints. The tables render that JSON, so a
//! direct read and an answer of the running service print alike. comfy-table
//! is used only here.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::{json, Value};

use super::{Record, Stats, Store, StoreError};
use crate::event::RawMessage;

/// A time in µs since the epoch as RFC 3339 with microseconds (UTC).
pub fn rfc3339(us: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

/// A record as JSON, times as RFC 3339: what `store get|list --json`, `store
/// export` and the admin API show of it.
pub fn record_json(r: &Record) -> Value {
    json!({
        "event_id": r.event_id,
        "state": r.state,
        "attempts": r.attempts,
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "key": r.key,
        "event_type": r.event_type,
        "first_seen": rfc3339(r.first_seen_us),
        "claimed_at": r.claimed_at_us.map(rfc3339),
        "done_at": r.done_at_us.map(rfc3339),
        "updated_at": rfc3339(r.updated_at_us),
        "outcome": r.outcome,
        "reason": r.reason,
        "duplicates": r.duplicates,
        "dead_letter": r.dead_letter,
        "expires_at": r.expires_at_us.map(rfc3339),
    })
}

/// `store stats` as JSON, times as RFC 3339.
pub(crate) fn stats_json(s: &Stats) -> Value {
    json!({
        "claimed": s.claimed, "done": s.done, "dead": s.dead, "parked": s.parked,
        "duplicates_suppressed": s.duplicates_suppressed,
        "bytes_on_disk": s.bytes_on_disk,
        "oldest": s.oldest_us.map(rfc3339), "newest": s.newest_us.map(rfc3339),
    })
}

/// A stored message copy: key, value and header values as text when they are
/// UTF-8, else as `{"bytes": [...]}`.
pub fn message_json(m: &RawMessage) -> Value {
    let bytes = |b: &Option<Vec<u8>>| match b {
        None => Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => json!(s),
            Err(_) => json!({ "bytes": b }),
        },
    };
    json!({
        "topic": m.topic, "partition": m.partition, "offset": m.offset,
        "key": bytes(&m.key), "value": bytes(&m.value),
        "headers": m.headers.iter().map(|(k, v)| json!([k, bytes(v)])).collect::<Vec<_>>(),
    })
}

/// One JSON Lines row of `store export`: the record, plus the message copy of dead and parked events.
pub fn export_line(store: &Store, r: &Record) -> Result<Value, StoreError> {
    let mut line = record_json(r);
    if let Some(m) = store.message_of(r)? {
        line["message"] = message_json(&m);
    }
    Ok(line)
}

/// An empty table in the style of every `outboxd` table; no header row when
/// every title is empty.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    if header.iter().any(|h| !h.is_empty()) {
        t.set_header(header.to_vec());
    }
    t
}

/// A JSON value as a table cell: strings without quotes, null as `-`.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// `store stats`: one row per count, no header.
pub fn stats_table(stats: &Value) -> Table {
    fields(table(&["", ""]), stats)
}

/// `store get`: one row per field of the record.
pub fn record_table(record: &Value) -> Table {
    fields(table(&["field", "value"]), record)
}

fn fields(mut t: Table, value: &Value) -> Table {
    for (k, v) in value.as_object().into_iter().flatten() {
        t.add_row(vec![k.clone(), plain(v)]);
    }
    t
}

/// `store list`: one row per record.
pub fn records_table(records: &[Value]) -> Table {
    let mut t = table(&["event_id", "state", "attempts", "topic/partition@offset", "updated_at", "outcome / reason"]);
    for r in records {
        let outcome = if r["outcome"].is_null() { plain(&r["reason"]) } else { plain(&r["outcome"]) };
        t.add_row(vec![
            plain(&r["event_id"]),
            plain(&r["state"]),
            plain(&r["attempts"]),
            format!("{}/{}@{}", plain(&r["topic"]), plain(&r["partition"]), plain(&r["offset"])),
            plain(&r["updated_at"]),
            outcome,
        ]);
    }
    t
}
