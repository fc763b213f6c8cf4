//! A restore into a new scope writes packed runs, not one sled entry per record.
//!
//! While a read restores a scope the store held no record of (the fast path of
//! [`Restoring`]), the records it would write one entry each ("unwritten") wait
//! in memory, by slice and in key order, and each slice's are written as a run of
//! their own (`Slices::write_run`), in one pass of sequential block writes
//! (store/disk/runs.rs). sled's per-record insert was most of a restore's time
//! (bench/findings.md, "the changelog — restore, failover"). A slice takes a new run
//! each time, rather than its records packed again with the new ones, so each
//! record is written once however many times the limit is reached; gc merges a
//! slice's runs once they are more than `MAX_RUNS` (store/disk/slices.rs).
//!
//! Only plain records wait: a record with a message copy, a held chain's member or
//! a dead or parked record is written at once, with its indexes, as before.
//!
//! Durability: the partition's checkpoint does not move while records wait. When
//! they reach `store.changelog.restore_run_bytes`, or the read its end, each
//! slice's are written as a run, made durable, added to the slice's runs and made
//! durable again; only then does the reader move the checkpoint. A crash before
//! that loses nothing: the next read starts from the old checkpoint. A read stopped
//! early drops what waits, for the same reason.
//!
//! When the fast path ends (something else wrote to the store meanwhile, or a
//! tombstone came), what waits is written an entry each at once
//! ([`Store::spill_unwritten`]), as the fast path wrote it before runs.

use std::sync::Arc;
use std::time::Duration;

use super::apply::Restoring;
use super::unwritten::Taken;
use crate::store::base::{crash_point, Crash, Store};
use crate::store::disk::record::State;
use crate::store::disk::slices::{Packing, Slice};
use crate::store::error::StoreError;

/// How long a restore waits between tries for a slice that gc is sealing.
const PACKING_WAIT: Duration = Duration::from_millis(5);

impl Store {
    /// Writes the records `restoring` holds back as runs of their slices, each
    /// run durable before the store names it and durable again after. Blocks
    /// (call it off the async runtime). The caller then moves the checkpoint.
    /// Returns the records written.
    pub(in crate::store) fn write_unwritten(&self, restoring: &mut Restoring) -> Result<u64, StoreError> {
        let mut written = 0;
        let Taken { slices, arena } = restoring.unwritten.take();
        for (slice, records) in slices {
            let packing = wait_for_packing(&slice);
            let states: Vec<State> = records.iter().filter_map(|w| w.state).collect();
            let entries = records.iter().map(|w| (arena.key(w), arena.value(w)));
            let run = self.slices.write_run(&slice, entries, &packing)?;
            drop(records);
            crash_point(Crash::Restore, "packed");
            self.durable_blocking()?;
            self.slices.add(&slice, run)?;
            crash_point(Crash::Restore, "installed");
            for state in &states {
                slice.moved(None, Some(*state));
            }
            // Nothing to settle: the run holds no record the overlay had (an overlay
            // entry of one of its keys was written since, and shadows it).
            self.durable_blocking()?;
            drop(packing);
            written += states.len() as u64;
            restoring.wrote(states.len() as i64);
        }
        crash_point(Crash::Restore, "written");
        Ok(written)
    }

    /// Writes the records `restoring` holds back an entry each, now (its fast
    /// path ends). Returns the records written.
    pub(super) fn spill_unwritten(&self, restoring: &mut Restoring) -> Result<u64, StoreError> {
        let mut written = 0;
        let Taken { slices, arena } = restoring.unwritten.take();
        for (slice, records) in slices {
            for w in records {
                slice.insert(arena.key(&w), arena.value(&w))?;
                slice.moved(None, w.state);
                written += 1;
            }
        }
        restoring.wrote(written as i64);
        Ok(written)
    }
}

/// The right to pack `slice`, once gc's seal of it (if one runs) is over.
fn wait_for_packing(slice: &Arc<Slice>) -> Packing {
    loop {
        if let Some(packing) = slice.try_packing() {
            return packing;
        }
        std::thread::sleep(PACKING_WAIT);
    }
}
