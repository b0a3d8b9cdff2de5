//! Jobs that wait: what the projection holds as queued or waiting, oldest
//! first. The console's queue takes the reasons from the scaler
//! (`GET /v1/queue`); this is what it shows when the scaler cannot be
//! asked, and what it joins for the job's stage and links.

use crate::{InsightError, JOB_COLUMNS, JobBrief};

/// Most waiting jobs one read returns.
pub const MAX_WAITING: i64 = 1000;

/// Every job queued or waiting, oldest first (at most [`MAX_WAITING`]).
pub async fn waiting(db: &sqlx::PgPool) -> Result<Vec<JobBrief>, InsightError> {
    crate::job_rows(
        sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs j
              WHERE j.status < 3
              ORDER BY COALESCE(j.queued_at, j.created_at, j.first_seen_at), j.job_id
              LIMIT $1"
        ))
        .bind(MAX_WAITING)
        .fetch_all(db)
        .await,
    )
}
