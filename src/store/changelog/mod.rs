//! The store's side of the changelog (`[store.changelog]`): the local store is a
//! cache of changelog partitions, one per source partition (docs/architecture.md §4,
//! "The changelog model").
//!
//! - Write: a final record (and, for `on_uncertain = verify | park`, a claim) is
//!   written locally and sent to the changelog at once; the write counts (its
//!   offset may move) only when both the local group commit and the broker's
//!   acknowledgement are in. The [`Sink`] does the sending (the Kafka side).
//! - Key: the event key (`keys`), followed by `0x01` and the dedup scope when the
//!   scope is not the source topic. The topic and partition are those of the
//!   changelog topic and partition, so they are not repeated.
//! - Value: version byte, the event type as text, then the compact record of
//!   `format` with its times absolute and its texts self-contained (the small ids
//!   of `names` mean nothing to another instance). The duplicate count stays local.
//!   A record of a held chain (`chains`: dead or parked holding its key, held, or
//!   claimed for a re-run) carries its message copy after the record, up to
//!   `MAX_COPY_BYTES` (`entry`), so that the partition's next owner can run it; releases
//!   that do not know of copies read the record and ignore what follows.
//! - Restore: changelog records are applied to the local store in batches; after
//!   each batch the checkpoint of that changelog partition (the next offset to
//!   read) moves. Checkpoints live in the meta tree and are written by the group
//!   commit (before its flush), so a checkpoint is never durable without the
//!   records it covers.
//! - Once a partition is restored, its checkpoint follows this instance's own
//!   acknowledged writes while they are contiguous: a restart then reads only what
//!   others wrote since, and the owner catches up with others' writes while it runs
//!   (`engine::follow`).
//! - Repairs (`repair`): the changelog first, then the local store
//!   (`Store::settle_entry`), so no repair is left in one of them only.
//! - Authenticity (`mac`): with `key`, every record carries a MAC the sink adds
//!   and every read checks before the apply path sees the record.

//!
//! Files: `entry` (the key and value format), `sink` (where entries go), `settling`
//! (a write that waits for both the group commit and the broker), `checkpoints` (the
//! store's changelog state), `write` (final records, repairs and acknowledgements),
//! `apply` and `runs` (restore: records applied one by one, or written as packed
//! runs), `publish` (records the changelog may lack, copied into it), `mac`.

pub(in crate::store) mod apply;
pub(in crate::store) mod checkpoints;
pub(in crate::store) mod entry;
pub mod mac;
pub mod publish;
pub(in crate::store) mod runs;
pub mod settling;
pub(in crate::store) mod sink;
pub(in crate::store) mod unwritten;
pub(in crate::store) mod write;

pub use apply::Restoring;
pub use entry::{Acked, ChangelogRecord, Entry, MacHeader};
/// The entry format, for the benchmark's and the tests' own changelog records.
#[cfg(any(test, feature = "internals"))]
pub use entry::{decode_entry, entry_key, entry_value};

pub use settling::{Delivered, Settling};
pub use sink::{SendFuture, Sink};
pub use crate::store::error::SendError;

#[cfg(test)]
pub(in crate::store) mod tests;

#[cfg(test)]
mod apply_tests;
