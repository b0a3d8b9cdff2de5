//! Providers make and remove the machines runners live on: `process` (a
//! local command per runner) and `external` (garm's external-provider
//! executable protocol). Every call is bounded by a timeout and runs off the
//! decision loop. The scaler makes its runners with them, and `runyard
//! provider check` runs one through the same calls.

use std::path::Path;
use std::time::Duration;
use tracing::Instrument as _;

use runyard_events::{Forge, Namespace};
use runyard_forge::api::github::RunnerDownload;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

mod config;
mod external;
mod process;
pub mod template;

pub use config::ProviderConfig;
pub use external::{ExternalProvider, INTERFACE_V010, INTERFACE_V011};
pub use process::ProcessProvider;

/// The controller id (`GARM_CONTROLLER_ID`): UUIDv5 of the namespace (in
/// the OID namespace), the same on every replica of one stack.
pub fn controller_id(ns: &Namespace) -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_OID, ns.as_str().as_bytes())
}

/// A pool's id: UUIDv5(controller id, pool name), stable across restarts,
/// replicas and edits that keep the name.
pub fn pool_id(controller: &Uuid, pool: &str) -> Uuid {
    Uuid::new_v5(controller, pool.as_bytes())
}

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

/// What an `external` provider's instance needs to set itself up beyond
/// the [`CreateRequest`]: the bootstrap JSON's garm-only fields. The
/// `process` provider ignores it.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// The runner application builds (`tools`); empty for GitLab pools.
    pub tools: Vec<RunnerDownload>,
    /// `callback-url`.
    pub callback_url: String,
    /// `metadata-url`.
    pub metadata_url: String,
    /// `instance-token`.
    pub instance_token: SecretString,
    /// `os_type`: `linux` or `windows`.
    pub os_type: String,
    /// `arch`: `amd64`, `arm64`, `arm`, `i386`.
    pub os_arch: String,
    /// The forge: GitHub runners are configured just in time
    /// (`jit_config_enabled`); GitLab runners register with the runner token
    /// the metadata API hands out (`labels` then set).
    pub forge: Forge,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            callback_url: String::new(),
            metadata_url: String::new(),
            instance_token: SecretString::from(String::new()),
            os_type: "linux".into(),
            os_arch: "amd64".into(),
            forge: Forge::Github,
        }
    }
}

/// An address of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    /// The address.
    pub address: String,
    /// `public` or `private`.
    #[serde(rename = "type")]
    pub kind: String,
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
    /// `linux`, `windows`, ... (empty when not said).
    #[serde(default)]
    pub os_type: String,
    /// `ubuntu`, ... (empty when not said).
    #[serde(default)]
    pub os_name: String,
    /// OS version (empty when not said).
    #[serde(default)]
    pub os_version: String,
    /// `amd64`, ... (empty when not said).
    #[serde(default)]
    pub os_arch: String,
    /// Its addresses.
    #[serde(default)]
    pub addresses: Vec<Address>,
}

impl Instance {
    /// A running instance with nothing else said about it.
    pub fn running(provider_id: &str, name: &str) -> Self {
        Self {
            provider_id: provider_id.to_owned(),
            name: name.to_owned(),
            status: "running".into(),
            fault: None,
            os_type: String::new(),
            os_name: String::new(),
            os_version: String::new(),
            os_arch: String::new(),
            addresses: Vec::new(),
        }
    }
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
    #[error("provider call timed out after {0:?}; its process group was killed")]
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
    #[error("instance {provider_id} in error: {fault}")]
    InstanceError {
        /// The provider's id for it (what to delete).
        provider_id: String,
        /// The provider's fault, decoded (or `status error`).
        fault: String,
    },
    /// The provider cannot do this.
    #[error("{0}")]
    Unsupported(&'static str),
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
            } => Self::External(ExternalProvider::new(
                executable.clone(),
                config_file.clone(),
                interface_version,
                environment_variables.clone(),
                *exec_timeout,
                controller_id,
            )),
        }
    }

    /// True for a garm external provider (its instances need the metadata
    /// API and the runner downloads).
    pub fn is_external(&self) -> bool {
        matches!(self, Self::External(_))
    }

    /// Tells the provider a pool's extra specs: v0.1.1 providers get them
    /// (`GARM_POOL_EXTRASPECS`) on every call for that pool id.
    pub fn register_pool(&self, pool_id: &str, extra_specs: serde_json::Value) {
        if let Self::External(p) = self {
            p.register_pool(pool_id, extra_specs);
        }
    }

    /// Creates an instance with no bootstrap details beyond the request
    /// (see [`Provider::create_with`]).
    pub async fn create(&self, req: &CreateRequest) -> Result<Instance, ProviderError> {
        self.create_with(req, &Bootstrap::default()).await
    }

    /// Creates an instance. An instance of that name that exists already is
    /// adopted (returned as created). One made in error is
    /// [`ProviderError::InstanceError`] (the caller deletes it).
    pub async fn create_with(
        &self,
        req: &CreateRequest,
        boot: &Bootstrap,
    ) -> Result<Instance, ProviderError> {
        let span = call_span("provider CreateInstance", &req.name);
        let created = match self {
            Self::Process(p) => p.create(req).instrument(span.clone()).await,
            Self::External(p) => p.create(req, boot).instrument(span.clone()).await,
        };
        ended(&span, &created);
        created
    }

    /// Deletes an instance by provider id or name; a missing one is a success.
    pub async fn delete(&self, pool_id: &str, id_or_name: &str) -> Result<(), ProviderError> {
        let span = call_span("provider DeleteInstance", id_or_name);
        let r = match self {
            Self::Process(p) => p.delete(pool_id, id_or_name).instrument(span.clone()).await,
            Self::External(p) => p.delete(pool_id, id_or_name).instrument(span.clone()).await,
        };
        let r = match r {
            Err(ProviderError::NotFound) => Ok(()),
            other => other,
        };
        ended(&span, &r);
        r
    }

    /// One instance by provider id (or name); [`ProviderError::NotFound`]
    /// when there is none.
    pub async fn get(&self, pool_id: &str, id_or_name: &str) -> Result<Instance, ProviderError> {
        match self {
            Self::Process(p) => p
                .list(pool_id)
                .await?
                .into_iter()
                .find(|i| i.provider_id == id_or_name || i.name == id_or_name)
                .ok_or(ProviderError::NotFound),
            Self::External(p) => p.get(pool_id, id_or_name).await,
        }
    }

    /// Lists the instances of a pool.
    pub async fn list(&self, pool_id: &str) -> Result<Vec<Instance>, ProviderError> {
        match self {
            Self::Process(p) => p.list(pool_id).await,
            Self::External(p) => p.list(pool_id).await,
        }
    }

    /// The provider's version (`GetVersion`); the process provider has none.
    pub async fn version(&self, pool_id: &str) -> Result<String, ProviderError> {
        match self {
            Self::Process(_) => Err(ProviderError::Unsupported(
                "the process provider has no version",
            )),
            Self::External(p) => p.version(pool_id).await,
        }
    }

    /// Starts a stopped instance.
    pub async fn start(&self, pool_id: &str, provider_id: &str) -> Result<(), ProviderError> {
        match self {
            Self::Process(_) => Err(ProviderError::Unsupported(
                "the process provider cannot start a stopped instance",
            )),
            Self::External(p) => p.start(pool_id, provider_id).await,
        }
    }
}

/// The span of one provider call on an instance, a child of the current
/// span (a job's runner creation, in that job's trace).
fn call_span(name: &'static str, instance: &str) -> tracing::Span {
    tracing::info_span!(
        "provider call",
        otel.name = name,
        otel.kind = "client",
        runyard.instance = instance,
    )
}

/// Ends a provider call's span with its result.
fn ended<T>(span: &tracing::Span, result: &Result<T, ProviderError>) {
    use runyard_telemetry::traces::{OpenTelemetrySpanExt as _, Status};
    span.set_status(match result {
        Ok(_) => Status::Ok,
        Err(e) => Status::error(e.to_string()),
    });
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
