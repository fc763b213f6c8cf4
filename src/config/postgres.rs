//! The `kind = "postgres"` part of a handler: the receiver's database, the statements
//! each event runs there, and the inbox row written in the same transaction.

use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, expand_env, without_userinfo};
use super::{ConfigError, RawHandler};

/// Connections to the receiver's database, at most: enough for the handler's default
/// concurrency to keep them busy, few enough for a database with a hundred connections.
const DEFAULT_POOL_SIZE: usize = 8;
/// A statement (and the whole transaction) that has not finished by then is treated
/// as failed and retried; the transaction is rolled back.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_INBOX_TABLE: &str = "outboxd_inbox";
const DEFAULT_ID_COLUMN: &str = "event_id";

/// `handlers[].statements[]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStatement {
    /// `handlers[].statements[].sql`: one SQL statement with `$1`, `$2`, ... parameters.
    pub sql: String,
    /// `handlers[].statements[].params`: what each parameter is, in order.
    #[serde(default)]
    pub params: Vec<String>,
}

/// `[handlers.inbox]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInbox {
    /// `handlers[].inbox.table`: the inbox table (default `outboxd_inbox`), `schema.table` allowed.
    pub table: Option<String>,
    /// `handlers[].inbox.id_column`: its unique column of idempotency keys (default `event_id`).
    pub id_column: Option<String>,
}

/// Where a statement parameter's value comes from; every value is sent as text
/// (`NULL` when the event has none), so a statement casts what is not text (`$2::numeric`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Param {
    /// `id`: the event id.
    Id,
    /// `key`: the route's idempotency key (the event id on a topic's first route).
    IdempotencyKey,
    /// `aggregate_id`: the Kafka key, unwrapped.
    AggregateId,
    /// `type`: the event type.
    Type,
    /// `topic`, `partition`, `offset`: where the message is.
    Topic,
    /// See [`Param::Topic`].
    Partition,
    /// See [`Param::Topic`].
    Offset,
    /// `payload`: the payload as JSON text (`$n::jsonb`), or as text when it is not JSON.
    Payload,
    /// `payload.a.b`: a field of the JSON payload, as a JSON pointer: a string as it
    /// is, anything else as its JSON text; `NULL` when missing or JSON `null`.
    Field(String),
    /// `header.NAME`: the value of the message's header `NAME` (the last one, when it
    /// repeats) as text; `NULL` when there is none or it has no value.
    Header(String),
}

impl Param {
    fn parse(field: &str, text: &str) -> Result<Param, ConfigError> {
        Ok(match text {
            "id" => Param::Id,
            "key" => Param::IdempotencyKey,
            "aggregate_id" => Param::AggregateId,
            "type" => Param::Type,
            "topic" => Param::Topic,
            "partition" => Param::Partition,
            "offset" => Param::Offset,
            "payload" => Param::Payload,
            _ => match text.split_once('.') {
                Some(("header", name)) if !name.is_empty() => Param::Header(name.to_owned()),
                Some(("payload", path)) if !path.split('.').any(str::is_empty) => Param::Field(
                    path.split('.').map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1"))).collect(),
                ),
                _ => {
                    return Err(ConfigError::field(
                        field,
                        format!(
                            "{text:?} is not a parameter: use id, key, aggregate_id, type, topic, partition, offset, \
                             payload, payload.FIELD.PATH or header.NAME"
                        ),
                    ))
                }
            },
        })
    }
}

/// One statement with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The SQL as written.
    pub sql: String,
    /// Its parameters, `$1` first.
    pub params: Vec<Param>,
}

/// A `kind = "postgres"` handler, validated. Its `Debug` shows the URL as written,
/// user info replaced: the password never reaches a log.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The connection URL with `${VAR}` expanded (never shown).
    pub url: String,
    /// The URL as written, user info replaced: what logs and `check-config` show.
    pub shown: String,
    /// The most connections open at once.
    pub pool_size: usize,
    /// The longest a transaction may take.
    pub timeout: Duration,
    /// Run in order in one transaction after the inbox row.
    pub statements: Vec<Statement>,
    /// The inbox table, quoted for SQL (`"public"."outboxd_inbox"`).
    pub inbox_table: String,
    /// Its column of idempotency keys, quoted for SQL.
    pub id_column: String,
    /// `sslmode=require` in the URL: TLS, the server's certificate and host name verified.
    pub tls: bool,
    /// The CA certificates (PEM, one each) `tls_ca` adds to the system's for that check.
    pub tls_ca: Option<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.shown)
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("statements", &self.statements)
            .field("inbox_table", &self.inbox_table)
            .field("id_column", &self.id_column)
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca.as_ref().map(Vec::len))
            .finish()
    }
}

impl PostgresConfig {
    /// Whether a statement reads the message's headers (`header.NAME`): only then are
    /// they copied onto the event.
    pub fn reads_headers(&self) -> bool {
        self.statements.iter().flat_map(|s| &s.params).any(|p| matches!(p, Param::Header(_)))
    }

    pub(super) fn from_raw(
        at: &str,
        h: &RawHandler,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PostgresConfig, ConfigError> {
        let Some(written) = &h.url else {
            return Err(ConfigError::field(format!("{at}.url"), "required for kind = \"postgres\""));
        };
        let url = expand_env(&format!("{at}.url"), written, env)?;
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError::field(format!("{at}.url"), "must be a postgres:// or postgresql:// URL"));
        }
        let parsed: tokio_postgres::Config =
            url.parse().map_err(|e| ConfigError::field(format!("{at}.url"), format!("{e}")))?;
        let tls = parsed.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
        let tls_ca = match &h.tls_ca {
            None => None,
            Some(_) if !tls => {
                return Err(ConfigError::field(
                    format!("{at}.tls_ca"),
                    "only with sslmode=require in the url (TLS is used only then)",
                ))
            }
            Some(path) => Some(read_ca(&format!("{at}.tls_ca"), path)?),
        };
        let pool_size = h.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        if pool_size == 0 {
            return Err(ConfigError::field(format!("{at}.pool_size"), "must be at least 1"));
        }
        let timeout = duration(&format!("{at}.timeout"), h.timeout.as_deref(), DEFAULT_TIMEOUT)?;
        if timeout.is_zero() {
            return Err(ConfigError::field(format!("{at}.timeout"), "must be greater than 0"));
        }
        let mut statements = Vec::new();
        for (i, s) in h.statements.iter().enumerate() {
            let field = format!("{at}.statements[{i}]");
            if s.sql.trim().is_empty() {
                return Err(ConfigError::field(format!("{field}.sql"), "must not be empty"));
            }
            let params =
                s.params.iter().map(|p| Param::parse(&format!("{field}.params"), p)).collect::<Result<Vec<_>, _>>()?;
            statements.push(Statement { sql: s.sql.clone(), params });
        }
        if statements.is_empty() {
            return Err(ConfigError::field(
                format!("{at}.statements"),
                "list at least one statement for kind = \"postgres\"",
            ));
        }
        let inbox = h.inbox.clone().unwrap_or_default();
        let inbox_table =
            identifier(&format!("{at}.inbox.table"), inbox.table.as_deref().unwrap_or(DEFAULT_INBOX_TABLE), true)?;
        let id_column = identifier(
            &format!("{at}.inbox.id_column"),
            inbox.id_column.as_deref().unwrap_or(DEFAULT_ID_COLUMN),
            false,
        )?;
        Ok(PostgresConfig {
            url,
            shown: without_userinfo(written),
            pool_size,
            timeout,
            statements,
            inbox_table,
            id_column,
            tls,
            tls_ca,
        })
    }
}

/// The PEM certificates of a `tls_ca` file, refused when it cannot be read or holds none.
fn read_ca(field: &str, path: &str) -> Result<Vec<Vec<u8>>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::field(field, format!("reading {path}: {e}")))?;
    const END: &str = "-----END CERTIFICATE-----";
    let certs: Vec<Vec<u8>> = text
        .split_inclusive(END)
        .filter(|part| part.contains("-----BEGIN CERTIFICATE-----") && part.contains(END))
        .map(|part| part.trim_start().as_bytes().to_vec())
        .collect();
    if certs.is_empty() {
        return Err(ConfigError::field(
            field,
            format!("{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(certs)
}

/// An SQL identifier (`schema.table` with `qualified`), quoted: letters, digits and
/// `_`, not starting with a digit. Config text never reaches SQL unchecked.
fn identifier(field: &str, text: &str, qualified: bool) -> Result<String, ConfigError> {
    let parts: Vec<&str> = if qualified { text.split('.').collect() } else { vec![text] };
    let fine = |p: &&str| {
        !p.is_empty()
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if parts.len() > 2 || !parts.iter().all(fine) {
        return Err(ConfigError::field(
            field,
            format!(
                "{text:?} is not a plain SQL name (letters, digits and _{})",
                if qualified { ", schema.table" } else { "" }
            ),
        ));
    }
    Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{err, parse};
    use super::Param;

    const PG: &str = "[[handlers]]\ntopics=[\"o\"]\nkind=\"postgres\"\nurl=\"postgresql://u:p@127.0.0.1:5432/db\"\n";

    #[test]
    fn a_postgres_handler_parses_its_statements_and_quotes_its_inbox() {
        let c = parse(&format!(
            "{PG}statements=[{{ sql = \"UPDATE t SET n = n + 1 WHERE id = $1\", params = [\"aggregate_id\"] }},\
             {{ sql = \"INSERT INTO x VALUES ($1, $2::jsonb, $3, $4)\", params = [\"key\", \"payload\", \"payload.a.b\", \"header.tenant\"] }}]\n\
             [handlers.inbox]\ntable = \"app.message_log\"\nid_column = \"id\"\n"
        ))
        .unwrap();
        let crate::config::HandlerSpec::Postgres(pg) = &c.handlers[0].spec else { panic!("postgres") };
        assert_eq!((pg.inbox_table.as_str(), pg.id_column.as_str()), ("\"app\".\"message_log\"", "\"id\""));
        assert_eq!(
            pg.statements[1].params,
            [Param::IdempotencyKey, Param::Payload, Param::Field("/a/b".into()), Param::Header("tenant".into())]
        );
        assert!(pg.reads_headers(), "the headers are copied onto its events");
        assert_eq!(pg.shown, "postgresql://<redacted>@127.0.0.1:5432/db");
        assert!(!format!("{:?}", c.handlers[0]).contains("u:p@"), "the password stays out of Debug");
        assert_eq!(
            c.handlers[0].on_uncertain,
            crate::config::OnUncertain::Verify,
            "verify by default: an exact lookup"
        );
    }

    #[test]
    fn the_postgres_example_is_valid() {
        let text = include_str!("../../examples/outboxd-postgres.toml");
        let env = |name: &str| (name == "ORDERS_READ_MODEL_URL").then(|| "postgresql://u:p@127.0.0.1/rm".to_owned());
        let c = super::super::Config::parse(text, &env).unwrap();
        let crate::config::HandlerSpec::Postgres(pg) = &c.handlers[0].spec else { panic!("postgres") };
        assert_eq!(pg.statements[0].params, [Param::AggregateId, Param::Field("/amount".into())]);
    }

    #[test]
    fn bad_postgres_settings_name_the_field() {
        let e = err(&format!("{PG}statements=[{{ sql = \"x\", params = [\"nope\"] }}]\n"));
        assert!(e.contains("handlers[0].statements[0].params") && e.contains("\"nope\""), "{e}");
        let e = err(&format!("{PG}statements=[]\n"));
        assert!(e.contains("handlers[0].statements"), "{e}");
        let e = err(&format!("{PG}statements=[{{ sql = \"x\" }}]\n[handlers.inbox]\ntable = \"a; DROP TABLE b\"\n"));
        assert!(e.contains("handlers[0].inbox.table") && e.contains("plain SQL name"), "{e}");
        let e =
            err("[[handlers]]\ntopics=[\"o\"]\nkind=\"postgres\"\nurl=\"http://h/\"\nstatements=[{ sql = \"x\" }]\n");
        assert!(e.contains("handlers[0].url") && e.contains("postgres://"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\nstatements=[{ sql = \"x\" }]\n");
        assert!(e.contains("handlers[0].statements: only valid for kind = \"postgres\""), "{e}");
    }

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn tls_is_on_with_sslmode_require_and_tls_ca_reads_each_certificate_of_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, format!("{CA}{CA}")).unwrap();
        let tls = PG.replace("/db\"", "/db?sslmode=require\"");
        let statement = "statements=[{ sql = \"x\" }]\n";
        let c = parse(&format!("{tls}{statement}tls_ca = {:?}\n", ca.display().to_string())).unwrap();
        let crate::config::HandlerSpec::Postgres(pg) = &c.handlers[0].spec else { panic!("postgres") };
        assert!(pg.tls);
        assert_eq!(pg.tls_ca.as_ref().map(Vec::len), Some(2), "both certificates of the bundle");
        let plain = parse(&format!("{PG}{statement}")).unwrap();
        let crate::config::HandlerSpec::Postgres(pg) = &plain.handlers[0].spec else { panic!("postgres") };
        assert!(!pg.tls, "no TLS unless the URL asks for it");

        let e = err(&format!("{PG}{statement}tls_ca = {:?}\n", ca.display().to_string()));
        assert!(e.contains("handlers[0].tls_ca") && e.contains("sslmode=require"), "{e}");
        let e = err(&format!("{tls}{statement}tls_ca = \"/nonexistent/ca.pem\"\n"));
        assert!(e.contains("handlers[0].tls_ca") && e.contains("/nonexistent/ca.pem"), "{e}");
        std::fs::write(&ca, "not a certificate").unwrap();
        let e = err(&format!("{tls}{statement}tls_ca = {:?}\n", ca.display().to_string()));
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = err(&format!("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\ntls_ca = {:?}\n", ca.display().to_string()));
        assert!(e.contains("handlers[0].tls_ca: only valid for kind = \"postgres\""), "{e}");
    }
}
