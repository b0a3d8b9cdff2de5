//! Typed, layered configuration (defaults → TOML → `RUNYARD_*` env).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything `runyard-job-tracker` can be told.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The event log: `RUNYARD_NATS_URL` and `RUNYARD_NAMESPACE`.
    pub bus: runyard_config::Bus,
    /// The projection: `RUNYARD_DATABASE_URL`.
    pub database: runyard_config::Database,
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
    /// `RUNYARD_TRACKER_TLS_CERT`, `_KEY` and `_CLIENT_CA`: the HTTP
    /// listener's.
    pub tls: runyard_config::Tls,
    /// `RUNYARD_INSECURE_DEV=1`: the job-tracker has no secret of its own
    /// to check, but says at start that the stack runs with the checks off;
    /// from the environment only, never the TOML file.
    #[serde(skip)]
    pub insecure_dev: bool,
}

/// Every field under its key, URLs with their credentials redacted (by
/// [`runyard_config::redact`]):
/// a logged or printed configuration shows no password or token.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            bus,
            database,
            tracker_http_listen,
            tracker_batch_size,
            tracker_batch_wait,
            tracker_max_attempts,
            tracker_ack_wait,
            database_pool_size,
            tls,
            insecure_dev,
        } = self;
        let mut d = f.debug_struct("Config");
        bus.show(&mut d);
        database.show(&mut d);
        tls.show(&mut d, TLS_PREFIX);
        d.field("tracker_http_listen", tracker_http_listen)
            .field("tracker_batch_size", tracker_batch_size)
            .field("tracker_batch_wait", tracker_batch_wait)
            .field("tracker_max_attempts", tracker_max_attempts)
            .field("tracker_ack_wait", tracker_ack_wait)
            .field("database_pool_size", database_pool_size)
            .field("insecure_dev", insecure_dev)
            .finish()
    }
}

/// The keys of the listener's TLS settings start with this.
const TLS_PREFIX: &str = "tracker_tls_";

impl runyard_config::Settings for Config {
    fn flat() -> Vec<runyard_config::Flat> {
        vec![
            runyard_config::Bus::flat(),
            runyard_config::Database::flat(),
            runyard_config::Tls::flat(TLS_PREFIX),
        ]
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bus: runyard_config::Bus::default(),
            database: runyard_config::Database::default(),
            tracker_http_listen: SocketAddr::from(([0, 0, 0, 0], 8082)),
            tracker_batch_size: 1000,
            tracker_batch_wait: Duration::from_millis(50),
            tracker_max_attempts: 3,
            tracker_ack_wait: Duration::from_secs(5),
            database_pool_size: 4,
            tls: runyard_config::Tls::default(),
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
    use std::path::PathBuf;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let config = Config {
            bus: runyard_config::Bus {
                nats_url: format!("nats://tracker:{secret}@nats:4222"),
                ..Default::default()
            },
            database: runyard_config::Database {
                url: format!("postgres://runyard:{secret}@db:5432/runyard"),
            },
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
            assert_eq!(c.database.url, "postgres://postgres@127.0.0.1:5432/runyard");
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
            assert_eq!(c.tls.cert, Some(PathBuf::from("/tls/tls.crt")));
            assert_eq!(c.tls.key, Some(PathBuf::from("/tls/tls.key")));
            assert_eq!(c.tls.client_ca, Some(PathBuf::from("/tls/ca.crt")));
            Ok(())
        });
    }
}
