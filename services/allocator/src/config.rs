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
    /// `RUNYARD_ALLOCATOR_TARGET_OOM`: the share of first attempts the
    /// operator accepts to see OOM-killed (0 < t < 0.5); the model's
    /// `target_oom`.
    pub allocator_target_oom: f64,
    /// The recommendation maths (`[model]` in the TOML file;
    /// `model.target_oom` is taken from `allocator_target_oom`).
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
            allocator_target_oom: 0.03,
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
    "allocator_target_oom",
];

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment;
    /// refuses a target OOM rate outside (0, 0.5), naming the variable.
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        let mut config: Self = runyard_telemetry::load_config(file, ENV_KEYS)?;
        config
            .apply_target_oom()
            .map_err(|e| Box::new(figment::Error::from(e)))?;
        Ok(config)
    }

    /// Checks `allocator_target_oom` and hands it to the model.
    pub fn apply_target_oom(&mut self) -> Result<(), String> {
        let t = self.allocator_target_oom;
        if !(t.is_finite() && t > 0.0 && t < 0.5) {
            return Err(format!(
                "RUNYARD_ALLOCATOR_TARGET_OOM: {t} is not a fraction between 0 and 0.5 (exclusive), e.g. 0.03"
            ));
        }
        self.model.target_oom = t;
        Ok(())
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
            assert_eq!(c.model.target_oom, 0.03);
            jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", "0.05");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!((c.allocator_target_oom, c.model.target_oom), (0.05, 0.05));
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn a_target_oom_outside_zero_to_a_half_refuses_to_start() {
        figment::Jail::expect_with(|jail| {
            for bad in ["0", "0.5", "-0.01", "1", "3"] {
                jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", bad);
                let e = Config::load(None).err().ok_or("accepted")?.to_string();
                assert!(e.contains("RUNYARD_ALLOCATOR_TARGET_OOM"), "{bad}: {e}");
            }
            jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", "three percent");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.to_lowercase().contains("target_oom"), "{e}");
            Ok(())
        });
    }
}
