//! An outsider writing to a changelog topic (`[store.changelog] key`): records
//! outboxd did not sign are never applied, by the owner that follows its
//! partitions nor by a new owner that restores them, and they are counted
//! (`outboxd_changelog_records_rejected_total`); records outboxd signed, copied and
//! written again after their event moved on, are refused as older than what the
//! instances hold. Without a key, start-up says who can steer side effects. The
//! outcomes are the receiver's calls.

use crate::harness;

use std::collections::HashMap;
use std::time::Duration;

use harness::changelog::{topic_for, write_again, write_done, write_tombstones, written};
use harness::{new_event_id, Behaviour, Kafka, Outboxd, Receiver, Scenario};
use outboxd::store::changelog::mac::Keys;
use outboxd::store::State;
use serde_json::{json, Value};

use super::scale::{on, produce};

/// The key every instance of a test's group signs with.
const KEY: &str = "it-changelog-key-0123456789abcdef0123456789";
/// A key of the outsider's own: it signs, but no instance accepts it.
const OUTSIDER_KEY: &str = "it-outsider-key-0123456789abcdef0123456789";
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the owner may take to read what others wrote to its changelog (a few
/// `store.changelog.follow_interval`s, 1 s by default, on a slow machine).
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(30);
const REJECTED: &str = "outboxd_changelog_records_rejected_total";
/// The Kafka key of events that wait for one another (`on_dead = "hold"`, the default).
const ORDER_KEY: &str = "order-7";
const NOT_SIGNED_WARNING: &str = "store.changelog.key is not set";

/// `od` with the changelog on and signed with [`KEY`].
fn signed(od: Outboxd) -> Outboxd {
    let mut od = on(od);
    od.config.store_extra.push_str("key = \"${CHANGELOG_KEY}\"\n");
    od.config.env.insert("CHANGELOG_KEY".into(), KEY.into());
    od
}

/// The MAC keys of a config with `secret` as `store.changelog.key`, as outboxd builds them.
fn keys(secret: &str) -> Keys {
    let text = format!(
        "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[store]\npath=\"p\"\n[store.changelog]\nkey={secret:?}\n\
         [[handlers]]\ntopics=[\"t\"]\nkind=\"log\"\n"
    );
    Keys::new(&outboxd::config::Config::parse(&text, &|_| None).expect("config").store.changelog.expect("on"))
}

/// The forgeries an outsider can make, one per record in turn: no MAC, a MAC of
/// the outsider's own key, and random bytes under the id of the group's key.
fn forged_mac(changelog: &str, partition: i32) -> impl Fn(&[u8], Option<&[u8]>) -> Option<Vec<u8>> {
    let (outsider, ours, changelog) = (keys(OUTSIDER_KEY), keys(KEY), changelog.to_owned());
    let n = std::sync::atomic::AtomicUsize::new(0);
    move |key, value| match n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3 {
        0 => None,
        1 => outsider.sign(&changelog, partition, key, value).map(|m| m.to_vec()),
        _ => {
            let mut mac = ours.sign(&changelog, partition, key, value).expect("signed").to_vec();
            let tag = mac.len() - 2;
            mac[2..].copy_from_slice(&new_event_id().as_bytes()[..tag]);
            Some(mac)
        }
    }
}

/// Records `od` rejected so far (every reason), once it answers `/metrics`.
async fn rejected(od: &Outboxd) -> Option<f64> {
    harness::metrics::try_scrape(od).await.map(|m| harness::metrics::sample(&m, REJECTED, &[]))
}

/// Waits until `od` has rejected at least `n` changelog records.
async fn wait_for_rejections(od: &mut Outboxd, n: usize, doing: &str) {
    od.wait_for(format!("{doing} to reject {n} changelog records"), FOLLOW_TIMEOUT, async |od| {
        let seen = rejected(od).await;
        if seen.is_some_and(|r| r >= n as f64) {
            Ok(())
        } else {
            Err(format!("{seen:?} rejected"))
        }
    })
    .await;
}

/// Effective (2xx) handler calls per event id.
fn effective_calls(receiver: &Receiver) -> HashMap<String, usize> {
    let mut per_id = HashMap::new();
    for call in receiver.calls().iter().filter(|c| c.is_handler_call() && c.effective()) {
        *per_id.entry(call.event_id.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    per_id
}

fn assert_each_ran_once(receiver: &Receiver, ids: &[String], when: &str) {
    let calls = effective_calls(receiver);
    let wrong: Vec<(&String, usize)> =
        ids.iter().map(|id| (id, calls.get(id).copied().unwrap_or(0))).filter(|(_, n)| *n != 1).collect();
    assert!(
        wrong.is_empty(),
        "{when}: {} of {} events did not run exactly once, e.g. {:?}",
        wrong.len(),
        ids.len(),
        &wrong[..wrong.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_done_records_in_the_changelog_are_rejected_so_their_events_still_run_once() {
    let mut s = Scenario::new("changelog-auth-done", 1).await;
    s.od = signed(s.od);
    s.run().await;
    let Scenario { kafka, topic, receiver, od: mut a, offsets, .. } = s;
    let changelog = topic_for(&a.config.group_id, &topic);

    // The outsider says these events are done before they ever reach outboxd.
    let events: Vec<(String, String)> = (0..60).map(|i| (format!("agg-{}", i % 6), new_event_id())).collect();
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    write_done(&kafka, &changelog, &topic, 0, &ids, &forged_mac(&changelog, 0)).await;
    wait_for_rejections(&mut a, ids.len(), "the owner following its changelog").await;

    produce(&kafka, &topic, &events).await;
    a.wait_until("every event to run", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    a.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    assert_each_ran_once(&receiver, &ids, "after the forged done records");
    let a_log = a.log();
    a.stop();
    assert!(a_log.contains("changelog record rejected, not applied"), "rejections are logged\n{a_log}");
    assert!(!a_log.contains(NOT_SIGNED_WARNING), "no warning with a key\n{a_log}");

    // A new owner with an empty store restores the partition: the forgeries are
    // rejected again, the records outboxd signed are applied (replays do not run).
    a_new_owner_rejects_the_forgeries_and_suppresses_replays(
        &kafka,
        &topic,
        &receiver,
        &a,
        &events,
        "after the replays on the new owner",
    )
    .await;
}

/// B, of `a`'s group with an empty store, restores the partition: it rejects
/// the forgeries again and applies the records outboxd signed, so replays of
/// `events` run nothing again.
async fn a_new_owner_rejects_the_forgeries_and_suppresses_replays(
    kafka: &Kafka,
    topic: &str,
    receiver: &Receiver,
    a: &Outboxd,
    events: &[(String, String)],
    context: &str,
) {
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    let offsets = kafka.offsets(&a.config.group_id, topic);
    let mut b = signed(Outboxd::new(kafka, &[topic], receiver));
    b.config.group_id = a.config.group_id.clone();
    b.start();
    b.wait_for_assignment().await;
    assert!(rejected(&b).await.is_some_and(|r| r >= ids.len() as f64), "the restore rejected the forgeries");
    produce(kafka, topic, events).await;
    b.wait_until("the replays to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    b.stop();
    assert_each_ran_once(receiver, &ids, context);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tombstones_in_the_changelog_are_rejected_so_done_events_do_not_run_again() {
    let mut s = Scenario::new("changelog-auth-tombstones", 1).await;
    s.od = signed(s.od);
    s.run().await;
    let Scenario { kafka, topic, receiver, od: mut a, offsets, .. } = s;
    let changelog = topic_for(&a.config.group_id, &topic);
    let events: Vec<(String, String)> = (0..45).map(|i| (format!("agg-{}", i % 5), new_event_id())).collect();
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    produce(&kafka, &topic, &events).await;
    a.wait_until("every event to run", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    a.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;

    // The outsider "forgets" every handled event, as `store forget` would.
    write_tombstones(&kafka, &changelog, &topic, 0, &ids, &forged_mac(&changelog, 0)).await;
    wait_for_rejections(&mut a, ids.len(), "the owner following its changelog").await;
    produce(&kafka, &topic, &events).await;
    a.wait_until("the replays to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    a.stop();
    assert_each_ran_once(&receiver, &ids, "after the forged tombstones, on the owner");

    a_new_owner_rejects_the_forgeries_and_suppresses_replays(
        &kafka,
        &topic,
        &receiver,
        &a,
        &events,
        "after the forged tombstones, on a new owner",
    )
    .await;
}

/// Records `od` refused so far for being older than the record it holds.
async fn refused_as_older(od: &Outboxd) -> Option<f64> {
    harness::metrics::try_scrape(od).await.map(|m| harness::metrics::sample(&m, REJECTED, &[("reason", "stale")]))
}

/// `outboxd store ARGS` through the running service; it must succeed. Its stdout.
fn store(od: &Outboxd, args: &[&str]) -> String {
    let full: Vec<&str> = ["store"].iter().chain(args).copied().collect();
    let out = od.command(&full);
    let said = harness::store::describe(&out);
    assert!(out.status.success(), "{full:?}: {said}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sends `events` (key, id) in order.
async fn send_in_order(kafka: &Kafka, topic: &str, events: &[(String, String)]) {
    let producer = kafka.producer();
    for (key, id) in events {
        producer.send_event(topic, key, id, Some("OrderEvent"), &json!({ "id": id })).await;
    }
}

/// The MAC says who wrote a record and where, not when: an event's `held` record
/// (with its message copy) and the dead record it waited behind, read from the topic
/// as outboxd signed them, are written there again once both events ran to done. The
/// owner refuses each (older than the record it holds), so the held event is not run
/// again and redeliveries are duplicates; a new owner restoring the partition refuses
/// them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_records_written_again_after_their_events_ran_are_refused_so_nothing_runs_twice() {
    let mut s = Scenario::new("changelog-auth-again", 1).await;
    s.od = signed(s.od);
    s.run().await;
    let Scenario { kafka, topic, receiver, od: mut a, offsets, .. } = s;
    let changelog = topic_for(&a.config.group_id, &topic);
    let (dead, held) = (new_event_id(), new_event_id());
    let events = vec![(ORDER_KEY.to_owned(), dead.clone()), (ORDER_KEY.to_owned(), held.clone())];
    let ids = vec![dead.clone(), held.clone()];
    // The first event fails for good once: it holds the second.
    receiver.set_behaviour(&dead, Behaviour::fail_first(400, 1));
    send_in_order(&kafka, &topic, &events).await;
    a.wait_until("both offsets committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    assert_eq!(receiver.call_count(&held), 0, "held behind the dead event");
    let copied = [(&held, State::Held), (&dead, State::Dead)]
        .map(|(id, state)| written(&kafka, &changelog, &topic, id, state).expect("outboxd wrote it"));
    assert!(copied.iter().all(|m| m.header("mac").is_some()), "outboxd signed them");

    // Retried (the receiver takes it now): done, and the held event runs, once.
    let said = store(&a, &["retry", &dead]);
    assert!(said.contains(&format!("{dead}: done")), "{said}");
    a.wait_until("the held event to run", HANDLED_TIMEOUT, || receiver.answered_ok(&held)).await;
    harness::wait_until("the held event's done record in the changelog", HANDLED_TIMEOUT, || {
        written(&kafka, &changelog, &topic, &held, State::Done).is_some()
    })
    .await;

    // The held record again: the owner follows its changelog and refuses it; were it
    // applied, the held event would be released and run a second time.
    write_again(&kafka, &changelog, &copied[0]).await;
    let ran_again = || receiver.handler_call_count(&held) > 1;
    a.wait_for("the owner to refuse the held record (or run the event again)", FOLLOW_TIMEOUT, async |od| {
        let n = refused_as_older(od).await;
        if n.is_some_and(|n| n >= 1.0) || ran_again() {
            Ok(())
        } else {
            Err(format!("{n:?} refused"))
        }
    })
    .await;
    assert!(!ran_again(), "the held record written again made the owner run its event a second time");
    // The dead record again: refused too, so the key's events are not held behind it.
    write_again(&kafka, &changelog, &copied[1]).await;
    a.wait_for("the owner to refuse the dead record", FOLLOW_TIMEOUT, async |od| {
        let n = refused_as_older(od).await;
        if n.is_some_and(|n| n >= 2.0) {
            Ok(())
        } else {
            Err(format!("{n:?} refused"))
        }
    })
    .await;

    // Debezium sends both again (a connector restart): duplicates.
    send_in_order(&kafka, &topic, &events).await;
    a.wait_until("the redeliveries to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    assert_each_ran_once(&receiver, &ids, "after the records written again, on the owner");
    assert_eq!(receiver.handler_call_count(&held), 1, "no second call for the held event");
    let a_log = a.log();
    a.stop();
    assert!(a_log.contains("it is older than the record held for its key"), "refusals are logged\n{a_log}");
    for id in &ids {
        let r = harness::store::get(&a, id);
        assert_eq!((&r["state"], &r["chain"]), (&json!("done"), &Value::Null), "store get {id}: {r}");
    }

    a_new_owner_rejects_the_forgeries_and_suppresses_replays(
        &kafka,
        &topic,
        &receiver,
        &a,
        &events,
        "after the records written again, on a new owner",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_start_up_warns_that_whoever_writes_the_changelog_steers_side_effects() {
    let mut s = Scenario::new("changelog-auth-unsigned", 1).await;
    s.od = on(s.od);
    s.run().await;
    let Scenario { od: mut a, .. } = s;
    let log = a.log();
    a.stop();
    let warning = log.lines().find(|l| l.contains(NOT_SIGNED_WARNING)).unwrap_or_else(|| panic!("no warning\n{log}"));
    for says in ["WARN", "can write to the changelog topics", "run handled events", "docs/security.md"] {
        assert!(warning.contains(says), "the warning says {says:?}: {warning}");
    }
}

#[test]
fn check_config_refuses_a_short_changelog_key_and_names_the_one_that_signs() {
    let kafka = Kafka::connect();
    let receiver = Receiver::start();
    let mut od = signed(Outboxd::new(&kafka, &["outbox.event.check"], &receiver));
    let check = |od: &Outboxd| {
        std::fs::write(od.config_path(), od.config.to_toml()).expect("write the config");
        let out = od.command(&["check-config"]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = check(&od);
    assert!(ok, "{stdout}{stderr}");
    let id = keys(KEY).key_id().expect("a key id");
    assert!(stdout.contains(&format!("records signed with key id {id}")), "{stdout}");
    assert!(stdout.contains("unsigned records rejected"), "{stdout}");

    od.config.env.insert("CHANGELOG_KEY".into(), "hunter2".into());
    let (ok, stdout, stderr) = check(&od);
    assert!(!ok, "a 7-byte key is refused\n{stdout}");
    assert!(stderr.contains("store.changelog.key") && stderr.contains("too short"), "{stderr}");
}
