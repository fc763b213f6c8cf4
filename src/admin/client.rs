//! `outboxd store …` talking to a running service through its admin API
//! (found in the store's owner file), so answers match a direct read.

use anyhow::{bail, Context};
use serde_json::Value;

/// Records asked for per request when a list is paged through.
const DEFAULT_PAGE: usize = 1_000;

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
    pub fn new(addr: &str, run_token: Option<String>) -> anyhow::Result<AdminClient> {
        let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(60)).build()?;
        let token = std::env::var("OUTBOXD_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()).or(run_token);
        let page = match std::env::var("OUTBOXD_ADMIN_PAGE_SIZE") {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("OUTBOXD_ADMIN_PAGE_SIZE={v:?}: not a positive number"))?,
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

    async fn call(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Option<Value>> {
        let resp = self
            .authorized(req)
            .send()
            .await
            .with_context(|| format!("asking the running service at {}", self.base))?;
        let status = resp.status();
        let body: Value = resp.json().await.with_context(|| format!("reading the answer of {}", self.base))?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            bail!("{}", failure(status, &body));
        }
        Ok(Some(body))
    }

    /// `GET /v1/stats`: the store's statistics, as `outboxd store stats` shows them.
    pub async fn stats(&self) -> anyhow::Result<Value> {
        self.call(self.http.get(format!("{}/v1/stats", self.base))).await?.context("no stats")
    }

    /// `GET /v1/events/{id}`: the record of one event; `None` when there is none.
    pub async fn get(&self, id: &str) -> anyhow::Result<Option<Value>> {
        let mut url = url::Url::parse(&format!("{}/v1/events/", self.base))?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("bad admin address"))?
            .pop_if_empty()
            .extend(id.split('/'));
        self.call(self.http.get(url)).await
    }

    /// Up to `limit` records in id order (`usize::MAX`: all of them), asked
    /// for page by page, each page starting after the last id of the one before.
    pub async fn list(&self, state: Option<&str>, topic: Option<&str>, limit: usize) -> anyhow::Result<Vec<Value>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        while out.len() < limit {
            let mut q = vec![("limit", self.page.min(limit - out.len()).to_string())];
            q.extend(state.map(|s| ("state", s.to_owned())));
            q.extend(topic.map(|t| ("topic", t.to_owned())));
            q.extend(after.take().map(|a| ("after", a)));
            let page =
                self.call(self.http.get(format!("{}/v1/events", self.base)).query(&q)).await?.context("no list")?;
            let (Some(records), Some(next)) = (page["records"].as_array(), page.get("next")) else {
                bail!("unexpected answer from {}: {}", self.base, page);
            };
            out.extend(records.iter().cloned());
            match next.as_str() {
                Some(n) => after = Some(n.to_owned()),
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
    ) -> anyhow::Result<u64> {
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
            .with_context(|| format!("asking the running service at {}", self.base))?;
        let status = resp.status();
        if !status.is_success() {
            let body: Value = resp.json().await.unwrap_or_default();
            bail!("export failed: {}", failure(status, &body));
        }
        let mut lines = 0u64;
        while let Some(chunk) = resp.chunk().await? {
            lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
            out.write_all(&chunk)?;
            progress.set_position(lines);
        }
        Ok(lines)
    }

    /// `forget`, `resolve`, `retry` of one event, or `gc`.
    pub async fn repair(&self, op: &str, id: &str) -> anyhow::Result<Value> {
        match self.call(self.http.post(format!("{}/v1/{op}", self.base)).query(&[("id", id)])).await? {
            Some(v) => Ok(v),
            None => bail!("no record for event {id:?}"),
        }
    }
}

/// `401 Unauthorized: missing credential: …`, with a hint for a 401 that the
/// caller can act on.
fn failure(status: reqwest::StatusCode, body: &Value) -> String {
    let error = body.get("error").and_then(Value::as_str).unwrap_or("request failed");
    let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
        " (run as the user running outboxd, who can read the store's owner file, or set OUTBOXD_ADMIN_TOKEN)"
    } else {
        ""
    };
    format!("{status}: {error}{hint}")
}
