//! Schema migrations, owned by job-tracker (`runyard-job-tracker migrate`,
//! also run on every start). Each migration is plain SQL so partial and GIN
//! indexes say exactly what they are.

use sea_orm_migration::prelude::*;

/// All migrations, in order.
#[derive(Debug)]
pub struct Migrator;

#[sea_orm_migration::async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(Projection)]
    }
}

/// The projection tables: jobs, pipelines, usage samples and the apply-once
/// bookkeeping.
#[derive(Debug, DeriveMigrationName)]
struct Projection;

const UP: &str = include_str!("migration/0001_projection.sql");
const DOWN: &str = "DROP VIEW IF EXISTS job_usage;
DROP TABLE IF EXISTS usage_samples, pipelines, jobs, applied_events, projection_meta;";

#[sea_orm_migration::async_trait::async_trait]
impl MigrationTrait for Projection {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(UP).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(DOWN).await?;
        Ok(())
    }
}
