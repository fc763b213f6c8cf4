//! The admin server under attack, against a running outboxd: idle and half-sent
//! sockets are closed and never take the descriptors the engine needs, wrong
//! credentials never lock out a right one, a console tab left polling still ends,
//! a `read` credential's lists never read the whole store, and a repair it is
//! refused is audited.

use crate::harness;

use std::time::{Duration, Instant};

use harness::{new_event_id, Scenario};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
/// Far above the admin server's 2 s head timeout in these tests: what is asserted is
/// that it closes what it must and answers again, not how fast.
const WITHIN: Duration = Duration::from_secs(30);

/// A read credential, and an operator's, as `[[admin.tokens]]`.
const TOKENS: &str = "[[admin.tokens]]\nname = \"viewer\"\ntoken = \"viewer-0123456789abcdef\"\naccess = \"read\"\n\
                      [[admin.tokens]]\nname = \"alice\"\ntoken = \"alice-0123456789abcdef\"\n";
const VIEWER: &str = "viewer-0123456789abcdef";
const ALICE: &str = "alice-0123456789abcdef";

async fn healthz(admin: &str) -> bool {
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
    client.get(format!("http://{admin}/healthz")).send().await.is_ok_and(|r| r.status() == 200)
}

/// Whether the server closed `s` within `within` (end of stream, or a reset).
async fn closed(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// The value of a Prometheus counter or gauge (summed over its series).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_neither_take_the_descriptors_nor_silence_healthz_and_events_keep_flowing() {
    let mut s = Scenario::new("admin-idle-sockets", 2).await;
    // The descriptors of a small container: far fewer than the sockets sent at the port.
    s.od.config.max_open_files = Some(256);
    s.od.config.admin_extra = "max_connections = 64\nheader_timeout = \"2s\"\n".into();
    s.run().await;
    let admin = s.od.admin_address();

    // Sockets that send half a request line and wait, as many as this test may open.
    let mut sockets = Vec::new();
    for _ in 0..1500 {
        match TcpStream::connect(&admin).await {
            Ok(mut sock) => {
                let _ = sock.write_all(b"GET /healthz HTT").await;
                sockets.push(sock);
            }
            Err(e) if e.raw_os_error() == Some(24) => break, // this test's own limit (EMFILE)
            Err(e) => panic!("connecting to the admin port: {e}"),
        }
    }
    assert!(sockets.len() >= 600, "only {} sockets opened: raise this shell's open-file limit", sockets.len());

    // Events flow meanwhile: the engine's descriptors (brokers, the receiver) are its own.
    let ids: Vec<String> = (0..20).map(|_| new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        s.producer.send_event(&s.topic, &format!("k{i}"), id, Some("Tick"), &json!({"i": i})).await;
    }
    let receiver = &s.receiver;
    s.od.wait_until("every event answered during the flood", HANDLED_TIMEOUT, || {
        ids.iter().all(|id| receiver.answered(id))
    })
    .await;
    // /healthz answers again once the idle ones are closed, while the sockets are still held.
    let started = Instant::now();
    while !healthz(&admin).await {
        assert!(started.elapsed() < WITHIN, "/healthz did not answer during the flood");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every socket is closed by the server: those past the bound at once, the others
    // after the head timeout.
    for (i, sock) in sockets.iter_mut().enumerate() {
        assert!(closed(sock, WITHIN).await, "socket {i} of the flood is still open");
    }
    let metrics = reqwest::get(format!("http://{admin}/metrics")).await.unwrap().text().await.unwrap();
    assert!(sample(&metrics, "outboxd_admin_connections_refused_total") > 0.0, "{metrics}");
    s.od.stop();
    let log = s.od.log();
    assert!(!log.contains("Too many open files"), "outboxd ran out of descriptors:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_from_one_address_never_lock_out_a_right_one() {
    let mut s = Scenario::new("admin-wrong-tokens", 1).await;
    s.od.config.admin_extra = format!("failures_per_address = 5\nfailures_total = 20\n{TOKENS}");
    s.run().await;
    let base = format!("http://{}", s.od.admin_address());
    let http = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    // A flood of wrong tokens from this address, on the store API and at the console's login.
    let mut limited = 0;
    for i in 0..40 {
        let api = http.get(format!("{base}/v1/stats")).bearer_auth(format!("wrong-token-{i:02}-0123456789")).send();
        let status = api.await.unwrap().status();
        assert!(status == 401 || status == 429, "{status}");
        limited += usize::from(status == 429);
        let login = http.post(format!("{base}/ui/login")).header("origin", &base).form(&[("token", "nope")]).send();
        let status = login.await.unwrap().status();
        assert!(status == 401 || status == 429, "{status}");
    }
    assert!(limited > 0, "the flood was never answered 429");
    // From the same address, at once: the right credentials are let in.
    let ok = http.get(format!("{base}/v1/stats")).bearer_auth(ALICE).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let login = http.post(format!("{base}/ui/login")).header("origin", &base).form(&[("token", ALICE)]).send();
    let login = login.await.unwrap();
    assert_eq!(login.status(), 303, "the operator's login is refused: {:?}", login.text().await);
    assert!(login.headers().get("set-cookie").is_some_and(|c| c.to_str().unwrap().starts_with("outboxd_session=")));
    s.od.stop();
}

/// Logs in with `token` and answers the session cookie (`name=value`).
async fn login(http: &reqwest::Client, base: &str, token: &str) -> String {
    let resp =
        http.post(format!("{base}/ui/login")).header("origin", base).form(&[("token", token)]).send().await.unwrap();
    assert_eq!(resp.status(), 303, "login refused");
    let cookie = resp.headers().get("set-cookie").expect("a session cookie").to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_tab_left_polling_is_logged_out_after_session_idle() {
    let mut s = Scenario::new("admin-polling-tab", 1).await;
    s.od.config.admin_extra = "[admin.ui]\nsession_idle = \"3s\"\n".into();
    s.run().await;
    let base = format!("http://{}", s.od.admin_address());
    let http = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let cookie = login(&http, &base, &s.od.admin_token()).await;
    let poll =
        || http.get(format!("{base}/ui/overview/live")).header("cookie", &cookie).header("hx-request", "true").send();
    assert_eq!(poll().await.unwrap().status(), 200, "the live part answers a fresh login");
    // What an open tab does: the live part, every second. Nobody uses the page.
    let started = Instant::now();
    let logged_out = loop {
        let resp = poll().await.unwrap();
        if resp.status() == 401 {
            break resp;
        }
        assert!(started.elapsed() < WITHIN, "a tab that only polled was never logged out");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(started.elapsed() >= Duration::from_secs(2), "logged out before session_idle");
    assert_eq!(logged_out.headers().get("hx-redirect").map(|v| v.to_str().unwrap()), Some("/ui/login"));
    s.od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_refused_to_a_read_credential_is_audited() {
    let mut s = Scenario::new("admin-refused-audit", 1).await;
    s.od.config.admin_extra = TOKENS.into();
    s.run().await;
    let base = format!("http://{}", s.od.admin_address());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let refused =
        http.post(format!("{base}/v1/forget?id=e-1&reason=cleanup")).bearer_auth(VIEWER).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    let audit: Value =
        http.get(format!("{base}/v1/audit?id=e-1")).bearer_auth(VIEWER).send().await.unwrap().json().await.unwrap();
    let entries = audit["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 1, "{audit}");
    let e = &entries[0];
    assert_eq!(
        (e["who"].as_str(), e["action"].as_str(), e["reason"].as_str()),
        (Some("viewer"), Some("forget"), Some("cleanup"))
    );
    assert!(e["outcome"].as_str().unwrap().starts_with("refused"), "{e}");
    s.od.stop();
}

/// A store of many done records (restored from a changelog written as outboxd writes
/// it) and a few dead ones: a `read` credential's dead groups, lists of dead events
/// and filtered lists answer from the index of dead events or within the read budget,
/// never by reading every record. Size knob: `OUTBOXD_ADMIN_BIG_STORE_RECORDS`
/// (default 200,000; 1,000,000 is the full size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_credentials_lists_never_read_the_whole_store() {
    let records = harness::env_usize("OUTBOXD_ADMIN_BIG_STORE_RECORDS", 200_000).max(10_000);
    let mut s = Scenario::new("admin-big-store", 1).await;
    s.od.config.admin_extra = format!("read_budget = 5000\n{TOKENS}");
    s.od.config.max_attempts = 1;
    let changelog_topic = harness::changelog::topic_for(&s.od.config.group_id, &s.topic);
    s.kafka.create_topic(&changelog_topic, 1, &[("cleanup.policy", "compact,delete")]).await;
    harness::changelog::fill(&s.kafka, &changelog_topic, &s.topic, 0, records).await;
    s.run().await;
    // Five events the receiver refuses for good: dead, in one group.
    s.receiver.set_script(|_| harness::receiver::Reply::status(400));
    let dead: Vec<String> = (0..5).map(|_| new_event_id()).collect();
    for (i, id) in dead.iter().enumerate() {
        s.producer.send_event(&s.topic, &format!("k{i}"), id, Some("Tick"), &json!({"i": i})).await;
    }
    let base = format!("http://{}", s.od.admin_address());
    let http = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let get = |path: String| http.get(format!("{base}{path}")).bearer_auth(VIEWER).send();
    harness::wait::wait_until_async("the five events dead", HANDLED_TIMEOUT, async || {
        let stats: Value = get("/v1/stats".into()).await.unwrap().json().await.unwrap();
        stats["dead"].as_u64() == Some(5)
    })
    .await;

    let stats: Value = get("/v1/stats".into()).await.unwrap().json().await.unwrap();
    assert!(stats["done"].as_u64().unwrap() >= records as u64, "{stats}");
    // The dead ones, from their index: all five on the first page.
    let page: Value = get("/v1/events?state=dead&limit=100".into()).await.unwrap().json().await.unwrap();
    let mut listed: Vec<&str> =
        page["records"].as_array().unwrap().iter().map(|r| r["event_id"].as_str().unwrap()).collect();
    listed.sort_unstable();
    let mut want: Vec<&str> = dead.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!((listed, page["partial"].as_bool()), (want, Some(false)), "{page}");
    // A filter nothing matches: the page stops at the budget and says where to go on.
    let page: Value = get("/v1/events?topic=no-such-topic&limit=10".into()).await.unwrap().json().await.unwrap();
    assert_eq!((page["records"].as_array().unwrap().len(), page["partial"].as_bool()), (0, Some(true)), "{page}");
    assert!(page["next"].is_string(), "{page}");
    // The console, logged in with the read credential: the groups and the dead list.
    let cookie = login(&http, &base, VIEWER).await;
    let groups = http.get(format!("{base}/ui/groups")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(groups.status(), 200);
    let html = groups.text().await.unwrap();
    assert!(html.contains("http 400"), "the dead group is shown:\n{html}");
    let list = http.get(format!("{base}/ui/events?state=dead")).header("cookie", &cookie).send().await.unwrap();
    let html = list.text().await.unwrap();
    assert!(dead.iter().all(|id| html.contains(id.as_str())), "every dead event is listed:\n{html}");
    s.od.stop();
}
