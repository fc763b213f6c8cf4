//! `[handlers.retry]`: how often and how long a failing delivery is tried again.

use std::time::Duration;

use serde::Deserialize;

use super::values::duration;
use super::ConfigError;

/// A few quick retries for an event's own trouble (a poison event that gets a 5xx
/// while others succeed is dead within about 3 s); permanent failures and exhausted
/// retries end `dead`. An outage of the receiver is not charged here: it opens the
/// handler's circuit (`[handlers.circuit]`), whose `failures` may not exceed this.
const DEFAULT_MAX_ATTEMPTS: u32 = 5;
const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
const DEFAULT_BACKOFF_MULTIPLIER: f32 = 2.0;
/// Stop retrying well inside the shortest common idempotency-key window
/// (30 minutes at several APIs; Stripe keeps keys 24 h): a retry after the
/// receiver forgot the key could repeat the side effect.
const DEFAULT_MAX_ELAPSED: Duration = Duration::from_secs(20 * 60);

/// `[handlers.retry]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// `handlers[].retry.max_attempts`: executions per delivery before the event is dead (default 5).
    pub max_attempts: Option<u32>,
    /// `handlers[].retry.initial_backoff`: the schedule's first delay, e.g. "200ms" (the default).
    pub initial_backoff: Option<String>,
    /// `handlers[].retry.max_backoff`: the largest delay, e.g. "10s" (the default).
    pub max_backoff: Option<String>,
    /// `handlers[].retry.multiplier`: growth of the schedule per attempt, 1.0 to 100.0 (default 2.0).
    pub multiplier: Option<f32>,
    /// Give up once this much time has passed since the first attempt of a delivery.
    pub max_elapsed: Option<String>,
}

/// The retry schedule of a handler, validated. Each delay is drawn uniformly from
/// 0 to the schedule's value (full jitter); a receiver's `Retry-After` is a floor.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Executions per delivery before the event is dead; at least 1 (default 5).
    pub max_attempts: u32,
    /// The schedule's first delay (default 200 ms).
    pub initial_backoff: Duration,
    /// The largest delay, not less than `initial_backoff` (default 10 s).
    pub max_backoff: Duration,
    /// Growth of the schedule per attempt, 1.0 to 100.0 (default 2.0).
    pub multiplier: f32,
    /// No retry once this long has passed since a delivery's first attempt (default 20 min).
    pub max_elapsed: Duration,
}

impl RawRetry {
    /// `at` names the handler (`handlers[2]`).
    pub(super) fn validate(self, at: &str) -> Result<RetryConfig, ConfigError> {
        let retry = RetryConfig {
            multiplier: self.multiplier.unwrap_or(DEFAULT_BACKOFF_MULTIPLIER),
            max_elapsed: duration(
                &format!("{at}.retry.max_elapsed"),
                self.max_elapsed.as_deref(),
                DEFAULT_MAX_ELAPSED,
            )?,
            max_attempts: self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            initial_backoff: duration(
                &format!("{at}.retry.initial_backoff"),
                self.initial_backoff.as_deref(),
                DEFAULT_INITIAL_BACKOFF,
            )?,
            max_backoff: duration(
                &format!("{at}.retry.max_backoff"),
                self.max_backoff.as_deref(),
                DEFAULT_MAX_BACKOFF,
            )?,
        };
        if retry.max_attempts == 0 {
            return Err(ConfigError::field(format!("{at}.retry.max_attempts"), "must be at least 1"));
        }
        if retry.max_backoff < retry.initial_backoff {
            return Err(ConfigError::field(format!("{at}.retry.max_backoff"), "must not be less than initial_backoff"));
        }
        if !(1.0..=100.0).contains(&retry.multiplier) {
            return Err(ConfigError::field(format!("{at}.retry.multiplier"), "must be between 1.0 and 100.0"));
        }
        if retry.max_elapsed.is_zero() {
            return Err(ConfigError::field(format!("{at}.retry.max_elapsed"), "must be greater than 0"));
        }
        Ok(retry)
    }
}
