//! `[admin]`: the admin HTTP server's address, its tokens (`token`, and the named
//! credentials of `[[admin.tokens]]`) and the `Host` values the store API answers to.

use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, parse_size};
use super::ConfigError;

/// Prometheus' registered default port for exporters of this kind; loopback only.
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// The shortest `[[admin.tokens]]` token (bytes, after `${VAR}`): 128 bits when it
/// is random bytes in hex or base64 of at least 16 characters, so a guess at one a
/// try is hopeless; shorter ones are passwords, and refused.
const MIN_TOKEN_BYTES: usize = 16;
/// The longest credential name: it is shown in every audit entry and log line.
const MAX_NAME_CHARS: usize = 64;
/// Connections the admin server keeps open at once. Its callers are few (a probe or
/// two, a Prometheus scrape, a handful of operators' browsers with a few connections
/// each, `outboxd store`), and every connection holds a file descriptor the engine
/// may need (broker sockets, receiver calls, store files: a 1,024 limit is common).
const DEFAULT_MAX_CONNECTIONS: usize = 128;
/// How long a request's head may take to arrive, and a keep-alive connection may sit
/// idle: long enough for any real client on a slow link, short enough that idle or
/// half-sent connections give their place back within seconds.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take to be answered (an export's stream excepted: see
/// `export_timeout`). The slowest request is a page of 10,000 records.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may stay open at all: a client that stops reading a large
/// answer would otherwise hold its connection for good. Past an export's deadline.
const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(15 * 60);
/// The largest request body: the API and the console take query strings and small
/// forms (a token, a reason); nothing legitimate comes near it.
const DEFAULT_MAX_BODY: u64 = 64 * 1024;
/// Store reads of the admin server at once (each a thread of the blocking pool, which
/// restores need too): pages, stats, exports and the console's lists wait for a turn.
const DEFAULT_MAX_READS: usize = 4;
/// Records one request of the store API or the console examines at most while it
/// looks for records that match its filters (a state, a topic): a rare match among
/// millions of records costs a few pages of a fraction of a second each, never one
/// read of everything. Dead and parked records come from their index, not this.
const DEFAULT_READ_BUDGET: usize = 100_000;
/// How long one `/v1/export` may stream: `outboxd store export` through the service
/// writes about 50,000 records a second, so a million records take well under this.
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Failed credentials (bearer tokens and console logins) per client address per minute:
/// a person mistyping a token a few times is never slowed down.
const DEFAULT_FAILURES_PER_ADDRESS: u32 = 10;
/// Failed credentials per minute from all addresses together: bounds what a flood of
/// wrong tokens costs (their checks and log lines).
const DEFAULT_FAILURES_TOTAL: u32 = 60;
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
    /// Connections open at once (default 128).
    pub max_connections: Option<usize>,
    /// Time to read a request's head, and a keep-alive connection's idle time (default 10s).
    pub header_timeout: Option<String>,
    /// Time to answer a request (default 30s).
    pub request_timeout: Option<String>,
    /// Time a connection may stay open (default 15m).
    pub max_connection_age: Option<String>,
    /// Largest request body (default 64KiB).
    pub max_body: Option<String>,
    /// Store reads at once (default 4).
    pub max_reads: Option<usize>,
    /// Records one request examines at most (default 100000).
    pub read_budget: Option<usize>,
    /// How long one export may stream (default 10m).
    pub export_timeout: Option<String>,
    /// Failed credentials per client address per minute (default 10).
    pub failures_per_address: Option<u32>,
    /// Failed credentials per minute from all addresses (default 60).
    pub failures_total: Option<u32>,
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
#[derive(Clone)]
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
    /// How the admin server bounds its connections, requests and reads.
    pub limits: AdminLimits,
}

/// The admin server's bounds: what one client, or many, can take of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdminLimits {
    /// Connections open at once (at least 1).
    pub max_connections: usize,
    /// Time to read a request's head; also how long a keep-alive connection may idle.
    pub header_timeout: Duration,
    /// Time to answer a request (an export's stream has `export_timeout`).
    pub request_timeout: Duration,
    /// Time a connection may stay open at all.
    pub max_connection_age: Duration,
    /// Largest request body, in bytes.
    pub max_body: u64,
    /// Store reads at once.
    pub max_reads: usize,
    /// Records one request examines at most while it looks for matches.
    pub read_budget: usize,
    /// How long one export may stream.
    pub export_timeout: Duration,
    /// Failed credentials per client address per minute.
    pub failures_per_address: u32,
    /// Failed credentials per minute, all addresses together.
    pub failures_total: u32,
}

impl Default for AdminLimits {
    fn default() -> AdminLimits {
        AdminLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_connection_age: DEFAULT_MAX_CONNECTION_AGE,
            max_body: DEFAULT_MAX_BODY,
            max_reads: DEFAULT_MAX_READS,
            read_budget: DEFAULT_READ_BUDGET,
            export_timeout: DEFAULT_EXPORT_TIMEOUT,
            failures_per_address: DEFAULT_FAILURES_PER_ADDRESS,
            failures_total: DEFAULT_FAILURES_TOTAL,
        }
    }
}

/// Tokens are never printed: the section's `Debug` names them only.
impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .field("ui", &self.ui)
            .field("tokens", &self.tokens)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The section is optional: absent means every default.
pub(super) fn validate(
    raw: Option<RawAdmin>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AdminConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let token = raw.token.as_ref().map(|t| expand_env("admin.token", t, env)).transpose()?;
    if token.as_deref().is_some_and(|t| t.len() < MIN_TOKEN_BYTES) {
        return Err(ConfigError::field(
            "admin.token",
            format!("must be at least {MIN_TOKEN_BYTES} bytes (e.g. `openssl rand -hex 32`), like [[admin.tokens]]"),
        ));
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
    let limits = limits(&raw, raw.ui.as_ref().and_then(|ui| ui.login_attempts_per_minute))?;
    let ui = super::ui::validate(raw.ui)?;
    Ok(AdminConfig { listen, token, allowed_hosts, tokens, ui, limits })
}

/// The server's bounds; `login_attempts_per_minute` is the earlier name of
/// `failures_per_address` (`[admin.ui]`), used when that one is not set.
fn limits(raw: &RawAdmin, login_attempts_per_minute: Option<u32>) -> Result<AdminLimits, ConfigError> {
    let d = AdminLimits::default();
    let at_least_one = |field: &str, n: usize| {
        if n == 0 {
            Err(ConfigError::field(field, "must be at least 1"))
        } else {
            Ok(n)
        }
    };
    let positive = |field: &str, value: Option<&str>, default: Duration| -> Result<Duration, ConfigError> {
        let d = duration(field, value, default)?;
        if d.is_zero() {
            return Err(ConfigError::field(field, "must be more than 0"));
        }
        Ok(d)
    };
    let max_connections = at_least_one("admin.max_connections", raw.max_connections.unwrap_or(d.max_connections))?;
    let header_timeout = positive("admin.header_timeout", raw.header_timeout.as_deref(), d.header_timeout)?;
    let request_timeout = positive("admin.request_timeout", raw.request_timeout.as_deref(), d.request_timeout)?;
    let export_timeout = positive("admin.export_timeout", raw.export_timeout.as_deref(), d.export_timeout)?;
    let max_connection_age =
        positive("admin.max_connection_age", raw.max_connection_age.as_deref(), d.max_connection_age)?;
    if max_connection_age < request_timeout.max(export_timeout) {
        return Err(ConfigError::field(
            "admin.max_connection_age",
            "must be at least admin.request_timeout and admin.export_timeout (a connection would be cut mid-answer)",
        ));
    }
    let max_body = match raw.max_body.as_deref() {
        Some(text) => parse_size(text).filter(|n| (1..=1 << 30).contains(n)).ok_or_else(|| {
            ConfigError::field("admin.max_body", format!("{text:?}: a size up to 1GiB, such as \"64KiB\""))
        })?,
        None => d.max_body,
    };
    let max_reads = at_least_one("admin.max_reads", raw.max_reads.unwrap_or(d.max_reads))?;
    let read_budget = at_least_one("admin.read_budget", raw.read_budget.unwrap_or(d.read_budget))?;
    let (per_address, field) = match (raw.failures_per_address, login_attempts_per_minute) {
        (Some(n), _) => (n, "admin.failures_per_address"),
        (None, Some(n)) => (n, "admin.ui.login_attempts_per_minute"),
        (None, None) => (d.failures_per_address, "admin.failures_per_address"),
    };
    let failures_per_address = at_least_one(field, per_address as usize)? as u32;
    let failures_total =
        at_least_one("admin.failures_total", raw.failures_total.unwrap_or(d.failures_total) as usize)? as u32;
    Ok(AdminLimits {
        max_connections,
        header_timeout,
        request_timeout,
        max_connection_age,
        max_body,
        max_reads,
        read_budget,
        export_timeout,
        failures_per_address,
        failures_total,
    })
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
        let env = |name: &str| match name {
            "ADMIN_TOKEN" => Some("admin-0123456789abcdef".to_owned()),
            other => env(other),
        };
        let with = |token: &str| {
            Config::parse(
                &format!("{BASE}[admin]\nlisten=\"0.0.0.0:9464\"\ntoken=\"{token}\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n"),
                &env,
            )
        };
        assert_eq!(with("${ADMIN_TOKEN}").unwrap().admin.token.as_deref(), Some("admin-0123456789abcdef"));
        // As short as a password: refused, like a short [[admin.tokens]] token.
        let e = format!("{:#}", with("${TOKEN}").unwrap_err());
        assert!(e.contains("admin.token") && e.contains("at least 16 bytes"), "{e}");
        assert!(!e.contains("s3cret"), "the error never shows the token: {e}");
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
