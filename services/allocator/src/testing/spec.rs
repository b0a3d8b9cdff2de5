//! What `parse_spec` must satisfy, whatever the spec: the checks shared by
//! the property tests (`tests/allocator/prop_spec.rs`) and the fuzz target
//! (`fuzz/fuzz_targets/fuzz_spec.rs`). Each check panics with what is wrong.
//!
//! A rejection starts with `spec: `. An accepted spec is a workload of the
//! documented attributes with well-formed values and normalized variants;
//! its canonical spelling parses back to the same workload (unless that
//! spelling is over the length limit); it passes `validate` unless a value
//! is over-long (which the HTTP handler answers after parsing); and its
//! workload key gives it back.

use runyard_events::FieldError;
use runyard_store::workload::{key, normalize_variants, parse_key};

use crate::model::{Workload, parse_spec, validate};

/// The attributes a spec becomes, `arch` optional.
const ATTRIBUTES: [&str; 6] = [
    "arch",
    "compiler",
    "compiler_version",
    "package",
    "variants",
    "version",
];

/// Longest attribute value `validate` accepts.
const MAX_VALUE: usize = 1024;
/// Longest spec `parse_spec` accepts.
const MAX_SPEC: usize = 4096;

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Checks `parse_spec`'s answer to a spec.
pub fn check(result: &Result<Workload, FieldError>) {
    let w = match result {
        Err(e) => return assert_eq!(e.field, "spec", "error {e:?}"),
        Ok(w) => w,
    };
    for k in w.keys() {
        assert!(ATTRIBUTES.contains(&k.as_str()), "attribute {k:?}");
    }
    for k in ["package", "version", "compiler", "compiler_version"] {
        let v = w.get(k).unwrap_or_else(|| panic!("no {k}"));
        assert!(is_name(v), "{k} = {v:?}");
    }
    let variants = w.get("variants").expect("variants, even if empty");
    assert_eq!(&normalize_variants(variants), variants, "not normalized");
    for v in variants.split(' ').filter(|v| !v.is_empty()) {
        let ok = match v.strip_prefix(['+', '~']) {
            Some(name) => is_name(name),
            None => v.split_once('=').is_some_and(|(k, val)| {
                is_name(k) && k != "arch" && !val.is_empty() && !val.contains('=')
            }),
        };
        assert!(ok, "variant {v:?}");
    }
    if let Some(arch) = w.get("arch") {
        assert!(!arch.is_empty(), "empty arch");
        assert!(
            !arch.chars().any(|c| c.is_whitespace() || c.is_control()),
            "arch {arch:?}"
        );
    }

    // Spelled with a space between variants, a spec near the length limit
    // can come out longer than the limit.
    let spelled = canonical(w);
    if spelled.len() <= MAX_SPEC {
        let again = parse_spec(&spelled);
        assert_eq!(again.as_ref(), Ok(w), "canonical spelling {spelled:?}");
    }
    if w.values().all(|v| v.len() <= MAX_VALUE) {
        assert_eq!(validate(w), Ok(()));
    } else {
        assert!(validate(w).is_err());
    }
    let stored = parse_key(&key(w.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
    let mut kept = w.clone();
    kept.retain(|_, v| !v.is_empty());
    assert_eq!(stored, kept, "workload key");
}

/// A workload spelled as a spec: `pkg@version variants %compiler@version
/// arch=...`.
pub fn canonical(w: &Workload) -> String {
    let at = |k: &str| w.get(k).map(String::as_str).unwrap_or_default();
    let mut spec = format!(
        "{}@{} %{}@{}",
        at("package"),
        at("version"),
        at("compiler"),
        at("compiler_version")
    );
    for part in [
        at("variants").to_owned(),
        w.get("arch")
            .map(|a| format!("arch={a}"))
            .unwrap_or_default(),
    ] {
        if !part.is_empty() {
            spec.push(' ');
            spec.push_str(&part);
        }
    }
    spec
}
