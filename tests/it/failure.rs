//! Black-box tests of outboxd's failure handling against the real broker and a scripted
//! HTTP receiver: retries, status rules, `Retry-After`, the dead-letter topic, the
//! unknown-outcome policies (retry / verify / park), `outboxd store retry|resolve|export`,
//! and bad input. Each test uses its own topics and consumer group.

use crate::harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use harness::daemon::dead_letter_toml;
use harness::logs::{self, log_lines, logged};
use harness::receiver::{Receiver, Reply};
use harness::store::{self as cli, describe};
use harness::{new_event_id, unique_name, Kafka, Message, Outboxd, Producer};
use serde_json::{json, Value};

/// Generous bound for "outboxd handles what it was given".
const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
const DLQ_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A topic, its outboxd, a scripted receiver and a producer.
struct Setup {
    kafka: Kafka,
    rx: Receiver,
    od: Outboxd,
    topic: String,
    producer: Producer,
}

async fn setup(prefix: &str, partitions: i32) -> Setup {
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name(prefix), partitions, &[]).await;
    let rx = Receiver::start();
    let od = Outboxd::new(&kafka, &[&topic], &rx);
    let producer = kafka.producer();
    Setup { kafka, rx, od, topic, producer }
}

impl Setup {
    async fn send(&self, key: &str, id: &str, payload: &Value) -> (i32, i64) {
        let produced = self.producer.send_event(&self.topic, key, id, Some("Test"), payload).await;
        (produced.partition, produced.offset)
    }

    async fn wait_committed_end(&mut self) {
        let offsets = self.kafka.offsets(&self.od.config.group_id, &self.topic);
        let what = format!("committed offsets of {} to reach the end", self.topic);
        self.od.wait_until(what, HANDLED_TIMEOUT, || offsets.reached_end()).await;
    }

    fn committed(&self, partition: i32) -> Option<i64> {
        let offsets = self.kafka.offsets(&self.od.config.group_id, &self.topic);
        offsets.try_committed().ok().and_then(|c| c.get(&partition).copied().flatten())
    }
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a [u8]> {
    m.headers.iter().rev().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_string()
}

/// A permanently failing event is produced to the dead-letter topic, and only after the
/// broker acknowledged that does its offset move: while the dead-letter topic refuses
/// the message (its `message.timestamp.before.max.ms` is 0, so the broker answers
/// INVALID_TIMESTAMP to every record, and outboxd keeps trying), the committed offset
/// stays at the failed event although a later event of another key is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_goes_to_dead_letter_topic_before_offset_moves() {
    let mut s = setup("dlq-src", 1).await;
    let refuse = [("message.timestamp.before.max.ms", "0")];
    let dlq = s.kafka.create_topic(&unique_name("dlq"), 1, &refuse).await;
    s.od.config.handler_extra = dead_letter_toml(&dlq);
    let bad = new_event_id();
    let after = new_event_id();
    let bad_for_script = bad.clone();
    s.rx.set_script(
        move |r| if r.event_id.as_deref() == Some(&bad_for_script) { Reply::status(422) } else { Reply::ok() },
    );

    let first = new_event_id();
    s.send("acct-0", &first, &json!({"n": 0})).await;
    let payload = br#"{"orderId":7,"total":"9.99"}"#;
    let (partition, bad_offset) = s
        .producer
        .send_raw(
            &s.topic,
            None,
            Some(b"acct-1"),
            &[("id", Some(bad.as_bytes())), ("eventType", Some(b"OrderPaid")), ("traceparent", Some(b"00-abc-def-01"))],
            Some(payload),
        )
        .await;
    s.send("acct-2", &after, &json!({"n": 2})).await;

    s.od.start();
    s.od.wait_for_assignment().await;
    s.od.wait_until("the later event of another key to be answered", HANDLED_TIMEOUT, || s.rx.answered_ok(&after))
        .await;
    let deadline = Instant::now() + HANDLED_TIMEOUT;
    while !logged(&s.od, "dead-letter produce failed") {
        assert!(Instant::now() < deadline, "outboxd never reported the refused dead letter");
        s.od.assert_alive();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The dead-letter topic cannot take the message: the committed offset must wait at
    // the failed event (it may reach it, never pass it) although everything else is done.
    let mut samples = Vec::new();
    for _ in 0..25 {
        s.od.assert_alive();
        if let Some(c) = s.committed(partition) {
            assert!(
                c <= bad_offset,
                "committed offset {c} passed the event at {bad_offset} before its dead letter was acknowledged"
            );
            samples.push(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        samples.last().copied(),
        Some(bad_offset),
        "the offset before the failed event should be committed meanwhile"
    );
    assert_eq!(s.rx.handler_call_count(&bad), 1, "a permanent failure (422) must not be retried");
    assert!(s.kafka.read_topic(&dlq, DLQ_READ_TIMEOUT).is_empty(), "the premise: no dead letter got through yet");

    // Let the dead-letter topic take it: the dead letter is produced, then the offset moves.
    s.kafka.alter_topic_config(&dlq, &[("message.timestamp.before.max.ms", "9223372036854775807")]).await;
    s.wait_committed_end().await;
    s.od.stop();

    let letters = s.kafka.read_topic(&dlq, DLQ_READ_TIMEOUT);
    assert_eq!(letters.len(), 1, "exactly one dead letter expected: {letters:#?}");
    let m = &letters[0];
    assert_eq!(m.key.as_deref(), Some(&b"acct-1"[..]), "original key");
    assert_eq!(m.value.as_deref(), Some(&payload[..]), "original value");
    assert_eq!(header(m, "id"), Some(bad.as_bytes()));
    assert_eq!(header(m, "eventType"), Some(&b"OrderPaid"[..]));
    assert_eq!(header(m, "traceparent"), Some(&b"00-abc-def-01"[..]));
    let h = |n: &str| m.header(n).unwrap_or_else(|| panic!("dead letter lacks header {n}: {m:#?}"));
    assert!(h("outboxd.error").contains("http 422"), "outboxd.error = {}", h("outboxd.error"));
    assert_eq!(h("outboxd.attempts"), "1");
    assert_eq!(h("outboxd.source.topic"), s.topic);
    assert_eq!(h("outboxd.source.partition"), partition.to_string());
    assert_eq!(h("outboxd.source.offset"), bad_offset.to_string());
    let failed_at = humantime::parse_rfc3339(&h("outboxd.failed_at"))
        .unwrap_or_else(|e| panic!("outboxd.failed_at {:?} is not RFC 3339: {e}", h("outboxd.failed_at")));
    assert!(failed_at <= SystemTime::now());

    let r = cli::get(&s.od, &bad);
    assert_eq!(text(&r, "state"), "dead", "{r}");
    assert!(text(&r, "reason").contains("http 422"), "{r}");
    assert_eq!(text(&r, "dead_letter"), format!("{dlq}/0@{}", m.offset), "{r}");
    assert_eq!(s.od.store_get(&after).state, "done");
    assert_eq!(s.od.store_get(&first).state, "done");
}

/// 503 for the first calls: retried with the same idempotency key and body until it
/// succeeds; the attempts are recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_are_retried_then_succeed() {
    const FAILURES: u32 = 3;
    let mut s = setup("retry-ok", 1).await;
    s.od.config.max_attempts = 5;
    s.od.config.initial_backoff = "50ms".into();
    s.od.config.max_backoff = "200ms".into();
    let id = new_event_id();
    let sid = id.clone();
    s.rx.set_script(move |r| {
        if r.event_id.as_deref() == Some(&sid) && r.nth <= FAILURES {
            Reply::status(503)
        } else {
            Reply::ok()
        }
    });
    s.send("user-1", &id, &json!({"mail": "welcome"})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.od.wait_until("the event to succeed", HANDLED_TIMEOUT, || s.rx.answered_ok(&id)).await;
    s.wait_committed_end().await;
    s.od.stop();

    let calls = s.rx.handler_calls(&id);
    assert_eq!(calls.len(), FAILURES as usize + 1, "{calls:#?}");
    for c in &calls {
        assert_eq!(c.header("Idempotency-Key"), Some(id.as_str()), "every attempt carries the same key");
        assert_eq!(c.body, json!({"mail": "welcome"}));
    }
    let statuses: Vec<u16> = calls.iter().map(|c| c.status).collect();
    assert_eq!(statuses, vec![503, 503, 503, 200]);
    let r = s.od.store_get(&id);
    assert_eq!(r.state, "done", "{r:?}");
    assert_eq!(r.attempts, FAILURES + 1, "attempts recorded: {r:?}");
    assert_eq!(r.outcome.as_deref(), Some("http 200"));
    assert_eq!(log_lines(&s.od, "handler failed; retrying").len(), FAILURES as usize);
}

/// A receiver that keeps answering 503: after max_attempts the event is dead, with the
/// reason, and (without a dead-letter topic) the store keeps the full message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_end_dead_with_reason() {
    let mut s = setup("retry-dead", 1).await;
    s.od.config.max_attempts = 3;
    s.od.config.initial_backoff = "50ms".into();
    s.od.config.max_backoff = "200ms".into();
    let id = new_event_id();
    let ok = new_event_id();
    let sid = id.clone();
    s.rx.set_script(move |r| if r.event_id.as_deref() == Some(&sid) { Reply::status(503) } else { Reply::ok() });
    let (_, offset) = s.send("k-1", &id, &json!({"v": 1})).await;
    s.send("k-1", &ok, &json!({"v": 2})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.od.wait_until("the next event of the key", HANDLED_TIMEOUT, || s.rx.answered_ok(&ok)).await;
    s.wait_committed_end().await;
    s.od.stop();

    assert_eq!(s.rx.handler_call_count(&id), 3, "exactly max_attempts calls");
    let r = cli::get(&s.od, &id);
    assert_eq!(text(&r, "state"), "dead", "{r}");
    assert_eq!(r["attempts"], 3, "{r}");
    let reason = text(&r, "reason");
    assert!(reason.contains("gave up after 3 attempts") && reason.contains("http 503"), "reason: {reason}");
    assert!(r["dead_letter"].is_null(), "no dead-letter topic configured: {r}");
    let dead = cli::export(&s.od, Some("dead"), Some(&s.topic));
    assert_eq!(dead.len(), 1, "{dead:#?}");
    let m = &dead[0]["message"];
    assert_eq!(m["offset"], offset, "{m}");
    assert_eq!(m["key"], "k-1");
    assert_eq!(m["value"], json!({"v": 1}).to_string());
    let headers = m["headers"].as_array().expect("headers");
    assert!(headers.contains(&json!(["id", id])), "{m}");
    assert_eq!(s.od.store_get(&ok).state, "done");
}

/// `retry.max_elapsed` ends retrying even when attempts are left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_gives_up_after_max_elapsed() {
    let mut s = setup("retry-elapsed", 1).await;
    s.od.config.max_attempts = 1000;
    s.od.config.initial_backoff = "100ms".into();
    s.od.config.max_backoff = "300ms".into();
    s.od.config.retry_extra = "max_elapsed = \"2s\"\n".into();
    let id = new_event_id();
    s.rx.set_script(|_| Reply::status(500));
    s.send("k", &id, &json!({})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.wait_committed_end().await;
    s.od.stop();
    let calls = s.rx.handler_calls(&id);
    assert!(calls.len() >= 2 && calls.len() < 1000, "retried, but stopped by max_elapsed: {} calls", calls.len());
    let span = calls.last().unwrap().started_at - calls[0].started_at;
    assert!(span <= Duration::from_millis(2500), "calls went on for {span:?}, max_elapsed is 2s");
    let r = s.od.store_get(&id);
    assert_eq!(r.state, "dead", "{r:?}");
    assert!(r.reason.as_deref().is_some_and(|t| t.contains("gave up") && t.contains("http 500")), "{r:?}");
}

/// `Retry-After` is a lower bound on the pause before the next attempt (seconds and
/// HTTP-date forms), while without it the backoff would be far shorter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let mut s = setup("retry-after", 2).await;
    s.od.config.max_attempts = 3;
    s.od.config.initial_backoff = "20ms".into();
    s.od.config.max_backoff = "50ms".into();
    let secs = new_event_id();
    let date = new_event_id();
    let plain = new_event_id();
    let (a, b, c) = (secs.clone(), date.clone(), plain.clone());
    s.rx.set_script(move |r| {
        let id = r.event_id.as_deref().unwrap_or("");
        if r.nth > 1 {
            Reply::ok()
        } else if id == a {
            Reply::status(503).retry_after("2")
        } else if id == b {
            let at = SystemTime::now() + Duration::from_secs(3);
            Reply::status(429).retry_after(&httpdate::fmt_http_date(at))
        } else if id == c {
            Reply::status(503)
        } else {
            Reply::ok()
        }
    });
    s.send("a", &secs, &json!({})).await;
    s.send("b", &date, &json!({})).await;
    s.send("c", &plain, &json!({})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.od.wait_until("all three to succeed", HANDLED_TIMEOUT, || {
        [&secs, &date, &plain].iter().all(|id| s.rx.answered_ok(id))
    })
    .await;
    s.wait_committed_end().await;
    s.od.stop();

    let gap = |id: &str| {
        let calls = s.rx.handler_calls(id);
        assert_eq!(calls.len(), 2, "{calls:#?}");
        calls[1].started.duration_since(calls[0].answered.expect("answered")).unwrap_or_default()
    };
    let g_secs = gap(&secs);
    let g_date = gap(&date);
    let g_plain = gap(&plain);
    eprintln!("pauses: Retry-After 2 → {g_secs:?}; Retry-After date +3s → {g_date:?}; none → {g_plain:?}");
    assert!(g_secs >= Duration::from_millis(1950), "Retry-After: 2 not honoured: next attempt after {g_secs:?}");
    // An HTTP date has whole seconds: at least 2 s of the 3 remain.
    assert!(g_date >= Duration::from_millis(1950), "Retry-After (date) not honoured: next attempt after {g_date:?}");
    assert!(g_plain < Duration::from_millis(1000), "without Retry-After the backoff is ≤ 20 ms (+jitter): {g_plain:?}");
}

/// `success_on`, `fail_on` and `retry_on` override the default classification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_rules_override_defaults() {
    let mut s = setup("status-rules", 1).await;
    s.od.config.handler_extra = "success_on = [409]\nfail_on = [503]\nretry_on = [\"4xx\"]\n".into();
    s.od.config.max_attempts = 5;
    s.od.config.initial_backoff = "20ms".into();
    s.od.config.max_backoff = "50ms".into();
    let conflict = new_event_id(); // 409: default retry → success
    let unavailable = new_event_id(); // 503: default retry → permanent
    let not_found = new_event_id(); // 404 twice: default permanent → retry
    let (a, b, c) = (conflict.clone(), unavailable.clone(), not_found.clone());
    s.rx.set_script(move |r| {
        let id = r.event_id.as_deref().unwrap_or("");
        if id == a {
            Reply::status(409)
        } else if id == b {
            Reply::status(503)
        } else if id == c && r.nth <= 2 {
            Reply::status(404)
        } else {
            Reply::ok()
        }
    });
    for (k, id) in [("a", &conflict), ("b", &unavailable), ("c", &not_found)] {
        s.send(k, id, &json!({"k": k})).await;
    }
    s.od.start();
    s.od.wait_for_assignment().await;
    s.wait_committed_end().await;
    s.od.stop();

    assert_eq!(s.rx.handler_call_count(&conflict), 1);
    let r = s.od.store_get(&conflict);
    assert_eq!((r.state.as_str(), r.outcome.as_deref()), ("done", Some("http 409")), "{r:?}");
    assert_eq!(s.rx.handler_call_count(&unavailable), 1, "503 is in fail_on: no retry");
    let r = s.od.store_get(&unavailable);
    assert_eq!(r.state, "dead", "{r:?}");
    assert!(r.reason.as_deref().is_some_and(|t| t.contains("http 503")), "{r:?}");
    assert_eq!(s.rx.handler_call_count(&not_found), 3, "404 is retried under retry_on = [\"4xx\"]");
    let r = s.od.store_get(&not_found);
    assert_eq!((r.state.as_str(), r.outcome.as_deref(), r.attempts), ("done", Some("http 200"), 3), "{r:?}");
}

/// One key's event keeps failing for a while: the other keys of the same partition are
/// handled meanwhile, a later event of the same key waits, and the committed offset
/// never passes the retrying event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_event_does_not_stall_other_keys() {
    const OTHERS: usize = 30;
    let mut s = setup("no-stall", 1).await;
    s.od.config.max_attempts = 200;
    s.od.config.initial_backoff = "100ms".into();
    s.od.config.max_backoff = "300ms".into();
    let failing = Arc::new(AtomicBool::new(true));
    let slow = new_event_id();
    let slow_next = new_event_id();
    let (sid, flag) = (slow.clone(), failing.clone());
    s.rx.set_script(move |r| {
        if r.event_id.as_deref() == Some(&sid) && flag.load(Ordering::SeqCst) {
            Reply::status(503)
        } else {
            Reply::ok()
        }
    });
    // One event before it, so that the committed offset can reach the slow one.
    s.send("first", &new_event_id(), &json!({"i": "first"})).await;
    let (_, slow_offset) = s.send("slow-key", &slow, &json!({"i": "slow"})).await;
    let mut others = Vec::new();
    for i in 0..OTHERS {
        let id = new_event_id();
        s.send(&format!("key-{i}"), &id, &json!({"i": i})).await;
        others.push(id);
        if i == OTHERS / 2 {
            s.send("slow-key", &slow_next, &json!({"i": "slow-next"})).await;
        }
    }
    s.od.start();
    s.od.wait_for_assignment().await;
    s.od.wait_until(
        "every other key's event to be answered, and the failing one retried twice",
        HANDLED_TIMEOUT,
        || others.iter().all(|id| s.rx.answered_ok(id)) && s.rx.handler_call_count(&slow) >= 3,
    )
    .await;
    assert!(!s.rx.answered_ok(&slow));
    // Committed offsets while it keeps failing.
    let mut samples = Vec::new();
    for _ in 0..20 {
        if let Some(c) = s.committed(0) {
            assert!(c <= slow_offset, "committed offset {c} passed the retrying event at {slow_offset}");
            samples.push(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(samples.last().copied(), Some(slow_offset), "the offsets before the retrying event should be committed");
    assert_eq!(s.rx.handler_call_count(&slow_next), 0, "the same key's next event must wait for the retrying one");
    let failures = s.rx.handler_call_count(&slow);
    failing.store(false, Ordering::SeqCst);
    s.od.wait_until("the slow key's events to succeed", HANDLED_TIMEOUT, || {
        s.rx.answered_ok(&slow) && s.rx.answered_ok(&slow_next)
    })
    .await;
    s.wait_committed_end().await;
    s.od.stop();
    eprintln!("slow event failed {failures} times; committed offsets meanwhile: {samples:?}");

    let slow_ok = s.rx.handler_calls(&slow).into_iter().find(|c| c.effective()).expect("slow succeeded");
    let next_call = &s.rx.handler_calls(&slow_next)[0];
    assert!(next_call.started >= slow_ok.answered.unwrap(), "same-key order broken");
    for id in &others {
        assert_eq!(s.rx.handler_call_count(id), 1);
    }
    assert_eq!(s.od.store_get(&slow).state, "done");
}

/// Result of [`kill_during_call`].
struct Uncertain {
    s: Setup,
    event: String,
    event_offset: i64,
    before: String,
    after: String,
}

/// Starts outboxd with the handler TOML from `handler_extra` (given the receiver), lets
/// the receiver hold the call for one event, SIGKILLs outboxd while that call is in
/// flight, checks that the store says `claimed` (outcome unknown), answers lookups with
/// `lookup_status`, restarts outboxd and waits until the committed offsets reach the
/// end.
async fn kill_during_call(
    prefix: &str,
    handler_extra: impl FnOnce(&Receiver) -> String,
    lookup_status: u16,
) -> Uncertain {
    let mut s = setup(prefix, 1).await;
    s.od.config.handler_extra = handler_extra(&s.rx);
    s.od.config.handler_timeout = "120s".into();
    // Static membership: the restarted process gets the partition back at once.
    s.od.config.kafka_options.insert("group.instance.id".into(), format!("{prefix}-static"));
    let hold = Arc::new(AtomicBool::new(true));
    let event = new_event_id();
    let before = new_event_id();
    let after = new_event_id();
    let (eid, h) = (event.clone(), hold.clone());
    s.rx.set_script(move |r| match (r.kind.as_str(), r.event_id.as_deref() == Some(&eid)) {
        ("events", true) => Reply::ok().hold(&h),
        ("lookup", _) => Reply::status(lookup_status),
        _ => Reply::ok(),
    });
    s.send("a-0", &before, &json!({"n": 0})).await;
    let (_, event_offset) = s.send("a-1", &event, &json!({"n": 1, "charge": "10.00"})).await;
    s.send("a-2", &after, &json!({"n": 2})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.od.wait_until("the held call to be in flight and the others answered", HANDLED_TIMEOUT, || {
        s.rx.handler_calls(&event).iter().any(|c| c.in_flight())
            && s.rx.answered_ok(&before)
            && s.rx.answered_ok(&after)
    })
    .await;
    // Let the others' completions become durable; the held call stays in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        s.rx.handler_calls(&event).iter().any(|c| c.in_flight()),
        "the held call must still be in flight at the kill"
    );
    s.od.kill();
    harness::wait_until("the receiver to see the held call's connection dropped", Duration::from_secs(10), || {
        s.rx.handler_calls(&event).iter().all(|c| !c.in_flight())
    })
    .await;
    let r = s.od.store_get(&event);
    assert_eq!((r.state.as_str(), r.attempts), ("claimed", 1), "the killed event's outcome is unknown: {r:?}");
    hold.store(false, Ordering::SeqCst);
    s.od.start();
    s.od.wait_for_assignment().await;
    s.wait_committed_end().await;
    Uncertain { s, event, event_offset, before, after }
}

fn verify_toml(rx: &Receiver) -> String {
    format!("on_uncertain = \"verify\"\n[handlers.verify]\nurl = {}\nmethod = \"GET\"\n", json!(rx.lookup_url()))
}

/// on_uncertain = "verify": the lookup says the earlier attempt happened, so the event
/// is recorded done without calling the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_event_is_verified_not_reexecuted() {
    let mut u = kill_during_call("verify-200", verify_toml, 200).await;
    u.s.od.stop();
    let calls = u.s.rx.handler_calls(&u.event);
    assert_eq!(calls.len(), 1, "a verified event must not be executed again: {calls:#?}");
    let lookups = u.s.rx.lookups(&u.event);
    assert!(!lookups.is_empty(), "the lookup was never asked");
    assert_eq!(lookups[0].method, "GET");
    assert_eq!(lookups[0].path, format!("/lookup/{}", u.event));
    assert_eq!(lookups[0].header("Idempotency-Key"), Some(u.event.as_str()));
    let r = u.s.od.store_get(&u.event);
    assert_eq!(r.state, "done", "{r:?}");
    assert!(r.outcome.as_deref().is_some_and(|o| o.starts_with("verified")), "{r:?}");
    assert!(logged(&u.s.od, "uncertain event verified as done"));
    for id in [&u.before, &u.after] {
        assert_eq!(u.s.rx.handler_call_count(id), 1, "done before the kill: not again");
        assert!(u.s.rx.lookups(id).is_empty(), "only uncertain events are looked up");
    }
}

/// on_uncertain = "verify" and the lookup answers 404: the event runs again, with the
/// same idempotency key and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_event_with_lookup_404_runs_again() {
    let mut u = kill_during_call("verify-404", verify_toml, 404).await;
    u.s.od.stop();
    let calls = u.s.rx.handler_calls(&u.event);
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(calls[1].header("Idempotency-Key"), Some(u.event.as_str()));
    assert_eq!(calls[1].body_hash, calls[0].body_hash, "same body");
    let lookups = u.s.rx.lookups(&u.event);
    assert_eq!(lookups.len(), 1, "{lookups:#?}");
    assert!(lookups[0].started <= calls[1].started, "looked up before running again");
    let r = u.s.od.store_get(&u.event);
    assert_eq!((r.state.as_str(), r.outcome.as_deref(), r.attempts), ("done", Some("http 200"), 2), "{r:?}");
    assert!(logged(&u.s.od, "verify found no trace"));
}

/// on_uncertain = "park": the event is not run again; it is recorded `parked`, sent to
/// the dead-letter topic, its offset moves on, and a person resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_event_is_parked_for_a_person() {
    let kafka = Kafka::connect();
    let dlq = kafka.create_topic(&unique_name("park-dlq"), 1, &[]).await;
    let dlq2 = dlq.clone();
    let mut u =
        kill_during_call("park", move |_| format!("on_uncertain = \"park\"\n{}", dead_letter_toml(&dlq2)), 500).await;
    u.s.od.stop();
    assert_eq!(u.s.rx.handler_calls(&u.event).len(), 1, "a parked event must not be executed again");
    assert!(u.s.rx.lookups(&u.event).is_empty());
    let parked = u.s.od.store_list(Some("parked"), 100);
    assert_eq!(parked.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>(), vec![u.event.as_str()], "{parked:#?}");
    assert!(parked[0].reason.as_deref().is_some_and(|t| t.contains("parked")), "{parked:#?}");

    let letters = u.s.kafka.read_topic(&dlq, DLQ_READ_TIMEOUT);
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!(header(&letters[0], "id"), Some(u.event.as_bytes()));
    assert_eq!(letters[0].header("outboxd.source.offset"), Some(u.event_offset.to_string()));
    assert!(letters[0].header("outboxd.error").is_some_and(|e| e.contains("parked")), "{:?}", letters[0].headers);
    let r = cli::get(&u.s.od, &u.event);
    assert_eq!(text(&r, "dead_letter"), format!("{dlq}/0@{}", letters[0].offset), "{r}");
    let exported = cli::export(&u.s.od, Some("parked"), None);
    assert_eq!(exported.len(), 1);
    assert_eq!(exported[0]["message"]["offset"], u.event_offset, "{}", exported[0]);

    // The person decides it happened.
    let out = cli::store_cmd(&u.s.od, &["resolve", &u.event, "--done"]);
    assert!(out.status.success(), "{}", describe(&out));
    let r = u.s.od.store_get(&u.event);
    assert_eq!(r.state, "done", "{r:?}");
    assert_eq!(r.outcome.as_deref(), Some("resolved by hand: done"));
    assert!(u.s.od.store_list(Some("parked"), 100).is_empty());
    // Resolving again is refused: it is no longer parked or dead.
    let out = cli::store_cmd(&u.s.od, &["resolve", &u.event, "--done"]);
    assert!(!out.status.success(), "resolving a done event should fail: {}", describe(&out));
}

/// Dead events run again from the stored copy with `outboxd store retry`, through the
/// same handler: the receiver gets the same request; events that fail again are
/// reported and the command exits non-zero; a redelivery afterwards is suppressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_retry_reruns_dead_events_from_the_stored_copy() {
    let mut s = setup("store-retry", 2).await;
    let broken = Arc::new(AtomicBool::new(true));
    let d1 = new_event_id();
    let d2 = new_event_id();
    let d3 = new_event_id();
    let good = new_event_id();
    let (a, b, c, flag) = (d1.clone(), d2.clone(), d3.clone(), broken.clone());
    s.rx.set_script(move |r| {
        let id = r.event_id.as_deref().unwrap_or("");
        if id == c || ((id == a || id == b) && flag.load(Ordering::SeqCst)) {
            Reply::status(400)
        } else {
            Reply::ok()
        }
    });
    s.send("k-1", &d1, &json!({"mail": 1})).await;
    s.send("k-2", &d2, &json!({"mail": 2})).await;
    s.send("k-3", &d3, &json!({"mail": 3})).await;
    s.send("k-4", &good, &json!({"mail": 4})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.wait_committed_end().await;
    s.od.stop();
    for id in [&d1, &d2, &d3] {
        assert_eq!(s.od.store_get(id).state, "dead");
    }

    broken.store(false, Ordering::SeqCst);
    let out = cli::store_cmd(&s.od, &["retry", &d1]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout.contains(&format!("{d1}: done")), "{stdout}");
    let calls = s.rx.handler_calls(&d1);
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(calls[1].path, calls[0].path);
    assert_eq!(calls[1].body_hash, calls[0].body_hash);
    for h in ["Idempotency-Key", "Outbox-Event-Type", "Outbox-Aggregate-Id", "Content-Type"] {
        assert_eq!(calls[1].header(h), calls[0].header(h), "header {h}");
    }
    assert_eq!(calls[1].header("Outbox-Aggregate-Id"), Some("k-1"));

    // All dead of the topic: d2 succeeds, d3 fails again → non-zero exit, both reported.
    let out = cli::store_cmd(&s.od, &["retry", "--all-dead", "--topic", &s.topic]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "an event failed again, so the command must fail: {}", describe(&out));
    assert!(stdout.contains(&format!("{d2}: done")), "{stdout}");
    assert!(stdout.contains(&format!("{d3}: dead again")), "{stdout}");
    assert!(stdout.contains("1 done, 1 failed"), "{stdout}");
    assert_eq!(s.od.store_get(&d2).state, "done");
    let r = s.od.store_get(&d3);
    assert_eq!(r.state, "dead");
    assert!(r.reason.as_deref().is_some_and(|t| t.contains("http 400")), "{r:?}");
    assert_eq!(cli::export(&s.od, Some("dead"), None).len(), 1, "d3 keeps its stored copy");
    // Another topic: nothing to do.
    let out = cli::store_cmd(&s.od, &["retry", "--all-dead", "--topic", "no-such-topic"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("0 done, 0 failed"),
        "{}",
        describe(&out)
    );
    // A done event cannot be retried.
    let out = cli::store_cmd(&s.od, &["retry", &good]);
    assert!(!out.status.success(), "{}", describe(&out));

    // d1 delivered again (Debezium replay): done by `store retry`, so suppressed.
    s.send("k-1", &d1, &json!({"mail": 1})).await;
    s.od.start();
    s.od.wait_for_assignment().await;
    s.wait_committed_end().await;
    s.od.stop();
    assert_eq!(s.rx.handler_call_count(&d1), 2, "done by `store retry`: the redelivery must not run it");
    assert!(s.od.store_get(&d1).duplicates >= 1);
    assert_eq!(s.rx.handler_call_count(&good), 1);
}

/// How a bad-input case must end.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ends {
    /// Handled (the receiver got it) and recorded done under this id.
    Done,
    /// Recorded dead with a reason and dead-lettered, without a handler call:
    /// under `undecodable/…` when `id` is `None`, else under that event id.
    Dead,
}

struct Case {
    name: &'static str,
    key: Option<Vec<u8>>,
    headers: Vec<(&'static str, Option<Vec<u8>>)>,
    value: Option<Vec<u8>>,
    ends: Ends,
    /// The event id outboxd will decode (`None`: it cannot decode one).
    id: Option<String>,
}

fn case(
    name: &'static str,
    key: Option<&[u8]>,
    headers: Vec<(&'static str, Option<Vec<u8>>)>,
    value: Option<Vec<u8>>,
) -> Case {
    Case { name, key: key.map(<[u8]>::to_vec), headers, value, ends: Ends::Dead, id: None }
}

impl Case {
    fn done(mut self, id: &str) -> Case {
        self.ends = Ends::Done;
        self.id = Some(id.to_string());
        self
    }

    /// Decoded, but the handler refuses it before any call.
    fn refused(mut self, id: &str) -> Case {
        self.ends = Ends::Dead;
        self.id = Some(id.to_string());
        self
    }
}

const BIG: usize = 10 * 1024 * 1024;

fn bad_inputs() -> Vec<Case> {
    let id = |s: &str| Some(s.as_bytes().to_vec());
    let u = || new_event_id();
    let mut cases = Vec::new();
    let (a, b, c, d, e, f, g, h, i, j, k) = (u(), u(), u(), u(), u(), u(), u(), u(), u(), u(), u());
    cases.push(case("id header is a JSON number", Some(b"k"), vec![("id", id("12345678"))], Some(b"{}".to_vec())));
    let n = format!("num-{}", &a[..8]);
    cases.pop();
    cases.push(case("id header is a bare number", Some(b"k"), vec![("id", id(&n))], Some(b"{}".to_vec())).done(&n));
    let obj = format!(r#"{{"not":"an id","n":"{}"}}"#, &b[..8]);
    cases.push(case("id header is a JSON object", Some(b"k"), vec![("id", id(&obj))], Some(b"{}".to_vec())).done(&obj));
    let env =
        format!(r#"{{"schema":{{"type":"int64"}},"payload":{}}}"#, 9_000_000_000u64 + u64::from(rand::random::<u16>()));
    let env_id = serde_json::from_str::<Value>(&env).unwrap()["payload"].to_string();
    cases.push(
        case("id header is an envelope with a number", Some(b"k"), vec![("id", id(&env))], Some(b"{}".to_vec()))
            .done(&env_id),
    );
    cases.push(case("id header has a null value", Some(b"k"), vec![("id", None)], Some(b"{}".to_vec())));
    cases.push(case("id header is empty", Some(b"k"), vec![("id", Some(Vec::new()))], Some(b"{}".to_vec())));
    cases.push(case(
        "id header repeated with different values",
        Some(b"k"),
        vec![("id", id(&c)), ("id", id(&d))],
        Some(b"{}".to_vec()),
    ));
    cases.push(
        case(
            "id header repeated with the same value",
            Some(b"k"),
            vec![("id", id(&e)), ("id", id(&e))],
            Some(b"{}".to_vec()),
        )
        .done(&e),
    );
    cases.push(case(
        "id header is not UTF-8",
        Some(b"k"),
        vec![("id", Some(vec![0xff, 0xfe, b'x']))],
        Some(b"{}".to_vec()),
    ));
    cases.push(case("id header is 600 bytes", Some(b"k"), vec![("id", Some(vec![b'x'; 600]))], Some(b"{}".to_vec())));
    cases.push(case("no headers at all", Some(b"k"), vec![], Some(b"{}".to_vec())));
    cases.push(
        case(
            "eventType header is binary",
            Some(b"k"),
            vec![("id", id(&f)), ("eventType", Some(vec![0, 0xff, 1, 0x80]))],
            Some(b"{}".to_vec()),
        )
        .done(&f),
    );
    cases.push(
        case(
            "value is binary garbage",
            Some(b"k"),
            vec![("id", id(&g))],
            Some((0..=255u8).rev().cycle().take(4096).collect()),
        )
        .done(&g),
    );
    cases.push(case("value is 10 MB", Some(b"big"), vec![("id", id(&h))], Some(vec![b'a'; BIG])).done(&h));
    cases.push(
        case(
            "key is not UTF-8",
            Some(&[0xc3, 0x28, 0xff, b'/', b'.', b'.']),
            vec![("id", id(&i))],
            Some(b"{}".to_vec()),
        )
        .done(&i),
    );
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    cases.push(
        case("value is JSON nested 10,000 deep", Some(b"k"), vec![("id", id(&j))], Some(deep.clone().into_bytes()))
            .done(&j),
    );
    let deep_env = json!({"schema": {"type": "string", "name": "io.debezium.data.Json"}, "payload": deep}).to_string();
    cases.push(case(
        "embedded Debezium JSON nested 10,000 deep",
        Some(b"k"),
        vec![("id", id(&u()))],
        Some(deep_env.into_bytes()),
    ));
    let broken = r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{not json"}"#;
    cases.push(case(
        "embedded Debezium JSON is broken",
        Some(b"k"),
        vec![("id", id(&u()))],
        Some(broken.as_bytes().to_vec()),
    ));
    cases.push(case("null value (tombstone)", Some(b"k"), vec![("id", id(&k))], None).done(&k));
    let trav = u();
    cases.push(
        case("key tries path traversal", Some(b"../../admin?x=1#frag"), vec![("id", id(&trav))], Some(b"{}".to_vec()))
            .done(&trav),
    );
    let crlf = format!("{}\r\nX-Injected: yes", &u()[..8]);
    // Without the Idempotency-Key header a re-execution would not be idempotent, and a
    // header cannot carry CR LF: refused (dead-lettered), never sent without the key.
    cases.push(case("id with CR LF", Some(b"k"), vec![("id", id(&crlf))], Some(b"{}".to_vec())).refused(&crlf));
    cases
}

/// Bad input of every kind on one partition: each message ends done or dead (with a
/// reason, on the dead-letter topic), nothing crashes, and the offsets reach the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_never_stops_the_service() {
    let kafka = Kafka::connect();
    // The broker's default limit is ~1 MB per message; this topic takes the 10 MB one.
    let topic = kafka.create_topic(&unique_name("bad-input"), 1, &[("max.message.bytes", "12000000")]).await;
    let dlq = kafka.create_topic(&unique_name("bad-input-dlq"), 1, &[]).await;
    let rx = Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&topic], &rx);
    od.config.handler_extra = dead_letter_toml(&dlq);
    let producer = Producer::new(kafka.brokers(), &[("message.max.bytes", "12000000")]);
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    od.start();
    od.wait_for_assignment().await;

    let cases = bad_inputs();
    let mut at: Vec<i64> = Vec::new();
    for c in &cases {
        let headers: Vec<(&str, Option<&[u8]>)> = c.headers.iter().map(|(k, v)| (*k, v.as_deref())).collect();
        let (_, off) = producer.send_raw(&topic, Some(0), c.key.as_deref(), &headers, c.value.as_deref()).await;
        at.push(off);
    }
    let sentinel = new_event_id();
    producer.send_event(&topic, "sentinel", &sentinel, Some("Test"), &json!({"last": true})).await;
    od.wait_until("the sentinel after all bad input", Duration::from_secs(120), || rx.answered_ok(&sentinel)).await;
    od.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    od.assert_alive();
    od.stop();
    logs::assert_no_panic(&od);

    let records = cli::all_records(&od);
    let letters = kafka.read_topic(&dlq, DLQ_READ_TIMEOUT);
    let letter_at: HashMap<i64, &Message> = letters
        .iter()
        .filter_map(|m| m.header("outboxd.source.offset").and_then(|o| o.parse().ok()).map(|o| (o, m)))
        .collect();
    let mut problems = Vec::new();
    let mut dead = 0;
    for (c, off) in cases.iter().zip(&at) {
        match c.ends {
            Ends::Done => {
                let id = c.id.as_deref().unwrap();
                match records.get(id) {
                    Some(r) if r["state"] == "done" => {}
                    other => problems.push(format!("{}: expected done under id {id:?}, record {other:?}", c.name)),
                }
                let calls: Vec<_> = rx
                    .calls()
                    .into_iter()
                    .filter(|call| call.is_handler_call() && call.event_id.as_deref() == Some(id))
                    .collect();
                if calls.len() != 1 {
                    problems.push(format!("{}: expected one handler call, got {}", c.name, calls.len()));
                }
            }
            Ends::Dead => {
                dead += 1;
                let id = c.id.clone().unwrap_or_else(|| format!("undecodable/{topic}/0/{off}"));
                if rx.calls().iter().any(|call| call.is_handler_call() && call.event_id.as_deref() == Some(&id)) {
                    problems.push(format!("{}: the handler was called for an event that had to be refused", c.name));
                }
                match records.get(&id) {
                    Some(r) if r["state"] == "dead" && r["reason"].as_str().is_some_and(|t| !t.trim().is_empty()) => {
                        eprintln!("{}: dead: {}", c.name, r["reason"]);
                        if !r["dead_letter"].as_str().is_some_and(|p| p.starts_with(&dlq)) {
                            problems.push(format!("{}: dead record without its dead-letter position: {r}", c.name));
                        }
                    }
                    other => {
                        problems.push(format!("{}: expected a dead record {id} with a reason, got {other:?}", c.name))
                    }
                }
                match letter_at.get(off) {
                    Some(m) => {
                        if m.value != c.value || m.key != c.key {
                            problems.push(format!("{}: dead letter does not carry the original key/value", c.name));
                        }
                    }
                    None => problems.push(format!("{}: no dead letter for offset {off}", c.name)),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(letters.len(), dead, "one dead letter per undecodable or refused message");

    // What the receiver got for some of them.
    let calls = rx.calls();
    let by_name = |name: &str| {
        let c = cases.iter().find(|c| c.name == name).unwrap();
        calls.iter().find(|call| call.event_id.as_deref() == c.id.as_deref()).cloned().expect("call")
    };
    let big = by_name("value is 10 MB");
    assert_eq!(big.body_len, BIG, "the 10 MB payload arrives whole");
    let garbage = by_name("value is binary garbage");
    assert_eq!(garbage.header("Content-Type"), Some("application/octet-stream"));
    let trav = by_name("key tries path traversal");
    assert!(
        trav.path.starts_with("/events/") && !trav.path.contains("/admin"),
        "key escaped its path segment: {}",
        trav.path
    );
    assert!(calls.iter().all(|call| call.header("X-Injected").is_none()), "a CR LF in an id injected a header");
    let crlf = cases.iter().find(|c| c.name == "id with CR LF").and_then(|c| c.id.clone()).unwrap();
    let reason = records[&crlf]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("Idempotency-Key"), "the refusal says why: {reason}");
    let tomb = by_name("null value (tombstone)");
    assert_eq!(tomb.body_len, 0);
}

/// A 10 MB message that cannot be decoded (more than librdkafka's default 1 MB) reaches
/// a dead-letter topic that accepts 12 MB messages like any other, and the partition
/// moves on (invariant 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_undecodable_message_is_dead_lettered() {
    let kafka = Kafka::connect();
    let big_topic = [("max.message.bytes", "12000000")];
    let topic = kafka.create_topic(&unique_name("big-src"), 1, &big_topic).await;
    let dlq = kafka.create_topic(&unique_name("big-dlq"), 1, &big_topic).await;
    let rx = Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&topic], &rx);
    od.config.handler_extra = dead_letter_toml(&dlq);
    let producer = Producer::new(kafka.brokers(), &[("message.max.bytes", "12000000")]);
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    let value = vec![b'z'; BIG];
    let (_, off) = producer.send_raw(&topic, Some(0), Some(b"k"), &[("id", Some(b""))], Some(&value)).await;
    let after = new_event_id();
    producer.send_event(&topic, "k2", &after, Some("Test"), &json!({})).await;
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the event after the big one", HANDLED_TIMEOUT, || rx.answered_ok(&after)).await;
    let stalled = || {
        format!(
            "committed offsets did not reach the end ({}); dead-letter errors logged: {:?}",
            offsets.describe(),
            log_lines(&od, "dead-letter produce failed").into_iter().take(3).collect::<Vec<_>>()
        )
    };
    let deadline = Instant::now() + HANDLED_TIMEOUT;
    while !offsets.reached_end() {
        assert!(Instant::now() < deadline, "{}", stalled());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    od.stop();
    let letters = kafka.read_topic(&dlq, DLQ_READ_TIMEOUT);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].value.as_ref().map(Vec::len), Some(BIG));
    let r = cli::get(&od, &format!("undecodable/{topic}/0/{off}"));
    assert_eq!(text(&r, "state"), "dead", "{r}");
}
