//! `[handlers.circuit]` and `[handlers.concurrency]`: how a handler backs off as a
//! whole when its receiver fails for everyone, and how many of its calls may be in
//! flight at once.

use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, ExpandedUrl};
use super::ConfigError;

/// Consecutive receiver failures that open the circuit. Three in a row are rare
/// from a healthy receiver (one event's own trouble is interleaved with other
/// events' successes) and come within a second from a down one.
const DEFAULT_FAILURES: u32 = 3;
/// The first open period: a restarting receiver is often back within a second or two.
const DEFAULT_PROBE_AFTER: Duration = Duration::from_secs(1);
/// The longest open period: a receiver that is back waits at most this long for
/// its first event, and an hour's outage costs it about 720 probe calls per
/// instance and handler (one call every 5 s is nothing to a receiver that is up).
const DEFAULT_PROBE_MAX: Duration = Duration::from_secs(5);
/// How long a route of a topic with other routes waits for its receiver with its
/// events in memory (its partitions paused, the other routes waiting too) before it
/// records them held and lets the partitions go on. A restarting receiver or a
/// deploy is back within it (nothing is written for a short blip); past it, the
/// outage is real and the other routes' events would wait on for nothing.
const DEFAULT_HOLD_AFTER: Duration = Duration::from_secs(60);

/// `[handlers.circuit]` as written.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCircuit {
    /// `handlers[].circuit.enabled`: default true.
    pub enabled: Option<bool>,
    /// `handlers[].circuit.failures`: consecutive receiver failures that open it
    /// (default 3, or `retry.max_attempts` when that is smaller).
    pub failures: Option<u32>,
    /// `handlers[].circuit.probe_after`: the first open period before a probe (default "1s").
    pub probe_after: Option<String>,
    /// `handlers[].circuit.probe_max`: the longest open period; each failed probe doubles it up to this (default "5s").
    pub probe_max: Option<String>,
    /// `handlers[].circuit.health_url`: probe with `GET` here (2xx = healthy) instead of the next event's call.
    pub health_url: Option<String>,
    /// `handlers[].circuit.give_up_after`: dead-letter waiting events once it has been open this long (default: never).
    pub give_up_after: Option<String>,
    /// `handlers[].circuit.hold_after`: on a topic with several routes, record this
    /// route's waiting events held (in order, with their copies) once it has been open
    /// this long, so that the others go on (default "60s").
    pub hold_after: Option<String>,
}

/// A handler's circuit breaker, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitConfig {
    /// Off: every failure is the event's, as without a circuit.
    pub enabled: bool,
    /// Consecutive receiver failures (connect errors, timeouts, 408, 425, 429, 5xx) that open it; at least 1.
    pub failures: u32,
    /// The first open period (with jitter) before one probe call.
    pub probe_after: Duration,
    /// The longest open period; not less than `probe_after`. Also the longest a
    /// `Retry-After` pauses the handler.
    pub probe_max: Duration,
    /// Probed with `GET` (2xx = healthy) instead of the next waiting event's real call;
    /// shown as written, like the handler's URL (`${VAR}` may hold its secrets too).
    pub health_url: Option<ExpandedUrl>,
    /// Once open this long, waiting events are recorded dead instead of waiting on.
    pub give_up_after: Option<Duration>,
    /// On a topic with several routes: once open this long, this route's events are
    /// recorded held with their message copies (they run in order once it closes)
    /// instead of waiting in memory with the topic's partitions paused.
    pub hold_after: Duration,
}

impl Default for CircuitConfig {
    fn default() -> CircuitConfig {
        CircuitConfig {
            enabled: true,
            failures: DEFAULT_FAILURES,
            probe_after: DEFAULT_PROBE_AFTER,
            probe_max: DEFAULT_PROBE_MAX,
            health_url: None,
            give_up_after: None,
            hold_after: DEFAULT_HOLD_AFTER,
        }
    }
}

impl RawCircuit {
    /// `at` names the handler (`handlers[2]`); `max_attempts` is its retry budget.
    pub(super) fn validate(
        self,
        at: &str,
        max_attempts: u32,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<CircuitConfig, ConfigError> {
        let d = CircuitConfig::default();
        // Unset, it follows a smaller retry budget down (`max_attempts = 1` opens it on the first failure).
        let failures = self.failures.unwrap_or(d.failures.min(max_attempts));
        let field = format!("{at}.circuit.health_url");
        let c = CircuitConfig {
            enabled: self.enabled.unwrap_or(d.enabled),
            failures,
            probe_after: duration(&format!("{at}.circuit.probe_after"), self.probe_after.as_deref(), d.probe_after)?,
            probe_max: duration(&format!("{at}.circuit.probe_max"), self.probe_max.as_deref(), d.probe_max)?,
            health_url: match &self.health_url {
                Some(u) => Some(ExpandedUrl::new(super::values::expand_env(&field, u, env)?, u)),
                None => None,
            },
            give_up_after: self
                .give_up_after
                .map(|v| duration(&format!("{at}.circuit.give_up_after"), Some(&v), Duration::ZERO))
                .transpose()?,
            hold_after: duration(&format!("{at}.circuit.hold_after"), self.hold_after.as_deref(), d.hold_after)?,
        };
        if failures == 0 {
            return Err(ConfigError::field(format!("{at}.circuit.failures"), "must be at least 1"));
        }
        if c.enabled && failures > max_attempts {
            return Err(ConfigError::field(
                format!("{at}.circuit.failures"),
                format!(
                    "is {failures}, more than retry.max_attempts ({max_attempts}): an event whose key has nothing else \
                     in flight would go dead before the circuit opens; lower it or raise retry.max_attempts"
                ),
            ));
        }
        if c.probe_after.is_zero() {
            return Err(ConfigError::field(format!("{at}.circuit.probe_after"), "must be more than 0"));
        }
        if c.probe_max < c.probe_after {
            return Err(ConfigError::field(format!("{at}.circuit.probe_max"), "must not be less than probe_after"));
        }
        if let Some(url) = &c.health_url {
            match reqwest::Url::parse(url.expose()) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                Ok(_) => return Err(ConfigError::field(field, "must be http or https")),
                Err(e) => return Err(ConfigError::field(field, format!("{url}: {e}"))),
            }
        }
        if c.give_up_after.is_some_and(|g| g.is_zero()) {
            return Err(ConfigError::field(
                format!("{at}.circuit.give_up_after"),
                "must be more than 0 (leave it out to wait for the receiver as long as it takes)",
            ));
        }
        if c.hold_after.is_zero() {
            return Err(ConfigError::field(format!("{at}.circuit.hold_after"), "must be more than 0"));
        }
        Ok(c)
    }
}

/// `[handlers.concurrency]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConcurrency {
    /// `handlers[].concurrency.adaptive`: adapt the limit to the receiver's latency and errors (default false).
    pub adaptive: Option<bool>,
    /// `handlers[].concurrency.max`: the most calls of this handler in flight (default `store.max_in_flight`).
    pub max: Option<usize>,
}

/// How many calls of a handler may be in flight, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyConfig {
    /// The limit moves between 1 and `max` by the receiver's latency and errors
    /// (AIMD); off, it is `max` (after a circuit closes it still ramps up from 1).
    pub adaptive: bool,
    /// The most calls in flight; `None`: `store.max_in_flight`.
    pub max: Option<usize>,
}

/// Off by default: a receiver that fails a share of its calls for reasons other than
/// load (one call in five answered 503 at random) drives the controller down to one
/// call in flight, and a single call that then hangs until its timeout holds up every
/// key (docs/configuration.md has the numbers).
impl Default for ConcurrencyConfig {
    fn default() -> ConcurrencyConfig {
        ConcurrencyConfig { adaptive: false, max: None }
    }
}

impl RawConcurrency {
    pub(super) fn validate(self, at: &str) -> Result<ConcurrencyConfig, ConfigError> {
        if self.max == Some(0) {
            return Err(ConfigError::field(format!("{at}.concurrency.max"), "must be at least 1"));
        }
        Ok(ConcurrencyConfig {
            adaptive: self.adaptive.unwrap_or(ConcurrencyConfig::default().adaptive),
            max: self.max,
        })
    }
}
