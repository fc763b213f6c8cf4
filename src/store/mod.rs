//! The dedup store: one compact record per (event id, dedup scope) in sled,
//! made durable by group commit (`sync`), kept in time slices that expire
//! whole (`slices`), never by scanning records. sled is used only in this module.
//!
//! - `keys`: record keys (16 bytes for a UUID id, plus a tag and a scope id);
//!   `format`: the compact value; `names`: the scope/topic/event-type dictionary.
//! - `slices`: one tree per slice of time, per-slice counts, dropped whole; a slice
//!   whose time has passed is sealed into a packed run (`runs`) and its tree becomes an overlay.
//! - `messages`: copies of failed messages, within a quota, per slice.
//! - `handling`: claim, attempts, final records (the handling path).
//! - `read`: listing, paging, scanning and counting; `repair`: forget, reopen, resolve.
//! - `audit`: what people did (forget, resolve, re-run, gc): who, when, why, what came
//!   of it; kept `retention` long and sent to the changelog partition of the events named.
//! - `inflight`: claims kept in memory only (`on_uncertain = retry`), shown while they last.
//! - `chains`: events held behind a dead or parked event of their Kafka key
//!   (`on_dead = "hold"`), and the index of those chains; `held`: recording events
//!   held, and the steps of running them once their chain is released.
//! - `migrate`: converts stores written in the earlier format on open.
//! - `changelog`: the changelog's value format, restore, and checkpoints (`[store.changelog]`).
//! - `publish`: records the changelog may lack (written while it was off) copied into it, resumably.

pub mod audit;
pub mod chains;
pub mod changelog;
mod counts;
mod filter;
mod format;
mod handling;
mod held;
mod inflight;
mod keys;
mod messages;
mod migrate;
mod names;
mod options;
mod owner;
mod problems;
#[cfg(test)]
mod problems_tests;
pub mod publish;
mod read;
mod record;
mod repair;
mod roles;
mod runs;
#[cfg(any(test, feature = "internals"))]
pub mod scale;
mod slices;
mod sync;
mod varint;
pub mod view;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use audit::{AuditAction, AuditEntry, AuditEvent};
pub use chains::{ChainId, ChainInfo};
pub use keys::UNDECODABLE_SCOPE;
#[cfg(test)]
pub use options::SMALL_CACHE_BYTES;
pub use options::{Role, StoreOptions};
pub(crate) use owner::Owner;
pub use problems::{largest_first, reason_group, GroupCount, GroupKey};
pub use read::Listed;
pub use record::{now_us, Record, State};
pub use repair::Replayed;
#[cfg(test)]
pub use sync::SyncStats;

use crate::event::{OutboxEvent, RawMessage};
use slices::{Slice, Slices};

/// The `next` cursor of a page that ends with `r` (see `list_after`).
pub fn page_cursor(r: &Record) -> String {
    keys::cursor(&r.event_id, r.scope.as_deref())
}

#[cfg(any(test, feature = "internals"))]
/// The key of an event's record outside this store (a changelog topic): 17
/// bytes for a UUID id (see `keys`).
pub fn event_key(id: &str) -> Vec<u8> {
    keys::event_key(id).into_vec()
}

const META_TREE: &str = "meta";
const NAMES_TREE: &str = "names";
const DUPLICATES_KEY: &[u8] = b"duplicates_suppressed";
/// Meta key: until when records from before scopes (scope id 0) may be retained
/// (µs, big-endian i64); a claim looks for them only until then.
const LEGACY_UNTIL_KEY: &[u8] = b"legacy_keys_until";

/// Why a store operation failed. `NotFound`, `WrongState` and `NoMessage` answer
/// what a person asked for (`outboxd store …`, the admin API); the others are
/// failures of the store itself.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the database (sled's file lock).
    #[error("the store at {path} is in use by {owner}; `outboxd store` opens the database directly, so stop that process first (SIGTERM drains it cleanly)")]
    Locked {
        /// The store's directory.
        path: PathBuf,
        /// The holder as its owner file names it, or `another process` without one.
        owner: String,
        /// The admin address the holder advertised (a running service): `outboxd store` asks there instead.
        admin: Option<String>,
    },
    /// A file operation of the store failed (its directory, syncing sled's files).
    #[error("store I/O: {0}")]
    Io(#[from] std::io::Error),
    /// sled failed.
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    /// The group commit could not make writes durable: a flush or fdatasync failed
    /// (the first failure answers every later wait too), or the store is closed.
    #[error("store: durable write failed: {0}")]
    Sync(Arc<std::io::Error>),
    /// A stored value could not be decoded.
    #[error("store: corrupt record for {id:?}: {error}")]
    Corrupt {
        /// The event id for a message copy; the key's bytes (hex) for a record or changelog entry.
        id: String,
        /// What is wrong with it.
        error: String,
    },
    /// No record of this event id.
    #[error("no record for event {0:?}")]
    NotFound(String),
    /// The record is in a state the operation does not apply to.
    #[error("event {id:?} is {state}, not {expected}")]
    WrongState {
        /// The event id.
        id: String,
        /// The state the record is in.
        state: State,
        /// The states the operation applies to, as text.
        expected: &'static str,
    },
    /// The event's message has no stored copy (e.g. it was not kept: the quota was
    /// reached), so it cannot run again from the store.
    #[error("no stored copy of the message of event {0:?}")]
    NoMessage(String),
    /// A page cursor of the audit that no page answered with.
    #[error("{0:?} is not a cursor of the audit (use the `next` of an earlier page)")]
    BadCursor(String),
    /// With a changelog: the broker did not acknowledge a record's entry (the
    /// reason), so the write does not count.
    #[error("changelog write failed: {0}")]
    Changelog(changelog::SendError),
}

/// Counts for `outboxd store stats`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    /// Records claimed and not finished.
    pub claimed: u64,
    /// Records done.
    pub done: u64,
    /// Records dead.
    pub dead: u64,
    /// Records parked.
    pub parked: u64,
    /// Records held behind a dead or parked event of their key.
    pub held: u64,
    /// Deliveries not run because their record was already final, over the store's
    /// life, those of records removed since included (persisted with each group commit).
    pub duplicates_suppressed: u64,
    /// Size of the store's files, as sled reports it.
    pub bytes_on_disk: u64,
    /// When the oldest record was first seen (µs since the epoch).
    pub oldest_us: Option<i64>,
    /// When the newest record was first seen (µs since the epoch).
    pub newest_us: Option<i64>,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Claimed now (durably, or in memory: see `store.handling().claim_in_memory`).
    Claimed(Claimed),
    /// Already final: do not run; the duplicate was counted.
    Finished {
        /// The final state the record is in.
        state: State,
        /// The very message came again (a redelivered offset), not the id at a new offset.
        same_offset: bool,
    },
}

/// A claimed event: the record as claimed and the slice it is stored in,
/// handed back to `store.handling().finish` so the final write reads nothing again.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    record: Box<Record>,
    /// Start of the slice the record is stored in (the final record replaces it there, or
    /// moves it to a newer one); `None`: nothing is stored yet (an in-memory claim of a new event).
    slice: Option<i64>,
    /// The claim itself is written and durable (`on_uncertain = verify | park`); an
    /// in-memory claim writes nothing before its final record.
    durable: bool,
    /// The state of the record stored in `slice` (`claimed`; `held` for a held
    /// event its released chain runs now), which the final record replaces.
    stored: State,
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

    /// The claim is on disk (and, with a changelog, may be sent there): see [`Store::claim`].
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// With `hold` (`on_dead = "hold"`) and a message key, the event's final record,
    /// should it be dead or parked, holds the later events of its key (`chains`).
    /// A record already in a chain keeps it.
    pub fn holding(mut self, hold: bool, message: &RawMessage) -> Claimed {
        if hold && self.record.chain.is_none() {
            self.record.chain = message.key.clone();
        }
        self
    }
}

/// A record as a lookup found it, and where it is.
struct Found {
    record: Record,
    key: Vec<u8>,
    slice: Arc<Slice>,
}

/// The dedup store: one compact record per (event id, dedup scope) in time slices
/// of a sled database, written by the service and by `outboxd store`, one process
/// at a time. Writes become durable through the group commit ([`Store::durable`]).
pub struct Store {
    path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    names: names::Names,
    /// Where records are; written to by the group commit (per-slice counts).
    slices: Arc<Slices>,
    messages: messages::MessageCopies,
    /// Opened by the service, whose writers run while `stats` scans.
    service: bool,
    /// Records from before scopes may be retained until then (µs): a claim that
    /// finds no scoped record also looks under scope id 0 (see `keys`).
    legacy_until: i64,
    /// Deliveries suppressed, persisted with each group commit (not per record).
    duplicates: Arc<AtomicU64>,
    /// In-memory claims (`on_uncertain = retry`), by event id and scope: never
    /// written, so `get` and the counts look here too; removed when the final
    /// record is written or the claim is dropped ([`Store::release`]).
    claims: inflight::Claims,
    sync: sync::Syncer,
    owner: Mutex<Option<owner::OwnerFile>>,
    /// Where final records also go, and how far each changelog partition is restored.
    changelog: changelog::Changelog,
    /// Held chains (`on_dead = "hold"`): which keys wait, and for what.
    chains: chains::Chains,
    /// What people did to the store (`audit`), kept `retention` long.
    audit: audit::AuditLog,
    /// The dead and parked records, indexed and counted by group (`problems`).
    problems: problems::Problems,
}

impl Store {
    /// Opens the store in the directory `path` (created if missing), converting a
    /// store written in the earlier format; `Locked` if another process holds it.
    pub(crate) fn open(path: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        std::fs::create_dir_all(path)?;
        let db = open_db(path, opts.cache_bytes)?;
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
        let meta = db.open_tree(META_TREE)?;
        let names = names::Names::open(db.open_tree(NAMES_TREE)?)?;
        let slices = Arc::new(Slices::open(&db, &meta, opts.retention)?);
        let messages = messages::MessageCopies::open(&db, &meta)?;
        migrate::convert(&migrate::Parts {
            db: &db,
            meta: &meta,
            names: &names,
            slices: &slices,
            messages: &messages,
        })?;
        let legacy_until = read_i64(&meta, LEGACY_UNTIL_KEY)?.unwrap_or(i64::MIN);
        let changelog = changelog::Changelog::open(&meta, opts.retention, opts.clock_skew)?;
        let duplicates = Arc::new(AtomicU64::new(read_i64(&meta, DUPLICATES_KEY)?.unwrap_or(0) as u64));
        let persist = {
            let (meta, slices, copy_bytes, duplicates, checkpoints) =
                (meta.clone(), slices.clone(), messages.total(), duplicates.clone(), changelog.checkpoints.clone());
            move || {
                slices.persist()?;
                checkpoints.persist(&meta)?;
                let copies = copy_bytes.load(Ordering::Relaxed);
                meta.insert(messages::MESSAGE_BYTES_KEY, &copies.to_be_bytes()[..])?;
                meta.insert(DUPLICATES_KEY, &duplicates.load(Ordering::Relaxed).to_be_bytes()[..]).map(drop)
            }
        };
        let chains = chains::Chains::open(&db)?;
        let audit = audit::AuditLog::open(&db, opts.retention)?;
        let problems = problems::Problems::open(&db, &meta)?;
        let store = Store {
            path: path.to_owned(),
            meta,
            names,
            slices,
            messages,
            service: opts.role.is_service(),
            legacy_until,
            duplicates,
            claims: inflight::Claims::default(),
            sync: sync::Syncer::start(db.clone(), data_file, opts.commit_interval, Box::new(persist)),
            db,
            owner: Mutex::new(owner),
            changelog,
            chains,
            audit,
            problems,
        };
        store.load_chains()?;
        store.load_problems()?;
        if opts.role.builds_lookup_filters() {
            store.slices.fill_filters();
        }
        Ok(store)
    }

    /// The store's directory.
    pub(crate) fn path(&self) -> &Path {
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

    /// [`Store::durable`] from a thread outside the async runtime (it blocks).
    pub(crate) fn durable_blocking(&self) -> Result<(), StoreError> {
        self.sync.durable_blocking().map_err(StoreError::Sync)
    }

    /// The group commit's batches so far.
    #[cfg(test)]
    fn sync_stats(&self) -> SyncStats {
        self.sync.stats()
    }

    /// The record of event `id`, in whichever scope it is (the first, should the
    /// same id be kept in several): what `outboxd store get|forget|retry` act on.
    fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        if let Some(r) = self.claims.get(id) {
            return Ok(Some(r));
        }
        Ok(self.find_any(id)?.map(|f| f.record))
    }

    /// Removes the records whose retention ended before `now_us`: every slice
    /// that ended `retention` ago is dropped whole, with its message copies.
    /// No record is read. Audit entries older than `retention` go too (not
    /// counted). Returns how many records were removed.
    async fn gc(&self, now_us: i64) -> Result<u64, StoreError> {
        let removed = self.drop_expired_slices(now_us)?;
        self.seal(now_us).await?;
        self.prune_chains()?;
        self.prune_problems()?;
        self.expire_audit(now_us)?;
        self.durable().await?;
        Ok(removed)
    }

    /// Drops every slice past retention at `now_us` with its message copies;
    /// returns the records they held.
    fn drop_expired_slices(&self, now_us: i64) -> Result<u64, StoreError> {
        let mut removed = 0;
        for slice in self.slices.drop_expired(now_us)? {
            removed += slice.counts.total();
            self.messages.drop_slice(slice.start)?;
        }
        Ok(removed)
    }

    /// Packs the slices that no longer take live writes into runs (store/runs.rs),
    /// one at a time, on a blocking thread; see `slices` for the steps and why
    /// a crash between any two loses nothing. Returns the records packed.
    async fn seal(&self, now_us: i64) -> Result<u64, StoreError> {
        // A seal cut short between its install and its settle left the slice's records
        // in its overlay as well as in its run: settled once after each open.
        for slice in self.slices.to_settle() {
            let Some(_packing) = slice.try_packing() else { continue };
            let removed = self.settle_overlay(&slice).await?;
            if removed > 0 {
                tracing::info!(slice_start_us = slice.start, overlay_entries_removed = removed,
                    "a slice's overlay settled against its run (the last seal stopped before it)");
            }
        }
        let mut packed = 0;
        for slice in self.slices.to_seal(now_us)? {
            // A restore is writing its records into this slice: the next pass seals it.
            let Some(packing) = slice.try_packing() else { continue };
            let started = std::time::Instant::now();
            let (slices, s) = (self.slices.clone(), slice.clone());
            // The packing right comes back with the run: held until the run is settled.
            let ((run, writes), _packing) = blocking(move || Ok((slices.pack(&s, &packing)?, packing))).await?;
            let records = run.records;
            crash_point("packed");
            self.durable().await?;
            self.slices.install(&slice, run, writes)?;
            crash_point("installed");
            self.durable().await?;
            crash_point("durable");
            let settled = self.settle_overlay(&slice).await?;
            tracing::info!(
                slice_start_us = slice.start,
                records,
                overlay_entries_removed = settled,
                took_ms = started.elapsed().as_millis() as u64,
                "a slice's records packed into a run"
            );
            packed += records;
        }
        self.slices.drop_retired()?;
        Ok(packed)
    }

    /// [`slices::Slices::settle`] of `slice` on a blocking thread (it reads the whole
    /// overlay); the caller holds its packing right.
    async fn settle_overlay(&self, slice: &Arc<Slice>) -> Result<u64, StoreError> {
        let (slices, s) = (self.slices.clone(), slice.clone());
        blocking(move || slices.settle(&s)).await
    }

    /// Flushes everything (durably) before the process ends.
    pub async fn close(&self) -> Result<(), StoreError> {
        self.durable().await
    }
}

/// Debug builds only (compiled out of release builds): the process ends at `step` of
/// a seal as a SIGKILL would leave it (no destructor, nothing flushed on the way
/// out), for the tests that a crash between any two steps loses nothing and runs no
/// `done` event again (tests/it/seal_crashes.rs).
#[cfg(debug_assertions)]
fn crash_point(step: &str) {
    if std::env::var("OUTBOXD_DEBUG_CRASH_IN_SEAL").is_ok_and(|s| s == step) {
        eprintln!("crashing at the seal step {step:?} (OUTBOXD_DEBUG_CRASH_IN_SEAL)");
        std::process::abort();
    }
}

#[cfg(not(debug_assertions))]
fn crash_point(_step: &str) {}

/// Runs store work that reads or writes many records off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Io(std::io::Error::other(e)))?
}

fn read_i64(tree: &sled::Tree, key: &[u8]) -> Result<Option<i64>, StoreError> {
    Ok(tree.get(key)?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()).map(i64::from_be_bytes))
}

/// How long an open waits for sled's file lock while no owner file names a holder.
/// sled lets go of the file when the last of its I/O threads is done with it, which can
/// be a moment after the `Db` (and its owner file) is gone; a process that is exiting is
/// the same case. A holder its owner file names is reported at once.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Opens sled, or names who holds its lock.
fn open_db(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_RELEASE_WAIT;
    loop {
        match sled::Config::new().path(path).cache_capacity(cache_bytes).open() {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(e)) if is_lock_error(&e) => {
                let holder = Owner::read(path);
                if holder.is_none() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let admin = holder.as_ref().and_then(|o| o.admin.clone());
                let owner = holder.map(|o| o.to_string()).unwrap_or_else(|| "another process".to_owned());
                return Err(StoreError::Locked { path: path.to_owned(), owner, admin });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock")
}

#[cfg(test)]
mod tests;
