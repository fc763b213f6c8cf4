//! `[store.changelog]`: the dedup state kept in Kafka, one compacted changelog
//! topic per source topic, so that a partition's records follow it to whichever
//! instance owns it (restored on assignment). On by default; `enabled = false`
//! keeps a single instance's local store as the only state.

use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, size};
use super::ConfigError;

/// One changelog topic per source topic and consumer group: two groups reading the
/// same topic keep separate dedup state, as they keep separate offsets.
const DEFAULT_TOPIC_TEMPLATE: &str = "{group_id}.{topic}.outboxd-dedup";
/// librdkafka's batching wait for changelog records. A final record's
/// acknowledgement is awaited before its offset moves and before the next event of
/// its key starts, so the wait lengthens one key's chain (not the calls of other
/// keys, which run side by side); fewer, larger produce requests cost the
/// producer's broker thread and the broker less: in the drain 20 ms took 28% less
/// CPU per event than 1 ms, and 10 ms about as little as 20 ms with half the wait
/// (bench/findings.md, "linger").
const DEFAULT_LINGER: Duration = Duration::from_millis(10);
/// How long librdkafka retries one changelog record before reporting it failed;
/// outboxd then sends it again (the event's offset waits meanwhile).
const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Records applied to the local store per durable write while restoring: large
/// enough to amortise the flush, small enough to checkpoint often.
const DEFAULT_RESTORE_BATCH: usize = 10_000;
const MAX_RESTORE_BATCH: usize = 1_000_000;
/// Bytes (keys and values) of one restore batch: changelog records are ~70 B, so
/// 10,000 of them are under 1 MiB and this never binds them; it binds records made
/// large by long failure reasons or keys, which would otherwise make a batch of
/// 10,000 as large as 10,000 of them. With librdkafka's prefetch bounded the same
/// (`kafka::options`) and one batch read ahead, a restore holds at most about three times this.
const DEFAULT_RESTORE_BATCH_BYTES: u64 = 16 << 20;
/// Memory a restore into a scope the store holds nothing of (an empty store, a
/// new topic) keeps its records in before it writes them as packed runs and moves
/// its checkpoint (store/changelog/runs.rs): about 130 B a record, so 128 MiB
/// holds about 1M records: a partition of that size is written in one pass of
/// sequential run writes, and the process stays within the 512 MiB the Kubernetes
/// manifest allows (a restore of 1.2M records peaked at 380 MB with all of them
/// held). Smaller means more passes, each rewriting the runs of the slices it
/// touches; larger means more memory and a longer read lost to a crash.
const DEFAULT_RESTORE_RUN_BYTES: u64 = 128 << 20;
/// Records sent per step when a store's records are copied into the changelog
/// (`outboxd store publish`, or at start-up after the changelog was off): each step
/// is acknowledged by the broker before the copy's cursor moves past it, so a crash
/// sends at most this many again; large enough that the broker round trip and the
/// cursor's flush are a small share of each step.
const DEFAULT_PUBLISH_BATCH: usize = 10_000;
const MAX_PUBLISH_BATCH: usize = 1_000_000;
/// How often an owned partition's changelog is checked for what other instances
/// wrote there (a repair made through another instance): a replay within this
/// long after such a repair may still be decided on the state before it. One
/// watermark request per owned partition per check.
const DEFAULT_FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// Standby replicas cost every instance the disk, the writes and the reads of
/// every partition's records (as many copies as instances): off unless asked for.
const DEFAULT_STANDBY: bool = false;
/// How far another instance's clock may be ahead of the restorer's before a
/// record restored from it expires early: NTP keeps hosts within milliseconds,
/// a host without it drifts seconds a day; 5 minutes covers a badly kept clock
/// for weeks, and costs only that records up to 5 minutes past their retention
/// are restored (and kept) instead of dropped.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);
/// Kafka's limit on topic names.
const MAX_TOPIC_NAME: usize = 249;
/// The shortest changelog key accepted: HMAC-SHA256 takes a key of any length, so
/// the only question is how hard it is to guess; 32 bytes of a random string
/// (`openssl rand -base64 32` prints 44 characters) leave no chance to, and a
/// word or a short password is refused rather than trusted.
const MIN_KEY_BYTES: usize = 32;
/// Keys accepted besides the signing one: a rotation needs one at a time; a
/// few more cover a rotation begun before the last one ended. Each costs a
/// MAC computation only for the records that name it.
const MAX_PREVIOUS_KEYS: usize = 4;

/// `[store.changelog]` as written.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChangelog {
    /// `true` (default): final records go to Kafka and are restored on assignment.
    pub enabled: Option<bool>,
    /// Changelog topic name; `{group_id}` and `{topic}` (the source topic) are replaced.
    pub topic: Option<String>,
    /// Replication factor of changelog topics outboxd creates (default: the broker's).
    pub replication_factor: Option<i32>,
    /// Producer batching wait, e.g. "1ms".
    pub linger: Option<String>,
    /// How long one changelog write is retried by librdkafka before outboxd sends it again.
    pub delivery_timeout: Option<String>,
    /// Records applied per durable write while restoring.
    pub restore_batch: Option<usize>,
    /// Bytes of one restore batch, e.g. "16MiB"; also the restore consumer's prefetch.
    pub restore_batch_bytes: Option<String>,
    /// Memory a restore into an empty scope holds before writing runs, e.g. "128MiB".
    pub restore_run_bytes: Option<String>,
    /// How far another instance's clock may be ahead of this one's, e.g. "5m".
    pub max_clock_skew: Option<String>,
    /// Records sent per acknowledged step when copying a store's records into the changelog.
    pub publish_batch: Option<usize>,
    /// How often owned partitions catch up with others' changelog writes, e.g. "1s".
    pub follow_interval: Option<String>,
    /// `true`: also tail the changelog partitions of source partitions owned elsewhere.
    pub standby: Option<bool>,
    /// The secret that signs the changelog records this instance writes and verifies
    /// the ones it reads, e.g. `"${OUTBOXD_CHANGELOG_KEY}"`.
    pub key: Option<String>,
    /// Earlier keys, still accepted when verifying (a key rotation).
    pub previous_keys: Option<Vec<String>>,
    /// With `key`: records without a MAC are applied too (while records written
    /// before the key was configured are still on the topics).
    pub accept_unsigned: Option<bool>,
}

/// A secret from the config file: `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret's bytes (the key of a MAC).
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// `key`, `previous_keys` and `accept_unsigned` of `[store.changelog]`, validated:
/// how changelog records are signed and which ones are applied (docs/security.md,
/// "The changelog topics").
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ChangelogKeys {
    /// `key`: signs every record this instance writes; verifies too.
    pub signing: Secret,
    /// `previous_keys`: verify only (records written before a rotation).
    pub previous: Vec<Secret>,
    /// `accept_unsigned`: records without a MAC are applied too (default false).
    pub accept_unsigned: bool,
}

/// The validated `[store.changelog]`; present only when enabled.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ChangelogConfig {
    /// The topic template with `{group_id}` already replaced; `{topic}` remains.
    pub topic_template: String,
    /// `None`: the broker's default.
    pub replication_factor: Option<i32>,
    /// `linger`: librdkafka's batching wait for changelog records (default 10 ms).
    pub linger: Duration,
    /// `delivery_timeout`: how long librdkafka retries one record before outboxd sends it again (default 30 s).
    pub delivery_timeout: Duration,
    /// `restore_batch`: records applied per durable write while restoring (default 10,000).
    pub restore_batch: usize,
    /// `restore_batch_bytes`: a batch ends once its keys and values reach this many
    /// bytes; the restore consumer prefetches at most this much (default 16 MiB).
    pub restore_batch_bytes: u64,
    /// `restore_run_bytes`: a restore into a scope the store holds nothing of keeps
    /// up to this many bytes of records before it writes them as packed runs (default 128 MiB).
    pub restore_run_bytes: u64,
    /// `max_clock_skew`: a restored record expires once its writer's time is older
    /// than `store.retention` plus this (default 5 minutes).
    pub max_clock_skew: Duration,
    /// `publish_batch`: records sent per acknowledged step when a store's records are
    /// copied into the changelog (default 10,000).
    pub publish_batch: usize,
    /// `follow_interval`: how often owned partitions catch up with what other
    /// instances wrote to their changelog, such as repairs (default 1 s).
    pub follow_interval: Duration,
    /// `standby`: every `follow_interval`, the changelog partitions of source
    /// partitions other instances own are read into the local store too, so that
    /// taking one over reads only what was written since (default false).
    pub standby: bool,
    /// `None` without `key`: records are neither signed nor verified, and
    /// whoever can write to the changelog topics steers what counts as handled.
    pub keys: Option<ChangelogKeys>,
}

impl ChangelogConfig {
    /// The changelog topic of a source topic.
    pub fn topic_for(&self, source: &str) -> String {
        self.topic_template.replace("{topic}", source)
    }

    /// Whether `topic` is named like a changelog topic (a handler's `topic_pattern`
    /// may match those too: they are never handled nor given changelogs of their own).
    pub fn is_changelog(&self, topic: &str) -> bool {
        // Asked for every consumed message: a search for `{` (memchr) instead of a
        // substring search, which took 0.13 µs of a log drain's event.
        let t = &self.topic_template;
        let at = t.match_indices('{').map(|(i, _)| i).find(|&i| t[i..].starts_with("{topic}"));
        let (prefix, suffix) = at.map_or((t.as_str(), ""), |i| (&t[..i], &t[i + "{topic}".len()..]));
        topic.len() > prefix.len() + suffix.len() && topic.starts_with(prefix) && topic.ends_with(suffix)
    }
}

impl RawChangelog {
    /// `None` when disabled. `group_id` fills `{group_id}` of the template; `env`
    /// resolves the `${VAR}` of the keys.
    pub(super) fn validate(
        self,
        group_id: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<ChangelogConfig>, ConfigError> {
        if !self.enabled.unwrap_or(true) {
            return Ok(None);
        }
        let keys = keys(self.key, self.previous_keys, self.accept_unsigned, env)?;
        let template = self.topic.unwrap_or_else(|| DEFAULT_TOPIC_TEMPLATE.to_owned());
        if !template.contains("{topic}") {
            return Err(ConfigError::field(
                "store.changelog.topic",
                format!("{template:?} must contain {{topic}}: each source topic needs its own changelog topic"),
            ));
        }
        let rest = template.replace("{topic}", "").replace("{group_id}", "");
        if rest.contains('{') || rest.contains('}') {
            return Err(ConfigError::field(
                "store.changelog.topic",
                format!("{template:?}: only {{group_id}} and {{topic}} may be used"),
            ));
        }
        let topic_template = template.replace("{group_id}", group_id);
        let sample = topic_template.replace("{topic}", "t");
        if let Some(bad) = sample.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
            return Err(ConfigError::field("store.changelog.topic", format!("{sample:?} (with kafka.group_id filled in) contains {bad:?}; Kafka topic names allow only letters, digits, '.', '_' and '-'")));
        }
        if sample.len() > MAX_TOPIC_NAME {
            return Err(ConfigError::field(
                "store.changelog.topic",
                format!("{sample:?} is longer than Kafka's {MAX_TOPIC_NAME} characters"),
            ));
        }
        if let Some(rf) = self.replication_factor {
            if !(1..=i32::from(i16::MAX)).contains(&rf) {
                return Err(ConfigError::field(
                    "store.changelog.replication_factor",
                    format!("must be between 1 and 32767, got {rf}"),
                ));
            }
        }
        let restore_batch = self.restore_batch.unwrap_or(DEFAULT_RESTORE_BATCH);
        if restore_batch == 0 || restore_batch > MAX_RESTORE_BATCH {
            return Err(ConfigError::field(
                "store.changelog.restore_batch",
                format!("must be between 1 and {MAX_RESTORE_BATCH}, got {restore_batch}"),
            ));
        }
        let restore_batch_bytes = size(
            "store.changelog.restore_batch_bytes",
            self.restore_batch_bytes.as_deref(),
            DEFAULT_RESTORE_BATCH_BYTES,
            1 << 10..=1 << 30,
            "a size between 1KiB and 1GiB, such as \"16MiB\"",
        )?;
        let restore_run_bytes = size(
            "store.changelog.restore_run_bytes",
            self.restore_run_bytes.as_deref(),
            DEFAULT_RESTORE_RUN_BYTES,
            1 << 20..=16 << 30,
            "a size between 1MiB and 16GiB, such as \"128MiB\"",
        )?;
        let publish_batch = self.publish_batch.unwrap_or(DEFAULT_PUBLISH_BATCH);
        if publish_batch == 0 || publish_batch > MAX_PUBLISH_BATCH {
            return Err(ConfigError::field(
                "store.changelog.publish_batch",
                format!("must be between 1 and {MAX_PUBLISH_BATCH}, got {publish_batch}"),
            ));
        }
        let delivery_timeout =
            duration("store.changelog.delivery_timeout", self.delivery_timeout.as_deref(), DEFAULT_DELIVERY_TIMEOUT)?;
        if delivery_timeout < Duration::from_millis(1) {
            return Err(ConfigError::field("store.changelog.delivery_timeout", "must be at least 1ms"));
        }
        let follow_interval =
            duration("store.changelog.follow_interval", self.follow_interval.as_deref(), DEFAULT_FOLLOW_INTERVAL)?;
        if follow_interval < Duration::from_millis(10) {
            return Err(ConfigError::field(
                "store.changelog.follow_interval",
                "must be at least 10ms (one watermark request per owned partition each time)",
            ));
        }
        Ok(Some(ChangelogConfig {
            topic_template,
            replication_factor: self.replication_factor,
            linger: duration("store.changelog.linger", self.linger.as_deref(), DEFAULT_LINGER)?,
            delivery_timeout,
            restore_batch,
            restore_batch_bytes,
            restore_run_bytes,
            max_clock_skew: duration(
                "store.changelog.max_clock_skew",
                self.max_clock_skew.as_deref(),
                DEFAULT_MAX_CLOCK_SKEW,
            )?,
            publish_batch,
            follow_interval,
            standby: self.standby.unwrap_or(DEFAULT_STANDBY),
            keys,
        }))
    }
}

/// One key, `${VAR}` expanded, long enough.
fn secret(field: &str, value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Secret, ConfigError> {
    let value = expand_env(field, value, env)?;
    if value.len() < MIN_KEY_BYTES {
        return Err(ConfigError::field(
            field,
            format!(
                "{} bytes is too short for a changelog key: at least {MIN_KEY_BYTES} (a random string, e.g. from \
                 `openssl rand -base64 32`)",
                value.len()
            ),
        ));
    }
    Ok(Secret(value))
}

/// The changelog keys, or `None` without `key` (then `previous_keys` and
/// `accept_unsigned` would mean nothing: an error, not a silent no-op).
fn keys(
    key: Option<String>,
    previous: Option<Vec<String>>,
    accept_unsigned: Option<bool>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ChangelogKeys>, ConfigError> {
    let Some(key) = key else {
        if previous.is_some() {
            return Err(ConfigError::field(
                "store.changelog.previous_keys",
                "needs store.changelog.key: previous keys only verify, and without a key nothing is verified",
            ));
        }
        if accept_unsigned.is_some() {
            return Err(ConfigError::field(
                "store.changelog.accept_unsigned",
                "needs store.changelog.key: without a key every record is accepted anyway",
            ));
        }
        return Ok(None);
    };
    let signing = secret("store.changelog.key", &key, env)?;
    let previous = previous.unwrap_or_default();
    if previous.len() > MAX_PREVIOUS_KEYS {
        return Err(ConfigError::field(
            "store.changelog.previous_keys",
            format!("at most {MAX_PREVIOUS_KEYS} keys, got {} (drop those of rotations that ended)", previous.len()),
        ));
    }
    let mut accepted: Vec<Secret> = Vec::with_capacity(previous.len());
    for (i, value) in previous.iter().enumerate() {
        let field = format!("store.changelog.previous_keys[{i}]");
        let s = secret(&field, value, env)?;
        if s == signing || accepted.contains(&s) {
            return Err(ConfigError::field(&field, "the same key is listed twice"));
        }
        accepted.push(s);
    }
    Ok(Some(ChangelogKeys { signing, previous: accepted, accept_unsigned: accept_unsigned.unwrap_or(false) }))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, BASE};
    use super::super::Config;

    fn parse(changelog: &str) -> Result<Config, super::super::ConfigError> {
        Config::parse(&format!("{BASE}{changelog}\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"), &env)
    }

    #[test]
    fn the_changelog_is_on_by_default_with_a_topic_per_group_and_source_topic() {
        let c = parse("").unwrap();
        let cl = c.store.changelog.expect("on by default");
        assert_eq!(cl.topic_for("outbox.event.order"), "outboxd.outbox.event.order.outboxd-dedup");
        assert_eq!(cl.replication_factor, None);
        assert_eq!(cl.follow_interval, std::time::Duration::from_secs(1));
        assert_eq!(cl.publish_batch, 10_000);
        assert!(!cl.standby, "standby replicas are asked for");
        assert!(parse("[store.changelog]\nstandby = true").unwrap().store.changelog.unwrap().standby);
        assert!(cl.is_changelog("outboxd.outbox.event.order.outboxd-dedup"));
        assert!(!cl.is_changelog("outbox.event.order") && !cl.is_changelog("outboxd..outboxd-dedup"));
        let off = parse("[store.changelog]\nenabled = false").unwrap();
        assert!(off.store.changelog.is_none());
    }

    #[test]
    fn a_bad_template_names_the_field() {
        for (template, says) in [
            ("\"dedup\"", "must contain {topic}"),
            ("\"{topic}.{partition}\"", "only {group_id} and {topic}"),
            ("\"{topic} dedup\"", "contains ' '"),
        ] {
            let e = format!("{:#}", parse(&format!("[store.changelog]\ntopic = {template}")).unwrap_err());
            assert!(e.contains("store.changelog.topic") && e.contains(says), "{template}: {e}");
        }
        let e = format!("{:#}", parse("[store.changelog]\nreplication_factor = 0").unwrap_err());
        assert!(e.contains("store.changelog.replication_factor"), "{e}");
        let e = format!("{:#}", parse("[store.changelog]\npublish_batch = 0").unwrap_err());
        assert!(e.contains("store.changelog.publish_batch"), "{e}");
    }

    #[test]
    fn restore_bytes_and_clock_skew_have_defaults_and_refuse_nonsense_naming_the_field() {
        use std::time::Duration;
        let cl = parse("").unwrap().store.changelog.unwrap();
        assert_eq!((cl.restore_batch_bytes, cl.max_clock_skew), (16 << 20, Duration::from_secs(300)));
        assert_eq!(cl.restore_run_bytes, 128 << 20);
        let set = parse("[store.changelog]\nrestore_batch_bytes = \"4KiB\"\nmax_clock_skew = \"30s\"").unwrap();
        let cl = set.store.changelog.unwrap();
        assert_eq!((cl.restore_batch_bytes, cl.max_clock_skew), (4 << 10, Duration::from_secs(30)));
        for (bad, field) in [
            ("restore_batch_bytes = \"100B\"", "store.changelog.restore_batch_bytes"),
            ("restore_batch_bytes = \"2GiB\"", "store.changelog.restore_batch_bytes"),
            ("restore_batch_bytes = \"lots\"", "store.changelog.restore_batch_bytes"),
            ("restore_run_bytes = \"100KiB\"", "store.changelog.restore_run_bytes"),
            ("restore_run_bytes = \"32GiB\"", "store.changelog.restore_run_bytes"),
            ("max_clock_skew = \"a bit\"", "store.changelog.max_clock_skew"),
        ] {
            let e = format!("{:#}", parse(&format!("[store.changelog]\n{bad}")).unwrap_err());
            assert!(e.contains(field), "{bad}: {e}");
        }
    }

    const KEY: &str = "0123456789abcdef0123456789abcdef-current";
    const OLD: &str = "0123456789abcdef0123456789abcdef-previous";

    fn with_keys(changelog: &str) -> Result<Config, super::super::ConfigError> {
        let env = |name: &str| match name {
            "CL_KEY" => Some(KEY.to_owned()),
            "CL_OLD" => Some(OLD.to_owned()),
            "CL_SHORT" => Some("hunter2".to_owned()),
            _ => None,
        };
        Config::parse(&format!("{BASE}{changelog}\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"), &env)
    }

    #[test]
    fn changelog_keys_come_from_the_environment_and_are_never_shown() {
        let c = with_keys("[store.changelog]\nkey = \"${CL_KEY}\"\nprevious_keys = [\"${CL_OLD}\"]").unwrap();
        let keys = c.store.changelog.unwrap().keys.expect("a key is configured");
        assert_eq!(keys.signing.expose(), KEY.as_bytes());
        assert_eq!(keys.previous.len(), 1);
        assert_eq!(keys.previous[0].expose(), OLD.as_bytes());
        assert!(!keys.accept_unsigned, "unsigned records are refused unless asked for");
        let shown = format!("{keys:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        let none = with_keys("").unwrap().store.changelog.unwrap();
        assert!(none.keys.is_none(), "no key by default");
        let transition = with_keys("[store.changelog]\nkey = \"${CL_KEY}\"\naccept_unsigned = true").unwrap();
        assert!(transition.store.changelog.unwrap().keys.unwrap().accept_unsigned);
    }

    #[test]
    fn a_short_missing_repeated_or_pointless_changelog_key_is_refused_naming_the_field() {
        for (changelog, field, says) in [
            ("key = \"${CL_SHORT}\"", "store.changelog.key", "7 bytes is too short"),
            ("key = \"short but literal\"", "store.changelog.key", "too short"),
            ("key = \"${CL_UNSET}\"", "store.changelog.key", "CL_UNSET"),
            ("key = \"${CL_KEY}\"\nprevious_keys = [\"${CL_SHORT}\"]", "store.changelog.previous_keys[0]", "too short"),
            ("key = \"${CL_KEY}\"\nprevious_keys = [\"${CL_KEY}\"]", "store.changelog.previous_keys[0]", "twice"),
            ("previous_keys = [\"${CL_OLD}\"]", "store.changelog.previous_keys", "needs store.changelog.key"),
            ("accept_unsigned = true", "store.changelog.accept_unsigned", "needs store.changelog.key"),
        ] {
            let e = format!("{:#}", with_keys(&format!("[store.changelog]\n{changelog}")).unwrap_err());
            assert!(e.contains(field) && e.contains(says), "{changelog}: {e}");
        }
    }
}
