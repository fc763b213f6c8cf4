//! Fault injection: many events over several partitions while something goes wrong,
//! then the invariants of docs/DESIGN:
//!
//! - nothing is lost: every good event is `done`, every poison message is dead (and
//!   dead-lettered when a dead-letter topic is configured);
//! - no handler call for an event starts after that event's `done_at` in the store of
//!   the instance that made the call (invariant 2);
//! - the service keeps running (except where the fault is designed to stop it: a full
//!   store filesystem);
//! - the committed offsets reach the end.
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
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use harness::broker::PrivateBroker;
use harness::daemon::{dead_letter_toml, instance_header_toml};
use harness::logs::{self, event_ids_logged, log_lines, log_time, strip_ansi};
use harness::receiver::{Call, Receiver, Reply};
use harness::store as cli;
use harness::{env_usize, new_event_id, turns, unique_name, Kafka, Message, Outboxd, Producer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

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
    tokio::spawn(async move {
        let producer = Producer::new(&brokers, &[]);
        let per_batch = planned.len().div_ceil(batches.max(1));
        let mut out = Vec::with_capacity(planned.len());
        for chunk in planned.chunks(per_batch) {
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

/// outboxd with the settings every scenario uses.
fn fault_outboxd(kafka: &Kafka, topic: &str, rx: &Receiver, instance: &str) -> Outboxd {
    let mut od = Outboxd::new(kafka, &[topic], rx);
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
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return;
        }
        for od in ods.iter_mut() {
            od.assert_alive();
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

// ---------------------------------------------------------------- 1. SIGKILL

/// outboxd is SIGKILLed at random moments (≥ 20 times), mostly with calls in flight,
/// and restarted each time, while events keep arriving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_and_never_repeats_after_done() {
    let _load = turns::LOAD.lock().await;
    let name = "sigkill";
    let began = Instant::now();
    let n = event_count();
    let kills = env_usize("OUTBOXD_FAULT_KILLS", DEFAULT_KILLS);
    let mut rng = StdRng::seed_from_u64(seed(name));
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("fault-kill"), PARTITIONS, &[]).await;
    let rx = Receiver::start();
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=20))));
    let mut od = fault_outboxd(&kafka, &topic, &rx, "a");
    // Static membership: a restarted process gets its partitions back at once.
    od.config.kafka_options.insert("group.instance.id".into(), "fault-kill".into());
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    // Spread production over about as long as the kills take.
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 40, Duration::from_millis(500));

    let mut kill_times = Vec::new();
    let mut mid_call = 0;
    for _ in 0..kills {
        od.start();
        if rng.random_bool(0.5) {
            od.wait_for_assignment().await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..=1500))).await;
        if rng.random_bool(0.8) {
            let until = Instant::now() + Duration::from_secs(1);
            while rx.in_flight() == 0 && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(rng.random_range(1..=10))).await;
            }
        }
        od.assert_alive();
        if rx.in_flight() > 0 {
            mid_call += 1;
        }
        let k0 = SystemTime::now();
        od.kill();
        kill_times.push((k0, SystemTime::now()));
    }
    let last_fault = Instant::now();
    od.start();
    od.wait_for_assignment().await;
    let events = production.await.expect("producer task");
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = last_fault.elapsed();
    od.stop();
    assert_eq!(kill_times.len(), kills, "the kills must have happened");
    assert!(kills == 0 || mid_call > 0, "no kill hit a call in flight; the scenario did not test unknown outcomes");

    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: kill_times,
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!("{kills} SIGKILLs ({mid_call} with calls in flight), {} runs", od.runs()),
        drain,
        drain_from: "after the last kill",
        extra: String::new(),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 2. flaky receiver

/// The receiver answers 503 to 20% of calls and holds 2% past the handler timeout
/// (having performed the side effect: the answer is what gets lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_receiver_503s_and_timeouts_lose_nothing() {
    let _load = turns::LOAD.lock().await;
    let name = "flaky-receiver";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("fault-flaky"), PARTITIONS, &[]).await;
    let rx = Receiver::start();
    let served_503 = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let (n503, nheld) = (served_503.clone(), held.clone());
    rx.set_script(move |r| {
        let x: f64 = rand::random();
        if r.kind != "events" {
            Reply::ok()
        } else if x < 0.20 {
            n503.fetch_add(1, Ordering::Relaxed);
            Reply::status(503)
        } else if x < 0.22 {
            nheld.fetch_add(1, Ordering::Relaxed);
            Reply::ok().delay(Duration::from_millis(1500))
        } else {
            Reply::ok()
        }
    });
    let mut od = fault_outboxd(&kafka, &topic, &rx, "a");
    od.config.handler_timeout = "1s".into();
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 20, Duration::from_millis(200));
    od.start();
    od.wait_for_assignment().await;
    let events = production.await.expect("producer task");
    let produced = Instant::now();
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = produced.elapsed();
    od.stop();

    let calls = rx.calls();
    let (served_503, held) = (served_503.load(Ordering::Relaxed), held.load(Ordering::Relaxed));
    assert!(served_503 > 0 && held > 0, "faults did not happen: {served_503} 503s, {held} held calls");
    let timeouts = log_lines(&od, "timed out").len();
    assert!(timeouts > 0, "outboxd never reported a handler timeout");
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls,
        kills: Vec::new(),
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!("{served_503} answers 503, {held} calls held 1.5 s past the 1 s timeout (all through the run)"),
        drain,
        drain_from: "after the last event was produced",
        extra: format!(", timeouts logged={timeouts}"),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 3. broker crash

/// The broker is SIGKILLed mid-stream, stays down 10 s, and is started again on the same
/// data. A private broker: the shared one stays up for the other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_for_ten_seconds_mid_stream_loses_nothing() {
    const OUTAGE: Duration = Duration::from_secs(10);
    let _load = turns::LOAD.lock().await;
    let name = "broker-kill";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    // Declared first, dropped last (`scripts/stack down kafka` for the private broker).
    let broker = PrivateBroker::start();
    let kafka = Kafka::connect_to(&broker.brokers());
    let topic = kafka.create_topic(&unique_name("fault-broker"), PARTITIONS, &[]).await;
    let rx = Receiver::start();
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=5))));
    let mut od = fault_outboxd(&kafka, &topic, &rx, "a");
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 40, Duration::from_millis(300));
    od.start();
    od.wait_for_assignment().await;
    wait_alive(&mut [&mut od], "a quarter of the events answered", DRAIN_TIMEOUT, || rx.ok_count() >= good / 4).await;

    let pid = broker.pid().expect("broker pid");
    let before = rx.ok_count();
    let killed = Instant::now();
    broker.kill();
    let mut looks = 0;
    while killed.elapsed() < OUTAGE {
        od.assert_alive();
        assert!(!broker.port_open(), "the broker came back by itself during the outage");
        looks += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = rx.ok_count() - before;
    let down_for = killed.elapsed();
    let restarting = Instant::now();
    broker.restart();
    let restart_took = restarting.elapsed();
    let events = production.await.expect("producer task");
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = restarting.elapsed();
    od.stop();
    assert!(looks >= 20, "the outage was not observed");
    let consumer_errors = log_lines(&od, "kafka consumer error").len() + log_lines(&od, "roker").len();

    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: Vec::new(),
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!(
            "broker (pid {pid}) SIGKILLed, port closed for {down_for:.1?}, restart took {restart_took:.1?}; \
             {during} events finished during the outage"
        ),
        drain,
        drain_from: "after the broker restart began",
        extra: format!(", broker-related log lines={consumer_errors}"),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 4. rebalance

/// A second instance (own store) joins mid-stream, then the first one leaves (SIGTERM).
/// The dedup store is per instance: an event runs on both only if it moved between
/// them before its offset was committed; those are counted, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_joining_and_leaving_mid_stream_loses_nothing() {
    let _load = turns::LOAD.lock().await;
    let name = "rebalance";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("fault-rebalance"), PARTITIONS, &[]).await;
    let rx = Receiver::start();
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=10))));
    let mut a = fault_outboxd(&kafka, &topic, &rx, "a");
    let mut b = fault_outboxd(&kafka, &topic, &rx, "b");
    b.config.group_id = a.config.group_id.clone();
    let offsets = kafka.offsets(&a.config.group_id, &topic);
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    // Produced quickly: a works through a backlog, so the join and the leave happen
    // with events queued and in flight.
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 10, Duration::from_millis(100));
    a.start();
    a.wait_for_assignment().await;
    wait_alive(&mut [&mut a], "a fifth of the events answered", DRAIN_TIMEOUT, || rx.ok_count() >= good / 5).await;
    b.start();
    b.wait_for_assignment().await;
    wait_alive(
        &mut [&mut a, &mut b],
        "three fifths answered, and b handling events, with two instances",
        DRAIN_TIMEOUT,
        || rx.ok_count() >= good * 3 / 5 && rx.calls_from("b") > 0,
    )
    .await;
    let b_calls_while_both = rx.calls_from("b");
    let a_revoked = log_lines(&a, "partitions revoked").len();
    let leaving = Instant::now();
    let told_to_leave = SystemTime::now();
    a.stop();
    let left_at = SystemTime::now();
    let events = production.await.expect("producer task");
    wait_alive(&mut [&mut b], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut b], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = leaving.elapsed();
    b.stop();

    let calls = rx.calls();
    let from = |i: &str| calls.iter().filter(|c| c.is_handler_call() && c.instance() == Some(i)).count();
    let (calls_a, calls_b) = (from("a"), from("b"));
    let a_after_leaving = calls.iter().filter(|c| c.instance() == Some("a") && c.started > left_at).count();
    // Events a had consumed before SIGTERM still run during its drain.
    let a_draining = calls.iter().filter(|c| c.instance() == Some("a") && c.started > told_to_leave).count();
    assert!(calls_a > 0 && calls_b > 0, "both instances must have handled events: a={calls_a} b={calls_b}");
    assert!(b_calls_while_both > 0, "b handled nothing while both ran: no partition moved on the join");
    assert!(a_revoked > 0, "a never logged a revoke when b joined");
    assert_eq!(a_after_leaving, 0, "a made calls after it exited");
    for (name, od) in [("a", &a), ("b", &b)] {
        for l in logs::all_logs(od)
            .lines()
            .filter(|l| l.contains("revoked") || l.contains("assigned") || l.contains("commit") || l.contains("lost"))
        {
            eprintln!("{name}: {l}");
        }
    }
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&a)), ("b".into(), records(&b))],
        calls,
        kills: Vec::new(),
        dead_letters: None,
        handler_timeout: timeout_of(&a),
        timed_out: event_ids_logged(&a, "timed out").into_iter().chain(event_ids_logged(&b, "timed out")).collect(),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!("b joined (a revoked partitions {a_revoked}×), then a left by SIGTERM"),
        drain,
        drain_from: "after a was told to leave",
        extra: format!(
            " (a {calls_a}, of which {a_draining} during its drain after SIGTERM; b {calls_b}, of which \
             {b_calls_while_both} while both ran)"
        ),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 5. store filesystem full

/// A tmpfs with a size limit, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("outboxd-fault-tmpfs-").tempdir().expect("temp dir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "cannot mount a tmpfs (this scenario needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = std::process::Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
    }
}

/// Fills the filesystem with a file until writing fails; returns the bytes written.
fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0x55u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(_) => break,
        }
    }
    let _ = f.sync_all();
    written
}

/// The store's filesystem fills up: outboxd stops claiming, commits nothing past the
/// last durable completion and exits non-zero naming the store; once space is freed
/// and it is restarted, it finishes. (It does not resume by itself while running: it
/// exits on the first failed store write, which this test asserts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_filesystem_full_stops_cleanly_and_resumes_after_restart() {
    let _load = turns::LOAD.lock().await;
    let name = "store-disk-full";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    // sled needs about 2 KiB of log per event here; the filesystem must hold them all
    // once the filler is gone (8 MiB up to ~2000 events, more for larger runs).
    let size = std::env::var("OUTBOXD_FAULT_TMPFS_SIZE").unwrap_or_else(|_| format!("{}k", (n * 4).max(8 * 1024)));
    let tmpfs = Tmpfs::mount(&size);
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("fault-diskfull"), PARTITIONS, &[]).await;
    let rx = Receiver::start();
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=5))));
    let mut od = fault_outboxd(&kafka, &topic, &rx, "a");
    od.config.store_path = tmpfs.path().join("store");
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    let events = spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 10, Duration::ZERO)
        .await
        .expect("producer task");
    od.start();
    od.wait_for_assignment().await;
    wait_alive(&mut [&mut od], "a third of the events answered", DRAIN_TIMEOUT, || rx.ok_count() >= good / 3).await;

    let filler = tmpfs.path().join("filler");
    let answered_at_fill = rx.ok_count();
    let filled_at = Instant::now();
    let filled_system = SystemTime::now();
    let filled = fill(&filler);
    let pid = od.pid();
    let stop_bound = Duration::from_secs(60);
    while !harness::broker::gone(pid) {
        assert!(
            filled_at.elapsed() < stop_bound,
            "outboxd still runs {stop_bound:?} after its store's filesystem filled up ({filled} bytes of filler; \
             {} more events answered since)",
            rx.ok_count() - answered_at_fill
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped_after = filled_at.elapsed();
    let exit_time = SystemTime::now();
    let status = od.terminate();
    let log = strip_ansi(&od.log());
    let error_line = log.lines().rev().find(|l| l.starts_with("error:")).unwrap_or("").to_string();
    assert!(!status.success(), "outboxd must exit non-zero when its store cannot be written; got {status}");
    assert!(
        error_line.contains("store") && (error_line.contains("No space left") || error_line.contains("os error 28")),
        "the exit message should name the store and the cause; got {error_line:?}"
    );
    let names_path = error_line.contains(&od.config.store_path.display().to_string());
    if std::env::var_os("OUTBOXD_FAULT_VERBOSE").is_some() {
        eprintln!("{}", od.log_tails(40, 0));
    }
    let committed = offsets.committed();
    let calls_after_fill = rx.calls().iter().filter(|c| c.started_at > filled_at + Duration::from_millis(1)).count();
    // When outboxd noticed: the first error it logged about the store.
    let failure_time = log
        .lines()
        .find(|l| (l.contains("store failed") || l.contains("durable write failed")) && log_time(l).is_some())
        .and_then(log_time);
    let late_calls = failure_time.map_or(0, |t| {
        rx.calls().iter().filter(|c| c.is_handler_call() && c.started > t + Duration::from_millis(200)).count()
    });

    // Free the space, then look at the store before restarting.
    std::fs::remove_file(&filler).expect("remove the filler");
    let recs = records(&od);
    let mut past_durable = Vec::new();
    for e in &events {
        let c = committed.get(&e.partition).copied().flatten().unwrap_or(0);
        if e.offset < c && recs.get(&e.id).is_none_or(|r| r["state"] != "done") {
            past_durable.push(format!(
                "p{}@{} {} ({:?})",
                e.partition,
                e.offset,
                e.id,
                recs.get(&e.id).map(|r| &r["state"])
            ));
        }
    }
    assert!(
        past_durable.is_empty(),
        "offsets committed past events not durably done ({} of them), e.g. {:?}",
        past_durable.len(),
        &past_durable[..past_durable.len().min(10)]
    );
    assert!(
        failure_time.is_some(),
        "outboxd logged no store failure before exiting:\n{}",
        log_lines(&od, "").join("\n")
    );
    assert_eq!(late_calls, 0, "handler calls kept starting more than 200 ms after the store failed");

    od.start();
    od.wait_for_assignment().await;
    wait_alive(&mut [&mut od], &format!("all {good} events answered after the restart"), DRAIN_TIMEOUT, || {
        rx.ok_count() >= good
    })
    .await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = filled_at.elapsed();
    od.stop();
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: vec![(filled_system, exit_time)],
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!(
            "store tmpfs ({size}) filled ({filled} bytes of filler) after {answered_at_fill} events; outboxd exited \
             ({status}) {stopped_after:.1?} later with {error_line:?} (names the store path: {names_path}); \
             calls started after the fill: {calls_after_fill}; resumes by itself when space is freed: no (exits; \
             restarted after freeing)"
        ),
        drain,
        drain_from: "after the filesystem filled (includes the restart)",
        extra: String::new(),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 6. poison messages

/// 1% poison (half undecodable, half rejected by the receiver with 422) with a
/// dead-letter topic: one dead letter per poison message, and nothing else stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_go_to_the_dead_letter_topic() {
    let _load = turns::LOAD.lock().await;
    let name = "poison";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("fault-poison"), PARTITIONS, &[]).await;
    let dlq = kafka.create_topic(&unique_name("fault-poison-dlq"), 1, &[]).await;
    let rx = Receiver::start();
    let planned = plan(n, 10, &mut rng);
    let rejected: Arc<HashSet<String>> =
        Arc::new(planned.iter().filter(|p| p.kind == Kind::Rejected).map(|p| p.id.clone()).collect());
    let r2 = rejected.clone();
    rx.set_script(move |r| {
        if r.event_id.as_deref().is_some_and(|id| r2.contains(id)) {
            Reply::status(422)
        } else {
            Reply::ok()
        }
    });
    let mut od = fault_outboxd(&kafka, &topic, &rx, "a");
    od.config.handler_extra.push_str(&dead_letter_toml(&dlq));
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let good = good_count(&planned);
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 20, Duration::from_millis(100));
    od.start();
    od.wait_for_assignment().await;
    let events = production.await.expect("producer task");
    let produced = Instant::now();
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = produced.elapsed();
    od.stop();
    let poison = poison_count(&events);
    assert!(poison > 0, "no poison message was produced (n={n})");
    let letters = kafka.read_topic(&dlq, Duration::from_secs(60));
    let undecodable = events.iter().filter(|e| e.kind == Kind::Undecodable).count();
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: Vec::new(),
        dead_letters: Some(letters),
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison,
        faults: format!("{undecodable} undecodable + {} rejected with 422", rejected.len()),
        drain,
        drain_from: "after the last event was produced",
        extra: String::new(),
    };
    finish(name, check, summary, began);
}
