//! In-memory claims: events being handled under `on_uncertain = retry`, whose
//! claim is never written (docs/architecture.md §2, invariant 1). Kept so that the
//! running service still shows them (`store get`, the `claimed` count); bounded
//! by the events in flight, since each is removed with its final record.

use std::sync::Mutex;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::disk::record::Record;

/// The claims of ids with one hash: almost always one claim of one id.
type Claimed = SmallVec<[(Record, bool); 1]>;

#[derive(Default)]
pub struct Claims {
    /// By the hash of the event id (ids of one hash share a list; each claim names its
    /// id), then dedup scope (an id is rarely in flight in two scopes). Keyed by the
    /// hash, not a copy of the id, and listed inline: an event's claim costs the copy
    /// of its record and nothing more. `true`: a record of the event is stored too (as
    /// `claimed`: reopened by `store retry`, or left by a run with a durable claim), so
    /// the stored counts include it already.
    by_id: Mutex<FxHashMap<u64, Claimed>>,
}

/// The store's one hash of a key, over the id.
fn id_hash(id: &str) -> u64 {
    super::disk::filter::hash(id.as_bytes())
}

/// Whether a claim is `id`'s in `scope`.
fn is(c: &Record, id: &str, scope: &str) -> bool {
    *c.event_id == *id && c.scope.as_deref().unwrap_or_default() == scope
}

impl Claims {
    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, Claimed>> {
        self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds or replaces the claim of `r.event_id` in `scope`.
    pub fn insert(&self, scope: &str, r: &Record, stored: bool) {
        let mut map = self.lock();
        let list = map.entry(id_hash(&r.event_id)).or_default();
        list.retain(|(c, _)| !is(c, &r.event_id, scope));
        list.push((r.clone(), stored));
    }

    pub fn remove(&self, id: &str, scope: &str) {
        let mut map = self.lock();
        let hash = id_hash(id);
        if let Some(list) = map.get_mut(&hash) {
            list.retain(|(c, _)| !is(c, id, scope));
            if list.is_empty() {
                map.remove(&hash);
            }
        }
    }

    /// The claim of `id` in any scope (the first).
    pub fn get(&self, id: &str) -> Option<Record> {
        self.lock().get(&id_hash(id)).and_then(|l| l.iter().find(|(r, _)| *r.event_id == *id).map(|(r, _)| r.clone()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::disk::record::State;
    use crate::event::Position;

    fn claim(id: &str, scope: &str) -> Record {
        let position = Position { topic: "t".into(), partition: 0, offset: 1 };
        Record { scope: Some(scope.into()), ..Record::first_seen(id, State::Claimed, 1, &position, 1) }
    }

    /// One id in two scopes, and ids whose hashes collide (forced through one
    /// list), are each found, replaced and removed on their own.
    #[test]
    fn claims_are_kept_per_id_and_scope_even_in_one_list() {
        let claims = Claims::default();
        claims.insert("t", &claim("a", "t"), false);
        claims.insert("t#mail", &claim("a", "t#mail"), true);
        claims.lock().entry(id_hash("b")).or_default().push((claim("b", "t"), false));
        let colliding = claim("c", "t");
        claims.lock().get_mut(&id_hash("b")).unwrap().push((colliding, false));
        assert_eq!(claims.unstored(), 3, "a in t, b, c (a in t#mail is stored)");
        claims.insert("t", &Record { attempts: 2, ..claim("a", "t") }, false);
        assert_eq!(claims.unstored(), 3, "replaced, not added");
        let a_in_t = claims.unstored_records().into_iter().find(|r| &*r.event_id == "a").map(|r| r.attempts);
        assert_eq!(a_in_t, Some(2));
        claims.remove("a", "t");
        assert_eq!(claims.get("a").and_then(|r| r.scope), Some("t#mail".into()), "the other scope stays");
        // "c" sits in "b"'s list: only a lookup by its own id finds it.
        assert!(claims.get("c").is_none(), "looked up under its own hash, not b's");
        claims.remove("b", "t");
        assert_eq!(claims.unstored(), 1, "c stays in the list b left");
        claims.remove("a", "t#mail");
        assert_eq!(claims.unstored_records().iter().map(|r| &*r.event_id).collect::<Vec<_>>(), ["c"]);
    }
}
