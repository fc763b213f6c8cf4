//! Avro values in the Confluent wire format, decoded with schemas from local
//! `<id>.avsc` files (installations without a registry), on the real broker.
//! The registry path runs end to end with Debezium in the `avro` module.

use crate::harness;

use std::time::Duration;

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use harness::avro::{frame_header, framed, PAYLOAD_SCHEMA};
use harness::{new_event_id, Outboxd, Scenario};
use outboxd::avro::MAX_DEPTH;
use serde_json::json;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes `schema` as `<id>.avsc` into a new directory that outboxd reads its schemas
/// from, with the handler's `format`; the directory lives as long as the returned value.
fn local_schema(od: &mut Outboxd, format: &str, id: u32, schema: &str) -> tempfile::TempDir {
    let schemas = tempfile::tempdir().unwrap();
    std::fs::write(schemas.path().join(format!("{id}.avsc")), schema).unwrap();
    od.config.handler_extra = format!(
        "format = \"{format}\"\n\n[schema_registry]\nschemas_dir = {}\n",
        serde_json::to_string(schemas.path().to_str().unwrap()).unwrap()
    );
    schemas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_values_from_local_schemas_reach_the_receiver_as_json() {
    let mut s = Scenario::new("avro-local", 1).await;
    let _schemas = local_schema(&mut s.od, "auto", 42, PAYLOAD_SCHEMA);
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let schema = Schema::parse_str(PAYLOAD_SCHEMA).unwrap();
    let good = new_event_id();
    let doc = json!({"orderId": "o-1", "total": 42.5, "lines": [{"sku": "a", "qty": 2}]});
    let value = framed(42, &schema, Avro::String(doc.to_string()));
    producer
        .send_raw(
            &topic,
            None,
            Some(b"o-1".as_slice()),
            &[("id", Some(good.as_bytes())), ("eventType", Some(b"OrderPlaced"))],
            Some(&value),
        )
        .await;
    // An unknown schema id cannot heal: dead-lettered with the reason, the partition moves on.
    let unknown = new_event_id();
    let value = framed(99, &schema, Avro::String("{}".into()));
    producer.send_raw(&topic, None, Some(b"o-2".as_slice()), &[("id", Some(unknown.as_bytes()))], Some(&value)).await;
    // A plain JSON event after them still flows (format = "auto").
    let plain = new_event_id();
    producer.send_event(&topic, "o-3", &plain, Some("OrderPlaced"), &json!({"plain": true})).await;

    od.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.stop();

    let calls = receiver.calls_for(&good);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body, doc, "the receiver gets the document, not the Avro string");
    assert_eq!(calls[0].header("content-type"), Some("application/json"));
    assert_eq!(receiver.calls_for(&plain).len(), 1);
    assert!(receiver.calls_for(&unknown).is_empty());
    let dead = od.store_list(Some("dead"), 10);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason.as_deref().unwrap_or_default().contains("schema id 99"), "{dead:?}");
}

/// A linked list: `{"v": 1, "next": {"v": 2, "next": …}}`.
const NODE: &str =
    r#"{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}"#;

/// A `Node` datum of `n` nodes, framed with schema id `id`.
fn linked_list(id: u32, n: usize) -> Vec<u8> {
    let mut out = frame_header(id);
    for i in 1..=n {
        out.extend(apache_avro::to_avro_datum(&Schema::Int, Avro::Int(i as i32)).expect("encode"));
        out.push(if i < n { 2 } else { 0 }); // union branch: Node, or null at the end
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nesting_up_to_the_bound_is_handled_and_deeper_is_dead_lettered_without_a_crash() {
    let mut s = Scenario::new("avro-deep", 1).await;
    let _schemas = local_schema(&mut s.od, "avro", 5, NODE);
    // Both deep messages share a key: each is dead-lettered on its own (`hold` would hold the second).
    s.od.config.handler_extra = format!("on_dead = \"continue\"\n{}", s.od.config.handler_extra);
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let (at_bound, deeper, endless) = (new_event_id(), new_event_id(), new_event_id());
    for (id, nodes) in [(&at_bound, MAX_DEPTH), (&deeper, MAX_DEPTH + 1), (&endless, 200_000)] {
        let value = linked_list(5, nodes);
        producer.send_raw(&topic, None, Some(b"k".as_slice()), &[("id", Some(id.as_bytes()))], Some(&value)).await;
    }
    od.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.assert_alive();
    od.stop();

    let calls = receiver.calls_for(&at_bound);
    assert_eq!(calls.len(), 1);
    let mut node = &calls[0].body;
    for i in 1..=MAX_DEPTH {
        assert_eq!(node["v"], json!(i));
        node = &node["next"];
    }
    assert!(node.is_null());
    assert!(receiver.calls_for(&deeper).is_empty() && receiver.calls_for(&endless).is_empty());
    let dead = od.store_list(Some("dead"), 10);
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead.iter().all(|r| r.reason.as_deref().unwrap_or_default().contains("nests deeper than")), "{dead:?}");
}
