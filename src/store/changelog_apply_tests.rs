use std::time::Duration;

use super::*;
use crate::event::{OutboxEvent, Payload, Position};
use crate::store::tests::event;
use crate::store::{Claim, StoreOptions};

fn opts() -> StoreOptions {
    StoreOptions::for_tests(Some(Duration::from_secs(3600)))
}

/// A changelog record of event `id` of topic `t`, last written `ago_s` seconds ago.
fn rec(offset: i64, id: &str, state: State, ago_s: i64, scope: Option<&str>) -> ChangelogRecord {
    let at = now_us() - ago_s * 1_000_000;
    let position = Position { topic: "t".into(), partition: 0, offset };
    let mut r = Record::first_seen(id, state, 1, &position, at);
    r.scope = Some(scope.unwrap_or("t").to_owned());
    r.event_type = Some("OrderCreated".into());
    r.claimed_at_us = Some(at);
    if state.is_final() {
        r.done_at_us = Some(at);
        r.outcome = Some(format!("http 200 at {offset}"));
    }
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
            0 => v.push(rec(o, &id, State::Done, 10, None)),
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

fn contents(store: &Store) -> (Vec<Record>, [(State, u64); State::ALL.len()]) {
    (store.list(None, usize::MAX).unwrap(), store.counts())
}

#[test]
fn a_restore_into_a_new_store_gives_what_applying_record_by_record_gives() {
    let records = changelog();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (Store::open(a_dir.path(), &opts()).unwrap(), Store::open(b_dir.path(), &opts()).unwrap());
    let mut restoring = a.start_restore("t");
    assert!(restoring.is_fresh(), "a new store holds no record of the topic");
    let mut applied = 0;
    // Batch boundaries fall between a claim and its outcome too.
    for batch in records.chunks(7) {
        applied += a.apply_restoring("t", batch, &mut restoring).unwrap();
    }
    assert!(restoring.is_fresh(), "nobody else wrote: the fast path held to the end");
    assert_eq!(applied, b.apply_one_by_one("t", &records).unwrap());
    assert_eq!(contents(&a), contents(&b));
    let (list, counts) = contents(&a);
    assert_eq!(list.len(), 50, "every event once, without the expired ones");
    assert_eq!(counts.iter().map(|(_, n)| *n).sum::<u64>(), 50);
    assert!(list.iter().all(|r| r.state != State::Claimed), "no outcome was turned back into a claim");
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
    a.apply_one_by_one("t", &local).unwrap();
    b.apply_one_by_one("t", &local).unwrap();
    let mut restoring = a.start_restore("t");
    assert!(!restoring.is_fresh());
    let mut applied = 0;
    for batch in records.chunks(5) {
        applied += a.apply_restoring("t", batch, &mut restoring).unwrap();
    }
    assert_eq!(applied, b.apply_one_by_one("t", &records).unwrap());
    assert_eq!(contents(&a), contents(&b));
}

#[tokio::test]
async fn a_record_written_by_the_service_during_a_fresh_restore_ends_the_fast_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    let id = "0190a3c4-5e6f-7a8b-9c0d-00000000ffff";
    let mut restoring = store.start_restore("t");
    store
        .apply_restoring("t", &[rec(0, "0190a3c4-5e6f-7a8b-9c0d-000000000001", State::Done, 1, None)], &mut restoring)
        .unwrap();
    assert!(restoring.is_fresh());
    // Another partition of the topic handles the same event meanwhile.
    let event = OutboxEvent {
        id: id.into(),
        aggregate_id: None,
        event_type: None,
        payload: Payload::Null,
        position: Position { topic: "t".into(), partition: 3, offset: 9 },
        timestamp_ms: None,
        traceparent: None,
    };
    let Claim::Claimed(c) = store.claim(&event, "t").await.unwrap() else { panic!("not claimed") };
    store.finish(c, State::Done, "http 200".into()).await.unwrap();
    // The changelog still says the event was claimed elsewhere.
    assert_eq!(store.apply_restoring("t", &[rec(1, id, State::Claimed, 1, None)], &mut restoring).unwrap(), 0);
    assert!(!restoring.is_fresh(), "the store's count moved by another writer");
    assert_eq!(store.get(id).unwrap().unwrap().state, State::Done, "the outcome stays");
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
    let mut restoring = store.start_restore("t");
    assert_eq!(store.apply_restoring("t", &records, &mut restoring).unwrap(), 1);
    let kept: Vec<String> = store.list(None, 10).unwrap().into_iter().map(|r| r.event_id).collect();
    assert_eq!(
        kept,
        vec!["0190a3c4-5e6f-7a8b-9c0d-00000000000a".to_owned()],
        "1 min past the retention is within the skew; 10 min is not"
    );

    let dir = tempfile::tempdir().unwrap();
    let strict = StoreOptions { clock_skew: Duration::ZERO, ..opts() };
    let store = Store::open(dir.path(), &strict).unwrap();
    let mut restoring = store.start_restore("t");
    assert_eq!(store.apply_restoring("t", &records, &mut restoring).unwrap(), 0, "no skew allowed: both expired");
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
        let mut restoring = store.start_restore("t");
        for batch in restored.chunks(64) {
            store.apply_restoring("t", batch, &mut restoring).unwrap();
        }
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
