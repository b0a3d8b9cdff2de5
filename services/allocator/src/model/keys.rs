//! Workload keys: the full key of a workload, the keys of its ladder
//! levels cut out of it, and the hashes the model indexes them by.

use std::hash::{BuildHasher, RandomState};

use runyard_store::workload;

use super::{VARIANTS, Workload};

/// Escapes an attribute name the way [`workload::key`] does.
pub(super) fn escape_name(name: &str) -> String {
    name.trim()
        .replace('%', "%25")
        .replace(';', "%3B")
        .replace('=', "%3D")
}

/// The key of a subset of a workload's attributes, cut out of its full key.
/// The full key is `name=value` pairs sorted by name with `%`, `;` and `=`
/// escaped, so its pairs whose (escaped) name is in `names`, in order, are
/// exactly what [`workload::key`] makes of the subset — without normalizing
/// the variants again for every ladder level.
pub(crate) fn sub_key(full: &str, names: &[String], out: &mut String) {
    out.clear();
    for pair in full.split(';') {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        if names.iter().any(|n| n == name) {
            if !out.is_empty() {
                out.push(';');
            }
            out.push_str(pair);
        }
    }
}

/// Appends `s` escaped the way [`workload::key`] escapes.
fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            ';' => out.push_str("%3B"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// The key of all of `workload`'s attributes: exactly
/// [`workload::key`] (a property test holds them equal), built in one
/// buffer because it runs on every `observe` and `recommend`.
pub(crate) fn full_key(workload: &Workload) -> String {
    if workload.keys().any(|k| k.trim().len() != k.len()) {
        // Names that trim differently may sort differently: the slow path.
        return workload::key(workload.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }
    let mut out = String::with_capacity(128);
    for (name, value) in workload {
        let value = value.trim();
        if name.is_empty() || value.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(';');
        }
        push_escaped(&mut out, name);
        out.push('=');
        if name == VARIANTS {
            push_escaped(&mut out, &workload::normalize_variants(value));
        } else {
            push_escaped(&mut out, value);
        }
    }
    out
}

/// The index of the ladder for `workload`: the first whose top level is
/// present.
pub(super) fn select_ladder(ladders: &[Vec<Vec<String>>], workload: &Workload) -> Option<usize> {
    ladders.iter().position(|ladder| {
        ladder.first().is_some_and(|top| {
            !top.is_empty()
                && top
                    .iter()
                    .all(|a| a == VARIANTS || workload.get(a).is_some_and(|v| !v.trim().is_empty()))
        })
    })
}

/// Two independently keyed hashes of a key. The model indexes windows and
/// workloads by the first and checks the second, so it stores no key strings
/// (a million samples' keys would cost more than the samples); two keys
/// colliding on both would need 2^64 tries against per-process random keys.
#[derive(Debug, Clone)]
pub(super) struct KeyHasher {
    first: RandomState,
    second: RandomState,
}

impl KeyHasher {
    pub(super) fn new() -> Self {
        Self {
            first: RandomState::new(),
            second: RandomState::new(),
        }
    }

    /// `(index, check)` hashes of `key`.
    pub(super) fn hash(&self, key: &str) -> (u64, u64) {
        (self.first.hash_one(key), self.second.hash_one(key))
    }
}
