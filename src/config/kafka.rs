//! `[kafka]`: brokers, group, commit and drain timing, librdkafka pass-through.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, Redacted};
use super::ConfigError;

/// Offsets are committed this often; a crash re-delivers at most this much,
/// and the dedup store absorbs it.
const DEFAULT_OFFSET_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Below the default `session.timeout.ms` (45 s) so a drain never costs the
/// group its member.
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// librdkafka's default `session.timeout.ms` (and the broker's default
/// `group.consumer.session.timeout.ms` under `group.protocol = "consumer"`).
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);
/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);
/// While the brokers are unreachable, one summary line this often: a person (or a
/// `logs --since=1m`) sees within half a minute that the outage goes on and how many
/// errors it brought, and a day-long outage writes 2,880 lines, not millions. librdkafka
/// backs off its reconnects to 10 s, so each summary covers a few attempts per broker.
const DEFAULT_OUTAGE_SUMMARY_INTERVAL: Duration = Duration::from_secs(30);
/// Words in the name of a librdkafka option whose value is a credential
/// (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`, `ssl.key.pem`,
/// `sasl.jaas.config`, `sasl.oauthbearer.client.secret`, `sasl.oauthbearer.config`,
/// a private key's `passphrase`): `Debug` shows `<redacted>` for them, as for every
/// value that came from `${VAR}`.
const SECRET_OPTION_WORDS: [&str; 8] =
    ["password", "secret", "passphrase", "pem", "jaas", "oauthbearer.config", "token", "credential"];
/// Set by outboxd itself: offsets are stored only after events are durably finished.
const RESERVED_OPTIONS: [&str; 3] = ["enable.auto.offset.store", "group.id", "bootstrap.servers"];

/// `[kafka]` as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// `[kafka] brokers`: bootstrap servers, `host:port,host:port`; must not be empty.
    pub brokers: String,
    /// `[kafka] group_id`: the consumer group; must not be empty.
    pub group_id: String,
    /// How often finished offsets are committed (librdkafka auto-commit of stored offsets).
    pub commit_interval: Option<String>,
    /// How long SIGINT/SIGTERM waits for in-flight events before giving up on them.
    pub drain_timeout: Option<String>,
    /// A partition whose events wait while its offset has not moved for this long is
    /// reported stalled (`/readyz`, `outboxd_partitions_stalled`).
    pub stall_timeout: Option<String>,
    /// A gap this long in which the poll loop did not confirm the group still
    /// has us (the process was frozen or starved) fences every partition.
    pub fence_after: Option<String>,
    /// While the brokers are unreachable, a summary of librdkafka's errors this often.
    pub outage_summary_interval: Option<String>,
    /// Passed to librdkafka as-is.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// `[kafka]` validated: durations parsed, `${VAR}` in the options resolved. `Debug`
/// shows every option's name, and the value of those that are not secret.
#[derive(Clone)]
#[non_exhaustive]
pub struct KafkaConfig {
    /// Bootstrap servers (`host:port,host:port`), librdkafka's `bootstrap.servers`.
    pub brokers: String,
    /// The consumer group, librdkafka's `group.id`.
    pub group_id: String,
    /// How often librdkafka commits the offsets outboxd stored (default 1 s; greater than 0).
    pub commit_interval: Duration,
    /// How long shutdown and a revoke wait for in-flight events (default 10 s);
    /// shorter than `session.timeout.ms`.
    pub drain_timeout: Duration,
    /// `None`: derived from the handlers (see `Config::stall_timeout`).
    pub stall_timeout: Option<Duration>,
    /// A gap this long without the poll loop confirming ownership fences every
    /// partition (default: half the session timeout, or of `max.poll.interval.ms`
    /// when that is shorter); shorter than the session timeout.
    pub fence_after: Duration,
    /// While the brokers are unreachable, one summary line this often (default 30 s; at
    /// least 1 s): librdkafka's errors are counted, not logged one by one.
    pub outage_summary_interval: Duration,
    /// librdkafka properties passed as-is, `${VAR}` resolved; never one of the
    /// reserved `enable.auto.offset.store`, `group.id` and `bootstrap.servers`.
    pub options: BTreeMap<String, String>,
    /// The options whose value came from `${VAR}`: secrets, by the rule of the file.
    from_env: BTreeSet<String>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named: one added later is shown or hidden on purpose, not by default.
        let KafkaConfig {
            brokers,
            group_id,
            commit_interval,
            drain_timeout,
            stall_timeout,
            fence_after,
            outage_summary_interval,
            options,
            from_env,
        } = self;
        let secret = |name: &String| {
            let lower = name.to_ascii_lowercase();
            from_env.contains(name) || SECRET_OPTION_WORDS.iter().any(|w| lower.contains(w))
        };
        let shown: BTreeMap<&String, &dyn std::fmt::Debug> = options
            .iter()
            .map(|(name, value)| (name, if secret(name) { &Redacted as &dyn std::fmt::Debug } else { value }))
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", brokers)
            .field("group_id", group_id)
            .field("commit_interval", commit_interval)
            .field("drain_timeout", drain_timeout)
            .field("stall_timeout", stall_timeout)
            .field("fence_after", fence_after)
            .field("outage_summary_interval", outage_summary_interval)
            .field("options", &shown)
            .finish()
    }
}

impl RawKafka {
    pub(super) fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<KafkaConfig, ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(ConfigError::field("kafka.brokers", "must not be empty"));
        }
        if self.group_id.trim().is_empty() {
            return Err(ConfigError::field("kafka.group_id", "must not be empty"));
        }
        for reserved in RESERVED_OPTIONS {
            if self.options.contains_key(reserved) {
                return Err(ConfigError::field(
                    format!("kafka.options.\"{reserved}\""),
                    "set by outboxd itself (offsets are stored only after events are durably finished)",
                ));
            }
        }
        let mut options = BTreeMap::new();
        let mut from_env = BTreeSet::new();
        for (key, v) in self.options {
            let field = format!("kafka.options.\"{key}\"");
            if v.contains("${") {
                from_env.insert(key.clone());
            }
            options.insert(key, expand_env(&field, &v, env)?);
        }
        let mut kafka = KafkaConfig {
            brokers: self.brokers,
            group_id: self.group_id,
            commit_interval: duration(
                "kafka.commit_interval",
                self.commit_interval.as_deref(),
                DEFAULT_OFFSET_COMMIT_INTERVAL,
            )?,
            drain_timeout: duration("kafka.drain_timeout", self.drain_timeout.as_deref(), DEFAULT_DRAIN_TIMEOUT)?,
            stall_timeout: self
                .stall_timeout
                .as_deref()
                .map(|v| duration("kafka.stall_timeout", Some(v), Duration::ZERO))
                .transpose()?,
            fence_after: Duration::ZERO,
            outage_summary_interval: duration(
                "kafka.outage_summary_interval",
                self.outage_summary_interval.as_deref(),
                DEFAULT_OUTAGE_SUMMARY_INTERVAL,
            )?,
            options,
            from_env,
        };
        if kafka.outage_summary_interval < Duration::from_secs(1) {
            return Err(ConfigError::field(
                "kafka.outage_summary_interval",
                "must be at least 1s (a shorter one is the flood of lines it replaces)",
            ));
        }
        if kafka.stall_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::field("kafka.stall_timeout", "must be greater than 0"));
        }
        if kafka.commit_interval.is_zero() {
            return Err(ConfigError::field("kafka.commit_interval", "must be greater than 0"));
        }
        let session_timeout = millis_option(&kafka.options, "session.timeout.ms", DEFAULT_SESSION_TIMEOUT)?;
        let max_poll_interval = millis_option(&kafka.options, "max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL)?;
        // Half: a member frozen this long still has its partitions (its session
        // outlives the gap), so the fence comes before the group could move them.
        let derived = session_timeout.min(max_poll_interval) / 2;
        kafka.fence_after = duration("kafka.fence_after", self.fence_after.as_deref(), derived)?;
        if kafka.fence_after.is_zero() || kafka.fence_after >= session_timeout {
            return Err(ConfigError::field(
                "kafka.fence_after",
                format!(
                    "{} must be greater than 0 and shorter than session.timeout.ms ({}): a longer gap lets the group move partitions before outboxd fences them",
                    humantime::format_duration(kafka.fence_after),
                    humantime::format_duration(session_timeout)
                ),
            ));
        }
        if kafka.drain_timeout >= session_timeout {
            return Err(ConfigError::field(
                "kafka.drain_timeout",
                format!(
                    "{} must be shorter than session.timeout.ms ({}), or the group evicts outboxd while it drains",
                    humantime::format_duration(kafka.drain_timeout),
                    humantime::format_duration(session_timeout)
                ),
            ));
        }
        Ok(kafka)
    }
}

impl KafkaConfig {
    /// Whether the group uses the consumer rebalance protocol of KIP-848
    /// (`group.protocol = "consumer"`): the broker assigns partitions and owns
    /// the session timeout, so outboxd sets no assignment strategy.
    pub fn consumer_protocol(&self) -> bool {
        self.options.get("group.protocol").is_some_and(|p| p.trim().eq_ignore_ascii_case("consumer"))
    }
}

/// A librdkafka option in milliseconds, or its default.
fn millis_option(options: &BTreeMap<String, String>, name: &str, default: Duration) -> Result<Duration, ConfigError> {
    match options.get(name) {
        None => Ok(default),
        Some(ms) => Ok(Duration::from_millis(ms.trim().parse().map_err(|_| {
            ConfigError::field(format!("kafka.options.\"{name}\""), format!("not a number of milliseconds: {ms:?}"))
        })?)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::env;
    use super::super::Config;

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
    fn drain_timeout_must_be_shorter_than_the_session_timeout() {
        let text = "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\ndrain_timeout=\"10s\"\n[kafka.options]\n\"session.timeout.ms\"=\"6000\"\n[store]\npath=\"p\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n";
        let e = format!("{:#}", Config::parse(text, &env).unwrap_err());
        assert!(e.contains("kafka.drain_timeout") && e.contains("session.timeout.ms"), "{e}");
    }

    /// `[kafka]` lines and `[kafka.options]` lines, in a config that is otherwise valid.
    fn kafka(keys: &str, options: &str) -> Result<Config, super::super::ConfigError> {
        let text = format!(
            "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\ndrain_timeout=\"1s\"\n{keys}\n[kafka.options]\n{options}\n[store]\npath=\"p\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"
        );
        Config::parse(&text, &env)
    }

    #[test]
    fn fence_after_is_half_the_shorter_of_session_and_poll_interval_and_shorter_than_the_session() {
        use std::time::Duration;
        let default = kafka("", "").unwrap().kafka;
        assert_eq!(default.fence_after, Duration::from_millis(22_500), "half of librdkafka's 45 s session");
        let short_poll = kafka("", "\"session.timeout.ms\"=\"6000\"\n\"max.poll.interval.ms\"=\"4000\"").unwrap();
        assert_eq!(short_poll.kafka.fence_after, Duration::from_secs(2));
        assert_eq!(kafka("fence_after=\"5s\"", "").unwrap().kafka.fence_after, Duration::from_secs(5));
        for bad in ["fence_after=\"0s\"", "fence_after=\"45s\"", "fence_after=\"soon\""] {
            let e = format!("{:#}", kafka(bad, "").unwrap_err());
            assert!(e.contains("kafka.fence_after"), "{bad}: {e}");
        }
        let e = format!("{:#}", kafka("", "\"max.poll.interval.ms\"=\"a while\"").unwrap_err());
        assert!(e.contains("max.poll.interval.ms"), "{e}");
    }

    #[test]
    fn outage_summary_interval_is_30s_by_default_and_at_least_a_second() {
        use std::time::Duration;
        assert_eq!(kafka("", "").unwrap().kafka.outage_summary_interval, Duration::from_secs(30));
        assert_eq!(
            kafka("outage_summary_interval=\"2m\"", "").unwrap().kafka.outage_summary_interval,
            Duration::from_secs(120)
        );
        for bad in
            ["outage_summary_interval=\"500ms\"", "outage_summary_interval=\"0s\"", "outage_summary_interval=\"often\""]
        {
            let e = format!("{:#}", kafka(bad, "").unwrap_err());
            assert!(e.contains("kafka.outage_summary_interval"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_consumer_protocol_is_told_from_group_protocol() {
        assert!(kafka("", "\"group.protocol\"=\"consumer\"").unwrap().kafka.consumer_protocol());
        assert!(kafka("", "\"group.protocol\"=\" Consumer \"").unwrap().kafka.consumer_protocol());
        assert!(!kafka("", "\"group.protocol\"=\"classic\"").unwrap().kafka.consumer_protocol());
        assert!(!kafka("", "").unwrap().kafka.consumer_protocol());
    }
}
