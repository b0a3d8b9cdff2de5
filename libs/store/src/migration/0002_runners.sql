-- Runners the scaler made, one row per runner name, projected from the
-- runner events (`<ns>.v1.runner.<pool>.<state>`).
--
-- The row is a merge of facts that does not depend on the order events
-- arrive in: each event kind fills its own group of columns, and when two
-- events of one kind meet, a fixed rule picks the group's event (requested,
-- online, assigned, deleted: the earliest by (time, event id); created: the
-- latest create attempt; failed: the latest failed attempt, then time, then
-- event id). `state`, `reason` and `attempts` are derived from those facts
-- by Postgres, so they can never disagree with them.

-- The state a runner is in, from the facts known about it: `deleted` is
-- final; a failure counts while no later create attempt succeeded (a failed
-- attempt 1 then a created attempt 2 is `created`); otherwise the furthest
-- step reached, requested < created < online < assigned. job-tracker's
-- `projection::runner_state` is the same rule.
CREATE FUNCTION runner_state(
    deleted_at timestamptz,
    failed_attempt integer,
    created_attempt integer,
    assigned_at timestamptz,
    online_at timestamptz,
    created_at timestamptz
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN deleted_at IS NOT NULL THEN 'deleted'
        WHEN failed_attempt IS NOT NULL
             AND failed_attempt >= COALESCE(created_attempt, 0) THEN 'failed'
        WHEN assigned_at IS NOT NULL THEN 'assigned'
        WHEN online_at IS NOT NULL THEN 'online'
        WHEN created_at IS NOT NULL THEN 'created'
        ELSE 'requested'
    END
$$;

CREATE TABLE runners (
    id                              bigserial PRIMARY KEY,
    -- Deterministic instance name `ry-<pool>-<10 hex>`.
    name                            text NOT NULL UNIQUE,
    -- The runner ref (from the event with the lowest id, they all carry it).
    pool                            text NOT NULL,
    pool_id                         text,
    provider                        text,
    forge                           text,
    instance                        text,
    -- requested | created | online | assigned | failed | deleted.
    state                           text NOT NULL GENERATED ALWAYS AS (
        runner_state(deleted_at, failed_attempt, created_attempt, assigned_at, online_at, created_at)
    ) STORED,
    -- Why the runner is in its state: the request reason (queued_job |
    -- min_idle), the online source, the failure or the deletion reason;
    -- NULL for created and assigned.
    reason                          text GENERATED ALWAYS AS (
        CASE runner_state(deleted_at, failed_attempt, created_attempt, assigned_at, online_at, created_at)
            WHEN 'requested' THEN request_reason
            WHEN 'online' THEN online_source
            WHEN 'failed' THEN failed_reason
            WHEN 'deleted' THEN deleted_reason
        END
    ) STORED,
    -- Create attempts known to have been made (succeeded or failed).
    attempts                        integer NOT NULL GENERATED ALWAYS AS (
        COALESCE(GREATEST(created_attempt, failed_attempt), 0)
    ) STORED,
    -- The job: the one it was assigned, else the one it was requested for,
    -- else the one its failure names (see job_source).
    job_forge                       text,
    job_instance                    text,
    job_id                          bigint,
    -- From RunnerRequested.
    run_attempt                     integer,
    claim_key                       text,
    request_reason                  text,
    flavor                          text,
    memory_bytes                    bigint,
    cpus                            integer,
    recommended_memory_limit_bytes  bigint,
    allocator_unavailable           boolean,
    workload_key                    text,
    labels                          jsonb,
    image                           text,
    -- From RunnerCreated.
    provider_id                     text,
    forge_runner_id                 bigint,
    provider_status                 text,
    created_attempt                 integer,
    -- From RunnerOnline.
    online_source                   text,
    -- From the RunnerFailed of the latest failed attempt.
    failed_reason                   text,
    last_error                      text,
    failed_attempt                  integer,
    given_up                        boolean,
    -- From RunnerDeleted.
    deleted_reason                  text,
    -- When each step happened (the event's occurred_at).
    requested_at                    timestamptz,
    created_at                      timestamptz,
    online_at                       timestamptz,
    assigned_at                     timestamptz,
    failed_at                       timestamptz,
    deleted_at                      timestamptz,
    -- When runyard first received anything about it; the latest event time.
    first_seen_at                   timestamptz NOT NULL,
    last_event_at                   timestamptz NOT NULL,
    -- Bookkeeping of the merge: which event each group came from, and where
    -- the job came from (3 assigned, 2 requested, 1 failed).
    ref_event                       text NOT NULL,
    job_source                      smallint,
    requested_event                 text,
    created_event                   text,
    online_event                    text,
    assigned_event                  text,
    failed_event                    text,
    deleted_event                   text,
    CHECK (job_source IS NULL OR job_id IS NOT NULL)
);
-- The scaler's and the CLI's view: runners of a pool by state.
CREATE INDEX runners_pool_state_idx ON runners (pool, state);
