//! Scale: stores of N records made directly (no Kafka), packed as gc leaves them
//! and one entry per record as stores written before packed runs hold them, and
//! a small packed store for the CPU baseline; each opened and measured in a
//! process of its own (`outboxd-bench scale-measure`, bench/src/scale.rs).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use outboxd_bench::scale::{Fabricated, Measured};

use crate::bench::Bench;

/// The retention the stores are made with (and opened with): a week, as teams keep it.
pub(crate) const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Records of the baseline store the CPU per event is compared with.
pub(crate) const BASELINE_RECORDS: u64 = 100_000;

#[derive(Debug, Default)]
pub(crate) struct ScaleStore {
    pub(crate) made: Fabricated,
    pub(crate) du_bytes: u64,
    pub(crate) measured: Measured,
}

#[derive(Debug, Default)]
pub(crate) struct ScaleResult {
    pub(crate) records: u64,
    pub(crate) events: u64,
    /// Store CPU per event (µs) of the packed store and of the baseline, from
    /// interleaved runs, each on a fresh copy of the store made once.
    pub(crate) cpu_runs: Vec<(f64, f64)>,
    pub(crate) packed: ScaleStore,
    pub(crate) per_record: ScaleStore,
    pub(crate) baseline: ScaleStore,
}

async fn child(args: &[String]) -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let out = tokio::process::Command::new(exe).args(args).stderr(std::process::Stdio::inherit()).output().await?;
    anyhow::ensure!(out.status.success(), "outboxd-bench {} failed: {}", args.join(" "), out.status);
    Ok(String::from_utf8(out.stdout)?)
}

async fn one(b: &Bench, name: &str, records: u64, packed: bool, events: u64) -> anyhow::Result<ScaleStore> {
    let dir = b.work.join("stores").join(format!("scale-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("bench: scale: making the {name} store of {records} records");
    let made = fabricate(&dir, records, packed).await?;
    let du_bytes = crate::scenarios::store::dir_bytes(Path::new(&dir));
    eprintln!("bench: scale: measuring the {name} store");
    // The packed store also packs its largest slice anew; the other is sealed.
    let measured = measure(&dir, events, !packed, packed).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ScaleStore { made, du_bytes, measured })
}

/// Opens the store at `dir` in a process of its own and measures it (with `seal`,
/// seals what a gc pass would; with `merge`, packs its largest slice anew).
async fn measure(dir: &Path, events: u64, seal: bool, merge: bool) -> anyhow::Result<Measured> {
    let mut args = vec!["scale-measure".into(), "--dir".into(), dir.display().to_string()];
    args.extend(["--events".into(), events.to_string(), "--retention-secs".into(), RETENTION.as_secs().to_string()]);
    if seal {
        args.push("--seal".into());
    }
    if merge {
        args.push("--merge".into());
    }
    serde_json::from_str(&child(&args).await?).context("scale-measure's answer")
}

/// Makes a store of `records` at `dir` in a process of its own.
async fn fabricate(dir: &Path, records: u64, packed: bool) -> anyhow::Result<Fabricated> {
    let mut make = vec!["scale-fabricate".into(), "--dir".into(), dir.display().to_string()];
    make.extend(["--records".into(), records.to_string(), "--retention-secs".into(), RETENTION.as_secs().to_string()]);
    if packed {
        make.push("--packed".into());
    }
    serde_json::from_str(&child(&make).await?).context("scale-fabricate's answer")
}

/// The store CPU per event of a copy of the store at `dir` (the measure changes
/// the store it opens).
async fn cpu_of_copy(dir: &Path, events: u64) -> anyhow::Result<f64> {
    let copy = dir.with_extension("copy");
    let _ = std::fs::remove_dir_all(&copy);
    let cp = tokio::process::Command::new("cp").arg("-a").arg(dir).arg(&copy).status().await?;
    anyhow::ensure!(cp.success(), "copying {} failed: {cp}", dir.display());
    let measured = measure(&copy, events, false, false).await;
    let _ = std::fs::remove_dir_all(&copy);
    Ok(measured?.cpu_per_event_us)
}

pub(crate) async fn scale_scenario(b: &Bench) -> anyhow::Result<ScaleResult> {
    let records = b.sizes.scale_records;
    let events = 20_000;
    Ok(ScaleResult {
        records,
        events,
        cpu_runs: cpu_runs(b, records, events).await?,
        packed: one(b, "packed", records, true, events).await?,
        per_record: one(b, "per-record", records, false, events).await?,
        baseline: one(b, "baseline", BASELINE_RECORDS, true, events).await?,
    })
}

/// The CPU per event of a packed store of `records` and of the baseline, in
/// interleaved runs (one measure each is at the mercy of whatever else ran then).
async fn cpu_runs(b: &Bench, records: u64, events: u64) -> anyhow::Result<Vec<(f64, f64)>> {
    let stores = b.work.join("stores");
    let (big, small) = (stores.join("scale-cpu-big"), stores.join("scale-cpu-baseline"));
    for (dir, n) in [(&big, records), (&small, BASELINE_RECORDS)] {
        let _ = std::fs::remove_dir_all(dir);
        eprintln!("bench: scale: making a packed store of {n} records for the CPU runs");
        fabricate(dir, n, true).await?;
    }
    let mut runs = Vec::new();
    for run in 1..=b.sizes.runs {
        eprintln!("bench: scale: CPU run {run} of {}", b.sizes.runs);
        runs.push((cpu_of_copy(&big, events).await?, cpu_of_copy(&small, events).await?));
    }
    let _ = std::fs::remove_dir_all(&big);
    let _ = std::fs::remove_dir_all(&small);
    Ok(runs)
}
