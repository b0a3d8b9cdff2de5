//! The HTTP edge: routes, body limits, authentication and the one mapping
//! from outcomes to status codes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use runyard_bus::{BusError, HeaderValue as NatsValue, Prepared, TraceParent, raw_message};
use runyard_events::{Event, ids};
use runyard_forge::{
    GithubDelivery, GithubSignature, GitlabDelivery, Normalized, PayloadError, normalize_github,
    normalize_gitlab, normalize_usage, verify,
};
use runyard_telemetry::traces::OpenTelemetrySpanExt as _;
use secrecy::ExposeSecret;
use serde_json::json;
use time::OffsetDateTime;
use tracing::Instrument as _;

use crate::limits::{self, Shape};
use crate::{AppState, oidc, shed};

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: u64 = 5;

pub(crate) fn router(state: AppState) -> Router {
    let deliveries = Router::new()
        .route("/webhooks/github", post(github))
        .route("/webhooks/gitlab", post(gitlab))
        .route("/v1/usage", post(usage))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            nats_down,
        ));
    Router::new()
        .merge(deliveries)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        // A slow client must not hold a connection forever; well under the
        // forges' own 10 s delivery timeout for anything but huge bodies.
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(30),
        ))
        .with_state(state)
}

/// The door before the door: a delivery that arrives while NATS is known
/// to be down is answered 503 with `Retry-After` at once, before its body is
/// read. Room in the in-flight budget is taken later, by each handler, once
/// what the headers can prove is checked ([`admit`]).
async fn nats_down(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !state.bus.is_connected() {
        let forge = match request.uri().path() {
            "/webhooks/github" => "github",
            "/webhooks/gitlab" => "gitlab",
            _ => "usage",
        };
        state.metrics.delivery(forge, "unavailable");
        if let Some(suppressed) = state.quiet.admit("unavailable") {
            tracing::warn!(forge, suppressed, "delivery refused: nats is down");
        }
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "event log unavailable, retry later",
            None,
        );
        retry_after(&mut r);
        return r;
    }
    next.run(request).await
}

/// Room for one delivery from `peer` in the in-flight budget
/// ([`crate::shed`]); `unverified` when its credential can only be checked
/// once the whole body is in (a GitHub signature).
fn admit(
    state: &AppState,
    forge: &'static str,
    peer: std::net::IpAddr,
    unverified: bool,
) -> Result<shed::Admitted, Outcome> {
    state.load.try_admit(peer, unverified).ok_or_else(|| {
        if let Some(suppressed) = state.quiet.admit("overloaded") {
            let (requests, held) = state.load.in_flight();
            tracing::warn!(
                forge,
                requests,
                bytes = held,
                suppressed,
                "delivery shed: ingest at capacity"
            );
        }
        Outcome::Overloaded
    })
}

/// Every answer ingest gives, mapped to a status in one place.
#[derive(Debug)]
enum Outcome {
    Accepted {
        event_id: String,
        duplicate: bool,
        events: usize,
    },
    Ignored(String),
    NotConfigured(&'static str),
    Unauthorized(String),
    /// Authenticated, but not allowed to say this (a report about another
    /// job than its identity token's).
    Forbidden {
        field: String,
        message: String,
    },
    TooLarge(TooLarge),
    UnsupportedMediaType(String),
    Invalid {
        field: Option<String>,
        message: String,
    },
    /// Over a rate (`RUNYARD_USAGE_OIDC_RATE`): 429, retry after the
    /// seconds given.
    TooManyRequests {
        message: String,
        retry_after: u64,
    },
    Unavailable(String),
    /// The in-flight budget is spent ([`crate::shed`]): 503, retry later.
    Overloaded,
    /// The body did not arrive in time, or (unverified) gave way to newer
    /// deliveries: 408.
    TooSlow(String),
}

impl Outcome {
    fn result_label(&self, duplicate_label: bool) -> &'static str {
        match self {
            Outcome::Accepted { .. } if duplicate_label => "duplicate",
            Outcome::Accepted { .. } => "accepted",
            Outcome::Ignored(_) => "ignored",
            Outcome::NotConfigured(_) => "not_configured",
            Outcome::Unauthorized(_) => "unauthorized",
            Outcome::Forbidden { .. } => "forbidden",
            Outcome::TooLarge(_) => "too_large",
            Outcome::UnsupportedMediaType(_) => "unsupported_media_type",
            Outcome::Invalid { .. } => "invalid",
            Outcome::TooManyRequests { .. } => "rate_limited",
            Outcome::Unavailable(_) => "unavailable",
            Outcome::Overloaded => "overloaded",
            Outcome::TooSlow(_) => "too_slow",
        }
    }
}

impl IntoResponse for Outcome {
    fn into_response(self) -> Response {
        match self {
            Outcome::Accepted {
                event_id,
                duplicate,
                events,
            } => {
                let mut body = json!({"event_id": event_id, "duplicate": duplicate});
                if events > 1 {
                    body["events"] = json!(events);
                }
                (StatusCode::ACCEPTED, axum::Json(body)).into_response()
            }
            Outcome::Ignored(reason) => {
                (StatusCode::OK, axum::Json(json!({"ignored": reason}))).into_response()
            }
            Outcome::NotConfigured(what) => {
                let mut r = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{what} not configured"),
                    None,
                );
                retry_after(&mut r);
                r
            }
            Outcome::Unauthorized(msg) => error(StatusCode::UNAUTHORIZED, msg, None),
            Outcome::Forbidden { field, message } => {
                error(StatusCode::FORBIDDEN, message, Some(field))
            }
            Outcome::TooLarge(TooLarge::Body { limit }) => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body exceeds RUNYARD_INGEST_MAX_BODY, the limit of {limit} bytes"),
                Some("body".into()),
            ),
            Outcome::TooLarge(TooLarge::Event { bytes, max_payload }) => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the event made of this delivery is {bytes} bytes, over the event log's \
                     message limit (NATS max_payload) of {max_payload} bytes"
                ),
                None,
            ),
            Outcome::UnsupportedMediaType(ct) => error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("unsupported content type {ct:?}"),
                Some("Content-Type".into()),
            ),
            Outcome::Invalid { field, message } => error(StatusCode::BAD_REQUEST, message, field),
            Outcome::TooManyRequests {
                message,
                retry_after,
            } => {
                let mut r = error(StatusCode::TOO_MANY_REQUESTS, message, None);
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
                r
            }
            Outcome::Unavailable(msg) => {
                let mut r = error(StatusCode::SERVICE_UNAVAILABLE, msg, None);
                retry_after(&mut r);
                r
            }
            Outcome::Overloaded => {
                let mut r = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ingest is at capacity, retry later",
                    None,
                );
                retry_after(&mut r);
                r
            }
            Outcome::TooSlow(msg) => {
                let mut r = error(StatusCode::REQUEST_TIMEOUT, msg, Some("body".into()));
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                r
            }
        }
    }
}

/// What a 413 is about: the body itself, or the event made of it (which
/// must fit in one NATS message).
#[derive(Debug)]
enum TooLarge {
    /// The body is over `RUNYARD_INGEST_MAX_BODY`.
    Body { limit: usize },
    /// An event is over the server's `max_payload`.
    Event { bytes: usize, max_payload: usize },
}

fn error(status: StatusCode, message: impl Into<String>, field: Option<String>) -> Response {
    let message: String = message.into();
    let body = match field {
        Some(field) => json!({"error": message, "field": field}),
        None => json!({"error": message}),
    };
    (status, axum::Json(body)).into_response()
}

fn retry_after(r: &mut Response) {
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Answers a delivery as one hop of its trace (a server span exported as
/// `span_name`), continuing the sender's `traceparent` if it sent one:
/// `outcome` gets the context every message of the delivery carries, and
/// the span ends with the answer.
async fn traced<F, Fut>(
    state: &AppState,
    headers: &HeaderMap,
    forge: &'static str,
    span_name: &'static str,
    delivery: Option<&str>,
    outcome: F,
) -> Response
where
    F: FnOnce(TraceParent) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let span = if runyard_telemetry::spans_wanted!() {
        tracing::info_span!(
            "delivery",
            otel.name = span_name,
            otel.kind = "server",
            runyard.forge = forge,
            runyard.delivery = delivery.unwrap_or(""),
        )
    } else {
        tracing::Span::none()
    };
    let trace = runyard_bus::follow(&span, header_str(headers, "traceparent"));
    let answered = span.clone();
    async move { finish(state, forge, outcome(trace).await, &answered) }
        .instrument(span)
        .await
}

/// The door checks ([`limits::check`]) as an answer: 400 naming the field.
fn door(shape: Shape, delivery_header: &str, events: &[Event]) -> Result<(), Outcome> {
    limits::check(shape, delivery_header, events).map_err(|r| Outcome::Invalid {
        message: format!("{}: {}", r.field, r.reason),
        field: Some(r.field),
    })
}

/// A GitHub delivery must come from a configured instance
/// (`RUNYARD_GITHUB_INSTANCES`): the `X-GitHub-Enterprise-Host` header that
/// names it is not covered by the signature.
fn github_instance(
    state: &AppState,
    delivery: &GithubDelivery<'_>,
    events: &[Event],
) -> Result<(), Outcome> {
    for event in events {
        let instance = event.source.as_ref().map_or("", |s| s.instance.as_str());
        if !state.github_instances.iter().any(|i| i == instance) {
            let field = if delivery
                .enterprise_host
                .is_some_and(|h| !h.trim().is_empty())
            {
                "X-GitHub-Enterprise-Host"
            } else {
                "repository.html_url"
            };
            return Err(Outcome::Invalid {
                message: format!("{field}: not a GitHub instance this ingest accepts"),
                field: Some(field.into()),
            });
        }
    }
    Ok(())
}

fn payload_outcome(e: PayloadError) -> Outcome {
    match e {
        PayloadError::UnsupportedMediaType(ct) => Outcome::UnsupportedMediaType(ct),
        other => Outcome::Invalid {
            field: other.field().map(str::to_owned),
            message: other.to_string(),
        },
    }
}

/// Reads the whole body as the frames it arrives in, each held from
/// `admitted`'s budget as it comes (a body that trickles in holds what it
/// sent, whatever it declared), refusing it past `state`'s body limit (a
/// declared length over it without reading anything), past its body
/// deadline, or when it is cut to make room (unverified bodies). `seen` is
/// shown every chunk as it arrives (GitHub's signature is hashed in the
/// same pass); [`Frames::join`] makes one buffer of them once the body is
/// known to be wanted, so a body refused by its signature is never copied.
async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    admitted: &shed::Admitted,
    mut seen: impl FnMut(&[u8]),
) -> Result<Frames, Outcome> {
    let limit = state.max_body;
    let declared =
        header_str(headers, header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Outcome::TooLarge(TooLarge::Body { limit }));
    }
    let timeout = state.body_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let cut = admitted.cut();
    tokio::pin!(cut);
    let mut frames = Frames::default();
    let mut body = http_body_util::Limited::new(body, limit);
    loop {
        let frame = tokio::select! {
            biased;
            () = &mut cut => return Err(held_refusal(shed::Refused::Cut)),
            () = tokio::time::sleep_until(deadline) => return Err(Outcome::TooSlow(format!(
                "body: not received within {timeout:?} (RUNYARD_INGEST_BODY_TIMEOUT)"
            ))),
            frame = body.frame() => frame,
        };
        let Some(frame) = frame else {
            return Ok(frames);
        };
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    admitted
                        .hold(frames.len + data.len())
                        .map_err(held_refusal)?;
                    seen(&data);
                    frames.len += data.len();
                    frames.parts.push(data);
                }
            }
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(Outcome::TooLarge(TooLarge::Body { limit }));
            }
            Err(_) => {
                return Err(Outcome::Invalid {
                    field: Some("body".into()),
                    message: "body: could not be read".into(),
                });
            }
        }
    }
}

/// A body as the frames it arrived in.
#[derive(Debug, Default)]
struct Frames {
    parts: Vec<Bytes>,
    len: usize,
}

impl Frames {
    /// The body in one buffer: the one frame as it is, else a copy, held
    /// from the budget next to the frames while it is made.
    fn join(mut self, admitted: &shed::Admitted) -> Result<Bytes, Outcome> {
        if self.parts.len() <= 1 {
            return Ok(self.parts.pop().unwrap_or_default());
        }
        admitted.hold(self.len * 2).map_err(held_refusal)?;
        let mut buf = bytes::BytesMut::with_capacity(self.len);
        for part in self.parts {
            buf.extend_from_slice(&part);
        }
        admitted.hold(buf.len()).map_err(held_refusal)?;
        Ok(buf.freeze())
    }
}

/// Admits a delivery whose credential its headers proved, and reads its
/// body: the budget share is held until the answer.
async fn read_authenticated(
    state: &AppState,
    forge: &'static str,
    peer: std::net::IpAddr,
    headers: &HeaderMap,
    body: Body,
) -> Result<(shed::Admitted, Bytes), Outcome> {
    let admitted = admit(state, forge, peer, false)?;
    let body = read_body(state, headers, body, &admitted, |_| ())
        .await?
        .join(&admitted)?;
    Ok((admitted, body))
}

fn held_refusal(refused: shed::Refused) -> Outcome {
    match refused {
        shed::Refused::Full => Outcome::Overloaded,
        shed::Refused::Cut => {
            Outcome::TooSlow("body: sent too slowly; its place went to another delivery".into())
        }
    }
}

/// Publishes the raw delivery and every event concurrently and waits for
/// all acks: 202 only when everything is durable.
async fn publish(
    state: &AppState,
    raw: Prepared,
    events: Vec<Event>,
    traceparent: &NatsValue,
) -> Outcome {
    let Some(primary) = events.first().map(|e| e.id.clone()) else {
        return Outcome::Ignored("nothing to record".into());
    };
    if !state.bus.is_connected() {
        return Outcome::Unavailable("event log unavailable, retry later".into());
    }
    let mut messages = Vec::with_capacity(events.len());
    for e in &events {
        match state.bus.prepare_event(e, traceparent) {
            Ok(m) => messages.push(m),
            Err(error) => {
                tracing::error!(%error, event_id = %e.id, "normalized event cannot be routed");
                return Outcome::Invalid {
                    field: None,
                    message: "delivery could not be turned into an event".into(),
                };
            }
        }
    }
    let started = Instant::now();
    // A raw body over the server's max_payload cannot be kept: the events
    // still are (they are small), and the skip is counted.
    let raw_fits = raw.payload.len() + 4096 <= state.bus.max_payload();
    let raw_publish = async {
        if raw_fits {
            state.bus.publish_prepared(raw).await.map(Some)
        } else {
            state.metrics.raw_skipped.inc();
            if let Some(suppressed) = state.quiet.admit("raw_skipped") {
                tracing::warn!(
                    bytes = raw.payload.len(),
                    suppressed,
                    "raw delivery over max_payload not kept"
                );
            }
            Ok(None)
        }
    };
    let event_publishes =
        futures::future::join_all(messages.into_iter().map(|m| state.bus.publish_prepared(m)));
    let (raw_result, event_results) = tokio::join!(raw_publish, event_publishes);
    state
        .metrics
        .publish_latency
        .observe(started.elapsed().as_secs_f64());

    let mut duplicate = false;
    let results = std::iter::once(raw_result.map(|_| None))
        .chain(event_results.into_iter().map(|r| r.map(Some)));
    for (i, r) in results.enumerate() {
        match r {
            Ok(Some(stored)) if i == 1 => duplicate = stored.duplicate,
            Ok(_) => {}
            Err(BusError::TooLarge(n)) => {
                if let Some(suppressed) = state.quiet.admit("event_too_large") {
                    tracing::warn!(bytes = n, suppressed, "event over max_payload");
                }
                return Outcome::TooLarge(TooLarge::Event {
                    bytes: n,
                    max_payload: state.bus.max_payload(),
                });
            }
            Err(error) => {
                // The event log at its size bound refuses new messages
                // rather than dropping stored ones.
                let full = matches!(error, BusError::StreamFull);
                if matches!(error, BusError::Nats { .. }) {
                    // Possibly a missing stream: let the keeper check again.
                    state.streams_ready.store(false, Ordering::SeqCst);
                }
                if let Some(suppressed) = state.quiet.admit("not_durable") {
                    tracing::warn!(%error, event_id = %primary, suppressed, "delivery not made durable");
                }
                return Outcome::Unavailable(if full {
                    "event log full (RUNYARD_EVENTS_MAX_BYTES reached), retry later".into()
                } else {
                    "event log unavailable, retry later".into()
                });
            }
        }
    }
    Outcome::Accepted {
        event_id: primary,
        duplicate,
        events: events.len(),
    }
}

fn finish(
    state: &AppState,
    forge: &'static str,
    outcome: Outcome,
    span: &tracing::Span,
) -> Response {
    let duplicate = matches!(
        outcome,
        Outcome::Accepted {
            duplicate: true,
            ..
        }
    );
    let result = outcome.result_label(duplicate);
    state.metrics.delivery(forge, result);
    match &outcome {
        Outcome::Accepted {
            event_id,
            duplicate,
            ..
        } => {
            // The normal case, many times a second: not worth a line at
            // `info` (the deliveries metric counts it).
            tracing::debug!(forge, %event_id, duplicate, "delivery accepted");
        }
        Outcome::Unavailable(_)
        | Outcome::NotConfigured(_)
        | Outcome::Unauthorized(_)
        | Outcome::Forbidden { .. }
        | Outcome::TooManyRequests { .. } => {
            // One line per kind and window, not per delivery: an outage or a
            // misconfigured sender refuses thousands a second.
            if let Some(suppressed) = state.quiet.admit(result) {
                tracing::warn!(forge, result, suppressed, "delivery refused");
            }
        }
        _ => tracing::debug!(forge, result, "delivery answered"),
    }
    if let Outcome::Accepted { event_id, .. } = &outcome {
        span.set_attribute("runyard.event_id", event_id.clone());
    }
    span.set_attribute("runyard.result", result);
    let response = outcome.into_response();
    runyard_telemetry::traces::record_http(span, response.status().as_u16(), || result.to_owned());
    response
}

async fn github(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<runyard_tls::Peer>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    traced(
        &state,
        &headers,
        "github",
        "ingest GitHub webhook",
        header_str(&headers, "x-github-delivery"),
        |trace| github_outcome(&state, peer.addr.ip(), &headers, body, trace),
    )
    .await
}

async fn github_outcome(
    state: &AppState,
    peer: std::net::IpAddr,
    headers: &HeaderMap,
    body: Body,
    trace: TraceParent,
) -> Outcome {
    let Some(secret) = state.github_secret.as_ref() else {
        return Outcome::NotConfigured("github webhook");
    };
    // The signature header is judged before the body is read, and the body
    // hashed as it arrives: an unsigned delivery costs no body bytes.
    let refused = |e: verify::AuthError| Outcome::Unauthorized(format!("X-Hub-Signature-256: {e}"));
    let mut signature = match GithubSignature::expect(
        secret.expose_secret().as_bytes(),
        header_str(headers, "x-hub-signature-256"),
    ) {
        Ok(s) => s,
        Err(e) => return refused(e),
    };
    // Room in the budget only now, and as an unverified body that gives
    // way to newer deliveries until its last byte proves the signature.
    let admitted = match admit(state, "github", peer, true) {
        Ok(a) => a,
        Err(o) => return o,
    };
    let frames = match read_body(state, headers, body, &admitted, |chunk| {
        signature.update(chunk)
    })
    .await
    {
        Ok(f) => f,
        Err(o) => return o,
    };
    if let Err(e) = signature.verify() {
        return refused(e);
    }
    admitted.verified();
    let body = match frames.join(&admitted) {
        Ok(b) => b,
        Err(o) => return o,
    };
    let delivery = GithubDelivery {
        event: header_str(headers, "x-github-event"),
        delivery_id: header_str(headers, "x-github-delivery"),
        hook_id: header_str(headers, "x-github-hook-id"),
        enterprise_host: header_str(headers, "x-github-enterprise-host"),
        content_type: header_str(headers, header::CONTENT_TYPE.as_str()),
        body: &body,
        received_at: OffsetDateTime::now_utc(),
    };
    match normalize_github(&delivery) {
        Err(e) => payload_outcome(e),
        Ok(Normalized::Ignored(reason)) => Outcome::Ignored(reason),
        Ok(Normalized::Events(events)) => {
            if let Err(o) = door(Shape::Github, "X-GitHub-Delivery", &events)
                .and_then(|()| github_instance(state, &delivery, &events))
            {
                return o;
            }
            let tp = trace.header_value();
            let key = delivery.delivery_id.map(ids::github).unwrap_or_default();
            let raw = raw_message(
                state.bus.namespace(),
                "github",
                &key,
                headers,
                body.clone(),
                &tp,
            );
            publish(state, raw, events, &tp).await
        }
    }
}

async fn gitlab(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<runyard_tls::Peer>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    traced(
        &state,
        &headers,
        "gitlab",
        "ingest GitLab webhook",
        header_str(&headers, "idempotency-key").or(header_str(&headers, "x-gitlab-event-uuid")),
        |trace| gitlab_outcome(&state, peer.addr.ip(), &headers, body, trace),
    )
    .await
}

async fn gitlab_outcome(
    state: &AppState,
    peer: std::net::IpAddr,
    headers: &HeaderMap,
    body: Body,
    trace: TraceParent,
) -> Outcome {
    let Some(token) = state.gitlab_token.as_ref() else {
        return Outcome::NotConfigured("gitlab webhook");
    };
    // The token is a header: check it before reading the body at all.
    if !verify::token_matches(
        token.expose_secret().as_bytes(),
        headers.get("x-gitlab-token").map(HeaderValue::as_bytes),
    ) {
        return Outcome::Unauthorized("X-Gitlab-Token: missing or wrong".into());
    }
    let (_admitted, body) = match read_authenticated(state, "gitlab", peer, headers, body).await {
        Ok(read) => read,
        Err(o) => return o,
    };
    let delivery = GitlabDelivery {
        event: header_str(headers, "x-gitlab-event"),
        idempotency_key: header_str(headers, "idempotency-key"),
        event_uuid: header_str(headers, "x-gitlab-event-uuid"),
        webhook_uuid: header_str(headers, "x-gitlab-webhook-uuid"),
        instance: header_str(headers, "x-gitlab-instance"),
        content_type: header_str(headers, header::CONTENT_TYPE.as_str()),
        body: &body,
        received_at: OffsetDateTime::now_utc(),
    };
    match normalize_gitlab(&delivery) {
        Err(e) => payload_outcome(e),
        Ok(Normalized::Ignored(reason)) => Outcome::Ignored(reason),
        Ok(Normalized::Events(events)) => {
            let shape = match delivery.event {
                Some("Pipeline Hook") => Shape::GitlabPipeline,
                _ => Shape::GitlabJob,
            };
            let from_key = delivery
                .idempotency_key
                .is_some_and(|k| !k.trim().is_empty());
            let header = if from_key {
                "Idempotency-Key"
            } else {
                "X-Gitlab-Event-UUID"
            };
            if let Err(o) = door(shape, header, &events) {
                return o;
            }
            let tp = trace.header_value();
            let key = delivery
                .idempotency_key
                .filter(|k| !k.trim().is_empty())
                .or(delivery.event_uuid)
                .map(str::trim)
                .map(|k| format!("gitlab:{k}"))
                .unwrap_or_default();
            let raw = raw_message(
                state.bus.namespace(),
                "gitlab",
                &key,
                headers,
                body.clone(),
                &tp,
            );
            publish(state, raw, events, &tp).await
        }
    }
}

async fn usage(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<runyard_tls::Peer>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    traced(
        &state,
        &headers,
        "usage",
        "ingest usage report",
        header_str(&headers, "idempotency-key"),
        |trace| usage_outcome(&state, peer.addr.ip(), &headers, body, trace),
    )
    .await
}

async fn usage_outcome(
    state: &AppState,
    peer: std::net::IpAddr,
    headers: &HeaderMap,
    body: Body,
    trace: TraceParent,
) -> Outcome {
    // The credential is a header: judge it before reading the body at all.
    let sender = match usage_auth(state, headers).await {
        Ok(sender) => sender,
        Err(o) => return o,
    };
    if let Sender::Oidc(identity) = &sender
        && let Err(o) = admit_project(state, identity)
    {
        return o;
    }
    let (_admitted, body) = match read_authenticated(state, "usage", peer, headers, body).await {
        Ok(read) => read,
        Err(o) => return o,
    };
    let content_type = header_str(headers, header::CONTENT_TYPE.as_str());
    match normalize_usage(content_type, &body, OffsetDateTime::now_utc()) {
        Err(e) => payload_outcome(e),
        Ok(mut event) => {
            if let Err(o) = door(Shape::Usage, "", std::slice::from_ref(&event)) {
                return o;
            }
            if let Err(o) = identify(state, &sender, &mut event) {
                return o;
            }
            let tp = trace.header_value();
            let raw = raw_message(
                state.bus.namespace(),
                "usage",
                &event.id,
                headers,
                body.clone(),
                &tp,
            );
            publish(state, raw, vec![event], &tp).await
        }
    }
}

/// Who sent a usage report.
#[derive(Debug)]
enum Sender {
    /// A verified CI identity token: the claims name the job.
    Oidc(Box<oidc::Identity>),
    /// The shared usage token: the report names its job itself.
    SharedToken,
}

/// Authenticates a usage report (ARCHITECTURE.md, "Usage API"): a
/// JWT-shaped bearer is tried as a CI identity token when
/// `RUNYARD_USAGE_OIDC` is set; the shared `RUNYARD_USAGE_TOKEN`, when set,
/// is accepted too. A refusal names why, never the credential.
async fn usage_auth(state: &AppState, headers: &HeaderMap) -> Result<Sender, Outcome> {
    let shared = state.usage_token.as_ref();
    if shared.is_none() && state.oidc.is_none() {
        return Err(Outcome::NotConfigured("usage reports"));
    }
    let metrics = &state.metrics;
    let Some(given) = verify::bearer(
        headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    ) else {
        metrics.usage_auth("none", "missing");
        return Err(Outcome::Unauthorized(
            "Authorization: missing bearer credential".into(),
        ));
    };
    let shared_matches =
        || shared.is_some_and(|t| verify::token_matches(t.expose_secret().as_bytes(), Some(given)));
    if let Some(verifier) = state.oidc.as_ref()
        && oidc::looks_like_jwt(given)
    {
        // A JWT is ASCII by its shape.
        let token = std::str::from_utf8(given).unwrap_or_default();
        match verifier.verify(token).await {
            Ok(identity) => return Ok(Sender::Oidc(Box::new(identity))),
            Err(oidc::VerifyError::Unavailable(why)) => {
                metrics.usage_auth("oidc", "unavailable");
                return Err(Outcome::Unavailable(why));
            }
            // A shared token that happens to look like a JWT.
            Err(oidc::VerifyError::Refused(_)) if shared_matches() => {}
            Err(oidc::VerifyError::Refused(refusal)) => {
                metrics.usage_auth("oidc", refusal.label());
                return Err(Outcome::Unauthorized(format!("Authorization: {refusal}")));
            }
        }
    }
    if shared.is_none() {
        metrics.usage_auth("token", "wrong");
        return Err(Outcome::Unauthorized(format!(
            "Authorization: not a CI identity token of an issuer in {}; \
             the shared usage token (RUNYARD_USAGE_TOKEN) is not enabled",
            oidc::issuer::VAR
        )));
    }
    if !shared_matches() {
        metrics.usage_auth("token", "wrong");
        return Err(Outcome::Unauthorized(
            "Authorization: missing or wrong bearer token".into(),
        ));
    }
    Ok(Sender::SharedToken)
}

/// The checks on the project a verified token names, before the body is
/// read: it must be one `RUNYARD_USAGE_OIDC_PROJECTS` lists for the issuer
/// (403), and under its rate, `RUNYARD_USAGE_OIDC_RATE` (429).
fn admit_project(state: &AppState, id: &oidc::Identity) -> Result<(), Outcome> {
    let allowed = state
        .oidc
        .as_ref()
        .and_then(|v| v.issuer(&id.issuer))
        .is_some_and(|i| i.allows(&id.project));
    if !allowed {
        state.metrics.usage_auth("oidc", "project_not_allowed");
        return Err(Outcome::Forbidden {
            field: "project".into(),
            message: format!(
                "project {} (claim {}) is not one {} accepts for issuer {}",
                id.project,
                if id.forge == runyard_events::Forge::Github {
                    "repository"
                } else {
                    "project_path"
                },
                oidc::issuer::PROJECTS_VAR,
                id.issuer
            ),
        });
    }
    if let Err(wait) = state
        .usage_rate
        .admit(&id.issuer, &id.project, std::time::Instant::now())
    {
        state.metrics.usage_auth("oidc", "rate_limited");
        return Err(Outcome::TooManyRequests {
            message: format!(
                "project {} is over {}, the usage reports its jobs may send per minute; retry later",
                id.project,
                oidc::rate::VAR
            ),
            retry_after: (wait.as_secs_f64().ceil() as u64).max(1),
        });
    }
    Ok(())
}

/// Records who sent the report in its event: with an identity token the
/// report must be about the token's job (else 403 naming the field), and
/// its project and ref become the token's.
fn identify(state: &AppState, sender: &Sender, event: &mut Event) -> Result<(), Outcome> {
    let Some(runyard_events::Body::UsageReported(u)) = event.body.as_mut() else {
        return Ok(());
    };
    match sender {
        Sender::SharedToken => {
            state.metrics.usage_auth("token", "accepted");
            u.identity = Some(runyard_events::UsageIdentity {
                method: "token".into(),
                ..Default::default()
            });
            Ok(())
        }
        Sender::Oidc(identity) => match oidc::claims::bind(identity, u) {
            Ok(()) => {
                state.metrics.usage_auth("oidc", "accepted");
                Ok(())
            }
            Err(mismatch) => {
                state.metrics.usage_auth("oidc", "forbidden");
                Err(Outcome::Forbidden {
                    field: mismatch.field.to_owned(),
                    message: mismatch.to_string(),
                })
            }
        },
    }
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, axum::Json(json!({"status": "ok"})))
}

async fn readyz(State(state): State<AppState>) -> Response {
    let connected = state.bus.is_connected();
    let streams = state.streams_ready.load(Ordering::SeqCst);
    let status = if connected && streams {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"nats_connected": connected, "streams_ready": streams})),
    )
        .into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let (requests, bytes) = state.load.in_flight();
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    state.metrics.in_flight.set(gauge(requests));
    state.metrics.in_flight_bytes.set(gauge(bytes));
    (
        [(
            header::CONTENT_TYPE,
            runyard_telemetry::METRICS_CONTENT_TYPE,
        )],
        state.registry.encode(),
    )
        .into_response()
}
