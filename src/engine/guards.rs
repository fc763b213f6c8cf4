//! Guards of one event's handling: the id held while it is worked on in this
//! process, and its in-memory claim, both let go however the handling ends.

use std::collections::hash_map::Entry;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use foldhash::fast::RandomState;
use foldhash::HashMap;
use tokio::sync::Semaphore;

use crate::store::Store;

/// Forgets an in-memory claim when its handling ends without its final record (a
/// store failure, an abandoned future, an event left to its partition's new owner).
/// An event recorded final had it forgotten with that record: [`Release::written`].
pub(super) struct Release<'a> {
    store: &'a Store,
    id: &'a str,
    scope: &'a str,
    armed: bool,
}

impl<'a> Release<'a> {
    pub(super) fn new(store: &'a Store, id: &'a str, scope: &'a str) -> Release<'a> {
        Release { store, id, scope, armed: true }
    }

    /// The event's final record is written: the store forgot its claim then.
    pub(super) fn written(mut self) {
        self.armed = false;
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store.handling().release(self.id, self.scope);
        }
    }
}

/// Event ids being worked on in this process, per dedup scope: a second delivery
/// of the same id (at another offset or key) waits for the first instead of running
/// twice; the routes of one event (each its own scope) run side by side.
///
/// Kept by a hash of the id, with a gate made only when a second delivery comes
/// (a semaphore that is never granted, only closed when the holder finishes), so
/// that holding an id allocates nothing. Two ids with the same 64-bit hash would
/// only make the second wait for the first. The hash is foldhash's, seeded per
/// process like the other maps of an event's path: ids come from messages, but
/// none can be chosen to collide with another.
#[derive(Default)]
pub(super) struct LiveIds {
    held: Mutex<HashMap<u64, Option<Arc<Semaphore>>>>,
    hasher: RandomState,
}

/// Releases the id when dropped; waiters then look at the store again.
pub(super) struct LiveGuard<'a> {
    live: &'a LiveIds,
    hash: u64,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        let gate = self.live.held.lock().expect("live ids lock").remove(&self.hash).flatten();
        if let Some(gate) = gate {
            gate.close();
        }
    }
}

pub(super) async fn live_guard<'a>(ids: &'a LiveIds, scope: &str, id: &str) -> LiveGuard<'a> {
    match live_guard_unless(ids, scope, id, || false).await {
        Some(guard) => guard,
        None => unreachable!("a wait that never gives up ended without the id"),
    }
}

/// [`live_guard`], except that it gives up (`None`) when `gives_up` says so while
/// the id is held: asked before each wait for the holder.
pub(super) async fn live_guard_unless<'a>(
    ids: &'a LiveIds,
    scope: &str,
    id: &str,
    gives_up: impl Fn() -> bool,
) -> Option<LiveGuard<'a>> {
    let hash = ids.hasher.hash_one((scope, id));
    loop {
        let busy = match ids.held.lock().expect("live ids lock").entry(hash) {
            Entry::Vacant(free) => {
                free.insert(None);
                return Some(LiveGuard { live: ids, hash });
            }
            Entry::Occupied(mut held) => held.get_mut().get_or_insert_with(|| Arc::new(Semaphore::new(0))).clone(),
        };
        if gives_up() {
            return None;
        }
        // Closed (never granted) when the holder finishes.
        let _ = busy.acquire().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_of_an_id_waits_for_the_first_and_other_ids_do_not() {
        let ids = LiveIds::default();
        let first = live_guard(&ids, "t", "e1").await;
        let _other = live_guard(&ids, "t", "e2").await;
        let _other_route = live_guard(&ids, "t#mailer", "e1").await;
        let mut second = Box::pin(live_guard(&ids, "t", "e1"));
        assert!(futures::poll!(second.as_mut()).is_pending(), "e1 is held");
        drop(first);
        let _second = second.await;
        assert_eq!(ids.held.lock().unwrap().len(), 3, "e1 (held again), e2, and e1 on the other route");
    }
}
