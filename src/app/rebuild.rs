//! `outboxd store rebuild`: reads every partition of every changelog topic into
//! the local store (from its checkpoints, so an empty or new store directory
//! gets everything), while no service holds the store. The service does the
//! same on its own for the partitions it is assigned; rebuilding first makes a
//! new or replaced store ready for any partition.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::{ChangelogConfig, Config};
use crate::engine::{restore_partition, Restored};
use crate::kafka::{self, Restorer};
use crate::offsets::PartitionId;
use crate::store::{Role, Store, StoreOptions};

/// How long the brokers may take to list their topics.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// One changelog partition read into the store.
#[derive(Debug, Clone)]
pub struct Rebuilt {
    /// The source partition.
    pub partition: PartitionId,
    /// The changelog topic it was read from.
    pub changelog_topic: String,
    /// What was read and applied.
    pub restored: Restored,
}

/// Reads every changelog partition of the source topics of `config` that exist
/// now into the store at `store.path`. Fails when the service holds the store, when
/// `[store.changelog]` is off, or when a changelog topic does not fit its source topic.
pub async fn rebuild(config: &Config) -> anyhow::Result<Vec<Rebuilt>> {
    let Some(changelog) = config.store.changelog.clone() else {
        anyhow::bail!("store rebuild reads the changelog topics, but [store.changelog] is off (enabled = false)");
    };
    let (c, cl) = (config.clone(), changelog.clone());
    let plan = tokio::task::spawn_blocking(move || kafka::changelog::plan(&c, &cl, LOOKUP_TIMEOUT))
        .await?
        .context("asking the brokers for the changelog topics")?;
    if !plan.mismatched.is_empty() {
        anyhow::bail!("{}", plan.mismatched.join("\n"));
    }
    let path = &config.store.path;
    let store = Arc::new(
        Store::open(path, &StoreOptions::command(&config.store, Role::Store))
            .with_context(|| format!("opening the store at {}", path.display()))?,
    );
    // A store rebuilt from nothing holds only what the changelog has: nothing to copy there at the next start.
    store.mark_complete_if_empty().await?;
    let restorer = Arc::new(
        Restorer::build(&config.kafka, changelog.restore_batch_bytes).context("creating the restore consumer")?,
    );
    let rebuilt = restore_all(&store, &restorer, &changelog, &plan.existing).await?;
    store.close().await.with_context(|| format!("flushing the store at {}", path.display()))?;
    Ok(rebuilt)
}

/// Reads every partition of the changelog topics of `topics` (source topic,
/// changelog topic, partitions) into the store, one after the other, each from its
/// checkpoint up to the end seen when its read began.
pub(super) async fn restore_all(
    store: &Arc<Store>,
    restorer: &Arc<Restorer>,
    changelog: &ChangelogConfig,
    topics: &[(String, String, i32)],
) -> anyhow::Result<Vec<Rebuilt>> {
    let mut rebuilt = Vec::new();
    for (source, changelog_topic, partitions) in topics {
        for p in 0..*partitions {
            let partition = PartitionId::new(source, p);
            let (store, restorer, changelog, runtime) =
                (store.clone(), restorer.clone(), changelog.clone(), tokio::runtime::Handle::current());
            let task = partition.clone();
            let restored = tokio::task::spawn_blocking(move || {
                restore_partition(&store, &restorer, &changelog, &task, &|| true, &|_, _| {}, &runtime)
            })
            .await?
            .with_context(|| format!("restoring {changelog_topic}/{p}"))?
            .unwrap_or_default();
            rebuilt.push(Rebuilt { partition, changelog_topic: changelog_topic.clone(), restored });
        }
    }
    Ok(rebuilt)
}
