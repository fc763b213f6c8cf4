//! `outboxd store replay`: a window of done events runs again from the messages Kafka
//! keeps, once each, in per-key order, with the same idempotency key (or new ones with
//! `--new-key`), through the running service and on a stopped store; a dry run changes
//! nothing; events whose messages the topic's retention deleted, or whose offsets hold
//! other events since the topic was created again, are reported, not skipped or run.

use std::time::{Duration, SystemTime};

use super::hold::store;
use crate::harness::{self, Scenario};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(90);

/// A second route on the scenario's topic, to the same receiver: the mailer, on `OrderPaid`.
fn mailer(topic: &str, url: &str) -> String {
    let (t, u) = (serde_json::to_string(topic).unwrap(), serde_json::to_string(url).unwrap());
    format!(
        "\n[[handlers]]\nname = \"mailer\"\ntopics = [{t}]\nevent_types = [\"OrderPaid\"]\nkind = \"http\"\nurl = {u}\n\
         idempotency_header = \"Idempotency-Key\"\n"
    )
}

/// `n` events over four keys, `OrderCreated` and `OrderPaid` in turn: (id, key, type).
fn events(n: usize) -> Vec<(String, String, &'static str)> {
    let types = ["OrderCreated", "OrderPaid"];
    (0..n).map(|i| (harness::new_event_id(), format!("order-{}", i % 4), types[i % 2])).collect()
}

/// Sends `events` (from [`events`]) to `topic`, in order.
async fn send(producer: &harness::Producer, topic: &str, events: &[(String, String, &str)]) {
    for (id, key, t) in events {
        producer.send_event(topic, key, id, Some(t), &json!({"id": id})).await;
    }
}

/// The audit entries naming `id` whose action is `replay`.
fn replay_entries(od: &harness::Outboxd, id: &str) -> Vec<Value> {
    let entries = od.store_json(&["audit", "--id", id]);
    entries.as_array().expect("a list").iter().filter(|e| e["action"] == "replay").cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_done_events_runs_again_once_each_in_key_order_and_a_dry_run_changes_nothing() {
    let mut s = Scenario::new("replay", 2).await;
    s.od.config.extra_toml = mailer(&s.topic, &s.receiver.events_url());
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;
    let send = |batch: &[(String, String, &'static str)]| {
        let (producer, topic) = (&producer, &topic);
        let batch = batch.to_vec();
        async move {
            for (id, key, t) in &batch {
                producer.send_event(topic, key, id, Some(t), &json!({"id": id, "type": t})).await;
            }
        }
    };
    let mails = |batch: &[(String, String, &str)]| -> Vec<String> {
        batch.iter().filter(|e| e.2 == "OrderPaid").map(|e| format!("{}#mailer", e.0)).collect()
    };

    // Events handled before the window opens: every call answered before `since` is taken.
    let before = events(6);
    send(&before).await;
    od.wait_until("the earlier events' calls", TIMEOUT, || {
        before.iter().all(|e| receiver.answered_ok(&e.0)) && mails(&before).iter().all(|k| receiver.answered_ok(k))
    })
    .await;
    let since = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
    let window = events(12);
    send(&window).await;
    od.wait_until("the window's calls", TIMEOUT, || {
        window.iter().all(|e| receiver.answered_ok(&e.0)) && mails(&window).iter().all(|k| receiver.answered_ok(k))
    })
    .await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    let selected = window.len() + mails(&window).len();

    // A dry run, through the running service: the impact, and nothing changed.
    let calls_before = receiver.calls().len();
    let dry = store(&od, &["replay", "--topic", &topic, "--since", &since, "--dry-run", "--reason", "check"]);
    assert!(dry.contains(&format!("{selected} event(s) would run again")), "{dry}");
    assert_eq!(receiver.calls().len(), calls_before, "a dry run called the receiver");

    // The replay, through the running service: each event of the window once more, on
    // each of its routes, with the same idempotency key; nothing before the window.
    let said = store(&od, &["replay", "--topic", &topic, "--since", &since, "--reason", "the CRM lost a day"]);
    assert!(said.contains(&format!("replayed {selected} event(s): {selected} done")), "{said}");
    for (id, _, t) in &window {
        assert_eq!(receiver.handler_call_count(id), 2, "{id} ({t}) on the first route");
        let mail = format!("{id}#mailer");
        assert_eq!(receiver.handler_call_count(&mail), if *t == "OrderPaid" { 2 } else { 0 }, "{mail}");
    }
    for (id, _, _) in &before {
        assert_eq!(receiver.handler_call_count(id), 1, "{id} was before the window");
    }
    // Per key, the replayed calls came in the order the events did.
    let mut replayed: Vec<_> =
        receiver.calls().into_iter().filter(|c| c.is_handler_call() && c.seq >= calls_before).collect();
    replayed.sort_by_key(|c| c.seq);
    for key in (0..4).map(|k| format!("order-{k}")) {
        let got: Vec<String> = replayed
            .iter()
            .filter_map(|c| c.event_id.clone())
            .filter(|id| window.iter().any(|e| &e.0 == id && e.1 == key))
            .collect();
        let want: Vec<String> = window.iter().filter(|e| e.1 == key).map(|e| e.0.clone()).collect();
        assert_eq!(got, want, "the replayed calls of key {key}, out of order");
    }

    // On the stopped store: only OrderPaid, with new keys, so a receiver that dedups by
    // key runs them again. The records stay done; each replay is in the audit.
    od.stop();
    let calls_before = receiver.calls().len();
    let paid = window.iter().filter(|e| e.2 == "OrderPaid").count();
    let said = store(
        &od,
        &["replay", "--topic", &topic, "--since", &since, "--type", "OrderPaid", "--new-key", "--reason", "resend"],
    );
    assert!(said.contains(&format!("replayed {} event(s): {} done", 2 * paid, 2 * paid)), "{said}");
    let new_keys: Vec<String> = receiver.calls()[calls_before..].iter().filter_map(|c| c.event_id.clone()).collect();
    assert_eq!(new_keys.len(), 2 * paid, "{new_keys:?}");
    for (id, _, t) in window.iter().filter(|e| e.2 == "OrderPaid") {
        let first = new_keys.iter().filter(|k| k.starts_with(&format!("{id}#replay-"))).count();
        let mail = new_keys.iter().filter(|k| k.starts_with(&format!("{id}#mailer#replay-"))).count();
        assert_eq!((first, mail), (1, 1), "{id} ({t}): {new_keys:?}");
        assert_eq!(od.store_json(&["get", id])["state"], "done");
    }
    let created = &window.iter().find(|e| e.2 == "OrderCreated").unwrap().0;
    let entries = replay_entries(&od, created);
    assert_eq!(entries.len(), 1, "{entries:#?}");
    assert_eq!(entries[0]["reason"], "the CRM lost a day");
    assert!(entries[0]["outcome"].as_str().unwrap_or_default().starts_with("done"), "{entries:#?}");

    // The mailer route is gone from the config: its records are not run, and say so.
    od.config.extra_toml = String::new();
    od.write_config();
    let calls_before = receiver.calls().len();
    let out =
        od.command(&["store", "replay", "--topic", &topic, "--since", &since, "--type", "OrderPaid", "--reason", "x"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("replayed {paid} event(s): {paid} done")), "{stdout}");
    assert!(
        stdout.contains(&format!("{paid} event(s) not replayed")) && stdout.contains("no route takes it"),
        "{stdout}"
    );
    assert_eq!(receiver.calls().len(), calls_before + paid, "the first route's calls only");
    let mail_record = od.store_json(&["list", "--limit", "1000"]);
    let mails_done = mail_record
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["scope"] == format!("{topic}#mailer").as_str() && r["state"] == "done")
        .count();
    assert_eq!(mails_done, mails(&window).len() + mails(&before).len(), "the mailer's records as they were");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_past_the_topics_retention_are_reported_and_the_rest_replayed() {
    let s = Scenario::start("replay-retention", 1).await;
    let Scenario { kafka, topic, receiver, mut od, offsets, producer, .. } = s;
    let sent = events(10);
    send(&producer, &topic, &sent).await;
    od.wait_until("every call", TIMEOUT, || sent.iter().all(|e| receiver.answered_ok(&e.0))).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    // The topic's retention deletes the first four.
    kafka.delete_records_before(&topic, 0, 4).await;

    let dry = store(&od, &["replay", "--topic", &topic, "--since", "1h", "--dry-run", "--reason", "check"]);
    assert!(dry.contains("6 event(s) would run again"), "{dry}");
    assert!(dry.contains("4 event(s) cannot be replayed") && dry.contains("offsets 0..=3"), "{dry}");

    let out = od.command(&["store", "replay", "--topic", &topic, "--since", "1h", "--reason", "receiver restored"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "a replay that left events out must fail: {stdout}\n{stderr}");
    assert!(stdout.contains("replayed 6 event(s): 6 done") && stdout.contains("4 event(s) not replayed"), "{stdout}");
    assert!(stderr.contains("4 event(s) were not replayed"), "{stderr}");
    for (i, (id, _, _)) in sent.iter().enumerate() {
        assert_eq!(receiver.handler_call_count(id), if i < 4 { 1 } else { 2 }, "{id} at offset {i}");
    }
    od.stop();
    let entries = replay_entries(&od, &sent[0].0);
    assert_eq!(entries.len(), 1, "{entries:#?}");
    assert!(entries[0]["outcome"].as_str().unwrap_or_default().contains("no longer holds"), "{entries:#?}");
}

/// The topic was deleted and created again, so its offsets started over: what sits at a
/// record's offset now is another event. The replay reports it and runs nothing, neither
/// under the record nor the event found there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_event_at_a_records_offset_is_reported_and_nothing_runs() {
    let s = Scenario::start("replay-recreated", 1).await;
    let Scenario { kafka, topic, receiver, mut od, offsets, producer, .. } = s;
    let first = events(3);
    send(&producer, &topic, &first).await;
    od.wait_until("every call", TIMEOUT, || first.iter().all(|e| receiver.answered_ok(&e.0))).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    od.stop();
    kafka.delete_topic(&topic).await;
    kafka.create_topic(&topic, 1, &[]).await;
    let others = events(3);
    send(&producer, &topic, &others).await;
    let calls_before = receiver.calls().len();

    let out = od.command(&["store", "replay", "--topic", &topic, "--since", "1h", "--reason", "after a restore"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("replayed 0 event(s)") && stdout.contains("3 event(s) not replayed"), "{stdout}");
    for (id, _, _) in &others {
        assert!(stdout.contains(&format!("another event ({id})")), "{id} named: {stdout}");
    }
    assert_eq!(receiver.calls().len(), calls_before, "a replay ran an event");
    for (id, _, _) in &first {
        assert_eq!(od.store_json(&["get", id])["state"], "done", "{id} as it was");
    }
    for (id, _, _) in &others {
        let out = od.command(&["store", "get", id]);
        assert!(!out.status.success(), "{id} has a record: the replay ran it");
    }
    let entries = replay_entries(&od, &first[0].0);
    assert!(entries[0]["outcome"].as_str().unwrap_or_default().contains("another event"), "{entries:#?}");
}
