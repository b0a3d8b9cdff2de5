//! The stack on a nats-server running the shipped accounts and permissions
//! (`deploy/nats-auth.conf`, what docker-compose.yml and the Kubernetes
//! manifests run): every service logs in as its own user, does its job —
//! ingest's events are projected by the job-tracker, the scaler makes a
//! runner, claims the job and asks the allocator, which publishes the
//! allocation, the CLI reads it all — and each user is refused, with the
//! server's permissions violation, what the file does not give it: ingest
//! cannot read the instances' bucket or anyone's replies, the job-tracker
//! touches no bucket, only ingest and the scaler's reconciler publish
//! jobs, only ingest usage reports, and nobody gets in without a password.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream;
use runyard_events::Namespace;
use runyard_testkit::fake_github::FakeGitHub;
use runyard_testkit::nats_auth::{NAMESPACE, SecuredNats};
use runyard_testkit::{TestDb, eventually, github_signature, try_stream_messages};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);
// As `openssl rand -hex 32` makes them (runyard refuses weak secrets).
const GITHUB_SECRET: &str = "0b3c8f5e2a7d4196c0e8b1f3a5d7c9e2b4f6a8c0d2e4f6a8b0c2d4e6f8a0b2c4";
const USAGE_TOKEN: &str = "5d2e8a1c7f4b9036e2d8c4a6f0b2e4d6a8c0e2f4a6b8d0c2e4f6a8b0d2c4e6f8";
const ALLOCATOR_TOKEN: &str = "9a4c2e6f8b0d1e3f5a7c9b2d4e6f8a0c1e3f5b7d9a2c4e6f8b0d2e4f6a8c0e2d";
const INSTANCE_KEY: &str = "c7e1a3f5b9d2e4f6a8c0b2d4e6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4";
const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A pool the fixture's queued job matches; each runner a local process.
const SCALER_FILE: &str = r#"
[providers.local]
kind = "process"
command = ["/bin/sleep", "300"]

[[pools]]
name = "linux-x64"
forge = "github"
scope = { org = "octo-org" }
labels = ["self-hosted", "linux", "x64", "gpu"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }, { name = "large", memory = "16GiB", cpus = 8 }]
max_runners = 2
"#;

struct Stops(Vec<oneshot::Sender<()>>);

fn spawn_run<F>(stops: &mut Stops, run: impl FnOnce(oneshot::Receiver<()>) -> F)
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    stops.0.push(tx);
    tokio::spawn(run(rx));
}

/// Waits for the server's permissions violation naming `subject` (and
/// says what came instead).
async fn refused(errors: &mut UnboundedReceiver<String>, what: &str, subject: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline, errors.recv()).await;
        match next {
            Ok(Some(e)) => {
                let lower = e.to_lowercase();
                if lower.contains("permissions violation")
                    && lower.contains(what)
                    && e.contains(&format!("\"{subject}\""))
                {
                    return;
                }
                seen.push(e);
            }
            _ => panic!("no permissions violation for {what} {subject}; got {seen:?}"),
        }
    }
}

/// Publishes `subject` as this client and expects the server to refuse it.
async fn publish_refused(
    client: &async_nats::Client,
    errors: &mut UnboundedReceiver<String>,
    subject: &str,
) {
    client
        .publish(subject.to_owned(), "forged".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    refused(errors, "publish to", subject).await;
}

/// Subscribes to `subject` as this client and expects the server to refuse it.
async fn subscribe_refused(
    client: &async_nats::Client,
    errors: &mut UnboundedReceiver<String>,
    subject: &str,
) {
    let _sub = client.subscribe(subject.to_owned()).await.unwrap();
    client.flush().await.unwrap();
    refused(errors, "subscription to", subject).await;
}

/// Every message of `stream`, read as the CLI's user.
async fn read_as_cli(nats: &SecuredNats, stream: &str) -> Vec<jetstream::Message> {
    let (cli, _) = nats.client_as("cli").await;
    eventually(WAIT, || {
        let cli = cli.clone();
        async move { try_stream_messages(&cli, stream).await.ok() }
    })
    .await
    .unwrap_or_else(|| panic!("the cli user cannot read {stream}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_works_with_its_own_nats_user() {
    runyard_telemetry::install_crypto_provider();
    let nats = SecuredNats::start().await;
    let ns = Namespace::new(NAMESPACE).unwrap();
    let db = TestDb::new();
    let github = FakeGitHub::start().await;
    let mut stops = Stops(Vec::new());

    let ingest = runyard_ingest::App::build(runyard_ingest::Config {
        bus: runyard_config::Bus {
            nats_url: nats.url_as("ingest"),
            namespace: ns.to_string(),
        },
        ingest_listen: LOCAL,
        github_webhook_secret: Some(GITHUB_SECRET.to_owned().into()),
        usage_token: Some(USAGE_TOKEN.to_owned().into()),
        ..runyard_ingest::Config::default()
    })
    .await
    .unwrap();
    let ingest_addr = ingest.local_addr();
    spawn_run(&mut stops, |rx| {
        ingest.run(async move {
            let _ = rx.await;
        })
    });
    let tracker = runyard_job_tracker::App::build(runyard_job_tracker::Config {
        bus: runyard_config::Bus {
            nats_url: nats.url_as("job-tracker"),
            namespace: ns.to_string(),
        },
        database: runyard_config::Database {
            url: db.url.clone(),
        },
        tracker_http_listen: LOCAL,
        tracker_batch_wait: Duration::from_millis(5),
        ..runyard_job_tracker::Config::default()
    })
    .await
    .unwrap();
    let tracker_addr = tracker.local_addr();
    spawn_run(&mut stops, |rx| {
        tracker.run(async move {
            let _ = rx.await;
        })
    });
    let allocator = runyard_allocator::App::build(runyard_allocator::Config {
        bus: runyard_config::Bus {
            nats_url: nats.url_as("allocator"),
            namespace: ns.to_string(),
        },
        database: runyard_config::Database {
            url: db.url.clone(),
        },
        allocator_listen: LOCAL,
        allocator_http_listen: LOCAL,
        allocator_tokens: runyard_allocator::auth::tokens([ALLOCATOR_TOKEN]),
        ..runyard_allocator::Config::default()
    })
    .await
    .unwrap();
    let (grpc, alloc_http) = (allocator.grpc_addr(), allocator.http_addr());
    spawn_run(&mut stops, |rx| {
        allocator.run(async move {
            let _ = rx.await;
        })
    });
    let state = tempfile::tempdir().unwrap();
    let scaler_file = format!(
        "{SCALER_FILE}\n[scaler]\nstate_dir = {:?}\n",
        state.path().display().to_string()
    );
    let scaler = runyard_scaler::App::build(
        runyard_scaler::Config {
            bus: runyard_config::Bus {
                nats_url: nats.url_as("scaler"),
                namespace: ns.to_string(),
            },
            database: runyard_config::Database {
                url: db.url.clone(),
            },
            scaler_http_listen: LOCAL,
            scaler_metadata_listen: LOCAL,
            github_api_url: github.url(),
            github_token: Some("test-token".to_owned().into()),
            allocator_url: format!("http://{grpc}"),
            allocator_client_token: Some(ALLOCATOR_TOKEN.to_owned().into()),
            scaler_instance_token_key: Some(INSTANCE_KEY.to_owned().into()),
            ..runyard_scaler::Config::default()
        },
        Some(runyard_scaler::ScalerFile::parse(&scaler_file).unwrap()),
    )
    .await
    .unwrap();
    let scaler_addr = scaler.local_addr();
    spawn_run(&mut stops, |rx| {
        scaler.run(async move {
            let _ = rx.await;
        })
    });
    let http = reqwest::Client::new();
    for addr in [ingest_addr, tracker_addr, alloc_http, scaler_addr] {
        let url = format!("http://{addr}/readyz");
        let ready = eventually(WAIT, || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.get(&url).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        assert!(ready.is_some(), "{url} never became ready");
    }

    // ingest: a signed queued job and a usage report, each acked by
    // JetStream (202), the raw delivery kept.
    let body = runyard_testkit::fixture("github_workflow_job_queued.json");
    let r = http
        .post(format!("http://{ingest_addr}/webhooks/github"))
        .header("X-GitHub-Event", "workflow_job")
        .header("X-GitHub-Delivery", "7a1f3e2c-0000-4000-8000-00000000a001")
        .header(
            "X-Hub-Signature-256",
            github_signature(GITHUB_SECRET, body.as_bytes()),
        )
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    let r = http
        .post(format!("http://{ingest_addr}/v1/usage"))
        .bearer_auth(USAGE_TOKEN)
        .header("Content-Type", "application/json")
        .body(runyard_testkit::fixture("usage_report.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());

    // job-tracker: both projected into Postgres.
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let projected = eventually(WAIT, || {
        let pool = pool.clone();
        async move {
            let jobs: i64 =
                sqlx::query_scalar("SELECT count(*) FROM jobs WHERE job_id = 21870573124")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            let usage: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_samples")
                .fetch_one(&pool)
                .await
                .ok()?;
            (jobs == 1 && usage == 1).then_some(())
        }
    })
    .await;
    assert!(projected.is_some(), "the job-tracker projected nothing");

    // scaler: a runner for the queued job, its claim in the bucket; the
    // allocator it asked published the allocation; the job-tracker
    // projected the runner.
    let subjects = eventually(WAIT, || async {
        let msgs = read_as_cli(&nats, &ns.events_stream()).await;
        let subjects: Vec<String> = msgs.iter().map(|m| m.subject.to_string()).collect();
        let has = |p: &str| subjects.iter().any(|s| s.starts_with(p));
        (has("runyard.v1.runner.linux-x64.") && has("runyard.v1.allocation")).then_some(subjects)
    })
    .await;
    assert!(
        subjects.is_some(),
        "no runner or allocation event: {:?}",
        read_as_cli(&nats, &ns.events_stream())
            .await
            .iter()
            .map(|m| m.subject.to_string())
            .collect::<Vec<_>>()
    );
    let runners = eventually(WAIT, || {
        let pool = pool.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM runners")
                .fetch_one(&pool)
                .await
                .ok()?;
            (n >= 1).then_some(())
        }
    })
    .await;
    assert!(runners.is_some(), "the runner was not projected");
    let raw = read_as_cli(&nats, &ns.raw_stream()).await;
    assert_eq!(raw.len(), 2, "one raw delivery per accepted request");

    let (scaler, mut scaler_errors) = nats.client_as("scaler").await;
    let scaler_js = jetstream::new(scaler.clone());
    let claims = scaler_js.get_key_value("RUNYARD_CLAIMS").await.unwrap();
    assert!(
        claims.status().await.unwrap().values() >= 1,
        "no claim made"
    );
    let instances = scaler_js.get_key_value("RUNYARD_INSTANCES").await.unwrap();
    instances
        .put("ry-linux-x64-probe", "jit-config".into())
        .await
        .unwrap();
    assert_eq!(
        instances
            .get("ry-linux-x64-probe")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"jit-config"[..])
    );

    // ingest's user: no bucket, nobody's replies, no reading the log, no
    // events but its own kinds.
    let (ingest, mut errors) = nats.client_as("ingest").await;
    let ingest_js = jetstream::new(ingest.clone());
    assert!(ingest_js.get_key_value("RUNYARD_INSTANCES").await.is_err());
    refused(
        &mut errors,
        "publish to",
        "$JS.API.STREAM.INFO.KV_RUNYARD_INSTANCES",
    )
    .await;
    let direct = "$JS.API.DIRECT.GET.KV_RUNYARD_INSTANCES.$KV.RUNYARD_INSTANCES.ry-linux-x64-probe";
    let got = tokio::time::timeout(
        Duration::from_secs(3),
        ingest.request(direct.to_owned(), "".into()),
    )
    .await;
    assert!(
        !matches!(got, Ok(Ok(ref m)) if m.payload.as_ref() == b"jit-config"),
        "ingest read an instance's secret"
    );
    refused(&mut errors, "publish to", direct).await;
    subscribe_refused(&ingest, &mut errors, "$KV.RUNYARD_INSTANCES.>").await;
    subscribe_refused(&ingest, &mut errors, "_INBOX.>").await;
    subscribe_refused(&ingest, &mut errors, "_INBOX.scaler.>").await;
    publish_refused(&ingest, &mut errors, "runyard.v1.allocation").await;
    publish_refused(&ingest, &mut errors, "runyard.v1.runner.linux-x64.created").await;
    publish_refused(
        &ingest,
        &mut errors,
        "$JS.API.CONSUMER.CREATE.RUNYARD_EVENTS",
    )
    .await;

    // The job-tracker's user: no bucket, no jobs of its own making.
    let (tracker, mut errors) = nats.client_as("job-tracker").await;
    publish_refused(&tracker, &mut errors, "$KV.RUNYARD_CLAIMS.github.x.1.1").await;
    publish_refused(
        &tracker,
        &mut errors,
        "$JS.API.STREAM.INFO.KV_RUNYARD_LEASES",
    )
    .await;
    publish_refused(&tracker, &mut errors, "runyard.v1.job.github.queued").await;

    // The allocator's user: no usage reports, no leases, not the
    // job-tracker's consumer.
    let (allocator, mut errors) = nats.client_as("allocator").await;
    publish_refused(&allocator, &mut errors, "runyard.v1.usage.github").await;
    publish_refused(&allocator, &mut errors, "$KV.RUNYARD_LEASES.linux-x64").await;
    publish_refused(
        &allocator,
        &mut errors,
        "$JS.API.CONSUMER.MSG.NEXT.RUNYARD_EVENTS.job-tracker",
    )
    .await;

    // The scaler's user: jobs (its reconciler's) but no usage reports and
    // no raw deliveries.
    publish_refused(&scaler, &mut scaler_errors, "runyard.v1.usage.github").await;
    publish_refused(&scaler, &mut scaler_errors, "runyard.raw.github").await;

    // The CLI's user reads but writes nothing.
    let (cli, mut errors) = nats.client_as("cli").await;
    publish_refused(&cli, &mut errors, "runyard.v1.job.github.queued").await;
    publish_refused(
        &cli,
        &mut errors,
        "$JS.API.STREAM.INFO.KV_RUNYARD_INSTANCES",
    )
    .await;

    // Nobody without a password, nobody with a wrong one.
    let anonymous = async_nats::connect(nats.url()).await;
    assert!(anonymous.is_err(), "an anonymous connection was let in");
    let wrong = async_nats::ConnectOptions::with_user_and_password(
        "scaler".into(),
        nats.password("ingest").into(),
    )
    .connect(nats.url())
    .await;
    assert!(wrong.is_err(), "another user's password was let in");

    // The CLI logged in as its user: the doctor finds the streams and that
    // NATS refuses anonymous connections; `events tail` reads the log.
    let runyard = |args: &'static [&'static str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"));
        command
            .env_clear()
            .env(runyard_cli::stack_env::FILE_VAR, "")
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUNYARD_NATS_URL", nats.url())
            .env("RUNYARD_NATS_USER", "cli")
            .env("RUNYARD_NATS_PASSWORD", nats.password("cli"))
            .env("RUNYARD_NAMESPACE", NAMESPACE)
            .env("RUNYARD_DATABASE_URL", &db.url)
            .env("RUNYARD_INGEST_URL", format!("http://{ingest_addr}"))
            .env("RUNYARD_TRACKER_URL", format!("http://{tracker_addr}"))
            .env("RUNYARD_ALLOCATOR_URL", format!("http://{grpc}"))
            .env("RUNYARD_ALLOCATOR_HTTP_URL", format!("http://{alloc_http}"))
            .env("RUNYARD_SCALER_URL", format!("http://{scaler_addr}"))
            .env("RUNYARD_ALLOCATOR_CLIENT_TOKEN", ALLOCATOR_TOKEN)
            .args(args);
        async move { command.output().await.unwrap() }
    };
    let o = runyard(&["doctor", "--json"]).await;
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    let outcome = |id: &str| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["outcome"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        outcome("nats.anonymous").as_deref(),
        Some("ok"),
        "{report:#}"
    );
    assert_eq!(
        outcome("nats.jetstream").as_deref(),
        Some("ok"),
        "{report:#}"
    );
    assert_eq!(
        outcome("stream.RUNYARD_EVENTS").as_deref(),
        Some("ok"),
        "{report:#}"
    );
    assert_eq!(report["healthy"], true, "{report:#}");
    // Without credentials the doctor says so, and how to log in.
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"))
        .env_clear()
        .env(runyard_cli::stack_env::FILE_VAR, "")
        .env("RUNYARD_NATS_URL", nats.url())
        .env("RUNYARD_NAMESPACE", NAMESPACE)
        .args(["doctor", "--json", "--timeout", "2"])
        .output()
        .await
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nobody = |id: &str| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(nobody("nats.reachable")["outcome"], "fail", "{report:#}");
    assert!(
        nobody("nats.reachable")["fix"]
            .as_str()
            .unwrap()
            .contains("RUNYARD_NATS_USER=cli"),
        "{report:#}"
    );
    assert_eq!(nobody("nats.anonymous")["outcome"], "ok", "{report:#}");
    let o = runyard(&["events", "tail"]).await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("21870573124"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // None of the refused publishes reached the log.
    let forged = read_as_cli(&nats, &ns.events_stream())
        .await
        .into_iter()
        .filter(|m| m.payload.as_ref() == b"forged")
        .count();
    assert_eq!(forged, 0);
    drop(stops);
    pool.close().await;
    db.drop_db().await;
}
