//! Shared harness for outboxd's black-box integration tests.
//!
//! The tests treat outboxd as a black box: they start the real binary against a real
//! Kafka broker and a real HTTP receiver, and look only at what the outside world can
//! see: the receiver's calls, the group's committed offsets, the logs and the
//! `outboxd store … --json` CLI.
//!
//! - [`scenario`]: one test's world in one line: a fresh topic, a receiver, outboxd
//!   configured for them, the group's committed offsets and a producer.
//! - [`wait`]: waiting for what a test expects, through the one deadline loop.
//! - [`kafka`]: broker address, topics and their configs, a producer of outbox-shaped
//!   and arbitrary messages, reading a topic, committed offsets and end offsets.
//! - [`changelog`]: changelog topics (`[store.changelog]`): their names, their records
//!   decoded, records fabricated the way outboxd writes them, restore log fields.
//! - [`broker`]: a private Kafka broker (`scripts/stack` with its own state folder and
//!   ports) for tests that SIGKILL the broker.
//! - [`receiver`]: an axum HTTP server that records every call and answers by
//!   behaviours (delay, hang, fail), per event id or globally, or by a script.
//! - [`daemon`]: outboxd as a child process with a generated config in a temporary
//!   directory, its stderr in a file (printed when a test fails), kill/stop helpers and
//!   the store CLI.
//! - [`metrics`]: a running outboxd's Prometheus metrics, and their samples.
//! - [`otlp`]: a real OTLP/HTTP collector process (`outboxd-otlp-receiver`) and the spans it got.
//! - [`store`]: the store CLI commands beyond `get|list`: `export`, raw JSON records.
//! - [`logs`]: what outboxd logged (lines, event ids, times, panics).
//! - [`debezium`]: the rest of the real pipeline: PostgreSQL (through `psql`), Kafka
//!   Connect's REST API, Debezium connector configs derived from
//!   `debezium/connector.json`, `scripts/stack` (kill/start Connect), and clean-up of
//!   the tables, publications, slots and connectors a test creates.
//! - [`avro`]: the schema registry (Confluent API), Confluent's AvroConverter on
//!   Connect, the Confluent wire format, and stopping/starting the registry.
//! - [`tmpfs`]: a size-limited tmpfs (a store whose filesystem fills up) and a filler.
//! - [`turns`]: the locks by which tests that change the one Connect worker or the
//!   registry take turns, now that every test runs in one process.

pub mod avro;
pub mod broker;
pub mod browser;
pub mod changelog;
pub mod daemon;
pub mod debezium;
pub mod kafka;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod ports;
pub mod receiver;
pub mod scenario;
pub mod store;
pub mod tmpfs;
pub mod turns;
pub mod verifier;
pub mod wait;

pub use daemon::{Outboxd, Record};
pub use kafka::{Kafka, Message, OffsetReader, Produced, Producer};
pub use receiver::{Behaviour, Call, Receiver};
pub use scenario::Scenario;
pub use wait::{wait_at_most, wait_for, wait_until, wait_until_async, POLL_EVERY};

/// A fresh event id in the shape Debezium's outbox uses (a random UUID v4, as text).
pub fn new_event_id() -> String {
    let v: u128 = rand::random();
    let v = (v & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{v:032x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// A name no other test (in this run or an earlier one against the same broker) uses.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::random();
    format!("outboxd-it-{prefix}-{}-{n}-{r:08x}", std::process::id())
}

/// A size knob from the environment, with a default.
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            v.trim().parse().unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}"))
        }
        _ => default,
    }
}
