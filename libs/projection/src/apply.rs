//! Applying a batch of events to Postgres in one transaction: record the
//! event ids (skipping those already applied), then upsert the merged rows
//! with the same merge rules as [`crate::projection`] (retry rows are only
//! inserted, one per event).

use std::sync::LazyLock;

use runyard_events::Event;
use sqlx::{PgPool, Postgres, Transaction};

use crate::projection::{Delta, JobRow, PipelineRow, RetryRow, RunnerRow, Unprojectable, UsageRow};

/// One event to apply, with the stream sequence it came from.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// Stream sequence.
    pub seq: u64,
    /// The decoded event.
    pub event: Event,
    /// Its message's `traceparent` header, if any.
    pub traceparent: Option<String>,
}

/// What [`apply_batch`] reads of one event: [`Incoming`], or anything else
/// holding a decoded event and its sequence (the consumer's deliveries),
/// so the event need not be copied into an [`Incoming`].
pub trait ToApply {
    /// Stream sequence.
    fn seq(&self) -> u64;
    /// The decoded event.
    fn event(&self) -> &Event;
    /// Its message's `traceparent` header, if any.
    fn traceparent(&self) -> Option<&str>;
}

impl ToApply for Incoming {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn event(&self) -> &Event {
        &self.event
    }
    fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
}

/// The consumer's deliveries are applied as they are, events not copied.
impl ToApply for runyard_bus::consumer::Delivery {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn event(&self) -> &Event {
        &self.event
    }
    fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
}

/// What applying a batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Events applied for the first time.
    pub new: usize,
    /// Events skipped because they were applied before.
    pub duplicates: usize,
    /// Events that cannot be projected: `(stream seq, reason)`.
    pub rejected: Vec<(u64, String)>,
}

/// Applies `batch` in one transaction. Events whose ids were applied before
/// (by this or another replica, or earlier in the batch) have no effect.
/// Events that cannot be projected are returned in [`Applied::rejected`]
/// for dead-lettering and are *not* recorded as applied: until their dead
/// letter is stored their message is not acked, and its next delivery must
/// be rejected (and dead-lettered) again rather than taken for a duplicate.
pub async fn apply_batch(
    pool: &PgPool,
    batch: &[impl ToApply + Sync],
) -> Result<Applied, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let applied = apply_in(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(applied)
}

/// [`apply_batch`] inside a caller's transaction.
pub async fn apply_in(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[impl ToApply + Sync],
) -> Result<Applied, sqlx::Error> {
    // Deduplicate within the batch first (redelivery can put one event in a
    // batch twice); the lowest sequence is recorded.
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<_> = batch
        .iter()
        .filter(|i| seen.insert(i.event().id.as_str()))
        .collect();
    let ids: Vec<String> = unique.iter().map(|i| i.event().id.clone()).collect();
    let seqs: Vec<i64> = unique
        .iter()
        .map(|i| i64::try_from(i.seq()).unwrap_or(i64::MAX))
        .collect();
    let fresh: Vec<String> = sqlx::query_scalar(
        "INSERT INTO applied_events (event_id, stream_seq)
         SELECT * FROM unnest($1::text[], $2::int8[])
         ON CONFLICT DO NOTHING RETURNING event_id",
    )
    .bind(&ids)
    .bind(&seqs)
    .fetch_all(&mut **tx)
    .await?;
    let fresh: std::collections::HashSet<String> = fresh.into_iter().collect();

    let mut delta = Delta::default();
    let mut applied = Applied {
        duplicates: batch.len() - fresh.len(),
        ..Applied::default()
    };
    let mut rejected_ids = Vec::new();
    let mut story = Vec::new();
    for i in unique.iter().filter(|i| fresh.contains(&i.event().id)) {
        match delta.add(i.event()) {
            Ok(()) => {
                applied.new += 1;
                let trace = i
                    .traceparent()
                    .and_then(runyard_bus::TraceParent::parse)
                    .map(|t| t.trace_id);
                story.extend(crate::story::rows(i.event(), i.seq(), trace));
            }
            Err(Unprojectable(reason)) => {
                applied.rejected.push((i.seq(), reason));
                rejected_ids.push(i.event().id.as_str());
            }
        }
    }
    if !rejected_ids.is_empty() {
        // Recorded above with the rest; rare enough to take back here
        // rather than projecting twice.
        sqlx::query("DELETE FROM applied_events WHERE event_id = ANY($1)")
            .bind(&rejected_ids)
            .execute(&mut **tx)
            .await?;
    }
    upsert_jobs(tx, &delta).await?;
    upsert_pipelines(tx, &delta).await?;
    insert_usage(tx, &delta).await?;
    rekey_github_usage(tx, &delta).await?;
    upsert_runners(tx, &delta).await?;
    insert_retries(tx, &delta).await?;
    insert_story(tx, &story).await?;
    Ok(applied)
}

/// Inserts the batch's `job_events` rows (only ever inserted: each event
/// is applied once).
async fn insert_story(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[crate::story::StoryRow],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&crate::story::StoryRow) -> Option<String>| -> Vec<Option<String>> {
        rows.iter().map(f).collect()
    };
    sqlx::query(
        "INSERT INTO job_events (event_id, stream_seq, type, occurred_at, forge, instance,
                                 job_id, runner, pipeline_id, trace_id, detail)
         SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::timestamptz[],
                              $5::text[], $6::text[], $7::int8[], $8::text[], $9::int8[],
                              $10::text[], $11::jsonb[])",
    )
    .bind(rows.iter().map(|r| r.event_id.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.stream_seq).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.kind).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.occurred_at).collect::<Vec<_>>())
    .bind(col(|r| r.forge.as_ref().map(|f| f.0.clone())))
    .bind(col(|r| r.forge.as_ref().map(|f| f.1.clone())))
    .bind(rows.iter().map(|r| r.job_id).collect::<Vec<_>>())
    .bind(col(|r| r.runner.clone()))
    .bind(rows.iter().map(|r| r.pipeline_id).collect::<Vec<_>>())
    .bind(col(|r| r.trace_id.clone()))
    .bind(rows.iter().map(|r| r.detail.clone()).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Builds `col = CASE WHEN <excluded ranks higher> THEN COALESCE(EXCLUDED.col,
/// t.col) ELSE COALESCE(t.col, EXCLUDED.col) END` for descriptive columns.
fn pick(table: &str, cols: &[&str]) -> String {
    let newer = format!(
        "(EXCLUDED.rank_status, EXCLUDED.rank_at, EXCLUDED.rank_event COLLATE \"C\") > \
         ({table}.rank_status, {table}.rank_at, {table}.rank_event COLLATE \"C\")"
    );
    cols.iter()
        .map(|c| {
            format!(
                "{c} = CASE WHEN {newer} THEN COALESCE(EXCLUDED.{c}, {table}.{c}) \
                 ELSE COALESCE({table}.{c}, EXCLUDED.{c}) END"
            )
        })
        .chain(
            ["rank_status", "rank_at", "rank_event"]
                .iter()
                .map(|c| format!("{c} = CASE WHEN {newer} THEN EXCLUDED.{c} ELSE {table}.{c} END")),
        )
        .collect::<Vec<_>>()
        .join(",\n")
}

/// The job columns that come from the highest-ranked observation (the rest
/// are keys, earliest/latest times and the rank).
pub const JOB_PICKED: &[&str] = &[
    "status",
    "project",
    "project_id",
    "pipeline_id",
    "run_attempt",
    "name",
    "stage",
    "workflow_name",
    "labels",
    "forge_status",
    "conclusion",
    "failure_reason",
    "runner_id",
    "runner_name",
    "runner_group_id",
    "runner_group_name",
    "ref",
    "sha",
    "tag",
    "html_url",
    "organization",
    "enterprise",
    "allow_failure",
    "duration_seconds",
    "queued_duration_seconds",
];

static UPSERT_JOBS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO jobs (forge, instance, job_id, status, project, project_id, pipeline_id,
            run_attempt, name, stage, workflow_name, labels, forge_status, conclusion,
            failure_reason, runner_id, runner_name, runner_group_id, runner_group_name, ref, sha,
            tag, html_url, organization, enterprise, allow_failure, duration_seconds,
            queued_duration_seconds, created_at, queued_at, started_at, completed_at,
            first_seen_at, last_event_at, rank_status, rank_at, rank_event)
         SELECT forge, instance, job_id, status, project, project_id, pipeline_id,
            run_attempt, name, stage, workflow_name, labels::jsonb, forge_status, conclusion,
            failure_reason, runner_id, runner_name, runner_group_id, runner_group_name, ref, sha,
            tag, html_url, organization, enterprise, allow_failure, duration_seconds,
            queued_duration_seconds, created_at, queued_at, started_at, completed_at,
            first_seen_at, last_event_at, rank_status, rank_at, rank_event
         FROM unnest($1::text[], $2::text[], $3::int8[], $4::int2[], $5::text[], $6::int8[],
            $7::int8[], $8::int4[], $9::text[], $10::text[], $11::text[], $12::text[],
            $13::text[], $14::text[], $15::text[], $16::int8[], $17::text[], $18::int8[],
            $19::text[], $20::text[], $21::text[], $22::bool[], $23::text[], $24::text[],
            $25::text[], $26::bool[], $27::float8[], $28::float8[], $29::timestamptz[],
            $30::timestamptz[], $31::timestamptz[], $32::timestamptz[], $33::timestamptz[],
            $34::timestamptz[], $35::int2[], $36::timestamptz[], $37::text[])
            AS t(forge, instance, job_id, status, project, project_id, pipeline_id,
            run_attempt, name, stage, workflow_name, labels, forge_status, conclusion,
            failure_reason, runner_id, runner_name, runner_group_id, runner_group_name, ref, sha,
            tag, html_url, organization, enterprise, allow_failure, duration_seconds,
            queued_duration_seconds, created_at, queued_at, started_at, completed_at,
            first_seen_at, last_event_at, rank_status, rank_at, rank_event)
         ON CONFLICT (forge, instance, job_id) DO UPDATE SET
            created_at = LEAST(jobs.created_at, EXCLUDED.created_at),
            queued_at = LEAST(jobs.queued_at, EXCLUDED.queued_at),
            started_at = LEAST(jobs.started_at, EXCLUDED.started_at),
            completed_at = LEAST(jobs.completed_at, EXCLUDED.completed_at),
            first_seen_at = LEAST(jobs.first_seen_at, EXCLUDED.first_seen_at),
            last_event_at = GREATEST(jobs.last_event_at, EXCLUDED.last_event_at),
            {}",
        pick("jobs", JOB_PICKED)
    )
});

/// Sorted by key so concurrent replicas lock rows in the same order (no
/// deadlocks between them).
fn sorted<R>(map: &std::collections::HashMap<crate::projection::Key, R>) -> Vec<&R> {
    let mut keys: Vec<_> = map.keys().collect();
    keys.sort();
    keys.into_iter().filter_map(|k| map.get(k)).collect()
}

macro_rules! column {
    ($rows:expr, $f:ident) => {
        $rows.iter().map(|r| r.$f.clone()).collect::<Vec<_>>()
    };
}

async fn upsert_jobs(tx: &mut Transaction<'_, Postgres>, delta: &Delta) -> Result<(), sqlx::Error> {
    if delta.jobs.is_empty() {
        return Ok(());
    }
    let rows: Vec<&JobRow> = sorted(&delta.jobs);
    let labels: Vec<Option<String>> = rows
        .iter()
        .map(|r| r.labels.as_ref().map(ToString::to_string))
        .collect();
    sqlx::query(&UPSERT_JOBS)
        .bind(column!(rows, forge))
        .bind(column!(rows, instance))
        .bind(column!(rows, job_id))
        .bind(column!(rows, status))
        .bind(column!(rows, project))
        .bind(column!(rows, project_id))
        .bind(column!(rows, pipeline_id))
        .bind(column!(rows, run_attempt))
        .bind(column!(rows, name))
        .bind(column!(rows, stage))
        .bind(column!(rows, workflow_name))
        .bind(labels)
        .bind(column!(rows, forge_status))
        .bind(column!(rows, conclusion))
        .bind(column!(rows, failure_reason))
        .bind(column!(rows, runner_id))
        .bind(column!(rows, runner_name))
        .bind(column!(rows, runner_group_id))
        .bind(column!(rows, runner_group_name))
        .bind(column!(rows, r#ref))
        .bind(column!(rows, sha))
        .bind(column!(rows, tag))
        .bind(column!(rows, html_url))
        .bind(column!(rows, organization))
        .bind(column!(rows, enterprise))
        .bind(column!(rows, allow_failure))
        .bind(column!(rows, duration_seconds))
        .bind(column!(rows, queued_duration_seconds))
        .bind(column!(rows, created_at))
        .bind(column!(rows, queued_at))
        .bind(column!(rows, started_at))
        .bind(column!(rows, completed_at))
        .bind(column!(rows, first_seen_at))
        .bind(column!(rows, last_event_at))
        .bind(column!(rows, rank_status))
        .bind(column!(rows, rank_at))
        .bind(column!(rows, rank_event))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

const PIPELINE_PICKED: &[&str] = &[
    "project_id",
    "project",
    "ref",
    "sha",
    "tag",
    "status",
    "pipeline_source",
    "web_url",
    "duration_seconds",
    "queued_duration_seconds",
    "finished_at",
];

static UPSERT_PIPELINES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO pipelines (forge, instance, pipeline_id, project_id, project, ref, sha, tag,
            status, pipeline_source, web_url, duration_seconds, queued_duration_seconds,
            created_at, finished_at, first_seen_at, last_event_at, rank_status, rank_at,
            rank_event)
         SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[],
            $6::text[], $7::text[], $8::bool[], $9::text[], $10::text[], $11::text[],
            $12::float8[], $13::float8[], $14::timestamptz[], $15::timestamptz[],
            $16::timestamptz[], $17::timestamptz[], $18::int2[], $19::timestamptz[], $20::text[])
         ON CONFLICT (forge, instance, pipeline_id) DO UPDATE SET
            created_at = LEAST(pipelines.created_at, EXCLUDED.created_at),
            first_seen_at = LEAST(pipelines.first_seen_at, EXCLUDED.first_seen_at),
            last_event_at = GREATEST(pipelines.last_event_at, EXCLUDED.last_event_at),
            {}",
        pick("pipelines", PIPELINE_PICKED)
    )
});

async fn upsert_pipelines(
    tx: &mut Transaction<'_, Postgres>,
    delta: &Delta,
) -> Result<(), sqlx::Error> {
    if delta.pipelines.is_empty() {
        return Ok(());
    }
    let rows: Vec<&PipelineRow> = sorted(&delta.pipelines);
    sqlx::query(&UPSERT_PIPELINES)
        .bind(column!(rows, forge))
        .bind(column!(rows, instance))
        .bind(column!(rows, pipeline_id))
        .bind(column!(rows, project_id))
        .bind(column!(rows, project))
        .bind(column!(rows, r#ref))
        .bind(column!(rows, sha))
        .bind(column!(rows, tag))
        .bind(column!(rows, status))
        .bind(column!(rows, pipeline_source))
        .bind(column!(rows, web_url))
        .bind(column!(rows, duration_seconds))
        .bind(column!(rows, queued_duration_seconds))
        .bind(column!(rows, created_at))
        .bind(column!(rows, finished_at))
        .bind(column!(rows, first_seen_at))
        .bind(column!(rows, last_event_at))
        .bind(column!(rows, rank_status))
        .bind(column!(rows, rank_at))
        .bind(column!(rows, rank_event))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn insert_usage(
    tx: &mut Transaction<'_, Postgres>,
    delta: &Delta,
) -> Result<(), sqlx::Error> {
    if delta.usage.is_empty() {
        return Ok(());
    }
    let mut keys: Vec<_> = delta.usage.keys().collect();
    keys.sort();
    let rows: Vec<&UsageRow> = keys
        .into_iter()
        .filter_map(|k| delta.usage.get(k))
        .collect();
    sqlx::query(
        "INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, ref, project,
            workload, workload_key, peak_memory_bytes, memory_request_bytes, memory_limit_bytes,
            cpu_seconds, wall_seconds, cpu_request_millicores, oom_killed, exit_code, reported_at,
            cgroup)
         SELECT forge, instance, job_id, attempt, event_id, ref, project, workload::jsonb,
            workload_key, peak, req, lim, cpu, wall, cpureq, oom, exit, at, cgroup
         FROM unnest($1::text[], $2::text[], $3::int8[], $4::int4[], $5::text[], $6::text[],
            $7::text[], $8::text[], $9::text[], $10::int8[], $11::int8[], $12::int8[],
            $13::float8[], $14::float8[], $15::int8[], $16::bool[], $17::int4[],
            $18::timestamptz[], $19::text[])
            AS t(forge, instance, job_id, attempt, event_id, ref, project, workload,
            workload_key, peak, req, lim, cpu, wall, cpureq, oom, exit, at, cgroup)
         ON CONFLICT (forge, instance, job_id, attempt) DO NOTHING",
    )
    .bind(column!(rows, forge))
    .bind(column!(rows, instance))
    .bind(column!(rows, job_id))
    .bind(column!(rows, attempt))
    .bind(column!(rows, event_id))
    .bind(column!(rows, r#ref))
    .bind(column!(rows, project))
    .bind(
        rows.iter()
            .map(|r| r.workload.to_string())
            .collect::<Vec<_>>(),
    )
    .bind(column!(rows, workload_key))
    .bind(column!(rows, peak_memory_bytes))
    .bind(column!(rows, memory_request_bytes))
    .bind(column!(rows, memory_limit_bytes))
    .bind(column!(rows, cpu_seconds))
    .bind(column!(rows, wall_seconds))
    .bind(column!(rows, cpu_request_millicores))
    .bind(column!(rows, oom_killed))
    .bind(column!(rows, exit_code))
    .bind(column!(rows, reported_at))
    .bind(column!(rows, cgroup))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A GitHub usage sample (id, workload key) and its job's project,
/// workflow and name.
type SampleAndJob = (i64, String, String, String, String);

/// Keys GitHub usage samples from their job's row (ARCHITECTURE: "the
/// job-tracker keys a GitHub usage sample from its projected job row"): the
/// workload becomes `{repo, workflow, job}` of the signed webhook, whatever
/// the report sent. The sample keeps the ref it was reported with (a
/// verified identity token's, or the sender's word): whether it trains is
/// decided where the job row's ref is compared with it (the allocator), so
/// a report whose ref the webhook does not confirm never trains. Runs for
/// every GitHub job or sample in the batch, so the order the job and the
/// report arrive in does not matter.
async fn rekey_github_usage(
    tx: &mut Transaction<'_, Postgres>,
    delta: &Delta,
) -> Result<(), sqlx::Error> {
    let github = |k: &crate::projection::Key| k.0 == "github";
    let mut pairs: Vec<(&str, i64)> = delta
        .jobs
        .keys()
        .filter(|k| github(k))
        .chain(delta.usage.keys().map(|(k, _)| k).filter(|k| github(k)))
        .map(|(_, instance, job_id)| (instance.as_str(), *job_id))
        .collect();
    if pairs.is_empty() {
        return Ok(());
    }
    pairs.sort_unstable();
    pairs.dedup();
    let (instances, job_ids): (Vec<&str>, Vec<i64>) = pairs.into_iter().unzip();
    let rows: Vec<SampleAndJob> = sqlx::query_as(
        "SELECT u.id, u.workload_key, j.project, COALESCE(j.workflow_name, ''), j.name
             FROM usage_samples u
             JOIN jobs j ON j.forge = u.forge AND j.instance = u.instance AND j.job_id = u.job_id
             WHERE u.forge = 'github'
               AND (u.instance, u.job_id) IN (SELECT * FROM unnest($1::text[], $2::int8[]))
               AND j.project IS NOT NULL AND j.name IS NOT NULL",
    )
    // Planned for each batch, never from a cached plan: a plan made while
    // the tables were nearly empty (a fresh database, a rebuild's first
    // seconds) scans every job per batch once they have grown.
    .persistent(false)
    .bind(&instances)
    .bind(&job_ids)
    .fetch_all(&mut **tx)
    .await?;
    let mut ids = Vec::new();
    let mut workloads = Vec::new();
    let mut keys = Vec::new();
    for (id, old_key, repo, workflow, name) in rows {
        let attributes = runyard_store::workload::github(&repo, &workflow, &name);
        let key =
            runyard_store::workload::key(attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if key == old_key {
            continue;
        }
        ids.push(id);
        workloads.push(serde_json::json!(attributes).to_string());
        keys.push(key);
    }
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE usage_samples u SET workload = t.workload::jsonb, workload_key = t.key
         FROM unnest($1::int8[], $2::text[], $3::text[]) AS t(id, workload, key)
         WHERE u.id = t.id",
    )
    // As above: a plan cached while `usage_samples` was small would scan it.
    .persistent(false)
    .bind(&ids)
    .bind(&workloads)
    .bind(&keys)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Declares the columns of a table written from rows of type `$row` (the
/// rest are generated) as `$columns`, with the array type each is bound as,
/// and `$bind`, which binds them in that same order. A raw field name
/// (`r#ref`) stands for the column without `r#`, see [`column_name`].
macro_rules! table_columns {
    ($columns:ident, $bind:ident, $row:ty; $($f:ident: $ty:literal),* $(,)?) => {
        const $columns: &[(&str, &str)] = &[$((stringify!($f), $ty)),*];

        fn $bind<'q>(
            query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
            rows: &[&$row],
        ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
            query$(.bind(column!(rows, $f)))*
        }
    };
}

/// The column a [`table_columns!`] field is written to.
fn column_name(field: &str) -> &str {
    field.strip_prefix("r#").unwrap_or(field)
}

/// `INSERT INTO <table> (<columns>) SELECT * FROM unnest(<one array per
/// column>)`: the head of a batch insert of [`table_columns!`] columns.
fn insert_unnest(table: &str, columns: &[(&str, &str)]) -> String {
    let names: Vec<&str> = columns.iter().map(|(c, _)| column_name(c)).collect();
    let arrays: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, (_, ty))| format!("${}::{ty}[]", i + 1))
        .collect();
    format!(
        "INSERT INTO {table} ({})
         SELECT * FROM unnest({})",
        names.join(", "),
        arrays.join(", "),
    )
}

table_columns! {
    RUNNER_COLUMNS, bind_runners, RunnerRow;
    name: "text",
    pool: "text",
    pool_id: "text",
    provider: "text",
    forge: "text",
    instance: "text",
    job_forge: "text",
    job_instance: "text",
    job_id: "int8",
    run_attempt: "int4",
    claim_key: "text",
    request_reason: "text",
    flavor: "text",
    memory_bytes: "int8",
    cpus: "int4",
    recommended_memory_limit_bytes: "int8",
    allocator_unavailable: "bool",
    workload_key: "text",
    labels: "jsonb",
    image: "text",
    provider_id: "text",
    forge_runner_id: "int8",
    provider_status: "text",
    created_attempt: "int4",
    online_source: "text",
    failed_reason: "text",
    last_error: "text",
    failed_attempt: "int4",
    given_up: "bool",
    deleted_reason: "text",
    requested_at: "timestamptz",
    created_at: "timestamptz",
    online_at: "timestamptz",
    assigned_at: "timestamptz",
    failed_at: "timestamptz",
    deleted_at: "timestamptz",
    first_seen_at: "timestamptz",
    last_event_at: "timestamptz",
    ref_event: "text",
    job_source: "int2",
    requested_event: "text",
    created_event: "text",
    online_event: "text",
    assigned_event: "text",
    failed_event: "text",
    deleted_event: "text",
}

/// Which event a `runners` column group comes from when the stored row and
/// the incoming one both have one.
enum Pick {
    /// The earliest `(<g>_at, <g>_event)` of group `g`.
    Earliest(&'static str),
    /// The latest `(<g>_attempt, <g>_at, <g>_event)` of group `g`.
    LatestAttempt(&'static str),
    /// `EXCLUDED`'s when this holds.
    When(&'static str),
}

/// Column groups of `runners`: each comes whole from one event (`EXCLUDED`
/// is the incoming merged row, `runners` the stored one). The same rules as
/// [`crate::projection::merge_runners`]; text is compared byte-wise
/// (`COLLATE "C"`), as Rust compares strings.
const RUNNER_GROUPS: &[(&[&str], Pick)] = &[
    (
        &[
            "pool",
            "pool_id",
            "provider",
            "forge",
            "instance",
            "ref_event",
        ],
        Pick::When("EXCLUDED.ref_event COLLATE \"C\" < runners.ref_event COLLATE \"C\""),
    ),
    // The job: assigned over requested over failed, then the greatest key.
    (
        &["job_source", "job_forge", "job_instance", "job_id"],
        Pick::When(
            "EXCLUDED.job_source IS NOT NULL AND (runners.job_source IS NULL OR
             (EXCLUDED.job_source, EXCLUDED.job_forge COLLATE \"C\",
              EXCLUDED.job_instance COLLATE \"C\", EXCLUDED.job_id)
             > (runners.job_source, runners.job_forge COLLATE \"C\",
              runners.job_instance COLLATE \"C\", runners.job_id))",
        ),
    ),
    (
        &[
            "requested_at",
            "requested_event",
            "run_attempt",
            "claim_key",
            "request_reason",
            "flavor",
            "memory_bytes",
            "cpus",
            "recommended_memory_limit_bytes",
            "allocator_unavailable",
            "workload_key",
            "labels",
            "image",
        ],
        Pick::Earliest("requested"),
    ),
    // The latest create attempt.
    (
        &[
            "created_at",
            "created_event",
            "provider_id",
            "forge_runner_id",
            "provider_status",
            "created_attempt",
        ],
        Pick::LatestAttempt("created"),
    ),
    (
        &["online_at", "online_event", "online_source"],
        Pick::Earliest("online"),
    ),
    (
        &["assigned_at", "assigned_event"],
        Pick::Earliest("assigned"),
    ),
    // The latest failed attempt.
    (
        &[
            "failed_at",
            "failed_event",
            "failed_reason",
            "last_error",
            "failed_attempt",
            "given_up",
        ],
        Pick::LatestAttempt("failed"),
    ),
    (
        &["deleted_at", "deleted_event", "deleted_reason"],
        Pick::Earliest("deleted"),
    ),
];

static UPSERT_RUNNERS: LazyLock<String> = LazyLock::new(|| {
    let mut set = vec![
        "first_seen_at = LEAST(runners.first_seen_at, EXCLUDED.first_seen_at)".to_owned(),
        "last_event_at = GREATEST(runners.last_event_at, EXCLUDED.last_event_at)".to_owned(),
    ];
    for (cols, pick) in RUNNER_GROUPS {
        let cond = match pick {
            Pick::Earliest(g) => format!(
                "EXCLUDED.{g}_event IS NOT NULL AND (runners.{g}_event IS NULL OR
                 (EXCLUDED.{g}_at, EXCLUDED.{g}_event COLLATE \"C\")
                 < (runners.{g}_at, runners.{g}_event COLLATE \"C\"))"
            ),
            Pick::LatestAttempt(g) => format!(
                "EXCLUDED.{g}_event IS NOT NULL AND (runners.{g}_event IS NULL OR
                 (EXCLUDED.{g}_attempt, EXCLUDED.{g}_at, EXCLUDED.{g}_event COLLATE \"C\")
                 > (runners.{g}_attempt, runners.{g}_at, runners.{g}_event COLLATE \"C\"))"
            ),
            Pick::When(cond) => (*cond).to_owned(),
        };
        set.extend(
            cols.iter()
                .map(|c| format!("{c} = CASE WHEN {cond} THEN EXCLUDED.{c} ELSE runners.{c} END")),
        );
    }
    format!(
        "{}
         ON CONFLICT (name) DO UPDATE SET
            {}",
        insert_unnest("runners", RUNNER_COLUMNS),
        set.join(",\n            "),
    )
});

/// Runner events are rare: batches without any skip this entirely.
async fn upsert_runners(
    tx: &mut Transaction<'_, Postgres>,
    delta: &Delta,
) -> Result<(), sqlx::Error> {
    if delta.runners.is_empty() {
        return Ok(());
    }
    // Sorted by name so concurrent replicas lock rows in the same order.
    let mut names: Vec<&String> = delta.runners.keys().collect();
    names.sort();
    let rows: Vec<&RunnerRow> = names
        .into_iter()
        .filter_map(|n| delta.runners.get(n))
        .collect();
    bind_runners(sqlx::query(&UPSERT_RUNNERS), &rows)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

table_columns! {
    RETRY_COLUMNS, bind_retries, RetryRow;
    event_id: "text",
    kind: "text",
    forge: "text",
    instance: "text",
    unit: "text",
    project_id: "int8",
    project: "text",
    pipeline_id: "int8",
    run_attempt: "int4",
    r#ref: "text",
    sha: "text",
    strategy: "text",
    reason: "text",
    detail: "text",
    forge_status: "int4",
    forge_calls: "int4",
    new_pipeline_id: "int8",
    new_job_ids: "jsonb",
    new_sha: "text",
    new_run_attempt: "int4",
    web_url: "text",
    adopted: "bool",
    errors: "jsonb",
    jobs: "jsonb",
    occurred_at: "timestamptz",
    received_at: "timestamptz",
}

/// A retry row is one event: an id already stored (which the apply-once
/// bookkeeping makes impossible short of a hand-edited database) is left as
/// it is.
static INSERT_RETRIES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}
         ON CONFLICT (event_id) DO NOTHING",
        insert_unnest("retries", RETRY_COLUMNS)
    )
});

/// Retry events are rare: batches without any skip this entirely.
async fn insert_retries(
    tx: &mut Transaction<'_, Postgres>,
    delta: &Delta,
) -> Result<(), sqlx::Error> {
    if delta.retries.is_empty() {
        return Ok(());
    }
    // In event id order (the map's), so concurrent replicas lock in the
    // same order.
    let rows: Vec<&RetryRow> = delta.retries.values().collect();
    bind_retries(sqlx::query(&INSERT_RETRIES), &rows)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_retries_column_is_written() {
        use runyard_store::entities::retry;
        use sea_orm::{IdenStatic as _, Iterable as _};
        let mut table: Vec<String> = retry::Column::iter()
            .map(|c| c.as_str().to_owned())
            .collect();
        table.sort_unstable();
        let mut written: Vec<String> = RETRY_COLUMNS
            .iter()
            .map(|(c, _)| column_name(c).to_owned())
            .collect();
        written.sort_unstable();
        assert_eq!(written, table);
        assert!(INSERT_RETRIES.contains("(event_id, kind, forge, instance, unit, project_id, project, pipeline_id, run_attempt, ref, sha,"));
    }

    #[test]
    fn every_written_runner_column_is_in_exactly_one_group_or_merged_by_time() {
        let mut grouped: Vec<&str> = RUNNER_GROUPS
            .iter()
            .flat_map(|(cols, _)| cols.iter().copied())
            .chain(["first_seen_at", "last_event_at"])
            .collect();
        grouped.sort_unstable();
        let mut written: Vec<&str> = RUNNER_COLUMNS
            .iter()
            .map(|(c, _)| *c)
            .filter(|c| *c != "name")
            .collect();
        written.sort_unstable();
        assert_eq!(grouped, written);
    }
}
