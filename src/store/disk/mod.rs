//! The store's disk core: sled, and what it keeps there, knowing nothing of
//! claims, held chains, the audit or the changelog (those are the layers above).
//!
//! - `db`: opening sled (and naming who holds it), the meta tree's keys.
//! - `record`: what the store keeps per (event id, dedup scope); `keys`: record keys
//!   (16 bytes for a UUID id, plus a tag and a scope id); `format`: the compact value;
//!   `names`: the scope/topic/event-type dictionary; `varint`: their integers.
//! - `slices`: one tree per slice of time, per-slice counts (`counts`), dropped whole;
//!   a slice whose time has passed is sealed into a packed run (`runs`) and its tree
//!   becomes an overlay; `filter`: the lookup filters of both.
//! - `journal`: the records of the slice taking live writes, in memory, journaled
//!   one sled value per group commit instead of one sled entry per record.
//! - `sync`: the group commit (flush + fdatasync, one per batch of writers).
//! - `messages`: copies of failed messages, within a quota, per slice.
//! - `migrate`: converts stores written in the earlier format on open.
//! - `owner`: the file naming the process that holds the store.

pub(in crate::store) mod counts;
pub(in crate::store) mod db;
pub(in crate::store) mod filter;
pub(in crate::store) mod format;
pub(in crate::store) mod journal;
pub(in crate::store) mod keys;
pub(in crate::store) mod messages;
pub(in crate::store) mod migrate;
pub(in crate::store) mod names;
pub(in crate::store) mod owner;
pub(in crate::store) mod record;
pub(in crate::store) mod runs;
pub(in crate::store) mod slices;
pub(in crate::store) mod sync;
pub(in crate::store) mod varint;
