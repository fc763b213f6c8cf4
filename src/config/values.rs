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

/// A size (see [`parse_size`]) within `range`; `default` when unset. A size outside
/// it is refused with `expected`, e.g. `a size between 1KiB and 1GiB, such as "16MiB"`.
pub(super) fn size(
    field: &str,
    value: Option<&str>,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
    expected: &str,
) -> Result<u64, ConfigError> {
    match value {
        None => Ok(default),
        Some(text) => parse_size(text)
            .filter(|n| range.contains(n))
            .ok_or_else(|| ConfigError::field(field, format!("{text:?}: {expected}"))),
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

/// What stands for a secret wherever the config is shown (`Debug`, messages).
pub(super) const REDACTED: &str = "<redacted>";

/// Stands for a secret in `Debug` output.
pub(super) struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Headers for `Debug`: their names, each value redacted (`${VAR}` resolved, a
/// collector's or receiver's credential as often as not).
pub(super) struct HeaderNames<'a>(pub &'a [(String, String)]);

impl std::fmt::Debug for HeaderNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(name, _)| (name, Redacted))).finish()
    }
}

/// A URL from the config, with `${VAR}` resolved for the requests and kept as written for
/// everything else: [`Display`](std::fmt::Display) and `Debug` show it as written, its user
/// info (`user:password@`) replaced by `<redacted>@`, so a secret from the environment (a
/// password, a token in the path) or written into the user info reaches the request only.
#[derive(Clone, PartialEq, Eq)]
pub struct ExpandedUrl {
    /// `${VAR}` resolved: what requests go to, never shown.
    url: String,
    /// As written, user info replaced: safe to show.
    shown: String,
}

impl ExpandedUrl {
    /// `url` (resolved) and `written`, the same before `${VAR}` expansion.
    pub(super) fn new(url: String, written: &str) -> ExpandedUrl {
        ExpandedUrl { url, shown: without_userinfo(written) }
    }

    /// The URL requests go to. A secret: never log it, describe failures without it.
    pub fn expose(&self) -> &str {
        &self.url
    }
}

/// A URL without `${VAR}`: shown as it is, user info replaced.
impl From<&str> for ExpandedUrl {
    fn from(url: &str) -> ExpandedUrl {
        ExpandedUrl::new(url.to_owned(), url)
    }
}

impl std::fmt::Display for ExpandedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Debug for ExpandedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ExpandedUrl").field(&self.shown).finish()
    }
}

/// `text` with the user info of its authority (`user:password@`) replaced by
/// `<redacted>@`. Read off the text, not parsed: in a URL as written `${VAR}` may stand
/// anywhere, and a URL that does not parse still must not show its password.
pub(super) fn without_userinfo(text: &str) -> String {
    let Some(scheme) = text.find("://") else { return text.to_owned() };
    let start = scheme + 3;
    let end = text[start..].find(['/', '?', '#']).map_or(text.len(), |i| start + i);
    match text[start..end].rfind('@') {
        Some(at) => format!("{}{REDACTED}{}", &text[..start], &text[start + at..]),
        None => text.to_owned(),
    }
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
    fn user_info_is_replaced_wherever_it_is_written() {
        for (written, shown) in [
            ("https://u:p@collector:4318/x", "https://<redacted>@collector:4318/x"),
            ("https://${USER}:${PASS}@c/x@y", "https://<redacted>@c/x@y"),
            ("http://a@b@c?q=1", "http://<redacted>@c?q=1"),
            ("https://${HOST}/${TOKEN}", "https://${HOST}/${TOKEN}"),
            ("https://c:4318", "https://c:4318"),
            ("c:4318", "c:4318"),
        ] {
            assert_eq!(without_userinfo(written), shown, "{written}");
        }
        let url = ExpandedUrl::new("https://u:s3cret@c/t0ken".into(), "https://u:${PASS}@c/${TOKEN}");
        assert_eq!(url.expose(), "https://u:s3cret@c/t0ken");
        assert_eq!(url.to_string(), "https://<redacted>@c/${TOKEN}");
        assert_eq!(format!("{url:?}"), "ExpandedUrl(\"https://<redacted>@c/${TOKEN}\")");
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
