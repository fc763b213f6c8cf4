//! Kafka Connect's REST API, and Debezium connector configs derived from
//! `debezium/connector.json`.

use super::*;

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
        // Ok ends the retries: the change was taken, or refused for good.
        let put = keep_looking(CONNECTOR_CHANGE_TIMEOUT, Duration::from_millis(500), async || {
            match self.http.put(&url).json(config).send().await {
                Ok(r) if r.status().is_success() => Ok(Ok(())),
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    if status.is_client_error() && status != reqwest::StatusCode::CONFLICT {
                        return Ok(Err(format!("PUT {url}: {status}: {text}")));
                    }
                    Err(format!("{status}: {text}"))
                }
                Err(e) => Err(e.to_string()),
            }
        });
        put.await
            .unwrap_or_else(|last| Err(format!("PUT {url}: still failing after {CONNECTOR_CHANGE_TIMEOUT:?}: {last}")))
    }

    /// Waits until the connector and its task are RUNNING; fails the test at once when
    /// one of them FAILED, or after `timeout`.
    pub async fn wait_running(&self, name: &str, timeout: Duration) {
        wait_for(format!("connector {name} to be RUNNING"), timeout, async || match self.status(name).await {
            Ok(Some(s)) if is_running(&s) => Ok(()),
            Ok(Some(s)) => {
                if let Some(trace) = failure(&s) {
                    panic!("connector {name} FAILED: {}", shorten(&trace, 4000));
                }
                Err(format!("status {s}"))
            }
            Ok(None) => Err("not registered".to_string()),
            Err(e) => Err(e),
        })
        .await;
    }

    /// `DELETE /connectors/NAME` (retried while Connect is busy), then waits until
    /// Connect no longer knows it. A missing connector is fine.
    pub async fn delete(&self, name: &str) -> Result<(), String> {
        let url = format!("{}/connectors/{name}", self.base);
        let gone = keep_looking(CONNECTOR_CHANGE_TIMEOUT, Duration::from_millis(300), async || {
            match self.http.delete(&url).send().await {
                Ok(r) if r.status().is_success() || r.status() == reqwest::StatusCode::NOT_FOUND => {
                    match self.config(name).await {
                        Ok(None) => Ok(()),
                        Ok(Some(_)) => Err("still registered".to_string()),
                        Err(e) => Err(e),
                    }
                }
                Ok(r) => Err(format!("{}: {}", r.status(), r.text().await.unwrap_or_default())),
                Err(e) => Err(e.to_string()),
            }
        });
        gone.await.map_err(|last| format!("DELETE {url}: not gone after {CONNECTOR_CHANGE_TIMEOUT:?}: {last}"))
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
