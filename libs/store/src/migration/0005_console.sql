-- A job's story: one row per event that names a job, a runner or a
-- pipeline, with the trace it rode in, so one job's whole timeline
-- (its webhooks and polls, the runners requested and made for it or handed
-- it and everything that happened to them, its usage reports, the retries
-- that name it) is one indexed read. Rows are only inserted, in the same
-- transaction that records the event as applied; a retry event that names
-- several jobs has a row per job.
CREATE TABLE job_events (
    id           bigserial PRIMARY KEY,
    event_id     text NOT NULL,
    -- The stream sequence it was applied from.
    stream_seq   bigint NOT NULL,
    -- The event type: JobObserved, RunnerRequested, UsageReported, ...
    type         text NOT NULL,
    -- The event's own time (occurred_at, else received_at).
    occurred_at  timestamptz NOT NULL,
    -- The job it names; NULL for a runner's later events (they name only
    -- the runner) and for a pipeline's.
    forge        text,
    instance     text,
    job_id       bigint,
    -- The runner it names.
    runner       text,
    -- The pipeline (GitLab) or run (GitHub) a PipelineObserved names.
    pipeline_id  bigint,
    -- The W3C trace id (32 hex digits) of the message's `traceparent`.
    trace_id     text,
    -- The event's fields a timeline shows (status, flavor, limit, peak,
    -- reason, error, ...), by type.
    detail       jsonb NOT NULL
);
CREATE INDEX job_events_job_idx ON job_events (forge, instance, job_id, occurred_at)
    WHERE job_id IS NOT NULL;
CREATE INDEX job_events_runner_idx ON job_events (runner, occurred_at)
    WHERE runner IS NOT NULL;
CREATE INDEX job_events_pipeline_idx ON job_events (forge, instance, pipeline_id)
    WHERE pipeline_id IS NOT NULL;
-- The runners made for or handed a job.
CREATE INDEX runners_job_idx ON runners (job_forge, job_instance, job_id)
    WHERE job_id IS NOT NULL;

-- The console's pages, each one indexed read (docs/benchmarks.md,
-- "Console"): provider errors of the last hours, queue waits by pool,
-- search by job id, by project and by a workload's package, repository or
-- project.
CREATE INDEX job_events_failed_idx ON job_events (occurred_at) WHERE type = 'RunnerFailed';
CREATE INDEX runners_assigned_idx ON runners (assigned_at) WHERE assigned_at IS NOT NULL;
CREATE INDEX jobs_job_id_idx ON jobs (job_id);
CREATE INDEX jobs_project_idx ON jobs (project, first_seen_at DESC);
CREATE INDEX usage_samples_attributes_idx ON usage_samples USING gin (workload jsonb_path_ops);
