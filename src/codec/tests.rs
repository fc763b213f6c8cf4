use serde_json::{json, Value};

use super::*;

/// Through the one decoder, without a registry (JSON never awaits).
fn decode(msg: &RawMessage, id_source: &EventIdSource, event_type_header: &str) -> Result<OutboxEvent, DecodeError> {
    let layout =
        Layout { event_id: id_source.clone(), event_type_header: event_type_header.to_owned(), ..Layout::default() };
    futures::executor::block_on(Decoder::default().decode(msg, &layout))
}

fn msg(value: Option<&[u8]>, headers: &[(&str, &[u8])]) -> RawMessage {
    RawMessage {
        topic: "outbox.event.order".into(),
        partition: 0,
        offset: 7,
        key: Some(b"order-1".to_vec()),
        value: value.map(<[u8]>::to_vec),
        headers: headers.iter().map(|(k, v)| (k.to_string(), Some(v.to_vec()))).collect(),
        timestamp_ms: None,
    }
}

fn header_id() -> EventIdSource {
    EventIdSource::Header("id".into())
}

fn payload_of(value: &str) -> Payload {
    decode(&msg(Some(value.as_bytes()), &[("id", b"e-1")]), &header_id(), "eventType").unwrap().payload
}

#[test]
fn string_converter_json_text() {
    assert_eq!(payload_of(r#"{"total": 10}"#), Payload::Json(json!({"total": 10}).into()));
}

#[test]
fn json_converter_schema_envelope_with_debezium_json_string() {
    let v = r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"total\": 10}"}"#;
    assert_eq!(payload_of(v), Payload::Json(json!({"total": 10}).into()));
}

#[test]
fn json_converter_without_schemas_gives_json_string() {
    assert_eq!(payload_of(r#""{\"total\": 10}""#), Payload::Json(json!({"total": 10}).into()));
}

#[test]
fn expanded_json_payload_object() {
    let v = r#"{"schema":{"type":"struct","fields":[]},"payload":{"total":10}}"#;
    assert_eq!(payload_of(v), Payload::Json(json!({"total": 10}).into()));
    assert_eq!(payload_of(r#"{"total":10,"items":[1,2]}"#), Payload::Json(json!({"total": 10, "items": [1, 2]}).into()));
}

#[test]
fn plain_text_and_raw_bytes_and_null() {
    assert_eq!(payload_of("hello world"), Payload::Text("hello world".into()));
    let bytes = decode(&msg(Some(&[0xff, 0x00, 0xfe]), &[("id", b"e")]), &header_id(), "eventType").unwrap();
    assert_eq!(bytes.payload, Payload::Bytes(vec![0xff, 0x00, 0xfe]));
    let null = decode(&msg(None, &[("id", b"e")]), &header_id(), "eventType").unwrap();
    assert_eq!(null.payload, Payload::Null);
    assert_eq!(payload_of(r#"{"schema":{"type":"string"},"payload":null}"#), Payload::Json(Value::Null.into()));
    assert_eq!(payload_of("null"), Payload::Json(Value::Null.into()));
}

#[test]
fn payload_shaped_like_an_envelope_stays_whole() {
    let v = r#"{"schema":"order.v2","payload":{"id":1}}"#;
    assert_eq!(payload_of(v), Payload::Json(json!({"schema": "order.v2", "payload": {"id": 1}}).into()));
}

#[test]
fn broken_debezium_json_is_an_error() {
    let v = r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{not json"}"#;
    let e = decode(&msg(Some(v.as_bytes()), &[("id", b"e")]), &header_id(), "eventType").unwrap_err();
    assert!(matches!(e, DecodeError::InvalidEmbeddedJson(_)));
}

#[test]
fn id_header_text_json_and_envelope() {
    for raw in [&b"5f0c"[..], br#""5f0c""#, br#"{"schema":{"type":"string"},"payload":"5f0c"}"#] {
        let ev = decode(&msg(Some(b"{}"), &[("id", raw), ("eventType", b"OrderCreated")]), &header_id(), "eventType")
            .unwrap();
        assert_eq!(ev.id, "5f0c");
        assert_eq!(ev.event_type.as_deref(), Some("OrderCreated"));
        assert_eq!(ev.aggregate_id.as_deref(), Some("order-1"));
    }
}

#[test]
fn json_quoted_and_enveloped_keys_are_unwrapped() {
    let mut m = msg(Some(b"{}"), &[("id", b"e")]);
    m.key = Some(br#""order-9""#.to_vec());
    assert_eq!(decode(&m, &header_id(), "eventType").unwrap().aggregate_id.as_deref(), Some("order-9"));
    m.key = Some(br#"{"schema":{"type":"string"},"payload":"order-9"}"#.to_vec());
    assert_eq!(decode(&m, &header_id(), "eventType").unwrap().aggregate_id.as_deref(), Some("order-9"));
    m.key = Some(vec![0xff, b'a']);
    assert_eq!(decode(&m, &header_id(), "eventType").unwrap().aggregate_id.as_deref(), Some("\u{fffd}a"));
}

#[test]
fn missing_empty_conflicting_or_huge_ids_are_errors() {
    let e = |headers: &[(&str, &[u8])]| decode(&msg(Some(b"{}"), headers), &header_id(), "eventType").unwrap_err();
    assert_eq!(e(&[]), DecodeError::MissingIdHeader("id".into()));
    assert_eq!(e(&[("id", b"")]), DecodeError::EmptyId);
    assert_eq!(e(&[("id", b"a"), ("id", b"b")]), DecodeError::ConflictingIdHeaders("id".into(), 2));
    assert_eq!(e(&[("id", &[0xff])]), DecodeError::IdNotUtf8);
    let long = vec![b'x'; MAX_EVENT_ID_LEN + 1];
    assert_eq!(e(&[("id", &long)]), DecodeError::IdTooLong(MAX_EVENT_ID_LEN + 1));
    // The same id twice is harmless.
    assert!(decode(&msg(Some(b"{}"), &[("id", b"a"), ("id", b"a")]), &header_id(), "eventType").is_ok());
}

#[test]
fn id_from_raw_debezium_envelope_field() {
    let src = EventIdSource::Field("after.id".into());
    let v = r#"{"schema":{"type":"struct"},"payload":{"before":null,"after":{"id":"u-1","payload":"{}"},"op":"c"}}"#;
    assert_eq!(decode(&msg(Some(v.as_bytes()), &[]), &src, "eventType").unwrap().id, "u-1");
    let numeric = r#"{"after":{"id":42}}"#;
    assert_eq!(decode(&msg(Some(numeric.as_bytes()), &[]), &src, "eventType").unwrap().id, "42");
    let e = decode(&msg(Some(br#"{"after":{}}"#), &[]), &src, "eventType").unwrap_err();
    assert_eq!(e, DecodeError::MissingIdField("after.id".into()));
    let e = decode(&msg(Some(b"not json"), &[]), &src, "eventType").unwrap_err();
    assert_eq!(e, DecodeError::ValueNotJson);
}

#[test]
fn trace_context_is_taken_from_traceparent_or_debezium_span_context() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ev = decode(&msg(Some(b"{}"), &[("id", b"e"), ("traceparent", tp.as_bytes())]), &header_id(), "eventType");
    assert_eq!(ev.unwrap().traceparent.as_deref(), Some(tp));
    let props = format!("#Thu Nov 29\ntraceparent={tp}\ntracestate=x=1\n");
    let ev =
        decode(&msg(Some(b"{}"), &[("id", b"e"), ("tracingspancontext", props.as_bytes())]), &header_id(), "eventType");
    assert_eq!(ev.unwrap().traceparent.as_deref(), Some(tp));
    let ev = decode(&msg(Some(b"{}"), &[("id", b"e"), ("traceparent", b"00-zz\r\nX: y")]), &header_id(), "eventType");
    assert_eq!(ev.unwrap().traceparent, None, "malformed contexts are not forwarded");
}

#[test]
fn deeply_nested_json_does_not_crash() {
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    assert!(matches!(payload_of(&deep), Payload::Text(_)));
}

/// Messages a `Value` holds as written, in every shape the converters give.
const PLAIN: &[&str] = &[
    r#"{"total": 10, "items": [1, 2.5, -3], "note": "a \"quoted\" \\ word\ttab"}"#,
    r#"  {"total":10}  "#,
    r#"[1, {"a": null}, true, false]"#,
    r#""{\"total\": 10, \"lines\": [{\"sku\": \"a-1\"}]}""#,
    r#"" [1, 2] ""#,
    r#""12""#,
    r#""\"quoted\"""#,
    r#""not json""#,
    r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{\"total\":10}"}"#,
    r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"12"}"#,
    r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{not json"}"#,
    r#"{"schema":{"type":"string"},"payload":"plain text"}"#,
    r#"{"schema":null,"payload":{"id":1}}"#,
    r#"{"payload":{"id":1},"schema":{"type":"struct"}}"#,
    r#"{"schema":{"type":"string"},"payload":null}"#,
    r#"{"schema":"order.v2","payload":{"id":1}}"#,
    r#"{"schema":{"type":"string"},"payload":"x","extra":1}"#,
    r#"{"schema":{"type":"string"},"schema":null,"payload":{"id":1}}"#,
    r#"{"a":1,"a":2}"#,
    r#"{"payload":{"id":1}}"#,
    r#"{"note":"the \"schema\" member","payload":{"id":1}}"#,
    r#"{"a\"b":1}"#,
    "null",
    "12",
    r#""""#,
    "",
    "   ",
    r#"{"a":}"#,
    r#"{"a":1} trailing"#,
    "not json at all",
];

#[test]
fn json_kept_as_text_decodes_as_parsing_it_would() {
    for text in PLAIN {
        assert!(json::plain(text), "{text:?} is plain");
        let (checked, parsed) = (json::decode_checked(text), json::decode_parsed(text));
        assert_eq!(checked, parsed, "{text:?}");
        if let Ok(Payload::Json(j)) = &checked {
            // The text is JSON on one line, and it is the value.
            let reparsed: Value = serde_json::from_str(j.text()).unwrap();
            assert_eq!(&reparsed, j.value(), "{text:?}");
            assert!(!j.text().contains('\n') && j.text().trim() == j.text(), "{text:?}");
        }
    }
}

#[test]
fn json_a_value_cannot_hold_as_written_takes_the_parsing_path() {
    let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
    for text in ["1e5", "[1E3]", "[-2.5e-3]", "\"\\u00e9\"", "{\"a\":\n1}", "\r\n{}", &deep(65), &"9".repeat(301)] {
        assert!(!json::plain(text), "{text:?} is parsed");
    }
    // A string's escapes end it only at its closing quote: an escaped quote and an
    // escaped backslash before a `u` are the string's text.
    for text in [
        "true",
        "false",
        "{\"e\":1,\"E\":[true]}",
        "\"1e5\"",
        "\"a\\nb\"",
        r#"{"s":"x\"1e5"}"#,
        r#"{"s":"a\\u0041"}"#,
        &deep(64),
        &"9".repeat(300),
    ] {
        assert!(json::plain(text), "{text:?} is kept as text");
    }
    // What a `Value` refuses stays text, as before.
    assert_eq!(payload_of("1e999999"), Payload::Text("1e999999".into()));
    assert_eq!(payload_of("\"\\ud800\""), Payload::Text("\"\\ud800\"".into()));
}

#[test]
fn json_is_sent_as_it_came_spacing_and_member_order_kept() {
    let body = |value: &str| String::from_utf8(payload_of(value).to_body().0).unwrap();
    assert_eq!(body(r#" {"b": 1, "a": [1, 2]} "#), r#"{"b": 1, "a": [1, 2]}"#);
    assert_eq!(body(r#""{\"b\": 1, \"a\": [1, 2]}""#), r#"{"b": 1, "a": [1, 2]}"#);
    // Parsed JSON is sent in its compact rendering.
    assert_eq!(body("{\"b\": 1,\n \"a\": 2}"), r#"{"a":2,"b":1}"#);
}

/// `decode_now` answers what `decode` would, and declines exactly the messages that
/// need the registry: without one, `decode` refuses each of those for its Avro.
#[test]
fn decoding_at_once_agrees_with_decoding_and_declines_what_needs_the_registry() {
    let framed: &[u8] = &[0, 0, 0, 1, 7, 2, b'x'];
    let values: [Option<&[u8]>; 4] = [Some(br#"{"a":1}"#), Some(b"plain text"), Some(framed), None];
    let keys: [Option<&[u8]>; 3] = [Some(b"order-1"), Some(framed), None];
    let decoder = Decoder::default();
    let mut answered = 0;
    for format in [Format::Auto, Format::Json, Format::Avro, Format::Raw] {
        let layout = Layout { format, event_id: header_id(), ..Layout::default() };
        for (value, key) in values.iter().flat_map(|v| keys.iter().map(move |k| (*v, *k))) {
            let m = RawMessage { key: key.map(<[u8]>::to_vec), ..msg(value, &[("id", b"e-1")]) };
            let later = futures::executor::block_on(decoder.decode(&m, &layout));
            match decoder.decode_now(&m, &layout) {
                Some(now) => {
                    answered += 1;
                    assert_eq!(format!("{now:?}"), format!("{later:?}"), "{format:?}, {value:?}, {key:?}");
                }
                None => assert!(
                    matches!(later, Err(DecodeError::Avro { .. } | DecodeError::NotAvro)),
                    "declined {format:?}, {value:?}, {key:?}, which decodes as {later:?}"
                ),
            }
        }
    }
    // Under `auto` and `avro`: the six without a framed value or key; under `json` and `raw`: all twelve.
    assert_eq!(answered, 36);
    let json = msg(Some(br#"{"a":1}"#), &[("id", b"e-1")]);
    assert!(decoder.decode_now(&json, &Layout::default()).is_some(), "the usual event: JSON, a text key, auto");
}
