//! The fake's credentials: registration tokens (step B), the admin JWT
//! of step C, `messageQueueAccessToken`s (HS256 JWTs with `exp`, each
//! remembered with its exact expiry so TTLs below a second work), and the
//! JIT runner configs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};

use super::state::AcState;
use crate::fake_github::{random_token, rfc3339};

/// What a token the fake issued is good for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TokenKind {
    /// The admin token of step C.
    Admin,
    /// A `messageQueueAccessToken` of this session.
    Session(String),
}

/// A token the fake issued and when it stops working.
#[derive(Debug)]
pub(super) struct Issued {
    pub(super) kind: TokenKind,
    pub(super) expires: SystemTime,
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Seconds since the epoch, rounded up: a JWT's `exp` is never before
/// the moment the fake stops taking the token.
fn epoch_ceil(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

impl AcState {
    /// A registration token (step B), valid for an hour.
    pub(super) fn issue_registration_token(&mut self) -> (String, String) {
        let token = format!("AREG{}", random_token(25).to_uppercase());
        let expires = SystemTime::now() + Duration::from_secs(3600);
        self.registration_tokens.insert(token.clone(), expires);
        self.registration_tokens_issued += 1;
        (token, rfc3339(expires))
    }

    /// Step C: trades a registration token for the service URL and an
    /// admin token. `(status, body)`.
    pub(super) fn runner_registration(
        &mut self,
        remote_auth: Option<&str>,
        body: &[u8],
    ) -> (u16, Value) {
        if let Some(status) = self.fail_registration.pop_front() {
            return (status, json!({"message": "injected failure"}));
        }
        let now = SystemTime::now();
        let known = remote_auth
            .and_then(|t| self.registration_tokens.get(t))
            .is_some_and(|exp| *exp > now);
        if !known {
            return (401, json!({"message": "Bad credentials"}));
        }
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let url = v.get("url").and_then(Value::as_str).unwrap_or_default();
        let event = v.get("runner_event").and_then(Value::as_str);
        if url.is_empty() || event != Some("register") {
            return (
                400,
                json!({"message": "url and runner_event \"register\" are required"}),
            );
        }
        self.registrations.push(url.to_owned());
        let token = self.issue_token(TokenKind::Admin, self.admin_ttl);
        self.admin_tokens_issued += 1;
        (
            201,
            json!({"url": self.service_url(), "token": token, "token_schema": "OAuthAccessToken"}),
        )
    }

    /// An HS256 JWT carrying `exp`, remembered with its exact expiry.
    pub(super) fn issue_token(&mut self, kind: TokenKind, ttl: Duration) -> String {
        let now = SystemTime::now();
        let expires = now + ttl;
        let iat = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let sub = match &kind {
            TokenKind::Admin => "runner-admin".to_owned(),
            TokenKind::Session(sid) => format!("session:{sid}"),
        };
        let claims = json!({
            "iss": "fake-actions",
            "aud": "actions-service",
            "sub": sub,
            "iat": iat,
            "nbf": iat,
            "exp": epoch_ceil(expires),
            "jti": uuid::Uuid::new_v4().to_string(),
        });
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&self.secret),
        )
        // HS256 over a JSON object cannot fail; a token that says so still
        // works as an opaque credential.
        .unwrap_or_else(|_| format!("fake.{}.token", random_token(32)));
        self.tokens.insert(token.clone(), Issued { kind, expires });
        token
    }

    fn token_kind(&self, bearer: Option<&str>) -> Option<&TokenKind> {
        let now = SystemTime::now();
        bearer
            .and_then(|t| self.tokens.get(t))
            .filter(|i| i.expires > now)
            .map(|i| &i.kind)
    }

    /// Whether `bearer` is an unexpired admin token.
    pub(super) fn admin_ok(&self, bearer: Option<&str>) -> bool {
        self.token_kind(bearer) == Some(&TokenKind::Admin)
    }

    /// The session an unexpired `messageQueueAccessToken` belongs to.
    pub(super) fn session_of(&self, bearer: Option<&str>) -> Option<String> {
        match self.token_kind(bearer) {
            Some(TokenKind::Session(sid)) if self.sessions.contains_key(sid) => Some(sid.clone()),
            _ => None,
        }
    }

    /// Every token of `kind` answers 401 from now on.
    pub(super) fn expire_tokens(&mut self, admin: bool) {
        for issued in self.tokens.values_mut() {
            if matches!(issued.kind, TokenKind::Admin) == admin {
                issued.expires = UNIX_EPOCH;
            }
        }
    }

    /// base64 of `{".runner", ".credentials", ".credentials_rsaparams"}`,
    /// each base64 of a JSON document; `.runner` names the runner.
    pub(super) fn encode_jit(
        &self,
        id: i64,
        name: &str,
        ss_id: i64,
        work_folder: &str,
        disable_update: bool,
    ) -> String {
        let service = self.service_url();
        let runner = json!({
            "agentId": id,
            "agentName": name,
            "poolId": 0,
            "poolName": "Default",
            "runnerScaleSetId": ss_id,
            "serverUrl": service,
            "workFolder": if work_folder.is_empty() { "_work" } else { work_folder },
            "ephemeral": true,
            "disableUpdate": disable_update,
        });
        let credentials = json!({
            "scheme": "OAuth",
            "data": {
                "clientId": uuid::Uuid::new_v4().to_string(),
                "authorizationUrl": format!("{service}_apis/oauth2/token"),
            },
        });
        let part = |n: usize| b64(&random_token(n));
        let rsa = json!({
            "d": part(96), "dp": part(48), "dq": part(48), "exponent": "AQAB",
            "inverseQ": part(48), "modulus": part(96), "p": part(48), "q": part(48),
        });
        let files = json!({
            ".runner": b64(&runner.to_string()),
            ".credentials": b64(&credentials.to_string()),
            ".credentials_rsaparams": b64(&rsa.to_string()),
        });
        b64(&files.to_string())
    }
}
