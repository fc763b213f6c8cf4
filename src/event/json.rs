//! A JSON payload kept as the text it arrived in, parsed only when asked.

use std::sync::OnceLock;

use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON payload: the text as it arrived (valid JSON, on one line), and its
/// [`Value`], parsed the first time [`Json::value`] is called.
///
/// The built-in handlers send and log [`Json::text`] without parsing it: the
/// decoder checks the text once and keeps it. A payload that a `Value` could not
/// hold as written (nesting deeper than 64, a number with an exponent or over 300
/// digits, a `\u` escape, a line break) is parsed and kept in `Value`'s compact
/// rendering instead, so `text` and `value` always agree.
#[derive(Clone)]
pub struct Json {
    text: Box<RawValue>,
    value: OnceLock<Value>,
}

impl Json {
    /// The JSON text: what `http` sends and `log` writes.
    pub fn text(&self) -> &str {
        self.text.get()
    }

    /// The parsed value (parsed on the first call, then kept).
    pub fn value(&self) -> &Value {
        // The decoder made the text from a `Value` or checked that one can hold it
        // (`codec`'s `plain`), so parsing cannot fail; `Null` is never reached.
        self.value.get_or_init(|| serde_json::from_str(self.text.get()).unwrap_or(Value::Null))
    }

    /// JSON text that a [`Value`] holds as written: the caller has checked it.
    pub(crate) fn checked(text: Box<RawValue>) -> Json {
        Json { text, value: OnceLock::new() }
    }
}

/// A value, kept with its compact rendering.
impl From<Value> for Json {
    fn from(value: Value) -> Json {
        // A `Value` always renders (its map keys are strings).
        let text = serde_json::value::to_raw_value(&value).unwrap_or_else(|_| RawValue::NULL.to_owned());
        Json { text, value: OnceLock::from(value) }
    }
}

/// Equal when the values are: the same JSON with other spacing or key order is equal.
impl PartialEq for Json {
    fn eq(&self, other: &Json) -> bool {
        self.text() == other.text() || self.value() == other.value()
    }
}

impl std::fmt::Debug for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Json").field(&self.text()).finish()
    }
}

/// The text as it is, without parsing it again.
impl serde::Serialize for Json {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.text.serialize(s)
    }
}
