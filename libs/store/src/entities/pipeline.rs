//! `pipelines`: one row per `(forge, instance, pipeline_id)`.

use sea_orm::entity::prelude::*;

/// A pipeline as the projection knows it.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "pipelines")]
pub struct Model {
    /// Surrogate key.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// `github` | `gitlab`.
    pub forge: String,
    /// Forge host.
    pub instance: String,
    /// Pipeline id.
    pub pipeline_id: i64,
    /// Project id.
    pub project_id: Option<i64>,
    /// Project path.
    pub project: Option<String>,
    /// Branch or tag.
    #[sea_orm(column_name = "ref")]
    pub r#ref: Option<String>,
    /// Commit.
    pub sha: Option<String>,
    /// Whether `ref` is a tag.
    pub tag: Option<bool>,
    /// GitLab's status word.
    pub status: String,
    /// What started it.
    pub pipeline_source: Option<String>,
    /// Link.
    pub web_url: Option<String>,
    /// Run time.
    pub duration_seconds: Option<f64>,
    /// Time queued.
    pub queued_duration_seconds: Option<f64>,
    /// Created.
    pub created_at: Option<TimeDateTimeWithTimeZone>,
    /// Finished.
    pub finished_at: Option<TimeDateTimeWithTimeZone>,
    /// First received.
    pub first_seen_at: TimeDateTimeWithTimeZone,
    /// Latest event time.
    pub last_event_at: TimeDateTimeWithTimeZone,
    /// Rank of the observation the columns come from.
    pub rank_status: i16,
    /// Rank: occurred_at.
    pub rank_at: TimeDateTimeWithTimeZone,
    /// Rank: event id.
    pub rank_event: String,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
