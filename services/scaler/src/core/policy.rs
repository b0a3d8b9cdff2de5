//! The scaling policy: plain functions from what is known (pools, jobs,
//! runners, the clock) to decisions. No IO here; the engine carries the
//! decisions out and the simulator runs the same code in virtual time.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use runyard_events::{Forge, JobStatus};
use serde::Serialize;

use crate::core::world::{Clock, Job, JobId, Phase, Runner, World};

/// A pool as the policy needs it.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    /// Name.
    pub name: String,
    /// Forge.
    pub forge: Forge,
    /// Forge host.
    pub instance: String,
    /// Labels, lower-cased.
    pub labels: Vec<String>,
    /// Idle runners kept warm.
    pub min_idle: u32,
    /// Most runners alive at once.
    pub max_runners: u32,
    /// Idle runners above `min_idle` go after this long.
    pub idle_timeout: Duration,
    /// Runners not online after this long are reaped.
    pub bootstrap_timeout: Duration,
    /// Higher wins among matching pools.
    pub priority: i32,
    /// The repositories (`owner/repo`, lower-cased) whose jobs its runners
    /// may take, when its GitHub runner group admits selected ones only;
    /// `None`: any.
    pub repos: Option<Vec<String>>,
    /// A runner scale set's pool: it serves the jobs its scale set is
    /// assigned (whatever their labels) and no others.
    pub scale_set: bool,
}

impl PoolSpec {
    /// Whether runners of this pool may take jobs of `project` (GitHub
    /// runner groups).
    pub fn admits(&self, project: &str) -> bool {
        self.repos
            .as_ref()
            .is_none_or(|r| r.iter().any(|p| p.eq_ignore_ascii_case(project)))
    }
}

pub use runyard_scaler_config::Balance;

/// Policy knobs shared by every pool.
#[derive(Debug, Clone)]
pub struct Knobs {
    /// How long a job an idle runner could take waits for it.
    pub idle_backoff: Duration,
    /// Create attempts per runner before its job is given up.
    pub create_attempts: u32,
    /// Among pools of one priority.
    pub balance: Balance,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Claim the job and create a runner for it.
    Create {
        /// Pool.
        pool: String,
        /// The job.
        job: JobId,
        /// Its run attempt.
        run_attempt: u32,
    },
    /// Create a runner for no job in particular (`min_idle`).
    CreateIdle {
        /// Pool.
        pool: String,
    },
    /// Create a runner for the pool's queue: a claimed job whose runner
    /// went to another job, and no free runner is left to take it.
    Replace {
        /// Pool.
        pool: String,
    },
    /// Start the next create attempt of a runner whose last one failed.
    Retry {
        /// Runner name.
        name: String,
    },
    /// No more attempts: give the runner's job up.
    GiveUp {
        /// Runner name.
        name: String,
    },
    /// The runner never came online in time: remove its instance and count
    /// the attempt as failed.
    Reap {
        /// Runner name.
        name: String,
    },
    /// Remove the runner (it is not running a job).
    Delete {
        /// Runner name.
        name: String,
        /// Why (`job_completed`, `job_cancelled`, `scale_down`, `failed`).
        reason: &'static str,
    },
    /// An idle runner past its idle timeout: confirm with the forge that it
    /// stays idle, then remove it.
    ConfirmIdle {
        /// Runner name.
        name: String,
    },
}

/// One pool's numbers, as `GET /v1/pools` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// Runners the pool should have: busy + queued jobs + `min_idle`, capped.
    pub desired: u32,
    /// Runners alive (being created, booting, idle or busy).
    pub actual: u32,
    /// Online and waiting for a job.
    pub idle: u32,
    /// Being created or booting.
    pub creating: u32,
    /// Running a job.
    pub busy: u32,
    /// Jobs waiting for a runner of this pool.
    pub queued: u32,
    /// `max_runners`.
    pub max_runners: u32,
    /// `min_idle`.
    pub min_idle: u32,
}

/// True when every job label is one of the pool's (case-insensitive; both
/// sides lower-cased already). A job without labels matches no pool.
pub fn labels_match(job: &[String], pool: &[String]) -> bool {
    !job.is_empty() && job.iter().all(|l| pool.contains(l))
}

/// The pools a job may go to, in the order it tries them: those of its
/// forge and instance whose labels cover the job's, highest priority first;
/// within one priority in name order (`pack`) or rotated by job id
/// (`spread`), so every replica orders them the same.
pub fn candidate_pools<'a>(
    pools: &'a [PoolSpec],
    job: &Job,
    balance: Balance,
) -> Vec<&'a PoolSpec> {
    if targets_scale_set(pools, job) {
        // Its scale set's message says so and serves it; a webhook pool
        // whose labels happen to cover it would make a second runner.
        return Vec::new();
    }
    let mut matching: Vec<&PoolSpec> = pools.iter().filter(|p| takes(p, job)).collect();
    matching.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(&b.name)));
    if balance == Balance::Spread {
        for tied in matching.chunk_by_mut(|a, b| a.priority == b.priority) {
            let n = tied.len() as u64;
            tied.rotate_left(usize::try_from(job.id.job_id % n).unwrap_or(0));
        }
    }
    matching
}

/// Whether `pool` may take `job`: the job's forge and instance, labels the
/// pool's cover, a repository the pool's runner group admits; a scale-set
/// pool, exactly the jobs its scale set was assigned.
pub fn takes(pool: &PoolSpec, job: &Job) -> bool {
    if pool.scale_set || job.scale_set.is_some() {
        // The service assigned the job to one scale set; a webhook's view
        // of a job a scale set serves is not the scaler's to serve twice.
        return pool.scale_set && job.scale_set.as_deref() == Some(pool.name.as_str());
    }
    pool.forge == job.id.forge
        && pool.instance == job.id.instance
        && job
            .labels
            .as_deref()
            .is_some_and(|labels| labels_match(labels, &pool.labels))
        && pool.admits(&job.project)
}

/// Whether a job seen by webhook or poll asks for a runner scale set: its
/// labels are covered by a scale-set pool's (the scale set's name, then its
/// labels) on its instance. Such a job is served through its scale set's
/// messages only.
pub fn targets_scale_set(pools: &[PoolSpec], job: &Job) -> bool {
    job.scale_set.is_none()
        && pools.iter().any(|p| {
            p.scale_set
                && p.forge == job.id.forge
                && p.instance == job.id.instance
                && job
                    .labels
                    .as_deref()
                    .is_some_and(|l| labels_match(l, &p.labels))
        })
}

/// The pool a job goes to when every pool has room: the first of
/// [`candidate_pools`].
pub fn choose_pool<'a>(pools: &'a [PoolSpec], job: &Job, balance: Balance) -> Option<&'a PoolSpec> {
    candidate_pools(pools, job, balance).first().copied()
}

/// The queued jobs of every pool, oldest first: each job's pool is chosen
/// once per round, not once per pool. A job stays with the pool that made a
/// runner for it; any other goes to the first candidate pool with room
/// (`max_runners` less its live runners, plus its free ones, less the jobs
/// given to it before this one), or waits in the first candidate when none
/// has room.
pub fn queues<'a>(world: &'a World, pools: &[PoolSpec], balance: Balance) -> Queues<'a> {
    let mut jobs: Vec<&Job> = world.jobs.values().filter(|j| j.is_queued()).collect();
    jobs.sort_by(|a, b| a.queued_at.cmp(&b.queued_at).then(a.id.cmp(&b.id)));
    let candidates: Vec<Vec<&PoolSpec>> = jobs
        .iter()
        .map(|j| candidate_pools(pools, j, balance))
        .collect();
    let mut q: HashMap<String, Vec<&Job>> = HashMap::new();
    // No job has a second pool to spill over to: nothing to count (the
    // common case, and the policy runs on every event).
    if candidates.iter().all(|c| c.len() <= 1) {
        for (job, c) in jobs.into_iter().zip(&candidates) {
            if let Some(pool) = c.first() {
                q.entry(pool.name.clone()).or_default().push(job);
            }
        }
        return Queues(q);
    }
    let queued: HashSet<&JobId> = jobs.iter().map(|j| &j.id).collect();
    let mut room: HashMap<&str, i64> = pools
        .iter()
        .map(|p| (p.name.as_str(), i64::from(p.max_runners)))
        .collect();
    let mut made_for: HashMap<&JobId, (&str, bool)> = HashMap::new();
    for r in world.runners.values() {
        let queued_for = r.job.as_ref().filter(|id| queued.contains(id));
        if let Some(left) = room.get_mut(r.pool.as_str()) {
            // A live runner takes a place; a free one gives it back (it
            // takes a queued job without a new runner).
            *left -= i64::from(r.is_alive()) - i64::from(r.is_unassigned() && queued_for.is_none());
        }
        if let Some(job) = queued_for {
            let serving = r.is_unassigned() || r.phase == Phase::Failed;
            let e = made_for.entry(job).or_insert((r.pool.as_str(), false));
            e.1 |= serving;
        }
    }
    for (job, candidates) in jobs.into_iter().zip(candidates) {
        let pool = match made_for.get(&job.id) {
            Some(&(pool, serving)) => {
                if !serving && let Some(left) = room.get_mut(pool) {
                    *left -= 1;
                }
                pool.to_owned()
            }
            None => {
                let Some(chosen) = candidates
                    .iter()
                    .find(|p| room.get(p.name.as_str()).is_some_and(|left| *left > 0))
                    .or(candidates.first())
                else {
                    continue;
                };
                if let Some(left) = room.get_mut(chosen.name.as_str()) {
                    *left -= 1;
                }
                chosen.name.clone()
            }
        };
        q.entry(pool).or_default().push(job);
    }
    Queues(q)
}

/// Each pool's queued jobs, oldest first ([`queues`]).
#[derive(Debug, Default)]
pub struct Queues<'a>(HashMap<String, Vec<&'a Job>>);

impl<'a> Queues<'a> {
    /// `pool`'s queued jobs, oldest first.
    pub fn of(&self, pool: &str) -> &[&'a Job] {
        self.0.get(pool).map_or(&[][..], Vec::as_slice)
    }
}

/// Decides what to do for the pools this replica owns. `in_flight` says
/// whether a runner has an operation under way (no second decision for it).
pub fn decide(
    pools: &[PoolSpec],
    world: &World,
    owned: &dyn Fn(&str) -> bool,
    in_flight: &dyn Fn(&str) -> bool,
    now: Clock,
    knobs: &Knobs,
) -> Vec<Decision> {
    let queues = queues(world, pools, knobs.balance);
    decide_queued(pools, world, &queues, owned, in_flight, now, knobs)
}

/// [`decide`] with the queues of this round already made (the same ones
/// serve [`status_of`] when nothing was decided).
pub fn decide_queued(
    pools: &[PoolSpec],
    world: &World,
    queues: &Queues<'_>,
    owned: &dyn Fn(&str) -> bool,
    in_flight: &dyn Fn(&str) -> bool,
    now: Clock,
    knobs: &Knobs,
) -> Vec<Decision> {
    let mut out = Vec::new();
    for pool in pools.iter().filter(|p| owned(&p.name)) {
        let queue = queues.of(&pool.name);
        decide_pool(pool, queue, world, in_flight, now, knobs, &mut out);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn decide_pool(
    pool: &PoolSpec,
    queue: &[&Job],
    world: &World,
    in_flight: &dyn Fn(&str) -> bool,
    now: Clock,
    knobs: &Knobs,
    out: &mut Vec<Decision>,
) {
    let runners: Vec<&Runner> = world
        .runners
        .values()
        .filter(|r| r.pool == pool.name)
        .collect();
    let job_queued = |id: &Option<JobId>| {
        id.as_ref()
            .and_then(|id| world.jobs.get(id))
            .is_some_and(Job::is_queued)
    };
    let mut alive = runners.iter().filter(|r| r.is_alive()).count();
    let max = pool.max_runners as usize;

    // Runners whose job is done go; runners that never came online are
    // reaped; failed attempts are retried or given up.
    for r in runners.iter().filter(|r| !in_flight(&r.name)) {
        match r.phase {
            Phase::Assigned if world.runner_done(r) && r.removal_after.is_none_or(|t| now >= t) => {
                out.push(Decision::Delete {
                    name: r.name.clone(),
                    reason: "job_completed",
                });
            }
            Phase::Requested | Phase::Created
                if now.saturating_sub(r.attempt_started_at) >= pool.bootstrap_timeout =>
            {
                out.push(Decision::Reap {
                    name: r.name.clone(),
                });
            }
            Phase::Failed if !job_queued(&r.job) => out.push(Decision::Delete {
                name: r.name.clone(),
                reason: "failed",
            }),
            Phase::Failed if r.attempts >= knobs.create_attempts => {
                out.push(Decision::GiveUp {
                    name: r.name.clone(),
                });
            }
            Phase::Failed if r.retry_at.is_none_or(|t| now >= t) && alive < max => {
                alive += 1;
                out.push(Decision::Retry {
                    name: r.name.clone(),
                });
            }
            _ => {}
        }
    }

    // A job is served while a runner made for it is alive and free, or
    // waiting to retry its create; claimed once any runner was made for it.
    let mut made_for: HashMap<&JobId, bool> = HashMap::new();
    for r in &runners {
        if let Some(job) = &r.job {
            // A runner the forge lists busy before saying which job it took
            // (the listing raced the job's start) is taken to run its own:
            // once the start names another job, that job's own runner is
            // free for this one.
            let serving = r.is_unassigned() || r.phase == Phase::Failed || r.runs_unnamed_job();
            *made_for.entry(job).or_default() |= serving;
        }
    }
    let served = |job: &Job| made_for.get(&job.id).copied().unwrap_or(false);
    let claimed = |job: &Job| made_for.contains_key(&job.id);
    let unserved: Vec<&Job> = queue.iter().copied().filter(|j| !served(j)).collect();
    // Free runners: alive, not running a job, not held for a queued job.
    let mut free: Vec<&Runner> = runners
        .iter()
        .copied()
        .filter(|r| r.is_unassigned() && !job_queued(&r.job))
        .collect();
    let online_free = free.iter().filter(|r| r.phase == Phase::Online).count();
    // Runners the forge lists busy before saying which job they took, and
    // not made for a job still queued: each runs one queued job already,
    // so that job's own runner, or the one it waits for, is free in
    // effect. Counted as free, never deleted (they run a job).
    let unnamed = runners
        .iter()
        .filter(|r| r.runs_unnamed_job() && !job_queued(&r.job))
        .count();
    let available = free.len() + unnamed;
    // Free runners each take one waiting job: online ones may take any job
    // (which then waits `idle_backoff` for it); booting ones are kept for
    // jobs already claimed.
    let mut free_left = available;
    let mut online_left = online_free;
    // Jobs left waiting for a free runner (not given a new one now).
    let mut waiting = 0;
    for job in &unserved {
        if claimed(job) {
            // Its runner went to another job (a forge hands a queued job to
            // any idle runner that matches): a free runner takes it, or,
            // when none is left (the other job's runner failed), a
            // replacement is made. The claim is spent: the replacement is
            // the pool's, not the job's.
            if free_left > 0 {
                free_left -= 1;
                online_left = online_left.min(free_left);
                waiting += 1;
            } else if alive < max {
                alive += 1;
                out.push(Decision::Replace {
                    pool: pool.name.clone(),
                });
            } else {
                waiting += 1;
            }
            continue;
        }
        if online_left > 0 && now.saturating_sub(job.queued_at) < knobs.idle_backoff {
            online_left -= 1;
            free_left -= 1;
            waiting += 1;
            continue;
        }
        if alive >= max {
            waiting += 1;
            continue;
        }
        alive += 1;
        out.push(Decision::Create {
            pool: pool.name.clone(),
            job: job.id.clone(),
            run_attempt: job.run_attempt,
        });
    }

    // Keep min_idle free runners (booting ones count), remove the surplus.
    let idle_to_be = available.saturating_sub(waiting);
    let min_idle = pool.min_idle as usize;
    if idle_to_be < min_idle {
        for _ in 0..(min_idle - idle_to_be).min(max.saturating_sub(alive)) {
            out.push(Decision::CreateIdle {
                pool: pool.name.clone(),
            });
        }
        return;
    }
    let mut surplus = idle_to_be - min_idle;
    if surplus == 0 {
        return;
    }
    // Runners not yet online run nothing: they go at once (newest first).
    // Online ones go after their idle timeout, oldest first, once the forge
    // confirms they stay idle.
    free.sort_by_key(|r| {
        (
            r.phase == Phase::Online,
            std::cmp::Reverse(r.requested_at),
            r.idle_since,
        )
    });
    for r in free.iter().filter(|r| r.phase != Phase::Online) {
        if surplus == 0 {
            return;
        }
        surplus -= 1;
        if in_flight(&r.name) {
            continue;
        }
        let cancelled = r
            .job
            .as_ref()
            .and_then(|j| world.jobs.get(j))
            .is_some_and(|j| j.status == JobStatus::Completed);
        out.push(Decision::Delete {
            name: r.name.clone(),
            reason: if cancelled {
                "job_cancelled"
            } else {
                "scale_down"
            },
        });
    }
    let mut online: Vec<&&Runner> = free.iter().filter(|r| r.phase == Phase::Online).collect();
    online.sort_by_key(|r| r.idle_since);
    for r in online.into_iter().take(surplus) {
        let idle_for = now.saturating_sub(r.idle_since.unwrap_or(now));
        if idle_for >= pool.idle_timeout && !in_flight(&r.name) {
            out.push(Decision::ConfirmIdle {
                name: r.name.clone(),
            });
        }
    }
}

/// Every pool's numbers.
pub fn status(pools: &[PoolSpec], world: &World, balance: Balance) -> Vec<PoolStatus> {
    status_of(pools, world, &queues(world, pools, balance))
}

/// [`status`] from this round's queues.
pub fn status_of(pools: &[PoolSpec], world: &World, queues: &Queues<'_>) -> Vec<PoolStatus> {
    pools
        .iter()
        .map(|pool| {
            let mut s = PoolStatus {
                name: pool.name.clone(),
                max_runners: pool.max_runners,
                min_idle: pool.min_idle,
                ..PoolStatus::default()
            };
            for r in world.runners.values().filter(|r| r.pool == pool.name) {
                match r.phase {
                    Phase::Requested | Phase::Created => s.creating += 1,
                    Phase::Online => s.idle += 1,
                    Phase::Assigned => s.busy += 1,
                    Phase::Failed | Phase::Deleted => {}
                }
            }
            s.actual = s.creating + s.idle + s.busy;
            s.queued = u32::try_from(queues.of(&pool.name).len()).unwrap_or(u32::MAX);
            s.desired = (s.busy + s.queued + s.min_idle).min(s.max_runners);
            s
        })
        .collect()
}

#[cfg(test)]
mod tests;
