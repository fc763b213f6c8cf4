//! Keeps `docs/configuration.md` complete: every key the config file accepts,
//! and every value of a closed set (`kind`, `format`, ...), must appear there in
//! backticks (`` `handlers[].retry.max_attempts` ``, `` `park` ``).
//!
//! The keys come from serde itself, not from a list to keep up to date: a
//! deserializer that answers every request with a sample value walks
//! [`RawConfig`] and records the field names serde asks for (renames included).

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::RawConfig;

/// What the walk found.
#[derive(Default)]
struct Found {
    /// Dotted paths of the keys a user can write (`kafka.brokers`, `handlers[].url`).
    keys: BTreeSet<String>,
    /// Values of enums without data (`http`, `log`, `auto`, ...).
    values: BTreeSet<&'static str>,
}

/// Walks one value at `path`, recording keys into `found`.
#[derive(Clone, Copy)]
struct Walker<'a> {
    path: &'a str,
    found: &'a RefCell<Found>,
}

impl Walker<'_> {
    /// A value that is not a table of known fields: the key ends here. Elements
    /// of a list belong to the list's key.
    fn leaf(&self) {
        let key = self.path.strip_suffix("[]").unwrap_or(self.path);
        self.found.borrow_mut().keys.insert(key.to_owned());
    }

    fn child(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }
}

type Error = de::value::Error;

macro_rules! leaf {
    ($($method:ident => $visit:ident($($value:expr)?);)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.leaf();
            visitor.$visit($($value)?)
        })*
    };
}

impl<'de> Deserializer<'de> for Walker<'_> {
    type Error = Error;

    leaf! {
        deserialize_bool => visit_bool(true);
        deserialize_i8 => visit_i64(1);
        deserialize_i16 => visit_i64(1);
        deserialize_i32 => visit_i64(1);
        deserialize_i64 => visit_i64(1);
        deserialize_u8 => visit_u64(1);
        deserialize_u16 => visit_u64(1);
        deserialize_u32 => visit_u64(1);
        deserialize_u64 => visit_u64(1);
        deserialize_f32 => visit_f64(2.0);
        deserialize_f64 => visit_f64(2.0);
        deserialize_char => visit_char('x');
        deserialize_str => visit_str("x");
        deserialize_string => visit_str("x");
        deserialize_bytes => visit_bytes(b"x");
        deserialize_byte_buf => visit_bytes(b"x");
        deserialize_unit => visit_unit();
        // `toml::Value` (behind `StatusMatch`) takes anything; a status code is valid there.
        deserialize_any => visit_i64(200);
        deserialize_ignored_any => visit_unit();
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    /// One element, walked at `path[]`.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = format!("{}[]", self.path);
        visitor.visit_seq(OneElement { walker: Some(Walker { path: &path, found: self.found }) })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _: &str, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    /// A table with keys of the user's choosing (`headers`, `kafka.options`): one key.
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.leaf();
        visitor.visit_map(de::value::MapDeserializer::new(std::iter::empty::<(&str, &str)>()))
    }

    /// Every field, each walked at `path.field`.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_map(Fields { walker: self, fields: fields.iter(), current: None })
    }

    /// The first variant is walked; all of them are recorded: as values when they
    /// carry nothing (`kind = "http"`), as keys when they carry a value
    /// (`event_id = { header = "id" }`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_enum(Variant { walker: self, variants })
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom(format!("{}: an identifier was asked of a value", self.path)))
    }
}

struct OneElement<'a> {
    walker: Option<Walker<'a>>,
}

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        self.walker.take().map(|w| seed.deserialize(w)).transpose()
    }
}

struct Fields<'a> {
    walker: Walker<'a>,
    fields: std::slice::Iter<'static, &'static str>,
    current: Option<&'static str>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        let Some(name) = self.fields.next() else { return Ok(None) };
        self.current = Some(name);
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let path = self.walker.child(self.current.expect("a key before its value"));
        seed.deserialize(Walker { path: &path, found: self.walker.found })
    }
}

struct Variant<'a> {
    walker: Walker<'a>,
    variants: &'static [&'static str],
}

impl<'a, 'de> de::EnumAccess<'de> for Variant<'a> {
    type Error = Error;
    type Variant = Variant<'a>;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Variant<'a>), Error> {
        let first = self.variants.first().ok_or_else(|| de::Error::custom("an enum without variants"))?;
        Ok((seed.deserialize(first.into_deserializer())?, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        self.walker.leaf();
        self.walker.found.borrow_mut().values.extend(self.variants);
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        for variant in self.variants {
            Walker { path: &self.walker.child(variant), found: self.walker.found }.leaf();
        }
        let path = self.walker.child(self.variants[0]);
        seed.deserialize(Walker { path: &path, found: self.walker.found })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        let path = self.walker.child(self.variants[0]);
        Walker { path: &path, found: self.walker.found }.deserialize_tuple(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, Error> {
        let path = self.walker.child(self.variants[0]);
        Walker { path: &path, found: self.walker.found }.deserialize_struct("", fields, visitor)
    }
}

fn config_keys() -> Found {
    let found = RefCell::new(Found::default());
    RawConfig::deserialize(Walker { path: "", found: &found }).expect("the walk deserializes every field");
    found.into_inner()
}

/// Entries of `found` that the reference does not name in backticks.
fn missing<'a>(doc: &str, found: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    found.into_iter().filter(|k| !doc.contains(&format!("`{k}`"))).collect()
}

fn reference() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

#[test]
fn the_walk_finds_keys_of_every_section() {
    let found = config_keys();
    for key in [
        "kafka.brokers",
        "kafka.options",
        "store.path",
        "admin.allowed_hosts",
        "schema_registry.check_subjects",
        "handlers[].topics",
        "handlers[].kind",
        "handlers[].success_on",
        "handlers[].retry.max_elapsed",
        "handlers[].verify.method",
        "handlers[].dead_letter.topic",
        "handlers[].event_id.header",
        "handlers[].event_id.field",
    ] {
        assert!(found.keys.contains(key), "{key} not found in {:?}", found.keys);
    }
    assert!(!found.keys.contains("handlers[].retry"), "tables are not keys themselves");
    assert!(found.values.is_superset(&["http", "log", "park", "shared", "avro"].into()), "{:?}", found.values);
}

#[test]
fn every_config_key_is_in_the_configuration_reference() {
    let doc = reference();
    let found = config_keys();
    let keys = missing(&doc, found.keys.iter().map(String::as_str));
    assert!(keys.is_empty(), "docs/configuration.md does not list these config keys (as `key`): {keys:?}");
    let values = missing(&doc, found.values.iter().copied());
    assert!(values.is_empty(), "docs/configuration.md does not name these config values (as `value`): {values:?}");
}
