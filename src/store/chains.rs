//! Held chains (`on_dead = "hold"`), the ledger's side: every write of a record
//! goes through `Store::chained`, which keeps the chain index (`chain_index`, whose
//! docs say what a chain is) and the index of dead and parked records right; and
//! what the releaser and `store get` ask of chains.

use super::base::Store;
use std::collections::HashSet;

use super::chain_index::{split_tree_key, tree_key, ChainId, ChainInfo, Index, Member, Running};
use super::disk::record::{Record, State};
use super::error::StoreError;

impl Store {
    /// Writes the record under `key` as `new` (`None`: removes it) through `write`,
    /// keeping the chain index right: a tree entry for a member is added before
    /// the record is written, one it no longer has is removed after (module docs);
    /// and so the index of dead and parked records (`problems`).
    pub(super) fn chained<T>(
        &self,
        key: &[u8],
        new: Option<&Record>,
        write: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.problems.concerns(key, new) {
            // The index of dead and parked records, kept the same way (store/problems.rs).
            self.problems.before(key, new)?;
            let out = self.chains_kept(key, new, write)?;
            // An entry removed goes after its record's write in sled's log too.
            self.problems.after(key, new, || self.slices.journal())?;
            return Ok(out);
        }
        self.chains_kept(key, new, write)
    }

    /// [`Store::chained`] for the chain index alone.
    fn chains_kept<T>(
        &self,
        key: &[u8],
        new: Option<&Record>,
        write: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let joins = new.and_then(|r| ChainId::of(r).map(|c| (c, r.offset)));
        if joins.is_none() && !self.chains.any() {
            return write();
        }
        if let Some((chain, offset)) = &joins {
            self.chains.tree.insert(tree_key(chain, *offset, key), &[])?;
        }
        let out = write()?;
        if let Some(stale) = self.chains.update(key, new) {
            // After the record's write in sled's log, or an open could find the
            // record in the chain and the chain without it (store/disk/journal.rs).
            self.slices.journal()?;
            self.chains.tree.remove(stale)?;
        }
        Ok(out)
    }

    /// Reads the index from its tree at open, each entry checked against its
    /// record (an entry whose record is not a member there any more is dropped).
    pub(super) fn load_chains(&self) -> Result<(), StoreError> {
        let mut index = Index::default();
        let mut stale = Vec::new();
        for item in self.chains.tree.iter() {
            let (k, _) = item?;
            let entry = split_tree_key(&k);
            let record = match &entry {
                Some((_, _, record_key)) => self.record_under(record_key)?,
                None => None,
            };
            match (entry, record) {
                (Some((entry, offset, record_key)), Some(r))
                    if ChainId::of(&r).is_some_and(|c| c.same_key(&entry)) && r.offset == offset =>
                {
                    let chain = ChainId::of(&r).expect("checked above");
                    index.insert(&record_key, chain, offset, Member { id: r.event_id.to_string(), state: r.state });
                }
                _ => stale.push(k),
            }
        }
        for k in stale {
            self.chains.tree.remove(k)?;
        }
        self.chains.recount(&index);
        *self.chains.lock() = index;
        Ok(())
    }

    /// Sets the index to what a full scan found (`members`: each member's record
    /// key and record, oldest slice first). Returns whether it changed.
    pub(super) fn correct_chains(&self, members: &[(Vec<u8>, Record)]) -> Result<bool, StoreError> {
        let mut found = Index::default();
        for (key, r) in members {
            if let Some(chain) = ChainId::of(r) {
                found.remove(key);
                found.insert(key, chain, r.offset, Member { id: r.event_id.to_string(), state: r.state });
            }
        }
        let wanted: HashSet<Vec<u8>> =
            found.by_key.iter().map(|(key, (chain, offset))| tree_key(chain, *offset, key)).collect();
        let mut changed = false;
        for item in self.chains.tree.iter() {
            let (k, _) = item?;
            if !wanted.contains(k.as_ref()) {
                self.chains.tree.remove(k)?;
                changed = true;
            }
        }
        for k in &wanted {
            if self.chains.tree.insert(k, &[])?.is_none() {
                changed = true;
            }
        }
        self.chains.recount(&found);
        *self.chains.lock() = found;
        Ok(changed)
    }

    /// Drops from the index the members whose records are gone (retention dropped their slice).
    pub(super) fn prune_chains(&self) -> Result<(), StoreError> {
        let keys: Vec<Vec<u8>> = self.chains.lock().by_key.keys().cloned().collect();
        for key in keys {
            if self.record_under(&key)?.is_none() {
                if let Some(stale) = self.chains.update(&key, None) {
                    self.chains.tree.remove(stale)?;
                }
            }
        }
        Ok(())
    }

    /// The record stored under a record key, newest slice first.
    pub(super) fn record_under(&self, record_key: &[u8]) -> Result<Option<Record>, StoreError> {
        match self.slices.newest_with(record_key)? {
            Some((slice, raw)) => self.decode(&slice, record_key, &raw).map(Some),
            None => Ok(None),
        }
    }

    /// The chain of `r` as `store get` shows it, with at most `shown` held ids.
    pub(super) fn chain_view(&self, r: &Record, shown: usize) -> Option<ChainInfo> {
        let chain = ChainId::of(r)?;
        let index = self.chains.lock();
        let members = index.chains.get(&chain)?;
        let held: Vec<&Member> = members.values().filter(|m| m.state == State::Held).collect();
        Some(ChainInfo {
            head: self.chains.head(&index, &chain),
            held: held.iter().take(shown).map(|m| m.id.clone()).collect(),
            held_total: held.len() as u64,
            chain,
        })
    }

    /// Marks a held member as run by the releaser until the guard is dropped.
    pub(super) fn run_held(&self, record_key: &[u8]) -> Running<'_> {
        self.chains.lock().running.insert(record_key.to_vec());
        Running { chains: &self.chains, key: record_key.to_vec() }
    }
}

#[cfg(test)]
#[path = "chains_tests.rs"]
mod tests;
