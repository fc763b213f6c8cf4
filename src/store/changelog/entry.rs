//! A changelog entry: its key and value (the format the module docs describe),
//! the entry on its way, and where the broker put it.

use std::sync::Arc;

use crate::store::disk::format::{self, Fields, NameIds};
use crate::store::disk::keys;
use crate::store::disk::record::Record;
use crate::store::disk::varint::{self, Reader};
use crate::store::error::StoreError;

/// A record on its way to the changelog topic of `topic` (the source topic).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The source topic: the entry goes to its changelog topic (the store's shared name).
    pub topic: Arc<str>,
    /// The source partition: the entry goes to the changelog partition of that number.
    pub partition: i32,
    /// The record's changelog key ([`entry_key`]).
    pub key: Vec<u8>,
    /// `None`: a tombstone (the record is gone).
    pub value: Option<Vec<u8>>,
}

/// What a write did to a record, as the changelog is told.
#[derive(Debug, Clone, Copy)]
pub(in crate::store) enum Change<'a> {
    /// The record is now this.
    Now(&'a Record),
    /// The record is gone (a tombstone under its key).
    Gone(&'a Record),
}

/// Where the broker put an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// The changelog topic (shared: one allocation per topic, not per record).
    pub changelog_topic: Arc<str>,
    /// Its partition.
    pub partition: i32,
    /// The entry's offset there.
    pub offset: i64,
}

/// One record read from a changelog partition.
#[derive(Debug, Clone, Default)]
pub struct ChangelogRecord {
    /// Its offset in the changelog partition.
    pub offset: i64,
    /// Its key ([`entry_key`]).
    pub key: Vec<u8>,
    /// Its value ([`entry_value`]); `None`: a tombstone (the record is gone).
    pub value: Option<Vec<u8>>,
    /// Its [`mac::HEADER`](super::mac::HEADER), if it has one ([`mac::Keys::check`](super::mac::Keys::check)).
    pub mac: Option<MacHeader>,
}

/// A MAC header's value: held inline up to [`mac::MAC_BYTES`](super::mac::MAC_BYTES),
/// the length outboxd writes (a restore read one allocation per record for it).
pub type MacHeader = smallvec::SmallVec<[u8; 18]>;

/// After the event key, the dedup scope follows (when it is not the source topic).
pub(in crate::store) const SCOPE_TAG: u8 = 0x01;
pub(in crate::store) const VALUE_VERSION: u8 = 1;
/// The largest message copy a changelog record carries (a held chain's records):
/// half of librdkafka's and the brokers' default 1 MB message limit, so that the
/// record, its key and its headers always fit. A larger copy stays on the instance
/// that kept it; another owner records that event dead when its chain reaches it.
pub const MAX_COPY_BYTES: usize = 512 * 1024;
/// Ids standing for the texts of a changelog value (see [`Texts`]).
const TOPIC_ID: u32 = 1;
const EVENT_TYPE_ID: u32 = 2;

/// The texts a changelog value carries stand in for the store's small ids.
struct Texts<'a> {
    pub(in crate::store) topic: &'a str,
    pub(in crate::store) event_type: Option<&'a str>,
}

impl NameIds for Texts<'_> {
    fn id(&self, name: &str) -> Result<u32, StoreError> {
        Ok(if Some(name) == self.event_type { EVENT_TYPE_ID } else { TOPIC_ID })
    }
    fn name(&self, id: u32) -> Arc<str> {
        match id {
            EVENT_TYPE_ID => self.event_type.unwrap_or_default().into(),
            _ => self.topic.into(),
        }
    }
}

/// The changelog key of a record (its scope is the source topic unless it says otherwise).
pub fn entry_key(r: &Record) -> Vec<u8> {
    let mut key = keys::event_key(&r.event_id);
    if let Some(scope) = r.scope.as_deref().filter(|s| *s != &*r.topic) {
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
    // Its duplicates are this instance's count, not the changelog's.
    let record = format::encode_counting(r, &Texts { topic: &r.topic, event_type }, 0, 0)?;
    let event_type = event_type.unwrap_or_default().as_bytes();
    // Sized once (a length is at most 10 bytes as a varint): grown from one byte, the
    // value was reallocated four or five times per record.
    let mut out = Vec::with_capacity(1 + 10 + event_type.len() + record.len() + copy.map_or(0, |c| 10 + c.len()));
    out.push(VALUE_VERSION);
    varint::put_bytes(&mut out, event_type);
    out.extend_from_slice(&record);
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
pub(in crate::store) fn split_key(key: &[u8]) -> Option<(&[u8], Arc<str>, Option<String>)> {
    let (event_key, scope) = key_parts(key)?;
    let (id, _) = keys::split(&keys::record_key(event_key, keys::LEGACY_SCOPE))?;
    Some((event_key, id, scope))
}

/// [`split_key`] without the event id (formatting it is a restore's largest cost
/// per record after decoding): the event key is checked for its shape only.
pub(in crate::store) fn key_parts(key: &[u8]) -> Option<(&[u8], Option<String>)> {
    let n = event_key_len(key)?;
    let (event_key, rest) = key.split_at(n);
    let scope = match rest.split_first() {
        None => None,
        Some((&SCOPE_TAG, scope)) => Some(String::from_utf8(scope.to_vec()).ok()?),
        Some(_) => return None,
    };
    Some((event_key, scope))
}

/// Why `key` is not a record's changelog key.
fn key_error(key: &[u8]) -> StoreError {
    let error = match key.first() {
        Some(1..=3) | None => "malformed changelog key",
        // An entry of a kind a newer release writes (one that is not a record): skipped, never applied.
        Some(_) => "changelog key of a kind this release does not know (written by a newer outboxd?)",
    };
    corrupt(key, error)
}

/// A changelog value read without decoding it into a [`Record`] (a restore writes
/// most records straight from it: [`Peeked::local`]).
pub(in crate::store) struct Peeked<'v> {
    pub(in crate::store) fields: Fields<'v>,
    /// The record's bytes (what `fields` were read from).
    record: &'v [u8],
    event_type: &'v str,
    /// The message copy the value carries (a held chain's record).
    pub(in crate::store) copy: Option<&'v [u8]>,
}

/// A changelog record's key and value read as [`decode_entry_with_copy`] reads them,
/// with the same checks, without decoding them.
pub(in crate::store) fn peek_entry<'v>(key: &[u8], value: &'v [u8]) -> Result<Peeked<'v>, StoreError> {
    let (event_key, _) = key_parts(key).ok_or_else(|| key_error(key))?;
    if event_key.first() == Some(&keys::TAG_BYTES) {
        keys::split(&keys::record_key(event_key, keys::LEGACY_SCOPE)).ok_or_else(|| corrupt(key, "malformed key"))?;
    }
    peek_value(key, value)
}

/// [`peek_entry`] without checking the key (again).
pub(in crate::store) fn peek_value<'v>(key: &[u8], value: &'v [u8]) -> Result<Peeked<'v>, StoreError> {
    let (&version, rest) = value.split_first().ok_or_else(|| corrupt(key, "empty changelog value"))?;
    if version != VALUE_VERSION {
        return Err(corrupt(key, "changelog value of an unknown version (written by a newer outboxd?)"));
    }
    let mut reader = Reader(rest);
    let event_type = reader.bytes().and_then(|b| std::str::from_utf8(b).ok());
    let event_type = event_type.ok_or_else(|| corrupt(key, "malformed changelog value"))?;
    let (fields, rest) = Fields::read(reader.0, 0).ok_or_else(|| corrupt(key, "malformed record"))?;
    let record = &reader.0[..reader.0.len() - rest.len()];
    let copy = match rest {
        [] => None,
        rest => Some(Reader(rest).bytes().ok_or_else(|| corrupt(key, "malformed message copy"))?),
    };
    Ok(Peeked { fields, record, event_type, copy })
}

/// A changelog record under `key` that cannot be read, and `why`.
fn corrupt(key: &[u8], why: &str) -> StoreError {
    StoreError::Corrupt { id: format!("{key:02x?}"), error: why.to_owned() }
}

impl Peeked<'_> {
    /// The record as the store keeps it in a slice that starts at `slice_start_us`
    /// (the value [`format::encode`] makes of the record [`decode_entry`] reads, its
    /// duplicates set to `duplicates`), with `names` giving the ids of the source
    /// topic and event type.
    pub(in crate::store) fn local(
        &self,
        source_topic: &str,
        names: &impl NameIds,
        slice_start_us: i64,
        duplicates: u64,
    ) -> Result<Vec<u8>, StoreError> {
        // As `Texts` names them.
        let name = |id| if id == EVENT_TYPE_ID { self.event_type } else { source_topic };
        self.fields.write(slice_start_us, duplicates, |id| names.id(name(id)))
    }
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
    // Every check is `peek_entry`'s.
    let peeked = peek_entry(key, value)?;
    let (event_key, scope) = key_parts(key).ok_or_else(|| key_error(key))?;
    let texts = Texts { topic: source_topic, event_type: Some(peeked.event_type) };
    // The event id comes from the key.
    let mut r = format::decode(&keys::record_key(event_key, keys::LEGACY_SCOPE), peeked.record, &texts, 0, None)?;
    r.scope = Some(scope.map_or_else(|| source_topic.into(), Arc::from));
    Ok((r, peeked.copy.map(<[u8]>::to_vec)))
}

