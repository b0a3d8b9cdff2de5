//! The read side of runyard's projection: what people ask of it, as typed
//! answers. The console's pages and the `runyard` CLI both read these, so
//! a figure is computed once and comes out the same everywhere.
//!
//! - [`savings`]: reserved versus used memory, first-attempt OOM rate,
//!   retries, runner minutes and queue waits over a window;
//! - [`story`]: one job's every event on one timeline (`job_events`);
//! - [`workload`]: a workload's samples, the limit each attempt ran with,
//!   the kills and the retries;
//! - [`pools`]: each pool's runners, recent provider errors and queue
//!   waits;
//! - [`search`]: jobs by id, project or runner name, workloads by package,
//!   repository or project.
//!
//! Every query is read-only and bounded (a `LIMIT`, an index), so a page
//! stays fast on a busy site's month (docs/benchmarks.md, "Console").

pub mod jobs;
pub mod pools;
pub mod savings;
pub mod search;
pub mod story;
pub mod workload;

/// `90s`, `30m`, `6h`, `2d`, `1w` (a bare number is seconds): a window
/// as people type it (`runyard savings --since`, the savings page).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30m, 6h or 2d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("{s:?}: unit must be s, m, h, d or w")),
    };
    n.checked_mul(secs)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// A query of the projection failed.
#[derive(Debug, thiserror::Error)]
#[error("reading {table}: {source}")]
pub struct InsightError {
    /// The table (or view) being read.
    pub table: &'static str,
    /// What Postgres or the connection said.
    #[source]
    pub source: sqlx::Error,
}

impl InsightError {
    /// Wraps an error met while reading `table`.
    pub fn on(table: &'static str) -> impl Fn(sqlx::Error) -> Self {
        move |source| Self { table, source }
    }

    /// Postgres says the table is not there (the job-tracker has not
    /// migrated the database yet) or may not be read (`42501`).
    pub fn schema_or_permission(&self) -> bool {
        matches!(&self.source, sqlx::Error::Database(d)
            if d.code().is_some_and(|c| c == "42P01" || c == "42501"))
    }
}

/// A job as pages and lists show it: who, what, where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct JobBrief {
    /// `github` / `gitlab`.
    pub forge: String,
    /// The forge's host.
    pub instance: String,
    /// The forge's job id.
    pub job_id: i64,
    /// Repository / project.
    pub project: Option<String>,
    /// The job's name.
    pub name: Option<String>,
    /// GitLab stage.
    pub stage: Option<String>,
    /// GitHub workflow.
    pub workflow_name: Option<String>,
    /// Labels (GitLab: tags).
    pub labels: Vec<String>,
    /// `queued`, `waiting`, `in_progress` or `completed`.
    pub status: &'static str,
    /// The forge's own word for it.
    pub forge_status: Option<String>,
    /// How it ended.
    pub conclusion: Option<String>,
    /// GitLab's failure reason.
    pub failure_reason: Option<String>,
    /// GitHub run attempt; GitLab retries + 1.
    pub run_attempt: Option<i32>,
    /// GitLab pipeline / GitHub run.
    pub pipeline_id: Option<i64>,
    /// Branch or tag.
    pub git_ref: Option<String>,
    /// The job at the forge.
    pub html_url: Option<String>,
    /// The runner the forge says ran it.
    pub runner_name: Option<String>,
    /// When the forge made it.
    pub created_at: Option<time::OffsetDateTime>,
    /// When it was queued (the latest time it became runnable).
    pub queued_at: Option<time::OffsetDateTime>,
    /// When it started.
    pub started_at: Option<time::OffsetDateTime>,
    /// When it completed.
    pub completed_at: Option<time::OffsetDateTime>,
    /// When runyard first heard of it.
    pub first_seen_at: time::OffsetDateTime,
}

/// The columns [`JobBrief::from_row`] reads, for a `SELECT` of `jobs`
/// aliased `j`.
pub const JOB_COLUMNS: &str = "j.forge, j.instance, j.job_id, j.project, j.name, j.stage, \
     j.workflow_name, j.labels, j.status, j.forge_status, j.conclusion, j.failure_reason, \
     j.run_attempt, j.pipeline_id, j.ref, j.html_url, j.runner_name, j.created_at, \
     j.queued_at, j.started_at, j.completed_at, j.first_seen_at";

/// Reads rows of [`JOB_COLUMNS`] (the result of a query of `jobs`).
pub fn job_rows(
    rows: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>,
) -> Result<Vec<JobBrief>, InsightError> {
    rows.map_err(InsightError::on("jobs"))?
        .iter()
        .map(JobBrief::from_row)
        .collect::<Result<Vec<_>, _>>()
        .map_err(InsightError::on("jobs"))
}

/// The status word of the projection's `jobs.status`.
pub fn status_word(status: i16) -> &'static str {
    match status {
        1 => "queued",
        2 => "waiting",
        3 => "in_progress",
        4 => "completed",
        _ => "unknown",
    }
}

impl JobBrief {
    /// Reads a row of [`JOB_COLUMNS`].
    pub fn from_row(r: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let labels: Option<serde_json::Value> = r.try_get("labels")?;
        Ok(Self {
            forge: r.try_get("forge")?,
            instance: r.try_get("instance")?,
            job_id: r.try_get("job_id")?,
            project: r.try_get("project")?,
            name: r.try_get("name")?,
            stage: r.try_get("stage")?,
            workflow_name: r.try_get("workflow_name")?,
            labels: labels
                .and_then(|l| serde_json::from_value(l).ok())
                .unwrap_or_default(),
            status: status_word(r.try_get("status")?),
            forge_status: r.try_get("forge_status")?,
            conclusion: r.try_get("conclusion")?,
            failure_reason: r.try_get("failure_reason")?,
            run_attempt: r.try_get("run_attempt")?,
            pipeline_id: r.try_get("pipeline_id")?,
            git_ref: r.try_get("ref")?,
            html_url: r.try_get("html_url")?,
            runner_name: r.try_get("runner_name")?,
            created_at: r.try_get("created_at")?,
            queued_at: r.try_get("queued_at")?,
            started_at: r.try_get("started_at")?,
            completed_at: r.try_get("completed_at")?,
            first_seen_at: r.try_get("first_seen_at")?,
        })
    }
}
