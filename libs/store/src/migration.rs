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
        vec![Box::new(Projection), Box::new(Runners), Box::new(Retries)]
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

/// The `runners` table (runner lifecycle events) and the `runner_state`
/// function its derived columns use.
#[derive(Debug)]
struct Runners;

// Named by hand: `DeriveMigrationName` names a migration after its source
// file, which would give this one the name `Projection` is recorded under in
// `seaql_migrations` (so it would never run).
impl MigrationName for Runners {
    fn name(&self) -> &str {
        "m0002_runners"
    }
}

const RUNNERS_UP: &str = include_str!("migration/0002_runners.sql");
const RUNNERS_DOWN: &str = "DROP TABLE IF EXISTS runners;
DROP FUNCTION IF EXISTS runner_state(timestamptz, integer, integer, timestamptz, timestamptz, timestamptz);";

#[sea_orm_migration::async_trait::async_trait]
impl MigrationTrait for Runners {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(RUNNERS_UP)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(RUNNERS_DOWN)
            .await?;
        Ok(())
    }
}

/// The `retries` table (retry events) with its `retry_jobs` view, and the
/// `cgroup` column of `usage_samples`.
#[derive(Debug)]
struct Retries;

// Named by hand, as `Runners` is.
impl MigrationName for Retries {
    fn name(&self) -> &str {
        "m0003_retries"
    }
}

const RETRIES_UP: &str = include_str!("migration/0003_retries.sql");
const RETRIES_DOWN: &str = "DROP VIEW IF EXISTS retry_jobs;
DROP TABLE IF EXISTS retries;
DROP VIEW IF EXISTS job_usage;
ALTER TABLE usage_samples DROP COLUMN IF EXISTS cgroup;
CREATE VIEW job_usage AS
SELECT u.*, j.status AS job_status, j.conclusion, j.failure_reason, j.name AS job_name,
       j.labels, j.pipeline_id, j.started_at, j.completed_at
FROM usage_samples u
LEFT JOIN jobs j USING (forge, instance, job_id);";

#[sea_orm_migration::async_trait::async_trait]
impl MigrationTrait for Retries {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(RETRIES_UP)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(RETRIES_DOWN)
            .await?;
        Ok(())
    }
}
