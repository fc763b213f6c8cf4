//! The stack's PostgreSQL through `psql`: one-off queries, long-lived sessions, and
//! outbox rows.

use super::*;

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
