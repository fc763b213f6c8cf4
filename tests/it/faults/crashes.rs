//! Crashes mid-stream: outboxd SIGKILLed at random moments, the broker killed, an
//! instance joining and leaving.

use super::*;

// ---------------------------------------------------------------- 1. SIGKILL

/// outboxd is SIGKILLed at random moments (≥ 20 times), mostly with calls in flight,
/// and restarted each time, while events keep arriving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_and_never_repeats_after_done() {
    let _load = turns::LOAD.lock().await;
    let name = "sigkill";
    let began = Instant::now();
    let n = event_count();
    let kills = env_usize("OUTBOXD_FAULT_KILLS", DEFAULT_KILLS);
    let mut rng = StdRng::seed_from_u64(seed(name));
    let Scenario { kafka, topic, receiver: rx, od, offsets, .. } = Scenario::new("fault-kill", PARTITIONS).await;
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=20))));
    let mut od = fault_outboxd(od, "a");
    // Static membership: a restarted process gets its partitions back at once.
    od.config.kafka_options.insert("group.instance.id".into(), "fault-kill".into());
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    // Spread production over about as long as the kills take.
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 40, Duration::from_millis(500));

    let mut kill_times = Vec::new();
    let mut mid_call = 0;
    for _ in 0..kills {
        od.start();
        if rng.random_bool(0.5) {
            od.wait_for_assignment().await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..=1500))).await;
        if rng.random_bool(0.8) {
            let every = Duration::from_millis(rng.random_range(1..=10));
            harness::wait_at_most(Duration::from_secs(1), every, || rx.in_flight() > 0).await;
        }
        od.assert_alive();
        if rx.in_flight() > 0 {
            mid_call += 1;
        }
        let k0 = SystemTime::now();
        od.kill();
        kill_times.push((k0, SystemTime::now()));
    }
    let last_fault = Instant::now();
    od.start();
    od.wait_for_assignment().await;
    let events = production.await.expect("producer task");
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = last_fault.elapsed();
    od.stop();
    assert_eq!(kill_times.len(), kills, "the kills must have happened");
    assert!(kills == 0 || mid_call > 0, "no kill hit a call in flight; the scenario did not test unknown outcomes");

    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: kill_times,
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!("{kills} SIGKILLs ({mid_call} with calls in flight), {} runs", od.runs()),
        drain,
        drain_from: "after the last kill",
        extra: String::new(),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 3. broker crash

/// The broker is SIGKILLed mid-stream, stays down 10 s, and is started again on the same
/// data. A private broker: the shared one stays up for the other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_for_ten_seconds_mid_stream_loses_nothing() {
    const OUTAGE: Duration = Duration::from_secs(10);
    let _load = turns::LOAD.lock().await;
    let name = "broker-kill";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    // Declared first, dropped last (`scripts/stack down kafka` for the private broker).
    let broker = PrivateBroker::start();
    let kafka = Kafka::connect_to(&broker.brokers());
    let topic = kafka.create_topic(&unique_name("fault-broker"), PARTITIONS, &[]).await;
    let Scenario { kafka, topic, receiver: rx, od, .. } = Scenario::on(kafka, topic);
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=5))));
    let mut od = fault_outboxd(od, "a");
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 40, Duration::from_millis(300));
    od.start();
    od.wait_for_assignment().await;
    wait_alive(&mut [&mut od], "a quarter of the events answered", DRAIN_TIMEOUT, || rx.ok_count() >= good / 4).await;

    let pid = broker.pid().expect("broker pid");
    let before = rx.ok_count();
    let killed = Instant::now();
    broker.kill();
    let mut looks = 0;
    while killed.elapsed() < OUTAGE {
        od.assert_alive();
        assert!(!broker.port_open(), "the broker came back by itself during the outage");
        looks += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = rx.ok_count() - before;
    let down_for = killed.elapsed();
    let restarting = Instant::now();
    broker.restart();
    let restart_took = restarting.elapsed();
    let events = production.await.expect("producer task");
    let offsets = kafka.offsets(&od.config.group_id, &topic);
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = restarting.elapsed();
    od.stop();
    assert!(looks >= 20, "the outage was not observed");
    let consumer_errors = log_lines(&od, "kafka consumer error").len() + log_lines(&od, "roker").len();

    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: Vec::new(),
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!(
            "broker (pid {pid}) SIGKILLed, port closed for {down_for:.1?}, restart took {restart_took:.1?}; \
             {during} events finished during the outage"
        ),
        drain,
        drain_from: "after the broker restart began",
        extra: format!(", broker-related log lines={consumer_errors}"),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 4. rebalance

/// A second instance (own store) joins mid-stream, then the first one leaves (SIGTERM).
/// The dedup store is per instance: an event runs on both only if it moved between
/// them before its offset was committed; those are counted, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_joining_and_leaving_mid_stream_loses_nothing() {
    let _load = turns::LOAD.lock().await;
    let name = "rebalance";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    let Scenario { kafka, topic, receiver: rx, od, offsets, .. } = Scenario::new("fault-rebalance", PARTITIONS).await;
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=10))));
    let mut a = fault_outboxd(od, "a");
    let mut b = fault_outboxd(Outboxd::new(&kafka, &[&topic], &rx), "b");
    b.config.group_id = a.config.group_id.clone();
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    // Produced quickly: a works through a backlog, so the join and the leave happen
    // with events queued and in flight. The last three fifths wait until b is assigned:
    // on a fast machine a could otherwise have handled everything before b joined.
    let (go_on, open) = tokio::sync::oneshot::channel();
    let gate = Gate { after: 4, open };
    let production = spawn_gated_production(
        kafka.brokers().to_string(),
        topic.clone(),
        planned,
        10,
        Duration::from_millis(100),
        Some(gate),
    );
    a.start();
    a.wait_for_assignment().await;
    wait_alive(&mut [&mut a], "a fifth of the events answered", DRAIN_TIMEOUT, || rx.ok_count() >= good / 5).await;
    b.start();
    b.wait_for_assignment().await;
    let _ = go_on.send(());
    wait_alive(
        &mut [&mut a, &mut b],
        "three fifths answered, and b handling events, with two instances",
        DRAIN_TIMEOUT,
        || rx.ok_count() >= good * 3 / 5 && rx.calls_from("b") > 0,
    )
    .await;
    let b_calls_while_both = rx.calls_from("b");
    let a_revoked = log_lines(&a, "partitions revoked").len();
    let leaving = Instant::now();
    let told_to_leave = SystemTime::now();
    a.stop();
    let left_at = SystemTime::now();
    let events = production.await.expect("producer task");
    wait_alive(&mut [&mut b], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut b], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = leaving.elapsed();
    b.stop();

    let calls = rx.calls();
    let from = |i: &str| calls.iter().filter(|c| c.is_handler_call() && c.instance() == Some(i)).count();
    let (calls_a, calls_b) = (from("a"), from("b"));
    let a_after_leaving = calls.iter().filter(|c| c.instance() == Some("a") && c.started > left_at).count();
    // Events a had consumed before SIGTERM still run during its drain.
    let a_draining = calls.iter().filter(|c| c.instance() == Some("a") && c.started > told_to_leave).count();
    assert!(calls_a > 0 && calls_b > 0, "both instances must have handled events: a={calls_a} b={calls_b}");
    assert!(b_calls_while_both > 0, "b handled nothing while both ran: no partition moved on the join");
    assert!(a_revoked > 0, "a never logged a revoke when b joined");
    assert_eq!(a_after_leaving, 0, "a made calls after it exited");
    for (name, od) in [("a", &a), ("b", &b)] {
        for l in logs::all_logs(od)
            .lines()
            .filter(|l| l.contains("revoked") || l.contains("assigned") || l.contains("commit") || l.contains("lost"))
        {
            eprintln!("{name}: {l}");
        }
    }
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&a)), ("b".into(), records(&b))],
        calls,
        kills: Vec::new(),
        dead_letters: None,
        handler_timeout: timeout_of(&a),
        timed_out: event_ids_logged(&a, "timed out").into_iter().chain(event_ids_logged(&b, "timed out")).collect(),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!("b joined (a revoked partitions {a_revoked}×), then a left by SIGTERM"),
        drain,
        drain_from: "after a was told to leave",
        extra: format!(
            " (a {calls_a}, of which {a_draining} during its drain after SIGTERM; b {calls_b}, of which \
             {b_calls_while_both} while both ran)"
        ),
    };
    finish(name, check, summary, began);
}
