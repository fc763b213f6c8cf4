//! How the store is opened, and by whom: the one place that says which settings
//! the service, the `store` commands and the tests open it with.

use std::time::Duration;

use crate::config::StoreConfig;

/// Page cache for commands that open the store briefly.
pub const SMALL_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Who opens the store. Written to the owner file as text ([`Role::as_str`]), so
/// that a second process can name the holder (`outboxd run`, `outboxd store`):
/// the text of each role stays as it is, for other versions reading the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `outboxd run`: the service, whose writers keep running while `stats` scans.
    Run,
    /// `outboxd store …` opening the store directly (no service holds it).
    Store,
    /// `outboxd store retry` / `resolve --retry`: stored copies run through the handlers.
    StoreRetry,
    /// A test opening the store itself.
    #[cfg(test)]
    Test,
}

impl Role {
    /// The text in the owner file, after `outboxd ` in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Run => "run",
            Role::Store => "store",
            Role::StoreRetry => "store retry",
            #[cfg(test)]
            Role::Test => "test",
        }
    }

    /// Whether the slices' lookup filters are built from the stored records after the
    /// open (store/disk/filter.rs): for the service (and the store's tests), whose every new
    /// event looks an id up; a command that opens the store for a moment would only pay
    /// for reading every key, and looks ids up in the trees instead.
    pub fn builds_lookup_filters(self) -> bool {
        match self {
            Role::Run => true,
            #[cfg(test)]
            Role::Test => true,
            Role::Store | Role::StoreRetry => false,
        }
    }

    /// The long-running service (not a command that opens the store for a moment).
    pub fn is_service(self) -> bool {
        self == Role::Run
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long a record is kept after its last write: its slice expires `retention`
    /// after the slice ends, so a record is kept up to one slice width (retention / 8,
    /// at least 1 s) longer.
    pub retention: Duration,
    /// Group-commit window.
    pub commit_interval: Duration,
    /// Group-commit window while the engine has a backlog (at least `commit_interval`).
    pub backlog_commit_interval: Duration,
    /// fdatasync after flush (power-loss safe) or not (process-crash safe only).
    pub fsync: bool,
    /// Who opens it, recorded for `store` commands that find it locked.
    pub role: Role,
    /// sled's page cache (its default, 1 GiB, dominates outboxd's memory).
    pub cache_bytes: u64,
    /// Records of the current slice kept in memory before they are packed.
    pub memory_records: u64,
    /// How far another instance's clock may be ahead of this one's: a changelog
    /// record is expired at restore only once its writer's time is older than
    /// `retention` plus this (`store.changelog.max_clock_skew`).
    pub clock_skew: Duration,
}

/// The service (`outboxd run`): everything as configured in `[store]`.
impl From<&StoreConfig> for StoreOptions {
    fn from(config: &StoreConfig) -> StoreOptions {
        StoreOptions {
            retention: config.retention,
            commit_interval: config.commit_interval,
            backlog_commit_interval: config.backlog_commit_interval,
            fsync: config.fsync,
            role: Role::Run,
            cache_bytes: config.cache_bytes,
            memory_records: config.memory_records,
            clock_skew: config.changelog.as_ref().map_or(crate::config::DEFAULT_MAX_CLOCK_SKEW, |c| c.max_clock_skew),
        }
    }
}

impl StoreOptions {
    /// A command that runs events from the store with the full config
    /// (`store retry`): the configured durability, a small page cache.
    pub fn command(config: &StoreConfig, role: Role) -> StoreOptions {
        StoreOptions { role, cache_bytes: SMALL_CACHE_BYTES, ..StoreOptions::from(config) }
    }

    /// A `store` command that reads only `[store] path` and `retention` (the rest of
    /// the config need not be valid): no group-commit window, since it is the only
    /// writer; fsync on; the default retention when none is configured.
    pub fn inspect(retention: Option<Duration>) -> StoreOptions {
        StoreOptions {
            retention: retention.unwrap_or(crate::config::DEFAULT_RETENTION),
            commit_interval: Duration::ZERO,
            backlog_commit_interval: Duration::ZERO,
            fsync: true,
            role: Role::Store,
            cache_bytes: SMALL_CACHE_BYTES,
            memory_records: crate::config::DEFAULT_MEMORY_RECORDS,
            clock_skew: crate::config::DEFAULT_MAX_CLOCK_SKEW,
        }
    }
}

/// The store's own tests: `retention` (the default when `None`), a 1 ms
/// group-commit window, fsync on.
#[cfg(test)]
impl StoreOptions {
    pub(crate) fn for_tests(retention: Option<Duration>) -> StoreOptions {
        StoreOptions {
            commit_interval: Duration::from_millis(1),
            backlog_commit_interval: Duration::from_millis(1),
            role: Role::Test,
            ..StoreOptions::inspect(retention)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_text_in_the_owner_file_is_what_earlier_versions_wrote() {
        let roles = [Role::Run, Role::Store, Role::StoreRetry, Role::Test];
        assert_eq!(roles.map(Role::as_str), ["run", "store", "store retry", "test"]);
        assert_eq!(roles.map(Role::is_service), [true, false, false, false]);
    }

    #[test]
    fn commands_open_with_a_small_cache_and_the_service_as_configured() {
        let config = crate::config::Config::parse(
            "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[store]\npath=\"p\"\ncache_size=\"32MiB\"\nfsync=false\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n",
            &|_| None,
        )
        .unwrap();
        let service = StoreOptions::from(&config.store);
        assert_eq!((service.role, service.cache_bytes, service.fsync), (Role::Run, 32 << 20, false));
        let retry = StoreOptions::command(&config.store, Role::StoreRetry);
        assert_eq!((retry.cache_bytes, retry.fsync, retry.retention), (SMALL_CACHE_BYTES, false, service.retention));
        let inspect = StoreOptions::inspect(None);
        assert_eq!((inspect.role, inspect.fsync, inspect.retention), (Role::Store, true, config.store.retention));
    }
}
