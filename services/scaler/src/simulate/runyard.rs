//! runyard's engine in virtual time: the forge's webhooks go into the
//! product's [`Core`] — the same reducer, policy and bookkeeping the engine
//! runs — on every event and every tick, and its effects are carried out
//! against the simulated forge the way the engine's operations carry them
//! out (here they finish in no time).
//!
//! In [`Mode::ScaleSet`] the pool is a runner scale set's: the same core and
//! policy, the pool's spec with `scale_set` set, and the job events are the
//! listener's — `JobAssigned` → `queued`, `JobStarted` → `in_progress` on
//! the runner, `JobCompleted` → `completed` (`scaleset::convert`), each
//! naming the pool as the job's scale set — delivered by the long poll as
//! messages of at most 50 job events, each as soon as it exists (no
//! latency, as webhooks have none here; acquiring a `JobAvailable` job
//! takes no time either). No message is lost. Runners are sized as in
//! webhook mode: the smallest flavor covering the job's limit; free ones
//! the first flavor.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runyard_events::{
    Body, Conclusion, Event, Forge as ForgeKind, JobObserved, JobStatus, RunnerCreated,
    RunnerDeleted, RunnerFailed, RunnerOnline, RunnerRef,
};

use super::Scaler;
use super::forge::{Forge, Obs, State};
use crate::config::Flavor;
use crate::core::listing::{Finding, Listing};
use crate::core::policy::{Knobs, PoolSpec};
use crate::core::step::{Backoff, Core, Effect, Local, Settings, job_key};
use crate::core::world::{Clock, JobId, Phase};
use crate::forges::ForgeRunner;
use crate::sizing::pick_flavor;

/// The pool every simulated job goes to.
pub(crate) const POOL: &str = "linux-x64";
const HOST: &str = "github.com";
const LABELS: [&str; 3] = ["self-hosted", "linux", "x64"];

/// Most job events in one message of the Actions service.
pub(crate) const MESSAGE_JOBS: usize = 50;

/// How the pool hears of its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `workflow_job` webhooks (some may be lost).
    Webhook,
    /// A runner scale set's message session.
    ScaleSet,
}

/// The engine's timers that matter here.
#[derive(Debug, Clone, Copy)]
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

/// The engine's core, with the simulated forge and provider as its IO.
#[derive(Debug)]
pub(crate) struct Runyard {
    core: Core,
    mode: Mode,
    flavors: Vec<Flavor>,
    /// Scale-set job events not yet delivered: (job, status).
    outbox: Vec<(usize, JobStatus)>,
    /// Job events in each message delivered.
    messages: Vec<usize>,
    tick: Duration,
    sync_interval: Duration,
    next_tick: Clock,
    next_sync: Clock,
    next_prune: Clock,
    sync_now: bool,
    /// Forge runner → runner name.
    names: HashMap<usize, String>,
    /// Runner name → its current forge instance.
    instances: HashMap<String, usize>,
    /// The retry jitter drawn for the event being folded in (its bits).
    jitter: Arc<AtomicU64>,
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
    /// A scaler owning one pool whose runners come in `flavors` (smallest
    /// first), hearing of jobs as `mode` says; `seed` drives the retry
    /// jitter.
    pub(crate) fn new(
        mut pool: PoolSpec,
        mode: Mode,
        flavors: Vec<Flavor>,
        knobs: Knobs,
        timers: Timers,
        seed: u64,
        start: Clock,
    ) -> Self {
        pool.scale_set = mode == Mode::ScaleSet;
        if pool.scale_set {
            // The scale set is made with labels = [its name, ...labels].
            pool.labels.insert(0, POOL.into());
        }
        let jitter = Arc::new(AtomicU64::new(1.0f64.to_bits()));
        let drawn = jitter.clone();
        let mut core = Core::new(Settings {
            pool_ids: HashMap::from([(pool.name.clone(), "sim".to_owned())]),
            pools: vec![pool],
            replica: "sim".into(),
            knobs,
            busy_confirmation: timers.busy_confirmation,
            backoff: Backoff {
                base: timers.create_backoff,
                max: timers.create_backoff_max,
                jitter: Arc::new(move || f64::from_bits(drawn.load(Ordering::Relaxed))),
            },
            lookup_labels: false,
        });
        core.own(POOL, true);
        Self {
            core,
            mode,
            flavors,
            outbox: Vec::new(),
            messages: Vec::new(),
            tick: timers.tick,
            sync_interval: timers.sync_interval,
            next_tick: start,
            next_sync: start,
            next_prune: start,
            sync_now: false,
            names: HashMap::new(),
            instances: HashMap::new(),
            jitter,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// An event at `now`, with the retry jitter the engine would draw for
    /// it.
    fn event(&mut self, now: Clock, body: Body) -> Event {
        let jitter = 0.75 + self.rng.random::<f64>() * 0.5;
        self.jitter.store(jitter.to_bits(), Ordering::Relaxed);
        Event {
            id: String::new(),
            occurred_at: Some(ts(now)),
            received_at: Some(ts(now)),
            source: None,
            body: Some(body),
        }
    }

    /// Folds a forge event in, as the engine does with the log's.
    fn apply(&mut self, now: Clock, body: Body) {
        let event = self.event(now, body);
        // What a job seen started asks for (recording the assignment) has
        // nothing to do with the forge here.
        let _assigned = self.core.observe(&event, now);
    }

    /// Operation `name` finished: the event it published, if any, and what
    /// the forge said.
    fn finish(&mut self, now: Clock, name: &str, body: Option<Body>, local: Option<Local>) {
        let events: Vec<Event> = body.map(|b| self.event(now, b)).into_iter().collect();
        let _assigned = self.core.done(name, &events, local, now);
    }

    /// The job events in each message delivered so far (scale-set mode).
    #[cfg(test)]
    pub(crate) fn messages(&self) -> &[usize] {
        &self.messages
    }

    fn observe_job(&mut self, forge: &Forge, now: Clock, j: usize, status: JobStatus) {
        let job = &forge.jobs[j];
        let runner_name = job
            .runner
            .filter(|_| status != JobStatus::Queued)
            .and_then(|r| self.names.get(&r).cloned())
            .unwrap_or_default();
        let id = job_id(j);
        let scale_set = self.mode == Mode::ScaleSet;
        let body = Body::JobObserved(JobObserved {
            job: Some(job_key(&id)),
            project: "acme/app".into(),
            project_id: 1,
            run_attempt: 1,
            name: format!("job {}", id.job_id),
            workflow_name: "ci".into(),
            // `runs-on: <scale set name>` in scale-set mode.
            labels: if scale_set {
                vec![POOL.to_owned()]
            } else {
                LABELS.iter().map(|l| (*l).to_owned()).collect()
            },
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
            scale_set_pool: if scale_set {
                POOL.into()
            } else {
                String::new()
            },
            scale_set_job_id: if scale_set {
                id.job_id.to_string()
            } else {
                String::new()
            },
            ..JobObserved::default()
        });
        self.apply(now, body);
    }

    /// A job event: folded in at once (a webhook), or put in the scale
    /// set's next message.
    fn hear(&mut self, forge: &Forge, now: Clock, j: usize, status: JobStatus) {
        match self.mode {
            Mode::Webhook => self.observe_job(forge, now, j, status),
            Mode::ScaleSet => self.outbox.push((j, status)),
        }
    }

    /// The long poll: every job event that exists is delivered, in order,
    /// in messages of at most [`MESSAGE_JOBS`]; the listener writes each
    /// message's events to the log before the next poll. `true` when
    /// anything was delivered.
    fn deliver(&mut self, forge: &Forge, now: Clock) -> bool {
        let outbox = std::mem::take(&mut self.outbox);
        for message in outbox.chunks(MESSAGE_JOBS) {
            for &(j, status) in message {
                self.observe_job(forge, now, j, status);
            }
            self.messages.push(message.len());
        }
        !outbox.is_empty()
    }

    /// The forge listing, read by the core as the engine's listings are:
    /// busy runners are marked assigned there, booting ones listed online
    /// get `RunnerOnline`, and a registration no runner owns is removed at
    /// the second listing showing it.
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
        for finding in self.core.listed(&listing) {
            let op = finding.op();
            match finding {
                Finding::Online { name } => {
                    let body = Body::RunnerOnline(RunnerOnline {
                        runner: Some(rref(&name)),
                        source: "forge_list".into(),
                    });
                    self.finish(now, &op, Some(body), None);
                }
                Finding::Orphan {
                    forge_id: Some(id), ..
                } => {
                    // One running a job is not listed as an orphan; a
                    // delete refused all the same is tried at a later
                    // listing.
                    if let Ok(id) = usize::try_from(id) {
                        let _ = forge.delete(now, id);
                    }
                    self.core.end(&op);
                }
                // Without a provider listing nothing is interrupted, gone
                // or stopped; a runner's registration is its instance.
                _ => self.core.end(&op),
            }
        }
    }

    fn decide(&mut self, forge: &mut Forge, now: Clock) {
        for effect in self.core.decide(now).effects {
            self.execute(forge, now, effect);
        }
    }

    /// One create attempt: the provider makes the instance (or fails).
    fn provision(&mut self, forge: &mut Forge, now: Clock, name: &str, attempt: u32) {
        let made_for = self
            .core
            .world()
            .runners
            .get(name)
            .and_then(|r| r.job.as_ref())
            .and_then(|j| usize::try_from(j.job_id).ok())
            .map(|n| n - 1);
        // The engine sizes a runner for its job (`sizing::pick_flavor` of
        // the allocator's limit) and a free one with the first flavor.
        let flavor = made_for.map_or(0, |j| {
            pick_flavor(&self.flavors, Some(forge.jobs[j].work.memory))
        });
        let memory = self.flavors[flavor].memory.as_u64();
        let (id, ok) = forge.create(now, made_for, memory);
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
        self.finish(now, name, Some(body), None);
    }

    /// Removes the runner's instance; `false` when the forge refused
    /// (busy).
    fn remove(&mut self, forge: &mut Forge, now: Clock, name: &str) -> bool {
        match self.instances.get(name) {
            Some(&id) => forge.delete(now, id).is_ok(),
            None => true,
        }
    }

    /// Removes runner `name` and, when the forge lets it go, records
    /// `gone`; a refusal is the forge saying it runs a job.
    fn remove_then(&mut self, forge: &mut Forge, now: Clock, name: &str, gone: Body) {
        if self.remove(forge, now, name) {
            self.finish(now, name, Some(gone), None);
        } else {
            self.finish(now, name, None, Some(Local::Busy(Vec::new())));
        }
    }

    /// Carries out one of the core's effects, as the engine's operations
    /// do.
    fn execute(&mut self, forge: &mut Forge, now: Clock, effect: Effect) {
        match effect {
            Effect::Create { name, .. } | Effect::CreateFree { name, .. } => {
                self.provision(forge, now, &name, 1);
            }
            Effect::Retry { name, attempt, .. } => self.provision(forge, now, &name, attempt),
            Effect::GiveUp { runner } => {
                let body = Body::RunnerFailed(RunnerFailed {
                    runner: Some(rref(&runner.name)),
                    reason: "gave_up".into(),
                    error: format!("no runner after {} attempts", runner.attempts),
                    attempt: runner.attempts,
                    given_up: true,
                    job: runner.job.as_ref().map(job_key),
                });
                self.finish(now, &runner.name, Some(body), None);
            }
            Effect::Reap { runner } => {
                let body = Body::RunnerFailed(RunnerFailed {
                    runner: Some(rref(&runner.name)),
                    reason: "bootstrap_timeout".into(),
                    error: "not online in time".into(),
                    attempt: runner.attempts,
                    given_up: false,
                    job: runner.job.as_ref().map(job_key),
                });
                self.remove_then(forge, now, &runner.name, body);
            }
            Effect::Delete { runner, reason } => {
                let body = Body::RunnerDeleted(RunnerDeleted {
                    runner: Some(rref(&runner.name)),
                    reason: reason.into(),
                });
                if runner.phase == Phase::Failed {
                    self.finish(now, &runner.name, Some(body), None);
                } else {
                    self.remove_then(forge, now, &runner.name, body);
                }
            }
            Effect::ConfirmIdle { runner, confirmed } => {
                self.confirm_idle(forge, now, &runner.name, runner.forge_runner_id, confirmed);
            }
            // No GitLab job here, and every job has a pool.
            Effect::Labels { job, .. } => self.core.labels(job, None),
            effect @ (Effect::Unserved { .. } | Effect::Assigned { .. }) => {
                if let Some(op) = effect.op() {
                    self.core.end(&op);
                }
            }
        }
    }

    /// The engine's idle confirmation: read the forge; busy, it stays;
    /// idle, the reading is noted, and once a window's earlier reading
    /// confirms it, the runner goes (refused if it took a job meanwhile).
    fn confirm_idle(
        &mut self,
        forge: &mut Forge,
        now: Clock,
        name: &str,
        forge_id: Option<u64>,
        confirmed: bool,
    ) {
        if forge_id.is_none() {
            return self.finish(now, name, None, None);
        }
        let busy = self
            .instances
            .get(name)
            .is_some_and(|&id| forge.runners[id].state == State::Busy);
        if busy {
            self.finish(now, name, None, Some(Local::Busy(Vec::new())));
        } else if !confirmed {
            self.finish(now, name, None, Some(Local::Idle));
        } else {
            let body = Body::RunnerDeleted(RunnerDeleted {
                runner: Some(rref(name)),
                reason: "idle_timeout".into(),
            });
            self.remove_then(forge, now, name, body);
        }
    }
}

fn next_after(now: Clock, period: Duration) -> Clock {
    let p = period.as_nanos().max(1);
    let n = now.as_nanos() / p + 1;
    Duration::from_nanos(u64::try_from(n * p).unwrap_or(u64::MAX))
}

impl Scaler for Runyard {
    fn name(&self) -> &'static str {
        match self.mode {
            Mode::Webhook => "runyard",
            Mode::ScaleSet => "runyard scale-set",
        }
    }

    fn webhooks(&self) -> bool {
        self.mode == Mode::Webhook
    }

    fn scale_set(&self) -> bool {
        self.mode == Mode::ScaleSet
    }

    fn observe(&mut self, forge: &mut Forge, now: Clock, obs: Obs) -> bool {
        match obs {
            Obs::Queued(j) | Obs::Rediscovered(j) => self.hear(forge, now, j, JobStatus::Queued),
            Obs::Started { job, .. } => self.hear(forge, now, job, JobStatus::InProgress),
            Obs::Completed { job, .. } => self.hear(forge, now, job, JobStatus::Completed),
            // No event says a runner came online: the engine sees it in
            // the next forge listing (at once when that is switched off).
            Obs::Online(_) => {
                let at_once = self.sync_interval.is_zero();
                self.sync_now |= at_once;
                return at_once;
            }
        }
        true
    }

    fn act(&mut self, forge: &mut Forge, now: Clock, events: bool) {
        let delivered = self.deliver(forge, now);
        let mut wake = events || delivered;
        if self.sync_now || (!self.sync_interval.is_zero() && now >= self.next_sync) {
            self.sync(forge, now);
            self.sync_now = false;
            if !self.sync_interval.is_zero() && now >= self.next_sync {
                self.next_sync = next_after(now, self.sync_interval);
            }
            wake = true;
        }
        if now >= self.next_tick {
            self.next_tick = next_after(now, self.tick);
            wake = true;
        }
        if wake {
            self.decide(forge, now);
        }
        if now >= self.next_prune {
            // The engine keeps history for `lookback`; what the policy
            // cannot read any more goes at once here, to keep every tick's
            // decision cheap.
            self.core.forget_settled();
            self.next_prune = next_after(now, Duration::from_secs(60));
        }
    }

    fn notes(&self) -> Vec<String> {
        if self.messages.is_empty() {
            return Vec::new();
        }
        vec![format!(
            "{} job events in {} messages (at most {} a message; {} full)",
            self.messages.iter().sum::<usize>(),
            self.messages.len(),
            self.messages.iter().max().unwrap_or(&0),
            self.messages.iter().filter(|n| **n == MESSAGE_JOBS).count()
        )]
    }

    fn next_wakeup(&self) -> Clock {
        if self.sync_interval.is_zero() {
            self.next_tick
        } else {
            self.next_tick.min(self.next_sync)
        }
    }
}
