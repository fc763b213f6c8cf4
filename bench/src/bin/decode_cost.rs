//! Decode cost per event: the same outbox payload as JSON text (String converter),
//! as a JsonConverter envelope, and as Avro (Confluent framing, the schema Debezium's
//! AvroConverter writes for the jsonb payload), through outboxd's own decoders.
//! Interleaved rounds; prints ns/event per format and the ratio to JSON text.
//!
//! ```text
//! cargo run --release -p outboxd-bench --bin decode-cost -- [EVENTS_PER_ROUND] [ROUNDS]
//! ```

use std::hint::black_box;
use std::time::Instant;

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use outboxd::avro::ParsedSchema;
use outboxd::codec::decode_value;

const PAYLOAD_SCHEMA: &str = r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    // ~500 bytes, like the drain scenario's payloads.
    let doc = serde_json::json!({
        "orderId": "order-123456", "customerId": "c-98765", "status": "placed", "currency": "EUR",
        "total": 129.95, "createdAt": "2026-11-29T20:13:08Z",
        "lines": [{"sku": "SKU-0001", "qty": 2, "price": 19.99}, {"sku": "SKU-0002", "qty": 1, "price": 89.97}],
        "shipping": {"name": "A. Customer", "street": "1 Example Road", "city": "Lyon", "zip": "69001", "country": "FR"},
        "note": "leave at the door, ring twice"
    })
    .to_string();
    let text = doc.clone().into_bytes();
    let envelope = serde_json::to_vec(&serde_json::json!({
        "schema": {"type": "string", "optional": true, "name": "io.debezium.data.Json", "version": 1},
        "payload": doc,
    }))
    .unwrap();
    let schema = Schema::parse_str(PAYLOAD_SCHEMA).unwrap();
    let mut avro = vec![0u8, 0, 0, 0, 2];
    avro.extend(apache_avro::to_avro_datum(&schema, Avro::Union(1, Box::new(Avro::String(doc.clone())))).unwrap());
    let parsed = ParsedSchema::parse(2, PAYLOAD_SCHEMA, &[]).unwrap();
    assert_eq!(parsed.decode(&avro).unwrap(), serde_json::from_str::<serde_json::Value>(&doc).unwrap());

    let mut results: [(&str, Vec<f64>); 3] = [("json text", vec![]), ("json envelope", vec![]), ("avro", vec![])];
    for _ in 0..rounds {
        for (i, (_, samples)) in results.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..n {
                match i {
                    0 => drop(black_box(decode_value(Some(black_box(&text))).unwrap())),
                    1 => drop(black_box(decode_value(Some(black_box(&envelope))).unwrap())),
                    _ => drop(black_box(parsed.decode(black_box(&avro)).unwrap())),
                }
            }
            samples.push(start.elapsed().as_nanos() as f64 / n as f64);
        }
    }
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&results[0].1);
    println!("| format | ns/event (median of {rounds}) | min–max | vs json text |");
    println!("|---|---:|---:|---:|");
    for (name, samples) in &results {
        let (lo, hi) = samples.iter().fold((f64::MAX, 0f64), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
        println!("| {name} | {:.0} | {lo:.0}–{hi:.0} | {:.2}× |", median(samples), median(samples) / base);
    }
}
