//! What outboxd talks to misbehaves: a receiver that answers 503 or times out, and
//! messages that cannot be decoded.

use super::*;

// ---------------------------------------------------------------- 2. flaky receiver

/// The receiver answers 503 to 20% of calls and holds 2% past the handler timeout
/// (having performed the side effect: the answer is what gets lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_receiver_503s_and_timeouts_lose_nothing() {
    let _load = turns::LOAD.lock().await;
    let name = "flaky-receiver";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    let Scenario { kafka, topic, receiver: rx, od, offsets, .. } = Scenario::new("fault-flaky", PARTITIONS).await;
    let served_503 = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let (n503, nheld) = (served_503.clone(), held.clone());
    rx.set_script(move |r| {
        let x: f64 = rand::random();
        if r.kind != "events" {
            Reply::ok()
        } else if x < 0.20 {
            n503.fetch_add(1, Ordering::Relaxed);
            Reply::status(503)
        } else if x < 0.22 {
            nheld.fetch_add(1, Ordering::Relaxed);
            Reply::ok().delay(Duration::from_millis(1500))
        } else {
            Reply::ok()
        }
    });
    let mut od = fault_outboxd(od, "a");
    od.config.handler_timeout = "1s".into();
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 20, Duration::from_millis(200));
    od.start();
    od.wait_for_assignment().await;
    let events = production.await.expect("producer task");
    let produced = Instant::now();
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = produced.elapsed();
    od.stop();

    let calls = rx.calls();
    let (served_503, held) = (served_503.load(Ordering::Relaxed), held.load(Ordering::Relaxed));
    assert!(served_503 > 0 && held > 0, "faults did not happen: {served_503} 503s, {held} held calls");
    let timeouts = log_lines(&od, "timed out").len();
    assert!(timeouts > 0, "outboxd never reported a handler timeout");
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls,
        kills: Vec::new(),
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!("{served_503} answers 503, {held} calls held 1.5 s past the 1 s timeout (all through the run)"),
        drain,
        drain_from: "after the last event was produced",
        extra: format!(", timeouts logged={timeouts}"),
    };
    finish(name, check, summary, began);
}

// ---------------------------------------------------------------- 6. poison messages

/// 1% poison (half undecodable, half rejected by the receiver with 422) with a
/// dead-letter topic: one dead letter per poison message, and nothing else stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_go_to_the_dead_letter_topic() {
    let _load = turns::LOAD.lock().await;
    let name = "poison";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    let Scenario { kafka, topic, receiver: rx, od, offsets, .. } = Scenario::new("fault-poison", PARTITIONS).await;
    let dlq = kafka.create_topic(&unique_name("fault-poison-dlq"), 1, &[]).await;
    let planned = plan(n, 10, &mut rng);
    let rejected: Arc<HashSet<String>> =
        Arc::new(planned.iter().filter(|p| p.kind == Kind::Rejected).map(|p| p.id.clone()).collect());
    let r2 = rejected.clone();
    rx.set_script(move |r| {
        if r.event_id.as_deref().is_some_and(|id| r2.contains(id)) {
            Reply::status(422)
        } else {
            Reply::ok()
        }
    });
    let mut od = fault_outboxd(od, "a");
    // Poison shares keys with good events, which this test expects to run (`hold` would hold them).
    od.config.handler_extra.push_str("on_dead = \"continue\"\n");
    od.config.handler_extra.push_str(&dead_letter_toml(&dlq));
    let good = good_count(&planned);
    let production =
        spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 20, Duration::from_millis(100));
    od.start();
    od.wait_for_assignment().await;
    let events = production.await.expect("producer task");
    let produced = Instant::now();
    wait_alive(&mut [&mut od], &format!("all {good} events answered"), DRAIN_TIMEOUT, || rx.ok_count() >= good).await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = produced.elapsed();
    od.stop();
    let poison = poison_count(&events);
    assert!(poison > 0, "no poison message was produced (n={n})");
    let letters = kafka.read_topic(&dlq, Duration::from_secs(60));
    let undecodable = events.iter().filter(|e| e.kind == Kind::Undecodable).count();
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: Vec::new(),
        dead_letters: Some(letters),
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison,
        faults: format!("{undecodable} undecodable + {} rejected with 422", rejected.len()),
        drain,
        drain_from: "after the last event was produced",
        extra: String::new(),
    };
    finish(name, check, summary, began);
}
