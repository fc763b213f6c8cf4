//! Fault injection: many events over several partitions while something goes wrong,
//! then the invariants of docs/architecture.md §2:
//!
//! - nothing is lost: every good event is `done`, every poison message is dead (and
//!   dead-lettered when a dead-letter topic is configured);
//! - no handler call for an event starts after that event's `done_at` in the store of
//!   the instance that made the call (invariant 2);
//! - the service keeps running (except where the fault is designed to stop it: a full
//!   store filesystem);
//! - the committed offsets reach the end.
//!
//! The scenarios: [`crashes`] (outboxd SIGKILLed, the broker killed, a rebalance),
//! [`bad_peers`] (a flaky receiver, poison messages), [`disk_full`] (the store's
//! filesystem fills up). This module holds what they share: the plan of events, the
//! producer, and the invariant check.
//!
//! Each scenario prints one summary line: events, faults injected, handler calls,
//! duplicates (events whose side effect happened more than once at the receiver) by
//! cause, dead letters, and the time from the last fault until the committed offsets
//! reached the end ("drain").
//!
//! The receiver (the harness's `receiver`) keeps its record of calls in the
//! memory of the test process, which outlives every outboxd and broker kill.
//!
//! Size knobs: `OUTBOXD_FAULT_EVENTS` (default 10000 per scenario, over 4 partitions;
//! about 2.5 minutes for the whole file on 2 cores), `OUTBOXD_FAULT_KILLS` (default 20),
//! `OUTBOXD_FAULT_SEED` (replays the random choices of an earlier run).
//! The scenarios run one at a time, and not beside the kill loop ([`turns::LOAD`]): they
//! would otherwise compete for 2 cores.

use crate::harness;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use harness::broker::PrivateBroker;
use harness::daemon::{dead_letter_toml, instance_header_toml};
use harness::logs::{self, event_ids_logged, log_lines, log_time, strip_ansi};
use harness::receiver::{Call, Reply};
use harness::store as cli;
use harness::{env_usize, new_event_id, turns, unique_name, Kafka, Message, Outboxd, Producer, Scenario};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

mod bad_peers;
mod crashes;
mod disk_full;

const PARTITIONS: i32 = 4;
const DEFAULT_EVENTS: usize = 10_000;
const DEFAULT_KILLS: usize = 20;
/// Bound on "all events handled" once the faults are over.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);

fn event_count() -> usize {
    env_usize("OUTBOXD_FAULT_EVENTS", DEFAULT_EVENTS).max(100)
}

fn seed(name: &str) -> u64 {
    let s = std::env::var("OUTBOXD_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("[faults] {name}: seed {s}");
    s
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Good,
    /// No `id` header: cannot be decoded.
    Undecodable,
    /// The receiver rejects it with 422 (a permanent failure).
    Rejected,
}

#[derive(Clone, Debug)]
struct Planned {
    id: String,
    key: String,
    kind: Kind,
}

#[derive(Clone, Debug)]
struct Ev {
    id: String,
    kind: Kind,
    partition: i32,
    offset: i64,
}

/// `n` events over `n / 10` keys; `poison_per_mille` of them poison (alternately
/// undecodable and rejected).
fn plan(n: usize, poison_per_mille: u32, rng: &mut StdRng) -> Vec<Planned> {
    let keys = (n / 10).max(1);
    let mut flip = false;
    (0..n)
        .map(|i| {
            let kind = if rng.random_range(0..1000) < poison_per_mille {
                flip = !flip;
                if flip {
                    Kind::Undecodable
                } else {
                    Kind::Rejected
                }
            } else {
                Kind::Good
            };
            Planned { id: new_event_id(), key: format!("agg-{}", i % keys), kind }
        })
        .collect()
}

/// Produces the planned events in `batches` batches with `pause` between them.
fn spawn_production(
    brokers: String,
    topic: String,
    planned: Vec<Planned>,
    batches: usize,
    pause: Duration,
) -> tokio::task::JoinHandle<Vec<Ev>> {
    spawn_gated_production(brokers, topic, planned, batches, pause, None)
}

/// Holds the rest of a production back after a number of batches, until told to go on.
struct Gate {
    /// Batches produced before the gate.
    after: usize,
    /// Opened (sent to, or dropped) when the test is ready for the rest.
    open: tokio::sync::oneshot::Receiver<()>,
}

/// Like [`spawn_production`], waiting at `gate` (if any): what a test must see happen
/// while events flow (an instance joining) then has events to happen with, however fast
/// the earlier ones were handled.
fn spawn_gated_production(
    brokers: String,
    topic: String,
    planned: Vec<Planned>,
    batches: usize,
    pause: Duration,
    mut gate: Option<Gate>,
) -> tokio::task::JoinHandle<Vec<Ev>> {
    tokio::spawn(async move {
        let producer = Producer::new(&brokers, &[]);
        let per_batch = planned.len().div_ceil(batches.max(1));
        let mut out = Vec::with_capacity(planned.len());
        for (i, chunk) in planned.chunks(per_batch).enumerate() {
            if let Some(g) = gate.take_if(|g| g.after == i) {
                let _ = g.open.await;
            }
            let sends = chunk.iter().map(|p| {
                let producer = &producer;
                let topic = &topic;
                async move {
                    let value = serde_json::to_vec(&json!({"event": p.id, "key": p.key})).expect("json");
                    let (partition, offset) = match p.kind {
                        Kind::Undecodable => {
                            producer
                                .send_raw(
                                    topic,
                                    None,
                                    Some(p.key.as_bytes()),
                                    &[("eventType", Some(b"Poison"))],
                                    Some(b"\x00\xffpoison"),
                                )
                                .await
                        }
                        _ => {
                            producer
                                .send_raw(
                                    topic,
                                    None,
                                    Some(p.key.as_bytes()),
                                    &[("id", Some(p.id.as_bytes())), ("eventType", Some(b"Tick"))],
                                    Some(&value),
                                )
                                .await
                        }
                    };
                    Ev { id: p.id.clone(), kind: p.kind, partition, offset }
                }
            });
            out.extend(futures::future::join_all(sends).await);
            tokio::time::sleep(pause).await;
        }
        out
    })
}

/// `od` with the settings every scenario uses, naming `instance` in every call.
fn fault_outboxd(mut od: Outboxd, instance: &str) -> Outboxd {
    od.config.handler_extra = instance_header_toml(instance);
    // Kills and 503s must not exhaust an event's attempts.
    od.config.max_attempts = 1000;
    od.config.initial_backoff = "20ms".into();
    od.config.max_backoff = "300ms".into();
    od.config.handler_timeout = "5s".into();
    od
}

/// Waits until `done()` holds, failing when outboxd dies or `timeout` passes.
async fn wait_alive(ods: &mut [&mut Outboxd], what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    harness::wait_until(what, timeout, || {
        done() || {
            ods.iter_mut().for_each(|od| od.assert_alive());
            false
        }
    })
    .await;
}

/// What one scenario did, for its summary line.
#[derive(Default)]
struct Summary {
    events: usize,
    poison: usize,
    faults: String,
    drain: Duration,
    /// From when the drain is measured.
    drain_from: &'static str,
    extra: String,
}

/// Checks the invariants; returns (duplicates by cause, failures).
struct Check<'a> {
    topic: &'a str,
    events: &'a [Ev],
    /// (instance name as sent in X-Outboxd-Instance, its store's records)
    stores: Vec<(String, HashMap<String, Value>)>,
    calls: Vec<Call>,
    /// When outboxd processes were SIGKILLed (or died): from just before the signal
    /// to when the process was reaped.
    kills: Vec<(SystemTime, SystemTime)>,
    dead_letters: Option<Vec<Message>>,
    /// The handler timeout: a call the receiver held at least this long timed out.
    handler_timeout: Duration,
    /// Events for which outboxd logged a handler timeout (also ones the receiver
    /// answered in time, when the answer was late to arrive under load).
    timed_out: HashSet<String>,
}

fn at(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

impl Check<'_> {
    fn run(&self) -> (BTreeMap<&'static str, usize>, Vec<String>) {
        let mut failures = Vec::new();
        let mut dups: BTreeMap<&'static str, usize> = BTreeMap::new();
        let find = |id: &str| -> Vec<(&str, &Value)> {
            self.stores.iter().filter_map(|(name, recs)| recs.get(id).map(|r| (name.as_str(), r))).collect()
        };

        // Nothing lost.
        let mut lost = Vec::new();
        let mut dead_positions = Vec::new();
        for e in self.events {
            match e.kind {
                Kind::Good => {
                    if !find(&e.id).iter().any(|(_, r)| r["state"] == "done") {
                        let states: Vec<String> =
                            find(&e.id).iter().map(|(n, r)| format!("{n}: {} {}", r["state"], r["reason"])).collect();
                        lost.push(format!("{} (p{}@{}): {states:?}", e.id, e.partition, e.offset));
                    }
                }
                Kind::Undecodable | Kind::Rejected => {
                    let id = match e.kind {
                        Kind::Undecodable => format!("undecodable/{}/{}/{}", self.topic, e.partition, e.offset),
                        _ => e.id.clone(),
                    };
                    match find(&id).into_iter().find(|(_, r)| r["state"] == "dead") {
                        Some((_, r)) => {
                            if r["reason"].as_str().is_none_or(|t| t.trim().is_empty()) {
                                failures.push(format!("poison {id}: dead without a reason: {r}"));
                            }
                            if self.dead_letters.is_some() {
                                match r["dead_letter"].as_str() {
                                    Some(p) => dead_positions.push(p.to_string()),
                                    None => {
                                        failures.push(format!("poison {id}: dead but no dead-letter position: {r}"))
                                    }
                                }
                            }
                        }
                        None => lost.push(format!("poison {id} (p{}@{}) is not dead", e.partition, e.offset)),
                    }
                }
            }
        }
        if !lost.is_empty() {
            failures.push(format!("{} events lost, e.g. {:#?}", lost.len(), &lost[..lost.len().min(10)]));
        }

        if let Some(letters) = &self.dead_letters {
            let poison: HashMap<(i32, i64), &Ev> =
                self.events.iter().filter(|e| e.kind != Kind::Good).map(|e| ((e.partition, e.offset), e)).collect();
            let mut seen = HashSet::new();
            for m in letters {
                let src = (
                    m.header("outboxd.source.partition").and_then(|p| p.parse::<i32>().ok()).unwrap_or(-1),
                    m.header("outboxd.source.offset").and_then(|p| p.parse::<i64>().ok()).unwrap_or(-1),
                );
                if !poison.contains_key(&src) {
                    failures.push(format!(
                        "dead letter for {src:?} which is not a poison message: {:?}",
                        m.header("outboxd.error")
                    ));
                }
                if !seen.insert(src) {
                    failures.push(format!("two dead letters for {src:?}"));
                }
            }
            let at_positions: HashSet<String> =
                letters.iter().map(|m| format!("/{}@{}", m.partition, m.offset)).collect();
            for p in &dead_positions {
                if !p.rfind('/').is_some_and(|i| at_positions.contains(&p[i..])) {
                    failures.push(format!("a record's dead_letter position {p} holds no dead letter"));
                }
            }
            if letters.len() != poison.len() {
                failures.push(format!("{} dead letters for {} poison messages", letters.len(), poison.len()));
            }
        }

        // Every call is for a produced event; none starts after done_at in its instance's store.
        let known: HashSet<&str> = self.events.iter().map(|e| e.id.as_str()).collect();
        let mut after_done = Vec::new();
        let mut unknown = 0;
        for c in self.calls.iter().filter(|c| c.is_handler_call()) {
            let Some(id) = c.event_id.as_deref().filter(|id| known.contains(id)) else {
                unknown += 1;
                continue;
            };
            let instance = c.instance().unwrap_or("?");
            let Some((_, recs)) = self.stores.iter().find(|(n, _)| n == instance) else {
                failures.push(format!("call from unknown instance {instance:?}"));
                continue;
            };
            if let Some(done_at) = recs.get(id).and_then(cli::done_at) {
                if c.started > done_at + Duration::from_millis(1) {
                    after_done.push(format!(
                        "{id}: call #{} from {instance} started {} after done_at {} ({})",
                        c.nth,
                        at(c.started),
                        at(done_at),
                        recs[id]["state"]
                    ));
                }
            }
        }
        if unknown > 0 {
            failures.push(format!("{unknown} handler calls for no produced event"));
        }
        if !after_done.is_empty() {
            failures.push(format!(
                "{} calls started after their event was final (invariant 2), e.g. {:#?}",
                after_done.len(),
                &after_done[..after_done.len().min(10)]
            ));
        }

        // Duplicates: a side effect (a call the receiver decided 2xx) more than once.
        let mut by_id: HashMap<&str, Vec<&Call>> = HashMap::new();
        for c in self.calls.iter().filter(|c| c.is_handler_call() && c.effective()) {
            if let Some(id) = c.event_id.as_deref() {
                by_id.entry(id).or_default().push(c);
            }
        }
        let mut unexplained = Vec::new();
        let mut moved = Vec::new();
        for (id, mut calls) in by_id {
            calls.sort_by_key(|c| c.started);
            for pair in calls.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                // A kill whose window overlaps [prev.started, next.started]: the process
                // that made `prev` died before `next`. A request the killed process had
                // already written can reach the receiver (and be timestamped) a little
                // after the process is gone, more so on a loaded machine: hence the grace.
                let kill = self
                    .kills
                    .iter()
                    .copied()
                    .filter(|(k0, k1)| *k1 + KILL_OBSERVATION_GRACE >= prev.started && *k0 <= next.started)
                    .map(|(k0, _)| k0)
                    .min();
                let cause = if prev.instance() != next.instance() {
                    if moved.len() < 5 {
                        let e = self.events.iter().find(|e| e.id == id);
                        moved.push(format!(
                            "{id} (p{:?}@{:?}): {} at {} (answered {:?}), then {} at {}",
                            e.map(|e| e.partition),
                            e.map(|e| e.offset),
                            prev.instance().unwrap_or("?"),
                            at(prev.started),
                            prev.answered.map(at),
                            next.instance().unwrap_or("?"),
                            at(next.started)
                        ));
                    }
                    "moved to another instance before its offset was committed"
                } else if let Some(k) = kill {
                    if prev.answered.is_some_and(|a| a < k) {
                        "outboxd killed after the answer, before done was durable"
                    } else {
                        "outboxd killed during the call (re-executed, same key)"
                    }
                } else if prev.delay >= self.handler_timeout {
                    "handler timeout (the receiver acted, the answer came too late)"
                } else if self.timed_out.contains(id) {
                    "handler timeout although the receiver answered at once (answer late under load)"
                } else {
                    let last_kill = self.kills.iter().map(|(k0, _)| *k0).filter(|k| *k <= next.started).max();
                    unexplained.push(format!(
                        "{id}: effective call #{} ({}, answered {:?}) then #{} at {}; last kill before: {:?}",
                        prev.nth,
                        at(prev.started),
                        prev.answered.map(at),
                        next.nth,
                        at(next.started),
                        last_kill.map(at),
                    ));
                    "unexplained"
                };
                *dups.entry(cause).or_default() += 1;
            }
        }
        if !moved.is_empty() {
            eprintln!("events that ran on both instances, e.g.:\n  {}", moved.join("\n  "));
        }
        if !unexplained.is_empty() {
            failures.push(format!(
                "{} repeated side effects without a kill, timeout or rebalance to explain them, e.g. {:#?}",
                unexplained.len(),
                &unexplained[..unexplained.len().min(10)]
            ));
        }
        (dups, failures)
    }
}

/// Checks, prints the summary line, and fails the test on any violation.
fn finish(name: &str, check: Check<'_>, summary: Summary, began: Instant) {
    let (dups, failures) = check.run();
    let calls = check.calls.iter().filter(|c| c.is_handler_call()).count();
    let total_dups: usize = dups.values().sum();
    let causes: Vec<String> = dups.iter().map(|(c, n)| format!("{c}: {n}")).collect();
    let dlq = check.dead_letters.as_ref().map_or("none configured".to_string(), |l| l.len().to_string());
    println!(
        "[faults] {name}: events={} (poison {}) partitions={PARTITIONS} | faults: {} | handler calls={calls}{} | \
         duplicates={total_dups}{} | dead letters={dlq} | drain {:.1?} {} | total {:.1?}",
        summary.events,
        summary.poison,
        summary.faults,
        summary.extra,
        if causes.is_empty() { String::new() } else { format!(" ({})", causes.join("; ")) },
        summary.drain,
        summary.drain_from,
        began.elapsed()
    );
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

/// How late the receiver may see a request that a SIGKILLed outboxd wrote before dying.
const KILL_OBSERVATION_GRACE: Duration = Duration::from_millis(500);

fn timeout_of(od: &Outboxd) -> Duration {
    humantime::parse_duration(&od.config.handler_timeout).expect("handler timeout")
}

fn records(od: &Outboxd) -> HashMap<String, Value> {
    cli::all_records(od)
}

fn poison_count(events: &[Ev]) -> usize {
    events.iter().filter(|e| e.kind != Kind::Good).count()
}

fn good_count(planned: &[Planned]) -> usize {
    planned.iter().filter(|p| p.kind == Kind::Good).count()
}
