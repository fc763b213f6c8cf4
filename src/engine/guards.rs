//! Guards of one event's handling: the id held while it is worked on in this
//! process, and its in-memory claim, both let go however the handling ends.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::executor::Executor;
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
        self.store.release(self.id, self.scope);
    }
}

/// Releases the id when dropped; waiters then look at the store again.
pub(super) struct LiveGuard<'a> {
    exec: &'a Executor,
    id: String,
    gate: Arc<Semaphore>,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.exec.live.lock().expect("live ids lock").remove(&self.id);
        self.gate.close();
    }
}

pub(super) async fn live_guard<'a>(exec: &'a Executor, id: &str) -> LiveGuard<'a> {
    loop {
        let busy = {
            let mut live = exec.live.lock().expect("live ids lock");
            match live.get(id) {
                Some(gate) => gate.clone(),
                None => {
                    let gate = Arc::new(Semaphore::new(0));
                    live.insert(id.to_owned(), gate.clone());
                    return LiveGuard { exec, id: id.to_owned(), gate };
                }
            }
        };
        // Closed (never granted) when the holder finishes.
        let _ = busy.acquire().await;
    }
}
