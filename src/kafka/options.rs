//! librdkafka client settings: what outboxd sets for its consumer and its
//! dead-letter producer, what `kafka.options` may add, and the check of those
//! options at `check-config`.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;

use super::KafkaError;
use crate::config::{ChangelogConfig, KafkaConfig};

/// Lets librdkafka check the consumer's settings, `kafka.options` with what
/// outboxd adds to them (names, values, how they combine, files such as CA
/// certificates), by creating a client that is never used; nothing is sent. The
/// service's consumer is made from the same settings, so what passes here starts.
pub fn validate_options(kafka: &KafkaConfig) -> Result<(), KafkaError> {
    let _: BaseConsumer = consumer(kafka).create().map_err(KafkaError::Options)?;
    Ok(())
}

/// The consumer's settings. Offsets are stored by us only after an event is
/// durably finished; librdkafka commits what was stored.
pub(super) fn consumer(kafka: &KafkaConfig) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &kafka.brokers)
        .set("group.id", &kafka.group_id)
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("client.id", "outboxd")
        // Lag, committed offsets and broker state for /metrics and /readyz.
        .set("statistics.interval.ms", "2000")
        // At most max_in_flight events run at once; librdkafka's default prefetch
        // (up to 64 MiB and 100,000 messages per partition) only holds memory.
        .set("queued.max.messages.kbytes", "16384")
        .set("queued.min.messages", "10000")
        // ... and once it is full, fetch again soon instead of after librdkafka's 1 s
        // (a 1 s pause cost a third of the drain rate with the smaller prefetch).
        .set("fetch.queue.backoff.ms", "20");
    if !kafka.consumer_protocol() {
        // Only the partitions that move are revoked; the others keep working. (The
        // consumer protocol of KIP-848 is incremental by itself, and the broker assigns.)
        cc.set("partition.assignment.strategy", "cooperative-sticky");
    }
    for (k, v) in &kafka.options {
        cc.set(k, v);
    }
    // Never overridable: these carry invariant 3.
    cc.set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", kafka.commit_interval.as_millis().max(1).to_string());
    cc
}

/// The dead-letter producer's settings.
pub(super) fn dead_letter_producer(kafka: &KafkaConfig) -> ClientConfig {
    let mut cc = connection(kafka, "outboxd-dlq");
    // The broker (topic max.message.bytes) decides how large a dead letter may be,
    // not librdkafka's 1 MB default: a large poison message must still get out.
    cc.set("enable.idempotence", "true").set("acks", "all").set("message.max.bytes", "104857600");
    cc
}

/// The changelog producer's settings: idempotent with acks=all, so a record the
/// broker acknowledged is on every in-sync replica, once, in order.
pub(super) fn changelog_producer(kafka: &KafkaConfig, changelog: &ChangelogConfig) -> ClientConfig {
    let mut cc = connection(kafka, "outboxd-changelog");
    cc.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", changelog.linger.as_millis().to_string())
        .set("message.timeout.ms", changelog.delivery_timeout.as_millis().max(1).to_string())
        // Records of ~80 bytes with similar keys: lz4 shrinks batches cheaply.
        .set("compression.type", "lz4")
        // A deleted changelog topic must not come back with the broker's default
        // partition count: outboxd creates them, with the source's count.
        .set("allow.auto.create.topics", "false");
    cc
}

/// The restore consumer's `fetch.queue.backoff.ms` (see `restore_consumer`).
const RESTORE_FETCH_QUEUE_BACKOFF_MS: u32 = 5;

/// The settings of the consumer that reads changelog partitions while restoring:
/// assigned by hand, never joins the group, never commits, and prefetches at most
/// `prefetch_bytes` (librdkafka's default is 64 MiB: a restore's memory would
/// be bounded by that, not by its batch).
pub(super) fn restore_consumer(kafka: &KafkaConfig, prefetch_bytes: u64) -> ClientConfig {
    let mut cc = connection(kafka, "outboxd-restore");
    cc.set("queued.max.messages.kbytes", (prefetch_bytes / 1024).max(1).to_string());
    // With the prefetch full, librdkafka postpones the next fetch by this much (1 s by
    // default): a restore applies slower than it fetches, so the queue is full often,
    // and each second-long pause left the applier waiting with the queue drained
    // (4 s of a 10 s restore of 1.2M records). A fetch a few ms after the queue has
    // room keeps it fed.
    cc.set("fetch.queue.backoff.ms", RESTORE_FETCH_QUEUE_BACKOFF_MS.to_string());
    cc.set("group.id", format!("{}.outboxd-restore", kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    cc
}

/// A consumer that reads single messages of the source topics again by their
/// position (`outboxd store replay`): assigned by hand, it never joins the group
/// nor commits, and a position the topic no longer holds is an error, not a jump
/// to another offset.
pub(super) fn reread_consumer(kafka: &KafkaConfig) -> ClientConfig {
    let mut cc = connection(kafka, "outboxd-replay");
    cc.set("group.id", format!("{}.outboxd-replay", kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "error");
    cc
}

/// The admin client's settings (changelog topics).
pub(super) fn admin(kafka: &KafkaConfig) -> ClientConfig {
    connection(kafka, "outboxd-admin")
}

/// Brokers, and the security and connection settings of `kafka.options` (other
/// consumer settings would only produce warnings in other clients).
fn connection(kafka: &KafkaConfig, client_id: &str) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &kafka.brokers).set("client.id", client_id);
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
    cc
}
