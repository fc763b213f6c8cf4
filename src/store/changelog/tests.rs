use std::time::Duration;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::checkpoints::*;
use super::entry::*;
use super::*;
use crate::store::tests::event_at as event;
use crate::store::disk::keys;
use crate::store::{now_us, ClaimHow, Record, State, Store, StoreError, Turn};
use crate::event::{Position, RawMessage};
use crate::store::{Claim, StoreOptions};

fn opts() -> StoreOptions {
    StoreOptions::for_tests(Some(Duration::from_secs(3600)))
}

/// A changelog on a broker that acknowledges everything at the next offset of its
/// partition (the store's other tests use it too).
#[derive(Default)]
pub(in crate::store) struct Recorded {
    entries: Mutex<Vec<(i64, Entry)>>,
    fail: bool,
}

impl Sink for Recorded {
    fn send(&self, entry: Entry) -> SendFuture {
        let mut entries = self.entries.lock().unwrap();
        let offset = entries.iter().filter(|(_, e)| e.topic == entry.topic && e.partition == entry.partition).count();
        let acked =
            Acked { changelog_topic: format!("{}.cl", entry.topic).into(), partition: entry.partition, offset: offset as i64 };
        entries.push((offset as i64, entry));
        let fail = self.fail;
        Box::pin(async move {
            if fail {
                Err(SendError::Refused {
                    changelog_topic: acked.changelog_topic.to_string(),
                    partition: acked.partition,
                    error: "broker said no".into(),
                })
            } else {
                Ok(acked)
            }
        })
    }
}

impl Recorded {
    /// A changelog whose broker refuses every entry.
    pub(in crate::store) fn refusing() -> Recorded {
        Recorded { fail: true, ..Recorded::default() }
    }

    /// What a restore of `topic`/`partition` would read.
    pub(in crate::store) fn records(&self, topic: &str, partition: i32) -> Vec<ChangelogRecord> {
        let entries = self.entries.lock().unwrap();
        entries
            .iter()
            .filter(|(_, e)| &*e.topic == topic && e.partition == partition)
            .map(|(offset, e)| ChangelogRecord {
                offset: *offset,
                key: e.key.clone(),
                value: e.value.clone(),
                mac: None,
            })
            .collect()
    }
}

/// Runs `f` with a metrics recorder of its own (on this thread): what it returned, and
/// how many changelog records it counted as rejected for being older than the store's
/// (`outboxd_changelog_records_rejected_total{reason="stale"}`, every partition).
pub(in crate::store) fn rejected_as_stale<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let out = metrics::with_local_recorder(&recorder, f);
    let rendered = handle.render();
    let stale: f64 = crate::metrics::samples(&rendered, crate::metrics::names::CHANGELOG_REJECTED, &[r#"reason="stale""#]).sum();
    (out, stale as u64)
}

async fn handle(store: &Store, id: &str, topic: &str, partition: i32, offset: i64, scope: &str) {
    match store.claim(&event(id, topic, partition, offset), scope).await.unwrap() {
        Claim::Claimed(c) => store.finish(c, State::Done, "http 200".into()).await.unwrap(),
        other => panic!("{id} not claimed: {other:?}"),
    }
}

#[test]
fn a_changelog_record_is_self_contained_small_and_round_trips() {
    let uuid = "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
    let position = Position { topic: "outbox.event.order".into(), partition: 3, offset: 1_234_567 };
    let mut r = Record::first_seen(uuid, State::Done, 1, &position, now_us());
    r.scope = Some(r.topic.clone());
    r.key = Some("order-1717".into());
    r.event_type = Some("OrderCreated".into());
    r.claimed_at_us = Some(r.first_seen_us);
    r.done_at_us = Some(r.updated_at_us + 2_000);
    r.updated_at_us += 2_000;
    r.outcome = Some("http 201".into());
    r.duplicates = 4;
    let (key, value) = (entry_key(&r), entry_value(&r).unwrap());
    assert_eq!(key, keys::event_key(uuid).to_vec(), "the scope is the topic: the key is the event key alone");
    assert!(key.len() + value.len() <= 100, "{} + {} bytes", key.len(), value.len());
    let back = decode_entry(&position.topic, &key, &value).unwrap();
    assert_eq!(back, Record { duplicates: 0, ..r.clone() }, "the duplicate count stays local");

    // A shared scope and an id that is not a UUID: the scope is in the key.
    let mut shared = Record { event_id: "a\0b".into(), scope: Some("".into()), event_type: None, ..r.clone() };
    shared.state = State::Dead;
    shared.reason = Some("http 422".into());
    let key = entry_key(&shared);
    let back = decode_entry(&position.topic, &key, &entry_value(&shared).unwrap()).unwrap();
    assert_eq!(back, Record { duplicates: 0, ..shared });
    assert!(decode_entry(&position.topic, &key[..key.len() - 2], b"\x01").is_err());
    assert!(decode_entry(&position.topic, &key, b"\x09").is_err(), "an unknown version is refused");
}

#[tokio::test]
async fn a_final_record_goes_to_the_changelog_partition_of_its_source_partition() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    handle(&store, "e1", "t", 2, 10, "t").await;
    handle(&store, "e2", "t", 0, 11, "").await;
    let entries = sink.entries.lock().unwrap().clone();
    assert_eq!(entries.iter().map(|(_, e)| (&*e.topic, e.partition)).collect::<Vec<_>>(), [("t", 2), ("t", 0)]);
    assert_eq!(entries[0].1.key, keys::event_key("e1").to_vec());
    assert!(entries[1].1.key.ends_with(&[SCOPE_TAG]), "the shared scope (\"\") is named in the key");
}

#[tokio::test]
async fn a_changelog_write_that_fails_fails_the_final_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    store.attach_changelog(Arc::new(Recorded { fail: true, ..Recorded::default() }));
    let Claim::Claimed(c) = store.claim(&event("e1", "t", 0, 1), "t").await.unwrap() else { panic!() };
    let e = store.finish(c, State::Done, "http 200".into()).await.unwrap_err();
    assert!(matches!(e, StoreError::Changelog(_)), "{e}");
}

#[tokio::test]
async fn an_empty_store_restored_from_the_changelog_suppresses_what_another_instance_handled() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::open(a_dir.path(), &opts()).unwrap();
    let sink = Arc::new(Recorded::default());
    a.attach_changelog(sink.clone());
    for i in 0..20 {
        handle(&a, &format!("e{i}"), "t", 1, i, "t").await;
    }
    {
        let b = Store::open(b_dir.path(), &opts()).unwrap();
        assert_eq!(b.checkpoint("t.cl", 1), None, "never restored: from the beginning");
        let records = sink.records("t", 1);
        assert_eq!(b.apply_changelog("t", &records).unwrap(), 20);
        b.restored_to("t.cl", 1, 20, true).await.unwrap();
        let r = b.get("e7").unwrap().unwrap();
        assert_eq!((r.state, &*r.topic, r.partition, r.offset), (State::Done, "t", 1, 7));
        assert_eq!(r.event_type.as_deref(), Some("OrderCreated"));
    }
    // The checkpoint is durable with the records.
    let b = Store::open(b_dir.path(), &opts()).unwrap();
    assert_eq!(b.checkpoint("t.cl", 1), Some(20));
    assert_eq!(
        b.claim(&event("e7", "t", 1, 500), "t").await.unwrap(),
        Claim::Finished { state: State::Done, same_offset: false },
        "replayed at a new offset: suppressed"
    );
}

#[tokio::test]
async fn a_restore_never_turns_a_final_record_back_into_a_claim_and_honours_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    handle(&store, "e1", "t", 0, 1, "t").await;
    let mut claim = store.get("e1").unwrap().unwrap();
    claim.state = State::Claimed;
    let stale =
        ChangelogRecord { offset: 0, key: entry_key(&claim), value: Some(entry_value(&claim).unwrap()), mac: None };
    assert_eq!(store.apply_changelog("t", &[stale]).unwrap(), 0);
    assert_eq!(store.get("e1").unwrap().unwrap().state, State::Done);
    let gone = ChangelogRecord { offset: 1, key: entry_key(&claim), value: None, mac: None };
    assert_eq!(store.apply_changelog("t", &[gone]).unwrap(), 1);
    assert!(store.get("e1").unwrap().is_none());
}

#[test]
fn the_checkpoint_follows_own_writes_only_while_they_are_contiguous() {
    let cps = Checkpoints::default();
    cps.acked("c", 0, 5);
    assert_eq!(cps.get("c", 0), None, "not restored here: nothing to follow");
    cps.set("c", 0, 10, true);
    cps.acked("c", 0, 11);
    assert_eq!(cps.get("c", 0), Some(10), "offset 10 is not acknowledged yet");
    cps.acked("c", 0, 10);
    assert_eq!(cps.get("c", 0), Some(12));
    cps.acked("c", 0, 13);
    assert_eq!(cps.get("c", 0), Some(12), "12 was written by another instance: read it at the next restore");
    cps.set("c", 1, 0, true);
    for offset in 0..3 {
        cps.acked("c", 1, offset);
    }
    assert_eq!(cps.get("c", 1), Some(3), "acknowledgements in order move it one by one");
}

fn message(topic: &str, partition: i32, offset: i64) -> RawMessage {
    RawMessage {
        topic: topic.into(),
        partition,
        offset,
        key: Some(b"order-1".to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![],
        timestamp_ms: None,
    }
}

async fn fail(store: &Store, id: &str, topic: &str, partition: i32, offset: i64, state: State) {
    let Claim::Claimed(c) = store.claim(&event(id, topic, partition, offset), topic).await.unwrap() else { panic!() };
    store.finish_failed(c, state, "http 422".into(), &message(topic, partition, offset), None).await.unwrap();
}

/// The entries sent since the first `skip`, as (partition, key, state or `None` for a tombstone).
fn sent(sink: &Recorded, topic: &str, skip: usize) -> Vec<(i32, Vec<u8>, Option<State>)> {
    let entries = sink.entries.lock().unwrap();
    entries[skip..]
        .iter()
        .map(|(_, e)| {
            let state = e.value.as_ref().map(|v| decode_entry(topic, &e.key, v).unwrap().state);
            (e.partition, e.key.clone(), state)
        })
        .collect()
}

#[tokio::test]
async fn every_repair_goes_to_the_changelog_partition_of_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    handle(&store, "done", "t", 1, 1, "t").await;
    fail(&store, "dead", "t", 2, 2, State::Dead).await;
    fail(&store, "parked", "t", 3, 3, State::Parked).await;
    fail(&store, "rerun", "t", 0, 4, State::Dead).await;
    let before = sink.entries.lock().unwrap().len();

    store.forget("done").await.unwrap();
    store.resolve_done("parked", "checked by hand".into()).await.unwrap();
    store.reopen("dead").await.unwrap();
    store.reopen("rerun").await.unwrap();
    assert!(store.settle_rerun("rerun").await.unwrap().is_none(), "still waiting after its re-run: removed");

    assert_eq!(
        sent(&sink, "t", before),
        [
            (1, keys::event_key("done").to_vec(), None),
            (3, keys::event_key("parked").to_vec(), Some(State::Done)),
            (2, keys::event_key("dead").to_vec(), Some(State::Claimed)),
            (0, keys::event_key("rerun").to_vec(), Some(State::Claimed)),
            (0, keys::event_key("rerun").to_vec(), None),
        ]
    );
    let resolved = sink.entries.lock().unwrap()[before + 1].1.clone();
    let resolved = decode_entry("t", &resolved.key, resolved.value.as_ref().unwrap()).unwrap();
    assert_eq!(resolved.outcome.as_deref(), Some("checked by hand"));
    let here = Record { duplicates: 0, expires_at_us: None, ..store.get("parked").unwrap().unwrap() };
    assert_eq!(here, resolved, "the same record as here");
}

#[tokio::test]
async fn a_repair_the_broker_refuses_changes_nothing_here() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    store.attach_changelog(Arc::new(Recorded::default()));
    handle(&store, "done", "t", 0, 1, "t").await;
    fail(&store, "parked", "t", 0, 2, State::Parked).await;
    fail(&store, "dead", "t", 0, 3, State::Dead).await;
    store.attach_changelog(Arc::new(Recorded { fail: true, ..Recorded::default() }));

    assert!(matches!(store.forget("done").await, Err(StoreError::Changelog(_))));
    assert!(matches!(store.resolve_done("parked", "x".into()).await, Err(StoreError::Changelog(_))));
    assert!(matches!(store.reopen("dead").await, Err(StoreError::Changelog(_))));
    let states: Vec<State> =
        ["done", "parked", "dead"].iter().map(|id| store.get(id).unwrap().unwrap().state).collect();
    assert_eq!(states, [State::Done, State::Parked, State::Dead], "a repair can be made again");
    assert!(store.message("parked").unwrap().is_some(), "the message copy is kept too");
}

#[tokio::test]
async fn repairs_made_on_one_instance_hold_on_another_after_its_restore() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::open(a_dir.path(), &opts()).unwrap();
    let b = Store::open(b_dir.path(), &opts()).unwrap();
    let sink = Arc::new(Recorded::default());
    a.attach_changelog(sink.clone());
    handle(&a, "forgotten", "t", 0, 1, "t").await;
    handle(&a, "kept", "t", 0, 2, "t").await;
    fail(&a, "resolved", "t", 0, 3, State::Dead).await;
    b.apply_changelog("t", &sink.records("t", 0)).unwrap();
    assert_eq!(b.get("forgotten").unwrap().unwrap().state, State::Done);

    // Made on `a` (with the changelog attached): `b` reads them from the changelog only.
    let repairs_from = sink.records("t", 0).len();
    a.forget("forgotten").await.unwrap();
    a.resolve_done("resolved", "by hand".into()).await.unwrap();
    b.apply_changelog("t", &sink.records("t", 0)[repairs_from..]).unwrap();

    assert!(b.get("forgotten").unwrap().is_none(), "forgotten on b too");
    assert_eq!(b.get("resolved").unwrap().unwrap().state, State::Done, "resolved on b too");
    assert!(matches!(b.claim(&event("forgotten", "t", 0, 9), "t").await.unwrap(), Claim::Claimed(_)));
    assert_eq!(
        b.claim(&event("kept", "t", 0, 10), "t").await.unwrap(),
        Claim::Finished { state: State::Done, same_offset: false }
    );
}

#[test]
fn catching_up_moves_the_checkpoint_past_others_writes_and_on_over_own_ones() {
    let cps = Checkpoints::default();
    assert_eq!(cps.followed("c", 0), None, "not restored here: not followed");
    cps.set("c", 0, 10, true);
    for own in [12, 13, 16] {
        cps.acked("c", 0, own);
    }
    assert_eq!(cps.followed("c", 0), Some((10, BTreeSet::from([12, 13, 16]))), "10 and 11 are someone else's");
    cps.caught_up("c", 0, 12);
    assert_eq!(cps.followed("c", 0), Some((14, BTreeSet::from([16]))), "others' read up to 12, own 12 and 13 follow");
    cps.caught_up("c", 0, 11);
    assert_eq!(cps.get("c", 0), Some(14), "never back");
    cps.set("c", 1, 5, false);
    cps.caught_up("c", 1, 9);
    assert_eq!((cps.followed("c", 1), cps.get("c", 1)), (None, Some(5)), "a partition not followed stays");
}

#[tokio::test]
async fn a_final_record_found_again_goes_to_the_changelog_before_its_duplicate_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    // Done here while no changelog took it (as after a crash before its acknowledgement).
    handle(&store, "e1", "t", 0, 1, "t").await;
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    assert_eq!(
        store.claim(&event("e1", "t", 0, 1), "t").await.unwrap(),
        Claim::Finished { state: State::Done, same_offset: true }
    );
    let records = sink.records("t", 0);
    assert_eq!(records.len(), 1, "the record went to the changelog");
    let r = decode_entry("t", &records[0].key, records[0].value.as_deref().unwrap()).unwrap();
    assert_eq!((&*r.event_id, r.state), ("e1", State::Done));
}

/// The version of every record `sink` received, in order (`None`: a tombstone).
fn versions(sink: &Recorded, topic: &str, partition: i32) -> Vec<(State, u64)> {
    sink.records(topic, partition)
        .iter()
        .filter_map(|r| r.value.as_ref().map(|v| decode_entry(topic, &r.key, v).unwrap()))
        .map(|r| (r.state, r.version))
        .collect()
}

#[tokio::test]
async fn every_write_of_a_record_gives_it_one_more_than_the_version_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    let version = |id: &str| store.get(id).unwrap().unwrap().version;

    // A durable claim, an attempt, the final record: three writes.
    let m = message("t", 0, 1);
    let how = ClaimHow { durable: true, hold: true, message: &m };
    let Turn::Run(mut c) = store.claim_to_run(&event("durable", "t", 0, 1), "t", how).await.unwrap() else {
        panic!()
    };
    assert_eq!(version("durable"), 1);
    assert_eq!(versions(&sink, "t", 0), [(State::Claimed, 1)], "acknowledged before the call");
    store.record_attempt(&mut c).await.unwrap();
    assert_eq!(version("durable"), 2);
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(versions(&sink, "t", 0), [(State::Claimed, 1), (State::Done, 3)], "what the changelog got");

    // An in-memory claim and its attempts write nothing: the final record is the first write.
    let Claim::Claimed(mut c) = store.claim_in_memory(&event("in-memory", "t", 1, 2), "t").await.unwrap() else {
        panic!()
    };
    store.record_attempt(&mut c).await.unwrap();
    store.finish(c, State::Dead, "http 500".into()).await.unwrap();
    assert_eq!(version("in-memory"), 1);

    // Repairs: a re-run taken back, then done by its re-run; a resolve; a forget starts again.
    fail(&store, "rerun", "t", 2, 3, State::Dead).await;
    assert_eq!(version("rerun"), 2, "a durable claim (kept here only), then the dead record");
    store.reopen("rerun").await.unwrap();
    assert_eq!(version("rerun"), 3);
    let Claim::Claimed(c) = store.claim_in_memory(&event("rerun", "t", 2, 3), "t").await.unwrap() else { panic!() };
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(versions(&sink, "t", 2), [(State::Dead, 2), (State::Claimed, 3), (State::Done, 4)]);
    fail(&store, "parked", "t", 3, 4, State::Parked).await;
    store.resolve_done("parked", "by hand".into()).await.unwrap();
    assert_eq!(versions(&sink, "t", 3), [(State::Parked, 2), (State::Done, 3)]);
    store.forget("parked").await.unwrap();
    handle(&store, "parked", "t", 3, 4, "t").await;
    assert_eq!(version("parked"), 2, "after a forget the record is new: claim 1, done 2");

    // A message that never became an event, recorded dead twice.
    let m = message("t", 4, 5);
    store.record_undecodable("undecodable", &m, "bad".into(), None, false).await.unwrap();
    store.record_undecodable("undecodable", &m, "bad again".into(), None, false).await.unwrap();
    assert_eq!(version("undecodable"), 2);

    // A duplicate sends the final record again as it is: the same write, the same version.
    let before = versions(&sink, "t", 0).len();
    store.claim(&event("durable", "t", 0, 1), "t").await.unwrap();
    assert_eq!(versions(&sink, "t", 0)[before..], [(State::Done, 3)]);
}
