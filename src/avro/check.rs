//! A pass over a datum before apache-avro decodes it, so that hostile bytes
//! give an error instead of a crash or wrong data. apache-avro on its own
//! - recurses once per nesting level: a recursive schema (a linked list, a
//!   tree) with a long value overflows the stack and aborts the process;
//! - allocates what a length prefix claims before reading it, and reserves
//!   room for as many array items as a block count claims;
//! - turns a string, boolean or union index cut off by the end of the input
//!   into `null` instead of an error.
//!
//! This pass reads the datum as the schema says without building anything:
//! every length and count must fit in the bytes that are left, nesting is
//! bounded by [`MAX_DEPTH`], and the datum must end exactly where the bytes do.
//! What passes decodes within those bounds.

use std::collections::HashMap;

use apache_avro::schema::{Name, Schema};

use super::MAX_DEPTH;

/// Array and map items that take no bytes at all (nulls, empty records) a datum
/// may hold: a block count is otherwise bounded by the bytes that are left.
const MAX_EMPTY_ITEMS: usize = 65_536;

/// Why a datum is not exactly one value of its schema within the bounds above.
/// `what` names the part being read: "a string", "a block count", ...
#[derive(Debug, thiserror::Error)]
pub(super) enum DatumError {
    /// A part claims more bytes than are left.
    #[error("datum ends early: {what} needs {needs} bytes at byte {at}, {left} left")]
    Truncated {
        /// The part being read.
        what: &'static str,
        /// The bytes it needs.
        needs: usize,
        /// Where it starts.
        at: usize,
        /// The bytes left from there.
        left: usize,
    },
    /// The input ends inside a varint.
    #[error("datum ends early: {what} is cut off at byte {at}")]
    CutOff {
        /// The part being read.
        what: &'static str,
        /// Where the input ends.
        at: usize,
    },
    /// A varint without an end within the 10 bytes a `long` takes.
    #[error("{what} at byte {at} is longer than 10 bytes")]
    LongVarint {
        /// The part being read.
        what: &'static str,
        /// Where the varint starts.
        at: usize,
    },
    /// A length prefix below zero.
    #[error("{what} has a negative length ({len})")]
    NegativeLength {
        /// The part being read.
        what: &'static str,
        /// The length it claims.
        len: i64,
    },
    /// A union index with no variant.
    #[error("union index {index} of {variants} variants")]
    UnionIndex {
        /// The index read.
        index: i64,
        /// The variants the union has.
        variants: usize,
    },
    /// A reference to a named type that neither the schema nor its references define.
    #[error("unknown named type {0}")]
    UnknownName(Name),
    /// Records, arrays and maps nested deeper than [`MAX_DEPTH`].
    #[error("value nests deeper than {MAX_DEPTH} records, arrays and maps")]
    TooDeep,
    /// A block count beyond what the bytes left (and [`MAX_EMPTY_ITEMS`]) can hold.
    #[error("a block claims {count} items with {left} bytes left")]
    BlockCount {
        /// The items the block claims.
        count: u64,
        /// The bytes left.
        left: usize,
    },
    /// More than [`MAX_EMPTY_ITEMS`] items that take no bytes.
    #[error("more than {MAX_EMPTY_ITEMS} items without content")]
    EmptyItems,
    /// Bytes after the end of the value.
    #[error("{0} bytes left after the datum")]
    Trailing(usize),
}

/// `Ok` when `datum` is exactly one value of `schema`, within the bounds above.
pub(super) fn check(schema: &Schema, names: &HashMap<Name, &Schema>, datum: &[u8]) -> Result<(), DatumError> {
    let mut scan = Scan { names, input: datum, pos: 0, empty_items: 0 };
    scan.value(schema, 0)?;
    match datum.len() - scan.pos {
        0 => Ok(()),
        left => Err(DatumError::Trailing(left)),
    }
}

struct Scan<'a> {
    names: &'a HashMap<Name, &'a Schema>,
    input: &'a [u8],
    /// Bytes of `input` read so far.
    pos: usize,
    /// Items of arrays and maps seen so far that took no bytes.
    empty_items: usize,
}

impl Scan<'_> {
    fn left(&self) -> usize {
        self.input.len() - self.pos
    }

    fn skip(&mut self, n: usize, what: &'static str) -> Result<(), DatumError> {
        if n > self.left() {
            return Err(DatumError::Truncated { what, needs: n, at: self.pos, left: self.left() });
        }
        self.pos += n;
        Ok(())
    }

    /// A zig-zag varint (Avro `int` and `long`).
    fn long(&mut self, what: &'static str) -> Result<i64, DatumError> {
        let mut n: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.input.get(self.pos) else {
                return Err(DatumError::CutOff { what, at: self.pos });
            };
            self.pos += 1;
            n |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((n >> 1) as i64 ^ -((n & 1) as i64));
            }
        }
        Err(DatumError::LongVarint { what, at: self.pos - 10 })
    }

    /// A length prefix, then that many bytes.
    fn bytes(&mut self, what: &'static str) -> Result<(), DatumError> {
        let len = self.long(what)?;
        let len = usize::try_from(len).map_err(|_| DatumError::NegativeLength { what, len })?;
        self.skip(len, what)
    }

    fn value(&mut self, schema: &Schema, depth: usize) -> Result<(), DatumError> {
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => self.skip(1, "a boolean"),
            Schema::Int | Schema::Date | Schema::TimeMillis | Schema::Enum(_) => self.long("an int").map(drop),
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => self.long("a long").map(drop),
            Schema::Float => self.skip(4, "a float"),
            Schema::Double => self.skip(8, "a double"),
            Schema::Duration => self.skip(12, "a duration"),
            Schema::Fixed(f) => self.skip(f.size, "a fixed"),
            Schema::Decimal(d) => self.value(&d.inner, depth),
            Schema::String => self.bytes("a string"),
            Schema::Bytes | Schema::BigDecimal | Schema::Uuid => self.bytes("a bytes value"),
            Schema::Union(u) => {
                let index = self.long("a union index")?;
                let variant = usize::try_from(index)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| DatumError::UnionIndex { index, variants: u.variants().len() })?;
                self.value(variant, depth)
            }
            Schema::Ref { name } => {
                let named = self.names.get(name).ok_or_else(|| DatumError::UnknownName(name.clone()))?;
                self.value(named, depth)
            }
            Schema::Record(r) => {
                let depth = nested(depth)?;
                r.fields.iter().try_for_each(|f| self.value(&f.schema, depth))
            }
            Schema::Array(a) => self.items(&a.items, None, nested(depth)?),
            Schema::Map(m) => self.items(&m.types, Some(&Schema::String), nested(depth)?),
        }
    }

    /// Blocks of items (and keys, for a map) up to the block of count 0.
    fn items(&mut self, item: &Schema, key: Option<&Schema>, depth: usize) -> Result<(), DatumError> {
        loop {
            let count = self.long("a block count")?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                // A negative count is followed by the block's size in bytes.
                self.long("a block size")?;
            }
            let count = count.unsigned_abs();
            let room = self.left() + (MAX_EMPTY_ITEMS - self.empty_items);
            if count > room as u64 {
                return Err(DatumError::BlockCount { count, left: self.left() });
            }
            for _ in 0..count {
                let before = self.pos;
                if let Some(key) = key {
                    self.value(key, depth)?;
                }
                self.value(item, depth)?;
                if self.pos == before {
                    self.empty_items += 1;
                    if self.empty_items > MAX_EMPTY_ITEMS {
                        return Err(DatumError::EmptyItems);
                    }
                }
            }
        }
    }
}

fn nested(depth: usize) -> Result<usize, DatumError> {
    if depth >= MAX_DEPTH {
        return Err(DatumError::TooDeep);
    }
    Ok(depth + 1)
}
