//! `[admin.ui]`: the operators' console at `/ui` on the admin server: whether it
//! is served, how long a login lasts, how many there may be, and whether its cookie
//! is marked `Secure`. (How many wrong tokens may be tried is `[admin]`'s, shared with
//! the store API.)

use std::time::Duration;

use serde::Deserialize;

use super::values::duration;
use super::ConfigError;

/// A session unused this long ends: someone who walked away from an unlocked
/// screen leaves a console that cannot act for long, yet an operator reading a
/// record for a few minutes is not logged out.
const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after its login whatever its use: one working day,
/// so a stolen cookie is not good forever.
const DEFAULT_SESSION_MAX: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at once: every login holds one until it ends, so the bound keeps
/// memory fixed; the least recently used is ended to make room.
const DEFAULT_MAX_SESSIONS: usize = 256;
/// Sessions of one credential at once: a person with a few browsers and tabs logged
/// in stays under it, and one credential (a shared `read` token) cannot take every place.
const DEFAULT_MAX_SESSIONS_PER_CREDENTIAL: usize = 16;

/// `[admin.ui]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUi {
    /// Serve the console at `/ui` (default true when the admin server listens).
    pub enabled: Option<bool>,
    /// A session unused this long ends (default 30m).
    pub session_idle: Option<String>,
    /// A session ends this long after its login (default 12h).
    pub session_max: Option<String>,
    /// The earlier name of `[admin] failures_per_address` (used when that is not set).
    pub login_attempts_per_minute: Option<u32>,
    /// Sessions kept at once (default 256).
    pub max_sessions: Option<usize>,
    /// Sessions of one credential at once (default 16).
    pub max_sessions_per_credential: Option<usize>,
    /// Mark the session cookie `Secure` (default false: the admin server speaks plain
    /// HTTP; set it when a TLS proxy serves the console).
    pub secure_cookie: Option<bool>,
}

/// `[admin.ui]` validated.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct UiConfig {
    /// Whether `/ui` is served.
    pub enabled: bool,
    /// A session unused this long ends.
    pub session_idle: Duration,
    /// A session ends this long after its login.
    pub session_max: Duration,
    /// Sessions kept at once (at least 1).
    pub max_sessions: usize,
    /// Sessions of one credential at once (at least 1).
    pub max_sessions_per_credential: usize,
    /// Whether the cookie carries `Secure`.
    pub secure_cookie: bool,
}

impl Default for UiConfig {
    fn default() -> UiConfig {
        UiConfig {
            enabled: true,
            session_idle: DEFAULT_SESSION_IDLE,
            session_max: DEFAULT_SESSION_MAX,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_credential: DEFAULT_MAX_SESSIONS_PER_CREDENTIAL,
            secure_cookie: false,
        }
    }
}

pub(super) fn validate(raw: Option<RawUi>) -> Result<UiConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let d = UiConfig::default();
    let session_idle = duration("admin.ui.session_idle", raw.session_idle.as_deref(), d.session_idle)?;
    let session_max = duration("admin.ui.session_max", raw.session_max.as_deref(), d.session_max)?;
    if session_idle.is_zero() {
        return Err(ConfigError::field("admin.ui.session_idle", "must be more than 0"));
    }
    if session_max < session_idle {
        return Err(ConfigError::field(
            "admin.ui.session_max",
            format!("must be at least admin.ui.session_idle ({})", humantime::format_duration(session_idle)),
        ));
    }
    if raw.login_attempts_per_minute == Some(0) {
        return Err(ConfigError::field("admin.ui.login_attempts_per_minute", "must be at least 1"));
    }
    let max_sessions = raw.max_sessions.unwrap_or(d.max_sessions);
    if max_sessions == 0 {
        return Err(ConfigError::field("admin.ui.max_sessions", "must be at least 1"));
    }
    let max_sessions_per_credential = raw.max_sessions_per_credential.unwrap_or(d.max_sessions_per_credential);
    if max_sessions_per_credential == 0 {
        return Err(ConfigError::field("admin.ui.max_sessions_per_credential", "must be at least 1"));
    }
    Ok(UiConfig {
        enabled: raw.enabled.unwrap_or(true),
        session_idle,
        session_max,
        max_sessions,
        max_sessions_per_credential,
        secure_cookie: raw.secure_cookie.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, BASE};
    use super::super::Config;

    fn ui(section: &str) -> Result<super::UiConfig, String> {
        Config::parse(&format!("{BASE}[admin.ui]\n{section}\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"), &env)
            .map(|c| c.admin.ui)
            .map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn the_console_is_on_with_its_defaults_and_bad_limits_are_named() {
        let c = ui("").unwrap();
        assert!(c.enabled && !c.secure_cookie);
        assert_eq!((c.session_idle.as_secs(), c.session_max.as_secs()), (1800, 43200));
        assert!(!ui("enabled = false").unwrap().enabled);
        assert!(ui("session_idle = \"0s\"").unwrap_err().contains("admin.ui.session_idle"));
        assert!(ui("session_idle = \"2h\"\nsession_max = \"1h\"").unwrap_err().contains("admin.ui.session_max"));
        assert!(ui("login_attempts_per_minute = 0").unwrap_err().contains("admin.ui.login_attempts_per_minute"));
        assert!(ui("max_sessions = 0").unwrap_err().contains("admin.ui.max_sessions"));
        assert!(ui("max_sessions_per_credential = 0").unwrap_err().contains("admin.ui.max_sessions_per_credential"));
        assert!(ui("colour = \"red\"").unwrap_err().contains("colour"));
    }
}
