//! In-memory claims: events being handled under `on_uncertain = retry`, whose
//! claim is never written (docs/architecture.md §2, invariant 1). Kept so that the
//! running service still shows them (`store get`, the `claimed` count); bounded
//! by the events in flight, since each is removed with its final record.

use std::collections::HashMap;
use std::sync::Mutex;

use super::disk::record::Record;

#[derive(Default)]
pub struct Claims {
    /// By event id, then dedup scope (an id is rarely in flight in two scopes);
    /// `true`: a record of the event is stored too (as `claimed`: reopened by
    /// `store retry`, or left by a run with a durable claim), so the stored counts
    /// include it already.
    pub(in crate::store) by_id: Mutex<HashMap<String, Vec<(Record, bool)>>>,
}

impl Claims {
    pub(in crate::store) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(Record, bool)>>> {
        self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds or replaces the claim of `r.event_id` in `scope`.
    pub fn insert(&self, scope: &str, r: &Record, stored: bool) {
        let mut map = self.lock();
        let list = map.entry(r.event_id.clone()).or_default();
        list.retain(|(c, _)| c.scope.as_deref().unwrap_or_default() != scope);
        list.push((r.clone(), stored));
    }

    pub fn remove(&self, id: &str, scope: &str) {
        let mut map = self.lock();
        if let Some(list) = map.get_mut(id) {
            list.retain(|(c, _)| c.scope.as_deref().unwrap_or_default() != scope);
            if list.is_empty() {
                map.remove(id);
            }
        }
    }

    /// The claim of `id` in any scope (the first).
    pub fn get(&self, id: &str) -> Option<Record> {
        self.lock().get(id).and_then(|l| l.first().map(|(r, _)| r.clone()))
    }

    /// The claims of events with no stored record (what listings lack).
    pub fn unstored_records(&self) -> Vec<Record> {
        self.lock().values().flatten().filter(|(_, stored)| !stored).map(|(r, _)| r.clone()).collect()
    }

    /// Claims of events with no stored record: what the stored `claimed` count lacks.
    pub fn unstored(&self) -> u64 {
        self.lock().values().flatten().filter(|(_, stored)| !stored).count() as u64
    }
}
