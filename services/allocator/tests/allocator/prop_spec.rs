//! Property tests of `parse_spec`, the entry point the `fuzz_spec` target
//! drives, with the same checks (`src/testing/spec.rs`): specs built from
//! `pkg@version`, `+variant`, `~variant`, `-variant`, `key=value`,
//! `arch=...` and `%compiler@version` in any order and spelling parse to
//! exactly the workload they describe; random and mutated specs keep the
//! parser's promises.

use proptest::prelude::*;
use proptest::sample::Index;
use runyard_allocator::model::{Workload, parse_spec};
use runyard_allocator::testing::spec;
use runyard_store::workload::normalize_variants;

/// One part of a spec, with what it contributes to the workload.
#[derive(Debug, Clone)]
enum Part {
    /// `pkg@version`, `pkg@=version` or `pkg @version`.
    Package(String, String, u8),
    Compiler(String, String),
    /// The variant as written, and as the workload holds it.
    Variant(String, String),
    Arch(String),
}

impl Part {
    fn text(&self) -> String {
        match self {
            Part::Package(name, version, 0) => format!("{name}@{version}"),
            Part::Package(name, version, 1) => format!("{name}@={version}"),
            Part::Package(name, version, _) => format!("{name} @{version}"),
            Part::Compiler(name, version) => format!("%{name}@{version}"),
            Part::Variant(written, _) => written.clone(),
            Part::Arch(arch) => format!("arch={arch}"),
        }
    }

    /// `%`, `+` and `~` start a token without a space before them.
    fn glues(&self) -> bool {
        self.text().starts_with(['%', '+', '~'])
    }
}

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_.-]{0,11}"
}

fn version() -> impl Strategy<Value = String> {
    "[0-9][0-9a-z._-]{0,7}"
}

fn variant() -> impl Strategy<Value = Part> {
    prop_oneof![
        name().prop_map(|n| Part::Variant(format!("+{n}"), format!("+{n}"))),
        name().prop_map(|n| Part::Variant(format!("~{n}"), format!("~{n}"))),
        name().prop_map(|n| Part::Variant(format!("-{n}"), format!("~{n}"))),
        (name(), "[a-z0-9_.:;,/-]{1,8}")
            .prop_filter("arch is not a variant", |(k, _)| k != "arch")
            .prop_map(|(k, v)| Part::Variant(format!("{k}={v}"), format!("{k}={v}"))),
    ]
}

/// The parts of a valid spec, shuffled, and the workload they describe.
fn valid_spec() -> impl Strategy<Value = (Vec<Part>, Workload)> {
    (
        (name(), version(), 0_u8..3),
        (name(), version()),
        prop::collection::vec(variant(), 0..6),
        prop::option::of("[a-z0-9_]{1,8}(-[a-z0-9_.]{1,8}){0,2}"),
    )
        .prop_flat_map(|((pkg, ver, form), (cc, cc_ver), variants, arch)| {
            let mut w = Workload::new();
            w.insert("package".into(), pkg.clone());
            w.insert("version".into(), ver.clone());
            w.insert("compiler".into(), cc.clone());
            w.insert("compiler_version".into(), cc_ver.clone());
            let held: Vec<&str> = variants
                .iter()
                .map(|v| match v {
                    Part::Variant(_, held) => held.as_str(),
                    _ => unreachable!("only variants"),
                })
                .collect();
            w.insert("variants".into(), normalize_variants(&held.join(" ")));
            let mut parts = vec![Part::Package(pkg, ver, form), Part::Compiler(cc, cc_ver)];
            parts.extend(variants);
            if let Some(arch) = arch {
                w.insert("arch".into(), arch.clone());
                parts.push(Part::Arch(arch));
            }
            (Just(parts).prop_shuffle(), Just(w))
        })
}

/// `parts` joined by runs of spaces, or glued where a part may be.
fn spell(parts: &[Part], glue: &[bool], spaces: &[usize]) -> String {
    let mut spec = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 && !(part.glues() && glue.get(i).copied().unwrap_or_default()) {
            let n = spaces.get(i).copied().unwrap_or(1);
            spec.push_str(&" ".repeat(n + 1));
        }
        spec.push_str(&part.text());
    }
    spec
}

/// A spec as written: the parts spelled with random separators.
fn written_spec() -> impl Strategy<Value = (String, Workload)> {
    (
        valid_spec(),
        prop::collection::vec(any::<bool>(), 12),
        prop::collection::vec(0_usize..3, 12),
    )
        .prop_map(|((parts, w), glue, spaces)| (spell(&parts, &glue, &spaces), w))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A spec parses to exactly the workload its parts describe, whatever
    /// their order and spelling.
    #[test]
    fn written_specs_parse_to_their_workload((spec, want) in written_spec()) {
        let got = parse_spec(&spec);
        spec::check(&got);
        prop_assert_eq!(got, Ok(want), "{:?}", spec);
    }

    /// Random text over the spec alphabet, and any text: no panic, and
    /// whatever is accepted keeps the parser's promises.
    #[test]
    fn random_specs_keep_the_promises(
        spec in prop_oneof![
            3 => "[a-z0-9@%+~^=._ -]{0,40}",
            1 => any::<String>(),
        ],
    ) {
        spec::check(&parse_spec(&spec));
    }

    /// A valid spec with characters inserted or replaced.
    #[test]
    fn mutated_specs_keep_the_promises(
        (spec, _) in written_spec(),
        edits in prop::collection::vec((any::<Index>(), prop::sample::select(&['@', '%', '+', '~', '-', '=', '^', ' ', 'a', '1', '.', '\u{0}', '\u{a0}', 'é'][..]), any::<bool>()), 1..4),
    ) {
        let mut chars: Vec<char> = spec.chars().collect();
        for (at, c, insert) in edits {
            let i = at.index(chars.len() + 1);
            if insert || i == chars.len() {
                chars.insert(i, c);
            } else {
                chars[i] = c;
            }
        }
        let spec: String = chars.into_iter().collect();
        spec::check(&parse_spec(&spec));
    }

    /// What the parser does not take is refused, naming it: a second
    /// compiler, a dependency, a second package, a bad character in a
    /// name, a control character.
    #[test]
    fn refused_parts_are_named(
        (spec, _) in written_spec(),
        bad in prop_oneof![
            Just(("%clang@17", "second compiler")),
            Just(("^cmake@3.27", "dependencies are not supported")),
            Just(("bzip2@1.0", "one package per spec")),
            Just(("zl!b@1.0", "one package per spec")),
            Just(("+sha!red", "invalid variant")),
            Just(("arch=a arch=b", "second arch")),
            Just(("\u{7}", "control character")),
        ],
    ) {
        let (part, why) = bad;
        // A spec that names its arch already says "second arch" for one more.
        let why = if spec.contains("arch=") && part.starts_with("arch=") { "second arch" } else { why };
        let err = parse_spec(&format!("{spec} {part}")).expect_err("refused").to_string();
        prop_assert!(err.starts_with("spec: ") && err.contains(why), "{:?}: {}", spec, err);
    }
}

#[test]
fn canonical_spelling_is_the_documented_one() {
    let w = parse_spec("py-torch@2.3.1 +cuda~rocm arch=x86_64_v3%gcc@12.3.0").expect("valid");
    assert_eq!(
        spec::canonical(&w),
        "py-torch@2.3.1 %gcc@12.3.0 +cuda ~rocm arch=x86_64_v3"
    );
    spec::check(&Ok(w));
}
