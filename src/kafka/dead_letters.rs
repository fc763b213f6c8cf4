//! The dead-letter producer: the original key, value and headers plus the reason.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::health::ClientCtx;
use super::KafkaError;
use crate::config::KafkaConfig;
use crate::event::RawMessage;

/// Why an event went to the dead-letter topic, added to the message as `outboxd.*` headers.
pub struct DeadLetterInfo<'a> {
    /// Why it failed: the `outboxd.error` header.
    pub error: &'a str,
    /// Handler executions so far: the `outboxd.attempts` header.
    pub attempts: u32,
}

/// Produces dead letters: the original key, value and headers plus the reason.
pub struct DeadLetters {
    producer: FutureProducer<ClientCtx>,
}

impl DeadLetters {
    /// A producer to `kafka.brokers`, with the connection and security settings of `kafka.options`.
    pub fn build(kafka: &KafkaConfig) -> Result<DeadLetters, KafkaError> {
        let producer =
            super::options::dead_letter_producer(kafka).create_with_context(ClientCtx::new(kafka, "dead_letters"))?;
        Ok(DeadLetters { producer })
    }

    /// Sends and waits for the broker's acknowledgement; returns `topic/partition@offset`.
    pub async fn send(&self, topic: &str, msg: &RawMessage, info: &DeadLetterInfo<'_>) -> Result<String, DlqError> {
        let mut headers = OwnedHeaders::new_with_capacity(msg.headers.len() + 6);
        for (k, v) in &msg.headers {
            headers = headers.insert(Header { key: k, value: v.as_deref() });
        }
        let failed_at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let attempts = info.attempts.to_string();
        let partition = msg.partition.to_string();
        let offset = msg.offset.to_string();
        for (k, v) in [
            ("outboxd.error", info.error),
            ("outboxd.attempts", attempts.as_str()),
            ("outboxd.source.topic", msg.topic.as_str()),
            ("outboxd.source.partition", partition.as_str()),
            ("outboxd.source.offset", offset.as_str()),
            ("outboxd.failed_at", failed_at.as_str()),
        ] {
            headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(key) = &msg.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &msg.value {
            record = record.payload(value.as_slice());
        }
        match self.producer.send(record, rdkafka::util::Timeout::Never).await {
            Ok(delivery) => Ok(format!("{topic}/{}@{}", delivery.partition, delivery.offset)),
            Err((error, _)) => {
                use rdkafka::types::RDKafkaErrorCode as C;
                let rejected = matches!(
                    error.rdkafka_error_code(),
                    Some(C::MessageSizeTooLarge | C::InvalidRecord | C::InvalidMessage | C::InvalidMessageSize)
                );
                Err(if rejected {
                    DlqError::Rejected(error.to_string())
                } else {
                    DlqError::Transient(error.to_string())
                })
            }
        }
    }
}

/// Why a dead letter was not produced.
#[derive(Debug)]
pub enum DlqError {
    /// Worth retrying (broker down, leader moving, ...): the offset waits.
    Transient(String),
    /// The broker will never take this message (e.g. larger than the topic allows).
    Rejected(String),
}
