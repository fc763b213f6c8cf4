//! Changelog topics for the restore and failover scenarios: filled with records
//! the way outboxd writes them (`outboxd::store::changelog::{entry_key,
//! entry_value}`), and their size in the broker's log directory.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use outboxd::event::Position;
use outboxd::store::changelog::mac::{self, Keys};
use outboxd::store::changelog::{entry_key, entry_value};
use outboxd::store::{now_us, Record, State};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::bench::{client, Bench, CHANGELOG_KEY};
use crate::produce::event_id;

/// Topic settings that let the broker's cleaner compact a changelog soon after
/// it was written (segments of 1 MiB, any dirty share), for the bytes-per-record figure.
pub(crate) const COMPACT_SOON: [(&str, &str); 4] = [
    ("cleanup.policy", "compact"),
    ("segment.bytes", "1048576"),
    ("min.cleanable.dirty.ratio", "0.01"),
    ("segment.ms", "10000"),
];

/// Creates a one-partition compacted changelog topic (deleted at the end of the run).
pub(crate) async fn create_changelog(b: &Bench, name: &str) -> anyhow::Result<()> {
    let mut t = NewTopic::new(name, 1, TopicReplication::Fixed(1));
    for (k, v) in COMPACT_SOON {
        t = t.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in b.admin.create_topics([&t], &opts).await? {
        if let Err((topic, code)) = r {
            anyhow::ensure!(code == RDKafkaErrorCode::TopicAlreadyExists, "creating topic {topic}: {code}");
        }
    }
    b.topics.add(name);
    Ok(())
}

/// A done record of event `i` of `source` (partition 0), as outboxd keeps it.
fn record(source: &str, salt: u64, i: u64, state: State, now: i64) -> Record {
    let position = Position::new(source, 0, i as i64);
    let mut r = Record::first_seen(&event_id(salt, i), state, 1, &position, now);
    r.scope = Some(source.into());
    r.key = Some(format!("agg-{}", i % 1000).into());
    r.event_type = Some("OrderCreated".into());
    r.claimed_at_us = Some(now);
    if state == State::Done {
        r.done_at_us = Some(now + 1_500);
        r.updated_at_us = now + 1_500;
        r.outcome = Some("http 200".into());
    }
    r
}

/// Writes `n` done records of distinct events into partition 0 of `changelog`,
/// preceded by claims of the first `claims` of them (overwritten by their done
/// record: what compaction removes). Returns the records written.
pub(crate) fn fill(
    brokers: &str,
    changelog: &str,
    source: &str,
    salt: u64,
    n: u64,
    claims: u64,
) -> anyhow::Result<u64> {
    let producer: BaseProducer = client(brokers, None)
        .set("compression.type", "lz4")
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "200000")
        .set("acks", "1")
        .create()?;
    let now = now_us();
    let claim = (0..claims.min(n)).map(|i| record(source, salt, i, State::Claimed, now));
    let done = (0..n).map(|i| record(source, salt, i, State::Done, now));
    let keys = signing_keys()?;
    let mut written = 0;
    for r in claim.chain(done) {
        let (key, value) = (entry_key(&r), entry_value(&r)?);
        let tag = keys.sign(changelog, 0, &key, Some(&value)).context("the bench key signs")?;
        let headers = OwnedHeaders::new().insert(Header { key: mac::HEADER, value: Some(&tag[..]) });
        let mut rec =
            BaseRecord::<[u8], [u8]>::to(changelog).partition(0).key(&key[..]).payload(&value[..]).headers(headers);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(e).context("producing changelog records"),
            }
        }
        written += 1;
        if written % 10_000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(written)
}

/// The keys outboxd signs with in the run (`[store.changelog] key`): the records
/// written here carry the MAC outboxd would give them.
fn signing_keys() -> anyhow::Result<Keys> {
    let text = format!(
        "[kafka]\nbrokers = \"b\"\ngroup_id = \"g\"\n[store]\npath = \"p\"\n[store.changelog]\nkey = {CHANGELOG_KEY:?}\n\
         [[handlers]]\ntopics = [\"t\"]\nkind = \"log\"\n"
    );
    let config = outboxd::config::Config::parse(&text, &|_| None)?;
    Ok(Keys::new(&config.store.changelog.context("the changelog is on")?))
}

/// The broker's log directory (`log.dirs` of the first broker; the stack runs one
/// on this machine), where partitions are directories named `topic-partition`.
pub(crate) async fn broker_log_dir(
    admin: &AdminClient<DefaultClientContext>,
    brokers: &str,
) -> anyhow::Result<PathBuf> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let probe: BaseConsumer = client(brokers, None).create()?;
    let md = probe.fetch_metadata(None, Duration::from_secs(10))?;
    let id = md.brokers().first().context("no broker in the metadata")?.id();
    let res = admin.describe_configs([&ResourceSpecifier::Broker(id)], &AdminOptions::new()).await?;
    let config = res.into_iter().next().context("no broker config")?.map_err(|e| anyhow::anyhow!("{e}"))?;
    let dirs = ["log.dirs", "log.dir"]
        .iter()
        .find_map(|k| config.get(k).and_then(|e| e.value.clone()))
        .context("the broker reports no log.dirs")?;
    Ok(PathBuf::from(dirs.split(',').next().unwrap_or_default()))
}

/// Bytes of the log segments (`*.log`) of every partition of `topic` under `dir`.
pub(crate) fn topic_bytes(dir: &std::path::Path, topic: &str) -> u64 {
    let prefix = format!("{topic}-");
    let mut sum = 0;
    for part in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = part.file_name().to_string_lossy().to_string();
        let Some(p) = name.strip_prefix(&prefix) else { continue };
        if p.parse::<u32>().is_err() {
            continue;
        }
        for seg in std::fs::read_dir(part.path()).into_iter().flatten().flatten() {
            if seg.file_name().to_string_lossy().ends_with(".log") {
                sum += seg.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    sum
}
