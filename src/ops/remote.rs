//! The operations through a running service's admin API (`/v1`), for
//! `outboxd store …` while that service holds the store.

use super::client::AdminClient;
use super::{Actor, OpsError, Rerun, StoreApi};
use crate::store::State;
use crate::wire::{AuditPage, AuditView, GcView, RecordView, ReplayView, StatsView};

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

    async fn stats(&self) -> Result<StatsView, OpsError> {
        Ok(self.client.stats().await?)
    }

    async fn handlers(&self) -> Result<Option<Vec<crate::engine::CircuitView>>, OpsError> {
        Ok(Some(self.client.handlers().await?))
    }

    async fn get(&self, id: &str) -> Result<Option<RecordView>, OpsError> {
        Ok(self.client.get(id).await?)
    }

    async fn list(&self, state: Option<State>, topic: Option<&str>, limit: usize) -> Result<Vec<RecordView>, OpsError> {
        Ok(self.client.list(state.map(State::as_str), topic, limit).await?)
    }

    // The service audits a repair under the caller's credential: `actor` gives the reason only.
    async fn forget(&self, id: &str, actor: &Actor) -> Result<RecordView, OpsError> {
        self.client.forget(id, actor.reason.as_deref()).await?.ok_or_else(|| OpsError::NotFound(id.to_owned()))
    }

    async fn resolve_done(&self, id: &str, actor: &Actor) -> Result<(), OpsError> {
        let reason = actor.reason.as_deref();
        self.client.resolve(id, reason).await?.ok_or_else(|| OpsError::NotFound(id.to_owned()))?;
        Ok(())
    }

    async fn rerun(&self, id: &str, actor: &Actor) -> Result<Rerun, OpsError> {
        let reason = actor.reason.as_deref();
        let answer = self.client.retry(id, reason).await?.ok_or_else(|| OpsError::NotFound(id.to_owned()))?;
        Ok(Rerun::from(answer))
    }

    async fn replay(&self, record: &RecordView, new_key: Option<&str>, actor: &Actor) -> Result<ReplayView, OpsError> {
        let (id, scope) = (&record.event_id, super::scope_of(record));
        let answer = self.client.replay(id, scope, new_key, actor.reason.as_deref()).await?;
        answer.ok_or_else(|| OpsError::NotFound(id.clone()))
    }

    async fn replay_window(&self, window: &super::Window) -> Result<Vec<RecordView>, OpsError> {
        let mut taken = Vec::new();
        let mut after: Option<String> = None;
        loop {
            // The service's largest page (a larger limit gets that many anyway).
            let page = self.client.page(None, Some(&window.topic), after.take().as_deref(), 10_000).await?;
            taken.extend(page.records.into_iter().filter(|r| window.selects(r)));
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(taken),
            }
        }
    }

    async fn gc(&self, actor: &Actor) -> Result<GcView, OpsError> {
        Ok(self.client.gc(actor.reason.as_deref()).await?)
    }

    async fn audit(&self, before: Option<&str>, limit: usize) -> Result<AuditPage, OpsError> {
        Ok(self.client.audit(before, None, limit).await?)
    }

    async fn audit_of(&self, id: &str) -> Result<Vec<AuditView>, OpsError> {
        Ok(self.client.audit(None, Some(id), usize::MAX).await?.entries)
    }

    async fn export(
        &self,
        state: Option<State>,
        topic: Option<&str>,
        mut out: &mut dyn std::io::Write,
        progress: &indicatif::ProgressBar,
    ) -> Result<u64, OpsError> {
        let lines = self.client.export(state.map(State::as_str), topic, &mut out, progress).await?;
        progress.set_position(lines);
        Ok(lines)
    }
}
