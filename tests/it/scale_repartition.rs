//! A source topic that gained partitions: outboxd refuses to start with a
//! message that says how to go on, and following it keeps every event handled
//! before the change from running again when it is replayed (its key may now
//! land on a new partition, whose changelog does not have its record).

use crate::harness;
use crate::scale::{assert_each_executed_once, on, produce};

use std::time::Duration;

use harness::changelog;
use harness::logs::strip_ansi;
use harness::{new_event_id, Scenario};

const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_source_gains_partitions_the_way_the_refusal_gives_keeps_replays_suppressed() {
    let mut s = Scenario::new("repartition", 2).await;
    s.od = on(s.od);
    let events: Vec<(String, String)> = (0..120).map(|i| (format!("agg-{}", i % 40), new_event_id())).collect();
    s.run().await;
    let Scenario { kafka, topic, receiver, mut od, offsets, .. } = s;
    produce(&kafka, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    od.wait_until("every event", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    od.wait_until("the offsets to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.stop();

    kafka.add_partitions(&topic, 4).await;
    od.start();
    let status = od.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "outboxd started with a changelog topic of fewer partitions than its source");
    let changelog_topic = changelog::topic_for(&od.config.group_id, &topic);
    let log = strip_ansi(&od.log());
    let fix = format!("--alter --topic {changelog_topic} --partitions 4");
    assert!(log.contains(&fix), "the refusal does not say how to go on ({fix}):\n{}", od.log_tails(10, 0));

    // What the message says: add partitions to the changelog, then one instance
    // (it owns and restores every partition) for the dedup window.
    kafka.add_partitions(&changelog_topic, 4).await;
    std::fs::remove_dir_all(&od.config.store_path).expect("empty the store: the changelog must carry it");
    od.start();
    od.wait_for_assignment().await;
    let replayed = produce(&kafka, &topic, &events).await;
    assert!(replayed.iter().any(|p| p.partition >= 2), "the premise: some keys moved to the new partitions");
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    od.wait_until("the replays to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.stop();
    assert_each_executed_once(&receiver, &events);
}
