//! Opening sled, and the meta tree's keys.

use std::path::Path;
use std::time::Duration;

use super::owner::Owner;
use crate::store::error::StoreError;

/// The tree of the store's own counters and marks (keys below, and those of the layers above).
pub(in crate::store) const META_TREE: &str = "meta";
/// The tree of the names dictionary (`names`).
pub(in crate::store) const NAMES_TREE: &str = "names";
/// Meta key: deliveries suppressed over the store's life (big-endian i64).
pub(in crate::store) const DUPLICATES_KEY: &[u8] = b"duplicates_suppressed";
/// Meta key: until when records from before scopes (scope id 0) may be retained
/// (µs, big-endian i64); a claim looks for them only until then.
pub(in crate::store) const LEGACY_UNTIL_KEY: &[u8] = b"legacy_keys_until";

/// The big-endian i64 under `key` in `tree`, if there is one of that size.
pub(in crate::store) fn read_i64(tree: &sled::Tree, key: &[u8]) -> Result<Option<i64>, StoreError> {
    Ok(tree.get(key)?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()).map(i64::from_be_bytes))
}

/// How long an open waits for sled's file lock while no owner file names a holder.
/// sled lets go of the file when the last of its I/O threads is done with it, which can
/// be a moment after the `Db` (and its owner file) is gone; a process that is exiting is
/// the same case. A holder its owner file names is reported at once.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Opens sled, or names who holds its lock.
pub(in crate::store) fn open_db(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_RELEASE_WAIT;
    loop {
        match sled::Config::new().path(path).cache_capacity(cache_bytes).open() {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(e)) if is_lock_error(&e) => {
                let holder = Owner::read(path);
                if holder.is_none() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let admin = holder.as_ref().and_then(|o| o.admin.clone());
                let owner = holder.map(|o| o.to_string()).unwrap_or_else(|| "another process".to_owned());
                return Err(StoreError::Locked { path: path.to_owned(), owner, admin });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock")
}

