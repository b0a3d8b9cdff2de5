//! Allocator serving benchmark: 1,000,000 usage samples over 50,000
//! workloads in Postgres; start-up to ready, `Recommend` throughput and
//! latency against a no-op gRPC method of the same server (`grpc.health.v1
//! Health/Check`), a 500-workload `RecommendBatch`, and the server's RSS.
//!
//! Run with `bash scripts/bench-allocator.sh` (builds the release binary
//! first). Flags: `--samples N --workloads N --seconds S --concurrency C
//! --connections K --allocator-bin PATH`.
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark's main

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_allocator::proto::{RecommendBatchRequest, RecommendRequest};
use runyard_testkit::{NatsServer, TestDb, free_port};
use tonic::transport::Channel;

struct Args {
    samples: usize,
    workloads: usize,
    seconds: u64,
    concurrency: usize,
    connections: usize,
    bin: String,
}

fn args() -> Args {
    let mut a = Args {
        samples: 1_000_000,
        workloads: 50_000,
        seconds: 10,
        concurrency: 64,
        connections: 4,
        bin: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/release/runyard-allocator"
        )
        .into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match flag.as_str() {
            "--samples" => a.samples = value().parse().unwrap(),
            "--workloads" => a.workloads = value().parse().unwrap(),
            "--seconds" => a.seconds = value().parse().unwrap(),
            "--concurrency" => a.concurrency = value().parse().unwrap(),
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
        done += n;
    }
    pool.close().await;
    started.elapsed()
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Run {
    rate: f64,
    hist: Histogram<u64>,
}

/// Drives `call` from `concurrency` tasks over `channels` for `seconds`.
async fn drive<F, Fut>(channels: &[Channel], concurrency: usize, seconds: u64, call: F) -> Run
where
    F: Fn(Channel, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let started = Instant::now();
    for t in 0..concurrency {
        let (call, stop) = (call.clone(), stop.clone());
        let channel = channels[t % channels.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut i = t * 7919;
            while !stop.load(Ordering::Relaxed) {
                let s = Instant::now();
                assert!(call(channel.clone(), i).await, "call failed");
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
    Run {
        rate: hist.len() as f64 / elapsed,
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
    let db = TestDb::new();
    println!(
        "seeding {} samples over {} workloads ...",
        a.samples, a.workloads
    );
    let seeded = seed(&db.url, a.samples, a.workloads).await;
    println!("seeded in {:.1}s", seeded.as_secs_f64());

    let (grpc_port, http_port) = (free_port(), free_port());
    let started = Instant::now();
    let mut child = std::process::Command::new(&a.bin)
        .env("RUNYARD_NATS_URL", nats.url())
        .env("RUNYARD_NAMESPACE", "bench")
        .env("RUNYARD_DATABASE_URL", &db.url)
        .env("RUNYARD_ALLOCATOR_LISTEN", format!("127.0.0.1:{grpc_port}"))
        .env(
            "RUNYARD_ALLOCATOR_HTTP_LISTEN",
            format!("127.0.0.1:{http_port}"),
        )
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
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

    let mut channels = Vec::new();
    for _ in 0..a.connections {
        channels.push(
            Channel::from_shared(format!("http://127.0.0.1:{grpc_port}"))
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    let workloads = a.workloads;
    // Warm up both paths.
    let _ = drive(&channels, a.concurrency, 1, |c, _| async move {
        let mut h = tonic_health::pb::health_client::HealthClient::new(c);
        h.check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .is_ok()
    })
    .await;
    let baseline = drive(&channels, a.concurrency, a.seconds, |c, _| async move {
        let mut h = tonic_health::pb::health_client::HealthClient::new(c);
        h.check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .is_ok()
    })
    .await;
    let rec = drive(
        &channels,
        a.concurrency,
        a.seconds,
        move |c, i| async move {
            let mut client = AllocatorClient::new(c);
            let req = RecommendRequest {
                workload: workload(i % workloads).into_iter().collect(),
                r#ref: "develop".into(),
            };
            client.recommend(req).await.is_ok()
        },
    )
    .await;
    let (_, hwm_load) = rss_kib(pid);

    // A pipeline's generate step: 500 workloads in one call.
    let mut client = AllocatorClient::new(channels[0].clone());
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
    db.drop_db().await;

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| history | {} samples, {} workloads (seeded in {:.1} s) |",
        a.samples,
        a.workloads,
        seeded.as_secs_f64()
    );
    println!("| start-up to ready | {:.2} s |", ready.as_secs_f64());
    println!(
        "| load | {} tasks over {} HTTP/2 connections, {} s each |",
        a.concurrency, a.connections, a.seconds
    );
    println!(
        "| baseline no-op (Health/Check) | {:.0} /s, p50 {:.2} ms, p99 {:.2} ms |",
        baseline.rate,
        ms(baseline.hist.value_at_quantile(0.5)),
        ms(baseline.hist.value_at_quantile(0.99))
    );
    println!(
        "| Recommend | {:.0} /s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms |",
        rec.rate,
        ms(rec.hist.value_at_quantile(0.5)),
        ms(rec.hist.value_at_quantile(0.99)),
        ms(rec.hist.max())
    );
    println!(
        "| Recommend / no-op | {:.0}% |",
        100.0 * rec.rate / baseline.rate
    );
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
}
