//! Reading a job's usage from its cgroup, v1 or v2.
//!
//! Every file is optional: an old kernel has no `memory.peak` or no
//! `oom_kill` line, a runner may have removed the cgroup already, a container
//! may hide some files. What can't be read is `None` and the report says only
//! what is known.
//!
//! | figure | cgroup v2 | cgroup v1 |
//! |---|---|---|
//! | peak | `memory.peak` | `memory.max_usage_in_bytes` |
//! | limit | `memory.max` (`max` = none) | `memory.limit_in_bytes`, else `hierarchical_memory_limit` of `memory.stat` (≥ 2^62 = none) |
//! | OOM kills | `oom_kill` of `memory.events` | `oom_kill` of `memory.oom_control` |
//! | CPU | `usage_usec` of `cpu.stat` | `cpuacct.usage` (ns) of the cpuacct group |

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where the cgroup hierarchies are mounted on every mainstream distribution
/// (the v2 hierarchy itself, or the v1 controllers in directories below it).
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// A cgroup v1 memory limit at or above this many bytes means "no limit":
/// the kernel shows an unlimited group as `PAGE_COUNTER_MAX` pages, which is
/// just under 2^63 bytes (9223372036854771712 with 4 KiB pages).
const V1_UNLIMITED_BYTES: u64 = 1 << 62;

/// Which cgroup hierarchy the memory figures came from; sent as the report's
/// `cgroup` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    /// The per-controller hierarchies (`/sys/fs/cgroup/memory/...`).
    V1,
    /// The unified hierarchy.
    V2,
}

impl std::fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// What a job's cgroup says about the job that ran in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// The hierarchy the memory figures were read from; `None` when no
    /// memory figure (peak, limit or OOM kill count) could be read.
    pub version: Option<CgroupVersion>,
    /// The high-water mark of memory use, in bytes.
    pub peak_memory_bytes: Option<u64>,
    /// The memory limit in bytes; `None` when there is none or it is
    /// unreadable.
    pub memory_limit_bytes: Option<u64>,
    /// The OOM kill counter (hierarchical, so it counts kills in child
    /// cgroups too). `None` when the file or the line is missing — then the
    /// exit-code fallback decides.
    pub oom_kills: Option<u64>,
    /// CPU time used, in microseconds.
    pub cpu_usage_usec: Option<u64>,
}

impl CgroupUsage {
    /// Sets [`CgroupUsage::version`] to `version` when a memory figure was
    /// read, and clears it otherwise.
    fn tagged(mut self, version: CgroupVersion) -> Self {
        let has_memory_data = self.peak_memory_bytes.is_some()
            || self.memory_limit_bytes.is_some()
            || self.oom_kills.is_some();
        self.version = has_memory_data.then_some(version);
        self
    }
}

/// The directories of one cgroup, in whichever hierarchy holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupDirs {
    /// cgroup v1 or v2.
    pub version: CgroupVersion,
    /// The group's directory: on v2 the group itself, on v1 the group in the
    /// memory hierarchy.
    pub memory: PathBuf,
    /// Where CPU time is counted: on v2 the same directory as `memory`, on v1
    /// the group in the cpuacct hierarchy. `None` when unknown.
    pub cpu: Option<PathBuf>,
    /// `cpu` counts more than the job: on v1 the process's cpuacct group is
    /// the root of its hierarchy while its memory group is not, so the CPU
    /// time there is the whole machine's. It is then not reported (but a
    /// child group can still be made in it).
    pub cpu_is_shared: bool,
    /// The mount point of the hierarchy `memory` is in; no ancestor above it
    /// is read.
    pub mount: PathBuf,
}

impl CgroupDirs {
    /// The dirs for a directory given by hand (`--cgroup-dir`): cgroup v1
    /// when it has a v1 memory or cpuacct file, else v2. On v1 CPU time is
    /// read from the same directory (it is there when cpu and memory are
    /// mounted together, or in a test's fake directory).
    pub fn from_dir(dir: &Path) -> Self {
        let v1_files = [
            "memory.max_usage_in_bytes",
            "memory.limit_in_bytes",
            "memory.oom_control",
            "cpuacct.usage",
        ];
        let version = if v1_files.iter().any(|name| dir.join(name).exists()) {
            CgroupVersion::V1
        } else {
            CgroupVersion::V2
        };
        CgroupDirs {
            version,
            memory: dir.to_owned(),
            cpu: Some(dir.to_owned()),
            cpu_is_shared: false,
            mount: PathBuf::from(CGROUP_MOUNT),
        }
    }
}

/// Reads a job's usage from `dirs`, whichever version they are. On v2 a
/// group without a limit of its own gets the tightest limit among its
/// ancestors below the mount point ([`ancestor_memory_limit`]); on v1
/// `memory.stat` already says that. Never fails.
pub fn read_cgroup(dirs: &CgroupDirs) -> CgroupUsage {
    match dirs.version {
        CgroupVersion::V1 => {
            let cpu = dirs.cpu.as_deref().filter(|_| !dirs.cpu_is_shared);
            read_cgroup_v1(&dirs.memory, cpu)
        }
        CgroupVersion::V2 => {
            let mut usage = read_cgroup_v2(&dirs.memory);
            if usage.memory_limit_bytes.is_none() {
                usage.memory_limit_bytes = ancestor_memory_limit(&dirs.memory, &dirs.mount);
            }
            usage.tagged(CgroupVersion::V2)
        }
    }
}

/// Reads `memory.peak`, `memory.max`, `memory.events` and `cpu.stat` from a
/// cgroup v2 directory. Missing or malformed files are logged and left
/// `None`; this never fails.
pub fn read_cgroup_v2(dir: &Path) -> CgroupUsage {
    CgroupUsage {
        version: None,
        peak_memory_bytes: read_file(dir, "memory.peak").and_then(|s| parse_number(&s)),
        memory_limit_bytes: read_file(dir, "memory.max").and_then(|s| parse_memory_max(&s)),
        oom_kills: read_file(dir, "memory.events").and_then(|s| parse_keyed(&s, "oom_kill")),
        cpu_usage_usec: read_file(dir, "cpu.stat").and_then(|s| parse_keyed(&s, "usage_usec")),
    }
    .tagged(CgroupVersion::V2)
}

/// Reads `memory.max_usage_in_bytes`, `memory.limit_in_bytes` (else the
/// `hierarchical_memory_limit` of `memory.stat`) and `memory.oom_control`
/// from a cgroup v1 memory directory, and `cpuacct.usage` from `cpuacct`.
/// Missing or malformed files are logged and left `None`; this never fails.
pub fn read_cgroup_v1(memory: &Path, cpuacct: Option<&Path>) -> CgroupUsage {
    let own_limit = read_file(memory, "memory.limit_in_bytes").and_then(|s| parse_v1_limit(&s));
    let memory_limit_bytes = own_limit.or_else(|| {
        read_file(memory, "memory.stat")
            .and_then(|s| parse_keyed(&s, "hierarchical_memory_limit"))
            .filter(|&limit| limit < V1_UNLIMITED_BYTES)
    });
    CgroupUsage {
        version: None,
        peak_memory_bytes: read_file(memory, "memory.max_usage_in_bytes")
            .and_then(|s| parse_number(&s)),
        memory_limit_bytes,
        oom_kills: read_file(memory, "memory.oom_control")
            .and_then(|s| parse_keyed(&s, "oom_kill")),
        cpu_usage_usec: cpuacct
            .and_then(|dir| read_file(dir, "cpuacct.usage"))
            .and_then(|s| parse_number(&s))
            .map(|nanoseconds| nanoseconds / 1000),
    }
    .tagged(CgroupVersion::V1)
}

/// The tightest cgroup v2 `memory.max` among the ancestors of `dir`, stopping
/// at `root` (inclusive).
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

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug)]
struct Membership<'a> {
    controllers: Vec<&'a str>,
    path: &'a str,
}

fn memberships(proc_cgroup: &str) -> impl Iterator<Item = Membership<'_>> {
    proc_cgroup.lines().filter_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        // `(deleted)` marks a cgroup that is already gone.
        if path.ends_with(" (deleted)") {
            return None;
        }
        Some(Membership {
            controllers: controllers.split(',').filter(|c| !c.is_empty()).collect(),
            path: path.trim(),
        })
    })
}

/// One cgroup mount from `/proc/<pid>/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    /// `None` for cgroup2; the controllers (from the super options) for v1.
    v1_controllers: Option<Vec<String>>,
    /// The cgroup path the mount shows at its mount point.
    root: String,
    mount_point: PathBuf,
}

fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let (fstype, _source, options) = (right.next()?, right.next()?, right.next()?);
            let (root, mount_point) = (left.get(3)?, left.get(4)?);
            let v1_controllers = match fstype {
                "cgroup2" => None,
                "cgroup" => Some(options.split(',').map(str::to_owned).collect()),
                _ => return None,
            };
            Some(CgroupMount {
                v1_controllers,
                root: unescape_mountinfo(root),
                mount_point: PathBuf::from(unescape_mountinfo(mount_point)),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for `\`).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .map(|d| (d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` (absolute, from `/proc/<pid>/cgroup`) as a directory under the
/// mount that shows `root` at `mount_point`; `None` when the mount doesn't
/// show that path.
fn dir_under_mount(path: &str, mount: &CgroupMount) -> Option<PathBuf> {
    let relative = Path::new(path).strip_prefix(&mount.root).ok()?;
    if relative.as_os_str().is_empty() {
        Some(mount.mount_point.clone())
    } else {
        Some(mount.mount_point.join(relative))
    }
}

/// A process's group in one cgroup v1 hierarchy.
#[derive(Debug)]
struct V1Group<'a> {
    /// The path in `/proc/<pid>/cgroup`.
    path: &'a str,
    /// Its directory.
    dir: PathBuf,
    /// The mount point of the hierarchy.
    mount_point: PathBuf,
}

/// The process's group in the v1 hierarchy of `controller`, from the first
/// mount of that hierarchy that shows it.
fn locate_v1<'a>(
    memberships: &[Membership<'a>],
    mounts: &[CgroupMount],
    controller: &str,
) -> Option<V1Group<'a>> {
    let membership = memberships
        .iter()
        .find(|m| m.controllers.contains(&controller))?;
    mounts
        .iter()
        .filter(|mount| {
            mount
                .v1_controllers
                .as_ref()
                .is_some_and(|controllers| controllers.iter().any(|c| c == controller))
        })
        .find_map(|mount| {
            Some(V1Group {
                path: membership.path,
                dir: dir_under_mount(membership.path, mount)?,
                mount_point: mount.mount_point.clone(),
            })
        })
}

/// The cgroup of a process from the contents of `/proc/<pid>/cgroup` and
/// `/proc/<pid>/mountinfo`.
///
/// cgroup v1 when the process is in a v1 memory hierarchy (a
/// `N:memory:/path` line, with that hierarchy mounted): the memory group is
/// `<memory mount>/<path>` and the cpuacct group is found the same way. Else
/// cgroup v2 when there is a `0::/path` line and a cgroup2 mount. On a hybrid
/// host the memory controller is bound to v1, so v1 comes first. Paths are
/// taken relative to the mount's root, so a container that mounts only its
/// own part of the hierarchy works too. `None` when neither is found.
pub fn locate_cgroup(proc_cgroup: &str, mountinfo: &str) -> Option<CgroupDirs> {
    let memberships: Vec<Membership<'_>> = memberships(proc_cgroup).collect();
    let mounts = cgroup_mounts(mountinfo);

    if let Some(memory) = locate_v1(&memberships, &mounts, "memory") {
        let cpu = locate_v1(&memberships, &mounts, "cpuacct");
        let cpu_is_shared = cpu
            .as_ref()
            .is_some_and(|cpu| cpu.path == "/" && memory.path != "/");
        return Some(CgroupDirs {
            version: CgroupVersion::V1,
            memory: memory.dir,
            cpu: cpu.map(|cpu| cpu.dir),
            cpu_is_shared,
            mount: memory.mount_point,
        });
    }

    let unified = memberships.iter().find(|m| m.controllers.is_empty())?;
    mounts
        .iter()
        .filter(|mount| mount.v1_controllers.is_none())
        .find_map(|mount| {
            let dir = dir_under_mount(unified.path, mount)?;
            Some(CgroupDirs {
                version: CgroupVersion::V2,
                memory: dir.clone(),
                cpu: Some(dir),
                cpu_is_shared: false,
                mount: mount.mount_point.clone(),
            })
        })
}

/// The cgroup of this process, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`; `None` (with a warning) when it can't be found.
pub fn own_cgroup() -> Option<CgroupDirs> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .inspect_err(|error| tracing::warn!(path, %error, "cannot read"))
            .ok()
    };
    let dirs = locate_cgroup(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?);
    if dirs.is_none() {
        tracing::warn!(
            "no cgroup found for this process: neither a mounted cgroup v1 memory hierarchy \
             nor a mounted cgroup v2 hierarchy in /proc/self/cgroup and /proc/self/mountinfo"
        );
    }
    dirs
}

pub(crate) fn read_file(dir: &Path, name: &str) -> Option<String> {
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

/// `memory.limit_in_bytes` is a byte count; an unlimited group shows a number
/// just under 2^63.
fn parse_v1_limit(contents: &str) -> Option<u64> {
    parse_number(contents).filter(|&limit| limit < V1_UNLIMITED_BYTES)
}

/// The value of `key` in a flat-keyed file (`memory.events`, `cpu.stat`,
/// `memory.oom_control`, `memory.stat`).
pub(crate) fn parse_keyed(contents: &str, key: &str) -> Option<u64> {
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
    fn v2_reads_every_file() {
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
        let expected = CgroupUsage {
            version: Some(CgroupVersion::V2),
            peak_memory_bytes: Some(9_123_456_789),
            memory_limit_bytes: Some(12_000_000_000),
            oom_kills: Some(3),
            cpu_usage_usec: Some(5_400_500_000),
        };
        assert_eq!(read_cgroup_v2(dir.path()), expected);
        let dirs = CgroupDirs::from_dir(dir.path());
        assert_eq!(dirs.version, CgroupVersion::V2);
        assert_eq!(read_cgroup(&dirs), expected);
    }

    #[test]
    fn v2_unlimited_memory_max_and_no_oom() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.max", "max\n");
        write(dir.path(), "memory.events", "oom 0\noom_kill 0\n");
        let usage = read_cgroup_v2(dir.path());
        assert_eq!(usage.memory_limit_bytes, None);
        assert_eq!(usage.oom_kills, Some(0));
        assert_eq!(usage.version, Some(CgroupVersion::V2));
    }

    #[test]
    fn v1_reads_every_file() {
        let memory = tempfile::tempdir().expect("tempdir");
        let cpuacct = tempfile::tempdir().expect("tempdir");
        write(memory.path(), "memory.max_usage_in_bytes", "67108864\n");
        write(memory.path(), "memory.limit_in_bytes", "67108864\n");
        write(
            memory.path(),
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        );
        write(cpuacct.path(), "cpuacct.usage", "1500000999\n");
        let usage = read_cgroup_v1(memory.path(), Some(cpuacct.path()));
        assert_eq!(
            usage,
            CgroupUsage {
                version: Some(CgroupVersion::V1),
                peak_memory_bytes: Some(64 << 20),
                memory_limit_bytes: Some(64 << 20),
                oom_kills: Some(1),
                cpu_usage_usec: Some(1_500_000),
            }
        );
        // Without a cpuacct group the CPU time is unknown.
        let usage = read_cgroup_v1(memory.path(), None);
        assert_eq!(usage.cpu_usage_usec, None);
        assert_eq!(usage.version, Some(CgroupVersion::V1));
    }

    #[test]
    fn v1_unlimited_group_takes_the_hierarchical_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.limit_in_bytes", "9223372036854771712\n");
        write(dir.path(), "memory.max_usage_in_bytes", "1048576\n");
        // An old kernel: no oom_kill line.
        write(
            dir.path(),
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\n",
        );
        let usage = read_cgroup_v1(dir.path(), None);
        assert_eq!(usage.memory_limit_bytes, None);
        assert_eq!(usage.oom_kills, None);
        assert_eq!(usage.peak_memory_bytes, Some(1 << 20));

        write(
            dir.path(),
            "memory.stat",
            "cache 0\nrss 1048576\nhierarchical_memory_limit 8589934592\n",
        );
        assert_eq!(
            read_cgroup_v1(dir.path(), None).memory_limit_bytes,
            Some(8 << 30)
        );
        write(
            dir.path(),
            "memory.stat",
            "hierarchical_memory_limit 9223372036854771712\n",
        );
        assert_eq!(read_cgroup_v1(dir.path(), None).memory_limit_bytes, None);
    }

    #[test]
    fn v1_fake_dir_is_recognised() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.max_usage_in_bytes", "2048\n");
        write(dir.path(), "cpuacct.usage", "3000\n");
        let dirs = CgroupDirs::from_dir(dir.path());
        assert_eq!(dirs.version, CgroupVersion::V1);
        let usage = read_cgroup(&dirs);
        assert_eq!(usage.peak_memory_bytes, Some(2048));
        assert_eq!(usage.cpu_usage_usec, Some(3));
    }

    #[test]
    fn missing_files_are_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_cgroup_v2(dir.path()), CgroupUsage::default());
        assert_eq!(read_cgroup_v1(dir.path(), None), CgroupUsage::default());
        assert_eq!(
            read_cgroup_v2(&dir.path().join("gone")),
            CgroupUsage::default()
        );
    }

    #[test]
    fn cpu_alone_is_not_cgroup_memory_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "cpuacct.usage", "5000\n");
        let usage = read_cgroup_v1(dir.path(), Some(dir.path()));
        assert_eq!(usage.cpu_usage_usec, Some(5));
        assert_eq!(usage.version, None);
    }

    #[test]
    fn malformed_files_are_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "memory.peak", "lots\n");
        write(dir.path(), "memory.events", "low 0\n");
        write(dir.path(), "cpu.stat", "usage_usec\n");
        assert_eq!(read_cgroup_v2(dir.path()), CgroupUsage::default());
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
        let dirs = CgroupDirs {
            mount: root.path().to_owned(),
            ..CgroupDirs::from_dir(&step)
        };
        assert_eq!(read_cgroup(&dirs).memory_limit_bytes, Some(8_000_000_000));
        // Outside the root nothing is read.
        let other = tempfile::tempdir().expect("tempdir");
        assert_eq!(ancestor_memory_limit(&step, other.path()), None);
    }

    const PURE_V2_MOUNTS: &str = "\
        22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
        30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";

    const HYBRID_MOUNTS: &str = "\
        31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

    const HYBRID_CGROUP: &str = "\
        9:name=systemd:/\n\
        4:memory:/process_api/1cab578e\n\
        2:cpuacct:/\n\
        1:cpu:/\n\
        0::/\n";

    #[test]
    fn locates_pure_v2() {
        let dirs =
            locate_cgroup("0::/system.slice/runner.service\n", PURE_V2_MOUNTS).expect("v2 group");
        assert_eq!(dirs.version, CgroupVersion::V2);
        assert_eq!(
            dirs.memory,
            Path::new("/sys/fs/cgroup/system.slice/runner.service")
        );
        assert_eq!(dirs.cpu.as_deref(), Some(dirs.memory.as_path()));
        assert_eq!(dirs.mount, Path::new("/sys/fs/cgroup"));
        let root = locate_cgroup("0::/\n", PURE_V2_MOUNTS).expect("v2 root");
        assert_eq!(root.memory, Path::new("/sys/fs/cgroup"));
    }

    #[test]
    fn locates_v1_memory_on_a_hybrid_host() {
        let dirs = locate_cgroup(HYBRID_CGROUP, HYBRID_MOUNTS).expect("v1 group");
        assert_eq!(dirs.version, CgroupVersion::V1);
        assert_eq!(
            dirs.memory,
            Path::new("/sys/fs/cgroup/memory/process_api/1cab578e")
        );
        assert_eq!(dirs.mount, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(
            dirs.cpu.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        // The cpuacct group is the whole machine while memory is confined.
        assert!(dirs.cpu_is_shared);

        let both = "6:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n";
        let mounts = "\
            40 31 0:40 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
            41 31 0:41 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let dirs = locate_cgroup(both, mounts).expect("v1 group");
        assert_eq!(dirs.memory, Path::new("/sys/fs/cgroup/memory/docker/abc"));
        assert_eq!(
            dirs.cpu.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct/docker/abc"))
        );
        assert!(!dirs.cpu_is_shared);
    }

    #[test]
    fn v1_path_is_relative_to_the_mount_root() {
        // A container that sees only its own group, mounted at the usual
        // place while /proc/self/cgroup shows the host's path.
        let proc_cgroup = "5:memory:/docker/abc\n";
        let mounts = "50 40 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        let dirs = locate_cgroup(proc_cgroup, mounts).expect("v1 group");
        assert_eq!(dirs.memory, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(dirs.cpu, None);
        // A mount that doesn't show the group is no use.
        let mounts = "50 40 0:32 /other /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        assert_eq!(locate_cgroup(proc_cgroup, mounts), None);
    }

    #[test]
    fn nothing_located_without_a_matching_mount() {
        // A v2 line but cgroup2 is not mounted; a v1 line but no v1 mount.
        assert_eq!(
            locate_cgroup("0::/x\n", HYBRID_MOUNTS.lines().next().unwrap_or("")),
            None
        );
        assert_eq!(locate_cgroup("4:memory:/x\n", PURE_V2_MOUNTS), None);
        assert_eq!(locate_cgroup("0::/gone (deleted)\n", PURE_V2_MOUNTS), None);
        assert_eq!(locate_cgroup("", PURE_V2_MOUNTS), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape_mountinfo(r"back\134slash"), r"back\slash");
        assert_eq!(unescape_mountinfo(r"trailing\04"), r"trailing\04");
    }
}
