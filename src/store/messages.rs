//! Copies of the messages of dead, parked and undecodable events, for
//! `store export` and `store retry`, within a disk quota.
//!
//! Large copies end up in sled's blob files; the group commit fsyncs those too
//! (see `sync`).
//!
//! A poison flood (every message dead, each a few MB) must not fill the disk
//! and stop the service: copies are kept up to `store.max_message_copy_bytes`;
//! past it a record is still written, without its copy, and that is counted and
//! said (the dead-letter topic, when configured, has the message).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::StoreError;
use crate::event::RawMessage;

/// Meta key of the persisted total: one big-endian i64.
pub const MESSAGE_BYTES_KEY: &[u8] = b"message_copy_bytes";

/// The copies and the bytes they take.
pub struct MessageCopies {
    /// Event id → its copy (postcard `StoredMessage`).
    whole: sled::Tree,
    /// Bytes of all copies; persisted with each group commit.
    bytes: std::sync::Arc<AtomicI64>,
    /// Set by the service from `store.max_message_copy_bytes`; unbounded otherwise.
    quota: AtomicU64,
}

impl MessageCopies {
    pub fn open(db: &sled::Db, meta: &sled::Tree) -> Result<MessageCopies, StoreError> {
        let whole = db.open_tree(super::MESSAGES_TREE)?;
        let bytes = match meta.get(MESSAGE_BYTES_KEY)?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()) {
            Some(b) => i64::from_be_bytes(b),
            // A store from before the total was kept: add it up once.
            None => sum_values(&whole)?,
        };
        Ok(MessageCopies { whole, bytes: std::sync::Arc::new(AtomicI64::new(bytes)), quota: AtomicU64::new(u64::MAX) })
    }

    pub fn set_quota(&self, bytes: u64) {
        self.quota.store(bytes, Ordering::Relaxed);
    }

    /// What to persist with each group commit.
    pub fn total(&self) -> std::sync::Arc<AtomicI64> {
        self.bytes.clone()
    }

    /// Bytes the copies take now.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Keeps a copy of `message` under the record's key, replacing an older one.
    /// Returns false when the copy would pass the quota: then nothing changes, and
    /// an older copy under this key (a re-run's message) stays.
    pub fn put(&self, key: &[u8], message: &RawMessage) -> Result<bool, StoreError> {
        let encoded = super::encode_message(message);
        let older = self.whole.get(key)?.map_or(0, |v| v.len() as u64);
        let after = self.bytes().saturating_sub(older).saturating_add(encoded.len() as u64);
        if after > self.quota.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let size = encoded.len() as i64;
        let replaced = self.whole.insert(key, encoded)?.map_or(0, |v| v.len() as i64);
        self.bytes.fetch_add(size - replaced, Ordering::Relaxed);
        Ok(true)
    }

    /// The copy kept under the record's key, if any (`id` names it in errors).
    pub fn get(&self, key: &[u8], id: &str) -> Result<Option<RawMessage>, StoreError> {
        self.whole.get(key)?.map(|bytes| super::decode_message(id, &bytes)).transpose()
    }

    /// Drops the copy under the record's key, if there is one.
    pub fn remove(&self, key: &[u8]) -> Result<(), StoreError> {
        if let Some(old) = self.whole.remove(key)? {
            self.bytes.fetch_sub(old.len() as i64, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn sum_values(tree: &sled::Tree) -> Result<i64, StoreError> {
    let mut n = 0i64;
    for item in tree.iter() {
        n += item?.1.len() as i64;
    }
    Ok(n)
}
