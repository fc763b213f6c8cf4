//! `kind = "log"`: one JSON line per event on stdout (logs go to stderr).

use std::io::Write;

use super::{HandlerError, Outcome};
use crate::event::OutboxEvent;

pub struct LogHandler;

impl LogHandler {
    pub fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        let line = serde_json::json!({
            "event_id": event.id,
            "aggregate_id": event.aggregate_id,
            "event_type": event.event_type,
            "topic": event.position.topic,
            "partition": event.position.partition,
            "offset": event.position.offset,
            "payload": event.payload.to_json(),
        });
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| HandlerError::retryable(format!("writing to stdout: {e}")))?;
        Ok(Outcome("logged".to_owned()))
    }
}
