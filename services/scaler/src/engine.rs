//! The thin shell around the policy: folds events into the world, holds
//! pool leases, runs the policy for the pools it owns and carries the
//! decisions out as operations off the loop (each bounded by a timeout), whose
//! outcomes come back as events.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runyard_bus::{Bus, TraceParent};
use runyard_events::{
    Body, Event, Forge, JobKey, JobStatus, RunnerAssigned, RunnerCreated, RunnerDeleted,
    RunnerFailed, RunnerOnline, RunnerRef, RunnerRequested, Source, claim_key, forge_token,
    instance_name, runner_event_id_for, timestamp,
};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{PoolConfig, Timers};
use crate::forges::{ForgeRunner, Forges, Unregistered};
use crate::kv::{Claim, Coordination};
use crate::metrics::ScalerMetrics;
use crate::policy::{self, Decision, Knobs, PoolSpec, PoolStatus};
use crate::provider::{CreateRequest, Instance, Provider};
use crate::sizing::Allocator;
use crate::world::{Clock, JobId, Phase, Runner, World, create_backoff};

/// A pool with everything needed to act on it.
#[derive(Debug)]
pub struct Pool {
    /// Its configuration.
    pub config: PoolConfig,
    /// What the policy sees.
    pub spec: PoolSpec,
    /// UUIDv5(controller id, pool name).
    pub id: String,
    /// Its provider.
    pub provider: Provider,
    /// Provider name.
    pub provider_name: String,
}

/// What every operation shares.
#[derive(Debug)]
pub struct Shared {
    /// Pools by name.
    pub pools: HashMap<String, Arc<Pool>>,
    /// Their specs, in configuration order.
    pub specs: Vec<PoolSpec>,
    /// The event log.
    pub bus: Bus,
    /// Leases and claims.
    pub coord: Coordination,
    /// Forge clients.
    pub forges: Forges,
    /// Right-sizing.
    pub allocator: Allocator,
    /// The projection (a job already started gets no runner).
    pub db: Option<PgPool>,
    /// Timers.
    pub timers: Timers,
    /// Metrics.
    pub metrics: ScalerMetrics,
    /// What `/v1/pools` shows.
    pub status: RwLock<Vec<PoolStatus>>,
    /// Until when the projection is taken as unreachable (checks skipped).
    pub db_down_until: std::sync::Mutex<Option<Instant>>,
    /// Creates under way at once.
    pub create_slots: tokio::sync::Semaphore,
    /// The instance metadata API's tokens and secrets (set when
    /// `RUNYARD_SCALER_INSTANCE_TOKEN_KEY` is).
    pub metadata: Option<crate::metadata::Metadata>,
}

/// Wall clock now.
pub fn now() -> Clock {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Something an operation reports back to the loop.
#[derive(Debug)]
enum Outcome {
    /// Events published (to fold in at once) and local facts.
    Done {
        name: String,
        events: Vec<Event>,
        local: Option<Local>,
    },
    /// A create that turned out not to be ours (claim held for another
    /// runner, or the job already started): forget the provisional runner.
    Abandoned { name: String, job: Option<JobId> },
    /// A GitLab job's tags (its hooks carry only the runner's).
    Labels {
        job: JobId,
        labels: Option<Vec<String>>,
    },
    /// A pool's listing.
    Listed {
        pool: String,
        instances: Option<Vec<Instance>>,
        forge: Option<Vec<ForgeRunner>>,
    },
}

/// Facts that are not events (they come from the forge's lagging view).
#[derive(Debug)]
enum Local {
    /// The forge says the runner is running a job.
    Busy,
    /// The forge says it is idle.
    Idle,
}

/// A held lease.
#[derive(Debug, Clone, Copy)]
struct Lease {
    revision: u64,
    valid_until: Instant,
}

/// The loop's state.
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    world: World,
    ops: HashSet<String>,
    leases: HashMap<String, Lease>,
    outcomes_tx: mpsc::Sender<Outcome>,
    outcomes: mpsc::Receiver<Outcome>,
    /// Listing mismatches seen per name (acted on at the second sighting).
    suspects: HashMap<String, u32>,
    last_idle_check: HashMap<String, Clock>,
    tasks: tokio::task::JoinSet<()>,
    idle_counter: u64,
    /// GitLab jobs whose tags could not be read (not asked again until the
    /// next sync, to stay within the API budget).
    label_failures: HashSet<JobId>,
}

impl Engine {
    /// A new engine.
    pub fn new(shared: Arc<Shared>) -> Self {
        let (outcomes_tx, outcomes) = mpsc::channel(4096);
        Self {
            shared,
            world: World::default(),
            ops: HashSet::new(),
            leases: HashMap::new(),
            outcomes_tx,
            outcomes,
            suspects: HashMap::new(),
            last_idle_check: HashMap::new(),
            tasks: tokio::task::JoinSet::new(),
            idle_counter: 0,
            label_failures: HashSet::new(),
        }
    }

    fn backoff(&self) -> impl Fn(u32) -> Duration + use<> {
        let (base, max) = (
            self.shared.timers.create_backoff,
            self.shared.timers.create_backoff_max,
        );
        move |attempt| {
            let d = create_backoff(base, max, attempt);
            d.mul_f64(0.75 + rand::random::<f64>() * 0.5)
        }
    }

    fn apply(&mut self, event: &Event) {
        let backoff = self.backoff();
        if let Some(Body::JobObserved(j)) = &event.body
            && j.status() == JobStatus::InProgress
            && let Some(created) = j.created_at.as_ref()
            && let Some(started) = j.started_at.as_ref()
        {
            let wait = (started.seconds - created.seconds) as f64
                + f64::from(started.nanos - created.nanos) / 1e9;
            if wait >= 0.0 {
                self.shared.metrics.queue_wait.observe(wait);
            }
        }
        let assigned_before = match &event.body {
            Some(Body::JobObserved(j)) => self
                .world
                .runners
                .get(&j.runner_name)
                .is_some_and(|r| r.phase >= Phase::Assigned),
            _ => true,
        };
        self.world.apply(event, now(), backoff);
        // A job started on one of our runners: record the assignment (the
        // pool's owner does, once; the id is deterministic either way).
        if !assigned_before
            && let Some(Body::JobObserved(j)) = &event.body
            && j.status() == JobStatus::InProgress
            && !j.runner_name.is_empty()
            && let Some(r) = self.world.runners.get(&j.runner_name)
            && r.phase == Phase::Assigned
            && self.owns(&r.pool)
            && let Some(p) = self.shared.pools.get(&r.pool).cloned()
            && let Some(job) = j.job.clone()
        {
            let shared = self.shared.clone();
            let name = r.name.clone();
            let body = Body::RunnerAssigned(RunnerAssigned {
                runner: Some(rref(&p, &name)),
                job: Some(job),
            });
            self.tasks.spawn(async move {
                publish(&shared, &p, &name, body).await;
            });
        }
    }

    /// Runs until `stop`: `events` carries the log (from `caught_up` on the
    /// replica acts).
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        caught_up: tokio::sync::watch::Receiver<bool>,
        stop: CancellationToken,
    ) {
        let timers = self.shared.timers.clone();
        let mut tick = tokio::time::interval(timers.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lease_tick = tokio::time::interval(timers.lease_ttl / 4);
        lease_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sync_tick = tokio::time::interval(timers.sync_interval);
        sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut prune_tick = tokio::time::interval(Duration::from_secs(600));
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                ev = events.recv() => {
                    let Some(ev) = ev else { break };
                    self.apply(&ev);
                    // Take what else has arrived before deciding once.
                    for _ in 0..4096 {
                        match events.try_recv() {
                            Ok(ev) => self.apply(&ev),
                            Err(_) => break,
                        }
                    }
                }
                Some(outcome) = self.outcomes.recv() => {
                    self.on_outcome(outcome);
                    for _ in 0..4096 {
                        match self.outcomes.try_recv() {
                            Ok(outcome) => self.on_outcome(outcome),
                            Err(_) => break,
                        }
                    }
                }
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => continue,
                _ = tick.tick() => {}
                _ = lease_tick.tick() => {
                    if *caught_up.borrow() {
                        self.renew_leases().await;
                    }
                    continue;
                }
                _ = sync_tick.tick() => {
                    self.label_failures.clear();
                    self.sync();
                    continue;
                }
                _ = prune_tick.tick() => { self.world.prune(now(), timers.lookback); continue; }
            }
            self.decide();
        }
        // Finish what is under way (bounded), then let the pools go.
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        let coord = &self.shared.coord;
        let releases = std::mem::take(&mut self.leases)
            .into_iter()
            .map(|(pool, lease)| async move { coord.release(&pool, lease.revision).await });
        // Bounded: with NATS gone the leases simply expire.
        let _ =
            tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(releases)).await;
    }

    fn owns(&self, pool: &str) -> bool {
        self.leases
            .get(pool)
            .is_some_and(|l| l.valid_until > Instant::now())
    }

    async fn renew_leases(&mut self) {
        let ttl = self.shared.timers.lease_ttl;
        let started = Instant::now();
        let coord = &self.shared.coord;
        let leases = &self.leases;
        // All pools at once, bounded together: a slow NATS must not hold the
        // loop for a call per pool.
        let calls = self.shared.pools.keys().map(|name| {
            let held = leases.get(name).map(|l| l.revision);
            async move {
                let r = tokio::time::timeout(ttl / 4, coord.lease(name, held)).await;
                (name.clone(), held, r)
            }
        });
        let results = futures::future::join_all(calls).await;
        for (name, held, result) in results {
            match result {
                Ok(Ok(Some(revision))) => {
                    if held.is_none() {
                        tracing::info!(pool = %name, "pool lease taken");
                    }
                    self.leases.insert(
                        name,
                        Lease {
                            revision,
                            // Counted from before the call: never trust a
                            // lease longer than the bucket keeps it.
                            valid_until: started + ttl.mul_f64(0.8),
                        },
                    );
                }
                Ok(Ok(None)) => {
                    if self.leases.remove(&name).is_some() {
                        tracing::warn!(pool = %name, "pool lease lost");
                    }
                }
                Ok(Err(error)) => tracing::warn!(%error, pool = %name, "lease renewal failed"),
                Err(_) => tracing::warn!(pool = %name, "lease renewal timed out"),
            }
        }
        for name in self.shared.pools.keys() {
            let label = crate::metrics::PoolLabel { pool: name.clone() };
            let held = i64::from(self.owns(name));
            self.shared
                .metrics
                .leases_held
                .get_or_create(&label)
                .set(held);
        }
    }

    /// Looks up the tags of queued GitLab jobs this replica may serve.
    fn lookup_labels(&mut self) {
        let Some(gitlab) = self.shared.forges.gitlab.clone() else {
            return;
        };
        let serves: HashSet<String> = self
            .shared
            .specs
            .iter()
            .filter(|s| s.forge == Forge::Gitlab && self.owns(&s.name))
            .map(|s| s.instance.clone())
            .collect();
        if serves.is_empty() {
            return;
        }
        let wanted: Vec<(JobId, u64)> = self
            .world
            .jobs
            .values()
            .filter(|j| j.is_queued() && j.labels.is_none() && serves.contains(&j.id.instance))
            .filter(|j| !self.label_failures.contains(&j.id))
            .map(|j| (j.id.clone(), j.project_id))
            .collect();
        for (job, project) in wanted {
            let key = format!("labels:{}", job.job_id);
            if self.ops.contains(&key) {
                continue;
            }
            let gitlab = gitlab.clone();
            self.spawn(key, async move {
                let labels = match gitlab.get_job(project, job.job_id).await {
                    Ok(j) => Some(j.tag_list),
                    Err(error) => {
                        tracing::warn!(%error, job_id = job.job_id, "reading the job's tags failed");
                        None
                    }
                };
                Outcome::Labels { job, labels }
            });
        }
    }

    fn decide(&mut self) {
        self.lookup_labels();
        let now = now();
        let knobs = Knobs {
            idle_backoff: self.shared.timers.idle_backoff,
            create_attempts: self.shared.timers.create_attempts,
        };
        let owned: HashSet<String> = self
            .shared
            .pools
            .keys()
            .filter(|p| self.owns(p))
            .cloned()
            .collect();
        let decisions = if owned.is_empty() {
            Vec::new()
        } else {
            let ops = &self.ops;
            policy::decide(
                &self.shared.specs,
                &self.world,
                &|p| owned.contains(p),
                &|n| ops.contains(n),
                now,
                &knobs,
            )
        };
        for d in decisions {
            self.execute(d, now);
        }
        let status = policy::status(&self.shared.specs, &self.world);
        self.shared.metrics.record_pools(&status);
        if let Ok(mut s) = self.shared.status.write() {
            *s = status;
        }
    }

    fn spawn(&mut self, name: String, op: impl Future<Output = Outcome> + Send + 'static) {
        self.ops.insert(name);
        let tx = self.outcomes_tx.clone();
        self.tasks.spawn(async move {
            let outcome = op.await;
            let _ = tx.send(outcome).await;
        });
    }

    fn execute(&mut self, decision: Decision, now: Clock) {
        self.shared
            .metrics
            .decisions
            .get_or_create(&crate::metrics::DecisionLabel {
                decision: decision_name(&decision),
            })
            .inc();
        match decision {
            Decision::Create {
                pool,
                job,
                run_attempt,
            } => {
                let key = claim_key(job.forge, &job.instance, job.job_id, run_attempt);
                let name = instance_name(&pool, &key);
                if self.ops.contains(&name) {
                    return;
                }
                let Some(p) = self.shared.pools.get(&pool).cloned() else {
                    return;
                };
                let Some(j) = self.world.jobs.get(&job).cloned() else {
                    return;
                };
                // Counted at once, so the next decision sees it.
                self.world.runners.insert(
                    name.clone(),
                    Runner::requested(&name, &pool, Some(job), run_attempt, &key, now),
                );
                let shared = self.shared.clone();
                self.spawn(name.clone(), async move {
                    create_for_job(shared, p, j, name, key).await
                });
            }
            Decision::CreateIdle { pool } => self.create_free(&pool, "min_idle", now),
            Decision::Replace { pool } => self.create_free(&pool, "replacement", now),
            Decision::Retry { name } => {
                let Some((p, runner)) = self.runner_and_pool(&name) else {
                    return;
                };
                let job = runner
                    .job
                    .as_ref()
                    .and_then(|j| self.world.jobs.get(j))
                    .cloned();
                if let Some(r) = self.world.runners.get_mut(&name) {
                    r.phase = Phase::Requested;
                    r.attempts += 1;
                    r.attempt_started_at = now;
                }
                let attempt = runner.attempts + 1;
                let shared = self.shared.clone();
                self.spawn(name.clone(), async move {
                    let sizing = match &job {
                        Some(j) => shared.allocator.size(j, &p.config.flavors).await.flavor,
                        None => 0,
                    };
                    let events = provision(&shared, &p, &name, sizing, attempt).await;
                    Outcome::Done {
                        name,
                        events,
                        local: None,
                    }
                });
            }
            Decision::GiveUp { name } => {
                let Some((p, runner)) = self.runner_and_pool(&name) else {
                    return;
                };
                let shared = self.shared.clone();
                self.spawn(name.clone(), async move {
                    let body = Body::RunnerFailed(RunnerFailed {
                        runner: Some(rref(&p, &name)),
                        reason: "gave_up".into(),
                        error: format!("no runner after {} attempts", runner.attempts),
                        attempt: runner.attempts,
                        given_up: true,
                        job: runner.job.as_ref().map(job_key),
                    });
                    tracing::error!(runner = %name, attempts = runner.attempts, "giving the job up");
                    record(&shared, &p, name, body).await
                });
            }
            Decision::Reap { name } => {
                let Some((p, runner)) = self.runner_and_pool(&name) else {
                    return;
                };
                let shared = self.shared.clone();
                self.spawn(name.clone(), async move {
                    match remove(&shared, &p, &runner).await {
                        Ok(Unregistered::Busy) => Outcome::Done {
                            name,
                            events: Vec::new(),
                            local: Some(Local::Busy),
                        },
                        Ok(Unregistered::Gone) => {
                            let body = Body::RunnerFailed(RunnerFailed {
                                runner: Some(rref(&p, &name)),
                                reason: "bootstrap_timeout".into(),
                                error: format!(
                                    "not online within {:?}",
                                    p.config.bootstrap_timeout
                                ),
                                attempt: runner.attempts,
                                given_up: false,
                                job: runner.job.as_ref().map(job_key),
                            });
                            record(&shared, &p, name, body).await
                        }
                        Err(()) => Outcome::Done {
                            name,
                            events: Vec::new(),
                            local: None,
                        },
                    }
                });
            }
            Decision::Delete { name, reason } => {
                let Some((p, runner)) = self.runner_and_pool(&name) else {
                    return;
                };
                let shared = self.shared.clone();
                self.spawn(name.clone(), async move {
                    let removed = if runner.phase == Phase::Failed {
                        Ok(Unregistered::Gone)
                    } else {
                        remove(&shared, &p, &runner).await
                    };
                    match removed {
                        Ok(Unregistered::Gone) => {
                            let body = Body::RunnerDeleted(RunnerDeleted {
                                runner: Some(rref(&p, &name)),
                                reason: reason.into(),
                            });
                            record(&shared, &p, name, body).await
                        }
                        Ok(Unregistered::Busy) => Outcome::Done {
                            name,
                            events: Vec::new(),
                            local: Some(Local::Busy),
                        },
                        Err(()) => Outcome::Done {
                            name,
                            events: Vec::new(),
                            local: None,
                        },
                    }
                });
            }
            Decision::ConfirmIdle { name } => {
                // Read the forge at most twice per confirmation window.
                let window = self.shared.timers.busy_confirmation;
                if self
                    .last_idle_check
                    .get(&name)
                    .is_some_and(|t| now.saturating_sub(*t) < window / 2)
                {
                    return;
                }
                let Some((p, runner)) = self.runner_and_pool(&name) else {
                    return;
                };
                self.last_idle_check.insert(name.clone(), now);
                let confirmed = runner
                    .idle_confirmed_from
                    .is_some_and(|from| now.saturating_sub(from) >= window);
                let shared = self.shared.clone();
                self.spawn(name.clone(), async move {
                    confirm_idle(shared, p, runner, confirmed).await
                });
            }
        }
    }

    /// A runner for no job in particular (`min_idle`, or a replacement).
    fn create_free(&mut self, pool: &str, reason: &'static str, now: Clock) {
        let Some(p) = self.shared.pools.get(pool).cloned() else {
            return;
        };
        self.idle_counter += 1;
        let key = format!(
            "free.{}.{}.{}",
            p.id,
            self.shared.coord.replica(),
            self.idle_counter
        );
        let name = instance_name(pool, &key);
        self.world.runners.insert(
            name.clone(),
            Runner::requested(&name, pool, None, 0, &key, now),
        );
        let shared = self.shared.clone();
        self.spawn(name.clone(), async move {
            create_free(shared, p, name, key, reason).await
        });
    }

    fn runner_and_pool(&self, name: &str) -> Option<(Arc<Pool>, Runner)> {
        let runner = self.world.runners.get(name)?.clone();
        let pool = self.shared.pools.get(&runner.pool)?.clone();
        Some((pool, runner))
    }

    fn on_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Done {
                name,
                events,
                local,
            } => {
                self.ops.remove(&name);
                for ev in &events {
                    self.apply(ev);
                }
                let now = now();
                if let Some(r) = self.world.runners.get_mut(&name) {
                    match local {
                        Some(Local::Busy) => {
                            if r.phase < Phase::Assigned {
                                r.phase = Phase::Assigned;
                            }
                            r.idle_confirmed_from = None;
                        }
                        Some(Local::Idle) => {
                            r.idle_confirmed_from.get_or_insert(now);
                        }
                        None => {}
                    }
                }
            }
            Outcome::Abandoned { name, job } => {
                self.ops.remove(&name);
                if self
                    .world
                    .runners
                    .get(&name)
                    .is_some_and(|r| r.phase == Phase::Requested)
                {
                    self.world.runners.remove(&name);
                }
                // Started elsewhere: no runner of ours, now or later.
                if let Some(job) = job
                    && let Some(j) = self.world.jobs.get_mut(&job)
                    && j.status == JobStatus::Queued
                {
                    j.status = JobStatus::InProgress;
                }
            }
            Outcome::Labels { job, labels } => {
                self.ops.remove(&format!("labels:{}", job.job_id));
                match labels {
                    Some(labels) => self.world.set_labels(&job, &labels),
                    None => {
                        self.label_failures.insert(job);
                    }
                }
            }
            Outcome::Listed {
                pool,
                instances,
                forge,
            } => {
                self.ops.remove(&format!("sync:{pool}"));
                self.on_listed(&pool, instances.as_deref(), forge.as_deref());
            }
        }
    }

    /// Lists every owned pool's instances and forge runners (off the loop).
    fn sync(&mut self) {
        let pools: Vec<Arc<Pool>> = self
            .shared
            .pools
            .values()
            .filter(|p| self.owns(&p.config.name))
            .cloned()
            .collect();
        for p in pools {
            let key = format!("sync:{}", p.config.name);
            if self.ops.contains(&key) {
                continue;
            }
            let shared = self.shared.clone();
            self.spawn(key, async move {
                let started = Instant::now();
                let instances = p.provider.list(&p.id).await;
                shared
                    .metrics
                    .provider_call(&p.provider_name, "list", started, instances.is_ok());
                let forge = shared.forges.list(&p.config).await;
                if let Err(error) = &forge {
                    tracing::warn!(%error, pool = %p.config.name, "listing forge runners failed");
                }
                Outcome::Listed {
                    pool: p.config.name.clone(),
                    instances: instances.ok(),
                    forge: forge.ok(),
                }
            });
        }
    }

    fn on_listed(
        &mut self,
        pool: &str,
        instances: Option<&[Instance]>,
        forge: Option<&[ForgeRunner]>,
    ) {
        let Some(p) = self.shared.pools.get(pool).cloned() else {
            return;
        };
        let known = |w: &World, name: &str| {
            w.runners
                .get(name)
                .is_some_and(|r| r.phase != Phase::Deleted)
        };
        let mut orphans: Vec<(String, Option<String>, Option<u64>)> = Vec::new();
        if let Some(instances) = instances {
            for i in instances {
                if !known(&self.world, &i.name) && !self.ops.contains(&i.name) {
                    orphans.push((i.name.clone(), Some(i.provider_id.clone()), None));
                }
            }
            // Runners the provider no longer has.
            let listed: HashSet<&str> = instances.iter().map(|i| i.name.as_str()).collect();
            let missing: Vec<Runner> = self
                .world
                .runners
                .values()
                .filter(|r| r.pool == pool)
                .filter(|r| matches!(r.phase, Phase::Created | Phase::Online | Phase::Assigned))
                .filter(|r| !listed.contains(r.name.as_str()) && !self.ops.contains(&r.name))
                .cloned()
                .collect();
            // Creates another replica (or an earlier life of this one)
            // began and never finished: adopt what the provider made, start
            // over where it made nothing.
            let interrupted: Vec<Runner> = self
                .world
                .runners
                .values()
                .filter(|r| r.pool == pool && r.phase == Phase::Requested)
                .filter(|r| !self.ops.contains(&r.name))
                .cloned()
                .collect();
            for r in interrupted {
                let key = format!("interrupted:{}", r.name);
                let seen = self.suspects.entry(key.clone()).or_default();
                *seen += 1;
                if *seen < 2 {
                    continue;
                }
                self.suspects.remove(&key);
                let listed_instance = instances.iter().find(|i| i.name == r.name).cloned();
                let forge_id = forge
                    .as_ref()
                    .and_then(|f| f.iter().find(|f| f.name == r.name))
                    .map(|f| f.id);
                let shared = self.shared.clone();
                let p = p.clone();
                let name = r.name.clone();
                self.spawn(name.clone(), async move {
                    let body = match (listed_instance, forge_id) {
                        (Some(i), Some(id)) => Body::RunnerCreated(RunnerCreated {
                            runner: Some(rref(&p, &name)),
                            provider_id: i.provider_id,
                            forge_runner_id: Some(id),
                            attempt: r.attempts,
                            status: i.status,
                        }),
                        (instance, forge_id) => {
                            // Half made: remove what there is, then retry.
                            if let Some(i) = instance {
                                let _ = p.provider.delete(&p.id, &i.provider_id).await;
                            }
                            if let Some(id) = forge_id {
                                let _ = shared.forges.unregister(&p.config, id).await;
                            }
                            Body::RunnerFailed(RunnerFailed {
                                runner: Some(rref(&p, &name)),
                                reason: "create_interrupted".into(),
                                error: "the create was interrupted".into(),
                                attempt: r.attempts,
                                given_up: false,
                                job: r.job.as_ref().map(job_key),
                            })
                        }
                    };
                    record(&shared, &p, name, body).await
                });
            }
            for r in missing {
                let seen = self.suspects.entry(format!("gone:{}", r.name)).or_default();
                *seen += 1;
                if *seen < 2 {
                    continue;
                }
                self.suspects.remove(&format!("gone:{}", r.name));
                let shared = self.shared.clone();
                let p = p.clone();
                let name = r.name.clone();
                self.spawn(name.clone(), async move {
                    // Its process ended (an ephemeral runner after its job) or
                    // the machine went: tidy the forge side, record it.
                    let _ = remove(&shared, &p, &r).await;
                    let body = if r.phase == Phase::Assigned {
                        Body::RunnerDeleted(RunnerDeleted {
                            runner: Some(rref(&p, &name)),
                            reason: "instance_gone".into(),
                        })
                    } else {
                        Body::RunnerFailed(RunnerFailed {
                            runner: Some(rref(&p, &name)),
                            reason: "provider_error".into(),
                            error: "instance disappeared before taking a job".into(),
                            attempt: r.attempts,
                            given_up: false,
                            job: r.job.as_ref().map(job_key),
                        })
                    };
                    record(&shared, &p, name, body).await
                });
            }
        }
        if let Some(forge) = forge {
            for f in forge {
                match self.world.runners.get_mut(&f.name) {
                    Some(r) if r.phase != Phase::Deleted => {
                        if r.forge_runner_id.is_none() {
                            r.forge_runner_id = Some(f.id);
                        }
                        if f.busy && r.phase < Phase::Assigned && r.phase != Phase::Failed {
                            r.phase = Phase::Assigned;
                        } else if f.online
                            && matches!(r.phase, Phase::Requested | Phase::Created)
                            && !self.ops.contains(&f.name)
                        {
                            let body = Body::RunnerOnline(RunnerOnline {
                                runner: Some(rref(&p, &f.name)),
                                source: "forge_list".into(),
                            });
                            let shared = self.shared.clone();
                            let p = p.clone();
                            let name = f.name.clone();
                            self.spawn(name.clone(), async move {
                                record(&shared, &p, name, body).await
                            });
                        }
                    }
                    _ if !f.busy && !self.ops.contains(&f.name) => {
                        orphans.push((f.name.clone(), None, Some(f.id)));
                    }
                    _ => {}
                }
            }
        }
        // An orphan is removed at its second sighting (two cycles), so a
        // create whose first event is still on its way is never mistaken.
        let mut seen_now = HashSet::new();
        for (name, provider_id, forge_id) in orphans {
            let key = format!("orphan:{name}");
            seen_now.insert(key.clone());
            let count = self.suspects.entry(key.clone()).or_default();
            *count += 1;
            if *count < 2 {
                continue;
            }
            self.suspects.remove(&key);
            let shared = self.shared.clone();
            let p = p.clone();
            let op = format!("orphan:{name}");
            self.spawn(op.clone(), async move {
                if let Some(id) = forge_id {
                    let _ = shared.forges.unregister(&p.config, id).await;
                }
                if let Some(id) = provider_id {
                    let started = Instant::now();
                    let r = p.provider.delete(&p.id, &id).await;
                    shared
                        .metrics
                        .provider_call(&p.provider_name, "delete", started, r.is_ok());
                }
                tracing::info!(runner = %name, pool = %p.config.name, "orphan removed");
                Outcome::Done {
                    name: op,
                    events: Vec::new(),
                    local: None,
                }
            });
        }
        self.suspects
            .retain(|k, _| !k.starts_with("orphan:") || seen_now.contains(k));
    }
}

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

fn job_key(j: &JobId) -> JobKey {
    JobKey {
        forge: j.forge as i32,
        instance: j.instance.clone(),
        job_id: j.job_id,
    }
}

fn rref(p: &Pool, name: &str) -> RunnerRef {
    RunnerRef {
        pool: p.config.name.clone(),
        name: name.to_owned(),
        pool_id: p.id.clone(),
        provider: p.provider_name.clone(),
        forge: p.spec.forge as i32,
        instance: p.spec.instance.clone(),
    }
}

/// Publishes a runner event and reports it as the operation's outcome.
async fn record(shared: &Shared, p: &Pool, name: String, body: Body) -> Outcome {
    let events = publish(shared, p, &name, body).await;
    Outcome::Done {
        name,
        events,
        local: None,
    }
}

/// Publishes a runner event (retrying a few times) and returns it to be
/// folded in. The id is deterministic, so a retry never doubles it.
async fn publish(shared: &Shared, p: &Pool, name: &str, body: Body) -> Vec<Event> {
    let id = runner_event_id_for(&body).unwrap_or_default();
    let at = timestamp(time::OffsetDateTime::now_utc());
    let event = Event {
        id,
        occurred_at: Some(at),
        received_at: Some(at),
        source: Some(Source {
            forge: p.spec.forge as i32,
            instance: p.spec.instance.clone(),
            delivery_id: String::new(),
            hook_id: String::new(),
            producer: "scaler".into(),
        }),
        body: Some(body),
    };
    let tp = TraceParent::new_root();
    for attempt in 0..5u32 {
        match shared.bus.publish_event(&event, &tp).await {
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, attempt, runner = %name, "publishing a runner event failed");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
    }
    vec![event]
}

/// Claims the job, checks it still waits, sizes it, records the request and
/// provisions the runner.
async fn create_for_job(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    job: crate::world::Job,
    name: String,
    key: String,
) -> Outcome {
    let abandon = |name: String, started: bool| Outcome::Abandoned {
        name,
        job: started.then(|| job.id.clone()),
    };
    match shared.coord.claim(&key, &name).await {
        Ok(Claim::Won) => {}
        // Ours from an earlier life (or a dead replica's): adopt it.
        Ok(Claim::Held(holder)) if holder == name => {}
        Ok(Claim::Held(holder)) => {
            tracing::info!(claim = %key, %holder, "job claimed by another runner");
            return abandon(name, false);
        }
        Err(error) => {
            tracing::warn!(%error, claim = %key, "claiming failed; will retry");
            return abandon(name, false);
        }
    }
    if already_started(&shared, &job.id).await {
        tracing::info!(job_id = job.id.job_id, "job already started; no runner");
        return abandon(name, true);
    }
    let sizing = shared.allocator.size(&job, &p.config.flavors).await;
    let flavor = &p.config.flavors[sizing.flavor];
    let body = Body::RunnerRequested(RunnerRequested {
        runner: Some(rref(&p, &name)),
        job: Some(job_key(&job.id)),
        run_attempt: job.run_attempt,
        claim_key: key,
        reason: "queued_job".into(),
        flavor: flavor.name.clone(),
        memory_bytes: flavor.memory.as_u64(),
        cpus: flavor.cpus,
        recommended_memory_limit_bytes: sizing.recommended_limit,
        allocator_unavailable: sizing.allocator_unavailable,
        workload_key: String::new(),
        labels: job.labels.clone().unwrap_or_default(),
        image: p.config.image.clone(),
    });
    let mut events = publish(&shared, &p, &name, body).await;
    events.extend(provision(&shared, &p, &name, sizing.flavor, 1).await);
    Outcome::Done {
        name,
        events,
        local: None,
    }
}

async fn create_free(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    name: String,
    key: String,
    reason: &'static str,
) -> Outcome {
    let flavor = &p.config.flavors[0];
    let body = Body::RunnerRequested(RunnerRequested {
        runner: Some(rref(&p, &name)),
        job: None,
        run_attempt: 0,
        claim_key: key,
        reason: reason.into(),
        flavor: flavor.name.clone(),
        memory_bytes: flavor.memory.as_u64(),
        cpus: flavor.cpus,
        recommended_memory_limit_bytes: None,
        allocator_unavailable: false,
        workload_key: String::new(),
        labels: Vec::new(),
        image: p.config.image.clone(),
    });
    let mut events = publish(&shared, &p, &name, body).await;
    events.extend(provision(&shared, &p, &name, 0, 1).await);
    Outcome::Done {
        name,
        events,
        local: None,
    }
}

/// True when the projection says the job is running or done. The
/// projection may lag or be down: then the log's view decides, and after a
/// failed check the next ones are skipped for a few seconds, so a database
/// outage never slows creates down.
async fn already_started(shared: &Shared, job: &JobId) -> bool {
    let Some(db) = &shared.db else {
        return false;
    };
    let down = |until: &mut Option<Instant>| until.is_some_and(|t| Instant::now() < t);
    if shared.db_down_until.lock().is_ok_and(|mut u| down(&mut u)) {
        return false;
    }
    let query = sqlx::query_scalar::<_, i16>(
        "SELECT status FROM jobs WHERE forge = $1 AND instance = $2 AND job_id = $3",
    )
    .bind(forge_token(job.forge))
    .bind(&job.instance)
    .bind(i64::try_from(job.job_id).unwrap_or(i64::MAX));
    match tokio::time::timeout(Duration::from_millis(500), query.fetch_optional(db)).await {
        Ok(Ok(status)) => status.is_some_and(|s| s >= 3),
        _ => {
            if let Ok(mut until) = shared.db_down_until.lock() {
                *until = Some(Instant::now() + Duration::from_secs(5));
            }
            false
        }
    }
}

/// One create attempt: register on the forge, create the instance. On
/// failure everything made is removed and `RunnerFailed` says why.
async fn provision(
    shared: &Shared,
    p: &Pool,
    name: &str,
    flavor: usize,
    attempt: u32,
) -> Vec<Event> {
    let flavor = &p.config.flavors[flavor.min(p.config.flavors.len() - 1)];
    // The semaphore is never closed; a closed one would only lift the bound.
    let _slot = shared.create_slots.acquire().await.ok();
    let reg = match shared.forges.register(&p.config, name).await {
        Ok(r) => r,
        Err(error) => {
            tracing::warn!(%error, runner = %name, attempt, "registering the runner failed");
            return fail(shared, p, name, attempt, "forge_error", &error.to_string()).await;
        }
    };
    let mut labels = p.config.labels.clone();
    labels.push(crate::forges::pool_label(&p.config.name));
    let req = CreateRequest {
        name: name.to_owned(),
        pool: p.config.name.clone(),
        pool_id: p.id.clone(),
        flavor: flavor.name.clone(),
        memory_bytes: flavor.memory.as_u64(),
        cpus: flavor.cpus,
        image: p.config.image.clone(),
        labels,
        jit_config: reg.jit_config,
        repo_url: repo_url(&p.config),
        runner_group: String::new(),
        extra_specs: p
            .config
            .extra_specs
            .as_ref()
            .and_then(|v| serde_json::to_value(v).ok())
            .unwrap_or_else(|| serde_json::json!({})),
        timeout: p.config.bootstrap_timeout,
    };
    let started = Instant::now();
    let created = tokio::time::timeout(p.config.bootstrap_timeout, p.provider.create(&req)).await;
    let created = match created {
        Ok(r) => r,
        Err(_) => Err(crate::provider::ProviderError::Timeout(
            p.config.bootstrap_timeout,
        )),
    };
    shared
        .metrics
        .provider_call(&p.provider_name, "create", started, created.is_ok());
    match created {
        Ok(instance) => {
            let body = Body::RunnerCreated(RunnerCreated {
                runner: Some(rref(p, name)),
                provider_id: instance.provider_id,
                forge_runner_id: Some(reg.runner_id),
                attempt,
                status: instance.status,
            });
            publish(shared, p, name, body).await
        }
        Err(error) => {
            tracing::warn!(%error, runner = %name, attempt, "creating the instance failed");
            // Nothing half-made stays: the instance (by name) and the
            // registration go.
            let _ = p.provider.delete(&p.id, name).await;
            let _ = shared.forges.unregister(&p.config, reg.runner_id).await;
            fail(
                shared,
                p,
                name,
                attempt,
                "create_failed",
                &error.to_string(),
            )
            .await
        }
    }
}

async fn fail(
    shared: &Shared,
    p: &Pool,
    name: &str,
    attempt: u32,
    reason: &str,
    error: &str,
) -> Vec<Event> {
    let body = Body::RunnerFailed(RunnerFailed {
        runner: Some(rref(p, name)),
        reason: reason.into(),
        error: error.chars().take(500).collect(),
        attempt,
        given_up: false,
        job: None,
    });
    publish(shared, p, name, body).await
}

fn repo_url(pool: &PoolConfig) -> String {
    let s = &pool.scope;
    let host = pool.instance.clone().unwrap_or_else(|| "github.com".into());
    match (&s.repo, &s.org, &s.enterprise) {
        (Some(r), _, _) => format!("https://{host}/{r}"),
        (_, Some(o), _) => format!("https://{host}/{o}"),
        (_, _, Some(e)) => format!("https://{host}/enterprises/{e}"),
        _ => format!("https://{host}"),
    }
}

/// Removes a runner: from the forge first (so it takes no job), then its
/// instance. `Busy` (nothing removed) when the forge says it runs a job.
async fn remove(shared: &Shared, p: &Pool, r: &Runner) -> Result<Unregistered, ()> {
    if let Some(id) = r.forge_runner_id {
        match shared.forges.unregister(&p.config, id).await {
            Ok(Unregistered::Busy) => return Ok(Unregistered::Busy),
            Ok(Unregistered::Gone) => {}
            Err(error) => {
                tracing::warn!(%error, runner = %r.name, "removing the forge runner failed");
                return Err(());
            }
        }
    }
    let target = r.provider_id.clone().unwrap_or_else(|| r.name.clone());
    let started = Instant::now();
    let deleted = p.provider.delete(&p.id, &target).await;
    shared
        .metrics
        .provider_call(&p.provider_name, "delete", started, deleted.is_ok());
    match deleted {
        Ok(()) => Ok(Unregistered::Gone),
        Err(error) => {
            tracing::warn!(%error, runner = %r.name, "deleting the instance failed");
            Err(())
        }
    }
}

/// One step of the idle confirmation: read the forge; after a full window
/// of idle readings, delete (the forge refuses with 422 if it turned busy).
async fn confirm_idle(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    r: Runner,
    window_passed: bool,
) -> Outcome {
    let name = r.name.clone();
    let done = |local| Outcome::Done {
        name: name.clone(),
        events: Vec::new(),
        local,
    };
    let Some(id) = r.forge_runner_id else {
        return done(None);
    };
    match shared.forges.runner(&p.config, id).await {
        Ok(Some(f)) if f.busy => return done(Some(Local::Busy)),
        Ok(_) if !window_passed => return done(Some(Local::Idle)),
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, runner = %name, "reading the forge runner failed");
            return done(None);
        }
    }
    match remove(&shared, &p, &r).await {
        Ok(Unregistered::Gone) => {
            let body = Body::RunnerDeleted(RunnerDeleted {
                runner: Some(rref(&p, &name)),
                reason: "idle_timeout".into(),
            });
            record(&shared, &p, name, body).await
        }
        Ok(Unregistered::Busy) => done(Some(Local::Busy)),
        Err(()) => done(None),
    }
}
