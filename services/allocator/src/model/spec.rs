//! The edges of the maths: validating a workload, parsing a gantry-style
//! Spack spec into one, and formatting a recommendation as CI variables.

use runyard_events::FieldError;
use runyard_store::workload::normalize_variants;

use super::{MB, Recommendation, VARIANTS, Workload};

/// At most this many attributes per workload.
const MAX_ATTRIBUTES: usize = 32;
/// Longest attribute name, in bytes.
const MAX_NAME: usize = 64;
/// Longest attribute value, in bytes (variants can be long).
const MAX_VALUE: usize = 1024;
/// Longest spec accepted by [`parse_spec`].
const MAX_SPEC: usize = 4096;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Validates a request's workload: at least one attribute with a value, at
/// most 32 attributes, names of letters, digits, `_`, `-`, `.` (≤ 64 bytes),
/// values non-empty (only `variants` may be empty), ≤ 1024 bytes, without
/// control characters. The error names the offending field.
pub fn validate(workload: &Workload) -> Result<(), FieldError> {
    if workload.is_empty() {
        return Err(FieldError::new("workload", "no attributes"));
    }
    if workload.len() > MAX_ATTRIBUTES {
        return Err(FieldError::new(
            "workload",
            format!("{} attributes, at most {MAX_ATTRIBUTES}", workload.len()),
        ));
    }
    let mut any_value = false;
    for (name, value) in workload {
        if name.is_empty() {
            return Err(FieldError::new("workload", "empty attribute name"));
        }
        if name.len() > MAX_NAME {
            return Err(FieldError::new(
                "workload",
                format!("attribute name longer than {MAX_NAME} bytes"),
            ));
        }
        if !name.chars().all(is_name_char) {
            return Err(FieldError::new(
                "workload",
                format!("invalid attribute name {name:?} (letters, digits, '_', '-', '.')"),
            ));
        }
        if value.len() > MAX_VALUE {
            return Err(FieldError::new(
                format!("workload.{name}"),
                format!("value longer than {MAX_VALUE} bytes"),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(FieldError::new(
                format!("workload.{name}"),
                "control character in value",
            ));
        }
        if value.trim().is_empty() {
            if name != VARIANTS {
                return Err(FieldError::new(format!("workload.{name}"), "empty value"));
            }
        } else {
            any_value = true;
        }
    }
    if !any_value {
        return Err(FieldError::new("workload", "no attribute has a value"));
    }
    Ok(())
}

/// CI variables for a recommendation: `KUBERNETES_CPU_REQUEST` /
/// `KUBERNETES_CPU_LIMIT` in millicores (`"1200m"`),
/// `KUBERNETES_MEMORY_REQUEST` / `KUBERNETES_MEMORY_LIMIT` in gantry's format
/// (`"<n>M"`, megabytes of 10^6 bytes, rounded up), `SPACK_BUILD_JOBS` and
/// `RUNYARD_RETRY_COUNT`. Collected into whichever map the caller answers
/// with.
pub fn variables<M: FromIterator<(String, String)>>(r: &Recommendation) -> M {
    [
        (
            "KUBERNETES_CPU_REQUEST",
            format!("{}m", r.cpu_request_millicores),
        ),
        (
            "KUBERNETES_CPU_LIMIT",
            format!("{}m", r.cpu_limit_millicores),
        ),
        (
            "KUBERNETES_MEMORY_REQUEST",
            format!("{}M", r.memory_request_bytes.div_ceil(MB)),
        ),
        (
            "KUBERNETES_MEMORY_LIMIT",
            format!("{}M", r.memory_limit_bytes.div_ceil(MB)),
        ),
        ("SPACK_BUILD_JOBS", r.build_jobs.to_string()),
        ("RUNYARD_RETRY_COUNT", r.retry_count.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Splits a spec into tokens: whitespace separates, and `%`, `^`, `+`, `~`
/// start a new token even without a space (`zlib@1.3+shared%gcc@12`).
fn tokens(spec: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for chunk in spec.split_whitespace() {
        let mut start = 0;
        for (i, c) in chunk.char_indices() {
            if i > start && matches!(c, '%' | '^' | '+' | '~') {
                out.push(&chunk[start..i]);
                start = i;
            }
        }
        out.push(&chunk[start..]);
    }
    out
}

/// `name@version` → (name, Some(version)); `@=1.2` versions lose the `=`.
fn name_version<'a>(token: &'a str, what: &str) -> Result<(&'a str, Option<&'a str>), FieldError> {
    let (name, version) = match token.split_once('@') {
        Some((name, version)) => (name, Some(version.strip_prefix('=').unwrap_or(version))),
        None => (token, None),
    };
    if name.is_empty() {
        return Err(FieldError::new(
            "spec",
            format!("missing {what} name in {token:?}"),
        ));
    }
    if !name.chars().all(is_name_char) {
        return Err(FieldError::new(
            "spec",
            format!("invalid {what} name {name:?}"),
        ));
    }
    if let Some(version) = version {
        if version.is_empty() {
            return Err(FieldError::new(
                "spec",
                format!("empty {what} version in {token:?}"),
            ));
        }
        if !version.chars().all(is_name_char) {
            return Err(FieldError::new(
                "spec",
                format!("invalid {what} version {version:?}"),
            ));
        }
    }
    Ok((name, version))
}

/// Parses a Spack spec as gantry receives it,
/// `pkg@version +variants ~variants arch=ARCH %compiler@version` (variants
/// and `arch` optional, parts in any order), into a workload with
/// `package`, `version`, `variants` (normalized, possibly empty), `compiler`,
/// `compiler_version` and, when given, `arch`. `key=value` parts other than
/// `arch` are variants; `-name` is read as `~name`.
pub fn parse_spec(spec: &str) -> Result<Workload, FieldError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(FieldError::new("spec", "empty"));
    }
    if spec.len() > MAX_SPEC {
        return Err(FieldError::new(
            "spec",
            format!("longer than {MAX_SPEC} bytes"),
        ));
    }
    if spec.chars().any(char::is_control) {
        return Err(FieldError::new("spec", "control character"));
    }
    let mut package: Option<(&str, Option<&str>)> = None;
    let mut compiler: Option<(&str, Option<&str>)> = None;
    let mut arch: Option<&str> = None;
    let mut variants: Vec<String> = Vec::new();
    for token in tokens(spec) {
        if let Some(rest) = token.strip_prefix('%') {
            if compiler.is_some() {
                return Err(FieldError::new(
                    "spec",
                    format!("second compiler {token:?}"),
                ));
            }
            compiler = Some(name_version(rest, "compiler")?);
        } else if token.starts_with('^') {
            return Err(FieldError::new(
                "spec",
                format!("dependencies are not supported ({token:?})"),
            ));
        } else if let Some(name) = token
            .strip_prefix(['+', '~'])
            .map(|n| (&token[..1], n))
            .or_else(|| token.strip_prefix('-').map(|n| ("~", n)))
        {
            let (sign, name) = name;
            if name.is_empty() || !name.chars().all(is_name_char) {
                return Err(FieldError::new(
                    "spec",
                    format!("invalid variant {token:?}"),
                ));
            }
            variants.push(format!("{sign}{name}"));
        } else if let Some((key, value)) =
            token.split_once('=').filter(|(key, _)| !key.contains('@'))
        {
            if key.is_empty() || !key.chars().all(is_name_char) {
                return Err(FieldError::new("spec", format!("invalid key in {token:?}")));
            }
            if value.is_empty() {
                return Err(FieldError::new("spec", format!("empty value in {token:?}")));
            }
            if key == "arch" {
                if arch.is_some() {
                    return Err(FieldError::new("spec", "second arch"));
                }
                arch = Some(value);
            } else {
                if value.contains(char::is_whitespace) || value.contains('=') {
                    return Err(FieldError::new(
                        "spec",
                        format!("invalid variant value in {token:?}"),
                    ));
                }
                variants.push(token.to_owned());
            }
        } else if let Some(version) = token.strip_prefix('@') {
            // `zlib @1.3`: a version after a space.
            let version = version.strip_prefix('=').unwrap_or(version);
            if version.is_empty() || !version.chars().all(is_name_char) {
                return Err(FieldError::new(
                    "spec",
                    format!("invalid package version {token:?}"),
                ));
            }
            match &mut package {
                Some((_, v @ None)) => *v = Some(version),
                _ => {
                    return Err(FieldError::new(
                        "spec",
                        format!("unexpected version {token:?}"),
                    ));
                }
            }
        } else {
            if package.is_some() {
                return Err(FieldError::new(
                    "spec",
                    format!("unexpected {token:?}; one package per spec"),
                ));
            }
            package = Some(name_version(token, "package")?);
        }
    }

    let Some((name, version)) = package else {
        return Err(FieldError::new("spec", "missing package name"));
    };
    let Some(version) = version else {
        return Err(FieldError::new(
            "spec",
            format!("missing version of {name:?} (pkg@version)"),
        ));
    };
    let Some((compiler, compiler_version)) = compiler else {
        return Err(FieldError::new(
            "spec",
            "missing compiler (%compiler@version)",
        ));
    };
    let Some(compiler_version) = compiler_version else {
        return Err(FieldError::new(
            "spec",
            format!("missing version of compiler {compiler:?} (%compiler@version)"),
        ));
    };
    let mut workload = Workload::new();
    workload.insert("package".to_owned(), name.to_owned());
    workload.insert("version".to_owned(), version.to_owned());
    workload.insert(VARIANTS.to_owned(), normalize_variants(&variants.join(" ")));
    workload.insert("compiler".to_owned(), compiler.to_owned());
    workload.insert("compiler_version".to_owned(), compiler_version.to_owned());
    if let Some(arch) = arch {
        workload.insert("arch".to_owned(), arch.to_owned());
    }
    Ok(workload)
}
