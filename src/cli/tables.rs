//! The tables `outboxd store …` prints, from the wire views the store or the
//! running service answered with. The only user of comfy-table.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::wire::{AuditView, BytesView, ChainView, RecordView, State, StatsView};

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

/// An optional text as a table cell: `-` when there is none.
fn cell(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".to_owned())
}

/// `store stats`: one row per count, no header.
pub fn stats_table(stats: &StatsView) -> Table {
    fields(table(&["", ""]), stats_rows(stats))
}

/// `store get`: one row per field of the record.
pub fn record_table(record: &RecordView) -> Table {
    fields(table(&["field", "value"]), record_rows(record))
}

fn fields(mut t: Table, rows: Vec<(&'static str, String)>) -> Table {
    for (k, v) in rows {
        t.add_row(vec![k.to_owned(), v]);
    }
    t
}

/// `store list`: one row per record.
pub fn records_table(records: &[RecordView]) -> Table {
    let mut t = table(&["event_id", "state", "attempts", "topic/partition@offset", "updated_at", "outcome / reason"]);
    for r in records {
        let outcome = match (&r.chain, r.state) {
            (Some(c), State::Held) => match &c.head {
                Some(head) => format!("held behind {head}"),
                None => "held; its chain is released, it runs now".to_owned(),
            },
            (Some(c), _) if c.held_total > 0 => format!("{} [holds {} event(s)]", cell(&r.reason), c.held_total),
            _ if r.outcome.is_none() => cell(&r.reason),
            _ => cell(&r.outcome),
        };
        t.add_row(vec![
            r.event_id.clone(),
            r.state.to_string(),
            r.attempts.to_string(),
            format!("{}/{}@{}", r.topic, r.partition, r.offset),
            r.updated_at.clone(),
            outcome,
        ]);
    }
    t
}

/// `store audit`: one row per entry, newest first.
pub fn audit_table(entries: &[AuditView]) -> Table {
    let mut t = table(&["at", "who", "action", "events", "outcome", "reason"]);
    for e in entries {
        let events: Vec<String> = e
            .events
            .iter()
            .map(|ev| match (&ev.topic, ev.partition) {
                (Some(topic), Some(p)) => format!("{} ({topic}/{p})", ev.id),
                _ => ev.id.clone(),
            })
            .collect();
        let events = if events.is_empty() { "-".to_owned() } else { events.join("\n") };
        t.add_row(vec![e.at.clone(), e.who.clone(), e.action.to_string(), events, e.outcome.clone(), cell(&e.reason)]);
    }
    t
}

/// A held chain as one table cell: the key, what it waits for, and the held events.
fn chain_cell(chain: &ChainView) -> String {
    let key = match &chain.key {
        BytesView::Text(t) => format!("{t:?}"),
        BytesView::Bytes { bytes } => format!("{bytes:02x?}"),
    };
    let waits = match &chain.head {
        Some(head) => format!("waits for {head}"),
        None => "released: its held events run now".to_owned(),
    };
    let more = chain.held_total.saturating_sub(chain.held.len() as u64);
    let mut held = chain.held.join(", ");
    if more > 0 {
        held.push_str(&format!("{}{more} more", if held.is_empty() { "" } else { ", " }));
    }
    format!("key {key}; {waits}; {} held: {held}", chain.held_total)
}

/// Each field's name and table cell, in the order of the record's JSON (`store get`).
pub fn record_rows(r: &RecordView) -> Vec<(&'static str, String)> {
    vec![
        ("attempts", r.attempts.to_string()),
        ("chain", r.chain.as_ref().map_or_else(|| "-".to_owned(), chain_cell)),
        ("claimed_at", cell(&r.claimed_at)),
        ("dead_letter", cell(&r.dead_letter)),
        ("done_at", cell(&r.done_at)),
        ("duplicates", r.duplicates.to_string()),
        ("event_id", r.event_id.clone()),
        ("event_type", cell(&r.event_type)),
        ("expires_at", cell(&r.expires_at)),
        ("first_seen", r.first_seen.clone()),
        ("key", cell(&r.key)),
        ("offset", r.offset.to_string()),
        ("outcome", cell(&r.outcome)),
        ("partition", r.partition.to_string()),
        ("reason", cell(&r.reason)),
        ("state", r.state.to_string()),
        ("topic", r.topic.clone()),
        ("updated_at", r.updated_at.clone()),
    ]
}

/// Each count's name and table cell, in the order of the stats' JSON (`store stats`).
pub fn stats_rows(s: &StatsView) -> Vec<(&'static str, String)> {
    vec![
        ("bytes_on_disk", s.bytes_on_disk.to_string()),
        ("claimed", s.claimed.to_string()),
        ("dead", s.dead.to_string()),
        ("done", s.done.to_string()),
        ("duplicates_suppressed", s.duplicates_suppressed.to_string()),
        ("held", s.held.to_string()),
        ("newest", cell(&s.newest)),
        ("oldest", cell(&s.oldest)),
        ("parked", s.parked.to_string()),
    ]
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
