//! The command line: `run`, `check-config`, `store …`. anyhow lives here;
//! errors are printed by `main` with their context chain.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;

use crate::config::{Config, EventIdSource, HandlerSpec};
use crate::ops::{self, Actor, Needs, Opened, Rerun, StoreApi};
use crate::wire::{AuditView, State};
use tables::table;

mod entry;
mod replay;
mod tables;

pub use entry::main;
/// For the benchmark's processes, which start as `outboxd` does.
#[cfg(feature = "internals")]
pub use entry::small_pages;

/// The `outboxd` command line.
#[derive(Debug, Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Runs the side effect of each transactional-outbox event once per event id."
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines on stderr are written.
// The variants' docs are for the API only: help on a value would turn every
// command's `--help` into the long layout.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[value(help = None::<&str>)]
    Human,
    /// One JSON object per line.
    #[value(help = None::<&str>)]
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume and execute until SIGINT/SIGTERM, then drain and commit.
    Run(ConfigArg),
    /// Validate the config and print the handler for each topic.
    CheckConfig(ConfigArg),
    /// Inspect or repair the dedup store (directly, or through the running service that holds it).
    #[command(subcommand)]
    Store(StoreCommand),
}

/// The config file of `run` and `check-config`.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Config file (TOML).
    #[arg(long, short, default_value = "outboxd.toml", env = "OUTBOXD_CONFIG")]
    pub config: PathBuf,
}

/// Where the store is and how to print, for every `store` subcommand.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Config file whose store.path is used.
    #[arg(long, short, default_value = "outboxd.toml", env = "OUTBOXD_CONFIG")]
    pub config: PathBuf,
    /// The store directory (instead of reading it from the config).
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Why a repair is made, for the audit.
#[derive(Debug, Args)]
pub struct ReasonArg {
    /// Why (kept in the audit with who and when; one line, at most 500 characters).
    #[arg(long)]
    pub reason: Option<String>,
}

impl ReasonArg {
    /// Who makes the repair: `cli:<user>` on the store itself; through a running
    /// service, the service names the caller by its credential (the reason is sent).
    fn actor(&self) -> anyhow::Result<Actor> {
        Ok(Actor::cli(self.reason.as_deref())?)
    }
}

/// `outboxd store …`: inspect or repair the dedup store.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Counts per state, duplicates suppressed, size on disk, oldest/newest.
    Stats(StoreArgs),
    /// One record.
    Get {
        /// The event id.
        event_id: String,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Records in id order.
    List {
        /// Only records in this state (claimed, done, dead, parked, held).
        #[arg(long)]
        state: Option<State>,
        /// At most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Remove a record so the event runs again when it is redelivered.
    Forget {
        /// The event id.
        event_id: String,
        /// Confirm: the event's side effect may then happen again.
        #[arg(long)]
        yes: bool,
        /// Why, for the audit.
        #[command(flatten)]
        reason: ReasonArg,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Remove expired done/dead records now (retention).
    Gc {
        /// Why, for the audit.
        #[command(flatten)]
        reason: ReasonArg,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// What people did to the store (forget, resolve, retry, gc), newest first:
    /// when, who, the events, what came of it, and why.
    Audit {
        /// At most this many entries.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only the entries naming this event.
        #[arg(long)]
        id: Option<String>,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Run dead (or parked) events again from their stored copy, through the same
    /// handler and dedup rules. Needs the full config (handlers).
    Retry {
        /// One event id; or use --all-dead.
        event_id: Option<String>,
        /// Every dead event (optionally of one --topic).
        #[arg(long, conflicts_with = "event_id")]
        all_dead: bool,
        /// Only the dead events of this topic (with --all-dead).
        #[arg(long, requires = "all_dead")]
        topic: Option<String>,
        /// Why, for the audit.
        #[command(flatten)]
        reason: ReasonArg,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Run the final events of a time window again from their source messages, read
    /// again from Kafka by the partition and offset each record keeps: in offset order
    /// (per key, the order they came), once each, with the same idempotency key unless
    /// --new-key. Needs the full config and the brokers.
    Replay {
        /// The source topic.
        #[arg(long)]
        topic: String,
        /// Only events of this type.
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
        /// Only records in this state: done, dead or parked (repeat for several; all three when not given).
        #[arg(long)]
        state: Vec<State>,
        /// Events first seen at or after this time: RFC 3339 (2026-12-04T10:00:00Z) or a time ago (6h).
        #[arg(long)]
        since: String,
        /// Events first seen before this time (the same forms; now when not given).
        #[arg(long)]
        until: Option<String>,
        /// Print what would be replayed, and what the topic no longer holds; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Send new idempotency keys (the event's key and `#replay-<when the replay began, in ms>`),
        /// for a receiver that would otherwise suppress the calls as duplicates.
        #[arg(long)]
        new_key: bool,
        /// Why (kept in the audit entry of every replayed event).
        #[arg(long)]
        reason: String,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Decide a parked (or dead) event: it happened (--done) or run it again (--retry).
    Resolve {
        /// The event id.
        event_id: String,
        /// It happened: record it done, never run it again.
        #[arg(long, conflicts_with = "retry", required_unless_present = "retry")]
        done: bool,
        /// Run it again from its stored copy, through its handler.
        #[arg(long)]
        retry: bool,
        /// Why, for the audit.
        #[command(flatten)]
        reason: ReasonArg,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Read every changelog partition into the store (a new, emptied or replaced
    /// store), with the service stopped. Needs the full config and the brokers.
    Rebuild(StoreArgs),
    /// Copy the store's records into the changelog topics (created if missing),
    /// with the service stopped: what the service does at start-up when the store
    /// ran with the changelog off (or under an earlier release), done ahead of time.
    /// Resumes after an interruption. Needs the full config and the brokers.
    Publish {
        /// Copy even when the store is marked as having everything in the changelog.
        #[arg(long)]
        force: bool,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
    /// Records as JSON Lines (with the message copy of dead, parked and held events).
    Export {
        /// Only records in this state (claimed, done, dead, parked, held).
        #[arg(long)]
        state: Option<State>,
        /// Only records of this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Where the store is, and the output format.
        #[command(flatten)]
        args: StoreArgs,
    },
}

impl StoreCommand {
    fn args(&self) -> &StoreArgs {
        match self {
            StoreCommand::Stats(args) | StoreCommand::Rebuild(args) => args,
            StoreCommand::Gc { args, .. }
            | StoreCommand::Audit { args, .. }
            | StoreCommand::Get { args, .. }
            | StoreCommand::List { args, .. }
            | StoreCommand::Forget { args, .. }
            | StoreCommand::Retry { args, .. }
            | StoreCommand::Replay { args, .. }
            | StoreCommand::Resolve { args, .. }
            | StoreCommand::Publish { args, .. }
            | StoreCommand::Export { args, .. } => args,
        }
    }

    /// Re-runs need the handlers of the whole config.
    fn needs(&self) -> Needs {
        match self {
            StoreCommand::Retry { .. } | StoreCommand::Replay { .. } | StoreCommand::Resolve { done: false, .. } => {
                Needs::Handlers
            }
            _ => Needs::Records,
        }
    }

    /// What can be refused before the store is opened.
    fn check(&self) -> anyhow::Result<()> {
        match self {
            StoreCommand::Forget { event_id, yes: false, .. } => {
                bail!("forgetting {event_id:?} lets its side effect run again when it is redelivered; re-run with --yes to confirm")
            }
            StoreCommand::Retry { event_id: None, all_dead: false, .. } => {
                bail!("name an event id, or use --all-dead")
            }
            StoreCommand::Replay { topic, event_type, state, since, until, reason, .. } => {
                ops::Window::new(topic, event_type.as_deref(), state.clone(), since, until.as_deref())
                    .map_err(|e| anyhow::anyhow!("--{e}"))?;
                Actor::cli(Some(reason))?;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Runs a `store` command on the store itself or, when a running outboxd holds
/// it, through that service ([`ops::open`]).
pub async fn store_command(cmd: StoreCommand) -> anyhow::Result<()> {
    cmd.check()?;
    if let StoreCommand::Rebuild(args) = &cmd {
        return rebuild(args).await;
    }
    if let StoreCommand::Publish { args, force } = &cmd {
        return publish(args, *force).await;
    }
    let args = cmd.args();
    match ops::open(&args.config, args.path.as_deref(), cmd.needs())? {
        Opened::Local(api) => store_command_on(&api, cmd).await,
        Opened::Remote(api) => store_command_on(&api, cmd).await,
    }
}

async fn store_command_on(api: &impl StoreApi, cmd: StoreCommand) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Stats(args) => {
            let stats = api.stats().await?;
            let handlers = api.handlers().await?;
            if args.json {
                let mut json = serde_json::to_value(&stats)?;
                if let (Some(h), Some(map)) = (&handlers, json.as_object_mut()) {
                    map.insert("handlers".to_owned(), serde_json::to_value(h)?);
                }
                println!("{json}");
            } else {
                println!("{}\n{}", api.source(), tables::stats_table(&stats));
                if let Some(handlers) = handlers {
                    println!("{}", tables::handlers_table(&handlers));
                }
            }
        }
        StoreCommand::Get { event_id, args } => {
            let Some(record) = api.get(&event_id).await? else {
                bail!("no record for event {event_id:?}");
            };
            if args.json {
                println!("{}", serde_json::to_string(&record)?);
            } else {
                println!("{}", tables::record_table(&record));
            }
        }
        StoreCommand::List { state, limit, args } => {
            let records = api.list(state, None, limit).await?;
            if args.json {
                println!("{}", serde_json::to_string(&records)?);
            } else {
                println!("{}\n{} record(s)", tables::records_table(&records), records.len());
            }
        }
        StoreCommand::Forget { event_id, reason, .. } => {
            let r = api.forget(&event_id, &reason.actor()?).await?;
            println!("forgot {event_id} (was {}, {} attempt(s))", r.state, r.attempts);
        }
        StoreCommand::Gc { reason, .. } => {
            let gc = api.gc(&reason.actor()?).await?;
            println!("removed {} expired record(s)", gc.removed);
        }
        StoreCommand::Audit { limit, id, args } => {
            let entries = match id {
                Some(id) => api.audit_of(&id).await?.into_iter().take(limit).collect(),
                None => audit_entries(api, limit).await?,
            };
            if args.json {
                println!("{}", serde_json::to_string(&entries)?);
            } else {
                println!("{}\n{} entr{}", tables::audit_table(&entries), entries.len(), plural_y(entries.len()));
            }
        }
        // Handled before a store is opened (they need the brokers, not the store API).
        StoreCommand::Rebuild(args) => return rebuild(&args).await,
        StoreCommand::Publish { args, force } => return publish(&args, force).await,
        StoreCommand::Retry { event_id, topic, reason, .. } => {
            let ids = match event_id {
                Some(id) => vec![id],
                None => ops::dead_ids(api, topic.as_deref()).await?,
            };
            rerun(api, &ids, &reason.actor()?).await?;
        }
        StoreCommand::Replay { topic, event_type, state, since, until, dry_run, new_key, reason, args } => {
            let window = ops::Window::new(&topic, event_type.as_deref(), state, &since, until.as_deref())
                .map_err(|e| anyhow::anyhow!("--{e}"))?;
            let how = replay::How { dry_run, new_key, json: args.json, config: args.config.clone() };
            replay::run(api, &window, &how, &Actor::cli(Some(&reason))?).await?;
        }
        StoreCommand::Resolve { event_id, done: true, reason, .. } => {
            api.resolve_done(&event_id, &reason.actor()?).await?;
            println!("{event_id}: recorded done (it will not run again)");
        }
        StoreCommand::Resolve { event_id, reason, .. } => rerun(api, &[event_id], &reason.actor()?).await?,
        StoreCommand::Export { state, topic, .. } => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            // Drawn on stderr when it is a terminal; hidden when piped or redirected.
            let progress = indicatif::ProgressBar::new_spinner()
                .with_style(indicatif::ProgressStyle::with_template("{spinner} {pos} records exported ({per_sec})")?);
            if let Some(len) = api.known_len() {
                progress.set_length(len);
                progress.set_style(indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} records scanned, {per_sec}, eta {eta}",
                )?);
            }
            let lines = api.export(state, topic.as_deref(), &mut out, &progress).await?;
            std::io::Write::flush(&mut out)?;
            progress.finish_and_clear();
            eprintln!("exported {lines} record(s)");
        }
    }
    Ok(())
}

/// `store rebuild`: the changelog into the store, one line per partition.
async fn rebuild(args: &StoreArgs) -> anyhow::Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(path) = &args.path {
        config.store.path = path.clone();
    }
    let rebuilt = crate::app::rebuild(&config).await?;
    if args.json {
        let lines: Vec<Value> = rebuilt
            .iter()
            .map(|r| {
                serde_json::json!({"topic": r.partition.topic, "partition": r.partition.partition, "changelog_topic": r.changelog_topic,
                    "read": r.restored.read, "applied": r.restored.applied, "checkpoint": r.restored.checkpoint})
            })
            .collect();
        println!("{}", Value::Array(lines));
        return Ok(());
    }
    for r in &rebuilt {
        println!(
            "{}/{}: {} record(s) read from {}, {} applied, checkpoint {}",
            r.partition.topic,
            r.partition.partition,
            r.restored.read,
            r.changelog_topic,
            r.restored.applied,
            r.restored.checkpoint
        );
    }
    let read: u64 = rebuilt.iter().map(|r| r.restored.read).sum();
    println!("{} partition(s), {read} record(s) read", rebuilt.len());
    Ok(())
}

/// `store publish`: the store's records into the changelog, progress on stderr
/// every few seconds, the result on stdout.
async fn publish(args: &StoreArgs, force: bool) -> anyhow::Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(path) = &args.path {
        config.store.path = path.clone();
    }
    let mut report = |p: &crate::store::changelog::publish::Published| {
        eprintln!(
            "{} of {} record(s) copied, {} skipped, {} records/s{}",
            p.sent,
            p.total,
            p.skipped,
            crate::app::publish_rate(p),
            if p.resumed { " (resumed)" } else { "" }
        );
    };
    let published = crate::app::publish(&config, force, &mut report).await?;
    let Some(p) = published else {
        if args.json {
            println!("{}", serde_json::json!({"complete": true, "sent": 0}));
        } else {
            println!("the changelog has every record of this store already (nothing to copy; --force copies anyway)");
        }
        return Ok(());
    };
    let seconds = p.elapsed.as_secs_f64();
    let per_second = crate::app::publish_rate(&p);
    if args.json {
        println!(
            "{}",
            serde_json::json!({"complete": true, "sent": p.sent, "skipped": p.skipped, "total": p.total,
                "resumed": p.resumed, "seconds": seconds, "per_second": per_second})
        );
    } else {
        println!(
            "copied {} record(s) into the changelog ({} skipped: expired, or of topics not consumed now) in {seconds:.1} s, {per_second} records/s{}",
            p.sent,
            p.skipped,
            if p.resumed { ", resumed from an earlier copy" } else { "" }
        );
    }
    Ok(())
}

/// Up to `limit` audit entries, newest first, page after page.
async fn audit_entries(api: &impl StoreApi, limit: usize) -> anyhow::Result<Vec<AuditView>> {
    let (mut entries, mut before) = (Vec::new(), None::<String>);
    while entries.len() < limit {
        let page = api.audit(before.as_deref(), limit - entries.len()).await?;
        entries.extend(page.entries);
        match page.next {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    entries.truncate(limit);
    Ok(entries)
}

fn plural_y(n: usize) -> &'static str {
    if n == 1 {
        "y"
    } else {
        "ies"
    }
}

/// Runs stored copies again (the handler, retries, dead letters), one line per event.
async fn rerun(api: &impl StoreApi, ids: &[String], actor: &Actor) -> anyhow::Result<()> {
    let (mut done, mut failed) = (0, 0);
    for raw in ids {
        // The ids and reasons came with events: escaped on the terminal, as in the tables.
        let id = tables::shown(raw);
        match api.rerun(raw, actor).await? {
            Rerun::Finished(r) if r.state == State::Done => {
                done += 1;
                println!("{id}: done ({})", tables::shown(&r.outcome.unwrap_or_default()));
            }
            // Its key waits behind an earlier dead event (`on_dead = "hold"`): it runs after that one.
            Rerun::Finished(r) if r.state == State::Held => {
                println!(
                    "{id}: held (an earlier event of its key is dead or parked; it runs once that one is dealt with)"
                );
            }
            Rerun::Finished(r) => {
                failed += 1;
                println!("{id}: {} again ({})", r.state, tables::shown(&r.reason.unwrap_or_default()));
            }
            Rerun::Redecoded => {
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

/// How long `check-config` waits for the brokers to list their topics.
const CHECK_BROKERS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Which changelog topics `run` would create or use, when the brokers answer.
/// Returns the reasons `run` would refuse to start.
fn print_changelog_plan(config: &Config) -> Vec<String> {
    let Some(changelog) = &config.store.changelog else {
        println!("changelog: off (the local store is the only dedup state)");
        return Vec::new();
    };
    println!("changelog: on, topics {}", changelog.topic_template);
    let keys = crate::store::changelog::mac::Keys::new(changelog);
    match (&changelog.keys, keys.key_id()) {
        (Some(k), Some(id)) => println!(
            "changelog: records signed with key id {id}; previous key ids accepted: [{}]; unsigned records {}",
            keys.previous_key_ids().join(", "),
            if k.accept_unsigned { "accepted (accept_unsigned)" } else { "rejected" }
        ),
        _ => println!(
            "changelog: WARNING records are not signed (store.changelog.key unset): whoever can write to the \
             changelog topics steers side effects (docs/security.md)"
        ),
    }
    match crate::kafka::changelog::plan(config, changelog, CHECK_BROKERS_TIMEOUT) {
        Err(error) => {
            println!("changelog: brokers not reachable ({error:#}); topics not checked");
            Vec::new()
        }
        Ok(plan) => {
            for (source, name, n) in &plan.create {
                println!("changelog: would create {name} ({n} partitions, for {source})");
            }
            for (source, name, _) in &plan.existing {
                println!("changelog: {name} exists (for {source})");
            }
            for warning in &plan.warnings {
                println!("changelog: WARNING {warning}");
            }
            for reason in &plan.mismatched {
                println!("changelog: ERROR {reason}");
            }
            plan.mismatched
        }
    }
}

/// The admin server's address and the credentials its store API accepts, by name
/// and access (never a token).
fn print_admin(admin: &crate::config::AdminConfig) {
    let Some(listen) = admin.listen else {
        println!("admin: off");
        return;
    };
    let mut credentials = vec![format!("{} (operate; the owner file's per-run token)", crate::config::RUN_TOKEN_NAME)];
    if admin.token.is_some() {
        credentials.push(format!("{} (operate; [admin] token)", crate::config::ADMIN_TOKEN_NAME));
    }
    credentials.extend(admin.tokens.iter().map(|t| format!("{} ({})", t.name, t.access.as_str())));
    println!("admin: listen={listen} credentials: {}", credentials.join(", "));
}

/// `outboxd check-config`: validates the config, lets librdkafka check
/// `kafka.options`, prints the settings, the changelog topics `run` would create
/// (when the brokers answer), and the handler for each topic.
pub fn check_config(path: &Path) -> anyhow::Result<()> {
    let config = Config::load(path)?;
    crate::kafka::validate_options(&config.kafka)?;
    println!("config {} is valid", path.display());
    println!(
        "kafka: brokers={} group_id={} commit_interval={} drain_timeout={}",
        config.kafka.brokers,
        config.kafka.group_id,
        humantime::format_duration(config.kafka.commit_interval),
        humantime::format_duration(config.kafka.drain_timeout)
    );
    println!(
        "store: path={} retention={} commit_interval={} backlog_commit_interval={} max_in_flight={} fsync={}",
        config.store.path.display(),
        humantime::format_duration(config.store.retention),
        humantime::format_duration(config.store.commit_interval),
        humantime::format_duration(config.store.backlog_commit_interval),
        config.store.max_in_flight,
        config.store.fsync
    );
    print_admin(&config.admin);
    let refused = print_changelog_plan(&config);
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
                let signed = match &http.sign {
                    Some(sign) => format!("\nsigned: standard-webhooks, {} secret(s)", sign.keys().len()),
                    None => String::new(),
                };
                ("http", format!("{} {}{headers}{signed}", http.method, http.url.as_str()))
            }
            HandlerSpec::Log => ("log", "stdout, one JSON line per event".to_owned()),
            HandlerSpec::Postgres(pg) => (
                "postgres",
                format!(
                    "{}\n{} statement(s); inbox {}.{}; pool {}",
                    pg.shown,
                    pg.statements.len(),
                    pg.inbox_table,
                    pg.id_column,
                    pg.pool_size
                ),
            ),
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
    println!("{}", tables::routes(&config));
    if !refused.is_empty() {
        bail!("`outboxd run` would refuse to start: {}", refused.join("; "));
    }
    Ok(())
}
