//! The [`Store`] type: the disk core and the parts held beside it, and the store's
//! life: open, the group commit's waits, gc and sealing, close.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::audit_log::AuditLog;
use super::chain_index::Chains;
use super::changelog::checkpoints::Changelog;
use super::disk::db::{open_db, read_i64, DUPLICATES_KEY, LEGACY_UNTIL_KEY, META_TREE, NAMES_TREE};
use super::disk::record::Record;
use super::disk::slices::{Packing, Slice, Slices};
use super::disk::messages;
use super::disk::migrate;
use super::disk::names;
use super::disk::owner;
use super::disk::sync;
use super::error::StoreError;
use super::inflight::Claims;
use super::options::StoreOptions;
use super::problem_index::Problems;

/// A record as a lookup found it, and where it is.
pub(in crate::store) struct Found {
    pub(in crate::store) record: Record,
    pub(in crate::store) key: Vec<u8>,
    pub(in crate::store) slice: Arc<Slice>,
}

/// The dedup store: one compact record per (event id, dedup scope) in time slices
/// of a sled database, written by the service and by `outboxd store`, one process
/// at a time. Writes become durable through the group commit ([`Store::durable`]).
pub struct Store {
    pub(in crate::store) path: PathBuf,
    pub(in crate::store) db: sled::Db,
    pub(in crate::store) meta: sled::Tree,
    pub(in crate::store) names: names::Names,
    /// Where records are; written to by the group commit (per-slice counts).
    pub(in crate::store) slices: Arc<Slices>,
    pub(in crate::store) messages: messages::MessageCopies,
    /// Opened by the service, whose writers run while `stats` scans.
    pub(in crate::store) service: bool,
    /// Records from before scopes may be retained until then (µs): a claim that
    /// finds no scoped record also looks under scope id 0 (see `keys`).
    pub(in crate::store) legacy_until: i64,
    /// Deliveries suppressed, persisted with each group commit (not per record).
    pub(in crate::store) duplicates: Arc<AtomicU64>,
    /// In-memory claims (`on_uncertain = retry`), by event id and scope: never
    /// written, so `get` and the counts look here too; removed when the final
    /// record is written or the claim is dropped ([`Store::release`]).
    pub(in crate::store) claims: Claims,
    pub(in crate::store) sync: sync::Syncer,
    pub(in crate::store) owner: Mutex<Option<owner::OwnerFile>>,
    /// Where final records also go, and how far each changelog partition is restored.
    pub(in crate::store) changelog: Changelog,
    /// Held chains (`on_dead = "hold"`): which keys wait, and for what.
    pub(in crate::store) chains: Chains,
    /// What people did to the store (`audit`), kept `retention` long.
    pub(in crate::store) audit: AuditLog,
    /// The dead and parked records, indexed and counted by group (`problems`).
    pub(in crate::store) problems: Problems,
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
        let slices = Arc::new(Slices::open_with(&db, &meta, opts.retention, opts.memory_records)?);
        let messages = messages::MessageCopies::open(&db, &meta)?;
        migrate::convert(&migrate::Parts {
            db: &db,
            meta: &meta,
            names: &names,
            slices: &slices,
            messages: &messages,
        })?;
        let legacy_until = read_i64(&meta, LEGACY_UNTIL_KEY)?.unwrap_or(i64::MIN);
        let changelog = Changelog::open(&meta, opts.retention, opts.clock_skew)?;
        let duplicates = Arc::new(AtomicU64::new(read_i64(&meta, DUPLICATES_KEY)?.unwrap_or(0) as u64));
        let persist = {
            let (meta, slices, copy_bytes, duplicates, checkpoints) =
                (meta.clone(), slices.clone(), messages.total(), duplicates.clone(), changelog.checkpoints.clone());
            move || {
                // The records in memory first: the counts written next count them.
                slices.journal()?;
                slices.persist()?;
                checkpoints.persist(&meta)?;
                let copies = copy_bytes.load(Ordering::Relaxed);
                meta.insert(messages::MESSAGE_BYTES_KEY, &copies.to_be_bytes()[..])?;
                meta.insert(DUPLICATES_KEY, &duplicates.load(Ordering::Relaxed).to_be_bytes()[..]).map(drop)
            }
        };
        let chains = Chains::open(&db)?;
        let audit = AuditLog::open(&db, opts.retention)?;
        let problems = Problems::open(&db, &meta)?;
        let store = Store {
            path: path.to_owned(),
            meta,
            names,
            slices,
            messages,
            service: opts.role.is_service(),
            legacy_until,
            duplicates,
            claims: Claims::default(),
            sync: sync::Syncer::start(
                db.clone(),
                data_file,
                sync::Windows { usual: opts.commit_interval, backlog: opts.backlog_commit_interval },
                Box::new(persist),
            ),
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
    pub(in crate::store) fn sync_stats(&self) -> sync::SyncStats {
        self.sync.stats()
    }

    /// The record of event `id`, in whichever scope it is (the first, should the
    /// same id be kept in several): what `outboxd store get|forget|retry` act on.
    pub(in crate::store) fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        if let Some(r) = self.claims.get(id) {
            return Ok(Some(r));
        }
        Ok(self.find_any(id)?.map(|f| f.record))
    }

    /// Removes the records whose retention ended before `now_us`: every slice
    /// that ended `retention` ago is dropped whole, with its message copies.
    /// No record is read. Audit entries older than `retention` go too (not
    /// counted). Returns how many records were removed.
    pub(in crate::store) async fn gc(&self, now_us: i64) -> Result<u64, StoreError> {
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
    pub(in crate::store) fn drop_expired_slices(&self, now_us: i64) -> Result<u64, StoreError> {
        let mut removed = 0;
        for slice in self.slices.drop_expired(now_us)? {
            removed += slice.counts.total();
            self.messages.drop_slice(slice.start)?;
        }
        Ok(removed)
    }

    /// Packs the slices that no longer take live writes into runs (store/disk/runs.rs),
    /// one at a time, on a blocking thread; see `slices` for the steps and why
    /// a crash between any two loses nothing. Returns the records packed.
    pub(in crate::store) async fn seal(&self, now_us: i64) -> Result<u64, StoreError> {
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
            packed += self.seal_slice(&slice, packing, now_us).await?;
        }
        self.slices.drop_retired()?;
        Ok(packed)
    }

    /// Packs one slice, holding its packing right: its records in memory into a run
    /// of their own (a spill), or everything it holds into one run (a merge, or a
    /// first seal); see [`Slices::due`]. Returns the records packed.
    pub(in crate::store) async fn seal_slice(
        &self,
        slice: &Arc<Slice>,
        packing: Packing,
        now_us: i64,
    ) -> Result<u64, StoreError> {
        let had_runs = slice.packing().0 > 0;
        let started = std::time::Instant::now();
        let (slices, s) = (self.slices.clone(), slice.clone());
        // The packing right comes back with the run: held until the run is settled.
        let (fold, run, _packing) = blocking(move || {
            let fold = slices.begin(&s, now_us, &packing)?;
            let run = slices.pack(&s, &fold, &packing)?;
            Ok((fold, run, packing))
        })
        .await?;
        let merge = fold.merge && had_runs;
        let crash_at = |step: &str| crash_point(Crash::Seal, &if merge { format!("merge-{step}") } else { step.into() });
        let records = run.records;
        crash_at("packed");
        self.durable().await?;
        let (slices, s) = (self.slices.clone(), slice.clone());
        let fold = blocking(move || slices.unshadow(&s, &fold).map(|()| fold)).await?;
        self.slices.install(slice, run, &fold)?;
        crash_at("installed");
        self.durable().await?;
        crash_at("durable");
        let settled = self.settle_overlay(slice).await?;
        let spill = !fold.merge;
        // On a blocking thread: the fold's table is freed there, not on a worker.
        let (slices, s) = (self.slices.clone(), slice.clone());
        blocking(move || slices.settle_memory(&s, fold)).await?;
        tracing::info!(
            slice_start_us = slice.start,
            records,
            merge,
            spill,
            overlay_entries_removed = settled,
            took_ms = started.elapsed().as_millis() as u64,
            "a slice's records packed into a run"
        );
        Ok(records)
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

/// The work a debug build may be told to die in (see [`crash_point`]).
#[derive(Debug, Clone, Copy)]
pub(in crate::store) enum Crash {
    /// Sealing a slice into a run (`OUTBOXD_DEBUG_CRASH_IN_SEAL`).
    Seal,
    /// A restore writing the records it held back as runs (`OUTBOXD_DEBUG_CRASH_IN_RESTORE`).
    Restore,
}

/// Debug builds only (compiled out of release builds): the process ends at `step` of
/// `work` as a SIGKILL would leave it (no destructor, nothing flushed on the way
/// out), for the tests that a crash between any two steps loses nothing and runs no
/// `done` event again (tests/it/seal_crashes.rs, tests/it/restore_crashes.rs).
#[cfg(debug_assertions)]
pub(in crate::store) fn crash_point(work: Crash, step: &str) {
    let (var, what) = match work {
        Crash::Seal => ("OUTBOXD_DEBUG_CRASH_IN_SEAL", "seal"),
        Crash::Restore => ("OUTBOXD_DEBUG_CRASH_IN_RESTORE", "restore"),
    };
    if std::env::var(var).is_ok_and(|s| s == step) {
        eprintln!("crashing at the {what} step {step:?} ({var})");
        std::process::abort();
    }
}

#[cfg(not(debug_assertions))]
pub(in crate::store) fn crash_point(_work: Crash, _step: &str) {}

/// Runs store work that reads or writes many records off the async threads.
pub(in crate::store) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Io(std::io::Error::other(e)))?
}

