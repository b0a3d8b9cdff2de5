//! Usage reports authenticated by the forge's CI identity token (GitHub
//! Actions OIDC `id-token`, GitLab CI `id_tokens`): the token is verified
//! against its issuer's published keys, and its claims — not the report's
//! body — say which job, project and ref the report is about. A report can
//! then only speak for the job that sent it.

pub mod claims;
pub mod issuer;
mod keys;
pub mod rate;

use std::time::Duration;

use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Validation, decode, decode_header};
use serde_json::{Map, Value};

pub use claims::Identity;
pub use issuer::Issuer;

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 60;

/// How long one request for an issuer's discovery document or keys may
/// take (the whole fetch is bounded by [`keys::FETCH_DEADLINE`]).
const FETCH_TIMEOUT: Duration = keys::FETCH_DEADLINE;

/// Why a token was refused (401). The reason names what was wrong, never
/// the token or its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a JWT, or its header or claims are not what a CI token has.
    Malformed(&'static str),
    /// `iss` is not one of `RUNYARD_USAGE_OIDC`.
    UnknownIssuer,
    /// `kid` names no key of the issuer.
    UnknownKey,
    /// `alg` is not an asymmetric algorithm, or not the key's.
    Algorithm,
    /// The signature does not verify.
    Signature,
    /// `exp` has passed.
    Expired,
    /// `nbf` has not come yet.
    NotYetValid,
    /// `aud` is not the issuer's configured audience.
    Audience,
    /// A claim the job identity is taken from is missing or malformed.
    Claim(&'static str),
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::UnknownIssuer => "unknown_issuer",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Algorithm => "algorithm",
            Refusal::Signature => "signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::Audience => "audience",
            Refusal::Claim(_) => "claims",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Malformed(what) => write!(f, "malformed identity token: {what}"),
            Refusal::UnknownIssuer => write!(
                f,
                "identity token issuer is not one {} accepts",
                issuer::VAR
            ),
            Refusal::UnknownKey => write!(
                f,
                "identity token signed with a key its issuer does not publish"
            ),
            Refusal::Algorithm => write!(
                f,
                "identity token algorithm is not its key's (asymmetric only)"
            ),
            Refusal::Signature => write!(f, "identity token signature does not verify"),
            Refusal::Expired => write!(f, "identity token expired"),
            Refusal::NotYetValid => write!(f, "identity token not valid yet (nbf)"),
            Refusal::Audience => write!(
                f,
                "identity token audience (aud) is not the one {} names for its issuer",
                issuer::VAR
            ),
            Refusal::Claim(claim) => {
                write!(f, "identity token claim {claim} is missing or malformed")
            }
        }
    }
}

/// Why a token was not accepted.
#[derive(Debug)]
pub enum VerifyError {
    /// The token is not good: 401.
    Refused(Refusal),
    /// The issuer's keys could not be fetched: 503, the sender retries.
    Unavailable(String),
}

/// Verifies identity tokens of the configured issuers.
#[derive(Debug)]
pub struct Verifier {
    issuers: Vec<(Issuer, std::sync::Arc<keys::Cache>)>,
    http: reqwest::Client,
    refetch: Duration,
}

impl Verifier {
    /// A verifier of `issuers`' tokens; an issuer's keys are fetched again
    /// for an unknown key id at most every `refetch`.
    pub fn new(issuers: Vec<Issuer>, refetch: Duration) -> anyhow::Result<Self> {
        runyard_telemetry::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3))
            .user_agent(concat!("runyard-ingest/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            issuers: issuers
                .into_iter()
                .map(|i| (i, std::sync::Arc::default()))
                .collect(),
            http,
            refetch,
        })
    }

    /// The configured issuer `url`.
    pub fn issuer(&self, url: &str) -> Option<&Issuer> {
        self.issuers.iter().map(|(i, _)| i).find(|i| i.url == url)
    }

    /// Verifies `token` — issuer, key, algorithm, signature, `exp`/`nbf`
    /// (with [`LEEWAY_SECS`]), audience — and returns the job identity its
    /// claims name.
    pub async fn verify(&self, token: &str) -> Result<Identity, VerifyError> {
        let refused = |r| Err(VerifyError::Refused(r));
        // The issuer decides which keys verify; read it before verifying,
        // then require it again in the verified claims.
        let Some(iss) = unverified_issuer(token) else {
            return refused(Refusal::Malformed("no iss claim"));
        };
        let Some((issuer, cache)) = self.issuers.iter().find(|(i, _)| i.url == iss) else {
            return refused(Refusal::UnknownIssuer);
        };
        let header = match decode_header(token) {
            Ok(h) => h,
            Err(_) => return refused(Refusal::Malformed("unreadable header")),
        };
        let Some(kid) = header.kid.as_deref() else {
            return refused(Refusal::Malformed("no kid in the header"));
        };
        let key = match cache
            .lookup(&self.http, &issuer.url, kid, self.refetch)
            .await
        {
            keys::Lookup::Found(key) => key,
            keys::Lookup::Unknown => return refused(Refusal::UnknownKey),
            keys::Lookup::Unavailable(why) => return Err(VerifyError::Unavailable(why)),
        };
        if header.alg != key.algorithm {
            return refused(Refusal::Algorithm);
        }
        let mut validation = Validation::new(key.algorithm);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_issuer(&[&issuer.url]);
        validation.set_audience(&[&issuer.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = match decode::<Map<String, Value>>(token, &key.key, &validation) {
            Ok(data) => data.claims,
            Err(e) => return refused(refusal(e.kind())),
        };
        claims::identity(issuer, &claims).map_err(VerifyError::Refused)
    }
}

fn refusal(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::InvalidSignature => Refusal::Signature,
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidAudience => Refusal::Audience,
        ErrorKind::InvalidIssuer => Refusal::UnknownIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Refusal::Algorithm,
        ErrorKind::MissingRequiredClaim(_) => Refusal::Malformed("exp, iss or aud missing"),
        ErrorKind::InvalidClaimFormat(_) => Refusal::Malformed("a registered claim is malformed"),
        _ => Refusal::Malformed("not a verifiable JWT"),
    }
}

/// `iss` of a JWT-shaped `token`, read without verifying anything.
fn unverified_issuer(token: &str) -> Option<String> {
    let mut parts = token.split('.');
    let (_, payload) = (parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: Map<String, Value> = serde_json::from_slice(&bytes).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

/// Whether a bearer credential is shaped like a JWT (three base64url parts,
/// a JSON header): such a one is tried as an identity token first.
pub fn looks_like_jwt(token: &[u8]) -> bool {
    let parts: Vec<&[u8]> = token.split(|b| *b == b'.').collect();
    parts.len() == 3
        && token.starts_with(b"eyJ")
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_shapes() {
        assert!(looks_like_jwt(b"eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJ4In0.c2ln"));
        assert!(!looks_like_jwt(b"usage-token-for-tests"));
        assert!(!looks_like_jwt(b"eyJ.a"));
        assert!(!looks_like_jwt(b"eyJhbGc.eyJp..c2ln"));
        assert!(!looks_like_jwt(b"eyJhbGc.ey Jp.c2ln"));
    }

    #[test]
    fn the_issuer_is_read_without_verifying() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let token = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"RS256"}"#),
            b64(r#"{"iss":"https://gitlab.com"}"#)
        );
        assert_eq!(
            unverified_issuer(&token).as_deref(),
            Some("https://gitlab.com")
        );
        assert_eq!(unverified_issuer("x.y.z"), None);
    }
}
