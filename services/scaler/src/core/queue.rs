//! Why each waiting job has no runner yet, in the scaler's own terms: what
//! its world holds (the job's status and labels, the pools that match, the
//! runner made for it and its attempts) and the pools' numbers. What
//! `GET /v1/queue` and `runyard queue` show.

use std::collections::HashMap;

use serde::Serialize;

use runyard_events::JobStatus;

use super::policy::{self, Knobs, PoolSpec, Queues};
use super::world::{Clock, Job, JobId, Phase, Runner, World};

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
    // One pass over the queues, the runners and the pools' numbers, not
    // one per job: a busy site has thousands queued.
    let mut queued_in: HashMap<&JobId, &PoolSpec> = HashMap::new();
    for pool in pools {
        for job in queues.of(&pool.name) {
            queued_in.entry(&job.id).or_insert(pool);
        }
    }
    let mut made: HashMap<&JobId, &Runner> = HashMap::new();
    let mut numbers: HashMap<&str, (u32, u32)> = HashMap::new();
    for r in world.runners.values() {
        if let Some(job) = &r.job {
            let newer = made
                .get(job)
                .is_none_or(|m| m.requested_at < r.requested_at);
            if newer {
                made.insert(job, r);
            }
        }
        let n = numbers.entry(r.pool.as_str()).or_default();
        match r.phase {
            Phase::Requested | Phase::Created | Phase::Online => n.0 += 1,
            Phase::Assigned => *n = (n.0 + 1, n.1 + 1),
            Phase::Failed | Phase::Deleted => {}
        }
    }
    jobs.into_iter()
        .map(|job| {
            let candidates = policy::candidate_pools(pools, job, knobs.balance);
            let pool = queued_in
                .get(&job.id)
                .copied()
                .or_else(|| candidates.first().copied());
            let runner = made
                .get(&job.id)
                .copied()
                .filter(|r| r.run_attempt == job.run_attempt);
            let alive = pool.map_or((0, 0), |p| {
                numbers.get(p.name.as_str()).copied().unwrap_or_default()
            });
            let (reason, detail, runner) =
                why(job, pool, candidates.is_empty(), runner, alive, knobs, now);
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

/// The reason for one job: `made` is the runner made for it (this
/// attempt), `(alive, busy)` its pool's runners.
fn why(
    job: &Job,
    pool: Option<&PoolSpec>,
    no_pool: bool,
    made: Option<&Runner>,
    (alive, busy): (u32, u32),
    knobs: &Knobs,
    now: Clock,
) -> (&'static str, String, Option<String>) {
    if job.status == JobStatus::Waiting {
        return (
            "forge_waiting",
            format!("{}; it gets a runner once it is queued", held(job)),
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

/// Why the forge holds a waiting job back, by its own status word
/// (REFERENCE: "Job lifecycles").
fn held(job: &Job) -> &'static str {
    match (job.id.forge, job.forge_status.as_str()) {
        (runyard_events::Forge::Gitlab, "created") => {
            "GitLab holds it back for its stage: an earlier stage or a job it needs has not finished"
        }
        (runyard_events::Forge::Gitlab, "waiting_for_resource") => {
            "GitLab holds it back for its resource group: another job holds the resource"
        }
        (runyard_events::Forge::Gitlab, "scheduled") => {
            "GitLab holds it back until its scheduled time (a delayed job)"
        }
        (runyard_events::Forge::Gitlab, "preparing") => {
            "GitLab is preparing it (a runner is setting up its environment)"
        }
        (runyard_events::Forge::Gitlab, _) => {
            "GitLab holds it back (created: an earlier stage or its needs; \
             waiting_for_resource: its resource group; scheduled; preparing)"
        }
        (_, "waiting") => {
            "GitHub holds it back for its environment: a deployment's approval or protection rules, \
             or its concurrency group"
        }
        _ => {
            "GitHub holds it back (waiting: a deployment's protection rules or approval, \
             or its concurrency group)"
        }
    }
}
