//! The poll loop: bounded read-ahead, dispatch to per-key chains, periodic
//! retention, and a drain on shutdown that commits only finished offsets.

mod executor;
#[cfg(test)]
mod policy_tests;
mod retry;
mod worker;

pub use crate::kafka::validate_options as validate_kafka_options;
pub use executor::Executor;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use crate::admin;
use crate::config::Config;
use crate::kafka::Consumer;
use crate::metrics::names;
use crate::offsets::OffsetTracker;
use crate::store::{now_us, Store, StoreOptions};
use worker::Shared;

/// Pause after a consumer error before polling again.
const CONSUMER_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs outboxd until `shutdown` resolves (or the store fails), then drains.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let store = Store::open(
        &config.store.path,
        &StoreOptions {
            retention: config.store.retention,
            commit_interval: config.store.commit_interval,
            fsync: config.store.fsync,
            role: "run",
            cache_bytes: config.store.cache_bytes,
        },
    )
    .with_context(|| format!("opening the store at {}", config.store.path.display()))?;
    store.set_message_quota(config.store.max_message_copy_bytes);
    let store = Arc::new(store);
    let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
    let subscriptions = config.subscriptions();
    let prometheus = crate::metrics::install().context("setting up metrics")?;
    let prometheus_upkeep = prometheus.clone();
    let broker_up = Arc::new(AtomicBool::new(false));
    let consumer = Arc::new(
        Consumer::build(&config.kafka, &subscriptions, tracker.clone(), broker_up.clone())
            .context("creating the Kafka consumer")?,
    );
    let max_in_flight = config.store.max_in_flight;
    let max_bytes = config.store.max_in_flight_bytes;
    let drain_timeout = config.kafka.drain_timeout;
    let gc_interval = config.store.gc_interval;
    let stall_timeout = config.stall_timeout();
    let admin_config = config.admin.clone();
    let exec = Arc::new(Executor::new(config, store.clone()).context("setting up handlers")?);
    let mut fatal_rx = exec.failure();
    let permits = Arc::new(Semaphore::new(max_in_flight));
    let bytes = Arc::new(Semaphore::new(max_bytes as usize));
    let draining = Arc::new(AtomicBool::new(false));
    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(addr) = admin_config.listen {
        let listener = admin::bind(addr).await?;
        let local = listener.local_addr()?;
        store.advertise_admin(&local.to_string()).context("recording the admin address next to the store")?;
        let state = admin::AdminState {
            exec: exec.clone(),
            tracker: tracker.clone(),
            draining: draining.clone(),
            broker_up,
            stall_timeout,
            prometheus,
            token: admin_config.token,
        };
        tokio::spawn(async move {
            if let Err(error) = admin::serve(listener, state, async { drop(admin_stopped.await) }).await {
                warn!(%error, "admin server stopped");
            }
        });
        info!(admin = %local, "admin API listening (/healthz /readyz /metrics /v1/…)");
    }
    spawn_store_gauges(&store);
    spawn_stall_watch(tracker.clone(), stall_timeout);
    spawn_metrics_upkeep(prometheus_upkeep);
    let shared = Arc::new(Shared {
        exec,
        tracker: tracker.clone(),
        consumer: consumer.clone(),
        chains: Mutex::new(HashMap::new()),
    });
    info!(topics = %subscriptions.join(","), store = %store.path().display(), max_in_flight, "outboxd running");

    let mut gc_tick = tokio::time::interval(gc_interval);
    tokio::pin!(shutdown);
    let failure: Option<String> = loop {
        let permit = tokio::select! {
            () = &mut shutdown => break None,
            _ = fatal_rx.changed() => break fatal_rx.borrow().clone(),
            _ = gc_tick.tick() => {
                spawn_gc(&store);
                continue;
            }
            p = permits.clone().acquire_owned() => p.expect("the permit semaphore is never closed"),
        };
        let msg = tokio::select! {
            () = &mut shutdown => break None,
            _ = fatal_rx.changed() => break fatal_rx.borrow().clone(),
            m = consumer.recv() => m,
        };
        match msg {
            Ok(raw) => {
                metrics::counter!(names::CONSUMED, "topic" => raw.topic.clone()).increment(1);
                // Bytes as well as events are bounded; a message larger than the bound runs alone.
                let size = u32::try_from(raw.size()).unwrap_or(u32::MAX).clamp(1, max_bytes);
                let held = tokio::select! {
                    () = &mut shutdown => break None,
                    _ = fatal_rx.changed() => break fatal_rx.borrow().clone(),
                    b = bytes.clone().acquire_many_owned(size) => b.expect("the bytes semaphore is never closed"),
                };
                worker::dispatch(&shared, raw, worker::Permits { _events: permit, _bytes: held });
            }
            Err(error) => {
                warn!(%error, "kafka consumer error");
                drop(permit);
                // librdkafka retries by itself; this only keeps a persistent error from flooding the log.
                tokio::time::sleep(CONSUMER_ERROR_PAUSE).await;
            }
        }
    };

    draining.store(true, Ordering::Relaxed);
    let all = u32::try_from(max_in_flight).unwrap_or(u32::MAX);
    if failure.is_some() {
        // No in-flight event can record its outcome any more: waiting would only delay the exit.
        let unfinished = tracker.lock().expect("offset tracker lock").unfinished();
        warn!(unfinished,
            "the store failed: not waiting for in-flight events; they stay uncommitted and are redelivered after a restart");
    } else {
        info!("draining: no new events; waiting for in-flight ones");
        if tokio::time::timeout(drain_timeout, permits.acquire_many(all)).await.is_err() {
            let unfinished = tracker.lock().expect("offset tracker lock").unfinished();
            warn!(unfinished, ?drain_timeout,
                "drain timeout: unfinished events stay uncommitted and are redelivered (claimed ones re-execute with the same idempotency key)");
        }
    }
    consumer.commit_now(&tracker);
    let closed = store.close().await;
    let _ = admin_stop.send(());
    let c = &shared.exec.counters;
    info!(
        handled = c.handled.load(Ordering::Relaxed),
        duplicates_suppressed = c.duplicates.load(Ordering::Relaxed),
        dead = c.dead.load(Ordering::Relaxed),
        reexecuted = c.reexecuted.load(Ordering::Relaxed),
        "outboxd stopped"
    );
    let path = store.path().display();
    match (failure, closed) {
        // The first failure says why; the failed final flush would only repeat it.
        (Some(reason), _) => anyhow::bail!("stopped because the store at {path} failed: {reason}"),
        (None, Err(e)) => Err(e).with_context(|| format!("flushing the store at {path}")),
        (None, Ok(())) => Ok(()),
    }
}

/// How often the store gauges are refreshed (kept counts and file sizes: no scan).
const STORE_GAUGES_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

fn spawn_store_gauges(store: &Arc<Store>) {
    let store = store.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(STORE_GAUGES_INTERVAL);
        loop {
            tick.tick().await;
            for (state, n) in store.counts() {
                metrics::gauge!(names::RECORDS, "state" => state.as_str()).set(n as f64);
            }
            metrics::gauge!(names::COPY_BYTES).set(store.message_bytes() as f64);
            if let Ok(bytes) = store.bytes_on_disk() {
                metrics::gauge!(names::STORE_BYTES).set(bytes as f64);
            }
        }
    });
}

/// How often partitions are checked for stalls.
const STALL_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Keeps the stalled-partitions gauge current and says in the log when a
/// partition starts or stops being stalled (`/readyz` computes it on demand).
fn spawn_stall_watch(tracker: Arc<Mutex<OffsetTracker>>, bound: std::time::Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(STALL_WATCH_INTERVAL);
        let mut reported = Vec::new();
        loop {
            tick.tick().await;
            let stalled = tracker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .stalled(std::time::Instant::now(), bound);
            metrics::gauge!(names::STALLED).set(stalled.len() as f64);
            if stalled != reported {
                if stalled.is_empty() {
                    info!("no partition is stalled any more");
                } else {
                    error!(partitions = %crate::offsets::describe(&stalled), stall_timeout = ?bound,
                        "partitions stalled: events wait and the committed offset has not moved (see /readyz)");
                }
                reported = stalled;
            }
        }
    });
}

/// How often histogram samples are folded into their buckets.
const METRICS_UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The recorder keeps every histogram sample until it is folded in, which
/// otherwise happens only when /metrics is scraped: without a scraper (or
/// without the admin server) memory would grow with every event.
fn spawn_metrics_upkeep(handle: metrics_exporter_prometheus::PrometheusHandle) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
}

fn spawn_gc(store: &Arc<Store>) {
    let store = store.clone();
    tokio::spawn(async move {
        match store.gc(now_us()).await {
            Ok(0) => {}
            Ok(removed) => info!(removed, "retention: expired records removed"),
            Err(error) => warn!(%error, "retention pass failed"),
        }
    });
}
