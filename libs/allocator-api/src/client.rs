//! A client of the allocator for other services (the scaler sizes runners
//! with it, the console shows a workload's current recommendation): one
//! lazily connected channel, the bearer token on every call, every call
//! bounded by a timeout.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use tonic::transport::{Channel, Endpoint};

use crate::allocator_client::AllocatorClient;
use crate::{RecommendRequest, Recommendation};

/// A lazily connected allocator client.
#[derive(Debug, Clone)]
pub struct Client {
    inner: AllocatorClient<Channel>,
    token: Option<SecretString>,
    timeout: Duration,
}

impl Client {
    /// A client of `endpoint` (TLS already set on it for an `https://`
    /// URL) sending `token`, each call bounded by `timeout`. Nothing is
    /// connected until the first call.
    pub fn new(endpoint: Endpoint, token: Option<SecretString>, timeout: Duration) -> Self {
        Self {
            inner: AllocatorClient::new(endpoint.timeout(timeout).connect_lazy()),
            token,
            timeout,
        }
    }

    /// One `Recommend` call, as a hop of the trace `traceparent` when one
    /// is given. A call that outlives the timeout is `DEADLINE_EXCEEDED`.
    pub async fn recommend(
        &self,
        request: RecommendRequest,
        traceparent: Option<&str>,
    ) -> Result<Recommendation, tonic::Status> {
        let mut req = tonic::Request::new(request);
        req.set_timeout(self.timeout);
        if let Some(v) = traceparent.and_then(|t| t.parse().ok()) {
            req.metadata_mut().insert("traceparent", v);
        }
        if let Some(token) = &self.token
            && let Ok(v) = format!("Bearer {}", token.expose_secret()).parse()
        {
            req.metadata_mut().insert("authorization", v);
        }
        let mut client = self.inner.clone();
        match tokio::time::timeout(self.timeout, client.recommend(req)).await {
            Ok(answer) => answer.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded("allocator timed out")),
        }
    }
}
