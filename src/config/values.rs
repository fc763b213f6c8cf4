//! The value syntaxes every section shares: durations, sizes and `${VAR}`.

use std::time::Duration;

use super::{ConfigError, EnvError};

/// A duration such as `"250ms"`, `"10s"`, `"5m"`, `"7d"`; `default` when unset.
pub(super) fn duration(field: &str, value: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v.trim())
            .map_err(|e| ConfigError::field(field, format!("{e} (expected e.g. \"250ms\", \"10s\", \"5m\", \"7d\")"))),
    }
}

/// Replaces `${VAR}` with the environment's value; an unset variable is an error.
pub fn expand_env(field: &str, value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let fail = |error| ConfigError::Env { field: field.to_owned(), error };
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(fail(EnvError::Unterminated));
        };
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(fail(EnvError::InvalidName(name.to_owned())));
        }
        match env(name) {
            Some(v) => out.push_str(&v),
            None => return Err(fail(EnvError::Unset(name.to_owned()))),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `"64MiB"`, `"1GiB"`, `"512KiB"`, `"100MB"`, or plain bytes.
pub(super) fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_all_units() {
        for (text, d) in [("5ms", 5u64), ("2s", 2000), ("3m", 180_000), ("1h", 3_600_000), ("1d", 86_400_000)] {
            assert_eq!(duration("x", Some(text), Duration::ZERO).unwrap(), Duration::from_millis(d));
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1 GiB"), Some(1 << 30));
        assert_eq!(parse_size("100MB"), Some(100_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
    }
}
