//! The gRPC edge: `runyard.allocator.v1.Allocator`, mapping requests to the
//! model and errors to `INVALID_ARGUMENT`.

use tonic::{Request, Response, Status};

use crate::model::{self, Recommendation as ModelRec, Workload};
use crate::proto;
use crate::{Api, State};

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
        }),
        variables: model::variables(r),
    }
}

/// The request's workload and ref, or `INVALID_ARGUMENT` naming the field
/// (`prefix` locates the request in a batch).
fn workload_of(
    req: proto::RecommendRequest,
    prefix: impl FnOnce() -> String,
) -> Result<(Workload, String), Status> {
    let workload: Workload = req.workload;
    model::validate(&workload).map_err(|e| Status::invalid_argument(format!("{}{e}", prefix())))?;
    Ok((workload, req.r#ref))
}

#[tonic::async_trait]
impl proto::allocator_server::Allocator for Service {
    #[tracing::instrument(skip_all)]
    async fn recommend(
        &self,
        request: Request<proto::RecommendRequest>,
    ) -> Result<Response<proto::Recommendation>, Status> {
        self.state.require_ready()?;
        let (workload, r) = workload_of(request.into_inner(), String::new)?;
        let (mut rec, key) = self.state.recommend(&workload);
        let response = to_proto(&mut rec);
        self.state.issued(Api::Grpc, (workload, key), r, rec);
        Ok(Response::new(response))
    }

    #[tracing::instrument(skip_all, fields(requests))]
    async fn recommend_batch(
        &self,
        request: Request<proto::RecommendBatchRequest>,
    ) -> Result<Response<proto::RecommendBatchResponse>, Status> {
        self.state.require_ready()?;
        let req = request.into_inner();
        tracing::Span::current().record("requests", req.requests.len());
        let max = self.state.config.allocator_max_batch;
        if req.requests.len() > max {
            return Err(Status::invalid_argument(format!(
                "requests: {} requests, at most {max} per batch",
                req.requests.len()
            )));
        }
        let (workloads, refs): (Vec<_>, Vec<_>) = req
            .requests
            .into_iter()
            .enumerate()
            .map(|(i, r)| workload_of(r, || format!("requests[{i}].")))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let mut recs = self.state.recommend_many(&workloads);
        let recommendations = recs.iter_mut().map(|(rec, _)| to_proto(rec)).collect();
        for ((w, r), (rec, key)) in workloads.into_iter().zip(refs).zip(recs) {
            self.state.issued(Api::Batch, (w, key), r, rec);
        }
        Ok(Response::new(proto::RecommendBatchResponse {
            recommendations,
        }))
    }
}
