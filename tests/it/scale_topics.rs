//! The settings of an existing changelog topic: one that would delete records
//! while `store.retention` still counts them cannot serve (a new owner of a
//! partition would run those events again), so outboxd refuses it by name, at
//! `check-config` and at start-up, and handles nothing.

use crate::harness;

use std::time::Duration;

use harness::{new_event_id, unique_name, Kafka, Outboxd, Receiver};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_topic_that_deletes_records_before_the_store_retention_is_refused_by_name() {
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("scale-retention"), 2, &[]).await;
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&topic], &receiver);
    od.config.store_extra = "[store.changelog]\nenabled = true\n".into();
    od.config.retention = "7d".into();
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    // One day: records would leave Kafka six days before the store forgets them.
    kafka.create_topic(&changelog, 2, &[("cleanup.policy", "compact,delete"), ("retention.ms", "86400000")]).await;
    kafka.producer().send_event(&topic, "k", &new_event_id(), Some("Tick"), &json!({"n": 1})).await;

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
