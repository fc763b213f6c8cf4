//! Fuzzes Avro decoding: any bytes after the Confluent framing, against a few
//! fixed writer schemas (among them a recursive one), must decode to JSON or an
//! `AvroError::Datum`, never panic, overflow the stack or allocate without bound.
//!
//! Run from the repository root: `cargo +nightly fuzz run -s none avro`
//! (`-s none`: see decode.rs). Inputs that found a problem belong in the unit
//! tests of src/avro/.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use outboxd::avro::{framing, AvroError, ParsedSchema, MAX_DEPTH};

/// Writer schemas; a schema's id is its index.
const SCHEMAS: &[&str] = &[
    // What Debezium's AvroConverter writes for the outbox `payload` column.
    r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#,
    // A linked list: a recursive schema lets the input nest as deep as it likes.
    r#"{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}"#,
    // A tree of maps and arrays of itself.
    r#"{"type":"record","name":"Tree","namespace":"t","fields":[
        {"name":"label","type":"string"},
        {"name":"kids","type":{"type":"array","items":"Tree"}},
        {"name":"named","type":{"type":"map","values":["null","t.Tree"]}}]}"#,
    // Every primitive and logical type the JSON rendering knows.
    r#"{"type":"record","name":"All","namespace":"shop","fields":[
        {"name":"i","type":"int"},{"name":"l","type":"long"},{"name":"f","type":"float"},
        {"name":"d","type":"double"},{"name":"b","type":"boolean"},{"name":"s","type":"string"},
        {"name":"raw","type":"bytes"},
        {"name":"color","type":{"type":"enum","name":"Color","symbols":["RED","GREEN"]}},
        {"name":"fx","type":{"type":"fixed","name":"Four","size":4}},
        {"name":"day","type":{"type":"int","logicalType":"date"}},
        {"name":"ms","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"us","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"ns","type":{"type":"long","logicalType":"timestamp-nanos"}},
        {"name":"local","type":{"type":"long","logicalType":"local-timestamp-micros"}},
        {"name":"tm","type":{"type":"int","logicalType":"time-millis"}},
        {"name":"tu","type":{"type":"long","logicalType":"time-micros"}},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
        {"name":"fprice","type":{"type":"fixed","name":"Money","size":8,"logicalType":"decimal","precision":18,"scale":4}},
        {"name":"id","type":{"type":"string","logicalType":"uuid"}},
        {"name":"dur","type":{"type":"fixed","name":"Dur","size":12,"logicalType":"duration"}},
        {"name":"meta","type":{"type":"string","connect.name":"io.debezium.data.Json"}},
        {"name":"again","type":["null","Color","Four"]}]}"#,
    // Collections of items that take no bytes.
    r#"{"type":"array","items":{"type":"map","values":"null"}}"#,
];

fn schemas() -> &'static [ParsedSchema] {
    static PARSED: OnceLock<Vec<ParsedSchema>> = OnceLock::new();
    PARSED.get_or_init(|| {
        SCHEMAS.iter().enumerate().map(|(id, text)| ParsedSchema::parse(id as u32, text, &[]).expect(text)).collect()
    })
}

fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(fields) => 1 + fields.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the schema; the rest is the datum after the framing.
    let Some((&pick, datum)) = data.split_first() else { return };
    let id = u32::from(pick) % SCHEMAS.len() as u32;
    let mut framed = vec![0u8];
    framed.extend_from_slice(&id.to_be_bytes());
    framed.extend_from_slice(datum);
    assert_eq!(framing(&framed), Some(id));
    match schemas()[id as usize].decode(&framed) {
        Ok(json) => {
            // Debezium JSON strings (schemas 0 and 3) are parsed by serde_json, which has
            // its own (deeper) bound.
            if !matches!(id, 0 | 3) {
                assert!(depth(&json) <= MAX_DEPTH, "decoded deeper than MAX_DEPTH");
            }
            serde_json::to_vec(&json).expect("decoded JSON serialises");
        }
        Err(e) => assert!(matches!(e, AvroError::Datum { .. }), "unexpected error for a datum: {e:?}"),
    }
});
