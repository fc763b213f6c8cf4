//! Per-key order after a dead event (`[[handlers]] on_dead`): with `hold` (the
//! default) the later events of a dead event's Kafka key are recorded `held`, their
//! offsets commit, and they run in offset order, once each, after the dead one is
//! retried to done (or resolved, or forgotten); with `continue` they run as before.
//! The chain follows its partition through the changelog to another instance.
//! Outcomes are read from the receiver's call log, the committed offsets and the
//! `store` commands (through the running service's admin API, or on its store).

use crate::harness;

use std::time::Duration;

use harness::{new_event_id, Behaviour, Kafka, Outboxd, Receiver, Scenario};
use serde_json::{json, Value};

use super::scale::two_instances;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
const KEY: &str = "order-7";

/// `outboxd store ARGS --json` (through the service while it runs); it must succeed.
fn store_json(od: &Outboxd, args: &[&str]) -> Value {
    let mut full = vec!["store"];
    full.extend_from_slice(args);
    full.push("--json");
    let out = od.command(&full);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{full:?} failed: {stdout}\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{full:?} printed no JSON ({e}): {stdout}"))
}

/// `outboxd store ARGS` (through the service while it runs); it must succeed. Its stdout.
pub(super) fn store(od: &Outboxd, args: &[&str]) -> String {
    let mut full = vec!["store"];
    full.extend_from_slice(args);
    let out = od.command(&full);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{full:?} failed: {stdout}\n{stderr}");
    stdout.into_owned()
}

fn held_ids(od: &Outboxd) -> Vec<String> {
    let held = store_json(od, &["list", "--state", "held"]);
    held.as_array().expect("a list").iter().map(|r| r["event_id"].as_str().unwrap().to_owned()).collect()
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}

/// The receiver's handler calls of `ids`, in the order they came: (id, status).
fn call_order(receiver: &Receiver, ids: &[String]) -> Vec<(String, u16)> {
    let mut calls: Vec<_> = receiver
        .calls()
        .into_iter()
        .filter(|c| c.is_handler_call() && c.event_id.as_ref().is_some_and(|id| ids.contains(id)))
        .collect();
    calls.sort_by_key(|c| c.seq);
    calls.into_iter().map(|c| (c.event_id.unwrap(), c.status)).collect()
}

async fn send(kafka: &Kafka, topic: &str, key: &str, ids: &[String]) {
    let producer = kafka.producer();
    for (n, id) in ids.iter().enumerate() {
        producer.send_event(topic, key, id, Some("OrderEvent"), &json!({"n": n})).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_behind_a_dead_event_of_their_key_are_held_and_run_in_order_once_it_is_retried() {
    let Scenario { kafka, topic, receiver, mut od, offsets, .. } = Scenario::start("hold", 1).await;

    // The first event of the key fails for good (400); the receiver takes it when retried.
    let dead = new_event_id();
    receiver.set_behaviour(&dead, Behaviour::fail_first(400, 1));
    let held: Vec<String> = (0..3).map(|_| new_event_id()).collect();
    let other = new_event_id();
    send(&kafka, &topic, KEY, std::slice::from_ref(&dead)).await;
    send(&kafka, &topic, KEY, &held).await;
    send(&kafka, &topic, "order-8", std::slice::from_ref(&other)).await;
    od.wait_until("another key's event", HANDLED_TIMEOUT, || receiver.answered_ok(&other)).await;
    od.wait_until(format!("every offset committed ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;

    // Held: recorded with their place in the chain, committed, and never sent.
    assert_eq!(sorted(&held_ids(&od)), sorted(&held), "store list --state held");
    for id in &held {
        assert_eq!(receiver.call_count(id), 0, "{id} must not run while its key waits");
    }
    let head = store_json(&od, &["get", &dead]);
    assert_eq!(head["state"], "dead", "{head}");
    assert_eq!(head["chain"]["held"], json!(held), "the dead event shows what it holds, in order: {head}");
    assert_eq!(head["chain"]["head"], json!(dead));
    let behind = store_json(&od, &["get", &held[1]]);
    assert_eq!((behind["state"].as_str(), behind["chain"]["head"].as_str()), (Some("held"), Some(dead.as_str())));
    assert_eq!(store_json(&od, &["stats"])["held"], 3);
    let metrics = harness::metrics::try_scrape(&od).await.expect("metrics");
    assert_eq!(harness::metrics::sample(&metrics, "outboxd_events_held_total", &[("topic", &topic)]), 3.0);

    // Retried (the receiver takes it now): it runs, then the three, in order, once each.
    let said = store(&od, &["retry", &dead]);
    assert!(said.contains(&format!("{dead}: done")), "{said}");
    od.wait_until("the held events to run", HANDLED_TIMEOUT, || receiver.count_answered_ok(&held) == held.len()).await;
    let all: Vec<String> = [dead.clone()].into_iter().chain(held.iter().cloned()).collect();
    let expected: Vec<(String, u16)> =
        [(dead.clone(), 400), (dead.clone(), 200)].into_iter().chain(held.iter().map(|id| (id.clone(), 200))).collect();
    assert_eq!(call_order(&receiver, &all), expected, "the dead event, then the held ones in offset order");
    assert!(held_ids(&od).is_empty(), "nothing held any more");
    // The key flows freely again.
    let next = new_event_id();
    send(&kafka, &topic, KEY, std::slice::from_ref(&next)).await;
    od.wait_until("the key's next event", HANDLED_TIMEOUT, || receiver.answered_ok(&next)).await;
    od.stop();
    for id in &held {
        assert_eq!(od.store_get(id).state, "done");
        assert_eq!(receiver.call_count(id), 1, "{id} once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_event_that_fails_when_its_chain_runs_it_holds_the_rest_which_survive_a_restart() {
    let Scenario { kafka, topic, receiver, mut od, offsets, .. } = Scenario::start("hold-head", 1).await;
    let ids: Vec<String> = (0..4).map(|_| new_event_id()).collect();
    let (dead, h1, h2, h3) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    receiver.set_behaviour(dead, Behaviour::fail_first(400, 1));
    receiver.set_behaviour(h2, Behaviour::fail_first(422, 1));
    send(&kafka, &topic, KEY, &ids).await;
    od.wait_until("every offset committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    assert_eq!(held_ids(&od).len(), 3);

    store(&od, &["retry", dead]);
    od.wait_until("h1 to run and h2 to fail", HANDLED_TIMEOUT, || receiver.answered_ok(h1) && receiver.answered(h2))
        .await;
    let config = od.config_path().to_owned();
    harness::wait_until("h2 recorded dead", HANDLED_TIMEOUT, || {
        let out = std::process::Command::new(harness::daemon::BIN)
            .args(["store", "get", h2, "--json", "--config"])
            .arg(&config)
            .output()
            .expect("run outboxd");
        serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|r| r["state"] == "dead")
    })
    .await;
    let behind = store_json(&od, &["get", h3]);
    assert_eq!((behind["state"].as_str(), behind["chain"]["head"].as_str()), (Some("held"), Some(h2.as_str())));
    assert_eq!(receiver.call_count(h3), 0, "h3 waits behind h2");

    // Resolved on the stopped service's store: the next run releases the rest.
    od.stop();
    assert_eq!(od.store_get(h3).state, "held", "held across the stop");
    let said = harness::store::store_cmd(&od, &["resolve", h2, "--done"]);
    assert!(said.status.success(), "{}", harness::store::describe(&said));
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("h3 to run after the restart", HANDLED_TIMEOUT, || receiver.answered_ok(h3)).await;
    let expected: Vec<(String, u16)> =
        vec![(dead.clone(), 400), (dead.clone(), 200), (h1.clone(), 200), (h2.clone(), 422), (h3.clone(), 200)];
    assert_eq!(call_order(&receiver, &ids), expected);
    od.stop();
    assert_eq!(od.store_get(h2).outcome.as_deref(), Some("resolved by hand: done"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_dead_continue_the_later_events_of_a_dead_events_key_run_as_before() {
    let mut s = Scenario::new("hold-continue", 1).await;
    s.od.config.handler_extra = "on_dead = \"continue\"\n".into();
    s.run().await;
    let Scenario { kafka, topic, receiver, mut od, .. } = s;
    let ids: Vec<String> = (0..4).map(|_| new_event_id()).collect();
    receiver.set_behaviour(&ids[0], Behaviour::fail_first(400, 1));
    send(&kafka, &topic, KEY, &ids).await;
    od.wait_until("the later events", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids[1..]) == 3).await;
    assert!(held_ids(&od).is_empty());
    let expected: Vec<(String, u16)> =
        [(ids[0].clone(), 400)].into_iter().chain(ids[1..].iter().map(|id| (id.clone(), 200))).collect();
    assert_eq!(call_order(&receiver, &ids), expected, "in offset order, as before");
    od.stop();
    assert_eq!(od.store_get(&ids[0]).state, "dead");
    assert!(od.store_get(&ids[0]).reason.is_some());
    assert_eq!(harness::store::get(&od, &ids[0])["chain"], Value::Null, "a dead event holds nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_chain_follows_its_partition_to_another_instance_which_holds_new_events_and_runs_it_on_retry() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) = two_instances("hold-move", 1).await;
    a.start();
    a.wait_for_assignment().await;
    let dead = new_event_id();
    receiver.set_behaviour(&dead, Behaviour::fail_first(400, 1));
    let held: Vec<String> = (0..3).map(|_| new_event_id()).collect();
    send(&kafka, &topic, KEY, std::slice::from_ref(&dead)).await;
    send(&kafka, &topic, KEY, &held).await;
    a.wait_until("A to commit every offset", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    assert_eq!(sorted(&held_ids(&a)), sorted(&held), "held on A");
    a.stop();

    // B, with an empty store, owns the partition now: it restores the chain from the changelog.
    b.start();
    b.wait_for_assignment().await;
    assert_eq!(sorted(&held_ids(&b)), sorted(&held), "held on B after the restore");
    // A new event of the key arriving at B waits behind the same dead event.
    let late = new_event_id();
    send(&kafka, &topic, KEY, std::slice::from_ref(&late)).await;
    b.wait_until("B to commit the new event", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    assert_eq!(receiver.call_count(&late), 0, "held at B too");
    let chain: Vec<String> = held.iter().cloned().chain([late.clone()]).collect();
    let head = store_json(&b, &["get", &dead]);
    assert_eq!((head["state"].as_str(), &head["chain"]["held"]), (Some("dead"), &json!(chain)), "{head}");

    // Retried through B: the dead event, then the chain in order, each once, all on B.
    let said = store(&b, &["retry", &dead]);
    assert!(said.contains(&format!("{dead}: done")), "{said}");
    b.wait_until("the chain to run on B", HANDLED_TIMEOUT, || receiver.count_answered_ok(&chain) == chain.len()).await;
    let all: Vec<String> = [dead.clone()].into_iter().chain(chain.iter().cloned()).collect();
    let expected: Vec<(String, u16)> = [(dead.clone(), 400), (dead.clone(), 200)]
        .into_iter()
        .chain(chain.iter().map(|id| (id.clone(), 200)))
        .collect();
    assert_eq!(call_order(&receiver, &all), expected);
    for id in &chain {
        let calls = receiver.handler_calls(id);
        assert_eq!(calls.len(), 1, "{id} once");
        assert_eq!(calls[0].instance(), Some("b"), "{id} ran on the partition's owner");
    }
    assert!(held_ids(&b).is_empty());
    b.stop();
}
