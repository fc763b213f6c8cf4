//! The operators' console at `/ui`: server-rendered pages (askama templates,
//! checked when outboxd is built) with htmx for live parts, every asset embedded.
//!
//! - `console`: what every handler works with, and who is looking (the session's viewer);
//! - `session`: logins, the cookie and its life;
//! - `pages`: the overview, events (filters, groups of dead events), one event, the audit;
//! - `actions`: retry / resolve / forget with their impact shown first, and bulk runs (`jobs`);
//! - `replay`: a window of final events run again from Kafka, its impact shown first, as a job;
//! - `assets`: htmx and the style sheet, served from the binary;
//! - `format`: times in UTC with relative hints, sizes, the bits of text templates share.
//!
//! Security, in the order a request meets it ([`guard`]): every answer carries a strict CSP
//! (no inline script, nothing from elsewhere), `frame-ancestors 'none'`, nosniff and
//! `no-referrer`; the `Host` must be one this server answers to (as for `/v1`); a
//! request that changes something must come from a page of this origin (`Sec-Fetch-Site`
//! or `Origin`, because `SameSite` ignores ports); and every page but the login needs a
//! live session, whose cookie is `HttpOnly`, `SameSite=Strict`, `Path=/ui`.

mod actions;
mod assets;
mod console;
mod format;
mod jobs;
mod pages;
mod replay;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

use super::auth::{Credential, Guard};
pub use console::Console;
use console::{session_cookie, Shared};
use session::COOKIE;

/// The console's content security policy: scripts, styles and images from this
/// server only, no inline script or style, no `eval`, no framing, forms post here only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, to be nested at `/ui`.
pub fn router(console: Console) -> Router {
    let state = Arc::new(console);
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/overview") }))
        .route("/login", get(pages::login_page).post(login))
        .route("/logout", post(logout))
        .route("/overview", get(pages::overview))
        .route("/overview/live", get(pages::overview_live))
        .route("/events", get(pages::events))
        .route("/groups", get(pages::groups))
        .route("/event/{*id}", get(pages::event))
        .route("/audit", get(pages::audit))
        .route("/actions/preview", get(actions::preview))
        .route("/actions/run", post(actions::run))
        .route("/replay", get(replay::page))
        .route("/replay/run", post(replay::run))
        .route("/jobs/{id}", get(actions::job))
        .route("/jobs/{id}/progress", get(actions::job_progress))
        .route("/assets/{name}", get(assets::serve))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The checks every console request passes, and the headers every answer carries.
async fn guard(State(c): State<Shared>, req: Request, next: Next) -> Response {
    let refused = refusal(&c.guard, req.method(), req.headers());
    let mut resp = match refused {
        Some(why) => {
            tracing::warn!(path = req.uri().path(), reason = why, "console request refused");
            (StatusCode::FORBIDDEN, why).into_response()
        }
        None => next.run(req).await,
    };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    resp
}

/// Why a request is refused, if it is: a `Host` this server does not answer to
/// (DNS rebinding), or a change asked for by a page of another origin.
fn refusal(guard: &Guard, method: &Method, headers: &HeaderMap) -> Option<&'static str> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let Some(host) = host.filter(|h| guard.host_allowed(h)) else {
        return Some("unexpected Host header: open the console at the listen address, localhost or 127.0.0.1, or add the name to [admin] allowed_hosts");
    };
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let same_origin = match (site, origin) {
        (Some(site), _) => site.eq_ignore_ascii_case("same-origin"),
        (None, Some(origin)) => {
            origin.eq_ignore_ascii_case(&format!("http://{host}"))
                || origin.eq_ignore_ascii_case(&format!("https://{host}"))
        }
        (None, None) => false,
    };
    (!same_origin).then_some("a console action must come from a console page of this server (Sec-Fetch-Site or Origin)")
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
}

/// A login: the token checked in constant time against every credential. Only a
/// wrong token counts against the limits on failed credentials (`[admin]
/// failures_per_address`, `failures_total`, shared with the store API); a right one
/// is let in whatever others tried from the same address.
async fn login(
    State(c): State<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Form(f): Form<LoginForm>,
) -> Response {
    let page = |error: &str| pages::LoginPage { error: Some(error.to_owned()), next: f.next.clone() };
    let Some(credential): Option<Credential> = c.guard.credential_for(f.token.trim()) else {
        return match c.guard.failed(peer.ip()) {
            Ok(()) => {
                tracing::warn!(client = %peer.ip(), "console login refused: wrong token");
                (StatusCode::UNAUTHORIZED, page("That token is not accepted.")).into_response()
            }
            Err(_) => (StatusCode::TOO_MANY_REQUESTS, page("Too many wrong tokens; wait a minute.")).into_response(),
        };
    };
    let Ok(id) = c.sessions.start(&credential, Instant::now()) else {
        tracing::warn!(who = %credential.name, client = %peer.ip(), "console login refused: every session belongs to credentials with more access");
        let full = "Every console session is taken by operators; wait until one logs out or is idle.";
        return (StatusCode::SERVICE_UNAVAILABLE, page(full)).into_response();
    };
    tracing::info!(who = %credential.name, client = %peer.ip(), "console login");
    let secure = if c.config.secure_cookie { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        c.config.session_max.as_secs()
    );
    // Only a console page is a place to go on to (no open redirect).
    let next = if f.next.starts_with("/ui/") && !f.next.starts_with("/ui//") { f.next } else { "/ui/overview".into() };
    ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
}

async fn logout(State(c): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        c.sessions.end(id);
    }
    let cookie = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response()
}

#[cfg(test)]
mod tests;
