//! Authenticating deliveries before their bodies are parsed: GitHub's HMAC
//! signature, GitLab's shared token and the usage endpoint's bearer token.
//! Every comparison is constant time, so a sender cannot learn a secret byte
//! by byte from response times.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Why a delivery failed authentication. Ingest answers `401` for all three;
/// the distinction is for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No signature or token was sent.
    #[error("signature or token missing")]
    Missing,
    /// A signature was sent but is not `sha256=` followed by 64 hex digits.
    #[error("signature malformed")]
    Malformed,
    /// The signature or token does not match the configured secret.
    #[error("signature or token does not match")]
    Mismatch,
}

/// Checks `X-Hub-Signature-256: sha256=<hex>` against HMAC-SHA256(`secret`,
/// raw `body`), in constant time.
///
/// An empty `secret` never verifies: an HMAC under an empty key is one anyone
/// can compute, so a blank configuration must not open the endpoint.
pub fn github_signature(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), AuthError> {
    let mut check = GithubSignature::expect(secret, header)?;
    check.update(body);
    check.verify()
}

/// [`github_signature`] as the body arrives: the header is judged before a
/// byte of the body is read ([`GithubSignature::expect`]), each chunk is
/// hashed as it comes ([`GithubSignature::update`]), and the signature is
/// compared once the last one has ([`GithubSignature::verify`]). A delivery
/// without a well-formed signature is refused without reading its body, and
/// a signed one is hashed in the same pass that buffers it.
pub struct GithubSignature {
    mac: Hmac<Sha256>,
    expected: [u8; 32],
}

impl std::fmt::Debug for GithubSignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubSignature").finish_non_exhaustive()
    }
}

impl GithubSignature {
    /// Parses the `X-Hub-Signature-256` header: `Missing` or `Malformed` as
    /// [`github_signature`] would answer them, and `Mismatch` at once for an
    /// empty `secret`, which never verifies.
    pub fn expect(secret: &[u8], header: Option<&str>) -> Result<Self, AuthError> {
        let header = header.map(str::trim).filter(|h| !h.is_empty());
        let Some(header) = header else {
            return Err(AuthError::Missing);
        };
        let hex_sig = header.strip_prefix("sha256=").ok_or(AuthError::Malformed)?;
        let mut expected = [0u8; 32];
        hex::decode_to_slice(hex_sig, &mut expected).map_err(|_| AuthError::Malformed)?;
        if secret.is_empty() {
            return Err(AuthError::Mismatch);
        }
        // HMAC accepts keys of any length, so this cannot fail; mapping the
        // error keeps the function panic-free regardless.
        let mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| AuthError::Mismatch)?;
        Ok(Self { mac, expected })
    }

    /// Hashes the next chunk of the body.
    pub fn update(&mut self, chunk: &[u8]) {
        self.mac.update(chunk);
    }

    /// Compares, in constant time, the signature of everything hashed with
    /// the one the header carried.
    pub fn verify(self) -> Result<(), AuthError> {
        self.mac
            .verify_slice(&self.expected)
            .map_err(|_| AuthError::Mismatch)
    }
}

/// Compares a shared token (GitLab `X-Gitlab-Token`, the usage bearer token)
/// with the configured one in constant time; `false` when none was given or
/// the configured token is empty.
///
/// Both sides are hashed first so the comparison always runs over two 32-byte
/// digests: comparing the raw values would return early on a length
/// mismatch and leak the secret's length.
pub fn token_matches(expected: &[u8], given: Option<&[u8]>) -> bool {
    let Some(given) = given else {
        return false;
    };
    if expected.is_empty() {
        return false;
    }
    let want = Sha256::digest(expected);
    let got = Sha256::digest(given);
    want.as_slice().ct_eq(got.as_slice()).into()
}

/// Extracts the token from an `Authorization: Bearer <token>` header value.
///
/// The scheme is matched case-insensitively (RFC 9110 §11.1); `None` when the
/// header is missing, uses another scheme, or the token is empty or contains
/// whitespace.
pub fn bearer(header: Option<&[u8]>) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let header = header?.trim_ascii();
    let scheme = header.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = header.get(SCHEME.len()..)?;
    // At least one space must separate scheme and token (`Bearerxyz` is not a
    // bearer credential).
    if !rest.first().is_some_and(u8::is_ascii_whitespace) {
        return None;
    }
    let token = rest.trim_ascii();
    let ok = !token.is_empty() && !token.iter().any(u8::is_ascii_whitespace);
    ok.then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    // The worked example from GitHub's "Validating webhook deliveries" docs.
    const GOOD: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn github_documented_example_verifies() {
        assert_eq!(github_signature(SECRET, BODY, Some(GOOD)), Ok(()));
        // Hex case and surrounding whitespace do not matter.
        let upper = format!(
            "  sha256={} ",
            GOOD.trim_start_matches("sha256=").to_uppercase()
        );
        assert_eq!(github_signature(SECRET, BODY, Some(&upper)), Ok(()));
    }

    #[test]
    fn github_wrong_signature_or_secret_or_body_is_a_mismatch() {
        let wrong = "sha256=0000000000000000000000000000000000000000000000000000000000000000";
        assert_eq!(
            github_signature(SECRET, BODY, Some(wrong)),
            Err(AuthError::Mismatch)
        );
        assert_eq!(
            github_signature(b"other secret", BODY, Some(GOOD)),
            Err(AuthError::Mismatch)
        );
        assert_eq!(
            github_signature(SECRET, b"Hello, World?", Some(GOOD)),
            Err(AuthError::Mismatch)
        );
        assert_eq!(
            github_signature(b"", BODY, Some(GOOD)),
            Err(AuthError::Mismatch)
        );
    }

    #[test]
    fn github_missing_signature() {
        assert_eq!(
            github_signature(SECRET, BODY, None),
            Err(AuthError::Missing)
        );
        assert_eq!(
            github_signature(SECRET, BODY, Some("  ")),
            Err(AuthError::Missing)
        );
    }

    #[test]
    fn github_malformed_signature() {
        let hex = GOOD.trim_start_matches("sha256=");
        for bad in [
            "sha256=".to_owned(),
            "sha256=zz".to_owned(),
            format!("sha256={}", &hex[..62]),
            format!("sha256={hex}00"),
            format!("sha256={hex}0"),
            // Wrong prefix: the legacy SHA-1 header's format, and none at all.
            format!("sha1={hex}"),
            hex.to_owned(),
            format!("SHA256={hex}"),
        ] {
            assert_eq!(
                github_signature(SECRET, BODY, Some(&bad)),
                Err(AuthError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn github_signature_hashed_in_chunks_verifies_as_the_whole_body() {
        for size in [1, 2, 5, BODY.len()] {
            let mut check = GithubSignature::expect(SECRET, Some(GOOD)).expect("well-formed");
            BODY.chunks(size).for_each(|c| check.update(c));
            assert_eq!(check.verify(), Ok(()), "chunks of {size}");
        }
        let mut check = GithubSignature::expect(SECRET, Some(GOOD)).expect("well-formed");
        check.update(&BODY[..5]);
        assert_eq!(check.verify(), Err(AuthError::Mismatch));
        // Judged from the header alone, before any body.
        assert_eq!(
            GithubSignature::expect(SECRET, Some("sha256=12")).err(),
            Some(AuthError::Malformed)
        );
        assert_eq!(
            GithubSignature::expect(b"", Some(GOOD)).err(),
            Some(AuthError::Mismatch)
        );
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(token_matches(b"s3cret", Some(b"s3cret")));
        assert!(!token_matches(b"s3cret", Some(b"s3creT")));
        assert!(!token_matches(b"s3cret", Some(b"s3cret ")));
        assert!(!token_matches(b"s3cret", Some(b"")));
        assert!(!token_matches(b"s3cret", None));
        assert!(!token_matches(b"", Some(b"")));
        assert!(!token_matches(b"", None));
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer(Some(b"Bearer abc.def")), Some(&b"abc.def"[..]));
        assert_eq!(bearer(Some(b"bearer   abc  ")), Some(&b"abc"[..]));
        assert_eq!(bearer(Some(b"BEARER\tabc")), Some(&b"abc"[..]));
        for bad in [
            &b""[..],
            b"Bearer",
            b"Bearer ",
            b"Bearerabc",
            b"Basic YWxhZGRpbjpvcGVuc2VzYW1l",
            b"Bearer a b",
            b"Token abc",
        ] {
            assert_eq!(
                bearer(Some(bad)),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(bearer(None), None);
    }
}
