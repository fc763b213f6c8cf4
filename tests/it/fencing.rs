//! An instance that may have lost its partitions starts nothing of theirs: not
//! when its poll loop would starve behind calls that hold every permit, not when
//! the whole process was frozen past its session timeout, and a member fenced
//! by another with its `group.instance.id` stops instead of polling forever.
//!
//! The oracle of each: no event recorded done by one instance starts on
//! another (a call that starts after an earlier call of the same id was
//! answered 2xx), nothing is lost, and calls that were in flight when the
//! partition moved are reported with their idempotency key.

use crate::harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use harness::receiver::{Call, Reply};
use harness::{new_event_id, unique_name, Kafka, Outboxd, Receiver, Scenario};

use crate::scale::{assert_no_event, produce, two_instances, Protocol};

const PARTITIONS: i32 = 4;
const KEYS: usize = 20;
const HANDLED_TIMEOUT: Duration = Duration::from_secs(120);

fn events(n: usize) -> Vec<(String, String)> {
    events_on(n, KEYS)
}

fn events_on(n: usize, keys: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("agg-{}", i % keys), new_event_id())).collect()
}

/// Handler calls by event id, in the order they reached the receiver.
fn calls_by_id(receiver: &Receiver) -> HashMap<String, Vec<Call>> {
    let mut by_id: HashMap<String, Vec<Call>> = HashMap::new();
    for call in receiver.calls().into_iter().filter(Call::is_handler_call) {
        by_id.entry(call.event_id.clone().unwrap_or_default()).or_default().push(call);
    }
    by_id
}

/// Every event executed, and none started again after an instance made it
/// durably done (a handler call that reached the receiver after the earliest
/// "event handled" line of the event in any instance's log: that line comes once
/// the record is synced and, with the changelog, acknowledged by it; a record's
/// `done_at` is stamped before that, and an instance frozen in between has a done
/// record that no other member could know of). Calls that repeated an earlier one
/// before it was durably done (in flight when its partition moved: the documented
/// repeat, with the same idempotency key) are printed, not counted.
fn assert_none_ran_after_done(receiver: &Receiver, instances: &[&Outboxd], events: &[(String, String)]) {
    let mut done_at: HashMap<String, SystemTime> = HashMap::new();
    for od in instances {
        for line in harness::logs::all_logs(od).lines().filter(|l| l.contains("event handled")) {
            let id = line.split("event_id=").nth(1).and_then(|rest| rest.split_whitespace().next());
            let (Some(id), Some(at)) = (id, harness::logs::log_time(line)) else { continue };
            done_at.entry(id.to_owned()).and_modify(|t| *t = (*t).min(at)).or_insert(at);
        }
    }
    let by_id = calls_by_id(receiver);
    let mut missing = Vec::new();
    let mut again = Vec::new();
    let mut in_flight = Vec::new();
    for (_, id) in events {
        let calls = by_id.get(id).map(Vec::as_slice).unwrap_or_default();
        if !calls.iter().any(Call::effective) {
            missing.push(id.clone());
        }
        let done = done_at.get(id);
        for later in calls.iter().skip(1) {
            if done.is_some_and(|d| later.started > *d) {
                again.push(format!("{id} (by {})", later.instance().unwrap_or("?")));
            } else {
                in_flight.push(format!("{id} (idempotency key {:?})", later.header("idempotency-key")));
            }
        }
    }
    if !in_flight.is_empty() {
        eprintln!("{} calls repeated one in flight when its partition moved: {in_flight:?}", in_flight.len());
    }
    assert_no_event(&missing, "were never executed");
    assert_no_event(&again, "started again after they were recorded done");
}

/// Both instances with the test's group timing and a small read-ahead.
async fn pair(name: &str, max_poll_ms: &str) -> (Scenario, Outboxd) {
    let (mut s, mut b) = two_instances(name, PARTITIONS).await;
    for od in [&mut s.od, &mut b] {
        od.config.kafka_options.insert("max.poll.interval.ms".into(), max_poll_ms.into());
        od.config.max_in_flight = 8;
        // Each event's "event handled" line (at `debug`): when it became durably done.
        od.config.env.insert("OUTBOXD_LOG".into(), "info,outboxd::engine::executor=debug".into());
    }
    (s, b)
}

/// A's receiver holds every call, so all of A's permits stay taken for longer
/// than `max.poll.interval.ms`. The poll loop keeps polling (backpressure by
/// pausing partitions), so the group never moves A's partitions; once the
/// calls return, A handles the rest, each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_calls_hold_every_permit_keeps_polling_and_nothing_runs_twice() {
    let (Scenario { kafka, topic, receiver, od: mut a, .. }, mut b) = pair("starved", "7000").await;
    let held = Arc::new(AtomicBool::new(true));
    let hold = held.clone();
    receiver.set_script(move |req| match req.instance.as_deref() {
        Some("a") => Reply::ok().hold(&hold),
        _ => Reply::ok(),
    });
    for od in [&mut a, &mut b] {
        // What a catch-up pass would read of B's writes must not hide a lost
        // partition: the guarantee may not rest on it (it reads only older records).
        od.config.store_extra.push_str("follow_interval = \"1h\"\n");
    }
    a.start();
    a.wait_for_assignment().await;
    b.start();
    b.wait_for_assignment().await;
    // Few keys: most of A's permits are taken by events queued behind a held call of their key.
    let events = events_on(200, 6);
    produce(&kafka, &topic, &events).await;
    a.wait_until("A's calls to be held", HANDLED_TIMEOUT, || receiver.in_flight_from("a") >= 1).await;
    // Longer than max.poll.interval.ms with every permit of A taken: the window in
    // which a loop that waits for a permit before it polls loses its partitions.
    tokio::time::sleep(Duration::from_secs(12)).await;
    held.store(false, Ordering::SeqCst);
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    a.wait_until("every event to be handled", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    // Time for a queued event of a partition A lost to start after its calls returned.
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.stop();
    b.stop();
    assert_none_ran_after_done(&receiver, &[&a, &b], &events);
    assert!(!a.log().contains("poll interval exceeded"), "A stopped polling:\n{}", a.log_tails(40, 0));
}

/// A is frozen (SIGSTOP) past its session timeout with calls held by the
/// receiver and events queued behind them; B takes its partitions and handles
/// them. When A resumes, its held calls have timed out and its queued events
/// are ready to start: the gap since its poll loop last confirmed ownership
/// fences every partition first, so neither a retry nor a queued event runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_starts_none_of_its_queued_events_after_it_resumes() {
    let (Scenario { kafka, topic, receiver, od: mut a, .. }, mut b) = pair("frozen", "300000").await;
    let holding = Arc::new(AtomicBool::new(false));
    let hold = holding.clone();
    receiver.set_script(move |req| {
        if req.instance.as_deref() == Some("a") && hold.load(Ordering::SeqCst) {
            Reply::ok().hold(&hold)
        } else {
            Reply::ok().delay(Duration::from_millis(300))
        }
    });
    for od in [&mut a, &mut b] {
        od.config.max_in_flight = 64;
        od.config.handler_timeout = "3s".into();
    }
    a.start();
    a.wait_for_assignment().await;
    b.start();
    b.wait_for_assignment().await;
    let events = events(300);
    produce(&kafka, &topic, &events).await;
    a.wait_until("A to handle some events", HANDLED_TIMEOUT, || receiver.calls_from("a") >= 10).await;
    let before = receiver.calls_from("a");
    holding.store(true, Ordering::SeqCst);
    a.wait_until("A to have a call held", HANDLED_TIMEOUT, || receiver.calls_from("a") > before).await;
    a.signal("STOP");
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    harness::wait_until("B to handle every event while A is frozen", HANDLED_TIMEOUT, || {
        receiver.count_answered_ok(&ids) == ids.len()
    })
    .await;
    // Past A's handler timeout: its held calls time out the moment it resumes.
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.signal("CONT");
    // The repeats this guards against start within milliseconds of the resume
    // (queued events) or after the first retry backoff (timed-out calls).
    tokio::time::sleep(Duration::from_secs(5)).await;
    holding.store(false, Ordering::SeqCst);
    harness::wait_until("every event to be handled", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len())
        .await;
    a.stop();
    b.stop();
    assert_none_ran_after_done(&receiver, &[&a, &b], &events);
    assert!(a.log().contains("partitions fenced"), "A did not fence on resume:\n{}", a.log_tails(40, 0));
}

/// Two members with one `group.instance.id`: the broker fences the older one.
/// It stops with a clear message and a non-zero exit instead of polling forever
/// while `/healthz` says OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_fenced_by_another_with_its_instance_id_exits_with_the_reason() {
    let (Scenario { kafka, topic, receiver, od: mut a, .. }, mut b) = two_instances("static", PARTITIONS).await;
    let instance_id = unique_name("member");
    for od in [&mut a, &mut b] {
        od.config.kafka_options.insert("group.instance.id".into(), instance_id.clone());
    }
    a.start();
    a.wait_for_assignment().await;
    b.start();
    let status = a.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "the fenced member exited 0");
    let log = a.log();
    assert!(log.contains("group.instance.id"), "the reason does not name group.instance.id:\n{}", a.log_tails(20, 0));
    b.wait_for_assignment().await;
    let events = events(20);
    produce(&kafka, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    b.wait_until("B to handle the events", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    b.stop();
}

/// KIP-848's consumer protocol (`group.protocol = "consumer"`): outboxd starts
/// with the restore gate, a second instance takes partitions over, and replays
/// of every handled event at new offsets run nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_consumer_protocol_partitions_move_and_replays_are_suppressed() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) =
        two_instances("kip848", PARTITIONS).await;
    Protocol::Consumer.apply(&mut a);
    Protocol::Consumer.apply(&mut b);
    a.write_config();
    let checked = a.command(&["check-config"]);
    assert!(checked.status.success(), "check-config refused: {}", String::from_utf8_lossy(&checked.stderr));
    a.start();
    a.wait_for_assignment().await;
    let events = events(200);
    produce(&kafka, &topic, &events).await;
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    a.wait_until("A to handle every event", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    a.wait_until("A's offsets to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    b.start();
    b.wait_for_assignment().await;
    a.wait_until("B to take partitions over", HANDLED_TIMEOUT, || b.log().contains("partition restored")).await;
    produce(&kafka, &topic, &events).await;
    a.wait_until("the replays to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    a.stop();
    b.stop();
    crate::scale::assert_each_executed_once(&receiver, &events);
}

/// `check-config` validates what outboxd adds to `kafka.options`, so a file the
/// service would refuse is refused by the check too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_refuses_options_the_consumer_refuses_with_what_outboxd_adds() {
    let kafka = Kafka::connect();
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&kafka, &["t"], &receiver);
    od.config.kafka_options.insert("group.protocol".into(), "consumer".into());
    // Kept from the classic protocol: the broker owns the session under KIP-848.
    od.write_config();
    let out = od.command(&["check-config"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check-config accepted session.timeout.ms under group.protocol = consumer");
    assert!(stderr.contains("session.timeout.ms"), "{stderr}");
}

/// A lone instance frozen past its session timeout fences everything when it
/// resumes, and librdkafka's own session-timeout rejoin races its rejoin: once
/// the group has assigned the partitions afresh it handles events again. (An
/// alarm of the old session that fenced the new assignment left it stuck.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_instance_frozen_past_its_session_handles_events_again_after_it_resumes() {
    let mut s = Scenario::new("frozen-alone", PARTITIONS).await;
    s.od = crate::scale::on(s.od);
    s.run().await;
    let Scenario { kafka, topic, receiver, od: mut a, .. } = s;
    let before = events(20);
    produce(&kafka, &topic, &before).await;
    let ids: Vec<String> = before.iter().map(|(_, id)| id.clone()).collect();
    a.wait_until("the first events", HANDLED_TIMEOUT, || receiver.count_answered_ok(&ids) == ids.len()).await;
    a.signal("STOP");
    // Past the 6 s session timeout of the test config.
    tokio::time::sleep(Duration::from_secs(9)).await;
    a.signal("CONT");
    harness::wait_until("A to fence on resume", HANDLED_TIMEOUT, || a.log().contains("partitions fenced")).await;
    let after = events(20);
    produce(&kafka, &topic, &after).await;
    let ids: Vec<String> = after.iter().map(|(_, id)| id.clone()).collect();
    a.wait_until("the events produced after the resume", HANDLED_TIMEOUT, || {
        receiver.count_answered_ok(&ids) == ids.len()
    })
    .await;
    a.stop();
    let all: Vec<(String, String)> = before.into_iter().chain(after).collect();
    crate::scale::assert_each_executed_once(&receiver, &all);
}
