//! Typed, layered configuration (defaults → TOML → `RUNYARD_*` env).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use runyard_config::secrets;
use runyard_forge::tokens::Tokens;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};

/// The variable listing the tokens people log in with.
pub const TOKENS_VAR: &str = "RUNYARD_CONSOLE_TOKENS";
/// The variable naming a file of them, one per line.
pub const TOKENS_FILE_VAR: &str = "RUNYARD_CONSOLE_TOKENS_FILE";

/// Everything `runyard-console` can be told.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The projection, read through a read-only role:
    /// `RUNYARD_DATABASE_URL`.
    pub database: runyard_config::Database,
    /// `RUNYARD_DATABASE_POOL_SIZE`.
    pub database_pool_size: u32,
    /// `RUNYARD_CONSOLE_LISTEN`: the pages, `/healthz`, `/readyz`,
    /// `/metrics`.
    pub console_listen: SocketAddr,
    /// `RUNYARD_SCALER_URL`: the scaler's HTTP API (`/v1/queue`,
    /// `/v1/pools`).
    pub scaler_url: String,
    /// `RUNYARD_ALLOCATOR_URL`: the allocator's gRPC API (a workload's
    /// current recommendation); empty: not shown.
    pub allocator_url: String,
    /// `RUNYARD_ALLOCATOR_CLIENT_TOKEN` (or `_FILE`).
    #[serde(skip_serializing)]
    pub allocator_client_token: Option<SecretString>,
    /// `RUNYARD_ALLOCATOR_CA_FILE`.
    pub allocator_ca_file: Option<PathBuf>,
    /// `RUNYARD_ALLOCATOR_CLIENT_CERT`.
    pub allocator_client_cert: Option<PathBuf>,
    /// `RUNYARD_ALLOCATOR_CLIENT_KEY`.
    pub allocator_client_key: Option<PathBuf>,
    /// `RUNYARD_CONSOLE_TRUSTED_PROXIES`: addresses or networks
    /// (`10.0.0.5`, `10.0.0.0/24`, comma separated) of the reverse proxies
    /// whose identity header is believed.
    pub console_trusted_proxies: String,
    /// `RUNYARD_CONSOLE_IDENTITY_HEADER`: the header a trusted proxy names
    /// the signed-in person in.
    pub console_identity_header: String,
    /// `RUNYARD_CONSOLE_SESSION_TTL`: how long a login lasts.
    #[serde(with = "humantime_serde")]
    pub console_session_ttl: Duration,
    /// `RUNYARD_CONSOLE_COOKIE_SECURE`: mark the session cookie `Secure`
    /// (default: when the listener has TLS).
    pub console_cookie_secure: Option<bool>,
    /// `RUNYARD_CONSOLE_BEFORE_MEMORY`: the memory every job had before
    /// runyard sized it (`16GiB`), the savings' baseline.
    pub console_before_memory: Option<bytesize::ByteSize>,
    /// `RUNYARD_CONSOLE_BEFORE_MEMORY_PROJECTS`: the same per project,
    /// `group/app=32GiB,acme/web=8GiB`.
    pub console_before_memory_projects: String,
    /// `RUNYARD_ALLOCATOR_TARGET_OOM`: the OOM target first attempts are
    /// held to (the allocator's own setting).
    pub allocator_target_oom: f64,
    /// `RUNYARD_CONSOLE_SAVINGS_WINDOW`: the window of the savings series
    /// on `/metrics`.
    #[serde(with = "humantime_serde")]
    pub console_savings_window: Duration,
    /// `RUNYARD_CONSOLE_TLS_CERT`, `_KEY` and `_CLIENT_CA`.
    pub tls: runyard_config::Tls,
    /// The tokens: `RUNYARD_CONSOLE_TOKENS` or `_FILE`, from the
    /// environment only.
    #[serde(skip)]
    pub console_tokens: Tokens,
    /// `RUNYARD_INSECURE_DEV=1`; from the environment only.
    #[serde(skip)]
    pub insecure_dev: bool,
}

/// Every field under its key, secrets and URLs' credentials hidden.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            database,
            database_pool_size,
            console_listen,
            scaler_url,
            allocator_url,
            allocator_client_token,
            allocator_ca_file,
            allocator_client_cert,
            allocator_client_key,
            console_trusted_proxies,
            console_identity_header,
            console_session_ttl,
            console_cookie_secure,
            console_before_memory,
            console_before_memory_projects,
            allocator_target_oom,
            console_savings_window,
            tls,
            console_tokens,
            insecure_dev,
        } = self;
        let mut d = f.debug_struct("Config");
        database.show(&mut d);
        tls.show(&mut d, TLS_PREFIX);
        d.field("database_pool_size", database_pool_size)
            .field("console_listen", console_listen)
            .field("scaler_url", &runyard_config::redact::url(scaler_url))
            .field("allocator_url", &runyard_config::redact::url(allocator_url))
            .field("allocator_client_token", allocator_client_token)
            .field("allocator_ca_file", allocator_ca_file)
            .field("allocator_client_cert", allocator_client_cert)
            .field("allocator_client_key", allocator_client_key)
            .field("console_trusted_proxies", console_trusted_proxies)
            .field("console_identity_header", console_identity_header)
            .field("console_session_ttl", console_session_ttl)
            .field("console_cookie_secure", console_cookie_secure)
            .field("console_before_memory", console_before_memory)
            .field(
                "console_before_memory_projects",
                console_before_memory_projects,
            )
            .field("allocator_target_oom", allocator_target_oom)
            .field("console_savings_window", console_savings_window)
            .field("console_tokens", console_tokens)
            .field("insecure_dev", insecure_dev)
            .finish()
    }
}

/// The keys of the listener's TLS settings start with this.
const TLS_PREFIX: &str = "console_tls_";

impl runyard_config::Settings for Config {
    fn flat() -> Vec<runyard_config::Flat> {
        vec![
            runyard_config::Database::flat(),
            runyard_config::Tls::flat(TLS_PREFIX),
        ]
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database: runyard_config::Database {
                url: "postgres://runyard_console@127.0.0.1:5432/runyard".into(),
            },
            database_pool_size: 4,
            console_listen: SocketAddr::from(([0, 0, 0, 0], 8085)),
            scaler_url: "http://127.0.0.1:8083".into(),
            allocator_url: "http://127.0.0.1:50051".into(),
            allocator_client_token: None,
            allocator_ca_file: None,
            allocator_client_cert: None,
            allocator_client_key: None,
            console_trusted_proxies: String::new(),
            console_identity_header: "X-Forwarded-User".into(),
            console_session_ttl: Duration::from_secs(12 * 3600),
            console_cookie_secure: None,
            console_before_memory: None,
            console_before_memory_projects: String::new(),
            allocator_target_oom: 0.03,
            console_savings_window: Duration::from_secs(30 * 86_400),
            tls: runyard_config::Tls::default(),
            console_tokens: Tokens::default(),
            insecure_dev: false,
        }
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting is malformed (the message names it).
    #[error("{0}")]
    Invalid(String),
    /// Neither tokens nor trusted proxies: nobody could sign in.
    #[error(
        "no way to sign in: set {TOKENS_VAR} (or {TOKENS_FILE_VAR}) for token logins, or RUNYARD_CONSOLE_TRUSTED_PROXIES for a reverse proxy's identity header; the console shows nothing without credentials"
    )]
    NoCredentials,
}

/// A trusted proxy: an address or a network.
pub type Proxy = ipnet::IpNet;

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment;
    /// the tokens and `RUNYARD_ALLOCATOR_CLIENT_TOKEN_FILE` from the
    /// environment.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut config: Self = runyard_config::load(file).map_err(|e| anyhow::anyhow!(e))?;
        config.console_tokens = Tokens::from_env(TOKENS_VAR, TOKENS_FILE_VAR)?;
        if config.allocator_client_token.is_none()
            && let Ok(path) = std::env::var("RUNYARD_ALLOCATOR_CLIENT_TOKEN_FILE")
        {
            config.allocator_client_token = Some(secrets::read_file(
                "RUNYARD_ALLOCATOR_CLIENT_TOKEN_FILE",
                Path::new(&path),
            )?);
        }
        config.insecure_dev = secrets::insecure_dev_from_env()?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what the types cannot: the proxies parse, someone can sign
    /// in, the target is a share, the per-project sizes parse.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.trusted_proxies()?;
        self.before_memory_projects()?;
        if !(self.allocator_target_oom > 0.0 && self.allocator_target_oom < 0.5) {
            return Err(ConfigError::Invalid(format!(
                "RUNYARD_ALLOCATOR_TARGET_OOM: {} is not a share between 0 and 0.5",
                self.allocator_target_oom
            )));
        }
        if http::HeaderName::from_bytes(self.console_identity_header.as_bytes()).is_err() {
            return Err(ConfigError::Invalid(format!(
                "RUNYARD_CONSOLE_IDENTITY_HEADER: {:?} is not a header name",
                self.console_identity_header
            )));
        }
        if self.console_tokens.is_empty() && self.trusted_proxies()?.is_empty() {
            return Err(ConfigError::NoCredentials);
        }
        Ok(())
    }

    /// The trusted proxies, parsed (an address is a network of one).
    pub fn trusted_proxies(&self) -> Result<Vec<Proxy>, ConfigError> {
        self.console_trusted_proxies
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<Proxy>()
                    .or_else(|_| p.parse::<IpAddr>().map(Proxy::from))
                    .map_err(|_| {
                        ConfigError::Invalid(format!(
                            "RUNYARD_CONSOLE_TRUSTED_PROXIES: {p:?} is not an address or a network (10.0.0.5, 10.0.0.0/24)"
                        ))
                    })
            })
            .collect()
    }

    /// The per-project sizes jobs had before runyard, in bytes.
    pub fn before_memory_projects(&self) -> Result<BTreeMap<String, u64>, ConfigError> {
        self.console_before_memory_projects
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|item| {
                let bad = || {
                    ConfigError::Invalid(format!(
                        "RUNYARD_CONSOLE_BEFORE_MEMORY_PROJECTS: {item:?} is not PROJECT=SIZE (group/app=32GiB)"
                    ))
                };
                let (project, size) = item.rsplit_once('=').ok_or_else(bad)?;
                let size: bytesize::ByteSize = size.trim().parse().map_err(|_| bad())?;
                let project = project.trim();
                if project.is_empty() {
                    return Err(bad());
                }
                Ok((project.to_owned(), size.as_u64()))
            })
            .collect()
    }

    /// Refuses a weak login token or allocator client token unless
    /// `insecure_dev` ([`secrets::enforce`]).
    pub fn check_secrets(&self) -> Result<(), secrets::SecretError> {
        use secrecy::ExposeSecret as _;
        let given = self
            .allocator_client_token
            .as_ref()
            .map(|t| ("RUNYARD_ALLOCATOR_CLIENT_TOKEN", t.expose_secret()));
        secrets::enforce(
            given,
            self.console_tokens.weak().to_vec(),
            self.insecure_dev,
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "3f9c1d7e5a2b4c6d8e0f1a3b5c7d9e1f3a5b7c9d1e3f5a7b9c1d3e5f7a9b1c3d";

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn nobody_can_sign_in_without_tokens_or_proxies() {
        figment::Jail::expect_with(|jail| {
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.contains("no way to sign in"), "{e}");
            jail.set_env(TOKENS_VAR, TOKEN);
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.console_tokens.len(), 1);
            c.check_secrets().map_err(|e| e.to_string())?;
            assert!(!format!("{c:?}").contains(&TOKEN[..10]));
            jail.set_env(TOKENS_VAR, "change-me");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let e = c
                .check_secrets()
                .err()
                .ok_or("weak token accepted")?
                .to_string();
            assert!(e.contains(TOKENS_VAR), "{e}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn proxies_and_project_sizes_are_read_and_bad_ones_named() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "RUNYARD_CONSOLE_TRUSTED_PROXIES",
                "10.0.0.5, 10.1.0.0/16,::1",
            );
            jail.set_env(
                "RUNYARD_CONSOLE_BEFORE_MEMORY_PROJECTS",
                "spack/spack=32GiB, acme/app=8GB",
            );
            jail.set_env("RUNYARD_CONSOLE_BEFORE_MEMORY", "16GiB");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let proxies = c.trusted_proxies().map_err(|e| e.to_string())?;
            assert_eq!(proxies.len(), 3);
            assert!(proxies[1].contains(&"10.1.2.3".parse::<IpAddr>().map_err(|e| e.to_string())?));
            let sizes = c.before_memory_projects().map_err(|e| e.to_string())?;
            assert_eq!(sizes["spack/spack"], 32 << 30);
            assert_eq!(sizes["acme/app"], 8_000_000_000);
            assert_eq!(c.console_before_memory.map(|b| b.as_u64()), Some(16 << 30));

            jail.set_env("RUNYARD_CONSOLE_TRUSTED_PROXIES", "10.0.0.5,proxy.local");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(
                e.contains("RUNYARD_CONSOLE_TRUSTED_PROXIES") && e.contains("proxy.local"),
                "{e}"
            );
            jail.set_env("RUNYARD_CONSOLE_TRUSTED_PROXIES", "10.0.0.5");
            jail.set_env(
                "RUNYARD_CONSOLE_BEFORE_MEMORY_PROJECTS",
                "spack/spack:32GiB",
            );
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.contains("RUNYARD_CONSOLE_BEFORE_MEMORY_PROJECTS"), "{e}");
            jail.set_env("RUNYARD_CONSOLE_BEFORE_MEMORY_PROJECTS", "");
            jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", "0.7");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.contains("RUNYARD_ALLOCATOR_TARGET_OOM"), "{e}");
            Ok(())
        });
    }
}
