//! The markdown report: the machine it ran on, one table per scenario, the targets
//! met or not, and the hand-written findings appended.

use std::time::Instant;

use crate::bench::{Bench, Contender, Hk, ALL};
use crate::scenarios::latency::LatResult;
use crate::stats::{median, min_max, mmm, pct, ratio};
use crate::{Measured, KEYS, SLOW_RECEIVER_MS};

/// Issue 23's budget for outboxd's added p50 latency over naive's, in ms.
const LATENCY_BUDGET_MS: f64 = 1.0;

pub(crate) fn machine() -> String {
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
        .map(|kb| format!("{} GiB", kb >> 20))
        .unwrap_or_default();
    format!("nproc {nproc}, CPU {cpu}, kernel {kernel}, memory {mem}")
}

fn git_rev() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rev = run(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "?".into());
    let dirty = run(&["status", "--porcelain", "--", "src", "Cargo.toml"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{rev} + uncommitted changes in src/")
    } else {
        rev
    }
}

pub(crate) fn others_running() -> Vec<String> {
    // Other heavy processes sharing the 2 cores (the local stack's Kafka Connect, if up).
    let mut v = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmd.contains("ConnectDistributed") || cmd.contains("ConnectStandalone") {
                v.push("Kafka Connect (Debezium) was running".to_owned());
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

struct Report {
    md: String,
}

impl Report {
    fn line(&mut self, s: impl AsRef<str>) {
        self.md.push_str(s.as_ref());
        self.md.push('\n');
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Writes the report with whatever has been measured so far (called after every
/// scenario, so a run that is stopped half-way still leaves its numbers).
pub(crate) fn write_report(b: &Bench, started: Instant, m: &Measured, done: bool) -> anyhow::Result<()> {
    let Measured {
        others,
        noise,
        drain,
        drain_info,
        lat,
        floor_pairs,
        floor_singles,
        slow,
        overload,
        store,
        restore,
        scale,
        failover,
        crash,
    } = m;
    let s = &b.sizes;
    let mut rep = Report { md: String::new() };
    let mut targets: Vec<(String, String, Option<bool>)> = Vec::new();
    let elapsed = started.elapsed();
    rep.line("# outboxd benchmark results");
    rep.line("");
    if !done {
        rep.line("**Partial: written after each scenario; this run had not finished when the file was last written.**");
        rep.line("");
    }
    rep.line(format!("- command: `{}`", b.args.command));
    rep.line(format!("- machine: {}", machine()));
    rep.line(format!("- outboxd: {}, release build; stack: Apache Kafka 4.4.0 (KRaft, one node) and PostgreSQL 15 on 127.0.0.1, same machine", if b.args.built_from.is_empty() { format!("git {}", git_rev()) } else { b.args.built_from.clone() }));
    if !others.is_empty() {
        rep.line(format!("- also on the machine during the run: {}", others.join(", ")));
    }
    rep.line(format!(
        "- sizes: drain {} messages, {} interleaved run(s) per measurement (median, min–max in brackets), latency {} s at {} events/s, slow receiver window {} s, store {} records, restore and failover {} changelog records{}",
        s.events,
        s.runs,
        s.latency_secs,
        b.args.rate,
        s.slow_secs,
        s.store_records,
        s.restore_records,
        if b.args.quick { " (`--quick`)" } else { "" }
    ));
    rep.line(format!(
        "- CPU taken by other processes on the machine (not the driver, the contenders, Kafka or PostgreSQL; share of both cores): {}",
        noise.iter().map(|(n, f)| format!("{n} {:.0}%", f * 100.0)).collect::<Vec<_>>().join(", ")
    ));
    rep.line(format!("- suite wall time: {:.1} min", elapsed.as_secs_f64() / 60.0));
    rep.line("- every contender: own consumer group, fresh store / fresh PostgreSQL table, `kafka.commit_interval = 100ms`, `max_in_flight = 256`, outboxd's librdkafka defaults (prefetch `queued.max.messages.kbytes = 16384`, `queued.min.messages = 10000`, `fetch.queue.backoff.ms = 20`), mimalloc as the allocator; the receiver (in the driver) answers 200 at once unless said otherwise");
    rep.line("");

    if !drain.is_empty() {
        rep.line("## Drain");
        rep.line("");
        rep.line(format!("Pre-loaded topic: {drain_info}. Time from `partitions assigned` to all offsets committed (polled every 20 ms). CPU = user+system of the contender process; for pg-table the PostgreSQL server processes' CPU in the same interval is shown separately (outboxd's store work is inside its own process)."));
        rep.line("");
        rep.line("| handler | contender | events/s | × naive | CPU s / 100k events | × naive | + PostgreSQL CPU s / 100k | RSS at the end, MB | store: records per group commit, ms per commit | receiver calls (repeats) |");
        rep.line("|---|---|---:|---:|---:|---:|---:|---:|---|---:|");
        for hk in [Hk::Log, Hk::Http] {
            let naive_eps = median(
                &drain
                    .get(&(Contender::Naive, hk))
                    .map(|v| v.iter().map(|r| r.eps).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            let naive_cpu = median(
                &drain
                    .get(&(Contender::Naive, hk))
                    .map(|v| v.iter().map(|r| r.cpu_per_100k).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            for who in ALL {
                let Some(v) = drain.get(&(who, hk)) else { continue };
                let eps: Vec<f64> = v.iter().map(|r| r.eps).collect();
                let cpu: Vec<f64> = v.iter().map(|r| r.cpu_per_100k).collect();
                let pgc: Vec<f64> = v.iter().map(|r| r.pg_cpu_per_100k).collect();
                let rss: Vec<f64> = v.iter().map(|r| mb(r.rss)).collect();
                let syncs: Vec<(f64, f64, f64)> = v.iter().filter_map(|r| r.sync).collect();
                let sync = if syncs.is_empty() {
                    "–".to_owned()
                } else {
                    format!(
                        "{:.1}, {:.2}",
                        median(&syncs.iter().map(|s| s.1).collect::<Vec<_>>()),
                        median(&syncs.iter().map(|s| s.2).collect::<Vec<_>>())
                    )
                };
                // The runs the cap stopped, each with what it had committed by then.
                let stopped: Vec<String> = v.iter().filter(|r| r.partial).map(|r| r.committed.to_string()).collect();
                let partial = if stopped.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} of {} runs stopped at the {} s cap, with {} of {} committed)",
                        stopped.len(),
                        v.len(),
                        s.drain_cap.as_secs(),
                        stopped.join(", "),
                        s.events
                    )
                };
                let calls = if hk == Hk::Http {
                    format!("{} ({})", v.last().map(|r| r.calls).unwrap_or(0), v.last().map(|r| r.repeats).unwrap_or(0))
                } else {
                    "–".into()
                };
                rep.line(format!(
                    "| {} | {}{partial} | {} | {} | {} | {} | {} | {} | {sync} | {calls} |",
                    hk.name(),
                    who.name(),
                    mmm(&eps, 0),
                    ratio(median(&eps), naive_eps),
                    mmm(&cpu, 2),
                    ratio(median(&cpu), naive_cpu),
                    if who == Contender::PgTable { mmm(&pgc, 2) } else { "–".into() },
                    mmm(&rss, 0),
                ));
            }
        }
        rep.line("");
        rep.line("Receiver calls are from the last run; repeats = calls whose `Idempotency-Key` the receiver had already seen (a second side effect). `outboxd-nochangelog` is outboxd with `[store.changelog] enabled = false`; the other outboxd rows write the changelog (on by default).");
        if drain.keys().any(|(who, _)| who.is_camel()) {
            rep.line("");
            rep.line(format!("The Camel rows are Apache Camel 4.22's Idempotent Consumer in front of camel-http (`bench/camel/`; a JVM with its default heap; CPU counted from the start line on, as for every row, so the JVM's start-up is not in it), {} consumers (one per partition), one call at a time each. `camel`: the at-least-once recipe: `KafkaIdempotentRepository` on a fresh topic, its cache sized for every id of the run, `eager=false`, `completionEager=true`, manual commit after the call (`allowManualCommit=true`, `autoCommitEnable=false`, `KafkaManualCommit`), `breakOnFirstError=true`. `camel-defaults`: the same route with Camel's defaults (eager, 1000 ids cached, auto commit every 5 s). `camel-memory` (when run): the recipe with `MemoryIdempotentRepository`. Camel has no log handler to compare: its rows are in the http part only.", crate::camel::CONSUMERS));
        }
        rep.line("");
        let cl: Vec<f64> = drain.values().flatten().filter_map(|r| r.changelog_bytes).collect();
        if !cl.is_empty() {
            rep.line(format!("Changelog topics the outboxd contenders wrote during the drain: {} bytes of log segments per record on the broker (median, min–max; as written, one record per event, before compaction, which removes nothing when every key is written once).", mmm(&cl, 1)));
            rep.line("");
        }
        // The median of one figure over a contender's runs with a handler.
        let over_runs = |who, hk, figure: fn(&crate::DrainResult) -> f64| {
            median(&drain.get(&(who, hk)).map(|v| v.iter().map(figure).collect::<Vec<_>>()).unwrap_or_default())
        };
        let med = |who, hk| over_runs(who, hk, |r| r.eps);
        let cpu = |who, hk| over_runs(who, hk, |r| r.cpu_per_100k);
        // Where the design's floor ran beside them (naive and a changelog record per event,
        // no store): its rate as a share of naive's, which outboxd's cannot pass.
        let floor = |hk| {
            let (f, n) = (med(Contender::NaiveChangelog, hk), med(Contender::Naive, hk));
            if f.is_finite() {
                format!("; the design's floor, naive-changelog, {:.2}×", f / n)
            } else {
                String::new()
            }
        };
        let (o, n) = (med(Contender::Outboxd, Hk::Http), med(Contender::Naive, Hk::Http));
        targets.push((
            "drain, HTTP receiver: outboxd ≥ 0.6× naive events/s".into(),
            format!("{:.2}× ({o:.0} vs {n:.0} events/s{})", o / n, floor(Hk::Http)),
            Some(o >= 0.6 * n),
        ));
        let (oc, nc) = (cpu(Contender::Outboxd, Hk::Http), cpu(Contender::Naive, Hk::Http));
        targets.push((
            "drain, HTTP receiver: outboxd CPU per event ≤ 1.7× naive".into(),
            format!("{:.2}× ({oc:.2} vs {nc:.2} CPU s / 100k events)", oc / nc),
            Some(oc <= 1.7 * nc),
        ));
        let (ol, nl) = (med(Contender::Outboxd, Hk::Log), med(Contender::Naive, Hk::Log));
        if ol.is_finite() && nl.is_finite() {
            targets.push((
                "drain, log handler: outboxd ≥ 0.35× naive events/s".into(),
                format!("{:.2}× ({ol:.0} vs {nl:.0} events/s{})", ol / nl, floor(Hk::Log)),
                Some(ol >= 0.35 * nl),
            ));
            // CPU s per 100k events → µs per event: × 1e6 / 1e5.
            let extra = (cpu(Contender::Outboxd, Hk::Log) - cpu(Contender::Naive, Hk::Log)) * 10.0;
            targets.push((
                "drain, log handler: outboxd's CPU beyond naive's ≤ 35 µs per event".into(),
                format!("{extra:.1} µs"),
                Some(extra <= 35.0),
            ));
        }
        let camel = cpu(Contender::Camel, Hk::Http);
        if camel.is_finite() {
            targets.push((
                "drain, HTTP receiver: outboxd CPU per event ≤ 0.3× camel's (Kafka repository)".into(),
                format!("{:.3}× ({oc:.2} vs {camel:.2} CPU s / 100k events)", oc / camel),
                Some(oc <= 0.3 * camel),
            ));
        }
    }

    if !lat.is_empty() {
        rep.line("## Added latency");
        rep.line("");
        rep.line(format!(
            "{} events/s for {} s per contender and run, 8 partitions, {KEYS} keys, each its own fresh topic; latency = receiver call time − the event's produce time (stamped by the producer at send, µs; the first second is warm-up and not counted). Added = contender − naive (medians over runs). The `-window0` rows are the same outboxd binary with `store.commit_interval = \"0ms\"` (not the shipped default, 2 ms): they isolate what the group-commit window costs.",
            b.args.rate, s.latency_secs
        ));
        rep.line("");
        rep.line("| contender | p50 ms | p99 ms | p99.9 ms | added p50 ms | added p99 ms | added p99.9 ms | store group commits/s, records each, ms each (mean) |");
        rep.line("|---|---:|---:|---:|---:|---:|---:|---|");
        let m = |who: Contender, f: fn(&LatResult) -> f64| -> Vec<f64> {
            lat.get(&who).map(|v| v.iter().map(|r| f(r) / 1000.0).collect()).unwrap_or_default()
        };
        let (n50, n99, n999) = (
            median(&m(Contender::Naive, |r| r.p50)),
            median(&m(Contender::Naive, |r| r.p99)),
            median(&m(Contender::Naive, |r| r.p999)),
        );
        for who in ALL {
            if !lat.contains_key(&who) {
                continue;
            }
            let (p50, p99, p999) = (m(who, |r| r.p50), m(who, |r| r.p99), m(who, |r| r.p999));
            let add = |v: &[f64], base: f64| {
                if who == Contender::Naive {
                    "–".to_owned()
                } else {
                    format!("{:+.2}", median(v) - base)
                }
            };
            let syncs: Vec<(f64, f64, f64)> =
                lat.get(&who).map(|v| v.iter().filter_map(|r| r.sync).collect()).unwrap_or_default();
            let sync = if syncs.is_empty() {
                "–".to_owned()
            } else {
                let m = |f: fn(&(f64, f64, f64)) -> f64| median(&syncs.iter().map(f).collect::<Vec<_>>());
                format!("{:.0}, {:.1}, {:.2}", m(|s| s.0), m(|s| s.1), m(|s| s.2))
            };
            rep.line(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {sync} |",
                who.name(),
                mmm(&p50, 2),
                mmm(&p99, 2),
                mmm(&p999, 2),
                add(&p50, n50),
                add(&p99, n99),
                add(&p999, n999)
            ));
        }
        let (f50, f99) = (pct(floor_pairs, 0.5) / 1000.0, pct(floor_pairs, 0.99) / 1000.0);
        rep.line(format!(
            "| *floor: two fdatasyncs (append 256 B + fdatasync, twice), {} samples* | | | | *{f50:.2}* | *{f99:.2}* | *{:.2}* | |",
            floor_pairs.len(),
            pct(floor_pairs, 0.999) / 1000.0
        ));
        rep.line(format!(
            "| *one fdatasync, {} samples* | | | | *{:.2}* | *{:.2}* | *{:.2}* | |",
            floor_singles.len(),
            pct(floor_singles, 0.5) / 1000.0,
            pct(floor_singles, 0.99) / 1000.0,
            pct(floor_singles, 0.999) / 1000.0
        ));
        rep.line("");
        let full50 = median(&m(Contender::Outboxd, |r| r.p50)) - n50;
        let full99 = median(&m(Contender::Outboxd, |r| r.p99));
        // The reference's own p50 moving by more than the budget between runs (the broker
        // stalling on a shared machine) says the difference of medians cannot decide.
        let (lo, hi) = min_max(&m(Contender::Naive, |r| r.p50));
        let noisy = hi - lo > LATENCY_BUDGET_MS;
        targets.push((
            format!("added latency p50 ≤ +1.0 ms at {} events/s (outboxd; p99 next to naive's)", b.args.rate),
            match noisy {
                true => format!(
                    "{full50:+.2} ms (p99 {full99:.2} ms, naive {n99:.2} ms); naive's own p50 ranged {lo:.2}–{hi:.2} ms over the runs, more than the budget"
                ),
                false => format!("{full50:+.2} ms (p99 {full99:.2} ms, naive {n99:.2} ms)"),
            },
            (!noisy).then_some(full50 <= LATENCY_BUDGET_MS),
        ));
    }

    if !slow.is_empty() {
        rep.line("## Slow receiver");
        rep.line("");
        rep.line(format!("The receiver takes {SLOW_RECEIVER_MS} ms per call unless the row says otherwise. Calls per second over a {} s window after 1 s of warm-up; \"many keys\" = {KEYS} keys over 8 partitions, \"one key\" = every event on the same key (kept in order, so one at a time). The naive row (no ordering, same in-flight bound) is the reference. `camel` = Apache Camel's Idempotent Consumer, the at-least-once recipe (Kafka repository, manual commit): {} consumers, one per partition, one call at a time each, so {} calls in flight.", s.slow_secs, crate::camel::CONSUMERS, crate::camel::CONSUMERS));
        rep.line("");
        rep.line(
            "| contender | receiver, ms | calls in flight | keys | events/s | ideal (in flight / receiver time) |",
        );
        rep.line("|---|---:|---:|---|---:|---:|");
        for (name, mif, label, lat, v) in slow.iter() {
            let in_flight = if *label == "one key" { 1 } else { *mif };
            let ideal = in_flight as f64 * 1000.0 / *lat as f64;
            rep.line(format!("| {name} | {lat} | {mif} | {label} | {} | {ideal:.0} |", mmm(v, 0)));
        }
        rep.line("");
        let row = |who: &str, lat: u64| {
            slow.iter()
                .find(|(n, m, l, t, _)| n == who && (*m == 256 || who == "camel") && *l == "many keys" && *t == lat)
                .map(|r| median(&r.4))
        };
        if let Some(e) = row("outboxd", SLOW_RECEIVER_MS) {
            targets.push((
                "20 ms receiver, 256 in flight: ≥ 5,000 events/s".into(),
                format!("{e:.0} events/s"),
                Some(e >= 5000.0),
            ));
        }
        let mut lats: Vec<u64> = slow.iter().filter(|r| r.0 == "camel").map(|r| r.3).collect();
        lats.sort_unstable();
        let pairs: Vec<(u64, f64, f64)> =
            lats.iter().filter_map(|l| Some((*l, row("outboxd", *l)?, row("camel", *l)?))).collect();
        if !pairs.is_empty() {
            let text =
                pairs.iter().map(|(l, o, c)| format!("{l} ms: {o:.0} vs {c:.0} ({:.1}×)", o / c)).collect::<Vec<_>>();
            targets.push((
                "slow receiver: outboxd (256 in flight) more events/s than camel at every receiver latency".into(),
                text.join("; "),
                Some(pairs.iter().all(|(_, o, c)| o > c)),
            ));
        }
    }

    if !overload.is_empty() {
        let (md, t) = crate::report_overload::overload_section(s.events, overload);
        md.iter().for_each(|l| rep.line(l));
        targets.extend(t);
    }

    if let Some(r) = &store {
        rep.line("## Store");
        rep.line("");
        rep.line(format!(
            "{} events consumed by outboxd as shipped (log handler, fsync on) into a fresh store; measured once.",
            r.records
        ));
        rep.line("");
        rep.line("| measure | value |");
        rep.line("|---|---:|");
        let per = r.bytes_on_disk as f64 / r.done.max(1) as f64;
        rep.line(format!("| records done (`store stats`) | {} |", r.done));
        rep.line(format!("| bytes on disk (`store stats` bytes_on_disk) | {:.1} MB |", mb(r.bytes_on_disk)));
        rep.line(format!("| **bytes on disk per retained record** | **{per:.0}** |"));
        rep.line(format!(
            "| disk blocks allocated in the store directory (du) | {:.1} MB ({:.0} B/record) |",
            mb(r.du_bytes),
            r.du_bytes as f64 / r.done.max(1) as f64
        ));
        rep.line(format!("| **RSS of outboxd with {} records retained** (after the last event, process still running) | **{:.0} MB** |", r.records, mb(r.rss_end)));
        rep.line(format!("| peak RSS during that load (VmHWM) | {:.0} MB |", mb(r.rss_peak)));
        rep.line(format!("| RSS of outboxd-relaxed after the same load | {:.0} MB |", mb(r.relaxed_rss_end)));
        rep.line(format!(
            "| load rate into a growing store: outboxd / outboxd-relaxed | {:.0} / {:.0} events/s |",
            r.load_eps, r.relaxed_load_eps
        ));
        rep.line(format!(
            "| `outboxd store stats` wall time (opens the store, scans every record) | {:.2} s |",
            r.stats_secs
        ));
        rep.line(format!(
            "| **retention pass: `outboxd store gc` wall time, {} expired records** | **{:.2} s** (removed {}) |",
            r.records, r.gc_secs, r.gc_removed
        ));
        rep.line(format!(
            "| of which opening the store (`store get` of an absent id, same store) | {:.2} s |",
            r.open_secs
        ));
        rep.line(format!(
            "| **cold start with {} records: process start → first event handled** | **{:.2} s** (store open {:.2} s, partitions assigned {:.2} s) |",
            r.records, r.cold_handled, r.cold_running, r.cold_assigned
        ));
        rep.line(format!(
            "| cold start with an empty store (baseline) | {:.2} s (store open {:.2} s, partitions assigned {:.2} s) |",
            r.base_handled, r.base_running, r.base_assigned
        ));
        rep.line(format!("| RSS right after the cold start with {} records | {:.0} MB |", r.records, mb(r.cold_rss)));
        rep.line("");
        targets.push(("≤ 200 bytes on disk per retained record".into(), format!("{per:.0} B"), Some(per <= 200.0)));
        let note = if r.records < 1_000_000 {
            format!(" (measured with {} records, not 1M)", r.records)
        } else {
            String::new()
        };
        targets.push((
            format!("RSS ≤ 150 MB with 1M records{note}"),
            format!("{:.0} MB", mb(r.rss_end)),
            Some(r.rss_end as f64 <= 150.0 * 1024.0 * 1024.0),
        ));
    }

    let sections = [
        scale.as_ref().map(crate::report_scale::scale_section),
        restore.as_ref().map(crate::report_restore::restore_section),
        failover.as_ref().map(crate::report_restore::failover_section),
        (!crash.is_empty()).then(|| crate::report_crash::crash_section(crash)),
    ];
    for (md, t) in sections.into_iter().flatten() {
        md.iter().for_each(|l| rep.line(l));
        targets.extend(t);
    }

    if !targets.is_empty() {
        rep.line("## Targets");
        rep.line("");
        rep.line("| target | measured | met? |");
        rep.line("|---|---|---|");
        for (t, m, ok) in &targets {
            let s = match ok {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "inconclusive",
            };
            rep.line(format!("| {t} | {m} | {s} |"));
        }
        rep.line("");
    }

    if let Ok(f) = std::fs::read_to_string(&b.args.findings) {
        rep.line(f.trim_end());
        rep.line("");
    }

    std::fs::write(&b.args.out, &rep.md)?;
    if done {
        println!("{}", rep.md);
    }
    eprintln!("bench: wrote {} ({:.1} min)", b.args.out.display(), elapsed.as_secs_f64() / 60.0);
    Ok(())
}
