//! Handlers run an event's side effect. The kind is chosen per topic in the
//! config; the engine decides retry or dead-letter from [`HandlerError`].

mod http;
mod log;

use crate::config::{HandlerConfig, HandlerSpec};
use crate::event::OutboxEvent;

pub use http::HttpHandler;
pub use log::LogHandler;

/// What the handler reports on success, kept in the store (e.g. `http 201`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome(pub String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// May succeed later (connect error, timeout, 5xx, 429, ...); the receiver may
    /// say when (`Retry-After`).
    #[error("{reason}")]
    Retryable { reason: String, retry_after: Option<std::time::Duration> },
    /// Will not succeed by trying again (4xx, an event that cannot be addressed, ...).
    #[error("{0}")]
    Permanent(String),
}

impl HandlerError {
    pub fn retryable(reason: impl Into<String>) -> HandlerError {
        HandlerError::Retryable { reason: reason.into(), retry_after: None }
    }
}

/// What a `verify` lookup says about an event whose earlier attempt's outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// The receiver has it (2xx): record done without running again.
    Happened(String),
    /// The receiver does not have it (404): run it.
    Missing,
}

/// The closed set of handler kinds.
pub enum Handler {
    Http(Box<HttpHandler>),
    Log(LogHandler),
}

impl Handler {
    pub fn build(config: &HandlerConfig) -> anyhow::Result<Handler> {
        Ok(match &config.spec {
            HandlerSpec::Http(http) => Handler::Http(Box::new(HttpHandler::new((**http).clone())?)),
            HandlerSpec::Log => Handler::Log(LogHandler),
        })
    }

    pub async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        match self {
            Handler::Http(h) => h.handle(event).await,
            Handler::Log(h) => h.handle(event),
        }
    }

    /// Asks the receiver whether an uncertain event happened. Handlers without a
    /// lookup report `Missing`, so the event runs again.
    pub async fn verify(&self, event: &OutboxEvent) -> Result<Verified, HandlerError> {
        match self {
            Handler::Http(h) => h.verify(event).await,
            Handler::Log(_) => Ok(Verified::Missing),
        }
    }
}
