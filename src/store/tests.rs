use super::*;
use crate::event::{OutboxEvent, Payload, Position};

fn opts(retention: Duration) -> StoreOptions {
    StoreOptions {
        retention,
        commit_interval: Duration::from_millis(1),
        fsync: true,
        role: "test",
        cache_bytes: SMALL_CACHE_BYTES,
    }
}

async fn claimed(store: &Store, id: &str, offset: i64) -> Claimed {
    match store.claim(&event(id, offset)).await.unwrap() {
        Claim::Claimed(c) => c,
        other => panic!("{id} not claimed: {other:?}"),
    }
}

fn event(id: &str, offset: i64) -> OutboxEvent {
    OutboxEvent {
        id: id.to_owned(),
        aggregate_id: Some("order-1".into()),
        event_type: Some("OrderCreated".into()),
        payload: Payload::Null,
        position: Position { topic: "t".into(), partition: 0, offset },
        timestamp_ms: None,
        traceparent: None,
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
        store.claim(&event("e1", 99)).await.unwrap(),
        Claim::Finished { state: State::Done, same_offset: false }
    );
    let r = store.get("e1").unwrap().unwrap();
    assert_eq!((r.state, r.attempts, r.duplicates, r.offset), (State::Done, 1, 1, 1));
    assert_eq!(r.outcome.as_deref(), Some("http 200"));
    assert_eq!(store.stats().unwrap().duplicates_suppressed, 1);
}

#[tokio::test]
async fn claimed_record_survives_reopen_and_is_a_reexecution() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
        store.claim(&event("e1", 1)).await.unwrap();
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(3600))).unwrap();
    assert_eq!(store.get("e1").unwrap().unwrap().state, State::Claimed);
    let c = claimed(&store, "e1", 5).await;
    assert_eq!((c.attempt(), c.reexecution()), (2, true));
}

#[tokio::test]
async fn gc_removes_only_expired_final_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let a = claimed(&store, "a", 0).await;
    let b = claimed(&store, "b", 1).await;
    claimed(&store, "c", 2).await;
    store.finish(a, State::Done, "ok".into()).await.unwrap();
    store.finish(b, State::Dead, "boom".into()).await.unwrap();
    assert_eq!(store.gc(now_us()).await.unwrap(), 0, "nothing has expired yet");
    let later = now_us() + 61_000_000;
    assert_eq!(store.gc(later).await.unwrap(), 2);
    assert!(store.get("a").unwrap().is_none());
    assert!(store.get("b").unwrap().is_none());
    assert_eq!(store.get("c").unwrap().unwrap().state, State::Claimed, "claimed records never expire");
    assert_eq!(store.expiry.len(), 0);
}

#[tokio::test]
async fn forgotten_event_can_be_claimed_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let a = claimed(&store, "a", 0).await;
    store.finish(a, State::Done, "ok".into()).await.unwrap();
    let removed = store.forget("a").await.unwrap();
    assert_eq!(removed.state, State::Done);
    assert_eq!(store.expiry.len(), 0);
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
    let ids = |rs: Vec<Record>| rs.into_iter().map(|r| r.event_id).collect::<Vec<_>>();
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
        assert_eq!(counts(&store), [3, 0, 0, 0]);
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
        store.record_undecodable("u", &msg, "bad".into(), None).await.unwrap();
        assert_eq!(
            store.claim(&event("a", 9)).await.unwrap(),
            Claim::Finished { state: State::Done, same_offset: false }
        );
        assert_eq!(counts(&store), [1, 1, 1, 1]);
        store.resolve_done("b", "checked".into()).await.unwrap();
        store.reopen("u").await.unwrap();
        assert_eq!(counts(&store), [1, 2, 0, 0]);
        assert_eq!(store.len(), 3);
    }
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    assert_eq!(counts(&store), [1, 2, 0, 0], "kept across a reopen");
    assert_eq!(store.gc(now_us() + 61_000_000).await.unwrap(), 2);
    store.forget("c").await.unwrap();
    assert_eq!(counts(&store), [0, 0, 0, 0]);
}

#[tokio::test]
async fn stats_on_a_stopped_store_corrects_drifted_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    let a = claimed(&store, "a", 0).await;
    store.finish(a, State::Done, "ok".into()).await.unwrap();
    store.counts.set([5, 0, 7, 0]); // as a crash between a write and its count could leave them
    let s = store.stats().unwrap();
    assert_eq!((s.claimed, s.done, s.dead), (0, 1, 0));
    assert_eq!(store.counts().map(|(_, n)| n), [0, 1, 0, 0]);
    drop(store);
    let store = Store::open(dir.path(), &opts(Duration::from_secs(60))).unwrap();
    assert_eq!(store.counts().map(|(_, n)| n), [0, 1, 0, 0], "the correction is stored");
}
