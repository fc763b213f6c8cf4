//! The report's section for the overloaded receiver: fixed in-flight limit
//! against adaptive concurrency, with their ratios.

use crate::report_restore::Section;
use crate::scenarios::overload::{Limit, OverloadResult, MAX_IN_FLIGHT, MODEL, OVERLOAD_KEYS};
use crate::stats::{median, mmm};

/// What the scenario measured: per contender, one result per run.
pub(crate) type Overloaded = Vec<(Limit, Vec<OverloadResult>)>;

/// The columns: name, how one run gives it, decimals.
type Column = (&'static str, fn(&OverloadResult) -> f64, usize);

const COLUMNS: [Column; 5] = [
    ("events/s", |r| r.eps, 0),
    ("p99 produce → 2xx, ms", |r| r.p99_ms, 0),
    ("p99 first call → 2xx, ms", |r| r.retry_p99_ms, 0),
    ("503s at the receiver per 1,000 events", |r| r.per_1000(r.unavailable), 0),
    ("calls per event", |r| r.calls_per_event(), 2),
];

pub(crate) fn overload_section(events: u64, runs: &Overloaded) -> Section {
    let mut md = vec![
        "## Overloaded receiver".to_owned(),
        String::new(),
        format!(
            "The receiver holds a call admitted as the n-th in flight for {} ms + n × {} ms and answers 503 at once (no `Retry-After`) to a call that arrives while {} are in flight: it completes {:.0} calls/s at that knee, {:.0} with 16 in flight. {events} events over {OVERLOAD_KEYS} keys and 8 partitions, produced at once after the contender was assigned its fresh topic (a backlog, stamped with the produce time), drained. events/s = events / (first call → the last event's first 2xx); latency from produce time; first call → 2xx is what an event's retries cost it. Both contenders: `store.max_in_flight = {MAX_IN_FLIGHT}`, `[handlers.concurrency] max = {MAX_IN_FLIGHT}`, `[handlers.retry] max_attempts = 50` (shipped backoff), circuit breaker as shipped; `outboxd-fixed` has `adaptive = false`, `outboxd-adaptive` `adaptive = true`, `outboxd` no `[handlers.concurrency]` table. Calls in flight at the receiver sampled every 20 ms.",
            MODEL.base.as_millis(),
            MODEL.per_call.as_millis(),
            MODEL.knee,
            MODEL.throughput(MODEL.knee),
            MODEL.throughput(16),
        ),
        String::new(),
    ];
    let head: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    md.push(format!(
        "| contender | {} | calls in flight at the receiver, p10 / p50 / p90 | repeats after a 2xx |",
        head.join(" | ")
    ));
    md.push(format!("|---|{}---|---:|", "---:|".repeat(COLUMNS.len())));
    for (who, v) in runs {
        let cells: Vec<String> =
            COLUMNS.iter().map(|(_, f, d)| mmm(&v.iter().map(f).collect::<Vec<_>>(), *d)).collect();
        let flight = |f: fn(&(f64, f64, f64)) -> f64| median(&v.iter().map(|r| f(&r.in_flight)).collect::<Vec<_>>());
        let partial = if v.iter().any(|r| r.partial) { " (stopped at the cap before the last event)" } else { "" };
        md.push(format!(
            "| {}{partial} | {} | {:.0} / {:.0} / {:.0} | {} |",
            who.name(),
            cells.join(" | "),
            flight(|t| t.0),
            flight(|t| t.1),
            flight(|t| t.2),
            v.iter().map(|r| r.repeats).sum::<u64>(),
        ));
    }
    let get = |l: Limit| runs.iter().find(|(w, _)| *w == l).map(|(_, v)| v);
    if let (Some(f), Some(a)) = (get(Limit::Fixed), get(Limit::Adaptive)) {
        let cells: Vec<String> = COLUMNS
            .iter()
            .map(|(_, m, _)| {
                let (fm, am) =
                    (median(&f.iter().map(m).collect::<Vec<_>>()), median(&a.iter().map(m).collect::<Vec<_>>()));
                if fm > 0.0 && am.is_finite() {
                    format!("**{:.2}×**", am / fm)
                } else {
                    "–".into()
                }
            })
            .collect();
        md.push(format!("| *adaptive / fixed (medians)* | {} | | |", cells.join(" | ")));
    }
    md.push(String::new());
    let all: Vec<&OverloadResult> = runs.iter().flat_map(|(_, v)| v).collect();
    let opened: Vec<String> = runs
        .iter()
        .filter(|(_, v)| v.iter().any(|r| r.circuit_transitions() > 0.0))
        .map(|(w, v)| {
            let s: Vec<String> = v.iter().map(|r| format!("{:?}", r.circuit.clone().unwrap_or_default())).collect();
            format!("{}: {}", w.name(), s.join("; "))
        })
        .collect();
    md.push(if all.iter().all(|r| r.circuit.is_none()) {
        "No `outboxd_handler_circuit_transitions_total` series on `/metrics` at the end of any run: the circuit breaker did not change state (the counter appears with its first transition), or this build has none.".to_owned()
    } else if opened.is_empty() {
        "The circuit breaker did not change state in any run (`outboxd_handler_circuit_transitions_total` = 0).".to_owned()
    } else {
        format!("**The circuit breaker changed state** (`outboxd_handler_circuit_transitions_total`, per run): {}.", opened.join("; "))
    });
    md.push(String::new());
    md.push("No event ended dead in any run (the scenario fails otherwise); repeats = calls whose `Idempotency-Key` had already been answered 2xx (a second side effect).".to_owned());
    md.push(String::new());
    (md, Vec::new())
}
