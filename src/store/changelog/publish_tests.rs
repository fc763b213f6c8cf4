use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::store::tests::event_at as event;
use crate::store::changelog::{entry_key, entry_value, Acked, Entry, SendError, SendFuture, Sink};
use crate::store::{Claim, State, StoreOptions};

fn opts() -> StoreOptions {
    StoreOptions::for_tests(Some(Duration::from_secs(3600)))
}

async fn handle(store: &Store, id: &str, topic: &str, partition: i32, offset: i64) {
    match store.handling().claim(&event(id, topic, partition, offset), topic).await.unwrap() {
        Claim::Claimed(c) => store.handling().finish(c, State::Done, "http 200".into()).await.unwrap(),
        other => panic!("{id} not claimed: {other:?}"),
    }
}

/// A broker that acknowledges entries, refusing every one after the first `refuse_after`.
struct Broker {
    entries: Mutex<Vec<Entry>>,
    refuse_after: usize,
    sent: AtomicUsize,
}

impl Broker {
    fn new(refuse_after: usize) -> Arc<Broker> {
        Arc::new(Broker { entries: Mutex::new(Vec::new()), refuse_after, sent: AtomicUsize::new(0) })
    }

    fn ids(&self) -> Vec<String> {
        let entries = self.entries.lock().unwrap();
        entries.iter().map(|e| decode(e).event_id.to_string()).collect()
    }
}

fn decode(e: &Entry) -> Record {
    crate::store::changelog::decode_entry(&e.topic, &e.key, e.value.as_deref().expect("a value")).unwrap()
}

impl Sink for Broker {
    fn send(&self, entry: Entry) -> SendFuture {
        let n = self.sent.fetch_add(1, Ordering::SeqCst);
        let refused = n >= self.refuse_after;
        let acked =
            Acked { changelog_topic: format!("{}.cl", entry.topic).into(), partition: entry.partition, offset: n as i64 };
        if !refused {
            self.entries.lock().unwrap().push(entry);
        }
        Box::pin(async move {
            if refused {
                Err(SendError::Refused {
                    changelog_topic: acked.changelog_topic.to_string(),
                    partition: acked.partition,
                    error: "broker down".into(),
                })
            } else {
                Ok(acked)
            }
        })
    }
}

fn everything(_: &str, _: i32) -> bool {
    true
}

#[tokio::test]
async fn records_written_without_the_changelog_are_copied_to_their_partitions_as_the_write_path_would() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    for i in 0..30 {
        handle(&store, &format!("ev-{i}"), if i % 3 == 0 { "gone" } else { "orders" }, i % 4, i64::from(i)).await;
    }
    assert!(!store.changelog_complete(), "written without a changelog");
    let broker = Broker::new(usize::MAX);
    store.attach_changelog(broker.clone());
    let mut calls = 0;
    let wanted = |topic: &str, _: i32| topic == "orders";
    let done = store.publish(7, &wanted, &mut |_| calls += 1).await.unwrap();
    assert_eq!((done.sent, done.skipped, done.total, done.resumed), (20, 10, 30, false));
    assert_eq!(calls, 5, "one progress call per batch of 7");
    assert!(store.changelog_complete());
    for e in broker.entries.lock().unwrap().iter() {
        let r = store.reads().get(&decode(e).event_id).unwrap().expect("a local record");
        assert_eq!((&*e.topic, e.partition), (&*r.topic, r.partition));
        assert_eq!(e.key, entry_key(&r));
        assert_eq!(e.value.as_deref(), Some(entry_value(&r).unwrap().as_slice()));
    }
    store.close().await.unwrap();
    drop(store);
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert!(store.changelog_complete(), "the mark is durable");
}

#[tokio::test]
async fn an_empty_store_is_complete_until_something_is_written_without_the_changelog() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert!(store.mark_complete_if_empty().await.unwrap());
    store.attach_changelog(Broker::new(usize::MAX));
    handle(&store, "with", "orders", 0, 0).await;
    assert!(store.changelog_complete(), "a write through the changelog keeps it");
    assert!(!store.mark_complete_if_empty().await.unwrap(), "not empty any more");
    store.close().await.unwrap();
    drop(store);

    let store = Store::open(dir.path(), &opts()).unwrap();
    assert!(store.changelog_complete());
    handle(&store, "without", "orders", 0, 1).await;
    assert!(!store.changelog_complete());
    store.close().await.unwrap();
    drop(store);
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert!(!store.changelog_complete(), "the removal is durable with the write");
}

#[tokio::test]
async fn a_repair_without_the_changelog_clears_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    store.attach_changelog(Broker::new(usize::MAX));
    handle(&store, "a", "orders", 0, 0).await;
    store.publish(10, &everything, &mut |_| {}).await.unwrap();
    store.close().await.unwrap();
    drop(store);
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert!(store.changelog_complete());
    store.repairs().forget("a").await.unwrap();
    assert!(!store.changelog_complete(), "a forget the changelog never saw");
}

#[tokio::test]
async fn a_cut_copy_resumes_after_the_last_acknowledged_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &opts()).unwrap();
    for i in 0..25 {
        handle(&store, &format!("ev-{i:02}"), "orders", 0, i64::from(i)).await;
    }
    // The brokers stop answering in the third batch of 5.
    let first = Broker::new(12);
    store.attach_changelog(first.clone());
    let cut = store.publish(5, &everything, &mut |_| {}).await;
    assert!(matches!(cut, Err(StoreError::Changelog(_))), "{cut:?}");
    assert!(!store.changelog_complete());
    store.close().await.unwrap();
    drop(store);

    let store = Store::open(dir.path(), &opts()).unwrap();
    let second = Broker::new(usize::MAX);
    store.attach_changelog(second.clone());
    let done = store.publish(5, &everything, &mut |_| {}).await.unwrap();
    assert!(done.resumed);
    assert_eq!(done.sent, 15, "the two acknowledged batches are not sent again");
    let mut all: Vec<String> = first.ids().into_iter().take(10).chain(second.ids()).collect();
    all.sort();
    let expected: Vec<String> = (0..25).map(|i| format!("ev-{i:02}")).collect();
    assert_eq!(all, expected, "every record once, across both runs");
    assert!(store.changelog_complete());
}
