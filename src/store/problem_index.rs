//! The dead and parked records ("problems"), indexed and counted as records change,
//! so that the console's dead groups and the lists of dead or parked events cost
//! what there is of them, never a read of every record.
//!
//! The `problems` tree holds one entry per dead or parked record: its record key →
//! nothing. Like the chain index, an entry is added before the record is written and
//! removed after it changed (`Store::chained`), so after a crash the tree holds every
//! problem, perhaps with a record that since left (readers check each entry against
//! its record). In memory: the members (record key → its group), and per group
//! (state, topic, reason group) how many there are and the oldest and newest last
//! write among them; `first` and `last` are not moved back when members leave, so
//! they may be older and newer than what is left until the next start.
//!
//! A store written before the tree has none: the first open reads every record once
//! in a thread of its own, logging its progress; until it is done, `ready` is false
//! and the callers fall back to bounded scans.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::disk::record::{Record, State};
use super::error::StoreError;

/// The tree's name.
pub(in crate::store) const TREE: &str = "problems";
/// Meta key: the tree holds every problem of the store (set once the first build ends).
pub(in crate::store) const BUILT_KEY: &[u8] = b"problems_indexed";

/// A group of problems: the state, the topic and the reason's group ([`reason_group`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub state: State,
    pub topic: String,
    pub reason: String,
}

/// How many problems a group has, and the oldest and newest last write among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCount {
    pub count: u64,
    pub first_us: i64,
    pub last_us: i64,
}

/// Whether a record is a problem (and so in the index).
pub(in crate::store) fn is_problem(r: &Record) -> bool {
    is_problem_state(r.state)
}

/// Whether a record in `state` is a problem.
pub(in crate::store) fn is_problem_state(state: State) -> bool {
    matches!(state, State::Dead | State::Parked)
}

/// The index: the tree, and in memory who is in which group.
pub(in crate::store) struct Problems {
    pub(in crate::store) tree: sled::Tree,
    pub(in crate::store) inner: Mutex<Inner>,
    /// The tree and the counts hold every problem (after the first build of a store
    /// written before the index).
    pub(in crate::store) ready: AtomicBool,
}

#[derive(Default)]
pub(in crate::store) struct Inner {
    /// Record key → the index of its group in `keys`.
    pub(in crate::store) members: HashMap<Vec<u8>, usize>,
    /// Every group seen, by index (never removed: their number is what reasons differ in).
    pub(in crate::store) keys: Vec<GroupKey>,
    pub(in crate::store) by_key: HashMap<GroupKey, usize>,
    pub(in crate::store) counts: Vec<GroupCount>,
}

impl Inner {
    pub(in crate::store) fn group(&mut self, key: GroupKey) -> usize {
        if let Some(&g) = self.by_key.get(&key) {
            return g;
        }
        self.keys.push(key.clone());
        self.counts.push(GroupCount { count: 0, first_us: i64::MAX, last_us: i64::MIN });
        self.by_key.insert(key, self.keys.len() - 1);
        self.keys.len() - 1
    }

    pub(in crate::store) fn join(&mut self, record_key: &[u8], r: &Record) {
        let g = self.group(GroupKey {
            state: r.state,
            topic: r.topic.to_string(),
            reason: reason_group(r.reason.as_deref().unwrap_or("")),
        });
        if let Some(old) = self.members.insert(record_key.to_vec(), g) {
            self.counts[old].count = self.counts[old].count.saturating_sub(1);
        }
        let c = &mut self.counts[g];
        c.count += 1;
        c.first_us = c.first_us.min(r.updated_at_us);
        c.last_us = c.last_us.max(r.updated_at_us);
    }

    pub(in crate::store) fn leave(&mut self, record_key: &[u8]) -> bool {
        match self.members.remove(record_key) {
            Some(g) => {
                self.counts[g].count = self.counts[g].count.saturating_sub(1);
                true
            }
            None => false,
        }
    }
}

impl Problems {
    /// The index of `db`; not ready when the store was written before it.
    pub(in crate::store) fn open(db: &sled::Db, meta: &sled::Tree) -> Result<Problems, StoreError> {
        // A new store is marked built at the load, once it is seen to hold no record.
        let built = meta.get(BUILT_KEY)?.is_some();
        Ok(Problems { tree: db.open_tree(TREE)?, inner: Mutex::default(), ready: AtomicBool::new(built) })
    }

    pub(in crate::store) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic under this lock leaves at worst a count off by one.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the index holds every problem.
    pub(in crate::store) fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub(in crate::store) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Whether a write of `new` under `record_key` concerns the index: the record
    /// becomes a problem, or was one. Cheap: the hot path asks it of every write.
    pub(in crate::store) fn concerns(&self, record_key: &[u8], new: Option<&Record>) -> bool {
        // While the first build runs, every write fixes the index after itself (see `build`).
        !self.ready() || new.is_some_and(is_problem) || self.lock().members.contains_key(record_key)
    }

    /// Before the write of a problem: its entry.
    pub(in crate::store) fn before(&self, record_key: &[u8], new: Option<&Record>) -> Result<(), StoreError> {
        if new.is_some_and(is_problem) {
            self.tree.insert(record_key, &[])?;
        }
        Ok(())
    }

    /// After the write: the member moved to its new group, or left (its entry
    /// removed, once `journal` put the record's write into sled's log before it).
    pub(in crate::store) fn after(
        &self,
        record_key: &[u8],
        new: Option<&Record>,
        journal: impl FnOnce() -> Result<(), sled::Error>,
    ) -> Result<(), StoreError> {
        let left = {
            let mut inner = self.lock();
            match new.filter(|r| is_problem(r)) {
                Some(r) => {
                    inner.join(record_key, r);
                    false
                }
                None => inner.leave(record_key),
            }
        };
        if left {
            journal()?;
            self.tree.remove(record_key)?;
        }
        Ok(())
    }

    /// A member found at the open (or by the first build).
    pub(in crate::store) fn found(&self, record_key: &[u8], r: &Record) {
        self.lock().join(record_key, r);
    }

    /// The groups with at least one member, and their counts.
    pub(in crate::store) fn groups(&self) -> Vec<(GroupKey, GroupCount)> {
        let inner = self.lock();
        inner.keys.iter().cloned().zip(inner.counts.iter().copied()).filter(|(_, c)| c.count > 0).collect()
    }

    /// Members in the index now.
    #[cfg(test)]
    pub(in crate::store) fn len(&self) -> usize {
        self.lock().members.len()
    }
}

/// A reason with what differs between events of one cause taken out: how long it
/// took (`23.28ms`) and how many attempts it made, so that events that failed the
/// same way fall into one group. Statuses, error codes and texts stay.
pub fn reason_group(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut rest = reason;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        let digits = from.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(from.len());
        let after = &from[digits..];
        let unit = ["ns", "µs", "us", "ms", "s", "m", "h"]
            .iter()
            .find(|u| after.starts_with(**u) && !after[u.len()..].starts_with(|c: char| c.is_alphanumeric()));
        let starts_word = before.chars().next_back().is_none_or(|c| !c.is_alphanumeric());
        match unit {
            Some(u) if starts_word => {
                out.push('…');
                rest = &after[u.len()..];
            }
            _ if starts_word && before.ends_with("after ") && after.starts_with(" attempt") => {
                out.push('…');
                rest = after;
            }
            _ => {
                out.push_str(&from[..digits]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The groups sorted for showing: the largest first (where a fix pays most).
pub fn largest_first(mut groups: Vec<(GroupKey, GroupCount)>) -> Vec<(GroupKey, GroupCount)> {
    groups.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(&b.0)));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_group_drops_timings_and_attempt_counts_and_keeps_statuses() {
        let a = "gave up after 2 attempts in 23.284993ms: could not connect: tcp connect error (os error 111)";
        let b = "gave up after 5 attempts in 1.5s: could not connect: tcp connect error (os error 111)";
        assert_eq!(reason_group(a), reason_group(b));
        assert_eq!(
            reason_group(a),
            "gave up after … attempts in …: could not connect: tcp connect error (os error 111)"
        );
        assert_ne!(reason_group("http 500 Internal"), reason_group("http 503 Unavailable"));
        assert_eq!(reason_group("order v2 is 10s late"), "order v2 is … late");
        assert_eq!(reason_group(""), "");
    }
}
