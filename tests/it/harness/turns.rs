//! Turns on what the stack has only one of. All integration tests run in one process,
//! up to `--test-threads` at once, so tests that change something every other test of
//! a kind can see take turns here:
//!
//! - [`CONNECT`]: the one Kafka Connect worker. The Debezium and Avro pipeline tests
//!   kill and restart it, add connectors to it, and check that none of theirs is left;
//!   they hold it for the whole test, one test at a time.
//! - [`REGISTRY`]: the stack's schema registry. A test that stops it holds it for
//!   writing while it is down ([`super::avro::RegistryOutage`]); tests that only need
//!   it up hold it for reading.
//! - [`LOAD`]: the machine's cores. The fault scenarios and the kill loop each push
//!   thousands of events through outboxd processes they kill and restart; two of them
//!   at once would compete for the cores (CI has 2) and stretch every bound they wait
//!   on, so they run one at a time (other tests still run beside them).
//!
//! Other test processes on the machine are kept out by [`super::debezium::StackTurn`].
//! Everything else the tests share (the broker, PostgreSQL) they use under names of
//! their own (topics, groups, tables), so it needs no turn.

/// The Kafka Connect worker, one test at a time.
pub static CONNECT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The schema registry: written (stopped) by one test at a time, read by many.
pub static REGISTRY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The heavy load tests, one at a time.
pub static LOAD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
