//! OOM retry: a job attempt that was OOM-killed comes back with more memory.
//!
//! The retrier follows the log's job, pipeline, usage and retry events into
//! a [`Book`] (pure: classification, streaks, decisions) and, on the replica
//! holding the `task.retrier` lease, acts on what [`Book::plan`] says:
//!
//! - **GitLab, strategy `pipeline`** (default): once a pipeline holding an
//!   OOM-killed job under the limit has failed, one new pipeline for its ref
//!   (`POST /projects/:id/pipeline`, variable `RUNYARD_RETRY_OF=<id>`), whose
//!   generate step asks the allocator again and gets the bumped limit;
//! - **GitLab, strategy `job`**: `POST /projects/:id/jobs/:job_id/retry`;
//! - **GitHub**: once the run is `completed`, `rerun-failed-jobs` when every
//!   failed job of its latest attempt was OOM-killed under the limit, else
//!   the OOM-killed jobs one at a time, each after the previous attempt
//!   completed. The re-run keeps its labels, so the engine creates its
//!   runner with the flavor that covers the bumped limit.
//!
//! Every decision is an event on `<ns>.v1.retry.<forge>`: `RetryRequested`
//! before the forge is asked, then `RetryIssued` or `RetryRefused`. Ids are
//! deterministic, and the forge call is guarded three times: the unit is
//! claimed in `<NS>_CLAIMS` (one replica asks), a forge error that may have
//! hidden a success (`5xx`, a timeout) is followed by a look at the forge
//! before asking again (a pipeline with `RUNYARD_RETRY_OF`, a newer run
//! attempt), and a request the log holds without an outcome (a replica
//! stopped mid-way) is finished the same way by the next lease holder.

mod book;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use backon::BackoffBuilder as _;
use runyard_bus::consumer::{Delivery, Handler, HandlerError};
use runyard_events::{
    Body, Event, Forge, RetryIssued, RetryJob, RetryRefused, RetryRequested, RetryTarget,
    forge_token, ids, key_token,
};
use runyard_forge::api::ApiError;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use book::{Book, ListedJob, Plan, RunDecision, RunView};

use crate::background::{follow_then_lease, held, publish_own};
use crate::config::{RETRIER_LEASE, RetrySection, split_repo};
use crate::io::Io;
use crate::kv::Claim;
use crate::metrics::RetryLabel;
use crate::progress::Progress;

/// The variable a retry pipeline carries: the failed pipeline's id.
pub const RETRY_OF_VARIABLE: &str = "RUNYARD_RETRY_OF";

/// The retrier's book as the engine reads it: what runyard's own retries
/// made, so a retry's runner is sized as the retry of the killed attempt.
#[derive(Debug, Clone, Default)]
pub struct Lineage(Arc<Mutex<Book>>);

impl Lineage {
    /// The killed job a GitLab job retry of runyard's made `job` from, and
    /// the pipeline a GitLab pipeline made by a retry retried (`pipeline`
    /// is `job`'s).
    pub fn retried_from(&self, job: &book::JobRef, pipeline: u64) -> (Option<u64>, Option<u64>) {
        let book = lock(&self.0);
        let (old_job, old_pipeline) = book.retried_from(job, pipeline);
        (old_job.map(|j| j.2), old_pipeline)
    }

    /// Folds one event in, as the retrier's follow does.
    #[cfg(test)]
    pub(crate) fn observe(&self, event: &Event) {
        lock(&self.0).observe(event);
    }
}

/// Folds the log into the book.
#[derive(Debug)]
struct Fold {
    book: Arc<Mutex<Book>>,
    progress: Arc<Progress>,
}

impl Handler for Fold {
    async fn handle(&self, batch: &[Delivery]) -> Result<Vec<(u64, String)>, HandlerError> {
        let mut book = lock(&self.book);
        for d in batch {
            book.observe(&d.event);
            self.progress.folded(d.seq);
        }
        Ok(Vec::new())
    }
}

fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    // Plain maps: a panic elsewhere cannot leave them half-written.
    book.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How asking the forge ended.
enum Asked<T> {
    /// The forge did it now.
    Issued(T),
    /// The forge had done it already (an earlier answer was lost).
    Adopted(T),
    /// The forge said no (`4xx`).
    Rejected(ApiError),
    /// Transient failures until the attempts ran out: the request stays in
    /// flight and is tried again later.
    Pending,
}

/// Forge calls spent on one retry and the transient errors met.
#[derive(Debug, Default)]
struct Spent {
    calls: u32,
    errors: Vec<String>,
}

/// What a retry produced at the forge.
#[derive(Debug, Default)]
struct Made {
    new_pipeline_id: u64,
    new_job_ids: Vec<u64>,
    new_sha: String,
    new_run_attempt: u32,
    web_url: String,
    /// What could not be done as asked (see `RetryIssued.note`).
    note: String,
}

/// The retrier task (see the module documentation).
#[derive(Debug)]
pub struct Retrier {
    io: Arc<Io>,
    settings: RetrySection,
    book: Arc<Mutex<Book>>,
    /// Per unit or run: not before this instant again.
    next_check: HashMap<String, Instant>,
    /// Requests this process left in flight (tried again after
    /// `poll_interval`; others' after [`Retrier::resume_after`]).
    mine: HashMap<String, Instant>,
    /// How far it has got (`/v1/pools`' `retrier`): each event it
    /// publishes counts as an operation.
    progress: Arc<Progress>,
}

impl Retrier {
    /// A retrier acting with the engine's forge clients, keeping its book
    /// in `io.lineage`.
    pub fn new(io: Arc<Io>, settings: RetrySection) -> Self {
        let book = io.lineage.0.clone();
        Self {
            io,
            settings,
            book,
            next_check: HashMap::new(),
            mine: HashMap::new(),
            progress: Arc::default(),
        }
    }

    /// Its counters, for `/v1/pools`.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// How old another replica's unfinished request must be before this one
    /// finishes it (the other may still be asking the forge).
    fn resume_after(&self) -> Duration {
        self.io.timers.lease_ttl * 2 + self.io.timers.forge_timeout * 5
    }

    /// Runs until `stop`: follows the log, and once it has read it, acts
    /// while it holds the lease (released on the way out).
    pub async fn run(mut self, stop: CancellationToken) {
        let Some(leased) = follow_then_lease(
            &self.io,
            "runyard scaler retrier",
            &["job.>", "pipeline.>", "usage.>", "retry.>"],
            Fold {
                book: self.book.clone(),
                progress: self.progress.clone(),
            },
            RETRIER_LEASE,
            &stop,
        )
        .await
        else {
            return;
        };
        let lease = leased.lease.clone();
        tracing::info!(
            wait_for_report_s = self.settings.wait_for_report.as_secs_f64(),
            max_retries = self.settings.max_retries,
            gitlab = ?self.settings.gitlab_strategy,
            github = ?self.settings.github_strategy,
            "OOM retrier started"
        );
        let period = self
            .io
            .timers
            .tick
            .min(self.settings.poll_interval)
            .max(Duration::from_millis(50));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pruned = Instant::now();
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
                () = self.round(&lease, &stop) => self.progress.round(0),
            }
            if pruned.elapsed() > Duration::from_secs(60) {
                pruned = Instant::now();
                lock(&self.book).prune(OffsetDateTime::now_utc(), self.io.timers.lookback);
            }
        }
        leased.finish().await;
        tracing::info!("OOM retrier stopped");
    }

    /// Whether `key` may be looked at now; if so, not again for
    /// `poll_interval`.
    fn due(&mut self, key: &str) -> bool {
        let now = Instant::now();
        match self.next_check.get(key) {
            Some(at) if *at > now => false,
            _ => {
                self.next_check
                    .insert(key.to_owned(), now + self.settings.poll_interval);
                true
            }
        }
    }

    async fn round(&mut self, lease: &watch::Receiver<Option<Instant>>, stop: &CancellationToken) {
        let now = OffsetDateTime::now_utc();
        let in_flight: Vec<Event> = lock(&self.book).in_flight().cloned().collect();
        for request in in_flight {
            if !held(lease) || stop.is_cancelled() {
                return;
            }
            self.resume(&request, now, stop).await;
        }
        let plans = lock(&self.book).plan(&self.settings, now);
        for plan in plans {
            if !held(lease) || stop.is_cancelled() {
                return;
            }
            match plan {
                Plan::Refuse {
                    id,
                    target,
                    reason,
                    detail,
                    jobs,
                } => {
                    let refused = RetryRefused {
                        target: Some(target),
                        reason: reason.as_str().into(),
                        detail,
                        jobs,
                        forge_status: None,
                        forge_calls: 0,
                    };
                    self.refused(id, refused).await;
                }
                Plan::GitLabPipeline { target, jobs } => {
                    self.request(target, "pipeline", jobs, None, stop).await;
                }
                Plan::GitLabJob { target, job } => {
                    self.request(target, "job", vec![job], None, stop).await;
                }
                Plan::CheckPipeline {
                    pipeline,
                    project_id,
                } => {
                    let key = format!("pipeline:{}:{}", pipeline.1, pipeline.2);
                    let Some(gl) = self.io.forges.gitlab.clone() else {
                        continue;
                    };
                    if !self.due(&key) {
                        continue;
                    }
                    match gl.get_pipeline(project_id, pipeline.2).await {
                        Ok(p) => lock(&self.book).set_pipeline_status(&pipeline, &p.status),
                        Err(error) => {
                            tracing::warn!(%error, pipeline_id = pipeline.2, "reading a pipeline for an OOM retry failed");
                        }
                    }
                }
                Plan::CheckRun { run, repo } => {
                    let key = format!("run:{}:{}", run.1, run.2);
                    if self.due(&key) {
                        self.check_run(run, repo, stop).await;
                    }
                }
            }
        }
    }

    /// Reads a GitHub run and its latest attempt's jobs, and acts on
    /// [`Book::decide_run`].
    async fn check_run(&mut self, run: book::UnitRef, repo: String, stop: &CancellationToken) {
        let Some(gh) = self.io.forges.github.clone() else {
            return;
        };
        let Some((owner, name)) = split_repo(&repo) else {
            return;
        };
        let r = match gh.get_run(owner, name, run.2).await {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, run_id = run.2, "reading a run for an OOM retry failed");
                return;
            }
        };
        if r.status != "completed" {
            return;
        }
        let listed = match gh.list_run_jobs(owner, name, run.2).await {
            Ok(jobs) => jobs,
            Err(error) => {
                tracing::warn!(%error, run_id = run.2, "listing a run's jobs for an OOM retry failed");
                return;
            }
        };
        let view = RunView {
            run,
            repo: repo.clone(),
            status: r.status,
            attempt: r.run_attempt,
            created_at: r.created_at,
            git_ref: r.head_branch.unwrap_or_default(),
            sha: r.head_sha,
        };
        let jobs: Vec<ListedJob> = listed
            .into_iter()
            .map(|j| ListedJob {
                id: j.id,
                attempt: j.run_attempt,
                name: j.name,
                conclusion: j.conclusion,
                completed_at: j.completed_at,
            })
            .collect();
        let decision =
            lock(&self.book).decide_run(&view, &jobs, &self.settings, OffsetDateTime::now_utc());
        match decision {
            RunDecision::Wait | RunDecision::Settled | RunDecision::Done => {}
            RunDecision::RerunFailed { target, jobs } => {
                self.request(target, "rerun_failed_jobs", jobs, None, stop)
                    .await;
            }
            RunDecision::RerunJob { target, job } => {
                let job_id = job.job.as_ref().map_or(0, |k| k.job_id);
                self.request(target, "rerun_job", vec![job], Some(job_id), stop)
                    .await;
            }
            RunDecision::Refuse {
                id,
                target,
                reason,
                detail,
                jobs,
            } => {
                let refused = RetryRefused {
                    target: Some(target),
                    reason: reason.as_str().into(),
                    detail,
                    jobs,
                    forge_status: None,
                    forge_calls: 2,
                };
                self.refused(id, refused).await;
            }
        }
    }

    /// Records the request, claims the unit and asks the forge.
    async fn request(
        &mut self,
        target: RetryTarget,
        strategy: &str,
        jobs: Vec<RetryJob>,
        job_id: Option<u64>,
        stop: &CancellationToken,
    ) {
        let forge = target.forge();
        let what = |state: &str| match job_id {
            Some(id) => format!("job:{id}:{state}"),
            None => state.to_owned(),
        };
        let id = ids::retry(forge, &target.instance, &target.unit, &what("requested"));
        let request = RetryRequested {
            target: Some(target.clone()),
            strategy: strategy.into(),
            jobs,
        };
        let Some(event) = self
            .publish(id, forge, &target.instance, Body::RetryRequested(request))
            .await
        else {
            return;
        };
        let claim = format!(
            "retry.{}.{}.{}",
            forge_token(forge),
            key_token(&target.instance),
            key_token(&target.unit)
        );
        match self.io.coord.claim(&claim, self.io.coord.replica()).await {
            Ok(Claim::Won) => {}
            Ok(Claim::Held(by)) => {
                tracing::info!(unit = %target.unit, held_by = %by, "retry claimed before; left to its holder");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, unit = %target.unit, "claiming a retry failed; tried again later");
                self.mine.insert(unit_of(&target), Instant::now());
                return;
            }
        }
        self.ask(&event, false, stop).await;
    }

    /// Finishes a request the log holds without an outcome.
    async fn resume(&mut self, request: &Event, now: OffsetDateTime, stop: &CancellationToken) {
        let Some(Body::RetryRequested(r)) = &request.body else {
            return;
        };
        let Some(target) = &r.target else {
            return;
        };
        let unit = unit_of(target);
        let ready = match self.mine.get(&unit) {
            Some(at) => at.elapsed() >= self.settings.poll_interval,
            None => {
                let at = request
                    .occurred_at
                    .as_ref()
                    .and_then(runyard_events::from_timestamp)
                    .unwrap_or(now);
                (now - at).unsigned_abs() >= self.resume_after()
            }
        };
        if ready {
            tracing::info!(%unit, "finishing a retry requested earlier");
            self.ask(request, true, stop).await;
        }
    }

    /// Asks the forge for the retry `request` describes (looking first
    /// whether it was done already when `look_first`), and records the
    /// outcome.
    async fn ask(&mut self, request: &Event, look_first: bool, stop: &CancellationToken) {
        let Some(Body::RetryRequested(r)) = &request.body else {
            return;
        };
        let Some(target) = r.target.clone() else {
            return;
        };
        let forge = target.forge();
        let unit = unit_of(&target);
        let job_part = request
            .id
            .strip_suffix(":requested")
            .and_then(|s| s.rsplit_once(":job:"))
            .map(|(_, id)| id.to_owned());
        let (asked, spent) = match (forge, r.strategy.as_str()) {
            (Forge::Gitlab, "pipeline") => self.gitlab_pipeline(&target, look_first, stop).await,
            (Forge::Gitlab, "job") => self.gitlab_job(&target, r, stop).await,
            (Forge::Github, "rerun_failed_jobs" | "rerun_job") => {
                self.github_rerun(&target, r, stop).await
            }
            _ => {
                tracing::warn!(strategy = %r.strategy, "unknown retry strategy; refused");
                (
                    Asked::Rejected(ApiError::Config(format!(
                        "unknown strategy {:?}",
                        r.strategy
                    ))),
                    Spent::default(),
                )
            }
        };
        let what = |state: &str| match &job_part {
            Some(id) => format!("job:{id}:{state}"),
            None => state.to_owned(),
        };
        match asked {
            Asked::Issued(made) => {
                self.issued(&target, r, made, spent, false, &what("issued"))
                    .await;
            }
            Asked::Adopted(made) => {
                self.issued(&target, r, made, spent, true, &what("issued"))
                    .await;
            }
            Asked::Rejected(error) => {
                let refused = RetryRefused {
                    target: Some(target.clone()),
                    reason: runyard_events::RetryRefusal::ForgeRejected.as_str().into(),
                    detail: error.to_string(),
                    jobs: r.jobs.clone(),
                    forge_status: error.status().map(u32::from),
                    forge_calls: spent.calls,
                };
                let id = ids::retry(forge, &target.instance, &target.unit, "refused");
                self.refused(id, refused).await;
                self.mine.remove(&unit);
            }
            Asked::Pending => {
                tracing::warn!(%unit, errors = ?spent.errors, "the forge did not take the retry yet; tried again later");
                self.mine.insert(unit, Instant::now());
            }
        }
    }

    async fn issued(
        &mut self,
        target: &RetryTarget,
        r: &RetryRequested,
        made: Made,
        spent: Spent,
        adopted: bool,
        what: &str,
    ) {
        let forge = target.forge();
        let id = ids::retry(forge, &target.instance, &target.unit, what);
        let issued = RetryIssued {
            target: Some(target.clone()),
            strategy: r.strategy.clone(),
            jobs: r.jobs.clone(),
            new_pipeline_id: made.new_pipeline_id,
            new_job_ids: made.new_job_ids,
            new_sha: made.new_sha,
            new_run_attempt: made.new_run_attempt,
            web_url: made.web_url,
            forge_calls: spent.calls,
            errors: spent.errors,
            adopted,
            note: made.note,
        };
        if self
            .publish(id, forge, &target.instance, Body::RetryIssued(issued))
            .await
            .is_some()
        {
            self.mine.remove(&unit_of(target));
            tracing::info!(unit = %target.unit, strategy = %r.strategy, adopted, "OOM retry issued");
            self.count(forge, if adopted { "adopted" } else { "issued" }, "");
        }
    }

    async fn refused(&mut self, id: String, refused: RetryRefused) {
        let Some(target) = refused.target.clone() else {
            return;
        };
        if lock(&self.book).has_event(&id) {
            return;
        }
        let forge = target.forge();
        let reason = runyard_events::RetryRefusal::parse(&refused.reason)
            .unwrap_or(runyard_events::RetryRefusal::ForgeRejected)
            .as_str();
        tracing::info!(unit = %target.unit, reason, detail = %refused.detail, "OOM retry refused");
        if self
            .publish(id, forge, &target.instance, Body::RetryRefused(refused))
            .await
            .is_some()
        {
            self.count(forge, "refused", reason);
        }
    }

    fn count(&self, forge: Forge, outcome: &'static str, reason: &'static str) {
        self.io
            .metrics
            .retries
            .get_or_create(&RetryLabel {
                forge: forge_token(forge),
                outcome,
                reason,
            })
            .inc();
    }

    /// Publishes a retry event (a few attempts) and folds it in.
    async fn publish(&self, id: String, forge: Forge, instance: &str, body: Body) -> Option<Event> {
        self.progress.started();
        let event = publish_own(&self.io, forge, instance, id, body, 5).await?;
        lock(&self.book).observe(&event);
        Some(event)
    }

    /// GitLab: one new pipeline for the failed one's ref.
    async fn gitlab_pipeline(
        &self,
        target: &RetryTarget,
        look_first: bool,
        stop: &CancellationToken,
    ) -> (Asked<Made>, Spent) {
        let Some(gl) = self.io.forges.gitlab.clone() else {
            return (no_client("GitLab"), Spent::default());
        };
        let failed = target.pipeline_id;
        let project = target.project_id;
        let git_ref = target.r#ref.clone();
        let look = || {
            let (gl, git_ref) = (gl.clone(), git_ref.clone());
            async move {
                let recent = gl.list_pipelines(project, &git_ref, "api", 50).await?;
                for p in recent.into_iter().filter(|p| p.id > failed) {
                    let vars = gl.pipeline_variables(project, p.id).await?;
                    if vars
                        .iter()
                        .any(|(k, v)| k == RETRY_OF_VARIABLE && *v == failed.to_string())
                    {
                        return Ok(Some(pipeline_made(p)));
                    }
                }
                Ok(None)
            }
        };
        let post = || {
            let (gl, git_ref) = (gl.clone(), git_ref.clone());
            let variables = vec![(RETRY_OF_VARIABLE.to_owned(), failed.to_string())];
            async move {
                match gl.create_pipeline(project, &git_ref, &variables).await {
                    // GitLab.com's default for new projects
                    // (`ci_pipeline_variables_minimum_override_role =
                    // no_one_allowed`): no variable may be set. The retry
                    // goes without; the link lives in the event log.
                    Err(ApiError::Status {
                        status: 400 | 403,
                        message,
                        ..
                    }) if message.to_ascii_lowercase().contains("variables") => {
                        tracing::warn!(project, failed, %message, "pipeline variables refused; retrying without RUNYARD_RETRY_OF");
                        let mut made =
                            pipeline_made(gl.create_pipeline(project, &git_ref, &[]).await?);
                        made.note = format!(
                            "GitLab refused pipeline variables ({message}); the new pipeline runs without {RETRY_OF_VARIABLE}, linked to pipeline {failed} by this event"
                        );
                        Ok(made)
                    }
                    other => other.map(pipeline_made),
                }
            }
        };
        attempt(look_first, look, post, ApiError::is_transient, stop).await
    }

    /// GitLab: retry the job.
    async fn gitlab_job(
        &self,
        target: &RetryTarget,
        r: &RetryRequested,
        stop: &CancellationToken,
    ) -> (Asked<Made>, Spent) {
        let Some(gl) = self.io.forges.gitlab.clone() else {
            return (no_client("GitLab"), Spent::default());
        };
        let Some(job_id) = r
            .jobs
            .first()
            .and_then(|j| j.job.as_ref())
            .map(|k| k.job_id)
        else {
            return (Asked::Pending, Spent::default());
        };
        let project = target.project_id;
        // A retried job leaves no mark on the old one to look for.
        let look = || async { Ok(None) };
        let post = || {
            let gl = gl.clone();
            async move {
                gl.retry_job(project, job_id).await.map(|j| Made {
                    new_pipeline_id: j.pipeline_id.unwrap_or_default(),
                    new_job_ids: vec![j.id],
                    note: "a retried GitLab job keeps its variables: a memory limit the job \
                           sets itself is not raised; only the runner runyard makes for it is \
                           sized for the bumped limit"
                        .into(),
                    ..Made::default()
                })
            }
        };
        attempt(false, look, post, ApiError::is_transient, stop).await
    }

    /// GitHub: `rerun-failed-jobs` or one job's re-run. A `403` is GitHub
    /// refusing while the run is in progress: transient, unless the run is
    /// completed (then it is a refusal).
    async fn github_rerun(
        &self,
        target: &RetryTarget,
        r: &RetryRequested,
        stop: &CancellationToken,
    ) -> (Asked<Made>, Spent) {
        let Some(gh) = self.io.forges.github.clone() else {
            return (no_client("GitHub"), Spent::default());
        };
        let Some((owner, name)) = split_repo(&target.project) else {
            return (
                Asked::Rejected(ApiError::Config(format!(
                    "{:?} is not owner/repo",
                    target.project
                ))),
                Spent::default(),
            );
        };
        let run_id = target.pipeline_id;
        let failed_attempt = target.run_attempt;
        let job_id = r
            .jobs
            .first()
            .and_then(|j| j.job.as_ref())
            .map(|k| k.job_id);
        let whole = r.strategy == "rerun_failed_jobs";
        let (owner_s, name_s) = (owner.to_owned(), name.to_owned());
        let look = || {
            let (gh, owner, name) = (gh.clone(), owner_s.clone(), name_s.clone());
            async move {
                let run = gh.get_run(&owner, &name, run_id).await?;
                Ok((run.run_attempt > failed_attempt).then(|| Made {
                    new_run_attempt: run.run_attempt,
                    web_url: run.html_url.unwrap_or_default(),
                    ..Made::default()
                }))
            }
        };
        let post = || {
            let (gh, owner, name) = (gh.clone(), owner_s.clone(), name_s.clone());
            async move {
                match (whole, job_id) {
                    (true, _) | (false, None) => gh.rerun_failed_jobs(&owner, &name, run_id).await,
                    (false, Some(job)) => gh.rerun_job(&owner, &name, job).await,
                }
                .map(|()| Made {
                    new_run_attempt: failed_attempt + 1,
                    ..Made::default()
                })
            }
        };
        let transient = |e: &ApiError| e.is_transient() || e.status() == Some(403);
        let (asked, mut spent) = attempt(true, look, post, transient, stop).await;
        if let Asked::Pending = asked
            && spent.errors.last().is_some_and(|e| e.contains("403"))
        {
            // Still refused: if the run is completed, that is a real no.
            spent.calls += 1;
            if let Ok(run) = gh.get_run(owner, name, run_id).await
                && run.status == "completed"
                && run.run_attempt == failed_attempt
            {
                let last = spent.errors.last().cloned().unwrap_or_default();
                return (
                    Asked::Rejected(ApiError::Status {
                        status: 403,
                        endpoint_kind: "github_rerun",
                        message: last,
                    }),
                    spent,
                );
            }
        }
        (asked, spent)
    }
}

fn pipeline_made(p: runyard_forge::api::gitlab::GitLabPipeline) -> Made {
    Made {
        new_pipeline_id: p.id,
        new_sha: p.sha,
        web_url: p.web_url,
        ..Made::default()
    }
}

fn no_client<T>(forge: &str) -> Asked<T> {
    tracing::warn!(
        forge,
        "an OOM retry needs {forge} API credentials; none are configured"
    );
    Asked::Pending
}

fn unit_of(target: &RetryTarget) -> String {
    format!(
        "{}:{}:{}",
        forge_token(target.forge()),
        target.instance,
        target.unit
    )
}

/// Asks the forge with `post`, retrying transient failures with jittered
/// exponential back-off; after a failure that may have hidden a success,
/// and first when `look_first`, `look` says whether it was done already.
async fn attempt<T, L, LF, P, PF>(
    look_first: bool,
    look: L,
    post: P,
    transient: impl Fn(&ApiError) -> bool,
    stop: &CancellationToken,
) -> (Asked<T>, Spent)
where
    L: Fn() -> LF,
    LF: Future<Output = Result<Option<T>, ApiError>>,
    P: Fn() -> PF,
    PF: Future<Output = Result<T, ApiError>>,
{
    let mut delays = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(4)
        .with_jitter()
        .build();
    let mut spent = Spent::default();
    let mut looking = look_first;
    loop {
        let failure = if looking {
            spent.calls += 1;
            match look().await {
                Ok(Some(done)) => return (Asked::Adopted(done), spent),
                Ok(None) => None,
                Err(e) if transient(&e) => Some(e),
                Err(e) => return (Asked::Rejected(e), spent),
            }
        } else {
            None
        };
        let failure = match failure {
            Some(e) => e,
            None => {
                spent.calls += 1;
                match post().await {
                    Ok(done) => return (Asked::Issued(done), spent),
                    Err(e) if transient(&e) => e,
                    Err(e) => return (Asked::Rejected(e), spent),
                }
            }
        };
        spent.errors.push(failure.to_string());
        looking = true;
        let Some(delay) = delays.next() else {
            return (Asked::Pending, spent);
        };
        tokio::select! {
            () = stop.cancelled() => return (Asked::Pending, spent),
            () = tokio::time::sleep(delay) => {}
        }
    }
}
