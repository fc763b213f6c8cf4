//! outboxd dies in the middle of a restore that writes packed runs: an empty store
//! takes a changelog partition, so its records wait in memory and are written as runs
//! (`Store::write_unwritten`). At each step of that write (through the debug builds'
//! `OUTBOXD_DEBUG_CRASH_IN_RESTORE`, which aborts as a SIGKILL would leave the
//! process) it dies, is started again, restores again from its last durable
//! checkpoint, and Debezium replays every event: none is called, each record is there
//! once, and the counts hold each once.

use std::time::Duration;

use serde_json::json;

use crate::harness::changelog;
use crate::harness::Scenario;
use crate::scale::on;

/// Records in the changelog partition: one restore batch or a few, all written as runs at its end.
const RECORDS: usize = 3_000;
const TIMEOUT: Duration = Duration::from_secs(90);

async fn crash_in_restore_then_replay(step: &str) {
    let Scenario { kafka, topic, receiver, od, offsets, producer } =
        Scenario::new(&format!("restore-crash-{step}"), 1).await;
    let mut od = on(od);
    let changelog_topic = changelog::topic_for(&od.config.group_id, &topic);
    kafka.create_topic(&changelog_topic, 1, &[("cleanup.policy", "compact,delete")]).await;
    let ids = changelog::fill(&kafka, &changelog_topic, &topic, 0, RECORDS).await;

    od.config.env.insert("OUTBOXD_DEBUG_CRASH_IN_RESTORE".into(), step.into());
    od.start();
    od.wait_crashed_at("restore", step, TIMEOUT);

    // Started again as it was, without the crash: it restores from its last durable
    // checkpoint (none, or one below the records it was writing).
    od.config.env.remove("OUTBOXD_DEBUG_CRASH_IN_RESTORE");
    od.start();
    od.wait_for_assignment().await;
    // Debezium sends every event again: each was done before the crash.
    for (i, id) in ids.iter().enumerate() {
        producer.send_event(&topic, &format!("agg-{}", i % 1000), id, Some("OrderCreated"), &json!({"i": i})).await;
    }
    od.wait_until(format!("committed offsets at the end ({})", offsets.describe()), TIMEOUT, || offsets.reached_end())
        .await;
    od.stop();

    let called: Vec<&String> = ids.iter().filter(|id| !receiver.calls_for(id).is_empty()).collect();
    assert!(called.is_empty(), "{step}: {} restored events called again, e.g. {:?}", called.len(), called.first());
    let stats = od.store_stats();
    assert_eq!(stats["done"], json!(RECORDS), "{step}: each restored record counted once: {stats}");
    assert_eq!(stats["duplicates_suppressed"], json!(RECORDS), "{step}: every replay suppressed: {stats}");
    let done = od.store_list(Some("done"), 2 * RECORDS);
    assert_eq!(done.len(), RECORDS, "{step}: each record listed once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_restored_run_is_written_and_before_it_is_added_loses_nothing() {
    crash_in_restore_then_replay("packed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_restored_run_is_added_and_before_that_is_durable_loses_nothing() {
    crash_in_restore_then_replay("installed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_restored_runs_are_written_and_before_the_checkpoint_moves_loses_nothing() {
    crash_in_restore_then_replay("written").await;
}
