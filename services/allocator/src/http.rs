//! The HTTP edge: gantry's `GET /v1/allocation?spec=...`, health and metrics.
//! With tokens configured every path but `/healthz`, `/readyz` and
//! `/metrics` (and `/v1/allocation` with `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY`)
//! wants `Authorization: Bearer <token>`, else `401`.
//!
//! With a client CA (mTLS) and `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY` on, the
//! handshake lets clients without a certificate in (Spack pipelines have
//! none), and every path but `/v1/allocation` refuses them with `403`:
//! without the gantry exception the handshake refuses them everywhere, and
//! the open paths are the same either way.

use std::sync::atomic::Ordering;

use axum::extract::{Query, State as AxumState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use crate::State;
use crate::auth::Client;
use crate::model;

pub(crate) fn router(state: State, client_certificate_per_request: bool) -> axum::Router {
    let router = axum::Router::new()
        .route("/v1/allocation", get(allocation))
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        // A layer, not a route layer: an unknown path is refused too, so
        // without a token nothing tells which paths exist.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .with_state(state.clone());
    if client_certificate_per_request {
        // Outermost: a client without a certificate learns nothing else.
        router.layer(axum::middleware::from_fn_with_state(
            state,
            client_certificate,
        ))
    } else {
        router
    }
}

/// The mTLS check of a listener that lets clients without a certificate
/// in for the gantry endpoint (see the module doc).
async fn client_certificate(
    AxumState(state): AxumState<State>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let verified = request
        .extensions()
        .get::<axum::extract::ConnectInfo<runyard_tls::Peer>>()
        .is_some_and(|c| c.0.client_certificate);
    if verified || request.uri().path() == "/v1/allocation" {
        return next.run(request).await;
    }
    tracing::debug!("HTTP call without a client certificate refused");
    let refusal = crate::auth::Refusal::NoClientCertificate;
    state.metrics.refused(crate::Door::Http, refusal);
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"error": refusal.message()})),
    )
        .into_response()
}

/// Paths answered without a token.
fn open(state: &State, path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
        || (path == "/v1/allocation" && state.config.allocator_anonymous_gantry)
}

/// The bearer-token check in front of every route (see the module doc).
async fn authenticate(
    AxumState(state): AxumState<State>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut request = request;
    let tokens = &state.config.allocator_tokens;
    if tokens.is_empty() || open(&state, request.uri().path()) {
        let ip = request
            .extensions()
            .get::<axum::extract::ConnectInfo<runyard_tls::Peer>>()
            .map(|c| runyard_tls::peer_key(c.0.addr.ip()));
        request.extensions_mut().insert(Client::anonymous(ip));
        return next.run(request).await;
    }
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match crate::auth::authenticate(tokens, header) {
        Ok(client) => {
            request.extensions_mut().insert(client);
            next.run(request).await
        }
        Err(refusal) => {
            state.metrics.refused(crate::Door::Http, refusal);
            tracing::debug!(reason = refusal.reason(), "HTTP call refused");
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                axum::Json(json!({"error": refusal.message()})),
            )
                .into_response()
        }
    }
}

#[derive(Debug, Deserialize)]
struct SpecQuery {
    spec: Option<String>,
    /// The job attempt this request retries: `retry_of_forge` and
    /// `retry_of_instance` with `retry_of_job_id` and `retry_of_attempt`,
    /// or with `retry_of_pipeline_id` (a GitLab retry pipeline's generate
    /// step: `$RUNYARD_RETRY_OF`), or none of them.
    retry_of_forge: Option<String>,
    retry_of_instance: Option<String>,
    retry_of_job_id: Option<u64>,
    retry_of_attempt: Option<u32>,
    retry_of_pipeline_id: Option<u64>,
}

impl SpecQuery {
    /// The attempt it retries, or what is wrong with the parameters.
    fn retry_of(&self) -> Result<Option<model::JobAttempt>, String> {
        let named = self.retry_of_job_id.is_some() || self.retry_of_pipeline_id.is_some();
        match (&self.retry_of_forge, &self.retry_of_instance) {
            (None, None) if !named && self.retry_of_attempt.is_none() => Ok(None),
            (Some(forge), Some(instance)) if named => {
                if self.retry_of_job_id.is_some() && self.retry_of_attempt.is_none() {
                    return Err("retry_of_attempt: missing; a retry_of_job_id needs the \
                                attempt it retries"
                        .into());
                }
                model::JobAttempt::checked(
                    "retry_of",
                    forge,
                    instance,
                    self.retry_of_job_id.unwrap_or(0),
                    self.retry_of_pipeline_id.unwrap_or(0),
                    self.retry_of_attempt.unwrap_or(0),
                )
                .map(Some)
                .map_err(|e| e.to_string())
            }
            _ => Err(
                "retry_of: give retry_of_forge and retry_of_instance with retry_of_job_id \
                 and retry_of_attempt, or with retry_of_pipeline_id, or none of them"
                    .into(),
            ),
        }
    }
}

fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": message})),
    )
        .into_response()
}

/// Gantry-compatible: `{"variables": {...}}` with the same numbers gRPC gives.
async fn allocation(
    AxumState(state): AxumState<State>,
    client: Option<axum::Extension<Client>>,
    headers: axum::http::HeaderMap,
    query: Result<Query<SpecQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let span = if runyard_telemetry::spans_wanted!() {
        tracing::info_span!(
            "call",
            otel.name = "allocator GET /v1/allocation",
            otel.kind = "server",
        )
    } else {
        tracing::Span::none()
    };
    let trace = runyard_bus::follow(
        &span,
        headers.get("traceparent").and_then(|v| v.to_str().ok()),
    );
    let issuing = crate::Issuing {
        trace: Some(trace),
        client: client.map(|c| c.0).unwrap_or_default(),
    };
    let response = span.in_scope(|| gantry_answer(&state, query, issuing));
    let status = response.status();
    runyard_telemetry::traces::record_http(&span, status.as_u16(), || status.to_string());
    response
}

fn gantry_answer(
    state: &State,
    query: Result<Query<SpecQuery>, axum::extract::rejection::QueryRejection>,
    issuing: crate::Issuing,
) -> Response {
    let query = match query {
        Ok(Query(q)) => q,
        Err(e) => return bad_request(&format!("query: {e}")),
    };
    let spec = match &query.spec {
        Some(spec) if !spec.trim().is_empty() => spec.clone(),
        _ => return bad_request("spec: missing query parameter"),
    };
    let retry_of = match query.retry_of() {
        Ok(r) => r,
        Err(e) => return bad_request(&e),
    };
    if state.require_ready().is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            axum::Json(json!({"error": "history still loading"})),
        )
            .into_response();
    }
    // Parse errors name the spec already; validation errors name the workload.
    let workload = match model::parse_spec(&spec) {
        Ok(w) => w,
        Err(e) => return bad_request(&e.to_string()),
    };
    if let Err(e) = model::validate(&workload) {
        return bad_request(&format!("spec: {e}"));
    }
    let (rec, key) = state.recommend(&workload, retry_of);
    let variables: std::collections::BTreeMap<String, String> = model::variables(&rec);
    // gantry's clients read `variables`; the model's confidence rides along.
    let body = axum::Json(json!({
        "variables": variables,
        "oom_probability": rec.basis.oom_probability,
        "workload_samples": rec.basis.workload_samples,
    }));
    state.issued(
        crate::Api::Http,
        (workload, key),
        String::new(),
        rec,
        issuing,
    );
    body.into_response()
}

async fn readyz(AxumState(state): AxumState<State>) -> Response {
    let loaded = state.loaded.load(Ordering::SeqCst);
    let following = state.following.load(Ordering::SeqCst);
    let nats = state.bus.is_connected();
    let status = if loaded && following && nats {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(
            json!({"history_loaded": loaded, "following_usage": following, "nats_connected": nats}),
        ),
    )
        .into_response()
}

async fn metrics(AxumState(state): AxumState<State>) -> Response {
    let (workloads, samples) = state.model_read().stats();
    state
        .metrics
        .workloads
        .set(i64::try_from(workloads).unwrap_or(i64::MAX));
    state
        .metrics
        .samples
        .set(i64::try_from(samples).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            runyard_telemetry::METRICS_CONTENT_TYPE,
        )],
        state.registry.encode(),
    )
        .into_response()
}
