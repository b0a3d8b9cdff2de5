//! Per-process readings from Linux `/proc`: resident memory (current and
//! peak), CPU time, and finding a child process by name.

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

/// The first process whose parent is `parent` and whose `comm` is `comm`
/// (e.g. the `nats-server` a helper started on our behalf).
pub fn find_child(parent: u32, comm: &str) -> Option<u32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            stat_fields(pid).is_ok_and(|(c, f)| {
                c == comm && f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
            })
        })
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

/// Starts `perf record` (call graphs, 999 Hz) on `pid` for `secs` seconds,
/// writing `file`; the child is killed when dropped.
pub fn perf_record(
    file: &std::path::Path,
    pid: u32,
    secs: u64,
) -> io::Result<tokio::process::Child> {
    tokio::process::Command::new("perf")
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
    }
}
