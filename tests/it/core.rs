//! Black-box tests of outboxd's delivery guarantees against a real Kafka broker and a
//! real HTTP receiver (see the harness module). Each test uses its own topics and group.

use crate::harness;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use harness::{new_event_id, Behaviour, Call, Produced, Scenario};
use serde_json::json;

/// Generous bound for "outboxd handles what it was given".
const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

fn ids_of(produced: &[Produced]) -> Vec<String> {
    produced.iter().map(|p| p.event_id.clone()).collect()
}

fn fmt_time(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_event_is_not_handled_twice() {
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::start("redeliver", 3).await;

    let key = "order-17";
    let id = new_event_id();
    let payload = json!({"orderId": 17, "total": "42.00", "lines": [1, 2]});
    let first = producer.send_event(&topic, key, &id, Some("OrderCreated"), &payload).await;
    od.wait_until("the receiver to answer the event", HANDLED_TIMEOUT, || receiver.answered(&id)).await;

    // What Debezium does after a connector restart: the same event (same id, same key)
    // again, at a new offset.
    let again = producer.send_event(&topic, key, &id, Some("OrderCreated"), &payload).await;
    assert_eq!(again.partition, first.partition, "same key, same partition");
    assert!(again.offset > first.offset);
    // The next event of the same key is handled only after the redelivery was dealt with.
    let next_id = new_event_id();
    producer.send_event(&topic, key, &next_id, Some("OrderShipped"), &json!({"orderId": 17})).await;
    od.wait_until("the next event of the same key", HANDLED_TIMEOUT, || receiver.answered(&next_id)).await;
    od.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    od.stop();

    let calls = receiver.calls_for(&id);
    assert_eq!(calls.len(), 1, "the redelivered event must not be sent again; calls: {calls:#?}");
    // The call itself, as the contract describes it.
    let call = &calls[0];
    assert_eq!(call.method, "POST");
    assert_eq!(call.path, format!("/events/{key}/{id}"));
    assert_eq!(call.header("Idempotency-Key"), Some(id.as_str()));
    assert_eq!(call.header("Outbox-Event-Type"), Some("OrderCreated"));
    assert_eq!(call.header("Outbox-Aggregate-Id"), Some(key));
    assert_eq!(call.body, payload, "the body is the event's JSON payload");

    let record = od.store_get(&id);
    assert_eq!(record.state, "done", "{record:?}");
    assert_eq!(record.topic, topic);
    assert_eq!(record.partition, first.partition);
    assert_eq!(record.key.as_deref(), Some(key));
    let stats = od.store_stats();
    assert!(
        stats["duplicates_suppressed"].as_u64().is_some_and(|n| n >= 1),
        "store stats should count the suppressed duplicate: {stats}"
    );
    assert_eq!(od.store_get(&next_id).state, "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_side_effect_before_commit_does_not_repeat() {
    const EVENTS: usize = 30;
    let mut s = Scenario::new("crash", 3).await;
    // Offsets are stored but, within this test, never committed.
    s.od.config.kafka_commit_interval = "1h".into();
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let mut produced = Vec::new();
    for i in 0..EVENTS {
        let id = new_event_id();
        produced.push(producer.send_event(&topic, &format!("acct-{i}"), &id, Some("Charged"), &json!({"n": i})).await);
    }
    let ids = ids_of(&produced);
    od.wait_until("the receiver to answer every event", HANDLED_TIMEOUT, || ids.iter().all(|id| receiver.answered(id)))
        .await;

    // Give outboxd a moment to make the completions durable, and confirm meanwhile that
    // nothing was committed: the crash below must come before any commit.
    for _ in 0..20 {
        let committed = offsets.committed();
        assert!(
            committed.values().all(Option::is_none),
            "with kafka.commit_interval = 1h nothing should be committed yet (the premise of \
             this test): {committed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    od.kill();

    od.config.kafka_commit_interval = "200ms".into();
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("committed offsets to reach the end after the restart", HANDLED_TIMEOUT, || offsets.reached_end())
        .await;
    od.stop();

    let repeated: Vec<(String, usize)> =
        ids.iter().map(|id| (id.clone(), receiver.call_count(id))).filter(|(_, n)| *n != 1).collect();
    assert!(
        repeated.is_empty(),
        "every event was handled before the crash, so the redelivery after it must not call \
         the receiver again; (event, calls): {repeated:?}"
    );
    for id in &ids {
        let r = od.store_get(id);
        assert_eq!(r.state, "done", "{r:?}");
    }
    // Duplicates are counted per store (persisted with the group commit), not per record.
    let stats = od.store_stats();
    assert!(
        stats["duplicates_suppressed"].as_u64().is_some_and(|n| n >= ids.len() as u64),
        "every redelivery after the crash should be counted as a duplicate: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_is_not_committed_before_completion() {
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::new("uncommitted", 1).await;
    // The hang must stay a hang during the test, not a timeout and a retry.
    od.config.handler_timeout = "120s".into();

    let ids: Vec<String> = (0..6).map(|_| new_event_id()).collect();
    let stuck = ids[2].clone();
    receiver.set_behaviour(&stuck, Behaviour::hang());
    let mut produced = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        produced.push(producer.send_event(&topic, &format!("user-{i}"), id, Some("Mailed"), &json!({"i": i})).await);
    }
    let stuck_offset = produced[2].offset;
    let end = produced[5].offset + 1;
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the stuck event's call to start and the other five to be answered", HANDLED_TIMEOUT, || {
        receiver.call_count(&stuck) >= 1 && ids.iter().filter(|id| **id != stuck).all(|id| receiver.answered(id))
    })
    .await;

    // The events before the stuck one are done, so the committed offset (the next
    // offset to read) reaches the stuck event, never passing it meanwhile...
    let reached = format!("the committed offset to reach the unfinished event at offset {stuck_offset}");
    od.wait_for(reached, HANDLED_TIMEOUT, async |_| {
        let committed = offsets.try_committed().map_err(|e| e.to_string())?.get(&0).copied().flatten();
        if let Some(c) = committed {
            assert!(c <= stuck_offset, "committed offset {c} passes the unfinished event at offset {stuck_offset}");
        }
        if committed == Some(stuck_offset) {
            Ok(())
        } else {
            Err(format!("committed {committed:?}"))
        }
    })
    .await;
    // ... and stays there while that event is unfinished.
    let mut sampled = 0;
    for _ in 0..30 {
        od.assert_alive();
        if let Ok(committed) = offsets.try_committed() {
            let c = committed.get(&0).copied().flatten();
            assert_eq!(c, Some(stuck_offset), "the committed offset moved while offset {stuck_offset} was unfinished");
            sampled += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sampled > 0, "could not read committed offsets");

    od.kill();
    receiver.clear_behaviour(&stuck);
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the unfinished event to be delivered again after the restart", HANDLED_TIMEOUT, || {
        receiver.call_count(&stuck) >= 2 && receiver.answered(&stuck)
    })
    .await;
    od.wait_until(format!("the committed offset to reach the end ({end})"), HANDLED_TIMEOUT, || offsets.reached_end())
        .await;
    od.stop();

    for id in ids.iter().filter(|id| **id != stuck) {
        assert_eq!(receiver.call_count(id), 1, "event {id} was done before the crash and must not be sent again");
    }
    let r = od.store_get(&stuck);
    assert_eq!(r.state, "done", "{r:?}");
    assert_eq!(offsets.committed().get(&0).copied().flatten(), Some(end));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_events_are_handled_in_order() {
    const KEYS: usize = 8;
    const PER_KEY: usize = 10;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::new("order", 1).await;
    receiver.set_default(Behaviour::delay(Duration::from_millis(50)));

    // Interleaved: k0 e0, k1 e0, ..., k7 e0, k0 e1, ...
    let mut by_key: BTreeMap<String, Vec<Produced>> = BTreeMap::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("cart-{k}");
            let id = new_event_id();
            let p = producer.send_event(&topic, &key, &id, Some("ItemAdded"), &json!({"seq": i})).await;
            by_key.entry(key).or_default().push(p);
        }
    }
    od.start();
    od.wait_for_assignment().await;
    let total = KEYS * PER_KEY;
    od.wait_until(format!("{total} answered calls"), HANDLED_TIMEOUT, || {
        receiver.calls().iter().filter(|c| c.answered.is_some()).count() >= total
    })
    .await;
    od.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.stop();

    let calls = receiver.calls();
    let mut calls_by_id: HashMap<String, Vec<&Call>> = HashMap::new();
    for c in &calls {
        calls_by_id.entry(c.event_id.clone().unwrap_or_default()).or_default().push(c);
    }
    for (key, events) in &by_key {
        // Production order = offset order in the single partition.
        let mut events = events.clone();
        events.sort_by_key(|p| p.offset);
        let mut key_calls: Vec<&Call> =
            events.iter().flat_map(|p| calls_by_id.get(&p.event_id).cloned().unwrap_or_default()).collect();
        key_calls.sort_by_key(|c| c.started);
        let called: Vec<&str> = key_calls.iter().map(|c| c.event_id.as_deref().unwrap_or("")).collect();
        let expected: Vec<&str> = events.iter().map(|p| p.event_id.as_str()).collect();
        assert_eq!(called, expected, "key {key}: calls must arrive once each, in production order");
        for pair in key_calls.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let a_end = a.answered.expect("answered");
            assert!(
                b.started >= a_end,
                "key {key}: call for {} started at {} before the previous call for {} ended at {}",
                b.event_id.as_deref().unwrap_or("?"),
                fmt_time(b.started),
                a.event_id.as_deref().unwrap_or("?"),
                fmt_time(a_end)
            );
        }
    }

    // Different keys ran concurrently.
    let mut edges: Vec<(SystemTime, i32)> = Vec::new();
    for c in &calls {
        edges.push((c.started, 1));
        edges.push((c.answered.expect("answered"), -1));
    }
    edges.sort(); // an end (-1) sorts before a start (+1) at the same instant
    let (mut now, mut max) = (0, 0);
    for (_, d) in edges {
        now += d;
        max = max.max(now);
    }
    assert!(max >= 2, "events of different keys should be handled concurrently; max concurrent calls = {max}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_message_does_not_block_partition() {
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::new("undecodable", 1).await;

    // No `id` header: cannot be deduplicated, so it cannot be handled.
    let (partition, bad_offset) =
        producer.send_raw(&topic, Some(0), Some(b"k-1"), &[], Some(b"\x00\x01not json\xff")).await;
    // An `id` header with a non-JSON value: outboxd may pass it on as raw bytes.
    let raw_id = new_event_id();
    producer
        .send_raw(&topic, Some(0), Some(b"k-2"), &[("id", Some(raw_id.as_bytes()))], Some(b"\x00garbage\xfe"))
        .await;
    let good_id = new_event_id();
    producer.send_event(&topic, "k-3", &good_id, Some("Good"), &json!({"ok": true})).await;

    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the good event after the bad ones", HANDLED_TIMEOUT, || receiver.answered(&good_id)).await;
    od.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    od.stop();

    let dead = od.store_list(Some("dead"), 1000);
    let expected_id = format!("undecodable/{topic}/{partition}/{bad_offset}");
    let record = dead
        .iter()
        .find(|r| r.event_id == expected_id)
        .unwrap_or_else(|| panic!("no dead record {expected_id}; dead records: {dead:#?}"));
    assert_eq!(record.state, "dead");
    assert!(record.reason.as_deref().is_some_and(|r| !r.trim().is_empty()), "a dead record must say why: {record:?}");
    assert_eq!(record.topic, topic);
    assert_eq!(record.partition, partition);
    assert_eq!(record.offset, bad_offset);
    assert_eq!(od.store_get(&good_id).state, "done");
}
