//! End-to-end tests of the Avro pipeline: PostgreSQL outbox table → Debezium (outbox
//! EventRouter) on Kafka Connect with Confluent's `AvroConverter` → Kafka (Confluent wire
//! format: byte 0x00, a 4-byte big-endian schema id, the Avro datum) → outboxd, which
//! looks the schema up in the schema registry → HTTP receiver, which gets the decoded
//! value as JSON (for the outbox `payload` column: the JSON document itself, as in the
//! JSON pipeline).
//!
//! They need the whole local stack with its schema registry (`scripts/stack up`: Kafka,
//! PostgreSQL, Kafka Connect with the AvroConverter on its plugin path, and Apicurio
//! Registry, whose Confluent API is `OUTBOXD_TEST_REGISTRY`), and fail, saying so,
//! without it. `registry_outage_makes_events_wait_then_flow` stops and starts the
//! registry with `scripts/stack`, so it needs the stack of this work tree.
//!
//! Like the Debezium tests, the tests run one at a time ([`turns::CONNECT`], shared with
//! them) and take the stack's turn ([`StackTurn`]) from other test processes: they add
//! connectors to the one Connect worker and stop the shared registry (holding
//! [`turns::REGISTRY`] while it is down). Each uses its own table, publication, slot,
//! connector, topic (so its own registry subject), consumer group and store, and leaves
//! Connect with `outbox-connector` RUNNING, the registry running, and nothing of its own.
//!
//! What the AvroConverter writes for an outbox row (seen on this stack): the value schema
//! is `["null", {"type": "string", "connect.version": 1, "connect.name":
//! "io.debezium.data.Json"}]` (the jsonb column as JSON text, optional), the datum union
//! branch 1 and the JSON text; with the AvroConverter for keys too, the key is the
//! schema `"string"` and the aggregate id. Headers stay plain text
//! (SimpleHeaderConverter).

use crate::harness;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use harness::avro::{
    assert_connect_has_avro_converter, avro_converter_overrides, avro_optional_string, avro_plain_string,
    confluent_frame, is_debezium_json_string, schema_registry_toml, Registry, RegistryOutage,
};
use harness::debezium::{
    assert_connector_alive, assert_each_called_once, connector_config, insert_sql, outbox_topic, shorten,
    sweep_leftovers, wait_all_answered, wait_committed_to_end, Connect, OutboxRow, Pg, Scratch, StackTurn,
    MAIN_CONNECTOR,
};
use harness::{turns, unique_name, wait_for, Kafka, Message, Outboxd, Receiver, Scenario};
use serde_json::{json, Value};

mod registry_outage;

/// Bound for "every event reached the receiver" (Debezium → Kafka → outboxd).
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound for a connector to be RUNNING and streaming.
const CONNECTOR_TIMEOUT: Duration = Duration::from_secs(60);
const TOPIC_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// After everything was handled, how long late (duplicate) calls get to show up.
const SETTLE: Duration = Duration::from_millis(1500);
/// outboxd's bound for one registry request.
const REGISTRY_TIMEOUT: &str = "5s";

/// The stack, checked, and this test's turn.
struct Stack {
    kafka: Kafka,
    pg: Pg,
    connect: Connect,
    registry: Registry,
    _process_turn: StackTurn,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

async fn stack() -> Stack {
    // One test at a time: they add connectors to the one Connect worker and stop the
    // registry.
    let turn = turns::CONNECT.lock().await;
    let process_turn = StackTurn::take(Duration::from_secs(300)).await;
    let pg = Pg::connect();
    let connect = Connect::connect().await;
    assert_connect_has_avro_converter(&connect).await;
    let registry = Registry::connect().await;
    let kafka = Kafka::connect();
    sweep_leftovers(&pg, &connect).await;
    Stack { kafka, pg, connect, registry, _process_turn: process_turn, _turn: turn }
}

impl Stack {
    /// What every test leaves: Connect up with the main connector RUNNING, the registry
    /// answering, and no connector or replication slot of this test process.
    async fn assert_left_clean(&self) {
        self.connect.wait_running(MAIN_CONNECTOR, CONNECTOR_TIMEOUT).await;
        Registry::connect().await;
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

    /// A scenario on `topic` (which the test created, named as Debezium routes) whose
    /// outboxd knows the registry, started and assigned; `handler_extra` goes into its
    /// handler (e.g. `format = "avro"`).
    async fn running_outboxd(&self, topic: &str, handler_extra: &str) -> Scenario {
        let mut s = Scenario::on(self.kafka.clone(), topic.to_owned());
        s.od.config.handler_extra = handler_extra.to_string();
        // `[schema_registry]` is a top-level table: it may follow `[handlers.retry]`,
        // which the harness writes last.
        s.od.config.retry_extra = schema_registry_toml(self.registry.url(), REGISTRY_TIMEOUT);
        s.run().await;
        s
    }

    /// `debezium/connector.json` capturing `table` through `publication` and `slot`,
    /// routing every event to `topic`, values written by the AvroConverter (keys too with
    /// `avro_keys`), plus `extra`.
    fn avro_connector(
        &self,
        name: &str,
        (table, publication): (&str, &str),
        slot: &str,
        topic: &str,
        avro_keys: bool,
        extra: &[(&str, &str)],
    ) -> Value {
        let avro = avro_converter_overrides(self.registry.url(), avro_keys);
        let mut all: Vec<(&str, &str)> =
            vec![("snapshot.mode", "no_data"), ("transforms.outbox.route.topic.replacement", topic)];
        all.extend(avro.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        all.extend_from_slice(extra);
        connector_config(&self.pg, name, table, publication, slot, &all)
    }
}

/// Waits until `topic` holds at least `n` messages; fails at once when `connector`
/// FAILED.
async fn wait_messages(
    offsets: &harness::OffsetReader,
    n: i64,
    connect: &Connect,
    connector: &str,
    timeout: Duration,
) -> i64 {
    wait_for(format!("{} to hold {n} messages", offsets.topic), timeout, async || {
        let have: i64 = offsets.end().values().sum();
        if have >= n {
            return Ok(have);
        }
        assert_connector_alive(connect, connector, &format!("{have} of {n} messages were on {}", offsets.topic)).await;
        Err(format!("{have} messages"))
    })
    .await
}

/// The receiver's call for each row carries what the row says: the payload as JSON (the
/// decoded Avro value, not the framed bytes), the event id as idempotency key, the type
/// and the aggregate id.
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
            "the body of event {} (type {}) must be the row's payload as JSON (the decoded Avro value)",
            row.id, row.event_type
        );
        assert_eq!(call.path, format!("/events/{}/{}", row.aggregateid, row.id), "{call:?}");
    }
}

/// Checks one message as the AvroConverter wrote it for `row`: Confluent framing, a value
/// schema the registry knows (a string named `io.debezium.data.Json`, optional), and a
/// datum holding the payload's JSON text. With `avro_keys` the key is framed too (schema
/// `"string"`), else plain text. Returns (value schema id, key schema id).
async fn check_wire(registry: &Registry, m: &Message, row: &OutboxRow, avro_keys: bool) -> (u32, Option<u32>) {
    let value = m.value.as_deref().unwrap_or_else(|| panic!("event {}: a tombstone", row.id));
    let (value_id, datum) = confluent_frame(value)
        .unwrap_or_else(|| panic!("event {}: value not in the Confluent wire format: {:02x?}", row.id, value));
    let text = avro_optional_string(datum)
        .unwrap_or_else(|e| panic!("event {}: value datum is not a [null, string] union: {e}", row.id))
        .unwrap_or_else(|| panic!("event {}: null payload", row.id));
    let decoded: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("payload text is not JSON ({e}): {text}"));
    assert_eq!(decoded, row.payload, "event {}: the JSON text inside the Avro datum", row.id);
    let schema = registry.avro_schema(value_id).await;
    assert!(is_debezium_json_string(&schema), "value schema {value_id}: {schema}");
    let key = m.key.as_deref().unwrap_or_else(|| panic!("event {}: no key", row.id));
    let key_id = if avro_keys {
        let (key_id, datum) = confluent_frame(key).unwrap_or_else(|| panic!("key not framed: {key:02x?}"));
        assert_eq!(avro_plain_string(datum).as_deref(), Ok(row.aggregateid.as_str()), "key datum");
        assert_eq!(registry.avro_schema(key_id).await, json!("string"), "key schema {key_id}");
        Some(key_id)
    } else {
        assert_eq!(m.key_text().as_deref(), Some(row.aggregateid.as_str()), "plain-text key");
        None
    };
    assert_eq!(m.header("id").as_deref(), Some(row.id.as_str()), "header id stays plain text");
    assert_eq!(m.header("eventType").as_deref(), Some(row.event_type.as_str()));
    (value_id, key_id)
}

/// Payloads of several shapes (compared as JSON: jsonb re-serialises them), JSON scalars
/// included: the schema name `io.debezium.data.Json` says the string is JSON text.
fn payload_shapes() -> Vec<Value> {
    vec![
        json!({"orderId": "o-1", "total": 42.5, "currency": "EUR",
               "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}),
        json!({"customer": {"id": 7, "tags": ["vip", "eu"], "address": {"city": "Zürich", "zip": "8001"}}}),
        json!({"text": "quote \" backslash \\ apostrophe ' tab \t newline \n emoji ✓ 🚀 nul-ish \u{1}"}),
        json!({}),
        json!([1, "two", {"three": 3}]),
        json!({"big": 9007199254740993u64, "neg": -17, "small": 0.001, "flag": false}),
        json!({"n": 1, "nothing": null, "list": [null, 1]}),
        json!({"huge": 1.5e300, "tiny": 1e-300}),
        json!(42),
        json!("just text"),
        json!(true),
    ]
}

/// Writes `rows` into `table`: the first half one autocommitted INSERT each, the rest in
/// one transaction.
async fn write_rows(pg: &Pg, table: &str, rows: &[OutboxRow]) {
    let qualified = format!("public.{table}");
    let (single, together) = rows.split_at(rows.len() / 2);
    let mut db = pg.session();
    for r in single {
        db.exec(&insert_sql(&qualified, std::slice::from_ref(r))).await;
    }
    if !together.is_empty() {
        db.exec(&format!("BEGIN; {} COMMIT;", insert_sql(&qualified, together))).await;
    }
    db.close().await;
}

/// Rows of all [`payload_shapes`] for `aggregatetype` (aggregate ids `agg-0..2`).
fn shape_rows(aggregatetype: &str, prefix: &str) -> Vec<OutboxRow> {
    payload_shapes()
        .into_iter()
        .enumerate()
        .map(|(i, p)| OutboxRow::new(aggregatetype, &format!("agg-{}", i % 3), &format!("{prefix}{i}"), p))
        .collect()
}

// ---------------------------------------------------------------- the tests

/// The Confluent framing helpers of the harness read what the AvroConverter wrote on
/// the local stack (no stack needed).
#[test]
fn wire_format_helpers_decode_converter_output() {
    use harness::avro::avro_long;
    let key = [0, 0, 0, 0, 2, 0x0e, b'o', b'r', b'd', b'e', b'r', b'-', b'1'];
    let (id, datum) = confluent_frame(&key).expect("framed");
    assert_eq!((id, avro_plain_string(datum).as_deref()), (2, Ok("order-1")));
    let mut value = vec![0, 0, 0, 0, 4, 0x02, 0x04];
    value.extend_from_slice(b"42");
    let (id, datum) = confluent_frame(&value).expect("framed");
    assert_eq!((id, avro_optional_string(datum)), (4, Ok(Some("42".to_string()))));
    assert_eq!(avro_optional_string(&[0]), Ok(None));
    assert!(confluent_frame(b"{\"a\":1}").is_none());
    assert_eq!(avro_long(&[0x80, 0x01]).map(|(v, _)| v), Ok(64));
    assert_eq!(avro_long(&[0x03]).map(|(v, _)| v), Ok(-2));
    assert!(is_debezium_json_string(&json!(["null", {"type": "string", "connect.version": 1,
        "connect.name": "io.debezium.data.Json"}])));
    assert!(!is_debezium_json_string(&json!("string")));
}

/// Rows written in PostgreSQL and streamed by a connector whose values are written by
/// Confluent's AvroConverter each reach the receiver once, with the same JSON payload as
/// in the JSON pipeline, the right Idempotency-Key, event type and aggregate id. The
/// handler runs with the defaults (`format = "auto"` recognises the framing, `body =
/// "json"`). The messages really are Avro: Confluent framing and a schema the registry
/// serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_pipeline_rows_become_side_effects() {
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table("avro");
    let aggregatetype = unique_name("avro-rows");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic, "").await;

    let name = scratch.connector_name("avro");
    let config = st.avro_connector(&name, (&table, &publication), &scratch.sql_name("slot"), &topic, false, &[]);
    scratch.start_connector(&name, &config, CONNECTOR_TIMEOUT).await;
    let rows = shape_rows(&aggregatetype, "Shape");
    write_rows(&st.pg, &table, &rows).await;

    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    assert_eq!(messages.len(), rows.len(), "one message per row");
    let by_id: HashMap<&str, &OutboxRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut schema_ids = HashSet::new();
    for m in &messages {
        let id = m.header("id").expect("header id");
        let row = by_id.get(id.as_str()).unwrap_or_else(|| panic!("message with unknown id {id}: {m:?}"));
        schema_ids.insert(check_wire(&st.registry, m, row, false).await.0);
    }
    assert_eq!(schema_ids.len(), 1, "one value schema for all rows: {schema_ids:?}");
    let schema_id = *schema_ids.iter().next().unwrap();
    let subject = format!("{topic}-value");
    let latest = st.registry.latest(&subject).await.expect("GET latest").expect("subject registered");
    eprintln!(
        "avro: {} rows; value schema id {schema_id}: {}; subject {subject} latest {latest}; a value as written: {:02x?}",
        rows.len(),
        st.registry.avro_schema(schema_id).await,
        &messages[0].value.as_deref().unwrap_or_default()[..messages[0].value.as_ref().map_or(0, |v| v.len().min(40))]
    );
    assert_each_called_once(&receiver, &rows);
    assert_calls_match_rows(&receiver, &rows);
    for r in &rows {
        let rec = od.store_get(&r.id);
        assert_eq!((rec.state.as_str(), rec.attempts), ("done", 1), "{rec:?}");
        assert_eq!(rec.key.as_deref(), Some(r.aggregateid.as_str()), "{rec:?}");
        assert_eq!(rec.event_type.as_deref(), Some(r.event_type.as_str()), "{rec:?}");
    }

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}

/// Keys written by the AvroConverter too (a common production setting: both converters
/// Avro). The aggregate id is then a framed Avro string; outboxd must decode it like the
/// value, or per-key ordering, `{aggregate_id}` and `Outbox-Aggregate-Id` get the raw
/// framed bytes. (Beyond the handler's value `format`: this pins the key down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_keys_are_decoded_too() {
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table("avrokeys");
    let aggregatetype = unique_name("avro-keys");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let Scenario { receiver, mut od, offsets, .. } =
        st.running_outboxd(&topic, "format = \"auto\"\nbody = \"json\"\n").await;

    let name = scratch.connector_name("avrokeys");
    let config = st.avro_connector(&name, (&table, &publication), &scratch.sql_name("slot"), &topic, true, &[]);
    scratch.start_connector(&name, &config, CONNECTOR_TIMEOUT).await;
    let rows: Vec<OutboxRow> = (0..6)
        .map(|i| OutboxRow::new(&aggregatetype, &format!("cart-{}", i % 2), "CartChanged", json!({"step": i})))
        .collect();
    write_rows(&st.pg, &table, &rows).await;

    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    assert_eq!(messages.len(), rows.len(), "one message per row");
    let by_id: HashMap<&str, &OutboxRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    for m in &messages {
        let id = m.header("id").expect("header id");
        check_wire(&st.registry, m, by_id[id.as_str()], true).await;
    }
    eprintln!("avro keys: a key as written: {:02x?}", messages[0].key.as_deref().unwrap_or_default());
    assert_each_called_once(&receiver, &rows);
    assert_calls_match_rows(&receiver, &rows);
    // Events of one aggregate in commit order.
    for cart in ["cart-0", "cart-1"] {
        let steps: Vec<Value> = receiver
            .calls()
            .iter()
            .filter(|c| c.header("Outbox-Aggregate-Id") == Some(cart))
            .map(|c| c.body["step"].clone())
            .collect();
        let expected: Vec<Value> =
            rows.iter().filter(|r| r.aggregateid == cart).map(|r| r.payload["step"].clone()).collect();
        assert_eq!(steps, expected, "order of the events of {cart}");
    }

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}

/// A redelivery through the Avro pipeline: rows that exist before a connector with
/// `snapshot.mode=initial` starts are snapshotted and handled; a new connector (new slot,
/// no offsets: what re-registering after lost offsets does) snapshots them again. The
/// re-emitted messages (same `id` header, new offsets, same schema id) reach the topic
/// and are suppressed: no second call. Streaming goes on after the snapshot. The handler
/// says `format = "avro"` explicitly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_duplicates_are_suppressed() {
    const EXISTING: usize = 20;
    const LATER: usize = 5;
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table("avrodup");
    let aggregatetype = unique_name("avro-dup");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let rows: Vec<OutboxRow> = (0..EXISTING)
        .map(|i| {
            OutboxRow::new(&aggregatetype, &format!("item-{}", i % 7), "ItemStocked", json!({"i": i, "qty": i * 3}))
        })
        .collect();
    st.pg.query(&insert_sql(&format!("public.{table}"), &rows));

    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic, "format = \"avro\"\n").await;

    let config = |name: &str, slot: &str| {
        st.avro_connector(name, (&table, &publication), slot, &topic, false, &[("snapshot.mode", "initial")])
    };
    let first = scratch.connector_name("snap1");
    scratch.start_connector(&first, &config(&first, &scratch.sql_name("slot1")), CONNECTOR_TIMEOUT).await;
    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &first).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    assert_eq!(offsets.end().values().sum::<i64>(), EXISTING as i64, "the first snapshot emits each row once");

    // Snapshot again: every row is redelivered.
    scratch.remove_connector(&first).await.expect("remove the first connector and its slot");
    let second = scratch.connector_name("snap2");
    scratch.start_connector(&second, &config(&second, &scratch.sql_name("slot2")), CONNECTOR_TIMEOUT).await;
    wait_messages(&offsets, 2 * EXISTING as i64, &st.connect, &second, HANDLED_TIMEOUT).await;
    let later: Vec<OutboxRow> = (0..LATER)
        .map(|i| OutboxRow::new(&aggregatetype, &format!("item-{i}"), "ItemSold", json!({"i": i, "sold": true})))
        .collect();
    write_rows(&st.pg, &table, &later).await;
    let all: Vec<OutboxRow> = rows.iter().chain(&later).cloned().collect();
    wait_all_answered(&mut od, &receiver, &all, HANDLED_TIMEOUT, &st.connect, &second).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    let mut per_id: HashMap<String, usize> = HashMap::new();
    let by_id: HashMap<&str, &OutboxRow> = all.iter().map(|r| (r.id.as_str(), r)).collect();
    for m in &messages {
        let id = m.header("id").expect("header id");
        check_wire(&st.registry, m, by_id[id.as_str()], false).await;
        *per_id.entry(id).or_default() += 1;
    }
    eprintln!(
        "avro duplicates: rows {EXISTING} before the connectors + {LATER} later; messages on the topic: {}; \
         receiver calls: {}",
        messages.len(),
        receiver.calls().len()
    );
    for r in &rows {
        assert_eq!(per_id.get(&r.id), Some(&2), "snapshotted row {} should be on the topic twice", r.id);
    }
    for r in &later {
        assert_eq!(per_id.get(&r.id), Some(&1), "streamed row {} should be on the topic once", r.id);
    }
    assert_each_called_once(&receiver, &all);
    assert_calls_match_rows(&receiver, &all);
    for r in &rows {
        let rec = od.store_get(&r.id);
        assert_eq!(rec.state, "done", "re-emitted by the snapshot: {rec:?}");
    }
    let stats = od.store_stats();
    assert_eq!(stats["duplicates_suppressed"].as_u64(), Some(EXISTING as u64), "{stats}");

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}
