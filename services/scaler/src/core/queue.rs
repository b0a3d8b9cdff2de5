//! Why each waiting job has no runner yet, in the scaler's own terms: what
//! its world holds (the job's status and labels, the pools that match, the
//! runner made for it and its attempts) and the pools' numbers. What
//! `GET /v1/queue` and `runyard queue` show.

use serde::Serialize;

use runyard_events::JobStatus;

use super::policy::{self, Knobs, PoolSpec, Queues};
use super::world::{Clock, Job, Phase, World};

/// One job without a runner, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueuedJob {
    /// `github` / `gitlab`.
    pub forge: &'static str,
    /// Forge host.
    pub instance: String,
    /// Forge job id.
    pub job_id: u64,
    /// GitHub run attempt; GitLab retries + 1.
    pub run_attempt: u32,
    /// Repository / project.
    pub project: String,
    /// Job name.
    pub name: String,
    /// Labels (GitLab: tags), lower-cased; empty while unknown.
    pub labels: Vec<String>,
    /// `queued` or `waiting` (the forge holds it back).
    pub status: &'static str,
    /// Seconds since it was queued.
    pub age_seconds: f64,
    /// The pool it waits in, when one matches.
    pub pool: Option<String>,
    /// Why it has no runner yet: `forge_waiting`, `labels_unknown`,
    /// `no_matching_pool`, `given_up`, `creating` (`rate_limited` once the
    /// HTTP view knows its forge's budget is spent), `create_failing`,
    /// `booting`, `runner_online`, `pool_full` or `runner_due`.
    pub reason: &'static str,
    /// The same in words, with the numbers behind it.
    pub detail: String,
    /// The runner made for it, if any.
    pub runner: Option<String>,
}

/// Every job that is queued or waiting, oldest first, with the reason it
/// has no runner yet.
pub fn queued_jobs(
    pools: &[PoolSpec],
    world: &World,
    queues: &Queues<'_>,
    knobs: &Knobs,
    now: Clock,
) -> Vec<QueuedJob> {
    let mut jobs: Vec<&Job> = world
        .jobs
        .values()
        .filter(|j| matches!(j.status, JobStatus::Queued | JobStatus::Waiting))
        .collect();
    jobs.sort_by(|a, b| a.queued_at.cmp(&b.queued_at).then(a.id.cmp(&b.id)));
    jobs.into_iter()
        .map(|job| {
            let in_queue = pools
                .iter()
                .find(|p| queues.of(&p.name).iter().any(|q| q.id == job.id));
            let candidates = policy::candidate_pools(pools, job, knobs.balance);
            let pool = in_queue.or_else(|| candidates.first().copied());
            let (reason, detail, runner) = why(job, pool, candidates.is_empty(), world, knobs, now);
            QueuedJob {
                forge: runyard_events::forge_token(job.id.forge),
                instance: job.id.instance.clone(),
                job_id: job.id.job_id,
                run_attempt: job.run_attempt,
                project: job.project.clone(),
                name: job.name.clone(),
                labels: job.labels.clone().unwrap_or_default(),
                status: if job.status == JobStatus::Waiting {
                    "waiting"
                } else {
                    "queued"
                },
                age_seconds: now.saturating_sub(job.queued_at).as_secs_f64(),
                pool: pool.map(|p| p.name.clone()),
                reason,
                detail,
                runner,
            }
        })
        .collect()
}

fn why(
    job: &Job,
    pool: Option<&PoolSpec>,
    no_pool: bool,
    world: &World,
    knobs: &Knobs,
    now: Clock,
) -> (&'static str, String, Option<String>) {
    if job.status == JobStatus::Waiting {
        return (
            "forge_waiting",
            "the forge holds it back (a deployment approval, a concurrency or resource group, \
             or an earlier stage); it gets a runner once it is queued"
                .to_owned(),
            None,
        );
    }
    let Some(labels) = &job.labels else {
        return (
            "labels_unknown",
            "its labels are being read from the forge (GitLab's hook names the runner's tags, \
             not the job's)"
                .to_owned(),
            None,
        );
    };
    let made = world
        .runners
        .values()
        .filter(|r| r.job.as_ref() == Some(&job.id) && r.run_attempt == job.run_attempt)
        .max_by_key(|r| r.requested_at);
    if job.given_up {
        let last = made.map_or("", |r| r.reason.as_str());
        return (
            "given_up",
            format!(
                "runyard gave up after {} create attempts{}",
                knobs.create_attempts,
                if last.is_empty() {
                    String::new()
                } else {
                    format!(" (last error: {last})")
                }
            ),
            made.map(|r| r.name.clone()),
        );
    }
    if no_pool {
        return (
            "no_matching_pool",
            format!("no pool's labels cover [{}]", labels.join(", ")),
            None,
        );
    }
    let since = |t: Clock| now.saturating_sub(t).as_secs();
    if let Some(r) = made {
        let name = Some(r.name.clone());
        let of = knobs.create_attempts;
        match r.phase {
            Phase::Requested if r.attempts > 1 => {
                return (
                    "create_failing",
                    format!(
                        "creating runner {} in pool {}: attempt {} of {of} under way for {}s \
                         (last error: {})",
                        r.name,
                        r.pool,
                        r.attempts,
                        since(r.attempt_started_at),
                        r.reason
                    ),
                    name,
                );
            }
            Phase::Requested => {
                return (
                    "creating",
                    format!(
                        "creating runner {} in pool {} for {}s",
                        r.name,
                        r.pool,
                        since(r.attempt_started_at)
                    ),
                    name,
                );
            }
            Phase::Failed => {
                let next = r.retry_at.map_or(String::new(), |t| {
                    format!(", next in {}s", t.saturating_sub(now).as_secs())
                });
                return (
                    "create_failing",
                    format!(
                        "creating runner {} in pool {} failed, attempt {} of {of}: {}{next}",
                        r.name, r.pool, r.attempts, r.reason
                    ),
                    name,
                );
            }
            Phase::Created => {
                return (
                    "booting",
                    format!(
                        "runner {} of pool {} booting for {}s (flavor {})",
                        r.name,
                        r.pool,
                        since(r.attempt_started_at),
                        r.flavor
                    ),
                    name,
                );
            }
            Phase::Online => {
                return (
                    "runner_online",
                    format!(
                        "runner {} of pool {} is online; the forge has not handed it the job yet",
                        r.name, r.pool
                    ),
                    name,
                );
            }
            Phase::Assigned | Phase::Deleted => {}
        }
    }
    let Some(pool) = pool else {
        return ("no_matching_pool", "no pool matches".to_owned(), None);
    };
    let (mut alive, mut busy) = (0u32, 0u32);
    for r in world.runners.values().filter(|r| r.pool == pool.name) {
        match r.phase {
            Phase::Requested | Phase::Created | Phase::Online => alive += 1,
            Phase::Assigned => {
                alive += 1;
                busy += 1;
            }
            Phase::Failed | Phase::Deleted => {}
        }
    }
    if alive >= pool.max_runners {
        return (
            "pool_full",
            format!(
                "pool {} is at max_runners: {alive} of {} runners alive, {busy} busy",
                pool.name, pool.max_runners
            ),
            None,
        );
    }
    (
        "runner_due",
        format!(
            "pool {} has room ({alive} of {}); the replica holding it requests a runner next",
            pool.name, pool.max_runners
        ),
        None,
    )
}
