//! Where a record lives: its key is `event key ++ scope id`.
//!
//! The event key is what identifies an event anywhere (also the key of its record
//! in a changelog topic): a tag byte, then
//! - for a UUID in canonical text form (the usual outbox id), its 16 bytes
//!   (one tag for lower case, one for upper case, so the text comes back exactly);
//! - for any other id, its bytes with 0x00 escaped as `00 FF`, ended by `00 00`,
//!   so that keys sort like the ids and no id's key is a prefix of another's.
//!
//! The scope id (a varint, `names`) keeps equal ids of different sources apart
//! (`orders.id = 42` and `invoices.id = 42` read with `event_id = { field = "after.id" }`):
//! by default the scope is the topic, `""` when a handler shares one scope across
//! its topics, and [`UNDECODABLE_SCOPE`] for messages that never became an event.
//! Scope id 0 ([`LEGACY_SCOPE`]) holds records from stores written before
//! scopes: a claim that finds no scoped record looks there too, so their events
//! stay deduplicated until the records expire. The records of one id are
//! neighbours: a prefix scan finds them for `outboxd store get ID`.

use std::sync::Arc;

use smallvec::SmallVec;

use super::varint::{self, Reader};

/// A key built on the stack: a UUID's record key (17 bytes and a scope varint)
/// fits, so looking up or writing a record allocates nothing for its key.
pub type KeyBuf = SmallVec<[u8; 24]>;

/// The key space of messages that could not be decoded (and of those whose
/// handling hit a bug): no topic can be named like this (Kafka allows
/// `[a-zA-Z0-9._-]`), so it never meets an event's scope.
pub const UNDECODABLE_SCOPE: &str = "!undecodable";
/// Scope id of records kept from before scopes existed (found under any scope).
pub const LEGACY_SCOPE: u32 = 0;

const TAG_UUID_LOWER: u8 = 1;
const TAG_UUID_UPPER: u8 = 2;
pub(in crate::store) const TAG_BYTES: u8 = 3;

/// The event key of `id`: 17 bytes for a UUID, else about the id's length + 3.
pub fn event_key(id: &str) -> KeyBuf {
    if let Some((bytes, upper)) = parse_uuid(id) {
        let mut k = KeyBuf::new();
        k.push(if upper { TAG_UUID_UPPER } else { TAG_UUID_LOWER });
        k.extend_from_slice(&bytes);
        return k;
    }
    let mut k = KeyBuf::with_capacity(id.len() + 3);
    k.push(TAG_BYTES);
    for &b in id.as_bytes() {
        k.push(b);
        if b == 0 {
            k.push(0xFF);
        }
    }
    k.extend_from_slice(&[0, 0]);
    k
}

/// A key's first 8 bytes as a number that orders as the key does (up to them):
/// sorting record keys (a tag, then 16 bytes of a UUID) by it first seldom reads
/// further.
pub fn prefix(key: &[u8]) -> u64 {
    let mut first = [0u8; 8];
    let n = key.len().min(8);
    first[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(first)
}

/// The record key of an event key in a scope.
pub fn record_key(event_key: &[u8], scope: u32) -> KeyBuf {
    let mut k = KeyBuf::from_slice(event_key);
    varint::put_u64(&mut k, u64::from(scope));
    k
}

/// The event id and scope id a record key names.
pub fn split(key: &[u8]) -> Option<(Arc<str>, u32)> {
    let (id, rest) = match *key.first()? {
        tag @ (TAG_UUID_LOWER | TAG_UUID_UPPER) => {
            let bytes: &[u8; 16] = key.get(1..17)?.try_into().ok()?;
            (format_uuid(bytes, tag == TAG_UUID_UPPER), &key[17..])
        }
        TAG_BYTES => {
            let mut id = Vec::new();
            let mut i = 1;
            loop {
                match (key.get(i)?, key.get(i + 1)) {
                    (0, Some(0)) => break,
                    (0, Some(0xFF)) => id.push(0),
                    (0, _) => return None,
                    (&b, _) => {
                        id.push(b);
                        i += 1;
                        continue;
                    }
                }
                i += 2;
            }
            (Arc::from(std::str::from_utf8(&id).ok()?), &key[i + 2..])
        }
        _ => return None,
    };
    let mut r = Reader(rest);
    let scope = r.u32()?;
    r.is_empty().then_some((id, scope))
}

/// The smallest key greater than every key that starts with `prefix`.
pub fn past(prefix: &[u8]) -> Vec<u8> {
    let mut k = prefix.to_vec();
    while let Some(last) = k.pop() {
        if last < 0xFF {
            k.push(last + 1);
            return k;
        }
    }
    vec![0xFF; prefix.len() + 1]
}

/// In a cursor, the scope of a legacy record (no scope text can be this).
const LEGACY_CURSOR: &str = "\u{1}";

/// Where a page starts, as a record names it: `event id 0x00 scope` (the form
/// earlier versions used too), so a cursor starts with the id of the last record
/// of its page.
pub fn cursor(id: &str, scope: Option<&str>) -> String {
    format!("{id}\0{}", scope.unwrap_or(LEGACY_CURSOR))
}

/// A cursor read back: the event key and the scope text (`None`: a legacy
/// record), or just the event key when the cursor is a bare event id (then the
/// page starts past every record of that id).
pub fn parse_cursor(cursor: &str) -> (Vec<u8>, Option<Option<String>>) {
    match cursor.rsplit_once('\0') {
        Some((id, LEGACY_CURSOR)) => (event_key(id).to_vec(), Some(None)),
        Some((id, scope)) => (event_key(id).to_vec(), Some(Some(scope.to_owned()))),
        None => (event_key(cursor).to_vec(), None),
    }
}

/// The 16 bytes of a UUID in canonical text form, and whether it is upper case.
/// Digits only is lower case; mixed case is neither (it would not come back as
/// written). Every lookup of an event parses its id: no allocation here.
pub fn parse_uuid(text: &str) -> Option<([u8; 16], bool)> {
    let t: &[u8; 36] = text.as_bytes().try_into().ok()?;
    if t[8] != b'-' || t[13] != b'-' || t[18] != b'-' || t[23] != b'-' {
        return None;
    }
    // One table read per digit, its case and validity ORed together and judged
    // once at the end: three ids are parsed per event, so no branch per character.
    let (mut out, mut seen) = ([0u8; 16], 0u8);
    for (i, byte) in out.iter_mut().enumerate() {
        let (hi, lo) = (HEX[usize::from(t[DIGIT_AT[2 * i]])], HEX[usize::from(t[DIGIT_AT[2 * i + 1]])]);
        seen |= hi | lo;
        *byte = (hi & 0x0f) << 4 | (lo & 0x0f);
    }
    match seen & (BAD | LOWER | UPPER) {
        0 | LOWER => Some((out, false)),
        UPPER => Some((out, true)),
        _ => None,
    }
}

/// A text character's digit value (low 4 bits) and what it is: [`LOWER`] for
/// `a-f`, [`UPPER`] for `A-F`, [`BAD`] for anything but a hex digit.
const HEX: [u8; 256] = {
    let mut t = [BAD; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = (10 + c as u8) | LOWER;
        t[b'A' as usize + c] = (10 + c as u8) | UPPER;
        c += 1;
    }
    t
};
const LOWER: u8 = 0x10;
const UPPER: u8 = 0x20;
const BAD: u8 = 0x40;
/// Where a canonical UUID's 32 digits are (past its four dashes).
const DIGIT_AT: [usize; 32] = {
    let mut at = [0; 32];
    let (mut i, mut n) = (0, 0);
    while i < 36 {
        if !matches!(i, 8 | 13 | 18 | 23) {
            at[n] = i;
            n += 1;
        }
        i += 1;
    }
    at
};

pub fn format_uuid(bytes: &[u8; 16], upper: bool) -> Arc<str> {
    // Every record read back formats its id: digits from a table, not `format!` per
    // byte, on the stack, then copied once into the record's own text.
    let digits: &[u8; 16] = if upper { b"0123456789ABCDEF" } else { b"0123456789abcdef" };
    let mut s = [0u8; 36];
    let mut at = 0;
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s[at] = b'-';
            at += 1;
        }
        s[at] = digits[usize::from(b >> 4)];
        s[at + 1] = digits[usize::from(b & 0xF)];
        at += 2;
    }
    Arc::from(std::str::from_utf8(&s).expect("hex digits and dashes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_id_takes_sixteen_bytes_and_comes_back_as_written() {
        for id in ["0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d", "0190A3C4-5E6F-7A8B-9C0D-1E2F3A4B5C6D"] {
            let key = record_key(&event_key(id), 5);
            assert_eq!(key.len(), 1 + 16 + 1);
            assert_eq!(split(&key), Some((id.into(), 5)));
        }
        let mixed = "0190a3c4-5e6f-7a8b-9c0d-1E2F3A4B5C6D";
        assert_eq!(event_key(mixed)[0], TAG_BYTES, "mixed case would not round-trip as 16 bytes");
        assert_eq!(split(&record_key(&event_key(mixed), 1)), Some((mixed.into(), 1)));
    }

    #[test]
    fn only_a_canonical_uuid_of_one_case_is_parsed() {
        let digits = "01900304-0506-0708-0900-010203040506";
        assert_eq!(parse_uuid(digits).map(|(b, upper)| (b[0], b[15], upper)), Some((0x01, 0x06, false)));
        let (bytes, upper) = parse_uuid("ABCDEF01-2345-6789-ABCD-EF0123456789").unwrap();
        assert!(upper);
        assert_eq!(&*format_uuid(&bytes, upper), "ABCDEF01-2345-6789-ABCD-EF0123456789");
        for not in [
            "abcdef01-2345-6789-ABCD-ef0123456789", // mixed case
            "abcdef01-2345-6789-abcd-ef012345678g", // not hex
            "abcdef01-2345-6789-abcd0ef0123456789", // a dash missing
            "abcdef01-2345-6789-abcd-ef01234567-9", // a dash instead of a digit
            "abcdef01-2345-6789-abcd-ef012345678",  // too short
            "{bcdef01-2345-6789-abcd-ef0123456789",
        ] {
            assert_eq!(parse_uuid(not), None, "{not}");
        }
    }

    #[test]
    fn every_character_at_every_place_of_a_uuid_is_judged_as_a_plain_reading_would() {
        let base = "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
        for at in 0..36 {
            for c in (0x20u8..0x7f).map(char::from).chain(['é']) {
                let mut text = base.to_owned();
                text.replace_range(at..=at, c.encode_utf8(&mut [0; 4]));
                let dashes = [8, 13, 18, 23].iter().all(|&i| text.as_bytes().get(i) == Some(&b'-'));
                let digits: String = text.chars().enumerate().filter(|(i, _)| ![8, 13, 18, 23].contains(i)).map(|(_, c)| c).collect();
                let one_case = !(digits.chars().any(|c| c.is_ascii_lowercase()) && digits.chars().any(|c| c.is_ascii_uppercase()));
                let plain = (text.len() == 36 && dashes && one_case && digits.chars().all(|c| c.is_ascii_hexdigit()))
                    .then(|| (u128::from_str_radix(&digits, 16).unwrap().to_be_bytes(), digits.chars().any(|c| c.is_ascii_uppercase())));
                assert_eq!(parse_uuid(&text), plain, "{text}");
            }
        }
    }

    #[test]
    fn equal_ids_in_two_scopes_have_two_keys_and_each_key_names_its_scope() {
        let (a, b) = (record_key(&event_key("42"), 1), record_key(&event_key("42"), 2));
        assert_ne!(a, b);
        assert!(a.starts_with(&event_key("42")) && b.starts_with(&event_key("42")));
        assert!(!record_key(&event_key("420"), 1).starts_with(&event_key("42")));
        assert_eq!(split(&record_key(&event_key("a\0b"), 300)), Some(("a\0b".into(), 300)));
        assert_eq!(split(&record_key(&event_key(""), LEGACY_SCOPE)), Some(("".into(), 0)));
    }

    #[test]
    fn a_uuids_record_key_is_built_without_the_heap() {
        let key = record_key(&event_key("3f2504e0-4f89-41d3-9a0c-0305e82c3301"), u32::MAX);
        assert_eq!(key.len(), 17 + 5);
        assert!(!key.spilled(), "the key of the usual outbox id fits the inline buffer");
    }

    #[test]
    fn keys_sort_like_ids() {
        let ids = ["", "a", "a\0", "a\0b", "ab", "b", "e2", "e20", "e4x", "e5"];
        let keys: Vec<Vec<u8>> = ids.iter().map(|id| record_key(&event_key(id), 9).to_vec()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        let past_e4x = past(&event_key("e4x"));
        assert!(past_e4x > keys[8] && past_e4x < keys[9]);
    }

    #[test]
    fn a_cursor_names_the_record_and_bare_ids_still_work() {
        let c = cursor("a\0b", Some("orders"));
        assert!(c.starts_with("a\0b"), "a cursor starts with the event id");
        assert_eq!(parse_cursor(&c), (event_key("a\0b").to_vec(), Some(Some("orders".to_owned()))));
        assert_eq!(parse_cursor(&cursor("42", Some(""))).1, Some(Some(String::new())));
        assert_eq!(parse_cursor(&cursor("42", None)), (event_key("42").to_vec(), Some(None)));
        assert_eq!(parse_cursor("e2"), (event_key("e2").to_vec(), None));
    }
}
