//! Restores with several runs: a restore cut by SIGKILL resumes from its checkpoint
//! (size knob `OUTBOXD_SCALE_RESTORE_RECORDS`, default 100,000 changelog records); an
//! empty store restored from the changelog holds what the old store held; a final
//! record the changelog never got reaches it before a redelivery moves the offset.

use crate::harness;
use crate::scale::{on, produce};

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use harness::changelog::{self, log_number};
use harness::daemon::instance_header_toml;
use harness::logs::{log_lines, logged};
use harness::receiver::Reply;
use harness::wait::keep_looking;
use harness::{env_usize, new_event_id, unique_name, Outboxd, Scenario};

/// A restore cut by SIGKILL after some batches starts again from the checkpoint of
/// the last durable batch, not from the beginning, and ends with every record. The
/// store is empty, so the restore writes packed runs: with a small
/// `restore_run_bytes` it writes them every two batches or so, and the kill lands
/// while runs are written, between them, or while records wait for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_by_sigkill_resumes_from_its_checkpoint() {
    let records = env_usize("OUTBOXD_SCALE_RESTORE_RECORDS", 100_000).max(100);
    // About twenty durable batches: the kill lands between two of them.
    let batch = records / 20;
    let Scenario { kafka, topic, receiver: _receiver, od, .. } = Scenario::new("churn-restore", 1).await;
    let mut od = on(od);
    od.config.store_extra.push_str(&format!("restore_batch = {batch}\nrestore_run_bytes = \"1MiB\"\n"));
    // Static membership: the restarted process gets the partition back at once.
    od.config.kafka_options.insert("group.instance.id".into(), unique_name("restore-static"));
    let changelog_topic = changelog::topic_for(&od.config.group_id, &topic);
    kafka.create_topic(&changelog_topic, 1, &[("cleanup.policy", "compact,delete")]).await;
    let ids = changelog::fill(&kafka, &changelog_topic, &topic, 0, records).await;

    od.start();
    // Three batches read: a checkpoint is durable (runs are written at least every two
    // batches of 5,000 records or more, a batch's records are counted before its
    // checkpoint is written, and batches follow one another).
    let labels = [("topic", topic.as_str()), ("partition", "0")];
    // Looked at often: the kill must come before the restore ends.
    let two_batches = keep_looking(Duration::from_secs(120), Duration::from_millis(20), async || {
        let m = harness::metrics::try_scrape(&od).await.unwrap_or_default();
        let restored = harness::metrics::sample(&m, "outboxd_changelog_records_restored_total", &labels);
        if restored >= (3 * batch) as f64 {
            return Ok(restored);
        }
        od.assert_alive();
        Err(restored)
    });
    let restored = two_batches
        .await
        .unwrap_or_else(|restored| panic!("the restore did not read three batches ({restored} records)"));
    od.kill();
    let first = log_lines(&od, "restoring the partition from its changelog");
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!((log_number(&first[0], "from"), log_number(&first[0], "end")), (0, records as i64), "{first:?}");
    assert!(
        !logged(&od, "partition restored"),
        "the premise: the kill cut the restore (after {restored} records; is OUTBOXD_SCALE_RESTORE_RECORDS too small?)"
    );

    od.start();
    harness::wait_until("the second restore to end", Duration::from_secs(180), || logged(&od, "partition restored"))
        .await;
    let again = log_lines(&od, "restoring the partition from its changelog");
    let from = log_number(&again[0], "from");
    assert!(
        from >= batch as i64 && from < records as i64,
        "the second restore starts at a checkpoint past the first batch: {again:?}"
    );
    let done = log_lines(&od, "partition restored");
    let read = log_number(&done[0], "read");
    assert_eq!(read, records as i64 - from, "it reads only what the first did not make durable: {done:?}");
    od.stop();
    println!("cut restore: {records} records, batches of {batch}, killed after {restored} were read; the second restore read {read} from {from}");
    assert_eq!(od.store_stats()["done"], records, "every record is in the store");
    for id in ids.iter().step_by(records / 10) {
        assert_eq!(od.store_get(id).state, "done", "{id}");
    }
}

/// Instance A handles events, some of which end dead and one parked; A stops; B, in
/// the same group with an empty store, restores every partition from the changelog
/// and then holds what A held: the same records in the same states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_store_restored_from_the_changelog_holds_what_the_old_store_held() {
    const EVENTS: usize = 60;
    let Scenario { kafka, topic, receiver, od: a, offsets, .. } = Scenario::new("churn-copy", 3).await;
    let mut events: Vec<(String, String)> = (0..EVENTS).map(|i| (format!("agg-{}", i % 12), new_event_id())).collect();
    // Every tenth event fails for good (dead); the call of `held` (on a key of its own,
    // so that no other event waits for it) hangs until A is killed.
    let bad: HashSet<String> = events.iter().step_by(10).map(|(_, id)| id.clone()).collect();
    events[EVENTS / 2 + 1].0 = "held".into();
    let held = events[EVENTS / 2 + 1].1.clone();
    let hold = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (held_id, flag) = (held.clone(), hold.clone());
    receiver.set_script(move |r| match r.event_id.as_deref() {
        Some(id) if bad.contains(id) => Reply::status(422),
        Some(id) if id == held_id => Reply::ok().hold(&flag),
        _ => Reply::ok(),
    });
    let mut a = on(a);
    let mut b = on(Outboxd::new(&kafka, &[&topic], &receiver));
    b.config.group_id = a.config.group_id.clone();
    for (od, name) in [(&mut a, "a"), (&mut b, "b")] {
        // The keys of dead events go on (`continue`): every other call is expected to be answered.
        od.config.handler_extra =
            format!("on_uncertain = \"park\"\non_dead = \"continue\"\n{}", instance_header_toml(name));
    }
    a.config.kafka_options.insert("group.instance.id".into(), unique_name("copy-static"));
    // The held call lasts until the kill.
    a.config.handler_timeout = "120s".into();

    a.start();
    a.wait_for_assignment().await;
    produce(&kafka, &topic, &events).await;
    let others: Vec<String> = events.iter().map(|(_, id)| id.clone()).filter(|id| *id != held).collect();
    a.wait_until("every call but the held one answered", Duration::from_secs(90), || {
        others.iter().all(|id| receiver.answered(id)) && receiver.in_flight() == 1
    })
    .await;
    // An answer is recorded a group commit later: wait until the counters (which count
    // recorded outcomes) show every answered event, so that the kill cuts only the held call.
    let (done, dead) = ((EVENTS - 7) as f64, 6.0);
    a.wait_for(format!("A to record {done} handled and {dead} dead"), Duration::from_secs(90), async |a| {
        let m = harness::metrics::try_scrape(a).await.unwrap_or_default();
        let count = |name| harness::metrics::sample(&m, name, &[("topic", topic.as_str())]);
        let recorded = (count("outboxd_events_handled_total"), count("outboxd_events_dead_total"));
        if recorded == (done, dead) {
            Ok(())
        } else {
            Err(format!("A recorded {} handled and {} dead", recorded.0, recorded.1))
        }
    })
    .await;
    // Killed during the held call: started again, A finds its claim and parks the event.
    a.kill();
    hold.store(false, std::sync::atomic::Ordering::SeqCst);
    a.start();
    a.wait_until(format!("every offset to be committed ({})", offsets.describe()), Duration::from_secs(90), || {
        offsets.reached_end()
    })
    .await;
    a.stop();
    let before = a.store_stats();
    let want = (EVENTS as u64 - 7, 6, 1, 0);
    let counts = |s: &serde_json::Value| {
        let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("no {k} in {s}"));
        (n("done"), n("dead"), n("parked"), n("claimed"))
    };
    assert_eq!(counts(&before), want, "the premise: A's store holds done, dead and parked records: {before}");

    b.start();
    // A left as a static member: B gets A's partitions once A's session times out.
    harness::wait_until("B to restore all three partitions", Duration::from_secs(90), || {
        log_lines(&b, "partition restored").len() == 3
    })
    .await;
    b.stop();
    let after = b.store_stats();
    assert_eq!(counts(&after), counts(&before), "A's store {before}\nB's store {after}");
    let states = |od: &Outboxd| -> HashMap<String, (String, u32)> {
        od.store_list(None, 10 * EVENTS).into_iter().map(|r| (r.event_id, (r.state, r.attempts))).collect()
    };
    assert_eq!(states(&b), states(&a), "every record in the same state, with the same attempts");
    assert_eq!(receiver.calls_from("b"), 0, "B executed nothing");
}

/// A final record written locally whose changelog write never got through (here the
/// changelog topic is deleted under the running service, which stops; a SIGKILL
/// between the local flush and the broker's acknowledgement leaves the same) reaches
/// the changelog before a delivery of the event again moves its offset: the next
/// owner, restoring from the changelog, then suppresses a replay of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_record_the_changelog_never_got_is_written_there_before_a_duplicate_moves_the_offset() {
    let Scenario { kafka, topic, receiver, od: a, offsets, .. } = Scenario::new("churn-unacked", 1).await;
    let mut a = on(a);
    a.config.store_extra.push_str("delivery_timeout = \"5s\"\n");
    let mut b = on(Outboxd::new(&kafka, &[&topic], &receiver));
    b.config.group_id = a.config.group_id.clone();
    let changelog_topic = changelog::topic_for(&a.config.group_id, &topic);
    a.start();
    a.wait_for_assignment().await;
    produce(&kafka, &topic, &[("k".to_owned(), new_event_id())]).await;
    a.wait_until("the first event to be committed", Duration::from_secs(60), || offsets.reached_end()).await;
    kafka.delete_topic(&changelog_topic).await;
    let event = vec![("k".to_owned(), new_event_id())];
    let id = event[0].1.clone();
    produce(&kafka, &topic, &event).await;
    assert!(!a.wait_exit(Duration::from_secs(120)).success(), "outboxd stops when its changelog write fails");
    assert_eq!(a.store_get(&id).state, "done", "the premise: the event ran and is recorded done here only");
    assert!(!offsets.reached_end(), "the premise: its offset did not move: {}", offsets.describe());

    // Started again on its store (the changelog topic is created anew): the event comes
    // again and is found done.
    a.start();
    a.wait_until("the event's offset to be committed", Duration::from_secs(90), || offsets.reached_end()).await;
    a.stop();
    let entries = changelog::entries_by_id(&kafka, &changelog_topic, &topic);
    let written = entries.get(&id).is_some_and(|es| es.iter().any(|e| e.state.is_final()));
    // B, with an empty store, takes the partition over and sees the event replayed.
    b.start();
    b.wait_for_assignment().await;
    produce(&kafka, &topic, &event).await;
    b.wait_until("the replay to be committed", Duration::from_secs(60), || offsets.reached_end()).await;
    b.stop();
    assert!(written, "the event's final record is in the changelog once its offset moved: {:?}", entries.get(&id));
    assert_eq!(receiver.handler_call_count(&id), 1, "the replay is suppressed by B");
}
