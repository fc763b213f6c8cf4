//! Brokers that are away: librdkafka reports them from every client at every reconnect;
//! the log says so once, sums up every `kafka.outage_summary_interval`, and says when
//! they are back. `/readyz` (`broker`, `broker_state`) and `outboxd_broker_reachable`
//! show the same state; start-up says what it waits for before it waits.
//!
//! The shared broker stays up for the other tests: unreachable brokers are a port of
//! 127.0.0.1 that was bound and closed again (connections refused), and brokers that go
//! away and come back are a private broker, SIGKILLed and started again.

use crate::harness;

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use harness::broker::PrivateBroker;
use harness::logs::{log_lines, log_time, strip_ansi};
use harness::metrics::{sample, try_scrape};
use harness::ports::ClosedPort;
use harness::{new_event_id, turns, unique_name, wait_for, wait_until, Kafka, Outboxd, Receiver, Scenario};
use outboxd::metrics::names;
use serde_json::{json, Value};

/// The one warning when the brokers become unreachable.
const UNREACHABLE: &str = "Kafka brokers unreachable;";
/// The summary while they stay so.
const STILL: &str = "Kafka brokers still unreachable";
/// The line when they are back.
const BACK: &str = "Kafka brokers reachable again";
/// The line before start-up waits for the brokers.
const CONNECTING: &str = "connecting to the Kafka brokers";

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

/// The current run's lines at WARN or ERROR level.
fn warnings(od: &Outboxd) -> Vec<String> {
    strip_ansi(&od.log()).lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).map(str::to_owned).collect()
}

/// `/readyz` of the running service: status and body.
async fn readyz(od: &Outboxd) -> (u16, Value) {
    let url = format!("http://{}/readyz", od.admin_address());
    let resp = reqwest::get(&url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("readyz JSON"))
}

/// `/metrics` of the running service, once it answers.
async fn scrape(od: &Outboxd) -> String {
    wait_for("/metrics to answer", Duration::from_secs(30), async || try_scrape(od).await.ok_or("no answer")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_brokers_at_start_up_are_one_warning_and_a_summary_per_interval() {
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&Kafka::connect(), &[&unique_name("never-there")], &receiver);
    // Refusing until the end of the test (its admin server listens on a port of its own).
    let brokers = ClosedPort::bind();
    od.config.brokers = format!("127.0.0.1:{}", brokers.port());
    od.config.kafka_extra = "outage_summary_interval = \"7s\"\n".into();
    let started = SystemTime::now();
    let clock = Instant::now();
    od.start();

    // Said at once: what start-up waits for, and that the brokers refuse.
    wait_until("the start-up line and the warning", Duration::from_secs(5), || {
        !log_lines(&od, CONNECTING).is_empty() && !log_lines(&od, UNREACHABLE).is_empty()
    })
    .await;
    for needle in [CONNECTING, UNREACHABLE] {
        let line = &log_lines(&od, needle)[0];
        let at = log_time(line).expect("a timestamp");
        let after = at.duration_since(started).unwrap_or_default();
        assert!(after <= Duration::from_secs(2), "{needle:?} came {after:?} after the start: {line}");
    }
    let warning = &log_lines(&od, UNREACHABLE)[0];
    assert!(warning.contains(&od.config.brokers) && warning.contains("Connection refused"), "{warning}");

    // The admin API answers once start-up gave up on the topic list (10 s).
    let metrics = scrape(&od).await;
    let (status, ready) = readyz(&od).await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!((&ready["ready"], &ready["broker"]), (&json!(false), &json!(false)), "{ready}");
    assert_eq!(ready["broker_state"]["state"], "unreachable", "{ready}");
    assert_eq!(ready["broker_state"]["reachable"], false, "{ready}");
    assert!(ready["broker_state"]["errors"].as_u64().unwrap_or(0) > 0, "{ready}");
    assert_eq!(sample(&metrics, names::BROKER_REACHABLE, &[]), 0.0, "{metrics}");
    let errors = sample(&metrics, names::BROKER_CONNECTION_ERRORS, &[]);
    assert!(errors > 0.0, "{metrics}");

    // About 12 s unreachable in all.
    if let Some(rest) = Duration::from_secs(12).checked_sub(clock.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    od.assert_alive();
    od.stop();

    let lines = strip_ansi(&od.log());
    let warned = warnings(&od);
    println!(
        "{:.1?} with unreachable brokers: {} lines, {} warnings, {errors} connection errors counted",
        clock.elapsed(),
        lines.lines().count(),
        warned.len()
    );
    assert_eq!(log_lines(&od, UNREACHABLE).len(), 1, "one warning when they went away:\n{lines}");
    let summaries = log_lines(&od, STILL).len();
    assert!((1..=2).contains(&summaries), "a summary every 7 s, got {summaries}:\n{lines}");
    assert!(warned.len() <= 5, "a bounded number of warnings, got {}:\n{lines}", warned.len());
    assert!(lines.lines().count() <= 15, "a bounded number of lines:\n{lines}");
    assert!(!lines.contains("librdkafka: FAIL") && !lines.contains("kafka consumer error"), "raw lines:\n{lines}");
    assert!(log_lines(&od, BACK).is_empty(), "{lines}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_that_go_away_and_come_back_are_one_warning_and_one_line_back() {
    let _load = turns::LOAD.lock().await;
    // Declared first, dropped last (`scripts/stack down kafka` for the private broker).
    let broker = PrivateBroker::start();
    let kafka = Kafka::connect_to(&broker.brokers());
    let topic = kafka.create_topic(&unique_name("broker-away"), 2, &[]).await;
    let mut s = Scenario::on(kafka, topic);
    s.od.config.kafka_extra = "outage_summary_interval = \"3s\"\n".into();
    s.run().await;
    let Scenario { topic, receiver, mut od, producer, .. } = s;
    let mut events = Vec::new();
    let send = |n: usize| {
        let ids: Vec<String> = (0..n).map(|_| new_event_id()).collect();
        let (producer, topic) = (&producer, &topic);
        async move {
            for (i, id) in ids.iter().enumerate() {
                producer.send_event(topic, &format!("k-{i}"), id, None, &json!({"i": i})).await;
            }
            ids
        }
    };
    events.extend(send(10).await);
    od.wait_until("the events before the outage", HANDLED_TIMEOUT, || receiver.count_answered_ok(&events) == 10).await;
    let (_, ready) = readyz(&od).await;
    assert_eq!(ready["broker_state"]["state"], "reachable", "{ready}");
    let lines_before = strip_ansi(&od.log()).lines().count();

    let killed = Instant::now();
    broker.kill();
    wait_until("the warning", Duration::from_secs(15), || !log_lines(&od, UNREACHABLE).is_empty()).await;
    let noticed = killed.elapsed();
    let (status, ready) = readyz(&od).await;
    assert_eq!((status, &ready["broker"]), (503, &json!(false)), "{ready}");
    assert_eq!(ready["broker_state"]["state"], "unreachable", "{ready}");
    assert_eq!(sample(&scrape(&od).await, names::BROKER_REACHABLE, &[]), 0.0);
    // Away for 10 s in all.
    if let Some(rest) = Duration::from_secs(10).checked_sub(killed.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    od.assert_alive();
    let lines_away = strip_ansi(&od.log()).lines().count() - lines_before;
    let restarting = Instant::now();
    broker.restart();
    wait_until("the line saying they are back", HANDLED_TIMEOUT, || !log_lines(&od, BACK).is_empty()).await;
    let back_after_restart = restarting.elapsed();

    events.extend(send(10).await);
    od.wait_until("every event, before and after the outage", HANDLED_TIMEOUT, || {
        receiver.count_answered_ok(&events) == events.len()
    })
    .await;
    let (_, ready) = readyz(&od).await;
    assert_eq!(ready["broker"], true, "{ready}");
    assert_eq!(ready["broker_state"]["state"], "reachable", "{ready}");
    assert_eq!(sample(&scrape(&od).await, names::BROKER_REACHABLE, &[]), 1.0);
    od.stop();

    let log = strip_ansi(&od.log());
    let back = &log_lines(&od, BACK)[0];
    println!(
        "broker away {:.1?} (noticed after {noticed:.1?}), back {back_after_restart:.1?} after its restart began; \
         {lines_away} lines while away; {back}",
        restarting.duration_since(killed)
    );
    assert_eq!(log_lines(&od, UNREACHABLE).len(), 1, "one warning:\n{log}");
    assert_eq!(log_lines(&od, BACK).len(), 1, "one line back:\n{log}");
    assert!(back.contains("away=") && back.contains("errors_suppressed="), "{back}");
    assert!(lines_away <= 20, "{lines_away} lines in 10 s away:\n{log}");
    assert!(!log.contains("librdkafka: FAIL") && !log.contains("kafka consumer error"), "raw lines:\n{log}");
    let mut twice = HashSet::new();
    for id in &events {
        let effective = receiver.handler_calls(id).iter().filter(|c| c.effective()).count();
        if effective != 1 {
            twice.insert((id.clone(), effective));
        }
    }
    assert!(twice.is_empty(), "events not handled exactly once: {twice:?}");
}
