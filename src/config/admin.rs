//! `[admin]`: the admin HTTP server's address, its tokens (`token`, and the named
//! credentials of `[[admin.tokens]]`) and the `Host` values the store API answers to.

use serde::Deserialize;

use super::values::expand_env;
use super::ConfigError;

/// Prometheus' registered default port for exporters of this kind; loopback only.
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// The shortest `[[admin.tokens]]` token (bytes, after `${VAR}`): 128 bits when it
/// is random bytes in hex or base64 of at least 16 characters, so a guess at one a
/// try is hopeless; shorter ones are passwords, and refused.
const MIN_TOKEN_BYTES: usize = 16;
/// The longest credential name: it is shown in every audit entry and log line.
const MAX_NAME_CHARS: usize = 64;
/// The name `[admin] token` has in the audit.
pub const ADMIN_TOKEN_NAME: &str = "admin";
/// The name the per-run token of the owner file has in the audit.
pub const RUN_TOKEN_NAME: &str = "local";

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
    /// Named credentials for the store API, each with its access.
    #[serde(default)]
    pub tokens: Vec<RawToken>,
}

/// One `[[admin.tokens]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawToken {
    /// Who holds it: shown in the audit of what they do.
    pub name: String,
    /// The bearer token, usually `${VAR}`.
    pub token: String,
    /// `operate` (the default: read and repair) or `read` (look only).
    pub access: Option<Access>,
}

/// What a credential may do with the store API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Access {
    /// Read records, stats, the audit; no repair.
    Read,
    /// Read, and repair: forget, resolve, retry, gc.
    Operate,
}

impl Access {
    /// `read` or `operate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Operate => "operate",
        }
    }
}

/// A named credential of the store API.
#[derive(Clone)]
#[non_exhaustive]
pub struct NamedToken {
    /// Its name, as the audit shows it.
    pub name: String,
    /// Resolved from `${VAR}`: never logged or printed.
    pub token: String,
    /// What it may do.
    pub access: Access,
}

impl std::fmt::Debug for NamedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedToken").field("name", &self.name).field("access", &self.access).finish_non_exhaustive()
    }
}

/// `[admin]` validated; every default when the section is absent.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// `[[admin.tokens]]`, in file order; names unique, and neither `admin` nor `local`.
    pub tokens: Vec<NamedToken>,
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
    let tokens = named_tokens(&raw.tokens, token.as_deref(), env)?;
    let listen = match raw.listen.as_deref().map(str::trim) {
        Some("off") => None,
        other => {
            let text = other.unwrap_or(DEFAULT_ADMIN_LISTEN);
            let addr: std::net::SocketAddr = text.parse().map_err(|e| {
                ConfigError::field("admin.listen", format!("{text:?} is not host:port ({e}), or \"off\""))
            })?;
            if !addr.ip().is_loopback() && token.is_none() && tokens.is_empty() {
                return Err(ConfigError::field(
                    "admin.token",
                    format!(
                        "required (or an [[admin.tokens]] entry) when admin.listen ({addr}) is not a loopback \
                         address (repair operations need it)"
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
    Ok(AdminConfig { listen, token, allowed_hosts, tokens, ui })
}

/// `[[admin.tokens]]` checked: names short printable identifiers, unique and not
/// those of the built-in credentials; tokens long enough and each a credential of
/// its own (one token under two names would make the audit guess).
fn named_tokens(
    raw: &[RawToken],
    admin_token: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<NamedToken>, ConfigError> {
    let mut tokens: Vec<NamedToken> = Vec::with_capacity(raw.len());
    for (i, t) in raw.iter().enumerate() {
        let field = |key: &str| format!("admin.tokens[{i}].{key}");
        let name = t.name.as_str();
        if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
            return Err(ConfigError::field(field("name"), format!("must be 1 to {MAX_NAME_CHARS} characters")));
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-@".contains(c)) {
            return Err(ConfigError::field(
                field("name"),
                format!("{name:?}: use letters, digits and . _ - @ only (it is shown in the audit and the logs)"),
            ));
        }
        if [ADMIN_TOKEN_NAME, RUN_TOKEN_NAME].contains(&name) {
            return Err(ConfigError::field(
                field("name"),
                format!("{name:?} is the name of a built-in credential ([admin] token is \"admin\", the owner file's \"local\")"),
            ));
        }
        if let Some(j) = tokens.iter().position(|o| o.name == name) {
            return Err(ConfigError::field(field("name"), format!("{name:?} is admin.tokens[{j}]'s name too")));
        }
        let token = expand_env(&field("token"), &t.token, env)?;
        if token.len() < MIN_TOKEN_BYTES {
            return Err(ConfigError::field(
                field("token"),
                format!("must be at least {MIN_TOKEN_BYTES} bytes (e.g. `openssl rand -hex 32`)"),
            ));
        }
        if admin_token == Some(token.as_str()) || tokens.iter().any(|o| o.token == token) {
            return Err(ConfigError::field(
                field("token"),
                "is another credential's token too: give every name a token of its own",
            ));
        }
        tokens.push(NamedToken { name: name.to_owned(), token, access: t.access.unwrap_or(Access::Operate) });
    }
    Ok(tokens)
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
    use super::Access;

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

    fn tokens(entries: &str) -> Result<Config, String> {
        let env = |name: &str| match name {
            "ALICE_TOKEN" => Some("alice-0123456789abcdef".to_owned()),
            "SHORT" => Some("short".to_owned()),
            other => env(other),
        };
        Config::parse(&format!("{BASE}{entries}[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"), &env)
            .map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn named_tokens_default_to_operate_and_read_is_a_closed_choice() {
        let c = tokens(
            "[[admin.tokens]]\nname=\"alice\"\ntoken=\"${ALICE_TOKEN}\"\n\
             [[admin.tokens]]\nname=\"bob.viewer\"\ntoken=\"bob-0123456789abcdef\"\naccess=\"read\"\n",
        )
        .unwrap();
        let named: Vec<_> = c.admin.tokens.iter().map(|t| (t.name.as_str(), t.access)).collect();
        assert_eq!(named, [("alice", Access::Operate), ("bob.viewer", Access::Read)]);
        assert_eq!(c.admin.tokens[0].token, "alice-0123456789abcdef", "${{VAR}} is expanded");
        assert!(!format!("{:?}", c.admin.tokens).contains("0123456789"), "Debug never shows a token");
        let e = tokens("[[admin.tokens]]\nname=\"a\"\ntoken=\"${ALICE_TOKEN}\"\naccess=\"write\"\n").unwrap_err();
        assert!(e.contains("unknown variant `write`"), "{e}");
    }

    #[test]
    fn named_tokens_are_refused_when_short_shared_unnamed_or_named_like_a_built_in() {
        let one = |name: &str, token: &str| tokens(&format!("[[admin.tokens]]\nname={name:?}\ntoken={token:?}\n"));
        let long = "x".repeat(65);
        for (name, token, field) in [
            ("", "${ALICE_TOKEN}", "admin.tokens[0].name"),
            ("has space", "${ALICE_TOKEN}", "admin.tokens[0].name"),
            ("admin", "${ALICE_TOKEN}", "admin.tokens[0].name"),
            ("local", "${ALICE_TOKEN}", "admin.tokens[0].name"),
            (long.as_str(), "${ALICE_TOKEN}", "admin.tokens[0].name"),
            ("alice", "${SHORT}", "admin.tokens[0].token"),
        ] {
            let e = one(name, token).unwrap_err();
            assert!(e.contains(field), "{name:?}: {e}");
            assert!(!e.contains("alice-0123456789abcdef"), "an error never shows a token: {e}");
        }
        let twice = "[[admin.tokens]]\nname=\"a\"\ntoken=\"${ALICE_TOKEN}\"\n\
                     [[admin.tokens]]\nname=\"a\"\ntoken=\"other-0123456789abcdef\"\n";
        assert!(tokens(twice).unwrap_err().contains("admin.tokens[1].name"));
        let shared = "[[admin.tokens]]\nname=\"a\"\ntoken=\"${ALICE_TOKEN}\"\n\
                      [[admin.tokens]]\nname=\"b\"\ntoken=\"${ALICE_TOKEN}\"\n";
        assert!(tokens(shared).unwrap_err().contains("admin.tokens[1].token"));
        let remote = "[admin]\nlisten=\"0.0.0.0:9464\"\n[[admin.tokens]]\nname=\"a\"\ntoken=\"${ALICE_TOKEN}\"\n";
        assert!(tokens(remote).is_ok(), "a named token is enough off loopback");
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
