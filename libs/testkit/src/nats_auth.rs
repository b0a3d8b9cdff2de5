//! A nats-server running the accounts, users and permissions runyard ships
//! (`deploy/nats-auth.conf`, the file docker-compose.yml and the
//! Kubernetes manifests use): the very text the deployment runs, with a
//! fresh random password per user in the server's environment, as
//! `scripts/gen-secrets.sh` makes them. The shipped file names the
//! namespace `runyard`, so a test on it uses that namespace (on a server
//! of its own).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;

use crate::{free_port, nats_server_bin};

/// Each user of the shipped file and the variable its password comes from.
pub const USERS: [(&str, &str); 5] = [
    ("ingest", "RUNYARD_NATS_INGEST_PASSWORD"),
    ("job-tracker", "RUNYARD_NATS_TRACKER_PASSWORD"),
    ("allocator", "RUNYARD_NATS_ALLOCATOR_PASSWORD"),
    ("scaler", "RUNYARD_NATS_SCALER_PASSWORD"),
    ("cli", "RUNYARD_NATS_CLI_PASSWORD"),
];

/// The namespace the shipped file is written for.
pub const NAMESPACE: &str = "runyard";

/// The shipped accounts and permissions (`deploy/nats-auth.conf`).
pub fn shipped_auth_conf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats-auth.conf")
}

/// A nats-server with JetStream and the shipped `nats-auth.conf`, killed
/// when dropped.
#[derive(Debug)]
pub struct SecuredNats {
    port: u16,
    passwords: BTreeMap<&'static str, String>,
    _dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl SecuredNats {
    /// Starts the server on a free port and waits until it listens.
    pub async fn start() -> Self {
        #[allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // A copy next to the server's own file: `include` is relative to
        // the including file, as in the deployment.
        #[allow(clippy::unwrap_used)]
        std::fs::copy(shipped_auth_conf(), dir.path().join("nats-auth.conf")).unwrap();
        let conf = dir.path().join("nats.conf");
        #[allow(clippy::unwrap_used)]
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{port}\nmax_payload: 32MB\n\
                 jetstream {{ store_dir: {:?}, max_file_store: 1P }}\n\
                 include ./nats-auth.conf\n",
                dir.path().join("jetstream").display().to_string()
            ),
        )
        .unwrap();
        let passwords: BTreeMap<&'static str, String> = USERS
            .iter()
            .map(|(user, _)| (*user, random_password()))
            .collect();
        let log = dir.path().join("nats.log");
        #[allow(clippy::unwrap_used)]
        let log_file = std::fs::File::create(&log).unwrap();
        let mut command = tokio::process::Command::new(nats_server_bin());
        command
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        for (user, var) in USERS {
            command.env(var, &passwords[user]);
        }
        #[allow(clippy::unwrap_used)]
        let mut child = command.spawn().unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            assert!(
                !exited && std::time::Instant::now() < deadline,
                "nats-server with the shipped nats-auth.conf did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Self {
            port,
            passwords,
            _dir: dir,
            _child: child,
        }
    }

    /// The client URL, without credentials.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client URL with `user`'s name and password in it.
    ///
    /// # Panics
    ///
    /// When `user` is not one of [`USERS`].
    pub fn url_as(&self, user: &str) -> String {
        format!(
            "nats://{user}:{}@127.0.0.1:{}",
            self.password(user),
            self.port
        )
    }

    /// `user`'s password.
    ///
    /// # Panics
    ///
    /// When `user` is not one of [`USERS`].
    pub fn password(&self, user: &str) -> &str {
        self.passwords
            .get(user)
            .unwrap_or_else(|| panic!("{user} is not a user of nats-auth.conf"))
    }

    /// A client logged in as `user` whose server errors (permission
    /// violations among them) arrive on the receiver, as the text the
    /// server sent.
    pub async fn client_as(
        &self,
        user: &str,
    ) -> (
        async_nats::Client,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        #[allow(clippy::unwrap_used)]
        let client = async_nats::ConnectOptions::with_user_and_password(
            user.to_owned(),
            self.password(user).to_owned(),
        )
        .custom_inbox_prefix(format!("_INBOX.{user}"))
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
            }
        })
        .connect(self.url())
        .await
        .unwrap();
        (client, rx)
    }
}

/// Runs `binary` logged in as `user` with its password in
/// `RUNYARD_NATS_URL` (`nats://user:<password>@…`), `RUST_LOG=debug`,
/// JSON logs, the shipped namespace and `env` (nothing else of this
/// process's environment), until its log shows the NATS client's
/// connection attempt, the connection made and `until` (a sign of the
/// service at work), or 30 s pass; then kills it and returns everything it
/// wrote to stdout and stderr.
pub async fn debug_log_of(
    nats: &SecuredNats,
    binary: &std::path::Path,
    user: &str,
    env: &[(&str, &str)],
    until: &str,
) -> String {
    #[allow(clippy::unwrap_used)]
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.log");
    #[allow(clippy::unwrap_used)]
    let file = std::fs::File::create(&path).unwrap();
    #[allow(clippy::unwrap_used)]
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUNYARD_NATS_URL", nats.url_as(user))
        .env("RUNYARD_NAMESPACE", NAMESPACE)
        .env("RUST_LOG", "debug")
        .env("RUNYARD_LOG_FORMAT", "json")
        .envs(env.iter().copied())
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let done = text.contains("attempting connection")
            && text.contains("connected successfully")
            && text.contains(until);
        if done || std::time::Instant::now() > deadline {
            break;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _ = child.kill().await;
    std::fs::read_to_string(&path).unwrap_or_default()
}

/// Checks what [`debug_log_of`] returned: the client's debug lines are
/// there (so the test saw the lines that once carried the URL's password)
/// and the password is not.
///
/// # Panics
///
/// When a check fails, with the log.
pub fn assert_no_password(nats: &SecuredNats, user: &str, log: &str) {
    assert!(
        log.contains("attempting connection") && log.contains("connected successfully"),
        "the client's connection lines are missing (did it start?):\n{log}"
    );
    let password = nats.password(user);
    assert!(
        !log.contains(password),
        "{user}'s NATS password is in the log:\n{log}"
    );
}

/// A password as `scripts/gen-secrets.sh` makes one for NATS: `n` and 64
/// random hex characters (nats-server parses the variable as a
/// configuration value, so it must start with a letter).
fn random_password() -> String {
    use rand::Rng as _;
    let bytes: [u8; 32] = rand::rng().random();
    format!("n{}", hex::encode(bytes))
}
