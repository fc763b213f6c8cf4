//! `kind = "http"`: one request per event, with the event id as the
//! idempotency key so a re-execution after an unknown outcome is safe for
//! receivers that honour it. reqwest is used only here.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::StatusCode;

use super::{HandlerError, Outcome};
use crate::config::HttpConfig;
use crate::event::OutboxEvent;
use crate::template::Vars;

pub struct HttpHandler {
    client: reqwest::Client,
    config: HttpConfig,
    /// Static headers from the config (secrets resolved; never logged).
    headers: HeaderMap,
}

impl HttpHandler {
    pub fn new(config: HttpConfig) -> anyhow::Result<HttpHandler> {
        // A redirect could lead to another host; it is reported as a permanent failure instead.
        let client =
            reqwest::Client::builder().timeout(config.timeout).redirect(reqwest::redirect::Policy::none()).build()?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let mut v = HeaderValue::from_str(value)?;
            v.set_sensitive(true);
            headers.insert(HeaderName::from_bytes(name.as_bytes())?, v);
        }
        Ok(HttpHandler { client, config, headers })
    }

    pub async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        let vars = Vars {
            event_id: &event.id,
            aggregate_id: event.aggregate_id.as_deref(),
            event_type: event.event_type.as_deref(),
            topic: &event.position.topic,
        };
        let url = self.config.url.render(&vars).map_err(|e| HandlerError::Permanent(e.to_string()))?;
        let (body, content_type) = event.payload.to_body();
        let mut headers = self.headers.clone();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        if let Some(name) = &self.config.idempotency_header {
            insert_text(&mut headers, name, &event.id);
        }
        if let Some(t) = &event.event_type {
            insert_text(&mut headers, "Outbox-Event-Type", t);
        }
        if let Some(a) = &event.aggregate_id {
            insert_text(&mut headers, "Outbox-Aggregate-Id", a);
        }
        let response = self
            .client
            .request(self.config.method.clone(), url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| HandlerError::Retryable(describe(&e)))?;
        classify(response.status())
    }
}

/// Event data that is not a valid header value (e.g. contains CR/LF) is left out.
fn insert_text(headers: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
        headers.insert(n, v);
    }
}

fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    // The URL may carry event data, not secrets; headers are never part of the error.
    let mut text = format!("{kind}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// 2xx succeeds; 408, 409 (same key in flight), 429 and 5xx may heal; other statuses are permanent.
pub fn classify(status: StatusCode) -> Result<Outcome, HandlerError> {
    let text = format!("http {}", status.as_u16());
    match status.as_u16() {
        200..=299 => Ok(Outcome(text)),
        408 | 409 | 425 | 429 | 500..=599 => Err(HandlerError::Retryable(text)),
        _ => Err(HandlerError::Permanent(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        assert_eq!(classify(StatusCode::OK), Ok(Outcome("http 200".into())));
        assert_eq!(classify(StatusCode::CREATED), Ok(Outcome("http 201".into())));
        for s in [408, 409, 429, 500, 503] {
            assert!(matches!(classify(StatusCode::from_u16(s).unwrap()), Err(HandlerError::Retryable(_))), "{s}");
        }
        for s in [400, 401, 404, 422] {
            assert!(matches!(classify(StatusCode::from_u16(s).unwrap()), Err(HandlerError::Permanent(_))), "{s}");
        }
        assert!(matches!(classify(StatusCode::from_u16(302).unwrap()), Err(HandlerError::Permanent(_))));
    }
}
