//! The admin HTTP server of a running outboxd: `/healthz`, `/readyz`,
//! `/metrics` (Prometheus), and the store API that `outboxd store …` uses
//! while the service holds the database. axum is used only here (and in the
//! demo receiver).

mod client;
mod exporter;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::{json, Value};

pub use client::AdminClient;
pub use exporter::{install as install_metrics, names};

use crate::engine::Executor;
use crate::offsets::OffsetTracker;
use crate::store::{State as RecordState, StoreError};

/// Longest list the API returns in one response.
const MAX_LIST: usize = 100_000;

/// What the admin endpoints look at.
pub struct AdminState {
    pub exec: Arc<Executor>,
    pub tracker: Arc<std::sync::Mutex<OffsetTracker>>,
    pub draining: Arc<AtomicBool>,
    pub broker_up: Arc<AtomicBool>,
    /// A partition whose events wait longer than this without its offset moving is stalled.
    pub stall_timeout: std::time::Duration,
    pub prometheus: PrometheusHandle,
    /// Required for repair operations when set.
    pub token: Option<String>,
}

type Shared = Arc<AdminState>;

/// Binds the listener (so a taken port fails start-up, not later).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("admin.listen: cannot listen on {addr}: {e} (set [admin] listen to another port, or \"off\")")
    })
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/stats", get(stats))
        .route("/v1/events", get(list))
        .route("/v1/events/{*id}", get(get_event))
        .route("/v1/forget", post(forget))
        .route("/v1/resolve", post(resolve))
        .route("/v1/retry", post(retry))
        .route("/v1/gc", post(gc))
        .route("/v1/export", get(export))
        .with_state(Arc::new(state));
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match e {
            StoreError::NotFound(_) => StatusCode::NOT_FOUND,
            StoreError::WrongState { .. } | StoreError::NoMessage(_) => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

async fn readyz(State(s): State<Shared>) -> Response {
    let (partitions, stalled) = {
        let tracker = s.tracker.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (tracker.assigned(), tracker.stalled(std::time::Instant::now(), s.stall_timeout))
    };
    let broker = s.broker_up.load(Ordering::Relaxed);
    let draining = s.draining.load(Ordering::Relaxed);
    let store_ok = !s.exec.stopped();
    let ready = store_ok && broker && partitions > 0 && !draining && stalled.is_empty();
    let stalled: Vec<String> = stalled.iter().map(|(t, p)| format!("{t}/{p}")).collect();
    let body = json!({"ready": ready, "store": store_ok, "broker": broker, "partitions": partitions,
        "draining": draining, "stalled": stalled});
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

async fn metrics(State(s): State<Shared>) -> String {
    let in_flight = s.tracker.lock().expect("offset tracker lock").unfinished();
    metrics::gauge!(names::IN_FLIGHT).set(in_flight as f64);
    s.prometheus.render()
}

async fn stats(State(s): State<Shared>) -> Result<Json<Value>, ApiError> {
    let store = s.exec.store.clone();
    let stats = tokio::task::spawn_blocking(move || store.stats())
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(Json(crate::cli::stats_json(&stats)))
}

async fn get_event(State(s): State<Shared>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    match s.exec.store.get(&id)? {
        Some(r) => Ok(Json(crate::cli::record_json(&r))),
        None => Err(ApiError(StatusCode::NOT_FOUND, format!("no record for event {id:?}"))),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
    topic: Option<String>,
    limit: Option<usize>,
}

impl ListQuery {
    /// `?state=`, or a 400 naming the states there are.
    fn state_filter(&self) -> Result<Option<RecordState>, ApiError> {
        self.state.as_deref().map(str::parse).transpose().map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))
    }
}

async fn list(State(s): State<Shared>, Query(q): Query<ListQuery>) -> Result<Json<Value>, ApiError> {
    let state = q.state_filter()?;
    let limit = q.limit.unwrap_or(100).min(MAX_LIST);
    let store = s.exec.store.clone();
    let records = tokio::task::spawn_blocking(move || store.list_filtered(state, q.topic.as_deref(), limit))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(Json(Value::Array(records.iter().map(crate::cli::record_json).collect())))
}

fn authorize(s: &AdminState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &s.token else { return Ok(()) };
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(token.as_str()) {
        Ok(())
    } else {
        Err(ApiError(StatusCode::UNAUTHORIZED, "repair operations need Authorization: Bearer <admin.token>".into()))
    }
}

#[derive(Deserialize)]
struct IdQuery {
    id: String,
}

async fn forget(
    State(s): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<IdQuery>,
) -> Result<Json<Value>, ApiError> {
    authorize(&s, &headers)?;
    let r = s.exec.store.forget(&q.id).await?;
    Ok(Json(crate::cli::record_json(&r)))
}

async fn resolve(
    State(s): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<IdQuery>,
) -> Result<Json<Value>, ApiError> {
    authorize(&s, &headers)?;
    s.exec.store.resolve_done(&q.id, "resolved by hand: done".to_owned()).await?;
    get_event(State(s), Path(q.id)).await
}

/// Records still buffered for an export response before the scan waits for the client.
const EXPORT_BUFFER: usize = 1024;

async fn gc(State(s): State<Shared>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorize(&s, &headers)?;
    let removed = s.exec.store.gc(crate::store::now_us()).await?;
    Ok(Json(json!({"removed": removed})))
}

/// JSON Lines of records (with message copies), streamed while the store is scanned.
async fn export(State(s): State<Shared>, Query(q): Query<ListQuery>) -> Result<Response, ApiError> {
    let state = q.state_filter()?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(EXPORT_BUFFER);
    let store = s.exec.store.clone();
    tokio::task::spawn_blocking(move || {
        let sent = store.scan(state, q.topic.as_deref(), |r| -> Result<(), StoreError> {
            let line = crate::cli::export_line(&store, &r)?;
            // A client that went away ends the scan.
            tx.blocking_send(Ok(format!("{line}\n"))).map_err(|_| StoreError::NotFound("export client".into()))
        });
        if let Err(e) = sent {
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Ok(([("content-type", "application/x-ndjson")], axum::body::Body::from_stream(stream)).into_response())
}

/// Runs a dead or parked event again from its stored copy, in the service.
async fn retry(State(s): State<Shared>, headers: HeaderMap, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    authorize(&s, &headers)?;
    match s.exec.rerun(&q.id).await? {
        Some(r) => Ok(Json(crate::cli::record_json(&r))),
        None => Ok(Json(json!({"event_id": q.id, "state": "rerun", "note": "recorded under its decoded event id"}))),
    }
}
