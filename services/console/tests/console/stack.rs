//! The whole stack in this process for the page tests: a real nats-server
//! (a namespace per test), a real Postgres (a database per test, read by
//! the console through its read-only role), ingest, the job-tracker, the
//! allocator, the scaler (one pool of one runner, each runner a local
//! process) and the console, on loopback ports. Only GitHub's API is faked.
//! Sample traffic goes in through ingest, signed, as the forges send it.

use std::net::SocketAddr;
use std::time::Duration;

use runyard_events::Namespace;
use runyard_testkit::fake_github::FakeGitHub;
use runyard_testkit::{TestDb, TestNats, eventually, unique_namespace};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::{Console, LOCAL};

const GITHUB_SECRET: &str = "5d0c8e3a1f7b9d2e4c6a8b0d1f3e5a7c9b1d3f5e7a9c0b2d4f6e8a1c3b5d7f9e";
const GITLAB_TOKEN: &str = "a7c1e9b3d5f70e2c4a6b8d0f1e3c5a7b9d1f3e5c7a9b0d2f4e6c8a1b3d5f7e9c";
const USAGE_TOKEN: &str = "c3e5a7b9d1f30e2c4a6b8d0f1e3c5a7b9d1f3e5c7a9b0d2f4e6c8a1b3d5f7e91";
const ALLOCATOR_TOKEN: &str = "e9b3d5f70e2c4a6b8d0f1e3c5a7b9d1f3e5c7a9b0d2f4e6c8a1b3d5f7e9c1a7b";
const INSTANCE_KEY: &str = "0f1e3c5a7b9d1f3e5c7a9b0d2f4e6c8a1b3d5f7e9c1a7b3d5f70e2c4a6b8d0f1";
const GITHUB_TOKEN: &str = "ghp_consoleTest0123456789abcdefABCDEF0123";

/// The memory every job had before runyard (the savings' baseline).
pub const BEFORE_MEMORY: u64 = 16_000_000_000;

/// The GitLab job of the sample traffic its forge holds for its stage.
pub const HELD_JOB: u64 = 4712;

/// The two GitHub jobs of the sample traffic: the pool's one runner goes
/// to the first; the second waits for room.
pub const GITHUB_JOBS: [u64; 2] = [21_870_573_124, 21_870_573_125];

/// The GitLab builds of one Spack spec: their peaks (the first one
/// OOM-killed at its limit), each with a 12 GB limit for an hour.
pub const BUILDS: [(u64, u64, bool); 5] = [
    (4711, 12_000_000_000, true),
    (4721, 9_000_000_000, false),
    (4731, 9_500_000_000, false),
    (4741, 10_000_000_000, false),
    (4751, 10_500_000_000, false),
];

/// Each build's limit and wall time.
pub const LIMIT: u64 = 12_000_000_000;
/// Each build's wall time.
pub const WALL_SECONDS: f64 = 3600.0;

/// The pool: one runner at most, each a local `sleep`.
fn scaler_file(state: &std::path::Path) -> String {
    format!(
        r#"
[providers.local]
kind = "process"
command = ["/bin/sleep", "90"]

[[pools]]
name = "linux-x64"
forge = "github"
scope = {{ org = "octo-org" }}
labels = ["self-hosted", "linux", "x64", "gpu"]
provider = "local"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}, {{ name = "large", memory = "16GiB", cpus = 8 }}]
max_runners = 1

[scaler]
state_dir = "{}"
"#,
        state.display()
    )
}

/// The stack.
pub struct Stack {
    _nats: TestNats,
    pub db: TestDb,
    pub ingest: String,
    pub console: Console,
    _github: FakeGitHub,
    _stops: Vec<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("console", &self.console.url)
            .finish()
    }
}

fn bus(nats: &TestNats, ns: &Namespace) -> runyard_config::Bus {
    runyard_config::Bus {
        nats_url: nats.url(),
        namespace: ns.to_string(),
    }
}

fn database(db: &TestDb) -> runyard_config::Database {
    runyard_config::Database {
        url: db.url.clone(),
    }
}

/// Runs a service's `run` until the stack is dropped.
fn serve<F>(stops: &mut Vec<oneshot::Sender<()>>, run: impl FnOnce(Stop) -> F)
where
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel::<()>();
    stops.push(tx);
    tokio::spawn(run(Box::pin(async move {
        let _ = rx.await;
    })));
}

/// What stops a service.
type Stop = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

async fn ready(url: &str) {
    let http = reqwest::Client::new();
    let ok = eventually(Duration::from_secs(60), || {
        let (http, url) = (http.clone(), format!("{url}/readyz"));
        async move {
            let r = http.get(&url).send().await.ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
    assert!(ok.is_some(), "{url} never became ready");
}

impl Stack {
    /// Starts every service.
    pub async fn start() -> Self {
        runyard_telemetry::install_crypto_provider();
        // As each service's main does: spans carry the trace a message
        // came in, so a webhook's path is one trace.
        runyard_telemetry::init_tracing().unwrap();
        let nats = TestNats::get().await;
        let ns = unique_namespace();
        let db = TestDb::new();
        // Before the job-tracker migrates: it grants the readers' role
        // SELECT on the projection only if the role exists.
        db.reader_url().await;
        let github = FakeGitHub::start().await;
        let dir = tempfile::tempdir().unwrap();
        let mut stops = Vec::new();

        let ingest = runyard_ingest::App::build(runyard_ingest::Config {
            bus: bus(&nats, &ns),
            ingest_listen: LOCAL,
            github_webhook_secret: Some(GITHUB_SECRET.to_owned().into()),
            gitlab_webhook_token: Some(GITLAB_TOKEN.to_owned().into()),
            usage_token: Some(USAGE_TOKEN.to_owned().into()),
            ..runyard_ingest::Config::default()
        })
        .await
        .unwrap();
        let ingest_url = format!("http://{}", ingest.local_addr());
        serve(&mut stops, |stop| ingest.run(stop));

        let tracker = runyard_job_tracker::App::build(runyard_job_tracker::Config {
            bus: bus(&nats, &ns),
            database: database(&db),
            tracker_http_listen: LOCAL,
            tracker_batch_wait: Duration::from_millis(5),
            ..runyard_job_tracker::Config::default()
        })
        .await
        .unwrap();
        let tracker_url = format!("http://{}", tracker.local_addr());
        serve(&mut stops, |stop| tracker.run(stop));

        let allocator = runyard_allocator::App::build(runyard_allocator::Config {
            bus: bus(&nats, &ns),
            database: database(&db),
            allocator_listen: LOCAL,
            allocator_http_listen: LOCAL,
            allocator_tokens: runyard_allocator::auth::tokens([ALLOCATOR_TOKEN]),
            ..runyard_allocator::Config::default()
        })
        .await
        .unwrap();
        let grpc: SocketAddr = allocator.grpc_addr();
        let allocator_http = format!("http://{}", allocator.http_addr());
        serve(&mut stops, |stop| allocator.run(stop));

        let file = scaler_file(&dir.path().join("runners"));
        let scaler = runyard_scaler::App::build(
            runyard_scaler::Config {
                bus: bus(&nats, &ns),
                database: database(&db),
                scaler_http_listen: LOCAL,
                github_api_url: github.url(),
                github_token: Some(GITHUB_TOKEN.to_owned().into()),
                allocator_url: format!("http://{grpc}"),
                allocator_client_token: Some(ALLOCATOR_TOKEN.to_owned().into()),
                scaler_metadata_listen: LOCAL,
                scaler_instance_token_key: Some(INSTANCE_KEY.to_owned().into()),
                ..runyard_scaler::Config::default()
            },
            Some(runyard_scaler::ScalerFile::parse(&file).unwrap()),
        )
        .await
        .unwrap();
        let scaler_url = format!("http://{}", scaler.local_addr());
        serve(&mut stops, |stop| scaler.run(stop));

        for url in [&ingest_url, &tracker_url, &allocator_http, &scaler_url] {
            ready(url).await;
        }
        let mut config = crate::config(&db).await;
        config.scaler_url = scaler_url;
        config.allocator_url = format!("http://{grpc}");
        config.allocator_client_token = Some(ALLOCATOR_TOKEN.to_owned().into());
        config.console_before_memory = Some(bytesize::ByteSize::b(BEFORE_MEMORY));
        let console = Console::start(config).await;
        Self {
            _nats: nats,
            db,
            ingest: ingest_url,
            console,
            _github: github,
            _stops: stops,
            _dir: dir,
        }
    }

    async fn post(&self, path: &str, headers: &[(&str, String)], body: &Value) {
        let mut req = reqwest::Client::new()
            .post(format!("{}{path}", self.ingest))
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let r = req.body(body.to_string()).send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }

    /// Two queued GitHub jobs for the pool, a Spack spec built five times
    /// on GitLab (each build's Pipeline Hook, then its usage report; the
    /// first OOM-killed).
    pub async fn sample_traffic(&self) {
        let queued: Value =
            serde_json::from_str(&runyard_testkit::fixture("github_workflow_job_queued.json"))
                .unwrap();
        // Queued a minute and a half ago (GitHub fills started_at with
        // the creation time while a job is queued).
        let queued_at = (time::OffsetDateTime::now_utc() - time::Duration::seconds(95))
            .replace_nanosecond(0)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        for (i, id) in GITHUB_JOBS.iter().enumerate() {
            let mut d = queued.clone();
            d["workflow_job"]["id"] = json!(id);
            d["workflow_job"]["created_at"] = json!(queued_at);
            d["workflow_job"]["started_at"] = json!(queued_at);
            d["workflow_job"]["run_id"] = json!(9_475_318_452_u64 + i as u64);
            let body = d.to_string();
            let signature = runyard_testkit::github_signature(GITHUB_SECRET, body.as_bytes());
            self.post(
                "/webhooks/github",
                &[
                    ("x-github-event", "workflow_job".into()),
                    ("x-github-delivery", format!("console-test-{id}")),
                    ("x-hub-signature-256", signature),
                ],
                &d,
            )
            .await;
        }
        let pipeline: Value =
            serde_json::from_str(&runyard_testkit::fixture("gitlab_pipeline_failed.json")).unwrap();
        let report: Value =
            serde_json::from_str(&runyard_testkit::fixture("usage_report.json")).unwrap();
        for (i, (id, peak, killed)) in BUILDS.iter().enumerate() {
            let mut hook = pipeline.clone();
            let mut build = pipeline["builds"][1].clone();
            build["id"] = json!(id);
            build["status"] = json!(if *killed { "failed" } else { "success" });
            hook["object_attributes"]["id"] = json!(1234 + i);
            hook["object_attributes"]["status"] = json!(if *killed { "failed" } else { "success" });
            // The first pipeline also holds its deploy job, `created`:
            // GitLab holds it until its stage's turn.
            hook["builds"] = if i == 0 {
                let mut deploy = pipeline["builds"][2].clone();
                deploy["id"] = json!(HELD_JOB);
                deploy["status"] = json!("created");
                let made = time::OffsetDateTime::now_utc() - time::Duration::minutes(4);
                deploy["created_at"] = json!(format!(
                    "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
                    made.year(),
                    u8::from(made.month()),
                    made.day(),
                    made.hour(),
                    made.minute(),
                    made.second()
                ));
                json!([build, deploy])
            } else {
                json!([build])
            };
            self.post(
                "/webhooks/gitlab",
                &[
                    ("x-gitlab-event", "Pipeline Hook".into()),
                    ("x-gitlab-token", GITLAB_TOKEN.into()),
                    ("x-gitlab-instance", "https://gitlab.example.com".into()),
                    ("idempotency-key", format!("console-test-pipeline-{id}")),
                ],
                &hook,
            )
            .await;
            let mut r = report.clone();
            r["job_id"] = json!(id);
            r["peak_memory_bytes"] = json!(peak);
            r["memory_limit_bytes"] = json!(LIMIT);
            r["wall_seconds"] = json!(WALL_SECONDS);
            r["oom_killed"] = json!(killed);
            r["exit_code"] = json!(if *killed { 137 } else { 0 });
            self.post(
                "/v1/usage",
                &[("authorization", format!("Bearer {USAGE_TOKEN}"))],
                &r,
            )
            .await;
        }
        // Projected: every usage report and both GitHub jobs.
        let pool = sqlx::PgPool::connect(&self.db.url).await.unwrap();
        let done = eventually(Duration::from_secs(60), || {
            let pool = pool.clone();
            async move {
                let samples: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_samples")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
                let jobs: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE forge = 'github'")
                        .fetch_one(&pool)
                        .await
                        .ok()?;
                (samples == BUILDS.len() as i64 && jobs == 2).then_some(())
            }
        })
        .await;
        pool.close().await;
        assert!(done.is_some(), "the sample traffic was never projected");
    }
}
