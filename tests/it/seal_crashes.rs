//! outboxd dies in the middle of sealing a slice into a packed run (at each step of
//! `Store::seal`, through the debug builds' `OUTBOXD_DEBUG_CRASH_IN_SEAL`, which
//! aborts as a SIGKILL would leave the process), is started again, and Debezium
//! replays every event: each event was called once, none is lost, and the next seal
//! completes. The same for a merge: a sealed slice whose overlay took writes since
//! (here `store forget`s) packed anew with its run (steps `merge-…`; the debug builds'
//! `OUTBOXD_DEBUG_RESEAL_WRITES` lets a few writes make it due).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::harness::{self, OffsetReader, Outboxd, Producer, Receiver, Scenario};
use serde_json::json;

const EVENTS: usize = 200;
const TIMEOUT: Duration = Duration::from_secs(60);
const GC_EVERY: Duration = Duration::from_millis(500);
/// Events forgotten after the first seal: more than an eighth of the run, so a merge is due.
const FORGOTTEN: usize = 30;

/// An outboxd that is to die at a seal step, its events, and what it talks to.
struct Crashing {
    topic: String,
    receiver: Receiver,
    od: Outboxd,
    offsets: OffsetReader,
    producer: Producer,
    ids: Vec<String>,
}

impl Crashing {
    /// outboxd running with slices of 7.5 s (an eighth of the retention), every record
    /// kept for at least a minute, longer than the test. gc runs when the test asks
    /// (`store gc`), not on its own: the seal comes once every event is done, however
    /// slow the machine. `env` is set for the run besides the crash point.
    async fn start(name: &str, crash_at: &str, env: &[(&str, &str)]) -> Crashing {
        let mut s = Scenario::new(name, 2).await;
        s.od.config.retention = "60s".into();
        s.od.config.store_extra = "gc_interval = \"1h\"\n".into();
        s.od.config.env.insert("OUTBOXD_DEBUG_CRASH_IN_SEAL".into(), crash_at.into());
        for (var, value) in env {
            s.od.config.env.insert((*var).into(), (*value).into());
        }
        s.run().await;
        let Scenario { topic, receiver, od, offsets, producer, .. } = s;
        let ids = (0..EVENTS).map(|_| harness::new_event_id()).collect();
        Crashing { topic, receiver, od, offsets, producer, ids }
    }

    /// Every event sent (again), as Debezium does.
    async fn send_all(&self) {
        for (i, id) in self.ids.iter().enumerate() {
            self.producer.send_event(&self.topic, &format!("agg-{}", i % 20), id, Some("Tick"), &json!({"i": i})).await;
        }
    }

    async fn wait_committed(&mut self) {
        let Crashing { od, offsets, .. } = self;
        let what = format!("committed offsets at the end ({})", offsets.describe());
        od.wait_until(what, TIMEOUT, || offsets.reached_end()).await;
    }

    /// Every event sent and handled once, its offset committed.
    async fn handle_all(&mut self) {
        self.send_all().await;
        let Crashing { od, receiver, ids, .. } = self;
        od.wait_until("every event answered", TIMEOUT, || ids.iter().all(|id| receiver.answered(id))).await;
        self.wait_committed().await;
    }

    /// gc, again and again, until outboxd dies at `step`.
    async fn die_at(&mut self, step: &str) {
        let pid = self.od.pid();
        gc_until(&self.od, &format!("outboxd to die at the seal step {step}"), || exited(pid)).await;
        self.od.wait_crashed_at("seal", step, TIMEOUT);
    }

    /// Started again as it was, without the crash; Debezium sends every event again.
    async fn restart_and_replay(&mut self) {
        self.od.config.env.remove("OUTBOXD_DEBUG_CRASH_IN_SEAL");
        self.od.start();
        self.od.wait_for_assignment().await;
        self.send_all().await;
        self.wait_committed().await;
    }

    /// Stops outboxd; then each event was called `calls(i)` times in all (`i`: its
    /// place in the list) and has its done record.
    fn stop_and_check(&mut self, label: &str, calls: impl Fn(usize) -> usize) {
        self.od.stop();
        let wrong: Vec<(&String, usize)> = (self.ids.iter().enumerate())
            .map(|(i, id)| (i, id, self.receiver.calls_for(id).len()))
            .filter(|(i, _, n)| *n != calls(*i))
            .map(|(_, id, n)| (id, n))
            .collect();
        assert!(wrong.is_empty(), "{label}: events called other than expected: {wrong:?}");
        let done: HashSet<String> =
            self.od.store_list(Some("done"), 10 * EVENTS).into_iter().map(|r| r.event_id).collect();
        let missing: Vec<&String> = self.ids.iter().filter(|id| !done.contains(*id)).collect();
        assert!(missing.is_empty(), "{label}: events without their done record: {missing:?}");
    }
}

async fn crash_in_seal_then_replay(step: &str) {
    let mut c = Crashing::start(&format!("seal-crash-{step}"), step, &[]).await;
    c.handle_all().await;
    // gc until the slice of the events has ended and its seal dies.
    c.die_at(step).await;
    c.restart_and_replay().await;
    // The slice is packed again, or its run (durable before the crash) is settled.
    gc_until(&c.od, "the seal to complete after the restart", || {
        let log = c.od.log();
        log.contains("a slice's records packed into a run") || log.contains("a slice's overlay settled against its run")
    })
    .await;
    c.stop_and_check(step, |_| 1);
}

/// Events done and sealed into a run; some of them forgotten (their records' removals
/// are the slice's overlay); the merge of the two dies at `step`; started again, every
/// event is replayed: the forgotten ones run once more (what `forget` is for), the
/// others not at all, and every event has its done record.
async fn crash_in_merge_then_replay(step: &str) {
    let crash_at = format!("merge-{step}");
    // Due once the overlay holds an eighth of the run (25 of 200 records), not 4,096 writes.
    let mut c =
        Crashing::start(&format!("merge-crash-{step}"), &crash_at, &[("OUTBOXD_DEBUG_RESEAL_WRITES", "1")]).await;
    c.handle_all().await;
    // The first seal, once the events' slice has ended (not a merge: it lives through it).
    gc_until(&c.od, "the events' slice to be sealed", || c.od.log().contains("a slice's records packed into a run"))
        .await;
    for id in &c.ids[..FORGOTTEN] {
        let out = c.od.command(&["store", "forget", id, "--yes", "--reason", "make the sealed slice's overlay"]);
        assert!(out.status.success(), "forget {id}: {}", String::from_utf8_lossy(&out.stderr));
    }
    c.die_at(&crash_at).await;
    c.restart_and_replay().await;
    let Crashing { od, receiver, ids, .. } = &mut c;
    od.wait_until("the forgotten events answered again", TIMEOUT, || {
        ids[..FORGOTTEN].iter().all(|id| receiver.calls_for(id).len() >= 2)
    })
    .await;
    c.stop_and_check(&crash_at, |i| if i < FORGOTTEN { 2 } else { 1 });
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
