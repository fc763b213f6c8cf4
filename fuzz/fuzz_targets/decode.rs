//! Fuzzes the decoder (`codec::Decoder`, as production calls it, without a schema
//! registry): any key, value, headers and handler layout must decode to an event or
//! a `DecodeError`, never panic, and a decoded event keeps the codec's promises.
//!
//! Run from the repository root: `cargo +nightly fuzz run -s none decode`.
//! `-s none`: outboxd links librdkafka, whose build cannot link zstd compiled with
//! AddressSanitizer; the decoder is safe Rust (unsafe code is forbidden), so panics
//! are what this looks for. Inputs that found a problem belong in
//! tests/decode_regressions.rs.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use outboxd::codec::{Decoder, Layout, MAX_EVENT_ID_LEN};
use outboxd::config::{Body, EventIdSource, Format};
use outboxd::event::RawMessage;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Vec<(&'a str, Option<&'a [u8]>)>,
    /// Use the `id` header (false) or a field of the value (true).
    id_from_field: bool,
    field: &'a str,
    /// The handler's `format` (auto, json, avro, raw) and `body` (json, raw).
    format: u8,
    raw_body: bool,
}

fuzz_target!(|input: Input<'_>| {
    let msg = RawMessage {
        topic: "outbox.event.fuzz".into(),
        partition: 0,
        offset: 0,
        key: input.key.map(<[u8]>::to_vec),
        value: input.value.map(<[u8]>::to_vec),
        headers: input.headers.iter().map(|(k, v)| (k.to_string(), v.map(<[u8]>::to_vec))).collect(),
        timestamp_ms: None,
    };
    let source = if input.id_from_field && !input.field.is_empty() {
        EventIdSource::Field(input.field.to_owned())
    } else {
        EventIdSource::Header("id".to_owned())
    };
    let format = match input.format % 4 {
        0 => Format::Auto,
        1 => Format::Json,
        2 => Format::Avro,
        _ => Format::Raw,
    };
    let body = if input.raw_body { Body::Raw } else { Body::Json };
    let layout = Layout { format, event_id: source, body, ..Layout::default() };
    // Without a registry nothing awaits: the future is ready at its first poll.
    let decoded = futures::executor::block_on(Decoder::default().decode(&msg, &layout));
    if let Err(e) = &decoded {
        assert!(!e.is_transient(), "without a registry nothing can be waited for: {e}");
    }
    if let Ok(event) = decoded {
        assert!(!event.id.is_empty(), "decoded an empty event id");
        assert!(event.id.len() <= MAX_EVENT_ID_LEN, "decoded an event id over the limit");
        // What the handler does with it must not panic either.
        let _ = event.payload.to_body();
        let _ = serde_json::to_vec(&event.payload);
        // JSON kept as text is JSON on one line, and it is the value handlers read.
        if let outboxd::event::Payload::Json(json) = &event.payload {
            let reparsed: serde_json::Value = serde_json::from_str(json.text()).expect("the kept text is JSON");
            assert_eq!(&reparsed, json.value(), "the kept text and the value disagree");
            assert!(!json.text().contains('\n'), "the kept text spans lines");
        }
    }
});
