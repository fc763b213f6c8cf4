//! Copies of the messages of dead, parked and undecodable events, for
//! `store export` and `store retry`, within a disk quota.
//!
//! A copy is kept under its record's slice and key (`slice start ++ record key`),
//! so a dropped slice takes its copies along (a prefix scan over copies, never
//! over records). Large copies end up in sled's blob files; the group commit
//! fsyncs those too (see `sync`).
//!
//! A poison flood (every message dead, each a few MB) must not fill the disk
//! and stop the service: copies are kept up to `store.max_message_copy_bytes`;
//! past it a record is still written, without its copy, and that is counted and
//! said (the dead-letter topic, when configured, has the message).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::store::error::StoreError;
use crate::event::RawMessage;

/// Meta key of the persisted total: one big-endian i64.
pub const MESSAGE_BYTES_KEY: &[u8] = b"message_copy_bytes";
/// The copies, keyed by slice and record (the tree `messages` held them by record key before).
const COPIES_TREE: &str = "message_copies";

/// Where the copy of a record in a slice is kept.
pub fn copy_key(slice_start: i64, record_key: &[u8]) -> Vec<u8> {
    [&slice_start.to_be_bytes()[..], record_key].concat()
}

/// The copies and the bytes they take.
pub struct MessageCopies {
    /// Slice start ++ record key → its copy (postcard `StoredMessage`).
    whole: sled::Tree,
    /// Bytes of all copies; persisted with each group commit.
    bytes: std::sync::Arc<AtomicI64>,
    /// Set by the service from `store.max_message_copy_bytes`; unbounded otherwise.
    quota: AtomicU64,
}

impl MessageCopies {
    pub fn open(db: &sled::Db, meta: &sled::Tree) -> Result<MessageCopies, StoreError> {
        let whole = db.open_tree(COPIES_TREE)?;
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
        let encoded = encode_message(message);
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

    /// Keeps a copy already encoded as [`MessageCopies::put`] keeps it (one read
    /// from the changelog), within the quota as `put` does.
    pub fn put_encoded(&self, key: &[u8], encoded: &[u8]) -> Result<bool, StoreError> {
        let older = self.whole.get(key)?.map_or(0, |v| v.len() as u64);
        let after = self.bytes().saturating_sub(older).saturating_add(encoded.len() as u64);
        if after > self.quota.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let replaced = self.whole.insert(key, encoded)?.map_or(0, |v| v.len() as i64);
        self.bytes.fetch_add(encoded.len() as i64 - replaced, Ordering::Relaxed);
        Ok(true)
    }

    /// The copy kept under the record's key, encoded as it is kept.
    pub fn get_encoded(&self, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        Ok(self.whole.get(key)?)
    }

    /// The copy kept under the record's key, if any (`id` names it in errors).
    pub fn get(&self, key: &[u8], id: &str) -> Result<Option<RawMessage>, StoreError> {
        self.whole.get(key)?.map(|bytes| decode_message(id, &bytes)).transpose()
    }

    /// Drops the copy under the record's key, if there is one.
    pub fn remove(&self, key: &[u8]) -> Result<(), StoreError> {
        if let Some(old) = self.whole.remove(key)? {
            self.bytes.fetch_sub(old.len() as i64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Moves the copy of a record that moved to another slice, if it has one
    /// (a copy already kept there, the newer message, stays): the new copy is
    /// written before the old one is removed.
    pub fn moved(&self, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        if let Some(bytes) = self.whole.get(from)? {
            if !self.whole.contains_key(to)? {
                let size = bytes.len() as i64;
                self.whole.insert(to, bytes)?;
                self.bytes.fetch_add(size, Ordering::Relaxed);
            }
            self.remove(from)?;
        }
        Ok(())
    }

    /// Adds up the copies again (after converting an older store).
    pub fn recount(&self) -> Result<(), StoreError> {
        self.bytes.store(sum_values(&self.whole)?, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the copies of a dropped slice. Returns how many.
    pub fn drop_slice(&self, start: i64) -> Result<u64, StoreError> {
        let mut n = 0;
        for item in self.whole.scan_prefix(start.to_be_bytes()) {
            let (k, v) = item?;
            if self.whole.remove(&k)?.is_some() {
                self.bytes.fetch_sub(v.len() as i64, Ordering::Relaxed);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Keeps a copy as it is (converting an older store): no quota applies.
    pub fn insert_raw(&self, key: &[u8], bytes: &[u8]) -> Result<(), StoreError> {
        let replaced = self.whole.insert(key, bytes)?.map_or(0, |v| v.len() as i64);
        self.bytes.fetch_add(bytes.len() as i64 - replaced, Ordering::Relaxed);
        Ok(())
    }
}

/// A message as kept in the store (postcard: compact binary, values may be large).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredMessage {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

impl From<StoredMessage> for RawMessage {
    fn from(m: StoredMessage) -> RawMessage {
        RawMessage {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            key: m.key,
            value: m.value,
            headers: m.headers,
            timestamp_ms: m.timestamp_ms,
        }
    }
}

fn decode_message(id: &str, bytes: &[u8]) -> Result<RawMessage, StoreError> {
    postcard::from_bytes::<StoredMessage>(bytes)
        .map(RawMessage::from)
        .map_err(|e| StoreError::Corrupt { id: id.to_owned(), error: e.to_string() })
}

pub(in crate::store) fn encode_message(m: &RawMessage) -> Vec<u8> {
    let stored = StoredMessage {
        topic: m.topic.clone(),
        partition: m.partition,
        offset: m.offset,
        key: m.key.clone(),
        value: m.value.clone(),
        headers: m.headers.clone(),
        timestamp_ms: m.timestamp_ms,
    };
    postcard::to_allocvec(&stored).expect("messages serialise")
}

fn sum_values(tree: &sled::Tree) -> Result<i64, StoreError> {
    let mut n = 0i64;
    for item in tree.iter() {
        n += item?.1.len() as i64;
    }
    Ok(n)
}
