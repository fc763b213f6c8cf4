//! Actions the console runs on many events: each a task of its own, so that it
//! goes on when the browser closes (like an admin retry), with its progress kept
//! here for the page that watches it. Bounded: [`MAX_RUNNING`] at once, the last
//! [`KEPT`] remembered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// What an operator can do to a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run a dead or parked event again from its stored copy.
    Retry,
    /// Record it done by hand: it will not run.
    Resolve,
    /// Remove its record: a redelivery of its id runs again.
    Forget,
    /// Run a final event again from its source message, read again from Kafka.
    Replay,
}

impl Action {
    pub(super) fn parse(s: &str) -> Option<Action> {
        match s {
            "retry" => Some(Action::Retry),
            "resolve" => Some(Action::Resolve),
            "forget" => Some(Action::Forget),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Resolve => "resolve",
            Action::Forget => "forget",
            Action::Replay => "replay",
        }
    }

    /// What it will do to `n` events, said before it runs.
    pub(super) fn impact(self, n: usize) -> String {
        let events = if n == 1 { "1 event".to_owned() } else { format!("{n} events") };
        match self {
            Action::Retry => format!(
                "This will call the receiver again for {events}, from the stored copies, with the same idempotency key as before. \
                 Each ends done, or dead (or parked) again."
            ),
            Action::Resolve => format!(
                "This will record {events} done by hand. Nothing runs; a redelivery is suppressed like any done event's."
            ),
            Action::Forget => format!(
                "This will remove the record of {events}. A redelivery of {} id would run again.",
                if n == 1 { "this" } else { "each" }
            ),
            Action::Replay => format!(
                "This will run {events} again from the messages Kafka keeps, one at a time in offset order, \
                 through their handlers, with the same idempotency keys unless new keys are asked for."
            ),
        }
    }
}

/// Jobs running at once; a further one waits for a turn (shown as "waiting").
/// Each re-run may hold a handler call for its whole retry schedule, as the
/// admin API's retries do.
pub const MAX_RUNNING: usize = 2;
/// Jobs remembered (finished ones beyond this are forgotten, oldest first).
const KEPT: usize = 50;
/// Failures listed per job; the count covers all of them.
const FAILURES_LISTED: usize = 20;

/// One bulk (or single) action and how far it is.
pub struct Job {
    pub id: u64,
    pub action: Action,
    pub who: String,
    pub total: usize,
    pub started: SystemTime,
    /// Events the action was carried out on.
    pub done: AtomicUsize,
    /// Events it failed on (their errors, the first few, in `failures`).
    pub failed: AtomicUsize,
    pub finished: AtomicBool,
    failures: Mutex<Vec<(String, String)>>,
}

impl Job {
    pub fn failed_on(&self, id: &str, error: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if failures.len() < FAILURES_LISTED {
            failures.push((id.to_owned(), error));
        }
    }

    pub fn failures(&self) -> Vec<(String, String)> {
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Events dealt with so far (carried out or failed).
    pub fn handled(&self) -> usize {
        self.done.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }
}

/// The jobs of this process.
pub struct Jobs {
    all: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: AtomicUsize,
    pub turns: Arc<tokio::sync::Semaphore>,
}

impl Default for Jobs {
    fn default() -> Jobs {
        Jobs {
            all: Mutex::new(BTreeMap::new()),
            next: AtomicUsize::new(1),
            turns: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING)),
        }
    }
}

impl Jobs {
    /// Registers a job over `total` events.
    pub fn add(&self, action: Action, who: &str, total: usize) -> Arc<Job> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) as u64;
        let job = Arc::new(Job {
            id,
            action,
            who: who.to_owned(),
            total,
            started: SystemTime::now(),
            done: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            finished: AtomicBool::new(false),
            failures: Mutex::new(Vec::new()),
        });
        let mut all = self.all.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        all.insert(id, job.clone());
        while all.len() > KEPT {
            let oldest_finished = all.iter().find(|(_, j)| j.finished.load(Ordering::Relaxed)).map(|(k, _)| *k);
            match oldest_finished {
                Some(k) => all.remove(&k),
                None => break,
            };
        }
        job
    }

    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.all.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&id).cloned()
    }
}
