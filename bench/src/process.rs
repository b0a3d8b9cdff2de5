//! Service binaries as child processes: a clean environment, waiting for
//! them, stopping them.

use std::future::Future;
use std::os::fd::AsFd as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The command that starts a runyard service binary: a clean environment
/// (the caller's `PATH` only, so no stray `RUNYARD_*` or `OTEL_*` leaks
/// in) with the NATS server, the namespace, `RUST_LOG` and JSON logs; stdin
/// closed; killed when dropped. The caller adds the service's own
/// variables and where its output goes.
pub fn service_command(bin: &Path, nats_url: &str, namespace: &str, rust_log: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUNYARD_NATS_URL", nats_url)
        .env("RUNYARD_NAMESPACE", namespace)
        .env("RUST_LOG", rust_log)
        .env("RUNYARD_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Our own stderr, for a child's stdout (a benchmark's stdout is its
/// report); closed when it cannot be duplicated.
pub fn stderr_stdio() -> Stdio {
    std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_or_else(|_| Stdio::null(), Stdio::from)
}

/// A child process under test.
#[derive(Debug)]
pub struct Service {
    /// The process.
    pub child: Child,
    /// Its pid.
    pub pid: u32,
}

impl Service {
    /// Starts `cmd`.
    pub fn spawn(cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd.spawn().with_context(|| {
            format!("starting {}", cmd.as_std().get_program().to_string_lossy())
        })?;
        let pid = child.id().context("the process exited at once")?;
        Ok(Self { child, pid })
    }

    /// Asks the process to stop (`SIGTERM`: a service finishes what it is
    /// doing and exits) and kills it when it is still there after `grace`;
    /// true when it stopped by itself.
    pub async fn stop(mut self, grace: Duration) -> bool {
        terminate(self.pid);
        if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
            return true;
        }
        let _ = self.child.kill().await;
        false
    }
}

/// Sends `SIGTERM` to `pid`.
pub fn terminate(pid: u32) {
    let _ = kill(pid_of(pid), Signal::SIGTERM);
}

/// Sends `SIGKILL` to `pid`.
pub fn kill_now(pid: u32) {
    let _ = kill(pid_of(pid), Signal::SIGKILL);
}

/// Sends `SIGKILL` to the process group `pgid` (a process started in a
/// group of its own, and everything it started).
pub fn kill_group(pgid: u32) {
    let _ = killpg(pid_of(pgid), Signal::SIGKILL);
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

/// Polls `check` every 20 ms until it holds; an error naming `what` when
/// `limit` passes first.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_waits_for_and_stops_a_process() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30").kill_on_drop(true);
        let service = Service::spawn(&mut cmd).expect("sleep starts");
        assert!(crate::procfs::alive(service.pid));
        assert!(service.stop(Duration::from_secs(5)).await);
        let mut n = 0;
        wait_until("three polls", Duration::from_secs(5), || {
            n += 1;
            std::future::ready(n >= 3)
        })
        .await
        .expect("holds after three polls");
        let err = wait_until("never", Duration::from_millis(50), || {
            std::future::ready(false)
        })
        .await
        .expect_err("times out");
        assert!(err.to_string().contains("never"));
        assert!(Service::spawn(&mut Command::new("/no/such/binary")).is_err());
    }
}
