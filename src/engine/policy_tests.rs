//! The executor's policies (retry, verify, park) against a scripted handler and
//! a store in a temporary directory: no Kafka, no network.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::executor::Executor;
use crate::config::Config;
use crate::event::{OutboxEvent, RawMessage};
use crate::handler::{async_trait, Handler, HandlerError, Outcome, Verified};
use crate::store::{Claim, Record, Role, State, Store, StoreOptions};

const TOPIC: &str = "t";

/// Answers each attempt and each lookup with the next scripted result.
#[derive(Default)]
struct Scripted {
    attempts: Mutex<VecDeque<Result<Outcome, HandlerError>>>,
    lookups: Mutex<VecDeque<Result<Verified, HandlerError>>>,
    handled: AtomicUsize,
    verified: AtomicUsize,
}

impl Scripted {
    fn new(attempts: Vec<Result<Outcome, HandlerError>>) -> Arc<Scripted> {
        Arc::new(Scripted { attempts: Mutex::new(attempts.into()), ..Scripted::default() })
    }

    fn with_lookups(self: Arc<Scripted>, lookups: Vec<Result<Verified, HandlerError>>) -> Arc<Scripted> {
        *self.lookups.lock().unwrap() = lookups.into();
        self
    }

    fn handled(&self) -> usize {
        self.handled.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Handler for Scripted {
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let next = self.attempts.lock().unwrap().pop_front();
        next.unwrap_or_else(|| panic!("event {} ran more often than scripted", event.id))
    }

    async fn verify(&self, event: &OutboxEvent) -> Result<Verified, HandlerError> {
        self.verified.fetch_add(1, Ordering::SeqCst);
        let next = self.lookups.lock().unwrap().pop_front();
        next.unwrap_or_else(|| panic!("event {} was looked up more often than scripted", event.id))
    }
}

fn ok(text: &str) -> Result<Outcome, HandlerError> {
    Ok(Outcome(text.to_owned()))
}

fn retryable(after: Option<Duration>) -> Result<Outcome, HandlerError> {
    Err(HandlerError::Retryable { reason: "http 503".to_owned(), retry_after: after })
}

struct Fixture {
    exec: Executor,
    handler: Arc<Scripted>,
    _dir: tempfile::TempDir,
}

/// How the topic's `[[handlers]]` entry differs from the defaults.
#[derive(Default)]
struct Entry {
    /// Lines of `[handlers.retry]` (backoff is always 1–5 ms).
    retry: &'static str,
    /// `on_uncertain = "..."`.
    on_uncertain: Option<&'static str>,
}

/// An executor whose handler for [`TOPIC`] is `handler`, with a store in a temporary directory.
fn fixture(entry: Entry, handler: Arc<Scripted>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (on_uncertain, verify) = match entry.on_uncertain {
        Some(policy @ "verify") => {
            (format!("on_uncertain = {policy:?}"), "[handlers.verify]\nurl = \"http://127.0.0.1:9/{event_id}\"")
        }
        Some(policy) => (format!("on_uncertain = {policy:?}"), ""),
        None => (String::new(), ""),
    };
    let toml = format!(
        "[kafka]\nbrokers = \"127.0.0.1:9\"\ngroup_id = \"g\"\n[store]\npath = {:?}\n\
         [[handlers]]\ntopics = [\"{TOPIC}\"]\nkind = \"http\"\nurl = \"http://127.0.0.1:9/\"\n{on_uncertain}\n\
         [handlers.retry]\ninitial_backoff = \"1ms\"\nmax_backoff = \"5ms\"\n{}\n{verify}\n",
        dir.path().join("store"),
        entry.retry,
    );
    let config = Config::parse(&toml, &|_| None).unwrap_or_else(|e| panic!("{e:#}\n{toml}"));
    let opts = StoreOptions {
        retention: Duration::from_secs(3600),
        commit_interval: Duration::from_millis(1),
        backlog_commit_interval: Duration::from_millis(1),
        fsync: false,
        role: Role::Test,
        cache_bytes: crate::store::SMALL_CACHE_BYTES,
        memory_records: crate::config::DEFAULT_MEMORY_RECORDS,
        clock_skew: Duration::ZERO,
    };
    let store = Arc::new(Store::open(&config.store.path, &opts).unwrap());
    let custom = HashMap::from([(TOPIC.to_owned(), handler.clone() as Arc<dyn Handler>)]);
    Fixture { exec: Executor::with_handlers(config, store, custom).unwrap(), handler, _dir: dir }
}

fn message(id: &str, offset: i64) -> RawMessage {
    RawMessage {
        topic: TOPIC.to_owned(),
        offset,
        key: Some(b"k".to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![("id".to_owned(), Some(id.as_bytes().to_vec()))],
        ..RawMessage::default()
    }
}

impl Fixture {
    async fn run(&self, msg: &RawMessage) {
        self.exec.execute(msg).await.unwrap();
    }

    fn record(&self, id: &str) -> Record {
        self.exec.store.reads().get(id).unwrap().expect("a record")
    }

    /// An earlier run claimed the event and died before recording its outcome.
    async fn crashed_during(&self, msg: &RawMessage) {
        let event = OutboxEvent {
            id: "e".to_owned(),
            aggregate_id: None,
            event_type: None,
            payload: crate::event::Payload::Null,
            position: msg.position(),
            timestamp_ms: None,
            traceparent: None,
            route_key: None,
            headers: Vec::new(),
        };
        assert!(matches!(self.exec.store.handling().claim(&event, TOPIC).await.unwrap(), Claim::Claimed(_)));
    }

    /// Events counted as claimed, in-memory claims included.
    fn claimed(&self) -> Option<u64> {
        self.exec.store.reads().counts().iter().find(|(s, _)| *s == State::Claimed).map(|(_, n)| *n)
    }

    fn counter(&self, which: fn(&super::executor::Counters) -> &std::sync::atomic::AtomicU64) -> u64 {
        which(&self.exec.counters).load(Ordering::Relaxed)
    }
}

#[tokio::test]
async fn retries_then_success_records_done_once() {
    let f = fixture(Entry::default(), Scripted::new(vec![retryable(None), retryable(None), ok("sent")]));
    f.run(&message("e", 0)).await;
    let r = f.record("e");
    assert_eq!((r.state, r.outcome.as_deref(), r.attempts), (State::Done, Some("sent"), 3));
    // Delivered again, at its offset and at a new one: suppressed, not run.
    f.run(&message("e", 0)).await;
    f.run(&message("e", 5)).await;
    assert_eq!(f.handler.handled(), 3);
    assert_eq!(f.counter(|c| &c.handled), 1);
    assert_eq!(f.counter(|c| &c.duplicates), 2);
}

#[tokio::test]
async fn retries_exhausted_is_dead_with_the_reason() {
    let entry = Entry { retry: "max_attempts = 3", ..Entry::default() };
    let f = fixture(entry, Scripted::new(vec![retryable(None); 3]));
    f.run(&message("e", 0)).await;
    let r = f.record("e");
    assert_eq!(r.state, State::Dead);
    let reason = r.reason.unwrap();
    assert!(reason.starts_with("gave up after 3 attempts") && reason.ends_with("http 503"), "{reason}");
    assert_eq!(f.handler.handled(), 3);
    assert_eq!(f.counter(|c| &c.dead), 1);
}

#[tokio::test]
async fn a_permanent_failure_is_dead_without_a_retry() {
    let f = fixture(Entry::default(), Scripted::new(vec![Err(HandlerError::Permanent("http 400".to_owned()))]));
    f.run(&message("e", 0)).await;
    let r = f.record("e");
    assert_eq!((r.state, r.reason.as_deref(), r.attempts), (State::Dead, Some("http 400"), 1));
    assert_eq!(f.handler.handled(), 1);
}

#[tokio::test]
async fn uncertain_with_on_uncertain_park_is_parked_without_running() {
    let f = fixture(Entry { on_uncertain: Some("park"), ..Entry::default() }, Scripted::new(vec![]));
    let msg = message("e", 0);
    f.crashed_during(&msg).await;
    f.run(&msg).await;
    let r = f.record("e");
    assert_eq!(r.state, State::Parked);
    assert!(r.reason.unwrap().contains("outboxd store resolve"));
    assert_eq!(f.handler.handled(), 0);
    assert_eq!(f.counter(|c| &c.reexecuted), 1);
}

#[tokio::test]
async fn uncertain_verified_as_done_is_recorded_done_without_running_again() {
    let handler = Scripted::new(vec![]).with_lookups(vec![
        Err(HandlerError::retryable("verify: http 503")),
        Ok(Verified::Happened("verified: http 200".to_owned())),
    ]);
    let f = fixture(Entry { on_uncertain: Some("verify"), ..Entry::default() }, handler);
    let msg = message("e", 0);
    f.crashed_during(&msg).await;
    f.run(&msg).await;
    let r = f.record("e");
    assert_eq!((r.state, r.outcome.as_deref()), (State::Done, Some("verified: http 200")));
    assert_eq!(f.handler.handled(), 0);
    assert_eq!(f.handler.verified.load(Ordering::SeqCst), 2, "the lookup is retried like the handler");
}

#[tokio::test]
async fn uncertain_verified_as_missing_runs_again() {
    let handler = Scripted::new(vec![ok("sent")]).with_lookups(vec![Ok(Verified::Missing)]);
    let f = fixture(Entry { on_uncertain: Some("verify"), ..Entry::default() }, handler);
    let msg = message("e", 0);
    f.crashed_during(&msg).await;
    f.run(&msg).await;
    let r = f.record("e");
    assert_eq!((r.state, r.outcome.as_deref(), r.attempts), (State::Done, Some("sent"), 2));
    assert_eq!(f.handler.handled(), 1);
}

#[tokio::test]
async fn uncertain_with_on_uncertain_retry_runs_again() {
    let f = fixture(Entry::default(), Scripted::new(vec![ok("sent")]));
    let msg = message("e", 0);
    f.crashed_during(&msg).await;
    f.run(&msg).await;
    assert_eq!(f.record("e").state, State::Done);
    assert_eq!(f.handler.handled(), 1);
    assert_eq!(f.counter(|c| &c.reexecuted), 1);
    assert_eq!(f.handler.verified.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn retry_after_is_honoured_within_max_elapsed() {
    let entry = Entry { retry: "max_elapsed = \"5s\"", ..Entry::default() };
    let f = fixture(entry, Scripted::new(vec![retryable(Some(Duration::from_millis(300))), ok("sent")]));
    let started = Instant::now();
    f.run(&message("e", 0)).await;
    assert!(started.elapsed() >= Duration::from_millis(300), "retried after {:?}", started.elapsed());
    assert_eq!(f.record("e").state, State::Done);
    assert_eq!(f.handler.handled(), 2);
}

// Paused time: the runtime's clock moves only by what the executor sleeps, so "at once"
// is exact however slow the machine is.
#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_max_elapsed_is_dead_at_once() {
    let entry = Entry { retry: "max_elapsed = \"2s\"", ..Entry::default() };
    let f = fixture(entry, Scripted::new(vec![retryable(Some(Duration::from_secs(10)))]));
    let started = tokio::time::Instant::now();
    f.run(&message("e", 0)).await;
    assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
    let r = f.record("e");
    assert_eq!(r.state, State::Dead);
    assert!(r.reason.unwrap().starts_with("gave up after 1 attempts"));
    assert_eq!(f.handler.handled(), 1);
}

/// An in-memory claim (`on_uncertain = retry`, the default) is shown while the event
/// runs and forgotten however its handling ends: with the final record, or when the
/// event is left to its partition's new owner between attempts (nothing stored then).
#[tokio::test]
async fn an_in_memory_claim_is_forgotten_when_final_and_when_left_to_a_new_owner() {
    let f = fixture(Entry::default(), Scripted::new(vec![retryable(None), ok("sent")]));
    // Owned when claimed, moved by the time of the retry.
    let asked = AtomicUsize::new(0);
    let owned = || asked.fetch_add(1, Ordering::SeqCst) == 0;
    let executed = f.exec.execute_owned(&message("e", 0), &owned, &|| {}).await.unwrap();
    assert_eq!(executed, super::executor::Executed::Abandoned);
    assert_eq!(f.handler.handled(), 1);
    assert!(f.exec.store.reads().get("e").unwrap().is_none(), "no claim left behind, nothing stored");
    assert_eq!(f.claimed(), Some(0));
    // Its new owner (here, this one again) runs it to its final record.
    f.run(&message("e", 0)).await;
    assert_eq!(f.record("e").state, State::Done);
    assert_eq!(f.claimed(), Some(0));
}

/// After a failure that stops the service (a store write that failed, most often)
/// nothing more is called: an event that waited meanwhile (here, for its retry) is
/// left unfinished for the restart, which reads from the last committed offset,
/// instead of calling its receiver again with no way to record the answer.
#[tokio::test]
async fn no_call_starts_once_the_executor_failed() {
    let f = fixture(Entry::default(), Scripted::new(vec![retryable(None), ok("sent")]));
    // The executor fails while the event waits for its retry (the ownership check after the backoff).
    let asked = AtomicUsize::new(0);
    let owned = || {
        if asked.fetch_add(1, Ordering::SeqCst) == 1 {
            f.exec.fail(super::Fatal::Consumer("failed meanwhile".to_owned()));
        }
        true
    };
    let executed = f.exec.execute_owned(&message("e", 0), &owned, &|| {}).await.unwrap();
    assert_eq!(executed, super::executor::Executed::Abandoned);
    assert_eq!(f.handler.handled(), 1, "no call after the failure");
    assert!(f.exec.store.reads().get("e").unwrap().is_none(), "nothing recorded for it");
}
