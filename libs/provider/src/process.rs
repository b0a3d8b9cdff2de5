//! The `process` provider: one local command per runner, started in its own
//! process group. A pid file per instance under the state directory lets
//! every scaler on the host list and stop it, also one that did not start
//! it (a new lease holder adopts what a dead one started).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use secrecy::ExposeSecret as _;

use super::{CreateRequest, Instance, ProviderError};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ProcessProvider {
    command: Vec<String>,
    dir: PathBuf,
}

impl ProcessProvider {
    /// `command` with placeholders; pid files under `dir/<pool id>/`.
    pub fn new(command: Vec<String>, dir: PathBuf) -> Self {
        Self { command, dir }
    }

    fn pool_dir(&self, pool_id: &str) -> PathBuf {
        self.dir.join(pool_id)
    }

    pub(super) async fn create(&self, req: &CreateRequest) -> Result<Instance, ProviderError> {
        let dir = self.pool_dir(&req.pool_id);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| ProviderError::Io(format!("creating {}: {e}", dir.display())))?;
        let pid_file = dir.join(format!("{}.pid", req.name));
        if let Some(pid) = read_pid(&pid_file).await
            && alive(pid)
        {
            return Ok(instance(&req.name, pid));
        }
        let memory = req.memory_bytes.to_string();
        let cpus = req.cpus.to_string();
        let argv: Vec<String> = self
            .command
            .iter()
            .map(|a| {
                a.replace("{jit_config}", req.jit_config.expose_secret())
                    .replace("{name}", &req.name)
                    .replace("{pool}", &req.pool)
                    .replace("{flavor}", &req.flavor)
                    .replace("{memory_bytes}", &memory)
                    .replace("{cpus}", &cpus)
            })
            .collect();
        let log = std::fs::File::create(dir.join(format!("{}.log", req.name)))
            .map_err(|e| ProviderError::Io(format!("creating the log file: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| ProviderError::Io(e.to_string()))?;
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| ProviderError::Io("empty command".into()))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env("RUNYARD_RUNNER_NAME", &req.name)
            .env("RUNYARD_RUNNER_POOL", &req.pool)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .spawn()
            .map_err(|e| ProviderError::Io(format!("starting {program}: {e}")))?;
        let pid = child
            .id()
            .ok_or_else(|| ProviderError::Io("the process exited at once".into()))?;
        tokio::fs::write(&pid_file, pid.to_string())
            .await
            .map_err(|e| ProviderError::Io(format!("writing the pid file: {e}")))?;
        // Reap the child when it ends (an ephemeral runner exits after its
        // job) and forget it.
        tokio::spawn(async move {
            let _ = child.wait().await;
            let _ = tokio::fs::remove_file(&pid_file).await;
        });
        Ok(instance(&req.name, pid))
    }

    pub(super) async fn delete(
        &self,
        pool_id: &str,
        id_or_name: &str,
    ) -> Result<(), ProviderError> {
        let name = id_or_name.split_once(':').map_or(id_or_name, |(n, _)| n);
        let pid_file = self.pool_dir(pool_id).join(format!("{name}.pid"));
        let Some(pid) = read_pid(&pid_file).await else {
            return Err(ProviderError::NotFound);
        };
        if alive(pid) {
            let group = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
            let _ = killpg(group, Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while alive(pid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if alive(pid) {
                let _ = killpg(group, Signal::SIGKILL);
            }
        }
        let _ = tokio::fs::remove_file(&pid_file).await;
        let _ = tokio::fs::remove_file(pid_file.with_extension("log")).await;
        Ok(())
    }

    pub(super) async fn list(&self, pool_id: &str) -> Result<Vec<Instance>, ProviderError> {
        let dir = self.pool_dir(pool_id);
        let mut out = Vec::new();
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(ProviderError::Io(format!("listing {}: {e}", dir.display()))),
        };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let path = entry.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".pid"))
            else {
                continue;
            };
            match read_pid(&path).await {
                Some(pid) if alive(pid) => out.push(instance(name, pid)),
                _ => {
                    let _ = tokio::fs::remove_file(&path).await;
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

fn instance(name: &str, pid: u32) -> Instance {
    Instance::running(&format!("{name}:{pid}"), name)
}

async fn read_pid(path: &Path) -> Option<u32> {
    tokio::fs::read_to_string(path)
        .await
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Running, and not a zombie waiting to be reaped.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
