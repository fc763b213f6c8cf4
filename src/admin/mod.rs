//! The admin HTTP server of a running outboxd: `/healthz`, `/readyz`,
//! `/metrics` (Prometheus), open to anyone who can reach the port, and the
//! store API (`/v1/*`, `routes`) that `outboxd store …` uses while the
//! service holds the database, behind one layer (`auth`) that requires a
//! bearer token and refuses browsers and foreign `Host` headers; and the
//! operators' console (`/ui`, `ui`), behind a login of its own. axum is
//! used only here (and in the demo receiver).

mod auth;
mod error;
mod failures;
mod listener;
mod reads;
mod routes;
mod ui;

pub use auth::{Access, Credential};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::metrics::names;

use crate::engine::Executor;

/// What the admin endpoints look at.
pub struct AdminState {
    /// The service's executor: its store answers the store API, `store retry` runs through it.
    pub exec: Arc<Executor>,
    /// The consumer's offset tracker: assigned, stalled and in-flight counts.
    pub tracker: crate::offsets::Tracker,
    /// Set once the engine stopped taking events (`/readyz` answers 503).
    pub draining: Arc<AtomicBool>,
    /// Whether the brokers are reachable, as the consumer's errors, statistics and
    /// assignments (and start-up's requests) said.
    pub broker: Arc<crate::kafka::BrokerHealth>,
    /// A partition whose events wait longer than this without its offset moving is stalled.
    pub stall_timeout: std::time::Duration,
    /// Renders `/metrics`; `None` when the embedding program records metrics
    /// itself ([`crate::App::own_metrics`]): `/metrics` then answers 404.
    pub prometheus: Option<PrometheusHandle>,
    /// `[admin] token`: accepted by the store API besides this run's token.
    pub token: Option<String>,
}

type Shared = Arc<AdminState>;

/// The admin address cannot be listened on (taken, or not this host's).
#[derive(Debug, thiserror::Error)]
#[error("admin.listen: cannot listen on {addr}: {error} (set [admin] listen to another port, or \"off\")")]
pub struct BindError {
    /// `[admin] listen`.
    pub addr: SocketAddr,
    /// What the system said (part of the message, not a separate cause).
    pub error: std::io::Error,
}

/// Binds the listener (so a taken port fails start-up, not later).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|error| BindError { addr, error })
}

/// Serves until `shutdown`. The store API accepts `[admin] token` (the credential
/// `admin`), the `[[admin.tokens]]` (by their names) and the token the store wrote
/// into its owner file with the admin address (`local`,
/// [`crate::store::Store::advertise_admin`]); with none, it refuses everything.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let run_token = state.exec.store.admin_token();
    if run_token.is_none() && state.token.is_none() && state.exec.config.admin.tokens.is_empty() {
        tracing::warn!("no admin token: the store API (/v1) refuses every request (the owner file could not be written and neither [admin] token nor [[admin.tokens]] is set)");
    }
    let admin = &state.exec.config.admin;
    let operate = |name: &str| Credential::new(name, Access::Operate);
    let tokens = (state.token.clone().into_iter().map(|t| (t, operate(crate::config::ADMIN_TOKEN_NAME))))
        .chain(admin.tokens.iter().map(|t| (t.token.clone(), Credential::new(&t.name, t.access))))
        .chain(run_token.map(|t| (t, operate(crate::config::RUN_TOKEN_NAME))));
    let listen = listener.local_addr()?;
    let limits = admin.limits;
    let failures = failures::Failures::new(limits.failures_per_address, limits.failures_total);
    let local = crate::ops::Local::with_executor(state.exec.clone());
    let guard = Arc::new(auth::Guard::new(tokens, listen, &admin.allowed_hosts, failures).auditing(local));
    let reads = reads::Reads::new(limits.max_reads);
    let state = Arc::new(state);
    let api = routes::router(state.exec.clone(), reads.clone(), &limits)
        .layer(axum::middleware::from_fn_with_state(guard.clone(), auth::check));
    let mut app = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state.clone())
        .nest("/v1", api);
    if state.exec.config.admin.ui.enabled {
        let console =
            ui::Console::new(state.exec.clone(), state.tracker.clone(), state.broker.clone(), guard, listen, reads);
        app = app.nest("/ui", ui::router(console));
    }
    let request_timeout = limits.request_timeout;
    let app = app
        .layer(axum::middleware::from_fn(move |req, next| answer_within(request_timeout, req, next)))
        .layer(axum::extract::DefaultBodyLimit::max(usize::try_from(limits.max_body).unwrap_or(usize::MAX)));
    let connections = listener::Limits {
        max_connections: limits.max_connections,
        header_timeout: limits.header_timeout,
        max_age: limits.max_connection_age,
    };
    listener::serve(listener, app, connections, shutdown).await
}

/// Answers 503 when a request's answer is not ready within `limit` (`[admin]
/// request_timeout`): its handler is dropped (a repair runs to its end in a task of its
/// own, see `routes::to_the_end`). A streamed body (an export) has its own deadline.
async fn answer_within(
    limit: std::time::Duration,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path().to_owned();
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            metrics::counter!(names::ADMIN_LIMITED, "reason" => "request_timeout").increment(1);
            tracing::warn!(%path, ?limit, "admin request not answered within admin.request_timeout");
            let why = format!("not answered within admin.request_timeout ({})", humantime::format_duration(limit));
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": why}))).into_response()
        }
    }
}

/// Ready: the store works, a broker is reachable, the group has made this
/// instance a member (with partitions or, as a spare, none: a rolling update with
/// more replicas than partitions must go on), nothing is being restored or stalls,
/// and it is not draining. A handler whose receiver is down (its circuit open) is
/// named under `degraded` but does not make the instance unready: restarting
/// outboxd does not heal a receiver, and a rollout that waits for it would stop.
async fn readyz(State(s): State<Shared>) -> Response {
    let (partitions, member, stalled, restoring) = {
        let tracker = s.tracker.lock();
        let restoring: Vec<String> = tracker.restoring().iter().map(|(p, _)| p.to_string()).collect();
        let stalled = tracker.stalled(std::time::Instant::now(), s.stall_timeout);
        (tracker.assigned(), tracker.joined(), stalled, restoring)
    };
    let brokers = s.broker.status();
    let broker = brokers.state == crate::kafka::Reachability::Reachable;
    let draining = s.draining.load(Ordering::Relaxed);
    let store_ok = !s.exec.stopped();
    // A partition being restored handles nothing yet: not ready (a rolling deploy waits).
    let ready = store_ok && broker && member && !draining && stalled.is_empty() && restoring.is_empty();
    let stalled: Vec<String> = stalled.iter().map(ToString::to_string).collect();
    let circuits = s.exec.circuits();
    // States and counts only: why a receiver failed is for credentials (`/v1/handlers`).
    let handlers: Vec<_> = circuits.all().iter().map(|c| c.summary()).collect();
    let broker_state = json!({"reachable": broker, "state": brokers.state.as_str(),
        "since": humantime::format_rfc3339_millis(brokers.since).to_string(), "errors": brokers.errors});
    let body = json!({"ready": ready, "store": store_ok, "broker": broker, "broker_state": broker_state,
        "member": member, "partitions": partitions, "draining": draining, "stalled": stalled,
        "restoring": restoring, "degraded": circuits.degraded(), "handlers": handlers});
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

async fn metrics(State(s): State<Shared>) -> Response {
    let in_flight = s.tracker.lock().unfinished();
    metrics::gauge!(names::IN_FLIGHT).set(in_flight as f64);
    s.exec.circuits().refresh_metrics();
    match &s.prometheus {
        Some(prometheus) => prometheus.render().into_response(),
        None => {
            (StatusCode::NOT_FOUND, "metrics go to the recorder of the program that embeds outboxd\n").into_response()
        }
    }
}
