//! `[schema_registry]`: where Avro writer schemas come from (a Confluent-compatible
//! registry, local `.avsc` files, or both) and the limits on decoding.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, parse_size, without_userinfo, Redacted, REDACTED};
use super::ConfigError;

/// `[schema_registry]` as the Avro decoder uses it: validated, durations and sizes parsed.
/// `Debug` shows neither the credentials nor the URL's user info and query.
#[derive(Clone)]
#[non_exhaustive]
pub struct RegistryOptions {
    /// The registry's base URL, `http` or `https`, `${VAR}` resolved, no trailing `/`.
    pub url: Option<String>,
    /// Basic auth user, `${VAR}` resolved; set whenever `password` is.
    pub username: Option<String>,
    /// Basic auth password, `${VAR}` resolved: a secret, never log it.
    pub password: Option<String>,
    /// PEM CA for a registry behind TLS with a private CA (system roots otherwise).
    pub ca_file: Option<PathBuf>,
    /// A registry request taking longer counts as unavailable (default 10 s).
    pub timeout: Duration,
    /// Where fetched schemas are kept across restarts.
    pub cache_dir: Option<PathBuf>,
    /// `<id>.avsc` files, for installations without a registry.
    pub schemas_dir: Option<PathBuf>,
    /// Largest allocation apache-avro may make while decoding (its limit is per
    /// process and set once: by the first registry built).
    pub max_allocation_bytes: usize,
    /// Whether a registry schema id must be registered under the topic's subject.
    pub check_subjects: bool,
}

impl std::fmt::Debug for RegistryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named: one added later is shown or hidden on purpose, not by default.
        let RegistryOptions {
            url,
            username,
            password,
            ca_file,
            timeout,
            cache_dir,
            schemas_dir,
            max_allocation_bytes,
            check_subjects,
        } = self;
        f.debug_struct("RegistryOptions")
            .field("url", &url.as_deref().map(shown_url))
            .field("username", &username.as_ref().map(|_| Redacted))
            .field("password", &password.as_ref().map(|_| Redacted))
            .field("ca_file", ca_file)
            .field("timeout", timeout)
            .field("cache_dir", cache_dir)
            .field("schemas_dir", schemas_dir)
            .field("max_allocation_bytes", max_allocation_bytes)
            .field("check_subjects", check_subjects)
            .finish()
    }
}

/// The registry's URL (`${VAR}` resolved) without what may be a credential: its user
/// info and its query.
fn shown_url(url: &str) -> String {
    let url = without_userinfo(url);
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?{REDACTED}"),
        None => url,
    }
}

/// Default time a registry request may take before it counts as unavailable.
const DEFAULT_REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest allocation apache-avro may make for one string, bytes value or
/// collection. Its own default (512 MiB) lets one hostile length prefix take
/// that much memory; 16 MiB is far above Kafka's default message size (1 MB).
/// Raise it together with the topic's `max.message.bytes`.
const DEFAULT_MAX_ALLOCATION_BYTES: u64 = 16 << 20;
/// Fetched schemas are kept under the store directory unless `cache_dir` says otherwise.
const DEFAULT_CACHE_SUBDIR: &str = "schemas";

/// `[schema_registry]` as written: `url`, `schemas_dir`, or both.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSchemaRegistry {
    /// A Confluent-compatible registry (`GET /schemas/ids/{id}`).
    pub url: Option<String>,
    /// `[schema_registry] username`: basic auth user; required with `password`.
    pub username: Option<String>,
    /// `[schema_registry] password`: basic auth password, e.g. `"${SR_PASSWORD}"`.
    pub password: Option<String>,
    /// PEM CA for a registry behind TLS with a private CA (system roots otherwise).
    pub ca_file: Option<PathBuf>,
    /// `[schema_registry] timeout`: per registry request, e.g. "10s" (the default).
    pub timeout: Option<String>,
    /// Fetched schemas kept across restarts (default: `schemas/` in the store directory).
    pub cache_dir: Option<PathBuf>,
    /// `<id>.avsc` files, instead of or before the registry.
    pub schemas_dir: Option<PathBuf>,
    /// Largest single allocation while decoding an Avro value (`"16MiB"`).
    pub max_allocation_bytes: Option<String>,
    /// Accept a registry schema id only when it is registered under the topic's
    /// subject (`<topic>-value`/`-key`, or `<topic>-<record name>`). Default true;
    /// false for RecordNameStrategy, whose subjects do not name the topic.
    pub check_subjects: Option<bool>,
}

impl RawSchemaRegistry {
    pub(super) fn validate(
        self,
        store_path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<RegistryOptions, ConfigError> {
        let url = self.url.map(|u| expand_env("schema_registry.url", &u, env)).transpose()?;
        if let Some(u) = &url {
            let parsed = url::Url::parse(u).map_err(|e| ConfigError::field("schema_registry.url", e.to_string()))?;
            if parsed.scheme() != "http" && parsed.scheme() != "https" {
                return Err(ConfigError::field("schema_registry.url", "scheme must be http or https"));
            }
        }
        if url.is_none() && self.schemas_dir.is_none() {
            return Err(ConfigError::field("schema_registry", "set url, schemas_dir, or both"));
        }
        let password = self.password.map(|p| expand_env("schema_registry.password", &p, env)).transpose()?;
        let username = self.username.map(|u| expand_env("schema_registry.username", &u, env)).transpose()?;
        if password.is_some() && username.is_none() {
            return Err(ConfigError::field("schema_registry.username", "required with a password"));
        }
        let max_allocation_bytes = match self.max_allocation_bytes.as_deref() {
            None => DEFAULT_MAX_ALLOCATION_BYTES,
            Some(text) => parse_size(text).filter(|n| *n > 0).ok_or_else(|| {
                ConfigError::field(
                    "schema_registry.max_allocation_bytes",
                    format!("{text:?} is not a size such as \"16MiB\""),
                )
            })?,
        };
        Ok(RegistryOptions {
            url: url.map(|u| u.trim_end_matches('/').to_owned()),
            username,
            password,
            ca_file: self.ca_file,
            timeout: duration("schema_registry.timeout", self.timeout.as_deref(), DEFAULT_REGISTRY_TIMEOUT)?,
            cache_dir: Some(self.cache_dir.unwrap_or_else(|| store_path.join(DEFAULT_CACHE_SUBDIR))),
            schemas_dir: self.schemas_dir,
            max_allocation_bytes: usize::try_from(max_allocation_bytes).unwrap_or(usize::MAX),
            check_subjects: self.check_subjects.unwrap_or(true),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::testing::{env, err, BASE};
    use super::super::{Body, Config, Format};

    #[test]
    fn avro_format_needs_a_registry() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nformat=\"avro\"\n");
        assert!(e.contains("handlers[0].format") && e.contains("schema_registry"), "{e}");
        let c = Config::parse(
            &format!("{BASE}[schema_registry]\nurl=\"http://127.0.0.1:18081/\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nformat=\"avro\"\nbody=\"raw\"\n"),
            &env,
        )
        .unwrap();
        let r = c.schema_registry.unwrap();
        assert_eq!(r.url.as_deref(), Some("http://127.0.0.1:18081"));
        assert_eq!(r.cache_dir, Some(PathBuf::from("./data/schemas")));
        assert_eq!((c.handlers[0].format, c.handlers[0].body), (Format::Avro, Body::Raw));
    }

    #[test]
    fn avro_allocation_limit_and_subject_check_have_safe_defaults() {
        let registry = |extra: &str| {
            let text = format!("{BASE}[schema_registry]\nurl=\"http://127.0.0.1:18081\"\n{extra}[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n");
            Config::parse(&text, &env).map(|c| c.schema_registry.unwrap())
        };
        assert_eq!(registry("").unwrap().max_allocation_bytes, 16 << 20);
        assert!(registry("").unwrap().check_subjects, "schema ids are checked against topics by default");
        assert!(!registry("check_subjects = false\n").unwrap().check_subjects);
        assert_eq!(registry("max_allocation_bytes = \"64MiB\"\n").unwrap().max_allocation_bytes, 64 << 20);
        for bad in ["\"lots\"", "\"0\""] {
            let e = registry(&format!("max_allocation_bytes = {bad}\n")).unwrap_err();
            assert!(format!("{e:#}").contains("schema_registry.max_allocation_bytes"), "{e:#}");
        }
    }
}
