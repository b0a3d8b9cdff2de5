//! Drives `post` and the real `runyard-report` binary against a fake ingest
//! (axum on 127.0.0.1:0) that records every request and answers from a
//! script.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post as post_route;
use runyard_report::{
    CgroupUsage, CgroupVersion, Error, Forge, ReportInputs, RetryPolicy, build_report, http_client,
    post, usage_url,
};
use secrecy::SecretString;
use serde_json::{Value, json};

const TOKEN: &str = "s3cret-usage-token";
/// What the fake GitHub hands out as the job's identity token.
const ID_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJjaGVja19ydW5faWQiOiI0NzExIn0.c2lnbmF0dXJl";
/// The bearer of the identity token request.
const REQUEST_TOKEN: &str = "actions-request-token";
const EVENT_ID: &str = "usage:gitlab:gitlab.example.com:4711:1";
/// The flags naming the job [`EVENT_ID`] reports for.
const GITLAB_JOB: [&str; 6] = [
    "--forge",
    "gitlab",
    "--instance",
    "gitlab.example.com",
    "--job-id",
    "4711",
];

/// One scripted answer.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    retry_after: Option<&'static str>,
    body: String,
}

impl Reply {
    fn accepted() -> Self {
        Reply {
            status: 202,
            retry_after: None,
            body: json!({"event_id": EVENT_ID, "duplicate": false}).to_string(),
        }
    }

    fn unavailable(retry_after: &'static str) -> Self {
        Reply {
            status: 503,
            retry_after: Some(retry_after),
            body: json!({"error": "event log unavailable"}).to_string(),
        }
    }

    fn bad_request() -> Self {
        Reply {
            status: 400,
            retry_after: None,
            body: json!({"error": "missing field `job_id`"}).to_string(),
        }
    }
}

/// What the fake saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    authorization: Option<String>,
    content_type: Option<String>,
    body: Value,
}

#[derive(Debug)]
struct Shared {
    script: Vec<Reply>,
    seen: Mutex<Vec<Seen>>,
    /// Identity token requests: their Authorization and query.
    id_requests: Mutex<Vec<(Option<String>, String)>>,
}

#[derive(Debug)]
struct FakeIngest {
    base_url: String,
    shared: Arc<Shared>,
}

impl FakeIngest {
    /// Starts the fake; the n-th request gets `script[n]`, later ones the
    /// last entry. A wrong bearer token gets 401 like the real ingest.
    async fn start(script: Vec<Reply>) -> Self {
        Self::start_on(script, None).await
    }

    /// [`FakeIngest::start`] serving https with `cert` and `key` (PEM files).
    async fn start_tls(script: Vec<Reply>, cert: &std::path::Path, key: &std::path::Path) -> Self {
        let tls = runyard_tls::ServerTls::http_acceptor("INGEST", Some(cert), Some(key), None)
            .expect("tls files");
        Self::start_on(script, tls).await
    }

    async fn start_on(script: Vec<Reply>, tls: Option<runyard_tls::Acceptor>) -> Self {
        let shared = Arc::new(Shared {
            script,
            seen: Mutex::new(Vec::new()),
            id_requests: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .route("/v1/usage", post_route(usage))
            .route("/id-token", axum::routing::get(id_token))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake ingest");
        let addr = listener.local_addr().expect("local addr");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = runyard_tls::Listener::new(listener, tls);
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeIngest {
            base_url: format!("{scheme}://{addr}"),
            shared,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn usage(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let seen = Seen {
        authorization: text(header::AUTHORIZATION),
        content_type: text(header::CONTENT_TYPE),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let bearer_ok = [TOKEN, ID_TOKEN]
        .iter()
        .any(|t| seen.authorization.as_deref() == Some(&format!("Bearer {t}")));
    let n = {
        let mut all = shared.seen.lock().unwrap_or_else(PoisonError::into_inner);
        all.push(seen);
        all.len() - 1
    };
    if !bearer_ok {
        return (StatusCode::UNAUTHORIZED, r#"{"error":"unauthorized"}"#).into_response();
    }
    let reply = &shared.script[n.min(shared.script.len() - 1)];
    let mut response = (
        StatusCode::from_u16(reply.status).expect("scripted status"),
        reply.body.clone(),
    )
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(after) = reply.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(after));
    }
    response
}

/// GitHub's `ACTIONS_ID_TOKEN_REQUEST_URL`: hands out [`ID_TOKEN`] to the
/// bearer of [`REQUEST_TOKEN`].
async fn id_token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let ok = authorization.as_deref() == Some(&format!("Bearer {REQUEST_TOKEN}"));
    shared
        .id_requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((authorization, uri.query().unwrap_or_default().to_owned()));
    if !ok {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(json!({"count": 1, "value": ID_TOKEN})).into_response()
}

/// The body has the contract's shape: required identity, known keys only,
/// numbers where numbers belong.
fn assert_usage_shape(body: &Value) {
    let object = body.as_object().expect("usage body is a JSON object");
    let known = [
        "forge",
        "instance",
        "job_id",
        "attempt",
        "ref",
        "project",
        "workload",
        "peak_memory_bytes",
        "memory_request_bytes",
        "memory_limit_bytes",
        "cpu_seconds",
        "wall_seconds",
        "cpu_request_millicores",
        "oom_killed",
        "exit_code",
        "cgroup",
    ];
    for key in object.keys() {
        assert!(known.contains(&key.as_str()), "unexpected key {key}");
    }
    assert!(matches!(body["forge"].as_str(), Some("github" | "gitlab")));
    assert!(body["instance"].is_string());
    assert!(body["job_id"].is_u64());
    assert!(body["attempt"].is_u64());
    assert!(body["workload"].is_object());
    assert!(body["oom_killed"].is_boolean());
    assert!(
        body.get("cgroup")
            .is_none_or(|c| matches!(c.as_str(), Some("v1" | "v2"))),
        "cgroup is v1, v2 or absent"
    );
    for key in [
        "peak_memory_bytes",
        "memory_request_bytes",
        "memory_limit_bytes",
        "cpu_request_millicores",
    ] {
        assert!(body.get(key).is_none_or(Value::is_u64), "{key}");
    }
}

fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        total_timeout: Duration::from_secs(20),
        request_timeout: Duration::from_secs(5),
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        max_retries: 5,
        retry_after_cap: Duration::from_millis(10),
    }
}

fn sample_report() -> runyard_report::Report {
    let inputs = ReportInputs {
        forge: Some(Forge::Gitlab),
        instance: Some("gitlab.example.com".to_owned()),
        job_id: Some("4711".to_owned()),
        workload: vec!["package=zlib,version=1.3.1".to_owned()],
        exit_code: Some("0".to_owned()),
        ..ReportInputs::default()
    };
    let cgroup = CgroupUsage {
        version: Some(CgroupVersion::V2),
        peak_memory_bytes: Some(1_000_000),
        memory_limit_bytes: Some(2_000_000),
        oom_kills: Some(0),
        cpu_usage_usec: Some(1_500_000),
    };
    build_report(&inputs, &cgroup, |_| None, time::OffsetDateTime::now_utc())
        .expect("sample report")
}

async fn post_sample(
    fake_url: &str,
    token: &str,
    policy: &RetryPolicy,
) -> Result<runyard_report::IngestAnswer, Error> {
    let client = http_client(policy, None).expect("client");
    let url = usage_url(fake_url).expect("url");
    post(
        &client,
        &url,
        &SecretString::from(token),
        &sample_report(),
        policy,
    )
    .await
}

#[tokio::test]
async fn post_retries_503_then_succeeds() {
    let fake = FakeIngest::start(vec![
        Reply::unavailable("1"),
        Reply::unavailable("1"),
        Reply::accepted(),
    ])
    .await;
    let answer = post_sample(&fake.base_url, TOKEN, &fast_policy())
        .await
        .expect("accepted after retries");
    assert_eq!(answer.event_id.as_deref(), Some(EVENT_ID));
    assert!(!answer.duplicate);

    let seen = fake.seen();
    assert_eq!(seen.len(), 3);
    for request in &seen {
        assert_eq!(
            request.authorization.as_deref(),
            Some(&*format!("Bearer {TOKEN}"))
        );
        assert_eq!(request.content_type.as_deref(), Some("application/json"));
        assert_usage_shape(&request.body);
        // Every retry sends the same report.
        assert_eq!(request.body, seen[0].body);
    }
    assert_eq!(
        seen[0].body["workload"],
        json!({"package": "zlib", "version": "1.3.1"})
    );
    assert_eq!(seen[0].body["cpu_seconds"], json!(1.5));
}

#[tokio::test]
async fn post_does_not_retry_400() {
    let fake = FakeIngest::start(vec![Reply::bad_request(), Reply::accepted()]).await;
    let err = post_sample(&fake.base_url, TOKEN, &fast_policy())
        .await
        .expect_err("400 is final");
    match &err {
        Error::Rejected { status, body } => {
            assert_eq!(*status, 400);
            assert!(body.contains("job_id"), "{body}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert_eq!(fake.seen().len(), 1);
}

#[tokio::test]
async fn wrong_token_is_final() {
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let err = post_sample(&fake.base_url, "wrong", &fast_policy())
        .await
        .expect_err("401 is final");
    assert!(
        matches!(err, Error::Rejected { status: 401, .. }),
        "{err:?}"
    );
    assert_eq!(fake.seen().len(), 1);
}

#[tokio::test]
async fn post_gives_up_after_max_retries() {
    let fake = FakeIngest::start(vec![Reply::unavailable("0")]).await;
    let policy = RetryPolicy {
        max_retries: 2,
        ..fast_policy()
    };
    let err = post_sample(&fake.base_url, TOKEN, &policy)
        .await
        .expect_err("always 503");
    assert!(
        matches!(
            err,
            Error::Unavailable {
                status: 503,
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(fake.seen().len(), 3);
}

#[tokio::test]
async fn retry_after_is_honoured_within_the_deadline() {
    // Retry-After: 1 (s) under a 30 s cap, and a 300 ms deadline: the
    // reporter waits for the server rather than hammering it with its 5 ms
    // back-off, so the deadline passes after exactly one attempt.
    let fake = FakeIngest::start(vec![Reply::unavailable("1")]).await;
    let policy = RetryPolicy {
        total_timeout: Duration::from_millis(300),
        retry_after_cap: Duration::from_secs(30),
        ..fast_policy()
    };
    let err = post_sample(&fake.base_url, TOKEN, &policy)
        .await
        .expect_err("deadline");
    match &err {
        Error::Deadline { attempts, last, .. } => {
            assert_eq!(*attempts, 1);
            assert!(last.contains("503"), "{last}");
        }
        other => panic!("expected Deadline, got {other:?}"),
    }
    assert_eq!(fake.seen().len(), 1);
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    // A port that was just free: nothing listens there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let policy = RetryPolicy {
        max_retries: 2,
        ..fast_policy()
    };
    let err = post_sample(&format!("http://{addr}"), TOKEN, &policy)
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(err, Error::Transport { attempts: 3, .. }),
        "{err:?}"
    );
}

/// A fake cgroup v2 directory holding the contract's example numbers.
fn fake_cgroup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, contents) in [
        ("memory.peak", "9123456789\n"),
        ("memory.max", "12000000000\n"),
        (
            "memory.events",
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
        ),
        (
            "cpu.stat",
            "usage_usec 5400500000\nuser_usec 5000000000\nsystem_usec 400500000\n",
        ),
    ] {
        std::fs::write(dir.path().join(name), contents).expect("write cgroup file");
    }
    dir
}

/// The real binary with a clean environment (so the CI it runs under can't
/// leak in) plus `env`.
fn binary(env: &[(&str, &str)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard-report"));
    command.env_clear().env("RUST_LOG", "info");
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

#[tokio::test]
async fn binary_posts_cgroup_usage() {
    let fake = FakeIngest::start(vec![Reply::unavailable("1"), Reply::accepted()]).await;
    let cgroup = fake_cgroup();
    let token_file = cgroup.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write token");
    let token_path = token_file.to_str().expect("utf-8 path");

    let output = binary(&[
        ("RUNYARD_USAGE_TOKEN_FILE", token_path),
        ("KUBERNETES_MEMORY_REQUEST", "8000M"),
        ("RUNYARD_JOB_EXIT_CODE", "0"),
    ])
    .args([
        "--cgroup-dir",
        cgroup.path().to_str().expect("utf-8 path"),
        "--url",
        &fake.base_url,
    ])
    .args(GITLAB_JOB)
    .args([
        "--ref",
        "develop",
        "--workload",
        "package=py-torch,version=2.3.1",
        "--workload",
        "compiler=gcc,compiler_version=12.3.0,variants=+cuda~rocm",
        "--cpu-request",
        "8",
        "--wall-seconds",
        "900.2",
        "--retry-min-delay",
        "10ms",
        "--retry-after-cap",
        "10ms",
        "--fail-on-error",
    ])
    .output()
    .await
    .expect("run runyard-report");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}: {stderr}",
        output.status
    );
    assert!(stderr.contains(EVENT_ID), "event id logged: {stderr}");
    assert!(!stderr.contains(TOKEN), "token leaked: {stderr}");
    assert!(output.stdout.is_empty());

    let seen = fake.seen();
    assert_eq!(seen.len(), 2, "one 503, one retry");
    let body = &seen[1].body;
    assert_usage_shape(body);
    assert_eq!(
        *body,
        json!({
            "forge": "gitlab", "instance": "gitlab.example.com", "job_id": 4711,
            "attempt": 1, "ref": "develop",
            "workload": {"package": "py-torch", "version": "2.3.1", "compiler": "gcc",
                         "compiler_version": "12.3.0", "variants": "+cuda~rocm"},
            "peak_memory_bytes": 9123456789u64, "memory_request_bytes": 8000000000u64,
            "memory_limit_bytes": 12000000000u64, "cpu_seconds": 5400.5,
            "wall_seconds": 900.2, "cpu_request_millicores": 8000,
            "oom_killed": false, "exit_code": 0, "cgroup": "v2"
        })
    );
    let bytes = serde_json::to_vec(body).expect("json");
    runyard_forge::normalize_usage(
        Some("application/json"),
        &bytes,
        time::OffsetDateTime::now_utc(),
    )
    .expect("ingest's normalizer accepts the posted body");
}

/// `runyard-report` for a GitLab job with a fixed peak, posting to `url`
/// with `env`.
async fn post_with(url: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut all = vec![("RUNYARD_USAGE_TOKEN", TOKEN)];
    all.extend_from_slice(env);
    binary(&all)
        .args(GITLAB_JOB)
        .args([
            "--url",
            url,
            "--peak-memory-bytes",
            "1000000",
            "--max-retries",
            "0",
            "--fail-on-error",
        ])
        .output()
        .await
        .expect("run runyard-report")
}

#[tokio::test]
async fn an_ingest_with_a_private_ca_is_trusted_through_the_ca_file() {
    let pki = runyard_testkit::pki::TestPki::new();
    let fake =
        FakeIngest::start_tls(vec![Reply::accepted()], &pki.server.cert, &pki.server.key).await;
    assert!(fake.base_url.starts_with("https://"));
    let ca = pki.ca_file.to_str().expect("utf-8 path");

    // Without the CA the certificate is unknown: nothing reaches ingest.
    let output = post_with(&fake.base_url, &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");
    assert!(fake.seen().is_empty());

    let output = post_with(&fake.base_url, &[("RUNYARD_INGEST_CA_FILE", ca)]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(EVENT_ID), "{stderr}");
    assert_eq!(fake.seen().len(), 1);

    // A file that is not a certificate bundle, or none at all, is named
    // with its variable, and nothing is posted.
    let junk = pki.dir().join("junk.pem");
    std::fs::write(&junk, "not a certificate").expect("write junk");
    for (path, reason) in [
        (junk.to_str().expect("utf-8"), "holds no certificate"),
        ("/nonexistent/ca.pem", "No such file"),
    ] {
        let output = post_with(&fake.base_url, &[("RUNYARD_INGEST_CA_FILE", path)]).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("RUNYARD_INGEST_CA_FILE {path}")) && stderr.contains(reason),
            "{stderr}"
        );
    }
    assert_eq!(fake.seen().len(), 1);
}

#[tokio::test]
async fn binary_dry_run_prints_and_posts_nothing() {
    let cgroup = fake_cgroup();
    std::fs::write(cgroup.path().join("memory.events"), "oom 2\noom_kill 2\n")
        .expect("write memory.events");
    let output = binary(&[
        ("GITLAB_CI", "true"),
        ("CI_SERVER_URL", "https://gitlab.example.com"),
        ("CI_JOB_ID", "4711"),
        ("CI_PROJECT_PATH", "spack/spack"),
        ("CI_JOB_NAME", "build zlib"),
        ("CI_COMMIT_REF_NAME", "develop"),
    ])
    .args([
        "--cgroup-dir",
        cgroup.path().to_str().expect("utf-8 path"),
        "--dry-run",
    ])
    .output()
    .await
    .expect("run runyard-report");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let body: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_usage_shape(&body);
    assert_eq!(body["job_id"], 4711);
    assert_eq!(body["project"], "spack/spack");
    assert_eq!(
        body["workload"],
        json!({"project": "spack/spack", "job": "build zlib"})
    );
    assert_eq!(
        body["oom_killed"], true,
        "cgroup oom_kill > 0 even without an exit code"
    );
    assert!(body.get("exit_code").is_none());
}

#[tokio::test]
async fn binary_exit_status_follows_fail_on_error() {
    let fake = FakeIngest::start(vec![Reply::bad_request()]).await;
    let cgroup = fake_cgroup();
    let run = |fail_on_error: bool| {
        let mut command = binary(&[("RUNYARD_USAGE_TOKEN", TOKEN)]);
        command.args([
            "--cgroup-dir",
            cgroup.path().to_str().expect("utf-8 path"),
            "--url",
            &fake.base_url,
            "--forge",
            "github",
            "--job-id",
            "51725241954",
        ]);
        if fail_on_error {
            command.arg("--fail-on-error");
        }
        command.output()
    };

    let lenient = run(false).await.expect("run runyard-report");
    let stderr = String::from_utf8_lossy(&lenient.stderr);
    assert!(
        lenient.status.success(),
        "default never fails the job: {stderr}"
    );
    assert!(
        stderr.contains("missing field"),
        "server's answer logged: {stderr}"
    );
    assert!(!stderr.contains(TOKEN), "token leaked: {stderr}");

    let strict = run(true).await.expect("run runyard-report");
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("400"), "{stderr}");

    // No retries on a 400, in either mode.
    assert_eq!(fake.seen().len(), 2);
}

#[tokio::test]
async fn binary_refuses_to_post_without_a_peak() {
    // Ingest requires peak_memory_bytes; rather than send 0 (which would
    // teach the allocator the job needs nothing) the reporter stops early.
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let cgroup = fake_cgroup();
    std::fs::remove_file(cgroup.path().join("memory.peak")).expect("remove memory.peak");
    let output = binary(&[("RUNYARD_USAGE_TOKEN", TOKEN)])
        .args([
            "--cgroup-dir",
            cgroup.path().to_str().expect("utf-8 path"),
            "--url",
            &fake.base_url,
            "--fail-on-error",
        ])
        .args(GITLAB_JOB)
        .output()
        .await
        .expect("run runyard-report");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("peak_memory_bytes"), "{stderr}");
    assert!(fake.seen().is_empty());
}

#[test]
fn report_is_what_ingest_accepts() {
    // The same normalizer ingest runs on `POST /v1/usage`.
    let report = sample_report();
    let body = serde_json::to_vec(&report).expect("json");
    let event = runyard_forge::normalize_usage(
        Some("application/json"),
        &body,
        time::OffsetDateTime::now_utc(),
    )
    .expect("ingest accepts the report");
    assert_eq!(event.id, "usage:gitlab:gitlab.example.com:4711:1");
    let Some(runyard_events::Body::UsageReported(usage)) = event.body else {
        panic!("not a UsageReported: {:?}", event.body);
    };
    assert_eq!(usage.peak_memory_bytes, 1_000_000);
    assert_eq!(usage.memory_limit_bytes, Some(2_000_000));
    assert_eq!(usage.memory_request_bytes, None);
    assert_eq!(usage.cpu_seconds, 1.5);
    assert_eq!(usage.exit_code, Some(0));
    assert_eq!(
        usage.workload.get("package").map(String::as_str),
        Some("zlib")
    );
}

// ---- `runyard-report run -- CMD` -------------------------------------------

const MIB: u64 = 1 << 20;

/// Whether `run` can give a command a cgroup of its own here (it needs a
/// writable cgroup v1 memory hierarchy, or a cgroup v2 group that hands the
/// memory controller down): probes by making and removing a child group the
/// way `run` does. The error says why not.
fn child_cgroup_possible() -> Result<runyard_report::CgroupVersion, String> {
    let own = runyard_report::own_cgroup().ok_or("no cgroup found for this process")?;
    let name = format!("runyard-probe-{}", std::process::id());
    let group = runyard_report::create_child_group(&own, &name, Some(64 * MIB))
        .map_err(|e| runyard_report::error_chain(&e))?;
    group
        .remove()
        .map_err(|e| runyard_report::error_chain(&e))?;
    Ok(own.version)
}

/// `runyard-report run [flags] -- command` against `fake`, with JSON logs so
/// the test can see which cgroup was read.
async fn run_binary(fake: &FakeIngest, flags: &[&str], command: &[&str]) -> std::process::Output {
    binary(&[
        ("RUNYARD_USAGE_TOKEN", TOKEN),
        ("RUNYARD_LOG_FORMAT", "json"),
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ])
    .arg("run")
    .args(["--url", &fake.base_url, "--retry-min-delay", "10ms"])
    .args(GITLAB_JOB)
    .args(flags)
    .arg("--")
    .args(command)
    .output()
    .await
    .expect("run runyard-report")
}

/// The directory `runyard-report` logged as read ("read cgroup").
fn cgroup_read(stderr: &str) -> Option<std::path::PathBuf> {
    stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|log| log["message"] == "read cgroup")
        .and_then(|log| log["dir"].as_str().map(std::path::PathBuf::from))
}

/// The command's group was read and is gone again (removed if the binary
/// left it, so a failing test leaves nothing behind).
fn assert_group_removed(stderr: &str) {
    let dir = cgroup_read(stderr).expect("the binary logs the cgroup it read");
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert!(
        name.starts_with("runyard-"),
        "read its own group, not {dir:?}"
    );
    let left = dir.exists();
    if left {
        let _ = std::fs::remove_dir(&dir);
    }
    assert!(!left, "{dir:?} was not removed");
}

fn accepted_by_ingest(body: &Value) {
    assert_usage_shape(body);
    let bytes = serde_json::to_vec(body).expect("json");
    runyard_forge::normalize_usage(
        Some("application/json"),
        &bytes,
        time::OffsetDateTime::now_utc(),
    )
    .expect("ingest's normalizer accepts the posted body");
}

#[tokio::test]
async fn run_oom_kill_under_memory_limit_is_reported() {
    let version = match child_cgroup_possible() {
        Ok(version) => version,
        Err(reason) => {
            eprintln!("skipped: `run` cannot make a child cgroup here ({reason})");
            return;
        }
    };
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    // 200 MiB of bytes actually written, under a 64 MiB limit.
    let output = run_binary(
        &fake,
        &["--memory-limit", "64Mi"],
        &["python3", "-c", "b = b'x' * (200 << 20); print(len(b))"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(137),
        "runyard-report exits as the OOM-killed command did: {stderr}"
    );
    assert!(output.stdout.is_empty(), "killed before printing: {stderr}");
    assert_group_removed(&stderr);

    let seen = fake.seen();
    assert_eq!(seen.len(), 1, "one report posted: {stderr}");
    let body = &seen[0].body;
    accepted_by_ingest(body);
    eprintln!("posted: {body}");
    assert_eq!(body["oom_killed"], true, "{body}");
    assert_eq!(body["exit_code"], 137, "{body}");
    assert_eq!(body["cgroup"], json!(version), "{body}");
    assert_eq!(body["memory_limit_bytes"], 64 * MIB, "{body}");
    let peak = body["peak_memory_bytes"].as_u64().expect("peak");
    assert!(
        peak * 100 >= 64 * MIB * 95 && peak <= 64 * MIB,
        "peak {peak} at the 64 MiB limit"
    );
}

#[tokio::test]
async fn run_normal_command_reports_no_oom() {
    let possible = child_cgroup_possible();
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let output = run_binary(
        &fake,
        &["--memory-limit", "256Mi"],
        &["python3", "-c", "b = b'x' * (8 << 20); print(len(b))"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "8388608",
        "the command's own output passes through"
    );
    let version = match possible {
        Ok(version) => version,
        Err(reason) => {
            eprintln!("report not checked: `run` cannot make a child cgroup here ({reason})");
            assert!(stderr.contains("no cgroup of its own"), "{stderr}");
            return;
        }
    };
    assert_group_removed(&stderr);
    let seen = fake.seen();
    assert_eq!(seen.len(), 1, "one report posted: {stderr}");
    let body = &seen[0].body;
    accepted_by_ingest(body);
    assert_eq!(body["oom_killed"], false, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["cgroup"], json!(version), "{body}");
    assert_eq!(body["memory_limit_bytes"], 256 * MIB, "{body}");
    let peak = body["peak_memory_bytes"].as_u64().expect("peak");
    assert!(
        (8 * MIB..256 * MIB).contains(&peak),
        "peak {peak} covers the 8 MiB written"
    );
    assert!(
        body["wall_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{body}"
    );
}

#[tokio::test]
async fn run_exits_with_the_commands_exit_code() {
    let possible = child_cgroup_possible();
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let output = run_binary(&fake, &["--fail-on-error"], &["sh", "-c", "exit 3"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    if let Err(reason) = possible {
        eprintln!("report not checked: `run` cannot make a child cgroup here ({reason})");
        return;
    }
    assert_group_removed(&stderr);
    let seen = fake.seen();
    assert_eq!(seen.len(), 1, "one report posted: {stderr}");
    accepted_by_ingest(&seen[0].body);
    assert_eq!(seen[0].body["exit_code"], 3);
    assert_eq!(seen[0].body["oom_killed"], false);
}

#[tokio::test]
async fn run_reports_a_command_that_is_not_found_as_127() {
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let output = run_binary(&fake, &[], &["runyard-no-such-command"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(127), "{stderr}");
    assert!(stderr.contains("runyard-no-such-command"), "{stderr}");
}

#[tokio::test]
async fn run_rejects_cgroup_dir() {
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let output = run_binary(&fake, &["--cgroup-dir", "/tmp"], &["true"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--cgroup-dir"), "{stderr}");
    assert!(fake.seen().is_empty());
}

/// The binary with a GitHub job's environment and `extra`, posting a
/// report with a given peak to `fake`.
async fn github_binary(fake: &FakeIngest, extra: &[(&str, &str)]) -> std::process::Output {
    let mut env = vec![
        ("GITHUB_ACTIONS", "true"),
        ("GITHUB_SERVER_URL", "https://github.com"),
        ("GITHUB_RUN_ATTEMPT", "1"),
        ("GITHUB_REF_NAME", "main"),
        ("GITHUB_REPOSITORY", "acme/app"),
        ("GITHUB_WORKFLOW", "CI"),
        ("GITHUB_JOB", "test"),
        ("RUNYARD_JOB_ID", "4711"),
    ];
    env.extend_from_slice(extra);
    binary(&env)
        .args([
            "--url",
            &fake.base_url,
            "--peak-memory-bytes",
            "1000000",
            "--fail-on-error",
        ])
        .output()
        .await
        .expect("run runyard-report")
}

#[tokio::test]
async fn on_github_the_binary_requests_the_jobs_identity_token_and_sends_it() {
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let request_url = format!("{}/id-token?api-version=2.0", fake.base_url);
    let output = github_binary(
        &fake,
        &[
            ("ACTIONS_ID_TOKEN_REQUEST_URL", request_url.as_str()),
            ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", REQUEST_TOKEN),
            // A shared token is there too: the identity token wins.
            ("RUNYARD_USAGE_TOKEN", TOKEN),
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for secret in [ID_TOKEN, REQUEST_TOKEN, TOKEN] {
        assert!(!stderr.contains(secret), "a token was logged: {stderr}");
    }
    let requests = fake
        .shared
        .id_requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(
        requests,
        [(
            Some(format!("Bearer {REQUEST_TOKEN}")),
            "api-version=2.0&audience=runyard".to_owned()
        )]
    );
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {ID_TOKEN}").as_str()),
        "the report carries the job's identity token"
    );
    assert_eq!(seen[0].body["job_id"], 4711);

    // Another audience, as RUNYARD_USAGE_OIDC names it.
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let request_url = format!("{}/id-token?api-version=2.0", fake.base_url);
    let output = github_binary(
        &fake,
        &[
            ("ACTIONS_ID_TOKEN_REQUEST_URL", request_url.as_str()),
            ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", REQUEST_TOKEN),
            (
                "RUNYARD_ID_TOKEN_AUDIENCE",
                "https://ci.example.com/runyard",
            ),
        ],
    )
    .await;
    assert!(output.status.success());
    let requests = fake
        .shared
        .id_requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(
        requests[0].1,
        "api-version=2.0&audience=https%3A%2F%2Fci.example.com%2Frunyard"
    );
}

#[tokio::test]
async fn a_given_identity_token_is_sent_as_is_and_a_refused_request_says_why() {
    // RUNYARD_ID_TOKEN (GitLab's id_tokens variable): nothing is requested.
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let request_url = format!("{}/id-token", fake.base_url);
    let output = github_binary(
        &fake,
        &[
            ("RUNYARD_ID_TOKEN", ID_TOKEN),
            ("ACTIONS_ID_TOKEN_REQUEST_URL", request_url.as_str()),
            ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", REQUEST_TOKEN),
        ],
    )
    .await;
    assert!(output.status.success());
    assert_eq!(
        fake.seen()[0].authorization.as_deref(),
        Some(format!("Bearer {ID_TOKEN}").as_str())
    );
    assert!(
        fake.shared
            .id_requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    );

    // GitHub refuses the request (no `id-token: write`) and there is no
    // shared token: the error says so, without any token in it.
    let fake = FakeIngest::start(vec![Reply::accepted()]).await;
    let request_url = format!("{}/id-token", fake.base_url);
    let output = github_binary(
        &fake,
        &[
            ("ACTIONS_ID_TOKEN_REQUEST_URL", request_url.as_str()),
            ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "not-the-request-token"),
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("id-token: write"), "{stderr}");
    assert!(!stderr.contains("not-the-request-token"), "{stderr}");
    assert!(fake.seen().is_empty(), "nothing posted");
}
