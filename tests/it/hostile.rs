//! Hostile input from the outside world, against the real broker: a receiver that
//! answers absurdly, a partition that cannot move, a URL that carries a secret.
//! Each test names what outboxd must not do: stall, crash, or leak.

use crate::harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use harness::avro::framed;
use harness::daemon::{dead_letter_toml, instance_header_toml};
use harness::logs::{self, all_logs, assert_no_panic};
use harness::ports::ClosedPort;
use harness::receiver::{Receiver, Reply};
use harness::wait::keep_looking;
use harness::{new_event_id, unique_name, Kafka, Outboxd, Scenario};
use serde_json::{json, Value};

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

async fn readyz(admin: &str) -> (u16, Value) {
    let url = format!("http://{admin}/readyz");
    let resp = reqwest::get(&url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("readyz JSON"))
}

/// Asks `/readyz` until its status is `status` and `holds` is true of its body (which
/// is returned); fails the test after [`HANDLED_TIMEOUT`] with `what` and the last body.
async fn readyz_until(admin: &str, what: &str, status: u16, holds: impl Fn(&Value) -> bool) -> Value {
    let answered = keep_looking(HANDLED_TIMEOUT, Duration::from_millis(200), async || {
        let (got, body) = readyz(admin).await;
        if got == status && holds(&body) {
            Ok(body)
        } else {
            Err(format!("{got} {body}"))
        }
    });
    answered.await.unwrap_or_else(|last| panic!("{what}: last answer {last}"))
}

/// A receiver answered 503 with `Retry-After: 1` twice, then with
/// `Retry-After: 18446744073709551615` (u64::MAX seconds). That pause cannot fit in
/// `max_elapsed`, so the retries end and the event is recorded dead; the next event
/// of the same key is called, and the partition commits to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_retry_after_ends_the_retries_and_the_key_goes_on() {
    let Scenario { topic, receiver: rx, mut od, offsets, producer, .. } = Scenario::new("hostile-retry-after", 1).await;
    // The key's next event must run after the dead one (`hold` would hold it).
    od.config.handler_extra = "on_dead = \"continue\"\n".into();
    od.config.max_attempts = 10;
    od.config.retry_extra = "max_elapsed = \"60s\"\n".into();
    // The event's own retry arithmetic; with the circuit, resilience:: checks the cap.
    od.config.circuit_extra = harness::daemon::NO_CIRCUIT.into();
    let (first, second) = (new_event_id(), new_event_id());
    let first_for_script = first.clone();
    rx.set_script(move |r| match (r.event_id.as_deref() == Some(first_for_script.as_str()), r.nth) {
        (true, 1 | 2) => Reply::status(503).retry_after("1"),
        (true, _) => Reply::status(503).retry_after("18446744073709551615"),
        (false, _) => Reply::ok(),
    });
    producer.send_event(&topic, "account-1", &first, Some("Test"), &json!({"n": 1})).await;
    producer.send_event(&topic, "account-1", &second, Some("Test"), &json!({"n": 2})).await;

    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the next event of the same key to be answered", HANDLED_TIMEOUT, || rx.answered_ok(&second)).await;
    od.wait_until("the committed offset to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.assert_alive();
    assert_no_panic(&od);
    od.stop();

    let record = od.store_get(&first);
    assert_eq!(record.state, "dead", "{record:?}");
    let reason = record.reason.clone().unwrap_or_default();
    assert!(reason.contains("gave up after 3 attempts") && reason.contains("503"), "{reason}");
    assert_eq!(rx.handler_call_count(&first), 3);
    assert_eq!(rx.handler_call_count(&second), 1);
    assert_eq!(od.store_get(&second).state, "done");
}

/// While a partition's head event hangs at the receiver, later events wait and the
/// committed offset cannot move: past `kafka.stall_timeout` `/readyz` says so (503,
/// naming the partition). Once the receiver answers, the partition is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_a_partition_that_has_not_moved_while_events_wait() {
    let mut s = Scenario::new("hostile-stall", 1).await;
    s.od.config.handler_timeout = "120s".into();
    s.od.config.kafka_extra = "stall_timeout = \"2s\"\n".into();
    let hold = Arc::new(AtomicBool::new(true));
    let head = new_event_id();
    let head_for_script = head.clone();
    let hold_for_script = hold.clone();
    s.receiver.set_script(move |r| {
        if r.event_id.as_deref() == Some(head_for_script.as_str()) {
            Reply::ok().hold(&hold_for_script)
        } else {
            Reply::ok()
        }
    });
    s.run().await;
    let Scenario { topic, receiver: rx, mut od, producer, .. } = s;
    let admin = od.admin_address();
    let (status, body) = readyz(&admin).await;
    assert_eq!(status, 200, "ready before anything waits: {body}");

    producer.send_event(&topic, "k1", &head, Some("Test"), &json!({"n": 1})).await;
    let later = new_event_id();
    producer.send_event(&topic, "k2", &later, Some("Test"), &json!({"n": 2})).await;
    od.wait_until("the later event of another key to be answered", HANDLED_TIMEOUT, || rx.answered_ok(&later)).await;

    let partition = json!(format!("{topic}/0"));
    let stalled = readyz_until(&admin, "readyz never reported the partition stalled", 503, |body| {
        body["stalled"].as_array().is_some_and(|a| a.contains(&partition))
    })
    .await;
    assert_eq!(stalled["ready"], false, "{stalled}");

    hold.store(false, Ordering::SeqCst);
    od.wait_until("the held event to be answered", HANDLED_TIMEOUT, || rx.answered_ok(&head)).await;
    let ready = readyz_until(&admin, "readyz stayed unready after the partition moved", 200, |_| true).await;
    assert_eq!(ready["stalled"], json!([]), "{ready}");
    assert_no_panic(&od);
    od.stop();
}

/// A webhook URL whose path and `?code=` come from `${VAR}`: the receiver is down, so
/// every attempt fails and the event ends dead and dead-lettered. The secrets reach
/// the request (that is their purpose) and nowhere else: not the log, not the record's
/// reason, not `store export`, not the dead letter's headers, not `check-config`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_the_url_never_appears_in_logs_records_or_dead_letters() {
    let Scenario { kafka, topic, receiver: _rx, mut od, offsets, producer } = Scenario::new("hostile-secret", 1).await;
    let dlq = kafka.create_topic(&unique_name("hostile-secret-dlq"), 1, &[]).await;
    // A port that refuses connections until the end of the test.
    let refusing = ClosedPort::bind();
    let closed = refusing.port();
    let suffix: u32 = rand::random();
    let (path_var, code_var) = (format!("OUTBOXD_IT_HOOK_{suffix:08x}"), format!("OUTBOXD_IT_CODE_{suffix:08x}"));
    let (path_secret, code_secret) = (format!("hookpath{suffix:08x}s3cr3t"), format!("codek3y{suffix:08x}"));
    od.config.env.insert(path_var.clone(), path_secret.clone());
    od.config.env.insert(code_var.clone(), code_secret.clone());
    od.config.url = format!("http://127.0.0.1:{closed}/hooks/${{{path_var}}}/{{event_id}}?code=${{{code_var}}}");
    od.config.max_attempts = 2;
    od.config.initial_backoff = "10ms".into();
    od.config.max_backoff = "20ms".into();
    od.config.handler_extra = dead_letter_toml(&dlq);
    // Dead within its own budget, so that the dead letter can be read.
    od.config.circuit_extra = harness::daemon::NO_CIRCUIT.into();
    let id = new_event_id();
    producer.send_event(&topic, "k", &id, Some("Test"), &json!({"n": 1})).await;

    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the failed event to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.stop();

    let record = od.store_get(&id);
    assert_eq!(record.state, "dead", "{record:?}");
    let reason = record.reason.clone().unwrap_or_default();
    assert!(reason.contains("could not connect"), "the reason still says what failed: {reason}");
    let letters = kafka.read_topic(&dlq, Duration::from_secs(30));
    assert_eq!(letters.len(), 1, "one dead letter");
    let export = od.command(&["store", "export"]);
    assert!(export.status.success(), "export: {}", String::from_utf8_lossy(&export.stderr));
    let check = od.command(&["check-config"]);
    assert!(check.status.success(), "check-config: {}", String::from_utf8_lossy(&check.stderr));

    let mut places = vec![
        ("the log", all_logs(&od)),
        ("the record", format!("{record:?}")),
        ("store export", String::from_utf8_lossy(&export.stdout).into_owned()),
        (
            "check-config",
            format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr)),
        ),
    ];
    for (name, value) in &letters[0].headers {
        places.push((
            "a dead-letter header",
            format!("{name}: {}", String::from_utf8_lossy(value.as_deref().unwrap_or_default())),
        ));
    }
    for (place, text) in &places {
        for secret in [&path_secret, &code_secret] {
            assert!(!text.contains(secret.as_str()), "the secret {secret} appears in {place}:\n{text}");
        }
    }
    assert!(
        places[3].1.contains(&format!("${{{path_var}}}")),
        "check-config shows the URL as written: {}",
        places[3].1
    );
}

/// A receiver that cannot be reached opens its handler's circuit. `/readyz`, which
/// anyone who reaches the port may read, names the handler under `degraded` and shows
/// its circuit's state, but not why it failed (a failure's text can name hosts and
/// addresses); `/v1/handlers`, behind a credential, says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_degraded_handler_but_not_why_it_failed() {
    let Scenario { topic, receiver: _rx, mut od, producer, .. } = Scenario::new("hostile-readyz-reason", 1).await;
    // A port that refuses connections until the end of the test.
    let refusing = ClosedPort::bind();
    let closed = refusing.port();
    od.config.url = format!("http://127.0.0.1:{closed}/events/{{event_id}}");
    producer.send_event(&topic, "k", &new_event_id(), Some("Test"), &json!({"n": 1})).await;
    od.start();
    od.wait_for_assignment().await;
    let admin = od.admin_address();
    let handler = json!(topic);
    let body = readyz_until(&admin, "readyz never named the handler degraded", 200, |body| {
        body["degraded"].as_array().is_some_and(|d| d.contains(&handler))
    })
    .await;
    let circuit = body["handlers"].as_array().and_then(|h| h.iter().find(|c| c["handler"] == handler));
    let circuit = circuit.unwrap_or_else(|| panic!("the handler's circuit in {body}"));
    assert_ne!(circuit["state"], "closed", "{body}");
    assert!(circuit.get("last_failure").is_none(), "no failure text on the open endpoint: {body}");
    assert!(!body.to_string().contains("could not connect"), "{body}");

    let url = format!("http://{admin}/v1/handlers");
    let resp = reqwest::Client::new().get(&url).bearer_auth(od.admin_token()).send().await.expect("GET /v1/handlers");
    assert_eq!(resp.status().as_u16(), 200);
    let handlers: Value = resp.json().await.expect("handlers JSON");
    let reason =
        handlers.as_array().and_then(|h| h.iter().find(|c| c["handler"] == handler)).map(|c| &c["last_failure"]);
    assert!(
        reason.and_then(Value::as_str).is_some_and(|r| r.contains("could not connect")),
        "behind the credential, why: {handlers}"
    );
    assert_no_panic(&od);
    od.stop();
}

/// Four 600 KB messages of different keys while the receiver holds every call: with
/// `max_in_flight_bytes = "1MiB"` only one of them is in memory and at the receiver at
/// a time (however many events `max_in_flight` would allow). When the receiver
/// answers, all four are handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_messages_are_bounded_by_bytes_as_well_as_by_count() {
    let Scenario { topic, receiver: rx, mut od, producer, .. } = Scenario::new("hostile-bytes", 1).await;
    od.config.store_extra = "max_in_flight_bytes = \"1MiB\"\n".into();
    od.config.handler_timeout = "120s".into();
    let hold = Arc::new(AtomicBool::new(true));
    let hold_for_script = hold.clone();
    rx.set_script(move |_| Reply::ok().hold(&hold_for_script));
    let filler = "x".repeat(600 * 1024);
    let mut ids = Vec::new();
    for i in 0..4 {
        let id = new_event_id();
        producer.send_event(&topic, &format!("key-{i}"), &id, Some("Test"), &json!({ "filler": filler })).await;
        ids.push(id);
    }

    od.start();
    od.wait_for_assignment().await;
    od.wait_until("a first call to reach the receiver", HANDLED_TIMEOUT, || rx.in_flight() >= 1).await;
    // Sample while everything is held: more than one call at a time would show here.
    let mut most = 0;
    for _ in 0..30 {
        most = most.max(rx.in_flight());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most, 1, "calls in flight at once with 1 MiB for 600 KB messages");
    hold.store(false, Ordering::SeqCst);
    od.wait_until("all four to be answered", HANDLED_TIMEOUT, || ids.iter().all(|id| rx.answered_ok(id))).await;
    assert_no_panic(&od);
    od.stop();
}

/// A schema registry the test controls: 503 until `serve` is set, then the Avro
/// schema `"string"` for every id.
fn toggled_registry(serve: Arc<AtomicBool>) -> harness::receiver::Server {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    async fn answer(State(serve): State<Arc<AtomicBool>>, uri: axum::http::Uri) -> axum::response::Response {
        if !serve.load(Ordering::SeqCst) {
            return (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response();
        }
        if uri.path().ends_with("/versions") {
            return (StatusCode::NOT_FOUND, axum::Json(json!({"error_code": 40403}))).into_response();
        }
        axum::Json(json!({"schema": "\"string\""})).into_response()
    }
    let app = axum::Router::new().fallback(answer).with_state(serve);
    harness::receiver::Server::start("toggled-registry", app)
}

/// An event waits for the schema registry on instance A while its partition moves to
/// instance B (A's revoke gives up after `drain_timeout`). When the registry answers,
/// both have the schema: only B, the owner, may run the event; A leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_waited_while_its_partition_moved_runs_only_on_the_new_owner() {
    let Scenario { kafka, topic, receiver: rx, od: mut a, producer, .. } = Scenario::new("hostile-moved", 2).await;
    let serve = Arc::new(AtomicBool::new(false));
    let registry = toggled_registry(serve.clone());
    let registry_toml = format!("\n[schema_registry]\nurl = \"http://{}\"\ntimeout = \"2s\"\n", registry.addr);
    let instance = |od: &mut harness::Outboxd, name: &str| {
        od.config.handler_extra = format!("format = \"avro\"\n{}", instance_header_toml(name));
        od.config.retry_extra = registry_toml.clone();
    };
    instance(&mut a, "a");
    let mut b = Outboxd::new(&kafka, &[&topic], &rx);
    b.config.group_id = a.config.group_id.clone();
    instance(&mut b, "b");

    // One event in each partition: the sticky assignor moves one partition to B.
    let ids = [new_event_id(), new_event_id()];
    let value = framed(1, &apache_avro::Schema::String, apache_avro::types::Value::String("order 7 paid".into()));
    for (partition, id) in ids.iter().enumerate() {
        let headers = [("id", Some(id.as_bytes()))];
        producer.send_raw(&topic, Some(partition as i32), Some(b"order-7"), &headers, Some(&value)).await;
    }
    a.start();
    a.wait_for_assignment().await;
    harness::wait_until("A to wait for the registry", HANDLED_TIMEOUT, || {
        logs::logged(&a, "waiting for the schema registry")
    })
    .await;

    b.start();
    let moved = |b: &harness::Outboxd| {
        (0..2).find(|p| {
            let name = format!("{topic}/{p}");
            logs::log_lines(b, "partitions assigned").iter().any(|l| l.contains(&name))
        })
    };
    harness::wait_until("B to be assigned a partition", HANDLED_TIMEOUT, || moved(&b).is_some()).await;
    let moved = moved(&b).expect("a moved partition");
    assert!(logs::logged(&a, "partitions revoked"), "A gave the partition up");
    serve.store(true, Ordering::SeqCst);

    let (moved_id, kept_id) = (&ids[moved], &ids[1 - moved]);
    b.wait_until("B to run the event of the moved partition", HANDLED_TIMEOUT, || rx.answered_ok(moved_id)).await;
    a.wait_until("A to run the event of the partition it kept", HANDLED_TIMEOUT, || rx.answered_ok(kept_id)).await;
    // A's registry wait has ended (it ran the other event): it must have left this one.
    harness::wait_until("A to run the moved event too, or to leave it", HANDLED_TIMEOUT, || {
        rx.handler_call_count(moved_id) > 1 || logs::logged(&a, "left to its new owner")
    })
    .await;
    let calls = rx.handler_calls(moved_id);
    assert_eq!(calls.len(), 1, "the event ran on both instances: {calls:?}");
    assert_eq!(calls[0].instance(), Some("b"));
    assert_eq!(rx.handler_calls(kept_id).len(), 1);
    assert_no_panic(&a);
    assert_no_panic(&b);
    a.stop();
    b.stop();
}

/// Rows of two tables read with `event_id = { field = "after.id" }`: `orders.id = 42`
/// and `invoices.id = 42` are two events, both run (by default each topic is its own
/// dedup scope). With `dedup_scope = "shared"` the second is a duplicate, as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_ids_from_two_tables_are_two_events_unless_the_scope_is_shared() {
    let kafka = Kafka::connect();
    for (scope, expected_calls) in [("topic", 2), ("shared", 1)] {
        let orders = kafka.create_topic(&unique_name("hostile-scope-orders"), 1, &[]).await;
        let invoices = kafka.create_topic(&unique_name("hostile-scope-invoices"), 1, &[]).await;
        let rx = Receiver::start();
        let mut od = Outboxd::new(&kafka, &[&orders, &invoices], &rx);
        od.config.url = format!("{}/events/{{topic}}/{{event_id}}", rx.base_url());
        od.config.handler_extra = format!("event_id = {{ field = \"after.id\" }}\ndedup_scope = \"{scope}\"\n");
        let producer = kafka.producer();
        for topic in [&orders, &invoices] {
            let row = json!({"before": null, "after": {"id": "42", "table": topic}, "op": "c"});
            producer.send_raw(topic, None, Some(b"42"), &[], Some(&serde_json::to_vec(&row).unwrap())).await;
        }
        od.start();
        od.wait_for_assignment().await;
        for topic in [&orders, &invoices] {
            let offsets = kafka.offsets(&od.config.group_id, topic);
            od.wait_until(format!("{topic} committed to its end"), HANDLED_TIMEOUT, || offsets.reached_end()).await;
        }
        let calls: Vec<String> = rx.calls().iter().filter(|c| c.is_handler_call()).map(|c| c.path.clone()).collect();
        assert_eq!(calls.len(), expected_calls, "dedup_scope = {scope}: {calls:?}");
        assert_no_panic(&od);
        od.stop();
    }
}

/// A bug (here a panic injected into debug builds for one event id) while handling
/// an event: the message is recorded dead under `failed/<topic>/<partition>/<offset>`
/// with the reason, the next event of the same key runs, and the partition commits
/// to its end. Without containment the key's chain died with its task and the
/// partition never committed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_handling_one_event_does_not_stall_its_key_or_partition() {
    let Scenario { topic, receiver: rx, mut od, offsets, producer, .. } = Scenario::new("hostile-panic", 1).await;
    // The key's next event must run, not wait behind the failed one (`hold` would hold it).
    od.config.handler_extra = "on_dead = \"continue\"\n".into();
    let (doomed, next) = (new_event_id(), new_event_id());
    // Only this outboxd gets it, and only for this id: other tests are unaffected.
    od.config.env.insert("OUTBOXD_DEBUG_PANIC_ON_EVENT".into(), doomed.clone());
    let doomed_at = producer.send_event(&topic, "account-9", &doomed, Some("Test"), &json!({"n": 1})).await;
    let (partition, offset) = (doomed_at.partition, doomed_at.offset);
    producer.send_event(&topic, "account-9", &next, Some("Test"), &json!({"n": 2})).await;

    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the next event of the same key to be answered", HANDLED_TIMEOUT, || rx.answered_ok(&next)).await;
    od.wait_until("the committed offset to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.assert_alive();
    assert!(logs::logged(&od, "handling failed unexpectedly"), "the bug is in the log");
    od.stop();

    let failed = od.store_get(&format!("failed/{topic}/{partition}/{offset}"));
    assert_eq!(failed.state, "dead", "{failed:?}");
    assert!(failed.reason.clone().unwrap_or_default().contains("injected for event"), "{failed:?}");
    assert_eq!(rx.handler_call_count(&doomed), 0);
    assert_eq!(od.store_get(&next).state, "done");
}
