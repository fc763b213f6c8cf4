//! Writer schemas by id: memory first (ids are immutable), then the disk cache
//! (so a restart with the registry down still decodes known ids), then local
//! `<id>.avsc` files or the registry's `GET /schemas/ids/{id}` (with
//! references resolved through `GET /subjects/{s}/versions/{v}`).
//!
//! A schema id from the registry is used only for a topic it is registered for:
//! `GET /schemas/ids/{id}/versions` must list `<topic>-value` (or `<topic>-key`
//! for keys; TopicNameStrategy), or `<topic>-<record name>`
//! (TopicRecordNameStrategy). Otherwise any producer could make outboxd read a
//! topic with another topic's schema. A registry without that endpoint (404)
//! cannot say: then every id is accepted and that is logged once.
//! `check_subjects = false` turns the check off (RecordNameStrategy). The
//! subjects are cached on disk next to the schema, as `<id>.subjects`.
//!
//! Failures of the registry: unreachable, 5xx and 429 are
//! [`AvroError::Unavailable`]; 401/403, another unexpected status, or an answer
//! that is not a registry's are [`AvroError::Registry`], which need an operator.
//! Both make the event wait rather than be dead-lettered: the event is fine, the
//! setup is not. No error or log shows the credentials of the registry URL.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{AvroError, ParsedSchema, Part, RegistryFault};

/// Schemas held in memory; far above what a pipeline uses (one per table version).
const MAX_CACHED: usize = 10_000;
/// Nesting of schema references followed before giving up (cycles, misconfiguration).
const MAX_REFERENCE_DEPTH: usize = 16;
/// Largest registry answer read: a schema of thousands of fields is a few hundred
/// KiB; anything far bigger is not a registry's answer.
const MAX_ANSWER_BYTES: usize = 8 << 20;

pub use crate::config::RegistryOptions;

/// What the disk cache keeps: the schema text and its references' texts.
#[derive(Serialize, Deserialize)]
struct CachedSchema {
    schema: String,
    references: Vec<String>,
}

#[derive(Deserialize)]
struct SchemaResponse {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
}

#[derive(Deserialize)]
struct Reference {
    subject: String,
    version: i64,
}

/// One entry of `GET /schemas/ids/{id}/versions`.
#[derive(Deserialize)]
struct SubjectVersion {
    subject: String,
}

/// What is known of the subjects a schema id is registered under.
#[derive(Debug, Clone)]
enum Subjects {
    /// Nothing to check: a local `<id>.avsc` file, or `check_subjects = false`.
    Unchecked,
    /// The registry cannot list them.
    Unknown,
    Known(Vec<String>),
}

/// A parsed schema and what it may be used for.
#[derive(Debug, Clone)]
struct Entry {
    parsed: Arc<ParsedSchema>,
    subjects: Subjects,
}

/// Why a registry client could not be set up ([`Registry::new`]).
#[derive(Debug, thiserror::Error)]
pub enum RegistrySetupError {
    /// `schema_registry.ca_file` could not be read.
    #[error("schema_registry.ca_file {}: {error}", path.display())]
    CaFile {
        /// The file as configured.
        path: PathBuf,
        /// What the read said.
        error: std::io::Error,
    },
    /// `schema_registry.ca_file` is not a PEM certificate; reqwest's text.
    #[error(transparent)]
    Certificate(reqwest::Error),
    /// The HTTP client could not be built; reqwest's text.
    #[error(transparent)]
    Client(reqwest::Error),
    /// The cache directory could not be created; the system's text.
    #[error(transparent)]
    CacheDir(std::io::Error),
}

/// The schema registry client: writer schemas by id, from memory, the disk
/// cache, local `<id>.avsc` files or the registry, checked against the topic's subjects.
pub struct Registry {
    opts: RegistryOptions,
    http: Option<reqwest::Client>,
    /// `opts.url` without its user name and password: what errors and logs show.
    shown_url: String,
    /// Ids are immutable; their subjects only grow (a schema registered again
    /// under another subject keeps its id), so a missing subject is asked again.
    cache: Mutex<HashMap<u32, Entry>>,
    /// Set once it was logged that the registry cannot list subjects.
    no_subjects_logged: AtomicBool,
}

impl Registry {
    /// A client for `opts`: reads the CA file and creates the cache directory, sends
    /// nothing yet. Sets apache-avro's allocation limit, once per process (the first value stays).
    pub fn new(opts: RegistryOptions) -> Result<Registry, RegistrySetupError> {
        let limit = apache_avro::util::max_allocation_bytes(opts.max_allocation_bytes);
        if limit != opts.max_allocation_bytes {
            tracing::warn!(
                configured = opts.max_allocation_bytes,
                in_effect = limit,
                "schema_registry.max_allocation_bytes was already set in this process; the first value stays"
            );
        }
        let http = match &opts.url {
            None => None,
            Some(_) => {
                let mut b = reqwest::Client::builder().timeout(opts.timeout);
                if let Some(ca) = &opts.ca_file {
                    let pem =
                        std::fs::read(ca).map_err(|error| RegistrySetupError::CaFile { path: ca.clone(), error })?;
                    let cert = reqwest::Certificate::from_pem(&pem).map_err(RegistrySetupError::Certificate)?;
                    b = b.add_root_certificate(cert);
                }
                Some(b.build().map_err(RegistrySetupError::Client)?)
            }
        };
        if let Some(dir) = &opts.cache_dir {
            std::fs::create_dir_all(dir).map_err(RegistrySetupError::CacheDir)?;
        }
        let shown_url = opts.url.as_deref().map(redact).unwrap_or_default();
        Ok(Registry {
            opts,
            http,
            shown_url,
            cache: Mutex::new(HashMap::new()),
            no_subjects_logged: AtomicBool::new(false),
        })
    }

    /// The writer schema for `id`, when it may be used for `part` of `topic`.
    pub async fn schema(&self, id: u32, topic: &str, part: Part) -> Result<Arc<ParsedSchema>, AvroError> {
        let entry = self.entry(id).await?;
        let Subjects::Known(subjects) = &entry.subjects else { return Ok(entry.parsed) };
        let allowed = allowed_subjects(topic, part, &entry.parsed);
        if subjects.iter().any(|s| allowed.contains(s)) {
            return Ok(entry.parsed);
        }
        // It may have been registered under this topic's subject since it was cached.
        let subjects = self.subjects(id).await?;
        self.remember(id, Entry { parsed: entry.parsed.clone(), subjects: subjects.clone() });
        match subjects {
            Subjects::Known(s) if !s.iter().any(|s| allowed.contains(s)) => {
                Err(AvroError::WrongSubject { id, subject: allowed[0].clone(), registered: s })
            }
            _ => Ok(entry.parsed),
        }
    }

    /// Memory, then disk (`schemas_dir`, then the cache), then the registry.
    async fn entry(&self, id: u32) -> Result<Entry, AvroError> {
        if let Some(e) = self.cache.lock().expect("schema cache").get(&id) {
            return Ok(e.clone());
        }
        let (cached, local) = match self.read_disk(id) {
            Some(found) => found,
            None => {
                let fetched = self.fetch(id).await?;
                self.write_disk(id, "json", &fetched);
                (fetched, false)
            }
        };
        let parsed = Arc::new(ParsedSchema::parse(id, &cached.schema, &cached.references)?);
        let subjects = if local || !self.opts.check_subjects || self.opts.url.is_none() {
            Subjects::Unchecked
        } else if let Some(known) = self.read_cached_subjects(id) {
            Subjects::Known(known)
        } else {
            self.subjects(id).await?
        };
        let entry = Entry { parsed, subjects };
        self.remember(id, entry.clone());
        Ok(entry)
    }

    fn remember(&self, id: u32, entry: Entry) {
        let mut cache = self.cache.lock().expect("schema cache");
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(id, entry);
    }

    /// The schema and whether it is a local `<id>.avsc` file.
    fn read_disk(&self, id: u32) -> Option<(CachedSchema, bool)> {
        if let Some(dir) = &self.opts.schemas_dir {
            if let Ok(schema) = std::fs::read_to_string(dir.join(format!("{id}.avsc"))) {
                return Some((CachedSchema { schema, references: Vec::new() }, true));
            }
        }
        let dir = self.opts.cache_dir.as_ref()?;
        let bytes = std::fs::read(dir.join(format!("{id}.json"))).ok()?;
        Some((serde_json::from_slice(&bytes).ok()?, false))
    }

    fn read_cached_subjects(&self, id: u32) -> Option<Vec<String>> {
        let dir = self.opts.cache_dir.as_ref()?;
        serde_json::from_slice(&std::fs::read(dir.join(format!("{id}.subjects"))).ok()?).ok()
    }

    /// `<id>.<extension>` in the cache directory, written whole or not at all.
    fn write_disk(&self, id: u32, extension: &str, value: &impl Serialize) {
        let Some(dir) = &self.opts.cache_dir else { return };
        let tmp = dir.join(format!("{id}.{extension}.tmp"));
        let done = std::fs::write(&tmp, serde_json::to_vec(value).expect("schema serialises"))
            .and_then(|()| std::fs::rename(&tmp, dir.join(format!("{id}.{extension}"))));
        if let Err(error) = done {
            tracing::warn!(%error, schema_id = id, "could not cache the schema on disk");
        }
    }

    /// `GET /schemas/ids/{id}/versions`; a registry without it cannot say.
    async fn subjects(&self, id: u32) -> Result<Subjects, AvroError> {
        let Some(http) = &self.http else { return Ok(Subjects::Unchecked) };
        let absent = [reqwest::StatusCode::NOT_FOUND, reqwest::StatusCode::METHOD_NOT_ALLOWED];
        match self.get::<Vec<SubjectVersion>>(http, &format!("/schemas/ids/{id}/versions"), &absent).await? {
            Some(versions) => {
                let subjects: Vec<String> = versions.into_iter().map(|v| v.subject).collect();
                self.write_disk(id, "subjects", &subjects);
                Ok(Subjects::Known(subjects))
            }
            None => {
                if !self.no_subjects_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(registry = %self.shown_url, schema_id = id,
                        "the schema registry cannot list the subjects of a schema id (GET /schemas/ids/<id>/versions); \
                         schema ids are not checked against topics");
                }
                Ok(Subjects::Unknown)
            }
        }
    }

    async fn fetch(&self, id: u32) -> Result<CachedSchema, AvroError> {
        let Some(http) = &self.http else {
            return Err(AvroError::UnknownSchema(id));
        };
        let not_found = [reqwest::StatusCode::NOT_FOUND];
        let resp: SchemaResponse = match self.get(http, &format!("/schemas/ids/{id}"), &not_found).await? {
            Some(r) => r,
            None => return Err(AvroError::UnknownSchema(id)),
        };
        if let Some(kind) = resp.schema_type.as_deref().filter(|k| !k.eq_ignore_ascii_case("AVRO")) {
            return Err(AvroError::NotAvro { id, kind: kind.to_owned() });
        }
        let mut references = Vec::new();
        let mut pending: Vec<(Reference, usize)> = resp.references.into_iter().map(|r| (r, 1)).collect();
        while let Some((r, depth)) = pending.pop() {
            if depth > MAX_REFERENCE_DEPTH {
                return Err(AvroError::BadSchema { id, error: "schema references nest too deep".into() });
            }
            let path = format!("/subjects/{}/versions/{}", urlencode(&r.subject), r.version);
            let Some(dep) = self.get::<SchemaResponse>(http, &path, &not_found).await? else {
                return Err(AvroError::BadSchema {
                    id,
                    error: format!("reference {} v{} not found", r.subject, r.version),
                });
            };
            pending.extend(dep.references.into_iter().map(|r| (r, depth + 1)));
            references.push(dep.schema);
        }
        Ok(CachedSchema { schema: resp.schema, references })
    }

    /// GET `path` under the registry URL and parse the answer; `None` on an `absent` status.
    async fn get<T: for<'de> Deserialize<'de>>(
        &self,
        http: &reqwest::Client,
        path: &str,
        absent: &[reqwest::StatusCode],
    ) -> Result<Option<T>, AvroError> {
        let base = self.opts.url.as_deref().unwrap_or_default();
        let shown = format!("{}{path}", self.shown_url);
        let mut req = http
            .get(format!("{base}{path}"))
            .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
        if let Some(user) = &self.opts.username {
            req = req.basic_auth(user, self.opts.password.as_deref());
        }
        let unavailable = |e: reqwest::Error| AvroError::Unavailable(format!("GET {shown}: {}", e.without_url()));
        let mut resp = req.send().await.map_err(unavailable)?;
        let status = resp.status();
        if absent.contains(&status) {
            return Ok(None);
        }
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(AvroError::Unavailable(format!("GET {shown}: http {status}")));
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            let detail = format!("GET {shown}: http {status}; check schema_registry.username and password");
            return Err(AvroError::Registry { fault: RegistryFault::Auth, detail });
        }
        if !status.is_success() {
            let detail = format!("GET {shown}: http {status}");
            return Err(AvroError::Registry { fault: RegistryFault::Status, detail });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(unavailable)? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                let detail = format!("GET {shown}: the answer is larger than {MAX_ANSWER_BYTES} bytes");
                return Err(AvroError::Registry { fault: RegistryFault::Unparsable, detail });
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map(Some).map_err(|e| AvroError::Registry {
            fault: RegistryFault::Unparsable,
            detail: format!("GET {shown}: http {status} but not a schema registry's answer: {e}"),
        })
    }
}

/// The subjects a schema for `part` of `topic` may be registered under, the
/// TopicNameStrategy one first.
fn allowed_subjects(topic: &str, part: Part, schema: &ParsedSchema) -> Vec<String> {
    let mut allowed = vec![format!("{topic}-{}", part.as_str())];
    allowed.extend(schema.record_name().map(|name| format!("{topic}-{name}")));
    allowed
}

/// The URL without user name and password.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            // Both fail only for URLs that cannot have credentials, which then have none.
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.as_str().trim_end_matches('/').to_owned()
        }
        Err(_) => "(the schema registry url)".to_owned(),
    }
}

fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
