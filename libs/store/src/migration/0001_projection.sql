-- Applying an event is exactly-once: its id is recorded here in the same
-- transaction as its effect.
CREATE TABLE applied_events (
    event_id    text PRIMARY KEY,
    stream_seq  bigint NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- Small key/value facts about the projection (e.g. the last stream sequence
-- a rebuild replayed).
CREATE TABLE projection_meta (
    key    text PRIMARY KEY,
    value  text NOT NULL
);

-- One row per job. `status` only moves forward (1 queued < 2 waiting <
-- 3 in_progress < 4 completed); timestamps keep the earliest value seen.
-- Descriptive columns come from the highest-ranked observation
-- (rank_status, rank_at, rank_event), so the result does not depend on the
-- order events arrive in.
CREATE TABLE jobs (
    id                       bigserial PRIMARY KEY,
    forge                    text NOT NULL,
    instance                 text NOT NULL,
    job_id                   bigint NOT NULL,
    status                   smallint NOT NULL,
    project                  text,
    project_id               bigint,
    pipeline_id              bigint,
    run_attempt              integer,
    name                     text,
    stage                    text,
    workflow_name            text,
    labels                   jsonb,
    forge_status             text,
    conclusion               text,
    failure_reason           text,
    runner_id                bigint,
    runner_name              text,
    runner_group_id          bigint,
    runner_group_name        text,
    ref                      text,
    sha                      text,
    tag                      boolean,
    html_url                 text,
    organization             text,
    enterprise               text,
    allow_failure            boolean,
    duration_seconds         double precision,
    queued_duration_seconds  double precision,
    created_at               timestamptz,
    queued_at                timestamptz,
    started_at               timestamptz,
    completed_at             timestamptz,
    first_seen_at            timestamptz NOT NULL,
    last_event_at            timestamptz NOT NULL,
    rank_status              smallint NOT NULL,
    rank_at                  timestamptz NOT NULL,
    rank_event               text NOT NULL,
    UNIQUE (forge, instance, job_id)
);
-- The scaler's queue: open jobs by label set.
CREATE INDEX jobs_open_idx ON jobs (forge, status, created_at) WHERE status < 4;
CREATE INDEX jobs_labels_idx ON jobs USING gin (labels jsonb_path_ops);
CREATE INDEX jobs_pipeline_idx ON jobs (forge, instance, pipeline_id);

CREATE TABLE pipelines (
    id                       bigserial PRIMARY KEY,
    forge                    text NOT NULL,
    instance                 text NOT NULL,
    pipeline_id              bigint NOT NULL,
    project_id               bigint,
    project                  text,
    ref                      text,
    sha                      text,
    tag                      boolean,
    status                   text NOT NULL,
    pipeline_source          text,
    web_url                  text,
    duration_seconds         double precision,
    queued_duration_seconds  double precision,
    created_at               timestamptz,
    finished_at              timestamptz,
    first_seen_at            timestamptz NOT NULL,
    last_event_at            timestamptz NOT NULL,
    rank_status              smallint NOT NULL,
    rank_at                  timestamptz NOT NULL,
    rank_event               text NOT NULL,
    UNIQUE (forge, instance, pipeline_id)
);

-- One row per job attempt. Kept even when the job itself has not been seen
-- yet; `job_usage` joins them by key.
CREATE TABLE usage_samples (
    id                       bigserial PRIMARY KEY,
    forge                    text NOT NULL,
    instance                 text NOT NULL,
    job_id                   bigint NOT NULL,
    attempt                  integer NOT NULL,
    event_id                 text NOT NULL,
    ref                      text,
    project                  text,
    workload                 jsonb NOT NULL,
    workload_key             text NOT NULL,
    peak_memory_bytes        bigint NOT NULL,
    memory_request_bytes     bigint,
    memory_limit_bytes       bigint,
    cpu_seconds              double precision NOT NULL,
    wall_seconds             double precision NOT NULL,
    cpu_request_millicores   bigint,
    oom_killed               boolean NOT NULL,
    exit_code                integer,
    reported_at              timestamptz NOT NULL,
    UNIQUE (forge, instance, job_id, attempt)
);
-- The allocator's history: samples of a workload, newest first.
CREATE INDEX usage_samples_workload_idx ON usage_samples (workload_key, reported_at DESC);

CREATE VIEW job_usage AS
SELECT u.*, j.status AS job_status, j.conclusion, j.failure_reason, j.name AS job_name,
       j.labels, j.pipeline_id, j.started_at, j.completed_at
FROM usage_samples u
LEFT JOIN jobs j USING (forge, instance, job_id);
