//! The filtered parse changes nothing the normalizers return.
//!
//! For every fixture, every fixture with one member removed or given another
//! value, and the generated inputs of `tests/forge/fuzz.rs`, normalizing with
//! the allowlists (what ingest runs) gives exactly what normalizing the fully
//! parsed body gives, errors included.
//!
//! And the normalizers look up no key outside their allowlist: every key
//! they look up while normalizing the fully parsed bodies is recorded,
//! whether the body has it or not, so a key missing from a list fails here
//! even when no fixture carries it. The lists are also checked to hold
//! nothing that is never looked up.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::KeySet;
use super::tests::pruned;
use crate::json::reads;
use crate::testing::generators;
use crate::{GithubDelivery, GitlabDelivery, Members, Normalized, PayloadError, github, gitlab};

/// What the full parse rejects and the filtered parse does not check in a
/// member it skips (see the module docs of `filter`).
const SKIPPED_CHECKS: &[&str] = &[
    "number out of range",
    "lone leading surrogate in hex escape",
    "unexpected end of hex escape",
    "recursion limit exceeded",
];

/// The keys each normalizer looked up.
#[derive(Debug, Default)]
struct Reads {
    github: BTreeSet<String>,
    gitlab: BTreeSet<String>,
}

/// The ways ingest normalizes a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    /// `workflow_job`, as JSON and form-encoded.
    Github,
    /// `Job Hook`, with and without `X-Gitlab-Instance`.
    GitlabJob,
    /// `Pipeline Hook`, likewise.
    GitlabPipeline,
}

const EVERY_HOOK: &[Hook] = &[Hook::Github, Hook::GitlabJob, Hook::GitlabPipeline];

/// Normalizes `body` as each of `hooks`, once from the full parse and once
/// from the filtered one, and fails unless both agree (see [`same`]).
fn agree(
    hooks: &[Hook],
    body: &[u8],
    content_type: Option<&str>,
    received_at: OffsetDateTime,
    fuzzy: bool,
    reads: &mut Reads,
) -> Result<(), TestCaseError> {
    if hooks.contains(&Hook::Github) {
        let form = serde_urlencoded::to_string([("payload", String::from_utf8_lossy(body))])
            .expect("encodes");
        let encodings = [
            (content_type, body),
            (Some("application/x-www-form-urlencoded"), form.as_bytes()),
        ];
        for (ct, body) in encodings {
            let d = GithubDelivery {
                event: Some("workflow_job"),
                delivery_id: Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                hook_id: Some("292430182"),
                enterprise_host: None,
                content_type: ct,
                body,
                received_at,
            };
            let mut full = None;
            reads.github.extend(reads::during(|| {
                full = Some(github::normalize(&d, Members::All))
            }));
            same(full, &crate::normalize_github(&d), fuzzy, body)?;
        }
    }
    for (hook, event) in [
        (Hook::GitlabJob, "Job Hook"),
        (Hook::GitlabPipeline, "Pipeline Hook"),
    ] {
        if !hooks.contains(&hook) {
            continue;
        }
        for instance in [Some("https://gitlab.example.com"), None] {
            let d = GitlabDelivery {
                event: Some(event),
                idempotency_key: Some("6c5f8a1e-1b0e-4f5e-9c55-2f1a7c7b9e10"),
                event_uuid: None,
                webhook_uuid: Some("a3f1c2d4"),
                instance,
                content_type,
                body,
                received_at,
            };
            let mut full = None;
            reads.gitlab.extend(reads::during(|| {
                full = Some(gitlab::normalize(&d, Members::All))
            }));
            same(full, &crate::normalize_gitlab(&d), fuzzy, body)?;
        }
    }
    Ok(())
}

/// Fails unless the full and filtered outcomes are equal. With `fuzzy`
/// (input that need not be JSON), a body the full parse rejects may be
/// rejected in other words — naming the same field, but with the position
/// or the first fault found differing — or, for one of the
/// [`SKIPPED_CHECKS`], accepted.
fn same(
    full: Option<Result<Normalized, PayloadError>>,
    filtered: &Result<Normalized, PayloadError>,
    fuzzy: bool,
    body: &[u8],
) -> Result<(), TestCaseError> {
    let full = full.expect("normalized");
    if full == *filtered {
        return Ok(());
    }
    let not_json = |r: &Result<Normalized, PayloadError>| match r {
        Err(PayloadError::Invalid { field, reason }) if reason.starts_with("not valid JSON") => {
            Some((field.clone(), reason.clone()))
        }
        _ => None,
    };
    let excused = match (not_json(&full), not_json(filtered)) {
        (Some((full_field, _)), Some((field, _))) => full_field == field,
        (Some((_, reason)), None) => SKIPPED_CHECKS.iter().any(|s| reason.contains(s)),
        _ => false,
    };
    prop_assert!(
        fuzzy && excused,
        "full parse: {full:?}\nfiltered:   {filtered:?}\nbody: {}",
        String::from_utf8_lossy(body)
    );
    Ok(())
}

/// Every fixture in `tests/fixtures/` (read at run time, so a new one is
/// covered without being listed).
fn fixtures() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .expect("fixtures directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(&path).expect("fixture is readable");
            (name, text)
        })
        .collect();
    all.sort();
    assert!(all.len() >= 10, "fixtures found: {}", all.len());
    all
}

/// `fixture` as is, then with each member in turn removed or replaced by
/// each of a few values (so every read also meets a wrong type, and every
/// fallback for an absent member is taken).
fn variants(fixture: &str) -> Vec<Vec<u8>> {
    let original: Value = serde_json::from_str(fixture).expect("fixture is JSON");
    let mut all = vec![fixture.as_bytes().to_vec()];
    let mut paths = Vec::new();
    generators::pointers(&original, "", &mut paths);
    let replacements = [
        None,
        Some(Value::Null),
        Some(json!("x")),
        Some(json!(0)),
        Some(json!({})),
    ];
    for path in &paths {
        for replacement in &replacements {
            let mut v = original.clone();
            match replacement {
                Some(new) => {
                    if let Some(slot) = v.pointer_mut(path) {
                        *slot = new.clone();
                    }
                }
                None => {
                    let (parent, key) = path.rsplit_once('/').expect("pointers have a slash");
                    match v.pointer_mut(parent) {
                        Some(Value::Object(m)) => {
                            m.remove(&key.replace("~1", "/").replace("~0", "~"));
                        }
                        Some(Value::Array(items)) => {
                            if let Ok(i) = key.parse::<usize>() {
                                items.remove(i);
                            }
                        }
                        _ => {}
                    }
                }
            }
            all.push(serde_json::to_vec(&v).expect("serializes"));
        }
    }
    all
}

#[test]
fn fixtures_and_their_variants_normalize_the_same() {
    let mut reads = Reads::default();
    for (name, fixture) in fixtures() {
        let rx = generators::FIXTURE_RX;
        agree(EVERY_HOOK, fixture.as_bytes(), None, rx, false, &mut reads)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Variants only through the hook the fixture is for.
        let hook = if name.contains("github_") {
            Hook::Github
        } else if name.contains("gitlab_job_") {
            Hook::GitlabJob
        } else if name.contains("gitlab_pipeline_") {
            Hook::GitlabPipeline
        } else {
            continue;
        };
        for body in variants(&fixture) {
            agree(&[hook], &body, None, rx, false, &mut reads)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    for (forge, read, listed) in [
        ("github", &reads.github, &github::KEYS),
        ("gitlab", &reads.gitlab, &gitlab::KEYS),
    ] {
        let listed: BTreeSet<String> = listed.as_slice().iter().map(|k| k.to_string()).collect();
        let missing: Vec<_> = read.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "{forge}: keys read but not in its KEYS: {missing:?}"
        );
        let unused: Vec<_> = listed.difference(read).collect();
        assert!(
            unused.is_empty(),
            "{forge}: keys in its KEYS never read: {unused:?}"
        );
    }
}

/// The filtered value is the full one with unlisted members removed.
fn prunes(body: &[u8], keys: &'static KeySet) -> Result<(), TestCaseError> {
    let full: Value = serde_json::from_slice(body).expect("generated JSON parses");
    let filtered = super::parse(body, keys).expect("generated JSON parses filtered");
    prop_assert_eq!(filtered, pruned(&full, keys));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_normalize_the_same(
        body in prop::collection::vec(any::<u8>(), 0..512),
        ct in generators::content_type(),
        rx in generators::received_at(),
    ) {
        agree(EVERY_HOOK, &body, ct.as_deref(), rx, true, &mut Reads::default())?;
    }

    #[test]
    fn arbitrary_json_normalizes_the_same(value in generators::json(), rx in generators::received_at()) {
        let body = serde_json::to_vec(&value).expect("serializes");
        agree(EVERY_HOOK, &body, None, rx, false, &mut Reads::default())?;
        prunes(&body, &github::KEYS)?;
        prunes(&body, &gitlab::KEYS)?;
    }

    #[test]
    fn mutated_fixtures_normalize_the_same(
        which in any::<Index>(),
        muts in generators::mutations(),
        rx in generators::received_at(),
    ) {
        let all: Vec<&str> = generators::GITHUB_FIXTURES
            .iter()
            .chain(generators::GITLAB_JOB_FIXTURES)
            .chain([&generators::GITLAB_PIPELINE])
            .copied()
            .collect();
        let body = generators::mutate(all[which.index(all.len())], &muts);
        agree(EVERY_HOOK, &body, None, rx, false, &mut Reads::default())?;
        prunes(&body, &github::KEYS)?;
        prunes(&body, &gitlab::KEYS)?;
    }
}
