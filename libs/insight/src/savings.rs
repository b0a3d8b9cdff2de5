//! What runyard did for a site over a window, per project and in total,
//! from the projection. Every figure comes with how it was computed
//! ([`HOW`]), so it can be checked by hand; `runyard savings`, the
//! console's savings page and its Prometheus series all read [`savings`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use sqlx::Row as _;

use crate::InsightError;

/// What to sum up.
#[derive(Debug, Clone, Default)]
pub struct SavingsQuery {
    /// The window, back from now.
    pub window: Duration,
    /// The memory every job had before runyard sized it (bytes): the
    /// baseline of the reserved memory; `None`: no baseline.
    pub before_memory: Option<u64>,
    /// The same per project (the project's full path), over
    /// [`SavingsQuery::before_memory`].
    pub before_memory_by_project: BTreeMap<String, u64>,
    /// The operator's OOM target the first-attempt OOM rate is compared
    /// with.
    pub target_oom: f64,
}

/// How each figure is computed, as every output states it.
pub const HOW: [(&str, &str); 10] = [
    (
        "reserved_gb_hours",
        "Σ over the usage reports in the window (by reported_at; a report's project, else its job's) of memory_limit_bytes × wall_seconds (GB = 10^9 bytes)",
    ),
    (
        "used_gb_hours",
        "Σ of peak_memory_bytes × wall_seconds: the peak held for the whole run, an upper bound of use",
    ),
    (
        "before_gb_hours",
        "Σ of the memory jobs had before runyard (the project's configured size, else the site's) × wall_seconds: the same runs at the static size they had before",
    ),
    (
        "first_attempt_oom_rate",
        "OOM-killed first attempts / first attempts: reports of attempt 1 whose job is not in a pipeline runyard made as a retry",
    ),
    (
        "retries",
        "retries runyard issued (RetryIssued) in the window; succeeded: those with a new job that completed with success",
    ),
    (
        "runner_minutes",
        "Σ over runners created in the window of (deleted_at, else now) − created_at; a runner counts for its job's project, one never handed a known project's job in the total only",
    ),
    (
        "idle_runner_minutes",
        "runner minutes without a job: created → assigned, and after the job completed → deleted; a runner never assigned is idle throughout",
    ),
    (
        "queue_wait_p50_seconds",
        "median over jobs started in the window of started_at − (queued_at, else created_at)",
    ),
    ("queue_wait_p95_seconds", "the same, 95th percentile"),
    (
        "target_oom",
        "RUNYARD_ALLOCATOR_TARGET_OOM: the share of first attempts the allocator may let be OOM-killed",
    ),
];

/// One project's (or the total's) figures, rounded to 3 decimals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    /// The project (empty: reports and jobs without one); absent for the
    /// total.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Usage reports in the window.
    pub reports: i64,
    /// GB·h reserved (limits).
    pub reserved_gb_hours: f64,
    /// GB·h used (peaks).
    pub used_gb_hours: f64,
    /// GB·h at the size jobs had before runyard, when configured.
    pub before_gb_hours: Option<f64>,
    /// First attempts reported.
    pub first_attempts: i64,
    /// Of them, OOM-killed.
    pub first_attempts_oom_killed: i64,
    /// Their share; `None` without first attempts.
    pub first_attempt_oom_rate: Option<f64>,
    /// The OOM target it is compared with.
    pub target_oom: f64,
    /// Retries issued.
    pub retries: i64,
    /// Of them, with a new job that succeeded.
    pub retries_succeeded: i64,
    /// Runners created in the window.
    pub runners: i64,
    /// Their minutes.
    pub runner_minutes: f64,
    /// Of them, without a job.
    pub idle_runner_minutes: f64,
    /// Queue wait of jobs started in the window, median.
    pub queue_wait_p50_seconds: Option<f64>,
    /// The same, 95th percentile.
    pub queue_wait_p95_seconds: Option<f64>,
}

/// The runners' total, as `runyard savings` has always shown it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Runners {
    /// Runners created in the window.
    pub runners: i64,
    /// Their minutes.
    pub runner_minutes: f64,
    /// Of them, without a job.
    pub idle_runner_minutes: f64,
}

/// The whole answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Savings {
    /// The window, in seconds.
    pub window_seconds: u64,
    /// Every project together.
    pub total: Figures,
    /// Each project, by name.
    pub projects: Vec<Figures>,
    /// The runners' total.
    pub runners: Runners,
    /// How each figure is computed.
    pub how: BTreeMap<&'static str, &'static str>,
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

const MEMORY: &str = "
    SELECT COALESCE(u.of_project, '') AS project,
           grouping(COALESCE(u.of_project, '')) = 1 AS total,
           count(*) AS reports,
           COALESCE(sum(u.wall_seconds * u.memory_limit_bytes), 0)::float8 / 3.6e12 AS reserved,
           COALESCE(sum(u.wall_seconds * u.peak_memory_bytes), 0)::float8 / 3.6e12 AS used,
           -- Only when every report has a size from before: a partial
           -- sum would read as a saving.
           CASE WHEN count(u.before) = count(*)
                THEN sum(u.wall_seconds * u.before)::float8 / 3.6e12 END AS before,
           count(*) FILTER (WHERE u.attempt = 1 AND NOT retried) AS first,
           count(*) FILTER (WHERE u.attempt = 1 AND NOT retried AND u.oom_killed) AS first_killed
    FROM (
        SELECT s.*, COALESCE(s.project, j.project) AS of_project,
               COALESCE(($2::jsonb ->> COALESCE(s.project, j.project, ''))::float8, $3::float8) AS before,
               EXISTS (
            SELECT 1 FROM retries r
            WHERE r.kind = 'issued' AND r.forge = s.forge AND r.instance = s.instance
              AND r.new_pipeline_id IS NOT NULL AND r.new_pipeline_id = j.pipeline_id
        ) AS retried
        FROM usage_samples s
        LEFT JOIN jobs j USING (forge, instance, job_id)
        WHERE s.reported_at >= now() - make_interval(secs => $1)
    ) u
    GROUP BY GROUPING SETS ((COALESCE(u.of_project, '')), ())";

const RETRIES: &str = "
    SELECT COALESCE(r.project, '') AS project,
           grouping(COALESCE(r.project, '')) = 1 AS total,
           count(*) AS retries,
           -- Two lookups, each by an index (a job's key; a pipeline's
           -- jobs), rather than one whose OR reads every job per retry.
           count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM jobs j
               WHERE j.forge = r.forge AND j.instance = r.instance AND j.conclusion = 'success'
                 AND j.job_id IN (SELECT (x #>> '{}')::bigint
                                  FROM jsonb_array_elements(COALESCE(r.new_job_ids, '[]'::jsonb)) x)
           ) OR (r.new_pipeline_id IS NOT NULL AND EXISTS (
               SELECT 1 FROM jobs j
               WHERE j.forge = r.forge AND j.instance = r.instance AND j.conclusion = 'success'
                 AND j.pipeline_id = r.new_pipeline_id
           ))) AS ok
    FROM retries r
    WHERE r.kind = 'issued' AND r.occurred_at >= now() - make_interval(secs => $1)
    GROUP BY GROUPING SETS ((COALESCE(r.project, '')), ())";

const WAITS: &str = "
    SELECT COALESCE(project, '') AS project,
           grouping(COALESCE(project, '')) = 1 AS total,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY w) AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY w) AS p95
    FROM (
        SELECT project, extract(epoch FROM started_at - COALESCE(queued_at, created_at))::float8 AS w
        FROM jobs
        WHERE started_at >= now() - make_interval(secs => $1)
          AND COALESCE(queued_at, created_at) IS NOT NULL
    ) q
    GROUP BY GROUPING SETS ((COALESCE(project, '')), ())";

const RUNNERS: &str = "
    SELECT COALESCE(j.project, '') AS project,
           grouping(COALESCE(j.project, '')) = 1 AS total,
           count(*) AS runners,
           COALESCE(sum(extract(epoch FROM COALESCE(r.deleted_at, now()) - r.created_at)), 0)::float8 / 60 AS paid,
           COALESCE(sum(extract(epoch FROM
               LEAST(COALESCE(j.completed_at, r.deleted_at, now()), COALESCE(r.deleted_at, now()))
               - r.assigned_at)) FILTER (WHERE r.assigned_at IS NOT NULL), 0)::float8 / 60 AS busy
    FROM runners r
    LEFT JOIN jobs j ON j.forge = r.job_forge AND j.instance = r.job_instance AND j.job_id = r.job_id
    WHERE r.created_at IS NOT NULL AND r.created_at >= now() - make_interval(secs => $1)
    GROUP BY GROUPING SETS ((COALESCE(j.project, '')), ())";

/// Sums up `q` over the projection.
pub async fn savings(db: &sqlx::PgPool, q: &SavingsQuery) -> Result<Savings, InsightError> {
    let secs = q.window.as_secs_f64();
    let mut by: BTreeMap<Option<String>, Figures> = BTreeMap::new();
    // Each query's grand total (the grouping set `()`) says so in `total`.
    let key = |r: &sqlx::postgres::PgRow| -> Option<String> {
        let total = r.try_get::<bool, _>("total").unwrap_or_default();
        (!total).then(|| r.try_get::<String, _>("project").unwrap_or_default())
    };
    let before: serde_json::Map<String, serde_json::Value> = q
        .before_memory_by_project
        .iter()
        .map(|(p, b)| (p.clone(), serde_json::json!(b)))
        .collect();
    // The four sums are independent: asked at once, each on a connection
    // of its own, when the pool has more than one (else one after the
    // other, so none waits for the connection longer than the others take).
    // A sum that takes only the window, read from `table`.
    let over_window = |sql: &'static str, table: &'static str| async move {
        sqlx::query(sql)
            .bind(secs)
            .fetch_all(db)
            .await
            .map_err(InsightError::on(table))
    };
    let (memory, retries, waits, runners) = (
        async {
            sqlx::query(MEMORY)
                .bind(secs)
                .bind(serde_json::Value::Object(before))
                .bind(q.before_memory.map(|b| b as f64))
                .fetch_all(db)
                .await
                .map_err(InsightError::on("usage_samples"))
        },
        over_window(RETRIES, "retries"),
        over_window(WAITS, "jobs"),
        over_window(RUNNERS, "runners"),
    );
    let (memory, retries, waits, runners) = if db.options().get_max_connections() > 1 {
        futures::try_join!(memory, retries, waits, runners)?
    } else {
        (memory.await?, retries.await?, waits.await?, runners.await?)
    };
    for r in &memory {
        let f = by.entry(key(r)).or_default();
        f.reports = r.try_get("reports").unwrap_or_default();
        f.reserved_gb_hours = round(r.try_get("reserved").unwrap_or_default());
        f.used_gb_hours = round(r.try_get("used").unwrap_or_default());
        f.before_gb_hours = r
            .try_get::<Option<f64>, _>("before")
            .ok()
            .flatten()
            .map(round);
        f.first_attempts = r.try_get("first").unwrap_or_default();
        f.first_attempts_oom_killed = r.try_get("first_killed").unwrap_or_default();
    }
    for r in &retries {
        let f = by.entry(key(r)).or_default();
        f.retries = r.try_get("retries").unwrap_or_default();
        f.retries_succeeded = r.try_get("ok").unwrap_or_default();
    }
    for r in &waits {
        let f = by.entry(key(r)).or_default();
        f.queue_wait_p50_seconds = r.try_get::<Option<f64>, _>("p50").ok().flatten().map(round);
        f.queue_wait_p95_seconds = r.try_get::<Option<f64>, _>("p95").ok().flatten().map(round);
    }
    for r in &runners {
        // Runners no project's job ran on (kept idle, never handed a job
        // of a known project) count in the total only.
        let k = key(r);
        if k.as_deref() == Some("") && !by.contains_key(&k) {
            continue;
        }
        let f = by.entry(k).or_default();
        let paid: f64 = r.try_get("paid").unwrap_or_default();
        let busy: f64 = r.try_get("busy").unwrap_or_default();
        f.runners = r.try_get("runners").unwrap_or_default();
        f.runner_minutes = round(paid);
        f.idle_runner_minutes = round((paid - busy).max(0.0));
    }
    for f in by.values_mut() {
        f.target_oom = q.target_oom;
        f.first_attempt_oom_rate = (f.first_attempts > 0)
            .then(|| round(f.first_attempts_oom_killed as f64 / f.first_attempts as f64));
    }
    let total = by.remove(&None).unwrap_or_else(|| Figures {
        target_oom: q.target_oom,
        ..Figures::default()
    });
    let projects = by
        .into_iter()
        .map(|(k, mut f)| {
            f.project = Some(k.unwrap_or_default());
            f
        })
        .collect();
    Ok(Savings {
        window_seconds: q.window.as_secs(),
        runners: Runners {
            runners: total.runners,
            runner_minutes: total.runner_minutes,
            idle_runner_minutes: total.idle_runner_minutes,
        },
        total,
        projects,
        how: HOW.into_iter().collect(),
    })
}
