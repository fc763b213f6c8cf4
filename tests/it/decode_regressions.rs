//! The decoder on hostile input, without Kafka: inputs that once mattered (from the
//! bad-input tests and the `decode` fuzz target in fuzz/), and a bounded property test
//! with random messages built from the shapes Debezium produces and their broken
//! variants. It runs in CI; `cargo +nightly fuzz run decode` explores further.
//!
//! Knobs: `OUTBOXD_DECODE_CASES` (default 20000), `OUTBOXD_DECODE_SEED`.

use outboxd::avro::{AvroError, Part};
use outboxd::codec::{DecodeError, Decoder, Layout, MAX_EVENT_ID_LEN};
use outboxd::config::{Body, EventIdSource, Format};
use outboxd::event::{OutboxEvent, Payload, RawMessage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

fn msg(key: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)], value: Option<&[u8]>) -> RawMessage {
    RawMessage {
        topic: "outbox.event.t".into(),
        partition: 0,
        offset: 0,
        key: key.map(<[u8]>::to_vec),
        value: value.map(<[u8]>::to_vec),
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.map(<[u8]>::to_vec))).collect(),
        timestamp_ms: None,
    }
}

fn header_id() -> EventIdSource {
    EventIdSource::Header("id".into())
}

/// Through the one decoder, as a handler entry with `layout` reads it. No registry:
/// a JSON message never awaits, an Avro-framed one is an error.
fn decode_as(m: &RawMessage, layout: &Layout) -> Result<OutboxEvent, DecodeError> {
    futures::executor::block_on(Decoder::default().decode(m, layout))
}

fn decode(m: &RawMessage, source: &EventIdSource, event_type_header: &str) -> Result<OutboxEvent, DecodeError> {
    let layout =
        Layout { event_id: source.clone(), event_type_header: event_type_header.to_owned(), ..Layout::default() };
    decode_as(m, &layout)
}

fn dec(m: &RawMessage) -> Result<OutboxEvent, DecodeError> {
    decode(m, &header_id(), "eventType")
}

/// The decoded payload of a message with id `e` and this value.
fn payload_of(value: Option<&[u8]>) -> Payload {
    dec(&msg(None, &[("id", Some(b"e"))], value)).expect("decodes").payload
}

/// The aggregate id a key decodes to.
fn key_of(key: &[u8]) -> Option<String> {
    dec(&msg(Some(key), &[("id", Some(b"e"))], None)).expect("decodes").aggregate_id
}

/// The promises a decoded event keeps, whatever the input.
fn check_promises(m: &RawMessage, source: &EventIdSource) {
    let first = decode(m, source, "eventType");
    let again = decode(m, source, "eventType");
    match (&first, &again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.id, b.id, "decoding is deterministic");
            assert_eq!(a.payload, b.payload);
            assert!(!a.id.is_empty(), "empty id decoded from {m:?}");
            assert!(a.id.len() <= MAX_EVENT_ID_LEN, "id over the limit decoded from {m:?}");
            let _ = a.payload.to_body();
            serde_json::to_string(&a.payload).expect("every payload renders as JSON");
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b);
            assert!(!a.to_string().trim().is_empty(), "a decode error must say why");
        }
        _ => panic!("decoding the same message twice gave different results: {first:?} / {again:?}"),
    }
}

// ------------------------------------------------------------------ regressions

#[test]
fn json_nested_ten_thousand_deep_is_text_not_a_crash() {
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let ev = dec(&msg(Some(b"k"), &[("id", Some(b"e1"))], Some(deep.as_bytes()))).expect("decodes");
    assert!(matches!(ev.payload, Payload::Text(_)), "{:?}", ev.payload);
    let deep_obj = "{\"a\":".repeat(10_000) + "1" + &"}".repeat(10_000);
    let ev = dec(&msg(None, &[("id", Some(b"e1"))], Some(deep_obj.as_bytes()))).expect("decodes");
    assert_eq!(ev.id, "e1");
    assert_eq!(ev.aggregate_id, None);
    assert_eq!(ev.payload, Payload::Text(deep_obj));
}

#[test]
fn debezium_json_string_nested_too_deep_is_a_decode_error() {
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let v = serde_json::json!({"schema": {"type": "string", "name": "io.debezium.data.Json"}, "payload": deep});
    let e = dec(&msg(None, &[("id", Some(b"e"))], Some(v.to_string().as_bytes()))).unwrap_err();
    assert!(matches!(e, DecodeError::InvalidEmbeddedJson(_)), "{e:?}");
}

#[test]
fn deeply_nested_key_and_header_are_plain_text() {
    let deep = "{".repeat(5_000);
    assert_eq!(key_of(deep.as_bytes()).as_deref(), Some(deep.as_str()));
    let deep_str = "\"".repeat(5_000);
    assert_eq!(key_of(deep_str.as_bytes()).as_deref(), Some(deep_str.as_str()));
    let ev = dec(&msg(Some(deep.as_bytes()), &[("id", Some(deep.as_bytes()[..100].as_ref()))], None)).unwrap();
    assert_eq!(ev.id, "{".repeat(100));
}

#[test]
fn bad_ids_are_errors_with_reasons() {
    type Headers<'a> = Vec<(&'a str, Option<&'a [u8]>)>;
    let cases: Vec<(Headers, DecodeError)> = vec![
        (vec![], DecodeError::MissingIdHeader("id".into())),
        (vec![("id", None)], DecodeError::EmptyId),
        (vec![("id", Some(b""))], DecodeError::EmptyId),
        (vec![("id", Some(b"   "))], DecodeError::EmptyId),
        (vec![("id", Some(b"\"\""))], DecodeError::EmptyId),
        (vec![("id", Some(b"a")), ("id", Some(b"b"))], DecodeError::ConflictingIdHeaders("id".into(), 2)),
        (vec![("id", Some(b"a")), ("id", None)], DecodeError::ConflictingIdHeaders("id".into(), 2)),
        (vec![("id", Some(&[0xff, 0xfe]))], DecodeError::IdNotUtf8),
    ];
    for (headers, expected) in cases {
        let e = dec(&msg(Some(b"k"), &headers, Some(b"{}"))).unwrap_err();
        assert_eq!(e, expected, "headers {headers:?}");
    }
    let long = vec![b'x'; MAX_EVENT_ID_LEN + 1];
    assert_eq!(
        dec(&msg(None, &[("id", Some(&long))], None)).unwrap_err(),
        DecodeError::IdTooLong(MAX_EVENT_ID_LEN + 1)
    );
    let exact = vec![b'x'; MAX_EVENT_ID_LEN];
    assert_eq!(dec(&msg(None, &[("id", Some(&exact))], None)).unwrap().id, "x".repeat(MAX_EVENT_ID_LEN));
    // A JSON-quoted id whose unquoted text is long enough is measured after unquoting.
    let quoted = format!("\"{}\"", "y".repeat(MAX_EVENT_ID_LEN));
    assert_eq!(dec(&msg(None, &[("id", Some(quoted.as_bytes()))], None)).unwrap().id.len(), MAX_EVENT_ID_LEN);
}

#[test]
fn ids_of_other_json_types_become_text() {
    for (raw, id) in [
        (&b"12345"[..], "12345"),
        (br#"{"schema":{"type":"int64"},"payload":42}"#, "42"),
        (br#"{"schema":{"type":"boolean"},"payload":true}"#, "true"),
        (br#"{"not":"an id"}"#, r#"{"not":"an id"}"#),
        (b"[1,2]", "[1,2]"),
    ] {
        assert_eq!(dec(&msg(None, &[("id", Some(raw))], None)).unwrap().id, id, "{}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn binary_keys_values_and_event_types_do_not_fail() {
    let garbage: Vec<u8> = (0..=255u8).rev().cycle().take(4096).collect();
    let ev =
        dec(&msg(Some(&[0xc3, 0x28, 0xff]), &[("id", Some(b"e")), ("eventType", Some(&[0, 0xff, 1]))], Some(&garbage)))
            .unwrap();
    assert_eq!(ev.payload, Payload::Bytes(garbage));
    assert_eq!(ev.aggregate_id.as_deref(), Some("\u{fffd}(\u{fffd}"));
    assert!(ev.event_type.is_some());
    // A null header value for eventType is no event type.
    let ev = dec(&msg(None, &[("id", Some(b"e")), ("eventType", None)], None)).unwrap();
    assert_eq!(ev.event_type, None);
}

#[test]
fn ten_megabyte_value_decodes() {
    let big = vec![b'a'; 10 * 1024 * 1024];
    let ev = dec(&msg(None, &[("id", Some(b"e"))], Some(&big))).unwrap();
    assert!(matches!(&ev.payload, Payload::Text(t) if t.len() == big.len()));
}

#[test]
fn field_ids_on_hostile_values() {
    let src = EventIdSource::Field("after.id".into());
    for v in [
        &b"null"[..],
        b"[]",
        b"{\"after\":null}",
        b"{\"after\":{\"id\":null}}",
        b"{\"after\":{\"id\":\"\"}}",
        b"{\"after\":{\"id\":[1]}}",
        b"{\"after\":{\"id\":1e400}}",
        b"\xff\xfe",
        b"",
    ] {
        check_promises(&msg(None, &[], Some(v)), &src);
        assert!(decode(&msg(None, &[], Some(v)), &src, "eventType").is_err(), "{}", String::from_utf8_lossy(v));
    }
    let ev = decode(&msg(None, &[], Some(b"{\"after\":{\"id\":-0.5}}")), &src, "eventType").unwrap();
    assert_eq!(ev.id, "-0.5");
}

#[test]
fn values_on_edge_cases() {
    assert_eq!(payload_of(None), Payload::Null);
    assert_eq!(payload_of(Some(b"")), Payload::Text(String::new()));
    // A lone surrogate escape is not JSON serde_json accepts: it stays text, and does not panic.
    assert_eq!(payload_of(Some(b"\"\\ud800\"")), Payload::Text("\"\\ud800\"".to_owned()));
    assert_eq!(payload_of(Some(b"1e999999")), Payload::Text("1e999999".to_owned()));
    assert_eq!(payload_of(Some(b"\"{\\\"a\\\":1}\"")), Payload::Json(json!({"a": 1}).into()));
}

#[test]
fn a_debezium_message_decodes_to_every_field() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let value = br#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{\"total\":10}"}"#;
    let mut m = msg(
        Some(br#""order-7""#),
        &[("id", Some(b"5f0c")), ("eventType", Some(b"OrderCreated")), ("traceparent", Some(tp.as_bytes()))],
        Some(value),
    );
    m.partition = 3;
    m.offset = 41;
    m.timestamp_ms = Some(1_700_000_000_000);
    let ev = dec(&m).unwrap();
    assert_eq!(ev.id, "5f0c");
    assert_eq!(ev.aggregate_id.as_deref(), Some("order-7"));
    assert_eq!(ev.event_type.as_deref(), Some("OrderCreated"));
    assert_eq!(ev.payload, Payload::Json(json!({"total": 10}).into()));
    assert_eq!(ev.traceparent.as_deref(), Some(tp));
    assert_eq!(ev.timestamp_ms, Some(1_700_000_000_000));
    assert_eq!((ev.position.topic.as_str(), ev.position.partition, ev.position.offset), ("outbox.event.t", 3, 41));
}

#[test]
fn the_layout_chooses_format_event_type_header_and_body() {
    let m = msg(Some(b"k"), &[("id", Some(b"e")), ("type", Some(b"Shipped"))], Some(br#"{"a":1}"#));
    let raw = Layout { format: Format::Raw, event_type_header: "type".into(), ..Layout::default() };
    let ev = decode_as(&m, &raw).unwrap();
    assert_eq!(ev.payload, Payload::Bytes(br#"{"a":1}"#.to_vec()));
    assert_eq!(ev.event_type.as_deref(), Some("Shipped"));
    // body = "raw": decoded as JSON (an id field can be read), sent as the original bytes.
    let body_raw = Layout { event_id: EventIdSource::Field("a".into()), body: Body::Raw, ..Layout::default() };
    let ev = decode_as(&m, &body_raw).unwrap();
    assert_eq!(ev.id, "1");
    assert_eq!(ev.payload, Payload::Bytes(br#"{"a":1}"#.to_vec()));
    assert_eq!(ev.event_type, None, "eventType is not the configured header here");
}

#[test]
fn avro_without_its_framing_or_without_a_registry_is_dead_not_waiting() {
    let avro = Layout { format: Format::Avro, ..Layout::default() };
    let e = decode_as(&msg(None, &[("id", Some(b"e"))], Some(b"{}")), &avro).unwrap_err();
    assert_eq!(e, DecodeError::NotAvro);
    assert!(!e.is_transient());
    let framed = [0u8, 0, 0, 0, 7, 2, b'a'];
    let e = dec(&msg(None, &[("id", Some(b"e"))], Some(&framed))).unwrap_err();
    assert_eq!(e, DecodeError::Avro { part: Part::Value, error: AvroError::NoRegistry(7) });
    assert!(!e.is_transient());
    let e = dec(&msg(Some(&framed), &[("id", Some(b"e"))], Some(b"{}"))).unwrap_err();
    assert_eq!(e, DecodeError::Avro { part: Part::Key, error: AvroError::NoRegistry(7) });
    assert!(e.to_string().starts_with("key: "), "{e}");
    // With format = "json" a framed key is only text.
    let json_fmt = Layout { format: Format::Json, ..Layout::default() };
    let ev = decode_as(&msg(Some(&framed), &[("id", Some(b"e"))], None), &json_fmt).unwrap();
    assert_eq!(ev.aggregate_id.as_deref(), Some("\0\0\0\0\u{7}\u{2}a"));
}

// ------------------------------------------------------------------ property test

/// Pieces the generator glues together: Debezium's shapes and broken variants.
const FRAGMENTS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    ",",
    ":",
    "null",
    "true",
    "1e999",
    "-0",
    "\"payload\"",
    "\"schema\"",
    "{\"type\":\"string\",\"name\":\"io.debezium.data.Json\"}",
    "{\"type\":\"struct\"}",
    "\"{\\\"a\\\":1}\"",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "\u{feff}",
    " ",
    "\r\n",
    "after",
    "id",
    "é",
    "\u{10ffff}",
];

fn random_bytes(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
        1 => {
            // A JSON envelope, sometimes well-formed.
            let inner: String = (0..rng.random_range(0..8)).map(|_| FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]).collect();
            let schema = FRAGMENTS[rng.random_range(0..FRAGMENTS.len())];
            format!("{{\"schema\":{schema},\"payload\":{inner}}}").into_bytes()
        }
        2 => {
            let d = rng.random_range(0..3000);
            let open = if rng.random_bool(0.5) { "[" } else { "{\"a\":" };
            let close = if open == "[" { "]" } else { "}" };
            (open.repeat(d) + if rng.random_bool(0.3) { "" } else { "0" } + &close.repeat(d)).into_bytes()
        }
        3 => serde_json::to_vec(&serde_json::json!({
            "schema": {"type": "string", "name": "io.debezium.data.Json"},
            "payload": (0..rng.random_range(0..10)).map(|_| FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]).collect::<String>(),
        }))
        .unwrap(),
        4 => (0..rng.random_range(0..12)).map(|_| FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]).collect::<String>().into_bytes(),
        _ => {
            let mut v: Vec<u8> = (0..rng.random_range(0..12))
                .map(|_| FRAGMENTS[rng.random_range(0..FRAGMENTS.len())])
                .collect::<String>()
                .into_bytes();
            if !v.is_empty() {
                let at = rng.random_range(0..v.len());
                v[at] = rng.random();
            }
            v
        }
    }
}

fn maybe(rng: &mut StdRng) -> Option<Vec<u8>> {
    rng.random_bool(0.9).then(|| random_bytes(rng))
}

#[test]
fn random_messages_never_panic_and_keep_the_promises() {
    let cases = std::env::var("OUTBOXD_DECODE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000usize);
    let seed =
        std::env::var("OUTBOXD_DECODE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("random decode: {cases} cases, seed {seed} (OUTBOXD_DECODE_SEED replays)");
    let mut rng = StdRng::seed_from_u64(seed);
    let sources = [
        EventIdSource::Header("id".into()),
        EventIdSource::Field("after.id".into()),
        EventIdSource::Field("id".into()),
    ];
    let (mut ok, mut err) = (0usize, 0usize);
    for _ in 0..cases {
        let mut headers = Vec::new();
        if rng.random_bool(0.5) {
            // A well-formed id (as text, JSON-quoted or enveloped), so that many messages decode.
            let token: String = (0..rng.random_range(1..40)).map(|_| rng.random_range(b'a'..=b'z') as char).collect();
            let id = match rng.random_range(0..3) {
                0 => token,
                1 => format!("\"{token}\""),
                _ => format!("{{\"schema\":{{\"type\":\"string\"}},\"payload\":\"{token}\"}}"),
            };
            headers.push(("id", Some(id.into_bytes())));
        }
        for _ in 0..rng.random_range(0..3) {
            let name = match rng.random_range(0..4) {
                0 | 1 => "id",
                2 => "eventType",
                _ => "other",
            };
            headers.push((name, maybe(&mut rng)));
        }
        let h: Vec<(&str, Option<&[u8]>)> = headers.iter().map(|(k, v)| (*k, v.as_deref())).collect();
        let key = maybe(&mut rng);
        let value = maybe(&mut rng);
        let m = msg(key.as_deref(), &h, value.as_deref());
        let source = &sources[rng.random_range(0..sources.len())];
        let outcome = std::panic::catch_unwind(|| check_promises(&m, source));
        if let Err(panic) = outcome {
            panic!("decode broke on {m:?} with {source:?} (seed {seed}): {panic:?}");
        }
        if decode(&m, source, "eventType").is_ok() {
            ok += 1;
        } else {
            err += 1;
        }
    }
    eprintln!("random decode: {ok} decoded, {err} rejected");
    assert!(ok > 0 && err > 0, "the generator should produce both valid and invalid messages ({ok} ok, {err} err)");
}
