//! The dead and parked records, the ledger's side: loading the index at the open,
//! its first build for a store written before it, and the lists it answers. The
//! index itself: `problem_index`.

use super::base::Store;
use super::disk::record::State;
use super::error::StoreError;
use super::problem_index::{is_problem, reason_group, GroupCount, GroupKey, BUILT_KEY};

/// How often the first build says how far it is.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Store {
    /// Reads the index into memory at the open, dropping entries whose record left
    /// (a crash between the two writes). A store that holds no record has every
    /// problem indexed (none).
    pub(super) fn load_problems(&self) -> Result<(), StoreError> {
        if !self.problems.ready() && self.slices.all().iter().all(|s| s.is_empty()) {
            self.meta.insert(BUILT_KEY, &[])?;
            self.problems.set_ready();
        }
        let mut stale = Vec::new();
        for item in self.problems.tree.iter() {
            let (key, _) = item?;
            match self.record_under(&key)? {
                Some(r) if is_problem(&r) => self.problems.found(&key, &r),
                _ => stale.push(key),
            }
        }
        for key in stale {
            self.problems.tree.remove(key)?;
        }
        Ok(())
    }

    /// A store written before the index gets it built once, in a thread of its own,
    /// while events run: every record is read, and the dead and parked ones indexed.
    /// Until it ends, the lists of dead or parked events read records (within their
    /// budget) and the console's dead groups say they are being counted.
    pub(crate) fn index_problems(self: &std::sync::Arc<Self>) {
        if self.problems.ready() {
            return;
        }
        let store = std::sync::Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("outboxd-problems".into()).spawn(move || {
            if let Err(error) = build(&store) {
                tracing::warn!(%error, "could not index the dead and parked records; the console counts them by reading records");
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start the thread that indexes the dead and parked records");
        }
    }

    /// After slices were dropped (gc): the members whose record went with them leave
    /// the index (a read of the index, not of the records that stay).
    pub(super) fn prune_problems(&self) -> Result<(), StoreError> {
        let mut gone = Vec::new();
        for item in self.problems.tree.iter() {
            let (key, _) = item?;
            if self.record_under(&key)?.is_none() {
                gone.push(key);
            }
        }
        for key in gone {
            self.problems.after(&key, None, || Ok(()))?;
        }
        Ok(())
    }

    /// The dead and parked records counted by state, topic and reason group, once the
    /// index holds them all.
    pub(super) fn problem_groups(&self) -> Option<Vec<(GroupKey, GroupCount)>> {
        self.problems.ready().then(|| self.problems.groups())
    }

    /// Ids of the records of one group (`reason`: a [`reason_group`]), in id order,
    /// once the index holds them all.
    pub(super) fn problem_ids(
        &self,
        state: State,
        topic: &str,
        reason: &str,
    ) -> Result<Option<Vec<String>>, StoreError> {
        if !self.problems.ready() {
            return Ok(None);
        }
        let mut ids = Vec::new();
        for item in self.problems.tree.iter() {
            let (key, _) = item?;
            if let Some(r) = self.record_under(&key)? {
                if r.state == state && *r.topic == *topic && reason_group(r.reason.as_deref().unwrap_or("")) == reason {
                    ids.push(r.event_id.to_string());
                }
            }
        }
        Ok(Some(ids))
    }
}

/// The first build of a store's index (see [`Store::index_problems`]).
fn build(store: &std::sync::Weak<Store>) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let mut said = started;
    let (mut read, mut found) = (0u64, 0u64);
    let mut after: Option<Vec<u8>> = None;
    loop {
        // A chunk at a time, so that a store closed meanwhile is let go.
        let Some(store) = store.upgrade() else { return Ok(()) };
        let start = after.clone().map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let mut chunk = 0;
        for item in store.merged(start)? {
            let (key, raw, slice) = item?;
            let r = store.decode(&slice, &key, &raw)?;
            read += 1;
            chunk += 1;
            after = Some(key.to_vec());
            if is_problem(&r) {
                // Read again under the index's lock: a write since (which then fixes
                // the index after itself) or none, never half of one.
                let mut inner = store.problems.lock();
                if let Some(now) = store.record_under(&key)?.filter(is_problem) {
                    store.problems.tree.insert(&key, &[])?;
                    inner.join(&key, &now);
                    found += 1;
                }
            }
            if chunk == 10_000 {
                break;
            }
        }
        if said.elapsed() >= PROGRESS_EVERY {
            tracing::info!(read, total = store.len(), dead_or_parked = found, "indexing the dead and parked records");
            said = std::time::Instant::now();
        }
        if chunk < 10_000 {
            store.meta.insert(BUILT_KEY, &[])?;
            store.problems.set_ready();
            tracing::info!(
                read,
                dead_or_parked = found,
                seconds = started.elapsed().as_secs_f64(),
                "the dead and parked records are indexed"
            );
            return Ok(());
        }
    }
}

