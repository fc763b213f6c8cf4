//! A receiver that is away, answers 503 or 429, or fails one event: the handler's
//! circuit (`[handlers.circuit]`) and its concurrency limit, with the product's
//! retry defaults. An outage must cost no dead letter, no lost event, no repeat and
//! no out-of-order call, and the receiver must see only the probe schedule while it
//! is down; a poison event still goes dead within its own budget.
//!
//! Size knob: `OUTBOXD_OUTAGE_SECS` (default 20; the 60 on demand): how long
//! each outage lasts.

use crate::harness;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use harness::metrics::{sample, try_scrape};
use harness::receiver::{Call, Receiver, Reply};
use harness::wait::keep_looking;
use harness::{env_usize, new_event_id, unique_name, wait_until, Outboxd, Producer, Scenario};
use serde_json::{json, Value};

/// Each outage lasts this long (`OUTBOXD_OUTAGE_SECS`).
fn outage() -> Duration {
    Duration::from_secs(env_usize("OUTBOXD_OUTAGE_SECS", 20) as u64)
}

/// The circuit's default longest open period (`circuit.probe_max`).
const PROBE_MAX: Duration = Duration::from_secs(5);
/// "Within a few seconds of the receiver's return": the longest open period, and
/// time for the waiting events to run once it closed.
const AFTER_RETURN: Duration = Duration::from_secs(5 + 15);
const KEYS: usize = 20;
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);

/// The product's retry defaults (the harness's are quicker), so that "no dead
/// letter" is about what a user gets.
fn product_defaults(od: &mut Outboxd) {
    od.config.max_attempts = 5;
    od.config.initial_backoff = "200ms".into();
    od.config.max_backoff = "10s".into();
}

/// Events produced in order, as (key, id).
#[derive(Default)]
struct Produced(Vec<(String, String)>);

impl Produced {
    async fn send(&mut self, p: &Producer, topic: &str, n: usize) {
        for _ in 0..n {
            let i = self.0.len();
            let (key, id) = (format!("order-{}", i % KEYS), new_event_id());
            p.send_event(topic, &key, &id, Some("Test"), &json!({"i": i})).await;
            self.0.push((key, id));
        }
    }

    fn ids(&self) -> Vec<String> {
        self.0.iter().map(|(_, id)| id.clone()).collect()
    }
}

async fn wait_all_ok(od: &mut Outboxd, rx: &Receiver, ids: &[String], timeout: Duration) {
    od.wait_until(format!("all {} events answered 2xx", ids.len()), timeout, || rx.count_answered_ok(ids) == ids.len())
        .await;
}

/// Every event ran once: one call answered 2xx each. A call cut by the receiver
/// going away (`cut`) may have taken effect without its answer arriving; only those
/// may repeat.
fn assert_once_each(rx: &Receiver, ids: &[String]) {
    let mut repeated = Vec::new();
    for id in ids {
        let calls: Vec<Call> = rx.handler_calls(id);
        let answered_ok = calls.iter().filter(|c| c.effective() && c.answered.is_some()).count();
        assert!(answered_ok >= 1, "{id}: no 2xx answer: {calls:#?}");
        if answered_ok > 1 {
            repeated.push(id.clone());
        }
    }
    assert!(repeated.is_empty(), "{} events ran again after a 2xx answer, e.g. {:?}", repeated.len(), &repeated[..1]);
}

/// Per key, the first 2xx call of each event came in the order the events were produced.
fn assert_key_order(rx: &Receiver, produced: &Produced) {
    let first_ok: HashMap<String, usize> = rx
        .calls()
        .into_iter()
        .filter(|c| c.is_handler_call() && c.effective())
        .filter_map(|c| Some((c.event_id.clone()?, c.seq)))
        .fold(HashMap::new(), |mut m, (id, seq)| {
            m.entry(id).or_insert(seq);
            m
        });
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (key, id) in &produced.0 {
        by_key.entry(key).or_default().push(*first_ok.get(id).unwrap_or_else(|| panic!("{id} never ran")));
    }
    for (key, seqs) in by_key {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "key {key}: events ran out of their produced order: {seqs:?}");
    }
}

fn dead(od: &Outboxd) -> u64 {
    od.store_stats()["dead"].as_u64().expect("dead count")
}

/// `/readyz` of the running instance (answered with 200 or 503).
async fn readyz(od: &Outboxd) -> Option<Value> {
    let url = format!("http://{}/readyz", od.admin_address());
    let resp = reqwest::Client::new().get(url).timeout(Duration::from_secs(5)).send().await.ok()?;
    resp.json().await.ok()
}

async fn wait_degraded(od: &Outboxd, handler: &str) -> Value {
    let degraded = keep_looking(Duration::from_secs(60), Duration::from_millis(200), async || match readyz(od).await {
        Some(r) if r["degraded"].as_array().is_some_and(|d| d.iter().any(|h| h == handler)) => Ok(r),
        _ => Err(()),
    });
    degraded.await.unwrap_or_else(|()| panic!("the circuit of {handler} did not open:\n{}", od.log_tails(40, 0)))
}

/// How many probes the default schedule can make in `t` at most: open periods of
/// 1 s, doubling to `probe_max`, each at least half its length (the jitter).
fn probe_bound(t: Duration) -> usize {
    let (mut elapsed, mut period, mut n) = (Duration::ZERO, Duration::from_secs(1), 0);
    while elapsed < t {
        elapsed += period / 2;
        period = (period * 2).min(PROBE_MAX);
        n += 1;
    }
    n + 1
}

/// A scenario whose instance has the product's retry defaults (and `configure`'s
/// changes), started and assigned.
async fn rig(prefix: &str, partitions: i32, configure: impl FnOnce(&mut Outboxd, &mut Receiver)) -> Scenario {
    let mut s = Scenario::new(prefix, partitions).await;
    product_defaults(&mut s.od);
    configure(&mut s.od, &mut s.receiver);
    s.run().await;
    s
}

async fn wait_committed(s: &mut Scenario) {
    s.od.wait_until("the committed offsets to reach the end", HANDLED_TIMEOUT, || s.offsets.reached_end()).await;
}

/// What an outage must not cost: a dead letter, a lost or repeated event, or a call out of its key's order.
fn assert_outage_cost_nothing(stores: &[&Outboxd], rx: &Receiver, produced: &Produced) {
    assert_eq!(stores.iter().map(|od| dead(od)).sum::<u64>(), 0, "an outage costs no dead letter");
    assert_once_each(rx, &produced.ids());
    assert_key_order(rx, produced);
}

#[derive(Clone, Copy, Debug)]
enum Outage {
    /// The receiver stops listening (connection refused) and comes back on its port.
    Away,
    /// The receiver answers 503 to everything.
    Unavailable,
}

/// Load before, during and after an outage, with the defaults.
async fn ride_out(kind: Outage) {
    let Scenario { kafka, topic, receiver: mut rx, mut od, offsets, producer } =
        rig("outage", 2, |od, _| od.config.max_in_flight = 64).await;
    let mut produced = Produced::default();
    produced.send(&producer, &topic, 200).await;
    wait_all_ok(&mut od, &rx, &produced.ids(), HANDLED_TIMEOUT).await;

    let calls_before = rx.calls().len();
    match kind {
        Outage::Away => rx.go_away(),
        Outage::Unavailable => rx.set_script(|_| Reply::status(503)),
    }
    let began = Instant::now();
    let mut checked = false;
    // The receiver's call count when the circuit was first seen open: from then on it sees only probes.
    let mut at_open = None;
    while began.elapsed() < outage() {
        produced.send(&producer, &topic, 10).await;
        if at_open.is_none() {
            let calls = rx.calls().len();
            let m = try_scrape(&od).await.unwrap_or_default();
            if sample(&m, "outboxd_handler_circuit", &[("handler", &topic), ("state", "open")]) == 1.0 {
                at_open = Some(calls);
            }
        }
        if !checked && began.elapsed() > Duration::from_secs(5) {
            // Visible while it lasts: degraded, yet ready (restarting outboxd heals no receiver).
            let r = wait_degraded(&od, &topic).await;
            assert_eq!(r["ready"], true, "a down receiver does not make the instance unready: {r}");
            let m = try_scrape(&od).await.expect("metrics");
            let open = sample(&m, "outboxd_handler_circuit", &[("handler", &topic), ("state", "closed")]);
            assert_eq!(open, 0.0, "the circuit is not closed during the outage");
            checked = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = rx.calls().len() - calls_before;
    let after_open = rx.calls().len() - at_open.expect("the circuit was seen open during the outage");
    match kind {
        Outage::Away => rx.come_back(),
        Outage::Unavailable => rx.set_script(|_| Reply::ok()),
    }
    let back = Instant::now();
    produced.send(&producer, &topic, 50).await;
    wait_all_ok(&mut od, &rx, &produced.ids(), AFTER_RETURN).await;
    let caught_up = back.elapsed();
    let mut r = Scenario { kafka, topic, receiver: rx, od, offsets, producer };
    wait_committed(&mut r).await;
    r.od.assert_alive();
    let m = try_scrape(&r.od).await.expect("metrics");
    let transitions = sample(&m, "outboxd_handler_circuit_transitions_total", &[("handler", &r.topic)]);
    r.od.stop();

    eprintln!(
        "[resilience] {kind:?} for {:?}: {} events, {during} calls during the outage ({after_open} once the circuit \
         was seen open), {transitions} circuit transitions, all handled {caught_up:?} after the return",
        outage(),
        produced.0.len()
    );
    assert_outage_cost_nothing(&[&r.od], &r.receiver, &produced);
    assert!(transitions >= 2.0, "the circuit opened and closed: {transitions} transitions");
    if let Outage::Unavailable = kind {
        // Once open: calls already on their way when it opened (at most max_in_flight), then one
        // probe per open period. (Before it opens, within `probe_after`, events retry on their own.)
        let bound = 64 + probe_bound(outage());
        assert!(
            after_open <= bound,
            "{after_open} calls after the circuit opened in a {:?} outage; the probe schedule allows {bound}",
            outage()
        );
    }
}

/// Connection refused for the outage, under load, with the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_away_under_load_costs_no_dead_letter_and_keeps_per_key_order() {
    ride_out(Outage::Away).await;
}

/// 503 to everything for the outage: the same, and the receiver sees the probe schedule, not a retry storm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_answering_503_sees_only_the_probe_schedule_and_nothing_goes_dead() {
    ride_out(Outage::Unavailable).await;
}

/// A poison event (400) and one that always gets 500, amid healthy traffic: both dead
/// within their own budget (5 attempts), and the circuit never opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_events_amid_healthy_traffic_go_dead_within_their_budget_and_the_circuit_stays_closed() {
    let (rejected, failing) = (new_event_id(), new_event_id());
    let (r, f) = (rejected.clone(), failing.clone());
    let Scenario { topic, receiver: rx, mut od, offsets, producer, .. } = rig("poison", 2, |_, rx| {
        rx.set_script(move |req| match req.event_id.as_deref() {
            Some(id) if id == r => Reply::status(400),
            Some(id) if id == f => Reply::status(500),
            _ => Reply::ok(),
        })
    })
    .await;
    let mut produced = Produced::default();
    produced.send(&producer, &topic, 20).await;
    producer.send_event(&topic, "poison-1", &rejected, Some("Test"), &json!({})).await;
    producer.send_event(&topic, "poison-2", &failing, Some("Test"), &json!({})).await;
    // Healthy traffic for longer than the failing event's budget (at most ~3 s of backoff).
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(8) {
        produced.send(&producer, &topic, 5).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_all_ok(&mut od, &rx, &produced.ids(), HANDLED_TIMEOUT).await;
    od.wait_until("the committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    let m = try_scrape(&od).await.expect("metrics");
    let transitions = sample(&m, "outboxd_handler_circuit_transitions_total", &[("handler", &topic)]);
    od.stop();

    assert_eq!(transitions, 0.0, "one event's trouble amid successes does not open the circuit");
    assert_eq!(rx.handler_call_count(&rejected), 1, "400 is permanent: one call");
    assert_eq!(rx.handler_call_count(&failing), 5, "500 every time: max_attempts calls");
    for id in [&rejected, &failing] {
        let r = od.store_get(id);
        assert_eq!(r.state, "dead", "{r:?}");
    }
    assert_once_each(&rx, &produced.ids());
}

/// A 429 with `Retry-After: 5` pauses the whole handler about 5 s: no call of any
/// event starts meanwhile; then it resumes, the 429'd event included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_pauses_the_whole_handler_then_it_resumes() {
    let limited = new_event_id();
    let l = limited.clone();
    let Scenario { topic, receiver: rx, mut od, producer, .. } = rig("retry-after-429", 2, |_, rx| {
        rx.set_script(move |req| match (req.event_id.as_deref(), req.nth) {
            (Some(id), 1) if id == l => Reply::status(429).retry_after("5"),
            _ => Reply::ok().delay(Duration::from_millis(20)),
        })
    })
    .await;
    let mut produced = Produced::default();
    produced.send(&producer, &topic, 50).await;
    producer.send_event(&topic, "limited", &limited, Some("Test"), &json!({})).await;
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(10) {
        produced.send(&producer, &topic, 5).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut ids = produced.ids();
    ids.push(limited.clone());
    wait_all_ok(&mut od, &rx, &ids, HANDLED_TIMEOUT).await;
    od.stop();

    let calls = rx.calls();
    let at = calls
        .iter()
        .find(|c| c.event_id.as_deref() == Some(limited.as_str()) && c.status == 429)
        .and_then(|c| c.answered)
        .expect("the 429 was answered");
    let started: Vec<std::time::SystemTime> = calls.iter().filter(|c| c.is_handler_call()).map(|c| c.started).collect();
    let after = |d: Duration| at + d;
    let in_pause = started
        .iter()
        .filter(|s| **s > after(Duration::from_millis(200)) && **s < after(Duration::from_millis(4500)))
        .count();
    assert_eq!(in_pause, 0, "calls started while the handler was paused by Retry-After: 5");
    let resumed =
        started.iter().filter(|s| **s >= after(Duration::from_millis(4500))).min().expect("calls after the pause");
    let pause = resumed.duration_since(at).unwrap_or_default();
    eprintln!("[resilience] Retry-After: 5 paused the handler {pause:?}");
    assert!(pause < Duration::from_secs(15), "the handler resumed {pause:?} after the 429");
    assert_eq!(rx.handler_call_count(&limited), 2);
    assert_eq!(od.store_get(&limited).state, "done");
}

/// Two handlers, one receiver away: the other handler's events keep being handled
/// while the first's backlog (more than read-ahead holds) waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_receiver_away_does_not_hold_up_another_handlers_topics() {
    let mut s = Scenario::new("down", 2).await;
    let up_topic = s.kafka.create_topic(&unique_name("up"), 2, &[]).await;
    let up = Receiver::start();
    product_defaults(&mut s.od);
    s.od.config.max_in_flight = 32;
    s.od.config.extra_toml = format!(
        "\n[[handlers]]\ntopics = [{:?}]\nkind = \"http\"\nurl = {:?}\nidempotency_header = \"Idempotency-Key\"\n",
        up_topic,
        up.events_url()
    );
    s.run().await;
    let Scenario { topic: down_topic, receiver: mut down, mut od, producer, .. } = s;
    down.go_away();
    let mut backlog = Produced::default();
    backlog.send(&producer, &down_topic, 300).await;
    wait_degraded(&od, &down_topic).await;
    let mut flowing = Produced::default();
    let began = Instant::now();
    while began.elapsed() < outage() / 2 {
        flowing.send(&producer, &up_topic, 10).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Before the first receiver comes back, everything of the other handler is done.
    wait_all_ok(&mut od, &up, &flowing.ids(), outage() / 2 + Duration::from_secs(10)).await;
    assert_eq!(down.count_answered_ok(&backlog.ids()), 0);
    down.come_back();
    wait_all_ok(&mut od, &down, &backlog.ids(), AFTER_RETURN + Duration::from_secs(30)).await;
    od.stop();
    assert_outage_cost_nothing(&[&od], &down, &backlog);
    assert_once_each(&up, &flowing.ids());
}

/// SIGKILL while the circuit is open: after the restart the circuit opens again on
/// its own (the events are redelivered and fail), nothing is lost, each runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_while_the_circuit_is_open_loses_nothing_and_it_opens_again() {
    let mut r = rig("outage-kill", 2, |_, _| {}).await;
    let mut produced = Produced::default();
    produced.send(&r.producer, &r.topic, 50).await;
    wait_all_ok(&mut r.od, &r.receiver, &produced.ids(), HANDLED_TIMEOUT).await;
    r.receiver.go_away();
    produced.send(&r.producer, &r.topic, 100).await;
    wait_degraded(&r.od, &r.topic).await;
    r.od.kill();
    r.od.start();
    r.od.wait_for_assignment().await;
    let after = wait_degraded(&r.od, &r.topic).await;
    eprintln!("[resilience] after the restart: {}", after["handlers"]);
    r.receiver.come_back();
    wait_all_ok(&mut r.od, &r.receiver, &produced.ids(), AFTER_RETURN + Duration::from_secs(30)).await;
    wait_committed(&mut r).await;
    r.od.stop();
    assert_outage_cost_nothing(&[&r.od], &r.receiver, &produced);
}

/// Two instances (changelog on) ride out one receiver outage: no dead letter, no
/// repeat, per-key order, and both circuits close again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_instances_ride_out_one_receiver_outage() {
    let (Scenario { topic, receiver: mut rx, od: mut a, offsets, producer, .. }, mut b) =
        crate::scale::two_instances("outage-scale", 4).await;
    product_defaults(&mut a);
    product_defaults(&mut b);
    a.start();
    b.start();
    a.wait_for_assignment().await;
    b.wait_for_assignment().await;
    let mut produced = Produced::default();
    produced.send(&producer, &topic, 200).await;
    wait_all_ok(&mut a, &rx, &produced.ids(), HANDLED_TIMEOUT).await;
    rx.go_away();
    let began = Instant::now();
    while began.elapsed() < outage() {
        produced.send(&producer, &topic, 10).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    rx.come_back();
    produced.send(&producer, &topic, 50).await;
    wait_all_ok(&mut a, &rx, &produced.ids(), AFTER_RETURN).await;
    wait_until("the committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    for od in [&a, &b] {
        let r = readyz(od).await.expect("readyz");
        assert_eq!(r["degraded"], json!([]), "the circuit closed again: {r}");
    }
    a.stop();
    b.stop();
    assert_outage_cost_nothing(&[&a, &b], &rx, &produced);
}

/// `circuit.give_up_after`: once the circuit has been open that long, the events that
/// wait are recorded dead with the reason (and their offsets commit) instead of waiting on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_open_longer_than_give_up_after_dead_letters_the_waiting_events() {
    let mut r = rig("give-up", 1, |od, rx| {
        od.config.circuit_extra = "give_up_after = \"3s\"\n".into();
        rx.go_away();
    })
    .await;
    let ids: Vec<String> = (0..5).map(|_| new_event_id()).collect();
    async fn send(r: &Scenario, i: usize, id: &str) {
        // A key each: nothing is held behind another event of its key.
        r.producer.send_event(&r.topic, &format!("k{i}"), id, Some("Test"), &json!({"i": i})).await;
    }
    for (i, id) in ids.iter().enumerate().take(2) {
        send(&r, i, id).await;
    }
    harness::wait_until("the circuit to give up", HANDLED_TIMEOUT, || {
        harness::logs::logged(&r.od, "longer than circuit.give_up_after")
    })
    .await;
    // Events that arrive after it gave up, while it is still open, are dead-lettered too
    // (the partition no longer stays paused, or they would never be read).
    for (i, id) in ids.iter().enumerate().skip(2) {
        send(&r, i, id).await;
    }
    wait_committed(&mut r).await;
    r.od.stop();
    for id in &ids {
        let r = r.od.store_get(id);
        assert_eq!(r.state, "dead", "{r:?}");
        let reason = r.reason.unwrap_or_default();
        assert!(reason.contains("circuit.give_up_after") && reason.contains("could not connect"), "{reason}");
    }
}
