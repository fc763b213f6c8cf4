//! The operations on the store itself: for `outboxd store …` when no service
//! holds it, and for the admin server of the service that does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use super::changelog::explain;
use super::{Rerun, StoreApi};
use crate::config::{Config, RawConfig};
use crate::engine::Executor;
use crate::store::{now_us, view, Role, State, Store, StoreError, StoreOptions};

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
}

/// One page of records in id order; `next`, when more follow, is the cursor
/// to ask for the next page with.
pub struct Page {
    /// The records' JSON views ([`view::record_json`]).
    pub records: Vec<Value>,
    /// The id to continue after; `None` on the last page.
    pub next: Option<String>,
}

impl Local {
    /// Reads and repairs that run no handler.
    pub fn new(store: Arc<Store>) -> Local {
        Local { store, exec: None, config: None }
    }

    /// Reads, and repairs written to the changelog that `config` names (if it is on there).
    pub(super) fn with_config(store: Arc<Store>, config: &Path) -> Local {
        Local { store, exec: None, config: Some(config.to_path_buf()) }
    }

    /// The service's store, and re-runs through its executor.
    pub fn with_executor(exec: Arc<Executor>) -> Local {
        Local { store: exec.store.clone(), exec: Some(exec), config: None }
    }

    /// Opened with the settings and the handlers of the whole config, to re-run events.
    pub(super) fn for_reruns(config: &Path, path: Option<&Path>) -> anyhow::Result<Local> {
        let config = Config::load(config)?;
        let opts = StoreOptions::command(&config.store, Role::StoreRetry);
        let path = path.map_or_else(|| config.store.path.clone(), Path::to_path_buf);
        let store = Arc::new(Store::open(&path, &opts)?);
        if let Some(changelog) = &config.store.changelog {
            super::changelog::attach(&store, &config.kafka, changelog)?;
        }
        let exec = Arc::new(Executor::new(config, store.clone())?);
        Ok(Local { store, exec: Some(exec), config: None })
    }

    /// Before a repair by `outboxd store`: the changelog of the config is attached.
    fn attach_changelog(&self) -> anyhow::Result<()> {
        match &self.config {
            Some(config) if !self.store.has_changelog() => super::changelog::attach_from(&self.store, config),
            _ => Ok(()),
        }
    }

    /// Counts every record (a full scan: blocking).
    pub fn stats(&self) -> Result<Value, StoreError> {
        Ok(view::stats_json(&self.store.stats()?))
    }

    /// One record's JSON view, if there is one.
    pub fn get(&self, id: &str) -> Result<Option<Value>, StoreError> {
        Ok(self.store.get(id)?.map(|r| view::record_json(&r)))
    }

    /// Up to `limit` records after the cursor `after` (blocking).
    pub fn page(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        // One more than the page tells whether there is a next page.
        let mut records = self.store.list_after(state, topic, after, limit.saturating_add(1))?;
        let next = if records.len() > limit {
            records.truncate(limit);
            records.last().map(crate::store::page_cursor)
        } else {
            None
        };
        Ok(Page { records: records.iter().map(view::record_json).collect(), next })
    }

    /// Calls `f` with each export line ([`view::export_line`]) in id order,
    /// without holding them all in memory (blocking). An error of `f` ends the scan.
    pub fn export<E: From<StoreError>>(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        mut f: impl FnMut(Value) -> Result<(), E>,
    ) -> Result<(), E> {
        self.store.scan(state, topic, |r| f(view::export_line(&self.store, &r)?))
    }

    /// Removes a record, so the event runs again when it is redelivered; answers the record as it was.
    pub async fn forget(&self, id: &str) -> Result<Value, StoreError> {
        Ok(view::record_json(&self.store.forget(id).await?))
    }

    /// Records the event done by hand; answers its record as it is now.
    pub async fn resolve_done(&self, id: &str) -> Result<Option<Value>, StoreError> {
        self.store.resolve_done(id, RESOLVED_DONE.to_owned()).await?;
        self.get(id)
    }

    /// Removes expired records now; answers how many.
    pub async fn gc(&self) -> Result<u64, StoreError> {
        self.store.gc(now_us()).await
    }
}

/// Runs a dead or parked event again from its stored copy, through `exec`
/// (the handler, its retries, dead letters).
pub async fn rerun(exec: &Executor, id: &str) -> Result<Rerun, StoreError> {
    Ok(match exec.rerun(id).await? {
        Some(r) => Rerun::Finished(view::record_json(&r)),
        None => Rerun::Redecoded,
    })
}

impl StoreApi for Local {
    fn source(&self) -> String {
        format!("store {}", self.store.path().display())
    }

    fn known_len(&self) -> Option<u64> {
        Some(self.store.len() as u64)
    }

    async fn stats(&self) -> anyhow::Result<Value> {
        Ok(Local::stats(self)?)
    }

    async fn get(&self, id: &str) -> anyhow::Result<Option<Value>> {
        Ok(Local::get(self, id)?)
    }

    async fn list(&self, state: Option<State>, topic: Option<&str>, limit: usize) -> anyhow::Result<Vec<Value>> {
        Ok(self.page(state, topic, None, limit)?.records)
    }

    async fn forget(&self, id: &str) -> anyhow::Result<Value> {
        self.attach_changelog()?;
        Local::forget(self, id).await.map_err(|e| explain(id, e))
    }

    async fn resolve_done(&self, id: &str) -> anyhow::Result<()> {
        self.attach_changelog()?;
        Local::resolve_done(self, id).await.map_err(|e| explain(id, e))?;
        Ok(())
    }

    async fn rerun(&self, id: &str) -> anyhow::Result<Rerun> {
        let Some(exec) = &self.exec else {
            bail!("re-running {id:?} needs the handlers: the store was opened without them");
        };
        rerun(exec, id).await.map_err(|e| explain(id, e)).with_context(|| format!("retrying {id}"))
    }

    async fn gc(&self) -> anyhow::Result<u64> {
        Ok(Local::gc(self).await?)
    }

    async fn export(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        out: &mut dyn std::io::Write,
        progress: &indicatif::ProgressBar,
    ) -> anyhow::Result<u64> {
        let mut lines = 0;
        Local::export(self, state, topic, |line| -> anyhow::Result<()> {
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
pub(super) fn open_store(config: &Path, path: Option<&Path>) -> anyhow::Result<Store> {
    let (path, retention) = match path {
        Some(p) => (p.to_path_buf(), None),
        None => store_section(config)?,
    };
    if !path.exists() {
        bail!("no store at {} (nothing has run with this config yet?)", path.display());
    }
    let opts = StoreOptions::inspect(retention);
    Ok(Store::open(&path, &opts)?)
}

/// Only `[store]` is needed: `${VAR}`s elsewhere need not be set for `store` commands.
fn store_section(config: &Path) -> anyhow::Result<(PathBuf, Option<Duration>)> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("reading {} (or pass --path to the store directory)", config.display()))?;
    let raw: RawConfig = toml::from_str(&text).with_context(|| format!("invalid config {}", config.display()))?;
    let retention =
        raw.store.retention.as_deref().map(humantime::parse_duration).transpose().context("store.retention")?;
    Ok((raw.store.path, retention))
}
