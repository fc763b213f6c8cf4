//! The compact record format: the value stored under a record key (and the value
//! of a record in a changelog topic). About 40 bytes for a done event: varints
//! for state, times, position, attempts; small ids (`names`) for topic and event
//! type; text only for what a person reads on failed events (reason,
//! dead-letter position) and for handler outcomes that are not `http NNN`.
//!
//! Times are stored relative to one another: the last write relative to the
//! start of the record's slice, the others relative to the last write.
//!
//! `held` has no value of its own in the two state bits (all four are taken): it is
//! stored as `dead` plus the [`HELD`] flag, so a release that does not know the flag
//! reads a held event as dead (final, never run by itself, `store retry` can run it).
//! A chain's Kafka key ([`CHAIN`]) comes last, after everything earlier releases
//! read, which they leave alone.
//!
//! The record's version ([`Record::version`]) is kept in the high bits of the flags
//! ([`VERSION_SHIFT`]), not as a field of its own: earlier releases test each flag
//! they know by its bit and ignore the others, so they read a versioned record as
//! before. A field after the chain key would not do: in a changelog value, what
//! follows the record is read as its message copy. A record without those bits
//! (every record earlier releases wrote) is version 0.

use std::sync::Arc;

use super::keys;
use super::names::Names;
use super::varint::{self, Out as _, Reader};
use super::record::{Record, State};
use crate::store::error::StoreError;

/// Where the small ids of topics and event types come from: the store's
/// dictionary ([`Names`]), or a record's own texts (a changelog value).
pub trait NameIds {
    fn id(&self, name: &str) -> Result<u32, StoreError>;
    fn name(&self, id: u32) -> Arc<str>;
}

/// [`Names`], remembering the last few names asked for: a restore encodes many
/// records of one topic and a few event types, and each lookup of the dictionary
/// hashes the name and takes its lock.
pub struct Remembered<'a> {
    names: &'a Names,
    last: std::cell::RefCell<Vec<(Box<str>, u32)>>,
}

/// Names [`Remembered`] keeps.
const REMEMBERED: usize = 8;

impl<'a> Remembered<'a> {
    pub fn new(names: &'a Names) -> Remembered<'a> {
        Remembered { names, last: std::cell::RefCell::new(Vec::with_capacity(REMEMBERED)) }
    }
}

impl NameIds for Remembered<'_> {
    fn id(&self, name: &str) -> Result<u32, StoreError> {
        let mut last = self.last.borrow_mut();
        if let Some((_, id)) = last.iter().find(|(n, _)| &**n == name) {
            return Ok(*id);
        }
        let id = self.names.id(name)?;
        if last.len() == REMEMBERED {
            last.remove(0);
        }
        last.push((name.into(), id));
        Ok(id)
    }
    fn name(&self, id: u32) -> Arc<str> {
        self.names.name(id)
    }
}

impl NameIds for super::names::Loaded<'_> {
    fn id(&self, name: &str) -> Result<u32, StoreError> {
        super::names::Loaded::id(self, name)
    }
    fn name(&self, id: u32) -> Arc<str> {
        super::names::Loaded::name(self, id)
    }
}

impl NameIds for Names {
    fn id(&self, name: &str) -> Result<u32, StoreError> {
        Names::id(self, name)
    }
    fn name(&self, id: u32) -> Arc<str> {
        Names::name(self, id)
    }
}

const CLAIMED_AT: u64 = 1 << 2;
const DONE_AT: u64 = 1 << 3;
const KEY_TEXT: u64 = 1 << 4;
const KEY_UUID: u64 = 1 << 5;
const EVENT_TYPE: u64 = 1 << 6;
const REASON: u64 = 1 << 7;
const DEAD_LETTER: u64 = 1 << 8;
/// Bits 9–10: how the outcome is kept.
const OUTCOME_SHIFT: u64 = 9;
const OUTCOME_NONE: u64 = 0;
/// `http NNN`: the status as a varint.
const OUTCOME_HTTP: u64 = 1;
/// `logged` (the log handler).
const OUTCOME_LOGGED: u64 = 2;
const OUTCOME_TEXT: u64 = 3;
const LOGGED: &str = "logged";
/// With the state bits of `dead`: the event is held (see the module docs).
const HELD: u64 = 1 << 11;
/// The Kafka key of the record's chain follows, last (`Record::chain`).
const CHAIN: u64 = 1 << 12;
/// Bits 16 and up of the flags: the record's version (bits 13 to 15 stay free for
/// flags). A version up to 31 keeps the flags in 3 bytes, one more than without.
use super::record::VERSION_SHIFT;
/// The highest version the flags can carry; a record written more often stays there.
pub(in crate::store) use super::record::MAX_VERSION;

fn state_bits(s: State) -> u64 {
    match s {
        State::Claimed => 0,
        State::Done => 1,
        State::Dead => 2,
        State::Parked => 3,
        State::Held => 2 | HELD,
    }
}

fn state_of(bits: u64) -> State {
    match bits & 3 {
        0 => State::Claimed,
        1 => State::Done,
        2 if bits & HELD != 0 => State::Held,
        2 => State::Dead,
        _ => State::Parked,
    }
}

/// The state alone, without decoding the rest (counting).
pub fn state(value: &[u8]) -> Option<State> {
    Reader(value).u64().map(state_of)
}

/// A record's compact value, held inline up to the size most records take (a done
/// record with a UUID key is about 40 bytes): writing it to sled copies it anyway.
pub type Value = smallvec::SmallVec<[u8; 64]>;

/// A value's bytes gathered on the stack first: a record is mostly a run of small
/// varints, pushed a byte at a time, and a byte pushed here is a store and an add
/// (an inline buffer's push asks each time where its bytes are and whether they
/// fit). What does not fit here follows in `rest`, in order.
struct Staged {
    head: [u8; STAGED],
    len: usize,
    rest: Value,
}

/// As much as a [`Value`] holds inline: a record that fits is one copy into it.
const STAGED: usize = 64;

impl Staged {
    fn new() -> Staged {
        Staged { head: [0; STAGED], len: 0, rest: Value::new() }
    }

    fn into_value(self) -> Value {
        let mut v = Value::from_slice(&self.head[..self.len]);
        v.extend_from_slice(&self.rest);
        v
    }
}

impl varint::Out for Staged {
    fn push_byte(&mut self, b: u8) {
        match self.head.get_mut(self.len) {
            Some(at) => {
                *at = b;
                self.len += 1;
            }
            None => self.rest.push(b),
        }
    }

    fn copy(&mut self, bytes: &[u8]) {
        let here = bytes.len().min(STAGED - self.len);
        self.head[self.len..self.len + here].copy_from_slice(&bytes[..here]);
        self.len += here;
        self.rest.extend_from_slice(&bytes[here..]);
    }
}

/// `r` as stored in a slice that starts at `slice_start_us`.
pub fn encode(r: &Record, names: &impl NameIds, slice_start_us: i64) -> Result<Value, StoreError> {
    encode_counting(r, names, slice_start_us, r.duplicates)
}

/// [`encode`] with `duplicates` in place of the record's own count.
pub fn encode_counting(
    r: &Record,
    names: &impl NameIds,
    slice_start_us: i64,
    duplicates: u64,
) -> Result<Value, StoreError> {
    let mut flags = state_bits(r.state);
    let key_uuid = r.key.as_deref().and_then(keys::parse_uuid);
    flags |= match (&r.key, key_uuid) {
        (_, Some(_)) => KEY_UUID,
        (Some(_), None) => KEY_TEXT,
        (None, _) => 0,
    };
    let outcome = match r.outcome.as_deref() {
        None => (OUTCOME_NONE, None),
        Some(LOGGED) => (OUTCOME_LOGGED, None),
        Some(text) => match http_status(text) {
            Some(code) => (OUTCOME_HTTP, Some(code)),
            None => (OUTCOME_TEXT, None),
        },
    };
    flags |= outcome.0 << OUTCOME_SHIFT;
    flags |= r.version.min(MAX_VERSION) << VERSION_SHIFT;
    for (present, bit) in [
        (r.claimed_at_us.is_some(), CLAIMED_AT),
        (r.done_at_us.is_some(), DONE_AT),
        (r.event_type.is_some(), EVENT_TYPE),
        (r.reason.is_some(), REASON),
        (r.dead_letter.is_some(), DEAD_LETTER),
        (r.chain.is_some(), CHAIN),
    ] {
        if present {
            flags |= bit;
        }
    }
    let mut out = Staged::new();
    varint::put_u64(&mut out, flags);
    varint::put_u64(&mut out, u64::from(r.attempts));
    varint::put_u64(&mut out, u64::from(names.id(&r.topic)?));
    varint::put_i64(&mut out, i64::from(r.partition));
    varint::put_i64(&mut out, r.offset);
    let at = r.updated_at_us;
    varint::put_i64(&mut out, at.wrapping_sub(slice_start_us));
    varint::put_i64(&mut out, at.wrapping_sub(r.first_seen_us));
    for t in [r.claimed_at_us, r.done_at_us].into_iter().flatten() {
        varint::put_i64(&mut out, at.wrapping_sub(t));
    }
    varint::put_u64(&mut out, duplicates);
    match (outcome, r.outcome.as_deref()) {
        ((_, Some(code)), _) => varint::put_u64(&mut out, code),
        ((OUTCOME_TEXT, _), Some(text)) => varint::put_bytes(&mut out, text.as_bytes()),
        _ => {}
    }
    match (key_uuid, r.key.as_deref()) {
        (Some((bytes, upper)), _) => {
            out.push_byte(u8::from(upper));
            out.copy(&bytes);
        }
        (None, Some(key)) => varint::put_bytes(&mut out, key.as_bytes()),
        (None, None) => {}
    }
    if let Some(t) = &r.event_type {
        varint::put_u64(&mut out, u64::from(names.id(t)?));
    }
    for text in [&r.reason, &r.dead_letter].into_iter().flatten() {
        varint::put_bytes(&mut out, text.as_bytes());
    }
    if let Some(key) = &r.chain {
        varint::put_bytes(&mut out, key);
    }
    Ok(out.into_value())
}

/// The record under `key` in a slice that starts at `slice_start_us`;
/// `expires_at_us` is when that slice is dropped.
pub fn decode(
    key: &[u8],
    value: &[u8],
    names: &impl NameIds,
    slice_start_us: i64,
    expires_at_us: Option<i64>,
) -> Result<Record, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt { id: format!("{key:02x?}"), error: what.to_owned() };
    let (event_id, scope) = keys::split(key).ok_or_else(|| corrupt("malformed key"))?;
    let mut r = Reader(value);
    let mut parse = || -> Option<Record> {
        let flags = r.u64()?;
        let attempts = r.u32()?;
        let topic = names.name(r.u32()?);
        let partition = i32::try_from(r.i64()?).ok()?;
        let offset = r.i64()?;
        let at = slice_start_us.wrapping_add(r.i64()?);
        let first_seen_us = at.wrapping_sub(r.i64()?);
        let claimed_at_us = if flags & CLAIMED_AT != 0 { Some(at.wrapping_sub(r.i64()?)) } else { None };
        let done_at_us = if flags & DONE_AT != 0 { Some(at.wrapping_sub(r.i64()?)) } else { None };
        let duplicates = r.u64()?;
        let outcome = match (flags >> OUTCOME_SHIFT) & 3 {
            OUTCOME_HTTP => Some(format!("http {}", r.u64()?)),
            OUTCOME_LOGGED => Some(LOGGED.to_owned()),
            OUTCOME_TEXT => Some(r.text()?),
            _ => None,
        };
        let key = if flags & KEY_UUID != 0 {
            let upper = r.0.first()? == &1;
            let bytes: &[u8; 16] = r.0.get(1..17)?.try_into().ok()?;
            r.0 = &r.0[17..];
            Some(keys::format_uuid(bytes, upper))
        } else if flags & KEY_TEXT != 0 {
            Some(r.text()?.into())
        } else {
            None
        };
        let event_type = if flags & EVENT_TYPE != 0 { Some(names.name(r.u32()?)) } else { None };
        let reason = if flags & REASON != 0 { Some(r.text()?) } else { None };
        let dead_letter = if flags & DEAD_LETTER != 0 { Some(r.text()?) } else { None };
        let chain = if flags & CHAIN != 0 { Some(r.bytes()?.to_vec()) } else { None };
        Some(Record {
            event_id: event_id.clone(),
            scope: (scope != keys::LEGACY_SCOPE).then(|| names.name(scope)),
            state: state_of(flags),
            attempts,
            topic,
            partition,
            offset,
            key,
            event_type,
            first_seen_us,
            claimed_at_us,
            done_at_us,
            updated_at_us: at,
            outcome,
            reason,
            dead_letter,
            duplicates,
            expires_at_us,
            chain,
            version: flags >> VERSION_SHIFT,
        })
    };
    parse().ok_or_else(|| corrupt("malformed record"))
}

/// A stored value's fields, read without decoding its texts: enough to write the
/// same record into another slice, with other name ids ([`Fields::write`]), as a
/// restore does with a changelog value. Decoding into a [`Record`] of `String`s and
/// encoding it again was a fifth of a restore's CPU.
pub struct Fields<'v> {
    flags: u64,
    attempts: u32,
    topic: u32,
    partition: i64,
    offset: i64,
    /// The last write (µs).
    at_us: i64,
    /// The other times, relative to the last write, as stored.
    times: &'v [u8],
    duplicates: u64,
    /// The outcome and the Kafka key, as stored.
    middle: &'v [u8],
    event_type: Option<u32>,
    /// The reason, the dead-letter position and the chain key, as stored.
    end: &'v [u8],
}

/// The bytes `read` took since `from`.
fn taken<'v>(from: &'v [u8], read: &Reader<'v>) -> &'v [u8] {
    &from[..from.len() - read.0.len()]
}

impl<'v> Fields<'v> {
    /// The fields of a value stored in a slice that starts at `slice_start_us`, each
    /// checked as [`decode`] checks it; and the bytes after the record.
    pub fn read(value: &'v [u8], slice_start_us: i64) -> Option<(Fields<'v>, &'v [u8])> {
        let text = |r: &mut Reader<'v>| r.bytes().filter(|b| std::str::from_utf8(b).is_ok());
        let mut r = Reader(value);
        let flags = r.u64()?;
        let attempts = r.u32()?;
        let topic = r.u32()?;
        let partition = r.i64()?;
        i32::try_from(partition).ok()?;
        let offset = r.i64()?;
        let at_us = slice_start_us.wrapping_add(r.i64()?);
        let from = r.0;
        r.i64()?;
        for bit in [CLAIMED_AT, DONE_AT] {
            if flags & bit != 0 {
                r.i64()?;
            }
        }
        let times = taken(from, &r);
        let duplicates = r.u64()?;
        let from = r.0;
        match (flags >> OUTCOME_SHIFT) & 3 {
            OUTCOME_HTTP => drop(r.u64()?),
            OUTCOME_TEXT => drop(text(&mut r)?),
            _ => {}
        }
        if flags & KEY_UUID != 0 {
            r.0 = r.0.get(17..)?;
        } else if flags & KEY_TEXT != 0 {
            text(&mut r)?;
        }
        let middle = taken(from, &r);
        let event_type = if flags & EVENT_TYPE != 0 { Some(r.u32()?) } else { None };
        let from = r.0;
        for bit in [REASON, DEAD_LETTER] {
            if flags & bit != 0 {
                text(&mut r)?;
            }
        }
        if flags & CHAIN != 0 {
            r.bytes()?;
        }
        let end = taken(from, &r);
        let fields = Fields { flags, attempts, topic, partition, offset, at_us, times, duplicates, middle, event_type, end };
        Some((fields, r.0))
    }

    pub fn state(&self) -> State {
        state_of(self.flags)
    }

    /// [`Record::version`].
    pub fn version(&self) -> u64 {
        self.flags >> VERSION_SHIFT
    }

    /// [`Record::updated_at_us`].
    pub fn updated_at_us(&self) -> i64 {
        self.at_us
    }

    /// [`Record::partition`].
    pub fn partition(&self) -> i32 {
        self.partition as i32
    }

    /// [`Record::duplicates`].
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Whether the record carries a chain key ([`Record::chain`]).
    pub fn has_chain(&self) -> bool {
        self.flags & CHAIN != 0
    }

    /// The record as stored in a slice that starts at `slice_start_us`, with
    /// `duplicates`, and `id` giving the name ids of its topic and event type for the
    /// ids it has here: a value [`decode`] reads as the record these fields are, with
    /// the names the new ids stand for.
    pub fn write(
        &self,
        slice_start_us: i64,
        duplicates: u64,
        id: impl Fn(u32) -> Result<u32, StoreError>,
    ) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::with_capacity(24 + self.times.len() + self.middle.len() + self.end.len());
        varint::put_u64(&mut out, self.flags);
        varint::put_u64(&mut out, u64::from(self.attempts));
        varint::put_u64(&mut out, u64::from(id(self.topic)?));
        varint::put_i64(&mut out, self.partition);
        varint::put_i64(&mut out, self.offset);
        varint::put_i64(&mut out, self.at_us.wrapping_sub(slice_start_us));
        out.extend_from_slice(self.times);
        varint::put_u64(&mut out, duplicates);
        out.extend_from_slice(self.middle);
        if let Some(event_type) = self.event_type {
            varint::put_u64(&mut out, u64::from(id(event_type)?));
        }
        out.extend_from_slice(self.end);
        Ok(out)
    }
}

/// `http 200` → 200, for the status codes a handler reports.
fn http_status(text: &str) -> Option<u64> {
    let code = text.strip_prefix("http ")?;
    (code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit()) && !code.starts_with('0'))
        .then(|| code.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Position;

    #[test]
    fn a_done_record_takes_a_few_dozen_bytes_and_every_record_round_trips() {
        let (_dir, _db, names) = crate::store::disk::names::fresh();
        let scope = names.id("orders").unwrap();
        let id = "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
        let key = keys::record_key(&keys::event_key(id), scope);
        let position = Position { topic: "orders".into(), partition: 3, offset: 1_234_567 };
        let start = 1_700_000_000_000_000;
        let mut done = Record::first_seen(id, State::Done, 1, &position, start + 5_000_000);
        done.scope = Some("orders".into());
        done.key = Some("order-1717".into());
        done.event_type = Some("OrderCreated".into());
        done.claimed_at_us = Some(done.first_seen_us);
        done.updated_at_us += 2_345;
        done.done_at_us = Some(done.updated_at_us);
        done.outcome = Some("http 201".into());
        done.expires_at_us = Some(start + 99);
        let bytes = encode(&done, &names, start).unwrap();
        assert!(bytes.len() <= 40, "{} bytes", bytes.len());
        assert_eq!(decode(&key, &bytes, &names, start, Some(start + 99)).unwrap(), done);
        assert_eq!(state(&bytes), Some(State::Done));

        let mut dead = done.clone();
        dead.state = State::Dead;
        dead.key = Some("0190A3C4-5E6F-7A8B-9C0D-1E2F3A4B5C6D".into());
        dead.outcome = Some("verified: http 200 on lookup".into());
        dead.reason = Some("http 422: unprocessable".into());
        dead.dead_letter = Some("dlq/0@7".into());
        dead.duplicates = 3;
        dead.attempts = 7;
        let bytes = encode(&dead, &names, start).unwrap();
        assert_eq!(decode(&key, &bytes, &names, start, Some(start + 99)).unwrap(), dead);

        let mut written_again = done.clone();
        written_again.version = 3;
        let bytes = encode(&written_again, &names, start).unwrap();
        assert!(bytes.len() <= 41, "{} bytes: the version takes one more", bytes.len());
        assert_eq!(decode(&key, &bytes, &names, start, Some(start + 99)).unwrap(), written_again);

        let mut bare = Record::first_seen("x\0y", State::Claimed, 0, &position, start - 10);
        bare.outcome = Some("logged".into());
        let key = keys::record_key(&keys::event_key("x\0y"), keys::LEGACY_SCOPE);
        let bytes = encode(&bare, &names, start).unwrap();
        assert_eq!(decode(&key, &bytes, &names, start, None).unwrap(), bare);
        assert!(decode(&key, &bytes[..bytes.len() - 1], &names, start, None).is_err());
    }

    #[test]
    fn a_value_longer_than_its_stack_part_keeps_its_bytes_in_order() {
        use varint::Out;
        let (mut staged, mut plain) = (Staged::new(), Vec::new());
        for b in 0..60 {
            staged.push_byte(b);
            plain.push_byte(b);
        }
        // A piece that crosses the end of the stack part, then one after it.
        let long: Vec<u8> = (100..120).collect();
        staged.copy(&long);
        plain.copy(&long);
        staged.push_byte(7);
        plain.push_byte(7);
        assert_eq!(staged.into_value().as_slice(), plain.as_slice());
    }

    /// Earlier releases read the flags by their bits and ignore the rest: a
    /// versioned record is, to them, the record they would have written, byte for
    /// byte. What they write reads as version 0.
    #[test]
    fn a_versioned_record_is_an_unversioned_one_with_high_flag_bits_that_earlier_releases_ignore() {
        let (_dir, _db, names) = crate::store::disk::names::fresh();
        let position = Position { topic: "orders".into(), partition: 1, offset: 7 };
        let key = keys::record_key(&keys::event_key("e7"), names.id("orders").unwrap());
        let mut held = Record::first_seen("e7", State::Held, 0, &position, 1_700_000_000_000_000);
        held.scope = Some("orders".into());
        held.reason = Some("held".into());
        held.chain = Some(b"order-7".to_vec());
        let unversioned = encode(&held, &names, 0).unwrap();
        assert_eq!(decode(&key, &unversioned, &names, 0, None).unwrap().version, 0, "as earlier releases wrote it");
        for version in [1, 31, 32, 4_096, MAX_VERSION] {
            held.version = version;
            let bytes = encode(&held, &names, 0).unwrap();
            assert_eq!(decode(&key, &bytes, &names, 0, None).unwrap(), held);
            // What an earlier release reads: the flags it knows (all below VERSION_SHIFT), then the same fields.
            let mut r = Reader(&bytes);
            let flags = r.u64().unwrap();
            assert_eq!(flags >> VERSION_SHIFT, version);
            let mut seen = Vec::new();
            varint::put_u64(&mut seen, flags & ((1 << VERSION_SHIFT) - 1));
            seen.extend_from_slice(r.0);
            assert_eq!(seen, unversioned.as_slice(), "version {version}: the rest is what an earlier release wrote");
        }
        held.version = MAX_VERSION;
        held.next_version();
        assert_eq!(held.version, MAX_VERSION, "a record written more often stays at the highest version");
    }

    /// A record's fields written into another slice with other name ids decode as
    /// the same record with those names, whatever fields it has; a cut value is refused.
    #[test]
    fn fields_written_elsewhere_decode_as_the_same_record_under_their_new_names() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        let (here, there) =
            (Names::open(db.open_tree("here").unwrap()).unwrap(), Names::open(db.open_tree("there").unwrap()).unwrap());
        for name in ["padding", "orders", "OrderCreated"] {
            here.id(name).unwrap();
        }
        let position = Position { topic: "orders".into(), partition: 3, offset: 1_234_567 };
        let (from, to) = (1_700_000_000_000_000, 1_700_000_360_000_000);
        let mut done = Record::first_seen("0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d", State::Done, 2, &position, from + 9);
        done.scope = Some("orders".into());
        done.key = Some("0190A3C4-5E6F-7A8B-9C0D-1E2F3A4B5C6D".into());
        done.event_type = Some("OrderCreated".into());
        done.claimed_at_us = Some(done.first_seen_us + 1);
        done.updated_at_us += 2_345;
        done.done_at_us = Some(done.updated_at_us);
        done.outcome = Some("http 201".into());
        done.version = 9;
        let mut held = done.clone();
        held.state = State::Held;
        held.key = Some("order-7".into());
        held.outcome = Some("verified: http 200 on lookup".into());
        held.reason = Some("held behind 0@6".into());
        held.dead_letter = Some("dlq/0@7".into());
        held.chain = Some(b"order-\x007".to_vec());
        held.duplicates = 4;
        let mut bare = Record::first_seen("x\0y", State::Claimed, 0, &position, from - 10);
        bare.outcome = Some("logged".into());
        for r in [done, held, bare] {
            let key = keys::record_key(&keys::event_key(&r.event_id), keys::LEGACY_SCOPE);
            let mut value = encode(&Record { scope: None, ..r.clone() }, &here, from).unwrap();
            value.extend_from_slice(b"after");
            let (fields, rest) = Fields::read(&value, from).unwrap();
            assert_eq!(rest, b"after");
            assert_eq!((fields.state(), fields.version(), fields.updated_at_us()), (r.state, r.version, r.updated_at_us));
            assert_eq!((fields.partition(), fields.duplicates(), fields.has_chain()), (3, r.duplicates, r.chain.is_some()));
            let written = fields.write(to, 11, |id| there.id(&here.name(id))).unwrap();
            let read = decode(&key, &written, &there, to, None).unwrap();
            assert_eq!(read, Record { scope: None, duplicates: 11, ..r.clone() });
            for cut in 1..value.len() - 5 {
                let shown = Fields::read(&value[..cut], from).map(|(_, rest)| rest.len());
                assert!(shown.is_none(), "{} of {} bytes read as a record", cut, value.len() - 5);
            }
        }
    }
}
