//! `usage_samples`: what one job attempt really used.

use sea_orm::entity::prelude::*;

/// A usage sample.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "usage_samples")]
pub struct Model {
    /// Surrogate key.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// `github` | `gitlab`.
    pub forge: String,
    /// Forge host.
    pub instance: String,
    /// Job id.
    pub job_id: i64,
    /// Attempt (1-based).
    pub attempt: i32,
    /// The `UsageReported` event id.
    pub event_id: String,
    /// Branch or tag the job ran on.
    #[sea_orm(column_name = "ref")]
    pub r#ref: Option<String>,
    /// Project.
    pub project: Option<String>,
    /// Workload attributes (JSON object).
    pub workload: Json,
    /// Normalized workload key, see [`crate::workload::key`].
    pub workload_key: String,
    /// Peak memory.
    pub peak_memory_bytes: i64,
    /// Memory request.
    pub memory_request_bytes: Option<i64>,
    /// Memory limit.
    pub memory_limit_bytes: Option<i64>,
    /// CPU seconds.
    pub cpu_seconds: f64,
    /// Wall seconds.
    pub wall_seconds: f64,
    /// CPU request.
    pub cpu_request_millicores: Option<i64>,
    /// OOM-killed: the report's flag, or (only without cgroup data) exit
    /// code 137 with a peak at 95 % of the limit or more.
    pub oom_killed: bool,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// `v1` | `v2`: the cgroup the memory figures came from; `None` when the
    /// report had none.
    pub cgroup: Option<String>,
    /// When it was reported.
    pub reported_at: TimeDateTimeWithTimeZone,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
