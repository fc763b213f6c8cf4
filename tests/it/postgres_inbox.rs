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
    let scraped = crate::harness::metrics::try_scrape(&od).await.expect("metrics");
    let by_inbox = crate::harness::metrics::sample(
        &scraped,
        "outboxd_duplicates_suppressed_total",
        &[("topic", &topic), ("cause", "receiver_inbox")],
    );
    assert_eq!(by_inbox, 1.0, "counted as a duplicate the receiver's database suppressed");
    od.stop();
    assert_eq!(count(&effects), EVENTS as i64, "the forgotten event was written again");
    let record = store_json(&od, &["get", again]);
    assert_eq!(record["state"], "done", "{record}");
    assert!(record["outcome"].as_str().unwrap_or_default().contains("inbox row"), "{record}");
    pg.query(&format!("DROP TABLE {projection}; DROP TABLE {inbox};"));
}

/// A TCP forwarder to PostgreSQL that can go away (its listener closed and every
/// connection through it cut) and come back on the same port: a receiver database
/// that restarts, as outboxd sees it.
struct Gate {
    addr: std::net::SocketAddr,
    target: std::net::SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Gate {
    async fn to(target: std::net::SocketAddr) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the gate");
        let addr = listener.local_addr().expect("gate address");
        let mut gate = Gate { addr, target, task: None };
        gate.serve(listener);
        gate
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let target = self.target;
        self.task = Some(tokio::spawn(async move {
            // Owned here: dropped with this task, which cuts every connection.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
    }

    fn close(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    async fn open(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.expect("bind the gate again");
        self.serve(listener);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_database_that_goes_away_costs_no_dead_event_and_keeps_each_keys_order() {
    const KEYS: usize = 6;
    let pg = Pg::connect();
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&harness::unique_name("pg-away"), 2, &[]).await;
    let suffix = topic.replace(['-', '.'], "_");
    let (log, inbox) = (format!("log_{suffix}"), format!("inbox_{suffix}"));
    pg.query(&format!(
        "CREATE TABLE {log} (id bigserial PRIMARY KEY, key text NOT NULL, seq int NOT NULL);
         CREATE TABLE {inbox} (event_id text PRIMARY KEY);"
    ));
    let url = url::Url::parse(pg.url()).expect("the stack's PostgreSQL URL");
    let target = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432));
    let mut gate = Gate::to(target.parse().expect("a socket address")).await;
    let mut through = url.clone();
    through.set_port(Some(gate.addr.port())).expect("a port");

    let idle = kafka.create_topic(&harness::unique_name("pg-idle"), 1, &[]).await;
    let receiver = crate::harness::receiver::Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&idle], &receiver);
    let through = serde_json::to_string(through.as_str()).unwrap();
    od.config.extra_toml = format!(
        "\n[[handlers]]\nname = \"log\"\ntopics = [\"{topic}\"]\nkind = \"postgres\"\nurl = {through}\ntimeout = \"2s\"\n\
         [[handlers.statements]]\nsql = \"INSERT INTO {log} (key, seq) VALUES ($1, $2::int)\"\n\
         params = [\"aggregate_id\", \"payload.seq\"]\n[handlers.inbox]\ntable = \"{inbox}\"\n\
         [handlers.circuit]\nprobe_after = \"500ms\"\nprobe_max = \"2s\"\n"
    );
    od.start();
    od.wait_for_assignment().await;
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let producer = kafka.producer();
    let count = |sql: &str| pg.query(sql).trim().parse::<i64>().unwrap_or(-1);
    let rows = format!("SELECT count(*) FROM {log}");
    let mut seq = [0usize; KEYS];
    let mut sent = 0;
    let mut send = |n: usize| {
        let batch: Vec<(String, String, usize)> = (0..n)
            .map(|i| {
                let k = (sent + i) % KEYS;
                seq[k] += 1;
                (harness::new_event_id(), format!("order-{k}"), seq[k])
            })
            .collect();
        sent += n;
        batch
    };
    for (id, key, s) in send(12) {
        producer.send_event(&topic, &key, &id, Some("OrderPaid"), &json!({"seq": s})).await;
    }
    od.wait_until("the first events written", TIMEOUT, || count(&rows) == 12).await;

    // The database goes away while events come: they wait for it, none goes dead.
    gate.close();
    for (id, key, s) in send(48) {
        producer.send_event(&topic, &key, &id, Some("OrderPaid"), &json!({"seq": s})).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let stats: serde_json::Value =
        serde_json::from_slice(&od.command(&["store", "stats", "--json"]).stdout).expect("store stats --json");
    assert_eq!(stats["dead"], 0, "an event went dead while the database was away: {stats}");
    assert_eq!(count(&rows), 12);

    // It comes back: every event written once, each key's in order.
    gate.open().await;
    od.wait_until("every event written", TIMEOUT, || count(&rows) == sent as i64).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    od.stop();
    assert_eq!(count(&format!("SELECT count(*) FROM {inbox}")), sent as i64);
    for (k, last) in seq.iter().enumerate() {
        let order =
            pg.query(&format!("SELECT string_agg(seq::text, ',' ORDER BY id) FROM {log} WHERE key = 'order-{k}'"));
        let want: Vec<String> = (1..=*last).map(|s| s.to_string()).collect();
        assert_eq!(order.trim(), want.join(","), "order-{k} out of order");
    }
    assert_eq!(store_json(&od, &["stats"])["dead"], 0);
    pg.query(&format!("DROP TABLE {log}; DROP TABLE {inbox};"));
}
