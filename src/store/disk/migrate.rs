//! Converts a store written in the earlier format, once, on open: records in one
//! `events` tree (postcard, keyed `id ++ 0x00 ++ scope`, or the bare id before
//! scopes), an `expiry` index, message copies keyed by record key. Each record
//! goes to the slice of its last write, in the compact format; its copy along.
//!
//! Crash-safe: a batch is written and flushed in its new place before it is
//! removed from the old tree, and writing a record again where it already is
//! changes nothing, so a conversion cut short by a crash starts over with what
//! is left. The counts are taken from the converted slices at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::names::Names;
use super::slices::Slices;
use super::db::{read_i64, LEGACY_UNTIL_KEY};
use super::record::{now_us, Record};
use super::format;
use super::keys;
use super::messages;
use crate::store::error::StoreError;

const OLD_EVENTS_TREE: &str = "events";
const OLD_EXPIRY_TREE: &str = "expiry";
const OLD_MESSAGES_TREE: &str = "messages";
/// Meta keys of the earlier format, dropped after the conversion.
const OLD_META_KEYS: [&[u8]; 2] = [b"records_per_state", b"scoped_keys_since"];
/// Records converted, and flushed, before they are removed from the old tree.
const BATCH: usize = 10_000;
/// Progress is logged this often on a large store.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What the conversion writes to.
pub struct Parts<'a> {
    pub db: &'a sled::Db,
    pub meta: &'a sled::Tree,
    pub names: &'a Names,
    pub slices: &'a Slices,
    pub messages: &'a messages::MessageCopies,
}

/// Converts the records of the earlier format, if there are any.
pub fn convert(p: &Parts<'_>) -> Result<(), StoreError> {
    if !p.db.tree_names().iter().any(|n| n.as_ref() == OLD_EVENTS_TREE.as_bytes()) {
        return Ok(());
    }
    let events = p.db.open_tree(OLD_EVENTS_TREE)?;
    let old_messages = p.db.open_tree(OLD_MESSAGES_TREE)?;
    let started = Instant::now();
    let (mut converted, mut last_log) = (0u64, Instant::now());
    if !events.is_empty() {
        tracing::info!("converting the store to the compact format (once; progress is logged)");
    }
    let now = now_us();
    loop {
        let batch: Vec<(sled::IVec, sled::IVec)> = events.iter().take(BATCH).collect::<Result<_, _>>()?;
        if batch.is_empty() {
            break;
        }
        let mut legacy_until = None;
        for (old_key, value) in &batch {
            let mut r: Record = match postcard::from_bytes(value) {
                Ok(r) => r,
                Err(error) => {
                    tracing::warn!(key = %String::from_utf8_lossy(old_key), %error, "unreadable record left out of the conversion");
                    continue;
                }
            };
            r.scope = old_scope(old_key).map(Arc::from);
            let slice = p.slices.slice_for(r.updated_at_us.min(now))?;
            let scope = match &r.scope {
                Some(s) => p.names.id(s)?,
                None => keys::LEGACY_SCOPE,
            };
            if r.scope.is_none() {
                legacy_until = legacy_until.max(Some(p.slices.expires_at(&slice)));
            }
            let key = keys::record_key(&keys::event_key(&r.event_id), scope);
            slice.insert_tree(&key, format::encode(&r, p.names, slice.start)?.as_slice())?;
            if let Some(copy) = old_messages.get(old_key)? {
                p.messages.insert_raw(&messages::copy_key(slice.start, &key), &copy)?;
            }
        }
        if let Some(until) = legacy_until {
            let kept = read_i64(p.meta, LEGACY_UNTIL_KEY)?.unwrap_or(i64::MIN);
            p.meta.insert(LEGACY_UNTIL_KEY, &until.max(kept).to_be_bytes()[..])?;
        }
        p.db.flush()?;
        for (old_key, _) in &batch {
            events.remove(old_key)?;
            old_messages.remove(old_key)?;
        }
        converted += batch.len() as u64;
        if last_log.elapsed() >= PROGRESS_EVERY {
            tracing::info!(converted, seconds = started.elapsed().as_secs(), "converting the store");
            last_log = Instant::now();
        }
    }
    // Counts and copy bytes from what is there now (a restarted conversion counted nothing twice).
    let mut per_slice = Vec::new();
    for slice in p.slices.all() {
        let mut counted = [0i64; super::counts::STATES];
        for item in slice.iter() {
            let (_, v) = item?;
            if let Some(state) = format::state(&v) {
                counted[super::counts::slot(state)] += 1;
            }
        }
        per_slice.push((slice.start, counted));
    }
    p.slices.correct(&per_slice)?;
    p.messages.recount()?;
    p.meta.insert(super::messages::MESSAGE_BYTES_KEY, &(p.messages.bytes() as i64).to_be_bytes()[..])?;
    for key in OLD_META_KEYS {
        p.meta.remove(key)?;
    }
    p.db.flush()?;
    // Last: once these are gone, the next open finds nothing to convert.
    for tree in [OLD_EXPIRY_TREE, OLD_MESSAGES_TREE, OLD_EVENTS_TREE] {
        p.db.drop_tree(tree)?;
    }
    p.db.flush()?;
    if converted > 0 {
        tracing::info!(converted, seconds = started.elapsed().as_secs_f64(), "store converted to the compact format");
    }
    Ok(())
}

/// The scope an earlier key names (`None`: a key from before scopes, the bare id).
fn old_scope(key: &[u8]) -> Option<String> {
    let at = key.iter().rposition(|b| *b == 0)?;
    Some(String::from_utf8_lossy(&key[at + 1..]).into_owned())
}

#[cfg(test)]
#[path = "migrate_tests.rs"]
mod tests;
