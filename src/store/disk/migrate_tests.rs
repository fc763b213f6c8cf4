//! Stores written in the earlier format, built here with that format's encoding.

use std::sync::Arc;
use std::time::Duration;

use crate::event::Position;
use crate::store::{now_us, Claim, Record, State, Store, StoreOptions};

fn opts() -> StoreOptions {
    StoreOptions::for_tests(None)
}

/// A record as the earlier format kept it: postcard, under `id ++ 0x00 ++ scope` (or the bare id).
fn old_record(id: &str, scope: Option<&str>, state: State, age: Duration) -> (Vec<u8>, Record) {
    let at = now_us() - age.as_micros() as i64;
    let position = Position { topic: "orders".into(), partition: 2, offset: 40 };
    let mut r = Record::first_seen(id, state, 1, &position, at - 1_000);
    r.scope = scope.map(Arc::from); // not in the serde form: the key says it
    r.key = Some("order-1".into());
    r.event_type = Some("OrderCreated".into());
    r.claimed_at_us = Some(at - 1_000);
    if state.is_final() {
        r.done_at_us = Some(at);
        r.updated_at_us = at;
    }
    match state {
        State::Done => r.outcome = Some("http 200".into()),
        State::Dead | State::Parked => r.reason = Some(format!("{state} for a reason")),
        State::Claimed | State::Held => {}
    }
    r.duplicates = 2;
    r.expires_at_us = Some(at + 3_600_000_000);
    let key = match scope {
        Some(s) => [id.as_bytes(), &[0], s.as_bytes()].concat(),
        None => id.as_bytes().to_vec(),
    };
    (key, r)
}

/// Writes records into a store directory as the earlier format did.
fn write_old_store(dir: &std::path::Path, records: &[(Vec<u8>, Record)]) {
    let db = crate::store::disk::db::open_db(dir, crate::store::options::SMALL_CACHE_BYTES).unwrap();
    let (events, expiry, messages, meta) = (
        db.open_tree("events").unwrap(),
        db.open_tree("expiry").unwrap(),
        db.open_tree("messages").unwrap(),
        db.open_tree("meta").unwrap(),
    );
    let mut counts = [0i64; 4];
    for (key, r) in records {
        events.insert(key, postcard::to_allocvec(r).unwrap()).unwrap();
        let at = r.expires_at_us.unwrap() as u64;
        expiry.insert([&at.to_be_bytes()[..], key].concat(), &[]).unwrap();
        if matches!(r.state, State::Dead | State::Parked) {
            let message = crate::event::RawMessage {
                topic: r.topic.to_string(),
                partition: r.partition,
                offset: r.offset,
                key: None,
                value: Some(format!("payload of {}", r.event_id).into_bytes()),
                headers: vec![],
                timestamp_ms: None,
            };
            messages.insert(key, super::messages::encode_message(&message)).unwrap();
        }
        counts[r.state as usize] += 1;
    }
    let counts: Vec<u8> = counts.iter().flat_map(|n| n.to_be_bytes()).collect();
    meta.insert(b"records_per_state", counts).unwrap();
    meta.insert(b"duplicates_suppressed", &7u64.to_be_bytes()[..]).unwrap();
    meta.insert(b"scoped_keys_since", &(now_us() - 1).to_be_bytes()[..]).unwrap();
    db.flush().unwrap();
}

fn sample() -> Vec<(Vec<u8>, Record)> {
    let hour = Duration::from_secs(3600);
    vec![
        old_record("0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d", Some("orders"), State::Done, hour),
        old_record("42", Some("db.public.orders"), State::Done, 30 * hour),
        old_record("42", Some("db.public.invoices"), State::Dead, 2 * hour),
        old_record("p-1", Some(""), State::Parked, Duration::ZERO),
        old_record("c-1", Some("orders"), State::Claimed, Duration::from_secs(60)),
        old_record("legacy-1", None, State::Done, 3 * hour),
    ]
}

#[tokio::test]
async fn a_store_of_the_earlier_format_is_converted_on_open_with_every_record_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let old = sample();
    write_old_store(dir.path(), &old);
    let store = Store::open(dir.path(), &opts()).unwrap();
    for (_, was) in &old {
        let mut now = store
            .list(None, 100)
            .unwrap()
            .into_iter()
            .find(|r| r.event_id == was.event_id && r.scope == was.scope)
            .unwrap();
        assert!(now.expires_at_us.unwrap() >= was.updated_at_us + opts().retention.as_micros() as i64);
        now.expires_at_us = was.expires_at_us;
        assert_eq!(&now, was, "every field comes back");
    }
    assert_eq!(store.counts().map(|(_, n)| n), [1, 3, 1, 1, 0]);
    assert_eq!(store.stats().unwrap().duplicates_suppressed, 7);
    assert_eq!(store.message("p-1").unwrap().unwrap().value.as_deref(), Some(&b"payload of p-1"[..]));
    let names: Vec<_> = store.db.tree_names();
    for old_tree in ["events", "expiry", "messages"] {
        assert!(!names.iter().any(|n| n.as_ref() == old_tree.as_bytes()), "{old_tree} is dropped");
    }
    // A record from before scopes still suppresses its duplicates, in any scope.
    let e = crate::event::OutboxEvent {
        id: "legacy-1".into(),
        aggregate_id: None,
        event_type: None,
        payload: crate::event::Payload::Null,
        position: Position { topic: "orders".into(), partition: 2, offset: 99 },
        timestamp_ms: None,
        traceparent: None,
        route_key: None,
        headers: Vec::new(),
    };
    assert_eq!(store.claim(&e, "orders").await.unwrap(), Claim::Finished { state: State::Done, same_offset: false });
    let e = crate::event::OutboxEvent { id: "42".into(), ..e };
    assert!(matches!(store.claim(&e, "db.public.orders").await.unwrap(), Claim::Finished { .. }));
    drop(store);
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert_eq!(store.counts().map(|(_, n)| n), [1, 3, 1, 1, 0], "nothing converted twice");
}

/// A crash after a batch was written in its new place, before it left the old tree.
#[tokio::test]
async fn a_conversion_cut_short_starts_over_and_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let old = sample();
    write_old_store(dir.path(), &old);
    {
        // The first half converted (written and flushed), the old tree still whole.
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        let meta = db.open_tree("meta").unwrap();
        let names = super::Names::open(db.open_tree(crate::store::disk::db::NAMES_TREE).unwrap()).unwrap();
        let slices = super::Slices::open(&db, &meta, opts().retention).unwrap();
        let messages = super::messages::MessageCopies::open(&db, &meta).unwrap();
        for (_, r) in &old[..3] {
            let slice = slices.slice_for(r.updated_at_us).unwrap();
            let scope = names.id(r.scope.as_deref().unwrap()).unwrap();
            let key = super::keys::record_key(&super::keys::event_key(&r.event_id), scope);
            slice.insert(&key, super::format::encode(r, &names, slice.start).unwrap().as_slice()).unwrap();
            slice.moved(None, Some(r.state));
        }
        slices.persist().unwrap();
        drop(messages);
        db.flush().unwrap();
    }
    let store = Store::open(dir.path(), &opts()).unwrap();
    assert_eq!(store.counts().map(|(_, n)| n), [1, 3, 1, 1, 0]);
    assert_eq!(store.list(None, 100).unwrap().len(), old.len());
    assert_eq!(store.stats().unwrap().done, 3);
    assert!(store.message("42").unwrap().is_some() || store.message("p-1").unwrap().is_some());
}
