//! What the spans of one event cost the CPU, with the exporter off (the log layer's
//! global filter at `info`, as the binary has it) and on (its layer, exporting to a
//! port nothing listens on): a measurement for the benchmark (`outboxd-bench
//! span-cost`, in release), not a test.

use std::time::Instant;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::Layer as _;

use super::*;

fn one(msg: &RawMessage, event: &OutboxEvent) {
    let span = super::event(msg);
    let _e = span.enter();
    let d = decode();
    drop(d);
    decoded(&span, "h", event);
    let c = claim(false, false);
    drop(c);
    let call = call("bench", 1);
    answered(&call, "http 200");
    drop(call);
    let r = record(State::Done, true);
    drop(r);
}

/// Nanoseconds per event over `n` events.
fn run(n: u32, msg: &RawMessage, event: &OutboxEvent) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        one(msg, event);
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// Nanoseconds per event with the exporter off and on (`n` events each, after a
/// warm-up of a fifth of that). Needs a tokio runtime entered, for the exporter.
pub fn spans_of_one_event_with_the_exporter_off_and_on(n: u32) -> (f64, f64) {
    let tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec();
    let msg = RawMessage {
        topic: "outbox.event.order".into(),
        partition: 3,
        offset: 12345,
        headers: vec![("id".into(), Some(b"e-1".to_vec())), ("traceparent".into(), Some(tp))],
        ..RawMessage::default()
    };
    let event = OutboxEvent {
        id: "e-1".into(),
        aggregate_id: Some("order-1".into()),
        event_type: Some("OrderPaid".into()),
        payload: crate::event::Payload::Null,
        position: msg.position(),
        timestamp_ms: None,
        traceparent: None,
        route_key: None,
        headers: Vec::new(),
    };
    let off = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink));
    let off = tracing::subscriber::with_default(off, || {
        run(n / 5, &msg, &event);
        run(n, &msg, &event)
    });
    let config = crate::config::OtlpConfig {
        endpoint: "http://127.0.0.1:9/v1/traces".into(),
        service_name: "x".into(),
        sample_ratio: 1.0,
        headers: vec![],
        timeout: std::time::Duration::from_secs(1),
        max_queue: 1 << 20,
    };
    let (layer, _exporter) = crate::telemetry::layer(&config).expect("the exporter's layer");
    let on = tracing_subscriber::registry().with(layer).with(
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(tracing_subscriber::EnvFilter::new("info")),
    );
    let on = tracing::subscriber::with_default(on, || {
        run(n / 50, &msg, &event);
        run(n / 10, &msg, &event)
    });
    (off, on)
}
