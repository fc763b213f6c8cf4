use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use outboxd::cli::{self, Cli, Command, LogFormat};
use outboxd::config::Config;
use tracing_subscriber::EnvFilter;

/// Every event allocates in sled, rdkafka and the handler on several threads;
/// mimalloc's thread-local free lists cost less CPU than glibc's arenas there
/// (see bench/findings.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long the exit waits for blocking tasks still running after the work is done.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            report(format_args!("error: starting the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(dispatch(cli.command));
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

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            // Installed before anything else, so a signal during start-up also drains.
            let shutdown = shutdown_signal()?;
            let config = Config::load(&args.config)?;
            outboxd::app::run(config, shutdown).await
        }
        Command::CheckConfig(args) => cli::check_config(&args.config),
        Command::Store(cmd) => cli::store_command(cmd).await,
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
/// stream that goes away never stops the service (`log_writer`).
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("OUTBOXD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(outboxd::log_writer::MakeLossyStderr)
        // Its report of a failed write is an `eprintln!`, a panic when stderr is gone.
        .log_internal_errors(false);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
