//! The Avro side of the real pipeline (the `avro` tests): the stack's schema registry
//! (Apicurio Registry, whose Confluent-compatible API lives under `/apis/ccompat/v7`),
//! Confluent's `AvroConverter` on Kafka Connect, the Confluent wire format as it lies in
//! Kafka, and [`RegistryOutage`], which stops and restarts the registry through
//! `scripts/stack` (and restarts it if a test fails while it is down).
//!
//! Where the registry is: `OUTBOXD_TEST_REGISTRY` (default [`DEFAULT_REGISTRY`]), the
//! base URL of its Confluent API, which is what both Connect's
//! `value.converter.schema.registry.url` and outboxd's `schema_registry.url` take.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::debezium::{stack_script, Connect};
use super::turns;

/// The Confluent API of the stack's registry (`scripts/stack up registry`).
pub const DEFAULT_REGISTRY: &str = "http://127.0.0.1:18081/apis/ccompat/v7";
/// Confluent's converter, as a connector names it.
pub const AVRO_CONVERTER: &str = "io.confluent.connect.avro.AvroConverter";
/// The Confluent wire format's first byte.
pub const MAGIC_BYTE: u8 = 0;
/// Bound for one request to the registry.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound for `scripts/stack up|down registry` (a cold `up` downloads ~140 MB first).
const REGISTRY_SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

const HINT: &str = "start the local stack with `scripts/stack up` (or `scripts/stack up registry`), or point \
                    OUTBOXD_TEST_REGISTRY at the base URL of a Confluent-compatible schema registry";

/// The registry's URL from the environment.
pub fn registry_url() -> String {
    std::env::var("OUTBOXD_TEST_REGISTRY")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_REGISTRY.to_string())
        .trim_end_matches('/')
        .to_string()
}

/// The schema registry's Confluent API.
#[derive(Clone, Debug)]
pub struct Registry {
    base: String,
    http: reqwest::Client,
}

impl Registry {
    /// Checks that the registry answers `GET /subjects`; fails the test with
    /// instructions if not.
    pub async fn connect() -> Registry {
        let base = registry_url();
        let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("an HTTP client");
        let r = Registry { base, http };
        match r.http.get(format!("{}/subjects", r.base)).send().await {
            Ok(resp) if resp.status().is_success() => r,
            Ok(resp) => {
                panic!("the schema registry at {} answered GET /subjects with {}; {HINT}", r.base, resp.status())
            }
            Err(e) => panic!("the schema registry is not reachable at {} ({e}); {HINT}", r.base),
        }
    }

    /// The base URL (what clients are configured with).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// `GET /schemas/ids/{id}`: the answer, `None` on 404.
    pub async fn schema_by_id(&self, id: u32) -> Result<Option<Value>, String> {
        let url = format!("{}/schemas/ids/{id}", self.base);
        let resp = self.http.get(&url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = resp.status();
        let text = resp.text().await.map_err(|e| format!("GET {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!("GET {url}: {status}: {text}"));
        }
        serde_json::from_str(&text).map(Some).map_err(|e| format!("GET {url}: not JSON ({e}): {text}"))
    }

    /// The Avro schema with id `id`, parsed (the registry hands it out as JSON text in
    /// `schema`); fails the test when the registry does not know it.
    pub async fn avro_schema(&self, id: u32) -> Value {
        let answer = self
            .schema_by_id(id)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the registry at {} does not know schema id {id}", self.base));
        let text = answer["schema"].as_str().unwrap_or_else(|| panic!("no `schema` text in {answer}"));
        serde_json::from_str(text).unwrap_or_else(|e| panic!("schema {id} is not JSON ({e}): {text}"))
    }

    /// `GET /subjects/{subject}/versions/latest`, `None` on 404.
    pub async fn latest(&self, subject: &str) -> Result<Option<Value>, String> {
        let url = format!("{}/subjects/{subject}/versions/latest", self.base);
        let resp = self.http.get(&url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = resp.status();
        let text = resp.text().await.map_err(|e| format!("GET {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!("GET {url}: {status}: {text}"));
        }
        serde_json::from_str(&text).map(Some).map_err(|e| format!("GET {url}: not JSON ({e}): {text}"))
    }

    /// `POST /subjects/{subject}/versions`: registers the Avro schema `schema` (its
    /// JSON text) under `subject`; returns its id. Fails the test on an error.
    pub async fn register(&self, subject: &str, schema: &str) -> u32 {
        let url = format!("{}/subjects/{subject}/versions", self.base);
        let resp = self
            .http
            .post(&url)
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .json(&serde_json::json!({ "schema": schema }))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
        assert!(status.is_success(), "POST {url}: {status}: {text}");
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {url}: {e}: {text}"));
        answer["id"].as_u64().and_then(|id| u32::try_from(id).ok()).unwrap_or_else(|| panic!("no id in {text}"))
    }

    /// Deletes `subject` for good (soft, then permanent delete), so a test leaves the
    /// registry as it found it. Errors are ignored: there is nothing left to clean.
    pub async fn delete_subject(&self, subject: &str) {
        for suffix in ["", "?permanent=true"] {
            let _ = self.http.delete(format!("{}/subjects/{subject}{suffix}", self.base)).send().await;
        }
    }
}

/// Fails the test unless Kafka Connect has Confluent's AvroConverter on its plugin path
/// (a worker started before `scripts/stack` provisioned it must be restarted).
pub async fn assert_connect_has_avro_converter(connect: &Connect) {
    let url = format!("{}/connector-plugins?connectorsOnly=false", connect.base());
    let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("an HTTP client");
    let plugins: Value = match http.get(&url).send().await {
        Ok(r) if r.status().is_success() => r.json().await.unwrap_or_else(|e| panic!("GET {url}: {e}")),
        Ok(r) => panic!("GET {url}: {}", r.status()),
        Err(e) => panic!("GET {url}: {e}"),
    };
    let found = plugins.as_array().into_iter().flatten().any(|p| p["class"] == AVRO_CONVERTER);
    assert!(
        found,
        "Kafka Connect at {} has no {AVRO_CONVERTER} among its plugins: it was started before `scripts/stack` \
         put the converter on its plugin path; restart it with `scripts/stack down connect && scripts/stack up`",
        connect.base()
    );
}

/// Connector settings that write values (and, with `keys`, keys too) with Confluent's
/// AvroConverter through `registry`.
pub fn avro_converter_overrides(registry: &str, keys: bool) -> Vec<(String, String)> {
    let mut v = vec![
        ("value.converter".to_string(), AVRO_CONVERTER.to_string()),
        ("value.converter.schema.registry.url".to_string(), registry.to_string()),
    ];
    if keys {
        v.push(("key.converter".to_string(), AVRO_CONVERTER.to_string()));
        v.push(("key.converter.schema.registry.url".to_string(), registry.to_string()));
    }
    v
}

/// The top-level `[schema_registry]` table of outboxd's config.
pub fn schema_registry_toml(url: &str, timeout: &str) -> String {
    format!("\n[schema_registry]\nurl = {}\ntimeout = {}\n", quote(url), quote(timeout))
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

// ---------------------------------------------------------------- the wire format

/// What Debezium's AvroConverter writes for the outbox `payload` (jsonb) column.
pub const PAYLOAD_SCHEMA: &str = r#"{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}"#;

/// The start of a Confluent-framed message part: the magic byte and the schema id.
pub fn frame_header(id: u32) -> Vec<u8> {
    let mut out = vec![MAGIC_BYTE];
    out.extend_from_slice(&id.to_be_bytes());
    out
}

/// `value` as an Avro datum of `schema`, framed with schema id `id`.
pub fn framed(id: u32, schema: &apache_avro::Schema, value: apache_avro::types::Value) -> Vec<u8> {
    let mut out = frame_header(id);
    out.extend(apache_avro::to_avro_datum(schema, value).expect("encode an Avro datum"));
    out
}

/// Splits a Confluent-framed message part into (schema id, Avro datum); `None` when it
/// does not start with the magic byte and a 4-byte id.
pub fn confluent_frame(bytes: &[u8]) -> Option<(u32, &[u8])> {
    match bytes {
        [MAGIC_BYTE, a, b, c, d, rest @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        _ => None,
    }
}

/// Reads an Avro `long`/`int` (zig-zag varint) from the front of `bytes`; returns it and
/// the rest.
pub fn avro_long(bytes: &[u8]) -> Result<(i64, &[u8]), String> {
    let mut value: u64 = 0;
    for (i, b) in bytes.iter().enumerate() {
        if i >= 10 {
            break;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let decoded = ((value >> 1) as i64) ^ -((value & 1) as i64);
            return Ok((decoded, &bytes[i + 1..]));
        }
    }
    Err(format!("no Avro varint at the start of {bytes:02x?}"))
}

/// Reads an Avro `string` from the front of `bytes`; returns it and the rest.
pub fn avro_string(bytes: &[u8]) -> Result<(String, &[u8]), String> {
    let (len, rest) = avro_long(bytes)?;
    let len = usize::try_from(len).map_err(|_| format!("negative string length {len}"))?;
    if rest.len() < len {
        return Err(format!("string of {len} bytes, only {} left", rest.len()));
    }
    let text = std::str::from_utf8(&rest[..len]).map_err(|e| format!("string is not UTF-8: {e}"))?;
    Ok((text.to_string(), &rest[len..]))
}

/// Decodes a datum of the union `["null", "string"]` (what the AvroConverter writes for
/// an optional string such as the outbox's `payload` column) completely.
pub fn avro_optional_string(datum: &[u8]) -> Result<Option<String>, String> {
    let (branch, rest) = avro_long(datum)?;
    let (value, rest) = match branch {
        0 => (None, rest),
        1 => {
            let (s, rest) = avro_string(rest)?;
            (Some(s), rest)
        }
        b => return Err(format!("union branch {b} in a [null, string] union")),
    };
    if !rest.is_empty() {
        return Err(format!("{} bytes after the datum", rest.len()));
    }
    Ok(value)
}

/// Decodes a datum of schema `"string"` completely.
pub fn avro_plain_string(datum: &[u8]) -> Result<String, String> {
    let (s, rest) = avro_string(datum)?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the datum", rest.len()));
    }
    Ok(s)
}

/// Whether `schema` (parsed Avro schema JSON) is, or is a union with, a string carrying
/// `connect.name` = `io.debezium.data.Json`.
pub fn is_debezium_json_string(schema: &Value) -> bool {
    let is_json = |s: &Value| s["type"] == "string" && s["connect.name"] == "io.debezium.data.Json";
    match schema {
        Value::Array(branches) => branches.iter().any(is_json),
        s => is_json(s),
    }
}

// ---------------------------------------------------------------- registry outage

/// Stops the stack's registry (`scripts/stack down registry`: SIGTERM to the PID it
/// recorded) and starts it again (`scripts/stack up registry`, which waits until it
/// answers). If the test fails while the registry is down, dropping this starts it
/// again, so that the stack is left with the registry running.
/// While it is down, this holds [`turns::REGISTRY`] for writing, so tests that need the
/// registry wait.
#[derive(Default)]
pub struct RegistryOutage {
    down: bool,
    turn: Option<tokio::sync::RwLockWriteGuard<'static, ()>>,
}

impl RegistryOutage {
    /// Waits until no other test uses the registry, then stops it; returns how long the
    /// stop took.
    pub async fn stop(&mut self) -> Duration {
        self.turn = Some(turns::REGISTRY.write().await);
        let t0 = Instant::now();
        self.down = true;
        stack_script(&["down", "registry"], REGISTRY_SCRIPT_TIMEOUT);
        t0.elapsed()
    }

    /// Starts the registry and waits until it answers; returns how long that took.
    pub fn start(&mut self) -> Duration {
        let t0 = Instant::now();
        stack_script(&["up", "registry"], REGISTRY_SCRIPT_TIMEOUT);
        self.down = false;
        self.turn = None;
        t0.elapsed()
    }
}

impl Drop for RegistryOutage {
    // The turn (a field) is given back after this body, with the registry up again.
    fn drop(&mut self) {
        if !self.down {
            return;
        }
        eprintln!("the schema registry was left stopped: starting it again (scripts/stack up registry)");
        let mut cmd = std::process::Command::new(super::debezium::repo_path("scripts/stack"));
        cmd.args(["up", "registry"]);
        match super::debezium::run_bounded(cmd, None, REGISTRY_SCRIPT_TIMEOUT) {
            Ok(out) if out.status.success() => eprintln!("schema registry started"),
            Ok(out) => eprintln!("scripts/stack up registry failed with {}: {}", out.status, out.stderr.trim()),
            Err(e) => eprintln!("scripts/stack up registry: {e}"),
        }
    }
}
