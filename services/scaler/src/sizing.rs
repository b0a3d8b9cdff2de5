//! Right-sizing: the smallest flavor whose memory covers the allocator's
//! recommended limit for the job's workload.

use std::collections::BTreeMap;
use std::time::Duration;

use runyard_allocator_api::RecommendRequest;
use runyard_allocator_api::allocator_client::AllocatorClient;
use runyard_events::{Forge, JobKey, RunnerRef, RunnerRequested};
use secrecy::{ExposeSecret as _, SecretString};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::config::{Flavor, PoolConfig};
use crate::core::world::Job;

/// The workload attributes a job is known by, the same names usage reports
/// are keyed with: GitHub `{repo, workflow, job}`, GitLab `{project, job}`.
pub fn workload(job: &Job) -> BTreeMap<String, String> {
    match job.id.forge {
        Forge::Github => runyard_store::workload::github(&job.project, &job.workflow, &job.name),
        _ => [("project", &job.project), ("job", &job.name)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect(),
    }
}

/// What was chosen and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    /// Index into the pool's flavors.
    pub flavor: usize,
    /// The allocator's memory limit, when it answered.
    pub recommended_limit: Option<u64>,
    /// True when the allocator could not be asked (first flavor used).
    pub allocator_unavailable: bool,
}

/// The request event of a runner made for `job` (a free one, for `reason`,
/// without), sized by `sizing` (without: the pool's first flavor, the
/// allocator not asked). The engine and the benchmarks publish this one.
pub fn runner_requested(
    runner: RunnerRef,
    pool: &PoolConfig,
    job: Option<&Job>,
    claim_key: String,
    reason: &str,
    sizing: Option<&Sizing>,
) -> RunnerRequested {
    let flavor = &pool.flavors[sizing.map_or(0, |s| s.flavor)];
    RunnerRequested {
        runner: Some(runner),
        job: job.map(|j| JobKey {
            forge: j.id.forge as i32,
            instance: j.id.instance.clone(),
            job_id: j.id.job_id,
        }),
        run_attempt: job.map_or(0, |j| j.run_attempt),
        claim_key,
        reason: reason.into(),
        flavor: flavor.name.clone(),
        memory_bytes: flavor.memory.as_u64(),
        cpus: flavor.cpus,
        recommended_memory_limit_bytes: sizing.and_then(|s| s.recommended_limit),
        allocator_unavailable: sizing.is_some_and(|s| s.allocator_unavailable),
        workload_key: String::new(),
        labels: job.and_then(|j| j.labels.clone()).unwrap_or_default(),
        image: pool.image.clone(),
    }
}

/// The smallest flavor whose memory covers `limit` (the largest when none
/// does); the first when there is no recommendation.
pub fn pick_flavor(flavors: &[Flavor], limit: Option<u64>) -> usize {
    let Some(limit) = limit else {
        return 0;
    };
    flavors
        .iter()
        .position(|f| f.memory.as_u64() >= limit)
        .unwrap_or(flavors.len().saturating_sub(1))
}

/// A lazily connected allocator client.
#[derive(Debug, Clone)]
pub struct Allocator {
    client: Option<AllocatorClient<Channel>>,
    token: Option<SecretString>,
    timeout: Duration,
}

impl Allocator {
    /// Connects lazily to `url` (an unusable URL means "unavailable");
    /// an `https://` URL with the public roots.
    pub fn new(url: &str, token: Option<SecretString>, timeout: Duration) -> Self {
        Self::with_tls(url, token, timeout, None)
    }

    /// [`Allocator::new`] with TLS settings for an `https://` URL (a
    /// private CA, a client certificate for mTLS).
    pub fn with_tls(
        url: &str,
        token: Option<SecretString>,
        timeout: Duration,
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        let endpoint = Endpoint::from_shared(url.to_owned()).and_then(|e| match tls {
            Some(tls) => e.tls_config(tls),
            None => Ok(e),
        });
        let client = match endpoint {
            Ok(e) => Some(AllocatorClient::new(e.timeout(timeout).connect_lazy())),
            Err(error) => {
                tracing::warn!(%error, "RUNYARD_ALLOCATOR_URL cannot be used: every pool gets its first flavor");
                None
            }
        };
        Self {
            client,
            token,
            timeout,
        }
    }

    /// Sizes a job from its recommendation.
    pub async fn size(&self, job: &Job, flavors: &[Flavor]) -> Sizing {
        let limit = self.recommend(job).await;
        Sizing {
            flavor: pick_flavor(flavors, limit),
            recommended_limit: limit,
            allocator_unavailable: limit.is_none(),
        }
    }

    async fn recommend(&self, job: &Job) -> Option<u64> {
        let mut client = self.client.clone()?;
        let mut req = tonic::Request::new(RecommendRequest {
            workload: workload(job),
            r#ref: job.git_ref.clone(),
        });
        req.set_timeout(self.timeout);
        // The call is a hop of the current trace (a job's runner creation).
        if let Ok(v) = runyard_bus::current_trace().to_string().parse() {
            req.metadata_mut().insert("traceparent", v);
        }
        if let Some(token) = &self.token
            && let Ok(v) = format!("Bearer {}", token.expose_secret()).parse()
        {
            req.metadata_mut().insert("authorization", v);
        }
        match tokio::time::timeout(self.timeout, client.recommend(req)).await {
            Ok(Ok(answer)) => Some(answer.into_inner().memory_limit_bytes),
            Ok(Err(status)) => {
                tracing::warn!(code = ?status.code(), "allocator refused; using the first flavor");
                None
            }
            Err(_) => {
                tracing::warn!("allocator timed out; using the first flavor");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytesize::ByteSize;

    fn flavors() -> Vec<Flavor> {
        [("s", 4), ("m", 8), ("l", 16)]
            .into_iter()
            .map(|(n, g)| Flavor {
                name: n.into(),
                memory: ByteSize::gib(g),
                cpus: 2,
            })
            .collect()
    }

    #[test]
    fn the_smallest_flavor_that_covers_the_limit() {
        let f = flavors();
        assert_eq!(pick_flavor(&f, None), 0);
        assert_eq!(pick_flavor(&f, Some(1)), 0);
        assert_eq!(pick_flavor(&f, Some(ByteSize::gib(4).as_u64())), 0);
        assert_eq!(pick_flavor(&f, Some(ByteSize::gib(4).as_u64() + 1)), 1);
        assert_eq!(pick_flavor(&f, Some(ByteSize::gib(12).as_u64())), 2);
        assert_eq!(pick_flavor(&f, Some(ByteSize::gib(64).as_u64())), 2);
    }
}
