//! Bearer tokens at the allocator's doors (`RUNYARD_ALLOCATOR_TOKENS` or
//! `RUNYARD_ALLOCATOR_TOKENS_FILE`): the gRPC `Allocator` service wants
//! `authorization: Bearer <token>` metadata, the HTTP listener an
//! `Authorization` header, except health, readiness, metrics — and the
//! gantry endpoint when `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY` is on. A
//! refused call is answered before anything of it is handled, so it
//! publishes no `AllocationIssued` event.
//!
//! The tokens are a [`runyard_forge::tokens::Tokens`]: digests only,
//! compared in constant time, weak ones refused at start.

use runyard_forge::tokens::Mismatch;
pub use runyard_forge::tokens::{Tokens, TokensError};

/// The environment variable listing the accepted tokens.
pub const TOKENS_VAR: &str = "RUNYARD_ALLOCATOR_TOKENS";
/// The environment variable naming a file of accepted tokens.
pub const TOKENS_FILE_VAR: &str = "RUNYARD_ALLOCATOR_TOKENS_FILE";

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

/// The allocator's tokens, as the process environment names them
/// (`RUNYARD_ALLOCATOR_TOKENS` or `RUNYARD_ALLOCATOR_TOKENS_FILE`).
pub fn tokens_from_env() -> Result<Tokens, TokensError> {
    Tokens::from_env(TOKENS_VAR, TOKENS_FILE_VAR)
}

/// Accepts exactly `tokens`, weak ones named as items of
/// `RUNYARD_ALLOCATOR_TOKENS` (tests and embedding).
pub fn tokens<T: AsRef<str>>(tokens: impl IntoIterator<Item = T>) -> Tokens {
    Tokens::new(TOKENS_VAR, tokens)
}

/// Checks an `Authorization` header value against `tokens`: an accepted
/// caller is known by its token's digest.
pub fn authenticate(tokens: &Tokens, header: Option<&[u8]>) -> Result<Client, Refusal> {
    match tokens.check(header) {
        Ok(digest) => {
            let mut id = [0; 8];
            id.copy_from_slice(&digest[..8]);
            Ok(Client(u64::from_le_bytes(id)))
        }
        Err(Mismatch::Missing) => Err(Refusal::Missing),
        Err(Mismatch::Unknown) => Err(Refusal::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_is_its_own_client() {
        let t = tokens(["alpha", "beta"]);
        let alpha = authenticate(&t, Some(b"Bearer alpha")).unwrap();
        let beta = authenticate(&t, Some(b"bearer  beta ")).unwrap();
        assert_ne!(alpha, beta);
        assert_eq!(authenticate(&t, Some(b"Bearer alpha")), Ok(alpha));
        assert_eq!(
            authenticate(&t, Some(b"Bearer gamma")),
            Err(Refusal::Unknown)
        );
        assert_eq!(authenticate(&t, None), Err(Refusal::Missing));
    }
}
