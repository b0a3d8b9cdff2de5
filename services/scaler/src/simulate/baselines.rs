//! The two policies runyard is measured against, as plain functions over the
//! same simulated forge.
//!
//! - garm (`runner/pool/pool.go`): queued jobs are recorded from webhooks; a
//!   loop every 5 s gives a runner (labelled with the job) to each unlocked
//!   queued job older than `minimum_job_age_backoff` (30 s), idle runners or
//!   not, and locks the job (a lock older than 10 min is dropped and the job
//!   served again); an `in_progress` job on a runner made for another job
//!   unlocks that job (it waits its 30 s again, as the lock update resets
//!   its age) and tops up `min_idle`; a completed job's runner is marked for
//!   deletion and removed by the next 5 s loop; failed creates are retried
//!   by the 5 s loop (5 attempts); every minute, ⌈half⌉ of the idle runners
//!   above `min_idle` + queued jobs are deleted. Runners are ephemeral. A
//!   garm pool has one flavor: to run every job it is the largest.
//! - ARC (runner scale sets, `gha-runner-scale-set`): the listener learns
//!   every assigned job from the Actions service's messages (not from
//!   webhooks) and on every message sets the ephemeral runner set's replicas
//!   to `min(minRunners + totalAssignedJobs, maxRunners)` (assigned jobs
//!   include the running ones); the set's controller reconciles on that and
//!   on every change of its runners (`EphemeralRunnerSet` controller):
//!   finished runners are deleted, runners are created up to the replicas,
//!   or runners above them without a job are removed (pending then running,
//!   oldest first; one running a job is refused by the service). Scale-down
//!   is otherwise runners exiting after their one job. Every runner has the
//!   set's one shape (its pod template): the largest flavor, so that every
//!   job fits. Without messages the listener's empty long poll re-reads the
//!   statistics every `resync` (this also retries failed creates).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Scaler;
use super::forge::{Forge, Obs, State};
use crate::core::world::Clock;

/// garm's timers.
#[derive(Debug, Clone)]
pub(crate) struct GarmTimers {
    /// `PoolConsilitationInterval`.
    pub consolidation: Duration,
    /// `PoolScaleDownInterval`.
    pub scale_down: Duration,
    /// `minimum_job_age_backoff`.
    pub min_job_age: Duration,
    /// A job locked this long is unlocked and served again.
    pub relock_after: Duration,
    /// Create attempts per instance.
    pub create_attempts: u32,
}

impl Default for GarmTimers {
    fn default() -> Self {
        Self {
            consolidation: Duration::from_secs(5),
            scale_down: Duration::from_secs(60),
            min_job_age: Duration::from_secs(30),
            relock_after: Duration::from_secs(600),
            create_attempts: 5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GarmStatus {
    Queued,
    InProgress,
}

/// A row of garm's job table.
#[derive(Debug, Clone)]
struct GarmJob {
    status: GarmStatus,
    locked: bool,
    /// `updated_at`: every save (lock, unlock) moves it.
    updated: Clock,
}

/// garm's pool manager for one pool.
#[derive(Debug)]
pub(crate) struct Garm {
    timers: GarmTimers,
    min_idle: usize,
    max_runners: usize,
    /// Jobs by forge index (= queue order), as recorded from webhooks.
    jobs: BTreeMap<usize, GarmJob>,
    pending_delete: Vec<usize>,
    /// Failed instances: (the job label, attempts so far).
    failed: Vec<(Option<usize>, u32)>,
    next_loop: Clock,
    next_scale_down: Clock,
    /// Every runner's memory (the pool's one flavor).
    memory: u64,
}

fn next_after(now: Clock, period: Duration) -> Clock {
    let p = period.as_nanos().max(1);
    let n = now.as_nanos() / p + 1;
    Duration::from_nanos(u64::try_from(n * p).unwrap_or(u64::MAX))
}

impl Garm {
    /// A pool manager starting at `start`, whose runners have `memory`
    /// bytes.
    pub(crate) fn new(
        timers: GarmTimers,
        min_idle: usize,
        max_runners: usize,
        memory: u64,
        start: Clock,
    ) -> Self {
        Self {
            next_loop: next_after(start, timers.consolidation),
            next_scale_down: next_after(start, timers.scale_down),
            timers,
            min_idle,
            max_runners,
            jobs: BTreeMap::new(),
            pending_delete: Vec::new(),
            failed: Vec::new(),
            memory,
        }
    }

    fn add_runner(&mut self, forge: &mut Forge, now: Clock, job: Option<usize>, attempt: u32) {
        let (_, ok) = forge.create(now, job, self.memory);
        if !ok {
            self.failed.push((job, attempt));
        }
    }

    /// `ensureIdleRunnersForOnePool`: idle or pending runners kept at
    /// `min_idle`.
    fn ensure_min_idle(&mut self, forge: &mut Forge, now: Clock) {
        if self.min_idle == 0 || forge.alive() >= self.max_runners {
            return;
        }
        let idle_or_pending = forge.idle_runners().count() + forge.booting_runners().count();
        let required = self
            .min_idle
            .saturating_sub(idle_or_pending)
            .min(self.max_runners - forge.alive());
        for _ in 0..required {
            self.add_runner(forge, now, None, 1);
        }
    }

    /// `consumeQueuedJobs`.
    fn consume_queued_jobs(&mut self, forge: &mut Forge, now: Clock) {
        let ids: Vec<usize> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.status == GarmStatus::Queued)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            if now.saturating_sub(job.updated) < self.timers.min_job_age {
                // Give the idle runners a chance to pick it up.
                continue;
            }
            if job.locked {
                if now.saturating_sub(job.updated) >= self.timers.relock_after {
                    job.locked = false;
                    job.updated = now;
                }
                continue;
            }
            job.locked = true;
            job.updated = now;
            if forge.alive() < self.max_runners {
                self.add_runner(forge, now, Some(id), 1);
            } else {
                job.locked = false;
                job.updated = now;
            }
        }
    }

    /// `scaleDownOnePool`.
    fn scale_down(&mut self, forge: &mut Forge, now: Clock) {
        let idle: Vec<usize> = {
            let mut v: Vec<usize> = forge.idle_runners().collect();
            // garm lists a pool's instances in creation order.
            v.sort_unstable();
            v
        };
        let queued = self
            .jobs
            .values()
            .filter(|j| j.status == GarmStatus::Queued)
            .count();
        let surplus = idle.len() as i64 - (self.min_idle + queued) as i64;
        if surplus <= 0 {
            return;
        }
        let n = (surplus as f64 * 0.5).ceil() as usize;
        for r in idle.into_iter().take(n) {
            let _ = forge.delete(now, r);
        }
    }
}

impl Scaler for Garm {
    fn name(&self) -> &'static str {
        "garm"
    }

    fn webhooks(&self) -> bool {
        true
    }

    fn scale_set(&self) -> bool {
        false
    }

    fn observe(&mut self, forge: &mut Forge, now: Clock, obs: Obs) -> bool {
        match obs {
            Obs::Queued(j) | Obs::Rediscovered(j) => {
                self.jobs.entry(j).or_insert(GarmJob {
                    status: GarmStatus::Queued,
                    locked: false,
                    updated: now,
                });
            }
            Obs::Started { job, runner } => {
                let row = self.jobs.entry(job).or_insert(GarmJob {
                    status: GarmStatus::InProgress,
                    locked: false,
                    updated: now,
                });
                row.status = GarmStatus::InProgress;
                row.updated = now;
                // The runner was made for another job: that one may be
                // served again.
                if let Some(trigger) = forge.runners[runner].made_for
                    && trigger != job
                    && let Some(t) = self.jobs.get_mut(&trigger)
                    && t.status == GarmStatus::Queued
                    && t.locked
                {
                    t.locked = false;
                    t.updated = now;
                }
                self.ensure_min_idle(forge, now);
            }
            Obs::Completed { job, runner } => {
                self.jobs.remove(&job);
                self.pending_delete.push(runner);
            }
            Obs::Online(_) => {}
        }
        true
    }

    fn act(&mut self, forge: &mut Forge, now: Clock, _events: bool) {
        if now >= self.next_loop {
            self.next_loop = next_after(now, self.timers.consolidation);
            for r in std::mem::take(&mut self.pending_delete) {
                let _ = forge.delete(now, r);
            }
            for (job, attempt) in std::mem::take(&mut self.failed) {
                if attempt < self.timers.create_attempts {
                    self.add_runner(forge, now, job, attempt + 1);
                }
            }
            self.ensure_min_idle(forge, now);
            self.consume_queued_jobs(forge, now);
        }
        if now >= self.next_scale_down {
            self.next_scale_down = next_after(now, self.timers.scale_down);
            self.scale_down(forge, now);
        }
    }

    fn next_wakeup(&self) -> Clock {
        self.next_loop.min(self.next_scale_down)
    }
}

/// ARC's runner scale set for one pool: its listener and its ephemeral
/// runner set's controller.
#[derive(Debug)]
pub(crate) struct Arc {
    resync: Duration,
    min_runners: usize,
    max_runners: usize,
    /// Every runner's memory (the largest flavor).
    memory: u64,
    next: Clock,
}

impl Arc {
    /// A scale set of `min_runners`..=`max_runners` runners of `memory`
    /// bytes, whose listener re-reads the statistics every `resync` when no
    /// message comes.
    pub(crate) fn new(
        resync: Duration,
        min_runners: usize,
        max_runners: usize,
        memory: u64,
        start: Clock,
    ) -> Self {
        Self {
            next: next_after(start, resync),
            resync,
            min_runners,
            max_runners,
            memory,
        }
    }

    /// The listener's target: `min(minRunners + totalAssignedJobs,
    /// maxRunners)`.
    pub(crate) fn desired(&self, forge: &Forge) -> usize {
        (self.min_runners + forge.queued() + forge.running()).min(self.max_runners)
    }

    /// The `EphemeralRunnerSet` controller's reconcile: finished runners are
    /// deleted as they finish ([`Scaler::observe`]), so every runner left
    /// counts (pending, idle, busy).
    fn reconcile(&mut self, forge: &mut Forge, now: Clock) {
        let desired = self.desired(forge);
        let have = forge.working();
        if have < desired {
            let room = self.max_runners.saturating_sub(forge.alive());
            for _ in 0..(desired - have).min(room) {
                let _ = forge.create(now, None, self.memory);
            }
        } else if have > desired {
            let mut surplus = have - desired;
            // Pending ones first, then running ones, each oldest first (ids
            // are in creation order); one running a job is refused.
            let mut idle: Vec<usize> = forge.idle_runners().collect();
            idle.sort_unstable();
            let candidates: Vec<usize> = forge.booting_runners().chain(idle).collect();
            for r in candidates {
                if surplus == 0 {
                    break;
                }
                if forge.runners[r].state != State::Busy && forge.delete(now, r).is_ok() {
                    surplus -= 1;
                }
            }
        }
    }
}

impl Scaler for Arc {
    fn name(&self) -> &'static str {
        "ARC"
    }

    fn webhooks(&self) -> bool {
        false
    }

    fn scale_set(&self) -> bool {
        true
    }

    fn observe(&mut self, forge: &mut Forge, now: Clock, obs: Obs) -> bool {
        if let Obs::Completed { runner, .. } = obs {
            let _ = forge.delete(now, runner);
        }
        true
    }

    fn act(&mut self, forge: &mut Forge, now: Clock, events: bool) {
        // Every message (a job assigned, started, completed) and every
        // change of a runner (online, finished) reconciles at once.
        let resync = now >= self.next;
        if resync {
            self.next = next_after(now, self.resync);
        }
        if events || resync {
            self.reconcile(forge, now);
        }
    }

    fn next_wakeup(&self) -> Clock {
        self.next
    }
}
