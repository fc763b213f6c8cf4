//! The report's section for the scale scenario, with its rows of the targets table.

use crate::report_restore::Section;
use crate::scenarios::scale::{ScaleResult, ScaleStore, BASELINE_RECORDS};

fn mb(b: f64) -> f64 {
    b / (1024.0 * 1024.0)
}

pub(crate) fn scale_section(r: &ScaleResult) -> Section {
    let (p, o) = (&r.packed, &r.per_record);
    let per = |s: &ScaleStore| s.du_bytes as f64 / s.made.records.max(1) as f64;
    let mut md = vec![
        "## Scale".to_owned(),
        String::new(),
        format!(
            "Stores of {} records made directly (7 days of retention, a record dead every 1,000, the rest done), each opened in a process of its own with the shipped page cache, as the service opens it: **packed** (the slices whose time has passed sealed into runs, as gc leaves them), **one entry per record** (as stores written before packed runs hold them; sealed at the end, as the first gc pass converts them), and a packed store of {} records for the CPU baseline. Events: {} new events claimed and recorded done, 64 at a time (store only: no Kafka, no handler). The RSS is the store's process alone, not the service's.",
            r.records, BASELINE_RECORDS, r.events
        ),
        String::new(),
        "| measure | packed | one entry per record |".to_owned(),
        "|---|---:|---:|".to_owned(),
    ];
    let row = |what: &str, f: &dyn Fn(&ScaleStore) -> String| format!("| {what} | {} | {} |", f(p), f(o));
    md.push(row("made in, s", &|s| format!("{:.1}", s.made.secs)));
    md.push(row("disk per record (du), B", &|s| format!("{:.0}", per(s))));
    md.push(row("store open, s", &|s| format!("{:.2}", s.measured.open_secs)));
    md.push(row("open + lookup filters built, s", &|s| format!("{:.2}", s.measured.filters_secs)));
    md.push(row("RSS when the store opened, MB", &|s| format!("{:.0}", mb(s.measured.rss_opened as f64))));
    md.push(row("RSS once the filters hold every key, MB", &|s| format!("{:.0}", mb(s.measured.rss_open as f64))));
    md.push(row("RSS after the events, MB", &|s| format!("{:.0}", mb(s.measured.rss_live as f64))));
    md.push(row("store CPU per event, µs", &|s| format!("{:.1}", s.measured.cpu_per_event_us)));
    md.push(row("oldest slice dropped: records", &|s| s.measured.drop_records.to_string()));
    md.push(row("oldest slice dropped: s", &|s| format!("{:.2}", s.measured.drop_secs)));
    md.push(row("oldest slice dropped: RSS rise (VmHWM − RSS before), MB", &|s| {
        format!("{:.1}", s.measured.drop_rss_rise as f64 / 1048576.0)
    }));
    md.push(format!(
        "| largest slice packed anew, as a grown live slice's merge: records, s, RSS rise (VmHWM − RSS before), MB | {} in {:.1} s, {:.1} | |",
        p.measured.merge_records,
        p.measured.merge_secs,
        p.measured.merge_rss_rise as f64 / 1048576.0
    ));
    md.push(format!(
        "| sealing a store written before runs: records, s, records/s | | {} in {:.1} s ({:.0}/s) |",
        o.measured.sealed_records,
        o.measured.seal_secs,
        o.measured.sealed_records as f64 / o.measured.seal_secs.max(1e-9)
    ));
    // The interleaved runs' medians (the single measures above if there are none).
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let big = median(r.cpu_runs.iter().map(|c| c.0).collect()).unwrap_or(p.measured.cpu_per_event_us);
    let small = median(r.cpu_runs.iter().map(|c| c.1).collect()).unwrap_or(r.baseline.measured.cpu_per_event_us);
    let cpu_ratio = big / small.max(1e-9);
    let each: Vec<String> = r.cpu_runs.iter().map(|(a, b)| format!("{:.2}", a / b.max(1e-9))).collect();
    md.push(format!(
        "| store CPU per event at {} vs at {} records (packed; median of {} interleaved runs, each run's ratio: {}) | {:.2}× ({:.1} vs {:.1} µs) | |",
        r.records,
        BASELINE_RECORDS,
        r.cpu_runs.len(),
        each.join(", "),
        cpu_ratio,
        big,
        small
    ));
    md.push(String::new());
    let note =
        if r.records < 10_000_000 { format!(" (measured with {} records, not 10M)", r.records) } else { String::new() };
    let targets = vec![
        (
            format!("scale: store RSS ≤ 150 MB with 10M records{note}"),
            format!("{:.0} MB", mb(p.measured.rss_live as f64)),
            Some(mb(p.measured.rss_live as f64) <= 150.0),
        ),
        (
            format!("scale: RSS rise ≤ 20 MB while a slice is dropped{note}"),
            format!("{:.1} MB ({} records)", p.measured.drop_rss_rise as f64 / 1048576.0, p.measured.drop_records),
            Some(p.measured.drop_rss_rise as f64 <= 20.0 * 1048576.0),
        ),
        (format!("scale: ≤ 120 B on disk per record{note}"), format!("{:.0} B", per(p)), Some(per(p) <= 120.0)),
        (
            format!("scale: store open + filters ≤ 5 s with 10M records{note}"),
            format!("{:.2} s", p.measured.filters_secs),
            Some(p.measured.filters_secs <= 5.0),
        ),
        (
            format!("scale: store CPU per event at N vs {BASELINE_RECORDS} ≤ 1.3×{note}"),
            format!("{cpu_ratio:.2}×"),
            Some(cpu_ratio <= 1.3),
        ),
    ];
    (md, targets)
}
