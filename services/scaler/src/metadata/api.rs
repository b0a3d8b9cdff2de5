//! The instance callback/metadata API, laid out as garm's so garm's
//! providers and install templates work unchanged (`callback-url` =
//! `<base>/api/v1/callbacks`, `metadata-url` = `<base>/api/v1/metadata`;
//! every path with and without a trailing slash):
//!
//! | route | answer |
//! |---|---|
//! | `POST callbacks/status` | `{status, message, agent_id}`: `idle` → `RunnerOnline` (source `callback`), `failed` → the instance is removed and `RunnerFailed` (reason `create_failed`) |
//! | `POST callbacks/system-info` | `{os_name, os_version, agent_id}`: logged |
//! | `GET metadata/runner-registration-token` | GitLab: the runner authentication token; GitHub (JIT): 401 as garm |
//! | `GET metadata/credentials/{runner,credentials,credentials_rsaparams}` | the JIT file, decoded |
//! | `GET metadata/system/service-name` | `actions.runner.<org>` / `actions.runner.<owner>.<repo>` |
//! | `GET metadata/systemd/unit-file?runAsUser=` | the runner's systemd unit |
//! | `GET metadata/system/cert-bundle` | `{"root_certificates": {}}` |
//! | `GET metadata/runner-metadata` | garm's `InstanceMetadata` with what runyard knows |
//! | `GET metadata/install-script` | runyard's install script for the instance |
//!
//! Every route wants `Authorization: Bearer <instance token>`. The token's
//! subject names the instance, and only that instance's stored secrets are
//! ever read: no route takes an instance name. A missing, malformed,
//! expired or foreign token, or one whose instance has no secrets stored
//! (never had, removed, or finished installing), gets 401 and
//! `{"error":"Authentication failed"}`, the reason logged at debug only.
//! Once an instance reports `idle` or `failed` its secrets are removed, so
//! its token opens nothing any more (garm refuses instances past
//! installing the same way).
//!
//! A token is bound to the create attempt it was minted for: it carries
//! the nonce stored with that attempt's secrets. When an attempt fails and
//! the next one (same instance name) stores its own secrets, a leftover
//! instance of the failed attempt gets 403 with `{"error":"Not
//! Authorized","details":` [`STALE_ATTEMPT`] `}` on every route: it can
//! neither fetch the new attempt's JIT files nor report `failed` or `idle`
//! for it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use runyard_events::{Body, Forge, RunnerFailed, RunnerOnline, RunnerRef, runner_event_id_for};
use serde::Deserialize;
use serde_json::json;
use tokio_util::task::TaskTracker;

use super::{Claims, InstanceSecrets, Metadata, script};
use crate::engine::Pool;
use crate::io::Io;

/// Largest request body taken (callbacks are a few hundred bytes).
const BODY_LIMIT: usize = 64 * 1024;

/// The `details` of the 403 a token of another create attempt gets.
pub const STALE_ATTEMPT: &str = "the instance token is of another create attempt of this instance; this attempt's instance has its own";

/// Longest instance-reported error carried into an event.
const ERROR_CHARS: usize = 500;

#[derive(Clone)]
struct Api {
    io: Arc<Io>,
    pools: Arc<HashMap<String, Arc<Pool>>>,
    meta: Metadata,
    tasks: TaskTracker,
}

/// The API's routes, when the scaler has an instance token key (`None`
/// otherwise). Work a callback starts that outlives its request (removing
/// a failed instance) runs on `tasks`.
pub fn router(
    io: Arc<Io>,
    pools: Arc<HashMap<String, Arc<Pool>>>,
    metadata: Option<Metadata>,
    tasks: TaskTracker,
) -> Option<Router> {
    let meta = metadata?;
    let api = Api {
        io,
        pools,
        meta,
        tasks,
    };
    let both = |r: Router<Api>, path: &str, method: axum::routing::MethodRouter<Api>| {
        r.route(path, method.clone())
            .route(&format!("{path}/"), method)
    };
    let mut r = Router::new();
    r = both(r, "/api/v1/callbacks/status", post(status));
    r = both(r, "/api/v1/callbacks/system-info", post(system_info));
    r = both(r, "/api/v1/metadata/runner-metadata", get(runner_metadata));
    r = both(
        r,
        "/api/v1/metadata/runner-registration-token",
        get(registration_token),
    );
    r = both(r, "/api/v1/metadata/credentials/{file}", get(credentials));
    r = both(r, "/api/v1/metadata/system/service-name", get(service_name));
    r = both(r, "/api/v1/metadata/systemd/unit-file", get(unit_file));
    r = both(r, "/api/v1/metadata/system/cert-bundle", get(cert_bundle));
    r = both(r, "/api/v1/metadata/install-script", get(install_script));
    Some(r.layer(DefaultBodyLimit::max(BODY_LIMIT)).with_state(api))
}

/// 401 as garm's instance middleware answers it: no reason given.
fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": "Authentication failed"})),
    )
        .into_response()
}

/// An error answer shaped as garm's (`{"error", "details"}`).
fn error(status: StatusCode, error: &str, details: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": error, "details": details})),
    )
        .into_response()
}

fn server_error() -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, "Server error", "")
}

/// 200 with an empty JSON-typed body, as garm answers callbacks.
fn ok_empty() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        "",
    )
        .into_response()
}

fn text(body: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The authenticated caller: a valid token and the secrets of the instance
/// it names.
struct Caller {
    claims: Claims,
    secrets: InstanceSecrets,
    token: String,
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

impl FromRequestParts<Api> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, Response> {
        let path = parts.uri.path().to_owned();
        let Some(token) = bearer(parts) else {
            tracing::debug!(%path, "metadata API: no bearer token");
            return Err(unauthorized());
        };
        let claims = match api.meta.tokens.verify(token) {
            Ok(c) => c,
            Err(error) => {
                tracing::debug!(%path, %error, "metadata API: token refused");
                return Err(unauthorized());
            }
        };
        let secrets = match api.meta.store.get(&claims.sub).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                tracing::debug!(%path, instance = %claims.sub, "metadata API: no secrets stored for the instance");
                return Err(unauthorized());
            }
            Err(error) => {
                tracing::warn!(%error, instance = %claims.sub, "metadata API: reading the instance's secrets failed");
                return Err(server_error());
            }
        };
        if secrets.name != claims.sub || secrets.pool != claims.pool {
            tracing::debug!(%path, instance = %claims.sub, "metadata API: token and secrets disagree");
            return Err(unauthorized());
        }
        if secrets.nonce != claims.nonce {
            // A valid token of this instance name, minted for another
            // create attempt: a leftover of a failed one. Said plainly
            // (the holder knows whose token it has), and nothing is read
            // or recorded for the current attempt.
            tracing::info!(%path, instance = %claims.sub, attempt = claims.attempt, "metadata API: a token of another create attempt of the instance refused");
            return Err(error(
                StatusCode::FORBIDDEN,
                "Not Authorized",
                STALE_ATTEMPT,
            ));
        }
        Ok(Self {
            claims,
            secrets,
            token: token.to_owned(),
        })
    }
}

/// The body of `POST callbacks/status`.
#[derive(Debug, Deserialize)]
struct StatusUpdate {
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    agent_id: Option<i64>,
}

/// The body of `POST callbacks/system-info`.
#[derive(Debug, Deserialize)]
struct SystemInfo {
    #[serde(default)]
    os_name: String,
    #[serde(default)]
    os_version: String,
    #[serde(default)]
    agent_id: Option<i64>,
}

fn bad_request(e: &serde_json::Error) -> Response {
    error(StatusCode::BAD_REQUEST, "Bad Request", &e.to_string())
}

fn runner_ref(p: &Pool, name: &str) -> RunnerRef {
    RunnerRef {
        pool: p.config.name.clone(),
        name: name.to_owned(),
        pool_id: p.id.clone(),
        provider: p.provider_name.clone(),
        forge: p.spec.forge as i32,
        instance: p.spec.instance.clone(),
    }
}

/// Publishes a runner event of `p` with the id every producer gives it
/// (`runyard_events::runner_event_id_for`), so the same fact seen by the
/// engine and told by the instance is stored once. Tries `tries` times.
async fn publish(io: &Io, p: &Pool, body: Body, tries: u32) -> bool {
    let id = runner_event_id_for(&body).unwrap_or_default();
    crate::background::publish_own(io, p.spec.forge, &p.spec.instance, id, body, tries)
        .await
        .is_some()
}

async fn status(State(api): State<Api>, caller: Caller, body: Bytes) -> Response {
    let update: StatusUpdate = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => return bad_request(&e),
    };
    let name = caller.claims.sub.as_str();
    let pool = api.pools.get(&caller.claims.pool).cloned();
    match update.status.as_str() {
        "idle" => {
            tracing::info!(runner = %name, pool = %caller.claims.pool, agent_id = ?update.agent_id, "instance reports its runner installed");
            if let Some(p) = &pool {
                let body = Body::RunnerOnline(RunnerOnline {
                    runner: Some(runner_ref(p, name)),
                    source: "callback".into(),
                });
                if !publish(&api.io, p, body, 3).await {
                    return server_error();
                }
            } else {
                tracing::warn!(runner = %name, pool = %caller.claims.pool, "callback for a pool not configured here: no event");
            }
            // Installed: the token opens nothing any more.
            api.meta.store.remove(name).await;
            ok_empty()
        }
        "failed" => {
            let message: String = update.message.chars().take(ERROR_CHARS).collect();
            tracing::warn!(runner = %name, pool = %caller.claims.pool, %message, "instance reports its install failed");
            api.meta.store.remove(name).await;
            let Some(p) = pool else {
                tracing::warn!(runner = %name, pool = %caller.claims.pool, "callback for a pool not configured here: no event");
                return ok_empty();
            };
            // Off the request: removing the instance ends the caller's
            // connection, and that must not cut this short.
            let io = api.io.clone();
            let name = name.to_owned();
            let attempt = caller.claims.attempt.max(1);
            api.tasks.spawn(async move {
                fail_instance(&io, &p, &name, attempt, &message).await;
            });
            ok_empty()
        }
        other => {
            tracing::info!(runner = %name, status = %other, message = %update.message, "instance status");
            ok_empty()
        }
    }
}

/// A failed install, handled as a failed create attempt: the instance is
/// removed (a retry must not adopt it), then `RunnerFailed` is recorded.
async fn fail_instance(io: &Io, p: &Pool, name: &str, attempt: u32, message: &str) {
    let deleted = p.delete_instance(&io.metrics, &p.id, name).await;
    if let Err(error) = &deleted {
        tracing::warn!(%error, runner = %name, "removing the failed instance failed");
    }
    let error = if message.is_empty() {
        "the instance reported its install failed".to_owned()
    } else {
        format!("the instance reported: {message}")
    };
    let body = Body::RunnerFailed(RunnerFailed {
        runner: Some(runner_ref(p, name)),
        reason: "create_failed".into(),
        error,
        attempt,
        given_up: false,
        job: None,
    });
    publish(io, p, body, 5).await;
}

async fn system_info(caller: Caller, body: Bytes) -> Response {
    let info: SystemInfo = match serde_json::from_slice(&body) {
        Ok(i) => i,
        Err(e) => return bad_request(&e),
    };
    tracing::info!(
        runner = %caller.claims.sub,
        os_name = %info.os_name,
        os_version = %info.os_version,
        agent_id = ?info.agent_id,
        "instance system info"
    );
    ok_empty()
}

/// The pool's extra specs as JSON, when it has any.
fn extra_specs(api: &Api, pool: &str) -> Option<serde_json::Value> {
    let p = api.pools.get(pool)?;
    let v = serde_json::to_value(p.config.extra_specs.as_ref()?).ok()?;
    v.as_object().is_some_and(|o| !o.is_empty()).then_some(v)
}

async fn runner_metadata(State(api): State<Api>, caller: Caller) -> Response {
    let s = &caller.secrets;
    let mut body = json!({
        "metadata_access": {
            "callback_url": api.meta.callback_url,
            "metadata_url": api.meta.metadata_url,
            "agent_url": "",
        },
        "forge_type": runyard_events::forge_token(s.forge),
        "runner_registration_url": s.repo_url,
        "runner_name": s.name,
        "agent_mode": false,
        "jit_enabled": s.forge != Forge::Gitlab,
        "runner_tools": {},
    });
    if !s.labels.is_empty() {
        body["runner_labels"] = json!(s.labels);
    }
    if let Some(specs) = extra_specs(&api, &caller.claims.pool) {
        body["extra_specs"] = specs;
    }
    axum::Json(body).into_response()
}

async fn registration_token(caller: Caller) -> Response {
    if caller.secrets.forge != Forge::Gitlab {
        // JIT runners are configured by their files; garm refuses them a
        // registration token the same way.
        return error(StatusCode::UNAUTHORIZED, "Not Authorized", "");
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        caller.secrets.jit_config,
    )
        .into_response()
}

/// Why a JIT file could not be had.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// Not base64 of a JSON object of strings, or a file not base64.
    #[error("malformed JIT configuration: {0}")]
    Malformed(String),
}

/// File `file` (`.runner`, `.credentials`, `.credentials_rsaparams`) of
/// GitHub's `encoded_jit_config` (base64 of a JSON object whose values are
/// the files, base64 each), decoded; `None` when it has no such file.
pub fn jit_file(encoded: &str, file: &str) -> Result<Option<Vec<u8>>, JitError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let json = b64
        .decode(encoded.trim())
        .map_err(|e| JitError::Malformed(e.to_string()))?;
    let files: HashMap<String, String> =
        serde_json::from_slice(&json).map_err(|e| JitError::Malformed(e.to_string()))?;
    files
        .get(file)
        .map(|f| {
            b64.decode(f.trim())
                .map_err(|e| JitError::Malformed(e.to_string()))
        })
        .transpose()
}

async fn credentials(caller: Caller, Path(file): Path<String>) -> Response {
    if caller.secrets.forge == Forge::Gitlab {
        return error(
            StatusCode::NOT_FOUND,
            "Not Found",
            "instance not configured for JIT",
        );
    }
    let dot = format!(".{file}");
    match jit_file(&caller.secrets.jit_config, &dot) {
        Ok(Some(data)) => {
            let mut resp = (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/octet-stream")],
                data,
            )
                .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename={dot}")) {
                resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
            }
            resp
        }
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "Not Found",
            &format!("could not find file {dot:?}"),
        ),
        Err(e) => {
            tracing::warn!(error = %e, runner = %caller.claims.sub, "the stored JIT configuration is unreadable");
            error(StatusCode::INTERNAL_SERVER_ERROR, "Server error", "")
        }
    }
}

async fn service_name(caller: Caller) -> Response {
    text(script::service_name(&caller.secrets))
}

#[derive(Debug, Deserialize)]
struct UnitQuery {
    #[serde(default, rename = "runAsUser")]
    run_as_user: Option<String>,
}

async fn unit_file(caller: Caller, Query(q): Query<UnitQuery>) -> Response {
    let user = q
        .run_as_user
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| script::DEFAULT_USER.to_owned());
    if !script::valid_user(&user) {
        return error(StatusCode::BAD_REQUEST, "Bad Request", "invalid runAsUser");
    }
    text(script::unit_file(&caller.secrets, &user))
}

async fn cert_bundle(_caller: Caller) -> Response {
    axum::Json(json!({"root_certificates": {}})).into_response()
}

async fn install_script(State(api): State<Api>, caller: Caller) -> Response {
    text(script::install_script(
        &caller.secrets,
        &api.meta.callback_url,
        &api.meta.metadata_url,
        &caller.token,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn jit_files_come_out_decoded() {
        let inner = json!({
            ".runner": b64(br#"{"agentId": 7}"#),
            ".credentials": b64(b"creds"),
        });
        let encoded = b64(inner.to_string().as_bytes());
        assert_eq!(
            jit_file(&encoded, ".runner").unwrap().unwrap(),
            br#"{"agentId": 7}"#
        );
        assert_eq!(
            jit_file(&encoded, ".credentials").unwrap().unwrap(),
            b"creds"
        );
        assert!(
            jit_file(&encoded, ".credentials_rsaparams")
                .unwrap()
                .is_none()
        );
        assert!(jit_file("not base64!", ".runner").is_err());
        assert!(jit_file(&b64(b"[1]"), ".runner").is_err());
    }

    #[test]
    fn bearer_tokens_are_read_strictly() {
        let parts = |v: &str| {
            let (parts, ()) = axum::http::Request::builder()
                .header(header::AUTHORIZATION, v)
                .body(())
                .unwrap()
                .into_parts();
            parts
        };
        assert_eq!(bearer(&parts("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&parts("bearer abc")), Some("abc"));
        assert_eq!(bearer(&parts("Basic abc")), None);
        assert_eq!(bearer(&parts("Bearer")), None);
        assert_eq!(bearer(&parts("Bearer a b")), None);
    }
}
