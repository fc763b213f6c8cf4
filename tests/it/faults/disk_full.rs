//! The store's filesystem fills up: outboxd stops cleanly and resumes after a restart.

use super::*;
use harness::tmpfs::{fill, Tmpfs};

// ---------------------------------------------------------------- 5. store filesystem full

/// The store's filesystem fills up: outboxd stops claiming, commits nothing past the
/// last durable completion and exits non-zero naming the store; once space is freed
/// and it is restarted, it finishes. (It does not resume by itself while running: it
/// exits on the first failed store write, which this test asserts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_filesystem_full_stops_cleanly_and_resumes_after_restart() {
    let _load = turns::LOAD.lock().await;
    let name = "store-disk-full";
    let began = Instant::now();
    let n = event_count();
    let mut rng = StdRng::seed_from_u64(seed(name));
    // sled needs about 2 KiB of log per event here; the filesystem must hold them all
    // once the filler is gone (8 MiB up to ~2000 events, more for larger runs).
    let size = std::env::var("OUTBOXD_FAULT_TMPFS_SIZE").unwrap_or_else(|_| format!("{}k", (n * 4).max(8 * 1024)));
    let tmpfs = Tmpfs::mount(&size);
    let Scenario { kafka, topic, receiver: rx, od, offsets, .. } = Scenario::new("fault-diskfull", PARTITIONS).await;
    rx.set_script(|_| Reply::ok().delay(Duration::from_millis(rand::random_range(0..=5))));
    let mut od = fault_outboxd(od, "a");
    od.config.store_path = tmpfs.path().join("store");
    let planned = plan(n, 0, &mut rng);
    let good = good_count(&planned);
    let events = spawn_production(kafka.brokers().to_string(), topic.clone(), planned, 10, Duration::ZERO)
        .await
        .expect("producer task");
    od.start();
    od.wait_for_assignment().await;
    wait_alive(&mut [&mut od], "a third of the events answered", DRAIN_TIMEOUT, || rx.ok_count() >= good / 3).await;

    let filler = tmpfs.path().join("filler");
    let answered_at_fill = rx.ok_count();
    let filled_at = Instant::now();
    let filled_system = SystemTime::now();
    let filled = fill(&filler);
    let pid = od.pid();
    let stop_bound = Duration::from_secs(60);
    let stopped = harness::wait_at_most(stop_bound, Duration::from_millis(50), || harness::broker::gone(pid)).await;
    assert!(
        stopped,
        "outboxd still runs {stop_bound:?} after its store's filesystem filled up ({filled} bytes of filler; \
         {} more events answered since)",
        rx.ok_count() - answered_at_fill
    );
    let stopped_after = filled_at.elapsed();
    let exit_time = SystemTime::now();
    let status = od.terminate();
    let log = strip_ansi(&od.log());
    let error_line = log.lines().rev().find(|l| l.starts_with("error:")).unwrap_or("").to_string();
    assert!(!status.success(), "outboxd must exit non-zero when its store cannot be written; got {status}");
    assert!(
        error_line.contains("store") && (error_line.contains("No space left") || error_line.contains("os error 28")),
        "the exit message should name the store and the cause; got {error_line:?}"
    );
    let names_path = error_line.contains(&od.config.store_path.display().to_string());
    if std::env::var_os("OUTBOXD_FAULT_VERBOSE").is_some() {
        eprintln!("{}", od.log_tails(40, 0));
    }
    let committed = offsets.committed();
    let calls_after_fill = rx.calls().iter().filter(|c| c.started_at > filled_at + Duration::from_millis(1)).count();
    // When outboxd noticed: the first error it logged about the store.
    let failure_time = log
        .lines()
        .find(|l| (l.contains("store failed") || l.contains("durable write failed")) && log_time(l).is_some())
        .and_then(log_time);
    let late_calls = failure_time.map_or(0, |t| {
        rx.calls().iter().filter(|c| c.is_handler_call() && c.started > t + Duration::from_millis(200)).count()
    });

    // Free the space, then look at the store before restarting.
    std::fs::remove_file(&filler).expect("remove the filler");
    let recs = records(&od);
    let mut past_durable = Vec::new();
    for e in &events {
        let c = committed.get(&e.partition).copied().flatten().unwrap_or(0);
        if e.offset < c && recs.get(&e.id).is_none_or(|r| r["state"] != "done") {
            past_durable.push(format!(
                "p{}@{} {} ({:?})",
                e.partition,
                e.offset,
                e.id,
                recs.get(&e.id).map(|r| &r["state"])
            ));
        }
    }
    assert!(
        past_durable.is_empty(),
        "offsets committed past events not durably done ({} of them), e.g. {:?}",
        past_durable.len(),
        &past_durable[..past_durable.len().min(10)]
    );
    assert!(
        failure_time.is_some(),
        "outboxd logged no store failure before exiting:\n{}",
        log_lines(&od, "").join("\n")
    );
    assert_eq!(late_calls, 0, "handler calls kept starting more than 200 ms after the store failed");

    od.start();
    od.wait_for_assignment().await;
    wait_alive(&mut [&mut od], &format!("all {good} events answered after the restart"), DRAIN_TIMEOUT, || {
        rx.ok_count() >= good
    })
    .await;
    wait_alive(&mut [&mut od], "committed offsets to reach the end", DRAIN_TIMEOUT, || offsets.reached_end()).await;
    let drain = filled_at.elapsed();
    od.stop();
    let check = Check {
        topic: &topic,
        events: &events,
        stores: vec![("a".into(), records(&od))],
        calls: rx.calls(),
        kills: vec![(filled_system, exit_time)],
        dead_letters: None,
        handler_timeout: timeout_of(&od),
        timed_out: event_ids_logged(&od, "timed out"),
    };
    let summary = Summary {
        events: events.len(),
        poison: 0,
        faults: format!(
            "store tmpfs ({size}) filled ({filled} bytes of filler) after {answered_at_fill} events; outboxd exited \
             ({status}) {stopped_after:.1?} later with {error_line:?} (names the store path: {names_path}); \
             calls started after the fill: {calls_after_fill}; resumes by itself when space is freed: no (exits; \
             restarted after freeing)"
        ),
        drain,
        drain_from: "after the filesystem filled (includes the restart)",
        extra: String::new(),
    };
    finish(name, check, summary, began);
}
