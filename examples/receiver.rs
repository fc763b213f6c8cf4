//! A small HTTP receiver for the demo: it honours `Idempotency-Key` the way
//! payment and e-mail APIs do (a repeated key gets the first answer again
//! and does nothing) and prints one line per request, so you can watch side
//! effects arrive once.
//!
//! `POST /orders/{aggregate_id}/events` is the order webhook, `POST /mail/{aggregate_id}`
//! the mailer (the demo's second route); each key does its side effect once.
//!
//! `cargo run --example receiver -- [ADDR]` (default 127.0.0.1:18080).
//! `GET /stats` returns `{"requests":N,"effects":N,"replays":N,"mails":N}` (`effects`
//! counts the mails too).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// Idempotency keys seen → the status first answered. Bounded: the demo
/// stops accepting new keys past this many instead of growing forever.
const MAX_KEYS: usize = 1_000_000;

#[derive(Default)]
struct Receiver {
    keys: HashMap<String, u16>,
    requests: u64,
    effects: u64,
    replays: u64,
    mails: u64,
}

type Shared = Arc<Mutex<Receiver>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:18080".to_owned());
    let state: Shared = Arc::default();
    let app = Router::new()
        .route("/orders/{aggregate_id}/events", post(event))
        .route("/mail/{aggregate_id}", post(mail))
        .route("/stats", get(stats))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("receiver listening on http://{addr}");
    axum::serve(listener, app).await?;
    Ok(())
}

async fn event(
    State(state): State<Shared>,
    Path(aggregate_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    effect("EFFECT", &state, &aggregate_id, &headers, &body)
}

async fn mail(
    State(state): State<Shared>,
    Path(aggregate_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let answer = effect("MAIL  ", &state, &aggregate_id, &headers, &body);
    if answer.1 .0.get("done").is_some() {
        state.lock().expect("receiver state").mails += 1;
    }
    answer
}

/// Does the side effect of a key once (`what` names it in the line printed).
fn effect(
    what: &str,
    state: &Shared,
    aggregate_id: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, Json<Value>) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
    let key = header("idempotency-key");
    let event_type = header("outbox-event-type");
    let body_text = String::from_utf8_lossy(body);
    let mut r = state.lock().expect("receiver state");
    r.requests += 1;
    if let Some(status) = r.keys.get(&key).copied() {
        r.replays += 1;
        println!("REPLAY  order={aggregate_id} type={event_type} key={key} (already done: no second side effect)");
        return (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), Json(json!({"replayed": true})));
    }
    if r.keys.len() >= MAX_KEYS {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "too many keys"})));
    }
    r.keys.insert(key.clone(), 200);
    r.effects += 1;
    println!("{what}  order={aggregate_id} type={event_type} key={key} body={body_text}");
    (StatusCode::OK, Json(json!({"done": true})))
}

async fn stats(State(state): State<Shared>) -> Json<Value> {
    let r = state.lock().expect("receiver state");
    Json(json!({"requests": r.requests, "effects": r.effects, "replays": r.replays, "mails": r.mails}))
}
