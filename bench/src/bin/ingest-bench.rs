//! `ingest-bench`: the ingest benchmark (docs/benchmarks.md, "Ingest").
//!
//! Starts its own nats-server, measures the baseline — raw async-nats
//! JetStream publishes of delivery-sized messages, each awaited for its ack —
//! then runs the real `runyard-ingest` binary as a child process and drives
//! signed GitHub `workflow_job` deliveries at it over loopback HTTP/1.1:
//! closed-loop throughput at each concurrency, open-loop latency at a fixed
//! rate, ingest's RSS and every process's CPU per delivery, and finally
//! checks that the event log holds exactly one event per accepted delivery.
//! Prints markdown for docs/benchmarks.md on stdout; progress on stderr.

// The report is this program's output.
#![allow(clippy::print_stdout)]

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::header::{ACCEPT, HeaderValue, USER_AGENT};
use hyper::{Request, StatusCode, Uri};
use runyard_bench::args::key_value;
use runyard_bench::attempts::Attempts;
use runyard_bench::http::{self, HttpClient};
use runyard_bench::load::{self, ClosedLoopResult, OpenLoopResult, Outcome, Tally};
use runyard_bench::process::{Service, service_command};
use runyard_bench::procfs::{self, CpuMeter, CpuUsage, Memory, Perf, RssSampler};
use runyard_bench::report::{Percentiles, Table, mib, ms, rate, thousands, verdict};
use runyard_bench::webhook::{self, FIXTURE, SECRET};
use runyard_bus::{Bus, StreamSettings};
use runyard_events::{Forge, JobStatus, Namespace};
use runyard_forge::{GithubDelivery, Normalized};
use runyard_testkit::{NatsServer, free_port, github_signature, unique_namespace};
use time::OffsetDateTime;

/// The fixture's `workflow_job.id`, replaced by a unique id of equal width
/// in every delivery (it also appears in the job's URLs).
const FIXTURE_JOB_ID: &str = "21870573124";
/// Any single request or publish that takes longer counts as failed.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// Ingest benchmark: signed `workflow_job` deliveries over loopback HTTP
/// against raw acked JetStream publishes at the same concurrency.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The `runyard-ingest` binary to run.
    #[arg(long, default_value = "target/release/runyard-ingest")]
    ingest_bin: PathBuf,
    /// Concurrency levels (comma-separated): closed-loop workers, i.e. HTTP
    /// connections or outstanding publishes.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    concurrency: Vec<usize>,
    /// Deliveries per throughput run (and publishes per baseline run).
    #[arg(long, default_value_t = 50_000)]
    deliveries: u64,
    /// Rate of the fixed-rate latency run, deliveries per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Duration of the fixed-rate latency run, seconds.
    #[arg(long, default_value_t = 10)]
    latency_secs: u64,
    /// Deliveries sent (and not measured) after ingest is ready.
    #[arg(long, default_value_t = 2000)]
    warmup: u64,
    /// `RUST_LOG` of ingest; several (comma-separated) run a fresh ingest
    /// per level.
    #[arg(long, value_delimiter = ',', default_value = "warn")]
    ingest_log: Vec<String>,
    /// Upper bound of any single run, seconds.
    #[arg(long, default_value_t = 300)]
    run_limit_secs: u64,
    /// Iterations of the in-process CPU breakdown.
    #[arg(long, default_value_t = 20_000)]
    breakdown_iters: u32,
    /// Skip the raw-publish baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Extra environment for ingest, `KEY=VALUE` (repeatable), e.g.
    /// `TOKIO_WORKER_THREADS=1` or `LD_PRELOAD=...` for A/B experiments;
    /// shown next to `RUST_LOG` in the report.
    #[arg(long, value_parser = key_value)]
    ingest_env: Vec<(String, String)>,
    /// Before each measured run, wait up to this many seconds for the
    /// machine to be quiet (other builds and tests share it).
    #[arg(long, default_value_t = 60)]
    quiet_wait_secs: u64,
    /// "Quiet" means the whole machine is busy less than this many cores.
    #[arg(long, default_value_t = 0.3)]
    quiet_below: f64,
    /// A measured run during which other work kept more than this many
    /// cores busy is discarded and repeated (see `--attempts`).
    #[arg(long, default_value_t = 0.25)]
    max_other_load: f64,
    /// Attempts per measured run before keeping a disturbed one.
    #[arg(long, default_value_t = 3)]
    attempts: u32,
    /// Profile ingest with `perf record --call-graph dwarf` into this file
    /// during the first throughput run (of the first `--ingest-log` level);
    /// summarize with `perf script -i FILE | bench/tools/perf-buckets.py`.
    #[arg(long)]
    perf_record: Option<PathBuf>,
    /// Seconds `--perf-record` records (keep it shorter than the run).
    #[arg(long, default_value_t = 5)]
    perf_secs: u64,
    /// Only measure the baseline (no ingest runs).
    #[arg(long, conflicts_with = "no_baseline")]
    baseline_only: bool,
    /// Worker threads of the load generator's tokio runtime; 0 (default)
    /// runs it on a single-threaded (current-thread) runtime, which costs
    /// the shared machine the least CPU per request.
    #[arg(long, default_value_t = 0)]
    client_threads: usize,
}

fn main() -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    let args = Args::parse();
    let runtime = if args.client_threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.client_threads)
            .enable_all()
            .build()?
    };
    // Interrupted, the run is dropped, and with it the nats-server and
    // ingest children (both are killed on drop).
    runtime.block_on(async {
        tokio::select! {
            result = Box::pin(run(args)) => result,
            () = runyard_telemetry::shutdown_signal() => anyhow::bail!("interrupted"),
        }
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.ingest_bin.is_file(),
        "no ingest binary at {} (build it: cargo build --release -p runyard-ingest)",
        args.ingest_bin.display()
    );
    anyhow::ensure!(!args.concurrency.is_empty(), "no concurrency level given");
    let started = OffsetDateTime::now_utc();

    let nats = NatsServer::start().await;
    let me = std::process::id();
    let nats_pid = procfs::find_child(me, "nats-server").context("finding the nats-server pid")?;
    progress(format!("nats-server {} (pid {nats_pid})", nats.url()));
    let client = async_nats::ConnectOptions::new()
        .name("ingest-bench")
        .connect(nats.url())
        .await
        .context("connecting to nats")?;

    let template = runyard_testkit::fixture(FIXTURE);
    let setup = Setup::new(&template, &client)?;
    progress(format!(
        "delivery body {} B, event {} B",
        setup.body_len, setup.event_len
    ));

    settle(&args).await;
    let breakdown = {
        let template = template.clone();
        let bus = setup.bus.clone();
        let iters = args.breakdown_iters;
        tokio::task::spawn_blocking(move || Breakdown::measure(&template, &bus, iters)).await??
    };

    let mut baselines = Vec::new();
    if !args.no_baseline {
        let base_bus = Bus::from_client(client.clone(), unique_namespace());
        base_bus
            .ensure_streams(&StreamSettings::default())
            .await
            .context("creating the baseline streams")?;
        for &c in &args.concurrency {
            let b = Box::pin(run_baseline(&args, &setup, &base_bus, c, nats_pid)).await?;
            baselines.push(b);
        }
    }

    let mut runs = Vec::new();
    let levels: &[String] = if args.baseline_only {
        &[]
    } else {
        &args.ingest_log
    };
    for (k, level) in levels.iter().enumerate() {
        let run = Box::pin(run_ingest(
            &args,
            k == 0,
            level,
            &template,
            &nats,
            &client,
            nats_pid,
        ))
        .await?;
        runs.push(run);
    }

    let report = render(&args, &setup, &breakdown, &baselines, &runs, started);
    print!("{report}");
    drop(client);
    drop(nats);
    Ok(())
}

/// Other load (cores) during a run: machine busy time not spent in our
/// processes, over the run's wall time.
fn other_load(cpu: &CpuUsage, wall: Duration) -> f64 {
    cpu.others().as_secs_f64() / wall.as_secs_f64().max(1e-9)
}

/// Waits for a quiet machine (bounded) and says how quiet it got.
async fn settle(args: &Args) -> f64 {
    procfs::settle(args.quiet_below, Duration::from_secs(args.quiet_wait_secs)).await
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("ingest-bench: {}", msg.as_ref());
}

/// What every run shares: message sizes and a bus for encoding events.
struct Setup {
    /// The NATS headers ingest gives a raw delivery (request headers under
    /// `Http-`, trace context, type), for the ingest-shaped baseline.
    raw_headers: async_nats::HeaderMap,
    body_len: usize,
    event_len: usize,
    event_sample: Bytes,
    bus: Bus,
}

impl Setup {
    fn new(template: &str, client: &async_nats::Client) -> anyhow::Result<Self> {
        let bus = Bus::from_client(client.clone(), unique_namespace());
        let event = normalize_sample(template)?;
        let msg = bus.event_message(&event, &runyard_bus::TraceParent::new_root())?;
        let mut raw_headers = async_nats::HeaderMap::new();
        raw_headers.insert(
            runyard_bus::TRACEPARENT_HEADER,
            runyard_bus::TraceParent::new_root().to_string().as_str(),
        );
        raw_headers.insert(runyard_bus::EVENT_TYPE_HEADER, "RawDelivery");
        let sample = prepare(template, 0xffff, 1)?;
        let request = delivery_request(
            &Uri::from_static("http://127.0.0.1:8080/webhooks/github"),
            sample.first().context("one prepared delivery")?,
        )?;
        let length = template.len().to_string();
        let extra = [
            ("host", "127.0.0.1:8080"),
            ("content-length", length.as_str()),
        ];
        for (name, value) in request
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)))
            .chain(extra)
        {
            raw_headers.insert(format!("Http-{name}").as_str(), value);
        }
        Ok(Self {
            raw_headers,
            body_len: template.len(),
            event_len: msg.payload.len(),
            event_sample: msg.payload,
            bus,
        })
    }
}

fn normalize_sample(body: &str) -> anyhow::Result<runyard_events::Event> {
    let d = GithubDelivery {
        event: Some("workflow_job"),
        delivery_id: Some("00000000-0000-4000-8000-000000000000"),
        hook_id: Some("4242"),
        enterprise_host: None,
        content_type: Some("application/json"),
        body: body.as_bytes(),
        received_at: OffsetDateTime::now_utc(),
    };
    match runyard_forge::normalize_github(&d)? {
        Normalized::Events(mut events) if !events.is_empty() => Ok(events.swap_remove(0)),
        other => anyhow::bail!("fixture did not normalize to an event: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Deliveries

/// One signed delivery, prepared before any timing starts.
struct Prepared {
    body: Bytes,
    delivery: HeaderValue,
    signature: HeaderValue,
}

/// `n` deliveries with unique `X-GitHub-Delivery` ids and `workflow_job`
/// ids (of equal width, so every body has the fixture's size), signed.
/// `phase` keeps the ids of different runs apart.
fn prepare(template: &str, phase: u64, n: u64) -> anyhow::Result<Arc<Vec<Prepared>>> {
    let mut out = Vec::with_capacity(usize::try_from(n)?);
    for i in 0..n {
        let job_id = 30_000_000_000 + phase * 100_000_000 + i;
        let body = template.replace(FIXTURE_JOB_ID, &job_id.to_string());
        let delivery = webhook::delivery_id(phase, i);
        let signature = github_signature(SECRET, body.as_bytes());
        out.push(Prepared {
            body: Bytes::from(body),
            delivery: HeaderValue::from_str(&delivery)?,
            signature: HeaderValue::from_str(&signature)?,
        });
    }
    Ok(Arc::new(out))
}

fn delivery_request(uri: &Uri, p: &Prepared) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
    let mut request = Request::post(uri.clone())
        .header(ACCEPT, "*/*")
        .header(USER_AGENT, "GitHub-Hookshot/ingest-bench")
        .header(webhook::DELIVERY, p.delivery.clone())
        .header(webhook::SIGNATURE, p.signature.clone());
    for (name, value) in webhook::HEADERS {
        request = request.header(name, value);
    }
    request.body(Full::new(p.body.clone()))
}

/// An operation that posts delivery `i` of `set`: `Ok` only for a `202`
/// that was not a duplicate.
fn delivery_op(
    client: HttpClient,
    uri: Uri,
    set: Arc<Vec<Prepared>>,
) -> impl Fn(u64) -> futures::future::BoxFuture<'static, Outcome> + Send + Sync + 'static {
    move |i| {
        let client = client.clone();
        let uri = uri.clone();
        let set = set.clone();
        Box::pin(async move {
            let p = usize::try_from(i)
                .ok()
                .and_then(|i| set.get(i))
                .ok_or(Cow::Borrowed("no such delivery"))?;
            let req =
                delivery_request(&uri, p).map_err(|e| Cow::Owned(format!("bad request: {e}")))?;
            match http::send(&client, req, OP_TIMEOUT).await? {
                (StatusCode::ACCEPTED, body) if webhook::is_duplicate(&body) => {
                    Err("202 duplicate".into())
                }
                (StatusCode::ACCEPTED, _) => Ok(()),
                (status, _) => Err(format!("status {}", status.as_u16()).into()),
            }
        })
    }
}

// ---------------------------------------------------------------------------
// Baseline: raw acked JetStream publishes

/// µs of CPU of process `name` per operation.
fn per_op(cpu: &CpuUsage, name: &str, ops: u64) -> String {
    if ops == 0 {
        return "-".into();
    }
    format!("{:.0}", cpu.of(name).as_secs_f64() * 1e6 / ops as f64)
}

/// CPU µs per delivery of ingest, nats-server and the load generator, as
/// one `ingest / nats / bench` cell.
fn cpu_per_delivery(cpu: &CpuUsage, ok: u64) -> String {
    format!(
        "{} / {} / {}",
        per_op(cpu, "ingest", ok),
        per_op(cpu, "nats", ok),
        per_op(cpu, "bench", ok)
    )
}

/// Ingest's peak RSS (`VmHWM` or the sampler's maximum, whichever is
/// higher) and its RSS at the end, as one `peak / now` MiB cell.
fn rss_cell(mem: &Memory, sampled_max_kib: u64) -> String {
    format!(
        "{} / {}",
        mib(mem.hwm_kib.max(sampled_max_kib)),
        mib(mem.rss_kib)
    )
}

/// Cores busy on average over `wall`: ours, and other load on the machine
/// (and which attempt this was, when earlier ones were disturbed).
fn cores_busy(cpu: &CpuUsage, wall: Duration, attempts: u32) -> String {
    let ours: Duration = cpu.by_process.iter().map(|(_, d)| *d).sum();
    let secs = wall.as_secs_f64().max(1e-9);
    let mut cell = format!(
        "{:.2} (+{:.2} other)",
        ours.as_secs_f64() / secs,
        other_load(cpu, wall)
    );
    if attempts > 1 {
        let _ = write!(cell, " #{attempts}");
    }
    cell
}

struct Baseline {
    concurrency: usize,
    single: ClosedLoopResult,
    single_cpu: CpuUsage,
    single_attempts: u32,
    /// Other load during the kept single-publish run, cores.
    single_other: f64,
    pair: ClosedLoopResult,
    pair_cpu: CpuUsage,
    pair_attempts: u32,
}

async fn run_baseline(
    args: &Args,
    setup: &Setup,
    bus: &Bus,
    concurrency: usize,
    nats_pid: u32,
) -> anyhow::Result<Baseline> {
    let (n, limit) = (args.deliveries, Duration::from_secs(args.run_limit_secs));
    let me = std::process::id();
    let js = jetstream::new(bus.client().clone());
    let raw_subject = bus.namespace().raw_subject("github");
    let event_subject = bus
        .namespace()
        .job_subject(Forge::Github, JobStatus::Queued);
    let payload = Bytes::from(vec![b'x'; setup.body_len]);

    progress(format!(
        "baseline: {n} raw acked publishes at concurrency {concurrency}"
    ));
    let mut tries = Attempts::new(args.max_other_load, args.attempts);
    loop {
        let attempt = tries.next_number();
        settle(args).await;
        let meter = CpuMeter::start(&[("nats", nats_pid), ("bench", me)]);
        let (js, subject, payload) = (js.clone(), raw_subject.clone(), payload.clone());
        let result = load::closed_loop(n, concurrency, limit, move |i| {
            let (js, subject, payload) = (js.clone(), subject.clone(), payload.clone());
            let id = format!("base-{concurrency}-{attempt}-{i}");
            async move {
                acked_publish(
                    &js,
                    subject,
                    PublishMessage::build().payload(payload).message_id(id),
                )
                .await
            }
        })
        .await;
        let cpu = meter.stop();
        progress(format!("  {} msgs/s", rate(result.ok_rate())));
        if tries.record(other_load(&cpu, result.elapsed), (result, cpu)) {
            break;
        }
    }
    let ((single, single_cpu), single_attempts, single_other, _) = tries.finish();

    // What ingest asks of JetStream per delivery: the raw delivery (with
    // its headers) and the event, published concurrently, both awaited.
    progress(format!(
        "baseline: {n} raw+event publish pairs at concurrency {concurrency}"
    ));
    let mut tries = Attempts::new(args.max_other_load, args.attempts);
    loop {
        let attempt = tries.next_number();
        settle(args).await;
        let meter = CpuMeter::start(&[("nats", nats_pid), ("bench", me)]);
        let (js, payload) = (js.clone(), payload.clone());
        let (raw_subject, event_subject) = (raw_subject.clone(), event_subject.clone());
        let event = setup.event_sample.clone();
        let raw_headers = setup.raw_headers.clone();
        let result = load::closed_loop(n, concurrency, limit, move |i| {
            let (js, payload, event) = (js.clone(), payload.clone(), event.clone());
            let raw_headers = raw_headers.clone();
            let (raw_subject, event_subject) = (raw_subject.clone(), event_subject.clone());
            async move {
                let raw = PublishMessage::build()
                    .payload(payload)
                    .headers(raw_headers)
                    .message_id(format!("pair-raw-{concurrency}-{attempt}-{i}"));
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    runyard_bus::TRACEPARENT_HEADER,
                    runyard_bus::TraceParent::new_root().to_string().as_str(),
                );
                headers.insert(runyard_bus::EVENT_TYPE_HEADER, "JobObserved");
                let ev = PublishMessage::build()
                    .payload(event)
                    .headers(headers)
                    .message_id(format!("pair-event-{concurrency}-{attempt}-{i}"));
                let (a, b) = tokio::join!(
                    acked_publish(&js, raw_subject, raw),
                    acked_publish(&js, event_subject, ev)
                );
                a.and(b)
            }
        })
        .await;
        let cpu = meter.stop();
        progress(format!("  {} pairs/s", rate(result.ok_rate())));
        if tries.record(other_load(&cpu, result.elapsed), (result, cpu)) {
            break;
        }
    }
    let ((pair, pair_cpu), pair_attempts, _, _) = tries.finish();
    Ok(Baseline {
        concurrency,
        single,
        single_cpu,
        single_attempts,
        single_other,
        pair,
        pair_cpu,
        pair_attempts,
    })
}

async fn acked_publish(js: &jetstream::Context, subject: String, msg: PublishMessage) -> Outcome {
    let publish = async {
        let ack = js
            .send_publish(subject, msg)
            .await
            .map_err(|e| Cow::Owned(format!("publish: {}", e.kind())))?;
        ack.await
            .map_err(|e| Cow::Owned(format!("ack: {}", e.kind())))
    };
    match tokio::time::timeout(OP_TIMEOUT, publish).await {
        Ok(Ok(ack)) if ack.duplicate => Err("duplicate".into()),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("timeout".into()),
    }
}

// ---------------------------------------------------------------------------
// Ingest runs

/// The ingest child process.
struct Ingest {
    service: Service,
    pid: u32,
    base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ingest {
    async fn spawn(
        bin: &Path,
        nats_url: &str,
        ns: &Namespace,
        log_level: &str,
        extra_env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let port = free_port();
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("ingest.log");
        let log_file = std::fs::File::create(&log)?;
        let mut cmd = service_command(bin, nats_url, ns.as_str(), log_level);
        cmd.env("RUNYARD_INGEST_LISTEN", format!("127.0.0.1:{port}"))
            .env("RUNYARD_GITHUB_WEBHOOK_SECRET", SECRET)
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file));
        let service = Service::spawn(&mut cmd)?;
        Ok(Self {
            pid: service.pid,
            service,
            base: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        })
    }

    fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    async fn stop(mut self) {
        let _ = self.service.child.kill().await;
    }
}

struct Throughput {
    concurrency: usize,
    result: ClosedLoopResult,
    cpu: CpuUsage,
    mem: Memory,
    sampled_max_kib: u64,
    attempts: u32,
    /// Other load during the kept run, cores.
    other: f64,
}

struct Latency {
    result: OpenLoopResult,
    cpu: CpuUsage,
    mem: Memory,
    sampled_max_kib: u64,
    attempts: u32,
    /// Other load during the kept run, cores.
    other: f64,
}

struct IngestRun {
    log_level: String,
    warmup: Tally,
    /// Outcomes of runs discarded because other work disturbed them (their
    /// deliveries are in the streams too).
    discarded: Tally,
    latency: Latency,
    throughput: Vec<Throughput>,
    events_stored: u64,
    raw_stored: u64,
    log_bytes: u64,
    idle_rss_kib: u64,
}

impl IngestRun {
    fn accepted(&self) -> u64 {
        self.warmup.ok
            + self.discarded.ok
            + self.latency.result.tally.ok
            + self
                .throughput
                .iter()
                .map(|t| t.result.tally.ok)
                .sum::<u64>()
    }

    fn answered(&self) -> u64 {
        self.warmup.total()
            + self.discarded.total()
            + self.latency.result.tally.total()
            + self
                .throughput
                .iter()
                .map(|t| t.result.tally.total())
                .sum::<u64>()
    }
}

async fn run_ingest(
    args: &Args,
    profile: bool,
    log_level: &str,
    template: &str,
    nats: &NatsServer,
    client: &async_nats::Client,
    nats_pid: u32,
) -> anyhow::Result<IngestRun> {
    let ns = unique_namespace();
    let ingest = Ingest::spawn(
        &args.ingest_bin,
        &nats.url(),
        &ns,
        log_level,
        &args.ingest_env,
    )
    .await?;
    progress(format!(
        "ingest pid {} on {} (RUST_LOG={log_level}, namespace {ns})",
        ingest.pid, ingest.base
    ));
    let max_c = args.concurrency.iter().copied().max().unwrap_or(32);
    let http = http::client(max_c.max(64));
    let ready = http::wait_for_200(
        &http,
        &format!("{}/readyz", ingest.base),
        Duration::from_secs(30),
    )
    .await;
    if let Err(e) = ready {
        anyhow::bail!("{e}\ningest log:\n{}", ingest.log_tail());
    }
    let uri: Uri = format!("{}/webhooks/github", ingest.base).parse()?;
    let limit = Duration::from_secs(args.run_limit_secs);
    let me = std::process::id();
    let pids = [("ingest", ingest.pid), ("nats", nats_pid), ("bench", me)];
    let idle_rss_kib = procfs::memory(ingest.pid)?.rss_kib;

    // Warm-up: connections, allocator pools, stream files.
    let set = prepare(template, 0, args.warmup)?;
    let warm = load::closed_loop(
        args.warmup,
        max_c,
        limit,
        delivery_op(http.clone(), uri.clone(), set),
    )
    .await;
    progress(format!(
        "  warm-up: {} ok, failures {}",
        warm.tally.ok,
        warm.tally.failures_text()
    ));

    // Each measured run gets its own deliveries (ids never repeat, also
    // when a disturbed run is repeated).
    let mut phase = 1;

    // Fixed-rate latency, open loop.
    let n = (args.rate * args.latency_secs as f64).round() as u64;
    progress(format!(
        "  latency: {} deliveries/s for {} s",
        args.rate, args.latency_secs
    ));
    let mut discarded = Tally::default();
    let mut tries = Attempts::new(args.max_other_load, args.attempts);
    loop {
        let set = prepare(template, phase, n)?;
        phase += 1;
        settle(args).await;
        let _ = procfs::reset_peak_rss(ingest.pid);
        let sampler = RssSampler::start(ingest.pid, Duration::from_millis(50));
        let meter = CpuMeter::start(&pids);
        let result = load::open_loop(
            args.rate,
            Duration::from_secs(args.latency_secs),
            4096,
            delivery_op(http.clone(), uri.clone(), set),
        )
        .await;
        let cpu = meter.stop();
        let mem = procfs::memory(ingest.pid)?;
        let sampled_max_kib = sampler.stop().await;
        let p = Percentiles::of(&result.from_schedule);
        progress(format!(
            "  p50 {} ms p99 {} ms max {} ms, failures {}",
            ms(p.p50),
            ms(p.p99),
            ms(p.max),
            result.tally.failures_text()
        ));
        let by_second: Vec<String> = result
            .per_second
            .iter()
            .map(|h| ms(h.value_at_quantile(0.99)))
            .collect();
        progress(format!("  p99 ms by second: {}", by_second.join(" ")));
        let other = other_load(&cpu, result.elapsed);
        let run = Latency {
            result,
            cpu,
            mem,
            sampled_max_kib,
            attempts: 1,
            other,
        };
        if tries.record(other, run) {
            break;
        }
    }
    let (mut latency, attempts, _, rest) = tries.finish();
    latency.attempts = attempts;
    for r in &rest {
        discarded.merge(&r.result.tally);
    }

    // Closed-loop throughput at each concurrency.
    let mut throughput = Vec::new();
    let mut profile_next = profile;
    for &c in &args.concurrency {
        progress(format!(
            "  throughput: {} deliveries at concurrency {c}",
            args.deliveries
        ));
        let mut tries = Attempts::new(args.max_other_load, args.attempts);
        loop {
            let set = prepare(template, phase, args.deliveries)?;
            phase += 1;
            settle(args).await;
            let _ = procfs::reset_peak_rss(ingest.pid);
            let sampler = RssSampler::start(ingest.pid, Duration::from_millis(50));
            let perf = match (&args.perf_record, profile_next) {
                (Some(file), true) => {
                    Some(Perf::start(file, ingest.pid, args.perf_secs, "ingest")?)
                }
                _ => None,
            };
            let meter = CpuMeter::start(&pids);
            let result = load::closed_loop(
                args.deliveries,
                c,
                limit,
                delivery_op(http.clone(), uri.clone(), set),
            )
            .await;
            let cpu = meter.stop();
            if let Some(perf) = perf {
                profile_next = false;
                perf.finish().await;
            }
            let mem = procfs::memory(ingest.pid)?;
            let sampled_max_kib = sampler.stop().await;
            progress(format!(
                "  {} deliveries/s, failures {}",
                rate(result.ok_rate()),
                result.tally.failures_text()
            ));
            let other = other_load(&cpu, result.elapsed);
            let run = Throughput {
                concurrency: c,
                result,
                cpu,
                mem,
                sampled_max_kib,
                attempts: 1,
                other,
            };
            if tries.record(other, run) {
                break;
            }
        }
        let (mut run, attempts, _, rest) = tries.finish();
        run.attempts = attempts;
        for r in &rest {
            discarded.merge(&r.result.tally);
        }
        throughput.push(run);
    }

    // Every accepted delivery is one event and one raw delivery, no more.
    let js = jetstream::new(client.clone());
    let count = |name: String| {
        let js = js.clone();
        async move {
            let mut stream = js
                .get_stream(&name)
                .await
                .with_context(|| format!("stream {name}"))?;
            let info = stream
                .info()
                .await
                .with_context(|| format!("stream {name} info"))?;
            anyhow::Ok(info.state.messages)
        }
    };
    let events_stored = count(ns.events_stream()).await?;
    let raw_stored = count(ns.raw_stream()).await?;
    let log_bytes = ingest.log_bytes();
    ingest.stop().await;
    let mut label = log_level.to_owned();
    for (k, v) in &args.ingest_env {
        let v = v.rsplit('/').next().unwrap_or(v);
        let _ = write!(label, " {k}={v}");
    }
    Ok(IngestRun {
        log_level: label,
        warmup: warm.tally,
        discarded,
        latency,
        throughput,
        events_stored,
        raw_stored,
        log_bytes,
        idle_rss_kib,
    })
}

// ---------------------------------------------------------------------------
// In-process CPU breakdown

/// Single-threaded cost of ingest's per-delivery CPU work outside HTTP and
/// NATS I/O, measured with the same library calls ingest makes.
struct Breakdown {
    iters: u32,
    /// Steps ingest performs; names starting with a space are parts of the
    /// step above.
    steps: Vec<(&'static str, Duration)>,
}

impl Breakdown {
    fn measure(template: &str, bus: &Bus, iters: u32) -> anyhow::Result<Self> {
        use std::hint::black_box;
        let iters = iters.max(1);
        let body = Bytes::from(template.to_owned());
        let signature = github_signature(SECRET, &body);
        let event = normalize_sample(template)?;
        let tp = runyard_bus::TraceParent::new_root();
        let mut steps = Vec::new();

        let t = Instant::now();
        for _ in 0..iters {
            let ok = runyard_forge::verify::github_signature(
                black_box(SECRET.as_bytes()),
                black_box(&body),
                Some(black_box(signature.as_str())),
            );
            black_box(ok.is_ok());
        }
        steps.push((
            "HMAC-SHA256 signature check (3.2 KB body)",
            t.elapsed() / iters,
        ));

        let t = Instant::now();
        for _ in 0..iters {
            black_box(normalize_sample(black_box(template))?);
        }
        steps.push((
            "normalize_github: JSON parse + JobObserved",
            t.elapsed() / iters,
        ));

        let t = Instant::now();
        for _ in 0..iters {
            let traceparent = black_box(&tp).header_value();
            black_box(bus.prepare_event(black_box(&event), &traceparent)?);
        }
        steps.push((
            "prepare_event: subject, NATS headers, prost encode",
            t.elapsed() / iters,
        ));

        // The raw delivery as ingest stores it: request headers copied
        // under `Http-`, as NATS headers.
        let request = delivery_request(
            &Uri::from_static("http://127.0.0.1/webhooks/github"),
            &Prepared {
                body: body.clone(),
                delivery: HeaderValue::from_static("00000000-0000-4000-8000-000000000000"),
                signature: HeaderValue::from_str(&signature)?,
            },
        )?;
        let ns = bus.namespace();
        let t = Instant::now();
        for _ in 0..iters {
            let traceparent = tp.header_value();
            black_box(runyard_bus::raw_message(
                ns,
                "github",
                "00000000-0000-4000-8000-000000000000",
                black_box(request.headers()),
                body.clone(),
                &traceparent,
            ));
        }
        steps.push((
            "raw_message: the raw delivery's NATS headers",
            t.elapsed() / iters,
        ));

        let t = Instant::now();
        for _ in 0..iters {
            let body = serde_json::json!({"event_id": black_box(&event.id), "duplicate": false});
            black_box(serde_json::to_vec(&body)?);
        }
        steps.push(("202 JSON response body", t.elapsed() / iters));
        Ok(Self { iters, steps })
    }

    /// Sum of the top-level steps (sub-steps are indented).
    fn total(&self) -> Duration {
        self.steps
            .iter()
            .filter(|(name, _)| !name.starts_with(' '))
            .map(|(_, d)| *d)
            .sum()
    }
}

// ---------------------------------------------------------------------------
// Report

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// A verdict, flagged when other work disturbed a run it rests on.
fn verdict_of(args: &Args, ok: bool, others: &[f64]) -> String {
    let worst = others.iter().copied().fold(0.0_f64, f64::max);
    if worst > args.max_other_load {
        format!(
            "{} (disturbed: other work used {worst:.2} cores)",
            verdict(ok)
        )
    } else {
        verdict(ok).to_owned()
    }
}

fn render(
    args: &Args,
    setup: &Setup,
    breakdown: &Breakdown,
    baselines: &[Baseline],
    runs: &[IngestRun],
    started: OffsetDateTime,
) -> String {
    let mut out = String::new();
    let date = started.date();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let _ = writeln!(out, "<!-- ingest-bench output, {date} -->");
    let _ = writeln!(
        out,
        "Run {date} on {cores} cores (load generator, nats-server and ingest on the same machine). \
         Delivery body {} B (`{FIXTURE}` with unique `X-GitHub-Delivery` and `workflow_job.id`), \
         encoded `JobObserved` event {} B; {} deliveries per throughput run, {} warm-up deliveries, \
         latency at {} deliveries/s for {} s.\n",
        thousands(setup.body_len as u64),
        thousands(setup.event_len as u64),
        thousands(args.deliveries),
        thousands(args.warmup),
        rate(args.rate),
        args.latency_secs,
    );

    if !baselines.is_empty() {
        let _ = writeln!(
            out,
            "**Baseline: raw async-nats JetStream publishes, each awaited for its ack** (one connection, file storage, same stream settings as ingest)\n"
        );
        let mut t = Table::new([
            "concurrency",
            "raw msgs/s",
            "p50 / p99 ms",
            "CPU µs/msg nats / bench",
            "cores busy",
            "raw+event pairs/s",
            "pair p50 / p99 ms",
            "CPU µs/pair nats / bench",
            "pair cores busy",
            "errors",
        ]);
        for b in baselines {
            let s = Percentiles::of(&b.single.latency);
            let p = Percentiles::of(&b.pair.latency);
            t.row([
                b.concurrency.to_string(),
                rate(b.single.ok_rate()),
                format!("{} / {}", ms(s.p50), ms(s.p99)),
                format!(
                    "{} / {}",
                    per_op(&b.single_cpu, "nats", b.single.tally.ok),
                    per_op(&b.single_cpu, "bench", b.single.tally.ok)
                ),
                cores_busy(&b.single_cpu, b.single.elapsed, b.single_attempts),
                rate(b.pair.ok_rate()),
                format!("{} / {}", ms(p.p50), ms(p.p99)),
                format!(
                    "{} / {}",
                    per_op(&b.pair_cpu, "nats", b.pair.tally.ok),
                    per_op(&b.pair_cpu, "bench", b.pair.tally.ok)
                ),
                cores_busy(&b.pair_cpu, b.pair.elapsed, b.pair_attempts),
                format!(
                    "{} / {}",
                    b.single.tally.failures_text(),
                    b.pair.tally.failures_text()
                ),
            ]);
        }
        let _ = writeln!(out, "{t}");
        let _ = writeln!(
            out,
            "A *pair* is what ingest asks of JetStream per delivery: the {} B raw message (with the request headers as `Http-*` NATS headers, as ingest stores it) and the {} B event, published concurrently, both acked.\n",
            setup.body_len, setup.event_len
        );
    }

    let baseline_for = |c: usize| baselines.iter().find(|b| b.concurrency == c);
    let _ = writeln!(
        out,
        "**Ingest throughput** (closed loop: C keep-alive HTTP/1.1 connections, each posting its next delivery when the previous one was answered)\n"
    );
    let mut t = Table::new([
        "ingest RUST_LOG",
        "C",
        "deliveries/s",
        "vs raw msgs/s",
        "vs pairs/s",
        "non-202",
        "p50 / p99 ms",
        "CPU µs/delivery ingest / nats / bench",
        "cores busy",
        "ingest VmHWM / VmRSS MiB",
    ]);
    for r in runs {
        for th in &r.throughput {
            let p = Percentiles::of(&th.result.latency);
            let ok = th.result.tally.ok;
            let (vs_raw, vs_pair) = match baseline_for(th.concurrency) {
                Some(b) => (
                    format!(
                        "{:.0}%",
                        100.0 * th.result.ok_rate() / b.single.ok_rate().max(1e-9)
                    ),
                    format!(
                        "{:.0}%",
                        100.0 * th.result.ok_rate() / b.pair.ok_rate().max(1e-9)
                    ),
                ),
                None => ("-".into(), "-".into()),
            };
            t.row([
                r.log_level.clone(),
                th.concurrency.to_string(),
                rate(th.result.ok_rate()),
                vs_raw,
                vs_pair,
                th.result.tally.failed().to_string(),
                format!("{} / {}", ms(p.p50), ms(p.p99)),
                cpu_per_delivery(&th.cpu, ok),
                cores_busy(&th.cpu, th.result.elapsed, th.attempts),
                rss_cell(&th.mem, th.sampled_max_kib),
            ]);
        }
    }
    let _ = writeln!(out, "{t}");

    let _ = writeln!(
        out,
        "**Ingest latency at a fixed rate** (open loop: each delivery scheduled at start + i/rate, latency measured from its scheduled time, so stalls are not hidden)\n"
    );
    let mut t = Table::new([
        "ingest RUST_LOG",
        "rate (achieved)",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "max ms",
        "service p99 ms",
        "non-202",
        "CPU µs/delivery ingest / nats / bench",
        "cores busy",
        "ingest VmHWM / VmRSS MiB",
    ]);
    for r in runs {
        let l = &r.latency;
        let p = Percentiles::of(&l.result.from_schedule);
        let s = Percentiles::of(&l.result.service);
        let ok = l.result.tally.ok;
        t.row([
            r.log_level.clone(),
            format!("{} ({})", rate(args.rate), rate(l.result.achieved_rate())),
            ms(p.p50),
            ms(p.p90),
            ms(p.p99),
            ms(p.p999),
            ms(p.max),
            ms(s.p99),
            l.result.tally.failed().to_string(),
            cpu_per_delivery(&l.cpu, ok),
            cores_busy(&l.cpu, l.result.elapsed, l.attempts),
            rss_cell(&l.mem, l.sampled_max_kib),
        ]);
    }
    let _ = writeln!(out, "{t}");

    let _ = writeln!(out, "**Integrity and memory** (per ingest process)\n");
    let mut t = Table::new([
        "ingest RUST_LOG",
        "answered",
        "202 (new)",
        "events in `<NS>_EVENTS`",
        "raw in `<NS>_RAW`",
        "exactly once",
        "RSS idle MiB",
        "log bytes/delivery",
    ]);
    for r in runs {
        let accepted = r.accepted();
        t.row([
            r.log_level.clone(),
            thousands(r.answered()),
            thousands(accepted),
            thousands(r.events_stored),
            thousands(r.raw_stored),
            (if r.events_stored == accepted && r.raw_stored == accepted {
                "yes"
            } else {
                "**NO**"
            })
            .to_owned(),
            mib(r.idle_rss_kib),
            format!("{:.0}", r.log_bytes as f64 / r.answered().max(1) as f64),
        ]);
    }
    let _ = writeln!(out, "{t}");

    let _ = writeln!(
        out,
        "**In-process CPU per delivery** (one thread, the library calls ingest makes, {} iterations)\n",
        thousands(u64::from(breakdown.iters))
    );
    let mut t = Table::new(["step", "µs"]);
    for (name, d) in &breakdown.steps {
        t.row([(*name).to_owned(), us(*d)]);
    }
    t.row([
        "**total**".to_owned(),
        format!("**{}**", us(breakdown.total())),
    ]);
    let _ = writeln!(out, "{t}");

    let _ = writeln!(out, "**Targets**\n");
    let mut t = Table::new(["target", "measured", "verdict"]);
    for r in runs {
        let best = r
            .throughput
            .iter()
            .max_by(|a, b| a.result.ok_rate().total_cmp(&b.result.ok_rate()));
        if let Some(best) = best {
            let rate_ok = best.result.ok_rate();
            t.row([
                format!("≥ 5,000 deliveries/s (RUST_LOG={})", r.log_level),
                format!("{} (C={})", rate(rate_ok), best.concurrency),
                verdict_of(args, rate_ok >= 5000.0, &[best.other]),
            ]);
        }
        for th in &r.throughput {
            if let Some(b) = baseline_for(th.concurrency) {
                let ratio = th.result.ok_rate() / b.single.ok_rate().max(1e-9);
                t.row([
                    format!(
                        "≥ 20% of raw acked publishes, C={} (RUST_LOG={})",
                        th.concurrency, r.log_level
                    ),
                    format!("{:.0}%", 100.0 * ratio),
                    verdict_of(args, ratio >= 0.20, &[th.other, b.single_other]),
                ]);
            }
        }
        let p99 = Percentiles::of(&r.latency.result.from_schedule).p99;
        let failed = r.latency.result.tally.failed();
        t.row([
            format!(
                "p99 ≤ 10 ms at {} deliveries/s (RUST_LOG={})",
                rate(args.rate),
                r.log_level
            ),
            format!("{} ms", ms(p99)),
            verdict_of(args, p99 <= 10_000 && failed == 0, &[r.latency.other]),
        ]);
        let hwm = r.latency.mem.hwm_kib.max(r.latency.sampled_max_kib);
        t.row([
            format!(
                "ingest RSS ≤ 64 MiB at that rate (RUST_LOG={})",
                r.log_level
            ),
            format!("{} MiB peak", mib(hwm)),
            verdict_of(args, hwm <= 64 * 1024, &[r.latency.other]),
        ]);
    }
    let _ = writeln!(out, "{t}");
    out
}
