//! Waiting for what a test expects, through the harness's one deadline loop (behind
//! [`keep_looking`] and [`keep_looking_blocking`]); every wait is built on it:
//!
//! - [`wait_until`], [`wait_until_async`]: a condition (plain or async); the test fails
//!   after the timeout, naming what it waited for.
//! - [`wait_for_some`], [`wait_for`]: a value that shows up; [`wait_for`]'s look says
//!   what it saw instead, and a failure says that too.
//! - [`wait_at_most`]: a wait whose timeout is no failure ("preferably while a call is
//!   in flight").
//! - [`keep_looking`], [`keep_looking_blocking`]: the loop itself, for waits that end in
//!   an error of their own (clean-up code) or run in synchronous code.
//!
//! [`Outboxd::wait_until`](super::Outboxd::wait_until) and
//! [`Outboxd::wait_for`](super::Outboxd::wait_for) add a look at whether outboxd still
//! runs, so that a test whose outboxd died fails at once instead of at the timeout.
//!
//! The looks are async closures, whose futures the compiler cannot yet prove `Send`:
//! the waits run on a test's own task, not in a spawned task or a server's handler.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How often the waits look again unless they say otherwise.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// How a wait passes the time between two looks.
#[derive(Clone, Copy, Debug)]
enum Pause {
    /// Sleeps its task: async code.
    Task(Duration),
    /// Sleeps its thread: synchronous code, where no task could wake it.
    Thread(Duration),
}

/// The loop: looks until `look` answers `Ok`, pausing between looks; once `timeout` has
/// passed, answers the last `Err`. It always looks at least once.
async fn looking<T, E>(timeout: Duration, pause: Pause, mut look: impl AsyncFnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = Instant::now() + timeout;
    loop {
        match look().await {
            Ok(found) => return Ok(found),
            Err(last) if Instant::now() >= deadline => return Err(last),
            Err(_) => match pause {
                Pause::Task(every) => tokio::time::sleep(every).await,
                Pause::Thread(every) => std::thread::sleep(every),
            },
        }
    }
}

/// Calls `look` every `every` until it answers `Ok`; after `timeout`, its last `Err`
/// (for a wait that gives up in its own way, e.g. with an error its caller reports).
pub async fn keep_looking<T, E>(
    timeout: Duration,
    every: Duration,
    look: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    looking(timeout, Pause::Task(every), look).await
}

/// [`keep_looking`] for synchronous code (reaping a child process, a blocking client):
/// the thread sleeps between looks.
pub fn keep_looking_blocking<T, E>(
    timeout: Duration,
    every: Duration,
    mut look: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    // A synchronous look and a thread sleep never leave the future pending: it is
    // done on its first poll, with no runtime needed to drive it.
    futures::executor::block_on(looking(timeout, Pause::Thread(every), async || look()))
}

/// Fails the test: `what` did not happen within `timeout`.
fn timed_out(what: impl Display, timeout: Duration) -> ! {
    panic!("timed out after {timeout:?} waiting for {what}")
}

/// Waits until `look` answers `Ok` and returns its value; fails the test after
/// `timeout` with `what` and the last `Err` (what the look saw instead).
pub async fn wait_for<T, E: Display>(
    what: impl Display,
    timeout: Duration,
    look: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    keep_looking(timeout, POLL_EVERY, look)
        .await
        .unwrap_or_else(|last| panic!("timed out after {timeout:?} waiting for {what}; last look: {last}"))
}

/// Waits until `look` finds something and returns it; fails the test after `timeout`.
pub async fn wait_for_some<T>(what: impl Display, timeout: Duration, mut look: impl FnMut() -> Option<T>) -> T {
    keep_looking(timeout, POLL_EVERY, async || look().ok_or(())).await.unwrap_or_else(|()| timed_out(what, timeout))
}

/// Waits until `cond` holds; fails the test after `timeout`.
pub async fn wait_until(what: impl Display, timeout: Duration, mut cond: impl FnMut() -> bool) {
    wait_for_some(what, timeout, || cond().then_some(())).await
}

/// Waits until the async `cond` holds (a look over HTTP, say); fails the test after `timeout`.
pub async fn wait_until_async(what: impl Display, timeout: Duration, mut cond: impl AsyncFnMut() -> bool) {
    keep_looking(timeout, POLL_EVERY, async || if cond().await { Ok(()) } else { Err(()) })
        .await
        .unwrap_or_else(|()| timed_out(what, timeout))
}

/// Waits at most `timeout` for `cond`, looking every `every`; whether it holds. For a
/// wait whose end is no failure, e.g. "kill it, preferably while a call is in flight".
pub async fn wait_at_most(timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    keep_looking(timeout, every, async || if cond() { Ok(()) } else { Err(()) }).await.is_ok()
}
