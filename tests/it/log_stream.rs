//! A log stream that goes away: outboxd's stdout and stderr are pipes that the test reads
//! for a while and then closes, while events flow (what a log collector that restarts or
//! a sidecar that dies does to a service). outboxd drops the lines it cannot write,
//! counts them, loses no event, runs none twice, and exits 0 on SIGTERM.

use crate::harness;

use std::time::Duration;

use harness::metrics::{sample, try_scrape};
use harness::{new_event_id, unique_name, Behaviour, Kafka, Outboxd, Producer, Receiver};
use outboxd::metrics::names;
use serde_json::json;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

async fn send(producer: &Producer, topic: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = new_event_id();
        producer.send_event(topic, &format!("k-{}", i % 5), &id, None, &json!({"i": i})).await;
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_pipe_drops_lines_and_loses_no_event() {
    let kafka = Kafka::connect();
    let topic = kafka.create_topic(&unique_name("log-pipe"), 2, &[]).await;
    let receiver = Receiver::start();
    let mut od = Outboxd::new(&kafka, &[&topic], &receiver);
    let pipes = od.start_piped();
    od.wait_for_assignment().await;
    let producer = kafka.producer();
    let mut events = send(&producer, &topic, 20).await;
    od.wait_until("the events before the close", HANDLED_TIMEOUT, || receiver.count_answered_ok(&events) == 20).await;

    let read = pipes.close().await;
    assert!(read > 0, "the pipes carried the log before they were closed");
    // Every event after the close fails once: a warning each, which has nowhere to go.
    receiver.set_default(Behaviour::fail_first(503, 1));
    let after = send(&producer, &topic, 20).await;
    events.extend(after.iter().cloned());
    od.wait_until("the events after the close", HANDLED_TIMEOUT, || receiver.count_answered_ok(&events) == 40).await;
    od.assert_alive();

    let metrics = try_scrape(&od).await.expect("/metrics answers");
    let dropped = sample(&metrics, names::LOG_LINES_DROPPED, &[]);
    assert!(dropped >= 20.0, "a warning per failed attempt was dropped, counted {dropped}:\n{metrics}");
    for id in &events {
        let effective = receiver.handler_calls(id).iter().filter(|c| c.effective()).count();
        assert_eq!(effective, 1, "event {id} handled {effective} times");
    }
    for id in &after {
        assert_eq!(receiver.handler_call_count(id), 2, "event {id}: one failed attempt, one that succeeded");
    }
    let status = od.terminate();
    println!("{read} bytes of log read before the close, {dropped} lines dropped after it; exit {status}");
    assert!(status.success(), "outboxd should exit 0 after SIGTERM with its log stream gone, got {status}");
}
