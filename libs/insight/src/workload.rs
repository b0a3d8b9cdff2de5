//! A workload's history: every usage report filed under its key (the peak,
//! the limit that attempt ran with, whether it was killed, whether it was
//! a retry), and finding workloads by the attribute people know them by.

use std::collections::BTreeMap;

use sqlx::Row as _;

use crate::{InsightError, story::JobRef};

/// Most samples one history reads (the newest).
pub const MAX_SAMPLES: i64 = 1000;

/// One usage report of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The job that reported it.
    pub job: JobRef,
    /// Its attempt.
    pub attempt: i32,
    /// When it was reported.
    pub reported_at: time::OffsetDateTime,
    /// Its peak memory.
    pub peak_memory_bytes: i64,
    /// The limit it ran with, when known.
    pub memory_limit_bytes: Option<i64>,
    /// The request it ran with, when known.
    pub memory_request_bytes: Option<i64>,
    /// OOM-killed.
    pub oom_killed: bool,
    /// Its exit code.
    pub exit_code: Option<i32>,
    /// How long it ran.
    pub wall_seconds: f64,
    /// The ref it ran on.
    pub git_ref: Option<String>,
    /// A retry: a later attempt, or a job of a pipeline runyard made to
    /// retry a killed one.
    pub retry: bool,
}

/// A workload's samples and attributes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct History {
    /// The attributes of its latest report (what the allocator is asked
    /// with).
    pub attributes: BTreeMap<String, String>,
    /// Its samples, oldest first (the newest [`MAX_SAMPLES`] at most).
    pub samples: Vec<Sample>,
    /// Samples in all.
    pub total: i64,
}

/// The history of the workload `key`, its newest `limit` samples (at most
/// [`MAX_SAMPLES`]).
pub async fn history(db: &sqlx::PgPool, key: &str, limit: i64) -> Result<History, InsightError> {
    let rows = sqlx::query(
        "SELECT s.forge, s.instance, s.job_id, s.attempt, s.reported_at, s.peak_memory_bytes,
                s.memory_limit_bytes, s.memory_request_bytes, s.oom_killed, s.exit_code,
                s.wall_seconds, s.ref, s.workload,
                (s.attempt > 1 OR EXISTS (
                    SELECT 1 FROM jobs j JOIN retries r
                      ON r.kind = 'issued' AND r.forge = j.forge AND r.instance = j.instance
                     AND r.new_pipeline_id = j.pipeline_id
                    WHERE j.forge = s.forge AND j.instance = s.instance AND j.job_id = s.job_id
                )) AS retry
           FROM (SELECT * FROM usage_samples WHERE workload_key = $1
                  ORDER BY reported_at DESC LIMIT $2) s
          ORDER BY s.reported_at, s.job_id, s.attempt",
    )
    .bind(key)
    .bind(limit.clamp(1, MAX_SAMPLES))
    .fetch_all(db)
    .await
    .map_err(InsightError::on("usage_samples"))?;
    let samples = rows
        .iter()
        .map(sample)
        .collect::<Result<Vec<_>, _>>()
        .map_err(InsightError::on("usage_samples"))?;
    let attributes = match rows.last() {
        Some(r) => {
            let w: serde_json::Value = r
                .try_get("workload")
                .map_err(InsightError::on("usage_samples"))?;
            serde_json::from_value(w).unwrap_or_default()
        }
        None => BTreeMap::new(),
    };
    let total: i64 = if (samples.len() as i64) < limit.clamp(1, MAX_SAMPLES) {
        samples.len() as i64
    } else {
        sqlx::query_scalar("SELECT count(*) FROM usage_samples WHERE workload_key = $1")
            .bind(key)
            .fetch_one(db)
            .await
            .map_err(InsightError::on("usage_samples"))?
    };
    Ok(History {
        attributes,
        samples,
        total,
    })
}

fn sample(r: &sqlx::postgres::PgRow) -> Result<Sample, sqlx::Error> {
    Ok(Sample {
        job: JobRef {
            forge: r.try_get("forge")?,
            instance: r.try_get("instance")?,
            job_id: r.try_get("job_id")?,
        },
        attempt: r.try_get("attempt")?,
        reported_at: r.try_get("reported_at")?,
        peak_memory_bytes: r.try_get("peak_memory_bytes")?,
        memory_limit_bytes: r.try_get("memory_limit_bytes")?,
        memory_request_bytes: r.try_get("memory_request_bytes")?,
        oom_killed: r.try_get("oom_killed")?,
        exit_code: r.try_get("exit_code")?,
        wall_seconds: r.try_get("wall_seconds")?,
        git_ref: r.try_get("ref")?,
        retry: r.try_get("retry")?,
    })
}

/// A workload found by [`find`].
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadHit {
    /// Its key.
    pub key: String,
    /// Its samples.
    pub samples: i64,
    /// Its latest report.
    pub last_at: time::OffsetDateTime,
}

/// The attributes a workload is searched by: a Spack package, a GitHub
/// repository, a GitLab project.
pub const SEARCHED_BY: [&str; 3] = ["package", "repo", "project"];

/// The workloads whose `package`, `repo` or `project` attribute is `q`,
/// most recently reported first (at most `limit`).
pub async fn find(
    db: &sqlx::PgPool,
    q: &str,
    limit: i64,
) -> Result<Vec<WorkloadHit>, InsightError> {
    let rows = sqlx::query(
        "SELECT workload_key, count(*) AS samples, max(reported_at) AS last_at
           FROM usage_samples
          WHERE workload @> jsonb_build_object('package', $1::text)
             OR workload @> jsonb_build_object('repo', $1::text)
             OR workload @> jsonb_build_object('project', $1::text)
          GROUP BY workload_key
          ORDER BY last_at DESC
          LIMIT $2",
    )
    .bind(q)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(InsightError::on("usage_samples"))?;
    rows.iter()
        .map(|r| {
            Ok(WorkloadHit {
                key: r.try_get("workload_key")?,
                samples: r.try_get("samples")?,
                last_at: r.try_get("last_at")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(InsightError::on("usage_samples"))
}
