//! Bearer tokens at the allocator's doors (`RUNYARD_ALLOCATOR_TOKENS` or
//! `RUNYARD_ALLOCATOR_TOKENS_FILE`): the gRPC `Allocator` service wants
//! `authorization: Bearer <token>` metadata, the HTTP listener an
//! `Authorization` header, except health, readiness, metrics — and the
//! gantry endpoint when `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY` is on. A
//! refused call is answered before anything of it is handled, so it
//! publishes no `AllocationIssued` event.
//!
//! Only SHA-256 digests of the tokens are kept, and a presented token is
//! compared with every one of them in constant time: neither a token's
//! bytes nor its length, nor which token matched, shows in response times.
//! Which of them are weak (empty, short, a placeholder:
//! [`runyard_config::secrets`]) is noted when they are read, so the
//! allocator can refuse them at start.

use std::path::Path;

use runyard_config::secrets::{self, Weak};
use runyard_events::FieldError;
use runyard_forge::bearer;
use secrecy::ExposeSecret as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// The environment variable listing the accepted tokens.
pub const TOKENS_VAR: &str = "RUNYARD_ALLOCATOR_TOKENS";
/// The environment variable naming a file of accepted tokens.
pub const TOKENS_FILE_VAR: &str = "RUNYARD_ALLOCATOR_TOKENS_FILE";

/// The accepted bearer tokens, as SHA-256 digests; empty → anonymous.
/// Also which of them are weak (by position, never by value). Two are
/// equal when they accept the same tokens.
#[derive(Clone, Default)]
pub struct Tokens(Vec<[u8; 32]>, Vec<Weak>);

impl PartialEq for Tokens {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Tokens {}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Digests only, but even those stay out of logs.
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

/// Who made a call, as far as the allocator can tell: the token it
/// presented, else its address, else nobody in particular — the key its
/// `AllocationIssued` events are bounded by (a request extension).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Client(pub u64);

impl Client {
    /// A caller without a token, known by its address when there is one
    /// (an IPv6 address by its /64: one host's many addresses are one
    /// client).
    pub fn anonymous(ip: Option<std::net::IpAddr>) -> Self {
        match ip {
            None => Self(0),
            Some(std::net::IpAddr::V4(v4)) => Self(u64::from(v4.to_bits()) | 1 << 32),
            Some(std::net::IpAddr::V6(v6)) => Self((v6.to_bits() >> 64) as u64 | 1),
        }
    }
}

/// Why a call was refused: the message the caller gets and the metric's
/// `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Bearer` credential was sent (or not a well-formed one).
    Missing,
    /// A token was sent that is not one of the configured ones.
    Unknown,
    /// An HTTP call without a client certificate on a listener that lets
    /// such clients in for the gantry endpoint only (mTLS with
    /// `ANONYMOUS_GANTRY`): every other path answers 403.
    NoClientCertificate,
}

impl Refusal {
    /// The answer's message.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "missing bearer token",
            Self::Unknown => "unknown token",
            Self::NoClientCertificate => "client certificate required",
        }
    }

    /// The `reason` label of `runyard_allocator_auth_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unknown => "unknown",
            Self::NoClientCertificate => "client_certificate",
        }
    }
}

/// Why the tokens the environment names are refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The list and the file are both set.
    #[error("{TOKENS_VAR} and {TOKENS_FILE_VAR} are both set: set one of them")]
    Both,
    /// A variable or one of its tokens is unusable.
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// The file cannot be read.
    #[error(transparent)]
    File(#[from] secrets::SecretError),
}

impl Tokens {
    /// Accepts exactly `tokens` (for tests and embedding; the service reads
    /// them with [`Tokens::from_process_env`]); weak ones are named as
    /// items of `RUNYARD_ALLOCATOR_TOKENS`.
    pub fn new<T: AsRef<str>>(tokens: impl IntoIterator<Item = T>) -> Self {
        Self::listed(TOKENS_VAR, "item", tokens)
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
        Self(digests, weak)
    }

    /// The tokens that are empty, short or placeholders, by position
    /// (refused at start unless `RUNYARD_INSECURE_DEV=1`).
    pub fn weak(&self) -> &[Weak] {
        &self.1
    }

    /// No token configured: the allocator answers anyone.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many distinct tokens are accepted.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Checks an `Authorization` header value (`Bearer <token>`, scheme in
    /// any case). Every configured digest is compared, whatever matched;
    /// an accepted caller is known by its token's digest.
    pub fn check(&self, header: Option<&[u8]>) -> Result<Client, Refusal> {
        let token = bearer(header).ok_or(Refusal::Missing)?;
        let given: [u8; 32] = Sha256::digest(token).into();
        let matched = self.0.iter().fold(subtle::Choice::from(0), |acc, want| {
            acc | want.ct_eq(&given)
        });
        if bool::from(matched) {
            let mut id = [0; 8];
            id.copy_from_slice(&given[..8]);
            Ok(Client(u64::from_le_bytes(id)))
        } else {
            Err(Refusal::Unknown)
        }
    }

    /// The tokens the process environment names (see [`Tokens::from_vars`]).
    pub fn from_process_env() -> Result<Self, TokensError> {
        let get = |name: &str, value: Result<String, std::env::VarError>| match value {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(TokensError::from(FieldError::new(name, "not valid UTF-8")))
            }
        };
        Self::from_vars(
            get(TOKENS_VAR, std::env::var(TOKENS_VAR))?,
            get(TOKENS_FILE_VAR, std::env::var(TOKENS_FILE_VAR))?,
        )
    }

    /// The tokens `RUNYARD_ALLOCATOR_TOKENS` (`list`: comma or newline
    /// separated) or `RUNYARD_ALLOCATOR_TOKENS_FILE` (`file`: one per line,
    /// blank lines and `#` comments ignored) name; neither set → none.
    /// Refuses both set, an empty list or file and a token that could never
    /// be sent (whitespace, control or non-ASCII characters), naming the
    /// variable (never the token). An empty `RUNYARD_ALLOCATOR_TOKENS` is
    /// an empty list; an empty `RUNYARD_ALLOCATOR_TOKENS_FILE` names no
    /// file (unset). The file is read by [`secrets::read_file`].
    pub fn from_vars(list: Option<String>, file: Option<String>) -> Result<Self, TokensError> {
        let file = file.filter(|v| !v.trim().is_empty());
        match (list, file) {
            (Some(_), Some(_)) => Err(TokensError::Both),
            (Some(list), None) => {
                let tokens: Vec<&str> = list
                    .split([',', '\n'])
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .collect();
                Ok(Self::checked(TOKENS_VAR, "item", &tokens)?)
            }
            (None, Some(path)) => {
                let text = secrets::read_file(TOKENS_FILE_VAR, Path::new(path.trim()))?;
                let tokens: Vec<&str> = text
                    .expose_secret()
                    .lines()
                    .map(str::trim)
                    .filter(|t| !t.is_empty() && !t.starts_with('#'))
                    .collect();
                Ok(Self::checked(TOKENS_FILE_VAR, "line", &tokens)?)
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

    fn env(vars: &[(&str, &str)]) -> Result<Tokens, String> {
        let vars: HashMap<&str, String> = vars.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        Tokens::from_vars(
            vars.get(TOKENS_VAR).cloned(),
            vars.get(TOKENS_FILE_VAR).cloned(),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn right_wrong_and_missing_tokens() {
        let t = Tokens::new(["alpha", "beta"]);
        let alpha = t.check(Some(b"Bearer alpha")).unwrap();
        let beta = t.check(Some(b"bearer  beta ")).unwrap();
        // Each token is its own client (its events are bounded apart).
        assert_ne!(alpha, beta);
        assert_eq!(t.check(Some(b"Bearer alpha")), Ok(alpha));
        assert_eq!(t.check(Some(b"Bearer gamma")), Err(Refusal::Unknown));
        assert_eq!(t.check(Some(b"Bearer alph")), Err(Refusal::Unknown));
        for missing in [
            None,
            Some(&b""[..]),
            Some(b"Bearer"),
            Some(b"Bearer "),
            Some(b"BearerAlpha"),
            Some(b"Basic YWxwaGE="),
            Some(b"Bearer al pha"),
        ] {
            assert_eq!(t.check(missing), Err(Refusal::Missing), "{missing:?}");
        }
        assert_eq!(format!("{t:?}"), "Tokens(2 configured)");
    }

    #[test]
    fn tokens_from_the_list_variable() {
        let t = env(&[(TOKENS_VAR, "one, two\nthree,,")]).unwrap();
        assert_eq!(t, Tokens::new(["one", "two", "three"]));
        assert!(env(&[]).unwrap().is_empty());
        // Set but empty is not unset: no token in it.
        let e = env(&[(TOKENS_VAR, "")]).unwrap_err();
        assert!(e.starts_with(TOKENS_VAR) && e.contains("no token"), "{e}");
        let e = env(&[(TOKENS_VAR, " , ,")]).unwrap_err();
        assert!(e.starts_with(TOKENS_VAR) && e.contains("no token"), "{e}");
        let e = env(&[(TOKENS_VAR, "ok,bad\ttok")]).unwrap_err();
        assert!(e.contains(TOKENS_VAR) && e.contains("item 2"), "{e}");
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
        let t = env(&[(TOKENS_FILE_VAR, p)]).unwrap();
        assert_eq!(t, Tokens::new(["old-token", "new-token"]));

        std::fs::write(&path, "\n# nothing yet\n   \n").unwrap();
        let e = env(&[(TOKENS_FILE_VAR, p)]).unwrap_err();
        assert!(
            e.starts_with(TOKENS_FILE_VAR) && e.contains("no token"),
            "{e}"
        );

        let missing = dir.path().join("absent");
        let e = env(&[(TOKENS_FILE_VAR, missing.to_str().unwrap())]).unwrap_err();
        assert!(e.starts_with(TOKENS_FILE_VAR), "{e}");
    }

    #[test]
    fn weak_tokens_are_noted_by_position_never_by_value() {
        let good = "ded87e07581f2e41ac5706c82f1d251a0f3e77b72e957ed91e555fd799887fd1";
        let t = env(&[(TOKENS_VAR, &format!("{good},change-me,k7Q2mZ9x"))]).unwrap();
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
        let t = env(&[(TOKENS_FILE_VAR, path.to_str().unwrap())]).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.weak().iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["RUNYARD_ALLOCATOR_TOKENS_FILE line 1 is a known placeholder"]
        );
        assert!(Tokens::new([good]).weak().is_empty());
    }

    #[test]
    fn both_variables_refuse_to_start_naming_both() {
        let e = env(&[(TOKENS_VAR, "a"), (TOKENS_FILE_VAR, "/tokens")]).unwrap_err();
        assert!(e.contains(TOKENS_VAR) && e.contains(TOKENS_FILE_VAR), "{e}");
    }
}
