//! Typed, layered configuration: defaults → optional TOML file → `RUNYARD_*`
//! environment variables (ARCHITECTURE.md, "Configuration").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use runyard_config::secrets::{self, SecretError};
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

/// Everything `runyard-ingest` can be told.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The event log: `RUNYARD_NATS_URL` and `RUNYARD_NAMESPACE`.
    pub bus: runyard_config::Bus,
    /// `RUNYARD_INGEST_LISTEN`; port 0 binds an ephemeral port.
    pub ingest_listen: SocketAddr,
    /// `RUNYARD_GITHUB_WEBHOOK_SECRET`; unset → the GitHub route answers 503.
    #[serde(skip_serializing)]
    pub github_webhook_secret: Option<SecretString>,
    /// `RUNYARD_GITHUB_WEBHOOK_SECRET_FILE`.
    pub github_webhook_secret_file: Option<PathBuf>,
    /// `RUNYARD_GITLAB_WEBHOOK_TOKEN`; unset → the GitLab route answers 503.
    #[serde(skip_serializing)]
    pub gitlab_webhook_token: Option<SecretString>,
    /// `RUNYARD_GITLAB_WEBHOOK_TOKEN_FILE`.
    pub gitlab_webhook_token_file: Option<PathBuf>,
    /// `RUNYARD_USAGE_TOKEN`: the shared bearer token usage reports may
    /// carry, for setups without CI identity tokens (it lets its holder
    /// report for any job). Unset and no `RUNYARD_USAGE_OIDC` →
    /// `/v1/usage` answers 503.
    #[serde(skip_serializing)]
    pub usage_token: Option<SecretString>,
    /// `RUNYARD_USAGE_TOKEN_FILE`.
    pub usage_token_file: Option<PathBuf>,
    /// `RUNYARD_USAGE_OIDC`: usage reports authenticated by the forge's CI
    /// identity token, from these issuers: comma-separated
    /// `issuer=audience` pairs (see [`crate::oidc::issuer::parse`]).
    pub usage_oidc: String,
    /// `RUNYARD_USAGE_OIDC_REFETCH`: an issuer's keys are fetched again for
    /// a token signed with an unknown key at most this often.
    #[serde(with = "humantime_serde")]
    pub usage_oidc_refetch: Duration,
    /// `RUNYARD_USAGE_OIDC_PROJECTS`: the projects each issuer's tokens may
    /// report for (see [`crate::oidc::issuer::restrict`]).
    pub usage_oidc_projects: String,
    /// `RUNYARD_USAGE_OIDC_RATE`: reports per minute one project's tokens
    /// may send (0 = no limit).
    pub usage_oidc_rate: u32,
    /// `RUNYARD_GITHUB_INSTANCES`: the GitHub hosts deliveries are accepted
    /// from, comma-separated (default `github.com`); a GitHub Enterprise
    /// Server must be listed by its host name.
    pub github_instances: String,
    /// `RUNYARD_INGEST_MAX_BODY` (default 25 MiB, GitHub's payload cap).
    pub ingest_max_body: ByteSize,
    /// `RUNYARD_INGEST_MAX_IN_FLIGHT`: deliveries handled at once; one more
    /// is answered 503 with `Retry-After` at once.
    pub ingest_max_in_flight: usize,
    /// `RUNYARD_INGEST_MAX_IN_FLIGHT_BYTES`: body memory (the buffers as
    /// the bodies arrive, not their declared `Content-Length`) of the
    /// deliveries handled at once; a delivery alone is always let through.
    pub ingest_max_in_flight_bytes: ByteSize,
    /// `RUNYARD_INGEST_MAX_UNVERIFIED_PER_PEER`: GitHub bodies whose
    /// signature is not checked yet (it covers the whole body) that one
    /// client address (an IPv6 /64) may send at once; one more cuts that
    /// address's oldest short with 408.
    pub ingest_max_unverified_per_peer: usize,
    /// `RUNYARD_INGEST_BODY_TIMEOUT`: how long a request head may take (an
    /// idle connection is closed after as long), and then its body (the
    /// forges send theirs within their own 10 s delivery timeout); a slower
    /// body is answered 408.
    #[serde(with = "humantime_serde")]
    pub ingest_body_timeout: Duration,
    /// `RUNYARD_INGEST_ACK_TIMEOUT`: how long a delivery waits for
    /// JetStream before answering 503 (below the forges' 10 s delivery
    /// timeout).
    #[serde(with = "humantime_serde")]
    pub ingest_ack_timeout: Duration,
    /// `RUNYARD_EVENTS_MAX_AGE`: retention of the event log.
    #[serde(with = "humantime_serde")]
    pub events_max_age: Duration,
    /// `RUNYARD_RAW_MAX_AGE`: retention of raw deliveries.
    #[serde(with = "humantime_serde")]
    pub raw_max_age: Duration,
    /// `RUNYARD_EVENTS_MAX_BYTES`: size bound of the event log (full: new
    /// deliveries are refused with 503, nothing stored is dropped); 0 = none.
    pub events_max_bytes: ByteSize,
    /// `RUNYARD_RAW_MAX_BYTES`: size bound of raw deliveries (full: the
    /// oldest go); 0 = none.
    pub raw_max_bytes: ByteSize,
    /// `RUNYARD_STREAM_REPLICAS`: replicas of the event log and raw streams.
    pub streams: runyard_config::Streams,
    /// `RUNYARD_INGEST_TLS_CERT`, `_KEY` and `_CLIENT_CA`: the listener's.
    pub tls: runyard_config::Tls,
    /// `RUNYARD_INSECURE_DEV=1`: start with weak secrets (a WARN names
    /// them); from the environment only, never the TOML file.
    #[serde(skip)]
    pub insecure_dev: bool,
}

/// Every field, the NATS URL with its credentials redacted
/// ([`runyard_config::redact::urls`]) and secrets as `SecretString` shows them:
/// a logged or printed configuration shows no password or token.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            bus,
            ingest_listen,
            github_webhook_secret,
            github_webhook_secret_file,
            gitlab_webhook_token,
            gitlab_webhook_token_file,
            usage_token,
            usage_token_file,
            usage_oidc,
            usage_oidc_refetch,
            usage_oidc_projects,
            usage_oidc_rate,
            github_instances,
            ingest_max_body,
            ingest_max_in_flight,
            ingest_max_in_flight_bytes,
            ingest_max_unverified_per_peer,
            ingest_body_timeout,
            ingest_ack_timeout,
            events_max_age,
            raw_max_age,
            events_max_bytes,
            raw_max_bytes,
            streams,
            tls,
            insecure_dev,
        } = self;
        let mut d = f.debug_struct("Config");
        bus.show(&mut d);
        streams.show(&mut d);
        tls.show(&mut d, TLS_PREFIX);
        d.field("ingest_listen", ingest_listen)
            .field("github_webhook_secret", github_webhook_secret)
            .field("github_webhook_secret_file", github_webhook_secret_file)
            .field("gitlab_webhook_token", gitlab_webhook_token)
            .field("gitlab_webhook_token_file", gitlab_webhook_token_file)
            .field("usage_token", usage_token)
            .field("usage_token_file", usage_token_file)
            .field("usage_oidc", usage_oidc)
            .field("usage_oidc_refetch", usage_oidc_refetch)
            .field("usage_oidc_projects", usage_oidc_projects)
            .field("usage_oidc_rate", usage_oidc_rate)
            .field("github_instances", github_instances)
            .field("ingest_max_body", ingest_max_body)
            .field("ingest_max_in_flight", ingest_max_in_flight)
            .field("ingest_max_in_flight_bytes", ingest_max_in_flight_bytes)
            .field(
                "ingest_max_unverified_per_peer",
                ingest_max_unverified_per_peer,
            )
            .field("ingest_body_timeout", ingest_body_timeout)
            .field("ingest_ack_timeout", ingest_ack_timeout)
            .field("events_max_age", events_max_age)
            .field("raw_max_age", raw_max_age)
            .field("events_max_bytes", events_max_bytes)
            .field("raw_max_bytes", raw_max_bytes)
            .field("insecure_dev", insecure_dev)
            .finish()
    }
}

/// The keys of the listener's TLS settings start with this.
const TLS_PREFIX: &str = "ingest_tls_";

impl runyard_config::Settings for Config {
    fn flat() -> Vec<runyard_config::Flat> {
        vec![
            runyard_config::Bus::flat(),
            runyard_config::Streams::flat(),
            runyard_config::Tls::flat(TLS_PREFIX),
        ]
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bus: runyard_config::Bus::default(),
            ingest_listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            github_webhook_secret: None,
            github_webhook_secret_file: None,
            gitlab_webhook_token: None,
            gitlab_webhook_token_file: None,
            usage_token: None,
            usage_token_file: None,
            usage_oidc: String::new(),
            usage_oidc_refetch: Duration::from_secs(60),
            usage_oidc_projects: String::new(),
            usage_oidc_rate: 600,
            github_instances: runyard_forge::GITHUB_DOT_COM.into(),
            ingest_max_body: ByteSize::mib(25),
            ingest_max_in_flight: 512,
            ingest_max_in_flight_bytes: ByteSize::mib(64),
            ingest_max_unverified_per_peer: 32,
            ingest_body_timeout: Duration::from_secs(10),
            ingest_ack_timeout: Duration::from_secs(5),
            events_max_age: Duration::from_secs(90 * 24 * 3600),
            raw_max_age: Duration::from_secs(7 * 24 * 3600),
            events_max_bytes: ByteSize::gib(8),
            raw_max_bytes: ByteSize::gib(4),
            streams: runyard_config::Streams::default(),
            tls: runyard_config::Tls::default(),
            insecure_dev: false,
        }
    }
}

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value is missing or of the wrong type, or a key is unknown.
    #[error("invalid configuration: {0}")]
    Invalid(#[from] Box<figment::Error>),
    /// A `*_FILE` secret could not be read, or `RUNYARD_INSECURE_DEV` has
    /// a value it cannot have.
    #[error(transparent)]
    Secret(#[from] SecretError),
}

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut config: Config = runyard_config::load(file)?;
        config.resolve_secret_files()?;
        config.insecure_dev = secrets::insecure_dev_from_env()?;
        Ok(config)
    }

    /// Refuses an empty, short or placeholder webhook secret, GitLab token
    /// or usage token (one not set is not checked: its route answers 503),
    /// unless `insecure_dev` ([`secrets::enforce`]).
    pub fn check_secrets(&self) -> Result<(), SecretError> {
        let given = [
            ("RUNYARD_GITHUB_WEBHOOK_SECRET", &self.github_webhook_secret),
            ("RUNYARD_GITLAB_WEBHOOK_TOKEN", &self.gitlab_webhook_token),
            ("RUNYARD_USAGE_TOKEN", &self.usage_token),
        ];
        let set = given
            .iter()
            .filter_map(|(var, value)| value.as_ref().map(|v| (*var, v.expose_secret())));
        secrets::enforce(set, vec![], self.insecure_dev).map(drop)
    }

    /// The accepted GitHub hosts, lower-cased, without a trailing dot.
    pub fn github_instances(&self) -> Vec<String> {
        self.github_instances
            .split(',')
            .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect()
    }

    /// A secret given as a file wins only when the value itself is unset.
    fn resolve_secret_files(&mut self) -> Result<(), ConfigError> {
        let pairs = [
            (
                &mut self.github_webhook_secret,
                &self.github_webhook_secret_file,
                "RUNYARD_GITHUB_WEBHOOK_SECRET_FILE",
            ),
            (
                &mut self.gitlab_webhook_token,
                &self.gitlab_webhook_token_file,
                "RUNYARD_GITLAB_WEBHOOK_TOKEN_FILE",
            ),
            (
                &mut self.usage_token,
                &self.usage_token_file,
                "RUNYARD_USAGE_TOKEN_FILE",
            ),
        ];
        for (value, file, var) in pairs {
            if let (None, Some(path)) = (value.as_ref(), file) {
                *value = Some(secrets::read_file(var, path)?);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let config = Config {
            bus: runyard_config::Bus {
                nats_url: format!("nats://ingest:{secret}@nats:4222"),
                ..Default::default()
            },
            github_webhook_secret: Some(format!("gh{secret}").into()),
            gitlab_webhook_token: Some(format!("gl{secret}").into()),
            usage_token: Some(format!("us{secret}").into()),
            ..Config::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("nats://ingest:***@nats:4222"), "{shown}");
        assert!(shown.contains("ingest_max_in_flight: 512"), "{shown}");
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::default();
        assert_eq!(c.bus.nats_url, "nats://127.0.0.1:4222");
        assert_eq!(c.bus.namespace, "runyard");
        assert_eq!(c.ingest_listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.ingest_max_body, ByteSize::mib(25));
        assert_eq!(
            (c.events_max_bytes, c.raw_max_bytes),
            (ByteSize::gib(8), ByteSize::gib(4))
        );
        assert!(c.github_webhook_secret.is_none());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn file_then_env_layering_and_unknown_keys() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "ingest.toml",
                "namespace = \"fromfile\"\ningest_max_body = \"1MiB\"\n",
            )?;
            jail.create_file("secret", "s3cret \r\n")?;
            jail.set_env("RUNYARD_NAMESPACE", "fromenv");
            jail.set_env("RUNYARD_DATABASE_URL", "postgres://ignored");
            jail.set_env("RUNYARD_GITHUB_WEBHOOK_SECRET_FILE", "secret");
            let c = Config::load(Some(Path::new("ingest.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.bus.namespace, "fromenv");
            assert_eq!(c.ingest_max_body, ByteSize::mib(1));
            use secrecy::ExposeSecret;
            assert_eq!(
                c.github_webhook_secret
                    .as_ref()
                    .map(|s| s.expose_secret().to_owned()),
                Some("s3cret".to_owned())
            );
            jail.create_file("bad.toml", "no_such_key = 1\n")?;
            assert!(Config::load(Some(Path::new("bad.toml"))).is_err());
            jail.set_env("RUNYARD_USAGE_TOKEN_FILE", "absent");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(
                e.starts_with("RUNYARD_USAGE_TOKEN_FILE: reading absent"),
                "{e}"
            );
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn weak_secrets_are_refused_unless_insecure_dev_is_1() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_GITLAB_WEBHOOK_TOKEN", "changeme");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert!(!c.insecure_dev);
            let e = c.check_secrets().err().ok_or("accepted")?.to_string();
            assert!(
                e.contains("RUNYARD_GITLAB_WEBHOOK_TOKEN is a known placeholder"),
                "{e}"
            );
            jail.set_env("RUNYARD_INSECURE_DEV", "1");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert!(c.insecure_dev);
            c.check_secrets().map_err(|e| e.to_string())?;
            // Only 1 turns the checks off.
            jail.set_env("RUNYARD_INSECURE_DEV", "yes");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.starts_with("RUNYARD_INSECURE_DEV:"), "{e}");
            // Nothing set: nothing to check (the routes answer 503).
            jail.set_env("RUNYARD_INSECURE_DEV", "0");
            jail.set_env("RUNYARD_GITLAB_WEBHOOK_TOKEN", "");
            let e = Config::load(None)
                .map_err(|e| e.to_string())?
                .check_secrets()
                .err()
                .ok_or("accepted")?
                .to_string();
            assert!(e.contains("RUNYARD_GITLAB_WEBHOOK_TOKEN is empty"), "{e}");
            Config::default()
                .check_secrets()
                .map_err(|e| e.to_string())?;
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn tls_files_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_INGEST_TLS_CERT", "/tls/tls.crt");
            jail.set_env("RUNYARD_INGEST_TLS_KEY", "/tls/tls.key");
            jail.set_env("RUNYARD_INGEST_TLS_CLIENT_CA", "/tls/ca.crt");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.tls.cert, Some(PathBuf::from("/tls/tls.crt")));
            assert_eq!(c.tls.key, Some(PathBuf::from("/tls/tls.key")));
            assert_eq!(c.tls.client_ca, Some(PathBuf::from("/tls/ca.crt")));
            Ok(())
        });
    }
}
