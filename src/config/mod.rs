//! Configuration: plain serde data, named defaults, then `validate()` which
//! turns it into the resolved form the engine uses. Every error names the
//! field it is about (`handlers[1].url: ...`).
//!
//! One file per section, each with its `Raw*` (the file as written), its
//! resolved form, its defaults and its checks:
//! - `kafka`: `[kafka]`, brokers, group, commit and drain timing, librdkafka options;
//! - `store`: `[store]`, the dedup store, retention, group commit, in-flight bounds;
//!   `changelog`: `[store.changelog]`, the dedup state in Kafka topics;
//! - `admin`: `[admin]`, the admin server's address, tokens (named, with their access) and allowed `Host`s;
//!   `ui`: `[admin.ui]`, the console's sessions and login limits;
//! - `schema_registry`: `[schema_registry]`, Avro schemas and decoding limits;
//! - `handler`: `[[handlers]]`, with `topics`, `http` and `retry` for its parts; `routes`: the handlers
//!   that share a topic, what each selects (`event_types`), and each one's scope and idempotency key;
//! - `traces`: `[tracing.otlp]`, spans exported to an OpenTelemetry collector;
//! - `postgres`: the `kind = "postgres"` part of a handler: the database, statements, inbox;
//! - `logs`: `[log]`, the per-handler summary line;
//! - `values`: durations, sizes and `${VAR}`, shared by all of them;
//! - `error`: [`ConfigError`], what is wrong and in which field; `{:#}` prints it as the CLI shows it.
//!
//! Everything other modules use is re-exported here (`crate::config::HandlerConfig`): the
//! resolved forms for everyone, the `Raw*` forms for the crate only.
//! The reference for users is `docs/configuration.md`; a test keeps it complete.

use std::path::Path;
use std::time::Duration;

mod admin;
mod changelog;
mod circuit;
mod error;
mod handler;
mod http;
mod kafka;
mod logs;
mod postgres;
mod raw;
mod retry;
mod routes;
mod schema_registry;
mod sign;
mod store;
mod topics;
mod traces;
mod ui;
mod values;

#[cfg(test)]
mod doc_keys;

// What an embedding program reads: the validated configuration, its sections and
// their values, and what is wrong with a file.
pub use admin::{Access, AdminConfig, AdminLimits, NamedToken};
pub use changelog::{ChangelogConfig, ChangelogKeys, Secret};
pub use circuit::{CircuitConfig, ConcurrencyConfig};
pub use error::{ConfigError, EnvError};
pub use handler::{
    Body, DedupScope, EventIdSource, Format, HandlerConfig, HandlerKind, HandlerSpec, IdempotencyKey, OnDead,
    OnUncertain,
};
pub use http::{HttpConfig, StatusMatch, StatusRules, VerifyConfig};
pub use kafka::KafkaConfig;
pub use logs::LogConfig;
pub use postgres::{Param, PostgresConfig, Statement};
pub use retry::RetryConfig;
pub use routes::{shares_a_topic, Condition, ConditionOn, EventTypes, Route};
pub use schema_registry::RegistryOptions;
pub use sign::{SignConfig, SignScheme};
pub use store::StoreConfig;
pub use topics::TopicMatch;
pub use traces::OtlpConfig;
pub use ui::UiConfig;
pub use values::ExpandedUrl;

// The file as written, and the crate's own constants.
internal_use!(admin::{RawAdmin, ADMIN_TOKEN_NAME, RUN_TOKEN_NAME});
internal_use!(handler::RawHandler);
internal_use!(kafka::RawKafka);
internal_use!(logs::RawLog);
internal_use!(raw::RawConfig);
internal_use!(schema_registry::RawSchemaRegistry);
internal_use!(store::RawStore);
internal_use!(traces::RawTracing);
pub(crate) use changelog::DEFAULT_MAX_CLOCK_SKEW;
pub(crate) use store::DEFAULT_MEMORY_RECORDS;
pub(crate) use store::DEFAULT_RETENTION;

/// Added to the longest legitimate wait of a partition's head event (see
/// [`Config::stall_timeout`]): time for the dead letter and the record.
const STALL_MARGIN: Duration = Duration::from_secs(60);

/// The validated configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The consumer: brokers, group, commit and drain timing, librdkafka options.
    pub kafka: KafkaConfig,
    /// The dedup store: directory, retention, group commit, in-flight bounds.
    pub store: StoreConfig,
    /// The admin server: address, token, allowed `Host`s (the defaults without `[admin]`).
    pub admin: AdminConfig,
    /// Where Avro writer schemas come from; `None` without a `[schema_registry]` section.
    pub schema_registry: Option<RegistryOptions>,
    /// In file order, at least one; each topic matches exactly one of them.
    pub handlers: Vec<HandlerConfig>,
    /// Where spans are exported (`[tracing.otlp]`); `None`: nowhere. The `outboxd`
    /// binary installs the exporter; a program embedding outboxd installs its own.
    pub otlp: Option<OtlpConfig>,
    /// What the log sums up instead of naming each event (`[log]`).
    pub log: LogConfig,
}

impl Config {
    /// Reads, parses and validates the file; `${VAR}` comes from `env`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.to_owned(), error })?;
        Config::parse(&text, &|name| std::env::var(name).ok())
            .map_err(|error| ConfigError::File { path: path.to_owned(), error: Box::new(error) })
    }

    /// Parses and validates the text of a config file; `env` resolves `${VAR}`
    /// (a variable it answers `None` for is an error).
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)?;
        raw.validate(env)
    }

    /// The topic's first route (the handler that reads and dead-letters what no
    /// route decodes), if any handler takes it.
    pub fn handler_for(&self, topic: &str) -> Option<&HandlerConfig> {
        self.handlers.iter().find(|h| h.topics.matches(topic))
    }

    /// The handler of `route` of `topic`: the topic's first route for `None`, else the
    /// later route of that name (as a record's scope names it).
    pub fn route_handler(&self, topic: &str, route: Option<&str>) -> Option<&HandlerConfig> {
        match route {
            None => self.handler_for(topic),
            Some(name) => self.handlers.iter().find(|h| h.name == name),
        }
    }

    /// Routes that can never select an event (a warning each, for `check-config` and the log).
    pub fn route_warnings(&self) -> Vec<String> {
        routes::never_selecting(&self.handlers)
    }

    /// Every handler that takes `topic`, as its routes in the file's order (see `routes`).
    pub fn routes_for<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = Route<'a>> + 'a {
        routes::of(&self.handlers, topic)
    }

    /// How long a partition may wait without its offset moving before it is reported
    /// stalled. By default the longest an event at the head of a partition can
    /// legitimately take (a handler's `retry.max_elapsed` plus one more attempt's
    /// `timeout`), and a minute for the dead letter and the record.
    pub fn stall_timeout(&self) -> Duration {
        self.kafka.stall_timeout.unwrap_or_else(|| {
            let longest = self
                .handlers
                .iter()
                .map(|h| {
                    let attempt = match &h.spec {
                        HandlerSpec::Http(http) => http.timeout,
                        HandlerSpec::Log => Duration::ZERO,
                        HandlerSpec::Postgres(pg) => pg.timeout,
                    };
                    h.retry.max_elapsed.saturating_add(attempt)
                })
                .max()
                .unwrap_or_default();
            longest.saturating_add(STALL_MARGIN)
        })
    }

    /// Every subscription entry of every handler.
    pub fn subscriptions(&self) -> Vec<String> {
        let mut subs: Vec<String> = self.handlers.iter().flat_map(|h| h.topics.subscription()).collect();
        subs.sort();
        subs.dedup();
        subs
    }
}

/// What the tests of every section start from.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Config, ConfigError};

    pub fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    pub const BASE: &str = r#"
[kafka]
brokers = "127.0.0.1:9092"
group_id = "outboxd"
[store]
path = "./data"
"#;

    /// `BASE` followed by `handlers`.
    pub fn parse(handlers: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{BASE}{handlers}"), &env)
    }

    pub fn err(handlers: &str) -> String {
        format!("{:#}", parse(handlers).expect_err("config should be rejected"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testing::{err, parse};
    use super::*;

    #[test]
    fn full_example_parses_with_defaults() {
        let c = parse(
            r#"
[[handlers]]
topics = ["outbox.event.order"]
kind = "http"
url = "http://127.0.0.1:8080/orders/{aggregate_id}/events"
headers = { Authorization = "Bearer ${TOKEN}" }
timeout = "10s"

[[handlers]]
topic_pattern = "^outbox\\.event\\.cust.*"
kind = "log"
"#,
        )
        .unwrap();
        assert_eq!(c.store.retention, Duration::from_secs(7 * 86400));
        assert_eq!(c.store.max_in_flight, 256);
        assert!(c.store.fsync);
        let HandlerSpec::Http(http) = &c.handlers[0].spec else { panic!("http expected") };
        assert_eq!(http.headers, vec![("Authorization".to_owned(), "Bearer s3cret".to_owned())]);
        assert_eq!(http.idempotency_header.as_deref(), Some("Idempotency-Key"));
        assert_eq!(c.handlers[0].event_id, EventIdSource::Header("id".into()));
        assert_eq!(c.handler_for("outbox.event.customer").unwrap().index, 1);
        assert!(c.handler_for("other").is_none());
    }

    /// Every secret a config can hold, each written in the file or coming from `${VAR}`:
    /// `Debug` of the whole config shows none of them (and still what they belong to).
    #[test]
    fn debug_of_the_config_shows_no_secret() {
        let env = |name: &str| {
            let value = match name {
                "KAFKA_OAUTH" => "fake-kafka-oauth-secret-from-env",
                "KAFKA_CLIENT" => "fake-kafka-client-id-from-env",
                "CHANGELOG_KEY" => "fake-changelog-key-from-env-0123456789abcdef",
                "SR_PASSWORD" => "fake-registry-password-from-env",
                "HOOK_PATH" => "fake-hook-path-from-env",
                "HOOK_CODE" => "fake-hook-code-from-env",
                "HOOK_TOKEN" => "fake-hook-bearer-from-env",
                "HEALTH_CODE" => "fake-health-code-from-env",
                "OTLP_PASS" => "fake-otlp-password-from-env",
                "OTLP_TENANT" => "fake-otlp-tenant-from-env",
                "OTLP_TOKEN" => "fake-otlp-bearer-from-env",
                "ADMIN_TOKEN" => "fake-admin-token-from-env",
                "ALICE_TOKEN" => "fake-alice-token-from-env",
                _ => return None,
            };
            Some(value.to_owned())
        };
        let text = r#"
[kafka]
brokers = "127.0.0.1:9092"
group_id = "outboxd"
[kafka.options]
"security.protocol" = "SASL_SSL"
"sasl.password" = "fake-kafka-sasl-password-literal"
"ssl.key.password" = "fake-kafka-ssl-key-password-literal"
"sasl.oauthbearer.client.secret" = "${KAFKA_OAUTH}"
"client.id" = "${KAFKA_CLIENT}"

[store]
path = "./data"
[store.changelog]
key = "${CHANGELOG_KEY}"
previous_keys = ["fake-changelog-previous-key-literal-0123456789"]

[admin]
token = "${ADMIN_TOKEN}"
[[admin.tokens]]
name = "alice"
token = "${ALICE_TOKEN}"

[schema_registry]
url = "https://fake-registry-user-in-url:fake-registry-password-in-url@registry.example/?key=fake-registry-query-key"
username = "fake-registry-username-literal"
password = "${SR_PASSWORD}"

[tracing.otlp]
endpoint = "https://ingest:${OTLP_PASS}@otlp.example/${OTLP_TENANT}"
headers = { Authorization = "Bearer ${OTLP_TOKEN}", X-Literal = "fake-otlp-header-literal" }

[[handlers]]
topics = ["outbox.event.order"]
kind = "http"
url = "https://fake-hook-user:fake-hook-password-literal@hooks.example/${HOOK_PATH}/{event_id}?code=${HOOK_CODE}"
headers = { Authorization = "Bearer ${HOOK_TOKEN}", X-Api-Key = "fake-hook-api-key-literal" }
on_uncertain = "verify"
[handlers.verify]
url = "https://fake-verify-user:fake-verify-password-literal@hooks.example/lookup/{event_id}?code=${HOOK_CODE}"
[handlers.circuit]
health_url = "https://fake-health-user:fake-health-password-literal@hooks.example/health?code=${HEALTH_CODE}"
"#;
        let config = Config::parse(text, &env).unwrap();
        let secrets = [
            "fake-kafka-sasl-password-literal",
            "fake-kafka-ssl-key-password-literal",
            "fake-kafka-oauth-secret-from-env",
            "fake-kafka-client-id-from-env",
            "fake-changelog-key-from-env",
            "fake-changelog-previous-key-literal",
            "fake-registry-user-in-url",
            "fake-registry-password-in-url",
            "fake-registry-query-key",
            "fake-registry-username-literal",
            "fake-registry-password-from-env",
            "fake-otlp-password-from-env",
            "fake-otlp-tenant-from-env",
            "fake-otlp-bearer-from-env",
            "fake-otlp-header-literal",
            "fake-hook-user",
            "fake-hook-password-literal",
            "fake-hook-path-from-env",
            "fake-hook-code-from-env",
            "fake-hook-bearer-from-env",
            "fake-hook-api-key-literal",
            "fake-verify-user",
            "fake-verify-password-literal",
            "fake-health-user",
            "fake-health-password-literal",
            "fake-health-code-from-env",
        ];
        // `[admin] token` and `[[admin.tokens]]` are redacted in src/config/admin.rs, not yet:
        let admin_secrets: &[&str] = &["fake-admin-token-from-env", "fake-alice-token-from-env"];
        for shown in [format!("{config:?}"), format!("{config:#?}")] {
            for secret in secrets.iter().chain(admin_secrets) {
                assert!(!shown.contains(secret), "{secret} in Debug of the config:\n{shown}");
            }
            for kept in ["sasl.password", "SASL_SSL", "registry.example", "${HOOK_PATH}", "X-Api-Key", "otlp.example"] {
                assert!(shown.contains(kept), "{kept} is not a secret and is shown:\n{shown}");
            }
        }
    }

    #[test]
    fn unknown_key_is_rejected() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nurll=\"x\"\n");
        assert!(e.contains("unknown field `urll`"), "{e}");
    }

    #[test]
    fn stall_timeout_defaults_to_the_longest_handler_wait_plus_a_minute() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"http://h/\"\ntimeout=\"30s\"\n").unwrap();
        assert_eq!(c.stall_timeout(), Duration::from_secs(20 * 60 + 30 + 60));
    }
}
