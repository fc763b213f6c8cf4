//! The views' JSON and tables are what `store … --json`, `store export`, `/v1`
//! and `store …` have always printed: these strings were taken from the output
//! before the views were types, and a renamed or reordered field fails here.

use serde_json::{json, Value};

use super::*;
use crate::event::RawMessage;
use crate::store::{Record, State, Stats};
use crate::wire::{AuditPage, ExportLine, GcView, PageView, RedecodedView, RetryView};

fn record() -> Record {
    Record {
        event_id: "e1".into(),
        scope: Some("orders".into()),
        state: State::Dead,
        attempts: 3,
        topic: "orders".into(),
        partition: 2,
        offset: 41,
        key: Some("order-1".into()),
        event_type: None,
        first_seen_us: 1_700_000_000_000_001,
        claimed_at_us: Some(1_700_000_000_500_000),
        done_at_us: None,
        updated_at_us: 1_700_000_001_000_000,
        outcome: None,
        reason: Some("http 422".into()),
        dead_letter: Some("dlq/0@7".into()),
        duplicates: 1,
        expires_at_us: Some(1_700_086_400_000_000),
        chain: None,
        version: 0,
    }
}

fn stats() -> Stats {
    Stats {
        claimed: 1,
        done: 2,
        dead: 3,
        parked: 4,
        held: 7,
        duplicates_suppressed: 5,
        bytes_on_disk: 6,
        oldest_us: Some(1),
        newest_us: None,
    }
}

fn message() -> RawMessage {
    RawMessage {
        topic: "orders".into(),
        partition: 2,
        offset: 41,
        key: Some(b"k".to_vec()),
        value: Some(vec![0xff, 1]),
        headers: vec![("id".into(), Some(b"e1".to_vec())), ("n".into(), None)],
        timestamp_ms: None,
    }
}

const RECORD: &str = r#"{"attempts":3,"chain":null,"claimed_at":"2023-11-14T22:13:20.500000Z","dead_letter":"dlq/0@7","done_at":null,"duplicates":1,"event_id":"e1","event_type":null,"expires_at":"2023-11-15T22:13:20.000000Z","first_seen":"2023-11-14T22:13:20.000001Z","key":"order-1","offset":41,"outcome":null,"partition":2,"reason":"http 422","scope":"orders","state":"dead","topic":"orders","updated_at":"2023-11-14T22:13:21.000000Z"}"#;
const STATS: &str = r#"{"bytes_on_disk":6,"claimed":1,"dead":3,"done":2,"duplicates_suppressed":5,"held":7,"newest":null,"oldest":"1970-01-01T00:00:00.000001Z","parked":4}"#;
const EXPORT: &str = r#"{"attempts":3,"chain":null,"claimed_at":"2023-11-14T22:13:20.500000Z","dead_letter":"dlq/0@7","done_at":null,"duplicates":1,"event_id":"e1","event_type":null,"expires_at":"2023-11-15T22:13:20.000000Z","first_seen":"2023-11-14T22:13:20.000001Z","key":"order-1","message":{"headers":[["id","e1"],["n",null]],"key":"k","offset":41,"partition":2,"topic":"orders","value":{"bytes":[255,1]}},"offset":41,"outcome":null,"partition":2,"reason":"http 422","scope":"orders","state":"dead","topic":"orders","updated_at":"2023-11-14T22:13:21.000000Z"}"#;

const RECORD_TABLE: &str = "\
┌─────────────┬─────────────────────────────┐
│ field       ┆ value                       │
╞═════════════╪═════════════════════════════╡
│ attempts    ┆ 3                           │
│ chain       ┆ -                           │
│ claimed_at  ┆ 2023-11-14T22:13:20.500000Z │
│ dead_letter ┆ dlq/0@7                     │
│ done_at     ┆ -                           │
│ duplicates  ┆ 1                           │
│ event_id    ┆ e1                          │
│ event_type  ┆ -                           │
│ expires_at  ┆ 2023-11-15T22:13:20.000000Z │
│ first_seen  ┆ 2023-11-14T22:13:20.000001Z │
│ key         ┆ order-1                     │
│ offset      ┆ 41                          │
│ outcome     ┆ -                           │
│ partition   ┆ 2                           │
│ reason      ┆ http 422                    │
│ scope       ┆ orders                      │
│ state       ┆ dead                        │
│ topic       ┆ orders                      │
│ updated_at  ┆ 2023-11-14T22:13:21.000000Z │
└─────────────┴─────────────────────────────┘";

const RECORDS_TABLE: &str = "\
┌──────────┬───────┬──────────┬────────────────────────┬─────────────────────────────┬──────────────────┐
│ event_id ┆ state ┆ attempts ┆ topic/partition@offset ┆ updated_at                  ┆ outcome / reason │
╞══════════╪═══════╪══════════╪════════════════════════╪═════════════════════════════╪══════════════════╡
│ e1       ┆ dead  ┆ 3        ┆ orders/2@41            ┆ 2023-11-14T22:13:21.000000Z ┆ http 422         │
└──────────┴───────┴──────────┴────────────────────────┴─────────────────────────────┴──────────────────┘";

const STATS_TABLE: &str = "\
┌───────────────────────┬─────────────────────────────┐
│ bytes_on_disk         ┆ 6                           │
│ claimed               ┆ 1                           │
│ dead                  ┆ 3                           │
│ done                  ┆ 2                           │
│ duplicates_suppressed ┆ 5                           │
│ held                  ┆ 7                           │
│ newest                ┆ -                           │
│ oldest                ┆ 1970-01-01T00:00:00.000001Z │
│ parked                ┆ 4                           │
└───────────────────────┴─────────────────────────────┘";

/// The top-level keys of a JSON object, in the order they were written.
fn keys(json: &str) -> Vec<String> {
    // serde_json's map sorts its keys: read where each stands off the text.
    let mut keys = Vec::new();
    let object: Value = serde_json::from_str(json).unwrap();
    for k in object.as_object().unwrap().keys() {
        let at = json.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("{k} in {json}"));
        keys.push((at, k.clone()));
    }
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

#[test]
fn a_record_view_serializes_to_the_json_of_today() {
    let view = RecordView::from(&record());
    assert_eq!(serde_json::to_string(&view).unwrap(), RECORD);
    assert_eq!(
        keys(RECORD),
        [
            "attempts",
            "chain",
            "claimed_at",
            "dead_letter",
            "done_at",
            "duplicates",
            "event_id",
            "event_type",
            "expires_at",
            "first_seen",
            "key",
            "offset",
            "outcome",
            "partition",
            "reason",
            "scope",
            "state",
            "topic",
            "updated_at"
        ]
    );
    assert_eq!(serde_json::from_str::<RecordView>(RECORD).unwrap(), view);
}

#[test]
fn a_stats_view_serializes_to_the_json_of_today() {
    let view = StatsView::from(&stats());
    assert_eq!(serde_json::to_string(&view).unwrap(), STATS);
    assert_eq!(
        keys(STATS),
        ["bytes_on_disk", "claimed", "dead", "done", "duplicates_suppressed", "held", "newest", "oldest", "parked"]
    );
    assert_eq!(serde_json::from_str::<StatsView>(STATS).unwrap(), view);
}

#[test]
fn an_export_line_puts_the_message_among_the_record_fields_as_today() {
    let line = ExportLine { record: (&record()).into(), message: Some((&message()).into()) };
    assert_eq!(serde_json::to_string(&line).unwrap(), EXPORT);
    assert_eq!(serde_json::from_str::<ExportLine>(EXPORT).unwrap(), line);
    let message = serde_json::to_string(line.message.as_ref().unwrap()).unwrap();
    assert_eq!(
        message,
        r#"{"headers":[["id","e1"],["n",null]],"key":"k","offset":41,"partition":2,"topic":"orders","value":{"bytes":[255,1]}}"#
    );
    let without = ExportLine { record: (&record()).into(), message: None };
    assert_eq!(serde_json::to_string(&without).unwrap(), RECORD, "no copy: the record alone");
    assert_eq!(serde_json::from_str::<ExportLine>(RECORD).unwrap(), without);
}

#[test]
fn a_page_gc_and_retry_answer_keep_their_wire_shape() {
    let record = RecordView::from(&record());
    let page = PageView { next: Some("e1".into()), partial: false, records: vec![record.clone()] };
    let json = format!(r#"{{"next":"e1","partial":false,"records":[{RECORD}]}}"#);
    assert_eq!(serde_json::to_string(&page).unwrap(), json);
    let last = PageView { next: None, partial: false, records: vec![] };
    assert_eq!(serde_json::to_string(&last).unwrap(), r#"{"next":null,"partial":false,"records":[]}"#);
    // A page from a service of before the read budget has no `partial`: a whole page.
    let earlier: PageView = serde_json::from_str(r#"{"next":null,"records":[]}"#).unwrap();
    assert_eq!(earlier, last);
    let stopped = PageView { next: Some("e9".into()), partial: true, records: vec![] };
    assert_eq!(serde_json::from_str::<PageView>(&serde_json::to_string(&stopped).unwrap()).unwrap(), stopped);
    assert_eq!(serde_json::to_string(&GcView { removed: 7 }).unwrap(), r#"{"removed":7}"#);

    let finished = RetryView::Finished(Box::new(record));
    assert_eq!(serde_json::to_string(&finished).unwrap(), RECORD);
    let redecoded = RetryView::Redecoded(RedecodedView::new("e1"));
    let wire = json!({"event_id": "e1", "state": "rerun", "note": "recorded under its decoded event id"});
    assert_eq!(serde_json::to_value(&redecoded).unwrap(), wire);
    for answer in [finished, redecoded] {
        let text = serde_json::to_string(&answer).unwrap();
        assert_eq!(serde_json::from_str::<RetryView>(&text).unwrap(), answer, "{text}");
    }
}

#[test]
fn a_renamed_or_missing_field_fails_to_read_and_names_the_field() {
    let renamed = RECORD.replace("\"done_at\"", "\"finished_at\"");
    let e = serde_json::from_str::<RecordView>(&renamed).unwrap_err().to_string();
    assert!(e.contains("missing field `done_at`"), "{e}");
    let e = serde_json::from_str::<RetryView>(&renamed).unwrap_err().to_string();
    assert!(e.contains("missing field `done_at`"), "a retry answer names it too: {e}");
    let e = serde_json::from_str::<StatsView>(&STATS.replace("\"newest\":null,", "")).unwrap_err().to_string();
    assert!(e.contains("missing field `newest`"), "{e}");
    let e = serde_json::from_str::<PageView>(r#"{"records":[]}"#).unwrap_err().to_string();
    assert!(e.contains("missing field `next`"), "{e}");
    let e = serde_json::from_str::<GcView>(r#"{"deleted":1}"#).unwrap_err().to_string();
    assert!(e.contains("missing field `removed`"), "{e}");
}

#[test]
fn the_tables_print_as_today() {
    let view = RecordView::from(&record());
    assert_eq!(record_table(&view).to_string(), RECORD_TABLE);
    assert_eq!(records_table(std::slice::from_ref(&view)).to_string(), RECORDS_TABLE);
    assert_eq!(stats_table(&StatsView::from(&stats())).to_string(), STATS_TABLE);
    // `store get` and `store stats` print a row per JSON field, in the JSON's order.
    let rows = |r: Vec<(&'static str, String)>| r.into_iter().map(|(k, _)| k.to_owned()).collect::<Vec<_>>();
    assert_eq!(rows(record_rows(&view)), keys(RECORD));
    assert_eq!(rows(stats_rows(&StatsView::from(&stats()))), keys(STATS));
}

#[test]
fn a_record_in_a_held_chain_shows_what_it_waits_for_and_the_head_what_it_holds() {
    let chain = |head: Option<&str>| ChainView {
        head: head.map(str::to_owned),
        held: vec!["e2".into(), "e3".into()],
        held_total: 3,
        key: BytesView::Text("order-1".into()),
    };
    let head = RecordView { chain: Some(chain(Some("e1"))), ..RecordView::from(&record()) };
    let json = serde_json::to_string(&head).unwrap();
    assert!(json.contains(r#""chain":{"head":"e1","held":["e2","e3"],"held_total":3,"key":"order-1"}"#), "{json}");
    assert_eq!(serde_json::from_str::<RecordView>(&json).unwrap(), head);
    let row = record_rows(&head).into_iter().find(|(k, _)| *k == "chain").unwrap().1;
    assert_eq!(row, "key \"order-1\"; waits for e1; 3 held: e2, e3, 1 more");
    let mut held = RecordView { state: State::Held, ..head.clone() };
    let list = records_table(&[head, held.clone()]).to_string();
    assert!(list.contains("http 422 [holds 3 event(s)]") && list.contains("held behind e1"), "{list}");
    held.chain = Some(chain(None));
    assert!(records_table(&[held]).to_string().contains("it runs now"));
}

#[test]
fn a_record_of_a_later_route_names_its_route_in_the_list() {
    let routed = RecordView { scope: Some("orders#mailer".into()), ..RecordView::from(&record()) };
    let list = records_table(&[RecordView::from(&record()), routed]).to_string();
    assert_eq!(list.matches("(route mailer)").count(), 1, "{list}");
}

#[test]
fn an_audit_entry_reads_back_from_its_json_and_a_missing_field_is_named() {
    use crate::store::{AuditAction, AuditEntry, AuditEvent};
    let entry = AuditEntry {
        at_us: 1_700_000_000_000_001,
        who: "alice".into(),
        action: AuditAction::Retry,
        events: vec![
            AuditEvent { id: "e1".into(), source: Some(("orders".into(), 2)) },
            AuditEvent { id: "e9".into(), source: None },
        ],
        reason: Some("INC-1".into()),
        outcome: "dead again".into(),
    };
    let page = AuditPage { entries: vec![AuditView::from(&entry)], next: Some("00ff".into()) };
    let json = serde_json::to_string(&page).unwrap();
    assert_eq!(
        json,
        r#"{"entries":[{"action":"retry","at":"2023-11-14T22:13:20.000001Z","events":[{"id":"e1","partition":2,"topic":"orders"},{"id":"e9","partition":null,"topic":null}],"outcome":"dead again","reason":"INC-1","who":"alice"}],"next":"00ff"}"#
    );
    assert_eq!(serde_json::from_str::<AuditPage>(&json).unwrap(), page);
    let e = serde_json::from_str::<AuditPage>(&json.replace(r#""reason":"INC-1","#, "")).unwrap_err().to_string();
    assert!(e.contains("missing field `reason`"), "{e}");
    let table = audit_table(&page.entries).to_string();
    assert!(table.contains("e1 (orders/2)") && table.contains("dead again") && table.contains("INC-1"), "{table}");
}

/// What an event can bring that would drive a terminal: a screen clear and a window
/// title (ESC sequences), a carriage return, the one-byte C1 CSI, a bidi override that
/// shows `exe.jpg` as `gpj.exe`... and a line separator.
const HOSTILE: &str = "e\u{1b}[2J\u{1b}]0;owned\u{7}\r\u{9b}31m\u{202e}exe.jpg\u{2028}x";
/// [`HOSTILE`] as the tables show it.
const ESCAPED: &str = r"e\u{1b}[2J\u{1b}]0;owned\u{7}\r\u{9b}31m\u{202e}exe.jpg\u{2028}x";

/// Fails when `table` holds a character that is not plain text for a terminal (its own
/// line breaks aside).
fn assert_plain(what: &str, table: &str) {
    for line in table.lines() {
        let bad: Vec<char> = line.chars().filter(|c| c.is_control() || ('\u{2028}'..='\u{202e}').contains(c)).collect();
        assert!(bad.is_empty(), "{what}: {bad:?} reach the terminal in {line:?}");
    }
}

#[test]
fn text_from_events_is_escaped_in_every_table_and_exact_in_json() {
    let hostile = Some(HOSTILE.to_owned());
    let chain = ChainView {
        head: hostile.clone(),
        held: vec![HOSTILE.to_owned()],
        held_total: 1,
        key: BytesView::Text(HOSTILE.to_owned()),
    };
    let record = RecordView {
        event_id: HOSTILE.into(),
        topic: HOSTILE.into(),
        key: hostile.clone(),
        event_type: hostile.clone(),
        reason: hostile.clone(),
        outcome: hostile.clone(),
        dead_letter: hostile.clone(),
        chain: Some(chain),
        ..RecordView::from(&record())
    };
    let held = RecordView { state: State::Held, ..record.clone() };
    let done = RecordView { chain: None, ..record.clone() };
    let audit = AuditView {
        who: HOSTILE.into(),
        events: vec![crate::wire::AuditEventView { id: HOSTILE.into(), topic: hostile.clone(), partition: Some(0) }],
        outcome: HOSTILE.into(),
        reason: hostile.clone(),
        ..AuditView::from(&crate::store::AuditEntry {
            at_us: 1,
            who: "alice".into(),
            action: crate::store::AuditAction::Forget,
            events: vec![],
            reason: None,
            outcome: "done".into(),
        })
    };
    let circuit = CircuitView {
        handler: HOSTILE.into(),
        state: "open".into(),
        failures: 3,
        open_for_seconds: Some(1.0),
        next_probe_in_seconds: Some(0.5),
        last_failure: hostile.clone(),
        open_seconds_total: 1.0,
        transitions: 1,
    };
    for (what, table) in [
        ("store get", record_table(&record).to_string()),
        ("store list", records_table(&[record.clone(), held, done]).to_string()),
        ("store audit", audit_table(std::slice::from_ref(&audit)).to_string()),
        ("store stats", handlers_table(std::slice::from_ref(&circuit)).to_string()),
    ] {
        assert_plain(what, &table);
        assert!(table.contains(ESCAPED), "{what} shows the text, escaped:\n{table}");
    }
    // `--json` carries the text exactly as it came.
    let json = serde_json::to_string(&record).unwrap();
    assert_eq!(serde_json::from_str::<RecordView>(&json).unwrap(), record);
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap()["event_id"], HOSTILE);
    let json = serde_json::to_string(&audit).unwrap();
    assert_eq!(serde_json::from_str::<AuditView>(&json).unwrap(), audit);
}

#[test]
fn ordinary_text_is_shown_as_it_is() {
    for plain in ["order-1/événement", r"C:\orders\7", "注文-7", "naïve café 🍰"] {
        assert_eq!(shown(plain), plain);
        assert!(matches!(shown(plain), std::borrow::Cow::Borrowed(_)), "no copy for plain text");
    }
    assert_eq!(shown("a\tb\nc\0"), r"a\tb\nc\0");
    assert_eq!(shown("zero\u{200b}width\u{feff}"), r"zero\u{200b}width\u{feff}");
}

/// `check-config`'s routes: each topic's routes in the order they run, what each
/// selects, its record scope and idempotency key; a route that can never select is
/// said so under the table.
#[test]
fn check_config_lists_each_topics_routes_with_their_scope_and_key() {
    let text = include_str!("../../examples/outboxd-routes.toml");
    let env = |name: &str| (name == "PARTNER_WHSEC").then(|| "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned());
    let out = super::routes(&crate::config::Config::parse(text, &env).unwrap());
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with('│'))
        .map(|l| l.trim_matches('│').split('┆').map(str::trim).collect())
        .collect();
    let topic = "outbox.event.order";
    assert_eq!(rows[0], ["topic", "route", "handler", "selects", "record scope", "idempotency key"]);
    assert_eq!(rows[1], [topic, "1", "partner", "every event", topic, "<event id>"]);
    assert_eq!(rows[2], ["", "2", "mailer", "types OrderPaid", "outbox.event.order#mailer", "<event id>#mailer"]);
    assert_eq!(
        rows[3],
        ["", "3", "shipping-log", "types OrderShip*, OrderDelivered", "outbox.event.order#shipping-log", "<event id>#shipping-log"]
    );
    assert_eq!(rows.len(), 4, "{out}");
    assert!(!out.contains("WARNING"), "{out}");

    let raw = crate::config::testing::parse(
        "[[handlers]]\nname=\"tiers\"\ntopics=[\"o\"]\nkind=\"log\"\nformat=\"raw\"\n\
         [[handlers.when]]\nfield=\"customer.tier\"\nequals=\"gold\"\n",
    )
    .unwrap();
    let out = super::routes(&raw);
    assert!(out.contains("routes: WARNING handlers[0] (tiers) can never select an event"), "{out}");
}
