//! outboxd embedded in your own service: the config file's handlers for every
//! topic, except one topic whose events go to a closure of this program. The
//! closure prints each event and counts them; outboxd still claims each event
//! id before the closure runs and records it done after, so a redelivered event
//! (the same id at a new offset) does not reach the closure again.
//!
//! ```sh
//! cargo run --example custom_handler -- CONFIG TOPIC
//! # or: OUTBOXD_CONFIG=outboxd.toml OUTBOXD_TOPIC=outbox.event.payment cargo run --example custom_handler
//! ```
//!
//! The config needs a `[[handlers]]` entry that covers TOPIC (any `kind`): it
//! still says how the topic's events are read, retried and dead-lettered.
//! SIGINT or SIGTERM drains and stops. The integration tests run [`run`] against
//! the real broker.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use outboxd::config::Config;
use outboxd::handler::{from_fn, Outcome};

/// How often the closure ran, per event id.
pub type Seen = Arc<Mutex<HashMap<String, usize>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let mut args = std::env::args().skip(1);
    let config_path = args
        .next()
        .or_else(|| std::env::var("OUTBOXD_CONFIG").ok())
        .context("usage: custom_handler CONFIG TOPIC (or OUTBOXD_CONFIG)")?;
    let topic = args
        .next()
        .or_else(|| std::env::var("OUTBOXD_TOPIC").ok())
        .context("usage: custom_handler CONFIG TOPIC (or OUTBOXD_TOPIC)")?;
    let config = Config::load(config_path.as_ref())?;

    let shutdown = async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let seen = Seen::default();
    run(config, topic, seen.clone(), shutdown).await?;
    let runs: usize = seen.lock().unwrap().values().sum();
    eprintln!("custom handler ran {runs} time(s) for {} event id(s)", seen.lock().unwrap().len());
    Ok(())
}

/// Runs outboxd until `shutdown`: the config's handlers, and for `topic` a closure
/// that prints each event and counts it in `seen`.
pub async fn run(
    config: Config,
    topic: String,
    seen: Seen,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let handler = from_fn(move |event| {
        let n = {
            let mut seen = seen.lock().unwrap();
            *seen.entry(event.id.clone()).or_default() += 1;
            seen.len()
        };
        async move {
            // Your side effect here. An Err(HandlerError::Retryable{..}) is retried with
            // backoff, an Err(HandlerError::Permanent(..)) is dead at once.
            println!("{n} {} {} {}", event.id, event.position, event.event_type.as_deref().unwrap_or("-"));
            Ok(Outcome::new(format!("custom handler: event {n}")))
        }
    });
    Ok(outboxd::App::new(config).handler(topic, handler).run(shutdown).await?)
}
