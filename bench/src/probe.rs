//! `outboxd-bench store-probe`: what the dedup store's layout costs, measured on
//! sled 0.34 directly (the engine outboxd uses), outside outboxd. It replays the
//! writes outboxd makes per event (see `outboxd::store::Store::{claim, finish}`)
//! and variants of them, then reports bytes on disk per record and the RSS of
//! the process. An investigation tool for bench/findings.md, not part of the suite.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Variant {
    /// As outboxd does it: claim = JSON record; done = expiry index entry + JSON record again.
    Outboxd,
    /// Only the final JSON record and the expiry entry (no separate claimed version).
    OneWrite,
    /// A compact binary record (16-byte id key, state + times + outcome code), written
    /// at claim and at done, plus the expiry entry.
    Compact,
}

fn json_record(i: u64, done: bool, now: i64) -> Vec<u8> {
    let id = format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", i, i & 0xffff, i & 0xfff, i & 0xfff, i);
    serde_json::to_vec(&json!({
        "event_id": id,
        "state": if done { "done" } else { "claimed" },
        "attempts": 1,
        "topic": "bench.292416f4.store",
        "partition": (i % 8) as i32,
        "offset": (i / 8) as i64,
        "key": format!("agg-{:06}", i % 10_000),
        "event_type": "OrderCreated",
        "first_seen_us": now,
        "claimed_at_us": now,
        "done_at_us": if done { Some(now + 900) } else { None },
        "updated_at_us": now + 900,
        "outcome": if done { Some("http 200") } else { None },
        "reason": null,
        "dead_letter": null,
        "duplicates": 0,
        "expires_at_us": if done { Some(now + 7 * 86_400_000_000) } else { None },
    }))
    .expect("json")
}

fn id_text(i: u64) -> String {
    format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", i, i & 0xffff, i & 0xfff, i & 0xfff, i)
}

pub fn run(
    dir: &Path,
    records: u64,
    variant: Variant,
    cache_mb: Option<u64>,
    batch: u64,
) -> anyhow::Result<serde_json::Value> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let mut cfg = sled::Config::new().path(dir);
    if let Some(mb) = cache_mb {
        cfg = cfg.cache_capacity(mb * 1024 * 1024);
    }
    let db = cfg.open()?;
    let events = db.open_tree("events")?;
    let expiry = db.open_tree("expiry")?;
    let t = Instant::now();
    let now = 1_780_000_000_000_000i64;
    // Group commit: outboxd flushes once per batch of waiting writers (at most 256 in flight).
    let batch = batch.max(1);
    for start in (0..records).step_by(batch as usize) {
        let end = (start + batch).min(records);
        for i in start..end {
            let id = id_text(i);
            match variant {
                Variant::Outboxd => {
                    let _ = events.get(id.as_bytes())?;
                    events.insert(id.as_bytes(), json_record(i, false, now))?;
                }
                Variant::OneWrite => {}
                Variant::Compact => {
                    let key = (i as u128).to_be_bytes();
                    events.insert(key, &[1u8, 0, 0, 0, 0, 0, 0, 0, 0][..])?;
                }
            }
        }
        db.flush()?;
        for i in start..end {
            let id = id_text(i);
            let exp = now + 7 * 86_400_000_000 + i as i64;
            match variant {
                Variant::Outboxd | Variant::OneWrite => {
                    let _ = events.get(id.as_bytes())?;
                    let mut k = (exp as u64).to_be_bytes().to_vec();
                    k.extend_from_slice(id.as_bytes());
                    expiry.insert(k, &[])?;
                    events.insert(id.as_bytes(), json_record(i, true, now))?;
                }
                Variant::Compact => {
                    let key = (i as u128).to_be_bytes();
                    let mut k = (exp as u64).to_be_bytes().to_vec();
                    k.extend_from_slice(&key);
                    expiry.insert(k, &[])?;
                    // state, done_at, expires_at, outcome code
                    let mut v = vec![2u8];
                    v.extend_from_slice(&(now + 900).to_be_bytes());
                    v.extend_from_slice(&exp.to_be_bytes());
                    v.extend_from_slice(&200u16.to_be_bytes());
                    events.insert(key, v)?;
                }
            }
        }
        db.flush()?;
    }
    let secs = t.elapsed().as_secs_f64();
    let bytes = db.size_on_disk()?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let sample = json_record(1, true, now).len();
    drop(events);
    drop(expiry);
    drop(db);
    std::fs::remove_dir_all(dir)?;
    Ok(json!({
        "variant": format!("{variant:?}"),
        "records": records,
        "cache_mb": cache_mb,
        "batch": batch,
        "bytes_on_disk": bytes,
        "bytes_per_record": bytes as f64 / records as f64,
        "json_record_bytes": sample,
        "rss_mb": rss_kb / 1024,
        "secs": secs,
    }))
}
