//! The instance callback/metadata API garm's install templates call (served
//! on `RUNYARD_SCALER_METADATA_LISTEN`), and what it needs from the rest of
//! the scaler: per-instance tokens and the instance's bootstrap secrets,
//! kept where every replica can read them.
//!
//! - [`InstanceTokens`]: a short-lived token per instance (HS256 JWT signed
//!   with `RUNYARD_SCALER_INSTANCE_TOKEN_KEY`, so any replica accepts it),
//!   scoped to that instance and expiring after the pool's bootstrap timeout.
//! - [`SecretStore`]: the instance's JIT config (or GitLab runner token) in
//!   the KV bucket `<NS>_INSTANCES`, written by the engine before the
//!   provider is asked to create the instance.
//! - [`api`]: the routes themselves (what each answers, and the runner
//!   events the status callbacks become); [`script`]: the install script,
//!   systemd unit and service name they hand out.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use runyard_bus::Bus;
use runyard_events::Forge;
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

pub mod api;
pub mod script;

/// What an instance token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The instance name.
    pub sub: String,
    /// Its pool.
    pub pool: String,
    /// Expiry (seconds since the epoch).
    pub exp: u64,
    /// Issued at.
    pub iat: u64,
    /// Always `runyard-instance`.
    pub aud: String,
    /// The create attempt the instance was made for (1-based; 0 when the
    /// minter did not say): a failure it reports is that attempt's.
    #[serde(default)]
    pub attempt: u32,
    /// The create attempt's nonce ([`InstanceSecrets::nonce`]): the token
    /// opens only the secrets stored for that attempt, so a leftover
    /// instance of a failed attempt (same name) cannot read or report for
    /// the next one.
    #[serde(default)]
    pub nonce: String,
}

/// The audience of instance tokens (a token of another kind never passes).
pub const AUDIENCE: &str = "runyard-instance";

/// Why a token was refused.
#[derive(Debug, thiserror::Error)]
#[error("instance token refused: {0}")]
pub struct TokenError(String);

/// Mints and checks instance tokens.
#[derive(Clone)]
pub struct InstanceTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl std::fmt::Debug for InstanceTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InstanceTokens(..)")
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl InstanceTokens {
    /// Tokens signed with `key`.
    pub fn new(key: &SecretString) -> Self {
        let bytes = key.expose_secret().as_bytes();
        Self {
            encoding: EncodingKey::from_secret(bytes),
            decoding: DecodingKey::from_secret(bytes),
        }
    }

    /// A token for `instance` of `pool`, valid for `ttl`, bound to no
    /// create attempt (attempt 0, no nonce): it opens only secrets stored
    /// without a nonce, which the engine never stores. The engine mints
    /// with [`InstanceTokens::mint_for`].
    pub fn mint(&self, instance: &str, pool: &str, ttl: Duration) -> Result<String, TokenError> {
        self.sign(instance, pool, 0, "", ttl)
    }

    /// A token for create attempt `attempt` (1-based) of the instance whose
    /// secrets are `secrets`, valid for `ttl`: it carries their name, pool
    /// and nonce, so it opens these secrets and no later attempt's. A
    /// `failed` status the instance reports with it becomes `RunnerFailed`
    /// of that attempt.
    pub fn mint_for(
        &self,
        secrets: &InstanceSecrets,
        attempt: u32,
        ttl: Duration,
    ) -> Result<String, TokenError> {
        self.sign(&secrets.name, &secrets.pool, attempt, &secrets.nonce, ttl)
    }

    fn sign(
        &self,
        instance: &str,
        pool: &str,
        attempt: u32,
        nonce: &str,
        ttl: Duration,
    ) -> Result<String, TokenError> {
        let iat = now_secs();
        let claims = Claims {
            sub: instance.to_owned(),
            pool: pool.to_owned(),
            exp: iat + ttl.as_secs().max(1),
            iat,
            aud: AUDIENCE.to_owned(),
            attempt,
            nonce: nonce.to_owned(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|e| TokenError(e.to_string()))
    }

    /// The claims of a valid, unexpired token.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[AUDIENCE]);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp", "sub", "aud"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map(|d| d.claims)
            .map_err(|e| TokenError(e.to_string()))
    }
}

/// A forge stored by its name (`github`, `gitlab`); any other is refused.
mod forge_name {
    use runyard_events::{Forge, forge_token, parse_forge};
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(forge: &Forge, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(forge_token(*forge))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Forge, D::Error> {
        let name = String::deserialize(d)?;
        parse_forge(&name).ok_or_else(|| D::Error::custom(format!("unknown forge {name:?}")))
    }
}

/// What an instance may fetch from the metadata API. Its `Debug` shows
/// the JIT configuration as `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceSecrets {
    /// Instance name.
    pub name: String,
    /// Pool name.
    pub pool: String,
    /// The forge (stored as `github` or `gitlab`).
    #[serde(with = "forge_name")]
    pub forge: Forge,
    /// GitHub's `encoded_jit_config` (base64 of a JSON map of the runner's
    /// files `.runner`, `.credentials`, `.credentials_rsaparams`), or the
    /// GitLab runner authentication token.
    pub jit_config: String,
    /// Repository / organization / project URL the runner serves.
    pub repo_url: String,
    /// Runner labels.
    pub labels: Vec<String>,
    /// GitHub runner group.
    pub runner_group: String,
    /// The create attempt's nonce ([`InstanceSecrets::new_nonce`]), which
    /// its instance token carries: secrets stored for a later attempt of
    /// the same instance name have another, and refuse the earlier token.
    /// Empty in secrets stored before tokens carried one.
    #[serde(default)]
    pub nonce: String,
}

impl std::fmt::Debug for InstanceSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            name,
            pool,
            forge,
            jit_config: _,
            repo_url,
            labels,
            runner_group,
            nonce: _,
        } = self;
        f.debug_struct("InstanceSecrets")
            .field("name", name)
            .field("pool", pool)
            .field("forge", forge)
            .field("jit_config", &"***")
            .field("repo_url", repo_url)
            .field("labels", labels)
            .field("runner_group", runner_group)
            .field("nonce", &"***")
            .finish()
    }
}

impl InstanceSecrets {
    /// A fresh nonce for a create attempt (128 random bits, hex).
    pub fn new_nonce() -> String {
        format!("{:032x}", rand::random::<u128>())
    }
}

/// Errors of the secret store.
#[derive(Debug, thiserror::Error)]
#[error("instance secrets: {0}")]
pub struct StoreError(String);

/// Bootstrap secrets in `<NS>_INSTANCES` (kept `max_age`: the longest
/// bootstrap timeout).
#[derive(Clone, Debug)]
pub struct SecretStore {
    bucket: kv::Store,
}

impl SecretStore {
    /// Opens (creating when missing) the bucket.
    pub async fn open(bus: &Bus, max_age: Duration) -> Result<Self, StoreError> {
        Self::open_replicated(bus, max_age, 1).await
    }

    /// [`SecretStore::open`], creating a missing bucket with `replicas`
    /// replicas (an existing one is left as it is).
    pub async fn open_replicated(
        bus: &Bus,
        max_age: Duration,
        replicas: usize,
    ) -> Result<Self, StoreError> {
        let name = format!(
            "{}_INSTANCES",
            bus.namespace().as_str().to_ascii_uppercase()
        );
        let js = bus.jetstream();
        let bucket = match js.get_key_value(&name).await {
            Ok(b) => b,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: name,
                    history: 1,
                    max_age,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| StoreError(e.to_string()))?,
        };
        Ok(Self { bucket })
    }

    /// Stores an instance's secrets (replacing earlier ones).
    pub async fn put(&self, secrets: &InstanceSecrets) -> Result<(), StoreError> {
        let body = serde_json::to_vec(secrets).map_err(|e| StoreError(e.to_string()))?;
        self.bucket
            .put(&secrets.name, Bytes::from(body))
            .await
            .map(drop)
            .map_err(|e| StoreError(e.to_string()))
    }

    /// An instance's secrets, if stored and not expired.
    pub async fn get(&self, name: &str) -> Result<Option<InstanceSecrets>, StoreError> {
        let Some(body) = self
            .bucket
            .get(name)
            .await
            .map_err(|e| StoreError(e.to_string()))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| StoreError(e.to_string()))
    }

    /// Forgets an instance's secrets (its runner is gone).
    pub async fn remove(&self, name: &str) {
        let _ = self.bucket.purge(name).await;
    }
}

/// The API's shared parts: tokens, secrets, and the URLs instances are
/// given.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// Instance tokens.
    pub tokens: InstanceTokens,
    /// Bootstrap secrets.
    pub store: SecretStore,
    /// `<base>/api/v1/callbacks`.
    pub callback_url: String,
    /// `<base>/api/v1/metadata`.
    pub metadata_url: String,
}

impl Metadata {
    /// Callback and metadata URLs under `base` (`http://host:8084`).
    pub fn new(tokens: InstanceTokens, store: SecretStore, base: &str) -> Self {
        let base = base.trim_end_matches('/');
        Self {
            tokens,
            store,
            callback_url: format!("{base}/api/v1/callbacks"),
            metadata_url: format!("{base}/api/v1/metadata"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "glrt-a1f0c9d27be84e53a1f0c9d27be84e53";
        let secrets = InstanceSecrets {
            name: "ry-linux-0123456789".into(),
            pool: "linux".into(),
            forge: Forge::Gitlab,
            jit_config: secret.into(),
            repo_url: "https://gitlab.example.com".into(),
            labels: vec!["docker".into()],
            runner_group: String::new(),
            nonce: InstanceSecrets::new_nonce(),
        };
        let shown = format!("{secrets:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(!shown.contains(&secrets.nonce), "{shown}");
        assert!(shown.contains("ry-linux-0123456789"), "{shown}");
        let tokens = InstanceTokens::new(&SecretString::from(secret.to_owned()));
        assert!(!format!("{tokens:?}").contains(secret));
    }

    #[test]
    fn a_token_names_its_instance_and_expires() {
        let t = InstanceTokens::new(&SecretString::from("k1".to_owned()));
        let token = t.mint("ry-a-1", "a", Duration::from_secs(60)).unwrap();
        assert_eq!(t.verify(&token).unwrap().sub, "ry-a-1");
        let other = InstanceTokens::new(&SecretString::from("k2".to_owned()));
        assert!(other.verify(&token).is_err(), "another key");
        assert!(t.verify("not-a-token").is_err());
    }
}
