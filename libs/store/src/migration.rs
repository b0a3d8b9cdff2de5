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
        vec![
            Box::new(Projection),
            Box::new(RUNNERS),
            Box::new(RETRIES),
            Box::new(STAGES),
            Box::new(CONSOLE),
            Box::new(CONSOLE_VOLUMES),
        ]
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

/// A migration that is plain SQL, named by hand: `DeriveMigrationName` names
/// a migration after its source file, which would give every one of them the
/// name `Projection` is recorded under in `seaql_migrations` (so none would
/// ever run).
#[derive(Debug)]
struct Sql {
    name: &'static str,
    up: &'static str,
    down: &'static str,
}

impl MigrationName for Sql {
    fn name(&self) -> &str {
        self.name
    }
}

#[sea_orm_migration::async_trait::async_trait]
impl MigrationTrait for Sql {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(self.up).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(self.down)
            .await?;
        Ok(())
    }
}

/// The `runners` table (runner lifecycle events) and the `runner_state`
/// function its derived columns use.
const RUNNERS: Sql = Sql {
    name: "m0002_runners",
    up: include_str!("migration/0002_runners.sql"),
    down: "DROP TABLE IF EXISTS runners;
DROP FUNCTION IF EXISTS runner_state(timestamptz, integer, integer, timestamptz, timestamptz, timestamptz);",
};

/// The `retries` table (retry events) with its `retry_jobs` view, and the
/// `cgroup` column of `usage_samples`.
const RETRIES: Sql = Sql {
    name: "m0003_retries",
    up: include_str!("migration/0003_retries.sql"),
    down: "DROP VIEW IF EXISTS retry_jobs;
DROP TABLE IF EXISTS retries;
DROP VIEW IF EXISTS job_usage;
ALTER TABLE usage_samples DROP COLUMN IF EXISTS cgroup;
CREATE VIEW job_usage AS
SELECT u.*, j.status AS job_status, j.conclusion, j.failure_reason, j.name AS job_name,
       j.labels, j.pipeline_id, j.started_at, j.completed_at
FROM usage_samples u
LEFT JOIN jobs j USING (forge, instance, job_id);",
};

/// Job rows ranked by lifecycle stage: `queued` and `waiting` share one
/// stage (ordered by when they were seen), GitLab `created` comes before it
/// and is not runnable.
const STAGES: Sql = Sql {
    name: "m0004_job_stages",
    up: include_str!("migration/0004_job_stages.sql"),
    down: "UPDATE jobs SET status = 1 WHERE forge = 'gitlab' AND forge_status = 'created' AND status = 2;
UPDATE jobs SET rank_status = status WHERE rank_status IN (1, 2);",
};

/// What the console reads: `job_events` (each event that names a job, a
/// runner or a pipeline, with its trace: a job's story in one indexed
/// read) and the indexes of its pages.
const CONSOLE: Sql = Sql {
    name: "m0005_console",
    up: include_str!("migration/0005_console.sql"),
    down: "DROP INDEX IF EXISTS runners_job_idx, runners_assigned_idx, jobs_job_id_idx,
    jobs_project_idx, usage_samples_attributes_idx;
DROP TABLE IF EXISTS job_events;",
};

/// The indexes the console's pages need on a busy site's month: reports,
/// started jobs and created runners by time, a job's project, pipeline and
/// end from its key alone, retry pipelines, the runners not deleted.
const CONSOLE_VOLUMES: Sql = Sql {
    name: "m0006_console_volumes",
    up: include_str!("migration/0006_console_volumes.sql"),
    down: "DROP INDEX IF EXISTS usage_samples_reported_idx, jobs_started_idx, runners_created_idx,
    jobs_key_cover_idx, retries_new_pipeline_idx, runners_alive_idx;",
};
