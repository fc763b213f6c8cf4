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
use harness::{turns, unique_name, wait_until, Kafka, Message, Outboxd, Receiver};
use serde_json::{json, Value};

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

// ---------------------------------------------------------------- the tests

/// Rows written by an application (with its state change in the same transaction,
/// several per transaction, insert-then-delete, rolled back) through the production
/// connector (`debezium/connector.json`, String converters) each become exactly one
/// HTTP call with the row's payload, type, aggregate id and id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_outbox_rows_become_side_effects() {
    let st = stack().await;
    let aggregatetype = unique_name("rows");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&st.kafka, &[&topic], &receiver);
    let offsets = st.kafka.offsets(&od.config.group_id, &topic);
    od.start();
    od.wait_for_assignment().await;

    let mut db = st.pg.session();
    let mut rows = Vec::new();
    let row = |aggregateid: &str, event_type: &str, payload: Value| {
        OutboxRow::new(&aggregatetype, aggregateid, event_type, payload)
    };
    // An order's state change and its event in one transaction (debezium/outbox.sql).
    for i in 0..4 {
        let order = format!("{aggregatetype}-order-{i}");
        let placed =
            row(&order, "OrderPlaced", json!({"orderId": order, "total": 10.5 * (i + 1) as f64, "currency": "EUR"}));
        db.exec(&format!(
            "BEGIN; INSERT INTO public.orders (id, status, updated_at) VALUES ({}, 'placed', now()); {} COMMIT;",
            lit(&order),
            insert_sql(MAIN_TABLE, std::slice::from_ref(&placed))
        ))
        .await;
        let paid = row(&order, "OrderPaid", json!({"orderId": order, "paid": true}));
        db.exec(&format!(
            "BEGIN; UPDATE public.orders SET status = 'paid', updated_at = now() WHERE id = {}; {} COMMIT;",
            lit(&order),
            insert_sql(MAIN_TABLE, std::slice::from_ref(&paid))
        ))
        .await;
        rows.extend([placed, paid]);
    }
    // Several events of two aggregates in one transaction.
    let batch: Vec<OutboxRow> =
        (0..6).map(|k| row(&format!("{aggregatetype}-cart-{}", k % 2), "CartChanged", json!({"step": k}))).collect();
    db.exec(&format!("BEGIN; {} COMMIT;", insert_sql(MAIN_TABLE, &batch))).await;
    rows.extend(batch);
    // Insert-then-delete in one transaction: the table stays empty, the event is sent.
    let transient = row(&format!("{aggregatetype}-user-1"), "MailRequested", json!({"to": "a@example.com"}));
    db.exec(&format!(
        "BEGIN; {} DELETE FROM {MAIN_TABLE} WHERE id = {}; COMMIT;",
        insert_sql(MAIN_TABLE, std::slice::from_ref(&transient)),
        lit(&transient.id)
    ))
    .await;
    rows.push(transient);
    // Payloads of many shapes, one autocommitted statement each.
    for (i, payload) in payload_shapes(false).into_iter().enumerate() {
        let r = row(&format!("{aggregatetype}-shape-{i}"), "ShapeTested", payload);
        db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&r))).await;
        rows.push(r);
    }
    // An aggregate id that is not URL-safe: one percent-encoded path segment, the
    // header verbatim.
    let odd = row("customer 42/eu?x=1#y%20", "CustomerMoved", json!({"to": "eu"}));
    db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&odd))).await;
    rows.push(odd);
    // A rolled-back transaction never becomes an event.
    let rolled_back = row(&format!("{aggregatetype}-order-x"), "OrderPlaced", json!({"never": true}));
    db.exec(&format!("BEGIN; {} ROLLBACK;", insert_sql(MAIN_TABLE, std::slice::from_ref(&rolled_back)))).await;
    db.close().await;

    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    assert_each_called_once(&receiver, &rows);
    assert!(receiver.calls_for(&rolled_back.id).is_empty(), "a rolled-back event was executed");
    assert_calls_match_rows(&receiver, &rows);
    // Events of one aggregate are handled in commit order.
    for i in 0..4 {
        let order = format!("{aggregatetype}-order-{i}");
        let seqs: Vec<(usize, String)> = receiver
            .calls()
            .iter()
            .filter(|c| c.header("Outbox-Aggregate-Id") == Some(order.as_str()))
            .map(|c| (c.seq, c.header("Outbox-Event-Type").unwrap_or_default().to_string()))
            .collect();
        let types: Vec<&str> = seqs.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(types, ["OrderPlaced", "OrderPaid"], "order of the events of {order}");
    }
    for r in &rows {
        let rec = od.store_get(&r.id);
        assert_eq!(rec.state, "done", "{rec:?}");
        assert_eq!(rec.attempts, 1, "{rec:?}");
        assert_eq!(rec.topic, topic, "{rec:?}");
        assert_eq!(rec.key.as_deref(), Some(r.aggregateid.as_str()), "{rec:?}");
        assert_eq!(rec.event_type.as_deref(), Some(r.event_type.as_str()), "{rec:?}");
    }
    let paid = st.pg.query(&format!(
        "SELECT count(*) FROM public.orders WHERE id LIKE {} AND status = 'paid'",
        lit(&format!("{aggregatetype}-order-%"))
    ));
    assert_eq!(paid.trim(), "4", "the orders' state changes committed with their events");
    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    eprintln!(
        "rows committed: {}, messages on {topic}: {}, receiver calls: {}",
        rows.len(),
        messages.len(),
        receiver.calls().len()
    );
    delete_main_rows(&st.pg, &aggregatetype);
    st.assert_left_clean().await;
}

/// Kafka Connect is SIGKILLed while 1,000+ rows are being written; after its restart
/// Debezium publishes again what it had published since its last offset flush (same
/// `id` header, new offsets). Each event still reaches the receiver exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_crash_replays_are_suppressed() {
    const ROWS_PER_CYCLE: usize = 1200;
    const PER_TX: usize = 20;
    const PAUSE: Duration = Duration::from_millis(40);
    const KEYS: usize = 50;
    /// Kill cycles until Debezium re-sends something (almost always the first).
    const MAX_CYCLES: usize = 3;

    let st = stack().await;
    let aggregatetype = unique_name("crash");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&st.kafka, &[&topic], &receiver);
    let offsets = st.kafka.offsets(&od.config.group_id, &topic);
    od.start();
    od.wait_for_assignment().await;

    let mut crash = ConnectCrash::default();
    let mut all_rows: Vec<OutboxRow> = Vec::new();
    let mut resent_total = 0;
    for cycle in 1..=MAX_CYCLES {
        let rows: Vec<OutboxRow> = (0..ROWS_PER_CYCLE)
            .map(|i| {
                OutboxRow::new(
                    &aggregatetype,
                    &format!("acct-{}", i % KEYS),
                    "BalanceChanged",
                    json!({"cycle": cycle, "i": i, "delta": i as i64 - 600}),
                )
            })
            .collect();
        let before = st.messages_on(&offsets);
        let progress = Progress::default();
        let writer = tokio::spawn(write_over_time(
            st.pg.clone(),
            MAIN_TABLE.to_string(),
            rows.clone(),
            PER_TX,
            PAUSE,
            progress.clone(),
        ));
        // Kill while rows flow, once Debezium has published some of this cycle's.
        wait_until(format!("cycle {cycle}: a third of the rows written and some published"), HANDLED_TIMEOUT, || {
            progress.load(Ordering::SeqCst) >= ROWS_PER_CYCLE / 3 && st.messages_on(&offsets) > before
        })
        .await;
        let published = st.messages_on(&offsets) - before;
        crash.kill();
        let written_at_kill = progress.load(Ordering::SeqCst);
        join(writer).await;
        let restart = crash.start();
        wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR).await;
        wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
        tokio::time::sleep(SETTLE).await;
        let messages = st.messages_on(&offsets) - before;
        let resent = messages - rows.len() as i64;
        eprintln!(
            "cycle {cycle}: {} rows; SIGKILL of Connect after {written_at_kill} rows were committed and {published} \
             published; Connect back with the connector RUNNING in {restart:.1?}; {messages} messages, \
             {resent} re-sent",
            rows.len()
        );
        assert!(resent >= 0, "fewer messages ({messages}) than rows ({}) yet all were handled?", rows.len());
        all_rows.extend(rows);
        resent_total += resent;
        if resent > 0 {
            break;
        }
    }
    od.assert_alive();
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    let per_id = messages_per_id(&messages);
    let resent_ids = per_id.values().filter(|n| **n > 1).count();
    let duplicates = messages.len() as i64 - all_rows.len() as i64;
    let calls = receiver.calls().len();
    eprintln!(
        "rows written: {}, messages on the topic: {}, duplicates: {duplicates} ({resent_ids} events sent more \
         than once), receiver calls: {calls}",
        all_rows.len(),
        messages.len()
    );
    assert!(
        resent_total > 0 && duplicates > 0,
        "in {MAX_CYCLES} kill cycles Debezium never re-sent an event: the test could not show the suppression"
    );
    for r in &all_rows {
        assert!(per_id.get(&r.id).is_some_and(|n| *n >= 1), "event {} never reached the topic", r.id);
    }
    assert_eq!(per_id.len(), all_rows.len(), "messages with ids that were never written");
    assert_each_called_once(&receiver, &all_rows);
    assert_calls_match_rows(&receiver, &all_rows[..50]);

    let stats = od.store_stats();
    eprintln!("outboxd store stats: {stats}");
    assert_eq!(stats["done"].as_u64(), Some(all_rows.len() as u64), "{stats}");
    assert_eq!(stats["claimed"].as_u64(), Some(0), "{stats}");
    assert_eq!(stats["dead"].as_u64(), Some(0), "{stats}");
    assert_eq!(
        stats["duplicates_suppressed"].as_u64(),
        Some(duplicates as u64),
        "every re-sent message should be counted as a suppressed duplicate: {stats}"
    );
    let resent_row = all_rows.iter().find(|r| per_id[&r.id] > 1).expect("a re-sent event");
    let rec = od.store_get(&resent_row.id);
    assert_eq!(rec.state, "done", "{rec:?}");
    assert_eq!(rec.duplicates as usize, per_id[&resent_row.id] - 1, "{rec:?}");

    delete_main_rows(&st.pg, &aggregatetype);
    st.assert_left_clean().await;
}

/// Rows that exist before a connector with `snapshot.mode=initial` starts are
/// snapshotted and handled. A new connector (no offsets, new slot: what re-registering
/// after lost offsets does) snapshots them again; the re-emitted events reach the
/// topic again and are suppressed, and streaming goes on after the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_reemission_is_suppressed() {
    const EXISTING: usize = 25;
    const LATER: usize = 5;
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table("snap");
    let aggregatetype = unique_name("snapshot");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let qualified = format!("public.{table}");
    let rows: Vec<OutboxRow> = (0..EXISTING)
        .map(|i| {
            OutboxRow::new(&aggregatetype, &format!("item-{}", i % 7), "ItemStocked", json!({"i": i, "qty": i * 3}))
        })
        .collect();
    st.pg.query(&insert_sql(&qualified, &rows));

    let receiver = Receiver::start();
    let mut od = Outboxd::new(&st.kafka, &[&topic], &receiver);
    let offsets = st.kafka.offsets(&od.config.group_id, &topic);
    od.start();
    od.wait_for_assignment().await;

    let config = |name: &str, slot: &str| {
        connector_config(&st.pg, name, &table, &publication, slot, &[("snapshot.mode", "initial")])
    };
    let first = scratch.connector_name("snap1");
    scratch.start_connector(&first, &config(&first, &scratch.sql_name("slot1")), CONNECTOR_TIMEOUT).await;
    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &first).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    assert_eq!(st.messages_on(&offsets), EXISTING as i64, "the first snapshot emits each row once");

    // Snapshot again.
    scratch.remove_connector(&first).await.expect("remove the first connector and its slot");
    let second = scratch.connector_name("snap2");
    scratch.start_connector(&second, &config(&second, &scratch.sql_name("slot2")), CONNECTOR_TIMEOUT).await;
    wait_until("the second snapshot to re-emit every row", HANDLED_TIMEOUT, || {
        st.messages_on(&offsets) >= 2 * EXISTING as i64
    })
    .await;
    // Streaming after the snapshot.
    let later: Vec<OutboxRow> = (0..LATER)
        .map(|i| OutboxRow::new(&aggregatetype, &format!("item-{i}"), "ItemSold", json!({"i": i, "sold": true})))
        .collect();
    st.pg.query(&insert_sql(&qualified, &later));
    let all: Vec<OutboxRow> = rows.iter().chain(&later).cloned().collect();
    wait_all_answered(&mut od, &receiver, &all, HANDLED_TIMEOUT, &st.connect, &second).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    let per_id = messages_per_id(&messages);
    eprintln!(
        "rows: {EXISTING} before the connectors + {LATER} later; messages on the topic: {}; receiver calls: {}",
        messages.len(),
        receiver.calls().len()
    );
    for r in &rows {
        assert_eq!(per_id.get(&r.id), Some(&2), "snapshotted row {} should be on the topic twice", r.id);
    }
    for r in &later {
        assert_eq!(per_id.get(&r.id), Some(&1), "streamed row {} should be on the topic once", r.id);
    }
    assert_eq!(messages.len(), 2 * EXISTING + LATER);
    assert_each_called_once(&receiver, &all);
    assert_calls_match_rows(&receiver, &all);
    for r in &rows {
        let rec = od.store_get(&r.id);
        assert_eq!((rec.state.as_str(), rec.duplicates), ("done", 1), "re-emitted by the snapshot: {rec:?}");
    }
    for r in &later {
        let rec = od.store_get(&r.id);
        assert_eq!((rec.state.as_str(), rec.duplicates), ("done", 0), "{rec:?}");
    }
    let stats = od.store_stats();
    assert_eq!(stats["duplicates_suppressed"].as_u64(), Some(EXISTING as u64), "{stats}");

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}

// ---------------------------------------------------------------- converters

/// One converter variant: its own table, publication, slot and connector
/// (`debezium/connector.json` + `overrides`, everything routed to one fresh topic),
/// a row per payload, and an outboxd with the default handler config.
/// Checks that the receiver gets each payload as JSON, with the right headers, and that
/// `wire` holds for every message as it lies in Kafka (the variant really is in effect).
async fn converter_variant(
    what: &str,
    overrides: &[(&str, &str)],
    payloads: Vec<Value>,
    wire: impl Fn(&Message, &OutboxRow),
) {
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table(what);
    let aggregatetype = unique_name(&format!("conv-{what}"));
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&st.kafka, &[&topic], &receiver);
    let offsets = st.kafka.offsets(&od.config.group_id, &topic);
    od.start();
    od.wait_for_assignment().await;

    let name = scratch.connector_name(what);
    let mut all: Vec<(&str, &str)> =
        vec![("snapshot.mode", "no_data"), ("transforms.outbox.route.topic.replacement", topic.as_str())];
    all.extend_from_slice(overrides);
    let config = connector_config(&st.pg, &name, &table, &publication, &scratch.sql_name("slot"), &all);
    scratch.start_connector(&name, &config, CONNECTOR_TIMEOUT).await;

    let rows: Vec<OutboxRow> = payloads
        .into_iter()
        .enumerate()
        .map(|(i, p)| OutboxRow::new(&aggregatetype, &format!("agg-{}", i % 3), &format!("Shape{i}"), p))
        .collect();
    let qualified = format!("public.{table}");
    let (single, together) = rows.split_at(rows.len() / 2);
    let mut db = st.pg.session();
    for r in single {
        db.exec(&insert_sql(&qualified, std::slice::from_ref(r))).await;
    }
    db.exec(&format!("BEGIN; {} COMMIT;", insert_sql(&qualified, together))).await;
    db.close().await;

    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    assert_eq!(messages.len(), rows.len(), "one message per row");
    let by_id: HashMap<&str, &OutboxRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    for m in &messages {
        let id = json_text(&m.header("id").expect("header id"));
        let row = by_id.get(id.as_str()).unwrap_or_else(|| panic!("message with unknown id {id}: {m:?}"));
        wire(m, row);
    }
    let sample = &messages[0];
    eprintln!(
        "{what}: {} rows; a message as Debezium wrote it: key {:?}, header id {:?}, header eventType {:?}, value {}",
        rows.len(),
        sample.key_text(),
        sample.header("id"),
        sample.header("eventType"),
        shorten(&sample.value_text().unwrap_or_default(), 300)
    );
    assert_each_called_once(&receiver, &rows);
    assert_calls_match_rows(&receiver, &rows);

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn value_json(m: &Message) -> Value {
    parse(&m.value_text().expect("a value"))
}

const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";

/// JsonConverter with schemas for key, value and headers: every part is a
/// `{"schema":…,"payload":…}` envelope, and the jsonb payload is JSON text inside a
/// string (schema `io.debezium.data.Json`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_converter_with_schemas_is_decoded() {
    converter_variant(
        "jsonschemas",
        &[
            ("key.converter", JSON_CONVERTER),
            ("key.converter.schemas.enable", "true"),
            ("value.converter", JSON_CONVERTER),
            ("value.converter.schemas.enable", "true"),
            ("header.converter", JSON_CONVERTER),
            ("header.converter.schemas.enable", "true"),
        ],
        payload_shapes(false),
        |m, row| {
            let v = value_json(m);
            assert_eq!(v["schema"]["name"], "io.debezium.data.Json", "{v}");
            assert_eq!(parse(v["payload"].as_str().expect("payload is JSON text")), row.payload);
            let key = parse(&m.key_text().expect("a key"));
            assert_eq!(key["payload"], row.aggregateid.as_str(), "key envelope {key}");
            let id = parse(&m.header("id").expect("id header"));
            assert_eq!(id["payload"], row.id.as_str(), "id header envelope {id}");
            assert!(id["schema"].is_object(), "{id}");
            assert_eq!(parse(&m.header("eventType").expect("eventType"))["payload"], row.event_type.as_str());
        },
    )
    .await;
}

/// JsonConverter without schemas for key, value and headers: the key and the headers
/// are JSON strings, the jsonb payload is a JSON string holding JSON text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_converter_without_schemas_is_decoded() {
    converter_variant(
        "jsonplain",
        &[
            ("key.converter", JSON_CONVERTER),
            ("key.converter.schemas.enable", "false"),
            ("value.converter", JSON_CONVERTER),
            ("value.converter.schemas.enable", "false"),
            ("header.converter", JSON_CONVERTER),
            ("header.converter.schemas.enable", "false"),
        ],
        payload_shapes(false),
        |m, row| {
            let v = value_json(m);
            assert_eq!(parse(v.as_str().unwrap_or_else(|| panic!("value should be a JSON string: {v}"))), row.payload);
            assert_eq!(parse(&m.key_text().expect("a key")), Value::String(row.aggregateid.clone()));
            assert_eq!(parse(&m.header("id").expect("id header")), Value::String(row.id.clone()));
            assert_eq!(parse(&m.header("eventType").expect("eventType")), Value::String(row.event_type.clone()));
        },
    )
    .await;
}

/// Checks a value written with `table.expand.json.payload=true`: JSON objects that
/// Debezium could turn into a Connect struct arrive as JSON objects (inside a schema
/// envelope when `schemas` is on); the rest (arrays, mixed-type arrays, empty arrays)
/// falls back to JSON text as without expansion. Returns whether it was expanded.
fn expanded_wire(m: &Message, row: &OutboxRow, schemas: bool) -> bool {
    let v = value_json(m);
    let (inner, schema) = if schemas {
        assert!(v["schema"].is_object(), "with schemas the value is an envelope: {v}");
        (v["payload"].clone(), v["schema"].clone())
    } else {
        (v, Value::Null)
    };
    match inner {
        Value::String(text) => {
            assert_eq!(parse(&text), row.payload, "fallback to JSON text");
            if schemas {
                assert_eq!(schema["name"], "io.debezium.data.Json");
            }
            false
        }
        expanded => {
            assert_eq!(expanded, row.payload, "expanded payload");
            if schemas {
                assert_eq!(schema["type"], "struct", "{schema}");
            }
            true
        }
    }
}

/// `transforms.outbox.table.expand.json.payload=true`. The value must then be written
/// by the JsonConverter (here without schemas): with the production StringConverter
/// the expanded payload is a Connect struct and arrives as its `toString()`
/// (`Struct{orderId=o-1,…}`), which is not JSON. Key and headers stay plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expanded_json_payload_is_decoded() {
    let expanded = AtomicUsize::new(0);
    converter_variant(
        "expanded",
        &[
            ("transforms.outbox.table.expand.json.payload", "true"),
            ("value.converter", JSON_CONVERTER),
            ("value.converter.schemas.enable", "false"),
        ],
        payload_shapes(true),
        |m, row| {
            if expanded_wire(m, row, false) {
                expanded.fetch_add(1, Ordering::Relaxed);
            }
            assert_eq!(m.key_text().as_deref(), Some(row.aggregateid.as_str()));
            assert_eq!(m.header("id").as_deref(), Some(row.id.as_str()));
        },
    )
    .await;
    assert!(expanded.load(Ordering::Relaxed) >= 3, "Debezium expanded too few payloads: the variant is not in effect");
}

/// `table.expand.json.payload=true` with the JsonConverter and schemas: an envelope
/// whose schema is a struct inferred from the JSON, and whose payload is the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expanded_json_payload_with_schemas_is_decoded() {
    let expanded = AtomicUsize::new(0);
    converter_variant(
        "expandedschemas",
        &[
            ("transforms.outbox.table.expand.json.payload", "true"),
            ("value.converter", JSON_CONVERTER),
            ("value.converter.schemas.enable", "true"),
        ],
        payload_shapes(true),
        |m, row| {
            if expanded_wire(m, row, true) {
                expanded.fetch_add(1, Ordering::Relaxed);
            }
        },
    )
    .await;
    assert!(expanded.load(Ordering::Relaxed) >= 3, "Debezium expanded too few payloads: the variant is not in effect");
}

// ---------------------------------------------------------------- latency

/// End-to-end latency from the acknowledged PostgreSQL COMMIT to the start of the
/// receiver's HTTP call, over 200 single-row transactions at about 50 per second,
/// through the production connector. Printed, not asserted; split at the moment the
/// broker appended the message (the topic uses `LogAppendTime`): Debezium + Connect
/// before, Kafka + outboxd after. Debezium's `poll.interval.ms` (default 500 ms: how
/// long it sleeps when the WAL or its queue is empty) dominates the first part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_latency_is_reported() {
    const ROWS: usize = 200;
    const PAUSE: Duration = Duration::from_millis(20);
    let st = stack().await;
    let aggregatetype = unique_name("latency");
    let topic = outbox_topic(&aggregatetype);
    // The record timestamp is then the moment the broker appended the message.
    st.kafka.create_topic(&topic, 3, &[("message.timestamp.type", "LogAppendTime")]).await;
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&st.kafka, &[&topic], &receiver);
    let offsets = st.kafka.offsets(&od.config.group_id, &topic);
    od.start();
    od.wait_for_assignment().await;

    let mut db = st.pg.session();
    // Warm-up: the first event of a topic pays for metadata look-ups and connections.
    let warm = OutboxRow::new(&aggregatetype, "warm-up", "WarmUp", json!({"warm": true}));
    db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&warm))).await;
    wait_all_answered(&mut od, &receiver, std::slice::from_ref(&warm), HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR)
        .await;

    let mut rows = Vec::with_capacity(ROWS);
    let mut committed: HashMap<String, SystemTime> = HashMap::new();
    let began = Instant::now();
    for i in 0..ROWS {
        let r = OutboxRow::new(&aggregatetype, &format!("acct-{}", i % 20), "Measured", json!({"i": i}));
        let at = db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&r))).await;
        committed.insert(r.id.clone(), at);
        rows.push(r);
        tokio::time::sleep(PAUSE).await;
    }
    let writing = began.elapsed();
    db.close().await;
    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    od.stop();

    let kafka_ts: HashMap<String, i64> = st
        .kafka
        .read_topic(&topic, TOPIC_READ_TIMEOUT)
        .iter()
        .filter_map(|m| Some((m.header("id")?, m.timestamp_ms?)))
        .collect();
    let (mut total, mut to_kafka, mut from_kafka) = (Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        let call = &receiver.calls_for(&r.id)[0];
        let commit = committed[&r.id];
        total.push(ms_between(commit, call.started));
        if let Some(ts) = kafka_ts.get(&r.id) {
            let ts = SystemTime::UNIX_EPOCH + Duration::from_millis(*ts as u64);
            to_kafka.push(ms_between(commit, ts));
            from_kafka.push(ms_between(ts, call.started));
        }
    }
    eprintln!(
        "latency over {ROWS} single-row transactions written in {writing:.1?} ({:.0}/s):",
        ROWS as f64 / writing.as_secs_f64()
    );
    eprintln!("  commit → receiver call:         {}", describe_ms(total));
    eprintln!("  commit → appended to Kafka:     {}", describe_ms(to_kafka));
    eprintln!("  appended to Kafka → call:       {}", describe_ms(from_kafka));
    assert_each_called_once(&receiver, &rows.iter().chain([&warm]).cloned().collect::<Vec<_>>());

    delete_main_rows(&st.pg, &aggregatetype);
    st.assert_left_clean().await;
}

// ---------------------------------------------------------------- known decoder gaps

/// With the production StringConverter, an application payload that happens to have
/// the members `schema` and `payload` is delivered whole, not taken for a JsonConverter
/// envelope (whose `schema` is a Connect schema object).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_with_schema_and_payload_members_is_delivered_whole() {
    converter_variant(
        "envelopelike",
        &[],
        // (A payload that is exactly a Connect envelope, `{"schema":{"type":…},"payload":…}`,
        // is byte-for-byte what the JsonConverter writes, so it is read as one: see README.)
        vec![json!({"schema": "order.v2", "payload": {"id": 1}}), json!({"schema": null, "note": "x"})],
        |_, _| {},
    )
    .await;
}

/// A jsonb `null` payload (not SQL NULL) through the production StringConverter is the
/// text `null`: it is sent as JSON `null`, unlike a tombstone (no value at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonb_null_payload_is_sent_as_json_null() {
    converter_variant("jsonbnull", &[], vec![json!(null), json!({"ok": 1})], |m, row| {
        if row.payload.is_null() {
            assert_eq!(m.value.as_deref(), Some(&b"null"[..]), "jsonb null is the text null, not a tombstone");
        }
    })
    .await;
}
