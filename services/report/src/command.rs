//! `runyard-report run -- CMD`: runs a command in a cgroup of its own and
//! reads what it used.
//!
//! The command must be in its group before it executes a single
//! instruction, or its first allocations would be counted elsewhere. So the
//! binary starts a copy of itself ([`EXEC_HELPER_ARG`]) that stops itself
//! with `SIGSTOP`; the parent waits until it has stopped, writes its pid into
//! the group's `cgroup.procs`, and lets it continue with `SIGCONT`; the copy
//! then replaces itself with the command (`exec`, same pid). Everything the
//! command and its children allocate is charged to the group.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::ExitStatus;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, raise};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};

use crate::Error;
use crate::cgroup::{CgroupDirs, CgroupUsage, own_cgroup, read_cgroup};
use crate::child::{ChildGroup, create_child_group};

/// The hidden first argument that turns the binary into the stop-then-exec
/// helper: `runyard-report __runyard-report-exec CMD ARGS...`.
pub const EXEC_HELPER_ARG: &str = "__runyard-report-exec";

/// Exit code of the helper when it could not stop itself (never expected).
const HELPER_FAILED: u8 = 125;

/// What running the command gave.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRun {
    /// The command's exit code; `128 + N` when signal N killed it (137 for
    /// SIGKILL, which is what the OOM killer sends).
    pub exit_code: i32,
    /// The usage of the command's group, or of this process's group when no
    /// group of its own could be made.
    pub usage: CgroupUsage,
    /// Wall-clock seconds from start to exit, to the millisecond.
    pub wall_seconds: f64,
}

/// The helper's side: stops itself until the parent has moved it into the
/// command's group, then replaces itself with `command`. Returns only when
/// that fails, with the exit code to end with: 127 when the program is not
/// found, 126 when it can't be executed (as a shell does).
pub fn stop_then_exec(command: &[OsString]) -> u8 {
    let Some((program, arguments)) = command.split_first() else {
        eprintln!("runyard-report: no command to run");
        return HELPER_FAILED;
    };
    if let Err(errno) = raise(Signal::SIGSTOP) {
        eprintln!("runyard-report: cannot stop before running the command: {errno}");
        return HELPER_FAILED;
    }
    let error = std::process::Command::new(program).args(arguments).exec();
    eprintln!(
        "runyard-report: cannot run {}: {error}",
        program.to_string_lossy()
    );
    exec_failure_code(&error)
}

/// The shell's exit code for a program that can't be run: 127 when it is
/// not found, 126 otherwise.
pub fn exec_failure_code(error: &io::Error) -> u8 {
    if error.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// A process's exit status as a shell reports it: the exit code, or
/// `128 + N` when signal N killed it.
pub fn exit_code_of(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

/// Runs `command` in a fresh child cgroup with `memory_limit` bytes as its
/// memory limit (none when `None`), waits for it, reads the group and
/// removes it.
///
/// When no child group can be made (the hierarchy isn't writable, the memory
/// controller isn't delegated) or the command can't be moved into it, the
/// command runs anyway, in this process's group, and that group is read
/// after it ends; a one-line warning says why (and that the limit is not
/// enforced). `SIGTERM` and `SIGHUP` sent to this process are passed on to
/// the command; `SIGINT` and `SIGQUIT` come from a terminal, which sends them
/// to the command too, so this process only survives them to report.
///
/// Errors only when the command can't be started or waited for.
pub async fn run_command(
    command: &[OsString],
    memory_limit: Option<u64>,
) -> Result<CommandRun, Error> {
    let Some((program, arguments)) = command.split_first() else {
        return Err(Error::Spawn {
            program: String::new(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "no command given"),
        });
    };
    let mut signals = Signals::register();
    let own = own_cgroup();
    let group = match &own {
        Some(own) => create_child_group(
            own,
            &format!("runyard-{}", std::process::id()),
            memory_limit,
        ),
        None => Err(Error::NoCgroup),
    };
    let started = Instant::now();
    let in_group = match group {
        Ok(group) => run_in_group(command, group, own.as_ref(), memory_limit, &mut signals).await?,
        Err(error) => InGroup::NotStarted(error),
    };
    let (exit_code, usage) = match in_group {
        InGroup::Ran { exit_code, usage } => (exit_code, usage),
        InGroup::NotStarted(error) => {
            note_fallback(&error, memory_limit);
            let child = spawn(std::process::Command::new(program).args(arguments))?;
            let exit_code = wait_forwarding(child, &mut signals).await?;
            (exit_code, read_own(own.as_ref()))
        }
    };
    let wall_seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    Ok(CommandRun {
        exit_code,
        usage,
        wall_seconds,
    })
}

/// How running the command in its group went.
#[derive(Debug)]
enum InGroup {
    /// The command ran (in its group, or in this process's group when it
    /// could not be moved) and this is what it used.
    Ran { exit_code: i32, usage: CgroupUsage },
    /// The command did not start (the group is removed again): run it
    /// without a group of its own.
    NotStarted(Error),
}

/// Runs the command in `group` and removes the group afterwards, whatever
/// happens.
async fn run_in_group(
    command: &[OsString],
    mut group: ChildGroup,
    own: Option<&CgroupDirs>,
    memory_limit: Option<u64>,
    signals: &mut Signals,
) -> Result<InGroup, Error> {
    let helper = std::env::current_exe()
        .map_err(|source| Error::Spawn {
            program: "runyard-report (this binary, to start the command)".to_owned(),
            source,
        })
        .and_then(|exe| {
            spawn(
                std::process::Command::new(exe)
                    .arg(EXEC_HELPER_ARG)
                    .args(command),
            )
        });
    let child = match helper {
        Ok(child) => child,
        Err(error) => {
            remove_group(group).await;
            return Ok(InGroup::NotStarted(error));
        }
    };
    let pid = child.id();
    let nix_pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    let stop = tokio::task::spawn_blocking(move || wait_until_stopped(nix_pid))
        .await
        .map_err(|join| Error::Command {
            action: "wait for",
            source: io::Error::other(join),
        })
        .and_then(|stop| stop);
    let (exit_code, moved) = match stop {
        Ok(Stop::Stopped) => {
            let moved = group.move_into(pid);
            if let Err(error) = &moved {
                note_fallback(error, memory_limit);
            }
            if let Err(errno) = kill(nix_pid, Signal::SIGCONT) {
                tracing::warn!(%errno, pid, "cannot let the command continue");
            }
            (wait_forwarding(child, signals).await, moved.is_ok())
        }
        // The helper ended before it stopped; it never ran the command.
        Ok(Stop::Ended(exit_code)) => (Ok(exit_code), true),
        Err(error) => {
            // Don't leave a helper stopped forever.
            if let Err(errno) = kill(nix_pid, Signal::SIGKILL) {
                tracing::debug!(%errno, pid, "cannot end the helper");
            }
            (Err(error), true)
        }
    };
    let usage = match (&exit_code, moved) {
        (Ok(_), true) => {
            let usage = read_cgroup(group.dirs());
            log_usage(group.dirs(), &usage);
            usage
        }
        (Ok(_), false) => read_own(own),
        (Err(_), _) => CgroupUsage::default(),
    };
    remove_group(group).await;
    Ok(InGroup::Ran {
        exit_code: exit_code?,
        usage,
    })
}

fn spawn(command: &mut std::process::Command) -> Result<std::process::Child, Error> {
    command.spawn().map_err(|source| Error::Spawn {
        program: command.get_program().to_string_lossy().into_owned(),
        source,
    })
}

fn note_fallback(reason: &Error, memory_limit: Option<u64>) {
    let reason = crate::error_chain(reason);
    let limit = if memory_limit.is_some() {
        "; --memory-limit is not enforced"
    } else {
        ""
    };
    tracing::warn!(
        "no cgroup of its own for the command ({reason}); measuring this process's cgroup \
         after the command ends instead{limit}"
    );
}

fn read_own(own: Option<&CgroupDirs>) -> CgroupUsage {
    let Some(own) = own else {
        return CgroupUsage::default();
    };
    let usage = read_cgroup(own);
    log_usage(own, &usage);
    usage
}

fn log_usage(dirs: &CgroupDirs, usage: &CgroupUsage) {
    tracing::info!(
        dir = %dirs.memory.display(),
        version = %dirs.version,
        peak_memory_bytes = usage.peak_memory_bytes,
        memory_limit_bytes = usage.memory_limit_bytes,
        oom_kills = usage.oom_kills,
        cpu_usage_usec = usage.cpu_usage_usec,
        "read cgroup"
    );
}

async fn remove_group(group: ChildGroup) {
    let removed = tokio::task::spawn_blocking(move || group.remove()).await;
    let error = match removed {
        Ok(Ok(())) => return,
        Ok(Err(error)) => crate::error_chain(&error),
        Err(join) => join.to_string(),
    };
    tracing::warn!(%error, "cannot remove the command's cgroup");
}

/// How the helper came out of its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Stopped itself, waiting to be moved.
    Stopped,
    /// Ended (and was reaped) without stopping, with this exit code.
    Ended(i32),
}

fn wait_until_stopped(pid: Pid) -> Result<Stop, Error> {
    loop {
        match waitpid(pid, Some(WaitPidFlag::WUNTRACED)) {
            Ok(WaitStatus::Stopped(..)) => return Ok(Stop::Stopped),
            Ok(WaitStatus::Exited(_, code)) => return Ok(Stop::Ended(code)),
            Ok(WaitStatus::Signaled(_, signal, _)) => return Ok(Stop::Ended(128 + signal as i32)),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(errno) => {
                return Err(Error::Command {
                    action: "wait for",
                    source: errno.into(),
                });
            }
        }
    }
}

/// Waits for `child` to exit, passing `SIGTERM` and `SIGHUP` on to it.
async fn wait_forwarding(
    mut child: std::process::Child,
    signals: &mut Signals,
) -> Result<i32, Error> {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let mut wait = tokio::task::spawn_blocking(move || child.wait());
    loop {
        tokio::select! {
            joined = &mut wait => {
                let status = joined
                    .map_err(io::Error::other)
                    .and_then(|status| status)
                    .map_err(|source| Error::Command { action: "wait for", source })?;
                return Ok(exit_code_of(status));
            }
            signal = signals.next() => {
                if let Some(signal) = signal.forwarded()
                    && let Err(errno) = kill(pid, signal)
                {
                    tracing::warn!(%errno, %signal, "cannot pass a signal on to the command");
                }
            }
        }
    }
}

/// A signal this process received while the command ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Received {
    Terminate,
    Hangup,
    Interrupt,
    Quit,
}

impl Received {
    /// The signal to pass on to the command, if any. `SIGINT` and `SIGQUIT`
    /// come from the terminal, which sends them to the whole foreground
    /// process group, the command included; passing them on would deliver
    /// them twice.
    fn forwarded(self) -> Option<Signal> {
        match self {
            Received::Terminate => Some(Signal::SIGTERM),
            Received::Hangup => Some(Signal::SIGHUP),
            Received::Interrupt | Received::Quit => None,
        }
    }
}

/// The signals this process catches while the command runs, so that it
/// outlives the command and reports it.
#[derive(Debug)]
struct Signals {
    streams: Vec<(Received, SignalStream)>,
}

impl Signals {
    fn register() -> Self {
        let kinds = [
            (Received::Terminate, SignalKind::terminate()),
            (Received::Hangup, SignalKind::hangup()),
            (Received::Interrupt, SignalKind::interrupt()),
            (Received::Quit, SignalKind::quit()),
        ];
        let streams = kinds
            .into_iter()
            .filter_map(|(received, kind)| match signal(kind) {
                Ok(stream) => Some((received, stream)),
                Err(error) => {
                    tracing::warn!(?received, %error, "cannot catch a signal while the command runs");
                    None
                }
            })
            .collect();
        Signals { streams }
    }

    /// The next signal received; pending forever when none is caught.
    async fn next(&mut self) -> Received {
        std::future::poll_fn(|cx| {
            for (received, stream) in &mut self.streams {
                if let std::task::Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return std::task::Poll::Ready(*received);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_as_a_shell_reports_them() {
        assert_eq!(exit_code_of(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code_of(ExitStatus::from_raw(3 << 8)), 3);
        // Killed by SIGKILL (9), as the OOM killer does.
        assert_eq!(exit_code_of(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code_of(ExitStatus::from_raw(15)), 143);
    }

    #[test]
    fn exec_failures_as_a_shell_reports_them() {
        assert_eq!(
            exec_failure_code(&io::Error::from(io::ErrorKind::NotFound)),
            127
        );
        assert_eq!(
            exec_failure_code(&io::Error::from(io::ErrorKind::PermissionDenied)),
            126
        );
    }

    #[test]
    fn only_termination_signals_are_passed_on() {
        assert_eq!(Received::Terminate.forwarded(), Some(Signal::SIGTERM));
        assert_eq!(Received::Hangup.forwarded(), Some(Signal::SIGHUP));
        assert_eq!(Received::Interrupt.forwarded(), None);
        assert_eq!(Received::Quit.forwarded(), None);
    }
}
