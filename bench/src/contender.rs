//! The consumer loop shared by the `naive` and `pg-table` contenders.
//!
//! Both read outboxd's own config file (brokers, group, topics, handler,
//! `store.max_in_flight`, `kafka.commit_interval`, `kafka.options`) and run each
//! message through outboxd's decoder and handler (`outboxd::codec::Decoder`,
//! `outboxd::handler::Handler`), so the only difference to outboxd is what
//! happens around the handler:
//!
//! - `naive`: nothing. Offsets are stored as consumed and auto-committed
//!   (at-most-once for a crash, no dedup): the upper bound.
//! - `pg-table`: `INSERT … ON CONFLICT DO NOTHING` into a PostgreSQL
//!   `processed_events` table before the handler (0 rows = duplicate, skip),
//!   `UPDATE … SET state = 'done'` after it, each its own transaction with
//!   `synchronous_commit = on`; the offset is stored only once the event and every
//!   earlier one of its partition is done (outboxd's own offset tracker). The
//!   table is created when missing and kept otherwise, so a restarted pg-table
//!   recovers from it (the driver names a fresh table per run).
//!
//! - `naive --changelog`: naive, and after the handler one record per event to a
//!   compacted topic (`<source>.floor`, the source's partition, keyed by the event
//!   id, a value and a header of the sizes of outboxd's final record and MAC) with
//!   outboxd's changelog producer settings; the offset is stored once the broker
//!   acknowledged it and every earlier one of its partition. No store, no MAC
//!   computed: what one changelog record per event costs by itself, the floor of
//!   outboxd's design (docs/architecture.md, the store as a cache of its changelog).
//!
//! They run up to `store.max_in_flight` events at once without per-key ordering
//! (outboxd orders per key; these do not, which only makes them faster).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use outboxd::config::Config;
use outboxd::event::RawMessage;
use outboxd::handler::Handler;
use outboxd::offsets::OffsetTracker;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How a contender deduplicates.
#[derive(Debug, Clone)]
pub enum Dedup {
    None,
    Pg {
        url: String,
        table: String,
        pool: usize,
    },
    /// A changelog record per event, awaited before the offset (`naive --changelog`).
    Changelog,
}

/// The changelog records' value and header: outboxd's final record of a handled
/// event encodes in about this many bytes, and its MAC header carries 18.
const FLOOR_VALUE_BYTES: usize = 24;
const FLOOR_HEADER_BYTES: usize = 18;

type Tracker = Arc<Mutex<OffsetTracker>>;

struct Ctx {
    tracker: Tracker,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut t = self.tracker.lock().unwrap();
            for e in tpl.elements() {
                t.revoke(&outboxd::offsets::PartitionId::new(e.topic(), e.partition()));
            }
        }
    }

    fn post_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let mut t = self.tracker.lock().unwrap();
            for e in tpl.elements() {
                t.assign(outboxd::offsets::PartitionId::new(e.topic(), e.partition()));
            }
            // The bench driver starts its clock on this line (outboxd logs the same words).
            eprintln!("partitions assigned: {}", tpl.count());
        }
    }
}

type Kc = StreamConsumer<Ctx>;

struct Shared {
    config: Config,
    handler: std::sync::Arc<dyn Handler>,
    consumer: Arc<Kc>,
    tracker: Tracker,
    pg: Option<(deadpool_postgres::Pool, String, String)>,
    /// The floor's producer and each source topic's `.floor` topic, named once.
    changelog: Option<(FutureProducer, HashMap<String, String>)>,
    /// Places for events that only wait for their changelog record (`store.max_settling`,
    /// as outboxd gives them: their in-flight place goes to the next message).
    settling: Arc<Semaphore>,
}

pub async fn run(config_path: &Path, dedup: Dedup) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    anyhow::ensure!(config.handlers.len() == 1, "the contenders take a config with exactly one handler");
    let handler = outboxd::handler::build(&config.handlers[0])?;
    let track_offsets = !matches!(dedup, Dedup::None);

    let pg = match &dedup {
        Dedup::None | Dedup::Changelog => None,
        Dedup::Pg { url, table, pool } => {
            let pg_config: tokio_postgres::Config = url.parse().context("--pg")?;
            let mgr = deadpool_postgres::Manager::from_config(
                pg_config,
                tokio_postgres::NoTls,
                deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
            );
            let pool = deadpool_postgres::Pool::builder(mgr).max_size(*pool).build()?;
            let c = pool.get().await.context("connecting to PostgreSQL")?;
            c.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (event_id text PRIMARY KEY, state text NOT NULL,
                   claimed_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz);
                 SET synchronous_commit = on;"
            ))
            .await?;
            drop(c);
            let insert = format!("INSERT INTO {table} (event_id, state) VALUES ($1, 'claimed') ON CONFLICT DO NOTHING");
            let update = format!("UPDATE {table} SET state = 'done', done_at = now() WHERE event_id = $1");
            Some((pool, insert, update))
        }
    };

    let changelog = match dedup {
        Dedup::Changelog => Some(floor_producer(&config).await?),
        _ => None,
    };

    let tracker: Tracker = Arc::default();
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.kafka.brokers)
        .set("group.id", &config.kafka.group_id)
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("client.id", "bench-contender")
        // outboxd's prefetch defaults (src/kafka/options.rs), so every contender fetches alike.
        .set("queued.max.messages.kbytes", "16384")
        .set("queued.min.messages", "10000")
        .set("fetch.queue.backoff.ms", "20");
    for (k, v) in &config.kafka.options {
        cc.set(k, v);
    }
    cc.set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", config.kafka.commit_interval.as_millis().max(1).to_string())
        .set("enable.auto.offset.store", if track_offsets { "false" } else { "true" });
    let consumer: Kc = cc.create_with_context(Ctx { tracker: tracker.clone() })?;
    let topics = config.subscriptions();
    consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
    let consumer = Arc::new(consumer);

    let max_in_flight = config.store.max_in_flight;
    let settling = Arc::new(Semaphore::new(config.store.max_settling));
    let shared = Arc::new(Shared { config, handler, consumer: consumer.clone(), tracker, pg, changelog, settling });
    let permits = Arc::new(Semaphore::new(max_in_flight));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let permit = tokio::select! {
            _ = term.recv() => break,
            p = permits.clone().acquire_owned() => p?,
        };
        let msg = tokio::select! {
            _ = term.recv() => break,
            m = consumer.recv() => m.map(|m| outboxd::kafka::to_raw(&m)),
        };
        match msg {
            Ok(raw) => {
                let generation = if track_offsets {
                    let p = outboxd::offsets::PartitionId::new(&raw.topic, raw.partition);
                    let mut t = shared.tracker.lock().unwrap();
                    let g = t.generation(&p).unwrap_or_else(|| t.assign(p.clone()));
                    t.consumed(&p, g, raw.offset);
                    g
                } else {
                    0
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = process(&shared, &raw, generation, permit).await {
                        eprintln!("error at {}/{}@{}: {e:#}", raw.topic, raw.partition, raw.offset);
                    }
                });
            }
            Err(e) => {
                eprintln!("kafka error: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let all = u32::try_from(max_in_flight).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(10), permits.acquire_many(all)).await;
    let _ = consumer.commit_consumer_state(CommitMode::Sync);
    Ok(())
}

async fn process(
    shared: &Shared,
    raw: &RawMessage,
    generation: u64,
    permit: OwnedSemaphorePermit,
) -> anyhow::Result<()> {
    // The event's place: in flight, or settling once its call is over.
    let mut place = permit;
    let hc = shared.config.handler_for(&raw.topic).context("no handler for topic")?;
    match outboxd::codec::Decoder::default().decode(raw, &outboxd::codec::Layout::from(hc)).await {
        Err(e) => eprintln!("undecodable {}/{}@{}: {e}", raw.topic, raw.partition, raw.offset),
        Ok(event) => match &shared.pg {
            None => {
                if let Err(e) = shared.handler.handle(&event).await {
                    eprintln!("handler failed for {}: {e}", event.id);
                }
                if let Some((producer, floor_topics)) = &shared.changelog {
                    // A free settling place frees its in-flight place; without one it keeps it.
                    if let Ok(settling) = shared.settling.clone().try_acquire_owned() {
                        place = settling;
                    }
                    let value = [1u8; FLOOR_VALUE_BYTES];
                    let mac = [2u8; FLOOR_HEADER_BYTES];
                    let topic = floor_topics.get(&raw.topic).context("no .floor topic for the source")?;
                    let record = FutureRecord::to(topic)
                        .partition(raw.partition)
                        .key(event.id.as_bytes())
                        .payload(&value[..])
                        .headers(
                            OwnedHeaders::new_with_capacity(1).insert(Header { key: "mac", value: Some(&mac[..]) }),
                        );
                    producer.send(record, Timeout::Never).await.map_err(|(e, _)| e)?;
                }
            }
            Some((pool, insert, update)) => {
                let c = pool.get().await?;
                let claimed = c.execute(&c.prepare_cached(insert).await?, &[&event.id]).await?;
                drop(c);
                if claimed == 1 {
                    if let Err(e) = shared.handler.handle(&event).await {
                        eprintln!("handler failed for {}: {e}", event.id);
                    }
                    let c = pool.get().await?;
                    c.execute(&c.prepare_cached(update).await?, &[&event.id]).await?;
                }
            }
        },
    }
    if shared.pg.is_some() || shared.changelog.is_some() {
        let p = outboxd::offsets::PartitionId::new(&raw.topic, raw.partition);
        let mut t = shared.tracker.lock().unwrap();
        if let Some(next) = t.finish(&p, generation, raw.offset) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(next))?;
            if let Err(e) = shared.consumer.store_offsets(&tpl) {
                eprintln!("store offset: {e}");
            }
        }
    }
    drop(place);
    Ok(())
}

/// The compacted topic `naive --changelog` writes the records of `source` to.
fn floor_topic(source: &str) -> String {
    format!("{source}.floor")
}

/// A producer with outboxd's changelog settings (src/kafka/options.rs, the linger
/// of the config's `[store.changelog]`), after creating each source's `.floor`
/// topic with the source's partitions, compacted as outboxd's changelogs are;
/// with the `.floor` topic of each source.
async fn floor_producer(config: &Config) -> anyhow::Result<(FutureProducer, HashMap<String, String>)> {
    let linger =
        config.store.changelog.as_ref().map(|c| c.linger).context("naive --changelog needs the changelog on")?;
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.kafka.brokers);
    let admin: AdminClient<DefaultClientContext> = cc.create()?;
    let probe: BaseConsumer = cc.create()?;
    let mut topics = Vec::new();
    for source in config.subscriptions() {
        let md = probe.fetch_metadata(Some(&source), Duration::from_secs(10))?;
        let partitions = md.topics().first().map_or(0, |t| t.partitions().len());
        anyhow::ensure!(partitions > 0, "source topic {source} not found");
        topics.push((source.clone(), floor_topic(&source), i32::try_from(partitions)?));
    }
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(_, name, n)| NewTopic::new(name, *n, TopicReplication::Fixed(1)).set("cleanup.policy", "compact"))
        .collect();
    for result in admin.create_topics(&new, &AdminOptions::new()).await? {
        match result {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("creating {topic}: {code}"),
        }
    }
    cc.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger.as_millis().to_string())
        .set("compression.type", "lz4")
        .set("allow.auto.create.topics", "false");
    Ok((cc.create()?, topics.into_iter().map(|(source, floor, _)| (source, floor)).collect()))
}
