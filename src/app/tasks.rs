//! The app's background tasks: each runs until its `stop` token is cancelled,
//! so that shutdown can wait for all of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::engine::Executor;
use crate::kafka::Tracker;
use crate::metrics::names;
use crate::store::{now_us, Store};

/// How often the store gauges are refreshed (kept counts and file sizes: no scan).
const STORE_GAUGES_INTERVAL: Duration = Duration::from_secs(10);

/// How often partitions are checked for stalls.
const STALL_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// How often histogram samples are folded into their buckets.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Keeps the store gauges current.
pub async fn store_gauges(store: Arc<Store>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(STORE_GAUGES_INTERVAL);
    while ticked(&mut tick, &stop).await {
        for (state, n) in store.reads().counts() {
            metrics::gauge!(names::RECORDS, "state" => state.as_str()).set(n as f64);
        }
        metrics::gauge!(names::COPY_BYTES).set(store.reads().message_bytes() as f64);
        metrics::gauge!(names::KEYS_HELD).set(store.holds().held_keys() as f64);
        metrics::gauge!(names::FILTER_BYTES).set(store.reads().filter_bytes() as f64);
        metrics::gauge!(names::PACKED_RUNS).set(store.reads().packed_runs() as f64);
        if let Ok(bytes) = store.reads().bytes_on_disk() {
            metrics::gauge!(names::STORE_BYTES).set(bytes as f64);
        }
    }
}

/// Keeps the stalled-partitions gauge current and says in the log when a
/// partition starts or stops being stalled (`/readyz` computes it on demand).
pub async fn stall_watch(tracker: Tracker, bound: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(STALL_WATCH_INTERVAL);
    let mut reported = Vec::new();
    while ticked(&mut tick, &stop).await {
        let stalled = tracker.lock().stalled(Instant::now(), bound);
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
}

/// The recorder keeps every histogram sample until it is folded in, which
/// otherwise happens only when /metrics is scraped: without a scraper (or
/// without the admin server) memory would grow with every event.
pub async fn metrics_upkeep(handle: PrometheusHandle, stop: CancellationToken) {
    let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
    while ticked(&mut tick, &stop).await {
        handle.run_upkeep();
    }
}

/// Removes expired records every `store.gc_interval` (a pass that has begun finishes).
pub async fn retention(store: Arc<Store>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    while ticked(&mut tick, &stop).await {
        match store.repairs().gc(now_us()).await {
            Ok(0) => {}
            Ok(removed) => info!(removed, "retention: expired records removed"),
            Err(error) => warn!(%error, "retention pass failed"),
        }
    }
}

/// Packs the current slice's records in memory each time they are many enough
/// (store/disk/journal.rs), between the gc passes.
pub async fn packing(store: Arc<Store>, stop: CancellationToken) {
    let repairs = store.repairs();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = repairs.memory_full() => {}
        }
        if let Err(error) = repairs.pack(now_us()).await {
            warn!(%error, "packing the records in memory failed; the next gc pass tries again");
        }
    }
}

/// Each handler's summary line every `log.summary_interval`, and a last one (what
/// the drain finished) once stopped.
pub async fn log_summary(exec: Arc<Executor>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    while ticked(&mut tick, &stop).await {
        exec.log_summary();
    }
    exec.log_summary();
}

/// Waits for the next tick (the first is at once): false once `stop` is cancelled.
async fn ticked(tick: &mut tokio::time::Interval, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        _ = tick.tick() => true,
    }
}
