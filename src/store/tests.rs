use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::event::RawMessage;
use crate::store::disk::keys::UNDECODABLE_SCOPE;
use crate::store::disk::{runs, slices};
use crate::event::{OutboxEvent, Payload, Position};

fn opts(retention: Duration) -> StoreOptions {
    StoreOptions::for_tests(Some(retention))
}

async fn claimed(store: &Store, id: &str, offset: i64) -> Claimed {
    match store.claim(&event(id, offset), "t").await.unwrap() {
        Claim::Claimed(c) => c,
        other => panic!("{id} not claimed: {other:?}"),
    }
}

pub(in crate::store) fn event(id: &str, offset: i64) -> OutboxEvent {
    event_at(id, "t", 0, offset)
}

/// An `OrderCreated` event of aggregate `order-1` at `topic`/`partition`/`offset`.
pub(in crate::store) fn event_at(id: &str, topic: &str, partition: i32, offset: i64) -> OutboxEvent {
    let position = Position { topic: topic.into(), partition, offset };
    OutboxEvent {
        aggregate_id: Some("order-1".into()),
        event_type: Some("OrderCreated".into()),
        ..OutboxEvent::new(id, Payload::Null, position)
    }
}

#[tokio::test]
async fn done_event_is_finished_on_redelivery_at_a_new_offset() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let c = claimed(&store, "e1", 1).await;
    assert_eq!((c.attempt(), c.reexecution()), (1, false));
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(
        store.claim(&event("e1", 99), "t").await.unwrap(),
        Claim::Finished { state: State::Done, same_offset: false }
    );
    let r = store.get("e1").unwrap().unwrap();
    assert_eq!((r.state, r.attempts, r.offset), (State::Done, 1, 1));
    assert_eq!(r.duplicates, 0, "a duplicate is counted per store, not written into its record");
    assert_eq!(r.outcome.as_deref(), Some("http 200"));
    assert_eq!(store.stats().unwrap().duplicates_suppressed, 1);
}

#[tokio::test]
async fn claimed_record_survives_reopen_and_is_a_reexecution() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        store.claim(&event("e1", 1), "t").await.unwrap();
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    assert_eq!(store.get("e1").unwrap().unwrap().state, State::Claimed);
    let c = claimed(&store, "e1", 5).await;
    assert_eq!((c.attempt(), c.reexecution()), (2, true));
}

/// Past the retention (and at most one slice width more) after their last write.
const AFTER_RETENTION: i64 = 60_000_000 + 7_500_000 + 1_000_000;

fn trees(store: &Store) -> usize {
    store.db.tree_names().iter().filter(|n| n.starts_with(b"slice:")).count()
}

#[tokio::test]
async fn gc_drops_whole_slices_once_the_retention_has_passed_since_their_records_last_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let a = claimed(&store, "a", 0).await;
    let b = claimed(&store, "b", 1).await;
    claimed(&store, "c", 2).await;
    store.finish(a, State::Done, "ok".into()).await.unwrap();
    store.finish_failed(b, State::Dead, "boom".into(), &big_message("b", 10), None).await.unwrap();
    assert_eq!(store.gc(now_us()).await.unwrap(), 0, "nothing has expired yet");
    assert_eq!(store.gc(now_us() + 59_000_000).await.unwrap(), 0, "kept at least the retention");
    assert_eq!(trees(&store), 1);
    let later = now_us() + AFTER_RETENTION;
    assert_eq!(store.gc(later).await.unwrap(), 3, "done, dead and the claim that never finished");
    for id in ["a", "b", "c"] {
        assert!(store.get(id).unwrap().is_none(), "{id}");
    }
    assert_eq!((trees(&store), store.len(), store.message_bytes()), (0, 0, 0), "the message copy went along");
    assert!(matches!(store.claim(&event("a", 9), "t").await.unwrap(), Claim::Claimed(_)), "a new slice");
}

/// A claim and its final record fall in two slices: the final one is the only one left.
#[tokio::test]
async fn a_record_written_again_in_a_newer_slice_leaves_the_older_one() {
    let dir = tempfile::tempdir().unwrap();
    // One-second slices: the narrowest there are.
    let store = Store::open(dir.path(), &opts(Duration::from_secs(1))).unwrap();
    let c = claimed(&store, "e1", 1).await;
    let d = claimed(&store, "e2", 2).await;
    store.finish_failed(d, State::Dead, "http 422".into(), &big_message("e2", 10), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    store.reopen("e2").await.unwrap();
    // At least two: on a loaded machine these writes can also cross the next boundary.
    assert!(trees(&store) >= 2, "the later writes went to a newer slice");
    let r = store.get("e1").unwrap().unwrap();
    assert_eq!((r.state, r.outcome.as_deref()), (State::Done, Some("http 200")));
    assert_eq!(store.list(None, 10).unwrap().len(), 2, "each record once");
    assert_eq!(store.counts().map(|(_, n)| n), [1, 1, 0, 0, 0]);
    assert!(store.message("e2").unwrap().is_some(), "the copy moved with its record");
    let s = store.stats().unwrap();
    assert_eq!((s.claimed, s.done), (1, 1));
    // Everything is in the newest slice: dropping the older one removes nothing.
    let first_end = store.slices.all()[0].end();
    assert_eq!(store.gc(first_end + 1_000_000).await.unwrap(), 0);
    assert_eq!(store.len(), 2);
}

#[tokio::test]
async fn forgotten_event_can_be_claimed_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let a = claimed(&store, "a", 0).await;
    store.finish(a, State::Done, "ok".into()).await.unwrap();
    let removed = store.forget("a").await.unwrap();
    assert_eq!(removed.state, State::Done);
    assert_eq!(store.len(), 0);
    assert_eq!(claimed(&store, "a", 3).await.attempt(), 1);
    assert!(matches!(store.forget("nope").await, Err(StoreError::NotFound(_))));
}

#[tokio::test]
async fn second_open_reports_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let e = Store::open(dir.path(), &opts(Duration::from_secs(60))).err().expect("second open must fail");
    let text = e.to_string();
    assert!(matches!(e, StoreError::Locked { .. }), "{text}");
    assert!(text.contains(&format!("pid {}", std::process::id())) && text.contains("outboxd test"), "{text}");
}

/// sled releases its file lock when the last of its background threads lets go of the
/// file, which may be a moment after the `Db` (and its owner file) is dropped; a reopen
/// in that moment, with no owner file naming a holder, waits for it instead of failing.
#[tokio::test]
async fn a_reopen_waits_for_a_lock_that_no_owner_file_names() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap());
    // Hold the lock the way a lingering sled thread of the dropped store would.
    let lingering = std::fs::File::open(dir.path().join("db")).unwrap();
    lingering.lock().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(lingering);
    });
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60)));
    releaser.join().unwrap();
    assert!(store.is_ok(), "{:?}", store.err());
}

#[tokio::test]
async fn list_filters_by_state_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let mut c = Vec::new();
    for i in 0..5 {
        c.push(claimed(&store, &format!("e{i}"), i).await);
    }
    store.finish(c.remove(3), State::Done, "ok".into()).await.unwrap();
    store.finish(c.remove(1), State::Done, "ok".into()).await.unwrap();
    assert_eq!(store.list(Some(State::Done), 10).unwrap().len(), 2);
    assert_eq!(store.list(Some(State::Claimed), 2).unwrap().len(), 2);
    assert_eq!(store.list(None, 100).unwrap().len(), 5);
    let s = store.stats().unwrap();
    assert_eq!((s.claimed, s.done, s.dead), (3, 2, 0));
}

#[tokio::test]
async fn pages_after_an_id_cover_every_matching_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    for i in 0..8 {
        let c = claimed(&store, &format!("e{i}"), i).await;
        let state = if i % 3 == 0 { State::Done } else { State::Dead };
        store.finish(c, state, "x".into()).await.unwrap();
    }
    let ids = |rs: Vec<Record>| rs.into_iter().map(|r| r.event_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(store.list_after(Some(State::Dead), None, None, 2).unwrap()), ["e1", "e2"]);
    assert_eq!(ids(store.list_after(Some(State::Dead), None, Some("e2"), 2).unwrap()), ["e4", "e5"]);
    assert_eq!(ids(store.list_after(Some(State::Dead), None, Some("e5"), 2).unwrap()), ["e7"]);
    assert!(store.list_after(Some(State::Dead), None, Some("e7"), 2).unwrap().is_empty());
    assert_eq!(
        ids(store.list_after(None, None, Some("e4x"), 10).unwrap()),
        ["e5", "e6", "e7"],
        "after an id that is gone"
    );
}

#[tokio::test]
async fn per_state_counts_follow_every_change_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let counts = |s: &Store| s.counts().map(|(_, n)| n);
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
        let a = claimed(&store, "a", 0).await;
        let b = claimed(&store, "b", 1).await;
        claimed(&store, "c", 2).await;
        claimed(&store, "c", 3).await; // a re-execution is not a new record
        assert_eq!(counts(&store), [3, 0, 0, 0, 0]);
        store.finish(a, State::Done, "ok".into()).await.unwrap();
        let msg = RawMessage {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            key: None,
            value: Some(b"{}".to_vec()),
            headers: vec![],
            timestamp_ms: None,
        };
        store.finish_failed(b, State::Parked, "unknown".into(), &msg, None).await.unwrap();
        store.record_undecodable("u", &msg, "bad".into(), None, false).await.unwrap();
        assert_eq!(
            store.claim(&event("a", 9), "t").await.unwrap(),
            Claim::Finished { state: State::Done, same_offset: false }
        );
        assert_eq!(counts(&store), [1, 1, 1, 1, 0]);
        store.resolve_done("b", "checked".into()).await.unwrap();
        store.reopen("u").await.unwrap();
        assert_eq!(counts(&store), [2, 2, 0, 0, 0], "reopened: claimed for its re-run");
        store.settle_rerun("u").await.unwrap();
        assert_eq!(counts(&store), [1, 2, 0, 0, 0]);
        assert_eq!(store.len(), 3);
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    assert_eq!(counts(&store), [1, 2, 0, 0, 0], "kept across a reopen");
    store.forget("c").await.unwrap();
    assert_eq!(counts(&store), [0, 2, 0, 0, 0]);
    assert_eq!(store.gc(now_us() + AFTER_RETENTION).await.unwrap(), 2);
    assert_eq!(counts(&store), [0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn stats_on_a_stopped_store_corrects_drifted_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let a = claimed(&store, "a", 0).await;
    store.finish(a, State::Done, "ok".into()).await.unwrap();
    store.slices.all()[0].counts.set([5, 0, 7, 0, 2]); // as a crash between a write and its count could leave them
    let s = store.stats().unwrap();
    assert_eq!((s.claimed, s.done, s.dead), (0, 1, 0));
    assert_eq!(store.counts().map(|(_, n)| n), [0, 1, 0, 0, 0]);
    drop(store);
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    assert_eq!(store.counts().map(|(_, n)| n), [0, 1, 0, 0, 0], "the correction is stored");
}

#[tokio::test]
async fn a_suppressed_duplicate_writes_no_record_and_its_count_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        let c = claimed(&store, "e1", 1).await;
        store.finish(c, State::Done, "http 200".into()).await.unwrap();
        let slice = store.slices.all().pop().unwrap();
        let before = slice.iter().collect::<Result<Vec<_>, _>>().unwrap();
        assert!(matches!(store.claim(&event("e1", 1), "t").await.unwrap(), Claim::Finished { .. }));
        let after = slice.iter().collect::<Result<Vec<_>, _>>().unwrap();
        assert_eq!(before, after, "the record is not rewritten");
        store.durable().await.unwrap();
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    assert_eq!(store.stats().unwrap().duplicates_suppressed, 1, "persisted with the group commit");
}

fn stored_records(store: &Store) -> usize {
    store.slices.all().iter().map(|s| s.len()).sum()
}

#[tokio::test]
async fn in_memory_claim_writes_only_the_final_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let Claim::Claimed(mut c) = store.claim_in_memory(&event("e1", 1), "t").await.unwrap() else { panic!() };
    assert_eq!((c.attempt(), c.reexecution(), c.is_durable()), (1, false, false));
    assert_eq!(stored_records(&store), 0, "the claim is not written");
    let r = store.get("e1").unwrap().expect("an in-flight claim is shown from memory");
    assert_eq!((r.state, r.attempts), (State::Claimed, 1));
    assert_eq!(store.counts().map(|(_, n)| n), [1, 0, 0, 0, 0]);
    assert_eq!(store.stats().unwrap().claimed, 1);
    assert_eq!(store.record_attempt(&mut c).await.unwrap(), 2);
    assert_eq!(stored_records(&store), 0, "an attempt is counted in memory");
    assert_eq!(store.get("e1").unwrap().unwrap().attempts, 2);
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(stored_records(&store), 1);
    let r = store.get("e1").unwrap().unwrap();
    assert_eq!((r.state, r.attempts), (State::Done, 2));
    assert_eq!(store.counts().map(|(_, n)| n), [0, 1, 0, 0, 0]);
    assert!(matches!(store.claim_in_memory(&event("e1", 2), "t").await.unwrap(), Claim::Finished { .. }));
}

#[tokio::test]
async fn in_memory_claim_cut_by_a_crash_leaves_nothing_and_runs_again_as_a_first_attempt() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        store.claim_in_memory(&event("e1", 1), "t").await.unwrap();
        store.durable().await.unwrap();
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    assert_eq!(store.get("e1").unwrap(), None, "nothing stored: the event is simply not done");
    let Claim::Claimed(c) = store.claim_in_memory(&event("e1", 1), "t").await.unwrap() else { panic!() };
    assert_eq!((c.attempt(), c.reexecution()), (1, false));
}

#[tokio::test]
async fn in_memory_claims_are_listed_with_the_stored_records_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    for id in ["a", "c"] {
        let c = claimed(&store, id, 1).await;
        store.finish(c, State::Done, "ok".into()).await.unwrap();
    }
    store.claim_in_memory(&event("b", 2), "t").await.unwrap();
    let ids = |rs: Vec<Record>| rs.into_iter().map(|r| r.event_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(store.list(None, 10).unwrap()), ["a", "b", "c"]);
    assert_eq!(ids(store.list(None, 2).unwrap()), ["a", "b"]);
    assert_eq!(ids(store.list(Some(State::Claimed), 10).unwrap()), ["b"]);
    assert_eq!(ids(store.list_after(None, None, Some("b"), 10).unwrap()), ["c"]);
    assert_eq!(ids(store.list_after(None, None, Some("a"), 1).unwrap()), ["b"]);
}

#[tokio::test]
async fn released_in_memory_claim_is_no_longer_shown() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    store.claim_in_memory(&event("e1", 1), "t").await.unwrap();
    store.release("e1", "t");
    assert_eq!(store.get("e1").unwrap(), None);
    assert_eq!(store.counts().map(|(_, n)| n), [0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn in_memory_claim_of_a_stored_claim_moves_it_to_final_in_one_write() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Left by a run whose policy claimed durably.
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        store.claim(&event("e1", 1), "t").await.unwrap();
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let Claim::Claimed(c) = store.claim_in_memory(&event("e1", 2), "t").await.unwrap() else { panic!() };
    assert_eq!((c.attempt(), c.reexecution()), (2, true), "a stored claim still says the outcome is unknown");
    assert_eq!(store.counts().map(|(_, n)| n), [1, 0, 0, 0, 0], "counted once");
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(stored_records(&store), 1);
    assert_eq!(store.counts().map(|(_, n)| n), [0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_claim_that_is_never_finished_expires_like_any_record() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Duration::from_secs(3600);
    let store = Store::open(dir.path(), &opts(retention)).unwrap();
    store.claim(&event("stranded", 1), "t").await.unwrap();
    let r = store.get("stranded").unwrap().unwrap();
    let expires = r.expires_at_us.unwrap();
    let width = (retention / slices::SLICES_PER_RETENTION).as_micros() as i64;
    assert!(expires >= r.updated_at_us + retention.as_micros() as i64, "kept at least the retention");
    assert!(expires <= r.updated_at_us + retention.as_micros() as i64 + width, "and at most one slice more");
    assert_eq!(store.gc(expires - 1).await.unwrap(), 0);
    assert_eq!(store.gc(expires).await.unwrap(), 1);
    assert_eq!(store.get("stranded").unwrap(), None);
    assert_eq!(store.counts()[0], (State::Claimed, 0));
}

fn big_message(id: &str, bytes: usize) -> RawMessage {
    RawMessage {
        topic: "t".into(),
        partition: 0,
        offset: 7,
        key: Some(b"k".to_vec()),
        value: Some(vec![b'x'; bytes]),
        headers: vec![("id".into(), Some(id.as_bytes().to_vec()))],
        timestamp_ms: None,
    }
}

/// sled keeps pages above ~128 KiB in blob files it never fsyncs: the group
/// commit that makes a large message copy durable fsyncs its blob file too.
#[tokio::test]
async fn a_large_message_copy_in_a_blob_file_is_made_durable_with_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let c = claimed(&store, "big", 7).await;
    let message = big_message("big", 1024 * 1024);
    store.finish_failed(c, State::Dead, "http 422".into(), &message, None).await.unwrap();
    let blobs = std::fs::read_dir(dir.path().join("blobs")).map(Iterator::count).unwrap_or_default();
    assert!(blobs >= 1, "sled wrote no blob file: the test no longer covers the case");
    assert!(store.sync_stats().blob_files_synced >= 1, "{:?}", store.sync_stats());
    assert_eq!(store.message("big").unwrap().unwrap().value, message.value);
    store.forget("big").await.unwrap();
    assert!(store.message("big").unwrap().is_none());
    assert_eq!(store.message_bytes(), 0);
}

#[tokio::test]
async fn past_the_quota_a_failed_event_is_recorded_without_its_copy() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        store.set_message_quota(1024 * 1024);
        for id in ["a", "b"] {
            let c = claimed(&store, id, 1).await;
            store.finish_failed(c, State::Dead, "http 422".into(), &big_message(id, 600 * 1024), None).await.unwrap();
        }
        assert!(store.message("a").unwrap().is_some());
        assert!(store.message("b").unwrap().is_none(), "the second copy would pass 1 MiB");
        let b = store.get("b").unwrap().unwrap();
        assert_eq!(b.state, State::Dead);
        assert!(b.reason.unwrap().contains("message copy not kept"));
    }
    // The total survives a restart (persisted with the group commit).
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    assert!(store.message_bytes() > 600 * 1024 && store.message_bytes() < 700 * 1024, "{}", store.message_bytes());
}

#[tokio::test]
async fn a_reopened_event_is_claimed_in_one_write_and_survives_an_interrupted_rerun() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        let c = claimed(&store, "e1", 1).await;
        store.finish_failed(c, State::Dead, "http 422".into(), &big_message("e1", 10), None).await.unwrap();
        store.reopen("e1").await.unwrap();
        let r = store.get("e1").unwrap().unwrap();
        assert_eq!((r.state, r.attempts), (State::Claimed, 0));
        assert_eq!(store.counts()[0], (State::Claimed, 1));
        assert_eq!(store.counts()[2], (State::Dead, 0));
        // The process dies here, before the re-run claimed it.
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    assert_eq!(store.get("e1").unwrap().unwrap().state, State::Claimed, "not lost");
    let message = store.reopen("e1").await.expect("an interrupted re-run can be reopened");
    assert_eq!(message.offset, 7);
    let c = claimed(&store, "e1", 7).await;
    assert_eq!((c.attempt(), c.reexecution()), (1, false), "a re-run is not an uncertain re-execution");
    assert_eq!(store.counts()[0], (State::Claimed, 1));
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(store.settle_rerun("e1").await.unwrap().unwrap().state, State::Done);
}

#[tokio::test]
async fn a_rerun_recorded_under_another_id_leaves_no_claim_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let id = "undecodable/t/0/7";
    store.record_undecodable(id, &big_message("x", 10), "bad JSON".into(), None, false).await.unwrap();
    store.reopen(id).await.unwrap();
    assert_eq!(store.settle_rerun(id).await.unwrap(), None);
    assert_eq!(store.get(id).unwrap(), None);
    assert!(store.message(id).unwrap().is_none());
    assert_eq!(store.counts().iter().map(|(_, n)| n).sum::<u64>(), 0);
}

/// `orders.id = 42` and `invoices.id = 42`, read with `event_id = { field = "after.id" }`:
/// one id, two events, each in its topic's scope.
#[tokio::test]
async fn equal_ids_in_different_scopes_are_different_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let order = match store.claim(&event("42", 1), "db.public.orders").await.unwrap() {
        Claim::Claimed(c) => c,
        other => panic!("{other:?}"),
    };
    store.finish(order, State::Done, "http 200".into()).await.unwrap();
    let invoice = store.claim(&event("42", 1), "db.public.invoices").await.unwrap();
    assert!(matches!(invoice, Claim::Claimed(_)), "not suppressed by the order's record: {invoice:?}");
    assert!(matches!(store.claim(&event("42", 2), "db.public.orders").await.unwrap(), Claim::Finished { .. }));
    assert_eq!(store.stats().unwrap().claimed, 1);
    assert_eq!(store.stats().unwrap().done, 1);
}

#[tokio::test]
async fn an_undecodable_message_is_kept_apart_from_an_event_with_the_same_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let id = "undecodable/t/0/7";
    store.record_undecodable(id, &big_message("x", 10), "bad JSON".into(), None, false).await.unwrap();
    assert!(matches!(store.claim(&event(id, 8), "t").await.unwrap(), Claim::Claimed(_)));
    assert!(matches!(store.claim(&event(id, 8), "").await.unwrap(), Claim::Claimed(_)));
    let mut scopes: Vec<Option<Arc<str>>> = store.list(None, 10).unwrap().into_iter().map(|r| r.scope).collect();
    scopes.sort();
    assert_eq!(scopes, [Some("".into()), Some(UNDECODABLE_SCOPE.into()), Some("t".into())]);
    let stats = store.stats().unwrap();
    assert_eq!((stats.claimed, stats.dead), (2, 1));
}

#[tokio::test]
async fn each_scope_of_an_id_keeps_its_own_message_copy() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    for (scope, bytes) in [("db.public.invoices", 3), ("db.public.orders", 5)] {
        let Claim::Claimed(c) = store.claim(&event("42", 1), scope).await.unwrap() else { panic!("claimed") };
        store.finish_failed(c, State::Dead, "http 422".into(), &big_message("42", bytes), None).await.unwrap();
    }
    // What `store export` writes for each record.
    let mut values = Vec::new();
    store
        .scan(None, None, |r| -> Result<(), StoreError> {
            values.push(super::view::export_line(&store, &r)?.message.and_then(|m| m.value));
            Ok(())
        })
        .unwrap();
    let text = |s: &str| Some(crate::wire::BytesView::Text(s.to_owned()));
    assert_eq!(values, [text("xxx"), text("xxxxx")]);
}

/// A re-run that fails again past the quota: its new copy is not kept, and the copy
/// it was re-run from stays (it is the same message).
#[tokio::test]
async fn past_the_quota_a_failed_rerun_keeps_the_copy_it_ran_from() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    store.set_message_quota(1024 * 1024);
    for (id, bytes) in [("a", 600 * 1024), ("b", 300 * 1024)] {
        let c = claimed(&store, id, 1).await;
        store.finish_failed(c, State::Dead, "http 422".into(), &big_message(id, bytes), None).await.unwrap();
    }
    store.reopen("a").await.unwrap();
    let c = claimed(&store, "a", 7).await;
    store.finish_failed(c, State::Dead, "http 422".into(), &big_message("a", 800 * 1024), None).await.unwrap();
    assert!(store.get("a").unwrap().unwrap().reason.unwrap().contains("message copy not kept"));
    assert_eq!(store.message("a").unwrap().expect("the earlier copy").value.unwrap().len(), 600 * 1024);
    let total = store.message_bytes();
    assert!(total > 900 * 1024 && total < 1024 * 1024, "{total}");
}

fn run_trees(store: &Store) -> usize {
    store.db.tree_names().iter().filter(|n| runs::is_run_tree(n)).count()
}

/// Fifty events `e00`..`e49` claimed and recorded done, one a µs apart; their ids.
async fn fifty_done(store: &Store) -> Vec<String> {
    let ids: Vec<String> = (0..50).map(|i| format!("e{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let c = claimed(store, id, i as i64).await;
        store.finish(c, State::Done, "ok".into()).await.unwrap();
    }
    ids
}

/// A slice whose packing right another holds (a restore writing its records as a run,
/// store/changelog/runs.rs) is left alone by gc's seal and packed at its next pass:
/// two packs at once would each install a run without the other's records.
#[tokio::test]
async fn gc_leaves_a_slice_alone_while_another_holds_its_packing_right() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3_600))).unwrap();
    let ids = fifty_done(&store).await;
    let slices = store.slices.all();
    let end = slices.last().unwrap().end();
    let held: Vec<_> = slices.iter().map(|s| s.try_packing().expect("nobody packs it yet")).collect();
    assert_eq!(store.gc(end + 1).await.unwrap(), 0);
    assert_eq!(run_trees(&store), 0, "nothing is packed while another holds the right");
    drop(held);
    assert_eq!(store.gc(end + 1).await.unwrap(), 0);
    assert_eq!(run_trees(&store), slices.len(), "packed at the next pass");
    assert_eq!(slices.iter().map(|s| s.packing().0).sum::<u64>(), 50);
    for id in &ids {
        assert_eq!(store.get(id).unwrap().unwrap().state, State::Done, "{id}");
    }
}

/// A seal cut short after its run was installed and durable, before its settle: the
/// slice's records are in its run and, once each, in memory (the journal keeps them
/// until a settle lets go). Opened again, each is found once, and the slice's next
/// pack lets go of them.
#[tokio::test]
async fn a_slice_opened_between_a_seals_install_and_its_settle_lets_go_of_its_records_at_its_next_pack() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Duration::from_secs(3_600);
    let in_memory = |store: &Store| store.slices.all().iter().map(|s| s.mem_len()).sum::<usize>();
    let ids = {
        let store = Store::open(dir.path(), &opts(retention)).unwrap();
        let ids = fifty_done(&store).await;
        for s in store.slices.all() {
            let packing = s.try_packing().unwrap();
            let fold = store.slices.begin(&s, now_us(), &packing).unwrap();
            let run = store.slices.pack(&s, &fold, &packing).unwrap();
            store.durable().await.unwrap();
            store.slices.unshadow(&s, &fold).unwrap();
            store.slices.install(&s, run, &fold).unwrap();
            store.durable().await.unwrap();
        }
        assert_eq!(in_memory(&store), 50, "not settled");
        ids
    };
    let store = Store::open(dir.path(), &opts(retention)).unwrap();
    assert_eq!(in_memory(&store), 50, "the journal kept them");
    assert_eq!(store.len(), 50);
    assert_eq!(store.merged(std::ops::Bound::Unbounded).unwrap().count(), 50, "each listed once");
    // Past the slice's end (an eighth of the retention): it is packed, and lets go.
    store.gc(now_us() + 451_000_000).await.unwrap();
    assert_eq!(in_memory(&store), 0, "the run holds them");
    assert_eq!(store.slices.journal_chunks(), 0, "the journal let go of its chunks");
    for id in &ids {
        assert_eq!(store.get(id).unwrap().unwrap().state, State::Done, "{id}");
    }
    drop(store);
    let store = Store::open(dir.path(), &opts(retention)).unwrap();
    assert_eq!((in_memory(&store), store.len()), (0, 50));
}

/// The current slice's records in memory are packed once they are
/// `store.memory_records`, not at the next gc pass (minutes and maybe millions of
/// records away): the store says when, and a pack takes them out of memory.
#[tokio::test]
async fn records_in_memory_are_packed_once_there_are_memory_records_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions { memory_records: 256, ..opts(Duration::from_secs(3_600)) }).unwrap();
    let in_memory = |store: &Store| store.slices.all().iter().map(|s| s.mem_len()).sum::<usize>();
    let mut ids = Vec::new();
    for i in 0..255 {
        let id = format!("e{i:03}");
        let c = claimed(&store, &id, i).await;
        store.finish(c, State::Done, "ok".into()).await.unwrap();
        ids.push(id);
    }
    let told = tokio::time::timeout(Duration::from_millis(200), store.slices.full()).await;
    assert!(told.is_err(), "told before there were enough");
    for i in 255..300 {
        let id = format!("e{i:03}");
        let c = claimed(&store, &id, i).await;
        store.finish(c, State::Done, "ok".into()).await.unwrap();
        ids.push(id);
    }
    assert_eq!(in_memory(&store), 300);
    tokio::time::timeout(Duration::from_secs(10), store.slices.full()).await.expect("told once there were enough");
    assert_eq!(store.seal(now_us()).await.unwrap(), 300, "packed");
    assert_eq!(in_memory(&store), 0);
    assert_eq!(store.len(), 300);
    for id in &ids {
        assert_eq!(store.get(id).unwrap().unwrap().state, State::Done, "{id}");
    }
}

/// Once a slice stops taking live writes, gc packs it into a run; its records
/// are found, deduplicated, repaired, counted and listed as before, and after a reopen.
#[tokio::test]
async fn a_sealed_slice_answers_as_before_and_takes_repairs() {
    let dir = tempfile::tempdir().unwrap();
    // Slices of 7.5 min: the writes may still cross a boundary on a slow machine, so
    // every slice they fell in is sealed and counted.
    let retention = Duration::from_secs(3_600);
    let ids: Vec<String> = (0..300).map(|i| format!("e{i:03}")).collect();
    {
        let store = Store::open(dir.path(), &opts(retention)).unwrap();
        for (i, id) in ids.iter().enumerate() {
            let c = claimed(&store, id, i as i64).await;
            match i % 3 {
                0 => store.finish(c, State::Done, "ok".into()).await.unwrap(),
                1 => store.finish_failed(c, State::Dead, "http 422".into(), &big_message(id, 10), None).await.unwrap(),
                _ => {} // left claimed
            }
        }
        // Past the slices' end, before their records expire: packed, nothing removed.
        let slices = store.slices.all();
        let end = slices.last().unwrap().end();
        assert_eq!(store.gc(end + 1).await.unwrap(), 0);
        assert_eq!(run_trees(&store), slices.len());
        assert_eq!(slices.iter().map(|s| s.packing().0).sum::<u64>(), 300);
        assert!(slices.iter().all(|s| s.overlay_len() == 0), "the overlays are empty after the seal");

        assert!(matches!(
            store.claim(&event("e000", 99), "t").await.unwrap(),
            Claim::Finished { state: State::Done, same_offset: false }
        ));
        assert_eq!(store.get("e001").unwrap().unwrap().state, State::Dead);
        assert_eq!(store.forget("e000").await.unwrap().state, State::Done);
        assert!(store.get("e000").unwrap().is_none(), "forgotten: a tombstone over the run");
        store.reopen("e001").await.unwrap();
        assert_eq!(store.list(None, 1000).unwrap().len(), 299);
    }
    let store = Store::open(dir.path(), &opts(retention)).unwrap();
    assert!(store.get("e000").unwrap().is_none());
    assert_eq!(store.get("e001").unwrap().unwrap().state, State::Claimed, "reopened, in the newest slice");
    assert_eq!(store.get("e002").unwrap().unwrap().state, State::Claimed);
    assert!(store.message("e004").unwrap().is_some(), "a dead record's copy is still there");
    let s = store.stats().unwrap();
    assert_eq!((s.done, s.dead, s.claimed), (99, 99, 101));
    // A claim of a new id in the sealed range, and of a forgotten one.
    assert!(matches!(store.claim(&event("e000", 100), "t").await.unwrap(), Claim::Claimed(_)));
    // Everything expires whole: the run goes with its slice.
    assert_eq!(store.gc(now_us() + 2 * 3_600_000_000).await.unwrap(), 300);
    assert_eq!((run_trees(&store), store.len()), (0, 0));
}

#[tokio::test]
async fn a_replayed_done_event_is_claimed_with_its_message_and_runs_as_a_first_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let c = claimed(&store, "e1", 1).await;
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    let before = store.reopen_for_replay("t", "e1", &big_message("e1", 10)).await.unwrap();
    assert_eq!(before.state, State::Done);
    let r = store.get("e1").unwrap().unwrap();
    assert_eq!((r.state, r.attempts), (State::Claimed, 0));
    assert!(store.message("e1").unwrap().is_some(), "kept while it replays");
    let c = claimed(&store, "e1", 7).await;
    assert_eq!((c.attempt(), c.reexecution()), (1, false), "a replay is not an uncertain re-execution");
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    let Some(Replayed::Ran(now)) = store.put_back("t", "e1", &before).await.unwrap() else { panic!("it ran") };
    assert_eq!((now.state, now.attempts), (State::Done, 1));
    assert!(store.message("e1").unwrap().is_none(), "a done event keeps no copy");
    assert_eq!(store.stats().unwrap().done, 1);
}

#[tokio::test]
async fn a_replay_that_did_not_run_under_its_record_puts_the_record_back_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    let c = claimed(&store, "e1", 1).await;
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    let was = store.get("e1").unwrap().unwrap();
    let before = store.reopen_for_replay("t", "e1", &big_message("e1", 10)).await.unwrap();
    // Its route no longer selects it: nothing claimed it.
    let Some(Replayed::NotRun(now)) = store.put_back("t", "e1", &before).await.unwrap() else { panic!("not run") };
    assert_eq!((now.state, now.attempts, now.outcome.as_deref()), (State::Done, 1, Some("http 200")));
    assert!(now.version > was.version, "written again, so the changelog's newer record wins");
    assert_eq!(store.get("e1").unwrap().unwrap().state, State::Done);
    assert!(store.message("e1").unwrap().is_none());
    assert_eq!((store.stats().unwrap().claimed, store.stats().unwrap().done), (0, 1));
}

#[tokio::test]
async fn a_replay_takes_final_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    claimed(&store, "e1", 1).await;
    let e = store.reopen_for_replay("t", "e1", &big_message("e1", 10)).await.unwrap_err();
    assert!(matches!(e, StoreError::WrongState { state: State::Claimed, .. }), "{e}");
    let e = store.reopen_for_replay("other", "e1", &big_message("e1", 10)).await.unwrap_err();
    assert!(matches!(e, StoreError::NotFound(_)), "another scope's record is not this one: {e}");
}
