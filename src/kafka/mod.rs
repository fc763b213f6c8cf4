//! The Kafka edge, and the only code that uses rdkafka: the consumer (its
//! rebalance handling, storing and committing offsets), the dead-letter
//! producer, the changelog topics, producer and restore reader, the reader of single
//! source messages for replays (`reread`), the client options,
//! and the brokers' reachability that every client reports to (`health`: one warning
//! when they are away, summaries, one line when they are back). The engine sees messages as
//! [`RawMessage`](crate::event::RawMessage)s through [`Source`] (rdkafka-free: the
//! engine's tests implement it in memory) and uses the small types here.

pub mod changelog;
mod consumer;
mod dead_letters;
mod error;
mod group;
mod health;
mod options;
mod reread;
mod restore;
mod source;

#[cfg(feature = "internals")]
pub use consumer::to_raw;
pub use consumer::{Consumer, Tracker};
pub use dead_letters::{DeadLetterInfo, DeadLetters, DlqError};
pub use error::KafkaError;
pub use group::{Group, GroupView};
pub use health::{BrokerHealth, Reachability};
pub use options::validate_options;
pub use reread::{Reread, Rereader};
pub use restore::Restorer;
#[cfg(any(test, feature = "internals"))]
pub use source::{assigned, revoked};
pub use source::{RecvError, Source};
