//! `[handlers.retry]`: how often and how long a failing delivery is tried again.

use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

use super::values::duration;

/// A few quick retries; permanent failures and exhausted retries end `dead`.
const DEFAULT_MAX_ATTEMPTS: u32 = 3;
const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
const DEFAULT_BACKOFF_MULTIPLIER: f32 = 2.0;
/// Stop retrying well inside the shortest common idempotency-key window
/// (30 minutes at several APIs; Stripe keeps keys 24 h): a retry after the
/// receiver forgot the key could repeat the side effect.
const DEFAULT_MAX_ELAPSED: Duration = Duration::from_secs(20 * 60);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub max_attempts: Option<u32>,
    pub initial_backoff: Option<String>,
    pub max_backoff: Option<String>,
    pub multiplier: Option<f32>,
    /// Give up once this much time has passed since the first attempt of a delivery.
    pub max_elapsed: Option<String>,
}

#[derive(Debug, Clone)]
pub struct RetryConfig {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f32,
    pub max_elapsed: Duration,
}

impl RawRetry {
    /// `at` names the handler (`handlers[2]`).
    pub(super) fn validate(self, at: &str) -> anyhow::Result<RetryConfig> {
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
        Ok(retry)
    }
}
