//! The console at `/ui`, in a real headless Chromium, against a real outboxd,
//! broker and receiver: what an operator does on a bad day, and what the
//! console refuses. Screenshots of each page go to `target/console-screenshots`.

use crate::harness;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use harness::browser::Browser;
use harness::receiver::Reply;
use harness::{new_event_id, Outboxd, Scenario};
use serde_json::json;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(90);
const DEAD: usize = 5;

/// Every page the browser showed kept its console clean (the CSP held: no inline
/// script or style was refused) and axe-core found nothing serious on it.
async fn assert_clean_page(browser: &Browser, page: &str) {
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "the browser's console on the {page} page: {errors:#?}");
    let violations = browser.serious_accessibility_violations().await;
    assert!(violations.is_empty(), "accessibility of the {page} page: {violations:#?}");
}

/// Waits until the running service counts `n` of `metric` (counted once recorded) for `topic`.
async fn wait_counted(od: &mut Outboxd, topic: &str, metric: &str, n: usize) {
    od.wait_for(format!("{metric} to be {n}"), HANDLED_TIMEOUT, async |od| {
        let m = harness::metrics::try_scrape(od).await.unwrap_or_default();
        let counted = harness::metrics::sample(&m, metric, &[("topic", topic)]);
        if counted == n as f64 {
            Ok(())
        } else {
            Err(format!("{metric} is {counted}"))
        }
    })
    .await;
}

/// Dead events of one cause and an event parked by a SIGKILL; the operator logs
/// in, finds the dead group, reads one of its events, retries the group (the
/// receiver gets each once more), resolves the parked event and logs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_dead_group_and_resolves_a_parked_event_in_the_browser() {
    let mut s = Scenario::new("console", 1).await;
    let dead: Vec<(String, String)> = (0..DEAD).map(|i| (format!("order-{i}"), new_event_id())).collect();
    let parked = ("order-parked".to_owned(), new_event_id());
    let (refusing, holding) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
    let dead_ids: HashSet<String> = dead.iter().map(|(_, id)| id.clone()).collect();
    let (refuse, hold, parked_id) = (refusing.clone(), holding.clone(), parked.1.clone());
    s.receiver.set_script(move |r| match r.event_id.as_deref() {
        Some(id) if dead_ids.contains(id) && refuse.load(Ordering::SeqCst) => Reply::status(422),
        Some(id) if id == parked_id => Reply::ok().hold(&hold),
        _ => Reply::ok(),
    });
    s.od.config.handler_extra = "on_uncertain = \"park\"\non_dead = \"continue\"\n".into();
    s.od.config.handler_timeout = "120s".into();
    s.run().await;
    let Scenario { topic, receiver, mut od, producer, .. } = s;
    for (key, id) in dead.iter().chain([&parked]) {
        producer.send_event(&topic, key, id, Some("OrderPlaced"), &json!({"order": key, "amount": 42})).await;
    }
    od.wait_until("every dead call answered and the parked one held", HANDLED_TIMEOUT, || {
        dead.iter().all(|(_, id)| receiver.answered(id)) && receiver.in_flight() == 1
    })
    .await;
    wait_counted(&mut od, &topic, "outboxd_events_dead_total", DEAD).await;
    // Killed during the held call: started again, it finds its claim and parks the event.
    od.kill();
    holding.store(false, Ordering::SeqCst);
    od.start();
    od.wait_for_assignment().await;
    wait_counted(&mut od, &topic, "outboxd_events_parked_total", 1).await;

    let base = format!("http://{}", od.admin_address());
    let browser = Browser::start().await;

    // A page without a session goes to the login, and back after it.
    browser.open(&format!("{base}/ui/groups"), "form[action='/ui/login']").await;
    browser.screenshot("login").await;
    assert_clean_page(&browser, "login").await;
    browser.type_into("#token", "not the token").await;
    browser.click("form[action='/ui/login'] button").await;
    browser.wait_for_text("That token is not accepted").await;
    let refused = browser.console_errors().await;
    assert!(refused.len() == 1 && refused[0].contains("401"), "only the refused login is logged: {refused:?}");
    browser.type_into("#token", &od.admin_token()).await;
    browser.click("form[action='/ui/login'] button").await;
    browser.wait_for_text("Dead and parked events, by topic and reason").await;
    assert_eq!(browser.url().await.path(), "/ui/groups", "the login goes on to the page asked for");

    // The dead group: all five, one reason.
    let text = browser.text().await;
    assert!(text.contains(&topic) && text.contains("http 422"), "the dead group is listed:\n{text}");
    browser.screenshot("groups").await;
    assert_clean_page(&browser, "groups").await;

    // The overview, live.
    browser.open(&format!("{base}/ui/overview"), "#live").await;
    browser.wait_for_text(&format!("{topic}/0")).await;
    browser.wait_for_text("(this instance)").await;
    browser.screenshot("overview").await;
    assert_clean_page(&browser, "overview").await;

    // One event of the group: its payload and the idempotency key it was sent with.
    let first = &dead[0].1;
    browser.open(&format!("{base}/ui/events?id={first}"), "h1").await;
    browser.wait_for_text("Idempotency key sent").await;
    let text = browser.text().await;
    assert!(text.contains("\"amount\": 42") && text.contains(first), "the payload and the key:\n{text}");
    browser.screenshot("event").await;
    assert_clean_page(&browser, "event").await;

    // Retry the whole group: the impact first, then the typed phrase.
    refusing.store(false, Ordering::SeqCst);
    let calls_before: Vec<usize> = dead.iter().map(|(_, id)| receiver.calls_for(id).len()).collect();
    browser.open(&format!("{base}/ui/groups"), "table").await;
    browser.click("a[href^='/ui/actions/preview?action=retry']").await;
    browser.wait_for_text(&format!("This will call the receiver again for {DEAD} events")).await;
    browser.screenshot("confirm").await;
    assert_clean_page(&browser, "confirm").await;
    browser.type_into("#confirm", &format!("retry {DEAD}")).await;
    browser.type_into("#reason", "the receiver refused orders until its 2.3 fix").await;
    browser.click("form[action='/ui/actions/run'] button[type='submit']").await;
    browser.wait_for_text("Finished").await;
    browser.wait_for_text(&format!("{DEAD} of {DEAD} (100%), {DEAD} carried out, 0 failed")).await;
    browser.screenshot("job").await;
    assert_clean_page(&browser, "job").await;
    for ((_, id), before) in dead.iter().zip(calls_before) {
        assert_eq!(receiver.calls_for(id).len(), before + 1, "the retry called the receiver once for {id}");
        assert!(receiver.answered_ok(id), "{id} succeeded");
    }

    // Resolve the parked event.
    browser.open(&format!("{base}/ui/event/{}", parked.1), "h1").await;
    browser.wait_for_text("parked").await;
    browser.click("a[href^='/ui/actions/preview?action=resolve']").await;
    browser.wait_for_text("This will record 1 event done by hand").await;
    browser.click("form[action='/ui/actions/run'] button[type='submit']").await;
    browser.wait_for_text("1 of 1 (100%), 1 carried out, 0 failed").await;

    // The audit: who did what, why, and how it ended.
    browser.open(&format!("{base}/ui/audit"), "h1").await;
    browser.wait_for_text("the receiver refused orders until its 2.3 fix").await;
    let text = browser.text().await;
    assert!(text.matches("retry").count() >= DEAD, "a retry entry per event:\n{text}");
    assert!(text.contains("resolve") && text.contains(&parked.1), "the resolve entry:\n{text}");
    browser.screenshot("audit").await;
    assert_clean_page(&browser, "audit").await;
    // And on the event's own page.
    browser.open(&format!("{base}/ui/event/{first}"), "h1").await;
    browser.wait_for_text("What people did to it").await;

    // Log out: the pages need a login again.
    browser.click("form[action='/ui/logout'] button").await;
    browser.wait_for("form[action='/ui/login']").await;
    browser.open(&format!("{base}/ui/overview"), "form[action='/ui/login']").await;
    browser.close().await;

    od.stop();
    let audit = od.command(&["store", "audit", "--json"]);
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(audit.contains("the receiver refused orders until its 2.3 fix"), "`store audit` shows it too: {audit}");
    let done: HashSet<String> = od.store_list(Some("done"), 100).into_iter().map(|r| r.event_id).collect();
    for (_, id) in dead.iter().chain([&parked]) {
        assert!(done.contains(id), "{id} is done after the console's actions");
    }
    assert_eq!(receiver.calls_for(&parked.1).len(), 1, "resolving ran nothing");
}

/// Done events of a window; the operator opens the replay page, sees how many events
/// it would run again before anything runs, types the phrase, and watches the job: the
/// receiver gets each event once more, with the same idempotency key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_replays_a_window_of_done_events_in_the_browser() {
    const EVENTS: usize = 4;
    let s = Scenario::start("console-replay", 1).await;
    let Scenario { topic, receiver, od, producer, .. } = s;
    let since = humantime::format_rfc3339_seconds(std::time::SystemTime::now() - Duration::from_secs(2)).to_string();
    let ids: Vec<String> = (0..EVENTS).map(|_| new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        producer.send_event(&topic, &format!("order-{i}"), id, Some("OrderPaid"), &json!({"order": i})).await;
    }
    harness::wait::wait_until("every call answered", HANDLED_TIMEOUT, || ids.iter().all(|id| receiver.answered_ok(id)))
        .await;

    let base = format!("http://{}", od.admin_address());
    let browser = Browser::start().await;
    browser.open(&format!("{base}/ui/replay"), "form[action='/ui/login']").await;
    browser.type_into("#token", &od.admin_token()).await;
    browser.click("form[action='/ui/login'] button").await;
    browser.wait_for_text("Replay a window").await;
    browser.type_into("input[name='topic']", &topic).await;
    browser.type_into("input[name='since']", &since).await;
    browser.click("form[action='/ui/replay'] button[type='submit']").await;
    browser.wait_for_text(&format!("{EVENTS} events would run again")).await;
    assert_eq!(ids.iter().map(|id| receiver.calls_for(id).len()).sum::<usize>(), EVENTS, "nothing ran yet");
    browser.screenshot("replay").await;
    assert_clean_page(&browser, "replay").await;
    browser.type_into("#confirm", &format!("replay {EVENTS}")).await;
    browser.type_into("#reason", "the CRM restored its backup").await;
    browser.click("form[action='/ui/replay/run'] button[type='submit']").await;
    browser.wait_for_text(&format!("{EVENTS} of {EVENTS} (100%), {EVENTS} carried out, 0 failed")).await;
    browser.close().await;
    for id in &ids {
        assert_eq!(receiver.calls_for(id).len(), 2, "replayed once, with the same key: {id}");
    }
}

/// What the console refuses without a browser: a change from another origin, a
/// page without a session, and every answer carries the strict headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_other_origins_and_pages_without_a_session_and_sends_a_strict_csp() {
    let mut s = Scenario::new("console-refusals", 1).await;
    const VIEWER: &str = "a-read-only-token-for-the-viewer";
    s.od.config.env.insert("VIEWER_TOKEN".into(), VIEWER.into());
    s.od.config.admin_extra =
        "[[admin.tokens]]\nname = \"viewer\"\ntoken = \"${VIEWER_TOKEN}\"\naccess = \"read\"\n".into();
    s.run().await;
    let Scenario { mut od, .. } = s;
    let base = format!("http://{}", od.admin_address());
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();

    let page = http.get(format!("{base}/ui/overview")).send().await.unwrap();
    assert_eq!(page.status(), 303, "a page without a session goes to the login");
    assert_eq!(page.headers()["location"], "/ui/login?next=%2Fui%2Foverview");
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    for part in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(part), "CSP {csp:?} lacks {part}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");

    let login = |origin: &'static str| {
        http.post(format!("{base}/ui/login")).header("origin", origin).form(&[("token", od.admin_token())]).send()
    };
    let refused = login("http://evil.example").await.unwrap();
    assert_eq!(refused.status(), 403, "a login posted by another site's page");
    let other_port = http
        .post(format!("{base}/ui/login"))
        .header("sec-fetch-site", "same-site")
        .form(&[("token", od.admin_token())])
        .send()
        .await
        .unwrap();
    assert_eq!(other_port.status(), 403, "same-site (another port of this host) is not same-origin");
    let ok = http
        .post(format!("{base}/ui/login"))
        .header("origin", base.clone())
        .form(&[("token", od.admin_token())])
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 303);
    let cookie = ok.headers()["set-cookie"].to_str().unwrap().to_owned();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(part), "cookie {cookie:?} lacks {part}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();
    let action = http
        .post(format!("{base}/ui/actions/run"))
        .header("cookie", &session)
        .header("origin", "http://127.0.0.1:1")
        .form(&[("action", "forget"), ("id", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(action.status(), 403, "an action from another origin, even with the session cookie");
    let rebinding = http.get(format!("{base}/ui/overview")).header("host", "evil.example").send().await.unwrap();
    assert_eq!(rebinding.status(), 403, "a Host this server does not answer to");
    // A read-only token can look, not act.
    let viewer = http.post(format!("{base}/ui/login")).header("origin", base.clone()).form(&[("token", VIEWER)]).send();
    let viewer = viewer.await.unwrap();
    assert_eq!(viewer.status(), 303, "the read-only token logs in");
    let viewer = viewer.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
    let page = http.get(format!("{base}/ui/overview")).header("cookie", &viewer).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("viewer (read-only)"));
    let acted = http
        .post(format!("{base}/ui/actions/run"))
        .header("cookie", &viewer)
        .header("origin", base.clone())
        .form(&[("action", "forget"), ("id", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(acted.status(), 403, "a read-only login cannot act");
    // /v1 stays bearer-only: the console's cookie opens nothing there.
    let v1 = http.get(format!("{base}/v1/stats")).header("cookie", &session).send().await.unwrap();
    assert_eq!(v1.status(), 401);
    od.stop();
}
