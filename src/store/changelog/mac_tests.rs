use super::*;
use crate::store::changelog::MacHeader;
use crate::config::Config;

const KEY: &str = "0123456789abcdef0123456789abcdef-current";
const OLD: &str = "0123456789abcdef0123456789abcdef-previous";
const OTHER: &str = "0123456789abcdef0123456789abcdef-somebody";
const TOPIC: &str = "g.t.outboxd-dedup";

/// The keys of a `[store.changelog]` section with these lines.
fn keys(changelog: &str) -> Keys {
    let text = format!(
        "[kafka]\nbrokers=\"b\"\ngroup_id=\"g\"\n[store]\npath=\"p\"\n[store.changelog]\n{changelog}\n\
         [[handlers]]\ntopics=[\"t\"]\nkind=\"log\"\n"
    );
    let env = |name: &str| match name {
        "KEY" => Some(KEY.to_owned()),
        "OLD" => Some(OLD.to_owned()),
        "OTHER" => Some(OTHER.to_owned()),
        _ => None,
    };
    Keys::new(&Config::parse(&text, &env).unwrap().store.changelog.unwrap())
}

fn signed_by(keys: &Keys, offset: i64, partition: i32, key: &[u8], value: Option<&[u8]>) -> ChangelogRecord {
    let mac = keys.sign(TOPIC, partition, key, value).map(|m| MacHeader::from_slice(&m));
    ChangelogRecord { offset, key: key.to_vec(), value: value.map(<[u8]>::to_vec), mac }
}

/// The header outboxd writes is held without an allocation of its own.
#[test]
fn a_mac_header_of_the_length_outboxd_writes_is_held_inline() {
    assert_eq!(MacHeader::new().inline_size(), MAC_BYTES);
}

#[test]
fn a_record_signed_with_the_key_checks_where_it_was_written() {
    let k = keys("key = \"${KEY}\"");
    assert!(k.signs());
    let done = signed_by(&k, 7, 3, b"event-key", Some(b"done record"));
    assert_eq!(done.mac.as_ref().map(|m| m.len()), Some(MAC_BYTES));
    assert_eq!(k.check(TOPIC, 3, &done), Ok(()));
    let tombstone = signed_by(&k, 8, 3, b"event-key", None);
    assert_eq!(k.check(TOPIC, 3, &tombstone), Ok(()));
    assert_ne!(done.mac, tombstone.mac, "a tombstone is signed as one");
    let empty = signed_by(&k, 9, 3, b"event-key", Some(b""));
    assert_ne!(empty.mac, tombstone.mac, "an empty value is not a tombstone");
}

#[test]
fn a_changed_value_key_partition_or_topic_does_not_check() {
    let k = keys("key = \"${KEY}\"");
    let r = signed_by(&k, 7, 3, b"event-key", Some(b"done record"));
    let mut value = r.clone();
    value.value = Some(b"dead record".to_vec());
    assert_eq!(k.check(TOPIC, 3, &value), Err(Rejected::Forged), "value changed");
    let mut key = r.clone();
    key.key = b"other-key".to_vec();
    assert_eq!(k.check(TOPIC, 3, &key), Err(Rejected::Forged), "key changed");
    assert_eq!(k.check(TOPIC, 4, &r), Err(Rejected::Forged), "copied to another partition");
    assert_eq!(k.check("g.u.outboxd-dedup", 3, &r), Err(Rejected::Forged), "copied to another topic");
    let mut gone = r.clone();
    gone.value = None;
    assert_eq!(k.check(TOPIC, 3, &gone), Err(Rejected::Forged), "a done record turned into a tombstone");
    let mut bit = r.clone();
    bit.mac.as_mut().unwrap()[MAC_BYTES - 1] ^= 1;
    assert_eq!(k.check(TOPIC, 3, &bit), Err(Rejected::Forged), "one bit of the tag");
    // Moving bytes between the key and the value keeps their concatenation, not the MAC.
    let split = signed_by(&k, 7, 3, b"ab", Some(b"c"));
    let moved = ChangelogRecord { key: b"a".to_vec(), value: Some(b"bc".to_vec()), ..split.clone() };
    assert_eq!(k.check(TOPIC, 3, &moved), Err(Rejected::Forged));
}

#[test]
fn unsigned_malformed_and_foreign_records_are_rejected_unless_no_key_is_set() {
    let k = keys("key = \"${KEY}\"");
    let unsigned = ChangelogRecord { offset: 1, key: b"k".to_vec(), value: Some(b"v".to_vec()), mac: None };
    assert_eq!(k.check(TOPIC, 0, &unsigned), Err(Rejected::Unsigned));
    let short = ChangelogRecord { mac: Some(MacHeader::from_elem(0, MAC_BYTES - 1)), ..unsigned.clone() };
    assert_eq!(k.check(TOPIC, 0, &short), Err(Rejected::Malformed));
    let foreign = signed_by(&keys("key = \"${OTHER}\""), 1, 0, b"k", Some(b"v"));
    assert!(matches!(k.check(TOPIC, 0, &foreign), Err(Rejected::UnknownKey(_))), "{:?}", k.check(TOPIC, 0, &foreign));

    let transition = keys("key = \"${KEY}\"\naccept_unsigned = true");
    assert_eq!(transition.check(TOPIC, 0, &unsigned), Ok(()), "accept_unsigned: records from before the key");
    assert_eq!(transition.check(TOPIC, 0, &short), Err(Rejected::Malformed), "a MAC, when there, must check");

    let none = keys("");
    assert!(!none.signs() && none.key_id().is_none());
    assert!(none.sign(TOPIC, 0, b"k", Some(b"v")).is_none(), "without a key nothing is signed");
    for r in [&unsigned, &short, &foreign] {
        assert_eq!(none.check(TOPIC, 0, r), Ok(()), "without a key nothing is checked");
    }
}

#[test]
fn after_a_rotation_records_of_the_previous_key_still_check_and_new_ones_carry_the_new_key() {
    let before = keys("key = \"${OLD}\"");
    let old = signed_by(&before, 1, 0, b"k", Some(b"v"));
    let rotated = keys("key = \"${KEY}\"\nprevious_keys = [\"${OLD}\"]");
    assert_eq!(rotated.check(TOPIC, 0, &old), Ok(()), "the previous key verifies");
    let new = signed_by(&rotated, 2, 0, b"k", Some(b"v"));
    assert_ne!(new.mac.as_ref().unwrap()[..2], old.mac.as_ref().unwrap()[..2], "a new key id");
    assert_eq!(keys("key = \"${KEY}\"").check(TOPIC, 0, &new), Ok(()));
    assert_eq!(
        before.check(TOPIC, 0, &new),
        Err(Rejected::UnknownKey(u16::from_str_radix(&rotated.key_id().unwrap(), 16).unwrap())),
        "an instance not yet given the new key cannot check it"
    );
    let done = keys("key = \"${KEY}\"");
    assert!(matches!(done.check(TOPIC, 0, &old), Err(Rejected::UnknownKey(_))), "the rotation ended");
    // A forged tag under the previous key's id is still forged.
    let mut forged = old.clone();
    forged.value = Some(b"w".to_vec());
    assert_eq!(rotated.check(TOPIC, 0, &forged), Err(Rejected::Forged));
}

#[test]
fn a_batch_keeps_its_authentic_records_in_order_and_names_the_others() {
    let k = keys("key = \"${KEY}\"");
    let batch = vec![
        signed_by(&k, 10, 0, b"a", Some(b"1")),
        ChangelogRecord { offset: 11, key: b"b".to_vec(), value: None, mac: None },
        signed_by(&k, 12, 0, b"c", None),
        ChangelogRecord { mac: Some(MacHeader::from_elem(1, MAC_BYTES)), ..signed_by(&k, 13, 0, b"d", Some(b"4")) },
    ];
    let (authentic, rejected) = k.authentic(TOPIC, 0, batch);
    let offsets: Vec<i64> = authentic.0.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [10, 12]);
    assert_eq!(rejected.iter().map(|r| r.offset).collect::<Vec<_>>(), [11, 13]);
    assert_eq!(rejected[0].reason, Rejected::Unsigned);
}
