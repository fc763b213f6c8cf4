//! The Kafka side of the harness: broker address, topics (created with configs, or
//! their configs changed), producing outbox-shaped and arbitrary messages, reading a
//! topic, a group's committed offsets and a topic's end offsets.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use super::wait::keep_looking_blocking;
use super::{unique_name, wait_until};

/// Where the tests expect the broker unless `OUTBOXD_TEST_BROKERS` says otherwise.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:19092";

/// How long one request to the broker may take before the test calls it a failure.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an admin operation (create a topic, change its config) may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a produced message may wait for the broker: long enough to ride out a
/// broker restart.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(180);

/// The broker address the tests (and the outboxd they start) use.
pub fn brokers() -> String {
    std::env::var("OUTBOXD_TEST_BROKERS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_BROKERS.to_string())
}

fn client_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        // Keep librdkafka quiet in test output unless something is really wrong.
        .set("log_level", "3");
    c
}

/// A reachable broker. [`Kafka::connect`] fails the test when there is none: these
/// tests never pass without having talked to Kafka.
#[derive(Clone, Debug)]
pub struct Kafka {
    brokers: String,
}

impl Kafka {
    /// Checks that the broker answers; fails the test with instructions if it does not.
    pub fn connect() -> Kafka {
        Kafka::connect_to(&brokers())
    }

    /// Like [`Kafka::connect`], for a broker at `brokers` (e.g. a private one a test
    /// kills and restarts).
    pub fn connect_to(brokers: &str) -> Kafka {
        let brokers = brokers.to_string();
        let consumer: BaseConsumer = client_config(&brokers).create().expect("create a Kafka client");
        match consumer.fetch_metadata(None, BROKER_TIMEOUT) {
            Ok(md) if !md.brokers().is_empty() => Kafka { brokers },
            Ok(_) => panic!(
                "the Kafka broker at {brokers} answered without any broker in its metadata; \
                 start the test stack with `scripts/stack up kafka` (or point OUTBOXD_TEST_BROKERS at a broker)"
            ),
            Err(e) => panic!(
                "no Kafka broker reachable at {brokers} ({e}); \
                 start the test stack with `scripts/stack up kafka` (or point OUTBOXD_TEST_BROKERS at a broker)"
            ),
        }
    }

    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Creates topic `name` (which must not exist yet; a fresh one from
    /// [`unique_name`], or one whose name someone else dictates, e.g. Debezium's
    /// `outbox.event.<aggregatetype>`) with topic configs such as `max.message.bytes`,
    /// and waits until every partition has a leader. Returns the name.
    pub async fn create_topic(&self, name: &str, partitions: i32, configs: &[(&str, &str)]) -> String {
        let name = name.to_string();
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.brokers).create().expect("create a Kafka admin client");
        let mut new_topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
        for (k, v) in configs {
            new_topic = new_topic.set(k, v);
        }
        let results = admin
            .create_topics(&[new_topic], &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)))
            .await
            .unwrap_or_else(|e| panic!("create topic {name}: {e}"));
        for r in results {
            if let Err((topic, code)) = r {
                panic!("create topic {topic}: {code:?}");
            }
        }
        let consumer: BaseConsumer = client_config(&self.brokers).create().expect("client");
        wait_until(
            format!("topic {name} to have {partitions} partitions with leaders"),
            Duration::from_secs(30),
            || match consumer.fetch_metadata(Some(&name), BROKER_TIMEOUT) {
                Ok(md) => md.topics().iter().any(|t| {
                    t.name() == name
                        && t.error().is_none()
                        && t.partitions().len() == partitions as usize
                        && t.partitions().iter().all(|p| p.leader() >= 0)
                }),
                Err(_) => false,
            },
        )
        .await;
        name
    }

    /// Gives `topic` `total` partitions (more than it has).
    pub async fn add_partitions(&self, topic: &str, total: usize) {
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.brokers).create().expect("create a Kafka admin client");
        let results = admin
            .create_partitions(
                &[rdkafka::admin::NewPartitions::new(topic, total)],
                &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
            )
            .await
            .unwrap_or_else(|e| panic!("add partitions to {topic}: {e}"));
        for r in results {
            if let Err((topic, code)) = r {
                panic!("add partitions to {topic}: {code:?}");
            }
        }
    }

    /// Deletes a topic and waits until the broker no longer lists it.
    pub async fn delete_topic(&self, name: &str) {
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.brokers).create().expect("create a Kafka admin client");
        let results = admin
            .delete_topics(&[name], &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)))
            .await
            .unwrap_or_else(|e| panic!("delete topic {name}: {e}"));
        for r in results {
            if let Err((topic, code)) = r {
                panic!("delete topic {topic}: {code:?}");
            }
        }
        let consumer: BaseConsumer = client_config(&self.brokers).create().expect("client");
        wait_until(format!("topic {name} to be gone"), Duration::from_secs(30), || {
            consumer.fetch_metadata(Some(name), BROKER_TIMEOUT).is_ok_and(|md| {
                md.topics().iter().all(|t| t.name() != name || t.error().is_some() || t.partitions().is_empty())
            })
        })
        .await;
    }

    /// Deletes the messages of `topic`/`partition` below `offset`, as its retention would.
    pub async fn delete_records_before(&self, topic: &str, partition: i32, offset: i64) {
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.brokers).create().expect("create a Kafka admin client");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset)).expect("a partition offset");
        let result = admin
            .delete_records(&tpl, &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)))
            .await
            .unwrap_or_else(|e| panic!("delete records of {topic}/{partition} below {offset}: {e}"));
        for e in result.elements() {
            if let Err(error) = e.error() {
                panic!("delete records of {topic}/{partition} below {offset}: {error}");
            }
        }
    }

    /// The value of one config of `topic` as the brokers report it (its own or the default).
    pub async fn topic_config(&self, topic: &str, key: &str) -> Option<String> {
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.brokers).create().expect("create a Kafka admin client");
        let options = AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
        let described = admin
            .describe_configs(&[ResourceSpecifier::Topic(topic)], &options)
            .await
            .unwrap_or_else(|e| panic!("describe config of {topic}: {e}"));
        let resource = described.into_iter().next()?.unwrap_or_else(|code| panic!("describe {topic}: {code:?}"));
        resource.get(key).and_then(|e| e.value.clone())
    }

    /// Replaces the topic's dynamic configs with `configs` (non-incremental AlterConfigs).
    pub async fn alter_topic_config(&self, topic: &str, configs: &[(&str, &str)]) {
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.brokers).create().expect("create a Kafka admin client");
        let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
        for (k, v) in configs {
            alter = alter.set(k, v);
        }
        let results = admin
            .alter_configs(&[alter], &AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT)))
            .await
            .unwrap_or_else(|e| panic!("alter config of {topic}: {e}"));
        for r in results {
            if let Err((res, code)) = r {
                panic!("alter config of {res:?}: {code:?}");
            }
        }
    }

    /// Every message of `topic` from the beginning up to the end offsets as they are at
    /// the time of the call, in partition and offset order. Fails the test when they
    /// cannot be read within `timeout`.
    pub fn read_topic(&self, topic: &str, timeout: Duration) -> Vec<Message> {
        let consumer: BaseConsumer = client_config(&self.brokers)
            .set("group.id", unique_name("reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()
            .expect("create a Kafka consumer to read a topic");
        let partitions = partition_count(&consumer, topic);
        let mut ends = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, BROKER_TIMEOUT)
                .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
            if high > low {
                ends.insert(p, high);
                tpl.add_partition_offset(topic, p, Offset::Offset(low)).expect("partition offset");
            }
        }
        let mut out = Vec::new();
        if ends.is_empty() {
            return out;
        }
        consumer.assign(&tpl).unwrap_or_else(|e| panic!("assign {topic}: {e}"));
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        // Each look reads one message (polling blocks up to 200 ms, so no pause between).
        let read = keep_looking_blocking(timeout, Duration::ZERO, || {
            if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                let m = m.unwrap_or_else(|e| panic!("read {topic}: {e}"));
                next.insert(m.partition(), m.offset() + 1);
                if ends.get(&m.partition()).is_some_and(|end| m.offset() < *end) {
                    out.push(Message {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        headers: m
                            .headers()
                            .map(|hs| hs.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
                            .unwrap_or_default(),
                        timestamp_ms: m.timestamp().to_millis(),
                    });
                }
            }
            let at_the_end = ends.iter().all(|(p, end)| next.get(p).copied().unwrap_or(0) >= *end);
            if at_the_end {
                Ok(())
            } else {
                Err(())
            }
        });
        if read.is_err() {
            panic!("could not read {topic} up to its end offsets {ends:?} within {timeout:?}; read up to {next:?}");
        }
        out.sort_by_key(|m| (m.partition, m.offset));
        out
    }

    /// A producer for this broker (see [`Producer::new`]).
    pub fn producer(&self) -> Producer {
        Producer::new(&self.brokers, &[])
    }

    /// Reads what group `group` has committed for `topic` (without joining the group).
    pub fn offsets(&self, group: &str, topic: &str) -> OffsetReader {
        let consumer: BaseConsumer = client_config(&self.brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("create a Kafka consumer to read committed offsets");
        let partitions = partition_count(&consumer, topic);
        OffsetReader { consumer, topic: topic.to_string(), partitions }
    }
}

/// A message as it lies in a topic (see [`Kafka::read_topic`]).
#[derive(Clone, Debug)]
pub struct Message {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record timestamp (ms since the epoch).
    pub timestamp_ms: Option<i64>,
}

impl Message {
    /// The last header called `name`, as (lossy) text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub fn key_text(&self) -> Option<String> {
        self.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned())
    }

    pub fn value_text(&self) -> Option<String> {
        self.value.as_deref().map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Where a produced message landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Produced {
    pub event_id: String,
    pub key: String,
    pub partition: i32,
    pub offset: i64,
}

/// One header; `None` is a header with a null value.
pub type RawHeader<'a> = (&'a str, Option<&'a [u8]>);

/// Sends messages in the shape of Debezium's outbox EventRouter (key = aggregate id,
/// header `id` = event id, optional header `eventType`, value = JSON payload), or any
/// message at all (null header values, huge values, no `id`).
pub struct Producer {
    inner: FutureProducer,
}

impl Producer {
    /// An idempotent producer (keeps the order of a partition's in-flight messages)
    /// with a delivery timeout long enough to ride out a broker restart, for `brokers`
    /// (which need not be up yet), with extra settings (e.g. `message.max.bytes`).
    pub fn new(brokers: &str, settings: &[(&str, &str)]) -> Producer {
        let mut c = client_config(brokers);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", DELIVERY_TIMEOUT.as_millis().to_string());
        for (k, v) in settings {
            c.set(*k, *v);
        }
        Producer { inner: c.create().expect("create a Kafka producer") }
    }

    /// Sends one outbox event and waits until the broker has it.
    pub async fn send_event(
        &self,
        topic: &str,
        key: &str,
        event_id: &str,
        event_type: Option<&str>,
        payload: &Value,
    ) -> Produced {
        let value = serde_json::to_vec(payload).expect("serialize payload");
        let mut headers = vec![("id", Some(event_id.as_bytes()))];
        if let Some(t) = event_type {
            headers.push(("eventType", Some(t.as_bytes())));
        }
        let (partition, offset) = self.send_raw(topic, None, Some(key.as_bytes()), &headers, Some(&value)).await;
        Produced { event_id: event_id.to_string(), key: key.to_string(), partition, offset }
    }

    /// Sends any message and waits until the broker has it; returns (partition, offset).
    pub async fn send_raw(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        headers: &[RawHeader<'_>],
        value: Option<&[u8]>,
    ) -> (i32, i64) {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            owned = owned.insert(Header { key: k, value: *v });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(owned);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        match self.inner.send(record, DELIVERY_TIMEOUT).await {
            Ok(d) => (d.partition, d.offset),
            Err((e, _)) => panic!("produce to {topic}: {e}"),
        }
    }
}

/// Reads a group's committed offsets and the end offsets of one topic.
pub struct OffsetReader {
    consumer: BaseConsumer,
    pub topic: String,
    pub partitions: i32,
}

impl OffsetReader {
    fn tpl(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        tpl
    }

    /// Committed offset per partition (the next offset the group would read), `None`
    /// where the group has committed nothing.
    pub fn try_committed(&self) -> KafkaResult<BTreeMap<i32, Option<i64>>> {
        let tpl = self.consumer.committed_offsets(self.tpl(), BROKER_TIMEOUT)?;
        let mut out = BTreeMap::new();
        for e in tpl.elements_for_topic(&self.topic) {
            let committed = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            out.insert(e.partition(), committed);
        }
        Ok(out)
    }

    pub fn committed(&self) -> BTreeMap<i32, Option<i64>> {
        self.try_committed().unwrap_or_else(|e| panic!("committed offsets of {}: {e}", self.topic))
    }

    /// The end (high watermark) of every partition: the offset the next message gets.
    pub fn try_end(&self) -> KafkaResult<BTreeMap<i32, i64>> {
        let mut out = BTreeMap::new();
        for p in 0..self.partitions {
            let (_, high) = self.consumer.fetch_watermarks(&self.topic, p, BROKER_TIMEOUT)?;
            out.insert(p, high);
        }
        Ok(out)
    }

    pub fn end(&self) -> BTreeMap<i32, i64> {
        self.try_end().unwrap_or_else(|e| panic!("end offsets of {}: {e}", self.topic))
    }

    /// Whether every partition's committed offset has reached the partition's end
    /// (partitions without messages count as reached).
    pub fn reached_end(&self) -> bool {
        let (Ok(committed), Ok(end)) = (self.try_committed(), self.try_end()) else {
            return false;
        };
        end.iter().all(|(p, &high)| high == 0 || committed.get(p).copied().flatten().is_some_and(|c| c >= high))
    }

    /// "partition: committed/end" for messages.
    pub fn describe(&self) -> String {
        let committed = self.try_committed();
        let end = self.try_end();
        match (committed, end) {
            (Ok(c), Ok(e)) => e
                .iter()
                .map(|(p, high)| {
                    let c = c.get(p).copied().flatten();
                    format!("p{p}: committed {} / end {high}", c.map_or("none".to_string(), |c| c.to_string()))
                })
                .collect::<Vec<_>>()
                .join(", "),
            (c, e) => format!("(could not read offsets: {c:?} {e:?})"),
        }
    }
}

/// How many partitions `topic` has, from the broker's metadata (fails the test when unknown).
fn partition_count(consumer: &BaseConsumer, topic: &str) -> i32 {
    let md =
        consumer.fetch_metadata(Some(topic), BROKER_TIMEOUT).unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len() as i32)
        .unwrap_or_else(|| panic!("topic {topic} not in the metadata"))
}
