//! The HTTP receiver the contenders' http handlers call: counts calls, their
//! answers, repeated idempotency keys, the events answered (by the payload's
//! `seq`, whatever key the call carried) and the latency from each event's produce
//! time. It answers 200 after a fixed delay ([`Recv::reset`]), or models a
//! receiver that slows down with load and sheds calls past a knee
//! ([`Recv::reset_overloaded`], [`Overload`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

/// A receiver whose latency grows with the calls it holds and that refuses calls
/// past a knee: a call admitted as the n-th in flight takes `base + n × per_call`;
/// a call arriving while `knee` calls are in flight gets 503 at once, without
/// `Retry-After`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Overload {
    pub(crate) base: Duration,
    pub(crate) per_call: Duration,
    pub(crate) knee: u64,
}

impl Overload {
    /// Calls per second it completes with `n` in flight (n ≤ knee).
    pub(crate) fn throughput(&self, n: u64) -> f64 {
        n as f64 / (self.base + self.per_call * n as u32).as_secs_f64()
    }
}

#[derive(Default)]
pub(crate) struct Recv {
    delay_ms: AtomicU64,
    /// The overload model's knee; 0 = the model is off (fixed delay).
    knee: AtomicU64,
    base_us: AtomicU64,
    per_call_us: AtomicU64,
    /// Goes up with every reset: a call admitted before one does not count after it.
    generation: AtomicU64,
    pub(crate) inner: Mutex<RecvInner>,
}

#[derive(Default)]
pub(crate) struct RecvInner {
    /// [`Recv::generation`] when this was reset.
    generation: u64,
    pub(crate) calls: u64,
    /// Calls answered 2xx.
    pub(crate) ok: u64,
    /// Calls answered 503 by the overload model.
    pub(crate) unavailable: u64,
    /// Idempotency keys answered 2xx.
    keys: HashSet<String>,
    /// Calls whose key had already been answered 2xx (a second side effect).
    pub(crate) repeats: u64,
    /// Events answered 2xx: the `seq` of their payloads (one number per event of a topic).
    pub(crate) events: HashSet<u64>,
    /// 2xx calls for an event already answered 2xx that carried another key or none:
    /// a second side effect the receiver cannot recognise by its key.
    pub(crate) repeats_new_key: u64,
    /// (produce time µs, latency µs) of each 2xx.
    pub(crate) lat: Vec<(i64, i64)>,
    pub(crate) first: Option<Instant>,
    /// When a key was answered 2xx for the first time, the latest such time.
    pub(crate) last_new_ok: Option<Instant>,
    /// Overload model only: calls admitted and not yet answered (≤ knee).
    pub(crate) in_flight: u64,
    /// Overload model only: each key's first call (µs), until its first 2xx.
    first_try: HashMap<String, i64>,
    /// Overload model only: a key's first call → its first 2xx (µs): the retries' cost.
    pub(crate) retry_lat: Vec<i64>,
}

impl RecvInner {
    /// Distinct keys answered 2xx.
    pub(crate) fn keys_answered(&self) -> u64 {
        self.keys.len() as u64
    }

    /// Records a 2xx of event `seq`; `counted` = the call was already counted as a
    /// repeat on arrival.
    fn ok(&mut self, key: String, seq: Option<u64>, ts: Option<i64>, now: i64, counted: bool) {
        self.ok += 1;
        let new_event = seq.is_none_or(|s| self.events.insert(s));
        if let Some(ts) = ts {
            self.lat.push((ts, now - ts));
        }
        if !self.first_try.is_empty() {
            if let Some(t) = self.first_try.remove(&key) {
                self.retry_lat.push(now - t);
            }
        }
        if key.is_empty() {
            // No key: only the payload tells a repeat.
            if new_event {
                self.last_new_ok = Some(Instant::now());
            } else {
                self.repeats_new_key += 1;
            }
        } else if self.keys.insert(key) {
            self.last_new_ok = Some(Instant::now());
            if !new_event {
                self.repeats_new_key += 1;
            }
        } else if !counted {
            self.repeats += 1;
        }
    }
}

impl Recv {
    fn clear(&self) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *self.inner.lock().unwrap() = RecvInner { generation, ..RecvInner::default() };
    }
    /// Every call answered 200 after `delay_ms`; counters cleared.
    pub(crate) fn reset(&self, delay_ms: u64) {
        self.knee.store(0, Ordering::SeqCst);
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        self.clear();
    }
    /// Calls answered by the overload model `m`; counters cleared.
    pub(crate) fn reset_overloaded(&self, m: Overload) {
        self.clear();
        self.delay_ms.store(0, Ordering::SeqCst);
        self.base_us.store(m.base.as_micros() as u64, Ordering::SeqCst);
        self.per_call_us.store(m.per_call.as_micros() as u64, Ordering::SeqCst);
        self.knee.store(m.knee.max(1), Ordering::SeqCst);
    }
    pub(crate) fn calls(&self) -> u64 {
        self.inner.lock().unwrap().calls
    }
    /// When the first call since the last reset came.
    pub(crate) fn first_call(&self) -> Option<Instant> {
        self.inner.lock().unwrap().first
    }
    /// (distinct keys answered 2xx, calls in flight now).
    pub(crate) fn progress(&self) -> (u64, u64) {
        let i = self.inner.lock().unwrap();
        (i.keys_answered(), i.in_flight)
    }
}

pub(crate) async fn on_call(State(r): State<Arc<Recv>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let knee = r.knee.load(Ordering::Relaxed);
    if knee > 0 {
        return overloaded(r, knee, key, &body).await;
    }
    let d = r.delay_ms.load(Ordering::Relaxed);
    if d > 0 {
        tokio::time::sleep(Duration::from_millis(d)).await;
    }
    let now = now_us();
    let (ts, seq) = (find_num(&body, b"\"ts_us\":"), find_num(&body, b"\"seq\":"));
    let mut i = r.inner.lock().unwrap();
    i.calls += 1;
    i.first.get_or_insert_with(Instant::now);
    i.ok(key, seq.map(|s| s as u64), ts, now, false);
    StatusCode::OK
}

/// A call the overload model admitted. Dropped before it is answered (the client
/// closed the connection under it), it still gives its place back, unless the
/// receiver was reset since: the count of calls in flight never leaks.
struct Admitted {
    recv: Arc<Recv>,
    generation: u64,
    answered: bool,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.answered {
            let mut i = self.recv.inner.lock().unwrap();
            if i.generation == self.generation {
                i.in_flight -= 1;
            }
        }
    }
}

/// The overload model: admit up to `knee` calls, each held `base + n × per_call`
/// (n = calls in flight with it); refuse the rest at once.
async fn overloaded(r: Arc<Recv>, knee: u64, key: String, body: &[u8]) -> StatusCode {
    let arrived = now_us();
    let (n, counted, generation) = {
        let mut i = r.inner.lock().unwrap();
        i.calls += 1;
        i.first.get_or_insert_with(Instant::now);
        let counted = i.keys.contains(&key);
        if counted {
            i.repeats += 1;
        } else {
            i.first_try.entry(key.clone()).or_insert(arrived);
        }
        if i.in_flight >= knee {
            i.unavailable += 1;
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        i.in_flight += 1;
        (i.in_flight, counted, i.generation)
    };
    let mut admitted = Admitted { recv: r.clone(), generation, answered: false };
    let hold = r.base_us.load(Ordering::Relaxed) + n * r.per_call_us.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_micros(hold)).await;
    let now = now_us();
    let (ts, seq) = (find_num(body, b"\"ts_us\":"), find_num(body, b"\"seq\":"));
    let mut i = r.inner.lock().unwrap();
    admitted.answered = true;
    if i.generation == generation {
        i.in_flight -= 1;
        i.ok(key, seq.map(|s| s as u64), ts, now, counted);
    }
    StatusCode::OK
}

/// The number after `field` (e.g. `"ts_us":`) in a payload.
fn find_num(body: &[u8], field: &[u8]) -> Option<i64> {
    let at = body.windows(field.len()).position(|w| w == field)? + field.len();
    let digits: Vec<u8> = body[at..].iter().take_while(|b| b.is_ascii_digit()).copied().collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}
