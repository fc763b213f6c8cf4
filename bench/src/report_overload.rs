//! The report's section for the overloaded receiver: fixed in-flight limit
//! against adaptive concurrency, with the circuit breaker as shipped and off,
//! and their ratios.

use crate::report_restore::Section;
use crate::scenarios::overload::{Limit, OverloadResult, MAX_ATTEMPTS, MAX_IN_FLIGHT, MODEL, OVERLOAD_KEYS};
use crate::stats::{median, mmm};

/// What the scenario measured: per contender, one result per run.
pub(crate) type Overloaded = Vec<(Limit, Vec<OverloadResult>)>;

/// The columns with a ratio: name, how one run gives it, decimals.
type Column = (&'static str, fn(&OverloadResult) -> f64, usize);

const COLUMNS: [Column; 5] = [
    ("events/s", |r| r.eps, 0),
    ("p99 produce → 2xx, ms", |r| r.p99_ms, 0),
    ("p99 first call → 2xx, ms", |r| r.retry_p99_ms, 0),
    ("503s at the receiver per 1,000 events", |r| r.per_1000(r.unavailable), 0),
    ("calls per event", |r| r.calls_per_event(), 2),
];

fn med(v: &[OverloadResult], f: impl Fn(&OverloadResult) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

fn row(who: Limit, v: &[OverloadResult]) -> String {
    let cells: Vec<String> = COLUMNS.iter().map(|(_, f, d)| mmm(&v.iter().map(f).collect::<Vec<_>>(), *d)).collect();
    let partial = if v.iter().any(|r| r.partial) { " (stopped at the cap before the last event)" } else { "" };
    let flight = format!(
        "{:.0} / {:.0} / {:.0}",
        med(v, |r| r.in_flight.0),
        med(v, |r| r.in_flight.1),
        med(v, |r| r.in_flight.2)
    );
    let limits: Vec<[f64; 5]> = v.iter().filter_map(|r| r.limit).collect();
    let limit = if limits.is_empty() {
        "–".to_owned()
    } else {
        let m = |i: usize| median(&limits.iter().map(|l| l[i]).collect::<Vec<_>>());
        let lo = limits.iter().map(|l| l[3]).fold(f64::INFINITY, f64::min);
        let hi = limits.iter().map(|l| l[4]).fold(f64::NEG_INFINITY, f64::max);
        format!("{:.0} / {:.0} / {:.0} ({lo:.0}–{hi:.0})", m(0), m(1), m(2))
    };
    let circuit = if !who.circuit {
        "off".to_owned()
    } else if v.iter().all(|r| r.circuit.is_none()) {
        "–".to_owned()
    } else {
        let opens = med(v, |r| r.circuit.map_or(f64::NAN, |c| c.0));
        let share = med(v, |r| r.circuit.map_or(f64::NAN, |c| c.1 / r.secs));
        format!("{opens:.0} / {:.0}%", share * 100.0)
    };
    let repeats: u64 = v.iter().map(|r| r.repeats).sum();
    format!("| {}{partial} | {} | {flight} | {limit} | {circuit} | {repeats} |", who.name(), cells.join(" | "))
}

/// adaptive / fixed of each ratio column, when both ran with this circuit setting.
fn ratio_row(runs: &Overloaded, circuit: bool) -> Option<String> {
    let get = |adaptive| runs.iter().find(|(w, _)| w.adaptive == Some(adaptive) && w.circuit == circuit).map(|r| &r.1);
    let (f, a) = (get(false)?, get(true)?);
    let cells: Vec<String> = COLUMNS
        .iter()
        .map(|(_, m, _)| {
            let (fm, am) = (med(f, m), med(a, m));
            if fm > 0.0 && am.is_finite() {
                format!("**{:.2}×**", am / fm)
            } else {
                "–".into()
            }
        })
        .collect();
    let what = if circuit { "adaptive / fixed" } else { "adaptive / fixed, circuit off" };
    Some(format!("| *{what} (medians)* | {} | | | | |", cells.join(" | ")))
}

pub(crate) fn overload_section(events: u64, runs: &Overloaded) -> Section {
    let mut md = vec![
        "## Overloaded receiver".to_owned(),
        String::new(),
        format!(
            "The receiver holds a call admitted as the n-th in flight for {} ms + n × {} ms and answers 503 at once (no `Retry-After`) to a call that arrives while {} are in flight: it completes {:.0} calls/s at that knee, {:.0} with 16 in flight. {events} events over {OVERLOAD_KEYS} keys and 8 partitions, produced at once after the contender was assigned its fresh topic (a backlog, stamped with the produce time), drained. events/s = events / (first call → the last event's first 2xx); latency from produce time; first call → 2xx is what an event's retries cost it. Every contender: `store.max_in_flight = {MAX_IN_FLIGHT}`, `[handlers.retry] max_attempts = {MAX_ATTEMPTS}` (shipped backoff). `outboxd-fixed`: `[handlers.concurrency] adaptive = false, max = {MAX_IN_FLIGHT}`; `outboxd-adaptive`: `adaptive = true`, same max; `outboxd`: no `[handlers.concurrency]` table (as shipped); the circuit breaker as shipped, `-nocircuit`: `[handlers.circuit] enabled = false`. Calls in flight at the receiver sampled every 20 ms, outboxd's limit (`outboxd_handler_concurrency_limit`) every 250 ms, both from the first call on (medians over runs; min–max over all samples). Circuit = times it opened (`outboxd_handler_circuit_transitions_total{{to=\"open\"}}`) / share of the run it was not closed (`outboxd_handler_circuit_open_seconds`).",
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
        "| contender | {} | calls in flight at the receiver, p10 / p50 / p90 | outboxd's limit, p10 / p50 / p90 (min–max) | circuit: opened / not closed | repeats after a 2xx |",
        head.join(" | ")
    ));
    md.push(format!("|---|{}---|---|---:|---:|", "---:|".repeat(COLUMNS.len())));
    for (who, v) in runs {
        md.push(row(*who, v));
    }
    md.extend([true, false].into_iter().filter_map(|c| ratio_row(runs, c)));
    md.push(String::new());
    let opened: Vec<String> = runs
        .iter()
        .filter(|(w, v)| w.circuit && v.iter().any(|r| r.circuit.is_some_and(|c| c.0 > 0.0)))
        .map(|(w, v)| {
            let n: Vec<String> = v.iter().map(|r| format!("{:.0}", r.circuit.map_or(0.0, |c| c.0))).collect();
            format!("{} {} times", w.name(), n.join(", "))
        })
        .collect();
    let on: Vec<&OverloadResult> = runs.iter().filter(|(w, _)| w.circuit).flat_map(|(_, v)| v).collect();
    if !on.is_empty() {
        md.push(if on.iter().all(|r| r.circuit.is_none()) {
            "This build exports no circuit breaker metrics.".to_owned()
        } else if opened.is_empty() {
            "The circuit breaker did not open in any run.".to_owned()
        } else {
            format!(
                "**The circuit breaker opened** although 503s were mixed with successes (per run): {}.",
                opened.join("; ")
            )
        });
        md.push(String::new());
    }
    md.push("No event ended dead in any run (the scenario fails otherwise); repeats = calls whose `Idempotency-Key` had already been answered 2xx (a second side effect).".to_owned());
    md.push(String::new());
    (md, Vec::new())
}
