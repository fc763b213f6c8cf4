//! What a store operation fails with, in the cases callers tell apart: the
//! store's own errors (held by another process, a record in another state), no
//! such record, the running service's admin API, and a repair that changed
//! nothing. Each variant's text is what `outboxd store …` prints, its chain
//! (`source`) joined by `: `.

use std::path::PathBuf;

use super::client::AdminError;
use crate::store::StoreError;

/// An error of a step callers do not branch on (reading the config, building
/// handlers), with its own chain of causes.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The store failed or refused: held by another process ([`StoreError::Locked`]),
    /// the record in another state, no stored copy of its message, I/O.
    #[error(transparent)]
    Store(StoreError),
    /// No record of this event id (in the store, or in the running service's).
    #[error("no record for event {0:?}")]
    NotFound(String),
    /// Asking the running service failed: not reached, refused with a status
    /// ([`AdminError::Status`]), or an answer of another shape.
    #[error(transparent)]
    Remote(#[from] AdminError),
    /// There is no store directory where the config says.
    #[error("no store at {} (nothing has run with this config yet?)", .0.display())]
    NoStore(PathBuf),
    /// A repair from the command line whose changelog entry the brokers did not
    /// take: the store is as it was.
    #[error(
        "{id}: nothing was changed in the store (a repair is written to the changelog first, and the \
         brokers did not take it); run the command again when they answer"
    )]
    NothingChanged {
        /// The event id.
        id: String,
        /// The changelog's error.
        #[source]
        error: StoreError,
    },
    /// A re-run asked of a store opened without the handlers.
    #[error("re-running {0:?} needs the handlers: the store was opened without them")]
    NoHandlers(String),
    /// Re-running this event on the store itself failed.
    #[error("retrying {id}")]
    Rerun {
        /// The event id.
        id: String,
        /// Why.
        #[source]
        error: Box<OpsError>,
    },
    /// Reading a replayed record's source message again from Kafka failed.
    #[error("reading {topic}/{partition}@{offset} again from Kafka")]
    Reread {
        /// The source topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The message's offset.
        offset: i64,
        /// What the client said.
        #[source]
        error: BoxError,
    },
    /// A replay's new-key token that is not 1 to 32 letters, digits, `-` or `_`.
    #[error("new_key {0:?}: 1 to 32 letters, digits, - or _")]
    BadNewKey(String),
    /// Replaying this event failed.
    #[error("replaying {id}")]
    Replay {
        /// The event id.
        id: String,
        /// Why.
        #[source]
        error: Box<OpsError>,
    },
    /// The config could not be read or is invalid, or the changelog producer could
    /// not be built; `what` says which.
    #[error("{what}")]
    Config {
        /// What was being done, e.g. `reading outboxd.toml`.
        what: String,
        /// Why it failed.
        #[source]
        error: BoxError,
    },
    /// Loading the whole config or building the handlers for re-runs failed (the
    /// error says where).
    #[error(transparent)]
    Setup(BoxError),
    /// Writing an export out failed.
    #[error(transparent)]
    Write(#[from] std::io::Error),
    /// A repair's reason is longer than the audit keeps.
    #[error("the reason has {chars} characters; at most {} are kept in the audit", super::audit::MAX_REASON_CHARS)]
    ReasonTooLong {
        /// Its length in characters.
        chars: usize,
    },
    /// A repair's reason has control characters (a line break, a terminal escape).
    #[error("the reason must be one line of text, without control characters")]
    ReasonNotText,
}

impl From<StoreError> for OpsError {
    /// The store's `NotFound` is [`OpsError::NotFound`], so callers look in one place.
    fn from(e: StoreError) -> OpsError {
        match e {
            StoreError::NotFound(id) => OpsError::NotFound(id),
            other => OpsError::Store(other),
        }
    }
}

impl OpsError {
    /// `what` failed with `error`: a config step's error.
    pub(super) fn config<E: Into<BoxError>>(what: impl Into<String>) -> impl FnOnce(E) -> OpsError {
        let what = what.into();
        move |error| OpsError::Config { what, error: error.into() }
    }

    /// A step that names its own failure (`Config::load`, building the executor).
    pub(super) fn setup(error: impl Into<BoxError>) -> OpsError {
        OpsError::Setup(error.into())
    }
}
