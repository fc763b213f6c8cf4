//! Changelog topics (`[store.changelog]`) seen from outside: their names, the
//! records in them (decoded with outboxd's own codec), records fabricated the way
//! outboxd writes them, and the `key=value` fields of the restore log lines.

use std::collections::HashMap;
use std::time::Duration;

use outboxd::store::changelog::{decode_entry, entry_key, entry_value};
use outboxd::store::{now_us, Record, State};

use super::{new_event_id, Kafka, Message};

/// How long reading a whole changelog topic may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Fabricated records are sent in chunks of this many (each chunk awaited).
const SEND_CHUNK: usize = 10_000;

/// The changelog topic of `topic` for `group` (the default `topic` template).
pub fn topic_for(group: &str, topic: &str) -> String {
    format!("{group}.{topic}.outboxd-dedup")
}

/// One record of a changelog topic, decoded.
#[derive(Clone, Debug)]
pub struct Entry {
    pub event_id: String,
    pub state: State,
    pub partition: i32,
    pub offset: i64,
    /// The Kafka timestamp (ms since the epoch): when the writing instance produced it.
    pub timestamp_ms: i64,
}

/// Every record of the changelog of source topic `topic` (tombstones left out),
/// grouped by event id, each id's in partition and offset order.
pub fn entries_by_id(kafka: &Kafka, changelog: &str, topic: &str) -> HashMap<String, Vec<Entry>> {
    let mut out: HashMap<String, Vec<Entry>> = HashMap::new();
    for m in kafka.read_topic(changelog, READ_TIMEOUT) {
        let (Some(key), Some(value)) = (m.key.as_deref(), m.value.as_deref()) else { continue };
        let r = decode_entry(topic, key, value)
            .unwrap_or_else(|e| panic!("{changelog}/{}@{} does not decode: {e}", m.partition, m.offset));
        let timestamp_ms = m.timestamp_ms.unwrap_or_else(|| panic!("{changelog}/{} has no timestamp", m.partition));
        let entry = Entry {
            event_id: r.event_id.to_string(),
            state: r.state,
            partition: m.partition,
            offset: m.offset,
            timestamp_ms,
        };
        out.entry(entry.event_id.clone()).or_default().push(entry);
    }
    out
}

/// The last record outboxd wrote for `id` in state `state`, as it lies in the
/// changelog of source topic `topic`, headers (its MAC) included: what someone who can
/// read the topic copies. (Entries that are not records, such as audit entries, are
/// passed over.)
pub fn written(kafka: &Kafka, changelog: &str, topic: &str, id: &str, state: State) -> Option<Message> {
    kafka.read_topic(changelog, READ_TIMEOUT).into_iter().rev().find(|m| {
        let (Some(key), Some(value)) = (m.key.as_deref(), m.value.as_deref()) else { return false };
        decode_entry(topic, key, value).is_ok_and(|r| *r.event_id == *id && r.state == state)
    })
}

/// Writes `m`, read from partition `m.partition` of `changelog`, there again: the same
/// key, value and headers (its MAC), at a new offset.
pub async fn write_again(kafka: &Kafka, changelog: &str, m: &Message) {
    let headers: Vec<(&str, Option<&[u8]>)> = m.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
    kafka.producer().send_raw(changelog, Some(m.partition), m.key.as_deref(), &headers, m.value.as_deref()).await;
}

/// Writes `n` done records of source topic `topic` (partition `partition`) into
/// `changelog` the way outboxd writes them (unsigned); returns their event ids.
pub async fn fill(kafka: &Kafka, changelog: &str, topic: &str, partition: i32, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|_| new_event_id()).collect();
    write_done(kafka, changelog, topic, partition, &ids, &|_, _| None).await;
    ids
}

/// What a record written by [`write_done`] or [`write_tombstones`] carries in its
/// `mac` header, given its key and value (`None`: no header).
pub type MacOf<'a> = dyn Fn(&[u8], Option<&[u8]>) -> Option<Vec<u8>> + 'a;

/// Writes a done record of source topic `topic` (partition `partition`) for each
/// of `ids` into `changelog`, as outboxd encodes them, with the `mac` header `mac` says.
pub async fn write_done(kafka: &Kafka, changelog: &str, topic: &str, partition: i32, ids: &[String], mac: &MacOf<'_>) {
    let now = now_us();
    let records = ids.iter().enumerate().map(|(i, id)| {
        let offset = i as i64;
        let position = outboxd::event::Position::new(topic, partition, offset);
        let mut r = Record::first_seen(id, State::Done, 1, &position, now);
        r.scope = Some(topic.into());
        r.key = Some(format!("agg-{}", offset % 1000).into());
        r.event_type = Some("OrderCreated".into());
        r.claimed_at_us = Some(now);
        r.done_at_us = Some(now + 1_500);
        r.updated_at_us = now + 1_500;
        r.outcome = Some("http 200".into());
        (entry_key(&r), Some(entry_value(&r).expect("encode a changelog value")))
    });
    send(kafka, changelog, partition, records.collect(), mac).await;
}

/// Writes a tombstone (the record is gone, as `store forget` writes it) for each
/// of `ids` of source topic `topic` into partition `partition` of `changelog`.
pub async fn write_tombstones(
    kafka: &Kafka,
    changelog: &str,
    topic: &str,
    partition: i32,
    ids: &[String],
    mac: &MacOf<'_>,
) {
    let records = ids.iter().map(|id| {
        let position = outboxd::event::Position::new(topic, partition, 0);
        let mut r = Record::first_seen(id, State::Done, 1, &position, now_us());
        r.scope = Some(topic.into());
        (entry_key(&r), None)
    });
    send(kafka, changelog, partition, records.collect(), mac).await;
}

async fn send(
    kafka: &Kafka,
    changelog: &str,
    partition: i32,
    records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    mac: &MacOf<'_>,
) {
    let producer = &kafka.producer();
    for chunk in records.chunks(SEND_CHUNK) {
        let macs: Vec<Option<Vec<u8>>> = chunk.iter().map(|(k, v)| mac(k, v.as_deref())).collect();
        let sends = chunk.iter().zip(&macs).map(|((k, v), m)| {
            let headers: Vec<(&str, Option<&[u8]>)> = m.iter().map(|m| ("mac", Some(m.as_slice()))).collect();
            async move { producer.send_raw(changelog, Some(partition), Some(k), &headers, v.as_deref()).await }
        });
        futures::future::join_all(sends).await;
    }
}

/// The value of field `name` in a human-format log line (`name=value`), if there.
pub fn log_field(line: &str, name: &str) -> Option<String> {
    let plain = without_colours(line);
    plain.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

/// `line` without ANSI colour codes (the log is coloured unless `NO_COLOR` is set).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... m
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// [`log_field`] as a number; fails the test when it is missing or not one.
pub fn log_number(line: &str, name: &str) -> i64 {
    let v = log_field(line, name).unwrap_or_else(|| panic!("no {name}= in {line:?}"));
    v.parse().unwrap_or_else(|e| panic!("{name}={v} in {line:?} is not a number: {e}"))
}
