//! LEB128 varints, zigzag for signed values, and length-prefixed bytes: the
//! pieces of the compact record format (`format`) and of record keys (`keys`).

/// Where encoded bytes go: a `Vec`, or an inline buffer (`keys::KeyBuf`,
/// `format::Value`). A few bytes at a time, the usual piece (a varint, a tag), are
/// pushed one by one, which inlines to a store each; a longer piece is copied.
pub trait Out {
    fn push_byte(&mut self, b: u8);
    fn copy(&mut self, bytes: &[u8]);

    fn put(&mut self, bytes: &[u8]) {
        match bytes.len() {
            n if n <= SHORT => bytes.iter().for_each(|&b| self.push_byte(b)),
            _ => self.copy(bytes),
        }
    }
}

/// Pieces up to this long are pushed byte by byte (a copy calls into `memcpy`).
const SHORT: usize = 16;

impl Out for Vec<u8> {
    fn push_byte(&mut self, b: u8) {
        self.push(b);
    }
    fn copy(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl<A: smallvec::Array<Item = u8>> Out for smallvec::SmallVec<A> {
    fn push_byte(&mut self, b: u8) {
        self.push(b);
    }
    fn copy(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Appends `v` to `out`.
pub fn put_u64(out: &mut impl Out, mut v: u64) {
    let mut buf = [0u8; 10];
    let mut n = 0;
    while v >= 0x80 {
        buf[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    buf[n] = v as u8;
    out.put(&buf[..=n]);
}

pub fn put_i64(out: &mut impl Out, v: i64) {
    put_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

pub fn put_bytes(out: &mut impl Out, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.put(bytes);
}

/// Reads values from the front of a byte slice; `None` once the bytes run out
/// or a value is malformed.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn u64(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for (i, b) in self.0.iter().enumerate().take(10) {
            v |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                self.0 = &self.0[i + 1..];
                return Some(v);
            }
        }
        None
    }

    pub fn i64(&mut self) -> Option<i64> {
        let v = self.u64()?;
        Some(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.u64().and_then(|v| u32::try_from(v).ok())
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        let (head, rest) = (self.0.get(..n)?, &self.0[n..]);
        self.0 = rest;
        Some(head)
    }

    pub fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_small_ones_take_one_byte() {
        let mut out = Vec::new();
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            put_u64(&mut out, v);
        }
        for v in [0i64, -1, 63, -64, 64, i64::MIN, i64::MAX] {
            put_i64(&mut out, v);
        }
        put_bytes(&mut out, b"hello");
        let mut r = Reader(&out);
        assert_eq!([0u64, 1, 127, 128, 300, u64::MAX].map(|_| r.u64().unwrap()), [0, 1, 127, 128, 300, u64::MAX]);
        assert_eq!([0; 7].map(|_| r.i64().unwrap()), [0, -1, 63, -64, 64, i64::MIN, i64::MAX]);
        assert_eq!(r.bytes(), Some(&b"hello"[..]));
        assert!(r.is_empty() && r.u64().is_none());
        let mut one = Vec::new();
        put_i64(&mut one, -64);
        assert_eq!(one.len(), 1);
    }
}
