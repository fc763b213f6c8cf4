//! `outboxd store …` talking to a running service through its admin API
//! (found in the store's owner file), so answers match a direct read. Answers
//! are read into the views of [`crate::wire`], the types the server
//! writes them from: a field missing from an answer is an error naming it.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::wire::{AuditPage, GcView, PageView, RecordView, ReplayView, RetryView, StatsView};

/// Records asked for per request when a list is paged through.
const DEFAULT_PAGE: usize = 1_000;

/// What went wrong asking a running service, as its caller may branch on it:
/// whether the service was reached, what status it answered, what it said.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// `OUTBOXD_ADMIN_PAGE_SIZE` is not a positive number.
    #[error("OUTBOXD_ADMIN_PAGE_SIZE={0:?}: not a positive number")]
    PageSize(String),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(reqwest::Error),
    /// The recorded address does not make a URL.
    #[error(transparent)]
    Address(#[from] url::ParseError),
    /// The recorded address makes a URL without a path (e.g. `mailto:`).
    #[error("bad admin address")]
    NotABase,
    /// The service could not be reached, or the connection broke.
    #[error("asking the running service at {base}")]
    Unreachable {
        /// The service's base URL.
        base: String,
        /// Why.
        #[source]
        error: reqwest::Error,
    },
    /// The service's answer is not JSON.
    #[error("reading the answer of {base}")]
    Unreadable {
        /// The service's base URL.
        base: String,
        /// Why.
        #[source]
        error: reqwest::Error,
    },
    /// The answer is JSON of another shape than this client reads: a field is
    /// missing, renamed or of another type (a service of another version?).
    #[error("unexpected answer from {base} to {request}")]
    Unexpected {
        /// The service's base URL.
        base: String,
        /// The request, e.g. `GET /v1/stats`.
        request: String,
        /// What does not fit.
        #[source]
        error: serde_json::Error,
    },
    /// The service refused or failed the request (e.g. 401 without an accepted token,
    /// 409 for a record in another state).
    #[error("{}", failure(*status, message))]
    Status {
        /// The HTTP status.
        status: u16,
        /// The `error` of the answer (`request failed` when it has none).
        message: String,
    },
    /// The service has no answer for a request that always has one (404 for stats or a list).
    #[error("no {0}")]
    Missing(&'static str),
    /// The service refused an export.
    #[error("export failed")]
    Export(#[source] Box<AdminError>),
    /// An export's stream broke off.
    #[error(transparent)]
    Stream(reqwest::Error),
    /// Writing an export out failed.
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// A client of a running service's store API (`/v1/*`), with the bearer token.
pub struct AdminClient {
    base: String,
    /// Never printed.
    token: Option<String>,
    /// Records per `/v1/events` request.
    page: usize,
    http: reqwest::Client,
}

impl AdminClient {
    /// `addr` as recorded by the service (`host:port`). The token is
    /// `OUTBOXD_ADMIN_TOKEN` when set (e.g. the `[admin] token` of a remote
    /// service), else `run_token`, the one the service wrote next to its
    /// address in the store's owner file. `OUTBOXD_ADMIN_PAGE_SIZE` sets how
    /// many records one list request asks for.
    ///
    /// No proxy is used, whatever `HTTP_PROXY`, `ALL_PROXY` or the system say: `addr`
    /// is the service's own listen address, and a proxy on the way would be given the
    /// bearer token.
    pub fn new(addr: &str, run_token: Option<String>) -> Result<AdminClient, AdminError> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .no_proxy()
            .build()
            .map_err(AdminError::Client)?;
        let token = std::env::var("OUTBOXD_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()).or(run_token);
        let page = match std::env::var("OUTBOXD_ADMIN_PAGE_SIZE") {
            Ok(v) => {
                v.trim().parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| AdminError::PageSize(v.clone()))?
            }
            Err(_) => DEFAULT_PAGE,
        };
        Ok(AdminClient { base: format!("http://{addr}"), token, page, http })
    }

    /// The service's base URL (`http://host:port`), for messages.
    pub fn address(&self) -> &str {
        &self.base
    }

    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends `req` (`request` names it in errors) and reads its answer as a `T`;
    /// `None` for a 404.
    async fn call<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        request: &str,
    ) -> Result<Option<T>, AdminError> {
        let base = &self.base;
        let resp =
            self.authorized(req).send().await.map_err(|error| AdminError::Unreachable { base: base.clone(), error })?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|error| AdminError::Unreadable { base: base.clone(), error })?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(status_error(status, &body));
        }
        serde_json::from_value(body).map(Some).map_err(|error| AdminError::Unexpected {
            base: base.clone(),
            request: request.to_owned(),
            error,
        })
    }

    /// `GET /v1/handlers`: each handler's circuit, as `outboxd store stats` shows them.
    pub async fn handlers(&self) -> Result<Vec<crate::engine::CircuitView>, AdminError> {
        let req = self.http.get(format!("{}/v1/handlers", self.base));
        self.call(req, "GET /v1/handlers").await?.ok_or(AdminError::Missing("handlers"))
    }

    /// `GET /v1/stats`: the store's statistics, as `outboxd store stats` shows them.
    pub async fn stats(&self) -> Result<StatsView, AdminError> {
        let req = self.http.get(format!("{}/v1/stats", self.base));
        self.call(req, "GET /v1/stats").await?.ok_or(AdminError::Missing("stats"))
    }

    /// `GET /v1/events/{id}`: the record of one event; `None` when there is none.
    pub async fn get(&self, id: &str) -> Result<Option<RecordView>, AdminError> {
        let mut url = url::Url::parse(&format!("{}/v1/events/", self.base))?;
        url.path_segments_mut().map_err(|()| AdminError::NotABase)?.pop_if_empty().extend(id.split('/'));
        self.call(self.http.get(url), "GET /v1/events/{id}").await
    }

    /// `GET /v1/events`: one page of up to `limit` records in id order after
    /// the cursor `after` (the service caps `limit`), with the cursor of the next.
    pub async fn page(
        &self,
        state: Option<&str>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PageView, AdminError> {
        let mut q = vec![("limit", limit.to_string())];
        q.extend(state.map(|s| ("state", s.to_owned())));
        q.extend(topic.map(|t| ("topic", t.to_owned())));
        q.extend(after.map(|a| ("after", a.to_owned())));
        let req = self.http.get(format!("{}/v1/events", self.base)).query(&q);
        self.call(req, "GET /v1/events").await?.ok_or(AdminError::Missing("list"))
    }

    /// Up to `limit` records in id order (`usize::MAX`: all of them), asked
    /// for page by page, each page starting after the last id of the one before.
    pub async fn list(
        &self,
        state: Option<&str>,
        topic: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RecordView>, AdminError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        while out.len() < limit {
            let page = self.page(state, topic, after.take().as_deref(), self.page.min(limit - out.len())).await?;
            out.extend(page.records);
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        Ok(out)
    }

    /// Streams `GET /v1/export` (JSON Lines) into `out`; returns the number of lines.
    pub async fn export(
        &self,
        state: Option<&str>,
        topic: Option<&str>,
        out: &mut impl std::io::Write,
        progress: &indicatif::ProgressBar,
    ) -> Result<u64, AdminError> {
        let mut q = Vec::new();
        if let Some(s) = state {
            q.push(("state", s));
        }
        if let Some(t) = topic {
            q.push(("topic", t));
        }
        let req =
            self.http.get(format!("{}/v1/export", self.base)).query(&q).timeout(std::time::Duration::from_secs(3600));
        let mut resp = self
            .authorized(req)
            .send()
            .await
            .map_err(|error| AdminError::Unreachable { base: self.base.clone(), error })?;
        let status = resp.status();
        if !status.is_success() {
            let body: Value = resp.json().await.unwrap_or_default();
            return Err(AdminError::Export(Box::new(status_error(status, &body))));
        }
        let mut lines = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(AdminError::Stream)? {
            lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
            out.write_all(&chunk)?;
            progress.set_position(lines);
        }
        Ok(lines)
    }

    /// `POST /v1/{op}?id=…&reason=…`, a repair of one event (audited under this
    /// client's credential, with `reason`); `None` when there is no record of it.
    async fn repair<T: DeserializeOwned>(
        &self,
        op: &str,
        id: &str,
        reason: Option<&str>,
    ) -> Result<Option<T>, AdminError> {
        let mut q = vec![("id", id)];
        q.extend(reason.map(|r| ("reason", r)));
        let req = self.http.post(format!("{}/v1/{op}", self.base)).query(&q);
        self.call(req, &format!("POST /v1/{op}")).await
    }

    /// `POST /v1/forget`: removes the record; answers it as it was.
    pub async fn forget(&self, id: &str, reason: Option<&str>) -> Result<Option<RecordView>, AdminError> {
        self.repair("forget", id, reason).await
    }

    /// `POST /v1/resolve`: records the event done by hand; answers its record as it is now.
    pub async fn resolve(&self, id: &str, reason: Option<&str>) -> Result<Option<RecordView>, AdminError> {
        self.repair("resolve", id, reason).await
    }

    /// `POST /v1/retry`: runs the event again in the service; answers what it came to.
    pub async fn retry(&self, id: &str, reason: Option<&str>) -> Result<Option<RetryView>, AdminError> {
        self.repair("retry", id, reason).await
    }

    /// `POST /v1/replay`: runs the final event of record `id` in `scope` again in the
    /// service, from its source message; answers what it came to.
    pub async fn replay(
        &self,
        id: &str,
        scope: &str,
        new_key: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Option<ReplayView>, AdminError> {
        let mut q = vec![("id", id), ("scope", scope)];
        q.extend(new_key.map(|k| ("new_key", k)));
        q.extend(reason.map(|r| ("reason", r)));
        let req = self.http.post(format!("{}/v1/replay", self.base)).query(&q);
        self.call(req, "POST /v1/replay").await
    }

    /// `POST /v1/gc`: removes expired records now; answers how many.
    pub async fn gc(&self, reason: Option<&str>) -> Result<GcView, AdminError> {
        let q: Vec<(&str, &str)> = reason.map(|r| ("reason", r)).into_iter().collect();
        let req = self.http.post(format!("{}/v1/gc", self.base)).query(&q);
        self.call(req, "POST /v1/gc").await?.ok_or(AdminError::Missing("gc answer"))
    }

    /// `GET /v1/audit`: up to `limit` audit entries, newest first, older than the
    /// cursor `before`, or (with `id`) every entry naming that event.
    pub async fn audit(&self, before: Option<&str>, id: Option<&str>, limit: usize) -> Result<AuditPage, AdminError> {
        let mut q = vec![("limit", limit.to_string())];
        q.extend(before.map(|b| ("before", b.to_owned())));
        q.extend(id.map(|i| ("id", i.to_owned())));
        let req = self.http.get(format!("{}/v1/audit", self.base)).query(&q);
        self.call(req, "GET /v1/audit").await?.ok_or(AdminError::Missing("audit"))
    }
}

/// The error of an answer with a failure status: its `error`, or `request failed`.
fn status_error(status: reqwest::StatusCode, body: &Value) -> AdminError {
    let message = body.get("error").and_then(Value::as_str).unwrap_or("request failed").to_owned();
    AdminError::Status { status: status.as_u16(), message }
}

/// `401 Unauthorized: missing credential: …`, with a hint for a 401 that the
/// caller can act on.
fn failure(status: u16, message: &str) -> String {
    let hint = if status == reqwest::StatusCode::UNAUTHORIZED.as_u16() {
        " (run as the user running outboxd, who can read the store's owner file, or set OUTBOXD_ADMIN_TOKEN)"
    } else {
        ""
    };
    // `401 Unauthorized`: the number with its reason, as the status was answered.
    let status = reqwest::StatusCode::from_u16(status).map_or_else(|_| status.to_string(), |s| s.to_string());
    format!("{status}: {message}{hint}")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The child process's admin address (see the test below).
    const CHILD_ADMIN: &str = "OUTBOXD_TEST_ADMIN_BEHIND_A_PROXY";
    const TOKEN: &str = "run-token-of-this-test";

    /// Proxy variables are read when a client is built, and a process's environment is
    /// shared by every test running in it: the client is built in a child process (this
    /// test binary, running only [`as_the_child_asks_the_admin_address`]), with every
    /// proxy variable pointing at a listener that counts the connections it gets.
    #[tokio::test]
    async fn a_proxy_in_the_environment_never_sees_the_admin_request_or_its_token() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
        let proxied = Arc::new(Mutex::new(0usize));
        let count = proxied.clone();
        tokio::spawn(async move {
            while let Ok((connection, _)) = proxy.accept().await {
                *count.lock().unwrap() += 1;
                drop(connection);
            }
        });
        let tokens = Arc::new(Mutex::new(Vec::new()));
        let seen = tokens.clone();
        let admin = axum::Router::new().route(
            "/v1/handlers",
            axum::routing::get(move |headers: axum::http::HeaderMap| async move {
                let auth = headers.get("authorization").map(|v| v.to_str().unwrap_or_default().to_owned());
                seen.lock().unwrap().push(auth);
                axum::Json(serde_json::json!([]))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, admin).await });

        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap());
        child.args(["--exact", "ops::client::tests::as_the_child_asks_the_admin_address", "--nocapture"]);
        child.env(CHILD_ADMIN, addr.to_string());
        for var in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
            child.env(var, &proxy_url);
        }
        for var in ["NO_PROXY", "no_proxy", "OUTBOXD_ADMIN_TOKEN", "OUTBOXD_ADMIN_PAGE_SIZE"] {
            child.env_remove(var);
        }
        let out = child.output().await.unwrap();
        let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(*proxied.lock().unwrap(), 0, "the proxy was asked:\n{output}");
        assert!(output.contains("1 passed"), "the child ran its test:\n{output}");
        assert!(out.status.success(), "the admin server did not answer:\n{output}");
        assert_eq!(*tokens.lock().unwrap(), [Some(format!("Bearer {TOKEN}"))], "one request, with the token");
    }

    /// The child's part of the test above; without its variable, nothing to do.
    #[tokio::test]
    async fn as_the_child_asks_the_admin_address() {
        let Ok(addr) = std::env::var(CHILD_ADMIN) else { return };
        let client = AdminClient::new(&addr, Some(TOKEN.to_owned())).unwrap();
        let handlers = client.handlers().await.unwrap_or_else(|e| panic!("{:#}", anyhow::Error::from(e)));
        assert!(handlers.is_empty());
    }
}
