//! The secrets runyard's operator chooses, read and checked the same way by
//! every service (docs/operations.md, "Secrets").
//!
//! - [`read_file`] is the one reader of `*_FILE` secrets. Its rule: the
//!   file's trailing ASCII whitespace (the newline `echo` or an editor
//!   adds, `\r\n` too, trailing spaces and tabs) is dropped; nothing else
//!   is changed — leading and inner characters are part of the secret.
//! - [`weakness`] says why a value must not be a signing key or shared
//!   secret: it is empty, shorter than [`MIN_BYTES`], or a placeholder
//!   ([`is_placeholder`], built on [`PLACEHOLDER_WORDS`]).
//! - [`enforce`] refuses to start on any weak secret unless
//!   `RUNYARD_INSECURE_DEV=1` ([`insecure_dev_from_env`]), and then logs a
//!   WARN naming every variable it let through.
//!
//! Credentials the forge issues (GitHub tokens and App keys, GitLab
//! tokens) are not checked here: their form is the forge's, and the forge
//! refuses a wrong one.

use std::fmt;
use std::path::{Path, PathBuf};

use secrecy::SecretString;

/// The variable that turns the checks off for a development machine.
pub const INSECURE_DEV_VAR: &str = "RUNYARD_INSECURE_DEV";

/// The fewest bytes an operator-chosen secret may have (256 bits of a
/// random byte string; `openssl rand -hex 32` gives 64 characters).
pub const MIN_BYTES: usize = 32;

/// The command the refusal suggests for a good value.
pub const GENERATE: &str = "openssl rand -hex 32";

/// Words that make up placeholder values. A value is a placeholder when,
/// lower-cased and with everything but the letters `a`–`z` dropped, it is
/// nothing but these words run together (each as often as it likes):
/// `change-me`, `CHANGEME`, `Password1`, `secret-secret-secret`,
/// `dev-test-token-42` and `your_webhook_secret_here` all are. The words go
/// through the same dropping (`s3cret` matches `s3cret`, `scret` and
/// `s-c-r-e-t`). A value that is one character repeated is a placeholder
/// too.
pub const PLACEHOLDER_WORDS: &[&str] = &[
    "admin",
    "allocator",
    "bar",
    "baz",
    "change",
    "client",
    "default",
    "demo",
    "dev",
    "development",
    "dummy",
    "empty",
    "example",
    "fake",
    "fixme",
    "foo",
    "github",
    "gitlab",
    "hook",
    "here",
    "hunter",
    "insecure",
    "instance",
    "key",
    "letmein",
    "local",
    "me",
    "my",
    "none",
    "null",
    "p4ssw0rd",
    "pass",
    "passw0rd",
    "passwd",
    "password",
    "placeholder",
    "qwerty",
    "replace",
    "root",
    "runyard",
    "s3cret",
    "sample",
    "scaler",
    "secret",
    "shared",
    "test",
    "testing",
    "todo",
    "token",
    "unset",
    "usage",
    "value",
    "webhook",
    "your",
];

/// Why a value cannot be a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weakness {
    /// Nothing (or only whitespace) in it.
    Empty,
    /// Fewer than [`MIN_BYTES`] bytes.
    Short {
        /// Its length in bytes.
        bytes: usize,
    },
    /// A known placeholder ([`is_placeholder`]).
    Placeholder,
}

impl fmt::Display for Weakness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("empty"),
            Self::Short { bytes } => {
                write!(f, "{bytes} bytes long, shorter than {MIN_BYTES}")
            }
            Self::Placeholder => f.write_str("a known placeholder"),
        }
    }
}

/// One weak secret: the variable that gave it and why it is weak (never
/// the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weak {
    /// The variable, e.g. `RUNYARD_USAGE_TOKEN` (`RUNYARD_ALLOCATOR_TOKENS
    /// item 2` for one of a list).
    pub var: String,
    /// Why.
    pub weakness: Weakness,
}

impl fmt::Display for Weak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {}", self.var, self.weakness)
    }
}

/// A secret the service cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// A `*_FILE` secret could not be read.
    #[error("{var}: reading {}: {source}", path.display())]
    File {
        /// The `*_FILE` variable.
        var: String,
        /// The file it names.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `RUNYARD_INSECURE_DEV` has a value other than `1` or `0`.
    #[error("{INSECURE_DEV_VAR}: {0:?} is neither 1 (turn the secret checks off) nor 0")]
    InsecureDevValue(String),
    /// Weak secrets, and no `RUNYARD_INSECURE_DEV=1`.
    #[error(
        "refusing to start: {}; generate each with `{GENERATE}` (at least {MIN_BYTES} bytes, \
         not a placeholder: docs/operations.md, \"Secrets\"); {INSECURE_DEV_VAR}=1 lets them \
         through on a development machine only",
        list(.0)
    )]
    Weak(Vec<Weak>),
}

fn list(weak: &[Weak]) -> String {
    weak.iter()
        .map(Weak::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Reads the secret in `path`, given by the variable `var` (named in the
/// error), by the module's rule: trailing ASCII whitespace dropped,
/// nothing else changed.
pub fn read_file(var: &str, path: &Path) -> Result<SecretString, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::File {
        var: var.to_owned(),
        path: path.to_owned(),
        source,
    })?;
    Ok(SecretString::from(trim(&text).to_owned()))
}

/// The trimming rule of [`read_file`].
pub fn trim(text: &str) -> &str {
    text.trim_end_matches(|c: char| c.is_ascii_whitespace())
}

/// Why `value` cannot be an operator-chosen secret, if it cannot.
pub fn weakness(value: &str) -> Option<Weakness> {
    if value.trim().is_empty() {
        Some(Weakness::Empty)
    } else if is_placeholder(value) {
        Some(Weakness::Placeholder)
    } else if value.len() < MIN_BYTES {
        Some(Weakness::Short { bytes: value.len() })
    } else {
        None
    }
}

/// Whether `value` is a placeholder: one character repeated, or, reduced
/// to its lower-cased letters, only [`PLACEHOLDER_WORDS`] run together.
pub fn is_placeholder(value: &str) -> bool {
    let mut chars = value.chars();
    if let Some(first) = chars.next()
        && chars.all(|c| c == first)
    {
        return true;
    }
    let words: Vec<String> = PLACEHOLDER_WORDS.iter().map(|w| letters(w)).collect();
    let letters = letters(value);
    if letters.is_empty() {
        return false;
    }
    // Word break: `ends[i]` when letters[..i] is made of words.
    let mut ends = vec![false; letters.len() + 1];
    ends[0] = true;
    for i in 0..letters.len() {
        if !ends[i] {
            continue;
        }
        for w in &words {
            if !w.is_empty() && letters[i..].starts_with(w.as_str()) {
                ends[i + w.len()] = true;
            }
        }
    }
    ends[letters.len()]
}

fn letters(value: &str) -> String {
    value
        .chars()
        .filter(char::is_ascii_alphabetic)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Checks one secret: `Some(weak)` names `var` and why.
pub fn check(var: &str, value: &str) -> Option<Weak> {
    weakness(value).map(|weakness| Weak {
        var: var.to_owned(),
        weakness,
    })
}

/// Checks the secrets given (`(variable, value)`; a secret not set is not
/// passed) and refuses the weak ones — unless `insecure_dev`, when one
/// WARN names every variable let through (and says so when none was).
/// Returns what was let through.
pub fn enforce<'a>(
    secrets: impl IntoIterator<Item = (&'a str, &'a str)>,
    more: Vec<Weak>,
    insecure_dev: bool,
) -> Result<Vec<Weak>, SecretError> {
    let mut weak: Vec<Weak> = secrets
        .into_iter()
        .filter_map(|(var, value)| check(var, value))
        .collect();
    weak.extend(more);
    if !insecure_dev {
        return if weak.is_empty() {
            Ok(weak)
        } else {
            Err(SecretError::Weak(weak))
        };
    }
    let let_through = if weak.is_empty() {
        "nothing".to_owned()
    } else {
        list(&weak)
    };
    tracing::warn!(
        variable = INSECURE_DEV_VAR,
        %let_through,
        "secret checks are off: never run like this outside a development machine"
    );
    Ok(weak)
}

/// `RUNYARD_INSECURE_DEV` from the process environment: `1` → on; unset,
/// empty or `0` → off; anything else refuses to start.
pub fn insecure_dev_from_env() -> Result<bool, SecretError> {
    match std::env::var(INSECURE_DEV_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(false),
        Err(std::env::VarError::NotUnicode(v)) => Err(SecretError::InsecureDevValue(
            v.to_string_lossy().into_owned(),
        )),
        Ok(v) => insecure_dev_value(&v),
    }
}

/// The meaning of a `RUNYARD_INSECURE_DEV` value (see
/// [`insecure_dev_from_env`]).
pub fn insecure_dev_value(value: &str) -> Result<bool, SecretError> {
    match value.trim() {
        "1" => Ok(true),
        "" | "0" => Ok(false),
        other => Err(SecretError::InsecureDevValue(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret as _;

    /// What `openssl rand -hex 32` printed once.
    const GOOD: &str = "3f9c1e0b7a5d24c68e1f0a9b3c7d5e2f4a6b8c0d1e3f5a7b9c2d4e6f8a0b1c3d";

    #[test]
    fn placeholders_in_any_case_repeated_or_with_digits() {
        for p in [
            "change-me",
            "changeme",
            "CHANGE_ME",
            "Change Me 2",
            "secret",
            "password",
            "Password1",
            "example",
            "test",
            "dev",
            "s3cret",
            "change-mechange-mechange-mechange-me",
            "secret-secret-secret-secret-secret-secret",
            "your-webhook-secret-here-0123456789",
            "dev-github-secret",
            "test-instance-token-key",
            "changeme-changeme-changeme-changeme-1",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "0000000000000000000000000000000000000000",
        ] {
            assert!(is_placeholder(p), "{p}");
            assert_eq!(weakness(p), Some(Weakness::Placeholder), "{p}");
        }
        for not in [
            GOOD,
            "correct horse battery staple and more words",
            "k7Q2mZ9xR4vB1nL8wT3yH6pD0sF5gJ2c",
            "12345678901234567890123456789012345",
        ] {
            assert!(!is_placeholder(not), "{not}");
        }
    }

    #[test]
    fn empty_short_and_good_values() {
        assert_eq!(weakness(""), Some(Weakness::Empty));
        assert_eq!(weakness("  \n"), Some(Weakness::Empty));
        assert_eq!(
            weakness("k7Q2mZ9xR4vB1nL8"),
            Some(Weakness::Short { bytes: 16 })
        );
        // 31 bytes: one short of the rule.
        assert_eq!(weakness(&GOOD[..31]), Some(Weakness::Short { bytes: 31 }));
        assert_eq!(weakness(&GOOD[..32]), None);
        assert_eq!(weakness(GOOD), None);
    }

    #[test]
    fn a_refusal_names_each_variable_and_the_command_never_the_value() {
        let e = enforce(
            [
                ("RUNYARD_USAGE_TOKEN", "change-me"),
                ("RUNYARD_GITHUB_WEBHOOK_SECRET", "k7Q2mZ9xR4vB"),
                ("RUNYARD_GITLAB_WEBHOOK_TOKEN", ""),
                ("RUNYARD_SCALER_INSTANCE_TOKEN_KEY", GOOD),
            ],
            vec![],
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("RUNYARD_USAGE_TOKEN is a known placeholder"),
            "{e}"
        );
        assert!(
            e.contains("RUNYARD_GITHUB_WEBHOOK_SECRET is 12 bytes long, shorter than 32"),
            "{e}"
        );
        assert!(e.contains("RUNYARD_GITLAB_WEBHOOK_TOKEN is empty"), "{e}");
        assert!(!e.contains("RUNYARD_SCALER_INSTANCE_TOKEN_KEY"), "{e}");
        assert!(e.contains("openssl rand -hex 32"), "{e}");
        assert!(e.contains("RUNYARD_INSECURE_DEV=1"), "{e}");
        assert!(!e.contains("k7Q2") && !e.contains("change-me"), "{e}");
        let ok = enforce([("RUNYARD_USAGE_TOKEN", GOOD)], vec![], false).unwrap();
        assert!(ok.is_empty());
    }

    /// Log lines written while `f` runs.
    fn logs(f: impl FnOnce()) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn insecure_dev_lets_weak_secrets_through_with_a_warning_naming_them() {
        let mut through = vec![];
        let log = logs(|| {
            through = enforce(
                [("RUNYARD_USAGE_TOKEN", "change-me"), ("RUNYARD_X", GOOD)],
                vec![Weak {
                    var: "RUNYARD_ALLOCATOR_TOKENS item 2".into(),
                    weakness: Weakness::Empty,
                }],
                true,
            )
            .unwrap();
        });
        assert_eq!(through.len(), 2);
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("RUNYARD_INSECURE_DEV"), "{log}");
        assert!(
            log.contains("RUNYARD_USAGE_TOKEN is a known placeholder"),
            "{log}"
        );
        assert!(
            log.contains("RUNYARD_ALLOCATOR_TOKENS item 2 is empty"),
            "{log}"
        );
        assert!(!log.contains("RUNYARD_X") && !log.contains(GOOD), "{log}");
        // On with nothing weak: still a WARN, saying so.
        let log = logs(|| {
            enforce([("RUNYARD_X", GOOD)], vec![], true).unwrap();
        });
        assert!(log.contains("WARN") && log.contains("nothing"), "{log}");
        // Off: no word of it.
        let log = logs(|| {
            enforce([("RUNYARD_X", GOOD)], vec![], false).unwrap();
        });
        assert!(log.is_empty(), "{log}");
    }

    #[test]
    fn insecure_dev_is_1_or_nothing() {
        assert!(insecure_dev_value("1").unwrap());
        assert!(!insecure_dev_value("0").unwrap());
        assert!(!insecure_dev_value("").unwrap());
        for bad in ["true", "yes", "2"] {
            let e = insecure_dev_value(bad).unwrap_err().to_string();
            assert!(e.starts_with("RUNYARD_INSECURE_DEV:"), "{e}");
        }
    }

    #[test]
    fn a_secret_file_loses_its_trailing_whitespace_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        for (written, read) in [
            ("abc\n", "abc"),
            ("abc\r\n", "abc"),
            ("abc \t\n\n", "abc"),
            ("abc", "abc"),
            ("  abc\n", "  abc"),
            ("a b\nc\n", "a b\nc"),
            ("\n", ""),
        ] {
            std::fs::write(&path, written).unwrap();
            let s = read_file("RUNYARD_USAGE_TOKEN_FILE", &path).unwrap();
            assert_eq!(s.expose_secret(), read, "{written:?}");
        }
        let e = read_file("RUNYARD_USAGE_TOKEN_FILE", &dir.path().join("absent"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("RUNYARD_USAGE_TOKEN_FILE: reading "), "{e}");
    }
}
