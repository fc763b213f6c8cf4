use std::collections::{HashMap, HashSet};

use super::json::{date, decimal, time_of_day, timestamp, Unit};
use super::*;
use apache_avro::types::{Record, Value as Avro};
use serde_json::json;

fn framed(id: u32, datum: Vec<u8>) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend(datum);
    out
}

#[test]
fn framing_is_recognised() {
    assert_eq!(framing(&[0, 0, 0, 1, 7, 2]), Some(263));
    assert_eq!(framing(b"{\"a\":1}"), None);
    assert_eq!(framing(&[0, 0, 0]), None);
}

#[test]
fn debezium_json_payload_string_becomes_the_document() {
    let text = r#"{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}"#;
    let schema = Schema::parse_str(text).unwrap();
    let datum = apache_avro::to_avro_datum(&schema, Avro::String(r#"{"total": 10, "items": [1]}"#.into())).unwrap();
    let parsed = ParsedSchema::parse(7, text, &[]).unwrap();
    assert_eq!(parsed.decode(&framed(7, datum)).unwrap(), json!({"total": 10, "items": [1]}));

    let nullable = r#"["null",{"type":"string","connect.name":"io.debezium.data.Json"}]"#;
    let schema = Schema::parse_str(nullable).unwrap();
    let datum = apache_avro::to_avro_datum(&schema, Avro::Union(1, Box::new(Avro::String("[1,2]".into())))).unwrap();
    assert_eq!(ParsedSchema::parse(8, nullable, &[]).unwrap().decode(&framed(8, datum)).unwrap(), json!([1, 2]));
}

#[test]
fn every_supported_type_maps_to_documented_json() {
    let text = r#"{
      "type": "record", "name": "Order", "namespace": "shop",
      "fields": [
        {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
        {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
        {"name": "b", "type": "boolean"}, {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "time", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "meta", "type": {"type": "string", "connect.name": "io.debezium.data.Json"}},
        {"name": "next", "type": ["null", "Color"], "default": null}
      ]}"#;
    let schema = Schema::parse_str(text).unwrap();
    let mut r = Record::new(&schema).unwrap();
    r.put("i", 1i32);
    r.put("l", 2i64);
    r.put("f", 1.5f32);
    r.put("d", 2.25f64);
    r.put("b", true);
    r.put("s", "text");
    r.put("raw", Avro::Bytes(vec![1, 2, 3]));
    r.put("color", Avro::Enum(1, "GREEN".into()));
    r.put("note", Avro::Union(1, Box::new(Avro::String("hi".into()))));
    r.put("tags", Avro::Array(vec![Avro::String("a".into())]));
    r.put("attrs", Avro::Map([("k".to_owned(), Avro::Long(5))].into_iter().collect()));
    r.put("day", Avro::Date(19_000));
    r.put("at_ms", Avro::TimestampMillis(1_700_000_000_123));
    r.put("at_us", Avro::TimestampMicros(1_700_000_000_123_456));
    r.put("time", Avro::TimeMicros(3_723_000_001));
    r.put("price", Avro::Decimal(apache_avro::Decimal::from(vec![0xfbu8, 0x2e]))); // -1234 → -12.34
    r.put("id", Avro::Uuid("6f1c0c1e-2b1a-4c47-9d1f-6a4f8f2a0b01".parse().unwrap()));
    r.put("meta", r#"{"x": true}"#);
    r.put("next", Avro::Union(0, Box::new(Avro::Null)));
    let datum = apache_avro::to_avro_datum(&schema, r).unwrap();
    let got = ParsedSchema::parse(3, text, &[]).unwrap().decode(&framed(3, datum)).unwrap();
    assert_eq!(
        got,
        json!({
            "i": 1, "l": 2, "f": 1.5, "d": 2.25, "b": true, "s": "text", "raw": "AQID",
            "color": "GREEN", "note": "hi", "tags": ["a"], "attrs": {"k": 5},
            "day": "2022-01-08", "at_ms": "2023-11-14T22:13:20.123000Z", "at_us": "2023-11-14T22:13:20.123456Z",
            "time": "01:02:03.000001", "price": "-12.34", "id": "6f1c0c1e-2b1a-4c47-9d1f-6a4f8f2a0b01",
            "meta": {"x": true}, "next": null
        })
    );
}

#[test]
fn schema_references_resolve() {
    let address = r#"{"type":"record","name":"Address","namespace":"shop","fields":[{"name":"city","type":"string"}]}"#;
    let customer =
        r#"{"type":"record","name":"Customer","namespace":"shop","fields":[{"name":"home","type":"shop.Address"}]}"#;
    let (schema, schemata) = Schema::parse_str_with_list(customer, [address]).unwrap();
    let mut home = Record::new(&schemata[0]).unwrap();
    home.put("city", "Lyon");
    let mut c = Record::new(&schema).unwrap();
    c.put("home", home);
    let datum = apache_avro::to_avro_datum_schemata(&schema, schemata.iter().collect(), c).unwrap();
    let parsed = ParsedSchema::parse(4, customer, &[address.to_owned()]).unwrap();
    assert_eq!(parsed.decode(&framed(4, datum)).unwrap(), json!({"home": {"city": "Lyon"}}));
}

#[test]
fn datum_that_does_not_match_is_an_error_not_a_crash() {
    let text = r#"{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}"#;
    let parsed = ParsedSchema::parse(5, text, &[]).unwrap();
    let e = parsed.decode(&framed(5, vec![0x7f])).unwrap_err();
    assert!(matches!(e, AvroError::Datum { id: 5, .. }), "{e:?}");
    let long = ParsedSchema::parse(6, r#""long""#, &[]).unwrap();
    let e = long.decode(&framed(6, vec![2, 9, 9])).unwrap_err();
    assert!(e.to_string().contains("left after the datum"), "{e}");
    assert!(ParsedSchema::parse(9, "{not a schema", &[]).is_err());
    assert!(!AvroError::UnknownSchema(1).is_transient());
    assert!(AvroError::Unavailable("down".into()).is_transient());
}

#[test]
fn decimals_and_dates_format_exactly() {
    assert_eq!(decimal(&[0x04, 0xd2], 2).unwrap(), json!("12.34"));
    assert_eq!(decimal(&[0x05], 3).unwrap(), json!("0.005"));
    assert_eq!(decimal(&[0xff], 0).unwrap(), json!("-1"));
    assert_eq!(date(0), json!("1970-01-01"));
    assert_eq!(date(-1), json!("1969-12-31"));
    assert_eq!(date(11_016), json!("2000-02-29"));
}

#[test]
fn timestamps_render_for_every_i64_without_panicking() {
    let us = |n| timestamp(n, Unit::Micros);
    assert_eq!(us(0), json!("1970-01-01T00:00:00.000000Z"));
    assert_eq!(us(-1), json!("1969-12-31T23:59:59.999999Z"));
    assert_eq!(timestamp(-1, Unit::Millis), json!("1969-12-31T23:59:59.999000Z"));
    assert_eq!(timestamp(-1, Unit::Nanos), json!("1969-12-31T23:59:59.999999Z"));
    assert_eq!(timestamp(-14_182_940_000, Unit::Millis), json!("1969-07-20T20:17:40.000000Z"));
    assert_eq!(timestamp(1_700_000_000_123_456_789, Unit::Nanos), json!("2023-11-14T22:13:20.123456Z"));
    // The edges RFC 3339 can write, and one step beyond them: the number as sent.
    assert_eq!(us(-62_167_219_200_000_000), json!("0000-01-01T00:00:00.000000Z"));
    assert_eq!(us(-62_167_219_200_000_001), json!(-62_167_219_200_000_001i64));
    assert_eq!(us(253_402_300_799_999_999), json!("9999-12-31T23:59:59.999999Z"));
    assert_eq!(us(253_402_300_800_000_000), json!(253_402_300_800_000_000i64));
    // PostgreSQL infinity as Debezium sends it, and the extremes of i64, in every unit.
    for unit in [Unit::Millis, Unit::Micros, Unit::Nanos] {
        assert_eq!(timestamp(9_223_372_036_825_200_000, unit), json!("infinity"));
        assert_eq!(timestamp(i64::MAX, unit), json!("infinity"));
        assert_eq!(timestamp(-9_223_372_036_832_400_000, unit), json!("-infinity"));
        assert_eq!(timestamp(i64::MIN, unit), json!("-infinity"));
    }
    assert_eq!(timestamp(185_543_533_774_800_000, Unit::Millis), json!(185_543_533_774_800_000i64));
}

#[test]
fn infinite_and_pre_1970_timestamps_in_a_datum_decode() {
    let text = r#"{"type":"record","name":"T","fields":[
        {"name":"ms","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"us","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"local","type":{"type":"long","logicalType":"local-timestamp-micros"}}]}"#;
    let schema = Schema::parse_str(text).unwrap();
    let mut r = Record::new(&schema).unwrap();
    r.put("ms", Avro::TimestampMillis(9_223_372_036_825_200_000));
    r.put("us", Avro::TimestampMicros(-1));
    r.put("local", Avro::LocalTimestampMicros(i64::MIN));
    let datum = apache_avro::to_avro_datum(&schema, r).unwrap();
    let got = ParsedSchema::parse(11, text, &[]).unwrap().decode(&framed(11, datum)).unwrap();
    assert_eq!(got, json!({"ms": "infinity", "us": "1969-12-31T23:59:59.999999Z", "local": "-infinity"}));
}

#[test]
fn dates_outside_the_years_rfc_3339_can_write_stay_numbers() {
    assert_eq!(date(-719_528), json!("0000-01-01"));
    assert_eq!(date(-719_529), json!(-719_529));
    assert_eq!(date(2_932_896), json!("9999-12-31"));
    assert_eq!(date(2_932_897), json!(2_932_897));
    assert_eq!(date(i32::MAX), json!(i32::MAX));
    assert_eq!(date(i32::MIN), json!(i32::MIN));
}

/// `{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}`
const NODE: &str = r#"{"type":"record","name":"Node","namespace":"list",
    "fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}"#;

/// A `Node` datum of `n` nodes with values 1, 2, …
fn linked_list(n: usize) -> Vec<u8> {
    let mut datum = Vec::new();
    for i in 1..=n {
        let v = apache_avro::to_avro_datum(&Schema::Int, Avro::Int(i as i32)).unwrap();
        datum.extend(v);
        datum.push(if i < n { 2 } else { 0 }); // union branch: Node, or null at the end
    }
    datum
}

#[test]
fn a_short_linked_list_of_a_self_referencing_schema_decodes() {
    let got = ParsedSchema::parse(20, NODE, &[]).unwrap().decode(&framed(20, linked_list(3))).unwrap();
    assert_eq!(got, json!({"v": 1, "next": {"v": 2, "next": {"v": 3, "next": null}}}));
}

#[test]
fn a_named_type_used_twice_in_one_schema_decodes() {
    let text = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"from","type":{"type":"record","name":"Address","fields":[{"name":"city","type":"string"}]}},
        {"name":"to","type":"Address"}]}"#;
    let datum = [&[8u8][..], b"Lyon", &[8], b"Nice"].concat();
    let got = ParsedSchema::parse(21, text, &[]).unwrap().decode(&framed(21, datum)).unwrap();
    assert_eq!(got, json!({"from": {"city": "Lyon"}, "to": {"city": "Nice"}}));
}

#[test]
fn a_self_referencing_schema_with_a_long_value_is_an_error_not_a_crash() {
    let long = framed(22, linked_list(100_000));
    let e = ParsedSchema::parse(22, NODE, &[]).unwrap().decode(&long).unwrap_err();
    assert!(matches!(&e, AvroError::Datum { id: 22, error } if error.contains("nests deeper than")), "{e}");
    // The same list as a referenced schema.
    let holder = r#"{"type":"record","name":"Holder","fields":[{"name":"head","type":"list.Node"}]}"#;
    let e = ParsedSchema::parse(23, holder, &[NODE.to_owned()]).unwrap().decode(&framed(23, linked_list(100_000)));
    assert!(e.unwrap_err().to_string().contains("nests deeper than"));
    // Just inside the bound it decodes; one node more does not.
    let parsed = ParsedSchema::parse(22, NODE, &[]).unwrap();
    assert!(parsed.decode(&framed(22, linked_list(MAX_DEPTH))).is_ok());
    assert!(parsed.decode(&framed(22, linked_list(MAX_DEPTH + 1))).is_err());
}

#[test]
fn a_record_that_contains_itself_without_a_union_is_an_error_not_a_crash() {
    let text = r#"{"type":"record","name":"Loop","fields":[{"name":"again","type":"Loop"}]}"#;
    if let Ok(parsed) = ParsedSchema::parse(24, text, &[]) {
        let e = parsed.decode(&framed(24, Vec::new())).unwrap_err();
        assert!(e.to_string().contains("nests deeper than"), "{e}");
    }
}

#[test]
fn the_json_rendering_refuses_values_deeper_than_the_bound() {
    let mut value = Avro::Null;
    for _ in 0..=MAX_DEPTH {
        value = Avro::Array(vec![value]);
    }
    let names = HashMap::new();
    let json_fields = HashSet::new();
    let ctx = super::json::Ctx { names: &names, json_fields: &json_fields };
    let e = super::json::to_json(&value, &Schema::Null, &ctx, 0).unwrap_err().to_string();
    assert!(e.contains("nests deeper than"), "{e}");
    let Avro::Array(inner) = value else { unreachable!() };
    assert!(super::json::to_json(&inner[0], &Schema::Null, &ctx, 0).is_ok());
}

#[test]
fn a_string_cut_off_by_the_end_of_the_input_is_an_error_not_null() {
    let text = r#"{"type":"record","name":"E","fields":[{"name":"n","type":"long"},{"name":"s","type":"string"}]}"#;
    let parsed = ParsedSchema::parse(25, text, &[]).unwrap();
    let whole = [&[4u8, 10][..], b"hello"].concat(); // n = 2, s = "hello"
    assert_eq!(parsed.decode(&framed(25, whole.clone())).unwrap(), json!({"n": 2, "s": "hello"}));
    for cut in 2..whole.len() {
        let e = parsed.decode(&framed(25, whole[..cut].to_vec())).unwrap_err();
        assert!(matches!(&e, AvroError::Datum { error, .. } if error.contains("ends early")), "cut at {cut}: {e}");
    }
}

#[test]
fn a_boolean_or_union_index_cut_off_is_an_error_not_null() {
    for (id, field) in [(26, r#""boolean""#), (27, r#"["null","string"]"#), (28, r#""int""#)] {
        let text = format!(r#"{{"type":"record","name":"C","fields":[{{"name":"f","type":{field}}}]}}"#);
        let e = ParsedSchema::parse(id, &text, &[]).unwrap().decode(&framed(id, Vec::new())).unwrap_err();
        assert!(e.to_string().contains("ends early") || e.to_string().contains("cut off"), "{field}: {e}");
    }
}

#[test]
fn a_length_or_count_larger_than_the_input_is_an_error_not_an_allocation() {
    let zigzag = |n: i64| apache_avro::to_avro_datum(&Schema::Long, Avro::Long(n)).unwrap();
    let cases = [
        (30, r#""string""#, 400_000_000i64), // below apache-avro's own 512 MiB limit
        (31, r#""bytes""#, 2_000_000_000),   // 2 GB
        (32, r#"{"type":"array","items":"long"}"#, 400_000_000),
        (33, r#"{"type":"map","values":"null"}"#, 400_000_000),
        (34, r#"{"type":"array","items":"null"}"#, 100_000_000), // items that take no bytes
    ];
    for (id, schema, claimed) in cases {
        let parsed = ParsedSchema::parse(id, schema, &[]).unwrap();
        let e = parsed.decode(&framed(id, [zigzag(claimed), vec![1, 2, 3]].concat())).unwrap_err();
        assert!(matches!(e, AvroError::Datum { .. }), "{schema}: {e}");
    }
    let fixed = ParsedSchema::parse(35, r#"{"type":"fixed","name":"F","size":1000000000}"#, &[]).unwrap();
    assert!(fixed.decode(&framed(35, vec![1, 2, 3])).is_err());
    // A modest number of empty items is fine.
    let nulls = ParsedSchema::parse(36, r#"{"type":"array","items":"null"}"#, &[]).unwrap();
    assert_eq!(nulls.decode(&framed(36, [zigzag(3), zigzag(0)].concat())).unwrap(), json!([null, null, null]));
}

/// What the fuzz target `avro` checks, on stable and in every test run: random
/// bytes, and random cuts and flips of valid datums, give JSON or a datum error.
#[test]
fn random_and_mangled_datums_give_json_or_an_error_never_a_crash() {
    use rand::{Rng, SeedableRng};
    let tree = r#"{"type":"record","name":"Tree","fields":[{"name":"label","type":"string"},
        {"name":"kids","type":{"type":"array","items":"Tree"}},
        {"name":"named","type":{"type":"map","values":["null","Tree"]}}]}"#;
    let schemas = [
        ParsedSchema::parse(1, NODE, &[]).unwrap(),
        ParsedSchema::parse(2, tree, &[]).unwrap(),
        ParsedSchema::parse(3, r#"{"type":"array","items":{"type":"map","values":"null"}}"#, &[]).unwrap(),
    ];
    let valid = [linked_list(20), [&[6u8][..], b"abc", &[0, 0]].concat(), vec![2, 2, 2, 0, 0, 0]];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..20_000 {
        let i = round % schemas.len();
        let mut datum = if round % 2 == 0 {
            let len = rng.random_range(0..64);
            (0..len).map(|_| rng.random::<u8>()).collect()
        } else {
            let mut d = valid[i].clone();
            if !d.is_empty() {
                let at = rng.random_range(0..d.len());
                d[at] = rng.random();
            }
            d
        };
        datum.truncate(rng.random_range(0..=datum.len()));
        let id = i as u32 + 1;
        if let Err(e) = schemas[i].decode(&framed(id, datum.clone())) {
            assert!(matches!(e, AvroError::Datum { .. }), "{datum:?}: {e:?}");
        }
    }
    for (i, d) in valid.iter().enumerate() {
        assert!(schemas[i].decode(&framed(i as u32 + 1, d.clone())).is_ok(), "valid datum {i}");
    }
}

#[test]
fn times_of_day_outside_a_day_stay_numbers_not_garbled_text() {
    assert_eq!(time_of_day(0), json!("00:00:00.000000"));
    assert_eq!(time_of_day(86_399_999_999), json!("23:59:59.999999"));
    assert_eq!(time_of_day(-1), json!(-1));
    assert_eq!(time_of_day(86_400_000_000), json!(86_400_000_000i64));
    assert_eq!(time_of_day(i64::MIN), json!(i64::MIN));
    let text = r#"{"type":"int","logicalType":"time-millis"}"#;
    let datum = apache_avro::to_avro_datum(&Schema::parse_str(text).unwrap(), Avro::TimeMillis(-5)).unwrap();
    assert_eq!(ParsedSchema::parse(40, text, &[]).unwrap().decode(&framed(40, datum)).unwrap(), json!(-5));
}

#[test]
fn a_decimal_scale_beyond_postgresqls_is_an_error_not_an_allocation() {
    assert_eq!(decimal(&[0x7b], 1000).unwrap().as_str().map(str::len), Some(1002));
    assert!(decimal(&[0x7b], 1001).unwrap_err().to_string().contains("scale"));
    assert!(decimal(&[0x7b], usize::MAX / 2).is_err());
}
