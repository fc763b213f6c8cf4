//! `kind = "postgres"` against the stack's PostgreSQL: each event's statements and its
//! inbox row in one transaction, so a projection has each effect exactly once, through
//! a Debezium-style replay, a delivery the store no longer knows, and SIGKILLs in the
//! middle of its transactions; a constraint violation is dead with its SQLSTATE and
//! leaves nothing behind; a deadlock and a serialization failure are retried.

use std::time::Duration;

use serde_json::json;

use crate::harness::debezium::Pg;
use crate::harness::{self, Kafka, Outboxd, Receiver};

const TIMEOUT: Duration = Duration::from_secs(90);
const KEYS: usize = 10;
const EVENTS: usize = 200;

/// `outboxd store ARGS --json` on the stopped store.
fn store_json(od: &Outboxd, args: &[&str]) -> serde_json::Value {
    od.store_json(args)
}

/// outboxd for a test's postgres handler (added in `extra_toml`, on the topic under test):
/// the harness's own http handler takes a topic nobody writes to. The receiver is that
/// handler's; keep it as long as outboxd runs.
async fn outboxd_beside(kafka: &Kafka) -> (Outboxd, Receiver) {
    let idle = kafka.create_topic(&harness::unique_name("pg-idle"), 1, &[]).await;
    let receiver = Receiver::start();
    let od = Outboxd::new(kafka, &[&idle], &receiver);
    (od, receiver)
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
    let (mut od, _receiver) = outboxd_beside(&kafka).await;
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

    let (mut od, _receiver) = outboxd_beside(&kafka).await;
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

/// A deadlock (40P01) and a serialization failure (40001), each raised by PostgreSQL on
/// an event's first attempt: retried, written once, and never dead. A parameter comes
/// from a header of the message (`header.eventType`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_and_a_serialization_failure_are_retried_and_written_once() {
    let pg = Pg::connect();
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&harness::unique_name("pg-retry"), 1, &[]).await;
    let suffix = topic.replace(['-', '.'], "_");
    let (log, inbox, tries, fail) =
        (format!("log_{suffix}"), format!("inbox_{suffix}"), format!("tries_{suffix}"), format!("fail_{suffix}"));
    // A sequence is not rolled back with the transaction that draws from it: it counts
    // attempts. The first attempt of a `deadlock` event fails as a deadlock victim does,
    // of a `serialization` one as a serializable transaction that lost does.
    pg.query(&format!(
        "CREATE TABLE {log} (key text NOT NULL, kind text NOT NULL, type text);
         CREATE TABLE {inbox} (event_id text PRIMARY KEY);
         CREATE SEQUENCE {tries}_deadlock; CREATE SEQUENCE {tries}_serialization;
         CREATE FUNCTION {fail}(kind text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN
           IF kind = 'deadlock' AND nextval('{tries}_deadlock') = 1 THEN
             RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = 'deadlock_detected';
           END IF;
           IF kind = 'serialization' AND nextval('{tries}_serialization') = 1 THEN
             RAISE EXCEPTION 'could not serialize access (test)' USING ERRCODE = 'serialization_failure';
           END IF;
           RETURN kind;
         END $$;"
    ));
    let (mut od, _receiver) = outboxd_beside(&kafka).await;
    let url = serde_json::to_string(pg.url()).unwrap();
    od.config.extra_toml = format!(
        "\n[[handlers]]\nname = \"log\"\ntopics = [\"{topic}\"]\nkind = \"postgres\"\nurl = {url}\n\
         [[handlers.statements]]\nsql = \"INSERT INTO {log} (key, kind, type) VALUES ($1, {fail}($2), $3)\"\n\
         params = [\"aggregate_id\", \"payload.kind\", \"header.eventType\"]\n[handlers.inbox]\ntable = \"{inbox}\"\n\
         [handlers.retry]\nmax_attempts = 3\ninitial_backoff = \"50ms\"\nmax_backoff = \"100ms\"\n"
    );
    od.start();
    od.wait_for_assignment().await;
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let producer = kafka.producer();
    let ids: Vec<(String, &str)> = ["deadlock", "serialization", "plain"].map(|k| (harness::new_event_id(), k)).into();
    for (id, kind) in &ids {
        producer.send_event(&topic, "order-1", id, Some("OrderPaid"), &json!({"kind": kind})).await;
    }
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    od.stop();
    let rows = pg.query(&format!("SELECT string_agg(kind, ',' ORDER BY kind) FROM {log}"));
    assert_eq!(rows.trim(), "deadlock,plain,serialization", "each written once");
    let types = pg.query(&format!("SELECT string_agg(DISTINCT coalesce(type, 'NULL'), ',') FROM {log}"));
    assert_eq!(types.trim(), "OrderPaid", "header.eventType bound from the message's header");
    for (id, kind) in &ids {
        let record = store_json(&od, &["get", id]);
        let attempts = if *kind == "plain" { 1 } else { 2 };
        assert_eq!(
            (record["state"].as_str(), record["attempts"].as_u64()),
            (Some("done"), Some(attempts)),
            "{kind}: {record}"
        );
    }
    pg.query(&format!(
        "DROP TABLE {log}; DROP TABLE {inbox}; DROP FUNCTION {fail}(text);
         DROP SEQUENCE {tries}_deadlock; DROP SEQUENCE {tries}_serialization;"
    ));
}

/// outboxd SIGKILLed at random moments, in the middle of its transactions, while events
/// arrive and Debezium-style replays send earlier ones again at new offsets: the
/// projection has each event's effect exactly once and the inbox each id once.
///
/// Size knobs: `OUTBOXD_PG_KILL_EVENTS` (default 2000; 10000 is the full size),
/// `OUTBOXD_PG_KILL_KILLS` (default 6). It does not run beside the fault scenarios.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkills_during_the_transactions_and_replays_leave_each_effect_exactly_once() {
    use rand::{Rng, SeedableRng};
    let _load = harness::turns::LOAD.lock().await;
    let events = harness::env_usize("OUTBOXD_PG_KILL_EVENTS", 2000).max(10);
    let kills = harness::env_usize("OUTBOXD_PG_KILL_KILLS", 6);
    let seed = rand::random::<u64>();
    eprintln!("postgres kill loop: events={events} kills={kills} seed={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pg = Pg::connect();
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&harness::unique_name("pg-kill"), 3, &[]).await;
    let suffix = topic.replace(['-', '.'], "_");
    let (projection, inbox) = (format!("proj_{suffix}"), format!("inbox_{suffix}"));
    pg.query(&format!(
        "CREATE TABLE {projection} (key text PRIMARY KEY, n int NOT NULL);
         CREATE TABLE {inbox} (event_id text PRIMARY KEY);"
    ));
    let (mut od, _receiver) = outboxd_beside(&kafka).await;
    // A restarted process gets its partitions back at once.
    od.config.kafka_options.insert("group.instance.id".into(), "pg-kill-loop".into());
    let url = serde_json::to_string(pg.url()).unwrap();
    od.config.extra_toml = format!(
        "\n[[handlers]]\nname = \"projection\"\ntopics = [\"{topic}\"]\nkind = \"postgres\"\nurl = {url}\n\
         [[handlers.statements]]\nsql = \"INSERT INTO {projection} (key, n) VALUES ($1, 1) \
         ON CONFLICT (key) DO UPDATE SET n = {projection}.n + 1\"\nparams = [\"aggregate_id\"]\n\
         [handlers.inbox]\ntable = \"{inbox}\"\n[handlers.retry]\nmax_attempts = 1000\n"
    );
    let keys = (events / 20).max(1);
    let sent: Vec<(String, String)> =
        (0..events).map(|i| (harness::new_event_id(), format!("order-{}", i % keys))).collect();
    // Produced in 20 batches over the kills; after each batch, a random earlier slice is
    // sent again (the same ids at new offsets), as Debezium does after a crash of its own.
    let producing = {
        let (producer, topic, sent) = (kafka.producer(), topic.clone(), sent.clone());
        let replay_seed: u64 = rng.random();
        tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(replay_seed);
            let per_batch = events.div_ceil(20);
            let mut replayed = 0;
            let payload = json!({});
            for (b, batch) in sent.chunks(per_batch).enumerate() {
                let sends =
                    batch.iter().map(|(id, key)| producer.send_event(&topic, key, id, Some("OrderPaid"), &payload));
                futures::future::join_all(sends).await;
                let upto = (b + 1) * per_batch;
                let from = rng.random_range(0..upto.min(events));
                let again = &sent[from..(from + 50).min(upto).min(events)];
                for (id, key) in again {
                    producer.send_event(&topic, key, id, Some("OrderPaid"), &payload).await;
                }
                replayed += again.len();
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            replayed
        })
    };
    for _ in 0..kills {
        od.start();
        let after = Duration::from_millis(rng.random_range(300..=2000));
        tokio::time::sleep(after).await;
        od.assert_alive();
        od.kill();
    }
    od.start();
    od.wait_for_assignment().await;
    let replayed = producing.await.expect("the producer task");
    let count = |sql: &str| pg.query(sql).trim().parse::<i64>().unwrap_or(-1);
    let effects = format!("SELECT coalesce(sum(n), 0) FROM {projection}");
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let timeout = TIMEOUT + Duration::from_millis(20 * events as u64);
    od.wait_until(format!("all {events} events in the projection"), timeout, || count(&effects) >= events as i64).await;
    od.wait_until("committed offsets at the end", timeout, || offsets.reached_end()).await;
    od.stop();
    eprintln!("postgres kill loop: {replayed} events sent again");
    assert_eq!(count(&effects), events as i64, "the projection has an effect twice, or lost one");
    assert_eq!(count(&format!("SELECT count(*) FROM {inbox}")), events as i64, "one inbox row per event");
    let mut per_key = vec![0i64; keys];
    for (_, key) in &sent {
        per_key[key.trim_start_matches("order-").parse::<usize>().unwrap()] += 1;
    }
    let wrong = count(&format!(
        "SELECT count(*) FROM {projection} p JOIN (VALUES {}) AS want(key, n) USING (key) WHERE p.n <> want.n",
        per_key.iter().enumerate().map(|(k, n)| format!("('order-{k}', {n})")).collect::<Vec<_>>().join(",")
    ));
    assert_eq!(wrong, 0, "a key's count in the projection is off");
    let stats = store_json(&od, &["stats"]);
    assert_eq!((stats["done"].as_u64(), stats["dead"].as_u64()), (Some(events as u64), Some(0)), "{stats}");
    pg.query(&format!("DROP TABLE {projection}; DROP TABLE {inbox};"));
}

/// TLS to the receiver's database (`sslmode=require`): the server's certificate is
/// checked. Without the stack's CA it is refused: the events wait for the database (its
/// circuit), none goes dead, nothing is written. With the CA (`tls_ca`) they are written,
/// over TLS connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_databases_certificate_is_checked_before_anything_is_written() {
    let ca = std::env::var("OUTBOXD_TEST_PG_CA").expect("OUTBOXD_TEST_PG_CA (scripts/stack up writes it)");
    let pg = Pg::connect();
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&harness::unique_name("pg-tls"), 1, &[]).await;
    let suffix = topic.replace(['-', '.'], "_");
    let (log, inbox) = (format!("log_{suffix}"), format!("inbox_{suffix}"));
    pg.query(&format!("CREATE TABLE {log} (key text NOT NULL); CREATE TABLE {inbox} (event_id text PRIMARY KEY);"));
    let mut url = url::Url::parse(pg.url()).expect("the stack's PostgreSQL URL");
    let app = format!("outboxd_{suffix}");
    url.query_pairs_mut().append_pair("sslmode", "require").append_pair("application_name", &app);
    let (mut od, _receiver) = outboxd_beside(&kafka).await;
    let handler = |tls_ca: &str| {
        format!(
            "\n[[handlers]]\nname = \"log\"\ntopics = [\"{topic}\"]\nkind = \"postgres\"\nurl = {}\ntimeout = \"2s\"\n{tls_ca}\
             [[handlers.statements]]\nsql = \"INSERT INTO {log} (key) VALUES ($1)\"\nparams = [\"aggregate_id\"]\n\
             [handlers.inbox]\ntable = \"{inbox}\"\n[handlers.circuit]\nprobe_after = \"200ms\"\nprobe_max = \"500ms\"\n",
            serde_json::to_string(url.as_str()).unwrap()
        )
    };
    // The system's CAs only: the stack's certificate is refused.
    od.config.extra_toml = handler("");
    od.start();
    od.wait_for_assignment().await;
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let producer = kafka.producer();
    let ids: Vec<String> = (0..3).map(|_| harness::new_event_id()).collect();
    for id in &ids {
        producer.send_event(&topic, "order-1", id, Some("OrderPaid"), &json!({})).await;
    }
    harness::wait::wait_until("the refused certificate in the log", TIMEOUT, || {
        od.log().contains("certificate verify failed")
    })
    .await;
    od.assert_alive();
    od.stop();
    let count = |sql: &str| pg.query(sql).trim().parse::<i64>().unwrap_or(-1);
    assert_eq!(count(&format!("SELECT count(*) FROM {log}")), 0, "written over an unchecked connection");
    assert_eq!(store_json(&od, &["stats"])["dead"], 0, "the database's refusal is not the event's");

    // With the stack's CA: written once each, over TLS.
    od.config.extra_toml = handler(&format!("tls_ca = {}\n", serde_json::to_string(&ca).unwrap()));
    od.start();
    od.wait_until("every event written", TIMEOUT, || count(&format!("SELECT count(*) FROM {log}")) == 3).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    let over_tls = format!(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE application_name = '{app}' AND ssl"
    );
    let plain = format!(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE application_name = '{app}' AND NOT ssl"
    );
    assert!(count(&over_tls) >= 1, "no TLS connection of outboxd's");
    assert_eq!(count(&plain), 0, "a plain connection of outboxd's");
    od.stop();
    for id in &ids {
        assert_eq!(store_json(&od, &["get", id])["state"], "done");
    }
    pg.query(&format!("DROP TABLE {log}; DROP TABLE {inbox};"));
}
