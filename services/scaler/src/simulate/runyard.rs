//! runyard's policy in virtual time: the forge's webhooks are folded into a
//! `World` through the same reducer the engine uses, `policy::decide` runs on
//! every event and every tick, and its decisions change the World the way
//! the engine's operations do (here they finish in no time).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runyard_events::{
    Body, Conclusion, Event, Forge as ForgeKind, JobKey, JobObserved, JobStatus, RunnerCreated,
    RunnerDeleted, RunnerFailed, RunnerOnline, RunnerRef, claim_key, instance_name,
};

use super::Scaler;
use super::forge::{Forge, Obs, State};
use crate::core::listing::{self, Finding, Listing, Sightings};
use crate::core::policy::{self, Decision, Knobs, PoolSpec};
use crate::core::world::{Clock, JobId, Phase, Runner, World, create_backoff};
use crate::forges::ForgeRunner;

/// The pool every simulated job goes to.
pub(crate) const POOL: &str = "linux-x64";
const HOST: &str = "github.com";
const LABELS: [&str; 3] = ["self-hosted", "linux", "x64"];

/// The engine's timers that matter here.
#[derive(Debug, Clone)]
pub(crate) struct Timers {
    /// Policy period when no event arrives.
    pub tick: Duration,
    /// Forge listing period: the only way the engine learns a runner is
    /// online (zero: at once).
    pub sync_interval: Duration,
    /// Two idle readings this far apart before an idle runner goes.
    pub busy_confirmation: Duration,
    /// First back-off after a failed create.
    pub create_backoff: Duration,
    /// Longest back-off.
    pub create_backoff_max: Duration,
}

/// The engine's view and bookkeeping, minus the IO.
#[derive(Debug)]
pub(crate) struct Runyard {
    world: World,
    pools: Vec<PoolSpec>,
    knobs: Knobs,
    timers: Timers,
    next_tick: Clock,
    next_sync: Clock,
    next_prune: Clock,
    sync_now: bool,
    /// Forge runner → runner name.
    names: HashMap<usize, String>,
    /// Runner name → its current forge instance.
    instances: HashMap<String, usize>,
    last_idle_check: HashMap<String, Clock>,
    /// The forge listing's second-sighting counts.
    sightings: Sightings,
    free_counter: u64,
    rng: StdRng,
}

fn ts(t: Clock) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(t.subsec_nanos()).unwrap_or(0),
    }
}

fn job_id(j: usize) -> JobId {
    JobId {
        forge: ForgeKind::Github,
        instance: HOST.into(),
        job_id: j as u64 + 1,
    }
}

fn job_key(id: &JobId) -> JobKey {
    JobKey {
        forge: id.forge as i32,
        instance: id.instance.clone(),
        job_id: id.job_id,
    }
}

fn rref(name: &str) -> RunnerRef {
    RunnerRef {
        pool: POOL.into(),
        name: name.into(),
        pool_id: String::new(),
        provider: "sim".into(),
        forge: ForgeKind::Github as i32,
        instance: HOST.into(),
    }
}

impl Runyard {
    /// A scaler owning one pool; `seed` drives the retry jitter.
    pub(crate) fn new(
        pool: PoolSpec,
        knobs: Knobs,
        timers: Timers,
        seed: u64,
        start: Clock,
    ) -> Self {
        Self {
            world: World::default(),
            pools: vec![pool],
            knobs,
            timers,
            next_tick: start,
            next_sync: start,
            next_prune: start,
            sync_now: false,
            names: HashMap::new(),
            instances: HashMap::new(),
            last_idle_check: HashMap::new(),
            sightings: Sightings::default(),
            free_counter: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Folds an event in, as the engine does (with its retry jitter).
    fn apply(&mut self, now: Clock, body: Body) {
        let event = Event {
            id: String::new(),
            occurred_at: Some(ts(now)),
            received_at: Some(ts(now)),
            source: None,
            body: Some(body),
        };
        let (base, max) = (self.timers.create_backoff, self.timers.create_backoff_max);
        let jitter = 0.75 + self.rng.random::<f64>() * 0.5;
        self.world.apply(&event, now, move |attempt| {
            create_backoff(base, max, attempt).mul_f64(jitter)
        });
    }

    fn observe_job(&mut self, forge: &Forge, now: Clock, j: usize, status: JobStatus) {
        let job = &forge.jobs[j];
        let runner_name = job
            .runner
            .filter(|_| status != JobStatus::Queued)
            .and_then(|r| self.names.get(&r).cloned())
            .unwrap_or_default();
        let id = job_id(j);
        let body = Body::JobObserved(JobObserved {
            job: Some(job_key(&id)),
            project: "acme/app".into(),
            project_id: 1,
            run_attempt: 1,
            name: format!("job {}", id.job_id),
            workflow_name: "ci".into(),
            labels: LABELS.iter().map(|l| (*l).to_owned()).collect(),
            status: status as i32,
            conclusion: if status == JobStatus::Completed {
                Conclusion::Success as i32
            } else {
                Conclusion::Unspecified as i32
            },
            runner_name,
            r#ref: "main".into(),
            created_at: Some(ts(job.work.queued_at)),
            started_at: job.started_at.map(ts),
            completed_at: job.completed_at.map(ts),
            ..JobObserved::default()
        });
        self.apply(now, body);
    }

    /// The forge listing, read by the engine's own [`listing::diff`]: busy
    /// runners are marked assigned there, booting ones listed online get
    /// `RunnerOnline`, and a registration no runner owns is removed at the
    /// second listing showing it.
    fn sync(&mut self, forge: &mut Forge, now: Clock) {
        let mut listed: Vec<ForgeRunner> = self
            .instances
            .iter()
            .filter_map(|(name, &id)| {
                let state = forge.runners[id].state;
                matches!(state, State::Idle | State::Busy).then(|| ForgeRunner {
                    id: id as u64,
                    name: name.clone(),
                    online: true,
                    busy: state == State::Busy,
                    paused: false,
                    running_jobs: Vec::new(),
                })
            })
            .collect();
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        let listing = Listing {
            pool: POOL,
            scope: POOL,
            restart_stopped: false,
            instances: None,
            forge: Some(&listed),
        };
        // Operations finish in no time here: none is ever under way.
        let findings = listing::diff(
            &mut self.world,
            &listing,
            &|_| false,
            &mut self.sightings,
            &mut HashSet::new(),
        );
        for finding in findings {
            match finding {
                Finding::Online { name } => self.apply(
                    now,
                    Body::RunnerOnline(RunnerOnline {
                        runner: Some(rref(&name)),
                        source: "forge_list".into(),
                    }),
                ),
                Finding::Orphan {
                    forge_id: Some(id), ..
                } => {
                    // One running a job is not listed as an orphan; a
                    // delete refused all the same is tried at a later
                    // listing.
                    if let Ok(id) = usize::try_from(id) {
                        let _ = forge.delete(now, id);
                    }
                }
                // Without a provider listing nothing is interrupted, gone
                // or stopped; a runner's registration is its instance.
                _ => {}
            }
        }
    }

    fn decide(&mut self, forge: &mut Forge, now: Clock) {
        let decisions = policy::decide(
            &self.pools,
            &self.world,
            &|_| true,
            &|_| false,
            now,
            &self.knobs,
        );
        for d in decisions {
            self.execute(forge, now, d);
        }
    }

    /// One create attempt: the provider makes the instance (or fails).
    fn provision(&mut self, forge: &mut Forge, now: Clock, name: &str, attempt: u32) {
        let made_for = self
            .world
            .runners
            .get(name)
            .and_then(|r| r.job.as_ref())
            .and_then(|j| usize::try_from(j.job_id).ok())
            .map(|n| n - 1);
        let (id, ok) = forge.create(now, made_for);
        self.names.insert(id, name.to_owned());
        self.instances.insert(name.to_owned(), id);
        let body = if ok {
            Body::RunnerCreated(RunnerCreated {
                runner: Some(rref(name)),
                provider_id: name.to_owned(),
                forge_runner_id: Some(id as u64),
                attempt,
                status: "running".into(),
            })
        } else {
            Body::RunnerFailed(RunnerFailed {
                runner: Some(rref(name)),
                reason: "create_failed".into(),
                error: "the provider failed".into(),
                attempt,
                given_up: false,
                job: None,
            })
        };
        self.apply(now, body);
    }

    fn provisional(
        &mut self,
        name: &str,
        job: Option<JobId>,
        run_attempt: u32,
        key: &str,
        now: Clock,
    ) {
        self.world.runners.insert(
            name.to_owned(),
            Runner::requested(name, POOL, job, run_attempt, key, now),
        );
    }

    /// The forge said the runner runs a job (a refused delete, a busy
    /// reading): the engine's `Local::Busy`.
    fn mark_busy(&mut self, name: &str) {
        if let Some(r) = self.world.runners.get_mut(name) {
            r.found_busy();
        }
    }

    /// Removes the runner's instance; `false` when the forge refused
    /// (busy).
    fn remove(&mut self, forge: &mut Forge, now: Clock, name: &str) -> bool {
        match self.instances.get(name) {
            Some(&id) => forge.delete(now, id).is_ok(),
            None => true,
        }
    }

    fn execute(&mut self, forge: &mut Forge, now: Clock, decision: Decision) {
        match decision {
            Decision::Create {
                pool,
                job,
                run_attempt,
            } => {
                let key = claim_key(job.forge, &job.instance, job.job_id, run_attempt);
                let name = instance_name(&pool, &key);
                self.provisional(&name, Some(job), run_attempt, &key, now);
                self.provision(forge, now, &name, 1);
            }
            Decision::CreateIdle { pool } | Decision::Replace { pool } => {
                self.free_counter += 1;
                let key = format!("free.sim.{}", self.free_counter);
                let name = instance_name(&pool, &key);
                self.provisional(&name, None, 0, &key, now);
                self.provision(forge, now, &name, 1);
            }
            Decision::Retry { name } => {
                let Some(r) = self.world.runners.get_mut(&name) else {
                    return;
                };
                let attempt = r.retrying(now);
                self.provision(forge, now, &name, attempt);
            }
            Decision::GiveUp { name } => {
                let Some(r) = self.world.runners.get(&name) else {
                    return;
                };
                let body = Body::RunnerFailed(RunnerFailed {
                    runner: Some(rref(&name)),
                    reason: "gave_up".into(),
                    error: format!("no runner after {} attempts", r.attempts),
                    attempt: r.attempts,
                    given_up: true,
                    job: r.job.as_ref().map(job_key),
                });
                self.apply(now, body);
            }
            Decision::Reap { name } => {
                let Some(r) = self.world.runners.get(&name) else {
                    return;
                };
                let (attempts, job) = (r.attempts, r.job.as_ref().map(job_key));
                if !self.remove(forge, now, &name) {
                    self.mark_busy(&name);
                    return;
                }
                let body = Body::RunnerFailed(RunnerFailed {
                    runner: Some(rref(&name)),
                    reason: "bootstrap_timeout".into(),
                    error: "not online in time".into(),
                    attempt: attempts,
                    given_up: false,
                    job,
                });
                self.apply(now, body);
            }
            Decision::Delete { name, reason } => {
                let Some(r) = self.world.runners.get(&name) else {
                    return;
                };
                let failed = r.phase == Phase::Failed;
                if !failed && !self.remove(forge, now, &name) {
                    self.mark_busy(&name);
                    return;
                }
                self.apply(
                    now,
                    Body::RunnerDeleted(RunnerDeleted {
                        runner: Some(rref(&name)),
                        reason: reason.into(),
                    }),
                );
            }
            Decision::ConfirmIdle { name } => self.confirm_idle(forge, now, &name),
        }
    }

    /// The engine's idle confirmation: at most two forge readings per
    /// window; after a window of idle readings, delete (refused if busy).
    fn confirm_idle(&mut self, forge: &mut Forge, now: Clock, name: &str) {
        let window = self.timers.busy_confirmation;
        if self
            .last_idle_check
            .get(name)
            .is_some_and(|t| now.saturating_sub(*t) < window / 2)
        {
            return;
        }
        let Some(r) = self.world.runners.get(name) else {
            return;
        };
        if r.forge_runner_id.is_none() {
            return;
        }
        self.last_idle_check.insert(name.to_owned(), now);
        let confirmed = r
            .idle_confirmed_from
            .is_some_and(|from| now.saturating_sub(from) >= window);
        let busy = self
            .instances
            .get(name)
            .is_some_and(|&id| forge.runners[id].state == State::Busy);
        if busy {
            self.mark_busy(name);
            return;
        }
        if !confirmed {
            if let Some(r) = self.world.runners.get_mut(name) {
                r.found_idle(now);
            }
            return;
        }
        if !self.remove(forge, now, name) {
            self.mark_busy(name);
            return;
        }
        self.apply(
            now,
            Body::RunnerDeleted(RunnerDeleted {
                runner: Some(rref(name)),
                reason: "idle_timeout".into(),
            }),
        );
    }

    /// Forgets what can no longer change a decision: completed jobs whose
    /// runner is gone and deleted runners whose job is no longer queued.
    /// (The engine keeps them for `lookback`; the policy reads them only
    /// through a live runner or a queued job, so the decisions are the
    /// same, and the World stays small enough to decide every tick.)
    fn prune(&mut self) {
        let world = &mut self.world;
        let queued: std::collections::HashSet<JobId> = world
            .jobs
            .values()
            .filter(|j| j.is_queued())
            .map(|j| j.id.clone())
            .collect();
        world.runners.retain(|_, r| {
            r.phase != Phase::Deleted || r.job.as_ref().is_some_and(|j| queued.contains(j))
        });
        let runners = &world.runners;
        world.jobs.retain(|_, j| {
            j.status != JobStatus::Completed
                || j.runner_name
                    .as_ref()
                    .and_then(|n| runners.get(n))
                    .is_some_and(|r| r.phase != Phase::Deleted)
        });
        let live = &world.runners;
        self.last_idle_check.retain(|n, _| live.contains_key(n));
    }
}

fn next_after(now: Clock, period: Duration) -> Clock {
    let p = period.as_nanos().max(1);
    let n = now.as_nanos() / p + 1;
    Duration::from_nanos(u64::try_from(n * p).unwrap_or(u64::MAX))
}

impl Scaler for Runyard {
    fn name(&self) -> &'static str {
        "runyard"
    }

    fn webhooks(&self) -> bool {
        true
    }

    fn observe(&mut self, forge: &mut Forge, now: Clock, obs: Obs) -> bool {
        match obs {
            Obs::Queued(j) | Obs::Rediscovered(j) => {
                self.observe_job(forge, now, j, JobStatus::Queued);
            }
            Obs::Started { job, .. } => self.observe_job(forge, now, job, JobStatus::InProgress),
            Obs::Completed { job, .. } => self.observe_job(forge, now, job, JobStatus::Completed),
            // No event says a runner came online: the engine sees it in
            // the next forge listing (at once when that is switched off).
            Obs::Online(_) => {
                let at_once = self.timers.sync_interval.is_zero();
                self.sync_now |= at_once;
                return at_once;
            }
        }
        true
    }

    fn act(&mut self, forge: &mut Forge, now: Clock, events: bool) {
        let mut wake = events;
        if self.sync_now || (!self.timers.sync_interval.is_zero() && now >= self.next_sync) {
            self.sync(forge, now);
            self.sync_now = false;
            if !self.timers.sync_interval.is_zero() && now >= self.next_sync {
                self.next_sync = next_after(now, self.timers.sync_interval);
            }
            wake = true;
        }
        if now >= self.next_tick {
            self.next_tick = next_after(now, self.timers.tick);
            wake = true;
        }
        if wake {
            self.decide(forge, now);
        }
        if now >= self.next_prune {
            self.prune();
            self.next_prune = next_after(now, Duration::from_secs(60));
        }
    }

    fn next_wakeup(&self) -> Clock {
        if self.timers.sync_interval.is_zero() {
            self.next_tick
        } else {
            self.next_tick.min(self.next_sync)
        }
    }
}
