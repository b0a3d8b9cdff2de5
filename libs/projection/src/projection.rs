//! The pure core of the projection: turning events into rows and merging two
//! observations of the same job, pipeline or runner, independent of arrival
//! order. The SQL in [`crate::apply`] does the same merge against stored rows.
//! Retry events are one row each, never merged.

use std::collections::{BTreeMap, HashMap};

use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, PipelineObserved, RetryJob,
    Stage, UsageReported, forge_token, from_timestamp, retry_target, runner_ref, valid_pool_name,
};
use runyard_store::entities::{job_source, retry_kind, runner_state as state};
use runyard_store::workload;
use time::OffsetDateTime;

/// `(forge, instance, id)`.
pub type Key = (String, String, i64);

/// A job row (or the contribution of one observation to it); `id` is
/// assigned by Postgres.
pub type JobRow = runyard_store::entities::job::Model;
/// A pipeline row.
pub type PipelineRow = runyard_store::entities::pipeline::Model;
/// A usage sample row.
pub type UsageRow = runyard_store::entities::usage_sample::Model;
/// A runner row; `state`, `reason` and `attempts` are derived (Postgres
/// generates them, [`derive_runner`] computes the same here).
pub type RunnerRow = runyard_store::entities::runner::Model;
/// A retry row: one retry event.
pub type RetryRow = runyard_store::entities::retry::Model;

/// The rank of a job row.
pub fn job_rank(r: &JobRow) -> (i16, OffsetDateTime, &str) {
    (r.rank_status, r.rank_at, r.rank_event.as_str())
}

/// The rank of a pipeline row.
pub fn pipeline_rank(r: &PipelineRow) -> (i16, OffsetDateTime, &str) {
    (r.rank_status, r.rank_at, r.rank_event.as_str())
}

/// What a batch of (new) events does to the projection.
#[derive(Debug, Default, Clone)]
pub struct Delta {
    /// Merged job rows by key.
    pub jobs: HashMap<Key, JobRow>,
    /// Merged pipeline rows by key.
    pub pipelines: HashMap<Key, PipelineRow>,
    /// Usage samples by `(key, attempt)`; the first one wins.
    pub usage: HashMap<(Key, i32), UsageRow>,
    /// Merged runner rows by runner name.
    pub runners: HashMap<String, RunnerRow>,
    /// Retry rows by event id (in id order); the first one wins.
    pub retries: BTreeMap<String, RetryRow>,
}

/// Why an event cannot be projected (it is dead-lettered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unprojectable(pub String);

impl Delta {
    /// Adds one event's effect.
    pub fn add(&mut self, event: &Event) -> Result<(), Unprojectable> {
        let received = event
            .received_at
            .as_ref()
            .and_then(from_timestamp)
            .map(micros)
            .ok_or_else(|| Unprojectable("event without received_at".into()))?;
        let occurred = event
            .occurred_at
            .as_ref()
            .and_then(from_timestamp)
            .map(micros)
            .unwrap_or(received);
        match &event.body {
            Some(Body::JobObserved(j)) => {
                let ranked = runyard_events::observed_at(event)
                    .and_then(from_timestamp)
                    .map_or(occurred, micros);
                let row = job_row(&event.id, j, occurred, received, ranked)?;
                let key = (row.forge.clone(), row.instance.clone(), row.job_id);
                merge_into(&mut self.jobs, key, row, merge_jobs);
            }
            Some(Body::PipelineObserved(p)) => {
                let row = pipeline_row(&event.id, p, occurred, received)?;
                let key = (row.forge.clone(), row.instance.clone(), row.pipeline_id);
                merge_into(&mut self.pipelines, key, row, merge_pipelines);
            }
            Some(Body::UsageReported(u)) => {
                let row = usage_row(&event.id, u, occurred)?;
                let key = (
                    (row.forge.clone(), row.instance.clone(), row.job_id),
                    row.attempt,
                );
                self.usage.entry(key).or_insert(row);
            }
            Some(
                body @ (Body::RunnerRequested(_)
                | Body::RunnerCreated(_)
                | Body::RunnerOnline(_)
                | Body::RunnerAssigned(_)
                | Body::RunnerFailed(_)
                | Body::RunnerDeleted(_)),
            ) => {
                let row = runner_row(&event.id, body, occurred, received)?;
                match self.runners.get_mut(&row.name) {
                    Some(existing) => *existing = merge_runners(existing, &row),
                    None => {
                        self.runners.insert(row.name.clone(), row);
                    }
                }
            }
            Some(
                body @ (Body::RetryRequested(_) | Body::RetryIssued(_) | Body::RetryRefused(_)),
            ) => {
                let row = retry_row(&event.id, body, occurred, received)?;
                self.retries.entry(row.event_id.clone()).or_insert(row);
            }
            // Allocations are analysed from the log itself; event types this
            // version does not know are applied as no-ops so they never block
            // the log.
            Some(Body::AllocationIssued(_) | Body::JobUnserved(_) | Body::ScaleSetProgress(_))
            | None => {}
        }
        Ok(())
    }

    /// Number of rows touched.
    pub fn rows(&self) -> usize {
        self.jobs.len()
            + self.pipelines.len()
            + self.usage.len()
            + self.runners.len()
            + self.retries.len()
    }
}

fn merge_into<R: Clone>(map: &mut HashMap<Key, R>, key: Key, row: R, merge: fn(&R, &R) -> R) {
    match map.get_mut(&key) {
        Some(existing) => *existing = merge(existing, &row),
        None => {
            map.insert(key, row);
        }
    }
}

/// Postgres keeps microseconds: truncate so Rust and SQL compare the same
/// values.
fn micros(t: OffsetDateTime) -> OffsetDateTime {
    let nanos = t.nanosecond();
    t.replace_nanosecond(nanos - nanos % 1_000).unwrap_or(t)
}

fn ts(t: Option<&prost_types::Timestamp>) -> Option<OffsetDateTime> {
    t.and_then(from_timestamp).map(micros)
}

fn text(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn id64(v: u64, what: &str) -> Result<i64, Unprojectable> {
    i64::try_from(v).map_err(|_| Unprojectable(format!("{what} {v} out of range")))
}

fn forge_of(f: Forge) -> Result<String, Unprojectable> {
    match f {
        Forge::Unspecified => Err(Unprojectable("forge unspecified".into())),
        f => Ok(forge_token(f).to_owned()),
    }
}

/// The stored status number of a job status.
pub fn status_number(s: JobStatus) -> i16 {
    match s {
        JobStatus::Unspecified => 0,
        JobStatus::Queued => 1,
        JobStatus::Waiting => 2,
        JobStatus::InProgress => 3,
        JobStatus::Completed => 4,
    }
}

fn conclusion_word(c: Conclusion) -> Option<String> {
    let w = match c {
        Conclusion::Unspecified => return None,
        Conclusion::Success => "success",
        Conclusion::Failure => "failure",
        Conclusion::Cancelled => "cancelled",
        Conclusion::Skipped => "skipped",
        Conclusion::TimedOut => "timed_out",
        Conclusion::ActionRequired => "action_required",
        Conclusion::Neutral => "neutral",
    };
    Some(w.to_owned())
}

/// `ranked` is when the observation was made ([`runyard_events::observed_at`]):
/// it orders observations of one [`Stage`].
fn job_row(
    id: &str,
    j: &JobObserved,
    occurred: OffsetDateTime,
    received: OffsetDateTime,
    ranked: OffsetDateTime,
) -> Result<JobRow, Unprojectable> {
    let key = j
        .job
        .as_ref()
        .ok_or_else(|| Unprojectable("job event without job key".into()))?;
    let status = status_number(j.status());
    if status == 0 {
        return Err(Unprojectable("job status unspecified".into()));
    }
    let labels = (!j.labels.is_empty()).then(|| serde_json::json!(j.labels));
    Ok(JobRow {
        id: 0,
        forge: forge_of(key.forge())?,
        instance: key.instance.clone(),
        job_id: id64(key.job_id, "job_id")?,
        status,
        project: text(&j.project),
        project_id: (j.project_id != 0)
            .then(|| id64(j.project_id, "project_id"))
            .transpose()?,
        pipeline_id: (j.pipeline_id != 0)
            .then(|| id64(j.pipeline_id, "pipeline_id"))
            .transpose()?,
        run_attempt: (j.run_attempt != 0).then(|| i32::try_from(j.run_attempt).unwrap_or(i32::MAX)),
        name: text(&j.name),
        stage: text(&j.stage),
        workflow_name: text(&j.workflow_name),
        labels,
        forge_status: text(&j.forge_status),
        conclusion: conclusion_word(j.conclusion()),
        failure_reason: text(&j.failure_reason),
        runner_id: j.runner_id.map(|v| id64(v, "runner_id")).transpose()?,
        runner_name: text(&j.runner_name),
        runner_group_id: j
            .runner_group_id
            .map(|v| id64(v, "runner_group_id"))
            .transpose()?,
        runner_group_name: text(&j.runner_group_name),
        r#ref: text(&j.r#ref),
        sha: text(&j.sha),
        tag: Some(j.tag),
        html_url: text(&j.html_url),
        organization: text(&j.organization),
        enterprise: text(&j.enterprise),
        allow_failure: Some(j.allow_failure),
        duration_seconds: j.duration_seconds.filter(|d| d.is_finite()),
        queued_duration_seconds: j.queued_duration_seconds.filter(|d| d.is_finite()),
        created_at: ts(j.created_at.as_ref()),
        queued_at: (status == 1).then_some(occurred),
        // GitHub fills `started_at` already on `queued` (with the creation
        // time): only an observation of a job that runs says when it
        // started, or every GitHub job would seem to have waited 0 s.
        started_at: matches!(j.status(), JobStatus::InProgress | JobStatus::Completed)
            .then(|| ts(j.started_at.as_ref()))
            .flatten(),
        completed_at: ts(j.completed_at.as_ref()),
        first_seen_at: received,
        last_event_at: occurred,
        rank_status: Stage::of_job(j).number(),
        rank_at: ranked,
        rank_event: id.to_owned(),
    })
}

/// Ordinal of a GitLab pipeline status: terminal states rank highest.
pub fn pipeline_status_rank(status: &str) -> i16 {
    match status {
        "created" => 1,
        "waiting_for_resource" | "scheduled" | "manual" => 2,
        "preparing" => 3,
        "pending" => 4,
        "running" => 5,
        "success" | "failed" | "canceled" | "skipped" => 6,
        _ => 0,
    }
}

fn pipeline_row(
    id: &str,
    p: &PipelineObserved,
    occurred: OffsetDateTime,
    received: OffsetDateTime,
) -> Result<PipelineRow, Unprojectable> {
    Ok(PipelineRow {
        id: 0,
        forge: forge_of(p.forge())?,
        instance: p.instance.clone(),
        pipeline_id: id64(p.pipeline_id, "pipeline_id")?,
        project_id: (p.project_id != 0)
            .then(|| id64(p.project_id, "project_id"))
            .transpose()?,
        project: text(&p.project),
        r#ref: text(&p.r#ref),
        sha: text(&p.sha),
        tag: Some(p.tag),
        status: p.status.clone(),
        pipeline_source: text(&p.pipeline_source),
        web_url: text(&p.web_url),
        duration_seconds: p.duration_seconds.filter(|d| d.is_finite()),
        queued_duration_seconds: p.queued_duration_seconds.filter(|d| d.is_finite()),
        created_at: ts(p.created_at.as_ref()),
        finished_at: ts(p.finished_at.as_ref()),
        first_seen_at: received,
        last_event_at: occurred,
        rank_status: pipeline_status_rank(&p.status),
        rank_at: occurred,
        rank_event: id.to_owned(),
    })
}

fn usage_row(
    id: &str,
    u: &UsageReported,
    occurred: OffsetDateTime,
) -> Result<UsageRow, Unprojectable> {
    let key = u
        .job
        .as_ref()
        .ok_or_else(|| Unprojectable("usage event without job key".into()))?;
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let workload: serde_json::Map<String, serde_json::Value> = u
        .workload
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    Ok(UsageRow {
        id: 0,
        forge: forge_of(key.forge())?,
        instance: key.instance.clone(),
        job_id: id64(key.job_id, "job_id")?,
        attempt: i32::try_from(u.attempt.max(1)).unwrap_or(i32::MAX),
        event_id: id.to_owned(),
        r#ref: text(&u.r#ref),
        project: text(&u.project),
        workload: serde_json::Value::Object(workload),
        workload_key: workload::key(u.workload.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        peak_memory_bytes: id64(u.peak_memory_bytes, "peak_memory_bytes")?,
        memory_request_bytes: u
            .memory_request_bytes
            .map(|v| id64(v, "memory_request_bytes"))
            .transpose()?,
        memory_limit_bytes: u
            .memory_limit_bytes
            .map(|v| id64(v, "memory_limit_bytes"))
            .transpose()?,
        cpu_seconds: finite(u.cpu_seconds),
        wall_seconds: finite(u.wall_seconds),
        cpu_request_millicores: u
            .cpu_request_millicores
            .map(|v| id64(v, "cpu_request_millicores"))
            .transpose()?,
        oom_killed: runyard_events::oom_killed(u),
        exit_code: u.exit_code,
        cgroup: text(&u.cgroup),
        reported_at: occurred,
    })
}

fn min_opt(a: Option<OffsetDateTime>, b: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Merges two observations of one job: the status and the descriptive fields
/// come from the higher-ranked observation (its [`Stage`], then when it was
/// made: `queued` and `waiting` alternate, the rest only move forward),
/// descriptive fields falling back to the other where it has none;
/// `last_event_at` takes the maximum, timestamps the earliest value.
pub fn merge_jobs(a: &JobRow, b: &JobRow) -> JobRow {
    let (hi, lo) = if job_rank(a) >= job_rank(b) {
        (a, b)
    } else {
        (b, a)
    };
    macro_rules! pick {
        ($f:ident) => {
            hi.$f.clone().or_else(|| lo.$f.clone())
        };
    }
    JobRow {
        id: 0,
        forge: hi.forge.clone(),
        instance: hi.instance.clone(),
        job_id: hi.job_id,
        status: hi.status,
        project: pick!(project),
        project_id: pick!(project_id),
        pipeline_id: pick!(pipeline_id),
        run_attempt: pick!(run_attempt),
        name: pick!(name),
        stage: pick!(stage),
        workflow_name: pick!(workflow_name),
        labels: pick!(labels),
        forge_status: pick!(forge_status),
        conclusion: pick!(conclusion),
        failure_reason: pick!(failure_reason),
        runner_id: pick!(runner_id),
        runner_name: pick!(runner_name),
        runner_group_id: pick!(runner_group_id),
        runner_group_name: pick!(runner_group_name),
        r#ref: pick!(r#ref),
        sha: pick!(sha),
        tag: pick!(tag),
        html_url: pick!(html_url),
        organization: pick!(organization),
        enterprise: pick!(enterprise),
        allow_failure: pick!(allow_failure),
        duration_seconds: pick!(duration_seconds),
        queued_duration_seconds: pick!(queued_duration_seconds),
        created_at: min_opt(a.created_at, b.created_at),
        queued_at: min_opt(a.queued_at, b.queued_at),
        started_at: min_opt(a.started_at, b.started_at),
        completed_at: min_opt(a.completed_at, b.completed_at),
        first_seen_at: a.first_seen_at.min(b.first_seen_at),
        last_event_at: a.last_event_at.max(b.last_event_at),
        rank_status: hi.rank_status,
        rank_at: hi.rank_at,
        rank_event: hi.rank_event.clone(),
    }
}

/// Merges two observations of one pipeline (same rules as jobs; the status
/// word comes with the rank).
pub fn merge_pipelines(a: &PipelineRow, b: &PipelineRow) -> PipelineRow {
    let (hi, lo) = if pipeline_rank(a) >= pipeline_rank(b) {
        (a, b)
    } else {
        (b, a)
    };
    macro_rules! pick {
        ($f:ident) => {
            hi.$f.clone().or_else(|| lo.$f.clone())
        };
    }
    PipelineRow {
        id: 0,
        forge: hi.forge.clone(),
        instance: hi.instance.clone(),
        pipeline_id: hi.pipeline_id,
        project_id: pick!(project_id),
        project: pick!(project),
        r#ref: pick!(r#ref),
        sha: pick!(sha),
        tag: pick!(tag),
        status: hi.status.clone(),
        pipeline_source: pick!(pipeline_source),
        web_url: pick!(web_url),
        duration_seconds: pick!(duration_seconds),
        queued_duration_seconds: pick!(queued_duration_seconds),
        created_at: min_opt(a.created_at, b.created_at),
        finished_at: pick!(finished_at),
        first_seen_at: a.first_seen_at.min(b.first_seen_at),
        last_event_at: a.last_event_at.max(b.last_event_at),
        rank_status: hi.rank_status,
        rank_at: hi.rank_at,
        rank_event: hi.rank_event.clone(),
    }
}

/// Longest failure message kept (bytes); the rest is cut at a character
/// boundary.
pub const MAX_ERROR_LEN: usize = 4096;

/// `s` cut to at most [`MAX_ERROR_LEN`] bytes at a character boundary.
fn cut(s: &str) -> &str {
    let mut end = s.len().min(MAX_ERROR_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn bounded(s: &str) -> Option<String> {
    text(cut(s))
}

fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// Sets the row's job from a key the event carries, as coming from
/// `source`. A key without forge or job id names no job.
fn set_job(row: &mut RunnerRow, job: Option<&JobKey>, source: i16) -> Result<(), Unprojectable> {
    let Some(key) = job.filter(|k| k.job_id != 0 && k.forge() != Forge::Unspecified) else {
        return Ok(());
    };
    row.job_forge = Some(forge_of(key.forge())?);
    // Kept even when empty: the job's columns are compared as a tuple, in
    // Rust and SQL alike, so none of them may be NULL.
    row.job_instance = Some(key.instance.clone());
    row.job_id = Some(id64(key.job_id, "job_id")?);
    row.job_source = Some(source);
    Ok(())
}

/// The contribution of one runner event to its runner's row: the runner
/// ref, and the column group of the event's kind.
fn runner_row(
    id: &str,
    body: &Body,
    occurred: OffsetDateTime,
    received: OffsetDateTime,
) -> Result<RunnerRow, Unprojectable> {
    let r =
        runner_ref(body).ok_or_else(|| Unprojectable("runner event without runner ref".into()))?;
    if r.name.is_empty() {
        return Err(Unprojectable("runner event without runner name".into()));
    }
    if !valid_pool_name(&r.pool) {
        return Err(Unprojectable(format!("invalid pool name {:?}", r.pool)));
    }
    let mut row = RunnerRow {
        id: 0,
        name: r.name.clone(),
        pool: r.pool.clone(),
        pool_id: text(&r.pool_id),
        provider: text(&r.provider),
        forge: (r.forge() != Forge::Unspecified).then(|| forge_token(r.forge()).to_owned()),
        instance: text(&r.instance),
        state: String::new(),
        reason: None,
        attempts: 0,
        job_forge: None,
        job_instance: None,
        job_id: None,
        run_attempt: None,
        claim_key: None,
        request_reason: None,
        flavor: None,
        memory_bytes: None,
        cpus: None,
        recommended_memory_limit_bytes: None,
        allocator_unavailable: None,
        workload_key: None,
        labels: None,
        image: None,
        provider_id: None,
        forge_runner_id: None,
        provider_status: None,
        created_attempt: None,
        online_source: None,
        failed_reason: None,
        last_error: None,
        failed_attempt: None,
        given_up: None,
        deleted_reason: None,
        requested_at: None,
        created_at: None,
        online_at: None,
        assigned_at: None,
        failed_at: None,
        deleted_at: None,
        first_seen_at: received,
        last_event_at: occurred,
        ref_event: id.to_owned(),
        job_source: None,
        requested_event: None,
        created_event: None,
        online_event: None,
        assigned_event: None,
        failed_event: None,
        deleted_event: None,
    };
    let event = Some(id.to_owned());
    match body {
        Body::RunnerRequested(q) => {
            row.requested_at = Some(occurred);
            row.requested_event = event;
            set_job(&mut row, q.job.as_ref(), job_source::REQUESTED)?;
            row.run_attempt = (q.run_attempt != 0).then(|| i32_of(q.run_attempt));
            row.claim_key = text(&q.claim_key);
            row.request_reason = text(&q.reason);
            row.flavor = text(&q.flavor);
            row.memory_bytes = (q.memory_bytes != 0)
                .then(|| id64(q.memory_bytes, "memory_bytes"))
                .transpose()?;
            row.cpus = (q.cpus != 0).then(|| i32_of(q.cpus));
            row.recommended_memory_limit_bytes = q
                .recommended_memory_limit_bytes
                .map(|v| id64(v, "recommended_memory_limit_bytes"))
                .transpose()?;
            row.allocator_unavailable = Some(q.allocator_unavailable);
            row.workload_key = text(&q.workload_key);
            row.labels = (!q.labels.is_empty()).then(|| serde_json::json!(q.labels));
            row.image = text(&q.image);
        }
        Body::RunnerCreated(c) => {
            row.created_at = Some(occurred);
            row.created_event = event;
            row.provider_id = text(&c.provider_id);
            row.forge_runner_id = c
                .forge_runner_id
                .map(|v| id64(v, "forge_runner_id"))
                .transpose()?;
            row.provider_status = text(&c.status);
            // Attempts are 1-based; an unset one is the first.
            row.created_attempt = Some(i32_of(c.attempt.max(1)));
        }
        Body::RunnerOnline(o) => {
            row.online_at = Some(occurred);
            row.online_event = event;
            row.online_source = text(&o.source);
        }
        Body::RunnerAssigned(a) => {
            row.assigned_at = Some(occurred);
            row.assigned_event = event;
            set_job(&mut row, a.job.as_ref(), job_source::ASSIGNED)?;
        }
        Body::RunnerFailed(f) => {
            row.failed_at = Some(occurred);
            row.failed_event = event;
            row.failed_reason = text(&f.reason);
            row.last_error = bounded(&f.error);
            row.failed_attempt = Some(i32_of(f.attempt.max(1)));
            row.given_up = Some(f.given_up);
            set_job(&mut row, f.job.as_ref(), job_source::FAILED)?;
        }
        Body::RunnerDeleted(d) => {
            row.deleted_at = Some(occurred);
            row.deleted_event = event;
            row.deleted_reason = text(&d.reason);
        }
        _ => {
            return Err(Unprojectable("not a runner event".into()));
        }
    }
    derive_runner(&mut row);
    Ok(row)
}

/// The state of a runner row, the same rule as the `runner_state` SQL
/// function: `deleted` is final; a failure counts while no later create
/// attempt succeeded; else the furthest of requested < created < online <
/// assigned.
pub fn runner_state(r: &RunnerRow) -> &'static str {
    if r.deleted_at.is_some() {
        state::DELETED
    } else if r
        .failed_attempt
        .is_some_and(|f| f >= r.created_attempt.unwrap_or(0))
    {
        state::FAILED
    } else if r.assigned_at.is_some() {
        state::ASSIGNED
    } else if r.online_at.is_some() {
        state::ONLINE
    } else if r.created_at.is_some() {
        state::CREATED
    } else {
        state::REQUESTED
    }
}

/// Fills the columns Postgres generates: `state`, `reason`, `attempts`.
pub fn derive_runner(r: &mut RunnerRow) {
    let st = runner_state(r);
    r.reason = match st {
        state::REQUESTED => r.request_reason.clone(),
        state::ONLINE => r.online_source.clone(),
        state::FAILED => r.failed_reason.clone(),
        state::DELETED => r.deleted_reason.clone(),
        _ => None,
    };
    r.state = st.to_owned();
    r.attempts = r
        .created_attempt
        .into_iter()
        .chain(r.failed_attempt)
        .max()
        .unwrap_or(0);
}

/// Whether a group with the (event, key) `new` replaces the group holding
/// `old`: a group that is there beats one that is not, then `better`
/// decides on the keys.
fn replaces<K: Ord>(new: Option<K>, old: Option<K>, better: std::cmp::Ordering) -> bool {
    match (new, old) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(n), Some(o)) => n.cmp(&o) == better,
    }
}

/// The key of a group kept by its earliest event: `(time, event id)`.
fn earliest_key(
    at: Option<OffsetDateTime>,
    event: &Option<String>,
) -> Option<(Option<OffsetDateTime>, &str)> {
    event.as_deref().map(|e| (at, e))
}

/// The key of the create group, kept by its latest attempt:
/// `(attempt, time, event id)`.
fn latest_created(r: &RunnerRow) -> Option<(Option<i32>, Option<OffsetDateTime>, &str)> {
    r.created_event
        .as_deref()
        .map(|e| (r.created_attempt, r.created_at, e))
}

/// The key of the failure group, kept by its latest attempt:
/// `(attempt, time, event id)`.
fn latest_failed(r: &RunnerRow) -> Option<(Option<i32>, Option<OffsetDateTime>, &str)> {
    r.failed_event
        .as_deref()
        .map(|e| (r.failed_attempt, r.failed_at, e))
}

/// Merges two rows of one runner. Every column group comes whole from one
/// event, chosen by a rule that does not depend on arrival order (see
/// `migration/0002_runners.sql`); the SQL upsert in [`crate::apply`] is the
/// same merge.
pub fn merge_runners(a: &RunnerRow, b: &RunnerRow) -> RunnerRow {
    use std::cmp::Ordering::{Greater, Less};
    let mut out = a.clone();
    if b.ref_event < a.ref_event {
        out.pool.clone_from(&b.pool);
        out.pool_id.clone_from(&b.pool_id);
        out.provider.clone_from(&b.provider);
        out.forge.clone_from(&b.forge);
        out.instance.clone_from(&b.instance);
        out.ref_event.clone_from(&b.ref_event);
    }
    let job = |r: &RunnerRow| {
        r.job_source.map(|s| {
            (
                s,
                r.job_forge.clone().unwrap_or_default(),
                r.job_instance.clone().unwrap_or_default(),
                r.job_id.unwrap_or_default(),
            )
        })
    };
    if replaces(job(b), job(a), Greater) {
        out.job_source = b.job_source;
        out.job_forge.clone_from(&b.job_forge);
        out.job_instance.clone_from(&b.job_instance);
        out.job_id = b.job_id;
    }
    if replaces(
        earliest_key(b.requested_at, &b.requested_event),
        earliest_key(a.requested_at, &a.requested_event),
        Less,
    ) {
        out.requested_at = b.requested_at;
        out.requested_event.clone_from(&b.requested_event);
        out.run_attempt = b.run_attempt;
        out.claim_key.clone_from(&b.claim_key);
        out.request_reason.clone_from(&b.request_reason);
        out.flavor.clone_from(&b.flavor);
        out.memory_bytes = b.memory_bytes;
        out.cpus = b.cpus;
        out.recommended_memory_limit_bytes = b.recommended_memory_limit_bytes;
        out.allocator_unavailable = b.allocator_unavailable;
        out.workload_key.clone_from(&b.workload_key);
        out.labels.clone_from(&b.labels);
        out.image.clone_from(&b.image);
    }
    if replaces(latest_created(b), latest_created(a), Greater) {
        out.created_at = b.created_at;
        out.created_event.clone_from(&b.created_event);
        out.provider_id.clone_from(&b.provider_id);
        out.forge_runner_id = b.forge_runner_id;
        out.provider_status.clone_from(&b.provider_status);
        out.created_attempt = b.created_attempt;
    }
    if replaces(
        earliest_key(b.online_at, &b.online_event),
        earliest_key(a.online_at, &a.online_event),
        Less,
    ) {
        out.online_at = b.online_at;
        out.online_event.clone_from(&b.online_event);
        out.online_source.clone_from(&b.online_source);
    }
    if replaces(
        earliest_key(b.assigned_at, &b.assigned_event),
        earliest_key(a.assigned_at, &a.assigned_event),
        Less,
    ) {
        out.assigned_at = b.assigned_at;
        out.assigned_event.clone_from(&b.assigned_event);
    }
    if replaces(latest_failed(b), latest_failed(a), Greater) {
        out.failed_at = b.failed_at;
        out.failed_event.clone_from(&b.failed_event);
        out.failed_reason.clone_from(&b.failed_reason);
        out.last_error.clone_from(&b.last_error);
        out.failed_attempt = b.failed_attempt;
        out.given_up = b.given_up;
    }
    if replaces(
        earliest_key(b.deleted_at, &b.deleted_event),
        earliest_key(a.deleted_at, &a.deleted_event),
        Less,
    ) {
        out.deleted_at = b.deleted_at;
        out.deleted_event.clone_from(&b.deleted_event);
        out.deleted_reason.clone_from(&b.deleted_reason);
    }
    out.first_seen_at = a.first_seen_at.min(b.first_seen_at);
    out.last_event_at = a.last_event_at.max(b.last_event_at);
    derive_runner(&mut out);
    out
}

fn int32(v: u32, what: &str) -> Result<i32, Unprojectable> {
    i32::try_from(v).map_err(|_| Unprojectable(format!("{what} {v} out of range")))
}

/// `None` for 0 (the proto's "unknown"), else the id as stored.
fn nonzero_id(v: u64, what: &str) -> Result<Option<i64>, Unprojectable> {
    (v != 0).then(|| id64(v, what)).transpose()
}

/// `None` for 0, else the number as stored.
fn nonzero_int32(v: u32, what: &str) -> Result<Option<i32>, Unprojectable> {
    (v != 0).then(|| int32(v, what)).transpose()
}

/// The `retries.jobs` array: one object per job attempt, its ids and counts
/// as stored in columns elsewhere (so one that does not fit is refused).
fn retry_jobs(jobs: &[RetryJob]) -> Result<serde_json::Value, Unprojectable> {
    let mut out = Vec::with_capacity(jobs.len());
    for j in jobs {
        let key = j
            .job
            .as_ref()
            .ok_or_else(|| Unprojectable("retry job without job key".into()))?;
        let job_id = id64(key.job_id, "job_id")?;
        let attempt = int32(j.attempt, "attempt")?;
        let oom_streak = int32(j.oom_streak, "oom_streak")?;
        let memory_limit_bytes = j
            .memory_limit_bytes
            .map(|v| id64(v, "memory_limit_bytes"))
            .transpose()?;
        let peak_memory_bytes = id64(j.peak_memory_bytes, "peak_memory_bytes")?;
        out.push(serde_json::json!({
            "job_id": job_id,
            "attempt": attempt,
            "name": text(&j.name),
            "workload_key": text(&j.workload_key),
            "oom_streak": oom_streak,
            "memory_limit_bytes": memory_limit_bytes,
            "peak_memory_bytes": peak_memory_bytes,
            "exit_code": j.exit_code,
        }));
    }
    Ok(serde_json::Value::Array(out))
}

/// The row of one retry event: its target, the job attempts it covers and
/// the columns of its kind (the others stay `None`). An id above
/// `i64::MAX` or a count above `i32::MAX` makes it unprojectable rather
/// than being cut down.
fn retry_row(
    id: &str,
    body: &Body,
    occurred: OffsetDateTime,
    received: OffsetDateTime,
) -> Result<RetryRow, Unprojectable> {
    let t = retry_target(body).ok_or_else(|| Unprojectable("retry event without target".into()))?;
    if t.unit.is_empty() {
        return Err(Unprojectable("retry event without unit".into()));
    }
    let mut row = RetryRow {
        event_id: id.to_owned(),
        kind: String::new(),
        forge: forge_of(t.forge())?,
        instance: t.instance.clone(),
        unit: t.unit.clone(),
        project_id: nonzero_id(t.project_id, "project_id")?,
        project: text(&t.project),
        pipeline_id: nonzero_id(t.pipeline_id, "pipeline_id")?,
        run_attempt: nonzero_int32(t.run_attempt, "run_attempt")?,
        r#ref: text(&t.r#ref),
        sha: text(&t.sha),
        strategy: None,
        reason: None,
        detail: None,
        forge_status: None,
        forge_calls: None,
        new_pipeline_id: None,
        new_job_ids: None,
        new_sha: None,
        new_run_attempt: None,
        web_url: None,
        adopted: None,
        errors: None,
        jobs: serde_json::Value::Array(Vec::new()),
        occurred_at: occurred,
        received_at: received,
    };
    let jobs = match body {
        Body::RetryRequested(r) => {
            row.kind = retry_kind::REQUESTED.to_owned();
            row.strategy = text(&r.strategy);
            &r.jobs
        }
        Body::RetryIssued(i) => {
            row.kind = retry_kind::ISSUED.to_owned();
            row.strategy = text(&i.strategy);
            row.new_pipeline_id = nonzero_id(i.new_pipeline_id, "new_pipeline_id")?;
            row.new_job_ids = Some(serde_json::Value::Array(
                i.new_job_ids
                    .iter()
                    .map(|&v| id64(v, "new_job_ids").map(serde_json::Value::from))
                    .collect::<Result<_, _>>()?,
            ));
            row.new_sha = text(&i.new_sha);
            row.new_run_attempt = nonzero_int32(i.new_run_attempt, "new_run_attempt")?;
            row.web_url = text(&i.web_url);
            row.forge_calls = Some(int32(i.forge_calls, "forge_calls")?);
            row.errors = Some(serde_json::Value::Array(
                i.errors
                    .iter()
                    .map(|e| serde_json::Value::from(cut(e)))
                    .collect(),
            ));
            row.adopted = Some(i.adopted);
            &i.jobs
        }
        Body::RetryRefused(r) => {
            row.kind = retry_kind::REFUSED.to_owned();
            row.reason = text(&r.reason);
            row.detail = bounded(&r.detail);
            row.forge_status = r
                .forge_status
                .map(|v| int32(v, "forge_status"))
                .transpose()?;
            row.forge_calls = Some(int32(r.forge_calls, "forge_calls")?);
            &r.jobs
        }
        _ => return Err(Unprojectable("not a retry event".into())),
    };
    row.jobs = retry_jobs(jobs)?;
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use runyard_testkit::synth;

    fn fold(events: &[Event]) -> Delta {
        let mut d = Delta::default();
        for e in events {
            d.add(e).unwrap();
        }
        d
    }

    #[test]
    fn completed_before_queued_keeps_completed_and_fills_queued_at() {
        let t = synth::base_time();
        let done = synth::job_event(7, JobStatus::Completed, t);
        let queued = synth::job_event(7, JobStatus::Queued, t);
        let d = fold(&[done, queued]);
        let row = &d.jobs[&("github".to_owned(), "github.com".to_owned(), 7)];
        assert_eq!(row.status, 4);
        assert_eq!(row.queued_at, Some(t));
        assert_eq!(row.conclusion.as_deref(), Some("failure"));
        assert_eq!(row.runner_name.as_deref(), Some("runner-7"));
        assert!(row.completed_at.is_some());
    }

    fn status_of(events: &[Event]) -> i16 {
        let d = fold(events);
        d.jobs.values().next().map(|r| r.status).unwrap_or_default()
    }

    #[test]
    fn queued_and_waiting_alternate_by_when_they_were_seen_in_any_arrival_order() {
        let waiting = synth::observation(3, JobStatus::Waiting, "waiting", 1);
        let queued = synth::observation(3, JobStatus::Queued, "queued", 60);
        // An approval: waiting, then queued.
        assert_eq!(status_of(&[waiting.clone(), queued.clone()]), 1);
        assert_eq!(status_of(&[queued.clone(), waiting.clone()]), 1);
        // Queued, then held again.
        let again = synth::observation(3, JobStatus::Waiting, "waiting", 90);
        assert_eq!(status_of(&[again.clone(), queued.clone(), waiting]), 2);
        // Running and done only move forward.
        let running = synth::observation(3, JobStatus::InProgress, "in_progress", 30);
        assert_eq!(status_of(&[running.clone(), again.clone()]), 3);
        let done = synth::observation(3, JobStatus::Completed, "completed", 40);
        assert_eq!(status_of(&[done, again, running]), 4);
    }

    #[test]
    fn a_gitlab_created_job_is_not_runnable_and_never_follows_pending() {
        let created = synth::observation(5, JobStatus::Waiting, "created", 100);
        let pending = synth::observation(5, JobStatus::Queued, "pending", 50);
        assert_eq!(status_of(std::slice::from_ref(&created)), 2);
        // A late `created` (hooks are not delivered in order) changes nothing.
        assert_eq!(status_of(&[pending.clone(), created.clone()]), 1);
        assert_eq!(status_of(&[created, pending]), 1);
    }

    #[test]
    fn unprojectable_events_are_named() {
        let mut e = synth::job_event(1, JobStatus::Queued, synth::base_time());
        e.received_at = None;
        assert!(Delta::default().add(&e).is_err());
        let mut e = synth::job_event(1, JobStatus::Queued, synth::base_time());
        if let Some(Body::JobObserved(j)) = e.body.as_mut() {
            j.job = None;
        }
        let err = Delta::default().add(&e).unwrap_err();
        assert!(err.0.contains("job key"), "{err}");
    }

    #[test]
    fn pipeline_status_comes_with_the_rank() {
        assert!(pipeline_status_rank("running") < pipeline_status_rank("failed"));
        assert!(pipeline_status_rank("created") < pipeline_status_rank("pending"));
    }

    #[test]
    fn exit_137_near_the_limit_is_an_oom_kill_only_without_cgroup_data() {
        let limit = 2_000_000_000u64;
        let sample = |cgroup: &str, oom_killed: bool, exit: i32, peak: u64| {
            let mut e = synth::usage_event(5, synth::base_time());
            if let Some(Body::UsageReported(u)) = e.body.as_mut() {
                u.cgroup = cgroup.into();
                u.oom_killed = oom_killed;
                u.exit_code = Some(exit);
                u.memory_limit_bytes = Some(limit);
                u.peak_memory_bytes = peak;
            }
            let d = fold(&[e]);
            let row = d.usage.values().next().unwrap().clone();
            (row.oom_killed, row.cgroup)
        };
        let near = limit / 100 * 97;
        assert_eq!(sample("", false, 137, near), (true, None));
        assert_eq!(sample("", false, 137, limit / 2), (false, None));
        assert_eq!(sample("", false, 1, near), (false, None));
        assert_eq!(sample("v2", false, 137, near), (false, Some("v2".into())));
        assert_eq!(sample("v1", true, 0, 1), (true, Some("v1".into())));
    }

    mod retries {
        use super::*;
        use runyard_events::{
            RetryIssued, RetryRefused, RetryRequested, RetryTarget, Source, ids, timestamp,
        };
        use serde_json::json;

        const UNIT: &str = "pipeline:900";

        fn target(unit: &str) -> Option<RetryTarget> {
            Some(RetryTarget {
                forge: Forge::Gitlab as i32,
                instance: "gitlab.example.com".into(),
                project_id: 12,
                project: "acme/app".into(),
                pipeline_id: 900,
                run_attempt: 0,
                r#ref: "main".into(),
                sha: "abc123".into(),
                unit: unit.into(),
            })
        }

        fn job(job_id: u64) -> RetryJob {
            RetryJob {
                job: Some(JobKey {
                    forge: Forge::Gitlab as i32,
                    instance: "gitlab.example.com".into(),
                    job_id,
                }),
                attempt: 1,
                name: "build".into(),
                workload_key: "package=py-torch".into(),
                oom_streak: 2,
                memory_limit_bytes: Some(4 << 30),
                peak_memory_bytes: 4 << 30,
                exit_code: Some(137),
            }
        }

        fn event(what: &str, body: Body) -> Event {
            let t = synth::base_time();
            Event {
                id: ids::retry(Forge::Gitlab, "gitlab.example.com", UNIT, what),
                occurred_at: Some(timestamp(t)),
                received_at: Some(timestamp(t + time::Duration::milliseconds(7))),
                source: Some(Source {
                    forge: Forge::Gitlab as i32,
                    instance: "gitlab.example.com".into(),
                    producer: "scaler".into(),
                    ..Source::default()
                }),
                body: Some(body),
            }
        }

        fn requested() -> Event {
            event(
                "requested",
                Body::RetryRequested(RetryRequested {
                    target: target(UNIT),
                    strategy: "pipeline".into(),
                    jobs: vec![job(41), job(42)],
                }),
            )
        }

        fn issued() -> RetryIssued {
            RetryIssued {
                target: target(UNIT),
                strategy: "pipeline".into(),
                jobs: vec![job(41)],
                new_pipeline_id: 901,
                new_job_ids: vec![],
                new_sha: "def456".into(),
                new_run_attempt: 0,
                web_url: "https://gitlab.example.com/acme/app/-/pipelines/901".into(),
                forge_calls: 2,
                errors: vec!["502 Bad Gateway".into()],
                adopted: false,
                note: String::new(),
            }
        }

        fn row(e: &Event) -> RetryRow {
            let d = fold(std::slice::from_ref(e));
            assert_eq!(d.rows(), 1);
            d.retries[&e.id].clone()
        }

        #[test]
        fn a_request_is_its_target_and_its_jobs() {
            let e = requested();
            let r = row(&e);
            assert_eq!(
                r.event_id,
                "retry:gitlab:gitlab.example.com:pipeline:900:requested"
            );
            assert_eq!(r.kind, "requested");
            assert_eq!(
                (r.forge.as_str(), r.instance.as_str(), r.unit.as_str()),
                ("gitlab", "gitlab.example.com", UNIT)
            );
            assert_eq!(
                (r.project_id, r.pipeline_id, r.run_attempt),
                (Some(12), Some(900), None)
            );
            assert_eq!(r.project.as_deref(), Some("acme/app"));
            assert_eq!(
                (r.r#ref.as_deref(), r.sha.as_deref()),
                (Some("main"), Some("abc123"))
            );
            assert_eq!(r.strategy.as_deref(), Some("pipeline"));
            assert_eq!(r.occurred_at, synth::base_time());
            assert_eq!(
                r.received_at,
                synth::base_time() + time::Duration::milliseconds(7)
            );
            assert_eq!(
                r.jobs,
                json!([
                    {"job_id": 41, "attempt": 1, "name": "build",
                     "workload_key": "package=py-torch", "oom_streak": 2,
                     "memory_limit_bytes": 4u64 << 30, "peak_memory_bytes": 4u64 << 30,
                     "exit_code": 137},
                    {"job_id": 42, "attempt": 1, "name": "build",
                     "workload_key": "package=py-torch", "oom_streak": 2,
                     "memory_limit_bytes": 4u64 << 30, "peak_memory_bytes": 4u64 << 30,
                     "exit_code": 137},
                ])
            );
            // Nothing of the other kinds.
            assert_eq!(
                (r.reason, r.detail, r.forge_status, r.forge_calls),
                (None, None, None, None)
            );
            assert_eq!(
                (r.new_pipeline_id, r.new_job_ids, r.errors, r.adopted),
                (None, None, None, None)
            );
        }

        #[test]
        fn an_issued_retry_keeps_what_the_forge_answered() {
            let mut i = issued();
            i.errors.push("é".repeat(MAX_ERROR_LEN));
            i.new_job_ids = vec![7001, 7002];
            let r = row(&event("issued", Body::RetryIssued(i)));
            assert_eq!(r.kind, "issued");
            assert_eq!(r.strategy.as_deref(), Some("pipeline"));
            assert_eq!(r.new_pipeline_id, Some(901));
            assert_eq!(r.new_job_ids, Some(json!([7001, 7002])));
            assert_eq!(r.new_sha.as_deref(), Some("def456"));
            assert_eq!(r.new_run_attempt, None);
            assert!(r.web_url.unwrap().ends_with("/901"));
            assert_eq!((r.forge_calls, r.adopted), (Some(2), Some(false)));
            let errors = r.errors.unwrap();
            assert_eq!(errors[0], "502 Bad Gateway");
            let long = errors[1].as_str().unwrap();
            assert!(long.len() <= MAX_ERROR_LEN && long.len() >= MAX_ERROR_LEN - 1);
            assert_eq!(r.jobs.as_array().map(Vec::len), Some(1));
            assert_eq!((r.reason, r.detail), (None, None));
        }

        #[test]
        fn a_refusal_of_one_job_attempt_has_its_reason() {
            let unit = ids::retry_unit_job(42, 4);
            let mut e = event(
                "refused",
                Body::RetryRefused(RetryRefused {
                    target: target(&unit),
                    reason: "max_attempts".into(),
                    detail: "4th consecutive OOM kill".into(),
                    jobs: vec![RetryJob {
                        exit_code: None,
                        memory_limit_bytes: None,
                        name: String::new(),
                        ..job(42)
                    }],
                    forge_status: Some(422),
                    forge_calls: 1,
                }),
            );
            e.id = ids::retry(Forge::Gitlab, "gitlab.example.com", &unit, "refused");
            let r = row(&e);
            assert_eq!(
                r.event_id,
                "retry:gitlab:gitlab.example.com:job:42:4:refused"
            );
            assert_eq!((r.kind.as_str(), r.unit.as_str()), ("refused", "job:42:4"));
            assert_eq!(r.reason.as_deref(), Some("max_attempts"));
            assert_eq!(r.detail.as_deref(), Some("4th consecutive OOM kill"));
            assert_eq!((r.forge_status, r.forge_calls), (Some(422), Some(1)));
            assert_eq!(r.strategy, None);
            let j = &r.jobs[0];
            assert_eq!(
                (&j["name"], &j["exit_code"], &j["memory_limit_bytes"]),
                (&json!(null), &json!(null), &json!(null))
            );
        }

        #[test]
        fn the_first_event_of_an_id_wins() {
            let first = requested();
            let mut again = requested();
            if let Some(Body::RetryRequested(r)) = again.body.as_mut() {
                r.strategy = "job".into();
            }
            let d = fold(&[first.clone(), again]);
            assert_eq!(d.retries.len(), 1);
            assert_eq!(d.retries[&first.id].strategy.as_deref(), Some("pipeline"));
        }

        #[test]
        fn values_that_cannot_be_stored_are_refused_not_cut() {
            let cases: Vec<(&str, Event)> = vec![
                ("new_pipeline_id", {
                    let mut i = issued();
                    i.new_pipeline_id = u64::MAX;
                    event("issued", Body::RetryIssued(i))
                }),
                ("new_job_ids", {
                    let mut i = issued();
                    i.new_job_ids = vec![1, 1 << 63];
                    event("issued", Body::RetryIssued(i))
                }),
                ("forge_calls", {
                    let mut i = issued();
                    i.forge_calls = u32::MAX;
                    event("issued", Body::RetryIssued(i))
                }),
                ("job_id", {
                    let mut i = issued();
                    i.jobs = vec![job(u64::MAX)];
                    event("issued", Body::RetryIssued(i))
                }),
                ("peak_memory_bytes", {
                    let mut i = issued();
                    i.jobs[0].peak_memory_bytes = u64::MAX;
                    event("issued", Body::RetryIssued(i))
                }),
                ("project_id", {
                    let mut i = issued();
                    if let Some(t) = i.target.as_mut() {
                        t.project_id = u64::MAX;
                    }
                    event("issued", Body::RetryIssued(i))
                }),
                ("run_attempt", {
                    let mut i = issued();
                    if let Some(t) = i.target.as_mut() {
                        t.run_attempt = u32::MAX;
                    }
                    event("issued", Body::RetryIssued(i))
                }),
                ("target", {
                    let mut i = issued();
                    i.target = None;
                    event("issued", Body::RetryIssued(i))
                }),
                ("unit", {
                    let mut i = issued();
                    i.target = target("");
                    event("issued", Body::RetryIssued(i))
                }),
                ("forge", {
                    let mut i = issued();
                    if let Some(t) = i.target.as_mut() {
                        t.forge = Forge::Unspecified as i32;
                    }
                    event("issued", Body::RetryIssued(i))
                }),
                ("job key", {
                    let mut i = issued();
                    i.jobs[0].job = None;
                    event("issued", Body::RetryIssued(i))
                }),
            ];
            for (what, e) in cases {
                let mut d = Delta::default();
                let err = d.add(&e).unwrap_err();
                assert!(err.0.contains(what), "{what}: {err}");
                assert_eq!(d.rows(), 0, "{what}: nothing is kept");
            }
            // The largest values that fit are kept as they are.
            let mut i = issued();
            i.new_pipeline_id = i64::MAX as u64;
            i.forge_calls = i32::MAX as u32;
            let r = row(&event("issued", Body::RetryIssued(i)));
            assert_eq!(
                (r.new_pipeline_id, r.forge_calls),
                (Some(i64::MAX), Some(i32::MAX))
            );
        }
    }

    mod runners {
        use super::*;
        use runyard_events::{
            RunnerAssigned, RunnerCreated, RunnerDeleted, RunnerFailed, RunnerOnline, RunnerRef,
            RunnerRequested, Source, runner_event_id_for, timestamp,
        };

        const NAME: &str = "ry-linux-x64-f41ae93a4d";

        fn job(job_id: u64) -> Option<JobKey> {
            Some(JobKey {
                forge: Forge::Github as i32,
                instance: "github.com".into(),
                job_id,
            })
        }

        fn runner(pool: &str) -> Option<RunnerRef> {
            Some(RunnerRef {
                pool: pool.into(),
                name: NAME.into(),
                pool_id: "0b9e0f0a-5c1d-5f43-9a57-1f3e2c4d5e6f".into(),
                provider: "lxd".into(),
                forge: Forge::Github as i32,
                instance: "github.com".into(),
            })
        }

        /// A runner event `secs` after the base time, with its contract id.
        fn at(secs: i64, body: Body) -> Event {
            let t = synth::base_time() + time::Duration::seconds(secs);
            Event {
                id: runner_event_id_for(&body).unwrap(),
                occurred_at: Some(timestamp(t)),
                received_at: Some(timestamp(t + time::Duration::milliseconds(5))),
                source: Some(Source {
                    forge: Forge::Github as i32,
                    instance: "github.com".into(),
                    producer: "scaler".into(),
                    ..Source::default()
                }),
                body: Some(body),
            }
        }

        fn requested(job_id: Option<u64>) -> Event {
            at(
                0,
                Body::RunnerRequested(RunnerRequested {
                    runner: runner("linux-x64"),
                    job: job_id.and_then(job),
                    run_attempt: 1,
                    claim_key: "github.github_com.42.1".into(),
                    reason: if job_id.is_some() {
                        "queued_job"
                    } else {
                        "min_idle"
                    }
                    .into(),
                    flavor: "small".into(),
                    memory_bytes: 4 << 30,
                    cpus: 2,
                    labels: vec!["self-hosted".into(), "linux".into()],
                    ..RunnerRequested::default()
                }),
            )
        }

        fn failed(secs: i64, attempt: u32, reason: &str, given_up: bool) -> Event {
            at(
                secs,
                Body::RunnerFailed(RunnerFailed {
                    runner: runner("linux-x64"),
                    reason: reason.into(),
                    error: format!("attempt {attempt} went wrong"),
                    attempt,
                    given_up,
                    job: job(42),
                }),
            )
        }

        fn created(secs: i64, attempt: u32) -> Event {
            at(
                secs,
                Body::RunnerCreated(RunnerCreated {
                    runner: runner("linux-x64"),
                    provider_id: format!("lxd-{attempt}"),
                    forge_runner_id: Some(77),
                    attempt,
                    status: "running".into(),
                }),
            )
        }

        fn online(secs: i64) -> Event {
            at(
                secs,
                Body::RunnerOnline(RunnerOnline {
                    runner: runner("linux-x64"),
                    source: "callback".into(),
                }),
            )
        }

        fn assigned(secs: i64, job_id: u64) -> Event {
            at(
                secs,
                Body::RunnerAssigned(RunnerAssigned {
                    runner: runner("linux-x64"),
                    job: job(job_id),
                }),
            )
        }

        fn deleted(secs: i64) -> Event {
            at(
                secs,
                Body::RunnerDeleted(RunnerDeleted {
                    runner: runner("linux-x64"),
                    reason: "job_completed".into(),
                }),
            )
        }

        /// A whole life: the first create fails, the second succeeds, the
        /// runner takes its job and goes.
        fn life() -> Vec<Event> {
            vec![
                requested(Some(42)),
                failed(10, 1, "create_failed", false),
                created(20, 2),
                online(30),
                assigned(40, 42),
                deleted(100),
            ]
        }

        fn row(events: &[Event]) -> RunnerRow {
            let d = fold(events);
            assert_eq!(d.runners.len(), 1);
            d.runners[NAME].clone()
        }

        #[test]
        fn a_whole_life_ends_deleted_with_every_step_recorded() {
            let r = row(&life());
            assert_eq!(r.state, "deleted");
            assert_eq!(r.reason.as_deref(), Some("job_completed"));
            assert_eq!(r.attempts, 2);
            assert_eq!(r.created_attempt, Some(2));
            assert_eq!(r.failed_attempt, Some(1));
            assert_eq!(r.provider_id.as_deref(), Some("lxd-2"));
            assert_eq!(r.last_error.as_deref(), Some("attempt 1 went wrong"));
            assert_eq!(
                (r.job_source, r.job_id),
                (Some(job_source::ASSIGNED), Some(42))
            );
            assert_eq!(r.pool, "linux-x64");
            assert_eq!(r.flavor.as_deref(), Some("small"));
            for t in [
                r.requested_at,
                r.created_at,
                r.online_at,
                r.assigned_at,
                r.failed_at,
                r.deleted_at,
            ] {
                assert!(t.is_some());
            }
        }

        #[test]
        fn the_state_follows_the_furthest_step_reached() {
            let steps = life();
            let want = [
                "requested",
                "failed",
                "created",
                "online",
                "assigned",
                "deleted",
            ];
            for n in 1..=steps.len() {
                assert_eq!(row(&steps[..n]).state, want[n - 1], "after {n} events");
            }
        }

        #[test]
        fn a_create_after_a_failed_earlier_attempt_is_created_in_either_order() {
            for events in [
                vec![failed(10, 1, "create_failed", false), created(20, 2)],
                vec![created(20, 2), failed(10, 1, "create_failed", false)],
            ] {
                let r = row(&events);
                assert_eq!(r.state, "created");
                assert_eq!(r.reason, None);
                assert_eq!(r.attempts, 2);
            }
            // A failure of the attempt that was created (never came online)
            // or of a later one counts.
            for events in [
                vec![created(20, 1), failed(30, 1, "bootstrap_timeout", false)],
                vec![failed(30, 2, "create_failed", true), created(20, 1)],
            ] {
                let r = row(&events);
                assert_eq!(r.state, "failed");
                assert!(r.reason.is_some());
            }
        }

        #[test]
        fn the_latest_failed_attempt_is_the_one_kept() {
            let r = row(&[
                failed(50, 2, "gave_up", true),
                requested(Some(42)),
                failed(10, 1, "create_failed", false),
            ]);
            assert_eq!(r.state, "failed");
            assert_eq!(r.reason.as_deref(), Some("gave_up"));
            assert_eq!(r.given_up, Some(true));
            assert_eq!(r.failed_attempt, Some(2));
            assert_eq!(r.last_error.as_deref(), Some("attempt 2 went wrong"));
        }

        #[test]
        fn nothing_moves_a_deleted_runner_back() {
            let r = row(&[
                deleted(100),
                online(30),
                failed(120, 3, "forge_error", true),
            ]);
            assert_eq!(r.state, "deleted");
            assert_eq!(r.reason.as_deref(), Some("job_completed"));
            assert!(r.online_at.is_some(), "the late step is still recorded");
        }

        #[test]
        fn the_job_it_took_beats_the_one_it_was_requested_for() {
            let r = row(&[assigned(40, 43), requested(Some(42))]);
            assert_eq!(r.job_id, Some(43));
            let r = row(&[requested(None), failed(10, 1, "create_failed", false)]);
            assert_eq!(
                (r.job_source, r.job_id),
                (Some(job_source::FAILED), Some(42))
            );
            let r = row(&[requested(None)]);
            assert_eq!(
                (r.job_source, r.job_id, r.reason.as_deref()),
                (None, None, Some("min_idle"))
            );
        }

        #[test]
        fn runner_events_without_a_ref_or_with_a_bad_pool_are_unprojectable() {
            let mut e = online(1);
            if let Some(Body::RunnerOnline(o)) = e.body.as_mut() {
                o.runner = None;
            }
            let err = Delta::default().add(&e).unwrap_err();
            assert!(err.0.contains("runner ref"), "{err}");
            let mut e = online(1);
            if let Some(Body::RunnerOnline(o)) = e.body.as_mut() {
                o.runner = runner("Bad.Pool");
            }
            let err = Delta::default().add(&e).unwrap_err();
            assert!(err.0.contains("pool"), "{err}");
        }

        #[test]
        fn long_errors_are_cut_at_a_character_boundary() {
            let mut e = failed(1, 1, "provider_error", false);
            if let Some(Body::RunnerFailed(f)) = e.body.as_mut() {
                f.error = "é".repeat(MAX_ERROR_LEN);
            }
            let r = row(&[e]);
            let kept = r.last_error.unwrap();
            assert!(kept.len() <= MAX_ERROR_LEN && kept.len() >= MAX_ERROR_LEN - 1);
        }

        /// Events the id contract makes unlikely but the log may hold: a
        /// second assignment at the same time, a second online under
        /// another id, another failure of the same attempt.
        fn rivals() -> Vec<Event> {
            let mut again = online(30);
            again.id.push_str(":again");
            if let Some(Body::RunnerOnline(o)) = again.body.as_mut() {
                o.source = "forge_list".into();
            }
            let mut other = failed(10, 1, "provider_error", false);
            other.id.push_str(":other");
            vec![assigned(40, 44), again, other]
        }

        proptest! {
            #[test]
            fn any_order_and_duplicates_give_the_same_row(
                seed in any::<u64>(),
                dups in 0usize..6,
                with_rivals in any::<bool>(),
            ) {
                use rand::seq::SliceRandom;
                use rand::SeedableRng;
                let mut events = life();
                if with_rivals {
                    events.extend(rivals());
                }
                let in_order = row(&events);
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                events.extend(life().into_iter().take(dups));
                events.shuffle(&mut rng);
                prop_assert_eq!(&row(&events), &in_order);
                // Merged in two halves, as two batches would be.
                let (x, y) = events.split_at(events.len() / 2);
                let merged = merge_runners(&row(x).clone(), &row(y));
                prop_assert_eq!(&merged, &in_order);
            }
        }
    }

    proptest! {
        #[test]
        fn folding_does_not_depend_on_order(seed in any::<u64>(), jobs in 1u64..6) {
            use rand::seq::SliceRandom;
            use rand::SeedableRng;
            let t = synth::base_time();
            let mut events: Vec<Event> = (1..=jobs).flat_map(|j| synth::lifecycle(j, t)).collect();
            let in_order = fold(&events);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            events.shuffle(&mut rng);
            // Duplicates too.
            let dup = events[0].clone();
            events.push(dup);
            let shuffled = fold(&events);
            prop_assert_eq!(in_order.jobs, shuffled.jobs);
            prop_assert_eq!(in_order.usage, shuffled.usage);
        }
    }
}
