//! The rest of the real pipeline for the end-to-end tests (the `debezium` tests):
//! PostgreSQL through `psql`, Kafka Connect's REST API, Debezium connector configs
//! derived from `debezium/connector.json`, `scripts/stack kill-connect|start-connect`,
//! and [`Scratch`], which removes the connectors, replication slots, publications and
//! tables a test creates (also when the test fails).
//!
//! Where things are: `OUTBOXD_TEST_PG` (default [`DEFAULT_PG`]), `OUTBOXD_TEST_CONNECT`
//! (default [`DEFAULT_CONNECT`]); the `psql` binary is `OUTBOXD_TEST_PSQL`, else
//! Debian's PostgreSQL 15 client (the one `scripts/stack` uses), else `psql` on the PATH.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use std::collections::{HashMap, HashSet};

use super::{new_event_id, OffsetReader, Outboxd, Receiver};

pub const DEFAULT_PG: &str = "postgresql://postgres@127.0.0.1:15432/outbox";
pub const DEFAULT_CONNECT: &str = "http://127.0.0.1:18083";
/// The connector `scripts/stack up` registers from `debezium/connector.json`.
pub const MAIN_CONNECTOR: &str = "outbox-connector";
/// The table it captures.
pub const MAIN_TABLE: &str = "public.outbox";
/// What to do when the stack is not there.
pub const STACK_HINT: &str = "start the local stack with `scripts/stack up` (or point OUTBOXD_TEST_PG, \
                              OUTBOXD_TEST_CONNECT and OUTBOXD_TEST_BROKERS at a running one)";

/// Bound for one `psql` run or one statement batch of a session.
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for one REST request to Kafka Connect.
const REST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for registering or deleting a connector (Connect answers 409 while it rebalances).
const CONNECTOR_CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for a deleted connector's replication slot to become inactive.
const SLOT_RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for `scripts/stack start-connect` (it waits for the connector itself).
pub const START_CONNECT_TIMEOUT: Duration = Duration::from_secs(240);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| default.to_string())
}

/// A file of this repository.
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn psql_program() -> PathBuf {
    if let Some(p) = std::env::var_os("OUTBOXD_TEST_PSQL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let debian = Path::new("/usr/lib/postgresql/15/bin/psql");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("psql")
    }
}

/// What a bounded command run produced.
#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` with `stdin` as its input, killing it after `timeout`.
pub fn run_bounded(mut cmd: Command, stdin: Option<String>, timeout: Duration) -> Result<RunOutput, String> {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().map_err(|e| format!("spawn {shown}: {e}"))?;
    if let Some(text) = stdin {
        let mut w = child.stdin.take().expect("stdin is piped");
        std::thread::spawn(move || {
            let _ = w.write_all(text.as_bytes());
        });
    }
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("wait for {shown}: {e}")),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{shown} did not finish within {timeout:?} (killed it)"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    Ok(RunOutput {
        status,
        stdout: text(t_out.join().unwrap_or_default()),
        stderr: text(t_err.join().unwrap_or_default()),
    })
}

/// The first `n` characters of `s`, for messages.
pub fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}… ({} characters)", s.chars().take(n).collect::<String>(), s.chars().count())
    }
}

/// An SQL string literal.
pub fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

// ---------------------------------------------------------------- PostgreSQL

/// The stack's PostgreSQL, through `psql`.
#[derive(Clone, Debug)]
pub struct Pg {
    url: String,
}

impl Pg {
    /// Checks that PostgreSQL answers and can feed Debezium; fails the test with
    /// instructions if not.
    pub fn connect() -> Pg {
        let pg = Pg { url: env_or("OUTBOXD_TEST_PG", DEFAULT_PG) };
        match pg.try_query("SHOW wal_level") {
            Ok(level) if level.trim() == "logical" => pg,
            Ok(level) => panic!(
                "PostgreSQL at {} runs with wal_level={}, Debezium needs logical; {STACK_HINT}",
                pg.url,
                level.trim()
            ),
            Err(e) => panic!("PostgreSQL is not reachable at {} ({}); {STACK_HINT}", pg.url, e.trim()),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn args(&self) -> Vec<String> {
        ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", &self.url].iter().map(|s| s.to_string()).collect()
    }

    /// Runs `sql` (any number of statements, each in its own transaction unless the
    /// text says otherwise); returns what psql printed (unaligned, tuples only).
    pub fn try_query(&self, sql: &str) -> Result<String, String> {
        let mut cmd = Command::new(psql_program());
        cmd.args(self.args()).env("PGCONNECT_TIMEOUT", "5").env("PGOPTIONS", "-c client_min_messages=warning");
        let out = run_bounded(cmd, Some(sql.to_string()), PSQL_TIMEOUT)?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(format!("psql exited with {}: {}", out.status, out.stderr.trim()))
        }
    }

    /// Like [`Pg::try_query`], but fails the test on an error.
    pub fn query(&self, sql: &str) -> String {
        self.try_query(sql).unwrap_or_else(|e| panic!("SQL failed: {e}\nSQL: {}", shorten(sql, 2000)))
    }

    /// A long-lived psql process that runs statement batches one after the other and
    /// says when each has finished (for writing many transactions quickly, and for
    /// knowing when a COMMIT was acknowledged).
    pub fn session(&self) -> PgSession {
        let mut cmd = tokio::process::Command::new(psql_program());
        cmd.args(self.args())
            .env("PGCONNECT_TIMEOUT", "5")
            .env("PGOPTIONS", "-c client_min_messages=warning")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", psql_program().display()));
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        PgSession { child, stdin, stdout, marks: 0 }
    }
}

/// See [`Pg::session`].
pub struct PgSession {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    marks: u64,
}

impl PgSession {
    /// Runs `sql` and returns the moment psql reported it done (for a transaction:
    /// just after its COMMIT was acknowledged). Fails the test on an SQL error.
    pub async fn exec(&mut self, sql: &str) -> SystemTime {
        self.marks += 1;
        let mark = format!("outboxd-it-done-{}", self.marks);
        let text = format!("{sql}\n\\echo {mark}\n");
        let stdin = &mut self.stdin;
        let stdout = &mut self.stdout;
        let result = tokio::time::timeout(PSQL_TIMEOUT, async {
            stdin.write_all(text.as_bytes()).await?;
            stdin.flush().await?;
            while let Some(line) = stdout.next_line().await? {
                if line == mark {
                    return Ok(true);
                }
            }
            Ok::<bool, std::io::Error>(false)
        })
        .await;
        match result {
            Ok(Ok(true)) => SystemTime::now(),
            other => {
                let what = match other {
                    Ok(Ok(_)) => "psql exited".to_string(),
                    Ok(Err(e)) => format!("psql i/o failed: {e}"),
                    Err(_) => format!("no answer from psql within {PSQL_TIMEOUT:?}"),
                };
                let _ = self.child.start_kill();
                let mut stderr = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(5), e.read_to_string(&mut stderr)).await;
                }
                panic!("{what}; stderr: {}\nSQL: {}", stderr.trim(), shorten(sql, 2000));
            }
        }
    }

    /// Ends the session (psql exits at the end of its input).
    pub async fn close(mut self) {
        let _ = self.stdin.shutdown().await;
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
        }
    }
}

/// One row of an outbox table (the EventRouter's default columns).
#[derive(Clone, Debug)]
pub struct OutboxRow {
    /// The event id (`id` column, a uuid).
    pub id: String,
    pub aggregatetype: String,
    pub aggregateid: String,
    pub event_type: String,
    pub payload: Value,
}

impl OutboxRow {
    /// A row with a fresh event id.
    pub fn new(aggregatetype: &str, aggregateid: &str, event_type: &str, payload: Value) -> OutboxRow {
        OutboxRow {
            id: new_event_id(),
            aggregatetype: aggregatetype.to_string(),
            aggregateid: aggregateid.to_string(),
            event_type: event_type.to_string(),
            payload,
        }
    }

    /// `(id, aggregatetype, aggregateid, type, payload)` as an SQL tuple.
    pub fn values_sql(&self) -> String {
        format!(
            "({}, {}, {}, {}, {}::jsonb)",
            lit(&self.id),
            lit(&self.aggregatetype),
            lit(&self.aggregateid),
            lit(&self.event_type),
            lit(&serde_json::to_string(&self.payload).expect("serialize payload"))
        )
    }
}

/// One INSERT statement (with `;`) for `rows` into `table`.
pub fn insert_sql(table: &str, rows: &[OutboxRow]) -> String {
    let values: Vec<String> = rows.iter().map(OutboxRow::values_sql).collect();
    format!("INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) VALUES {};", values.join(", "))
}

// ---------------------------------------------------------------- Kafka Connect

/// Kafka Connect's REST API.
#[derive(Clone, Debug)]
pub struct Connect {
    base: String,
    http: reqwest::Client,
}

/// Whether a `/connectors/NAME/status` answer says the connector and all its (at least
/// one) tasks are RUNNING.
pub fn is_running(status: &Value) -> bool {
    let tasks = status["tasks"].as_array().map(Vec::as_slice).unwrap_or_default();
    status["connector"]["state"] == "RUNNING" && !tasks.is_empty() && tasks.iter().all(|t| t["state"] == "RUNNING")
}

/// The trace of a FAILED connector or task, if any.
pub fn failure(status: &Value) -> Option<String> {
    if status["connector"]["state"] == "FAILED" {
        return Some(status["connector"]["trace"].as_str().unwrap_or("(no trace)").to_string());
    }
    status["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["state"] == "FAILED")
        .map(|t| format!("task {}: {}", t["id"], t["trace"].as_str().unwrap_or("(no trace)")))
}

impl Connect {
    fn with_base(base: &str) -> Connect {
        let http = reqwest::Client::builder().timeout(REST_TIMEOUT).build().expect("an HTTP client");
        Connect { base: base.trim_end_matches('/').to_string(), http }
    }

    /// Checks that Connect answers and that [`MAIN_CONNECTOR`] is RUNNING; fails the
    /// test with instructions if not.
    pub async fn connect() -> Connect {
        let c = Connect::with_base(&env_or("OUTBOXD_TEST_CONNECT", DEFAULT_CONNECT));
        match c.http.get(format!("{}/", c.base)).send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => panic!("Kafka Connect at {} answered {}; {STACK_HINT}", c.base, r.status()),
            Err(e) => panic!("Kafka Connect is not reachable at {} ({e}); {STACK_HINT}", c.base),
        }
        match c.status(MAIN_CONNECTOR).await {
            Ok(Some(s)) if is_running(&s) => c,
            Ok(s) => panic!(
                "connector {MAIN_CONNECTOR} is not RUNNING on Kafka Connect at {} (status: {}); {STACK_HINT}",
                c.base,
                s.map_or("not registered".to_string(), |s| s.to_string())
            ),
            Err(e) => panic!("Kafka Connect at {}: {e}; {STACK_HINT}", c.base),
        }
    }

    /// A client of the same Connect that shares nothing with this one (for use on
    /// another Tokio runtime).
    pub fn fresh(&self) -> Connect {
        Connect::with_base(&self.base)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn get_json(&self, path: &str) -> Result<Option<Value>, String> {
        let url = format!("{}{path}", self.base);
        let r = self.http.get(&url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = r.status();
        let text = r.text().await.map_err(|e| format!("GET {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!("GET {url}: {status}: {text}"));
        }
        serde_json::from_str(&text).map(Some).map_err(|e| format!("GET {url}: not JSON ({e}): {text}"))
    }

    /// `GET /connectors/NAME/status`; `None` when there is no such connector.
    pub async fn status(&self, name: &str) -> Result<Option<Value>, String> {
        self.get_json(&format!("/connectors/{name}/status")).await
    }

    /// `GET /connectors/NAME/config`; `None` when there is no such connector.
    pub async fn config(&self, name: &str) -> Result<Option<Value>, String> {
        self.get_json(&format!("/connectors/{name}/config")).await
    }

    /// The registered connectors.
    pub async fn names(&self) -> Result<Vec<String>, String> {
        let v = self.get_json("/connectors").await?.unwrap_or(Value::Array(vec![]));
        Ok(v.as_array().into_iter().flatten().filter_map(|n| n.as_str().map(str::to_string)).collect())
    }

    /// `PUT /connectors/NAME/config`, retried while Connect is busy (409, 5xx).
    pub async fn put_config(&self, name: &str, config: &Value) -> Result<(), String> {
        let url = format!("{}/connectors/{name}/config", self.base);
        let deadline = Instant::now() + CONNECTOR_CHANGE_TIMEOUT;
        loop {
            let last = match self.http.put(&url).json(config).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    if status.is_client_error() && status != reqwest::StatusCode::CONFLICT {
                        return Err(format!("PUT {url}: {status}: {text}"));
                    }
                    format!("{status}: {text}")
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!("PUT {url}: still failing after {CONNECTOR_CHANGE_TIMEOUT:?}: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until the connector and its task are RUNNING; fails the test at once when
    /// one of them FAILED, or after `timeout`.
    pub async fn wait_running(&self, name: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.status(name).await {
                Ok(Some(s)) => {
                    if is_running(&s) {
                        return;
                    }
                    if let Some(trace) = failure(&s) {
                        panic!("connector {name} FAILED: {}", shorten(&trace, 4000));
                    }
                    s.to_string()
                }
                Ok(None) => "not registered".into(),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                panic!("connector {name} not RUNNING after {timeout:?}; last status: {last}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `DELETE /connectors/NAME` (retried while Connect is busy), then waits until
    /// Connect no longer knows it. A missing connector is fine.
    pub async fn delete(&self, name: &str) -> Result<(), String> {
        let url = format!("{}/connectors/{name}", self.base);
        let deadline = Instant::now() + CONNECTOR_CHANGE_TIMEOUT;
        loop {
            let last = match self.http.delete(&url).send().await {
                Ok(r) if r.status().is_success() || r.status() == reqwest::StatusCode::NOT_FOUND => {
                    match self.config(name).await {
                        Ok(None) => return Ok(()),
                        Ok(Some(_)) => "still registered".to_string(),
                        Err(e) => e,
                    }
                }
                Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!("DELETE {url}: not gone after {CONNECTOR_CHANGE_TIMEOUT:?}: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// `debezium/connector.json` (the configuration users deploy) adapted to capture
/// `public.<table>` through `publication` and `slot` as connector `name`, with the
/// database from `OUTBOXD_TEST_PG` and a topic prefix of its own; `overrides` are
/// applied last.
pub fn connector_config(
    pg: &Pg,
    name: &str,
    table: &str,
    publication: &str,
    slot: &str,
    overrides: &[(&str, &str)],
) -> Value {
    let path = repo_path("debezium/connector.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read debezium/connector.json: {e}"));
    let mut c: Map<String, Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("debezium/connector.json is not a JSON object: {e}"));
    let url = url::Url::parse(pg.url()).unwrap_or_else(|e| panic!("OUTBOXD_TEST_PG={:?} is not a URL: {e}", pg.url()));
    let user = if url.username().is_empty() { "postgres" } else { url.username() };
    let mut set = |k: &str, v: &str| {
        c.insert(k.to_string(), Value::String(v.to_string()));
    };
    set("name", name);
    set("database.hostname", url.host_str().unwrap_or("127.0.0.1"));
    set("database.port", &url.port().unwrap_or(5432).to_string());
    set("database.user", user);
    set("database.dbname", url.path().trim_start_matches('/'));
    set("publication.name", publication);
    set("slot.name", slot);
    set("table.include.list", &format!("public.{table}"));
    set("topic.prefix", name);
    for (k, v) in overrides {
        set(k, v);
    }
    Value::Object(c)
}

// ---------------------------------------------------------------- scratch objects

static SCRATCH_COUNTER: AtomicU32 = AtomicU32::new(0);
const SQL_PREFIX: &str = "outboxd_it_";
const CONNECTOR_PREFIX: &str = "outboxd-it-";

/// Connectors, replication slots, publications and tables one test creates; all are
/// removed by [`Scratch::cleanup`] or, if the test fails before that, when the
/// `Scratch` is dropped. Names carry the test process id, so that [`sweep_leftovers`]
/// can remove what a killed test process left behind.
pub struct Scratch {
    pg: Pg,
    connect: Connect,
    /// `outboxd_it_<pid>_<n>_<random>`
    prefix: String,
    connectors: Vec<String>,
    slots: Vec<String>,
    publications: Vec<String>,
    tables: Vec<String>,
    clean: bool,
}

impl Scratch {
    pub fn new(pg: &Pg, connect: &Connect) -> Scratch {
        let n = SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed);
        let r: u32 = rand::random();
        Scratch {
            pg: pg.clone(),
            connect: connect.clone(),
            prefix: format!("{SQL_PREFIX}{}_{n}_{r:08x}", std::process::id()),
            connectors: Vec::new(),
            slots: Vec::new(),
            publications: Vec::new(),
            tables: Vec::new(),
            clean: true,
        }
    }

    /// A unique table, publication or slot name (lower case, at most 63 bytes).
    pub fn sql_name(&self, what: &str) -> String {
        let name = format!("{}_{what}", self.prefix);
        assert!(name.len() <= 63, "name too long for PostgreSQL: {name}");
        name
    }

    /// A unique connector name.
    pub fn connector_name(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix.replace('_', "-"))
    }

    /// Creates a table in the outbox shape (as in `debezium/outbox.sql`) and a
    /// publication for it; returns (table, publication).
    pub fn create_outbox_table(&mut self, what: &str) -> (String, String) {
        let table = self.sql_name(what);
        let publication = self.sql_name(&format!("{what}_pub"));
        self.clean = false;
        self.tables.push(table.clone());
        self.pg.query(&format!(
            "CREATE TABLE public.{table} (
                 id            uuid         PRIMARY KEY,
                 aggregatetype varchar(255) NOT NULL,
                 aggregateid   varchar(255) NOT NULL,
                 type          varchar(255) NOT NULL,
                 payload       jsonb,
                 created_at    timestamptz  DEFAULT now());"
        ));
        self.publications.push(publication.clone());
        self.pg.query(&format!("CREATE PUBLICATION {publication} FOR TABLE public.{table};"));
        (table, publication)
    }

    /// Registers connector `name` (its `slot.name` is recorded for clean-up too) and
    /// waits until it and its task are RUNNING and its replication slot is active,
    /// i.e. every change committed from now on will be streamed.
    pub async fn start_connector(&mut self, name: &str, config: &Value, timeout: Duration) {
        let slot = config["slot.name"].as_str().expect("slot.name in the connector config").to_string();
        self.clean = false;
        self.connectors.push(name.to_string());
        self.slots.push(slot.clone());
        self.connect.put_config(name, config).await.unwrap_or_else(|e| panic!("register connector {name}: {e}"));
        self.connect.wait_running(name, timeout).await;
        let deadline = Instant::now() + timeout;
        loop {
            let active =
                self.pg.query(&format!("SELECT active FROM pg_replication_slots WHERE slot_name = {}", lit(&slot)));
            if active.trim() == "t" {
                return;
            }
            if Instant::now() >= deadline {
                panic!("replication slot {slot} of connector {name} not active after {timeout:?} (got {active:?})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes connector `name`, waits until it is gone, then drops its slot.
    pub async fn remove_connector(&mut self, name: &str) -> Result<(), String> {
        let slot = self
            .connect
            .config(name)
            .await?
            .and_then(|c| c["slot.name"].as_str().map(str::to_string))
            .ok_or_else(|| format!("connector {name} is not registered"))?;
        self.connect.delete(name).await?;
        self.connectors.retain(|c| c != name);
        drop_slot(&self.pg, &slot).await?;
        self.slots.retain(|s| *s != slot);
        Ok(())
    }

    /// Removes everything recorded, in order: connectors (waiting until gone), their
    /// slots (once inactive), publications, tables.
    pub async fn cleanup(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        for name in std::mem::take(&mut self.connectors) {
            if let Err(e) = self.connect.delete(&name).await {
                errors.push(format!("connector {name}: {e}"));
            }
        }
        for slot in std::mem::take(&mut self.slots) {
            if let Err(e) = drop_slot(&self.pg, &slot).await {
                errors.push(format!("slot {slot}: {e}"));
            }
        }
        for publication in std::mem::take(&mut self.publications) {
            if let Err(e) = self.pg.try_query(&format!("DROP PUBLICATION IF EXISTS {publication};")) {
                errors.push(format!("publication {publication}: {e}"));
            }
        }
        for table in std::mem::take(&mut self.tables) {
            if let Err(e) = self.pg.try_query(&format!("DROP TABLE IF EXISTS public.{table};")) {
                errors.push(format!("table {table}: {e}"));
            }
        }
        self.clean = true;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.clean {
            return;
        }
        // Usually reached while a failed test unwinds, inside its Tokio runtime: clean
        // up on a thread and runtime of our own, with a client of our own.
        let mut scratch = Scratch {
            pg: self.pg.clone(),
            connect: self.connect.fresh(),
            prefix: self.prefix.clone(),
            connectors: std::mem::take(&mut self.connectors),
            slots: std::mem::take(&mut self.slots),
            publications: std::mem::take(&mut self.publications),
            tables: std::mem::take(&mut self.tables),
            clean: true,
        };
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            rt.block_on(scratch.cleanup())
        })
        .join();
        match done {
            Ok(Ok(())) => eprintln!("scratch objects of {} removed", self.prefix),
            Ok(Err(e)) => eprintln!("clean-up of {} incomplete: {e}", self.prefix),
            Err(_) => eprintln!("clean-up of {} panicked", self.prefix),
        }
    }
}

/// Drops replication slot `slot` once no connector streams from it any more
/// (terminating a walsender that lingers past [`SLOT_RELEASE_TIMEOUT`]). A missing
/// slot is fine.
pub async fn drop_slot(pg: &Pg, slot: &str) -> Result<(), String> {
    let deadline = Instant::now() + SLOT_RELEASE_TIMEOUT;
    let mut terminated = false;
    loop {
        let row = pg.try_query(&format!(
            "SELECT active, coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = {}",
            lit(slot)
        ))?;
        let row = row.trim();
        if row.is_empty() {
            return Ok(());
        }
        let (active, pid) = row.split_once('|').unwrap_or((row, "0"));
        if active == "f" {
            match pg.try_query(&format!("SELECT pg_drop_replication_slot({});", lit(slot))) {
                Ok(_) => return Ok(()),
                // It became active again in between, or vanished: look again.
                Err(e) if e.contains("is active") || e.contains("does not exist") => {}
                Err(e) => return Err(e),
            }
        } else if Instant::now() >= deadline {
            if terminated {
                return Err(format!("still active (pid {pid}) after {SLOT_RELEASE_TIMEOUT:?} and a terminate"));
            }
            eprintln!("slot {slot} still active after {SLOT_RELEASE_TIMEOUT:?}: terminating its walsender (pid {pid})");
            pg.try_query(&format!("SELECT pg_terminate_backend({pid});"))?;
            terminated = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether process `pid` lives (Linux /proc). Elsewhere every process counts as alive,
/// so nothing is swept.
fn pid_alive(pid: u32) -> bool {
    !cfg!(target_os = "linux") || Path::new(&format!("/proc/{pid}")).exists()
}

/// The process id in a scratch name (`outboxd_it_<pid>_…` / `outboxd-it-<pid>-…`).
fn scratch_pid(name: &str, prefix: &str, sep: char) -> Option<u32> {
    name.strip_prefix(prefix)?.split(sep).next()?.parse().ok()
}

/// Once per test process: removes scratch connectors, slots, publications and tables
/// that test processes which no longer run left behind (killed before their clean-up).
pub async fn sweep_leftovers(pg: &Pg, connect: &Connect) {
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if SWEPT.swap(true, Ordering::SeqCst) {
        return;
    }
    let dead = |name: &str, prefix: &str, sep: char| scratch_pid(name, prefix, sep).is_some_and(|p| !pid_alive(p));
    let mut removed = Vec::new();
    for name in connect.names().await.unwrap_or_default() {
        if dead(&name, CONNECTOR_PREFIX, '-') {
            match connect.delete(&name).await {
                Ok(()) => removed.push(format!("connector {name}")),
                Err(e) => eprintln!("could not remove leftover connector {name}: {e}"),
            }
        }
    }
    let list = |sql: &str| -> Vec<String> {
        pg.query(sql).lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
    };
    let like = format!("'{}%'", SQL_PREFIX.replace('_', "\\_"));
    for slot in list(&format!("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE {like}")) {
        if dead(&slot, SQL_PREFIX, '_') {
            match drop_slot(pg, &slot).await {
                Ok(()) => removed.push(format!("slot {slot}")),
                Err(e) => eprintln!("could not drop leftover slot {slot}: {e}"),
            }
        }
    }
    for publication in list(&format!("SELECT pubname FROM pg_publication WHERE pubname LIKE {like}")) {
        if dead(&publication, SQL_PREFIX, '_') {
            pg.query(&format!("DROP PUBLICATION IF EXISTS {publication};"));
            removed.push(format!("publication {publication}"));
        }
    }
    for table in list(&format!("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE {like}"))
    {
        if dead(&table, SQL_PREFIX, '_') {
            pg.query(&format!("DROP TABLE IF EXISTS public.{table};"));
            removed.push(format!("table {table}"));
        }
    }
    if !removed.is_empty() {
        eprintln!("removed leftovers of earlier test processes: {}", removed.join(", "));
    }
}

// ---------------------------------------------------------------- scripts/stack

/// Runs `scripts/stack ARGS` (bounded); returns its stderr (the script logs there).
/// Fails the test when it fails.
pub fn stack_script(args: &[&str], timeout: Duration) -> String {
    let mut cmd = Command::new(repo_path("scripts/stack"));
    cmd.args(args);
    match run_bounded(cmd, None, timeout) {
        Ok(out) if out.status.success() => out.stderr,
        Ok(out) => panic!(
            "`scripts/stack {}` failed with {}\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            out.stdout.trim(),
            out.stderr.trim()
        ),
        Err(e) => panic!("`scripts/stack {}`: {e}", args.join(" ")),
    }
}

/// SIGKILLs and restarts Kafka Connect through `scripts/stack` (the local stack
/// only). If the test fails between the two, dropping this restarts Connect, so that
/// the stack is left with Connect and [`MAIN_CONNECTOR`] running.
#[derive(Default)]
pub struct ConnectCrash {
    down: bool,
}

impl ConnectCrash {
    /// `scripts/stack kill-connect`
    pub fn kill(&mut self) {
        self.down = true;
        stack_script(&["kill-connect"], Duration::from_secs(60));
    }

    /// `scripts/stack start-connect` (waits until the connector runs); returns how long
    /// that took.
    pub fn start(&mut self) -> Duration {
        let t0 = Instant::now();
        stack_script(&["start-connect"], START_CONNECT_TIMEOUT);
        self.down = false;
        t0.elapsed()
    }
}

impl Drop for ConnectCrash {
    fn drop(&mut self) {
        if !self.down {
            return;
        }
        eprintln!("Kafka Connect was left killed: restarting it (scripts/stack start-connect)");
        let mut cmd = Command::new(repo_path("scripts/stack"));
        cmd.arg("start-connect");
        match run_bounded(cmd, None, START_CONNECT_TIMEOUT) {
            Ok(out) if out.status.success() => eprintln!("Kafka Connect restarted"),
            Ok(out) => eprintln!("scripts/stack start-connect failed with {}: {}", out.status, out.stderr.trim()),
            Err(e) => eprintln!("scripts/stack start-connect: {e}"),
        }
    }
}

// ---------------------------------------------------------------- one test process at a time

/// Default loopback port held by the test process whose turn it is (see [`StackTurn`]).
pub const TURN_PORT: u16 = 18089;

/// The stack (one Kafka Connect worker, fixed ports) is shared by every test process on
/// the machine, e.g. two `cargo test` runs from two work trees. While a process holds
/// this, it owns the stack's Connect worker: it is a listening socket on 127.0.0.1 port
/// `OUTBOXD_TEST_TURN_PORT` (default [`TURN_PORT`]), which the operating system frees
/// when the process ends, however it ends.
pub struct StackTurn {
    _listener: std::net::TcpListener,
}

impl StackTurn {
    /// Waits (up to `timeout`) until no other test process holds the turn.
    pub async fn take(timeout: Duration) -> StackTurn {
        let port: u16 = env_or("OUTBOXD_TEST_TURN_PORT", &TURN_PORT.to_string())
            .parse()
            .unwrap_or_else(|e| panic!("OUTBOXD_TEST_TURN_PORT: {e}"));
        let deadline = Instant::now() + timeout;
        let mut said = false;
        loop {
            match std::net::TcpListener::bind(("127.0.0.1", port)) {
                Ok(listener) => return StackTurn { _listener: listener },
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    if !said {
                        eprintln!(
                            "127.0.0.1:{port} is taken: waiting for another test process to finish with the stack"
                        );
                        said = true;
                    }
                    if Instant::now() >= deadline {
                        panic!(
                            "127.0.0.1:{port} stayed taken for {timeout:?}: another test process is using the stack's \
                             Kafka Connect (or something else uses the port: set OUTBOXD_TEST_TURN_PORT)"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("bind 127.0.0.1:{port} (the test processes' turn): {e}"),
            }
        }
    }
}

// ---------------------------------------------------------------- assertions shared by the debezium and avro tests

/// A topic named as Debezium's EventRouter routes `aggregatetype` by default.
pub fn outbox_topic(aggregatetype: &str) -> String {
    format!("outbox.event.{aggregatetype}")
}

pub fn ids(rows: &[OutboxRow]) -> Vec<String> {
    rows.iter().map(|r| r.id.clone()).collect()
}

/// Waits until the receiver answered every event of `rows` with 2xx; fails at once when
/// outboxd exits or `connector` (which feeds the topic) FAILED.
pub async fn wait_all_answered(
    od: &mut Outboxd,
    receiver: &Receiver,
    rows: &[OutboxRow],
    timeout: Duration,
    connect: &Connect,
    connector: &str,
) {
    let ids = ids(rows);
    let deadline = Instant::now() + timeout;
    let mut next_look = Instant::now();
    loop {
        let n = receiver.count_answered_ok(&ids);
        if n == ids.len() {
            return;
        }
        od.assert_alive();
        if Instant::now() >= next_look {
            next_look = Instant::now() + Duration::from_secs(1);
            assert_connector_alive(connect, connector, &format!("the receiver had answered {n} of {}", ids.len()))
                .await;
        }
        if Instant::now() >= deadline {
            let missing: Vec<&String> = ids.iter().filter(|id| !receiver.answered(id)).take(10).collect();
            panic!(
                "after {timeout:?} the receiver has answered {n} of {} events; not answered e.g.: {missing:?}",
                ids.len()
            );
        }
        tokio::time::sleep(super::POLL_EVERY).await;
    }
}

pub async fn assert_connector_alive(connect: &Connect, connector: &str, when: &str) {
    if let Ok(Some(status)) = connect.status(connector).await {
        if let Some(trace) = failure(&status) {
            panic!("connector {connector} FAILED while {when}: {}", shorten(&trace, 4000));
        }
    }
}

pub async fn wait_committed_to_end(od: &mut Outboxd, offsets: &OffsetReader, timeout: Duration) {
    od.wait_until(format!("outboxd's committed offsets to reach the end of {}", offsets.topic), timeout, || {
        offsets.reached_end()
    })
    .await;
}

/// Every event of `rows` reached the receiver exactly once, and nothing else did.
pub fn assert_each_called_once(receiver: &Receiver, rows: &[OutboxRow]) {
    let calls = receiver.calls();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for c in &calls {
        *per_id.entry(c.event_id.as_deref().unwrap_or("<no Idempotency-Key>")).or_default() += 1;
    }
    let wrong: Vec<(&str, usize)> = rows
        .iter()
        .map(|r| (r.id.as_str(), per_id.get(r.id.as_str()).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "each event must reach the receiver exactly once; {} did not, e.g. (event id, calls): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    let expected: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let unexpected: Vec<&str> = per_id.keys().copied().filter(|id| !expected.contains(id)).collect();
    assert!(unexpected.is_empty(), "calls for events that were never committed: {unexpected:?}");
    assert_eq!(calls.len(), rows.len(), "one call per event");
}
