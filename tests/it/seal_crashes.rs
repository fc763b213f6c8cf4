//! outboxd dies in the middle of sealing a slice into a packed run (at each step of
//! `Store::seal`, through the debug builds' `OUTBOXD_DEBUG_CRASH_IN_SEAL`, which
//! aborts as a SIGKILL would leave the process), is started again, and Debezium
//! replays every event: each event was called once, none is lost, and the next seal
//! completes. The same for a merge: a sealed slice whose overlay took writes since
//! (here `store forget`s) packed anew with its run (steps `merge-…`; the debug builds'
//! `OUTBOXD_DEBUG_RESEAL_WRITES` lets a few writes make it due).

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use crate::harness::{self, Scenario};
use serde_json::json;

const EVENTS: usize = 200;
const TIMEOUT: Duration = Duration::from_secs(60);
const GC_EVERY: Duration = Duration::from_millis(500);
/// Events forgotten after the first seal: more than an eighth of the run, so a merge is due.
const FORGOTTEN: usize = 30;

async fn crash_in_seal_then_replay(step: &str) {
    let mut s = Scenario::new(&format!("seal-crash-{step}"), 2).await;
    // Slices of 7.5 s (an eighth of the retention), every record kept for at least a
    // minute, longer than the test. gc runs when the test asks (`store gc`), not on
    // its own: the seal comes once every event is done, however slow the machine.
    s.od.config.retention = "60s".into();
    s.od.config.store_extra = "gc_interval = \"1h\"\n".into();
    s.od.config.env.insert("OUTBOXD_DEBUG_CRASH_IN_SEAL".into(), step.into());
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let ids: Vec<String> = (0..EVENTS).map(|_| harness::new_event_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        producer.send_event(&topic, &format!("agg-{}", i % 20), id, Some("Tick"), &json!({"i": i})).await;
    }
    od.wait_until("every event answered", TIMEOUT, || ids.iter().all(|id| receiver.answered(id))).await;
    od.wait_until(format!("committed offsets at the end ({})", offsets.describe()), TIMEOUT, || offsets.reached_end())
        .await;
    // gc, again and again, until the slice of the events has ended and its seal dies.
    let pid = od.pid();
    gc_until(&od, "outboxd to die in the seal", || exited(pid)).await;
    let status = od.wait_exit(TIMEOUT);
    assert_eq!(status.signal(), Some(SIGABRT), "outboxd should die at the seal step {step}: {status}");
    assert!(od.log().contains(&format!("crashing at the seal step {step:?}")), "{}", od.log_tails(40, 0));

    // Started again as it was, without the crash; Debezium sends every event again.
    od.config.env.remove("OUTBOXD_DEBUG_CRASH_IN_SEAL");
    od.start();
    od.wait_for_assignment().await;
    for (i, id) in ids.iter().enumerate() {
        producer.send_event(&topic, &format!("agg-{}", i % 20), id, Some("Tick"), &json!({"i": i})).await;
    }
    od.wait_until(format!("committed offsets at the end ({})", offsets.describe()), TIMEOUT, || offsets.reached_end())
        .await;
    // The slice is packed again, or its run (durable before the crash) is settled.
    gc_until(&od, "the seal to complete after the restart", || {
        let log = od.log();
        log.contains("a slice's records packed into a run") || log.contains("a slice's overlay settled against its run")
    })
    .await;

    od.stop();
    let repeated: Vec<&String> = ids.iter().filter(|id| receiver.calls_for(id).len() != 1).collect();
    assert!(repeated.is_empty(), "{step}: events called other than once: {repeated:?}");
    let done: HashSet<String> = od.store_list(Some("done"), 10 * EVENTS).into_iter().map(|r| r.event_id).collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !done.contains(*id)).collect();
    assert!(missing.is_empty(), "{step}: events without their done record: {missing:?}");
}

/// Events done and sealed into a run; some of them forgotten (their records' removals
/// are the slice's overlay); the merge of the two dies at `step`; started again, every
/// event is replayed: the forgotten ones run once more (what `forget` is for), the
/// others not at all, and every event has its done record.
async fn crash_in_merge_then_replay(step: &str) {
    let mut s = Scenario::new(&format!("merge-crash-{step}"), 2).await;
    s.od.config.retention = "60s".into();
    s.od.config.store_extra = "gc_interval = \"1h\"\n".into();
    // Due once the overlay holds an eighth of the run (25 of 200 records), not 4,096 writes.
    s.od.config.env.insert("OUTBOXD_DEBUG_RESEAL_WRITES".into(), "1".into());
    s.od.config.env.insert("OUTBOXD_DEBUG_CRASH_IN_SEAL".into(), format!("merge-{step}"));
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let ids: Vec<String> = (0..EVENTS).map(|_| harness::new_event_id()).collect();
    let send_all = || async {
        for (i, id) in ids.iter().enumerate() {
            producer.send_event(&topic, &format!("agg-{}", i % 20), id, Some("Tick"), &json!({"i": i})).await;
        }
    };
    send_all().await;
    od.wait_until("every event answered", TIMEOUT, || ids.iter().all(|id| receiver.answered(id))).await;
    od.wait_until(format!("committed offsets at the end ({})", offsets.describe()), TIMEOUT, || offsets.reached_end())
        .await;
    // The first seal, once the events' slice has ended (not a merge: it lives through it).
    gc_until(&od, "the events' slice to be sealed", || od.log().contains("a slice's records packed into a run")).await;
    let forgotten = &ids[..FORGOTTEN];
    for id in forgotten {
        let out = od.command(&["store", "forget", id, "--yes", "--reason", "make the sealed slice's overlay"]);
        assert!(out.status.success(), "forget {id}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let pid = od.pid();
    gc_until(&od, "outboxd to die in the merge", || exited(pid)).await;
    let status = od.wait_exit(TIMEOUT);
    assert_eq!(status.signal(), Some(SIGABRT), "outboxd should die at the merge step {step}: {status}");
    assert!(od.log().contains(&format!("crashing at the seal step \"merge-{step}\"")), "{}", od.log_tails(40, 0));

    od.config.env.remove("OUTBOXD_DEBUG_CRASH_IN_SEAL");
    od.start();
    od.wait_for_assignment().await;
    send_all().await;
    od.wait_until(format!("committed offsets at the end ({})", offsets.describe()), TIMEOUT, || offsets.reached_end())
        .await;
    od.wait_until("the forgotten events answered again", TIMEOUT, || {
        forgotten.iter().all(|id| receiver.calls_for(id).len() >= 2)
    })
    .await;
    od.stop();
    let wrong: Vec<(&String, usize)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id, receiver.calls_for(id).len(), if i < FORGOTTEN { 2 } else { 1 }))
        .filter(|(_, calls, want)| calls != want)
        .map(|(id, calls, _)| (id, calls))
        .collect();
    assert!(wrong.is_empty(), "merge-{step}: events called other than once (twice if forgotten): {wrong:?}");
    let done: HashSet<String> = od.store_list(Some("done"), 10 * EVENTS).into_iter().map(|r| r.event_id).collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !done.contains(*id)).collect();
    assert!(missing.is_empty(), "merge-{step}: events without their done record: {missing:?}");
}

/// Runs `outboxd store gc` through the running service every half second until `done`.
async fn gc_until(od: &harness::Outboxd, what: &str, mut done: impl FnMut() -> bool) {
    let mut last: Option<Instant> = None;
    harness::wait_until(what, TIMEOUT, || {
        if done() {
            return true;
        }
        if last.is_none_or(|t| t.elapsed() >= GC_EVERY) {
            // Its answer does not matter: the process may die during the call.
            let _ = od.command(&["store", "gc", "--reason", "seal the slice now"]);
            last = Some(Instant::now());
        }
        done()
    })
    .await;
}

/// Whether process `pid` has ended (a zombie until it is reaped).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
}

/// What `std::process::abort` ends the process with.
const SIGABRT: i32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_run_is_written_and_before_it_is_durable_loses_nothing() {
    crash_in_seal_then_replay("packed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_run_is_installed_and_before_it_is_durable_loses_nothing() {
    crash_in_seal_then_replay("installed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_run_is_durable_and_before_the_entries_it_replaces_go_loses_nothing() {
    crash_in_seal_then_replay("durable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_a_merge_after_the_run_is_written_and_before_it_is_durable_loses_nothing() {
    crash_in_merge_then_replay("packed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_a_merge_after_the_run_is_installed_and_before_it_is_durable_loses_nothing() {
    crash_in_merge_then_replay("installed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_a_merge_after_the_run_is_durable_and_before_the_entries_it_replaces_go_loses_nothing() {
    crash_in_merge_then_replay("durable").await;
}
