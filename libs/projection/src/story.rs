//! A job's story: the `job_events` rows an event makes (pure). Each event
//! that names a job, a runner or a pipeline becomes one row, a retry
//! decision one row per job it covers, with the fields a timeline shows and
//! the trace the event rode in. Allocations, scale-set progress and events
//! this version does not know make none.

use runyard_events::{Body, Event, JobKey, RetryJob, forge_token, from_timestamp, runner_ref};
use serde_json::{Value, json};
use time::OffsetDateTime;

/// One `job_events` row (its `id` is Postgres's).
#[derive(Debug, Clone, PartialEq)]
pub struct StoryRow {
    /// The event's id.
    pub event_id: String,
    /// The stream sequence it was applied from.
    pub stream_seq: i64,
    /// The event type ([`runyard_events::event_type`]).
    pub kind: &'static str,
    /// The event's own time (`occurred_at`, else `received_at`).
    pub occurred_at: OffsetDateTime,
    /// The forge and instance of the job or pipeline it names.
    pub forge: Option<(String, String)>,
    /// The job it names (with [`StoryRow::forge`]).
    pub job_id: Option<i64>,
    /// The runner it names.
    pub runner: Option<String>,
    /// The pipeline a `PipelineObserved` names.
    pub pipeline_id: Option<i64>,
    /// The trace id of its `traceparent`, as 32 hex digits.
    pub trace_id: Option<String>,
    /// The fields a timeline shows.
    pub detail: Value,
}

/// Where a job observation came from, by its event id's scheme
/// (docs/architecture.md, "Event ids").
fn via(event_id: &str) -> &'static str {
    if event_id.contains(":poll:") {
        "poll"
    } else if event_id.contains(":scaleset:") {
        "scale set"
    } else {
        "webhook"
    }
}

fn key(k: Option<&JobKey>) -> Option<(String, String, i64)> {
    let k = k?;
    // An id past i64 never fits the projection (the event is
    // dead-lettered by the rows it would make), so it names no row here.
    let id = i64::try_from(k.job_id).ok()?;
    Some((forge_token(k.forge()).to_owned(), k.instance.clone(), id))
}

/// A row per job a retry decision covers: the job's attempt, and the
/// decision's own fields (`decision`) beside its unit.
fn retry_rows(
    jobs: &[RetryJob],
    target: Option<&runyard_events::RetryTarget>,
    decision: &Value,
    row: impl Fn(Option<(String, String, i64)>, Value) -> StoryRow,
) -> Vec<StoryRow> {
    jobs.iter()
        .map(|j| {
            let mut d = retry_job(j);
            d["unit"] = json!(target.map(|t| t.unit.clone()));
            if let (Some(d), Some(fields)) = (d.as_object_mut(), decision.as_object()) {
                d.extend(fields.clone());
            }
            row(key(j.job.as_ref()), d)
        })
        .collect()
}

fn retry_job(j: &RetryJob) -> Value {
    json!({
        "attempt": j.attempt,
        "name": j.name,
        "workload_key": j.workload_key,
        "oom_streak": j.oom_streak,
        "memory_limit_bytes": j.memory_limit_bytes,
        "peak_memory_bytes": j.peak_memory_bytes,
        "exit_code": j.exit_code,
    })
}

/// The rows `event`, applied from sequence `seq` with the trace
/// `trace_id`, adds to `job_events`.
pub fn rows(event: &Event, seq: u64, trace_id: Option<u128>) -> Vec<StoryRow> {
    let Some(body) = &event.body else {
        return Vec::new();
    };
    let Some(occurred_at) = event
        .occurred_at
        .as_ref()
        .or(event.received_at.as_ref())
        .and_then(from_timestamp)
    else {
        return Vec::new();
    };
    let row = |job: Option<(String, String, i64)>, runner: Option<String>, detail: Value| {
        let (forge, job_id) = match job {
            Some((f, i, id)) => (Some((f, i)), Some(id)),
            None => (None, None),
        };
        StoryRow {
            event_id: event.id.clone(),
            stream_seq: i64::try_from(seq).unwrap_or(i64::MAX),
            kind: runyard_events::event_type(event),
            occurred_at,
            forge,
            job_id,
            runner,
            pipeline_id: None,
            trace_id: trace_id.map(|t| format!("{t:032x}")),
            detail,
        }
    };
    let runner = runner_ref(body).map(|r| r.name.clone());
    let pool = runner_ref(body).map(|r| r.pool.clone());
    match body {
        Body::JobObserved(j) => vec![row(
            key(j.job.as_ref()),
            None,
            json!({
                "via": via(&event.id),
                "status": runyard_events::status_token(j.status()),
                "forge_status": j.forge_status,
                "conclusion": format!("{:?}", j.conclusion()).to_lowercase(),
                "failure_reason": j.failure_reason,
                "runner_name": j.runner_name,
                "run_attempt": j.run_attempt,
            }),
        )],
        Body::PipelineObserved(p) => {
            let mut r = row(
                None,
                None,
                json!({"status": p.status, "ref": p.r#ref, "jobs": p.job_ids.len()}),
            );
            r.forge = Some((forge_token(p.forge()).to_owned(), p.instance.clone()));
            r.pipeline_id = i64::try_from(p.pipeline_id).ok();
            vec![r]
        }
        Body::UsageReported(u) => vec![row(
            key(u.job.as_ref()),
            None,
            json!({
                "attempt": u.attempt,
                "peak_memory_bytes": u.peak_memory_bytes,
                "memory_request_bytes": u.memory_request_bytes,
                "memory_limit_bytes": u.memory_limit_bytes,
                "oom_killed": runyard_events::oom_killed(u),
                "exit_code": u.exit_code,
                "wall_seconds": u.wall_seconds,
            }),
        )],
        Body::RunnerRequested(q) => vec![row(
            key(q.job.as_ref()),
            runner,
            json!({
                "pool": pool,
                "reason": q.reason,
                "run_attempt": q.run_attempt,
                "flavor": q.flavor,
                "memory_bytes": q.memory_bytes,
                "cpus": q.cpus,
                "allocator_unavailable": q.allocator_unavailable,
                "recommended_memory_limit_bytes": q.recommended_memory_limit_bytes,
                "recommendation": q.recommendation.as_ref().map(|r| json!({
                    "memory_limit_bytes": r.memory_limit_bytes,
                    "memory_request_bytes": r.memory_request_bytes,
                    "statistic": r.statistic,
                    "samples": r.samples,
                    "workload_samples": r.workload_samples,
                    "oom_probability": (r.oom_probability >= 0.0).then_some(r.oom_probability),
                    "oom_bump": r.oom_bump,
                    "retry_count": r.retry_count,
                })),
            }),
        )],
        Body::RunnerCreated(c) => vec![row(
            None,
            runner,
            json!({"pool": pool, "attempt": c.attempt, "provider_id": c.provider_id, "status": c.status}),
        )],
        Body::RunnerOnline(o) => vec![row(None, runner, json!({"pool": pool, "source": o.source}))],
        Body::RunnerAssigned(a) => {
            vec![row(key(a.job.as_ref()), runner, json!({"pool": pool}))]
        }
        Body::RunnerFailed(f) => vec![row(
            key(f.job.as_ref()),
            runner,
            json!({
                "pool": pool,
                "reason": f.reason,
                "attempt": f.attempt,
                "given_up": f.given_up,
                "error": f.error,
            }),
        )],
        Body::RunnerDeleted(d) => {
            vec![row(None, runner, json!({"pool": pool, "reason": d.reason}))]
        }
        Body::RetryRequested(r) => {
            let decision = json!({"strategy": r.strategy});
            retry_rows(&r.jobs, r.target.as_ref(), &decision, |j, d| {
                row(j, None, d)
            })
        }
        Body::RetryIssued(r) => {
            let decision = json!({
                "strategy": r.strategy,
                "new_pipeline_id": r.new_pipeline_id,
                "new_job_ids": r.new_job_ids,
                "new_run_attempt": r.new_run_attempt,
                "web_url": r.web_url,
                "adopted": r.adopted,
            });
            retry_rows(&r.jobs, r.target.as_ref(), &decision, |j, d| {
                row(j, None, d)
            })
        }
        Body::RetryRefused(r) => {
            let decision = json!({
                "reason": r.reason,
                "detail": r.detail,
                "forge_status": r.forge_status,
            });
            retry_rows(&r.jobs, r.target.as_ref(), &decision, |j, d| {
                row(j, None, d)
            })
        }
        Body::JobUnserved(u) => vec![row(
            key(u.job.as_ref()),
            None,
            json!({
                "run_attempt": u.run_attempt,
                "reason": u.reason,
                "detail": u.detail,
                "labels": u.labels,
            }),
        )],
        Body::AllocationIssued(_) | Body::ScaleSetProgress(_) => Vec::new(),
    }
}
