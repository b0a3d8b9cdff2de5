//! Per-process readings from Linux `/proc`: resident memory (current and
//! peak), CPU time, whether a process still runs, finding processes by
//! name or command line, and the file system a path is on.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// `USER_HZ`: the unit of `utime`/`stime` in `/proc/<pid>/stat`. It is 100
/// on every Linux architecture runyard runs on (the kernel ABI fixes it,
/// independently of the kernel's internal `HZ`).
const USER_HZ: u64 = 100;

/// Memory figures from `/proc/<pid>/status`, KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// `VmRSS`: resident set size now.
    pub rss_kib: u64,
    /// `VmHWM`: peak resident set size (since start or the last
    /// [`reset_peak_rss`]).
    pub hwm_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of `pid`.
pub fn memory(pid: u32) -> io::Result<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    Ok(Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    })
}

/// Resets `VmHWM` of `pid` to its current RSS (`echo 5 >
/// /proc/<pid>/clear_refs`), so a phase's peak can be read on its own.
pub fn reset_peak_rss(pid: u32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// Fields of `/proc/<pid>/stat` after the `(comm)` field, which may itself
/// hold spaces and parentheses.
fn stat_fields(pid: u32) -> io::Result<(String, Vec<String>)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let open = text.find('(').unwrap_or(0);
    let close = text.rfind(')').unwrap_or(text.len().saturating_sub(1));
    let comm = text.get(open + 1..close).unwrap_or("").to_owned();
    let rest = text
        .get(close + 1..)
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    Ok((comm, rest))
}

/// User + system CPU time `pid` has consumed so far (all threads; 10 ms
/// resolution).
pub fn cpu_time(pid: u32) -> io::Result<Duration> {
    let (_, f) = stat_fields(pid)?;
    // After `(comm)`: state=0, ppid=1, ..., utime=11, stime=12 (fields 14
    // and 15 of proc(5)).
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let total = ticks(11) + ticks(12);
    Ok(Duration::from_millis(total * 1000 / USER_HZ))
}

/// User + system CPU time of the children `pid` has waited for (`cutime +
/// cstime`: a reaped child's time is its parent's from then on).
pub fn children_cpu_time(pid: u32) -> io::Result<Duration> {
    let (_, f) = stat_fields(pid)?;
    // cutime=13, cstime=14 after `(comm)` (fields 16 and 17 of proc(5)).
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(Duration::from_millis(
        (ticks(13) + ticks(14)) * 1000 / USER_HZ,
    ))
}

/// The first field of a `schedstat` file: time on a CPU, in nanoseconds.
fn schedstat(path: &str) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    let ns = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Time `pid` has spent on a CPU (all threads), from `/proc/<pid>/schedstat`:
/// nanoseconds, where [`cpu_time`] counts 10 ms ticks (a process that only
/// starts takes well under one).
pub fn on_cpu(pid: u32) -> Option<Duration> {
    schedstat(&format!("/proc/{pid}/schedstat"))
}

/// Time the calling thread has spent on a CPU, nanoseconds
/// (`/proc/thread-self/schedstat`); zero when it cannot be read.
pub fn thread_on_cpu() -> Duration {
    schedstat("/proc/thread-self/schedstat").unwrap_or_default()
}

/// Whether `pid` runs (exists and is neither a zombie nor dead).
pub fn alive(pid: u32) -> bool {
    stat_fields(pid).is_ok_and(|(_, f)| f.first().is_some_and(|s| s != "Z" && s != "X"))
}

/// Busy CPU time of the whole machine so far (all cores: everything but
/// idle and iowait in the first line of `/proc/stat`).
pub fn machine_busy() -> io::Result<Duration> {
    let text = std::fs::read_to_string("/proc/stat")?;
    let line = text.lines().next().unwrap_or("");
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest
    // time is already included in user.
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Ok(Duration::from_millis(
        total.saturating_sub(idle) * 1000 / USER_HZ,
    ))
}

/// Waits, at most `limit`, until the whole machine was busy less than
/// `max_cores` over one second (other work sharing it has calmed down), and
/// returns the load of the last second in cores.
pub async fn wait_for_quiet(max_cores: f64, limit: Duration) -> f64 {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let before = machine_busy().unwrap_or_default();
        let t0 = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy = machine_busy().unwrap_or_default().saturating_sub(before);
        let load = busy.as_secs_f64() / t0.elapsed().as_secs_f64();
        if load < max_cores || tokio::time::Instant::now() >= deadline {
            return load;
        }
    }
}

/// Waits like [`wait_for_quiet`] and says on stderr when the machine
/// stayed busy; returns the load of the last second in cores.
pub async fn settle(max_cores: f64, limit: Duration) -> f64 {
    let load = wait_for_quiet(max_cores, limit).await;
    if load >= max_cores {
        eprintln!(
            "  the machine is still busy ({load:.2} cores) after {} s; measuring anyway",
            limit.as_secs()
        );
    }
    load
}

/// The first process whose parent is `parent` and whose `comm` is `comm`
/// (e.g. the `nats-server` a helper started on our behalf).
pub fn find_child(parent: u32, comm: &str) -> Option<u32> {
    pids().into_iter().find(|&pid| {
        stat_fields(pid).is_ok_and(|(c, f)| {
            c == comm && f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
        })
    })
}

/// Pids of every process in `/proc`.
fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc").map_or_else(
        |_| Vec::new(),
        |dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        },
    )
}

/// CPU time of every process whose `comm` is `comm` (e.g. every backend of
/// a Postgres cluster), by pid.
pub fn cpu_by_comm(comm: &str) -> Vec<(u32, Duration)> {
    pids()
        .into_iter()
        .filter(|&pid| stat_fields(pid).is_ok_and(|(c, _)| c == comm))
        .filter_map(|pid| Some((pid, cpu_time(pid).ok()?)))
        .collect()
}

/// Running processes whose command line holds every one of `parts`.
pub fn with_cmdline(parts: &[&str]) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                parts.iter().all(|p| c.contains(p))
            })
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// The type of the file system `path` is on (that of the longest mount
/// point above it in `/proc/mounts`), or `"unknown"`.
pub fn fs_type(path: &std::path::Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point)
                .then(|| (point.len(), kind.to_owned()))
        })
        .max()
        .map_or_else(|| "unknown".into(), |(_, kind)| kind)
}

/// CPU time of a set of processes, and of the whole machine, between two
/// points in time.
#[derive(Debug, Clone)]
pub struct CpuMeter {
    pids: Vec<(String, u32)>,
    start: Vec<Duration>,
    machine_start: Duration,
}

/// What a [`CpuMeter`] measured.
#[derive(Debug, Clone, Default)]
pub struct CpuUsage {
    /// CPU consumed by each measured process, by name.
    pub by_process: Vec<(String, Duration)>,
    /// Busy time of the whole machine (all cores) over the same interval;
    /// the part not in `by_process` is other load sharing the machine.
    pub machine: Duration,
}

impl CpuUsage {
    /// CPU of the process named `name`.
    pub fn of(&self, name: &str) -> Duration {
        self.by_process
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| *d)
            .unwrap_or_default()
    }

    /// Machine busy time not spent in the measured processes.
    pub fn others(&self) -> Duration {
        let ours: Duration = self.by_process.iter().map(|(_, d)| *d).sum();
        self.machine.saturating_sub(ours)
    }
}

impl CpuMeter {
    /// Starts measuring the named processes.
    pub fn start(pids: &[(&str, u32)]) -> Self {
        let pids: Vec<(String, u32)> = pids.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect();
        let start = pids
            .iter()
            .map(|(_, p)| cpu_time(*p).unwrap_or_default())
            .collect();
        Self {
            pids,
            start,
            machine_start: machine_busy().unwrap_or_default(),
        }
    }

    /// CPU consumed since [`CpuMeter::start`].
    pub fn stop(&self) -> CpuUsage {
        let by_process = self
            .pids
            .iter()
            .zip(&self.start)
            .map(|((name, pid), start)| {
                let now = cpu_time(*pid).unwrap_or_default();
                (name.clone(), now.saturating_sub(*start))
            })
            .collect();
        CpuUsage {
            by_process,
            machine: machine_busy()
                .unwrap_or_default()
                .saturating_sub(self.machine_start),
        }
    }
}

/// Samples `VmRSS` of a process in the background and keeps the maximum
/// (a cross-check of `VmHWM`, and the only peak where `clear_refs` is not
/// writable).
#[derive(Debug)]
pub struct RssSampler {
    max_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    /// Starts sampling `pid` every `every`.
    pub fn start(pid: u32, every: Duration) -> Self {
        let max_kib = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (max_kib.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Ok(mem) = memory(pid) {
                    m.fetch_max(mem.rss_kib, Ordering::Relaxed);
                }
                tokio::time::sleep(every).await;
            }
        });
        Self {
            max_kib,
            stop,
            task,
        }
    }

    /// Stops sampling; the largest `VmRSS` seen, KiB.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.max_kib.load(Ordering::Relaxed)
    }
}

/// A `perf record` of one process.
#[derive(Debug)]
pub struct Perf {
    child: tokio::process::Child,
    secs: u64,
}

impl Perf {
    /// Starts `perf record` (call graphs, 999 Hz) of `pid`, named `what` in
    /// the progress line, for `secs` seconds, writing `file`; the recording
    /// is killed when dropped.
    pub fn start(file: &std::path::Path, pid: u32, secs: u64, what: &str) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        eprintln!(
            "  perf record of {what} (pid {pid}) for {secs} s into {}",
            file.display()
        );
        let child = tokio::process::Command::new("perf")
            .args([
                "record",
                "-q",
                "-F",
                "999",
                "--call-graph",
                "dwarf,16384",
                "-p",
            ])
            .arg(pid.to_string())
            .arg("-o")
            .arg(file)
            .args(["--", "sleep"])
            .arg(secs.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting perf (apt-get install linux-perf)")?;
        Ok(Self { child, secs })
    }

    /// Waits for the recording, which stops by itself after its seconds
    /// (killed when it has not 30 s later); says on stderr how it ended.
    pub async fn finish(mut self) {
        let limit = Duration::from_secs(self.secs + 30);
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => eprintln!("  perf record finished: {status}"),
            _ => {
                let _ = self.child.kill().await;
                eprintln!("  perf record did not finish; killed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        let mem = memory(me).expect("own status");
        assert!(mem.rss_kib > 0 && mem.hwm_kib >= mem.rss_kib / 2);
        assert!(cpu_time(me).is_ok());
        assert!(machine_busy().is_ok());
        assert_eq!(find_child(me, "no-such-process-name"), None);
        assert!(alive(me));
        assert!(on_cpu(me).is_some_and(|t| t > Duration::ZERO));
        assert!(thread_on_cpu() > Duration::ZERO);
        assert!(children_cpu_time(me).is_ok());
        assert!(cpu_by_comm("no-such-process-name").is_empty());
        assert!(with_cmdline(&["no-such-argument-anywhere-\u{1}"]).is_empty());
        assert_ne!(fs_type(std::path::Path::new("/")), "unknown");
    }
}
