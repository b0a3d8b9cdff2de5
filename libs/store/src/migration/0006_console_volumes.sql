-- The console's pages on a busy site's month (500,000 jobs, 50,000
-- workloads; docs/benchmarks.md, "Console"): what each read needs beyond
-- 0005, measured on that volume.

-- Savings over a window: the usage reports, the jobs started and the
-- runners created in it, read by time instead of scanning every row. The
-- jobs' index carries what the queue waits are computed from, so they are
-- read from the index alone.
CREATE INDEX usage_samples_reported_idx ON usage_samples (reported_at);
CREATE INDEX jobs_started_idx ON jobs (started_at) INCLUDE (project, queued_at, created_at);
CREATE INDEX runners_created_idx ON runners (created_at) WHERE created_at IS NOT NULL;

-- A usage report's or a runner's job, for its project, pipeline and end,
-- without visiting the job's row: the savings join every report and every
-- runner of the window to it.
CREATE INDEX jobs_key_cover_idx ON jobs (forge, instance, job_id)
    INCLUDE (project, pipeline_id, completed_at);

-- Whether a job's pipeline is one runyard made to retry a killed one (a
-- workload's samples, the savings' first attempts).
CREATE INDEX retries_new_pipeline_idx ON retries (forge, instance, new_pipeline_id)
    WHERE kind = 'issued' AND new_pipeline_id IS NOT NULL;

-- The pools page: runners not deleted, in the order it lists them (a few
-- hundred of the month's half million).
CREATE INDEX runners_alive_idx ON runners (pool, requested_at, name) WHERE state <> 'deleted';
