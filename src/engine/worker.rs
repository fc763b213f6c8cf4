//! The per-key chains that keep events of one key in offset order, and the
//! step after an event is durably final: letting its offset move.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use foldhash::HashMap;
use futures::FutureExt;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::error;

use super::executor::{Executed, Executor};

/// How often an event of a partition being restored looks whether it may begin.
const RESTORE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);
use crate::event::RawMessage;
use crate::kafka::{Source, Tracker};
use crate::offsets::{PartitionId, PartitionRef};

/// Events of one Kafka key in one partition run one at a time, in offset order. A
/// key's chain is known by a hash of its topic, partition and key (foldhash's,
/// seeded per process, like the executor's live ids): the map of chains holds
/// no copy of either text, and a lookup reads no memory beyond its own entry
/// (comparing two copies read two cold allocations per lookup, most of the 0.4 µs
/// a finished event's lookup took in a log drain). Two keys with one 64-bit hash
/// would only share a chain: the later event of either waits for the earlier one.
/// Keys come from messages, but none can be chosen to collide with another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(u64);

impl KeyId {
    fn of(shared: &Shared, msg: &RawMessage) -> KeyId {
        KeyId(shared.keys.hash_one((&msg.topic, msg.partition, &msg.key)))
    }
}

/// What a consumed message holds until it is finished: one of `max_in_flight`
/// places and its size of `max_in_flight_bytes`. Holding them bounds read-ahead.
/// Once its call is over and it only waits for its record to be durable (and
/// acknowledged by the changelog), it gives its place to the next message for one
/// of the `max_settling` places ([`call_over`]); so do the events queued behind it
/// in its key's chain, which wait for that record too. Its bytes stay counted.
pub struct Permits {
    events: Option<OwnedSemaphorePermit>,
    settling: Option<OwnedSemaphorePermit>,
    _bytes: OwnedSemaphorePermit,
}

impl Permits {
    /// A message's place and bytes, as the poll loop takes them.
    pub fn new(events: OwnedSemaphorePermit, bytes: OwnedSemaphorePermit) -> Permits {
        Permits { events: Some(events), settling: None, _bytes: bytes }
    }

    /// Trades the event's place for one of the `settling` places, if it still holds
    /// its place and one is free. Returns whether it holds a settling place now.
    fn settle(&mut self, settling: &Arc<Semaphore>) -> bool {
        if self.events.is_none() {
            return true;
        }
        let Ok(place) = settling.clone().try_acquire_owned() else { return false };
        self.settling = Some(place);
        self.events = None;
        true
    }
}

/// A consumed message waiting for or in its key's chain. Its permits are given
/// back early when its handler's circuit opens ([`release`]): it then waits in
/// its chain without holding read-ahead that other handlers' events need.
pub struct Job {
    pub msg: RawMessage,
    pub generation: u64,
    pub permits: Option<Permits>,
}

/// A key's events: the one running (its permits) and those queued behind it.
pub struct Chain {
    /// The key's topic, for [`release`] (the one copy per chain).
    topic: String,
    running: Option<Permits>,
    /// The running event's call is over: it only waits for its record ([`call_over`]).
    call_over: bool,
    queue: VecDeque<Job>,
}

impl Chain {
    /// Queues `job`. Behind an event that only waits for its record, it waits for that
    /// record too: it takes a settling place, if one is free, and gives its own back.
    fn push(&mut self, mut job: Job, settling: &Arc<Semaphore>) {
        if self.call_over {
            if let Some(permits) = job.permits.as_mut() {
                permits.settle(settling);
            }
        }
        self.queue.push_back(job);
    }

    /// The next queued job becomes the running one (its permits, whichever places they are).
    fn next(&mut self) -> Option<Job> {
        let mut next = self.queue.pop_front()?;
        self.running = next.permits.take();
        self.call_over = false;
        Some(next)
    }
}

/// Everything the workers share.
pub struct Shared {
    /// Runs one message to a durable final state.
    pub exec: Arc<Executor>,
    pub tracker: Tracker,
    /// Where messages come from and offsets go (the Kafka consumer, or a test's source).
    pub consumer: Arc<dyn Source>,
    /// Active chains: a key present here has a task working through its queue.
    pub chains: Mutex<HashMap<KeyId, Chain>>,
    /// Hashes a message's key into its [`KeyId`].
    pub keys: foldhash::fast::RandomState,
    /// Places of events whose call is over and that wait for their record to be
    /// durable and acknowledged (`max_in_flight` of them): see [`call_over`].
    pub settling: Arc<Semaphore>,
}

/// A message was consumed: its offset is tracked from now on, in the
/// partition's current generation (returned: the message runs in it or not at all).
pub fn consumed(shared: &Shared, msg: &RawMessage) -> u64 {
    let partition = PartitionRef { topic: &msg.topic, partition: msg.partition };
    let mut tracker = shared.tracker.lock();
    let g = tracker.generation(&partition).unwrap_or_else(|| tracker.assign(PartitionId::new(&msg.topic, msg.partition)));
    tracker.consumed(&partition, g, msg.offset);
    g
}

/// Queues a consumed message behind earlier events of its key. Without
/// `permits` (its handler's circuit is open) it holds no read-ahead.
pub fn dispatch(shared: &Arc<Shared>, msg: RawMessage, generation: u64, permits: Option<Permits>) {
    let key = KeyId::of(shared, &msg);
    let mut job = Job { msg, generation, permits };
    let mut chains = lock(&shared.chains);
    if let Some(chain) = chains.get_mut(&key) {
        chain.push(job, &shared.settling);
        return;
    }
    let topic = job.msg.topic.clone();
    chains.insert(key, Chain { topic, running: job.permits.take(), call_over: false, queue: VecDeque::new() });
    drop(chains);
    tokio::spawn(run_chain(shared.clone(), key, job));
}

/// Gives back the read-ahead held by every queued or running event whose topic
/// `on` says: their handler's circuit opened, so they wait (in order, in their
/// chains) and would otherwise keep other handlers' events out.
pub fn release(shared: &Shared, on: impl Fn(&str) -> bool) -> usize {
    let mut chains = lock(&shared.chains);
    let mut released = 0;
    for chain in chains.values_mut().filter(|c| on(&c.topic)) {
        released += usize::from(chain.running.take().is_some());
        released += chain.queue.iter_mut().filter_map(|j| j.permits.take()).count();
    }
    released
}

/// The task of a key's chain: `job`, then each queued behind it. An `async fn` would
/// move its arguments into locals of its own, so its future held the first job twice
/// (and every spawn copied both); the block runs from the one slot it captured. The
/// guard holds the only handle on `shared`.
#[expect(clippy::manual_async_fn, reason = "an async fn's future holds its arguments twice (above)")]
fn run_chain(shared: Arc<Shared>, key: KeyId, mut job: Job) -> impl std::future::Future<Output = ()> {
    async move {
        let mut chain = ChainGuard { shared, key: Some(key) };
        loop {
            process(&chain.shared, chain.key.expect("a running chain has its key"), &job).await;
            drop(job);
            match chain.next() {
                Some(j) => job = j,
                None => return,
            }
        }
    }
}

/// Owns a key's entry in `chains` while its task runs. Whatever ends the task
/// (the normal end of the queue, or a panic that escaped `process`), the entry
/// does not outlive it: a dead entry would queue every later event of the key
/// behind nothing, and the partition would never commit again.
struct ChainGuard {
    shared: Arc<Shared>,
    /// `None` once the chain ended normally.
    key: Option<KeyId>,
}

impl ChainGuard {
    /// The next queued job of this key, or `None` (and the entry removed) when none
    /// waits. The finished job's permits are given back, the next one's held as running.
    fn next(&mut self) -> Option<Job> {
        let key = self.key?;
        let mut chains = lock(&self.shared.chains);
        let chain = chains.get_mut(&key).expect("an active chain has its entry");
        let next = chain.next();
        if next.is_none() {
            chains.remove(&key);
            self.key = None;
        }
        next
    }
}

impl Drop for ChainGuard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        // Reached only when the task unwinds: hand the queue to a new task.
        let (next, topic) = {
            let mut chains = lock(&self.shared.chains);
            let (next, topic) = match chains.get_mut(&key) {
                Some(chain) => (chain.next(), chain.topic.clone()),
                None => (None, String::new()),
            };
            if next.is_none() {
                chains.remove(&key);
            }
            (next, topic)
        };
        match &next {
            Some(job) => error!(%topic, partition = job.msg.partition,
                "a key's chain ended unexpectedly; its queue goes on"),
            None => error!(%topic, "a key's chain ended unexpectedly; nothing was queued behind it"),
        }
        if let (Some(job), Ok(runtime)) = (next, tokio::runtime::Handle::try_current()) {
            runtime.spawn(run_chain(self.shared.clone(), key, job));
        }
    }
}

/// A poisoned lock only means a panic happened while it was held; the map itself stays valid.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The running event of `key` has had its call and now only waits for its record
/// to be durable and acknowledged (the changelog's linger and round trip, the
/// group commit): its place among `max_in_flight` goes to the next message, for
/// one of the `max_settling` places, and so do the places of the events queued
/// behind it, which wait for the same record before they can begin (under a
/// backlog of many keys, most places were held by such events while their keys'
/// records settled: bench/findings.md, "what holds the places"). Without a
/// settling place free, an event keeps its place: the settling are bounded too,
/// and their messages' bytes stay counted.
pub fn call_over(shared: &Shared, key: KeyId) {
    let mut chains = lock(&shared.chains);
    let Some(chain) = chains.get_mut(&key) else { return };
    chain.call_over = true;
    let queued = chain.queue.iter_mut().filter_map(|j| j.permits.as_mut());
    for permits in chain.running.iter_mut().chain(queued) {
        if !permits.settle(&shared.settling) {
            break;
        }
    }
}

async fn process(shared: &Shared, key: KeyId, job: &Job) {
    let msg = &job.msg;
    // After a store failure nothing more runs: a later event of this key must not
    // overtake the one whose record could not be written.
    if shared.exec.stopped() {
        return;
    }
    let partition = PartitionRef { topic: &msg.topic, partition: msg.partition };
    // No event of a partition begins before its changelog is restored (the
    // consumer pauses it; this holds what was fetched before the pause). A partition
    // being revoked (or already reassigned) starts nothing new: its next owner reads
    // from the last committed offset. One look at the tracker for both, as a rule.
    loop {
        let started = {
            let mut tracker = shared.tracker.lock();
            match tracker.is_restoring(&partition, job.generation) {
                true => None,
                false => Some(tracker.start_running(&partition, job.generation)),
            }
        };
        match started {
            Some(true) => break,
            Some(false) => return,
            None if shared.exec.stopped() => return,
            None => tokio::time::sleep(RESTORE_WAIT).await,
        }
    }
    let owned = || shared.tracker.lock().owns(&partition, job.generation);
    let give_place = || call_over(shared, key);
    // A bug (a panic) while handling one message must not take its key's chain and
    // its partition with it: the message is recorded dead instead.
    let result = match AssertUnwindSafe(shared.exec.execute_owned(msg, &owned, &give_place)).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => shared.exec.record_panic(msg, &panic_text(panic.as_ref())).await.map(|()| Executed::Final),
    };
    match result {
        Ok(Executed::Final) => {
            // Under the lock so that stored offsets never go backwards.
            let mut tracker = shared.tracker.lock();
            if let Some(next) = tracker.finish(&partition, job.generation, msg.offset) {
                shared.consumer.store_offset(&partition, next);
            }
        }
        Ok(Executed::Abandoned) => shared.tracker.lock().abandon(&partition, job.generation),
        Err(e) => {
            error!(error = %e, topic = %msg.topic, partition = msg.partition, offset = msg.offset,
                "store failed; stopping without committing this offset");
            shared.exec.fail(e);
        }
    }
}

/// The message a panic carried (`panic!("...")` gives a `&str` or a `String`).
pub(super) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
