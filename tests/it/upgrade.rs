//! The upgrade to several instances: a store written with `[store.changelog]
//! enabled = false` (or by a release without a changelog) holds records no changelog
//! topic has. Started with the changelog on, outboxd copies them into the changelog
//! before it handles anything, so a second instance that takes partitions over, and
//! restores them, suppresses replays of events the first one handled alone.
//!
//! Size knob: `OUTBOXD_UPGRADE_EVENTS` (default 1000).

use crate::harness;

use std::time::Duration;

use harness::changelog::{entries_by_id, log_field, log_number, topic_for};
use harness::{env_usize, new_event_id, Kafka, Outboxd, Scenario};

use crate::scale::{assert_each_executed_once, produce, replay_then_one_more};

const PARTITIONS: i32 = 4;
const KEYS: usize = 40;
const HANDLED_TIMEOUT: Duration = Duration::from_secs(120);
const OFF: &str = "[store.changelog]\nenabled = false\n";
const ON: &str = "[store.changelog]\nenabled = true\n";

fn events(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("agg-{}", i % KEYS), new_event_id())).collect()
}

/// One instance handles `events` with the changelog off, and stops.
async fn handled_with_the_changelog_off(kafka: &Kafka, a: &mut Outboxd, topic: &str, events: &[(String, String)]) {
    let receiver_ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    let offsets = kafka.offsets(&a.config.group_id, topic);
    a.config.store_extra = OFF.into();
    a.start();
    a.wait_for_assignment().await;
    produce(kafka, topic, events).await;
    a.wait_until(format!("the events to be committed ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    a.stop();
    assert!(!receiver_ids.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_handled_with_the_changelog_off_are_not_run_again_after_a_second_instance_joins() {
    let Scenario { kafka, topic, receiver, od: mut a, offsets, .. } = Scenario::new("upgrade", PARTITIONS).await;
    let mut b = Outboxd::new(&kafka, &[&topic], &receiver);
    b.config.group_id = a.config.group_id.clone();
    b.config.store_extra = ON.into();
    let events = events(env_usize("OUTBOXD_UPGRADE_EVENTS", 1000));
    handled_with_the_changelog_off(&kafka, &mut a, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(receiver.count_answered_ok(&ids), ids.len(), "A handled every event alone");

    // The upgrade: the same store, the changelog on.
    a.config.store_extra = ON.into();
    a.start();
    a.wait_for_assignment().await;
    let log = a.log();
    let copied = log.lines().find(|l| l.contains("the store's records are in the changelog")).unwrap_or_else(|| {
        panic!("A copied its records into the changelog at start-up: {log}");
    });
    assert_eq!(log_number(copied, "sent"), ids.len() as i64, "{copied}");
    assert!(
        log.find("the store's records are in the changelog") < log.find("partitions assigned"),
        "the copy ends before A joins its group"
    );

    // Partitions move to B, which restores them from the changelog.
    b.start();
    b.wait_for_assignment().await;
    let all = replay_then_one_more(&kafka, &topic, &mut b, &receiver, &offsets, &events, HANDLED_TIMEOUT).await;
    b.stop();
    a.stop();
    assert!(b.log().contains("partition restored"), "B restored what it took over");
    assert_each_executed_once(&receiver, &all);
}

/// A copy the brokers cut part-way (here: a record larger than the changelog
/// topic takes, refused for good, so the copy stops at a known batch; a crash stops
/// it the same way) goes on from the last acknowledged batch at the next start:
/// every record ends up in the changelog, the store is marked complete, and the
/// start after that copies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_cut_part_way_goes_on_from_its_last_acknowledged_batch() {
    let Scenario { kafka, topic, receiver, od: mut a, offsets, producer } = Scenario::new("upgrade-resume", 1).await;
    let n = 200;
    let mut ids: Vec<String> = (0..n).map(|_| new_event_id()).collect();
    ids.sort();
    // The record in the middle of the copy's key order gets an event type too large for the topic below.
    let big = ids[n / 2].clone();
    a.config.store_extra = OFF.into();
    a.start();
    a.wait_for_assignment().await;
    let large_type: String = (0..200).map(|_| format!("{:032x}", rand::random::<u128>())).collect();
    for id in &ids {
        let event_type = if *id == big { large_type.as_str() } else { "Tick" };
        producer.send_event(&topic, "k", id, Some(event_type), &serde_json::json!({"id": id})).await;
    }
    a.wait_until("the events to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    a.stop();

    let changelog = topic_for(&a.config.group_id, &topic);
    let settings = |max: &'static str| {
        [
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", "604800000"),
            ("delete.retention.ms", "604800000"),
            ("max.message.bytes", max),
        ]
    };
    kafka.create_topic(&changelog, 1, &settings("2000")).await;
    a.config.retention = "7d".into();
    a.config.store_extra = format!("{ON}publish_batch = 10\n");
    a.start();
    let status = a.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "the refused record stops the copy: {}", a.log());
    let first = entries_by_id(&kafka, &changelog, &topic);
    assert!(first.len() >= 10 && first.len() < n / 2 + 10, "the copy stopped around the middle: {}", first.len());
    assert_eq!(receiver.calls_for(&ids[0]).len(), 1, "nothing was handled meanwhile");

    kafka.alter_topic_config(&changelog, &settings("1048588")).await;
    a.start();
    a.wait_for_assignment().await;
    let log = a.log();
    let line = log.lines().find(|l| l.contains("the store's records are in the changelog")).expect("copy ended");
    assert_eq!(log_field(line, "resumed").as_deref(), Some("true"), "{line}");
    let sent = log_number(line, "sent") as usize;
    assert!(sent <= n - first.len() + 10, "went on from its cursor ({sent} sent, {} before)", first.len());
    a.stop();
    let all = entries_by_id(&kafka, &changelog, &topic);
    let missing: Vec<&String> = ids.iter().filter(|id| !all.contains_key(*id)).collect();
    assert!(missing.is_empty(), "{} records never reached the changelog, e.g. {:?}", missing.len(), missing.first());

    // Marked complete: the next start copies nothing, and the command says so.
    a.start();
    a.wait_for_assignment().await;
    a.stop();
    assert!(!a.log().contains("copying them before joining"), "{}", a.log());
    let out = a.command(&["store", "publish"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("has every record"), "{text}");
}
