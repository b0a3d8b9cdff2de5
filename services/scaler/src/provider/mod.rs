//! Providers make and remove the machines runners live on: `process` (a
//! local command per runner) and `external` (garm's external-provider
//! executable protocol). Every call is bounded by a timeout and runs off the
//! decision loop.

use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use crate::config::ProviderConfig;

mod external;
mod process;

pub use external::ExternalProvider;
pub use process::ProcessProvider;

/// What a create needs.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// Instance name (deterministic).
    pub name: String,
    /// Pool name.
    pub pool: String,
    /// Pool id (UUIDv5 of the controller id and the pool name).
    pub pool_id: String,
    /// Flavor name.
    pub flavor: String,
    /// Flavor memory.
    pub memory_bytes: u64,
    /// Flavor CPUs.
    pub cpus: u32,
    /// Image.
    pub image: String,
    /// Runner labels (pool labels plus `runyard-pool=<pool>`).
    pub labels: Vec<String>,
    /// GitHub's encoded JIT config or GitLab's runner token.
    pub jit_config: SecretString,
    /// Repository / organization URL the runner serves.
    pub repo_url: String,
    /// GitHub runner group name.
    pub runner_group: String,
    /// Pool extra specs.
    pub extra_specs: serde_json::Value,
    /// Bound on the whole create (the pool's bootstrap timeout).
    pub timeout: Duration,
}

/// An instance as a provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// The provider's id.
    pub provider_id: String,
    /// The instance name.
    pub name: String,
    /// `running`, `stopped`, `error`, `unknown`.
    pub status: String,
    /// Provider's fault text (decoded), if any.
    pub fault: Option<String>,
}

/// A provider call that did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The instance does not exist (exit code 30).
    #[error("instance not found")]
    NotFound,
    /// An instance of that name exists already (exit code 31).
    #[error("instance already exists")]
    Duplicate,
    /// The call did not finish in time; its process group was killed.
    #[error("provider call timed out after {0:?}")]
    Timeout(Duration),
    /// The provider failed.
    #[error("provider exited with {code}: {stderr}")]
    Exit {
        /// Exit code (-1 for a signal).
        code: i32,
        /// Its stderr, trimmed and shortened.
        stderr: String,
    },
    /// The provider answered something that is not a valid instance.
    #[error("malformed provider answer: {0}")]
    Malformed(String),
    /// The instance was made but is in error.
    #[error("instance in error: {0}")]
    InstanceError(String),
    /// Could not run the provider at all.
    #[error("running provider: {0}")]
    Io(String),
}

/// A configured provider.
#[derive(Debug, Clone)]
pub enum Provider {
    /// A local command per runner.
    Process(ProcessProvider),
    /// A garm external-provider executable.
    External(ExternalProvider),
}

impl Provider {
    /// Builds a provider from its configuration.
    pub fn from_config(
        name: &str,
        config: &ProviderConfig,
        controller_id: &str,
        state_dir: &Path,
    ) -> Self {
        match config {
            ProviderConfig::Process { command } => {
                Self::Process(ProcessProvider::new(command.clone(), state_dir.join(name)))
            }
            ProviderConfig::External {
                executable,
                config_file,
                interface_version,
                environment_variables,
                exec_timeout,
            } => Self::External(ExternalProvider {
                executable: executable.clone(),
                config_file: config_file.clone(),
                interface_version: interface_version.clone(),
                environment_variables: environment_variables.clone(),
                exec_timeout: *exec_timeout,
                controller_id: controller_id.to_owned(),
            }),
        }
    }

    /// Creates an instance. An instance of that name that exists already is
    /// adopted (returned as created).
    pub async fn create(&self, req: &CreateRequest) -> Result<Instance, ProviderError> {
        match self {
            Self::Process(p) => p.create(req).await,
            Self::External(p) => p.create(req).await,
        }
    }

    /// Deletes an instance by provider id or name; a missing one is a success.
    pub async fn delete(&self, pool_id: &str, id_or_name: &str) -> Result<(), ProviderError> {
        let r = match self {
            Self::Process(p) => p.delete(pool_id, id_or_name).await,
            Self::External(p) => p.delete(pool_id, id_or_name).await,
        };
        match r {
            Err(ProviderError::NotFound) => Ok(()),
            other => other,
        }
    }

    /// Lists the instances of a pool.
    pub async fn list(&self, pool_id: &str) -> Result<Vec<Instance>, ProviderError> {
        match self {
            Self::Process(p) => p.list(pool_id).await,
            Self::External(p) => p.list(pool_id).await,
        }
    }
}

/// Shortens provider output for an error message.
fn clip(s: &str) -> String {
    let s = s.trim();
    let mut out: String = s.chars().take(500).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}
