//! A circuit breaker per handler: the receiver's health, judged from failures
//! that are the receiver's (connect errors, timeouts, 408, 425, 429, 5xx:
//! [`HandlerError::Unavailable`]) and not the event's.
//!
//! - **Closed**: calls go. `failures` receiver failures in a row open it; so does
//!   one `Retry-After` (the receiver asked the whole handler to wait). Any other
//!   answer (a success, or a failure about this event) resets the count.
//! - **Open**: no call of the handler starts; events wait in their chains, in
//!   order, and the engine pauses the handler's partitions. After the open
//!   period (`probe_after`, doubled per failed probe up to `probe_max`, with
//!   jitter; or the `Retry-After`, at most `probe_max`) it is half-open.
//! - **Half-open**: one probe: the next waiting event's real call, or a `GET` of
//!   `health_url` (healthy: a 2xx; a redirect is not followed). A receiver that
//!   answers closes it (and the handler's concurrency ramps up from 1); a receiver
//!   failure opens it again.
//!
//! An attempt that fails for the receiver while the circuit is open, or that opens
//! it, is the outage's and not the event's: the executor does not charge it to the
//! event's `retry` budget, and an event that waited for the circuit starts its
//! budget afresh.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::{CircuitConfig, HandlerConfig};
use crate::handler::{HandlerError, HealthProbe};
use crate::metrics::names;

/// How often a waiting event looks again whether its partition is still owned.
const OWNERSHIP_TICK: Duration = Duration::from_millis(200);

/// The circuits of all handlers, parallel to `config.handlers`, and one signal
/// for the engine that some circuit changed state.
pub struct Circuits {
    by_handler: Vec<Arc<Circuit>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Circuits {
    pub fn new(handlers: &[HandlerConfig]) -> Circuits {
        let changed = Arc::new(watch::Sender::new(0));
        let by_handler = handlers
            .iter()
            .map(|h| {
                let mut c = Circuit::new(h, changed.clone());
                c.holds = crate::config::shares_a_topic(handlers, h);
                Arc::new(c)
            })
            .collect();
        Circuits { by_handler, changed }
    }

    /// The circuit of `handlers[index]`.
    pub fn get(&self, index: usize) -> &Arc<Circuit> {
        &self.by_handler[index]
    }

    /// Every circuit, in handler order.
    pub fn all(&self) -> &[Arc<Circuit>] {
        &self.by_handler
    }

    /// Told whenever a circuit opens or closes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Names of handlers whose circuit is not closed.
    pub fn degraded(&self) -> Vec<String> {
        self.by_handler.iter().filter(|c| c.is_open()).map(|c| c.name.clone()).collect()
    }

    /// Brings the open-seconds gauges up to now (for a `/metrics` scrape).
    pub fn refresh_metrics(&self) {
        for c in &self.by_handler {
            let open = c.view().open_seconds_total;
            metrics::gauge!(names::CIRCUIT_OPEN_SECONDS, "handler" => c.name.clone()).set(open);
        }
    }
}

/// The state of one handler's circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// What a circuit looks like now, for the admin API (`GET /v1/handlers`), the console
/// and `store stats` of a running service: behind a credential, with why the receiver
/// last failed. `/readyz` shows its summary (`CircuitSummary`), without the reason.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CircuitView {
    /// The handler's `name`.
    pub handler: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Receiver failures in a row while closed.
    pub failures: u32,
    /// Seconds since it last left `closed` (absent while closed).
    pub open_for_seconds: Option<f64>,
    /// Seconds until the next probe (while open).
    pub next_probe_in_seconds: Option<f64>,
    /// The receiver failure that last counted.
    pub last_failure: Option<String>,
    /// Seconds it has not been closed since start.
    pub open_seconds_total: f64,
    /// State changes since start.
    pub transitions: u64,
}

/// What `/readyz`, open to whoever reaches the port, shows of a circuit: its state and
/// counts, never why the receiver failed. A failure's text can name hosts, addresses
/// and what the receiver answered; it stays behind a credential
/// ([`CircuitView::last_failure`]) and in the log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CircuitSummary {
    /// The handler's `name`.
    pub handler: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Receiver failures in a row while closed.
    pub failures: u32,
    /// Seconds since it last left `closed` (absent while closed).
    pub open_for_seconds: Option<f64>,
    /// Seconds until the next probe (while open).
    pub next_probe_in_seconds: Option<f64>,
    /// Seconds it has not been closed since start.
    pub open_seconds_total: f64,
    /// State changes since start.
    pub transitions: u64,
}

impl From<CircuitView> for CircuitSummary {
    fn from(v: CircuitView) -> CircuitSummary {
        // Spelled out, so that a field added to the view is a decision here, not a leak.
        let CircuitView {
            handler,
            state,
            failures,
            open_for_seconds,
            next_probe_in_seconds,
            last_failure: _,
            open_seconds_total,
            transitions,
        } = v;
        CircuitSummary {
            handler,
            state,
            failures,
            open_for_seconds,
            next_probe_in_seconds,
            open_seconds_total,
            transitions,
        }
    }
}

/// How an attempt went, as the circuit sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The receiver answered: a success, or a failure about this event.
    Answered,
    /// The receiver failed as it would for any event.
    Down { reason: String, retry_after: Option<Duration> },
}

impl Health {
    pub fn of<T>(result: &Result<T, HandlerError>) -> Health {
        match result {
            Err(HandlerError::Unavailable { reason, retry_after }) => {
                Health::Down { reason: reason.clone(), retry_after: *retry_after }
            }
            _ => Health::Answered,
        }
    }
}

/// What waiting for the circuit came to.
pub enum Admit<'a> {
    /// Call now.
    Go(Pass<'a>),
    /// The event's partition is no longer owned: leave it to the new owner.
    Moved,
    /// Open for longer than `give_up_after`: record the event dead with this reason.
    GaveUp(String),
    /// Open for longer than `hold_after`, on a route of a topic with other routes (and
    /// the caller may hold): record the event held, waiting for its receiver, with this reason.
    Hold(String),
}

/// Leave to make one call. A probe's pass that is dropped unused (the event
/// turned out to be a duplicate, or its partition moved) lets another waiter probe.
pub struct Pass<'a> {
    circuit: &'a Circuit,
    probe: bool,
    /// The event waited for an open circuit before this call.
    waited: bool,
}

impl Pass<'_> {
    /// The event waited for an open circuit: the failures before were the outage's.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// The circuit opened since this ordinary pass was given: the call must not start.
    pub fn stale(&self) -> bool {
        !self.probe && self.circuit.is_open()
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.circuit.release_probe();
        }
    }
}

/// One handler's circuit.
pub struct Circuit {
    pub name: String,
    config: CircuitConfig,
    inner: Mutex<Inner>,
    /// Wakes the events that wait, on every state change.
    wake: Notify,
    changed: Arc<watch::Sender<u64>>,
    /// The `GET` of `health_url`, when configured: probes instead of an event's call.
    health: Option<HealthProbe>,
    /// A route of a topic with other routes: past `hold_after` its waiting events are
    /// held ([`Admit::Hold`]) and its partitions no longer pause.
    pub(super) holds: bool,
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    /// Receiver failures in a row while closed.
    failures: u32,
    /// The open period the next failed probe doubles.
    backoff: Duration,
    /// When it last left closed.
    left_closed: Option<Instant>,
    /// Time not closed, before `left_closed`.
    open_total: Duration,
    last_failure: Option<String>,
    transitions: u64,
    /// Times it closed again.
    closes: u64,
    /// When the receiver last answered a call.
    last_answer: Option<Instant>,
    /// `give_up_after` passed in this open period and the engine was told (so that
    /// it stops holding the handler's partitions paused); cleared when it closes.
    gave_up: bool,
    /// The same for `hold_after`.
    holding: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    /// `probing`: a probe call is out.
    HalfOpen {
        probing: bool,
    },
}

impl Phase {
    fn state(self) -> State {
        match self {
            Phase::Closed => State::Closed,
            Phase::Open { .. } => State::Open,
            Phase::HalfOpen { .. } => State::HalfOpen,
        }
    }
}

impl Circuit {
    fn new(h: &HandlerConfig, changed: Arc<watch::Sender<u64>>) -> Circuit {
        let timeout = match &h.spec {
            crate::config::HandlerSpec::Http(http) => http.timeout,
            crate::config::HandlerSpec::Log => Duration::from_secs(10),
            crate::config::HandlerSpec::Postgres(pg) => pg.timeout,
        };
        let health = h.circuit.health_url.as_ref().and_then(|url| match HealthProbe::new(url.expose(), timeout) {
            Ok(probe) => Some(probe),
            Err(error) => {
                warn!(handler = %h.name, %error, "circuit.health_url: no client for the probe; the next waiting event's call probes instead");
                None
            }
        });
        let c = Circuit {
            name: h.name.clone(),
            config: h.circuit.clone(),
            inner: Mutex::new(Inner {
                phase: Phase::Closed,
                failures: 0,
                backoff: h.circuit.probe_after,
                left_closed: None,
                open_total: Duration::ZERO,
                last_failure: None,
                transitions: 0,
                closes: 0,
                last_answer: None,
                gave_up: false,
                holding: false,
            }),
            wake: Notify::new(),
            changed,
            health,
            holds: false,
        };
        c.gauge(State::Closed);
        c
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether it is open or half-open: no ordinary call starts.
    pub fn is_open(&self) -> bool {
        self.lock().phase != Phase::Closed
    }

    /// Whether its handler's partitions should stay paused: open, and not yet for
    /// longer than `give_up_after`. Past that, the events it would hold back are
    /// dead-lettered as they come ([`Admit::GaveUp`]), so fetching them again lets
    /// every one of them through to that end instead of leaving later ones unread.
    pub fn pauses(&self) -> bool {
        self.is_open() && self.given_up().is_none() && self.held_up().is_none()
    }

    /// Open, and its waiting events are held now (`hold_after` passed: see [`Admit::Hold`]).
    pub fn holding(&self) -> bool {
        self.is_open() && self.held_up().is_some()
    }

    /// How often it closed again after being open: the concurrency limit ramps up anew after each.
    pub fn closes(&self) -> u64 {
        self.lock().closes
    }

    #[cfg(test)]
    pub fn state(&self) -> State {
        self.lock().phase.state()
    }

    /// What `/readyz` shows: [`Circuit::view`] without the failure's text.
    pub fn summary(&self) -> CircuitSummary {
        self.view().into()
    }

    pub fn view(&self) -> CircuitView {
        let now = Instant::now();
        let i = self.lock();
        let state = i.phase.state();
        let open_for = i.left_closed.map(|t| now.saturating_duration_since(t));
        CircuitView {
            handler: self.name.clone(),
            state: state.as_str().to_owned(),
            failures: i.failures,
            open_for_seconds: open_for.map(|d| d.as_secs_f64()),
            next_probe_in_seconds: match i.phase {
                Phase::Open { until } => Some(until.saturating_duration_since(now).as_secs_f64()),
                _ => None,
            },
            last_failure: i.last_failure.clone(),
            open_seconds_total: (i.open_total + open_for.unwrap_or_default()).as_secs_f64(),
            transitions: i.transitions,
        }
    }

    /// Waits until a call may start: at once while closed; while open, until this
    /// event may probe or another's probe closed it. `owned` is asked every
    /// [`OWNERSHIP_TICK`] while waiting.
    pub async fn admit(&self, owned: &(dyn Fn() -> bool + Send + Sync + '_), may_hold: bool) -> Admit<'_> {
        // Closed, as nearly always: no wake-up to register, no clock to read, and the
        // waiting loop's state (a few hundred bytes) boxed, off every event's future.
        if !self.config.enabled || matches!(self.lock().phase, Phase::Closed) {
            return Admit::Go(Pass { circuit: self, probe: false, waited: false });
        }
        Box::pin(self.admit_waiting(owned, may_hold)).await
    }

    /// [`Circuit::admit`] of a circuit not closed when asked.
    async fn admit_waiting(&self, owned: &(dyn Fn() -> bool + Send + Sync + '_), may_hold: bool) -> Admit<'_> {
        let mut waited = false;
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let now = Instant::now();
            let until = {
                let mut i = self.lock();
                match i.phase {
                    Phase::Closed => return Admit::Go(Pass { circuit: self, probe: false, waited }),
                    Phase::Open { until } if now >= until => {
                        self.enter(&mut i, Phase::HalfOpen { probing: true });
                        if self.health.is_none() {
                            return Admit::Go(Pass { circuit: self, probe: true, waited: true });
                        }
                        None
                    }
                    Phase::HalfOpen { probing: false } => {
                        i.phase = Phase::HalfOpen { probing: true };
                        if self.health.is_none() {
                            return Admit::Go(Pass { circuit: self, probe: true, waited: true });
                        }
                        None
                    }
                    Phase::Open { until } => Some(until),
                    Phase::HalfOpen { probing: true } => Some(now + OWNERSHIP_TICK),
                }
            };
            waited = true;
            let Some(until) = until else {
                // This event probes with `health_url`, then waits like the others.
                self.probe_health().await;
                continue;
            };
            if let Some(reason) = self.given_up() {
                return Admit::GaveUp(reason);
            }
            if let Some(reason) = self.held_up().filter(|_| may_hold) {
                return Admit::Hold(reason);
            }
            let tick = (now + OWNERSHIP_TICK).min(until);
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep_until(tick) => {}
            }
            if !owned() {
                return Admit::Moved;
            }
        }
    }

    /// `give_up_after` has passed since the circuit opened. The first time in an open
    /// period, the engine is told: it resumes the handler's partitions ([`Circuit::pauses`]).
    fn given_up(&self) -> Option<String> {
        let limit = self.config.give_up_after?;
        let (open_for, last) = self.open_past(limit, |i| &mut i.gave_up)?;
        Some(format!(
            "the receiver was unavailable for {open_for:?}, longer than circuit.give_up_after ({limit:?}); last failure: {last}"
        ))
    }

    /// `hold_after` has passed since the circuit opened, on a route of a topic with
    /// other routes. The first time in an open period, the engine is told: it resumes
    /// the topic's partitions ([`Circuit::pauses`]).
    fn held_up(&self) -> Option<String> {
        if !self.holds {
            return None;
        }
        let limit = self.config.hold_after;
        let (open_for, last) = self.open_past(limit, |i| &mut i.holding)?;
        Some(format!(
            "held: waiting for its receiver, unavailable for {open_for:.0?} (longer than circuit.hold_after, {limit:?}; \
             last failure: {last}); it runs in order once the receiver answers"
        ))
    }

    /// How long the circuit has been open and its last failure, once that is `limit`
    /// or more in this open period. The first time, `told` (the period's flag of that
    /// limit) is set and the engine is told.
    fn open_past(&self, limit: Duration, told: fn(&mut Inner) -> &mut bool) -> Option<(Duration, String)> {
        let mut i = self.lock();
        if i.phase == Phase::Closed {
            return None;
        }
        let open_for = i.left_closed?.elapsed();
        if open_for < limit {
            return None;
        }
        let flag = told(&mut i);
        if !*flag {
            *flag = true;
            self.changed.send_modify(|n| *n += 1);
        }
        Some((open_for, i.last_failure.clone().unwrap_or_else(|| "unknown".to_owned())))
    }

    async fn probe_health(&self) {
        let Some(probe) = &self.health else { return };
        let health = match probe.check().await {
            Ok(()) => Health::Answered,
            Err(why) => Health::Down { reason: format!("health_url: {why}"), retry_after: None },
        };
        self.settle(true, &health, false);
    }

    /// Records how a call made under `pass` went. `last_chance`: the event has no
    /// retry left if this failure is charged to it. Returns true when the circuit is
    /// open now: a receiver failure then is the outage's, not the event's.
    pub fn record(&self, mut pass: Pass<'_>, health: &Health, last_chance: bool) -> bool {
        let probe = std::mem::replace(&mut pass.probe, false);
        if !self.config.enabled {
            return false;
        }
        self.settle(probe, health, last_chance)
    }

    /// Closed, receiver failures open it once `failures` came in a row and the
    /// receiver has answered nothing for `probe_after`: a receiver that fails a share
    /// of calls while answering the rest is not down, however often three failures
    /// meet in a row at a high rate. Without that quiet, an event whose retries this
    /// failure would use up opens it too (a key alone in flight would otherwise go
    /// dead before the quiet is over).
    fn settle(&self, probe: bool, health: &Health, last_chance: bool) -> bool {
        let mut i = self.lock();
        if *health == Health::Answered {
            i.last_answer = Some(Instant::now());
        }
        match (health, i.phase) {
            (Health::Answered, Phase::Closed) => i.failures = 0,
            (Health::Answered, Phase::HalfOpen { .. }) if probe => self.enter(&mut i, Phase::Closed),
            // A call started before it opened: the probe decides.
            (Health::Answered, _) => {}
            (Health::Down { reason, retry_after }, phase) => {
                i.last_failure = Some(reason.clone());
                let retry_after = retry_after.map(|ra| ra.min(self.config.probe_max));
                match phase {
                    Phase::Closed => {
                        i.failures += 1;
                        if let Some(ra) = retry_after {
                            self.open(&mut i, ra, "the receiver asked to wait (Retry-After)");
                        } else if i.failures >= self.config.failures
                            && (last_chance || i.last_answer.is_none_or(|t| t.elapsed() >= self.config.probe_after))
                        {
                            i.backoff = self.config.probe_after;
                            let d = jitter(i.backoff);
                            self.open(&mut i, d, "receiver failures in a row");
                        }
                    }
                    Phase::HalfOpen { .. } if probe => {
                        i.backoff = i.backoff.saturating_mul(2).min(self.config.probe_max);
                        let d = retry_after.unwrap_or_else(|| jitter(i.backoff));
                        self.open(&mut i, d, "the probe failed");
                    }
                    Phase::Open { until } => {
                        if let Some(ra) = retry_after {
                            i.phase = Phase::Open { until: until.max(Instant::now() + ra) };
                        }
                    }
                    Phase::HalfOpen { .. } => {}
                }
            }
        }
        i.phase != Phase::Closed
    }

    fn open(&self, i: &mut Inner, d: Duration, why: &str) {
        let until = Instant::now() + d;
        let first = i.phase == Phase::Closed;
        self.enter(i, Phase::Open { until });
        let last = i.last_failure.as_deref().unwrap_or("");
        if first {
            warn!(handler = %self.name, failures = i.failures, last_failure = %last, next_probe_in = ?d,
                "circuit opened ({why}): no new call of this handler starts and its partitions pause; waiting events keep their order and their retry budget");
        } else {
            info!(handler = %self.name, last_failure = %last, next_probe_in = ?d, "circuit stays open ({why})");
        }
    }

    /// A probe pass went unused: another waiter may probe.
    fn release_probe(&self) {
        let mut i = self.lock();
        if i.phase == (Phase::HalfOpen { probing: true }) {
            i.phase = Phase::HalfOpen { probing: false };
            drop(i);
            self.wake.notify_waiters();
        }
    }

    /// Moves to `phase`: logs, counts and wakes the waiters.
    fn enter(&self, i: &mut Inner, phase: Phase) {
        let from = i.phase;
        i.phase = phase;
        let to = phase.state();
        let was_closed = from == Phase::Closed;
        if from.state() == to {
            return;
        }
        i.transitions += 1;
        match to {
            State::Closed => {
                i.gave_up = false;
                i.holding = false;
                let open_for = i.left_closed.take().map(|t| t.elapsed()).unwrap_or_default();
                i.open_total += open_for;
                i.failures = 0;
                i.backoff = self.config.probe_after;
                i.closes += 1;
                info!(handler = %self.name, ?open_for, "circuit closed: the receiver answers again; calls ramp up");
            }
            State::HalfOpen => info!(handler = %self.name, "circuit half-open: one probe call"),
            State::Open if was_closed => i.left_closed = Some(Instant::now()),
            State::Open => {}
        }
        metrics::counter!(names::CIRCUIT_TRANSITIONS, "handler" => self.name.clone(), "to" => to.as_str()).increment(1);
        self.gauge(to);
        if to == State::Closed || was_closed {
            self.changed.send_modify(|n| *n += 1);
        }
        self.wake.notify_waiters();
    }

    fn gauge(&self, now: State) {
        for s in [State::Closed, State::Open, State::HalfOpen] {
            let v = if s == now { 1.0 } else { 0.0 };
            metrics::gauge!(names::CIRCUIT, "handler" => self.name.clone(), "state" => s.as_str()).set(v);
        }
    }
}

/// Uniform in `d/2..=d`: waiters of several instances do not probe in step, and
/// the schedule stays close to what it says.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circuit(failures: u32) -> Circuit {
        with_keys(&format!("failures = {failures}"))
    }

    /// A circuit of a log handler, `[handlers.circuit]` with `keys` and short open periods.
    fn with_keys(keys: &str) -> Circuit {
        let config = crate::config::testing::parse(&format!(
            r#"
                [[handlers]]
                topics = ["t"]
                kind = "log"
                [handlers.circuit]
                {keys}
                probe_after = "50ms"
                probe_max = "200ms"
                "#
        ))
        .expect("config");
        Circuit::new(&config.handlers[0], Arc::new(watch::Sender::new(0)))
    }

    fn down() -> Health {
        Health::Down { reason: "could not connect".into(), retry_after: None }
    }

    async fn go(c: &Circuit) -> Pass<'_> {
        match c.admit(&|| true, false).await {
            Admit::Go(p) => p,
            _ => panic!("expected a pass"),
        }
    }

    #[tokio::test]
    async fn failures_in_a_row_open_it_and_an_answer_between_resets_the_count() {
        let c = circuit(3);
        assert!(!c.record(go(&c).await, &down(), false));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!c.record(go(&c).await, &Health::Answered, false));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!c.record(go(&c).await, &down(), false));
        assert!(!c.record(go(&c).await, &down(), false));
        assert!(
            c.record(go(&c).await, &down(), false),
            "the third in a row, an answer 50 ms (probe_after) ago, opens it"
        );
        assert_eq!(c.state(), State::Open);
    }

    #[tokio::test]
    async fn failures_in_a_row_between_recent_answers_do_not_open_it_unless_an_event_would_go_dead() {
        let c = circuit(3);
        assert!(!c.record(go(&c).await, &Health::Answered, false));
        for _ in 0..10 {
            assert!(!c.record(go(&c).await, &down(), false), "the receiver answered within probe_after");
        }
        assert!(c.record(go(&c).await, &down(), true), "an event's last retry opens it");
    }

    #[tokio::test]
    async fn one_probe_at_a_time_and_an_answer_closes_it() {
        let c = circuit(1);
        assert!(c.record(go(&c).await, &down(), false));
        let probe = go(&c).await;
        assert!(probe.probe && probe.waited());
        assert_eq!(c.state(), State::HalfOpen);
        // A second waiter does not get through while the probe is out.
        let second = tokio::time::timeout(Duration::from_millis(300), c.admit(&|| true, false)).await;
        assert!(second.is_err(), "only one probe while half-open");
        assert!(!c.record(probe, &Health::Answered, false));
        assert_eq!(c.state(), State::Closed);
        assert!(!go(&c).await.probe);
    }

    #[tokio::test]
    async fn a_failed_probe_opens_it_again_and_an_unused_probe_passes_on() {
        let c = circuit(1);
        c.record(go(&c).await, &down(), false);
        let probe = go(&c).await;
        assert!(c.record(probe, &down(), false));
        assert_eq!(c.state(), State::Open);
        let unused = go(&c).await;
        assert!(unused.probe);
        drop(unused);
        let next = go(&c).await;
        assert!(next.probe, "the dropped probe's turn goes to the next waiter");
    }

    #[tokio::test]
    async fn a_retry_after_opens_it_at_once_for_that_long_at_most_probe_max() {
        let c = circuit(3);
        let h = Health::Down { reason: "http 429".into(), retry_after: Some(Duration::from_secs(3600)) };
        assert!(c.record(go(&c).await, &h, false));
        let v = c.view();
        assert_eq!(v.state, "open");
        assert!(v.next_probe_in_seconds.unwrap() <= 0.2, "capped at probe_max: {v:?}");
    }

    #[tokio::test]
    async fn the_open_summary_says_it_is_open_but_not_why() {
        let c = circuit(1);
        let why = Health::Down { reason: "could not connect: 10.1.2.3:8443 refused".into(), retry_after: None };
        assert!(c.record(go(&c).await, &why, false));
        let summary = serde_json::to_value(c.summary()).unwrap();
        assert_eq!(summary["state"], "open");
        assert_eq!(summary["handler"], "t");
        let text = summary.to_string();
        assert!(!text.contains("10.1.2.3") && !text.contains("last_failure"), "{text}");
        assert!(c.view().last_failure.is_some_and(|f| f.contains("10.1.2.3")), "behind a credential, it is there");
    }

    /// A receiver whose `/health` redirects to `/ok`, which answers 200; its address.
    async fn redirecting_receiver() -> std::net::SocketAddr {
        use axum::response::Redirect;
        use axum::routing::get;
        let app = axum::Router::new()
            .route("/health", get(|| async { Redirect::temporary("/ok") }))
            .route("/ok", get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    #[tokio::test]
    async fn a_health_url_that_redirects_is_not_healthy_and_is_not_followed() {
        let addr = redirecting_receiver().await;
        let c = with_keys(&format!("failures = 1\nhealth_url = \"http://{addr}/health\""));
        assert!(c.record(go(&c).await, &down(), false));
        // The probe's answer is a 307: the circuit stays open, and the waiter with it.
        // Waits for the probe's outcome itself, however long the machine takes to get there.
        let admit = c.admit(&|| true, false);
        tokio::pin!(admit);
        let probed = async {
            while c.view().last_failure.as_deref() != Some("health_url: http 307") {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let settled = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::select! {
                _ = &mut admit => panic!("a redirect closed the circuit: it was followed to /ok"),
                () = probed => {}
            }
        });
        settled.await.expect("the probe of health_url was never answered");
        assert_eq!(c.state(), State::Open);

        // The same receiver's 200, probed directly, closes it.
        let c = with_keys(&format!("failures = 1\nhealth_url = \"http://{addr}/ok\""));
        assert!(c.record(go(&c).await, &down(), false));
        let pass = tokio::time::timeout(Duration::from_secs(5), go(&c)).await.expect("a 200 closes it");
        assert!(!pass.probe);
        assert_eq!(c.state(), State::Closed);
    }

    #[tokio::test]
    async fn a_waiter_whose_partition_moved_is_let_go() {
        let c = circuit(1);
        c.record(go(&c).await, &down(), false);
        let _probe = go(&c).await;
        assert!(matches!(c.admit(&|| false, false).await, Admit::Moved));
    }

    #[tokio::test]
    async fn past_hold_after_a_route_of_a_shared_topic_holds_its_waiters_and_stops_pausing() {
        let mut c = with_keys("failures = 1\nhold_after = \"100ms\"");
        c.holds = true;
        c.record(go(&c).await, &down(), false);
        let _probe = go(&c).await;
        assert!(c.pauses(), "open, not yet for hold_after");
        match c.admit(&|| true, true).await {
            Admit::Hold(reason) => assert!(reason.contains("circuit.hold_after"), "{reason}"),
            _ => panic!("a waiter that may hold is told to, once hold_after has passed"),
        }
        assert!(!c.pauses() && c.holding(), "its partitions go on");
        // The releaser's run of a held event (may not hold) waits for the receiver instead.
        let waits = tokio::time::timeout(Duration::from_millis(300), c.admit(&|| true, false)).await;
        assert!(waits.is_err(), "it waits while the probe is out");
        // A handler alone on its topic never holds: it pauses as before.
        let alone = with_keys("failures = 1\nhold_after = \"100ms\"");
        alone.record(go(&alone).await, &down(), false);
        let _probe = go(&alone).await;
        let waits = tokio::time::timeout(Duration::from_millis(300), alone.admit(&|| true, true)).await;
        assert!(waits.is_err() && alone.pauses(), "alone on its topic it waits with its partitions paused");
    }
}
