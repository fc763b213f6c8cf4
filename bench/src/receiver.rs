//! The HTTP receiver the contenders' http handlers call: counts calls, repeated
//! idempotency keys and the latency from each event's produce time.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

#[derive(Default)]
pub(crate) struct Recv {
    delay_ms: AtomicU64,
    pub(crate) inner: Mutex<RecvInner>,
}

#[derive(Default)]
pub(crate) struct RecvInner {
    pub(crate) calls: u64,
    keys: HashSet<String>,
    pub(crate) repeats: u64,
    /// (produce time µs, latency µs)
    pub(crate) lat: Vec<(i64, i64)>,
    first: Option<Instant>,
}

impl Recv {
    pub(crate) fn reset(&self, delay_ms: u64) {
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        *self.inner.lock().unwrap() = RecvInner::default();
    }
    pub(crate) fn calls(&self) -> u64 {
        self.inner.lock().unwrap().calls
    }
    /// When the first call since the last reset came.
    pub(crate) fn first_call(&self) -> Option<Instant> {
        self.inner.lock().unwrap().first
    }
}

pub(crate) async fn on_call(State(r): State<Arc<Recv>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let d = r.delay_ms.load(Ordering::Relaxed);
    if d > 0 {
        tokio::time::sleep(Duration::from_millis(d)).await;
    }
    let now = now_us();
    let ts = find_ts(&body);
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let mut i = r.inner.lock().unwrap();
    i.calls += 1;
    i.first.get_or_insert_with(Instant::now);
    if !i.keys.insert(key) {
        i.repeats += 1;
    }
    if let Some(ts) = ts {
        i.lat.push((ts, now - ts));
    }
    StatusCode::OK
}

fn find_ts(body: &[u8]) -> Option<i64> {
    const K: &[u8] = b"\"ts_us\":";
    let at = body.windows(K.len()).position(|w| w == K)? + K.len();
    let digits: Vec<u8> = body[at..].iter().take_while(|b| b.is_ascii_digit()).copied().collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}
