-- OOM retry decisions the scaler made, projected from the retry events
-- (`<ns>.v1.retry.<forge>`): one row per event, never updated. A unit
-- (a pipeline, a job attempt or a run attempt) typically has a `requested`
-- row and then an `issued` or a `refused` one; a GitHub run re-run one job
-- at a time has a `requested`/`issued` pair per job (event ids
-- `retry:<forge>:<instance>:<unit>:job:<job_id>:requested|issued`).
--
-- Ids are stored as bigint: an event carrying one above 2^63 - 1 is not
-- projected (it is dead-lettered), never cut down to fit.
CREATE TABLE retries (
    -- `retry:<forge>:<instance>:<unit>:<what>`.
    event_id          text PRIMARY KEY,
    -- requested | issued | refused.
    kind              text NOT NULL CHECK (kind IN ('requested', 'issued', 'refused')),
    -- The target (`RetryTarget`).
    forge             text NOT NULL,
    instance          text NOT NULL,
    -- `pipeline:<id>`, `job:<id>:<attempt>` or `run:<id>:<attempt>`.
    unit              text NOT NULL,
    -- GitLab project id / GitHub repository id; NULL when unknown.
    project_id        bigint,
    project           text,
    -- GitLab pipeline id / GitHub run id.
    pipeline_id       bigint,
    -- GitHub run attempt that failed; GitLab job strategy: the job's attempt.
    run_attempt       integer,
    ref               text,
    -- The commit the failed pipeline / run attempt ran.
    sha               text,
    -- requested, issued: `pipeline` | `job` (GitLab), `rerun_failed_jobs` |
    -- `rerun_job` (GitHub).
    strategy          text,
    -- refused: `limit_reached` | `not_oom` | `no_usage_report` |
    -- `rerun_window_expired` | `max_attempts` | `forge_rejected` |
    -- `strategy_off`, stored as the event says.
    reason            text,
    -- refused: plain words (at most 4096 bytes, cut at a character boundary).
    detail            text,
    -- refused: the forge's HTTP status, when it refused.
    forge_status      integer,
    -- issued, refused: forge calls it took.
    forge_calls       integer,
    -- issued: the new pipeline (GitLab `pipeline`) or the job's new id
    -- (GitLab `job`); NULL when none.
    new_pipeline_id   bigint,
    -- issued: JSON array of the new job ids.
    new_job_ids       jsonb,
    -- issued: the commit the retry runs.
    new_sha           text,
    -- issued: GitHub run attempt the re-run started.
    new_run_attempt   integer,
    -- issued: link to the retry.
    web_url           text,
    -- issued: found already done at the forge rather than issued now.
    adopted           boolean,
    -- issued: JSON array of the transient errors met on the way, oldest
    -- first (each at most 4096 bytes).
    errors            jsonb,
    -- The job attempts the decision covers: JSON array of {job_id, attempt,
    -- name, workload_key, oom_streak, memory_limit_bytes, peak_memory_bytes,
    -- exit_code}; see `retry_jobs`.
    jobs              jsonb NOT NULL,
    occurred_at       timestamptz NOT NULL,
    received_at       timestamptz NOT NULL
);
-- Retries of a pipeline / run, and every decision about one unit.
CREATE INDEX retries_pipeline_idx ON retries (forge, instance, pipeline_id);
CREATE INDEX retries_unit_idx ON retries (forge, instance, unit);

-- One row per job attempt a retry decision covers.
CREATE VIEW retry_jobs AS
SELECT r.event_id, r.kind, r.forge, r.instance, r.unit, r.pipeline_id, r.strategy, r.reason,
       (j->>'job_id')::bigint AS job_id,
       (j->>'attempt')::integer AS attempt,
       j->>'name' AS name,
       j->>'workload_key' AS workload_key,
       (j->>'oom_streak')::integer AS oom_streak,
       (j->>'memory_limit_bytes')::bigint AS memory_limit_bytes,
       (j->>'peak_memory_bytes')::bigint AS peak_memory_bytes,
       (j->>'exit_code')::integer AS exit_code,
       r.occurred_at
FROM retries r
CROSS JOIN LATERAL jsonb_array_elements(r.jobs) AS j;

-- Where a usage sample's memory figures came from: `v1` or `v2` (a cgroup);
-- NULL when the report had no cgroup data. From this migration on,
-- `oom_killed` is the report's flag or, only when there is no cgroup data,
-- exit code 137 with a peak at 95% of the limit or more
-- (`runyard_events::oom_killed`); samples projected before keep the flag
-- alone until a rebuild.
ALTER TABLE usage_samples ADD COLUMN cgroup text;

-- `job_usage` lists the sample's columns as they were when it was made:
-- made again so it has `cgroup` too.
DROP VIEW job_usage;
CREATE VIEW job_usage AS
SELECT u.*, j.status AS job_status, j.conclusion, j.failure_reason, j.name AS job_name,
       j.labels, j.pipeline_id, j.started_at, j.completed_at
FROM usage_samples u
LEFT JOIN jobs j USING (forge, instance, job_id);
