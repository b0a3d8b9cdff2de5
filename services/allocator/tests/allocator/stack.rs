//! The allocator against real services: usage reports go in through ingest,
//! job-tracker projects them, the allocator answers over real gRPC from the
//! generated client, over gantry's HTTP endpoint, and follows new reports.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use runyard_allocator::proto::RecommendRequest;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_allocator::{App, Config};
use runyard_bus::{Bus, StreamSettings, TRACEPARENT_HEADER, TraceParent};
use runyard_events::{
    Body, Event, Forge, JobKey, JobObserved, JobStatus, Namespace, Source, UsageReported, ids,
    timestamp,
};
use runyard_testkit::otlp::{AnyValue, Collector, Span, attribute, hex_id};
use runyard_testkit::{
    TestDb, TestNats, decode_events, eventually, stream_messages, unique_namespace,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tonic::transport::Channel;

// As `openssl rand -hex 32` makes them (ingest refuses weak ones).
const USAGE_TOKEN: &str = "ded87e07581f2e41ac5706c82f1d251a0f3e77b72e957ed91e555fd799887fd1";
const GITLAB_TOKEN: &str = "ff82f59983244653d8e6ff0ddbb76a83d0f729b73fded092d4c97f5991ae6f83";

struct Stack {
    nats: TestNats,
    ns: Namespace,
    db: TestDb,
    stops: Vec<oneshot::Sender<()>>,
    ingest: String,
    tracker: String,
    grpc: SocketAddr,
    http: String,
}

fn spawn_run<F>(run: F) -> oneshot::Sender<()>
where
    F: FnOnce(oneshot::Receiver<()>) -> tokio::task::JoinHandle<anyhow::Result<()>>,
{
    let (tx, rx) = oneshot::channel();
    drop(run(rx));
    tx
}

impl Stack {
    /// ingest + job-tracker + allocator on one namespace and database.
    async fn start() -> Self {
        Self::start_with(runyard_allocator::model::Params::default()).await
    }

    /// [`Stack::start`] with these model parameters.
    async fn start_with(model: runyard_allocator::model::Params) -> Self {
        runyard_telemetry::install_crypto_provider();
        let nats = TestNats::get().await;
        let ns = unique_namespace();
        let db = TestDb::new();
        let local = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut stops = Vec::new();

        let ingest = runyard_ingest::App::build(runyard_ingest::Config {
            bus: runyard_config::Bus {
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            ingest_listen: local,
            usage_token: Some(USAGE_TOKEN.to_owned().into()),
            gitlab_webhook_token: Some(GITLAB_TOKEN.to_owned().into()),
            ..runyard_ingest::Config::default()
        })
        .await
        .unwrap();
        let ingest_addr = ingest.local_addr();
        stops.push(spawn_run(|rx| {
            tokio::spawn(ingest.run(async move {
                let _ = rx.await;
            }))
        }));

        let tracker = runyard_job_tracker::App::build(runyard_job_tracker::Config {
            bus: runyard_config::Bus {
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            database: runyard_config::Database {
                url: db.url.clone(),
            },
            tracker_http_listen: local,
            tracker_batch_wait: Duration::from_millis(5),
            ..runyard_job_tracker::Config::default()
        })
        .await
        .unwrap();
        let tracker_addr = tracker.local_addr();
        stops.push(spawn_run(|rx| {
            tokio::spawn(tracker.run(async move {
                let _ = rx.await;
            }))
        }));

        let allocator = App::build(Config {
            bus: runyard_config::Bus {
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            database: runyard_config::Database {
                url: db.url.clone(),
            },
            allocator_listen: local,
            allocator_http_listen: local,
            model,
            ..Config::default()
        })
        .await
        .unwrap();
        let grpc = allocator.grpc_addr();
        let http = format!("http://{}", allocator.http_addr());
        stops.push(spawn_run(|rx| {
            tokio::spawn(allocator.run(async move {
                let _ = rx.await;
            }))
        }));
        let stack = Self {
            nats,
            ns,
            db,
            stops,
            ingest: format!("http://{ingest_addr}"),
            tracker: format!("http://{tracker_addr}"),
            grpc,
            http,
        };
        let ready = eventually(Duration::from_secs(20), || async {
            let r = reqwest::get(format!("{}/readyz", stack.http)).await.ok()?;
            (r.status() == 200).then_some(())
        })
        .await;
        assert!(ready.is_some(), "allocator ready");
        stack
    }

    async fn client(&self) -> AllocatorClient<Channel> {
        AllocatorClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    async fn report(&self, job_id: u64, workload: &Value, peak: u64, r: &str) {
        let body = json!({
            "forge": "gitlab", "instance": "gitlab.example.com", "job_id": job_id,
            "attempt": 1, "ref": r, "workload": workload,
            "peak_memory_bytes": peak, "memory_limit_bytes": 16_000_000_000u64,
            "cpu_seconds": 3600.0, "wall_seconds": 900.0, "oom_killed": false, "exit_code": 0
        });
        self.post_usage(&body).await;
    }

    async fn post_usage(&self, body: &Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/usage", self.ingest))
            .bearer_auth(USAGE_TOKEN)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
    }

    /// GitLab's (token-authenticated) Job Hook of job `job_id` on `r`: the
    /// projected job row a report's ref must match to train.
    async fn job_hook(&self, job_id: u64, r: &str) {
        self.job_hook_in(job_id, r, 1234).await;
    }

    /// [`Stack::job_hook`] of a job of pipeline `pipeline`.
    async fn job_hook_in(&self, job_id: u64, r: &str, pipeline: u64) {
        self.job_hook_attempt(job_id, r, pipeline, 1).await;
    }

    /// [`Stack::job_hook_in`] of attempt `attempt` (a job retried
    /// `attempt - 1` times).
    async fn job_hook_attempt(&self, job_id: u64, r: &str, pipeline: u64, attempt: u32) {
        let mut hook: Value =
            serde_json::from_str(&runyard_testkit::fixture("gitlab_job_running.json")).unwrap();
        hook["build_id"] = json!(job_id);
        hook["ref"] = json!(r);
        hook["pipeline_id"] = json!(pipeline);
        hook["retries_count"] = json!(attempt - 1);
        let resp = reqwest::Client::new()
            .post(format!("{}/webhooks/gitlab", self.ingest))
            .header("X-Gitlab-Event", "Job Hook")
            .header("X-Gitlab-Token", GITLAB_TOKEN)
            .header("X-Gitlab-Instance", "https://gitlab.example.com")
            .header("Idempotency-Key", format!("job-{job_id}"))
            .json(&hook)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert_eq!(status, 202, "{}", resp.text().await.unwrap());
    }

    async fn stop(self) {
        for s in self.stops {
            let _ = s.send(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.db.drop_db().await;
        drop(self.nats);
    }
}

fn torch() -> Value {
    json!({"package": "py-torch", "version": "2.3.1", "variants": "+cuda~rocm",
           "compiler": "gcc", "compiler_version": "12.3.0", "arch": "x86_64_v3"})
}

fn request(workload: &Value, r: &str) -> RecommendRequest {
    RecommendRequest {
        workload: workload
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect(),
        r#ref: r.into(),
        retry_of: None,
        preview: false,
    }
}

async fn recommend(
    c: &mut AllocatorClient<Channel>,
    w: &Value,
) -> runyard_allocator::proto::Recommendation {
    c.recommend(request(w, "develop"))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn usage_reports_through_the_stack_shape_the_recommendation() {
    let stack = Stack::start().await;
    let mut client = stack.client().await;

    // No history: the configured defaults, and the basis says so.
    let fresh = recommend(&mut client, &torch()).await;
    let basis = fresh.basis.clone().unwrap();
    assert!(basis.defaults && basis.samples == 0, "{basis:?}");
    // Nothing to predict an OOM risk from.
    assert_eq!((basis.oom_probability, basis.workload_samples), (-1.0, 0));
    assert_eq!(fresh.retry_count, 0);

    let peaks = [6.0e9, 6.4e9, 5.8e9, 6.2e9, 6.1e9, 6.3e9];
    for (i, p) in peaks.iter().enumerate() {
        stack.job_hook(100 + i as u64, "develop").await;
        stack
            .report(100 + i as u64, &torch(), *p as u64, "develop")
            .await;
    }
    // A pull request's huge job must not train the model ...
    stack.job_hook(999, "feature/x").await;
    stack
        .report(999, &torch(), 60_000_000_000, "feature/x")
        .await;
    // ... not even when its report claims a protected ref: the job's
    // webhook names the pull request's.
    stack.job_hook(998, "feature/x").await;
    stack.report(998, &torch(), 60_000_000_000, "develop").await;
    // A report no webhook confirms (yet) does not train either.
    stack.report(997, &torch(), 60_000_000_000, "develop").await;
    let rec = eventually(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            let r = recommend(&mut client, &torch()).await;
            (r.basis.as_ref()?.samples as usize >= peaks.len()).then_some(r)
        }
    })
    .await
    .expect("history reaches the allocator");
    let basis = rec.basis.clone().unwrap();
    assert!(!basis.defaults);
    assert_eq!(
        basis.samples as usize,
        peaks.len(),
        "only protected refs train: {basis:?}"
    );
    // The model states its confidence: the OOM risk of this limit and the
    // samples of this exact workload it rests on.
    assert_eq!(basis.workload_samples as usize, peaks.len());
    assert!(
        basis.oom_probability > 0.0 && basis.oom_probability < 0.2,
        "{basis:?}"
    );
    assert!(
        rec.memory_limit_bytes >= 6_400_000_000,
        "limit covers the peaks: {rec:?}"
    );
    assert!(
        rec.memory_limit_bytes < 20_000_000_000,
        "PR data did not poison: {rec:?}"
    );
    assert!(rec.memory_request_bytes <= rec.memory_limit_bytes);
    assert!(rec.cpu_request_millicores <= rec.cpu_limit_millicores);
    assert!(
        rec.cpu_request_millicores >= 1000,
        "4 cores busy on average: {rec:?}"
    );
    for var in [
        "KUBERNETES_CPU_REQUEST",
        "KUBERNETES_CPU_LIMIT",
        "KUBERNETES_MEMORY_REQUEST",
        "KUBERNETES_MEMORY_LIMIT",
        "SPACK_BUILD_JOBS",
        "RUNYARD_RETRY_COUNT",
    ] {
        assert!(
            rec.variables.contains_key(var),
            "{var} missing: {:?}",
            rec.variables
        );
    }

    // The gantry endpoint answers the same numbers for the same workload.
    let spec = "py-torch@2.3.1 +cuda~rocm arch=x86_64_v3%gcc@12.3.0";
    let body: Value = reqwest::Client::new()
        .get(format!("{}/v1/allocation", stack.http))
        .query(&[("spec", spec)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let http_vars: BTreeMap<String, String> =
        serde_json::from_value(body["variables"].clone()).unwrap();
    assert_eq!(http_vars, rec.variables);
    // ... and the same confidence, next to gantry's variables.
    assert_eq!(body["workload_samples"], json!(peaks.len()));
    let p = body["oom_probability"].as_f64().unwrap();
    assert!((p - basis.oom_probability).abs() < 1e-9, "{body}");

    // Batch: same answers, in order.
    let batch = client
        .recommend_batch(runyard_allocator::proto::RecommendBatchRequest {
            requests: vec![
                request(&torch(), "develop"),
                request(&json!({"package": "zlib"}), ""),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.recommendations.len(), 2);
    assert_eq!(batch.recommendations[0].variables, rec.variables);
    assert!(batch.recommendations[1].basis.as_ref().unwrap().defaults);

    // Every answer is on the log as AllocationIssued.
    let client_nats = async_nats::connect(stack.nats.url()).await.unwrap();
    let issued = eventually(Duration::from_secs(10), || {
        let (c, ns) = (client_nats.clone(), stack.ns.clone());
        async move {
            let msgs = runyard_testkit::stream_messages(&c, &ns.events_stream()).await;
            let n = msgs
                .iter()
                .filter(|m| m.subject.as_str() == ns.allocation_subject())
                .count();
            (n >= 4).then_some(n)
        }
    })
    .await;
    assert!(issued.is_some(), "allocation events published");

    // A fresh allocator on another namespace sees nothing on NATS: what it
    // knows comes from the projection it reads at start.
    let projected = eventually(Duration::from_secs(10), || async {
        let p = sqlx::PgPool::connect(&stack.db.url).await.ok()?;
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_samples")
            .fetch_one(&p)
            .await
            .ok()?;
        p.close().await;
        (n == 9).then_some(())
    })
    .await;
    assert!(projected.is_some(), "job-tracker projected the reports");
    let other = App::build(Config {
        bus: runyard_config::Bus {
            nats_url: stack.nats.url(),
            namespace: unique_namespace().to_string(),
        },
        database: runyard_config::Database {
            url: stack.db.url.clone(),
        },
        allocator_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        allocator_http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Config::default()
    })
    .await
    .unwrap();
    let grpc = other.grpc_addr();
    let stop_other = spawn_run(|rx| {
        tokio::spawn(other.run(async move {
            let _ = rx.await;
        }))
    });
    let from_db = eventually(Duration::from_secs(10), || async move {
        let mut c = AllocatorClient::connect(format!("http://{grpc}"))
            .await
            .ok()?;
        c.recommend(request(&torch(), "develop"))
            .await
            .ok()
            .map(|r| r.into_inner())
    })
    .await
    .expect("second allocator answers");
    assert_eq!(
        from_db.variables, rec.variables,
        "same history, same answer"
    );
    assert_eq!(
        from_db.basis.unwrap().samples as usize,
        peaks.len(),
        "the load trains only what the job rows confirm"
    );
    let _ = stop_other.send(());
    stack.stop().await;
}

/// A report of GitLab job `job_id`, attempt `attempt`, sent with an
/// identity token of `project` (as ingest publishes it), under event id
/// `id`.
fn verified_report(id: &str, job_id: u64, attempt: u32, project: &str, w: &Value) -> Event {
    let now = time::OffsetDateTime::now_utc();
    let instance = "gitlab.example.com".to_owned();
    Event {
        id: id.to_owned(),
        occurred_at: Some(timestamp(now)),
        received_at: Some(timestamp(now)),
        source: Some(Source {
            forge: Forge::Gitlab as i32,
            instance: instance.clone(),
            ..Default::default()
        }),
        body: Some(Body::UsageReported(UsageReported {
            job: Some(JobKey {
                forge: Forge::Gitlab as i32,
                instance,
                job_id,
            }),
            attempt,
            r#ref: "develop".into(),
            project: project.into(),
            workload: w
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect(),
            peak_memory_bytes: 4_000_000_000,
            memory_limit_bytes: Some(40_000_000_000),
            cpu_seconds: 100.0,
            wall_seconds: 100.0,
            identity: Some(runyard_events::UsageIdentity {
                method: "oidc".into(),
                issuer: "https://gitlab.example.com".into(),
                subject: String::new(),
            }),
            ..Default::default()
        })),
    }
}

/// The webhook of GitLab job `job_id` of `spack/spack` on `develop`, first
/// attempt.
fn spack_job(job_id: u64) -> Event {
    let now = time::OffsetDateTime::now_utc();
    let instance = "gitlab.example.com".to_owned();
    Event {
        id: format!("test-job:{job_id}"),
        occurred_at: Some(timestamp(now)),
        received_at: Some(timestamp(now)),
        source: Some(Source {
            forge: Forge::Gitlab as i32,
            instance: instance.clone(),
            ..Default::default()
        }),
        body: Some(Body::JobObserved(JobObserved {
            job: Some(JobKey {
                forge: Forge::Gitlab as i32,
                instance,
                job_id,
            }),
            project: "spack/spack".into(),
            project_id: 22,
            run_attempt: 1,
            name: "build".into(),
            status: JobStatus::Completed as i32,
            r#ref: "develop".into(),
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn a_report_trains_only_what_its_job_s_webhooks_confirm() {
    let stack = Stack::start().await;
    let client = stack.client().await;
    let w = json!({"package": "hdf5", "version": "1.14.3"});
    let bus = Bus::connect(&stack.nats.url(), stack.ns.clone(), "test", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let tp = TraceParent::new_root();
    for job in 1..=4 {
        bus.publish_event(&spack_job(job), &tp).await.unwrap();
    }
    let id = |job: u64, attempt: u32| ids::usage(Forge::Gitlab, "gitlab.example.com", job, attempt);
    for e in [
        // Trains.
        verified_report(&id(1, 1), 1, 1, "spack/spack", &w),
        // The same attempt again (past JetStream's duplicate window, so
        // under another message id): not a second sample.
        verified_report("usage:again:1", 1, 1, "spack/spack", &w),
        // A token of another project than the job's webhook names.
        verified_report(&id(2, 1), 2, 1, "someone/else", &w),
        // An attempt the job never had.
        verified_report(&id(3, 7), 3, 7, "spack/spack", &w),
        // Trains.
        verified_report(&id(4, 1), 4, 1, "spack/spack", &w),
        // Before its job's webhook: waits for it, then trains.
        verified_report(&id(5, 1), 5, 1, "spack/spack", &w),
    ] {
        bus.publish_event(&e, &tp).await.unwrap();
    }
    let samples = |grpc: SocketAddr, want: u32| {
        let w = w.clone();
        eventually(Duration::from_secs(10), move || {
            let w = w.clone();
            async move {
                let mut c = AllocatorClient::connect(format!("http://{grpc}"))
                    .await
                    .ok()?;
                // A fresh allocator answers UNAVAILABLE while it loads.
                let r = c.recommend(request(&w, "develop")).await.ok()?.into_inner();
                let n = r.basis.as_ref()?.samples;
                (n == want).then_some(n)
            }
        })
    };
    assert_eq!(samples(stack.grpc, 2).await, Some(2), "jobs 1 and 4");
    bus.publish_event(&spack_job(5), &tp).await.unwrap();
    assert_eq!(
        samples(stack.grpc, 3).await,
        Some(3),
        "job 5 once its webhook came"
    );
    drop(client);
    let metrics = reqwest::get(format!("{}/metrics", stack.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("runyard_allocator_samples_refused_total 3"),
        "{metrics}"
    );

    // A fresh allocator loads the projection and judges it the same way.
    let projected = eventually(Duration::from_secs(10), || async {
        let p = sqlx::PgPool::connect(&stack.db.url).await.ok()?;
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE job_id = 5")
            .fetch_one(&p)
            .await
            .ok()?;
        let m: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_samples")
            .fetch_one(&p)
            .await
            .ok()?;
        p.close().await;
        (n == 1 && m == 5).then_some(())
    })
    .await;
    assert!(projected.is_some(), "job-tracker projected five samples");
    let other = App::build(Config {
        bus: runyard_config::Bus {
            nats_url: stack.nats.url(),
            namespace: unique_namespace().to_string(),
        },
        database: runyard_config::Database {
            url: stack.db.url.clone(),
        },
        allocator_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        allocator_http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Config::default()
    })
    .await
    .unwrap();
    let grpc = other.grpc_addr();
    let stop_other = spawn_run(|rx| {
        tokio::spawn(other.run(async move {
            let _ = rx.await;
        }))
    });
    assert_eq!(
        samples(grpc, 3).await,
        Some(3),
        "the load trains the same three"
    );
    let _ = stop_other.send(());
    stack.stop().await;
}

#[tokio::test]
async fn a_new_usage_report_changes_the_answer_within_a_second() {
    let stack = Stack::start().await;
    let client = stack.client().await;
    let w = json!({"package": "llvm", "version": "18.1.0", "variants": "+clang"});
    // Publish straight onto the log, as ingest would.
    let bus = Bus::connect(&stack.nats.url(), stack.ns.clone(), "test", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let usage = |job_id: u64, peak: u64| {
        let now = time::OffsetDateTime::now_utc();
        let instance = "gitlab.example.com".to_owned();
        Event {
            id: ids::usage(Forge::Gitlab, &instance, job_id, 1),
            occurred_at: Some(timestamp(now)),
            received_at: Some(timestamp(now)),
            source: Some(Source {
                forge: Forge::Gitlab as i32,
                instance: instance.clone(),
                ..Default::default()
            }),
            body: Some(Body::UsageReported(UsageReported {
                job: Some(JobKey {
                    forge: Forge::Gitlab as i32,
                    instance,
                    job_id,
                }),
                attempt: 1,
                r#ref: "develop".into(),
                workload: w
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect(),
                peak_memory_bytes: peak,
                memory_limit_bytes: Some(40_000_000_000),
                cpu_seconds: 100.0,
                wall_seconds: 100.0,
                ..Default::default()
            })),
        }
    };
    // What the jobs' webhooks say: every job ran on develop.
    let job = |job_id: u64| {
        let now = time::OffsetDateTime::now_utc();
        let instance = "gitlab.example.com".to_owned();
        Event {
            id: format!("test-job:{job_id}"),
            occurred_at: Some(timestamp(now)),
            received_at: Some(timestamp(now)),
            source: Some(Source {
                forge: Forge::Gitlab as i32,
                instance: instance.clone(),
                ..Default::default()
            }),
            body: Some(Body::JobObserved(JobObserved {
                job: Some(JobKey {
                    forge: Forge::Gitlab as i32,
                    instance,
                    job_id,
                }),
                name: "build".into(),
                status: JobStatus::Completed as i32,
                r#ref: "develop".into(),
                ..Default::default()
            })),
        }
    };
    let tp = TraceParent::new_root();
    for id in 1..=6 {
        bus.publish_event(&job(id), &tp).await.unwrap();
    }
    for job in 1..=5 {
        bus.publish_event(&usage(job, 4_000_000_000 + job * 10_000_000), &tp)
            .await
            .unwrap();
    }
    let before = eventually(Duration::from_secs(10), || {
        let mut client = client.clone();
        let w = w.clone();
        async move {
            let r = recommend(&mut client, &w).await;
            (r.basis.as_ref()?.samples == 5).then_some(r)
        }
    })
    .await
    .expect("history of five");
    // A much bigger build: the very next answers must reflect it.
    let sent = Instant::now();
    bus.publish_event(&usage(6, 30_000_000_000), &tp)
        .await
        .unwrap();
    let changed = eventually(Duration::from_secs(5), || {
        let mut client = client.clone();
        let before = before.memory_limit_bytes;
        let w = w.clone();
        async move {
            let r = recommend(&mut client, &w).await;
            (r.memory_limit_bytes != before).then_some(r)
        }
    })
    .await
    .expect("the answer changes");
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(changed.basis.unwrap().samples, 6);
    assert!(changed.memory_limit_bytes > before.memory_limit_bytes);
    stack.stop().await;
}

#[tokio::test]
async fn bad_requests_name_the_field_and_reflection_and_health_work() {
    let stack = Stack::start().await;
    let mut client = stack.client().await;
    let err = client
        .recommend(RecommendRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("workload"), "{}", err.message());
    let err = client
        .recommend_batch(runyard_allocator::proto::RecommendBatchRequest {
            requests: vec![request(&torch(), ""), RecommendRequest::default()],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("requests[1]"), "{}", err.message());

    // Gantry endpoint: missing and malformed specs are 400 with a message
    // that names the problem once.
    let http = reqwest::Client::new();
    for (query, error) in [
        (vec![], "spec: missing query parameter"),
        (
            vec![("spec", "@@@")],
            "spec: invalid package version \"@@@\"",
        ),
        (
            vec![("spec", "zlib@1.3.1")],
            "spec: missing compiler (%compiler@version)",
        ),
    ] {
        let r = http
            .get(format!("{}/v1/allocation", stack.http))
            .query(&query)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], error, "{query:?}");
    }
    // Specs without variants are fine.
    let r = http
        .get(format!("{}/v1/allocation", stack.http))
        .query(&[(
            "spec",
            "zlib@1.3.1 arch=linux-ubuntu22.04-x86_64%gcc@12.3.0",
        )])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Standard health checking and reflection.
    let channel = Channel::from_shared(format!("http://{}", stack.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "runyard.allocator.v1.Allocator".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("list services answer expected");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"runyard.allocator.v1.Allocator"),
        "{names:?}"
    );
    stack.stop().await;
}

/// One sample of the allocator's `/metrics` page (0 when absent).
async fn metric(stack: &Stack, series: &str) -> f64 {
    let page = reqwest::get(format!("{}/metrics", stack.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

/// `AllocationIssued` events on the stack's log now.
async fn allocation_events(stack: &Stack) -> usize {
    let c = async_nats::connect(stack.nats.url()).await.unwrap();
    stream_messages(&c, &stack.ns.events_stream())
        .await
        .iter()
        .filter(|m| m.subject.as_str() == stack.ns.allocation_subject())
        .count()
}

/// `retry_of` naming attempt 1 of GitLab job `job_id`, or pipeline
/// `pipeline` when `job_id` is 0.
fn retry_of(job_id: u64, pipeline: u64) -> runyard_allocator::proto::JobAttempt {
    runyard_allocator::proto::JobAttempt {
        forge: "gitlab".into(),
        instance: "gitlab.example.com".into(),
        job_id,
        attempt: u32::from(job_id != 0),
        pipeline_id: pipeline,
    }
}

#[tokio::test]
async fn a_killed_jobs_retry_is_bumped_though_another_build_passed_since() {
    let stack = Stack::start().await;
    let mut client = stack.client().await;
    let w = torch();
    for (i, peak) in [4_000_000_000u64, 4_200_000_000, 4_100_000_000]
        .into_iter()
        .enumerate()
    {
        let job = 100 + i as u64;
        stack.job_hook_in(job, "develop", 900 + i as u64).await;
        stack.report(job, &w, peak, "develop").await;
    }
    let before = eventually(Duration::from_secs(20), || {
        let mut client = client.clone();
        let w = w.clone();
        async move {
            let r = recommend(&mut client, &w).await;
            (r.basis.as_ref()?.samples >= 3).then_some(r)
        }
    })
    .await
    .expect("the history is learned");
    let limit = before.memory_limit_bytes;
    // Pipeline 950's build is killed at that limit; pipeline 951 builds the
    // same spec and passes at the same limit.
    let attempt = |job: u64, peak: u64, oom: bool| {
        json!({
            "forge": "gitlab", "instance": "gitlab.example.com", "job_id": job,
            "attempt": 1, "ref": "develop", "workload": torch(),
            "peak_memory_bytes": peak, "memory_limit_bytes": limit,
            "cpu_seconds": 3600.0, "wall_seconds": 900.0, "oom_killed": oom,
            "exit_code": if oom { 137 } else { 0 }, "cgroup": "v2"
        })
    };
    stack.job_hook_in(500, "develop", 950).await;
    stack.post_usage(&attempt(500, limit, true)).await;
    stack.job_hook_in(501, "develop", 951).await;
    stack.post_usage(&attempt(501, limit * 9 / 10, false)).await;
    let fresh = eventually(Duration::from_secs(20), || {
        let mut client = client.clone();
        let w = w.clone();
        async move {
            let r = recommend(&mut client, &w).await;
            (r.basis.as_ref()?.samples >= 4).then_some(r)
        }
    })
    .await
    .expect("the passing build is learned");
    // A build that is no retry is sized from the history.
    assert!(
        fresh.retry_count == 0 && !fresh.basis.as_ref().unwrap().oom_bump,
        "{fresh:?}"
    );
    // The killed job's retry, named by its job or by its pipeline (a retry
    // pipeline's generate step), is bumped above the killed limit.
    for asked in [retry_of(500, 0), retry_of(0, 950)] {
        let mut req = request(&w, "develop");
        req.retry_of = Some(asked.clone());
        let r = client.recommend(req).await.unwrap().into_inner();
        assert!(
            r.retry_count == 1 && r.basis.as_ref().unwrap().oom_bump,
            "{asked:?}: {r:?}"
        );
        assert!(
            r.memory_limit_bytes >= limit * 6 / 5,
            "{asked:?}: {} after a kill at {limit}",
            r.memory_limit_bytes
        );
        assert!(r.memory_limit_bytes > fresh.memory_limit_bytes);
    }
    // The passing build's job, or another pipeline, retries no kill.
    for asked in [retry_of(501, 0), retry_of(0, 951), retry_of(0, 777)] {
        let mut req = request(&w, "develop");
        req.retry_of = Some(asked.clone());
        let r = client.recommend(req).await.unwrap().into_inner();
        assert_eq!(r.retry_count, 0, "{asked:?}: {r:?}");
    }
    // Gantry's endpoint says the same with query parameters.
    let http = reqwest::Client::new();
    let spec = "py-torch@2.3.1 +cuda~rocm arch=x86_64_v3%gcc@12.3.0";
    let gantry = |extra: Vec<(&'static str, String)>| {
        let http = http.clone();
        let url = format!("{}/v1/allocation", stack.http);
        async move {
            let mut query = vec![("spec", spec.to_owned())];
            query.extend(extra);
            let r = http.get(url).query(&query).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let host = || ("retry_of_instance", "gitlab.example.com".to_owned());
    let gitlab = || ("retry_of_forge", "gitlab".to_owned());
    let (status, body) = gantry(vec![
        gitlab(),
        host(),
        ("retry_of_pipeline_id", "950".into()),
    ])
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["variables"]["RUNYARD_RETRY_COUNT"], "1", "{body}");
    let (_, plain) = gantry(Vec::new()).await;
    assert_eq!(plain["variables"]["RUNYARD_RETRY_COUNT"], "0", "{plain}");
    // Bad parameters are 400 naming them.
    for (extra, says) in [
        (
            vec![gitlab(), ("retry_of_pipeline_id", "950".into())],
            "retry_of: give retry_of_forge and retry_of_instance",
        ),
        (
            vec![gitlab(), host(), ("retry_of_job_id", "500".into())],
            "retry_of_attempt: missing",
        ),
        (
            vec![
                ("retry_of_forge", "svn".into()),
                host(),
                ("retry_of_pipeline_id", "950".into()),
            ],
            "retry_of.forge: \"svn\" is not a forge",
        ),
        (
            vec![gitlab(), host(), ("retry_of_pipeline_id", "0".into())],
            "retry_of.job_id: neither a job id nor a pipeline id",
        ),
    ] {
        let (status, body) = gantry(extra).await;
        assert_eq!(status, 400, "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.starts_with(says), "{error}");
    }
    // gRPC names the field too.
    for (asked, says) in [
        (
            runyard_allocator::proto::JobAttempt {
                forge: "svn".into(),
                ..retry_of(500, 0)
            },
            "retry_of.forge",
        ),
        (
            runyard_allocator::proto::JobAttempt {
                instance: String::new(),
                ..retry_of(500, 0)
            },
            "retry_of.instance",
        ),
        (retry_of(0, 0), "retry_of.job_id"),
        (
            runyard_allocator::proto::JobAttempt {
                attempt: 0,
                ..retry_of(500, 0)
            },
            "retry_of.attempt",
        ),
    ] {
        let mut req = request(&w, "develop");
        req.retry_of = Some(asked);
        let err = client.recommend(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().starts_with(says), "{}", err.message());
    }
    stack.stop().await;
}

#[tokio::test]
async fn oversized_free_text_is_refused_naming_the_field() {
    let stack = Stack::start().await;
    let mut client = stack.client().await;
    // The caps are ingest's (it takes them from `runyard_events::limits`).
    let cap = runyard_events::limits::MAX_TEXT_BYTES;
    // gRPC: a ref past the cap, or with NUL, is INVALID_ARGUMENT naming it.
    for (r, says) in [
        ("r".repeat(cap + 1), "ref: 1025 bytes, longer than 1024"),
        ("main\0x".to_owned(), "ref: must not contain NUL"),
    ] {
        let err = client.recommend(request(&torch(), &r)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().starts_with(says), "{}", err.message());
    }
    let err = client
        .recommend_batch(runyard_allocator::proto::RecommendBatchRequest {
            requests: vec![
                request(&torch(), "develop"),
                request(&torch(), &"r".repeat(cap * 4)),
            ],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("requests[1].ref: 4096 bytes"),
        "{}",
        err.message()
    );
    // At the cap it is answered.
    client
        .recommend(request(&torch(), &"r".repeat(cap)))
        .await
        .unwrap();

    // Gantry's HTTP endpoint: a spec past its cap, or a value in it past
    // the text cap, is 400 naming it.
    let http = reqwest::Client::new();
    let spec = "zlib@1.3.1 arch=linux-ubuntu22.04-x86_64%gcc@12.3.0";
    for (spec, error) in [
        (
            format!("{spec} {}", "+v".repeat(2100)),
            "spec: longer than 4096 bytes".to_owned(),
        ),
        (
            spec.replace("linux-ubuntu22.04-x86_64", &"x".repeat(cap + 1)),
            "spec: workload.arch: value longer than 1024 bytes".to_owned(),
        ),
    ] {
        let r = http
            .get(format!("{}/v1/allocation", stack.http))
            .query(&[("spec", &spec)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], error.as_str());
    }
    // Refused calls issue nothing: the one answered call is the one event.
    let one = eventually(Duration::from_secs(10), || async {
        (allocation_events(&stack).await >= 1).then_some(())
    })
    .await;
    assert!(one.is_some(), "the answered call's event");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(allocation_events(&stack).await, 1);
    stack.stop().await;
}

#[tokio::test]
async fn followed_events_over_the_limits_are_not_used_and_are_counted() {
    let stack = Stack::start().await;
    let w = json!({"package": "hdf5", "version": "1.14.3"});
    // Published straight onto the log, around ingest's checks.
    let bus = Bus::connect(&stack.nats.url(), stack.ns.clone(), "test", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let tp = TraceParent::new_root();
    let cap = runyard_events::limits::MAX_TEXT_BYTES;
    for job in 1..=3 {
        bus.publish_event(&spack_job(job), &tp).await.unwrap();
    }
    let mut long_job = spack_job(4);
    if let Some(Body::JobObserved(j)) = &mut long_job.body {
        j.name = "n".repeat(cap + 1);
    }
    bus.publish_event(&long_job, &tp).await.unwrap();
    let id = |job: u64| ids::usage(Forge::Gitlab, "gitlab.example.com", job, 1);
    let mut long_value = verified_report(&id(2), 2, 1, "spack/spack", &w);
    let mut many = verified_report(&id(3), 3, 1, "spack/spack", &w);
    if let (Some(Body::UsageReported(a)), Some(Body::UsageReported(b))) =
        (&mut long_value.body, &mut many.body)
    {
        a.workload.insert("variants".into(), "+v".repeat(cap));
        b.workload
            .extend((0..64).map(|i| (format!("attr{i}"), "x".to_owned())));
    }
    for e in [
        verified_report(&id(1), 1, 1, "spack/spack", &w),
        long_value,
        many,
    ] {
        bus.publish_event(&e, &tp).await.unwrap();
    }
    // The good report trains; the other three events are counted, not used.
    let refused = eventually(Duration::from_secs(10), || async {
        let n = metric(&stack, "runyard_allocator_followed_events_refused_total").await;
        (n >= 3.0).then_some(n)
    })
    .await;
    assert_eq!(refused, Some(3.0), "a job event and two reports refused");
    let observed = eventually(Duration::from_secs(10), || async {
        let n = metric(&stack, "runyard_allocator_samples_observed_total").await;
        (n >= 1.0).then_some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(observed, Some(1.0));
    assert_eq!(
        metric(&stack, "runyard_allocator_samples_observed_total").await,
        1.0,
        "only the report within the limits fed the model"
    );
    stack.stop().await;
}

/// With an OTLP endpoint set, a usage report's path through ingest and
/// job-tracker is one trace continuing the sender's `traceparent`, and a
/// `Recommend` or gantry call carrying one is exported as its child, with
/// the call's context on its `AllocationIssued` event.
#[tokio::test]
async fn traces_follow_a_report_and_the_calls_through_the_stack() {
    let collector = Collector::start().await;
    runyard_telemetry::traces::install("runyard-test", &collector.url).unwrap();
    let stack = Stack::start().await;
    let http = reqwest::Client::new();
    let sender = "00f067aa0ba902b7";

    // A usage report, sent with a traceparent, and a refused one without.
    let report_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let report = json!({
        "forge": "gitlab", "instance": "gitlab.example.com", "job_id": 77,
        "attempt": 1, "ref": "develop", "workload": torch(),
        "peak_memory_bytes": 1_000_000_000u64, "memory_limit_bytes": 2_000_000_000u64,
        "cpu_seconds": 60.0, "wall_seconds": 30.0, "oom_killed": false, "exit_code": 0
    });
    let post = |token: &str| {
        http.post(format!("{}/v1/usage", stack.ingest))
            .bearer_auth(token)
            .json(&report)
    };
    let accepted = post(USAGE_TOKEN)
        .header("traceparent", format!("00-{report_trace}-{sender}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    assert_eq!(post("wrong").send().await.unwrap().status(), 401);

    // A Recommend with the caller's context in its metadata, and one the
    // allocator refuses.
    let call_trace = "0af7651916cd43dd8448eb211c80319c";
    let traced = |req: RecommendRequest| {
        let mut req = tonic::Request::new(req);
        req.metadata_mut().insert(
            "traceparent",
            format!("00-{call_trace}-{sender}-01").parse().unwrap(),
        );
        req
    };
    let mut client = stack.client().await;
    client
        .recommend(traced(request(&torch(), "develop")))
        .await
        .unwrap();
    let refused = client
        .recommend(traced(RecommendRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // The gantry endpoint with a traceparent header.
    let gantry_trace = "5b8aa5a2d2c872e8321cf37308d69df2";
    let resp = http
        .get(format!("{}/v1/allocation", stack.http))
        .query(&[("spec", "zlib@1.3.1 +shared arch=x86_64_v3%gcc@12.3.0")])
        .header("traceparent", format!("00-{gantry_trace}-{sender}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let in_trace = |spans: &[(String, Span)], trace: &str, name: &str| -> Vec<Span> {
        spans
            .iter()
            .map(|(_, s)| s)
            .filter(|s| hex_id(&s.trace_id) == trace && s.name == name)
            .cloned()
            .collect()
    };
    let spans = collector
        .wait_for(Duration::from_secs(20), |spans| {
            !in_trace(spans, report_trace, "job-tracker apply").is_empty()
                && in_trace(spans, call_trace, "allocator Recommend").len() == 2
                && !in_trace(spans, gantry_trace, "allocator GET /v1/allocation").is_empty()
        })
        .await
        .unwrap_or_else(|| {
            let seen: Vec<_> = collector
                .spans()
                .into_iter()
                .map(|(_, s)| (hex_id(&s.trace_id), s.name))
                .collect();
            panic!("the spans reach the collector; it holds {seen:?}")
        });
    assert!(spans.iter().all(|(service, _)| service == "runyard-test"));

    // ingest's span continues the sender's; job-tracker's continues ingest's.
    let [ingest] = in_trace(&spans, report_trace, "ingest usage report")
        .try_into()
        .unwrap();
    assert_eq!(hex_id(&ingest.parent_span_id), sender);
    assert_eq!(
        attribute(&ingest, "http.response.status_code"),
        Some(AnyValue::IntValue(202))
    );
    assert_eq!(
        attribute(&ingest, "runyard.event_id"),
        Some(AnyValue::StringValue(
            "usage:gitlab:gitlab.example.com:77:1".into()
        ))
    );
    let [apply] = in_trace(&spans, report_trace, "job-tracker apply")
        .try_into()
        .unwrap();
    assert_eq!(apply.parent_span_id, ingest.span_id);
    assert_eq!(
        attribute(&apply, "runyard.event_type"),
        Some(AnyValue::StringValue("UsageReported".into()))
    );
    assert!(apply.end_time_unix_nano >= apply.start_time_unix_nano);
    // The refused report: traced as what the sender was told, in a new trace.
    let refused_report = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| attribute(s, "http.response.status_code") == Some(AnyValue::IntValue(401)))
        .expect("the refused report's span");
    assert_eq!(refused_report.name, "ingest usage report");
    assert!(refused_report.parent_span_id.is_empty());

    // The allocator's calls.
    let calls = in_trace(&spans, call_trace, "allocator Recommend");
    assert!(calls.iter().all(|s| hex_id(&s.parent_span_id) == sender));
    let (answered, invalid): (Vec<_>, Vec<_>) = calls
        .iter()
        .partition(|s| attribute(s, "rpc.grpc.status_code").is_none());
    let (answered, invalid) = (answered[0], invalid[0]);
    assert_eq!(
        attribute(invalid, "rpc.grpc.status_code"),
        Some(AnyValue::IntValue(tonic::Code::InvalidArgument as i64))
    );
    let [gantry] = in_trace(&spans, gantry_trace, "allocator GET /v1/allocation")
        .try_into()
        .unwrap();
    assert_eq!(
        attribute(&gantry, "http.response.status_code"),
        Some(AnyValue::IntValue(200))
    );

    // Each answer's AllocationIssued event carries its call's span.
    let nats = async_nats::connect(stack.nats.url()).await.unwrap();
    let carried = eventually(Duration::from_secs(10), || async {
        let msgs = stream_messages(&nats, &stack.ns.events_stream()).await;
        let carried: Vec<(String, String)> = decode_events(&msgs)
            .iter()
            .zip(&msgs)
            .filter(|(e, _)| matches!(e.body, Some(Body::AllocationIssued(_))))
            .filter_map(|(_, m)| m.headers.as_ref()?.get(TRACEPARENT_HEADER))
            .filter_map(|v| TraceParent::parse(v.as_str()))
            .map(|t| {
                (
                    format!("{:032x}", t.trace_id),
                    format!("{:016x}", t.span_id),
                )
            })
            .collect();
        (carried.len() == 2).then_some(carried)
    })
    .await
    .expect("two AllocationIssued events");
    assert!(carried.contains(&(call_trace.to_owned(), hex_id(&answered.span_id))));
    assert!(carried.contains(&(gantry_trace.to_owned(), hex_id(&gantry.span_id))));
    stack.stop().await;
}

/// The metric families one `/metrics` page declares (`# TYPE name type`).
async fn declared_metrics(base: &str) -> BTreeMap<String, String> {
    let page = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    runyard_testkit::dashboard::declared(&page)
}

/// `deploy/grafana/dashboards/runyard.json` queries only series the services
/// expose, with the suffixes their types give them, covers every metric
/// family the services declare, and reads the datasource Grafana is
/// provisioned with. A renamed or new metric fails here, not on a blank panel.
#[tokio::test]
async fn the_dashboard_queries_what_the_services_expose_and_all_of_it() {
    let stack = Stack::start().await;
    // Some traffic: a labelled family shows on the page once it has a child.
    stack.report(7001, &torch(), 9_000_000_000, "develop").await;
    let mut client = stack.client().await;
    recommend(&mut client, &torch()).await;
    let applied = eventually(Duration::from_secs(10), || async {
        let page = declared_metrics(&stack.tracker).await;
        page.contains_key("runyard_tracker_events").then_some(())
    })
    .await;
    assert!(applied.is_some(), "job-tracker applied the report");

    let mut declared = BTreeMap::new();
    for base in [&stack.ingest, &stack.tracker, &stack.http] {
        let page = declared_metrics(base).await;
        assert!(!page.is_empty(), "{base}/metrics declares metrics");
        declared.extend(page);
    }
    let exposed = runyard_testkit::dashboard::exposed(&declared);

    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/grafana");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/dashboards/runyard.json")).unwrap(),
    )
    .unwrap();
    let provisioned =
        std::fs::read_to_string(format!("{root}/provisioning/datasources/runyard.yml")).unwrap();

    let mut used = std::collections::BTreeSet::new();
    let panels = dashboard["panels"].as_array().unwrap();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().unwrap();
        let uid = panel["datasource"]["uid"].as_str().unwrap();
        assert!(
            provisioned.contains(&format!("uid: {uid}")),
            "panel {title:?} reads datasource {uid:?}, which is not provisioned"
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title:?} has queries");
        for expr in targets.iter().map(|t| t["expr"].as_str().unwrap()) {
            let series = runyard_testkit::dashboard::series_in(expr);
            assert!(!series.is_empty(), "{title:?}: {expr} queries runyard");
            // The scaler's and the console's families are checked by their
            // own tests (`the_dashboard_covers_every_scaler_metric`,
            // `the_dashboard_covers_every_console_metric`).
            for s in series.into_iter().filter(|s| {
                !["runyard_scaler_", "runyard_console_", "runyard_savings_"]
                    .iter()
                    .any(|p| s.starts_with(p))
            }) {
                let family = exposed.get(s).unwrap_or_else(|| {
                    panic!("panel {title:?} queries {s}, which no service exposes: {declared:?}")
                });
                used.insert(family.clone());
            }
        }
    }
    let unused: Vec<_> = declared
        .keys()
        .filter(|f| !used.contains(f.as_str()))
        .collect();
    assert!(unused.is_empty(), "metrics on no panel: {unused:?}");
    stack.stop().await;
}

/// What a CI system sends for one attempt of a job: its usage report, as
/// `runyard-report` posts it after the job.
struct Attempt<'a> {
    job_id: u64,
    attempt: u32,
    git_ref: &'a str,
    workload: &'a runyard_allocator::model::Workload,
    job: &'a runyard_allocator::simulate::Job,
    rec: &'a runyard_allocator::proto::Recommendation,
}

impl Stack {
    async fn report_attempt(&self, a: &Attempt<'_>) {
        let limit = a.rec.memory_limit_bytes;
        let killed = a.job.peak_memory_bytes > limit;
        let body = json!({
            "forge": "gitlab", "instance": "gitlab.example.com", "job_id": a.job_id,
            "attempt": a.attempt, "ref": a.git_ref, "workload": a.workload,
            "peak_memory_bytes": a.job.peak_memory_bytes.min(limit),
            "memory_limit_bytes": limit, "memory_request_bytes": a.rec.memory_request_bytes,
            "cpu_seconds": a.job.cpu_seconds, "wall_seconds": a.job.wall_seconds,
            "oom_killed": killed, "exit_code": if killed { 137 } else { 0 }
        });
        self.post_usage(&body).await;
    }

    /// Waits until the allocator has fed `n` usage reports to its model.
    async fn observed(&self, n: u64) {
        let seen = eventually(Duration::from_secs(10), || async {
            let text = reqwest::get(format!("{}/metrics", self.http))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            let count = text
                .lines()
                .find(|l| l.starts_with("runyard_allocator_samples_observed_total"))?
                .rsplit(' ')
                .next()?
                .parse::<f64>()
                .ok()?;
            (count >= n as f64).then_some(())
        })
        .await;
        assert!(seen.is_some(), "the allocator observed report {n}");
    }
}

/// The simulation's claims are only as good as its likeness to the service.
/// A sparse trace (new packages and versions, spikes, growth, pull-request
/// jobs) goes through the real stack as CI would send it — the job's
/// webhook, a `Recommend` over gRPC, the usage report of every attempt (a
/// killed one reporting its limit as its peak), a retry with the bumped
/// limit — and the same trace through the model in process, as `simulate`
/// replays it. Every attempt gets the same limit both ways. (Time decay by
/// days is off in both: the stack stamps a report when it arrives, so a
/// month replayed in seconds has no days between samples.)
#[tokio::test]
async fn the_stack_sizes_every_attempt_of_a_trace_as_the_simulation_does() {
    use runyard_allocator::model::{JobAttempt, Model, Observation, Params};
    use runyard_allocator::simulate::{SparseConfig, generate_sparse};

    let params = Params {
        half_life_days: 0.0,
        ..Params::default()
    };
    let trace = generate_sparse(&SparseConfig {
        workloads: 120,
        jobs: 700,
        seed: 11,
        ..SparseConfig::default()
    });
    let protected: Vec<bool> = trace.refs.iter().map(|r| r == "develop").collect();
    assert!(protected.iter().any(|p| *p) && protected.iter().any(|p| !*p));

    // Trace job `i` runs in pipeline `5000 + i`; its attempt `n` (a GitLab
    // job retry: a new job id in the same pipeline, retried `n - 1` times)
    // is job `10_000 + 16 i + n`.
    let pipeline = |i: usize| 5000 + i as u64;
    let job_id = |i: usize, n: u32| 10_000 + 16 * i as u64 + u64::from(n);
    let identity = |i: usize, n: u32| {
        JobAttempt::new("gitlab", "gitlab.example.com", job_id(i, n), pipeline(i), n)
    };

    // In process, as `simulate` replays it.
    let mut model = Model::new(params.clone());
    let mut offline = Vec::new();
    for (i, job) in trace.jobs.iter().enumerate() {
        let w = &trace.workloads[job.workload as usize];
        let mut rec = model.recommend(w);
        for attempt in 1u32..=8 {
            let limit = rec.memory_limit_bytes;
            offline.push(limit);
            let killed = job.peak_memory_bytes > limit;
            model.observe(
                w,
                Observation {
                    at: job.at + f64::from(attempt),
                    peak_memory_bytes: job.peak_memory_bytes.min(limit),
                    memory_limit_bytes: Some(limit),
                    memory_request_bytes: Some(rec.memory_request_bytes),
                    cpu_seconds: job.cpu_seconds,
                    wall_seconds: job.wall_seconds,
                    oom_killed: killed,
                    protected: protected[job.git_ref as usize],
                    job: Some(identity(i, attempt)),
                },
            );
            rec = model.recommend_retry(w, identity(i, attempt));
            if !killed || rec.basis.retries_exhausted {
                break;
            }
            assert!(attempt < 8, "job {i}: retried without end");
        }
    }

    // Through the stack.
    let stack = Stack::start_with(params).await;
    let mut client = stack.client().await;
    let mut online = Vec::new();
    let mut reports = 0;
    let (mut kills, mut newcomers) = (0, 0);
    for (i, job) in trace.jobs.iter().enumerate() {
        let w = &trace.workloads[job.workload as usize];
        let git_ref = &trace.refs[job.git_ref as usize];
        let ask = RecommendRequest {
            workload: w.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            r#ref: git_ref.clone(),
            retry_of: None,
            preview: false,
        };
        let mut rec = client.recommend(ask.clone()).await.unwrap().into_inner();
        for attempt in 1u32..=8 {
            // A GitLab job retry is a new job (its webhook first).
            let job_id = job_id(i, attempt);
            stack
                .job_hook_attempt(job_id, git_ref, pipeline(i), attempt)
                .await;
            online.push(rec.memory_limit_bytes);
            let basis = rec.basis.clone().unwrap();
            newcomers += u32::from(basis.statistic.contains("+newcomer"));
            let killed = job.peak_memory_bytes > rec.memory_limit_bytes;
            kills += u32::from(killed);
            stack
                .report_attempt(&Attempt {
                    job_id,
                    attempt,
                    git_ref,
                    workload: w,
                    job,
                    rec: &rec,
                })
                .await;
            reports += 1;
            stack.observed(reports).await;
            // The next attempt says which one it retries.
            let retry = RecommendRequest {
                retry_of: Some(runyard_allocator::proto::JobAttempt {
                    forge: "gitlab".into(),
                    instance: "gitlab.example.com".into(),
                    job_id,
                    attempt,
                    pipeline_id: pipeline(i),
                }),
                ..ask.clone()
            };
            rec = client.recommend(retry).await.unwrap().into_inner();
            if !killed || rec.basis.as_ref().unwrap().retries_exhausted {
                break;
            }
            assert!(attempt < 8, "job {i}: retried without end");
        }
        if let Some(k) = online.iter().zip(&offline).position(|(a, b)| a != b) {
            panic!(
                "attempt {k} (job {i} of {}, {w:?}): the stack answered {} bytes, the simulation {}",
                trace.jobs.len(),
                online[k],
                offline[k]
            );
        }
    }
    assert_eq!(online.len(), offline.len(), "the same attempts both ways");
    // The trace exercised what it is for: kills and retries, and new
    // packages sized from the site's prior.
    assert!(
        kills >= 5 && newcomers >= 5,
        "kills {kills}, newcomers {newcomers}"
    );
    println!(
        "online replay: {} jobs, {} attempts, {kills} killed, {newcomers} priced as new packages; every limit as simulated",
        trace.jobs.len(),
        online.len()
    );
    stack.stop().await;
}

#[tokio::test]
async fn a_preview_is_answered_like_any_call_and_leaves_no_trace() {
    let stack = Stack::start().await;
    let mut client = stack.client().await;
    let w = torch();
    for (i, peak) in [4_000_000_000u64, 4_400_000_000, 4_200_000_000]
        .into_iter()
        .enumerate()
    {
        let job = 300 + i as u64;
        stack.job_hook_in(job, "develop", 700 + i as u64).await;
        stack.report(job, &w, peak, "develop").await;
    }
    let mut preview = request(&w, "develop");
    preview.preview = true;
    let looked = eventually(Duration::from_secs(20), || {
        let (mut client, preview) = (client.clone(), preview.clone());
        async move {
            let r = client.recommend(preview).await.ok()?.into_inner();
            (r.basis.as_ref()?.samples >= 3).then_some(r)
        }
    })
    .await
    .expect("the history is learned");
    // The basis says how wide the estimate is; a history of its own is no
    // site prior.
    let basis = looked.basis.clone().unwrap();
    assert!(basis.spread > 0.0 && basis.spread < 1.0, "{basis:?}");
    assert!(!basis.site_prior, "{basis:?}");
    let counted = |page: String| {
        page.lines()
            .filter(|l| l.starts_with("runyard_allocator_recommendations_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let served = || async {
        reqwest::get(format!("{}/metrics", stack.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    assert_eq!(counted(served().await), 0.0);
    // The same answer a use gets; the use alone is counted and logged.
    let used = recommend(&mut client, &w).await;
    assert_eq!(used.memory_limit_bytes, looked.memory_limit_bytes);
    assert_eq!(used.variables, looked.variables);
    let one = eventually(Duration::from_secs(10), || async {
        (allocation_events(&stack).await >= 1).then_some(())
    })
    .await;
    assert!(one.is_some(), "the use's event");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(allocation_events(&stack).await, 1);
    assert_eq!(counted(served().await), 1.0);
    // A batch's previews are looks too.
    let mut batch_preview = request(&w, "develop");
    batch_preview.preview = true;
    client
        .recommend_batch(runyard_allocator::proto::RecommendBatchRequest {
            requests: vec![batch_preview.clone(), batch_preview],
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(allocation_events(&stack).await, 1);
    assert_eq!(counted(served().await), 1.0);
    stack.stop().await;
}
