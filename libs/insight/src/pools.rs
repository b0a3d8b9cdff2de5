//! Each pool as the projection knows it: its runners that are not deleted
//! (state, flavor, age, the job they run), its provider's recent errors,
//! and how long its jobs waited for a runner over the last hour and day.

use sqlx::Row as _;

use crate::InsightError;
use crate::story::JobRef;

/// Most runners one pool lists.
pub const MAX_RUNNERS: i64 = 500;

/// A runner as the pools page lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerLine {
    /// Its name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// requested | created | online | assigned | failed | deleted.
    pub state: String,
    /// Why it is in that state (request reason, failure, deletion).
    pub reason: Option<String>,
    /// Its flavor.
    pub flavor: Option<String>,
    /// The flavor's memory.
    pub memory_bytes: Option<i64>,
    /// The job it runs, or was made for.
    pub job: Option<JobRef>,
    /// When the scaler asked for it.
    pub requested_at: Option<time::OffsetDateTime>,
    /// When the provider made it.
    pub created_at: Option<time::OffsetDateTime>,
    /// Create attempts made.
    pub attempts: i32,
    /// The last create error.
    pub last_error: Option<String>,
}

const RUNNER_COLUMNS: &str = "name, pool, state, reason, flavor, memory_bytes, job_forge, \
    job_instance, job_id, requested_at, created_at, attempts, last_error";

fn runner_line(r: &sqlx::postgres::PgRow) -> Result<RunnerLine, sqlx::Error> {
    Ok(RunnerLine {
        name: r.try_get("name")?,
        pool: r.try_get("pool")?,
        state: r.try_get("state")?,
        reason: r.try_get("reason")?,
        flavor: r.try_get("flavor")?,
        memory_bytes: r.try_get("memory_bytes")?,
        job: JobRef::from_columns(
            r.try_get("job_forge")?,
            r.try_get("job_instance")?,
            r.try_get("job_id")?,
        ),
        requested_at: r.try_get("requested_at")?,
        created_at: r.try_get("created_at")?,
        attempts: r.try_get("attempts")?,
        last_error: r.try_get("last_error")?,
    })
}

/// The runners of every pool (or of `pool`) that are not deleted, oldest
/// first; at most [`MAX_RUNNERS`] per call.
pub async fn runners(
    db: &sqlx::PgPool,
    pool: Option<&str>,
) -> Result<Vec<RunnerLine>, InsightError> {
    sqlx::query(&format!(
        "SELECT {RUNNER_COLUMNS} FROM runners
          WHERE state <> 'deleted' AND ($1::text IS NULL OR pool = $1)
          ORDER BY pool, requested_at NULLS LAST, name
          LIMIT $2"
    ))
    .bind(pool)
    .bind(MAX_RUNNERS)
    .fetch_all(db)
    .await
    .map_err(InsightError::on("runners"))?
    .iter()
    .map(runner_line)
    .collect::<Result<Vec<_>, _>>()
    .map_err(InsightError::on("runners"))
}

/// A runner by its name.
pub async fn runner(db: &sqlx::PgPool, name: &str) -> Result<Option<RunnerLine>, InsightError> {
    sqlx::query(&format!(
        "SELECT {RUNNER_COLUMNS} FROM runners WHERE name = $1"
    ))
    .bind(name)
    .fetch_optional(db)
    .await
    .map_err(InsightError::on("runners"))?
    .as_ref()
    .map(runner_line)
    .transpose()
    .map_err(InsightError::on("runners"))
}

/// A create that failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderError {
    /// The runner.
    pub runner: String,
    /// Its pool.
    pub pool: String,
    /// When.
    pub at: time::OffsetDateTime,
    /// The failure's kind (`create_failed`, `bootstrap_timeout`, ...).
    pub reason: Option<String>,
    /// What the provider said.
    pub error: Option<String>,
    /// Which attempt.
    pub attempt: Option<i64>,
    /// The scaler gave the runner up.
    pub given_up: bool,
}

/// The last `limit` failures of every pool's runners within `window`,
/// newest first.
pub async fn provider_errors(
    db: &sqlx::PgPool,
    window: std::time::Duration,
    limit: i64,
) -> Result<Vec<ProviderError>, InsightError> {
    sqlx::query(
        "SELECT runner, detail->>'pool' AS pool, occurred_at, detail->>'reason' AS reason,
                detail->>'error' AS error, (detail->>'attempt')::int8 AS attempt,
                COALESCE((detail->>'given_up')::boolean, false) AS given_up
           FROM job_events
          WHERE type = 'RunnerFailed' AND occurred_at >= now() - make_interval(secs => $1)
          ORDER BY occurred_at DESC
          LIMIT $2",
    )
    .bind(window.as_secs_f64())
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(InsightError::on("job_events"))?
    .iter()
    .map(|r| {
        Ok(ProviderError {
            runner: r
                .try_get::<Option<String>, _>("runner")?
                .unwrap_or_default(),
            pool: r.try_get::<Option<String>, _>("pool")?.unwrap_or_default(),
            at: r.try_get("occurred_at")?,
            reason: r.try_get("reason")?,
            error: r.try_get("error")?,
            attempt: r.try_get("attempt")?,
            given_up: r.try_get("given_up")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()
    .map_err(InsightError::on("job_events"))
}

/// Queue waits of one pool's jobs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Waits {
    /// Jobs that started.
    pub jobs: i64,
    /// Median wait, seconds.
    pub p50: Option<f64>,
    /// 95th percentile, seconds.
    pub p95: Option<f64>,
}

/// A pool's waits over the last hour and the last day.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolWaits {
    /// The pool.
    pub pool: String,
    /// Jobs that started within the last hour.
    pub hour: Waits,
    /// Within the last day.
    pub day: Waits,
}

/// Every pool's queue waits: started_at − (queued_at, else created_at) of
/// the jobs its runners were handed, by when they started.
pub async fn waits(db: &sqlx::PgPool) -> Result<Vec<PoolWaits>, InsightError> {
    sqlx::query(
        "SELECT pool,
                count(*) FILTER (WHERE hour) AS hour_jobs,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY w) FILTER (WHERE hour) AS hour_p50,
                percentile_cont(0.95) WITHIN GROUP (ORDER BY w) FILTER (WHERE hour) AS hour_p95,
                count(*) AS day_jobs,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY w) AS day_p50,
                percentile_cont(0.95) WITHIN GROUP (ORDER BY w) AS day_p95
           FROM (
               SELECT r.pool,
                      extract(epoch FROM j.started_at - COALESCE(j.queued_at, j.created_at))::float8 AS w,
                      j.started_at >= now() - interval '1 hour' AS hour
                 FROM runners r
                 JOIN jobs j ON j.forge = r.job_forge AND j.instance = r.job_instance
                            AND j.job_id = r.job_id
                WHERE r.assigned_at >= now() - interval '2 days'
                  AND j.started_at >= now() - interval '1 day'
                  AND COALESCE(j.queued_at, j.created_at) IS NOT NULL
           ) w
          GROUP BY pool
          ORDER BY pool",
    )
    .fetch_all(db)
    .await
    .map_err(InsightError::on("runners"))?
    .iter()
    .map(|r| {
        Ok(PoolWaits {
            pool: r.try_get("pool")?,
            hour: Waits {
                jobs: r.try_get("hour_jobs")?,
                p50: r.try_get("hour_p50")?,
                p95: r.try_get("hour_p95")?,
            },
            day: Waits {
                jobs: r.try_get("day_jobs")?,
                p50: r.try_get("day_p50")?,
                p95: r.try_get("day_p95")?,
            },
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()
    .map_err(InsightError::on("runners"))
}
