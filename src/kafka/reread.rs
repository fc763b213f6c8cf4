//! Reading source messages again by the position a record keeps (`outboxd store
//! replay`): a consumer assigned by hand (it never joins the group nor commits).
//! Positions are read in ascending order per partition, so that a run of nearby
//! offsets is one sequential read rather than a seek each. Blocking calls: run it
//! off the runtime's workers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::consumer::to_raw;
use super::health::{is_connection_error, ClientCtx};
use super::KafkaError;
use crate::config::KafkaConfig;
use crate::event::RawMessage;

/// How long one watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A wanted offset at most this far past the read position is reached by reading
/// on (and skipping what lies between) rather than by a seek.
const READ_ON: i64 = 500;

/// What a position holds now.
#[derive(Debug)]
pub enum Reread {
    /// The message, as it was consumed.
    Found(RawMessage),
    /// The topic no longer holds the offset: its retention deleted it. `first` is the
    /// partition's first offset now.
    Expired {
        /// The partition's first offset now.
        first: i64,
    },
    /// The partition holds offsets around it, but not this one (a compacted topic
    /// removed it), or the offset is past the partition's end.
    Missing,
}

/// Reads single messages by topic, partition and offset ([`Rereader::read`]).
pub struct Rereader {
    consumer: BaseConsumer<ClientCtx>,
    /// The partition assigned now, and the offset the next poll returns.
    at: Option<(String, i32, i64)>,
    /// Each partition's first and end offset as last asked (asked again when an
    /// offset falls outside them).
    ranges: HashMap<(String, i32), (i64, i64)>,
    /// How long a read may wait for the brokers.
    wait: Duration,
}

impl Rereader {
    /// A consumer that never joins the group nor commits; a read waits at most `wait`.
    pub fn build(kafka: &KafkaConfig, wait: Duration) -> Result<Rereader, KafkaError> {
        let consumer =
            super::options::reread_consumer(kafka).create_with_context(ClientCtx::new(kafka, "replay"))?;
        Ok(Rereader { consumer, at: None, ranges: HashMap::new(), wait })
    }

    /// The message at `offset` of `topic`/`partition`, or why there is none.
    pub fn read(&mut self, topic: &str, partition: i32, offset: i64) -> Result<Reread, KafkaError> {
        let at = |error| KafkaError::Partition { topic: topic.to_owned(), partition, error };
        let (mut first, mut end) = self.range(topic, partition)?;
        if offset < first || offset >= end {
            // Asked a while ago, perhaps: the partition has moved on since.
            self.ranges.remove(&(topic.to_owned(), partition));
            (first, end) = self.range(topic, partition)?;
        }
        if offset < first {
            return Ok(Reread::Expired { first });
        }
        if offset >= end {
            return Ok(Reread::Missing);
        }
        let reads_on = matches!(&self.at, Some((t, p, next)) if t == topic && *p == partition
            && *next <= offset && offset - *next <= READ_ON);
        if !reads_on {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(offset)).map_err(at)?;
            self.consumer.assign(&tpl).map_err(at)?;
            self.at = Some((topic.to_owned(), partition, offset));
        }
        let deadline = Instant::now() + self.wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.at = None;
                return Err(at(ClientError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut)));
            }
            match self.consumer.poll(left) {
                None => {}
                Some(Err(ClientError::PartitionEOF(_))) => {
                    self.at = None;
                    return Ok(Reread::Missing);
                }
                Some(Err(ClientError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                    // Deleted since the range was asked: ask again.
                    self.at = None;
                    self.ranges.remove(&(topic.to_owned(), partition));
                    let (first, _) = self.range(topic, partition)?;
                    return Ok(if offset < first { Reread::Expired { first } } else { Reread::Missing });
                }
                Some(Err(ClientError::MessageConsumption(code))) if is_connection_error(code) => {}
                Some(Err(e)) => {
                    self.at = None;
                    return Err(at(e));
                }
                Some(Ok(m)) => {
                    self.at = Some((topic.to_owned(), partition, m.offset() + 1));
                    match m.offset().cmp(&offset) {
                        std::cmp::Ordering::Less => continue,
                        std::cmp::Ordering::Equal => return Ok(Reread::Found(to_raw(&m))),
                        std::cmp::Ordering::Greater => return Ok(Reread::Missing),
                    }
                }
            }
        }
    }

    /// The first offset of `topic`/`partition` now (asked again, not as last asked).
    pub fn first_offset(&mut self, topic: &str, partition: i32) -> Result<i64, KafkaError> {
        self.ranges.remove(&(topic.to_owned(), partition));
        Ok(self.range(topic, partition)?.0)
    }

    /// The first and the end offset of `topic`/`partition`, as last asked.
    fn range(&mut self, topic: &str, partition: i32) -> Result<(i64, i64), KafkaError> {
        let key = (topic.to_owned(), partition);
        if let Some(range) = self.ranges.get(&key) {
            return Ok(*range);
        }
        let range = self.consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT).map_err(|error| {
            KafkaError::Partition { topic: topic.to_owned(), partition, error }
        })?;
        self.ranges.insert(key, range);
        Ok(range)
    }
}
