use std::time::Duration;

use std::sync::Arc;

use super::*;
use crate::store::{now_us, Record, State, Store};
use crate::event::{OutboxEvent, Payload, Position, RawMessage};
use crate::store::changelog::tests::{rejected_as_stale, Recorded};
use crate::store::tests::event;
use crate::store::{Claim, StoreOptions};

fn opts() -> StoreOptions {
    StoreOptions::for_tests(Some(Duration::from_secs(3600)))
}

/// A changelog record of event `id` of topic `t`, last written `ago_s` seconds ago.
fn rec(offset: i64, id: &str, state: State, ago_s: i64, scope: Option<&str>) -> ChangelogRecord {
    versioned(offset, id, state, ago_s, scope, 0)
}

/// [`rec`], with a version (0: as releases without versions wrote it).
fn versioned(offset: i64, id: &str, state: State, ago_s: i64, scope: Option<&str>, version: u64) -> ChangelogRecord {
    let at = now_us() - ago_s * 1_000_000;
    let position = Position { topic: "t".into(), partition: 0, offset };
    let mut r = Record::first_seen(id, state, 1, &position, at);
    r.scope = Some(scope.unwrap_or("t").into());
    r.event_type = Some("OrderCreated".into());
    r.claimed_at_us = Some(at);
    if state.is_final() {
        r.done_at_us = Some(at);
        r.outcome = Some(format!("http 200 at {offset}"));
    }
    r.version = version;
    ChangelogRecord { offset, key: entry_key(&r), value: Some(entry_value(&r).unwrap()), mac: None }
}

/// A done record of event `id`, its fields varied by `i`: every shape a record's
/// value takes (a restore writes plain ones straight from their changelog value).
fn varied(offset: i64, id: &str, i: i64) -> ChangelogRecord {
    let at = now_us() - 10_000_000;
    let position = Position { topic: "t".into(), partition: 0, offset };
    let mut r = Record::first_seen(id, State::Done, 1 + i as u32 % 3, &position, at - i);
    r.scope = Some("t".into());
    r.done_at_us = Some(at);
    r.updated_at_us = at;
    r.claimed_at_us = (i % 4 != 0).then_some(at - 7);
    r.event_type = ["OrderCreated", "t", "Paid"].get(i as usize % 4).map(|t| (*t).into());
    r.outcome = ["http 201", "logged", "verified: http 200 on lookup"].get(i as usize % 4).map(|o| o.to_string());
    r.key = ["0190A3C4-5E6F-7A8B-9C0D-1E2F3A4B5C6D", "order-7"].get(i as usize % 3).map(|k| (*k).into());
    // A done record of a held chain's key has left the chain (on_dead = "hold" gives every keyed event one).
    r.chain = r.key.as_deref().filter(|_| i % 2 == 0).map(|k| k.as_bytes().to_vec());
    r.version = i as u64 % 3;
    ChangelogRecord { offset, key: entry_key(&r), value: Some(entry_value(&r).unwrap()), mac: None }
}

/// A changelog with what compaction has not removed yet: claims before their
/// outcome, a stale claim after an outcome, records an hour apart (other
/// slices), a shared scope, an expired record, a record moving slices.
fn changelog() -> Vec<ChangelogRecord> {
    let mut v = Vec::new();
    for i in 0..60i64 {
        let id = format!("0190a3c4-5e6f-7a8b-9c0d-{i:012x}");
        let o = v.len() as i64;
        match i % 6 {
            0 => v.push(varied(o, &id, i)),
            1 => {
                v.push(rec(o, &id, State::Claimed, 20, None));
                v.push(rec(o + 1, &id, State::Done, 19, None));
            }
            2 => {
                v.push(rec(o, &id, State::Done, 20, None));
                v.push(rec(o + 1, &id, State::Claimed, 5, None));
            }
            3 => v.push(rec(o, &id, State::Dead, 1_500, Some(""))),
            4 => v.push(rec(o, &id, State::Done, 7_200 * 3, None)),
            _ => {
                v.push(rec(o, &id, State::Claimed, 2_000, None));
                v.push(rec(o + 1, &id, State::Parked, 30, None));
            }
        }
    }
    v
}

/// Room for every record a test restores: they wait until the read's end.
const ALL: u64 = 1 << 30;

/// Reads `records` in batches of `size` into `store` as the reader does
/// (engine/reader.rs): what waits to be written as runs is written whenever it is
/// full, and at the end. Returns the records applied.
fn read(store: &Store, restoring: &mut Restoring, records: &[ChangelogRecord], size: usize) -> u64 {
    let mut applied = 0;
    for batch in records.chunks(size) {
        applied += store.apply_restoring("t", batch, restoring).unwrap();
        if restoring.unwritten_full() {
            store.write_unwritten(restoring).unwrap();
        }
    }
    store.write_unwritten(restoring).unwrap();
    // As the checkpoint's move at the end makes everything durable.
    store.durable_blocking().unwrap();
    applied
}

/// [`Store::write_unwritten`] from an async test (it blocks its thread).
fn write_unwritten(store: &Store, restoring: &mut Restoring) {
    std::thread::scope(|s| s.spawn(|| store.write_unwritten(restoring).unwrap()).join().unwrap());
}

fn contents(store: &Store) -> (Vec<Record>, [(State, u64); State::ALL.len()]) {
    (store.list(None, usize::MAX).unwrap(), store.counts())
}

/// Whether the records wait to be written as runs until the end or are written
/// after every batch (a small `store.changelog.restore_run_bytes`), and whatever
/// the batches, a new store ends as applying record by record makes it, the
/// restored records in runs, reopened too.
#[test]
fn a_restore_into_a_new_store_gives_what_applying_record_by_record_gives() {
    let records = changelog();
    let b_dir = tempfile::tempdir().unwrap();
    let b = Store::open(b_dir.path(), &opts()).unwrap();
    let expected = b.apply_one_by_one("t", &records, &mut Restoring::looking_up()).unwrap();
    for (run_bytes, size) in [(ALL, 7), (1, 7), (1, 1), (ALL, records.len())] {
        let a_dir = tempfile::tempdir().unwrap();
        let a = Store::open(a_dir.path(), &opts()).unwrap();
        let mut restoring = a.start_restore("t", run_bytes);
        assert!(restoring.is_fresh(), "a new store holds no record of the topic");
        // Batch boundaries fall between a claim and its outcome too.
        let applied = read(&a, &mut restoring, &records, size);
        assert!(restoring.is_fresh(), "nobody else wrote: the fast path held to the end");
        assert!(!restoring.holds_unwritten());
        assert_eq!(applied, expected, "{run_bytes} B, batches of {size}");
        assert_eq!(contents(&a), contents(&b), "{run_bytes} B, batches of {size}");
        let (list, counts) = contents(&a);
        assert_eq!(list.len(), 50, "every event once, without the expired ones");
        assert_eq!(counts.iter().map(|(_, n)| *n).sum::<u64>(), 50);
        assert!(list.iter().all(|r| r.state != State::Claimed), "no outcome was turned back into a claim");
        let packed: u64 = a.slices.all().iter().map(|s| s.packing().0).sum();
        // The 30 done records of the topic's scope at least (their slice's other records too).
        assert!(packed >= 30, "{run_bytes} B, batches of {size}: the plain records are in runs ({packed})");
        if run_bytes == 1 {
            let most = a.slices.all().iter().map(|s| s.run_count()).max();
            assert!(most > Some(1), "written after every batch: a slice takes a run each time ({most:?})");
        }
        drop(restoring);
        drop(a);
        let a = Store::open(a_dir.path(), &opts()).unwrap();
        assert_eq!(contents(&a), contents(&b), "{run_bytes} B, batches of {size}, reopened");
    }
}

/// A restore that writes what it holds back after every batch gives a slice a run
/// each time, each record written once; gc merges a slice of more than `MAX_RUNS`
/// runs into one, and the store answers as before, reopened too.
#[tokio::test]
async fn gc_merges_a_slice_that_a_restore_gave_many_runs() {
    use crate::store::disk::slices::MAX_RUNS;
    let records = changelog();
    let dir = tempfile::tempdir().unwrap();
    let a = Store::open(dir.path(), &opts()).unwrap();
    let mut restoring = a.start_restore("t", 1);
    std::thread::scope(|s| s.spawn(|| read(&a, &mut restoring, &records, 1)).join().unwrap());
    drop(restoring);
    let restored = contents(&a);
    let runs = |a: &Store| a.slices.all().iter().map(|s| s.run_count()).max().unwrap_or(0);
    assert!(runs(&a) > MAX_RUNS, "a run per batch ({})", runs(&a));
    a.gc(now_us()).await.unwrap();
    assert_eq!(runs(&a), 1, "merged");
    assert_eq!(contents(&a), restored);
    drop(a);
    let a = Store::open(dir.path(), &opts()).unwrap();
    assert_eq!(runs(&a), 1);
    assert_eq!(contents(&a), restored, "reopened");
}

/// A tombstone (a `store forget` made elsewhere) for a record that waits to be
/// written as a run: the record is gone, the fast path goes on, and the run does
/// not bring it back; the other records of the read are written.
#[test]
fn a_tombstone_for_a_record_that_waits_removes_it_before_it_is_written() {
    let (gone, kept) = ("0190a3c4-5e6f-7a8b-9c0d-0000000000a1", "0190a3c4-5e6f-7a8b-9c0d-0000000000a2");
    let first = [rec(0, gone, State::Done, 10, None), rec(1, kept, State::Done, 10, None)];
    let tombstone = ChangelogRecord { offset: 2, key: first[0].key.clone(), value: None, mac: None };
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let mut restoring = store.start_restore("t", ALL);
    store.apply_restoring("t", &first, &mut restoring).unwrap();
    assert!(restoring.holds_unwritten());
    assert_eq!(store.apply_restoring("t", &[tombstone], &mut restoring).unwrap(), 1, "the tombstone applied");
    assert!(restoring.is_fresh(), "nothing stored was removed: the fast path goes on");
    store.write_unwritten(&mut restoring).unwrap();
    assert!(store.get(gone).unwrap().is_none(), "the forgotten record is not written");
    assert_eq!(store.get(kept).unwrap().unwrap().state, State::Done);
    assert_eq!(store.counts().iter().map(|(_, n)| *n).sum::<u64>(), 1);
}

/// A read stopped before its end (the partition was taken away, the service
/// stops) drops what waits: nothing of it is in the store, and the records a
/// batch wrote as runs before are.
#[test]
fn a_restore_stopped_early_drops_what_waits_and_keeps_what_it_wrote() {
    let records = changelog();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let mut restoring = store.start_restore("t", ALL);
    read(&store, &mut restoring, &records, 7);
    let kept = contents(&store);
    let more: Vec<ChangelogRecord> =
        (0..10).map(|i| rec(100 + i, &format!("0190a3c4-5e6f-7a8b-9c0d-1000000000{i:02x}"), State::Done, 10, None)).collect();
    store.apply_restoring("t", &more, &mut restoring).unwrap();
    assert!(restoring.holds_unwritten());
    assert_eq!(contents(&store), kept, "nothing of the unwritten batch is in the store yet");
    drop(restoring);
    assert_eq!(contents(&store), kept);
}

#[test]
fn a_restore_into_a_store_with_records_of_the_topic_looks_each_one_up() {
    let records = changelog();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (Store::open(a_dir.path(), &opts()).unwrap(), Store::open(b_dir.path(), &opts()).unwrap());
    // Both stores already hold the outcomes of a third of the events, some with other outcomes.
    let local: Vec<ChangelogRecord> = records
        .iter()
        .step_by(3)
        .enumerate()
        .map(|(i, r)| {
            let mut d = decode_entry("t", &r.key, r.value.as_deref().unwrap()).unwrap();
            d.state = if i % 2 == 0 { State::Done } else { State::Dead };
            ChangelogRecord { offset: 0, key: r.key.clone(), value: Some(entry_value(&d).unwrap()), mac: None }
        })
        .collect();
    a.apply_one_by_one("t", &local, &mut Restoring::looking_up()).unwrap();
    b.apply_one_by_one("t", &local, &mut Restoring::looking_up()).unwrap();
    let mut restoring = a.start_restore("t", ALL);
    assert!(!restoring.is_fresh());
    let applied = read(&a, &mut restoring, &records, 5);
    assert!(!a.slices.all().iter().any(|s| s.packing().0 > 0), "every record looked up and written an entry each");
    assert_eq!(applied, b.apply_one_by_one("t", &records, &mut Restoring::looking_up()).unwrap());
    assert_eq!(contents(&a), contents(&b));
}

#[tokio::test]
async fn a_record_written_by_the_service_during_a_fresh_restore_ends_the_fast_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let id = "0190a3c4-5e6f-7a8b-9c0d-00000000ffff";
    let first = "0190a3c4-5e6f-7a8b-9c0d-000000000001";
    let mut restoring = store.start_restore("t", ALL);
    store.apply_restoring("t", &[rec(0, first, State::Done, 1, None)], &mut restoring).unwrap();
    assert!(restoring.is_fresh() && restoring.holds_unwritten());
    // Another partition of the topic handles the same event meanwhile.
    let event = OutboxEvent {
        id: id.into(),
        aggregate_id: None,
        event_type: None,
        payload: Payload::Null,
        position: Position { topic: "t".into(), partition: 3, offset: 9 },
        timestamp_ms: None,
        traceparent: None,
        route_key: None,
        headers: Vec::new(),
    };
    let Claim::Claimed(c) = store.claim(&event, "t").await.unwrap() else { panic!("not claimed") };
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    // The changelog still says the event was claimed elsewhere.
    assert_eq!(store.apply_restoring("t", &[rec(1, id, State::Claimed, 1, None)], &mut restoring).unwrap(), 0);
    assert!(!restoring.is_fresh(), "the store's count moved by another writer");
    assert!(!restoring.holds_unwritten(), "what waited was written as the fast path ended");
    assert_eq!(store.get(id).unwrap().unwrap().state, State::Done, "the outcome stays");
    assert_eq!(store.get(first).unwrap().unwrap().state, State::Done, "the record that waited is in the store");
    assert_eq!(store.counts().iter().map(|(_, n)| *n).sum::<u64>(), 2);
}

/// A record whose writer's clock ran ahead of the restorer's looks older than it
/// is: up to `clock_skew` past the retention it is still restored, so the skew
/// never shortens the dedup window; past that it is expired.
#[test]
fn a_restore_allows_the_configured_clock_skew_before_it_expires_a_record() {
    let retention = 3600;
    let records = vec![
        rec(0, "0190a3c4-5e6f-7a8b-9c0d-00000000000a", State::Done, retention + 60, None),
        rec(1, "0190a3c4-5e6f-7a8b-9c0d-00000000000b", State::Done, retention + 600, None),
    ];
    let dir = tempfile::tempdir().unwrap();
    let skewed = StoreOptions { clock_skew: Duration::from_secs(300), ..opts() };
    let store = Store::open(dir.path(), &skewed).unwrap();
    let mut restoring = store.start_restore("t", ALL);
    assert_eq!(read(&store, &mut restoring, &records, 2), 1);
    let kept: Vec<String> = store.list(None, 10).unwrap().into_iter().map(|r| r.event_id.to_string()).collect();
    assert_eq!(
        kept,
        vec!["0190a3c4-5e6f-7a8b-9c0d-00000000000a".to_owned()],
        "1 min past the retention is within the skew; 10 min is not"
    );

    let dir = tempfile::tempdir().unwrap();
    let strict = StoreOptions { clock_skew: Duration::ZERO, ..opts() };
    let store = Store::open(dir.path(), &strict).unwrap();
    let mut restoring = store.start_restore("t", ALL);
    assert_eq!(read(&store, &mut restoring, &records, 2), 0, "no skew allowed: both expired");
}

/// The lookup filters must know every record, whichever path wrote it: a claim
/// that missed one would run its event again. Records written by the handling
/// path and by a restore (in slices an hour apart) are each found final by a
/// claim, before and after a reopen, while its filters are built from the trees
/// and once they are.
#[tokio::test]
async fn every_record_written_is_found_through_the_lookup_filters() {
    let dir = tempfile::tempdir().unwrap();
    let handled: Vec<String> = (0..300).map(|i| format!("h-{i}")).collect();
    let restored: Vec<ChangelogRecord> =
        (0..300).map(|i| rec(i, &format!("r-{i}"), State::Done, if i % 2 == 0 { 0 } else { 3600 }, None)).collect();
    let ids: Vec<String> = handled.iter().cloned().chain((0..300).map(|i| format!("r-{i}"))).collect();
    {
        let store = Store::open(dir.path(), &opts()).unwrap();
        let mut restoring = store.start_restore("t", ALL);
        for batch in restored.chunks(64) {
            store.apply_restoring("t", batch, &mut restoring).unwrap();
        }
        write_unwritten(&store, &mut restoring);
        for (i, id) in handled.iter().enumerate() {
            let Claim::Claimed(c) = store.handling().claim(&event(id, i as i64), "t").await.unwrap() else {
                panic!("{id} is new")
            };
            store.handling().finish(c, State::Done, "ok".into()).await.unwrap();
        }
        all_final(&store, &ids).await;
    }
    let store = Store::open(dir.path(), &opts()).unwrap();
    all_final(&store, &ids).await; // the filters may still be filling: lookups read the trees
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !store.slices.filters_filled() {
        assert!(std::time::Instant::now() < deadline, "the filters were not built");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    all_final(&store, &ids).await;
    let Claim::Claimed(_) = store.handling().claim(&event("never-seen", 1), "t").await.unwrap() else {
        panic!("an id never written is new")
    };
}

/// Every id in `ids` is found final by a claim.
async fn all_final(store: &Store, ids: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        if let Claim::Claimed(_) = store.handling().claim(&event(id, 10_000 + i as i64), "t").await.unwrap() {
            panic!("{id} was written, and a claim did not find it");
        }
    }
}

const X: &str = "0190a3c4-5e6f-7a8b-9c0d-0000000000aa";

/// The writes of one event, in offset order: claimed and an attempt (durable
/// claims), dead, taken back for a re-run, done; then two of them written to the
/// topic again (the MAC does not say when a record was written).
fn writes_then_replays() -> Vec<ChangelogRecord> {
    vec![
        versioned(0, X, State::Claimed, 50, None, 1),
        versioned(1, X, State::Claimed, 49, None, 2),
        versioned(2, X, State::Dead, 48, None, 3),
        versioned(3, X, State::Claimed, 40, None, 4),
        versioned(4, X, State::Done, 39, None, 5),
        versioned(5, X, State::Dead, 48, None, 3),
        versioned(6, X, State::Claimed, 50, None, 1),
    ]
}

#[test]
fn a_restore_in_offset_order_ends_with_the_newest_write_and_refuses_older_ones_written_again_after_it() {
    let records = writes_then_replays();
    let whole = |s: &Store| read(s, &mut s.start_restore("t", ALL), &records, records.len());
    let one_by_one = |s: &Store| read(s, &mut s.start_restore("t", 1), &records, 1);
    let legacy = |s: &Store| s.apply_one_by_one("t", &records, &mut Restoring::looking_up()).unwrap();
    for (how, apply) in
        [("one batch", &whole as &dyn Fn(&Store) -> u64), ("a record a batch", &one_by_one), ("legacy", &legacy)]
    {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &opts()).unwrap();
        let (applied, stale) = rejected_as_stale(|| apply(&store));
        let r = store.get(X).unwrap().unwrap();
        assert_eq!((r.state, r.version, r.outcome.as_deref()), (State::Done, 5, Some("http 200 at 4")), "{how}");
        assert_eq!(applied, 4, "{how}: every write but the re-run's claim over the dead record, and the replays");
        assert_eq!(stale, 2, "{how}: the two written again are counted");
    }
}

fn message(offset: i64) -> RawMessage {
    RawMessage {
        topic: "t".into(),
        partition: 0,
        offset,
        key: Some(b"order-1".to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![],
        timestamp_ms: None,
    }
}

/// Everything store A sent to the changelog while an event was claimed durably,
/// retried and finished, and a dead event held its key's next event until it was
/// resolved and the held one ran.
async fn history() -> (Vec<ChangelogRecord>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let a = Store::open(dir.path(), &opts()).unwrap();
    let sink = Arc::new(Recorded::default());
    a.attach_changelog(sink.clone());
    let Claim::Claimed(mut c) = a.claim(&event("durable", 1), "t").await.unwrap() else { panic!() };
    a.log_claim(&c).await.unwrap();
    a.record_attempt(&mut c).await.unwrap();
    a.finish(c, State::Done, "http 200".into()).await.unwrap();
    let Claim::Claimed(c) = a.claim_in_memory(&event("head", 2), "t").await.unwrap() else { panic!() };
    a.finish_failed(c.holding(true, &message(2)), State::Dead, "http 400".into(), &message(2), None).await.unwrap();
    let claim = a.claim_in_memory(&event("held", 3), "t").await.unwrap();
    assert!(a.hold_behind(claim, true, &message(3)).await.unwrap().is_none(), "held");
    a.resolve_done("head", "by hand".into()).await.unwrap();
    let (r, m, running) = a.next_held(&a.released_chains()[0]).await.unwrap().expect("released");
    let Claim::Claimed(c) = a.claim_in_memory(&event("held", m.offset), "t").await.unwrap() else { panic!() };
    a.finish(c, State::Done, "http 200".into()).await.unwrap();
    drop(running);
    a.after_held_run(&r).await.unwrap();
    (sink.records("t", 0), dir)
}

/// A read from a checkpoint meets the writes of a record again, from its first: as
/// after a crash that lost the checkpoint's last moves. None of them moves the record
/// back, not even between batches, and none is reported: the write the store holds
/// comes later in the same read.
#[tokio::test]
async fn records_read_again_from_an_earlier_offset_change_nothing_and_are_not_reported() {
    let (records, _a) = history().await;
    let dir = tempfile::tempdir().unwrap();
    let b = Store::open(dir.path(), &opts()).unwrap();
    b.apply_changelog("t", &records).unwrap();
    let before = contents(&b);
    let held = b.get("held").unwrap().unwrap();
    assert_eq!((held.state, held.version), (State::Done, 2));
    assert!(b.message_of(&held).unwrap().is_none() && b.held_keys() == 0 && b.released_chains().is_empty());

    // The same record twice: applied again, as the same write.
    let last = records.last().unwrap().clone();
    let (applied, stale) = rejected_as_stale(|| b.apply_changelog("t", &[last.clone(), last]).unwrap());
    assert_eq!((applied, stale, contents(&b)), (2, 0, before.clone()));

    // Everything again, a record a batch.
    let (_, stale) = rejected_as_stale(|| {
        let mut restoring = Restoring::looking_up();
        for (i, batch) in records.chunks(1).enumerate() {
            b.apply_restoring("t", batch, &mut restoring).unwrap();
            let held = b.get("held").unwrap().unwrap();
            assert_eq!(held.state, State::Done, "after record {i}: never held again");
            assert!(b.message_of(&held).unwrap().is_none(), "after record {i}: no copy");
            assert_eq!((b.held_keys(), b.chains.member_keys().len()), (0, 0), "after record {i}: no chain");
            assert_eq!(b.get("durable").unwrap().unwrap().state, State::Done, "after record {i}");
        }
    });
    assert_eq!(stale, 0, "history, not records written again");
    assert_eq!(contents(&b), before);
}

/// Releases without versions write none: their values apply as before (the last
/// word wins) over no record and over one of theirs.
#[test]
fn values_without_a_version_apply_over_no_record_and_over_one_without_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let (applied, stale) = rejected_as_stale(|| {
        let mut n = store.apply_changelog("t", &[rec(0, X, State::Dead, 20, None)]).unwrap();
        assert_eq!(store.get(X).unwrap().unwrap().state, State::Dead);
        // Written earlier by its writer's clock, and later in the topic: the topic's order decides.
        n += store.apply_changelog("t", &[rec(1, X, State::Done, 30, None)]).unwrap();
        n
    });
    let r = store.get(X).unwrap().unwrap();
    assert_eq!((r.state, r.version, applied, stale), (State::Done, 0, 2, 0));
}

/// A release without versions, in the same group during a rolling upgrade, writes
/// over records this release wrote, always after them: its value applies. One it
/// wrote before, written to the topic again, is older than the held record by more
/// than the clock skew allowed: refused.
#[test]
fn a_value_without_a_version_over_a_versioned_record_applies_only_if_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let skew = StoreOptions { clock_skew: Duration::from_secs(300), ..opts() };
    let store = Store::open(dir.path(), &skew).unwrap();
    store.apply_changelog("t", &[versioned(0, X, State::Dead, 1_000, None, 2)]).unwrap();
    let (_, stale) = rejected_as_stale(|| {
        store.apply_changelog("t", &[rec(1, X, State::Held, 1_400, None)]).unwrap();
        assert_eq!(store.get(X).unwrap().unwrap().state, State::Dead, "written 400 s before: refused");
        store.apply_changelog("t", &[rec(2, X, State::Done, 1_200, None)]).unwrap();
        assert_eq!(store.get(X).unwrap().unwrap().state, State::Done, "within the 300 s skew: applied");
    });
    assert_eq!(stale, 1);
    let mut r = store.get(X).unwrap().unwrap();
    assert_eq!(r.version, 0, "it keeps what it carries");
    r.next_version();
    assert_eq!(r.version, 1, "and the next write here starts again from it");
}

/// A new owner restores a partition where a dead record was written again after the
/// event was retried to done, and the done record was then sent again (a duplicate
/// sends the final record it finds): the replay is counted all the same, since a new
/// store's records all come from the read itself.
#[test]
fn a_record_written_again_is_counted_by_a_new_owner_even_when_the_newer_one_is_sent_again_after_it() {
    let records = [
        versioned(0, X, State::Dead, 50, None, 1),
        versioned(1, X, State::Claimed, 40, None, 2),
        versioned(2, X, State::Done, 39, None, 3),
        versioned(3, X, State::Dead, 50, None, 1),
        versioned(4, X, State::Done, 39, None, 3),
    ];
    for size in [records.len(), 1] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &opts()).unwrap();
        let (_, stale) = rejected_as_stale(|| {
            read(&store, &mut store.start_restore("t", ALL), &records, size);
        });
        let r = store.get(X).unwrap().unwrap();
        assert_eq!((r.state, r.version, stale), (State::Done, 3, 1), "batches of {size}");
    }
}
