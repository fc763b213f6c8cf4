//! `[admin]`: the admin HTTP server's address, its token and the `Host` values
//! the store API answers to.

use serde::Deserialize;

use super::values::expand_env;
use super::ConfigError;

/// Prometheus' registered default port for exporters of this kind; loopback only.
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";

/// `[admin]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// `host:port` of the admin HTTP server (health, metrics, store API), or `"off"`.
    pub listen: Option<String>,
    /// Bearer token for the store API (`/v1/*`) from other machines; required
    /// when `listen` is not loopback. Local callers use the per-run token.
    pub token: Option<String>,
    /// More `Host` header values the store API answers to (`host` or `host:port`),
    /// besides the listen address and the loopback names of its port.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// `[admin.ui]`: the operators' console at `/ui`.
    pub ui: Option<super::ui::RawUi>,
}

/// `[admin]` validated; every default when the section is absent.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where the admin server listens (default `127.0.0.1:9464`); `None` when turned off.
    pub listen: Option<std::net::SocketAddr>,
    /// Resolved from `${VAR}`: never logged or printed.
    pub token: Option<String>,
    /// Lower-case `host` or `host:port` entries; default empty (only the listen
    /// address and loopback names pass the DNS-rebinding check).
    pub allowed_hosts: Vec<String>,
    /// `[admin.ui]`: the console at `/ui` (on by default).
    pub ui: super::ui::UiConfig,
}

/// The section is optional: absent means every default.
pub(super) fn validate(
    raw: Option<RawAdmin>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AdminConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let token = raw.token.map(|t| expand_env("admin.token", &t, env)).transpose()?;
    if token.as_deref().is_some_and(str::is_empty) {
        return Err(ConfigError::field("admin.token", "must not be empty"));
    }
    let listen = match raw.listen.as_deref().map(str::trim) {
        Some("off") => None,
        other => {
            let text = other.unwrap_or(DEFAULT_ADMIN_LISTEN);
            let addr: std::net::SocketAddr = text.parse().map_err(|e| {
                ConfigError::field("admin.listen", format!("{text:?} is not host:port ({e}), or \"off\""))
            })?;
            if !addr.ip().is_loopback() && token.is_none() {
                return Err(ConfigError::field(
                    "admin.token",
                    format!(
                        "required when admin.listen ({addr}) is not a loopback address (repair operations need it)"
                    ),
                ));
            }
            Some(addr)
        }
    };
    let allowed_hosts = raw
        .allowed_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            allowed_host(h).map_err(|e| ConfigError::field(format!("admin.allowed_hosts[{i}]"), format!("{h:?} {e}")))
        })
        .collect::<Result<_, _>>()?;
    let ui = super::ui::validate(raw.ui)?;
    Ok(AdminConfig { listen, token, allowed_hosts, ui })
}

/// One `Host` value as it is compared (lower case): a name or address, with an optional port.
fn allowed_host(entry: &str) -> Result<String, &'static str> {
    let (host, port) = match entry.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && (!h.starts_with('[') || h.ends_with(']')) => (h, Some(p)),
        _ => (entry, None),
    };
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err("has a port that is not a number (write host or host:port)");
    }
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/@?#*".contains(c)) {
        return Err("is not a host name (write host or host:port, no scheme, path or wildcard)");
    }
    Ok(entry.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, parse, BASE};
    use super::super::Config;

    #[test]
    fn admin_defaults_to_loopback_and_needs_a_token_elsewhere() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n").unwrap();
        assert_eq!(c.admin.listen, Some("127.0.0.1:9464".parse().unwrap()));
        let e = Config::parse(
            &format!("{BASE}[admin]\nlisten=\"0.0.0.0:9464\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("admin.token"), "{e:#}");
        let c = Config::parse(
            &format!("{BASE}[admin]\nlisten=\"0.0.0.0:9464\"\ntoken=\"${{TOKEN}}\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap();
        assert_eq!(c.admin.token.as_deref(), Some("s3cret"));
        let c = Config::parse(
            &format!("{BASE}[admin]\nlisten=\"off\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
            &env,
        )
        .unwrap();
        assert_eq!(c.admin.listen, None);
    }

    #[test]
    fn admin_allowed_hosts_default_to_none_and_name_a_bad_entry() {
        let c = parse("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n").unwrap();
        assert!(c.admin.allowed_hosts.is_empty());
        let hosts = |list: &str| {
            Config::parse(
                &format!("{BASE}[admin]\nallowed_hosts={list}\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
                &env,
            )
            .map(|c| c.admin.allowed_hosts)
        };
        assert_eq!(
            hosts(r#"["Outboxd.Internal", "10.0.0.7:9464", "[fd00::1]:9464"]"#).unwrap(),
            ["outboxd.internal", "10.0.0.7:9464", "[fd00::1]:9464"]
        );
        for bad in [r#"["ok", "http://x"]"#, r#"["ok", "x:port"]"#, r#"["ok", ""]"#, r#"["ok", "*.example"]"#] {
            let e = format!("{:#}", hosts(bad).unwrap_err());
            assert!(e.contains("admin.allowed_hosts[1]"), "{bad}: {e}");
        }
    }
}
