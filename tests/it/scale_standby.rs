//! Standby replicas (`store.changelog.standby`): an instance tails the changelog
//! partitions of the partitions another instance owns (and starts to when one of
//! its own is revoked), so that when the owner dies
//! its restore of them reads only what the owner wrote after the last pass, and
//! Debezium-style replays (the same ids at new offsets) are still suppressed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::harness;
use crate::scale::{assert_each_executed_once, produce, replay_then_one_more, two_instances};
use harness::changelog::{log_number, topic_for};
use harness::logs::log_lines;
use harness::{new_event_id, Outboxd, Scenario};

/// Partitions of the source topic: enough for both instances to own some.
const PARTITIONS: i32 = 4;
const EVENTS: usize = 200;
/// Keys spread the events over every partition.
const KEYS: usize = 40;
/// Bound for handling what was produced (a takeover after SIGKILL waits for the
/// dead member's session timeout, 6 s here).
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound for the standby passes (one per `follow_interval`, 1 s) to reach the
/// ends of the other instance's changelog partitions.
const STANDBY_TIMEOUT: Duration = Duration::from_secs(60);

/// The source partitions `od` stands by for now, from its start and stop log lines.
fn standing_by(od: &Outboxd) -> BTreeSet<i32> {
    let mut partitions = BTreeSet::new();
    // Both lines contain the needle; they come in the order they happened.
    for line in log_lines(od, "standing by for the partition") {
        let p = log_number(&line, "partition") as i32;
        if line.contains("no longer standing by") {
            partitions.remove(&p);
        } else {
            partitions.insert(p);
        }
    }
    partitions
}

/// Waits until `od`'s standby passes have applied, for every partition it stands
/// by for, as many changelog records as that changelog partition holds (`ends`).
/// Returns those partitions.
async fn wait_for_standby_to_reach(od: &mut Outboxd, topic: &str, ends: &BTreeMap<i32, i64>) -> BTreeSet<i32> {
    od.wait_for(format!("standby passes to reach the changelog ends {ends:?}"), STANDBY_TIMEOUT, async |od| {
        let partitions = standing_by(od);
        if let Some(metrics) = harness::metrics::try_scrape(od).await {
            let applied = |p: i32| {
                let labels = [("topic", topic), ("partition", &p.to_string())];
                harness::metrics::sample(&metrics, "outboxd_changelog_records_standby_applied_total", &labels)
            };
            let gauge = harness::metrics::sample(&metrics, "outboxd_partitions_standby", &[]);
            if !partitions.is_empty()
                && gauge == partitions.len() as f64
                && partitions.iter().all(|p| applied(*p) >= ends[p] as f64)
            {
                return Ok(partitions);
            }
        }
        Err(format!("standing by for {partitions:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_a_standby_takes_over_reading_almost_nothing_and_suppresses_replays() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) =
        two_instances("scale-standby", PARTITIONS).await;
    for od in [&mut a, &mut b] {
        od.config.store_extra.push_str("standby = true\n");
    }
    a.start();
    a.wait_for_assignment().await;
    // A created the changelog topic at its start.
    let changelog_ends = kafka.offsets(&a.config.group_id, &topic_for(&a.config.group_id, &topic));
    b.start();
    b.wait_for_assignment().await;

    let events: Vec<(String, String)> = (0..EVENTS).map(|i| (format!("agg-{}", i % KEYS), new_event_id())).collect();
    produce(&kafka, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    b.wait_until("every event to be handled", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    // Committed offsets at the end: every final record is in the changelog.
    b.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    let ends = changelog_ends.end();
    let a_partitions = wait_for_standby_to_reach(&mut b, &topic, &ends).await;
    let a_records: i64 = a_partitions.iter().map(|p| ends[p]).sum();
    assert!(a_records > 0, "the premise: A's partitions {a_partitions:?} have changelog records ({ends:?})");
    // A owned every partition until B joined: it stands by for those it gave B.
    let b_partitions: BTreeSet<i32> = (0..PARTITIONS).filter(|p| !a_partitions.contains(p)).collect();
    assert!(!b_partitions.is_empty(), "the premise: B owns some partitions");
    harness::wait_until(
        format!("A to stand by for the partitions it gave B ({b_partitions:?})"),
        STANDBY_TIMEOUT,
        || standing_by(&a) == b_partitions,
    )
    .await;
    let restored_before = log_lines(&b, "partition restored").len();

    a.kill();
    harness::wait_until(format!("B to restore A's partitions {a_partitions:?}"), HANDLED_TIMEOUT, || {
        let restored: BTreeSet<i32> = log_lines(&b, "partition restored")[restored_before..]
            .iter()
            .map(|l| log_number(l, "partition") as i32)
            .collect();
        a_partitions.is_subset(&restored)
    })
    .await;
    for line in &log_lines(&b, "partition restored")[restored_before..] {
        // A wrote nothing after B's last pass: the takeover reads nothing.
        assert_eq!(log_number(line, "read"), 0, "a restore after standby reads only what is new: {line}");
    }
    let stopped = log_lines(&b, "no longer standing by for the partition");
    for p in &a_partitions {
        let line = stopped
            .iter()
            .rev()
            .find(|l| log_number(l, "partition") == i64::from(*p))
            .unwrap_or_else(|| panic!("B logs that it stops standing by for {p}: {stopped:#?}"));
        assert_eq!(log_number(line, "checkpoint"), ends[p], "the standby checkpoint is the changelog's end: {line}");
        assert!(line.contains("assigned here"), "B stopped because it took the partition over: {line}");
    }

    let all = replay_then_one_more(&kafka, &topic, &mut b, &receiver, &offsets, &events, HANDLED_TIMEOUT).await;
    b.stop();
    assert_each_executed_once(&receiver, &all);
}
