//! The Grafana dashboard only queries metrics that outboxd exports.

use outboxd::metrics::names;

#[test]
fn dashboard_queries_only_exported_metrics() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let exported = [
        names::CONSUMED,
        names::HANDLED,
        names::DUPLICATES,
        names::RETRIED,
        names::DEAD,
        names::PARKED,
        names::REEXECUTED,
        names::HANDLER_SECONDS,
        names::AGE_SECONDS,
        names::IN_FLIGHT,
        names::LAG,
        names::COMMITTED,
        names::RECORDS,
        names::STORE_BYTES,
        names::BATCH,
        names::SYNC_SECONDS,
    ];
    let metric = regex::Regex::new(r"outboxd_[a-z_]+").unwrap();
    let mut queried = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for m in metric.find_iter(expr) {
                let name = m.as_str();
                let base = ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
                assert!(
                    exported.contains(&base),
                    "panel {:?} queries {name}, which outboxd does not export",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 14, "only {queried} metric references found");
}
