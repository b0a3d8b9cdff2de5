//! `applied_events`: ids of events already applied (apply-once bookkeeping).

use sea_orm::entity::prelude::*;

/// An applied event.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "applied_events")]
pub struct Model {
    /// The event's deterministic id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: String,
    /// Stream sequence it was applied from.
    pub stream_seq: i64,
    /// When.
    pub applied_at: TimeDateTimeWithTimeZone,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
