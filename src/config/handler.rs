//! `[[handlers]]`: which topics, what runs (`kind`), where the event id is, and
//! what happens on failure (retry, dead letter) and on an uncertain outcome
//! (`on_uncertain`, `verify`). Validation runs in named steps, in the order
//! their errors are reported.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::circuit::{CircuitConfig, ConcurrencyConfig, RawCircuit, RawConcurrency};
use super::http::{HttpConfig, RawVerify, StatusMatch};
use super::postgres::{PostgresConfig, RawInbox, RawStatement};
use super::retry::{RawRetry, RetryConfig};
use super::routes::{Condition, EventTypes, RawCondition};
use super::sign::RawSign;
use super::topics::TopicMatch;
use super::ConfigError;

const DEFAULT_EVENT_ID_HEADER: &str = "id";
/// Where Debezium puts it with `table.fields.additional.placement=type:header:eventType`.
const DEFAULT_EVENT_TYPE_HEADER: &str = "eventType";

/// `handlers[].kind`: what runs for each event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HandlerKind {
    /// Calls an HTTP receiver per event (`url`, `method`, `headers`, ...).
    Http,
    /// Writes one JSON line per event on stdout.
    Log,
    /// Runs SQL statements in the receiver's PostgreSQL database, with an inbox row
    /// keyed by the event in the same transaction (`url`, `statements`, `[handlers.inbox]`).
    Postgres,
}

/// One `[[handlers]]` entry as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHandler {
    /// `handlers[].name`: names the handler in metrics, logs and `/readyz`
    /// (default: its first topic, or its pattern).
    pub name: Option<String>,
    /// `handlers[].topics`: exact topic names; this or `topic_pattern` is required.
    pub topics: Option<Vec<String>>,
    /// `handlers[].topic_pattern`: a regular expression in librdkafka's syntax
    /// (no `(?...)`), subscribed as `^...`.
    pub topic_pattern: Option<String>,
    /// `handlers[].kind`: `http`, `log` or `postgres`.
    pub kind: HandlerKind,
    /// `handlers[].url` (`http` and `postgres`, required there): the URL template, or the database URL; `${VAR}` allowed.
    pub url: Option<String>,
    /// `handlers[].method` (`http` only): the HTTP method, default `POST`.
    pub method: Option<String>,
    /// `handlers[].headers` (`http` only): static headers, values may use `${VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Header carrying the event id to the receiver; `""` turns it off.
    pub idempotency_header: Option<String>,
    /// `handlers[].timeout` (`http` and `postgres`): per request or transaction, e.g. "10s" (the default).
    pub timeout: Option<String>,
    /// `handlers[].event_id`: `{ header = "..." }` or `{ field = "..." }`, default header `id`.
    pub event_id: Option<EventIdSource>,
    /// Kafka header holding the event type (Debezium: `table.fields.additional.placement`).
    pub event_type_header: Option<String>,
    /// `handlers[].event_types`: only events of these types (exact names or globs) run here.
    pub event_types: Option<Vec<String>>,
    /// `[[handlers.when]]`: only events whose header or payload field has one of the values run here.
    #[serde(default)]
    pub when: Vec<RawCondition>,
    /// `[handlers.retry]`: the retry schedule; every key has a default.
    pub retry: Option<RawRetry>,
    /// `[handlers.circuit]`: backing off as a whole while the receiver fails for everyone.
    pub circuit: Option<RawCircuit>,
    /// `[handlers.concurrency]`: how many calls may be in flight.
    pub concurrency: Option<RawConcurrency>,
    /// `handlers[].success_on` (`http` only): statuses that count as success,
    /// overriding the default classification.
    #[serde(default)]
    pub success_on: Vec<StatusMatch>,
    /// `handlers[].fail_on` (`http` only): statuses that are permanent failures (dead).
    #[serde(default)]
    pub fail_on: Vec<StatusMatch>,
    /// `handlers[].retry_on` (`http` only): statuses that are retried.
    #[serde(default)]
    pub retry_on: Vec<StatusMatch>,
    /// `[handlers.dead_letter]`: the topic dead events are produced to.
    pub dead_letter: Option<RawDeadLetter>,
    /// What to do with an event found `claimed` (an earlier attempt's outcome is unknown).
    pub on_uncertain: Option<OnUncertain>,
    /// What the later events of a key do once one of its events is dead or parked.
    pub on_dead: Option<OnDead>,
    /// Which records a duplicate is looked up in: `topic` (default) or `shared`.
    pub dedup_scope: Option<DedupScope>,
    /// The idempotency key it sends: `event_id` or `route` (default: by its place
    /// among its topic's routes).
    pub idempotency_key: Option<IdempotencyKey>,
    /// `[handlers.verify]` (`http` only): the lookup for `on_uncertain = "verify"`,
    /// and only allowed with it.
    pub verify: Option<RawVerify>,
    /// `[handlers.sign]` (`http` only): Standard Webhooks signatures on each call.
    pub sign: Option<RawSign>,
    /// `handlers[].statements` (`postgres` only): the SQL run for each event, in one transaction.
    #[serde(default)]
    pub statements: Vec<RawStatement>,
    /// `[handlers.inbox]` (`postgres` only): the table of idempotency keys written in that transaction.
    pub inbox: Option<RawInbox>,
    /// `handlers[].pool_size` (`postgres` only): connections to the database, at most.
    pub pool_size: Option<usize>,
    /// `handlers[].tls_ca` (`postgres` only): a PEM file of the CA certificates that
    /// sign the database's certificate, with `sslmode=require` in the URL.
    pub tls_ca: Option<String>,
    /// `handlers[].format`: how values are read, default `auto`.
    pub format: Option<Format>,
    /// `handlers[].body`: what the handler sends, default `json`.
    pub body: Option<Body>,
}

/// `[handlers.dead_letter]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetter {
    /// `handlers[].dead_letter.topic`: where permanent failures, exhausted retries and
    /// undecodable messages are produced; must not be empty.
    pub topic: String,
}

/// How a handler reads message values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Format {
    /// Avro when the value has the Confluent framing, else JSON or text.
    #[default]
    Auto,
    /// JSON, or text when the value is not JSON.
    Json,
    /// Avro in the Confluent framing, required (needs `[schema_registry]`).
    Avro,
    /// The bytes as they are.
    Raw,
}

/// What the handler sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Body {
    /// The decoded value as JSON (JSON when it is JSON).
    #[default]
    Json,
    /// The original value bytes.
    Raw,
}

/// The policy for an event whose earlier attempt may or may not have happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OnUncertain {
    /// Run again with the same idempotency key.
    #[default]
    Retry,
    /// Ask the receiver first (`verify.url`): 2xx = it happened, 404 = run it.
    Verify,
    /// Never re-run automatically: record `parked`, dead-letter it, let a person decide.
    Park,
}

/// What becomes of the later events of a Kafka key (in its partition) once one of
/// its events is dead or parked: permanent failure, retries used up, a panic, an
/// undecodable message, `on_uncertain = "park"`. Messages without a key are never
/// held (there is no order of a key to keep).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OnDead {
    /// They are recorded `held` behind it (with their message copies; their offsets
    /// move) and run in order, once each, after it is retried to done, resolved or
    /// forgotten. The default: an outbox key is an aggregate, whose later events
    /// usually assume the earlier ones happened (docs/configuration.md argues it).
    #[default]
    Hold,
    /// They run as if nothing happened (the behaviour before `on_dead` existed).
    Continue,
}

impl OnDead {
    /// Whether a dead or parked event holds its key's later events.
    pub fn holds(self) -> bool {
        self == OnDead::Hold
    }
}

/// Where an event id is unique, so where its record is looked up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
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

/// The idempotency key a route sends (`Idempotency-Key`, `webhook-id`, a log line's
/// `idempotency_key`), when the config names it rather than leaving it to the route's
/// place (docs/configuration.md, "Routes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum IdempotencyKey {
    /// The event id itself: what the first route sends. For a later route whose
    /// receiver no other route calls and which dedups by event id.
    EventId,
    /// The event id, `#` and the route's name: what a later route sends. For a first
    /// route that must not change its key when another is put above it.
    Route,
}

/// Where the event id (the dedup key) is found.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
#[non_exhaustive]
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

/// What runs for each event, with its settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum HandlerSpec {
    /// `kind = "http"`: calls the receiver configured here.
    Http(Box<HttpConfig>),
    /// `kind = "log"`: one JSON line per event on stdout.
    Log,
    /// `kind = "postgres"`: statements and an inbox row in the receiver's database.
    Postgres(Box<PostgresConfig>),
}

/// One `[[handlers]]` entry validated: which topics, what runs, where the event id
/// is and what happens on failure.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HandlerConfig {
    /// Position in the file, for messages (`handlers[2]`).
    pub index: usize,
    /// In metrics, logs and `/readyz`: `name`, else the first topic or the pattern.
    pub name: String,
    /// The topics it takes: exact names or a pattern.
    pub topics: TopicMatch,
    /// What runs: an HTTP call or a log line.
    pub spec: HandlerSpec,
    /// Where the event id, the dedup key, is (default header `id`).
    pub event_id: EventIdSource,
    /// The Kafka header with the event type (default `eventType`).
    pub event_type_header: String,
    /// The event types it selects (`None`: every event of its topics).
    pub event_types: Option<EventTypes>,
    /// Conditions on a header or a payload field, all of which must hold (`[[handlers.when]]`).
    pub when: Vec<Condition>,
    /// The retry schedule of a failing delivery.
    pub retry: RetryConfig,
    /// The circuit breaker over the receiver's health.
    pub circuit: CircuitConfig,
    /// How many calls may be in flight.
    pub concurrency: ConcurrencyConfig,
    /// Where dead events go; without one, `dead` records keep the message for export.
    pub dead_letter_topic: Option<String>,
    /// What to do with an event found `claimed` (default: run it again).
    pub on_uncertain: OnUncertain,
    /// What a key's later events do once one of its events is dead or parked (default: hold).
    pub on_dead: OnDead,
    /// Where an event id is unique (default: per topic).
    pub dedup_scope: DedupScope,
    /// The idempotency key it sends; `None`: the event id on its topic's first
    /// route, the event id with `#` and its name on a later one.
    pub idempotency_key: Option<IdempotencyKey>,
    /// How message values are read (default `auto`).
    pub format: Format,
    /// What the handler sends (default the decoded value as JSON).
    pub body: Body,
}

impl RawHandler {
    pub(super) fn validate(
        self,
        index: usize,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HandlerConfig, ConfigError> {
        let at = format!("handlers[{index}]");
        let topics = TopicMatch::from_raw(&at, self.topics.as_deref(), self.topic_pattern.as_deref())?;
        self.check_http_only_fields(&at)?;
        let on_uncertain = self.uncertain_policy(&at)?;
        let dead_letter_topic = self.dead_letter_topic(&at)?;
        let spec = match self.kind {
            HandlerKind::Log => HandlerSpec::Log,
            HandlerKind::Postgres => HandlerSpec::Postgres(Box::new(PostgresConfig::from_raw(&at, &self, env)?)),
            HandlerKind::Http => HandlerSpec::Http(Box::new(HttpConfig::from_raw(&at, &self, env)?)),
        };
        let event_id = event_id(&at, self.event_id)?;
        let event_types = self.event_types.map(|t| EventTypes::from_raw(&at, t)).transpose()?;
        let mut when = Vec::with_capacity(self.when.len());
        for (i, c) in self.when.into_iter().enumerate() {
            let c = c.validate(&format!("{at}.when[{i}]")).map_err(|e| ConfigError::field(e.0, e.1))?;
            when.push(c);
        }
        let retry = self.retry.unwrap_or_default().validate(&at)?;
        let circuit = self.circuit.unwrap_or_default().validate(&at, retry.max_attempts, env)?;
        let concurrency = self.concurrency.unwrap_or_default().validate(&at)?;
        let name = match self.name {
            Some(n) if n.trim().is_empty() => {
                return Err(ConfigError::field(format!("{at}.name"), "must not be empty"))
            }
            Some(n) => n,
            None => topics.describe(),
        };
        Ok(HandlerConfig {
            index,
            name,
            topics,
            spec,
            event_id,
            event_type_header: self.event_type_header.unwrap_or_else(|| DEFAULT_EVENT_TYPE_HEADER.to_owned()),
            event_types,
            when,
            retry,
            circuit,
            concurrency,
            dead_letter_topic,
            on_uncertain,
            on_dead: self.on_dead.unwrap_or_default(),
            dedup_scope: self.dedup_scope.unwrap_or_default(),
            idempotency_key: self.idempotency_key,
            format: self.format.unwrap_or_default(),
            body: self.body.unwrap_or_default(),
        })
    }

    /// A kind's own fields mean nothing to another kind: setting one is a mistake.
    fn check_http_only_fields(&self, at: &str) -> Result<(), ConfigError> {
        let postgres_only = [
            ("statements", !self.statements.is_empty()),
            ("inbox", self.inbox.is_some()),
            ("pool_size", self.pool_size.is_some()),
            ("tls_ca", self.tls_ca.is_some()),
        ];
        if self.kind != HandlerKind::Postgres {
            if let Some((name, _)) = postgres_only.iter().find(|(_, set)| *set) {
                return Err(ConfigError::field(format!("{at}.{name}"), "only valid for kind = \"postgres\""));
            }
        }
        if self.kind == HandlerKind::Http {
            return Ok(());
        }
        // `url` and `timeout` are a postgres handler's too.
        let both = self.kind == HandlerKind::Postgres;
        let set = [
            ("url", self.url.is_some() && !both),
            ("method", self.method.is_some()),
            ("headers", !self.headers.is_empty()),
            ("idempotency_header", self.idempotency_header.is_some()),
            ("timeout", self.timeout.is_some() && !both),
            ("success_on", !self.success_on.is_empty()),
            ("fail_on", !self.fail_on.is_empty()),
            ("retry_on", !self.retry_on.is_empty()),
            ("verify", self.verify.is_some()),
            ("sign", self.sign.is_some()),
        ];
        match set.iter().find(|(_, set)| *set) {
            Some((name, _)) => Err(ConfigError::field(format!("{at}.{name}"), "only valid for kind = \"http\"")),
            None => Ok(()),
        }
    }

    /// `verify` goes with `on_uncertain = "verify"`, both ways; a postgres handler's
    /// lookup is its inbox row (exact), so `verify` is its default and needs no table.
    fn uncertain_policy(&self, at: &str) -> Result<OnUncertain, ConfigError> {
        if self.kind == HandlerKind::Postgres {
            return Ok(self.on_uncertain.unwrap_or(OnUncertain::Verify));
        }
        let on_uncertain = self.on_uncertain.unwrap_or_default();
        if on_uncertain == OnUncertain::Verify && self.verify.is_none() {
            return Err(ConfigError::field(
                format!("{at}.verify"),
                format!("on_uncertain = \"verify\" needs [{at}.verify] url = \"...\""),
            ));
        }
        if self.verify.is_some() && on_uncertain != OnUncertain::Verify {
            return Err(ConfigError::field(format!("{at}.verify"), "only used with on_uncertain = \"verify\""));
        }
        Ok(on_uncertain)
    }

    fn dead_letter_topic(&self, at: &str) -> Result<Option<String>, ConfigError> {
        match &self.dead_letter {
            Some(d) if d.topic.trim().is_empty() => {
                Err(ConfigError::field(format!("{at}.dead_letter.topic"), "must not be empty"))
            }
            Some(d) => Ok(Some(d.topic.clone())),
            None => Ok(None),
        }
    }
}

/// Unset: header `id`, as Debezium's EventRouter writes it.
fn event_id(at: &str, raw: Option<EventIdSource>) -> Result<EventIdSource, ConfigError> {
    let event_id = raw.unwrap_or_default();
    match &event_id {
        EventIdSource::Header(h) | EventIdSource::Field(h) if h.trim().is_empty() => {
            Err(ConfigError::field(format!("{at}.event_id"), "must name a header or a field"))
        }
        _ => Ok(event_id),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{err, parse};
    use super::EventIdSource;

    #[test]
    fn http_fields_on_log_handler_are_rejected() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nurl=\"http://h/\"\n");
        assert!(e.contains("handlers[0].url: only valid for kind = \"http\""), "{e}");
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\ntimeout=\"1s\"\nverify={ url = \"http://h/\" }\n");
        assert!(e.contains("handlers[0].timeout: only valid"), "the first field in declaration order: {e}");
    }

    #[test]
    fn on_dead_holds_by_default_and_continue_is_the_way_out() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n").unwrap();
        assert_eq!(c.handlers[0].on_dead, super::OnDead::Hold);
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\non_dead=\"continue\"\n").unwrap();
        assert_eq!(c.handlers[0].on_dead, super::OnDead::Continue);
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\non_dead=\"skip\"\n");
        assert!(e.contains("hold") && e.contains("continue"), "{e}");
    }

    #[test]
    fn event_id_field_source_parses() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nevent_id = { field = \"after.id\" }\n").unwrap();
        assert_eq!(c.handlers[0].event_id, EventIdSource::Field("after.id".into()));
    }

    #[test]
    fn empty_event_id_and_dead_letter_topic_name_the_field() {
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\nevent_id = { header = \" \" }\n");
        assert!(e.contains("handlers[0].event_id: must name"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\ndead_letter = { topic = \"\" }\n");
        assert!(e.contains("handlers[0].dead_letter.topic: must not be empty"), "{e}");
    }
}
