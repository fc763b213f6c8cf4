//! Handler failures: permanent ones dead-lettered before the offset moves, retryable
//! ones retried (bounded by attempts and `max_elapsed`, paced by `Retry-After`), status
//! rules, and other keys going on meanwhile.

use super::*;

/// A permanently failing event is produced to the dead-letter topic, and only after the
/// broker acknowledged that does its offset move: while the dead-letter topic refuses
/// the message (its `message.timestamp.before.max.ms` is 0, so the broker answers
/// INVALID_TIMESTAMP to every record, and outboxd keeps trying), the committed offset
/// stays at the failed event although a later event of another key is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_goes_to_dead_letter_topic_before_offset_moves() {
    let mut s = Scenario::new("dlq-src", 1).await;
    let refuse = [("message.timestamp.before.max.ms", "0")];
    let dlq = s.kafka.create_topic(&unique_name("dlq"), 1, &refuse).await;
    s.od.config.handler_extra = dead_letter_toml(&dlq);
    let bad = new_event_id();
    let after = new_event_id();
    let bad_for_script = bad.clone();
    s.receiver.set_script(move |r| {
        if r.event_id.as_deref() == Some(&bad_for_script) {
            Reply::status(422)
        } else {
            Reply::ok()
        }
    });

    let first = new_event_id();
    send(&s, "acct-0", &first, &json!({"n": 0})).await;
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
    send(&s, "acct-2", &after, &json!({"n": 2})).await;

    s.run().await;
    s.od.wait_until("the later event of another key to be answered", HANDLED_TIMEOUT, || {
        s.receiver.answered_ok(&after)
    })
    .await;
    s.od.wait_for("outboxd to report the refused dead letter", HANDLED_TIMEOUT, async |od| {
        if logged(od, "dead-letter produce failed") {
            Ok(())
        } else {
            Err("not reported yet")
        }
    })
    .await;
    // The dead-letter topic cannot take the message: the committed offset must wait at
    // the failed event (it may reach it, never pass it) although everything else is done.
    let mut samples = Vec::new();
    for _ in 0..25 {
        s.od.assert_alive();
        if let Some(c) = committed(&s, partition) {
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
    assert_eq!(s.receiver.handler_call_count(&bad), 1, "a permanent failure (422) must not be retried");
    assert!(s.kafka.read_topic(&dlq, DLQ_READ_TIMEOUT).is_empty(), "the premise: no dead letter got through yet");

    // Let the dead-letter topic take it: the dead letter is produced, then the offset moves.
    s.kafka.alter_topic_config(&dlq, &[("message.timestamp.before.max.ms", "9223372036854775807")]).await;
    wait_committed_end(&mut s).await;
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
    let mut s = Scenario::new("retry-ok", 1).await;
    // The event's own budget, without the circuit.
    s.od.config.circuit_extra = harness::daemon::NO_CIRCUIT.into();
    s.od.config.max_attempts = 5;
    s.od.config.initial_backoff = "50ms".into();
    s.od.config.max_backoff = "200ms".into();
    let id = new_event_id();
    let sid = id.clone();
    s.receiver.set_script(move |r| {
        if r.event_id.as_deref() == Some(&sid) && r.nth <= FAILURES {
            Reply::status(503)
        } else {
            Reply::ok()
        }
    });
    send(&s, "user-1", &id, &json!({"mail": "welcome"})).await;
    s.run().await;
    s.od.wait_until("the event to succeed", HANDLED_TIMEOUT, || s.receiver.answered_ok(&id)).await;
    wait_committed_end(&mut s).await;
    s.od.stop();

    let calls = s.receiver.handler_calls(&id);
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
    let mut s = Scenario::new("retry-dead", 1).await;
    // The event's own budget, without the circuit.
    s.od.config.circuit_extra = harness::daemon::NO_CIRCUIT.into();
    // About the dead record; the key's next event runs (the `hold` default would hold it).
    s.od.config.handler_extra = "on_dead = \"continue\"\n".into();
    s.od.config.max_attempts = 3;
    s.od.config.initial_backoff = "50ms".into();
    s.od.config.max_backoff = "200ms".into();
    let id = new_event_id();
    let ok = new_event_id();
    let sid = id.clone();
    s.receiver.set_script(move |r| if r.event_id.as_deref() == Some(&sid) { Reply::status(503) } else { Reply::ok() });
    let (_, offset) = send(&s, "k-1", &id, &json!({"v": 1})).await;
    send(&s, "k-1", &ok, &json!({"v": 2})).await;
    s.run().await;
    s.od.wait_until("the next event of the key", HANDLED_TIMEOUT, || s.receiver.answered_ok(&ok)).await;
    wait_committed_end(&mut s).await;
    s.od.stop();

    assert_eq!(s.receiver.handler_call_count(&id), 3, "exactly max_attempts calls");
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
    let mut s = Scenario::new("retry-elapsed", 1).await;
    // The event's own budget, without the circuit.
    s.od.config.circuit_extra = harness::daemon::NO_CIRCUIT.into();
    s.od.config.max_attempts = 1000;
    s.od.config.initial_backoff = "100ms".into();
    s.od.config.max_backoff = "300ms".into();
    s.od.config.retry_extra = "max_elapsed = \"2s\"\n".into();
    let id = new_event_id();
    s.receiver.set_script(|_| Reply::status(500));
    send(&s, "k", &id, &json!({})).await;
    s.run().await;
    wait_committed_end(&mut s).await;
    s.od.stop();
    let calls = s.receiver.handler_calls(&id);
    assert!(calls.len() >= 2 && calls.len() < 1000, "retried, but stopped by max_elapsed: {} calls", calls.len());
    let span = calls.last().unwrap().started_at - calls[0].started_at;
    // Stopped by max_elapsed (2 s, plus one backoff and however late the machine ran the
    // last attempt), not by max_attempts: 1000 attempts up to 300 ms apart take minutes.
    assert!(span < Duration::from_secs(10), "calls went on for {span:?}, max_elapsed is 2s");
    let r = s.od.store_get(&id);
    assert_eq!(r.state, "dead", "{r:?}");
    assert!(r.reason.as_deref().is_some_and(|t| t.contains("gave up") && t.contains("http 500")), "{r:?}");
}

/// `Retry-After` is a lower bound on the pause before the next attempt (seconds and
/// HTTP-date forms), while without it the backoff would be far shorter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let mut s = Scenario::new("retry-after", 2).await;
    // The event's own budget, without the circuit.
    s.od.config.circuit_extra = harness::daemon::NO_CIRCUIT.into();
    s.od.config.max_attempts = 3;
    s.od.config.initial_backoff = "20ms".into();
    s.od.config.max_backoff = "50ms".into();
    let secs = new_event_id();
    let date = new_event_id();
    let plain = new_event_id();
    let (a, b, c) = (secs.clone(), date.clone(), plain.clone());
    s.receiver.set_script(move |r| {
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
    send(&s, "a", &secs, &json!({})).await;
    send(&s, "b", &date, &json!({})).await;
    send(&s, "c", &plain, &json!({})).await;
    s.run().await;
    s.od.wait_until("all three to succeed", HANDLED_TIMEOUT, || {
        [&secs, &date, &plain].iter().all(|id| s.receiver.answered_ok(id))
    })
    .await;
    wait_committed_end(&mut s).await;
    s.od.stop();

    let gap = |id: &str| {
        let calls = s.receiver.handler_calls(id);
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
    let mut s = Scenario::new("status-rules", 1).await;
    s.od.config.handler_extra = "success_on = [409]\nfail_on = [503]\nretry_on = [\"4xx\"]\n".into();
    s.od.config.max_attempts = 5;
    s.od.config.initial_backoff = "20ms".into();
    s.od.config.max_backoff = "50ms".into();
    let conflict = new_event_id(); // 409: default retry → success
    let unavailable = new_event_id(); // 503: default retry → permanent
    let not_found = new_event_id(); // 404 twice: default permanent → retry
    let (a, b, c) = (conflict.clone(), unavailable.clone(), not_found.clone());
    s.receiver.set_script(move |r| {
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
        send(&s, k, id, &json!({"k": k})).await;
    }
    s.run().await;
    wait_committed_end(&mut s).await;
    s.od.stop();

    assert_eq!(s.receiver.handler_call_count(&conflict), 1);
    let r = s.od.store_get(&conflict);
    assert_eq!((r.state.as_str(), r.outcome.as_deref()), ("done", Some("http 409")), "{r:?}");
    assert_eq!(s.receiver.handler_call_count(&unavailable), 1, "503 is in fail_on: no retry");
    let r = s.od.store_get(&unavailable);
    assert_eq!(r.state, "dead", "{r:?}");
    assert!(r.reason.as_deref().is_some_and(|t| t.contains("http 503")), "{r:?}");
    assert_eq!(s.receiver.handler_call_count(&not_found), 3, "404 is retried under retry_on = [\"4xx\"]");
    let r = s.od.store_get(&not_found);
    assert_eq!((r.state.as_str(), r.outcome.as_deref(), r.attempts), ("done", Some("http 200"), 3), "{r:?}");
}

/// One key's event keeps failing for a while: the other keys of the same partition are
/// handled meanwhile, a later event of the same key waits, and the committed offset
/// never passes the retrying event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_event_does_not_stall_other_keys() {
    const OTHERS: usize = 30;
    let mut s = Scenario::new("no-stall", 1).await;
    s.od.config.max_attempts = 200;
    s.od.config.initial_backoff = "100ms".into();
    s.od.config.max_backoff = "300ms".into();
    let failing = Arc::new(AtomicBool::new(true));
    let slow = new_event_id();
    let slow_next = new_event_id();
    let (sid, flag) = (slow.clone(), failing.clone());
    s.receiver.set_script(move |r| {
        if r.event_id.as_deref() == Some(&sid) && flag.load(Ordering::SeqCst) {
            Reply::status(503)
        } else {
            Reply::ok()
        }
    });
    // One event before it, so that the committed offset can reach the slow one.
    send(&s, "first", &new_event_id(), &json!({"i": "first"})).await;
    let (_, slow_offset) = send(&s, "slow-key", &slow, &json!({"i": "slow"})).await;
    let mut others = Vec::new();
    for i in 0..OTHERS {
        let id = new_event_id();
        send(&s, &format!("key-{i}"), &id, &json!({"i": i})).await;
        others.push(id);
        if i == OTHERS / 2 {
            send(&s, "slow-key", &slow_next, &json!({"i": "slow-next"})).await;
        }
    }
    s.run().await;
    s.od.wait_until(
        "every other key's event to be answered, and the failing one retried twice",
        HANDLED_TIMEOUT,
        || others.iter().all(|id| s.receiver.answered_ok(id)) && s.receiver.handler_call_count(&slow) >= 3,
    )
    .await;
    assert!(!s.receiver.answered_ok(&slow));
    // Committed offsets while it keeps failing.
    let mut samples = Vec::new();
    for _ in 0..20 {
        if let Some(c) = committed(&s, 0) {
            assert!(c <= slow_offset, "committed offset {c} passed the retrying event at {slow_offset}");
            samples.push(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(samples.last().copied(), Some(slow_offset), "the offsets before the retrying event should be committed");
    assert_eq!(
        s.receiver.handler_call_count(&slow_next),
        0,
        "the same key's next event must wait for the retrying one"
    );
    let failures = s.receiver.handler_call_count(&slow);
    failing.store(false, Ordering::SeqCst);
    s.od.wait_until("the slow key's events to succeed", HANDLED_TIMEOUT, || {
        s.receiver.answered_ok(&slow) && s.receiver.answered_ok(&slow_next)
    })
    .await;
    wait_committed_end(&mut s).await;
    s.od.stop();
    eprintln!("slow event failed {failures} times; committed offsets meanwhile: {samples:?}");

    let slow_ok = s.receiver.handler_calls(&slow).into_iter().find(|c| c.effective()).expect("slow succeeded");
    let next_call = &s.receiver.handler_calls(&slow_next)[0];
    assert!(next_call.started >= slow_ok.answered.unwrap(), "same-key order broken");
    for id in &others {
        assert_eq!(s.receiver.handler_call_count(id), 1);
    }
    assert_eq!(s.od.store_get(&slow).state, "done");
}
