//! Held chains (`on_dead = "hold"`): the events of one Kafka key that wait behind
//! an earlier event of that key that went dead or parked (docs/architecture.md §4,
//! "Held chains").
//!
//! A chain is named by a [`ChainId`]: the source topic, partition and Kafka key,
//! the same key the engine's per-key chains use, and the route (a topic's later
//! routes have chains of their own: their records' scope names them, so a dead event
//! holds its key on its route only). Its *members* are the records
//! that carry the key in [`Record::chain`] and are not done ([`Record::in_chain`]):
//! - the **head**, the dead or parked event the chain waits for (or that event
//!   while a person runs it again: `claimed`);
//! - the **held** events behind it, each with its message copy, in offset order.
//!
//! A chain with no dead, parked or claimed member is *released*: its held events
//! run one at a time, lowest offset first (the engine's releaser, `engine::hold`,
//! on the instance that owns the partition). One that goes dead becomes the head
//! of the rest. Everything a chain is lives in its records, which are final
//! records like any other and go to the changelog with their copies, so a new
//! owner of the partition rebuilds the same chain from its restore.
//!
//! The index here is derived from the records and kept next to them:
//! - in memory, per chain its members by (offset, record key), and per record key
//!   where it is: the handling path asks whether a key is held without reading the
//!   store;
//! - in the sled tree `chains` (chain id ++ offset ++ record key → nothing), so an
//!   open finds the chains without scanning records. Every write of a record goes
//!   through `Store::chained`: an entry is added before the record is written and
//!   removed after, so after a crash the tree holds every member (and perhaps a
//!   record that is a member no more, which the open checks against the record and
//!   drops). `outboxd store stats` on a stopped store rebuilds it from its full scan.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::disk::record::{Record, State};
use super::disk::varint;
use super::error::StoreError;

const CHAINS_TREE: &str = "chains";

/// A Kafka key within its partition, on one route of its topic: the events whose
/// order a chain keeps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainId {
    /// The source topic.
    pub topic: String,
    /// The source partition.
    pub partition: i32,
    /// The message key, as Kafka has it.
    pub key: Vec<u8>,
    /// The route, for a topic's later routes (the name their scope ends with after
    /// `#`); `None` for its first route, and for messages that never decoded. A dead
    /// event holds the later events of its key on its own route only.
    pub route: Option<String>,
}

impl ChainId {
    /// The chain `r` is in, if it is in one.
    pub fn of(r: &Record) -> Option<ChainId> {
        let key = r.chain.clone().filter(|_| r.in_chain())?;
        let route = route_of(r.scope.as_deref());
        Some(ChainId { topic: r.topic.to_string(), partition: r.partition, key, route })
    }

    /// The same Kafka key on another route: what the tree's entries say (their
    /// record key says the route).
    pub(in crate::store) fn same_key(&self, other: &ChainId) -> bool {
        self.topic == other.topic && self.partition == other.partition && self.key == other.key
    }

    /// The key as text, for logs and views (lossy when it is not UTF-8).
    pub fn key_text(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }

    /// The tree's key prefix of this chain (prefix-free: lengths first).
    pub(in crate::store) fn prefix(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.topic.len() + self.key.len() + 8);
        varint::put_bytes(&mut k, self.topic.as_bytes());
        k.extend_from_slice(&self.partition.to_be_bytes());
        varint::put_bytes(&mut k, &self.key);
        k
    }

    fn from_prefix(mut k: &[u8]) -> Option<(ChainId, &[u8])> {
        let mut r = varint::Reader(k);
        let topic = String::from_utf8(r.bytes()?.to_vec()).ok()?;
        k = r.0;
        let partition = i32::from_be_bytes(k.get(..4)?.try_into().ok()?);
        let mut r = varint::Reader(&k[4..]);
        let key = r.bytes()?.to_vec();
        Some((ChainId { topic, partition, key, route: None }, r.0))
    }
}

/// The route a record's scope names ([`crate::wire::route_of_scope`]), owned.
pub(in crate::store) fn route_of(scope: Option<&str>) -> Option<String> {
    scope.and_then(crate::wire::route_of_scope).map(str::to_owned)
}

/// The tree key of a member: its chain's topic, partition and Kafka key, its offset
/// (order-preserving), its record key (whose scope says the route).
pub(in crate::store) fn tree_key(chain: &ChainId, offset: i64, record_key: &[u8]) -> Vec<u8> {
    let mut k = chain.prefix();
    k.extend_from_slice(&((offset as u64) ^ (1 << 63)).to_be_bytes());
    k.extend_from_slice(record_key);
    k
}

pub(in crate::store) fn split_tree_key(k: &[u8]) -> Option<(ChainId, i64, Vec<u8>)> {
    let (chain, rest) = ChainId::from_prefix(k)?;
    let offset = (u64::from_be_bytes(rest.get(..8)?.try_into().ok()?) ^ (1 << 63)) as i64;
    Some((chain, offset, rest[8..].to_vec()))
}

/// A member as the index keeps it.
#[derive(Debug, Clone)]
pub(in crate::store) struct Member {
    pub(in crate::store) id: String,
    pub(in crate::store) state: State,
}

/// Dead, parked or claimed: a member that keeps the chain from being released.
pub(in crate::store) fn blocks(state: State) -> bool {
    matches!(state, State::Dead | State::Parked | State::Claimed)
}

#[derive(Default)]
pub(in crate::store) struct Index {
    /// Members of each chain by (offset, record key): their order.
    pub(in crate::store) chains: HashMap<ChainId, BTreeMap<(i64, Vec<u8>), Member>>,
    /// Where each member's record key is.
    pub(in crate::store) by_key: HashMap<Vec<u8>, (ChainId, i64)>,
    /// Held members the releaser runs now (their claim is allowed: see `Store::claim_as`).
    pub(in crate::store) running: HashSet<Vec<u8>>,
}

impl Index {
    pub(in crate::store) fn remove(&mut self, record_key: &[u8]) -> Option<(ChainId, i64)> {
        let (chain, offset) = self.by_key.remove(record_key)?;
        if let Some(members) = self.chains.get_mut(&chain) {
            members.remove(&(offset, record_key.to_vec()));
            if members.is_empty() {
                self.chains.remove(&chain);
            }
        }
        Some((chain, offset))
    }

    pub(in crate::store) fn insert(&mut self, record_key: &[u8], chain: ChainId, offset: i64, member: Member) {
        self.chains.entry(chain.clone()).or_default().insert((offset, record_key.to_vec()), member);
        self.by_key.insert(record_key.to_vec(), (chain, offset));
    }
}

/// The index of held chains (see the module docs).
pub struct Chains {
    pub(in crate::store) tree: sled::Tree,
    pub(in crate::store) index: Mutex<Index>,
    /// Members in the index, read without the lock: 0 lets every write and every
    /// event of a handler with `on_dead = "hold"` pass without looking further.
    pub(in crate::store) members: AtomicUsize,
    /// Woken when a chain may have been released (the releaser looks then).
    pub(in crate::store) released: tokio::sync::Notify,
}

impl Chains {
    pub(in crate::store) fn open(db: &sled::Db) -> Result<Chains, StoreError> {
        Ok(Chains {
            tree: db.open_tree(CHAINS_TREE)?,
            index: Mutex::new(Index::default()),
            members: AtomicUsize::new(0),
            released: tokio::sync::Notify::new(),
        })
    }

    pub(in crate::store) fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(in crate::store) fn recount(&self, index: &Index) {
        self.members.store(index.by_key.len(), Ordering::Relaxed);
    }

    /// Whether any chain has a member (one atomic load: the handling path's test).
    pub(in crate::store) fn any(&self) -> bool {
        self.members.load(Ordering::Relaxed) > 0
    }

    /// Whether a new event of `chain` at `offset` waits: the chain has a member
    /// before it (a dead or parked head, or held events not run yet).
    pub(in crate::store) fn holds(&self, chain: &ChainId, offset: i64) -> bool {
        if !self.any() {
            return false;
        }
        let index = self.lock();
        index.chains.get(chain).and_then(|m| m.keys().next()).is_some_and(|(first, _)| *first < offset)
    }

    /// Whether `chain` has a dead, parked or claimed member (else it is released, or
    /// waits for its route's receiver).
    pub(in crate::store) fn blocked(&self, chain: &ChainId) -> bool {
        self.lock().chains.get(chain).is_some_and(|m| m.values().any(|m| blocks(m.state)))
    }

    /// Whether the releaser runs the held member under `record_key` now.
    pub(in crate::store) fn is_running(&self, record_key: &[u8]) -> bool {
        self.any() && self.lock().running.contains(record_key)
    }

    /// Updates the index once `record_key`'s record is written as `new` (`None`:
    /// removed). Returns whether the tree needs an entry removed (after the write).
    pub(in crate::store) fn update(&self, record_key: &[u8], new: Option<&Record>) -> Option<Vec<u8>> {
        let mut index = self.lock();
        let old = index.remove(record_key);
        let now = new.and_then(|r| ChainId::of(r).map(|c| (c, r)));
        let mut stale = None;
        if let Some((chain, offset)) = &old {
            if now.as_ref().is_none_or(|(c, r)| c != chain || r.offset != *offset) {
                stale = Some(tree_key(chain, *offset, record_key));
            }
        }
        // The releaser looks whenever a member stops blocking its chain or leaves it.
        let left = old.is_some();
        if let Some((chain, r)) = now {
            index.insert(record_key, chain, r.offset, Member { id: r.event_id.to_string(), state: r.state });
            if !blocks(r.state) {
                self.released.notify_one();
            }
        } else if left {
            self.released.notify_one();
        }
        self.recount(&index);
        stale
    }

    /// Chains with members and none that blocks: their held events may run, lowest offset first.
    pub(in crate::store) fn released(&self) -> Vec<ChainId> {
        let index = self.lock();
        let mut out: Vec<ChainId> =
            index.chains.iter().filter(|(_, m)| m.values().all(|m| !blocks(m.state))).map(|(c, _)| c.clone()).collect();
        out.sort();
        out
    }

    /// The first member of a released chain: its record key and event id.
    pub(in crate::store) fn next_held(&self, chain: &ChainId) -> Option<(Vec<u8>, String)> {
        let index = self.lock();
        let members = index.chains.get(chain)?;
        if members.values().any(|m| blocks(m.state)) {
            return None;
        }
        members.iter().next().map(|((_, key), m)| (key.clone(), m.id.clone()))
    }

    /// What `chain` waits for: its first dead, parked or claimed member.
    pub(in crate::store) fn head(&self, index: &Index, chain: &ChainId) -> Option<String> {
        index.chains.get(chain)?.values().find(|m| blocks(m.state)).map(|m| m.id.clone())
    }

    /// The record keys of every member.
    pub(in crate::store) fn member_keys(&self) -> Vec<Vec<u8>> {
        self.lock().by_key.keys().cloned().collect()
    }

    /// Chains that wait for a dead or parked (or claimed) head: keys whose new events are held.
    pub(in crate::store) fn held_keys(&self) -> usize {
        let index = self.lock();
        index.chains.values().filter(|m| m.values().any(|m| blocks(m.state))).count()
    }

    /// Waits until a chain may have been released (or returns at once if one was since the last wait).
    pub async fn released_notified(&self) {
        self.released.notified().await
    }
}

/// A chain as `store get` shows it (`Store::chain_view`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChainInfo {
    /// The chain's Kafka key.
    pub chain: ChainId,
    /// The event the chain waits for (dead, parked, or being run again); `None`:
    /// released, its held events run now at the partition's owner.
    pub head: Option<String>,
    /// Held events in offset order (at most the number asked for).
    pub held: Vec<String>,
    /// Held events in all.
    pub held_total: u64,
}

/// A held member the releaser runs: its claim is allowed while this lives.
pub struct Running<'a> {
    pub(in crate::store) chains: &'a Chains,
    pub(in crate::store) key: Vec<u8>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.chains.lock().running.remove(&self.key);
    }
}

