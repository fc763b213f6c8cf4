//! `[store]`: where the dedup store lives, how long records are kept, group
//! commit, and the bounds on what is held in flight.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::changelog::{ChangelogConfig, RawChangelog};
use super::values::{duration, parse_size};
use super::ConfigError;

/// Done/dead records are kept this long; a redelivery older than that runs again.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Group-commit window: a few ms batches hundreds of records per fdatasync.
const DEFAULT_STORE_COMMIT_INTERVAL: Duration = Duration::from_millis(2);
/// Group-commit window while the engine has a backlog (more events wait to start
/// than `max_in_flight` lets run): an event's wait then does not delay the
/// backlog's end, and four times the usual window spread each flush and fdatasync
/// over about three times as many records in a drain, for 6–15% less CPU per
/// event (bench/findings.md, "a longer group commit under a backlog").
const DEFAULT_BACKLOG_COMMIT_INTERVAL: Duration = Duration::from_millis(8);
/// sled's page cache: its own default (1 GiB) made outboxd's RSS grow with the
/// store. With compact records 32 MiB holds the hot pages: at 1M records it took
/// ~70 MB less RSS than 64 MiB for ~4% more CPU per event, and 16 MiB saved no
/// more (bench/findings.md).
const DEFAULT_STORE_CACHE_BYTES: u64 = 32 * 1024 * 1024;
/// Records of the current slice kept in memory before they are packed into a run
/// (store/disk/journal.rs): about 13 MB of them (~100 B each). Fewer packs more often, each
/// adding a run, and runs are merged each time there are more than 8; more hold
/// more memory, and the journal replays more of them at a start.
pub(crate) const DEFAULT_MEMORY_RECORDS: u64 = 131_072;
/// Bounds of `memory_records`.
const MEMORY_RECORDS_RANGE: std::ops::RangeInclusive<u64> = 256..=16_777_216;
/// Events handled at once across keys; also bounds what is read ahead.
const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// How often expired records are removed.
const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(600);
/// Message bytes held in flight: a few huge messages (a poison flood of 100 MB
/// values) must not exhaust memory, while 256 ordinary events fit many times over.
const DEFAULT_MAX_IN_FLIGHT_BYTES: u32 = 256 * 1024 * 1024;
/// Disk for copies of failed messages (for `store export`/`retry`): a poison flood
/// of large messages must not fill the disk and stop the service; past it the
/// records are still kept (and the dead-letter topic has the messages).
const DEFAULT_MAX_MESSAGE_COPY_BYTES: u64 = 1024 * 1024 * 1024;
/// Upper bound on `max_in_flight`: each in-flight event holds its payload in memory.
const MAX_IN_FLIGHT_LIMIT: usize = 65_536;
/// Events whose handler answered and that wait only for their record to be durable
/// and acknowledged by the changelog. Each waits about the changelog's linger and a
/// broker round trip (~12 ms with the 10 ms default), so this many bound the rate at
/// this many per wait: 2,048 is ~170,000 events/s, beyond what a pair of cores
/// handles, where the 256 of `max_in_flight` allow ~21,000, which a log drain
/// reached (bench/findings.md, "settling"). What one costs beyond its message's bytes
/// (counted in `max_in_flight_bytes`): its record and its key's chain, well under
/// 2 KB, so a few MB at most.
const DEFAULT_MAX_SETTLING: usize = 2048;

/// `[store]` as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    /// `[store] path`: the store's directory; must not be empty.
    pub path: PathBuf,
    /// `[store] retention`: how long records are kept at least after their claim,
    /// e.g. "7d" (the default).
    pub retention: Option<String>,
    /// `[store] commit_interval`: the group-commit window, e.g. "2ms" (the default).
    pub commit_interval: Option<String>,
    /// `[store] backlog_commit_interval`: the group-commit window while events
    /// wait for room to start, e.g. "8ms" (the default).
    pub backlog_commit_interval: Option<String>,
    /// `[store] max_in_flight`: events consumed and not yet finished, across keys;
    /// 1 to 65,536, default 256.
    pub max_in_flight: Option<usize>,
    /// Bytes of consumed messages (key, value, headers) held in flight, e.g. "256MiB".
    pub max_in_flight_bytes: Option<String>,
    /// `[store] max_settling`: events whose handler answered and that wait only for
    /// their record; 0 to 65,536, default 2,048.
    pub max_settling: Option<usize>,
    /// Disk kept for message copies of failed events, e.g. "1GiB".
    pub max_message_copy_bytes: Option<String>,
    /// `[store] gc_interval`: how often expired records are removed, e.g. "10m" (the default).
    pub gc_interval: Option<String>,
    /// `true` (default): fdatasync before a claim or completion counts.
    /// `false` survives a process crash but not a power loss.
    pub fsync: Option<bool>,
    /// Size of the store's page cache, e.g. "64MiB".
    pub cache_size: Option<String>,
    /// `[store] memory_records`: records of the current slice kept in memory before
    /// they are packed into a run; 256 to 16,777,216, default 131,072.
    pub memory_records: Option<u64>,
    /// `[store.changelog]`: the dedup state in Kafka (on by default).
    #[serde(default)]
    pub changelog: RawChangelog,
}

/// `[store]` validated: durations and sizes parsed, defaults filled in.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// The store's directory; one process at a time.
    pub path: PathBuf,
    /// Bytes of the store's page cache (default 64 MiB).
    pub cache_bytes: u64,
    /// Records are kept at least this long after their event was claimed (default
    /// 7 days); an event redelivered after its record is removed runs again.
    pub retention: Duration,
    /// Group commit: how long a batch waits for more writers (default 2 ms).
    pub commit_interval: Duration,
    /// Group commit while more events wait to start than may run: how long a batch
    /// waits for more writers then (default 8 ms; never below `commit_interval`).
    pub backlog_commit_interval: Duration,
    /// Events consumed and not yet finished, across keys (default 256, at most 65,536).
    pub max_in_flight: usize,
    /// At most this many message bytes in flight (a larger message runs alone).
    pub max_in_flight_bytes: u32,
    /// Events whose handler answered and that wait only for their record to be
    /// durable and acknowledged, beside `max_in_flight` (default 2,048; 0: such an
    /// event keeps its place among `max_in_flight`).
    pub max_settling: usize,
    /// Past this, failed events are recorded without their message copy.
    pub max_message_copy_bytes: u64,
    /// How often expired records are removed (default 10 min).
    pub gc_interval: Duration,
    /// `fdatasync` after each group flush (default `true`); `false` survives a
    /// process crash, not a power loss.
    pub fsync: bool,
    /// Records of the current slice kept in memory before they are packed into a
    /// run (default 131,072).
    pub memory_records: u64,
    /// `None` when `[store.changelog] enabled = false`.
    pub changelog: Option<ChangelogConfig>,
}

impl RawStore {
    /// `group_id` names the changelog topics; `env` resolves the `${VAR}` of their keys.
    pub(super) fn validate(
        self,
        group_id: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<StoreConfig, ConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(ConfigError::field("store.path", "must not be empty"));
        }
        let max_in_flight = self.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
        if max_in_flight == 0 || max_in_flight > MAX_IN_FLIGHT_LIMIT {
            return Err(ConfigError::field(
                "store.max_in_flight",
                format!("must be between 1 and {MAX_IN_FLIGHT_LIMIT}, got {max_in_flight}"),
            ));
        }
        let max_settling = self.max_settling.unwrap_or(DEFAULT_MAX_SETTLING);
        if max_settling > MAX_IN_FLIGHT_LIMIT {
            return Err(ConfigError::field(
                "store.max_settling",
                format!("must be between 0 and {MAX_IN_FLIGHT_LIMIT}, got {max_settling}"),
            ));
        }
        let max_in_flight_bytes = match self.max_in_flight_bytes.as_deref() {
            None => DEFAULT_MAX_IN_FLIGHT_BYTES,
            Some(text) => parse_size(text)
                .filter(|n| (1..=u64::from(u32::MAX)).contains(n))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ConfigError::field(
                        "store.max_in_flight_bytes",
                        format!("{text:?} is not a size between 1 byte and 4GiB such as \"256MiB\""),
                    )
                })?,
        };
        let max_message_copy_bytes = match self.max_message_copy_bytes.as_deref() {
            None => DEFAULT_MAX_MESSAGE_COPY_BYTES,
            Some(text) => parse_size(text).ok_or_else(|| {
                ConfigError::field("store.max_message_copy_bytes", format!("{text:?} is not a size such as \"1GiB\""))
            })?,
        };
        let memory_records = self.memory_records.unwrap_or(DEFAULT_MEMORY_RECORDS);
        if !MEMORY_RECORDS_RANGE.contains(&memory_records) {
            return Err(ConfigError::field(
                "store.memory_records",
                format!(
                    "must be between {} and {}, got {memory_records}",
                    MEMORY_RECORDS_RANGE.start(),
                    MEMORY_RECORDS_RANGE.end()
                ),
            ));
        }
        let cache_bytes = match self.cache_size.as_deref() {
            None => DEFAULT_STORE_CACHE_BYTES,
            Some(text) => parse_size(text).ok_or_else(|| {
                ConfigError::field("store.cache_size", format!("{text:?} is not a size such as \"64MiB\" or \"1GiB\""))
            })?,
        };
        let store = StoreConfig {
            cache_bytes,
            path: self.path,
            retention: duration("store.retention", self.retention.as_deref(), DEFAULT_RETENTION)?,
            commit_interval: duration(
                "store.commit_interval",
                self.commit_interval.as_deref(),
                DEFAULT_STORE_COMMIT_INTERVAL,
            )?,
            backlog_commit_interval: duration(
                "store.backlog_commit_interval",
                self.backlog_commit_interval.as_deref(),
                DEFAULT_BACKLOG_COMMIT_INTERVAL,
            )?,
            max_in_flight,
            max_in_flight_bytes,
            max_settling,
            max_message_copy_bytes,
            gc_interval: duration("store.gc_interval", self.gc_interval.as_deref(), DEFAULT_GC_INTERVAL)?,
            fsync: self.fsync.unwrap_or(true),
            memory_records,
            changelog: self.changelog.validate(group_id, env)?,
        };
        if store.retention.is_zero() {
            return Err(ConfigError::field("store.retention", "must be greater than 0"));
        }
        if store.gc_interval.is_zero() {
            return Err(ConfigError::field("store.gc_interval", "must be greater than 0"));
        }
        Ok(store)
    }
}

impl super::RawConfig {
    /// `[kafka]` and `[store]` alone, validated: what `outboxd store` repairs need
    /// to write through the changelog (the `${VAR}`s of other sections need not be set).
    pub fn kafka_and_store(
        self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(super::KafkaConfig, StoreConfig), ConfigError> {
        let kafka = self.kafka.validate(env)?;
        let store = self.store.validate(&kafka.group_id, env)?;
        Ok((kafka, store))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, BASE};
    use super::super::Config;

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
    fn bad_cache_size_names_the_field() {
        let e = Config::parse(
            &format!("{BASE}cache_size = \"1 parsec\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("store.cache_size"));
    }
}
