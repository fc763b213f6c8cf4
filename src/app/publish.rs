//! The records a store has and its changelog lacks (written with `[store.changelog]
//! enabled = false`, or by a release without a changelog), copied into the
//! changelog before this instance handles anything: at start-up when the store is
//! not marked complete (`store::changelog::publish`), or ahead of time with `outboxd store
//! publish` while no service holds the store.
//!
//! Another instance may already write to these changelog topics (it owns some of
//! the partitions). A copy therefore never puts an older state over a newer one
//! that is there: it first reads every changelog partition into the store, from its
//! checkpoint (the same restore a new owner does: the changelog's word replaces the
//! local record, except that a final record is never turned back into a claim, and a
//! tombstone removes it), and only then sends what the store holds, which is now the
//! changelog's word wherever the changelog had one. The copy runs before this
//! instance joins its group, so it handles nothing meanwhile; a write another
//! instance makes to the very same event during the copy could still be followed by
//! the older state from the copy, which is why the upgrade path copies before a
//! second instance joins (README, "Running several instances").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tracing::info;

use super::rebuild::restore_all;
use crate::config::{ChangelogConfig, Config};
use crate::kafka::changelog::Plan;
use crate::kafka::{self, Restorer};
use crate::metrics::names;
use crate::store::changelog::publish::Published;
use crate::store::{Role, Store, StoreOptions};

/// How often a running copy says how far it is.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How long the brokers may take to list their topics.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// `outboxd store publish`: copies the records of the store at `store.path` that its
/// changelog may lack into the changelog topics (created if missing), while no
/// service holds the store. `report` is called every `PROGRESS_EVERY` (5 s). A store
/// marked complete is left as it is (`Ok(None)`), unless `force`.
pub async fn publish(
    config: &Config,
    force: bool,
    report: &mut (dyn FnMut(&Published) + Send),
) -> anyhow::Result<Option<Published>> {
    let Some(changelog) = config.store.changelog.clone() else {
        anyhow::bail!("store publish writes to the changelog topics, but [store.changelog] is off (enabled = false)");
    };
    let path = &config.store.path;
    let store = Arc::new(
        Store::open(path, &StoreOptions::command(&config.store, Role::Store))
            .with_context(|| format!("opening the store at {}", path.display()))?,
    );
    if !force && (store.changelog_complete() || store.mark_complete_if_empty().await?) {
        store.close().await?;
        return Ok(None);
    }
    let (c, cl) = (config.clone(), changelog.clone());
    let plan = tokio::task::spawn_blocking(move || kafka::changelog::plan(&c, &cl, LOOKUP_TIMEOUT))
        .await?
        .context("asking the brokers for the changelog topics")?;
    kafka::changelog::ensure(&config.kafka, &changelog, config.store.retention, &plan)
        .await
        .context("creating the changelog topics")?;
    crate::ops::attach_changelog(&store, &config.kafka, &changelog)?;
    let published = copy(config, &changelog, &store, &plan, report).await?;
    store.close().await.with_context(|| format!("flushing the store at {}", path.display()))?;
    Ok(Some(published))
}

/// At start-up, with the changelog attached: unless the store is marked complete
/// (or empty), its records are copied before anything is handled. `plan` is what
/// the brokers said at start-up (`None`: they could not be asked); the copy needs
/// them, so without them the start-up fails (nothing was handled) and the next one
/// tries again.
pub(super) async fn before_joining(
    config: &Config,
    changelog: &ChangelogConfig,
    store: &Arc<Store>,
    plan: Option<&Plan>,
) -> anyhow::Result<()> {
    if store.changelog_complete() || store.mark_complete_if_empty().await? {
        return Ok(());
    }
    let Some(plan) = plan else {
        anyhow::bail!(
            "the store has records its changelog topics may lack (it ran with [store.changelog] enabled = false, or \
             under an earlier release); they are copied there before anything is handled, which needs the brokers \
             and the changelog topics, and those could not be reached or created now (nothing was handled)"
        );
    };
    info!(
        records = store.reads().len(),
        "the store has records its changelog may lack; copying them before joining the group"
    );
    let mut log = |p: &Published| {
        info!(
            sent = p.sent,
            skipped = p.skipped,
            total = p.total,
            per_second = rate(p),
            resumed = p.resumed,
            "copying the store's records into the changelog"
        );
    };
    copy(config, changelog, store, plan, &mut log).await?;
    Ok(())
}

/// Reads every changelog partition of the source topics in `plan` into the store,
/// then copies the store's records into the changelog (`Store::publish`), logging
/// the end and calling `report` every [`PROGRESS_EVERY`].
async fn copy(
    config: &Config,
    changelog: &ChangelogConfig,
    store: &Arc<Store>,
    plan: &Plan,
    report: &mut (dyn FnMut(&Published) + Send),
) -> anyhow::Result<Published> {
    let all: Vec<(String, String, i32)> = plan.existing.iter().chain(&plan.create).cloned().collect();
    let topics: HashMap<String, i32> = all.iter().map(|(source, _, n)| (source.clone(), *n)).collect();
    let restorer = Arc::new(
        Restorer::build(&config.kafka, changelog.restore_batch_bytes).context("creating the restore consumer")?,
    );
    let read: u64 = restore_all(store, &restorer, changelog, &all).await?.iter().map(|r| r.restored.read).sum();
    info!(read, "changelog partitions read into the store before the copy");
    let wanted = |topic: &str, partition: i32| topics.get(topic).is_some_and(|n| (0..*n).contains(&partition));
    let mut last_report = Instant::now();
    let mut counted = 0;
    let mut progress = |p: &Published| {
        metrics::counter!(names::PUBLISHED).increment(p.sent - counted);
        counted = p.sent;
        if last_report.elapsed() >= PROGRESS_EVERY {
            last_report = Instant::now();
            report(p);
        }
    };
    let published = store
        .publish(changelog.publish_batch, &wanted, &mut progress)
        .await
        .context("copying the store's records into the changelog")?;
    metrics::counter!(names::PUBLISHED).increment(published.sent - counted);
    info!(
        sent = published.sent,
        skipped = published.skipped,
        seconds = published.elapsed.as_secs_f64(),
        per_second = rate(&published),
        resumed = published.resumed,
        "the store's records are in the changelog (marked complete)"
    );
    Ok(published)
}

/// Records sent per second so far.
pub fn rate(p: &Published) -> u64 {
    let seconds = p.elapsed.as_secs_f64();
    if seconds > 0.0 {
        (p.sent as f64 / seconds) as u64
    } else {
        0
    }
}
