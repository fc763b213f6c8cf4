//! The Grafana dashboard (`deploy/grafana-dashboard.json`) shows what outboxd exports:
//! every panel queries outboxd metrics, each by a name outboxd exports and as what it
//! is (counters and histograms through `rate`/`increase`, gauges as they are), and a
//! running outboxd serves each of them on `/metrics` with that type.

use std::collections::BTreeSet;
use std::time::Duration;

use outboxd::metrics::names;
use serde_json::json;

use crate::harness::{new_event_id, Behaviour, Scenario};

/// Metrics by type, as outboxd records them (`metrics::counter!` and so on).
const COUNTERS: &[&str] = &[
    names::CONSUMED,
    names::HANDLED,
    names::DUPLICATES,
    names::RETRIED,
    names::DEAD,
    names::PARKED,
    names::REEXECUTED,
    names::SCHEMA_REGISTRY_ERRORS,
    names::PANICS,
    names::COPIES_NOT_KEPT,
];
const GAUGES: &[&str] = &[
    names::IN_FLIGHT,
    names::LAG,
    names::COMMITTED,
    names::RECORDS,
    names::STORE_BYTES,
    names::STALLED,
    names::COPY_BYTES,
    names::CIRCUIT,
    names::CONCURRENCY,
    names::BROKER_REACHABLE,
];
const HISTOGRAMS: &[&str] = &[names::HANDLER_SECONDS, names::AGE_SECONDS, names::BATCH, names::SYNC_SECONDS];
/// The series a histogram is queried by.
const HISTOGRAM_SERIES: &[&str] = &["_bucket", "_sum", "_count"];

/// Bound for the scenario of the live check to be handled and committed.
const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for every expected metric to show up on `/metrics` (lag and committed offsets
/// come with librdkafka's statistics, every 2 s; store gauges every 10 s).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As Prometheus' `# TYPE` line says it.
    fn prometheus(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric reference in a panel's query.
#[derive(Debug)]
struct Reference {
    panel: String,
    expr: String,
    /// As written, e.g. `outboxd_handler_duration_seconds_bucket`.
    series: String,
    /// The exported metric it belongs to and its type; `None` when outboxd exports no
    /// such series.
    metric: Option<(&'static str, Kind)>,
    /// The function the reference is the direct argument of (`rate`, `sum`, ...).
    function: String,
}

/// The exported metric a series belongs to.
fn exported(series: &str) -> Option<(&'static str, Kind)> {
    let find = |list: &[&'static str], name: &str| list.iter().copied().find(|m| *m == name);
    if let Some(m) = find(COUNTERS, series) {
        return Some((m, Kind::Counter));
    }
    if let Some(m) = find(GAUGES, series) {
        return Some((m, Kind::Gauge));
    }
    HISTOGRAM_SERIES
        .iter()
        .filter_map(|suffix| series.strip_suffix(suffix))
        .find_map(|base| find(HISTOGRAMS, base))
        .map(|m| (m, Kind::Histogram))
}

/// The name of the innermost call around position `at` of `expr` (`rate` in
/// `sum(rate(x[5m]))` for `x`); empty at the top level.
fn enclosing_function(expr: &str, at: usize) -> String {
    let mut depth = 0;
    for (i, c) in expr[..at].char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' if depth > 0 => depth -= 1,
            '(' => {
                let before = expr[..i].trim_end();
                let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |p| p + 1);
                return before[start..].to_string();
            }
            _ => {}
        }
    }
    String::new()
}

/// Every metric reference of every panel; fails the test when a panel has no query or
/// a query refers to no outboxd metric.
fn references() -> Vec<Reference> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana-dashboard.json"))
        .expect("read deploy/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let metric = regex::Regex::new(r"outboxd_[a-z_]+").unwrap();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(!panels.is_empty(), "the dashboard has no panels");
    let mut out = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("(untitled)").to_string();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            let found: Vec<_> = metric.find_iter(expr).collect();
            assert!(!found.is_empty(), "panel {title:?} queries no outboxd metric: {expr}");
            for m in found {
                out.push(Reference {
                    panel: title.clone(),
                    expr: expr.to_string(),
                    series: m.as_str().to_string(),
                    metric: exported(m.as_str()),
                    function: enclosing_function(expr, m.start()),
                });
            }
        }
    }
    out
}

#[test]
fn dashboard_queries_only_exported_metrics() {
    for r in references() {
        let Some((metric, kind)) = r.metric else {
            panic!("panel {:?} queries {}, which outboxd does not export: {}", r.panel, r.series, r.expr);
        };
        let over_time = matches!(r.function.as_str(), "rate" | "irate" | "increase");
        match kind {
            // A counter's or histogram's running total says nothing on a graph; its rate does.
            Kind::Counter | Kind::Histogram => assert!(
                over_time,
                "panel {:?} queries the {} {metric} without rate/increase (inside {:?}): {}",
                r.panel,
                kind.prometheus(),
                r.function,
                r.expr
            ),
            Kind::Gauge => {
                assert!(!over_time, "panel {:?} takes the {} of the gauge {metric}: {}", r.panel, r.function, r.expr)
            }
        }
    }
}

/// A running outboxd that consumed, handled, retried, suppressed a duplicate and
/// dead-lettered serves every metric the dashboard queries on `/metrics`, with the
/// type the dashboard queries it as. The one exception is the re-executed counter,
/// which needs a crash during a call with a durable claim (the delivery tests do
/// that): it may be absent, and is checked by name and type above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_outboxd_serves_every_metric_the_dashboard_queries() {
    let queried: BTreeSet<(&'static str, Kind)> = references().iter().filter_map(|r| r.metric).collect();
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::new("dashboard", 1).await;
    let (ok, retried) = (new_event_id(), new_event_id());
    receiver.set_behaviour(&retried, Behaviour::fail_first(503, 1));
    producer.send_event(&topic, "k-1", &ok, Some("Test"), &json!({"n": 1})).await;
    producer.send_event(&topic, "k-2", &retried, Some("Test"), &json!({"n": 2})).await;
    // The first event again at a new offset, and a message without an event id.
    producer.send_event(&topic, "k-1", &ok, Some("Test"), &json!({"n": 1})).await;
    producer.send_raw(&topic, None, Some(b"k-3"), &[], Some(b"{}")).await;
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("every message to be committed", HANDLED_TIMEOUT, || offsets.reached_end()).await;

    let url = format!("http://{}/metrics", od.admin_address());
    let expected: Vec<(&str, Kind)> = queried.iter().copied().filter(|(m, _)| *m != names::REEXECUTED).collect();
    od.wait_for("/metrics to serve every metric the dashboard queries", SCRAPE_TIMEOUT, async |_| {
        let scrape = reqwest::get(&url).await.expect("GET /metrics").text().await.expect("metrics body");
        let missing: Vec<String> = expected
            .iter()
            .map(|(m, kind)| format!("# TYPE {m} {}", kind.prometheus()))
            .filter(|line| !scrape.lines().any(|l| l == line))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("/metrics lacks {missing:?}:\n{scrape}"))
        }
    })
    .await;
    if let Some((_, kind)) = queried.iter().find(|(m, _)| *m == names::REEXECUTED) {
        let scrape = reqwest::get(&url).await.expect("GET /metrics").text().await.expect("metrics body");
        let typed = scrape.lines().find(|l| l.starts_with(&format!("# TYPE {} ", names::REEXECUTED)));
        assert!(typed.is_none_or(|l| l.ends_with(kind.prometheus())), "{typed:?}");
    }
    od.stop();
}
