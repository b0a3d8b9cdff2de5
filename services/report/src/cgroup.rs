//! Reading a job's usage from a cgroup v2 directory.
//!
//! Every file is optional: an old kernel has no `memory.peak`, a runner may
//! have removed the cgroup already, a container may hide some files. What
//! can't be read is `None` and the report says only what is known.

use std::io;
use std::path::{Path, PathBuf};

/// Where cgroup v2 is mounted on every mainstream distribution.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// What a cgroup v2 directory says about the job that ran in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// `memory.peak`: the high-water mark of memory use, in bytes.
    pub peak_memory_bytes: Option<u64>,
    /// `memory.max` when it is a number; `None` when it is `max` (no limit)
    /// or unreadable.
    pub memory_limit_bytes: Option<u64>,
    /// The `oom_kill` counter of `memory.events` (hierarchical, so it counts
    /// kills in child cgroups too). `None` when the file or the line is
    /// missing — then the exit-code fallback decides.
    pub oom_kills: Option<u64>,
    /// `usage_usec` of `cpu.stat`: CPU time used, in microseconds.
    pub cpu_usage_usec: Option<u64>,
}

/// Reads `memory.peak`, `memory.max`, `memory.events` and `cpu.stat` from
/// `dir`. Missing or malformed files are logged and left `None`; this never
/// fails.
pub fn read_cgroup(dir: &Path) -> CgroupUsage {
    CgroupUsage {
        peak_memory_bytes: read_file(dir, "memory.peak").and_then(|s| parse_number(&s)),
        memory_limit_bytes: read_file(dir, "memory.max").and_then(|s| parse_memory_max(&s)),
        oom_kills: read_file(dir, "memory.events").and_then(|s| parse_keyed(&s, "oom_kill")),
        cpu_usage_usec: read_file(dir, "cpu.stat").and_then(|s| parse_keyed(&s, "usage_usec")),
    }
}

/// The tightest `memory.max` among the ancestors of `dir`, stopping at
/// `root` (inclusive).
///
/// A job step often runs in a child cgroup whose own `memory.max` is `max`
/// while the limit that the kernel enforces sits on the container or the
/// runner's slice above it. Only directories under `root` are looked at, so
/// a `--cgroup-dir` outside the cgroup mount never walks up the filesystem.
pub fn ancestor_memory_limit(dir: &Path, root: &Path) -> Option<u64> {
    if !dir.starts_with(root) {
        return None;
    }
    dir.ancestors()
        .skip(1)
        .take_while(|ancestor| ancestor.starts_with(root))
        .filter_map(|ancestor| read_file(ancestor, "memory.max"))
        .filter_map(|s| parse_memory_max(&s))
        .min()
}

/// The cgroup v2 path of a process from the contents of `/proc/<pid>/cgroup`
/// (the `0::/some/path` line), joined onto `mount`. `None` on a pure cgroup v1
/// host, where that line is missing.
pub fn cgroup_dir_from_proc(proc_cgroup: &str, mount: &Path) -> Option<PathBuf> {
    let relative = proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))?
        .trim();
    // `/proc/self/cgroup` paths are absolute inside the cgroup namespace;
    // `(deleted)` marks a cgroup that is already gone.
    if relative.ends_with(" (deleted)") {
        return None;
    }
    Some(mount.join(relative.trim_start_matches('/')))
}

/// The cgroup directory of this process, from `/proc/self/cgroup`.
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let contents = std::fs::read_to_string("/proc/self/cgroup")
        .inspect_err(|error| tracing::warn!(%error, "cannot read /proc/self/cgroup"))
        .ok()?;
    cgroup_dir_from_proc(&contents, Path::new(CGROUP_MOUNT))
}

fn read_file(dir: &Path, name: &str) -> Option<String> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(contents) => Some(contents),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "cgroup file missing");
            None
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read cgroup file");
            None
        }
    }
}

fn parse_number(contents: &str) -> Option<u64> {
    let parsed = contents.trim().parse().ok();
    if parsed.is_none() {
        tracing::warn!(contents = contents.trim(), "malformed cgroup value");
    }
    parsed
}

/// `memory.max` is a byte count or the literal `max` (no limit).
fn parse_memory_max(contents: &str) -> Option<u64> {
    if contents.trim() == "max" {
        return None;
    }
    parse_number(contents)
}

/// The value of `key` in a flat-keyed file (`memory.events`, `cpu.stat`).
fn parse_keyed(contents: &str, key: &str) -> Option<u64> {
    contents.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| parse_number(v)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, contents: &str) {
        std::fs::write(dir.join(name), contents).expect("write fake cgroup file");
    }

    #[test]
    fn reads_every_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.peak", "9123456789\n");
        write(dir.path(), "memory.max", "12000000000\n");
        write(
            dir.path(),
            "memory.events",
            "low 0\nhigh 0\nmax 12\noom 3\noom_kill 3\noom_group_kill 0\n",
        );
        write(
            dir.path(),
            "cpu.stat",
            "usage_usec 5400500000\nuser_usec 5000000000\nsystem_usec 400500000\n",
        );
        assert_eq!(
            read_cgroup(dir.path()),
            CgroupUsage {
                peak_memory_bytes: Some(9_123_456_789),
                memory_limit_bytes: Some(12_000_000_000),
                oom_kills: Some(3),
                cpu_usage_usec: Some(5_400_500_000),
            }
        );
    }

    #[test]
    fn unlimited_memory_max_and_no_oom() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.max", "max\n");
        write(dir.path(), "memory.events", "oom 0\noom_kill 0\n");
        let usage = read_cgroup(dir.path());
        assert_eq!(usage.memory_limit_bytes, None);
        assert_eq!(usage.oom_kills, Some(0));
    }

    #[test]
    fn missing_files_are_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_cgroup(dir.path()), CgroupUsage::default());
        assert_eq!(
            read_cgroup(&dir.path().join("gone")),
            CgroupUsage::default()
        );
    }

    #[test]
    fn malformed_files_are_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.peak", "lots\n");
        write(dir.path(), "memory.events", "low 0\n");
        write(dir.path(), "cpu.stat", "usage_usec\n");
        assert_eq!(read_cgroup(dir.path()), CgroupUsage::default());
    }

    #[test]
    fn ancestor_limit_is_the_tightest_above() {
        let root = tempfile::tempdir().expect("tempdir");
        let pod = root.path().join("kubepods/pod1");
        let step = pod.join("step");
        std::fs::create_dir_all(&step).expect("mkdir");
        write(&root.path().join("kubepods"), "memory.max", "16000000000\n");
        write(&pod, "memory.max", "8000000000\n");
        write(&step, "memory.max", "max\n");
        assert_eq!(
            ancestor_memory_limit(&step, root.path()),
            Some(8_000_000_000)
        );
        // Outside the root nothing is read.
        let other = tempfile::tempdir().expect("tempdir");
        assert_eq!(ancestor_memory_limit(&step, other.path()), None);
    }

    #[test]
    fn own_cgroup_from_proc() {
        let mount = Path::new(CGROUP_MOUNT);
        assert_eq!(
            cgroup_dir_from_proc("0::/system.slice/runner.service\n", mount),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/runner.service"))
        );
        assert_eq!(
            cgroup_dir_from_proc("0::/\n", mount),
            Some(PathBuf::from("/sys/fs/cgroup/"))
        );
        // Hybrid hierarchy: v1 lines first, the v2 line last.
        assert_eq!(
            cgroup_dir_from_proc("12:memory:/docker/abc\n0::/docker/abc\n", mount),
            Some(PathBuf::from("/sys/fs/cgroup/docker/abc"))
        );
        assert_eq!(cgroup_dir_from_proc("12:memory:/docker/abc\n", mount), None);
    }
}
