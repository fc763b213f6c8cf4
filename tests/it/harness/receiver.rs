//! A real HTTP receiver for outboxd's http handler: records every call and behaves as
//! told (delay, hang, fail the first K calls), per event id or globally.
//!
//! It runs on its own Tokio runtime in its own thread, so whatever the test does on its
//! runtime (blocking Kafka look-ups, sleeps) never delays an answer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::Router;
use rand::Rng;
use serde_json::Value;

/// How a call is answered.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Wait this long before answering.
    pub delay: Duration,
    /// Plus a random extra wait in this range.
    pub random_delay: Option<RangeInclusive<Duration>>,
    /// Do not answer while this stays set (re-read every few milliseconds, so clearing
    /// it releases calls that are still waiting).
    pub hang: bool,
    /// Answer with this status for the first K calls of an event id, then 200.
    pub fail_first: Option<(u16, u32)>,
}

impl Behaviour {
    pub fn ok() -> Self {
        Self::default()
    }
    pub fn delay(d: Duration) -> Self {
        Self { delay: d, ..Self::default() }
    }
    pub fn random_delay(range: RangeInclusive<Duration>) -> Self {
        Self { random_delay: Some(range), ..Self::default() }
    }
    pub fn hang() -> Self {
        Self { hang: true, ..Self::default() }
    }
    pub fn fail_first(status: u16, calls: u32) -> Self {
        Self { fail_first: Some((status, calls)), ..Self::default() }
    }
}

/// One call the receiver got.
#[derive(Clone, Debug)]
pub struct Call {
    /// Order of arrival over all calls.
    pub seq: usize,
    /// The `Idempotency-Key` header (outboxd sets it to the event id).
    pub event_id: Option<String>,
    /// 1 for the first call with this event id, 2 for the second, ...
    pub nth: u32,
    pub method: String,
    /// The request path as sent (still percent-encoded).
    pub path: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON, or as a JSON string when it is not JSON.
    pub body: Value,
    /// When the receiver started handling the call.
    pub started: SystemTime,
    /// When the receiver finished handling it (just before answering); `None` while it
    /// is running or when the connection was dropped first.
    pub ended: Option<SystemTime>,
    pub status: Option<u16>,
}

impl Call {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
}

#[derive(Default)]
struct Inner {
    calls: Vec<Call>,
    default: Behaviour,
    per_event: HashMap<String, Behaviour>,
    counts: HashMap<String, u32>,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(s: &Shared) -> MutexGuard<'_, Inner> {
    // A panicking test thread must not hide the calls from the report.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn behaviour_for(inner: &Inner, id: Option<&str>) -> Behaviour {
    id.and_then(|id| inner.per_event.get(id)).unwrap_or(&inner.default).clone()
}

/// The HTTP receiver. Dropping it stops the server.
pub struct Receiver {
    server: Server,
    shared: Shared,
}

/// An axum app served on 127.0.0.1 (a free port) on its own runtime and thread.
/// Dropping it stops the server, not gracefully on purpose: hanging calls must not
/// keep the test alive.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(thread_name: &str, app: Router) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the receiver on 127.0.0.1");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("receiver runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    tokio::select! {
                        r = axum::serve(listener, app) => r.expect("receiver server"),
                        _ = stopped => {}
                    }
                });
                rt.shutdown_background();
            })
            .expect("spawn the receiver thread");
        Server { addr, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Receiver {
    /// Starts listening on 127.0.0.1 on a free port.
    pub fn start() -> Receiver {
        let shared: Shared = Arc::default();
        let app = Router::new().fallback(handle).with_state(shared.clone());
        Receiver { server: Server::start("receiver", app), shared }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Answer every event without its own behaviour like this.
    pub fn set_default(&self, b: Behaviour) {
        lock(&self.shared).default = b;
    }

    /// Answer calls for this event id like this.
    pub fn set_behaviour(&self, event_id: &str, b: Behaviour) {
        lock(&self.shared).per_event.insert(event_id.to_string(), b);
    }

    /// Answer calls for this event id like the default again.
    pub fn clear_behaviour(&self, event_id: &str) {
        lock(&self.shared).per_event.remove(event_id);
    }

    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared).calls.clone()
    }

    pub fn calls_for(&self, event_id: &str) -> Vec<Call> {
        lock(&self.shared).calls.iter().filter(|c| c.event_id.as_deref() == Some(event_id)).cloned().collect()
    }

    pub fn call_count(&self, event_id: &str) -> usize {
        lock(&self.shared).counts.get(event_id).copied().unwrap_or(0) as usize
    }

    /// Whether this event id got a call that was answered.
    pub fn answered(&self, event_id: &str) -> bool {
        lock(&self.shared).calls.iter().any(|c| c.event_id.as_deref() == Some(event_id) && c.ended.is_some())
    }

    /// How many of `ids` got at least one answered 2xx call.
    pub fn count_answered_ok<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> usize {
        let inner = lock(&self.shared);
        let ok: HashSet<&str> = inner
            .calls
            .iter()
            .filter(|c| c.ended.is_some() && c.status.is_some_and(|s| (200..300).contains(&s)))
            .filter_map(|c| c.event_id.as_deref())
            .collect();
        ids.into_iter().filter(|id| ok.contains(id.as_str())).count()
    }

    /// How many calls are running right now.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared).calls.iter().filter(|c| c.ended.is_none()).count()
    }
}

async fn handle(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let started = SystemTime::now();
    let event_id = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body =
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let header_map = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let (index, nth, behaviour) = {
        let mut inner = lock(&shared);
        let nth = match &event_id {
            Some(id) => {
                let n = inner.counts.entry(id.clone()).or_insert(0);
                *n += 1;
                *n
            }
            None => 1,
        };
        let index = inner.calls.len();
        inner.calls.push(Call {
            seq: index,
            event_id: event_id.clone(),
            nth,
            method: method.to_string(),
            path: uri.path().to_string(),
            headers: header_map,
            body,
            started,
            ended: None,
            status: None,
        });
        (index, nth, behaviour_for(&inner, event_id.as_deref()))
    };

    let mut wait = behaviour.delay;
    if let Some(range) = &behaviour.random_delay {
        let (lo, hi) = (range.start().as_micros() as u64, range.end().as_micros() as u64);
        wait += Duration::from_micros(rand::rng().random_range(lo..=hi));
    }
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    if behaviour.hang {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let still = behaviour_for(&lock(&shared), event_id.as_deref()).hang;
            if !still {
                break;
            }
        }
    }

    let status = match behaviour.fail_first {
        Some((status, k)) if nth <= k => status,
        _ => 200,
    };
    let mut inner = lock(&shared);
    let call = &mut inner.calls[index];
    call.ended = Some(SystemTime::now());
    call.status = Some(status);
    (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), "recorded")
}
