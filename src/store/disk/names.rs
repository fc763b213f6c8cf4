//! Small ids for the texts every record would otherwise repeat: dedup scopes,
//! topics and event types. Kept in their own tree (`name ↔ id`) and in memory;
//! a few hundred at most (one per topic, scope and event type).
//!
//! A new name is written before the record that uses it, in the same group
//! commit: a crash in between leaves an unused name, never a record whose
//! name is unknown.

use arc_swap::ArcSwap;
use foldhash::{HashMap, HashMapExt};
use std::sync::{Arc, Mutex};

use crate::store::error::StoreError;

const BY_NAME: u8 = b'n';
const BY_ID: u8 = b'i';

/// Name → id, and id → name (index 0 is reserved: [`super::keys::LEGACY_SCOPE`]).
/// A name is held once and shared by the records that carry it ([`Names::shared`]).
type Maps = (HashMap<Arc<str>, u32>, Vec<Option<Arc<str>>>);

/// Read several times per event from every worker, written a few hundred times in
/// a store's life: readers load the maps without a lock, a new name swaps in a copy.
pub struct Names {
    tree: sled::Tree,
    maps: ArcSwap<Maps>,
    /// Held by the one who gives a name its id, so that two never give two.
    giving: Mutex<()>,
}

impl Names {
    pub fn open(tree: sled::Tree) -> Result<Names, StoreError> {
        let (mut by_name, mut by_id) = (HashMap::new(), vec![None]);
        for item in tree.scan_prefix([BY_ID]) {
            let (k, v) = item?;
            let id = k.get(1..5).and_then(|b| <[u8; 4]>::try_from(b).ok()).map(u32::from_be_bytes);
            let (Some(id), Ok(name)) = (id, std::str::from_utf8(&v)) else { continue };
            let name: Arc<str> = name.into();
            if by_id.len() <= id as usize {
                by_id.resize(id as usize + 1, None);
            }
            by_id[id as usize] = Some(name.clone());
            by_name.insert(name, id);
        }
        Ok(Names { tree, maps: ArcSwap::from_pointee((by_name, by_id)), giving: Mutex::default() })
    }

    /// The id of `name`, if it has one.
    pub fn find(&self, name: &str) -> Option<u32> {
        self.maps.load().0.get(name).copied()
    }

    /// The id of `name`, given one now if it has none.
    pub fn id(&self, name: &str) -> Result<u32, StoreError> {
        if let Some(id) = self.find(name) {
            return Ok(id);
        }
        let _giving = self.giving.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(id) = self.find(name) {
            return Ok(id);
        }
        let mut maps = Maps::clone(&self.maps.load());
        let id = u32::try_from(maps.1.len()).expect("fewer than 2^32 names");
        let mut by_name = vec![BY_NAME];
        by_name.extend_from_slice(name.as_bytes());
        let mut by_id = vec![BY_ID];
        by_id.extend_from_slice(&id.to_be_bytes());
        self.tree.insert(by_id, name.as_bytes())?;
        self.tree.insert(by_name, &id.to_be_bytes()[..])?;
        let shared: Arc<str> = name.into();
        maps.0.insert(shared.clone(), id);
        maps.1.push(Some(shared));
        self.maps.store(Arc::new(maps));
        Ok(id)
    }

    /// The name of `id` (empty for an id this store never gave, which a sound store has not).
    pub fn name(&self, id: u32) -> Arc<str> {
        self.maps.load().1.get(id as usize).cloned().flatten().unwrap_or_else(|| "".into())
    }

    /// The dictionary as it is now, for several lookups in a row (a record's key and
    /// value): one load of the maps instead of one per name.
    pub fn loaded(&self) -> Loaded<'_> {
        Loaded { names: self, maps: self.maps.load() }
    }
}

/// [`Names::loaded`]: the maps loaded once. A name it does not hold yet is given
/// its id by the dictionary itself (and found there from then on).
pub struct Loaded<'a> {
    names: &'a Names,
    maps: arc_swap::Guard<Arc<Maps>>,
}

impl Loaded<'_> {
    /// The id of `name`, given one now if it has none.
    pub fn id(&self, name: &str) -> Result<u32, StoreError> {
        match self.maps.0.get(name) {
            Some(&id) => Ok(id),
            None => self.names.id(name),
        }
    }

    /// `name` as the dictionary holds it, so that a record carrying it costs no copy;
    /// a copy of its own for a name that has no id yet.
    pub fn shared(&self, name: &str) -> Arc<str> {
        self.maps.0.get_key_value(name).map_or_else(|| name.into(), |(shared, _)| shared.clone())
    }

    /// The name of `id`.
    pub fn name(&self, id: u32) -> Arc<str> {
        match self.maps.1.get(id as usize).cloned().flatten() {
            Some(name) => name,
            None => self.names.name(id),
        }
    }
}

/// A dictionary in a new store of its own (tests): the directory, the store to open
/// it again from, the dictionary.
#[cfg(test)]
pub(in crate::store) fn fresh() -> (tempfile::TempDir, sled::Db, Names) {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
    let names = Names::open(db.open_tree("names").unwrap()).unwrap();
    (dir, db, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_their_ids_across_a_reopen() {
        let (_dir, db, names) = fresh();
        let (a, b) = (names.id("orders").unwrap(), names.id("").unwrap());
        assert_eq!((a, b, names.id("orders").unwrap()), (1, 2, 1));
        let again = Names::open(db.open_tree("names").unwrap()).unwrap();
        assert_eq!((again.find("orders"), again.find(""), again.find("x")), (Some(1), Some(2), None));
        assert_eq!((again.name(1), again.id("x").unwrap()), ("orders".into(), 3));
        assert!(Arc::ptr_eq(&again.loaded().shared("orders"), &again.name(1)), "a known name is shared, not copied");
    }

    #[test]
    fn a_loaded_dictionary_gives_a_new_name_its_id_and_knows_the_old_ones() {
        let (_dir, _db, names) = fresh();
        let orders = names.id("orders").unwrap();
        let loaded = names.loaded();
        assert_eq!(loaded.id("orders").unwrap(), orders);
        let new = loaded.id("payments").unwrap();
        assert_ne!(new, orders, "a name loaded after the maps were gets an id of its own");
        assert_eq!((names.find("payments"), loaded.id("payments").unwrap()), (Some(new), new), "given once, kept");
        assert_eq!((&*loaded.name(orders), &*loaded.name(new)), ("orders", "payments"));
        assert!(Arc::ptr_eq(&loaded.shared("orders"), &names.name(orders)), "a known name is shared, not copied");
    }
}
