//! The `kind = "http"` part of a handler: URL template, method, headers, the
//! idempotency header, timeout, status classification and the `verify` lookup.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, without_userinfo, HeaderNames};
use super::{ConfigError, RawHandler, SignConfig};
use crate::template::UrlTemplate;

/// An HTTP receiver that has not answered by then is treated as failed (retried).
const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
const DEFAULT_METHOD: &str = "POST";
/// A lookup reads; it must not repeat the side effect.
const DEFAULT_VERIFY_METHOD: &str = "GET";

/// `[handlers.verify]` as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    /// `handlers[].verify.url`: a URL template like `url`; 2xx = it happened, 404 = it did not.
    pub url: String,
    /// `handlers[].verify.method`: the lookup's HTTP method, default `GET`.
    pub method: Option<String>,
}

/// An HTTP status (`409`) or a class (`"5xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "toml::Value")]
#[non_exhaustive]
pub enum StatusMatch {
    /// One status, 100 to 599.
    Code(u16),
    /// Every status of a class: `5` for `"5xx"`.
    Class(u16),
}

impl StatusMatch {
    pub(crate) fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Code(c) => c == status,
            StatusMatch::Class(c) => status / 100 == c,
        }
    }
}

/// A `success_on`, `fail_on` or `retry_on` entry that is neither a status nor a class.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("expected a status such as 409 or a class such as \"5xx\", got {0}")]
pub struct StatusMatchError(toml::Value);

impl TryFrom<toml::Value> for StatusMatch {
    type Error = StatusMatchError;

    fn try_from(v: toml::Value) -> Result<StatusMatch, StatusMatchError> {
        let bad = || StatusMatchError(v.clone());
        match &v {
            toml::Value::Integer(i) if (100..=599).contains(i) => Ok(StatusMatch::Code(*i as u16)),
            toml::Value::String(s) => {
                let b = s.as_bytes();
                if b.len() == 3 && (b'1'..=b'5').contains(&b[0]) && s[1..].eq_ignore_ascii_case("xx") {
                    Ok(StatusMatch::Class(u16::from(b[0] - b'0')))
                } else {
                    s.parse::<u16>().ok().filter(|c| (100..=599).contains(c)).map(StatusMatch::Code).ok_or_else(bad)
                }
            }
            _ => Err(bad()),
        }
    }
}

/// The `kind = "http"` part of a handler, validated. `Debug` shows the header names,
/// not their values.
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpConfig {
    /// Where each event goes; event data only in the path and query.
    pub url: UrlTemplate,
    /// The request's method (default `POST`).
    pub method: reqwest::Method,
    /// Values with `${VAR}` already resolved: never log them.
    pub headers: Vec<(String, String)>,
    /// The header carrying the event id (default `Idempotency-Key`); `None` when turned off.
    pub idempotency_header: Option<String>,
    /// Per request (default 10 s): a receiver that has not answered by then has failed, and is retried.
    pub timeout: Duration,
    /// `success_on`, `fail_on` and `retry_on`: overrides of the default classification.
    pub classify: StatusRules,
    /// The lookup for `on_uncertain = "verify"`.
    pub verify: Option<VerifyConfig>,
    /// `[handlers.sign]`: how each call is signed; `None`: unsigned.
    pub sign: Option<SignConfig>,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named: one added later is shown or hidden on purpose, not by default.
        let HttpConfig { url, method, headers, idempotency_header, timeout, classify, verify, sign } = self;
        f.debug_struct("HttpConfig")
            .field("url", url)
            .field("method", method)
            .field("headers", &HeaderNames(headers))
            .field("idempotency_header", idempotency_header)
            .field("timeout", timeout)
            .field("classify", classify)
            .field("verify", verify)
            .field("sign", sign)
            .finish()
    }
}

/// Overrides of the default status classification, checked in this order.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StatusRules {
    /// Statuses that count as success.
    pub success_on: Vec<StatusMatch>,
    /// Statuses that are permanent failures: the event is dead.
    pub fail_on: Vec<StatusMatch>,
    /// Statuses that are retried.
    pub retry_on: Vec<StatusMatch>,
}

/// The lookup that decides an uncertain outcome (`on_uncertain = "verify"`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VerifyConfig {
    /// The lookup's URL: 2xx = it happened, 404 = it did not, anything else = ask again.
    pub url: UrlTemplate,
    /// The lookup's method (default `GET`).
    pub method: reqwest::Method,
}

impl HttpConfig {
    /// The http fields of handler `at`, which is `kind = "http"`.
    pub(super) fn from_raw(
        at: &str,
        h: &RawHandler,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HttpConfig, ConfigError> {
        let Some(url) = &h.url else {
            return Err(ConfigError::field(format!("{at}.url"), "required for kind = \"http\""));
        };
        let url = url_template(&format!("{at}.url"), url, env)?;
        let method = method(&format!("{at}.method"), h.method.as_deref().unwrap_or(DEFAULT_METHOD))?;
        let headers = headers(at, &h.headers, env)?;
        let idempotency_header = idempotency_header(at, h.idempotency_header.as_deref())?;
        let timeout = duration(&format!("{at}.timeout"), h.timeout.as_deref(), DEFAULT_HTTP_TIMEOUT)?;
        if timeout.is_zero() {
            return Err(ConfigError::field(format!("{at}.timeout"), "must be greater than 0"));
        }
        let classify =
            StatusRules { success_on: h.success_on.clone(), fail_on: h.fail_on.clone(), retry_on: h.retry_on.clone() };
        let verify = h.verify.as_ref().map(|v| VerifyConfig::from_raw(at, v, env)).transpose()?;
        let sign = h.sign.as_ref().map(|s| s.validate(at, env)).transpose()?;
        Ok(HttpConfig { url, method, headers, idempotency_header, timeout, classify, verify, sign })
    }
}

impl VerifyConfig {
    fn from_raw(at: &str, v: &RawVerify, env: &dyn Fn(&str) -> Option<String>) -> Result<VerifyConfig, ConfigError> {
        let url = url_template(&format!("{at}.verify.url"), &v.url, env)?;
        let method = method(&format!("{at}.verify.method"), v.method.as_deref().unwrap_or(DEFAULT_VERIFY_METHOD))?;
        Ok(VerifyConfig { url, method })
    }
}

/// `${VAR}` expanded for the requests; shown everywhere as written, user info replaced.
fn url_template(field: &str, written: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<UrlTemplate, ConfigError> {
    let expanded = expand_env(field, written, env)?;
    UrlTemplate::parse_shown(&expanded, &without_userinfo(written))
        .map_err(|error| ConfigError::Template { field: field.to_owned(), error })
}

fn method(field: &str, text: &str) -> Result<reqwest::Method, ConfigError> {
    reqwest::Method::from_bytes(text.to_ascii_uppercase().as_bytes())
        .map_err(|_| ConfigError::field(field, format!("invalid HTTP method {text:?}")))
}

/// Static headers, values with `${VAR}` expanded and checked (also `tracing.otlp.headers`).
pub(super) fn headers(
    at: &str,
    raw: &BTreeMap<String, String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut headers = Vec::new();
    for (name, value) in raw {
        let field = format!("{at}.headers.{name}");
        reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::field(&field, "invalid header name"))?;
        let value = expand_env(&field, value, env)?;
        reqwest::header::HeaderValue::from_str(&value)
            .map_err(|_| ConfigError::field(&field, "invalid header value"))?;
        headers.push((name.clone(), value));
    }
    Ok(headers)
}

/// Unset: the default header; `""`: none.
fn idempotency_header(at: &str, raw: Option<&str>) -> Result<Option<String>, ConfigError> {
    match raw {
        None => Ok(Some(DEFAULT_IDEMPOTENCY_HEADER.to_owned())),
        Some("") => Ok(None),
        Some(h) => {
            reqwest::header::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                ConfigError::field(format!("{at}.idempotency_header"), format!("invalid header name {h:?}"))
            })?;
            Ok(Some(h.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{err, parse};
    use super::super::{HandlerSpec, OnUncertain};
    use super::StatusMatch;

    #[test]
    fn unset_env_var_names_the_field() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"http://h/x\"\nheaders={ X = \"${NOPE}\" }\n");
        assert!(e.contains("handlers[0].headers.X") && e.contains("NOPE"), "{e}");
    }

    #[test]
    fn malformed_url_template_names_the_field() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"http://h/{nope}\"\n");
        assert!(e.contains("handlers[0].url") && e.contains("nope"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"not a url/{event_id}\"\n");
        assert!(e.contains("handlers[0].url"), "{e}");
    }

    #[test]
    fn failure_handling_options_parse() {
        let c = parse(
            r#"
[[handlers]]
topics = ["a"]
kind = "http"
url = "http://h/{event_id}"
success_on = [409]
fail_on = ["5xx"]
retry_on = ["404"]
on_uncertain = "verify"
[handlers.verify]
url = "http://h/lookup/{event_id}"
[handlers.dead_letter]
topic = "dlq.a"
[handlers.retry]
multiplier = 3.0
max_elapsed = "5m"
"#,
        )
        .unwrap();
        let h = &c.handlers[0];
        assert_eq!(h.dead_letter_topic.as_deref(), Some("dlq.a"));
        assert_eq!(h.on_uncertain, OnUncertain::Verify);
        assert_eq!(h.retry.max_elapsed, Duration::from_secs(300));
        let HandlerSpec::Http(http) = &h.spec else { panic!("http") };
        assert_eq!(http.classify.success_on, vec![StatusMatch::Code(409)]);
        assert_eq!(http.classify.fail_on, vec![StatusMatch::Class(5)]);
        assert_eq!(http.classify.retry_on, vec![StatusMatch::Code(404)]);
        assert_eq!(http.verify.as_ref().unwrap().method, reqwest::Method::GET);
    }

    #[test]
    fn verify_policy_needs_a_lookup_and_statuses_must_be_valid() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"http://h/\"\non_uncertain=\"verify\"\n");
        assert!(e.contains("handlers[0].verify"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"http://h/\"\nretry_on=[\"6xx\"]\n");
        assert!(e.contains("6xx"), "{e}");
    }
}
