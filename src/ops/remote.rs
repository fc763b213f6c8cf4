//! The operations through a running service's admin API (`/v1`), for
//! `outboxd store …` while that service holds the store.

use serde_json::Value;

use super::{Rerun, StoreApi};
use crate::admin::client::AdminClient;
use crate::store::State;

/// The store of a running service, through its admin API.
pub struct Remote {
    client: AdminClient,
}

impl Remote {
    /// Operations through `client`.
    pub fn new(client: AdminClient) -> Remote {
        Remote { client }
    }
}

impl StoreApi for Remote {
    fn source(&self) -> String {
        format!("store of the running service at {}", self.client.address())
    }

    fn known_len(&self) -> Option<u64> {
        None
    }

    async fn stats(&self) -> anyhow::Result<Value> {
        self.client.stats().await
    }

    async fn get(&self, id: &str) -> anyhow::Result<Option<Value>> {
        self.client.get(id).await
    }

    async fn list(&self, state: Option<State>, topic: Option<&str>, limit: usize) -> anyhow::Result<Vec<Value>> {
        self.client.list(state.map(State::as_str), topic, limit).await
    }

    async fn forget(&self, id: &str) -> anyhow::Result<Value> {
        self.client.repair("forget", id).await
    }

    async fn resolve_done(&self, id: &str) -> anyhow::Result<()> {
        self.client.repair("resolve", id).await?;
        Ok(())
    }

    async fn rerun(&self, id: &str) -> anyhow::Result<Rerun> {
        Ok(Rerun::from_json(self.client.repair("retry", id).await?))
    }

    async fn gc(&self) -> anyhow::Result<u64> {
        Ok(self.client.repair("gc", "").await?["removed"].as_u64().unwrap_or(0))
    }

    async fn export(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        mut out: &mut dyn std::io::Write,
        progress: &indicatif::ProgressBar,
    ) -> anyhow::Result<u64> {
        let lines = self.client.export(state.map(State::as_str), topic, &mut out, progress).await?;
        progress.set_position(lines);
        Ok(lines)
    }
}
