//! A PostgreSQL cluster of a test's own (the scripts' private cluster,
//! `scripts/lib.sh` `embedded_postgres_start`), so it can be crashed,
//! restarted or given TLS for real without disturbing the server every
//! other test uses. Stopped and removed on drop.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// One private cluster, trust auth, superuser `postgres`, on loopback.
#[derive(Debug)]
pub struct PrivatePostgres {
    name: String,
    port: u16,
    /// The certificate and key it speaks TLS with, if any.
    tls: Option<(PathBuf, PathBuf)>,
}

impl PrivatePostgres {
    /// Runs `command` after sourcing `scripts/lib.sh`, with `env`; its
    /// trimmed stdout.
    fn shell(command: &str, env: &[(&str, &Path)]) -> String {
        let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("cd {repo} && source scripts/lib.sh && {command}"))
            .envs(env.iter().copied())
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts a cluster named `<prefix>-<pid>` on a free port.
    pub fn start(prefix: &str) -> Self {
        Self::launch(prefix, None)
    }

    /// [`PrivatePostgres::start`], speaking TLS (plaintext still allowed)
    /// with the PEM certificate and key given.
    pub fn start_tls(prefix: &str, cert: &Path, key: &Path) -> Self {
        Self::launch(prefix, Some((cert.to_owned(), key.to_owned())))
    }

    fn launch(prefix: &str, tls: Option<(PathBuf, PathBuf)>) -> Self {
        let mut pg = Self {
            name: format!("{prefix}-{}", std::process::id()),
            port: 0,
            tls,
        };
        pg.port = pg.run_start("").parse().expect("a port");
        pg
    }

    fn run_start(&self, port: &str) -> String {
        let env: Vec<(&str, &Path)> = match &self.tls {
            Some((cert, key)) => vec![
                ("EMBEDDED_POSTGRES_TLS_CERT", cert.as_path()),
                ("EMBEDDED_POSTGRES_TLS_KEY", key.as_path()),
            ],
            None => Vec::new(),
        };
        Self::shell(
            &format!("embedded_postgres_start {} {port}", self.name),
            &env,
        )
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Makes every role but `postgres` prove its password (SCRAM) over TCP,
    /// as a production server does, so a test can rotate a password for
    /// real; `postgres` stays trusted for the test's own setup. Takes
    /// effect at the next configuration reload (`SELECT pg_reload_conf()`).
    pub fn require_passwords(&self) {
        Self::shell(
            &format!(
                "printf '%s\\n' 'local all all trust' \\
                   'host all postgres 127.0.0.1/32 trust' \\
                   'host all all 127.0.0.1/32 scram-sha-256' \\
                   > \"$RUNYARD_STATE_DIR/postgres/{}/data/pg_hba.conf\"",
                self.name
            ),
            &[],
        );
    }

    /// Stops it as a crash would (`immediate`: no checkpoint, open
    /// transactions lost) and starts it again on the same port.
    pub fn crash_and_restart(&self, down: Duration) {
        Self::shell(
            &format!("embedded_postgres_stop {} immediate", self.name),
            &[],
        );
        std::thread::sleep(down);
        let port = self.run_start(&self.port.to_string());
        assert_eq!(port, self.port.to_string(), "restarted on its port");
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let name = &self.name;
        Self::shell(
            &format!(
                "embedded_postgres_stop {name}; rm -rf \"$RUNYARD_STATE_DIR/postgres/{name}\""
            ),
            &[],
        );
    }
}
