//! Repairs made by `outboxd store` on a stopped service's store go to the
//! changelog too, through the producer the service uses: otherwise the instance
//! that owns the partition, or its next owner, would never see them.

use std::sync::Arc;
use std::time::Duration;

use super::OpsError;
use crate::config::{ChangelogConfig, KafkaConfig, RawConfig};
use crate::kafka::changelog::ChangelogProducer;
use crate::store::changelog::{Entry, SendError, SendFuture, Sink};
use crate::store::{Store, StoreError};

/// The service's changelog producer, with a deadline: a command must end when
/// the brokers do not answer, where the service waits for them.
struct Bounded {
    producer: ChangelogProducer,
    /// `store.changelog.delivery_timeout`: how long one entry may wait for its acknowledgement.
    within: Duration,
}

impl Sink for Bounded {
    fn send(&self, entry: Entry) -> SendFuture {
        let (sent, within) = (self.producer.send(entry), self.within);
        Box::pin(
            async move { tokio::time::timeout(within, sent).await.unwrap_or(Err(SendError::Unanswered { within })) },
        )
    }
}

/// Attaches the changelog of `kafka` and `changelog` to `store`, so repairs made
/// through it are written there first (see `Store::settle_entry`), each entry
/// waiting `store.changelog.delivery_timeout` at most (`outboxd store publish`
/// copies through it too).
pub fn attach(store: &Store, kafka: &KafkaConfig, changelog: &ChangelogConfig) -> Result<(), OpsError> {
    let producer =
        ChangelogProducer::build(kafka, changelog).map_err(OpsError::config("creating the changelog producer"))?;
    store.attach_changelog(Arc::new(Bounded { producer, within: changelog.delivery_timeout }));
    Ok(())
}

/// Attaches the changelog that the config file at `config` names, unless
/// `[store.changelog]` is off there.
pub(super) fn attach_from(store: &Store, config: &std::path::Path) -> Result<(), OpsError> {
    let text = std::fs::read_to_string(config).map_err(OpsError::config(format!("reading {}", config.display())))?;
    let invalid = format!("invalid config {}", config.display());
    let raw: RawConfig = toml::from_str(&text).map_err(OpsError::config(invalid.clone()))?;
    let (kafka, store_config) =
        raw.kafka_and_store(&|name| std::env::var(name).ok()).map_err(OpsError::config(invalid))?;
    match &store_config.changelog {
        Some(changelog) => attach(store, &kafka, changelog),
        None => Ok(()),
    }
}

/// Says what a repair that failed left behind.
pub(super) fn explain(id: &str, error: StoreError) -> OpsError {
    match error {
        StoreError::Changelog(_) => OpsError::NothingChanged { id: id.to_owned(), error },
        other => other.into(),
    }
}
