//! Typed, layered configuration (defaults → TOML → `RUNYARD_*` env).

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::model::Params;

/// Everything `runyard-allocator` can be told.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `RUNYARD_NATS_URL`.
    pub nats_url: String,
    /// `RUNYARD_NAMESPACE`.
    pub namespace: String,
    /// `RUNYARD_DATABASE_URL`: the projection job-tracker writes.
    pub database_url: String,
    /// `RUNYARD_ALLOCATOR_LISTEN`: gRPC.
    pub allocator_listen: SocketAddr,
    /// `RUNYARD_ALLOCATOR_HTTP_LISTEN`: gantry-compatible HTTP and `/metrics`.
    pub allocator_http_listen: SocketAddr,
    /// `RUNYARD_ALLOCATOR_PROTECTED_REFS`: comma-separated refs whose jobs
    /// train the model (pull requests cannot poison it).
    pub allocator_protected_refs: String,
    /// `RUNYARD_ALLOCATOR_PUBLISH_ALLOCATIONS`: publish every answer as an
    /// `AllocationIssued` event.
    pub allocator_publish_allocations: bool,
    /// `RUNYARD_ALLOCATOR_MAX_BATCH`: most requests in one `RecommendBatch`.
    pub allocator_max_batch: usize,
    /// The recommendation maths (`[model]` in the TOML file).
    pub model: Params,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:4222".into(),
            namespace: "runyard".into(),
            database_url: "postgres://postgres@127.0.0.1:5432/runyard".into(),
            allocator_listen: SocketAddr::from(([0, 0, 0, 0], 50051)),
            allocator_http_listen: SocketAddr::from(([0, 0, 0, 0], 8081)),
            allocator_protected_refs: "develop,main,master".into(),
            allocator_publish_allocations: true,
            allocator_max_batch: 10_000,
            model: Params::default(),
        }
    }
}

const ENV_KEYS: &[&str] = &[
    "nats_url",
    "namespace",
    "database_url",
    "allocator_listen",
    "allocator_http_listen",
    "allocator_protected_refs",
    "allocator_publish_allocations",
    "allocator_max_batch",
];

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        runyard_telemetry::load_config(file, ENV_KEYS)
    }

    /// The protected refs as a list.
    pub fn protected_refs(&self) -> Vec<String> {
        self.allocator_protected_refs
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn contract_defaults_and_env_override() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.allocator_listen.to_string(), "0.0.0.0:50051");
            assert_eq!(c.allocator_http_listen.to_string(), "0.0.0.0:8081");
            assert_eq!(c.protected_refs(), ["develop", "main", "master"]);
            jail.set_env("RUNYARD_ALLOCATOR_PROTECTED_REFS", "trunk, release ");
            jail.set_env("RUNYARD_USAGE_TOKEN", "another service's");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.protected_refs(), ["trunk", "release"]);
            Ok(())
        });
    }
}
