//! What the executor keeps per `[[handlers]]` entry (a [`Slot`]) and per topic (its
//! metric handles, resolved at the topic's first event instead of once per event).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use foldhash::HashMap;
use metrics::{Counter, Histogram};

use super::concurrency::Limiter;
use super::summary::Tally;
use crate::codec::Layout;
use crate::config::HandlerConfig;
use crate::handler::Handler;
use crate::metrics::names;

/// One `[[handlers]]` entry at work: its handler, how its messages are read, its
/// limit of calls in flight, and what it did (`slots[hc.index]`).
pub(super) struct Slot {
    pub(super) handler: Arc<dyn Handler>,
    pub(super) layout: Layout,
    pub(super) limiter: Limiter,
    /// Since start, for the console.
    pub(super) calls: HandlerCalls,
    /// Since the last summary line.
    pub(super) tally: Tally,
}

impl Slot {
    pub(super) fn new(hc: &HandlerConfig, handler: Arc<dyn Handler>, max_in_flight: usize) -> Slot {
        let max = hc.concurrency.max.unwrap_or(max_in_flight);
        Slot {
            handler,
            layout: Layout::from(hc),
            limiter: Limiter::new(&hc.name, max, hc.concurrency.adaptive),
            calls: HandlerCalls::default(),
            tally: Tally::default(),
        }
    }
}

/// One handler's calls since start.
#[derive(Debug, Default)]
pub(super) struct HandlerCalls {
    /// Calls made (each attempt, re-runs included).
    pub(super) calls: AtomicU64,
    /// Of those, calls that failed (any error: the event's or the receiver's).
    pub(super) failed: AtomicU64,
}

impl HandlerCalls {
    pub(super) fn count(&self, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A route's metric handles (the `topic` and `handler` labels'), the same registry
/// entries the `metrics` macros would find.
pub(super) struct TopicMetrics {
    pub(super) handled: Counter,
    pub(super) redelivered: Counter,
    pub(super) new_offset: Counter,
    pub(super) reexecuted: Counter,
    pub(super) retried: Counter,
    pub(super) dead: Counter,
    pub(super) parked: Counter,
    pub(super) handler_seconds: Histogram,
    pub(super) age_seconds: Histogram,
}

impl TopicMetrics {
    fn new(topic: &str, handler: &str) -> TopicMetrics {
        let (t, h) = (|| topic.to_owned(), || handler.to_owned());
        TopicMetrics {
            handled: metrics::counter!(names::HANDLED, "topic" => t(), "handler" => h()),
            redelivered: metrics::counter!(names::DUPLICATES, "topic" => t(), "handler" => h(), "cause" => "redelivered_offset"),
            new_offset: metrics::counter!(names::DUPLICATES, "topic" => t(), "handler" => h(), "cause" => "new_offset"),
            reexecuted: metrics::counter!(names::REEXECUTED, "topic" => t(), "handler" => h()),
            retried: metrics::counter!(names::RETRIED, "topic" => t(), "handler" => h()),
            dead: metrics::counter!(names::DEAD, "topic" => t(), "handler" => h()),
            parked: metrics::counter!(names::PARKED, "topic" => t(), "handler" => h()),
            handler_seconds: metrics::histogram!(names::HANDLER_SECONDS, "topic" => t(), "handler" => h()),
            age_seconds: metrics::histogram!(names::AGE_SECONDS, "topic" => t(), "handler" => h()),
        }
    }
}

/// Handles by topic, then by handler index (`usize::MAX`: no handler), each made at
/// its first use. Topics are few (a pattern matches new ones rarely), so entries are
/// never removed, and a new one swaps in a copy of the map: a lookup, one per event,
/// allocates nothing and takes no lock (an `RwLock`'s read writes its count, a line
/// both runtime workers would pass between them at every event).
struct ByTopic<T> {
    map: ArcSwap<HashMap<String, HashMap<usize, T>>>,
    /// Serialises the writers, so that no entry made by one is lost to another's copy.
    making: Mutex<()>,
}

impl<T> Default for ByTopic<T> {
    fn default() -> Self {
        ByTopic { map: ArcSwap::default(), making: Mutex::default() }
    }
}

fn cached<T: Clone>(by: &ByTopic<T>, topic: &str, index: usize, make: impl FnOnce() -> T) -> T {
    let found = |map: &HashMap<String, HashMap<usize, T>>| map.get(topic).and_then(|h| h.get(&index)).cloned();
    if let Some(m) = found(&by.map.load()) {
        return m;
    }
    let _making = by.making.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(m) = found(&by.map.load()) {
        return m;
    }
    let made = make();
    let mut map = HashMap::clone(&by.map.load());
    map.entry(topic.to_owned()).or_default().insert(index, made.clone());
    by.map.store(Arc::new(map));
    made
}

/// Each route's [`TopicMetrics`] by topic and handler, made at its first event; and
/// the counters of events that ran nowhere (a route's filter passed them by, no route
/// took them), made at the first such event, so that a route that filters nothing
/// shows no filtered series.
#[derive(Default)]
pub(super) struct TopicsMetrics {
    routes: ByTopic<Arc<TopicMetrics>>,
    passed_by: ByTopic<Counter>,
}

impl TopicsMetrics {
    /// The handles of `handler`'s events of `topic` (`None`: a message no handler
    /// took, with an empty `handler` label).
    pub(super) fn of(&self, topic: &str, handler: Option<&HandlerConfig>) -> Arc<TopicMetrics> {
        let index = handler.map_or(usize::MAX, |h| h.index);
        let name = handler.map_or("", |h| h.name.as_str());
        cached(&self.routes, topic, index, || Arc::new(TopicMetrics::new(topic, name)))
    }

    /// Events of `topic` that `handler`'s route did not select (`event_types`, `when`).
    pub(super) fn filtered(&self, topic: &str, handler: &HandlerConfig) -> Counter {
        let labels = || [("topic", topic.to_owned()), ("handler", handler.name.clone())];
        cached(&self.passed_by, topic, handler.index, || metrics::counter!(names::FILTERED, &labels()))
    }

    /// Events of `topic` that no route selected.
    pub(super) fn unrouted(&self, topic: &str) -> Counter {
        cached(&self.passed_by, topic, usize::MAX, || metrics::counter!(names::UNROUTED, "topic" => topic.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two log handlers of topic `t`, named `a` and `b`.
    fn handlers() -> Vec<HandlerConfig> {
        let handlers = r#"
            [[handlers]]
            name = "a"
            topics = ["t"]
            kind = "log"
            [[handlers]]
            name = "b"
            topics = ["t"]
            kind = "log"
        "#;
        crate::config::testing::parse(handlers).expect("config").handlers
    }

    /// The value of the rendered sample of `name` whose labels include `labels`.
    fn sample(rendered: &str, name: &str, labels: &[&str]) -> Option<f64> {
        crate::metrics::samples(rendered, name, labels).next()
    }

    /// Resolved once per topic and handler, the handles count into the series the
    /// macros would; a handler that filtered nothing has no filtered series, and the
    /// handles of events that ran nowhere are apart from a route's.
    #[test]
    fn events_passed_by_count_per_topic_and_handler_and_only_once_seen() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let hs = handlers();
        metrics::with_local_recorder(&recorder, || {
            let m = TopicsMetrics::default();
            m.filtered("t", &hs[0]).increment(1);
            m.filtered("t", &hs[0]).increment(1);
            m.unrouted("t").increment(1);
            m.of("t", None).dead.increment(1);
            m.of("t", Some(&hs[1])).handled.increment(1);
            m.unrouted("u").increment(1);
            m.unrouted("t").increment(1);
        });
        let r = handle.render();
        assert_eq!(sample(&r, names::FILTERED, &[r#"topic="t""#, r#"handler="a""#]), Some(2.0));
        assert_eq!(sample(&r, names::FILTERED, &[r#"handler="b""#]), None, "b filtered nothing");
        assert_eq!(sample(&r, names::UNROUTED, &[r#"topic="t""#]), Some(2.0));
        assert_eq!(sample(&r, names::UNROUTED, &[r#"topic="u""#]), Some(1.0));
        assert_eq!(sample(&r, names::DEAD, &[r#"topic="t""#, r#"handler="""#]), Some(1.0));
        assert_eq!(sample(&r, names::HANDLED, &[r#"handler="b""#]), Some(1.0));
    }
}
