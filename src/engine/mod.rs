//! The poll loop: bounded read-ahead, dispatch to per-key chains, and a drain
//! on shutdown that commits only finished offsets. The app wires it
//! ([`crate::app`]); the engine knows nothing of the admin server.

mod circuit;
mod concurrency;
#[cfg(feature = "internals")]
pub mod cost;
mod executor;
mod fatal;
mod follow;
mod guards;
mod hold;
#[cfg(test)]
mod memory_source;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod poll_tests;
mod reader;
mod restore;
mod retry;
mod slots;
pub mod spans;
mod standby;
mod summary;
mod worker;

pub use circuit::CircuitView;
pub use executor::{check_custom_topics, Counters, Executor};
pub use fatal::Fatal;
pub use restore::{restore_partition, RestoreSetup, Restored};

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::kafka::{RecvError, Source, Tracker};
use crate::metrics::names;
use crate::offsets::{describe, PartitionId};
use worker::Shared;

/// Consumes and runs events until shut down, then drains.
pub struct Engine {
    shared: Arc<Shared>,
    /// One permit per event in flight (`store.max_in_flight`): bounds read-ahead.
    permits: Arc<Semaphore>,
    /// One permit per message byte in flight (`store.max_in_flight_bytes`).
    bytes: Arc<Semaphore>,
    max_in_flight: usize,
    /// Places for events that only wait for their record (`store.max_settling`).
    max_settling: usize,
    max_bytes: u32,
    /// How long the drain waits for events in flight (`kafka.drain_timeout`).
    drain_timeout: Duration,
    /// Set once no new event is taken (`/readyz` says so).
    draining: Arc<AtomicBool>,
}

impl Engine {
    /// Limits come from `exec`'s config.
    pub fn new(exec: Arc<Executor>, consumer: Arc<dyn Source>, tracker: Tracker) -> Engine {
        let max_in_flight = exec.config.store.max_in_flight;
        let max_settling = exec.config.store.max_settling;
        let max_bytes = exec.config.store.max_in_flight_bytes;
        let drain_timeout = exec.config.kafka.drain_timeout;
        Engine {
            shared: Arc::new(Shared {
                exec,
                tracker,
                consumer,
                chains: Mutex::new(HashMap::new()),
                keys: foldhash::fast::RandomState::default(),
                settling: Arc::new(Semaphore::new(max_settling)),
            }),
            permits: Arc::new(Semaphore::new(max_in_flight)),
            bytes: Arc::new(Semaphore::new(max_bytes as usize)),
            max_in_flight,
            max_settling,
            max_bytes,
            drain_timeout,
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Restores assigned partitions from their changelog until `stop` (see `restore`).
    pub fn restore_task(
        &self,
        setup: RestoreSetup,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        restore::run(self.shared.clone(), setup, stop)
    }

    /// Runs the held events of released chains (`on_dead = "hold"`) in this
    /// instance's partitions until `stop`, then lets the ones running finish (see `hold`).
    pub fn release_task(&self, stop: CancellationToken) -> impl std::future::Future<Output = ()> + Send + 'static {
        hold::run(self.shared.clone(), self.drain_timeout, stop)
    }

    /// Keys with an event queued or running (the in-process tests wait for none).
    #[cfg(test)]
    fn active_chains(&self) -> usize {
        worker::lock(&self.shared.chains).len()
    }

    /// True once the engine stopped taking events.
    pub fn draining(&self) -> Arc<AtomicBool> {
        self.draining.clone()
    }

    /// Polls and dispatches until `shutdown` is cancelled (a signal, the
    /// embedding program, or a store failure: [`Executor::fail`] cancels it),
    /// then drains: waits for events in flight (up to the drain timeout, not at
    /// all after a store failure) and commits every finished offset. Returns
    /// the store failure, if that is why it stopped.
    ///
    /// The loop never stops polling for long, however many events are in flight:
    /// a message that finds read-ahead full waits here, and once it has waited
    /// `PAUSE_AFTER` every partition is paused until there is room and the loop
    /// polls again, so rebalance callbacks and errors are served and the group
    /// never takes a partition away for want of a poll.
    pub async fn run(&self, shutdown: &CancellationToken) -> Option<Fatal> {
        let consumer = &*self.shared.consumer;
        let mut full = Waiting::default();
        let mut open = OpenCircuits::new(self.shared.exec.circuits().all().len());
        let mut circuits = self.shared.exec.circuits().subscribe();
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The consumed counter of each topic, resolved at its first message, not per message.
        let mut consumed: HashMap<String, metrics::Counter> = HashMap::new();
        loop {
            while let Some(permits) = full.front().and_then(|w| self.try_permits(w.size)) {
                let w = full.pop();
                worker::dispatch(&self.shared, w.msg, w.generation, Some(permits));
            }
            if full.is_empty() {
                full.resume(consumer, &self.shared.tracker, &open);
            }
            let wanted = full.front().map(|w| w.size);
            // A message waits for room without the loop polling for at most PAUSE_AFTER:
            // events usually finish within it (a drain frees permits every few µs), and a
            // pause would drop what librdkafka prefetched. After it, the partitions pause
            // and the loop polls again, however long the events in flight take.
            let polling = wanted.is_none() || full.paused();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = beat.tick() => self.beat(),
                Ok(()) = circuits.changed() => self.follow_circuits(&mut open, &mut full),
                permits = self.permits_for(wanted.unwrap_or(1)), if wanted.is_some() => {
                    let w = full.pop();
                    worker::dispatch(&self.shared, w.msg, w.generation, Some(permits));
                }
                () = tokio::time::sleep_until(full.since + PAUSE_AFTER), if !polling => {
                    full.pause_all(consumer, &self.shared.tracker);
                }
                msg = consumer.recv(), if polling => match msg {
                    Ok(raw) => {
                        count_consumed(&mut consumed, &raw.topic);
                        let generation = worker::consumed(&self.shared, &raw);
                        let size = self.size_of(&raw);
                        if let Some(h) = self.open_route_of(&raw.topic, &open) {
                            // A route's circuit is open: none of its events waits in `full`
                            // (they left it when it opened), so this one cannot overtake one of
                            // its key. It waits in its chain without read-ahead; its partition pauses.
                            open.pause(consumer, h, PartitionId::new(&raw.topic, raw.partition));
                            worker::dispatch(&self.shared, raw, generation, None);
                            continue;
                        }
                        match self.try_permits(size).filter(|_| full.is_empty()) {
                            Some(permits) => worker::dispatch(&self.shared, raw, generation, Some(permits)),
                            None => {
                                // A backlog: the group commit may wait longer for company meanwhile.
                                self.shared.exec.store.handling().backlog_seen();
                                full.push(consumer, Wait { msg: raw, generation, size });
                            }
                        }
                    }
                    Err(RecvError::Fatal(reason)) => {
                        error!(%reason, "the Kafka consumer failed; stopping");
                        self.shared.exec.fail(Fatal::Consumer(reason));
                        break;
                    }
                    Err(RecvError::PollExceeded(error)) => {
                        // librdkafka leaves the group: nothing of ours may start or commit until it rejoins.
                        warn!(%error, "kafka poll interval exceeded");
                        self.shared.tracker.raise_alarm();
                    }
                    // librdkafka retries by itself and says so once per state change.
                    Err(RecvError::Transient(error)) => warn!(%error, "kafka consumer error"),
                },
            }
        }
        self.drain().await
    }

    /// The poll loop is alive: ownership is confirmed as of now (a gap since the
    /// last beat longer than `kafka.fence_after` fences every partition first,
    /// and the consumer then rejoins the group to have them assigned afresh).
    fn beat(&self) {
        let rejoin = {
            let mut tracker = self.shared.tracker.lock();
            tracker.confirm(Instant::now());
            tracker.take_rejoin()
        };
        if rejoin {
            self.shared.consumer.rejoin();
        }
    }

    /// The index of a route of `topic` whose circuit pauses, if one does: an event is
    /// final once every route is, so one route's outage holds the topic's events until
    /// its circuit holds them instead (`circuit.hold_after`) and stops pausing.
    fn open_route_of(&self, topic: &str, open: &OpenCircuits) -> Option<usize> {
        self.shared.exec.config.routes_for(topic).map(|r| r.handler.index).find(|h| open.is_open(*h))
    }

    /// Whether handler `h` is a route of `topic`.
    fn takes(&self, h: usize, topic: &str) -> bool {
        self.shared.exec.config.handlers[h].topics.matches(topic)
    }

    /// A circuit opened or closed. Open: the handler's assigned partitions pause, its
    /// events leave `full` for their chains (in order), and every event of it
    /// gives back its read-ahead, so that other handlers' topics keep flowing.
    /// Closed: its partitions resume (unless paused for read-ahead or a restore).
    fn follow_circuits(&self, open: &mut OpenCircuits, full: &mut Waiting) {
        let consumer = &*self.shared.consumer;
        for (h, circuit) in self.shared.exec.circuits().all().iter().enumerate() {
            let now_open = circuit.pauses();
            if now_open == open.is_open(h) {
                continue;
            }
            let of_h = |topic: &str| self.takes(h, topic);
            if now_open {
                open.open[h] = true;
                let assigned: Vec<PartitionId> =
                    self.shared.tracker.lock().partitions().into_iter().filter(|p| of_h(&p.topic)).collect();
                for p in assigned {
                    open.pause(consumer, h, p);
                }
                for w in full.take(|w| of_h(&w.msg.topic)) {
                    worker::dispatch(&self.shared, w.msg, w.generation, None);
                }
                let released = worker::release(&self.shared, of_h);
                info!(handler = %circuit.name, paused = open.paused[h].len(), released,
                    "the handler's partitions pause while its circuit is open");
            } else {
                open.open[h] = false;
                let paused = std::mem::take(&mut open.paused[h]);
                let resume: Vec<PartitionId> = {
                    let tracker = self.shared.tracker.lock();
                    // A partition of a topic another open route takes stays paused for that one.
                    paused.into_iter().filter(|p| tracker.may_fetch(p) && !full.holds(p) && !open.holds(p)).collect()
                };
                if !resume.is_empty() {
                    if circuit.holding() {
                        warn!(handler = %circuit.name, partitions = %describe(&resume),
                            "circuit open longer than circuit.hold_after: resuming its partitions; this route's events are held until its receiver answers, the topic's other routes go on");
                    } else if circuit.is_open() {
                        warn!(handler = %circuit.name, partitions = %describe(&resume),
                            "circuit open longer than circuit.give_up_after: resuming its partitions (their events are dead-lettered)");
                    } else {
                        info!(handler = %circuit.name, partitions = %describe(&resume), "circuit closed: resuming its partitions");
                    }
                    consumer.resume(&resume);
                }
            }
        }
    }

    /// A message's share of `max_in_flight_bytes`; a message larger than the bound runs alone.
    fn size_of(&self, raw: &crate::event::RawMessage) -> u32 {
        u32::try_from(raw.size()).unwrap_or(u32::MAX).clamp(1, self.max_bytes)
    }

    /// Room for one more event of `size` bytes now, or `None`.
    fn try_permits(&self, size: u32) -> Option<worker::Permits> {
        let events = self.permits.clone().try_acquire_owned().ok()?;
        let bytes = self.bytes.clone().try_acquire_many_owned(size).ok()?;
        Some(worker::Permits::new(events, bytes))
    }

    /// Room for one more event of `size` bytes, once there is (cancel-safe: what
    /// was taken is given back when the wait is dropped).
    async fn permits_for(&self, size: u32) -> worker::Permits {
        let events = self.permits.clone().acquire_owned().await.expect("the permit semaphore is never closed");
        let bytes = self.bytes.clone().acquire_many_owned(size).await.expect("the bytes semaphore is never closed");
        worker::Permits::new(events, bytes)
    }

    async fn drain(&self) -> Option<Fatal> {
        self.draining.store(true, Ordering::Relaxed);
        let tracker = &self.shared.tracker;
        let failure = self.shared.exec.failure();
        let all = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (places, settling) = (all(self.max_in_flight), all(self.max_settling));
        if failure.is_some() {
            // No in-flight event can record its outcome any more: waiting would only delay the exit.
            let unfinished = tracker.lock().unfinished();
            warn!(unfinished,
                "the store failed: not waiting for in-flight events; they stay uncommitted and are redelivered after a restart");
        } else {
            info!("draining: no new events; waiting for in-flight ones");
            let drain_timeout = self.drain_timeout;
            if tokio::time::timeout(drain_timeout, self.wait_for_permits(places, settling)).await.is_err() {
                let unfinished = tracker.lock().unfinished();
                warn!(unfinished, ?drain_timeout,
                    "drain timeout: unfinished events stay uncommitted and are redelivered (claimed ones re-execute with the same idempotency key)");
            }
        }
        let finished = tracker.lock().committable();
        self.shared.consumer.commit_now(&finished);
        // Bounded like the drain; it takes a few milliseconds when the brokers answer.
        self.shared.consumer.leave(self.drain_timeout).await;
        failure
    }

    /// Waits until every event place and every settling place is free (every event
    /// in flight ended), confirming ownership meanwhile: librdkafka keeps the
    /// membership while the service drains, and the events that finish may still commit.
    async fn wait_for_permits(&self, places: u32, settling: u32) {
        let freed = async {
            let places = self.permits.acquire_many(places).await;
            let settling = self.shared.settling.acquire_many(settling).await;
            (places, settling)
        };
        tokio::pin!(freed);
        let mut beat = tokio::time::interval(BEAT);
        loop {
            tokio::select! {
                _ = &mut freed => return,
                _ = beat.tick() => self.shared.tracker.lock().confirm(Instant::now()),
            }
        }
    }
}

/// How often the poll loop confirms ownership when no message comes; also how
/// often at least it polls librdkafka, whatever is in flight.
const BEAT: Duration = Duration::from_millis(200);

/// How long a message waits for room before the partitions pause and the loop
/// polls again: longer than events usually take to free a permit, far shorter than
/// anything the group waits for (a rebalance callback is served this much later).
const PAUSE_AFTER: Duration = Duration::from_millis(100);

/// Counts a message of `topic` consumed (`consumed` keeps its counter from the topic's
/// first message: one map lookup per message after that).
fn count_consumed(consumed: &mut HashMap<String, metrics::Counter>, topic: &str) {
    if let Some(counter) = consumed.get(topic) {
        return counter.increment(1);
    }
    let counter = metrics::counter!(names::CONSUMED, "topic" => topic.to_owned());
    counter.increment(1);
    consumed.insert(topic.to_owned(), counter);
}

/// Handlers whose circuit the poll loop found open, and the partitions it paused for them.
struct OpenCircuits {
    open: Vec<bool>,
    paused: Vec<Vec<PartitionId>>,
}

impl OpenCircuits {
    fn new(handlers: usize) -> OpenCircuits {
        OpenCircuits { open: vec![false; handlers], paused: vec![Vec::new(); handlers] }
    }

    fn is_open(&self, h: usize) -> bool {
        self.open[h]
    }

    /// Whether `p` is paused for an open circuit.
    fn holds(&self, p: &PartitionId) -> bool {
        self.paused.iter().any(|ps| ps.contains(p))
    }

    /// Pauses `p` for handler `h`'s circuit. Asked again for a partition it paused
    /// already, it pauses it again: a message of it came, so something resumed it
    /// meanwhile (the restore of a partition assigned again), and its messages would
    /// otherwise come without bound, none of them holding read-ahead.
    fn pause(&mut self, consumer: &dyn Source, h: usize, p: PartitionId) {
        consumer.pause(std::slice::from_ref(&p));
        if !self.paused[h].contains(&p) {
            self.paused[h].push(p);
        }
    }
}

/// A consumed message that found read-ahead full.
struct Wait {
    msg: crate::event::RawMessage,
    generation: u64,
    size: u32,
}

/// Messages that found read-ahead full, in the order they came, and the
/// partitions paused meanwhile. A paused partition's messages already fetched
/// are dropped by librdkafka and fetched again on resume, so this holds at most
/// about one message per partition.
struct Waiting {
    queue: VecDeque<Wait>,
    paused: Vec<PartitionId>,
    /// When the first message of the queue began to wait.
    since: tokio::time::Instant,
}

impl Default for Waiting {
    fn default() -> Waiting {
        Waiting { queue: VecDeque::new(), paused: Vec::new(), since: tokio::time::Instant::now() }
    }
}

impl Waiting {
    fn front(&self) -> Option<&Wait> {
        self.queue.front()
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether partitions are paused for read-ahead (the loop polls meanwhile).
    fn paused(&self) -> bool {
        !self.paused.is_empty()
    }

    fn pop(&mut self) -> Wait {
        self.queue.pop_front().expect("a message waits")
    }

    /// Takes out, in order, the messages `which` picks (a handler's, whose circuit opened).
    fn take(&mut self, which: impl Fn(&Wait) -> bool) -> VecDeque<Wait> {
        let (taken, kept) = std::mem::take(&mut self.queue).into_iter().partition(|w| which(w));
        self.queue = kept;
        if !self.queue.is_empty() {
            self.since = tokio::time::Instant::now();
        }
        taken
    }

    /// Whether `p` is paused for read-ahead.
    fn holds(&self, p: &PartitionId) -> bool {
        self.paused.contains(p)
    }

    /// Keeps `w`. While partitions are paused, a message that still comes
    /// (its partition assigned since, resumed by its restore meanwhile, or
    /// fetched before the pause took effect) pauses its own partition too.
    fn push(&mut self, consumer: &dyn Source, w: Wait) {
        if self.queue.is_empty() {
            self.since = tokio::time::Instant::now();
        }
        if self.paused() {
            let p = PartitionId::new(&w.msg.topic, w.msg.partition);
            consumer.pause(std::slice::from_ref(&p));
            if !self.paused.contains(&p) {
                self.paused.push(p);
            }
        }
        self.queue.push_back(w);
    }

    /// Read-ahead stayed full for `PAUSE_AFTER`: every assigned partition pauses
    /// until the waiting messages have room, and the loop polls meanwhile.
    fn pause_all(&mut self, consumer: &dyn Source, tracker: &Tracker) {
        let all = tracker.lock().partitions();
        if all.is_empty() {
            // Nothing to pause (everything was revoked): look again later.
            self.since = tokio::time::Instant::now();
            return;
        }
        debug!(partitions = %describe(&all), "read-ahead full: pausing until events finish");
        consumer.pause(&all);
        self.paused = all;
    }

    /// Resumes what was paused for read-ahead, except partitions no longer
    /// assigned, those waiting for their restore (the restore resumes them) and
    /// those of a handler whose circuit is open.
    fn resume(&mut self, consumer: &dyn Source, tracker: &Tracker, open: &OpenCircuits) {
        if self.paused.is_empty() {
            return;
        }
        let paused = std::mem::take(&mut self.paused);
        let resume: Vec<PartitionId> = {
            let tracker = tracker.lock();
            paused.into_iter().filter(|p| tracker.may_fetch(p) && !open.holds(p)).collect()
        };
        if !resume.is_empty() {
            debug!(partitions = %describe(&resume), "read-ahead has room: resuming");
            consumer.resume(&resume);
        }
    }
}
