//! Black-box tests of outboxd's failure handling against the real broker and a scripted
//! HTTP receiver: retries, status rules, `Retry-After`, the dead-letter topic, the
//! unknown-outcome policies (retry / verify / park), `outboxd store retry|resolve|export`,
//! and bad input. Each test uses its own topics and consumer group. The tests are in
//! [`retries`], [`uncertain`] and [`bad_input`]; this module holds their setup.

use crate::harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use harness::daemon::dead_letter_toml;
use harness::logs::{self, log_lines, logged};
use harness::receiver::{Receiver, Reply};
use harness::store::{self as cli, describe};
use harness::{new_event_id, unique_name, Kafka, Message, Outboxd, Producer};
use serde_json::{json, Value};

mod bad_input;
mod retries;
mod uncertain;

/// Generous bound for "outboxd handles what it was given".
const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
const DLQ_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A topic, its outboxd, a scripted receiver and a producer.
struct Setup {
    kafka: Kafka,
    rx: Receiver,
    od: Outboxd,
    topic: String,
    producer: Producer,
}

async fn setup(prefix: &str, partitions: i32) -> Setup {
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name(prefix), partitions, &[]).await;
    let rx = Receiver::start();
    let od = Outboxd::new(&kafka, &[&topic], &rx);
    let producer = kafka.producer();
    Setup { kafka, rx, od, topic, producer }
}

impl Setup {
    async fn send(&self, key: &str, id: &str, payload: &Value) -> (i32, i64) {
        let produced = self.producer.send_event(&self.topic, key, id, Some("Test"), payload).await;
        (produced.partition, produced.offset)
    }

    async fn wait_committed_end(&mut self) {
        let offsets = self.kafka.offsets(&self.od.config.group_id, &self.topic);
        let what = format!("committed offsets of {} to reach the end", self.topic);
        self.od.wait_until(what, HANDLED_TIMEOUT, || offsets.reached_end()).await;
    }

    fn committed(&self, partition: i32) -> Option<i64> {
        let offsets = self.kafka.offsets(&self.od.config.group_id, &self.topic);
        offsets.try_committed().ok().and_then(|c| c.get(&partition).copied().flatten())
    }
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a [u8]> {
    m.headers.iter().rev().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_string()
}
