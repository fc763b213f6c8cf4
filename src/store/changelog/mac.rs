//! Who wrote a changelog record (`[store.changelog] key`): every record outboxd
//! writes carries a MAC over where it is and what it says, and a record whose MAC
//! does not check is never applied (docs/security.md, "The changelog topics").
//!
//! Without it, anyone who can write to a changelog topic steers side effects: a
//! forged `done` record makes an event that never ran count as handled (it never
//! runs), a forged tombstone makes a handled one run again on its next replay.
//!
//! - The MAC is HMAC-SHA256 keyed with `key`, truncated to 16 bytes, over a
//!   context string, the changelog topic, the partition, the record key and the
//!   value, or a tombstone marker for a tombstone: a record copied to another
//!   partition or topic, or with any byte changed, does not check.
//! - It travels in one Kafka header, [`HEADER`], the same for values and
//!   tombstones (a tombstone has no value to carry it, and compaction needs its
//!   value null): 2 bytes of key id, then the 16 bytes of the tag. Readers that do
//!   not know the header (an older outboxd) ignore it, so the value format stays.
//! - The key id is derived from the key (its own HMAC of a fixed text), so a
//!   configuration names keys, never ids; it says which of the accepted keys
//!   (`key`, `previous_keys`) to check with, so a rotation costs one MAC a record.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::entry::ChangelogRecord;
use crate::config::{ChangelogConfig, Secret};

/// The Kafka header carrying a changelog record's MAC.
pub const HEADER: &str = "mac";
/// Bytes of the key id at the start of the header's value.
const KEY_ID_BYTES: usize = 2;
/// Bytes of the HMAC-SHA256 tag kept: 128 bits, so a forger's chance per record is
/// 2^-128 (NIST SP 800-107 asks for at least 64 bits for a truncated HMAC), at
/// half the bytes of the full tag on every record.
const TAG_BYTES: usize = 16;
/// Length of the header's value: key id, then tag.
pub const MAC_BYTES: usize = KEY_ID_BYTES + TAG_BYTES;
/// What the MAC is of (and the version of this layout): a MAC of this kind can
/// never be taken for one of another use of the same key.
const CONTEXT: &[u8] = b"outboxd changelog record v1\0";
/// What a key id is the MAC of.
const KEY_ID_CONTEXT: &[u8] = b"outboxd changelog key id v1";
/// Before the value in the MAC's input; a tombstone has only [`TOMBSTONE`].
const VALUE: u8 = 1;
const TOMBSTONE: u8 = 0;

type HmacSha256 = Hmac<Sha256>;

/// One accepted key, keyed once (HMAC's inner and outer pads are computed here,
/// not per record).
struct Key {
    id: [u8; KEY_ID_BYTES],
    keyed: HmacSha256,
}

impl Key {
    fn new(secret: &Secret) -> Key {
        let keyed = HmacSha256::new_from_slice(secret.expose()).expect("HMAC takes a key of any length");
        let mut id = keyed.clone();
        id.update(KEY_ID_CONTEXT);
        let id = id.finalize().into_bytes();
        Key { id: [id[0], id[1]], keyed }
    }

    /// The HMAC state after the record's fields (finalize it to sign or verify).
    fn over(&self, changelog_topic: &str, partition: i32, key: &[u8], value: Option<&[u8]>) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(CONTEXT);
        mac.update(&len(changelog_topic.as_bytes()));
        mac.update(changelog_topic.as_bytes());
        mac.update(&partition.to_be_bytes());
        mac.update(&len(key));
        mac.update(key);
        match value {
            Some(value) => {
                mac.update(&[VALUE]);
                mac.update(&len(value));
                mac.update(value);
            }
            None => mac.update(&[TOMBSTONE]),
        }
        mac
    }
}

/// A field's length before it, so that no two records feed the MAC the same bytes.
fn len(field: &[u8]) -> [u8; 4] {
    u32::try_from(field.len()).unwrap_or(u32::MAX).to_be_bytes()
}

/// Why a changelog record was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// It has no MAC, and a key is configured (without `accept_unsigned`).
    Unsigned,
    /// Its MAC header is not [`MAC_BYTES`] long.
    Malformed,
    /// Its MAC names a key that is neither `key` nor one of `previous_keys`.
    UnknownKey(u16),
    /// Its MAC does not check: the record was changed, moved, or forged.
    Forged,
    /// It checks, but it is older than the record the store holds for its key (a
    /// record outboxd wrote, written again later): refused by the store's apply path
    /// (`changelog::apply`), never by [`Keys::check`].
    Stale {
        /// The version it carries (0: written by a release without versions).
        version: u64,
        /// The version of the record held for its key.
        held: u64,
    },
}

impl Rejected {
    /// The `reason` label of `outboxd_changelog_records_rejected_total`.
    pub fn label(self) -> &'static str {
        match self {
            Rejected::Unsigned => "unsigned",
            Rejected::Malformed => "malformed",
            Rejected::UnknownKey(_) => "unknown_key",
            Rejected::Forged => "forged",
            Rejected::Stale { .. } => "stale",
        }
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejected::Unsigned => f.write_str("no MAC, and store.changelog.key is set"),
            Rejected::Malformed => write!(f, "its {HEADER} header is not {MAC_BYTES} bytes long"),
            Rejected::UnknownKey(id) => {
                write!(f, "signed with key id {id:04x}, neither store.changelog.key nor one of previous_keys")
            }
            Rejected::Forged => f.write_str("its MAC does not match: the record was changed, moved or forged"),
            Rejected::Stale { version: 0, held } => write!(
                f,
                "written by a release without versions before the version {held} held for its key: an older record \
                 written again"
            ),
            Rejected::Stale { version, held } => write!(
                f,
                "version {version}, lower than the version {held} held for its key: an older record written again"
            ),
        }
    }
}

/// One record of a batch that was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// Its offset in the changelog partition.
    pub offset: i64,
    /// Why.
    pub reason: Rejected,
}

/// Changelog records that passed [`Keys::authentic`]: the only records the
/// store's apply path takes (`store.restore().apply`).
pub struct Authentic(pub(in crate::store) Vec<ChangelogRecord>);

/// How changelog records are signed, and which ones are applied: from
/// `[store.changelog]` `key`, `previous_keys` and `accept_unsigned`.
pub struct Keys {
    /// `key`: signs what this instance writes. `None`: nothing is signed, and
    /// every record is applied.
    signing: Option<Key>,
    /// `previous_keys`: verify only.
    previous: Vec<Key>,
    /// Records without a MAC are applied too.
    accept_unsigned: bool,
}

impl Keys {
    /// The keys of `changelog` (none: records are neither signed nor checked).
    pub fn new(changelog: &ChangelogConfig) -> Keys {
        match &changelog.keys {
            None => Keys { signing: None, previous: Vec::new(), accept_unsigned: true },
            Some(k) => Keys {
                signing: Some(Key::new(&k.signing)),
                previous: k.previous.iter().map(Key::new).collect(),
                accept_unsigned: k.accept_unsigned,
            },
        }
    }

    /// Whether records are signed (and so checked).
    #[cfg(test)]
    pub fn signs(&self) -> bool {
        self.signing.is_some()
    }

    /// The signing key's id, as a rejection names it (for logs and `check-config`).
    pub fn key_id(&self) -> Option<String> {
        self.signing.as_ref().map(|k| format!("{:04x}", u16::from_be_bytes(k.id)))
    }

    /// The ids of `previous_keys`, in order.
    pub fn previous_key_ids(&self) -> Vec<String> {
        self.previous.iter().map(|k| format!("{:04x}", u16::from_be_bytes(k.id))).collect()
    }

    /// The value of the [`HEADER`] of a record for changelog partition
    /// `changelog_topic`/`partition` (`value` `None`: a tombstone); `None` without a key.
    pub fn sign(
        &self,
        changelog_topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Option<[u8; MAC_BYTES]> {
        let signing = self.signing.as_ref()?;
        let tag = signing.over(changelog_topic, partition, key, value).finalize().into_bytes();
        let mut out = [0; MAC_BYTES];
        out[..KEY_ID_BYTES].copy_from_slice(&signing.id);
        out[KEY_ID_BYTES..].copy_from_slice(&tag[..TAG_BYTES]);
        Some(out)
    }

    /// Whether `record`, read from `changelog_topic`/`partition`, may be applied.
    pub fn check(&self, changelog_topic: &str, partition: i32, record: &ChangelogRecord) -> Result<(), Rejected> {
        if self.signing.is_none() {
            return Ok(());
        }
        let Some(mac) = &record.mac else {
            return if self.accept_unsigned { Ok(()) } else { Err(Rejected::Unsigned) };
        };
        if mac.len() != MAC_BYTES {
            return Err(Rejected::Malformed);
        }
        let (id, tag) = mac.split_at(KEY_ID_BYTES);
        // Ids are 2 bytes of a hash: two accepted keys may share one, so each is tried.
        let mut named = self.signing.iter().chain(&self.previous).filter(|k| k.id == id).peekable();
        if named.peek().is_none() {
            return Err(Rejected::UnknownKey(u16::from_be_bytes([id[0], id[1]])));
        }
        let value = record.value.as_deref();
        if named.any(|k| k.over(changelog_topic, partition, &record.key, value).verify_truncated_left(tag).is_ok()) {
            Ok(())
        } else {
            Err(Rejected::Forged)
        }
    }

    /// Keeps the records of a batch read from `changelog_topic`/`partition` that
    /// may be applied, in order; returns them, and the others with the reason.
    pub fn authentic(
        &self,
        changelog_topic: &str,
        partition: i32,
        mut records: Vec<ChangelogRecord>,
    ) -> (Authentic, Vec<Rejection>) {
        let mut rejected = Vec::new();
        if self.signing.is_some() {
            records.retain(|r| match self.check(changelog_topic, partition, r) {
                Ok(()) => true,
                Err(reason) => {
                    rejected.push(Rejection { offset: r.offset, reason });
                    false
                }
            });
        }
        (Authentic(records), rejected)
    }
}

#[cfg(test)]
#[path = "mac_tests.rs"]
mod tests;
