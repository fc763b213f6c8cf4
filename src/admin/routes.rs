//! The store API under `/v1`: reads (stats, one record, pages of records,
//! export, the audit) and repairs (forget, resolve, retry, gc), answered by
//! [`ops::Local`] on the service's store. Every route here sits behind
//! [`super::auth::check`]; none checks credentials itself: a repair is audited
//! under the [`Credential`] that layer found, with the request's `reason=`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::auth::Credential;
use super::error::ApiError;
use super::reads::Reads;
use crate::config::AdminLimits;
use crate::engine::Executor;
use crate::ops::{self, Actor, Local, OpsError};
use crate::store::{State as RecordState, StoreError};
use crate::wire::{AuditPage, GcView, PageView, RecordView, ReplayView, RetryView, StatsView};

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
    /// Reads replayed events' messages again from Kafka (`/v1/replay`).
    rereads: ops::Rereads,
    /// One permit per running admin retry, held by its task until it ends.
    turns: Arc<Semaphore>,
}

/// What the reads of the store API work with.
#[derive(Clone)]
struct Api {
    local: Local,
    reads: Reads,
    /// How long one export may stream (`[admin] export_timeout`).
    export_timeout: Duration,
    /// Records one page examines at most (`[admin] read_budget`).
    read_budget: usize,
}

pub(super) fn router(exec: Arc<Executor>, reads: Reads, limits: &AdminLimits) -> Router {
    let local = Api {
        local: Local::with_executor(exec.clone()),
        reads,
        export_timeout: limits.export_timeout,
        read_budget: limits.read_budget,
    };
    let circuits = exec.circuits().clone();
    let retries = Arc::new(Retries { exec, rereads: ops::Rereads::default(), turns: Arc::new(Semaphore::new(MAX_ADMIN_RETRIES)) });
    Router::new()
        .route(
            "/handlers",
            get(move || async move { Json(circuits.all().iter().map(|c| c.view()).collect::<Vec<_>>()) }),
        )
        .route("/stats", get(stats))
        .route("/events", get(list))
        .route("/events/{*id}", get(get_event))
        .route("/forget", post(forget))
        .route("/resolve", post(resolve))
        .route("/retry", post(retry).with_state(retries.clone()))
        .route("/replay", post(replay).with_state(retries))
        .route("/gc", post(gc))
        .route("/export", get(export))
        .route("/audit", get(audit))
        .with_state(local)
}

fn join_error(e: tokio::task::JoinError) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

async fn stats(State(a): State<Api>) -> Result<Json<StatsView>, ApiError> {
    let l = a.local;
    Ok(Json(a.reads.run(move || l.stats()).await.map_err(join_error)??))
}

async fn get_event(State(a): State<Api>, Path(id): Path<String>) -> Result<Json<RecordView>, ApiError> {
    let (l, key) = (a.local, id.clone());
    found(&id, a.reads.run(move || l.get(&key)).await.map_err(join_error)??)
}

/// The record, or a 404 naming the event.
fn found(id: &str, record: Option<RecordView>) -> Result<Json<RecordView>, ApiError> {
    match record {
        Some(r) => Ok(Json(r)),
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
        let parsed = self.state.as_deref().map(str::parse::<RecordState>).transpose();
        parsed.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))
    }
}

/// One page of records in id order: `{"records": [...], "next": ID | null, "partial": bool}`.
/// `next` is set when more records may follow; ask again with `?after=ID`. A page
/// that examined `[admin] read_budget` records before it was full stops there
/// (`partial`): a filter that matches little is read a page at a time, never all at once.
async fn list(State(a): State<Api>, Query(q): Query<ListQuery>) -> Result<Json<PageView>, ApiError> {
    let state = q.state_filter()?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let (l, budget) = (a.local, a.read_budget);
    let page = a
        .reads
        .run(move || l.page_within(state, q.topic.as_deref(), q.after.as_deref(), limit, Some(budget)))
        .await
        .map_err(join_error)??;
    Ok(Json(page))
}

#[derive(Deserialize)]
struct IdQuery {
    id: String,
    /// Why, for the audit (at most `ops::MAX_REASON_CHARS`).
    reason: Option<String>,
}

/// `/v1/replay`: the record (its event id and dedup scope), and a new key's token.
#[derive(Deserialize)]
struct ReplayQuery {
    id: String,
    scope: String,
    /// `--new-key`: the token of the replay's new idempotency keys (`ops::new_key_suffix`).
    new_key: Option<String>,
    /// Why, for the audit.
    reason: Option<String>,
}

#[derive(Deserialize)]
struct ReasonQuery {
    reason: Option<String>,
}

/// Who makes a repair: the request's credential, with its `reason=`; a 400 for a
/// reason too long to keep.
fn actor(credential: &Credential, reason: Option<&str>) -> Result<Actor, ApiError> {
    Actor::new(&credential.name, reason).map_err(|e: OpsError| ApiError(StatusCode::BAD_REQUEST, e.to_string()))
}

/// Runs a repair as a task of its own and waits for it: axum drops a handler whose
/// client went away, and a repair dropped halfway (after the changelog took it,
/// before the local write or the audit entry) would be made without its entry.
async fn to_the_end<T: Send + 'static>(
    repair: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, ApiError> {
    Ok(tokio::spawn(repair).await.map_err(join_error)??)
}

async fn forget(
    State(Api { local: l, .. }): State<Api>,
    Extension(who): Extension<Credential>,
    Query(q): Query<IdQuery>,
) -> Result<Json<RecordView>, ApiError> {
    let actor = actor(&who, q.reason.as_deref())?;
    Ok(Json(to_the_end(async move { l.forget_by(&q.id, &actor).await }).await?))
}

async fn resolve(
    State(Api { local: l, .. }): State<Api>,
    Extension(who): Extension<Credential>,
    Query(q): Query<IdQuery>,
) -> Result<Json<RecordView>, ApiError> {
    let actor = actor(&who, q.reason.as_deref())?;
    let id = q.id.clone();
    let record = to_the_end(async move { l.resolve_done_by(&id, &actor).await }).await?;
    found(&q.id, record)
}

async fn gc(
    State(Api { local: l, .. }): State<Api>,
    Extension(who): Extension<Credential>,
    Query(q): Query<ReasonQuery>,
) -> Result<Json<GcView>, ApiError> {
    let actor = actor(&who, q.reason.as_deref())?;
    Ok(Json(to_the_end(async move { l.gc_by(&actor).await }).await?))
}

/// Entries in one page of `/v1/audit` when the request names no `limit`.
const DEFAULT_AUDIT_PAGE: usize = 100;
/// Largest page of `/v1/audit` (an entry is ~0.3 kB of JSON, its reason included).
const MAX_AUDIT_PAGE: usize = 1_000;

#[derive(Deserialize)]
struct AuditQuery {
    /// Cursor: entries older than this (an earlier page's `next`).
    before: Option<String>,
    limit: Option<usize>,
    /// Only the entries naming this event (all of them, on one page).
    id: Option<String>,
}

/// The audit, newest first: `{"entries": [...], "next": CURSOR | null}`; ask for
/// the next (older) page with `?before=CURSOR`. With `?id=`, every entry naming
/// that event.
async fn audit(State(a): State<Api>, Query(q): Query<AuditQuery>) -> Result<Json<AuditPage>, ApiError> {
    let l = a.local;
    let limit = q.limit.unwrap_or(DEFAULT_AUDIT_PAGE).clamp(1, MAX_AUDIT_PAGE);
    let page = a
        .reads
        .run(move || match &q.id {
            Some(id) => l.audit_of(id).map(|entries| AuditPage { entries, next: None }),
            None => l.audit(q.before.as_deref(), limit),
        })
        .await
        .map_err(join_error)??;
    Ok(Json(page))
}

/// JSON Lines of records (with message copies), streamed while the store is scanned,
/// for at most `[admin] export_timeout`: a client that reads slowly, or not at all,
/// holds a store read turn (and its blocking thread) no longer than that, and past it
/// the stream ends with an error, so that the client knows the export is not whole.
async fn export(State(a): State<Api>, Query(q): Query<ListQuery>) -> Result<Response, ApiError> {
    let state = q.state_filter()?;
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(EXPORT_BUFFER);
    let (l, within, reads) = (a.local, a.export_timeout, a.reads);
    let deadline = tokio::time::Instant::now() + within;
    // Why the scan ended early, if it did: the stream ends with it as an error.
    let failed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let failure = failed.clone();
    let scan = async move {
        reads
            .run(move || {
                let runtime = tokio::runtime::Handle::current();
                let sent = l.export(state, q.topic.as_deref(), |line| -> Result<(), StoreError> {
                    match runtime.block_on(tokio::time::timeout_at(deadline, tx.send(format!("{line}\n")))) {
                        Ok(Ok(())) => Ok(()),
                        // The client went away: nobody to tell.
                        Ok(Err(_)) => Err(StoreError::NotFound("export client".into())),
                        Err(_) => Err(StoreError::Io(std::io::Error::other(format!(
                    "the export took longer than admin.export_timeout ({}); export less at a time (--state, --topic)",
                    humantime::format_duration(within)
                )))),
                    }
                });
                if let Err(e) = sent {
                    *failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.to_string());
                }
            })
            .await
    };
    tokio::spawn(scan);
    let stream = futures::stream::unfold(Some(rx), move |rx| {
        let failed = failed.clone();
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(line) => Some((Ok(line), Some(rx))),
                None => {
                    let why = failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                    why.map(|why| (Err(std::io::Error::other(why)), None))
                }
            }
        }
    });
    Ok(([("content-type", "application/x-ndjson")], axum::body::Body::from_stream(stream)).into_response())
}

/// Runs the final event of a record again from its source message, read again
/// from Kafka, in the service (`outboxd store replay`), and answers what it came
/// to. A task of its own, taking turns with retries, as [`retry`] says.
async fn replay(
    State(r): State<Arc<Retries>>,
    Extension(who): Extension<Credential>,
    Query(q): Query<ReplayQuery>,
) -> Result<Json<ReplayView>, ApiError> {
    let actor = actor(&who, q.reason.as_deref())?;
    let suffix = q.new_key.as_deref().map(ops::new_key_suffix).transpose()?;
    let turn = r.turns.clone().acquire_owned().await.expect("the retry semaphore is never closed");
    let run = tokio::spawn(async move {
        let _turn = turn;
        let answer = ops::replay_by(&r.exec, &r.rereads, &q.scope, &q.id, suffix.as_deref(), &actor).await;
        if let Err(e) = &answer {
            tracing::warn!(event_id = %q.id, scope = %q.scope, error = %e, "admin replay failed");
        }
        answer.map(Json).map_err(ApiError::from)
    });
    run.await.map_err(join_error)?
}

/// Runs a dead or parked event again from its stored copy, in the service,
/// and answers with the final record. The run is a task of its own: axum
/// drops this handler when the client goes away, and a re-execution dropped
/// between its claim and its outcome would leave the record `claimed`, with
/// no Kafka delivery left to finish it.
async fn retry(
    State(r): State<Arc<Retries>>,
    Extension(who): Extension<Credential>,
    Query(q): Query<IdQuery>,
) -> Result<Json<RetryView>, ApiError> {
    let actor = actor(&who, q.reason.as_deref())?;
    let turn = r.turns.clone().acquire_owned().await.expect("the retry semaphore is never closed");
    let exec = r.exec.clone();
    let run = tokio::spawn(async move {
        let _turn = turn;
        let answer = ops::rerun_by(&exec, &q.id, &actor).await.map_err(ApiError::from);
        if let Err(e) = &answer {
            tracing::warn!(event_id = %q.id, error = %e.1, "admin retry failed");
        }
        answer.map(|r| Json(r.to_view(&q.id)))
    });
    run.await.map_err(join_error)?
}
