//! outboxd is SIGKILLed at random moments while events keep arriving, and restarted
//! each time. Afterwards nothing may be lost, and no event may be executed again once
//! it was recorded done.
//!
//! Size knobs: `OUTBOXD_KILL_LOOP_EVENTS` (default 5000), `OUTBOXD_KILL_LOOP_KILLS`
//! (default 10); `OUTBOXD_KILL_LOOP_SEED` replays the kill moments of an earlier run.
//! It does not run beside the fault scenarios ([`turns::LOAD`]).

use crate::harness;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use harness::{env_usize, new_event_id, turns, wait_at_most, Behaviour, Produced, Scenario};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Events are produced in this many batches, spread over the first kills.
const BATCHES: usize = 50;
const MIN_BATCH_PAUSE: Duration = Duration::from_millis(50);
/// Roughly how long one run lives before its SIGKILL.
const KILL_EVERY_ABOUT: Duration = Duration::from_millis(1800);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_loop_loses_nothing_and_never_repeats_after_done() {
    let _load = turns::LOAD.lock().await;
    let events = env_usize("OUTBOXD_KILL_LOOP_EVENTS", 5000).max(1);
    let kills = env_usize("OUTBOXD_KILL_LOOP_KILLS", 10);
    let seed =
        std::env::var("OUTBOXD_KILL_LOOP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("kill loop: events={events} kills={kills} seed={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();

    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::new("killloop", 3).await;
    receiver.set_default(Behaviour::random_delay(Duration::ZERO..=Duration::from_millis(20)));
    // Static membership: a restarted process gets its partitions back at once instead of
    // after the dead one's session timeout.
    od.config.kafka_options.insert("group.instance.id".into(), "kill-loop".into());
    // An event may be in flight at several kills in a row; that must not exhaust it.
    od.config.max_attempts = 1000;

    // Produce over time, many keys, while the kills go on.
    let keys = (events / 10).max(1);
    // Spread the events over about as long as the kills take.
    let batch_pause = (KILL_EVERY_ABOUT * kills as u32 / BATCHES as u32).max(MIN_BATCH_PAUSE);
    let producing = {
        let topic = topic.clone();
        tokio::spawn(async move {
            let mut produced: Vec<Produced> = Vec::with_capacity(events);
            let per_batch = events.div_ceil(BATCHES);
            let mut n = 0;
            while n < events {
                let batch: Vec<(String, String, serde_json::Value)> = (n..(n + per_batch).min(events))
                    .map(|i| (format!("agg-{}", i % keys), new_event_id(), json!({"i": i})))
                    .collect();
                n += batch.len();
                let sends =
                    batch.iter().map(|(key, id, payload)| producer.send_event(&topic, key, id, Some("Tick"), payload));
                produced.extend(futures::future::join_all(sends).await);
                tokio::time::sleep(batch_pause).await;
            }
            produced
        })
    };

    // Kill at random moments: some during start-up and recovery, most while events are
    // being handled (then preferably with a call in flight).
    let mut kills_mid_call = 0;
    for _ in 0..kills {
        od.start();
        if rng.random_bool(0.5) {
            od.wait_for_assignment().await;
        }
        let after = Duration::from_millis(rng.random_range(200..=2500));
        tokio::time::sleep(after).await;
        if rng.random_bool(0.75) {
            let every = Duration::from_millis(rng.random_range(1..=10));
            wait_at_most(Duration::from_secs(1), every, || receiver.in_flight() > 0).await;
        }
        od.assert_alive();
        if receiver.in_flight() > 0 {
            kills_mid_call += 1;
        }
        od.kill();
    }
    od.start();
    // Let the last run come up properly even when the earlier ones already did all the
    // work (and so that the SIGTERM below does not hit it before it handles signals).
    od.wait_for_assignment().await;
    let produced = producing.await.expect("the producer task");
    let ids: Vec<String> = produced.iter().map(|p| p.event_id.clone()).collect();
    let kills_done_at = began.elapsed();

    let handled_timeout = Duration::from_secs(120) + Duration::from_millis(40 * events as u64);
    od.wait_until(format!("all {events} events to be answered at least once"), handled_timeout, || {
        receiver.count_answered_ok(&ids) == ids.len()
    })
    .await;
    od.wait_until("committed offsets to reach the end", Duration::from_secs(120), || offsets.reached_end()).await;
    od.stop();

    let records = od.store_list(None, 1_000_000);
    let by_id: HashMap<&str, &harness::Record> = records.iter().map(|r| (r.event_id.as_str(), r)).collect();
    let calls = receiver.calls();
    let mut calls_per_id: HashMap<&str, usize> = HashMap::new();
    for c in &calls {
        *calls_per_id.entry(c.event_id.as_deref().unwrap_or("")).or_default() += 1;
    }
    let id_set: HashSet<&str> = ids.iter().map(String::as_str).collect();

    let never_called: Vec<&str> = ids.iter().map(String::as_str).filter(|id| !calls_per_id.contains_key(id)).collect();
    let not_done: Vec<String> = ids
        .iter()
        .filter_map(|id| match by_id.get(id.as_str()) {
            Some(r) if r.state == "done" => None,
            Some(r) => Some(format!("{id}: {} ({:?})", r.state, r.reason)),
            None => Some(format!("{id}: not in the store")),
        })
        .collect();
    // Invariant 2: once done, never executed again. A call that started after the
    // event's done_at is a second execution (1 ms for clock resolution).
    let mut after_done = Vec::new();
    for c in &calls {
        let Some(id) = c.event_id.as_deref() else {
            continue;
        };
        let Some(r) = by_id.get(id) else { continue };
        if r.state != "done" {
            continue;
        }
        let done_at = r.done_at();
        if c.started > done_at + Duration::from_millis(1) {
            after_done.push(format!(
                "{id}: call #{} started {} after done_at {} (record {r:?})",
                c.nth,
                humantime::format_rfc3339_micros(c.started),
                humantime::format_rfc3339_micros(done_at),
            ));
        }
    }
    let unknown_calls = calls.iter().filter(|c| !c.event_id.as_deref().is_some_and(|id| id_set.contains(id))).count();
    let repeated = calls_per_id.iter().filter(|(id, n)| id_set.contains(*id) && **n > 1).count();

    println!(
        "kill loop summary: events={events} kills={kills} (of which with calls in flight: \
         {kills_mid_call}) runs={} events_called_more_than_once={repeated} calls={} \
         (seed {seed}; kills over after {:.1?}, total {:.1?})",
        od.runs(),
        calls.len(),
        kills_done_at,
        began.elapsed()
    );

    let mut failures = Vec::new();
    if !never_called.is_empty() {
        failures.push(format!(
            "{} events never reached the receiver, e.g. {:?}",
            never_called.len(),
            &never_called[..never_called.len().min(10)]
        ));
    }
    if !not_done.is_empty() {
        failures.push(format!(
            "{} events are not done in the store, e.g. {:#?}",
            not_done.len(),
            &not_done[..not_done.len().min(10)]
        ));
    }
    if !after_done.is_empty() {
        failures.push(format!(
            "{} calls started after their event was recorded done, e.g. {:#?}",
            after_done.len(),
            &after_done[..after_done.len().min(10)]
        ));
    }
    if unknown_calls > 0 {
        failures.push(format!("{unknown_calls} calls carried no or an unknown Idempotency-Key"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
