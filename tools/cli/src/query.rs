//! The daily questions: `runyard jobs`, `runyard runners` (the Postgres
//! projection), `runyard pools` (the scaler's `GET /v1/pools`) and
//! `runyard recommend` (the allocator's gRPC).

use std::collections::BTreeMap;

use clap::Args;
use runyard_allocator_api::allocator_client::AllocatorClient;
use runyard_allocator_api::{JobAttempt, RecommendRequest};
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::{EXIT_OK, Failure, Global, out, out_json, redact, table};

/// Job statuses in the projection's order (`jobs.status` 1..=4).
const STATUSES: [&str; 4] = ["queued", "waiting", "in_progress", "completed"];
/// Forges by their word.
const FORGES: [&str; 2] = ["github", "gitlab"];
/// Runner states (`runners.state`).
const RUNNER_STATES: [&str; 6] = runyard_events::RUNNER_STATES;

/// `runyard jobs`.
#[derive(Args, Debug, Clone)]
pub struct JobsArgs {
    /// Only jobs in these statuses (repeatable or comma-separated):
    /// queued, waiting, in_progress, completed.
    #[arg(long, value_delimiter = ',')]
    pub status: Vec<String>,
    /// Only jobs of this forge: github or gitlab.
    #[arg(long)]
    pub forge: Option<String>,
    /// At most this many jobs (the most recently updated).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

/// `runyard runners`.
#[derive(Args, Debug, Clone)]
pub struct RunnersArgs {
    /// Only runners of this pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Only runners in these states (repeatable or comma-separated):
    /// requested, created, online, assigned, failed, deleted.
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<String>,
    /// At most this many runners (the most recently updated).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

/// `runyard recommend`.
#[derive(Args, Debug, Clone)]
pub struct RecommendArgs {
    /// A workload attribute, `key=value` (repeatable): e.g. `package=py-torch
    /// version=2.3.1` for Spack, `repo=... workflow=... job=...` for GitHub.
    #[arg(long, short, value_name = "KEY=VALUE", required = true)]
    pub workload: Vec<String>,
    /// The git ref the job builds (only protected refs train the model).
    #[arg(long = "ref", value_name = "REF", default_value = "")]
    pub git_ref: String,
    /// The attempt this request retries: `FORGE:INSTANCE:job:ID:ATTEMPT`
    /// or `FORGE:INSTANCE:pipeline:ID` (e.g.
    /// `gitlab:gitlab.example.com:pipeline:1234`). The answer is bumped
    /// above that attempt's OOM kill.
    #[arg(long, value_name = "ATTEMPT")]
    pub retry_of: Option<String>,
    /// Also show the workload's last N usage reports from the projection
    /// (`--database-url`), oldest first: each peak against the limit its
    /// attempt ran with, OOM kills marked, beside the new limit.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub history: u32,
}

/// A workload's last `n` usage reports, oldest first.
async fn history(
    global: &Global,
    workload: &BTreeMap<String, String>,
    n: u32,
) -> Result<Vec<Value>, Failure> {
    let key = runyard_store::workload::key(workload.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let db = connect_db(global).await?;
    let rows = sqlx::query(
        "SELECT forge, instance, job_id, attempt, ref, peak_memory_bytes, memory_limit_bytes,
                oom_killed, reported_at
         FROM usage_samples WHERE workload_key = $1
         ORDER BY reported_at DESC, id DESC LIMIT $2",
    )
    .bind(&key)
    .bind(i64::from(n))
    .fetch_all(&db)
    .await
    .map_err(|e| query_failed("usage_samples", &e))?;
    db.close().await;
    let mut list: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "reported_at": ts(time_of(r, "reported_at")),
                "forge": text(r, "forge"),
                "instance": text(r, "instance"),
                "job_id": r.try_get::<i64, _>("job_id").unwrap_or_default(),
                "attempt": r.try_get::<i32, _>("attempt").unwrap_or_default(),
                "ref": text(r, "ref"),
                "peak_memory_bytes": r.try_get::<i64, _>("peak_memory_bytes").unwrap_or_default(),
                "memory_limit_bytes": r.try_get::<Option<i64>, _>("memory_limit_bytes").ok().flatten(),
                "oom_killed": r.try_get::<bool, _>("oom_killed").unwrap_or_default(),
            })
        })
        .collect();
    list.reverse();
    Ok(list)
}

/// The history as a chart for a terminal: per report a bar of its peak
/// (`#`), its limit (`|`, or `X` when the peak was killed there) and the
/// new limit (`:`), on one scale.
fn history_chart(list: &[Value], new_limit: u64) -> String {
    const WIDTH: f64 = 40.0;
    let bytes = |v: &Value| v.as_u64().unwrap_or_default();
    let top = list
        .iter()
        .flat_map(|h| {
            [
                bytes(&h["peak_memory_bytes"]),
                bytes(&h["memory_limit_bytes"]),
            ]
        })
        .chain([new_limit])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let at = |b: u64| ((b as f64 / top) * WIDTH).round() as usize;
    let rows = list
        .iter()
        .map(|h| {
            let (peak, limit) = (
                bytes(&h["peak_memory_bytes"]),
                bytes(&h["memory_limit_bytes"]),
            );
            let killed = h["oom_killed"].as_bool().unwrap_or_default();
            let mut bar: Vec<char> = vec![' '; WIDTH as usize + 1];
            for c in bar.iter_mut().take(at(peak)) {
                *c = '#';
            }
            bar[at(new_limit)] = ':';
            if limit > 0 {
                bar[at(limit)] = if killed { 'X' } else { '|' };
            }
            vec![
                h["reported_at"].as_str().unwrap_or("-").to_owned(),
                format!("{}/{}", h["job_id"], h["attempt"]),
                bytesize::ByteSize::b(peak).to_string(),
                if limit > 0 {
                    bytesize::ByteSize::b(limit).to_string()
                } else {
                    "-".to_owned()
                },
                if killed {
                    "OOM".to_owned()
                } else {
                    String::new()
                },
                bar.into_iter().collect::<String>().trim_end().to_owned(),
            ]
        })
        .collect();
    format!(
        "{}# peak, | the limit it ran with (X: killed there), : the new limit {}\n",
        table(
            &["reported", "job/attempt", "peak", "limit", "", "chart"],
            rows
        ),
        bytesize::ByteSize::b(new_limit)
    )
}

/// Parses `--retry-of`.
fn parse_retry_of(s: &str) -> Result<JobAttempt, Failure> {
    let usage = |why: &str| {
        Failure::Usage(format!(
            "--retry-of {s:?}: {why} (FORGE:INSTANCE:job:ID:ATTEMPT or FORGE:INSTANCE:pipeline:ID)"
        ))
    };
    let number = |v: &str, what: &str| {
        v.parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| usage(&format!("{what} {v:?} is not a positive number")))
    };
    let parts: Vec<&str> = s.split(':').collect();
    let (forge, instance) = match parts.as_slice() {
        [forge, instance, ..] if !instance.is_empty() => (*forge, *instance),
        _ => return Err(usage("no forge and instance")),
    };
    if runyard_events::parse_forge(&forge.to_ascii_lowercase()).is_none() {
        return Err(usage(&format!(
            "{forge:?} is not a forge (github or gitlab)"
        )));
    }
    let (job_id, pipeline_id, attempt) = match &parts[2..] {
        ["job", id, attempt] => (
            number(id, "job id")?,
            0,
            u32::try_from(number(attempt, "attempt")?).map_err(|_| usage("attempt too large"))?,
        ),
        ["pipeline", id] => (0, number(id, "pipeline id")?, 0),
        _ => {
            return Err(usage(
                "expected job:ID:ATTEMPT or pipeline:ID after the instance",
            ));
        }
    };
    Ok(JobAttempt {
        forge: forge.to_ascii_lowercase(),
        instance: instance.to_owned(),
        job_id,
        attempt,
        pipeline_id,
    })
}

pub(crate) async fn connect_db(global: &Global) -> Result<sqlx::PgPool, Failure> {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(global.timeout())
        .connect(&global.database_url)
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "connecting to the projection at {}: {e} (`runyard doctor` checks)",
                redact(&global.database_url)
            ))
        })
}

pub(crate) fn query_failed(what: &str, e: &sqlx::Error) -> Failure {
    Failure::Failed(format!(
        "reading {what}: {e} (is the schema migrated? `runyard doctor` checks)"
    ))
}

/// A text column of `r` (absent or NULL: `None`).
fn text(r: &sqlx::postgres::PgRow, column: &str) -> Option<String> {
    r.try_get::<Option<String>, _>(column).ok().flatten()
}

/// A timestamp column of `r` (absent or NULL: `None`).
fn time_of(r: &sqlx::postgres::PgRow, column: &str) -> Option<time::OffsetDateTime> {
    r.try_get::<Option<time::OffsetDateTime>, _>(column)
        .ok()
        .flatten()
}

/// Prints `list` as `{"<name>": [...]}` with `--json`, else as a table of
/// `columns` (field, heading).
fn print_list(global: &Global, name: &str, list: &[Value], columns: &[(&str, &str)]) {
    if global.json {
        out_json(&json!({ name: list }));
        return;
    }
    let rows = list
        .iter()
        .map(|item| columns.iter().map(|(k, _)| show(&item[*k])).collect())
        .collect();
    let headings: Vec<&str> = columns.iter().map(|(_, h)| *h).collect();
    out(&table(&headings, rows));
}

fn ts(v: Option<time::OffsetDateTime>) -> Option<String> {
    v.and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) if s.is_empty() => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

/// Runs `runyard jobs`.
pub async fn jobs(global: &Global, args: &JobsArgs) -> Result<u8, Failure> {
    let mut statuses: Vec<i16> = Vec::new();
    for s in &args.status {
        let i = STATUSES.iter().position(|x| x == s).ok_or_else(|| {
            Failure::Usage(format!(
                "--status {s:?}: not a job status (one of {})",
                STATUSES.join(", ")
            ))
        })?;
        statuses.push(i as i16 + 1);
    }
    if let Some(f) = &args.forge
        && !FORGES.contains(&f.as_str())
    {
        return Err(Failure::Usage(format!(
            "--forge {f:?}: not a forge (github or gitlab)"
        )));
    }
    let db = connect_db(global).await?;
    let rows = sqlx::query(
        "SELECT forge, instance, job_id, status, conclusion, failure_reason, project, name,
                labels, runner_name, pipeline_id, ref, created_at, started_at, completed_at,
                last_event_at
         FROM jobs
         WHERE (cardinality($1::smallint[]) = 0 OR status = ANY($1))
           AND ($2::text IS NULL OR forge = $2)
         ORDER BY last_event_at DESC, job_id DESC
         LIMIT $3",
    )
    .bind(&statuses)
    .bind(&args.forge)
    .bind(i64::from(args.limit))
    .fetch_all(&db)
    .await
    .map_err(|e| query_failed("jobs", &e))?;
    db.close().await;
    let mut list = Vec::new();
    for r in rows {
        let status: i16 = r.try_get("status").unwrap_or_default();
        let (get_s, get_t) = (|c| text(&r, c), |c| time_of(&r, c));
        list.push(json!({
            "forge": get_s("forge"),
            "instance": get_s("instance"),
            "job_id": r.try_get::<i64, _>("job_id").unwrap_or_default(),
            "status": STATUSES.get((status as usize).wrapping_sub(1)).copied().unwrap_or("?"),
            "conclusion": get_s("conclusion"),
            "failure_reason": get_s("failure_reason"),
            "project": get_s("project"),
            "name": get_s("name"),
            "labels": r.try_get::<Option<Value>, _>("labels").ok().flatten(),
            "runner_name": get_s("runner_name"),
            "pipeline_id": r.try_get::<Option<i64>, _>("pipeline_id").ok().flatten(),
            "ref": get_s("ref"),
            "created_at": ts(get_t("created_at")),
            "started_at": ts(get_t("started_at")),
            "completed_at": ts(get_t("completed_at")),
            "updated_at": ts(get_t("last_event_at")),
        }));
    }
    print_list(
        global,
        "jobs",
        &list,
        &[
            ("forge", "forge"),
            ("job_id", "job"),
            ("status", "status"),
            ("conclusion", "conclusion"),
            ("project", "project"),
            ("name", "name"),
            ("labels", "labels"),
            ("runner_name", "runner"),
            ("updated_at", "updated"),
        ],
    );
    Ok(EXIT_OK)
}

/// Runs `runyard runners`.
pub async fn runners(global: &Global, args: &RunnersArgs) -> Result<u8, Failure> {
    for s in &args.state {
        if !RUNNER_STATES.contains(&s.as_str()) {
            return Err(Failure::Usage(format!(
                "--state {s:?}: not a runner state (one of {})",
                RUNNER_STATES.join(", ")
            )));
        }
    }
    if let Some(p) = &args.pool
        && !runyard_events::valid_pool_name(p)
    {
        return Err(Failure::Usage(format!(
            "--pool {p:?}: pool names match [a-z0-9_-]+"
        )));
    }
    let db = connect_db(global).await?;
    let rows = sqlx::query(
        "SELECT pool, name, state, reason, attempts, flavor, provider, provider_id,
                job_forge, job_id, requested_at, online_at, deleted_at, last_event_at
         FROM runners
         WHERE ($1::text IS NULL OR pool = $1)
           AND (cardinality($2::text[]) = 0 OR state = ANY($2))
         ORDER BY last_event_at DESC, name
         LIMIT $3",
    )
    .bind(&args.pool)
    .bind(&args.state)
    .bind(i64::from(args.limit))
    .fetch_all(&db)
    .await
    .map_err(|e| query_failed("runners", &e))?;
    db.close().await;
    let mut list = Vec::new();
    for r in rows {
        let (get_s, get_t) = (|c| text(&r, c), |c| time_of(&r, c));
        list.push(json!({
            "pool": get_s("pool"),
            "name": get_s("name"),
            "state": get_s("state"),
            "reason": get_s("reason"),
            "attempts": r.try_get::<i32, _>("attempts").unwrap_or_default(),
            "flavor": get_s("flavor"),
            "provider": get_s("provider"),
            "provider_id": get_s("provider_id"),
            "job_forge": get_s("job_forge"),
            "job_id": r.try_get::<Option<i64>, _>("job_id").ok().flatten(),
            "requested_at": ts(get_t("requested_at")),
            "online_at": ts(get_t("online_at")),
            "deleted_at": ts(get_t("deleted_at")),
            "updated_at": ts(get_t("last_event_at")),
        }));
    }
    print_list(
        global,
        "runners",
        &list,
        &[
            ("pool", "pool"),
            ("name", "name"),
            ("state", "state"),
            ("reason", "reason"),
            ("flavor", "flavor"),
            ("job_id", "job"),
            ("updated_at", "updated"),
        ],
    );
    Ok(EXIT_OK)
}

/// Runs `runyard pools`.
pub async fn pools(global: &Global) -> Result<u8, Failure> {
    scaler_command(global, "/v1/pools", "the pools JSON", |body| {
        pools_text(body, time::OffsetDateTime::now_utc())
    })
    .await
}

/// `runyard queue`: the scaler's `GET /v1/queue`, every job without a
/// runner and why.
pub async fn queue(global: &Global) -> Result<u8, Failure> {
    scaler_command(global, "/v1/queue", "the queue JSON", queue_text).await
}

/// Prints the scaler's answer at `path` as JSON with `--json`, else as
/// `text` makes it.
async fn scaler_command(
    global: &Global,
    path: &str,
    what: &str,
    text: impl Fn(&Value) -> String,
) -> Result<u8, Failure> {
    let body = scaler_get(global, path, what).await?;
    if global.json {
        out_json(&body);
    } else {
        out(&text(&body));
    }
    Ok(EXIT_OK)
}

/// The scaler's answer at `path`, as JSON (`what` names it in errors).
async fn scaler_get(global: &Global, path: &str, what: &str) -> Result<Value, Failure> {
    let http = global.http()?;
    let url = format!("{}{path}", global.scaler_url.trim_end_matches('/'));
    let shown = redact(&url);
    let answer = http.get(&url).send().await.map_err(|e| {
        Failure::Failed(format!(
            "asking the scaler at {shown}: {} (is runyard-scaler running? --scaler-url / RUNYARD_SCALER_URL)",
            crate::chain(&e.without_url())
        ))
    })?;
    let status = answer.status();
    if !status.is_success() {
        let body = answer.text().await.unwrap_or_default();
        return Err(Failure::Failed(format!(
            "{shown} answered {status}: {}",
            body.trim()
        )));
    }
    answer
        .json()
        .await
        .map_err(|e| Failure::Failed(format!("{shown}: not {what}: {e}")))
}

/// `runyard queue` for people: oldest first, the reason in words.
fn queue_text(body: &Value) -> String {
    let empty = Vec::new();
    let jobs = body["jobs"].as_array().unwrap_or(&empty);
    if jobs.is_empty() {
        return "no job is waiting for a runner".to_owned();
    }
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let rows = jobs
        .iter()
        .map(|j| {
            let age = j["age_seconds"].as_f64().unwrap_or_default();
            vec![
                format!("{:.0}s", age),
                s(&j["forge"]),
                j["job_id"].to_string(),
                s(&j["project"]),
                s(&j["name"]),
                s(&j["pool"]),
                s(&j["reason"]),
                s(&j["detail"]),
            ]
        })
        .collect();
    table(
        &[
            "age", "forge", "job", "project", "name", "pool", "reason", "why",
        ],
        rows,
    )
}

/// The title of the second table of `runyard pools`, which says how its
/// combined columns read.
const SCALE_SETS_TITLE: &str =
    "scale sets (jobs: available/assigned/running; runners: registered/busy/idle)";

/// `runyard pools` for people: the pools table, and under it a table of
/// the scale sets when any pool is in scale-set mode (its `scale_set`
/// object). A webhook-only answer prints the pools table alone, as it
/// always did.
fn pools_text(body: &Value, now: time::OffsetDateTime) -> String {
    let empty = Vec::new();
    let pools = body["pools"].as_array().unwrap_or(&empty);
    let cols = [
        "name",
        "desired",
        "actual",
        "idle",
        "creating",
        "busy",
        "queued",
        "min_idle",
        "max_runners",
    ];
    let rows = pools
        .iter()
        .map(|p| cols.iter().map(|k| show(&p[*k])).collect())
        .collect();
    let mut text = table(
        &[
            "pool", "desired", "actual", "idle", "creating", "busy", "queued", "min", "max",
        ],
        rows,
    );
    let sets: Vec<Vec<String>> = pools
        .iter()
        .filter(|p| p["scale_set"].is_object())
        .map(|p| scale_set_row(&p["name"], &p["scale_set"], now))
        .collect();
    if !sets.is_empty() {
        text.push('\n');
        text.push_str(SCALE_SETS_TITLE);
        text.push('\n');
        text.push_str(&table(
            &[
                "pool",
                "scale set",
                "id",
                "session",
                "last message",
                "answered",
                "jobs",
                "runners",
                "error",
            ],
            sets,
        ));
    }
    text
}

/// One scale set's row: the session's state, the last message whose
/// events are in the log, how long ago the service last answered a poll,
/// and the service's counts (`-` where the scaler has nothing yet).
fn scale_set_row(pool: &Value, set: &Value, now: time::OffsetDateTime) -> Vec<String> {
    let stats = &set["statistics"];
    let counts = |keys: [&str; 3]| {
        if stats.is_object() {
            keys.map(|k| show(&stats[k])).join("/")
        } else {
            "-".to_owned()
        }
    };
    let last_message = match set["last_message_id"].as_i64() {
        Some(id) if id > 0 => id.to_string(),
        _ => "-".to_owned(),
    };
    vec![
        show(pool),
        show(&set["name"]),
        show(&set["id"]),
        show(&set["state"]),
        last_message,
        set["last_message_at"]
            .as_str()
            .and_then(|at| ago(at, now))
            .unwrap_or_else(|| "-".to_owned()),
        counts([
            "total_available_jobs",
            "total_assigned_jobs",
            "total_running_jobs",
        ]),
        counts([
            "total_registered_runners",
            "total_busy_runners",
            "total_idle_runners",
        ]),
        show(&set["error"]),
    ]
}

/// How long before `now` the RFC 3339 time `at` was, as people say it:
/// `12s ago`, `1m10s ago`, `3h05m ago`, `2d ago`. A time after `now` (the
/// scaler's clock ahead of this one) is `0s ago`; an unreadable one `None`.
fn ago(at: &str, now: time::OffsetDateTime) -> Option<String> {
    let then =
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()?;
    let s = (now - then).whole_seconds().max(0);
    Some(match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m{:02}s ago", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m ago", s / 3600, s % 3600 / 60),
        _ => format!("{}d ago", s / 86_400),
    })
}

/// Parses `key=value` workload attributes.
pub fn parse_workload(pairs: &[String]) -> Result<BTreeMap<String, String>, Failure> {
    let mut workload = BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| {
                Failure::Usage(format!(
                    "--workload {p:?}: expected KEY=VALUE (e.g. package=py-torch)"
                ))
            })?;
        if workload.insert(k.trim().to_owned(), v.to_owned()).is_some() {
            return Err(Failure::Usage(format!(
                "--workload: attribute {:?} given twice",
                k.trim()
            )));
        }
    }
    Ok(workload)
}

/// Runs `runyard recommend`.
pub async fn recommend(global: &Global, args: &RecommendArgs) -> Result<u8, Failure> {
    let workload = parse_workload(&args.workload)?;
    let retry_of = args.retry_of.as_deref().map(parse_retry_of).transpose()?;
    let url = redact(&global.allocator_url);
    let endpoint = global.allocator_endpoint()?;
    let channel = endpoint.connect().await.map_err(|e| {
        Failure::Failed(format!(
            "connecting to the allocator at {url}: {} (is runyard-allocator running? --allocator-url / RUNYARD_ALLOCATOR_URL)",
            crate::chain(&e)
        ))
    })?;
    let mut client = AllocatorClient::new(channel);
    let mut req = tonic::Request::new(RecommendRequest {
        workload: workload.clone().into_iter().collect(),
        r#ref: args.git_ref.clone(),
        retry_of,
        preview: false,
    });
    if let Some(token) = &global.allocator_token {
        let v = format!("Bearer {token}")
            .parse()
            .map_err(|_| Failure::Usage("--allocator-token: not a valid header value".into()))?;
        req.metadata_mut().insert("authorization", v);
    }
    let r = match client.recommend(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            return Err(Failure::Usage(format!(
                "the allocator refused the request: {}",
                s.message()
            )));
        }
        Err(s) if s.code() == tonic::Code::Unauthenticated => {
            return Err(Failure::Usage(format!(
                "the allocator wants a token ({}): --allocator-token / RUNYARD_ALLOCATOR_CLIENT_TOKEN",
                s.message()
            )));
        }
        Err(s) => {
            return Err(Failure::Failed(format!(
                "the allocator at {url} answered {:?}: {}",
                s.code(),
                s.message()
            )));
        }
    };
    let basis = r.basis.as_ref();
    let variables: BTreeMap<String, String> = r.variables.clone().into_iter().collect();
    let answer = json!({
        "workload": workload,
        "ref": args.git_ref,
        "cpu_request_millicores": r.cpu_request_millicores,
        "cpu_limit_millicores": r.cpu_limit_millicores,
        "memory_request_bytes": r.memory_request_bytes,
        "memory_limit_bytes": r.memory_limit_bytes,
        "build_jobs": r.build_jobs,
        "retry_count": r.retry_count,
        "basis": basis.map(|b| json!({
            "samples": b.samples,
            "matched": b.matched,
            "statistic": b.statistic,
            "oom_bump": b.oom_bump,
            "oom_probability": b.oom_probability,
            "workload_samples": b.workload_samples,
        })),
        "variables": variables,
    });
    let past = if args.history > 0 {
        Some(history(global, &workload, args.history).await?)
    } else {
        None
    };
    if global.json {
        let mut answer = answer;
        if let Some(past) = &past {
            answer["history"] = json!(past);
        }
        out_json(&answer);
        return Ok(EXIT_OK);
    }
    let mib = |b: u64| format!("{b} ({})", bytesize::ByteSize::b(b));
    let mut rows = vec![
        vec![
            "cpu request".to_owned(),
            format!("{}m", r.cpu_request_millicores),
        ],
        vec![
            "cpu limit".to_owned(),
            format!("{}m", r.cpu_limit_millicores),
        ],
        vec!["memory request".to_owned(), mib(r.memory_request_bytes)],
        vec!["memory limit".to_owned(), mib(r.memory_limit_bytes)],
        vec!["build jobs".to_owned(), r.build_jobs.to_string()],
        vec!["retry count".to_owned(), r.retry_count.to_string()],
    ];
    if let Some(b) = basis {
        rows.push(vec![
            "basis".to_owned(),
            format!(
                "{} sample(s) ({} of the workload itself), {}, matched {}, {}{}",
                b.samples,
                b.workload_samples,
                b.statistic,
                show(&json!(b.matched)),
                if b.oom_probability >= 0.0 {
                    format!("P(OOM) {:.1}%", b.oom_probability * 100.0)
                } else {
                    "no P(OOM): configured defaults".to_owned()
                },
                if b.oom_bump { ", OOM bump" } else { "" }
            ),
        ]);
    }
    for (k, v) in &variables {
        rows.push(vec![k.clone(), v.clone()]);
    }
    out(&table(&["", "value"], rows));
    if let Some(past) = &past {
        out(&format!("\n{}", history_chart(past, r.memory_limit_bytes)));
    }
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::{SCALE_SETS_TITLE, ago, parse_retry_of, pools_text};
    use serde_json::json;

    fn at(rfc3339: &str) -> time::OffsetDateTime {
        time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
            .expect("a time")
    }

    fn webhook_pool(name: &str) -> serde_json::Value {
        json!({
            "name": name, "desired": 2, "actual": 1, "idle": 0, "creating": 1, "busy": 0,
            "queued": 1, "min_idle": 0, "max_runners": 4,
        })
    }

    #[test]
    fn webhook_pools_print_the_pools_table_alone() {
        let body = json!({ "pools": [webhook_pool("cpu")], "engine": {}, "retrier": {} });
        let text = pools_text(&body, at("2026-01-01T00:00:00Z"));
        assert_eq!(
            text,
            "POOL  DESIRED  ACTUAL  IDLE  CREATING  BUSY  QUEUED  MIN  MAX\n\
             cpu   2        1       0     1         0     1       0    4\n",
        );
    }

    #[test]
    fn scale_set_pools_get_a_second_table_with_their_session() {
        let mut big = webhook_pool("big");
        big["scale_set"] = json!({
            "name": "ry-big", "id": 7, "state": "active", "session_id": "5b0c…",
            "last_message_id": 100000172, "last_message_at": "2026-01-01T00:00:48Z",
            "statistics": {
                "total_available_jobs": 1, "total_acquired_jobs": 0, "total_assigned_jobs": 2,
                "total_running_jobs": 1, "total_registered_runners": 3,
                "total_busy_runners": 1, "total_idle_runners": 2,
            },
            "error": null, "sessions_recreated": 0,
        });
        let mut gpu = webhook_pool("gpu");
        gpu["scale_set"] = json!({
            "name": "gpu", "id": null, "state": "error", "session_id": null,
            "last_message_id": 0, "last_message_at": null, "statistics": null,
            "error": "registration: the forge answered 401", "sessions_recreated": 0,
        });
        let body = json!({ "pools": [webhook_pool("cpu"), big, gpu] });
        let text = pools_text(&body, at("2026-01-01T00:01:00Z"));
        let (pools, sets) = text.split_once(&format!("\n{SCALE_SETS_TITLE}\n")).unwrap();
        assert_eq!(pools.lines().count(), 4, "{text}");
        assert!(pools.starts_with("POOL  DESIRED"), "{text}");
        let lines: Vec<Vec<&str>> = sets
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "POOL", "SCALE", "SET", "ID", "SESSION", "LAST", "MESSAGE", "ANSWERED", "JOBS",
                "RUNNERS", "ERROR"
            ],
            "{text}"
        );
        assert_eq!(
            lines[1],
            [
                "big",
                "ry-big",
                "7",
                "active",
                "100000172",
                "12s",
                "ago",
                "1/2/1",
                "3/1/2",
                "-"
            ],
            "{text}"
        );
        assert_eq!(
            lines[2],
            [
                "gpu",
                "gpu",
                "-",
                "error",
                "-",
                "-",
                "-",
                "-",
                "registration:",
                "the",
                "forge",
                "answered",
                "401"
            ],
            "{text}"
        );
        assert_eq!(lines.len(), 3, "only the scale-set pools: {text}");
    }

    #[test]
    fn ages_read_as_people_say_them() {
        let now = at("2026-01-03T12:00:00Z");
        for (then, says) in [
            ("2026-01-03T12:00:00Z", "0s ago"),
            ("2026-01-03T11:59:48Z", "12s ago"),
            ("2026-01-03T11:58:50Z", "1m10s ago"),
            ("2026-01-03T08:55:00Z", "3h05m ago"),
            ("2026-01-01T11:00:00Z", "2d ago"),
            ("2026-01-03T12:00:09Z", "0s ago"),
            ("2026-01-03T13:00:00+01:00", "0s ago"),
        ] {
            assert_eq!(ago(then, now).as_deref(), Some(says), "{then}");
        }
        assert_eq!(ago("yesterday", now), None);
    }

    #[test]
    fn retry_of_names_a_job_attempt_or_a_pipeline_and_refuses_the_rest() {
        let job = parse_retry_of("GitHub:github.com:job:42:2").expect("a job attempt");
        assert_eq!(
            (
                job.forge.as_str(),
                job.instance.as_str(),
                job.job_id,
                job.attempt,
                job.pipeline_id
            ),
            ("github", "github.com", 42, 2, 0)
        );
        let pipeline =
            parse_retry_of("gitlab:gitlab.example.com:pipeline:1234").expect("a pipeline");
        assert_eq!(
            (pipeline.job_id, pipeline.pipeline_id, pipeline.attempt),
            (0, 1234, 0)
        );
        for (bad, says) in [
            ("svn:host:job:1:1", "\"svn\" is not a forge"),
            ("gitlab", "no forge and instance"),
            (
                "gitlab:host:job:1",
                "expected job:ID:ATTEMPT or pipeline:ID",
            ),
            (
                "gitlab:host:job:x:1",
                "job id \"x\" is not a positive number",
            ),
            (
                "gitlab:host:pipeline:0",
                "pipeline id \"0\" is not a positive number",
            ),
        ] {
            let Err(crate::Failure::Usage(message)) = parse_retry_of(bad) else {
                panic!("{bad} was taken");
            };
            assert!(message.contains(says), "{bad}: {message}");
        }
    }
}
