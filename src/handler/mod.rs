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
    /// May succeed later (connect error, timeout, 5xx, 429, ...).
    #[error("{0}")]
    Retryable(String),
    /// Will not succeed by trying again (4xx, an event that cannot be addressed, ...).
    #[error("{0}")]
    Permanent(String),
}

/// The closed set of handler kinds.
pub enum Handler {
    Http(Box<HttpHandler>),
    Log(LogHandler),
}

impl Handler {
    pub fn build(config: &HandlerConfig) -> anyhow::Result<Handler> {
        Ok(match &config.spec {
            HandlerSpec::Http(http) => Handler::Http(Box::new(HttpHandler::new(http.clone())?)),
            HandlerSpec::Log => Handler::Log(LogHandler),
        })
    }

    pub async fn handle(&self, event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        match self {
            Handler::Http(h) => h.handle(event).await,
            Handler::Log(h) => h.handle(event),
        }
    }
}
