//! Parsing a body into a `serde_json::Value` that holds only the object
//! members a normalizer reads.
//!
//! A `workflow_job` delivery is 3–5 KB of which the normalizer reads a few
//! hundred bytes, and building the whole `Value` tree (a `String` and a map
//! node for every member) was most of a delivery's CPU cost. This parse runs
//! serde_json's own parser over the same bytes but builds only the members
//! whose key is in the normalizer's allowlist, at every depth, and skips the
//! value of every other member with [`IgnoredAny`]. Arrays and scalars are
//! kept as they are.
//!
//! The result is an ordinary `Value`, so the normalizers and the JSON paths
//! their errors name ([`crate::json::Obj`]) do not change: every member the
//! normalizer looks up by a listed key is exactly what the full parse gives.
//! A key the normalizer reads but the list lacks would read as absent; the
//! tests in `equivalence.rs` record every key the normalizers look up and
//! fail on one the list lacks.
//!
//! Skipped values are still checked for JSON syntax, and the body must be
//! UTF-8, so a malformed body is rejected as before, with the same message
//! (the position may be one column off for a bad character inside a skipped
//! string). What a skipped value is no longer checked for is what only
//! building it would check: a number beyond `f64` (`1e400`), a `\u` escape
//! that is a lone surrogate, and nesting deeper than serde_json's 128
//! levels. A delivery is not rejected for such a value in a member nothing
//! reads.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `bytes` as one JSON value, keeping only the object members whose
/// key is in `keep`.
pub(crate) fn parse(bytes: &[u8], keep: &'static KeySet) -> serde_json::Result<Value> {
    // Skipped strings are not checked for UTF-8 by serde_json, so check the
    // whole body once; with that done, kept strings need no second check.
    let Ok(text) = std::str::from_utf8(bytes) else {
        // Not UTF-8, so not JSON: let the full parser say where and why, in
        // the same words as before.
        return serde_json::from_slice(bytes);
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Keep(keep).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A fixed set of object keys, built at compile time.
///
/// Every member of a body is looked up here, most of them in vain, so the
/// lookup must be cheap for a key that is not in the set: the keys are
/// bucketed by first byte and only a candidate of the same length is
/// compared byte by byte. (A binary search over the sorted keys spent most of
/// the parse in `memcmp`.)
#[derive(Debug)]
pub(crate) struct KeySet {
    keys: &'static [&'static str],
    /// For each first byte, the range of `keys` that start with it.
    by_first: [(u8, u8); 256],
}

impl KeySet {
    /// The set of `keys`, which must be non-empty strings, strictly ascending
    /// (so a list is easy to check by eye, and each first-byte bucket is one
    /// range) and fewer than 256. Checked at compile time when used in a
    /// `const` or `static`.
    pub(crate) const fn new(keys: &'static [&'static str]) -> Self {
        assert!(keys.len() < 256, "at most 255 keys");
        let mut by_first = [(0_u8, 0_u8); 256];
        let mut i = 0;
        while i < keys.len() {
            let key = keys[i].as_bytes();
            assert!(!key.is_empty(), "keys must not be empty");
            if i > 0 {
                assert!(
                    ascending(keys[i - 1].as_bytes(), key),
                    "keys must be sorted and unique"
                );
            }
            let first = key[0] as usize;
            let (start, end) = by_first[first];
            // `i < 256`, checked above.
            let here = i as u8;
            by_first[first] = if start == end {
                (here, here + 1)
            } else {
                (start, here + 1)
            };
            i += 1;
        }
        Self { keys, by_first }
    }

    /// True when `key` is in the set.
    pub(crate) fn contains(&self, key: &str) -> bool {
        let Some(&first) = key.as_bytes().first() else {
            return false;
        };
        let (start, end) = self.by_first[usize::from(first)];
        self.keys
            .get(usize::from(start)..usize::from(end))
            .unwrap_or_default()
            .iter()
            .any(|k| k.len() == key.len() && *k == key)
    }

    /// The keys, in order.
    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &'static [&'static str] {
        self.keys
    }
}

/// `a < b`, bytewise, usable in `const`.
const fn ascending(a: &[u8], b: &[u8]) -> bool {
    let mut i = 0;
    while i < a.len() && i < b.len() {
        if a[i] != b[i] {
            return a[i] < b[i];
        }
        i += 1;
    }
    a.len() < b.len()
}

/// A `Value` with only the listed members of every object.
#[derive(Clone, Copy)]
struct Keep(&'static KeySet);

impl<'de> DeserializeSeed<'de> for Keep {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Keep {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    // The scalars exactly as `Value`'s own `Deserialize` builds them.
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(key) = map.next_key_seed(Key(self.0))? {
            match key {
                Some(key) => {
                    let value = map.next_value_seed(self)?;
                    // Last one wins on a repeated key, as in `Value`.
                    members.insert(key, value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(members))
    }
}

/// An object key: `Some` (owned) when listed, `None` when its value is to be
/// skipped. Unlisted keys are compared where they lie and never copied.
#[derive(Clone, Copy)]
struct Key(&'static KeySet);

impl Key {
    fn keep(self, key: &str) -> Option<String> {
        self.0.contains(key).then(|| key.to_owned())
    }
}

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.keep(v))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(self.0.contains(&v).then_some(v))
    }
}

#[cfg(test)]
mod equivalence;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEEP: &KeySet = &KeySet::new(&["a", "b", "id"]);

    /// `v` with every member whose key is not in `keep` removed, at every
    /// depth: what [`parse`] must give.
    pub(super) fn pruned(v: &Value, keep: &KeySet) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| keep.contains(k))
                    .map(|(k, v)| (k.clone(), pruned(v, keep)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| pruned(v, keep)).collect()),
            other => other.clone(),
        }
    }

    #[test]
    fn keeps_listed_members_at_every_depth() {
        let body = br#"{"a": {"id": 1, "x": {"id": 2}, "b": [{"id": 3, "y": 4}, 5, "s", null]},
                        "z": {"a": 1}, "b": -1.5, "id": "\u00e9\n"}"#;
        let v = parse(body, KEEP).expect("parses");
        assert_eq!(
            v,
            json!({"a": {"id": 1, "b": [{"id": 3}, 5, "s", null]}, "b": -1.5, "id": "é\n"})
        );
        let full: Value = serde_json::from_slice(body).expect("parses");
        assert_eq!(v, pruned(&full, KEEP));
        // Non-objects at the top stay what they are.
        assert_eq!(parse(b"[1, {\"q\": 2}]", KEEP).ok(), Some(json!([1, {}])));
        assert_eq!(parse(b" 7 ", KEEP).ok(), Some(json!(7)));
    }

    #[test]
    fn repeated_and_escaped_keys_behave_like_value() {
        for body in [
            br#"{"a": 1, "a": 2}"#.as_slice(),
            br#"{"\u0061": 1, "x": {"a": 3}}"#,
            br#"{"a\u0000": 1, "a": {"\u0069d": 9}}"#,
        ] {
            let full: Value = serde_json::from_slice(body).expect("parses");
            assert_eq!(parse(body, KEEP).ok(), Some(pruned(&full, KEEP)));
        }
    }

    /// `e`'s message without its position.
    fn what(e: &serde_json::Error) -> String {
        let text = e.to_string();
        text.split(" at line ")
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn malformed_json_fails_with_the_same_error() {
        for body in [
            b"".as_slice(),
            b"{",
            b"{\"a\": 1,}",
            b"{\"x\": [1, 2}",
            b"{\"x\": tru}",
            b"{\"x\": 01}",
            b"{\"x\": \"\\q\"}",
            b"{\"x\": \"a\x01b\"}",
            b"{\"x\": \"\xff\"}",
            b"{\"a\": \"\xc3\"}",
            b"{\"x\" 1}",
            b"{} {}",
            b"{\"x\": 1} x",
        ] {
            let full = serde_json::from_slice::<Value>(body).expect_err("malformed");
            let ours = parse(body, KEEP).expect_err("malformed");
            assert_eq!(what(&ours), what(&full), "{body:?}");
            // Skipping a string reports a bad character where it lies,
            // building it one column further on.
            assert_eq!(ours.line(), full.line(), "{body:?}");
            assert!(full.column().abs_diff(ours.column()) <= 1, "{body:?}");
        }
    }

    #[test]
    fn skipped_values_are_not_built_or_range_checked() {
        // Nothing reads these members, so nothing rejects the delivery for
        // them (the full parse would).
        let deep = format!("{{\"x\": {}1{}}}", "[".repeat(200), "]".repeat(200));
        for body in [
            br#"{"x": 1e400, "a": 1}"#.as_slice(),
            br#"{"x": "\ud800", "a": 1}"#,
            deep.as_bytes(),
        ] {
            assert!(serde_json::from_slice::<Value>(body).is_err());
            assert!(parse(body, KEEP).is_ok(), "{body:?}");
        }
        // The same in a kept member is still an error.
        assert!(parse(br#"{"a": 1e400}"#, KEEP).is_err());
        assert!(parse(br#"{"a": "\ud800"}"#, KEEP).is_err());
    }
}
