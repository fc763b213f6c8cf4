//! Live records in memory, journaled with each group commit.
//!
//! A record written into a slice that takes live writes (the current one, or one
//! still holding records in memory) is not a sled entry of its own: it goes into
//! the slice's in-memory table ([`Table`]) and into the journal's pending bytes,
//! and the group commit writes everything pending as one sled value, a *chunk*,
//! before it flushes (`Slices::journal`). So a batch of records costs sled one
//! insert, not one each: a sled insert into a tree of records was the largest
//! single cost of an event (a leaf found and copied, a log entry written, its
//! page kept in memory), and it does not shrink for keys written in order
//! (bench/findings.md, "Live records in memory").
//!
//! A chunk holds the records of every slice written in its batch, in the order
//! they were written, and is written whole (one sled value): a crash keeps a
//! prefix of sled's log, so what it keeps of the records is what it kept before,
//! a prefix of the writes. A write to another tree that must not outlive the
//! record written before it (an index entry removed after its record changed)
//! journals what is pending first ([`Guard::cut`]).
//!
//! Records leave memory when their slice is packed: the run holds them, and the
//! slice's mark (`f` + start in the journal tree) says up to which chunk its
//! records are in runs. A chunk is removed once every slice with records in it
//! has folded it, or is gone. An open replays the chunks in order into the
//! tables, each slice's records after its mark.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};

use foldhash::fast::RandomState;

use smallvec::SmallVec;

use super::varint::{put_bytes, put_i64, Reader};

/// The tree of chunks and marks.
pub const JOURNAL_TREE: &str = "journal";
const CHUNK: u8 = b'c';
const MARK: u8 = b'f';
const CHUNK_VERSION: u8 = 1;

/// A slice's records in memory, key → value (empty: removed), newest write.
///
/// A hash table (foldhash, seeded per table): an event's write and its lookups each
/// touch a line or two of it. A B-tree of the same keys (random ids, up to
/// `store.memory_records` of them) touched a node per level: its insert was the
/// largest single item of a log drain's profile (2.8% of outboxd's samples). Key
/// order, which only a pack and the reads of many records want, is made when they
/// ask for it ([`Table::sorted_from`]): a sort of the keys' first eight bytes as
/// numbers, which order almost every pair of random ids without reading the keys.
///
/// The values are appended to one buffer, not each an allocation of its own: a
/// record costs no allocation (a key up to an `IVec`'s inline length neither), and
/// a pack lets the table go as a few large blocks, where it freed one per record
/// (0.8% of a log drain's samples). A value written over stays in the buffer (a
/// record is written into memory once or twice: its claim, when durable, and its
/// final record) until the table goes, or until what was written over is more than
/// what is current and [`COMPACT_SLACK`] besides: then the current values are copied
/// into a new buffer. A key written again and again (an event retried for hours
/// with a durable claim) cannot grow it beyond twice its current values.
#[derive(Clone, Default)]
pub struct Table {
    /// Key → where its value is in `values`.
    at: HashMap<sled::IVec, Span, RandomState>,
    values: Vec<u8>,
    /// The bytes of `values` that are current (the rest were written over).
    current: usize,
}

/// Bytes written over a [`Table`] holds before it compacts its values.
const COMPACT_SLACK: usize = 1 << 20;

/// Where a value is in a [`Table`]'s buffer.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
}

/// A key's first eight bytes as a number, zero-padded: where two numbers differ,
/// they order their keys as the keys' bytes do; where they tie, the bytes decide.
fn head(key: &[u8]) -> u64 {
    let mut first = [0u8; 8];
    let n = key.len().min(8);
    first[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(first)
}

impl Table {
    /// Sets `key`'s newest write (empty: a removal).
    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        let span = Span { start: self.values.len(), len: value.len() };
        self.values.extend_from_slice(value);
        self.current += value.len();
        // One probe: a key up to an `IVec`'s inline length is made without allocating.
        if let Some(over) = self.at.insert(key.into(), span) {
            self.current -= over.len;
            if self.values.len() - self.current > self.current + COMPACT_SLACK {
                self.compact();
            }
        }
    }

    /// Copies the current values into a buffer of their own.
    fn compact(&mut self) {
        let mut values = Vec::with_capacity(self.current);
        for span in self.at.values_mut() {
            let start = values.len();
            values.extend_from_slice(&self.values[span.start..span.start + span.len]);
            span.start = start;
        }
        self.values = values;
    }

    /// Room for `records` more keys without moving the ones it holds.
    pub fn reserve(&mut self, records: usize) {
        self.at.reserve(records);
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.at.get(key).map(|s| self.value(*s))
    }

    fn value(&self, s: Span) -> &[u8] {
        &self.values[s.start..s.start + s.len]
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Keys it holds room for without growing.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.at.capacity()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Whether it holds a record (not only removals).
    pub fn has_records(&self) -> bool {
        self.at.values().any(|s| s.len > 0)
    }

    /// Every key, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &sled::IVec> {
        self.at.keys()
    }

    /// Every entry, in key order.
    pub fn sorted(&self) -> Vec<(&[u8], &[u8])> {
        self.sorted_refs(Bound::Unbounded, None)
    }

    /// The entries from `from` on whose keys start with `prefix` (if given), in key
    /// order, copied out.
    pub fn sorted_from(&self, from: Bound<&[u8]>, prefix: Option<&[u8]>) -> Vec<(sled::IVec, sled::IVec)> {
        self.sorted_refs(from, prefix).into_iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    fn sorted_refs(&self, from: Bound<&[u8]>, prefix: Option<&[u8]>) -> Vec<(&[u8], &[u8])> {
        let wanted = |k: &[u8]| {
            let after = match from {
                Bound::Included(f) => k >= f,
                Bound::Excluded(f) => k > f,
                Bound::Unbounded => true,
            };
            after && prefix.is_none_or(|p| k.starts_with(p))
        };
        let mut entries: Vec<(u64, &[u8], Span)> =
            self.at.iter().filter(|(k, _)| wanted(k)).map(|(k, s)| (head(k), &k[..], *s)).collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        entries.into_iter().map(|(_, k, s)| (k, self.value(s))).collect()
    }

    /// `newer`'s entries take the place of this table's under the same keys.
    pub fn overlay(&mut self, newer: Table) {
        for (k, s) in &newer.at {
            self.insert(k, newer.value(*s));
        }
    }
}

impl Extend<(sled::IVec, sled::IVec)> for Table {
    fn extend<I: IntoIterator<Item = (sled::IVec, sled::IVec)>>(&mut self, entries: I) {
        for (k, v) in entries {
            self.insert(&k, &v);
        }
    }
}

/// Slices with records in a chunk (rarely more than two: the current one, and
/// the one a record moved out of).
type Starts = SmallVec<[i64; 2]>;

pub struct Journal {
    tree: sled::Tree,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Records written since the last chunk, encoded.
    pending: Vec<u8>,
    /// The slices with records in `pending`.
    pending_starts: Starts,
    /// The number of the next chunk: from 1 on (0 stands for none).
    next: u64,
    /// Chunks in the tree → the slices with records in them that have not folded them.
    chunks: BTreeMap<u64, Starts>,
}

/// The journal held: writers append under it, so that the order of the
/// in-memory writes and the order of the journal are one.
pub struct Guard<'a> {
    inner: MutexGuard<'a, Inner>,
    tree: &'a sled::Tree,
}

/// What an open reads back from the journal: per slice start, the records to put
/// back into memory, in the order they were written.
pub type Replay = BTreeMap<i64, Vec<(sled::IVec, sled::IVec)>>;

fn chunk_key(seq: u64) -> [u8; 9] {
    let mut k = [CHUNK; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn mark_key(start: i64) -> [u8; 9] {
    let mut k = [MARK; 9];
    k[1..].copy_from_slice(&start.to_be_bytes());
    k
}

fn word(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(1..9)?.try_into().ok()?))
}

fn corrupt(what: &str) -> sled::Error {
    sled::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("the journal's {what} is corrupt")))
}

impl Journal {
    /// Opens the journal and reads back what the slices in `starts` hold in it
    /// (the records of slices not among them are gone with their slice).
    pub fn open(db: &sled::Db, starts: &[i64]) -> Result<(Journal, Replay), sled::Error> {
        let tree = db.open_tree(JOURNAL_TREE)?;
        let mut marks = BTreeMap::new();
        for item in tree.scan_prefix([MARK]) {
            let (k, v) = item?;
            let (Some(start), Some(seq)) = (word(&k), v.get(..8).and_then(|b| b.try_into().ok())) else {
                return Err(corrupt("mark"));
            };
            marks.insert(start as i64, u64::from_be_bytes(seq));
        }
        let mut inner = Inner { next: 1, ..Inner::default() };
        let mut replay = Replay::default();
        let mut spent = Vec::new();
        for item in tree.scan_prefix([CHUNK]) {
            let (k, v) = item?;
            let seq = word(&k).ok_or_else(|| corrupt("chunk key"))?;
            inner.next = seq + 1;
            let mut held = Starts::new();
            for (start, key, value) in entries(&v)? {
                let folded = marks.get(&start).is_some_and(|&m| seq <= m);
                if folded || !starts.contains(&start) {
                    continue;
                }
                if !held.contains(&start) {
                    held.push(start);
                }
                replay.entry(start).or_default().push((key.into(), value.into()));
            }
            if held.is_empty() {
                spent.push(k);
            } else {
                inner.chunks.insert(seq, held);
            }
        }
        for k in spent {
            tree.remove(k)?;
        }
        for start in marks.keys().filter(|s| !starts.contains(s)) {
            tree.remove(mark_key(*start))?;
        }
        Ok((Journal { tree, inner: Mutex::new(inner) }, replay))
    }

    pub fn lock(&self) -> Guard<'_> {
        Guard { inner: self.inner.lock().unwrap_or_else(PoisonError::into_inner), tree: &self.tree }
    }

    /// Chunks in the tree.
    #[cfg(test)]
    pub fn chunks(&self) -> usize {
        self.lock().inner.chunks.len()
    }
}

impl Drop for Journal {
    /// What memory took since the last group commit goes into the journal (sled
    /// flushes it as the database closes); a store closed with `close` has none.
    fn drop(&mut self) {
        if let Err(error) = self.lock().cut() {
            tracing::warn!(%error, "could not journal the last records written before the store closed");
        }
    }
}

impl Guard<'_> {
    /// Adds a record write (an empty `value`: a removal) of the slice at `start`.
    pub fn append(&mut self, start: i64, key: &[u8], value: &[u8]) {
        let inner = &mut *self.inner;
        if inner.pending.is_empty() {
            inner.pending.push(CHUNK_VERSION);
        }
        put_i64(&mut inner.pending, start);
        put_bytes(&mut inner.pending, key);
        put_bytes(&mut inner.pending, value);
        if !inner.pending_starts.contains(&start) {
            inner.pending_starts.push(start);
        }
    }

    /// Writes what is pending as one chunk (not yet durable: the group commit's
    /// flush makes it so). Returns the number of the last chunk written (0: none
    /// yet): every record appended so far is in it or in one before.
    pub fn cut(&mut self) -> Result<u64, sled::Error> {
        let inner = &mut *self.inner;
        if !inner.pending.is_empty() {
            let seq = inner.next;
            self.tree.insert(chunk_key(seq), inner.pending.as_slice())?;
            inner.pending.clear();
            inner.chunks.insert(seq, std::mem::take(&mut inner.pending_starts));
            inner.next = seq + 1;
        }
        Ok(inner.next - 1)
    }

    /// The slice at `start` has every record it wrote up to chunk `seq` in its
    /// runs (or is gone): its mark moves there (for an open), and the chunks no
    /// slice needs any more go. The caller made the runs durable first.
    pub fn folded(&mut self, start: i64, seq: u64, gone: bool) -> Result<(), sled::Error> {
        if gone {
            self.tree.remove(mark_key(start))?;
        } else {
            self.tree.insert(mark_key(start), &seq.to_be_bytes())?;
        }
        let inner = &mut *self.inner;
        let mut spent = Vec::new();
        for (&chunk, starts) in inner.chunks.range_mut(..=seq) {
            starts.retain(|s| *s != start);
            if starts.is_empty() {
                spent.push(chunk);
            }
        }
        for chunk in spent {
            inner.chunks.remove(&chunk);
            self.tree.remove(chunk_key(chunk))?;
        }
        Ok(())
    }
}

/// A record write in a chunk: the slice's start, the key, the value.
type Written<'a> = (i64, &'a [u8], &'a [u8]);

/// The record writes of a chunk, in the order made.
fn entries(chunk: &[u8]) -> Result<Vec<Written<'_>>, sled::Error> {
    let Some((&CHUNK_VERSION, rest)) = chunk.split_first() else { return Err(corrupt("chunk")) };
    let mut r = Reader(rest);
    let mut out = Vec::new();
    while !r.is_empty() {
        match (r.i64(), r.bytes(), r.bytes()) {
            (Some(start), Some(key), Some(value)) => out.push((start, key, value)),
            _ => return Err(corrupt("chunk")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::Bound;

    use rand::{Rng, SeedableRng};

    use super::Table;

    /// Short keys, zero bytes and shared prefixes: where a comparison of the first
    /// eight bytes as a number could disagree with the bytes' own order.
    fn key(rng: &mut rand::rngs::StdRng) -> Vec<u8> {
        // Up to 40 bytes: past an IVec's inline ones too (looked up by their bytes).
        let len = rng.random_range(0..40);
        (0..len).map(|_| [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)]).collect()
    }

    /// A key written over and over keeps the buffer within twice its current values
    /// (and the slack), and every key keeps its newest value through the compactions.
    #[test]
    fn a_table_written_over_and_over_stays_small() {
        let mut table = Table::default();
        for i in 0..10u32 {
            table.insert(&i.to_be_bytes(), &[0xaa; 100]);
        }
        for round in 0..30_000u32 {
            let value = [round.to_be_bytes().as_slice(), &[0x55; 96]].concat();
            table.insert(b"retried", &value);
            assert!(table.values.len() <= 2 * table.current + super::COMPACT_SLACK + 100, "{}", table.values.len());
        }
        assert_eq!(table.current, 10 * 100 + 100);
        assert_eq!(&table.get(b"retried").unwrap()[..4], 29_999u32.to_be_bytes());
        assert!((0..10u32).all(|i| table.get(&i.to_be_bytes()) == Some(&[0xaa; 100][..])));
    }

    #[test]
    fn a_table_keeps_its_keys_in_the_order_of_their_bytes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut table, mut model) = (Table::default(), BTreeMap::new());
        for i in 0..5_000u32 {
            let k = key(&mut rng);
            table.insert(&k, i.to_be_bytes().as_slice());
            model.insert(k, i.to_be_bytes().to_vec());
        }
        let all: Vec<_> = table.sorted().into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        assert_eq!(all, model.clone().into_iter().collect::<Vec<_>>());
        assert_eq!(table.len(), model.len());
        for (k, v) in &model {
            assert_eq!(table.get(k).map(|v| v.to_vec()).as_ref(), Some(v), "{k:?}");
        }
        for _ in 0..500 {
            let from = key(&mut rng);
            let (got, want): (Vec<_>, Vec<_>) = if rng.random_bool(0.5) {
                let got = table.sorted_from(Bound::Included(&from), None).into_iter().map(|(k, _)| k.to_vec()).collect();
                (got, model.range::<Vec<u8>, _>(&from..).map(|(k, _)| k.clone()).collect())
            } else {
                let got = table.sorted_from(Bound::Excluded(&from), None).into_iter().map(|(k, _)| k.to_vec()).collect();
                let want = model.range::<Vec<u8>, _>((Bound::Excluded(&from), Bound::Unbounded));
                (got, want.map(|(k, _)| k.clone()).collect())
            };
            assert_eq!(got, want, "from {from:?}");
            assert_eq!(table.get(&from).map(|v| v.to_vec()), model.get(&from).cloned());
            let prefix = &from[..from.len().min(2)];
            let got: Vec<_> =
                table.sorted_from(Bound::Included(prefix), Some(prefix)).into_iter().map(|(k, _)| k.to_vec()).collect();
            let want: Vec<_> = model.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
            assert_eq!(got, want, "prefix {prefix:?}");
        }
    }
}
