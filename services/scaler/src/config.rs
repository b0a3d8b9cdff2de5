//! Typed, layered configuration: the service settings (defaults → TOML →
//! `RUNYARD_*` environment) here, and the pools-and-providers file named by
//! `RUNYARD_SCALER_CONFIG` from `runyard-scaler-config`, validated before
//! anything starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use runyard_config::secrets;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};

/// Everything `runyard-scaler` reads from the environment (or `--config`).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The event log: `RUNYARD_NATS_URL` and `RUNYARD_NAMESPACE`.
    pub bus: runyard_config::Bus,
    /// The projection (a job already started gets no runner):
    /// `RUNYARD_DATABASE_URL`.
    pub database: runyard_config::Database,
    /// `RUNYARD_SCALER_HTTP_LISTEN` (`/healthz`, `/readyz`, `/metrics`, `/v1/pools`, `/v1/queue`).
    pub scaler_http_listen: SocketAddr,
    /// `RUNYARD_SCALER_CONFIG`: the pools-and-providers TOML file.
    pub scaler_config: Option<PathBuf>,
    /// `RUNYARD_ALLOCATOR_URL`.
    pub allocator_url: String,
    /// `RUNYARD_ALLOCATOR_CLIENT_TOKEN` (or `_FILE`).
    #[serde(skip_serializing)]
    pub allocator_client_token: Option<SecretString>,
    /// `RUNYARD_ALLOCATOR_CA_FILE`: the CA bundle an `https://` allocator's
    /// certificate is checked against (default: the public roots).
    pub allocator_ca_file: Option<PathBuf>,
    /// `RUNYARD_ALLOCATOR_CLIENT_CERT`: the certificate presented to an
    /// allocator that wants one (mTLS); with `RUNYARD_ALLOCATOR_CLIENT_KEY`.
    pub allocator_client_cert: Option<PathBuf>,
    /// `RUNYARD_ALLOCATOR_CLIENT_KEY`: its private key.
    pub allocator_client_key: Option<PathBuf>,
    /// `RUNYARD_GITHUB_API_URL`.
    pub github_api_url: String,
    /// `RUNYARD_GITHUB_TOKEN` (or `_FILE`): a PAT, when no App is configured.
    #[serde(skip_serializing)]
    pub github_token: Option<SecretString>,
    /// `RUNYARD_GITHUB_APP_ID`.
    pub github_app_id: Option<u64>,
    /// `RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE`.
    pub github_app_private_key_file: Option<PathBuf>,
    /// `RUNYARD_GITHUB_APP_INSTALLATION_ID`.
    pub github_app_installation_id: Option<u64>,
    /// `RUNYARD_GITLAB_API_URL` (without `/api/v4`).
    pub gitlab_api_url: Option<String>,
    /// `RUNYARD_GITLAB_TOKEN` (or `_FILE`).
    #[serde(skip_serializing)]
    pub gitlab_token: Option<SecretString>,
    /// `RUNYARD_SCALER_METADATA_LISTEN`: the instance callback/metadata API
    /// garm's install templates call.
    pub scaler_metadata_listen: SocketAddr,
    /// `RUNYARD_SCALER_METADATA_URL`: how instances reach that API
    /// (default `http://<host name>:<metadata port>`).
    pub scaler_metadata_url: Option<String>,
    /// `RUNYARD_SCALER_INSTANCE_TOKEN_KEY` (or `_FILE`): signs instance
    /// tokens; the same on every replica. Required with external providers.
    #[serde(skip_serializing)]
    pub scaler_instance_token_key: Option<SecretString>,
    /// `RUNYARD_SCALER_TLS_CERT`, `_KEY` and `_CLIENT_CA`: both listeners
    /// speak TLS; clients of the HTTP listener need a certificate the CA
    /// signed, the metadata listener never asks (instances authenticate
    /// with their token).
    pub tls: runyard_config::Tls,
    /// `RUNYARD_STREAM_REPLICAS`: replicas of the KV buckets the scaler
    /// creates, as ingest's for the streams.
    pub streams: runyard_config::Streams,
    /// `RUNYARD_INSECURE_DEV=1`: start with a weak instance token key or
    /// allocator client token (a WARN names them); from the environment
    /// only, never the TOML file.
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
            scaler_http_listen,
            scaler_config,
            allocator_url,
            allocator_client_token,
            allocator_ca_file,
            allocator_client_cert,
            allocator_client_key,
            github_api_url,
            github_token,
            github_app_id,
            github_app_private_key_file,
            github_app_installation_id,
            gitlab_api_url,
            gitlab_token,
            scaler_metadata_listen,
            scaler_metadata_url,
            scaler_instance_token_key,
            tls,
            streams,
            insecure_dev,
        } = self;
        let mut d = f.debug_struct("Config");
        bus.show(&mut d);
        database.show(&mut d);
        streams.show(&mut d);
        tls.show(&mut d, TLS_PREFIX);
        d.field("scaler_http_listen", scaler_http_listen)
            .field("scaler_config", scaler_config)
            .field("allocator_url", &runyard_config::redact::url(allocator_url))
            .field("allocator_client_token", allocator_client_token)
            .field("allocator_ca_file", allocator_ca_file)
            .field("allocator_client_cert", allocator_client_cert)
            .field("allocator_client_key", allocator_client_key)
            .field(
                "github_api_url",
                &runyard_config::redact::url(github_api_url),
            )
            .field("github_token", github_token)
            .field("github_app_id", github_app_id)
            .field("github_app_private_key_file", github_app_private_key_file)
            .field("github_app_installation_id", github_app_installation_id)
            .field(
                "gitlab_api_url",
                &gitlab_api_url.as_deref().map(runyard_config::redact::url),
            )
            .field("gitlab_token", gitlab_token)
            .field("scaler_metadata_listen", scaler_metadata_listen)
            .field(
                "scaler_metadata_url",
                &scaler_metadata_url
                    .as_deref()
                    .map(runyard_config::redact::url),
            )
            .field("scaler_instance_token_key", scaler_instance_token_key)
            .field("insecure_dev", insecure_dev)
            .finish()
    }
}

/// The keys of the listener's TLS settings start with this.
const TLS_PREFIX: &str = "scaler_tls_";

impl runyard_config::Settings for Config {
    fn flat() -> Vec<runyard_config::Flat> {
        vec![
            runyard_config::Bus::flat(),
            runyard_config::Database::flat(),
            runyard_config::Streams::flat(),
            runyard_config::Tls::flat(TLS_PREFIX),
        ]
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bus: runyard_config::Bus::default(),
            database: runyard_config::Database::default(),
            scaler_http_listen: SocketAddr::from(([0, 0, 0, 0], 8083)),
            scaler_config: None,
            allocator_url: "http://127.0.0.1:50051".into(),
            allocator_client_token: None,
            allocator_ca_file: None,
            allocator_client_cert: None,
            allocator_client_key: None,
            github_api_url: "https://api.github.com".into(),
            github_token: None,
            github_app_id: None,
            github_app_private_key_file: None,
            github_app_installation_id: None,
            gitlab_api_url: None,
            gitlab_token: None,
            scaler_metadata_listen: SocketAddr::from(([0, 0, 0, 0], 8084)),
            scaler_metadata_url: None,
            scaler_instance_token_key: None,
            tls: runyard_config::Tls::default(),
            streams: runyard_config::Streams::default(),
            insecure_dev: false,
        }
    }
}

/// Secrets that may come from `RUNYARD_<NAME>_FILE`.
const SECRET_FILES: &[&str] = &[
    "allocator_client_token",
    "github_token",
    "gitlab_token",
    "scaler_instance_token_key",
];

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment;
    /// `*_FILE` variables fill secrets not given directly
    /// ([`secrets::read_file`]).
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut config: Self = runyard_config::load(file).map_err(|e| anyhow::anyhow!(e))?;
        for name in SECRET_FILES {
            let var = format!("RUNYARD_{}_FILE", name.to_ascii_uppercase());
            let Ok(path) = std::env::var(&var) else {
                continue;
            };
            let slot = match *name {
                "allocator_client_token" => &mut config.allocator_client_token,
                "github_token" => &mut config.github_token,
                "scaler_instance_token_key" => &mut config.scaler_instance_token_key,
                _ => &mut config.gitlab_token,
            };
            if slot.is_none() {
                *slot = Some(secrets::read_file(&var, Path::new(&path))?);
            }
        }
        // An empty forge token (compose's `${VAR:-}`) means "not set". The
        // secrets runyard's operator chooses stay empty, to be refused
        // ([`Config::check_secrets`]).
        for slot in [&mut config.github_token, &mut config.gitlab_token] {
            if slot
                .as_ref()
                .is_some_and(|s| secrecy::ExposeSecret::expose_secret(s).is_empty())
            {
                *slot = None;
            }
        }
        config.insecure_dev = secrets::insecure_dev_from_env()?;
        Ok(config)
    }

    /// Refuses an empty, short or placeholder instance token key or
    /// allocator client token (one not set is not checked), unless
    /// `insecure_dev` ([`secrets::enforce`]). Forge credentials are the
    /// forge's to judge.
    pub fn check_secrets(&self) -> Result<(), secrets::SecretError> {
        use secrecy::ExposeSecret as _;
        let given = [
            (
                "RUNYARD_SCALER_INSTANCE_TOKEN_KEY",
                &self.scaler_instance_token_key,
            ),
            (
                "RUNYARD_ALLOCATOR_CLIENT_TOKEN",
                &self.allocator_client_token,
            ),
        ];
        let set = given
            .iter()
            .filter_map(|(var, value)| value.as_ref().map(|v| (*var, v.expose_secret())));
        secrets::enforce(set, vec![], self.insecure_dev).map(drop)
    }
}

pub use runyard_scaler_config::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let given = || Some(SecretString::from(secret.to_owned()));
        let config = Config {
            bus: runyard_config::Bus {
                nats_url: format!("nats://{secret}@nats:4222"),
                ..Default::default()
            },
            database: runyard_config::Database {
                url: format!("postgres://runyard:{secret}@db:5432/runyard"),
            },
            allocator_url: format!("https://ci:{secret}@allocator:50051"),
            github_api_url: format!("https://x:{secret}@ghe.example.com/api/v3"),
            gitlab_api_url: Some(format!("https://x:{secret}@gitlab.example.com")),
            scaler_metadata_url: Some(format!("http://x:{secret}@scaler:8084")),
            allocator_client_token: given(),
            github_token: given(),
            gitlab_token: given(),
            scaler_instance_token_key: given(),
            ..Config::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("nats://***@nats:4222"), "{shown}");
        assert!(shown.contains("stream_replicas: 1"), "{shown}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn tls_files_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            let vars = [
                ("RUNYARD_SCALER_TLS_CERT", "/tls/tls.crt"),
                ("RUNYARD_SCALER_TLS_KEY", "/tls/tls.key"),
                ("RUNYARD_SCALER_TLS_CLIENT_CA", "/tls/ca.crt"),
                ("RUNYARD_ALLOCATOR_CA_FILE", "/tls/allocator-ca.crt"),
                ("RUNYARD_ALLOCATOR_CLIENT_CERT", "/tls/client.crt"),
                ("RUNYARD_ALLOCATOR_CLIENT_KEY", "/tls/client.key"),
            ];
            for (var, value) in vars {
                jail.set_env(var, value);
            }
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let got = [
                &c.tls.cert,
                &c.tls.key,
                &c.tls.client_ca,
                &c.allocator_ca_file,
                &c.allocator_client_cert,
                &c.allocator_client_key,
            ];
            for ((var, value), got) in vars.iter().zip(got) {
                assert_eq!(got.as_deref(), Some(Path::new(value)), "{var}");
            }
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn secrets_from_files_and_weak_ones_refused_unless_insecure_dev() {
        use secrecy::ExposeSecret as _;
        const KEY: &str = "b23e8a2f32abc4a6fee170ef81a5c1dc1987f2633f3b73061833ba4129d20c2d";
        figment::Jail::expect_with(|jail| {
            jail.create_file("key", &format!("{KEY}\r\n"))?;
            jail.create_file("pat", "ghp_short\n")?;
            jail.set_env("RUNYARD_SCALER_INSTANCE_TOKEN_KEY_FILE", "key");
            jail.set_env("RUNYARD_GITHUB_TOKEN_FILE", "pat");
            jail.set_env("RUNYARD_GITLAB_TOKEN", "");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let key = c.scaler_instance_token_key.as_ref().ok_or("no key")?;
            assert_eq!(key.expose_secret(), KEY);
            // Forge credentials: read, never judged; empty is unset.
            let pat = c.github_token.as_ref().ok_or("no pat")?;
            assert_eq!(pat.expose_secret(), "ghp_short");
            assert!(c.gitlab_token.is_none());
            c.check_secrets().map_err(|e| e.to_string())?;

            for (value, why) in [
                ("change-me", "is a known placeholder"),
                ("k7Q2mZ9xR4vB1nL8", "is 16 bytes long, shorter than 32"),
                ("", "is empty"),
            ] {
                for var in [
                    "RUNYARD_SCALER_INSTANCE_TOKEN_KEY",
                    "RUNYARD_ALLOCATOR_CLIENT_TOKEN",
                ] {
                    jail.set_env(var, value);
                    let c = Config::load(None).map_err(|e| e.to_string())?;
                    let e = c.check_secrets().err().ok_or("accepted")?.to_string();
                    assert!(e.contains(&format!("{var} {why}")), "{var}={value:?}: {e}");
                    assert!(e.contains("openssl rand -hex 32"), "{e}");
                    jail.set_env(var, KEY);
                }
            }
            jail.set_env("RUNYARD_SCALER_INSTANCE_TOKEN_KEY", "change-me");
            jail.set_env("RUNYARD_INSECURE_DEV", "1");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            c.check_secrets().map_err(|e| e.to_string())?;
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_SCALER_INSTANCE_TOKEN_KEY_FILE", "absent");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(
                e.starts_with("RUNYARD_SCALER_INSTANCE_TOKEN_KEY_FILE: reading absent"),
                "{e}"
            );
            Ok(())
        });
    }
}
