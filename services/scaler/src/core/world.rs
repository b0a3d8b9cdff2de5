//! What the scaler knows: jobs and runners, folded from the event log (and
//! from the scaler's own decisions the moment it makes them). Plain data and
//! a reducer that is idempotent and order-tolerant, so replaying the log at
//! start, redelivery and the scaler's own echo all converge on one state.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use runyard_events::{Body, Event, Forge, JobStatus, Stage};

/// Wall-clock time as a duration since the Unix epoch (injected everywhere,
/// so the policy runs the same on a real clock and in a simulation).
pub type Clock = Duration;

/// A job's identity plus the attempt a runner is made for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId {
    /// `github` / `gitlab`.
    pub forge: Forge,
    /// Forge host.
    pub instance: String,
    /// Forge job id.
    pub job_id: u64,
}

/// One job as the scaler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    /// Identity.
    pub id: JobId,
    /// GitHub run attempt; GitLab retries + 1.
    pub run_attempt: u32,
    /// GitHub run or GitLab pipeline id (0 while unknown).
    pub pipeline_id: u64,
    /// Labels (GitHub) or tags (GitLab), lower-cased; `None` while unknown.
    pub labels: Option<Vec<String>>,
    /// The status of the latest observation in the furthest [`Stage`]:
    /// `queued` and `waiting` alternate, the rest only move forward.
    pub status: JobStatus,
    /// That observation's stage and when it was made (the order key).
    pub seen: (Stage, Clock),
    /// True when it ended cancelled.
    pub cancelled: bool,
    /// When it was queued.
    pub queued_at: Clock,
    /// Repository / project.
    pub project: String,
    /// GitHub repository or GitLab project id.
    pub project_id: u64,
    /// Workflow name (GitHub).
    pub workflow: String,
    /// Job name.
    pub name: String,
    /// Ref.
    pub git_ref: String,
    /// The runner that took it, once known.
    pub runner_name: Option<String>,
    /// Set when the scaler gave it up (no more create attempts).
    pub given_up: bool,
    /// The pool whose runner scale set it is assigned to (`None`: seen by
    /// webhook or poll). Only that pool serves it, and scale-set pools
    /// serve nothing else.
    pub scale_set: Option<String>,
    /// The forge's own word for the status of that observation (GitLab
    /// `created`, `waiting_for_resource`, `scheduled`, `preparing`; GitHub
    /// `waiting`): why the forge holds a waiting job back.
    pub forge_status: String,
}

impl Job {
    /// Waiting for a runner.
    pub fn is_queued(&self) -> bool {
        matches!(self.status, JobStatus::Queued) && !self.given_up
    }
}

/// Where a runner is in its life. Ordered: a later phase never goes back
/// (within one create attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Decided; the create is under way.
    Requested,
    /// The provider made the instance.
    Created,
    /// Registered with the forge and waiting for a job.
    Online,
    /// Running a job.
    Assigned,
    /// The last create attempt failed (or never came online); the instance
    /// is gone; another attempt follows after `retry_at`.
    Failed,
    /// Gone for good.
    Deleted,
}

impl Phase {
    /// The word used in event subjects and `/v1/pools`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Created => "created",
            Self::Online => "online",
            Self::Assigned => "assigned",
            Self::Failed => "failed",
            Self::Deleted => "deleted",
        }
    }
}

/// One runner.
#[derive(Debug, Clone)]
pub struct Runner {
    /// Instance name (deterministic).
    pub name: String,
    /// Pool.
    pub pool: String,
    /// The job it was made for (none for a min-idle runner).
    pub job: Option<JobId>,
    /// That job's run attempt.
    pub run_attempt: u32,
    /// The claim it was made under.
    pub claim_key: String,
    /// Phase.
    pub phase: Phase,
    /// Create attempts made so far (the current one included).
    pub attempts: u32,
    /// When it was requested.
    pub requested_at: Clock,
    /// When the current attempt started.
    pub attempt_started_at: Clock,
    /// When it came online (or was last seen becoming idle).
    pub idle_since: Option<Clock>,
    /// When the next create attempt may start (phase `Failed`).
    pub retry_at: Option<Clock>,
    /// The job it is running (the last one it took).
    pub running: Option<JobId>,
    /// Every job seen started on it and not yet completed: a runner that
    /// takes more than one job (a GitLab `run` service, a forge handing it
    /// another) is done only when all of them are.
    pub busy_with: BTreeSet<JobId>,
    /// Flavor.
    pub flavor: String,
    /// Provider's id for the instance.
    pub provider_id: Option<String>,
    /// Forge runner id.
    pub forge_runner_id: Option<u64>,
    /// First forge reading that said "not busy" in the current idle spell.
    pub idle_confirmed_from: Option<Clock>,
    /// Why it was deleted or failed last.
    pub reason: String,
    /// A removal the forge refused as busy is not tried again before this
    /// (a runner service may say a job completed while it still runs).
    pub removal_after: Option<Clock>,
}

impl Runner {
    /// A runner just decided on: phase `Requested`, first attempt.
    pub fn requested(
        name: &str,
        pool: &str,
        job: Option<JobId>,
        run_attempt: u32,
        claim_key: &str,
        at: Clock,
    ) -> Self {
        Self {
            name: name.to_owned(),
            pool: pool.to_owned(),
            job,
            run_attempt,
            claim_key: claim_key.to_owned(),
            phase: Phase::Requested,
            attempts: 1,
            requested_at: at,
            attempt_started_at: at,
            idle_since: None,
            retry_at: None,
            running: None,
            busy_with: BTreeSet::new(),
            flavor: String::new(),
            provider_id: None,
            forge_runner_id: None,
            idle_confirmed_from: None,
            reason: String::new(),
            removal_after: None,
        }
    }

    /// A `Retry` decision taken: the runner is being made again, as its
    /// next attempt (returned), from `now`.
    pub fn retrying(&mut self, now: Clock) -> u32 {
        self.phase = Phase::Requested;
        self.attempts += 1;
        self.attempt_started_at = now;
        self.attempts
    }

    /// Running a job whose name is not known yet: the forge listed it busy
    /// before a start named the job.
    pub fn runs_unnamed_job(&self) -> bool {
        self.phase == Phase::Assigned && self.running.is_none()
    }

    /// It took `job`, unless the job it runs is known already. Until then
    /// the job it was made for counts as its own (and that job's runner as
    /// held).
    fn took(&mut self, job: Option<JobId>) {
        if self.phase < Phase::Assigned || self.runs_unnamed_job() {
            self.phase = Phase::Assigned;
            self.running = job;
        }
    }

    /// The forge said it runs a job (a refused delete, a busy reading): it
    /// is at least assigned, and its idle readings start over.
    pub fn found_busy(&mut self) {
        if self.phase < Phase::Assigned {
            self.phase = Phase::Assigned;
        }
        self.idle_confirmed_from = None;
    }

    /// The forge read it idle at `now`: the idle window runs from the
    /// first such reading.
    pub fn found_idle(&mut self, now: Clock) {
        self.idle_confirmed_from.get_or_insert(now);
    }

    /// Exists (or is being made) and so counts toward `max_runners`.
    pub fn is_alive(&self) -> bool {
        matches!(
            self.phase,
            Phase::Requested | Phase::Created | Phase::Online | Phase::Assigned
        )
    }

    /// Alive and not running a job.
    pub fn is_unassigned(&self) -> bool {
        matches!(
            self.phase,
            Phase::Requested | Phase::Created | Phase::Online
        )
    }
}

/// Everything known, keyed for the policy.
#[derive(Debug, Default, Clone)]
pub struct World {
    /// Jobs by id.
    pub jobs: HashMap<JobId, Job>,
    /// Runners by name (sorted: deterministic iteration).
    pub runners: BTreeMap<String, Runner>,
    /// Event ids already folded in (the reducer sees the scaler's own events
    /// twice: when it makes them and when the log echoes them).
    seen: HashMap<String, Clock>,
}

/// Back-off before create attempt `attempt + 1`: `base × 2^(attempt-1)`,
/// capped. Jitter is added where the time is taken (the engine).
pub fn create_backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(max)
}

fn clock_of(ts: Option<&prost_types::Timestamp>) -> Option<Clock> {
    let ts = ts?;
    let secs = u64::try_from(ts.seconds).ok()?;
    Some(Duration::new(secs, u32::try_from(ts.nanos).unwrap_or(0)))
}

impl World {
    /// Folds one event in. `now` stands in for events without a time.
    /// `retry_backoff` gives the wait before the next attempt after a failure.
    pub fn apply(&mut self, event: &Event, now: Clock, retry_backoff: impl Fn(u32) -> Duration) {
        if !event.id.is_empty() && self.seen.insert(event.id.clone(), now).is_some() {
            return;
        }
        let at = clock_of(event.occurred_at.as_ref()).unwrap_or(now);
        match event.body.as_ref() {
            Some(Body::JobObserved(j)) => {
                let seen = clock_of(runyard_events::observed_at(event)).unwrap_or(now);
                self.apply_job(j, at, seen);
            }
            Some(Body::RunnerRequested(req)) => {
                let r = req;
                let Some(rref) = r.runner.as_ref() else {
                    return;
                };
                let job = r.job.as_ref().map(|k| JobId {
                    forge: k.forge(),
                    instance: k.instance.clone(),
                    job_id: k.job_id,
                });
                let runner = self.runners.entry(rref.name.clone()).or_insert_with(|| {
                    let mut r = Runner::requested(
                        &rref.name,
                        &rref.pool,
                        job,
                        r.run_attempt,
                        &r.claim_key,
                        at,
                    );
                    r.reason.clone_from(&req.reason);
                    r
                });
                // The replica that decided it knew the runner before its
                // size was chosen: the request says which flavor it got.
                if runner.flavor.is_empty() {
                    runner.flavor.clone_from(&req.flavor);
                }
            }
            Some(Body::RunnerCreated(r)) => {
                let Some(runner) = self.runner_mut(r.runner.as_ref()) else {
                    return;
                };
                if (r.attempt, Phase::Created) >= (runner.attempts, runner.phase)
                    && runner.phase != Phase::Deleted
                {
                    runner.attempts = r.attempt.max(1);
                    runner.phase = Phase::Created;
                    runner.retry_at = None;
                }
                if !r.provider_id.is_empty() {
                    runner.provider_id = Some(r.provider_id.clone());
                }
                if r.forge_runner_id.is_some() {
                    runner.forge_runner_id = r.forge_runner_id;
                }
            }
            Some(Body::RunnerOnline(r)) => {
                if let Some(runner) = self.runner_mut(r.runner.as_ref())
                    && runner.phase < Phase::Online
                {
                    runner.phase = Phase::Online;
                    runner.idle_since = Some(at);
                }
            }
            Some(Body::RunnerAssigned(r)) => {
                let job = r.job.as_ref().map(|k| JobId {
                    forge: k.forge(),
                    instance: k.instance.clone(),
                    job_id: k.job_id,
                });
                if let Some(runner) = self.runner_mut(r.runner.as_ref()) {
                    runner.took(job);
                }
            }
            Some(Body::RunnerFailed(r)) => {
                let given_up = r.given_up;
                let Some(runner) = self.runner_mut(r.runner.as_ref()) else {
                    return;
                };
                if runner.phase == Phase::Deleted
                    || (r.attempt, Phase::Failed) < (runner.attempts, runner.phase)
                {
                    return;
                }
                runner.attempts = r.attempt.max(runner.attempts);
                runner.reason.clone_from(&r.reason);
                runner.idle_since = None;
                if given_up {
                    runner.phase = Phase::Deleted;
                    runner.retry_at = None;
                    if let Some(job) = runner.job.clone()
                        && let Some(j) = self.jobs.get_mut(&job)
                    {
                        j.given_up = true;
                    }
                } else {
                    runner.phase = Phase::Failed;
                    runner.retry_at = Some(at + retry_backoff(r.attempt));
                }
            }
            Some(Body::RunnerDeleted(r)) => {
                if let Some(runner) = self.runner_mut(r.runner.as_ref()) {
                    runner.phase = Phase::Deleted;
                    runner.retry_at = None;
                    runner.reason.clone_from(&r.reason);
                }
            }
            _ => {}
        }
    }

    fn runner_mut(&mut self, rref: Option<&runyard_events::RunnerRef>) -> Option<&mut Runner> {
        self.runners.get_mut(&rref?.name)
    }

    fn apply_job(&mut self, j: &runyard_events::JobObserved, at: Clock, seen: Clock) {
        let Some(key) = j.job.as_ref() else {
            return;
        };
        let id = JobId {
            forge: key.forge(),
            instance: key.instance.clone(),
            job_id: key.job_id,
        };
        let status = j.status();
        let labels: Vec<String> = j.labels.iter().map(|l| l.to_ascii_lowercase()).collect();
        let job = self.jobs.entry(id.clone()).or_insert_with(|| Job {
            id: id.clone(),
            run_attempt: j.run_attempt.max(1),
            pipeline_id: j.pipeline_id,
            // GitLab's hooks carry the runner's tags, not the job's: those are
            // looked up before the job can be matched.
            labels: (id.forge == Forge::Github).then(Vec::new),
            status: JobStatus::Unspecified,
            seen: (Stage::Unknown, Duration::ZERO),
            cancelled: false,
            queued_at: clock_of(j.created_at.as_ref()).unwrap_or(at),
            project: j.project.clone(),
            project_id: j.project_id,
            workflow: j.workflow_name.clone(),
            name: j.name.clone(),
            git_ref: j.r#ref.clone(),
            runner_name: None,
            given_up: false,
            scale_set: None,
            forge_status: String::new(),
        });
        if !j.scale_set_pool.is_empty() {
            job.scale_set = Some(j.scale_set_pool.clone());
        }
        if id.forge == Forge::Github && !labels.is_empty() {
            job.labels = Some(labels);
        }
        if j.pipeline_id != 0 {
            job.pipeline_id = j.pipeline_id;
        }
        let stage = (Stage::of_job(j), seen);
        if stage > job.seen {
            job.status = status;
            job.seen = stage;
            job.forge_status = j.forge_status.clone();
        }
        if j.conclusion() == runyard_events::Conclusion::Cancelled {
            job.cancelled = true;
        }
        if !j.runner_name.is_empty()
            && matches!(status, JobStatus::InProgress | JobStatus::Completed)
        {
            job.runner_name = Some(j.runner_name.clone());
        }
        let runner_name = job.runner_name.clone();
        let completed = job.status == JobStatus::Completed;
        // The runner that took it is busy, and done when the job is.
        if let Some(name) = runner_name
            && let Some(runner) = self.runners.get_mut(&name)
            && runner.phase != Phase::Deleted
        {
            match status {
                JobStatus::InProgress => {
                    // A completion seen first (out of order) is kept.
                    if !completed {
                        runner.busy_with.insert(id.clone());
                    }
                    runner.took(Some(id));
                }
                JobStatus::Completed => {
                    runner.busy_with.remove(&id);
                    runner.phase = Phase::Assigned;
                    runner.running = Some(id);
                    runner.reason = "job_completed".into();
                }
                _ => {}
            }
        }
    }

    /// Records GitLab job tags looked up from the API.
    pub fn set_labels(&mut self, id: &JobId, labels: &[String]) {
        if let Some(job) = self.jobs.get_mut(id) {
            job.labels = Some(labels.iter().map(|l| l.to_ascii_lowercase()).collect());
        }
    }

    /// True when the runner's job (the one it runs) has completed and no
    /// other job seen started on it still runs: it is to be deleted.
    pub fn runner_done(&self, runner: &Runner) -> bool {
        runner.phase == Phase::Assigned
            && runner.busy_with.is_empty()
            && runner
                .running
                .as_ref()
                .and_then(|j| self.jobs.get(j))
                .is_some_and(|j| j.status == JobStatus::Completed)
    }

    /// Forgets what can no longer change a decision, whatever its age:
    /// completed jobs whose runner is gone, and deleted runners whose job
    /// is no longer queued. The policy reads them only through a live
    /// runner or a queued job, so what it decides is the same (the
    /// simulation keeps its World small this way; the engine keeps them
    /// for `lookback`, for what it reports).
    pub fn forget_settled(&mut self) {
        let queued: HashSet<JobId> = self
            .jobs
            .values()
            .filter(|j| j.is_queued())
            .map(|j| j.id.clone())
            .collect();
        self.runners.retain(|_, r| {
            r.phase != Phase::Deleted || r.job.as_ref().is_some_and(|j| queued.contains(j))
        });
        let runners = &self.runners;
        self.jobs.retain(|_, j| {
            j.status != JobStatus::Completed
                || j.runner_name
                    .as_ref()
                    .and_then(|n| runners.get(n))
                    .is_some_and(|r| r.phase != Phase::Deleted)
        });
    }

    /// Drops finished jobs and deleted runners older than `keep`, and the
    /// dedup memory of events older than that.
    pub fn prune(&mut self, now: Clock, keep: Duration) {
        let cutoff = now.saturating_sub(keep);
        self.jobs
            .retain(|_, j| j.status != JobStatus::Completed || j.queued_at >= cutoff);
        self.runners
            .retain(|_, r| r.phase != Phase::Deleted || r.requested_at >= cutoff);
        self.seen.retain(|_, at| *at >= cutoff);
    }
}
