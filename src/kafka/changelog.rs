//! Changelog topics (`[store.changelog]`): one per source topic, with its
//! partition count, compacted and deleted after `store.retention`; and the
//! producer that writes final records there (the store's
//! `store::changelog::Sink`). A record goes to the changelog
//! partition equal to its source partition: Debezium keys by aggregate id, so a
//! replayed event lands in the partition whose changelog holds its record.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, NewTopic, OwnedResourceSpecifier, ResourceSpecifier, TopicReplication,
};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::Message as _;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::{debug, info, warn};

use super::health::{serving_events, BrokerHealth, ClientCtx};
use super::KafkaError;
use crate::config::{ChangelogConfig, Config, KafkaConfig};
use crate::store::changelog::mac::{self, Keys};
use crate::store::changelog::{Acked, Delivered, Entry, SendError, SendFuture, Settling, Sink};

/// How long a metadata request or a topic creation may take at start-up.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker's `delete.retention.ms` when a topic does not set it (24 h).
const DEFAULT_DELETE_RETENTION_MS: i64 = 86_400_000;
/// First pause, and the longest, between sends of a changelog record that failed.
const RESEND_INITIAL: Duration = Duration::from_millis(200);
const RESEND_MAX: Duration = Duration::from_secs(10);

/// Why changelog topics are not ready.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// An existing changelog topic cannot serve its source topic: a person must act.
    #[error("{0}")]
    Mismatch(String),
    /// The brokers could not be asked or refused (worth trying again).
    #[error("{0}")]
    Other(#[from] super::KafkaError),
}

impl From<ClientError> for TopicError {
    fn from(e: ClientError) -> TopicError {
        TopicError::Other(e.into())
    }
}

/// What the brokers have for each source topic outboxd reads now.
#[derive(Debug, Default)]
pub struct Plan {
    /// (source topic, changelog topic, partitions) of changelog topics that exist with the right count.
    pub existing: Vec<(String, String, i32)>,
    /// The same for those to create.
    pub create: Vec<(String, String, i32)>,
    /// Why an existing changelog topic cannot serve its source topic.
    pub mismatched: Vec<String>,
    /// What in an existing changelog topic's settings works, but worse than it could.
    pub warnings: Vec<String>,
}

/// Partition counts of every topic on the cluster.
fn partition_counts(
    kafka: &KafkaConfig,
    topics: Option<&[String]>,
    timeout: Duration,
) -> Result<BTreeMap<String, i32>, KafkaError> {
    let client: BaseConsumer<ClientCtx> =
        super::options::admin(kafka).create_with_context(ClientCtx::new(kafka, "admin"))?;
    let mut counts = BTreeMap::new();
    let mut take = |md: rdkafka::metadata::Metadata| {
        for t in md.topics() {
            if t.error().is_none() && !t.partitions().is_empty() {
                counts.insert(t.name().to_owned(), t.partitions().len() as i32);
            }
        }
    };
    let health = client.context().health().clone();
    let metadata = |topic: Option<&str>| {
        // The request serves none of the client's events: a refused connection is
        // reported (once) while it waits, rather than only when the wait is over.
        let answer = serving_events(&client, || client.fetch_metadata(topic, timeout));
        match &answer {
            Ok(_) => health.reached(),
            Err(error) => health.request_failed("admin", error),
        }
        answer
    };
    match topics {
        None => take(metadata(None)?),
        Some(names) => {
            for name in names {
                take(metadata(Some(name))?);
            }
        }
    }
    Ok(counts)
}

/// The changelog topics the source topics of `config` need (those that exist now;
/// a source topic created later is looked at when one of its partitions is assigned).
pub fn plan(config: &Config, changelog: &ChangelogConfig, timeout: Duration) -> Result<Plan, KafkaError> {
    let counts = partition_counts(&config.kafka, None, timeout)?;
    let sources: Vec<(&String, i32)> = counts
        .iter()
        .filter(|(t, _)| config.handler_for(t).is_some() && !changelog.is_changelog(t))
        .map(|(t, n)| (t, *n))
        .collect();
    let mut plan = plan_for(changelog, &sources, &counts);
    check_settings(&config.kafka, config.store.retention, &mut plan, timeout)?;
    Ok(plan)
}

/// Looks at the settings of the existing changelog topics of `plan`: one that
/// deletes records before `store.retention` is over cannot serve (a new owner
/// would not know those events as handled); one that is not compacted works, but
/// keeps every write, so restores read more.
fn check_settings(
    kafka: &KafkaConfig,
    retention: Duration,
    plan: &mut Plan,
    timeout: Duration,
) -> Result<(), KafkaError> {
    if plan.existing.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<ClientCtx> =
        super::options::admin(kafka).create_with_context(ClientCtx::new(kafka, "admin"))?;
    let specifiers: Vec<ResourceSpecifier<'_>> =
        plan.existing.iter().map(|(_, name, _)| ResourceSpecifier::Topic(name)).collect();
    let options = AdminOptions::new().request_timeout(Some(timeout));
    // The admin client's own thread completes the future: no runtime needed.
    let described = futures::executor::block_on(admin.describe_configs(&specifiers, &options))?;
    let mut by_name = BTreeMap::new();
    for result in described {
        let resource =
            result.map_err(|code| KafkaError::Refused { what: "describing the changelog topics".into(), code })?;
        if let OwnedResourceSpecifier::Topic(name) = &resource.specifier {
            by_name.insert(name.clone(), resource);
        }
    }
    for (source, name, _) in &plan.existing {
        let resource = by_name
            .get(name)
            .ok_or_else(|| KafkaError::Missing(format!("the brokers did not describe changelog topic {name}")))?;
        let value = |key: &str| resource.get(key).and_then(|e| e.value.clone());
        let policy = value("cleanup.policy");
        let judged = judge_settings(name, source, policy.as_deref(), value("retention.ms"), retention);
        match judged {
            Judged::Refused(reason) => plan.mismatched.push(reason),
            Judged::Worse(warning) => plan.warnings.push(warning),
            Judged::Fits => {}
        }
        if let Judged::Worse(warning) =
            judge_tombstones(name, source, policy.as_deref(), value("delete.retention.ms"), retention)
        {
            plan.warnings.push(warning);
        }
    }
    Ok(())
}

/// What an existing changelog topic's settings mean for the records in it.
#[derive(Debug, PartialEq)]
enum Judged {
    /// Nothing to say.
    Fits,
    /// It works, but worse than it could (the warning to log).
    Worse(String),
    /// Records would leave Kafka while they still count: it cannot serve (why).
    Refused(String),
}

/// What a changelog topic's `cleanup.policy` and `retention.ms` mean for the
/// records in it: refused when records would leave Kafka before `store.retention`
/// is over, a warning when it is not compacted.
fn judge_settings(
    name: &str,
    source: &str,
    policy: Option<&str>,
    retention_ms: Option<String>,
    retention: Duration,
) -> Judged {
    let policy = policy.unwrap_or("delete");
    let policies: Vec<&str> = policy.split(',').map(str::trim).collect();
    let wanted = retention.as_millis();
    if policies.contains(&"delete") {
        let kept = retention_ms.as_deref().and_then(|v| v.parse::<i64>().ok()).unwrap_or(-1);
        if kept >= 0 && (kept as u128) < wanted {
            return Judged::Refused(format!(
                "changelog topic {name} (for {source}) deletes records after retention.ms={kept}, but store.retention \
                 is {wanted} ms: records would leave Kafka while they still count, and a new owner of a partition \
                 would run those events again. Raise its retention.ms to at least {wanted} (kafka-configs.sh \
                 --alter --entity-type topics --entity-name {name} --add-config retention.ms={wanted}) or lower \
                 store.retention"
            ));
        }
    }
    if !policies.contains(&"compact") {
        return Judged::Worse(format!(
            "changelog topic {name} (for {source}) has cleanup.policy={policy}, not compacted: it keeps every \
             write, so restores read more than the latest record of each event. outboxd creates its topics \
             with cleanup.policy=compact,delete"
        ));
    }
    Judged::Fits
}

/// What a compacted changelog topic's `delete.retention.ms` means for tombstones (a
/// `store forget`): compaction drops a tombstone that long after its partition was
/// cleaned, and an instance that read the forgotten record before but had not read
/// the tombstone by then (a standby, a long-stopped instance restoring from its
/// checkpoint) never learns of the repair: it keeps the record and suppresses the
/// redelivery the person asked for. Kept at least `store.retention`, a tombstone
/// outlives every record it can still stand against.
///
/// A warning, not a refusal: what is lost is a repair's reach, never a record (no
/// event runs twice for it), and every changelog topic created before outboxd set
/// this has the broker's default (24 h): refusing would stop each of them at once.
fn judge_tombstones(
    name: &str,
    source: &str,
    policy: Option<&str>,
    delete_retention_ms: Option<String>,
    retention: Duration,
) -> Judged {
    let compacted = policy.unwrap_or("delete").split(',').any(|p| p.trim() == "compact");
    let wanted = retention.as_millis();
    // The broker's default when it did not say: 24 h.
    let kept =
        delete_retention_ms.as_deref().and_then(|v| v.parse::<i64>().ok()).unwrap_or(DEFAULT_DELETE_RETENTION_MS);
    if compacted && kept >= 0 && (kept as u128) < wanted {
        return Judged::Worse(format!(
            "changelog topic {name} (for {source}) keeps tombstones for delete.retention.ms={kept}, less than \
             store.retention ({wanted} ms): a `store forget` can be compacted away before a standby or an instance \
             that was stopped reads it, and that instance then keeps the forgotten record. Raise it \
             (kafka-configs.sh --bootstrap-server <brokers> --alter --entity-type topics --entity-name {name} \
             --add-config delete.retention.ms={wanted}); outboxd creates its topics with it"
        ));
    }
    Judged::Fits
}

fn plan_for(changelog: &ChangelogConfig, sources: &[(&String, i32)], counts: &BTreeMap<String, i32>) -> Plan {
    let mut plan = Plan::default();
    for (source, n) in sources {
        let name = changelog.topic_for(source);
        match counts.get(&name) {
            None => plan.create.push(((*source).clone(), name, *n)),
            Some(m) if m == n => plan.existing.push(((*source).clone(), name, *n)),
            Some(m) => plan.mismatched.push(mismatch(source, *n, &name, *m)),
        }
    }
    plan
}

fn mismatch(source: &str, n: i32, changelog: &str, m: i32) -> String {
    let rule = format!(
        "changelog topic {changelog} has {m} partitions but source topic {source} has {n}; a record's changelog \
         partition is its source partition, so they must match"
    );
    if n > m {
        // Records stay where they were written: in the changelog partition of the key's old
        // source partition. Deleting the topic would lose them; adding partitions keeps them,
        // and what remains is that a replay of a moved key lands on a partition whose
        // changelog does not have its record, so it must be read by whoever owns the new one.
        format!(
            "{rule}. {source} gained partitions, so some keys moved to other partitions while their records stay in \
             their old partition's changelog. To go on: stop every outboxd of the group; add partitions to the changelog \
             topic to match (kafka-topics.sh --bootstrap-server <brokers> --alter --topic {changelog} --partitions {n}); \
             then, for at least store.retention, run either a single instance (it owns and restores every partition) or \
             every instance with [store.changelog] standby = true (each holds every partition's records), so that a \
             replay of an event from before the change is still recognised. Do not delete {changelog}: the records of \
             every handled event would go with it"
        )
    } else {
        format!(
            "{rule}. {source} has fewer partitions than its changelog, so it was deleted and created again: the records \
             of its old partitions cannot follow. To go on: stop every outboxd of the group, delete {changelog} \
             (kafka-topics.sh --bootstrap-server <brokers> --delete --topic {changelog}), empty every instance's store \
             directory, and start again (events replayed from before are then not known as handled)"
        )
    }
}

/// Creates the changelog topics `plan` lacks, compacted and deleted after
/// `retention`, keeping tombstones as long (`delete.retention.ms`, see
/// `judge_tombstones`); fails naming the topics when an existing one does not match.
pub async fn ensure(
    kafka: &KafkaConfig,
    changelog: &ChangelogConfig,
    retention: Duration,
    plan: &Plan,
) -> Result<(), TopicError> {
    if !plan.mismatched.is_empty() {
        return Err(TopicError::Mismatch(plan.mismatched.join("\n")));
    }
    for warning in &plan.warnings {
        warn!("{warning}");
    }
    if plan.create.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<ClientCtx> =
        super::options::admin(kafka).create_with_context(ClientCtx::new(kafka, "admin"))?;
    let retention_ms = retention.as_millis().to_string();
    let replication = changelog.replication_factor.unwrap_or(-1);
    let topics: Vec<NewTopic<'_>> = plan
        .create
        .iter()
        .map(|(_, name, n)| {
            NewTopic::new(name, *n, TopicReplication::Fixed(replication))
                .set("cleanup.policy", "compact,delete")
                .set("retention.ms", &retention_ms)
                .set("delete.retention.ms", &retention_ms)
        })
        .collect();
    let results = admin.create_topics(&topics, &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT))).await?;
    for result in results {
        match result {
            Ok(name) => info!(changelog_topic = %name, "changelog topic created"),
            // Another instance created it meanwhile: its partition count is checked below.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(KafkaError::Refused { what: format!("creating changelog topic {name}"), code }.into())
            }
        }
    }
    // Whoever created them, they must match now.
    let names: Vec<String> = plan.create.iter().map(|(_, name, _)| name.clone()).collect();
    let counts = partition_counts(kafka, Some(&names), ADMIN_TIMEOUT)?;
    for (source, name, n) in &plan.create {
        match counts.get(name) {
            Some(m) if m != n => return Err(TopicError::Mismatch(mismatch(source, *n, name, *m))),
            _ => {}
        }
    }
    Ok(())
}

/// The changelog topic of `source` exists with `partitions` partitions, or is
/// created now; an error names both topics and counts otherwise.
pub async fn ensure_one(
    kafka: &KafkaConfig,
    changelog: &ChangelogConfig,
    retention: Duration,
    source: &str,
) -> Result<(), TopicError> {
    let (kafka2, changelog2, source2) = (kafka.clone(), changelog.clone(), source.to_owned());
    let plan = tokio::task::spawn_blocking(move || -> Result<Plan, TopicError> {
        let names = vec![source2.clone(), changelog2.topic_for(&source2)];
        let counts = partition_counts(&kafka2, Some(&names), ADMIN_TIMEOUT)?;
        let Some(&n) = counts.get(&source2) else {
            return Err(KafkaError::Missing(format!("source topic {source2} has no partitions in the metadata")).into());
        };
        let mut plan = plan_for(&changelog2, &[(&source2, n)], &counts);
        check_settings(&kafka2, retention, &mut plan, ADMIN_TIMEOUT)?;
        Ok(plan)
    })
    .await
    .map_err(KafkaError::from)??;
    ensure(kafka, changelog, retention, &plan).await
}

/// How long a send waits before it tries a full client queue again.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(10);

/// Writes changelog records, waiting for the broker's acknowledgement.
pub struct ChangelogProducer {
    producer: Arc<ThreadedProducer<ChangelogCtx>>,
    /// Signs every record with `store.changelog.key` (when set).
    keys: Arc<Keys>,
    names: Arc<TopicNames>,
}

/// The changelog topic of each source topic, named once and shared by every
/// record sent there and every acknowledgement from there (`topic_for` builds a
/// `String`: two allocations per record otherwise).
struct TopicNames {
    changelog: ChangelogConfig,
    known: RwLock<Known>,
}

#[derive(Default)]
struct Known {
    /// Source topic → changelog topic.
    by_source: FxHashMap<Arc<str>, Arc<str>>,
    /// Every changelog topic named so far.
    names: FxHashSet<Arc<str>>,
}

impl TopicNames {
    fn new(changelog: &ChangelogConfig) -> TopicNames {
        TopicNames { changelog: changelog.clone(), known: RwLock::default() }
    }

    /// The changelog topic of `source`.
    fn of(&self, source: &str) -> Arc<str> {
        if let Some(name) = self.known.read().unwrap_or_else(PoisonError::into_inner).by_source.get(source) {
            return name.clone();
        }
        let name: Arc<str> = self.changelog.topic_for(source).into();
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        known.names.insert(name.clone());
        known.by_source.entry(source.into()).or_insert(name).clone()
    }

    /// `changelog_topic`'s shared name (a new one for a topic never sent to).
    fn shared(&self, changelog_topic: &str) -> Arc<str> {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        known.names.get(changelog_topic).cloned().unwrap_or_else(|| changelog_topic.into())
    }
}

/// The changelog producer's client context: the client's health and log lines,
/// and the delivery reports, which complete each entry's [`Settling`] on the
/// producer's polling thread (no future, no channel, no task per record).
struct ChangelogCtx {
    client: ClientCtx,
    names: Arc<TopicNames>,
}

impl ClientContext for ChangelogCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.client.log(level, fac, log_message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        self.client.error(error, reason);
    }
}

impl ProducerContext for ChangelogCtx {
    type DeliveryOpaque = Arc<Settling>;

    fn delivery(&self, result: &DeliveryResult<'_>, settling: Arc<Settling>) {
        settling.delivered(match result {
            Ok(m) => Delivered::Acked(Acked {
                changelog_topic: self.names.shared(m.topic()),
                partition: m.partition(),
                offset: m.offset(),
            }),
            Err((error, m)) => judge(error, m.topic(), m.partition(), self.client.health()),
        });
    }
}

/// What a failed attempt means: the partition is gone, the brokers refuse the
/// record for good, or it is worth sending again (said in the log once per attempt).
fn judge(error: &ClientError, topic: &str, partition: i32, health: &BrokerHealth) -> Delivered {
    if missing(error) {
        return Delivered::Failed(gone(topic, partition));
    }
    if fatal(error) {
        let changelog_topic = topic.to_owned();
        return Delivered::Failed(SendError::Refused { changelog_topic, partition, error: error.clone().into() });
    }
    if health.reachable() {
        warn!(%error, changelog_topic = %topic, partition,
            "changelog write failed; sending it again (the event's offset waits)");
    } else {
        // The outage has its own lines; every waiting record would repeat them.
        debug!(%error, changelog_topic = %topic, partition,
            "changelog write failed while the brokers are unreachable; sending it again");
    }
    Delivered::Again
}

impl ChangelogProducer {
    /// An idempotent producer with acks=all for the changelog topics of
    /// `changelog`, signing what it writes with its key.
    pub fn build(kafka: &KafkaConfig, changelog: &ChangelogConfig) -> Result<ChangelogProducer, KafkaError> {
        let client = ClientCtx::new(kafka, "changelog");
        let names = Arc::new(TopicNames::new(changelog));
        let context = ChangelogCtx { client, names: names.clone() };
        Ok(ChangelogProducer {
            producer: Arc::new(super::options::changelog_producer(kafka, changelog).create_with_context(context)?),
            keys: Arc::new(Keys::new(changelog)),
            names,
        })
    }

    /// Sends until the broker acknowledges (a transient failure is sent again after
    /// a pause: the event's offset waits); fails only when the broker will never
    /// take it or the producer is unusable. `failed_before`: an attempt already came
    /// back to be made again, so the partition is looked for and the pause taken first.
    fn resend(&self, entry: Entry, failed_before: bool) -> SendFuture {
        let topic = self.names.of(&entry.topic);
        let (producer, keys) = (self.producer.clone(), self.keys.clone());
        Box::pin(async move {
            // Whether the brokers are reachable: while they are not, a resend is no news.
            let health = health(&producer);
            let mut pause = RESEND_INITIAL;
            let mut failed = failed_before;
            loop {
                if failed {
                    // librdkafka may only time out on a topic deleted under it: ask, while the
                    // brokers can answer (unreachable ones could not say, and the question would
                    // hold a blocking thread for ADMIN_TIMEOUT after its caller gave up).
                    if health.reachable() && !exists(&producer, &topic, entry.partition).await {
                        return Err(gone(&topic, entry.partition));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RESEND_MAX);
                }
                let settling = Settling::delivery_only();
                let mut handed = settling.clone();
                while let Err(back) = produce(&producer, &topic, &entry, &keys, handed) {
                    handed = back;
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                match settling.settled().await.1 {
                    Delivered::Acked(acked) => return Ok(acked),
                    Delivered::Failed(error) => return Err(error),
                    Delivered::Again => failed = true,
                }
            }
        })
    }
}

/// The changelog client's view of the brokers.
fn health(producer: &ThreadedProducer<ChangelogCtx>) -> &BrokerHealth {
    use rdkafka::producer::Producer as _;
    producer.context().client.health()
}

/// Hands `entry` to the client once; `settling` hears what became of it. A full
/// client queue gives `settling` back untold (the caller waits and tries again).
fn produce(
    producer: &ThreadedProducer<ChangelogCtx>,
    topic: &str,
    entry: &Entry,
    keys: &Keys,
    settling: Arc<Settling>,
) -> Result<(), Arc<Settling>> {
    // The MAC covers the topic and partition it is sent to (set here, never left to a partitioner).
    let mac = keys.sign(topic, entry.partition, &entry.key, entry.value.as_deref());
    let mut record: BaseRecord<'_, [u8], [u8], Arc<Settling>> =
        BaseRecord::with_opaque_to(topic, settling).partition(entry.partition).key(entry.key.as_slice());
    if let Some(value) = &entry.value {
        record = record.payload(value.as_slice());
    }
    if let Some(mac) = &mac {
        record = record.headers(OwnedHeaders::new_with_capacity(1).insert(Header { key: mac::HEADER, value: Some(&mac[..]) }));
    }
    match producer.send(record) {
        Ok(()) => Ok(()),
        Err((error, record)) if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
            Err(record.delivery_opaque)
        }
        Err((error, record)) => {
            record.delivery_opaque.delivered(judge(&error, topic, entry.partition, health(producer)));
            Ok(())
        }
    }
}

impl Sink for ChangelogProducer {
    fn send(&self, entry: Entry) -> SendFuture {
        self.resend(entry, false)
    }

    /// One attempt; a full client queue is told as one to make again.
    fn send_settling(&self, entry: Entry, settling: Arc<Settling>) {
        let topic = self.names.of(&entry.topic);
        if let Err(settling) = produce(&self.producer, &topic, &entry, &self.keys, settling) {
            settling.delivered(Delivered::Again);
        }
    }

    /// After a failed attempt: the partition is looked for, and the pause taken, first.
    fn send_again(&self, entry: Entry) -> SendFuture {
        self.resend(entry, true)
    }
}

fn gone(topic: &str, partition: i32) -> SendError {
    SendError::Gone { changelog_topic: topic.to_owned(), partition }
}

/// Whether the broker still lists the changelog partition (true when it cannot be asked).
async fn exists(producer: &Arc<ThreadedProducer<ChangelogCtx>>, topic: &str, partition: i32) -> bool {
    let (producer, topic) = (producer.clone(), topic.to_owned());
    let answer = tokio::task::spawn_blocking(move || {
        use rdkafka::producer::Producer as _;
        let md = producer.client().fetch_metadata(Some(&topic), ADMIN_TIMEOUT).ok()?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let unknown = t.error() == Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
        // Other errors (no leader right now, ...) pass: the record is sent again.
        Some(!unknown && (t.error().is_some() || (partition as usize) < t.partitions().len()))
    })
    .await;
    answer.ok().flatten().unwrap_or(true)
}

/// The changelog topic or partition is not there (deleted, or fewer partitions).
fn missing(error: &ClientError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(error.rdkafka_error_code(), Some(C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownPartition))
}

/// Errors no resend can cure.
fn fatal(error: &ClientError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(
            C::Fatal
                | C::MessageSizeTooLarge
                | C::InvalidRecord
                | C::InvalidMessage
                | C::InvalidMessageSize
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_creates_missing_changelogs_and_names_a_mismatch() {
        let config = crate::config::Config::parse(
            "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[store]\npath=\"p\"\n[[handlers]]\ntopics=[\"a\",\"b\",\"c\"]\nkind=\"log\"\n",
            &|_| None,
        )
        .unwrap();
        let cl = config.store.changelog.clone().unwrap();
        let counts: BTreeMap<String, i32> =
            [("a", 3), ("b", 2), ("c", 4), ("g.b.outboxd-dedup", 2), ("g.c.outboxd-dedup", 3)]
                .into_iter()
                .map(|(t, n)| (t.to_owned(), n))
                .collect();
        let (a, b, c) = ("a".to_owned(), "b".to_owned(), "c".to_owned());
        let plan = plan_for(&cl, &[(&a, 3), (&b, 2), (&c, 4)], &counts);
        assert_eq!(plan.create, [("a".to_owned(), "g.a.outboxd-dedup".to_owned(), 3)]);
        assert_eq!(plan.existing, [("b".to_owned(), "g.b.outboxd-dedup".to_owned(), 2)]);
        assert_eq!(plan.mismatched.len(), 1);
        let m = &plan.mismatched[0];
        assert!(m.contains("g.c.outboxd-dedup has 3 partitions") && m.contains("source topic c has 4"), "{m}");
    }

    #[test]
    fn a_changelog_topic_is_named_once_and_shared_by_its_records_and_acknowledgements() {
        let config = crate::config::Config::parse(
            "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[store]\npath=\"p\"\n[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n",
            &|_| None,
        )
        .unwrap();
        let names = TopicNames::new(config.store.changelog.as_ref().unwrap());
        let a = names.of("a");
        assert_eq!(&*a, "g.a.outboxd-dedup");
        assert!(Arc::ptr_eq(&a, &names.of("a")), "named once");
        assert!(Arc::ptr_eq(&a, &names.shared("g.a.outboxd-dedup")), "an acknowledgement shares it");
        assert_eq!(&*names.shared("g.b.outboxd-dedup"), "g.b.outboxd-dedup", "one never sent to is named as it came");
        assert_eq!(&*names.of("b"), "g.b.outboxd-dedup");
    }

    #[test]
    fn a_changelog_that_deletes_records_too_early_is_refused_and_one_not_compacted_is_a_warning() {
        let week = Duration::from_secs(7 * 24 * 3600);
        let judge =
            |policy: Option<&str>, ms: Option<&str>| judge_settings("cl", "src", policy, ms.map(str::to_owned), week);
        assert_eq!(judge(Some("compact,delete"), Some("604800000")), Judged::Fits);
        assert_eq!(judge(Some("compact"), Some("1000")), Judged::Fits, "compact only never deletes by time");
        assert_eq!(judge(Some("compact,delete"), Some("-1")), Judged::Fits, "-1: kept forever");
        let Judged::Refused(early) = judge(Some("compact,delete"), Some("86400000")) else { panic!("not refused") };
        assert!(early.contains("retention.ms=86400000") && early.contains("at least 604800000"), "{early}");
        // The broker's default policy is delete (with its default retention of 7 days).
        assert!(matches!(judge(None, Some("3600000")), Judged::Refused(_)));
        let Judged::Worse(warning) = judge(Some("delete"), Some("-1")) else { panic!("no warning") };
        assert!(warning.contains("cleanup.policy=delete") && warning.contains("not compacted"), "{warning}");
    }

    #[test]
    fn tombstones_kept_shorter_than_the_store_retention_are_a_warning_with_the_fix() {
        let week = Duration::from_secs(7 * 24 * 3600);
        let judge =
            |policy: Option<&str>, ms: Option<&str>| judge_tombstones("cl", "src", policy, ms.map(str::to_owned), week);
        let Judged::Worse(warning) = judge(Some("compact,delete"), Some("86400000")) else { panic!("no warning") };
        assert!(warning.contains("delete.retention.ms=86400000"), "{warning}");
        assert!(warning.contains("--entity-name cl --add-config delete.retention.ms=604800000"), "{warning}");
        assert!(matches!(judge(Some("compact"), None), Judged::Worse(_)), "the broker's default is 24 h");
        assert_eq!(judge(Some("compact,delete"), Some("604800000")), Judged::Fits);
        assert_eq!(judge(Some("compact"), Some("-1")), Judged::Fits);
        assert_eq!(judge(Some("delete"), Some("1000")), Judged::Fits, "not compacted: tombstones stay as records do");
    }
}
