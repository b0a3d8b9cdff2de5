//! A fresh cgroup for one command (`runyard-report run`): made before the
//! command starts, read after it ends, then removed.
//!
//! On cgroup v2 the group is a child of this process's group, which works
//! only where that group hands the memory controller down to its children
//! (`memory` in `cgroup.subtree_control`). On cgroup v1 the group is a child
//! in the memory hierarchy, plus one in the cpuacct hierarchy when that can
//! be made too.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;
use crate::cgroup::{CgroupDirs, CgroupVersion, read_file};

/// How many times removing a group is tried: right after the command exits
/// the kernel may still be tearing its last task down.
const REMOVE_ATTEMPTS: u32 = 20;
/// The pause between two tries.
const REMOVE_PAUSE: Duration = Duration::from_millis(25);
/// How many names `runyard-<pid>`, `runyard-<pid>-1`, ... are tried when a
/// stale group of the same name is in the way.
const NAME_ATTEMPTS: u32 = 10;

/// A cgroup made for one command. Move the command in with
/// [`ChildGroup::move_into`], read it through [`ChildGroup::dirs`], and
/// remove it with [`ChildGroup::remove`] once the command has ended.
#[derive(Debug)]
pub struct ChildGroup {
    dirs: CgroupDirs,
    /// The directories made, memory group first.
    created: Vec<PathBuf>,
}

impl ChildGroup {
    /// Where the command's usage is read.
    pub fn dirs(&self) -> &CgroupDirs {
        &self.dirs
    }

    /// Moves process `pid` into the group by writing it to `cgroup.procs`.
    /// The memory group must take it; if only the cpuacct group of cgroup v1
    /// refuses, the CPU time is left unknown.
    pub fn move_into(&mut self, pid: u32) -> Result<(), Error> {
        let pid = pid.to_string();
        let memory_procs = self.dirs.memory.join("cgroup.procs");
        std::fs::write(&memory_procs, &pid).map_err(|source| Error::Cgroup {
            action: "move the command into",
            path: memory_procs.clone(),
            source,
        })?;
        if let Some(cpu) = self.dirs.cpu.clone().filter(|cpu| *cpu != self.dirs.memory) {
            let cpu_procs = cpu.join("cgroup.procs");
            if let Err(error) = std::fs::write(&cpu_procs, &pid) {
                tracing::warn!(
                    path = %cpu_procs.display(),
                    %error,
                    "cannot move the command into its cpuacct group; its CPU time stays unknown"
                );
                self.dirs.cpu = None;
            }
        }
        Ok(())
    }

    /// Removes the group's directories. A process the command left behind
    /// (a daemon) would keep a group alive, so any such process is moved up
    /// to the parent group, where it keeps running. Blocks for up to half a
    /// second per directory while the kernel finishes with the group.
    pub fn remove(self) -> Result<(), Error> {
        let mut first_error = None;
        for dir in self.created.iter().rev() {
            if let Err(source) = remove_group_dir(dir) {
                first_error.get_or_insert(Error::Cgroup {
                    action: "remove",
                    path: dir.clone(),
                    source,
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Makes a child group named `name` (or `name-1`, `name-2`, ... when a stale
/// one is in the way) of `parent` with `memory_limit` bytes as its memory
/// limit (none when `None`), in the hierarchy `parent` is in.
///
/// The limit covers swap too (`memory.swap.max` 0 on v2,
/// `memory.memsw.limit_in_bytes` on v1 when the kernel accounts swap), as in
/// a Kubernetes pod, so a command over the limit is OOM-killed rather than
/// swapped out. The error names the file that could not be made or written.
pub fn create_child_group(
    parent: &CgroupDirs,
    name: &str,
    memory_limit: Option<u64>,
) -> Result<ChildGroup, Error> {
    match parent.version {
        CgroupVersion::V1 => create_v1(parent, name, memory_limit),
        CgroupVersion::V2 => create_v2(parent, name, memory_limit),
    }
}

fn create_v2(
    parent: &CgroupDirs,
    name: &str,
    memory_limit: Option<u64>,
) -> Result<ChildGroup, Error> {
    let subtree_control = parent.memory.join("cgroup.subtree_control");
    if !memory_delegated(&parent.memory) {
        // Succeeds only where the group has no processes of its own (the
        // kernel's "no internal processes" rule), so usually it fails with
        // "Device or resource busy" and the error says why.
        std::fs::write(&subtree_control, "+memory").map_err(|source| Error::Cgroup {
            action: "enable the memory controller for child groups in",
            path: subtree_control.clone(),
            source,
        })?;
        if !memory_delegated(&parent.memory) {
            return Err(Error::Cgroup {
                action: "enable the memory controller for child groups in",
                path: subtree_control,
                source: io::Error::other("`memory` is still not listed after writing +memory"),
            });
        }
    }
    let dir = make_unique_dir(&parent.memory, name)?;
    let group = ChildGroup {
        dirs: CgroupDirs {
            version: CgroupVersion::V2,
            memory: dir.clone(),
            cpu: Some(dir.clone()),
            cpu_is_shared: false,
            mount: parent.mount.clone(),
        },
        created: vec![dir.clone()],
    };
    if let Some(limit) = memory_limit {
        if let Err(error) = write_limit(&dir, "memory.max", limit) {
            discard(group);
            return Err(error);
        }
        write_best_effort(&dir.join("memory.swap.max"), "0");
    }
    Ok(group)
}

fn create_v1(
    parent: &CgroupDirs,
    name: &str,
    memory_limit: Option<u64>,
) -> Result<ChildGroup, Error> {
    let memory = make_unique_dir(&parent.memory, name)?;
    let mut group = ChildGroup {
        dirs: CgroupDirs {
            version: CgroupVersion::V1,
            memory: memory.clone(),
            cpu: None,
            cpu_is_shared: false,
            mount: parent.mount.clone(),
        },
        created: vec![memory.clone()],
    };
    if let Some(limit) = memory_limit {
        if let Err(error) = write_limit(&memory, "memory.limit_in_bytes", limit) {
            discard(group);
            return Err(error);
        }
        // Only there when the kernel accounts swap; it must not be below
        // memory.limit_in_bytes, so it is written second.
        let memsw = memory.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write_best_effort(&memsw, &limit.to_string());
        }
    }
    // The same name in the cpuacct hierarchy, so that both groups belong
    // together when someone looks.
    let Some(name) = memory.file_name() else {
        return Ok(group);
    };
    if let Some(cpu_parent) = &parent.cpu {
        let cpu = cpu_parent.join(name);
        match std::fs::create_dir(&cpu) {
            Ok(()) => {
                group.created.push(cpu.clone());
                group.dirs.cpu = Some(cpu);
            }
            Err(error) => tracing::info!(
                path = %cpu.display(),
                %error,
                "cannot make a cpuacct group for the command; its CPU time stays unknown"
            ),
        }
    }
    Ok(group)
}

/// Whether `memory` is in the group's `cgroup.subtree_control`, i.e. its
/// children get the memory controller (and `memory.max`, `memory.peak`).
fn memory_delegated(dir: &Path) -> bool {
    read_file(dir, "cgroup.subtree_control")
        .is_some_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"))
}

/// Makes `parent/name`, or `parent/name-N` when that exists already.
fn make_unique_dir(parent: &Path, name: &str) -> Result<PathBuf, Error> {
    let mut last_error = None;
    for n in 0..NAME_ATTEMPTS {
        let dir = match n {
            0 => parent.join(name),
            n => parent.join(format!("{name}-{n}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = Some(error),
            Err(source) => {
                return Err(Error::Cgroup {
                    action: "create",
                    path: dir,
                    source,
                });
            }
        }
    }
    Err(Error::Cgroup {
        action: "create",
        path: parent.join(name),
        source: last_error.unwrap_or_else(|| io::Error::other("no free name")),
    })
}

fn write_limit(dir: &Path, file: &str, limit: u64) -> Result<(), Error> {
    let path = dir.join(file);
    std::fs::write(&path, limit.to_string()).map_err(|source| Error::Cgroup {
        action: "set the memory limit in",
        path,
        source,
    })
}

fn write_best_effort(path: &Path, value: &str) {
    if let Err(error) = std::fs::write(path, value) {
        tracing::debug!(path = %path.display(), %error, "cannot write cgroup file");
    }
}

/// Removes a group that turned out unusable, logging what can't be removed.
fn discard(group: ChildGroup) {
    if let Err(error) = group.remove() {
        let error = crate::error_chain(&error);
        tracing::warn!(%error, "cannot remove an unused cgroup");
    }
}

/// `rmdir` of a cgroup directory, retried while the kernel still counts a
/// task in it; processes still in it are moved to the parent group first.
fn remove_group_dir(dir: &Path) -> io::Result<()> {
    let mut last_error = io::Error::other("not tried");
    for _ in 0..REMOVE_ATTEMPTS {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => last_error = error,
        }
        move_processes_up(dir);
        std::thread::sleep(REMOVE_PAUSE);
    }
    Err(last_error)
}

/// Moves every process still in group `dir` to its parent group.
fn move_processes_up(dir: &Path) {
    let (Some(procs), Some(parent)) = (read_file(dir, "cgroup.procs"), dir.parent()) else {
        return;
    };
    let parent_procs = parent.join("cgroup.procs");
    for pid in procs.split_whitespace() {
        tracing::info!(pid, group = %dir.display(), "moving a process the command left behind to the parent group");
        write_best_effort(&parent_procs, pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent_dirs(version: CgroupVersion, memory: &Path, cpu: Option<&Path>) -> CgroupDirs {
        CgroupDirs {
            version,
            memory: memory.to_owned(),
            cpu: cpu.map(Path::to_owned),
            cpu_is_shared: false,
            mount: memory.to_owned(),
        }
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).expect("read fake cgroup file")
    }

    #[test]
    fn v1_child_gets_the_limit_and_a_cpuacct_group() {
        let memory = tempfile::tempdir().expect("tempdir");
        let cpuacct = tempfile::tempdir().expect("tempdir");
        let parent = parent_dirs(CgroupVersion::V1, memory.path(), Some(cpuacct.path()));
        let mut group =
            create_child_group(&parent, "runyard-42", Some(64 << 20)).expect("child group");
        let child = memory.path().join("runyard-42");
        assert_eq!(group.dirs().memory, child);
        assert_eq!(group.dirs().version, CgroupVersion::V1);
        assert_eq!(
            group.dirs().cpu.as_deref(),
            Some(cpuacct.path().join("runyard-42").as_path())
        );
        assert_eq!(read(&child.join("memory.limit_in_bytes")), "67108864");

        group.move_into(4242).expect("move");
        assert_eq!(read(&child.join("cgroup.procs")), "4242");
        assert_eq!(
            read(&cpuacct.path().join("runyard-42/cgroup.procs")),
            "4242"
        );
    }

    #[test]
    fn v1_without_a_limit_writes_none_and_a_stale_name_is_skipped() {
        let memory = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(memory.path().join("runyard-7")).expect("stale group");
        let parent = parent_dirs(CgroupVersion::V1, memory.path(), None);
        let group = create_child_group(&parent, "runyard-7", None).expect("child group");
        assert_eq!(group.dirs().memory, memory.path().join("runyard-7-1"));
        assert!(!group.dirs().memory.join("memory.limit_in_bytes").exists());
        assert_eq!(group.dirs().cpu, None);
    }

    #[test]
    fn v2_child_needs_the_memory_controller_delegated() {
        let parent_dir = tempfile::tempdir().expect("tempdir");
        let parent = parent_dirs(
            CgroupVersion::V2,
            parent_dir.path(),
            Some(parent_dir.path()),
        );
        std::fs::write(
            parent_dir.path().join("cgroup.subtree_control"),
            "cpu pids\n",
        )
        .expect("write subtree_control");
        let err = create_child_group(&parent, "runyard-1", Some(1 << 20)).expect_err("no memory");
        let message = crate::error_chain(&err);
        assert!(message.contains("cgroup.subtree_control"), "{message}");
        assert!(!parent_dir.path().join("runyard-1").exists());

        std::fs::write(
            parent_dir.path().join("cgroup.subtree_control"),
            "cpu memory pids\n",
        )
        .expect("write subtree_control");
        let mut group =
            create_child_group(&parent, "runyard-1", Some(64 << 20)).expect("child group");
        let child = parent_dir.path().join("runyard-1");
        assert_eq!(group.dirs().memory, child);
        assert_eq!(group.dirs().cpu.as_deref(), Some(child.as_path()));
        assert_eq!(group.dirs().version, CgroupVersion::V2);
        assert_eq!(read(&child.join("memory.max")), "67108864");
        assert_eq!(read(&child.join("memory.swap.max")), "0");
        group.move_into(99).expect("move");
        assert_eq!(read(&child.join("cgroup.procs")), "99");
    }

    #[test]
    fn creation_error_names_the_directory() {
        let parent = parent_dirs(
            CgroupVersion::V1,
            Path::new("/nonexistent/runyard/memory"),
            None,
        );
        let err = create_child_group(&parent, "runyard-1", None).expect_err("no parent");
        let message = crate::error_chain(&err);
        assert!(
            message.contains("cannot create /nonexistent/runyard/memory/runyard-1"),
            "{message}"
        );
    }
}
