//! An outsider writing to a changelog topic (`[store.changelog] key`): records
//! outboxd did not sign are never applied, by the owner that follows its
//! partitions nor by a new owner that restores them, and they are counted
//! (`outboxd_changelog_records_rejected_total`). Without a key, start-up says who
//! can steer side effects. The outcomes are the receiver's calls.

use crate::harness;

use std::collections::HashMap;
use std::time::Duration;

use harness::changelog::{topic_for, write_done, write_tombstones};
use harness::{new_event_id, Kafka, Outboxd, Receiver, Scenario};
use outboxd::store::changelog::mac::Keys;

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
