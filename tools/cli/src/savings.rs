//! `runyard savings`: what runyard did for a site over a window, per
//! project and in total, from the projection. Every figure comes with how
//! it was computed (`how`), so it can be checked by hand.

use clap::Args;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::Failure;
use crate::query::connect_db;
use crate::{EXIT_OK, Global, out, out_json, table};

/// `runyard savings`.
#[derive(Args, Debug, Clone)]
pub struct SavingsArgs {
    /// The window, back from now: `30d`, `12h`, `1w`.
    #[arg(long, default_value = "30d", value_parser = crate::events::parse_duration)]
    pub since: std::time::Duration,
    /// The memory every job had before runyard sized it (a static
    /// default, as `16GiB` or `16000000000`): the baseline of the
    /// reserved memory. Without it, no baseline is shown.
    #[arg(long, value_name = "SIZE")]
    pub before_memory: Option<bytesize::ByteSize>,
    /// The operator's OOM target the first-attempt OOM rate is compared
    /// with.
    #[arg(
        long,
        env = "RUNYARD_ALLOCATOR_TARGET_OOM",
        default_value_t = 0.03,
        value_parser = parse_share
    )]
    pub target_oom: f64,
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t > 0.0 && t < 0.5 => Ok(t),
        _ => Err(format!("{s:?}: a share between 0 and 0.5, e.g. 0.03")),
    }
}

/// How each figure is computed, as the output states it.
const HOW: [(&str, &str); 9] = [
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
        "Σ of --before-memory × wall_seconds: the same runs at the static size they had before",
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
        "Σ over runners created in the window of (deleted_at, else now) − created_at",
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
];

/// One project's (or the total's) figures.
#[derive(Debug, Default, Clone)]
struct Figures {
    reports: i64,
    reserved: f64,
    used: f64,
    hours: f64,
    first: i64,
    first_killed: i64,
    retries: i64,
    retries_ok: i64,
    wait_p50: Option<f64>,
    wait_p95: Option<f64>,
}

impl Figures {
    fn json(&self, args: &SavingsArgs) -> Value {
        let rate = (self.first > 0).then(|| self.first_killed as f64 / self.first as f64);
        json!({
            "reports": self.reports,
            "reserved_gb_hours": round(self.reserved),
            "used_gb_hours": round(self.used),
            "before_gb_hours": args
                .before_memory
                .map(|b| round(self.hours * b.as_u64() as f64 / 1e9)),
            "first_attempts": self.first,
            "first_attempts_oom_killed": self.first_killed,
            "first_attempt_oom_rate": rate.map(round),
            "target_oom": args.target_oom,
            "retries": self.retries,
            "retries_succeeded": self.retries_ok,
            "queue_wait_p50_seconds": self.wait_p50.map(round),
            "queue_wait_p95_seconds": self.wait_p95.map(round),
        })
    }
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
           COALESCE(sum(u.wall_seconds), 0)::float8 / 3600 AS hours,
           count(*) FILTER (WHERE u.attempt = 1 AND NOT retried) AS first,
           count(*) FILTER (WHERE u.attempt = 1 AND NOT retried AND u.oom_killed) AS first_killed
    FROM (
        SELECT s.*, COALESCE(s.project, j.project) AS of_project, EXISTS (
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
           count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM jobs j
               WHERE j.forge = r.forge AND j.instance = r.instance AND j.conclusion = 'success'
                 AND (j.job_id IN (SELECT (x #>> '{}')::bigint
                                   FROM jsonb_array_elements(COALESCE(r.new_job_ids, '[]'::jsonb)) x)
                      OR (r.new_pipeline_id IS NOT NULL AND j.pipeline_id = r.new_pipeline_id))
           )) AS ok
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
    SELECT count(*) AS runners,
           COALESCE(sum(extract(epoch FROM COALESCE(r.deleted_at, now()) - r.created_at)), 0)::float8 / 60 AS paid,
           COALESCE(sum(extract(epoch FROM
               LEAST(COALESCE(j.completed_at, r.deleted_at, now()), COALESCE(r.deleted_at, now()))
               - r.assigned_at)) FILTER (WHERE r.assigned_at IS NOT NULL), 0)::float8 / 60 AS busy
    FROM runners r
    LEFT JOIN jobs j ON j.forge = r.job_forge AND j.instance = r.job_instance AND j.job_id = r.job_id
    WHERE r.created_at IS NOT NULL AND r.created_at >= now() - make_interval(secs => $1)";

/// `runyard savings`.
pub async fn savings(global: &Global, args: &SavingsArgs) -> Result<u8, Failure> {
    let secs = args.since.as_secs_f64();
    let db = connect_db(global).await?;
    let failed = |what: &str, e: &sqlx::Error| crate::query::query_failed(what, e);
    let mut by: std::collections::BTreeMap<Option<String>, Figures> =
        std::collections::BTreeMap::new();
    // Each query's grand total (the grouping set `()`) says so in `total`.
    let key = |r: &sqlx::postgres::PgRow| -> Option<String> {
        let total = r.try_get::<bool, _>("total").unwrap_or_default();
        (!total).then(|| r.try_get::<String, _>("project").unwrap_or_default())
    };
    let memory = sqlx::query(MEMORY)
        .bind(secs)
        .fetch_all(&db)
        .await
        .map_err(|e| failed("usage_samples", &e))?;
    for r in &memory {
        let f = by.entry(key(r)).or_default();
        f.reports = r.try_get("reports").unwrap_or_default();
        f.reserved = r.try_get("reserved").unwrap_or_default();
        f.used = r.try_get("used").unwrap_or_default();
        f.hours = r.try_get("hours").unwrap_or_default();
        f.first = r.try_get("first").unwrap_or_default();
        f.first_killed = r.try_get("first_killed").unwrap_or_default();
    }
    for (sql, what) in [(RETRIES, "retries"), (WAITS, "jobs")] {
        let rows = sqlx::query(sql)
            .bind(secs)
            .fetch_all(&db)
            .await
            .map_err(|e| failed(what, &e))?;
        for r in &rows {
            let f = by.entry(key(r)).or_default();
            if what == "retries" {
                f.retries = r.try_get("retries").unwrap_or_default();
                f.retries_ok = r.try_get("ok").unwrap_or_default();
            } else {
                f.wait_p50 = r.try_get("p50").ok();
                f.wait_p95 = r.try_get("p95").ok();
            }
        }
    }
    let runners = sqlx::query(RUNNERS)
        .bind(secs)
        .fetch_one(&db)
        .await
        .map_err(|e| failed("runners", &e))?;
    db.close().await;
    let paid: f64 = runners.try_get("paid").unwrap_or_default();
    let busy: f64 = runners.try_get("busy").unwrap_or_default();
    let count: i64 = runners.try_get("runners").unwrap_or_default();

    let total = by.remove(&None).unwrap_or_default();
    let projects: Vec<(String, Figures)> = by
        .into_iter()
        .map(|(k, f)| (k.unwrap_or_default(), f))
        .collect();
    let report = json!({
        "window_seconds": args.since.as_secs(),
        "total": total.json(args),
        "projects": projects.iter().map(|(p, f)| {
            let mut v = f.json(args);
            v["project"] = json!(p);
            v
        }).collect::<Vec<_>>(),
        "runners": {
            "runners": count,
            "runner_minutes": round(paid),
            "idle_runner_minutes": round((paid - busy).max(0.0)),
        },
        "how": HOW.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    });
    if global.json {
        out_json(&report);
        return Ok(EXIT_OK);
    }
    out(&savings_text(&report));
    Ok(EXIT_OK)
}

fn savings_text(report: &Value) -> String {
    let cell = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::Number(n) => n.to_string(),
        other => other.as_str().unwrap_or_default().to_owned(),
    };
    let pct = |v: &Value| {
        v.as_f64()
            .map_or("-".to_owned(), |x| format!("{:.1}%", x * 100.0))
    };
    let cols = [
        "project",
        "reports",
        "reserved_gb_h",
        "used_gb_h",
        "before_gb_h",
        "first_oom",
        "retries_ok",
        "wait_p50_s",
        "wait_p95_s",
    ];
    let row = |name: &str, f: &Value| {
        vec![
            name.to_owned(),
            cell(&f["reports"]),
            cell(&f["reserved_gb_hours"]),
            cell(&f["used_gb_hours"]),
            cell(&f["before_gb_hours"]),
            format!(
                "{} ({}/{})",
                pct(&f["first_attempt_oom_rate"]),
                cell(&f["first_attempts_oom_killed"]),
                cell(&f["first_attempts"])
            ),
            format!("{}/{}", cell(&f["retries_succeeded"]), cell(&f["retries"])),
            cell(&f["queue_wait_p50_seconds"]),
            cell(&f["queue_wait_p95_seconds"]),
        ]
    };
    let mut rows: Vec<Vec<String>> = report["projects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| row(p["project"].as_str().unwrap_or_default(), p))
        .collect();
    rows.push(row("(all)", &report["total"]));
    let mut text = table(&cols, rows);
    let r = &report["runners"];
    text.push_str(&format!(
        "\nrunners {}: {} runner-minutes, {} idle; first-attempt OOM target {}\n\nhow:\n",
        cell(&r["runners"]),
        cell(&r["runner_minutes"]),
        cell(&r["idle_runner_minutes"]),
        pct(&report["total"]["target_oom"]),
    ));
    for (k, v) in HOW {
        text.push_str(&format!("  {k}: {v}\n"));
    }
    text
}
