//! The Kafka edge, and the only code that uses rdkafka: the consumer (its
//! rebalance handling, storing and committing offsets), the dead-letter
//! producer, the changelog topics, producer and restore reader, and the client options. The engine sees messages as
//! [`RawMessage`](crate::event::RawMessage)s and uses the small types here.

pub mod changelog;
mod consumer;
mod dead_letters;
mod error;
mod options;
mod restore;

pub use consumer::{to_raw, Consumer, RecvError, Tracker};
pub use dead_letters::{DeadLetterInfo, DeadLetters, DlqError};
pub use error::KafkaError;
pub use options::validate_options;
pub use restore::{Batch, Reading, Restorer};
