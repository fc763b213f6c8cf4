//! Restore: a changelog partition of N records read into an empty store, by
//! `outboxd store rebuild` and by a service taking the partition at start-up; then
//! the changelog's bytes per record on the broker once compacted.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::bench::{Bench, Cfg, Contender, Hk};
use crate::changelog::{broker_log_dir, create_changelog, fill, topic_bytes};
use crate::procs::rusage_children_secs;

/// Seeds the changelog's event ids: in the high bits, so that no id equals one of an
/// outbox message `preload` makes (its salts are small).
pub(crate) const CHANGELOG_SALT: u64 = 0xc4a1 << 48;

/// outboxd's log while restoring: the restore task's lines, the assignment line.
pub(crate) const RESTORE_LOG: &str = "warn,outboxd::engine::restore=info,outboxd::kafka::source=info";

#[derive(Debug, Default, Clone)]
pub(crate) struct RestoreResult {
    pub(crate) records: u64,
    /// Claims written before their done record (removed by compaction).
    pub(crate) claims: u64,
    pub(crate) fill_secs: f64,
    /// `store rebuild`: records read, its own seconds, process wall and CPU seconds.
    pub(crate) rebuild: Option<Timed>,
    /// Start-up restore: from the "partition restored" line, CPU of the process until then.
    pub(crate) startup: Option<Timed>,
    /// Log segment bytes before and after compaction, and whether the cleaner ran.
    pub(crate) bytes_before: u64,
    pub(crate) bytes_after: u64,
    pub(crate) compacted: bool,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Timed {
    pub(crate) read: f64,
    pub(crate) seconds: f64,
    pub(crate) wall: f64,
    pub(crate) cpu: f64,
    /// The restore's own breakdown: reading, applying, durable writes (seconds).
    pub(crate) split: (f64, f64, f64),
}

impl Timed {
    pub(crate) fn per_sec(&self) -> f64 {
        self.read / self.seconds
    }
    pub(crate) fn per_cpu_sec(&self) -> f64 {
        self.read / self.cpu
    }
}

/// `name=value` of a log line (colour codes removed).
pub(crate) fn field(line: &str, name: &str) -> f64 {
    let plain: String = strip_ansi(line);
    plain
        .split(&format!(" {name}="))
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A 1-partition source topic whose changelog (for `group`) holds `n` records.
pub(crate) async fn filled_changelog(b: &Bench, what: &str, group: &str, n: u64) -> anyhow::Result<(String, f64)> {
    let source = b.topic(what);
    b.create_topic(&source, 1).await?;
    let changelog = format!("{group}.{source}.outboxd-dedup");
    create_changelog(b, &changelog).await?;
    let (brokers, cl, src) = (b.args.brokers.clone(), changelog.clone(), source.clone());
    let t0 = Instant::now();
    let claims = n / 5;
    let written = tokio::task::spawn_blocking(move || fill(&brokers, &cl, &src, CHANGELOG_SALT, n, claims)).await??;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("bench: {changelog}: {written} changelog records in {secs:.1} s");
    Ok((source, secs))
}

/// outboxd as shipped (fsync on, changelog on) on `source`, in `group`.
pub(crate) fn config<'a>(name: &str, group: &str, source: &str, hk: Hk) -> Cfg<'a> {
    Cfg {
        name: name.to_owned(),
        group: group.to_owned(),
        topics: vec![source.to_owned()],
        handler: hk,
        fsync: true,
        max_in_flight: 256,
        commit_window: None,
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
        store_extra: String::new(),
        kafka_extra: Vec::new(),
        handler_extra: String::new(),
    }
}

pub(crate) async fn restore_scenario(b: &Bench) -> anyhow::Result<RestoreResult> {
    let n = b.sizes.restore_records;
    let group = format!("bench-{}-restore", b.run_id);
    let (source, fill_secs) = filled_changelog(b, "restore", &group, n).await?;
    let changelog = format!("{group}.{source}.outboxd-dedup");
    let mut r = RestoreResult { records: n, claims: n / 5, fill_secs, ..RestoreResult::default() };
    // Before the broker's cleaner had a chance (it may run while the restores read).
    let dir = broker_log_dir(&b.admin, &b.args.brokers).await?;
    r.bytes_before = topic_bytes(&dir, &changelog);

    // (a) `outboxd store rebuild` into an empty store.
    let (cfg, _) = b.write_config(&config("restore-rebuild", &group, &source, Hk::Log))?;
    let cpu0 = rusage_children_secs();
    let t0 = Instant::now();
    let out = tokio::process::Command::new(b.bin.join("outboxd"))
        .args(["store", "rebuild", "--json", "--config"])
        .arg(&cfg)
        .current_dir(&b.work)
        .env("OUTBOXD_LOG", RESTORE_LOG)
        .output()
        .await?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = rusage_children_secs() - cpu0;
    anyhow::ensure!(out.status.success(), "store rebuild failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("store rebuild --json output")?;
    let read =
        v.as_array().and_then(|a| a.first()).and_then(|l| l["read"].as_f64()).context("store rebuild: no partition")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("partition restored")).unwrap_or_default();
    let f = |k: &str| field(line, k);
    let rebuild = Timed {
        read,
        seconds: f("seconds"),
        wall,
        cpu,
        split: (f("reading_seconds"), f("applying_seconds"), f("syncing_seconds")),
    };
    eprintln!(
        "bench: restore by store rebuild: {:.0} records in {:.2} s = {:.0} records/s (reading {:.2} s, applying {:.2} s, durable writes {:.2} s); process wall {wall:.2} s, {cpu:.2} CPU s = {:.0} records per CPU second",
        rebuild.read,
        rebuild.seconds,
        rebuild.per_sec(),
        rebuild.split.0,
        rebuild.split.1,
        rebuild.split.2,
        rebuild.per_cpu_sec()
    );
    r.rebuild = Some(rebuild);
    let _ = std::fs::remove_dir_all(b.work.join("stores/restore-rebuild"));

    // (b) a service with an empty store taking the partition at start-up.
    let (cfg, _) = b.write_config(&config("restore-startup", &group, &source, Hk::Log))?;
    let mut child = b.spawn(Contender::Outboxd, &cfg, "", RESTORE_LOG)?;
    let at = child.wait_mark(|m| m.restored, "partition restored", Duration::from_secs(600)).await?;
    let cpu = child.cpu_secs(b.clk_tck);
    let line = child.marks.lock().unwrap().restored_line.clone().unwrap_or_default();
    let wall = (at - child.spawned).as_secs_f64();
    child.stop(Duration::from_secs(30)).await?;
    let f = |k: &str| field(&line, k);
    let startup = Timed {
        read: f("read"),
        seconds: f("seconds"),
        wall,
        cpu,
        split: (f("reading_seconds"), f("applying_seconds"), f("syncing_seconds")),
    };
    eprintln!(
        "bench: restore at start-up: {:.0} records in {:.2} s = {:.0} records/s (reading {:.2} s, applying {:.2} s, durable writes {:.2} s); {cpu:.2} CPU s since the process started = {:.0} records per CPU second",
        startup.read,
        startup.seconds,
        startup.per_sec(),
        startup.split.0,
        startup.split.1,
        startup.split.2,
        startup.per_cpu_sec()
    );
    r.startup = Some(startup);
    let _ = std::fs::remove_dir_all(b.work.join("stores/restore-startup"));

    // The changelog on the broker, before and after compaction.
    (r.bytes_after, r.compacted) = compact(b, &dir, &changelog, &source, r.bytes_before).await?;
    eprintln!(
        "bench: changelog on the broker: {} B before compaction, {} B after ({}) = {:.1} B per record",
        r.bytes_before,
        r.bytes_after,
        if r.compacted { "compacted" } else { "the cleaner had not run yet" },
        r.bytes_after as f64 / n as f64
    );
    Ok(r)
}

/// Rolls the active segment (a record written after `segment.ms`) and waits for
/// the broker's cleaner (it looks every 15 s by default) until the size settles.
async fn compact(
    b: &Bench,
    dir: &std::path::Path,
    changelog: &str,
    source: &str,
    before: u64,
) -> anyhow::Result<(u64, bool)> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    let (brokers, cl, src) = (b.args.brokers.clone(), changelog.to_owned(), source.to_owned());
    // One record of another event rolls the segment.
    tokio::task::spawn_blocking(move || fill(&brokers, &cl, &src, CHANGELOG_SALT ^ 1, 1, 0)).await??;
    let t0 = Instant::now();
    let mut last = topic_bytes(dir, changelog);
    let mut stable = 0;
    while t0.elapsed() < Duration::from_secs(120) {
        // Compacted (the claims are gone: a sixth of the records) and settled.
        if last < before * 9 / 10 && stable >= 3 {
            return Ok((last, true));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = topic_bytes(dir, changelog);
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
    }
    Ok((last, last < before * 9 / 10))
}
