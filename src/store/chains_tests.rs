//! The chain bookkeeping: which events are held behind which, in what order they
//! come out, what the changelog carries of a chain and how another store rebuilds it.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::event::{OutboxEvent, Payload, Position, RawMessage};
use crate::store::changelog::tests::{rejected_as_stale, Recorded};
use crate::store::changelog::ChangelogRecord;
use crate::store::{now_us, Claim, ClaimHow, Claimed, StoreOptions, Turn};

const TOPIC: &str = "outbox.event.order";

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, &StoreOptions::for_tests(Some(Duration::from_secs(3600)))).unwrap()
}

fn message(offset: i64, key: Option<&str>) -> RawMessage {
    RawMessage {
        topic: TOPIC.into(),
        partition: 2,
        offset,
        key: key.map(|k| k.as_bytes().to_vec()),
        value: Some(format!("{{\"n\":{offset}}}").into_bytes()),
        headers: vec![("id".into(), Some(format!("e{offset}").into_bytes()))],
        timestamp_ms: None,
    }
}

fn event(m: &RawMessage) -> OutboxEvent {
    OutboxEvent {
        id: format!("e{}", m.offset),
        aggregate_id: m.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
        event_type: Some("OrderShipped".into()),
        payload: Payload::Null,
        position: Position { topic: m.topic.clone(), partition: m.partition, offset: m.offset },
        timestamp_ms: None,
        traceparent: None,
        route_key: None,
        headers: Vec::new(),
    }
}

async fn claim(store: &Store, m: &RawMessage) -> Claim {
    store.claim_in_memory(&event(m), TOPIC).await.unwrap()
}

fn claimed(claim: Claim) -> Claimed {
    match claim {
        Claim::Claimed(c) => c,
        other => panic!("not claimed: {other:?}"),
    }
}

/// The event at `m` claimed to run as the executor claims it (in memory, `on_dead = "hold"`).
async fn turn(store: &Store, m: &RawMessage) -> Turn {
    store.claim_to_run(&event(m), TOPIC, ClaimHow { durable: false, hold: true, message: m }).await.unwrap()
}

/// The event at `m` fails for good, holding its key's later events.
async fn dies(store: &Store, m: &RawMessage) {
    let Turn::Run(c) = turn(store, m).await else { panic!("not run") };
    store.finish_failed(c.holding(true, m), State::Dead, "http 400".into(), m, None).await.unwrap();
}

/// The event at `m` comes: `true` when it was recorded held (else it ran and is done).
async fn arrives(store: &Store, m: &RawMessage) -> bool {
    match turn(store, m).await {
        Turn::Held => true,
        Turn::Run(c) => {
            store.finish(c, State::Done, "http 200".into()).await.unwrap();
            false
        }
        Turn::Finished { .. } => panic!("a new event found final"),
    }
}

fn state(store: &Store, id: &str) -> State {
    store.get(id).unwrap().unwrap_or_else(|| panic!("no record of {id}")).state
}

fn chain_of(store: &Store, id: &str) -> ChainInfo {
    store.chain_view(&store.get(id).unwrap().unwrap(), 100).unwrap_or_else(|| panic!("{id} is in no chain"))
}

fn order_key() -> ChainId {
    ChainId { topic: TOPIC.into(), partition: 2, key: b"order-7".to_vec(), route: None }
}

/// The releaser's step: the chain's next held event, run to `outcome`.
async fn run_next(store: &Store, chain: &ChainId, outcome: State) -> String {
    let (r, m, running) = store.next_held(chain).await.unwrap().expect("a held event to run");
    let c = claimed(store.claim_in_memory(&event(&m), TOPIC).await.unwrap());
    assert!(
        store.hold_behind(Claim::Claimed(c.clone()), true, &m).await.unwrap().is_some(),
        "a member is not held again"
    );
    match outcome {
        State::Done => store.finish(c, State::Done, "http 200".into()).await.unwrap(),
        failed => store.finish_failed(c.holding(true, &m), failed, "http 400".into(), &m, None).await.unwrap(),
    }
    drop(running);
    store.after_held_run(&r).await.unwrap();
    r.event_id.to_string()
}

#[tokio::test]
async fn later_events_of_a_dead_events_key_are_held_with_their_copies_and_others_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    dies(&store, &message(10, Some("order-7"))).await;
    for offset in [11, 12, 13] {
        assert!(arrives(&store, &message(offset, Some("order-7"))).await, "e{offset} is held");
    }
    assert!(!arrives(&store, &message(14, Some("order-8"))).await, "another key runs");
    assert!(!arrives(&store, &message(15, None)).await, "a message without a key has no order to keep");
    assert!(arrives(&store, &message(16, Some("order-7"))).await, "still held after other keys ran");

    assert_eq!(store.list(Some(State::Held), 10).unwrap().len(), 4);
    assert_eq!(store.counts()[4], (State::Held, 4));
    assert_eq!(store.stats().unwrap().held, 4);
    let held = store.get("e12").unwrap().unwrap();
    assert_eq!((held.state, held.attempts, held.chain.as_deref()), (State::Held, 0, Some(&b"order-7"[..])));
    assert_eq!(store.message_of(&held).unwrap().unwrap().offset, 12, "the copy it will run from");
    let head = chain_of(&store, "e10");
    assert_eq!((head.head.as_deref(), head.held.clone(), head.held_total), (Some("e10"), ids(&[11, 12, 13, 16]), 4));
    assert_eq!(chain_of(&store, "e13"), head, "a held event shows the same chain");
    assert!(store.released_chains().is_empty(), "it waits for e10");
    assert_eq!(store.held_keys(), 1);

    // A delivery of a held event again (a replay) is a duplicate; it stays held.
    assert_eq!(
        claim(&store, &message(12, Some("order-7"))).await,
        Claim::Finished { state: State::Held, same_offset: true }
    );
    // An older dead event of the key, run again by a person, is before the chain: it is not held.
    let older = message(5, Some("order-7"));
    assert!(!arrives(&store, &older).await, "an event before the head runs");
}

/// The event at `m` on a topic's later route `route` (its own scope): `true` when held.
async fn arrives_on(store: &Store, m: &RawMessage, scope: &str, dies: bool) -> bool {
    let c = store.claim_in_memory(&event(m), scope).await.unwrap();
    match store.hold_behind(c, true, m).await.unwrap() {
        None => true,
        Some(c) if dies => {
            store.finish_failed(claimed(c).holding(true, m), State::Dead, "http 400".into(), m, None).await.unwrap();
            false
        }
        Some(c) => {
            store.finish(claimed(c), State::Done, "http 200".into()).await.unwrap();
            false
        }
    }
}

#[tokio::test]
async fn a_dead_event_holds_its_key_on_its_own_route_only_and_a_reopened_store_keeps_the_routes_apart() {
    let dir = tempfile::tempdir().unwrap();
    let mailer = format!("{TOPIC}#mailer");
    {
        let store = open(dir.path());
        assert!(!arrives_on(&store, &message(10, Some("order-7")), &mailer, true).await, "dead on the mailer");
        assert!(arrives_on(&store, &message(11, Some("order-7")), &mailer, false).await, "held on the mailer");
        assert!(!arrives(&store, &message(11, Some("order-7"))).await, "the first route runs it");
        let chains = store.released_chains();
        assert!(chains.is_empty(), "{chains:?}");
        assert_eq!(store.held_keys(), 1);
    }
    let store = open(dir.path());
    assert!(arrives_on(&store, &message(12, Some("order-7")), &mailer, false).await, "still held on the mailer");
    assert!(!arrives(&store, &message(12, Some("order-7"))).await, "still free on the first route");
    let chain = ChainId { route: Some("mailer".into()), ..order_key() };
    let dead = store.find_in(&mailer, "e10").unwrap().unwrap().record;
    assert_eq!(store.chain_view(&dead, 10).map(|c| (c.chain, c.held)), Some((chain, ids(&[11, 12]))));
}

fn ids(offsets: &[i64]) -> Vec<String> {
    offsets.iter().map(|o| format!("e{o}")).collect()
}

#[tokio::test]
async fn a_released_chain_gives_its_events_in_offset_order_and_one_that_dies_becomes_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    dies(&store, &message(10, Some("order-7"))).await;
    for offset in [11, 12, 13] {
        assert!(arrives(&store, &message(offset, Some("order-7"))).await);
    }
    // Only the releaser's own claim of a held event runs it.
    assert!(matches!(claim(&store, &message(11, Some("order-7"))).await, Claim::Finished { .. }));

    store.resolve_done("e10", "resolved by hand: done".into()).await.unwrap();
    assert_eq!(store.released_chains(), [order_key()]);
    assert_eq!(chain_of(&store, "e11").head, None, "released: nothing to wait for");
    // While it runs, a new event of the key is held behind the rest.
    assert!(arrives(&store, &message(14, Some("order-7"))).await);
    assert_eq!(run_next(&store, &order_key(), State::Done).await, "e11");
    assert_eq!(run_next(&store, &order_key(), State::Dead).await, "e12");
    assert!(store.released_chains().is_empty(), "e12 holds the rest now");
    assert!(store.next_held(&order_key()).await.unwrap().is_none());
    let chain = chain_of(&store, "e13");
    assert_eq!((chain.head.as_deref(), chain.held.clone()), (Some("e12"), ids(&[13, 14])));
    assert_eq!((state(&store, "e11"), state(&store, "e12")), (State::Done, State::Dead));

    // Forgotten, the new head releases the rest; the last one done, the key runs freely again.
    store.forget("e12").await.unwrap();
    assert_eq!(run_next(&store, &order_key(), State::Done).await, "e13");
    assert_eq!(run_next(&store, &order_key(), State::Done).await, "e14");
    assert!(store.released_chains().is_empty() && store.held_keys() == 0);
    assert!(!arrives(&store, &message(15, Some("order-7"))).await, "no chain any more");
    let done = store.get("e13").unwrap().unwrap();
    assert!(store.message_of(&done).unwrap().is_none(), "a held event's copy goes once it is done");
}

#[tokio::test]
async fn a_held_event_cannot_be_retried_or_resolved_out_of_order_but_can_be_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    dies(&store, &message(10, Some("order-7"))).await;
    assert!(arrives(&store, &message(11, Some("order-7"))).await);
    assert!(arrives(&store, &message(12, Some("order-7"))).await);
    for refused in [store.reopen("e11").await.map(drop), store.resolve_done("e11", "x".into()).await] {
        match refused {
            Err(StoreError::WrongState { state: State::Held, expected, .. }) => {
                assert!(expected.contains("runs by itself"))
            }
            other => panic!("{other:?}"),
        }
    }
    store.forget("e11").await.unwrap();
    assert_eq!(chain_of(&store, "e10").held, ids(&[12]), "out of its chain");
    // The head run again (`store retry`): reopened, it is the chain's own and runs, not held.
    let m = store.reopen("e10").await.unwrap();
    assert_eq!(chain_of(&store, "e12").head.as_deref(), Some("e10"), "a head being run again still holds");
    assert!(!arrives(&store, &m).await, "the head runs");
    assert_eq!(store.released_chains(), [order_key()]);
}

#[tokio::test]
async fn an_undecodable_message_of_a_held_key_is_held_and_with_continue_a_dead_event_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let bad = message(10, Some("order-7"));
    store.record_undecodable("undecodable/x/2/10", &bad, "not JSON".into(), None, true).await.unwrap();
    assert_eq!(chain_of(&store, "undecodable/x/2/10").head.as_deref(), Some("undecodable/x/2/10"));
    let worse = message(11, Some("order-7"));
    assert!(store.hold_message("undecodable/x/2/11", &worse, true).await.unwrap());
    assert!(!store.hold_message("undecodable/x/2/12", &message(12, Some("order-8")), true).await.unwrap());
    assert!(!store.hold_message("undecodable/x/2/13", &message(13, Some("order-7")), false).await.unwrap(), "continue");
    assert_eq!(state(&store, "undecodable/x/2/11"), State::Held);
    // `on_dead = "continue"`: a dead event holds nothing.
    let other = message(20, Some("order-9"));
    let c = claimed(claim(&store, &other).await);
    store.finish_failed(c.holding(false, &other), State::Dead, "http 400".into(), &other, None).await.unwrap();
    assert!(!arrives(&store, &message(21, Some("order-9"))).await);
}

#[tokio::test]
async fn a_chain_follows_its_partition_through_the_changelog_with_its_copies() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    let sink = Arc::new(Recorded::default());
    a.attach_changelog(sink.clone());
    dies(&a, &message(10, Some("order-7"))).await;
    for offset in [11, 12, 13] {
        assert!(arrives(&a, &message(offset, Some("order-7"))).await);
    }
    assert!(!arrives(&a, &message(14, Some("order-8"))).await);

    // Another instance restores the partition: the same chain, and the copies to run it from.
    let b = open(b_dir.path());
    b.apply_changelog(TOPIC, &sink.records(TOPIC, 2)).unwrap();
    let chain = chain_of(&b, "e12");
    assert_eq!((chain.head.as_deref(), chain.held.clone()), (Some("e10"), ids(&[11, 12, 13])));
    for id in ["e10", "e11", "e12", "e13"] {
        let r = b.get(id).unwrap().unwrap();
        assert_eq!(b.message_of(&r).unwrap().map(|m| m.offset), Some(r.offset), "{id}'s copy came along");
    }
    assert!(b.message_of(&b.get("e14").unwrap().unwrap()).unwrap().is_none(), "a done event carries none");
    assert!(arrives(&b, &message(15, Some("order-7"))).await, "a new event of the key is held there too");

    // Reopened, B still knows the chain (its index is on disk); the head done releases it.
    drop(b);
    let b = open(b_dir.path());
    assert_eq!(chain_of(&b, "e15").held, ids(&[11, 12, 13, 15]));
    b.resolve_done("e10", "resolved by hand: done".into()).await.unwrap();
    assert_eq!(b.released_chains(), [order_key()]);
}

#[tokio::test]
async fn a_head_resolved_through_another_instance_releases_the_chain_where_it_is_applied() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open(a_dir.path()), open(b_dir.path()));
    let a_sink = Arc::new(Recorded::default());
    a.attach_changelog(a_sink.clone());
    dies(&a, &message(10, Some("order-7"))).await;
    assert!(arrives(&a, &message(11, Some("order-7"))).await);
    b.apply_changelog(TOPIC, &a_sink.records(TOPIC, 2)).unwrap();
    let b_sink = Arc::new(Recorded::default());
    b.attach_changelog(b_sink.clone());
    b.resolve_done("e10", "resolved by hand: done".into()).await.unwrap();
    assert!(a.released_chains().is_empty());
    a.apply_changelog(TOPIC, &b_sink.records(TOPIC, 2)).unwrap();
    assert_eq!(a.released_chains(), [order_key()], "A follows B's repair");
    assert_eq!(chain_of(&a, "e11").head, None);
}

#[tokio::test]
async fn a_lost_chain_index_is_rebuilt_by_stats_on_a_stopped_store_and_stale_entries_go_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        dies(&store, &message(10, Some("order-7"))).await;
        assert!(arrives(&store, &message(11, Some("order-7"))).await);
        // As a crash could leave it: an entry whose record says otherwise, and a lost one.
        let stale = tree_key(&order_key(), 99, &crate::store::disk::keys::record_key(b"\x03nothing\0\0", 1));
        store.chains.tree.insert(stale, &[]).unwrap();
        let lost = store.chains.tree.iter().keys().next().unwrap().unwrap();
        store.chains.tree.remove(lost).unwrap();
        store.durable().await.unwrap();
    }
    let store = open(dir.path());
    assert_eq!(store.chains.tree.len(), 1, "the stale entry went at open");
    assert!(store.stats().unwrap().held == 1);
    assert_eq!(chain_of(&store, "e11").head.as_deref(), Some("e10"), "rebuilt from the full count");
    assert_eq!(store.chains.tree.len(), 2);
    assert!(arrives(&store, &message(12, Some("order-7"))).await);
}

#[tokio::test]
async fn members_whose_slice_expired_leave_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::for_tests(Some(Duration::from_secs(60)))).unwrap();
    dies(&store, &message(10, Some("order-7"))).await;
    assert!(arrives(&store, &message(11, Some("order-7"))).await);
    assert_eq!(store.gc(now_us() + 3_600_000_000).await.unwrap(), 2);
    assert_eq!(store.held_keys(), 0);
    assert!(store.chains.tree.is_empty());
    assert!(!arrives(&store, &message(12, Some("order-7"))).await);
}

#[test]
fn a_held_record_and_its_chain_round_trip_and_read_as_dead_without_the_flag() {
    let position = Position { topic: TOPIC.into(), partition: 2, offset: 11 };
    let mut r = Record::first_seen("e11", State::Held, 0, &position, now_us());
    r.scope = Some(TOPIC.into());
    r.chain = Some(b"order-7".to_vec());
    r.reason = Some("held".into());
    let copy = b"a message copy".to_vec();
    let value = crate::store::changelog::entry::entry_value_with_copy(&r, Some(&copy)).unwrap();
    let key = crate::store::changelog::entry_key(&r);
    let (back, carried) = crate::store::changelog::entry::decode_entry_with_copy(TOPIC, &key, &value).unwrap();
    assert_eq!((back, carried), (r.clone(), Some(copy)));
    assert_eq!(crate::store::changelog::decode_entry(TOPIC, &key, &value).unwrap(), r, "the copy is only a trailer");
    let plain = crate::store::changelog::entry_value(&r).unwrap();
    assert!(value.starts_with(&plain), "what earlier releases read comes first");
    // After the version byte and the (empty) event type: the flags. `held` is an
    // extra bit over the state bits of `dead`, which a release without it reads.
    let flags = crate::store::disk::varint::Reader(&plain[2..]).u64().unwrap();
    assert_eq!(flags & 3, 2, "dead to a release that does not know held");
}

#[tokio::test]
async fn the_owner_writes_aging_chain_records_again_with_their_copies_unless_they_changed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let sink = Arc::new(Recorded::default());
    store.attach_changelog(sink.clone());
    dies(&store, &message(10, Some("order-7"))).await;
    assert!(arrives(&store, &message(11, Some("order-7"))).await);
    assert!(!arrives(&store, &message(12, Some("order-8"))).await);
    assert!(store.aging_members(now_us() - 60_000_000).unwrap().is_empty(), "nothing is old yet");
    let aging = store.aging_members(now_us() + 1).unwrap();
    let mut ids: Vec<&str> = aging.iter().map(|r| &*r.event_id).collect();
    ids.sort();
    assert_eq!(ids, ["e10", "e11"], "the chain's records, not the done one");

    let sent = sink.records(TOPIC, 2).len();
    let held = aging.iter().find(|r| &*r.event_id == "e11").unwrap();
    assert!(store.refresh_member(held).await.unwrap());
    let now = store.get("e11").unwrap().unwrap();
    assert!(now.updated_at_us > held.updated_at_us, "written again");
    assert_eq!((now.state, now.chain.clone()), (State::Held, held.chain.clone()), "as it was");
    let records = sink.records(TOPIC, 2);
    assert_eq!(records.len(), sent + 1, "and sent to the changelog again");
    let (_, copy) = crate::store::changelog::entry::decode_entry_with_copy(
        TOPIC,
        &records[sent].key,
        records[sent].value.as_ref().unwrap(),
    )
    .unwrap();
    assert!(copy.is_some(), "with its copy");

    // A record that changed since it was read is left to whoever changed it.
    let head = aging.iter().find(|r| &*r.event_id == "e10").unwrap();
    store.resolve_done("e10", "resolved by hand: done".into()).await.unwrap();
    assert!(!store.refresh_member(head).await.unwrap());
    assert_eq!(state(&store, "e10"), State::Done);
}

#[tokio::test]
async fn a_head_that_fails_again_when_retried_keeps_holding() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    dies(&store, &message(10, Some("order-7"))).await;
    assert!(arrives(&store, &message(11, Some("order-7"))).await);
    let m = store.reopen("e10").await.unwrap();
    assert!(store.released_chains().is_empty(), "a head being run again still holds");
    let c = claimed(store.hold_behind(claim(&store, &m).await, true, &m).await.unwrap().expect("the head runs"));
    store.finish_failed(c.holding(true, &m), State::Dead, "http 400 again".into(), &m, None).await.unwrap();
    assert!(store.released_chains().is_empty());
    let chain = chain_of(&store, "e11");
    assert_eq!((chain.head.as_deref(), chain.held.clone()), (Some("e10"), ids(&[11])));
    assert!(arrives(&store, &message(12, Some("order-7"))).await, "and holds new events");
}

/// The last record `sink` received for `id`, as a restore would read it, but at
/// `offset`: the same bytes, written to the topic again.
fn written_again(sink: &Recorded, id: &str, state: State, offset: i64) -> ChangelogRecord {
    let records = sink.records(TOPIC, 2);
    let rec = records
        .iter()
        .rev()
        .find(|r| {
            r.value.as_ref().is_some_and(|v| {
                let r = crate::store::changelog::decode_entry(TOPIC, &r.key, v).unwrap();
                *r.event_id == *id && r.state == state
            })
        })
        .unwrap_or_else(|| panic!("no {state} record of {id}"))
        .clone();
    ChangelogRecord { offset, ..rec }
}

/// Nothing of a chain is left: no member in the index (memory and tree), no key held.
fn no_chain(store: &Store) {
    assert!(store.chains.member_keys().is_empty(), "the index holds no member");
    assert!(store.chains.tree.is_empty(), "nor does its tree");
    assert_eq!(store.held_keys(), 0);
    assert!(store.released_chains().is_empty(), "nothing for the releaser to run");
}

/// A's `held` record of e11 (with its copy) is written to the changelog again after
/// e11 ran to done: the owner following its partition and a new owner restoring it
/// both refuse it, so the releaser never runs e11 a second time.
#[tokio::test]
async fn a_held_record_written_again_over_its_done_record_is_refused_with_its_copy() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    let sink = Arc::new(Recorded::default());
    a.attach_changelog(sink.clone());
    dies(&a, &message(10, Some("order-7"))).await;
    assert!(arrives(&a, &message(11, Some("order-7"))).await);
    let held = written_again(&sink, "e11", State::Held, 0);
    let (_, copy) =
        crate::store::changelog::entry::decode_entry_with_copy(TOPIC, &held.key, held.value.as_ref().unwrap()).unwrap();
    assert!(copy.is_some(), "the held record carries its message copy");
    a.resolve_done("e10", "resolved by hand: done".into()).await.unwrap();
    assert_eq!(run_next(&a, &order_key(), State::Done).await, "e11");
    let b = open(b_dir.path());
    b.apply_changelog(TOPIC, &sink.records(TOPIC, 2)).unwrap();

    let replay = ChangelogRecord { offset: sink.records(TOPIC, 2).len() as i64, ..held };
    for (who, store) in [("the owner", &a), ("a new owner", &b)] {
        let (applied, stale) =
            rejected_as_stale(|| store.apply_changelog(TOPIC, std::slice::from_ref(&replay)).unwrap());
        let e11 = store.get("e11").unwrap().unwrap();
        assert_eq!((e11.state, e11.version), (State::Done, 2), "{who}: it stays done");
        assert!(store.message_of(&e11).unwrap().is_none(), "{who}: the copy is not restored");
        no_chain(store);
        assert_eq!((applied, stale), (0, 1), "{who}: refused, and counted");
        assert!(
            matches!(claim(store, &message(11, Some("order-7"))).await, Claim::Finished { state: State::Done, .. }),
            "{who}: a redelivery of e11 is a duplicate"
        );
    }
}

/// The dead head e10 is written to the changelog again after it was retried to done
/// and its chain ran: the key's new events are not held behind it again.
#[tokio::test]
async fn a_dead_record_written_again_after_it_was_retried_to_done_does_not_hold_its_key_again() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    let sink = Arc::new(Recorded::default());
    a.attach_changelog(sink.clone());
    dies(&a, &message(10, Some("order-7"))).await;
    assert!(arrives(&a, &message(11, Some("order-7"))).await);
    let dead = written_again(&sink, "e10", State::Dead, 0);
    let m = a.reopen("e10").await.unwrap();
    let c = claimed(a.hold_behind(claim(&a, &m).await, true, &m).await.unwrap().expect("the head runs"));
    a.finish(c, State::Done, "http 200".into()).await.unwrap();
    assert_eq!(run_next(&a, &order_key(), State::Done).await, "e11");
    let b = open(b_dir.path());
    b.apply_changelog(TOPIC, &sink.records(TOPIC, 2)).unwrap();

    let replay = ChangelogRecord { offset: sink.records(TOPIC, 2).len() as i64, ..dead };
    for (who, store) in [("the owner", &a), ("a new owner", &b)] {
        let (_, stale) = rejected_as_stale(|| store.apply_changelog(TOPIC, std::slice::from_ref(&replay)).unwrap());
        assert_eq!(state(store, "e10"), State::Done, "{who}: it stays done");
        no_chain(store);
        assert!(!arrives(store, &message(20, Some("order-7"))).await, "{who}: the key's next event runs");
        assert_eq!(stale, 1, "{who}: counted");
    }
    // Nor over a record that is held again: e12 held behind a new dead head, e10's record replayed.
    dies(&a, &message(30, Some("order-7"))).await;
    assert!(arrives(&a, &message(31, Some("order-7"))).await);
    let (_, stale) = rejected_as_stale(|| a.apply_changelog(TOPIC, std::slice::from_ref(&replay)).unwrap());
    assert_eq!((stale, state(&a, "e10")), (1, State::Done));
    assert_eq!(chain_of(&a, "e31").head.as_deref(), Some("e30"), "the chain is the one that is");
}
