//! outboxd embedded as a library (`outboxd::App`), in this process, against the real
//! broker: a closure handles one topic, the config's http handler another.

use crate::harness;

/// The example, compiled into the tests so that CI runs its code (`main` is unused here).
#[allow(dead_code)]
#[path = "../../examples/custom_handler.rs"]
mod custom_handler;

use std::time::Duration;

use harness::{new_event_id, unique_name, Kafka, Outboxd, Receiver, Scenario};
use outboxd::config::Config;
use outboxd::handler::{from_fn, Outcome};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Generous bound for "outboxd handles what it was given".
const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_handler_runs_once_per_event_id_beside_the_configured_ones() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    // The harness's config, run in this process: its http handler for one topic, and an
    // entry for the other, whose kind the program's own handler replaces.
    let Scenario { kafka, topic: http_topic, receiver, od, offsets: http_offsets, producer } =
        Scenario::new("embed-http", 2).await;
    let custom_topic = kafka.create_topic(&unique_name("embed-custom"), 3, &[]).await;
    let toml = format!("{}\n[[handlers]]\ntopics = [{custom_topic:?}]\nkind = \"log\"\n", od.config.to_toml());
    let config = Config::parse(&toml, &|_| None).expect("a valid config");
    let custom_offsets = kafka.offsets(&od.config.group_id, &custom_topic);

    // The example program's own code: examples/custom_handler.rs.
    let seen = custom_handler::Seen::default();
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(custom_handler::run(
        config,
        custom_topic.clone(),
        seen.clone(),
        shutdown.clone().cancelled_owned(),
    ));

    let n = 20;
    let ids: Vec<String> = (0..n).map(|_| new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        producer
            .send_event(&custom_topic, &format!("payment-{}", i % 5), id, Some("PaymentTaken"), &json!({"n": i}))
            .await;
    }
    // Debezium after a connector restart: some events again, same ids, new offsets.
    for (i, id) in ids.iter().enumerate().step_by(3) {
        producer
            .send_event(&custom_topic, &format!("payment-{}", i % 5), id, Some("PaymentTaken"), &json!({"n": i}))
            .await;
    }
    let http_ids: Vec<String> = (0..5).map(|_| new_event_id()).collect();
    for (i, id) in http_ids.iter().enumerate() {
        producer.send_event(&http_topic, &format!("order-{i}"), id, Some("OrderCreated"), &json!({"n": i})).await;
    }

    let all_counted = || ids.iter().all(|id| seen.lock().unwrap().contains_key(id));
    harness::wait_until("the embedded handler to see every event", HANDLED_TIMEOUT, all_counted).await;
    harness::wait_until("the receiver to answer every http event", HANDLED_TIMEOUT, || {
        receiver.count_answered_ok(&http_ids) == http_ids.len()
    })
    .await;
    // Committed to the end: the repeated deliveries were consumed (and suppressed) too.
    harness::wait_until(
        format!("committed offsets to reach the end ({} / {})", custom_offsets.describe(), http_offsets.describe()),
        HANDLED_TIMEOUT,
        || custom_offsets.reached_end() && http_offsets.reached_end(),
    )
    .await;
    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(30), app).await.expect("the app drains and stops");
    ended.expect("the app task").expect("the app ends without an error");

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), n, "only the custom topic's events reach the closure: {seen:?}");
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "event {id} must run exactly once");
    }
    for id in &http_ids {
        assert_eq!(receiver.call_count(id), 1, "the configured handler runs event {id} once");
    }
}

#[tokio::test]
async fn a_handler_for_a_topic_without_a_config_entry_is_refused_at_start() {
    let kafka = Kafka::connect();
    let receiver = Receiver::start();
    let od = Outboxd::new(&kafka, &["embed-known"], &receiver);
    let config = Config::parse(&od.config.to_toml(), &|_| None).expect("a valid config");
    let handler = from_fn(|_| async { Ok(Outcome::new("never")) });
    let e = outboxd::App::new(config).handler("embed-unknown", handler).run(std::future::pending()).await.unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("\"embed-unknown\"") && e.contains("no [[handlers]] entry covers it"), "{e}");
}

/// A program that records metrics itself (its own recorder of the `metrics` crate,
/// or none) runs outboxd without outboxd installing its Prometheus recorder: events
/// are handled, and the admin server leaves `/metrics` to the program (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_program_that_records_metrics_itself_runs_outboxd_without_its_recorder() {
    let Scenario { kafka, topic, receiver, od, .. } = Scenario::new("embed-own-metrics", 1).await;
    let config = Config::parse(&od.config.to_toml(), &|_| None).expect("a valid config");
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(outboxd::App::new(config).own_metrics().run(shutdown.clone().cancelled_owned()));
    let id = new_event_id();
    kafka.producer().send_event(&topic, "order-1", &id, Some("OrderCreated"), &json!({"n": 1})).await;
    harness::wait_until("the receiver to answer the event", HANDLED_TIMEOUT, || receiver.call_count(&id) == 1).await;
    let metrics = reqwest::get(format!("http://{}/metrics", od.admin_address())).await.expect("ask /metrics");
    assert_eq!(metrics.status(), reqwest::StatusCode::NOT_FOUND, "/metrics belongs to the program's recorder");
    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(30), app).await.expect("the app drains and stops");
    ended.expect("the app task").expect("the app ends without an error");
    assert_eq!(receiver.call_count(&id), 1);
}
