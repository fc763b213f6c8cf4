//! What a request to the brokers, or the creation of a client, fails with: the
//! one error type of the Kafka edge, so that callers outside it never see
//! rdkafka's types and branch on what failed rather than on text.

use rdkafka::error::KafkaError as ClientError;
use rdkafka::types::RDKafkaErrorCode;

/// A Kafka client could not be created, or the brokers did not answer a request
/// as asked. Every variant is about the brokers or the client settings, never
/// about the local store: a caller may try again later.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// librdkafka failed (creating a client, a request, a read).
    #[error("{0}")]
    Client(#[from] ClientError),
    /// A request about one partition failed.
    #[error("{topic}/{partition}: {error}")]
    Partition {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What librdkafka said.
        error: ClientError,
    },
    /// The brokers refused an admin request (`what` names it).
    #[error("{what}: {code}")]
    Refused {
        /// The request, as a person reads it ("creating changelog topic t").
        what: String,
        /// The brokers' answer.
        code: RDKafkaErrorCode,
    },
    /// The brokers' answer lacks the topic it was about.
    #[error("{0}")]
    Missing(String),
    /// `kafka.options` has a setting librdkafka rejects.
    #[error("kafka.options: librdkafka rejects them: {0}")]
    Options(ClientError),
    /// The blocking task that made the request did not finish (a panic).
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
}
