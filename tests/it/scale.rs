//! Several outboxd processes in one consumer group (`[store.changelog]`, on by
//! default): when a partition moves, its dedup records follow it through its
//! changelog topic, so Debezium-style replays of handled events (the same ids at
//! new offsets) are suppressed by the new owner. Each test ends with the
//! receiver's call log: every event executed once, none lost.

use crate::harness;

use std::collections::HashMap;
use std::time::Duration;

use harness::daemon::instance_header_toml;
use harness::{new_event_id, Kafka, OffsetReader, Outboxd, Produced, Receiver, Scenario};
use serde_json::json;

/// Partitions of the source topic: enough for both instances to own some.
const PARTITIONS: i32 = 4;
const EVENTS: usize = 200;
const KEYS: usize = 20;
/// Bound for handling what was produced (a takeover after SIGKILL waits for the
/// dead member's session timeout, 6 s here).
const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);

/// The changelog on whatever `OUTBOXD_TEST_CHANGELOG` says: these tests are about it.
pub(crate) fn on(mut od: Outboxd) -> Outboxd {
    od.config.store_extra = "[store.changelog]\nenabled = true\n".into();
    od
}

/// Instances A (the scenario's outboxd) and B in one group on a fresh topic, each with
/// its own store, naming itself in every call.
pub(crate) async fn two_instances(name: &str, partitions: i32) -> (Scenario, Outboxd) {
    let Scenario { kafka, topic, receiver, od, offsets, producer } = Scenario::new(name, partitions).await;
    let mut a = on(od);
    let mut b = on(Outboxd::new(&kafka, &[&topic], &receiver));
    b.config.group_id = a.config.group_id.clone();
    a.config.handler_extra = instance_header_toml("a");
    b.config.handler_extra = instance_header_toml("b");
    (Scenario { kafka, topic, receiver, od: a, offsets, producer }, b)
}

pub(crate) async fn produce(kafka: &Kafka, topic: &str, events: &[(String, String)]) -> Vec<Produced> {
    let producer = kafka.producer();
    let payloads: Vec<serde_json::Value> = events.iter().map(|(_, id)| json!({"id": id})).collect();
    let sends = events.iter().zip(&payloads).map(|((key, id), p)| producer.send_event(topic, key, id, Some("Tick"), p));
    futures::future::join_all(sends).await
}

/// Events on `KEYS` keys, spread over the partitions by key.
fn events() -> Vec<(String, String)> {
    (0..EVENTS).map(|i| (format!("agg-{}", i % KEYS), new_event_id())).collect()
}

/// What Debezium does after a Connect crash: every event again, same key, new
/// offset. `od` commits the replays, then handles one new event (nothing is
/// stuck). Returns `events` and that new one, for the final count.
pub(crate) async fn replay_then_one_more(
    kafka: &Kafka,
    topic: &str,
    od: &mut Outboxd,
    receiver: &Receiver,
    offsets: &OffsetReader,
    events: &[(String, String)],
    timeout: Duration,
) -> Vec<(String, String)> {
    let replayed = produce(kafka, topic, events).await;
    assert!(replayed.iter().all(|p| p.offset > 0));
    od.wait_until(format!("the replays to be committed ({})", offsets.describe()), timeout, || offsets.reached_end())
        .await;
    let fresh = ("agg-fresh".to_owned(), new_event_id());
    produce(kafka, topic, std::slice::from_ref(&fresh)).await;
    od.wait_until("the fresh event", timeout, || receiver.answered_ok(&fresh.1)).await;
    events.iter().cloned().chain([fresh]).collect()
}

/// Fails naming how many events `found` holds and the first few, as `what` says of them.
pub(crate) fn assert_no_event<T: std::fmt::Debug>(found: &[T], what: &str) {
    assert!(found.is_empty(), "{} events {what}, e.g. {:?}", found.len(), &found[..found.len().min(5)]);
}

/// Every event executed exactly once (one effective call per id), and no other call.
pub(crate) fn assert_each_executed_once(receiver: &Receiver, events: &[(String, String)]) {
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for call in receiver.calls().iter().filter(|c| c.is_handler_call() && c.effective()) {
        *per_id.entry(call.event_id.clone().unwrap_or_default()).or_default() += 1;
    }
    let missing: Vec<&str> = events.iter().map(|(_, id)| id.as_str()).filter(|id| !per_id.contains_key(*id)).collect();
    let twice: Vec<(&String, &usize)> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert_no_event(&missing, "were never executed");
    assert_no_event(&twice, "were executed more than once");
    assert_eq!(per_id.len(), events.len(), "calls for unknown ids");
}

/// How a test takes the first owner away.
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// SIGTERM: drain, commit, leave the group.
    Clean,
    /// SIGTERM, then its store directory is deleted and it comes back with an empty store.
    CleanStoreDeleted,
    /// SIGKILL: the group notices after the session timeout.
    Kill,
}

/// The group's rebalance protocol.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Protocol {
    /// outboxd's default: only the partitions that move are revoked.
    CooperativeSticky,
    /// `partition.assignment.strategy = "range"`: every rebalance revokes everything.
    Eager,
    /// KIP-848's `group.protocol = "consumer"`: the broker assigns; incremental.
    Consumer,
}

impl Protocol {
    /// Sets the protocol in `od`'s `kafka.options`.
    pub(crate) fn apply(self, od: &mut Outboxd) {
        let options = &mut od.config.kafka_options;
        match self {
            Protocol::CooperativeSticky => {}
            Protocol::Eager => {
                options.insert("partition.assignment.strategy".into(), "range".into());
            }
            Protocol::Consumer => {
                // The session and the heartbeat belong to the broker under this protocol.
                options.remove("session.timeout.ms");
                options.remove("heartbeat.interval.ms");
                options.insert("group.protocol".into(), "consumer".into());
            }
        }
    }
}

/// A handles everything alone; B joins (and restores what it takes over); A
/// leaves as `leave` says; every event is replayed at a new offset; nothing
/// runs twice.
async fn replays_after_the_owner_leaves_are_suppressed(leave: Leave) {
    replays_after_the_owner_leaves_are_suppressed_under(leave, Protocol::CooperativeSticky).await;
}

async fn replays_after_the_owner_leaves_are_suppressed_under(leave: Leave, protocol: Protocol) {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) = two_instances("scale", PARTITIONS).await;
    protocol.apply(&mut a);
    protocol.apply(&mut b);
    a.start();
    a.wait_for_assignment().await;
    let events = events();
    produce(&kafka, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    a.wait_until("A to handle every event", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    a.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;

    b.start();
    b.wait_for_assignment().await;
    match leave {
        Leave::Clean => a.stop(),
        Leave::CleanStoreDeleted => {
            a.stop();
            std::fs::remove_dir_all(&a.config.store_path).expect("delete A's store");
            a.start();
            a.wait_for_assignment().await;
        }
        Leave::Kill => a.kill(),
    }

    let all = replay_then_one_more(&kafka, &topic, &mut b, &receiver, &offsets, &events, HANDLED_TIMEOUT).await;
    b.stop();
    if a.is_running() {
        a.stop();
    }
    assert_each_executed_once(&receiver, &all);
    let log = b.log();
    assert!(log.contains("partition restored"), "B restored what it took over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_clean_leave_the_new_owner_suppresses_replays() {
    replays_after_the_owner_leaves_are_suppressed(Leave::Clean).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_owner_comes_back_with_its_store_deleted_replays_are_suppressed() {
    replays_after_the_owner_leaves_are_suppressed(Leave::CleanStoreDeleted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_of_the_owner_the_new_owner_suppresses_replays() {
    replays_after_the_owner_leaves_are_suppressed(Leave::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_eager_protocol_replays_after_sigkill_of_the_owner_are_suppressed() {
    replays_after_the_owner_leaves_are_suppressed_under(Leave::Kill, Protocol::Eager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_eager_protocol_replays_after_a_clean_leave_are_suppressed() {
    replays_after_the_owner_leaves_are_suppressed_under(Leave::Clean, Protocol::Eager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_consumer_protocol_replays_after_sigkill_of_the_owner_are_suppressed() {
    replays_after_the_owner_leaves_are_suppressed_under(Leave::Kill, Protocol::Consumer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_topic_with_another_partition_count_stops_the_start_and_nothing_is_handled() {
    let Scenario { kafka, topic, receiver, od, .. } = Scenario::new("scale-mismatch", 2).await;
    let mut od = on(od);
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    kafka.create_topic(&changelog, 3, &[]).await;
    let id = new_event_id();
    produce(&kafka, &topic, &[("k".to_owned(), id.clone())]).await;
    od.start();
    let status = od.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "outboxd must refuse to start");
    let log = od.log();
    assert!(
        log.contains(&changelog) && log.contains(&topic) && log.contains("3 partitions") && log.contains("has 2"),
        "the error names both topics and counts: {log}"
    );
    assert_eq!(receiver.calls().len(), 0, "nothing is handled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_rebuild_brings_back_every_record_of_a_deleted_store() {
    let mut s = Scenario::new("scale-rebuild", PARTITIONS).await;
    s.od = on(s.od);
    s.run().await;
    let Scenario { kafka, topic, mut od, offsets, .. } = s;
    let events = events();
    produce(&kafka, &topic, &events).await;
    od.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    od.stop();
    let before = od.store_stats();
    std::fs::remove_dir_all(&od.config.store_path).expect("delete the store");

    let out = od.command(&["store", "rebuild", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "store rebuild: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let read: u64 = lines.as_array().unwrap().iter().map(|l| l["read"].as_u64().unwrap()).sum();
    assert_eq!((lines.as_array().unwrap().len(), read), (PARTITIONS as usize, EVENTS as u64), "{stdout}");
    let after = od.store_stats();
    assert_eq!(after["done"], before["done"], "before {before}, after {after}");
    for (_, id) in events.iter().step_by(37) {
        assert_eq!(od.store_get(id).state, "done");
    }
    // Started again, the service finds its checkpoints at the changelog's end: nothing to read.
    od.start();
    od.wait_for_assignment().await;
    let restored = harness::logs::log_lines(&od, "partition restored");
    assert_eq!(restored.len(), PARTITIONS as usize, "{restored:?}");
    assert!(restored.iter().all(|l| l.contains(" read=0 ")), "{restored:#?}");
    od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_topic_deleted_while_running_stops_the_service_naming_it() {
    let mut s = Scenario::new("scale-deleted", 1).await;
    s.od = on(s.od);
    s.od.config.store_extra = "[store.changelog]\ndelivery_timeout = \"5s\"\n".into();
    s.run().await;
    let Scenario { kafka, topic, mut od, offsets, .. } = s;
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    let first = vec![("k".to_owned(), new_event_id())];
    produce(&kafka, &topic, &first).await;
    od.wait_until("the first event to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    kafka.delete_topic(&changelog).await;
    let second = vec![("k".to_owned(), new_event_id())];
    produce(&kafka, &topic, &second).await;
    let status = od.wait_exit(Duration::from_secs(120));
    assert!(!status.success(), "outboxd must stop");
    let log = harness::logs::strip_ansi(&od.log());
    assert!(log.contains(&changelog) && log.contains("does not exist"), "the error names the topic: {log}");
    assert!(!offsets.reached_end(), "the second event's offset did not move: {}", offsets.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_uncertain_park_a_claim_cut_by_sigkill_is_parked_by_the_new_owner() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) = two_instances("scale-park", 1).await;
    for od in [&mut a, &mut b] {
        od.config.handler_extra.push_str("on_uncertain = \"park\"\n");
    }
    let id = new_event_id();
    receiver.set_behaviour(&id, harness::Behaviour::hang());
    a.start();
    a.wait_for_assignment().await;
    produce(&kafka, &topic, &[("k".to_owned(), id.clone())]).await;
    a.wait_until("A's call to be in flight", HANDLED_TIMEOUT, || receiver.in_flight() == 1).await;
    a.kill();
    receiver.clear_behaviour(&id);

    // B never saw the event: only the claim A put into the changelog before calling says
    // that its outcome is unknown.
    b.start();
    b.wait_until(format!("the offset to be committed ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    b.stop();
    assert_eq!(receiver.handler_call_count(&id), 1, "the uncertain event must not run again under park");
    assert_eq!(b.store_get(&id).state, "parked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_topic_that_gains_partitions_stops_the_service_naming_both_counts() {
    let mut s = Scenario::new("scale-grown", 2).await;
    s.od = on(s.od);
    // Notice the new partition within a second, not librdkafka's 5 minutes.
    s.od.config.kafka_options.insert("topic.metadata.refresh.interval.ms".into(), "1000".into());
    s.run().await;
    let Scenario { kafka, topic, receiver, mut od, .. } = s;
    let changelog = format!("{}.{topic}.outboxd-dedup", od.config.group_id);
    kafka.add_partitions(&topic, 3).await;
    let id = new_event_id();
    kafka.producer().send_raw(&topic, Some(2), Some(b"k"), &[("id", Some(id.as_bytes()))], Some(b"{}")).await;
    let status = od.wait_exit(Duration::from_secs(120));
    assert!(!status.success(), "outboxd must stop");
    let log = harness::logs::strip_ansi(&od.log());
    assert!(
        log.contains(&format!("changelog topic {changelog} has 2 partitions but source topic {topic} has 3")),
        "the error names both topics and counts: {log}"
    );
    assert_eq!(receiver.call_count(&id), 0, "the event of the new partition is not handled");
}
