//! Repairs with several outboxd processes in one group (`[store.changelog]`):
//! `store forget`, `resolve` and `retry` go to the changelog, so the instance that
//! owns the partition applies a repair made through another instance, and the
//! next owner of a partition restores it. Outcomes are read from the receiver's
//! call log and from `store get` through the owner's admin API.

use crate::harness;

use std::collections::HashMap;
use std::time::Duration;

use harness::{new_event_id, Behaviour, Outboxd, Produced, Receiver, Scenario};
use serde_json::Value;

use super::scale::{produce, two_instances};

const PARTITIONS: i32 = 4;
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an owner may take to apply a repair made elsewhere (a couple of
/// `store.changelog.follow_interval`s, 1 s by default, and a slow machine).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// Effective (2xx) handler calls per event id.
fn effective_calls(receiver: &Receiver) -> HashMap<String, usize> {
    let mut per_id = HashMap::new();
    for call in receiver.calls().iter().filter(|c| c.is_handler_call() && c.effective()) {
        *per_id.entry(call.event_id.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    per_id
}

/// `store get ID --json` through the running instance's admin API: `None` when it has no record.
fn get_live(od: &Outboxd, id: &str) -> Option<Value> {
    let out = od.command(&["store", "get", id, "--json"]);
    out.status.success().then(|| serde_json::from_slice(&out.stdout).expect("store get prints JSON"))
}

/// Runs a `store` command (through the service while it runs, on its store otherwise); it must succeed.
fn repair(od: &Outboxd, args: &[&str]) -> String {
    let out = od.command(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_made_through_another_instance_lets_the_owner_run_the_event_once_more() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) =
        two_instances("scale-repairs", PARTITIONS).await;
    // A handles everything alone: its store keeps the records of every partition.
    a.start();
    a.wait_for_assignment().await;
    let events: Vec<(String, String)> = (0..40).map(|i| (format!("agg-{}", i % 8), new_event_id())).collect();
    let first = produce(&kafka, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    a.wait_until("A to handle every event", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    a.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;

    // B joins and takes some partitions over; one new event per key says who owns which.
    b.start();
    b.wait_for_assignment().await;
    let probes: Vec<(String, String)> = (0..8).map(|k| (format!("agg-{k}"), new_event_id())).collect();
    let probed = produce(&kafka, &topic, &probes).await;
    let probe_ids: Vec<String> = probes.iter().map(|(_, id)| id.clone()).collect();
    b.wait_until("the probes", HANDLED_TIMEOUT, || receiver.count_answered_ok(&probe_ids) == probe_ids.len()).await;
    let owner: HashMap<i32, String> = probed
        .iter()
        .map(|p| {
            let call = receiver.handler_calls(&p.event_id).into_iter().find(|c| c.effective()).expect("probe call");
            (p.partition, call.instance().expect("instance header").to_owned())
        })
        .collect();
    let in_b: Vec<&Produced> =
        first.iter().filter(|p| owner.get(&p.partition).map(String::as_str) == Some("b")).collect();
    assert!(in_b.len() >= 3, "B owns partitions with events (owners {owner:?})");
    let forgotten: Vec<String> = in_b[..2].iter().map(|p| p.event_id.clone()).collect();

    // Forgotten through A, which does not own their partition any more: B learns it from the changelog.
    for id in &forgotten {
        assert!(get_live(&b, id).is_some(), "B restored {id}");
        repair(&a, &["store", "forget", id, "--yes"]);
    }
    harness::wait_until("B to apply the forgets made through A", CATCH_UP_TIMEOUT, || {
        forgotten.iter().all(|id| get_live(&b, id).is_none())
    })
    .await;
    assert!(get_live(&b, &in_b[2].event_id).is_some(), "the other records stay");

    // Every event again at new offsets: only the forgotten ones run, once more each.
    produce(&kafka, &topic, &events).await;
    b.wait_until("the replays to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    let calls = effective_calls(&receiver);
    for id in &ids {
        let expected = if forgotten.contains(id) { 2 } else { 1 };
        assert_eq!(calls.get(id), Some(&expected), "effective calls of {id} (forgotten: {})", forgotten.contains(id));
    }
    let b_log = b.log();
    a.stop();
    b.stop();
    assert!(b_log.contains("caught up with changelog records written by other instances"), "B caught up\n{b_log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_partition_move_forgotten_stays_forgotten_and_resolved_or_retried_stays_done() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) =
        two_instances("scale-repairs-move", 2).await;
    // About repairs of single records: the keys of the dead ones go on (`hold` would hold them).
    for od in [&mut a, &mut b] {
        od.config.handler_extra.push_str("on_dead = \"continue\"\n");
    }
    let events: Vec<(String, String)> = (0..10).map(|i| (format!("agg-{}", i % 4), new_event_id())).collect();
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    let (forgotten, resolved, kept, retried) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    // The first calls for `resolved` and `retried` fail for good (400): they are dead.
    receiver.set_behaviour(resolved, Behaviour::fail_first(400, 1));
    receiver.set_behaviour(retried, Behaviour::fail_first(400, 1));
    a.start();
    a.wait_for_assignment().await;
    produce(&kafka, &topic, &events).await;
    a.wait_until("A to answer every event", HANDLED_TIMEOUT, || ids.iter().all(|id| receiver.answered(id))).await;
    a.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;

    // One repair through A's admin API, two with the CLI on A's stopped store.
    repair(&a, &["store", "forget", forgotten, "--yes"]);
    a.stop();
    assert_eq!(a.store_get(resolved).state, "dead");
    let said = repair(&a, &["store", "resolve", resolved, "--done"]);
    assert!(said.contains("recorded done"), "{said}");
    let said = repair(&a, &["store", "retry", retried]);
    assert!(said.contains(&format!("{retried}: done")), "{said}");

    // B, with an empty store, owns every partition now: it restores them from the changelog.
    b.start();
    b.wait_for_assignment().await;
    assert!(get_live(&b, forgotten).is_none(), "the forgotten record stays forgotten on the new owner");
    let r = get_live(&b, resolved).expect("the resolved record on the new owner");
    assert_eq!((r["state"].as_str(), r["outcome"].as_str()), (Some("done"), Some("resolved by hand: done")), "{r}");
    assert_eq!(get_live(&b, kept).expect("kept")["state"], "done");
    assert_eq!(get_live(&b, retried).expect("the re-run record on the new owner")["state"], "done");

    // Replayed at new offsets: the forgotten event runs once more; the others do not.
    let again: Vec<(String, String)> = events[..4].to_vec();
    produce(&kafka, &topic, &again).await;
    b.wait_until("the replays to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    b.stop();
    let calls = effective_calls(&receiver);
    assert_eq!(calls.get(forgotten.as_str()), Some(&2), "the forgotten event ran once more");
    assert_eq!(receiver.handler_call_count(resolved), 1, "the resolved event did not run again");
    assert_eq!(calls.get(kept.as_str()), Some(&1), "the kept event did not run again");
    assert_eq!(calls.get(retried.as_str()), Some(&1), "the re-run event ran once, by `store retry`");
}
