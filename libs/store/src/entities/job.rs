//! `jobs`: one row per `(forge, instance, job_id)`.

use sea_orm::entity::prelude::*;

/// A job as the projection knows it.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "jobs")]
pub struct Model {
    /// Surrogate key.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// `github` | `gitlab`.
    pub forge: String,
    /// Forge host.
    pub instance: String,
    /// GitHub `workflow_job.id` / GitLab `build_id`.
    pub job_id: i64,
    /// See [`super::status`].
    pub status: i16,
    /// Repository / project path.
    pub project: Option<String>,
    /// Repository / project id.
    pub project_id: Option<i64>,
    /// Run / pipeline id.
    pub pipeline_id: Option<i64>,
    /// Run attempt.
    pub run_attempt: Option<i32>,
    /// Job name.
    pub name: Option<String>,
    /// GitLab stage.
    pub stage: Option<String>,
    /// GitHub workflow name.
    pub workflow_name: Option<String>,
    /// Labels (JSON array of strings).
    pub labels: Option<Json>,
    /// The forge's own status word.
    pub forge_status: Option<String>,
    /// `success`, `failure`, ... once completed.
    pub conclusion: Option<String>,
    /// GitLab failure reason.
    pub failure_reason: Option<String>,
    /// Runner id.
    pub runner_id: Option<i64>,
    /// Runner name.
    pub runner_name: Option<String>,
    /// Runner group id.
    pub runner_group_id: Option<i64>,
    /// Runner group name.
    pub runner_group_name: Option<String>,
    /// Branch or tag.
    #[sea_orm(column_name = "ref")]
    pub r#ref: Option<String>,
    /// Commit.
    pub sha: Option<String>,
    /// Whether `ref` is a tag.
    pub tag: Option<bool>,
    /// Link to the job.
    pub html_url: Option<String>,
    /// GitHub organization.
    pub organization: Option<String>,
    /// GitHub enterprise.
    pub enterprise: Option<String>,
    /// GitLab allow_failure.
    pub allow_failure: Option<bool>,
    /// Run time.
    pub duration_seconds: Option<f64>,
    /// Time spent queued.
    pub queued_duration_seconds: Option<f64>,
    /// Created at the forge.
    pub created_at: Option<TimeDateTimeWithTimeZone>,
    /// First seen queued.
    pub queued_at: Option<TimeDateTimeWithTimeZone>,
    /// Started.
    pub started_at: Option<TimeDateTimeWithTimeZone>,
    /// Completed.
    pub completed_at: Option<TimeDateTimeWithTimeZone>,
    /// When runyard first received anything about it.
    pub first_seen_at: TimeDateTimeWithTimeZone,
    /// Latest event time.
    pub last_event_at: TimeDateTimeWithTimeZone,
    /// Rank of the observation the descriptive columns come from.
    pub rank_status: i16,
    /// Rank: occurred_at.
    pub rank_at: TimeDateTimeWithTimeZone,
    /// Rank: event id (tie-breaker).
    pub rank_event: String,
}

/// No relations (usage joins by key, see the `job_usage` view).
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
