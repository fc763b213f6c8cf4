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
use harness::{new_event_id, unique_name, Kafka, Message, Producer, Scenario};
use serde_json::{json, Value};

mod bad_input;
mod retries;
mod uncertain;

/// Generous bound for "outboxd handles what it was given".
const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
const DLQ_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends an event of type `Test` to the scenario's topic; where it landed.
async fn send(s: &Scenario, key: &str, id: &str, payload: &Value) -> (i32, i64) {
    let produced = s.producer.send_event(&s.topic, key, id, Some("Test"), payload).await;
    (produced.partition, produced.offset)
}

async fn wait_committed_end(s: &mut Scenario) {
    let what = format!("committed offsets of {} to reach the end", s.topic);
    s.od.wait_until(what, HANDLED_TIMEOUT, || s.offsets.reached_end()).await;
}

/// The committed offset of `partition`, when it can be read.
fn committed(s: &Scenario, partition: i32) -> Option<i64> {
    s.offsets.try_committed().ok().and_then(|c| c.get(&partition).copied().flatten())
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a [u8]> {
    m.headers.iter().rev().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_string()
}
