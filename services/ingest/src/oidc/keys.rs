//! An issuer's signing keys: found through its OpenID discovery document,
//! fetched as a JWK set, cached, and fetched again when they are old or a
//! token names a key the cache does not have (the issuer rotated) — but not
//! more often than the refetch interval, so tokens with made-up key ids
//! cannot make ingest hammer the issuer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

use super::issuer::{is_loopback, split_url};

/// Cached keys are fetched again on the next token after this long, so a
/// key the issuer withdrew stops verifying.
const MAX_AGE: Duration = Duration::from_secs(3600);

/// The most a discovery document or key set may be.
const MAX_DOCUMENT: usize = 1 << 20;

/// A key a token may be verified with, and the one algorithm it verifies.
#[derive(Clone)]
pub(crate) struct Key {
    pub(crate) key: DecodingKey,
    pub(crate) algorithm: Algorithm,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// One issuer's keys by `kid`, and how their last fetch went. Lookups
/// never wait on the issuer while holding the cache: one fetch at a time
/// runs on its own, and a lookup that has no key waits for that one fetch
/// (not for a queue of them). A failed fetch is remembered and not tried
/// again before its back-off has passed (1 s, doubling to a minute), so
/// while an issuer is down a report fails at once instead of waiting on
/// it.
#[derive(Debug)]
pub(crate) struct Cache {
    state: Mutex<State>,
    /// Counts finished fetches; lookups waiting for one watch it.
    finished: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<String, Key>,
    /// When the keys were last fetched.
    fetched: Option<Instant>,
    /// The last fetch failed: not tried again before its back-off.
    failure: Option<Failure>,
    /// A fetch is under way.
    fetching: bool,
}

#[derive(Debug)]
struct Failure {
    at: Instant,
    backoff: Duration,
    why: String,
}

/// The first wait after a failed fetch; it doubles with each failure in a
/// row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The most one fetch (discovery and key set together) may take.
pub(crate) const FETCH_DEADLINE: Duration = Duration::from_secs(5);

/// What became of a lookup.
#[derive(Debug)]
pub(crate) enum Lookup {
    Found(Key),
    /// The issuer has no such key, even after looking again (or it was
    /// looked again too recently to ask once more).
    Unknown,
    /// The keys could not be fetched and none are cached: the token cannot
    /// be judged now.
    Unavailable(String),
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            finished: watch::Sender::new(0),
        }
    }
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key `kid` of `issuer`. The key set is fetched (in the
    /// background) when there is none, when it is older than [`MAX_AGE`],
    /// or when it lacks `kid` and was fetched longer than `refetch` ago —
    /// never while the last failure's back-off runs. A cached key answers
    /// at once, stale or not; a lookup without one waits for a fetch under
    /// way, unless the last fetch failed.
    pub(crate) async fn lookup(
        self: &Arc<Self>,
        http: &reqwest::Client,
        issuer: &str,
        kid: &str,
        refetch: Duration,
    ) -> Lookup {
        let mut waited = false;
        loop {
            let mut finished = {
                let mut state = self.lock();
                let now = Instant::now();
                let age = state.fetched.map(|at| now.duration_since(at));
                let stale = age.is_none_or(|a| a >= MAX_AGE);
                let missing = !state.keys.contains_key(kid);
                let wanted = stale || (missing && age.is_none_or(|a| a >= refetch));
                let backing_off = state
                    .failure
                    .as_ref()
                    .is_some_and(|f| now < f.at + f.backoff);
                if wanted && !backing_off && !state.fetching && !waited {
                    state.fetching = true;
                    tokio::spawn(self.clone().fetch(http.clone(), issuer.to_owned()));
                }
                if let Some(key) = state.keys.get(kid) {
                    return Lookup::Found(key.clone());
                }
                if let Some(failure) = &state.failure {
                    return Lookup::Unavailable(failure.why.clone());
                }
                if !state.fetching || waited {
                    return Lookup::Unknown;
                }
                self.finished.subscribe()
            };
            waited = true;
            // The fetch is bounded by its deadline; this only guards
            // against a fetch task that never reports.
            let _ = tokio::time::timeout(FETCH_DEADLINE * 2, finished.changed()).await;
        }
    }

    /// Fetches `issuer`'s keys into the cache, then wakes the lookups
    /// waiting for them.
    async fn fetch(self: Arc<Self>, http: reqwest::Client, issuer: String) {
        let result = tokio::time::timeout(FETCH_DEADLINE, fetch(&http, &issuer))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {FETCH_DEADLINE:?}")));
        {
            let mut state = self.lock();
            state.fetching = false;
            match result {
                Ok(keys) => {
                    tracing::info!(issuer, keys = keys.len(), "identity token keys fetched");
                    state.keys = keys;
                    state.fetched = Some(Instant::now());
                    state.failure = None;
                }
                Err(error) => {
                    let backoff = state
                        .failure
                        .as_ref()
                        .map_or(FIRST_BACKOFF, |f| (f.backoff * 2).min(MAX_BACKOFF));
                    tracing::warn!(
                        issuer,
                        %error,
                        retry_in = ?backoff,
                        "identity token keys could not be fetched"
                    );
                    // Stale keys still verify what they verified: better
                    // than refusing every report while the issuer is down.
                    state.failure = Some(Failure {
                        at: Instant::now(),
                        backoff,
                        why: format!(
                            "the keys of identity token issuer {issuer} could not be fetched, retry later"
                        ),
                    });
                }
            }
        }
        self.finished.send_modify(|n| *n += 1);
    }
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// Fetches `issuer`'s discovery document, then its key set.
async fn fetch(http: &reqwest::Client, issuer: &str) -> Result<HashMap<String, Key>, String> {
    let url = format!("{issuer}/.well-known/openid-configuration");
    let discovery: Discovery = get_json(http, &url).await?;
    // OpenID Connect Discovery 1.0, 4.3: the document must name the issuer
    // it was fetched for.
    if discovery.issuer.trim_end_matches('/') != issuer {
        return Err(format!("{url}: names issuer {:?}", discovery.issuer));
    }
    let secure = split_url(&discovery.jwks_uri)
        .is_some_and(|(scheme, host, _)| scheme == "https" || is_loopback(&host));
    if !secure {
        return Err(format!("{url}: jwks_uri is not an https URL"));
    }
    let set: JwkSet = get_json(http, &discovery.jwks_uri).await?;
    Ok(usable(&set))
}

/// The keys of `set` that can verify a signature: asymmetric, with a key id,
/// not marked for encryption. A key without `alg` verifies the algorithm
/// its type implies (RSA: RS256; EC: ES256 on P-256, ES384 on P-384).
fn usable(set: &JwkSet) -> HashMap<String, Key> {
    let mut keys = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = jwk.common.key_id.clone() else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
            (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
            (AlgorithmParameters::RSA(_), Some(KeyAlgorithm::RS384)) => Algorithm::RS384,
            (AlgorithmParameters::RSA(_), Some(KeyAlgorithm::RS512)) => Algorithm::RS512,
            (AlgorithmParameters::RSA(_), Some(KeyAlgorithm::PS256)) => Algorithm::PS256,
            (AlgorithmParameters::EllipticCurve(p), None | Some(KeyAlgorithm::ES256))
                if p.curve == EllipticCurve::P256 =>
            {
                Algorithm::ES256
            }
            (AlgorithmParameters::EllipticCurve(p), None | Some(KeyAlgorithm::ES384))
                if p.curve == EllipticCurve::P384 =>
            {
                Algorithm::ES384
            }
            // HMAC (a shared secret is no public key), Ed25519 and
            // anything unknown: not a key a forge signs CI tokens with.
            _ => continue,
        };
        if let Ok(key) = DecodingKey::from_jwk(jwk) {
            keys.insert(kid, Key { key, algorithm });
        }
    }
    keys
}

/// GETs `url` and decodes its JSON body, read up to [`MAX_DOCUMENT`].
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> Result<T, String> {
    let mut response = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {}", without_url(&e)))?;
    if !response.status().is_success() {
        return Err(format!("{url}: answered {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("{url}: {}", without_url(&e)))?
    {
        if body.len() + chunk.len() > MAX_DOCUMENT {
            return Err(format!("{url}: larger than {MAX_DOCUMENT} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not the expected JSON: {e}"))
}

/// A reqwest error without the URL it repeats.
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(&format!(" ({url})"), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
