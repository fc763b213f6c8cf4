//! The report's sections for the changelog: restore (and the changelog's bytes
//! on the broker) and failover.

use crate::scenarios::failover::{FailoverResult, SESSION_TIMEOUT_MS};
use crate::scenarios::restore::{RestoreResult, Timed};
use crate::stats::{median, mmm};

/// A section's markdown lines and its rows of the targets table.
pub(crate) type Section = (Vec<String>, Vec<(String, String, Option<bool>)>);

fn note(records: u64) -> String {
    if records < 1_000_000 {
        format!(" (measured with {records} records, not 1M)")
    } else {
        String::new()
    }
}

pub(crate) fn restore_section(r: &RestoreResult) -> Section {
    let mut md = vec![
        "## Restore".to_owned(),
        String::new(),
        format!(
            "One changelog partition of {} records as outboxd writes them ({} done records, {} of them preceded by a claim that compaction removes later; filled in {:.1} s), read into an empty store. Records/s = records read / the restore's own seconds; per CPU second = records read / CPU of the outboxd process (for start-up: since the process started).",
            r.records + r.claims,
            r.records,
            r.claims,
            r.fill_secs
        ),
        String::new(),
        "| how | records read | seconds | records/s | process wall s | CPU s | records per CPU second | reading / applying / durable writes, s |".to_owned(),
        "|---|---:|---:|---:|---:|---:|---:|---|".to_owned(),
    ];
    let row = |how: &str, t: &Timed| {
        format!(
            "| {how} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} / {:.2} / {:.2} |",
            t.read,
            t.seconds,
            t.per_sec(),
            t.wall,
            t.cpu,
            t.per_cpu_sec(),
            t.split.0,
            t.split.1,
            t.split.2
        )
    };
    let mut targets = Vec::new();
    if let Some(t) = &r.rebuild {
        md.push(row("`outboxd store rebuild`", t));
    }
    if let Some(t) = &r.startup {
        md.push(row("service start-up (partition assigned)", t));
        targets.push((
            "restore ≥ 300k records/s (start-up restore)".into(),
            format!("{:.0} records/s", t.per_sec()),
            Some(t.per_sec() >= 300_000.0),
        ));
    }
    let per = r.bytes_after as f64 / r.records as f64;
    md.push(String::new());
    md.push(format!(
        "Changelog on the broker (log segments): {:.1} MB before compaction, {:.1} MB after{} = **{per:.1} B per record**.",
        r.bytes_before as f64 / 1048576.0,
        r.bytes_after as f64 / 1048576.0,
        if r.compacted { "" } else { " (the cleaner had not run within 2 min: not compacted)" }
    ));
    md.push(String::new());
    targets.push((
        "changelog bytes per record on the broker ≤ 100 B after compaction".into(),
        format!("{per:.1} B"),
        if r.compacted { Some(per <= 100.0) } else { None },
    ));
    (md, targets)
}

pub(crate) fn failover_section(r: &FailoverResult) -> Section {
    let restored: Vec<f64> = r.restores.iter().map(|x| x.1).collect();
    let read: Vec<f64> = r.restores.iter().map(|x| x.0).collect();
    let standby_restored: Vec<f64> = r.standby_restores.iter().map(|x| x.1).collect();
    let standby_read: Vec<f64> = r.standby_restores.iter().map(|x| x.0).collect();
    let md = vec![
        "## Failover".to_owned(),
        String::new(),
        format!(
            "Two outboxd instances in one group on a 1-partition topic whose changelog holds {} records (`session.timeout.ms = {SESSION_TIMEOUT_MS}`). The owner restored the partition, then is killed with SIGKILL and one event is produced; measured: the kill → the survivor's first handler call, minus the session timeout. Without a standby the survivor's store is empty: it restores the whole partition. With `store.changelog.standby = true` the survivor tailed the changelog before the kill.",
            r.records
        ),
        String::new(),
        "| survivor | failover s (median, min–max) | its restore on takeover, s | records it read then |".to_owned(),
        "|---|---:|---:|---:|".to_owned(),
        format!("| empty store | {} | {} | {} |", mmm(&r.failover, 2), mmm(&restored, 2), mmm(&read, 0)),
        format!(
            "| standby | {} | {} | {} |",
            mmm(&r.standby_failover, 2),
            mmm(&standby_restored, 2),
            mmm(&standby_read, 0)
        ),
        String::new(),
    ];
    let (m, s) = (median(&r.failover), median(&r.standby_failover));
    let targets = vec![
        (
            format!("failover ≤ 3 s after the session timeout with 1M records{}", note(r.records)),
            format!("{m:.2} s"),
            Some(m <= 3.0),
        ),
        (format!("failover ≤ 0.5 s with a standby{}", note(r.records)), format!("{s:.2} s"), Some(s <= 0.5)),
    ];
    (md, targets)
}
