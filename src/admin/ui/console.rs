//! What the console works with ([`Console`], shared by every handler) and who is
//! looking ([`Viewer`], from the session cookie).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use super::super::auth::Guard;
use super::super::reads::Reads;
use super::jobs;
use super::session::{Session, Sessions, COOKIE};
use crate::config::UiConfig;
use crate::engine::Executor;
use crate::ops::Local;

/// What the console works with.
pub struct Console {
    pub(super) exec: Arc<Executor>,
    pub(super) local: Local,
    pub(super) tracker: crate::offsets::Tracker,
    pub(super) broker: Arc<crate::kafka::BrokerHealth>,
    pub(super) guard: Arc<Guard>,
    pub(super) sessions: Sessions,
    /// Turns for store reads, shared with the store API (`[admin] max_reads`).
    pub(super) reads: Reads,
    pub(super) jobs: jobs::Jobs,
    /// Reads replayed events' messages again from Kafka.
    pub(super) rereads: crate::ops::Rereads,
    /// The client that describes the group, made when the overview is first shown
    /// (`None` when it could not be made), and the last description with when it
    /// was fetched ([`pages::MEMBERS_FOR`]).
    pub(super) group: std::sync::OnceLock<Option<Arc<crate::kafka::Group>>>,
    pub(super) members: tokio::sync::Mutex<Option<(Instant, Result<crate::kafka::GroupView, String>)>>,
    /// Each handler's calls when the overview was last rendered, for its rate.
    last_calls: std::sync::Mutex<Option<(Instant, Vec<u64>)>>,
    pub(super) config: UiConfig,
    /// When this process started, and the address the admin server listens on.
    pub(super) started: SystemTime,
    pub(super) listen: SocketAddr,
}

/// The console's state, as every handler gets it.
pub(super) type Shared = Arc<Console>;

impl Console {
    pub fn new(
        exec: Arc<Executor>,
        tracker: crate::offsets::Tracker,
        broker: Arc<crate::kafka::BrokerHealth>,
        guard: Arc<Guard>,
        listen: SocketAddr,
        reads: Reads,
    ) -> Console {
        let config = exec.config.admin.ui.clone();
        Console {
            local: Local::with_executor(exec.clone()),
            tracker,
            broker,
            guard,
            sessions: Sessions::new(&config),
            reads,
            jobs: jobs::Jobs::default(),
            rereads: crate::ops::Rereads::default(),
            group: std::sync::OnceLock::new(),
            members: tokio::sync::Mutex::new(None),
            last_calls: std::sync::Mutex::new(None),
            exec,
            config,
            started: SystemTime::now(),
            listen,
        }
    }
}

impl Console {
    /// Calls per second of each handler since the last time this was asked (`None`
    /// the first time, or when asked again within a second).
    pub(super) fn rates(&self, calls: &[(String, u64, u64)]) -> Vec<Option<f64>> {
        let now = Instant::now();
        let counts: Vec<u64> = calls.iter().map(|(_, n, _)| *n).collect();
        let mut last = self.last_calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let rates = match last.as_ref() {
            Some((at, before)) if now.duration_since(*at).as_secs_f64() >= 1.0 && before.len() == counts.len() => {
                let secs = now.duration_since(*at).as_secs_f64();
                counts.iter().zip(before).map(|(n, b)| Some(n.saturating_sub(*b) as f64 / secs)).collect()
            }
            _ => vec![None; counts.len()],
        };
        if rates.iter().any(Option::is_some) || last.is_none() {
            *last = Some((now, counts));
        }
        rates
    }
}

/// The session cookie's value, if the request carries one.
pub(super) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == COOKIE).then_some(v))
}

/// The logged-in person of a request; without a live session, a page answers
/// with the login page (htmx requests get `HX-Redirect`, so the whole page goes there).
/// The request counts as the person's use of the session.
pub struct Viewer(pub Session);

/// The logged-in person of a page's own polling (the overview's live part, a job's
/// progress): like [`Viewer`], but the request does not keep the session alive.
pub struct Poller;

impl FromRequestParts<Shared> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, c: &Shared) -> Result<Viewer, Response> {
        let session = session_cookie(&parts.headers).and_then(|id| c.sessions.touch(id, Instant::now()));
        session.map(Viewer).ok_or_else(|| to_login(parts))
    }
}

impl FromRequestParts<Shared> for Poller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, c: &Shared) -> Result<Poller, Response> {
        let session = session_cookie(&parts.headers).and_then(|id| c.sessions.look(id, Instant::now()));
        session.map(|_| Poller).ok_or_else(|| to_login(parts))
    }
}

/// Where a request without a live session goes: the login page, which comes back here.
fn to_login(parts: &Parts) -> Response {
    if parts.headers.contains_key("hx-request") {
        return (StatusCode::UNAUTHORIZED, [("hx-redirect", "/ui/login")], "log in again").into_response();
    }
    // The nested router sees its own part of the path; the original is the page's address.
    let original = parts.extensions.get::<axum::extract::OriginalUri>().map(|u| &u.0);
    let here = original.and_then(|u| u.path_and_query()).map_or("/ui/overview", |p| p.as_str());
    let next = format!("/ui/login?next={}", url::form_urlencoded::byte_serialize(here.as_bytes()).collect::<String>());
    Redirect::to(&next).into_response()
}
