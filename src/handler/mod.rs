//! Handlers run an event's side effect: one attempt in, its result out. The
//! kind is chosen per topic in the config (`http`, `log`, `postgres`), or given by a
//! program that embeds outboxd ([`from_fn`], or any type that implements
//! [`Handler`]). The engine decides retry, dead-letter or done from the result
//! and runs the retry, verify and park policies around it.

mod configured;
mod http;
mod log;
mod postgres;
mod sign;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::event::OutboxEvent;

/// Implementing [`Handler`] outside this crate: `#[outboxd::handler::async_trait]`
/// on the impl, without a dependency of your own.
pub use async_trait::async_trait;
internal_use!(configured::build);
internal_use!(http::BuildError);
pub(crate) use http::HealthProbe;

/// What the handler reports on success, kept in the store as the record's
/// outcome (e.g. `http 201`) and shown by `outboxd store get`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome(pub String);

impl Outcome {
    /// The outcome `text` (e.g. `http 201`, `printed`).
    pub fn new(text: impl Into<String>) -> Outcome {
        Outcome(text.into())
    }
}

/// Why an attempt failed, whose failure it is (this event's, or the receiver's
/// for every event), and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// The receiver fails for everyone: it cannot be reached (connect refused or
    /// reset, DNS, TLS), times out, or answers 408, 425, 429 or 5xx. It counts
    /// toward the handler's circuit (`[handlers.circuit]`): while that is open no
    /// event of the handler starts, and failures then are not charged to the event's
    /// `retry` budget. The receiver may say when to come back (`Retry-After`): the
    /// whole handler pauses that long.
    #[error("{reason}")]
    Unavailable {
        /// What went wrong, for the log and the record.
        reason: String,
        /// How long the receiver asked to wait (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// This event may succeed later (e.g. 409: a request with its key is in
    /// flight); the receiver may say when (`Retry-After`). Retried with backoff
    /// within the handler's `retry` limits, then dead.
    #[error("{reason}")]
    Retryable {
        /// What went wrong, for the log and the record.
        reason: String,
        /// How long the receiver asked to wait (`Retry-After`): a floor for the next delay.
        retry_after: Option<Duration>,
    },
    /// Will not succeed by trying again (4xx, an event that cannot be addressed,
    /// ...): dead at once.
    #[error("{0}")]
    Permanent(String),
}

impl HandlerError {
    /// A retryable failure of this event, without a `Retry-After`.
    pub fn retryable(reason: impl Into<String>) -> HandlerError {
        HandlerError::Retryable { reason: reason.into(), retry_after: None }
    }

    /// The receiver fails for every event, without a `Retry-After`.
    pub fn unavailable(reason: impl Into<String>) -> HandlerError {
        HandlerError::Unavailable { reason: reason.into(), retry_after: None }
    }

    /// The receiver's `Retry-After`, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            HandlerError::Unavailable { retry_after, .. } | HandlerError::Retryable { retry_after, .. } => *retry_after,
            HandlerError::Permanent(_) => None,
        }
    }
}

/// What a `verify` lookup says about an event whose earlier attempt's outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verified {
    /// The receiver has it (2xx): record done without running again.
    Happened(String),
    /// The receiver does not have it (404): run it.
    Missing,
}

/// Runs one event's side effect. Implementations must be safe to call again for
/// the same event: after a failure, or after a crash left the outcome unknown
/// (`on_uncertain`), the engine calls again with the same event id.
///
/// An `async fn` in a trait is not usable as `dyn Handler`; `async_trait` boxes
/// the future so that handlers of different types sit in one table.
#[async_trait]
pub trait Handler: Send + Sync {
    /// One attempt. `Ok` is recorded done with the outcome's text.
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError>;

    /// For `on_uncertain = "verify"`: did an earlier attempt whose outcome is
    /// unknown take effect? The default has no lookup and says `Missing`, so the
    /// event runs again.
    async fn verify(&self, _event: &OutboxEvent) -> Result<Verified, HandlerError> {
        Ok(Verified::Missing)
    }
}

/// A handler from an async closure that takes the event (a copy) and returns
/// the attempt's result.
///
/// ```
/// use outboxd::handler::{from_fn, Outcome};
/// let handler = from_fn(|event| async move {
///     println!("{}", event.id);
///     Ok(Outcome::new("printed"))
/// });
/// ```
pub fn from_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(OutboxEvent) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Outcome, HandlerError>> + Send,
{
    FnHandler(f)
}

/// A [`Handler`] made of an async closure; see [`from_fn`]. It has no `verify`
/// lookup: under `on_uncertain = "verify"` an uncertain event runs again.
pub struct FnHandler<F>(F);

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(OutboxEvent) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Outcome, HandlerError>> + Send,
{
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        (self.0)(event.clone()).await
    }
}

/// A shared handler (e.g. one `Arc<dyn Handler>` for several topics) is a handler.
#[async_trait]
impl<H: Handler + ?Sized> Handler for Arc<H> {
    async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        (**self).handle(event).await
    }

    async fn verify(&self, event: &OutboxEvent) -> Result<Verified, HandlerError> {
        (**self).verify(event).await
    }
}
