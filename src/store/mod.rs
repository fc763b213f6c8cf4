//! The dedup store: one compact record per (event id, dedup scope) in sled,
//! made durable by group commit, kept in time slices that expire whole, never by
//! scanning records. sled is used only in this module. Its layers, each using only
//! those before it (`scripts/module-dag` checks this file by file):
//!
//! 1. `disk`: the disk core. sled, record keys and values, slices and packed runs,
//!    lookup filters, the group commit, message copies, conversion of older stores.
//!    It knows nothing of claims, chains, the audit or the changelog.
//! 2. The parts the store holds beside the core, each a type of its own: `inflight`
//!    (claims kept in memory only, `on_uncertain = retry`), `chain_index` (events held
//!    behind a dead or parked event of their key, `on_dead = "hold"`), `audit_log`
//!    (what people did, kept `retention` long), `problem_index` (dead and parked
//!    records by group), and the changelog's checkpoints (`changelog::checkpoints`).
//!    `error`: the store's errors; `options`: how it is opened.
//! 3. `base`: the [`Store`] itself, its parts, and its life: open, group commit, gc
//!    and sealing.
//! 4. The ledger, the operations on records: `claim` and `handling` (claim, attempts,
//!    final records), `held` and `chains` (recording held events and releasing their
//!    chains), `repair` (forget, reopen, resolve, replay), `audit` (recording what
//!    people did), `problems` (keeping the index of dead and parked records).
//! 5. `changelog`: where records also go, restore, checkpoints and authenticity
//!    (`[store.changelog]`); `publish`: records the changelog may lack (written while
//!    it was off) copied into it, resumably.
//! 6. Views: `read` (listing, paging, scanning, counting), `view` (records as the
//!    admin API shows them), `roles` (the narrow handles each caller gets).

pub mod audit;
mod audit_log;
mod base;
mod chain_index;
pub mod chains;
pub mod changelog;
mod claim;
mod disk;
mod error;
mod handling;
mod held;
mod inflight;
mod options;
mod problem_index;
mod problems;
#[cfg(test)]
mod problems_tests;
mod read;
mod repair;
mod roles;
#[cfg(any(test, feature = "internals"))]
pub mod scale;
pub mod view;

pub use audit_log::{AuditAction, AuditEntry, AuditEvent};
pub use base::Store;
pub use chain_index::ChainId;
#[cfg(any(test, feature = "internals"))]
pub use claim::Claim;
pub use claim::{ClaimHow, Claimed, Turn};
pub(crate) use disk::owner::Owner;
pub use disk::record::{now_us, Record, State};
#[cfg(test)]
pub use disk::sync::SyncStats;
pub use error::StoreError;
#[cfg(test)]
pub use options::SMALL_CACHE_BYTES;
pub use options::{Role, StoreOptions};
pub use problem_index::{largest_first, reason_group};
pub use read::page_cursor;
#[cfg(test)]
pub use read::Stats;
pub use repair::Replayed;

#[cfg(any(test, feature = "internals"))]
/// The key of an event's record outside this store (a changelog topic): 17
/// bytes for a UUID id (see `keys`).
pub fn event_key(id: &str) -> Vec<u8> {
    disk::keys::event_key(id).into_vec()
}

#[cfg(test)]
mod tests;
