//! How many calls of one handler may be in flight: a limit between 1 and the
//! handler's `concurrency.max`, adapted to the receiver (`concurrency.adaptive`).
//!
//! The controller is the one of Vector's adaptive request concurrency (its RFC
//! 1858), itself TCP's AIMD applied to requests. Time is cut into windows about
//! one round trip long. At the end of each:
//! - a receiver failure in the window (429, 503, a timeout, any
//!   [`crate::handler::HandlerError::Unavailable`]) or a mean round trip above the
//!   past mean by more than [`RTT_DEVIATION_SCALE`] deviations: the limit is
//!   multiplied by [`DECREASE`];
//! - else, if calls were held back by the limit: it grows by 1 (or doubles, while
//!   ramping up after a start or a closed circuit, until the first decrease).
//!
//! The past mean and its deviation are moving averages ([`EWMA_ALPHA`]) of the
//! windows' means. Without `adaptive`, the limit is `max`, except that after the
//! circuit closes it ramps up from 1 by doubling, so a receiver that is back is
//! not met by every waiting call at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::names;

/// The limit's factor on a congestion signal (Vector's default).
const DECREASE: f64 = 0.9;
/// Weight of the newest window in the past round-trip mean (Vector's default).
const EWMA_ALPHA: f64 = 0.4;
/// A window's mean above the past mean by this many deviations is congestion (Vector's default).
const RTT_DEVIATION_SCALE: f64 = 2.5;
/// The least deviation, as a share of the past mean: a receiver whose round trips
/// hardly vary is not judged congested by a few percent.
const MIN_DEVIATION: f64 = 0.05;
/// Where an adaptive limit starts: a few calls that hang (one event's trouble)
/// must not hold up every other key before the first round trip has been measured.
const INITIAL: usize = 16;
/// The shortest window: a receiver answering in microseconds is not judged per call.
const MIN_WINDOW: Duration = Duration::from_millis(5);

/// One handler's limit of calls in flight.
pub struct Limiter {
    name: String,
    max: usize,
    adaptive: bool,
    permits: Arc<Semaphore>,
    ctl: Mutex<Ctl>,
}

struct Ctl {
    limit: f64,
    /// Permits the semaphore was given in all (`floor(limit)`, once the debt is paid).
    issued: usize,
    /// Permits to take back as calls end (the limit fell below what is in flight).
    debt: usize,
    ramping: bool,
    window: Window,
    past_rtt: Option<f64>,
    past_dev: f64,
    /// Congestion met by calls sent before the last decrease was answered under the
    /// old limit: it does not lower the new one again (one decrease per round trip).
    decreased_at: Option<Instant>,
    /// The circuit's [`super::circuit::Circuit::closes`] this limit last ramped up after.
    closes: u64,
}

struct Window {
    started: Instant,
    calls: u32,
    rtt_sum: f64,
    congested: bool,
    held_back: bool,
}

impl Window {
    fn new() -> Window {
        Window::at(Instant::now())
    }

    fn at(started: Instant) -> Window {
        Window { started, calls: 0, rtt_sum: 0.0, congested: false, held_back: false }
    }
}

/// How a call's answer counts for the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The receiver answered (a success, or a failure about the event).
    Answered,
    /// The receiver failed as for any event: overloaded, down, timing out.
    Congested,
}

/// One call in flight; hand it back to [`Limiter::done`].
pub struct Call {
    permit: OwnedSemaphorePermit,
    started: Instant,
}

impl Call {
    /// When the call was let through (its round trip counts from here).
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Limiter {
    /// `max` calls at most; adaptive ones start at [`INITIAL`] and ramp up.
    pub fn new(name: &str, max: usize, adaptive: bool) -> Limiter {
        let start = if adaptive { INITIAL.min(max) } else { max };
        let l = Limiter {
            name: name.to_owned(),
            max,
            adaptive,
            permits: Arc::new(Semaphore::new(start)),
            ctl: Mutex::new(Ctl {
                limit: start as f64,
                issued: start,
                debt: 0,
                ramping: adaptive,
                window: Window::new(),
                past_rtt: None,
                past_dev: 0.0,
                decreased_at: None,
                closes: 0,
            }),
        };
        l.gauge(start);
        l
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current limit.
    #[cfg(test)]
    fn limit(&self) -> usize {
        self.lock().issued
    }

    /// Waits for room for one more call.
    pub async fn acquire(&self) -> Call {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.lock().window.held_back = true;
                self.permits.clone().acquire_owned().await.expect("the limiter's semaphore is never closed")
            }
        };
        Call { permit, started: Instant::now() }
    }

    /// A call ended at `now` (the caller's reading of the clock): its round trip and
    /// how it went move the limit.
    pub fn done(&self, call: Call, signal: Signal, now: Instant) {
        let rtt = now.saturating_duration_since(call.started).as_secs_f64();
        let mut c = self.lock();
        if c.debt > 0 {
            c.debt -= 1;
            call.permit.forget();
        } else {
            drop(call.permit);
        }
        c.window.calls += 1;
        c.window.rtt_sum += rtt;
        let sent_since_decrease = c.decreased_at.is_none_or(|d| call.started >= d);
        c.window.congested |= signal == Signal::Congested && sent_since_decrease;
        let length = Duration::from_secs_f64(c.past_rtt.unwrap_or(rtt)).max(MIN_WINDOW);
        if now.saturating_duration_since(c.window.started) < length {
            return;
        }
        let w = std::mem::replace(&mut c.window, Window::at(now));
        let mean = w.rtt_sum / f64::from(w.calls);
        let slow =
            c.past_rtt.is_some_and(|past| mean > past + RTT_DEVIATION_SCALE * c.past_dev.max(past * MIN_DEVIATION));
        let limit = if self.adaptive && (w.congested || slow) {
            c.ramping = false;
            c.decreased_at = Some(now);
            (c.limit * DECREASE).max(1.0)
        } else if w.held_back && c.ramping {
            (c.limit * 2.0).min(self.max as f64)
        } else if w.held_back && self.adaptive {
            (c.limit + 1.0).min(self.max as f64)
        } else {
            c.limit
        };
        if !self.adaptive && limit >= self.max as f64 {
            c.ramping = false;
        }
        match c.past_rtt {
            None => c.past_rtt = Some(mean),
            Some(past) => {
                let next = past + EWMA_ALPHA * (mean - past);
                c.past_dev += EWMA_ALPHA * ((mean - past).abs() - c.past_dev);
                c.past_rtt = Some(next);
            }
        }
        self.set(&mut c, limit);
    }

    /// After the circuit closed again (`closes` went up): start again from one
    /// call, ramping up, so a receiver that is back is not met by every waiting call.
    pub fn follow(&self, closes: u64) {
        let mut c = self.lock();
        if closes <= c.closes {
            return;
        }
        c.closes = closes;
        drop(c);
        self.restart();
    }

    /// Start again from one call, ramping up.
    fn restart(&self) {
        let mut c = self.lock();
        c.ramping = true;
        c.window = Window::new();
        self.set(&mut c, 1.0);
    }

    fn set(&self, c: &mut Ctl, limit: f64) {
        c.limit = limit;
        let target = (limit.floor() as usize).clamp(1, self.max);
        if target > c.issued {
            let mut more = target - c.issued;
            let paid = more.min(c.debt);
            c.debt -= paid;
            more -= paid;
            self.permits.add_permits(more);
        } else if target < c.issued {
            let fewer = c.issued - target;
            let taken = self.permits.forget_permits(fewer);
            c.debt += fewer - taken;
        }
        if target != c.issued {
            c.issued = target;
            self.gauge(target);
        }
    }

    fn gauge(&self, limit: usize) {
        metrics::gauge!(names::CONCURRENCY, "handler" => self.name.clone()).set(limit as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` calls wanted at once, each answering after 10 ms of a clock the test
    /// keeps (`now`), so that every round is one window.
    fn round(l: &Limiter, now: &mut Instant, n: usize, signal: Signal) {
        let started = *now;
        let mut calls = Vec::new();
        for _ in 0..n {
            match l.permits.clone().try_acquire_owned() {
                Ok(permit) => calls.push(Call { permit, started }),
                Err(_) => {
                    l.lock().window.held_back = true;
                    break;
                }
            }
        }
        *now += Duration::from_millis(10);
        for c in calls {
            l.done(c, signal, *now);
        }
    }

    fn limiter(max: usize, adaptive: bool, now: Instant) -> Limiter {
        let l = Limiter::new("h", max, adaptive);
        l.lock().window = Window::at(now);
        l
    }

    #[test]
    fn it_ramps_up_while_held_back_and_backs_off_on_congestion() {
        let mut now = Instant::now();
        let l = limiter(64, true, now);
        assert_eq!(l.limit(), 16);
        for _ in 0..2 {
            round(&l, &mut now, 100, Signal::Answered);
        }
        assert_eq!(l.limit(), 64, "doubling while ramping, up to max");
        round(&l, &mut now, 100, Signal::Congested);
        assert_eq!(l.limit(), 57, "times 0.9");
        round(&l, &mut now, 100, Signal::Answered);
        assert_eq!(l.limit(), 58, "then one more per window");
        round(&l, &mut now, 10, Signal::Answered);
        assert_eq!(l.limit(), 58, "not held back: no more");
    }

    #[test]
    fn a_window_much_slower_than_the_past_is_congestion() {
        let mut now = Instant::now();
        let l = limiter(64, true, now);
        for _ in 0..8 {
            round(&l, &mut now, 100, Signal::Answered);
        }
        assert_eq!(l.limit(), 64);
        let started = now;
        let calls: Vec<Call> =
            (0..64).map(|_| Call { permit: l.permits.clone().try_acquire_owned().unwrap(), started }).collect();
        now += Duration::from_millis(100);
        for c in calls {
            l.done(c, Signal::Answered, now);
        }
        assert_eq!(l.limit(), 57, "ten times the usual round trip");
    }

    #[test]
    fn a_fixed_limit_stays_at_max_and_ramps_after_a_restart() {
        let mut now = Instant::now();
        let l = limiter(16, false, now);
        assert_eq!(l.limit(), 16);
        round(&l, &mut now, 16, Signal::Congested);
        assert_eq!(l.limit(), 16, "not adaptive: congestion does not lower it");
        l.restart();
        l.lock().window = Window::at(now);
        assert_eq!(l.limit(), 1);
        for _ in 0..4 {
            round(&l, &mut now, 100, Signal::Answered);
        }
        assert_eq!(l.limit(), 16);
    }

    #[tokio::test]
    async fn a_lower_limit_takes_back_permits_of_calls_in_flight() {
        let l = Limiter::new("h", 10, false);
        let calls: Vec<Call> = futures::future::join_all((0..10).map(|_| l.acquire())).await;
        l.restart();
        for c in calls {
            l.done(c, Signal::Answered, Instant::now());
        }
        assert_eq!(l.permits.available_permits(), 1, "ten out, limit 1: one permit left once they end");
    }
}
