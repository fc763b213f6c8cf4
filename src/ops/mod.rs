//! The store operations a person runs (stats, get, list, forget, resolve,
//! re-run, gc, export), written once against [`StoreApi`]. Its two sides:
//! [`Local`] works on the store itself and re-runs events through the
//! [`Executor`](crate::engine::Executor); [`Remote`] asks a running service
//! through its admin API. `outboxd store …` gets one from [`open`]; the admin
//! server answers `/v1` with [`Local`]. Answers are the typed views of
//! [`crate::wire`] (the admin API's wire format), so both sides print
//! alike; failures are an [`OpsError`].
//!
//! `replay` runs a window of final events again from their source messages.
//!
//! Every repair (forget, resolve, re-run, replay, gc) names its [`Actor`] (who, and why) and
//! leaves an entry in the store's audit, whatever came of it (`audit`); the
//! service's admin API names the caller by its credential.
//!
//! Repairs (forget, resolve, re-run) reach the changelog wherever they are made:
//! the service's store has its changelog attached, and `outboxd store` on a
//! stopped service's store attaches the same producer (`changelog`) when
//! `[store.changelog]` is on, failing with nothing changed when the brokers do not answer.

mod audit;
mod changelog;
mod client;
mod error;
mod local;
mod remote;
mod replay;

use std::path::Path;

use crate::store::{Owner, State, StoreError};
use crate::wire::{AuditPage, AuditView, GcView, RecordView, RedecodedView, ReplayView, RetryView, StatsView};

pub use audit::Actor;
pub use changelog::attach as attach_changelog;
pub use client::AdminClient;
#[cfg(feature = "internals")]
pub use client::AdminError;
pub use error::OpsError;
pub use local::{rerun_by, Local};
pub use remote::Remote;
pub use replay::{
    new_key_suffix, new_key_token, replay_by, scope_of, select, select_here, Rereads, Window,
};

/// What a re-run came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Rerun {
    /// It ran and ended in this record: `done`, or `dead` or `parked` again.
    Finished(Box<RecordView>),
    /// The stored message of an undecodable record now decodes: it ran, and
    /// is recorded under its decoded event id.
    Redecoded,
}

impl Rerun {
    /// The answer of `/v1/retry` for event `id`.
    pub fn to_view(&self, id: &str) -> RetryView {
        match self {
            Rerun::Finished(record) => RetryView::Finished(record.clone()),
            Rerun::Redecoded => RetryView::Redecoded(RedecodedView::new(id)),
        }
    }
}

impl From<RetryView> for Rerun {
    /// Reads an answer of `/v1/retry`.
    fn from(answer: RetryView) -> Rerun {
        match answer {
            RetryView::Finished(record) => Rerun::Finished(record),
            RetryView::Redecoded(_) => Rerun::Redecoded,
        }
    }
}

/// The store operations, on the store itself ([`Local`]) or through a running
/// service ([`Remote`]). Answers are the views of [`crate::wire`].
// Callers are generic over the implementation and await on their own task;
// no caller needs the futures to be `Send`, so the `async fn`s need no bound.
#[allow(async_fn_in_trait)]
pub trait StoreApi {
    /// Where the answers come from, as `store stats` names it.
    fn source(&self) -> String;
    /// Records in the store, when known without a scan (for a progress bar).
    fn known_len(&self) -> Option<u64>;
    /// Counts per state, duplicates suppressed, size on disk, oldest/newest.
    async fn stats(&self) -> Result<StatsView, OpsError>;
    /// The handlers' circuits of the running service; `None` on the store itself
    /// (no service runs, so no receiver is being judged).
    async fn handlers(&self) -> Result<Option<Vec<crate::engine::CircuitView>>, OpsError> {
        Ok(None)
    }
    /// One record, if there is one.
    async fn get(&self, id: &str) -> Result<Option<RecordView>, OpsError>;
    /// Up to `limit` records in id order (`usize::MAX`: all), optionally of one state and topic.
    async fn list(&self, state: Option<State>, topic: Option<&str>, limit: usize) -> Result<Vec<RecordView>, OpsError>;
    /// Removes a record, so the event runs again when it is redelivered; answers the record as it was.
    /// Each repair is audited under `actor` (through a running service: under the
    /// caller's credential, with `actor`'s reason).
    async fn forget(&self, id: &str, actor: &Actor) -> Result<RecordView, OpsError>;
    /// Records a parked (or dead) event `done` by hand: it will not run again.
    async fn resolve_done(&self, id: &str, actor: &Actor) -> Result<(), OpsError>;
    /// Runs a dead or parked event again from its stored copy, through its handler.
    async fn rerun(&self, id: &str, actor: &Actor) -> Result<Rerun, OpsError>;
    /// Runs the final event of `record` again from its source message, read again
    /// from Kafka, under that record; `new_key` (`--new-key`) makes the idempotency
    /// key it sends a new one ([`new_key_suffix`]).
    async fn replay(&self, record: &RecordView, new_key: Option<&str>, actor: &Actor) -> Result<ReplayView, OpsError>;
    /// The records `window` takes (in any order), keeping only those while the
    /// topic's records are read ([`select`] orders them).
    async fn replay_window(&self, window: &Window) -> Result<Vec<RecordView>, OpsError>;
    /// Removes expired done/dead records now; answers how many.
    async fn gc(&self, actor: &Actor) -> Result<GcView, OpsError>;
    /// Up to `limit` audit entries, newest first, older than the cursor `before`
    /// (an earlier page's `next`).
    async fn audit(&self, before: Option<&str>, limit: usize) -> Result<AuditPage, OpsError>;
    /// Every audit entry naming event `id`, newest first.
    async fn audit_of(&self, id: &str) -> Result<Vec<AuditView>, OpsError>;
    /// Writes records (with the message copies of dead and parked events) as
    /// JSON Lines to `out`, moving `progress` along; answers how many.
    async fn export(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        out: &mut dyn std::io::Write,
        progress: &indicatif::ProgressBar,
    ) -> Result<u64, OpsError>;
}

/// What a command needs of the config besides the store's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Reads and repairs that run no handler: only `[store]` is read, so
    /// `${VAR}`s elsewhere in the config need not be set.
    Records,
    /// Re-runs: the whole config (handlers, dead-letter topics).
    Handlers,
}

/// The store, opened here, or the running service that holds it.
pub enum Opened {
    /// No service holds the store: opened here.
    Local(Local),
    /// A running service holds it: asked through its admin API.
    Remote(Remote),
}

/// Opens the store at `path`, or at `[store] path` of `config`; when a running
/// outboxd holds it and recorded its admin address, goes through that service
/// instead, with the token it wrote next to the address (when this user may
/// read the owner file).
pub fn open(config: &Path, path: Option<&Path>, needs: Needs) -> Result<Opened, OpsError> {
    match local::open_store(config, path) {
        Ok(store) => match needs {
            // Repairs read `[kafka]` and `[store.changelog]` of the config; with
            // `--path` and no config file, the store alone.
            Needs::Records if path.is_some() && !config.exists() => Ok(Opened::Local(Local::new(store.into()))),
            Needs::Records => Ok(Opened::Local(Local::with_config(store.into(), config))),
            Needs::Handlers => {
                // Opened again with the config's settings and handlers.
                drop(store);
                Ok(Opened::Local(Local::for_reruns(config, path)?))
            }
        },
        Err(OpsError::Store(StoreError::Locked { path, admin: Some(addr), .. })) => {
            // The token of the run that recorded this address, not of a later one.
            let token = Owner::read(&path).filter(|o| o.admin.as_ref() == Some(&addr)).and_then(|o| o.admin_token);
            Ok(Opened::Remote(Remote::new(AdminClient::new(&addr, token)?)))
        }
        Err(e) => Err(e),
    }
}

/// The ids of every dead record (of one topic, when named).
pub async fn dead_ids(api: &impl StoreApi, topic: Option<&str>) -> Result<Vec<String>, OpsError> {
    let dead = api.list(Some(State::Dead), topic, usize::MAX).await?;
    Ok(dead.into_iter().map(|r| r.event_id).collect())
}

#[cfg(test)]
mod tests;
