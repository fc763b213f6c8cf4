use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::store::audit_log::{event_prefix, AuditAction, AuditEvent, BY_EVENT_TREE};
use crate::config::Config;
use crate::store::changelog::mac::Keys;
use crate::store::changelog::tests::Recorded;
use crate::store::changelog::{ChangelogRecord, Restoring};
use crate::store::{now_us, StoreOptions};

const HOUR_US: i64 = 3_600_000_000;

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, &StoreOptions::for_tests(Some(Duration::from_secs(3600)))).unwrap()
}

fn entry(at_us: i64, who: &str, events: &[(&str, Option<(&str, i32)>)]) -> AuditEntry {
    AuditEntry {
        at_us,
        who: who.to_owned(),
        action: AuditAction::Forget,
        events: events
            .iter()
            .map(|(id, source)| AuditEvent { id: (*id).to_owned(), source: source.map(|(t, p)| (t.to_owned(), p)) })
            .collect(),
        reason: Some("because".to_owned()),
        outcome: "done".to_owned(),
    }
}

fn whos(entries: &[AuditEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.who.as_str()).collect()
}

#[tokio::test]
async fn entries_list_newest_first_and_page_on_from_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = now_us();
    // Recorded out of time order, and two in one microsecond: keys keep them apart and in order.
    for (at, who) in [(now - 30, "c"), (now - 50, "a"), (now - 10, "e"), (now - 40, "b"), (now - 10, "e")] {
        store.audit().record(entry(at, who, &[("x", None)])).await.unwrap();
    }
    let (first, next) = store.audit().list(None, 2).unwrap();
    assert_eq!(whos(&first), ["e", "e"]);
    let (second, next) = store.audit().list(next.as_deref(), 2).unwrap();
    assert_eq!(whos(&second), ["c", "b"]);
    let (third, next) = store.audit().list(next.as_deref(), 2).unwrap();
    assert_eq!((whos(&third), next), (vec!["a"], None));
    assert_eq!(whos(&store.audit().list(None, 10).unwrap().0), ["e", "e", "c", "b", "a"]);
    assert!(matches!(store.audit().list(Some("not a cursor"), 2), Err(StoreError::BadCursor(_))));
}

#[tokio::test]
async fn entries_of_one_event_are_found_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_us();
    {
        let store = open(dir.path());
        store.audit().record(entry(now - 2, "a", &[("e1", None)])).await.unwrap();
        store.audit().record(entry(now - 1, "b", &[("e2", None)])).await.unwrap();
        store.audit().record(entry(now, "c", &[("e1", None)])).await.unwrap();
        store.close().await.unwrap();
    }
    let store = open(dir.path());
    assert_eq!(whos(&store.audit().for_event("e1").unwrap()), ["c", "a"]);
    assert!(store.audit().for_event("e3").unwrap().is_empty());
}

#[tokio::test]
async fn gc_removes_entries_older_than_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = now_us();
    store.audit().record(entry(now - 2 * HOUR_US, "old", &[])).await.unwrap();
    store.audit().record(entry(now - HOUR_US / 2, "recent", &[])).await.unwrap();
    store.repairs().gc(now).await.unwrap();
    assert_eq!(whos(&store.audit().list(None, 10).unwrap().0), ["recent"]);
}

#[tokio::test]
async fn an_entry_goes_to_the_changelog_partition_of_its_events_split_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    let now = now_us();
    let events = [("p0-a", Some(("t", 0))), ("p1-a", Some(("t", 1))), ("p0-b", Some(("t", 0))), ("gone", None)];
    store.audit().record(entry(now, "alice", &events)).await.unwrap();
    let (p0, p1) = (sink.records("t", 0), sink.records("t", 1));
    assert_eq!((p0.len(), p1.len()), (1, 1), "one entry per partition; the id without a record stays local");
    assert!(p0[0].key.starts_with(&[AUDIT_TAG]) && p0[0].key.len() == 1 + KEY_BYTES);
    let local = store.audit().list(None, 10).unwrap().0;
    let ids: Vec<Vec<&str>> = local.iter().map(|e| e.events.iter().map(|v| v.id.as_str()).collect()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, [vec!["gone"], vec!["p0-a", "p0-b"], vec!["p1-a"]], "{ids:?}");

    // The next owner of partition 0 restores its entry (once, however often it is read), and nothing of partition 1.
    let next = tempfile::tempdir().unwrap();
    let owner = open(next.path());
    assert_eq!(owner.apply_changelog("t", &p0).unwrap(), 1);
    owner.apply_changelog("t", &p0).unwrap();
    let restored = owner.audit().list(None, 10).unwrap().0;
    assert_eq!(restored.len(), 1);
    assert_eq!(restored[0], local.iter().find(|e| e.names("p0-a")).unwrap().clone());
    assert_eq!(restored[0].who, "alice");
}

#[tokio::test]
async fn an_entry_the_changelog_refuses_fails_the_call_and_stays_in_the_local_audit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.attach_changelog(Arc::new(Recorded::refusing()));
    let e = store.audit().record(entry(now_us(), "alice", &[("a", Some(("t", 0)))])).await.unwrap_err();
    assert!(matches!(e, StoreError::Changelog(_)), "{e:?}");
    assert_eq!(whos(&store.audit().list(None, 10).unwrap().0), ["alice"]);
}

#[tokio::test]
async fn a_restore_skips_expired_and_unreadable_entries_and_keys_of_unknown_kinds_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    store.audit().record(entry(now_us() - 2 * HOUR_US, "expired", &[("a", Some(("t", 0)))])).await.unwrap();
    store.audit().record(entry(now_us(), "kept", &[("a", Some(("t", 0)))])).await.unwrap();
    let mut records = sink.records("t", 0);
    let mut unreadable = records[1].clone();
    unreadable.key[16] ^= 1;
    unreadable.value = Some(b"\x09{}".to_vec());
    // A key of a kind no release knows yet (what an older release sees of an audit entry is the same).
    let unknown = ChangelogRecord { offset: 9, key: vec![0x7F, 1, 2], value: Some(b"\x01??".to_vec()), mac: None };
    records.extend([unreadable, unknown]);
    let next = tempfile::tempdir().unwrap();
    let owner = open(next.path());
    assert_eq!(owner.apply_changelog("t", &records).unwrap(), 1);
    assert_eq!(whos(&owner.audit().list(None, 10).unwrap().0), ["kept"]);
}

#[tokio::test]
async fn an_entry_whose_mac_does_not_check_is_not_applied() {
    const KEY: &str = "0123456789abcdef0123456789abcdef-audit";
    let text = "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[store]\npath=\"p\"\n[store.changelog]\nkey=\"${KEY}\"\n\
                [[handlers]]\ntopics=[\"t\"]\nkind=\"log\"\n";
    let config = Config::parse(text, &|_| Some(KEY.to_owned())).unwrap();
    let keys = Keys::new(config.store.changelog.as_ref().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    store.audit().record(entry(now_us(), "signed", &[("a", Some(("t", 0)))])).await.unwrap();
    store.audit().record(entry(now_us(), "forged", &[("b", Some(("t", 0)))])).await.unwrap();
    let mut records = sink.records("t", 0);
    for r in &mut records {
        r.mac = keys.sign("g.t.outboxd-dedup", 0, &r.key, r.value.as_deref()).map(|m| crate::store::changelog::MacHeader::from_slice(&m));
    }
    // The second entry's text changed after it was signed.
    let forged = String::from_utf8(records[1].value.clone().unwrap()).unwrap().replace("forged", "framed");
    records[1].value = Some(forged.into_bytes());

    let next = tempfile::tempdir().unwrap();
    let owner = open(next.path());
    let (authentic, rejected) = keys.authentic("g.t.outboxd-dedup", 0, records);
    assert_eq!(rejected.len(), 1);
    owner.restore().apply("t", authentic, &mut Restoring::looking_up()).unwrap();
    assert_eq!(whos(&owner.audit().list(None, 10).unwrap().0), ["signed"]);
}

#[tokio::test]
async fn the_entries_of_one_event_are_found_through_the_index_not_by_reading_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = now_us();
    for i in 0..200 {
        store.audit().record(entry(now - 1000 + i, "someone", &[("other", None)])).await.unwrap();
    }
    store.audit().record(entry(now, "me", &[("mine", None), ("other", None)])).await.unwrap();
    assert_eq!(whos(&store.audit().for_event("mine").unwrap()), ["me"]);
    // The index names one entry for `mine`: a lookup reads that entry, and an id that
    // is a prefix of another's finds nothing of it.
    assert_eq!(store.audit.by_event.scan_prefix(event_prefix("mine")).count(), 1);
    assert!(store.audit().for_event("min").unwrap().is_empty());
    assert_eq!(store.audit().for_event("other").unwrap().len(), 201);
}

#[tokio::test]
async fn expired_entries_leave_the_index_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = now_us();
    store.audit().record(entry(now - 2 * HOUR_US, "old", &[("e1", None)])).await.unwrap();
    store.audit().record(entry(now, "new", &[("e1", None)])).await.unwrap();
    store.expire_audit(now).unwrap();
    assert_eq!(whos(&store.audit().for_event("e1").unwrap()), ["new"]);
    assert_eq!(store.audit.by_event.len(), 1, "the expired entry's index entry went with it");
}

#[tokio::test]
async fn the_audit_of_a_store_written_before_the_index_is_indexed_at_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_us();
    {
        let store = open(dir.path());
        store.audit().record(entry(now - 1, "a", &[("e1", None)])).await.unwrap();
        store.audit().record(entry(now, "b", &[("e2", None)])).await.unwrap();
        store.close().await.unwrap();
    }
    {
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        db.drop_tree(BY_EVENT_TREE).unwrap();
        db.flush().unwrap();
    }
    let store = open(dir.path());
    assert_eq!(whos(&store.audit().for_event("e1").unwrap()), ["a"]);
    assert_eq!(whos(&store.audit().for_event("e2").unwrap()), ["b"]);
}
