//! Workload keys: the normalized identity of "the same workload" across jobs.
//!
//! A workload is a map of attributes (`package`, `version`, `variants`,
//! `compiler`, ... for Spack; `repo`, `workflow`, `job` for GitHub). Its key is
//! the attributes sorted by name, with Spack variants made order-insensitive,
//! so `+cuda~rocm` and `~rocm +cuda` are one workload.

use std::collections::BTreeMap;

/// The attribute holding Spack variants.
pub const VARIANTS: &str = "variants";

/// Normalizes a Spack variants string: `+cuda~rocm cuda_arch=80` and
/// `cuda_arch=80 ~rocm+cuda` both become `+cuda cuda_arch=80 ~rocm`.
pub fn normalize_variants(variants: &str) -> String {
    let mut tokens: Vec<String> = Vec::new();
    for chunk in variants.split_whitespace() {
        if chunk.contains('=') {
            tokens.push(chunk.to_owned());
            continue;
        }
        let mut current = String::new();
        for c in chunk.chars() {
            if (c == '+' || c == '~') && !current.is_empty() {
                tokens.push(std::mem::take(&mut current));
            }
            current.push(c);
        }
        if !current.is_empty() {
            tokens.push(current);
        }
    }
    // Sort by variant name, then by the whole token, so `+a` and `~a` sit
    // together and the order never depends on how it was written.
    tokens.sort_by(|a, b| {
        let name = |t: &str| t.trim_start_matches(['+', '~']).to_owned();
        name(a).cmp(&name(b)).then_with(|| a.cmp(b))
    });
    tokens.dedup();
    tokens.join(" ")
}

/// Escapes the separators so distinct workloads never share a key.
fn escape(s: &str) -> String {
    s.replace('%', "%25")
        .replace(';', "%3B")
        .replace('=', "%3D")
}

/// The normalized key of a workload (or of a subset of its attributes):
/// `name=value` pairs sorted by name and joined with `;`. Empty values are
/// left out, names and values are trimmed.
pub fn key<'a>(attributes: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut sorted: BTreeMap<&str, String> = BTreeMap::new();
    for (name, value) in attributes {
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() || value.is_empty() {
            continue;
        }
        let value = if name == VARIANTS {
            normalize_variants(value)
        } else {
            value.to_owned()
        };
        sorted.insert(name, value);
    }
    sorted
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect::<Vec<_>>()
        .join(";")
}

/// The workload of a GitHub job: `{repo, workflow, job}`, `job` being the
/// display name its webhooks carry (`workflow_job.name`, matrix values
/// included). Usage samples of GitHub jobs are keyed by this whatever the
/// report sent, so a report and the scaler's sizing always meet.
pub fn github(repo: &str, workflow: &str, job: &str) -> BTreeMap<String, String> {
    [("repo", repo), ("workflow", workflow), ("job", job)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Undoes [`escape`].
fn unescape(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    s.replace("%3B", ";")
        .replace("%3D", "=")
        .replace("%25", "%")
}

/// The attributes a key was made of, as [`key`] normalized them: `key` of
/// the result is `full` again. Pairs without `=` are skipped.
pub fn parse_key(full: &str) -> BTreeMap<String, String> {
    full.split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (unescape(name), unescape(value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn variants_are_order_insensitive() {
        assert_eq!(normalize_variants("+cuda~rocm"), "+cuda ~rocm");
        assert_eq!(normalize_variants("~rocm +cuda"), "+cuda ~rocm");
        assert_eq!(
            normalize_variants("cuda_arch=80 ~rocm+cuda"),
            normalize_variants("+cuda~rocm cuda_arch=80")
        );
        assert_eq!(normalize_variants(""), "");
    }

    #[test]
    fn keys_are_sorted_and_skip_empty_values() {
        let k = key([
            ("version", "2.3.1"),
            ("package", "py-torch"),
            ("variants", "~rocm+cuda"),
            ("arch", ""),
        ]);
        assert_eq!(k, "package=py-torch;variants=+cuda ~rocm;version=2.3.1");
    }

    #[test]
    fn separators_in_values_cannot_forge_another_key() {
        assert_ne!(key([("a", "1;b=2")]), key([("a", "1"), ("b", "2")]));
    }

    proptest! {
        #[test]
        fn key_does_not_depend_on_attribute_order(
            mut pairs in proptest::collection::vec(("[a-z]{1,5}", "[a-z0-9.+~]{0,8}"), 0..6)
        ) {
            pairs.sort();
            pairs.dedup_by(|a, b| a.0 == b.0);
            let forward = key(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let backward = key(pairs.iter().rev().map(|(k, v)| (k.as_str(), v.as_str())));
            prop_assert_eq!(forward, backward);
        }

        #[test]
        fn a_parsed_key_keys_to_itself(
            pairs in proptest::collection::vec(
                ("(variants|[a-z_%;= ]{1,6})", "[a-z0-9.+~%;= ]{0,12}"), 0..6)
        ) {
            let full = key(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let parsed = parse_key(&full);
            let again = key(parsed.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            prop_assert_eq!(again, full);
        }
    }
}
