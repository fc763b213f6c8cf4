//! The report's section for the crash scenario: per contender, events lost and side
//! effects repeated after three SIGKILLs and a Debezium replay, and the delivery
//! guarantee those counts amount to.

use crate::bench::Contender;
use crate::report_restore::Section;
use crate::scenarios::crash::{CrashResult, KILLS, RECEIVER_MS, REPLAY_SHARE};

/// The guarantee the counts show: exactly once, at least once, at most once or neither.
fn guarantee(r: &CrashResult) -> String {
    let repeated = r.repeats_same_key + r.repeats_new_key;
    let g = match (r.lost, repeated) {
        (0, 0) => "exactly once: 0 lost, 0 repeated".to_owned(),
        (0, n) if r.repeats_new_key == 0 => {
            format!("at least once: 0 lost, {n} repeated, all with the same Idempotency-Key")
        }
        (0, n) => format!("at least once: 0 lost, {n} repeated"),
        (l, 0) => format!("at most once: {l} lost"),
        (l, n) => format!("neither: {l} lost, {n} repeated"),
    };
    if r.partial {
        format!("{g} (not drained within the cap: incomplete)")
    } else {
        g
    }
}

pub(crate) fn crash_section(results: &[CrashResult]) -> Section {
    let pct = |v: &[f64]| v.iter().map(|s| format!("{:.0}%", s * 100.0)).collect::<Vec<_>>().join(", ");
    let events = results.first().map(|r| r.events).unwrap_or(0);
    let mut md = vec![
        "## Crash".to_owned(),
        String::new(),
        format!(
            "Per contender, its own topic of {events} events (8 partitions, HTTP handler, the receiver answers 200 after {RECEIVER_MS} ms). SIGKILL once the group has committed {} of the messages, each time restarted at once with the same config, store (or PostgreSQL table) and group; after the third restart the last {:.0}% of the events are produced again at new offsets with the same ids (a Debezium replay from its last flushed offset); then drained until every offset is committed and the receiver has had no call for 1 s. Lost = events never answered 2xx; repeated = 2xx calls for an event the receiver had already answered 2xx, with the same `Idempotency-Key` (a receiver that deduplicates by the key recognises them) or with a new key / none (nobody can).",
            pct(&KILLS),
            REPLAY_SHARE * 100.0
        ),
        String::new(),
        "| contender | killed at (committed) | replayed messages | lost | repeats with the same Idempotency-Key (deduplicable by the receiver) | repeats with a new key / no key | calls | wall s (restarts included) | guarantee in practice |".to_owned(),
        "|---|---|---:|---:|---:|---:|---:|---:|---|".to_owned(),
    ];
    for r in results {
        md.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            r.who.name(),
            pct(&r.kills_at),
            r.replayed,
            r.lost,
            r.repeats_same_key,
            r.repeats_new_key,
            r.calls,
            r.secs,
            guarantee(r)
        ));
    }
    md.push(String::new());
    md.push("outboxd's repeats are the calls in flight at a kill: not final, so the restarted process runs them again, with the same idempotency key (`on_uncertain = \"retry\"`, the default; `verify` or `park` claim durably and ask the receiver or park instead). Done events, the replayed ones included, are suppressed by its store.".to_owned());
    md.push(String::new());
    let targets = results
        .iter()
        .filter(|r| r.who == Contender::Outboxd)
        .map(|r| {
            (
                "crash: outboxd loses no event and repeats only with the same Idempotency-Key".to_owned(),
                format!(
                    "{} lost, {} repeated with the same key, {} with a new key",
                    r.lost, r.repeats_same_key, r.repeats_new_key
                ),
                Some(!r.partial && r.lost == 0 && r.repeats_new_key == 0),
            )
        })
        .collect();
    (md, targets)
}
