//! The whole stack as real processes for the OOM retry tests: ingest,
//! job-tracker, allocator and scaler binaries on a real NATS (a namespace of
//! their own) and a real Postgres (a database of their own), with HTTP fakes
//! of GitLab and GitHub on loopback. The test plays the forge (signed
//! webhooks) and the job (usage reports).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use runyard_allocator::proto::RecommendRequest;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_events::{Body, Event, Namespace};
use runyard_testkit::fake_actions::FakeActions;
use runyard_testkit::fake_github::FakeGitHub;
use runyard_testkit::fake_gitlab::FakeGitLab;
use runyard_testkit::{TestDb, TestNats, eventually, free_port, unique_namespace};
use serde_json::{Value, json};

use crate::support;

/// Deadline of every wait.
pub const WAIT: Duration = Duration::from_secs(60);

// As `openssl rand -hex 32` makes them (runyard refuses weak secrets).
const GITLAB_TOKEN: &str = "65218c905006bfb0ff508c1b3f6b073775cf9871cc05205961a9f5497f0f7a4f";
const GITHUB_SECRET: &str = "aaf19c62844e58291e381f7225ce67a4a148b2708a08bbbd26cb580386204716";
const USAGE_TOKEN: &str = "11e32cbacfd1b79895d00f1657982d6a6943c9c33f82f0634b854f612a35f1c2";

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A binary of the workspace, next to this package's own.
fn binary(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_runyard-scaler"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// The running stack.
pub struct Stack {
    /// NATS.
    pub nats: TestNats,
    /// Namespace.
    pub ns: Namespace,
    /// Database.
    pub db: TestDb,
    /// Fake GitLab.
    pub gitlab: FakeGitLab,
    /// Fake GitHub.
    pub github: FakeGitHub,
    /// The fake Actions service behind it (its scale sets' sessions).
    pub actions: FakeActions,
    ingest: String,
    allocator: String,
    scaler: String,
    bus: runyard_bus::Bus,
    markers: std::sync::atomic::AtomicU64,
    procs: Vec<Proc>,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

fn spawn(name: &str, env: &[(&str, String)], log: &Path) -> Proc {
    let out = std::fs::File::create(log).expect("log file");
    let mut cmd = Command::new(binary(name));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("RUNYARD_LOG_FORMAT", "pretty")
        .stdout(Stdio::null())
        .stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc(cmd.spawn().expect("spawning a service"))
}

async fn ready(http: &reqwest::Client, url: String) {
    let ok = eventually(WAIT, || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.get(&url).send().await.ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
    assert!(ok.is_some(), "{url} never became ready");
}

impl Stack {
    /// Starts everything; `scaler_toml` is the scaler's file (pools,
    /// providers, `[retry]`, `[scaler]`).
    pub async fn start(scaler_toml: &str) -> Self {
        Self::start_with(scaler_toml, &[]).await
    }

    /// [`Stack::start`] with `extra` in every service's environment.
    pub async fn start_with(scaler_toml: &str, extra: &[(&'static str, String)]) -> Self {
        runyard_telemetry::install_crypto_provider();
        let nats = TestNats::get().await;
        let ns = unique_namespace();
        let db = TestDb::new();
        let gitlab = FakeGitLab::start().await;
        let github = FakeGitHub::start().await;
        let actions = FakeActions::start().await;
        actions.set_poll_hold(Duration::from_millis(300));
        github.connect_actions(&actions);
        let dir = tempfile::tempdir().expect("tempdir");
        let http = reqwest::Client::new();
        let common = |own: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
            let mut env = vec![
                ("RUNYARD_NATS_URL", nats.url()),
                ("RUNYARD_NAMESPACE", ns.as_str().to_owned()),
                ("RUNYARD_DATABASE_URL", db.url.clone()),
            ];
            env.extend(extra.iter().cloned());
            env.extend(own.iter().cloned());
            env
        };
        let mut procs = Vec::new();
        let tracker_port = free_port();
        procs.push(spawn(
            "runyard-job-tracker",
            &common(&[(
                "RUNYARD_TRACKER_HTTP_LISTEN",
                format!("127.0.0.1:{tracker_port}"),
            )]),
            &dir.path().join("tracker.log"),
        ));
        ready(&http, format!("http://127.0.0.1:{tracker_port}/readyz")).await;
        let (grpc, alloc_http) = (free_port(), free_port());
        procs.push(spawn(
            "runyard-allocator",
            &common(&[
                ("RUNYARD_ALLOCATOR_LISTEN", format!("127.0.0.1:{grpc}")),
                (
                    "RUNYARD_ALLOCATOR_HTTP_LISTEN",
                    format!("127.0.0.1:{alloc_http}"),
                ),
            ]),
            &dir.path().join("allocator.log"),
        ));
        let ingest_port = free_port();
        procs.push(spawn(
            "runyard-ingest",
            &common(&[
                ("RUNYARD_INGEST_LISTEN", format!("127.0.0.1:{ingest_port}")),
                ("RUNYARD_GITLAB_WEBHOOK_TOKEN", GITLAB_TOKEN.into()),
                ("RUNYARD_GITHUB_WEBHOOK_SECRET", GITHUB_SECRET.into()),
                ("RUNYARD_USAGE_TOKEN", USAGE_TOKEN.into()),
            ]),
            &dir.path().join("ingest.log"),
        ));
        let config = dir.path().join("scaler.toml");
        std::fs::write(&config, scaler_toml).expect("scaler config");
        let scaler_port = free_port();
        procs.push(spawn(
            env!("CARGO_BIN_EXE_runyard-scaler")
                .rsplit('/')
                .next()
                .unwrap_or("runyard-scaler"),
            &common(&[
                (
                    "RUNYARD_SCALER_HTTP_LISTEN",
                    format!("127.0.0.1:{scaler_port}"),
                ),
                ("RUNYARD_SCALER_CONFIG", config.display().to_string()),
                ("RUNYARD_ALLOCATOR_URL", format!("http://127.0.0.1:{grpc}")),
                ("RUNYARD_GITLAB_API_URL", gitlab.url()),
                ("RUNYARD_GITLAB_TOKEN", "gl-api-token".into()),
                ("RUNYARD_GITHUB_API_URL", github.url()),
                ("RUNYARD_GITHUB_TOKEN", "gh-api-token".into()),
            ]),
            &dir.path().join("scaler.log"),
        ));
        ready(&http, format!("http://127.0.0.1:{alloc_http}/readyz")).await;
        ready(&http, format!("http://127.0.0.1:{ingest_port}/readyz")).await;
        ready(&http, format!("http://127.0.0.1:{scaler_port}/readyz")).await;
        let bus = runyard_bus::Bus::connect(&nats.url(), ns.clone(), "retry-test", false)
            .await
            .expect("bus");
        Self {
            nats,
            ns,
            db,
            gitlab,
            github,
            actions,
            ingest: format!("http://127.0.0.1:{ingest_port}"),
            allocator: format!("http://127.0.0.1:{grpc}"),
            scaler: format!("http://127.0.0.1:{scaler_port}"),
            bus,
            markers: std::sync::atomic::AtomicU64::new(1),
            procs,
            _dir: dir,
            http,
        }
    }

    /// A service's log so far (for failure messages).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self._dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    async fn post(&self, path: &str, headers: &[(&str, String)], body: &Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.ingest))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).expect("json"));
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let r = req.send().await.expect("posting to ingest");
        let status = r.status();
        assert!(
            status.is_success(),
            "{path}: {status} {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// A GitLab Pipeline Hook: pipeline `pipeline_id` of project 34 on
    /// `develop` ended `status`, with one build `job_id` (`job_status`,
    /// `failure_reason`).
    pub async fn gitlab_pipeline(
        &self,
        pipeline_id: u64,
        status: &str,
        builds: &[(u64, &str, Option<&str>)],
    ) {
        self.gitlab_pipeline_of(pipeline_id, None, status, builds)
            .await;
    }

    /// A Pipeline Hook of child pipeline `pipeline_id`, triggered by
    /// `parent`, as GitLab sends it (`source: parent_pipeline` and the
    /// parent in `source_pipeline`).
    pub async fn gitlab_child_pipeline(
        &self,
        pipeline_id: u64,
        parent: u64,
        status: &str,
        builds: &[(u64, &str, Option<&str>)],
    ) {
        self.gitlab_pipeline_of(pipeline_id, Some(parent), status, builds)
            .await;
    }

    async fn gitlab_pipeline_of(
        &self,
        pipeline_id: u64,
        parent: Option<u64>,
        status: &str,
        builds: &[(u64, &str, Option<&str>)],
    ) {
        let mut hook: Value =
            serde_json::from_str(&runyard_testkit::fixture("gitlab_pipeline_failed.json"))
                .expect("fixture");
        hook["object_attributes"]["id"] = json!(pipeline_id);
        hook["object_attributes"]["status"] = json!(status);
        hook["object_attributes"]["detailed_status"] = json!(status);
        hook["project"]["id"] = json!(34);
        if let Some(parent) = parent {
            hook["object_attributes"]["source"] = json!("parent_pipeline");
            hook["source_pipeline"] = json!({
                "project": {"id": 34, "web_url": "https://gitlab.example.com/ci/spack-packages",
                            "path_with_namespace": "ci/spack-packages"},
                "job_id": parent * 10,
                "pipeline_id": parent
            });
        }
        let template = hook["builds"][1].clone();
        hook["builds"] = Value::Array(
            builds
                .iter()
                .map(|(id, status, reason)| {
                    let mut b = template.clone();
                    b["id"] = json!(id);
                    b["name"] = json!("build py-torch");
                    b["status"] = json!(status);
                    b["failure_reason"] = json!(reason);
                    b
                })
                .collect(),
        );
        let uuid = format!("pipeline-{pipeline_id}-{status}");
        self.post(
            "/webhooks/gitlab",
            &[
                ("x-gitlab-token", GITLAB_TOKEN.into()),
                ("x-gitlab-event", "Pipeline Hook".into()),
                ("x-gitlab-event-uuid", uuid),
            ],
            &hook,
        )
        .await;
    }

    /// A GitHub `workflow_job` webhook.
    pub async fn github_job(&self, job: &Value, action: &str, delivery: &str) {
        self.github_job_with(job, action, delivery, &[]).await;
    }

    /// [`Stack::github_job`] with `extra` request headers.
    pub async fn github_job_with(
        &self,
        job: &Value,
        action: &str,
        delivery: &str,
        extra: &[(&str, String)],
    ) {
        let mut hook: Value = serde_json::from_str(&runyard_testkit::fixture(
            "github_workflow_job_completed.json",
        ))
        .expect("fixture");
        hook["action"] = json!(action);
        hook["repository"]["full_name"] = json!("acme/app");
        hook["repository"]["name"] = json!("app");
        hook["organization"]["login"] = json!("acme");
        for (k, v) in job.as_object().expect("object") {
            hook["workflow_job"][k] = v.clone();
        }
        let body = serde_json::to_vec(&hook).expect("json");
        self.post(
            "/webhooks/github",
            &[
                (
                    "x-hub-signature-256",
                    runyard_testkit::github_signature(GITHUB_SECRET, &body),
                ),
                ("x-github-event", "workflow_job".into()),
                ("x-github-delivery", delivery.into()),
            ]
            .into_iter()
            .chain(extra.iter().cloned())
            .collect::<Vec<_>>(),
            &hook,
        )
        .await;
    }

    /// `POST /v1/usage`.
    pub async fn usage(&self, report: &Value) {
        self.post(
            "/v1/usage",
            &[("authorization", format!("Bearer {USAGE_TOKEN}"))],
            report,
        )
        .await;
    }

    /// The allocator's recommendation for `workload` on `git_ref`.
    pub async fn recommend(
        &self,
        workload: &BTreeMap<String, String>,
        git_ref: &str,
    ) -> runyard_allocator::proto::Recommendation {
        self.recommend_retry(workload, git_ref, None).await
    }

    /// [`Stack::recommend`] for a job that says which attempt it retries.
    pub async fn recommend_retry(
        &self,
        workload: &BTreeMap<String, String>,
        git_ref: &str,
        retry_of: Option<runyard_allocator::proto::JobAttempt>,
    ) -> runyard_allocator::proto::Recommendation {
        let mut client = AllocatorClient::connect(self.allocator.clone())
            .await
            .expect("allocator");
        client
            .recommend(RecommendRequest {
                workload: workload.clone().into_iter().collect(),
                r#ref: git_ref.into(),
                retry_of,
                preview: false,
            })
            .await
            .expect("recommend")
            .into_inner()
    }

    /// Waits until the scaler's OOM retrier has acted on everything logged
    /// so far and has nothing left to do ([`support::settled`]).
    pub async fn settled(&self) {
        let pools = async || -> Value {
            self.http
                .get(format!("{}/v1/pools", self.scaler))
                .send()
                .await
                .expect("GET /v1/pools")
                .json()
                .await
                .expect("json")
        };
        let publish = async || support::publish_marker(&self.bus, &self.markers).await;
        support::settled("retrier", pools, publish).await;
    }

    /// Retry events on the log, in order.
    pub async fn retry_events(&self) -> Vec<Event> {
        let client = async_nats::connect(self.nats.url()).await.expect("nats");
        let msgs = runyard_testkit::stream_messages(&client, &self.ns.events_stream()).await;
        // One per id: an id is one decision (the log dedups by it).
        let mut seen = std::collections::HashSet::new();
        runyard_testkit::decode_events(&msgs)
            .into_iter()
            .filter(|e| {
                matches!(
                    e.body,
                    Some(Body::RetryRequested(_) | Body::RetryIssued(_) | Body::RetryRefused(_))
                )
            })
            .filter(|e| seen.insert(e.id.clone()))
            .collect()
    }

    /// `(job id, run attempt, flavor)` of every runner requested for a job.
    pub async fn runner_requests(&self) -> Vec<(u64, u32, String)> {
        let client = async_nats::connect(self.nats.url()).await.expect("nats");
        let msgs = runyard_testkit::stream_messages(&client, &self.ns.events_stream()).await;
        runyard_testkit::decode_events(&msgs)
            .into_iter()
            .filter_map(|e| match e.body {
                Some(Body::RunnerRequested(r)) => Some((
                    r.job.as_ref().map_or(0, |k| k.job_id),
                    r.run_attempt,
                    r.flavor,
                )),
                _ => None,
            })
            .collect()
    }

    /// Stops the processes and drops the database.
    pub async fn stop(mut self) {
        self.procs.clear();
        self.db.drop_db().await;
    }
}

/// The kind of a retry event (`requested`, `issued`, `refused:<reason>`).
pub fn kind(e: &Event) -> String {
    match &e.body {
        Some(Body::RetryRequested(_)) => "requested".into(),
        Some(Body::RetryIssued(_)) => "issued".into(),
        Some(Body::RetryRefused(r)) => format!("refused:{}", r.reason),
        _ => "other".into(),
    }
}
