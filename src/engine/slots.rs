//! What the executor keeps per `[[handlers]]` entry (a [`Slot`]) and per topic (its
//! metric handles, resolved at the topic's first event instead of once per event).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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

/// Each route's [`TopicMetrics`] by topic and handler, made at its first event. Topics
/// are few (a pattern matches new ones rarely), so entries are never removed.
#[derive(Default)]
pub(super) struct TopicsMetrics(RwLock<HashMap<String, HashMap<usize, Arc<TopicMetrics>>>>);

impl TopicsMetrics {
    /// The handles of `handler`'s events of `topic` (`None`: a message no handler
    /// took, with an empty `handler` label).
    pub(super) fn of(&self, topic: &str, handler: Option<&HandlerConfig>) -> Arc<TopicMetrics> {
        let index = handler.map_or(usize::MAX, |h| h.index);
        if let Some(m) = self.0.read().expect("topic metrics lock").get(topic).and_then(|h| h.get(&index)) {
            return m.clone();
        }
        let mut all = self.0.write().expect("topic metrics lock");
        let name = handler.map_or("", |h| h.name.as_str());
        let of_topic = all.entry(topic.to_owned()).or_default();
        of_topic.entry(index).or_insert_with(|| Arc::new(TopicMetrics::new(topic, name))).clone()
    }
}
