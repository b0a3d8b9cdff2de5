//! Allocator serving benchmark: 1,000,000 usage samples over 50,000
//! workloads in Postgres; start-up to ready, `Recommend` throughput and
//! latency against a no-op gRPC method of the same server (`grpc.health.v1
//! Health/Check`), a 500-workload `RecommendBatch`, and the server's RSS.
//!
//! Run with `bash scripts/bench-allocator.sh` (builds the release binary
//! first); `-- --help` lists the flags.
//! Besides rates it reports the CPU time each request cost the allocator,
//! nats-server (the `AllocationIssued` events) and the load generator.
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark's main

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_allocator::proto::{RecommendBatchRequest, RecommendRequest};
use runyard_bench::http::{client, wait_for_200};
use runyard_bench::load::latency_histogram;
use runyard_bench::process::{Service, service_command};
use runyard_bench::report::{Table, ms};
use runyard_bench::{args, procfs};
use runyard_testkit::{NatsServer, TestDb, free_port};
use tonic::transport::Channel;

/// The load generator decodes every answer (maps of strings); with the
/// server's allocator it leaves more of the shared cores to the server.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Allocator serving benchmark: `Recommend` calls a second with a seeded
/// history, against the same server's no-op `Health/Check`.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Usage samples seeded.
    #[arg(long, default_value_t = 1_000_000)]
    samples: usize,
    /// Workloads the samples are spread over.
    #[arg(long, default_value_t = 50_000, value_parser = args::at_least_one)]
    workloads: usize,
    /// Seconds per row, in one-second slices alternating with the other
    /// call.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent tasks of the load generator (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "16,64", value_parser = args::at_least_one)]
    concurrency: Vec<usize>,
    /// HTTP/2 connections the tasks share.
    #[arg(long, default_value_t = 4, value_parser = args::at_least_one)]
    connections: usize,
    /// The `runyard-allocator` binary.
    #[arg(long = "allocator-bin", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/runyard-allocator"))]
    bin: PathBuf,
    /// A database that is kept: seeded when it holds no samples, reused as
    /// it is otherwise (by default a fresh one is seeded and dropped).
    #[arg(long)]
    database_url: Option<String>,
    /// Rounds over every concurrency.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    #[command(flatten)]
    cargo: args::Cargo,
}

fn workload(i: usize) -> Vec<(String, String)> {
    vec![
        ("package".into(), format!("pkg-{i}")),
        ("version".into(), format!("1.{}", i % 5)),
        ("variants".into(), "+shared~debug".into()),
        ("compiler".into(), "gcc".into()),
        ("compiler_version".into(), "12.3.0".into()),
    ]
}

/// Writes `samples` usage rows spread over `workloads` workloads.
async fn seed(url: &str, samples: usize, workloads: usize) -> Duration {
    let started = Instant::now();
    runyard_store::migrate(url).await.unwrap();
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let base = time::macros::datetime!(2026-10-01 00:00 UTC);
    let chunk = 20_000;
    let mut done = 0;
    while done < samples {
        let n = chunk.min(samples - done);
        let mut job_ids = Vec::with_capacity(n);
        let mut event_ids = Vec::with_capacity(n);
        let mut loads = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n);
        let mut peaks = Vec::with_capacity(n);
        let mut ats = Vec::with_capacity(n);
        for j in done..done + n {
            let w = j % workloads;
            let attrs = workload(w);
            let obj: serde_json::Map<_, _> = attrs
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            job_ids.push(j as i64);
            event_ids.push(format!("usage:gitlab:bench:{j}:1"));
            loads.push(serde_json::Value::Object(obj).to_string());
            keys.push(runyard_store::workload::key(
                attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ));
            let size = 200_000_000.0
                * (1.0 + (w % 97) as f64)
                * (1.0 + 0.1 * ((j * 7919) % 13) as f64 / 13.0);
            peaks.push(size as i64);
            ats.push(base + time::Duration::seconds((j as i64 * 2_592_000) / samples as i64));
        }
        sqlx::query(
            "INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, ref, workload,
                workload_key, peak_memory_bytes, memory_limit_bytes, cpu_seconds, wall_seconds,
                oom_killed, reported_at)
             SELECT 'gitlab', 'bench', j, 1, e, 'develop', w::jsonb, k, p, p * 2, 600.0, 300.0,
                false, t
             FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::int8[],
                $6::timestamptz[]) AS x(j, e, w, k, p, t)",
        )
        .bind(&job_ids)
        .bind(&event_ids)
        .bind(&loads)
        .bind(&keys)
        .bind(&peaks)
        .bind(&ats)
        .execute(&pool)
        .await
        .unwrap();
        // Their jobs' rows, as the webhooks leave them: a sample trains
        // only on the ref its job row confirms.
        sqlx::query(
            "INSERT INTO jobs (forge, instance, job_id, status, ref, first_seen_at,
                last_event_at, rank_status, rank_at, rank_event)
             SELECT 'gitlab', 'bench', j, 4, 'develop', t, t, 4, t, 'bench'
             FROM unnest($1::int8[], $2::timestamptz[]) AS x(j, t)",
        )
        .bind(&job_ids)
        .bind(&ats)
        .execute(&pool)
        .await
        .unwrap();
        done += n;
    }
    pool.close().await;
    started.elapsed()
}

/// The processes whose CPU time a run accounts for: the allocator,
/// nats-server and this load generator.
#[derive(Clone)]
struct Processes([u32; 3]);

impl Processes {
    /// CPU seconds each has used so far.
    fn cpu(&self) -> [f64; 3] {
        self.0
            .map(|pid| procfs::cpu_time(pid).unwrap_or_default().as_secs_f64())
    }
}

struct Run {
    /// Wall-clock seconds driven.
    elapsed: f64,
    hist: Histogram<u64>,
    /// CPU seconds of the allocator, nats-server and the load generator.
    cpu: [f64; 3],
}

impl Run {
    fn rate(&self) -> f64 {
        self.hist.len() as f64 / self.elapsed
    }

    /// Adds a later slice of the same call.
    fn add(&mut self, slice: Run) {
        self.elapsed += slice.elapsed;
        for (total, c) in self.cpu.iter_mut().zip(slice.cpu) {
            *total += c;
        }
        self.hist.add(slice.hist).unwrap();
    }

    fn row(&self, round: usize, name: &str, concurrency: usize) -> [String; 8] {
        let calls = self.hist.len().max(1) as f64;
        let cpu_us = self.cpu.map(|c| c * 1e6 / calls);
        [
            round.to_string(),
            name.to_owned(),
            concurrency.to_string(),
            format!("{:.0}", self.rate()),
            ms(self.hist.value_at_quantile(0.5)),
            ms(self.hist.value_at_quantile(0.99)),
            ms(self.hist.max()),
            format!("{:.0} / {:.0} / {:.0}", cpu_us[0], cpu_us[1], cpu_us[2]),
        ]
    }
}

/// A gRPC unary call as the load generator sends it: the method's path and
/// pre-encoded, length-prefixed request bodies (one per workload).
#[derive(Clone)]
struct Call {
    path: &'static str,
    bodies: Arc<Vec<Bytes>>,
}

impl Call {
    fn new<M: prost::Message>(path: &'static str, messages: impl Iterator<Item = M>) -> Self {
        let bodies = messages
            .map(|m| {
                let mut b = Vec::with_capacity(5 + m.encoded_len());
                b.push(0);
                b.extend_from_slice(&u32::try_from(m.encoded_len()).unwrap().to_be_bytes());
                m.encode(&mut b).unwrap();
                Bytes::from(b)
            })
            .collect();
        Self {
            path,
            bodies: Arc::new(bodies),
        }
    }
}

/// One HTTP/2 connection of the load generator. The calls go straight over
/// `h2` (the transport tonic's own client uses underneath, without its
/// per-call service stack), so the generator's CPU stays small next to the
/// server's; every answer is still checked (`grpc-status` 0 and a
/// response that decodes).
async fn connect(port: u16) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 24)
        .handshake(tcp)
        .await
        .unwrap();
    tokio::spawn(connection);
    send
}

/// An answer the load generator checks.
trait Answer: prost::Message + Default {
    /// Whether the decoded answer is a right one.
    fn valid(&self) -> bool;
}

impl Answer for tonic_health::pb::HealthCheckResponse {
    fn valid(&self) -> bool {
        self.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    }
}

/// The fields of a `Recommendation` the load generator checks. Decoding
/// walks the whole answer (prost skips the basis and the variables, which
/// still have to be well-formed) without building their strings and maps:
/// that work would be the generator's, on the cores the server needs.
#[derive(Clone, PartialEq, prost::Message)]
struct CheckedRecommendation {
    #[prost(uint64, tag = "1")]
    cpu_request_millicores: u64,
    #[prost(uint64, tag = "3")]
    memory_request_bytes: u64,
    #[prost(uint64, tag = "4")]
    memory_limit_bytes: u64,
}

impl Answer for CheckedRecommendation {
    fn valid(&self) -> bool {
        self.cpu_request_millicores > 0
            && self.memory_request_bytes > 0
            && self.memory_request_bytes <= self.memory_limit_bytes
    }
}

/// Sends call `i` of `call` and checks its answer decodes as a valid `R`.
async fn unary<R: Answer>(
    send: &h2::client::SendRequest<Bytes>,
    port: u16,
    call: &Call,
    i: usize,
) -> bool {
    let request = http::Request::post(format!("http://127.0.0.1:{port}{}", call.path))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let Ok(mut send) = send.clone().ready().await else {
        return false;
    };
    let Ok((response, mut stream)) = send.send_request(request, false) else {
        return false;
    };
    let body = call.bodies[i % call.bodies.len()].clone();
    if stream.send_data(body, true).is_err() {
        return false;
    }
    let Ok(response) = response.await else {
        return false;
    };
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return false };
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let ok = matches!(body.trailers().await, Ok(Some(t))
        if t.get("grpc-status").is_some_and(|s| s == "0"));
    ok && data.len() >= 5 && R::decode(&data[5..]).is_ok_and(|r| r.valid())
}

/// Drives `call` from `concurrency` tasks over `connections` for `seconds`.
async fn drive<R: Answer>(
    procs: &Processes,
    connections: &[h2::client::SendRequest<Bytes>],
    port: u16,
    concurrency: usize,
    seconds: u64,
    call: &Call,
) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let started = Instant::now();
    let cpu_before = procs.cpu();
    for t in 0..concurrency {
        let (call, stop) = (call.clone(), stop.clone());
        let send = connections[t % connections.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = latency_histogram();
            let mut i = t * 7919;
            while !stop.load(Ordering::Relaxed) {
                let s = Instant::now();
                assert!(unary::<R>(&send, port, &call, i).await, "call failed");
                hist.record(s.elapsed().as_micros() as u64).unwrap();
                i += 1;
            }
            hist
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut hist = latency_histogram();
    for t in tasks {
        hist.add(t.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = procs.cpu();
    Run {
        elapsed,
        cpu: [0, 1, 2].map(|i| cpu_after[i] - cpu_before[i]),
        hist,
    }
}

#[tokio::main]
async fn main() {
    runyard_telemetry::install_crypto_provider();
    let a = Args::parse();
    let nats = NatsServer::start().await;
    let fresh = a.database_url.is_none().then(TestDb::new);
    let url = match (&a.database_url, &fresh) {
        (Some(url), _) => url.clone(),
        (None, Some(db)) => db.url.clone(),
        (None, None) => unreachable!(),
    };
    let empty = {
        runyard_store::migrate(&url).await.unwrap();
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM usage_samples")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows == 0
    };
    let seeded = if empty {
        println!(
            "seeding {} samples over {} workloads ...",
            a.samples, a.workloads
        );
        let seeded = seed(&url, a.samples, a.workloads).await;
        println!("seeded in {:.1}s", seeded.as_secs_f64());
        format!("seeded in {:.1} s", seeded.as_secs_f64())
    } else {
        "seeded before".to_owned()
    };

    let (grpc_port, http_port) = (free_port(), free_port());
    let started = Instant::now();
    let mut cmd = service_command(&a.bin, &nats.url(), "bench", "warn");
    cmd.env("RUNYARD_DATABASE_URL", &url)
        .env("RUNYARD_ALLOCATOR_LISTEN", format!("127.0.0.1:{grpc_port}"))
        .env(
            "RUNYARD_ALLOCATOR_HTTP_LISTEN",
            format!("127.0.0.1:{http_port}"),
        )
        // The seeded history has fixed dates: load all of it, however old.
        .env("RUNYARD_ALLOCATOR_HISTORY_DAYS", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let allocator = Service::spawn(&mut cmd).unwrap();
    let pid = allocator.pid;
    let procs = Processes([pid, nats.pid().unwrap(), std::process::id()]);
    wait_for_200(
        &client(1),
        &format!("http://127.0.0.1:{http_port}/readyz"),
        Duration::from_secs(120),
    )
    .await
    .expect("the allocator becomes ready");
    let ready = started.elapsed();
    let memory = || procfs::memory(pid).unwrap_or_default();
    let rss_ready = memory().rss_kib;

    let mut connections = Vec::new();
    for _ in 0..a.connections {
        connections.push(connect(grpc_port).await);
    }
    let workloads = a.workloads;
    let noop = Call::new(
        "/grpc.health.v1.Health/Check",
        std::iter::once(tonic_health::pb::HealthCheckRequest::default()),
    );
    let recommend = Call::new(
        "/runyard.allocator.v1.Allocator/Recommend",
        (0..workloads).map(|w| RecommendRequest {
            workload: workload(w).into_iter().collect(),
            r#ref: "develop".into(),
            retry_of: None,
            preview: false,
        }),
    );
    type Health = tonic_health::pb::HealthCheckResponse;
    // Warm up both paths.
    let _ = drive::<Health>(&procs, &connections, grpc_port, 64, 1, &noop).await;
    let _ =
        drive::<CheckedRecommendation>(&procs, &connections, grpc_port, 64, 1, &recommend).await;
    let mut rows = Table::new([
        "round",
        "call",
        "tasks",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "CPU µs per call: allocator / nats-server / load generator",
    ]);
    let mut ratios = Vec::new();
    // The two calls alternate in one-second slices, so both see the same
    // machine (this VM's speed drifts by tens of percent within a minute).
    for round in 1..=a.rounds {
        for &concurrency in &a.concurrency {
            let (mut baseline, mut rec) = (None::<Run>, None::<Run>);
            for _ in 0..a.seconds.max(1) {
                let b =
                    drive::<Health>(&procs, &connections, grpc_port, concurrency, 1, &noop).await;
                let r = drive::<CheckedRecommendation>(
                    &procs,
                    &connections,
                    grpc_port,
                    concurrency,
                    1,
                    &recommend,
                )
                .await;
                for (total, slice) in [(&mut baseline, b), (&mut rec, r)] {
                    match total {
                        Some(t) => t.add(slice),
                        None => *total = Some(slice),
                    }
                }
            }
            let (baseline, rec) = (baseline.unwrap(), rec.unwrap());
            let ratio = 100.0 * rec.rate() / baseline.rate();
            ratios.push(ratio);
            rows.row(baseline.row(round, "no-op Health/Check", concurrency));
            rows.row(rec.row(round, "Recommend", concurrency));
            let mut cells = vec![
                round.to_string(),
                "Recommend / no-op".to_owned(),
                concurrency.to_string(),
                format!("{ratio:.0}%"),
            ];
            cells.resize(8, String::new());
            rows.row(cells);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let hwm_load = memory().hwm_kib;

    // A pipeline's generate step: 500 workloads in one call.
    let channel = Channel::from_shared(format!("http://127.0.0.1:{grpc_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = AllocatorClient::new(channel);
    let mut batch_hist = latency_histogram();
    for round in 0..20 {
        let requests = (0..500)
            .map(|k| RecommendRequest {
                workload: workload((round * 500 + k) % workloads)
                    .into_iter()
                    .collect(),
                r#ref: "develop".into(),
                retry_of: None,
                preview: false,
            })
            .collect();
        let s = Instant::now();
        let resp = client
            .recommend_batch(RecommendBatchRequest { requests })
            .await
            .unwrap()
            .into_inner();
        batch_hist.record(s.elapsed().as_micros() as u64).unwrap();
        assert_eq!(resp.recommendations.len(), 500);
    }
    let end = memory();
    allocator.stop(Duration::ZERO).await;
    if let Some(db) = fresh {
        db.drop_db().await;
    }

    let mut t = Table::new(["measure", "value"]);
    t.row([
        "history".to_owned(),
        format!(
            "{} samples, {} workloads ({seeded})",
            a.samples, a.workloads
        ),
    ]);
    t.row([
        "start-up to ready".to_owned(),
        format!("{:.2} s", ready.as_secs_f64()),
    ]);
    let batch_ms = |us: u64| us as f64 / 1000.0;
    t.row([
        "RecommendBatch of 500".to_owned(),
        format!(
            "p50 {:.1} ms, max {:.1} ms (20 calls)",
            batch_ms(batch_hist.value_at_quantile(0.5)),
            batch_ms(batch_hist.max())
        ),
    ]);
    let whole_mib = |kib: u64| kib / 1024;
    t.row([
        "allocator RSS".to_owned(),
        format!(
            "{} MiB after load, {} MiB peak under load, {} MiB at end (peak {} MiB)",
            whole_mib(rss_ready),
            whole_mib(hwm_load),
            whole_mib(end.rss_kib),
            whole_mib(end.hwm_kib)
        ),
    ]);
    println!();
    println!("{t}");
    println!(
        "Load: tasks over {} HTTP/2 connections, {} s per row, taken in one-second slices \
         alternating with the other call of the same round.",
        a.connections, a.seconds
    );
    println!();
    println!("{rows}");
    println!(
        "Recommend / no-op over all rows: min {:.0}%, median {:.0}%, max {:.0}%",
        ratios[0],
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1]
    );
}
