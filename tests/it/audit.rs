//! The audit of repairs and the named credentials of the admin API: a repair made
//! through a running service is audited under the name of the token that made it,
//! with its reason and outcome; a `read` token may look and is refused a repair
//! (nothing changes, nothing is audited); a repair on a stopped store is audited as
//! `cli:<user>`; and a partition's audit follows it to its next owner through the
//! changelog. Needs the local stack.

use crate::harness;

use std::time::Duration;

use harness::{new_event_id, Behaviour, Outboxd, Scenario};
use serde_json::{json, Value};

use super::scale::{produce, two_instances};

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
const ALICE: &str = "alice-token-0123456789abcdef";
const VIEWER: &str = "viewer-token-0123456789abcdef";

/// `[[admin.tokens]]` for alice (operate, the default) and a viewer (read).
const TOKENS: &str = "\n[[admin.tokens]]\nname = \"alice\"\ntoken = \"${ALICE_TOKEN}\"\n\
                      \n[[admin.tokens]]\nname = \"viewer\"\ntoken = \"${VIEWER_TOKEN}\"\naccess = \"read\"\n";

/// Runs `outboxd ARGS --config FILE` with `OUTBOXD_ADMIN_TOKEN` set to `token`.
fn as_token(od: &Outboxd, token: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(harness::daemon::BIN)
        .envs(&od.config.env)
        .env("OUTBOXD_ADMIN_TOKEN", token)
        .args(args)
        .arg("--config")
        .arg(od.config_path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run outboxd")
}

/// Runs a command that must succeed; answers its stdout.
fn ok(out: std::process::Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `store audit --json [ARGS]` (through the service while it runs): the entries, newest first.
fn audit(od: &Outboxd, args: &[&str]) -> Vec<Value> {
    let mut full = vec!["store", "audit", "--json"];
    full.extend_from_slice(args);
    let text = ok(od.command(&full), "store audit");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("store audit printed no JSON ({e}): {text}"))
}

/// (who, action, first event id, reason, outcome) of each entry.
fn rows(entries: &[Value]) -> Vec<(String, String, String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    entries
        .iter()
        .map(|e| {
            (text(&e["who"]), text(&e["action"]), text(&e["events"][0]["id"]), text(&e["reason"]), text(&e["outcome"]))
        })
        .collect()
}

fn row(who: &str, action: &str, id: &str, reason: &str, outcome: &str) -> (String, String, String, String, String) {
    (who.into(), action.into(), id.into(), reason.into(), outcome.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repairs_through_the_service_are_audited_under_the_token_name_and_a_read_token_changes_nothing() {
    let mut s = Scenario::new("audit", 1).await;
    s.od.config.admin_extra = TOKENS.to_owned();
    s.od.config.env.insert("ALICE_TOKEN".into(), ALICE.into());
    s.od.config.env.insert("VIEWER_TOKEN".into(), VIEWER.into());
    s.od.config.handler_extra.push_str("on_dead = \"continue\"\n");
    let (done, resolved, retried, spared) = (new_event_id(), new_event_id(), new_event_id(), new_event_id());
    s.receiver.set_behaviour(&resolved, Behaviour::fail_first(400, 1));
    s.receiver.set_behaviour(&retried, Behaviour::fail_first(400, 1));
    s.run().await;
    let Scenario { topic, mut od, offsets, producer, .. } = s;
    for (i, id) in [&done, &resolved, &retried, &spared].into_iter().enumerate() {
        producer.send_event(&topic, &format!("order-{i}"), id, Some("OrderCreated"), &json!({"n": i})).await;
    }
    od.wait_until("every event final and committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;

    let checked = ok(od.command(&["check-config"]), "check-config");
    assert!(checked.contains("alice (operate), viewer (read)"), "check-config names the credentials: {checked}");
    assert!(!checked.contains(ALICE) && !checked.contains(VIEWER), "and never a token: {checked}");

    // The viewer may look, and is refused every repair: 403, nothing changed.
    ok(as_token(&od, VIEWER, &["store", "get", &spared, "--json"]), "a read by the viewer");
    for args in [
        vec!["store", "forget", spared.as_str(), "--yes", "--reason", "just looking"],
        vec!["store", "resolve", resolved.as_str(), "--done"],
        vec!["store", "retry", retried.as_str()],
        vec!["store", "gc"],
    ] {
        let out = as_token(&od, VIEWER, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} by the viewer");
        assert!(stderr.contains("403") && stderr.contains("\"viewer\" has read access"), "{args:?}: {stderr}");
    }
    let (status, body) = {
        let url = format!("http://{}/v1/forget?id={spared}", od.admin_address());
        let resp = reqwest::Client::new().post(url).bearer_auth(VIEWER).send().await.expect("POST /v1/forget");
        (resp.status().as_u16(), resp.text().await.unwrap())
    };
    assert_eq!(status, 403, "{body}");
    // Each refusal is audited under the viewer's name, with the reason it gave and why.
    let refusal = "refused: the credential has read access";
    let viewer_refused = [
        row("viewer", "forget", &spared, "-", refusal),
        row("viewer", "gc", "-", "-", refusal),
        row("viewer", "retry", &retried, "-", refusal),
        row("viewer", "resolve", &resolved, "-", refusal),
        row("viewer", "forget", &spared, "just looking", refusal),
    ];
    assert_eq!(rows(&audit(&od, &[])), viewer_refused, "refused at the door, and audited so");
    assert_eq!(od.command(&["store", "get", &spared, "--json"]).status.code(), Some(0), "the record is still there");

    // Alice repairs, with reasons; one without a reason, as scripts have always called it.
    ok(as_token(&od, ALICE, &["store", "forget", &done, "--yes", "--reason", "receiver lost it, INC-1"]), "forget");
    ok(as_token(&od, ALICE, &["store", "resolve", &resolved, "--done", "--reason", "done by hand"]), "resolve");
    ok(as_token(&od, ALICE, &["store", "retry", &retried]), "retry");
    let refused = as_token(&od, ALICE, &["store", "resolve", &spared, "--done", "--reason", "oops"]);
    assert!(!refused.status.success(), "resolving a done event is refused");

    let expected = [
        row("alice", "resolve", &spared, "oops", "error"),
        row("alice", "retry", &retried, "-", "done"),
        row("alice", "resolve", &resolved, "done by hand", "done"),
        row("alice", "forget", &done, "receiver lost it, INC-1", "done"),
    ];
    let expected: Vec<_> = expected.into_iter().chain(viewer_refused.iter().cloned()).collect();
    let live = audit(&od, &[]);
    let mut got = rows(&live);
    // A refused repair's outcome names the error: compare its start.
    got[0].4.truncate("error".len());
    assert_eq!(got, expected, "newest first: {live:?}");
    assert!(live[0]["outcome"].as_str().unwrap().contains("is done, not dead or parked"), "{}", live[0]);
    assert_eq!(live[3]["events"][0]["topic"], topic.as_str(), "where its record was");
    assert_eq!(rows(&audit(&od, &["--id", &resolved])), [expected[2].clone(), viewer_refused[3].clone()]);
    assert_eq!(audit(&od, &["--limit", "1"]).len(), 1);
    let viewer_audit = as_token(&od, VIEWER, &["store", "audit", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&ok(viewer_audit, "audit by the viewer").into_bytes()).unwrap(),
        json!(live)
    );

    // On the stopped store the same audit is there, and a repair made here is the OS user's.
    od.stop();
    assert_eq!(audit(&od, &[]), live, "the audit is in the store");
    ok(od.command(&["store", "forget", &spared, "--yes", "--reason", "cleanup"]), "forget on the stopped store");
    let who = audit(&od, &["--limit", "1"]);
    let user =
        std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).map_or("cli".to_owned(), |u| format!("cli:{u}"));
    assert_eq!(rows(&who), [row(&user, "forget", &spared, "cleanup", "done")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_of_a_partition_follows_it_to_its_next_owner() {
    let (Scenario { kafka, topic, receiver, od: mut a, offsets, .. }, mut b) = two_instances("audit-move", 2).await;
    let events: Vec<(String, String)> = (0..8).map(|i| (format!("agg-{i}"), new_event_id())).collect();
    let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
    a.start();
    a.wait_for_assignment().await;
    let produced = produce(&kafka, &topic, &events).await;
    a.wait_until("A to answer every event", HANDLED_TIMEOUT, || ids.iter().all(|id| receiver.answered(id))).await;
    a.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    let in_partition = |p: i32| produced.iter().find(|e| e.partition == p).map(|e| e.event_id.clone());
    let (Some(first), Some(second)) = (in_partition(0), in_partition(1)) else {
        panic!("events in both partitions: {produced:?}")
    };

    // One forget through A's admin API (the owner file's token: `local`), one on A's stopped store.
    ok(a.command(&["store", "forget", &first, "--yes", "--reason", "through the service"]), "forget via A");
    a.stop();
    ok(a.command(&["store", "forget", &second, "--yes", "--reason", "on the stopped store"]), "forget on A's store");
    let on_a = audit(&a, &[]);
    assert_eq!(on_a.len(), 2, "{on_a:?}");

    // B, with an empty store, owns both partitions now: it restores their audit with their records.
    b.start();
    b.wait_for_assignment().await;
    let on_b = audit(&b, &[]);
    b.stop();
    let mut on_b_sorted = rows(&on_b);
    let mut on_a_sorted = rows(&on_a);
    on_b_sorted.sort();
    on_a_sorted.sort();
    assert_eq!(on_b_sorted, on_a_sorted, "B has A's audit of both partitions");
    assert!(rows(&on_b).iter().any(|r| r.0 == "local" && r.2 == first && r.3 == "through the service"), "{on_b:?}");
    assert_eq!(
        on_b.iter().map(|e| e["at"].clone()).collect::<Vec<_>>(),
        on_a.iter().map(|e| e["at"].clone()).collect::<Vec<_>>()
    );
}
