//! The store CLI commands the shared harness does not wrap: `export`, `retry`,
//! `resolve`, and `get` as raw JSON (for fields such as `dead_letter`).

use std::process::Output;

use serde_json::Value;

use super::Outboxd;

/// stdout, stderr and status of a command, for failure messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `outboxd store ARGS --config F` (not requiring success).
pub fn store_cmd(od: &Outboxd, args: &[&str]) -> Output {
    assert!(!od.is_running(), "stop outboxd before using its store");
    let mut full = vec!["store"];
    full.extend_from_slice(args);
    od.command(&full)
}

/// `store get ID --json` as JSON (all fields, including `dead_letter`).
pub fn get(od: &Outboxd, id: &str) -> Value {
    od.store_json(&["get", id])
}

/// `store export [--state S] [--topic T]`: one JSON object per line.
pub fn export(od: &Outboxd, state: Option<&str>, topic: Option<&str>) -> Vec<Value> {
    let mut args = vec!["export"];
    if let Some(s) = state {
        args.extend(["--state", s]);
    }
    if let Some(t) = topic {
        args.extend(["--topic", t]);
    }
    let out = store_cmd(od, &args);
    assert!(out.status.success(), "`outboxd store {}` failed: {}", args.join(" "), describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("export line is not JSON ({e}): {l}")))
        .collect()
}

/// All records (any state) as JSON values, keyed by event id.
pub fn all_records(od: &Outboxd) -> std::collections::HashMap<String, Value> {
    export(od, None, None).into_iter().map(|v| (v["event_id"].as_str().expect("event_id").to_string(), v)).collect()
}

/// A record's `done_at` as a time (any final state sets it).
pub fn done_at(v: &Value) -> Option<std::time::SystemTime> {
    v["done_at"].as_str().map(|s| humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("done_at {s:?}: {e}")))
}
