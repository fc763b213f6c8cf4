//! Configuration: plain serde data, named defaults, then `validate()` which
//! turns it into the resolved form the engine uses. Every error names the
//! field it is about (`handlers[1].url: ...`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use regex::Regex;
use serde::Deserialize;

use crate::template::UrlTemplate;

/// Offsets are committed this often; a crash re-delivers at most this much,
/// and the dedup store absorbs it.
const DEFAULT_OFFSET_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Below the default `session.timeout.ms` (45 s) so a drain never costs the
/// group its member.
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Done/dead records are kept this long; a redelivery older than that runs again.
const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Group-commit window: a few ms batches hundreds of records per fdatasync.
const DEFAULT_STORE_COMMIT_INTERVAL: Duration = Duration::from_millis(2);
/// sled's page cache: its own default (1 GiB) made outboxd's RSS grow with the store.
const DEFAULT_STORE_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// Events handled at once across keys; also bounds what is read ahead.
const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// How often expired records are removed.
const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(600);
/// An HTTP receiver that has not answered by then is treated as failed (retried).
const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Prometheus' registered default port for exporters of this kind; loopback only.
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
const DEFAULT_EVENT_ID_HEADER: &str = "id";
const DEFAULT_EVENT_TYPE_HEADER: &str = "eventType";
/// A few quick retries; permanent failures and exhausted retries end `dead`.
const DEFAULT_MAX_ATTEMPTS: u32 = 3;
const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
const DEFAULT_BACKOFF_MULTIPLIER: f32 = 2.0;
/// Stop retrying well inside the shortest common idempotency-key window
/// (30 minutes at several APIs; Stripe keeps keys 24 h): a retry after the
/// receiver forgot the key could repeat the side effect.
const DEFAULT_MAX_ELAPSED: Duration = Duration::from_secs(20 * 60);
/// librdkafka's default `session.timeout.ms`.
/// Added to the longest legitimate wait of a partition's head event (see `Config::stall_timeout`).
const STALL_MARGIN: Duration = Duration::from_secs(60);
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);
/// Message bytes held in flight: a few huge messages (a poison flood of 100 MB
/// values) must not exhaust memory, while 256 ordinary events fit many times over.
const DEFAULT_MAX_IN_FLIGHT_BYTES: u32 = 256 * 1024 * 1024;
/// Disk for copies of failed messages (for `store export`/`retry`): a poison flood
/// of large messages must not fill the disk and stop the service; past it the
/// records are still kept (and the dead-letter topic has the messages).
const DEFAULT_MAX_MESSAGE_COPY_BYTES: u64 = 1024 * 1024 * 1024;
/// Upper bound on `max_in_flight`: each in-flight event holds its payload in memory.
const MAX_IN_FLIGHT_LIMIT: usize = 65_536;

/// The file as written by the user.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub kafka: RawKafka,
    pub store: RawStore,
    pub admin: Option<RawAdmin>,
    pub schema_registry: Option<RawSchemaRegistry>,
    #[serde(default)]
    pub handlers: Vec<RawHandler>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    pub brokers: String,
    pub group_id: String,
    /// How often finished offsets are committed (librdkafka auto-commit of stored offsets).
    pub commit_interval: Option<String>,
    /// How long SIGINT/SIGTERM waits for in-flight events before giving up on them.
    pub drain_timeout: Option<String>,
    /// A partition whose events wait while its offset has not moved for this long is
    /// reported stalled (`/readyz`, `outboxd_partitions_stalled`).
    pub stall_timeout: Option<String>,
    /// Passed to librdkafka as-is.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSchemaRegistry {
    /// A Confluent-compatible registry (`GET /schemas/ids/{id}`).
    pub url: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// PEM CA for a registry behind TLS with a private CA (system roots otherwise).
    pub ca_file: Option<PathBuf>,
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

/// How a handler reads message values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Avro when the value has the Confluent framing, else JSON or text.
    #[default]
    Auto,
    Json,
    Avro,
    /// The bytes as they are.
    Raw,
}

/// What the handler sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Body {
    /// The decoded value as JSON (JSON when it is JSON).
    #[default]
    Json,
    /// The original value bytes.
    Raw,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// `host:port` of the admin HTTP server (health, metrics, store API), or `"off"`.
    pub listen: Option<String>,
    /// Bearer token for the store API (`/v1/*`) from other machines; required
    /// when `listen` is not loopback. Local callers use the per-run token.
    pub token: Option<String>,
    /// More `Host` header values the store API answers to (`host` or `host:port`),
    /// besides the listen address and the loopback names of its port.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub path: PathBuf,
    pub retention: Option<String>,
    pub commit_interval: Option<String>,
    pub max_in_flight: Option<usize>,
    /// Bytes of consumed messages (key, value, headers) held in flight, e.g. "256MiB".
    pub max_in_flight_bytes: Option<String>,
    /// Disk kept for message copies of failed events, e.g. "1GiB".
    pub max_message_copy_bytes: Option<String>,
    pub gc_interval: Option<String>,
    /// `true` (default): fdatasync before a claim or completion counts.
    /// `false` survives a process crash but not a power loss.
    pub fsync: Option<bool>,
    /// Size of the store's page cache, e.g. "64MiB".
    pub cache_size: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    Http,
    Log,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHandler {
    pub topics: Option<Vec<String>>,
    pub topic_pattern: Option<String>,
    pub kind: HandlerKind,
    pub url: Option<String>,
    pub method: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Header carrying the event id to the receiver; `""` turns it off.
    pub idempotency_header: Option<String>,
    pub timeout: Option<String>,
    pub event_id: Option<EventIdSource>,
    /// Kafka header holding the event type (Debezium: `table.fields.additional.placement`).
    pub event_type_header: Option<String>,
    pub retry: Option<RawRetry>,
    /// HTTP statuses that count as success / permanent failure / retry, overriding the defaults.
    #[serde(default)]
    pub success_on: Vec<StatusMatch>,
    #[serde(default)]
    pub fail_on: Vec<StatusMatch>,
    #[serde(default)]
    pub retry_on: Vec<StatusMatch>,
    pub dead_letter: Option<RawDeadLetter>,
    /// What to do with an event found `claimed` (an earlier attempt's outcome is unknown).
    pub on_uncertain: Option<OnUncertain>,
    /// Which records a duplicate is looked up in: `topic` (default) or `shared`.
    pub dedup_scope: Option<DedupScope>,
    pub verify: Option<RawVerify>,
    pub format: Option<Format>,
    pub body: Option<Body>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetter {
    pub topic: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    pub url: String,
    pub method: Option<String>,
}

/// The policy for an event whose earlier attempt may or may not have happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUncertain {
    /// Run again with the same idempotency key.
    #[default]
    Retry,
    /// Ask the receiver first (`verify.url`): 2xx = it happened, 404 = run it.
    Verify,
    /// Never re-run automatically: record `parked`, dead-letter it, let a person decide.
    Park,
}

/// Where an event id is unique, so where its record is looked up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DedupScope {
    /// Per topic: equal ids of different topics (rows of different tables read with
    /// `event_id = { field = "after.id" }`) are different events. Debezium re-emits
    /// an event on the topic it was routed to, so a replay is still caught.
    #[default]
    Topic,
    /// One scope for all of this handler's topics, and all other `shared` handlers:
    /// for pipelines that move an event to another topic (a changed routing).
    Shared,
}

impl DedupScope {
    /// The store's scope for an event consumed from `topic`.
    pub fn of(self, topic: &str) -> &str {
        match self {
            DedupScope::Topic => topic,
            DedupScope::Shared => "",
        }
    }
}

/// An HTTP status (`409`) or a class (`"5xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum StatusMatch {
    Code(u16),
    Class(u16),
}

impl StatusMatch {
    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Code(c) => c == status,
            StatusMatch::Class(c) => status / 100 == c,
        }
    }
}

impl TryFrom<toml::Value> for StatusMatch {
    type Error = String;

    fn try_from(v: toml::Value) -> Result<StatusMatch, String> {
        let bad = || format!("expected a status such as 409 or a class such as \"5xx\", got {v}");
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub max_attempts: Option<u32>,
    pub initial_backoff: Option<String>,
    pub max_backoff: Option<String>,
    pub multiplier: Option<f32>,
    /// Give up once this much time has passed since the first attempt of a delivery.
    pub max_elapsed: Option<String>,
}

/// Where the event id (the dedup key) is found.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum EventIdSource {
    /// A Kafka header (Debezium's EventRouter puts the outbox `id` column in header `id`).
    Header(String),
    /// A dotted path into the JSON value, e.g. `after.id` for raw change events.
    Field(String),
}

impl Default for EventIdSource {
    fn default() -> Self {
        EventIdSource::Header(DEFAULT_EVENT_ID_HEADER.to_owned())
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub store: StoreConfig,
    pub admin: AdminConfig,
    pub schema_registry: Option<crate::avro::RegistryOptions>,
    pub handlers: Vec<HandlerConfig>,
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// `None` when turned off.
    pub listen: Option<std::net::SocketAddr>,
    /// Resolved from `${VAR}`: never logged or printed.
    pub token: Option<String>,
    /// Lower-case `host` or `host:port` entries; default empty (only the listen
    /// address and loopback names pass the DNS-rebinding check).
    pub allowed_hosts: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct KafkaConfig {
    pub brokers: String,
    pub group_id: String,
    pub commit_interval: Duration,
    pub drain_timeout: Duration,
    /// `None`: derived from the handlers (see [`Config::stall_timeout`]).
    pub stall_timeout: Option<Duration>,
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
    pub cache_bytes: u64,
    pub retention: Duration,
    pub commit_interval: Duration,
    pub max_in_flight: usize,
    /// At most this many message bytes in flight (a larger message runs alone).
    pub max_in_flight_bytes: u32,
    /// Past this, failed events are recorded without their message copy.
    pub max_message_copy_bytes: u64,
    pub gc_interval: Duration,
    pub fsync: bool,
}

#[derive(Debug, Clone)]
pub enum TopicMatch {
    Exact(Vec<String>),
    Pattern(Regex),
}

impl TopicMatch {
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            TopicMatch::Exact(topics) => topics.iter().any(|t| t == topic),
            TopicMatch::Pattern(re) => re.is_match(topic),
        }
    }

    /// The librdkafka subscription: exact names, or `^regex`.
    pub fn subscription(&self) -> Vec<String> {
        match self {
            TopicMatch::Exact(topics) => topics.clone(),
            TopicMatch::Pattern(re) => {
                let s = re.as_str();
                vec![if s.starts_with('^') { s.to_owned() } else { format!("^{s}") }]
            }
        }
    }
}

impl std::fmt::Display for TopicMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopicMatch::Exact(t) => write!(f, "{}", t.join(", ")),
            TopicMatch::Pattern(re) => write!(f, "/{}/", re.as_str()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub url: UrlTemplate,
    pub method: reqwest::Method,
    /// Values with `${VAR}` already resolved: never log them.
    pub headers: Vec<(String, String)>,
    pub idempotency_header: Option<String>,
    pub timeout: Duration,
    pub classify: StatusRules,
    /// The lookup for `on_uncertain = "verify"`.
    pub verify: Option<VerifyConfig>,
}

/// Overrides of the default status classification, checked in this order.
#[derive(Debug, Clone, Default)]
pub struct StatusRules {
    pub success_on: Vec<StatusMatch>,
    pub fail_on: Vec<StatusMatch>,
    pub retry_on: Vec<StatusMatch>,
}

#[derive(Debug, Clone)]
pub struct VerifyConfig {
    pub url: UrlTemplate,
    pub method: reqwest::Method,
}

#[derive(Debug, Clone)]
pub enum HandlerSpec {
    Http(Box<HttpConfig>),
    Log,
}

#[derive(Debug, Clone)]
pub struct RetryConfig {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f32,
    pub max_elapsed: Duration,
}

#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// Position in the file, for messages (`handlers[2]`).
    pub index: usize,
    pub topics: TopicMatch,
    pub spec: HandlerSpec,
    pub event_id: EventIdSource,
    pub event_type_header: String,
    pub retry: RetryConfig,
    /// Where dead events go; without one, `dead` records keep the message for export.
    pub dead_letter_topic: Option<String>,
    pub on_uncertain: OnUncertain,
    pub dedup_scope: DedupScope,
    pub format: Format,
    pub body: Body,
}

impl Config {
    /// Reads, parses and validates the file; `${VAR}` comes from `env`.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
        Config::parse(&text, &|name| std::env::var(name).ok())
            .with_context(|| format!("invalid config {}", path.display()))
    }

    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Config> {
        let raw: RawConfig = toml::from_str(text)?;
        raw.validate(env)
    }

    /// The handler for a topic, if any.
    pub fn handler_for(&self, topic: &str) -> Option<&HandlerConfig> {
        self.handlers.iter().find(|h| h.topics.matches(topic))
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

fn duration(field: &str, value: Option<&str>, default: Duration) -> anyhow::Result<Duration> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v.trim())
            .map_err(|e| anyhow::anyhow!("{field}: {e} (expected e.g. \"250ms\", \"10s\", \"5m\", \"7d\")")),
    }
}

/// Replaces `${VAR}` with the environment's value; an unset variable is an error.
pub fn expand_env(field: &str, value: &str, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            bail!("{field}: unterminated \"${{\"");
        };
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("{field}: invalid variable name {name:?}");
        }
        match env(name) {
            Some(v) => out.push_str(&v),
            None => bail!("{field}: environment variable {name} is not set"),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl RawConfig {
    pub fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Config> {
        let k = self.kafka;
        if k.brokers.trim().is_empty() {
            bail!("kafka.brokers: must not be empty");
        }
        if k.group_id.trim().is_empty() {
            bail!("kafka.group_id: must not be empty");
        }
        for reserved in ["enable.auto.offset.store", "group.id", "bootstrap.servers"] {
            if k.options.contains_key(reserved) {
                bail!("kafka.options.\"{reserved}\": set by outboxd itself (offsets are stored only after events are durably finished)");
            }
        }
        let mut options = BTreeMap::new();
        for (key, v) in k.options {
            let field = format!("kafka.options.\"{key}\"");
            options.insert(key, expand_env(&field, &v, env)?);
        }
        let kafka = KafkaConfig {
            brokers: k.brokers,
            group_id: k.group_id,
            commit_interval: duration(
                "kafka.commit_interval",
                k.commit_interval.as_deref(),
                DEFAULT_OFFSET_COMMIT_INTERVAL,
            )?,
            drain_timeout: duration("kafka.drain_timeout", k.drain_timeout.as_deref(), DEFAULT_DRAIN_TIMEOUT)?,
            stall_timeout: k
                .stall_timeout
                .as_deref()
                .map(|v| duration("kafka.stall_timeout", Some(v), Duration::ZERO))
                .transpose()?,
            options,
        };
        if kafka.stall_timeout.is_some_and(|t| t.is_zero()) {
            bail!("kafka.stall_timeout: must be greater than 0");
        }
        if kafka.commit_interval.is_zero() {
            bail!("kafka.commit_interval: must be greater than 0");
        }
        let session_timeout = match kafka.options.get("session.timeout.ms") {
            None => DEFAULT_SESSION_TIMEOUT,
            Some(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| {
                anyhow::anyhow!("kafka.options.\"session.timeout.ms\": not a number of milliseconds: {ms:?}")
            })?),
        };
        if kafka.drain_timeout >= session_timeout {
            bail!(
                "kafka.drain_timeout: {} must be shorter than session.timeout.ms ({}), or the group evicts outboxd while it drains",
                humantime::format_duration(kafka.drain_timeout),
                humantime::format_duration(session_timeout)
            );
        }

        let s = self.store;
        if s.path.as_os_str().is_empty() {
            bail!("store.path: must not be empty");
        }
        let max_in_flight = s.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
        if max_in_flight == 0 || max_in_flight > MAX_IN_FLIGHT_LIMIT {
            bail!("store.max_in_flight: must be between 1 and {MAX_IN_FLIGHT_LIMIT}, got {max_in_flight}");
        }
        let max_in_flight_bytes = match s.max_in_flight_bytes.as_deref() {
            None => DEFAULT_MAX_IN_FLIGHT_BYTES,
            Some(text) => parse_size(text)
                .filter(|n| (1..=u64::from(u32::MAX)).contains(n))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "store.max_in_flight_bytes: {text:?} is not a size between 1 byte and 4GiB such as \"256MiB\""
                    )
                })?,
        };
        let max_message_copy_bytes = match s.max_message_copy_bytes.as_deref() {
            None => DEFAULT_MAX_MESSAGE_COPY_BYTES,
            Some(text) => parse_size(text).ok_or_else(|| {
                anyhow::anyhow!("store.max_message_copy_bytes: {text:?} is not a size such as \"1GiB\"")
            })?,
        };
        let cache_bytes = match s.cache_size.as_deref() {
            None => DEFAULT_STORE_CACHE_BYTES,
            Some(text) => parse_size(text).ok_or_else(|| {
                anyhow::anyhow!("store.cache_size: {text:?} is not a size such as \"64MiB\" or \"1GiB\"")
            })?,
        };
        let store = StoreConfig {
            cache_bytes,
            path: s.path,
            retention: duration("store.retention", s.retention.as_deref(), DEFAULT_RETENTION)?,
            commit_interval: duration(
                "store.commit_interval",
                s.commit_interval.as_deref(),
                DEFAULT_STORE_COMMIT_INTERVAL,
            )?,
            max_in_flight,
            max_in_flight_bytes,
            max_message_copy_bytes,
            gc_interval: duration("store.gc_interval", s.gc_interval.as_deref(), DEFAULT_GC_INTERVAL)?,
            fsync: s.fsync.unwrap_or(true),
        };
        if store.retention.is_zero() {
            bail!("store.retention: must be greater than 0");
        }
        if store.gc_interval.is_zero() {
            bail!("store.gc_interval: must be greater than 0");
        }

        let admin = validate_admin(self.admin, env)?;
        let schema_registry = self.schema_registry.map(|r| validate_registry(r, &store.path, env)).transpose()?;

        if self.handlers.is_empty() {
            bail!("handlers: at least one [[handlers]] entry is required");
        }
        let mut handlers = Vec::with_capacity(self.handlers.len());
        for (index, h) in self.handlers.into_iter().enumerate() {
            handlers.push(h.validate(index, env)?);
        }
        check_overlaps(&handlers)?;
        if let Some(h) = handlers.iter().find(|h| h.format == Format::Avro) {
            if schema_registry.is_none() {
                bail!("handlers[{}].format: \"avro\" needs a [schema_registry] section (url or schemas_dir)", h.index);
            }
        }
        Ok(Config { kafka, store, admin, schema_registry, handlers })
    }
}

/// `"64MiB"`, `"1GiB"`, `"512KiB"`, `"100MB"`, or plain bytes.
fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Default time a registry request may take before it counts as unavailable.
const DEFAULT_REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest allocation apache-avro may make for one string, bytes value or
/// collection. Its own default (512 MiB) lets one hostile length prefix take
/// that much memory; 16 MiB is far above Kafka's default message size (1 MB).
/// Raise it together with the topic's `max.message.bytes`.
const DEFAULT_MAX_ALLOCATION_BYTES: u64 = 16 << 20;

fn validate_registry(
    raw: RawSchemaRegistry,
    store_path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<crate::avro::RegistryOptions> {
    let url = raw.url.map(|u| expand_env("schema_registry.url", &u, env)).transpose()?;
    if let Some(u) = &url {
        let parsed = url::Url::parse(u).map_err(|e| anyhow::anyhow!("schema_registry.url: {e}"))?;
        if parsed.scheme() != "http" && parsed.scheme() != "https" {
            bail!("schema_registry.url: scheme must be http or https");
        }
    }
    if url.is_none() && raw.schemas_dir.is_none() {
        bail!("schema_registry: set url, schemas_dir, or both");
    }
    let password = raw.password.map(|p| expand_env("schema_registry.password", &p, env)).transpose()?;
    let username = raw.username.map(|u| expand_env("schema_registry.username", &u, env)).transpose()?;
    if password.is_some() && username.is_none() {
        bail!("schema_registry.username: required with a password");
    }
    let max_allocation_bytes = match raw.max_allocation_bytes.as_deref() {
        None => DEFAULT_MAX_ALLOCATION_BYTES,
        Some(text) => parse_size(text).filter(|n| *n > 0).ok_or_else(|| {
            anyhow::anyhow!("schema_registry.max_allocation_bytes: {text:?} is not a size such as \"16MiB\"")
        })?,
    };
    Ok(crate::avro::RegistryOptions {
        url: url.map(|u| u.trim_end_matches('/').to_owned()),
        username,
        password,
        ca_file: raw.ca_file,
        timeout: duration("schema_registry.timeout", raw.timeout.as_deref(), DEFAULT_REGISTRY_TIMEOUT)?,
        cache_dir: Some(raw.cache_dir.unwrap_or_else(|| store_path.join("schemas"))),
        schemas_dir: raw.schemas_dir,
        max_allocation_bytes: usize::try_from(max_allocation_bytes).unwrap_or(usize::MAX),
        check_subjects: raw.check_subjects.unwrap_or(true),
    })
}

fn validate_admin(raw: Option<RawAdmin>, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<AdminConfig> {
    let raw = raw.unwrap_or_default();
    let token = raw.token.map(|t| expand_env("admin.token", &t, env)).transpose()?;
    if token.as_deref().is_some_and(str::is_empty) {
        bail!("admin.token: must not be empty");
    }
    let listen = match raw.listen.as_deref().map(str::trim) {
        Some("off") => None,
        other => {
            let text = other.unwrap_or(DEFAULT_ADMIN_LISTEN);
            let addr: std::net::SocketAddr = text
                .parse()
                .map_err(|e| anyhow::anyhow!("admin.listen: {text:?} is not host:port ({e}), or \"off\""))?;
            if !addr.ip().is_loopback() && token.is_none() {
                bail!("admin.token: required when admin.listen ({addr}) is not a loopback address (repair operations need it)");
            }
            Some(addr)
        }
    };
    let allowed_hosts = raw
        .allowed_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| allowed_host(h).map_err(|e| anyhow::anyhow!("admin.allowed_hosts[{i}]: {h:?} {e}")))
        .collect::<anyhow::Result<_>>()?;
    Ok(AdminConfig { listen, token, allowed_hosts })
}

/// One `Host` value as it is compared (lower case): a name or address, with an optional port.
fn allowed_host(entry: &str) -> Result<String, &'static str> {
    let (host, port) = match entry.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && (!h.starts_with('[') || h.ends_with(']')) => (h, Some(p)),
        _ => (entry, None),
    };
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err("has a port that is not a number (write host or host:port)");
    }
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/@?#*".contains(c)) {
        return Err("is not a host name (write host or host:port, no scheme, path or wildcard)");
    }
    Ok(entry.to_ascii_lowercase())
}

/// A topic claimed by two handlers is ambiguous: refuse it.
fn check_overlaps(handlers: &[HandlerConfig]) -> anyhow::Result<()> {
    for (i, a) in handlers.iter().enumerate() {
        for b in &handlers[i + 1..] {
            let clash = match (&a.topics, &b.topics) {
                (TopicMatch::Exact(ta), _) => ta.iter().find(|t| b.topics.matches(t)),
                (_, TopicMatch::Exact(tb)) => tb.iter().find(|t| a.topics.matches(t)),
                (TopicMatch::Pattern(pa), TopicMatch::Pattern(pb)) => {
                    if pa.as_str() == pb.as_str() {
                        bail!("handlers[{}].topic_pattern: same pattern as handlers[{}]", b.index, a.index);
                    }
                    None
                }
            };
            if let Some(topic) = clash {
                bail!(
                    "handlers[{}].topics: topic {topic:?} is also claimed by handlers[{}]; each topic needs exactly one handler",
                    b.index,
                    a.index
                );
            }
        }
    }
    Ok(())
}

impl RawHandler {
    fn validate(self, index: usize, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<HandlerConfig> {
        let at = format!("handlers[{index}]");
        let topics = match (self.topics, self.topic_pattern) {
            (Some(_), Some(_)) => bail!("{at}: set either topics or topic_pattern, not both"),
            (None, None) => bail!("{at}: one of topics or topic_pattern is required"),
            (Some(t), None) => {
                if t.is_empty() || t.iter().any(|s| s.trim().is_empty()) {
                    bail!("{at}.topics: must list at least one non-empty topic name");
                }
                if let Some(bad) = t.iter().find(|s| s.starts_with('^')) {
                    bail!("{at}.topics: {bad:?} looks like a pattern; use topic_pattern for regular expressions");
                }
                TopicMatch::Exact(t)
            }
            (None, Some(p)) => {
                // librdkafka matches subscriptions with its own small regex engine.
                if p.contains("(?") {
                    bail!("{at}.topic_pattern: (?...) groups and flags are not supported by librdkafka's regex engine; use plain (a|b) groups");
                }
                let re = Regex::new(&p).map_err(|e| anyhow::anyhow!("{at}.topic_pattern: {e}"))?;
                TopicMatch::Pattern(re)
            }
        };
        let http_only = |name: &str, set: bool| -> anyhow::Result<()> {
            if set && self.kind != HandlerKind::Http {
                bail!("{at}.{name}: only valid for kind = \"http\"");
            }
            Ok(())
        };
        http_only("url", self.url.is_some())?;
        http_only("method", self.method.is_some())?;
        http_only("headers", !self.headers.is_empty())?;
        http_only("idempotency_header", self.idempotency_header.is_some())?;
        http_only("timeout", self.timeout.is_some())?;
        http_only("success_on", !self.success_on.is_empty())?;
        http_only("fail_on", !self.fail_on.is_empty())?;
        http_only("retry_on", !self.retry_on.is_empty())?;
        http_only("verify", self.verify.is_some())?;
        let on_uncertain = self.on_uncertain.unwrap_or_default();
        if on_uncertain == OnUncertain::Verify && self.verify.is_none() {
            bail!("{at}.verify: on_uncertain = \"verify\" needs [{at}.verify] url = \"...\"");
        }
        if self.verify.is_some() && on_uncertain != OnUncertain::Verify {
            bail!("{at}.verify: only used with on_uncertain = \"verify\"");
        }
        let dead_letter_topic = match &self.dead_letter {
            Some(d) if d.topic.trim().is_empty() => bail!("{at}.dead_letter.topic: must not be empty"),
            Some(d) => Some(d.topic.clone()),
            None => None,
        };

        let spec = match self.kind {
            HandlerKind::Log => HandlerSpec::Log,
            HandlerKind::Http => {
                let Some(url) = self.url else {
                    bail!("{at}.url: required for kind = \"http\"");
                };
                let expanded = expand_env(&format!("{at}.url"), &url, env)?;
                let url = UrlTemplate::parse_shown(&expanded, &url).map_err(|e| anyhow::anyhow!("{at}.url: {e}"))?;
                let method_text = self.method.unwrap_or_else(|| "POST".to_owned());
                let method = reqwest::Method::from_bytes(method_text.to_ascii_uppercase().as_bytes())
                    .map_err(|_| anyhow::anyhow!("{at}.method: invalid HTTP method {method_text:?}"))?;
                let mut headers = Vec::new();
                for (name, value) in self.headers {
                    let field = format!("{at}.headers.{name}");
                    reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| anyhow::anyhow!("{field}: invalid header name"))?;
                    let value = expand_env(&field, &value, env)?;
                    reqwest::header::HeaderValue::from_str(&value)
                        .map_err(|_| anyhow::anyhow!("{field}: invalid header value"))?;
                    headers.push((name, value));
                }
                let idempotency_header = match self.idempotency_header {
                    None => Some(DEFAULT_IDEMPOTENCY_HEADER.to_owned()),
                    Some(h) if h.is_empty() => None,
                    Some(h) => {
                        reqwest::header::HeaderName::from_bytes(h.as_bytes())
                            .map_err(|_| anyhow::anyhow!("{at}.idempotency_header: invalid header name {h:?}"))?;
                        Some(h)
                    }
                };
                let timeout = duration(&format!("{at}.timeout"), self.timeout.as_deref(), DEFAULT_HTTP_TIMEOUT)?;
                if timeout.is_zero() {
                    bail!("{at}.timeout: must be greater than 0");
                }
                let classify = StatusRules {
                    success_on: self.success_on.clone(),
                    fail_on: self.fail_on.clone(),
                    retry_on: self.retry_on.clone(),
                };
                let verify = match &self.verify {
                    None => None,
                    Some(v) => {
                        let expanded = expand_env(&format!("{at}.verify.url"), &v.url, env)?;
                        let url = UrlTemplate::parse_shown(&expanded, &v.url)
                            .map_err(|e| anyhow::anyhow!("{at}.verify.url: {e}"))?;
                        let m = v.method.clone().unwrap_or_else(|| "GET".to_owned());
                        let method = reqwest::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                            .map_err(|_| anyhow::anyhow!("{at}.verify.method: invalid HTTP method {m:?}"))?;
                        Some(VerifyConfig { url, method })
                    }
                };
                HandlerSpec::Http(Box::new(HttpConfig {
                    url,
                    method,
                    headers,
                    idempotency_header,
                    timeout,
                    classify,
                    verify,
                }))
            }
        };

        let event_id = self.event_id.unwrap_or_default();
        match &event_id {
            EventIdSource::Header(h) | EventIdSource::Field(h) if h.trim().is_empty() => {
                bail!("{at}.event_id: must name a header or a field")
            }
            _ => {}
        }

        let r = self.retry.unwrap_or(RawRetry {
            max_attempts: None,
            initial_backoff: None,
            max_backoff: None,
            multiplier: None,
            max_elapsed: None,
        });
        let retry = RetryConfig {
            multiplier: r.multiplier.unwrap_or(DEFAULT_BACKOFF_MULTIPLIER),
            max_elapsed: duration(&format!("{at}.retry.max_elapsed"), r.max_elapsed.as_deref(), DEFAULT_MAX_ELAPSED)?,
            max_attempts: r.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            initial_backoff: duration(
                &format!("{at}.retry.initial_backoff"),
                r.initial_backoff.as_deref(),
                DEFAULT_INITIAL_BACKOFF,
            )?,
            max_backoff: duration(&format!("{at}.retry.max_backoff"), r.max_backoff.as_deref(), DEFAULT_MAX_BACKOFF)?,
        };
        if retry.max_attempts == 0 {
            bail!("{at}.retry.max_attempts: must be at least 1");
        }
        if retry.max_backoff < retry.initial_backoff {
            bail!("{at}.retry.max_backoff: must not be less than initial_backoff");
        }
        if !(1.0..=100.0).contains(&retry.multiplier) {
            bail!("{at}.retry.multiplier: must be between 1.0 and 100.0");
        }
        if retry.max_elapsed.is_zero() {
            bail!("{at}.retry.max_elapsed: must be greater than 0");
        }

        Ok(HandlerConfig {
            index,
            topics,
            spec,
            event_id,
            event_type_header: self.event_type_header.unwrap_or_else(|| DEFAULT_EVENT_TYPE_HEADER.to_owned()),
            retry,
            dead_letter_topic,
            on_uncertain,
            dedup_scope: self.dedup_scope.unwrap_or_default(),
            format: self.format.unwrap_or_default(),
            body: self.body.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    const BASE: &str = r#"
[kafka]
brokers = "127.0.0.1:9092"
group_id = "outboxd"
[store]
path = "./data"
"#;

    fn parse(handlers: &str) -> anyhow::Result<Config> {
        Config::parse(&format!("{BASE}{handlers}"), &env)
    }

    fn err(handlers: &str) -> String {
        format!("{:#}", parse(handlers).expect_err("config should be rejected"))
    }

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

    #[test]
    fn unknown_key_is_rejected() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nurll=\"x\"\n");
        assert!(e.contains("unknown field `urll`"), "{e}");
    }

    #[test]
    fn topic_claimed_twice_names_both_handlers() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n[[handlers]]\ntopic_pattern=\"^a$\"\nkind=\"log\"\n");
        assert!(e.contains("handlers[1].topics") && e.contains("handlers[0]"), "{e}");
    }

    #[test]
    fn pattern_that_librdkafka_cannot_compile_is_rejected() {
        let e = err("[[handlers]]\ntopic_pattern=\"^outbox\\\\.(?:a|b)$\"\nkind=\"log\"\n");
        assert!(e.contains("handlers[0].topic_pattern") && e.contains("librdkafka"), "{e}");
    }

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
    fn bad_duration_names_the_field() {
        let e = Config::parse(
            &format!("{BASE}retention = \"7 fortnights\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("store.retention"), "{e:#}");
    }

    #[test]
    fn durations_accept_all_units() {
        for (text, d) in [("5ms", 5u64), ("2s", 2000), ("3m", 180_000), ("1h", 3_600_000), ("1d", 86_400_000)] {
            assert_eq!(duration("x", Some(text), Duration::ZERO).unwrap(), Duration::from_millis(d));
        }
    }

    #[test]
    fn offset_store_option_cannot_be_overridden() {
        let e = Config::parse(
            "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[kafka.options]\n\"enable.auto.offset.store\"=\"true\"\n[store]\npath=\"p\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n",
            &env,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("enable.auto.offset.store"));
    }

    #[test]
    fn http_fields_on_log_handler_are_rejected() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nurl=\"http://h/\"\n");
        assert!(e.contains("handlers[0].url: only valid for kind = \"http\""), "{e}");
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

    #[test]
    fn drain_timeout_must_be_shorter_than_the_session_timeout() {
        let text = "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\ndrain_timeout=\"10s\"\n[kafka.options]\n\"session.timeout.ms\"=\"6000\"\n[store]\npath=\"p\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n";
        let e = format!("{:#}", Config::parse(text, &env).unwrap_err());
        assert!(e.contains("kafka.drain_timeout") && e.contains("session.timeout.ms"), "{e}");
    }

    #[test]
    fn admin_defaults_to_loopback_and_needs_a_token_elsewhere() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n").unwrap();
        assert_eq!(c.admin.listen, Some("127.0.0.1:9464".parse().unwrap()));
        let e = Config::parse(
            &format!("{BASE}[admin]\nlisten=\"0.0.0.0:9464\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("admin.token"), "{e:#}");
        let c = Config::parse(
            &format!("{BASE}[admin]\nlisten=\"0.0.0.0:9464\"\ntoken=\"${{TOKEN}}\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap();
        assert_eq!(c.admin.token.as_deref(), Some("s3cret"));
        let c = Config::parse(
            &format!("{BASE}[admin]\nlisten=\"off\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap();
        assert_eq!(c.admin.listen, None);
    }

    #[test]
    fn admin_allowed_hosts_default_to_none_and_name_a_bad_entry() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n").unwrap();
        assert!(c.admin.allowed_hosts.is_empty());
        let hosts = |list: &str| {
            Config::parse(
                &format!("{BASE}[admin]\nallowed_hosts={list}\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
                &env,
            )
            .map(|c| c.admin.allowed_hosts)
        };
        assert_eq!(
            hosts(r#"["Outboxd.Internal", "10.0.0.7:9464", "[fd00::1]:9464"]"#).unwrap(),
            ["outboxd.internal", "10.0.0.7:9464", "[fd00::1]:9464"]
        );
        for bad in [r#"["ok", "http://x"]"#, r#"["ok", "x:port"]"#, r#"["ok", ""]"#, r#"["ok", "*.example"]"#] {
            let e = format!("{:#}", hosts(bad).unwrap_err());
            assert!(e.contains("admin.allowed_hosts[1]"), "{bad}: {e}");
        }
    }

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

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1 GiB"), Some(1 << 30));
        assert_eq!(parse_size("100MB"), Some(100_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
        let e = Config::parse(
            &format!("{BASE}cache_size = \"1 parsec\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("store.cache_size"));
    }

    #[test]
    fn event_id_field_source_parses() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nevent_id = { field = \"after.id\" }\n").unwrap();
        assert_eq!(c.handlers[0].event_id, EventIdSource::Field("after.id".into()));
    }
}
