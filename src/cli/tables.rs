//! The tables `outboxd store …` prints, from the wire views the store or the
//! running service answered with, and `check-config`'s table of each topic's
//! routes. The only user of comfy-table.
//!
//! Every text that came with an event or was written about one (ids, keys, types,
//! topics, outcomes, reasons, audit entries, a circuit's last failure) goes through
//! [`shown`] on its way into a cell: whoever produces to a topic must not be able to
//! drive the terminal of the person reading the store. `--json` prints the same text
//! exactly.

use std::borrow::Cow;
use std::fmt::Write as _;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::engine::CircuitView;
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

/// `text` as a terminal may show it: control characters (ESC and the rest of C0, DEL,
/// the C1 set with its one-byte CSI), line and paragraph separators, and the invisible
/// characters that reorder or hide text (bidi overrides and isolates, zero-width and tag
/// characters) are written as Rust escapes: `\u{1b}`, `\r`, `\u{202e}`. Everything else,
/// a backslash included, is left as it is, so that an ordinary id can be copied from the
/// table into the next command.
pub fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' | '\r' | '\n' | '\0' => out.extend(c.escape_debug()),
            c if hidden(c) => {
                let _ = write!(out, "{}", c.escape_unicode());
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A character [`shown`] escapes: one that moves the cursor, talks to the terminal, or
/// changes how the text around it reads without being seen itself.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00ad}'                       // soft hyphen
            | '\u{061c}'                     // Arabic letter mark
            | '\u{180e}'                     // Mongolian vowel separator
            | '\u{200b}'..='\u{200f}'        // zero-width space, joiners, LRM, RLM
            | '\u{2028}'..='\u{202e}'        // line and paragraph separators, bidi embeddings and overrides
            | '\u{2060}'..='\u{206f}'        // word joiner, invisible operators, bidi isolates
            | '\u{feff}'                     // zero-width no-break space
            | '\u{fff9}'..='\u{fffb}'        // interlinear annotations
            | '\u{e0000}'..='\u{e007f}'      // tag characters
        )
}

/// A text from an event as a table cell ([`shown`]).
fn text(v: &str) -> String {
    shown(v).into_owned()
}

/// An optional text as a table cell ([`shown`]): `-` when there is none.
fn cell(v: &Option<String>) -> String {
    v.as_deref().map_or_else(|| "-".to_owned(), text)
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

/// ` (route NAME)` for a record of a topic's later route (its scope ends with `#NAME`).
fn route_of(r: &RecordView) -> String {
    match r.route() {
        Some(name) => format!(" (route {})", shown(name)),
        None => String::new(),
    }
}

/// `store list`: one row per record.
pub fn records_table(records: &[RecordView]) -> Table {
    let mut t = table(&["event_id", "state", "attempts", "topic/partition@offset", "updated_at", "outcome / reason"]);
    for r in records {
        let outcome = match (&r.chain, r.state) {
            (Some(c), State::Held) => match &c.head {
                Some(head) => format!("held behind {}", shown(head)),
                None => "held; its chain is released, it runs now".to_owned(),
            },
            (Some(c), _) if c.held_total > 0 => format!("{} [holds {} event(s)]", cell(&r.reason), c.held_total),
            _ if r.outcome.is_none() => cell(&r.reason),
            _ => cell(&r.outcome),
        };
        t.add_row(vec![
            text(&r.event_id),
            r.state.to_string(),
            r.attempts.to_string(),
            format!("{}/{}@{}{}", shown(&r.topic), r.partition, r.offset, route_of(r)),
            text(&r.updated_at),
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
                (Some(topic), Some(p)) => format!("{} ({}/{p})", shown(&ev.id), shown(topic)),
                _ => text(&ev.id),
            })
            .collect();
        // One event a line: the line breaks are the table's, those of an id are escaped.
        let events = if events.is_empty() { "-".to_owned() } else { events.join("\n") };
        t.add_row(vec![text(&e.at), text(&e.who), e.action.to_string(), events, text(&e.outcome), cell(&e.reason)]);
    }
    t
}

/// A held chain as one table cell: the key, what it waits for, and the held events.
fn chain_cell(chain: &ChainView) -> String {
    let key = match &chain.key {
        BytesView::Text(t) => text(&format!("{t:?}")),
        BytesView::Bytes { bytes } => format!("{bytes:02x?}"),
    };
    let waits = match &chain.head {
        Some(head) => format!("waits for {}", shown(head)),
        None => "released: its held events run now".to_owned(),
    };
    let more = chain.held_total.saturating_sub(chain.held.len() as u64);
    let mut held = chain.held.iter().map(|id| shown(id)).collect::<Vec<_>>().join(", ");
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
        ("event_id", text(&r.event_id)),
        ("event_type", cell(&r.event_type)),
        ("expires_at", cell(&r.expires_at)),
        ("first_seen", text(&r.first_seen)),
        ("key", cell(&r.key)),
        ("offset", r.offset.to_string()),
        ("outcome", cell(&r.outcome)),
        ("partition", r.partition.to_string()),
        ("reason", cell(&r.reason)),
        ("scope", cell(&r.scope)),
        ("state", r.state.to_string()),
        ("topic", text(&r.topic)),
        ("updated_at", text(&r.updated_at)),
    ]
}

/// `store stats` of a running service: one row per handler's circuit, with the
/// receiver's last failure.
pub fn handlers_table(handlers: &[CircuitView]) -> Table {
    let mut t =
        table(&["handler", "circuit", "open for", "next probe in", "failures in a row", "last receiver failure"]);
    let secs = |s: Option<f64>| s.map_or_else(|| "-".to_owned(), |s| format!("{s:.1}s"));
    for h in handlers {
        t.add_row(vec![
            text(&h.handler),
            text(&h.state),
            secs(h.open_for_seconds),
            secs(h.next_probe_in_seconds),
            h.failures.to_string(),
            cell(&h.last_failure),
        ]);
    }
    t
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

/// What a route selects, said in a cell: its event types and `when` conditions.
fn selects(h: &crate::config::HandlerConfig) -> String {
    let mut parts: Vec<String> = h.event_types.iter().map(|e| format!("types {e}")).collect();
    parts.extend(h.when.iter().map(|c| format!("when {c}")));
    if parts.is_empty() {
        return "every event".to_owned();
    }
    parts.join("\n")
}

/// Each topic's routes in the order they run, what each selects, and the scope and
/// idempotency key of its records. Topics named in the file are listed with every
/// handler that takes them; a pattern's topics are known only once they exist.
/// Then a line per route that can never select (`outboxd check-config`).
pub fn routes(config: &crate::config::Config) -> String {
    let mut named: Vec<&str> = Vec::new();
    for h in &config.handlers {
        if let crate::config::TopicMatch::Exact(topics) = &h.topics {
            for topic in topics {
                if !named.contains(&topic.as_str()) {
                    named.push(topic);
                }
            }
        }
    }
    let mut t = table(&["topic", "route", "handler", "selects", "record scope", "idempotency key"]);
    for topic in &named {
        for (n, r) in config.routes_for(topic).enumerate() {
            let selects = selects(r.handler);
            let scope = match r.scope(topic) {
                s if s.is_empty() => "(shared)".to_owned(),
                s => s.into_owned(),
            };
            let key = r.key("<event id>").unwrap_or_else(|| "<event id>".to_owned());
            let first = if n == 0 { topic.to_string() } else { String::new() };
            t.add_row(vec![first, (n + 1).to_string(), r.handler.name.clone(), selects, scope, key]);
        }
    }
    for h in config.handlers.iter().filter(|h| matches!(h.topics, crate::config::TopicMatch::Pattern(_))) {
        let selects = selects(h);
        let place = "by its place in the file";
        t.add_row(vec![h.topics.to_string(), place.to_owned(), h.name.clone(), selects, String::new(), String::new()]);
    }
    let mut out = format!("routes (a topic's first route keeps the plain scope and, unless its idempotency_key says otherwise, sends the event id as its key):\n{t}");
    for warning in config.route_warnings() {
        let _ = write!(out, "\nroutes: WARNING {warning}");
    }
    out
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
