//! Spans exported over OTLP (`[tracing.otlp]`) to a real collector process (the
//! package's `outboxd-otlp-receiver`): an event's spans continue the trace context its
//! message carried, and the receiver is called with the context of the call's span.
//! Needs the local stack's broker.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::daemon::changelog_off;
use crate::harness::logs::log_lines;
use crate::harness::metrics::{sample, try_scrape};
use crate::harness::otlp::{OtlpReceiver, Span};
use crate::harness::ports::ClosedPort;
use crate::harness::{new_event_id, wait_until, wait_until_async, Behaviour, Scenario};

/// Generous bound for "outboxd handled it and exported its spans" (batches go out every second).
const TIMEOUT: Duration = Duration::from_secs(60);

/// The producer's span, as a service that wrote the outbox row would put it in the header.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// The spans of `trace` whose parent is `parent`.
fn children<'a>(trace: &'a [Span], parent: &str, name: &str) -> Vec<&'a Span> {
    trace.iter().filter(|s| s.parent_span_id == parent && s.name == name).collect()
}

fn event_span<'a>(spans: &'a [Span], event_id: &str) -> Option<&'a Span> {
    spans.iter().find(|s| s.name == "event" && s.attr_str("outboxd.event.id") == Some(event_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_spans_continue_the_producers_trace_to_the_receiver() {
    let mut s = Scenario::new("traces", 1).await;
    let collector = OtlpReceiver::start();
    s.od.config.extra_toml =
        format!("\n[tracing.otlp]\nendpoint = \"{}\"\nservice_name = \"outboxd-it\"\n", collector.endpoint());
    // A durable claim, so that the claim's changelog record shows (with the changelog on).
    s.od.config.handler_extra = "on_uncertain = \"park\"\n".into();
    s.run().await;
    let Scenario { topic, receiver, mut od, producer, .. } = s;

    // The first call fails: the trace shows both attempts.
    let traced = new_event_id();
    receiver.set_behaviour(&traced, Behaviour::fail_first(503, 1));
    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    let payload = serde_json::to_vec(&json!({"orderId": 1})).unwrap();
    let headers = [
        ("id", Some(traced.as_bytes())),
        ("eventType", Some(&b"OrderPaid"[..])),
        ("traceparent", Some(traceparent.as_bytes())),
        ("tracestate", Some(&b"congo=t61rcWkgMzE"[..])),
    ];
    let (partition, offset) = producer.send_raw(&topic, None, Some(b"order-1"), &headers, Some(&payload)).await;
    // And one without a context: it starts a trace of its own.
    let untraced = new_event_id();
    producer.send_event(&topic, "order-2", &untraced, Some("OrderPaid"), &json!({"orderId": 2})).await;

    wait_until("both events answered", TIMEOUT, || receiver.answered_ok(&traced) && receiver.answered_ok(&untraced))
        .await;
    wait_until("the traced event's spans", TIMEOUT, || {
        let trace = collector.trace(TRACE_ID);
        ["decode", "claim", "record"].iter().all(|n| trace.iter().any(|s| s.name == *n))
            && trace.iter().filter(|s| s.name == "handler call").count() == 2
            && event_span(&trace, &traced).is_some()
    })
    .await;
    wait_until("the untraced event's span", TIMEOUT, || event_span(&collector.spans(), &untraced).is_some()).await;

    let trace = collector.trace(TRACE_ID);
    let event = event_span(&trace, &traced).unwrap();
    assert_eq!(event.parent_span_id, PRODUCER_SPAN, "the event span's parent is the producer's span: {event:#?}");
    assert_eq!(event.service, json!("outboxd-it"));
    assert_eq!(event.attr_str("messaging.destination.name"), Some(topic.as_str()));
    assert_eq!(event.attr("messaging.destination.partition.id"), Some(&json!(partition)));
    assert_eq!(event.attr("messaging.kafka.offset"), Some(&json!(offset)));
    assert_eq!(event.attr_str("outboxd.event.type"), Some("OrderPaid"));
    assert_eq!(event.attr_str("outboxd.aggregate.id"), Some("order-1"));
    assert_eq!(event.attr_str("outboxd.handler"), Some(topic.as_str()));
    assert_eq!(event.attr_str("outboxd.state"), Some("done"));
    assert!(!event.is_error(), "{event:#?}");
    for name in ["decode", "claim", "record"] {
        assert_eq!(children(&trace, &event.span_id, name).len(), 1, "one {name} span under the event: {trace:#?}");
    }
    let claim = &children(&trace, &event.span_id, "claim")[0];
    assert_eq!(claim.attr("outboxd.claim.durable"), Some(&json!(true)));
    // The durable claim's changelog acknowledgement is in its wait, with the changelog on.
    assert_eq!(claim.attr("outboxd.changelog"), Some(&json!(!changelog_off())), "{claim:#?}");
    let mut calls = children(&trace, &event.span_id, "handler call");
    calls.sort_by_key(|s| s.attr("outboxd.attempt").and_then(|a| a.as_i64()));
    assert_eq!(calls.len(), 2, "each attempt is a span of its own: {trace:#?}");
    assert!(calls[0].is_error(), "the 503 is an error: {:#?}", calls[0]);
    assert!(calls[0].status.as_ref().is_some_and(|s| s.message.contains("503")), "{:#?}", calls[0]);
    assert_eq!(calls[0].attr("http.response.status_code"), Some(&json!(503)));
    assert_eq!(calls[1].attr("http.response.status_code"), Some(&json!(200)));
    assert!(!calls[1].is_error());

    // The receiver's calls carry the context of the call span that made them.
    let answered = receiver.handler_calls(&traced);
    assert_eq!(answered.len(), 2, "{answered:#?}");
    for (call, span) in answered.iter().zip(&calls) {
        let sent = call.header("traceparent").expect("a traceparent to the receiver");
        assert_eq!(sent, format!("00-{TRACE_ID}-{}-01", span.span_id), "{call:#?}");
        assert_eq!(call.header("tracestate"), Some("congo=t61rcWkgMzE"));
    }

    let root = event_span(&collector.spans(), &untraced).cloned().unwrap();
    assert_eq!(root.parent_span_id, "", "without a context the event span is a root: {root:#?}");
    assert_ne!(root.trace_id, TRACE_ID);
    let sent = receiver.handler_calls(&untraced)[0].header("traceparent").map(str::to_owned);
    assert!(sent.as_deref().is_some_and(|t| t.starts_with(&format!("00-{}-", root.trace_id))), "{sent:?}");
    od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_away_costs_spans_not_events() {
    let mut s = Scenario::new("traces-away", 1).await;
    // A loopback port that refuses connections until the end of the test.
    let closed = ClosedPort::bind();
    s.od.config.extra_toml =
        format!("\n[tracing.otlp]\nendpoint = \"http://127.0.0.1:{}\"\ntimeout = \"1s\"\n", closed.port());
    s.run().await;
    let Scenario { topic, receiver, mut od, producer, .. } = s;

    let ids: Vec<String> = (0..20).map(|_| new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
        let headers = [("id", Some(id.as_bytes())), ("traceparent", Some(traceparent.as_bytes()))];
        producer.send_raw(&topic, None, Some(format!("k{i}").as_bytes()), &headers, Some(b"{}")).await;
    }
    wait_until("every event handled", TIMEOUT, || ids.iter().all(|id| receiver.answered_ok(id))).await;
    wait_until_async("dropped spans to be counted", TIMEOUT, async || {
        let m = try_scrape(&od).await.unwrap_or_default();
        sample(&m, "outboxd_trace_spans_dropped_total", &[("reason", "export_failed")]) != 0.0
    })
    .await;
    assert_eq!(log_lines(&od, "trace export failed").len(), 1, "one warning, not one per batch:\n{}", od.log());
    // The exit does not wait for the collector beyond the flush bound.
    let started = Instant::now();
    let status = od.terminate();
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(15), "exit took {:?}", started.elapsed());
    for id in &ids {
        assert_eq!(receiver.handler_calls(id).len(), 1, "{id}");
    }
}
