//! `[log]`: what the log says about the events it does not name one by one.

use std::time::Duration;

use serde::Deserialize;

use super::values::duration;
use super::ConfigError;

/// One summary line per handler this often (30 s): at 10,000 events a second a line
/// per event is 10,000 `write(2)` calls a second and a log nobody reads; a summary
/// every 30 s is what a person watching the log can follow, and a rate over it is
/// steady. Dead, parked and held events keep a line each; every event's line is at
/// `debug`, and every event is in the traces.
const DEFAULT_SUMMARY_INTERVAL: Duration = Duration::from_secs(30);
/// Shorter summaries would be the per-event log again under another name.
const MIN_SUMMARY_INTERVAL: Duration = Duration::from_secs(1);

/// `[log]` as written.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// How often each handler's summary line is written, e.g. "30s" (the default).
    pub summary_interval: Option<String>,
}

/// `[log]` validated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogConfig {
    /// How often each handler that did something writes its summary line at `info`
    /// (events handled, duplicates suppressed, dead, held, call times).
    pub summary_interval: Duration,
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig { summary_interval: DEFAULT_SUMMARY_INTERVAL }
    }
}

impl RawLog {
    /// Checks the interval (at least 1 s) and fills in the default.
    pub fn validate(self) -> Result<LogConfig, ConfigError> {
        let field = "log.summary_interval";
        let summary_interval = duration(field, self.summary_interval.as_deref(), DEFAULT_SUMMARY_INTERVAL)?;
        if summary_interval < MIN_SUMMARY_INTERVAL {
            return Err(ConfigError::field(field, "must be at least 1s (per-event lines are at `debug`)"));
        }
        Ok(LogConfig { summary_interval })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_interval_defaults_to_30s_and_refuses_less_than_a_second() {
        assert_eq!(RawLog::default().validate().unwrap().summary_interval, Duration::from_secs(30));
        let set = |v: &str| RawLog { summary_interval: Some(v.to_owned()) }.validate();
        assert_eq!(set("5m").unwrap().summary_interval, Duration::from_secs(300));
        let e = set("100ms").unwrap_err().to_string();
        assert!(e.contains("log.summary_interval") && e.contains("at least 1s"), "{e}");
    }
}
