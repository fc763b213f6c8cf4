//! The scenarios, one module each, in the order the suite runs them.

pub(crate) mod crash;
pub(crate) mod drain;
pub(crate) mod failover;
pub(crate) mod latency;
pub(crate) mod overload;
pub(crate) mod restore;
pub(crate) mod scale;
pub(crate) mod slow;
pub(crate) mod store;

/// outboxd logs: warnings, plus the assignment line the clock starts on (no per-event line).
pub(crate) const QUIET_LOG: &str = "warn,outboxd::kafka::source=info";
