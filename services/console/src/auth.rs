//! Who may see the console. No page answers without one of:
//!
//! - a **trusted proxy's identity header** (the oauth2-proxy pattern): a
//!   request whose peer address is one of `RUNYARD_CONSOLE_TRUSTED_PROXIES`
//!   and that carries `RUNYARD_CONSOLE_IDENTITY_HEADER` is that person's.
//!   The header is ignored from any other address, and a request from a
//!   trusted proxy without it is refused (the proxy let it through
//!   unauthenticated);
//! - a **token** of `RUNYARD_CONSOLE_TOKENS` (or `_FILE`): sent as
//!   `Authorization: Bearer <token>` (scripts, `curl`), or typed into the
//!   login page once, which sets a session cookie;
//! - that **session cookie**: `<expiry>.<HMAC-SHA256>` keyed by the digest
//!   of the token that signed in, so it names no token, cannot be forged
//!   without one, ends at its expiry, and ends at once when its token is
//!   taken out of the list.

use std::net::IpAddr;
use std::time::Duration;

use hmac::{Hmac, Mac as _};
use http::HeaderMap;
use runyard_forge::tokens::{Mismatch, Tokens};
use sha2::Sha256;

use crate::config::Proxy;

/// The session cookie's name.
pub const COOKIE: &str = "runyard_console";

/// Who is looking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// Someone a trusted proxy names.
    Person(String),
    /// Someone holding a token (or its session).
    Token,
}

impl Viewer {
    /// How the page header names them.
    pub fn label(&self) -> &str {
        match self {
            Self::Person(name) => name,
            Self::Token => "token login",
        }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Nothing that identifies anyone.
    NoCredentials,
    /// A bearer token that is not one of the configured ones.
    UnknownToken,
    /// A session cookie that is expired, forged, or of a token no longer
    /// accepted.
    BadSession,
    /// A trusted proxy's request without the identity header.
    NoIdentity,
}

impl Refusal {
    /// What the refusal page and the `WWW-Authenticate` answer say.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoCredentials => "sign in to see the console",
            Self::UnknownToken => "that token is not accepted",
            Self::BadSession => "your session ended; sign in again",
            Self::NoIdentity => "the proxy sent no identity for this request",
        }
    }

    /// The `reason` label of `runyard_console_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NoCredentials => "no_credentials",
            Self::UnknownToken => "unknown_token",
            Self::BadSession => "bad_session",
            Self::NoIdentity => "no_identity",
        }
    }
}

/// The configured ways in.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Tokens,
    proxies: Vec<Proxy>,
    identity_header: http::HeaderName,
    ttl: Duration,
    secure: bool,
}

type HmacSha256 = Hmac<Sha256>;

/// Longest identity a proxy may name (a person's login or address).
const MAX_IDENTITY: usize = 256;

impl Auth {
    /// The ways in: `tokens`, `proxies` with their `identity_header`,
    /// sessions lasting `ttl`, cookies `Secure` when `secure`.
    pub fn new(
        tokens: Tokens,
        proxies: Vec<Proxy>,
        identity_header: http::HeaderName,
        ttl: Duration,
        secure: bool,
    ) -> Self {
        Self {
            tokens,
            proxies,
            identity_header,
            ttl,
            secure,
        }
    }

    /// Whether token logins are on (the login page has a form).
    pub fn takes_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    fn trusted(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|ip| {
            let ip = match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            };
            self.proxies.iter().any(|p| p.contains(&ip))
        })
    }

    /// Who sent a request with `headers` from `peer`, at `now` (Unix
    /// seconds).
    pub fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
        now: i64,
    ) -> Result<Viewer, Refusal> {
        if self.trusted(peer) {
            return match headers
                .get(&self.identity_header)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= MAX_IDENTITY)
            {
                Some(who) => Ok(Viewer::Person(who.to_owned())),
                // A proxy in front of the console that sent no identity
                // let the request through unauthenticated; a token from
                // behind it still counts.
                None if self.tokens.is_empty() => Err(Refusal::NoIdentity),
                None => self.by_token(headers, now).map_err(|r| match r {
                    Refusal::NoCredentials => Refusal::NoIdentity,
                    other => other,
                }),
            };
        }
        self.by_token(headers, now)
    }

    fn by_token(&self, headers: &HeaderMap, now: i64) -> Result<Viewer, Refusal> {
        if self.tokens.is_empty() {
            return Err(Refusal::NoCredentials);
        }
        if let Some(header) = headers.get(http::header::AUTHORIZATION) {
            return match self.tokens.check(Some(header.as_bytes())) {
                Ok(_) => Ok(Viewer::Token),
                Err(Mismatch::Missing) => Err(Refusal::NoCredentials),
                Err(Mismatch::Unknown) => Err(Refusal::UnknownToken),
            };
        }
        match session_cookie(headers) {
            Some(value) if self.session_valid(value, now) => Ok(Viewer::Token),
            Some(_) => Err(Refusal::BadSession),
            None => Err(Refusal::NoCredentials),
        }
    }

    /// Checks a token typed into the login page: the `Set-Cookie` value of
    /// its session, or why not.
    pub fn login(&self, token: &str, now: i64) -> Result<String, Refusal> {
        match self.tokens.check_token(token.trim().as_bytes()) {
            Ok(digest) => {
                let expiry = now + i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX / 2);
                let value = format!("{expiry}.{}", hex::encode(mac(&digest, expiry)));
                Ok(self.cookie(&value, self.ttl.as_secs()))
            }
            Err(Mismatch::Missing) => Err(Refusal::NoCredentials),
            Err(Mismatch::Unknown) => Err(Refusal::UnknownToken),
        }
    }

    /// The `Set-Cookie` value that ends a session.
    pub fn logout(&self) -> String {
        self.cookie("", 0)
    }

    fn cookie(&self, value: &str, max_age: u64) -> String {
        format!(
            "{COOKIE}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
            if self.secure { "; Secure" } else { "" }
        )
    }

    fn session_valid(&self, value: &str, now: i64) -> bool {
        let Some((expiry, tag)) = value.split_once('.') else {
            return false;
        };
        let (Ok(expiry), Ok(tag)) = (expiry.parse::<i64>(), hex::decode(tag)) else {
            return false;
        };
        if expiry <= now {
            return false;
        }
        // Every accepted token's digest is tried, whatever matched.
        self.tokens.digests().iter().fold(false, |ok, digest| {
            ok | keyed(digest, expiry).verify_slice(&tag).is_ok()
        })
    }
}

fn keyed(digest: &[u8; 32], expiry: i64) -> HmacSha256 {
    #[allow(clippy::expect_used)]
    let mut m = HmacSha256::new_from_slice(digest).expect("HMAC takes any key length");
    m.update(b"runyard-console-session\0");
    m.update(expiry.to_string().as_bytes());
    m
}

fn mac(digest: &[u8; 32], expiry: i64) -> Vec<u8> {
    keyed(digest, expiry).finalize().into_bytes().to_vec()
}

/// The value of the session cookie in `headers`, if any.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0b8f3e1c9d7a5b2e4f6a8c0d1e3f5a7b9c1d3e5f7a9b0c2d4e6f8a1b3c5d7e9f";
    const OTHER: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

    fn auth(proxies: &[&str], tokens: &[&str]) -> Auth {
        Auth::new(
            Tokens::new("RUNYARD_CONSOLE_TOKENS", tokens),
            proxies.iter().map(|p| p.parse().unwrap()).collect(),
            http::HeaderName::from_static("x-forwarded-user"),
            Duration::from_secs(3600),
            false,
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn cookie_of(set_cookie: &str) -> String {
        set_cookie.split(';').next().unwrap().to_owned()
    }

    #[test]
    fn a_token_signs_in_and_its_session_lasts_until_it_expires() {
        let a = auth(&[], &[TOKEN]);
        let none = Some("192.0.2.1".parse().unwrap());
        assert_eq!(
            a.identify(&headers(&[]), none, 0),
            Err(Refusal::NoCredentials)
        );
        assert_eq!(
            a.identify(
                &headers(&[("authorization", &format!("Bearer {TOKEN}"))]),
                none,
                0
            ),
            Ok(Viewer::Token)
        );
        assert_eq!(
            a.identify(
                &headers(&[("authorization", &format!("Bearer {OTHER}"))]),
                none,
                0
            ),
            Err(Refusal::UnknownToken)
        );
        assert_eq!(a.login(OTHER, 0), Err(Refusal::UnknownToken));
        let set = a.login(&format!(" {TOKEN}\n"), 1000).unwrap();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        assert!(!set.contains(TOKEN), "the cookie names no token: {set}");
        let cookie = cookie_of(&set);
        let h = headers(&[("cookie", &format!("theme=dark; {cookie}"))]);
        assert_eq!(a.identify(&h, none, 1000 + 3599), Ok(Viewer::Token));
        assert_eq!(a.identify(&h, none, 1000 + 3600), Err(Refusal::BadSession));
        // A session of a token taken out of the list ends at once.
        let rotated = auth(&[], &[OTHER]);
        assert_eq!(rotated.identify(&h, none, 1001), Err(Refusal::BadSession));
        // A forged expiry fails its MAC.
        let (expiry, tag) = cookie.split_once('=').unwrap().1.split_once('.').unwrap();
        let later = expiry.parse::<i64>().unwrap() + 86_400;
        let forged = headers(&[("cookie", &format!("{COOKIE}={later}.{tag}"))]);
        assert_eq!(a.identify(&forged, none, 1001), Err(Refusal::BadSession));
        assert!(a.logout().contains("Max-Age=0"));
    }

    #[test]
    fn only_a_trusted_proxy_names_who_is_looking() {
        let a = auth(&["10.0.0.0/24", "::1/128"], &[]);
        let person = headers(&[("x-forwarded-user", "ada@example.com")]);
        let proxy = Some("10.0.0.7".parse().unwrap());
        assert_eq!(
            a.identify(&person, proxy, 0),
            Ok(Viewer::Person("ada@example.com".into()))
        );
        assert_eq!(
            a.identify(&person, Some("::ffff:10.0.0.9".parse().unwrap()), 0),
            Ok(Viewer::Person("ada@example.com".into()))
        );
        assert_eq!(
            a.identify(&person, Some("::1".parse().unwrap()), 0),
            Ok(Viewer::Person("ada@example.com".into()))
        );
        // From anywhere else the header is anyone's to write: ignored.
        assert_eq!(
            a.identify(&person, Some("10.0.1.7".parse().unwrap()), 0),
            Err(Refusal::NoCredentials)
        );
        assert_eq!(a.identify(&person, None, 0), Err(Refusal::NoCredentials));
        // The proxy let a request through without naming anyone.
        assert_eq!(
            a.identify(&headers(&[]), proxy, 0),
            Err(Refusal::NoIdentity)
        );
        let blank = headers(&[("x-forwarded-user", "  ")]);
        assert_eq!(a.identify(&blank, proxy, 0), Err(Refusal::NoIdentity));
    }
}
