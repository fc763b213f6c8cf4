//! The index of dead and parked records: what it holds after every kind of write,
//! after a reopen and a crash between its two writes, and its first build for a
//! store written before it; pages by state from it, and read budgets for the rest.

use std::time::Duration;

use super::*;
use crate::store::tests::event;

fn opts() -> StoreOptions {
    StoreOptions::for_tests(Some(Duration::from_secs(3600)))
}

async fn finished(store: &Store, id: &str, offset: i64, state: State, text: &str) {
    let c = match store.claim(&event(id, offset), "t").await.unwrap() {
        Claim::Claimed(c) => c,
        other => panic!("{id} not claimed: {other:?}"),
    };
    store.finish(c, state, text.to_owned()).await.unwrap();
}

fn counted(store: &Store) -> Vec<(State, String, u64)> {
    let groups = store.problem_groups().expect("the index is ready");
    let mut out: Vec<_> = groups.into_iter().map(|(k, c)| (k.state, k.reason, c.count)).collect();
    out.sort();
    out
}

#[tokio::test]
async fn dead_records_are_counted_by_reason_group_and_leave_when_resolved_or_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    finished(&store, "a", 1, State::Dead, "gave up after 2 attempts in 23ms: http 503").await;
    finished(&store, "b", 2, State::Dead, "gave up after 5 attempts in 1.5s: http 503").await;
    finished(&store, "c", 3, State::Dead, "http 400 bad order").await;
    finished(&store, "d", 4, State::Done, "http 200").await;
    let retry_group = "gave up after … attempts in …: http 503".to_owned();
    assert_eq!(counted(&store), [(State::Dead, retry_group.clone(), 2), (State::Dead, "http 400 bad order".into(), 1)]);
    assert_eq!(store.problem_ids(State::Dead, "t", &retry_group).unwrap().unwrap(), ["a", "b"]);

    store.resolve_done("a", "by hand".into()).await.unwrap();
    store.forget("c").await.unwrap();
    assert_eq!(counted(&store), [(State::Dead, retry_group.clone(), 1)]);
    assert_eq!(store.problems.tree.len(), 1, "the index holds the dead record left, nothing else");

    // What the index holds survives a reopen.
    drop(store);
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert_eq!(counted(&store), [(State::Dead, retry_group, 1)]);
}

#[tokio::test]
async fn an_index_entry_whose_record_left_in_a_crash_is_dropped_at_the_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts()).unwrap();
        finished(&store, "a", 1, State::Dead, "http 400").await;
        finished(&store, "b", 2, State::Done, "http 200").await;
        // A crash between the two writes of b's move into the index: its entry, its record done.
        let b_key = store.find_any("b").unwrap().unwrap().key;
        store.problems.tree.insert(b_key, &[]).unwrap();
        store.durable().await.unwrap();
    }
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert_eq!(store.problems.tree.len(), 1);
    assert_eq!(counted(&store), [(State::Dead, "http 400".into(), 1)]);
}

#[tokio::test]
async fn a_store_of_a_release_before_the_index_is_indexed_once_then_has_it_all() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &opts()).unwrap();
        for i in 0..30 {
            let state = if i % 3 == 0 { State::Dead } else { State::Done };
            finished(&store, &format!("e{i:02}"), i, state, "http 409").await;
        }
        store.durable().await.unwrap();
    }
    {
        // What an earlier release left: no index tree, no mark.
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        db.drop_tree(problem_index::TREE).unwrap();
        db.open_tree(crate::store::disk::db::META_TREE).unwrap().remove(problem_index::BUILT_KEY).unwrap();
        db.flush().unwrap();
    }
    let store = std::sync::Arc::new(Store::open(dir.path(), &opts()).unwrap());
    assert!(store.problem_groups().is_none(), "not ready before the build");
    // Pages by state read records meanwhile.
    let page = store.list_page(Some(State::Dead), None, None, 100, None).unwrap();
    assert_eq!(page.records.len(), 10);
    store.index_problems();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.problem_groups().is_none() {
        assert!(std::time::Instant::now() < deadline, "the index was never built");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counted(&store), [(State::Dead, "http 409".into(), 10)]);
    assert_eq!(store.problems.len(), 10);
    drop(store);
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert!(store.problem_groups().is_some(), "built once: ready at the next open");
}

#[tokio::test]
async fn pages_of_dead_records_read_the_index_and_other_filters_stop_at_their_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    for i in 0..200 {
        let state = if i % 50 == 7 { State::Dead } else { State::Done };
        finished(&store, &format!("e{i:03}"), i, state, "x").await;
    }
    // Four dead among two hundred: found with a budget of two (index entries, not records).
    let dead = store.list_page(Some(State::Dead), None, None, 100, Some(2)).unwrap();
    assert_eq!(dead.records.iter().map(|r| &*r.event_id).collect::<Vec<_>>(), ["e007", "e057"]);
    let rest = store.list_page(Some(State::Dead), None, dead.resume.as_deref(), 100, Some(2)).unwrap();
    assert_eq!(rest.records.iter().map(|r| &*r.event_id).collect::<Vec<_>>(), ["e107", "e157"]);

    // A filter the index does not serve stops after examining its budget and says where to go on.
    let first = store.list_page(None, Some("other"), None, 100, Some(50)).unwrap();
    assert!(first.records.is_empty());
    assert_eq!(first.resume.as_deref(), Some(page_cursor(&store.find_any("e049").unwrap().unwrap().record).as_str()));
    let mut examined_pages = 1;
    let mut resume = first.resume;
    while let Some(after) = resume {
        let page = store.list_page(None, Some("other"), Some(&after), 100, Some(50)).unwrap();
        assert!(page.records.is_empty());
        resume = page.resume;
        examined_pages += 1;
    }
    assert_eq!(examined_pages, 4, "two hundred records, fifty at a time, the last page ends the scan");
    // Without a budget, as before: everything read at once.
    assert!(store.list_page(None, Some("other"), None, 100, None).unwrap().resume.is_none());
}

#[tokio::test]
async fn records_that_expire_leave_the_index_with_their_slice() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Duration::from_secs(1);
    let store = Store::open(dir.path(), &StoreOptions::for_tests(Some(retention))).unwrap();
    finished(&store, "old", 1, State::Dead, "http 400").await;
    assert_eq!(counted(&store), [(State::Dead, "http 400".into(), 1)]);
    // Past the retention and a slice width: the slice, and the record in it, go whole.
    store.gc(now_us() + 3_000_000).await.unwrap();
    assert!(store.get("old").unwrap().is_none());
    assert!(counted(&store).is_empty(), "{:?}", counted(&store));
    assert_eq!(store.problems.tree.len(), 0);
}
