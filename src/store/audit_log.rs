//! The audit: what people did to the store (forget, resolve, re-run, gc), who,
//! when, why, and what came of it. One sled tree, `audit`, of entries keyed by
//! time, so that the newest come first and a page starts after a cursor without
//! a scan (docs/architecture.md §3 and §4, "Audit entries").
//!
//! - Key: the entry's time (µs, big-endian with the sign bit flipped, so keys sort
//!   by time) and 8 random bytes, so that two entries of the same microsecond, on
//!   two instances, never share a key. The same 16 bytes after [`AUDIT_TAG`] are
//!   its changelog key: unique keys, so compaction keeps every entry, and the
//!   topic's `retention.ms` (`store.retention`) ends them as it ends records.
//! - Value: a version byte, then the entry as JSON (entries are few and rare; a
//!   field added later is read past by older releases).
//! - Where an entry goes: to the changelog partition of the events it names (the
//!   source partition of their records), so it follows the partition to its next
//!   owner like a repair. An entry naming events of several partitions is split
//!   into one entry per partition, each with the ids of its partition; ids without
//!   a record (a refused forget of an unknown id) and entries naming no event (gc)
//!   stay in this instance's store only.
//! - Retention: `Store::gc` removes the entries older than `store.retention`; a
//!   restore does not write entries that old.
//!
//! An older release reading a changelog with audit entries skips them: their key
//! starts with a tag no record key has, and a record that does not decode is
//! skipped with a warning, never applied, and the read goes on.

use serde::{Deserialize, Serialize};

use super::error::StoreError;

/// The first byte of an audit entry's changelog key: no record key starts with it
/// (those start with 1, 2 or 3: `keys`).
pub const AUDIT_TAG: u8 = 0x10;
pub(in crate::store) const TREE: &str = "audit";
pub(in crate::store) const VALUE_VERSION: u8 = 1;
/// Bytes of an entry's key in the tree (time, then random bytes).
pub(in crate::store) const KEY_BYTES: usize = 16;

pub use crate::wire::AuditAction;

/// An event an entry names, and where its record is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// The event id.
    pub id: String,
    /// The source topic and partition of its record (the changelog partition the
    /// entry goes to); `None` when there was no record of it.
    pub source: Option<(String, i32)>,
}

/// One thing a person did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When (µs since the epoch).
    pub at_us: i64,
    /// Who: the credential's name (`admin`, `local`, a `[[admin.tokens]]` name) or `cli:<user>`.
    pub who: String,
    /// What.
    pub action: AuditAction,
    /// The events it was done to (none for gc).
    pub events: Vec<AuditEvent>,
    /// Why, as the person said (bounded by `ops`).
    pub reason: Option<String>,
    /// What came of it: `done`, `dead again`, `error: …`, …
    pub outcome: String,
}

impl AuditEntry {
    /// Whether it names event `id`.
    pub fn names(&self, id: &str) -> bool {
        self.events.iter().any(|e| e.id == id)
    }

    /// One entry per source partition of the events named, each with that
    /// partition's ids; ids without a record, or no ids at all, make one entry
    /// that stays local (`None`).
    pub(in crate::store) fn split(self) -> Vec<(Option<(String, i32)>, AuditEntry)> {
        let mut parts: Vec<(Option<(String, i32)>, AuditEntry)> = Vec::new();
        for e in &self.events {
            match parts.iter_mut().find(|(s, _)| *s == e.source) {
                Some((_, part)) => part.events.push(e.clone()),
                None => parts.push((e.source.clone(), AuditEntry { events: vec![e.clone()], ..self.clone() })),
            }
        }
        if parts.is_empty() {
            parts.push((None, self));
        }
        parts
    }
}

/// The audit tree, its index by event, and how long entries are kept.
pub(in crate::store) struct AuditLog {
    pub(in crate::store) tree: sled::Tree,
    /// By event: the id's length (4 bytes, big-endian), the id, an entry's key → nothing,
    /// so that the entries naming one event are found without reading the audit.
    /// Written before its entry (and removed after it): an index entry whose audit
    /// entry is gone is passed over.
    pub(in crate::store) by_event: sled::Tree,
    /// `store.retention` in µs: gc removes older entries.
    pub(in crate::store) retention_us: i64,
}

/// The tree key of an entry at `at_us`, with `random` making it unique.
pub(in crate::store) fn key_at(at_us: i64, random: [u8; 8]) -> [u8; KEY_BYTES] {
    let mut k = [0u8; KEY_BYTES];
    k[..8].copy_from_slice(&((at_us as u64) ^ (1 << 63)).to_be_bytes());
    k[8..].copy_from_slice(&random);
    k
}

/// A page cursor: the key of the page's last entry, in hex.
fn cursor_of(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

pub(in crate::store) fn parse_cursor(cursor: &str) -> Option<[u8; KEY_BYTES]> {
    let bytes = cursor.as_bytes();
    if bytes.len() != KEY_BYTES * 2 {
        return None;
    }
    let mut k = [0u8; KEY_BYTES];
    for (out, pair) in k.iter_mut().zip(bytes.chunks_exact(2)) {
        *out = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(k)
}

pub(in crate::store) fn encode(entry: &AuditEntry) -> Vec<u8> {
    let mut v = vec![VALUE_VERSION];
    serde_json::to_writer(&mut v, entry).expect("an audit entry serializes");
    v
}

pub(in crate::store) fn decode(key: &[u8], value: &[u8]) -> Result<AuditEntry, StoreError> {
    let corrupt = |error: String| StoreError::Corrupt { id: format!("audit {}", cursor_of(key)), error };
    match value.split_first() {
        Some((&VALUE_VERSION, json)) => serde_json::from_slice(json).map_err(|e| corrupt(e.to_string())),
        Some(_) => Err(corrupt("audit entry of an unknown version (written by a newer outboxd?)".into())),
        None => Err(corrupt("empty audit entry".into())),
    }
}

/// Whether a changelog key is an audit entry's.
pub(in crate::store) fn is_audit_key(key: &[u8]) -> bool {
    key.first() == Some(&AUDIT_TAG)
}

/// The index tree's name.
pub(in crate::store) const BY_EVENT_TREE: &str = "audit_by_event";

/// The index key of `id` in the entry of key `key`.
fn by_event_key(id: &str, key: &[u8]) -> Vec<u8> {
    let mut k = event_prefix(id);
    k.extend_from_slice(key);
    k
}

/// What every index key of `id` starts with.
pub(in crate::store) fn event_prefix(id: &str) -> Vec<u8> {
    let len = u32::try_from(id.len()).unwrap_or(u32::MAX);
    [&len.to_be_bytes()[..], id.as_bytes()].concat()
}

impl AuditLog {
    pub(in crate::store) fn open(db: &sled::Db, retention: std::time::Duration) -> Result<AuditLog, StoreError> {
        let retention_us = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
        let indexed = db.tree_names().iter().any(|t| t.as_ref() == BY_EVENT_TREE.as_bytes());
        let log = AuditLog { tree: db.open_tree(TREE)?, by_event: db.open_tree(BY_EVENT_TREE)?, retention_us };
        if !indexed {
            // A store of a release before the index: its audit (what people did within
            // the retention, never one entry per event) is indexed once, here.
            for item in log.tree.iter() {
                let (k, v) = item?;
                log.index(&k, &decode(&k, &v)?)?;
            }
        }
        Ok(log)
    }

    /// Index entries of `entry` (of key `key`), before the entry is written.
    pub(in crate::store) fn index(&self, key: &[u8], entry: &AuditEntry) -> Result<(), StoreError> {
        for e in &entry.events {
            self.by_event.insert(by_event_key(&e.id, key), &[])?;
        }
        Ok(())
    }

    /// Writes `entry` under `key`, its index entries first.
    pub(in crate::store) fn insert(&self, key: &[u8], entry: &AuditEntry, value: &[u8]) -> Result<(), StoreError> {
        self.index(key, entry)?;
        self.tree.insert(key, value)?;
        Ok(())
    }

    /// Up to `limit` entries, newest first, older than the cursor `before`; the
    /// cursor of the next page when more follow.
    pub(in crate::store) fn list(
        &self,
        before: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<AuditEntry>, Option<String>), StoreError> {
        let upto = match before {
            Some(c) => parse_cursor(c).ok_or_else(|| StoreError::BadCursor(c.to_owned()))?.to_vec(),
            None => vec![0xFF; KEY_BYTES + 1],
        };
        let (mut entries, mut last) = (Vec::new(), None);
        for item in self.tree.range(..upto).rev() {
            let (k, v) = item?;
            if entries.len() == limit {
                return Ok((entries, last.as_deref().map(cursor_of)));
            }
            entries.push(decode(&k, &v)?);
            last = Some(k.to_vec());
        }
        Ok((entries, None))
    }

    /// Every entry that names event `id`, newest first, from the index by event.
    pub(in crate::store) fn for_event(&self, id: &str) -> Result<Vec<AuditEntry>, StoreError> {
        let prefix = event_prefix(id);
        let mut keys = Vec::new();
        for item in self.by_event.scan_prefix(&prefix) {
            let (k, _) = item?;
            keys.push(k[prefix.len()..].to_vec());
        }
        let mut out = Vec::new();
        // Entry keys begin with their time: the last one is the newest.
        for key in keys.iter().rev() {
            if let Some(v) = self.tree.get(key)? {
                let entry = decode(key, &v)?;
                if entry.names(id) {
                    out.push(entry);
                }
            }
        }
        Ok(out)
    }

    /// Removes the entries older than the retention before `now_us`; answers how many.
    pub(in crate::store) fn expire(&self, now_us: i64) -> Result<u64, StoreError> {
        let cutoff = key_at(now_us.saturating_sub(self.retention_us), [0; 8]);
        let mut removed = 0;
        for item in self.tree.range(..cutoff) {
            let (k, v) = item?;
            self.tree.remove(&k)?;
            // A malformed entry leaves its index entries, which are passed over.
            if let Ok(entry) = decode(&k, &v) {
                for e in &entry.events {
                    self.by_event.remove(by_event_key(&e.id, &k))?;
                }
            }
            removed += 1;
        }
        Ok(removed)
    }
}

