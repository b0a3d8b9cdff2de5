//! The scaler under test: a real nats-server (a namespace per test), a
//! fake GitHub on loopback, the `process` provider starting real processes,
//! and helpers to play the forge's part (jobs queued, started, finished).

pub mod hooks;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use runyard_bus::{Bus, TraceParent};
use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, Namespace, Source, timestamp,
};
use runyard_scaler::{App, Config, ScalerFile};
use runyard_testkit::fake_github::FakeGitHub;
use runyard_testkit::{TestNats, unique_namespace};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Deadline of every wait.
pub const WAIT: Duration = Duration::from_secs(60);

/// The pool every test uses unless it says otherwise: org `acme`, labels
/// `self-hosted, linux`, the `local` process provider.
pub fn pool_toml(max_runners: u32, min_idle: u32, extra: &str) -> String {
    format!(
        r#"
[[pools]]
name = "linux"
forge = "github"
scope = {{ org = "acme" }}
labels = ["self-hosted", "linux", "x64"]
provider = "local"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}, {{ name = "large", memory = "16GiB", cpus = 8 }}]
min_idle = {min_idle}
max_runners = {max_runners}
idle_timeout = "1s"
bootstrap_timeout = "30s"
{extra}
"#
    )
}

/// A GitLab pool: project 34 on `gitlab.example.com`, tags `docker, linux`,
/// the `local` provider.
pub const GITLAB_POOL: &str = r#"
[[pools]]
name = "gl-docker"
forge = "gitlab"
scope = { project_id = 34 }
instance = "gitlab.example.com"
labels = ["docker", "linux"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 3
"#;

/// Short timers for tests.
pub const TIMERS: &str = r#"
[scaler]
idle_backoff = "1s"
busy_confirmation = "3s"
lease_ttl = "2s"
create_backoff = "100ms"
create_backoff_max = "400ms"
tick = "100ms"
sync_interval = "1s"
allocator_timeout = "200ms"
forge_timeout = "5s"
rate_limit_probe = "100ms"
"#;

/// A running scaler.
pub struct Scaler {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    /// Its HTTP address.
    pub addr: SocketAddr,
    /// Its instance metadata API's address, when it serves one.
    pub metadata: Option<SocketAddr>,
}

impl Scaler {
    /// Stops it gracefully.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = self.task.await;
    }

    /// Kills it without a goodbye (its leases stay until they expire).
    pub fn kill(mut self) {
        self.stop.take();
        self.task.abort();
    }

    /// One series' value on its `/metrics`, when present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let page = reqwest::get(format!("http://{}/metrics", self.addr))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.trim().parse().expect("a number"))
    }

    /// `GET /v1/queue`.
    pub async fn queue(&self) -> serde_json::Value {
        self.get_json("/v1/queue").await
    }

    /// `GET /v1/pools`.
    pub async fn pools(&self) -> serde_json::Value {
        self.get_json("/v1/pools").await
    }

    async fn get_json(&self, path: &str) -> serde_json::Value {
        reqwest::get(format!("http://{}{path}", self.addr))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .await
            .expect("json")
    }
}

/// Everything one test needs.
pub struct Stack {
    /// The NATS server.
    pub nats: TestNats,
    /// The namespace.
    pub ns: Namespace,
    /// A client publishing as the forge's webhooks would.
    pub bus: Bus,
    /// The fake GitHub.
    pub github: FakeGitHub,
    /// Where the process provider keeps its pid files.
    pub state_dir: tempfile::TempDir,
    /// The scaler's pools-and-providers file.
    pub file: String,
    next: std::sync::atomic::AtomicU64,
}

impl Stack {
    /// A stack whose scaler file is `pools` plus the short timers and a
    /// `local` process provider running `sleep`.
    pub async fn new(pools: &str) -> Self {
        Self::with_provider(
            pools,
            r#"
[providers.local]
kind = "process"
command = ["/bin/sleep", "3600"]
"#,
        )
        .await
    }

    /// Like [`Stack::new`] with the provider section given.
    pub async fn with_provider(pools: &str, providers: &str) -> Self {
        runyard_telemetry::install_crypto_provider();
        let nats = TestNats::get().await;
        let ns = unique_namespace();
        let bus = Bus::connect(&nats.url(), ns.clone(), "scaler-test", false)
            .await
            .expect("nats");
        bus.ensure_streams(&Default::default())
            .await
            .expect("streams");
        let github = FakeGitHub::start().await;
        let state_dir = tempfile::tempdir().expect("tempdir");
        let file = format!(
            "{providers}\n{pools}\n{TIMERS}state_dir = {:?}\n",
            state_dir.path().display().to_string()
        );
        Self {
            nats,
            ns,
            bus,
            github,
            state_dir,
            file,
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The scaler's service settings for this stack.
    pub fn config(&self) -> Config {
        Config {
            bus: runyard_config::Bus {
                nats_url: self.nats.url(),
                namespace: self.ns.to_string(),
            },
            // No projection: the log alone says what started.
            database: runyard_config::Database {
                url: "postgres://postgres@127.0.0.1:1/none".into(),
            },
            scaler_http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            github_api_url: self.github.url(),
            github_token: Some("test-token".to_owned().into()),
            // Nothing listens there: sizing falls back to the first flavor.
            allocator_url: "http://127.0.0.1:1".into(),
            scaler_metadata_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            scaler_instance_token_key: Some(
                "e6ba5d7d4016a15dcba16e8905f88fea35bfdd5cfeeb02b8bb711d5885495b87"
                    .to_owned()
                    .into(),
            ),
            ..Config::default()
        }
    }

    /// Starts a scaler in this process.
    pub async fn start(&self) -> Scaler {
        self.start_with(self.config()).await
    }

    /// Starts a scaler with these settings.
    pub async fn start_with(&self, config: Config) -> Scaler {
        let file = ScalerFile::parse(&self.file).expect("valid scaler file");
        let app = App::build(config, Some(file)).await.expect("scaler builds");
        let addr = app.local_addr();
        let metadata = app.metadata_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run(async move {
            let _ = rx.await;
        }));
        Scaler {
            stop: Some(tx),
            task,
            addr,
            metadata,
        }
    }

    /// Writes the scaler file and returns its path (for the binary).
    pub fn write_file(&self) -> PathBuf {
        let path = self.state_dir.path().join("scaler.toml");
        std::fs::write(&path, &self.file).expect("write scaler file");
        path
    }

    /// Publishes a `workflow_job` observation as ingest would, with a
    /// delivery id of its own.
    pub async fn observe(&self, job_id: u64, status: JobStatus, runner: &str, labels: &[&str]) {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.publish(job_event(
            &format!("github:d{n}-{job_id}"),
            job_id,
            status,
            runner,
            labels,
        ))
        .await;
    }

    /// Publishes an event.
    pub async fn publish(&self, event: Event) {
        self.bus
            .publish_event(&event, &TraceParent::new_root())
            .await
            .expect("publish");
    }

    /// Waits until `scaler`'s engine has acted on everything logged so far
    /// and has nothing left to do ([`settled`]).
    pub async fn settled(&self, scaler: &Scaler) {
        settled(
            "engine",
            async || scaler.pools().await,
            async || publish_marker(&self.bus, &self.next).await,
        )
        .await;
    }

    /// `queued` with the pool's labels.
    pub async fn queued(&self, job_id: u64) {
        self.observe(job_id, JobStatus::Queued, "", &["self-hosted", "Linux"])
            .await;
    }

    /// `in_progress` on `runner`.
    pub async fn started(&self, job_id: u64, runner: &str) {
        self.observe(
            job_id,
            JobStatus::InProgress,
            runner,
            &["self-hosted", "linux"],
        )
        .await;
    }

    /// `completed` on `runner` (empty: cancelled before it ran).
    pub async fn completed(&self, job_id: u64, runner: &str) {
        self.observe(
            job_id,
            JobStatus::Completed,
            runner,
            &["self-hosted", "linux"],
        )
        .await;
    }

    /// JIT configs the fake GitHub handed out.
    pub fn jit_calls(&self) -> usize {
        self.github
            .count("POST", "/orgs/acme/actions/runners/generate-jitconfig")
    }

    /// Names of runner processes alive now (pid files whose process runs).
    pub fn live_processes(&self) -> HashSet<String> {
        live(self.state_dir.path())
    }

    /// Every event of the namespace, decoded.
    pub async fn events(&self) -> Vec<Event> {
        let msgs =
            runyard_testkit::stream_messages(self.bus.client(), &self.ns.events_stream()).await;
        runyard_testkit::decode_events(&msgs)
    }

    /// Runner events of one kind (`RunnerCreated`, ...).
    pub async fn runner_events(&self, kind: &str) -> Vec<Event> {
        self.events()
            .await
            .into_iter()
            .filter(|e| runyard_events::event_type(e) == kind)
            .collect()
    }
}

impl Drop for Stack {
    /// Stops every runner process a test left (a failed test must not leak
    /// them onto the machine).
    fn drop(&mut self) {
        for pid in pids(self.state_dir.path()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn pid_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(providers) = std::fs::read_dir(dir) else {
        return out;
    };
    for provider in providers.flatten().filter(|e| e.path().is_dir()) {
        let Ok(pools) = std::fs::read_dir(provider.path()) else {
            continue;
        };
        for pool in pools.flatten().filter(|e| e.path().is_dir()) {
            let Ok(files) = std::fs::read_dir(pool.path()) else {
                continue;
            };
            out.extend(
                files
                    .flatten()
                    .map(|f| f.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "pid")),
            );
        }
    }
    out
}

fn pids(dir: &Path) -> Vec<i32> {
    pid_files(dir)
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
        .collect()
}

fn live(dir: &Path) -> HashSet<String> {
    pid_files(dir)
        .into_iter()
        .filter(|path| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .and_then(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
                })
                .is_some_and(|s| s != "Z" && s != "X")
        })
        .filter_map(|path| path.file_stem().and_then(|n| n.to_str()).map(str::to_owned))
        .collect()
}

/// A `JobObserved` as ingest makes it from a `workflow_job` delivery.
pub fn job_event(id: &str, job_id: u64, status: JobStatus, runner: &str, labels: &[&str]) -> Event {
    let now = timestamp(time::OffsetDateTime::now_utc());
    Event {
        id: id.to_owned(),
        occurred_at: Some(now),
        received_at: Some(now),
        source: Some(Source {
            forge: Forge::Github as i32,
            instance: "github.com".into(),
            delivery_id: id.to_owned(),
            hook_id: String::new(),
            producer: "ingest".into(),
        }),
        body: Some(Body::JobObserved(JobObserved {
            job: Some(JobKey {
                forge: Forge::Github as i32,
                instance: "github.com".into(),
                job_id,
            }),
            project: "acme/app".into(),
            project_id: 1,
            pipeline_id: job_id / 10,
            run_attempt: 1,
            name: format!("build {job_id}"),
            workflow_name: "ci".into(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            status: status as i32,
            conclusion: if status == JobStatus::Completed {
                if runner.is_empty() {
                    Conclusion::Cancelled as i32
                } else {
                    Conclusion::Success as i32
                }
            } else {
                Conclusion::Unspecified as i32
            },
            runner_name: runner.to_owned(),
            r#ref: "main".into(),
            created_at: Some(now),
            ..Default::default()
        })),
    }
}

/// Waits until the scaler's loop `part` (`engine` or `retrier` in
/// `GET /v1/pools`, which `pools` reads) has acted on everything logged so
/// far and has nothing left to do: it has folded in a marker `publish`
/// logs now, run a round after it with no operation under way, twice in a
/// row with no operation started in between (so what the operations it
/// ran before the first marker logged was folded in by the second, and
/// changed nothing). Stricter than waiting a while: a slow scaler is
/// waited for, and a test goes on as soon as it is quiet.
pub async fn settled(
    part: &str,
    pools: impl AsyncFn() -> serde_json::Value,
    publish: impl AsyncFn() -> u64,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut quiet_at: Option<u64> = None;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the scaler's {part} never settled: {}",
            pools().await[part]
        );
        let seq = publish().await;
        let mut applied_in: Option<u64> = None;
        let view = loop {
            let view = pools().await[part].clone();
            let number = |k: &str| view[k].as_u64().expect("progress counters");
            match applied_in {
                None if number("applied_seq") >= seq => applied_in = Some(number("rounds")),
                Some(round) if number("rounds") > round => break view,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let started = view["operations_started"].as_u64().expect("started");
        if view["operations_in_flight"] != 0 {
            quiet_at = None;
        } else if quiet_at == Some(started) {
            return;
        } else {
            quiet_at = Some(started);
        }
    }
}

/// Publishes a [`marker`] numbered from `counter`; returns its sequence.
pub async fn publish_marker(bus: &Bus, counter: &std::sync::atomic::AtomicU64) -> u64 {
    let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    bus.publish_event(&marker(n), &TraceParent::new_root())
        .await
        .expect("publish")
        .sequence
}

/// A job event every loop of the scaler folds in and does nothing about:
/// a completed job of a forge no pool serves.
fn marker(n: u64) -> Event {
    let mut event = job_event(&format!("marker:{n}"), n, JobStatus::Completed, "", &[]);
    if let Some(Body::JobObserved(j)) = &mut event.body
        && let Some(key) = &mut j.job
    {
        key.instance = "settle.invalid".into();
    }
    if let Some(source) = &mut event.source {
        source.instance = "settle.invalid".into();
    }
    event
}

/// Polls until `f` holds or the deadline passes (then panics with `what`).
pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// [`until`] for an async condition.
pub async fn until_async(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scaler processes, killed when the test ends however it ends.
pub struct Replicas(pub Vec<std::process::Child>);

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in &mut self.0 {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

/// A scaler process (the real binary), configured through the environment
/// from `c` (its NATS, namespace, GitHub API and allocator) and the scaler
/// file at `file`; its log goes to a file under `/tmp`.
pub fn spawn_replica(c: &Config, file: &Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_runyard-scaler"))
        .env_clear()
        .env("RUNYARD_NATS_URL", &c.bus.nats_url)
        .env("RUNYARD_NAMESPACE", &c.bus.namespace)
        .env("RUNYARD_DATABASE_URL", &c.database.url)
        .env("RUNYARD_SCALER_HTTP_LISTEN", "127.0.0.1:0")
        .env("RUNYARD_SCALER_CONFIG", file)
        .env("RUNYARD_GITHUB_API_URL", &c.github_api_url)
        .env("RUNYARD_GITHUB_TOKEN", "test-token")
        .env("RUNYARD_ALLOCATOR_URL", &c.allocator_url)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::File::create(format!("/tmp/replica-{}.log", rand::random::<u32>()))
                .expect("a log file"),
        )
        .spawn()
        .expect("scaler binary starts")
}
