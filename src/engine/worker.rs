//! The per-key chains that keep events of one key in offset order, and the
//! step after an event is durably final: letting its offset move.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;
use tracing::error;

use super::consumer::{self, KafkaConsumer, Tracker};
use super::executor::Executor;
use crate::event::RawMessage;

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

/// Everything the workers share.
pub struct Shared {
    /// Runs one message to a durable final state.
    pub exec: Arc<Executor>,
    pub tracker: Tracker,
    pub consumer: Arc<KafkaConsumer>,
    /// Active chains: a key present here has a task working through its queue.
    pub chains: Mutex<HashMap<KeyId, VecDeque<Job>>>,
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
    if shared.exec.stopped() {
        return;
    }
    let partition = (msg.topic.clone(), msg.partition);
    // A partition being revoked (or already reassigned) starts nothing new: its next
    // owner reads from the last committed offset.
    if !shared.tracker.lock().expect("offset tracker lock").begin(&partition, job.generation) {
        return;
    }
    match shared.exec.execute(msg).await {
        Ok(()) => {
            // Under the lock so that stored offsets never go backwards.
            let mut tracker = shared.tracker.lock().expect("offset tracker lock");
            if let Some(next) = tracker.finish(&partition, job.generation, msg.offset) {
                consumer::store_offset(&shared.consumer, &partition, next);
            }
        }
        Err(e) => {
            error!(error = %e, topic = %msg.topic, partition = msg.partition, offset = msg.offset,
                "store failed; stopping without committing this offset");
            shared.exec.fail(e.to_string());
        }
    }
}
