//! `kind = "http"`: one request per event, with the event id as the
//! idempotency key so a re-execution after an unknown outcome is safe for
//! receivers that honour it. Receivers are called with reqwest here (the schema
//! registry and admin clients use it too).

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue, CONTENT_TYPE};
use reqwest::StatusCode;

use super::{async_trait, Handler, HandlerError, Outcome, Verified};
use crate::config::{HttpConfig, StatusRules};
use crate::event::OutboxEvent;
use crate::template::Vars;

/// Why a handler could not be built (only the http handler can fail). The texts
/// are reqwest's own.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The HTTP client could not be built (e.g. its TLS backend failed to start).
    #[error(transparent)]
    Client(#[from] reqwest::Error),
    /// A static header name that cannot be sent (the config's validation refuses these first).
    #[error(transparent)]
    HeaderName(#[from] InvalidHeaderName),
    /// A static header value that cannot be sent (the config's validation refuses these first).
    #[error(transparent)]
    HeaderValue(#[from] InvalidHeaderValue),
    /// A postgres handler's connection pool could not be built.
    #[error(transparent)]
    Postgres(#[from] super::postgres::PostgresBuildError),
}

/// `kind = "http"`: one request per event to the rendered URL, the event id in the
/// idempotency header; the status is classified as success, retryable or permanent.
pub struct HttpHandler {
    client: reqwest::Client,
    config: HttpConfig,
    /// Static headers from the config (secrets resolved; never logged).
    headers: HeaderMap,
}

/// The client of every call to a receiver, the handler's and its `health_url` probe's:
/// each call bounded by `timeout`, and redirects not followed. A redirect could lead to
/// another host, with the handler's headers; a receiver's 3xx is its answer (a
/// permanent failure of the event, an unhealthy probe).
fn client(timeout: std::time::Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build()
}

impl HttpHandler {
    /// A handler for `config`; redirects are not followed (a permanent failure instead).
    pub fn new(config: HttpConfig) -> Result<HttpHandler, BuildError> {
        let client = client(config.timeout)?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let mut v = HeaderValue::from_str(value)?;
            v.set_sensitive(true);
            headers.insert(HeaderName::from_bytes(name.as_bytes())?, v);
        }
        Ok(HttpHandler { client, config, headers })
    }
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        let url = self.config.url.render(&vars(event)).map_err(|e| HandlerError::Permanent(e.to_string()))?;
        let (body, content_type) = event.payload.to_body();
        let mut headers = self.headers.clone();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        self.insert_idempotency_key(&mut headers, event)?;
        if let Some(t) = &event.event_type {
            insert_text(&mut headers, "Outbox-Event-Type", t);
        }
        if let Some(a) = &event.aggregate_id {
            insert_text(&mut headers, "Outbox-Aggregate-Id", a);
        }
        if let Some(sign) = &self.config.sign {
            insert_signature(&mut headers, sign, event, &body)?;
        }
        // The call's own span when spans are exported, so the receiver's trace continues
        // from this call; else the event's traceparent as it came.
        if let Some(trace) = crate::telemetry::outgoing(event.traceparent.as_deref()) {
            insert_text(&mut headers, "traceparent", &trace.traceparent);
            if let Some(state) = &trace.tracestate {
                insert_text(&mut headers, "tracestate", state);
            }
        }
        let response = self
            .client
            .request(self.config.method.clone(), url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| HandlerError::unavailable(describe(e)))?;
        // On the engine's `handler call` span, when there is one (as i64: spans export unsigned numbers as text).
        tracing::Span::current().record("http.response.status_code", i64::from(response.status().as_u16()));
        let retry_after = retry_after(response.headers());
        match classify(&self.config.classify, response.status()) {
            Err(HandlerError::Retryable { reason, .. }) => Err(HandlerError::Retryable { reason, retry_after }),
            Err(HandlerError::Unavailable { reason, .. }) => Err(HandlerError::Unavailable { reason, retry_after }),
            other => other,
        }
    }

    /// The `verify` lookup: 2xx = it happened, 404 = it did not, anything else = ask again later.
    async fn verify(&self, event: &OutboxEvent) -> Result<Verified, HandlerError> {
        let Some(verify) = &self.config.verify else {
            return Ok(Verified::Missing);
        };
        let url = verify.url.render(&vars(event)).map_err(|e| HandlerError::Permanent(e.to_string()))?;
        let mut headers = self.headers.clone();
        self.insert_idempotency_key(&mut headers, event)?;
        let response = self
            .client
            .request(verify.method.clone(), url)
            .headers(headers)
            .send()
            .await
            .map_err(|e| HandlerError::retryable(format!("verify: {}", describe(e))))?;
        match response.status().as_u16() {
            200..=299 => Ok(Verified::Happened(format!("verified: http {}", response.status().as_u16()))),
            404 => Ok(Verified::Missing),
            s => Err(HandlerError::Retryable {
                reason: format!("verify: http {s}"),
                retry_after: retry_after(response.headers()),
            }),
        }
    }
}

impl HttpHandler {
    /// The route's idempotency key (the event id on a topic's first route) as the
    /// idempotency header ([`id_header`]).
    fn insert_idempotency_key(&self, headers: &mut HeaderMap, event: &OutboxEvent) -> Result<(), HandlerError> {
        let Some(name) = &self.config.idempotency_header else { return Ok(()) };
        let key = event.idempotency_key();
        let value = id_header(key, key, name)?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| HandlerError::Permanent(format!("idempotency header name {name:?}: {e}")))?;
        headers.insert(name, value);
        Ok(())
    }
}

/// The `GET` of a handler's `circuit.health_url`, which decides whether its open
/// circuit closes: with the handler's client rules, so a redirect is an answer, not
/// healthy, and is not followed (the handler's own calls would not follow it either).
pub struct HealthProbe {
    client: reqwest::Client,
    /// `${VAR}` resolved: never shown (failures are described without it).
    url: String,
}

impl HealthProbe {
    /// A probe of `url`, each `GET` bounded by `timeout` (the handler's).
    pub fn new(url: &str, timeout: std::time::Duration) -> Result<HealthProbe, BuildError> {
        Ok(HealthProbe { client: client(timeout)?, url: url.to_owned() })
    }

    /// `Ok` for a 2xx; else why not (`http 302`, `could not connect: …`), without the URL.
    pub async fn check(&self) -> Result<(), String> {
        match self.client.get(&self.url).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("http {}", r.status().as_u16())),
            Err(e) => Err(describe(e)),
        }
    }
}

fn vars(event: &OutboxEvent) -> Vars<'_> {
    Vars {
        event_id: &event.id,
        aggregate_id: event.aggregate_id.as_deref(),
        event_type: event.event_type.as_deref(),
        topic: &event.position.topic,
    }
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<std::time::Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(std::time::Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

/// `value`, the form of event id `id` that header `name` carries, as a header value.
/// An id that a header cannot carry (control characters such as CR or LF) is
/// refused: sent without it, a re-execution would not be idempotent at the receiver.
fn id_header(value: &str, id: &str, name: &str) -> Result<HeaderValue, HandlerError> {
    HeaderValue::from_str(value).map_err(|_| {
        HandlerError::Permanent(format!(
            "the event id {id:?} contains characters an HTTP header cannot carry (control characters such as CR or LF), \
             so it cannot be sent as {name}; without it a re-execution would not be idempotent, so it is not sent"
        ))
    })
}

/// `webhook-id`, `webhook-timestamp` (now: each attempt its own) and
/// `webhook-signature` over the exact body sent.
fn insert_signature(
    headers: &mut HeaderMap,
    sign: &crate::config::SignConfig,
    event: &OutboxEvent,
    body: &[u8],
) -> Result<(), HandlerError> {
    let key = event.idempotency_key();
    let id = super::sign::webhook_id(key);
    let id_value = id_header(&id, key, "webhook-id")?;
    let timestamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let signatures = super::sign::signatures(sign, &id, timestamp, body);
    headers.insert(HeaderName::from_static("webhook-id"), id_value);
    headers.insert(HeaderName::from_static("webhook-timestamp"), HeaderValue::from(timestamp));
    let mut signature = HeaderValue::from_str(&signatures).expect("base64 and `v1,` are header text");
    signature.set_sensitive(true);
    headers.insert(HeaderName::from_static("webhook-signature"), signature);
    Ok(())
}

/// Event data that is not a valid header value (e.g. contains CR/LF) is left out.
fn insert_text(headers: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
        headers.insert(n, v);
    }
}

/// What went wrong, for logs, `record.reason` and dead-letter headers. reqwest's own
/// text names the full URL, which may carry a secret from `${VAR}` (a webhook path,
/// a `?code=` key): the error is rendered without it. Headers are never part of it.
fn describe(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let e = e.without_url();
    format!("{kind}: {}", crate::error::with_causes(&e))
}

/// The handler's `success_on`, `fail_on`, `retry_on` first; then the defaults:
/// 2xx succeeds; 408, 425, 429 and 5xx say the receiver fails for everyone
/// (unavailable: they count toward the circuit); 409 (a request with the same key
/// in flight) may heal for this event; everything else (other 4xx, redirects) is
/// permanent. A status listed in `retry_on` is the receiver's when it is one of
/// those classes, else this event's.
pub fn classify(rules: &StatusRules, status: StatusCode) -> Result<Outcome, HandlerError> {
    let code = status.as_u16();
    let text = format!("http {code}");
    let listed = |list: &[crate::config::StatusMatch]| list.iter().any(|m| m.matches(code));
    if listed(&rules.success_on) {
        return Ok(Outcome(text));
    }
    if listed(&rules.fail_on) {
        return Err(HandlerError::Permanent(text));
    }
    let receivers = matches!(code, 408 | 425 | 429 | 500..=599);
    if listed(&rules.retry_on) && !receivers {
        return Err(HandlerError::retryable(text));
    }
    match code {
        _ if receivers => Err(HandlerError::unavailable(text)),
        200..=299 => Ok(Outcome(text)),
        409 => Err(HandlerError::retryable(text)),
        _ => Err(HandlerError::Permanent(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::StatusMatch;

    fn status(s: u16) -> StatusCode {
        StatusCode::from_u16(s).unwrap()
    }

    #[test]
    fn statuses_are_classified_by_default() {
        let rules = StatusRules::default();
        assert_eq!(classify(&rules, StatusCode::OK), Ok(Outcome("http 200".into())));
        assert_eq!(classify(&rules, StatusCode::CREATED), Ok(Outcome("http 201".into())));
        for s in [408, 425, 429, 500, 503] {
            assert!(matches!(classify(&rules, status(s)), Err(HandlerError::Unavailable { .. })), "{s}");
        }
        assert!(matches!(classify(&rules, status(409)), Err(HandlerError::Retryable { .. })), "409 is this event's");
        for s in [400, 401, 404, 422, 302] {
            assert!(matches!(classify(&rules, status(s)), Err(HandlerError::Permanent(_))), "{s}");
        }
    }

    #[test]
    fn configured_lists_override_the_defaults() {
        let rules = StatusRules {
            success_on: vec![StatusMatch::Code(409)],
            fail_on: vec![StatusMatch::Code(503)],
            retry_on: vec![StatusMatch::Class(4)],
        };
        assert!(classify(&rules, status(409)).is_ok(), "409 = already done, for this receiver");
        assert!(matches!(classify(&rules, status(503)), Err(HandlerError::Permanent(_))));
        assert!(matches!(classify(&rules, status(404)), Err(HandlerError::Retryable { .. })));
        assert!(
            matches!(classify(&rules, status(500)), Err(HandlerError::Unavailable { .. })),
            "the receiver's, listed or not"
        );
    }

    #[test]
    fn an_id_a_header_cannot_carry_is_refused_not_sent_without_its_key() {
        let config = crate::config::testing::parse(
            r#"
            [[handlers]]
            topics = ["t"]
            kind = "http"
            url = "http://127.0.0.1:9/e"
            "#,
        )
        .unwrap();
        let crate::config::HandlerSpec::Http(http) = &config.handlers[0].spec else { panic!("http expected") };
        let handler = HttpHandler::new((**http).clone()).unwrap();
        let event = |id: &str| OutboxEvent {
            id: id.into(),
            aggregate_id: None,
            event_type: None,
            payload: crate::event::Payload::Null,
            position: crate::event::Position { topic: "t".into(), partition: 0, offset: 0 },
            timestamp_ms: None,
            traceparent: None,
            route_key: None,
            headers: Vec::new(),
        };
        let mut h = HeaderMap::new();
        handler.insert_idempotency_key(&mut h, &event("order-1/événement")).unwrap();
        assert_eq!(h.get("Idempotency-Key").unwrap().as_bytes(), "order-1/événement".as_bytes());
        for bad in ["a\r\nX-Injected: yes", "a\nb", "nul\0", "del\x7f"] {
            let mut h = HeaderMap::new();
            match handler.insert_idempotency_key(&mut h, &event(bad)) {
                Err(HandlerError::Permanent(reason)) => assert!(reason.contains("Idempotency-Key"), "{reason}"),
                other => panic!("{bad:?}: {other:?}"),
            }
            assert!(h.is_empty());
        }
    }

    #[test]
    fn retry_after_seconds_and_dates_are_read() {
        let mut h = HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(std::time::Duration::from_secs(7)));
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(120);
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_str(&httpdate::fmt_http_date(later)).unwrap());
        let d = retry_after(&h).unwrap();
        assert!(d > std::time::Duration::from_secs(100) && d <= std::time::Duration::from_secs(120), "{d:?}");
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }
}
