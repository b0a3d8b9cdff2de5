//! A set of accepted bearer tokens, read from a service's two variables
//! (`<SERVICE>_TOKENS`, comma or newline separated, or `<SERVICE>_TOKENS_FILE`,
//! one per line): the allocator's and the console's doors.
//!
//! Only SHA-256 digests of the tokens are kept, and a presented token is
//! compared with every one of them in constant time: neither a token's
//! bytes nor its length, nor which token matched, shows in response times.
//! Which of them are weak (empty, short, a placeholder:
//! [`runyard_config::secrets`]) is noted when they are read, so a service
//! can refuse them at start.

use std::path::Path;

use runyard_config::secrets::{self, Weak};
use runyard_events::FieldError;
use secrecy::ExposeSecret as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::verify::bearer;

/// The accepted bearer tokens, as SHA-256 digests; empty → none. Also
/// which of them are weak (by position, never by value). Two are equal
/// when they accept the same tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    digests: Vec<[u8; 32]>,
    weak: Vec<Weak>,
}

impl PartialEq for Tokens {
    fn eq(&self, other: &Self) -> bool {
        self.digests == other.digests
    }
}

impl Eq for Tokens {}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Digests only, but even those stay out of logs.
        write!(f, "Tokens({} configured)", self.digests.len())
    }
}

/// Why a presented credential is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// No `Bearer` credential was sent (or not a well-formed one).
    Missing,
    /// A token was sent that is not one of the configured ones.
    Unknown,
}

/// Why the tokens the environment names are refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The list and the file are both set.
    #[error("{0} and {1} are both set: set one of them")]
    Both(&'static str, &'static str),
    /// A variable or one of its tokens is unusable.
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// The file cannot be read.
    #[error(transparent)]
    File(#[from] secrets::SecretError),
}

impl Tokens {
    /// Accepts exactly `tokens`, weak ones named as items of `var` (for
    /// tests and embedding; services read them with [`Tokens::from_env`]).
    pub fn new<T: AsRef<str>>(var: &str, tokens: impl IntoIterator<Item = T>) -> Self {
        Self::listed(var, "item", tokens)
    }

    /// `tokens`, weak ones named as `<var> <what> <n>`.
    fn listed<T: AsRef<str>>(var: &str, what: &str, tokens: impl IntoIterator<Item = T>) -> Self {
        let mut weak = Vec::new();
        let mut digests: Vec<[u8; 32]> = Vec::new();
        for (i, t) in tokens.into_iter().enumerate() {
            let t = t.as_ref();
            weak.extend(secrets::check(&format!("{var} {what} {}", i + 1), t));
            digests.push(Sha256::digest(t.as_bytes()).into());
        }
        digests.sort_unstable();
        digests.dedup();
        Self { digests, weak }
    }

    /// The tokens that are empty, short or placeholders, by position
    /// (refused at start unless `RUNYARD_INSECURE_DEV=1`).
    pub fn weak(&self) -> &[Weak] {
        &self.weak
    }

    /// No token configured.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// How many distinct tokens are accepted.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// The digests of the accepted tokens: secrets in their own right (a
    /// service may key what it signs with them), never to be shown.
    pub fn digests(&self) -> &[[u8; 32]] {
        &self.digests
    }

    /// Checks an `Authorization` header value (`Bearer <token>`, scheme in
    /// any case): the matching token's digest, or why none matched.
    pub fn check(&self, header: Option<&[u8]>) -> Result<[u8; 32], Mismatch> {
        let token = bearer(header).ok_or(Mismatch::Missing)?;
        self.check_token(token)
    }

    /// Checks a token as it was given (a login form's field). Every
    /// configured digest is compared, whatever matched.
    pub fn check_token(&self, token: &[u8]) -> Result<[u8; 32], Mismatch> {
        if token.is_empty() {
            return Err(Mismatch::Missing);
        }
        let given: [u8; 32] = Sha256::digest(token).into();
        let matched = self
            .digests
            .iter()
            .fold(subtle::Choice::from(0), |acc, want| {
                acc | want.ct_eq(&given)
            });
        if bool::from(matched) {
            Ok(given)
        } else {
            Err(Mismatch::Unknown)
        }
    }

    /// The tokens the process environment names in `list_var` or
    /// `file_var` (see [`Tokens::from_vars`]).
    pub fn from_env(list_var: &'static str, file_var: &'static str) -> Result<Self, TokensError> {
        let get = |name: &str| match std::env::var(name) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(TokensError::from(FieldError::new(name, "not valid UTF-8")))
            }
        };
        Self::from_vars((list_var, get(list_var)?), (file_var, get(file_var)?))
    }

    /// The tokens `list` (the value of `list.0`: comma or newline
    /// separated) or `file` (the path in `file.0`: one per line, blank
    /// lines and `#` comments ignored) name; neither set → none. Refuses
    /// both set, an empty list or file and a token that could never be
    /// sent (whitespace, control or non-ASCII characters), naming the
    /// variable (never the token). An empty list variable is an empty
    /// list; an empty file variable names no file (unset). The file is
    /// read by [`secrets::read_file`].
    pub fn from_vars(
        (list_var, list): (&'static str, Option<String>),
        (file_var, file): (&'static str, Option<String>),
    ) -> Result<Self, TokensError> {
        let file = file.filter(|v| !v.trim().is_empty());
        match (list, file) {
            (Some(_), Some(_)) => Err(TokensError::Both(list_var, file_var)),
            (Some(list), None) => {
                let tokens: Vec<&str> = list
                    .split([',', '\n'])
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .collect();
                Ok(Self::checked(list_var, "item", &tokens)?)
            }
            (None, Some(path)) => {
                let text = secrets::read_file(file_var, Path::new(path.trim()))?;
                let tokens: Vec<&str> = text
                    .expose_secret()
                    .lines()
                    .map(str::trim)
                    .filter(|t| !t.is_empty() && !t.starts_with('#'))
                    .collect();
                Ok(Self::checked(file_var, "line", &tokens)?)
            }
            (None, None) => Ok(Self::default()),
        }
    }

    fn checked(var: &str, what: &str, tokens: &[&str]) -> Result<Self, FieldError> {
        if tokens.is_empty() {
            return Err(FieldError::new(
                var,
                "no token in it (unset it to run without authentication)",
            ));
        }
        for (i, t) in tokens.iter().enumerate() {
            if !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(FieldError::new(
                    var,
                    format!(
                        "{what} {} has a character no client can send in a bearer token (whitespace, control or non-ASCII)",
                        i + 1
                    ),
                ));
            }
        }
        Ok(Self::listed(var, what, tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const LIST: &str = "RUNYARD_ALLOCATOR_TOKENS";
    const FILE: &str = "RUNYARD_ALLOCATOR_TOKENS_FILE";

    fn env(vars: &[(&str, &str)]) -> Result<Tokens, String> {
        let vars: HashMap<&str, String> = vars.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        Tokens::from_vars(
            (LIST, vars.get(LIST).cloned()),
            (FILE, vars.get(FILE).cloned()),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn right_wrong_and_missing_tokens() {
        let t = Tokens::new(LIST, ["alpha", "beta"]);
        let alpha = t.check(Some(b"Bearer alpha")).unwrap();
        let beta = t.check(Some(b"bearer  beta ")).unwrap();
        // Each token is known by its own digest.
        assert_ne!(alpha, beta);
        assert_eq!(t.check(Some(b"Bearer alpha")), Ok(alpha));
        assert_eq!(t.check_token(b"alpha"), Ok(alpha));
        assert_eq!(t.check(Some(b"Bearer gamma")), Err(Mismatch::Unknown));
        assert_eq!(t.check(Some(b"Bearer alph")), Err(Mismatch::Unknown));
        assert_eq!(t.check_token(b""), Err(Mismatch::Missing));
        for missing in [
            None,
            Some(&b""[..]),
            Some(b"Bearer"),
            Some(b"Bearer "),
            Some(b"BearerAlpha"),
            Some(b"Basic YWxwaGE="),
            Some(b"Bearer al pha"),
        ] {
            assert_eq!(t.check(missing), Err(Mismatch::Missing), "{missing:?}");
        }
        assert_eq!(format!("{t:?}"), "Tokens(2 configured)");
    }

    #[test]
    fn tokens_from_the_list_variable() {
        let t = env(&[(LIST, "one, two\nthree,,")]).unwrap();
        assert_eq!(t, Tokens::new(LIST, ["one", "two", "three"]));
        assert!(env(&[]).unwrap().is_empty());
        // Set but empty is not unset: no token in it.
        let e = env(&[(LIST, "")]).unwrap_err();
        assert!(e.starts_with(LIST) && e.contains("no token"), "{e}");
        let e = env(&[(LIST, " , ,")]).unwrap_err();
        assert!(e.starts_with(LIST) && e.contains("no token"), "{e}");
        let e = env(&[(LIST, "ok,bad\ttok")]).unwrap_err();
        assert!(e.contains(LIST) && e.contains("item 2"), "{e}");
        assert!(
            !e.contains("bad"),
            "the token stays out of the message: {e}"
        );
    }

    #[test]
    fn tokens_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# rotated 2026-11\nold-token\n\n  new-token  \n").unwrap();
        let p = path.to_str().unwrap();
        let t = env(&[(FILE, p)]).unwrap();
        assert_eq!(t, Tokens::new(LIST, ["old-token", "new-token"]));

        std::fs::write(&path, "\n# nothing yet\n   \n").unwrap();
        let e = env(&[(FILE, p)]).unwrap_err();
        assert!(e.starts_with(FILE) && e.contains("no token"), "{e}");

        let missing = dir.path().join("absent");
        let e = env(&[(FILE, missing.to_str().unwrap())]).unwrap_err();
        assert!(e.starts_with(FILE), "{e}");
    }

    #[test]
    fn weak_tokens_are_noted_by_position_never_by_value() {
        let good = "ded87e07581f2e41ac5706c82f1d251a0f3e77b72e957ed91e555fd799887fd1";
        let t = env(&[(LIST, &format!("{good},change-me,k7Q2mZ9x"))]).unwrap();
        let weak: Vec<String> = t.weak().iter().map(ToString::to_string).collect();
        assert_eq!(
            weak,
            [
                "RUNYARD_ALLOCATOR_TOKENS item 2 is a known placeholder",
                "RUNYARD_ALLOCATOR_TOKENS item 3 is 8 bytes long, shorter than 32",
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("# rotated\nsecret\n{good}\n")).unwrap();
        let t = env(&[(FILE, path.to_str().unwrap())]).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.weak().iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["RUNYARD_ALLOCATOR_TOKENS_FILE line 1 is a known placeholder"]
        );
        assert!(Tokens::new(LIST, [good]).weak().is_empty());
    }

    #[test]
    fn both_variables_refuse_to_start_naming_both() {
        let e = env(&[(LIST, "a"), (FILE, "/tokens")]).unwrap_err();
        assert!(e.contains(LIST) && e.contains(FILE), "{e}");
    }
}
