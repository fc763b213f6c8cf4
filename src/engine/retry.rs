//! The retry schedule: exponential backoff with full jitter, at least the
//! receiver's `Retry-After`, bounded by `max_attempts` and `max_elapsed`.

use std::time::{Duration, Instant};

use backon::BackoffBuilder;

use crate::config::RetryConfig;

/// The exponential schedule (backon), without its own jitter: full jitter is applied per delay.
pub(super) fn backoff(retry: &RetryConfig) -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(retry.initial_backoff)
        .with_max_delay(retry.max_backoff)
        .with_factor(retry.multiplier)
        .with_max_times(retry.max_attempts.saturating_sub(1) as usize)
        .build()
}

/// Full jitter (uniform in `0..=delay`), at least the receiver's `Retry-After`;
/// `None` when attempts are used up or waiting would pass `max_elapsed`.
/// A receiver may send any `Retry-After` (up to `u64::MAX` seconds): the sum is
/// checked, so an absurd one ends the retries instead of overflowing.
pub(super) fn next_delay(
    delays: &mut impl Iterator<Item = Duration>,
    retry_after: Option<Duration>,
    started: Instant,
    retry: &RetryConfig,
) -> Option<Duration> {
    let ceiling = delays.next()?;
    let jittered = ceiling.mul_f64(rand::random::<f64>());
    let delay = retry_after.map_or(jittered, |ra| ra.max(jittered));
    let resumes_after = started.elapsed().checked_add(delay)?;
    (resumes_after <= retry.max_elapsed).then_some(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(max_elapsed: Duration) -> RetryConfig {
        RetryConfig {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            multiplier: 2.0,
            max_elapsed,
        }
    }

    #[test]
    fn an_absurd_retry_after_ends_the_retries_instead_of_overflowing() {
        let r = retry(Duration::from_secs(60));
        let mut delays = backoff(&r);
        let huge = Some(Duration::from_secs(u64::MAX));
        assert_eq!(next_delay(&mut delays, huge, Instant::now(), &r), None);
    }

    #[test]
    fn a_retry_after_beyond_max_elapsed_ends_the_retries() {
        let r = retry(Duration::from_secs(60));
        let mut delays = backoff(&r);
        assert_eq!(next_delay(&mut delays, Some(Duration::from_secs(61)), Instant::now(), &r), None);
    }

    #[test]
    fn a_retry_after_within_max_elapsed_is_the_least_pause() {
        let r = retry(Duration::from_secs(60));
        let mut delays = backoff(&r);
        let d = next_delay(&mut delays, Some(Duration::from_secs(2)), Instant::now(), &r).expect("a retry");
        assert_eq!(d, Duration::from_secs(2));
    }
}
