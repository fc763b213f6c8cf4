//! Helpers for the failure-handling tests (the `failure`, `faults` and `hostile` tests), on top
//! of the harness:
//!
//! - [`broker`]: a private Kafka broker (scripts/stack with its own state folder and
//!   ports) for tests that SIGKILL the broker.
//! - [`store`]: `outboxd store export|retry|resolve` and raw JSON records.
#![allow(dead_code)]

pub mod broker;
pub mod store;

use std::time::Duration;

use crate::harness::Outboxd;

/// TOML lines for `[handlers.dead_letter]`.
pub fn dead_letter_toml(topic: &str) -> String {
    format!("[handlers.dead_letter]\ntopic = {}\n", serde_json::to_string(topic).expect("string"))
}

/// TOML line for a static header naming the instance in every call.
pub fn instance_header_toml(name: &str) -> String {
    format!("headers = {{ X-Outboxd-Instance = {} }}\n", serde_json::to_string(name).expect("string"))
}

/// Whether the current (last) run logged `needle`.
pub fn logged(od: &Outboxd, needle: &str) -> bool {
    od.log().contains(needle)
}

/// The log lines of the current run that contain `needle`, without colour codes.
pub fn log_lines(od: &Outboxd, needle: &str) -> Vec<String> {
    strip_ansi(&od.log()).lines().filter(|l| l.contains(needle)).map(str::to_string).collect()
}

/// Text without ANSI colour sequences (outboxd colours its human log even into a file).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every run's stderr, without colour codes.
pub fn all_logs(od: &Outboxd) -> String {
    strip_ansi(&od.log_tails(usize::MAX, usize::MAX))
}

/// Event ids of the log lines (all runs) that contain `needle` (the `event_id=` field).
pub fn event_ids_logged(od: &Outboxd, needle: &str) -> std::collections::HashSet<String> {
    all_logs(od)
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| l.split("event_id=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|id| id.trim_matches('"').to_string())
        .collect()
}

/// The RFC 3339 timestamp a human-format log line starts with.
pub fn log_time(line: &str) -> Option<std::time::SystemTime> {
    let clean = strip_ansi(line);
    humantime::parse_rfc3339(clean.split_whitespace().next()?).ok()
}

/// A panic anywhere in outboxd's output is a failure of "nothing crashes".
pub fn assert_no_panic(od: &Outboxd) {
    let log = od.log_tails(usize::MAX, usize::MAX);
    assert!(!log.contains("panicked at"), "outboxd panicked:\n{log}");
}

/// Waits (bounded) without a condition; for pacing only.
pub async fn pause(d: Duration) {
    tokio::time::sleep(d).await;
}
