//! A log stream that goes away: outboxd's stdout and stderr are pipes that the test reads
//! for a while and then closes, while events flow (what a log collector that restarts or
//! a sidecar that dies does to a service). outboxd drops the lines it cannot write,
//! counts them, loses no event, runs none twice, and exits 0 on SIGTERM. A `log` handler,
//! whose line on stdout is its side effect, records nothing done that it could not write.

use crate::harness;

use std::time::Duration;

use harness::logs::logged;
use harness::metrics::{sample, try_scrape};
use harness::{new_event_id, unique_name, wait_until, Behaviour, Outboxd, Producer, Scenario};
use outboxd::metrics::names;
use serde_json::{json, Value};

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

/// `/readyz` of the running service.
async fn readyz(od: &Outboxd) -> Value {
    let url = format!("http://{}/readyz", od.admin_address());
    reqwest::get(&url).await.unwrap_or_else(|e| panic!("GET {url}: {e}")).json().await.expect("readyz JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_pipe_drops_lines_and_loses_no_event() {
    let Scenario { kafka, topic, receiver, mut od, producer, .. } = Scenario::new("log-pipe", 2).await;
    let printed = kafka.create_topic(&unique_name("log-pipe-printed"), 1, &[]).await;
    // A second handler, after the first one's last table: one JSON line per event on stdout.
    od.config.retry_extra = format!("\n[[handlers]]\nname = \"printer\"\ntopics = [\"{printed}\"]\nkind = \"log\"\n");
    let pipes = od.start_piped();
    od.wait_for_assignment().await;
    let mut events = send(&producer, &topic, 20).await;
    let lines_before = send(&producer, &printed, 2).await;
    // The printer's lines come through the stdout pipe into the run's log.
    wait_until("the events before the close", HANDLED_TIMEOUT, || {
        receiver.count_answered_ok(&events) == 20 && lines_before.iter().all(|id| logged(&od, id))
    })
    .await;

    let read = pipes.close().await;
    assert!(read > 0, "the pipes carried the log before they were closed");
    // Every event after the close fails once: a warning each, which has nowhere to go.
    receiver.set_default(Behaviour::fail_first(503, 1));
    let after = send(&producer, &topic, 20).await;
    let lines_after = send(&producer, &printed, 2).await;
    events.extend(after.iter().cloned());
    od.wait_until("the events after the close", HANDLED_TIMEOUT, || receiver.count_answered_ok(&events) == 40).await;
    // The printer cannot write: its circuit opens, its events wait (the other handler flowed).
    od.wait_for("the printer's circuit to open", HANDLED_TIMEOUT, async |od| {
        let ready = readyz(od).await;
        if ready["degraded"].as_array().is_some_and(|d| d.contains(&json!("printer"))) {
            Ok(())
        } else {
            Err(ready)
        }
    })
    .await;
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

    for id in &lines_before {
        assert_eq!(od.store_get(id).state, "done", "{id} was printed before the close");
    }
    for id in &lines_after {
        let out = od.command(&["store", "get", id, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("\"done\""), "{id} could not be printed, yet it is done: {text}");
    }
}

/// The `info` log names no event that was handled or suppressed, but the first: each
/// handler's summary line counts them (`log.summary_interval`), so a busy service writes
/// a few lines a minute instead of one per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_events_are_summed_up_not_logged_one_by_one() {
    let Scenario { topic, receiver, mut od, producer, .. } = Scenario::new("log-summary", 2).await;
    od.config.retry_extra = "\n[log]\nsummary_interval = \"1s\"\n".to_owned();
    od.start();
    od.wait_for_assignment().await;
    let events = send(&producer, &topic, 30).await;
    od.wait_until("30 events handled", HANDLED_TIMEOUT, || receiver.count_answered_ok(&events) == 30).await;
    // Five of them again, at new offsets: suppressed.
    for (i, id) in events.iter().take(5).enumerate() {
        producer.send_event(&topic, &format!("k-{}", i % 5), id, None, &json!({"i": i})).await;
    }
    let sum = |field: &str| -> u64 {
        harness::logs::log_lines(&od, "handler summary")
            .iter()
            .filter_map(|l| l.split(&format!(" {field}=")).nth(1)?.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    };
    wait_until("the summaries to count 30 handled and 5 duplicates", HANDLED_TIMEOUT, || {
        sum("handled") == 30 && sum("duplicates") == 5
    })
    .await;
    assert_eq!(sum("calls"), 30, "one call per event:\n{}", od.log());
    let named = harness::logs::log_lines(&od, "event handled");
    assert_eq!(named.len(), 1, "only the first event handled has its line at info: {named:#?}");
    assert!(named[0].contains("first event handled"), "{named:#?}");
    // Its receiver's answer is on it (the record took the outcome's text; the line kept a copy).
    assert!(named[0].contains("outcome=http 200") || named[0].contains("outcome=\"http 200\""), "{named:#?}");
    assert!(!logged(&od, "duplicate suppressed"), "duplicates are counted, not named:\n{}", od.log());
    for id in &events {
        assert_eq!(receiver.handler_call_count(id), 1, "event {id}");
    }
}
