//! The Kafka edge: building the consumer, rebalance callbacks, turning
//! messages into [`RawMessage`]s, storing and committing offsets. rdkafka is
//! used only here (and in the poll loop that calls `recv`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{info, warn};

use crate::config::KafkaConfig;
use crate::event::RawMessage;
use crate::metrics::names;
use crate::offsets::{describe, OffsetTracker, PartitionId};

pub type Tracker = Arc<Mutex<OffsetTracker>>;
pub type KafkaConsumer = StreamConsumer<Ctx>;

/// Keeps the offset tracker in step with assignments.
pub struct Ctx {
    tracker: Tracker,
    /// Whether librdkafka's last statistics showed a broker connection up (readiness).
    pub broker_up: Arc<AtomicBool>,
    /// How long a revoke waits for running events of the revoked partitions.
    drain_timeout: Duration,
}

/// How often a revoke looks whether running events have finished.
const REVOKE_POLL: Duration = Duration::from_millis(10);

impl ClientContext for Ctx {
    /// librdkafka's statistics (every `statistics.interval.ms`): lag and committed
    /// offsets per assigned partition, and broker connectivity.
    fn stats(&self, stats: rdkafka::Statistics) {
        let up = stats.brokers.values().any(|b| b.nodeid >= 0 && b.state == "UP");
        self.broker_up.store(up, Ordering::Relaxed);
        for (topic, t) in &stats.topics {
            for (id, p) in &t.partitions {
                if *id < 0 || !p.desired {
                    continue;
                }
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
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(|| self.revoke(consumer, tpl));
                }
                _ => self.revoke(consumer, tpl),
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions(tpl);
                let mut tracker = self.tracker.lock().expect("offset tracker lock");
                for p in &assigned {
                    tracker.assign(p.clone());
                }
                // An assignment came through the group coordinator: the broker is reachable.
                self.broker_up.store(true, Ordering::Relaxed);
                info!(partitions = %describe(&assigned), "partitions assigned");
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
        let revoked = partitions(tpl);
        let lost = consumer.assignment_lost();
        // No new event starts in these partitions; running ones may finish
        // (bounded by the drain timeout) so their offsets can be committed.
        let mut running = self.tracker.lock().expect("offset tracker lock").start_revoke(&revoked);
        if running > 0 && !lost {
            info!(partitions = %describe(&revoked), running, drain_timeout = ?self.drain_timeout,
                "revoking: waiting for running events to finish");
        }
        let deadline = Instant::now() + self.drain_timeout;
        while running > 0 && !lost && Instant::now() < deadline {
            std::thread::sleep(REVOKE_POLL);
            running = self.tracker.lock().expect("offset tracker lock").running(&revoked);
        }
        let mut tracker = self.tracker.lock().expect("offset tracker lock");
        let finished: Vec<_> = tracker.committable().into_iter().filter(|(p, _)| revoked.contains(p)).collect();
        if lost {
            // Another member may own them already: committing could move its offsets.
            warn!(partitions = %describe(&revoked), "partitions lost; not committing for them");
        } else if !finished.is_empty() {
            if let Err(error) = consumer.commit(&to_tpl(&finished), CommitMode::Sync) {
                warn!(%error, "commit on revoke failed; the next owner re-reads from the last commit (duplicates are absorbed)");
            }
        }
        for p in &revoked {
            tracker.revoke(p);
        }
        info!(partitions = %describe(&revoked), still_running = running, "partitions revoked");
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<PartitionId> {
    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

pub fn to_tpl(offsets: &[(PartitionId, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in offsets {
        // An offset from our own tracker is always valid for the list.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    tpl
}

/// Why an event went to the dead-letter topic, added to the message as `outboxd.*` headers.
pub struct DeadLetterInfo<'a> {
    pub error: &'a str,
    pub attempts: u32,
}

/// Produces dead letters: the original key, value and headers plus the reason.
pub struct DeadLetters {
    producer: FutureProducer,
}

impl DeadLetters {
    pub fn build(kafka: &KafkaConfig) -> anyhow::Result<DeadLetters> {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &kafka.brokers).set("client.id", "outboxd-dlq");
        for (k, v) in &kafka.options {
            // Security and connection settings apply to the producer too; consumer-only
            // settings would only produce warnings.
            if k.starts_with("security.")
                || k.starts_with("ssl.")
                || k.starts_with("sasl.")
                || k.starts_with("socket.")
                || k.starts_with("broker.")
                || k == "client.dns.lookup"
            {
                cc.set(k, v);
            }
        }
        // The broker (topic max.message.bytes) decides how large a dead letter may be,
        // not librdkafka's 1 MB default: a large poison message must still get out.
        cc.set("enable.idempotence", "true").set("acks", "all").set("message.max.bytes", "104857600");
        Ok(DeadLetters { producer: cc.create()? })
    }

    /// Sends and waits for the broker's acknowledgement; returns `topic/partition@offset`.
    pub async fn send(&self, topic: &str, msg: &RawMessage, info: &DeadLetterInfo<'_>) -> Result<String, DlqError> {
        let mut headers = OwnedHeaders::new_with_capacity(msg.headers.len() + 6);
        for (k, v) in &msg.headers {
            headers = headers.insert(Header { key: k, value: v.as_deref() });
        }
        let failed_at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let attempts = info.attempts.to_string();
        let partition = msg.partition.to_string();
        let offset = msg.offset.to_string();
        for (k, v) in [
            ("outboxd.error", info.error),
            ("outboxd.attempts", attempts.as_str()),
            ("outboxd.source.topic", msg.topic.as_str()),
            ("outboxd.source.partition", partition.as_str()),
            ("outboxd.source.offset", offset.as_str()),
            ("outboxd.failed_at", failed_at.as_str()),
        ] {
            headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(key) = &msg.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &msg.value {
            record = record.payload(value.as_slice());
        }
        match self.producer.send(record, rdkafka::util::Timeout::Never).await {
            Ok(delivery) => Ok(format!("{topic}/{}@{}", delivery.partition, delivery.offset)),
            Err((error, _)) => {
                use rdkafka::types::RDKafkaErrorCode as C;
                let rejected = matches!(
                    error.rdkafka_error_code(),
                    Some(C::MessageSizeTooLarge | C::InvalidRecord | C::InvalidMessage | C::InvalidMessageSize)
                );
                Err(if rejected {
                    DlqError::Rejected(error.to_string())
                } else {
                    DlqError::Transient(error.to_string())
                })
            }
        }
    }
}

/// Why a dead letter was not produced.
#[derive(Debug)]
pub enum DlqError {
    /// Worth retrying (broker down, leader moving, ...): the offset waits.
    Transient(String),
    /// The broker will never take this message (e.g. larger than the topic allows).
    Rejected(String),
}

/// Lets librdkafka check `kafka.options` (names, values, files such as CA
/// certificates) by creating a client that is never used; nothing is sent.
pub fn validate_options(kafka: &KafkaConfig) -> anyhow::Result<()> {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &kafka.brokers).set("group.id", &kafka.group_id);
    for (k, v) in &kafka.options {
        cc.set(k, v);
    }
    let _: BaseConsumer = cc.create().map_err(|e| anyhow::anyhow!("kafka.options: librdkafka rejects them: {e}"))?;
    Ok(())
}

/// Builds and subscribes the consumer. Offsets are stored by us only after an
/// event is durably finished; librdkafka commits what was stored.
pub fn build(
    kafka: &KafkaConfig,
    subscriptions: &[String],
    tracker: Tracker,
    broker_up: Arc<AtomicBool>,
) -> anyhow::Result<KafkaConsumer> {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &kafka.brokers)
        .set("group.id", &kafka.group_id)
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("client.id", "outboxd")
        // Lag, committed offsets and broker state for /metrics and /readyz.
        .set("statistics.interval.ms", "2000")
        // Only the partitions that move are revoked; the others keep working.
        .set("partition.assignment.strategy", "cooperative-sticky")
        // At most max_in_flight events run at once; librdkafka's default prefetch
        // (up to 64 MiB and 100,000 messages per partition) only holds memory.
        .set("queued.max.messages.kbytes", "16384")
        .set("queued.min.messages", "10000")
        // ... and once it is full, fetch again soon instead of after librdkafka's 1 s
        // (a 1 s pause cost a third of the drain rate with the smaller prefetch).
        .set("fetch.queue.backoff.ms", "20");
    for (k, v) in &kafka.options {
        cc.set(k, v);
    }
    // Never overridable: these carry invariant 3.
    cc.set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", kafka.commit_interval.as_millis().max(1).to_string());
    let consumer: KafkaConsumer =
        cc.create_with_context(Ctx { tracker, broker_up, drain_timeout: kafka.drain_timeout })?;
    let topics: Vec<&str> = subscriptions.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    Ok(consumer)
}

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

/// Hands the next offset to commit to librdkafka (committed on its interval).
pub fn store_offset(consumer: &KafkaConsumer, partition: &PartitionId, next: i64) {
    if let Err(error) = consumer.store_offsets(&to_tpl(&[(partition.clone(), next)])) {
        // Happens when the partition was revoked meanwhile; its next owner re-reads.
        warn!(%error, topic = %partition.0, partition = partition.1, next, "could not store offset");
    }
}

/// Commits every finished offset now (shutdown).
pub fn commit_now(consumer: &KafkaConsumer, tracker: &Tracker) {
    let finished = tracker.lock().expect("offset tracker lock").committable();
    if finished.is_empty() {
        return;
    }
    match consumer.commit(&to_tpl(&finished), CommitMode::Sync) {
        Ok(()) => info!(partitions = finished.len(), "final offsets committed"),
        Err(error) => warn!(%error, "final commit failed; finished events will be redelivered and suppressed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A revoke waits for the running events of its partitions. When the poll loop
    /// runs on a runtime worker (outboxd embedded as a library, the engine spawned as a
    /// task) and that is the only worker, the wait must not hold the worker: the event
    /// it waits for could never finish, and every revoke would give up on it.
    #[test]
    fn a_revoke_on_the_only_runtime_worker_lets_the_running_event_finish() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let tracker: Tracker = Arc::default();
        let partition: PartitionId = ("t".to_owned(), 0);
        let generation = {
            let mut t = tracker.lock().unwrap();
            let g = t.assign(partition.clone());
            t.start(&partition, g, 0);
            assert!(t.begin(&partition, g));
            g
        };
        let ctx = Ctx { tracker: tracker.clone(), broker_up: Arc::default(), drain_timeout: Duration::from_secs(3) };
        let consumer: BaseConsumer<Ctx> = ClientConfig::new()
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
                event_tracker.lock().unwrap().finish(&event_partition, generation, 0);
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
