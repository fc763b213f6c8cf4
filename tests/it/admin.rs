//! The admin API of a running outboxd: metrics that match what happened, health
//! and readiness, `outboxd store …` answering the same through the running
//! service as from the stopped store (each typed view read back through the API equal
//! to the store's own), and the store API's door: a credential
//! for every `/v1` route, no browsers, no foreign `Host`, every record reachable
//! page by page, and retries that finish when their client leaves.

use crate::harness;

use std::time::Duration;

use harness::wait::keep_looking;
use harness::{new_event_id, Behaviour, Outboxd, Scenario};
use serde_json::{json, Value};

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);

async fn http_get(url: &str) -> (u16, String) {
    let resp = reqwest::get(url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (resp.status().as_u16(), resp.text().await.expect("body"))
}

/// The value of one Prometheus sample whose line starts with `prefix` (name and labels).
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().expect("sample value"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_happened() {
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::start("admin-metrics", 2).await;
    let admin = od.admin_address();

    let (status, body) = http_get(&format!("http://{admin}/healthz")).await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));

    let mut events = Vec::new();
    for i in 0..20 {
        let id = new_event_id();
        let key = format!("order-{}", i % 4);
        producer.send_event(&topic, &key, &id, Some("OrderCreated"), &json!({"n": i})).await;
        events.push((key, id));
    }
    od.wait_until("all 20 events answered", HANDLED_TIMEOUT, || events.iter().all(|(_, id)| receiver.answered(id)))
        .await;
    // Five duplicates at new offsets (what Debezium does after a crash), one undecodable message.
    for (key, id) in &events[..5] {
        producer.send_event(&topic, key, id, Some("OrderCreated"), &json!({"dup": true})).await;
    }
    producer.send_raw(&topic, None, Some(b"k".as_slice()), &[], Some(b"{}".as_slice())).await;
    od.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;

    let (status, metrics) = http_get(&format!("http://{admin}/metrics")).await;
    assert_eq!(status, 200);
    let t = topic.as_str();
    assert_eq!(sample(&metrics, "outboxd_events_consumed_total", &[("topic", t)]), 26.0, "{metrics}");
    assert_eq!(sample(&metrics, "outboxd_events_handled_total", &[("topic", t)]), 20.0);
    assert_eq!(sample(&metrics, "outboxd_duplicates_suppressed_total", &[("topic", t), ("cause", "new_offset")]), 5.0);
    assert_eq!(
        sample(&metrics, "outboxd_duplicates_suppressed_total", &[("topic", t), ("cause", "redelivered_offset")]),
        0.0
    );
    assert_eq!(sample(&metrics, "outboxd_events_dead_total", &[("topic", t)]), 1.0);
    assert_eq!(sample(&metrics, "outboxd_handler_duration_seconds_count", &[("topic", t)]), 20.0);
    assert!(sample(&metrics, "outboxd_store_commit_batch_records_count", &[]) >= 1.0);
    assert_eq!(receiver.calls().len(), 20, "duplicates never reached the receiver");

    let (status, body) = http_get(&format!("http://{admin}/readyz")).await;
    let ready: Value = serde_json::from_str(&body).expect("readyz JSON");
    assert_eq!(status, 200, "{body}");
    assert_eq!(ready["partitions"], 2);
    assert_eq!(ready["draining"], false);
    od.stop();
}

/// Event ids in `outboxd store export` (JSON Lines), in order.
fn export_ids(od: &Outboxd) -> Vec<String> {
    let out = od.command(&["store", "export"]);
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line")["event_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Runs a one-shot `outboxd` command that must succeed and print JSON.
fn run(od: &Outboxd, args: &[&str]) -> Value {
    let out = od.command(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_commands_answer_the_same_through_the_running_service() {
    let Scenario { topic, receiver: _receiver, mut od, offsets, producer, .. } =
        Scenario::start("admin-store", 1).await;
    let ids: Vec<String> = (0..5).map(|_| new_event_id()).collect();
    for id in &ids {
        producer.send_event(&topic, "order-1", id, Some("OrderCreated"), &json!({"id": id})).await;
    }
    od.wait_until("committed offsets to reach the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;

    let live_get = run(&od, &["store", "get", &ids[2], "--json"]);
    let live_list = run(&od, &["store", "list", "--json"]);
    let mut live_stats = run(&od, &["store", "stats", "--json"]);
    let live_export = export_ids(&od);
    let gc = od.command(&["store", "gc"]);
    assert!(gc.status.success(), "gc through the service: {}", String::from_utf8_lossy(&gc.stderr));
    let forgotten = od.command(&["store", "forget", &ids[4], "--yes"]);
    assert!(forgotten.status.success(), "{}", String::from_utf8_lossy(&forgotten.stderr));
    let after_forget = od.command(&["store", "get", &ids[4], "--json"]);
    assert!(!after_forget.status.success(), "forgotten through the service, the record is gone");
    od.stop();

    let stopped_get = run(&od, &["store", "get", &ids[2], "--json"]);
    let stopped_list = run(&od, &["store", "list", "--json"]);
    let mut stopped_stats = run(&od, &["store", "stats", "--json"]);
    let stopped_export = export_ids(&od);
    assert_eq!(live_export.len(), 5, "export through the running service");
    assert_eq!(stopped_export, live_export.iter().filter(|id| **id != ids[4]).cloned().collect::<Vec<_>>());
    assert_eq!(live_get, stopped_get);
    let live_ids: Vec<&Value> = live_list.as_array().unwrap().iter().map(|r| &r["event_id"]).collect();
    assert_eq!(live_ids.len(), 5);
    let stopped_records = stopped_list.as_array().unwrap();
    assert_eq!(stopped_records.len(), 4, "the forgotten record stays gone");
    for r in stopped_records {
        let live = live_list.as_array().unwrap().iter().find(|l| l["event_id"] == r["event_id"]).expect("listed live");
        assert_eq!(live, r);
    }
    // Size on disk moves with sled's own bookkeeping; the counts must agree.
    live_stats.as_object_mut().unwrap().remove("bytes_on_disk");
    stopped_stats.as_object_mut().unwrap().remove("bytes_on_disk");
    live_stats["done"] = json!(live_stats["done"].as_u64().unwrap() - 1);
    assert_eq!(live_stats["done"], stopped_stats["done"]);
    assert_eq!(live_stats["duplicates_suppressed"], stopped_stats["duplicates_suppressed"]);
}

/// Each typed view, read through the admin API by its client, equals what the
/// store itself says once the service stopped: server and client read and write
/// the same fields, and the repairs answer what they did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_reads_back_through_the_admin_api_as_the_store_itself_says() {
    use outboxd::ops::{self, Actor, Needs, Opened, OpsError, Remote, StoreApi};
    use outboxd::ops::{AdminClient, AdminError};
    use outboxd::wire::{GcView, StatsView};

    let Scenario { topic, receiver: _receiver, mut od, offsets, producer, .. } =
        Scenario::start("admin-views", 1).await;
    let mut ids: Vec<String> = (0..4).map(|_| new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        producer.send_event(&topic, &format!("order-{i}"), id, Some("OrderCreated"), &json!({"n": i})).await;
    }
    od.wait_until("all 4 events done and committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    ids.sort();

    let client = || AdminClient::new(&od.admin_address(), Some(od.admin_token())).expect("an admin client");
    let remote = Remote::new(client());
    let me = Actor::new("ignored: the service names its caller", None).unwrap();
    // The repairs first: the reads after them see the store as it stays once stopped.
    let before = remote.get(&ids[3]).await.unwrap().expect("a record before forget");
    assert_eq!(remote.forget(&ids[3], &me).await.unwrap(), before, "forget answers the record as it was");
    match remote.forget(&ids[3], &me).await {
        Err(OpsError::NotFound(id)) => assert_eq!(id, ids[3]),
        other => panic!("forgetting it again: {other:?}"),
    }
    assert_eq!(remote.gc(&me).await.unwrap(), GcView { removed: 0 }, "nothing has expired");
    match remote.rerun(&ids[0], &me).await {
        Err(OpsError::Remote(AdminError::Status { status: 409, message })) => assert!(message.contains(&ids[0])),
        other => panic!("re-running a done event is a conflict: {other:?}"),
    }
    let refused = AdminClient::new(&od.admin_address(), Some("not-the-token".into())).unwrap().stats().await;
    assert!(matches!(refused, Err(AdminError::Status { status: 401, .. })), "{refused:?}");

    let live_stats = remote.stats().await.unwrap();
    let live_record = remote.get(&ids[0]).await.unwrap().expect("a record");
    let live_list = remote.list(None, Some(&topic), usize::MAX).await.unwrap();
    let admin = client();
    let live_first = admin.page(None, Some(&topic), None, 2).await.unwrap();
    let live_second = admin.page(None, Some(&topic), live_first.next.as_deref(), 2).await.unwrap();
    let remote_audit = remote.audit(None, 100).await.unwrap();
    let actions: Vec<_> = remote_audit.entries.iter().map(|e| (e.action.as_str(), e.who.as_str())).collect();
    assert_eq!(
        actions,
        [("retry", "local"), ("gc", "local"), ("forget", "local"), ("forget", "local")],
        "newest first, the refused ones too, under the per-run token's name"
    );
    od.stop();

    let opened = ops::open(od.config_path(), None, Needs::Records).expect("the stopped service's store");
    let Opened::Local(local) = opened else { panic!("no service holds the store any more") };
    // Size on disk moves with sled's own bookkeeping; everything else must agree.
    // The service answers from the counts it keeps, its oldest and newest to within
    // the slices holding records; the stopped store counts every record.
    let counts = |s: StatsView| StatsView { bytes_on_disk: 0, oldest: None, newest: None, ..s };
    let stats = local.stats().unwrap();
    assert_eq!(counts(live_stats.clone()), counts(stats.clone()));
    let (Some(oldest), Some(newest)) = (stats.oldest.clone(), stats.newest.clone()) else { panic!("{stats:?}") };
    assert!(live_stats.oldest.as_ref().is_some_and(|o| *o <= oldest), "{live_stats:?} against {stats:?}");
    assert!(live_stats.newest.as_ref().is_some_and(|n| *n >= newest), "{live_stats:?} against {stats:?}");
    assert_eq!((stats.done, stats.dead, stats.claimed, stats.parked), (3, 0, 0, 0), "{stats:?}");
    assert_eq!(local.get(&ids[0]).unwrap(), Some(live_record));
    assert_eq!(local.get(&ids[3]).unwrap(), None, "the forgotten record stays gone");
    assert_eq!(StoreApi::list(&local, None, Some(&topic), usize::MAX).await.unwrap(), live_list);
    assert_eq!(live_list.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>(), ids[..3]);
    let first = local.page(None, Some(&topic), None, 2).unwrap();
    assert_eq!(first, live_first);
    assert!(first.next.is_some(), "a third record follows");
    let second = local.page(None, Some(&topic), first.next.as_deref(), 2).unwrap();
    assert_eq!((second.records.len(), second.next.as_deref()), (1, None));
    assert_eq!(second, live_second);
    let live_audit = remote_audit;
    assert_eq!(StoreApi::audit(&local, None, 100).await.unwrap(), live_audit, "the audit reads back alike");
    assert_eq!(StoreApi::gc(&local, &me).await.unwrap(), GcView { removed: 0 });
}

/// One request to the admin server: status and body.
async fn request(method: reqwest::Method, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = reqwest::Client::new().request(method.clone(), url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    (resp.status().as_u16(), resp.text().await.expect("body"))
}

/// The `error` of a JSON error answer.
fn error_of(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("error answer is not JSON ({e}): {body}"));
    v["error"].as_str().unwrap_or_else(|| panic!("no error in {body}")).to_owned()
}

/// Runs `outboxd ARGS --config FILE` with extra environment variables.
fn command_with_env(od: &Outboxd, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(harness::daemon::BIN)
        .args(args)
        .arg("--config")
        .arg(od.config_path())
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run outboxd")
}

/// A running outboxd on a fresh topic with `admin_extra` in its `[admin]`, its
/// partitions assigned.
async fn running(name: &str, admin_extra: &str) -> Scenario {
    let mut s = Scenario::new(name, 1).await;
    s.od.config.admin_extra = admin_extra.to_owned();
    s.run().await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_without_a_credential_are_refused_even_on_loopback() {
    use reqwest::Method;
    use std::os::unix::fs::PermissionsExt;
    // Every path is tried with wrong credentials, more than the default limit of
    // failures per address allows (tests/it/admin_limits.rs tries that limit).
    let limits = "failures_per_address = 1000\nfailures_total = 1000\n";
    let Scenario { kafka, topic, receiver, mut od, .. } = running("admin-auth", limits).await;
    let id = new_event_id();
    kafka.producer().send_event(&topic, "order-1", &id, Some("OrderCreated"), &json!({"secret": "payload"})).await;
    od.wait_until("the event answered", HANDLED_TIMEOUT, || receiver.answered(&id)).await;
    let admin = od.admin_address();
    let owner = od.config.store_path.join("outboxd.owner");
    let mode = std::fs::metadata(&owner).expect("owner file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the owner file holds the token: its user only");
    let token = od.admin_token();
    let bearer = format!("Bearer {token}");

    let reads: [&str; 5] = ["/v1/stats", "/v1/events", &format!("/v1/events/{id}"), "/v1/export", "/v1/audit"];
    let repairs: [&str; 4] =
        ["/v1/gc", &format!("/v1/forget?id={id}"), &format!("/v1/resolve?id={id}"), &format!("/v1/retry?id={id}")];
    let all = reads.iter().map(|p| (Method::GET, p)).chain(repairs.iter().map(|p| (Method::POST, p)));
    for (method, path) in all {
        let url = format!("http://{admin}{path}");
        let (status, body) = request(method.clone(), &url, &[]).await;
        assert_eq!(status, 401, "{method} {path} without a credential: {body}");
        assert!(error_of(&body).contains("missing credential"), "{body}");
        let (status, body) = request(method.clone(), &url, &[("authorization", "Bearer not-the-token")]).await;
        assert_eq!(status, 401, "{method} {path} with a wrong token: {body}");
        assert!(error_of(&body).contains("wrong credential"), "{body}");
        let prefix = format!("Bearer {}", &token[..token.len() - 1]);
        assert_eq!(request(method.clone(), &url, &[("authorization", &prefix)]).await.0, 401, "{path}: a prefix");
    }
    for path in reads {
        let (status, body) =
            request(Method::GET, &format!("http://{admin}{path}"), &[("authorization", &bearer)]).await;
        assert_eq!(status, 200, "GET {path} with the owner file's token: {body}");
        if path.contains("events") || path.contains("export") {
            assert!(body.contains(&id), "{path}: {body}");
        }
    }
    for (path, open) in [("/healthz", 200), ("/metrics", 200)] {
        assert_eq!(request(Method::GET, &format!("http://{admin}{path}"), &[]).await.0, open, "{path} stays open");
    }
    let (status, _) = request(Method::GET, &format!("http://{admin}/readyz"), &[]).await;
    assert_ne!(status, 401, "/readyz stays open");
    // The CLI finds the token in the owner file by itself.
    let out = od.command(&["store", "get", &id, "--json"]);
    assert!(out.status.success(), "store get through the service: {}", String::from_utf8_lossy(&out.stderr));
    od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_token_keeps_working_and_an_explicit_env_token_wins() {
    use reqwest::Method;
    let configured = "configured-admin-token-for-remote-callers";
    let Scenario { receiver: _receiver, mut od, .. } =
        running("admin-token", &format!("token = \"{configured}\"\n")).await;
    let admin = od.admin_address();
    let url = format!("http://{admin}/v1/stats");
    for token in [configured.to_owned(), od.admin_token()] {
        let (status, body) = request(Method::GET, &url, &[("authorization", &format!("Bearer {token}"))]).await;
        assert_eq!(status, 200, "{body}");
    }
    let stats = |env: &[(&str, &str)]| command_with_env(&od, &["store", "stats", "--json"], env);
    assert!(stats(&[]).status.success(), "the owner file's token");
    assert!(stats(&[("OUTBOXD_ADMIN_TOKEN", configured)]).status.success(), "the configured token from the env");
    let wrong = stats(&[("OUTBOXD_ADMIN_TOKEN", "not-the-token")]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success(), "OUTBOXD_ADMIN_TOKEN wins over the owner file");
    assert!(stderr.contains("401") && stderr.contains("OUTBOXD_ADMIN_TOKEN"), "{stderr}");
    assert!(!stderr.contains(configured) && !stderr.contains(&od.admin_token()), "no token printed: {stderr}");
    od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_requests_and_unexpected_hosts_are_refused() {
    use reqwest::Method;
    let Scenario { receiver: _receiver, mut od, .. } =
        running("admin-origin", "allowed_hosts = [\"outboxd.test\"]\n").await;
    let admin = od.admin_address();
    let port = admin.rsplit(':').next().unwrap().to_owned();
    let bearer = format!("Bearer {}", od.admin_token());
    let stats = format!("http://{admin}/v1/stats");
    let auth = ("authorization", bearer.as_str());

    for (headers, why) in [
        (vec![auth, ("origin", "http://evil.example")], "a page of another origin"),
        (vec![auth, ("origin", "null")], "a sandboxed page"),
        (vec![auth, ("sec-fetch-site", "cross-site")], "a cross-site fetch"),
        (vec![auth, ("host", &format!("rebound.example:{port}"))], "DNS rebinding: a foreign name for 127.0.0.1"),
        (vec![auth, ("host", "outboxd.test.evil.example")], "a name that only starts like an allowed one"),
    ] {
        let (status, body) = request(Method::GET, &stats, &headers).await;
        assert_eq!(status, 403, "{why}: {body}");
        assert!(!error_of(&body).is_empty());
    }
    let (status, body) =
        request(Method::POST, &format!("http://{admin}/v1/gc"), &[auth, ("origin", "http://evil.example")]).await;
    assert_eq!(status, 403, "a cross-origin repair: {body}");
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "outboxd.test".to_owned(),
        format!("OUTBOXD.test:{port}"),
    ] {
        let (status, body) = request(Method::GET, &stats, &[auth, ("host", &host)]).await;
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    // Prometheus scrapes by pod IP: the open endpoints do not look at Host.
    let (status, _) = request(Method::GET, &format!("http://{admin}/metrics"), &[("host", "10.1.2.3:9464")]).await;
    assert_eq!(status, 200);
    od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dead_record_is_listed_and_retried_page_by_page() {
    let mut s = Scenario::new("admin-pages", 1).await;
    // 400 is permanent: each event is dead after its first call, and succeeds when retried.
    s.receiver.set_default(Behaviour::fail_first(400, 1));
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;
    let mut ids: Vec<String> = (0..25).map(|_| new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        producer.send_event(&topic, &format!("order-{i}"), id, Some("OrderCreated"), &json!({"n": i})).await;
    }
    od.wait_until("all 25 events dead and committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    ids.sort();

    let admin = od.admin_address();
    let bearer = format!("Bearer {}", od.admin_token());
    let mut listed = Vec::new();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("http://{admin}/v1/events?state=dead&limit=10");
        if let Some(a) = &after {
            let a: String = url::form_urlencoded::byte_serialize(a.as_bytes()).collect();
            url.push_str(&format!("&after={a}"));
        }
        let (status, body) = request(reqwest::Method::GET, &url, &[("authorization", &bearer)]).await;
        assert_eq!(status, 200, "{body}");
        let page: Value = serde_json::from_str(&body).expect("JSON");
        let records = page["records"].as_array().unwrap_or_else(|| panic!("no records in {body}"));
        pages.push(records.len());
        listed.extend(records.iter().map(|r| r["event_id"].as_str().unwrap().to_owned()));
        match page["next"].as_str() {
            Some(next) => {
                // An opaque cursor: the last record's key, which starts with its event id.
                let last = listed.last().expect("a page before a next");
                assert!(next.starts_with(last.as_str()), "next {next:?} names the last record of the page ({last})");
                after = Some(next.to_owned());
            }
            None => break,
        }
        assert!(pages.len() < 10, "pages never end: {pages:?}");
    }
    assert_eq!(pages, [10, 10, 5]);
    assert_eq!(listed, ids, "every dead record once, in id order");

    // The CLI pages too: with 10 records a page, --all-dead still reaches all 25.
    let out = command_with_env(&od, &["store", "retry", "--all-dead"], &[("OUTBOXD_ADMIN_PAGE_SIZE", "10")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "retry --all-dead: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("25 done, 0 failed"), "{stdout}");
    for id in &ids {
        assert_eq!(receiver.call_count(id), 2, "{id}: the failed call and the retried one");
    }
    od.stop();
    assert!(od.store_list(Some("dead"), 100).is_empty(), "no dead record left");
    assert_eq!(od.store_list(Some("done"), 100).len(), 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_retry_finishes_after_its_client_goes_away() {
    let Scenario { kafka, topic, receiver, mut od, .. } = running("admin-retry-drop", "").await;
    let id = new_event_id();
    receiver.set_behaviour(&id, Behaviour::fail_first(400, 1));
    kafka.producer().send_event(&topic, "order-1", &id, Some("OrderCreated"), &json!({"n": 1})).await;
    let admin = od.admin_address();
    let bearer = format!("Bearer {}", od.admin_token());
    let state = || async {
        let (status, body) =
            request(reqwest::Method::GET, &format!("http://{admin}/v1/events/{id}"), &[("authorization", &bearer)])
                .await;
        if status != 200 {
            return format!("{status}");
        }
        serde_json::from_str::<Value>(&body).expect("JSON")["state"].as_str().unwrap().to_owned()
    };
    harness::wait_until_async("the event to become dead", HANDLED_TIMEOUT, async || state().await == "dead").await;

    // The receiver takes 5 s; the client gives up after 1 s and closes its connection.
    receiver.set_behaviour(&id, Behaviour::delay(Duration::from_secs(5)));
    let impatient = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap();
    let gone = impatient
        .post(format!("http://{admin}/v1/retry?id={id}"))
        .header("authorization", &bearer)
        .send()
        .await
        .expect_err("the client leaves before the receiver answers");
    assert!(gone.is_timeout(), "{gone}");
    let calls = receiver.calls_for(&id);
    assert_eq!(calls.len(), 2, "the re-execution was calling the receiver when the client left");
    assert!(calls[1].answered.is_none(), "the receiver had not answered yet");

    // The receiver answers 5 s after the call started; the record is done just after.
    let done = keep_looking(Duration::from_secs(20), harness::POLL_EVERY, async || {
        let s = state().await;
        if s == "done" {
            Ok(s)
        } else {
            Err(s)
        }
    });
    let last = done.await.unwrap_or_else(|last| last);
    assert_eq!(last, "done", "the retry finished without its client (not stranded `claimed`)");
    let second = &receiver.calls_for(&id)[1];
    assert_eq!((second.status, second.answered.is_some()), (200, true), "the receiver's answer was awaited");
    od.stop();
}
