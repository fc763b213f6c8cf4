//! Whether the brokers can be reached, as the Kafka clients see it, and what the log
//! says about it. librdkafka reports a broker that is away from every client at every
//! reconnect (each 100 ms at first, backing off to 10 s), as log lines and as error
//! events: logged as they came, that was tens of lines a second. Every client's context
//! hands them here instead ([`BrokerHealth::log`], [`BrokerHealth::error`]), so the log
//! says it once, however many clients see the outage:
//!
//! - one warning when the brokers become unreachable: which brokers, what librdkafka said;
//! - while they stay so, a summary every `kafka.outage_summary_interval` with the errors since;
//! - one line when they are back: how long they were away, how many errors were suppressed.
//!
//! librdkafka's own lines about each failed connection stay at debug level.
//! `/readyz` (`broker`, `broker_state`) and `outboxd_broker_reachable` read the same state.
//!
//! The consumer decides: its connections (group coordinator, partition leaders) are
//! always in use, so its "all brokers are down" means what it says. A producer that sat
//! idle may find its only connection closed by the broker and report the same, while
//! the consumer gets through: such errors of the other clients are counted and summarized
//! while the brokers are reachable, but make them unreachable only while nothing has been
//! reached yet (start-up, before the consumer exists).
//!
//! There is one aggregator per broker list in the process ([`BrokerHealth::of`]): every
//! client is built in this module's parent from a `KafkaConfig`, so each finds the shared
//! one by it, without a handle passed through the engine, `ops` and `app`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, error, info, warn};

use crate::config::KafkaConfig;
use crate::metrics::names;

/// librdkafka's log facilities of a connection that failed or timed out. An error
/// event comes with each (that is what is counted), so the line itself is debug.
const CONNECTION_FACILITIES: [&str; 2] = ["FAIL", "REQTMOUT"];

/// A connection error this recent is what an "all brokers are down" right after it is about.
const QUOTE_WITHIN: Duration = Duration::from_secs(5);

/// How often a thread serving a client's events during a blocking request polls them.
const SERVE_EVERY: Duration = Duration::from_millis(100);

/// Where the brokers stand, as far as the clients have shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reachability {
    /// Not reached yet since start, and no sign yet that none can be.
    Connecting,
    /// A client got through (the consumer's statistics show a broker connection up, an
    /// assignment came, a start-up request was answered).
    Reachable,
    /// librdkafka said that no broker can be reached (or a start-up request got no answer).
    Unreachable,
}

impl Reachability {
    /// As `/readyz` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reachability::Connecting => "connecting",
            Reachability::Reachable => "reachable",
            Reachability::Unreachable => "unreachable",
        }
    }
}

/// The brokers' state for `/readyz`.
#[derive(Clone, Copy, Debug)]
pub struct BrokerStatus {
    /// Where they stand.
    pub state: Reachability,
    /// When they got there (wall clock).
    pub since: SystemTime,
    /// Connection errors librdkafka reported since then (while unreachable: since the warning).
    pub errors: u64,
}

/// One aggregator of the brokers' reachability, shared by every client of one broker list.
pub struct BrokerHealth {
    /// `kafka.brokers`, as every line names them.
    brokers: String,
    /// The state and what the log has said of it; the lines are written after the lock is released.
    reach: Mutex<Reach>,
}

impl BrokerHealth {
    /// The aggregator of `kafka.brokers` in this process, made on first use; takes
    /// `kafka.outage_summary_interval` from `kafka`.
    pub fn of(kafka: &KafkaConfig) -> Arc<BrokerHealth> {
        static ALL: OnceLock<Mutex<HashMap<String, Arc<BrokerHealth>>>> = OnceLock::new();
        let health = ALL
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(kafka.brokers.clone())
            .or_insert_with(|| Arc::new(BrokerHealth::new(&kafka.brokers, kafka.outage_summary_interval)))
            .clone();
        let state = {
            let mut reach = health.lock();
            reach.interval = kafka.outage_summary_interval;
            reach.state
        };
        // Also after a recorder was installed since the last change: the gauge is there from the start.
        gauge(state);
        health
    }

    /// A new aggregator, not shared ([`BrokerHealth::of`] shares one per broker list).
    pub(super) fn new(brokers: &str, interval: Duration) -> BrokerHealth {
        BrokerHealth {
            brokers: brokers.to_owned(),
            reach: Mutex::new(Reach::new(Instant::now(), SystemTime::now(), interval)),
        }
    }

    /// Where the brokers stand now.
    pub fn status(&self) -> BrokerStatus {
        let reach = self.lock();
        BrokerStatus { state: reach.state, since: reach.since_wall, errors: reach.errors }
    }

    /// Whether they are reachable (readiness).
    pub fn reachable(&self) -> bool {
        self.lock().state == Reachability::Reachable
    }

    /// A client got through to the brokers.
    pub fn reached(&self) {
        let line = self.lock().reached(Instant::now(), SystemTime::now());
        self.write(line);
    }

    /// Time passed: a summary is due every `kafka.outage_summary_interval` (called with
    /// the consumer's statistics, every 2 s, and with every error).
    pub fn tick(&self) {
        let line = self.lock().tick(Instant::now());
        self.write(line);
    }

    /// A librdkafka log line of `client`, as a tracing event (target `librdkafka`) at its
    /// own level; a line about a failed connection at debug level (its error event is
    /// counted and summarized instead, and the warning quotes the line: a connection
    /// the broker closed comes with nothing better than "1/1 brokers are down").
    pub fn log(&self, client: &'static str, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if CONNECTION_FACILITIES.contains(&fac) {
            debug!(target: "librdkafka", client, "librdkafka: {fac} {message}");
            self.lock().noted(Instant::now(), client, message);
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                error!(target: "librdkafka", client, "librdkafka: {fac} {message}");
            }
            RDKafkaLogLevel::Warning => warn!(target: "librdkafka", client, "librdkafka: {fac} {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", client, "librdkafka: {fac} {message}");
            }
            RDKafkaLogLevel::Debug => debug!(target: "librdkafka", client, "librdkafka: {fac} {message}"),
        }
    }

    /// An error event of `client`. A connection error ([`is_connection_error`]) is a debug
    /// line, counted (`outboxd_broker_connection_errors_total`) and folded into the
    /// lines above; `decides` says whether the client's "all brokers are down" makes
    /// them unreachable (the consumer; see the module's doc). Any other error is logged
    /// as it comes.
    pub fn error(&self, client: &'static str, decides: bool, error: &ClientError, reason: &str) {
        let Some(code) = error.rdkafka_error_code().filter(|c| is_connection_error(*c)) else {
            error!(target: "librdkafka", client, %error, reason, "Kafka client error");
            return;
        };
        debug!(target: "librdkafka", client, "librdkafka: {error}: {reason}");
        metrics::counter!(names::BROKER_CONNECTION_ERRORS, "client" => client).increment(1);
        let all_down = code == RDKafkaErrorCode::AllBrokersDown;
        let text = if reason.is_empty() { error.to_string() } else { reason.to_owned() };
        let line = self.lock().failed(Instant::now(), SystemTime::now(), client, all_down, decides, text);
        self.write(line);
    }

    /// A request that waits for the brokers failed (the start-up's topic list): when
    /// it is for want of a connection, the brokers count as unreachable.
    pub fn request_failed(&self, client: &'static str, error: &ClientError) {
        if error.rdkafka_error_code().is_some_and(is_connection_error) {
            metrics::counter!(names::BROKER_CONNECTION_ERRORS, "client" => client).increment(1);
            let line = self.lock().failed(Instant::now(), SystemTime::now(), client, true, true, error.to_string());
            self.write(line);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reach> {
        // The state is a few counters, consistent after every call: a panic elsewhere leaves it usable.
        self.reach.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what the state asked for (outside the lock).
    fn write(&self, line: Option<Line>) {
        let Some(line) = line else { return };
        let brokers = self.brokers.as_str();
        match line {
            Line::Unreachable { client, error, every } => {
                gauge(Reachability::Unreachable);
                warn!(brokers, client, %error, summary_every = %humantime::format_duration(every),
                    "Kafka brokers unreachable; librdkafka keeps trying, and its errors are summarized until they answer");
            }
            Line::StillUnreachable { away, errors, error } => {
                warn!(brokers, away = %shown(away), errors, last_error = error.as_deref().unwrap_or("none since"),
                    "Kafka brokers still unreachable");
            }
            Line::Back { away, suppressed } => {
                gauge(Reachability::Reachable);
                info!(brokers, away = %shown(away), errors_suppressed = suppressed, "Kafka brokers reachable again");
            }
            Line::Connected { after } => {
                gauge(Reachability::Reachable);
                info!(brokers, after = %shown(after), "connected to the Kafka brokers");
            }
            Line::StillConnecting { waiting, errors, error } => {
                warn!(brokers, waiting = %shown(waiting), errors, error = error.as_deref().unwrap_or("none yet"),
                    "still waiting for the Kafka brokers");
            }
            Line::ClientErrors { client, errors, error } => {
                warn!(brokers, client, errors, %error,
                    "a Kafka client could not reach a broker (the consumer reaches the brokers)");
            }
        }
    }
}

/// Whether librdkafka's error says that a broker could not be reached: the connection
/// failed, was refused or cut, timed out, the name did not resolve, TLS or SASL failed,
/// or none of the brokers is up.
pub fn is_connection_error(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::Resolve
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::Authentication
    )
}

fn gauge(state: Reachability) {
    metrics::gauge!(names::BROKER_REACHABLE).set(if state == Reachability::Reachable { 1.0 } else { 0.0 });
}

/// A duration as a person reads it in a line: whole seconds, milliseconds below one.
fn shown(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64)
    })
}

/// The context of every client but the consumer (which has its own and calls the
/// same aggregator): its log lines and errors go to the brokers' [`BrokerHealth`].
pub(super) struct ClientCtx {
    /// Names the client in lines and the errors metric (`changelog`, `dead_letters`, ...).
    client: &'static str,
    health: Arc<BrokerHealth>,
}

impl ClientCtx {
    pub(super) fn new(kafka: &KafkaConfig, client: &'static str) -> ClientCtx {
        ClientCtx { client, health: BrokerHealth::of(kafka) }
    }

    pub(super) fn health(&self) -> &Arc<BrokerHealth> {
        &self.health
    }
}

impl ClientContext for ClientCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.health.log(self.client, level, fac, log_message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        self.health.error(self.client, false, &error, reason);
    }
}

impl ConsumerContext for ClientCtx {}

/// Runs `request`, a blocking call on `client` that serves none of its events (a
/// metadata request), while a second thread serves them: a client without a group
/// gets its log lines and errors only when polled, so a broker that refuses the
/// connection is reported while the request still waits, not never.
pub(super) fn serving_events<T>(client: &BaseConsumer<ClientCtx>, request: impl FnOnce() -> T) -> T {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                // Only events arrive here (the client consumes nothing): their callbacks ran.
                let _ = client.poll(SERVE_EVERY);
            }
        });
        let answer = request();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        answer
    })
}

/// A line the state asks for; [`BrokerHealth::write`] adds the brokers and the level.
#[derive(Debug, PartialEq)]
enum Line {
    /// No broker can be reached (the first sign): what librdkafka said.
    Unreachable { client: &'static str, error: String, every: Duration },
    /// Still unreachable after `away`: `errors` since the previous line, the last one.
    StillUnreachable { away: Duration, errors: u64, error: Option<String> },
    /// Reachable again after `away`; `suppressed` errors were not logged one by one.
    Back { away: Duration, suppressed: u64 },
    /// Reached for the first time, `after` start.
    Connected { after: Duration },
    /// Not reached yet, `waiting` since start: `errors` so far, the last one.
    StillConnecting { waiting: Duration, errors: u64, error: Option<String> },
    /// A client's connection errors while the brokers are reachable: `errors` since the previous line.
    ClientErrors { client: &'static str, errors: u64, error: String },
}

/// The brokers' state and what the log has said of it: pure logic, the time passed in.
#[derive(Debug)]
struct Reach {
    /// `kafka.outage_summary_interval`: at most one line about errors this often.
    interval: Duration,
    state: Reachability,
    /// When `state` began (monotonic, for how long), and on the wall clock (for `/readyz`).
    since: Instant,
    since_wall: SystemTime,
    /// Connection errors since `state` began (the one an `Unreachable` line quotes not counted).
    errors: u64,
    /// Of those, the ones that no line has counted yet.
    unreported: u64,
    /// When a line last spoke of this state (or when it began).
    reported_at: Instant,
    /// The last connection error in this state and its client: the next line quotes it.
    last_error: Option<(&'static str, String)>,
    /// When it came: "all brokers are down" quotes it only when it came just before.
    last_error_at: Instant,
}

impl Reach {
    fn new(now: Instant, wall: SystemTime, interval: Duration) -> Reach {
        Reach {
            interval,
            state: Reachability::Connecting,
            since: now,
            since_wall: wall,
            errors: 0,
            unreported: 0,
            reported_at: now,
            last_error: None,
            last_error_at: now,
        }
    }

    fn enter(&mut self, state: Reachability, now: Instant, wall: SystemTime) {
        *self = Reach { interval: self.interval, state, ..Reach::new(now, wall, self.interval) };
    }

    /// A connection error of `client`; `all_down` when it says no broker can be
    /// reached, `decides` when the client's word on that counts (see the module's doc).
    fn failed(
        &mut self,
        now: Instant,
        wall: SystemTime,
        client: &'static str,
        all_down: bool,
        decides: bool,
        error: String,
    ) -> Option<Line> {
        let unreachable = all_down
            && match self.state {
                Reachability::Unreachable => false,
                Reachability::Connecting => true,
                Reachability::Reachable => decides,
            };
        if unreachable {
            // "1/1 brokers are down" says less than the connection error before it.
            let recent = now.saturating_duration_since(self.last_error_at) <= QUOTE_WITHIN;
            let error = match self.last_error.take() {
                Some((_, before)) if recent && before != error => format!("{before}; {error}"),
                _ => error,
            };
            self.enter(Reachability::Unreachable, now, wall);
            return Some(Line::Unreachable { client, error, every: self.interval });
        }
        self.errors += 1;
        self.unreported += 1;
        // "1/1 brokers are down" follows every failed connection: the failure says more
        // (any one of this outage; before it, a recent one).
        let recent = now.saturating_duration_since(self.last_error_at) <= QUOTE_WITHIN;
        let said_more = self.last_error.is_some() && (self.state == Reachability::Unreachable || recent);
        if !all_down || !said_more {
            self.last_error = Some((client, error));
            self.last_error_at = now;
        }
        self.tick(now)
    }

    /// What librdkafka said of a failed connection, for the next line to quote (not counted:
    /// an error event comes with it).
    fn noted(&mut self, now: Instant, client: &'static str, message: &str) {
        // librdkafka's "[thrd:...]: " says which of its threads wrote it: not for a person.
        let message = message.split_once("]: ").filter(|_| message.starts_with("[thrd:")).map_or(message, |(_, m)| m);
        self.last_error = Some((client, message.to_owned()));
        self.last_error_at = now;
    }

    fn reached(&mut self, now: Instant, wall: SystemTime) -> Option<Line> {
        let took = now.saturating_duration_since(self.since);
        let line = match self.state {
            Reachability::Reachable => return None,
            Reachability::Connecting => Line::Connected { after: took },
            Reachability::Unreachable => Line::Back { away: took, suppressed: self.errors },
        };
        self.enter(Reachability::Reachable, now, wall);
        Some(line)
    }

    fn tick(&mut self, now: Instant) -> Option<Line> {
        if now.saturating_duration_since(self.reported_at) < self.interval {
            return None;
        }
        let line = match self.state {
            Reachability::Unreachable => Line::StillUnreachable {
                away: now.saturating_duration_since(self.since),
                errors: self.unreported,
                error: self.last_error.as_ref().map(|(_, e)| e.clone()),
            },
            Reachability::Connecting => Line::StillConnecting {
                waiting: now.saturating_duration_since(self.since),
                errors: self.errors,
                error: self.last_error.as_ref().map(|(_, e)| e.clone()),
            },
            Reachability::Reachable => match &self.last_error {
                Some((client, error)) if self.unreported > 0 => {
                    Line::ClientErrors { client, errors: self.unreported, error: error.clone() }
                }
                _ => return None,
            },
        };
        self.unreported = 0;
        self.reported_at = now;
        Some(line)
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
