//! The spans of one message's handling, named and shaped in one place (the list is in
//! docs/operations.md, "Traces"):
//!
//! ```text
//! event            one per message; its parent is the trace context the message carried
//! ├─ decode
//! ├─ claim         the claim (written, for `on_uncertain = verify | park`, and then
//! │                acknowledged by the changelog when it is on)
//! ├─ handler call  one per attempt: retries are siblings; status and HTTP status
//! └─ record        the final record, durable (group commit, and the changelog's ack when it is on)
//! ```
//!
//! They are `debug` spans of plain `tracing`: nothing here knows OpenTelemetry (the
//! parent is set through `telemetry`). Without the exporter no layer wants them, each
//! call site is disabled once, and every function below is a no-op on `Span::none()`.
//! Attribute names follow OpenTelemetry's messaging conventions where one exists;
//! `otel.*` fields are the OpenTelemetry layer's (kind, status). Numbers go in as `i64`:
//! the layer exports unsigned ones as text.

use tracing::field::Empty;
use tracing::level_filters::LevelFilter;
use tracing::{debug_span, Span};

use crate::event::{OutboxEvent, RawMessage};
use crate::store::State;

/// The span of one message, child of the trace context in its headers (a new root
/// without one, whatever span the caller is in).
pub(super) fn event(msg: &RawMessage) -> Span {
    let span = debug_span!(
        parent: None,
        "event",
        otel.kind = "consumer",
        otel.status_code = Empty,
        otel.status_description = Empty,
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.destination.name = %msg.topic,
        messaging.destination.partition.id = msg.partition,
        messaging.kafka.offset = msg.offset,
        outboxd.event.id = Empty,
        outboxd.event.type = Empty,
        outboxd.aggregate.id = Empty,
        outboxd.handler = Empty,
        outboxd.state = Empty,
    );
    if !span.is_disabled() {
        crate::telemetry::set_parent(&span, crate::codec::trace_context(msg).as_ref());
    }
    span
}

/// What decoding found, on the event's span.
pub(super) fn decoded(span: &Span, handler: &str, event: &OutboxEvent) {
    // A disabled span still looks each field up by name among its fifteen.
    if span.is_disabled() {
        return;
    }
    span.record("outboxd.handler", handler);
    span.record("outboxd.event.id", event.id.as_str());
    if let Some(t) = &event.event_type {
        span.record("outboxd.event.type", t.as_str());
    }
    if let Some(a) = &event.aggregate_id {
        span.record("outboxd.aggregate.id", a.as_str());
    }
}

pub(super) fn decode() -> Span {
    debug_span!("decode", otel.status_code = Empty, otel.status_description = Empty)
}

/// The claim; a durable one's wait includes the changelog's acknowledgement of it
/// when the changelog is on (`outboxd.changelog`): the store awaits both at once.
pub(super) fn claim(durable: bool, changelog: bool) -> Span {
    debug_span!("claim", outboxd.claim.durable = durable, outboxd.changelog = durable && changelog)
}

/// One attempt of `handler` (the route: a topic's routes are calls of their own in the
/// event's trace); `http.response.status_code` is the http handler's to fill in.
pub(super) fn call(handler: &str, attempt: u32) -> Span {
    debug_span!(
        "handler call",
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        outboxd.handler = handler,
        outboxd.attempt = i64::from(attempt),
        outboxd.outcome = Empty,
        http.response.status_code = Empty,
    )
}

/// Writing the final record `state` and waiting until it is durable. Called in the
/// event's span, which gets the state too.
pub(super) fn record(state: State, changelog: bool) -> Span {
    ended_here(state);
    debug_span!("record", outboxd.state = %state, outboxd.changelog = changelog)
}

/// The span the caller is in (the event's, where the `_here` functions are called),
/// or none while no layer can want a `debug` span: `Span::current()` is a lookup in
/// the subscriber's span stack, the level check an atomic load.
fn current() -> Span {
    if LevelFilter::current() < LevelFilter::DEBUG {
        Span::none()
    } else {
        Span::current()
    }
}

/// [`ended`] on the span the caller is in.
pub(super) fn ended_here(state: impl std::fmt::Display) {
    ended(&current(), state);
}

/// [`failed`] on the span the caller is in.
pub(super) fn failed_here(reason: impl std::fmt::Display) {
    failed(&current(), reason);
}

/// How the event ended, on `span` (the event's): `duplicate`, `held`, `abandoned`, or
/// a record's state.
pub(super) fn ended(span: &Span, state: impl std::fmt::Display) {
    if !span.is_disabled() {
        span.record("outboxd.state", state.to_string().as_str());
    }
}

/// An error status on `span`, with what went wrong.
pub(super) fn failed(span: &Span, reason: impl std::fmt::Display) {
    if !span.is_disabled() {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", reason.to_string().as_str());
    }
}

/// A handler call's answer.
pub(super) fn answered(span: &Span, outcome: &str) {
    if !span.is_disabled() {
        span.record("outboxd.outcome", outcome);
    }
}

#[cfg(feature = "internals")]
pub mod cost;
