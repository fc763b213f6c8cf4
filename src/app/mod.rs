//! Wires a running outboxd: the store, metrics, the Kafka consumer, the
//! executor and its handlers, the engine, the admin server and the background
//! tasks; runs until shut down, drains, and prints the summary.
//!
//! Stopping has one cause, the `shutdown` token: the caller's shutdown
//! future (SIGINT/SIGTERM in the binary) or a store failure cancels it. The
//! engine then stops taking events and drains; after the drain (while it
//! lasts `/readyz` answers `draining`) every background task in the
//! [`JoinSet`] is stopped and awaited, the store is closed, and the summary is
//! logged.

mod publish;
mod rebuild;
mod tasks;

pub use publish::{publish, rate as publish_rate};
pub use rebuild::rebuild;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin;
use crate::config::{ChangelogConfig, Config};
use crate::engine::{Counters, Engine, Executor, Fatal, RestoreSetup};
use crate::error::{Error, ErrorKind};
use crate::handler::Handler;
use crate::kafka::changelog::Plan;
use crate::kafka::{self, Consumer, Tracker};
use crate::offsets::OffsetTracker;
use crate::store::{Store, StoreOptions};

/// How long start-up waits for the brokers to list topics (changelog topics).
const CHANGELOG_LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs outboxd with the handlers of `config` until `shutdown` resolves (or the
/// store fails), then drains. What `outboxd run` does; [`App`] is the same with
/// handlers of your own.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    App::new(config).run(shutdown).await
}

/// outboxd embedded in your program: the configured service, with your own
/// handlers for some topics.
///
/// ```no_run
/// use outboxd::handler::{from_fn, Outcome};
///
/// # async fn example() -> anyhow::Result<()> {
/// let config = outboxd::config::Config::load("outboxd.toml".as_ref())?;
/// outboxd::App::new(config)
///     .handler("outbox.event.payment", from_fn(|event| async move {
///         println!("payment event {}", event.id);
///         Ok(Outcome::new("printed"))
///     }))
///     .run(async { tokio::signal::ctrl_c().await.unwrap() })
///     .await?;
/// # Ok(())
/// # }
/// ```
pub struct App {
    config: Config,
    custom: HashMap<String, Arc<dyn Handler>>,
    /// outboxd installs its Prometheus recorder (and serves `/metrics`) unless
    /// the program records metrics itself ([`App::own_metrics`]).
    install_metrics: bool,
}

impl App {
    /// The service as `config` describes it (validated: [`Config::load`], [`Config::parse`]).
    pub fn new(config: Config) -> App {
        App { config, custom: HashMap::new(), install_metrics: true }
    }

    /// The program records metrics itself: it installed a recorder of its own
    /// (of the `metrics` crate), or none. outboxd then installs no Prometheus
    /// recorder (a second one could not be installed anyway), records its
    /// metrics through whatever recorder is installed, and its admin server
    /// answers `/metrics` with 404.
    pub fn own_metrics(mut self) -> App {
        self.install_metrics = false;
        self
    }

    /// Runs `handler` for the events of `topic` (an exact topic name) instead of
    /// the kind its `[[handlers]]` entry configures. The entry is still needed
    /// and still says how the events are read (`format`, `event_id`, ...),
    /// deduplicated (`dedup_scope`), retried (`[handlers.retry]`), verified or
    /// parked (`on_uncertain`) and dead-lettered. Other topics keep their
    /// configured handlers. A second handler for the same topic replaces the first.
    pub fn handler(mut self, topic: impl Into<String>, handler: impl Handler + 'static) -> App {
        self.custom.insert(topic.into(), Arc::new(handler));
        self
    }

    /// Runs until `shutdown` resolves (or the store fails), then drains: waits
    /// for events in flight up to `kafka.drain_timeout`, commits finished
    /// offsets, stops the admin server and background tasks, closes the store.
    /// Fails at start-up (a topic given to [`App::handler`] that no `[[handlers]]`
    /// entry covers, a store that cannot be opened, ...) and when it stopped on its
    /// own (the store failed, the consumer failed for good); [`Error::kind`] says which.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let App { config, custom, install_metrics } = self;
        crate::engine::check_custom_topics(&config, &custom)
            .map_err(|e| Error::new(ErrorKind::Config, "checking the handlers given to App::handler", e))?;
        // Opening may wait for another process's lock and reads the store's indexes:
        // not on a runtime worker (the service runs on one).
        let opening = config.clone();
        let store = tokio::task::spawn_blocking(move || open_store(&opening))
            .await
            .map_err(|e| Error::new(ErrorKind::Store, "opening the store", e))??;
        // Before the first client: what they count while start-up waits for the brokers is kept.
        let prometheus = if install_metrics {
            Some(crate::metrics::install().map_err(|e| Error::new(ErrorKind::Metrics, "setting up metrics", e))?)
        } else {
            None
        };
        let broker = kafka::BrokerHealth::of(&config.kafka);
        // Said before anything waits for them; whether they answer, `kafka::BrokerHealth` says.
        let waiting_for = match &config.store.changelog {
            Some(_) => format!(
                "their topic list, to check the changelog topics (at most {})",
                humantime::format_duration(CHANGELOG_LOOKUP_TIMEOUT)
            ),
            None => "the consumer group to assign partitions".to_owned(),
        };
        info!(brokers = %config.kafka.brokers, %waiting_for, "connecting to the Kafka brokers");
        let (restore, plan) = changelog(&config, &store).await?;
        let token = CancellationToken::new();
        let mut tracker = if restore.is_some() { OffsetTracker::with_restore() } else { OffsetTracker::default() };
        tracker.fence_after(config.kafka.fence_after);
        let tracker = Tracker::new(tracker);
        let subscriptions = config.subscriptions();
        tokio::pin!(shutdown);
        if let Some(setup) = &restore {
            // Before the consumer joins the group: nothing is handled until the changelog has every record.
            let copy = publish::before_joining(&config, &setup.changelog, &store, plan.as_ref());
            tokio::select! {
                copied = copy => copied.map_err(copy_failed)?,
                () = &mut shutdown => {
                    info!("stopped during the copy into the changelog; the next start goes on from where it was");
                    return store.close().await.map_err(|e| Error::new(ErrorKind::Store, "flushing the store", e));
                }
            }
        }
        let consumer = Arc::new(
            Consumer::build(&config.kafka, &subscriptions, tracker.clone())
                .map_err(|e| Error::new(ErrorKind::Kafka, "creating the Kafka consumer", e))?,
        );
        let max_in_flight = config.store.max_in_flight;
        let gc_interval = config.store.gc_interval;
        let stall_timeout = config.stall_timeout();
        let admin_config = config.admin.clone();
        let summary_interval = config.log.summary_interval;
        let exec = Arc::new(
            Executor::with_handlers(config, store.clone(), custom)
                .map_err(|e| Error::new(ErrorKind::Config, "setting up handlers", e))?
                .cancels(token.clone()),
        );
        let engine = Engine::new(exec.clone(), consumer, tracker.clone());

        // Background tasks run through the drain and stop after it.
        let background = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if let Some(addr) = admin_config.listen {
            let admin_failed = |context: &str| {
                let context = context.to_owned();
                move |e| Error::new(ErrorKind::Admin, context, e)
            };
            let listener = admin::bind(addr).await.map_err(|e| Error::plain(ErrorKind::Admin, e.to_string()))?;
            let local = listener.local_addr().map_err(admin_failed("reading the admin server's address"))?;
            store
                .advertise_admin(&local.to_string())
                .map_err(admin_failed("recording the admin address next to the store"))?;
            let state = admin::AdminState {
                exec: exec.clone(),
                tracker: tracker.clone(),
                draining: engine.draining(),
                broker,
                stall_timeout,
                prometheus: prometheus.clone(),
                token: admin_config.token,
            };
            let stop = background.clone();
            tasks.spawn(async move {
                if let Err(error) = admin::serve(listener, state, async move { stop.cancelled().await }).await {
                    warn!(%error, "admin server stopped");
                }
            });
            info!(admin = %local, "admin API listening (/healthz /readyz /metrics /v1/…)");
        }
        tasks.spawn(tasks::store_gauges(store.clone(), background.clone()));
        tasks.spawn(tasks::stall_watch(tracker, stall_timeout, background.clone()));
        if let Some(prometheus) = prometheus {
            tasks.spawn(tasks::metrics_upkeep(prometheus, background.clone()));
        }
        tasks.spawn(tasks::retention(store.clone(), gc_interval, background.clone()));
        tasks.spawn(tasks::packing(store.clone(), background.clone()));
        tasks.spawn(tasks::log_summary(exec.clone(), summary_interval, background.clone()));
        if let Some(setup) = restore {
            tasks.spawn(engine.restore_task(setup, token.clone()));
        }
        tasks.spawn(engine.release_task(token.clone()));
        info!(topics = %subscriptions.join(","), store = %store.path().display(), max_in_flight, "outboxd running");
        for warning in exec.config.route_warnings() {
            warn!("{warning}");
        }

        let run = engine.run(&token);
        tokio::pin!(run);
        let failure = tokio::select! {
            failure = &mut run => failure,
            () = &mut shutdown => {
                token.cancel();
                run.await
            }
        };

        background.cancel();
        stopped(failure, tasks, &store, &exec.counters).await
    }
}

/// The store, opened for the service.
fn open_store(config: &Config) -> Result<Arc<Store>, Error> {
    let store = Store::open(&config.store.path, &StoreOptions::from(&config.store)).map_err(|e| {
        Error::new(ErrorKind::Store, format!("opening the store at {}", config.store.path.display()), e)
    })?;
    store.set_message_quota(config.store.max_message_copy_bytes);
    let store = Arc::new(store);
    store.index_problems();
    Ok(store)
}

/// With `[store.changelog]`: the changelog topics of the source topics that exist
/// now are created or checked (a partition-count mismatch stops the start-up;
/// brokers that cannot be reached now are asked again on assignment), and final
/// records go to them from now on. Returns what the restore task needs, and what
/// the brokers said (`None`: they could not be asked, or the topics not created).
async fn changelog(config: &Config, store: &Arc<Store>) -> Result<(Option<RestoreSetup>, Option<Plan>), Error> {
    let Some(changelog) = config.store.changelog.clone() else { return Ok((None, None)) };
    let (c, cl) = (config.clone(), changelog.clone());
    let plan = match tokio::task::spawn_blocking(move || kafka::changelog::plan(&c, &cl, CHANGELOG_LOOKUP_TIMEOUT))
        .await
        .map_err(|e| Error::new(ErrorKind::Internal, "asking the brokers for the changelog topics", e))?
    {
        Ok(plan) => match kafka::changelog::ensure(&config.kafka, &changelog, config.store.retention, &plan).await {
            Ok(()) => Some(plan),
            Err(kafka::changelog::TopicError::Mismatch(reason)) => {
                return Err(Error::plain(ErrorKind::Config, format!("{reason}\n(nothing was handled)")));
            }
            Err(error) => {
                warn!(%error, "changelog topics not checked at start-up; they are checked on assignment");
                None
            }
        },
        Err(error) => {
            warn!(error = %format!("{error:#}"), "brokers not reachable at start-up; changelog topics are checked on assignment");
            None
        }
    };
    let producer = kafka::changelog::ChangelogProducer::build(&config.kafka, &changelog)
        .map_err(|e| Error::new(ErrorKind::Kafka, "creating the changelog producer", e))?;
    store.attach_changelog(Arc::new(producer));
    warn_unsigned(&changelog);
    info!(changelog_topics = %changelog.topic_template, "final records go to changelog topics; assigned partitions are restored first");
    let checked = plan.iter().flat_map(|p| p.existing.iter().chain(&p.create)).map(|(source, ..)| source.clone()).collect();
    let setup = RestoreSetup { kafka: config.kafka.clone(), changelog, retention: config.store.retention, checked };
    Ok((Some(setup), plan))
}

/// Without `store.changelog.key`, says once who can then steer side effects; with
/// `accept_unsigned`, that the door is still open.
fn warn_unsigned(changelog: &ChangelogConfig) {
    match &changelog.keys {
        None => warn!(
            changelog_topics = %changelog.topic_template,
            "store.changelog.key is not set: changelog records are neither signed nor checked, so anyone who can \
             write to the changelog topics can make events count as handled (they never run) or run handled events \
             again; set a key and restrict the topics with Kafka ACLs (docs/security.md, \"The changelog topics\")"
        ),
        Some(keys) if keys.accept_unsigned => warn!(
            changelog_topics = %changelog.topic_template,
            "store.changelog.accept_unsigned is on: changelog records without a MAC are still applied, so whoever can \
             write to the changelog topics can still steer side effects; turn it off once no unsigned record \
             remains (docs/security.md, \"The changelog topics\")"
        ),
        Some(_) => {}
    }
}

/// The copy into the changelog before joining failed: the store's fault, or the brokers'.
fn copy_failed(e: anyhow::Error) -> Error {
    let kind = if e.chain().any(|c| c.is::<crate::store::StoreError>()) { ErrorKind::Store } else { ErrorKind::Kafka };
    Error::new(kind, "copying the store's records into the changelog before joining the group", e)
}

/// After the drain: awaits the background tasks (told to stop), closes the
/// store, logs the summary, and says how the run ended.
async fn stopped(failure: Option<Fatal>, mut tasks: JoinSet<()>, store: &Store, c: &Counters) -> Result<(), Error> {
    while let Some(ended) = tasks.join_next().await {
        if let Err(error) = ended {
            warn!(%error, "a background task failed");
        }
    }
    let closed = store.close().await;
    info!(
        handled = c.handled.load(Ordering::Relaxed),
        duplicates_suppressed = c.duplicates.load(Ordering::Relaxed),
        dead = c.dead.load(Ordering::Relaxed),
        reexecuted = c.reexecuted.load(Ordering::Relaxed),
        "outboxd stopped"
    );
    let path = store.path().display();
    match (failure, closed) {
        // The first failure says why; the failed final flush would only repeat it.
        (Some(Fatal::Store(error)), _) => {
            Err(Error::new(ErrorKind::Store, format!("stopped because the store at {path} failed"), error))
        }
        (Some(reason), _) => {
            let kind = match reason {
                Fatal::Changelog(_) => ErrorKind::Config,
                Fatal::Restorer(_) | Fatal::Consumer(_) => ErrorKind::Kafka,
                Fatal::Panicked { .. } => ErrorKind::Internal,
                Fatal::Store(_) => ErrorKind::Store,
            };
            Err(Error::new(kind, "stopped", reason))
        }
        (None, Err(e)) => Err(Error::new(ErrorKind::Store, format!("flushing the store at {path}"), e)),
        (None, Ok(())) => Ok(()),
    }
}
