//! The poll loop: bounded read-ahead, dispatch to per-key chains, and a drain
//! on shutdown that commits only finished offsets. The app wires it
//! ([`crate::app`]); the engine knows nothing of the admin server.

mod executor;
mod fatal;
mod follow;
mod guards;
#[cfg(test)]
mod policy_tests;
mod reader;
mod restore;
mod retry;
mod standby;
mod worker;

pub use executor::{check_custom_topics, Counters, Executor, SetupError};
pub use fatal::Fatal;
pub use reader::RestoreError;
pub use restore::{restore_partition, RestoreSetup, Restored};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kafka::{Consumer, Tracker};
use crate::metrics::names;
use worker::Shared;

/// Pause after a consumer error before polling again.
const CONSUMER_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Consumes and runs events until shut down, then drains.
pub struct Engine {
    shared: Arc<Shared>,
    /// One permit per event in flight (`store.max_in_flight`): bounds read-ahead.
    permits: Arc<Semaphore>,
    /// One permit per message byte in flight (`store.max_in_flight_bytes`).
    bytes: Arc<Semaphore>,
    max_in_flight: usize,
    max_bytes: u32,
    /// How long the drain waits for events in flight (`kafka.drain_timeout`).
    drain_timeout: Duration,
    /// Set once no new event is taken (`/readyz` says so).
    draining: Arc<AtomicBool>,
}

impl Engine {
    /// Limits come from `exec`'s config.
    pub fn new(exec: Arc<Executor>, consumer: Arc<Consumer>, tracker: Tracker) -> Engine {
        let max_in_flight = exec.config.store.max_in_flight;
        let max_bytes = exec.config.store.max_in_flight_bytes;
        let drain_timeout = exec.config.kafka.drain_timeout;
        Engine {
            shared: Arc::new(Shared { exec, tracker, consumer, chains: Mutex::new(HashMap::new()) }),
            permits: Arc::new(Semaphore::new(max_in_flight)),
            bytes: Arc::new(Semaphore::new(max_bytes as usize)),
            max_in_flight,
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

    /// True once the engine stopped taking events.
    pub fn draining(&self) -> Arc<AtomicBool> {
        self.draining.clone()
    }

    /// Polls and dispatches until `shutdown` is cancelled (a signal, the
    /// embedding program, or a store failure: [`Executor::fail`] cancels it),
    /// then drains: waits for events in flight (up to the drain timeout, not at
    /// all after a store failure) and commits every finished offset. Returns
    /// the store failure, if that is why it stopped.
    pub async fn run(&self, shutdown: &CancellationToken) -> Option<Fatal> {
        let consumer = &self.shared.consumer;
        loop {
            let permit = tokio::select! {
                () = shutdown.cancelled() => break,
                p = self.permits.clone().acquire_owned() => p.expect("the permit semaphore is never closed"),
            };
            let msg = tokio::select! {
                () = shutdown.cancelled() => break,
                m = consumer.recv() => m,
            };
            match msg {
                Ok(raw) => {
                    metrics::counter!(names::CONSUMED, "topic" => raw.topic.clone()).increment(1);
                    // Bytes as well as events are bounded; a message larger than the bound runs alone.
                    let size = u32::try_from(raw.size()).unwrap_or(u32::MAX).clamp(1, self.max_bytes);
                    let held = tokio::select! {
                        () = shutdown.cancelled() => break,
                        b = self.bytes.clone().acquire_many_owned(size) => b.expect("the bytes semaphore is never closed"),
                    };
                    worker::dispatch(&self.shared, raw, worker::Permits { _events: permit, _bytes: held });
                }
                Err(error) => {
                    warn!(%error, "kafka consumer error");
                    drop(permit);
                    // librdkafka retries by itself; this only keeps a persistent error from flooding the log.
                    tokio::time::sleep(CONSUMER_ERROR_PAUSE).await;
                }
            }
        }
        self.drain().await
    }

    async fn drain(&self) -> Option<Fatal> {
        self.draining.store(true, Ordering::Relaxed);
        let tracker = &self.shared.tracker;
        let failure = self.shared.exec.failure();
        let all = u32::try_from(self.max_in_flight).unwrap_or(u32::MAX);
        if failure.is_some() {
            // No in-flight event can record its outcome any more: waiting would only delay the exit.
            let unfinished = tracker.lock().unfinished();
            warn!(unfinished,
                "the store failed: not waiting for in-flight events; they stay uncommitted and are redelivered after a restart");
        } else {
            info!("draining: no new events; waiting for in-flight ones");
            let drain_timeout = self.drain_timeout;
            if tokio::time::timeout(drain_timeout, self.permits.acquire_many(all)).await.is_err() {
                let unfinished = tracker.lock().unfinished();
                warn!(unfinished, ?drain_timeout,
                    "drain timeout: unfinished events stay uncommitted and are redelivered (claimed ones re-execute with the same idempotency key)");
            }
        }
        self.shared.consumer.commit_now(tracker);
        failure
    }
}
