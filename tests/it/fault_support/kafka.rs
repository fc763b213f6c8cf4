//! Kafka helpers the shared harness does not have: changing a topic's config, and a
//! producer of arbitrary messages.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

fn client(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers).set("log_level", "3");
    c
}

/// Replaces the topic's dynamic configs with `configs` (non-incremental AlterConfigs).
pub async fn alter_topic_config(brokers: &str, topic: &str, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = client(brokers).create().expect("admin client");
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

/// A producer of arbitrary messages. Idempotent (keeps order per partition), and with
/// a delivery timeout long enough to ride out a broker restart.
pub struct RawProducer {
    inner: FutureProducer,
}

/// One header; `None` is a header with a null value.
pub type RawHeader<'a> = (&'a str, Option<&'a [u8]>);

impl RawProducer {
    pub fn new(brokers: &str) -> RawProducer {
        RawProducer::with(brokers, &[])
    }

    /// With extra producer settings (e.g. `message.max.bytes`).
    pub fn with(brokers: &str, settings: &[(&str, &str)]) -> RawProducer {
        let mut c = client(brokers);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "180000");
        for (k, v) in settings {
            c.set(*k, *v);
        }
        RawProducer { inner: c.create().expect("create a Kafka producer") }
    }

    /// Sends one message and waits for the broker; returns (partition, offset).
    pub async fn send(
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
        match self.inner.send(record, Duration::from_secs(180)).await {
            Ok(d) => (d.partition, d.offset),
            Err((e, _)) => panic!("produce to {topic}: {e}"),
        }
    }

    /// An outbox event: key = aggregate id, header `id`, header `eventType`, JSON value.
    pub async fn send_event(&self, topic: &str, key: &str, id: &str, value: &serde_json::Value) -> (i32, i64) {
        let v = serde_json::to_vec(value).expect("json");
        self.send(
            topic,
            None,
            Some(key.as_bytes()),
            &[("id", Some(id.as_bytes())), ("eventType", Some(b"Test"))],
            Some(&v),
        )
        .await
    }
}
