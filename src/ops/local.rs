//! The operations on the store itself: for `outboxd store …` when no service
//! holds it, and for the admin server of the service that does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::audit::{self, Actor};
use super::changelog::explain;
use super::{OpsError, Rerun, StoreApi};
use crate::config::{Config, RawConfig};
use crate::engine::Executor;
use crate::store::view;
use crate::store::{now_us, AuditAction, Record, Role, State, Store, StoreError, StoreOptions};
use crate::wire::{AuditPage, AuditView, ExportLine, GcView, PageView, RecordView, ReplayView, StatsView};

/// The note a record resolved by hand keeps as its outcome.
const RESOLVED_DONE: &str = "resolved by hand: done";

/// The store itself, and the executor that re-runs its events when there is one.
#[derive(Clone)]
pub struct Local {
    store: Arc<Store>,
    /// Built from the config the store was opened with: present exactly when
    /// re-runs are possible (the service's, or a command that needs handlers).
    exec: Option<Arc<Executor>>,
    /// The config file whose `[store.changelog]` a repair made here is written
    /// to, attached at the first repair (reads need no brokers). `None`: the
    /// service's store (its changelog is attached), or a store named by `--path`
    /// without a config file.
    config: Option<PathBuf>,
    /// Reads replayed events' messages again from Kafka.
    rereads: super::Rereads,
}

impl Local {
    /// Reads and repairs that run no handler.
    pub fn new(store: Arc<Store>) -> Local {
        Local { store, exec: None, config: None, rereads: Default::default() }
    }

    /// Reads, and repairs written to the changelog that `config` names (if it is on there).
    pub(super) fn with_config(store: Arc<Store>, config: &Path) -> Local {
        Local { store, exec: None, config: Some(config.to_path_buf()), rereads: Default::default() }
    }

    /// The service's store, and re-runs through its executor.
    pub fn with_executor(exec: Arc<Executor>) -> Local {
        Local { store: exec.store.clone(), exec: Some(exec), config: None, rereads: Default::default() }
    }

    /// Opened with the settings and the handlers of the whole config, to re-run events.
    pub(super) fn for_reruns(config: &Path, path: Option<&Path>) -> Result<Local, OpsError> {
        let config = Config::load(config).map_err(OpsError::setup)?;
        let opts = StoreOptions::command(&config.store, Role::StoreRetry);
        let path = path.map_or_else(|| config.store.path.clone(), Path::to_path_buf);
        let store = Arc::new(Store::open(&path, &opts)?);
        if let Some(changelog) = &config.store.changelog {
            super::changelog::attach(&store, &config.kafka, changelog)?;
        }
        let exec = Arc::new(Executor::new(config, store.clone()).map_err(OpsError::setup)?);
        Ok(Local { store, exec: Some(exec), config: None, rereads: Default::default() })
    }

    /// Before a repair by `outboxd store`: the changelog of the config is attached.
    fn attach_changelog(&self) -> Result<(), OpsError> {
        match &self.config {
            Some(config) if !self.store.has_changelog() => super::changelog::attach_from(&self.store, config),
            _ => Ok(()),
        }
    }

    /// Counts every record (a full scan: blocking). In the running service, from
    /// the counts the store keeps instead, without reading a record: a request never
    /// reads the whole store.
    pub fn stats(&self) -> Result<StatsView, StoreError> {
        let reads = self.store.reads();
        let stats = if reads.serves() { reads.kept_stats()? } else { reads.stats()? };
        Ok(StatsView::from(&stats))
    }

    /// One record's view (with its held chain, if it is in one), if there is one.
    pub fn get(&self, id: &str) -> Result<Option<RecordView>, StoreError> {
        Ok(self.store.reads().get(id)?.map(|r| view::record_view(&self.store, &r, view::CHAIN_SHOWN)))
    }

    /// Up to `limit` records after the cursor `after` (blocking); the page's
    /// `next`, when more follow, is the cursor to ask for the next page with.
    pub fn page(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PageView, StoreError> {
        self.page_within(state, topic, after, limit, None)
    }

    /// Like [`Local::page`], examining at most `budget` records (when given): a page
    /// that stops there is `partial`, with `next` where to go on.
    pub fn page_within(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
        budget: Option<usize>,
    ) -> Result<PageView, StoreError> {
        // One more than the page tells whether there is a next page.
        let listed = self.store.reads().list_page(state, topic, after, limit.saturating_add(1), budget)?;
        let mut records = listed.records;
        let (next, partial) = if records.len() > limit {
            records.truncate(limit);
            (records.last().map(crate::store::page_cursor), false)
        } else {
            (listed.resume.clone(), listed.resume.is_some())
        };
        let records = records.iter().map(|r| view::record_view(&self.store, r, 0)).collect();
        Ok(PageView { records, next, partial })
    }

    /// Calls `f` with each export line ([`view::export_line`]) in id order,
    /// without holding them all in memory (blocking). An error of `f` ends the scan.
    pub fn export<E: From<StoreError>>(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        mut f: impl FnMut(ExportLine) -> Result<(), E>,
    ) -> Result<(), E> {
        self.store.reads().scan(state, topic, |r| f(view::export_line(&self.store, &r)?))
    }

    /// The records of `topic` that `keep` takes, as views (blocking: a scan of the
    /// topic's records, holding only those taken).
    pub fn matching(&self, topic: &str, mut keep: impl FnMut(&Record) -> bool) -> Result<Vec<RecordView>, StoreError> {
        let mut taken = Vec::new();
        self.store.reads().scan(None, Some(topic), |r| -> Result<(), StoreError> {
            if keep(&r) {
                taken.push(view::record_view(&self.store, &r, 0));
            }
            Ok(())
        })?;
        Ok(taken)
    }

    /// Removes a record, so the event runs again when it is redelivered; answers the
    /// record as it was. Audited under `actor`, also when it fails or is refused.
    pub async fn forget_by(&self, id: &str, actor: &Actor) -> Result<RecordView, StoreError> {
        let event = audit::event(&self.store, id);
        let forgot = self.store.repairs().forget(id).await;
        let outcome = forgot.as_ref().map_or_else(|e| audit::failed(e), |_| "done".to_owned());
        audit::record(&self.store, actor, AuditAction::Forget, vec![event], outcome).await;
        Ok(RecordView::from(&forgot?))
    }

    /// Records the event done by hand; answers its record as it is now. Audited
    /// under `actor`, also when it fails or is refused.
    pub async fn resolve_done_by(&self, id: &str, actor: &Actor) -> Result<Option<RecordView>, StoreError> {
        let event = audit::event(&self.store, id);
        let resolved = self.store.repairs().resolve_done(id, RESOLVED_DONE.to_owned()).await;
        let outcome = resolved.as_ref().map_or_else(|e| audit::failed(e), |()| "done".to_owned());
        audit::record(&self.store, actor, AuditAction::Resolve, vec![event], outcome).await;
        resolved?;
        self.get(id)
    }

    /// Removes expired records now; answers how many. Audited under `actor`.
    pub async fn gc_by(&self, actor: &Actor) -> Result<GcView, StoreError> {
        let removed = self.store.repairs().gc(now_us()).await;
        let outcome = removed.as_ref().map_or_else(|e| audit::failed(e), |n| format!("removed {n} expired record(s)"));
        audit::record(&self.store, actor, AuditAction::Gc, Vec::new(), outcome).await;
        Ok(GcView { removed: removed? })
    }

    /// A repair `actor` may not make (its credential may only read) was refused:
    /// audited with why, like a repair that failed. `ids`: the events it named.
    pub async fn refused_by(&self, action: AuditAction, ids: &[String], actor: &Actor, why: &str) {
        let events = ids.iter().map(|id| audit::event(&self.store, id)).collect();
        audit::record(&self.store, actor, action, events, format!("refused: {why}")).await;
    }

    /// Up to `limit` audit entries, newest first, older than the cursor `before`.
    pub fn audit(&self, before: Option<&str>, limit: usize) -> Result<AuditPage, StoreError> {
        let (entries, next) = self.store.audit().list(before, limit)?;
        Ok(AuditPage { entries: entries.iter().map(AuditView::from).collect(), next })
    }

    /// Every audit entry naming event `id`, newest first.
    pub fn audit_of(&self, id: &str) -> Result<Vec<AuditView>, StoreError> {
        Ok(self.store.audit().for_event(id)?.iter().map(AuditView::from).collect())
    }
}

/// Runs a dead or parked event again from its stored copy, through `exec`
/// (the handler, its retries, dead letters). Audited under `actor` with what it
/// came to, also when it fails or is refused.
pub async fn rerun_by(exec: &Executor, id: &str, actor: &Actor) -> Result<Rerun, StoreError> {
    let event = audit::event(&exec.store, id);
    let rerun = match exec.rerun(id).await {
        Ok(Some(r)) => Ok(Rerun::Finished(Box::new(RecordView::from(&r)))),
        Ok(None) => Ok(Rerun::Redecoded),
        Err(e) => Err(e),
    };
    let outcome = rerun.as_ref().map_or_else(|e| audit::failed(e), audit::rerun_outcome);
    audit::record(&exec.store, actor, AuditAction::Retry, vec![event], outcome).await;
    rerun
}

impl StoreApi for Local {
    fn source(&self) -> String {
        format!("store {}", self.store.path().display())
    }

    fn known_len(&self) -> Option<u64> {
        Some(self.store.reads().len() as u64)
    }

    async fn stats(&self) -> Result<StatsView, OpsError> {
        Ok(Local::stats(self)?)
    }

    async fn get(&self, id: &str) -> Result<Option<RecordView>, OpsError> {
        Ok(Local::get(self, id)?)
    }

    async fn list(&self, state: Option<State>, topic: Option<&str>, limit: usize) -> Result<Vec<RecordView>, OpsError> {
        Ok(self.page(state, topic, None, limit)?.records)
    }

    async fn forget(&self, id: &str, actor: &Actor) -> Result<RecordView, OpsError> {
        self.attach_changelog()?;
        self.forget_by(id, actor).await.map_err(|e| explain(id, e))
    }

    async fn resolve_done(&self, id: &str, actor: &Actor) -> Result<(), OpsError> {
        self.attach_changelog()?;
        self.resolve_done_by(id, actor).await.map_err(|e| explain(id, e))?;
        Ok(())
    }

    async fn rerun(&self, id: &str, actor: &Actor) -> Result<Rerun, OpsError> {
        let Some(exec) = &self.exec else {
            return Err(OpsError::NoHandlers(id.to_owned()));
        };
        rerun_by(exec, id, actor)
            .await
            .map_err(|e| OpsError::Rerun { id: id.to_owned(), error: Box::new(explain(id, e)) })
    }

    async fn replay(&self, record: &RecordView, new_key: Option<&str>, actor: &Actor) -> Result<ReplayView, OpsError> {
        let id = &record.event_id;
        let Some(exec) = &self.exec else {
            return Err(OpsError::NoHandlers(id.clone()));
        };
        let suffix = new_key.map(super::new_key_suffix).transpose()?;
        super::replay_by(exec, &self.rereads, super::scope_of(record), id, suffix.as_deref(), actor).await
    }

    async fn replay_window(&self, window: &super::Window) -> Result<Vec<RecordView>, OpsError> {
        Ok(super::replay::taken_here(self, window)?)
    }

    async fn gc(&self, actor: &Actor) -> Result<GcView, OpsError> {
        Ok(self.gc_by(actor).await?)
    }

    async fn audit(&self, before: Option<&str>, limit: usize) -> Result<AuditPage, OpsError> {
        Ok(Local::audit(self, before, limit)?)
    }

    async fn audit_of(&self, id: &str) -> Result<Vec<AuditView>, OpsError> {
        Ok(Local::audit_of(self, id)?)
    }

    async fn export(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        out: &mut dyn std::io::Write,
        progress: &indicatif::ProgressBar,
    ) -> Result<u64, OpsError> {
        let mut lines = 0;
        Local::export(self, state, topic, |line| -> Result<(), OpsError> {
            writeln!(out, "{line}")?;
            lines += 1;
            progress.inc(1);
            Ok(())
        })?;
        Ok(lines)
    }
}

/// Opens the store for a command (small cache, no group-commit window, fsync),
/// refusing a directory where nothing has run yet.
pub(super) fn open_store(config: &Path, path: Option<&Path>) -> Result<Store, OpsError> {
    let (path, retention) = match path {
        Some(p) => (p.to_path_buf(), None),
        None => store_section(config)?,
    };
    if !path.exists() {
        return Err(OpsError::NoStore(path));
    }
    let opts = StoreOptions::inspect(retention);
    Ok(Store::open(&path, &opts)?)
}

/// Only `[store]` is needed: `${VAR}`s elsewhere need not be set for `store` commands.
fn store_section(config: &Path) -> Result<(PathBuf, Option<Duration>), OpsError> {
    let reading = format!("reading {} (or pass --path to the store directory)", config.display());
    let text = std::fs::read_to_string(config).map_err(OpsError::config(reading))?;
    let raw: RawConfig =
        toml::from_str(&text).map_err(OpsError::config(format!("invalid config {}", config.display())))?;
    let retention = raw
        .store
        .retention
        .as_deref()
        .map(humantime::parse_duration)
        .transpose()
        .map_err(OpsError::config("store.retention"))?;
    Ok((raw.store.path, retention))
}
