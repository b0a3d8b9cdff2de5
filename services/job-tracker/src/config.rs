//! Typed, layered configuration (defaults → TOML → `RUNYARD_*` env).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything `runyard-job-tracker` can be told.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `RUNYARD_NATS_URL`.
    pub nats_url: String,
    /// `RUNYARD_NAMESPACE`.
    pub namespace: String,
    /// `RUNYARD_DATABASE_URL`.
    pub database_url: String,
    /// `RUNYARD_TRACKER_HTTP_LISTEN` (`/healthz`, `/readyz`, `/metrics`).
    pub tracker_http_listen: SocketAddr,
    /// `RUNYARD_TRACKER_BATCH_SIZE`: most events applied per transaction.
    pub tracker_batch_size: usize,
    /// `RUNYARD_TRACKER_BATCH_WAIT`: longest wait to fill a batch.
    #[serde(with = "humantime_serde")]
    pub tracker_batch_wait: Duration,
    /// `RUNYARD_TRACKER_MAX_ATTEMPTS`: deliveries of an undecodable message
    /// before it is dead-lettered.
    pub tracker_max_attempts: u32,
    /// `RUNYARD_TRACKER_ACK_WAIT`: how long JetStream waits for an ack before
    /// redelivering (to this or another replica).
    #[serde(with = "humantime_serde")]
    pub tracker_ack_wait: Duration,
    /// `RUNYARD_DATABASE_POOL_SIZE`.
    pub database_pool_size: u32,
    /// `RUNYARD_TRACKER_TLS_CERT`: PEM certificate chain; with
    /// `RUNYARD_TRACKER_TLS_KEY`, the HTTP listener speaks TLS (the files
    /// are read again when they change).
    pub tracker_tls_cert: Option<PathBuf>,
    /// `RUNYARD_TRACKER_TLS_KEY`: its private key.
    pub tracker_tls_key: Option<PathBuf>,
    /// `RUNYARD_TRACKER_TLS_CLIENT_CA`: clients need a certificate this CA
    /// signed (mTLS).
    pub tracker_tls_client_ca: Option<PathBuf>,
    /// `RUNYARD_INSECURE_DEV=1`: the job-tracker has no secret of its own
    /// to check, but says at start that the stack runs with the checks off;
    /// from the environment only, never the TOML file.
    #[serde(skip)]
    pub insecure_dev: bool,
}

/// Every field, URLs with their credentials redacted (the NATS URL, a
/// comma-separated list, by [`runyard_bus::redact_url`]; the others by
/// [`runyard_store::redact_url`]):
/// a logged or printed configuration shows no password or token.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            nats_url,
            namespace,
            database_url,
            tracker_http_listen,
            tracker_batch_size,
            tracker_batch_wait,
            tracker_max_attempts,
            tracker_ack_wait,
            database_pool_size,
            tracker_tls_cert,
            tracker_tls_key,
            tracker_tls_client_ca,
            insecure_dev,
        } = self;
        f.debug_struct("Config")
            .field("nats_url", &runyard_bus::redact_url(nats_url))
            .field("namespace", namespace)
            .field("database_url", &runyard_store::redact_url(database_url))
            .field("tracker_http_listen", tracker_http_listen)
            .field("tracker_batch_size", tracker_batch_size)
            .field("tracker_batch_wait", tracker_batch_wait)
            .field("tracker_max_attempts", tracker_max_attempts)
            .field("tracker_ack_wait", tracker_ack_wait)
            .field("database_pool_size", database_pool_size)
            .field("tracker_tls_cert", tracker_tls_cert)
            .field("tracker_tls_key", tracker_tls_key)
            .field("tracker_tls_client_ca", tracker_tls_client_ca)
            .field("insecure_dev", insecure_dev)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:4222".into(),
            namespace: "runyard".into(),
            database_url: "postgres://postgres@127.0.0.1:5432/runyard".into(),
            tracker_http_listen: SocketAddr::from(([0, 0, 0, 0], 8082)),
            tracker_batch_size: 1000,
            tracker_batch_wait: Duration::from_millis(50),
            tracker_max_attempts: 3,
            tracker_ack_wait: Duration::from_secs(5),
            database_pool_size: 4,
            tracker_tls_cert: None,
            tracker_tls_key: None,
            tracker_tls_client_ca: None,
            insecure_dev: false,
        }
    }
}

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        let mut config: Self = runyard_config::load(file)?;
        config.insecure_dev = runyard_config::secrets::insecure_dev_from_env()
            .map_err(|e| Box::new(figment::Error::from(e.to_string())))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let config = Config {
            nats_url: format!("nats://tracker:{secret}@nats:4222"),
            database_url: format!("postgres://runyard:{secret}@db:5432/runyard"),
            ..Config::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(
            shown.contains("postgres://runyard:***@db:5432/runyard"),
            "{shown}"
        );
        assert!(shown.contains("tracker_batch_size: 1000"), "{shown}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn defaults_then_file_then_env() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.tracker_http_listen.to_string(), "0.0.0.0:8082");
            assert_eq!(c.database_url, "postgres://postgres@127.0.0.1:5432/runyard");
            jail.create_file(
                "t.toml",
                "tracker_batch_size = 10\ntracker_batch_wait = \"5ms\"\n",
            )?;
            jail.set_env("RUNYARD_TRACKER_BATCH_SIZE", "20");
            jail.set_env("RUNYARD_GITHUB_WEBHOOK_SECRET", "other service's");
            let c = Config::load(Some(Path::new("t.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.tracker_batch_size, 20);
            assert_eq!(c.tracker_batch_wait, Duration::from_millis(5));
            jail.create_file("bad.toml", "batch = 1\n")?;
            assert!(Config::load(Some(Path::new("bad.toml"))).is_err());
            assert!(!c.insecure_dev);
            jail.set_env("RUNYARD_INSECURE_DEV", "1");
            assert!(Config::load(None).map_err(|e| e.to_string())?.insecure_dev);
            jail.set_env("RUNYARD_INSECURE_DEV", "true");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.starts_with("RUNYARD_INSECURE_DEV:"), "{e}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn tls_files_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_TRACKER_TLS_CERT", "/tls/tls.crt");
            jail.set_env("RUNYARD_TRACKER_TLS_KEY", "/tls/tls.key");
            jail.set_env("RUNYARD_TRACKER_TLS_CLIENT_CA", "/tls/ca.crt");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.tracker_tls_cert, Some(PathBuf::from("/tls/tls.crt")));
            assert_eq!(c.tracker_tls_key, Some(PathBuf::from("/tls/tls.key")));
            assert_eq!(c.tracker_tls_client_ca, Some(PathBuf::from("/tls/ca.crt")));
            Ok(())
        });
    }
}
