//! What each handler did since the last summary, for the `info` line written every
//! `log.summary_interval`: the per-event lines are at `debug`, so a busy service
//! writes a few lines a minute instead of one `write(2)` per event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sketches_ddsketch::{Config as SketchConfig, DDSketch};

/// One handler's counts and call times since the last [`Tally::take`].
pub(super) struct Tally {
    handled: AtomicU64,
    duplicates: AtomicU64,
    dead: AtomicU64,
    held: AtomicU64,
    /// Call times in seconds: a sketch answers p50/p99 within 1% of the value in a
    /// few kilobytes, whatever the number of calls.
    calls: Mutex<DDSketch>,
}

/// What [`Tally::take`] found.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Summary {
    pub(super) handled: u64,
    pub(super) duplicates: u64,
    pub(super) dead: u64,
    pub(super) held: u64,
    pub(super) calls: u64,
    pub(super) call_p50: Option<Duration>,
    pub(super) call_p99: Option<Duration>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            handled: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            dead: AtomicU64::new(0),
            held: AtomicU64::new(0),
            calls: Mutex::new(DDSketch::new(SketchConfig::defaults())),
        }
    }
}

impl Tally {
    pub(super) fn handled(&self) {
        self.handled.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    /// Dead or parked.
    pub(super) fn dead(&self) {
        self.dead.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn held(&self) {
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// A call to the handler that took `took`, whatever its answer.
    pub(super) fn call(&self, took: Duration) {
        self.calls.lock().expect("call times lock").add(took.as_secs_f64());
    }

    /// The counts and call times since the last take, which start again from zero;
    /// `None` when nothing happened meanwhile (an idle handler writes no line).
    pub(super) fn take(&self) -> Option<Summary> {
        let calls = std::mem::replace(
            &mut *self.calls.lock().expect("call times lock"),
            DDSketch::new(SketchConfig::defaults()),
        );
        let quantile = |q| calls.quantile(q).ok().flatten().map(|s: f64| Duration::from_secs_f64(s.max(0.0)));
        let summary = Summary {
            handled: self.handled.swap(0, Ordering::Relaxed),
            duplicates: self.duplicates.swap(0, Ordering::Relaxed),
            dead: self.dead.swap(0, Ordering::Relaxed),
            held: self.held.swap(0, Ordering::Relaxed),
            calls: calls.count() as u64,
            call_p50: quantile(0.5),
            call_p99: quantile(0.99),
        };
        let quiet = summary.handled + summary.duplicates + summary.dead + summary.held + summary.calls == 0;
        (!quiet).then_some(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_sums_what_happened_since_the_last_and_starts_again() {
        let tally = Tally::default();
        assert_eq!(tally.take(), None, "nothing happened: no line");
        for ms in 1..=100 {
            tally.call(Duration::from_millis(ms));
            tally.handled();
        }
        tally.duplicate();
        tally.dead();
        tally.held();
        let s = tally.take().expect("a summary");
        assert_eq!((s.handled, s.duplicates, s.dead, s.held, s.calls), (100, 1, 1, 1, 100));
        let near = |d: Option<Duration>, ms: f64| (d.unwrap().as_secs_f64() * 1000.0 - ms).abs() <= ms * 0.02;
        assert!(near(s.call_p50, 50.0), "{:?}", s.call_p50);
        assert!(near(s.call_p99, 99.0), "{:?}", s.call_p99);
        assert_eq!(tally.take(), None, "the next take starts from zero");
    }
}
