//! The store's errors: its own failures, and answers to what a person asked for.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::disk::record::State;

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
    Changelog(SendError),
}

/// Why a changelog entry will never be acknowledged (the store then fails the
/// write: no offset may move past it).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The changelog topic or partition is not there: deleted under the service.
    #[error(
        "changelog topic {changelog_topic} (partition {partition}) does not exist: was it deleted? Its records are \
         gone from Kafka; outboxd stopped rather than go on without them. Restart to recreate it empty (instances \
         that never had its records no longer know those events as handled)"
    )]
    Gone {
        /// The changelog topic.
        changelog_topic: String,
        /// Its partition.
        partition: i32,
    },
    /// The brokers refused the entry for good (no resend can cure it).
    #[error("{changelog_topic}/{partition}: {error}")]
    Refused {
        /// The changelog topic.
        changelog_topic: String,
        /// Its partition.
        partition: i32,
        /// What the client said.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No acknowledgement came within the bound a command sets.
    #[error("no acknowledgement from the brokers within {within:?} (store.changelog.delivery_timeout)")]
    Unanswered {
        /// The bound (`store.changelog.delivery_timeout`).
        within: Duration,
    },
    /// The send ended without an answer (it panicked, or the runtime stopped it).
    #[error("the changelog send ended without an answer from the brokers")]
    Abandoned,
}

