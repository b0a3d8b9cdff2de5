//! The `external` provider: garm's external-provider executable protocol,
//! spoken as garm speaks it so every garm provider works unchanged.
//!
//! - The executable runs once per call, without arguments, in a clean
//!   environment: `GARM_COMMAND`, `GARM_CONTROLLER_ID`,
//!   `GARM_PROVIDER_CONFIG_FILE`, `GARM_INTERFACE_VERSION`; `GARM_POOL_ID`
//!   (v0.1.0: `CreateInstance` and `ListInstances` only; v0.1.1: every
//!   call, with `GARM_POOL_EXTRASPECS`, base64 of the pool's extra specs);
//!   `GARM_INSTANCE_ID` on the per-instance calls; the host variables whose
//!   names start with one of the operator's prefixes (never a `GARM*` one)
//!   and the proxy variables. Nothing else: no `PATH`, no `HOME`.
//! - `CreateInstance` gets the bootstrap JSON on stdin; every other call an
//!   empty stdin.
//! - Instances come back as JSON on stdout and are checked as garm checks
//!   them: a non-empty `provider_id` and `name`, a status of `running`,
//!   `stopped`, `error` or `unknown`, and a base64 `provider_fault`.
//! - Exit code 30 is "not found", 31 "duplicate", any other non-zero a
//!   failure whose stderr (clipped) is the error.
//! - A call that outlives its timeout (the pool's bootstrap timeout for a
//!   create, `exec_timeout` for the others) has its whole process group
//!   killed, as has a call whose caller stops waiting for it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use runyard_events::Forge;
use secrecy::ExposeSecret as _;
use serde::{Deserialize, Deserializer};
use tokio::io::AsyncWriteExt as _;

use super::{Address, Bootstrap, CreateRequest, Instance, ProviderError, clip, template};

/// The first interface version (the default).
pub const INTERFACE_V010: &str = "v0.1.0";
/// The interface version with pool ids and extra specs on every call.
pub const INTERFACE_V011: &str = "v0.1.1";

/// `GARM_COMMAND` values runyard sends.
mod command {
    pub const CREATE_INSTANCE: &str = "CreateInstance";
    pub const DELETE_INSTANCE: &str = "DeleteInstance";
    pub const GET_INSTANCE: &str = "GetInstance";
    pub const LIST_INSTANCES: &str = "ListInstances";
    pub const START_INSTANCE: &str = "StartInstance";
    pub const GET_VERSION: &str = "GetVersion";
}

/// Host variables passed on whatever the operator lists (by prefix, as
/// garm matches them).
const PROXY_VARIABLES: [&str; 6] = [
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// Host variables starting with this are never passed on: the provider's
/// `GARM_*` variables are the scaler's to set.
const RESERVED_PREFIX: &str = "GARM";

/// Exit code of "not found".
const EXIT_NOT_FOUND: i32 = 30;
/// Exit code of "duplicate".
const EXIT_DUPLICATE: i32 = 31;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ExternalProvider {
    executable: PathBuf,
    config_file: PathBuf,
    interface_version: &'static str,
    environment_variables: Vec<String>,
    exec_timeout: Duration,
    controller_id: String,
    /// Extra specs by pool id (what v0.1.1 calls other than create get).
    pool_specs: Arc<RwLock<HashMap<String, serde_json::Value>>>,
}

/// One instance as providers print it. Strings may be `null` (Go's zero
/// values), types must be right.
#[derive(Debug, Deserialize)]
struct WireInstance {
    #[serde(default, deserialize_with = "nullable")]
    provider_id: String,
    #[serde(default, deserialize_with = "nullable")]
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    os_type: String,
    #[serde(default, deserialize_with = "nullable")]
    os_name: String,
    #[serde(default, deserialize_with = "nullable")]
    os_version: String,
    #[serde(default, deserialize_with = "nullable")]
    os_arch: String,
    #[serde(default, deserialize_with = "nullable")]
    addresses: Vec<WireAddress>,
    #[serde(default, deserialize_with = "nullable")]
    status: String,
    #[serde(default)]
    provider_fault: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireAddress {
    #[serde(default, deserialize_with = "nullable")]
    address: String,
    #[serde(default, rename = "type", deserialize_with = "nullable")]
    kind: String,
}

fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

impl WireInstance {
    fn validate(self) -> Result<Instance, ProviderError> {
        if self.provider_id.is_empty() {
            return Err(ProviderError::Malformed(
                "instance without a provider_id".into(),
            ));
        }
        if self.name.is_empty() {
            return Err(ProviderError::Malformed(format!(
                "instance {} without a name",
                clip(&self.provider_id)
            )));
        }
        if !matches!(
            self.status.as_str(),
            "running" | "stopped" | "error" | "unknown"
        ) {
            return Err(ProviderError::Malformed(format!(
                "instance {} has status {:?}, not running, stopped, error or unknown",
                clip(&self.name),
                clip(&self.status)
            )));
        }
        let fault = match self.provider_fault.as_deref() {
            None | Some("") => None,
            Some(b64) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map(|b| clip(&String::from_utf8_lossy(&b)))
                    .map_err(|e| {
                        ProviderError::Malformed(format!(
                            "instance {}: provider_fault is not base64 ({e})",
                            clip(&self.name)
                        ))
                    })?,
            ),
        };
        Ok(Instance {
            provider_id: self.provider_id,
            name: self.name,
            status: self.status,
            fault,
            os_type: self.os_type,
            os_name: self.os_name,
            os_version: self.os_version,
            os_arch: self.os_arch,
            addresses: self
                .addresses
                .into_iter()
                .map(|a| Address {
                    address: a.address,
                    kind: a.kind,
                })
                .collect(),
        })
    }
}

/// Kills a call's process group when dropped, unless the call ended on its
/// own: a timed-out call, and one whose caller gave up on it, leave nothing
/// running.
struct GroupKill(Option<i32>);

impl GroupKill {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        }
    }
}

/// The host variables a call passes on: names starting with one of
/// `prefixes` or a proxy variable's name, never a `GARM*` one.
fn host_env(
    prefixes: &[String],
    vars: impl Iterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    vars.filter(|(k, _)| {
        !k.starts_with(RESERVED_PREFIX)
            && (prefixes.iter().any(|p| k.starts_with(p.as_str()))
                || PROXY_VARIABLES.iter().any(|p| k.starts_with(p)))
    })
    .collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The bootstrap JSON of a create (garm's `BootstrapInstance`), its
/// `extra_specs` carrying the default runner install template unless the
/// pool set one.
pub(crate) fn bootstrap_json(req: &CreateRequest, boot: &Bootstrap) -> serde_json::Value {
    let jit = boot.forge != Forge::Gitlab;
    let extra_specs = template::with_default(&req.extra_specs, boot.forge, &boot.os_type);
    serde_json::json!({
        "name": req.name,
        "tools": boot.tools,
        "repo_url": req.repo_url,
        "callback-url": boot.callback_url,
        "metadata-url": boot.metadata_url,
        "instance-token": boot.instance_token.expose_secret(),
        "ssh-keys": [],
        "extra_specs": extra_specs,
        "github-runner-group": req.runner_group,
        "ca-cert-bundle": null,
        "arch": boot.os_arch,
        "os_type": boot.os_type,
        "flavor": req.flavor,
        "image": req.image,
        // As garm: labels only for runners that register themselves.
        "labels": if jit { serde_json::Value::Null } else { serde_json::json!(req.labels) },
        "pool_id": req.pool_id,
        "user_data_options": {
            "disable_updates_on_boot": false,
            "extra_packages": [],
            "enable_boot_debug": false,
        },
        "jit_config_enabled": jit,
        "proxy_config": {"http_proxy": "", "https_proxy": "", "no_proxy": ""},
    })
}

impl ExternalProvider {
    /// A provider running `executable` with `config_file`; an
    /// `interface_version` other than `v0.1.1` is `v0.1.0`.
    pub fn new(
        executable: PathBuf,
        config_file: PathBuf,
        interface_version: &str,
        environment_variables: Vec<String>,
        exec_timeout: Duration,
        controller_id: &str,
    ) -> Self {
        Self {
            executable,
            config_file,
            interface_version: if interface_version == INTERFACE_V011 {
                INTERFACE_V011
            } else {
                INTERFACE_V010
            },
            environment_variables,
            exec_timeout,
            controller_id: controller_id.to_owned(),
            pool_specs: Arc::default(),
        }
    }

    fn v011(&self) -> bool {
        self.interface_version == INTERFACE_V011
    }

    pub(super) fn register_pool(&self, pool_id: &str, extra_specs: serde_json::Value) {
        if let Ok(mut specs) = self.pool_specs.write() {
            specs.insert(pool_id.to_owned(), extra_specs);
        }
    }

    /// A pool's registered extra specs (`{}` for a pool not configured).
    fn specs_of(&self, pool_id: &str) -> serde_json::Value {
        self.pool_specs
            .read()
            .ok()
            .and_then(|s| s.get(pool_id).cloned())
            .unwrap_or_else(|| serde_json::json!({}))
    }

    /// The environment of one call.
    fn env(
        &self,
        command: &str,
        pool_id: &str,
        instance: Option<&str>,
        extra_specs: &serde_json::Value,
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("GARM_COMMAND".into(), command.into()),
            ("GARM_CONTROLLER_ID".into(), self.controller_id.clone()),
            (
                "GARM_PROVIDER_CONFIG_FILE".into(),
                self.config_file.display().to_string(),
            ),
            (
                "GARM_INTERFACE_VERSION".into(),
                self.interface_version.into(),
            ),
        ];
        let pool_scoped = matches!(command, command::CREATE_INSTANCE | command::LIST_INSTANCES);
        if pool_scoped || self.v011() {
            env.push(("GARM_POOL_ID".into(), pool_id.into()));
        }
        if self.v011() {
            env.push((
                "GARM_POOL_EXTRASPECS".into(),
                b64(extra_specs.to_string().as_bytes()),
            ));
        }
        if let Some(instance) = instance {
            env.push(("GARM_INSTANCE_ID".into(), instance.into()));
        }
        let host = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
        env.extend(host_env(&self.environment_variables, host));
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
        let mut group = GroupKill(child.id().and_then(|pid| i32::try_from(pid).ok()));
        let pipe = child.stdin.take();
        let run = async move {
            // Written while the output is read: a provider that answers
            // before it reads (or never reads) cannot block the call.
            let write = async move {
                if let (Some(input), Some(mut pipe)) = (stdin, pipe) {
                    let _ = pipe.write_all(&input).await;
                }
            };
            let ((), out) = tokio::join!(write, child.wait_with_output());
            out
        };
        let out = match tokio::time::timeout(timeout, run).await {
            Ok(Ok(out)) => {
                group.disarm();
                out
            }
            Ok(Err(e)) => return Err(ProviderError::Io(e.to_string())),
            // Dropping `group` kills what is left.
            Err(_) => return Err(ProviderError::Timeout(timeout)),
        };
        match out.status.code() {
            Some(0) => Ok(out.stdout),
            Some(EXIT_NOT_FOUND) => Err(ProviderError::NotFound),
            Some(EXIT_DUPLICATE) => Err(ProviderError::Duplicate),
            code => Err(ProviderError::Exit {
                code: code.unwrap_or(-1),
                stderr: clip(&String::from_utf8_lossy(&out.stderr)),
            }),
        }
    }

    fn one(stdout: &[u8]) -> Result<Instance, ProviderError> {
        serde_json::from_slice::<WireInstance>(stdout)
            .map_err(|e| ProviderError::Malformed(format!("instance JSON: {e}")))?
            .validate()
    }

    pub(super) async fn create(
        &self,
        req: &CreateRequest,
        boot: &Bootstrap,
    ) -> Result<Instance, ProviderError> {
        let bootstrap = bootstrap_json(req, boot);
        // As garm: the extra specs in the environment are the bootstrap's.
        let env = self.env(
            command::CREATE_INSTANCE,
            &req.pool_id,
            None,
            &bootstrap["extra_specs"],
        );
        let stdin = serde_json::to_vec(&bootstrap).map_err(|e| ProviderError::Io(e.to_string()))?;
        let instance = match self.call(env, Some(stdin), req.timeout).await {
            Ok(stdout) => Self::one(&stdout)?,
            // Made by an earlier attempt or another replica: adopt it.
            Err(ProviderError::Duplicate) => self.get(&req.pool_id, &req.name).await?,
            Err(e) => return Err(e),
        };
        if instance.status == "error" {
            return Err(ProviderError::InstanceError {
                provider_id: instance.provider_id,
                fault: instance.fault.unwrap_or_else(|| "status error".into()),
            });
        }
        Ok(instance)
    }

    pub(super) async fn get(
        &self,
        pool_id: &str,
        id_or_name: &str,
    ) -> Result<Instance, ProviderError> {
        let env = self.env(
            command::GET_INSTANCE,
            pool_id,
            Some(id_or_name),
            &self.specs_of(pool_id),
        );
        Self::one(&self.call(env, None, self.exec_timeout).await?)
    }

    pub(super) async fn delete(
        &self,
        pool_id: &str,
        id_or_name: &str,
    ) -> Result<(), ProviderError> {
        let env = self.env(
            command::DELETE_INSTANCE,
            pool_id,
            Some(id_or_name),
            &self.specs_of(pool_id),
        );
        self.call(env, None, self.exec_timeout).await.map(drop)
    }

    pub(super) async fn start(
        &self,
        pool_id: &str,
        provider_id: &str,
    ) -> Result<(), ProviderError> {
        let env = self.env(
            command::START_INSTANCE,
            pool_id,
            Some(provider_id),
            &self.specs_of(pool_id),
        );
        self.call(env, None, self.exec_timeout).await.map(drop)
    }

    /// `GetVersion`: the provider's own version, as it prints it.
    pub(super) async fn version(&self, pool_id: &str) -> Result<String, ProviderError> {
        let env = self.env(command::GET_VERSION, pool_id, None, &self.specs_of(pool_id));
        let stdout = self.call(env, None, self.exec_timeout).await?;
        let version = String::from_utf8_lossy(&stdout).trim().to_owned();
        if version.is_empty() {
            return Err(ProviderError::Malformed(
                "GetVersion printed nothing".into(),
            ));
        }
        Ok(clip(&version))
    }

    pub(super) async fn list(&self, pool_id: &str) -> Result<Vec<Instance>, ProviderError> {
        let env = self.env(
            command::LIST_INSTANCES,
            pool_id,
            None,
            &self.specs_of(pool_id),
        );
        let stdout = self.call(env, None, self.exec_timeout).await?;
        // An empty answer is not an empty list: taken as one, it would mark
        // every runner of the pool gone.
        if stdout.iter().all(u8::is_ascii_whitespace) {
            return Err(ProviderError::Malformed(
                "empty answer to ListInstances".into(),
            ));
        }
        // `null` is how Go prints an empty list.
        let list: Option<Vec<WireInstance>> = serde_json::from_slice(&stdout)
            .map_err(|e| ProviderError::Malformed(format!("instance list JSON: {e}")))?;
        list.unwrap_or_default()
            .into_iter()
            .map(WireInstance::validate)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::SecretString;

    fn provider(version: &str) -> ExternalProvider {
        ExternalProvider::new(
            "/bin/false".into(),
            "/etc/p.toml".into(),
            version,
            vec!["LXD_".into()],
            Duration::from_secs(5),
            "ctl",
        )
    }

    fn names(env: &[(String, String)]) -> Vec<&str> {
        let mut v: Vec<&str> = env
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| k.starts_with("GARM"))
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_environment_follows_the_interface_version() {
        let specs = serde_json::json!({"a": 1});
        let p = provider("v0.1.0");
        let env = p.env(command::DELETE_INSTANCE, "pool", Some("i-1"), &specs);
        assert_eq!(
            names(&env),
            [
                "GARM_COMMAND",
                "GARM_CONTROLLER_ID",
                "GARM_INSTANCE_ID",
                "GARM_INTERFACE_VERSION",
                "GARM_PROVIDER_CONFIG_FILE"
            ]
        );
        let env = p.env(command::LIST_INSTANCES, "pool", None, &specs);
        assert!(names(&env).contains(&"GARM_POOL_ID"));
        assert!(!names(&env).contains(&"GARM_POOL_EXTRASPECS"));
        let p = provider("v0.1.1");
        let env = p.env(command::DELETE_INSTANCE, "pool", Some("i-1"), &specs);
        assert!(names(&env).contains(&"GARM_POOL_ID"));
        let encoded = env
            .iter()
            .find(|(k, _)| k == "GARM_POOL_EXTRASPECS")
            .map(|(_, v)| v.clone())
            .unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&decoded).unwrap(),
            specs
        );
        assert!(
            env.iter()
                .any(|(k, v)| k == "GARM_INTERFACE_VERSION" && v == "v0.1.1")
        );
        assert_eq!(provider("").interface_version, "v0.1.0");
    }

    #[test]
    fn only_listed_prefixes_and_proxies_leave_the_host() {
        let vars = [
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("LXD_REMOTE", "x"),
            ("GARM_COMMAND", "evil"),
            ("https_proxy", "http://p"),
            ("NO_PROXY", "localhost"),
            ("LXDX", "no"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let mut kept: Vec<String> = host_env(&["LXD_".into(), "GARMX".into()], vars.into_iter())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        kept.sort();
        assert_eq!(kept, ["LXD_REMOTE", "NO_PROXY", "https_proxy"]);
    }

    fn parse(s: &str) -> Result<Instance, ProviderError> {
        ExternalProvider::one(s.as_bytes())
    }

    #[test]
    fn instances_are_checked_as_garm_checks_them() {
        let ok = parse(
            r#"{"provider_id":"i-1","name":"n","status":"running","os_name":null,
                "addresses":[{"address":"10.0.0.2","type":"private"}],
                "provider_fault":"Ym9vbQ=="}"#,
        )
        .unwrap();
        assert_eq!(ok.fault.as_deref(), Some("boom"));
        assert_eq!(ok.addresses[0].kind, "private");
        for bad in [
            r#"{"provider_id":"","name":"n","status":"running"}"#,
            r#"{"provider_id":"i","name":"","status":"running"}"#,
            r#"{"provider_id":"i","name":"n","status":"creating"}"#,
            r#"{"provider_id":"i","name":"n","status":"running","provider_fault":"%%"}"#,
            r#"{"provider_id":"i","name":"n","status":"running","addresses":"x"}"#,
            r#"{not json"#,
        ] {
            assert!(
                matches!(parse(bad), Err(ProviderError::Malformed(_))),
                "{bad}"
            );
        }
    }

    fn request() -> CreateRequest {
        CreateRequest {
            name: "ry-linux-1".into(),
            pool: "linux".into(),
            pool_id: "pool".into(),
            flavor: "small".into(),
            memory_bytes: 1,
            cpus: 1,
            image: "ubuntu".into(),
            labels: vec!["self-hosted".into()],
            jit_config: SecretString::from("jit".to_owned()),
            repo_url: "https://github.com/acme".into(),
            runner_group: String::new(),
            extra_specs: serde_json::json!({"disk": 10}),
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_bootstrap_carries_a_default_template_unless_the_pool_has_one() {
        let boot = Bootstrap {
            instance_token: SecretString::from("tok".to_owned()),
            ..Bootstrap::default()
        };
        let b = bootstrap_json(&request(), &boot);
        assert_eq!(b["instance-token"], "tok");
        assert_eq!(b["extra_specs"]["disk"], 10);
        assert_eq!(b["labels"], serde_json::Value::Null);
        assert_eq!(b["jit_config_enabled"], true);
        let tpl = b["extra_specs"]["runner_install_template"]
            .as_str()
            .unwrap();
        let tpl = base64::engine::general_purpose::STANDARD
            .decode(tpl)
            .unwrap();
        assert!(String::from_utf8(tpl).unwrap().starts_with("#!/bin/bash"));
        let mut req = request();
        req.extra_specs = serde_json::json!({"runner_install_template": "b3duCg=="});
        let b = bootstrap_json(&req, &boot);
        assert_eq!(b["extra_specs"]["runner_install_template"], "b3duCg==");
        let gitlab = Bootstrap {
            forge: Forge::Gitlab,
            ..Bootstrap::default()
        };
        let b = bootstrap_json(&request(), &gitlab);
        assert_eq!(b["jit_config_enabled"], false);
        assert_eq!(b["labels"], serde_json::json!(["self-hosted"]));
        let windows = Bootstrap {
            os_type: "windows".into(),
            ..Bootstrap::default()
        };
        let b = bootstrap_json(&request(), &windows);
        assert!(b["extra_specs"].get("runner_install_template").is_none());
    }
}
