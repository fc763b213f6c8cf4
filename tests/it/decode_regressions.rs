//! The decoder on hostile input, without Kafka: inputs that once mattered (from the
//! bad-input tests and the `decode` fuzz target in fuzz/), and a bounded property test
//! with random messages built from the shapes Debezium produces and their broken
//! variants. It runs in CI; `cargo +nightly fuzz run decode` explores further.
//!
//! Knobs: `OUTBOXD_DECODE_CASES` (default 20000), `OUTBOXD_DECODE_SEED`.

use outboxd::codec::{decode, decode_text, decode_value, DecodeError, MAX_EVENT_ID_LEN};
use outboxd::config::EventIdSource;
use outboxd::event::{Payload, RawMessage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

fn dec(m: &RawMessage) -> Result<outboxd::event::OutboxEvent, DecodeError> {
    decode(m, &header_id(), "eventType")
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
    assert!(dec(&msg(None, &[("id", Some(b"e1"))], Some(deep_obj.as_bytes()))).is_ok());
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
    assert_eq!(decode_text(deep.as_bytes()), deep);
    let deep_str = "\"".repeat(5_000);
    let _ = decode_text(deep_str.as_bytes());
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
    assert!(dec(&msg(None, &[("id", Some(&exact))], None)).is_ok());
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
fn decode_value_on_edge_cases() {
    assert_eq!(decode_value(None).unwrap(), Payload::Null);
    assert_eq!(decode_value(Some(b"")).unwrap(), Payload::Text(String::new()));
    assert!(decode_value(Some(b"\"\\ud800\"")).is_ok(), "a lone surrogate escape must not panic");
    assert!(decode_value(Some(b"1e999999")).is_ok());
    assert!(decode_value(Some(b"\"{\\\"a\\\":1}\"")).is_ok());
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
        if let Some(k) = &key {
            let _ = decode_text(k);
        }
    }
    eprintln!("random decode: {ok} decoded, {err} rejected");
    assert!(ok > 0 && err > 0, "the generator should produce both valid and invalid messages ({ok} ok, {err} err)");
}
