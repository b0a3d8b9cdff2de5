//! A fake CI identity token issuer on loopback: OpenID discovery and a JWK
//! set, keys generated at run time, tokens signed in the test. The key set
//! can be rotated and the issuer taken down, to test a verifier's cache.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::fake_github::Server;

/// An RSA signing key with its key id.
#[derive(Clone)]
pub struct SigningKey {
    /// `kid`.
    pub kid: String,
    encoding: jsonwebtoken::EncodingKey,
    /// The public key as a JWK.
    pub jwk: Value,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A fresh 1024-bit RSA key (big enough for the code path, quick to
    /// find in an unoptimized build; see [`crate::fake_github::AppKey`]).
    pub fn generate(kid: &str) -> Self {
        use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};
        use rsa::traits::PublicKeyParts;
        #[allow(clippy::unwrap_used)] // test-only code: failing loudly is right
        let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024).unwrap();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwk = json!({
            "kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
            "n": b64(&private.n().to_bytes_be()), "e": b64(&private.e().to_bytes_be()),
        });
        #[allow(clippy::unwrap_used)]
        let pem = private.to_pkcs1_pem(LineEnding::LF).unwrap();
        #[allow(clippy::unwrap_used)]
        let encoding = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap();
        Self {
            kid: kid.to_owned(),
            encoding,
            jwk,
        }
    }

    /// `claims` signed RS256 with this key.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = Some(self.kid.clone());
        #[allow(clippy::unwrap_used)]
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

#[derive(Debug)]
struct IssuerState {
    /// Set once the server is bound (the URL names its port).
    issuer: OnceLock<String>,
    published: Mutex<Vec<SigningKey>>,
    down: AtomicBool,
    silent: AtomicBool,
    key_fetches: AtomicU64,
}

/// A running fake issuer.
#[derive(Debug)]
pub struct FakeIssuer {
    server: Server,
    state: Arc<IssuerState>,
    /// The key [`FakeIssuer::sign`] uses.
    current: Mutex<SigningKey>,
}

impl FakeIssuer {
    /// Starts an issuer whose URL is `http://127.0.0.1:<port><path>`, with
    /// one published key. `path` `""` makes a GitLab-shaped issuer,
    /// `"/_services/token"` a GitHub (Enterprise Server) one.
    pub async fn start(path: &str) -> Self {
        let key = SigningKey::generate("key-1");
        let state = Arc::new(IssuerState {
            issuer: OnceLock::new(),
            published: Mutex::new(vec![key.clone()]),
            down: AtomicBool::new(false),
            silent: AtomicBool::new(false),
            key_fetches: AtomicU64::new(0),
        });
        let router = Router::new()
            .route(
                &format!("{path}/.well-known/openid-configuration"),
                get(discovery),
            )
            .route(&format!("{path}/.well-known/jwks"), get(jwks))
            .with_state(state.clone());
        let server = Server::start(router).await;
        let _ = state.issuer.set(format!("http://{}{path}", server.addr));
        Self {
            server,
            state,
            current: Mutex::new(key),
        }
    }

    /// The issuer URL (`iss`).
    pub fn url(&self) -> String {
        self.state.issuer.get().cloned().unwrap_or_default()
    }

    /// The listening address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr
    }

    /// `claims` signed with the current key.
    pub fn sign(&self, claims: &Value) -> String {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sign(claims)
    }

    /// Rotates: a new key `kid` is published in place of the old ones and
    /// signs from now on.
    pub fn rotate(&self, kid: &str) -> SigningKey {
        let key = SigningKey::generate(kid);
        *self
            .state
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = vec![key.clone()];
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = key.clone();
        key
    }

    /// While down, discovery and the key set answer 503.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    /// While silent, discovery takes the request and never answers (an
    /// issuer behind a network that drops packets).
    pub fn set_silent(&self, silent: bool) {
        self.state.silent.store(silent, Ordering::SeqCst);
    }

    /// How often the key set was fetched.
    pub fn key_fetches(&self) -> u64 {
        self.state.key_fetches.load(Ordering::SeqCst)
    }
}

async fn discovery(State(state): State<Arc<IssuerState>>) -> Response {
    while state.silent.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if state.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let issuer = state.issuer.get().cloned().unwrap_or_default();
    axum::Json(json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/.well-known/jwks"),
        "id_token_signing_alg_values_supported": ["RS256"],
    }))
    .into_response()
}

async fn jwks(State(state): State<Arc<IssuerState>>) -> Response {
    if state.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    state.key_fetches.fetch_add(1, Ordering::SeqCst);
    let keys: Vec<Value> = state
        .published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|k| k.jwk.clone())
        .collect();
    axum::Json(json!({ "keys": keys })).into_response()
}
