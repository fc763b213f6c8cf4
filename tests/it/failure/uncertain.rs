//! Unknown outcomes (outboxd killed during a call) under the `verify` and `park`
//! policies, and dead events run again from their stored copy by `outboxd store retry`.

use super::*;

/// Result of [`kill_during_call`].
struct Uncertain {
    s: Scenario,
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
    let mut s = Scenario::new(prefix, 1).await;
    s.od.config.handler_extra = handler_extra(&s.receiver);
    s.od.config.handler_timeout = "120s".into();
    // Static membership: the restarted process gets the partition back at once.
    s.od.config.kafka_options.insert("group.instance.id".into(), format!("{prefix}-static"));
    let hold = Arc::new(AtomicBool::new(true));
    let event = new_event_id();
    let before = new_event_id();
    let after = new_event_id();
    let (eid, h) = (event.clone(), hold.clone());
    s.receiver.set_script(move |r| match (r.kind.as_str(), r.event_id.as_deref() == Some(&eid)) {
        ("events", true) => Reply::ok().hold(&h),
        ("lookup", _) => Reply::status(lookup_status),
        _ => Reply::ok(),
    });
    send(&s, "a-0", &before, &json!({"n": 0})).await;
    let (_, event_offset) = send(&s, "a-1", &event, &json!({"n": 1, "charge": "10.00"})).await;
    send(&s, "a-2", &after, &json!({"n": 2})).await;
    s.run().await;
    s.od.wait_until("the held call to be in flight and the others answered", HANDLED_TIMEOUT, || {
        s.receiver.handler_calls(&event).iter().any(|c| c.in_flight())
            && s.receiver.answered_ok(&before)
            && s.receiver.answered_ok(&after)
    })
    .await;
    // Let the others' completions become durable; the held call stays in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        s.receiver.handler_calls(&event).iter().any(|c| c.in_flight()),
        "the held call must still be in flight at the kill"
    );
    s.od.kill();
    harness::wait_until("the receiver to see the held call's connection dropped", Duration::from_secs(10), || {
        s.receiver.handler_calls(&event).iter().all(|c| !c.in_flight())
    })
    .await;
    let r = s.od.store_get(&event);
    assert_eq!((r.state.as_str(), r.attempts), ("claimed", 1), "the killed event's outcome is unknown: {r:?}");
    hold.store(false, Ordering::SeqCst);
    s.run().await;
    wait_committed_end(&mut s).await;
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
    let calls = u.s.receiver.handler_calls(&u.event);
    assert_eq!(calls.len(), 1, "a verified event must not be executed again: {calls:#?}");
    let lookups = u.s.receiver.lookups(&u.event);
    assert!(!lookups.is_empty(), "the lookup was never asked");
    assert_eq!(lookups[0].method, "GET");
    assert_eq!(lookups[0].path, format!("/lookup/{}", u.event));
    assert_eq!(lookups[0].header("Idempotency-Key"), Some(u.event.as_str()));
    let r = u.s.od.store_get(&u.event);
    assert_eq!(r.state, "done", "{r:?}");
    assert!(r.outcome.as_deref().is_some_and(|o| o.starts_with("verified")), "{r:?}");
    assert!(logged(&u.s.od, "uncertain event verified as done"));
    for id in [&u.before, &u.after] {
        assert_eq!(u.s.receiver.handler_call_count(id), 1, "done before the kill: not again");
        assert!(u.s.receiver.lookups(id).is_empty(), "only uncertain events are looked up");
    }
}

/// on_uncertain = "verify" and the lookup answers 404: the event runs again, with the
/// same idempotency key and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_event_with_lookup_404_runs_again() {
    let mut u = kill_during_call("verify-404", verify_toml, 404).await;
    u.s.od.stop();
    let calls = u.s.receiver.handler_calls(&u.event);
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(calls[1].header("Idempotency-Key"), Some(u.event.as_str()));
    assert_eq!(calls[1].body_hash, calls[0].body_hash, "same body");
    let lookups = u.s.receiver.lookups(&u.event);
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
    assert_eq!(u.s.receiver.handler_calls(&u.event).len(), 1, "a parked event must not be executed again");
    assert!(u.s.receiver.lookups(&u.event).is_empty());
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
    let mut s = Scenario::new("store-retry", 2).await;
    let broken = Arc::new(AtomicBool::new(true));
    let d1 = new_event_id();
    let d2 = new_event_id();
    let d3 = new_event_id();
    let good = new_event_id();
    let (a, b, c, flag) = (d1.clone(), d2.clone(), d3.clone(), broken.clone());
    s.receiver.set_script(move |r| {
        let id = r.event_id.as_deref().unwrap_or("");
        if id == c || ((id == a || id == b) && flag.load(Ordering::SeqCst)) {
            Reply::status(400)
        } else {
            Reply::ok()
        }
    });
    send(&s, "k-1", &d1, &json!({"mail": 1})).await;
    send(&s, "k-2", &d2, &json!({"mail": 2})).await;
    send(&s, "k-3", &d3, &json!({"mail": 3})).await;
    send(&s, "k-4", &good, &json!({"mail": 4})).await;
    s.run().await;
    wait_committed_end(&mut s).await;
    s.od.stop();
    for id in [&d1, &d2, &d3] {
        assert_eq!(s.od.store_get(id).state, "dead");
    }

    broken.store(false, Ordering::SeqCst);
    let out = cli::store_cmd(&s.od, &["retry", &d1]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout.contains(&format!("{d1}: done")), "{stdout}");
    let calls = s.receiver.handler_calls(&d1);
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
    send(&s, "k-1", &d1, &json!({"mail": 1})).await;
    s.run().await;
    wait_committed_end(&mut s).await;
    s.od.stop();
    assert_eq!(s.receiver.handler_call_count(&d1), 2, "done by `store retry`: the redelivery must not run it");
    assert_eq!(s.od.store_get(&d1).state, "done");
    let stats = s.od.store_stats();
    assert!(stats["duplicates_suppressed"].as_u64().is_some_and(|n| n >= 1), "the redelivery is counted: {stats}");
    assert_eq!(s.receiver.handler_call_count(&good), 1);
}
