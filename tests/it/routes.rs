//! Routes: several `[[handlers]]` on one topic, selecting event types and a payload
//! field, each a side effect of its own (its record, its idempotency key), in per-key
//! order; an event no route selects is counted and passed by; a Debezium-style replay
//! is suppressed on every route.

use std::collections::BTreeMap;
use std::time::Duration;

use super::hold::store;
use crate::harness::receiver::Reply;
use crate::harness::{self, metrics, Scenario};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const TYPES: [&str; 3] = ["OrderCreated", "OrderPaid", "OrderShipped"];
const KEYS: usize = 8;
const PER_KEY: usize = 6;

/// The later routes of the scenario's topic, to the same receiver: the mailer on
/// `OrderPaid` (its dead events do not hold the key), shipping on `OrderShip*`, the
/// CRM on the gold customers' events.
fn routes(topic: &str, url: &str) -> String {
    let (t, u) = (serde_json::to_string(topic).unwrap(), serde_json::to_string(url).unwrap());
    let route = |name: &str, types: &str, extra: &str| {
        format!(
            "\n[[handlers]]\nname = \"{name}\"\ntopics = [{t}]\nevent_types = [{types}]\nkind = \"http\"\nurl = {u}\n\
             idempotency_header = \"Idempotency-Key\"\nheaders = {{ X-Route = \"{name}\" }}\n{extra}\
             [handlers.retry]\nmax_attempts = 2\ninitial_backoff = \"50ms\"\nmax_backoff = \"100ms\"\n"
        )
    };
    let crm = route("crm", "\"Order*\"", "").replace(
        "[handlers.retry]",
        "[[handlers.when]]\nfield = \"customer.tier\"\nequals = [\"gold\", \"platinum\"]\n[handlers.retry]",
    );
    route("mailer", "\"OrderPaid\"", "on_dead = \"continue\"\n") + &route("shipping", "\"OrderShip*\"", "") + &crm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_routes_get_their_events_once_each_in_key_order_and_a_replay_is_suppressed_on_every_route() {
    let mut s = Scenario::new("routes", 2).await;
    // The first route takes every order event; a customer event no route selects.
    s.od.config.handler_extra = "headers = { X-Route = \"all\" }\nevent_types = [\"Order*\"]\n".to_owned();
    s.od.config.extra_toml = routes(&s.topic, &s.receiver.events_url());
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    // (id, key, type) in the order sent: per key, the offset order.
    let mut sent = Vec::new();
    let tiers = ["gold", "silver", "platinum", "bronze"];
    for i in 0..KEYS * PER_KEY {
        sent.push((harness::new_event_id(), format!("order-{}", i % KEYS), TYPES[i % TYPES.len()], tiers[i % 4]));
    }
    for k in 0..KEYS {
        sent.insert(k * 3, (harness::new_event_id(), format!("order-{k}"), "CustomerUpdated", "gold"));
    }
    // The mailer refuses one OrderPaid event for good: dead on that route only.
    let refused = sent.iter().find(|e| e.2 == "OrderPaid").unwrap().0.clone();
    let refused_key = format!("{refused}#mailer");
    receiver.set_script(move |req| match req.event_id.as_deref() {
        Some(k) if k == refused_key => Reply::status(422),
        _ => Reply::ok(),
    });
    let payload = |id: &str, t: &str, tier: &str| json!({"id": id, "type": t, "customer": {"tier": tier}});
    for (id, key, t, tier) in &sent {
        producer.send_event(&topic, key, id, Some(t), &payload(id, t, tier)).await;
    }
    let key_of = |id: &str, t: &str, tier: &str, route: &str| match (route, t, tier) {
        ("all", t, _) if t.starts_with("Order") => Some(id.to_owned()),
        ("mailer", "OrderPaid", _) => Some(format!("{id}#mailer")),
        ("shipping", "OrderShipped", _) => Some(format!("{id}#shipping")),
        ("crm", t, "gold" | "platinum") if t.starts_with("Order") => Some(format!("{id}#crm")),
        _ => None,
    };
    let expected: Vec<(String, &str)> = ["all", "mailer", "shipping", "crm"]
        .into_iter()
        .flat_map(|route| sent.iter().filter_map(move |(id, _, t, tier)| Some((key_of(id, t, tier, route)?, route))))
        .collect();
    od.wait_until("every route's calls answered", TIMEOUT, || expected.iter().all(|(k, _)| receiver.answered(k))).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    let scraped = metrics::try_scrape(&od).await.expect("metrics");
    let calls_before = receiver.calls().len();

    // Each route got exactly its events, once each (a 422 is final: the refused one too),
    // with its own idempotency key, and per key in offset order.
    for (key, route) in &expected {
        let calls = receiver.handler_calls(key);
        assert_eq!(calls.len(), 1, "{route} calls of {key}: {calls:#?}");
        assert!(calls.iter().all(|c| c.header("x-route") == Some(route)), "{key} reached another route: {calls:#?}");
    }
    assert_eq!(receiver.calls().iter().filter(|c| c.is_handler_call()).count(), expected.len());
    let mut by_route_and_key: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut calls = receiver.calls();
    calls.sort_by_key(|c| c.seq);
    for c in calls.iter().filter(|c| c.is_handler_call()) {
        let aggregate = c.path.split('/').nth(2).unwrap_or_default().to_owned();
        let route = c.header("x-route").unwrap_or_default().to_owned();
        by_route_and_key.entry((route, aggregate)).or_default().push(c.event_id.clone().unwrap_or_default());
    }
    for ((route, aggregate), got) in &by_route_and_key {
        let want: Vec<String> = sent
            .iter()
            .filter(|(_, key, _, _)| key == aggregate)
            .filter_map(|(id, _, t, tier)| key_of(id, t, tier, route))
            .collect();
        assert_eq!(got, &want, "route {route}, key {aggregate}: calls out of offset order");
    }
    // What a route does not select is counted, not recorded; an event no route selects
    // is counted once more, and its offset moved (the end was reached).
    let filtered = |h: &str| metrics::sample(&scraped, "outboxd_events_filtered_total", &[("handler", h)]);
    let (n, unrouted) = (KEYS * PER_KEY, KEYS);
    assert_eq!(filtered("mailer"), (n * 2 / 3 + unrouted) as f64);
    assert_eq!(filtered("shipping"), (n * 2 / 3 + unrouted) as f64);
    assert_eq!(filtered("crm"), (n / 2 + unrouted) as f64);
    assert_eq!(filtered(&topic), unrouted as f64, "the first route, named after its topic");
    assert_eq!(metrics::sample(&scraped, "outboxd_events_unrouted_total", &[("topic", &topic)]), unrouted as f64);

    // A Debezium-style replay (the same events at new offsets): suppressed on every route.
    for (id, key, t, tier) in &sent {
        producer.send_event(&topic, key, id, Some(t), &payload(id, t, tier)).await;
    }
    od.wait_until("committed offsets at the end of the replay", TIMEOUT, || offsets.reached_end()).await;
    assert_eq!(receiver.calls().len(), calls_before, "a replayed event was called again");
    let scraped = metrics::try_scrape(&od).await.expect("metrics");
    let suppressed = metrics::sample(&scraped, "outboxd_duplicates_suppressed_total", &[("cause", "new_offset")]);
    assert_eq!(suppressed, expected.len() as f64, "one duplicate per (event, route) that had a record");
    od.stop();

    // One record per (event, route) that selected it, in the route's scope; the repair
    // commands by id find the one that waits for a person.
    let records = od.store_json(&["list", "--limit", "1000"]);
    let mut scopes: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.as_array().expect("a list") {
        *scopes.entry(r["scope"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
    }
    let n = KEYS * PER_KEY;
    let want = BTreeMap::from([
        (topic.clone(), n),
        (format!("{topic}#mailer"), n / 3),
        (format!("{topic}#shipping"), n / 3),
        (format!("{topic}#crm"), n / 2),
    ]);
    assert_eq!(scopes, want);
    let dead = od.store_json(&["get", &refused]);
    assert_eq!(
        (dead["state"].as_str(), dead["scope"].as_str()),
        (Some("dead"), Some(format!("{topic}#mailer").as_str()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_event_holds_its_key_on_its_own_route_only_and_its_retry_runs_the_held_ones_in_order() {
    let mut s = Scenario::new("routes-hold", 1).await;
    s.od.config.handler_extra = "headers = { X-Route = \"all\" }\n".to_owned();
    // The mailer keeps `on_dead = "hold"` (the default) here.
    s.od.config.extra_toml = routes(&s.topic, &s.receiver.events_url()).replace("on_dead = \"continue\"\n", "");
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    // The mailer refuses the key's first OrderPaid once (400), then takes it.
    let ids: Vec<String> = (0..4).map(|_| harness::new_event_id()).collect();
    let dead_key = format!("{}#mailer", ids[0]);
    let refused = dead_key.clone();
    receiver.set_script(move |req| match (req.event_id.as_deref(), req.nth) {
        (Some(k), 1) if k == refused => Reply::status(400),
        _ => Reply::ok(),
    });
    for id in &ids {
        producer.send_event(&topic, "order-7", id, Some("OrderPaid"), &json!({"id": id})).await;
    }
    // The first route runs every event of the key; the mailer holds the three behind its dead one.
    od.wait_until("the first route's calls", TIMEOUT, || ids.iter().all(|id| receiver.answered_ok(id))).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    for id in &ids[1..] {
        assert_eq!(receiver.call_count(&format!("{id}#mailer")), 0, "{id} ran on the mailer past its dead event");
    }
    let said = store(&od, &["retry", &ids[0], "--reason", "the mailer is fixed"]);
    assert!(said.contains("done"), "{said}");
    let mails: Vec<String> = ids.iter().map(|id| format!("{id}#mailer")).collect();
    od.wait_until("the held mails", TIMEOUT, || mails.iter().all(|k| receiver.answered_ok(k))).await;
    let mut calls: Vec<_> = receiver.calls().into_iter().filter(|c| c.header("x-route") == Some("mailer")).collect();
    calls.sort_by_key(|c| c.seq);
    let order: Vec<(String, u16)> = calls.iter().map(|c| (c.event_id.clone().unwrap_or_default(), c.status)).collect();
    let want: Vec<(String, u16)> = [(dead_key.clone(), 400), (dead_key.clone(), 200)]
        .into_iter()
        .chain(mails[1..].iter().map(|k| (k.clone(), 200)))
        .collect();
    assert_eq!(order, want, "the mailer's dead event, then its held ones in offset order, once each");
    for id in &ids {
        assert_eq!(receiver.handler_call_count(id), 1, "{id} on the first route");
    }
    od.stop();
}

/// The scenario's handler as route "all", and a second route "b" to the same receiver
/// that holds its events 2 s after its circuit opens. Read-ahead far smaller than the
/// backlogs sent: without holding, b's outage would keep the partitions paused and the
/// first route's events unread.
fn with_route_b(s: &mut Scenario) {
    s.od.config.max_in_flight = 8;
    s.od.config.handler_extra = "headers = { X-Route = \"all\" }\n".to_owned();
    let (t, u) = (serde_json::to_string(&s.topic).unwrap(), serde_json::to_string(&s.receiver.events_url()).unwrap());
    s.od.config.extra_toml = format!(
        "\n[[handlers]]\nname = \"b\"\ntopics = [{t}]\nkind = \"http\"\nurl = {u}\n\
         idempotency_header = \"Idempotency-Key\"\nheaders = {{ X-Route = \"b\" }}\n\
         [handlers.retry]\nmax_attempts = 5\ninitial_backoff = \"50ms\"\nmax_backoff = \"200ms\"\n\
         [handlers.circuit]\nprobe_after = \"200ms\"\nprobe_max = \"500ms\"\nhold_after = \"2s\"\n"
    );
}

/// Route b's receiver away: its calls answered 503 while the flag returned is set
/// (every other call 200).
fn route_b_away(receiver: &crate::harness::receiver::Receiver) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let away = std::sync::Arc::new(AtomicBool::new(true));
    let flag = away.clone();
    receiver.set_script(move |req| match req.event_id.as_deref() {
        Some(k) if k.ends_with("#b") && flag.load(Ordering::SeqCst) => Reply::status(503),
        _ => Reply::ok(),
    });
    away
}

/// The calls of `route` ("all" or "b") that did their side effect, in the order they came.
fn effective_calls(receiver: &crate::harness::receiver::Receiver, route: &str) -> Vec<crate::harness::receiver::Call> {
    let mut calls: Vec<_> =
        receiver.calls().into_iter().filter(|c| c.header("x-route") == Some(route) && c.effective()).collect();
    calls.sort_by_key(|c| c.seq);
    calls
}

/// The idempotency key of event `id` on `route`: the first route ("all") sends the id.
fn key_on(route: &str, id: &str) -> String {
    match route {
        "all" => id.to_owned(),
        _ => format!("{id}#{route}"),
    }
}

/// Each of `sent` was done once on `route`, and per key in the order sent.
fn once_each_in_key_order(receiver: &crate::harness::receiver::Receiver, route: &str, sent: &[(String, String)]) {
    let calls = effective_calls(receiver, route);
    for (id, _) in sent {
        let k = key_on(route, id);
        assert_eq!(
            calls.iter().filter(|c| c.event_id.as_deref() == Some(k.as_str())).count(),
            1,
            "{k} done once on {route}"
        );
    }
    let keys: std::collections::BTreeSet<&String> = sent.iter().map(|(_, k)| k).collect();
    for key in keys {
        let got: Vec<&str> = calls
            .iter()
            .filter(|c| c.path.split('/').nth(2) == Some(key.as_str()))
            .filter_map(|c| c.event_id.as_deref())
            .collect();
        let want: Vec<String> = sent.iter().filter(|(_, k)| k == key).map(|(id, _)| key_on(route, id)).collect();
        assert_eq!(got, want, "{route}'s calls of {key} out of offset order");
    }
}

/// The held records, as `store stats` (through the running service) counts them.
fn held(od: &crate::harness::Outboxd) -> u64 {
    let stats = store(od, &["stats", "--json"]);
    serde_json::from_str::<serde_json::Value>(&stats).ok().and_then(|v| v["held"].as_u64()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_receiver_is_away_holds_its_events_so_the_others_flow_and_runs_them_in_order_when_it_is_back() {
    use std::sync::atomic::Ordering;

    const KEYS: usize = 10;
    let mut s = Scenario::new("routes-away", 2).await;
    with_route_b(&mut s);
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let away = route_b_away(&receiver);
    // Under load for the whole outage (`OUTBOXD_OUTAGE_SECS`, 20 s; 60 is the full
    // size): about 100 events a second, far more than read-ahead (8).
    let outage = Duration::from_secs(harness::env_usize("OUTBOXD_OUTAGE_SECS", 20) as u64);
    let started = std::time::Instant::now();
    let mut sent: Vec<(String, String)> = Vec::new();
    while started.elapsed() < outage {
        for _ in 0..10 {
            let (id, key) = (harness::new_event_id(), format!("order-{}", sent.len() % KEYS));
            producer.send_event(&topic, &key, &id, Some("OrderPaid"), &json!({"id": id})).await;
            sent.push((id, key));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = sent.len();

    // The first route's events are all done and every offset moved while b is away.
    od.wait_until("the first route's events, with b away", TIMEOUT, || {
        sent.iter().all(|(id, _)| receiver.answered_ok(id))
    })
    .await;
    od.wait_until("committed offsets at the end, with b away", TIMEOUT, || offsets.reached_end()).await;
    wait_held(&mut od, events as u64).await;
    assert_eq!(effective_calls(&receiver, "b").len(), 0, "b was away");
    once_each_in_key_order(&receiver, "all", &sent);

    // b is back: its held events run, once each, in per-key order.
    away.store(false, Ordering::SeqCst);
    let keys: Vec<String> = sent.iter().map(|(id, _)| key_on("b", id)).collect();
    od.wait_until("b's events after it came back", TIMEOUT, || keys.iter().all(|k| receiver.answered_ok(k))).await;
    once_each_in_key_order(&receiver, "b", &sent);
    once_each_in_key_order(&receiver, "all", &sent);
    wait_held(&mut od, 0).await;
    od.stop();
}

/// Waits until `held` (the held records, as `store stats` counts them) says `n`.
async fn wait_held(od: &mut crate::harness::Outboxd, n: u64) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        od.assert_alive();
        let now = held(od);
        if now == n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{now} held records, not {n}, after {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `outboxd_message_copies_not_kept_total` of the running service.
async fn copies_not_kept(od: &crate::harness::Outboxd) -> f64 {
    let m = harness::metrics::try_scrape(od).await.unwrap_or_default();
    harness::metrics::sample(&m, outboxd::metrics::names::COPIES_NOT_KEPT, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_copy_does_not_fit_waits_for_its_away_receiver_in_memory_and_runs_once_when_it_is_back() {
    use std::sync::atomic::Ordering;

    const KEYS: usize = 5;
    let mut s = Scenario::new("routes-away-no-copy", 2).await;
    with_route_b(&mut s);
    // No message copy fits: an event b would hold is handed back to wait for b's circuit.
    s.od.config.store_extra = "max_message_copy_bytes = \"1B\"\n".to_owned();
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let away = route_b_away(&receiver);
    let mut sent: Vec<(String, String)> = Vec::new();
    for i in 0..4 * KEYS {
        let (id, key) = (harness::new_event_id(), format!("order-{}", i % KEYS));
        producer.send_event(&topic, &key, &id, Some("OrderPaid"), &json!({"id": id})).await;
        sent.push((id, key));
    }

    // Past `hold_after` b's events are to be held; none has room for its copy.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while copies_not_kept(&od).await < 1.0 {
        od.assert_alive();
        assert!(std::time::Instant::now() < deadline, "no event was to be held in {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(held(&od), 0, "held without a message copy");
    assert_eq!(effective_calls(&receiver, "b").len(), 0, "b was away");

    // b is back: the events that waited in memory run, once each, in per-key order.
    away.store(false, Ordering::SeqCst);
    let keys: Vec<String> = sent.iter().map(|(id, _)| key_on("b", id)).collect();
    od.wait_until("b's events after it came back", TIMEOUT, || keys.iter().all(|k| receiver.answered_ok(k))).await;
    od.wait_until("the first route's events", TIMEOUT, || sent.iter().all(|(id, _)| receiver.answered_ok(id))).await;
    od.wait_until("committed offsets at the end", TIMEOUT, || offsets.reached_end()).await;
    once_each_in_key_order(&receiver, "b", &sent);
    once_each_in_key_order(&receiver, "all", &sent);
    assert_eq!(held(&od), 0, "nothing held");
    od.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_held_for_an_away_receiver_survive_a_sigkill_and_a_move_to_an_empty_instance() {
    use std::sync::atomic::Ordering;

    let mut s = Scenario::new("routes-away-kill", 2).await;
    with_route_b(&mut s);
    s.run().await;
    let Scenario { kafka, topic, receiver, mut od, offsets, producer } = s;
    let away = route_b_away(&receiver);
    let sent: Vec<(String, String)> = (0..120).map(|i| (harness::new_event_id(), format!("order-{}", i % 7))).collect();
    for (id, key) in &sent {
        producer.send_event(&topic, key, id, Some("OrderPaid"), &json!({"id": id})).await;
    }
    od.wait_until("the first route's events, with b away", TIMEOUT, || {
        sent.iter().all(|(id, _)| receiver.answered_ok(id))
    })
    .await;
    od.wait_until("committed offsets at the end, with b away", TIMEOUT, || offsets.reached_end()).await;
    wait_held(&mut od, sent.len() as u64).await;

    // SIGKILL, then the partitions go to an instance with an empty store: it restores
    // the held events from the changelog and runs them once b is back.
    od.kill();
    let mut next = crate::harness::Outboxd::new(&kafka, &[&topic], &receiver);
    let store_path = next.config.store_path.clone();
    next.config = od.config.clone();
    next.config.store_path = store_path;
    next.start();
    next.wait_for_assignment().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    away.store(false, Ordering::SeqCst);
    let keys: Vec<String> = sent.iter().map(|(id, _)| key_on("b", id)).collect();
    next.wait_until("b's events on the new instance", TIMEOUT, || keys.iter().all(|k| receiver.answered_ok(k))).await;
    once_each_in_key_order(&receiver, "b", &sent);
    for (id, _) in &sent {
        assert_eq!(
            receiver.handler_calls(id).iter().filter(|c| c.effective()).count(),
            1,
            "{id} once on the first route"
        );
    }
    wait_held(&mut next, 0).await;
    next.stop();
}
