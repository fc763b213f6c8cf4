//! A real HTTP receiver for outboxd's http handler: records every call, with what it
//! did with it, and answers as told: by a [`Behaviour`] (delay, hang, fail the first K
//! calls) per event id or for all, or by a script (a closure that decides status,
//! `Retry-After`, delay and hold of each call).
//!
//! It runs on its own Tokio runtime in its own thread, so whatever the test does on its
//! runtime (blocking Kafka look-ups, sleeps) never delays an answer. The record lives in
//! the memory of the test process. outboxd runs as a child process that the tests
//! SIGKILL, and the broker is another process; neither can take the test process down
//! with it, so an in-memory record survives every fault injected here. A file with fsync
//! would only add something if the test process itself could crash mid-test, and then
//! the test fails anyway.
//!
//! Side-effect model: the receiver decides a call's status when the call arrives. A
//! call decided 2xx has *performed* its side effect at that moment, even if its answer
//! is later lost (outboxd killed or timed out while the call was held). That is what
//! makes a lost answer an unknown outcome, and it is what the duplicate counts of the
//! fault tests count.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use rand::Rng;
use serde_json::Value;

/// Bodies up to this size are kept (parsed as JSON when they are JSON).
const KEEP_BODY_UP_TO: usize = 64 * 1024;
/// A held call is released after this long whatever happens (no test waits longer).
const MAX_HOLD: Duration = Duration::from_secs(600);
/// How often a held call looks whether it may go.
const HOLD_POLL: Duration = Duration::from_millis(10);

/// How a call is answered when no script is set.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Wait this long before answering.
    pub delay: Duration,
    /// Plus a random extra wait in this range.
    pub random_delay: Option<RangeInclusive<Duration>>,
    /// Do not answer while this behaviour stays in place (replacing or clearing it
    /// releases calls that are still waiting).
    pub hang: bool,
    /// Answer with this status for the first K calls of an event id, then 200.
    pub fail_first: Option<(u16, u32)>,
}

impl Behaviour {
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

/// A behaviour in place, with the flag that holds its hanging calls while it stays.
struct Placed {
    behaviour: Behaviour,
    hold: Arc<AtomicBool>,
}

impl Placed {
    fn new(behaviour: Behaviour) -> Placed {
        let hold = Arc::new(AtomicBool::new(behaviour.hang));
        Placed { behaviour, hold }
    }

    fn reply(&self, req: &Req) -> Reply {
        let b = &self.behaviour;
        let status = match b.fail_first {
            Some((status, k)) if req.nth <= k => status,
            _ => 200,
        };
        let mut delay = b.delay;
        if let Some(range) = &b.random_delay {
            let (lo, hi) = (range.start().as_micros() as u64, range.end().as_micros() as u64);
            delay += Duration::from_micros(rand::rng().random_range(lo..=hi));
        }
        let mut reply = Reply::status(status).delay(delay);
        if b.hang {
            reply = reply.hold(&self.hold);
        }
        reply
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.hold.store(false, Ordering::SeqCst);
    }
}

/// The behaviours in place: one per event id, and a default.
#[derive(Default)]
struct Behaviours {
    default: Option<Placed>,
    per_event: HashMap<String, Placed>,
}

/// What the script sees of a call.
#[derive(Clone, Debug)]
pub struct Req {
    /// `Idempotency-Key`, else the last path segment (decoded).
    pub event_id: Option<String>,
    /// 1 for the first call with this event id on this kind of path, 2 for the next...
    pub nth: u32,
    /// `events` or `lookup`: the first path segment.
    pub kind: String,
    /// The `X-Outboxd-Instance` header the tests configure per outboxd instance.
    pub instance: Option<String>,
}
/// How to answer.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<String>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Do not answer while this is set.
    pub hold: Option<Arc<AtomicBool>>,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply { status, retry_after: None, delay: Duration::ZERO, hold: None }
    }
    pub fn ok() -> Reply {
        Reply::status(200)
    }
    pub fn retry_after(mut self, value: &str) -> Reply {
        self.retry_after = Some(value.to_string());
        self
    }
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
    pub fn hold(mut self, flag: &Arc<AtomicBool>) -> Reply {
        self.hold = Some(flag.clone());
        self
    }
}

pub type Script = Arc<dyn Fn(&Req) -> Reply + Send + Sync>;

/// One call the receiver got.
#[derive(Clone, Debug)]
pub struct Call {
    pub seq: usize,
    pub event_id: Option<String>,
    pub kind: String,
    pub nth: u32,
    pub method: String,
    pub path: String,
    /// Lower-case names.
    pub headers: BTreeMap<String, String>,
    pub body_len: usize,
    /// The body as JSON (or a JSON string when it is not JSON); `null` for bodies over
    /// 64 KiB (see `body_len` and `body_hash`).
    pub body: Value,
    /// A hash of the whole body, to compare bodies without keeping them.
    pub body_hash: u64,
    /// The body's bytes as they came, up to 64 KiB (empty past that): what a
    /// signature was made over.
    pub raw: Vec<u8>,
    pub started: SystemTime,
    pub started_at: Instant,
    /// The status the script chose when the call arrived (the side effect happened
    /// when it is 2xx).
    pub status: u16,
    /// How long the script told the receiver to wait before answering.
    pub delay: Duration,
    /// When the answer was handed to the server; `None` if it never was.
    pub answered: Option<SystemTime>,
    /// When the call ended without an answer (the client went away).
    pub dropped: Option<SystemTime>,
}

impl Call {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
    pub fn is_handler_call(&self) -> bool {
        self.kind == "events"
    }
    /// The side effect happened (the script chose 2xx).
    pub fn effective(&self) -> bool {
        (200..300).contains(&self.status)
    }
    pub fn in_flight(&self) -> bool {
        self.answered.is_none() && self.dropped.is_none()
    }
    /// The `X-Outboxd-Instance` header the tests configure per outboxd instance.
    pub fn instance(&self) -> Option<&str> {
        self.header("x-outboxd-instance")
    }
}

struct Inner {
    calls: Vec<Call>,
    /// Event ids with a handler call answered 2xx.
    ok: HashSet<String>,
    counts: HashMap<(String, String), u32>,
    script: Script,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(s: &Shared) -> MutexGuard<'_, Inner> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The receiver; dropping it stops the server (held calls are abandoned).
pub struct Receiver {
    /// `None` while it is away ([`Receiver::go_away`]).
    server: Option<Server>,
    addr: SocketAddr,
    app: Router,
    shared: Shared,
    /// What the default script answers by (a script set with [`Receiver::set_script`]
    /// replaces it).
    behaviours: Arc<Mutex<Behaviours>>,
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
        Server::start_on(thread_name, app, "127.0.0.1:0".parse().expect("an address"))
    }

    /// Listens on `addr` (with SO_REUSEADDR, so a receiver that went away can come
    /// back on its port at once).
    pub fn start_on(thread_name: &str, app: Router, addr: SocketAddr) -> Server {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound, bound_rx) = std::sync::mpsc::channel::<SocketAddr>();
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("receiver runtime");
                rt.block_on(async move {
                    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
                    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
                    socket.bind(addr).unwrap_or_else(|e| panic!("bind the receiver on {addr}: {e}"));
                    let listener = socket.listen(1024).expect("listen");
                    bound.send(listener.local_addr().expect("local addr")).expect("the starter waits");
                    tokio::select! {
                        r = axum::serve(listener, app) => r.expect("receiver server"),
                        _ = stopped => {}
                    }
                });
                rt.shutdown_background();
            })
            .expect("spawn the receiver thread");
        let addr = bound_rx.recv().expect("the receiver thread binds or panics");
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
    /// Listens on 127.0.0.1 (free port) on its own runtime and thread; answers 200 until
    /// told otherwise.
    pub fn start() -> Receiver {
        let behaviours: Arc<Mutex<Behaviours>> = Arc::default();
        let placed = behaviours.clone();
        let by_behaviour = move |req: &Req| {
            let b = placed.lock().unwrap_or_else(|e| e.into_inner());
            match req.event_id.as_deref().and_then(|id| b.per_event.get(id)).or(b.default.as_ref()) {
                Some(p) => p.reply(req),
                None => Reply::ok(),
            }
        };
        let shared: Shared = Arc::new(Mutex::new(Inner {
            calls: Vec::new(),
            ok: HashSet::new(),
            counts: HashMap::new(),
            script: Arc::new(by_behaviour),
        }));
        let app = Router::new().fallback(handle).layer(DefaultBodyLimit::disable()).with_state(shared.clone());
        let server = Server::start("receiver", app.clone());
        Receiver { addr: server.addr, server: Some(server), app, shared, behaviours }
    }

    /// Stops listening: calls are refused (connection refused) until [`Receiver::come_back`].
    /// Calls in flight are cut.
    pub fn go_away(&mut self) {
        self.server = None;
    }

    /// Listens again on the same port, with the same behaviours and the calls seen so far.
    pub fn come_back(&mut self) {
        assert!(self.server.is_none(), "the receiver is not away");
        self.server = Some(Server::start_on("receiver", self.app.clone(), self.addr));
    }

    fn behaviours(&self) -> MutexGuard<'_, Behaviours> {
        self.behaviours.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answer every event without its own behaviour like this.
    pub fn set_default(&self, b: Behaviour) {
        self.behaviours().default = Some(Placed::new(b));
    }

    /// Answer calls for this event id like this.
    pub fn set_behaviour(&self, event_id: &str, b: Behaviour) {
        self.behaviours().per_event.insert(event_id.to_string(), Placed::new(b));
    }

    /// Answer calls for this event id like the default again.
    pub fn clear_behaviour(&self, event_id: &str) {
        self.behaviours().per_event.remove(event_id);
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The handler URL template the tests configure: `/events/{aggregate_id}/{event_id}`.
    pub fn events_url(&self) -> String {
        format!("{}/events/{{aggregate_id}}/{{event_id}}", self.base_url())
    }

    /// The verify URL template: `/lookup/{event_id}`.
    pub fn lookup_url(&self) -> String {
        format!("{}/lookup/{{event_id}}", self.base_url())
    }

    /// Answer every call as `f` says (instead of by behaviours).
    pub fn set_script(&self, f: impl Fn(&Req) -> Reply + Send + Sync + 'static) {
        lock(&self.shared).script = Arc::new(f);
    }

    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared).calls.clone()
    }

    /// Calls (any path) for this event id, in arrival order.
    pub fn calls_for(&self, event_id: &str) -> Vec<Call> {
        lock(&self.shared).calls.iter().filter(|c| c.event_id.as_deref() == Some(event_id)).cloned().collect()
    }

    /// How many calls (any path) this event id got.
    pub fn call_count(&self, event_id: &str) -> usize {
        lock(&self.shared).calls.iter().filter(|c| c.event_id.as_deref() == Some(event_id)).count()
    }

    /// Whether this event id got a call that was answered (any status).
    pub fn answered(&self, event_id: &str) -> bool {
        lock(&self.shared).calls.iter().any(|c| c.event_id.as_deref() == Some(event_id) && c.answered.is_some())
    }

    /// How many of `ids` got at least one call answered 2xx.
    pub fn count_answered_ok<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> usize {
        let inner = lock(&self.shared);
        let ok: HashSet<&str> = inner
            .calls
            .iter()
            .filter(|c| c.answered.is_some() && c.effective())
            .filter_map(|c| c.event_id.as_deref())
            .collect();
        ids.into_iter().filter(|id| ok.contains(id.as_str())).count()
    }

    /// Handler calls (`/events/...`) for this event id, in arrival order.
    pub fn handler_calls(&self, event_id: &str) -> Vec<Call> {
        lock(&self.shared)
            .calls
            .iter()
            .filter(|c| c.is_handler_call() && c.event_id.as_deref() == Some(event_id))
            .cloned()
            .collect()
    }

    /// `verify` lookups (`/lookup/...`) for this event id.
    pub fn lookups(&self, event_id: &str) -> Vec<Call> {
        lock(&self.shared)
            .calls
            .iter()
            .filter(|c| c.kind == "lookup" && c.event_id.as_deref() == Some(event_id))
            .cloned()
            .collect()
    }

    pub fn handler_call_count(&self, event_id: &str) -> usize {
        lock(&self.shared).counts.get(&("events".to_string(), event_id.to_string())).copied().unwrap_or(0) as usize
    }

    /// Whether a handler call for the event was answered 2xx.
    pub fn answered_ok(&self, event_id: &str) -> bool {
        lock(&self.shared).calls.iter().any(|c| {
            c.is_handler_call() && c.event_id.as_deref() == Some(event_id) && c.effective() && c.answered.is_some()
        })
    }

    /// Handler calls that have neither been answered nor dropped.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared).calls.iter().filter(|c| c.is_handler_call() && c.in_flight()).count()
    }

    /// Handler calls that carried `X-Outboxd-Instance: instance`.
    pub fn calls_from(&self, instance: &str) -> usize {
        lock(&self.shared).calls.iter().filter(|c| c.is_handler_call() && c.instance() == Some(instance)).count()
    }

    /// Handler calls from `instance` (`X-Outboxd-Instance`) neither answered nor dropped.
    pub fn in_flight_from(&self, instance: &str) -> usize {
        lock(&self.shared)
            .calls
            .iter()
            .filter(|c| c.is_handler_call() && c.instance() == Some(instance))
            .filter(|c| c.in_flight())
            .count()
    }

    /// How many distinct events got a handler call answered 2xx.
    pub fn ok_count(&self) -> usize {
        lock(&self.shared).ok.len()
    }
}

/// Marks the call dropped when the server drops the handler (client went away).
struct Pending {
    shared: Shared,
    index: usize,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            lock(&self.shared).calls[self.index].dropped = Some(SystemTime::now());
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(State(shared): State<Shared>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let started = SystemTime::now();
    let started_at = Instant::now();
    let path = uri.path().to_string();
    let kind = path.trim_start_matches('/').split('/').next().unwrap_or("").to_string();
    let event_id = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| path.rsplit('/').next().filter(|s| !s.is_empty()).map(percent_decode));
    let header_map: BTreeMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let kept = if body.len() <= KEEP_BODY_UP_TO {
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    } else {
        Value::Null
    };
    let (index, reply) = {
        let mut inner = lock(&shared);
        let nth = match &event_id {
            Some(id) => {
                let n = inner.counts.entry((kind.clone(), id.clone())).or_insert(0);
                *n += 1;
                *n
            }
            None => 1,
        };
        let instance = header_map.get("x-outboxd-instance").cloned();
        let req = Req { event_id: event_id.clone(), nth, kind: kind.clone(), instance };
        let script = inner.script.clone();
        // The script is cheap and never blocks; calling it under the lock keeps
        // decisions and records in one order.
        let reply = script(&req);
        let index = inner.calls.len();
        inner.calls.push(Call {
            seq: index,
            event_id,
            kind,
            nth,
            method: method.to_string(),
            path,
            headers: header_map,
            body_len: body.len(),
            body: kept,
            body_hash: fnv(&body),
            raw: if body.len() <= KEEP_BODY_UP_TO { body.to_vec() } else { Vec::new() },
            started,
            started_at,
            status: reply.status,
            delay: reply.delay,
            answered: None,
            dropped: None,
        });
        (index, reply)
    };
    let mut pending = Pending { shared: shared.clone(), index, answered: false };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    if let Some(flag) = &reply.hold {
        // Released, or held for MAX_HOLD: the call is answered either way. (Not one of
        // the harness's waits: their async closures make futures the compiler cannot
        // yet prove Send, and a handler's future must be.)
        let released = async {
            while flag.load(Ordering::SeqCst) {
                tokio::time::sleep(HOLD_POLL).await;
            }
        };
        let _ = tokio::time::timeout(MAX_HOLD, released).await;
    }
    {
        let mut inner = lock(&shared);
        let call = &mut inner.calls[index];
        call.answered = Some(SystemTime::now());
        let done = (call.is_handler_call() && call.effective()).then(|| call.event_id.clone()).flatten();
        if let Some(id) = done {
            inner.ok.insert(id);
        }
    }
    pending.answered = true;
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, "scripted").into_response();
    if let Some(ra) = reply.retry_after.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
        response.headers_mut().insert("retry-after", ra);
    }
    response
}
