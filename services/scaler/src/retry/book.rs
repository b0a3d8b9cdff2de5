//! The retrier's view of the log, and its decisions: pure code, "now"
//! passed in.
//!
//! The book folds job, pipeline, usage and retry events (in log order) into
//! failed jobs, their usage reports, each workload's OOM streak and the
//! retry decisions already made. [`Book::plan`] says what to do next; the
//! shell (`super`) does it and publishes the events, which fold back in.
//!
//! A streak counts consecutive OOM-killed attempts of one workload (the
//! report's workload attributes, normalized), in the order their reports
//! reach the log; a successful attempt ends it. The 1st..=`max_retries`th
//! kill of a streak each get one retry; a later one is refused
//! (`limit_reached`).
//!
//! The workload is the report's word, so it cannot be what bounds the
//! retries: a job that sends no workload, or another one each time, would
//! start a new streak on every kill. A failed job's **lineage** bounds them
//! whatever its reports say: the retries runyard already issued that led to
//! it, read from its own `RetryIssued` events (a GitLab pipeline made by a
//! retry → the pipeline it retried; a GitLab job made by a retry → the job
//! it retried), and the retries issued for the job as the forge names it
//! (project, ref, job name) since that job last succeeded. A kill whose
//! lineage already holds `max_retries` retries is refused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, RetryJob, RetryRefusal,
    RetryTarget, UsageReported, forge_token, ids, oom_killed,
};
use runyard_store::workload;
use time::OffsetDateTime;

use crate::config::{RetrySection, Strategy};

/// A job across forges: `(forge, instance, job id)`.
pub type JobRef = (Forge, String, u64);

/// A pipeline / run across forges: `(forge, instance, id)`.
pub type UnitRef = (Forge, String, u64);

/// GitHub refuses re-runs of runs older than this.
pub const GITHUB_RERUN_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// GitHub allows at most this many attempts of one run.
pub const GITHUB_MAX_ATTEMPTS: u32 = 50;

/// How far back a lineage is followed (the links come from runyard's own
/// events, so a loop cannot happen; the bound only keeps the walk finite).
const LINEAGE_DEPTH: u32 = 64;

/// A job as the forge names it: `(forge, instance, project, ref, job name)`,
/// the project lower-cased. Retries of a job keep it.
type Identity = (Forge, String, String, String, String);

fn identity(forge: Forge, instance: &str, project: &str, git_ref: &str, name: &str) -> Identity {
    (
        forge,
        instance.to_owned(),
        project.to_ascii_lowercase(),
        git_ref.to_owned(),
        name.to_owned(),
    )
}

/// A job attempt that ended in failure (or a timeout).
#[derive(Debug, Clone, PartialEq)]
pub struct FailedJob {
    /// Which job.
    pub job: JobRef,
    /// Its attempt (GitHub run attempt, GitLab retries + 1).
    pub attempt: u32,
    /// Display name.
    pub name: String,
    /// GitLab `path_with_namespace` / GitHub `owner/repo`.
    pub project: String,
    /// GitLab project id / GitHub repository id.
    pub project_id: u64,
    /// GitLab pipeline / GitHub run.
    pub pipeline_id: u64,
    /// Branch or tag.
    pub git_ref: String,
    /// Commit.
    pub sha: String,
    /// How it ended.
    pub conclusion: Conclusion,
    /// GitLab `build_failure_reason`.
    pub failure_reason: String,
    /// When runyard learned it failed.
    pub failed_at: OffsetDateTime,
}

/// What a usage report says, with the streak it made.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// OOM-killed (`runyard_events::oom_killed`).
    pub oom: bool,
    /// The n-th consecutive OOM kill of its workload (0 when not killed).
    pub streak: u32,
    /// Normalized workload key.
    pub workload_key: String,
    /// Peak memory.
    pub peak: u64,
    /// Memory limit.
    pub limit: Option<u64>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// The project the report names (an identity token's), when it does.
    pub project: String,
}

/// How a failed job attempt is judged.
#[derive(Debug, Clone, PartialEq)]
pub enum Class {
    /// Cancelled or skipped: not a failure we act on, no event.
    Cancelled,
    /// Its usage report may still come.
    Waiting,
    /// Killed for another reason (the words say which).
    NotOom(String),
    /// No usage report within `wait_for_report`.
    NoReport,
    /// OOM-killed.
    Oom(Report),
}

/// A GitLab pipeline as the log (or the API) describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineFacts {
    /// GitLab's status word (`failed`, `running`, ...), empty when unknown.
    pub status: String,
    /// Project id.
    pub project_id: u64,
    /// Project path.
    pub project: String,
    /// Branch or tag.
    pub git_ref: String,
    /// Commit.
    pub sha: String,
    /// A child pipeline's parent (0: none, or not known yet) and that
    /// parent's project.
    pub parent: u64,
    /// The parent's project id.
    pub parent_project_id: u64,
}

/// The OOM-killed jobs of one pipeline, with their reports.
type Kills<'a> = Vec<(&'a FailedJob, Report)>;

/// What the shell should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Publish a refusal (its id is deterministic: publishing twice is
    /// harmless).
    Refuse {
        /// Event id.
        id: String,
        /// Target.
        target: RetryTarget,
        /// Reason.
        reason: RetryRefusal,
        /// Plain words.
        detail: String,
        /// The job attempts concerned.
        jobs: Vec<RetryJob>,
    },
    /// GitLab: a new pipeline for the failed one's ref.
    GitLabPipeline {
        /// Target (unit `pipeline:<id>`).
        target: RetryTarget,
        /// The OOM-killed jobs it is for.
        jobs: Vec<RetryJob>,
    },
    /// GitLab: retry one job.
    GitLabJob {
        /// Target (unit `job:<id>:<attempt>`).
        target: RetryTarget,
        /// The job.
        job: RetryJob,
    },
    /// GitLab: the pipeline's status is needed (it has OOM-killed jobs to
    /// retry but the log has not said it failed).
    CheckPipeline {
        /// Which pipeline.
        pipeline: UnitRef,
        /// Its project.
        project_id: u64,
    },
    /// GitHub: read the run (and, once completed, its jobs) and decide with
    /// [`Book::decide_run`].
    CheckRun {
        /// Which run.
        run: UnitRef,
        /// `owner/repo`.
        repo: String,
    },
}

/// A GitHub run as its API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunView {
    /// Which run.
    pub run: UnitRef,
    /// `owner/repo`.
    pub repo: String,
    /// `completed`, `in_progress`, ...
    pub status: String,
    /// The latest attempt.
    pub attempt: u32,
    /// When the run was created.
    pub created_at: Option<OffsetDateTime>,
    /// Branch.
    pub git_ref: String,
    /// Commit.
    pub sha: String,
}

/// A job of the run's latest attempt, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedJob {
    /// Job id.
    pub id: u64,
    /// The attempt it ran in.
    pub attempt: u32,
    /// Display name.
    pub name: String,
    /// `failure`, `success`, `cancelled`, `timed_out`, ... (`None` while not
    /// completed).
    pub conclusion: Option<String>,
    /// When it completed.
    pub completed_at: Option<OffsetDateTime>,
}

/// What to do with a completed GitHub run attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum RunDecision {
    /// Not yet: the run is not completed, or a report may still come.
    Wait,
    /// Nothing to re-run (the failures were judged job by job).
    Settled,
    /// Already acted on this attempt.
    Done,
    /// `rerun-failed-jobs`: every failed job was OOM-killed under the limit.
    RerunFailed {
        /// Target (unit `run:<id>:<attempt>`).
        target: RetryTarget,
        /// The jobs.
        jobs: Vec<RetryJob>,
    },
    /// Re-run one OOM-killed job (the others wait for this attempt to end).
    RerunJob {
        /// Target (unit `run:<id>:<attempt>`).
        target: RetryTarget,
        /// The job.
        job: RetryJob,
    },
    /// GitHub's own limits say no.
    Refuse {
        /// Event id.
        id: String,
        /// Target.
        target: RetryTarget,
        /// `RerunWindowExpired` | `MaxAttempts`.
        reason: RetryRefusal,
        /// Plain words.
        detail: String,
        /// The OOM-killed jobs concerned.
        jobs: Vec<RetryJob>,
    },
}

/// The retrier's view (see the module documentation).
#[derive(Debug, Default)]
pub struct Book {
    failed: HashMap<JobRef, FailedJob>,
    /// Jobs that ended well: a later failure event for them (out of order)
    /// does not count.
    succeeded: HashSet<JobRef>,
    reports: HashMap<(JobRef, u32), Report>,
    /// GitHub jobs' workload keys, from their webhooks (a GitHub sample is
    /// keyed from its job, as the allocator and the projection key it).
    github_keys: HashMap<JobRef, String>,
    streaks: HashMap<String, u32>,
    pipelines: HashMap<UnitRef, PipelineFacts>,
    /// Ids of retry events seen.
    seen: HashSet<String>,
    /// `<forge>:<instance>:<unit>` of units a retry was requested or issued
    /// for, or refused as a whole.
    acted: HashSet<String>,
    /// Jobs a requested or issued retry covers.
    covered: HashSet<JobRef>,
    /// Jobs refused one by one.
    refused: HashSet<JobRef>,
    /// Requested retries not (yet) followed by an issue or a refusal:
    /// unit key → the request's event.
    in_flight: BTreeMap<String, Event>,
    /// GitLab pipelines a `pipeline` retry made → the pipeline it retried.
    retried_pipelines: HashMap<UnitRef, u64>,
    /// GitLab jobs a `job` retry made → the job it retried.
    retried_jobs: HashMap<JobRef, JobRef>,
    /// Retries issued for a job as the forge names it, since it last
    /// succeeded.
    identity_retries: HashMap<Identity, u32>,
}

fn job_ref(key: &JobKey) -> JobRef {
    (key.forge(), key.instance.clone(), key.job_id)
}

fn unit_key(forge: Forge, instance: &str, unit: &str) -> String {
    format!("{}:{instance}:{unit}", forge_token(forge))
}

fn received_time(event: &Event) -> OffsetDateTime {
    event
        .received_at
        .as_ref()
        .or(event.occurred_at.as_ref())
        .and_then(runyard_events::from_timestamp)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// The workload a report is counted on: its attributes when it has any,
/// else the job itself (no streak shared with other jobs).
fn report_workload(u: &UsageReported, job: &JobRef) -> String {
    if u.workload.is_empty() {
        return format!("job={}:{}:{}", forge_token(job.0), job.1, job.2);
    }
    workload::key(u.workload.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

impl Book {
    /// Folds one event in. Idempotent: a duplicate changes nothing.
    pub fn observe(&mut self, event: &Event) {
        match &event.body {
            Some(Body::JobObserved(j)) => self.observe_job(j, event),
            Some(Body::PipelineObserved(p)) => {
                let key = (
                    event.source.as_ref().map_or(p.forge(), |s| s.forge()),
                    p.instance.clone(),
                    p.pipeline_id,
                );
                let facts = self.pipelines.entry(key).or_default();
                if !is_final(&facts.status) {
                    facts.status.clone_from(&p.status);
                }
                facts.project_id = p.project_id;
                facts.project.clone_from(&p.project);
                facts.git_ref.clone_from(&p.r#ref);
                facts.sha.clone_from(&p.sha);
                if p.parent_pipeline_id != 0 {
                    facts.parent = p.parent_pipeline_id;
                    facts.parent_project_id = p.parent_project_id;
                }
            }
            Some(Body::UsageReported(u)) => self.observe_usage(u),
            Some(
                body @ (Body::RetryRequested(_) | Body::RetryIssued(_) | Body::RetryRefused(_)),
            ) => {
                self.observe_retry(&event.id, body, event);
            }
            _ => {}
        }
    }

    fn observe_job(&mut self, j: &JobObserved, event: &Event) {
        let Some(key) = j.job.as_ref().map(job_ref) else {
            return;
        };
        if key.0 == Forge::Github && !j.name.is_empty() && !self.github_keys.contains_key(&key) {
            let w = workload::github(&j.project, &j.workflow_name, &j.name);
            let k = workload::key(w.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            self.github_keys.insert(key.clone(), k);
        }
        if !j.pipeline_status.is_empty() {
            let p = self
                .pipelines
                .entry((key.0, key.1.clone(), j.pipeline_id))
                .or_default();
            if !is_final(&p.status) {
                p.status.clone_from(&j.pipeline_status);
            }
            p.project_id = j.project_id;
            p.project.clone_from(&j.project);
            p.git_ref.clone_from(&j.r#ref);
            p.sha.clone_from(&j.sha);
        }
        if j.status() != JobStatus::Completed {
            return;
        }
        match j.conclusion() {
            Conclusion::Success | Conclusion::Neutral | Conclusion::Skipped => {
                self.failed.remove(&key);
                if !j.name.is_empty() {
                    self.identity_retries
                        .remove(&identity(key.0, &key.1, &j.project, &j.r#ref, &j.name));
                }
                self.succeeded.insert(key);
            }
            conclusion @ (Conclusion::Failure | Conclusion::TimedOut | Conclusion::Cancelled) => {
                if self.succeeded.contains(&key) {
                    return;
                }
                // The wait for the report runs from when runyard learned of
                // the failure: the forge's clock and a late webhook do not
                // shorten it.
                let failed_at = received_time(event);
                self.failed.entry(key.clone()).or_insert(FailedJob {
                    job: key,
                    attempt: j.run_attempt.max(1),
                    name: j.name.clone(),
                    project: j.project.clone(),
                    project_id: j.project_id,
                    pipeline_id: j.pipeline_id,
                    git_ref: j.r#ref.clone(),
                    sha: j.sha.clone(),
                    conclusion,
                    failure_reason: j.failure_reason.clone(),
                    failed_at,
                });
            }
            _ => {}
        }
    }

    fn observe_usage(&mut self, u: &UsageReported) {
        let Some(job) = u.job.as_ref().map(job_ref) else {
            return;
        };
        let attempt = u.attempt.max(1);
        if self.reports.contains_key(&(job.clone(), attempt)) {
            return;
        }
        let workload_key = self
            .github_keys
            .get(&job)
            .cloned()
            .unwrap_or_else(|| report_workload(u, &job));
        let oom = oom_killed(u);
        let streak = self.streaks.entry(workload_key.clone()).or_default();
        *streak = if oom { streak.saturating_add(1) } else { 0 };
        let report = Report {
            oom,
            streak: *streak,
            workload_key,
            peak: u.peak_memory_bytes,
            limit: u.memory_limit_bytes,
            exit_code: u.exit_code,
            project: u.project.clone(),
        };
        self.reports.insert((job, attempt), report);
    }

    fn observe_retry(&mut self, id: &str, body: &Body, event: &Event) {
        if !self.seen.insert(id.to_owned()) {
            return;
        }
        let Some(target) = runyard_events::retry_target(body) else {
            return;
        };
        let unit = unit_key(target.forge(), &target.instance, &target.unit);
        let jobs = match body {
            Body::RetryRequested(r) => &r.jobs,
            Body::RetryIssued(r) => &r.jobs,
            Body::RetryRefused(r) => &r.jobs,
            _ => return,
        };
        let jobs: Vec<JobRef> = jobs
            .iter()
            .filter_map(|j| j.job.as_ref().map(job_ref))
            .collect();
        match body {
            Body::RetryRequested(_) => {
                self.acted.insert(unit.clone());
                self.covered.extend(jobs);
                self.in_flight.entry(unit).or_insert_with(|| event.clone());
            }
            Body::RetryIssued(issued) => {
                self.acted.insert(unit.clone());
                self.link(target, issued);
                self.covered.extend(jobs);
                self.in_flight.remove(&unit);
            }
            Body::RetryRefused(_) => {
                self.in_flight.remove(&unit);
                self.acted.insert(unit);
                self.refused.extend(jobs);
            }
            _ => {}
        }
    }

    /// Records what an issued retry made (see "lineage" in the module
    /// documentation).
    fn link(&mut self, target: &RetryTarget, issued: &runyard_events::RetryIssued) {
        let forge = target.forge();
        for j in &issued.jobs {
            let id = identity(
                forge,
                &target.instance,
                &target.project,
                &target.r#ref,
                &j.name,
            );
            *self.identity_retries.entry(id).or_default() += 1;
        }
        if forge != Forge::Gitlab {
            return;
        }
        match issued.strategy.as_str() {
            "pipeline" if issued.new_pipeline_id != 0 => {
                self.retried_pipelines.insert(
                    (forge, target.instance.clone(), issued.new_pipeline_id),
                    target.pipeline_id,
                );
            }
            "job" => {
                if let Some(old) = issued.jobs.first().and_then(|j| j.job.as_ref()) {
                    for new in &issued.new_job_ids {
                        self.retried_jobs
                            .insert((forge, target.instance.clone(), *new), job_ref(old));
                    }
                }
            }
            _ => {}
        }
    }

    /// The pipeline a child pipeline's retries go through (itself when it
    /// has no parent).
    fn root(&self, pipeline: &UnitRef) -> UnitRef {
        match self.pipelines.get(pipeline).map_or(0, |f| f.parent) {
            0 => pipeline.clone(),
            parent => (pipeline.0, pipeline.1.clone(), parent),
        }
    }

    /// How many retries runyard already issued in the lineage of a failed
    /// job attempt: the chain of GitLab retries (pipelines and jobs) that
    /// made it, or the retries of the job as the forge names it since it
    /// last succeeded, whichever is longer. Its reports play no part.
    pub fn lineage(&self, job: &FailedJob) -> u32 {
        let (forge, instance, _) = &job.job;
        let by_name = self
            .identity_retries
            .get(&identity(
                *forge,
                instance,
                &job.project,
                &job.git_ref,
                &job.name,
            ))
            .copied()
            .unwrap_or(0);
        let mut chain = 0;
        let mut at = job.job.clone();
        while chain < LINEAGE_DEPTH
            && let Some(before) = self.retried_jobs.get(&at)
        {
            chain += 1;
            at = before.clone();
        }
        let mut pipeline = self.root(&(*forge, instance.clone(), job.pipeline_id));
        while chain < LINEAGE_DEPTH
            && let Some(before) = self.retried_pipelines.get(&pipeline)
        {
            chain += 1;
            pipeline = self.root(&(*forge, instance.clone(), *before));
        }
        by_name.max(chain)
    }

    /// What one of runyard's retries made `job` (of `pipeline`) from: the
    /// job a GitLab job retry retried, and the pipeline a GitLab pipeline
    /// made by a retry retried.
    pub fn retried_from(&self, job: &JobRef, pipeline: u64) -> (Option<&JobRef>, Option<u64>) {
        let (forge, instance, _) = job;
        (
            self.retried_jobs.get(job),
            self.retried_pipelines
                .get(&(*forge, instance.clone(), pipeline))
                .copied(),
        )
    }

    /// A pipeline's status read from the API.
    pub fn set_pipeline_status(&mut self, pipeline: &UnitRef, status: &str) {
        let p = self.pipelines.entry(pipeline.clone()).or_default();
        if !is_final(&p.status) {
            status.clone_into(&mut p.status);
        }
    }

    /// Requested retries whose outcome the log does not hold (a replica
    /// stopped between asking the forge and saying so).
    pub fn in_flight(&self) -> impl Iterator<Item = &Event> {
        self.in_flight.values()
    }

    /// Whether a retry event with this id is in the book.
    pub fn has_event(&self, id: &str) -> bool {
        self.seen.contains(id)
    }

    /// Judges one failed job attempt.
    pub fn classify(&self, job: &FailedJob, wait: Duration, now: OffsetDateTime) -> Class {
        match job.conclusion {
            Conclusion::Cancelled | Conclusion::Skipped => return Class::Cancelled,
            Conclusion::TimedOut => return Class::NotOom("timed out".into()),
            _ => {}
        }
        if matches!(
            job.failure_reason.as_str(),
            "job_execution_timeout" | "stuck_or_timeout_failure"
        ) {
            return Class::NotOom(format!("timed out ({})", job.failure_reason));
        }
        // A report naming another project than the job's webhook is not
        // about this job.
        let report = self
            .report_for(&job.job, job.attempt)
            .filter(|r| r.project.is_empty() || r.project.eq_ignore_ascii_case(&job.project));
        match report {
            Some(r) if r.oom => Class::Oom(r.clone()),
            Some(r) => Class::NotOom(match r.exit_code {
                Some(code) => format!("failed with exit code {code}, not OOM-killed"),
                None => "failed, not OOM-killed".into(),
            }),
            None if now - job.failed_at < wait => Class::Waiting,
            None => Class::NoReport,
        }
    }

    /// The report of a job attempt: that attempt's, else the job's latest
    /// (reporters that do not know the attempt say 1).
    fn report_for(&self, job: &JobRef, attempt: u32) -> Option<&Report> {
        self.reports.get(&(job.clone(), attempt)).or_else(|| {
            self.reports
                .iter()
                .filter(|((j, _), _)| j == job)
                .max_by_key(|((_, a), _)| *a)
                .map(|(_, r)| r)
        })
    }

    /// What to do now, for everything the log holds.
    pub fn plan(&self, settings: &RetrySection, now: OffsetDateTime) -> Vec<Plan> {
        let mut plans = Vec::new();
        let mut pipelines: BTreeMap<UnitRef, Kills<'_>> = BTreeMap::new();
        let mut runs: BTreeMap<UnitRef, String> = BTreeMap::new();
        let mut failed: Vec<&FailedJob> = self.failed.values().collect();
        failed.sort_by(|a, b| a.job.cmp(&b.job));
        for job in failed {
            if self.covered.contains(&job.job) || self.refused.contains(&job.job) {
                continue;
            }
            let (forge, instance, _) = &job.job;
            let class = self.classify(job, settings.wait_for_report, now);
            let refuse = |reason: RetryRefusal, detail: String, report: Option<&Report>| {
                let target = job_target(job);
                Plan::Refuse {
                    id: ids::retry(*forge, instance, &target.unit, "refused"),
                    target,
                    reason,
                    detail,
                    jobs: vec![retry_job(job, report)],
                }
            };
            match class {
                Class::Cancelled | Class::Waiting => {}
                Class::NotOom(detail) => plans.push(refuse(RetryRefusal::NotOom, detail, None)),
                Class::NoReport => plans.push(refuse(
                    RetryRefusal::NoUsageReport,
                    format!(
                        "no usage report arrived within {}",
                        humantime_serde::re::humantime::format_duration(settings.wait_for_report)
                    ),
                    None,
                )),
                Class::Oom(report) if report.streak > settings.max_retries => {
                    plans.push(refuse(
                        RetryRefusal::LimitReached,
                        format!(
                            "OOM kill {} in a row of workload {}; at most {} are retried",
                            report.streak, report.workload_key, settings.max_retries
                        ),
                        Some(&report),
                    ));
                }
                Class::Oom(report) if self.lineage(job) >= settings.max_retries => {
                    plans.push(refuse(
                        RetryRefusal::LimitReached,
                        format!(
                            "{} retries already issued for job {:?} of {} (its retry lineage); \
                             at most {} are, whatever its usage reports say",
                            self.lineage(job),
                            job.name,
                            job.project,
                            settings.max_retries
                        ),
                        Some(&report),
                    ));
                }
                Class::Oom(report) => {
                    let strategy = settings.strategy(*forge, job.project_id, &job.project);
                    match (forge, strategy) {
                        (_, Strategy::Off) => plans.push(refuse(
                            RetryRefusal::StrategyOff,
                            format!("retries are off for {}", job.project),
                            Some(&report),
                        )),
                        (Forge::Gitlab, Strategy::Job) => {
                            let target = job_target(job);
                            if !self
                                .acted
                                .contains(&unit_key(*forge, instance, &target.unit))
                            {
                                plans.push(Plan::GitLabJob {
                                    target,
                                    job: retry_job(job, Some(&report)),
                                });
                            }
                        }
                        (Forge::Gitlab, _) => pipelines
                            .entry((*forge, instance.clone(), job.pipeline_id))
                            .or_default()
                            .push((job, report)),
                        _ => {
                            runs.entry((*forge, instance.clone(), job.pipeline_id))
                                .or_insert_with(|| job.project.clone());
                        }
                    }
                }
            }
        }
        // A child pipeline cannot be created on its own: its kills are
        // retried through the pipeline that triggered it, once, however many
        // of its children had kills.
        let mut roots: BTreeMap<UnitRef, Vec<(UnitRef, Kills<'_>)>> = BTreeMap::new();
        for (pipeline, jobs) in pipelines {
            let parent = self.pipelines.get(&pipeline).map_or(0, |f| f.parent);
            let root = if parent == 0 {
                pipeline.clone()
            } else {
                (pipeline.0, pipeline.1.clone(), parent)
            };
            roots.entry(root).or_default().push((pipeline, jobs));
        }
        for (root, children) in roots {
            let unit = ids::retry_unit_pipeline(root.2);
            if self.acted.contains(&unit_key(root.0, &root.1, &unit)) {
                continue;
            }
            let status = |p: &UnitRef| {
                self.pipelines
                    .get(p)
                    .map(|f| f.status.clone())
                    .unwrap_or_default()
            };
            let failed = children.iter().any(|(p, _)| status(p) == "failed");
            let first = children[0].1[0].0;
            if failed {
                let facts = self.pipelines.get(&root).cloned().unwrap_or_default();
                let child = self
                    .pipelines
                    .get(&children[0].0)
                    .cloned()
                    .unwrap_or_default();
                let project_id = if root != children[0].0 && child.parent_project_id != 0 {
                    child.parent_project_id
                } else {
                    first.project_id
                };
                plans.push(Plan::GitLabPipeline {
                    target: RetryTarget {
                        forge: root.0 as i32,
                        instance: root.1.clone(),
                        project_id,
                        project: pick(&facts.project, &first.project),
                        pipeline_id: root.2,
                        run_attempt: 0,
                        r#ref: pick(&facts.git_ref, &pick(&child.git_ref, &first.git_ref)),
                        sha: pick(&facts.sha, &pick(&child.sha, &first.sha)),
                        unit,
                    },
                    jobs: children
                        .iter()
                        .flat_map(|(_, jobs)| jobs.iter().map(|(j, r)| retry_job(j, Some(r))))
                        .collect(),
                });
            } else if let Some((pipeline, _)) = children.iter().find(|(p, _)| !is_final(&status(p)))
            {
                plans.push(Plan::CheckPipeline {
                    pipeline: pipeline.clone(),
                    project_id: first.project_id,
                });
            }
            // Every pipeline finished without failing (the OOM-killed job was
            // allowed to fail, or it was cancelled): nothing to retry.
        }
        for (run, repo) in runs {
            plans.push(Plan::CheckRun { run, repo });
        }
        plans
    }

    /// Decides what a GitHub run's latest attempt needs, given the run and
    /// the jobs of its latest attempt as the API lists them.
    pub fn decide_run(
        &self,
        run: &RunView,
        jobs: &[ListedJob],
        settings: &RetrySection,
        now: OffsetDateTime,
    ) -> RunDecision {
        if run.status != "completed" {
            return RunDecision::Wait;
        }
        let (forge, instance, run_id) = &run.run;
        let unit = ids::retry_unit_run(*run_id, run.attempt);
        if self.acted.contains(&unit_key(*forge, instance, &unit)) {
            return RunDecision::Done;
        }
        let mut failed = Vec::new();
        for j in jobs {
            let conclusion = match j.conclusion.as_deref() {
                Some("failure") => Conclusion::Failure,
                Some("timed_out") => Conclusion::TimedOut,
                Some("cancelled") => Conclusion::Cancelled,
                _ => continue,
            };
            let key = (*forge, instance.clone(), j.id);
            let known = self.failed.get(&key);
            let job = FailedJob {
                job: key,
                attempt: j.attempt.max(1),
                name: j.name.clone(),
                project: run.repo.clone(),
                project_id: known.map_or(0, |k| k.project_id),
                pipeline_id: *run_id,
                git_ref: run.git_ref.clone(),
                sha: run.sha.clone(),
                conclusion,
                failure_reason: String::new(),
                failed_at: j.completed_at.or(known.map(|k| k.failed_at)).unwrap_or(now),
            };
            let class = self.classify(&job, settings.wait_for_report, now);
            failed.push((job, class));
        }
        if failed.iter().any(|(_, c)| *c == Class::Waiting) {
            return RunDecision::Wait;
        }
        let eligible: Vec<(&FailedJob, &Report)> = failed
            .iter()
            .filter(|(j, _)| !self.covered.contains(&j.job))
            .filter(|(j, _)| self.lineage(j) < settings.max_retries)
            .filter_map(|(j, c)| match c {
                Class::Oom(r) if r.streak <= settings.max_retries => Some((j, r)),
                _ => None,
            })
            .collect();
        let Some((first, first_report)) = eligible.first().copied() else {
            return RunDecision::Settled;
        };
        let target = RetryTarget {
            forge: *forge as i32,
            instance: instance.clone(),
            project_id: first.project_id,
            project: run.repo.clone(),
            pipeline_id: *run_id,
            run_attempt: run.attempt,
            r#ref: run.git_ref.clone(),
            sha: run.sha.clone(),
            unit,
        };
        let all: Vec<RetryJob> = eligible
            .iter()
            .map(|(j, r)| retry_job(j, Some(r)))
            .collect();
        if run.attempt >= GITHUB_MAX_ATTEMPTS {
            return RunDecision::Refuse {
                id: ids::retry(*forge, instance, &target.unit, "refused"),
                detail: format!(
                    "run {run_id} is at attempt {}; GitHub allows {GITHUB_MAX_ATTEMPTS}",
                    run.attempt
                ),
                target,
                reason: RetryRefusal::MaxAttempts,
                jobs: all,
            };
        }
        if let Some(created) = run.created_at
            && now - created > GITHUB_RERUN_WINDOW
        {
            return RunDecision::Refuse {
                id: ids::retry(*forge, instance, &target.unit, "refused"),
                detail: format!(
                    "run {run_id} was created {created}; GitHub re-runs runs of the last 30 days only"
                ),
                target,
                reason: RetryRefusal::RerunWindowExpired,
                jobs: all,
            };
        }
        if eligible.len() == failed.len() {
            RunDecision::RerunFailed { target, jobs: all }
        } else {
            RunDecision::RerunJob {
                target,
                job: retry_job(first, Some(first_report)),
            }
        }
    }

    /// Forgets what is older than `keep` before `now` (failed jobs and
    /// reports; streaks and decisions stay, they are small).
    pub fn prune(&mut self, now: OffsetDateTime, keep: Duration) {
        self.failed.retain(|_, j| now - j.failed_at < keep);
        if self.github_keys.len() > 200_000 {
            self.github_keys.clear();
        }
    }
}

fn pick(a: &str, b: &str) -> String {
    if a.is_empty() { b } else { a }.to_owned()
}

/// Whether a GitLab pipeline status word is final.
pub fn is_final(status: &str) -> bool {
    matches!(status, "success" | "failed" | "canceled" | "skipped")
}

/// The target of one job attempt's own decision (unit `job:<id>:<attempt>`).
fn job_target(job: &FailedJob) -> RetryTarget {
    RetryTarget {
        forge: job.job.0 as i32,
        instance: job.job.1.clone(),
        project_id: job.project_id,
        project: job.project.clone(),
        pipeline_id: job.pipeline_id,
        run_attempt: job.attempt,
        r#ref: job.git_ref.clone(),
        sha: job.sha.clone(),
        unit: ids::retry_unit_job(job.job.2, job.attempt),
    }
}

fn retry_job(job: &FailedJob, report: Option<&Report>) -> RetryJob {
    RetryJob {
        job: Some(JobKey {
            forge: job.job.0 as i32,
            instance: job.job.1.clone(),
            job_id: job.job.2,
        }),
        attempt: job.attempt,
        name: job.name.clone(),
        workload_key: report.map(|r| r.workload_key.clone()).unwrap_or_default(),
        oom_streak: report.map_or(0, |r| r.streak),
        memory_limit_bytes: report.and_then(|r| r.limit),
        peak_memory_bytes: report.map_or(0, |r| r.peak),
        exit_code: report.and_then(|r| r.exit_code),
    }
}

#[cfg(test)]
mod tests;
