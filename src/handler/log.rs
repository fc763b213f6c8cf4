//! `kind = "log"`: one JSON line per event on stdout (logs go to stderr).

use std::io::Write;

use serde::Serialize;

use super::{async_trait, Handler, HandlerError, Outcome};
use crate::event::{OutboxEvent, Payload};

/// `kind = "log"`: writes one JSON line per event on stdout; fails only when stdout
/// cannot be written, and then as a receiver that is down.
pub struct LogHandler;

#[async_trait]
impl Handler for LogHandler {
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        // The line is rendered before stdout is locked and written with one call:
        // stdout's line buffer would otherwise copy each piece the serializer writes
        // and look for a newline in it, with the lock held meanwhile.
        let line = line(event);
        emit(&mut std::io::stdout().lock(), &line)
    }
}

/// The line, newline included.
fn line(event: &OutboxEvent) -> Vec<u8> {
    let mut line = Vec::with_capacity(LINE_START + payload_len(&event.payload));
    write_line(&mut line, event).expect("a line of strings and numbers always serializes, and a Vec takes every write");
    line
}

/// Room for a line's fields other than the payload.
const LINE_START: usize = 160;

fn payload_len(payload: &Payload) -> usize {
    match payload {
        Payload::Json(j) => j.text().len(),
        Payload::Text(t) => t.len() + t.len() / 8,
        _ => 16,
    }
}

/// The line is the side effect: one that could not be written whole (stdout closed:
/// EPIPE; a full disk) fails the attempt, so the event is not recorded done. It is
/// stdout's failure, not the event's: every event would fail alike, so it is
/// `Unavailable` (the handler's circuit opens, its events wait and use up no retry
/// budget) rather than a retry budget spent on each event and then dead. Never a
/// crash: Rust ignores SIGPIPE, so the write returns the error.
fn emit(out: &mut impl Write, line: &[u8]) -> Result<Outcome, HandlerError> {
    out.write_all(line)
        .and_then(|()| out.flush())
        .map_err(|e| HandlerError::unavailable(format!("writing to stdout: {e}")))?;
    Ok(Outcome("logged".to_owned()))
}

fn write_line(out: &mut impl Write, event: &OutboxEvent) -> std::io::Result<()> {
    // Fields in alphabetical order, as the lines always had them.
    let line = Line {
        aggregate_id: event.aggregate_id.as_deref(),
        event_id: &event.id,
        event_type: event.event_type.as_deref(),
        idempotency_key: event.route_key.as_deref(),
        offset: event.position.offset,
        partition: event.position.partition,
        payload: &event.payload,
        topic: &event.position.topic,
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}

/// One output line, borrowed from the event (no copy of the payload per event).
#[derive(Serialize)]
struct Line<'a> {
    aggregate_id: Option<&'a str>,
    event_id: &'a str,
    event_type: Option<&'a str>,
    /// Only on a topic's later routes (`OutboxEvent::route_key`): tells their lines apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
    offset: i64,
    partition: i32,
    payload: &'a Payload,
    topic: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Position;

    fn event(payload: Payload) -> OutboxEvent {
        OutboxEvent {
            id: "e-1".into(),
            aggregate_id: Some("order-7".into()),
            event_type: None,
            payload,
            position: Position { topic: "orders".into(), partition: 2, offset: 41 },
            timestamp_ms: None,
            traceparent: None,
            route_key: None,
            headers: Vec::new(),
        }
    }

    fn line(payload: Payload) -> String {
        let mut out = Vec::new();
        write_line(&mut out, &event(payload)).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// stdout whose reader went away.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_line_that_cannot_be_written_fails_as_an_unavailable_receiver_not_done() {
        match emit(&mut ClosedPipe, &super::line(&event(Payload::Null))) {
            Err(HandlerError::Unavailable { reason, .. }) => assert!(reason.contains("writing to stdout"), "{reason}"),
            other => panic!("a closed stdout must fail the attempt as stdout's failure, got {other:?}"),
        }
        let mut open = Vec::new();
        assert_eq!(emit(&mut open, &super::line(&event(Payload::Null))), Ok(Outcome("logged".to_owned())));
        assert!(open.ends_with(b"\n"));
    }

    #[test]
    fn one_json_line_per_event_with_the_payload_as_json() {
        assert_eq!(
            line(Payload::Json(serde_json::json!({"total": 12.5, "items": [1, 2]}).into())),
            r#"{"aggregate_id":"order-7","event_id":"e-1","event_type":null,"offset":41,"partition":2,"payload":{"items":[1,2],"total":12.5},"topic":"orders"}"#.to_owned() + "\n"
        );
    }

    #[test]
    fn a_later_route_s_line_carries_its_idempotency_key() {
        let mut e = event(Payload::Null);
        e.route_key = Some("e-1#audit".into());
        let mut out = Vec::new();
        write_line(&mut out, &e).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((v["event_id"].as_str(), v["idempotency_key"].as_str()), (Some("e-1"), Some("e-1#audit")));
    }

    #[test]
    fn text_bytes_and_null_payloads_render_as_json_values() {
        let payload = |l: String| serde_json::from_str::<serde_json::Value>(&l).unwrap()["payload"].clone();
        assert_eq!(payload(line(Payload::Text("a \"quoted\"\nline".into()))), "a \"quoted\"\nline");
        assert_eq!(payload(line(Payload::Bytes(vec![0xff, 0, 1]))), "<3 bytes>");
        assert_eq!(payload(line(Payload::Null)), serde_json::Value::Null);
    }
}
