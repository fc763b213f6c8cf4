//! The dedup store: one record per event id in sled, made durable by group
//! commit (`sync`), expired through an expiry index (`expires_at ++ id`), never
//! by scanning every record. sled is used only in this module.

mod counts;
mod owner;
mod record;
mod sync;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use counts::{Counts, COUNTS_KEY};

pub use owner::Owner;
pub use record::{now_us, Record, State};
pub use sync::SyncStats;

use crate::event::{OutboxEvent, RawMessage};

const EVENTS_TREE: &str = "events";
const EXPIRY_TREE: &str = "expiry";
const META_TREE: &str = "meta";
/// Copies of the messages of dead and parked events, for `store export` and `store retry`.
const MESSAGES_TREE: &str = "messages";
const DUPLICATES_KEY: &[u8] = b"duplicates_suppressed";
/// Expired records removed per sled batch during a retention pass.
const GC_BATCH: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store at {path} is in use by {owner}; `outboxd store` opens the database directly, so stop that process first (SIGTERM drains it cleanly)")]
    Locked { path: PathBuf, owner: String, admin: Option<String> },
    #[error("store I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error("store: durable write failed: {0}")]
    Sync(Arc<std::io::Error>),
    #[error("store: corrupt record for {id:?}: {error}")]
    Corrupt { id: String, error: String },
    #[error("no record for event {0:?}")]
    NotFound(String),
    #[error("event {id:?} is {state}, not {expected}")]
    WrongState { id: String, state: State, expected: &'static str },
    #[error("no stored copy of the message of event {0:?}")]
    NoMessage(String),
}

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub retention: Duration,
    /// Group-commit window.
    pub commit_interval: Duration,
    /// fdatasync after flush (power-loss safe) or not (process-crash safe only).
    pub fsync: bool,
    /// Who opens it, recorded for `store` commands that find it locked.
    pub role: &'static str,
    /// sled's page cache (its default, 1 GiB, dominates outboxd's memory).
    pub cache_bytes: u64,
}

/// Page cache for commands that open the store briefly.
pub const SMALL_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Counts for `outboxd store stats`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub claimed: u64,
    pub done: u64,
    pub dead: u64,
    pub parked: u64,
    pub duplicates_suppressed: u64,
    pub bytes_on_disk: u64,
    /// First seen of the oldest / newest record (µs since the epoch).
    pub oldest_us: Option<i64>,
    pub newest_us: Option<i64>,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Claimed now (durably).
    Claimed(Claimed),
    /// Already final: do not run; the duplicate was counted. `same_offset`: the
    /// very message came again (a redelivered offset), not the id at a new offset.
    Finished { state: State, same_offset: bool },
}

/// A durably claimed event: the record as written, handed back to
/// [`Store::finish`] so the final write does not read and decode it again.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    record: Box<Record>,
}

impl Claimed {
    /// Handler executions started, this one included.
    pub fn attempt(&self) -> u32 {
        self.record.attempts
    }

    /// An earlier attempt's outcome is unknown (it was claimed and never finished).
    pub fn reexecution(&self) -> bool {
        self.record.attempts > 1
    }
}

pub struct Store {
    path: PathBuf,
    db: sled::Db,
    events: sled::Tree,
    expiry: sled::Tree,
    meta: sled::Tree,
    messages: sled::Tree,
    retention: Duration,
    /// Records per state, persisted with each group commit.
    counts: Arc<Counts>,
    /// Opened by the service, whose writers run while `stats` scans.
    service: bool,
    sync: sync::Syncer,
    owner: Mutex<Option<owner::OwnerFile>>,
}

impl Store {
    pub fn open(path: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        std::fs::create_dir_all(path)?;
        let db = match sled::Config::new().path(path).cache_capacity(opts.cache_bytes).open() {
            Ok(db) => db,
            Err(sled::Error::Io(e)) if is_lock_error(&e) => {
                let holder = Owner::read(path);
                let admin = holder.as_ref().and_then(|o| o.admin.clone());
                let owner = holder.map(|o| o.to_string()).unwrap_or_else(|| "another process".to_owned());
                return Err(StoreError::Locked { path: path.to_owned(), owner, admin });
            }
            Err(e) => return Err(e.into()),
        };
        sync::sync_dir(path)?;
        let data_file = if opts.fsync { Some(sync::open_data_file(path)?) } else { None };
        let owner = owner::OwnerFile::write(path, opts.role).ok();
        let events = db.open_tree(EVENTS_TREE)?;
        let meta = db.open_tree(META_TREE)?;
        let counts = Arc::new(match meta.get(COUNTS_KEY)?.as_deref().and_then(Counts::decode) {
            Some(values) => Counts::from_values(values),
            None if events.is_empty() => Counts::default(),
            None => {
                // A store written before the counts were kept: count once.
                tracing::info!(store = %path.display(), "counting the records per state once");
                count_states(&events)?
            }
        });
        let persist = {
            let (meta, counts) = (meta.clone(), counts.clone());
            move || meta.insert(COUNTS_KEY, &counts.encode()[..]).map(drop)
        };
        Ok(Store {
            path: path.to_owned(),
            events,
            expiry: db.open_tree(EXPIRY_TREE)?,
            meta,
            messages: db.open_tree(MESSAGES_TREE)?,
            retention: opts.retention,
            counts,
            service: opts.role == "run",
            sync: sync::Syncer::start(db.clone(), data_file, opts.commit_interval, Box::new(persist)),
            db,
            owner: Mutex::new(owner),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tells `outboxd store` where the running service answers, with a fresh
    /// per-run admin token (see [`Store::admin_token`]) in the same write.
    pub fn advertise_admin(&self, addr: &str) -> std::io::Result<()> {
        match self.owner.lock().expect("owner lock").as_mut() {
            Some(o) => o.set_admin(addr),
            None => Ok(()),
        }
    }

    /// The token written next to the advertised admin address: whoever can
    /// read the owner file (the user running outboxd, and root) may use the
    /// admin API. `None` before [`Store::advertise_admin`] or without an owner file.
    pub fn admin_token(&self) -> Option<String> {
        self.owner.lock().expect("owner lock").as_ref().and_then(|o| o.admin_token().map(str::to_owned))
    }

    /// Waits until every write made so far is on disk.
    pub async fn durable(&self) -> Result<(), StoreError> {
        self.sync.durable().await.map_err(StoreError::Sync)
    }

    pub fn sync_stats(&self) -> SyncStats {
        self.sync.stats()
    }

    pub fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        self.events.get(id.as_bytes())?.map(|bytes| decode(id, &bytes)).transpose()
    }

    fn put(&self, record: &Record) -> Result<(), StoreError> {
        // postcard: a compact binary form (a done record is ~100 bytes, a third of its JSON).
        let bytes = postcard::to_allocvec(record).expect("records serialise");
        self.events.insert(record.event_id.as_bytes(), bytes)?;
        Ok(())
    }

    /// Claims the event for execution, durably, unless it is already final
    /// (then the duplicate is counted and nothing runs).
    pub async fn claim(&self, event: &OutboxEvent) -> Result<Claim, StoreError> {
        let now = now_us();
        let existing = self.get(&event.id)?;
        let record = match existing {
            Some(r) if r.state.is_final() => {
                let state = r.state;
                let p = &event.position;
                let same_offset = r.topic == p.topic && r.partition == p.partition && r.offset == p.offset;
                self.count_duplicate(r)?;
                return Ok(Claim::Finished { state, same_offset });
            }
            Some(r) => Record {
                attempts: r.attempts + 1,
                topic: event.position.topic.clone(),
                partition: event.position.partition,
                offset: event.position.offset,
                claimed_at_us: Some(now),
                updated_at_us: now,
                ..r
            },
            None => Record {
                key: event.aggregate_id.clone(),
                event_type: event.event_type.clone(),
                claimed_at_us: Some(now),
                ..Record::first_seen(&event.id, State::Claimed, 1, &event.position, now)
            },
        };
        self.put(&record)?;
        if record.attempts == 1 {
            self.counts.moved(None, Some(State::Claimed));
        }
        self.durable().await?;
        Ok(Claim::Claimed(Claimed { record: Box::new(record) }))
    }

    /// A further attempt within the same claim (a retry after a handler error).
    pub async fn record_attempt(&self, claimed: &mut Claimed) -> Result<u32, StoreError> {
        let r = &mut claimed.record;
        r.attempts += 1;
        r.updated_at_us = now_us();
        self.put(r)?;
        self.durable().await?;
        Ok(r.attempts)
    }

    fn count_duplicate(&self, mut r: Record) -> Result<(), StoreError> {
        r.duplicates += 1;
        self.put(&r)?;
        self.meta.fetch_and_update(DUPLICATES_KEY, |old| {
            let n = old.and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_be_bytes).unwrap_or(0);
            Some((n + 1).to_be_bytes().to_vec())
        })?;
        Ok(())
    }

    /// Records the final state of a claimed event durably; only then may the offset move on.
    pub async fn finish(&self, claimed: Claimed, state: State, text: String) -> Result<(), StoreError> {
        debug_assert!(state.is_final());
        let mut r = *claimed.record;
        self.finish_record(&mut r, Some(State::Claimed), state, text)?;
        self.durable().await
    }

    /// Records a dead or parked event with its message copy and, when one was
    /// produced and acknowledged, its dead-letter position.
    pub async fn finish_failed(
        &self,
        claimed: Claimed,
        state: State,
        reason: String,
        message: &RawMessage,
        dead_letter: Option<String>,
    ) -> Result<(), StoreError> {
        let mut r = *claimed.record;
        self.messages.insert(r.event_id.as_bytes(), encode_message(message))?;
        r.dead_letter = dead_letter;
        self.finish_record(&mut r, Some(State::Claimed), state, reason)?;
        self.durable().await
    }

    /// The stored copy of a dead or parked event's message.
    pub fn message(&self, event_id: &str) -> Result<Option<RawMessage>, StoreError> {
        self.messages
            .get(event_id.as_bytes())?
            .map(|b| {
                postcard::from_bytes::<StoredMessage>(&b)
                    .map(RawMessage::from)
                    .map_err(|e| StoreError::Corrupt { id: event_id.to_owned(), error: e.to_string() })
            })
            .transpose()
    }

    /// `r` as stored (`None` in `was` when it is new) becomes final.
    fn finish_record(&self, r: &mut Record, was: Option<State>, state: State, text: String) -> Result<(), StoreError> {
        let now = now_us();
        let expires = now.saturating_add(self.retention.as_micros() as i64);
        r.state = state;
        r.done_at_us = Some(now);
        r.updated_at_us = now;
        match state {
            State::Done => r.outcome = Some(text),
            _ => r.reason = Some(text),
        }
        self.reindex(r, Some(expires))?;
        self.put(r)?;
        self.counts.moved(was, Some(state));
        Ok(())
    }

    /// Records a message that never became an event (it could not be decoded) as dead.
    pub async fn record_undecodable(
        &self,
        id: &str,
        message: &RawMessage,
        reason: String,
        dead_letter: Option<String>,
    ) -> Result<(), StoreError> {
        let now = now_us();
        let existing = self.get(id)?;
        let was = existing.as_ref().map(|r| r.state);
        let mut r = existing.unwrap_or_else(|| Record::first_seen(id, State::Dead, 0, &message.position(), now));
        self.messages.insert(id.as_bytes(), encode_message(message))?;
        r.dead_letter = dead_letter;
        self.finish_record(&mut r, was, State::Dead, reason)?;
        self.durable().await
    }

    /// Index first, record second: a crash in between leaves an orphan index
    /// entry (ignored by gc), never a record that cannot expire.
    fn reindex(&self, r: &mut Record, expires_at: Option<i64>) -> Result<(), StoreError> {
        if let Some(old) = r.expires_at_us {
            self.expiry.remove(expiry_key(old, &r.event_id))?;
        }
        if let Some(at) = expires_at {
            self.expiry.insert(expiry_key(at, &r.event_id), &[])?;
        }
        r.expires_at_us = expires_at;
        Ok(())
    }

    /// Removes a record so the event may run again. Returns what was removed.
    pub async fn forget(&self, id: &str) -> Result<Record, StoreError> {
        let mut r = self.get(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        self.events.remove(id.as_bytes())?;
        self.messages.remove(id.as_bytes())?;
        self.reindex(&mut r, None)?;
        self.counts.moved(Some(r.state), None);
        self.durable().await?;
        Ok(r)
    }

    /// Takes a dead or parked event back to `absent`, keeping its message copy,
    /// so it runs again through the normal path. Returns the copy.
    pub async fn reopen(&self, id: &str) -> Result<RawMessage, StoreError> {
        let mut r = self.get(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        if !matches!(r.state, State::Dead | State::Parked) {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "dead or parked" });
        }
        let message = self.message(id)?.ok_or_else(|| StoreError::NoMessage(id.to_owned()))?;
        self.events.remove(id.as_bytes())?;
        self.reindex(&mut r, None)?;
        self.counts.moved(Some(r.state), None);
        self.durable().await?;
        Ok(message)
    }

    /// A person resolved a parked (or dead) event as done.
    pub async fn resolve_done(&self, id: &str, note: String) -> Result<(), StoreError> {
        let mut r = self.get(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        if !matches!(r.state, State::Dead | State::Parked) {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "dead or parked" });
        }
        self.messages.remove(id.as_bytes())?;
        let was = r.state;
        self.finish_record(&mut r, Some(was), State::Done, note)?;
        self.durable().await
    }

    /// Drops the message copy of an event that is done after all.
    pub async fn drop_message(&self, id: &str) -> Result<(), StoreError> {
        self.messages.remove(id.as_bytes())?;
        self.durable().await
    }

    /// Removes final records whose retention ended before `now_us`, walking the
    /// expiry index in order. Returns how many were removed.
    pub async fn gc(&self, now_us: i64) -> Result<u64, StoreError> {
        let mut removed = 0u64;
        loop {
            let end = expiry_key(now_us, "");
            let due: Vec<sled::IVec> = self.expiry.range(..end).keys().take(GC_BATCH).collect::<Result<_, _>>()?;
            if due.is_empty() {
                break;
            }
            for key in &due {
                let id = std::str::from_utf8(&key[8..]).unwrap_or_default();
                let at = i64::from_be_bytes(key[..8].try_into().expect("8-byte prefix"));
                if let Some(r) = self.get(id)? {
                    if r.state.is_final() && r.expires_at_us == Some(at) {
                        self.events.remove(id.as_bytes())?;
                        self.messages.remove(id.as_bytes())?;
                        self.counts.moved(Some(r.state), None);
                        removed += 1;
                    }
                }
                self.expiry.remove(key)?;
            }
            tokio::task::yield_now().await;
        }
        self.durable().await?;
        Ok(removed)
    }

    /// Records in id order, optionally of one state.
    pub fn list(&self, state: Option<State>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list_filtered(state, None, limit)
    }

    /// Calls `f` for every record of the state and topic, in id order, without
    /// holding them all in memory.
    pub fn scan<E: From<StoreError>>(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        mut f: impl FnMut(Record) -> Result<(), E>,
    ) -> Result<(), E> {
        for item in self.events.iter() {
            let (k, v) = item.map_err(StoreError::from)?;
            let r = decode(&String::from_utf8_lossy(&k), &v)?;
            if state.is_none_or(|s| s == r.state) && topic.is_none_or(|t| t == r.topic) {
                f(r)?;
            }
        }
        Ok(())
    }

    /// Number of records (all states) from the kept counts, without a scan: for progress display.
    pub fn len(&self) -> usize {
        self.counts().iter().map(|(_, n)| *n as usize).sum()
    }

    /// Size of the store's files.
    pub fn bytes_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Records in id order, optionally of one state and one topic.
    pub fn list_filtered(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.list_after(state, topic, None, limit)
    }

    /// Like [`Store::list_filtered`], starting after the event id `after`
    /// (exclusive): one page, whose last id is where the next page starts.
    pub fn list_after(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        use std::ops::Bound::{Excluded, Unbounded};
        let start = after.map_or(Unbounded, |id| Excluded(id.as_bytes()));
        let mut out = Vec::new();
        for item in self.events.range::<&[u8], _>((start, Unbounded)) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            let r = decode(&String::from_utf8_lossy(&k), &v)?;
            if state.is_none_or(|s| s == r.state) && topic.is_none_or(|t| t == r.topic) {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Records per state without scanning (what the service's gauges show).
    pub fn counts(&self) -> [(State, u64); 4] {
        [State::Claimed, State::Done, State::Dead, State::Parked].map(|s| (s, self.counts.get(s)))
    }

    /// Counts every record (a full scan). On a store no service is writing to,
    /// the kept per-state counts are corrected to what the scan found.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        let mut s = Stats::default();
        for item in self.events.iter() {
            let (k, v) = item?;
            let r = decode(&String::from_utf8_lossy(&k), &v)?;
            match r.state {
                State::Claimed => s.claimed += 1,
                State::Done => s.done += 1,
                State::Dead => s.dead += 1,
                State::Parked => s.parked += 1,
            }
            s.oldest_us = Some(s.oldest_us.map_or(r.first_seen_us, |o| o.min(r.first_seen_us)));
            s.newest_us = Some(s.newest_us.map_or(r.first_seen_us, |o| o.max(r.first_seen_us)));
        }
        s.duplicates_suppressed = self
            .meta
            .get(DUPLICATES_KEY)?
            .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        s.bytes_on_disk = self.db.size_on_disk()?;
        if !self.service {
            let scanned = [s.claimed, s.done, s.dead, s.parked].map(|n| n as i64);
            if self.counts.values() != scanned {
                tracing::info!(store = %self.path.display(), "per-state counts corrected from a full count");
                self.counts.set(scanned);
                self.meta.insert(COUNTS_KEY, &self.counts.encode()[..])?;
                self.db.flush()?;
            }
        }
        Ok(s)
    }

    /// Flushes everything (durably) before the process ends.
    pub async fn close(&self) -> Result<(), StoreError> {
        self.durable().await
    }
}

/// A message as kept in the store (postcard: compact binary, values may be large).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredMessage {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

impl From<StoredMessage> for RawMessage {
    fn from(m: StoredMessage) -> RawMessage {
        RawMessage {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            key: m.key,
            value: m.value,
            headers: m.headers,
            timestamp_ms: m.timestamp_ms,
        }
    }
}

fn encode_message(m: &RawMessage) -> Vec<u8> {
    let stored = StoredMessage {
        topic: m.topic.clone(),
        partition: m.partition,
        offset: m.offset,
        key: m.key.clone(),
        value: m.value.clone(),
        headers: m.headers.clone(),
        timestamp_ms: m.timestamp_ms,
    };
    postcard::to_allocvec(&stored).expect("messages serialise")
}

/// Records per state by a full scan.
fn count_states(events: &sled::Tree) -> Result<Counts, StoreError> {
    let counts = Counts::default();
    for item in events.iter() {
        let (k, v) = item?;
        counts.moved(None, Some(decode(&String::from_utf8_lossy(&k), &v)?.state));
    }
    Ok(counts)
}

fn expiry_key(at_us: i64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + id.len());
    k.extend_from_slice(&(at_us.max(0) as u64).to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

fn decode(id: &str, bytes: &[u8]) -> Result<Record, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt { id: id.to_owned(), error: e.to_string() })
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock")
}

#[cfg(test)]
mod tests;
