//! `projection`: the job-tracker benchmark (docs/benchmarks.md,
//! "job-tracker"). Run it through `scripts/bench-tracker.sh`.
//!
//! Starts its own nats-server and pre-loads the event stream with synthetic
//! job lifecycles (queued, in progress, completed, usage; shuffled within
//! small windows), then in the same process:
//!
//! 1. **baseline**: writes the rows those events project to (`applied_events`,
//!    `jobs`, `usage_samples`, derived with the tracker's own [`Delta`]) into a
//!    fresh database with plain multi-row `INSERT ... VALUES ... ON CONFLICT`
//!    statements through sqlx, one transaction per batch, no NATS;
//! 2. **tracker SQL in-process**: the tracker's [`apply_batch`] on the same
//!    events, already decoded, no NATS (splits the gap between the baseline
//!    and the real tracker into "SQL shape" and "everything around it");
//! 3. **tracker**: the real `runyard-job-tracker` binary against the
//!    pre-loaded stream and a fresh database, timed until `applied_events`
//!    holds every event, with its RSS, every process's CPU and the tracker's
//!    own apply-latency metrics;
//! 4. **rebuild**: `runyard-job-tracker rebuild --into <db>` over a second,
//!    larger stream (1,000,000 events by default).
//!
//! Prints markdown for docs/benchmarks.md on stdout; progress on stderr.
//! Every wait is bounded; every database it creates is dropped at the end.

// The report is this program's output.
#![allow(clippy::print_stdout)]

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use clap::Parser;
use futures::StreamExt as _;
use prost::Message as _;
use rand::SeedableRng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use runyard_bench::process::{Service, service_command, stderr_stdio};
use runyard_bench::report::{Table, median, mib, rate as thousands, verdict};
use runyard_bench::{args, metrics, procfs};
use runyard_bus::{Bus, StreamSettings, TraceParent};
use runyard_events::{Event, Namespace};
use runyard_job_tracker::apply::{Incoming, apply_batch};
use runyard_job_tracker::projection::{Delta, JobRow, UsageRow};
use runyard_testkit::{NatsServer, TestDb, synth, unique_namespace};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, QueryBuilder};
use tokio::process::Command;

/// How often the tracker's progress, RSS and CPU are sampled.
const POLL: Duration = Duration::from_millis(100);
/// Most rows in one plain `INSERT` (37 parameters a job row; Postgres takes
/// at most 65,535 parameters a statement).
const ROWS_PER_INSERT: usize = 1000;
/// The targets of the issue.
const TARGET_RATE: f64 = 10_000.0;
const TARGET_RATIO: f64 = 0.30;
const TARGET_REBUILD_EVENTS: f64 = 1_000_000.0;
const TARGET_REBUILD_SECS: f64 = 180.0;
const TARGET_RSS_MIB: f64 = 128.0;
/// The tracker's default `RUNYARD_TRACKER_BATCH_SIZE`, at which the targets
/// are judged.
const DEFAULT_BATCH: usize = 1000;

/// job-tracker benchmark: steady projection rate of the real tracker against
/// plain multi-row INSERTs of the same rows, and a rebuild from the stream.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Events pre-loaded for the steady runs (4 per job).
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// Tracker batch sizes (`RUNYARD_TRACKER_BATCH_SIZE`), comma-separated;
    /// each gets a fresh database and a fresh durable consumer.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    batch_sizes: Vec<usize>,
    /// Events per transaction of the baseline and of the in-process run.
    #[arg(long, default_value_t = 1000)]
    baseline_batch: usize,
    /// Rounds of baseline + in-process + tracker runs (the ratio of each
    /// round compares runs minutes apart, not the noise of a whole session).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Events pre-loaded for the rebuild (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    rebuild_events: usize,
    /// `rebuild --batch-size` (the binary's default when unset).
    #[arg(long)]
    rebuild_batch_size: Option<usize>,
    /// The `runyard-job-tracker` binary.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/runyard-job-tracker"))]
    tracker_bin: PathBuf,
    /// `RUST_LOG` of the tracker processes.
    #[arg(long, default_value = "warn")]
    tracker_log: String,
    /// Extra environment of the tracker processes, `KEY=VALUE` (repeatable),
    /// e.g. `RUNYARD_TRACKER_BATCH_WAIT=10ms`.
    #[arg(long = "tracker-env", value_parser = args::key_value)]
    tracker_env: Vec<(String, String)>,
    /// Outstanding acked publishes while pre-loading.
    #[arg(long, default_value_t = 512)]
    publish_concurrency: usize,
    /// Events are shuffled within windows of this many (a few jobs' events
    /// arrive interleaved and out of order).
    #[arg(long, default_value_t = 256)]
    shuffle_window: usize,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Before each timed phase, wait until the whole machine was busy less
    /// than this many cores over a second (other work sharing it calms down)...
    #[arg(long, default_value_t = 0.5)]
    quiet_below: f64,
    /// ...but at most this many seconds.
    #[arg(long, default_value_t = 30)]
    quiet_wait_secs: u64,
    /// Upper bound of any single phase, seconds.
    #[arg(long, default_value_t = 600)]
    run_limit_secs: u64,
    #[command(flatten)]
    cargo: args::Cargo,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.events > 0, "--events must be positive");
    ensure!(
        args.batch_sizes.iter().all(|&b| b > 0) && args.baseline_batch > 0,
        "batch sizes must be positive"
    );
    ensure!(
        args.tracker_bin.exists(),
        "no tracker binary at {} (build it: cargo build --release -p runyard-job-tracker)",
        args.tracker_bin.display()
    );
    runyard_telemetry::install_crypto_provider();
    let nats = NatsServer::start().await;
    let nats_pid = procfs::find_child(std::process::id(), "nats-server");
    let mut dbs = Vec::new();
    let result = Box::pin(bench(&args, &nats, nats_pid, &mut dbs)).await;
    for db in &dbs {
        db.drop_db().await;
    }
    let report = result?;
    println!("{report}");
    Ok(())
}

/// Everything measured, for the report.
#[derive(Debug, Default)]
struct Results {
    events: usize,
    bytes_per_event: f64,
    publish: Rate,
    decode_us: f64,
    delta_us: f64,
    rounds: Vec<Round>,
    rebuild: Option<RebuildRun>,
}

/// A count over a time.
#[derive(Debug, Default, Clone, Copy)]
struct Rate {
    events: usize,
    took: Duration,
}

impl Rate {
    fn per_sec(self) -> f64 {
        self.events as f64 / self.took.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Default)]
struct Round {
    baseline: Rate,
    baseline_cpu: Cpu,
    in_process: Rate,
    in_process_cpu: Cpu,
    trackers: Vec<TrackerRun>,
}

async fn bench(
    args: &Args,
    nats: &NatsServer,
    nats_pid: Option<u32>,
    dbs: &mut Vec<TestDb>,
) -> anyhow::Result<Results> {
    let limit = Duration::from_secs(args.run_limit_secs);
    let mut results = Results {
        events: args.events,
        ..Results::default()
    };

    // The steady-run stream, and the events kept for the in-process runs.
    let ns = unique_namespace();
    let bus = stream_bus(&nats.url(), &ns).await?;
    let events: Vec<Event> = synth_events(args.events, args.shuffle_window, args.seed).collect();
    results.bytes_per_event =
        events.iter().map(|e| e.encoded_len()).sum::<usize>() as f64 / events.len() as f64;
    eprintln!(
        "pre-loading {} events into {}",
        events.len(),
        ns.events_stream()
    );
    results.publish = publish_all(&bus, events.iter(), args.publish_concurrency, limit).await?;
    expect_stream_len(&bus, events.len()).await?;
    (results.decode_us, results.delta_us) = decode_and_delta_cost(&events, args.baseline_batch)?;

    let rows = rows_of(&events, args.baseline_batch)?;
    let incoming: Vec<Vec<Incoming>> = events
        .chunks(args.baseline_batch)
        .enumerate()
        .map(|(c, chunk)| {
            chunk
                .iter()
                .enumerate()
                .map(|(i, e)| Incoming {
                    seq: (c * args.baseline_batch + i + 1) as u64,
                    event: e.clone(),
                    traceparent: None,
                })
                .collect()
        })
        .collect();
    drop(events);

    for round in 1..=args.rounds {
        eprintln!(
            "round {round}/{}: baseline (plain multi-row INSERT)",
            args.rounds
        );
        let mut r = Round::default();
        let db = fresh_db(dbs).await?;
        let pool = connect(&db.url).await?;
        wait_for_quiet(args).await;
        let mut meter = CpuMeter::start(nats_pid);
        r.baseline = Rate {
            events: args.events,
            took: plain_insert(&pool, &rows).await?,
        };
        r.baseline_cpu = meter.stop(None);
        expect_applied(&pool, args.events).await?;
        pool.close().await;
        db.drop_db().await;
        eprintln!("  {:.0} events/s", r.baseline.per_sec());

        eprintln!("round {round}/{}: tracker SQL in-process", args.rounds);
        let db = fresh_db(dbs).await?;
        let pool = connect(&db.url).await?;
        wait_for_quiet(args).await;
        let mut meter = CpuMeter::start(nats_pid);
        let started = Instant::now();
        for batch in &incoming {
            apply_batch(&pool, batch).await?;
        }
        r.in_process = Rate {
            events: args.events,
            took: started.elapsed(),
        };
        r.in_process_cpu = meter.stop(None);
        expect_applied(&pool, args.events).await?;
        pool.close().await;
        db.drop_db().await;
        eprintln!("  {:.0} events/s", r.in_process.per_sec());

        for &batch in &args.batch_sizes {
            eprintln!(
                "round {round}/{}: tracker binary, batch size {batch}",
                args.rounds
            );
            let run = run_tracker(args, &nats.url(), &bus, batch, nats_pid, dbs).await?;
            eprintln!(
                "  steady {:.0} events/s, spawn to done {:.1} s, VmHWM {} MiB",
                run.steady,
                run.done.as_secs_f64(),
                mib(run.hwm_kib)
            );
            r.trackers.push(run);
        }
        results.rounds.push(r);
    }
    drop(incoming);
    drop(rows);

    if args.rebuild_events > 0 {
        results.rebuild = Some(run_rebuild(args, &nats.url(), nats_pid, dbs).await?);
    }
    Ok(results)
}

// ---------------------------------------------------------------------------
// Events and the stream

/// `n` synthetic events: job lifecycles (4 events each), shuffled within
/// windows of `window` events, each job created a second after the previous.
fn synth_events(n: usize, window: usize, seed: u64) -> impl Iterator<Item = Event> {
    let jobs_per_window = (window / 4).max(1) as u64;
    let mut rng = StdRng::seed_from_u64(seed);
    let base = synth::base_time();
    (0u64..)
        .flat_map(move |w| {
            let first = w * jobs_per_window + 1;
            let mut events: Vec<Event> = (first..first + jobs_per_window)
                .flat_map(|j| synth::lifecycle(j, base + time::Duration::seconds(j as i64)))
                .collect();
            events.shuffle(&mut rng);
            events
        })
        .take(n)
}

async fn stream_bus(url: &str, ns: &Namespace) -> anyhow::Result<Bus> {
    let bus = Bus::connect(url, ns.clone(), "tracker-bench", false).await?;
    bus.ensure_streams(&StreamSettings::default()).await?;
    Ok(bus)
}

/// Publishes every event with `Nats-Msg-Id` = its id, `concurrency` acks
/// outstanding; a failed publish is retried (the id makes that safe).
async fn publish_all<E: Borrow<Event>>(
    bus: &Bus,
    events: impl Iterator<Item = E>,
    concurrency: usize,
    limit: Duration,
) -> anyhow::Result<Rate> {
    let tp = TraceParent::new_root();
    let started = Instant::now();
    let mut acks = futures::stream::iter(events)
        .map(|e| {
            let tp = &tp;
            async move {
                let mut last = None;
                for attempt in 0..5u64 {
                    match bus.publish_event(e.borrow(), tp).await {
                        Ok(_) => return Ok(()),
                        Err(error) => last = Some(error),
                    }
                    tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
                }
                Err(anyhow!("publishing {}: {:?}", e.borrow().id, last))
            }
        })
        .buffer_unordered(concurrency.max(1));
    let mut done = 0usize;
    let mut reported = Instant::now();
    while let Some(r) = acks.next().await {
        r?;
        done += 1;
        if reported.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "  published {done} ({:.0}/s)",
                done as f64 / started.elapsed().as_secs_f64()
            );
            reported = Instant::now();
        }
        ensure!(started.elapsed() < limit, "pre-loading took over {limit:?}");
    }
    let rate = Rate {
        events: done,
        took: started.elapsed(),
    };
    eprintln!("  published {done} in {:.1} s", rate.took.as_secs_f64());
    Ok(rate)
}

async fn expect_stream_len(bus: &Bus, n: usize) -> anyhow::Result<()> {
    let mut stream = bus
        .jetstream()
        .get_stream(bus.namespace().events_stream())
        .await?;
    let held = stream.info().await?.state.messages;
    ensure!(
        held == n as u64,
        "the stream holds {held} messages, expected {n}"
    );
    Ok(())
}

/// Single-threaded cost of decoding an event and of adding it to a
/// [`Delta`], microseconds per event.
fn decode_and_delta_cost(events: &[Event], batch: usize) -> anyhow::Result<(f64, f64)> {
    let encoded: Vec<bytes::Bytes> = events
        .iter()
        .map(|e| bytes::Bytes::from(e.encode_to_vec()))
        .collect();
    let started = Instant::now();
    for b in &encoded {
        std::hint::black_box(Event::decode(b.clone())?);
    }
    let decode = started.elapsed();
    let started = Instant::now();
    for chunk in events.chunks(batch) {
        let mut delta = Delta::default();
        for e in chunk {
            delta.add(e).map_err(|e| anyhow!("unprojectable: {e}"))?;
        }
        std::hint::black_box(delta.rows());
    }
    let delta = started.elapsed();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / events.len() as f64;
    Ok((per(decode), per(delta)))
}

// ---------------------------------------------------------------------------
// Postgres

/// Waits, bounded by `--quiet-wait-secs`, until the machine is quieter than
/// `--quiet-below` cores.
async fn wait_for_quiet(args: &Args) {
    procfs::settle(args.quiet_below, Duration::from_secs(args.quiet_wait_secs)).await;
}

async fn fresh_db(dbs: &mut Vec<TestDb>) -> anyhow::Result<TestDb> {
    let db = TestDb::new();
    dbs.push(db.clone());
    runyard_store::migrate(&db.url)
        .await
        .context("migrating a bench database")?;
    Ok(db)
}

async fn connect(url: &str) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await?)
}

async fn count_applied(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM applied_events")
        .fetch_one(pool)
        .await
}

async fn expect_applied(pool: &PgPool, n: usize) -> anyhow::Result<()> {
    let got = count_applied(pool).await?;
    ensure!(
        got == n as i64,
        "applied_events holds {got} rows, expected {n}"
    );
    Ok(())
}

/// The rows one batch of events projects to.
#[derive(Debug)]
struct Rows {
    applied: Vec<(String, i64)>,
    jobs: Vec<JobRow>,
    usage: Vec<UsageRow>,
}

/// The baseline's input: per batch of `batch` events (in stream order), the
/// rows the projection writes for them, derived with the tracker's [`Delta`].
fn rows_of(events: &[Event], batch: usize) -> anyhow::Result<Vec<Rows>> {
    let mut out = Vec::with_capacity(events.len().div_ceil(batch));
    for (c, chunk) in events.chunks(batch).enumerate() {
        let mut delta = Delta::default();
        let mut applied = Vec::with_capacity(chunk.len());
        for (i, e) in chunk.iter().enumerate() {
            delta.add(e).map_err(|e| anyhow!("unprojectable: {e}"))?;
            applied.push((e.id.clone(), (c * batch + i + 1) as i64));
        }
        ensure!(
            delta.pipelines.is_empty(),
            "synthetic events have no pipelines"
        );
        let mut jobs: Vec<JobRow> = delta.jobs.into_values().collect();
        jobs.sort_by(|a, b| {
            (&a.forge, &a.instance, a.job_id).cmp(&(&b.forge, &b.instance, b.job_id))
        });
        let mut usage: Vec<UsageRow> = delta.usage.into_values().collect();
        usage.sort_by(|a, b| {
            (&a.forge, &a.instance, a.job_id, a.attempt).cmp(&(
                &b.forge,
                &b.instance,
                b.job_id,
                b.attempt,
            ))
        });
        out.push(Rows {
            applied,
            jobs,
            usage,
        });
    }
    Ok(out)
}

/// Every `jobs` column in binding order: keys, the tracker's picked
/// columns (status first), then times and rank.
fn job_columns() -> Vec<&'static str> {
    ["forge", "instance", "job_id"]
        .into_iter()
        .chain(runyard_job_tracker::apply::JOB_PICKED.iter().copied())
        .chain([
            "created_at",
            "queued_at",
            "started_at",
            "completed_at",
            "first_seen_at",
            "last_event_at",
            "rank_status",
            "rank_at",
            "rank_event",
        ])
        .collect()
}

const USAGE_COLUMNS: &[&str] = &[
    "forge",
    "instance",
    "job_id",
    "attempt",
    "event_id",
    "ref",
    "project",
    "workload",
    "workload_key",
    "peak_memory_bytes",
    "memory_request_bytes",
    "memory_limit_bytes",
    "cpu_seconds",
    "wall_seconds",
    "cpu_request_millicores",
    "oom_killed",
    "exit_code",
    "reported_at",
    "cgroup",
];

/// The baseline: every batch in one transaction of plain multi-row
/// `INSERT ... VALUES (...), (...) ON CONFLICT ...` statements (at most
/// [`ROWS_PER_INSERT`] rows each). Jobs seen in an earlier batch are updated
/// in place (`DO UPDATE SET col = EXCLUDED.col`); the tracker's
/// order-independent merge is not part of the baseline.
async fn plain_insert(pool: &PgPool, batches: &[Rows]) -> anyhow::Result<Duration> {
    let job_columns = job_columns();
    let job_sql = format!("INSERT INTO jobs ({}) ", job_columns.join(", "));
    let job_update = format!(
        " ON CONFLICT (forge, instance, job_id) DO UPDATE SET {}",
        job_columns[3..]
            .iter()
            .map(|c| format!("{c} = EXCLUDED.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let usage_sql = format!("INSERT INTO usage_samples ({}) ", USAGE_COLUMNS.join(", "));
    let started = Instant::now();
    for batch in batches {
        let mut tx = pool.begin().await?;
        for chunk in batch.applied.chunks(ROWS_PER_INSERT) {
            let mut q =
                QueryBuilder::<Postgres>::new("INSERT INTO applied_events (event_id, stream_seq) ");
            q.push_values(chunk, |mut b, (id, seq)| {
                b.push_bind(id.as_str()).push_bind(*seq);
            });
            q.push(" ON CONFLICT (event_id) DO NOTHING");
            q.build().execute(&mut *tx).await?;
        }
        for chunk in batch.jobs.chunks(ROWS_PER_INSERT) {
            let mut q = QueryBuilder::<Postgres>::new(job_sql.as_str());
            q.push_values(chunk, |mut b, j| {
                b.push_bind(j.forge.as_str())
                    .push_bind(j.instance.as_str())
                    .push_bind(j.job_id)
                    .push_bind(j.status)
                    .push_bind(j.project.as_deref())
                    .push_bind(j.project_id)
                    .push_bind(j.pipeline_id)
                    .push_bind(j.run_attempt)
                    .push_bind(j.name.as_deref())
                    .push_bind(j.stage.as_deref())
                    .push_bind(j.workflow_name.as_deref())
                    .push_bind(j.labels.as_ref())
                    .push_bind(j.forge_status.as_deref())
                    .push_bind(j.conclusion.as_deref())
                    .push_bind(j.failure_reason.as_deref())
                    .push_bind(j.runner_id)
                    .push_bind(j.runner_name.as_deref())
                    .push_bind(j.runner_group_id)
                    .push_bind(j.runner_group_name.as_deref())
                    .push_bind(j.r#ref.as_deref())
                    .push_bind(j.sha.as_deref())
                    .push_bind(j.tag)
                    .push_bind(j.html_url.as_deref())
                    .push_bind(j.organization.as_deref())
                    .push_bind(j.enterprise.as_deref())
                    .push_bind(j.allow_failure)
                    .push_bind(j.duration_seconds)
                    .push_bind(j.queued_duration_seconds)
                    .push_bind(j.created_at)
                    .push_bind(j.queued_at)
                    .push_bind(j.started_at)
                    .push_bind(j.completed_at)
                    .push_bind(j.first_seen_at)
                    .push_bind(j.last_event_at)
                    .push_bind(j.rank_status)
                    .push_bind(j.rank_at)
                    .push_bind(j.rank_event.as_str());
            });
            q.push(job_update.as_str());
            q.build().execute(&mut *tx).await?;
        }
        for chunk in batch.usage.chunks(ROWS_PER_INSERT) {
            let mut q = QueryBuilder::<Postgres>::new(usage_sql.as_str());
            q.push_values(chunk, |mut b, u| {
                b.push_bind(u.forge.as_str())
                    .push_bind(u.instance.as_str())
                    .push_bind(u.job_id)
                    .push_bind(u.attempt)
                    .push_bind(u.event_id.as_str())
                    .push_bind(u.r#ref.as_deref())
                    .push_bind(u.project.as_deref())
                    .push_bind(&u.workload)
                    .push_bind(u.workload_key.as_str())
                    .push_bind(u.peak_memory_bytes)
                    .push_bind(u.memory_request_bytes)
                    .push_bind(u.memory_limit_bytes)
                    .push_bind(u.cpu_seconds)
                    .push_bind(u.wall_seconds)
                    .push_bind(u.cpu_request_millicores)
                    .push_bind(u.oom_killed)
                    .push_bind(u.exit_code)
                    .push_bind(u.reported_at)
                    .push_bind(u.cgroup.as_deref());
            });
            q.push(" ON CONFLICT (forge, instance, job_id, attempt) DO NOTHING");
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
    }
    Ok(started.elapsed())
}

// ---------------------------------------------------------------------------
// The real binary

/// One run of the tracker binary over the pre-loaded stream.
#[derive(Debug, Default)]
struct TrackerRun {
    batch: usize,
    events: usize,
    /// From spawn until `applied_events` held every event.
    done: Duration,
    /// From spawn until the first applied event was seen.
    first: Duration,
    /// Events per second between 10 % and 90 % applied.
    steady: f64,
    hwm_kib: u64,
    cpu: Cpu,
    /// Sum of the tracker's own apply-and-commit latencies, seconds.
    apply_secs: f64,
    /// Batches the tracker applied, and their mean size.
    batches: f64,
    mean_batch: f64,
}

fn tracker_command(args: &Args, nats_url: &str, ns: &Namespace, db_url: &str) -> Command {
    let mut cmd = service_command(&args.tracker_bin, nats_url, ns.as_str(), &args.tracker_log);
    cmd.env("RUNYARD_DATABASE_URL", db_url)
        .envs(args.tracker_env.iter().map(|(k, v)| (k, v)))
        .stdout(stderr_stdio())
        .stderr(Stdio::inherit());
    cmd
}

async fn run_tracker(
    args: &Args,
    nats_url: &str,
    bus: &Bus,
    batch: usize,
    nats_pid: Option<u32>,
    dbs: &mut Vec<TestDb>,
) -> anyhow::Result<TrackerRun> {
    let limit = Duration::from_secs(args.run_limit_secs);
    let n = args.events;
    // A fresh durable consumer: it starts at the beginning of the stream.
    let stream = bus
        .jetstream()
        .get_stream(bus.namespace().events_stream())
        .await?;
    let _ = stream.delete_consumer(runyard_job_tracker::CONSUMER).await;

    // The tracker creates and migrates its database itself.
    let db = TestDb::new();
    dbs.push(db.clone());
    let port = runyard_testkit::free_port();
    let mut cmd = tracker_command(args, nats_url, bus.namespace(), &db.url);
    cmd.env("RUNYARD_TRACKER_HTTP_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUNYARD_TRACKER_BATCH_SIZE", batch.to_string());
    wait_for_quiet(args).await;
    let mut meter = CpuMeter::start(nats_pid);
    let started = Instant::now();
    let mut tracker = Service::spawn(&mut cmd)?;
    let pid = tracker.pid;

    // Progress comes from the tracker's own counter of applied events (it
    // moves right after each commit, and reading it costs Postgres nothing);
    // `count(*)` of `applied_events` is the fallback and the final word.
    let http = runyard_bench::http::client(1);
    let mut pool: Option<PgPool> = None;
    let mut samples: Vec<(Duration, i64)> = Vec::new();
    let mut max_rss_kib = 0;
    let mut last_report = Instant::now();
    loop {
        if let Some(status) = tracker.child.try_wait()? {
            bail!("the tracker exited early: {status}");
        }
        if let Ok(m) = procfs::memory(pid) {
            max_rss_kib = max_rss_kib.max(m.rss_kib);
        }
        meter.sample();
        let applied = match metrics::scrape(&http, port).await.ok().and_then(|m| {
            metrics::sample(&m, "runyard_tracker_events_total", &["result=\"applied\""])
        }) {
            Some(v) => v as i64,
            None => db_count(&db.url, &mut pool).await.unwrap_or(0),
        };
        samples.push((started.elapsed(), applied));
        if applied >= n as i64 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!("  applied {applied}/{n}");
            last_report = Instant::now();
        }
        if started.elapsed() > limit {
            let _ = tracker.child.start_kill();
            bail!("the tracker did not apply {n} events within {limit:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    let done = started.elapsed();
    let memory = procfs::memory(pid).unwrap_or_default();
    let cpu = meter.stop(Some(pid));
    let exposition = metrics::scrape(&http, port).await.unwrap_or_default();
    // The projection itself must say so too.
    let confirmed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if db_count(&db.url, &mut pool).await.ok() == Some(n as i64) {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    // SIGTERM: the tracker finishes its batch and exits.
    if !tracker.stop(Duration::from_secs(15)).await {
        eprintln!("  the tracker did not stop on SIGTERM; killed it");
    }
    if let Some(p) = pool {
        p.close().await;
    }
    ensure!(
        confirmed.is_ok(),
        "the tracker reported {n} events applied but applied_events disagrees"
    );
    db.drop_db().await;

    let first = samples
        .iter()
        .find(|(_, c)| *c > 0)
        .map_or(done, |(t, _)| *t);
    let at = |share: f64| {
        samples
            .iter()
            .find(|(_, c)| *c as f64 >= share * n as f64)
            .copied()
    };
    let steady = match (at(0.1), at(0.9)) {
        (Some((t1, c1)), Some((t2, c2))) if t2 > t1 => (c2 - c1) as f64 / (t2 - t1).as_secs_f64(),
        _ => n as f64 / done.as_secs_f64(),
    };
    let metric = |name: &str| metrics::sample(&exposition, name, &[]).unwrap_or(f64::NAN);
    let batches = metric("runyard_tracker_batch_size_count");
    Ok(TrackerRun {
        batch,
        events: n,
        done,
        first,
        steady,
        hwm_kib: memory.hwm_kib.max(max_rss_kib),
        cpu,
        apply_secs: metric("runyard_tracker_apply_latency_seconds_sum"),
        batches,
        mean_batch: metric("runyard_tracker_batch_size_sum") / batches,
    })
}

/// `count(*)` of `applied_events`, connecting on first use; an error until
/// the database and its tables exist.
async fn db_count(url: &str, pool: &mut Option<PgPool>) -> anyhow::Result<i64> {
    if pool.is_none() {
        *pool = Some(
            PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect(url)
                .await?,
        );
    }
    let p = pool.as_ref().context("no pool")?;
    Ok(count_applied(p).await?)
}

/// One rebuild of a pre-loaded stream by the real binary.
#[derive(Debug, Default)]
struct RebuildRun {
    events: usize,
    publish: Rate,
    took: Duration,
    hwm_kib: u64,
    cpu: Cpu,
    batch: Option<usize>,
}

async fn run_rebuild(
    args: &Args,
    nats_url: &str,
    nats_pid: Option<u32>,
    dbs: &mut Vec<TestDb>,
) -> anyhow::Result<RebuildRun> {
    let limit = Duration::from_secs(args.run_limit_secs);
    let n = args.rebuild_events;
    let ns = unique_namespace();
    let bus = stream_bus(nats_url, &ns).await?;
    eprintln!(
        "rebuild: pre-loading {n} events into {}",
        ns.events_stream()
    );
    let publish = publish_all(
        &bus,
        synth_events(n, args.shuffle_window, args.seed.wrapping_add(1)),
        args.publish_concurrency,
        limit,
    )
    .await?;
    expect_stream_len(&bus, n).await?;

    // `rebuild` never touches the live database without `--swap`; it only
    // names the server. The target is dropped and migrated by the rebuild.
    let live = TestDb::new();
    let target = TestDb::new();
    dbs.push(live.clone());
    dbs.push(target.clone());
    let mut cmd = tracker_command(args, nats_url, &ns, &live.url);
    cmd.arg("rebuild").arg("--into").arg(&target.name);
    if let Some(b) = args.rebuild_batch_size {
        cmd.arg("--batch-size").arg(b.to_string());
    }
    eprintln!(
        "rebuild: runyard-job-tracker rebuild --into {}",
        target.name
    );
    wait_for_quiet(args).await;
    let mut meter = CpuMeter::start(nats_pid);
    let started = Instant::now();
    let Service { mut child, pid } = Service::spawn(&mut cmd)?;
    let mut hwm_kib = 0;
    let mut last_report = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        // VmHWM only grows; the last reading is within one poll of the end.
        if let Ok(m) = procfs::memory(pid) {
            hwm_kib = hwm_kib.max(m.hwm_kib.max(m.rss_kib));
        }
        meter.sample();
        if started.elapsed() > limit {
            let _ = child.start_kill();
            bail!("the rebuild did not finish within {limit:?}");
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "  rebuilding: {:.0} s, RSS {} MiB",
                started.elapsed().as_secs_f64(),
                mib(hwm_kib)
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    // The rebuild has been reaped: its CPU is in our children's time.
    let cpu = meter.stop(None);
    ensure!(status.success(), "the rebuild failed: {status}");
    let pool = connect(&target.url).await?;
    expect_applied(&pool, n).await?;
    pool.close().await;
    target.drop_db().await;
    live.drop_db().await;
    // The rebuild stream's storage is no longer needed.
    let _ = bus.jetstream().delete_stream(ns.events_stream()).await;
    eprintln!(
        "  rebuilt {n} events in {:.1} s, VmHWM {} MiB",
        took.as_secs_f64(),
        mib(hwm_kib)
    );
    Ok(RebuildRun {
        events: n,
        publish,
        took,
        hwm_kib,
        cpu,
        batch: args.rebuild_batch_size,
    })
}

// ---------------------------------------------------------------------------
// CPU and memory

/// CPU consumed by the processes involved, and by the whole machine.
#[derive(Debug, Default, Clone, Copy)]
struct Cpu {
    /// The tracker (or the reaped rebuild, through our children's time).
    tracker: Duration,
    nats: Duration,
    /// Every process named `postgres` (the whole cluster).
    postgres: Duration,
    /// This benchmark process.
    bench: Duration,
    machine: Duration,
}

/// Measures [`Cpu`] over a phase. Postgres backends come and go (a pool
/// closing, a rebuild exiting), so each is followed by pid and keeps the last
/// reading taken while it was alive: call [`CpuMeter::sample`] while waiting.
#[derive(Debug)]
struct CpuMeter {
    nats_pid: Option<u32>,
    start: Cpu,
    /// Per postgres pid: CPU at the start (zero for later ones), latest.
    postgres: HashMap<u32, (Duration, Duration)>,
}

impl CpuMeter {
    fn start(nats_pid: Option<u32>) -> Self {
        let me = std::process::id();
        Self {
            nats_pid,
            start: Cpu {
                tracker: procfs::children_cpu_time(me).unwrap_or_default(),
                nats: nats_pid.and_then(cpu).unwrap_or_default(),
                postgres: Duration::ZERO,
                bench: cpu(me).unwrap_or_default(),
                machine: procfs::machine_busy().unwrap_or_default(),
            },
            postgres: procfs::cpu_by_comm("postgres")
                .into_iter()
                .map(|(pid, t)| (pid, (t, t)))
                .collect(),
        }
    }

    fn sample(&mut self) {
        for (pid, t) in procfs::cpu_by_comm("postgres") {
            self.postgres
                .entry(pid)
                .and_modify(|e| e.1 = t)
                .or_insert((Duration::ZERO, t));
        }
    }

    /// CPU since the start; `tracker` is a live child's pid (a reaped
    /// child's time is in our children's time).
    fn stop(&mut self, tracker: Option<u32>) -> Cpu {
        self.sample();
        let me = std::process::id();
        Cpu {
            tracker: (tracker.and_then(cpu).unwrap_or_default()
                + procfs::children_cpu_time(me).unwrap_or_default())
            .saturating_sub(self.start.tracker),
            nats: self
                .nats_pid
                .and_then(cpu)
                .unwrap_or_default()
                .saturating_sub(self.start.nats),
            postgres: self
                .postgres
                .values()
                .map(|(start, last)| last.saturating_sub(*start))
                .sum(),
            bench: cpu(me).unwrap_or_default().saturating_sub(self.start.bench),
            machine: procfs::machine_busy()
                .unwrap_or_default()
                .saturating_sub(self.start.machine),
        }
    }
}

/// User + system time of `pid`, when it runs.
fn cpu(pid: u32) -> Option<Duration> {
    procfs::cpu_time(pid).ok()
}

impl Cpu {
    /// Busy time of everything else on the machine.
    fn other(&self) -> Duration {
        self.machine.saturating_sub(self.ours())
    }

    /// Busy time of the processes the benchmark runs or drives.
    fn ours(&self) -> Duration {
        self.tracker + self.nats + self.postgres + self.bench
    }
}

// ---------------------------------------------------------------------------
// The report

/// Microseconds of CPU per event.
fn us(d: Duration, events: usize) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6 / events.max(1) as f64)
}

impl std::fmt::Display for Results {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} events ({} jobs × queued, in_progress, completed, usage; shuffled in windows of a few jobs), \
             {:.0} bytes each on the wire; pre-loaded at {} events/s (acked publishes). {} cores.\n",
            thousands(self.events as f64),
            thousands(self.events.div_ceil(4) as f64),
            self.bytes_per_event,
            thousands(self.publish.per_sec()),
            std::thread::available_parallelism().map_or(0, usize::from),
        );
        let _ = writeln!(s, "### Steady projection\n");
        let mut t = Table::new([
            "round",
            "baseline: plain INSERT (events/s)",
            "tracker SQL in-process (events/s)",
            "tracker batch",
            "tracker steady (events/s)",
            "spawn → all applied (events/s)",
            "ratio to baseline",
            "tracker VmHWM (MiB)",
        ])
        .right(1..8);
        for (i, r) in self.rounds.iter().enumerate() {
            for t_run in &r.trackers {
                t.row([
                    (i + 1).to_string(),
                    thousands(r.baseline.per_sec()),
                    thousands(r.in_process.per_sec()),
                    t_run.batch.to_string(),
                    format!("**{}**", thousands(t_run.steady)),
                    thousands(t_run.events as f64 / t_run.done.as_secs_f64()),
                    format!("**{:.2}**", t_run.steady / r.baseline.per_sec()),
                    mib(t_run.hwm_kib),
                ]);
            }
        }
        let _ = write!(s, "{t}");
        let _ = writeln!(
            s,
            "\nSteady = events applied between 10 % and 90 % of the stream over the time between; \
             spawn → all applied includes start-up (migrations, connecting, the consumer).\n"
        );

        let _ = writeln!(s, "### Where the time goes\n");
        let mut t = Table::new([
            "run",
            "wall (s)",
            "tracker in apply + commit (s)",
            "batches × mean size",
            "CPU µs/event: tracker",
            "nats-server",
            "postgres",
            "bench",
            "all of these",
            "other load",
            "machine busy (cores)",
        ])
        .right(1..11);
        // CPU µs per event of each process, ours together and the rest.
        let cpu_cells = |cpu: &Cpu, n: usize| {
            [
                us(cpu.nats, n),
                us(cpu.postgres, n),
                us(cpu.bench, n),
                format!("**{}**", us(cpu.ours(), n)),
                us(cpu.other(), n),
            ]
        };
        for (i, r) in self.rounds.iter().enumerate() {
            let n = self.events;
            for (name, took, cpu) in [
                ("baseline", r.baseline.took, r.baseline_cpu),
                (
                    "tracker SQL in-process",
                    r.in_process.took,
                    r.in_process_cpu,
                ),
            ] {
                t.row(
                    [
                        format!("{} {name}", i + 1),
                        format!("{:.1}", took.as_secs_f64()),
                        "–".to_owned(),
                        "–".to_owned(),
                        "–".to_owned(),
                    ]
                    .into_iter()
                    .chain(cpu_cells(&cpu, n))
                    .chain([format!(
                        "{:.2}",
                        cpu.machine.as_secs_f64() / took.as_secs_f64()
                    )]),
                );
            }
            for run in &r.trackers {
                let wall = run.done.saturating_sub(run.first).as_secs_f64();
                t.row(
                    [
                        format!("{} tracker, batch {}", i + 1, run.batch),
                        format!("{:.1} (+{:.1} start-up)", wall, run.first.as_secs_f64()),
                        format!(
                            "{:.1} ({:.0} %)",
                            run.apply_secs,
                            100.0 * run.apply_secs / wall
                        ),
                        format!("{:.0} × {:.0}", run.batches, run.mean_batch),
                        us(run.cpu.tracker, run.events),
                    ]
                    .into_iter()
                    .chain(cpu_cells(&run.cpu, run.events))
                    .chain([format!(
                        "{:.2}",
                        run.cpu.machine.as_secs_f64() / run.done.as_secs_f64()
                    )]),
                );
            }
        }
        let _ = write!(s, "{t}");
        let _ = writeln!(
            s,
            "\nIn-process, one core: decoding an event {:.2} µs, merging it into a batch's Delta {:.2} µs. \
             \"tracker in apply + commit\" is the sum of the tracker's own \
             `runyard_tracker_apply_latency_seconds` (building the rows, the SQL, the commit); the rest of \
             the wall time is pulling, decoding, acking and waiting for the next batch. Progress is read \
             every {} ms from the tracker's `runyard_tracker_events_total{{result=\"applied\"}}` and \
             confirmed with `count(*)` of `applied_events`. CPU is read from `/proc` (10 ms ticks); \
             \"postgres\" is every process of the cluster, \"other load\" the rest of the machine's busy \
             time (other work sharing it). CPU per event depends much less on that other load than wall time does, so \
             \"all of these\" is the steadier comparison of the runs.\n",
            self.decode_us,
            self.delta_us,
            POLL.as_millis(),
        );

        if let Some(r) = &self.rebuild {
            let _ = writeln!(s, "### Rebuild\n");
            let mut t = Table::new([
                "events",
                "batch",
                "seconds",
                "events/s",
                "VmHWM (MiB)",
                "CPU µs/event: rebuild",
                "nats-server",
                "postgres",
                "other load",
            ])
            .right(0..9);
            t.row([
                thousands(r.events as f64),
                r.batch
                    .map_or_else(|| "5000 (default)".to_owned(), |b| b.to_string()),
                format!("**{:.1}**", r.took.as_secs_f64()),
                thousands(r.events as f64 / r.took.as_secs_f64()),
                mib(r.hwm_kib),
                us(r.cpu.tracker, r.events),
                us(r.cpu.nats, r.events),
                us(r.cpu.postgres, r.events),
                us(r.cpu.other(), r.events),
            ]);
            let _ = write!(s, "{t}");
            let _ = writeln!(
                s,
                "\nSeconds from spawning `runyard-job-tracker rebuild --into <db>` until it exited \
                 (dropping and migrating the target included); {} events pre-loaded at {} events/s.\n",
                thousands(r.events as f64),
                thousands(r.publish.per_sec()),
            );
        }

        let _ = writeln!(s, "### Targets\n");
        let mut t = Table::new(["target", "measured", ""]).right([1]);
        let runs: Vec<&TrackerRun> = self.rounds.iter().flat_map(|r| &r.trackers).collect();
        // Judged at the tracker's default batch size when it was run, else
        // at the best one; the median over rounds.
        let judged = if runs.iter().any(|t| t.batch == DEFAULT_BATCH) {
            format!("batch {DEFAULT_BATCH}")
        } else {
            "best batch size".to_owned()
        };
        let pick = |r: &Round, f: &dyn Fn(&TrackerRun) -> f64| {
            r.trackers
                .iter()
                .filter(|t| t.batch == DEFAULT_BATCH || !judged.starts_with("batch"))
                .map(f)
                .fold(f64::NAN, f64::max)
        };
        let rate = median(self.rounds.iter().map(|r| pick(r, &|t| t.steady)));
        let ratio = median(
            self.rounds
                .iter()
                .map(|r| pick(r, &|t| t.steady / r.baseline.per_sec())),
        );
        t.row([
            "≥ 10,000 events/s steady".to_owned(),
            format!("{} ({judged}, median over rounds)", thousands(rate)),
            verdict(rate >= TARGET_RATE).to_owned(),
        ]);
        t.row([
            "≥ 30 % of the plain-insert baseline".to_owned(),
            format!("{:.0} % ({judged}, median over rounds)", 100.0 * ratio),
            verdict(ratio >= TARGET_RATIO).to_owned(),
        ]);
        if let Some(r) = &self.rebuild {
            // Scaled linearly when a smaller rebuild was asked for.
            let secs = r.took.as_secs_f64() * TARGET_REBUILD_EVENTS / r.events as f64;
            let scaled = if r.events as f64 == TARGET_REBUILD_EVENTS {
                String::new()
            } else {
                format!(" (scaled from {} events)", thousands(r.events as f64))
            };
            t.row([
                "rebuild of 1,000,000 events ≤ 3 min".to_owned(),
                format!("{secs:.0} s{scaled}"),
                verdict(secs <= TARGET_REBUILD_SECS).to_owned(),
            ]);
        }
        let rss_kib = runs
            .iter()
            .map(|t| t.hwm_kib)
            .chain(self.rebuild.iter().map(|r| r.hwm_kib))
            .max()
            .unwrap_or(0);
        t.row([
            "tracker RSS ≤ 128 MiB".to_owned(),
            format!("{} MiB (peak VmHWM, tracker and rebuild)", mib(rss_kib)),
            verdict(rss_kib as f64 / 1024.0 <= TARGET_RSS_MIB).to_owned(),
        ]);
        let _ = write!(s, "{t}");
        f.write_str(&s)
    }
}
