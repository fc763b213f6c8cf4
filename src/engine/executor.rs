//! One event's life: decode → wait for the handler's circuit → claim (in memory
//! for `on_uncertain = retry`, durably for `verify | park`) → handler (within its
//! concurrency limit, with retries, or the unknown-outcome policy) → record
//! done/dead/parked durably. Used by the
//! engine for consumed messages and by `outboxd store retry` for stored copies.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument, Span};

use super::circuit::{Admit, Circuits, Health};
use super::concurrency::Signal;
use super::fatal::Fatal;
use super::guards::{live_guard, live_guard_unless, LiveIds, Release};
use super::retry::{backoff, next_delay};
use super::slots::{Slot, TopicMetrics, TopicsMetrics};
use super::spans;
use crate::avro;
use crate::codec::{DecodeError, Decoder};
use crate::config::{Config, HandlerConfig, OnUncertain};
use crate::event::{OutboxEvent, RawMessage};
use crate::handler::{self, Handler, HandlerError, Verified};
use crate::kafka::{DeadLetterInfo, DeadLetters, DlqError};
use crate::metrics::names;
use crate::store::{ClaimHow, Claimed, Record, State, Store, StoreError, Turn};

/// First pause, and the longest, while the schema registry cannot be reached.
const REGISTRY_RETRY_INITIAL: Duration = Duration::from_millis(500);
const REGISTRY_RETRY_MAX: Duration = Duration::from_secs(30);

/// First pause, and the longest, between attempts to produce a dead letter.
const DLQ_RETRY_INITIAL: Duration = Duration::from_millis(200);
const DLQ_RETRY_MAX: Duration = Duration::from_secs(30);

/// Asked right before an event is claimed: is its partition still ours?
pub type Ownership<'a> = dyn Fn() -> bool + Send + Sync + 'a;

/// Told when an event's call is over and it only waits for its record to be
/// durable (and acknowledged): the worker gives its read-ahead place to the next
/// message (`worker::call_over`).
pub type CallOver<'a> = dyn Fn() + Send + Sync + 'a;

/// How [`Executor::execute`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executed {
    /// The event is durably final (done, dead, parked, or a suppressed duplicate).
    Final,
    /// Its partition moved before it was claimed: nothing ran, the new owner has it.
    Abandoned,
}

/// Counters for the shutdown summary.
#[derive(Debug, Default)]
pub struct Counters {
    /// Events recorded done: the handler succeeded, or `verify` found the earlier attempt happened.
    pub handled: AtomicU64,
    /// Deliveries of an event already done, dead or parked: suppressed, nothing ran.
    pub duplicates: AtomicU64,
    /// Events recorded dead or parked, and messages that could not be decoded or whose handling panicked.
    pub dead: AtomicU64,
    /// Events found `claimed` by an earlier attempt whose outcome is unknown, given to
    /// `on_uncertain`. Only a durable claim is found again after a crash: with `retry`
    /// (claims in memory) a crash's re-execution looks like a first run.
    pub reexecuted: AtomicU64,
}

/// A lookup of an uncertain event that gave up: the reason the event is recorded dead with.
struct Unverified(String);

/// How a message runs, besides whose it is.
#[derive(Clone, Copy, Default)]
struct RunAs<'a> {
    /// A route whose receiver has been away longer than `circuit.hold_after`
    /// records the event held (consumed messages only).
    may_hold: bool,
    /// Appended to each route's idempotency key (a replay with `--new-key`).
    key_suffix: Option<&'a str>,
}

impl RunAs<'_> {
    /// The idempotency key `route` sends for event `id`, when it is not the id itself.
    fn key(&self, route: &crate::config::Route<'_>, id: &str) -> Option<String> {
        match self.key_suffix {
            None => route.key(id),
            Some(suffix) => Some(format!("{}{suffix}", route.key(id).as_deref().unwrap_or(id))),
        }
    }
}

/// One decoded event on its way: what each step of its path needs.
struct Job<'a> {
    hc: &'a HandlerConfig,
    slot: &'a Slot,
    /// The slot's handler, or the one an embedding program gave for the topic.
    handler: &'a dyn Handler,
    event: &'a OutboxEvent,
    msg: &'a RawMessage,
    /// The store's scope of its record: the route's (`config::Route::scope`).
    scope: &'a str,
    /// Whether it may be held while its route's receiver is away (`circuit.hold_after`):
    /// not when the releaser runs a held event.
    may_hold: bool,
    /// Asked before the claim and before each retry: is the partition still ours?
    owned: &'a Ownership<'a>,
    /// Called once the handler answered and only the final record is left.
    call_over: &'a CallOver<'a>,
    metrics: &'a TopicMetrics,
}

impl Job<'_> {
    fn topic(&self) -> &str {
        &self.event.position.topic
    }
}

/// Takes each event through decode, durable claim, handler and durable record;
/// shared by the engine's chains, the admin server and `outboxd store retry`.
pub struct Executor {
    pub(crate) config: Config,
    pub(crate) store: Arc<Store>,
    /// One per `config.handlers` entry, in its order.
    slots: Vec<Slot>,
    /// Handlers given by an embedding program, by topic: they run instead of
    /// the configured kind; the topic's `[[handlers]]` entry still says how its
    /// events are read, retried and dead-lettered.
    custom: HashMap<String, Arc<dyn Handler>>,
    /// Present when some handler has a dead-letter topic.
    dead_letters: Option<DeadLetters>,
    /// The one decoder (with the schema registry, when `[schema_registry]` is configured).
    decoder: Decoder,
    /// Event ids being worked on in this process: a second delivery of the
    /// same id (at another offset or key) waits instead of running twice.
    live: LiveIds,
    pub(crate) counters: Counters,
    /// Set at the first event handled since start, which has a line at `info`.
    handled_once: AtomicBool,
    metrics: TopicsMetrics,
    /// The receiver's health per handler: while one is open, none of its calls start.
    circuits: Arc<Circuits>,
    /// Set when the store fails (or another [`Fatal`] failure): nothing more runs
    /// and no offset moves.
    failure: std::sync::OnceLock<Fatal>,
    /// Cancelled with the failure, so that the service stops and drains.
    shutdown: CancellationToken,
}

impl Executor {
    /// With the configured handlers only; builds them, the dead-letter producer
    /// (when a handler has a dead-letter topic) and the registry client (when configured).
    pub fn new(config: Config, store: Arc<Store>) -> Result<Executor, SetupError> {
        Executor::with_handlers(config, store, HashMap::new())
    }

    /// With `custom` handlers by topic, given by an embedding program. Each topic must be
    /// covered by a `[[handlers]]` entry.
    pub fn with_handlers(
        config: Config,
        store: Arc<Store>,
        custom: HashMap<String, Arc<dyn Handler>>,
    ) -> Result<Executor, SetupError> {
        check_custom_topics(&config, &custom)?;
        let mut slots = Vec::with_capacity(config.handlers.len());
        for hc in &config.handlers {
            slots.push(Slot::new(hc, handler::build(hc)?, config.store.max_in_flight));
        }
        let dead_letters = if config.handlers.iter().any(|h| h.dead_letter_topic.is_some()) {
            Some(DeadLetters::build(&config.kafka)?)
        } else {
            None
        };
        let registry = config.schema_registry.clone().map(avro::Registry::new).transpose()?;
        let circuits = Arc::new(Circuits::new(&config.handlers));
        Ok(Executor {
            config,
            store,
            slots,
            custom,
            dead_letters,
            decoder: Decoder::new(registry),
            live: LiveIds::default(),
            counters: Counters::default(),
            handled_once: AtomicBool::new(false),
            metrics: TopicsMetrics::default(),
            circuits,
            failure: std::sync::OnceLock::new(),
            shutdown: CancellationToken::new(),
        })
    }

    /// A store failure cancels `shutdown` (besides stopping all further work here).
    pub fn cancels(mut self, shutdown: CancellationToken) -> Executor {
        self.shutdown = shutdown;
        self
    }

    /// Stops all further work (a store failure) and cancels the shutdown token.
    /// The first failure is the one reported.
    pub fn fail(&self, reason: impl Into<Fatal>) {
        let reason = reason.into();
        let _ = self.failure.set(reason);
        self.shutdown.cancel();
    }

    /// Each handler's name with its calls and failed calls since start, in config order.
    pub fn handler_calls(&self) -> Vec<(String, u64, u64)> {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let named = self.config.handlers.iter().zip(&self.slots);
        named.map(|(hc, s)| (hc.name.clone(), load(&s.calls.calls), load(&s.calls.failed))).collect()
    }

    /// Writes each handler's summary line at `info`: what it did since the last one
    /// (`log.summary_interval`). A handler that did nothing meanwhile writes none.
    pub fn log_summary(&self) {
        for (hc, slot) in self.config.handlers.iter().zip(&self.slots) {
            let Some(s) = slot.tally.take() else { continue };
            let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| (d.as_secs_f64() * 1e4).round() / 10.0);
            info!(handler = %hc.name, handled = s.handled, duplicates = s.duplicates, dead = s.dead, held = s.held,
                calls = s.calls, call_p50_ms = ms(s.call_p50), call_p99_ms = ms(s.call_p99),
                "handler summary since the last (log.summary_interval)");
        }
    }

    /// The handlers' circuits (the engine pauses an open one's partitions; `/readyz` names them).
    pub fn circuits(&self) -> &Arc<Circuits> {
        &self.circuits
    }

    /// Decodes a stored message copy as its topic's handler reads it, once (no
    /// waiting for the schema registry), for a person to look at; `None` when no
    /// handler covers the topic any more.
    pub async fn decode_copy(&self, msg: &RawMessage) -> Option<Result<OutboxEvent, DecodeError>> {
        let hc = self.config.handler_for(&msg.topic)?;
        Some(self.decoder.decode(msg, &self.slots[hc.index].layout).await)
    }

    /// True once [`Executor::fail`] was called: nothing more runs and no offset moves.
    pub fn stopped(&self) -> bool {
        self.failure.get().is_some()
    }

    /// Why [`Executor::fail`] was called, if it was.
    pub fn failure(&self) -> Option<Fatal> {
        self.failure.get().cloned()
    }

    /// Runs one message until its event is durably final (or the store fails).
    pub async fn execute(&self, msg: &RawMessage) -> Result<Executed, StoreError> {
        self.execute_as(msg, &|| true, &|| {}, RunAs::default()).await
    }

    /// Runs a held event for its released chain (`engine::hold`): like
    /// [`Executor::execute_owned`], but a route whose receiver is away waits for it
    /// instead of holding the event again.
    pub async fn execute_held(&self, msg: &RawMessage, owned: &Ownership<'_>) -> Result<Executed, StoreError> {
        self.execute_as(msg, owned, &|| {}, RunAs::default()).await
    }

    /// Like [`Executor::execute`] for a consumed message: `owned` is asked right
    /// before the event is claimed, after any wait (registry, the same id in
    /// flight), so that an event whose partition moved meanwhile is left to its
    /// new owner instead of running here too.
    /// `call_over` is told when the handler answered and only its record is left.
    pub async fn execute_owned(
        &self,
        msg: &RawMessage,
        owned: &Ownership<'_>,
        call_over: &CallOver<'_>,
    ) -> Result<Executed, StoreError> {
        self.execute_as(msg, owned, call_over, RunAs { may_hold: true, key_suffix: None }).await
    }

    /// [`Executor::execute_owned`], run `how` says.
    async fn execute_as(
        &self,
        msg: &RawMessage,
        owned: &Ownership<'_>,
        call_over: &CallOver<'_>,
        how: RunAs<'_>,
    ) -> Result<Executed, StoreError> {
        if self.config.store.changelog.as_ref().is_some_and(|c| c.is_changelog(&msg.topic)) {
            // A handler's topic_pattern matched a changelog topic: its records are
            // outboxd's own state, not events (read by restores, never handled).
            debug!(topic = %msg.topic, partition = msg.partition, offset = msg.offset, "changelog record skipped");
            return Ok(Executed::Final);
        }
        let span = spans::event(msg);
        self.execute_in_span(msg, owned, call_over, how, &span).instrument(span.clone()).await
    }

    /// [`Executor::execute_owned`] for an event, inside its `span`.
    async fn execute_in_span(
        &self,
        msg: &RawMessage,
        owned: &Ownership<'_>,
        call_over: &CallOver<'_>,
        how: RunAs<'_>,
        span: &Span,
    ) -> Result<Executed, StoreError> {
        let Some(hc) = self.config.handler_for(&msg.topic) else {
            Box::pin(self.undecodable(None, msg, "no handler is configured for this topic".to_owned())).await?;
            return Ok(Executed::Final);
        };
        let decode = spans::decode();
        // Most messages need no schema lookup: decoded here, without the boxed
        // future of the path that waits for the registry.
        let decoded = match decode.in_scope(|| self.decoder.decode_now(msg, &self.slots[hc.index].layout)) {
            Some(decoded) => decoded,
            None => Box::pin(self.decode(hc, msg)).instrument(decode.clone()).await,
        };
        match decoded {
            Err(reason) => {
                let reason = reason.to_string();
                spans::failed(&decode, &reason);
                drop(decode);
                Box::pin(self.undecodable(Some(hc), msg, reason)).await?;
                Ok(Executed::Final)
            }
            Ok(mut event) => {
                drop(decode);
                spans::decoded(span, &hc.name, &event);
                // Boxed here, and the handler's attempts below: an event's future is a
                // few KB deep, and each level that awaits one moves it whole (memcpy,
                // levels up to the task's cell); a box per level keeps each level small.
                let executed = Box::pin(self.run_routes(&mut event, msg, owned, call_over, how)).await;
                if let Ok(Executed::Abandoned) = executed {
                    spans::ended(span, "abandoned");
                }
                executed
            }
        }
    }

    /// Runs the event through each route of its topic that selects it, side by side,
    /// each to a durable final state of its own (its record, in its scope). A route
    /// that does not select it is counted as filtered. The event is final once every
    /// route is; it is abandoned (and left to the partition's new owner, which finds
    /// the finished routes' records) when one is.
    async fn run_routes(
        &self,
        // Borrowed: an event taken by value is held twice in the future (the
        // argument and the binding), each copy moved with it.
        event: &mut OutboxEvent,
        msg: &RawMessage,
        owned: &Ownership<'_>,
        call_over: &CallOver<'_>,
        how: RunAs<'_>,
    ) -> Result<Executed, StoreError> {
        let (topic, may_hold) = (msg.topic.as_str(), how.may_hold);
        let mut selected: smallvec::SmallVec<[crate::config::Route<'_>; 2]> = smallvec::SmallVec::new();
        for route in self.config.routes_for(topic) {
            match selects(&route, event, msg) {
                true => selected.push(route),
                false => self.filtered(route.handler, topic, event),
            }
        }
        match selected.as_slice() {
            [] => {
                self.unrouted(topic, event);
                Ok(Executed::Final)
            }
            [route] => {
                event.route_key = how.key(route, &event.id);
                self.run_route(route, event, msg, owned, call_over, may_hold).await
            }
            routes => {
                // Each route its own copy (its own idempotency key). The read-ahead place
                // is given back once every route's call is over.
                let events: Vec<OutboxEvent> = routes
                    .iter()
                    .map(|r| OutboxEvent { route_key: how.key(r, &event.id), ..event.clone() })
                    .collect();
                let calls = std::sync::atomic::AtomicUsize::new(routes.len());
                let over = || {
                    if calls.fetch_sub(1, Ordering::AcqRel) == 1 {
                        call_over();
                    }
                };
                let runs = routes.iter().zip(&events).map(|(r, e)| self.run_route(r, e, msg, owned, &over, may_hold));
                let mut executed = Executed::Final;
                for result in futures::future::join_all(runs).await {
                    if result? == Executed::Abandoned {
                        executed = Executed::Abandoned;
                    }
                }
                Ok(executed)
            }
        }
    }

    /// One route of the event: its scope, handler and metrics, then claim, run, record.
    async fn run_route(
        &self,
        route: &crate::config::Route<'_>,
        event: &OutboxEvent,
        msg: &RawMessage,
        owned: &Ownership<'_>,
        call_over: &CallOver<'_>,
        may_hold: bool,
    ) -> Result<Executed, StoreError> {
        let (hc, topic) = (route.handler, msg.topic.as_str());
        let scope = route.scope(topic);
        let slot = &self.slots[hc.index];
        let handler = match route.first {
            true => self.custom.get(topic).unwrap_or(&slot.handler).as_ref(),
            false => slot.handler.as_ref(),
        };
        let metrics = self.metrics.of(topic, Some(hc));
        // Headers are copied onto the event only for a handler that reads them (boxed:
        // the copy would otherwise take its room in every event's future).
        let with_headers;
        let event = match &hc.spec {
            crate::config::HandlerSpec::Postgres(pg) if pg.reads_headers() => {
                with_headers = Box::new(OutboxEvent { headers: msg.headers.clone(), ..event.clone() });
                &*with_headers
            }
            _ => event,
        };
        let job = Job { hc, slot, handler, event, msg, scope: &scope, may_hold, owned, call_over, metrics: &metrics };
        self.handle(&job).await
    }

    /// A route passed the event by (`event_types`, `when`): nothing is recorded for it there.
    fn filtered(&self, hc: &HandlerConfig, topic: &str, event: &OutboxEvent) {
        self.metrics.filtered(topic, hc).increment(1);
        debug!(event_id = %event.id, %topic, handler = %hc.name, event_type = event.event_type.as_deref(),
            "not selected by this route (event_types, when)");
    }

    /// No route of the topic selected the event: nothing runs, the offset moves.
    fn unrouted(&self, topic: &str, event: &OutboxEvent) {
        self.metrics.unrouted(topic).increment(1);
        debug!(event_id = %event.id, %topic, event_type = event.event_type.as_deref(), "selected by no route of its topic");
    }

    /// Replays the event of a final record from its source message, read again
    /// from Kafka (`outboxd store replay`): the record of `id` in `scope` is claimed
    /// again (in one write) and the message runs through the normal path, where
    /// that record's route runs it and the event's other routes find theirs final
    /// and pass it by. A record the message did not run under (its route no longer
    /// selects it, or it decodes to another id) is written back as it was.
    /// `key_suffix` (`--new-key`) is appended to the idempotency key the route sends.
    /// Returns what came of the record (`None`: it is gone).
    pub async fn replay(
        &self,
        scope: &str,
        id: &str,
        message: &RawMessage,
        key_suffix: Option<&str>,
    ) -> Result<Option<crate::store::Replayed>, StoreError> {
        let before = self.store.repairs().reopen_for_replay(scope, id, message).await?;
        let how = RunAs { may_hold: false, key_suffix };
        let ran = self.execute_as(message, &|| true, &|| {}, how).await;
        let now = self.store.repairs().put_back(scope, id, &before).await?;
        ran?;
        Ok(now)
    }

    /// Runs a dead or parked event again from its stored copy (`outboxd store
    /// retry`): reopened (claimed, in one write), run through the normal path, then
    /// settled. Returns the record under `id` now; `None` when the message ran under
    /// its decoded event id (an undecodable message that decodes now).
    pub async fn rerun(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let message = self.store.repairs().reopen(id).await?;
        self.execute(&message).await?;
        let record = self.store.repairs().settle_rerun(id).await?;
        if record.as_ref().is_some_and(|r| r.state == State::Done) {
            self.store.repairs().drop_message(id).await?;
        }
        Ok(record)
    }

    /// A bug hit while handling this message (a panic). It is recorded dead under its
    /// position, with the message copy (and dead-lettered when configured), so that the
    /// key's chain and the partition go on; `outboxd store retry` runs it again.
    pub async fn record_panic(&self, msg: &RawMessage, panic: &str) -> Result<(), StoreError> {
        let id = msg.id_at_position(crate::event::PositionId::Failed);
        let reason = format!("outboxd failed while handling this message (a bug): {panic}");
        error!(event_id = %id, topic = %msg.topic, partition = msg.partition, offset = msg.offset, %reason,
            "handling failed unexpectedly; recorded dead so that its key and partition go on");
        self.counters.dead.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(names::PANICS, "topic" => msg.topic.clone()).increment(1);
        let hc = self.config.handler_for(&msg.topic);
        self.metrics.of(&msg.topic, hc).dead.increment(1);
        let dlq = self.dead_letter(hc, msg, &reason, 0).await;
        let hold = hc.is_some_and(|h| h.on_dead.holds());
        self.store.handling().record_undecodable(&id, msg, reason, dlq, hold).await
    }

    /// Decodes as the handler's entry says. While the schema registry cannot
    /// answer (unreachable, or it refuses us (401/403) or answers garbage) the
    /// event waits, with backoff: the latter two are configuration errors, not
    /// the event's, so it waits rather than being dead-lettered, and every retry
    /// logs at error level with the status and counts in
    /// `outboxd_schema_registry_errors_total{reason}`. Any other error is for
    /// the dead-letter path.
    async fn decode(&self, hc: &HandlerConfig, msg: &RawMessage) -> Result<OutboxEvent, DecodeError> {
        let layout = &self.slots[hc.index].layout;
        let mut pause = REGISTRY_RETRY_INITIAL;
        loop {
            match self.decoder.decode(msg, layout).await {
                Err(DecodeError::Registry { error, schema_id, .. }) if !self.stopped() => {
                    let reason = error.registry_reason().unwrap_or("unavailable");
                    metrics::counter!(names::SCHEMA_REGISTRY_ERRORS, "reason" => reason).increment(1);
                    let topic = &msg.topic;
                    if error.needs_operator() {
                        error!(error = %error, reason, schema_id, topic, ?pause,
                            "the schema registry refuses or garbles the schema lookup; fix [schema_registry] (the event and its offset wait)");
                    } else {
                        warn!(error = %error, schema_id, topic, ?pause, "waiting for the schema registry (the event and its offset wait)");
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(REGISTRY_RETRY_MAX);
                }
                other => return other,
            }
        }
    }

    async fn undecodable(
        &self,
        hc: Option<&HandlerConfig>,
        msg: &RawMessage,
        reason: String,
    ) -> Result<(), StoreError> {
        let id = msg.id_at_position(crate::event::PositionId::Undecodable);
        // A key that waits behind a dead or parked event holds this message too (`on_dead = "hold"`).
        let hold = hc.is_some_and(|h| h.on_dead.holds());
        if self.store.handling().hold_message(&id, msg, hold).await? {
            spans::ended_here(State::Held);
            if let Some(hc) = hc {
                self.slots[hc.index].tally.held();
            }
            return Ok(());
        }
        warn!(event_id = %id, topic = %msg.topic, partition = msg.partition, offset = msg.offset, %reason,
            "message cannot be decoded; dead-lettered");
        spans::failed_here(&reason);
        self.counters.dead.fetch_add(1, Ordering::Relaxed);
        self.metrics.of(&msg.topic, hc).dead.increment(1);
        if let Some(hc) = hc {
            self.slots[hc.index].tally.dead();
        }
        let dlq = self.dead_letter(hc, msg, &reason, 0).await;
        let record = spans::record(State::Dead, self.changelog());
        self.store.handling().record_undecodable(&id, msg, reason, dlq, hold).instrument(record).await
    }

    /// Whether final records also wait for the changelog's acknowledgement.
    fn changelog(&self) -> bool {
        self.config.store.changelog.is_some()
    }

    /// Produces the dead letter when the handler has a topic, retrying until the
    /// broker acknowledges it: the source offset must not move before that.
    async fn dead_letter(
        &self,
        hc: Option<&HandlerConfig>,
        msg: &RawMessage,
        reason: &str,
        attempts: u32,
    ) -> Option<String> {
        let topic = hc?.dead_letter_topic.as_deref()?;
        let producer = self.dead_letters.as_ref()?;
        let info = DeadLetterInfo { error: reason, attempts };
        let mut pause = DLQ_RETRY_INITIAL;
        loop {
            match producer.send(topic, msg, &info).await {
                Ok(position) => return Some(position),
                Err(DlqError::Rejected(error)) => {
                    // Waiting cannot help; the message copy stays in the store (store export/retry).
                    error!(%error, dead_letter_topic = topic, topic = %msg.topic, partition = msg.partition,
                        offset = msg.offset, "the broker rejects this dead letter; recorded dead with the message kept in the store");
                    return None;
                }
                Err(DlqError::Transient(error)) => {
                    warn!(%error, dead_letter_topic = topic, topic = %msg.topic, partition = msg.partition,
                        offset = msg.offset, "dead-letter produce failed; retrying (the offset waits)");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(DLQ_RETRY_MAX);
                }
            }
        }
    }

    /// Waits while the same id is in flight here, then (if the partition is still
    /// ours) claims and runs it.
    async fn handle(&self, job: &Job<'_>) -> Result<Executed, StoreError> {
        let event = job.event;
        // A consumed delivery (`may_hold`) of an event the releaser of its held chain runs
        // now (a redelivery: Kafka's after a rebalance, Debezium's after a restart) does not
        // wait for that run, which waits for its receiver as long as the receiver is away:
        // it would hold up its key, then read-ahead and every partition behind it. The
        // chain runs the event; this delivery is a duplicate.
        let chain_runs = || job.may_hold && self.store.holds().runs(job.scope, &event.id);
        let Some(_live) = live_guard_unless(&self.live, job.scope, &event.id, chain_runs).await else {
            let p = &event.position;
            let held = self.store.reads().get_in(job.scope, &event.id)?;
            let same_offset =
                held.is_some_and(|r| *r.topic == *p.topic && r.partition == p.partition && r.offset == p.offset);
            let cause = self.suppressed(job, same_offset);
            debug!(event_id = %event.id, topic = %p.topic, partition = p.partition, offset = p.offset, cause,
                "duplicate suppressed: the event's held chain runs it now");
            return Ok(Executed::Final);
        };
        if !(job.owned)() {
            let p = &event.position;
            info!(event_id = %event.id, topic = %p.topic, partition = p.partition, offset = p.offset,
                "partition moved while the event waited; left to its new owner");
            return Ok(Executed::Abandoned);
        }
        self.claim_and_run(job).await
    }

    /// Claim, run with retries, record. Returns once the event is durably final,
    /// or abandoned between attempts because its partition may have moved.
    async fn claim_and_run(&self, job: &Job<'_>) -> Result<Executed, StoreError> {
        let (hc, event) = (job.hc, job.event);
        // Before the claim: an event that waits for its receiver is not claimed yet,
        // so a crash meanwhile leaves nothing uncertain behind.
        let admitted = self.circuits.get(hc.index).admit(job.owned, job.may_hold).await;
        if let Admit::Moved = admitted {
            let p = &event.position;
            info!(event_id = %event.id, topic = %p.topic, partition = p.partition, offset = p.offset,
                "partition moved while the event waited for its receiver; left to its new owner");
            return Ok(Executed::Abandoned);
        }
        let scope = job.scope;
        // With `retry`, a crash during the handler leads to the same re-execution with
        // the same idempotency key whether or not the claim was durable (docs/architecture.md §2, invariant 1).
        // A durable claim is in the changelog too before the call: a new owner of the
        // partition must find the outcome uncertain, not absent.
        let durable = hc.on_uncertain != OnUncertain::Retry;
        // A key that waits behind a dead or parked event holds this one (`on_dead = "hold"`).
        let how = ClaimHow { durable, hold: hc.on_dead.holds(), message: job.msg };
        let release = Release::new(&self.store, &event.id, scope);
        // In blocks, and bound before the next await: what a scope or a match keeps
        // (the turn, the claim, again and again) stays in the event's future across
        // every later await, a few hundred bytes each.
        let claimed = {
            let claim = spans::claim(durable, self.changelog());
            // The claim is made at the call (`claim_to_run`), inside its span too.
            let claiming = claim.in_scope(|| self.store.handling().claim_to_run(event, scope, how));
            let turn = claiming.instrument(claim).await?;
            match turn {
                // An event run for the first time, most of them: no wait, and the other
                // cases' future boxed, off every event's.
                Turn::Run(c) if !c.reexecution() => c,
                turn => match Box::pin(self.resolve_claim(job, turn)).await? {
                    Some(c) => c,
                    None => return Ok(Executed::Final),
                },
            }
        };
        let (claimed, admitted) = match admitted {
            Admit::Hold(reason) => match Box::pin(self.hold_for_receiver(job, claimed, &reason, false)).await? {
                Some(back) => back,
                None => return Ok(Executed::Final),
            },
            admitted => (claimed, admitted),
        };
        let executed = Box::pin(self.run_attempts(job, claimed, admitted)).await?;
        // Final: its record is written (done, dead, parked or held), and the store
        // forgot the claim with it. Abandoned: the claim is still there.
        if executed == Executed::Final {
            release.written();
        }
        Ok(executed)
    }

    /// Counts `job`'s event as a suppressed duplicate and ends its span there; the
    /// cause it is counted under: `same_offset` when its record came from this very
    /// offset (Kafka redelivered it), else a new one (a replay). For the caller's log line.
    fn suppressed(&self, job: &Job<'_>, same_offset: bool) -> &'static str {
        self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
        job.slot.tally.duplicate();
        let (cause, counter) = match same_offset {
            true => ("redelivered_offset", &job.metrics.redelivered),
            false => ("new_offset", &job.metrics.new_offset),
        };
        counter.increment(1);
        spans::ended_here("duplicate");
        cause
    }

    /// What a claim comes to before the handler runs: `None` when the event is
    /// final already (a duplicate suppressed; held behind its key's dead or parked
    /// event; parked or verified as done under `on_uncertain`), else the claim to
    /// run it under (a re-execution logged).
    async fn resolve_claim(&self, job: &Job<'_>, turn: Turn) -> Result<Option<Claimed>, StoreError> {
        let (hc, event) = (job.hc, job.event);
        let (topic, partition, offset) = (job.topic(), event.position.partition, event.position.offset);
        Ok(Some(match turn {
            Turn::Finished { state, same_offset } => {
                let cause = self.suppressed(job, same_offset);
                debug!(event_id = %event.id, %topic, partition, offset, %state, cause, "duplicate suppressed");
                return Ok(None);
            }
            Turn::Held => {
                spans::ended_here(State::Held);
                job.slot.tally.held();
                return Ok(None);
            }
            Turn::Run(c) if !c.reexecution() => c,
            Turn::Run(c) => {
                let attempt = c.attempt();
                self.counters.reexecuted.fetch_add(1, Ordering::Relaxed);
                job.metrics.reexecuted.increment(1);
                match hc.on_uncertain {
                    OnUncertain::Retry => {
                        warn!(event_id = %event.id, %topic, partition, offset, attempt,
                            "re-executing: an earlier attempt's outcome is unknown (same idempotency key)");
                    }
                    OnUncertain::Park => {
                        let reason = "parked: an earlier attempt's outcome is unknown (on_uncertain = park); resolve with `outboxd store resolve`";
                        Box::pin(self.failed(job, c, State::Parked, reason.to_owned())).await?;
                        return Ok(None);
                    }
                    OnUncertain::Verify => match Box::pin(self.verify(job)).await {
                        Ok(Verified::Happened(outcome)) => {
                            info!(event_id = %event.id, %topic, partition, offset, %outcome,
                                "uncertain event verified as done; not re-executed");
                            let record = spans::record(State::Done, self.changelog());
                            // Not boxed again: this whole future is boxed already (`claim_and_run`).
                            record.in_scope(|| self.store.handling().finish(c, State::Done, outcome)).instrument(record).await?;
                            self.counters.handled.fetch_add(1, Ordering::Relaxed);
                            job.slot.tally.handled();
                            return Ok(None);
                        }
                        Ok(Verified::Missing) => {
                            warn!(event_id = %event.id, %topic, partition, offset, attempt,
                                "re-executing: verify found no trace of the earlier attempt");
                        }
                        Err(Unverified(reason)) => {
                            Box::pin(self.failed(job, c, State::Dead, reason)).await?;
                            return Ok(None);
                        }
                    },
                }
                c
            }
        }))
    }

    /// Runs the handler under `claimed`, retrying by the handler's policy, until
    /// the event is durably done or dead. A retry is not made once the partition
    /// may have moved: the event is left to the new owner, which finds it claimed
    /// (or not at all) and runs it with the same idempotency key.
    ///
    /// Each call waits for the handler's circuit (`admitted` is the first call's
    /// leave) and its concurrency limit. A failure that is the receiver's while the
    /// circuit is open (or that opens it) is not charged to the event's budget, and
    /// an event that waited for the circuit starts its budget afresh: `max_attempts`
    /// and `max_elapsed` measure failures of the event, not an outage.
    ///
    /// Not an `async fn`: its future would hold the claim twice (as its argument and
    /// as the local the body moves it to), a few hundred bytes more in every event's.
    #[expect(clippy::manual_async_fn, reason = "an async fn's future holds its arguments twice (above)")]
    fn run_attempts<'a>(
        &'a self,
        job: &'a Job<'a>,
        mut claimed: Claimed,
        admitted: Admit<'a>,
    ) -> impl Future<Output = Result<Executed, StoreError>> + 'a {
        async move {
            let (hc, event) = (job.hc, job.event);
            let (topic, partition, offset) = (job.topic(), event.position.partition, event.position.offset);
            let circuit = self.circuits.get(hc.index);
            let limiter = &job.slot.limiter;
            let mut attempt = claimed.attempt();
            let mut started = Instant::now();
            let mut delays = backoff(&hc.retry);
            // Failures charged to the event since its budget (re)started.
            let mut charged = 0u32;
            let mut admitted = Some(admitted);
            let mut called = false;
            loop {
                let pass = match admitted.take() {
                    Some(a) => a,
                    None => circuit.admit(job.owned, job.may_hold).await,
                };
                let pass = match pass {
                    Admit::Go(pass) => pass,
                    Admit::Moved => {
                        warn!(event_id = %event.id, %topic, partition, offset, attempt, idempotency_key = %event.id,
                            "partition moved while the event waited for its receiver; not retrying here (its new owner runs it with the same idempotency key)");
                        return Ok(Executed::Abandoned);
                    }
                    Admit::GaveUp(reason) => {
                        Box::pin(self.failed(job, claimed, State::Dead, reason)).await?;
                        return Ok(Executed::Final);
                    }
                    Admit::Hold(reason) => match Box::pin(self.hold_for_receiver(job, claimed, &reason, called)).await? {
                        Some((back, again)) => {
                            (claimed, admitted) = (back, Some(again));
                            continue;
                        }
                        None => return Ok(Executed::Final),
                    },
                };
                if pass.waited() {
                    // What failed before the wait was the outage's.
                    started = Instant::now();
                    delays = backoff(&hc.retry);
                    charged = 0;
                }
                limiter.follow(circuit.closes());
                let call = limiter.acquire().await;
                if pass.stale() {
                    // The circuit opened while this call waited for room: it waits for the circuit instead.
                    continue;
                }
                if self.stopped() {
                    // The service stops (a store write failed): no call starts that could
                    // not be recorded. Whatever this event waited for (its retry, room,
                    // the circuit), it is left unfinished for the restart, which reads
                    // from the last committed offset (with the same idempotency key).
                    return Ok(Executed::Abandoned);
                }
                // The call starts now: at its permit's time for a first attempt (one reading
                // of the clock for both), after its attempt is recorded for a later one.
                let t = if called {
                    attempt = Box::pin(self.store.handling().record_attempt(&mut claimed)).await?;
                    Instant::now()
                } else {
                    call.started()
                };
                called = true;
                #[cfg(debug_assertions)]
                inject_panic(&event.id);
                let span = spans::call(&hc.name, attempt);
                let result = job.handler.handle(event).instrument(span.clone()).await;
                match &result {
                    Ok(outcome) => spans::answered(&span, &outcome.0),
                    Err(e) => spans::failed(&span, e),
                }
                drop(span);
                // One reading of the clock for the call's time and the event's budget.
                let ended = Instant::now();
                let took = ended.saturating_duration_since(t);
                job.slot.calls.count(result.is_ok());
                job.slot.tally.call(took);
                job.metrics.handler_seconds.record(took.as_secs_f64());
                let health = Health::of(&result);
                let last_chance = charged + 1 >= hc.retry.max_attempts
                    || ended.saturating_duration_since(started).saturating_add(hc.retry.max_backoff) >= hc.retry.max_elapsed;
                let open = circuit.record(pass, &health, last_chance);
                let signal = if matches!(health, Health::Down { .. }) { Signal::Congested } else { Signal::Answered };
                limiter.done(call, signal, ended);
                let (reason, retry_after) = match result {
                    Ok(outcome) => {
                        (job.call_over)();
                        let record = spans::record(State::Done, self.changelog());
                        // The record takes the outcome's text; a copy is kept only for a line
                        // that will be written (the first event's, or each one's at `debug`).
                        let line = self.handled_line().then(|| outcome.0.clone());
                        // The record is written at the call (`finish`), inside its span too.
                        let settled = record.in_scope(|| self.store.handling().finish(claimed, State::Done, outcome.0));
                        settled.instrument(record).await?;
                        self.handled(job, attempt, line.as_deref());
                        return Ok(Executed::Final);
                    }
                    Err(HandlerError::Permanent(reason)) => {
                        Box::pin(self.failed(job, claimed, State::Dead, reason)).await?;
                        return Ok(Executed::Final);
                    }
                    Err(HandlerError::Unavailable { reason, .. }) if open => {
                        // The circuit decides when this event is tried again.
                        warn!(event_id = %event.id, %topic, partition, offset, attempt, %reason,
                            "handler failed; the receiver is unavailable, waiting for its circuit (not charged to the event's retries)");
                        metrics::counter!(names::NOT_CHARGED, "handler" => hc.name.clone()).increment(1);
                        continue;
                    }
                    Err(
                        HandlerError::Unavailable { reason, retry_after } | HandlerError::Retryable { reason, retry_after },
                    ) => (reason, retry_after),
                };
                charged += 1;
                let Some(delay) = next_delay(&mut delays, retry_after, started, &hc.retry) else {
                    let reason = format!("gave up after {attempt} attempts in {:?}: {reason}", started.elapsed());
                    Box::pin(self.failed(job, claimed, State::Dead, reason)).await?;
                    return Ok(Executed::Final);
                };
                warn!(event_id = %event.id, %topic, partition, offset, attempt, %reason, ?delay, "handler failed; retrying");
                job.metrics.retried.increment(1);
                tokio::time::sleep(delay).await;
                if !(job.owned)() {
                    warn!(event_id = %event.id, %topic, partition, offset, attempt, idempotency_key = %event.id,
                        "partition moved between attempts; not retrying here (its new owner runs it with the same idempotency key)");
                    return Ok(Executed::Abandoned);
                }
            }
        }
    }

    /// Whether an event handled now gets a line of its own: the first since start
    /// does, at `info`; the others only at `debug`.
    fn handled_line(&self) -> bool {
        !self.handled_once.load(Ordering::Relaxed) || tracing::enabled!(tracing::Level::DEBUG)
    }

    /// Counts an event recorded done by its handler's call. Its line (with `outcome`,
    /// when [`Executor::handled_line`] asked for one) is at `debug` (the summary counts
    /// it at `info`), but for the first since start.
    fn handled(&self, job: &Job<'_>, attempt: u32, outcome: Option<&str>) {
        self.counters.handled.fetch_add(1, Ordering::Relaxed);
        job.slot.tally.handled();
        job.metrics.handled.increment(1);
        let event = job.event;
        if let Some(ts) = event.timestamp_ms {
            let age = (crate::store::now_us() / 1000 - ts).max(0) as f64 / 1000.0;
            job.metrics.age_seconds.record(age);
        }
        let (topic, partition, offset) = (job.topic(), event.position.partition, event.position.offset);
        // Without a copy only when no line was to be written (a filter changed since: empty).
        let outcome = outcome.unwrap_or_default();
        // Read first: a swap on every event would write the shared flag every time.
        if self.handled_once.load(Ordering::Relaxed) || self.handled_once.swap(true, Ordering::Relaxed) {
            debug!(event_id = %event.id, %topic, partition, offset, attempt, %outcome, "event handled");
        } else {
            info!(event_id = %event.id, %topic, partition, offset, attempt, %outcome,
                "first event handled since start (the next ones are summed up every log.summary_interval)");
        }
    }

    /// Records the event held while its route's receiver is away (`None`: it is final),
    /// or, when its message copy does not fit, hands the claim back with the circuit's
    /// next leave: it waits for the circuit in memory after all. `called`: a call was
    /// made under this claim. Boxed by its callers: room for two claims and the
    /// circuit's wait in every event's future otherwise.
    async fn hold_for_receiver(
        &self,
        job: &Job<'_>,
        claimed: Claimed,
        reason: &str,
        called: bool,
    ) -> Result<Option<(Claimed, Admit<'_>)>, StoreError> {
        let record = spans::record(State::Held, self.changelog());
        let back = self.store.handling().hold_for_receiver(claimed, job.msg, reason, called).instrument(record).await?;
        let Some(back) = back else {
            job.slot.tally.held();
            return Ok(None);
        };
        Ok(Some((back, self.circuits.get(job.hc.index).admit(job.owned, false).await)))
    }

    /// Asks the receiver about an uncertain event, retrying the lookup like the handler.
    async fn verify(&self, job: &Job<'_>) -> Result<Verified, Unverified> {
        let (hc, event) = (job.hc, job.event);
        let started = Instant::now();
        let mut delays = backoff(&hc.retry);
        loop {
            match job.handler.verify(event).await {
                Ok(v) => return Ok(v),
                Err(HandlerError::Permanent(reason)) => return Err(Unverified(reason)),
                Err(
                    HandlerError::Retryable { reason, retry_after } | HandlerError::Unavailable { reason, retry_after },
                ) => {
                    let Some(delay) = next_delay(&mut delays, retry_after, started, &hc.retry) else {
                        return Err(Unverified(format!("verify gave up: {reason}")));
                    };
                    warn!(event_id = %event.id, %reason, ?delay, "verify lookup failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
            if self.stopped() {
                return Err(Unverified("stopping".to_owned()));
            }
        }
    }

    /// Holds event `id` as the handling path does (a delivery of it waits meanwhile),
    /// for work on its record outside that path (the releaser of held chains).
    pub(super) async fn hold_id(&self, scope: &str, id: &str) -> super::guards::LiveGuard<'_> {
        live_guard(&self.live, scope, id).await
    }

    /// Dead or parked: dead-letter it (when configured), then record it with the message copy.
    async fn failed(&self, job: &Job<'_>, claimed: Claimed, state: State, reason: String) -> Result<(), StoreError> {
        let (hc, msg) = (job.hc, job.msg);
        let attempt = claimed.attempt();
        let p = &job.event.position;
        error!(event_id = %job.event.id, topic = %p.topic, partition = p.partition, offset = p.offset, attempt, %state, %reason,
            "event failed");
        spans::failed_here(&reason);
        let dlq = self.dead_letter(Some(hc), msg, &reason, attempt).await;
        let claimed = claimed.holding(hc.on_dead.holds(), msg);
        let record = spans::record(state, self.changelog());
        self.store.handling().finish_failed(claimed, state, reason, msg, dlq).instrument(record).await?;
        // Counted once recorded, like a handled event: the counters never run ahead of the store.
        self.counters.dead.fetch_add(1, Ordering::Relaxed);
        job.slot.tally.dead();
        let counter = if state == State::Parked { &job.metrics.parked } else { &job.metrics.dead };
        counter.increment(1);
        Ok(())
    }
}

/// Whether `route` takes `event`: its `event_types`, and every `[[handlers.when]]` condition.
fn selects(route: &crate::config::Route<'_>, event: &OutboxEvent, msg: &RawMessage) -> bool {
    route.selects(event.event_type.as_deref()) && route.handler.when.iter().all(|c| holds(c, event, msg))
}

/// A header's text, or a payload field's (a string as it is, a number or boolean as
/// its JSON text), is one of the condition's values.
fn holds(c: &crate::config::Condition, event: &OutboxEvent, msg: &RawMessage) -> bool {
    use crate::config::ConditionOn;
    let is_one = |v: &str| c.equals.iter().any(|e| e == v);
    match &c.on {
        ConditionOn::Header(name) => msg
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v.as_deref()?).ok())
            .is_some_and(is_one),
        ConditionOn::Field { pointer, .. } => {
            let crate::event::Payload::Json(json) = &event.payload else { return false };
            match json.value().pointer(pointer) {
                Some(serde_json::Value::String(s)) => is_one(s),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => is_one(&v.to_string()),
                _ => false,
            }
        }
    }
}

/// Every topic given its own handler must be covered by a `[[handlers]]` entry.
pub fn check_custom_topics(config: &Config, custom: &HashMap<String, Arc<dyn Handler>>) -> Result<(), SetupError> {
    match custom.keys().find(|topic| config.handler_for(topic).is_none()) {
        Some(topic) => Err(SetupError::Uncovered(topic.clone())),
        None => Ok(()),
    }
}

/// Why an [`Executor`] could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// An embedding program gave a handler for a topic no `[[handlers]]` entry covers.
    #[error(
        "a handler is given for topic {0:?}, but no [[handlers]] entry covers it \
         (the entry says how its events are read, retried and dead-lettered)"
    )]
    Uncovered(String),
    /// A configured handler could not be built.
    #[error("{0}")]
    Handler(#[from] handler::BuildError),
    /// The dead-letter producer could not be created.
    #[error("{0}")]
    DeadLetters(#[from] crate::kafka::KafkaError),
    /// The schema registry client could not be set up.
    #[error("{0}")]
    Registry(#[from] avro::RegistrySetupError),
}

/// Debug builds only (compiled out of release builds): a bug to contain, for the
/// tests that check a panic cannot stall a key or a partition.
#[cfg(debug_assertions)]
fn inject_panic(event_id: &str) {
    if std::env::var("OUTBOXD_DEBUG_PANIC_ON_EVENT").is_ok_and(|id| id == event_id) {
        panic!("injected for event {event_id} (OUTBOXD_DEBUG_PANIC_ON_EVENT)");
    }
}

#[cfg(test)]
mod when_tests {
    use super::{holds, OutboxEvent, RawMessage};
    use crate::config::testing::parse;
    use crate::event::{Json, Payload, Position};

    fn event(payload: &str) -> (OutboxEvent, RawMessage) {
        let position = Position { topic: "o".into(), partition: 0, offset: 0 };
        let payload = Payload::Json(Json::from(serde_json::from_str::<serde_json::Value>(payload).unwrap()));
        let msg = RawMessage {
            topic: "o".into(),
            partition: 0,
            offset: 0,
            key: None,
            value: None,
            headers: vec![("tenant".into(), Some(b"acme".to_vec())), ("empty".into(), None)],
            timestamp_ms: None,
        };
        (OutboxEvent::new("e1", payload, position), msg)
    }

    fn holds_for(when: &str, payload: &str) -> bool {
        let c = parse(&format!("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers.when]]\n{when}\n")).unwrap();
        let (e, m) = event(payload);
        holds(&c.handlers[0].when[0], &e, &m)
    }

    #[test]
    fn a_condition_compares_a_header_or_a_field_with_one_of_its_values() {
        let p = r#"{"status":"paid","n":3,"ok":true,"customer":{"tier":"gold"},"none":null,"list":[1]}"#;
        assert!(holds_for("header = \"tenant\"\nequals = \"acme\"", p));
        assert!(!holds_for("header = \"tenant\"\nequals = \"other\"", p));
        assert!(!holds_for("header = \"empty\"\nequals = \"\"", p), "a header without a value has no text");
        assert!(!holds_for("header = \"missing\"\nequals = \"acme\"", p));
        assert!(holds_for("field = \"status\"\nequals = [\"refunded\", \"paid\"]", p));
        assert!(holds_for("field = \"customer.tier\"\nequals = \"gold\"", p));
        assert!(holds_for("field = \"n\"\nequals = \"3\"", p), "a number as its JSON text");
        assert!(holds_for("field = \"ok\"\nequals = \"true\"", p));
        for path in ["none", "list", "customer", "absent", "status.deeper"] {
            assert!(!holds_for(&format!("field = \"{path}\"\nequals = \"null\""), p), "{path}");
        }
    }
}
