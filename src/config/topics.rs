//! Which topics a handler takes (`topics` or `topic_pattern`); the handlers that
//! take one topic are its routes (`routes`).

use regex::Regex;

use super::ConfigError;

/// The topics a handler takes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TopicMatch {
    /// `topics`: these names exactly.
    Exact(Vec<String>),
    /// `topic_pattern`: every topic the regular expression matches.
    Pattern(Regex),
}

impl TopicMatch {
    pub(crate) fn matches(&self, topic: &str) -> bool {
        match self {
            TopicMatch::Exact(topics) => topics.iter().any(|t| t == topic),
            TopicMatch::Pattern(re) => re.is_match(topic),
        }
    }

    /// The first topic, or the pattern: a handler's default name.
    pub(super) fn describe(&self) -> String {
        match self {
            TopicMatch::Exact(topics) => topics.first().cloned().unwrap_or_default(),
            TopicMatch::Pattern(re) => re.as_str().to_owned(),
        }
    }

    /// The librdkafka subscription: exact names, or `^regex`.
    pub fn subscription(&self) -> Vec<String> {
        match self {
            TopicMatch::Exact(topics) => topics.clone(),
            TopicMatch::Pattern(re) => {
                let s = re.as_str();
                vec![if s.starts_with('^') { s.to_owned() } else { format!("^{s}") }]
            }
        }
    }

    /// `handlers[i].topics` or `.topic_pattern`: exactly one of them, each well formed.
    pub(super) fn from_raw(
        at: &str,
        topics: Option<&[String]>,
        pattern: Option<&str>,
    ) -> Result<TopicMatch, ConfigError> {
        match (topics, pattern) {
            (Some(_), Some(_)) => Err(ConfigError::field(at, "set either topics or topic_pattern, not both")),
            (None, None) => Err(ConfigError::field(at, "one of topics or topic_pattern is required")),
            (Some(t), None) => {
                if t.is_empty() || t.iter().any(|s| s.trim().is_empty()) {
                    return Err(ConfigError::field(
                        format!("{at}.topics"),
                        "must list at least one non-empty topic name",
                    ));
                }
                if let Some(bad) = t.iter().find(|s| s.starts_with('^')) {
                    return Err(ConfigError::field(
                        format!("{at}.topics"),
                        format!("{bad:?} looks like a pattern; use topic_pattern for regular expressions"),
                    ));
                }
                Ok(TopicMatch::Exact(t.to_vec()))
            }
            (None, Some(p)) => {
                // librdkafka matches subscriptions with its own small regex engine.
                if p.contains("(?") {
                    return Err(ConfigError::field(
                        format!("{at}.topic_pattern"),
                        "(?...) groups and flags are not supported by librdkafka's regex engine; use plain (a|b) groups",
                    ));
                }
                let re = Regex::new(p).map_err(|e| ConfigError::field(format!("{at}.topic_pattern"), e.to_string()))?;
                Ok(TopicMatch::Pattern(re))
            }
        }
    }
}

impl std::fmt::Display for TopicMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopicMatch::Exact(t) => write!(f, "{}", t.join(", ")),
            TopicMatch::Pattern(re) => write!(f, "/{}/", re.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::err;

    #[test]
    fn pattern_that_librdkafka_cannot_compile_is_rejected() {
        let e = err("[[handlers]]\ntopic_pattern=\"^outbox\\\\.(?:a|b)$\"\nkind=\"log\"\n");
        assert!(e.contains("handlers[0].topic_pattern") && e.contains("librdkafka"), "{e}");
    }
}
