//! Reading a changelog partition for a restore (or a standby replica): a consumer
//! assigned by hand (it never joins the group nor commits), read from a checkpoint
//! up to the end offset seen when the read began. Blocking calls: run it off the runtime's
//! workers.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::health::{is_connection_error, ClientCtx};
use super::KafkaError;
use crate::config::KafkaConfig;
use crate::store::changelog::{mac, ChangelogRecord, MacHeader};

/// How long one metadata or watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A consumer of changelog partitions, one at a time, assigned by hand.
pub struct Restorer {
    consumer: BaseConsumer<ClientCtx>,
}

/// One changelog partition assigned to a [`Restorer`] ([`Restorer::start`]):
/// unassigned when dropped, however the read ends (at the end, left off, or
/// failed), so that no later read finds a partition still assigned from before.
pub struct Reading<'a> {
    restorer: &'a Restorer,
}

/// One batch read from the assigned changelog partition.
pub struct Batch {
    /// In offset order.
    pub records: Vec<ChangelogRecord>,
    /// The partition's end was reached (every offset below the end seen at the start is read).
    pub at_end: bool,
}

impl Restorer {
    /// A consumer that never joins the group nor commits.
    pub fn build(kafka: &KafkaConfig, prefetch_bytes: u64) -> Result<Restorer, KafkaError> {
        let consumer = super::options::restore_consumer(kafka, prefetch_bytes)
            .create_with_context(ClientCtx::new(kafka, "restore"))?;
        Ok(Restorer { consumer })
    }

    /// The first and the end offset of a changelog partition now.
    pub fn range(&self, topic: &str, partition: i32) -> Result<(i64, i64), KafkaError> {
        self.consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT).map_err(|error| KafkaError::Partition {
            topic: topic.to_owned(),
            partition,
            error,
        })
    }

    /// The partition count of every topic on the cluster (one metadata request).
    pub fn partition_counts(&self) -> Result<BTreeMap<String, i32>, KafkaError> {
        let metadata = self.consumer.fetch_metadata(None, REQUEST_TIMEOUT)?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
            .collect())
    }

    /// Reads `topic`/`partition` from `from` on (replacing what was assigned),
    /// until the returned guard is dropped.
    pub fn start(&self, topic: &str, partition: i32, from: i64) -> Result<Reading<'_>, KafkaError> {
        let at = |error| KafkaError::Partition { topic: topic.to_owned(), partition, error };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(from)).map_err(at)?;
        self.consumer.assign(&tpl).map_err(at)?;
        Ok(Reading { restorer: self })
    }
}

/// Records a batch makes room for at once (its `max`, up to this).
const PREALLOCATED_RECORDS: usize = 16_384;

impl Reading<'_> {
    /// Up to `max` records below `end` and about `max_bytes` of keys and values
    /// (the record that reaches it is the last), waiting at most `wait` for the first.
    ///
    /// A connection error the poll hands over (a broker down, all of them down) is
    /// librdkafka telling, not giving up: it reconnects by itself (and the client's
    /// context has reported it to the brokers' health). So the read goes on until
    /// `wait` is over. Returning it as a failure made every restore attempt end at
    /// once on the error queued while the brokers were away, before the client had a
    /// chance to reconnect, attempt after attempt, with the brokers back.
    pub fn next(&self, end: i64, max: usize, max_bytes: u64, wait: Duration) -> Result<Batch, KafkaError> {
        let consumer = &self.restorer.consumer;
        // Most batches are full: growing the vector record by record moved it ~14 times.
        let mut records = Vec::with_capacity(max.min(PREALLOCATED_RECORDS));
        let mut bytes = 0u64;
        let mut timeout = wait;
        let deadline = std::time::Instant::now() + wait;
        while records.len() < max && bytes < max_bytes {
            match consumer.poll(timeout) {
                None => break,
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return Ok(Batch { records, at_end: true }),
                Some(Err(rdkafka::error::KafkaError::MessageConsumption(code))) if is_connection_error(code) => {
                    match deadline.checked_duration_since(std::time::Instant::now()) {
                        Some(left) if !left.is_zero() => timeout = timeout.min(left),
                        _ => break,
                    }
                    continue;
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(m)) => {
                    if m.offset() >= end {
                        return Ok(Batch { records, at_end: true });
                    }
                    bytes += (m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len)) as u64;
                    records.push(ChangelogRecord {
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec).unwrap_or_default(),
                        value: m.payload().map(<[u8]>::to_vec),
                        mac: m
                            .headers()
                            .and_then(|h| h.iter().find(|h| h.key == mac::HEADER))
                            .map(|h| MacHeader::from_slice(h.value.unwrap_or_default())),
                    });
                    if m.offset() + 1 >= end {
                        return Ok(Batch { records, at_end: true });
                    }
                }
            }
            // After the first record, take what is already there without waiting.
            timeout = Duration::ZERO;
        }
        Ok(Batch { records, at_end: false })
    }
}

impl Drop for Reading<'_> {
    /// Stops reading (between reads).
    fn drop(&mut self) {
        let _ = self.restorer.consumer.unassign();
    }
}
