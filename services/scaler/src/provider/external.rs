//! The `external` provider: garm's external-provider executable protocol.
//! The executable runs once per call with a clean environment (`GARM_*`, the
//! operator's listed prefixes, the proxy variables), the bootstrap JSON on
//! stdin for `CreateInstance`, instances as JSON on stdout, exit code 30 for
//! "not found" and 31 for "duplicate". A call that outlives its timeout has
//! its whole process group killed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;
use tokio::io::AsyncWriteExt as _;

use super::{CreateRequest, Instance, ProviderError, clip};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ExternalProvider {
    /// The executable.
    pub executable: PathBuf,
    /// `GARM_PROVIDER_CONFIG_FILE`.
    pub config_file: PathBuf,
    /// `v0.1.0` or `v0.1.1`.
    pub interface_version: String,
    /// Host variable prefixes passed on.
    pub environment_variables: Vec<String>,
    /// Bound on every call but create.
    pub exec_timeout: Duration,
    /// `GARM_CONTROLLER_ID`.
    pub controller_id: String,
}

/// One instance as providers print it.
#[derive(Debug, Deserialize)]
struct ProviderInstance {
    #[serde(default)]
    provider_id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    provider_fault: Option<String>,
}

impl ProviderInstance {
    fn validate(self) -> Result<Instance, ProviderError> {
        if self.provider_id.is_empty() || self.name.is_empty() {
            return Err(ProviderError::Malformed(
                "instance without provider_id or name".into(),
            ));
        }
        if !matches!(
            self.status.as_str(),
            "running" | "stopped" | "error" | "unknown"
        ) {
            return Err(ProviderError::Malformed(format!(
                "unknown instance status {:?}",
                clip(&self.status)
            )));
        }
        let fault = match self.provider_fault.as_deref() {
            None | Some("") => None,
            Some(b64) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map(|b| clip(&String::from_utf8_lossy(&b)))
                    .map_err(|_| ProviderError::Malformed("provider_fault is not base64".into()))?,
            ),
        };
        Ok(Instance {
            provider_id: self.provider_id,
            name: self.name,
            status: self.status,
            fault,
        })
    }
}

impl ExternalProvider {
    fn v011(&self) -> bool {
        self.interface_version == "v0.1.1"
    }

    /// The environment of one call: nothing of the host's but the listed
    /// prefixes and the proxy variables.
    fn env(
        &self,
        command: &str,
        pool_id: Option<&str>,
        instance: Option<&str>,
        extra_specs: &serde_json::Value,
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                !k.starts_with("GARM")
                    && (matches!(k.as_str(), "http_proxy" | "https_proxy" | "no_proxy")
                        || self.environment_variables.iter().any(|p| k.starts_with(p)))
            })
            .collect();
        env.push(("GARM_COMMAND".into(), command.into()));
        env.push(("GARM_CONTROLLER_ID".into(), self.controller_id.clone()));
        env.push((
            "GARM_PROVIDER_CONFIG_FILE".into(),
            self.config_file.display().to_string(),
        ));
        env.push((
            "GARM_INTERFACE_VERSION".into(),
            self.interface_version.clone(),
        ));
        let pool_scoped = matches!(command, "CreateInstance" | "ListInstances");
        if let Some(pool_id) = pool_id
            && (pool_scoped || self.v011())
        {
            env.push(("GARM_POOL_ID".into(), pool_id.into()));
        }
        if self.v011() {
            let specs = base64::engine::general_purpose::STANDARD.encode(extra_specs.to_string());
            env.push(("GARM_POOL_EXTRASPECS".into(), specs));
        }
        if let Some(instance) = instance {
            env.push(("GARM_INSTANCE_ID".into(), instance.into()));
        }
        env
    }

    async fn call(
        &self,
        env: Vec<(String, String)>,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ProviderError> {
        let mut child = tokio::process::Command::new(&self.executable)
            .env_clear()
            .envs(env)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                ProviderError::Io(format!("starting {}: {e}", self.executable.display()))
            })?;
        let pid = child.id();
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A provider that does not read its stdin must not hang us.
            let _ = tokio::time::timeout(timeout, pipe.write_all(&input)).await;
            drop(pipe);
        }
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(r) => r.map_err(|e| ProviderError::Io(e.to_string()))?,
            Err(_) => {
                if let Some(pid) = pid {
                    let _ = killpg(
                        Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                        Signal::SIGKILL,
                    );
                }
                return Err(ProviderError::Timeout(timeout));
            }
        };
        match out.status.code() {
            Some(0) => Ok(out.stdout),
            Some(30) => Err(ProviderError::NotFound),
            Some(31) => Err(ProviderError::Duplicate),
            code => Err(ProviderError::Exit {
                code: code.unwrap_or(-1),
                stderr: clip(&String::from_utf8_lossy(&out.stderr)),
            }),
        }
    }

    fn one(stdout: &[u8]) -> Result<Instance, ProviderError> {
        serde_json::from_slice::<ProviderInstance>(stdout)
            .map_err(|e| ProviderError::Malformed(format!("instance JSON: {e}")))?
            .validate()
    }

    pub(super) async fn create(&self, req: &CreateRequest) -> Result<Instance, ProviderError> {
        let bootstrap = serde_json::json!({
            "name": req.name,
            "tools": [],
            "repo_url": req.repo_url,
            "callback-url": "",
            "metadata-url": "",
            "instance-token": "",
            "ssh-keys": [],
            "extra_specs": req.extra_specs,
            "github-runner-group": req.runner_group,
            "ca-cert-bundle": null,
            "arch": "amd64",
            "os_type": "linux",
            "flavor": req.flavor,
            "image": req.image,
            "labels": req.labels,
            "pool_id": req.pool_id,
            "user_data_options": {"disable_updates_on_boot": false, "extra_packages": [], "enable_boot_debug": false},
            "jit_config_enabled": true,
        });
        let env = self.env("CreateInstance", Some(&req.pool_id), None, &req.extra_specs);
        let stdin = serde_json::to_vec(&bootstrap).map_err(|e| ProviderError::Io(e.to_string()))?;
        match self.call(env, Some(stdin), req.timeout).await {
            Ok(stdout) => {
                let instance = Self::one(&stdout)?;
                if instance.status == "error" {
                    return Err(ProviderError::InstanceError(
                        instance.fault.unwrap_or_else(|| "status error".into()),
                    ));
                }
                Ok(instance)
            }
            // Made by an earlier attempt or another replica: adopt it.
            Err(ProviderError::Duplicate) => {
                let env = self.env(
                    "GetInstance",
                    Some(&req.pool_id),
                    Some(&req.name),
                    &req.extra_specs,
                );
                Self::one(&self.call(env, None, self.exec_timeout).await?)
            }
            Err(e) => Err(e),
        }
    }

    pub(super) async fn delete(
        &self,
        pool_id: &str,
        id_or_name: &str,
    ) -> Result<(), ProviderError> {
        let env = self.env(
            "DeleteInstance",
            Some(pool_id),
            Some(id_or_name),
            &serde_json::json!({}),
        );
        self.call(env, None, self.exec_timeout).await.map(|_| ())
    }

    pub(super) async fn list(&self, pool_id: &str) -> Result<Vec<Instance>, ProviderError> {
        let env = self.env("ListInstances", Some(pool_id), None, &serde_json::json!({}));
        let stdout = self.call(env, None, self.exec_timeout).await?;
        if stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(Vec::new());
        }
        let list: Option<Vec<ProviderInstance>> = serde_json::from_slice(&stdout)
            .map_err(|e| ProviderError::Malformed(format!("instance list JSON: {e}")))?;
        list.unwrap_or_default()
            .into_iter()
            .map(ProviderInstance::validate)
            .collect()
    }
}
