//! The store API under `/v1`: reads (stats, one record, pages of records,
//! export) and repairs (forget, resolve, retry, gc). Every route here sits
//! behind [`super::auth::check`]; none checks credentials itself.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::{ApiError, Shared};
use crate::engine::Executor;
use crate::store::{view, State as RecordState, StoreError};

/// Records in one page of `/v1/events` when the request names no `limit`.
const DEFAULT_PAGE: usize = 100;
/// Largest page of `/v1/events` (a record is ~0.5 kB of JSON): a larger
/// `limit` gets this many and a `next` cursor to go on from.
const MAX_PAGE: usize = 10_000;
/// Records still buffered for an export response before the scan waits for the client.
const EXPORT_BUFFER: usize = 1024;
/// Admin retries re-executing at once (each may hold a handler call for its
/// whole retry schedule); further `/v1/retry` requests wait for a turn.
const MAX_ADMIN_RETRIES: usize = 4;

/// What `/v1/retry` needs: the executor, and a turn to run in.
struct Retries {
    exec: Arc<Executor>,
    /// One permit per running admin retry, held by its task until it ends.
    turns: Arc<Semaphore>,
}

pub(super) fn router(admin: Shared) -> Router {
    let retries = Retries { exec: admin.exec.clone(), turns: Arc::new(Semaphore::new(MAX_ADMIN_RETRIES)) };
    Router::new()
        .route("/stats", get(stats))
        .route("/events", get(list))
        .route("/events/{*id}", get(get_event))
        .route("/forget", post(forget))
        .route("/resolve", post(resolve))
        .route("/retry", post(retry).with_state(Arc::new(retries)))
        .route("/gc", post(gc))
        .route("/export", get(export))
        .with_state(admin)
}

fn join_error(e: tokio::task::JoinError) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

async fn stats(State(s): State<Shared>) -> Result<Json<Value>, ApiError> {
    let store = s.exec.store.clone();
    let stats = tokio::task::spawn_blocking(move || store.stats()).await.map_err(join_error)??;
    Ok(Json(view::stats_json(&stats)))
}

async fn get_event(State(s): State<Shared>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    record(&s.exec, &id)
}

fn record(exec: &Executor, id: &str) -> Result<Json<Value>, ApiError> {
    match exec.store.get(id)? {
        Some(r) => Ok(Json(view::record_json(&r))),
        None => Err(ApiError(StatusCode::NOT_FOUND, format!("no record for event {id:?}"))),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
    topic: Option<String>,
    /// Page size (`/v1/events` only).
    limit: Option<usize>,
    /// Cursor: records after this event id (`/v1/events` only).
    after: Option<String>,
}

impl ListQuery {
    /// `?state=`, or a 400 naming the states there are.
    fn state_filter(&self) -> Result<Option<RecordState>, ApiError> {
        self.state.as_deref().map(str::parse).transpose().map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))
    }
}

/// One page of records in id order: `{"records": [...], "next": ID | null}`.
/// `next` is set when more records follow; ask again with `?after=ID`.
async fn list(State(s): State<Shared>, Query(q): Query<ListQuery>) -> Result<Json<Value>, ApiError> {
    let state = q.state_filter()?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let store = s.exec.store.clone();
    // One more than the page tells whether there is a next page.
    let mut records =
        tokio::task::spawn_blocking(move || store.list_after(state, q.topic.as_deref(), q.after.as_deref(), limit + 1))
            .await
            .map_err(join_error)??;
    let next = if records.len() > limit {
        records.truncate(limit);
        records.last().map(crate::store::page_cursor)
    } else {
        None
    };
    let records: Vec<Value> = records.iter().map(view::record_json).collect();
    Ok(Json(json!({"records": records, "next": next})))
}

#[derive(Deserialize)]
struct IdQuery {
    id: String,
}

async fn forget(State(s): State<Shared>, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    let r = s.exec.store.forget(&q.id).await?;
    Ok(Json(view::record_json(&r)))
}

async fn resolve(State(s): State<Shared>, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    s.exec.store.resolve_done(&q.id, "resolved by hand: done".to_owned()).await?;
    record(&s.exec, &q.id)
}

async fn gc(State(s): State<Shared>) -> Result<Json<Value>, ApiError> {
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
            let line = view::export_line(&store, &r)?;
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

/// Runs a dead or parked event again from its stored copy, in the service,
/// and answers with the final record. The run is a task of its own: axum
/// drops this handler when the client goes away, and a re-execution dropped
/// between its claim and its outcome would leave the record `claimed`, with
/// no Kafka delivery left to finish it.
async fn retry(State(r): State<Arc<Retries>>, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    let turn = r.turns.clone().acquire_owned().await.expect("the retry semaphore is never closed");
    let exec = r.exec.clone();
    let run = tokio::spawn(async move {
        let _turn = turn;
        let answer = rerun(&exec, &q.id).await;
        if let Err(e) = &answer {
            tracing::warn!(event_id = %q.id, error = %e.1, "admin retry failed");
        }
        answer
    });
    run.await.map_err(join_error)?
}

async fn rerun(exec: &Executor, id: &str) -> Result<Json<Value>, ApiError> {
    match exec.rerun(id).await? {
        Some(r) => Ok(Json(view::record_json(&r))),
        None => Ok(Json(json!({"event_id": id, "state": "rerun", "note": "recorded under its decoded event id"}))),
    }
}
