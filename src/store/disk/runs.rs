//! Packed runs: a slice's records once it is no longer the one taking live
//! writes, in key order, [`BLOCK_RECORDS`] to a sled value (a *block*), each
//! block under the key of its last record. A lookup is one range read (the
//! first block whose last key is not below the key) and a scan of one decoded
//! block; an iteration decodes blocks in order.
//!
//! Why: sled keeps state in memory for every page it ever wrote, and frees a
//! dropped tree's pages one by one. One entry per block instead of one per
//! record makes both about 64 times smaller (docs/architecture.md, "Packed runs").
//!
//! A run is immutable once written: a slice's later changes go to memory or to
//! its overlay (the slice's own tree, `slices`), which shadow the run, removals
//! included (a [`TOMBSTONE`]); a run spilled from memory is newer than the runs
//! before it and may hold tombstones too. A merge writes a new run from all of
//! them and replaces the old ones (`slices::Slices::pack`).
//!
//! Block format: a version byte, then per record its key and its value, each
//! as a varint length and the bytes (`varint`).
//!
//! Each run has an exact-size lookup filter (store/disk/filter.rs), built as the run
//! is written and stored in the [`FILTERS_TREE`] under the run's tree name, in
//! the same flush as its blocks: a start loads it. A run written before filters
//! were stored gets one from its keys, once, by the filling thread.

use std::ops::Bound;
use std::sync::OnceLock;

use super::filter::{Hashed, RunFilter, RunFilterBuilder};
use super::varint::{put_bytes, Reader};

/// Records per block: about 4 KiB of values, one sled entry.
pub const BLOCK_RECORDS: usize = 64;
/// Blocks per sled batch while a run is written.
const BATCH_BLOCKS: usize = 256;
/// The value of a removal in an overlay: no record value is empty.
pub const TOMBSTONE: &[u8] = b"";
const BLOCK_VERSION: u8 = 1;
const PREFIX: &[u8] = b"run:";
/// Every run's stored filter, under the run's tree name.
pub const FILTERS_TREE: &str = "run-filters";

/// The tree name of run `id` of the slice that starts at `start`.
pub fn tree_name(start: i64, id: u64) -> Vec<u8> {
    [PREFIX, &start.to_be_bytes(), &id.to_be_bytes()].concat()
}

/// Whether a tree name is a run's.
pub fn is_run_tree(name: &[u8]) -> bool {
    name.starts_with(PREFIX)
}

/// The id in a run's tree name.
pub fn id_of(name: &[u8]) -> Option<u64> {
    let id = name.strip_prefix(PREFIX)?.get(8..16)?;
    Some(u64::from_be_bytes(id.try_into().ok()?))
}

/// One packed run of a slice.
pub struct Run {
    /// Unique in the database: run trees' names are never reused.
    pub id: u64,
    /// Records in the run.
    pub records: u64,
    tree: sled::Tree,
    filters: sled::Tree,
    /// Unset only for a run written before filters were stored, until the filling
    /// thread has read its keys: meanwhile every lookup reads the run.
    filter: OnceLock<RunFilter>,
}

impl Run {
    /// The run, with its stored filter if it has one.
    pub fn open(db: &sled::Db, start: i64, id: u64, records: u64) -> Result<Run, sled::Error> {
        let run = Run::new(db, start, id, records)?;
        if let Some(f) = run.filters.get(run.tree.name())?.as_deref().and_then(RunFilter::decode) {
            let _ = run.filter.set(f);
        }
        Ok(run)
    }

    fn new(db: &sled::Db, start: i64, id: u64, records: u64) -> Result<Run, sled::Error> {
        let tree = db.open_tree(tree_name(start, id))?;
        Ok(Run { id, records, tree, filters: db.open_tree(FILTERS_TREE)?, filter: OnceLock::new() })
    }

    /// False only if the run does not hold `key`.
    pub fn may_contain(&self, key: &Hashed) -> bool {
        self.filter.get().is_none_or(|f| f.may_contain(key))
    }

    /// Whether its filter is there (stored, or built since the open).
    pub fn has_filter(&self) -> bool {
        self.filter.get().is_some()
    }

    /// Memory of its filter, in bytes.
    pub fn filter_bytes(&self) -> usize {
        self.filter.get().map_or(0, RunFilter::bytes)
    }

    /// Stores the filter built from every key of the run and uses it. A filter that
    /// could not be built (xorf gives up only on keys it cannot tell apart) leaves the
    /// run without one: lookups read it.
    pub fn set_filter(&self, built: Result<RunFilter, String>) -> Result<(), sled::Error> {
        match built {
            Ok(f) => {
                self.filters.insert(self.tree.name(), f.encode())?;
                let _ = self.filter.set(f);
            }
            Err(error) => tracing::warn!(%error, run = self.id, "a packed run has no lookup filter; its lookups read it"),
        }
        Ok(())
    }

    /// The value of `key`, if the run holds it.
    pub fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, sled::Error> {
        let Some(item) = self.tree.range::<&[u8], _>(key..).next() else { return Ok(None) };
        let (_, block) = item?;
        let mut r = block_reader(&block)?;
        while !r.is_empty() {
            let (k, v) = entry(&mut r)?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => return Ok(Some(v.into())),
                std::cmp::Ordering::Greater => break,
            }
        }
        Ok(None)
    }

    /// The records from `from` on, in key order.
    pub fn range(&self, from: Bound<Vec<u8>>) -> RunIter {
        let blocks = match &from {
            Bound::Included(k) | Bound::Excluded(k) => self.tree.range(k.clone()..),
            Bound::Unbounded => self.tree.iter(),
        };
        RunIter { blocks, entries: Vec::new().into_iter(), from }
    }

    /// Calls `f` with each key of up to `blocks` blocks after the block whose last
    /// key is `after` (from the first block without it); returns the last block's
    /// key when there may be more. Reads no value into memory of its own.
    pub fn each_key(
        &self,
        after: Option<&[u8]>,
        blocks: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<sled::IVec>, sled::Error> {
        let iter = match after {
            Some(a) => self.tree.range::<&[u8], _>((Bound::Excluded(a), Bound::Unbounded)),
            None => self.tree.iter(),
        };
        let mut read = 0;
        for item in iter {
            let (last, block) = item?;
            let mut r = block_reader(&block)?;
            while !r.is_empty() {
                f(entry(&mut r)?.0);
            }
            read += 1;
            if read == blocks {
                return Ok(Some(last));
            }
        }
        Ok(None)
    }

    /// Drops the run's filter and tree (after no reader holds the run any more).
    /// The blocks are removed first, one at a time: sled frees a dropped tree's
    /// pages under one epoch guard, so every page it reads stays in memory until
    /// the drop ends (RSS rose by about half the run's bytes), while a removal's
    /// page is freed as the next one begins.
    pub fn drop_tree(&self, db: &sled::Db) -> Result<(), sled::Error> {
        self.filters.remove(self.tree.name())?;
        for key in self.tree.iter().keys() {
            self.tree.remove(key?)?;
        }
        db.drop_tree(self.tree.name()).map(drop)
    }
}

fn corrupt() -> sled::Error {
    sled::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, "a packed run's block is corrupt"))
}

fn block_reader(block: &[u8]) -> Result<Reader<'_>, sled::Error> {
    match block.split_first() {
        Some((&BLOCK_VERSION, rest)) => Ok(Reader(rest)),
        _ => Err(corrupt()),
    }
}

fn entry<'a>(r: &mut Reader<'a>) -> Result<(&'a [u8], &'a [u8]), sled::Error> {
    match (r.bytes(), r.bytes()) {
        (Some(k), Some(v)) => Ok((k, v)),
        _ => Err(corrupt()),
    }
}

/// A run's records in key order (see [`Run::range`]).
pub struct RunIter {
    blocks: sled::Iter,
    entries: std::vec::IntoIter<(sled::IVec, sled::IVec)>,
    /// Applies to the first block only: the later ones begin above it.
    from: Bound<Vec<u8>>,
}

impl Iterator for RunIter {
    type Item = Result<(sled::IVec, sled::IVec), sled::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.entries.next() {
                return Some(Ok(e));
            }
            let block = match self.blocks.next()? {
                Ok((_, block)) => block,
                Err(e) => return Some(Err(e)),
            };
            let from = std::mem::replace(&mut self.from, Bound::Unbounded);
            let mut r = match block_reader(&block) {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            let mut entries = Vec::with_capacity(BLOCK_RECORDS);
            while !r.is_empty() {
                let (k, v) = match entry(&mut r) {
                    Ok(e) => e,
                    Err(e) => return Some(Err(e)),
                };
                let wanted = match &from {
                    Bound::Included(f) => k >= f.as_slice(),
                    Bound::Excluded(f) => k > f.as_slice(),
                    Bound::Unbounded => true,
                };
                if wanted {
                    entries.push((k.into(), v.into()));
                }
            }
            self.entries = entries.into_iter();
        }
    }
}

/// Writes a new run: records pushed in increasing key order; nothing of it is
/// found before the slice installs it (`slices`).
pub struct RunWriter {
    run: Run,
    /// Of every key pushed; it also holds the last key pushed, which ends a block.
    filter: RunFilterBuilder,
    block: Vec<u8>,
    in_block: usize,
    batch: sled::Batch,
    in_batch: usize,
    records: u64,
}

impl RunWriter {
    /// A writer of run `id` (a new one) of the slice starting at `start`.
    pub fn new(db: &sled::Db, start: i64, id: u64) -> Result<RunWriter, sled::Error> {
        Ok(RunWriter {
            run: Run::new(db, start, id, 0)?,
            filter: RunFilterBuilder::default(),
            block: Vec::new(),
            in_block: 0,
            batch: sled::Batch::default(),
            in_batch: 0,
            records: 0,
        })
    }

    /// Adds a record; `key` must be above every key pushed before.
    pub fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), sled::Error> {
        if self.in_block == 0 {
            self.block.clear();
            self.block.push(BLOCK_VERSION);
        }
        put_bytes(&mut self.block, key);
        put_bytes(&mut self.block, value);
        self.filter.push(key);
        self.in_block += 1;
        self.records += 1;
        if self.in_block == BLOCK_RECORDS {
            self.end_block()?;
        }
        Ok(())
    }

    fn end_block(&mut self) -> Result<(), sled::Error> {
        self.batch.insert(self.filter.last(), self.block.as_slice());
        self.in_block = 0;
        self.in_batch += 1;
        if self.in_batch == BATCH_BLOCKS {
            self.run.tree.apply_batch(std::mem::take(&mut self.batch))?;
            self.in_batch = 0;
        }
        Ok(())
    }

    /// Writes what is left and the run's filter ([`Run::set_filter`]); the run
    /// (not yet durable: the caller waits for that).
    pub fn finish(mut self) -> Result<Run, sled::Error> {
        if self.in_block > 0 {
            self.end_block()?;
        }
        self.run.tree.apply_batch(std::mem::take(&mut self.batch))?;
        self.run.set_filter(std::mem::take(&mut self.filter).finish())?;
        Ok(Run { records: self.records, ..self.run })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        [b"k".as_slice(), &(i * 2).to_be_bytes()].concat()
    }

    #[test]
    fn every_record_is_found_in_its_block_and_no_other_is() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        for n in [0u32, 1, 63, 64, 65, 1_000] {
            let mut w = RunWriter::new(&db, 7, u64::from(n)).unwrap();
            for i in 0..n {
                w.push(&key(i), format!("v{i}").as_bytes()).unwrap();
            }
            let run = w.finish().unwrap();
            assert_eq!(run.records, u64::from(n));
            let reopened = Run::open(&db, 7, u64::from(n), run.records).unwrap();
            assert!(reopened.has_filter(), "its filter is stored with it");
            for i in 0..n {
                assert!(reopened.may_contain(&Hashed::of(&key(i))));
                assert_eq!(run.get(&key(i)).unwrap().as_deref(), Some(format!("v{i}").as_bytes()));
                let between = [key(i), vec![0]].concat();
                assert_eq!(run.get(&between).unwrap(), None, "a key between two records");
            }
            assert_eq!(run.get(b"a").unwrap(), None);
            assert_eq!(run.get(b"z").unwrap(), None);
            let all: Vec<_> = run.range(Bound::Unbounded).map(|e| e.unwrap().0.to_vec()).collect();
            assert_eq!(all, (0..n).map(key).collect::<Vec<_>>());
            if n > 100 {
                let from: Vec<_> = run.range(Bound::Excluded(key(99))).map(|e| e.unwrap().0.to_vec()).collect();
                assert_eq!(from, (100..n).map(key).collect::<Vec<_>>());
                let from: Vec<_> = run.range(Bound::Included(key(99))).take(1).map(|e| e.unwrap().0.to_vec()).collect();
                assert_eq!(from, [key(99)]);
            }
        }
    }

    #[test]
    fn a_corrupt_block_is_an_error_not_an_absent_record() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        let mut w = RunWriter::new(&db, 7, 1).unwrap();
        w.push(&key(1), b"v").unwrap();
        let run = w.finish().unwrap();
        run.tree.insert(key(1), &[BLOCK_VERSION, 9, 1][..]).unwrap();
        assert!(run.get(&key(1)).is_err());
        assert!(run.range(Bound::Unbounded).next().unwrap().is_err());
    }
}
