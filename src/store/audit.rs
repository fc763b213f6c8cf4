//! The audit, the ledger's side: recording what a person did (locally and in the
//! changelog partition of the events named), applying entries a changelog brings,
//! and their expiry. The entries and their tree: `audit_log`.

use super::audit_log::{decode, encode, key_at, AuditEntry, AUDIT_TAG, KEY_BYTES};
use super::base::Store;
use super::changelog::entry::{Acked, Entry};
use super::error::StoreError;

impl Store {
    /// Records what a person did: the entry (split per source partition, see the
    /// module docs) goes to the changelog partition of its events and into the
    /// local audit, durably (the group commit). A changelog that does not take it
    /// fails the call, after the entry was written here: the audit keeps what it can.
    pub(in crate::store) async fn record_audit(&self, entry: AuditEntry) -> Result<(), StoreError> {
        let mut refused = None;
        for (source, part) in entry.split() {
            let key = key_at(part.at_us, rand::random());
            let value = encode(&part);
            let sent = match (source, self.changelog.sink()) {
                (Some((topic, partition)), Some(sink)) => {
                    let changelog_key = [&[AUDIT_TAG][..], &key].concat();
                    Some(sink.send(Entry { topic: topic.into(), partition, key: changelog_key, value: Some(value.clone()) }))
                }
                _ => None,
            };
            let acked: Option<Acked> = match sent {
                Some(sent) => sent.await.map_err(|e| refused = Some(e)).ok(),
                None => None,
            };
            self.audit.insert(&key, &part, &value)?;
            self.durable().await?;
            self.acknowledged(acked);
        }
        refused.map_or(Ok(()), |e| Err(StoreError::Changelog(e)))
    }

    /// An audit entry read from a changelog partition (restore, follow, standby,
    /// `store rebuild`), unless it is malformed (skipped with a warning) or older
    /// than the retention before `now`. Answers whether it was written.
    pub(super) fn apply_audit(&self, key: &[u8], value: &[u8], now: i64) -> Result<bool, StoreError> {
        let Some(tree_key) = key.get(1..).filter(|k| k.len() == KEY_BYTES) else {
            tracing::warn!(key = ?key, "changelog audit entry skipped: malformed key");
            return Ok(false);
        };
        let entry = match decode(tree_key, value) {
            Ok(entry) => entry,
            Err(error) => {
                tracing::warn!(%error, "changelog audit entry skipped");
                return Ok(false);
            }
        };
        if entry.at_us.saturating_add(self.changelog.retention_us) <= now {
            return Ok(false);
        }
        self.audit.insert(tree_key, &entry, value)?;
        Ok(true)
    }

    /// Removes audit entries older than the retention (`Store::gc`).
    pub(super) fn expire_audit(&self, now_us: i64) -> Result<u64, StoreError> {
        self.audit.expire(now_us)
    }
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
