//! One event's life: decode → claim durably → handler (with retries) →
//! record done/dead durably → let the offset move. And the per-key chains
//! that keep events of one key in offset order.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{error, info, warn};

use super::consumer::{self, DeadLetterInfo, DeadLetters, KafkaConsumer, Tracker};
use crate::codec;
use crate::config::{Config, HandlerConfig, OnUncertain, RetryConfig};
use crate::event::{OutboxEvent, RawMessage};
use crate::handler::{Handler, HandlerError, Verified};
use crate::store::{Claim, State, Store, StoreError};

/// First pause, and the longest, between attempts to produce a dead letter.
const DLQ_RETRY_INITIAL: Duration = Duration::from_millis(200);
const DLQ_RETRY_MAX: Duration = Duration::from_secs(30);

/// Events of one Kafka key in one partition run one at a time, in offset order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyId {
    topic: String,
    partition: i32,
    key: Option<Vec<u8>>,
}

/// A consumed message waiting for or in its key's chain. Holding the permit
/// is what bounds read-ahead to `max_in_flight`.
pub struct Job {
    pub msg: RawMessage,
    pub generation: u64,
    pub _permit: OwnedSemaphorePermit,
}

/// Counters for the shutdown summary.
#[derive(Debug, Default)]
pub struct Counters {
    pub handled: AtomicU64,
    pub duplicates: AtomicU64,
    pub dead: AtomicU64,
    pub reexecuted: AtomicU64,
}

/// Everything the workers share.
pub struct Shared {
    pub config: Config,
    pub store: Arc<Store>,
    /// Parallel to `config.handlers`.
    pub handlers: Vec<Handler>,
    pub tracker: Tracker,
    pub consumer: Arc<KafkaConsumer>,
    /// Present when some handler has a dead-letter topic.
    pub dead_letters: Option<DeadLetters>,
    /// Active chains: a key present here has a task working through its queue.
    pub chains: Mutex<HashMap<KeyId, VecDeque<Job>>>,
    /// Event ids being worked on in this process: a second delivery of the
    /// same id (at another offset or key) waits instead of running twice.
    pub live: Mutex<HashMap<String, Arc<Semaphore>>>,
    pub counters: Counters,
    /// Set when the store fails: the service stops without moving offsets.
    pub fatal: tokio::sync::watch::Sender<Option<String>>,
}

/// Queues a consumed message behind earlier events of its key.
pub fn dispatch(shared: &Arc<Shared>, msg: RawMessage, permit: OwnedSemaphorePermit) {
    let partition = (msg.topic.clone(), msg.partition);
    let generation = {
        let mut tracker = shared.tracker.lock().expect("offset tracker lock");
        let g = tracker.generation(&partition).unwrap_or_else(|| tracker.assign(partition.clone()));
        tracker.start(&partition, g, msg.offset);
        g
    };
    let key = KeyId { topic: msg.topic.clone(), partition: msg.partition, key: msg.key.clone() };
    let job = Job { msg, generation, _permit: permit };
    let mut chains = shared.chains.lock().expect("chains lock");
    if let Some(queue) = chains.get_mut(&key) {
        queue.push_back(job);
        return;
    }
    chains.insert(key.clone(), VecDeque::new());
    drop(chains);
    tokio::spawn(run_chain(shared.clone(), key, job));
}

async fn run_chain(shared: Arc<Shared>, key: KeyId, first: Job) {
    let mut job = first;
    loop {
        process(&shared, &job).await;
        drop(job);
        let next = {
            let mut chains = shared.chains.lock().expect("chains lock");
            let queue = chains.get_mut(&key).expect("an active chain has its entry");
            match queue.pop_front() {
                Some(j) => j,
                None => {
                    chains.remove(&key);
                    return;
                }
            }
        };
        job = next;
    }
}

async fn process(shared: &Shared, job: &Job) {
    let msg = &job.msg;
    // After a store failure nothing more runs: a later event of this key must not
    // overtake the one whose record could not be written.
    if shared.fatal.borrow().is_some() {
        return;
    }
    let result = match shared.config.handler_for(&msg.topic) {
        None => undecodable(shared, None, msg, "no handler is configured for this topic".to_owned()).await,
        Some(hc) => match codec::decode(msg, &hc.event_id, &hc.event_type_header) {
            Err(e) => undecodable(shared, Some(hc), msg, e.to_string()).await,
            Ok(event) => handle(shared, hc, &shared.handlers[hc.index], event, msg).await,
        },
    };
    match result {
        Ok(()) => {
            let partition = (msg.topic.clone(), msg.partition);
            // Under the lock so that stored offsets never go backwards.
            let mut tracker = shared.tracker.lock().expect("offset tracker lock");
            if let Some(next) = tracker.finish(&partition, job.generation, msg.offset) {
                consumer::store_offset(&shared.consumer, &partition, next);
            }
        }
        Err(e) => {
            error!(error = %e, topic = %msg.topic, partition = msg.partition, offset = msg.offset,
                "store failed; stopping without committing this offset");
            let _ = shared.fatal.send(Some(e.to_string()));
        }
    }
}

async fn undecodable(
    shared: &Shared,
    hc: Option<&HandlerConfig>,
    msg: &RawMessage,
    reason: String,
) -> Result<(), StoreError> {
    let id = format!("undecodable/{}/{}/{}", msg.topic, msg.partition, msg.offset);
    warn!(event_id = %id, topic = %msg.topic, partition = msg.partition, offset = msg.offset, %reason,
        "message cannot be decoded; dead-lettered");
    shared.counters.dead.fetch_add(1, Ordering::Relaxed);
    let dlq = dead_letter(shared, hc, msg, &reason, 0).await;
    shared.store.record_undecodable(&id, msg, reason, dlq).await
}

/// Produces the dead letter when the handler has a topic, retrying until the
/// broker acknowledges it: the source offset must not move before that.
async fn dead_letter(
    shared: &Shared,
    hc: Option<&HandlerConfig>,
    msg: &RawMessage,
    reason: &str,
    attempts: u32,
) -> Option<String> {
    let topic = hc?.dead_letter_topic.as_deref()?;
    let producer = shared.dead_letters.as_ref()?;
    let info = DeadLetterInfo { error: reason, attempts };
    let mut pause = DLQ_RETRY_INITIAL;
    loop {
        match producer.send(topic, msg, &info).await {
            Ok(position) => return Some(position),
            Err(error) => {
                warn!(%error, dead_letter_topic = topic, topic = %msg.topic, partition = msg.partition,
                    offset = msg.offset, "dead-letter produce failed; retrying (the offset waits)");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(DLQ_RETRY_MAX);
            }
        }
    }
}

/// Claim, run with retries, record. Returns once the event is durably final.
async fn handle(
    shared: &Shared,
    hc: &HandlerConfig,
    handler: &Handler,
    event: OutboxEvent,
    msg: &RawMessage,
) -> Result<(), StoreError> {
    let _live = live_guard(shared, &event.id).await;
    let (topic, partition, offset) = (&event.position.topic, event.position.partition, event.position.offset);
    let mut attempt = match shared.store.claim(&event).await? {
        Claim::Finished(state) => {
            shared.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            info!(event_id = %event.id, %topic, partition, offset, %state, "duplicate suppressed");
            return Ok(());
        }
        Claim::Claimed { attempt, reexecution: false } => attempt,
        Claim::Claimed { attempt, reexecution: true } => {
            shared.counters.reexecuted.fetch_add(1, Ordering::Relaxed);
            match hc.on_uncertain {
                OnUncertain::Retry => {
                    warn!(event_id = %event.id, %topic, partition, offset, attempt,
                        "re-executing: an earlier attempt's outcome is unknown (same idempotency key)");
                }
                OnUncertain::Park => {
                    let reason = "parked: an earlier attempt's outcome is unknown (on_uncertain = park); resolve with `outboxd store resolve`";
                    return failed(shared, hc, &event, msg, attempt, State::Parked, reason.to_owned()).await;
                }
                OnUncertain::Verify => match verify(shared, hc, handler, &event).await {
                    Ok(Verified::Happened(outcome)) => {
                        info!(event_id = %event.id, %topic, partition, offset, %outcome,
                            "uncertain event verified as done; not re-executed");
                        shared.counters.handled.fetch_add(1, Ordering::Relaxed);
                        return shared.store.finish(&event.id, State::Done, outcome).await;
                    }
                    Ok(Verified::Missing) => {
                        warn!(event_id = %event.id, %topic, partition, offset, attempt,
                            "re-executing: verify found no trace of the earlier attempt");
                    }
                    Err(reason) => return failed(shared, hc, &event, msg, attempt, State::Dead, reason).await,
                },
            }
            attempt
        }
    };
    let started = Instant::now();
    let mut delays = backoff(&hc.retry);
    loop {
        match handler.handle(&event).await {
            Ok(outcome) => {
                shared.store.finish(&event.id, State::Done, outcome.0.clone()).await?;
                shared.counters.handled.fetch_add(1, Ordering::Relaxed);
                info!(event_id = %event.id, %topic, partition, offset, attempt, outcome = %outcome.0, "event handled");
                return Ok(());
            }
            Err(HandlerError::Permanent(reason)) => {
                return failed(shared, hc, &event, msg, attempt, State::Dead, reason).await;
            }
            Err(HandlerError::Retryable { reason, retry_after }) => {
                let Some(delay) = next_delay(&mut delays, retry_after, started, &hc.retry) else {
                    let reason = format!("gave up after {attempt} attempts in {:?}: {reason}", started.elapsed());
                    return failed(shared, hc, &event, msg, attempt, State::Dead, reason).await;
                };
                warn!(event_id = %event.id, %topic, partition, offset, attempt, %reason, ?delay, "handler failed; retrying");
                tokio::time::sleep(delay).await;
                attempt = shared.store.record_attempt(&event.id).await?;
            }
        }
    }
}

/// Asks the receiver about an uncertain event, retrying the lookup like the handler.
async fn verify(
    shared: &Shared,
    hc: &HandlerConfig,
    handler: &Handler,
    event: &OutboxEvent,
) -> Result<Verified, String> {
    let started = Instant::now();
    let mut delays = backoff(&hc.retry);
    loop {
        match handler.verify(event).await {
            Ok(v) => return Ok(v),
            Err(HandlerError::Permanent(reason)) => return Err(reason),
            Err(HandlerError::Retryable { reason, retry_after }) => {
                let Some(delay) = next_delay(&mut delays, retry_after, started, &hc.retry) else {
                    return Err(format!("verify gave up: {reason}"));
                };
                warn!(event_id = %event.id, %reason, ?delay, "verify lookup failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
        if shared.fatal.borrow().is_some() {
            return Err("stopping".to_owned());
        }
    }
}

/// The exponential schedule (backon), without its own jitter: full jitter is applied per delay.
fn backoff(retry: &RetryConfig) -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(retry.initial_backoff)
        .with_max_delay(retry.max_backoff)
        .with_factor(retry.multiplier)
        .with_max_times(retry.max_attempts.saturating_sub(1) as usize)
        .build()
}

/// Full jitter (uniform in `0..=delay`), at least the receiver's `Retry-After`;
/// `None` when attempts are used up or waiting would pass `max_elapsed`.
fn next_delay(
    delays: &mut impl Iterator<Item = Duration>,
    retry_after: Option<Duration>,
    started: Instant,
    retry: &RetryConfig,
) -> Option<Duration> {
    let ceiling = delays.next()?;
    let jittered = ceiling.mul_f64(rand::random::<f64>());
    let delay = retry_after.map_or(jittered, |ra| ra.max(jittered));
    (started.elapsed() + delay <= retry.max_elapsed).then_some(delay)
}

/// Dead or parked: dead-letter it (when configured), then record it with the message copy.
async fn failed(
    shared: &Shared,
    hc: &HandlerConfig,
    event: &OutboxEvent,
    msg: &RawMessage,
    attempt: u32,
    state: State,
    reason: String,
) -> Result<(), StoreError> {
    let p = &event.position;
    error!(event_id = %event.id, topic = %p.topic, partition = p.partition, offset = p.offset, attempt, %state, %reason,
        "event failed");
    shared.counters.dead.fetch_add(1, Ordering::Relaxed);
    let dlq = dead_letter(shared, Some(hc), msg, &reason, attempt).await;
    shared.store.finish_failed(&event.id, state, reason, msg, dlq).await
}

/// Releases the id when dropped; waiters then look at the store again.
struct LiveGuard<'a> {
    shared: &'a Shared,
    id: String,
    gate: Arc<Semaphore>,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.shared.live.lock().expect("live ids lock").remove(&self.id);
        self.gate.close();
    }
}

async fn live_guard<'a>(shared: &'a Shared, id: &str) -> LiveGuard<'a> {
    loop {
        let busy = {
            let mut live = shared.live.lock().expect("live ids lock");
            match live.get(id) {
                Some(gate) => gate.clone(),
                None => {
                    let gate = Arc::new(Semaphore::new(0));
                    live.insert(id.to_owned(), gate.clone());
                    return LiveGuard { shared, id: id.to_owned(), gate };
                }
            }
        };
        // Closed (never granted) when the holder finishes.
        let _ = busy.acquire().await;
    }
}
