//! `retries`: one row per retry event (`RetryRequested`, `RetryIssued`,
//! `RetryRefused`), never updated.

use sea_orm::entity::prelude::*;

/// A retry decision as the projection knows it.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "retries")]
pub struct Model {
    /// The event's id, `retry:<forge>:<instance>:<unit>:<what>`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: String,
    /// See [`super::retry_kind`].
    pub kind: String,
    /// `github` | `gitlab`.
    pub forge: String,
    /// Forge host.
    pub instance: String,
    /// `pipeline:<id>`, `job:<id>:<attempt>` or `run:<id>:<attempt>`.
    pub unit: String,
    /// GitLab project id / GitHub repository id.
    pub project_id: Option<i64>,
    /// Project path / `owner/repo`.
    pub project: Option<String>,
    /// GitLab pipeline id / GitHub run id.
    pub pipeline_id: Option<i64>,
    /// GitHub run attempt that failed; GitLab job strategy: the job's attempt.
    pub run_attempt: Option<i32>,
    /// Branch or tag.
    #[sea_orm(column_name = "ref")]
    pub r#ref: Option<String>,
    /// Commit of the failed pipeline / run attempt.
    pub sha: Option<String>,
    /// Requested, issued: the retry strategy.
    pub strategy: Option<String>,
    /// Refused: why (`runyard_events::RETRY_REFUSAL_REASONS`).
    pub reason: Option<String>,
    /// Refused: plain words.
    pub detail: Option<String>,
    /// Refused: the forge's HTTP status, when it refused.
    pub forge_status: Option<i32>,
    /// Issued, refused: forge calls it took.
    pub forge_calls: Option<i32>,
    /// Issued: the new pipeline (GitLab) or the job's new id.
    pub new_pipeline_id: Option<i64>,
    /// Issued: the new job ids (JSON array of numbers).
    pub new_job_ids: Option<Json>,
    /// Issued: the commit the retry runs.
    pub new_sha: Option<String>,
    /// Issued: GitHub run attempt the re-run started.
    pub new_run_attempt: Option<i32>,
    /// Issued: link.
    pub web_url: Option<String>,
    /// Issued: found already done at the forge rather than issued now.
    pub adopted: Option<bool>,
    /// Issued: transient errors met on the way (JSON array of strings).
    pub errors: Option<Json>,
    /// The job attempts covered: JSON array of `{job_id, attempt, name,
    /// workload_key, oom_streak, memory_limit_bytes, peak_memory_bytes,
    /// exit_code}`.
    pub jobs: Json,
    /// When the decision was made.
    pub occurred_at: TimeDateTimeWithTimeZone,
    /// When runyard received the event.
    pub received_at: TimeDateTimeWithTimeZone,
}

/// No relations (jobs and pipelines join by `(forge, instance, ...)`).
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
