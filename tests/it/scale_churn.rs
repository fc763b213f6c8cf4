//! Scale-out under churn, with the changelog on: three outboxd processes in one
//! group join, leave and are SIGKILLed at random while events and Debezium-style
//! replays of them (the same ids at new offsets) keep arriving. Afterwards nothing
//! is lost, and an event runs again only when a SIGKILL cut its earlier call. The
//! restores these moves rely on are tested in [`restore`].
//!
//! Size knobs: `OUTBOXD_SCALE_EVENTS` (default 2000; full size 10,000) and
//! `OUTBOXD_SCALE_STEPS` (default 12 joins, leaves and kills); the seed is printed and
//! taken from `OUTBOXD_SCALE_SEED` when set. It does not run beside the other load
//! tests ([`turns::LOAD`]).

use crate::harness;
use crate::scale::on;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::changelog;
use harness::daemon::instance_header_toml;
use harness::receiver::Call;
use harness::{env_usize, new_event_id, turns, Behaviour, Kafka, Outboxd, Produced, Receiver, Scenario};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

mod restore;

/// Partitions of the churn's source topic: two for each instance when all three run.
const PARTITIONS: i32 = 6;
const NAMES: [&str; 3] = ["a", "b", "c"];
/// Events are produced in this many batches, spread over the schedule.
const BATCHES: usize = 40;
/// Pause before each step of the schedule, in ms.
const STEP_PAUSE_MS: std::ops::RangeInclusive<u64> = 500..=2500;
/// Bound for committing what was produced once the churn is over (a SIGKILLed
/// member's partitions wait for its session timeout, 6 s here, then a restore).
const HANDLED_TIMEOUT: Duration = Duration::from_secs(120);

/// What happens to one instance at one step of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Join(usize),
    /// SIGTERM: drain, commit, leave the group.
    Leave(usize),
    /// SIGKILL: the group notices after the session timeout.
    Kill(usize),
}

/// A seeded schedule (A runs from the start): B and C join, then random joins, leaves
/// and kills, at least one of each, never leaving the group without a running instance.
fn schedule(rng: &mut StdRng, steps: usize) -> Vec<Step> {
    let mut running = [true, true, true];
    let mut out = vec![Step::Join(1), Step::Join(2)];
    let (mut leaves, mut kills) = (0, 0);
    while out.len() < steps || leaves == 0 || kills == 0 {
        let up: Vec<usize> = (0..NAMES.len()).filter(|&i| running[i]).collect();
        let down: Vec<usize> = (0..NAMES.len()).filter(|&i| !running[i]).collect();
        let step = if up.len() < 2 || (!down.is_empty() && rng.random_bool(0.35)) {
            Step::Join(down[rng.random_range(0..down.len())])
        } else if rng.random_bool(0.5) {
            Step::Kill(up[rng.random_range(0..up.len())])
        } else {
            Step::Leave(up[rng.random_range(0..up.len())])
        };
        match step {
            Step::Join(i) => running[i] = true,
            Step::Leave(i) => (running[i], leaves) = (false, leaves + 1),
            Step::Kill(i) => (running[i], kills) = (false, kills + 1),
        }
        out.push(step);
    }
    out
}

/// How a run of an instance ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Left,
    Killed,
}

/// The runs of the three instances: each names itself (`a1`, `a2`, `b1`, ...) in
/// every call it makes; how and when each ended.
#[derive(Default)]
struct Runs {
    count: [usize; 3],
    ended: HashMap<String, (End, SystemTime)>,
}

impl Runs {
    fn label(&self, i: usize) -> String {
        format!("{}{}", NAMES[i], self.count[i])
    }

    fn start(&mut self, od: &mut Outboxd, i: usize) {
        self.count[i] += 1;
        od.config.handler_extra = instance_header_toml(&self.label(i));
        od.start();
    }

    /// Records the end of instance `i`'s run, after the signal.
    fn ended(&mut self, i: usize, end: End) {
        self.ended.insert(self.label(i), (end, SystemTime::now()));
    }

    fn end_of(&self, call: &Call) -> Option<(End, SystemTime)> {
        call.instance().and_then(|label| self.ended.get(label)).copied()
    }
}

/// What the producer sent: the events, and the replays with when each was acknowledged.
#[derive(Default)]
struct Production {
    originals: Vec<Produced>,
    replays: Vec<(Produced, SystemTime)>,
}

async fn send_all(producer: &harness::Producer, topic: &str, events: &[(String, String)]) -> Vec<Produced> {
    let payload = json!({"kind": "tick"});
    let sends = events.iter().map(|(key, id)| producer.send_event(topic, key, id, Some("Tick"), &payload));
    futures::future::join_all(sends).await
}

/// The events again, same key and id, at new offsets: Debezium after a Connect crash.
async fn replay(producer: &harness::Producer, topic: &str, events: &[Produced], into: &mut Production) {
    let again: Vec<(String, String)> = events.iter().map(|p| (p.key.clone(), p.event_id.clone())).collect();
    for p in send_all(producer, topic, &again).await {
        into.replays.push((p, SystemTime::now()));
    }
}

/// `events` events on many keys in [`BATCHES`] batches `pause` apart; after some
/// batches, a run of earlier events again.
fn spawn_producer(
    kafka: Kafka,
    topic: String,
    events: usize,
    pause: Duration,
    seed: u64,
) -> tokio::task::JoinHandle<Production> {
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1));
        let producer = kafka.producer();
        let keys = (events / 10).max(1);
        let per_batch = events.div_ceil(BATCHES);
        let mut out = Production::default();
        while out.originals.len() < events {
            let n = out.originals.len();
            let batch: Vec<(String, String)> =
                (n..(n + per_batch).min(events)).map(|i| (format!("agg-{}", i % keys), new_event_id())).collect();
            out.originals.extend(send_all(&producer, &topic, &batch).await);
            if out.originals.len() > per_batch && rng.random_bool(0.3) {
                let len = (per_batch / 2).max(1);
                let from = rng.random_range(0..out.originals.len() - len);
                let earlier = out.originals[from..from + len].to_vec();
                replay(&producer, &topic, &earlier, &mut out).await;
            }
            tokio::time::sleep(pause).await;
        }
        out
    })
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).expect("after the epoch").as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_joining_leaving_and_killed_at_random_lose_nothing_and_repeat_only_calls_cut_by_a_kill() {
    let _load = turns::LOAD.lock().await;
    let events = env_usize("OUTBOXD_SCALE_EVENTS", 2000).max(BATCHES);
    let steps = env_usize("OUTBOXD_SCALE_STEPS", 12);
    let seed =
        std::env::var("OUTBOXD_SCALE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    println!("scale churn: events={events} steps={steps} seed={seed} (OUTBOXD_SCALE_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = schedule(&mut rng, steps);
    let pauses: Vec<Duration> = plan.iter().map(|_| Duration::from_millis(rng.random_range(STEP_PAUSE_MS))).collect();
    let began = Instant::now();

    let Scenario { kafka, topic, receiver, od, offsets, .. } = Scenario::new("churn", PARTITIONS).await;
    receiver.set_default(Behaviour::random_delay(Duration::ZERO..=Duration::from_millis(20)));
    // The scenario's outboxd is the first; the others join its group.
    let others = NAMES[1..].iter().map(|_| Outboxd::new(&kafka, &[&topic], &receiver));
    let mut ods: Vec<Outboxd> = std::iter::once(od).chain(others).map(on).collect();
    let group = ods[0].config.group_id.clone();
    for od in &mut ods {
        od.config.group_id = group.clone();
        // An event may be in flight at several kills in a row; that must not exhaust it.
        od.config.max_attempts = 1000;
    }
    let mut runs = Runs::default();
    runs.start(&mut ods[0], 0);
    ods[0].wait_for_assignment().await;
    let pause = pauses.iter().sum::<Duration>() / BATCHES as u32;
    let producing = spawn_producer(kafka.clone(), topic.clone(), events, pause, seed);

    for (step, pause) in plan.iter().zip(&pauses) {
        tokio::time::sleep(*pause).await;
        println!("scale churn: {:>5.1} s {step:?}", began.elapsed().as_secs_f64());
        match *step {
            Step::Join(i) => {
                runs.start(&mut ods[i], i);
                if rng.random_bool(0.5) {
                    ods[i].wait_for_assignment().await;
                }
            }
            Step::Leave(i) => {
                // Once it is up (its signals handled, its partitions taken).
                ods[i].wait_for_assignment().await;
                let status = ods[i].terminate();
                assert!(status.success(), "{} should exit 0 after SIGTERM, got {status}", runs.label(i));
                runs.ended(i, End::Left);
            }
            Step::Kill(i) => {
                // Preferably while a call of this run is in flight.
                let (run, every) = (runs.label(i), Duration::from_millis(rng.random_range(1..=10)));
                harness::wait_at_most(Duration::from_secs(1), every, || receiver.in_flight_from(&run) > 0).await;
                ods[i].assert_alive();
                ods[i].kill();
                runs.ended(i, End::Killed);
            }
        }
    }
    let mut production = producing.await.expect("the producer task");
    // Once the churn is over, a tenth again, of events first executed by a run that has
    // ended since: their records reach the owners of their partitions only through the changelog.
    let mut first_run: HashMap<String, String> = HashMap::new();
    for c in receiver.calls().into_iter().filter(|c| c.is_handler_call() && c.effective()) {
        if let (Some(id), Some(run)) = (c.event_id.clone(), c.instance()) {
            first_run.entry(id).or_insert_with(|| run.to_owned());
        }
    }
    let moved: Vec<Produced> = production
        .originals
        .iter()
        .filter(|p| first_run.get(&p.event_id).is_some_and(|run| runs.ended.contains_key(run)))
        .take(events / 10)
        .cloned()
        .collect();
    replay(&kafka.producer(), &topic, &moved, &mut production).await;

    let alive: Vec<usize> = (0..NAMES.len()).filter(|&i| ods[i].is_running()).collect();
    harness::wait_for("committed offsets to reach the end", HANDLED_TIMEOUT, async || {
        if offsets.reached_end() {
            return Ok(());
        }
        alive.iter().for_each(|&i| ods[i].assert_alive());
        Err(offsets.describe())
    })
    .await;
    for &i in &alive {
        ods[i].stop();
        runs.ended(i, End::Left);
    }
    let entries = changelog::entries_by_id(&kafka, &changelog::topic_for(&group, &topic), &topic);
    let failures = check_calls(&receiver, &runs, &production, &entries);
    println!("scale churn: {:.1} s in all (seed {seed})", began.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "seed {seed}:\n{}", failures.join("\n"));
}

/// The receiver's call log against what was produced: nothing lost; an id executed
/// again only after a call of it that a SIGKILL cut (its run killed before any final
/// record of the id reached the changelog), with the same idempotency key. Prints the counts; returns the failures.
fn check_calls(
    receiver: &Receiver,
    runs: &Runs,
    production: &Production,
    entries: &HashMap<String, Vec<changelog::Entry>>,
) -> Vec<String> {
    let calls: Vec<Call> = receiver.calls().into_iter().filter(Call::is_handler_call).collect();
    let ids: HashSet<&str> = production.originals.iter().map(|p| p.event_id.as_str()).collect();
    let mut effective: HashMap<&str, Vec<&Call>> = HashMap::new();
    for c in calls.iter().filter(|c| c.effective()) {
        effective.entry(c.event_id.as_deref().unwrap_or_default()).or_default().push(c);
    }
    // When the first final record of each id was produced to the changelog.
    let settled_ms: HashMap<&str, i64> = entries
        .iter()
        .filter_map(|(id, es)| {
            es.iter().filter(|e| e.state.is_final()).map(|e| e.timestamp_ms).min().map(|t| (id.as_str(), t))
        })
        .collect();
    // A call of a killed run was sent before the kill (the receiver may take it up a
    // little later on a loaded machine); the kill cut it if the changelog had no final
    // record of its event by then.
    let cut = |c: &Call| match runs.end_of(c) {
        Some((End::Killed, at)) => {
            settled_ms.get(c.event_id.as_deref().unwrap_or_default()).is_none_or(|&s| s > millis(at))
        }
        _ => false,
    };
    let in_flight_at_kills = calls.iter().filter(|c| c.effective() && cut(c)).count();
    let unanswered_at_kills = calls.iter().filter(|c| c.effective() && cut(c) && c.dropped.is_some()).count();
    // Of the cut calls answered before their kill, the longest time from the answer to the kill.
    let answered_before_kill = calls
        .iter()
        .filter(|c| c.effective() && cut(c))
        .filter_map(|c| runs.end_of(c)?.1.duration_since(c.answered?).ok())
        .max()
        .unwrap_or_default();

    let mut failures = Vec::new();
    let mut report = |what: &str, list: Vec<String>| {
        if !list.is_empty() {
            failures.push(format!("{} {what}, e.g. {:#?}", list.len(), &list[..list.len().min(5)]));
        }
    };
    let unknown: Vec<String> = calls
        .iter()
        .filter(|c| !c.event_id.as_deref().is_some_and(|id| ids.contains(id)))
        .map(|c| c.path.clone())
        .collect();
    report("calls for no produced event", unknown);
    let lost: Vec<String> = ids.iter().filter(|id| !effective.contains_key(*id)).map(|id| id.to_string()).collect();
    report("events were never executed", lost);
    let describe = |c: &Call| format!("#{} from {:?} (run ended {:?})", c.nth, c.instance(), runs.end_of(c));
    let unrecorded: Vec<String> = ids
        .iter()
        .filter(|id| !settled_ms.contains_key(*id))
        .map(|id| {
            format!(
                "{id}: calls {:?}",
                effective.get(id).into_iter().flatten().map(|c| describe(c)).collect::<Vec<_>>()
            )
        })
        .collect();
    report("events have no final record in the changelog", unrecorded);
    let answered_ok: HashSet<&str> =
        calls.iter().filter(|c| c.effective() && c.answered.is_some()).filter_map(|c| c.event_id.as_deref()).collect();
    let unanswered: Vec<String> = ids.difference(&answered_ok).map(|id| id.to_string()).collect();
    report("events committed without a call answered 2xx", unanswered);
    let repeated: Vec<(&str, &Vec<&Call>)> =
        effective.iter().filter(|(_, cs)| cs.len() > 1).map(|(id, cs)| (*id, cs)).collect();
    let other_key: Vec<String> = repeated
        .iter()
        .flat_map(|(id, cs)| cs.iter().filter(move |c| c.header("idempotency-key") != Some(id)))
        .map(|c| format!("{}: Idempotency-Key {:?}", c.path, c.header("idempotency-key")))
        .collect();
    report("repeated executions with another idempotency key", other_key);
    let not_cut: Vec<String> = repeated
        .iter()
        .filter_map(|(id, cs)| {
            let earlier = cs.iter().take(cs.len() - 1).find(|c| !cut(c))?;
            let written: Vec<String> = entries
                .get(*id)
                .into_iter()
                .flatten()
                .map(|e| format!("{} at p{}@{} ({} ms)", e.state, e.partition, e.offset, e.timestamp_ms))
                .collect();
            Some(format!(
                "{id}: executed again after call {} not cut by a kill; calls: {:?}; changelog: {written:?}",
                describe(earlier),
                cs.iter().map(|c| describe(c)).collect::<Vec<_>>()
            ))
        })
        .collect();
    report("events executed again though no kill cut their earlier call", not_cut);
    if repeated.len() > in_flight_at_kills {
        failures.push(format!(
            "{} ids executed more than once, more than the {in_flight_at_kills} calls in flight at the kills",
            repeated.len()
        ));
    }
    // Replays of ids whose first execution's run had ended by the time of the replay:
    // suppressed by an owner that only knew them from the changelog.
    let moved: HashSet<&str> = production
        .replays
        .iter()
        .filter(|(p, at)| {
            let first = effective.get(p.event_id.as_str()).and_then(|cs| cs.first());
            first.and_then(|c| runs.end_of(c)).is_some_and(|(_, ended)| ended < *at)
        })
        .map(|(p, _)| p.event_id.as_str())
        .collect();
    if moved.is_empty() {
        failures.push("no replay came after its event's partition moved: the churn proved nothing".into());
    }
    let kills = runs.ended.values().filter(|(end, _)| *end == End::Killed).count();
    let leaves = runs.ended.values().filter(|(end, _)| *end == End::Left).count();
    println!(
        "scale churn summary: events={} replays={} (of ids whose first run had ended: {}) runs={} \
         (left {leaves}, killed {kills}) handler_calls={} effective={} ids_executed_more_than_once={} \
         calls_in_flight_at_kills={in_flight_at_kills} (never answered: {unanswered_at_kills}; \
         the others answered at most {:.0?} before their kill)",
        ids.len(),
        production.replays.len(),
        moved.len(),
        runs.ended.len(),
        calls.len(),
        calls.iter().filter(|c| c.effective()).count(),
        repeated.len(),
        answered_before_kill,
    );
    failures
}
