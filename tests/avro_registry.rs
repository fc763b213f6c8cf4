//! Schema ids checked against the topic, with the stack's schema registry (Apicurio
//! Registry's Confluent API at `OUTBOXD_TEST_REGISTRY`) and the real broker: a value
//! is decoded only with a schema id registered under its topic's subject
//! (`GET /schemas/ids/{id}/versions`). Needs Kafka and the registry of the local
//! stack; does not stop or start either.

mod common;

use std::time::Duration;

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use common::avro::{schema_registry_toml, Registry};
use common::{new_event_id, Kafka, Outboxd, Receiver};
use serde_json::json;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

/// What Debezium's AvroConverter writes for the outbox `payload` (jsonb) column.
const PAYLOAD_SCHEMA: &str = r#"{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}"#;

fn framed(id: u32, schema: &Schema, value: Avro) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend(apache_avro::to_avro_datum(schema, value).expect("encode"));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_id_registered_only_for_another_topic_is_dead_lettered() {
    let registry = Registry::connect().await;
    let kafka = Kafka::connect();
    let orders = kafka.create_topic("avro-subject-orders", 1).await;
    let payments = kafka.create_topic("avro-subject-payments", 1).await;
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
    producer.send_raw(&orders, None, Some(b"o-1".as_slice()), &[("id", good.as_bytes())], Some(&value)).await;
    // The same bytes on another topic: that id is not registered for it.
    producer.send_raw(&payments, None, Some(b"p-1".as_slice()), &[("id", foreign.as_bytes())], Some(&value)).await;

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
