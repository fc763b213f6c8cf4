//! `outboxd store replay`: the window's records and what the topic still holds of
//! them first (all of it with `--dry-run`), then each event run again in turn,
//! with progress, and what came of it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use serde_json::json;

use crate::config::Config;
use crate::ops::{self, Actor, StoreApi, Window};
use crate::wire::{rfc3339, RecordView, ReplayView};

/// How a replay runs, besides its window.
pub(super) struct How {
    /// Print the impact and change nothing.
    pub dry_run: bool,
    /// Send new idempotency keys.
    pub new_key: bool,
    /// Machine-readable output.
    pub json: bool,
    /// The config file (its `[kafka]` for the dry run's look at the topic).
    pub config: PathBuf,
}

/// Selects, shows the impact, and (unless a dry run) replays one event after the other.
pub(super) async fn run(api: &impl StoreApi, window: &Window, how: &How, actor: &Actor) -> anyhow::Result<()> {
    let records = ops::select(api, window).await?;
    eprintln!(
        "{} record(s) of {} first seen from {} until {}{}{}",
        records.len(),
        window.topic,
        rfc3339(window.since_us),
        rfc3339(window.until_us),
        window.event_type.as_ref().map_or_else(String::new, |t| format!(", of type {t}")),
        states(&records),
    );
    if how.dry_run {
        return dry_run(&records, how).await;
    }
    let new_key = how.new_key.then(ops::new_key_token);
    if let Some(token) = &new_key {
        eprintln!("new idempotency keys end in {}", ops::new_key_suffix(token)?);
    }
    let progress = indicatif::ProgressBar::new(records.len() as u64)
        .with_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} replayed, {per_sec}, eta {eta}")?);
    let mut results = Vec::with_capacity(records.len());
    for record in &records {
        match api.replay(record, new_key.as_deref(), actor).await {
            Ok(view) => results.push((record, view)),
            Err(e) => {
                progress.finish_and_clear();
                report(&results, how.json);
                // Later events of its key must not overtake it: the replay stops here.
                return Err(anyhow::Error::new(e).context(format!(
                    "the replay stopped at {} ({}/{}@{}); {} of {} replayed before it",
                    record.event_id,
                    record.topic,
                    record.partition,
                    record.offset,
                    results.len(),
                    records.len()
                )));
            }
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    report(&results, how.json);
    let not = results.iter().filter(|(_, v)| !matches!(v, ReplayView::Ran { .. })).count();
    if not > 0 {
        bail!("{not} event(s) were not replayed: the topic no longer holds their messages (above)");
    }
    Ok(())
}

/// `, 3 done, 1 dead`: the selection per state.
fn states(records: &[RecordView]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in records {
        *counts.entry(r.state.to_string()).or_default() += 1;
    }
    counts.iter().map(|(state, n)| format!(", {n} {state}")).collect()
}

/// What a replay would do: the records, and which of them the topic no longer holds.
async fn dry_run(records: &[RecordView], how: &How) -> anyhow::Result<()> {
    let kafka = Config::load(&how.config)?.kafka;
    let firsts = ops::Rereads::default().first_offsets(&kafka, records).await?;
    let held = |r: &RecordView| firsts.get(&(r.topic.clone(), r.partition)).is_none_or(|first| r.offset >= *first);
    let expired: Vec<&RecordView> = records.iter().filter(|r| !held(r)).collect();
    if how.json {
        let lines: Vec<_> = records
            .iter()
            .map(|r| json!({"event_id": r.event_id, "scope": ops::scope_of(r), "state": r.state,
                "partition": r.partition, "offset": r.offset, "held_by_topic": held(r)}))
            .collect();
        println!("{}", serde_json::Value::Array(lines));
    } else {
        let shown: Vec<RecordView> = records.iter().filter(|r| held(r)).cloned().collect();
        println!("{}", super::tables::records_table(&shown));
        println!("{} event(s) would run again (dry run: nothing was changed)", shown.len());
        if !expired.is_empty() {
            println!("{}", past_retention(&expired, &firsts));
        }
    }
    Ok(())
}

/// Which records the topic no longer holds, per partition.
fn past_retention(expired: &[&RecordView], firsts: &BTreeMap<(String, i32), i64>) -> String {
    let mut per: BTreeMap<(String, i32), (usize, i64, i64)> = BTreeMap::new();
    for r in expired {
        let e = per.entry((r.topic.clone(), r.partition)).or_insert((0, i64::MAX, i64::MIN));
        *e = (e.0 + 1, e.1.min(r.offset), e.2.max(r.offset));
    }
    let lines: Vec<String> = per
        .iter()
        .map(|((t, p), (n, lo, hi))| {
            let first = firsts.get(&(t.clone(), *p)).copied().unwrap_or_default();
            format!("  {t}/{p}: {n} event(s) at offsets {lo}..={hi}; the partition begins at {first} now")
        })
        .collect();
    format!(
        "{} event(s) cannot be replayed: the topic's retention deleted their messages\n{}",
        expired.len(),
        lines.join("\n")
    )
}

/// What came of each replayed event: a line per event not replayed, then the counts.
fn report(results: &[(&RecordView, ReplayView)], as_json: bool) {
    if as_json {
        let lines: Vec<_> = results
            .iter()
            .map(|(r, v)| json!({"event_id": r.event_id, "scope": ops::scope_of(r), "partition": r.partition,
                "offset": r.offset, "result": v}))
            .collect();
        println!("{}", serde_json::Value::Array(lines));
        return;
    }
    let mut ran: BTreeMap<String, usize> = BTreeMap::new();
    let mut not = Vec::new();
    for (r, v) in results {
        match v {
            ReplayView::Ran { record } => *ran.entry(record.state.to_string()).or_default() += 1,
            ReplayView::Expired { first_offset } => not.push(format!(
                "  {} ({}/{}@{}): the topic no longer holds it (the partition begins at {first_offset})",
                r.event_id, r.topic, r.partition, r.offset
            )),
            ReplayView::Missing => not.push(format!(
                "  {} ({}/{}@{}): the partition does not hold this offset (compacted away?)",
                r.event_id, r.topic, r.partition, r.offset
            )),
            ReplayView::NotRun { .. } => not.push(format!(
                "  {} ({}/{}@{}, {}): no route takes it under this record now (the config changed?); left as it was",
                r.event_id,
                r.topic,
                r.partition,
                r.offset,
                ops::scope_of(r)
            )),
            ReplayView::Other { event_id } => not.push(format!(
                "  {} ({}/{}@{}): another event ({event_id}) is at this offset now (was the topic created again?)",
                r.event_id, r.topic, r.partition, r.offset
            )),
        }
    }
    let total: usize = ran.values().sum();
    let counts: Vec<String> = ran.iter().map(|(state, n)| format!("{n} {state}")).collect();
    println!("replayed {total} event(s){}", if counts.is_empty() { String::new() } else { format!(": {}", counts.join(", ")) });
    if !not.is_empty() {
        println!("{} event(s) not replayed:\n{}", not.len(), not.join("\n"));
    }
}
