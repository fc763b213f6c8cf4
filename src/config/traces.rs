//! `[tracing.otlp]`: spans exported to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf). Absent: no exporter, and the spans outboxd creates cost no more than a
//! disabled `tracing` call site.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, without_userinfo, ExpandedUrl, HeaderNames};
use super::ConfigError;

/// `service.name` of the exported spans: what a trace view groups them under.
const DEFAULT_SERVICE_NAME: &str = "outboxd";
/// Share of traces started here (events that arrive without a trace context) that
/// are sampled. 1.0: outboxd runs one span tree per event, each a side effect someone
/// may ask about, and the export is batched and bounded; a collector that must keep
/// less samples at its end (tail sampling keeps the failed ones). An event that
/// arrives with a context follows its producer's decision whatever this says.
const DEFAULT_SAMPLE_RATIO: f64 = 1.0;
/// How long one export request may take: a collector that answers later is treated as
/// away for that batch (its spans are dropped and counted), never waited for longer.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Spans waiting for export; past this, new spans are dropped (and counted) rather
/// than held: about 2 s of a 1,000 events/s stream (six spans an event), ~2 MiB.
const DEFAULT_MAX_QUEUE: usize = 12_288;
const MAX_MAX_QUEUE: usize = 1 << 20;
/// The OTLP/HTTP path for traces, appended to `endpoint` unless it ends with it.
const TRACES_PATH: &str = "/v1/traces";

/// `[tracing]` as written: one sub-table per exporter (only `otlp` so far).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    /// `[tracing.otlp]`: export spans to an OpenTelemetry collector.
    pub otlp: Option<RawOtlp>,
}

/// `[tracing.otlp]` as written.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (`/v1/traces` is appended).
    pub endpoint: Option<String>,
    /// `service.name` of the spans (default `outboxd`).
    pub service_name: Option<String>,
    /// Share of traces that start here that are sampled, 0.0 to 1.0 (default 1.0).
    pub sample_ratio: Option<f64>,
    /// Headers of every export request (a collector's auth), values with `${VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How long one export request may take, e.g. "10s" (the default).
    pub timeout: Option<String>,
    /// Spans held for export at most; more are dropped and counted (default 12288).
    pub max_queue: Option<usize>,
}

/// `[tracing.otlp]` validated. `Debug` shows the endpoint as written and the header
/// names, not their values.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct OtlpConfig {
    /// Where export requests go: the full traces URL (`…/v1/traces`). Shown (logs,
    /// `Debug`) as written, `${VAR}` unexpanded and user info replaced.
    pub endpoint: ExpandedUrl,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Share of root traces sampled; a remote parent's decision is followed.
    pub sample_ratio: f64,
    /// `${VAR}` resolved: may carry a secret, never logged.
    pub headers: Vec<(String, String)>,
    /// Per export request.
    pub timeout: Duration,
    /// Spans held for export at most.
    pub max_queue: usize,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named: one added later is shown or hidden on purpose, not by default.
        let OtlpConfig { endpoint, service_name, sample_ratio, headers, timeout, max_queue } = self;
        f.debug_struct("OtlpConfig")
            .field("endpoint", endpoint)
            .field("service_name", service_name)
            .field("sample_ratio", sample_ratio)
            .field("headers", &HeaderNames(headers))
            .field("timeout", timeout)
            .field("max_queue", max_queue)
            .finish()
    }
}

impl RawTracing {
    /// `None` when there is no `[tracing.otlp]`.
    pub(super) fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<OtlpConfig>, ConfigError> {
        self.otlp.map(|o| o.validate(env)).transpose()
    }
}

impl RawOtlp {
    fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<OtlpConfig, ConfigError> {
        let Some(endpoint) = self.endpoint else {
            return Err(ConfigError::field(
                "tracing.otlp.endpoint",
                "required in [tracing.otlp] (the collector's OTLP/HTTP URL, e.g. \"http://127.0.0.1:4318\")",
            ));
        };
        let endpoint = traces_url(&expand_env("tracing.otlp.endpoint", &endpoint, env)?, &endpoint)
            .map_err(|e| ConfigError::field("tracing.otlp.endpoint", e))?;
        let service_name = self.service_name.unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        if service_name.trim().is_empty() {
            return Err(ConfigError::field("tracing.otlp.service_name", "must not be empty"));
        }
        let sample_ratio = self.sample_ratio.unwrap_or(DEFAULT_SAMPLE_RATIO);
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(ConfigError::field(
                "tracing.otlp.sample_ratio",
                format!("{sample_ratio} is not between 0.0 and 1.0"),
            ));
        }
        let headers = super::http::headers("tracing.otlp", &self.headers, env)?;
        let timeout = duration("tracing.otlp.timeout", self.timeout.as_deref(), DEFAULT_TIMEOUT)?;
        if timeout.is_zero() {
            return Err(ConfigError::field("tracing.otlp.timeout", "must be more than 0"));
        }
        let max_queue = self.max_queue.unwrap_or(DEFAULT_MAX_QUEUE);
        if !(1..=MAX_MAX_QUEUE).contains(&max_queue) {
            return Err(ConfigError::field("tracing.otlp.max_queue", format!("must be 1 to {MAX_MAX_QUEUE}")));
        }
        Ok(OtlpConfig { endpoint, service_name, sample_ratio, headers, timeout, max_queue })
    }
}

/// The traces URL for a collector's base URL `text` (`written` before `${VAR}`
/// expansion, the only form messages show): `http(s)://host:port[/prefix]` gets
/// `/v1/traces` appended (the OTLP/HTTP convention for a base endpoint), a URL that
/// already ends with it is taken as it is.
fn traces_url(text: &str, written: &str) -> Result<ExpandedUrl, String> {
    let shown = without_userinfo(written.trim());
    let url = url::Url::parse(text.trim()).map_err(|e| format!("{shown:?} is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{shown:?}: the scheme must be http or https (OTLP over HTTP)"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{shown:?}: no query or fragment (write the collector's base URL)"));
    }
    let with_path = |base: &str| {
        let base = base.trim().trim_end_matches('/');
        if base.ends_with(TRACES_PATH) {
            base.to_owned()
        } else {
            format!("{base}{TRACES_PATH}")
        }
    };
    Ok(ExpandedUrl::new(with_path(url.as_str()), &with_path(written)))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, BASE};
    use super::super::Config;
    use super::*;

    const LOG: &str = "[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n";

    fn parse(tracing: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{BASE}{tracing}\n{LOG}"), &env)
    }

    fn err(tracing: &str) -> String {
        format!("{:#}", parse(tracing).expect_err("config should be rejected"))
    }

    #[test]
    fn no_section_means_no_exporter() {
        assert_eq!(parse("").unwrap().otlp, None);
        assert_eq!(parse("[tracing]").unwrap().otlp, None);
    }

    #[test]
    fn an_endpoint_alone_takes_every_default() {
        let c = parse("[tracing.otlp]\nendpoint = \"http://127.0.0.1:4318\"").unwrap().otlp.unwrap();
        assert_eq!(c.endpoint.expose(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(c.service_name, "outboxd");
        assert_eq!(c.sample_ratio, 1.0);
        assert!(c.headers.is_empty());
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.max_queue, DEFAULT_MAX_QUEUE);
    }

    #[test]
    fn the_traces_path_is_appended_to_a_base_url_only() {
        for (given, url) in [
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("https://otlp.example/otlp", "https://otlp.example/otlp/v1/traces"),
            ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
        ] {
            assert_eq!(traces_url(given, given).unwrap().expose(), url, "{given}");
        }
    }

    #[test]
    fn the_endpoint_is_shown_as_written_and_its_secrets_only_sent() {
        let env = |name: &str| match name {
            "OTLP_PASSWORD" => Some("pa55w0rd-from-env".to_owned()),
            "OTLP_TENANT" => Some("tenant-t0ken-from-env".to_owned()),
            _ => None,
        };
        let text = format!(
            "{BASE}[tracing.otlp]\nendpoint = \"https://ingest:${{OTLP_PASSWORD}}@otlp.example/${{OTLP_TENANT}}\"\n{LOG}"
        );
        let c = Config::parse(&text, &env).unwrap().otlp.unwrap();
        assert_eq!(
            c.endpoint.expose(),
            "https://ingest:pa55w0rd-from-env@otlp.example/tenant-t0ken-from-env/v1/traces"
        );
        assert_eq!(c.endpoint.to_string(), "https://<redacted>@otlp.example/${OTLP_TENANT}/v1/traces");
        // A refused endpoint is named as written too.
        let text =
            format!("{BASE}[tracing.otlp]\nendpoint = \"ftp://ingest:s3cret@otlp.example/${{OTLP_TENANT}}\"\n{LOG}");
        let e = format!("{:#}", Config::parse(&text, &env).unwrap_err());
        assert!(e.contains("ftp://<redacted>@otlp.example/${OTLP_TENANT}"), "{e}");
        assert!(!e.contains("s3cret") && !e.contains("tenant-t0ken"), "{e}");
    }

    #[test]
    fn headers_expand_variables_and_bad_values_name_their_field() {
        let c =
            parse("[tracing.otlp]\nendpoint = \"http://c:4318\"\nheaders = { Authorization = \"Bearer ${TOKEN}\" }")
                .unwrap()
                .otlp
                .unwrap();
        assert_eq!(c.headers, vec![("Authorization".to_owned(), "Bearer s3cret".to_owned())]);
        for (tracing, field) in [
            ("[tracing.otlp]\nservice_name = \"x\"", "tracing.otlp.endpoint: required"),
            ("[tracing.otlp]\nendpoint = \"grpc://c:4317\"", "tracing.otlp.endpoint: "),
            ("[tracing.otlp]\nendpoint = \"c:4318\"", "tracing.otlp.endpoint: "),
            ("[tracing.otlp]\nendpoint = \"http://c\"\nsample_ratio = 1.5", "tracing.otlp.sample_ratio: "),
            ("[tracing.otlp]\nendpoint = \"http://c\"\ntimeout = \"soon\"", "tracing.otlp.timeout: "),
            ("[tracing.otlp]\nendpoint = \"http://c\"\nmax_queue = 0", "tracing.otlp.max_queue: "),
            ("[tracing.otlp]\nendpoint = \"http://c\"\nservice_name = \" \"", "tracing.otlp.service_name: "),
            ("[tracing.otlp]\nendpoint = \"http://c\"\nheaders = { X = \"${NOPE}\" }", "tracing.otlp.headers.X"),
        ] {
            let e = err(tracing);
            assert!(e.contains(field), "{tracing}: {e}");
        }
        assert!(err("[tracing.otlp]\nendpoint = \"http://c\"\nendpiont = 1").contains("unknown field `endpiont`"));
        assert!(err("[tracing.jaeger]\nendpoint = \"http://c\"").contains("unknown field `jaeger`"));
    }
}
