//! The consumer: building and subscribing it, rebalance callbacks that keep the
//! offset tracker in step, turning messages into [`RawMessage`]s, storing and
//! committing offsets.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::health::{is_connection_error, BrokerHealth};
use super::source::{RecvError, Source};
use crate::config::KafkaConfig;
use crate::event::RawMessage;
use crate::metrics::names;
pub use crate::offsets::Tracker;
use crate::offsets::{describe, PartitionId, PartitionName};

/// Keeps the offset tracker in step with assignments.
struct Ctx {
    tracker: Tracker,
    /// The brokers' reachability (readiness, the log's outage lines): this consumer's
    /// errors, statistics and assignments decide it.
    health: Arc<BrokerHealth>,
    /// How long a revoke waits for running events of the revoked partitions.
    drain_timeout: Duration,
    /// Told when partitions were assigned that must be restored first (changelog on).
    restore_wakeup: Arc<tokio::sync::Notify>,
}

/// librdkafka's log facilities that say the group may have given our partitions
/// to another member: the session timed out, or the poll interval was exceeded.
const PARTITIONS_MAY_BE_GONE: [&str; 2] = ["SESSTMOUT", "MAXPOLL"];

/// How long the request that wakes a resumed partition's fetcher may wait for its answer.
const WAKE_TIMEOUT: Duration = Duration::from_millis(200);

/// Names this client in log lines and in `outboxd_broker_connection_errors_total`.
const CLIENT: &str = "consumer";

impl ClientContext for Ctx {
    /// librdkafka's log lines, as tracing events (target `librdkafka`). A session
    /// timeout or an exceeded poll interval also fences every partition. rdkafka
    /// delivers log lines through the consumer's queue, so this runs inside a poll:
    /// the line comes before the lost revoke that follows it, one poll earlier,
    /// and no later than the loop polls (every `BEAT` at least; a loop that did not
    /// poll would learn of it only when it polled again).
    ///
    /// The line itself goes through the brokers' [`BrokerHealth`], like every client's:
    /// a failed connection is a debug line there, summarized with the others.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if PARTITIONS_MAY_BE_GONE.contains(&fac) {
            self.tracker.raise_alarm();
        }
        self.health.log(CLIENT, level, fac, log_message);
    }

    /// librdkafka's errors: a connection error is counted and summarized by the
    /// brokers' [`BrokerHealth`], where this consumer's "all brokers are down" makes
    /// them unreachable; any other error is logged.
    fn error(&self, error: RdError, reason: &str) {
        self.health.error(CLIENT, true, &error, reason);
    }

    /// librdkafka's statistics (every `statistics.interval.ms`): lag and committed
    /// offsets per assigned partition, and broker connectivity (a broker connection
    /// up: the brokers are reachable; and the outage summary is due on time).
    fn stats(&self, stats: rdkafka::Statistics) {
        if stats.brokers.values().any(|b| b.nodeid >= 0 && b.state == "UP") {
            self.health.reached();
        }
        self.health.tick();
        for (topic, t) in &stats.topics {
            for (id, p) in &t.partitions {
                if *id < 0 || !p.desired {
                    continue;
                }
                let offsets = crate::offsets::BrokerOffsets {
                    committed: p.committed_offset,
                    end: p.hi_offset,
                    lag: p.consumer_lag,
                };
                self.tracker.lock().broker_offsets(&PartitionId::new(topic.clone(), *id), offsets);
                let labels = [("topic", topic.clone()), ("partition", id.to_string())];
                if p.consumer_lag >= 0 {
                    metrics::gauge!(names::LAG, &labels).set(p.consumer_lag as f64);
                }
                if p.committed_offset >= 0 {
                    metrics::gauge!(names::COMMITTED, &labels).set(p.committed_offset as f64);
                }
            }
        }
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            // librdkafka calls this from the poll, on a runtime worker: waiting for the
            // running events there would block that worker (with one worker, every
            // event it should let finish), so the wait moves off the runtime's workers.
            off_the_workers(|| self.revoke(consumer, tpl));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let pause = |_: &[PartitionId]| {
                    if let Err(error) = consumer.pause(tpl) {
                        warn!(%error, partitions = %describe(&partitions(tpl)),
                            "could not pause partitions to restore; their events wait for the restore");
                    }
                };
                super::source::assigned(&self.tracker, &partitions(tpl), pause, &self.restore_wakeup);
                // An assignment came through the group coordinator: the broker is reachable.
                self.health.reached();
            }
            Rebalance::Error(error) => warn!(%error, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

impl Ctx {
    /// Lets running events of the revoked partitions finish (bounded by the drain
    /// timeout), commits what finished, and forgets the partitions.
    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let commit = |finished: &[(PartitionId, i64)]| {
            if let Err(error) = consumer.commit(&to_tpl(finished), CommitMode::Sync) {
                warn!(%error, "commit on revoke failed; the next owner re-reads from the last commit (duplicates are absorbed)");
            }
        };
        super::source::revoked(&self.tracker, &partitions(tpl), consumer.assignment_lost(), self.drain_timeout, commit);
    }
}

/// Runs `wait`, a call that blocks, so that it does not hold a runtime worker
/// (the poll loop runs on one): the worker's other tasks move to another thread
/// meanwhile. Outside a multi-threaded runtime it simply runs.
fn off_the_workers<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<PartitionId> {
    tpl.elements().iter().map(|e| PartitionId::new(e.topic(), e.partition())).collect()
}

fn to_list(partitions: &[PartitionId]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(&p.topic, p.partition);
    }
    tpl
}

fn to_tpl(offsets: &[(PartitionId, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in offsets {
        add_offset(&mut tpl, partition, *offset);
    }
    tpl
}

/// Adds `partition`'s next offset to commit to `tpl`.
fn add_offset(tpl: &mut TopicPartitionList, partition: &dyn PartitionName, next: i64) {
    // An offset from our own tracker is always valid for the list.
    let _ = tpl.add_partition_offset(partition.topic(), partition.number(), Offset::Offset(next));
}

/// How long one poll of [`Source::leave`] waits for the revoke.
const LEAVE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The subscribed consumer. Offsets are stored by us only after an event is
/// durably finished; librdkafka commits what was stored.
pub struct Consumer {
    inner: StreamConsumer<Ctx>,
    /// What it subscribed to (a rejoin subscribes again).
    topics: Vec<String>,
}

impl Consumer {
    /// Builds and subscribes the consumer. Assignments and revokes update
    /// `tracker`; its errors, statistics and assignments keep the brokers'
    /// [`BrokerHealth`] (readiness) current.
    pub fn build(
        kafka: &KafkaConfig,
        subscriptions: &[String],
        tracker: Tracker,
    ) -> Result<Consumer, super::KafkaError> {
        let inner: StreamConsumer<Ctx> = super::options::consumer(kafka).create_with_context(Ctx {
            tracker,
            health: BrokerHealth::of(kafka),
            drain_timeout: kafka.drain_timeout,
            restore_wakeup: Arc::default(),
        })?;
        let topics: Vec<&str> = subscriptions.iter().map(String::as_str).collect();
        inner.subscribe(&topics)?;
        Ok(Consumer { inner, topics: subscriptions.to_vec() })
    }

    /// Resumes `partitions`; false (and a warning) when librdkafka refused.
    fn resumed(&self, partitions: &[PartitionId]) -> bool {
        let resumed = self.inner.resume(&to_list(partitions));
        if let Err(error) = &resumed {
            warn!(%error, partitions = %describe(partitions), "could not resume partitions");
        }
        resumed.is_ok()
    }

    /// What [`Source::recv`] returns for what librdkafka gave.
    fn received(&self, received: Result<BorrowedMessage<'_>, RdError>) -> Result<RawMessage, RecvError> {
        match received {
            Ok(m) => Ok(to_raw(&m)),
            Err(RdError::MessageConsumptionFatal(code)) => {
                // The event carries only "fatal"; the client knows which error it was.
                let (code, reason) = self.inner.client().fatal_error().unwrap_or((code, code.to_string()));
                Err(RecvError::Fatal(match code {
                    RDKafkaErrorCode::FencedInstanceId => format!(
                        "{reason} (another consumer joined the group with this one's group.instance.id; give every instance its own)"
                    ),
                    _ => format!("{reason} ({code:?})"),
                }))
            }
            Err(e @ RdError::MessageConsumption(RDKafkaErrorCode::PollExceeded)) => {
                Err(RecvError::PollExceeded(e.to_string()))
            }
            Err(e) => Err(RecvError::Transient(e.to_string())),
        }
    }
}

#[async_trait::async_trait]
impl Source for Consumer {
    /// The next message. Rebalance callbacks run inside this call. A connection error
    /// is not returned: librdkafka retries by itself, and the brokers' [`BrokerHealth`]
    /// has counted it and says what the log needs to say.
    async fn recv(&self) -> Result<RawMessage, RecvError> {
        loop {
            match self.inner.recv().await {
                Err(RdError::MessageConsumption(code)) if is_connection_error(code) => {}
                received => return self.received(received),
            }
        }
    }

    /// What librdkafka fetched of them already is dropped and fetched again on resume.
    fn pause(&self, partitions: &[PartitionId]) {
        if let Err(error) = self.inner.pause(&to_list(partitions)) {
            warn!(%error, partitions = %describe(partitions), "could not pause partitions; their messages wait in memory");
        }
    }

    fn resume(&self, partitions: &[PartitionId]) {
        self.resumed(partitions);
    }

    /// librdkafka does not wake its fetcher when a partition resumes: the broker
    /// thread looks at its partitions again only when something else wakes it, up
    /// to a second later when it fetches nothing else (`rd_kafka_max_block_ms` in
    /// rdkafka_broker.c). After a restore that second was a third of a failover's
    /// time beside the restore. A watermark request to each partition's leader
    /// wakes that broker's thread, which then fetches the partition at once. Only
    /// here: the poll loop resumes (read-ahead had room again, a circuit closed) up
    /// to once per slow event, and a request per partition each time would hold the
    /// loop for a round trip per partition and add as many requests to the broker;
    /// the slow-receiver scenario, one run each way, did not tell them apart.
    fn resume_restored(&self, partitions: &[PartitionId]) {
        if !self.resumed(partitions) {
            return;
        }
        off_the_workers(|| {
            for p in partitions {
                // Only a wake-up: a broker that does not answer soon leaves the fetch
                // to its next look, as before; the rest are not asked either.
                if self.inner.fetch_watermarks(&p.topic, p.partition, WAKE_TIMEOUT).is_err() {
                    break;
                }
            }
        });
    }

    /// After a fence (a gap in polling), ownership of every partition is confirmed
    /// again by a fresh assignment (or the partitions go to their new owner) rather
    /// than assumed.
    fn rejoin(&self) {
        warn!("leaving and rejoining the consumer group so that the fenced partitions are assigned afresh");
        self.inner.unsubscribe();
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        if let Err(error) = self.inner.subscribe(&topics) {
            // librdkafka only refuses a subscription it accepted before for a bad topic list.
            error!(%error, "could not subscribe again after leaving the group");
        }
    }

    /// librdkafka commits stored offsets every `kafka.commit_interval`.
    fn store_offset(&self, partition: &dyn PartitionName, next: i64) {
        let mut tpl = TopicPartitionList::with_capacity(1);
        add_offset(&mut tpl, partition, next);
        if let Err(error) = self.inner.store_offsets(&tpl) {
            // Happens when the partition was revoked meanwhile; its next owner re-reads.
            warn!(%error, topic = partition.topic(), partition = partition.number(), next, "could not store offset");
        }
    }

    fn commit_now(&self, offsets: &[(PartitionId, i64)]) {
        if offsets.is_empty() {
            return;
        }
        // A synchronous commit waits for the coordinator: not on a runtime worker.
        match off_the_workers(|| self.inner.commit(&to_tpl(offsets), CommitMode::Sync)) {
            Ok(()) => info!(partitions = offsets.len(), "final offsets committed"),
            Err(error) => warn!(%error, "final commit failed; finished events will be redelivered and suppressed"),
        }
    }

    fn restore_wakeup(&self) -> Arc<tokio::sync::Notify> {
        self.inner.context().restore_wakeup.clone()
    }

    /// Unsubscribes and polls until the revoke has given every partition back. librdkafka
    /// can hang in its close when an assignment arrives while it closes (seen here as a
    /// process that logged `outboxd stopped` and never exited; librdkafka#4527 and
    /// #4884 name the same close): with nothing assigned and no subscription, the close
    /// that follows has nothing of the group left to do. A message fetched before the
    /// unsubscribe is dropped unhandled: its offset was never stored, its next owner
    /// reads it.
    async fn leave(&self, within: std::time::Duration) {
        self.inner.unsubscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let assigned = self.inner.assignment().map_or(0, |a| a.count());
            if assigned == 0 {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                warn!(assigned, ?within, "the group did not take the partitions back before the client closes");
                return;
            }
            // The revoke runs inside the poll.
            match tokio::time::timeout(LEAVE_POLL, self.inner.recv()).await {
                // A failed client gives nothing back any more; its close is all there is.
                Ok(Err(RdError::MessageConsumptionFatal(_))) => return,
                Ok(Err(_)) => tokio::time::sleep(LEAVE_POLL).await,
                Ok(Ok(_)) | Err(_) => {}
            }
        }
    }
}

/// A consumed Kafka message as outboxd's decoder takes it (owned bytes, headers in order).
pub fn to_raw(m: &BorrowedMessage<'_>) -> RawMessage {
    RawMessage {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers: m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default(),
        timestamp_ms: m.timestamp().to_millis(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A revoke waits for the running events of its partitions. When the poll loop
    /// runs on a runtime worker (outboxd embedded as a library, the engine spawned as a
    /// task) and that is the only worker, the wait must not hold the worker: the event
    /// it waits for could never finish, and every revoke would give up on it.
    #[test]
    fn a_revoke_on_the_only_runtime_worker_lets_the_running_event_finish() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let tracker = Tracker::default();
        let partition: PartitionId = PartitionId::new("t", 0);
        let generation = {
            let mut t = tracker.lock();
            let g = t.assign(partition.clone());
            t.consumed(&partition, g, 0);
            assert!(t.start_running(&partition, g));
            g
        };
        let ctx = Ctx {
            tracker: tracker.clone(),
            health: Arc::new(BrokerHealth::new("127.0.0.1:9", Duration::from_secs(30))),
            drain_timeout: Duration::from_secs(3),
            restore_wakeup: Arc::default(),
        };
        let consumer: BaseConsumer<Ctx> = rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("group.id", "revoke-test")
            // Nothing listens there: the commit on revoke fails after this instead of 45 s.
            .set("session.timeout.ms", "1000")
            .set("heartbeat.interval.ms", "100")
            .create_with_context(ctx)
            .unwrap();
        let finished = Arc::new(AtomicBool::new(false));
        let finished_before_revoke_ended = runtime.block_on(async {
            // The running event: it needs the runtime (a timer) to finish.
            let (event_tracker, event_partition, event_finished) =
                (tracker.clone(), partition.clone(), finished.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                event_tracker.lock().finish(&event_partition, generation, 0);
                event_finished.store(true, Ordering::SeqCst);
            });
            // The poll loop, on the only worker, receives the revoke.
            let poll_finished = finished.clone();
            tokio::spawn(async move {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition("t", 0);
                consumer.context().pre_rebalance(&consumer, &Rebalance::Revoke(&tpl));
                poll_finished.load(Ordering::SeqCst)
            })
            .await
            .unwrap()
        });
        assert!(finished_before_revoke_ended, "the revoke gave up before the event it waited for could finish");
    }
}
