//! The engine's decision-making as a step function: [`Core`] holds what the
//! engine knows and has under way (the world, the operations in flight, the
//! pools this replica owns, the jobs said unserved, the listings'
//! sightings) and turns each input — an event, an operation's outcome, a
//! listing, a round of the policy — at a time given by the caller into
//! [`Effect`]s: operations to start and events to publish, as data. The
//! engine feeds it and carries the effects out; a test feeds it and looks
//! at them, stepping the clock itself.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use runyard_events::{
    Body, Event, Forge, JobKey, JobStatus, JobUnserved, Source, claim_key, instance_name,
};

use crate::core::listing::{self, Finding, Listing, Sightings};
use crate::core::policy::{self, Decision, Knobs, PoolSpec, PoolStatus};
use crate::core::world::{Clock, Job, JobId, Phase, Runner, World, create_backoff};
use crate::provider::Instance;

/// The wait before a failed create's next attempt: `base × 2^(n-1)`, capped
/// at `max`, times a jitter factor.
#[derive(Clone)]
pub struct Backoff {
    /// The first wait.
    pub base: Duration,
    /// The longest.
    pub max: Duration,
    /// The factor each wait is multiplied by (the engine's is random in
    /// 0.75..1.25, the simulation's seeded, a test's fixed).
    pub jitter: Arc<dyn Fn() -> f64 + Send + Sync>,
}

impl std::fmt::Debug for Backoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backoff")
            .field("base", &self.base)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Backoff {
    /// The wait after attempt `attempt` failed.
    pub fn after(&self, attempt: u32) -> Duration {
        create_backoff(self.base, self.max, attempt).mul_f64((self.jitter)())
    }
}

/// What the core is set up with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The pools as the policy sees them, in configuration order.
    pub pools: Vec<PoolSpec>,
    /// Each pool's id (UUIDv5 of the controller and its name), by name.
    pub pool_ids: HashMap<String, String>,
    /// This replica's id (part of the keys of runners made for no job).
    pub replica: String,
    /// The policy's knobs.
    pub knobs: Knobs,
    /// An idle runner is read idle twice this far apart before it goes.
    pub busy_confirmation: Duration,
    /// The wait before a failed create is tried again.
    pub backoff: Backoff,
    /// Whether queued GitLab jobs' tags are looked up (a GitLab client is
    /// configured).
    pub lookup_labels: bool,
}

/// Facts an operation brings back that are not events (they come from the
/// forge's lagging view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    /// The forge says the runner is running a job (these, when it names
    /// them: GitLab).
    Busy(Vec<u64>),
    /// The forge says it is idle.
    Idle,
    /// The create waited this long before the runner was registered (for a
    /// create slot, or for a spent GitHub budget): its bootstrap time
    /// starts after that.
    Waited(Duration),
}

/// Something for the engine to do. Every variant but [`Effect::Assigned`]
/// is an operation, already counted in flight under [`Effect::op`] until
/// its outcome is folded back ([`Core::done`], [`Core::abandoned`],
/// [`Core::labels`]).
#[derive(Debug, Clone)]
pub enum Effect {
    /// Read a queued GitLab job's tags (operation `labels:<job id>`).
    Labels {
        /// The job.
        job: JobId,
        /// Its project id.
        project: u64,
    },
    /// Claim `job` and create runner `name` for it (the runner is in the
    /// world, `requested`, from now on).
    Create {
        /// Pool.
        pool: String,
        /// The job.
        job: Job,
        /// The runner's name.
        name: String,
        /// The claim it is made under.
        claim_key: String,
    },
    /// Create runner `name` for no job in particular.
    CreateFree {
        /// Pool.
        pool: String,
        /// The runner's name.
        name: String,
        /// The key its name is made from.
        key: String,
        /// `min_idle` or `replacement`.
        reason: &'static str,
    },
    /// Make attempt `attempt` of runner `name`, whose last one failed.
    Retry {
        /// Pool.
        pool: String,
        /// The runner's name.
        name: String,
        /// The job it is for (sized for it), when it has one.
        job: Option<Job>,
        /// The attempt.
        attempt: u32,
    },
    /// Give the runner's job up: no more attempts.
    GiveUp {
        /// The runner.
        runner: Runner,
    },
    /// Remove a runner that never came online in time.
    Reap {
        /// The runner.
        runner: Runner,
    },
    /// Remove a runner.
    Delete {
        /// The runner.
        runner: Runner,
        /// Why (the policy's word).
        reason: &'static str,
    },
    /// Read whether an idle runner past its idle timeout stays idle, and
    /// remove it when the reading confirms an earlier one.
    ConfirmIdle {
        /// The runner.
        runner: Runner,
        /// The forge read it idle a confirmation window ago already.
        confirmed: bool,
    },
    /// Publish that a queued job gets no runner (operation
    /// `unserved:<event id>`).
    Unserved {
        /// The job.
        job: Job,
        /// `no_matching_pool` or `runner_group`.
        reason: &'static str,
        /// The same in plain words.
        detail: String,
        /// The `JobUnserved` event.
        event: Box<Event>,
    },
    /// Record that runner `name` of `pool` took `job` (not an operation:
    /// nothing comes back).
    Assigned {
        /// Pool.
        pool: String,
        /// The runner's name.
        name: String,
        /// The job.
        job: JobKey,
    },
}

impl Effect {
    /// The name of the operation it is carried out under (`None` for
    /// [`Effect::Assigned`]).
    pub fn op(&self) -> Option<String> {
        match self {
            Self::Labels { job, .. } => Some(labels_op(job)),
            Self::Create { name, .. }
            | Self::CreateFree { name, .. }
            | Self::Retry { name, .. } => Some(name.clone()),
            Self::GiveUp { runner }
            | Self::Reap { runner }
            | Self::Delete { runner, .. }
            | Self::ConfirmIdle { runner, .. } => Some(runner.name.clone()),
            Self::Unserved { event, .. } => Some(format!("unserved:{}", event.id)),
            Self::Assigned { .. } => None,
        }
    }
}

/// What one round of the policy came to.
#[derive(Debug, Clone, Default)]
pub struct Round {
    /// The policy's decisions, by name (`create`, `retry`, ...), each
    /// whether or not it led to an effect.
    pub decisions: Vec<&'static str>,
    /// What to do, in order.
    pub effects: Vec<Effect>,
    /// Every pool's numbers after the round.
    pub status: Vec<PoolStatus>,
}

/// What a removed pool's listing asks for (see [`Core::listed_removed`]).
#[derive(Debug, Clone, Default)]
pub struct Removed {
    /// Instances to delete (operation `orphan:<name>`), each with whether
    /// the log still counts its runner alive (then it is recorded deleted).
    pub orphans: Vec<(Instance, bool)>,
    /// Runners the log counts alive that the listing no longer shows, to
    /// record deleted (operation: the runner's name).
    pub gone: Vec<String>,
}

/// The engine's bookkeeping: every input in, effects out, the time an
/// argument.
#[derive(Debug)]
pub struct Core {
    settings: Settings,
    world: World,
    /// Operations under way, by name (at most one per name).
    ops: HashSet<String>,
    /// Pools whose lease this replica holds.
    owned: HashSet<String>,
    /// Jobs already said to be unserved, with the run attempt said (said
    /// once per attempt).
    unserved: HashMap<JobId, u32>,
    /// When each idle runner was last read from the forge.
    last_idle_check: HashMap<String, Clock>,
    /// Runners made for no job so far (part of their keys).
    free_counter: u64,
    /// GitLab jobs whose tags could not be read (not asked again until
    /// [`Core::retry_labels`], to stay within the API budget).
    label_failures: HashSet<JobId>,
    /// Listing mismatches seen (acted on at the second sighting).
    sightings: Sightings,
    /// Runners whose stopped instance was started once (stopped again, they
    /// are replaced).
    restarted: HashSet<String>,
}

impl Core {
    /// A core that knows nothing yet and owns no pool.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            world: World::default(),
            ops: HashSet::new(),
            owned: HashSet::new(),
            unserved: HashMap::new(),
            last_idle_check: HashMap::new(),
            free_counter: 0,
            label_failures: HashSet::new(),
            sightings: Sightings::default(),
            restarted: HashSet::new(),
        }
    }

    /// What is known.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> &[PoolSpec] {
        &self.settings.pools
    }

    /// Whether this replica holds `pool`'s lease, as last told.
    pub fn owns(&self, pool: &str) -> bool {
        self.owned.contains(pool)
    }

    /// Tells whether this replica holds `pool`'s lease.
    pub fn own(&mut self, pool: &str, owned: bool) {
        if !owned {
            self.owned.remove(pool);
        } else if !self.owned.contains(pool) {
            self.owned.insert(pool.to_owned());
        }
    }

    /// Whether an operation named `name` is under way.
    pub fn in_flight(&self, name: &str) -> bool {
        self.ops.contains(name)
    }

    /// How many operations are under way.
    pub fn in_flight_count(&self) -> usize {
        self.ops.len()
    }

    /// Counts an operation the engine starts of its own (a listing) in
    /// flight.
    pub fn begin(&mut self, name: String) {
        self.ops.insert(name);
    }

    /// Ends an operation that brings nothing back to fold in (a listing,
    /// whose result goes to [`Core::listed`]).
    pub fn end(&mut self, name: &str) {
        self.ops.remove(name);
    }

    /// Folds in an event (from the log, or published by an operation) at
    /// `now`. A job seen started on a runner of an owned pool that had not
    /// taken one yet yields [`Effect::Assigned`].
    pub fn observe(&mut self, event: &Event, now: Clock) -> Vec<Effect> {
        let assigned_before = match &event.body {
            Some(Body::JobObserved(j)) => self
                .world
                .runners
                .get(&j.runner_name)
                .is_some_and(|r| r.phase >= Phase::Assigned && !r.runs_unnamed_job()),
            _ => true,
        };
        let backoff = &self.settings.backoff;
        self.world
            .apply(event, now, |attempt| backoff.after(attempt));
        // A job started on one of our runners: record the assignment (the
        // pool's owner does, once; the id is deterministic either way).
        if !assigned_before
            && let Some(Body::JobObserved(j)) = &event.body
            && j.status() == JobStatus::InProgress
            && !j.runner_name.is_empty()
            && let Some(r) = self.world.runners.get(&j.runner_name)
            && r.phase == Phase::Assigned
            && self.owns(&r.pool)
            && self.spec(&r.pool).is_some()
            && let Some(job) = j.job.clone()
        {
            return vec![Effect::Assigned {
                pool: r.pool.clone(),
                name: r.name.clone(),
                job,
            }];
        }
        Vec::new()
    }

    /// Folds back operation `name`'s outcome at `now`: the events it
    /// published and what the forge said.
    pub fn done(
        &mut self,
        name: &str,
        events: &[Event],
        local: Option<Local>,
        now: Clock,
    ) -> Vec<Effect> {
        self.ops.remove(name);
        let mut effects = Vec::new();
        for ev in events {
            effects.extend(self.observe(ev, now));
        }
        let instance = self
            .world
            .runners
            .get(name)
            .and_then(|r| self.spec(&r.pool))
            .map(|p| (p.forge, p.instance.clone()));
        let jobs = &self.world.jobs;
        if let Some(r) = self.world.runners.get_mut(name) {
            match local {
                Some(Local::Busy(running)) => {
                    r.found_busy();
                    r.removal_after = Some(now + self.settings.busy_confirmation);
                    // The jobs the forge names keep it until they complete
                    // (one whose completion was seen is the forge lagging).
                    if let Some((forge, instance)) = instance {
                        for job_id in running {
                            let id = JobId {
                                forge,
                                instance: instance.clone(),
                                job_id,
                            };
                            if jobs
                                .get(&id)
                                .is_none_or(|j| j.status != JobStatus::Completed)
                            {
                                r.busy_with.insert(id);
                            }
                        }
                    }
                }
                Some(Local::Idle) => r.found_idle(now),
                Some(Local::Waited(waited)) => {
                    r.attempt_started_at += waited;
                }
                None => {}
            }
        }
        effects
    }

    /// A create `name` that turned out not to be ours (its claim is held
    /// for another runner, or its job already started): the provisional
    /// runner is forgotten, and the job, when it says so, gets no runner.
    pub fn abandoned(&mut self, name: &str, job: Option<&JobId>) {
        self.ops.remove(name);
        if self
            .world
            .runners
            .get(name)
            .is_some_and(|r| r.phase == Phase::Requested)
        {
            self.world.runners.remove(name);
        }
        // Started elsewhere: no runner of ours, now or later.
        if let Some(job) = job
            && let Some(j) = self.world.jobs.get_mut(job)
            && j.status == JobStatus::Queued
        {
            j.status = JobStatus::InProgress;
            j.seen.0 = runyard_events::Stage::Running;
        }
    }

    /// A GitLab job's tags read (`None`: the lookup failed; it is not
    /// tried again before [`Core::retry_labels`]).
    pub fn labels(&mut self, job: JobId, labels: Option<Vec<String>>) {
        self.ops.remove(&labels_op(&job));
        match labels {
            Some(labels) => self.world.set_labels(&job, &labels),
            None => {
                self.label_failures.insert(job);
            }
        }
    }

    /// Lets the tags of jobs whose lookup failed be read again.
    pub fn retry_labels(&mut self) {
        self.label_failures.clear();
    }

    /// A configured pool's listing: its findings (see
    /// [`crate::core::listing`]), each counted in flight under
    /// [`Finding::op`].
    pub fn listed(&mut self, listing: &Listing<'_>) -> Vec<Finding> {
        let ops = &self.ops;
        let findings = listing::diff(
            &mut self.world,
            listing,
            &|n| ops.contains(n),
            &mut self.sightings,
            &mut self.restarted,
        );
        for f in &findings {
            self.ops.insert(f.op());
        }
        findings
    }

    /// The listing of a pool removed from the configuration (id `scope`,
    /// name `pool`): nothing configured owns its instances, so each goes at
    /// the second listing showing it, and its runners the log still counts
    /// alive that no listing shows are recorded deleted at the second
    /// listing without them.
    pub fn listed_removed(&mut self, scope: &str, pool: &str, instances: &[Instance]) -> Removed {
        let mut seen_now = HashSet::new();
        let mut removed = Removed::default();
        let alive = |w: &World, name: &str| {
            w.runners
                .get(name)
                .is_some_and(|r| r.pool == pool && r.is_alive())
        };
        for i in instances {
            let op = format!("orphan:{}", i.name);
            if self.ops.contains(&op)
                || self.ops.contains(&i.name)
                || !self
                    .sightings
                    .sighted(scope, "orphan", &i.name, &mut seen_now)
            {
                continue;
            }
            let counted = alive(&self.world, &i.name);
            self.ops.insert(op);
            removed.orphans.push((i.clone(), counted));
        }
        let listed: HashSet<&str> = instances.iter().map(|i| i.name.as_str()).collect();
        let gone: Vec<String> = self
            .world
            .runners
            .values()
            .filter(|r| r.pool == pool && r.is_alive())
            .filter(|r| !listed.contains(r.name.as_str()) && !self.ops.contains(&r.name))
            .map(|r| r.name.clone())
            .collect();
        for name in gone {
            if !self.sightings.sighted(scope, "gone", &name, &mut seen_now) {
                continue;
            }
            self.ops.insert(name.clone());
            removed.gone.push(name);
        }
        self.sightings.settle(scope, &seen_now);
        removed
    }

    /// Forgets finished jobs and deleted runners older than `keep` (and
    /// what is kept about them).
    pub fn prune(&mut self, now: Clock, keep: Duration) {
        self.world.prune(now, keep);
        let runners = &self.world.runners;
        self.restarted.retain(|n| runners.contains_key(n));
    }

    /// Forgets, whatever their age, what can no longer change a decision
    /// (see [`World::forget_settled`]), and what is kept about it.
    pub fn forget_settled(&mut self) {
        self.world.forget_settled();
        let runners = &self.world.runners;
        self.last_idle_check.retain(|n, _| runners.contains_key(n));
        self.restarted.retain(|n| runners.contains_key(n));
    }

    /// One round at `now`: the tags to read, the policy's decisions for the
    /// owned pools turned into operations, every pool's numbers, and the
    /// queued jobs no pool can take said unserved.
    pub fn decide(&mut self, now: Clock) -> Round {
        let mut round = Round::default();
        self.lookup_labels(&mut round.effects);
        let specs = &self.settings.pools;
        let queues = policy::queues(&self.world, specs, self.settings.knobs.balance);
        let decisions = if self.owned.is_empty() {
            Vec::new()
        } else {
            let (ops, owned) = (&self.ops, &self.owned);
            policy::decide_queued(
                specs,
                &self.world,
                &queues,
                &|p| owned.contains(p),
                &|n| ops.contains(n),
                now,
                &self.settings.knobs,
            )
        };
        // The policy runs on every event and most decide nothing: then
        // this round's queues give the pools' numbers too.
        let unchanged = decisions
            .is_empty()
            .then(|| policy::status_of(specs, &self.world, &queues));
        drop(queues);
        for d in decisions {
            round.decisions.push(decision_name(&d));
            if let Some(effect) = self.execute(d, now) {
                round.effects.push(effect);
            }
        }
        round.status = unchanged.unwrap_or_else(|| {
            policy::status(
                &self.settings.pools,
                &self.world,
                self.settings.knobs.balance,
            )
        });
        self.report_unserved(now, &mut round.effects);
        round
    }

    /// Every queued or waiting job and why it has no runner yet
    /// ([`super::queue`]).
    pub fn queued_jobs(&self, now: Clock) -> Vec<super::queue::QueuedJob> {
        let specs = &self.settings.pools;
        let queues = policy::queues(&self.world, specs, self.settings.knobs.balance);
        super::queue::queued_jobs(specs, &self.world, &queues, &self.settings.knobs, now)
    }

    fn spec(&self, pool: &str) -> Option<&PoolSpec> {
        self.settings.pools.iter().find(|p| p.name == pool)
    }

    /// The tags to read of queued GitLab jobs this replica may serve.
    fn lookup_labels(&mut self, effects: &mut Vec<Effect>) {
        if !self.settings.lookup_labels {
            return;
        }
        let serves: HashSet<&str> = self
            .settings
            .pools
            .iter()
            .filter(|s| s.forge == Forge::Gitlab && self.owned.contains(&s.name))
            .map(|s| s.instance.as_str())
            .collect();
        if serves.is_empty() {
            return;
        }
        let wanted: Vec<(JobId, u64)> = self
            .world
            .jobs
            .values()
            .filter(|j| {
                j.is_queued() && j.labels.is_none() && serves.contains(j.id.instance.as_str())
            })
            .filter(|j| {
                !self.label_failures.contains(&j.id) && !self.ops.contains(&labels_op(&j.id))
            })
            .map(|j| (j.id.clone(), j.project_id))
            .collect();
        for (job, project) in wanted {
            self.ops.insert(labels_op(&job));
            effects.push(Effect::Labels { job, project });
        }
    }

    /// The operation a decision becomes, when it still applies.
    fn execute(&mut self, decision: Decision, now: Clock) -> Option<Effect> {
        let effect = match decision {
            Decision::Create {
                pool,
                job,
                run_attempt,
            } => {
                let key = claim_key(job.forge, &job.instance, job.job_id, run_attempt);
                let name = instance_name(&pool, &key);
                if self.ops.contains(&name) {
                    return None;
                }
                self.spec(&pool)?;
                let j = self.world.jobs.get(&job)?.clone();
                // Counted at once, so the next decision sees it.
                self.world.runners.insert(
                    name.clone(),
                    Runner::requested(&name, &pool, Some(job), run_attempt, &key, now),
                );
                Effect::Create {
                    pool,
                    job: j,
                    name,
                    claim_key: key,
                }
            }
            Decision::CreateIdle { pool } => self.create_free(pool, "min_idle", now)?,
            Decision::Replace { pool } => self.create_free(pool, "replacement", now)?,
            Decision::Retry { name } => {
                let runner = self.runner(&name)?;
                let job = runner
                    .job
                    .as_ref()
                    .and_then(|j| self.world.jobs.get(j))
                    .cloned();
                let attempt = self
                    .world
                    .runners
                    .get_mut(&name)
                    .map_or(runner.attempts + 1, |r| r.retrying(now));
                Effect::Retry {
                    pool: runner.pool,
                    name,
                    job,
                    attempt,
                }
            }
            Decision::GiveUp { name } => Effect::GiveUp {
                runner: self.runner(&name)?,
            },
            Decision::Reap { name } => Effect::Reap {
                runner: self.runner(&name)?,
            },
            Decision::Delete { name, reason } => Effect::Delete {
                runner: self.runner(&name)?,
                reason,
            },
            Decision::ConfirmIdle { name } => {
                // Read the forge at most twice per confirmation window.
                let window = self.settings.busy_confirmation;
                if self
                    .last_idle_check
                    .get(&name)
                    .is_some_and(|t| now.saturating_sub(*t) < window / 2)
                {
                    return None;
                }
                let runner = self.runner(&name)?;
                self.last_idle_check.insert(name, now);
                let confirmed = runner
                    .idle_confirmed_from
                    .is_some_and(|from| now.saturating_sub(from) >= window);
                Effect::ConfirmIdle { runner, confirmed }
            }
        };
        if let Some(op) = effect.op() {
            self.ops.insert(op);
        }
        Some(effect)
    }

    /// A runner for no job in particular (`min_idle`, or a replacement).
    fn create_free(&mut self, pool: String, reason: &'static str, now: Clock) -> Option<Effect> {
        let id = self.settings.pool_ids.get(&pool)?;
        self.free_counter += 1;
        let key = format!("free.{id}.{}.{}", self.settings.replica, self.free_counter);
        let name = instance_name(&pool, &key);
        self.world.runners.insert(
            name.clone(),
            Runner::requested(&name, &pool, None, 0, &key, now),
        );
        Some(Effect::CreateFree {
            pool,
            name,
            key,
            reason,
        })
    }

    /// Runner `name`, when it and its pool exist.
    fn runner(&self, name: &str) -> Option<Runner> {
        let runner = self.world.runners.get(name)?;
        self.spec(&runner.pool)?;
        Some(runner.clone())
    }

    /// Says once, for each queued job of a served instance whose labels no
    /// pool covers, that it gets no runner: a `JobUnserved` event (its id is
    /// the same on every replica, so the log holds it once). The job holds
    /// nothing meanwhile: no runner waits for it until the forge's queue
    /// limit.
    fn report_unserved(&mut self, now: Clock, effects: &mut Vec<Effect>) {
        let specs = &self.settings.pools;
        let mut found = Vec::new();
        // Runs on every decision over every queued job: the common answer
        // (said already, or some pool takes it) costs no allocation.
        for job in self.world.jobs.values().filter(|j| j.is_queued()) {
            let Some(labels) = job.labels.as_deref() else {
                continue;
            };
            if self.unserved.get(&job.id) == Some(&job.run_attempt)
                || specs.iter().any(|p| policy::takes(p, job))
                || policy::targets_scale_set(specs, job)
                || !specs
                    .iter()
                    .any(|p| p.forge == job.id.forge && p.instance == job.id.instance)
            {
                continue;
            }
            let of_instance = || {
                specs
                    .iter()
                    .filter(|p| p.forge == job.id.forge && p.instance == job.id.instance)
            };
            let shut_out: Vec<&str> = of_instance()
                .filter(|p| policy::labels_match(labels, &p.labels))
                .map(|p| p.name.as_str())
                .collect();
            let (reason, detail) = if shut_out.is_empty() {
                let pools: Vec<String> = of_instance()
                    .map(|p| format!("{} {:?}", p.name, p.labels))
                    .collect();
                (
                    "no_matching_pool",
                    format!(
                        "no pool's labels cover the job's {labels:?} (pools: {})",
                        pools.join(", ")
                    ),
                )
            } else {
                (
                    "runner_group",
                    format!(
                        "the pools whose labels match ({}) are in runner groups that do not admit {}",
                        shut_out.join(", "),
                        job.project
                    ),
                )
            };
            found.push((job.clone(), reason, detail));
        }
        let world = &self.world;
        self.unserved.retain(|id, _| world.jobs.contains_key(id));
        for (job, reason, detail) in found {
            self.unserved.insert(job.id.clone(), job.run_attempt);
            let event = Event {
                id: runyard_events::ids::unserved(
                    job.id.forge,
                    &job.id.instance,
                    job.id.job_id,
                    job.run_attempt,
                    reason,
                ),
                occurred_at: Some(timestamp(now)),
                received_at: Some(timestamp(now)),
                source: Some(Source {
                    forge: job.id.forge as i32,
                    instance: job.id.instance.clone(),
                    producer: "scaler".into(),
                    ..Default::default()
                }),
                body: Some(Body::JobUnserved(JobUnserved {
                    job: Some(job_key(&job.id)),
                    run_attempt: job.run_attempt,
                    project: job.project.clone(),
                    name: job.name.clone(),
                    labels: job.labels.clone().unwrap_or_default(),
                    reason: reason.into(),
                    detail: detail.clone(),
                })),
            };
            let effect = Effect::Unserved {
                job,
                reason,
                detail,
                event: Box::new(event),
            };
            if let Some(op) = effect.op() {
                self.ops.insert(op);
            }
            effects.push(effect);
        }
    }
}

/// The operation that reads `job`'s tags.
fn labels_op(job: &JobId) -> String {
    format!("labels:{}", job.job_id)
}

/// A job's key on the wire.
pub fn job_key(j: &JobId) -> JobKey {
    JobKey {
        forge: j.forge as i32,
        instance: j.instance.clone(),
        job_id: j.job_id,
    }
}

fn timestamp(t: Clock) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(t.subsec_nanos()).unwrap_or(0),
    }
}

/// A decision's name in `runyard_scaler_decisions_total`.
fn decision_name(d: &Decision) -> &'static str {
    match d {
        Decision::Create { .. } => "create",
        Decision::CreateIdle { .. } => "create_idle",
        Decision::Replace { .. } => "replace",
        Decision::Retry { .. } => "retry",
        Decision::GiveUp { .. } => "give_up",
        Decision::Reap { .. } => "reap",
        Decision::Delete { .. } => "delete",
        Decision::ConfirmIdle { .. } => "confirm_idle",
    }
}

#[cfg(test)]
mod tests;
