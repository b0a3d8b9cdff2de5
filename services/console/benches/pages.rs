//! `pages`: the console benchmark (docs/benchmarks.md, "Console"). Run it
//! through `scripts/bench-console.sh`; `-- --help` lists the flags.
//!
//! 1. **Seeds** a busy month ([`runyard_testkit::synth::month`]: 500,000
//!    jobs over 50,000 workloads in 30 days ending now, with their runners,
//!    usage reports, OOM kills, retries, failed creates and a few hundred
//!    jobs still waiting) through the job-tracker's own projection
//!    ([`apply_batch`]) into a database migrated with
//!    [`runyard_store::migrate`], batches of a few thousand events,
//!    printing progress. With `--database-url` the database is kept: a
//!    seeded one is reused, a partly seeded one is finished from where it
//!    stopped (the progress is in `projection_meta`).
//! 2. **Serves** it with the real console ([`runyard_console::App`], in
//!    this process, release build) logging in as a read-only role (a
//!    member of `runyard_reader`, as the console demands), with a login
//!    token, and a stand-in of the scaler's `GET /v1/queue` and
//!    `/v1/pools` answering from memory (the open jobs and pools of the
//!    seeded month), so the queue and pools pages render whole.
//! 3. **Times** every page over many requests, one at a time over a
//!    keep-alive loopback connection, the cases interleaved round by
//!    round; and, in the same rounds, the `runyard_insight` queries behind
//!    each page on their own, so a slow page can be traced to its query.
//!    The console's own `runyard_console_page_seconds` (its mean) is read
//!    at the end as a cross-check of the client's figures.
//! 4. With `--compare-without`, drops those indexes, times the same
//!    rounds again and puts them back: what each index buys, from the same
//!    run.
//!
//! Prints markdown for docs/benchmarks.md on stdout; progress on stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark's report

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use runyard_bench::http::{HttpClient, client, send};
use runyard_bench::report::{Dist, Table, thousands, verdict};
use runyard_bench::{args, metrics, procfs};
use runyard_insight::savings::SavingsQuery;
use runyard_insight::search::Term;
use runyard_insight::story::JobRef;
use runyard_projection::apply::{Incoming, apply_batch};
use runyard_testkit::TestDb;
use runyard_testkit::synth::month::{Month, MonthSpec, SEQ_STRIDE};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row as _};
use tokio::sync::{mpsc, oneshot};

/// A login token (as `openssl rand -hex 32` makes them).
const TOKEN: &str = "5e0c2a9b7d4f6e8a1c3b5d7f9e0a2c4b6d8f0e1a3c5b7d9f1e3a5c7b9d0f2e4a";
/// The read-only login role the console reads as.
const READER_LOGIN: &str = "runyard_console_bench";
/// Where the seeding's progress is kept.
const META_KEY: &str = "synth.month";
/// The target of the issue: any page within this, server time.
const TARGET_MS: f64 = 200.0;

/// Console benchmark: every page's server time on a busy site's month.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A database that is kept: seeded when empty, finished when partly
    /// seeded, reused when seeded (by default a fresh one is seeded and
    /// dropped).
    #[arg(long)]
    database_url: Option<String>,
    /// Seed of the month (its spec must match a reused database's).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Jobs of the month (retries come on top).
    #[arg(long, default_value_t = 500_000)]
    jobs: usize,
    /// Distinct workloads.
    #[arg(long, default_value_t = 50_000)]
    workloads: usize,
    /// Days the month spans, ending when it is seeded.
    #[arg(long, default_value_t = 30)]
    days: u32,
    /// Jobs still queued or waiting at the end.
    #[arg(long, default_value_t = 300)]
    open: usize,
    /// Events per transaction while seeding (at least; whole pipelines).
    #[arg(long, default_value_t = 4000)]
    batch_events: usize,
    /// Transactions applied at once while seeding.
    #[arg(long, default_value_t = 2)]
    seed_writers: usize,
    /// Timed requests per page case (and calls per query).
    #[arg(long, default_value_t = 40, value_parser = args::at_least_one)]
    requests: usize,
    /// Untimed rounds first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Seed with these indexes dropped, made again afterwards
    /// (comma-separated): what they cost the projection.
    #[arg(long, value_delimiter = ',')]
    seed_without: Vec<String>,
    /// Also time every case with these indexes dropped (put back
    /// afterwards), comma-separated.
    #[arg(long, value_delimiter = ',')]
    compare_without: Vec<String>,
    /// Before timing, wait until the machine is busy less than this many
    /// cores...
    #[arg(long, default_value_t = 0.5)]
    quiet_below: f64,
    /// ...but at most this many seconds.
    #[arg(long, default_value_t = 30)]
    quiet_wait_secs: u64,
    #[command(flatten)]
    cargo: args::Cargo,
}

impl Args {
    fn spec(&self, end: time::OffsetDateTime) -> MonthSpec {
        MonthSpec {
            jobs: self.jobs,
            workloads: self.workloads,
            days: self.days,
            end,
            seed: self.seed,
            open: self.open,
            ..MonthSpec::busy(end)
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.jobs > 0 && args.workloads > 0,
        "--jobs and --workloads must be positive"
    );
    runyard_telemetry::install_crypto_provider();
    let fresh = args.database_url.is_none().then(TestDb::new);
    let url = match (&args.database_url, &fresh) {
        (Some(u), _) => u.clone(),
        (None, Some(db)) => db.url.clone(),
        (None, None) => unreachable!(),
    };
    let result = Box::pin(bench(&args, &url)).await;
    if let Some(db) = &fresh {
        db.drop_db().await;
    }
    println!("{}", result?);
    Ok(())
}

/// What the seeding left in `projection_meta`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Seeded {
    seed: u64,
    jobs: usize,
    workloads: usize,
    days: u32,
    open: usize,
    /// Unix seconds the month ends.
    end: i64,
    pipelines: usize,
    /// Pipelines applied (all of those below).
    done: usize,
}

impl Seeded {
    fn same_month(&self, args: &Args) -> bool {
        (self.seed, self.jobs, self.workloads, self.days, self.open)
            == (args.seed, args.jobs, args.workloads, args.days, args.open)
    }
}

async fn bench(args: &Args, url: &str) -> anyhow::Result<String> {
    reader_roles(url).await?;
    eprintln!("migrating {}", runyard_config::redact::url(url));
    let t = Instant::now();
    runyard_store::migrate(url).await.context("migrating")?;
    eprintln!("  migrated in {:.1} s", t.elapsed().as_secs_f64());
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(args.seed_writers.max(1) as u32 + 1)
        .connect(url)
        .await
        .context("connecting")?;
    let saved = drop_indexes(&admin, &args.seed_without).await?;
    let seeded = seed(args, &admin).await;
    let t = Instant::now();
    restore_indexes(&admin, &saved).await?;
    let (seeded, rate) = seeded?;
    let mut report = String::new();
    if let Some((events, secs)) = rate {
        let _ = writeln!(
            report,
            "Seeded {} events in {secs:.0} s: {} events/s through `apply_batch` ({} writers, batches of {}+ events){}.\n",
            thousands(events as u64),
            thousands((events as f64 / secs) as u64),
            args.seed_writers,
            args.batch_events,
            if saved.is_empty() {
                String::new()
            } else {
                format!(
                    ", without {} (made again afterwards in {:.1} s)",
                    args.seed_without.join(", "),
                    t.elapsed().as_secs_f64()
                )
            }
        );
    }
    let month = Month::new(args.spec(unix(seeded.end)));
    let volumes = volumes(&admin, &seeded).await?;
    let reader = reader_url(url);
    let cases = cases(&admin, &month).await?;
    let scaler = StandIn::start(&admin).await?;
    // The queries on their own: as the console's sessions are set up, on
    // a pool as large as its default.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(runyard_console::session(&reader)?)
        .await
        .context("connecting as the reader")?;
    let http = client(4);
    report.push_str(&volumes);
    let after = measure(args, &http, &reader, &scaler.url, &pool, &cases).await?;
    report.push_str(&after.report("as migrated"));
    report.push_str(&after.server);
    if !args.compare_without.is_empty() {
        let saved = drop_indexes(&admin, &args.compare_without).await?;
        let before = Box::pin(measure(args, &http, &reader, &scaler.url, &pool, &cases)).await;
        restore_indexes(&admin, &saved).await?;
        let before = before?;
        report.push_str(&before.report(&format!("without {}", args.compare_without.join(", "))));
        report.push_str(&before.server);
        report.push_str(&compare(&before, &after));
    }
    pool.close().await;
    admin.close().await;
    Ok(report)
}

fn unix(t: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// `runyard_reader` and the bench's login role in it, made when missing
/// (migrating then grants the reader `SELECT` on every table).
async fn reader_roles(url: &str) -> anyhow::Result<()> {
    let admin = runyard_store::with_database(url, "postgres")?;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
        .await
        .with_context(|| format!("connecting to {}", runyard_config::redact::url(&admin)))?;
    for sql in [
        "CREATE ROLE runyard_reader NOLOGIN".to_owned(),
        format!("CREATE ROLE {READER_LOGIN} LOGIN IN ROLE runyard_reader"),
    ] {
        sqlx::query(&format!(
            "DO $$ BEGIN {sql}; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        ))
        .execute(&mut conn)
        .await
        .with_context(|| sql.clone())?;
    }
    Ok(())
}

/// `url` as the read-only login role (no password: the local server trusts
/// loopback).
fn reader_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{READER_LOGIN}@{host}")
}

async fn read_meta(db: &PgPool) -> anyhow::Result<Option<Seeded>> {
    let value: Option<String> =
        sqlx::query_scalar("SELECT value FROM projection_meta WHERE key = $1")
            .bind(META_KEY)
            .fetch_optional(db)
            .await?;
    Ok(value.map(|v| serde_json::from_str(&v)).transpose()?)
}

async fn write_meta(db: &PgPool, s: &Seeded) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO projection_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    )
    .bind(META_KEY)
    .bind(serde_json::to_string(s)?)
    .execute(db)
    .await?;
    Ok(())
}

/// Seeds the month, or finishes or reuses it: the progress as it stands,
/// and the events applied now and how long that took.
async fn seed(args: &Args, db: &PgPool) -> anyhow::Result<(Seeded, Option<(usize, f64)>)> {
    let mut seeded = match read_meta(db).await? {
        Some(s) if !s.same_month(args) => bail!(
            "the database holds another month ({s:?}); use another --database-url or the same --seed, --jobs, --workloads, --days and --open"
        ),
        Some(s) => s,
        None => {
            let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
                .fetch_one(db)
                .await?;
            ensure!(
                jobs == 0,
                "the database holds {jobs} jobs but no seeded month: give an empty or a seeded database"
            );
            let end = time::OffsetDateTime::now_utc().unix_timestamp();
            let month = Month::new(args.spec(unix(end)));
            let s = Seeded {
                seed: args.seed,
                jobs: args.jobs,
                workloads: args.workloads,
                days: args.days,
                open: args.open,
                end,
                pipelines: month.pipelines(),
                done: 0,
            };
            write_meta(db, &s).await?;
            s
        }
    };
    let age = time::OffsetDateTime::now_utc().unix_timestamp() - seeded.end;
    if seeded.done == seeded.pipelines {
        eprintln!(
            "reusing the seeded month (ended {:.1} h ago)",
            age as f64 / 3600.0
        );
        if age > 6 * 3600 {
            eprintln!(
                "  the month ended over 6 h ago: the last day's and hour's windows hold fewer jobs than a fresh seed's"
            );
        }
        return Ok((seeded, None));
    }
    let month = Arc::new(Month::new(args.spec(unix(seeded.end))));
    ensure!(
        month.pipelines() == seeded.pipelines,
        "the month's plan changed"
    );
    eprintln!(
        "seeding {} pipelines ({} jobs, {} workloads, {} days) from pipeline {}",
        thousands(seeded.pipelines as u64),
        thousands(month.jobs() as u64),
        thousands(args.workloads as u64),
        args.days,
        seeded.done
    );
    // A thread makes the batches (whole pipelines); writers apply them;
    // the progress is the prefix of batches all applied.
    let (tx, rx) = mpsc::channel::<(usize, usize, Vec<Incoming>)>(args.seed_writers * 2);
    let from = seeded.done;
    let maker = {
        let month = month.clone();
        let batch = args.batch_events.max(1);
        tokio::task::spawn_blocking(move || {
            let mut events = Vec::new();
            let mut first = from;
            for p in from..month.pipelines() {
                for (i, event) in month.pipeline_events(p).into_iter().enumerate() {
                    let seq = p as u64 * SEQ_STRIDE + i as u64 + 1;
                    events.push(Incoming {
                        seq,
                        traceparent: Some(format!(
                            "00-{:032x}-{:016x}-01",
                            (u128::from(seq) << 32) | 0xc0,
                            seq
                        )),
                        event,
                    });
                }
                if events.len() >= batch || p + 1 == month.pipelines() {
                    let b = (first, p + 1, std::mem::take(&mut events));
                    first = p + 1;
                    if tx.blocking_send(b).is_err() {
                        return;
                    }
                }
            }
        })
    };
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<anyhow::Result<(usize, usize, usize)>>();
    let mut writers = Vec::new();
    for _ in 0..args.seed_writers.max(1) {
        let (rx, db, done_tx) = (rx.clone(), db.clone(), done_tx.clone());
        writers.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some((first, end, batch)) = next else {
                    return;
                };
                let applied = apply_batch(&db, &batch)
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|a| {
                        ensure!(a.rejected.is_empty(), "events rejected: {:?}", a.rejected);
                        Ok((first, end, batch.len()))
                    });
                let failed = applied.is_err();
                if done_tx.send(applied).is_err() || failed {
                    return;
                }
            }
        }));
    }
    drop(done_tx);
    let started = Instant::now();
    let mut finished: BTreeMap<usize, usize> = BTreeMap::new();
    let (mut events, mut shown) = (0usize, Instant::now());
    while let Some(done) = done_rx.recv().await {
        let (first, end, n) = done?;
        events += n;
        finished.insert(first, end);
        while let Some(end) = finished.remove(&seeded.done) {
            seeded.done = end;
        }
        if shown.elapsed() >= Duration::from_secs(10) || seeded.done == seeded.pipelines {
            write_meta(db, &seeded).await?;
            let rate = events as f64 / started.elapsed().as_secs_f64();
            let left = (seeded.pipelines - seeded.done) as f64 / (seeded.done - from).max(1) as f64
                * started.elapsed().as_secs_f64();
            eprintln!(
                "  {:>6} / {} pipelines, {} events, {} events/s, about {:.0} s left",
                seeded.done,
                seeded.pipelines,
                thousands(events as u64),
                thousands(rate as u64),
                left
            );
            shown = Instant::now();
        }
    }
    maker.await?;
    for w in writers {
        w.await?;
    }
    ensure!(
        seeded.done == seeded.pipelines,
        "seeding stopped at pipeline {}",
        seeded.done
    );
    let took = started.elapsed().as_secs_f64();
    eprintln!(
        "  seeded {} events in {took:.0} s; VACUUM ANALYZE",
        thousands(events as u64)
    );
    let t = Instant::now();
    sqlx::query("VACUUM (ANALYZE)").execute(db).await?;
    eprintln!("  vacuumed in {:.0} s", t.elapsed().as_secs_f64());
    write_meta(db, &seeded).await?;
    Ok((seeded, Some((events, took))))
}

/// The seeded volumes: rows and size of every table, the database's size.
async fn volumes(db: &PgPool, seeded: &Seeded) -> anyhow::Result<String> {
    let mut t = Table::new(["table", "rows", "table + indexes"]).right([1, 2]);
    for table in [
        "jobs",
        "pipelines",
        "usage_samples",
        "runners",
        "retries",
        "job_events",
        "applied_events",
    ] {
        let (rows, size): (i64, String) = sqlx::query_as(&format!(
            "SELECT (SELECT count(*) FROM {table}), pg_size_pretty(pg_total_relation_size('{table}'))"
        ))
        .fetch_one(db)
        .await?;
        t.row([table.to_owned(), thousands(rows as u64), size]);
    }
    let row = sqlx::query(
        "SELECT pg_size_pretty(pg_database_size(current_database())) AS size,
                (SELECT count(DISTINCT workload_key) FROM usage_samples) AS workloads,
                (SELECT count(*) FROM jobs WHERE status < 3) AS open,
                (SELECT count(*) FROM usage_samples WHERE oom_killed) AS killed,
                (SELECT count(*) FROM retries WHERE kind = 'issued') AS issued,
                (SELECT count(*) FROM job_events WHERE type = 'RunnerFailed') AS failed",
    )
    .fetch_one(db)
    .await?;
    let busiest: (String, i64) = sqlx::query_as(
        "SELECT workload_key, count(*) FROM usage_samples GROUP BY 1 ORDER BY 2 DESC LIMIT 1",
    )
    .fetch_one(db)
    .await?;
    let size: String = row.try_get("size")?;
    let workloads: i64 = row.try_get("workloads")?;
    let open: i64 = row.try_get("open")?;
    let killed: i64 = row.try_get("killed")?;
    let issued: i64 = row.try_get("issued")?;
    let failed: i64 = row.try_get("failed")?;
    Ok(format!(
        "Seeded month: seed {}, {} days ending {}; database {size}; {} distinct workloads (the busiest, {}, has {} samples); {} jobs queued or waiting; {} OOM kills, {} retries issued, {} failed creates.\n\n{t}\n",
        seeded.seed,
        seeded.days,
        unix(seeded.end)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        thousands(workloads as u64),
        busiest.0,
        thousands(busiest.1 as u64),
        thousands(open as u64),
        thousands(killed as u64),
        thousands(issued as u64),
        thousands(failed as u64),
    ))
}

/// A query of `runyard_insight` behind a page.
#[derive(Debug, Clone)]
enum Query {
    Waiting,
    Runners,
    Waits,
    ProviderErrors,
    Story(JobRef),
    History(String, i64),
    Savings(Duration),
    Search(String),
}

impl Query {
    async fn run(&self, db: &PgPool) -> anyhow::Result<usize> {
        use runyard_insight as i;
        Ok(match self {
            Self::Waiting => i::jobs::waiting(db).await?.len(),
            Self::Runners => i::pools::runners(db, None).await?.len(),
            Self::Waits => i::pools::waits(db).await?.len(),
            Self::ProviderErrors => i::pools::provider_errors(db, Duration::from_secs(86_400), 200)
                .await?
                .len(),
            Self::Story(job) => i::story::story(db, job).await?.events.len(),
            Self::History(key, n) => i::workload::history(db, key, *n).await?.samples.len(),
            Self::Savings(window) => {
                let q = SavingsQuery {
                    window: *window,
                    target_oom: 0.03,
                    ..SavingsQuery::default()
                };
                i::savings::savings(db, &q).await?.projects.len()
            }
            Self::Search(q) => {
                let term = Term::parse(q).context("a search term")?;
                let f = i::search::search(db, &term).await?;
                f.jobs.len() + f.workloads.len() + usize::from(f.runner.is_some())
            }
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Waiting => "jobs::waiting",
            Self::Runners => "pools::runners",
            Self::Waits => "pools::waits",
            Self::ProviderErrors => "pools::provider_errors (24 h)",
            Self::Story(_) => "story::story",
            Self::History(..) => "workload::history",
            Self::Savings(_) => "savings::savings",
            Self::Search(_) => "search::search",
        }
    }
}

/// One page as people ask for it: the paths (one per request, in turn),
/// the answer expected, the queries behind it.
#[derive(Debug, Clone)]
struct Case {
    label: String,
    paths: Vec<String>,
    status: u16,
    queries: Vec<Vec<Query>>,
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Jobs by `sql` (forge, instance, job_id), as paths and story queries.
async fn jobs(db: &PgPool, sql: &str) -> anyhow::Result<(Vec<String>, Vec<Vec<Query>>)> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(sql).fetch_all(db).await?;
    ensure!(!rows.is_empty(), "no job for {sql}");
    Ok(rows
        .into_iter()
        .map(|(forge, instance, job_id)| {
            (
                format!("/jobs/{forge}/{}/{job_id}", encode(&instance)),
                vec![Query::Story(JobRef {
                    forge,
                    instance,
                    job_id,
                })],
            )
        })
        .unzip())
}

async fn cases(db: &PgPool, month: &Month) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    let mut add = |label: &str, paths: Vec<String>, status: u16, queries: Vec<Vec<Query>>| {
        cases.push(Case {
            label: label.to_owned(),
            paths,
            status,
            queries,
        });
    };
    add(
        "/queue",
        vec!["/queue".into()],
        200,
        vec![vec![Query::Waiting]],
    );
    add(
        "/pools",
        vec!["/pools".into()],
        200,
        vec![vec![Query::Runners, Query::Waits, Query::ProviderErrors]],
    );
    // Jobs, from quiet to busy: a plain build, one whose runner's first
    // create failed, one OOM-killed and retried (the retry's events and
    // its pipeline's), one still queued.
    let (p, q) = jobs(
        db,
        "SELECT forge, instance, job_id FROM jobs WHERE status = 4 AND forge = 'gitlab'
          ORDER BY hashtext(job_id::text) LIMIT 10",
    )
    .await?;
    add("/jobs/… a plain build", p, 200, q);
    let (p, q) = jobs(
        db,
        "SELECT forge, instance, job_id FROM job_events
          WHERE type = 'RunnerFailed' AND job_id IS NOT NULL AND NOT (detail->>'given_up')::boolean
          ORDER BY hashtext(event_id) LIMIT 10",
    )
    .await?;
    add("/jobs/… a failed create", p, 200, q);
    let (p, q) = jobs(
        db,
        "SELECT DISTINCT ON (hashtext(event_id)) forge, instance, job_id FROM job_events
          WHERE type = 'RetryIssued' ORDER BY hashtext(event_id) LIMIT 10",
    )
    .await?;
    add("/jobs/… OOM-killed, retried", p, 200, q);
    let (p, q) = jobs(
        db,
        "SELECT forge, instance, job_id FROM jobs WHERE status < 3
          ORDER BY hashtext(job_id::text) LIMIT 10",
    )
    .await?;
    add("/jobs/… still queued", p, 200, q);
    // Workloads: the busiest, its whole history, and tail ones.
    let busiest: String = sqlx::query_scalar(
        "SELECT workload_key FROM usage_samples GROUP BY 1 ORDER BY count(*) DESC LIMIT 1",
    )
    .fetch_one(db)
    .await?;
    add(
        "/workloads the busiest",
        vec![format!("/workloads?key={}", encode(&busiest))],
        200,
        vec![vec![Query::History(busiest.clone(), 200)]],
    );
    add(
        "/workloads the busiest, n=1000",
        vec![format!("/workloads?key={}&n=1000", encode(&busiest))],
        200,
        vec![vec![Query::History(busiest, 1000)]],
    );
    let tail: Vec<String> = sqlx::query_scalar(
        "SELECT workload_key FROM usage_samples GROUP BY 1 HAVING count(*) = 1
          ORDER BY hashtext(workload_key) LIMIT 10",
    )
    .fetch_all(db)
    .await?;
    ensure!(!tail.is_empty(), "no workload with one sample");
    add(
        "/workloads a tail one",
        tail.iter()
            .map(|k| format!("/workloads?key={}", encode(k)))
            .collect(),
        200,
        tail.iter()
            .map(|k| vec![Query::History(k.clone(), 200)])
            .collect(),
    );
    for since in ["30d", "7d", "1d"] {
        let window = runyard_insight::parse_duration(since).map_err(anyhow::Error::msg)?;
        add(
            &format!("/savings?since={since}"),
            vec![format!("/savings?since={since}")],
            200,
            vec![vec![Query::Savings(window)]],
        );
    }
    // Search: a job id (one job: a redirect to its story), the busiest
    // project, a GitHub repository, the busiest package, a tail package,
    // a runner's name.
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT job_id FROM jobs ORDER BY hashtext(job_id::text) LIMIT 10")
            .fetch_all(db)
            .await?;
    add(
        "/search?q=<job id>",
        ids.iter().map(|id| format!("/search?q={id}")).collect(),
        303,
        ids.iter()
            .map(|id| vec![Query::Search(id.to_string())])
            .collect(),
    );
    let names = |q: &str| {
        (
            vec![format!("/search?q={}", encode(q))],
            vec![vec![Query::Search(q.to_owned())]],
        )
    };
    let (p, q) = names("spack/spack");
    add("/search?q=spack/spack (busiest project)", p, 200, q);
    let repo: String = sqlx::query_scalar(
        "SELECT project FROM jobs WHERE forge = 'github' GROUP BY 1 ORDER BY count(*) DESC LIMIT 1",
    )
    .fetch_one(db)
    .await?;
    let (p, q) = names(&repo);
    add(&format!("/search?q={repo} (a repository)"), p, 200, q);
    let top = month.workload(0)["package"].clone();
    let (p, q) = names(&top);
    add(&format!("/search?q={top} (busiest package)"), p, 200, q);
    let rare = month.workload(month.spack_workloads() - 1)["package"].clone();
    let (p, q) = names(&rare);
    add(&format!("/search?q={rare} (a tail package)"), p, 200, q);
    let runners: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM runners WHERE job_id IS NOT NULL ORDER BY hashtext(name) LIMIT 10",
    )
    .fetch_all(db)
    .await?;
    add(
        "/search?q=<runner name>",
        runners.iter().map(|n| format!("/search?q={n}")).collect(),
        303,
        runners
            .iter()
            .map(|n| vec![Query::Search(n.clone())])
            .collect(),
    );
    Ok(cases)
}

/// A stand-in for the scaler's HTTP API: `/v1/queue` (the seeded month's
/// open jobs, with the reason their runner's state gives) and `/v1/pools`,
/// answered from memory.
struct StandIn {
    url: String,
    _stop: oneshot::Sender<()>,
}

impl StandIn {
    async fn start(db: &PgPool) -> anyhow::Result<Self> {
        let rows = sqlx::query(
            "SELECT j.forge, j.instance, j.job_id, COALESCE(j.run_attempt, 1) AS run_attempt,
                    COALESCE(j.project, '') AS project, COALESCE(j.name, '') AS name,
                    COALESCE(j.labels, '[]'::jsonb) AS labels, j.status,
                    extract(epoch FROM now() - COALESCE(j.queued_at, j.created_at, j.first_seen_at))::float8 AS age,
                    r.pool, r.name AS runner, r.state
               FROM jobs j
               LEFT JOIN runners r ON r.job_forge = j.forge AND r.job_instance = j.instance
                                  AND r.job_id = j.job_id
              WHERE j.status < 3
              ORDER BY COALESCE(j.queued_at, j.created_at, j.first_seen_at)",
        )
        .fetch_all(db)
        .await?;
        let mut jobs = Vec::new();
        for r in &rows {
            let status: i16 = r.try_get("status")?;
            let state: Option<String> = r.try_get("state")?;
            let (reason, detail) = match (status, state.as_deref()) {
                (2, _) => ("forge_waiting", "the forge holds it (waiting_for_resource)"),
                (_, Some("requested")) => ("creating", "its runner is being created"),
                (_, Some("created")) => ("booting", "its runner is booting"),
                (_, Some("online")) => ("runner_online", "its runner is online, not handed it yet"),
                (_, Some("failed")) => ("given_up", "3 creates failed"),
                _ => ("pool_full", "the pool is at max_runners"),
            };
            let labels: serde_json::Value = r.try_get("labels")?;
            jobs.push(serde_json::json!({
                "forge": r.try_get::<String, _>("forge")?,
                "instance": r.try_get::<String, _>("instance")?,
                "job_id": r.try_get::<i64, _>("job_id")?,
                "run_attempt": r.try_get::<i32, _>("run_attempt")?,
                "project": r.try_get::<String, _>("project")?,
                "name": r.try_get::<String, _>("name")?,
                "labels": labels,
                "status": if status == 2 { "waiting" } else { "queued" },
                "age_seconds": r.try_get::<f64, _>("age")?,
                "pool": r.try_get::<Option<String>, _>("pool")?,
                "reason": reason,
                "detail": detail,
                "runner": r.try_get::<Option<String>, _>("runner")?,
            }));
        }
        let pools: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT pool, count(*) FILTER (WHERE state <> 'deleted'),
                    count(*) FILTER (WHERE state = 'assigned')
               FROM runners GROUP BY pool ORDER BY pool",
        )
        .fetch_all(db)
        .await?;
        let pools: Vec<serde_json::Value> = pools
            .iter()
            .map(|(name, alive, busy)| {
                serde_json::json!({
                    "name": name, "desired": alive, "actual": alive, "idle": 0,
                    "creating": alive - busy, "busy": busy, "queued": 0,
                    "max_runners": 200, "min_idle": 0,
                })
            })
            .collect();
        let now = time::OffsetDateTime::now_utc().unix_timestamp() as f64;
        let queue = Arc::new(serde_json::json!({"as_of": now, "jobs": jobs}));
        let pools = Arc::new(serde_json::json!({ "pools": pools }));
        let router = axum::Router::new()
            .route(
                "/v1/queue",
                axum::routing::get(move || {
                    let q = queue.clone();
                    async move { axum::Json((*q).clone()) }
                }),
            )
            .route(
                "/v1/pools",
                axum::routing::get(move || {
                    let p = pools.clone();
                    async move { axum::Json((*p).clone()) }
                }),
            );
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Self { url, _stop: tx })
    }
}

/// The console, serving in this process.
struct Console {
    url: String,
    port: u16,
    _stop: oneshot::Sender<()>,
}

impl Console {
    async fn start(reader: &str, scaler: &str) -> anyhow::Result<Self> {
        let config = runyard_console::Config {
            database: runyard_config::Database {
                url: reader.to_owned(),
            },
            console_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            scaler_url: scaler.to_owned(),
            allocator_url: String::new(),
            console_tokens: runyard_forge::tokens::Tokens::new("RUNYARD_CONSOLE_TOKENS", [TOKEN]),
            // The /metrics scrape at the end sums up only the last hour.
            console_savings_window: Duration::from_secs(3600),
            ..runyard_console::Config::default()
        };
        let app = runyard_console::App::build(config).await?;
        let addr = app.local_addr();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(app.run(async move {
            let _ = rx.await;
        }));
        Ok(Self {
            url: format!("http://{addr}"),
            port: addr.port(),
            _stop: tx,
        })
    }

    /// The console's own page timings (its histogram's mean per page).
    async fn server_times(&self, http: &HttpClient) -> String {
        let text = match metrics::scrape(http, self.port).await {
            Ok(t) => t,
            Err(e) => return format!("(the console's /metrics could not be read: {e})\n\n"),
        };
        let mut t = Table::new(["page", "requests", "mean server time ms"]).right([1, 2]);
        for page in ["queue", "pools", "job", "workload", "savings", "search"] {
            let label = format!("page=\"{page}\"");
            let sum = metrics::sample(&text, "runyard_console_page_seconds_sum", &[&label]);
            let count = metrics::sample(&text, "runyard_console_page_seconds_count", &[&label]);
            if let (Some(sum), Some(count)) = (sum, count)
                && count > 0.0
            {
                t.row([
                    page.to_owned(),
                    thousands(count as u64),
                    format!("{:.1}", sum / count * 1e3),
                ]);
            }
        }
        format!(
            "The console's own `runyard_console_page_seconds` over the phase's requests (warm-up included):\n\n{t}\n"
        )
    }
}

/// One case's timings.
#[derive(Debug, Default)]
struct Timed {
    /// The first request's time (a cold page: nothing kept, nothing
    /// cached by Postgres for it yet).
    first: Option<f64>,
    page: Vec<f64>,
    /// Timed answers that showed savings kept from an earlier computation.
    kept: usize,
    queries: BTreeMap<&'static str, Vec<f64>>,
    failures: Vec<String>,
}

/// A measured phase.
#[derive(Debug)]
struct Measured {
    /// The console's own page timings.
    server: String,
    cases: Vec<(String, Timed)>,
    /// Cores busy on the machine during the rounds; of them, this process
    /// and Postgres.
    machine: f64,
    ours: f64,
    postgres: f64,
}

fn postgres_cpu() -> Duration {
    procfs::cpu_by_comm("postgres")
        .iter()
        .map(|(_, d)| *d)
        .sum()
}

/// One phase: a console of its own (nothing kept from another phase)
/// timed page by page, round by round; then, the console idle, the
/// queries on their own.
async fn measure(
    args: &Args,
    http: &HttpClient,
    reader: &str,
    scaler: &str,
    db: &PgPool,
    cases: &[Case],
) -> anyhow::Result<Measured> {
    let console = Console::start(reader, scaler).await?;
    let mut timed: Vec<Timed> = cases.iter().map(|_| Timed::default()).collect();
    let rounds = args.warmup + args.requests;
    let mut meter = None;
    for round in 0..rounds {
        if round == args.warmup {
            procfs::settle(args.quiet_below, Duration::from_secs(args.quiet_wait_secs)).await;
            meter = Some((
                Instant::now(),
                procfs::machine_busy().unwrap_or_default(),
                procfs::cpu_time(std::process::id()).unwrap_or_default(),
                postgres_cpu(),
            ));
        }
        let timing = round >= args.warmup;
        for (case, t) in cases.iter().zip(&mut timed) {
            let path = &case.paths[round % case.paths.len()];
            let req = http::Request::get(format!("{}{path}", console.url))
                .header(http::header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                .body(Full::new(Bytes::new()))?;
            let started = Instant::now();
            let answer = send(http, req, Duration::from_secs(60)).await;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            match answer {
                Ok((status, body))
                    if status.as_u16() == case.status
                        && (status.as_u16() != 200 || body.len() > 500) =>
                {
                    if timing {
                        t.page.push(ms);
                        t.kept += usize::from(body.windows(13).any(|w| w == b"id=\"computed\""));
                    }
                    t.first.get_or_insert(ms);
                }
                Ok((status, body)) => t.failures.push(format!(
                    "{path}: {status} {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                )),
                Err(e) => t.failures.push(format!("{path}: {e}")),
            }
        }
        if round + 1 == args.warmup || (timing && (round - args.warmup + 1).is_multiple_of(10)) {
            eprintln!("  pages, round {} of {rounds}", round + 1);
        }
    }
    let load = meter.map(|(t0, m0, o0, p0)| {
        let secs = t0.elapsed().as_secs_f64();
        let cores = |d: Duration| d.as_secs_f64() / secs;
        (
            cores(
                procfs::machine_busy()
                    .unwrap_or_default()
                    .saturating_sub(m0),
            ),
            cores(
                procfs::cpu_time(std::process::id())
                    .unwrap_or_default()
                    .saturating_sub(o0),
            ),
            cores(postgres_cpu().saturating_sub(p0)),
        )
    });
    let server = console.server_times(http).await;
    drop(console);
    for round in 0..rounds {
        let timing = round >= args.warmup;
        for (case, t) in cases.iter().zip(&mut timed) {
            for q in &case.queries[round % case.queries.len()] {
                let started = Instant::now();
                match q.run(db).await {
                    Ok(_) if timing => t
                        .queries
                        .entry(q.name())
                        .or_default()
                        .push(started.elapsed().as_secs_f64() * 1e3),
                    Ok(_) => {}
                    Err(e) => t.failures.push(format!("{}: {e:#}", q.name())),
                }
            }
        }
        if timing && (round - args.warmup + 1).is_multiple_of(10) {
            eprintln!("  queries, round {} of {rounds}", round + 1);
        }
    }
    let (machine, ours, postgres) = load.unwrap_or_default();
    for (case, t) in cases.iter().zip(&timed) {
        if let Some(f) = t.failures.first() {
            bail!(
                "{}: {} failures, the first: {f}",
                case.label,
                t.failures.len()
            );
        }
    }
    Ok(Measured {
        server,
        cases: cases.iter().map(|c| c.label.clone()).zip(timed).collect(),
        machine,
        ours,
        postgres,
    })
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Measured {
    fn report(&self, what: &str) -> String {
        let mut pages = Table::new([
            "page",
            "n",
            "p50 ms",
            "p95 ms",
            "max ms",
            "first ms",
            "kept",
            "≤ 200 ms",
        ])
        .right([1, 2, 3, 4, 5, 6]);
        let mut queries =
            Table::new(["page", "query", "p50 ms", "p95 ms", "max ms"]).right([2, 3, 4]);
        for (label, t) in &self.cases {
            let d = Dist::of(t.page.iter().copied());
            pages.row([
                label.clone(),
                d.len().to_string(),
                ms(d.p50()),
                ms(d.p95()),
                ms(d.max()),
                t.first.map_or_else(|| "-".to_owned(), ms),
                t.kept.to_string(),
                verdict(d.p95() <= TARGET_MS).to_owned(),
            ]);
            for (name, v) in &t.queries {
                let d = Dist::of(v.iter().copied());
                queries.row([
                    label.clone(),
                    (*name).to_owned(),
                    ms(d.p50()),
                    ms(d.p95()),
                    ms(d.max()),
                ]);
            }
        }
        format!(
            "### Pages, {what}\n\nEach request timed at the client over loopback (keep-alive, one at a time; the verdict is on p95; *first* is the phase's first, untimed, request; *kept*: answers showing savings kept from an earlier computation, see `services/console/src/kept.rs`); during the page rounds the machine was busy {:.2} cores: this process (console and client) {:.2}, Postgres {:.2}, other work {:.2}.\n\n{pages}\nThe queries behind them, called directly after the page rounds (the console idle), as many times, through sessions set up as the console's:\n\n{queries}\n",
            self.machine,
            self.ours,
            self.postgres,
            (self.machine - self.ours - self.postgres).max(0.0),
        )
    }
}

fn compare(before: &Measured, after: &Measured) -> String {
    let mut pages = Table::new([
        "page",
        "p50 before → after ms",
        "p95 before → after ms",
        "p50 after / before",
    ])
    .right([3]);
    let mut queries = Table::new([
        "page",
        "query",
        "p50 before → after ms",
        "p95 before → after ms",
        "p50 after / before",
    ])
    .right([4]);
    for ((label, a), (_, b)) in after.cases.iter().zip(&before.cases) {
        let (a_page, b_page) = (
            Dist::of(a.page.iter().copied()),
            Dist::of(b.page.iter().copied()),
        );
        pages.row([
            label.clone(),
            format!("{} → {}", ms(b_page.p50()), ms(a_page.p50())),
            format!("{} → {}", ms(b_page.p95()), ms(a_page.p95())),
            format!("{:.2}×", a_page.p50() / b_page.p50()),
        ]);
        for (name, v) in &a.queries {
            let a_q = Dist::of(v.iter().copied());
            let b_q = Dist::of(b.queries.get(name).into_iter().flatten().copied());
            queries.row([
                label.clone(),
                (*name).to_owned(),
                format!("{} → {}", ms(b_q.p50()), ms(a_q.p50())),
                format!("{} → {}", ms(b_q.p95()), ms(a_q.p95())),
                format!("{:.2}×", a_q.p50() / b_q.p50()),
            ]);
        }
    }
    format!("### What the indexes buy (same run)\n\n{pages}\n{queries}\n")
}

/// Drops `names`, returning their definitions.
async fn drop_indexes(db: &PgPool, names: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut saved = Vec::new();
    for name in names {
        let def: Option<String> = sqlx::query_scalar(
            "SELECT pg_get_indexdef(c.oid) FROM pg_class c
              WHERE c.relkind = 'i' AND c.relname = $1",
        )
        .bind(name)
        .fetch_optional(db)
        .await?;
        let Some(def) = def else {
            bail!("no index {name}");
        };
        saved.push((name.clone(), def));
    }
    for (name, _) in &saved {
        eprintln!("dropping {name} for the comparison");
        sqlx::query(&format!("DROP INDEX \"{name}\""))
            .execute(db)
            .await?;
    }
    Ok(saved)
}

async fn restore_indexes(db: &PgPool, saved: &[(String, String)]) -> anyhow::Result<()> {
    if saved.is_empty() {
        return Ok(());
    }
    for (name, def) in saved {
        eprintln!("putting {name} back");
        sqlx::query(def).execute(db).await?;
    }
    sqlx::query("ANALYZE").execute(db).await?;
    Ok(())
}
