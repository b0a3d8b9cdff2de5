//! The scaler's latency and throughput benchmark: from ingest's `202` for a
//! signed GitHub `workflow_job` (`queued`) webhook to the provider's create
//! call and the runner's process running, and how many runners a second the
//! scaler creates when a thousand jobs are queued at once.
//!
//! Everything is the real thing except GitHub and the allocator: the release
//! `runyard-ingest` and `runyard-scaler` binaries as child processes, a
//! nats-server (JetStream, file store), a migrated Postgres database (the
//! scaler's "has the job started already?" look-up) and the `process`
//! provider. GitHub is [`FakeGitHub`] behind a small timing proxy in this
//! process (it notes when each JIT request arrives and when it is answered);
//! the allocator is a gRPC stub in this process that answers at once and
//! notes when it was asked. Each runner is this binary in its runner mode:
//! it writes the wall-clock time it started to a file, then sleeps.
//!
//! For every job the bench collects, all on the host's wall clock: the
//! `202`, the event's delivery to a consumer with the scaler's consumer
//! settings (the baseline: nothing downstream can be faster), the claim's
//! time in the `<NS>_CLAIMS` bucket, the allocator call, `RunnerRequested`,
//! the JIT request and its answer, the runner process's start and
//! `RunnerCreated`.
//!
//! Phases, each on a fresh namespace, fake GitHub, ingest and scaler:
//! - `paced`: N webhooks at a fixed rate (open loop), after a warm-up;
//! - `scale-set`: the same for a `mode = "scale-set"` pool, without ingest
//!   or webhooks: N jobs queued at the same rate in [`FakeActions`] (behind
//!   the same timing proxy), each timed from the moment the fake hands out
//!   the message carrying its `JobAssigned`
//!   ([`FakeActions::assigned_delivered_at`]);
//! - `burst`: N webhooks as fast as ingest takes them (C connections);
//! - `backlog`: N jobs already queued in the log when the scaler starts;
//! - `direct`: the create path's own parts (the scaler's claim, the same DB
//!   query, sizing, publishing, JIT registration and `process` provider)
//!   called by this process without the engine: one at a time, then N at
//!   once. The baseline for the scaler's per-create cost and rate.
//!
//! Run through `scripts/bench-scaler.sh`; `-- --help` lists the flags.
#![allow(clippy::print_stdout)] // the report goes to stdout

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use clap::{Parser, ValueEnum};
use futures::StreamExt as _;
use runyard_allocator::proto::allocator_server::{Allocator as AllocatorService, AllocatorServer};
use runyard_allocator::proto::{
    Basis, RecommendBatchRequest, RecommendBatchResponse, RecommendRequest, Recommendation,
};
use runyard_bench::http::{self, HttpClient};
use runyard_bench::process::{self, Service, service_command, wait_until};
use runyard_bench::procfs::{self, CpuMeter, CpuUsage, Perf};
use runyard_bench::report::{Dist, Table, ms_of_ns as ms, verdict};
use runyard_bench::webhook::{self, FIXTURE, SECRET};
use runyard_bench::{args, metrics};
use runyard_bus::consumer::{
    Consumer, ConsumerConfig, Deliver, Delivery, Handler, HandlerError, Rejected,
};
use runyard_bus::{Bus, StreamSettings, TraceParent};
use runyard_events::{
    Body, Event, Forge, JobStatus, Namespace, RunnerCreated, RunnerRef, Source, claim_key,
    instance_name, runner_event_id_for, timestamp,
};
use runyard_forge::api::github::{GitHubAuth, GitHubClient, GitHubScope};
use runyard_scaler::ScalerFile;
use runyard_scaler::config::PoolConfig;
use runyard_scaler::core::world::{Job, JobId};
use runyard_scaler::forges::Forges;
use runyard_scaler::kv::{Claim, Coordination};
use runyard_scaler::provider::{CreateRequest, Provider};
use runyard_scaler::sizing::{Allocator, runner_requested};
use runyard_testkit::fake_actions::{FakeActions, FakeScaleSetJob};
use runyard_testkit::fake_github::FakeGitHub;
use runyard_testkit::{NatsServer, TestDb, free_port, github_signature, unique_namespace};
use secrecy::SecretString;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The first argument that turns this binary into a runner.
const RUNNER_MODE: &str = "--runner-stamp";
/// A runner exits after this long, or as soon as its parent is gone.
const RUNNER_LIFETIME: Duration = Duration::from_secs(1800);
/// The pool every job goes to.
const POOL: &str = "bench";
/// Job names are this plus the job id, so the allocator stub knows the job.
const JOB_PREFIX: &str = "bench ";
/// The labels of the fixture's job: the pool's.
const LABELS: [&str; 4] = ["self-hosted", "linux", "x64", "gpu"];
/// The stub allocator's answer: the first flavor (4 GiB) covers it.
const RECOMMENDED_LIMIT: u64 = 3 << 30;

fn main() -> anyhow::Result<()> {
    // First, before anything else: a runner's start time.
    let started = SystemTime::now();
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(RUNNER_MODE) {
        return runner(started, &argv[2..]);
    }
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(Box::pin(run(args)))
}

// ---------------------------------------------------------------------------
// The runner

/// Writes `<dir>/<name>.t` (nanoseconds since the epoch when the process
/// started), then sleeps until its parent goes away or its lifetime ends.
fn runner(started: SystemTime, args: &[String]) -> anyhow::Result<()> {
    let [dir, name, ..] = args else {
        anyhow::bail!("usage: {RUNNER_MODE} DIR NAME");
    };
    let nanos = started.duration_since(UNIX_EPOCH)?.as_nanos();
    let dir = Path::new(dir);
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, nanos.to_string())?;
    // Renamed into place, so a reader never sees a half-written stamp.
    std::fs::rename(&tmp, dir.join(format!("{name}.t")))?;
    let parent = std::os::unix::process::parent_id();
    let until = Instant::now() + RUNNER_LIFETIME;
    while Instant::now() < until && std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_secs(5));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Arguments

/// The scaler's latency and throughput benchmark: from ingest's 202 for a
/// queued `workflow_job` to the runner's process, and runners created per
/// second.
#[derive(Parser, Debug, Clone)]
#[command(version)]
struct Args {
    /// Jobs per phase.
    #[arg(long, default_value_t = 1000, value_parser = args::at_least_one)]
    jobs: usize,
    /// Webhooks a second of the paced phase.
    #[arg(long, default_value_t = 20.0, value_parser = args::above_zero)]
    rate: f64,
    /// Jobs before the measured ones in paced and burst.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Connections posting the burst and the backlog.
    #[arg(long, default_value_t = 32, value_parser = args::at_least_one)]
    concurrency: usize,
    /// One-at-a-time creates of the direct baseline.
    #[arg(long, default_value_t = 200)]
    sequential: usize,
    /// Repeat the phases this many times.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The phases to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "paced,burst,backlog,direct"
    )]
    phases: Vec<Phase>,
    /// `RUST_LOG` of ingest and the scaler.
    #[arg(long, default_value = "info")]
    log: String,
    /// The `runyard-ingest` binary.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/runyard-ingest"))]
    ingest_bin: PathBuf,
    /// The `runyard-scaler` binary.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/runyard-scaler"))]
    scaler_bin: PathBuf,
    /// A Postgres database for the scaler (migrated, kept); by default a
    /// fresh one on the local server, dropped at the end.
    #[arg(long, conflicts_with = "no_database")]
    database_url: Option<String>,
    /// Give the scaler a closed port instead of a database.
    #[arg(long)]
    no_database: bool,
    /// Keep logs and state directories.
    #[arg(long)]
    keep: bool,
    /// `perf record` (DWARF call graphs) of the scaler into this file, from
    /// the start of the measured part of `--perf-phase`.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// The phase `--perf` profiles.
    #[arg(long, value_enum, default_value = "burst")]
    perf_phase: Mode,
    /// Seconds `--perf` records.
    #[arg(long, default_value_t = 4)]
    perf_secs: u64,
    /// Where state, logs, pid files and stamps go (the system's temporary
    /// directory by default).
    #[arg(long)]
    tmp: Option<PathBuf>,
    #[command(flatten)]
    cargo: args::Cargo,
}

/// A phase of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Phase {
    /// `--jobs` webhooks at `--rate` (open loop).
    Paced,
    /// `--jobs` jobs at `--rate` for a scale-set pool (no webhooks).
    ScaleSet,
    /// `--jobs` webhooks as fast as ingest takes them.
    Burst,
    /// `--jobs` jobs in the log before the scaler starts.
    Backlog,
    /// The create path called without the engine (the baseline).
    Direct,
}

// ---------------------------------------------------------------------------
// Clocks

/// Nanoseconds since the epoch, now.
fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn ts_ns(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1_000_000_000 + i64::from(t.nanos)
}

fn occurred_ns(e: &Event) -> i64 {
    e.occurred_at.as_ref().map_or(0, ts_ns)
}

// ---------------------------------------------------------------------------
// What the bench sees

/// Everything noted while a phase runs, by job id or runner name.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// Job → when its wait began: its webhook's 202, or (scale-set) the
    /// fake handing out its `JobAssigned`.
    acked: HashMap<u64, i64>,
    /// Scale-set job id → the scaler's job id (from `JobObserved`).
    scale_set_jobs: HashMap<String, u64>,
    /// Job → when its `JobObserved` reached the bench's consumer.
    delivered: HashMap<u64, i64>,
    /// Job → when the allocator stub was asked about it.
    allocator: HashMap<u64, i64>,
    /// Runner → (job, `RunnerRequested.occurred_at`).
    requested: HashMap<String, (u64, i64)>,
    /// Runner → `RunnerCreated.occurred_at`.
    created: HashMap<String, i64>,
    /// Runner → (JIT request arrived, JIT answer sent) at the proxy.
    jit: HashMap<String, (i64, i64)>,
    /// `RunnerFailed` reasons.
    failed: Vec<String>,
    /// `RunnerDeleted` events.
    deleted: u64,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(s: &Shared) -> MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Notes events as a consumer with the scaler's settings receives them.
struct Recorder(Shared);

impl Handler for Recorder {
    async fn handle(&self, batch: &[Delivery]) -> Result<Rejected, HandlerError> {
        let at = now_ns();
        let mut seen = lock(&self.0);
        for d in batch {
            match &d.event.body {
                Some(Body::JobObserved(j)) if j.status() == JobStatus::Queued => {
                    if let Some(k) = &j.job {
                        seen.delivered.entry(k.job_id).or_insert(at);
                        if !j.scale_set_job_id.is_empty() {
                            seen.scale_set_jobs
                                .insert(j.scale_set_job_id.clone(), k.job_id);
                        }
                    }
                }
                Some(Body::RunnerRequested(r)) => {
                    if let (Some(runner), Some(job)) = (&r.runner, &r.job) {
                        seen.requested
                            .insert(runner.name.clone(), (job.job_id, occurred_ns(&d.event)));
                    }
                }
                Some(Body::RunnerCreated(c)) => {
                    if let Some(runner) = &c.runner {
                        seen.created
                            .entry(runner.name.clone())
                            .or_insert(occurred_ns(&d.event));
                    }
                }
                Some(Body::RunnerFailed(f)) => seen.failed.push(f.reason.clone()),
                Some(Body::RunnerDeleted(_)) => seen.deleted += 1,
                _ => {}
            }
        }
        Ok(Vec::new())
    }
}

// ---------------------------------------------------------------------------
// The timing proxy in front of the fake GitHub

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    /// The proxy's own URL, put in answers in place of `upstream`'s, so
    /// URLs the fake hands out (the Actions service's, its message queue's)
    /// lead back through the proxy.
    rewrite: Option<String>,
    client: reqwest::Client,
    seen: Shared,
}

/// An HTTP server on loopback, stopped when dropped.
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A timing proxy in front of `upstream`; with `rewrite`, every answer
/// names the proxy where it named `upstream`.
async fn start_proxy(upstream: String, seen: Shared, rewrite: bool) -> anyhow::Result<Server> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = ProxyState {
        upstream,
        rewrite: rewrite.then(|| format!("http://{addr}")),
        client: reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(2048)
            .build()?,
        seen,
    };
    let router = axum::Router::new().fallback(forward).with_state(state);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(Server { addr, task })
}

/// Forwards one request to the fake; notes JIT requests (GitHub's REST
/// one and a scale set's) by runner name.
async fn forward(State(p): State<ProxyState>, req: axum::extract::Request) -> Response {
    let arrived = now_ns();
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 1 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts.uri.path();
    let jit = (path.ends_with("/generate-jitconfig") || path.ends_with("/generatejitconfig"))
        .then(|| serde_json::from_slice::<Value>(&body).ok())
        .flatten()
        .and_then(|v| v.get("name")?.as_str().map(str::to_owned));
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let mut out = p
        .client
        .request(parts.method, format!("{}{path}", p.upstream))
        .body(body);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name.as_str()) {
            out = out.header(name, value);
        }
    }
    let answer = match out.send().await {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let Ok(mut bytes) = answer.bytes().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    if let Some(own) = &p.rewrite
        && let Ok(text) = std::str::from_utf8(&bytes)
    {
        let from = format!("{}/", p.upstream);
        if text.contains(&from) {
            bytes = text.replace(&from, &format!("{own}/")).into();
        }
    }
    let mut response = Response::builder().status(status);
    for (name, value) in &headers {
        if !hop_by_hop(name.as_str()) {
            response = response.header(name, value);
        }
    }
    if let Some(name) = jit {
        lock(&p.seen).jit.insert(name, (arrived, now_ns()));
    }
    response
        .body(HttpBody::from(bytes))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "host" | "connection" | "content-length" | "transfer-encoding" | "keep-alive"
    )
}

// ---------------------------------------------------------------------------
// The allocator stub

struct StubAllocator {
    seen: Shared,
}

#[tonic::async_trait]
impl AllocatorService for StubAllocator {
    async fn recommend(
        &self,
        request: tonic::Request<RecommendRequest>,
    ) -> Result<tonic::Response<Recommendation>, tonic::Status> {
        let at = now_ns();
        if let Some(job) = request
            .get_ref()
            .workload
            .get("job")
            .and_then(|n| n.strip_prefix(JOB_PREFIX))
            .and_then(|id| id.parse::<u64>().ok())
        {
            lock(&self.seen).allocator.entry(job).or_insert(at);
        }
        Ok(tonic::Response::new(Recommendation {
            cpu_request_millicores: 1000,
            cpu_limit_millicores: 2000,
            memory_request_bytes: RECOMMENDED_LIMIT / 2,
            memory_limit_bytes: RECOMMENDED_LIMIT,
            build_jobs: 2,
            retry_count: 0,
            basis: Some(Basis {
                samples: 10,
                matched: vec!["repo".into(), "workflow".into(), "job".into()],
                level: 0,
                statistic: "stub".into(),
                ..Basis::default()
            }),
            ..Recommendation::default()
        }))
    }

    async fn recommend_batch(
        &self,
        _request: tonic::Request<RecommendBatchRequest>,
    ) -> Result<tonic::Response<RecommendBatchResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in the stub"))
    }
}

async fn start_allocator(seen: Shared) -> anyhow::Result<Server> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        });
        Some((r, l))
    });
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(AllocatorServer::new(StubAllocator { seen }))
            .serve_with_incoming(incoming)
            .await;
    });
    Ok(Server { addr, task })
}

// ---------------------------------------------------------------------------
// Deliveries

/// One signed webhook, made before any timing starts.
#[derive(Debug, Clone)]
struct Prepared {
    job_id: u64,
    body: bytes::Bytes,
    delivery: String,
    signature: String,
}

/// `n` deliveries of the fixture with unique job ids and delivery ids; each
/// job is named after its id (the allocator stub reads it back).
fn prepare(template: &Value, phase: u64, first: u64, n: usize) -> anyhow::Result<Vec<Prepared>> {
    let mut out = Vec::with_capacity(n);
    for i in first..first + n as u64 {
        let job_id = 40_000_000_000 + phase * 10_000_000 + i;
        let mut v = template.clone();
        let job = v
            .get_mut("workflow_job")
            .and_then(Value::as_object_mut)
            .context("the fixture has no workflow_job")?;
        job.insert("id".into(), job_id.into());
        job.insert("name".into(), format!("{JOB_PREFIX}{job_id}").into());
        let body = serde_json::to_vec(&v)?;
        let signature = github_signature(SECRET, &body);
        out.push(Prepared {
            job_id,
            body: body.into(),
            delivery: webhook::delivery_id(phase, i),
            signature,
        });
    }
    Ok(out)
}

/// Posts one delivery; the wall-clock time its `202` was read.
async fn post(http: &reqwest::Client, url: &str, p: &Prepared) -> anyhow::Result<i64> {
    let mut request = http
        .post(url)
        .header("user-agent", "GitHub-Hookshot/scaler-bench")
        .header(webhook::DELIVERY, &p.delivery)
        .header(webhook::SIGNATURE, &p.signature);
    for (name, value) in webhook::HEADERS {
        request = request.header(name, value);
    }
    let answer = request.body(p.body.clone()).send().await?;
    let status = answer.status();
    let body = answer.bytes().await?;
    let at = now_ns();
    anyhow::ensure!(
        status.as_u16() == 202 && !webhook::is_duplicate(&body),
        "ingest answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(at)
}

// ---------------------------------------------------------------------------
// A stack: namespace, fake GitHub, proxy, allocator stub, ingest, scaler

/// What the whole run shares.
struct Ctx {
    args: Args,
    nats: NatsServer,
    nats_pid: u32,
    client: async_nats::Client,
    /// What the scaler (and the direct baseline) get as their database.
    db_url: String,
    /// This binary, started as the runners.
    exe: PathBuf,
    root: tempfile::TempDir,
    http: reqwest::Client,
    /// For the services' `/readyz` and `/metrics`.
    probe: HttpClient,
    template: Value,
    phases: AtomicU64,
}

impl Ctx {
    fn next_phase(&self) -> u64 {
        self.phases.fetch_add(1, Ordering::SeqCst)
    }
}

/// A service binary under test, and the port it listens on.
struct Listening {
    service: Service,
    port: u16,
}

/// What the scaler's GitHub URL leads to, through the timing proxy.
enum Upstream {
    /// Webhook pools: the fake GitHub.
    GitHub(FakeGitHub),
    /// A scale-set pool: the fake Actions service (its registration steps
    /// at the root, the service under it).
    Actions(FakeActions),
}

impl Upstream {
    fn url(&self) -> String {
        match self {
            Self::GitHub(g) => g.url(),
            Self::Actions(a) => a.github_url(),
        }
    }
}

struct Stack {
    ns: Namespace,
    bus: Bus,
    seen: Shared,
    upstream: Upstream,
    proxy: Server,
    allocator: Server,
    dir: PathBuf,
    state_dir: PathBuf,
    stamps: PathBuf,
    file: String,
    ingest: Option<Listening>,
    scaler: Option<Listening>,
    stop: CancellationToken,
    consumer: tokio::task::JoinHandle<()>,
}

/// The scaler's consumer settings (`follow` in the scaler's lib.rs).
fn scaler_consumer(ns: &Namespace) -> ConsumerConfig {
    ConsumerConfig {
        durable: None,
        description: "scaler bench".into(),
        filter_subjects: vec![
            format!("{}.v1.job.>", ns.as_str()),
            format!("{}.v1.runner.>", ns.as_str()),
        ],
        deliver: Deliver::ByStartTime(time::OffsetDateTime::now_utc() - Duration::from_secs(3600)),
        batch_size: 500,
        batch_wait: Duration::from_millis(2),
        ..ConsumerConfig::default()
    }
}

impl Stack {
    /// A stack for a webhook pool, or with `scale_set` a scale-set pool
    /// (the fake Actions service in place of the fake GitHub).
    async fn new(
        ctx: &Ctx,
        label: &str,
        max_runners: usize,
        scale_set: bool,
    ) -> anyhow::Result<Self> {
        let ns = unique_namespace();
        let bus = Bus::from_client(ctx.client.clone(), ns.clone());
        bus.ensure_streams(&StreamSettings::default())
            .await
            .context("creating the streams")?;
        let seen = Shared::default();
        let upstream = if scale_set {
            Upstream::Actions(FakeActions::start().await)
        } else {
            Upstream::GitHub(FakeGitHub::start().await)
        };
        let proxy = start_proxy(upstream.url(), seen.clone(), scale_set).await?;
        let allocator = start_allocator(seen.clone()).await?;
        let dir = ctx.root.path().join(format!("{label}-{}", ns.as_str()));
        let state_dir = dir.join("state");
        let stamps = dir.join("stamps");
        std::fs::create_dir_all(&state_dir)?;
        std::fs::create_dir_all(&stamps)?;
        let file = format!(
            r#"[providers.local]
kind = "process"
command = [{exe:?}, "{RUNNER_MODE}", {stamps:?}, "{{name}}"]

[[pools]]
name = "{POOL}"
forge = "github"
scope = {{ org = "acme" }}
{mode}
labels = {labels:?}
provider = "local"
image = "bench"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}, {{ name = "large", memory = "16GiB", cpus = 8 }}]
min_idle = 0
max_runners = {max_runners}
idle_timeout = "30m"
bootstrap_timeout = "30m"

[scaler]
state_dir = {state:?}
"#,
            exe = ctx.exe.display().to_string(),
            stamps = stamps.display().to_string(),
            mode = if scale_set {
                "mode = \"scale-set\""
            } else {
                "runner_group_id = 1"
            },
            labels = LABELS,
            state = state_dir.display().to_string(),
        );
        std::fs::write(dir.join("scaler.toml"), &file)?;
        let stop = CancellationToken::new();
        let consumer = Consumer::bind(&bus, scaler_consumer(&ns), None)
            .await
            .context("binding the bench's consumer")?;
        let consumer = {
            let (seen, stop) = (seen.clone(), stop.clone());
            tokio::spawn(async move { consumer.run(Recorder(seen), stop).await })
        };
        Ok(Self {
            ns,
            bus,
            seen,
            upstream,
            proxy,
            allocator,
            dir,
            state_dir,
            stamps,
            file,
            ingest: None,
            scaler: None,
            stop,
            consumer,
        })
    }

    fn spawn(
        &self,
        ctx: &Ctx,
        bin: &Path,
        log: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<Listening> {
        let port = free_port();
        let out = std::fs::File::create(self.dir.join(log))?;
        let err = out.try_clone()?;
        let mut cmd = service_command(bin, &ctx.nats.url(), self.ns.as_str(), &ctx.args.log);
        cmd.stdout(out).stderr(err);
        for (k, v) in env {
            cmd.env(k, v.replace("{port}", &port.to_string()));
        }
        let service = Service::spawn(&mut cmd)?;
        Ok(Listening { service, port })
    }

    async fn start_ingest(&mut self, ctx: &Ctx) -> anyhow::Result<()> {
        let ingest = self.spawn(
            ctx,
            &ctx.args.ingest_bin,
            "ingest.log",
            &[
                ("RUNYARD_INGEST_LISTEN", "127.0.0.1:{port}".into()),
                ("RUNYARD_GITHUB_WEBHOOK_SECRET", SECRET.into()),
            ],
        )?;
        let url = format!("http://127.0.0.1:{}/readyz", ingest.port);
        self.ingest = Some(ingest);
        http::wait_for_200(&ctx.probe, &url, Duration::from_secs(30)).await
    }

    /// Starts the scaler without waiting for it.
    fn spawn_scaler(&mut self, ctx: &Ctx) -> anyhow::Result<()> {
        let scaler = self.spawn(
            ctx,
            &ctx.args.scaler_bin,
            "scaler.log",
            &[
                ("RUNYARD_SCALER_HTTP_LISTEN", "127.0.0.1:{port}".into()),
                (
                    "RUNYARD_SCALER_CONFIG",
                    self.dir.join("scaler.toml").display().to_string(),
                ),
                ("RUNYARD_DATABASE_URL", ctx.db_url.clone()),
                ("RUNYARD_ALLOCATOR_URL", self.allocator.url()),
                ("RUNYARD_GITHUB_API_URL", self.proxy.url()),
                ("RUNYARD_GITHUB_TOKEN", "bench-token".into()),
            ],
        )?;
        self.scaler = Some(scaler);
        Ok(())
    }

    /// Waits until the scaler has read the log and holds the pool's lease.
    async fn scaler_ready(&self, ctx: &Ctx) -> anyhow::Result<()> {
        let port = self.scaler.as_ref().context("no scaler")?.port;
        let pool = format!("pool=\"{POOL}\"");
        wait_until("the scaler's lease", Duration::from_secs(60), || async {
            metrics::scrape(&ctx.probe, port).await.is_ok_and(|t| {
                metrics::sample(&t, "runyard_scaler_pool_lease_held", &[&pool]) == Some(1.0)
            })
        })
        .await
    }

    /// The scale set's id once the scaler made it and holds its session.
    async fn scale_set_ready(&self) -> anyhow::Result<i64> {
        let Upstream::Actions(actions) = &self.upstream else {
            anyhow::bail!("not a scale-set stack");
        };
        let session = || {
            actions
                .scale_sets()
                .into_iter()
                .find(|s| s.name == POOL && s.sessions == 1)
                .map(|s| s.id)
        };
        wait_until(
            "the scale set's session",
            Duration::from_secs(60),
            || async { session().is_some() },
        )
        .await?;
        session().context("no scale set")
    }

    /// Queues `jobs` in the scale set open loop: job `i` goes at start +
    /// i / rate. Returns the scale-set job ids and the numbers the jobs are
    /// named by.
    async fn queue_paced(&self, set: i64, jobs: &[u64], rate: f64) -> Vec<(String, u64)> {
        let Upstream::Actions(actions) = &self.upstream else {
            return Vec::new();
        };
        let start = tokio::time::Instant::now();
        let mut out = Vec::with_capacity(jobs.len());
        for (i, number) in jobs.iter().enumerate() {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            let job = FakeScaleSetJob::new(
                "octo-org/example-workflow",
                &format!("{JOB_PREFIX}{number}"),
                i64::try_from(*number).unwrap_or(i64::MAX),
                &[POOL],
            );
            out.push((actions.queue_job(set, job), *number));
        }
        out
    }

    fn webhook_url(&self) -> String {
        let port = self.ingest.as_ref().map_or(0, |s| s.port);
        format!("http://127.0.0.1:{port}/webhooks/github")
    }

    /// Posts `set` with at most `concurrency` in flight; notes the 202s.
    async fn post_all(&self, ctx: &Ctx, set: &[Prepared], concurrency: usize) -> usize {
        let url = self.webhook_url();
        let answers: Vec<_> = futures::stream::iter(set)
            .map(|p| {
                let url = &url;
                async move { (p.job_id, post(&ctx.http, url, p).await) }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let mut failed = 0;
        let mut seen = lock(&self.seen);
        for (job, answer) in answers {
            match answer {
                Ok(at) => {
                    seen.acked.insert(job, at);
                }
                Err(error) => {
                    failed += 1;
                    eprintln!("  webhook for job {job} failed: {error:#}");
                }
            }
        }
        failed
    }

    /// Posts `set` open loop: delivery `i` goes at start + i / rate,
    /// whatever the earlier ones are doing.
    async fn post_paced(&self, ctx: &Ctx, set: &[Prepared], rate: f64) -> usize {
        let url = Arc::new(self.webhook_url());
        let start = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, p) in set.iter().enumerate() {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            let (http, url, p, seen) =
                (ctx.http.clone(), url.clone(), p.clone(), self.seen.clone());
            tasks.spawn(async move {
                match post(&http, &url, &p).await {
                    Ok(at) => {
                        lock(&seen).acked.insert(p.job_id, at);
                        true
                    }
                    Err(error) => {
                        eprintln!("  webhook for job {} failed: {error:#}", p.job_id);
                        false
                    }
                }
            });
        }
        let mut failed = 0;
        while let Some(ok) = tasks.join_next().await {
            if !ok.unwrap_or(false) {
                failed += 1;
            }
        }
        failed
    }

    /// Waits until `want` runners run and as many `RunnerCreated` were seen;
    /// false when `limit` passed first.
    async fn wait_runners(&self, want: usize, limit: Duration) -> bool {
        wait_until("runners", limit, || async {
            stamp_count(&self.stamps) >= want && lock(&self.seen).created.len() >= want
        })
        .await
        .is_ok()
    }

    /// Runner → when its process started.
    fn stamps(&self) -> HashMap<String, i64> {
        let mut out = HashMap::new();
        let Ok(dir) = std::fs::read_dir(&self.stamps) else {
            return out;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "t")
                && let Some(name) = path.file_stem().and_then(|n| n.to_str())
                && let Some(ns) = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| t.trim().parse::<i64>().ok())
            {
                out.insert(name.to_owned(), ns);
            }
        }
        out
    }

    /// Job → when its claim was stored (the KV entry's server time).
    async fn claims(&self) -> anyhow::Result<HashMap<u64, i64>> {
        let bucket = format!("{}_CLAIMS", self.ns.as_str().to_ascii_uppercase());
        let store = self.bus.jetstream().get_key_value(&bucket).await?;
        let mut keys = Vec::new();
        let mut listing = store.keys().await?;
        while let Some(k) = listing.next().await {
            keys.push(k?);
        }
        let mut out = HashMap::new();
        for key in keys {
            let job = key.split('.').nth(2).and_then(|j| j.parse::<u64>().ok());
            if let (Some(job), Some(entry)) = (job, store.entry(&key).await?) {
                out.insert(job, entry.created.unix_timestamp_nanos() as i64);
            }
        }
        Ok(out)
    }

    /// Mean of the scaler's `provider_call_seconds{op="create"}`, ms.
    async fn create_call_mean(&self, ctx: &Ctx) -> Option<f64> {
        let port = self.scaler.as_ref()?.port;
        let text = metrics::scrape(&ctx.probe, port).await.ok()?;
        let value = |suffix: &str| {
            let name = format!("runyard_scaler_provider_call_seconds_{suffix}");
            metrics::sample(&text, &name, &["op=\"create\""])
        };
        let (sum, count) = (value("sum")?, value("count")?);
        (count > 0.0).then(|| sum * 1000.0 / count)
    }

    /// CPU time of the runner processes alive now.
    fn runner_cpu(&self) -> Duration {
        runner_pids(&self.state_dir)
            .into_iter()
            .filter_map(procfs::on_cpu)
            .sum()
    }

    /// Stops the scaler and ingest and every runner process.
    async fn finish(mut self, keep: bool) {
        let pids = runner_pids(&self.state_dir);
        if let Some(s) = &self.scaler {
            process::terminate(s.service.pid);
        }
        for pid in &pids {
            process::kill_group(*pid);
        }
        for l in [self.scaler.take(), self.ingest.take()]
            .into_iter()
            .flatten()
        {
            l.service.stop(Duration::from_secs(15)).await;
        }
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.consumer).await;
        let _ = wait_until("runners to exit", Duration::from_secs(10), || async {
            pids.iter().all(|p| !procfs::alive(*p))
        })
        .await;
        if !keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `perf record` of the scaler when this phase is the one to profile.
fn perf_for(args: &Args, mode: Mode, pid: u32) -> anyhow::Result<Option<Perf>> {
    match &args.perf {
        Some(file) if args.perf_phase == mode => {
            Ok(Some(Perf::start(file, pid, args.perf_secs, "the scaler")?))
        }
        _ => Ok(None),
    }
}

fn stamp_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "t"))
            .count()
    })
}

/// Pids from the process provider's pid files under `dir`.
fn runner_pids(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(runner_pids(&path));
        } else if path.extension().is_some_and(|e| e == "pid")
            && let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
        {
            out.push(pid);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Per-job timelines

/// Points on a job's way from webhook to runner, in order.
const POINTS: [&str; 9] = [
    "202 from ingest",
    "event at a consumer",
    "claim stored",
    "allocator asked",
    "RunnerRequested",
    "JIT request at GitHub",
    "JIT answered",
    "runner process running",
    "RunnerCreated",
];
const ACKED: usize = 0;
const JIT_IN: usize = 5;
const JIT_OUT: usize = 6;
const RUNNING: usize = 7;
const CREATED: usize = 8;

/// What each step between two points includes.
const STAGES: [&str; 8] = [
    "ingest's publish → JetStream → a consumer with the scaler's settings (baseline)",
    "scaler: batch handed to the engine, policy, claim sent to the KV bucket",
    "claim acked, `already_started` query in Postgres",
    "allocator answers (stub), `RunnerRequested` built",
    "`RunnerRequested` published and acked, GitHub client sends",
    "fake GitHub answers (through the timing proxy)",
    "`process` provider: directories, log file, fork/exec, runner start",
    "pid file written, `RunnerCreated` stamped",
];

/// One job's points, ns since the epoch.
#[derive(Debug, Clone, Default)]
struct Timeline([Option<i64>; 9]);

impl Timeline {
    fn span(&self, from: usize, to: usize) -> Option<i64> {
        Some(self.0[to]? - self.0[from]?)
    }
}

/// The spans `from` → `to` of every timeline holding both points, ns.
fn spans(lines: &[Timeline], from: usize, to: usize) -> Dist {
    ns(lines.iter().filter_map(|l| l.span(from, to)))
}

/// The distribution of durations in nanoseconds.
fn ns(values: impl IntoIterator<Item = i64>) -> Dist {
    Dist::of(values.into_iter().map(|v| v as f64))
}

fn timelines(
    jobs: &[u64],
    seen: &Seen,
    claims: &HashMap<u64, i64>,
    stamps: &HashMap<String, i64>,
) -> Vec<Timeline> {
    let by_job: HashMap<u64, (&String, i64)> = seen
        .requested
        .iter()
        .map(|(name, (job, at))| (*job, (name, *at)))
        .collect();
    jobs.iter()
        .map(|&job| {
            let name = by_job.get(&job).map_or_else(
                || instance_name(POOL, &claim_key(Forge::Github, "github.com", job, 1)),
                |(n, _)| (*n).clone(),
            );
            Timeline([
                seen.acked.get(&job).copied(),
                seen.delivered.get(&job).copied(),
                claims.get(&job).copied(),
                seen.allocator.get(&job).copied(),
                by_job.get(&job).map(|(_, at)| *at),
                seen.jit.get(&name).map(|j| j.0),
                seen.jit.get(&name).map(|j| j.1),
                stamps.get(&name).copied(),
                seen.created.get(&name).copied(),
            ])
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Phases

/// A phase driven by arriving jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// The paced phase.
    Paced,
    /// The paced phase of a scale-set pool.
    ScaleSet,
    /// The burst.
    Burst,
    /// The backlog.
    Backlog,
}

impl Mode {
    /// Jobs arrive at `--rate`.
    fn paced(self) -> bool {
        matches!(self, Self::Paced | Self::ScaleSet)
    }

    /// Point `i` of a job's timeline ([`POINTS`]).
    fn point(self, i: usize) -> &'static str {
        match (self, i) {
            (Self::ScaleSet, ACKED) => "JobAssigned handed out",
            (Self::ScaleSet, JIT_IN) => "JIT request at the Actions service",
            _ => POINTS[i],
        }
    }

    /// What step `i` of a job's timeline includes ([`STAGES`]).
    fn stage(self, i: usize) -> &'static str {
        match (self, i) {
            (Self::ScaleSet, 0) => {
                "the message through the proxy; the listener: acquire of jobs it offers, REST twin look-up, events published and acked → a consumer with the scaler's settings"
            }
            (Self::ScaleSet, 4) => "`RunnerRequested` published and acked, Actions client sends",
            (Self::ScaleSet, 5) => "fake Actions service answers (through the timing proxy)",
            _ => STAGES[i],
        }
    }
}

/// What one phase measured.
#[derive(Debug, Clone)]
struct Outcome {
    mode: Mode,
    label: String,
    round: usize,
    jobs: usize,
    lines: Vec<Timeline>,
    /// Start and end of the throughput window (ns), and what they are.
    window: Option<(i64, i64)>,
    cpu: CpuUsage,
    runner_cpu: Duration,
    wall: Duration,
    create_call_ms: Option<f64>,
    failed: Vec<String>,
    deleted: u64,
    webhook_errors: usize,
}

impl Outcome {
    fn running(&self) -> usize {
        self.lines.iter().filter(|l| l.0[RUNNING].is_some()).count()
    }

    fn created(&self) -> usize {
        self.lines.iter().filter(|l| l.0[CREATED].is_some()).count()
    }

    fn rate(&self) -> Option<f64> {
        let (a, b) = self.window?;
        (b > a).then(|| self.created() as f64 / ((b - a) as f64 / 1e9))
    }

    /// Load from outside the bench: the machine's busy time less every
    /// process measured, runners included.
    fn cores_other(&self) -> f64 {
        let other = self.cpu.others().saturating_sub(self.runner_cpu);
        other.as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }

    /// CPU µs per create of each process, and the runners.
    fn cpu_per_create(&self) -> String {
        let n = self.created().max(1) as f64;
        let us = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1e6 / n);
        format!(
            "{} / {} / {} / {} / {}",
            us(self.cpu.of("scaler")),
            us(self.cpu.of("ingest")),
            us(self.cpu.of("nats-server")),
            us(self.cpu.of("bench")),
            us(self.runner_cpu)
        )
    }
}

/// A phase driven by arriving jobs: webhooks posted to ingest, or jobs
/// queued in the fake Actions service for a scale-set pool.
async fn phase_jobs(ctx: &Ctx, round: usize, mode: Mode) -> anyhow::Result<Outcome> {
    let args = &ctx.args;
    let n = args.jobs;
    let warm = if mode == Mode::Backlog {
        0
    } else {
        args.warmup
    };
    let label = match mode {
        Mode::Paced => format!("paced {}/s", args.rate),
        Mode::ScaleSet => format!("scale-set {}/s", args.rate),
        Mode::Burst => format!("burst, {} connections", args.concurrency),
        Mode::Backlog => "backlog at start".to_owned(),
    };
    progress(format!("round {round}: {label}: {n} jobs"));
    let scale_set = mode == Mode::ScaleSet;
    let mut stack = Stack::new(
        ctx,
        &label.replace([' ', ',', '/'], "-"),
        n + warm + 10,
        scale_set,
    )
    .await?;
    if !scale_set {
        stack.start_ingest(ctx).await?;
    }
    let mut set_id = 0;
    if mode != Mode::Backlog {
        stack.spawn_scaler(ctx)?;
        stack.scaler_ready(ctx).await?;
        if scale_set {
            set_id = stack.scale_set_ready().await?;
        }
    }
    let phase = ctx.next_phase();
    let warmups = prepare(&ctx.template, phase, 0, warm)?;
    let set = prepare(&ctx.template, phase, 1_000_000, n)?;
    let ids = |set: &[Prepared]| set.iter().map(|p| p.job_id).collect::<Vec<_>>();
    if warm > 0 {
        if scale_set {
            stack.queue_paced(set_id, &ids(&warmups), args.rate).await;
        } else {
            stack.post_paced(ctx, &warmups, args.rate).await;
        }
        anyhow::ensure!(
            stack.wait_runners(warm, Duration::from_secs(60)).await,
            "the warm-up's runners did not start; see {}",
            stack.dir.display()
        );
    }
    let ingest_pid = stack.ingest.as_ref().map_or(0, |s| s.service.pid);
    let me = std::process::id();
    let quiet = procfs::wait_for_quiet(0.25, Duration::from_secs(60)).await;
    progress(format!("  machine load before: {quiet:.2} cores"));
    let mut window_start = None;
    let mut queued = Vec::new();
    let webhook_errors;
    let (meter, started, perf) = match mode {
        Mode::Paced | Mode::Burst | Mode::ScaleSet => {
            let scaler_pid = stack.scaler.as_ref().map_or(0, |s| s.service.pid);
            let meter = CpuMeter::start(&[
                ("scaler", scaler_pid),
                ("ingest", ingest_pid),
                ("nats-server", ctx.nats_pid),
                ("bench", me),
            ]);
            let perf = perf_for(args, mode, scaler_pid)?;
            let started = Instant::now();
            window_start = Some(now_ns());
            webhook_errors = match mode {
                Mode::Paced => stack.post_paced(ctx, &set, args.rate).await,
                Mode::Burst => stack.post_all(ctx, &set, args.concurrency).await,
                _ => {
                    queued = stack.queue_paced(set_id, &ids(&set), args.rate).await;
                    0
                }
            };
            (meter, started, perf)
        }
        Mode::Backlog => {
            webhook_errors = stack.post_all(ctx, &set, args.concurrency).await;
            let want = n - webhook_errors;
            wait_until(
                "the backlog in the log",
                Duration::from_secs(60),
                || async { lock(&stack.seen).delivered.len() >= want },
            )
            .await?;
            let quiet = procfs::wait_for_quiet(0.25, Duration::from_secs(60)).await;
            progress(format!(
                "  {want} jobs queued; machine load {quiet:.2} cores; starting the scaler"
            ));
            stack.spawn_scaler(ctx)?;
            let scaler_pid = stack.scaler.as_ref().map_or(0, |s| s.service.pid);
            let meter = CpuMeter::start(&[
                ("scaler", scaler_pid),
                ("ingest", ingest_pid),
                ("nats-server", ctx.nats_pid),
                ("bench", me),
            ]);
            let perf = perf_for(args, mode, scaler_pid)?;
            (meter, Instant::now(), perf)
        }
    };
    let limit = Duration::from_secs(120);
    let complete = stack.wait_runners(warm + n - webhook_errors, limit).await;
    let wall = started.elapsed();
    let cpu = meter.stop();
    let runner_cpu = stack.runner_cpu();
    if let Some(perf) = perf {
        perf.finish().await;
    }
    if !complete {
        progress(format!(
            "  not every runner started within {limit:?}: {} running; logs in {}",
            stamp_count(&stack.stamps),
            stack.dir.display()
        ));
    }
    let create_call_ms = stack.create_call_mean(ctx).await;
    let claims = stack.claims().await.unwrap_or_default();
    let stamps = stack.stamps();
    let mut seen = lock(&stack.seen).clone();
    let jobs = if let Upstream::Actions(actions) = &stack.upstream {
        scale_set_jobs(&mut seen, actions, &queued)
    } else {
        ids(&set)
    };
    let lines = timelines(&jobs, &seen, &claims, &stamps);
    let end = lines.iter().filter_map(|l| l.0[CREATED]).max();
    let start = match mode {
        Mode::Backlog => lines.iter().filter_map(|l| l.0[2]).min(),
        _ => window_start,
    };
    let outcome = Outcome {
        mode,
        label,
        round,
        jobs: n,
        window: start.zip(end),
        cpu,
        runner_cpu,
        wall,
        create_call_ms,
        failed: seen.failed.clone(),
        deleted: seen.deleted,
        webhook_errors,
        lines,
    };
    progress(format!(
        "  {} running, {} created, {} failed events; {} → create call starts p50 {} ms, p99 {} ms; → runner running p50 {} ms, p99 {} ms",
        outcome.running(),
        outcome.created(),
        outcome.failed.len(),
        mode.point(ACKED),
        ms(spans(&outcome.lines, ACKED, JIT_OUT).p50()),
        ms(spans(&outcome.lines, ACKED, JIT_OUT).p99()),
        ms(spans(&outcome.lines, ACKED, RUNNING).p50()),
        ms(spans(&outcome.lines, ACKED, RUNNING).p99()),
    ));
    stack.finish(args.keep).await;
    Ok(outcome)
}

/// The scaler's ids of the scale-set jobs `queued` (scale-set job id, the
/// number in its name), in order; notes in `seen` when the fake handed out
/// each one's `JobAssigned`, and files the allocator stub's notes (by the
/// number in the job's name) under them.
fn scale_set_jobs(seen: &mut Seen, actions: &FakeActions, queued: &[(String, u64)]) -> Vec<u64> {
    let mut jobs = Vec::with_capacity(queued.len());
    let mut asked = HashMap::new();
    for (id, number) in queued {
        let job = seen
            .scale_set_jobs
            .get(id)
            .copied()
            .unwrap_or_else(|| runyard_scaler::scaleset::convert::job_id_of(id));
        if let Some(at) = actions
            .assigned_delivered_at(id)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        {
            seen.acked.insert(job, at.as_nanos() as i64);
        }
        if let Some(at) = seen.allocator.get(number) {
            asked.insert(job, *at);
        }
        jobs.push(job);
    }
    seen.allocator = asked;
    jobs
}

/// The create path's parts, as the scaler's engine calls them.
struct Direct {
    bus: Bus,
    coord: Coordination,
    db: Option<sqlx::PgPool>,
    allocator: Allocator,
    forges: Forges,
    provider: Provider,
    pool: PoolConfig,
    pool_id: String,
}

/// Steps of one direct create, in order (`t[i]` → `t[i + 1]`).
const DIRECT_STEPS: [&str; 7] = [
    "claim (KV create)",
    "`already_started` query",
    "allocator (stub)",
    "publish `RunnerRequested`",
    "JIT registration (fake GitHub via the proxy)",
    "`process` provider create",
    "publish `RunnerCreated`",
];

impl Direct {
    async fn new(ctx: &Ctx, stack: &Stack) -> anyhow::Result<Self> {
        let file = ScalerFile::parse(&stack.file).map_err(|e| anyhow::anyhow!("{e}"))?;
        let pool = file.pools.first().context("no pool")?.clone();
        let controller = runyard_scaler::controller_id(&stack.ns);
        let provider = Provider::from_config(
            "local",
            file.providers.get("local").context("no provider")?,
            &controller.to_string(),
            &stack.state_dir,
        );
        let github = GitHubClient::new(
            &stack.proxy.url(),
            GitHubAuth::Token(SecretString::from("bench-token")),
            Duration::from_secs(10),
        )?;
        Ok(Self {
            bus: stack.bus.clone(),
            coord: Coordination::open(&stack.bus, Duration::from_secs(10), "bench".into()).await?,
            db: sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(1))
                .connect_lazy(&ctx.db_url)
                .ok(),
            allocator: Allocator::new(&stack.allocator.url(), None, Duration::from_millis(500)),
            forges: Forges {
                github: Some(github),
                ..Forges::default()
            },
            provider,
            pool_id: runyard_scaler::pool_id(&controller, POOL).to_string(),
            pool,
        })
    }

    fn rref(&self, name: &str) -> RunnerRef {
        RunnerRef {
            pool: self.pool.name.clone(),
            name: name.to_owned(),
            pool_id: self.pool_id.clone(),
            provider: "local".into(),
            forge: Forge::Github as i32,
            instance: "github.com".into(),
        }
    }

    async fn publish(&self, body: Body) -> anyhow::Result<()> {
        let at = timestamp(time::OffsetDateTime::now_utc());
        let event = Event {
            id: runner_event_id_for(&body).unwrap_or_default(),
            occurred_at: Some(at),
            received_at: Some(at),
            source: Some(Source {
                forge: Forge::Github as i32,
                instance: "github.com".into(),
                delivery_id: String::new(),
                hook_id: String::new(),
                producer: "scaler".into(),
            }),
            body: Some(body),
        };
        self.bus
            .publish_event(&event, &TraceParent::new_root())
            .await?;
        Ok(())
    }

    /// Claim, check, size, request, register, create, report: the
    /// engine's `create_for_job` and `provision`, timed step by step.
    async fn create(&self, job: Job) -> anyhow::Result<(String, [i64; 8])> {
        let mut t = [0; 8];
        t[0] = now_ns();
        let key = claim_key(
            job.id.forge,
            &job.id.instance,
            job.id.job_id,
            job.run_attempt,
        );
        let name = instance_name(POOL, &key);
        anyhow::ensure!(
            self.coord.claim(&key, &name).await? == Claim::Won,
            "claim held"
        );
        t[1] = now_ns();
        if let Some(db) = &self.db {
            let query = sqlx::query_scalar::<_, i16>(
                "SELECT status FROM jobs WHERE forge = $1 AND instance = $2 AND job_id = $3",
            )
            .bind("github")
            .bind(&job.id.instance)
            .bind(i64::try_from(job.id.job_id).unwrap_or(i64::MAX));
            let _ = tokio::time::timeout(Duration::from_secs(1), query.fetch_optional(db)).await;
        }
        t[2] = now_ns();
        let sizing = self.allocator.size(&job, &self.pool.flavors, None).await;
        let flavor = &self.pool.flavors[sizing.flavor];
        t[3] = now_ns();
        self.publish(Body::RunnerRequested(runner_requested(
            self.rref(&name),
            &self.pool,
            Some(&job),
            key,
            "queued_job",
            Some(&sizing),
        )))
        .await?;
        t[4] = now_ns();
        let reg = self.forges.register(&self.pool, &name).await?;
        t[5] = now_ns();
        let mut labels = self.pool.labels.clone();
        labels.push(runyard_scaler::forges::pool_label(POOL));
        let instance = self
            .provider
            .create(&CreateRequest {
                name: name.clone(),
                pool: self.pool.name.clone(),
                pool_id: self.pool_id.clone(),
                flavor: flavor.name.clone(),
                memory_bytes: flavor.memory.as_u64(),
                cpus: flavor.cpus,
                image: self.pool.image.clone(),
                labels,
                jit_config: reg.jit_config,
                repo_url: "https://github.com/acme".into(),
                runner_group: String::new(),
                extra_specs: serde_json::json!({}),
                timeout: self.pool.bootstrap_timeout,
            })
            .await?;
        t[6] = now_ns();
        self.publish(Body::RunnerCreated(RunnerCreated {
            runner: Some(self.rref(&name)),
            provider_id: instance.provider_id,
            forge_runner_id: Some(reg.runner_id),
            attempt: 1,
            status: instance.status,
        }))
        .await?;
        t[7] = now_ns();
        Ok((name, t))
    }
}

fn bench_job(job_id: u64) -> Job {
    Job {
        id: JobId {
            forge: Forge::Github,
            instance: "github.com".into(),
            job_id,
        },
        run_attempt: 1,
        pipeline_id: job_id,
        labels: Some(LABELS.map(String::from).to_vec()),
        status: JobStatus::Queued,
        seen: (runyard_events::Stage::Pending, Duration::ZERO),
        cancelled: false,
        queued_at: runyard_scaler::engine::now(),
        project: "octo-org/example-workflow".into(),
        project_id: 1,
        workflow: "CI".into(),
        name: format!("{JOB_PREFIX}{job_id}"),
        git_ref: "main".into(),
        runner_name: None,
        given_up: false,
        scale_set: None,
        forge_status: String::new(),
    }
}

/// What the direct baseline measured.
#[derive(Debug, Clone)]
struct DirectOutcome {
    round: usize,
    /// Per create: the step times, and its runner's start.
    sequential: Vec<([i64; 8], Option<i64>)>,
    concurrent: Vec<([i64; 8], Option<i64>)>,
    window: (i64, i64),
    cpu: CpuUsage,
    runner_cpu: Duration,
    wall: Duration,
    errors: usize,
    /// JIT calls p50 straight to the fake and through the proxy, ns.
    jit_direct_p50: f64,
    jit_proxied_p50: f64,
}

impl DirectOutcome {
    fn rate(&self) -> f64 {
        self.concurrent.len() as f64 / ((self.window.1 - self.window.0) as f64 / 1e9)
    }
}

async fn phase_direct(ctx: &Ctx, round: usize) -> anyhow::Result<DirectOutcome> {
    let args = &ctx.args;
    progress(format!(
        "round {round}: direct create path: {} one at a time, then {} at once",
        args.sequential, args.jobs
    ));
    let stack = Stack::new(ctx, "direct", args.jobs + args.sequential + 10, false).await?;
    let direct = Arc::new(Direct::new(ctx, &stack).await?);
    let phase = ctx.next_phase();
    let base = 40_000_000_000 + phase * 10_000_000;
    let stamp_of = |stamps: &HashMap<String, i64>, name: &str| stamps.get(name).copied();

    // The proxy's own cost: JIT calls straight to the fake and through it.
    let github = stack.upstream.url();
    let straight = GitHubClient::new(
        &github,
        GitHubAuth::Token(SecretString::from("bench-token")),
        Duration::from_secs(10),
    )?;
    let proxied = direct.forges.github.clone().context("no GitHub client")?;
    let scope = GitHubScope::Org("acme".into());
    let labels: Vec<String> = LABELS.map(String::from).to_vec();
    let mut jit_times = [Vec::new(), Vec::new()];
    for i in 0..200 {
        for (k, client) in [&straight, &proxied].into_iter().enumerate() {
            let t0 = now_ns();
            client
                .generate_jitconfig(&scope, &format!("cal-{k}-{i}"), 1, &labels, None)
                .await?;
            jit_times[k].push(now_ns() - t0);
        }
    }
    let [jit_straight, jit_proxy] = jit_times;

    // One at a time (a few first to open connections).
    let mut sequential = Vec::new();
    let mut names = Vec::new();
    for i in 0..(args.sequential + 5) as u64 {
        let (name, t) = direct.create(bench_job(base + i)).await?;
        if i >= 5 {
            sequential.push(t);
            names.push(name);
        }
    }
    wait_until(
        "the sequential runners",
        Duration::from_secs(30),
        || async { stamp_count(&stack.stamps) >= args.sequential + 5 },
    )
    .await?;
    let stamps = stack.stamps();
    let sequential: Vec<_> = sequential
        .into_iter()
        .zip(&names)
        .map(|(t, n)| (t, stamp_of(&stamps, n)))
        .collect();

    // All at once, each create a task of its own, as the engine spawns them.
    let quiet = procfs::wait_for_quiet(0.25, Duration::from_secs(60)).await;
    progress(format!("  machine load before: {quiet:.2} cores"));
    let meter = CpuMeter::start(&[("nats-server", ctx.nats_pid), ("bench", std::process::id())]);
    let started = Instant::now();
    let start = now_ns();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.jobs as u64 {
        let direct = direct.clone();
        let job = bench_job(base + 1_000_000 + i);
        tasks.spawn(async move { direct.create(job).await });
    }
    let mut concurrent = Vec::new();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(done)) => concurrent.push(done),
            Ok(Err(error)) => {
                errors += 1;
                eprintln!("  direct create failed: {error:#}");
            }
            Err(_) => errors += 1,
        }
    }
    let end = concurrent.iter().map(|(_, t)| t[7]).max().unwrap_or(start);
    let want = args.sequential + 5 + concurrent.len();
    let _ = wait_until("the runners", Duration::from_secs(60), || async {
        stamp_count(&stack.stamps) >= want
    })
    .await;
    let wall = started.elapsed();
    let cpu = meter.stop();
    let runner_cpu = stack.runner_cpu();
    let stamps = stack.stamps();
    let concurrent = concurrent
        .into_iter()
        .map(|(n, t)| (t, stamp_of(&stamps, &n)))
        .collect();
    stack.finish(args.keep).await;
    Ok(DirectOutcome {
        round,
        sequential,
        concurrent,
        window: (start, end),
        cpu,
        runner_cpu,
        wall,
        errors,
        jit_direct_p50: ns(jit_straight).p50(),
        jit_proxied_p50: ns(jit_proxy).p50(),
    })
}

// ---------------------------------------------------------------------------
// The run and its report

fn progress(msg: impl AsRef<str>) {
    eprintln!("[scaler-bench] {}", msg.as_ref());
}

async fn run(args: Args) -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    let started = time::OffsetDateTime::now_utc();
    let nats = NatsServer::start().await;
    let me = std::process::id();
    let nats_pid = procfs::find_child(me, "nats-server").context("finding nats-server's pid")?;
    let client = async_nats::ConnectOptions::new()
        .name("scaler-bench")
        .connect(nats.url())
        .await
        .context("connecting to nats")?;
    let mut own_db = None;
    let db_url = if args.no_database {
        "postgres://postgres@127.0.0.1:1/none".to_owned()
    } else {
        let url = match &args.database_url {
            Some(u) => u.clone(),
            None => {
                let db = TestDb::new();
                let url = db.url.clone();
                own_db = Some(db);
                url
            }
        };
        runyard_store::migrate(&url)
            .await
            .with_context(|| format!("migrating {url}"))?;
        url
    };
    let exe = std::env::current_exe()?;
    let ctx = Ctx {
        nats_pid,
        client,
        db_url,
        root: match &args.tmp {
            Some(dir) => tempfile::Builder::new()
                .prefix("runyard-scaler-bench-")
                .tempdir_in(dir)?,
            None => tempfile::Builder::new()
                .prefix("runyard-scaler-bench-")
                .tempdir()?,
        },
        http: reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(30))
            .build()?,
        probe: http::client(4),
        template: serde_json::from_str(&runyard_testkit::fixture(FIXTURE))?,
        phases: AtomicU64::new(1),
        nats,
        exe,
        args,
    };
    progress(format!(
        "nats-server {} (pid {nats_pid}); database {}; runner {} ({:.1} MB)",
        ctx.nats.url(),
        if ctx.args.no_database {
            "none (closed port)"
        } else {
            &ctx.db_url
        },
        ctx.exe.display(),
        std::fs::metadata(&ctx.exe).map_or(0, |m| m.len()) as f64 / 1e6
    ));

    let mut outcomes = Vec::new();
    let mut directs = Vec::new();
    let has = |p: Phase| ctx.args.phases.contains(&p);
    let result: anyhow::Result<()> = async {
        for round in 1..=ctx.args.rounds {
            if has(Phase::Direct) {
                directs.push(phase_direct(&ctx, round).await?);
            }
            for (phase, mode) in [
                (Phase::Paced, Mode::Paced),
                (Phase::ScaleSet, Mode::ScaleSet),
                (Phase::Burst, Mode::Burst),
                (Phase::Backlog, Mode::Backlog),
            ] {
                if has(phase) {
                    outcomes.push(Box::pin(phase_jobs(&ctx, round, mode)).await?);
                }
            }
        }
        Ok(())
    }
    .await;
    // Runner processes of this run still alive anywhere on the machine.
    let root = ctx.root.path().display().to_string();
    let left = procfs::with_cmdline(&[RUNNER_MODE, &root]);
    for pid in &left {
        process::kill_now(*pid);
    }
    if let Some(db) = own_db {
        db.drop_db().await;
    }
    if ctx.args.keep {
        progress(format!("logs kept in {}", ctx.root.path().display()));
        let _ = ctx.root.keep();
    }
    result?;
    let report = Report {
        args: &ctx.args,
        started,
        outcomes: &outcomes,
        directs: &directs,
        leftover: left.len(),
        database: !ctx.args.no_database,
        tmp: (
            ctx.args.tmp.clone().unwrap_or_else(std::env::temp_dir),
            procfs::fs_type(&ctx.args.tmp.clone().unwrap_or_else(std::env::temp_dir)),
        ),
    };
    println!("{report}");
    Ok(())
}

struct Report<'a> {
    args: &'a Args,
    started: time::OffsetDateTime,
    outcomes: &'a [Outcome],
    directs: &'a [DirectOutcome],
    leftover: usize,
    database: bool,
    /// Where state, logs and pid files went, and its file system.
    tmp: (PathBuf, String),
}

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.args;
        writeln!(
            f,
            "Run of {} UTC: {} jobs per phase, paced at {}/s after {} warm-up jobs, burst and backlog over {} connections, {} round(s); scaler and ingest at RUST_LOG={}; {}; the process provider's state directory (log and pid files) and the runners' stamps under {} ({}).\n",
            self.started.date(),
            a.jobs,
            a.rate,
            a.warmup,
            a.concurrency,
            a.rounds,
            a.log,
            if self.database {
                "the scaler's database is a migrated Postgres on this host"
            } else {
                "the scaler's database URL is a closed port"
            },
            self.tmp.0.display(),
            self.tmp.1,
        )?;
        // Latency.
        writeln!(
            f,
            "**Latency, per job** (ms; 202 = when the load generator read ingest's answer; JobAssigned handed out = when the fake Actions service made the message answer carrying the job's `JobAssigned`)\n"
        )?;
        let mut t = Table::new([
            "round",
            "phase",
            "from → to",
            "n",
            "p50",
            "p90",
            "p95",
            "p99",
            "max",
        ]);
        // Jobs of the backlog waited for the scaler to start: no latency.
        for o in self.outcomes.iter().filter(|o| o.mode != Mode::Backlog) {
            let consumer = if o.mode == Mode::ScaleSet {
                "`queued` event at a consumer"
            } else {
                "event at a consumer (baseline)"
            };
            for (to, what) in [
                (1, consumer),
                (JIT_IN, o.mode.point(JIT_IN)),
                (JIT_OUT, "**create call starts** (JIT answered)"),
                (RUNNING, "**runner process running**"),
                (CREATED, "`RunnerCreated`"),
            ] {
                let d = spans(&o.lines, ACKED, to);
                t.row([
                    o.round.to_string(),
                    o.label.clone(),
                    format!("{} → {what}", o.mode.point(ACKED)),
                    d.len().to_string(),
                    ms(d.p50()),
                    ms(d.p90()),
                    ms(d.p95()),
                    ms(d.p99()),
                    ms(d.max()),
                ]);
            }
        }
        write!(f, "{t}")?;
        // Stages.
        writeln!(
            f,
            "\n**Where the time goes, per job** (ms between consecutive points, p50 / p99; each point from the process that saw it: bench consumer, KV entry time, allocator stub, event time, proxy, runner)\n"
        )?;
        let mut t = Table::new(
            ["step".to_owned(), "includes".to_owned()]
                .into_iter()
                .chain(
                    self.outcomes
                        .iter()
                        .map(|o| format!("r{} {}", o.round, o.label)),
                ),
        );
        // A step's name and contents, as each kind of phase of the run has it.
        let mut kinds: Vec<Mode> = Vec::new();
        for o in self.outcomes {
            let kind = if o.mode == Mode::ScaleSet {
                Mode::ScaleSet
            } else {
                Mode::Paced
            };
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        let both = |of: &dyn Fn(Mode) -> String| {
            let mut out: Vec<String> = Vec::new();
            for k in &kinds {
                let v = of(*k);
                if !out.contains(&v) {
                    out.push(v);
                }
            }
            out.join(" / ")
        };
        for i in 0..STAGES.len() {
            let cells = self.outcomes.iter().map(|o| {
                // The backlog was queued before the scaler started.
                if o.mode == Mode::Backlog && i < 2 {
                    return "–".to_owned();
                }
                let d = spans(&o.lines, i, i + 1);
                format!("{} / {}", ms(d.p50()), ms(d.p99()))
            });
            t.row(
                [
                    both(&|m| format!("{} → {}", m.point(i), m.point(i + 1))),
                    both(&|m| m.stage(i).to_owned()),
                ]
                .into_iter()
                .chain(cells),
            );
        }
        write!(f, "{t}")?;
        // Throughput.
        writeln!(f, "\n**Throughput and CPU**\n")?;
        let mut t = Table::new([
            "round",
            "phase",
            "runners running / created",
            "window s",
            "creates/s",
            "vs direct, all at once",
            "CPU µs per create: scaler / ingest / nats-server / bench / runner",
            "other load, cores",
            "mean create call ms (scaler metric)",
            "RunnerFailed",
            "webhook errors",
        ]);
        for o in self.outcomes {
            // Paced creates follow the webhooks' rate: no ratio.
            let direct = self
                .directs
                .iter()
                .find(|d| d.round == o.round && !o.mode.paced())
                .map(DirectOutcome::rate);
            let rate = o.rate();
            t.row([
                o.round.to_string(),
                o.label.clone(),
                format!("{} / {}", o.running(), o.created()),
                o.window.map_or("–".into(), |(s, e)| {
                    format!("{:.2}", (e - s) as f64 / 1e9)
                }),
                rate.map_or("–".into(), |r| format!("{r:.0}")),
                rate.zip(direct)
                    .map_or("–".into(), |(r, d)| format!("{:.0} %", 100.0 * r / d)),
                o.cpu_per_create(),
                format!("{:.2}", o.cores_other()),
                o.create_call_ms.map_or("–".into(), |m| format!("{m:.2}")),
                if o.failed.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{} ({})", o.failed.len(), o.failed.join(", "))
                },
                o.webhook_errors.to_string(),
            ]);
        }
        write!(f, "{t}")?;
        writeln!(
            f,
            "\nWindows: paced and burst from the first webhook sent, scale-set from the first job queued in the fake, to the last `RunnerCreated`; backlog from the first claim stored to the last `RunnerCreated` (the scaler's start-up and lease wait excluded). `RunnerDeleted` events: {}. Runner processes left after the run: {}.",
            self.outcomes.iter().map(|o| o.deleted).sum::<u64>(),
            self.leftover
        )?;
        // The direct baseline.
        for d in self.directs {
            writeln!(
                f,
                "\n**Direct create path, round {}** (this process calls the scaler's own claim, sizing, forge and provider code and the same SQL, without the engine; {} creates one at a time, then {} at once as tasks)\n",
                d.round,
                d.sequential.len(),
                d.concurrent.len()
            )?;
            let mut t = Table::new([
                "step".to_owned(),
                "one at a time p50 / p99 ms".to_owned(),
                format!("{} at once p50 / p99 ms", d.concurrent.len()),
            ]);
            type Creates = [([i64; 8], Option<i64>)];
            let mut row = |what: &str, of: &dyn Fn(&Creates) -> Dist| {
                let (s, c) = (of(&d.sequential), of(&d.concurrent));
                t.row([
                    what.to_owned(),
                    format!("{} / {}", ms(s.p50()), ms(s.p99())),
                    format!("{} / {}", ms(c.p50()), ms(c.p99())),
                ]);
            };
            for (i, what) in DIRECT_STEPS.iter().enumerate() {
                row(what, &|v| ns(v.iter().map(|(t, _)| t[i + 1] - t[i])));
            }
            row(
                "create call start → runner process running (fork/exec and this binary's start)",
                &|v| ns(v.iter().filter_map(|(t, s)| Some(s.as_ref()? - t[5]))),
            );
            row("**whole create path**", &|v| {
                ns(v.iter().map(|(t, _)| t[7] - t[0]))
            });
            write!(f, "{t}")?;
            let n = d.concurrent.len().max(1) as f64;
            writeln!(
                f,
                "\nAll at once: **{:.0} creates/s** ({} in {:.2} s, {} errors); CPU µs per create: bench {:.0}, nats-server {:.0}, runner {:.0}; other load {:.2} cores. JIT call p50 straight to the fake {} ms, through the timing proxy {} ms.",
                d.rate(),
                d.concurrent.len(),
                (d.window.1 - d.window.0) as f64 / 1e9,
                d.errors,
                d.cpu.of("bench").as_secs_f64() * 1e6 / n,
                d.cpu.of("nats-server").as_secs_f64() * 1e6 / n,
                d.runner_cpu.as_secs_f64() * 1e6 / n,
                d.cpu.others().saturating_sub(d.runner_cpu).as_secs_f64()
                    / d.wall.as_secs_f64().max(1e-9),
                ms(d.jit_direct_p50),
                ms(d.jit_proxied_p50),
            )?;
        }
        // Targets.
        writeln!(f, "\n**Targets** (paced phases)\n")?;
        let mut t = Table::new(["target", "round", "measured", "verdict"]);
        for o in self.outcomes.iter().filter(|o| o.mode.paced()) {
            let targets: &[(usize, &str, f64, f64)] = if o.mode == Mode::ScaleSet {
                &[(JIT_OUT, "create call starts", 50.0, 300.0)]
            } else {
                &[
                    (JIT_OUT, "create call starts", 100.0, 500.0),
                    (RUNNING, "runner process running", 100.0, 500.0),
                ]
            };
            for &(to, what, p50, p99) in targets {
                let d = spans(&o.lines, ACKED, to);
                let complete = d.len() == o.jobs;
                for (q, value, limit) in [("p50", d.p50(), p50), ("p99", d.p99(), p99)] {
                    t.row([
                        format!("{} → {what} {q} ≤ {limit} ms", o.mode.point(ACKED)),
                        o.round.to_string(),
                        format!("{} ms ({} of {} jobs)", ms(value), d.len(), o.jobs),
                        verdict(complete && value <= limit * 1e6).to_owned(),
                    ]);
                }
            }
        }
        write!(f, "{t}")?;
        // Scale-set against webhook mode, same round.
        let mut t = Table::new([
            "round",
            "to",
            "scale-set p50 / p90 / p99 ms",
            "webhook p50 / p90 / p99 ms",
            "ratio p50 / p90 / p99",
        ]);
        for o in self.outcomes.iter().filter(|o| o.mode == Mode::ScaleSet) {
            let Some(base) = self
                .outcomes
                .iter()
                .find(|b| b.round == o.round && b.mode == Mode::Paced)
            else {
                continue;
            };
            for (to, what) in [
                (JIT_OUT, "create call starts"),
                (RUNNING, "runner process running"),
            ] {
                let (d, b) = (spans(&o.lines, ACKED, to), spans(&base.lines, ACKED, to));
                let q = |d: &Dist| format!("{} / {} / {}", ms(d.p50()), ms(d.p90()), ms(d.p99()));
                let r = |x: f64, y: f64| format!("{:.2}×", x / y);
                t.row([
                    o.round.to_string(),
                    what.to_owned(),
                    q(&d),
                    q(&b),
                    format!(
                        "{} / {} / {}",
                        r(d.p50(), b.p50()),
                        r(d.p90(), b.p90()),
                        r(d.p99(), b.p99())
                    ),
                ]);
            }
        }
        if !t.is_empty() {
            writeln!(
                f,
                "\n**Scale-set against webhook mode** (JobAssigned handed out → …, against 202 → … of the paced webhook phase of the same round)\n"
            )?;
            write!(f, "{t}")?;
        }
        Ok(())
    }
}
