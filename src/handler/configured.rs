//! The handlers a `[[handlers]]` entry configures.

use std::sync::Arc;

use super::http::{BuildError, HttpHandler};
use super::log::LogHandler;
use super::postgres::PostgresHandler;
use super::Handler;
use crate::config::{HandlerConfig, HandlerSpec};

/// The handler a `[[handlers]]` entry configures.
pub fn build(config: &HandlerConfig) -> Result<Arc<dyn Handler>, BuildError> {
    Ok(match &config.spec {
        HandlerSpec::Http(http) => Arc::new(HttpHandler::new((**http).clone())?),
        HandlerSpec::Log => Arc::new(LogHandler),
        HandlerSpec::Postgres(pg) => Arc::new(PostgresHandler::new((**pg).clone())?),
    })
}
