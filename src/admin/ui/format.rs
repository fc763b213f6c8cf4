//! How the console writes times, durations and sizes: UTC with a relative hint
//! ("2026-12-01 19:03:04 UTC", "5 min ago"), so that people in different zones
//! read the same time and still see at a glance how long ago it was.

use std::time::{Duration, SystemTime};

/// A moment as the pages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct When {
    /// The machine-readable form (RFC 3339, for `<time datetime>`).
    pub iso: String,
    /// UTC to the second.
    pub utc: String,
    /// How long before (or after) now, roughly.
    pub relative: String,
}

/// `rfc3339` (as the store's views give times) as the pages show it; the text
/// itself when it is not a time.
pub fn when(rfc3339: &str, now: SystemTime) -> When {
    match humantime::parse_rfc3339_weak(rfc3339.trim_end_matches('Z')) {
        Ok(t) => at(t, now),
        Err(_) => When { iso: rfc3339.to_owned(), utc: rfc3339.to_owned(), relative: String::new() },
    }
}

/// A moment in µs since the epoch (as records keep times) as the pages show it.
pub fn at_us(us: i64, now: SystemTime) -> When {
    at(SystemTime::UNIX_EPOCH + Duration::from_micros(us.max(0) as u64), now)
}

/// A moment as the pages show it.
pub fn at(t: SystemTime, now: SystemTime) -> When {
    let iso = humantime::format_rfc3339_seconds(t).to_string();
    let utc = iso.replacen('T', " ", 1).replace('Z', " UTC");
    let relative = match now.duration_since(t) {
        Ok(d) => format!("{} ago", rough(d)),
        Err(e) => format!("in {}", rough(e.duration())),
    };
    When { iso, utc, relative }
}

/// A duration in its largest unit, as people say it: "40 s", "5 min", "3 h", "2 d".
pub fn rough(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86400),
    }
}

/// A size in bytes, in the largest unit under 1024 of it, one decimal.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_with_a_relative_hint_and_garbage_stays_as_written() {
        let t = humantime::parse_rfc3339("2026-12-01T19:03:04Z").unwrap();
        let w = when("2026-12-01T19:03:04.123456Z", t + Duration::from_secs(330));
        assert_eq!((w.utc.as_str(), w.relative.as_str()), ("2026-12-01 19:03:04 UTC", "5 min ago"));
        assert_eq!(w.iso, "2026-12-01T19:03:04Z");
        assert_eq!(when("2026-12-01T19:03:04Z", t - Duration::from_secs(7200)).relative, "in 2 h");
        assert_eq!(when("soon", t).utc, "soon");
    }

    #[test]
    fn sizes_and_durations_read_as_people_say_them() {
        assert_eq!((bytes(512), bytes(1536), bytes(5 << 30)), ("512 B".into(), "1.5 KiB".into(), "5.0 GiB".into()));
        assert_eq!(rough(Duration::from_secs(59)), "59 s");
        assert_eq!(rough(Duration::from_secs(3 * 86400)), "3 d");
    }
}
