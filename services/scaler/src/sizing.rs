//! Right-sizing: the smallest flavor whose memory covers the allocator's
//! recommended limit for the job's workload.

use std::collections::BTreeMap;
use std::time::Duration;

use runyard_allocator_api::client::Client;
use runyard_allocator_api::{JobAttempt, RecommendRequest, Recommendation};
use runyard_events::{Forge, JobKey, Recommended, RunnerRef, RunnerRequested, forge_token};
use secrecy::SecretString;
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::config::{Flavor, PoolConfig};
use crate::core::world::Job;
use crate::retry::Lineage;

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
#[derive(Debug, Clone, PartialEq)]
pub struct Sizing {
    /// Index into the pool's flavors.
    pub flavor: usize,
    /// The allocator's memory limit, when it answered.
    pub recommended_limit: Option<u64>,
    /// True when the allocator could not be asked (first flavor used).
    pub allocator_unavailable: bool,
    /// The allocator's answer and its basis, when it answered (the
    /// runner's request event carries it, so a job's story says why the
    /// runner got its size).
    pub recommendation: Option<Recommended>,
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
        recommendation: sizing.and_then(|s| s.recommendation.clone()),
        allocator_unavailable: sizing.is_some_and(|s| s.allocator_unavailable),
        workload_key: String::new(),
        labels: job.and_then(|j| j.labels.clone()).unwrap_or_default(),
        image: pool.image.clone(),
    }
}

/// What a runner's request event keeps of the allocator's answer.
fn recommended(r: &Recommendation) -> Recommended {
    let basis = r.basis.clone().unwrap_or_default();
    Recommended {
        memory_limit_bytes: r.memory_limit_bytes,
        memory_request_bytes: r.memory_request_bytes,
        statistic: basis.statistic,
        samples: basis.samples,
        workload_samples: basis.workload_samples,
        oom_probability: basis.oom_probability,
        oom_bump: basis.oom_bump,
        retry_count: r.retry_count,
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
    client: Option<Client>,
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
            Ok(e) => Some(Client::new(e, token, timeout)),
            Err(error) => {
                tracing::warn!(%error, "RUNYARD_ALLOCATOR_URL cannot be used: every pool gets its first flavor");
                None
            }
        };
        Self { client }
    }

    /// Sizes a job from its recommendation, as the retry of `retry_of`
    /// when it is one ([`retry_of`]).
    pub async fn size(
        &self,
        job: &Job,
        flavors: &[Flavor],
        retry_of: Option<JobAttempt>,
    ) -> Sizing {
        let answer = self.recommend(job, retry_of).await;
        let limit = answer.as_ref().map(|r| r.memory_limit_bytes);
        Sizing {
            flavor: pick_flavor(flavors, limit),
            recommended_limit: limit,
            allocator_unavailable: limit.is_none(),
            recommendation: answer.as_ref().map(recommended),
        }
    }

    async fn recommend(&self, job: &Job, retry_of: Option<JobAttempt>) -> Option<Recommendation> {
        let retry = retry_of.is_some();
        match self.ask(job, retry_of).await {
            // The attempt it retries was refused by name: sized as no
            // retry, not with the first flavor.
            Err(status) if retry && status.code() == tonic::Code::InvalidArgument => {
                tracing::warn!(
                    message = status.message(),
                    "allocator refused the retried attempt; asking without it"
                );
                self.ask(job, None).await.ok()
            }
            answer => answer.ok(),
        }
    }

    /// One `Recommend` call: the answer, or why there is none (logged).
    async fn ask(
        &self,
        job: &Job,
        retry_of: Option<JobAttempt>,
    ) -> Result<Recommendation, tonic::Status> {
        let Some(client) = &self.client else {
            return Err(tonic::Status::unavailable("no allocator URL"));
        };
        let req = RecommendRequest {
            workload: workload(job),
            r#ref: job.git_ref.clone(),
            retry_of,
            preview: false,
        };
        // The call is a hop of the current trace (a job's runner creation).
        let trace = runyard_bus::current_trace().to_string();
        let answer = client.recommend(req, Some(&trace)).await;
        match &answer {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                tracing::warn!("allocator timed out");
            }
            Err(status) => {
                tracing::warn!(code = ?status.code(), message = status.message(), "allocator refused the call");
            }
        }
        answer
    }
}

/// The attempt `job` retries, from what the job says and what runyard's
/// own retries made (`lineage`):
///
/// - a later attempt (GitHub `run_attempt`, GitLab retries + 1) retries the
///   attempt before it in the same run or pipeline: GitHub gives a re-run's
///   job a new id in the same run, GitLab a retried job a new id in the
///   same pipeline. The job id is sent too, for a forge that keeps it;
/// - a GitLab job made by runyard's job retry retries the job it was made
///   from;
/// - a job of a GitLab pipeline made by runyard's pipeline retry retries
///   its workload's killed attempt in the pipeline that was retried.
///
/// Else it is no retry, and is sized from the workload's history alone.
pub fn retry_of(job: &Job, lineage: &Lineage) -> Option<JobAttempt> {
    let forge = job.id.forge;
    let (old_job, old_pipeline) = lineage.retried_from(
        &(forge, job.id.instance.clone(), job.id.job_id),
        job.pipeline_id,
    );
    let asked = |job_id, pipeline_id, attempt| JobAttempt {
        forge: forge_token(forge).into(),
        instance: job.id.instance.clone(),
        job_id,
        pipeline_id,
        attempt,
    };
    if job.run_attempt > 1 {
        let previous = old_job.unwrap_or(match forge {
            Forge::Github => job.id.job_id,
            _ => 0,
        });
        // Nothing to name it by (a GitLab job seen without its pipeline):
        // sized as no retry rather than refused.
        return (previous != 0 || job.pipeline_id != 0)
            .then(|| asked(previous, job.pipeline_id, job.run_attempt - 1));
    }
    old_pipeline.map(|p| asked(0, p, 0))
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

    fn job(forge: Forge, job_id: u64, pipeline_id: u64, run_attempt: u32) -> Job {
        Job {
            id: crate::core::world::JobId {
                forge,
                instance: "forge.example.com".into(),
                job_id,
            },
            run_attempt,
            pipeline_id,
            labels: None,
            status: runyard_events::JobStatus::Queued,
            seen: (runyard_events::Stage::Pending, Duration::ZERO),
            cancelled: false,
            queued_at: Duration::ZERO,
            project: "acme/app".into(),
            project_id: 1,
            workflow: "CI".into(),
            name: "build".into(),
            git_ref: "main".into(),
            runner_name: None,
            given_up: false,
            scale_set: None,
            forge_status: String::new(),
        }
    }

    /// A `RetryIssued` of GitLab pipeline 100's job 10 (attempt 1).
    fn issued(
        strategy: &str,
        new_pipeline_id: u64,
        new_job_ids: Vec<u64>,
    ) -> runyard_events::Event {
        let target = runyard_events::RetryTarget {
            forge: Forge::Gitlab.into(),
            instance: "forge.example.com".into(),
            project_id: 1,
            project: "acme/app".into(),
            pipeline_id: 100,
            run_attempt: 1,
            r#ref: "main".into(),
            sha: "abc".into(),
            unit: format!("{strategy}:100"),
        };
        let jobs = vec![runyard_events::RetryJob {
            job: Some(JobKey {
                forge: Forge::Gitlab.into(),
                instance: "forge.example.com".into(),
                job_id: 10,
            }),
            attempt: 1,
            name: "build".into(),
            ..Default::default()
        }];
        runyard_events::Event {
            id: format!("retry:{strategy}:issued"),
            body: Some(runyard_events::Body::RetryIssued(
                runyard_events::RetryIssued {
                    target: Some(target),
                    strategy: strategy.into(),
                    jobs,
                    new_pipeline_id,
                    new_job_ids,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }
    }

    #[test]
    fn a_retry_names_the_attempt_it_retries() {
        let none = Lineage::default();
        // A first attempt nobody retried is no retry.
        assert_eq!(retry_of(&job(Forge::Github, 5, 777, 1), &none), None);
        // A GitHub re-run: the attempt before, in the same run (the job id
        // too, for a forge that keeps it).
        let rerun = retry_of(&job(Forge::Github, 6, 777, 2), &none).expect("a retry");
        assert_eq!(
            (
                rerun.forge.as_str(),
                rerun.job_id,
                rerun.pipeline_id,
                rerun.attempt
            ),
            ("github", 6, 777, 1)
        );
        // A GitLab job retried by hand: a new job id, the same pipeline.
        let by_hand = retry_of(&job(Forge::Gitlab, 11, 100, 2), &none).expect("a retry");
        assert_eq!(
            (by_hand.job_id, by_hand.pipeline_id, by_hand.attempt),
            (0, 100, 1)
        );

        // runyard's own retries, as its log says.
        let lineage = Lineage::default();
        lineage.observe(&issued("job", 100, vec![11]));
        lineage.observe(&issued("pipeline", 200, Vec::new()));
        let job_retry = retry_of(&job(Forge::Gitlab, 11, 100, 2), &lineage).expect("a retry");
        assert_eq!(
            (job_retry.job_id, job_retry.pipeline_id, job_retry.attempt),
            (10, 100, 1)
        );
        // A job of the pipeline a retry made: the killed attempt of its
        // workload in the pipeline retried.
        let new_pipeline = retry_of(&job(Forge::Gitlab, 20, 200, 1), &lineage).expect("a retry");
        assert_eq!(
            (
                new_pipeline.job_id,
                new_pipeline.pipeline_id,
                new_pipeline.attempt
            ),
            (0, 100, 0)
        );
        // Another pipeline's first attempt is still no retry.
        assert_eq!(retry_of(&job(Forge::Gitlab, 30, 300, 1), &lineage), None);
        // A GitLab retry seen without its pipeline has nothing to name.
        assert_eq!(retry_of(&job(Forge::Gitlab, 31, 0, 2), &none), None);
    }
}
