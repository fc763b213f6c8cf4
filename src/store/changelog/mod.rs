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
//!   [`MAX_COPY_BYTES`], so that the partition's next owner can run it; releases
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

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::format::{self, NameIds};
use super::keys;
use super::varint::{self, Reader};
use super::{now_us, Claimed, Record, State, Store, StoreError};

/// A record on its way to the changelog topic of `topic` (the source topic).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The source topic: the entry goes to its changelog topic.
    pub topic: String,
    /// The source partition: the entry goes to the changelog partition of that number.
    pub partition: i32,
    /// The record's changelog key ([`entry_key`]).
    pub key: Vec<u8>,
    /// `None`: a tombstone (the record is gone).
    pub value: Option<Vec<u8>>,
}

/// What a write did to a record, as the changelog is told.
#[derive(Debug, Clone, Copy)]
pub(super) enum Change<'a> {
    /// The record is now this.
    Now(&'a Record),
    /// The record is gone (a tombstone under its key).
    Gone(&'a Record),
}

/// Where the broker put an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// The changelog topic.
    pub changelog_topic: String,
    /// Its partition.
    pub partition: i32,
    /// The entry's offset there.
    pub offset: i64,
}

/// What [`Sink::send`] returns: where the entry went, or why it never will.
pub type SendFuture = Pin<Box<dyn Future<Output = Result<Acked, SendError>> + Send>>;

/// Why a changelog entry will never be acknowledged (the store then fails the
/// write: no offset may move past it).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The changelog topic or partition is not there: deleted under the service.
    #[error(
        "changelog topic {changelog_topic} (partition {partition}) does not exist: was it deleted? Its records are \
         gone from Kafka; outboxd stopped rather than go on without them. Restart to recreate it empty (instances \
         that never had its records no longer know those events as handled)"
    )]
    Gone {
        /// The changelog topic.
        changelog_topic: String,
        /// Its partition.
        partition: i32,
    },
    /// The brokers refused the entry for good (no resend can cure it).
    #[error("{changelog_topic}/{partition}: {error}")]
    Refused {
        /// The changelog topic.
        changelog_topic: String,
        /// Its partition.
        partition: i32,
        /// What the client said.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No acknowledgement came within the bound a command sets.
    #[error("no acknowledgement from the brokers within {within:?} (store.changelog.delivery_timeout)")]
    Unanswered {
        /// The bound (`store.changelog.delivery_timeout`).
        within: Duration,
    },
    /// The send ended without an answer (it panicked, or the runtime stopped it).
    #[error("the changelog send ended without an answer from the brokers")]
    Abandoned,
}

/// Writes changelog entries. Answers once the broker acknowledged the entry, or
/// with the reason it never will (then the store fails: no offset may move).
pub trait Sink: Send + Sync {
    /// Sends `entry` to the changelog partition of its source partition.
    fn send(&self, entry: Entry) -> SendFuture;

    /// Sends `entry` once and tells `settling` what became of it, without a
    /// future of its own (a final record's path: see [`settling`]). By default
    /// through [`Sink::send`] on a task of the runtime.
    fn send_settling(&self, entry: Entry, settling: Arc<Settling>) {
        let sent = self.send(entry);
        // However the task ends (a panic in the send, the runtime dropping it), the
        // writer hears of it: a send that never answers would hold its event for ever.
        let mut unanswered = settling::Unanswered::new(settling);
        tokio::spawn(async move {
            unanswered.deliver(match sent.await {
                Ok(acked) => Delivered::Acked(acked),
                Err(e) => Delivered::Failed(e),
            })
        });
    }

    /// Sends `entry` again after an attempt of [`Sink::send_settling`] came back
    /// [`Delivered::Again`]. By default [`Sink::send`].
    fn send_again(&self, entry: Entry) -> SendFuture {
        self.send(entry)
    }
}

/// One record read from a changelog partition.
#[derive(Debug, Clone)]
pub struct ChangelogRecord {
    /// Its offset in the changelog partition.
    pub offset: i64,
    /// Its key ([`entry_key`]).
    pub key: Vec<u8>,
    /// Its value ([`entry_value`]); `None`: a tombstone (the record is gone).
    pub value: Option<Vec<u8>>,
    /// Its [`mac::HEADER`], if it has one ([`mac::Keys::check`]).
    pub mac: Option<Vec<u8>>,
}

/// Meta key prefix of a checkpoint: `changelog:` + changelog topic + 0x00 + partition (BE).
const CHECKPOINT_PREFIX: &[u8] = b"changelog:";
/// After the event key, the dedup scope follows (when it is not the source topic).
const SCOPE_TAG: u8 = 0x01;
const VALUE_VERSION: u8 = 1;
/// Acknowledged offsets kept waiting for a gap below them (someone else wrote
/// there): past this, the checkpoint stops following until the next restore.
const MAX_ACKED_AHEAD: usize = 100_000;
/// The largest message copy a changelog record carries (a held chain's records):
/// half of librdkafka's and the brokers' default 1 MB message limit, so that the
/// record, its key and its headers always fit. A larger copy stays on the instance
/// that kept it; another owner records that event dead when its chain reaches it.
pub const MAX_COPY_BYTES: usize = 512 * 1024;
/// Ids standing for the texts of a changelog value (see [`Texts`]).
const TOPIC_ID: u32 = 1;
const EVENT_TYPE_ID: u32 = 2;

#[derive(Debug, Default)]
struct Checkpoint {
    /// Every changelog offset below this is applied to the local store.
    next: i64,
    /// This instance owns the partition and restored it: its own acknowledged
    /// writes move `next` while they are contiguous.
    following: bool,
    /// Acknowledged offsets above `next`, waiting for the ones below.
    acked: BTreeSet<i64>,
    /// Changed since the last group commit.
    dirty: bool,
}

/// Checkpoints of the changelog partitions this store holds records of.
#[derive(Default)]
pub struct Checkpoints {
    /// By changelog topic, then partition (looked up by `&str`: no key is built per acknowledgement).
    parts: Mutex<HashMap<String, HashMap<i32, Checkpoint>>>,
}

fn checkpoint_key(topic: &str, partition: i32) -> Vec<u8> {
    [CHECKPOINT_PREFIX, topic.as_bytes(), &[0], &partition.to_be_bytes()].concat()
}

impl Checkpoints {
    fn open(meta: &sled::Tree) -> Result<Checkpoints, StoreError> {
        let mut parts = HashMap::new();
        for item in meta.scan_prefix(CHECKPOINT_PREFIX) {
            let (k, v) = item?;
            let rest = &k[CHECKPOINT_PREFIX.len()..];
            let Some(split) = rest.len().checked_sub(5).filter(|&i| rest[i] == 0) else { continue };
            let (Ok(topic), Ok(p), Ok(next)) = (
                std::str::from_utf8(&rest[..split]),
                <[u8; 4]>::try_from(&rest[split + 1..]),
                <[u8; 8]>::try_from(v.as_ref()),
            ) else {
                continue;
            };
            let cp = Checkpoint { next: i64::from_be_bytes(next), ..Checkpoint::default() };
            parts.entry(topic.to_owned()).or_insert_with(HashMap::new).insert(i32::from_be_bytes(p), cp);
        }
        Ok(Checkpoints { parts: Mutex::new(parts) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<i32, Checkpoint>>> {
        self.parts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, topic: &str, partition: i32) -> Option<i64> {
        self.lock().get(topic).and_then(|t| t.get(&partition)).map(|c| c.next)
    }

    fn set(&self, topic: &str, partition: i32, next: i64, following: bool) {
        let mut parts = self.lock();
        let cp = parts.entry(topic.to_owned()).or_default().entry(partition).or_default();
        *cp = Checkpoint { next, following, acked: BTreeSet::new(), dirty: true };
    }

    /// This instance's write landed at `offset`.
    fn acked(&self, topic: &str, partition: i32, offset: i64) {
        let mut parts = self.lock();
        let Some(cp) = parts.get_mut(topic).and_then(|t| t.get_mut(&partition)).filter(|c| c.following) else {
            return;
        };
        if offset < cp.next {
            return;
        }
        cp.acked.insert(offset);
        while cp.acked.first() == Some(&cp.next) {
            cp.acked.pop_first();
            cp.next += 1;
            cp.dirty = true;
        }
        if cp.acked.len() > MAX_ACKED_AHEAD {
            tracing::warn!(changelog_topic = topic, partition, checkpoint = cp.next,
                "changelog offsets below this instance's writes were written by another; the checkpoint stays until the next restore reads them");
            cp.following = false;
            cp.acked.clear();
        }
    }

    /// Where a followed partition is (`None` when it is not followed: not
    /// restored here, or it stopped following), and the offsets above it this
    /// instance wrote.
    fn followed(&self, topic: &str, partition: i32) -> Option<(i64, BTreeSet<i64>)> {
        let parts = self.lock();
        parts.get(topic).and_then(|t| t.get(&partition)).filter(|c| c.following).map(|c| (c.next, c.acked.clone()))
    }

    /// Everything below `next` is applied (others' writes read, this instance's
    /// own acknowledged): the checkpoint moves there, and on over own writes above.
    fn caught_up(&self, topic: &str, partition: i32, next: i64) {
        let mut parts = self.lock();
        let Some(cp) = parts.get_mut(topic).and_then(|t| t.get_mut(&partition)).filter(|c| c.following) else {
            return;
        };
        if next > cp.next {
            cp.next = next;
            cp.acked = cp.acked.split_off(&next);
            cp.dirty = true;
        }
        while cp.acked.first() == Some(&cp.next) {
            cp.acked.pop_first();
            cp.next += 1;
            cp.dirty = true;
        }
    }

    /// Writes the checkpoints that moved (with each group commit, before its flush:
    /// every record they cover was written before).
    pub fn persist(&self, meta: &sled::Tree) -> Result<(), sled::Error> {
        let mut parts = self.lock();
        for (topic, partition, cp) in
            parts.iter_mut().flat_map(|(t, ps)| ps.iter_mut().map(move |(p, c)| (t, p, c))).filter(|(_, _, c)| c.dirty)
        {
            meta.insert(checkpoint_key(topic, *partition), &cp.next.to_be_bytes()[..])?;
            cp.dirty = false;
        }
        Ok(())
    }
}

/// The store's changelog state: where entries go (once the service attached a
/// sink) and the checkpoints.
pub struct Changelog {
    sink: RwLock<Option<Arc<dyn Sink>>>,
    pub(crate) checkpoints: Arc<Checkpoints>,
    /// µs: restored records older than this are expired already and not written
    /// (the retention plus the clock skew allowed between instances: the age is
    /// the restorer's clock minus the writer's).
    pub(super) retention_us: i64,
    /// µs: how far instances' clocks may differ (`store.changelog.max_clock_skew`):
    /// a record without a version is stale only when it was written more than this
    /// before the record held for its key (`changelog::apply`, `Written`).
    pub(super) skew_us: i64,
    /// The changelog has every record of this store (`publish`): cleared at the
    /// first write made without a sink.
    pub(super) complete: AtomicBool,
    /// A copy into the changelog (`publish`) left its cursor in the meta tree: a
    /// write without a sink removes it (known here, so a write does not look).
    pub(super) publishing: AtomicBool,
}

impl Changelog {
    pub(crate) fn open(meta: &sled::Tree, retention: Duration, skew: Duration) -> Result<Changelog, StoreError> {
        let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Ok(Changelog {
            sink: RwLock::new(None),
            checkpoints: Arc::new(Checkpoints::open(meta)?),
            retention_us: us(retention).saturating_add(us(skew)),
            skew_us: us(skew),
            complete: AtomicBool::new(super::publish::complete_at_open(meta)?),
            publishing: AtomicBool::new(super::publish::publishing_at_open(meta)?),
        })
    }

    pub(super) fn sink(&self) -> Option<Arc<dyn Sink>> {
        self.sink.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The texts a changelog value carries stand in for the store's small ids.
struct Texts<'a> {
    topic: &'a str,
    event_type: Option<&'a str>,
}

impl NameIds for Texts<'_> {
    fn id(&self, name: &str) -> Result<u32, StoreError> {
        Ok(if Some(name) == self.event_type { EVENT_TYPE_ID } else { TOPIC_ID })
    }
    fn name(&self, id: u32) -> String {
        match id {
            EVENT_TYPE_ID => self.event_type.unwrap_or_default().to_owned(),
            _ => self.topic.to_owned(),
        }
    }
}

/// The changelog key of a record (its scope is the source topic unless it says otherwise).
pub fn entry_key(r: &Record) -> Vec<u8> {
    let mut key = keys::event_key(&r.event_id);
    if let Some(scope) = r.scope.as_deref().filter(|s| *s != r.topic) {
        key.push(SCOPE_TAG);
        key.extend_from_slice(scope.as_bytes());
    }
    key.into_vec()
}

/// The changelog value of a record: self-contained, times absolute.
pub fn entry_value(r: &Record) -> Result<Vec<u8>, StoreError> {
    entry_value_with_copy(r, None)
}

/// [`entry_value`], followed by a message copy (as `messages` keeps it) when there is one.
pub fn entry_value_with_copy(r: &Record, copy: Option<&[u8]>) -> Result<Vec<u8>, StoreError> {
    let event_type = r.event_type.as_deref();
    let local = Record { duplicates: 0, expires_at_us: None, ..r.clone() };
    let mut out = vec![VALUE_VERSION];
    varint::put_bytes(&mut out, event_type.unwrap_or_default().as_bytes());
    out.extend(format::encode(&local, &Texts { topic: &r.topic, event_type }, 0)?);
    if let Some(copy) = copy {
        varint::put_bytes(&mut out, copy);
    }
    Ok(out)
}

/// The length of the event key at the start of a changelog key (see `keys`: a tag,
/// then 16 bytes of a UUID, or the id's bytes with 0x00 escaped, ended by `00 00`).
fn event_key_len(key: &[u8]) -> Option<usize> {
    match *key.first()? {
        1 | 2 => (key.len() >= 17).then_some(17),
        3 => {
            let mut i = 1;
            loop {
                match (key.get(i)?, key.get(i + 1)) {
                    (0, Some(0)) => return Some(i + 2),
                    (0, Some(0xFF)) => i += 2,
                    (0, _) => return None,
                    _ => i += 1,
                }
            }
        }
        _ => None,
    }
}

/// A changelog key read back: the event key, the event id and the scope (`None`: the source topic).
fn split_key(key: &[u8]) -> Option<(&[u8], String, Option<String>)> {
    let (event_key, scope) = key_parts(key)?;
    let (id, _) = keys::split(&keys::record_key(event_key, keys::LEGACY_SCOPE))?;
    Some((event_key, id, scope))
}

/// [`split_key`] without the event id (formatting it is a restore's largest cost
/// per record after decoding): the event key is checked for its shape only.
fn key_parts(key: &[u8]) -> Option<(&[u8], Option<String>)> {
    let n = event_key_len(key)?;
    let (event_key, rest) = key.split_at(n);
    let scope = match rest.split_first() {
        None => None,
        Some((&SCOPE_TAG, scope)) => Some(String::from_utf8(scope.to_vec()).ok()?),
        Some(_) => return None,
    };
    Some((event_key, scope))
}

/// A changelog value read back for an event of `source_topic`.
#[cfg(any(test, feature = "internals"))]
pub fn decode_entry(source_topic: &str, key: &[u8], value: &[u8]) -> Result<Record, StoreError> {
    decode_entry_with_copy(source_topic, key, value).map(|(r, _)| r)
}

/// [`decode_entry`], and the message copy the value carries, if any (a held chain's record).
pub fn decode_entry_with_copy(
    source_topic: &str,
    key: &[u8],
    value: &[u8],
) -> Result<(Record, Option<Vec<u8>>), StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt { id: format!("{key:02x?}"), error: what.to_owned() };
    let (event_key, scope) = key_parts(key).ok_or_else(|| match key.first() {
        // An entry of a kind a newer release writes (one that is not a record): skipped, never applied.
        Some(1..=3) | None => corrupt("malformed changelog key"),
        Some(_) => corrupt("changelog key of a kind this release does not know (written by a newer outboxd?)"),
    })?;
    let (&version, rest) = value.split_first().ok_or_else(|| corrupt("empty changelog value"))?;
    if version != VALUE_VERSION {
        return Err(corrupt("changelog value of an unknown version (written by a newer outboxd?)"));
    }
    let mut reader = Reader(rest);
    let event_type = reader.text().ok_or_else(|| corrupt("malformed changelog value"))?;
    let texts = Texts { topic: source_topic, event_type: Some(&event_type) };
    // The event id comes from the key (a malformed one fails here).
    let (mut r, rest) =
        format::decode_with_rest(&keys::record_key(event_key, keys::LEGACY_SCOPE), reader.0, &texts, 0, None)?;
    r.scope = Some(scope.unwrap_or_else(|| source_topic.to_owned()));
    let copy = match rest {
        [] => None,
        rest => Some(Reader(rest).bytes().ok_or_else(|| corrupt("malformed message copy"))?.to_vec()),
    };
    Ok((r, copy))
}

impl Store {
    /// From now on final records (and durable claims, see [`Store::log_claim`])
    /// also go to the changelog through `sink`.
    pub fn attach_changelog(&self, sink: Arc<dyn Sink>) {
        *self.changelog.sink.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sink);
    }

    /// A changelog sink is attached ([`Store::attach_changelog`]).
    pub(crate) fn has_changelog(&self) -> bool {
        self.changelog.sink().is_some()
    }

    /// The next offset to restore of a changelog partition (`None`: never restored here).
    pub(in crate::store) fn checkpoint(&self, changelog_topic: &str, partition: i32) -> Option<i64> {
        self.changelog.checkpoints.get(changelog_topic, partition)
    }

    /// Waits until `r`, just written, is durable here and, with a changelog,
    /// acknowledged there: both at once, so the broker's round trip and the
    /// local flush overlap, and the writer is woken once, when both are in
    /// ([`Settling`]). An attempt the client gave up on is sent again (and again)
    /// until the broker takes it or never will.
    pub(super) async fn settle(&self, r: &Record) -> Result<(), StoreError> {
        let Some(sink) = self.changelog.sink() else {
            self.written_without_changelog()?;
            return self.durable().await;
        };
        let settling = Settling::new();
        sink.send_settling(self.entry(Change::Now(r))?, settling.clone());
        self.sync.durable_then(settling.clone()).await;
        let (local, delivered) = settling.settled().await;
        local.map_err(StoreError::Sync)?;
        let acked = match delivered {
            Delivered::Acked(acked) => acked,
            Delivered::Failed(e) => return Err(StoreError::Changelog(e)),
            Delivered::Again => sink.send_again(self.entry(Change::Now(r))?).await.map_err(StoreError::Changelog)?,
        };
        self.acknowledged(Some(acked));
        Ok(())
    }

    /// A repair a person made: `change` goes to the changelog first (when one is
    /// attached) and only once the broker acknowledged it does `write` change the
    /// local store, which answers when that is durable. This order never loses a
    /// repair: if the broker does not take it, nothing changed anywhere and the
    /// repair can be made again; if the local write fails after the broker took
    /// it, the changelog (which every owner of the partition restores) has it, and
    /// the local record is still there to repair again. The other order could leave
    /// the local record gone and the changelog without its tombstone, a repair no
    /// command can repeat.
    pub(super) async fn settle_entry<T>(
        &self,
        change: Change<'_>,
        write: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let acked = match self.send_change(change)? {
            Some(sent) => Some(sent.await.map_err(StoreError::Changelog)?),
            None => None,
        };
        let done = write()?;
        self.durable().await?;
        self.acknowledged(acked);
        Ok(done)
    }

    /// Sends `change` to the changelog, when one is attached; without one, the
    /// changelog no longer has every record (`publish`).
    pub(super) fn send_change(&self, change: Change<'_>) -> Result<Option<SendFuture>, StoreError> {
        let Some(sink) = self.changelog.sink() else {
            self.written_without_changelog()?;
            return Ok(None);
        };
        Ok(Some(sink.send(self.entry(change)?)))
    }

    /// The changelog entry of `change`.
    fn entry(&self, change: Change<'_>) -> Result<Entry, StoreError> {
        let (r, value) = match change {
            Change::Now(r) if r.in_chain() => {
                (r, Some(entry_value_with_copy(r, self.copy_for_changelog(r)?.as_deref())?))
            }
            Change::Now(r) => (r, Some(entry_value(r)?)),
            Change::Gone(r) => (r, None),
        };
        Ok(Entry { topic: r.topic.clone(), partition: r.partition, key: entry_key(r), value })
    }

    /// This instance's write is acknowledged (and durable here): the checkpoint may follow it.
    pub(super) fn acknowledged(&self, acked: Option<Acked>) {
        if let Some(a) = acked {
            self.changelog.checkpoints.acked(&a.changelog_topic, a.partition, a.offset);
        }
    }

    /// Puts a durable claim into the changelog too (before its handler runs), so
    /// that a new owner of the partition finds the outcome uncertain. Without a
    /// changelog, nothing to do.
    pub(in crate::store) async fn log_claim(&self, claimed: &Claimed) -> Result<(), StoreError> {
        if self.has_changelog() {
            self.settle(&claimed.record).await?;
        }
        Ok(())
    }

    /// Applies records read from a changelog partition of `source_topic` to the
    /// local store (not yet durable: see [`Store::restored_to`]). A record replaces
    /// the local one, except that a final local record is never turned back into a
    /// claim and a record older than the local one (`apply::Written`) is refused;
    /// expired ones are not written. Returns how many were applied. (The store's
    /// tests; a read applies batches with `collapse` and `apply_collapsed`, the same path.)
    #[cfg(test)]
    pub(in crate::store) fn apply_changelog(
        &self,
        source_topic: &str,
        records: &[ChangelogRecord],
    ) -> Result<u64, StoreError> {
        self.apply_restoring(source_topic, records, &mut Restoring::looking_up())
    }

    /// [`Store::apply_changelog`] record by record, each looked up on its own: for
    /// stores that may still hold records under keys without a scope.
    fn apply_one_by_one(
        &self,
        source_topic: &str,
        records: &[ChangelogRecord],
        restoring: &mut Restoring,
    ) -> Result<u64, StoreError> {
        let now = now_us();
        let mut applied = 0;
        for rec in records {
            if super::audit::is_audit_key(&rec.key) {
                if let Some(value) = &rec.value {
                    applied += u64::from(self.apply_audit(&rec.key, value, now)?);
                }
                continue;
            }
            let Some(value) = &rec.value else {
                if self.apply_tombstone(source_topic, &rec.key)? {
                    applied += 1;
                }
                continue;
            };
            let Some((mut r, copy)) = self.live_entry(source_topic, rec, value, now) else { continue };
            let scope = r.scope.clone().unwrap_or_default();
            let found = self.find_in(&scope, &r.event_id)?;
            let key = self.key_of(&r)?;
            if let Some(f) = &found {
                let (written, held) = (apply::Written::of(&r), apply::Written::of(&f.record));
                if written.is_older(held, self.changelog.skew_us) {
                    let replay = restoring.wrote_every_record_of(r.scope.as_deref());
                    restoring.refused.push(
                        &key,
                        apply::Refused::new(source_topic, rec.offset, &r, written, held),
                        replay,
                    );
                    continue;
                }
                if f.record.state.is_final() && r.state == State::Claimed {
                    continue;
                }
                r.duplicates = f.record.duplicates;
            }
            let to = self.slices.slice_for(r.updated_at_us)?;
            let to = self.write(&r, found.as_ref().map(|f| (&f.slice, f.record.state)), Some(to))?;
            if let Some(copy) = copy {
                self.keep_copy(&super::messages::copy_key(to.start, &key), &copy, &r)?;
            }
            restoring.refused.applied(&key, r.version, rec.offset);
            applied += 1;
        }
        restoring.refused.report_batch();
        Ok(applied)
    }

    /// A changelog record's value decoded, with the message copy it carries (a held
    /// chain's record), unless it is malformed (skipped with a warning) or its
    /// retention ended before `now` (expired records are not written).
    pub(super) fn live_entry(
        &self,
        source_topic: &str,
        rec: &ChangelogRecord,
        value: &[u8],
        now: i64,
    ) -> Option<(Record, Option<Vec<u8>>)> {
        let (r, copy) = match decode_entry_with_copy(source_topic, &rec.key, value) {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, topic = source_topic, offset = rec.offset, "changelog record skipped");
                return None;
            }
        };
        (r.updated_at_us.saturating_add(self.changelog.retention_us) > now).then_some((r, copy))
    }

    /// A tombstone: the record is gone everywhere.
    fn apply_tombstone(&self, source_topic: &str, key: &[u8]) -> Result<bool, StoreError> {
        let Some((_, id, scope)) = split_key(key) else { return Ok(false) };
        let Some(f) = self.find_in(scope.as_deref().unwrap_or(source_topic), &id)? else { return Ok(false) };
        self.chained(&f.key, None, || {
            f.slice.remove(&f.key)?;
            self.messages.remove(&super::messages::copy_key(f.slice.start, &f.key))?;
            f.slice.moved(Some(f.record.state), None);
            Ok(())
        })?;
        Ok(true)
    }

    /// A changelog partition this instance owns and restored: its checkpoint, and
    /// the offsets above it that this instance wrote itself. `None` when it is not
    /// followed. Used to catch up with what other instances wrote there (a repair
    /// made on another instance): offsets from the checkpoint up that are not in the set.
    pub(in crate::store) fn followed_checkpoint(
        &self,
        changelog_topic: &str,
        partition: i32,
    ) -> Option<(i64, BTreeSet<i64>)> {
        self.changelog.checkpoints.followed(changelog_topic, partition)
    }

    /// Others' records below `next` of a followed changelog partition are applied
    /// ([`Store::apply_changelog`]): the checkpoint moves there (and on over this
    /// instance's own acknowledged writes), durably with them.
    pub(in crate::store) async fn caught_up_to(
        &self,
        changelog_topic: &str,
        partition: i32,
        next: i64,
    ) -> Result<(), StoreError> {
        self.changelog.checkpoints.caught_up(changelog_topic, partition, next);
        self.durable().await
    }

    /// Records up to `next` (exclusive) of a changelog partition are applied: the
    /// checkpoint moves, durably with them. `done`: the restore reached the end,
    /// and from now on this instance's own acknowledged writes move it further.
    pub(in crate::store) async fn restored_to(
        &self,
        changelog_topic: &str,
        partition: i32,
        next: i64,
        done: bool,
    ) -> Result<(), StoreError> {
        self.changelog.checkpoints.set(changelog_topic, partition, next, done);
        self.durable().await
    }
}

mod apply;
mod runs;
pub use apply::{Collapsed, Restoring};

pub mod mac;
pub mod settling;
pub use settling::{Delivered, Settling};

#[cfg(test)]
pub(in crate::store) mod tests;

#[cfg(test)]
mod apply_tests;
