//! The outbox messages the scenarios consume: event ids, payloads, and producing
//! them up front (with duplicates), at a fixed rate, or again (a replay).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::bench::client;
use crate::receiver::now_us;
use crate::{KEYS, PAYLOAD_BYTES};

pub(crate) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A UUID-shaped event id for event number `i` of a topic.
pub(crate) fn event_id(salt: u64, i: u64) -> String {
    let a = splitmix(salt ^ i.wrapping_mul(0x1000_0000_0000_0001));
    let b = splitmix(a);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// ~500 bytes of outbox payload (JSON text, as Debezium's String converter gives it).
fn payload(i: u64, key: &str, ts_us: i64) -> Vec<u8> {
    let mut s = format!(
        "{{\"orderId\":\"{key}\",\"seq\":{i},\"ts_us\":{ts_us},\"status\":\"CREATED\",\
         \"customer\":{{\"id\":\"c-{c:06}\",\"name\":\"Customer {c}\",\"email\":\"customer{c}@example.com\"}},\
         \"items\":[{{\"sku\":\"SKU-{s1:05}\",\"qty\":{q1},\"price\":\"19.99\"}},{{\"sku\":\"SKU-{s2:05}\",\"qty\":{q2},\"price\":\"5.49\"}}],\
         \"currency\":\"EUR\",\"total\":\"{t}.{tc:02}\",\"note\":\"",
        c = i % 7919,
        s1 = i % 977,
        s2 = (i * 7) % 977,
        q1 = 1 + i % 3,
        q2 = 1 + i % 5,
        t = 20 + i % 400,
        tc = i % 100,
    );
    while s.len() < PAYLOAD_BYTES - 2 {
        s.push(char::from(b'a' + (s.len() % 26) as u8));
    }
    s.push_str("\"}");
    s.into_bytes()
}

struct ProdCtx {
    errors: AtomicU64,
}
impl ClientContext for ProdCtx {}
impl ProducerContext for ProdCtx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn producer(brokers: &str, linger_ms: u32) -> anyhow::Result<BaseProducer<ProdCtx>> {
    Ok(client(brokers, None)
        .set("linger.ms", linger_ms.to_string())
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "500000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(ProdCtx { errors: AtomicU64::new(0) })?)
}

fn send(p: &BaseProducer<ProdCtx>, topic: &str, key: &str, id: &str, value: &[u8], ts_ms: i64) -> anyhow::Result<()> {
    let headers = OwnedHeaders::new()
        .insert(Header { key: "id", value: Some(id) })
        .insert(Header { key: "eventType", value: Some("OrderCreated") });
    let mut rec = BaseRecord::to(topic).key(key).payload(value).headers(headers).timestamp(ts_ms);
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                p.poll(Duration::from_millis(50));
                rec = r;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Loads `n` messages; with `dups`, every 20th is an earlier event again (same
/// id, key and payload) at a new offset, as Debezium re-sends after a crash.
/// `keys` = 1 puts everything on one hot key. Returns (messages, duplicates).
pub(crate) fn preload(
    brokers: &str,
    topic: &str,
    salt: u64,
    n: u64,
    keys: u64,
    dups: bool,
) -> anyhow::Result<(u64, u64)> {
    let p = producer(brokers, 20)?;
    let mut events = 0u64;
    let mut dup_count = 0u64;
    for m in 0..n {
        let i = if dups && m % 20 == 19 && events > 1000 {
            dup_count += 1;
            splitmix(salt ^ m) % (events - 500)
        } else {
            events += 1;
            events - 1
        };
        send_event(&p, topic, salt, i, keys)?;
        if m % 1024 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    flush(&p, topic)?;
    Ok((n, dup_count))
}

/// Event `i` of `preload(.., salt, .., keys, ..)`: its id, key and payload (stamped now).
fn send_event(p: &BaseProducer<ProdCtx>, topic: &str, salt: u64, i: u64, keys: u64) -> anyhow::Result<()> {
    let key = format!("agg-{:06}", splitmix(i ^ 0x55) % keys);
    let ts = now_us();
    send(p, topic, &key, &event_id(salt, i), &payload(i, &key, ts), ts / 1000)
}

fn flush(p: &BaseProducer<ProdCtx>, topic: &str) -> anyhow::Result<()> {
    p.flush(Duration::from_secs(120))?;
    let errors = p.context().errors.load(Ordering::Relaxed);
    anyhow::ensure!(errors == 0, "{errors} messages were not delivered to {topic}");
    Ok(())
}

/// Events `events` of an earlier `preload` (same salt and keys, no duplicates)
/// produced again at new offsets, with the same ids, keys and payloads: what
/// Debezium sends after a connector restart, from its last flushed offset on. The
/// messages of a contiguous range of events are a contiguous range of each
/// partition (a key stays on its partition). Returns the messages written.
pub(crate) fn replay(
    brokers: &str,
    topic: &str,
    salt: u64,
    events: std::ops::Range<u64>,
    keys: u64,
) -> anyhow::Result<u64> {
    let p = producer(brokers, 20)?;
    let n = events.end - events.start;
    for i in events {
        send_event(&p, topic, salt, i, keys)?;
        if i % 1024 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    flush(&p, topic)?;
    Ok(n)
}

/// Produces `rate` events per second for `secs` seconds, each stamped with the
/// time of its send (Kafka timestamp and `ts_us` in the payload).
pub(crate) fn produce_at_rate(brokers: &str, topic: &str, salt: u64, rate: u64, secs: u64) -> anyhow::Result<u64> {
    let p = producer(brokers, 0)?;
    let n = rate * secs;
    let start = Instant::now();
    for i in 0..n {
        let due = start + Duration::from_micros(i * 1_000_000 / rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let key = format!("agg-{:06}", splitmix(i ^ 0x77) % KEYS);
        let ts = now_us();
        send(&p, topic, &key, &event_id(salt, i), &payload(i, &key, ts), ts / 1000)?;
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30))?;
    Ok(n)
}
