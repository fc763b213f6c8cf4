//! What outboxd logged: lines with a needle, event ids, times, panics; without the
//! colour codes outboxd writes even into a file.

use super::Outboxd;

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
