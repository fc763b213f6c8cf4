//! The settings of an existing changelog topic: one that would delete records
//! while `store.retention` still counts them cannot serve (a new owner of a
//! partition would run those events again), so outboxd refuses it by name, at
//! `check-config` and at start-up, and handles nothing. Tombstones (`store forget`)
//! must outlive `store.retention` too: outboxd creates its topics so, and names an
//! existing topic that keeps them shorter, with the command that fixes it.

use crate::harness;

use std::time::Duration;

use harness::{new_event_id, Scenario};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_topic_that_deletes_records_before_the_store_retention_is_refused_by_name() {
    let Scenario { kafka, topic, receiver, mut od, producer, .. } = Scenario::new("scale-retention", 2).await;
    od.config.store_extra = "[store.changelog]\nenabled = true\n".into();
    od.config.retention = "7d".into();
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    // One day: records would leave Kafka six days before the store forgets them.
    kafka.create_topic(&changelog, 2, &[("cleanup.policy", "compact,delete"), ("retention.ms", "86400000")]).await;
    producer.send_event(&topic, "k", &new_event_id(), Some("Tick"), &json!({"n": 1})).await;

    od.start();
    let status = od.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "outboxd must refuse to start");
    let log = od.log();
    assert!(
        log.contains(&changelog) && log.contains("at least 604800000"),
        "the error names the topic and the fix: {log}"
    );
    assert_eq!(receiver.calls().len(), 0, "nothing is handled");

    // check-config (on the config the start wrote) says the same before anything runs.
    let checked = od.command(&["check-config"]);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(!checked.status.success(), "check-config must fail: {out}");
    assert!(
        out.contains(&format!("ERROR changelog topic {changelog}")) && out.contains("retention.ms=86400000"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changelog_topics_are_created_keeping_tombstones_as_long_as_the_store_retention() {
    let mut s = Scenario::new("scale-tombstones", 2).await;
    s.od.config.store_extra = "[store.changelog]\nenabled = true\n".into();
    s.od.config.retention = "3d".into();
    s.run().await;
    let Scenario { kafka, topic, mut od, .. } = s;
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    od.stop();
    let three_days = (3 * 24 * 3600 * 1000).to_string();
    assert_eq!(kafka.topic_config(&changelog, "delete.retention.ms").await.as_deref(), Some(three_days.as_str()));
    assert_eq!(kafka.topic_config(&changelog, "retention.ms").await.as_deref(), Some(three_days.as_str()));
    assert!(!od.log().contains("keeps tombstones"), "no warning about a topic outboxd created: {}", od.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_changelog_topic_that_drops_tombstones_early_is_named_with_the_fix() {
    let Scenario { kafka, topic, receiver, mut od, producer, .. } = Scenario::new("scale-tombstones-old", 2).await;
    od.config.store_extra = "[store.changelog]\nenabled = true\n".into();
    od.config.retention = "7d".into();
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    // As earlier releases created it: no delete.retention.ms (the broker's 24 h).
    kafka.create_topic(&changelog, 2, &[("cleanup.policy", "compact,delete"), ("retention.ms", "604800000")]).await;
    let fix = format!("--entity-name {changelog} --add-config delete.retention.ms=604800000");

    od.start();
    od.wait_for_assignment().await;
    let id = new_event_id();
    producer.send_event(&topic, "k", &id, Some("Tick"), &json!({"n": 1})).await;
    od.wait_until("the event", Duration::from_secs(60), || receiver.answered_ok(&id)).await;
    od.stop();
    let log = od.log();
    assert!(log.contains("delete.retention.ms=86400000") && log.contains(&fix), "the warning names the fix: {log}");

    let checked = od.command(&["check-config"]);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "a warning, not a refusal: {out}");
    assert!(out.contains(&format!("WARNING changelog topic {changelog}")) && out.contains(&fix), "{out}");

    // Fixed as the warning says: no warning any more.
    kafka
        .alter_topic_config(
            &changelog,
            &[
                ("cleanup.policy", "compact,delete"),
                ("retention.ms", "604800000"),
                ("delete.retention.ms", "604800000"),
            ],
        )
        .await;
    let checked = od.command(&["check-config"]);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(!out.contains("keeps tombstones"), "{out}");
}
