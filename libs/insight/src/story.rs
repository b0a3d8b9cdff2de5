//! One job's story: every event that names it, the runners requested or
//! made for it or handed it (and everything that happened to them later),
//! its pipeline's events, its usage reports and the retries that name it,
//! on one timeline, oldest first, each with its trace id. Read from
//! `job_events`, which the job-tracker writes as it applies the log.

use serde_json::Value;
use sqlx::Row as _;

use crate::{InsightError, JOB_COLUMNS, JobBrief};

/// Most events one story shows (a job's story is tens of events; a runaway
/// one is cut here and says so).
pub const MAX_EVENTS: i64 = 2000;

/// A job, as the forge, its host and its id name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobRef {
    /// `github` / `gitlab`.
    pub forge: String,
    /// The forge's host.
    pub instance: String,
    /// The forge's job id.
    pub job_id: i64,
}

impl JobRef {
    /// The job named by a row's forge, instance and job id columns, when
    /// all three are there.
    pub fn from_columns(
        forge: Option<String>,
        instance: Option<String>,
        job_id: Option<i64>,
    ) -> Option<Self> {
        Some(Self {
            forge: forge?,
            instance: instance?,
            job_id: job_id?,
        })
    }
}

/// One event on a job's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct StoryEvent {
    /// The event's own time.
    pub at: time::OffsetDateTime,
    /// Its type: `JobObserved`, `RunnerRequested`, `UsageReported`, ...
    pub kind: String,
    /// Its id.
    pub event_id: String,
    /// The runner it names.
    pub runner: Option<String>,
    /// The job it names, when it names one (a runner may be handed
    /// another job than the one it was made for).
    pub job: Option<JobRef>,
    /// The trace it rode in (32 hex digits).
    pub trace_id: Option<String>,
    /// Its fields, by type (see the job-tracker's `story` module).
    pub detail: Value,
}

/// A usage report of the job, with the workload it trained.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The attempt.
    pub attempt: i32,
    /// The workload key the sample is filed under.
    pub workload_key: String,
}

/// A job's whole story.
#[derive(Debug, Clone, PartialEq)]
pub struct Story {
    /// The job's projected row; `None` when runyard has events naming the
    /// job but no observation of it (a usage report before its webhook).
    pub job: Option<JobBrief>,
    /// Its events, oldest first.
    pub events: Vec<StoryEvent>,
    /// True when [`MAX_EVENTS`] cut the timeline.
    pub truncated: bool,
    /// Its usage reports' workloads.
    pub reports: Vec<Report>,
    /// Other attempts of the same job: jobs of the same pipeline (GitHub
    /// run) with the same name.
    pub attempts: Vec<JobBrief>,
}

impl Story {
    /// Nothing at all is known of the job.
    pub fn is_empty(&self) -> bool {
        self.job.is_none() && self.events.is_empty() && self.reports.is_empty()
    }
}

const EVENTS: &str = "
    WITH handed AS (
        SELECT runner FROM job_events
         WHERE forge = $1 AND instance = $2 AND job_id = $3 AND runner IS NOT NULL
        UNION
        SELECT name FROM runners
         WHERE job_forge = $1 AND job_instance = $2 AND job_id = $3
    )
    SELECT occurred_at, stream_seq, type, event_id, runner, forge, instance, job_id, trace_id, detail
      FROM job_events
     WHERE forge = $1 AND instance = $2 AND job_id = $3
    UNION ALL
    SELECT occurred_at, stream_seq, type, event_id, runner, forge, instance, job_id, trace_id, detail
      FROM job_events
     WHERE runner IN (SELECT runner FROM handed)
       AND (job_id IS NULL OR job_id <> $3 OR forge <> $1 OR instance <> $2)
    UNION ALL
    SELECT occurred_at, stream_seq, type, event_id, runner, forge, instance, job_id, trace_id, detail
      FROM job_events
     WHERE $4::int8 IS NOT NULL AND forge = $1 AND instance = $2 AND pipeline_id = $4
       AND job_id IS NULL
    ORDER BY occurred_at, stream_seq, event_id
    LIMIT $5";

/// The story of `job`.
pub async fn story(db: &sqlx::PgPool, job: &JobRef) -> Result<Story, InsightError> {
    let row = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs j WHERE j.forge = $1 AND j.instance = $2 AND j.job_id = $3"
    ))
    .bind(&job.forge)
    .bind(&job.instance)
    .bind(job.job_id)
    .fetch_optional(db)
    .await
    .map_err(InsightError::on("jobs"))?;
    let brief = row
        .as_ref()
        .map(JobBrief::from_row)
        .transpose()
        .map_err(InsightError::on("jobs"))?;
    let pipeline = brief.as_ref().and_then(|b| b.pipeline_id);
    let rows = sqlx::query(EVENTS)
        .bind(&job.forge)
        .bind(&job.instance)
        .bind(job.job_id)
        .bind(pipeline)
        .bind(MAX_EVENTS + 1)
        .fetch_all(db)
        .await
        .map_err(InsightError::on("job_events"))?;
    let truncated = rows.len() as i64 > MAX_EVENTS;
    let events = rows
        .iter()
        .take(MAX_EVENTS as usize)
        .map(|r| {
            Ok(StoryEvent {
                at: r.try_get("occurred_at")?,
                kind: r.try_get("type")?,
                event_id: r.try_get("event_id")?,
                runner: r.try_get("runner")?,
                job: JobRef::from_columns(
                    r.try_get("forge")?,
                    r.try_get("instance")?,
                    r.try_get("job_id")?,
                ),
                trace_id: r.try_get("trace_id")?,
                detail: r.try_get("detail")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(InsightError::on("job_events"))?;
    let reports = sqlx::query(
        "SELECT attempt, workload_key FROM usage_samples
          WHERE forge = $1 AND instance = $2 AND job_id = $3 ORDER BY attempt",
    )
    .bind(&job.forge)
    .bind(&job.instance)
    .bind(job.job_id)
    .fetch_all(db)
    .await
    .map_err(InsightError::on("usage_samples"))?
    .iter()
    .map(|r| {
        Ok(Report {
            attempt: r.try_get("attempt")?,
            workload_key: r.try_get("workload_key")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()
    .map_err(InsightError::on("usage_samples"))?;
    let attempts = match &brief {
        Some(b) if b.pipeline_id.is_some() && b.name.is_some() => crate::job_rows(
            sqlx::query(&format!(
                "SELECT {JOB_COLUMNS} FROM jobs j
                  WHERE j.forge = $1 AND j.instance = $2 AND j.pipeline_id = $3 AND j.name = $4
                    AND j.job_id <> $5
                  ORDER BY j.run_attempt NULLS FIRST, j.job_id LIMIT 20"
            ))
            .bind(&b.forge)
            .bind(&b.instance)
            .bind(b.pipeline_id)
            .bind(&b.name)
            .bind(b.job_id)
            .fetch_all(db)
            .await,
        )?,
        _ => Vec::new(),
    };
    Ok(Story {
        job: brief,
        events,
        truncated,
        reports,
        attempts,
    })
}
