//! The `outboxd` binary's whole life: parse the arguments, start a runtime, set up
//! logging (and span export), run the command, give blocking work a moment at the
//! end, and print an error with its causes.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use super::{Cli, Command, LogFormat};
use crate::config::{Config, OtlpConfig};
use crate::telemetry;

/// How long the exit waits for blocking tasks still running after the work is done.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

pub fn main() -> ExitCode {
    small_pages();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            report(format_args!("error: starting the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(dispatch(cli.command, cli.log_format));
    // Dropping the runtime would wait for every blocking task still running (a
    // changelog read of a restore or a standby pass, a metadata lookup), each up to
    // its own timeout: the service would linger past its drain after saying it
    // stopped. Everything that must outlast the process is flushed and committed by
    // now, so what is left is given up after a moment.
    runtime.shutdown_timeout(EXIT_GRACE);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(format_args!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Transparent huge pages off for the process, unless `MIMALLOC_ALLOW_THP` (the
/// allocator's own setting) says otherwise. The allocator asks for them on its large
/// regions, and a 2 MiB page that holds a few live objects stays resident whole: a
/// store of 10M records opened with them held 158 MB, without them 104 MB, and the
/// drains' CPU per event did not move (bench/findings.md, 2026-12-05). Called before
/// any thread starts; a kernel without the setting runs as before. The benchmark's
/// processes call it too, so that they hold memory as the service does.
pub fn small_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        let _ = nix::sys::prctl::set_thp_disable(true);
    }
}

async fn dispatch(command: Command, format: LogFormat) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            // Installed before anything else, so a signal during start-up also drains.
            let shutdown = shutdown_signal()?;
            // Read before logging starts (reading logs nothing): `[tracing.otlp]` says
            // whether the subscriber also exports spans.
            let config = Config::load(&args.config)?;
            let exporter = init_logging(format, config.otlp.as_ref())?;
            // On a worker of the runtime, not on the main thread: the poll loop spawns
            // each key's chain, and a task spawned from a worker waits in that worker's
            // queue (run next, on the same core), where one spawned from outside goes
            // through the shared queue and wakes a sleeping worker, event after event.
            let outcome = match tokio::spawn(crate::app::run(config, shutdown)).await {
                Ok(outcome) => outcome,
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(join) => return Err(join.into()),
            };
            // After the drain: the last spans get `telemetry::FLUSH_TIMEOUT` at most.
            if let Some(exporter) = exporter {
                exporter.shutdown().await;
            }
            Ok(outcome?)
        }
        Command::CheckConfig(args) => {
            init_logging(format, None)?;
            super::check_config(&args.config)
        }
        Command::Store(cmd) => {
            init_logging(format, None)?;
            super::store_command(cmd).await
        }
    }
}

/// SIGINT or SIGTERM: both drain. The handlers are installed when this is called.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

/// The last line, on stderr; lost when stderr is gone (`eprintln!` would panic on it).
fn report(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Log lines go to stderr; one that cannot be written is dropped and counted, so a log
/// stream that goes away never stops the service (`log_writer`). `OUTBOXD_LOG` (or
/// `RUST_LOG`, default `info`) filters the log lines only. With `otlp`, spans also go
/// to the exporter, through a filter of its own (`telemetry`): the per-event spans are
/// exported whatever the log level, and log lines do not change with them. Runs on
/// the runtime (the exporter's batch task is spawned on it).
fn init_logging(format: LogFormat, otlp: Option<&OtlpConfig>) -> anyhow::Result<Option<telemetry::Exporter>> {
    let filter = EnvFilter::try_from_env("OUTBOXD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let Some(config) = otlp else {
        // No exporter: the filter is global, as it always was.
        tracing_subscriber::registry().with(filter).with(log_layer(format)).init();
        return Ok(None);
    };
    let (spans, exporter) = telemetry::layer(config)?;
    tracing_subscriber::registry().with(spans).with(log_layer(format).with_filter(filter)).init();
    Ok(Some(exporter))
}

/// The log lines' layer, in `format`.
fn log_layer<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let log = tracing_subscriber::fmt::layer()
        .with_writer(crate::log_writer::MakeLossyStderr)
        // Its report of a failed write is an `eprintln!`, a panic when stderr is gone.
        .log_internal_errors(false);
    match format {
        LogFormat::Human => log.boxed(),
        LogFormat::Json => log.json().boxed(),
    }
}
