//! One event's page: its record, its times, its stored message, its chain and its audit.

use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::super::console::{Shared, Viewer};
use super::super::format::{self, When};
use super::audit::AuditRow;
use super::chrome::*;
use crate::event::Payload;
use crate::store::view::{record_view, CHAIN_SHOWN};
use crate::store::State as RecordState;
use crate::wire::RecordView;

/// The stored copy of a dead or parked event's message, as a person reads it.
pub struct MessageCopy {
    pub position: String,
    pub timestamp: Option<When>,
    pub key: String,
    pub headers: Vec<(String, String)>,
    pub payload: String,
    pub payload_kind: &'static str,
    pub decode_error: Option<String>,
    /// The idempotency header the receiver was sent with the event, and its value.
    pub idempotency: Option<(String, String)>,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/event.html")]
pub struct EventPage {
    pub chrome: Chrome,
    pub id: String,
    pub r: RecordView,
    /// The route of the record, on a topic's later route (`None`: its first).
    pub route: Option<String>,
    pub times: Vec<(&'static str, When)>,
    pub message: Option<MessageCopy>,
    /// Its key's held chain, said in a line.
    pub chain: Option<String>,
    /// What people did to it, newest first.
    pub audit: Vec<AuditRow>,
    pub can_rerun: bool,
    pub query: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/missing.html")]
pub struct MissingPage {
    pub chrome: Chrome,
    pub id: String,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The message copy of `id`'s record on `route` (a topic's later route; `None`: its first).
async fn message_copy(c: &Shared, id: &str, route: Option<&str>) -> Option<MessageCopy> {
    let (store, key) = (c.exec.store.clone(), id.to_owned());
    let msg = c.reads.run(move || store.reads().message(&key)).await.ok()?.ok().flatten()?;
    let now = SystemTime::now();
    let decoded = c.exec.decode_copy(&msg).await;
    let (payload, payload_kind, decode_error, event_id) = match decoded {
        Some(Ok(event)) => {
            let (text, kind) = match &event.payload {
                Payload::Json(j) => (serde_json::to_string_pretty(j.value()).unwrap_or_default(), "JSON"),
                Payload::Text(t) => (t.clone(), "text"),
                Payload::Bytes(b) => (format!("{} bytes that are not UTF-8", b.len()), "bytes"),
                Payload::Null => (String::new(), "null"),
            };
            (text, kind, None, Some(event.id))
        }
        Some(Err(e)) => (msg.value.as_deref().map(text).unwrap_or_default(), "as stored", Some(e.to_string()), None),
        None => (
            msg.value.as_deref().map(text).unwrap_or_default(),
            "as stored",
            Some(format!("no handler covers topic {} any more", msg.topic)),
            None,
        ),
    };
    let handler = c.exec.config.route_handler(&msg.topic, route);
    let idempotency = handler.and_then(|hc| match &hc.spec {
        crate::config::HandlerSpec::Http(http) => {
            let id = event_id.clone().unwrap_or_else(|| id.to_owned());
            let key = match route {
                Some(name) => format!("{id}#{name}"),
                None => id,
            };
            Some((http.idempotency_header.clone()?, key))
        }
        crate::config::HandlerSpec::Log | crate::config::HandlerSpec::Postgres(_) => None,
    });
    Some(MessageCopy {
        position: format!("{}/{}@{}", msg.topic, msg.partition, msg.offset),
        timestamp: msg.timestamp_ms.map(|ms| format::at_us(ms.saturating_mul(1000), now)),
        key: msg.key.as_deref().map(text).unwrap_or_else(|| "(none)".into()),
        headers: msg.headers.iter().map(|(k, v)| (k.clone(), v.as_deref().map(text).unwrap_or_default())).collect(),
        payload,
        payload_kind,
        decode_error,
        idempotency,
    })
}

pub async fn event(State(c): State<Shared>, viewer: Viewer, Path(id): Path<String>) -> Response {
    let chrome = Chrome::new(&viewer, "events");
    // The record and its audit: two reads of the store, each on a read turn.
    let (store, key) = (c.exec.store.clone(), id.clone());
    let record = c.reads.run(move || store.reads().get(&key).map(|r| r.map(|r| record_view(&store, &r, CHAIN_SHOWN))));
    let r = match record.await {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return (StatusCode::NOT_FOUND, MissingPage { chrome, id }).into_response(),
        Ok(Err(e)) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let now = SystemTime::now();
    let mut times = vec![("first seen", format::when(&r.first_seen, now))];
    for (label, t) in [("claimed", &r.claimed_at), ("final", &r.done_at), ("expires", &r.expires_at)] {
        if let Some(t) = t {
            times.push((label, format::when(t, now)));
        }
    }
    times.push(("last written", format::when(&r.updated_at, now)));
    // A topic's later route: its scope ends with `#` and the route's name.
    let route = r.route().map(str::to_owned);
    let message = message_copy(&c, &id, route.as_deref()).await;
    let can_rerun = matches!(r.state, RecordState::Dead | RecordState::Parked);
    let query = url::form_urlencoded::Serializer::new(String::new()).append_pair("id", &id).finish();
    let chain = r.chain.as_ref().filter(|ch| ch.held_total > 0).map(|ch| match &ch.head {
        Some(head) if *head == id => format!("{} later events of its key are held behind it", ch.held_total),
        Some(head) => format!("held behind {head}, with {} events of its key", ch.held_total),
        None => format!("released: its {} held events run in order", ch.held_total),
    });
    let (local, key) = (c.local.clone(), id.clone());
    let audit = c.reads.run(move || local.audit_of(&key)).await.ok().and_then(Result::ok).unwrap_or_default();
    let audit = audit.iter().map(|v| AuditRow::of(v, now)).collect();
    EventPage { chrome, id, r, route, times, message, chain, audit, can_rerun, query }.into_response()
}
