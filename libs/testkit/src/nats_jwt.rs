//! A NATS in operator mode (JWT authentication) for tests: an operator, a
//! system account and an application account with JetStream that the
//! operator signed, a user of that account and its `.creds` file, and two
//! users the server must refuse: one issued by an account it does not
//! know, one whose JWT has expired.
//!
//! The JWTs follow the NATS JWT v2 layout: a base64url (unpadded) header
//! `{"typ":"JWT","alg":"ed25519-nkey"}`, the claims, and the ed25519
//! signature of `header.claims` by the issuer's nkey.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};

/// The keys, JWTs and `.creds` files of one operator-mode setup (the files
/// are removed when dropped).
pub struct OperatorMode {
    dir: tempfile::TempDir,
    config: String,
    seeds: Vec<String>,
    /// The `.creds` file of a user of the JetStream account.
    pub creds: PathBuf,
    /// The `.creds` file of a user issued by an account the server does
    /// not know.
    pub foreign_creds: PathBuf,
    /// The `.creds` file of a user of the JetStream account whose JWT
    /// expired a minute ago.
    pub expired_creds: PathBuf,
}

impl OperatorMode {
    /// Makes every key, signs the JWTs and writes the `.creds` files.
    pub fn new() -> Self {
        #[allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let operator = KeyPair::new_operator();
        // The server's own account, for its internal traffic.
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let stranger = KeyPair::new_account();
        let (user, foreign, expired) = (
            KeyPair::new_user(),
            KeyPair::new_user(),
            KeyPair::new_user(),
        );

        let operator_jwt = sign(
            &operator,
            &operator,
            "runyard-test",
            now,
            &json!({ "type": "operator", "version": 2, "system_account": system.public_key() }),
        );
        // Every limit -1 (none); JetStream is on for an account whose
        // storage limits are not 0, so only the application account has it.
        let account_claims = |jetstream: bool| {
            let mut limits = json!({
                "subs": -1, "data": -1, "payload": -1,
                "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
            });
            if jetstream {
                for key in ["mem_storage", "disk_storage", "streams", "consumer"] {
                    limits[key] = json!(-1);
                }
            }
            json!({
                "limits": limits,
                "default_permissions": { "pub": {}, "sub": {} },
                "type": "account",
                "version": 2,
            })
        };
        let system_jwt = sign(&operator, &system, "SYS", now, &account_claims(false));
        let account_jwt = sign(&operator, &account, "runyard", now, &account_claims(true));

        let write_creds = |name: &str, issuer: &KeyPair, user: &KeyPair, exp: Option<i64>| {
            let nats = json!({
                "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                "type": "user", "version": 2,
            });
            let mut claims = claims_of(issuer, user, name, now, &nats);
            if let Some(exp) = exp {
                claims["exp"] = json!(exp);
            }
            let jwt = encode(issuer, &claims);
            let path = dir.path().join(format!("{name}.creds"));
            #[allow(clippy::unwrap_used)]
            std::fs::write(&path, creds_file(&jwt, &seed(user))).unwrap();
            path
        };
        let creds = write_creds("runyard-user", &account, &user, None);
        let foreign_creds = write_creds("foreign-user", &stranger, &foreign, None);
        let expired_creds = write_creds("expired-user", &account, &expired, Some(now - 60));

        let config = format!(
            "operator: \"{operator_jwt}\"\n\
             system_account: {sys}\n\
             resolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: \"{system_jwt}\"\n  {acc}: \"{account_jwt}\"\n}}\n",
            sys = system.public_key(),
            acc = account.public_key(),
        );
        let seeds = [
            &operator, &system, &account, &stranger, &user, &foreign, &expired,
        ]
        .into_iter()
        .map(seed)
        .collect();
        Self {
            dir,
            config,
            seeds,
            creds,
            foreign_creds,
            expired_creds,
        }
    }

    /// The nats-server configuration lines (`operator`, `system_account`,
    /// `resolver`, `resolver_preload`) to add to one that listens and
    /// enables JetStream.
    pub fn server_config(&self) -> &str {
        &self.config
    }

    /// Every nkey seed made (the secrets no error text may show).
    pub fn seeds(&self) -> &[String] {
        &self.seeds
    }

    /// The directory holding the `.creds` files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl std::fmt::Debug for OperatorMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorMode")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Default for OperatorMode {
    fn default() -> Self {
        Self::new()
    }
}

fn seed(key: &KeyPair) -> String {
    #[allow(clippy::unwrap_used)] // made from a seed, so it has one
    key.seed().unwrap()
}

/// The standard claims of a JWT `issuer` signs about `subject`, with
/// `nats` as its NATS-specific part. `jti` only has to be unique here.
fn claims_of(issuer: &KeyPair, subject: &KeyPair, name: &str, now: i64, nats: &Value) -> Value {
    json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": now,
        "iss": issuer.public_key(),
        "sub": subject.public_key(),
        "name": name,
        "nats": nats,
    })
}

/// The JWT of `claims`, signed by `issuer`.
fn encode(issuer: &KeyPair, claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{body}");
    #[allow(clippy::unwrap_used)] // a key with a seed can sign
    let signature = issuer.sign(signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// [`claims_of`], signed by `issuer`.
fn sign(issuer: &KeyPair, subject: &KeyPair, name: &str, now: i64, nats: &Value) -> String {
    encode(issuer, &claims_of(issuer, subject, name, now, nats))
}

/// A `.creds` file: the user's JWT and its nkey seed, in the blocks NATS
/// clients parse.
fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}
