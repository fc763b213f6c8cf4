use std::sync::Arc;
use std::time::Duration;

use super::audit::MAX_REASON_CHARS;
use super::*;
use crate::event::{OutboxEvent, Payload, Position};
use crate::store::{Claim, Role, Store, StoreOptions};

/// A store holding a done record for each id, in topic `t`.
async fn store_with_done(dir: &Path, ids: &[&str]) -> Arc<Store> {
    let opts = StoreOptions {
        retention: Duration::from_secs(3600),
        commit_interval: Duration::ZERO,
        backlog_commit_interval: Duration::ZERO,
        fsync: true,
        role: Role::Test,
        cache_bytes: crate::store::SMALL_CACHE_BYTES,
        memory_records: crate::config::DEFAULT_MEMORY_RECORDS,
        clock_skew: Duration::ZERO,
    };
    let store = Arc::new(Store::open(dir, &opts).unwrap());
    for (offset, id) in ids.iter().enumerate() {
        let event = OutboxEvent {
            id: (*id).to_owned(),
            aggregate_id: None,
            event_type: None,
            payload: Payload::Null,
            position: Position { topic: "t".into(), partition: 0, offset: offset as i64 },
            timestamp_ms: None,
            traceparent: None,
            route_key: None,
            headers: Vec::new(),
        };
        let Claim::Claimed(c) = store.handling().claim(&event, "t").await.unwrap() else { panic!("{id} claimed") };
        store.handling().finish(c, State::Done, "http 200".into()).await.unwrap();
    }
    store
}

/// An error as `outboxd` prints it (`{:#}` of anyhow): each cause after its error, joined by `: `.
fn printed(e: &OpsError) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

#[tokio::test]
async fn a_rerun_answer_reads_back_as_what_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::new(store_with_done(dir.path(), &["a"]).await);
    let record = local.get("a").unwrap().expect("a record");
    for rerun in [Rerun::Finished(Box::new(record)), Rerun::Redecoded] {
        let wire = serde_json::to_string(&rerun.to_view("a")).unwrap();
        assert_eq!(Rerun::from(serde_json::from_str::<RetryView>(&wire).unwrap()), rerun, "{wire}");
    }
}

#[tokio::test]
async fn a_page_names_the_next_cursor_only_when_more_records_follow() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::new(store_with_done(dir.path(), &["a", "b", "c"]).await);
    let first = local.page(None, None, None, 2).unwrap();
    let ids = |p: &crate::wire::PageView| p.records.iter().map(|r| r.event_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), ["a", "b"]);
    let next = first.next.expect("a cursor: c follows");
    let second = local.page(None, None, Some(&next), 2).unwrap();
    assert_eq!((ids(&second), second.next), (vec!["c".to_owned()], None));
    let all = StoreApi::list(&local, Some(State::Done), Some("t"), usize::MAX).await.unwrap();
    assert_eq!(all.len(), 3);
}

#[tokio::test]
async fn a_store_opened_without_handlers_refuses_to_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::new(store_with_done(dir.path(), &["a"]).await);
    let e = StoreApi::rerun(&local, "a", &Actor::new("t", None).unwrap()).await.unwrap_err();
    assert!(matches!(&e, OpsError::NoHandlers(id) if id == "a"), "{e:?}");
    assert_eq!(printed(&e), "re-running \"a\" needs the handlers: the store was opened without them");
}

#[tokio::test]
async fn every_repair_is_audited_with_who_why_and_what_came_of_it_refused_ones_too() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::new(store_with_done(dir.path(), &["a", "b"]).await);
    let alice = Actor::new("alice", Some("  replayed by hand, ticket 42 ")).unwrap();
    StoreApi::forget(&local, "a", &alice).await.unwrap();
    let e = StoreApi::forget(&local, "nope", &alice).await.unwrap_err();
    assert!(matches!(e, OpsError::NotFound(_)), "{e:?}");
    let e = StoreApi::resolve_done(&local, "b", &Actor::new("bob", None).unwrap()).await.unwrap_err();
    assert!(printed(&e).contains("is done, not dead or parked"), "{}", printed(&e));
    StoreApi::gc(&local, &alice).await.unwrap();

    let page = StoreApi::audit(&local, None, 10).await.unwrap();
    let rows: Vec<_> = page
        .entries
        .iter()
        .map(|e| (e.action.as_str(), e.who.as_str(), e.events.iter().map(|v| v.id.as_str()).collect::<Vec<_>>()))
        .collect();
    assert_eq!(
        rows,
        [
            ("gc", "alice", vec![]),
            ("resolve", "bob", vec!["b"]),
            ("forget", "alice", vec!["nope"]),
            ("forget", "alice", vec!["a"])
        ],
        "newest first"
    );
    let forgot = &page.entries[3];
    assert_eq!((forgot.outcome.as_str(), forgot.reason.as_deref()), ("done", Some("replayed by hand, ticket 42")));
    assert_eq!((forgot.events[0].topic.as_deref(), forgot.events[0].partition), (Some("t"), Some(0)));
    let refused = &page.entries[2];
    assert!(refused.outcome.starts_with("error: no record for event"), "{}", refused.outcome);
    assert_eq!((refused.events[0].topic.as_deref(), refused.reason.is_some()), (None, true));
    assert!(page.entries[1].outcome.starts_with("error: event \"b\" is done"), "{}", page.entries[1].outcome);
    assert_eq!(page.entries[0].outcome, "removed 0 expired record(s)");
    assert_eq!(page.next, None);
    let of_a = StoreApi::audit_of(&local, "a").await.unwrap();
    assert_eq!(of_a, page.entries[3..]);
}

#[test]
fn a_reason_is_bounded_and_a_blank_one_is_none() {
    assert_eq!(Actor::new("a", Some("   ")).unwrap().reason, None);
    assert!(Actor::new("a", Some(&"é".repeat(MAX_REASON_CHARS))).is_ok(), "characters, not bytes");
    let e = Actor::new("a", Some(&"x".repeat(MAX_REASON_CHARS + 1))).unwrap_err();
    assert!(matches!(e, OpsError::ReasonTooLong { chars: 501 }), "{e:?}");
    for bad in ["line one\nline two", "\u{1b}[2Jcleared", "tab\there"] {
        assert!(matches!(Actor::new("a", Some(bad)), Err(OpsError::ReasonNotText)), "{bad:?}");
    }
}

#[test]
fn opening_a_directory_where_nothing_has_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("store");
    let Err(e) = open(Path::new("unused.toml"), Some(&missing), Needs::Records) else { panic!("opened") };
    assert!(matches!(e, OpsError::NoStore(_)), "{e:?}");
    assert!(printed(&e).starts_with("no store at"), "{e}");
    assert!(!missing.exists(), "nothing created");
}

#[tokio::test]
async fn a_repair_from_the_command_line_with_the_brokers_down_changes_nothing_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_done(&dir.path().join("store"), &["a"]).await;
    let config = dir.path().join("outboxd.toml");
    // Nothing listens on port 1; the broker is given one second.
    let text = "[kafka]\nbrokers = \"127.0.0.1:1\"\ngroup_id = \"g\"\n[store]\npath = \"unused\"\n\
        [store.changelog]\ndelivery_timeout = \"1s\"\n";
    std::fs::write(&config, text).unwrap();
    let local = Local::with_config(store.clone(), &config);
    let me = Actor::new("cli:tester", Some("broker test")).unwrap();
    let e = StoreApi::forget(&local, "a", &me).await.unwrap_err();
    assert!(matches!(&e, OpsError::NothingChanged { id, .. } if id == "a"), "{e:?}");
    let tried = local.audit(None, 10).unwrap().entries;
    assert_eq!(tried.len(), 1, "the failed attempt is audited, here at least: {tried:?}");
    assert!(tried[0].outcome.starts_with("error: changelog write failed"), "{}", tried[0].outcome);
    // Printed once each: what was left behind, then the changelog's reason.
    let said = printed(&e);
    assert!(said.starts_with("a: nothing was changed in the store"), "{said}");
    assert_eq!(said.matches("changelog write failed: ").count(), 1, "{said}");
    assert!(store.has_changelog(), "the service's producer was attached");
    assert_eq!(store.reads().get("a").unwrap().unwrap().state, State::Done, "the record is still there");

    // With the changelog off, the repair is the store's alone, as before.
    std::fs::write(&config, format!("{text}enabled = false\n")).unwrap();
    let off = Local::with_config(store_with_done(&dir.path().join("off"), &["b"]).await, &config);
    assert_eq!(StoreApi::forget(&off, "b", &me).await.unwrap().event_id, "b");
    let e = StoreApi::forget(&off, "b", &me).await.unwrap_err();
    assert!(matches!(&e, OpsError::NotFound(id) if id == "b"), "forgotten already: {e:?}");
    assert_eq!(printed(&e), "no record for event \"b\"");
}
