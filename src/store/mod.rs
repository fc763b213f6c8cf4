//! The dedup store: one record per event id in sled, made durable by group
//! commit (`sync`), expired through an expiry index (`expires_at ++ id`), never
//! by scanning every record. sled is used only in this module.

mod counts;
mod keys;
mod messages;
mod options;
mod owner;
mod record;
mod sync;
pub mod view;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use counts::{Counts, COUNTS_KEY};

pub use keys::UNDECODABLE_SCOPE;

/// The `next` cursor of a page that ends with `r` (see `list_after`).
pub fn page_cursor(r: &Record) -> String {
    keys::cursor(&r.store_key())
}
pub use options::{Role, StoreOptions, SMALL_CACHE_BYTES};
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
/// A record expires `retention` plus this (or plus `retention` again, if that is
/// shorter) after its claim, whether it was finished or not. An event in flight is finished long before (`retry.max_elapsed` is 20
/// minutes by default), so a claim this old belongs to a partition that left or a
/// process that is gone. The final record keeps the claim's expiry: one index write
/// per event, not three.
const EXPIRY_MARGIN: Duration = Duration::from_secs(3600);
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
    messages: messages::MessageCopies,
    retention: Duration,
    /// Records per state, persisted with each group commit.
    counts: Arc<Counts>,
    /// Opened by the service, whose writers run while `stats` scans.
    service: bool,
    /// Records from before scopes may still be retained: a claim that finds no
    /// scoped record also looks under the bare id (see `keys`).
    legacy_keys: bool,
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
        // sled writes its `conf` file once and never fsyncs it; after a power loss it
        // would find it empty and rewrite it with defaults.
        sync::sync_file(&path.join("conf"))?;
        sync::sync_dir(path)?;
        let data_file = if opts.fsync {
            Some(sync::DataFiles { log: sync::open_data_file(path)?, blobs: sync::BlobFiles::new(path) })
        } else {
            None
        };
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
        let messages = messages::MessageCopies::open(&db, &meta)?;
        let legacy_keys = legacy_keys_retained(&meta, &events, opts.retention)?;
        let persist = {
            let (meta, counts, copy_bytes) = (meta.clone(), counts.clone(), messages.total());
            move || {
                meta.insert(COUNTS_KEY, &counts.encode()[..])?;
                let copies = copy_bytes.load(std::sync::atomic::Ordering::Relaxed);
                meta.insert(messages::MESSAGE_BYTES_KEY, &copies.to_be_bytes()[..]).map(drop)
            }
        };
        Ok(Store {
            path: path.to_owned(),
            events,
            expiry: db.open_tree(EXPIRY_TREE)?,
            meta,
            messages,
            retention: opts.retention,
            counts,
            service: opts.role.is_service(),
            legacy_keys,
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

    /// The record of event `id`, in whichever scope it is (the first, should the
    /// same id be kept in several): what `outboxd store get|forget|retry` act on.
    pub fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        if let Some(item) = self.events.scan_prefix(keys::id_prefix(id)).next() {
            let (key, bytes) = item?;
            return decode(&key, &bytes).map(Some);
        }
        self.get_key(id.as_bytes())
    }

    /// The record of `id` in `scope`, or a legacy record of `id` (keyed by the
    /// bare id, from a store written before scopes); with the raw bytes read.
    fn get_in(&self, scope: &str, id: &str) -> Result<Option<(Record, sled::IVec)>, StoreError> {
        let key = keys::scoped(id, scope);
        let raw = match self.events.get(&key)? {
            Some(raw) => Some((key, raw)),
            None if self.legacy_keys => self.events.get(id.as_bytes())?.map(|raw| (id.as_bytes().to_vec(), raw)),
            None => None,
        };
        raw.map(|(key, raw)| decode(&key, &raw).map(|r| (r, raw))).transpose()
    }

    fn get_key(&self, key: &[u8]) -> Result<Option<Record>, StoreError> {
        self.events.get(key)?.map(|bytes| decode(key, &bytes)).transpose()
    }

    fn put(&self, record: &Record) -> Result<(), StoreError> {
        // postcard: a compact binary form (a done record is ~100 bytes, a third of its JSON).
        let bytes = postcard::to_allocvec(record).expect("records serialise");
        self.events.insert(record.store_key(), bytes)?;
        Ok(())
    }

    /// Claims the event for execution in its dedup `scope`, durably, unless it is
    /// already final there (then the duplicate is counted and nothing runs).
    pub async fn claim(&self, event: &OutboxEvent, scope: &str) -> Result<Claim, StoreError> {
        let now = now_us();
        let (existing, raw) = match self.get_in(scope, &event.id)? {
            Some((r, raw)) => (Some(r), Some(raw)),
            None => (None, None),
        };
        let is_new = existing.is_none();
        let mut record = match existing {
            Some(r) if r.state.is_final() => {
                let state = r.state;
                let p = &event.position;
                let same_offset = r.topic == p.topic && r.partition == p.partition && r.offset == p.offset;
                self.count_duplicate(raw.as_deref(), r)?;
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
                scope: Some(scope.to_owned()),
                key: event.aggregate_id.clone(),
                event_type: event.event_type.clone(),
                claimed_at_us: Some(now),
                ..Record::first_seen(&event.id, State::Claimed, 1, &event.position, now)
            },
        };
        // A claim whose partition left (or whose process died for good) must not stay
        // forever: the record expires whether it is finished or not.
        self.reindex(&mut record, Some(self.expiry_after(now)))?;
        self.put(&record)?;
        if is_new {
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

    /// Counts a suppressed duplicate on the record as it was read (`old`): if gc or
    /// `forget` removed it (or anything changed it) meanwhile, the record is left as it
    /// is now instead of being written back to life.
    fn count_duplicate(&self, old: Option<&[u8]>, mut r: Record) -> Result<(), StoreError> {
        r.duplicates += 1;
        let new = postcard::to_allocvec(&r).expect("records serialise");
        // A lost race only loses this record's duplicate count; the total below still counts it.
        let _ = self.events.compare_and_swap(r.store_key(), old, Some(new))?;
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
        let reason = self.keep_message(&r.store_key(), message, reason)?;
        r.dead_letter = dead_letter;
        self.finish_record(&mut r, Some(State::Claimed), state, reason)?;
        self.durable().await
    }

    /// The stored copy of a dead or parked event's message.
    pub fn message(&self, event_id: &str) -> Result<Option<RawMessage>, StoreError> {
        match self.get(event_id)? {
            Some(r) => self.message_of(&r),
            None => Ok(None),
        }
    }

    /// The stored copy of this record's message: the record's own key, so equal ids
    /// in two scopes each have theirs, and no look-up of the record again.
    pub fn message_of(&self, r: &Record) -> Result<Option<RawMessage>, StoreError> {
        self.messages.get(&r.store_key(), &r.event_id)
    }

    /// Keeps the message copy of a failed event, within the quota; the reason
    /// says when the copy could not be kept.
    fn keep_message(&self, key: &[u8], message: &RawMessage, reason: String) -> Result<String, StoreError> {
        if self.messages.put(key, message)? {
            return Ok(reason);
        }
        metrics::counter!(crate::metrics::names::COPIES_NOT_KEPT).increment(1);
        tracing::warn!(topic = %message.topic, partition = message.partition, offset = message.offset,
            copies_bytes = self.messages.bytes(),
            "message copy not kept: store.max_message_copy_bytes is reached (the record is kept)");
        Ok(format!("{reason} [message copy not kept: store.max_message_copy_bytes reached]"))
    }

    /// Caps the bytes kept in message copies (`store.max_message_copy_bytes`).
    pub fn set_message_quota(&self, bytes: u64) {
        self.messages.set_quota(bytes);
    }

    /// Bytes kept in message copies.
    pub fn message_bytes(&self) -> u64 {
        self.messages.bytes()
    }

    /// `r` as stored (`None` in `was` when it is new) becomes final.
    fn finish_record(&self, r: &mut Record, was: Option<State>, state: State, text: String) -> Result<(), StoreError> {
        let now = now_us();
        r.state = state;
        r.done_at_us = Some(now);
        r.updated_at_us = now;
        match state {
            State::Done => r.outcome = Some(text),
            _ => r.reason = Some(text),
        }
        // A claimed record keeps the expiry its claim set; one that never was gets one.
        if r.expires_at_us.is_none() {
            self.reindex(r, Some(self.expiry_after(now)))?;
        }
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
        let existing = self.get_in(UNDECODABLE_SCOPE, id)?.map(|(r, _)| r);
        let was = existing.as_ref().map(|r| r.state);
        let mut r = existing.unwrap_or_else(|| Record {
            scope: Some(UNDECODABLE_SCOPE.to_owned()),
            ..Record::first_seen(id, State::Dead, 0, &message.position(), now)
        });
        let reason = self.keep_message(&r.store_key(), message, reason)?;
        r.dead_letter = dead_letter;
        self.finish_record(&mut r, was, State::Dead, reason)?;
        self.durable().await
    }

    /// When a record claimed (or first recorded) at `now_us` expires.
    fn expiry_after(&self, now_us: i64) -> i64 {
        now_us.saturating_add((self.retention + self.retention.min(EXPIRY_MARGIN)).as_micros() as i64)
    }

    /// Index first, record second: a crash in between leaves an orphan index
    /// entry (ignored by gc), never a record that cannot expire.
    fn reindex(&self, r: &mut Record, expires_at: Option<i64>) -> Result<(), StoreError> {
        let key = r.store_key();
        if let Some(old) = r.expires_at_us {
            self.expiry.remove(expiry_key(old, &key))?;
        }
        if let Some(at) = expires_at {
            self.expiry.insert(expiry_key(at, &key), &[])?;
        }
        r.expires_at_us = expires_at;
        Ok(())
    }

    /// Removes a record so the event may run again. Returns what was removed.
    pub async fn forget(&self, id: &str) -> Result<Record, StoreError> {
        let mut r = self.get(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let key = r.store_key();
        self.events.remove(&key)?;
        self.messages.remove(&key)?;
        self.reindex(&mut r, None)?;
        self.counts.moved(Some(r.state), None);
        self.durable().await?;
        Ok(r)
    }

    /// Takes a dead or parked event back for a re-run, in one write: it becomes
    /// `claimed` with no attempt yet (so the re-run is not mistaken for an uncertain
    /// re-execution), keeping its message copy, which is returned. A re-run that was
    /// interrupted (the process died, the client went away) leaves it like that, and
    /// it may be reopened again: a reopened event is never lost between the two steps.
    pub async fn reopen(&self, id: &str) -> Result<RawMessage, StoreError> {
        let mut r = self.get(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let interrupted_rerun = r.state == State::Claimed && r.attempts == 0;
        if !matches!(r.state, State::Dead | State::Parked) && !interrupted_rerun {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "dead or parked" });
        }
        let message = self.message_of(&r)?.ok_or_else(|| StoreError::NoMessage(id.to_owned()))?;
        let (was, now) = (r.state, now_us());
        r.state = State::Claimed;
        r.attempts = 0;
        r.claimed_at_us = Some(now);
        r.updated_at_us = now;
        self.reindex(&mut r, Some(self.expiry_after(now)))?;
        self.put(&r)?;
        self.counts.moved(Some(was), Some(State::Claimed));
        self.durable().await?;
        Ok(message)
    }

    /// After the re-run of a reopened record: if it is still waiting (the message
    /// ran under another id, as an undecodable or failed message does once it
    /// decodes), it is removed with its copy. Returns the record under `id` now.
    pub async fn settle_rerun(&self, id: &str) -> Result<Option<Record>, StoreError> {
        match self.get(id)? {
            Some(r) if r.state == State::Claimed && r.attempts == 0 => {
                self.forget(id).await?;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// A person resolved a parked (or dead) event as done.
    pub async fn resolve_done(&self, id: &str, note: String) -> Result<(), StoreError> {
        let mut r = self.get(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        if !matches!(r.state, State::Dead | State::Parked) {
            return Err(StoreError::WrongState { id: id.to_owned(), state: r.state, expected: "dead or parked" });
        }
        self.messages.remove(&r.store_key())?;
        let was = r.state;
        self.finish_record(&mut r, Some(was), State::Done, note)?;
        self.durable().await
    }

    /// Drops the message copy of an event that is done after all.
    pub async fn drop_message(&self, id: &str) -> Result<(), StoreError> {
        if let Some(r) = self.get(id)? {
            self.messages.remove(&r.store_key())?;
        }
        self.durable().await
    }

    /// Removes final records whose retention ended before `now_us`, walking the
    /// expiry index in order. Returns how many were removed.
    pub async fn gc(&self, now_us: i64) -> Result<u64, StoreError> {
        let mut removed = 0u64;
        loop {
            let end = expiry_key(now_us, b"");
            let due: Vec<sled::IVec> = self.expiry.range(..end).keys().take(GC_BATCH).collect::<Result<_, _>>()?;
            if due.is_empty() {
                break;
            }
            for key in &due {
                let record_key = &key[8..];
                let at = i64::from_be_bytes(key[..8].try_into().expect("8-byte prefix"));
                if let Some(r) = self.get_key(record_key)? {
                    // Final records after the retention; claimed ones after it and a margin.
                    if r.expires_at_us == Some(at) {
                        self.events.remove(record_key)?;
                        self.messages.remove(record_key)?;
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
            let r = decode(&k, &v)?;
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
        let start = after.map_or(Unbounded, |cursor| Excluded(keys::after(cursor)));
        let mut out = Vec::new();
        for item in self.events.range::<Vec<u8>, _>((start, Unbounded)) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            let r = decode(&k, &v)?;
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
            let r = decode(&k, &v)?;
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

fn decode_message(id: &str, bytes: &[u8]) -> Result<RawMessage, StoreError> {
    postcard::from_bytes::<StoredMessage>(bytes)
        .map(RawMessage::from)
        .map_err(|e| StoreError::Corrupt { id: id.to_owned(), error: e.to_string() })
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

/// Meta key: when this store began keying records by scope (µs, big-endian i64).
const SCOPED_SINCE_KEY: &[u8] = b"scoped_keys_since";

/// Whether records keyed by the bare id (written before scopes) may still be
/// retained: only until they have all expired after the store was first opened with
/// scopes. A store that starts empty never has any.
fn legacy_keys_retained(meta: &sled::Tree, events: &sled::Tree, retention: Duration) -> Result<bool, StoreError> {
    let now = now_us();
    match meta.get(SCOPED_SINCE_KEY)?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()) {
        Some(since) => {
            let until =
                i64::from_be_bytes(since).saturating_add((retention + retention.min(EXPIRY_MARGIN)).as_micros() as i64);
            Ok(now < until)
        }
        None => {
            // Empty: there never are legacy records (the earliest time says so for good).
            let legacy = !events.is_empty();
            let since = if legacy { now } else { i64::MIN };
            meta.insert(SCOPED_SINCE_KEY, &since.to_be_bytes()[..])?;
            Ok(legacy)
        }
    }
}

/// Records per state by a full scan.
fn count_states(events: &sled::Tree) -> Result<Counts, StoreError> {
    let counts = Counts::default();
    for item in events.iter() {
        let (k, v) = item?;
        counts.moved(None, Some(decode(&k, &v)?.state));
    }
    Ok(counts)
}

fn expiry_key(at_us: i64, record_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + record_key.len());
    k.extend_from_slice(&(at_us.max(0) as u64).to_be_bytes());
    k.extend_from_slice(record_key);
    k
}

/// The record stored under `key` (its scope comes from the key).
fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, StoreError> {
    let mut r: Record = postcard::from_bytes(bytes)
        .map_err(|e| StoreError::Corrupt { id: String::from_utf8_lossy(key).into_owned(), error: e.to_string() })?;
    r.scope = keys::scope_of(key);
    Ok(r)
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock")
}

#[cfg(test)]
mod tests;
