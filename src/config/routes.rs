//! Routes: every `[[handlers]]` entry that takes a topic is one of its routes, in
//! the file's order, and may select only some of its events (`event_types`).
//!
//! Each (event, route) is a side effect of its own, with its own record. The
//! topic's **first** route keeps what a handler alone on the topic has always had:
//! records in its `dedup_scope` and the event id as idempotency key, so that adding a
//! route after an existing handler changes nothing for it. A later route's scope is
//! the first's with `#` and its name, and its idempotency key the event id with `#`
//! and its name: two routes to the same receiver do not collide.

use std::borrow::Cow;

use super::{ConfigError, HandlerConfig};

/// `handlers[].event_types`: the event types a route selects, exact names or
/// globs (`Order*`, `Order?aid`, `[A-Z]*`). An event without a type matches none.
#[derive(Debug, Clone)]
pub struct EventTypes {
    patterns: Vec<glob::Pattern>,
}

impl EventTypes {
    pub(super) fn from_raw(at: &str, raw: Vec<String>) -> Result<EventTypes, ConfigError> {
        let field = format!("{at}.event_types");
        if raw.is_empty() {
            return Err(ConfigError::field(
                field,
                "must list at least one event type (leave it out to take every event)",
            ));
        }
        let mut patterns = Vec::with_capacity(raw.len());
        for t in raw {
            if t.trim().is_empty() {
                return Err(ConfigError::field(field, "an event type must not be empty"));
            }
            let p = glob::Pattern::new(&t).map_err(|e| ConfigError::field(&field, format!("{t:?}: {e}")))?;
            patterns.push(p);
        }
        Ok(EventTypes { patterns })
    }

    /// Whether an event of type `event_type` is selected.
    pub fn matches(&self, event_type: Option<&str>) -> bool {
        event_type.is_some_and(|t| self.patterns.iter().any(|p| p.matches(t)))
    }
}

impl std::fmt::Display for EventTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.patterns.iter().map(glob::Pattern::as_str).collect();
        write!(f, "{}", names.join(", "))
    }
}

/// `[[handlers.when]]` as written: one condition on a header or a payload field.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCondition {
    /// A Kafka header's name.
    pub header: Option<String>,
    /// A dotted path into the JSON payload (`status`, `customer.tier`).
    pub field: Option<String>,
    /// The value it must have: one text, or a list of which it must have one.
    pub equals: OneOrMany,
}

/// `equals`: a value or a list of values, each a text, a number or a boolean (compared
/// as its text: `3` and `"3"` are the same condition).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum OneOrMany {
    /// `equals = "paid"`.
    One(String),
    /// `equals = ["paid", "refunded"]`.
    Many(Vec<String>),
}

impl TryFrom<toml::Value> for OneOrMany {
    type Error = String;

    fn try_from(v: toml::Value) -> Result<OneOrMany, String> {
        fn text(v: toml::Value) -> Result<String, String> {
            match v {
                toml::Value::String(s) => Ok(s),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                toml::Value::Boolean(b) => Ok(b.to_string()),
                other => Err(format!("expected a text, a number or a boolean, found {}", other.type_str())),
            }
        }
        match v {
            toml::Value::Array(values) => values.into_iter().map(text).collect::<Result<_, _>>().map(OneOrMany::Many),
            v => text(v).map(OneOrMany::One),
        }
    }
}

/// One condition of `[[handlers.when]]`; a route selects an event only when every
/// condition holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// What is compared.
    pub on: ConditionOn,
    /// The values of which it must have one.
    pub equals: Vec<String>,
}

/// What a [`Condition`] compares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConditionOn {
    /// A Kafka header (its bytes as UTF-8 text); a message without it fails the condition.
    Header(String),
    /// A payload field: the dotted path as written, and as a JSON pointer (`/customer/tier`).
    /// A string compares as its text, a number or boolean as its JSON text; a payload
    /// that is not JSON, a missing field, `null`, an object or an array fail it.
    Field {
        /// As written.
        path: String,
        /// For `serde_json::Value::pointer`.
        pointer: String,
    },
}

impl RawCondition {
    pub(super) fn validate(self, at: &str) -> Result<Condition, ConditionError> {
        let equals = match self.equals {
            OneOrMany::One(v) => vec![v],
            OneOrMany::Many(v) if v.is_empty() => {
                return Err(ConditionError(format!("{at}.equals"), "must list at least one value"))
            }
            OneOrMany::Many(v) => v,
        };
        let on = match (self.header, self.field) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(ConditionError(at.to_owned(), "set one of header or field"))
            }
            (Some(h), None) if h.trim().is_empty() => {
                return Err(ConditionError(format!("{at}.header"), "must not be empty"))
            }
            (Some(h), None) => ConditionOn::Header(h),
            (None, Some(f)) if f.split('.').any(|p| p.is_empty()) => {
                return Err(ConditionError(
                    format!("{at}.field"),
                    "must be a dotted path of non-empty names (status, customer.tier)",
                ))
            }
            (None, Some(f)) => {
                let pointer = f.split('.').map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1"))).collect();
                ConditionOn::Field { path: f, pointer }
            }
        };
        Ok(Condition { on, equals })
    }
}

/// A condition that is not well formed: the field, and what is wrong.
pub(super) struct ConditionError(pub String, pub &'static str);

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.on {
            ConditionOn::Header(h) => format!("header {h}"),
            ConditionOn::Field { path, .. } => format!("field {path}"),
        };
        write!(f, "{what} = {}", self.equals.join(" | "))
    }
}

/// One handler as a route of one topic.
#[derive(Debug, Clone, Copy)]
pub struct Route<'a> {
    /// The handler.
    pub handler: &'a HandlerConfig,
    /// Whether it is the topic's first route (the one that keeps the plain scope and key).
    pub first: bool,
}

impl<'a> Route<'a> {
    /// The store's scope of this route's records of an event of `topic`.
    pub fn scope(&self, topic: &'a str) -> Cow<'a, str> {
        let base = self.handler.dedup_scope.of(topic);
        match self.first {
            true => Cow::Borrowed(base),
            false => Cow::Owned(format!("{base}#{}", self.handler.name)),
        }
    }

    /// The idempotency key this route sends for event `id`, when it is not the id
    /// itself: the id with `#` and the route's name, on a later route unless its
    /// `idempotency_key` says otherwise.
    pub fn key(&self, id: &str) -> Option<String> {
        let with_name = match self.handler.idempotency_key {
            Some(super::IdempotencyKey::EventId) => false,
            Some(super::IdempotencyKey::Route) => true,
            None => !self.first,
        };
        with_name.then(|| format!("{id}#{}", self.handler.name))
    }

    /// Whether this route takes an event of type `event_type`.
    pub fn selects(&self, event_type: Option<&str>) -> bool {
        self.handler.event_types.as_ref().is_none_or(|t| t.matches(event_type))
    }
}

/// A topic's routes, in the file's order.
pub(super) fn of<'a>(handlers: &'a [HandlerConfig], topic: &'a str) -> impl Iterator<Item = Route<'a>> + 'a {
    handlers
        .iter()
        .filter(move |h| h.topics.matches(topic))
        .enumerate()
        .map(|(n, handler)| Route { handler, first: n == 0 })
}

/// Handlers that share a topic read it alike (the event is decoded once, as its
/// first route reads it), and a name that goes into idempotency keys must fit a
/// header. Checked where the file shows the overlap: a topic named by one handler and
/// named or matched by another. Two patterns that both match a topic are only known
/// once it exists; its later routes then read it as its first does.
pub(super) fn check(handlers: &[HandlerConfig]) -> Result<(), ConfigError> {
    for h in handlers.iter().filter(|h| h.idempotency_key == Some(super::IdempotencyKey::Route)) {
        name_fits_a_key(h, "(idempotency_key = \"route\")")?;
    }
    for (i, a) in handlers.iter().enumerate() {
        for b in &handlers[i + 1..] {
            let Some(topic) = shared_topic(a, b) else { continue };
            if let Some(setting) = differs(a, b) {
                return Err(ConfigError::field(
                    format!("handlers[{}].{setting}", b.index),
                    format!(
                        "topic {topic:?} is also taken by handlers[{}], which reads it with another {setting}; \
                         the routes of a topic read it alike (the event is decoded once)",
                        a.index
                    ),
                ));
            }
            name_fits_a_key(b, &format!("as a later route of topic {topic:?}"))?;
        }
    }
    Ok(())
}

/// A handler's name goes into idempotency keys (`why`): it must fit a header.
fn name_fits_a_key(h: &HandlerConfig, why: &str) -> Result<(), ConfigError> {
    if h.name.chars().any(char::is_control) {
        return Err(ConfigError::field(
            format!("handlers[{}].name", h.index),
            format!("{:?} goes into the idempotency key {why}, so it must have no control characters", h.name),
        ));
    }
    Ok(())
}

/// A topic both handlers take, where the file shows it: one names it, the other names
/// or matches it (two patterns that match one topic are only known once it exists).
fn shared_topic<'a>(a: &'a HandlerConfig, b: &'a HandlerConfig) -> Option<&'a String> {
    match (&a.topics, &b.topics) {
        (super::TopicMatch::Exact(ta), _) => ta.iter().find(|t| b.topics.matches(t)),
        (_, super::TopicMatch::Exact(tb)) => tb.iter().find(|t| a.topics.matches(t)),
        _ => None,
    }
}

/// Whether `h` shares a topic with another handler (as the file shows it): its
/// waiting events are then held once its circuit has been open `circuit.hold_after`,
/// so that the topic's other routes go on.
pub fn shares_a_topic(handlers: &[HandlerConfig], h: &HandlerConfig) -> bool {
    handlers.iter().any(|o| o.index != h.index && shared_topic(h, o).is_some())
}

/// Routes that can never select an event, said for `check-config` and the start-up
/// log: a `[[handlers.when]]` field condition on a payload that is not read as JSON
/// (`format` or `body` = `raw`).
pub(super) fn never_selecting(handlers: &[HandlerConfig]) -> Vec<String> {
    use super::{Body, Format};
    let fields = |h: &HandlerConfig| h.when.iter().any(|c| matches!(c.on, ConditionOn::Field { .. }));
    handlers
        .iter()
        .filter(|h| fields(h) && (h.format == Format::Raw || h.body == Body::Raw))
        .map(|h| {
            format!(
                "handlers[{}] ({}) can never select an event: its [[handlers.when]] field conditions read the JSON \
                 payload, which format or body = \"raw\" keeps as bytes",
                h.index, h.name
            )
        })
        .collect()
}

/// The first setting in which `a` and `b` read messages differently.
fn differs(a: &HandlerConfig, b: &HandlerConfig) -> Option<&'static str> {
    if a.format != b.format {
        Some("format")
    } else if a.body != b.body {
        Some("body")
    } else if a.event_id != b.event_id {
        Some("event_id")
    } else if a.event_type_header != b.event_type_header {
        Some("event_type_header")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{err, parse};

    const THREE: &str = "[[handlers]]\nname=\"all\"\ntopics=[\"o\"]\nkind=\"log\"\n\
                         [[handlers]]\nname=\"mailer\"\ntopics=[\"o\"]\nkind=\"log\"\nevent_types=[\"OrderPaid\"]\n\
                         [[handlers]]\nname=\"ship\"\ntopic_pattern=\"^o$\"\nkind=\"log\"\nevent_types=[\"Order*ed\"]\n";

    /// `idempotency_key` names the key whatever the route's place; the scope still
    /// follows the place (each route has its own records).
    #[test]
    fn idempotency_key_names_a_routes_key_whatever_its_place() {
        let c = parse(
            "[[handlers]]\nname=\"crm\"\ntopics=[\"o\"]\nkind=\"log\"\nidempotency_key=\"route\"\n\
             [[handlers]]\nname=\"mailer\"\ntopics=[\"o\"]\nkind=\"log\"\nidempotency_key=\"event_id\"\n\
             [[handlers]]\nname=\"ship\"\ntopics=[\"o\"]\nkind=\"log\"\n",
        )
        .unwrap();
        let keys: Vec<_> = c.routes_for("o").map(|r| (r.key("e1"), r.scope("o").into_owned())).collect();
        assert_eq!(
            keys,
            [
                (Some("e1#crm".to_owned()), "o".to_owned()),
                (None, "o#mailer".to_owned()),
                (Some("e1#ship".to_owned()), "o#ship".to_owned()),
            ]
        );
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\nidempotency_key=\"id\"\n");
        assert!(e.contains("idempotency_key") && e.contains("event_id"), "{e}");
        let e = err("[[handlers]]\nname=\"a\\u0007\"\ntopics=[\"o\"]\nkind=\"log\"\nidempotency_key=\"route\"\n");
        assert!(e.contains("handlers[0].name") && e.contains("control characters"), "{e}");
    }

    #[test]
    fn the_first_route_keeps_the_plain_scope_and_key_and_later_ones_add_their_name() {
        let c = parse(THREE).unwrap();
        let routes: Vec<_> = c.routes_for("o").collect();
        assert_eq!(routes.len(), 3);
        assert_eq!((routes[0].scope("o"), routes[0].key("e1")), ("o".into(), None));
        assert_eq!((routes[1].scope("o"), routes[1].key("e1")), ("o#mailer".into(), Some("e1#mailer".into())));
        assert_eq!(routes[2].scope("o"), "o#ship");
        assert_eq!(c.routes_for("other").count(), 0);
    }

    #[test]
    fn event_types_select_exact_names_and_globs_and_an_untyped_event_goes_only_to_unfiltered_routes() {
        let c = parse(THREE).unwrap();
        let takes = |t: Option<&str>| -> Vec<String> {
            c.routes_for("o").filter(|r| r.selects(t)).map(|r| r.handler.name.clone()).collect()
        };
        assert_eq!(takes(Some("OrderPaid")), ["all", "mailer"]);
        assert_eq!(takes(Some("OrderShipped")), ["all", "ship"]);
        assert_eq!(takes(Some("orderpaid")), ["all"], "names are case-sensitive");
        assert_eq!(takes(None), ["all"]);
    }

    #[test]
    fn a_shared_scope_keeps_its_later_routes_apart_too() {
        let c = parse(
            "[[handlers]]\nname=\"a\"\ntopics=[\"o\"]\nkind=\"log\"\ndedup_scope=\"shared\"\n\
             [[handlers]]\nname=\"b\"\ntopics=[\"o\"]\nkind=\"log\"\ndedup_scope=\"shared\"\n",
        )
        .unwrap();
        let scopes: Vec<_> = c.routes_for("o").map(|r| r.scope("o").into_owned()).collect();
        assert_eq!(scopes, ["", "#b"]);
    }

    #[test]
    fn routes_of_a_topic_must_read_it_alike_and_need_distinct_names() {
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers]]\nname=\"b\"\ntopics=[\"o\"]\nkind=\"log\"\nformat=\"raw\"\n");
        assert!(e.contains("handlers[1].format") && e.contains("handlers[0]") && e.contains("alike"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n");
        assert!(e.contains("handlers[1].name") && e.contains("distinct"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers]]\nname=\"a\\u0007\"\ntopics=[\"o\"]\nkind=\"log\"\n");
        assert!(e.contains("handlers[1].name") && e.contains("control characters"), "{e}");
    }

    #[test]
    fn the_routes_example_is_valid() {
        let text = include_str!("../../examples/outboxd-routes.toml");
        let env = |name: &str| (name == "PARTNER_WHSEC").then(|| "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned());
        let c = super::super::Config::parse(text, &env).unwrap();
        let names: Vec<_> = c.routes_for("outbox.event.order").map(|r| r.handler.name.clone()).collect();
        assert_eq!(names, ["partner", "mailer", "shipping-log"]);
    }

    #[test]
    fn when_conditions_parse_and_bad_ones_name_the_field() {
        let c = parse(
            "[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers.when]]\nheader=\"tenant\"\nequals=\"acme\"\n\
             [[handlers.when]]\nfield=\"customer.tier\"\nequals=[\"gold\",\"a/b~\"]\n",
        )
        .unwrap();
        let when: Vec<String> = c.handlers[0].when.iter().map(ToString::to_string).collect();
        assert_eq!(when, ["header tenant = acme", "field customer.tier = gold | a/b~"]);
        let super::ConditionOn::Field { pointer, .. } = &c.handlers[0].when[1].on else { panic!("a field") };
        assert_eq!(pointer, "/customer/tier");
        let bad = |w: &str| err(&format!("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers.when]]\n{w}\n"));
        assert!(bad("equals=\"x\"").contains("handlers[0].when[0]: set one of header or field"));
        assert!(bad("header=\"h\"\nfield=\"f\"\nequals=\"x\"").contains("set one of"));
        assert!(bad("field=\"a..b\"\nequals=\"x\"").contains("handlers[0].when[0].field"));
        assert!(bad("header=\"h\"\nequals=[]").contains("handlers[0].when[0].equals"));
        assert!(bad("header=\"h\"").contains("equals"), "{}", bad("header=\"h\""));
        assert!(bad("header=\"h\"\nequals={a=1}").contains("expected a text, a number or a boolean"));
        let c = parse("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n[[handlers.when]]\nfield=\"n\"\nequals=[3, true]\n")
            .unwrap();
        assert_eq!(c.handlers[0].when[0].equals, ["3", "true"]);
    }

    #[test]
    fn a_field_condition_on_a_raw_payload_is_said_to_never_select() {
        let when = "[[handlers.when]]\nfield=\"status\"\nequals=\"paid\"\n";
        let raw = parse(&format!("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\nbody=\"raw\"\n{when}")).unwrap();
        let said = raw.route_warnings();
        assert!(said.len() == 1 && said[0].contains("handlers[0]") && said[0].contains("never"), "{said:?}");
        let json = parse(&format!("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\n{when}")).unwrap();
        assert!(json.route_warnings().is_empty());
    }

    #[test]
    fn bad_event_types_name_the_field() {
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\nevent_types=[]\n");
        assert!(e.contains("handlers[0].event_types: must list"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"o\"]\nkind=\"log\"\nevent_types=[\"[a\"]\n");
        assert!(e.contains("handlers[0].event_types: \"[a\""), "{e}");
    }
}
