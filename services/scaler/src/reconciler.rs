//! The reconciler: makes up for lost webhooks (`[reconciler]` in the scaler
//! file). GitHub never redelivers a failed delivery by itself and GitLab
//! disables hooks that keep failing, so every `interval` the replica holding
//! the `reconciler` lease in `<NS>_LEASES`:
//!
//! - lists the deliveries of each configured GitHub hook back to the
//!   lookback window (page by page, by GitHub's cursor) and redelivers (by numeric id) every failed `workflow_job` delivery whose
//!   GUID has no successful delivery yet, backing off per GUID while the
//!   redeliveries keep failing;
//! - polls each configured GitHub repository (runs `queued` and
//!   `in_progress`, then each run's latest jobs) and publishes a
//!   `JobObserved` for every job status the log has not seen yet; a run the
//!   log still holds unfinished jobs of but neither listing shows any more
//!   (it completed while its last events were lost) is read once more;
//! - polls each configured GitLab project for pending jobs and publishes
//!   the ones the log lacks as `queued`.
//!
//! What the log has seen comes from a follower of `<ns>.v1.job.>` of its
//! own (read from `now - lookback` before the first cycle). Published
//! events carry the ids `<forge>:poll:<instance>:<job_id>:<status>`, so two
//! replicas (or two cycles) publishing the same fact store it once. Every
//! forge request counts against `api_budget_per_hour`, a token bucket; when
//! it is empty the rest of the cycle is skipped and the cycle counted as
//! `budget_exhausted`. The reconciler has forge clients of its own, so its
//! requests are counted (and rate limited) apart from the engine's.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runyard_bus::TraceParent;
use runyard_bus::consumer::{Delivery, Handler, HandlerError};
use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, Source, Stage, ids,
    status_token, timestamp,
};
use runyard_forge::api::ApiError;
use runyard_forge::api::github::{GitHubClient, HookDelivery, HookRef, WorkflowJob};
use runyard_forge::api::gitlab::{GitLabClient, GitLabJob};
use runyard_forge::{GithubDelivery, Normalized, normalize_github};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::background::{follow_then_lease, held};
use crate::config::{GitHubHook, RECONCILER_LEASE, ReconcilerSection, split_repo};
use crate::core::policy::PoolSpec;
use crate::core::world::JobId;
use crate::forges::Forges;
use crate::io::Io;
use crate::metrics::{CycleLabel, ForgeLabel, FoundLabel};

/// `Source.producer` of the events the reconciler publishes.
pub const PRODUCER: &str = "reconciler";

/// Deliveries read per page (GitHub's largest page).
const DELIVERIES_PER_PAGE: u32 = 100;

/// Bound on the delivery pages read per hook and cycle (10 000
/// deliveries); the API budget usually stops it first.
const MAX_DELIVERY_PAGES: usize = 100;

/// GitHub redelivers deliveries of the last three days only.
const REDELIVERY_WINDOW: time::Duration = time::Duration::days(3);

/// A GUID whose redeliveries keep failing waits 1, 2, 4, ... cycles
/// between attempts, at most this many.
const MAX_REDELIVERY_SPACING: u64 = 64;

/// A run read because the log holds unfinished jobs of it while no listing
/// shows it is read again at most once per this many intervals.
const STALE_RUN_SPACING: u32 = 10;

/// The GitHub instance the reconciler's jobs belong to: the instance of the
/// configured GitHub pools when they all share one, else the host of a
/// GitHub Enterprise Server API URL (`https://ghe.example.com/api/v3`), else
/// `github.com`. The same rule for GitLab, falling back to the API URL's
/// host. Jobs must carry the instance the pools serve, or none would match.
pub fn instance_for(
    pool_instances: impl IntoIterator<Item = String>,
    forge: Forge,
    api_url: Option<&str>,
) -> String {
    let distinct: BTreeSet<String> = pool_instances.into_iter().collect();
    if distinct.len() == 1
        && let Some(one) = distinct.into_iter().next()
    {
        return one;
    }
    let host = api_url.and_then(url_host);
    match forge {
        Forge::Gitlab => host.unwrap_or_else(|| "gitlab.com".into()),
        _ => match (host, api_url) {
            (Some(h), Some(url)) if url.trim_end_matches('/').ends_with("/api/v3") => h,
            _ => runyard_forge::GITHUB_DOT_COM.into(),
        },
    }
}

/// The lower-cased host of `scheme://host[:port]/...`.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?.split(':').next()?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

// ---------------------------------------------------------------- pure core

/// The job statuses the reconciler publishes, from the forge API's word.
fn poll_status(forge_status: &str) -> Option<JobStatus> {
    match forge_status {
        "queued" => Some(JobStatus::Queued),
        "in_progress" => Some(JobStatus::InProgress),
        "completed" => Some(JobStatus::Completed),
        _ => None,
    }
}

fn rfc3339(t: Option<OffsetDateTime>) -> serde_json::Value {
    t.and_then(|t| t.format(&Rfc3339).ok())
        .map_or(serde_json::Value::Null, serde_json::Value::String)
}

/// A GitHub job from the API as the `JobObserved` ingest makes of its
/// `workflow_job` webhook: the job is dressed as that webhook and handed to
/// ingest's own normalizer, so both paths map every field the same way.
/// `None` for a status the reconciler does not publish or a job the
/// normalizer refuses.
fn github_event(
    job: &WorkflowJob,
    repo: &str,
    instance: &str,
    received_at: OffsetDateTime,
) -> Option<Event> {
    let status = poll_status(&job.status)?;
    let action = status_token(status);
    let id = ids::poll(Forge::Github, instance, job.id, action);
    let payload = serde_json::json!({
        "action": action,
        "workflow_job": {
            "id": job.id,
            "run_id": job.run_id,
            "run_attempt": job.run_attempt,
            "status": job.status,
            "conclusion": job.conclusion,
            "name": job.name,
            "labels": job.labels,
            "runner_id": job.runner_id,
            "runner_name": job.runner_name,
            "workflow_name": job.workflow_name,
            "head_branch": job.head_branch,
            "head_sha": job.head_sha,
            "created_at": rfc3339(job.created_at),
            "started_at": rfc3339(job.started_at),
            "completed_at": rfc3339(job.completed_at),
            "html_url": job.html_url,
        },
        "repository": { "full_name": repo },
    });
    let body = serde_json::to_vec(&payload).ok()?;
    let delivery = GithubDelivery {
        event: Some("workflow_job"),
        delivery_id: Some(&id),
        hook_id: None,
        // Names the instance, as GitHub Enterprise Server's header does.
        enterprise_host: Some(instance),
        content_type: Some("application/json"),
        body: &body,
        received_at,
    };
    let mut event = match normalize_github(&delivery) {
        Ok(Normalized::Events(mut events)) if events.len() == 1 => events.pop()?,
        Ok(_) => return None,
        Err(error) => {
            tracing::warn!(%error, job_id = job.id, "the forge's job does not normalize; skipped");
            return None;
        }
    };
    event.id = id;
    if let Some(source) = event.source.as_mut() {
        source.producer = PRODUCER.into();
    }
    Some(event)
}

/// `group/project` from a job's `web_url` (`<base>/group/project/-/jobs/8`).
fn gitlab_project_path(web_url: &str, base_url: Option<&str>) -> String {
    let Some((project_url, _)) = web_url.split_once("/-/") else {
        return String::new();
    };
    let below_base = base_url
        .map(|b| b.trim_end_matches('/'))
        .and_then(|b| project_url.strip_prefix(b));
    let path = match below_base {
        Some(p) => p,
        None => {
            let rest = project_url
                .split_once("://")
                .map_or(project_url, |(_, r)| r);
            rest.split_once('/').map_or("", |(_, p)| p)
        }
    };
    path.trim_matches('/').to_owned()
}

/// A pending GitLab job from the API as a `queued` `JobObserved`, its
/// labels the job's own `tag_list`.
fn gitlab_event(
    job: &GitLabJob,
    project_id: u64,
    instance: &str,
    base_url: Option<&str>,
    received_at: OffsetDateTime,
) -> Event {
    let status = JobStatus::Queued;
    let id = ids::poll(Forge::Gitlab, instance, job.id, status_token(status));
    let web_url = job.web_url.clone().unwrap_or_default();
    let mut observed = JobObserved {
        job: Some(JobKey {
            forge: Forge::Gitlab as i32,
            instance: instance.to_owned(),
            job_id: job.id,
        }),
        project: gitlab_project_path(&web_url, base_url),
        project_id,
        pipeline_id: job.pipeline_id.unwrap_or_default(),
        // The API has no `retries_count`: unknown, as ingest says without it.
        run_attempt: 0,
        name: job.name.clone(),
        stage: job.stage.clone(),
        labels: job.tag_list.clone(),
        forge_status: job.status.clone(),
        r#ref: job.git_ref.clone(),
        tag: job.tag,
        created_at: job.created_at.map(timestamp),
        allow_failure: job.allow_failure,
        html_url: web_url,
        ..Default::default()
    };
    observed.set_status(status);
    observed.set_conclusion(Conclusion::Unspecified);
    Event {
        occurred_at: Some(timestamp(job.created_at.unwrap_or(received_at))),
        received_at: Some(timestamp(received_at)),
        source: Some(Source {
            forge: Forge::Gitlab as i32,
            instance: instance.to_owned(),
            delivery_id: id.clone(),
            hook_id: String::new(),
            producer: PRODUCER.into(),
        }),
        id,
        body: Some(Body::JobObserved(observed)),
    }
}

/// What was redelivered for one GUID: how often and in which cycle last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Redelivered {
    times: u32,
    cycle: u64,
    at: Instant,
}

/// The deliveries to redeliver now, out of one hook's recent deliveries
/// (newest first): the newest failed `workflow_job` attempt of each GUID
/// that has no successful attempt (the event reached ingest, which dedups
/// by GUID), is still within GitHub's redelivery window, and was not
/// redelivered too recently (`spaced_out` says, from the memory).
fn to_redeliver(
    deliveries: &[HookDelivery],
    now: OffsetDateTime,
    spaced_out: impl Fn(&str) -> bool,
) -> Vec<&HookDelivery> {
    let delivered: HashSet<&str> = deliveries
        .iter()
        .filter(|d| !d.failed())
        .map(|d| d.guid.as_str())
        .collect();
    let mut picked = HashSet::new();
    deliveries
        .iter()
        .filter(|d| d.failed() && d.event == "workflow_job" && !d.guid.is_empty())
        .filter(|d| !delivered.contains(d.guid.as_str()))
        .filter(|d| d.delivered_at.is_none_or(|at| now - at < REDELIVERY_WINDOW))
        .filter(|d| spaced_out(&d.guid))
        .filter(|d| picked.insert(d.guid.as_str()))
        .collect()
}

/// Whether a GUID redelivered `r.times` times, last in cycle `r.cycle`,
/// may go again in cycle `cycle`: once per cycle at most, then 2, 4, ...
/// cycles apart while the redeliveries keep failing.
fn spacing_over(r: &Redelivered, cycle: u64) -> bool {
    let spacing = 1u64
        .checked_shl(r.times.saturating_sub(1))
        .unwrap_or(MAX_REDELIVERY_SPACING)
        .min(MAX_REDELIVERY_SPACING);
    cycle >= r.cycle + spacing
}

/// A token bucket over forge API requests: `per_hour` tokens, refilled
/// continuously, full at start. A request is admitted with one token;
/// requests a call made beyond that (pages, token fetches) are charged
/// after it, possibly into debt.
#[derive(Debug, Clone)]
struct Budget {
    capacity: f64,
    tokens: f64,
    per_second: f64,
    at: Instant,
}

impl Budget {
    fn new(per_hour: u32, now: Instant) -> Self {
        let capacity = f64::from(per_hour.max(1));
        Self {
            capacity,
            tokens: capacity,
            per_second: capacity / 3600.0,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.at = now;
    }

    /// Takes a token if there is one.
    fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Charges requests made beyond the admitted one.
    fn charge(&mut self, requests: u64) {
        self.tokens -= requests as f64;
    }
}

/// A job as the log has shown it.
#[derive(Debug, Clone)]
struct SeenJob {
    /// The status of the log's latest observation in the furthest stage
    /// (`queued` and `waiting` alternate).
    status: JobStatus,
    /// That observation's stage.
    stage: Stage,
    /// GitHub: the repository (lower-cased) and run.
    project: String,
    run_id: u64,
    at: Instant,
}

/// What the log holds about jobs: the current status of each, so only
/// what is missing gets published.
#[derive(Debug, Default)]
struct Seen {
    jobs: HashMap<JobId, SeenJob>,
}

impl Seen {
    fn key(j: &JobObserved) -> Option<JobId> {
        let k = j.job.as_ref()?;
        Some(JobId {
            forge: k.forge(),
            instance: k.instance.clone(),
            job_id: k.job_id,
        })
    }

    fn observe(&mut self, j: &JobObserved, now: Instant) {
        let Some(id) = Self::key(j) else {
            return;
        };
        let status = j.status();
        let entry = self.jobs.entry(id).or_insert_with(|| SeenJob {
            status: JobStatus::Unspecified,
            stage: Stage::Unknown,
            project: j.project.to_ascii_lowercase(),
            run_id: j.pipeline_id,
            at: now,
        });
        // The log is read in order: within a stage the later one wins.
        let stage = Stage::of_job(j);
        if stage >= entry.stage {
            entry.status = status;
            entry.stage = stage;
        }
        if entry.project.is_empty() {
            entry.project = j.project.to_ascii_lowercase();
        }
        if entry.run_id == 0 {
            entry.run_id = j.pipeline_id;
        }
        entry.at = now;
    }

    /// Whether the log lacks `status` (or anything further) for the job: a
    /// job the log has `waiting` lacks `queued` (it was approved, and that
    /// delivery went missing), one it has `in_progress` lacks neither.
    fn lacks(&self, id: &JobId, status: JobStatus) -> bool {
        let stage = Stage::of(status, "");
        self.jobs.get(id).is_none_or(|s| {
            s.stage < stage || (s.stage == stage && stage == Stage::Pending && s.status != status)
        })
    }

    /// Runs of `repo` on `instance` with jobs the log has queued or
    /// running.
    fn unfinished_runs(&self, instance: &str, repo: &str) -> BTreeSet<u64> {
        let repo = repo.to_ascii_lowercase();
        self.jobs
            .iter()
            .filter(|(id, s)| {
                id.forge == Forge::Github
                    && id.instance == instance
                    && s.project == repo
                    && s.run_id != 0
                    && matches!(
                        s.status,
                        JobStatus::Queued | JobStatus::Waiting | JobStatus::InProgress
                    )
            })
            .map(|(_, s)| s.run_id)
            .collect()
    }

    fn prune(&mut self, now: Instant, keep: Duration) {
        self.jobs
            .retain(|_, s| now.saturating_duration_since(s.at) < keep);
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    // A plain map: a panic elsewhere cannot leave it half-written.
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// --------------------------------------------------------------- the shell

/// Why a cycle stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Budget,
    Lease,
}

/// The reconciler task (see the module documentation).
#[derive(Debug)]
pub struct Reconciler {
    section: ReconcilerSection,
    io: Arc<Io>,
    forges: Forges,
    github_instance: String,
    gitlab_instance: String,
    gitlab_url: Option<String>,
    budget: Budget,
    seen: Arc<Mutex<Seen>>,
    redelivered: HashMap<(HookRef, String), Redelivered>,
    stale_checked: HashMap<u64, Instant>,
    cycle: u64,
    errors: bool,
}

impl Reconciler {
    /// A reconciler for `section`, with forge clients of its own (`forges`:
    /// its requests are budgeted and counted apart from the engine's).
    /// `github_api_url` and `gitlab_url` name the instances when the pools
    /// do not (see [`instance_for`]); `specs` are the configured pools'.
    pub fn new(
        section: ReconcilerSection,
        forges: Forges,
        io: Arc<Io>,
        specs: &[PoolSpec],
        github_api_url: &str,
        gitlab_url: Option<&str>,
    ) -> Self {
        let instances = |forge: Forge| {
            specs
                .iter()
                .filter(|s| s.forge == forge)
                .map(|s| s.instance.clone())
                .collect::<Vec<_>>()
        };
        let github_instance = instance_for(
            instances(Forge::Github),
            Forge::Github,
            Some(github_api_url),
        );
        let gitlab_instance = instance_for(instances(Forge::Gitlab), Forge::Gitlab, gitlab_url);
        if forges.github.is_none()
            && !(section.github_repos.is_empty() && section.github_hooks.is_empty())
        {
            tracing::warn!(
                "reconciler: GitHub repositories or hooks configured without GitHub credentials; skipped"
            );
        }
        if forges.gitlab.is_none() && !section.gitlab_projects.is_empty() {
            tracing::warn!(
                "reconciler: GitLab projects configured without a GitLab URL and token; skipped"
            );
        }
        Self {
            budget: Budget::new(section.api_budget_per_hour, Instant::now()),
            section,
            io,
            forges,
            github_instance,
            gitlab_instance,
            gitlab_url: gitlab_url.map(str::to_owned),
            seen: Arc::default(),
            redelivered: HashMap::new(),
            stale_checked: HashMap::new(),
            cycle: 0,
            errors: false,
        }
    }

    /// Runs until `stop`: follows the log's job events, and once it has read
    /// them, reconciles every `interval` while it holds the lease (released
    /// on the way out).
    pub async fn run(mut self, stop: CancellationToken) {
        let Some(leased) = follow_then_lease(
            &self.io,
            "runyard scaler reconciler",
            &["job.>"],
            Follow {
                seen: self.seen.clone(),
            },
            RECONCILER_LEASE,
            &stop,
        )
        .await
        else {
            return;
        };
        let lease = leased.lease.clone();
        tracing::info!(
            interval_s = self.section.interval.as_secs_f64(),
            repos = self.section.github_repos.len(),
            hooks = self.section.github_hooks.len(),
            projects = self.section.gitlab_projects.len(),
            budget_per_hour = self.section.api_budget_per_hour,
            "reconciler started"
        );
        let mut tick = tokio::time::interval(self.section.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            if !held(&lease) {
                continue;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.cycle(&lease) => {}
            }
        }
        leased.finish().await;
        tracing::info!("reconciler stopped");
    }

    /// One pass over every configured hook, project and repository, in an
    /// order that rotates each cycle so a short budget does not starve the
    /// same ones every time.
    #[tracing::instrument(level = "debug", skip_all, fields(cycle = self.cycle + 1))]
    async fn cycle(&mut self, lease: &watch::Receiver<Option<Instant>>) {
        self.cycle += 1;
        self.errors = false;
        let keep = self.io.timers.lookback;
        lock(&self.seen).prune(Instant::now(), keep);
        self.redelivered
            .retain(|_, r| r.at.elapsed() < Duration::from_secs(3 * 24 * 3600));
        let stale_spacing = self.section.interval * STALE_RUN_SPACING;
        self.stale_checked
            .retain(|_, at| at.elapsed() < stale_spacing);

        #[derive(Debug, Clone)]
        enum Work {
            Hook(GitHubHook),
            Project(u64),
            Repo(String),
        }
        let mut work: Vec<Work> = Vec::new();
        if self.forges.github.is_some() {
            work.extend(self.section.github_hooks.iter().cloned().map(Work::Hook));
        }
        if self.forges.gitlab.is_some() {
            work.extend(
                self.section
                    .gitlab_projects
                    .iter()
                    .copied()
                    .map(Work::Project),
            );
        }
        if self.forges.github.is_some() {
            work.extend(self.section.github_repos.iter().cloned().map(Work::Repo));
        }
        if !work.is_empty() {
            let len = work.len();
            work.rotate_left(usize::try_from(self.cycle).unwrap_or(0) % len);
        }
        let mut stopped = None;
        for item in work {
            let done = match item {
                Work::Hook(hook) => self.redeliver_hook(&hook, lease).await,
                Work::Project(project) => self.poll_project(project, lease).await,
                Work::Repo(repo) => self.poll_repo(&repo, lease).await,
            };
            if let Err(stop) = done {
                stopped = Some(stop);
                break;
            }
        }
        let outcome = match stopped {
            Some(Stop::Budget) => {
                tracing::warn!(
                    budget_per_hour = self.section.api_budget_per_hour,
                    "reconciler API budget spent; the rest of this cycle is skipped"
                );
                "budget_exhausted"
            }
            Some(Stop::Lease) => {
                tracing::warn!("reconciler lease lost during a cycle; the rest is skipped");
                "lease_lost"
            }
            None if self.errors => "errors",
            None => "complete",
        };
        self.io
            .metrics
            .reconciler_cycles
            .get_or_create(&CycleLabel { outcome })
            .inc();
    }

    /// Admits one request: the lease must still be held and the budget
    /// have a token.
    fn admit(&mut self, lease: &watch::Receiver<Option<Instant>>) -> Result<(), Stop> {
        if !held(lease) {
            return Err(Stop::Lease);
        }
        if !self.budget.take(Instant::now()) {
            return Err(Stop::Budget);
        }
        Ok(())
    }

    /// Settles a call: `sent` requests went out, one of them admitted.
    fn settle(&mut self, forge: &'static str, sent: u64) {
        self.budget.charge(sent.saturating_sub(1));
        self.io
            .metrics
            .reconciler_api_calls
            .get_or_create(&ForgeLabel { forge })
            .inc_by(sent);
    }

    async fn github<T, F, Fut>(
        &mut self,
        lease: &watch::Receiver<Option<Instant>>,
        call: F,
    ) -> Result<Option<T>, Stop>
    where
        F: FnOnce(GitHubClient) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let Some(gh) = self.forges.github.clone() else {
            return Ok(None);
        };
        self.admit(lease)?;
        let before = gh.calls().total();
        let result = call(gh.clone()).await;
        self.settle("github", gh.calls().total().saturating_sub(before));
        Ok(self.judge(result))
    }

    async fn gitlab<T, F, Fut>(
        &mut self,
        lease: &watch::Receiver<Option<Instant>>,
        call: F,
    ) -> Result<Option<T>, Stop>
    where
        F: FnOnce(GitLabClient) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let Some(gl) = self.forges.gitlab.clone() else {
            return Ok(None);
        };
        self.admit(lease)?;
        let before = gl.calls().total();
        let result = call(gl.clone()).await;
        self.settle("gitlab", gl.calls().total().saturating_sub(before));
        Ok(self.judge(result))
    }

    fn judge<T>(&mut self, result: Result<T, ApiError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(error) => {
                tracing::warn!(%error, "reconciler forge call failed");
                self.errors = true;
                None
            }
        }
    }

    /// Redelivers the failed deliveries of one hook.
    async fn redeliver_hook(
        &mut self,
        hook: &GitHubHook,
        lease: &watch::Receiver<Option<Instant>>,
    ) -> Result<(), Stop> {
        let hook = match hook {
            GitHubHook::Org { org, hook_id } => HookRef::Org {
                org: org.clone(),
                hook_id: *hook_id,
            },
            GitHubHook::Repo {
                owner,
                repo,
                hook_id,
            } => HookRef::Repo {
                owner: owner.clone(),
                repo: repo.clone(),
                hook_id: *hook_id,
            },
            GitHubHook::App => HookRef::App,
        };
        let now = OffsetDateTime::now_utc();
        let Some(deliveries) = self.recent_deliveries(&hook, now, lease).await? else {
            return Ok(());
        };
        let cycle = self.cycle;
        let todo: Vec<(u64, String)> = to_redeliver(&deliveries, now, |guid| {
            self.redelivered
                .get(&(hook.clone(), guid.to_owned()))
                .is_none_or(|r| spacing_over(r, cycle))
        })
        .into_iter()
        .map(|d| (d.id, d.guid.clone()))
        .collect();
        for (id, guid) in todo {
            let sent = {
                let hook = hook.clone();
                self.github(lease, |gh| async move { gh.redeliver(&hook, id).await })
                    .await?
            };
            if sent.is_none() {
                continue;
            }
            let r = self
                .redelivered
                .entry((hook.clone(), guid.clone()))
                .or_insert(Redelivered {
                    times: 0,
                    cycle,
                    at: Instant::now(),
                });
            r.times += 1;
            r.cycle = cycle;
            r.at = Instant::now();
            tracing::info!(delivery_id = id, %guid, hook = ?hook, times = r.times, "failed webhook delivery redelivered");
            self.found("redelivery");
        }
        Ok(())
    }

    /// A hook's deliveries within the lookback window (and GitHub's
    /// three-day redelivery window), newest first: page after page, by the
    /// cursor of each page's `Link: rel="next"`, until a delivery older than
    /// the window, the last page, or the API budget. After an outage of more
    /// than one page of deliveries the older failures are on later pages.
    /// `None` when the first page could not be read.
    async fn recent_deliveries(
        &mut self,
        hook: &HookRef,
        now: OffsetDateTime,
        lease: &watch::Receiver<Option<Instant>>,
    ) -> Result<Option<Vec<HookDelivery>>, Stop> {
        let lookback = time::Duration::try_from(self.io.timers.lookback)
            .unwrap_or(REDELIVERY_WINDOW)
            .min(REDELIVERY_WINDOW);
        let since = now - lookback;
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for page_no in 0..MAX_DELIVERY_PAGES {
            let page = {
                let hook = hook.clone();
                let cursor = cursor.clone();
                self.github(lease, |gh| async move {
                    gh.list_hook_deliveries_page(&hook, DELIVERIES_PER_PAGE, cursor.as_deref())
                        .await
                })
                .await?
            };
            let Some(page) = page else {
                return Ok((page_no > 0).then_some(out));
            };
            let len = page.deliveries.len();
            let before = out.len();
            out.extend(
                page.deliveries
                    .into_iter()
                    .take_while(|d| d.delivered_at.is_none_or(|at| at >= since)),
            );
            // Newest first: past the first delivery older than the window,
            // every later one is older too.
            if out.len() - before < len || len == 0 {
                break;
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(Some(out))
    }

    /// Publishes the pending jobs of one GitLab project the log lacks.
    async fn poll_project(
        &mut self,
        project: u64,
        lease: &watch::Receiver<Option<Instant>>,
    ) -> Result<(), Stop> {
        let listed = self
            .gitlab(
                lease,
                |gl| async move { gl.list_pending_jobs(project).await },
            )
            .await?;
        for job in listed.into_iter().flatten() {
            if job.status != "pending" {
                continue;
            }
            let id = JobId {
                forge: Forge::Gitlab,
                instance: self.gitlab_instance.clone(),
                job_id: job.id,
            };
            if !lock(&self.seen).lacks(&id, JobStatus::Queued) {
                continue;
            }
            let event = gitlab_event(
                &job,
                project,
                &self.gitlab_instance,
                self.gitlab_url.as_deref(),
                OffsetDateTime::now_utc(),
            );
            self.publish(event, "gitlab_job").await;
        }
        Ok(())
    }

    /// Publishes the job statuses of one GitHub repository the log lacks.
    async fn poll_repo(
        &mut self,
        repo: &str,
        lease: &watch::Receiver<Option<Instant>>,
    ) -> Result<(), Stop> {
        let Some((owner, name)) = split_repo(repo) else {
            return Ok(());
        };
        let (owner, name) = (owner.to_owned(), name.to_owned());
        let mut runs = BTreeSet::new();
        for status in ["queued", "in_progress"] {
            let (o, n) = (owner.clone(), name.clone());
            let listed = self
                .github(
                    lease,
                    |gh| async move { gh.list_runs(&o, &n, status).await },
                )
                .await?;
            // Without both listings the stale-run rule below would misfire.
            let Some(listed) = listed else {
                return Ok(());
            };
            runs.extend(listed.into_iter().map(|r| r.id));
        }
        // Runs the log still has unfinished jobs of that neither listing
        // holds: they completed while their last events were lost (a
        // runner would wait for its job's `completed` forever).
        let stale: Vec<u64> = lock(&self.seen)
            .unfinished_runs(&self.github_instance, repo)
            .into_iter()
            .filter(|run| !runs.contains(run) && !self.stale_checked.contains_key(run))
            .collect();
        for run in &stale {
            self.stale_checked.insert(*run, Instant::now());
        }
        for run in runs.into_iter().chain(stale) {
            let (o, n) = (owner.clone(), name.clone());
            let jobs = self
                .github(
                    lease,
                    |gh| async move { gh.list_run_jobs(&o, &n, run).await },
                )
                .await?;
            for job in jobs.into_iter().flatten() {
                let Some(status) = poll_status(&job.status) else {
                    continue;
                };
                let id = JobId {
                    forge: Forge::Github,
                    instance: self.github_instance.clone(),
                    job_id: job.id,
                };
                if !lock(&self.seen).lacks(&id, status) {
                    continue;
                }
                let Some(event) =
                    github_event(&job, repo, &self.github_instance, OffsetDateTime::now_utc())
                else {
                    continue;
                };
                self.publish(event, "github_job").await;
            }
        }
        Ok(())
    }

    /// Publishes a made-up-for event and notes it as seen.
    async fn publish(&mut self, event: Event, kind: &'static str) {
        let Some(Body::JobObserved(job)) = event.body.as_ref() else {
            return;
        };
        let (job_id, status) = (
            job.job.as_ref().map_or(0, |k| k.job_id),
            status_token(job.status()),
        );
        match self
            .io
            .bus
            .publish_event(&event, &TraceParent::new_root())
            .await
        {
            Ok(stored) => {
                lock(&self.seen).observe(job, Instant::now());
                // Another replica (or an earlier cycle) may have published
                // the same fact: only the first telling counts.
                if !stored.duplicate {
                    tracing::info!(job_id, status, kind, event_id = %event.id, "lost job event published");
                    self.found(kind);
                }
            }
            Err(error) => {
                tracing::warn!(%error, job_id, status, "publishing a reconciled job event failed");
                self.errors = true;
            }
        }
    }

    fn found(&self, kind: &'static str) {
        self.io
            .metrics
            .reconciler_found
            .get_or_create(&FoundLabel { kind })
            .inc();
    }
}

/// Folds the log's job events into [`Seen`].
#[derive(Debug)]
struct Follow {
    seen: Arc<Mutex<Seen>>,
}

impl Handler for Follow {
    async fn handle(&self, batch: &[Delivery]) -> Result<Vec<(u64, String)>, HandlerError> {
        let now = Instant::now();
        let mut seen = lock(&self.seen);
        for d in batch {
            if let Some(Body::JobObserved(j)) = &d.event.body {
                seen.observe(j, now);
            }
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2024-06-01 12:10:00 UTC);

    fn job(status: &str) -> WorkflowJob {
        WorkflowJob {
            id: 77,
            run_id: 9,
            run_attempt: 2,
            status: status.into(),
            conclusion: (status == "completed").then(|| "success".into()),
            name: "build (x64)".into(),
            labels: vec!["self-hosted".into(), "linux".into()],
            runner_id: (status != "queued").then_some(31),
            runner_name: (status != "queued").then(|| "ry-linux-abc".into()),
            workflow_name: Some("CI".into()),
            head_branch: Some("main".into()),
            head_sha: "abc123".into(),
            created_at: Some(datetime!(2024-06-01 12:00:00 UTC)),
            started_at: Some(datetime!(2024-06-01 12:01:00 UTC)),
            completed_at: (status == "completed").then_some(datetime!(2024-06-01 12:05:00 UTC)),
            html_url: Some("https://github.com/acme/app/actions/runs/9/job/77".into()),
        }
    }

    fn observed(e: &Event) -> &JobObserved {
        match &e.body {
            Some(Body::JobObserved(j)) => j,
            other => panic!("not a JobObserved: {other:?}"),
        }
    }

    #[test]
    fn github_jobs_map_as_their_webhook_would() {
        let e = github_event(&job("queued"), "acme/app", "github.com", NOW).expect("event");
        assert_eq!(e.id, "github:poll:github.com:77:queued");
        let src = e.source.as_ref().expect("source");
        assert_eq!(
            (src.forge(), src.instance.as_str(), src.producer.as_str()),
            (Forge::Github, "github.com", "reconciler")
        );
        let j = observed(&e);
        assert_eq!(j.status(), JobStatus::Queued);
        assert_eq!(
            j.job.as_ref().map(|k| (k.instance.as_str(), k.job_id)),
            Some(("github.com", 77))
        );
        assert_eq!(
            (j.project.as_str(), j.pipeline_id, j.run_attempt),
            ("acme/app", 9, 2)
        );
        assert_eq!(j.labels, ["self-hosted", "linux"]);
        assert_eq!(
            (j.workflow_name.as_str(), j.name.as_str()),
            ("CI", "build (x64)")
        );
        assert_eq!(j.runner_name, "");
        // Queued: it happened when the job was created.
        assert_eq!(
            e.occurred_at
                .as_ref()
                .and_then(runyard_events::from_timestamp),
            Some(datetime!(2024-06-01 12:00:00 UTC))
        );

        let e = github_event(&job("completed"), "acme/app", "ghe.corp", NOW).expect("event");
        assert_eq!(e.id, "github:poll:ghe.corp:77:completed");
        let j = observed(&e);
        assert_eq!(j.status(), JobStatus::Completed);
        assert_eq!(j.conclusion(), Conclusion::Success);
        assert_eq!(
            (j.runner_name.as_str(), j.runner_id),
            ("ry-linux-abc", Some(31))
        );
        assert_eq!(j.duration_seconds, Some(240.0));
        assert_eq!(
            j.job.as_ref().map(|k| k.instance.as_str()),
            Some("ghe.corp")
        );

        assert_eq!(
            observed(
                &github_event(&job("in_progress"), "acme/app", "github.com", NOW).expect("event")
            )
            .status(),
            JobStatus::InProgress
        );
        for other in ["waiting", "pending", "requested", ""] {
            assert!(
                github_event(&job(other), "acme/app", "github.com", NOW).is_none(),
                "{other}"
            );
        }
    }

    #[test]
    fn gitlab_pending_jobs_are_queued_with_their_tags() {
        let j: GitLabJob = serde_json::from_str(
            r#"{"id":8,"status":"pending","stage":"build","name":"py-torch","ref":"develop","tag":false,
                "tag_list":["spack","large"],"pipeline":{"id":77},"created_at":"2024-06-01T12:00:00Z",
                "web_url":"https://gl.example.com/root/spack/spack/-/jobs/8"}"#,
        )
        .expect("job");
        let e = gitlab_event(
            &j,
            12,
            "gl.example.com",
            Some("https://gl.example.com/root"),
            NOW,
        );
        assert_eq!(e.id, "gitlab:poll:gl.example.com:8:queued");
        let o = observed(&e);
        assert_eq!(o.status(), JobStatus::Queued);
        assert_eq!(o.forge_status, "pending");
        assert_eq!(o.labels, ["spack", "large"]);
        assert_eq!(
            (o.project.as_str(), o.project_id, o.pipeline_id),
            ("spack/spack", 12, 77)
        );
        assert_eq!(
            e.source.as_ref().map(|s| s.producer.as_str()),
            Some("reconciler")
        );
        assert_eq!(
            gitlab_project_path(
                "https://gl.example.com/g/p/-/jobs/8",
                Some("http://127.0.0.1:9")
            ),
            "g/p"
        );
        assert_eq!(gitlab_project_path("nonsense", None), "");
    }

    fn delivery(id: u64, guid: &str, status_code: u16, event: &str) -> HookDelivery {
        HookDelivery {
            id,
            guid: guid.into(),
            status_code,
            status: String::new(),
            delivered_at: Some(NOW - time::Duration::hours(1)),
            redelivery: false,
            event: event.into(),
            action: Some("queued".into()),
            duration: None,
            installation_id: None,
            repository_id: None,
        }
    }

    #[test]
    fn only_failed_deliveries_without_a_later_success_are_redelivered() {
        // Newest first, as GitHub lists them.
        let mut old = delivery(1, "g-old", 502, "workflow_job");
        old.delivered_at = Some(NOW - time::Duration::days(4));
        let list = vec![
            delivery(7, "g-fixed", 202, "workflow_job"),
            delivery(6, "g-down", 0, "workflow_job"),
            delivery(5, "g-down", 503, "workflow_job"),
            delivery(4, "g-fixed", 500, "workflow_job"),
            delivery(3, "g-ok", 200, "workflow_job"),
            delivery(2, "g-ping", 500, "ping"),
            old,
        ];
        let picked: Vec<u64> = to_redeliver(&list, NOW, |_| true)
            .iter()
            .map(|d| d.id)
            .collect();
        // The newest failed attempt of the one GUID never delivered.
        assert_eq!(picked, [6]);
        assert!(to_redeliver(&list, NOW, |g| g != "g-down").is_empty());
    }

    #[test]
    fn redeliveries_of_one_guid_spread_out_while_they_fail() {
        let at = Instant::now();
        let r = |times, cycle| Redelivered { times, cycle, at };
        assert!(!spacing_over(&r(1, 5), 5));
        assert!(spacing_over(&r(1, 5), 6));
        assert!(!spacing_over(&r(3, 5), 8));
        assert!(spacing_over(&r(3, 5), 9));
        assert!(!spacing_over(&r(40, 5), 68));
        assert!(spacing_over(&r(40, 5), 69));
    }

    #[test]
    fn the_budget_is_a_token_bucket() {
        let t0 = Instant::now();
        let mut b = Budget::new(3, t0);
        assert!(b.take(t0) && b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        // One token comes back every 1200 s at 3 an hour.
        assert!(!b.take(t0 + Duration::from_secs(1000)));
        assert!(b.take(t0 + Duration::from_secs(1300)));
        // Pages beyond the admitted request put it into debt.
        let mut b = Budget::new(10, t0);
        assert!(b.take(t0));
        b.charge(9);
        assert!(!b.take(t0));
        let mut full = Budget::new(10, t0);
        assert!(full.take(t0 + Duration::from_secs(7200)));
        assert!(full.tokens <= 9.0);
    }

    fn seen_job(job_id: u64, status: JobStatus, run: u64) -> JobObserved {
        let mut j = JobObserved {
            job: Some(JobKey {
                forge: Forge::Github as i32,
                instance: "github.com".into(),
                job_id,
            }),
            project: "Acme/App".into(),
            pipeline_id: run,
            ..Default::default()
        };
        j.set_status(status);
        j
    }

    #[test]
    fn the_log_says_what_is_lacking_and_which_runs_are_unfinished() {
        let now = Instant::now();
        let mut seen = Seen::default();
        seen.observe(&seen_job(1, JobStatus::InProgress, 10), now);
        seen.observe(&seen_job(1, JobStatus::Queued, 10), now);
        seen.observe(&seen_job(2, JobStatus::Completed, 10), now);
        seen.observe(&seen_job(3, JobStatus::Queued, 11), now);
        seen.observe(&seen_job(4, JobStatus::Completed, 12), now);
        let id = |job_id| JobId {
            forge: Forge::Github,
            instance: "github.com".into(),
            job_id,
        };
        assert!(!seen.lacks(&id(1), JobStatus::Queued));
        assert!(!seen.lacks(&id(1), JobStatus::InProgress));
        assert!(seen.lacks(&id(1), JobStatus::Completed));
        assert!(seen.lacks(&id(9), JobStatus::Queued));
        // Waiting for an approval: the `queued` that follows it is lacking
        // until the log has it.
        seen.observe(&seen_job(5, JobStatus::Waiting, 13), now);
        assert!(seen.lacks(&id(5), JobStatus::Queued));
        assert!(!seen.lacks(&id(5), JobStatus::Waiting));
        seen.observe(&seen_job(5, JobStatus::Queued, 13), now);
        assert!(!seen.lacks(&id(5), JobStatus::Queued));
        assert!(seen.lacks(&id(5), JobStatus::InProgress));
        assert_eq!(
            seen.unfinished_runs("github.com", "acme/app"),
            BTreeSet::from([10, 11, 13])
        );
        assert!(seen.unfinished_runs("ghe.corp", "acme/app").is_empty());
        seen.prune(now + Duration::from_secs(10), Duration::from_secs(5));
        assert!(seen.jobs.is_empty());
    }

    #[test]
    fn instances_follow_the_pools_then_the_api_url() {
        let none = Vec::<String>::new;
        assert_eq!(
            instance_for(none(), Forge::Github, Some("https://api.github.com")),
            "github.com"
        );
        assert_eq!(
            instance_for(none(), Forge::Github, Some("http://127.0.0.1:4000")),
            "github.com"
        );
        assert_eq!(
            instance_for(none(), Forge::Github, Some("https://GHE.corp/api/v3/")),
            "ghe.corp"
        );
        assert_eq!(
            instance_for(
                vec!["ghe.corp".into()],
                Forge::Github,
                Some("http://127.0.0.1:4000")
            ),
            "ghe.corp"
        );
        assert_eq!(
            instance_for(
                none(),
                Forge::Gitlab,
                Some("https://gitlab.example.com:8443/")
            ),
            "gitlab.example.com"
        );
        assert_eq!(
            instance_for(
                vec!["a.example".into(), "b.example".into()],
                Forge::Gitlab,
                None
            ),
            "gitlab.com"
        );
    }
}
