//! Where a record lives: its key is `event id ++ 0x00 ++ dedup scope`.
//!
//! The scope keeps equal ids of different sources apart (`orders.id = 42` and
//! `invoices.id = 42` read with `event_id = { field = "after.id" }`): by default it
//! is the topic, `""` when a handler shares one scope across its topics, and
//! [`UNDECODABLE_SCOPE`] for messages that never became an event. A scope never
//! contains 0x00, so the last 0x00 splits a key unambiguously, and the records of
//! one id are neighbours (a prefix scan finds them for `outboxd store get ID`).
//!
//! Stores written before scopes keyed records by the bare id ("legacy" keys).
//! They are read in place: a claim that finds no scoped record looks for a legacy
//! one, so their events stay deduplicated until the records expire.

/// The key space of messages that could not be decoded (and of those whose
/// handling hit a bug): no topic can be named like this (Kafka allows
/// `[a-zA-Z0-9._-]`), so it never meets an event's scope.
pub const UNDECODABLE_SCOPE: &str = "!undecodable";

/// The key of `id` in `scope`.
pub fn scoped(id: &str, scope: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 1 + scope.len());
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k.extend_from_slice(scope.as_bytes());
    k
}

/// The prefix every scoped key of `id` starts with.
pub fn id_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 1);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

/// The key of a record: scoped, or the bare id for a legacy record (`scope: None`).
pub fn of(id: &str, scope: Option<&str>) -> Vec<u8> {
    match scope {
        Some(s) => scoped(id, s),
        None => id.as_bytes().to_vec(),
    }
}

/// The scope a key names (`None`: a legacy key).
pub fn scope_of(key: &[u8]) -> Option<String> {
    let at = key.iter().rposition(|b| *b == 0)?;
    Some(String::from_utf8_lossy(&key[at + 1..]).into_owned())
}

/// A record's key as a page cursor (`/v1/events?after=`): the exact key, so
/// that a page boundary between two scopes of one id skips neither.
pub fn cursor(record_key: &[u8]) -> String {
    String::from_utf8_lossy(record_key).into_owned()
}

/// Where a page after `cursor` starts (exclusive): the exact key when the cursor
/// is one, else (a bare event id) past every key of that id.
pub fn after(cursor: &str) -> Vec<u8> {
    if cursor.contains('\0') {
        return cursor.as_bytes().to_vec();
    }
    let mut k = id_prefix(cursor);
    // 0xFF never occurs in UTF-8: greater than every scope.
    k.push(0xFF);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_ids_in_two_scopes_have_two_keys_and_each_key_names_its_scope() {
        let (a, b) = (scoped("42", "db.public.orders"), scoped("42", "db.public.invoices"));
        assert_ne!(a, b);
        assert!(a.starts_with(&id_prefix("42")) && b.starts_with(&id_prefix("42")));
        assert!(!scoped("420", "t").starts_with(&id_prefix("42")));
        assert_eq!(scope_of(&a).as_deref(), Some("db.public.orders"));
        assert_eq!(scope_of(&scoped("42", "")).as_deref(), Some(""));
        assert_eq!(scope_of(b"42"), None, "a legacy key");
        assert_eq!(scope_of(&scoped("a\0b", "t")).as_deref(), Some("t"), "an id may hold 0x00, a scope never");
    }

    #[test]
    fn a_page_after_a_cursor_starts_at_the_next_key() {
        let (a, b) = (scoped("42", "orders"), scoped("42", "payments"));
        let after_a = after(&cursor(&a));
        assert!(after_a.as_slice() >= a.as_slice() && after_a.as_slice() < b.as_slice());
        let after_id = after("42");
        assert!(after_id.as_slice() > b.as_slice() && after_id.as_slice() < scoped("420", "t").as_slice());
    }
}
