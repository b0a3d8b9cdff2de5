//! Allocator serving benchmark: 1,000,000 usage samples over 50,000
//! workloads in Postgres; start-up to ready, `Recommend` throughput and
//! latency against a no-op gRPC method of the same server (`grpc.health.v1
//! Health/Check`), a 500-workload `RecommendBatch`, and the server's RSS.
//!
//! Run with `bash scripts/bench-allocator.sh` (builds the release binary
//! first). Flags: `--samples N --workloads N --seconds S --concurrency C[,C..]
//! --connections K --rounds R --allocator-bin PATH --database-url URL` (a
//! database that is kept: seeded when it holds no samples, reused as it is
//! otherwise; by default a fresh one is seeded and dropped).
//! Besides rates it reports the CPU time each request cost the allocator,
//! nats-server (the `AllocationIssued` events) and the load generator.
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark's main

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_allocator::proto::{RecommendBatchRequest, RecommendRequest};
use runyard_bench::procfs;
use runyard_testkit::{NatsServer, TestDb, free_port};
use tonic::transport::Channel;

/// The load generator decodes every answer (maps of strings); with the
/// server's allocator it leaves more of the shared cores to the server.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    samples: usize,
    workloads: usize,
    seconds: u64,
    concurrency: Vec<usize>,
    connections: usize,
    bin: String,
    database_url: Option<String>,
    rounds: usize,
}

fn args() -> Args {
    let mut a = Args {
        samples: 1_000_000,
        workloads: 50_000,
        seconds: 10,
        concurrency: vec![16, 64],
        connections: 4,
        bin: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/release/runyard-allocator"
        )
        .into(),
        database_url: None,
        rounds: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match flag.as_str() {
            "--samples" => a.samples = value().parse().unwrap(),
            "--workloads" => a.workloads = value().parse().unwrap(),
            "--seconds" => a.seconds = value().parse().unwrap(),
            "--concurrency" => {
                a.concurrency = value().split(',').map(|c| c.parse().unwrap()).collect();
            }
            "--database-url" => a.database_url = Some(value()),
            "--rounds" => a.rounds = value().parse().unwrap(),
            "--connections" => a.connections = value().parse().unwrap(),
            "--allocator-bin" => a.bin = value(),
            _ => {} // cargo bench passes --bench
        }
    }
    a
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

/// `(VmRSS, VmHWM)` of `pid` in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let m = procfs::memory(pid).unwrap_or_default();
    (m.rss_kib, m.hwm_kib)
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

    fn row(&self, round: usize, name: &str, concurrency: usize) -> String {
        let calls = self.hist.len().max(1) as f64;
        let cpu_us = self.cpu.map(|c| c * 1e6 / calls);
        format!(
            "| {round} | {name} | {concurrency} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} / {:.0} / {:.0} |",
            self.rate(),
            ms(self.hist.value_at_quantile(0.5)),
            ms(self.hist.value_at_quantile(0.99)),
            ms(self.hist.max()),
            cpu_us[0],
            cpu_us[1],
            cpu_us[2],
        )
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
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
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
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
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

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[tokio::main]
async fn main() {
    runyard_telemetry::install_crypto_provider();
    let a = args();
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
    let mut child = std::process::Command::new(&a.bin)
        .env("RUNYARD_NATS_URL", nats.url())
        .env("RUNYARD_NAMESPACE", "bench")
        .env("RUNYARD_DATABASE_URL", &url)
        .env("RUNYARD_ALLOCATOR_LISTEN", format!("127.0.0.1:{grpc_port}"))
        .env(
            "RUNYARD_ALLOCATOR_HTTP_LISTEN",
            format!("127.0.0.1:{http_port}"),
        )
        // The seeded history has fixed dates: load all of it, however old.
        .env("RUNYARD_ALLOCATOR_HISTORY_DAYS", "0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let procs = Processes([pid, nats.pid().unwrap(), std::process::id()]);
    let http = reqwest::Client::new();
    loop {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{http_port}/readyz"))
            .send()
            .await
            && r.status() == 200
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "allocator never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready = started.elapsed();
    let (rss_ready, _) = rss_kib(pid);

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
        }),
    );
    type Health = tonic_health::pb::HealthCheckResponse;
    // Warm up both paths.
    let _ = drive::<Health>(&procs, &connections, grpc_port, 64, 1, &noop).await;
    let _ =
        drive::<CheckedRecommendation>(&procs, &connections, grpc_port, 64, 1, &recommend).await;
    let mut rows = Vec::new();
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
            rows.push(baseline.row(round, "no-op Health/Check", concurrency));
            rows.push(rec.row(round, "Recommend", concurrency));
            rows.push(format!(
                "| {round} | Recommend / no-op | {concurrency} | {ratio:.0}% | | | | |"
            ));
        }
    }
    ratios.sort_by(f64::total_cmp);
    let (_, hwm_load) = rss_kib(pid);

    // A pipeline's generate step: 500 workloads in one call.
    let channel = Channel::from_shared(format!("http://127.0.0.1:{grpc_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = AllocatorClient::new(channel);
    let mut batch_hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for round in 0..20 {
        let requests = (0..500)
            .map(|k| RecommendRequest {
                workload: workload((round * 500 + k) % workloads)
                    .into_iter()
                    .collect(),
                r#ref: "develop".into(),
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
    let (rss_end, hwm_end) = rss_kib(pid);
    let _ = child.kill();
    let _ = child.wait();
    if let Some(db) = fresh {
        db.drop_db().await;
    }

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| history | {} samples, {} workloads ({seeded}) |",
        a.samples, a.workloads,
    );
    println!("| start-up to ready | {:.2} s |", ready.as_secs_f64());
    println!(
        "| RecommendBatch of 500 | p50 {:.1} ms, max {:.1} ms (20 calls) |",
        ms(batch_hist.value_at_quantile(0.5)),
        ms(batch_hist.max())
    );
    println!(
        "| allocator RSS | {} MiB after load, {} MiB peak under load, {} MiB at end (peak {} MiB) |",
        rss_ready / 1024,
        hwm_load / 1024,
        rss_end / 1024,
        hwm_end / 1024
    );
    println!();
    println!(
        "Load: tasks over {} HTTP/2 connections, {} s per row, taken in one-second slices \
         alternating with the other call of the same round.",
        a.connections, a.seconds
    );
    println!();
    println!(
        "| round | call | tasks | calls/s | p50 ms | p99 ms | max ms | CPU µs per call: allocator / nats-server / load generator |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    println!();
    println!(
        "Recommend / no-op over all rows: min {:.0}%, median {:.0}%, max {:.0}%",
        ratios[0],
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1]
    );
}
