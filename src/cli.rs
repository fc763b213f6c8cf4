//! The command line: `run`, `check-config`, `store …`. anyhow lives here;
//! errors are printed by `main` with their context chain.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;

use crate::admin::AdminClient;
use crate::config::{Config, EventIdSource, HandlerSpec, RawConfig};
use crate::store::view::{self, plain, record_json, stats_json, table};
use crate::store::{now_us, Owner, State, Store, StoreError, StoreOptions};

#[derive(Debug, Parser)]
#[command(name = "outboxd", version, about = "Runs the side effects of transactional-outbox events exactly once.")]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume and execute until SIGINT/SIGTERM, then drain and commit.
    Run(ConfigArg),
    /// Validate the config and print the handler for each topic.
    CheckConfig(ConfigArg),
    /// Inspect or repair the dedup store (opens it directly; stop `run` first).
    #[command(subcommand)]
    Store(StoreCommand),
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Config file (TOML).
    #[arg(long, short, default_value = "outboxd.toml", env = "OUTBOXD_CONFIG")]
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Config file whose [store].path is used.
    #[arg(long, short, default_value = "outboxd.toml", env = "OUTBOXD_CONFIG")]
    pub config: PathBuf,
    /// The store directory (instead of reading it from the config).
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Counts per state, duplicates suppressed, size on disk, oldest/newest.
    Stats(StoreArgs),
    /// One record.
    Get {
        event_id: String,
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Records in id order.
    List {
        #[arg(long)]
        state: Option<State>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Remove a record so the event runs again when it is redelivered.
    Forget {
        event_id: String,
        /// Confirm: the event's side effect may then happen again.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Remove expired done/dead records now (retention).
    Gc(StoreArgs),
    /// Run dead (or parked) events again from their stored copy, through the same
    /// handler and dedup rules. Needs the full config (handlers).
    Retry {
        /// One event id; or use --all-dead.
        event_id: Option<String>,
        /// Every dead event (optionally of one --topic).
        #[arg(long, conflicts_with = "event_id")]
        all_dead: bool,
        #[arg(long, requires = "all_dead")]
        topic: Option<String>,
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Decide a parked (or dead) event: it happened (--done) or run it again (--retry).
    Resolve {
        event_id: String,
        #[arg(long, conflicts_with = "retry", required_unless_present = "retry")]
        done: bool,
        #[arg(long)]
        retry: bool,
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Records as JSON Lines (with the message copy of dead and parked events).
    Export {
        #[arg(long)]
        state: Option<State>,
        #[arg(long)]
        topic: Option<String>,
        #[command(flatten)]
        args: StoreArgs,
    },
}

/// The store itself, or the running service that holds it.
enum Access {
    Direct(Box<Store>),
    Remote(AdminClient),
}

/// Opens the store; when a running outboxd holds it and recorded its admin
/// address, goes through that service instead, with the token it wrote next
/// to the address (when this user may read the owner file).
fn access(args: &StoreArgs) -> anyhow::Result<Access> {
    match open_store(args) {
        Ok(store) => Ok(Access::Direct(Box::new(store))),
        Err(e) => match e.downcast_ref::<StoreError>() {
            Some(StoreError::Locked { path, admin: Some(addr), .. }) => {
                // The token of the run that recorded this address, not of a later one.
                let token = Owner::read(path).filter(|o| o.admin.as_ref() == Some(addr)).and_then(|o| o.admin_token);
                Ok(Access::Remote(AdminClient::new(addr, token)?))
            }
            _ => Err(e),
        },
    }
}

pub async fn store_command(cmd: StoreCommand) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Stats(args) => {
            let (value, source) = match access(&args)? {
                Access::Direct(store) => (stats_json(&store.stats()?), format!("store {}", store.path().display())),
                Access::Remote(c) => (c.stats().await?, format!("store of the running service at {}", c.address())),
            };
            if args.json {
                println!("{value}");
            } else {
                println!("{source}\n{}", view::stats_table(&value));
            }
        }
        StoreCommand::Get { event_id, args } => {
            let value = match access(&args)? {
                Access::Direct(store) => store.get(&event_id)?.map(|r| record_json(&r)),
                Access::Remote(c) => c.get(&event_id).await?,
            };
            let Some(value) = value else {
                bail!("no record for event {event_id:?}");
            };
            if args.json {
                println!("{value}");
            } else {
                println!("{}", view::record_table(&value));
            }
        }
        StoreCommand::List { state, limit, args } => {
            let values: Vec<Value> = match access(&args)? {
                Access::Direct(store) => store.list(state, limit)?.iter().map(record_json).collect(),
                Access::Remote(c) => c.list(state.map(State::as_str), None, limit).await?,
            };
            if args.json {
                println!("{}", Value::Array(values));
            } else {
                print_records(&values);
            }
        }
        StoreCommand::Forget { event_id, yes, args } => {
            if !yes {
                bail!("forgetting {event_id:?} lets its side effect run again when it is redelivered; re-run with --yes to confirm");
            }
            let r = match access(&args)? {
                Access::Direct(store) => record_json(&store.forget(&event_id).await?),
                Access::Remote(c) => c.repair("forget", &event_id).await?,
            };
            println!("forgot {event_id} (was {}, {} attempt(s))", plain(&r["state"]), plain(&r["attempts"]));
        }
        StoreCommand::Gc(args) => {
            let removed = match access(&args)? {
                Access::Direct(store) => store.gc(now_us()).await?,
                Access::Remote(c) => c.repair("gc", "").await?["removed"].as_u64().unwrap_or(0),
            };
            println!("removed {removed} expired record(s)");
        }
        StoreCommand::Retry { event_id, all_dead, topic, args } => {
            if let Access::Remote(c) = access(&args)? {
                let ids = match event_id {
                    Some(id) => vec![id],
                    None if all_dead => {
                        let dead = c.list(Some("dead"), topic.as_deref(), usize::MAX).await?;
                        dead.iter().filter_map(|r| r["event_id"].as_str().map(str::to_owned)).collect()
                    }
                    None => bail!("name an event id, or use --all-dead"),
                };
                return retry_remote(&c, &ids).await;
            }
            let ids = match event_id {
                Some(id) => vec![id],
                None if all_dead => {
                    let store = open_store(&args)?;
                    let dead = store.list_filtered(Some(State::Dead), topic.as_deref(), usize::MAX)?;
                    dead.into_iter().map(|r| r.event_id).collect()
                }
                None => bail!("name an event id, or use --all-dead"),
            };
            run_again(&args, &ids).await?;
        }
        StoreCommand::Resolve { event_id, done, retry: _, args } => match (access(&args)?, done) {
            (Access::Direct(store), true) => {
                store.resolve_done(&event_id, "resolved by hand: done".to_owned()).await?;
                println!("{event_id}: recorded done (it will not run again)");
            }
            (Access::Direct(store), false) => {
                drop(store);
                run_again(&args, &[event_id]).await?;
            }
            (Access::Remote(c), true) => {
                c.repair("resolve", &event_id).await?;
                println!("{event_id}: recorded done (it will not run again)");
            }
            (Access::Remote(c), false) => retry_remote(&c, &[event_id]).await?,
        },
        StoreCommand::Export { state, topic, args } => {
            use std::io::Write;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            // Drawn on stderr when it is a terminal; hidden when piped or redirected.
            let progress = indicatif::ProgressBar::new_spinner()
                .with_style(indicatif::ProgressStyle::with_template("{spinner} {pos} records exported ({per_sec})")?);
            match access(&args)? {
                Access::Direct(store) => {
                    progress.set_length(store.len() as u64);
                    progress.set_style(indicatif::ProgressStyle::with_template(
                        "{bar:40} {pos}/{len} records scanned, {per_sec}, eta {eta}",
                    )?);
                    store.scan(state, topic.as_deref(), |r| -> anyhow::Result<()> {
                        writeln!(out, "{}", view::export_line(&store, &r)?)?;
                        progress.inc(1);
                        Ok(())
                    })?;
                }
                Access::Remote(c) => {
                    let lines = c.export(state.map(State::as_str), topic.as_deref(), &mut out, &progress).await?;
                    progress.set_position(lines);
                }
            }
            out.flush()?;
            progress.finish_and_clear();
            eprintln!("exported {} record(s)", progress.position());
        }
    }
    Ok(())
}

fn print_records(values: &[Value]) {
    println!("{}\n{} record(s)", view::records_table(values), values.len());
}

async fn retry_remote(c: &AdminClient, ids: &[String]) -> anyhow::Result<()> {
    let (mut done, mut failed) = (0, 0);
    for id in ids {
        let r = c.repair("retry", id).await?;
        if r["state"] == "done" {
            done += 1;
            println!("{id}: done ({})", plain(&r["outcome"]));
        } else {
            failed += 1;
            println!("{id}: {} ({})", plain(&r["state"]), plain(&r["reason"]));
        }
    }
    println!("{done} done, {failed} failed");
    if failed > 0 {
        bail!("{failed} event(s) failed again");
    }
    Ok(())
}

/// Runs stored copies again through the executor (the handler, retries, dead letters).
async fn run_again(args: &StoreArgs, ids: &[String]) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let opts = StoreOptions {
        retention: config.store.retention,
        commit_interval: config.store.commit_interval,
        fsync: config.store.fsync,
        role: "store retry",
        cache_bytes: crate::store::SMALL_CACHE_BYTES,
    };
    let path = args.path.clone().unwrap_or_else(|| config.store.path.clone());
    let store = std::sync::Arc::new(Store::open(&path, &opts)?);
    let exec = crate::engine::Executor::new(config, store.clone())?;
    let (mut done, mut failed) = (0, 0);
    for id in ids {
        match exec.rerun(id).await.with_context(|| format!("retrying {id}"))? {
            Some(r) if r.state == State::Done => {
                done += 1;
                println!("{id}: done ({})", r.outcome.unwrap_or_default());
            }
            Some(r) => {
                failed += 1;
                println!("{id}: {} again ({})", r.state, r.reason.unwrap_or_default());
            }
            None => {
                // An undecodable message that now decodes is recorded under its real event id.
                done += 1;
                println!("{id}: re-run (recorded under its decoded event id)");
            }
        }
    }
    println!("{done} done, {failed} failed");
    if failed > 0 {
        bail!("{failed} event(s) failed again");
    }
    Ok(())
}

fn open_store(args: &StoreArgs) -> anyhow::Result<Store> {
    let (path, retention) = match &args.path {
        Some(p) => (p.clone(), None),
        None => store_section(&args.config)?,
    };
    if !path.exists() {
        bail!("no store at {} (nothing has run with this config yet?)", path.display());
    }
    let opts = StoreOptions {
        retention: retention.unwrap_or(std::time::Duration::from_secs(7 * 86400)),
        commit_interval: std::time::Duration::ZERO,
        fsync: true,
        role: "store",
        cache_bytes: crate::store::SMALL_CACHE_BYTES,
    };
    Ok(Store::open(&path, &opts)?)
}

/// Only `[store]` is needed: `${VAR}`s elsewhere need not be set for `store` commands.
fn store_section(config: &Path) -> anyhow::Result<(PathBuf, Option<std::time::Duration>)> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("reading {} (or pass --path to the store directory)", config.display()))?;
    let raw: RawConfig = toml::from_str(&text).with_context(|| format!("invalid config {}", config.display()))?;
    let retention =
        raw.store.retention.as_deref().map(humantime::parse_duration).transpose().context("store.retention")?;
    Ok((raw.store.path, retention))
}

pub fn check_config(path: &Path) -> anyhow::Result<()> {
    let config = Config::load(path)?;
    crate::engine::validate_kafka_options(&config.kafka)?;
    println!("config {} is valid", path.display());
    println!(
        "kafka: brokers={} group_id={} commit_interval={} drain_timeout={}",
        config.kafka.brokers,
        config.kafka.group_id,
        humantime::format_duration(config.kafka.commit_interval),
        humantime::format_duration(config.kafka.drain_timeout)
    );
    println!(
        "store: path={} retention={} commit_interval={} max_in_flight={} fsync={}",
        config.store.path.display(),
        humantime::format_duration(config.store.retention),
        humantime::format_duration(config.store.commit_interval),
        config.store.max_in_flight,
        config.store.fsync
    );
    let mut t = table(&["handler", "topics", "kind", "target", "event id", "retry"]);
    for h in &config.handlers {
        let (kind, target) = match &h.spec {
            HandlerSpec::Http(http) => {
                let names: Vec<&str> = http.headers.iter().map(|(n, _)| n.as_str()).collect();
                let headers = if names.is_empty() {
                    String::new()
                } else {
                    format!("\nheaders: {} (values hidden)", names.join(", "))
                };
                ("http", format!("{} {}{headers}", http.method, http.url.as_str()))
            }
            HandlerSpec::Log => ("log", "stdout, one JSON line per event".to_owned()),
        };
        let id = match &h.event_id {
            EventIdSource::Header(n) => format!("header {n}"),
            EventIdSource::Field(f) => format!("field {f}"),
        };
        let retry = format!(
            "{} attempts, {}..{}",
            h.retry.max_attempts,
            humantime::format_duration(h.retry.initial_backoff),
            humantime::format_duration(h.retry.max_backoff)
        );
        t.add_row(vec![format!("handlers[{}]", h.index), h.topics.to_string(), kind.to_owned(), target, id, retry]);
    }
    println!("{t}");
    Ok(())
}
