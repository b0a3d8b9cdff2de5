//! The thin shell around the core: holds pool leases, feeds what arrives
//! (events from the log, operations' outcomes, listings, ticks) into
//! [`Core`] at the wall-clock time, and carries the effects it returns out
//! as operations off the loop (each bounded by a timeout), whose outcomes
//! come back as events.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runyard_bus::TraceParent;
use runyard_events::{
    Body, Event, JobStatus, RunnerAssigned, RunnerCreated, RunnerDeleted, RunnerFailed,
    RunnerOnline, RunnerRef, forge_token,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::{PoolConfig, StoppedAction};
use crate::core::listing::{Finding, Listing};
use crate::core::policy::{Knobs, PoolSpec, PoolStatus};
use crate::core::step::{Backoff, Core, Effect, Local, Settings, job_key};
use crate::core::world::{Clock, JobId, Phase};
use crate::forges::{ForgeRunner, Unregistered};
use crate::io::Io;
use crate::metrics::ScalerMetrics;
use crate::progress::Progress;
use crate::provider::tools::ToolsCache;
use crate::provider::{Instance, Provider, ProviderError};

mod ops;
/// How old `/v1/queue`'s view may get before a round makes it again.
const QUEUE_EVERY: Duration = Duration::from_secs(1);

use ops::{
    RemoveFailed, confirm_idle, create_for_job, create_free, forget_secrets, pool_removed,
    provision, publish, record, remove, remove_orphan, stopped_instance,
};

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

impl Pool {
    /// Deletes the instance `target` (a provider id, or a name) of the pool
    /// id `pool_id` through this pool's provider, the call counted in
    /// `metrics`.
    pub(crate) async fn delete_instance(
        &self,
        metrics: &ScalerMetrics,
        pool_id: &str,
        target: &str,
    ) -> Result<(), ProviderError> {
        let started = Instant::now();
        let deleted = self.provider.delete(pool_id, target).await;
        metrics.provider_call(&self.provider_name, "delete", started, deleted.is_ok());
        deleted
    }
}

/// What the engine and its operations share: the IO handles, the pools,
/// what `/v1/pools` shows and the instances' secret store.
#[derive(Debug)]
pub struct Shared {
    /// The IO handles (also the retrier's, the reconciler's and the
    /// metadata API's).
    pub io: Arc<Io>,
    /// Pools by name.
    pub pools: Arc<HashMap<String, Arc<Pool>>>,
    /// Their specs, in configuration order.
    pub specs: Vec<PoolSpec>,
    /// What `/v1/pools` shows.
    pub status: RwLock<Vec<PoolStatus>>,
    /// What `/v1/queue` shows: the waiting jobs and why, as of a time.
    pub queue: RwLock<(Clock, Vec<crate::core::queue::QueuedJob>)>,
    /// How far the engine has got (`/v1/pools`' `engine`).
    pub progress: Progress,
    /// The instance metadata API's tokens and secrets (set when
    /// `RUNYARD_SCALER_INSTANCE_TOKEN_KEY` is).
    pub metadata: Option<crate::metadata::Metadata>,
    /// The pools whose lease this replica holds, and until when (the
    /// scale-set listeners hold a session only then).
    pub owned: crate::scaleset::listener::Owned,
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
    /// The listing of a pool id no configured pool has (a pool removed
    /// from the configuration), made through `host`'s provider.
    ListedRemoved {
        pool_id: String,
        host: String,
        instances: Option<Vec<Instance>>,
    },
}

impl Outcome {
    /// An operation `name` done that published nothing (what the forge
    /// said, if anything, in `local`).
    fn unpublished(name: String, local: Option<Local>) -> Self {
        Self::Done {
            name,
            events: Vec::new(),
            local,
        }
    }
}

/// A pool id the log's runner events name: what they said of its pool,
/// and when last.
#[derive(Debug, Clone)]
struct SeenPool {
    /// The pool, provider and forge of its runners (the name left empty).
    rref: RunnerRef,
    /// The latest event naming it.
    at: Clock,
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
    /// The bookkeeping that decides what to do.
    core: Core,
    leases: HashMap<String, Lease>,
    outcomes_tx: mpsc::Sender<Outcome>,
    outcomes: mpsc::Receiver<Outcome>,
    tasks: tokio::task::JoinSet<()>,
    /// GitHub's runner downloads (the `tools` external providers get).
    tools: Arc<ToolsCache>,
    /// Every pool id the log's runner events named within the lookback,
    /// configured or not: providers tag instances with their pool id, so
    /// orphans are found by listing each.
    seen_pools: HashMap<String, SeenPool>,
    /// Removed pools whose provider no configured pool uses (warned once).
    unreachable_pools: HashSet<String>,
    /// The trace each queued job's event carried: its runner's creation is
    /// a hop of that trace.
    traces: HashMap<JobId, TraceParent>,
}

/// An event read from the log, with the trace context it carried.
#[derive(Debug, Clone)]
pub struct Observed {
    /// Its stream sequence.
    pub seq: u64,
    /// The event.
    pub event: Event,
    /// Its `traceparent` header.
    pub traceparent: Option<String>,
}

impl Engine {
    /// A new engine.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self::register_pools(&shared);
        let (outcomes_tx, outcomes) = mpsc::channel(4096);
        let timers = &shared.io.timers;
        let core = Core::new(Settings {
            pools: shared.specs.clone(),
            pool_ids: shared
                .pools
                .iter()
                .map(|(name, p)| (name.clone(), p.id.clone()))
                .collect(),
            replica: shared.io.coord.replica().to_owned(),
            knobs: Knobs {
                idle_backoff: timers.idle_backoff,
                create_attempts: timers.create_attempts,
                balance: timers.balance,
            },
            busy_confirmation: timers.busy_confirmation,
            backoff: Backoff {
                base: timers.create_backoff,
                max: timers.create_backoff_max,
                jitter: Arc::new(|| 0.75 + rand::random::<f64>() * 0.5),
            },
            lookup_labels: shared.io.forges.gitlab.is_some(),
        });
        Self {
            shared,
            core,
            leases: HashMap::new(),
            outcomes_tx,
            outcomes,
            tasks: tokio::task::JoinSet::new(),
            tools: Arc::new(ToolsCache::default()),
            seen_pools: HashMap::new(),
            unreachable_pools: HashSet::new(),
            traces: HashMap::new(),
        }
    }

    /// Tells each pool's provider its extra specs (v0.1.1 external
    /// providers get them on every call).
    fn register_pools(shared: &Shared) {
        for p in shared.pools.values() {
            p.provider.register_pool(&p.id, p.config.extra_specs_json());
        }
    }

    /// Folds in an event read from the log, remembering the trace a queued
    /// job's event carried.
    fn observe(&mut self, observed: &Observed) {
        if let Some(Body::JobObserved(j)) = &observed.event.body
            && j.status() == JobStatus::Queued
            && let Some(key) = &j.job
            && let Some(tp) = observed.traceparent.as_deref().and_then(TraceParent::parse)
        {
            let id = JobId {
                forge: key.forge(),
                instance: key.instance.clone(),
                job_id: key.job_id,
            };
            self.traces.insert(id, tp);
        }
        self.sync_owned();
        let effects = self.core.observe(&observed.event, now());
        self.noted(&observed.event);
        self.start_all(effects);
        self.shared.progress.folded(observed.seq);
    }

    /// What the engine itself takes from an event folded into the core:
    /// the queue wait of a job that started, the pool id a runner event
    /// names.
    fn noted(&mut self, event: &Event) {
        if let Some(Body::JobObserved(j)) = &event.body
            && j.status() == JobStatus::InProgress
            && let Some(created) = j.created_at.as_ref()
            && let Some(started) = j.started_at.as_ref()
        {
            let wait = (started.seconds - created.seconds) as f64
                + f64::from(started.nanos - created.nanos) / 1e9;
            if wait >= 0.0 {
                self.shared.io.metrics.queue_wait.observe(wait);
            }
        }
        self.note_pool(event);
    }

    /// Remembers the pool id a runner event names.
    fn note_pool(&mut self, event: &Event) {
        let Some(rref) = event.body.as_ref().and_then(runyard_events::runner_ref) else {
            return;
        };
        if rref.pool_id.is_empty() {
            return;
        }
        let at = event
            .occurred_at
            .as_ref()
            .and_then(|t| u64::try_from(t.seconds).ok())
            .map_or_else(now, Duration::from_secs);
        let seen = self
            .seen_pools
            .entry(rref.pool_id.clone())
            .or_insert_with(|| SeenPool {
                rref: RunnerRef {
                    name: String::new(),
                    ..rref.clone()
                },
                at,
            });
        seen.at = seen.at.max(at);
    }

    /// Runs until `stop`: `events` carries the log (from `caught_up` on the
    /// replica acts).
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Observed>,
        caught_up: tokio::sync::watch::Receiver<bool>,
        stop: CancellationToken,
    ) {
        let timers = self.shared.io.timers.clone();
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
                    self.observe(&ev);
                    // Take what else has arrived before deciding once.
                    for _ in 0..4096 {
                        match events.try_recv() {
                            Ok(ev) => self.observe(&ev),
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
                    self.core.retry_labels();
                    self.sync();
                    continue;
                }
                _ = prune_tick.tick() => {
                    let now = now();
                    self.core.prune(now, timers.lookback);
                    let cutoff = now.saturating_sub(timers.lookback);
                    self.seen_pools.retain(|_, s| s.at >= cutoff);
                    let jobs = &self.core.world().jobs;
                    self.traces.retain(|j, _| jobs.contains_key(j));
                    continue;
                }
            }
            self.decide();
        }
        // Finish what is under way (bounded), then let the pools go.
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        let coord = &self.shared.io.coord;
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

    /// Tells the core which pools this replica holds the lease of now (a
    /// lease not renewed in time lapses between renewals).
    fn sync_owned(&mut self) {
        let pools = self.shared.pools.clone();
        for name in pools.keys() {
            let owned = self.owns(name);
            self.core.own(name, owned);
        }
    }

    async fn renew_leases(&mut self) {
        let ttl = self.shared.io.timers.lease_ttl;
        let started = Instant::now();
        let coord = &self.shared.io.coord;
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
        if let Ok(mut owned) = self.shared.owned.write() {
            *owned = self
                .leases
                .iter()
                .map(|(name, lease)| (name.clone(), lease.valid_until))
                .collect();
        }
        for name in self.shared.pools.keys() {
            let label = crate::metrics::PoolLabel { pool: name.clone() };
            let held = i64::from(self.owns(name));
            self.shared
                .io
                .metrics
                .leases_held
                .get_or_create(&label)
                .set(held);
        }
    }

    /// One round of the core at the wall-clock time: its decisions
    /// counted, its effects carried out, its numbers shown.
    fn decide(&mut self) {
        self.sync_owned();
        let round = self.core.decide(now());
        for &decision in &round.decisions {
            self.shared
                .io
                .metrics
                .decisions
                .get_or_create(&crate::metrics::DecisionLabel { decision })
                .inc();
        }
        self.start_all(round.effects);
        self.shared.io.metrics.record_pools(&round.status);
        let unix = i64::try_from(now().as_secs()).unwrap_or(i64::MAX);
        for status in &round.status {
            if let Some(set) = self.shared.io.forges.scale_sets.get(&status.name)
                && self.owns(&status.name)
            {
                let gap = set.check_count(status.queued + status.busy, unix);
                self.shared
                    .io
                    .metrics
                    .scale_set_unseen_jobs
                    .get_or_create(&crate::metrics::PoolLabel {
                        pool: status.name.clone(),
                    })
                    .set(gap);
            }
        }
        if let Ok(mut s) = self.shared.status.write() {
            *s = round.status;
        }
        // The waiting jobs' reasons, at most once a second: a page's view,
        // not worth a pass over the world on every event.
        let stale = self
            .shared
            .queue
            .read()
            .map_or(true, |q| now().saturating_sub(q.0) >= QUEUE_EVERY);
        if stale {
            let at = now();
            let jobs = self.core.queued_jobs(at);
            if let Ok(mut q) = self.shared.queue.write() {
                *q = (at, jobs);
            }
        }
        self.shared.progress.round(self.core.in_flight_count());
    }

    /// Starts an operation the engine decides on its own (a listing),
    /// counted in flight in the core until its outcome comes back.
    fn spawn(&mut self, name: String, op: impl Future<Output = Outcome> + Send + 'static) {
        self.core.begin(name);
        self.spawn_started(op);
    }

    /// Runs an operation the core already counts in flight; its outcome
    /// goes back to the loop.
    fn spawn_started(&mut self, op: impl Future<Output = Outcome> + Send + 'static) {
        self.shared.progress.started();
        let tx = self.outcomes_tx.clone();
        self.tasks.spawn(async move {
            let outcome = op.await;
            let _ = tx.send(outcome).await;
        });
    }

    fn start_all(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            self.start(effect);
        }
    }

    /// The pool `name`, or, when none has that name, operation `op` ended
    /// (the core only names configured pools).
    fn pool(&mut self, name: &str, op: &str) -> Option<Arc<Pool>> {
        let pool = self.shared.pools.get(name).cloned();
        if pool.is_none() {
            self.core.end(op);
        }
        pool
    }

    /// Carries out one of the core's effects.
    fn start(&mut self, effect: Effect) {
        let shared = self.shared.clone();
        match effect {
            Effect::Labels { job, project } => {
                let Some(gitlab) = self.shared.io.forges.gitlab.clone() else {
                    self.core.labels(job, None);
                    return;
                };
                self.spawn_started(async move {
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
            Effect::Create {
                pool,
                job,
                name,
                claim_key,
            } => {
                let Some(p) = self.pool(&pool, &name) else {
                    return;
                };
                // The creation is a hop of the trace the job's queued event
                // carried: the allocator call, the provider call and the
                // runner events it publishes are in that trace too.
                let span = tracing::info_span!(
                    "runner",
                    otel.name = "scaler create runner",
                    runyard.pool = %pool,
                    runyard.runner = %name,
                    runyard.job_id = i64::try_from(job.id.job_id).unwrap_or(i64::MAX),
                );
                let incoming = self.traces.get(&job.id).map(TraceParent::to_string);
                runyard_bus::adopt(&span, incoming.as_deref());
                let tools = self.tools.clone();
                self.spawn_started(
                    create_for_job(shared, p, job, name, claim_key, tools).instrument(span),
                );
            }
            Effect::CreateFree {
                pool,
                name,
                key,
                reason,
            } => {
                let Some(p) = self.pool(&pool, &name) else {
                    return;
                };
                let tools = self.tools.clone();
                self.spawn_started(async move {
                    create_free(shared, p, name, key, reason, tools).await
                });
            }
            Effect::Retry {
                pool,
                name,
                job,
                attempt,
            } => {
                let Some(p) = self.pool(&pool, &name) else {
                    return;
                };
                let tools = self.tools.clone();
                self.spawn_started(async move {
                    let sizing = match &job {
                        Some(j) => shared.io.size(j, &p.config.flavors).await.flavor,
                        None => 0,
                    };
                    let made = provision(&shared, &p, &tools, &name, sizing, attempt).await;
                    let local = made.local();
                    Outcome::Done {
                        name,
                        events: made.events,
                        local,
                    }
                });
            }
            Effect::GiveUp { runner } => {
                let Some(p) = self.pool(&runner.pool, &runner.name) else {
                    return;
                };
                self.spawn_started(async move {
                    let name = runner.name.clone();
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
            Effect::Reap { runner } => {
                let Some(p) = self.pool(&runner.pool, &runner.name) else {
                    return;
                };
                self.spawn_started(async move {
                    let name = runner.name.clone();
                    match remove(&shared, &p, &runner).await {
                        Ok(Unregistered::Busy(jobs)) => {
                            Outcome::unpublished(name, Some(Local::Busy(jobs)))
                        }
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
                        Err(RemoveFailed::Forge | RemoveFailed::Instance) => {
                            Outcome::unpublished(name, None)
                        }
                    }
                });
            }
            Effect::Delete { runner, reason } => {
                let Some(p) = self.pool(&runner.pool, &runner.name) else {
                    return;
                };
                self.spawn_started(async move {
                    let name = runner.name.clone();
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
                        Ok(Unregistered::Busy(jobs)) => {
                            Outcome::unpublished(name, Some(Local::Busy(jobs)))
                        }
                        Err(RemoveFailed::Forge | RemoveFailed::Instance) => {
                            Outcome::unpublished(name, None)
                        }
                    }
                });
            }
            Effect::ConfirmIdle { runner, confirmed } => {
                let Some(p) = self.pool(&runner.pool, &runner.name) else {
                    return;
                };
                self.spawn_started(async move { confirm_idle(shared, p, runner, confirmed).await });
            }
            Effect::Unserved {
                job,
                reason,
                detail,
                event,
            } => {
                let name = format!("unserved:{}", event.id);
                let tp = self
                    .traces
                    .get(&job.id)
                    .cloned()
                    .unwrap_or_else(TraceParent::new_root);
                // From the replica whose event was the first: a log line
                // and the metric.
                self.spawn_started(async move {
                    match shared.io.bus.publish_event(&event, &tp).await {
                        Ok(stored) if !stored.duplicate => {
                            tracing::warn!(
                                job_id = job.id.job_id,
                                project = %job.project,
                                job = %job.name,
                                reason,
                                %detail,
                                "queued job gets no runner"
                            );
                            shared
                                .io.metrics
                                .jobs_unserved
                                .get_or_create(&crate::metrics::UnservedLabel {
                                    forge: forge_token(job.id.forge),
                                    reason,
                                })
                                .inc();
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, job_id = job.id.job_id, "publishing an unserved job failed");
                        }
                    }
                    Outcome::unpublished(name, None)
                });
            }
            Effect::Assigned { pool, name, job } => {
                let Some(p) = self.shared.pools.get(&pool).cloned() else {
                    return;
                };
                let body = Body::RunnerAssigned(RunnerAssigned {
                    runner: Some(rref(&p, &name)),
                    job: Some(job),
                });
                self.tasks.spawn(async move {
                    publish(&shared, &p, &name, body).await;
                });
            }
        }
    }

    fn on_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Done {
                name,
                events,
                local,
            } => {
                for ev in &events {
                    self.noted(ev);
                }
                self.sync_owned();
                let effects = self.core.done(&name, &events, local, now());
                self.start_all(effects);
            }
            Outcome::Abandoned { name, job } => self.core.abandoned(&name, job.as_ref()),
            Outcome::Labels { job, labels } => self.core.labels(job, labels),
            Outcome::Listed {
                pool,
                instances,
                forge,
            } => {
                self.core.end(&format!("sync:{pool}"));
                self.on_listed(&pool, instances.as_deref(), forge.as_deref());
            }
            Outcome::ListedRemoved {
                pool_id,
                host,
                instances,
            } => {
                self.core.end(&format!("sync-removed:{pool_id}"));
                if let Some(instances) = instances {
                    self.on_listed_removed(&pool_id, &host, &instances);
                }
            }
        }
    }

    /// Lists every owned pool's instances and forge runners, and the
    /// instances of pools removed from the configuration (off the loop).
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
            if self.core.in_flight(&key) {
                continue;
            }
            let shared = self.shared.clone();
            self.spawn(key, async move {
                let started = Instant::now();
                let instances = p.provider.list(&p.id).await;
                shared
                    .io.metrics
                    .provider_call(&p.provider_name, "list", started, instances.is_ok());
                if let Err(error) = &instances {
                    tracing::warn!(%error, pool = %p.config.name, "listing the pool's instances failed");
                }
                let forge = shared.io.forges.list(&p.config).await;
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
        self.sync_removed();
    }

    /// Lists the pool ids the log names that no configured pool has (a pool
    /// removed or renamed): through a configured pool on the same provider,
    /// by the replica holding the lease of the first such pool (by name).
    fn sync_removed(&mut self) {
        let shared = self.shared.clone();
        let configured: HashSet<&str> = shared.pools.values().map(|p| p.id.as_str()).collect();
        let removed: Vec<(String, SeenPool)> = self
            .seen_pools
            .iter()
            .filter(|(id, _)| !configured.contains(id.as_str()))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        for (pool_id, seen) in removed {
            let host = shared
                .pools
                .values()
                .filter(|p| p.provider_name == seen.rref.provider)
                .min_by(|a, b| a.config.name.cmp(&b.config.name))
                .cloned();
            let Some(host) = host else {
                if self.unreachable_pools.insert(pool_id.clone()) {
                    tracing::warn!(
                        pool = %seen.rref.pool,
                        %pool_id,
                        provider = %seen.rref.provider,
                        "no configured pool uses the provider of a removed pool: its instances cannot be listed"
                    );
                }
                continue;
            };
            if !self.owns(&host.config.name) {
                continue;
            }
            let key = format!("sync-removed:{pool_id}");
            if self.core.in_flight(&key) {
                continue;
            }
            let shared = self.shared.clone();
            self.spawn(key, async move {
                let started = Instant::now();
                let instances = host.provider.list(&pool_id).await;
                shared.io.metrics.provider_call(
                    &host.provider_name,
                    "list",
                    started,
                    instances.is_ok(),
                );
                if let Err(error) = &instances {
                    tracing::warn!(%error, pool = %seen.rref.pool, %pool_id, "listing a removed pool's instances failed");
                }
                Outcome::ListedRemoved {
                    pool_id,
                    host: host.config.name.clone(),
                    instances: instances.ok(),
                }
            });
        }
    }

    /// Acts on what a pool's listings show (see [`crate::core::listing`]).
    fn on_listed(
        &mut self,
        pool: &str,
        instances: Option<&[Instance]>,
        forge: Option<&[ForgeRunner]>,
    ) {
        let Some(p) = self.shared.pools.get(pool).cloned() else {
            return;
        };
        let listing = Listing {
            pool,
            scope: &p.id,
            restart_stopped: p.config.stopped == StoppedAction::Start,
            instances,
            forge,
        };
        let findings = self.core.listed(&listing);
        for finding in findings {
            let op = finding.op();
            let shared = self.shared.clone();
            let p = p.clone();
            match finding {
                Finding::Interrupted {
                    runner: r,
                    instance,
                    forge_id,
                } => self.spawn_started(async move {
                    let name = r.name.clone();
                    let body = match (instance, forge_id) {
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
                            forget_secrets(&shared, &name).await;
                            if let Some(id) = forge_id {
                                let _ = shared.io.forges.unregister(&p.config, id).await;
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
                }),
                Finding::Gone { runner: r } => self.spawn_started(async move {
                    // Its process ended (an ephemeral runner after its job) or
                    // the machine went: tidy the forge side, record it.
                    let name = r.name.clone();
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
                }),
                Finding::Stopped {
                    runner,
                    instance,
                    start,
                } => self.spawn_started(async move {
                    stopped_instance(shared, p, runner, instance, start).await
                }),
                Finding::Online { name } => {
                    let body = Body::RunnerOnline(RunnerOnline {
                        runner: Some(rref(&p, &name)),
                        source: "forge_list".into(),
                    });
                    self.spawn_started(async move { record(&shared, &p, name, body).await });
                }
                Finding::Orphan {
                    name,
                    provider_id,
                    forge_id,
                } => self.spawn_started(remove_orphan(shared, p, op, name, provider_id, forge_id)),
                Finding::Stale { name, id } => self.spawn_started(async move {
                    match shared.io.forges.unregister(&p.config, id).await {
                        Ok(Unregistered::Gone) => {
                            tracing::info!(runner = %name, forge_runner_id = id, "stale registration removed");
                        }
                        Ok(Unregistered::Busy(_)) => {
                            tracing::info!(runner = %name, forge_runner_id = id, "stale registration busy; kept");
                        }
                        Err(error) => {
                            tracing::warn!(%error, runner = %name, forge_runner_id = id, "removing a stale registration failed");
                        }
                    }
                    Outcome::unpublished(op, None)
                }),
            }
        }
    }

    /// The listing of a removed pool (`pool_id`, made through `host`'s
    /// provider): nothing configured owns its instances, so each goes at the
    /// second listing showing it; its runners the log still counts alive
    /// are recorded deleted (reason `pool_removed`). Their forge
    /// registrations, whose scope is no longer configured, are left to the
    /// forge's own clean-up of offline runners.
    fn on_listed_removed(&mut self, pool_id: &str, host: &str, instances: &[Instance]) {
        let (Some(seen), Some(host)) = (
            self.seen_pools.get(pool_id).cloned(),
            self.shared.pools.get(host).cloned(),
        ) else {
            return;
        };
        let removed = self
            .core
            .listed_removed(pool_id, &seen.rref.pool, instances);
        for (i, counted) in removed.orphans {
            let op = format!("orphan:{}", i.name);
            let shared = self.shared.clone();
            let host = host.clone();
            let pool_id = pool_id.to_owned();
            let rref = RunnerRef {
                name: i.name.clone(),
                ..seen.rref.clone()
            };
            let provider_id = i.provider_id.clone();
            self.spawn_started(async move {
                let deleted = host
                    .delete_instance(&shared.io.metrics, &pool_id, &provider_id)
                    .await;
                let mut events = Vec::new();
                match deleted {
                    Ok(()) => {
                        tracing::info!(runner = %rref.name, pool = %rref.pool, %pool_id, "instance of a removed pool deleted");
                        forget_secrets(&shared, &rref.name).await;
                        if counted {
                            events = pool_removed(&shared, rref).await;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, runner = %rref.name, pool = %rref.pool, "deleting an instance of a removed pool failed");
                    }
                }
                Outcome::Done {
                    name: op,
                    events,
                    local: None,
                }
            });
        }
        for name in removed.gone {
            let shared = self.shared.clone();
            let rref = RunnerRef {
                name: name.clone(),
                ..seen.rref.clone()
            };
            self.spawn_started(async move {
                forget_secrets(&shared, &name).await;
                Outcome::Done {
                    events: pool_removed(&shared, rref).await,
                    name,
                    local: None,
                }
            });
        }
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
