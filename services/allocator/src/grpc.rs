//! The gRPC edge: `runyard.allocator.v1.Allocator`, mapping requests to the
//! model and errors to `INVALID_ARGUMENT`; calls without an accepted bearer
//! token are refused `UNAUTHENTICATED` before they are decoded.

use runyard_bus::SpanStatus;
use runyard_telemetry::traces::OpenTelemetrySpanExt as _;
use tonic::{Request, Response, Status};

use crate::auth::Client;
use crate::model::{self, Recommendation as ModelRec, Workload};
use crate::proto;
use crate::{Api, Door, Issuing, State};

/// Checks every `Allocator` call's `authorization: Bearer <token>`
/// metadata against the configured tokens (none → anyone is let in).
/// Health and reflection are other services: they are not checked.
#[derive(Debug, Clone)]
pub(crate) struct Authenticate {
    pub(crate) state: State,
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let tokens = &self.state.config.allocator_tokens;
        if tokens.is_empty() {
            // The listener (runyard_tls) installs its `Peer`, which
            // tonic's `remote_addr()` does not read.
            let ip = request
                .extensions()
                .get::<Option<runyard_tls::Peer>>()
                .copied()
                .flatten()
                .map(|p| runyard_tls::peer_key(p.addr.ip()));
            let client = Client::anonymous(ip);
            request.extensions_mut().insert(client);
            return Ok(request);
        }
        let header = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        match crate::auth::authenticate(tokens, header) {
            Ok(client) => {
                request.extensions_mut().insert(client);
                Ok(request)
            }
            Err(refusal) => {
                self.state.metrics.refused(Door::Grpc, refusal);
                tracing::debug!(reason = refusal.reason(), "gRPC call refused");
                Err(Status::unauthenticated(refusal.message()))
            }
        }
    }
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct Service {
    pub(crate) state: State,
}

/// Converts a model recommendation to its wire form, moving the matched
/// attributes out of `r` (its `AllocationIssued` event does not carry them).
pub fn to_proto(r: &mut ModelRec) -> proto::Recommendation {
    proto::Recommendation {
        cpu_request_millicores: r.cpu_request_millicores,
        cpu_limit_millicores: r.cpu_limit_millicores,
        memory_request_bytes: r.memory_request_bytes,
        memory_limit_bytes: r.memory_limit_bytes,
        build_jobs: r.build_jobs,
        retry_count: r.retry_count,
        basis: Some(proto::Basis {
            samples: r.basis.samples,
            matched: std::mem::take(&mut r.basis.matched),
            level: r.basis.level,
            statistic: r.basis.statistic.clone(),
            oom_bump: r.basis.oom_bump,
            retries_exhausted: r.basis.retries_exhausted,
            defaults: r.basis.defaults,
            oom_probability: r.basis.oom_probability.unwrap_or(-1.0),
            workload_samples: r.basis.workload_samples,
            spread: r.basis.spread.unwrap_or(-1.0),
            site_prior: r.basis.site_prior,
        }),
        variables: model::variables(r),
    }
}

/// What one request asks: the workload, the ref, the attempt it retries.
type Asked = (Workload, String, Option<model::JobAttempt>);

/// The request's workload, ref (at most
/// [`runyard_events::limits::MAX_TEXT_BYTES`], no NUL) and the attempt it
/// retries, or `INVALID_ARGUMENT` naming the field (`prefix` locates the
/// request in a batch).
fn workload_of(
    req: proto::RecommendRequest,
    prefix: impl FnOnce() -> String,
) -> Result<Asked, Status> {
    let workload: Workload = req.workload;
    // The ref rides on the AllocationIssued event: an oversized one would
    // make an event no consumer keeps, so it is refused here, by name.
    let retry_of = model::validate(&workload)
        .and_then(|()| runyard_events::limits::text("ref", &req.r#ref))
        .and_then(|()| req.retry_of.as_ref().map(retry_of).transpose())
        .map_err(|e| Status::invalid_argument(format!("{}{e}", prefix())))?;
    Ok((workload, req.r#ref, retry_of))
}

/// The attempt a request retries, or what is wrong with it.
fn retry_of(a: &proto::JobAttempt) -> Result<model::JobAttempt, runyard_events::FieldError> {
    model::JobAttempt::checked(
        "retry_of",
        &a.forge,
        &a.instance,
        a.job_id,
        a.pipeline_id,
        a.attempt,
    )
}

/// Answers a call as one hop of its caller's trace (`traceparent`
/// metadata), a server span exported as `span_name`: `answer` gets the
/// hop's context for the events it queues, and the span ends with the
/// answer.
fn traced<Q, A>(
    request: Request<Q>,
    span_name: &'static str,
    answer: impl FnOnce(Q, Issuing) -> Result<A, Status>,
) -> Result<Response<A>, Status> {
    let client = request
        .extensions()
        .get::<Client>()
        .copied()
        .unwrap_or_default();
    let span = if runyard_telemetry::spans_wanted!() {
        tracing::info_span!(
            "call",
            otel.name = span_name,
            otel.kind = "server",
            requests = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    };
    let incoming = request
        .metadata()
        .get("traceparent")
        .and_then(|v| v.to_str().ok());
    let trace = runyard_bus::follow(&span, incoming);
    let issuing = Issuing {
        trace: Some(trace),
        client,
    };
    let result = span.in_scope(|| answer(request.into_inner(), issuing));
    match &result {
        Ok(_) => span.set_status(SpanStatus::Ok),
        Err(status) => {
            span.set_attribute("rpc.grpc.status_code", status.code() as i64);
            span.set_status(SpanStatus::error(status.message().to_owned()));
        }
    }
    result.map(Response::new)
}

impl Service {
    fn answer(
        &self,
        req: proto::RecommendRequest,
        issuing: Issuing,
    ) -> Result<proto::Recommendation, Status> {
        self.state.require_ready()?;
        let preview = req.preview;
        let (workload, r, retry) = workload_of(req, String::new)?;
        let (mut rec, key) = self.state.recommend(&workload, retry);
        let response = to_proto(&mut rec);
        // A preview is a look: nothing is issued, nothing counted.
        if !preview {
            self.state
                .issued(Api::Grpc, (workload, key), r, rec, issuing);
        }
        Ok(response)
    }

    fn answer_batch(
        &self,
        req: proto::RecommendBatchRequest,
        issuing: Issuing,
    ) -> Result<proto::RecommendBatchResponse, Status> {
        self.state.require_ready()?;
        tracing::Span::current().record("requests", req.requests.len());
        let max = self.state.config.allocator_max_batch;
        if req.requests.len() > max {
            return Err(Status::invalid_argument(format!(
                "requests: {} requests, at most {max} per batch",
                req.requests.len()
            )));
        }
        let previews: Vec<bool> = req.requests.iter().map(|r| r.preview).collect();
        let (asked, refs): (Vec<_>, Vec<_>) = req
            .requests
            .into_iter()
            .enumerate()
            .map(|(i, r)| workload_of(r, || format!("requests[{i}].")))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|(w, r, retry)| ((w, retry), r))
            .unzip();
        let mut recs = self.state.recommend_many(&asked);
        let recommendations = recs.iter_mut().map(|(rec, _)| to_proto(rec)).collect();
        for ((((w, _), r), (rec, key)), preview) in
            asked.into_iter().zip(refs).zip(recs).zip(previews)
        {
            if !preview {
                self.state.issued(Api::Batch, (w, key), r, rec, issuing);
            }
        }
        Ok(proto::RecommendBatchResponse { recommendations })
    }
}

#[tonic::async_trait]
impl proto::allocator_server::Allocator for Service {
    async fn recommend(
        &self,
        request: Request<proto::RecommendRequest>,
    ) -> Result<Response<proto::Recommendation>, Status> {
        traced(request, "allocator Recommend", |req, issuing| {
            self.answer(req, issuing)
        })
    }

    async fn recommend_batch(
        &self,
        request: Request<proto::RecommendBatchRequest>,
    ) -> Result<Response<proto::RecommendBatchResponse>, Status> {
        traced(request, "allocator RecommendBatch", |req, issuing| {
            self.answer_batch(req, issuing)
        })
    }
}
