//! End-to-end tests of the real pipeline: PostgreSQL outbox table → Debezium
//! (PostgreSQL connector + outbox EventRouter on Kafka Connect) → Kafka → outboxd →
//! HTTP receiver. They need the whole local stack (`scripts/stack up`: Kafka,
//! PostgreSQL, Kafka Connect with `outbox-connector`) and fail, saying so, without it.
//!
//! The tests share one Connect worker and some kill it or add connectors to it, so they
//! run one at a time, also with the Avro pipeline tests ([`turns::CONNECT`]), and
//! against other processes running this binary on the same machine ([`StackTurn`]). Each uses its own aggregatetype (so its own topic),
//! consumer group and store, and leaves Connect running with `outbox-connector` RUNNING
//! and no connector, slot, publication, table or outbox row of its own behind.
//! `debezium_crash_replays_are_suppressed` kills and restarts Connect through
//! `scripts/stack`, so it needs the stack that script runs (not just any
//! `OUTBOXD_TEST_CONNECT`).
//!
//! Measured figures (rows, messages, duplicates, latency percentiles) are printed to
//! stderr: run with `--nocapture` to see them.
//!
//! The tests are in [`pipeline`], [`converters`] and [`latency`]; this module holds the
//! stack they share and their assertions.

use crate::harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use harness::debezium::{
    assert_each_called_once, connector_config, insert_sql, lit, outbox_topic, shorten, sweep_leftovers,
    wait_all_answered, wait_committed_to_end, Connect, ConnectCrash, OutboxRow, Pg, Scratch, StackTurn, MAIN_CONNECTOR,
    MAIN_TABLE,
};
use harness::{turns, unique_name, wait_until, Kafka, Message, Receiver, Scenario};
use serde_json::{json, Value};

mod converters;
mod latency;
mod pipeline;

/// Bound for "every event reached the receiver" (Debezium → Kafka → outboxd).
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound for a connector to be RUNNING and streaming.
const CONNECTOR_TIMEOUT: Duration = Duration::from_secs(60);
const TOPIC_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// After everything was handled, how long late (duplicate) calls get to show up.
const SETTLE: Duration = Duration::from_millis(1500);

/// The stack, checked, and this test's turn.
struct Stack {
    kafka: Kafka,
    pg: Pg,
    connect: Connect,
    _process_turn: StackTurn,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

async fn stack() -> Stack {
    // One test at a time: they kill, restart and reconfigure the one Connect worker.
    let turn = turns::CONNECT.lock().await;
    let process_turn = StackTurn::take(Duration::from_secs(300)).await;
    let pg = Pg::connect();
    let connect = Connect::connect().await;
    let kafka = Kafka::connect();
    sweep_leftovers(&pg, &connect).await;
    Stack { kafka, pg, connect, _process_turn: process_turn, _turn: turn }
}

impl Stack {
    /// What every test leaves: Connect up with the main connector RUNNING, and no
    /// connector or replication slot of this test process.
    async fn assert_left_clean(&self) {
        self.connect.wait_running(MAIN_CONNECTOR, CONNECTOR_TIMEOUT).await;
        let ours = format!("outboxd-it-{}-", std::process::id());
        let names = self.connect.names().await.expect("list connectors");
        let left: Vec<&String> = names.iter().filter(|n| n.starts_with(&ours)).collect();
        assert!(left.is_empty(), "connectors left behind: {left:?}");
        let slots = self.pg.query(&format!(
            "SELECT string_agg(slot_name, ',') FROM pg_replication_slots WHERE slot_name LIKE 'outboxd\\_it\\_{}\\_%'",
            std::process::id()
        ));
        assert!(slots.trim().is_empty(), "replication slots left behind: {}", slots.trim());
    }

    /// A scenario on `topic` (which the test created, named as Debezium routes), its
    /// outboxd started and assigned.
    async fn running_outboxd(&self, topic: &str) -> Scenario {
        let mut s = Scenario::on(self.kafka.clone(), topic.to_owned());
        s.run().await;
        s
    }

    /// Sum of the end offsets of `topic` (all our topics start empty).
    fn messages_on(&self, offsets: &harness::OffsetReader) -> i64 {
        offsets.end().values().sum()
    }
}

fn url_safe(s: &str) -> bool {
    s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// The receiver's call for each row carries what the row says.
fn assert_calls_match_rows(receiver: &Receiver, rows: &[OutboxRow]) {
    for row in rows {
        let calls = receiver.calls_for(&row.id);
        let call = calls.first().unwrap_or_else(|| panic!("no call for event {}", row.id));
        assert_eq!(call.method, "POST", "{call:?}");
        assert_eq!((call.status, call.answered.is_some()), (200, true), "{call:?}");
        assert_eq!(call.header("Idempotency-Key"), Some(row.id.as_str()), "{call:?}");
        assert_eq!(call.header("Outbox-Event-Type"), Some(row.event_type.as_str()), "{call:?}");
        assert_eq!(call.header("Outbox-Aggregate-Id"), Some(row.aggregateid.as_str()), "{call:?}");
        assert_eq!(call.header("Content-Type"), Some("application/json"), "{call:?}");
        assert_eq!(
            call.body, row.payload,
            "the body of event {} (type {}) must be the row's payload as JSON",
            row.id, row.event_type
        );
        // URL template /events/{aggregate_id}/{event_id}: the aggregate id is one
        // percent-encoded path segment whatever it contains.
        let segments: Vec<&str> = call.path.split('/').collect();
        assert_eq!(segments.len(), 4, "path {:?} should have exactly two segments after /events", call.path);
        assert_eq!(segments[1], "events");
        let aggregate = percent_encoding::percent_decode_str(segments[2]).decode_utf8_lossy();
        assert_eq!(aggregate, row.aggregateid, "aggregate id in path {:?}", call.path);
        if url_safe(&row.aggregateid) {
            assert_eq!(call.path, format!("/events/{}/{}", row.aggregateid, row.id));
        }
        assert_eq!(segments[3], row.id);
    }
}

/// Counts messages per event id (header `id`, unwrapped from JSON quoting or a
/// JsonConverter envelope as a consumer would).
fn messages_per_id(messages: &[Message]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for m in messages {
        let id = m.header("id").map(|h| json_text(&h)).unwrap_or_default();
        *out.entry(id).or_default() += 1;
    }
    out
}

/// Text from a header or key that may be plain, a JSON string, or a JsonConverter
/// envelope around a string.
fn json_text(s: &str) -> String {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::String(t)) => t,
        Ok(v) if v.get("schema").is_some() && v["payload"].is_string() => v["payload"].as_str().unwrap().to_string(),
        _ => s.to_string(),
    }
}

/// Payloads of several shapes; PostgreSQL's jsonb re-serialises them (key order,
/// spacing, number text), so they are compared as JSON. With `expanded` false the set
/// also has null members, which the EventRouter's `table.expand.json.payload` drops.
fn payload_shapes(expanded: bool) -> Vec<Value> {
    let mut v = vec![
        json!({"orderId": "o-1", "total": 42.5, "currency": "EUR",
               "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}),
        json!({"customer": {"id": 7, "tags": ["vip", "eu"], "address": {"city": "Zürich", "zip": "8001"}}}),
        json!({"text": "quote \" backslash \\ apostrophe ' tab \t newline \n emoji ✓ 🚀 nul-ish \u{1}"}),
        json!({}),
        json!([1, "two", {"three": 3}]),
        json!({"big": 9007199254740993u64, "neg": -17, "small": 0.001, "flag": false}),
        json!({"mixed": [1, "a", true], "empty": [], "deep": {"a": {"b": {"c": [[1], [2, 3]]}}}}),
    ];
    if !expanded {
        // Expansion drops null members. And a number that jsonb prints as a long integer
        // (1.5e300 comes out as 15 and 299 zeros) makes Debezium 3.6.1's expansion fail
        // half-way ("Invalid Java object for schema with type FLOAT64: BigDecimal"),
        // after which the JsonConverter throws and the connector task FAILS.
        v.push(json!({"n": 1, "nothing": null, "list": [null, 1]}));
        v.push(json!({"huge": 1.5e300, "tiny": 1e-300}));
    }
    v
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn describe_ms(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
        percentile(&v, 50.0),
        percentile(&v, 90.0),
        percentile(&v, 99.0),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    )
}

fn ms_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -(e.duration().as_secs_f64() * 1000.0),
    }
}

/// Rows of `table` written by [`write_over_time`] so far.
type Progress = Arc<AtomicUsize>;

/// Writes `rows` into `table`, `per_tx` rows per transaction, pausing between
/// transactions; counts committed rows in `progress`.
async fn write_over_time(
    pg: Pg,
    table: String,
    rows: Vec<OutboxRow>,
    per_tx: usize,
    pause: Duration,
    progress: Progress,
) {
    let mut db = pg.session();
    for chunk in rows.chunks(per_tx) {
        db.exec(&format!("BEGIN; {} COMMIT;", insert_sql(&table, chunk))).await;
        progress.fetch_add(chunk.len(), Ordering::SeqCst);
        tokio::time::sleep(pause).await;
    }
    db.close().await;
}

async fn join<T>(task: tokio::task::JoinHandle<T>) -> T {
    match task.await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("task failed: {e}"),
    }
}

/// Removes this test's rows from the shared outbox table (the EventRouter ignores
/// deletes) and the orders it made.
fn delete_main_rows(pg: &Pg, aggregatetype: &str) {
    pg.query(&format!(
        "DELETE FROM {MAIN_TABLE} WHERE aggregatetype = {at}; DELETE FROM public.orders WHERE id LIKE {prefix};",
        at = lit(aggregatetype),
        prefix = lit(&format!("{aggregatetype}-%"))
    ));
}
