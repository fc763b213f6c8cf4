//! outboxd and its schema registry on the real broker: schema ids are checked against
//! the topic with the stack's registry (Apicurio Registry's Confluent API at
//! `OUTBOXD_TEST_REGISTRY`): a value is decoded only with a schema id registered under
//! its topic's subject (`GET /schemas/ids/{id}/versions`); and a registry that refuses
//! our credentials (a stand-in on 127.0.0.1) stalls the partition loudly instead of
//! dead-lettering its events. Needs Kafka and the registry of the local stack; does
//! not stop or start either, and holds the registry's turn while it uses it.

use crate::harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use axum::http::StatusCode;
use axum::Router;
use harness::avro::{framed, schema_registry_toml, Registry, PAYLOAD_SCHEMA};
use harness::receiver::Server;
use harness::{new_event_id, turns, unique_name, Kafka, Outboxd, Receiver, Scenario};
use serde_json::{json, Value};

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_id_registered_only_for_another_topic_is_dead_lettered() {
    // The stack's registry must stay up meanwhile (a pipeline test stops it).
    let _registry_up = turns::REGISTRY.read().await;
    let registry = Registry::connect().await;
    let kafka = Kafka::connect();
    let orders = kafka.create_topic(&unique_name("avro-subject-orders"), 1, &[]).await;
    let payments = kafka.create_topic(&unique_name("avro-subject-payments"), 1, &[]).await;
    let subject = format!("{orders}-value");
    let id = registry.register(&subject, PAYLOAD_SCHEMA).await;

    let receiver = Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&orders, &payments], &receiver);
    od.config.handler_extra = "format = \"avro\"\n".to_owned();
    od.config.retry_extra = schema_registry_toml(registry.url(), "5s");
    let offsets = [kafka.offsets(&od.config.group_id, &orders), kafka.offsets(&od.config.group_id, &payments)];
    od.start();
    od.wait_for_assignment().await;

    let schema = Schema::parse_str(PAYLOAD_SCHEMA).unwrap();
    let doc = json!({"orderId": "o-1"});
    let value = framed(id, &schema, Avro::String(doc.to_string()));
    let (good, foreign) = (new_event_id(), new_event_id());
    let producer = kafka.producer();
    producer.send_raw(&orders, None, Some(b"o-1".as_slice()), &[("id", Some(good.as_bytes()))], Some(&value)).await;
    // The same bytes on another topic: that id is not registered for it.
    producer
        .send_raw(&payments, None, Some(b"p-1".as_slice()), &[("id", Some(foreign.as_bytes()))], Some(&value))
        .await;

    od.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.iter().all(|o| o.reached_end()))
        .await;
    od.stop();
    registry.delete_subject(&subject).await;

    let calls = receiver.calls_for(&good);
    assert_eq!(calls.len(), 1, "the value of the topic the schema is registered for is handled");
    assert_eq!(calls[0].body, doc);
    assert!(receiver.calls_for(&foreign).is_empty(), "a foreign schema id reached the receiver");
    let dead = od.store_list(Some("dead"), 10);
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0].reason.as_deref().unwrap_or_default();
    assert!(reason.contains(&format!("not registered under subject {payments}-value")), "{reason}");
    assert!(reason.contains(&subject), "the reason names the subjects the id has: {reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_refusing_our_credentials_stalls_the_partition_loudly_and_dead_letters_nothing() {
    let lookups = Arc::new(AtomicUsize::new(0));
    let counted = lookups.clone();
    let refusing = Server::start(
        "refusing-registry",
        Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            async { (StatusCode::UNAUTHORIZED, r#"{"error_code":40101,"message":"Unauthorized"}"#) }
        }),
    );
    let mut s = Scenario::new("avro-registry-401", 1).await;
    s.od.config.handler_extra = "format = \"avro\"\n".to_owned();
    s.od.config.retry_extra = schema_registry_toml(&format!("http://reader:s3cret@{}", refusing.addr), "5s");
    s.run().await;
    let Scenario { kafka, topic, receiver, mut od, offsets, .. } = s;

    let schema = Schema::parse_str(PAYLOAD_SCHEMA).unwrap();
    let event = new_event_id();
    let value = framed(7, &schema, Avro::String("{}".into()));
    kafka
        .producer()
        .send_raw(&topic, None, Some(b"o-1".as_slice()), &[("id", Some(event.as_bytes()))], Some(&value))
        .await;

    // First pause 500 ms, then 1 s: three lookups within a few seconds.
    od.wait_until("three refused schema lookups", HANDLED_TIMEOUT, || lookups.load(Ordering::Relaxed) >= 3).await;
    let log = od.log();
    let refused: Vec<&str> =
        log.lines().filter(|l| l.contains("ERROR") && l.contains("401") && l.contains("credentials")).collect();
    assert!(refused.len() >= 2, "every retry logs an error naming the status:\n{log}");
    assert!(!log.contains("s3cret"), "the registry password is in the log:\n{log}");
    let metrics = admin_metrics(&od).await;
    let auth = metrics
        .lines()
        .find(|l| l.starts_with("outboxd_schema_registry_errors_total{") && l.contains(r#"reason="auth""#))
        .unwrap_or_else(|| panic!("no auth sample in\n{metrics}"));
    assert!(auth.rsplit(' ').next().unwrap().parse::<f64>().unwrap() >= 2.0, "{auth}");
    od.stop();

    assert!(receiver.calls_for(&event).is_empty());
    assert!(od.store_list(Some("dead"), 10).is_empty(), "a configuration error dead-lettered the event");
    assert!(!offsets.reached_end(), "the offset moved past an event that was never handled");
}

/// `GET /metrics` of the admin server of a running `od` (its address is in the owner file).
async fn admin_metrics(od: &Outboxd) -> String {
    let owner = od.config.store_path.join("outboxd.owner");
    let text = std::fs::read_to_string(&owner).unwrap_or_else(|e| panic!("read {}: {e}", owner.display()));
    let owner: Value = serde_json::from_str(&text).expect("owner file is JSON");
    let admin = owner["admin"].as_str().unwrap_or_else(|| panic!("no admin address in {text}"));
    let resp = reqwest::get(format!("http://{admin}/metrics")).await.expect("GET /metrics");
    resp.text().await.expect("metrics body")
}
