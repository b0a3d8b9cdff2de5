//! A provider's section of the scaler's file (`[providers.<name>]`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// One provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum ProviderConfig {
    /// garm's external-provider executable protocol.
    #[serde(rename = "external")]
    External {
        /// The provider executable.
        executable: PathBuf,
        /// Its configuration file (`GARM_PROVIDER_CONFIG_FILE`).
        config_file: PathBuf,
        /// `v0.1.0` (default) or `v0.1.1`.
        #[serde(default = "default_interface")]
        interface_version: String,
        /// Host variable name prefixes passed on.
        #[serde(default)]
        environment_variables: Vec<String>,
        /// Per call, except create (bounded by the pool's bootstrap timeout).
        #[serde(with = "humantime_serde", default = "default_exec_timeout")]
        exec_timeout: Duration,
    },
    /// A local command per runner (development and tests).
    #[serde(rename = "process")]
    Process {
        /// argv with placeholders `{jit_config}`, `{name}`, `{pool}`,
        /// `{flavor}`, `{memory_bytes}`, `{cpus}`.
        command: Vec<String>,
    },
}

fn default_interface() -> String {
    "v0.1.0".into()
}

fn default_exec_timeout() -> Duration {
    Duration::from_secs(120)
}
