//! Typed reads from a `serde_json::Value` that name the JSON path of whatever
//! is wrong.
//!
//! Deriving `Deserialize` would be shorter, but serde's errors say "invalid
//! type at line 1 column 812", and the ingest contract wants the field. So
//! the normalizers walk the payload with these helpers, each of which knows
//! its own path (`workflow_job.id`, `builds[2].created_at`).
//!
//! Conventions: `null` counts as absent (forges send `null` for "not yet"),
//! unknown keys are ignored (forges add fields all the time), and a present
//! value of the wrong type is an error rather than silently dropped.

use serde_json::{Map, Value};
use time::OffsetDateTime;

use crate::PayloadError;
use crate::timestamps;

/// Longest key of an open map (usage `workload`) that an error's field
/// names; a longer one, or one with a control character, is not echoed.
const MAX_ECHOED_KEY: usize = 64;

/// A JSON object together with the path it sits at.
#[derive(Debug, Clone)]
pub(crate) struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    /// The body as a whole, which must be an object (error field `body`).
    pub(crate) fn root(value: &'a Value) -> Result<Self, PayloadError> {
        Self::root_named(value, "body")
    }

    /// Like [`Obj::root`], with the error naming `field` instead of `body`.
    pub(crate) fn root_named(value: &'a Value, field: &str) -> Result<Self, PayloadError> {
        match value {
            Value::Object(map) => Ok(Self {
                map,
                path: String::new(),
            }),
            _ => Err(PayloadError::invalid(field, "expected a JSON object")),
        }
    }

    /// The JSON path of `key` inside this object.
    pub(crate) fn path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The value at `key`, `None` when absent or `null`. Every read of a
    /// member goes through here.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        #[cfg(test)]
        reads::record(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, expected: &str) -> PayloadError {
        PayloadError::invalid(self.path(key), format!("expected {expected}"))
    }

    fn missing(&self, key: &str) -> PayloadError {
        PayloadError::invalid(self.path(key), "missing")
    }

    /// A nested object that must be there.
    pub(crate) fn req_obj(&self, key: &str) -> Result<Obj<'a>, PayloadError> {
        self.opt_obj(key)?.ok_or_else(|| self.missing(key))
    }

    /// A nested object, if present.
    pub(crate) fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Obj {
                map,
                path: self.path(key),
            })),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }

    /// An array of objects (`builds`), empty when absent.
    pub(crate) fn opt_obj_array(&self, key: &str) -> Result<Vec<Obj<'a>>, PayloadError> {
        let Some(value) = self.get(key) else {
            return Ok(Vec::new());
        };
        let Value::Array(items) = value else {
            return Err(self.wrong(key, "an array"));
        };
        let base = self.path(key);
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(map) => Ok(Obj {
                    map,
                    path: format!("{base}[{i}]"),
                }),
                _ => Err(PayloadError::invalid(
                    format!("{base}[{i}]"),
                    "expected an object",
                )),
            })
            .collect()
    }

    /// An id: a positive integer that must be there.
    pub(crate) fn req_id(&self, key: &str) -> Result<u64, PayloadError> {
        self.opt_id(key)?.ok_or_else(|| self.missing(key))
    }

    /// An id, if present: a positive integer (ids start at 1 on both forges,
    /// so a 0 is a forged or broken payload).
    pub(crate) fn opt_id(&self, key: &str) -> Result<Option<u64>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.wrong(key, "a positive integer")),
            },
        }
    }

    /// A count or size that must be there: a non-negative integer.
    pub(crate) fn req_u64(&self, key: &str) -> Result<u64, PayloadError> {
        self.opt_u64(key)?.ok_or_else(|| self.missing(key))
    }

    /// A count or size, if present: a non-negative integer.
    pub(crate) fn opt_u64(&self, key: &str) -> Result<Option<u64>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a non-negative integer")),
        }
    }

    /// A signed 32-bit integer, if present (exit codes).
    pub(crate) fn opt_i32(&self, key: &str) -> Result<Option<i32>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a 32-bit integer")),
        }
    }

    /// A duration or amount, if present: a finite non-negative number
    /// (integer or not).
    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
                _ => Err(self.wrong(key, "a non-negative number")),
            },
        }
    }

    /// A boolean, if present.
    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong(key, "a boolean")),
        }
    }

    /// A string that must be there.
    pub(crate) fn req_str(&self, key: &str) -> Result<&'a str, PayloadError> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    /// A string, if present.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, PayloadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    /// A string, or `""` when absent: for proto3 string fields, where empty
    /// already means "not known".
    pub(crate) fn str_or_empty(&self, key: &str) -> Result<String, PayloadError> {
        Ok(self.opt_str(key)?.unwrap_or_default().to_owned())
    }

    /// An array of strings (labels, tags), empty when absent.
    pub(crate) fn opt_str_array(&self, key: &str) -> Result<Vec<String>, PayloadError> {
        let Some(value) = self.get(key) else {
            return Ok(Vec::new());
        };
        let Value::Array(items) = value else {
            return Err(self.wrong(key, "an array of strings"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                _ => Err(PayloadError::invalid(
                    format!("{}[{i}]", self.path(key)),
                    "expected a string",
                )),
            })
            .collect()
    }

    /// An object of string values (usage `workload`), empty when absent.
    pub(crate) fn opt_str_map(
        &self,
        key: &str,
    ) -> Result<std::collections::HashMap<String, String>, PayloadError> {
        let Some(obj) = self.opt_obj(key)? else {
            return Ok(Default::default());
        };
        obj.map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                // The key is the sender's: echo it only when it is short
                // and printable, else name the map.
                _ if k.len() <= MAX_ECHOED_KEY && !k.chars().any(char::is_control) => {
                    Err(obj.wrong(k, "a string"))
                }
                _ => Err(PayloadError::invalid(
                    obj.path.clone(),
                    "expected a string for every member",
                )),
            })
            .collect()
    }

    /// A timestamp, if present, in any format the forges use and within the
    /// plausible window around `received_at` (see [`timestamps::check`]).
    pub(crate) fn opt_time(
        &self,
        key: &str,
        received_at: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, PayloadError> {
        let Some(s) = self.opt_str(key)? else {
            return Ok(None);
        };
        let field = || self.path(key);
        let t = timestamps::parse(s)
            .ok_or_else(|| PayloadError::invalid(field(), "not a recognised timestamp"))?;
        timestamps::check(t, received_at)
            .map(Some)
            .map_err(|reason| PayloadError::invalid(field(), reason))
    }
}

/// The keys looked up through [`Obj::get`], recorded in tests so that the
/// `filter` tests can check each one is in its normalizer's allowlist.
#[cfg(test)]
pub(crate) mod reads {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    thread_local! {
        static READ: RefCell<Option<BTreeSet<String>>> = const { RefCell::new(None) };
    }

    pub(super) fn record(key: &str) {
        READ.with_borrow_mut(|read| {
            if let Some(read) = read {
                read.insert(key.to_owned());
            }
        });
    }

    /// Runs `f` and returns every key looked up meanwhile on this thread.
    pub(crate) fn during(f: impl FnOnce()) -> BTreeSet<String> {
        READ.set(Some(BTreeSet::new()));
        f();
        READ.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of<T: std::fmt::Debug>(r: Result<T, PayloadError>) -> String {
        r.expect_err("expected an error")
            .field()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn paths_name_nested_and_indexed_values() {
        let v = json!({"a": {"b": [{"id": 1}, {"id": "x"}], "t": ["ok", 3]}});
        let root = Obj::root(&v).expect("object");
        let a = root.req_obj("a").expect("a");
        let items = a.opt_obj_array("b").expect("array");
        assert_eq!(items.len(), 2);
        assert_eq!(items.first().map(|o| o.req_id("id").ok()), Some(Some(1)));
        assert_eq!(
            field_of(items.get(1).expect("second").req_id("id")),
            "a.b[1].id"
        );
        assert_eq!(field_of(a.opt_str_array("t")), "a.t[1]");
        assert_eq!(field_of(a.req_str("missing")), "a.missing");
    }

    #[test]
    fn numbers_are_checked() {
        let v = json!({"zero": 0, "neg": -1, "float": 1.5, "big": 1e30, "ok": 7,
                       "nan_like": "7", "dur": 1.25, "negdur": -0.5, "exit": -9,
                       "wide": 4294967296_u64});
        let o = Obj::root(&v).expect("object");
        assert_eq!(field_of(o.req_id("zero")), "zero");
        assert_eq!(field_of(o.req_id("neg")), "neg");
        assert_eq!(field_of(o.req_id("float")), "float");
        assert_eq!(field_of(o.req_id("big")), "big");
        assert_eq!(field_of(o.req_id("nan_like")), "nan_like");
        assert_eq!(o.req_id("ok").ok(), Some(7));
        assert_eq!(o.opt_u64("zero").ok(), Some(Some(0)));
        assert_eq!(o.opt_f64("dur").ok(), Some(Some(1.25)));
        assert_eq!(o.opt_f64("ok").ok(), Some(Some(7.0)));
        assert_eq!(field_of(o.opt_f64("negdur")), "negdur");
        assert_eq!(o.opt_i32("exit").ok(), Some(Some(-9)));
        assert_eq!(field_of(o.opt_i32("wide")), "wide");
    }

    #[test]
    fn open_map_keys_are_echoed_only_when_short_and_printable() {
        let long = "k".repeat(MAX_ECHOED_KEY + 1);
        for (key, field) in [
            ("version", "w.version"),
            ("coy\u{7f}bytes", "w"),
            ("a\nb", "w"),
            ("a\u{0}", "w"),
            (long.as_str(), "w"),
        ] {
            let v = json!({ "w": { key: 1 } });
            let o = Obj::root(&v).expect("object");
            assert_eq!(field_of(o.opt_str_map("w")), field, "{key:?}");
        }
    }

    #[test]
    fn null_is_absent_but_wrong_types_are_not() {
        let v = json!({"n": null, "s": 1, "b": "true", "o": []});
        let o = Obj::root(&v).expect("object");
        assert_eq!(o.opt_str("n").ok(), Some(None));
        assert_eq!(o.opt_id("n").ok(), Some(None));
        assert!(o.opt_obj("n").expect("null object").is_none());
        assert_eq!(field_of(o.req_str("n")), "n");
        assert_eq!(field_of(o.opt_str("s")), "s");
        assert_eq!(field_of(o.opt_bool("b")), "b");
        assert_eq!(field_of(o.opt_obj("o")), "o");
        assert_eq!(field_of(Obj::root(&json!([1]))), "body");
    }
}
