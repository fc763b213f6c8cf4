//! Why the engine stopped on its own: whatever path saw the failure (handling,
//! a restore, a standby pass, a catch-up), the first one is kept and the
//! service stops with it (docs/architecture.md, "The event path").

use std::sync::Arc;

use crate::kafka::changelog::TopicError;
use crate::kafka::KafkaError;
use crate::store::StoreError;

/// A failure after which nothing more may run: no event starts and no offset
/// moves. Cheap to clone: it is kept once and read by every task that asks.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Fatal {
    /// The local store failed (a failed fdatasync fails every later wait, so
    /// going on could only pretend durability).
    #[error("{0}")]
    Store(Arc<StoreError>),
    /// A changelog topic cannot serve its source topic: a person must act.
    #[error("{0}")]
    Changelog(Arc<TopicError>),
    /// The consumer that reads changelog partitions could not be created.
    #[error("creating the changelog restore consumer: {0}")]
    Restorer(Arc<KafkaError>),
    /// The Kafka consumer failed for good (a static member fenced by another
    /// with its `group.instance.id`, an authentication failure).
    #[error("the Kafka consumer failed and cannot go on: {0}")]
    Consumer(String),
    /// A restore task panicked.
    #[error("the restore of {partition} failed: {message}")]
    Panicked {
        /// The partition it was restoring.
        partition: String,
        /// What the panic said.
        message: String,
    },
}

impl From<StoreError> for Fatal {
    fn from(e: StoreError) -> Fatal {
        Fatal::Store(Arc::new(e))
    }
}
