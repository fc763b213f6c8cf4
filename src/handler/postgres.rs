//! `kind = "postgres"`: an event's side effect written into the receiver's own
//! PostgreSQL database, exactly once. One transaction per attempt: first the inbox row
//! (the route's idempotency key, `ON CONFLICT DO NOTHING`), then the configured
//! statements, then commit. An inbox row already there means the side effect was
//! committed by an earlier delivery: the transaction is rolled back and the event is
//! done without running anything. The `verify` lookup is an exact read of that row.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::{Handler, HandlerError, Outcome, Verified};
use crate::config::{Param, PostgresConfig};
use crate::event::{OutboxEvent, Payload};

/// Why a postgres handler could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PostgresBuildError {
    /// The connection pool could not be built.
    #[error("the connection pool to {0}: {1}")]
    Pool(String, String),
}

/// TLS that verifies the server's certificate (its chain, to the system's CAs and the
/// configured `tls_ca`, and its host name), for `sslmode=require`.
fn tls_connector(config: &PostgresConfig) -> Result<postgres_native_tls::MakeTlsConnector, String> {
    let mut builder = native_tls::TlsConnector::builder();
    for pem in config.tls_ca.iter().flatten() {
        let cert = native_tls::Certificate::from_pem(pem).map_err(|e| format!("tls_ca: {e}"))?;
        builder.add_root_certificate(cert);
    }
    let connector = builder.build().map_err(|e| format!("TLS: {e}"))?;
    Ok(postgres_native_tls::MakeTlsConnector::new(connector))
}

/// `kind = "postgres"` (module docs).
pub struct PostgresHandler {
    config: PostgresConfig,
    pool: Pool,
    /// `INSERT INTO inbox (id) VALUES ($1) ON CONFLICT DO NOTHING`.
    insert: String,
    /// `SELECT 1 FROM inbox WHERE id = $1`.
    lookup: String,
}

impl PostgresHandler {
    /// A bounded pool to `config.url` (connections are made on first use).
    pub fn new(config: PostgresConfig) -> Result<PostgresHandler, PostgresBuildError> {
        let fail = |e: String| PostgresBuildError::Pool(config.shown.clone(), e);
        let mut pg: tokio_postgres::Config =
            config.url.parse().map_err(|e: tokio_postgres::Error| fail(e.to_string()))?;
        pg.connect_timeout(config.timeout);
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match config.tls {
            true => Manager::from_config(pg, tls_connector(&config).map_err(fail)?, recycling),
            false => Manager::from_config(pg, tokio_postgres::NoTls, recycling),
        };
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.timeout))
            .create_timeout(Some(config.timeout))
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let (table, id) = (&config.inbox_table, &config.id_column);
        Ok(PostgresHandler {
            insert: format!("INSERT INTO {table} ({id}) VALUES ($1) ON CONFLICT DO NOTHING"),
            lookup: format!("SELECT 1 FROM {table} WHERE {id} = $1"),
            config,
            pool,
        })
    }

    async fn run(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        let mut client = self.pool.get().await.map_err(|e| HandlerError::unavailable(with_causes(&e)))?;
        let tx = client.transaction().await.map_err(classify)?;
        let key = event.idempotency_key();
        if tx.execute(self.insert.as_str(), &[&key]).await.map_err(classify)? == 0 {
            tx.rollback().await.map_err(classify)?;
            metrics::counter!(crate::metrics::names::DUPLICATES, "topic" => event.position.topic.clone(),
                "cause" => "receiver_inbox")
            .increment(1);
            return Ok(Outcome::new("duplicate: its inbox row is there (committed by an earlier delivery)"));
        }
        for statement in &self.config.statements {
            let values: Vec<Option<String>> = statement.params.iter().map(|p| value(p, event)).collect();
            let types = vec![Type::TEXT; values.len()];
            let prepared = tx.prepare_typed_cached(&statement.sql, &types).await.map_err(classify)?;
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                values.iter().map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
            tx.execute(&prepared, &params).await.map_err(classify)?;
        }
        tx.commit().await.map_err(classify)?;
        Ok(Outcome::new("committed"))
    }
}

#[async_trait::async_trait]
impl Handler for PostgresHandler {
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        // Bounded as a whole: a transaction that hangs is dropped, and the server rolls it back.
        match tokio::time::timeout(self.config.timeout, self.run(event)).await {
            Ok(result) => result,
            Err(_) => Err(HandlerError::unavailable(format!("postgres: no answer within {:?}", self.config.timeout))),
        }
    }

    /// The inbox row of the route's idempotency key: there = it happened (committed), absent = it did not.
    async fn verify(&self, event: &OutboxEvent) -> Result<Verified, HandlerError> {
        let client = self.pool.get().await.map_err(|e| HandlerError::unavailable(with_causes(&e)))?;
        let rows = client.query(self.lookup.as_str(), &[&event.idempotency_key()]).await.map_err(classify)?;
        Ok(match rows.is_empty() {
            true => Verified::Missing,
            false => Verified::Happened("verified: its inbox row is there".to_owned()),
        })
    }
}

/// A parameter's text (`None`: SQL `NULL`).
fn value(p: &Param, event: &OutboxEvent) -> Option<String> {
    let p = match p {
        Param::Id => return Some(event.id.clone()),
        Param::IdempotencyKey => return Some(event.idempotency_key().to_owned()),
        Param::AggregateId => return event.aggregate_id.clone(),
        Param::Type => return event.event_type.clone(),
        Param::Topic => return Some(event.position.topic.clone()),
        Param::Partition => return Some(event.position.partition.to_string()),
        Param::Offset => return Some(event.position.offset.to_string()),
        Param::Header(name) => {
            let (_, value) = event.headers.iter().rev().find(|(n, _)| n == name)?;
            return value.as_deref().map(|v| String::from_utf8_lossy(v).into_owned());
        }
        p => p,
    };
    match (p, &event.payload) {
        (Param::Payload, Payload::Json(j)) => Some(j.text().to_owned()),
        (Param::Payload, Payload::Text(t)) => Some(t.clone()),
        (Param::Payload, Payload::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        (Param::Field(pointer), Payload::Json(j)) => match j.value().pointer(pointer)? {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            v => Some(v.to_string()),
        },
        _ => None,
    }
}

/// Whose failure a database error is. The server unavailable or out of resources,
/// or the connection lost: the receiver's (the circuit). A serialization failure or
/// a deadlock: this attempt's, retried. A constraint, data or statement error: the
/// event's, dead with the SQLSTATE and the server's message.
fn classify(e: tokio_postgres::Error) -> HandlerError {
    let Some(db) = e.as_db_error() else {
        return HandlerError::unavailable(with_causes(&e));
    };
    let code = db.code();
    let reason = format!("postgres: SQLSTATE {}: {}", code.code(), db.message());
    let class = &code.code()[..2];
    if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED {
        return HandlerError::retryable(reason);
    }
    match class {
        // Connection exceptions, insufficient resources, operator intervention (shutdown, cannot connect now).
        "08" | "53" | "57" | "58" => HandlerError::unavailable(reason),
        // Data, integrity constraints, syntax or access rules, undefined objects: retrying cannot help.
        "22" | "23" | "42" | "44" => HandlerError::Permanent(reason),
        _ => HandlerError::retryable(reason),
    }
}

/// `postgres: ` and the error with its causes: a refused certificate or a refused
/// password is said where the pool only says that it could not connect.
fn with_causes(e: &dyn std::error::Error) -> String {
    format!("postgres: {}", crate::error::with_causes(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Position;

    #[test]
    fn parameters_come_from_the_event_its_payload_and_its_headers() {
        let payload = Payload::Json(serde_json::json!({"a": {"b": 7}, "s": "x", "n": null}).into());
        let mut e = OutboxEvent::new("e1", payload, Position { topic: "t".into(), partition: 2, offset: 9 });
        e.aggregate_id = Some("order-1".into());
        e.headers = vec![
            ("tenant".into(), Some(b"acme".to_vec())),
            ("tenant".into(), Some(b"acme-eu".to_vec())),
            ("empty".into(), None),
        ];
        let v = |p: Param| value(&p, &e);
        assert_eq!(v(Param::Id).as_deref(), Some("e1"));
        assert_eq!(v(Param::AggregateId).as_deref(), Some("order-1"));
        assert_eq!(v(Param::Partition).as_deref(), Some("2"));
        assert_eq!(v(Param::Field("/a/b".into())).as_deref(), Some("7"));
        assert_eq!(v(Param::Field("/s".into())).as_deref(), Some("x"));
        assert_eq!(v(Param::Field("/n".into())), None);
        assert_eq!(v(Param::Header("tenant".into())).as_deref(), Some("acme-eu"), "the last of a repeated header");
        assert_eq!(v(Param::Header("empty".into())), None);
        assert_eq!(v(Param::Header("missing".into())), None);
    }
}
