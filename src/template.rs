//! URL templates for the http handler: `{event_id}`, `{aggregate_id}`,
//! `{event_type}`, `{topic}`. Event data only ever lands in the path or the
//! query, percent-encoded, so no event can change scheme, host or port.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use url::Url;

/// Everything but RFC 3986 unreserved characters is encoded: `/`, `?`, `#`,
/// `@`, `%` and CR/LF in event data cannot change the URL's structure.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    EventId,
    AggregateId,
    EventType,
    Topic,
}

impl Var {
    fn from_name(name: &str) -> Option<Var> {
        Some(match name {
            "event_id" => Var::EventId,
            "aggregate_id" => Var::AggregateId,
            "event_type" => Var::EventType,
            "topic" => Var::Topic,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Var(Var),
}

/// A parsed URL template. It may carry secrets expanded from `${VAR}` (a webhook
/// path, an Azure `?code=` key): only [`UrlTemplate::render`] sees them; the text
/// that is shown (`as_str`, `Debug`, error messages) keeps `${VAR}` as written.
#[derive(Clone)]
pub struct UrlTemplate {
    /// As written in the config, before `${VAR}` expansion: safe to show.
    shown: String,
    parts: Vec<Part>,
    /// Scheme and authority, parsed once (`None`: the template is parsed whole per
    /// event): a rendering parses only what follows them. A host parsed per event
    /// (IDNA, the port) was most of the cost of rendering.
    base: Option<Base>,
}

/// The scheme and authority of a template, before any placeholder.
#[derive(Clone)]
struct Base {
    url: Url,
    /// Bytes of the first literal part they take.
    len: usize,
}

impl std::fmt::Debug for UrlTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UrlTemplate").field(&self.shown).finish()
    }
}

/// Values for one event.
pub struct Vars<'a> {
    /// `{event_id}`: the event id.
    pub event_id: &'a str,
    /// `{aggregate_id}`: the aggregate id; a template that uses it fails to render without one.
    pub aggregate_id: Option<&'a str>,
    /// `{event_type}`: the event type; a template that uses it fails to render without one.
    pub event_type: Option<&'a str>,
    /// `{topic}`: the topic the event was consumed from.
    pub topic: &'a str,
}

/// Why a template cannot be rendered for one event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    /// The template uses this placeholder, but the event has no such value.
    #[error("URL template uses {{{0}}} but the event has none")]
    Missing(&'static str),
    /// The placeholder's value is `.` or `..`, which a URL would resolve as path navigation.
    #[error("{0} {1:?} cannot stand in a URL path segment")]
    DotSegment(&'static str, String),
    /// The rendered text is not a valid URL.
    #[error("rendered URL is invalid: {0}")]
    Invalid(String),
}

/// Why a URL template is refused. Messages show the template only as written
/// (`${VAR}` unexpanded).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// A `{` without its `}`; the template as written.
    #[error("unclosed '{{' in {0:?}")]
    Unclosed(String),
    /// A `}` without its `{`; the template as written.
    #[error("unmatched '}}' in {0:?}")]
    Unmatched(String),
    /// A placeholder other than the four known ones.
    #[error("unknown placeholder {{{0}}}; known: {{event_id}} {{aggregate_id}} {{event_type}} {{topic}}")]
    UnknownPlaceholder(String),
    /// A placeholder before the path: event data could change the host.
    #[error("placeholders may only appear in the path or query, after the host")]
    PlaceholderBeforePath,
    /// A sample rendering is not a URL.
    #[error(transparent)]
    Render(RenderError),
    /// A scheme other than `http` and `https`.
    #[error("scheme must be http or https, got {0:?}")]
    Scheme(String),
    /// A URL without a host.
    #[error("URL has no host")]
    NoHost,
}

impl UrlTemplate {
    /// A template without secrets: shown as it is.
    pub fn parse(text: &str) -> Result<UrlTemplate, TemplateError> {
        UrlTemplate::parse_shown(text, text)
    }

    /// `text` with `${VAR}` already expanded; `shown` is the same before expansion,
    /// the only form that appears in messages.
    pub fn parse_shown(text: &str, shown: &str) -> Result<UrlTemplate, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| TemplateError::Unclosed(shown.to_owned()))?;
            let name = &after[..close];
            let var = Var::from_name(name).ok_or_else(|| TemplateError::UnknownPlaceholder(name.to_owned()))?;
            parts.push(Part::Var(var));
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(TemplateError::Unmatched(shown.to_owned()));
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        let mut template = UrlTemplate { shown: shown.to_owned(), parts, base: None };
        template.check_structure()?;
        template.base = template.parse_base();
        Ok(template)
    }

    /// Placeholders only after the authority; the sample rendering must be an http(s) URL.
    fn check_structure(&self) -> Result<(), TemplateError> {
        let prefix: String = self
            .parts
            .iter()
            .map_while(|p| match p {
                Part::Literal(s) => Some(s.as_str()),
                Part::Var(_) => None,
            })
            .collect();
        let has_var = self.parts.iter().any(|p| matches!(p, Part::Var(_)));
        if has_var {
            let after_scheme = prefix.find("://").map(|i| i + 3);
            let path_started = after_scheme.is_some_and(|i| prefix[i..].contains(['/', '?']));
            if !path_started {
                return Err(TemplateError::PlaceholderBeforePath);
            }
        }
        let sample = Vars { event_id: "e", aggregate_id: Some("a"), event_type: Some("t"), topic: "topic" };
        let url = self.render(&sample).map_err(TemplateError::Render)?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(TemplateError::Scheme(url.scheme().to_owned()));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(TemplateError::NoHost);
        }
        Ok(())
    }

    /// The template as written, `${VAR}` unexpanded: safe for logs and output.
    pub fn as_str(&self) -> &str {
        &self.shown
    }

    /// The scheme and authority of the first literal part, when they end there
    /// (at a `/` or a `?` after `://`) and the rest holds no `#`, parsed.
    fn parse_base(&self) -> Option<Base> {
        let Some(Part::Literal(first)) = self.parts.first() else { return None };
        let after_scheme = first.find("://")? + 3;
        let len = after_scheme + first[after_scheme..].find(['/', '?'])?;
        let literal_fragment = self.parts.iter().any(|p| matches!(p, Part::Literal(s) if s.contains('#')));
        if literal_fragment {
            return None;
        }
        Some(Base { url: Url::parse(&first[..len]).ok()?, len })
    }

    /// The URL for one event: each placeholder replaced by its value, percent-encoded.
    pub fn render(&self, vars: &Vars<'_>) -> Result<Url, RenderError> {
        let Some(base) = &self.base else { return self.render_whole(vars) };
        // What follows the authority: a path and maybe a query (a value never holds
        // a `?` or a `#`: they are percent-encoded).
        let rest = self.render_from(base.len, vars)?;
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest.as_str(), None),
        };
        let mut url = base.url.clone();
        url.set_path(path);
        url.set_query(query);
        Ok(url)
    }

    /// [`UrlTemplate::render`] by parsing the whole rendered text.
    fn render_whole(&self, vars: &Vars<'_>) -> Result<Url, RenderError> {
        let out = self.render_from(0, vars)?;
        Url::parse(&out).map_err(|e| RenderError::Invalid(e.to_string()))
    }

    /// The rendered text, from byte `skip` of the first part on.
    fn render_from(&self, skip: usize, vars: &Vars<'_>) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.shown.len() + 64);
        for (i, part) in self.parts.iter().enumerate() {
            match part {
                Part::Literal(s) if i == 0 => out.push_str(&s[skip..]),
                Part::Literal(s) => out.push_str(s),
                Part::Var(var) => {
                    let (name, value) = match var {
                        Var::EventId => ("event_id", Some(vars.event_id)),
                        Var::AggregateId => ("aggregate_id", vars.aggregate_id),
                        Var::EventType => ("event_type", vars.event_type),
                        Var::Topic => ("topic", Some(vars.topic)),
                    };
                    let value = value.ok_or(RenderError::Missing(name))?;
                    // "." and ".." would be resolved as path navigation even when encoded.
                    if value == "." || value == ".." {
                        return Err(RenderError::DotSegment(name, value.to_owned()));
                    }
                    out.extend(utf8_percent_encode(value, COMPONENT));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(agg: &'a str) -> Vars<'a> {
        Vars {
            event_id: "6f1c-1",
            aggregate_id: Some(agg),
            event_type: Some("OrderCreated"),
            topic: "outbox.event.order",
        }
    }

    #[test]
    fn substitutes_all_placeholders() {
        let t = UrlTemplate::parse("http://127.0.0.1:8080/{topic}/{aggregate_id}/{event_type}?id={event_id}").unwrap();
        assert_eq!(
            t.render(&vars("o-1")).unwrap().as_str(),
            "http://127.0.0.1:8080/outbox.event.order/o-1/OrderCreated?id=6f1c-1"
        );
    }

    #[test]
    fn hostile_values_stay_inside_their_segment() {
        let t = UrlTemplate::parse("http://127.0.0.1:8080/orders/{aggregate_id}/events").unwrap();
        for (agg, expect) in [
            ("../../admin", "/orders/..%2F..%2Fadmin/events"),
            ("@evil.com", "/orders/%40evil.com/events"),
            ("%2F", "/orders/%252F/events"),
            ("a\r\nHost: x", "/orders/a%0D%0AHost%3A%20x/events"),
            ("q?x=1#f", "/orders/q%3Fx%3D1%23f/events"),
        ] {
            let url = t.render(&vars(agg)).unwrap();
            assert_eq!(url.host_str(), Some("127.0.0.1"));
            assert_eq!(url.port(), Some(8080));
            assert_eq!(url.path(), expect, "for {agg:?}");
            assert_eq!(url.query(), None);
        }
        assert!(matches!(t.render(&vars("..")), Err(RenderError::DotSegment(..))));
    }

    /// A rendering that parses only what follows the authority gives the URL a parse
    /// of the whole text gives, whatever the values and the template's shape.
    #[test]
    fn a_rendering_after_a_parsed_authority_is_the_whole_parse() {
        let templates = [
            "http://127.0.0.1:8080/{topic}/{aggregate_id}/{event_type}?id={event_id}",
            "https://user:pw@Example.COM/hooks/{event_id}",
            "http://h/a/./b/../{aggregate_id}?x=1&y={event_type}",
            "http://h?e={event_id}",
            "http://h:80/{aggregate_id}",
            "http://[::1]:9/e/{aggregate_id}",
            "http://h/caf\u{e9}/{aggregate_id}/ sp ace",
            "http://h/static",
        ];
        let values = ["o-1", "../../admin", "a b", "ü/?#", "%2F", "..x", "a\r\nHost: x", "q?x=1#f", ""];
        for t in templates {
            let template = UrlTemplate::parse(t).unwrap();
            assert!(template.base.is_some(), "{t}");
            for v in values {
                let vars = Vars { event_id: v, aggregate_id: Some(v), event_type: Some(v), topic: "t.p" };
                let fast = template.render(&vars);
                let whole = template.render_whole(&vars);
                assert_eq!(fast.as_ref().map(Url::as_str), whole.as_ref().map(Url::as_str), "{t} with {v:?}");
            }
        }
        // A fragment in the template: parsed whole.
        assert!(UrlTemplate::parse("http://h/{event_id}#top").unwrap().base.is_none());
    }

    #[test]
    fn placeholder_in_host_is_rejected() {
        assert!(UrlTemplate::parse("http://{aggregate_id}.example/x").is_err());
        assert!(UrlTemplate::parse("http://h:{event_id}/x").is_err());
    }

    #[test]
    fn unknown_or_unclosed_placeholder_is_rejected() {
        assert!(UrlTemplate::parse("http://h/{nope}").unwrap_err().to_string().contains("{nope}"));
        assert!(UrlTemplate::parse("http://h/{event_id").is_err());
        assert!(UrlTemplate::parse("ftp://h/{event_id}").is_err());
    }

    #[test]
    fn a_secret_from_the_environment_is_used_but_never_shown() {
        let t = UrlTemplate::parse_shown(
            "https://h/hook/s3cr3t/{event_id}?code=k3y",
            "https://h/hook/${HOOK}/{event_id}?code=${KEY}",
        )
        .unwrap();
        let v = Vars { event_id: "e", aggregate_id: None, event_type: None, topic: "t" };
        assert_eq!(t.render(&v).unwrap().as_str(), "https://h/hook/s3cr3t/e?code=k3y");
        for shown in [t.as_str().to_owned(), format!("{t:?}")] {
            assert!(!shown.contains("s3cr3t") && !shown.contains("k3y"), "{shown}");
            assert!(shown.contains("${HOOK}") && shown.contains("${KEY}"), "{shown}");
        }
        let e = UrlTemplate::parse_shown("https://h/s3cr3t/{event_id", "https://h/${HOOK}/{event_id").unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }

    #[test]
    fn missing_event_type_is_a_render_error() {
        let t = UrlTemplate::parse("http://h/{event_type}").unwrap();
        let v = Vars { event_id: "e", aggregate_id: None, event_type: None, topic: "t" };
        assert_eq!(t.render(&v).unwrap_err(), RenderError::Missing("event_type"));
    }
}
