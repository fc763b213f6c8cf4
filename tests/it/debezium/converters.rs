//! The shapes Debezium's converters give an outbox row (JsonConverter with and without
//! schemas, expanded payloads, payloads that look like an envelope, a jsonb null), each
//! decoded into the row's payload.

use super::*;

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
    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic).await;

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
