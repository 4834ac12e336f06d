//! Reading the truth about a container's CPUs: its cgroup's cpuset files,
//! the `Cpus_allowed_list` its processes see, and its environment; and
//! removing pod cgroups from every hierarchy afterwards.
//!
//! Both cgroup versions are read. On cgroup v1 the cpuset controller has its
//! own hierarchy (`/sys/fs/cgroup/cpuset`), a process names its place in it on
//! the `N:cpuset:/path` line of `/proc/<pid>/cgroup`, and a cgroup holds
//! `cpuset.cpus` / `cpuset.mems` (always set: a v1 cpuset cgroup cannot run
//! a task with them empty) and `cpuset.effective_cpus` / `cpuset.effective_mems`.
//! On cgroup v2 there is one hierarchy (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` beside v1 ones on a hybrid host), the cpuset
//! controller is usable there only when the root's `cgroup.controllers` lists
//! it (it is not bound to a v1 hierarchy), a process's place is the single
//! `0::/path` line, and a cgroup has `cpuset.cpus` / `cpuset.mems` only when
//! its parent lists `cpuset` in `cgroup.subtree_control`. Those files hold
//! what was requested and are empty until someone writes them (runc writes
//! them only when the OCI spec sets CPUs); `cpuset.cpus.effective` /
//! `cpuset.mems.effective` hold what the kernel grants. Pod cgroups are killed
//! through `cgroup.kill` (v2, Linux 5.14+) or by SIGKILL to every pid in
//! `cgroup.procs`, then removed leaf first.
//!
//! Parsers and decisions are plain functions over the text of `/proc` and
//! `/sys` files; the functions that read those files are thin wrappers.

pub mod container;
pub mod cpuset;
pub mod hierarchy;
pub mod mounts;
pub mod removal;
pub mod weight;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use shared_state::{CpuSet, CpuSetError};

use crate::cri::CriError;

/// The CPUs the kernel has online, as a cpulist file.
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";
const MOUNTINFO: &str = "/proc/self/mountinfo";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds an invalid cpulist {value:?}: {source}")]
    CpuList {
        path: PathBuf,
        value: String,
        source: CpuSetError,
    },
    #[error("malformed line {line:?} in {path}")]
    Malformed { path: PathBuf, line: String },
    #[error("process {pid} is in no cpuset cgroup: /proc/{pid}/cgroup has no {wanted} line")]
    NoCpusetCgroup { pid: u32, wanted: &'static str },
    #[error("the cpuset controller is in no mounted cgroup hierarchy: no cgroup v1 hierarchy with cpuset is mounted, and {cgroup2}; on cgroup v2 the root's cgroup.controllers must list cpuset (it must not be bound to a v1 hierarchy), then enable it with `echo +cpuset > <mount>/cgroup.subtree_control` (see {MOUNTINFO})")]
    NoCpusetHierarchy { cgroup2: String },
    #[error("cgroup {dir} has no cpuset files: the cpuset controller is not enabled for it; enable it with `echo +cpuset > {parent}/cgroup.subtree_control` (and in every ancestor up to the cgroup2 mount)")]
    CpusetNotEnabled { dir: PathBuf, parent: PathBuf },
    #[error("{dir} is not a cpuset cgroup directory (neither cgroup.controllers nor cpuset.cpus is in it)")]
    NotACgroup { dir: PathBuf },
    #[error("process {pid} is in no {controller} cgroup: /proc/{pid}/cgroup has no {wanted} line")]
    NotInHierarchy {
        pid: u32,
        controller: &'static str,
        wanted: &'static str,
    },
    #[error("no mounted cgroup hierarchy offers the {controller} controller (see {MOUNTINFO})")]
    NoController { controller: &'static str },
    #[error("cannot write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error("container {id}: no Cpus_allowed_list line in /proc/self/status: {output:?}")]
    NoCpusAllowed { id: String, output: String },
    #[error("container {id}: invalid Cpus_allowed_list {value:?}: {source}")]
    CpusAllowed {
        id: String,
        value: String,
        source: CpuSetError,
    },
    #[error("cannot remove cgroup {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cgroup {path} still has processes {pids:?} after SIGKILL")]
    Busy { path: PathBuf, pids: Vec<i32> },
    #[error(transparent)]
    Cri(#[from] CriError),
}

fn read_to_string(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_cpulist_at(path: &Path, value: &str) -> Result<CpuSet, CgroupError> {
    CpuSet::parse_cpulist(value.trim()).map_err(|source| CgroupError::CpuList {
        path: path.to_path_buf(),
        value: value.trim().to_string(),
        source,
    })
}

fn read_cpulist(path: &Path) -> Result<CpuSet, CgroupError> {
    parse_cpulist_at(path, &read_to_string(path)?)
}

/// The CPUs this machine has online.
pub fn online_cpus() -> Result<CpuSet, CgroupError> {
    read_cpulist(Path::new(ONLINE_CPUS))
}

/// The CPUs of each NUMA node by its number
/// (`/sys/devices/system/node/node<N>/cpulist`); node 0 with every online
/// CPU where the kernel lists no NUMA nodes.
pub fn numa_node_cpus() -> Result<BTreeMap<u32, CpuSet>, CgroupError> {
    let dir = Path::new("/sys/devices/system/node");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(BTreeMap::from([(0, online_cpus()?)]))
        }
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut nodes = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        nodes.insert(number, read_cpulist(&entry.path().join("cpulist"))?);
    }
    Ok(nodes)
}

/// Files the tests of several rooms read.
#[cfg(test)]
mod test_files {
    use std::path::Path;

    pub(super) const MOUNTINFO_SAMPLE: &str = "\
23 1 0:21 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
35 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd,release_agent=/x
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:31 / /mnt/again rw,relatime - cgroup cgroup rw,cpuset
43 31 0:32 /sub /mnt/sub rw,relatime - cgroup cgroup rw,cpu,cpuacct
44 31 0:39 / /mnt/with\\040space rw - cgroup cgroup rw,pids
";

    pub(super) fn write_files(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
}
