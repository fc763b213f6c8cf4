//! Limits on failed credentials (a wrong bearer token on `/v1`, a wrong token at the
//! console's login), per client address and from everyone together. Only failures
//! are counted, after the credential was checked: a valid credential is never
//! refused, however many wrong ones came from its address (behind an ingress, a
//! proxy or a tunnel every operator shares one). What the limits buy is bounded work
//! and log lines under a flood; guessing is hopeless anyway, since every token is at
//! least 16 bytes (`[admin] token`, `[[admin.tokens]]`, the per-run token).

use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::metrics::names;

/// Addresses remembered before the ones whose budget is full again are forgotten.
const ADDRESSES_KEPT: usize = 10_000;

/// Why a failed credential is answered 429 rather than 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// This address failed `[admin] failures_per_address` times this minute.
    Address,
    /// Everyone together failed `[admin] failures_total` times this minute.
    Total,
}

impl Limited {
    pub fn as_str(self) -> &'static str {
        match self {
            Limited::Address => "failures_per_address",
            Limited::Total => "failures_total",
        }
    }
}

/// Failed credentials so far, per address and in all.
pub struct Failures {
    per_address: DefaultKeyedRateLimiter<IpAddr>,
    total: DefaultDirectRateLimiter,
}

impl Failures {
    /// At most `per_address` failures per minute from one address, `total` from all.
    pub fn new(per_address: u32, total: u32) -> Failures {
        let quota = |n: u32| Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN));
        Failures { per_address: RateLimiter::keyed(quota(per_address)), total: RateLimiter::direct(quota(total)) }
    }

    /// A credential from `peer` was wrong: `Ok` while within both limits (answer 401
    /// and log it), the limit it went past otherwise (answer 429, log nothing more).
    pub fn failed(&self, peer: IpAddr) -> Result<(), Limited> {
        metrics::counter!(names::ADMIN_AUTH_FAILURES).increment(1);
        if self.per_address.len() > ADDRESSES_KEPT {
            self.per_address.retain_recent();
        }
        let limited = if self.per_address.check_key(&peer).is_err() {
            Some(Limited::Address)
        } else if self.total.check().is_err() {
            Some(Limited::Total)
        } else {
            None
        };
        match limited {
            Some(l) => {
                metrics::counter!(names::ADMIN_LIMITED, "reason" => l.as_str()).increment(1);
                Err(l)
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn an_address_past_its_failures_is_limited_and_another_is_not() {
        let f = Failures::new(3, 100);
        for _ in 0..3 {
            assert_eq!(f.failed(ip(1)), Ok(()));
        }
        assert_eq!(f.failed(ip(1)), Err(Limited::Address));
        assert_eq!(f.failed(ip(2)), Ok(()), "another address has its own budget");
    }

    #[test]
    fn failures_from_many_addresses_meet_the_total() {
        let f = Failures::new(3, 5);
        for last in 0..5 {
            assert_eq!(f.failed(ip(last)), Ok(()));
        }
        assert_eq!(f.failed(ip(9)), Err(Limited::Total));
    }
}
