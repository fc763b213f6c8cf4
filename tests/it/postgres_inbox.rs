//! `kind = "postgres"` against the stack's PostgreSQL: each event's statements and its
//! inbox row in one transaction, so a projection has each effect exactly once, through
//! a Debezium-style replay and through a delivery the store no longer knows; a
//! constraint violation is dead with its SQLSTATE and leaves nothing behind.

use std::time::Duration;

use serde_json::json;

use crate::harness::debezium::Pg;
use crate::harness::{self, Kafka, Outboxd};

const TIMEOUT: Duration = Duration::from_secs(90);
const KEYS: usize = 10;
const EVENTS: usize = 200;

/// `outboxd store ARGS --json` on the stopped store.
fn store_json(od: &Outboxd, args: &[&str]) -> serde_json::Value {
    od.store_json(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_gets_each_effect_exactly_once_through_replays_and_a_forgotten_record() {
    let pg = Pg::connect();
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&harness::unique_name("pg-inbox"), 2, &[]).await;
    let suffix = topic.replace(['-', '.'], "_");
    let (projection, inbox) = (format!("proj_{suffix}"), format!("inbox_{suffix}"));
    pg.query(&format!(
        "CREATE TABLE {projection} (key text PRIMARY KEY, n int NOT NULL, total int NOT NULL CHECK (total >= 0));
         CREATE TABLE {inbox} (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());"
    ));
    // The scenario's own http handler takes a topic nobody writes to; the postgres one takes ours.
    let idle = kafka.create_topic(&harness::unique_name("pg-idle"), 1, &[]).await;
    let receiver = crate::harness::receiver::Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&idle], &receiver);
    let url = serde_json::to_string(pg.url()).unwrap();
    od.config.extra_toml = format!(
        "\n[[handlers]]\nname = \"projection\"\ntopics = [\"{topic}\"]\nkind = \"postgres\"\nurl = {url}\n\
         statements = [{{ sql = \"INSERT INTO {projection} (key, n, total) VALUES ($1, 1, $2::int) \
         ON CONFLICT (key) DO UPDATE SET n = {projection}.n + 1, total = {projection}.total + EXCLUDED.total\", \
         params = [\"aggregate_id\", \"payload.amount\"] }}]\n\
         [handlers.inbox]\ntable = \"{inbox}\"\n"
    );
    od.start();
    od.wait_for_assignment().await;
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let producer = kafka.producer();
    let sent: Vec<(String, String)> =
        (0..EVENTS).map(|i| (harness::new_event_id(), format!("order-{}", i % KEYS))).collect();
    let send_all = || async {
        for (id, key) in &sent {
            producer.send_event(&topic, key, id, Some("OrderPaid"), &json!({"amount": 1})).await;
        }
    };
    send_all().await;
    let count = |sql: &str| pg.query(sql).trim().parse::<i64>().unwrap_or(-1);
    let effects = format!("SELECT coalesce(sum(n), 0) FROM {projection}");
    od.wait_until("every event in the projection", TIMEOUT, || count(&effects) == EVENTS as i64).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;

    // A Debezium-style replay: the same events at new offsets, suppressed by the store.
    send_all().await;
    od.wait_until("committed offsets at the end of the replay", TIMEOUT, || offsets.reached_end()).await;
    // A constraint violation: dead with its SQLSTATE, nothing written (the inbox row rolled back too).
    let refused = harness::new_event_id();
    producer.send_event(&topic, "order-x", &refused, Some("OrderPaid"), &json!({"amount": -5})).await;
    od.wait_until("the refused event's offset", TIMEOUT, || offsets.reached_end()).await;
    od.stop();
    assert_eq!(count(&effects), EVENTS as i64, "a replayed event was written again");
    assert_eq!(count(&format!("SELECT count(*) FROM {inbox}")), EVENTS as i64, "one inbox row per event");
    let dead = store_json(&od, &["get", &refused]);
    assert_eq!(dead["state"], "dead", "{dead}");
    assert!(dead["reason"].as_str().unwrap_or_default().contains("SQLSTATE 23514"), "{dead}");
    assert_eq!(count(&format!("SELECT count(*) FROM {inbox} WHERE event_id = '{refused}'")), 0);

    // The store forgets one (a person's repair), and the event comes again: the receiver's
    // database has its inbox row, so nothing is written twice.
    let (again, key) = &sent[7];
    let said = od.command(&["store", "forget", again, "--reason", "test", "--yes"]);
    assert!(said.status.success(), "{}", String::from_utf8_lossy(&said.stderr));
    od.start();
    od.wait_for_assignment().await;
    producer.send_event(&topic, key, again, Some("OrderPaid"), &json!({"amount": 1})).await;
    od.wait_until("the forgotten event's offset", TIMEOUT, || offsets.reached_end()).await;
    od.stop();
    assert_eq!(count(&effects), EVENTS as i64, "the forgotten event was written again");
    let record = store_json(&od, &["get", again]);
    assert_eq!(record["state"], "done", "{record}");
    assert!(record["outcome"].as_str().unwrap_or_default().contains("inbox row"), "{record}");
    pg.query(&format!("DROP TABLE {projection}; DROP TABLE {inbox};"));
}
