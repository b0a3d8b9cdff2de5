//! The `runyard` binary against the real stack: a real nats-server (a
//! namespace per test), a real Postgres (a database per test) and the
//! services' own `App`s started in this process on loopback ports. Only
//! GitHub's API is faked (the scaler's, with the Actions service of
//! scale-set pools behind it). Each test runs the binary as an operator
//! would and reads what it prints and its exit code.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use prost::Message as _;
use runyard_events::{Body, Event, Namespace, RunnerRef, RunnerRequested, Source};
use runyard_testkit::fake_actions::FakeActions;
use runyard_testkit::fake_github::FakeGitHub;
use runyard_testkit::pki::TestPki;
use runyard_testkit::{NatsServer, TestDb, TestNats, eventually, free_port, unique_namespace};
use sea_orm_migration::MigratorTrait as _;
use serde_json::Value;
use tokio::sync::oneshot;

pub(crate) const WAIT: Duration = Duration::from_secs(60);
// As `openssl rand -hex 32` makes them (runyard refuses weak secrets).
const GITHUB_SECRET: &str = "e3eca9def0b915748e37856a5f22255bd7f99c4a563cb344bf3ad85f3c92fe17";
const GITLAB_TOKEN: &str = "374f3aef87d01360e96a6f94db2a364da5ccc367bf0ba27a8cc22e6f7ad09bdd";
const USAGE_TOKEN: &str = "bfbe986563665543276b7a64f56018f4d600aa7a95d53d079525895d6af2d2bd";
/// The allocator wants it; the scaler and the CLI send it.
const ALLOCATOR_TOKEN: &str = "3f287a4d3dc2eab10076d416f39a01a8bc03dffb54658f1c87555e68120c38c3";
/// The scaler's GitHub token (a PAT).
pub(crate) const GITHUB_TOKEN: &str = "ghp_cliTestToken0123456789abcdefABCDEF01";

/// Where the CLI should look: every address it takes.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    nats: String,
    ns: String,
    db: String,
    ingest: String,
    tracker: String,
    allocator_grpc: String,
    allocator_http: String,
    scaler: String,
    /// `RUNYARD_ALLOCATOR_CA_FILE`, `_CLIENT_CERT`, `_CLIENT_KEY`.
    tls: Option<[std::path::PathBuf; 3]>,
    /// More variables (the scaler's file, GitHub credentials).
    pub(crate) env: Vec<(String, String)>,
}

impl Target {
    /// Nothing listens at any service address; NATS and Postgres as given.
    fn bare(nats: &str, ns: &Namespace, db: &str) -> Self {
        let nowhere = || format!("http://127.0.0.1:{}", free_port());
        Self {
            nats: nats.to_owned(),
            ns: ns.as_str().to_owned(),
            db: db.to_owned(),
            ingest: nowhere(),
            tracker: nowhere(),
            allocator_grpc: nowhere(),
            allocator_http: nowhere(),
            scaler: nowhere(),
            tls: None,
            env: Vec::new(),
        }
    }
}

/// Runs `runyard ARGS` with the target's addresses in the environment (the
/// `RUNYARD_*` fallbacks) and nothing else of this process's.
pub(crate) async fn runyard(t: &Target, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"));
    command
        .env_clear()
        .env(runyard_cli::stack_env::FILE_VAR, "")
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUNYARD_NATS_URL", &t.nats)
        .env("RUNYARD_NAMESPACE", &t.ns)
        .env("RUNYARD_DATABASE_URL", &t.db)
        .env("RUNYARD_INGEST_URL", &t.ingest)
        .env("RUNYARD_TRACKER_URL", &t.tracker)
        .env("RUNYARD_ALLOCATOR_URL", &t.allocator_grpc)
        .env("RUNYARD_ALLOCATOR_HTTP_URL", &t.allocator_http)
        .env("RUNYARD_SCALER_URL", &t.scaler)
        .env("RUNYARD_GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)
        .env("RUNYARD_GITLAB_WEBHOOK_TOKEN", GITLAB_TOKEN)
        .env("RUNYARD_USAGE_TOKEN", USAGE_TOKEN)
        .env("RUNYARD_ALLOCATOR_CLIENT_TOKEN", ALLOCATOR_TOKEN);
    if let Some([ca, cert, key]) = &t.tls {
        command
            .env("RUNYARD_ALLOCATOR_CA_FILE", ca)
            .env("RUNYARD_ALLOCATOR_CLIENT_CERT", cert)
            .env("RUNYARD_ALLOCATOR_CLIENT_KEY", key);
    }
    command.envs(t.env.iter().map(|(k, v)| (k, v)));
    command.args(args).output().await.expect("running runyard")
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr: {}", stdout(o), stderr(o)))
}

pub(crate) fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// The doctor's checks by id: (outcome, detail, fix).
pub(crate) fn checks(
    report: &Value,
) -> std::collections::BTreeMap<String, (String, String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                (
                    c["outcome"].as_str().unwrap().to_owned(),
                    c["detail"].as_str().unwrap_or_default().to_owned(),
                    c["fix"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect()
}

/// Runs each service's `run` until dropped.
struct Stops(Vec<oneshot::Sender<()>>);

fn spawn_run<F>(stops: &mut Stops, run: impl FnOnce(oneshot::Receiver<()>) -> F)
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    stops.0.push(tx);
    tokio::spawn(run(rx));
}

/// The whole stack, in this process.
pub(crate) struct Stack {
    nats: TestNats,
    ns: Namespace,
    pub(crate) db: TestDb,
    pub(crate) target: Target,
    /// GitHub's REST API, the scaler's; it brokers the registration steps
    /// of [`Stack::actions`].
    pub(crate) github: FakeGitHub,
    /// The Actions service of scale-set pools.
    pub(crate) actions: FakeActions,
    /// The scaler's pools-and-providers file, as it was started with.
    pub(crate) scaler_file: std::path::PathBuf,
    _stops: Stops,
    _dir: tempfile::TempDir,
}

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A pool no fixture job matches: the scaler shows it and makes nothing.
pub(crate) const SCALER_FILE: &str = r#"
[providers.local]
kind = "process"
command = ["/bin/true"]

[[pools]]
name = "cli-test"
forge = "github"
scope = { org = "octo-org" }
labels = ["self-hosted", "no-fixture-job-has-this-label"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 3
"#;

impl Stack {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// The stack; with `pki`, every listener speaks mTLS (the PKI's server
    /// certificate, its CA as the client CA), the scaler asks the allocator
    /// over `https://` with the client certificate, and the CLI is given
    /// the CA and the client certificate.
    async fn start_with(pki: Option<&TestPki>) -> Self {
        Self::build(pki, SCALER_FILE).await
    }

    /// The stack with the scaler started on `scaler_file`.
    pub(crate) async fn start_with_pools(scaler_file: &str) -> Self {
        Self::build(None, scaler_file).await
    }

    async fn build(pki: Option<&TestPki>, scaler_file: &str) -> Self {
        runyard_telemetry::install_crypto_provider();
        let cert = pki.map(|p| p.server.cert.clone());
        let key = pki.map(|p| p.server.key.clone());
        let ca = pki.map(|p| p.ca_file.clone());
        let scheme = if pki.is_some() { "https" } else { "http" };
        let nats = TestNats::get().await;
        let ns = unique_namespace();
        let db = TestDb::new();
        let github = FakeGitHub::start().await;
        let actions = FakeActions::start().await;
        github.connect_actions(&actions);
        let dir = tempfile::tempdir().unwrap();
        let scaler_path = dir.path().join("scaler.toml");
        std::fs::write(&scaler_path, scaler_file).unwrap();
        let mut stops = Stops(Vec::new());

        let ingest = runyard_ingest::App::build(runyard_ingest::Config {
            bus: runyard_config::Bus {
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            ingest_listen: LOCAL,
            github_webhook_secret: Some(GITHUB_SECRET.to_owned().into()),
            gitlab_webhook_token: Some(GITLAB_TOKEN.to_owned().into()),
            usage_token: Some(USAGE_TOKEN.to_owned().into()),
            tls: runyard_config::Tls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: ca.clone(),
            },
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
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            database: runyard_config::Database {
                url: db.url.clone(),
            },
            tracker_http_listen: LOCAL,
            tracker_batch_wait: Duration::from_millis(5),
            tls: runyard_config::Tls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: ca.clone(),
            },
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
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            database: runyard_config::Database {
                url: db.url.clone(),
            },
            allocator_listen: LOCAL,
            allocator_http_listen: LOCAL,
            allocator_tokens: runyard_allocator::auth::tokens([ALLOCATOR_TOKEN]),
            tls: runyard_config::Tls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: ca.clone(),
            },
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

        let scaler = runyard_scaler::App::build(
            runyard_scaler::Config {
                bus: runyard_config::Bus {
                    nats_url: nats.url(),
                    namespace: ns.to_string(),
                },
                database: runyard_config::Database {
                    url: db.url.clone(),
                },
                scaler_http_listen: LOCAL,
                github_api_url: github.url(),
                github_token: Some(GITHUB_TOKEN.to_owned().into()),
                allocator_url: format!("{scheme}://{grpc}"),
                allocator_client_token: Some(ALLOCATOR_TOKEN.to_owned().into()),
                allocator_ca_file: ca.clone(),
                allocator_client_cert: pki.map(|p| p.client.cert.clone()),
                allocator_client_key: pki.map(|p| p.client.key.clone()),
                tls: runyard_config::Tls {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: ca.clone(),
                },
                scaler_metadata_listen: LOCAL,
                scaler_instance_token_key: Some(
                    "e6ba5d7d4016a15dcba16e8905f88fea35bfdd5cfeeb02b8bb711d5885495b87"
                        .to_owned()
                        .into(),
                ),
                ..runyard_scaler::Config::default()
            },
            Some(runyard_scaler::ScalerFile::parse(scaler_file).unwrap()),
        )
        .await
        .unwrap();
        let scaler_addr = scaler.local_addr();
        spawn_run(&mut stops, |rx| {
            scaler.run(async move {
                let _ = rx.await;
            })
        });

        let target = Target {
            nats: nats.url(),
            ns: ns.as_str().to_owned(),
            db: db.url.clone(),
            ingest: format!("{scheme}://{ingest_addr}"),
            tracker: format!("{scheme}://{tracker_addr}"),
            allocator_grpc: format!("{scheme}://{grpc}"),
            allocator_http: format!("{scheme}://{alloc_http}"),
            scaler: format!("{scheme}://{scaler_addr}"),
            tls: pki.map(|p| {
                [
                    p.ca_file.clone(),
                    p.client.cert.clone(),
                    p.client.key.clone(),
                ]
            }),
            env: Vec::new(),
        };
        let http = match pki {
            Some(p) => p.https_client(Some(&p.client)),
            None => reqwest::Client::new(),
        };
        for base in [
            &target.ingest,
            &target.tracker,
            &target.allocator_http,
            &target.scaler,
        ] {
            let url = format!("{base}/readyz");
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
        Self {
            nats,
            ns,
            db,
            target,
            github,
            actions,
            scaler_file: scaler_path,
            _stops: stops,
            _dir: dir,
        }
    }

    /// A directory with one GitHub, one GitLab and one usage delivery.
    fn fixtures(&self) -> std::path::PathBuf {
        let dir = self._dir.path().join("fixtures");
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "github_workflow_job_queued.json",
            "gitlab_job_failed.json",
            "usage_report.json",
        ] {
            std::fs::write(dir.join(name), runyard_testkit::fixture(name)).unwrap();
        }
        dir
    }

    /// Events of the deliveries in the log (jobs and usage; the services'
    /// own decisions left out).
    async fn stream_messages(&self) -> u64 {
        use futures::StreamExt as _;
        let client = async_nats::connect(self.nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let s = js.get_stream(self.ns.events_stream()).await.unwrap();
        let mut n = 0;
        for f in ["job", "usage"] {
            let filter = format!("{}.v1.{f}.>", self.ns.as_str());
            let mut subjects = s.info_with_subjects(filter).await.unwrap();
            while let Some(x) = subjects.next().await {
                n += x.unwrap().1 as u64;
            }
        }
        n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_on_a_healthy_stack() {
    let stack = Stack::start().await;
    let o = runyard(&stack.target, &["doctor", "--json"]).await;
    let report = json(&o);
    assert_eq!(code(&o), 0, "{report:#}");
    assert_eq!(report["healthy"], true);
    let checks = checks(&report);
    for id in [
        "nats.reachable",
        "nats.version",
        "nats.jetstream",
        "nats.max_payload",
        &format!("stream.{}", stack.ns.events_stream()),
        &format!("stream.{}", stack.ns.raw_stream()),
        "postgres.reachable",
        "postgres.database",
        "postgres.migrations",
        "ingest.ready",
        "job-tracker.ready",
        "allocator.ready",
        "scaler.ready",
        "allocator.grpc",
    ] {
        assert_eq!(
            checks.get(id).map(|c| c.0.as_str()),
            Some("ok"),
            "{id}: {checks:#?}"
        );
    }
    // The tests' NATS lets anyone in: a warning, not a failure.
    let (outcome, detail, fix) = &checks["nats.anonymous"];
    assert_eq!(outcome, "warn", "{detail}");
    assert!(detail.contains("without credentials"), "{detail}");
    assert!(fix.contains("nats-auth.conf"), "{fix}");
    assert_eq!(report["warnings"], 1);
    // For people: one line per check and the verdict.
    let o = runyard(&stack.target, &["doctor"]).await;
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    assert!(
        text.contains("All checks passed, with 1 warning(s)."),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("WARN ") && l.contains("nats.anonymous")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok ") && l.contains("postgres.migrations")),
        "{text}"
    );
    // The scaler's file, without scale-set pools: nothing more to check.
    let mut t = stack.target.clone();
    t.env.push((
        "RUNYARD_SCALER_CONFIG".into(),
        stack.scaler_file.display().to_string(),
    ));
    let o = runyard(&t, &["doctor", "--json"]).await;
    let with_file = json(&o);
    assert_eq!(code(&o), 0, "{with_file:#}");
    assert_eq!(
        self::checks(&with_file).keys().collect::<Vec<_>>(),
        checks.keys().collect::<Vec<_>>(),
        "{with_file:#}"
    );
    // The console is checked once it is named; here nothing answers there.
    assert!(!checks.contains_key("console.ready"));
    let mut t = stack.target.clone();
    t.env.push((
        "RUNYARD_CONSOLE_URL".into(),
        format!("http://127.0.0.1:{}", runyard_testkit::free_port()),
    ));
    let o = runyard(&t, &["doctor", "--json"]).await;
    let with_console = json(&o);
    assert_eq!(code(&o), 1, "{with_console:#}");
    let (outcome, _, fix) = &self::checks(&with_console)["console.ready"];
    assert_eq!(outcome, "fail");
    assert!(fix.contains("RUNYARD_CONSOLE_URL"), "{fix}");
    let o = runyard(&t, &["doctor", "--json", "--skip", "console"]).await;
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    stack.db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_nats_is_down_and_how_to_fix_it() {
    let mut nats = NatsServer::start().await;
    let url = nats.url();
    nats.stop().await;
    let ns = unique_namespace();
    // The tests' Postgres server (its admin database, which exists).
    let server = TestDb::new().sibling("postgres");
    let t = Target::bare(&url, &ns, &server);
    let o = runyard(&t, &["doctor", "--json", "--timeout", "2"]).await;
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let checks = checks(&json(&o));
    let (outcome, detail, fix) = &checks["nats.reachable"];
    assert_eq!(outcome, "fail");
    assert!(detail.contains(&url), "{detail}");
    assert!(fix.contains("nats-server"), "{fix}");
    assert_eq!(checks["nats.version"].0, "skipped");
    assert_eq!(
        checks[&format!("stream.{}", ns.events_stream())].0,
        "skipped"
    );
    // Postgres is fine, the services are not there.
    assert_eq!(checks["postgres.reachable"].0, "ok");
    for s in ["ingest", "job-tracker", "allocator", "scaler"] {
        let (outcome, detail, fix) = &checks[&format!("{s}.ready")];
        assert_eq!(outcome, "fail");
        assert!(detail.contains("nothing answers"), "{detail}");
        assert!(fix.contains(&format!("runyard-{s}")), "{fix}");
    }
    // The text names the failure and the fix.
    let o = runyard(&t, &["doctor", "--timeout", "2"]).await;
    assert_eq!(code(&o), 1);
    let text = stdout(&o);
    assert!(text.contains("FAIL") && text.contains("To fix:"), "{text}");
    assert!(text.contains("check(s) failed"), "{text}");
}

/// A fake NATS server of an old version: it speaks just enough of the
/// protocol for a client to connect (INFO, PONG) and answers nothing else.
async fn old_nats(version: &str) -> String {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let info = format!(
        "INFO {{\"server_id\":\"OLD\",\"server_name\":\"old\",\"version\":\"{version}\",\"proto\":1,\"go\":\"go1.19\",\"host\":\"127.0.0.1\",\"port\":{},\"headers\":true,\"max_payload\":1048576,\"jetstream\":true}}\r\n",
        addr.port()
    );
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let info = info.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                if w.write_all(info.as_bytes()).await.is_err() {
                    return;
                }
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.starts_with("PING") && w.write_all(b"PONG\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("nats://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_refuses_an_old_nats_server() {
    let url = old_nats("2.9.25").await;
    let t = Target::bare(
        &url,
        &unique_namespace(),
        &TestDb::new().sibling("postgres"),
    );
    let o = runyard(
        &t,
        &[
            "doctor",
            "--json",
            "--timeout",
            "1",
            "--skip",
            "ingest",
            "--skip",
            "job-tracker",
            "--skip",
            "allocator",
            "--skip",
            "scaler",
        ],
    )
    .await;
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let checks = checks(&json(&o));
    assert_eq!(checks["nats.reachable"].0, "ok");
    let (outcome, detail, fix) = &checks["nats.version"];
    assert_eq!(outcome, "fail");
    assert!(
        detail.contains("2.9.25") && detail.contains("2.10"),
        "{detail}"
    );
    assert!(fix.contains("upgrade"), "{fix}");
    // 1 MiB cannot hold ingest's 25 MiB bodies.
    let (outcome, _, fix) = &checks["nats.max_payload"];
    assert_eq!(outcome, "fail");
    assert!(fix.contains("max_payload"), "{fix}");
    assert!(
        !checks.contains_key("scaler.ready"),
        "skipped services are left out"
    );
}

/// NATS and Postgres only (no services), for the broken-piece tests.
const NO_SERVICES: [&str; 8] = [
    "--skip",
    "ingest",
    "--skip",
    "job-tracker",
    "--skip",
    "allocator",
    "--skip",
    "scaler",
];

async fn doctor_without_services(t: &Target) -> (i32, Value) {
    let mut args = vec!["doctor", "--json"];
    args.extend(NO_SERVICES);
    let o = runyard(t, &args).await;
    (code(&o), json(&o))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_missing_streams_a_missing_database_and_migrations_behind() {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let t = Target::bare(&nats.url(), &ns, &db.url);

    // Nothing made yet: no streams, no database.
    let (c, report) = doctor_without_services(&t).await;
    assert_eq!(c, 1);
    let checks = checks(&report);
    for stream in [ns.events_stream(), ns.raw_stream()] {
        let (outcome, detail, fix) = &checks[&format!("stream.{stream}")];
        assert_eq!(outcome, "fail");
        assert!(detail.contains("does not exist"), "{detail}");
        assert!(
            fix.contains("runyard-ingest") && fix.contains(ns.as_str()),
            "{fix}"
        );
    }
    let (outcome, detail, fix) = &checks["postgres.database"];
    assert_eq!(outcome, "fail");
    assert!(detail.contains(&db.name), "{detail}");
    assert!(fix.contains("runyard-job-tracker migrate"), "{fix}");
    assert_eq!(checks["postgres.migrations"].0, "skipped");
    // The doctor only looks: it created neither the database nor a stream.
    let (c, report) = doctor_without_services(&t).await;
    assert_eq!(c, 1);
    assert_eq!(self::checks(&report)["postgres.database"].0, "fail");

    // The streams as ingest makes them; the schema one migration behind.
    let bus = runyard_bus::Bus::connect(&nats.url(), ns.clone(), "cli-test", false)
        .await
        .unwrap();
    bus.ensure_streams(&runyard_bus::StreamSettings::default())
        .await
        .unwrap();
    runyard_store::create_database_if_missing(&db.url)
        .await
        .unwrap();
    let conn = sea_orm::Database::connect(&db.url).await.unwrap();
    let all = runyard_store::Migrator::migrations().len() as u32;
    runyard_store::Migrator::up(&conn, Some(all - 1))
        .await
        .unwrap();
    let last = runyard_store::Migrator::migrations()
        .last()
        .map(|m| m.name().to_owned())
        .unwrap();
    let (c, report) = doctor_without_services(&t).await;
    assert_eq!(c, 1, "{report:#}");
    let checks = self::checks(&report);
    assert_eq!(checks[&format!("stream.{}", ns.events_stream())].0, "ok");
    assert_eq!(checks["postgres.database"].0, "ok");
    let (outcome, detail, fix) = &checks["postgres.migrations"];
    assert_eq!(outcome, "fail");
    assert!(
        detail.contains("behind") && detail.contains(&last),
        "{detail}"
    );
    assert!(fix.contains("migrate"), "{fix}");

    // Migrated: all good.
    runyard_store::Migrator::up(&conn, None).await.unwrap();
    conn.close().await.unwrap();
    let (c, report) = doctor_without_services(&t).await;
    assert_eq!(c, 0, "{report:#}");
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_streams_with_settings_that_lose_events() {
    use async_nats::jetstream::stream;
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    // Made by hand: on memory, a one-minute duplicate window.
    js.create_stream(stream::Config {
        name: ns.events_stream(),
        subjects: vec![ns.all_events()],
        storage: stream::StorageType::Memory,
        duplicate_window: Duration::from_secs(60),
        ..Default::default()
    })
    .await
    .unwrap();
    let db = TestDb::new();
    let t = Target::bare(&nats.url(), &ns, &db.url);
    let (c, report) = doctor_without_services(&t).await;
    assert_eq!(c, 1);
    let checks = checks(&report);
    let (outcome, detail, fix) = &checks[&format!("stream.{}", ns.events_stream())];
    assert_eq!(outcome, "fail");
    assert!(
        detail.contains("memory") && detail.contains("duplicate window"),
        "{detail}"
    );
    assert!(fix.contains("runyard-ingest"), "{fix}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_sends_signed_deliveries_and_events_tail_shows_them() {
    let stack = Stack::start().await;
    let dir = stack.fixtures();
    let dir_s = dir.display().to_string();

    let o = runyard(&stack.target, &["replay", &dir_s, "--json"]).await;
    let summary = json(&o);
    assert_eq!(code(&o), 0, "{summary:#}\n{}", stderr(&o));
    assert_eq!(summary["sent"], 3);
    assert_eq!(summary["accepted"], 3, "{summary:#}");
    assert_eq!(stack.stream_messages().await, 3);

    // Again: the same delivery ids, so JetStream drops them as duplicates.
    let o = runyard(&stack.target, &["replay", &dir_s]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 sent") && stdout(&o).contains("3 duplicate"),
        "{}",
        stdout(&o)
    );
    assert_eq!(stack.stream_messages().await, 3);

    // A file ingest would not know stops the replay before anything is sent.
    std::fs::write(dir.join("zz-notes.json"), "{\"hello\": 1}").unwrap();
    let o = runyard(&stack.target, &["replay", &dir_s]).await;
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("zz-notes.json"), "{}", stderr(&o));
    std::fs::remove_file(dir.join("zz-notes.json")).unwrap();
    // So does a missing secret.
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"))
        .env_clear()
        .env(runyard_cli::stack_env::FILE_VAR, "")
        .args(["replay", &dir_s, "--ingest-url", &stack.target.ingest])
        .output()
        .await
        .unwrap();
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("RUNYARD_GITHUB_WEBHOOK_SECRET"),
        "{}",
        stderr(&o)
    );
    // A wrong secret: ingest refuses; exit 1, the refusal named.
    let o = runyard(
        &stack.target,
        &["replay", &dir_s, "--github-secret", "wrong", "--json"],
    )
    .await;
    assert_eq!(code(&o), 1);
    let summary = json(&o);
    assert_eq!(summary["failed"], 1, "{summary:#}");
    assert_eq!(stack.stream_messages().await, 3);

    // The log, decoded, oldest first.
    let deliveries = [
        "events",
        "tail",
        "--subject",
        "job.>",
        "--subject",
        "usage.>",
    ];
    let o = runyard(&stack.target, &deliveries).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("#1 ") && lines[0].contains("job 21870573124"),
        "{text}"
    );
    assert!(lines[2].contains("usage job=4711"), "{text}");

    // For scripts: one JSON object per line.
    let mut args = deliveries.to_vec();
    args.push("--json");
    let o = runyard(&stack.target, &args).await;
    let events: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 3);
    assert_eq!(events[0]["event"]["type"], "JobObserved");
    assert_eq!(events[0]["event"]["body"]["status"], "queued");
    assert_eq!(events[2]["event"]["body"]["job"]["job_id"], 4711);

    // One delivery's story by its trace id: each delivery here started its
    // own trace, so the queued job's trace holds its event alone.
    let traces: Vec<&str> = events
        .iter()
        .map(|e| e["trace_id"].as_str().expect("every event names its trace"))
        .collect();
    assert!(traces.iter().all(|t| t.len() == 32), "{traces:?}");
    let o = runyard(
        &stack.target,
        &["events", "tail", "--trace", traces[0], "--json"],
    )
    .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let of_trace: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!of_trace.is_empty(), "{}", stdout(&o));
    assert!(of_trace.iter().all(|e| e["trace_id"] == traces[0]));
    assert!(of_trace.iter().all(|e| e["trace_id"] != traces[2]));
    let o = runyard(&stack.target, &["events", "tail", "--trace", "nothex"]).await;
    assert_eq!(code(&o), 2, "a malformed trace id is a usage error");
    assert!(stderr(&o).contains("not a trace id"), "{}", stderr(&o));

    // One job's story: the GitLab build 4711's job event, its usage
    // report and the runner requested for it; not the GitHub job's events,
    // nor another runner's.
    let job = runyard_events::JobKey {
        forge: runyard_events::Forge::Gitlab as i32,
        instance: "gitlab.example.com".into(),
        job_id: 4711,
    };
    publish_runner_requested(&stack, "gl", "ry-gl-story", Some(job)).await;
    publish_runner_requested(&stack, "gl", "ry-gl-other", None).await;
    let story = |args: &'static [&'static str]| {
        let stack = &stack;
        async move {
            let o = runyard(&stack.target, args).await;
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            stdout(&o)
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .map(|e| e["event"]["type"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<String>>()
        }
    };
    // The scaler judges the failed build too: its report says exit code 0,
    // no OOM kill, so no retry. That verdict lands when the scaler's retry
    // loop next runs, before or after the runner requested here.
    let mut types = eventually(std::time::Duration::from_secs(10), || async {
        let types = story(&["events", "tail", "--job", "4711", "--json"]).await;
        types.iter().any(|t| t == "RetryRefused").then_some(types)
    })
    .await
    .expect("the scaler never judged build 4711");
    assert_eq!(
        types[..2],
        ["JobObserved", "UsageReported"],
        "the story of 4711"
    );
    types.sort();
    assert_eq!(
        types,
        [
            "JobObserved",
            "RetryRefused",
            "RunnerRequested",
            "UsageReported"
        ],
        "the story of 4711"
    );
    let types = story(&[
        "events",
        "tail",
        "--job",
        "gitlab:gitlab.example.com:4711",
        "--json",
    ])
    .await;
    assert_eq!(types.len(), 4, "{types:?}");
    let types = story(&[
        "events",
        "tail",
        "--job",
        "github:github.com:4711",
        "--json",
    ])
    .await;
    assert!(types.is_empty(), "another forge's 4711: {types:?}");
    let o = runyard(&stack.target, &["events", "tail", "--job", "gitlab:4711"]).await;
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("FORGE:INSTANCE:ID"), "{}", stderr(&o));

    // The raw deliveries: headers and sizes, never the GitLab token.
    let o = runyard(&stack.target, &["events", "tail", "--raw", "--json"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let raw: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(raw.len(), 3, "{}", stdout(&o));
    assert!(raw.iter().all(|r| r["bytes"].as_u64() > Some(100)));
    assert!(
        raw.iter()
            .any(|r| r["headers"]["Http-x-github-event"] == "workflow_job"),
        "{}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains(GITLAB_TOKEN) && !stdout(&o).contains(USAGE_TOKEN));

    // Filtered by subject (relative to the namespace).
    let o = runyard(&stack.target, &["events", "tail", "--subject", "usage.>"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
    // (No service publishes for a forge runyard does not serve; the
    // retrier may decide on the failed GitLab job at any time.)
    let o = runyard(&stack.target, &["events", "tail", "-s", "job.bitbucket.>"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "", "nothing matches: nothing printed, no wait");

    // Only the recent past: everything so far is within the hour, none of
    // it within the last second once a second has passed.
    let mut args = deliveries.to_vec();
    args.extend(["--since", "1h"]);
    let o = runyard(&stack.target, &args).await;
    assert_eq!(stdout(&o).lines().count(), 3, "{}", stdout(&o));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut args = deliveries.to_vec();
    args.extend(["--since", "1s"]);
    let o = runyard(&stack.target, &args).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
    let o = runyard(&stack.target, &["events", "tail", "--since", "yesterday"]).await;
    assert_eq!(code(&o), 2);

    // Following: a new delivery shows up while it runs.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"))
        .env_clear()
        .env(runyard_cli::stack_env::FILE_VAR, "")
        .args([
            "events",
            "tail",
            "--follow",
            "--subject",
            "job.github.>",
            "--nats-url",
            &stack.target.nats,
            "--namespace",
            &stack.target.ns,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let follow = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(follow));
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(first.unwrap().contains("job 21870573124"));
    let mut job: Value = serde_json::from_str(&runyard_testkit::fixture(
        "github_workflow_job_completed.json",
    ))
    .unwrap();
    job["workflow_job"]["id"] = Value::from(777u64);
    let more = dir.join("more");
    std::fs::create_dir_all(&more).unwrap();
    std::fs::write(more.join("completed.json"), job.to_string()).unwrap();
    let o = runyard(&stack.target, &["replay", &more.display().to_string()]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let next = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(next.unwrap().contains("job 777"));
    child.kill().await.unwrap();
    stack.db.drop_db().await;
}

async fn publish_runner_requested(
    stack: &Stack,
    pool: &str,
    name: &str,
    job: Option<runyard_events::JobKey>,
) {
    let bus = runyard_bus::Bus::connect(&stack.nats.url(), stack.ns.clone(), "cli-test", false)
        .await
        .unwrap();
    let now = runyard_events::timestamp(time::OffsetDateTime::now_utc());
    let event = Event {
        id: runyard_events::runner_event_id(name, "requested"),
        occurred_at: Some(now),
        received_at: Some(now),
        source: Some(Source {
            producer: "cli-test".into(),
            ..Source::default()
        }),
        body: Some(Body::RunnerRequested(RunnerRequested {
            runner: Some(RunnerRef {
                pool: pool.into(),
                name: name.into(),
                ..RunnerRef::default()
            }),
            reason: if job.is_some() {
                "queued_job"
            } else {
                "min_idle"
            }
            .into(),
            flavor: "small".into(),
            job,
            ..RunnerRequested::default()
        })),
    };
    let subject = stack.ns.runner_subject(pool, "requested");
    bus.publish_prepared(runyard_bus::Prepared::new(
        subject,
        &event.id,
        event.encode_to_vec().into(),
    ))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_runners_pools_and_recommend_answer_from_the_stack() {
    let stack = Stack::start().await;
    let dir = stack.fixtures();
    // Two more builds of the report's workload: the model wants three.
    let mut report: Value =
        serde_json::from_str(&runyard_testkit::fixture("usage_report.json")).unwrap();
    // Their jobs' hooks too (sorted before the reports): a report trains
    // only on the ref its job's webhook confirms.
    let mut hook: Value =
        serde_json::from_str(&runyard_testkit::fixture("gitlab_job_failed.json")).unwrap();
    for n in [1u64, 2] {
        report["job_id"] = Value::from(4711 + 1000 * n);
        report["peak_memory_bytes"] = Value::from(9_123_456_789 + n * 100_000_000);
        std::fs::write(dir.join(format!("usage_{n}.json")), report.to_string()).unwrap();
        hook["build_id"] = Value::from(4711 + 1000 * n);
        std::fs::write(
            dir.join(format!("gitlab_job_failed_{n}.json")),
            hook.to_string(),
        )
        .unwrap();
    }
    let o = runyard(&stack.target, &["replay", &dir.display().to_string()]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    publish_runner_requested(&stack, "cli-test", "ry-cli-test-0123456789", None).await;

    // Jobs, once projected.
    let jobs = eventually(WAIT, || async {
        let o = runyard(&stack.target, &["jobs", "--json"]).await;
        let v = json(&o);
        (v["jobs"].as_array().map_or(0, Vec::len) == 4).then_some(v)
    })
    .await
    .expect("every job projected");
    let ids: Vec<u64> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_u64().unwrap())
        .collect();
    assert!(ids.contains(&21870573124) && ids.contains(&4711), "{ids:?}");
    let o = runyard(&stack.target, &["jobs", "--status", "queued", "--json"]).await;
    let queued = json(&o);
    assert_eq!(queued["jobs"].as_array().unwrap().len(), 1, "{queued:#}");
    assert_eq!(queued["jobs"][0]["forge"], "github");
    let o = runyard(&stack.target, &["jobs", "--forge", "gitlab"]).await;
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    assert!(text.starts_with("FORGE"), "{text}");
    assert!(
        text.contains("4711") && !text.contains("21870573124"),
        "{text}"
    );
    // Bad filters: exit 2, the value named.
    let o = runyard(&stack.target, &["jobs", "--status", "running"]).await;
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("\"running\""), "{}", stderr(&o));
    let o = runyard(&stack.target, &["jobs", "--forge", "bitbucket"]).await;
    assert_eq!(code(&o), 2);

    // Runners.
    let runners = eventually(WAIT, || async {
        let o = runyard(&stack.target, &["runners", "--pool", "cli-test", "--json"]).await;
        let v = json(&o);
        (v["runners"].as_array().map_or(0, Vec::len) == 1).then_some(v)
    })
    .await
    .expect("the runner projected");
    assert_eq!(runners["runners"][0]["name"], "ry-cli-test-0123456789");
    assert_eq!(runners["runners"][0]["state"], "requested");
    let o = runyard(&stack.target, &["runners", "--pool", "other", "--json"]).await;
    assert_eq!(json(&o)["runners"].as_array().unwrap().len(), 0);
    let o = runyard(&stack.target, &["runners"]).await;
    assert!(
        stdout(&o).contains("ry-cli-test-0123456789"),
        "{}",
        stdout(&o)
    );

    // Pools, from the scaler.
    let o = runyard(&stack.target, &["pools", "--json"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let pools = json(&o);
    assert_eq!(pools["pools"][0]["name"], "cli-test", "{pools:#}");
    assert_eq!(pools["pools"][0]["max_runners"], 3);
    let o = runyard(&stack.target, &["pools"]).await;
    let text = stdout(&o);
    // Webhook pools only: the one table, as it always was.
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        lines[0], "POOL      DESIRED  ACTUAL  IDLE  CREATING  BUSY  QUEUED  MIN  MAX",
        "{text}"
    );
    assert!(lines[1].starts_with("cli-test "), "{text}");

    // The queue, from the scaler: the queued job and why it has no runner
    // (no pool of this stack has its `gpu` label).
    let queue = eventually(WAIT, || async {
        let v = json(&runyard(&stack.target, &["queue", "--json"]).await);
        (v["jobs"].as_array().map_or(0, Vec::len) == 1).then_some(v)
    })
    .await
    .expect("the queued job in the scaler's queue");
    assert_eq!(queue["jobs"][0]["job_id"], 21_870_573_124_u64, "{queue:#}");
    assert_eq!(queue["jobs"][0]["reason"], "no_matching_pool", "{queue:#}");
    assert!(queue["jobs"][0]["pool"].is_null(), "{queue:#}");
    let o = runyard(&stack.target, &["queue"]).await;
    let text = stdout(&o);
    assert!(
        text.starts_with("AGE") && text.contains("REASON") && text.contains("21870573124"),
        "{text}"
    );

    // A recommendation from the usage report's history.
    let workload = [
        "--workload",
        "package=py-torch",
        "--workload",
        "version=2.3.1",
        "--workload",
        "compiler=gcc",
        "--workload",
        "compiler_version=12.3.0",
        "--workload",
        "variants=+cuda~rocm",
        "--ref",
        "develop",
    ];
    let rec = eventually(WAIT, || async {
        let mut args = vec!["recommend", "--json"];
        args.extend(workload);
        let o = runyard(&stack.target, &args).await;
        let v = json(&o);
        (v["basis"]["samples"].as_u64() >= Some(3)).then_some(v)
    })
    .await
    .expect("the allocator learned the reports");
    assert!(
        rec["memory_limit_bytes"].as_u64().unwrap() >= 9_123_456_789,
        "{rec:#}"
    );
    assert!(
        rec["variables"]["KUBERNETES_MEMORY_LIMIT"].is_string(),
        "{rec:#}"
    );
    let mut args = vec!["recommend"];
    args.extend(workload);
    let o = runyard(&stack.target, &args).await;
    assert_eq!(code(&o), 0);
    assert!(
        stdout(&o).contains("KUBERNETES_MEMORY_LIMIT"),
        "{}",
        stdout(&o)
    );
    // With the workload's history: its reports, oldest first, each peak
    // against the limit it ran with, beside the new limit.
    let mut args = vec!["recommend", "--json", "--history", "10"];
    args.extend(workload);
    let with = json(&runyard(&stack.target, &args).await);
    let past = with["history"].as_array().unwrap();
    let mut ids: Vec<u64> = past.iter().map(|h| h["job_id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [4711, 5711, 6711], "{with:#}");
    assert!(
        past.iter()
            .all(|h| h["memory_limit_bytes"] == 12_000_000_000_u64
                && h["oom_killed"] == false
                && h["peak_memory_bytes"].as_u64() >= Some(9_123_456_789)),
        "{with:#}"
    );
    assert!(
        with["basis"]["workload_samples"].as_u64() >= Some(3),
        "{with:#}"
    );
    let mut args = vec!["recommend", "--history", "2"];
    args.extend(workload);
    let text = stdout(&runyard(&stack.target, &args).await);
    assert!(
        text.contains("CHART") && text.contains('#') && text.contains("the new limit"),
        "{text}"
    );
    assert_eq!(text.matches("/1 ").count(), 2, "two reports: {text}");
    let o = runyard(&stack.target, &["recommend", "--workload", "package"]).await;
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("KEY=VALUE"), "{}", stderr(&o));
    // The token came from RUNYARD_ALLOCATOR_CLIENT_TOKEN; a wrong one is
    // refused and the CLI says which setting to fix.
    let mut args = vec!["recommend", "--allocator-token", "not-the-token"];
    args.extend(workload);
    let o = runyard(&stack.target, &args).await;
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unknown token") && stderr(&o).contains("--allocator-token"),
        "{}",
        stderr(&o)
    );
    stack.db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_replays_the_log_into_a_fresh_projection() {
    let stack = Stack::start().await;
    let dir = stack.fixtures();
    let o = runyard(&stack.target, &["replay", &dir.display().to_string()]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let into = format!("{}_rb", stack.db.name);
    let o = runyard(&stack.target, &["rebuild", "--into", &into, "--json"]).await;
    let summary = json(&o);
    assert_eq!(code(&o), 0, "{summary:#}\n{}", stderr(&o));
    assert_eq!(summary["database"], into.as_str());
    // The three deliveries' events and whatever the services published
    // meanwhile (the scaler's retry decision for the failed GitLab job),
    // every one applied.
    let applied = summary["applied"].as_u64().unwrap();
    assert!(applied >= 3, "{summary:#}");
    assert_eq!(summary["through"], applied, "{summary:#}");
    assert_eq!(summary["skipped"], 0, "{summary:#}");
    let rebuilt = stack.db.sibling(&into);
    let pool = sqlx::PgPool::connect(&rebuilt).await.unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 2);
    pool.close().await;
    // Into the live database: refused, nothing done.
    let o = runyard(&stack.target, &["rebuild", "--into", &stack.db.name]).await;
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("live database"), "{}", stderr(&o));
    runyard_store::drop_database(&rebuilt).await.unwrap();

    // Swapped in: the live name holds the rebuilt projection, the old one
    // is kept under another name, and the CLI reads the new one.
    let o = runyard(&stack.target, &["rebuild", "--swap", "--json"]).await;
    let summary = json(&o);
    assert_eq!(code(&o), 0, "{summary:#}\n{}", stderr(&o));
    assert_eq!(summary["swapped"], true);
    assert_eq!(summary["database"], stack.db.name.as_str());
    let o = runyard(&stack.target, &["jobs", "--json"]).await;
    assert_eq!(
        json(&o)["jobs"].as_array().unwrap().len(),
        2,
        "{}",
        stdout(&o)
    );
    let admin = sqlx::PgPool::connect(&stack.db.sibling("postgres"))
        .await
        .unwrap();
    let old: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1")
            .bind(format!("{}\\_old\\_%", stack.db.name))
            .fetch_all(&admin)
            .await
            .unwrap();
    assert_eq!(old.len(), 1, "{old:?}");
    for name in old {
        runyard_store::drop_database(&stack.db.sibling(&name))
            .await
            .unwrap();
    }
    admin.close().await;
    stack.db.drop_db().await;
}

#[test]
fn usage_errors_exit_2() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_runyard"))
        .args(["jobs", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_runyard"))
        .args(["doctor", "--skip", "nonesuch"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nonesuch"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_and_recommend_work_on_a_stack_with_mtls_everywhere() {
    let pki = TestPki::new();
    let stack = Stack::start_with(Some(&pki)).await;
    let t = &stack.target;
    let out = runyard(t, &["doctor", "--json"]).await;
    let report = json(&out);
    assert_eq!(code(&out), 0, "{report:#}\n{}", stderr(&out));
    let checks = checks(&report);
    for id in [
        "ingest.ready",
        "job-tracker.ready",
        "allocator.ready",
        "scaler.ready",
        "allocator.grpc",
    ] {
        assert_eq!(checks[id].0, "ok", "{id}: {:?}", checks[id]);
    }
    let out = runyard(
        t,
        &[
            "recommend",
            "--json",
            "--workload",
            "repo=acme/app",
            "--workload",
            "job=build",
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        json(&out)["memory_limit_bytes"]
            .as_u64()
            .is_some_and(|m| m > 0)
    );

    // Without the client certificate every service refuses the CLI.
    let bare = Target {
        tls: Some([
            pki.ca_file.clone(),
            std::path::PathBuf::new(),
            std::path::PathBuf::new(),
        ]),
        ..t.clone()
    };
    let out = runyard(&bare, &["doctor", "--json"]).await;
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let checks = self::checks(&json(&out));
    for id in ["ingest.ready", "scaler.ready", "allocator.grpc"] {
        assert_eq!(checks[id].0, "fail", "{id}: {:?}", checks[id]);
    }
    // Half a client identity is a usage error naming both variables.
    let half = Target {
        tls: Some([
            pki.ca_file.clone(),
            pki.client.cert.clone(),
            std::path::PathBuf::new(),
        ]),
        ..t.clone()
    };
    let out = runyard(&half, &["recommend", "--workload", "repo=acme/app"]).await;
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("RUNYARD_ALLOCATOR_CLIENT_CERT")
            && stderr(&out).contains("RUNYARD_ALLOCATOR_CLIENT_KEY"),
        "{}",
        stderr(&out)
    );
    drop(stack);
}
