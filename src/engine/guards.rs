//! Guards of one event's handling: the id held while it is worked on in this
//! process, and its in-memory claim, both let go however the handling ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::store::Store;

/// Forgets an in-memory claim however its handling ends (normally the final
/// record did already; a store failure or an abandoned future leaves it here).
pub(super) struct Release<'a> {
    pub(super) store: &'a Store,
    pub(super) id: &'a str,
    pub(super) scope: &'a str,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.store.handling().release(self.id, self.scope);
    }
}

/// Event ids being worked on in this process: a second delivery of the same id
/// (at another offset or key) waits for the first instead of running twice.
/// Each id's gate is a semaphore that is never granted, only closed when its
/// holder finishes.
#[derive(Default)]
pub(super) struct LiveIds(Mutex<HashMap<String, Arc<Semaphore>>>);

/// Releases the id when dropped; waiters then look at the store again.
pub(super) struct LiveGuard<'a> {
    live: &'a LiveIds,
    id: String,
    gate: Arc<Semaphore>,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.live.0.lock().expect("live ids lock").remove(&self.id);
        self.gate.close();
    }
}

pub(super) async fn live_guard<'a>(ids: &'a LiveIds, id: &str) -> LiveGuard<'a> {
    loop {
        let busy = {
            let mut live = ids.0.lock().expect("live ids lock");
            match live.get(id) {
                Some(gate) => gate.clone(),
                None => {
                    let gate = Arc::new(Semaphore::new(0));
                    live.insert(id.to_owned(), gate.clone());
                    return LiveGuard { live: ids, id: id.to_owned(), gate };
                }
            }
        };
        // Closed (never granted) when the holder finishes.
        let _ = busy.acquire().await;
    }
}
