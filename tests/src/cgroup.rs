//! Reading the truth about a container's CPUs: its cgroup v1 `cpuset.cpus` /
//! `cpuset.mems`, the `Cpus_allowed_list` its processes see, and its
//! environment; and removing pod cgroups from every hierarchy afterwards.
//!
//! Parsers are plain functions over the text of `/proc` and `/sys` files; the
//! functions that read those files are thin wrappers around them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shared_state::{CpuSet, CpuSetError};

use crate::cri::{CriClient, CriError};

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
    #[error("process {pid} is in no cpuset cgroup (no cpuset line in /proc/{pid}/cgroup)")]
    NoCpusetCgroup { pid: u32 },
    #[error("no cgroup v1 cpuset hierarchy is mounted (see {MOUNTINFO})")]
    NoCpusetMount,
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

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    /// `false` for a cgroup v1 hierarchy, `true` for the cgroup2 one.
    pub unified: bool,
    /// Controllers of a v1 hierarchy (`cpu`, `cpuset`, `name=systemd`, ...).
    pub controllers: Vec<String>,
}

/// Mount options of a v1 cgroup mount that name no controller.
const NON_CONTROLLER_OPTIONS: &[&str] = &["rw", "ro", "clone_children", "noprefix", "xattr"];

/// The cgroup hierarchies listed in `/proc/self/mountinfo` text, one entry
/// per hierarchy even when it is mounted more than once.
pub fn parse_cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut seen_devices = Vec::new();
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let (Some(device), Some(root), Some(mount_point), Some(fs_type)) =
            (left.get(2), left.get(3), left.get(4), right.first())
        else {
            continue;
        };
        let unified = match *fs_type {
            "cgroup" => false,
            "cgroup2" => true,
            _ => continue,
        };
        // A bind mount of a sub-tree is not where this hierarchy's paths start.
        if *root != "/" || seen_devices.contains(device) {
            continue;
        }
        seen_devices.push(*device);
        let controllers = if unified {
            Vec::new()
        } else {
            right
                .get(2)
                .map(|options| {
                    options
                        .split(',')
                        .filter(|o| !NON_CONTROLLER_OPTIONS.contains(o))
                        .filter(|o| !o.contains('=') || o.starts_with("name="))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        mounts.push(CgroupMount {
            mount_point: PathBuf::from(unescape_mount_path(mount_point)),
            unified,
            controllers,
        });
    }
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let octal = &bytes[i + 1..i + 4];
            if octal.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let value = octal
                    .iter()
                    .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                if let Ok(value) = u8::try_from(value) {
                    out.push(value);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCgroup {
    pub hierarchy_id: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_proc_cgroup(content: &str, source: &Path) -> Result<Vec<ProcCgroup>, CgroupError> {
    content
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let malformed = || CgroupError::Malformed {
                path: source.to_path_buf(),
                line: line.to_string(),
            };
            let mut parts = line.splitn(3, ':');
            let id = parts.next().ok_or_else(malformed)?;
            let controllers = parts.next().ok_or_else(malformed)?;
            let path = parts.next().ok_or_else(malformed)?;
            Ok(ProcCgroup {
                hierarchy_id: id.parse().map_err(|_| malformed())?,
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// The `Cpus_allowed_list` of `/proc/<pid>/status` text.
pub fn parse_cpus_allowed_list(status: &str) -> Option<&str> {
    status.lines().find_map(|line| {
        line.strip_prefix("Cpus_allowed_list:")
            .map(|value| value.trim())
    })
}

/// `env` output as a map (a value may contain `=`; lines without one are
/// continuations of a multi-line value and are skipped).
pub fn parse_env(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn read_to_string(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_cpulist(path: &Path) -> Result<CpuSet, CgroupError> {
    let value = read_to_string(path)?;
    CpuSet::parse_cpulist(value.trim()).map_err(|source| CgroupError::CpuList {
        path: path.to_path_buf(),
        value: value.trim().to_string(),
        source,
    })
}

/// The CPUs this machine has online.
pub fn online_cpus() -> Result<CpuSet, CgroupError> {
    read_cpulist(Path::new(ONLINE_CPUS))
}

/// Every cgroup hierarchy mounted on this machine.
pub fn cgroup_mounts() -> Result<Vec<CgroupMount>, CgroupError> {
    Ok(parse_cgroup_mounts(&read_to_string(Path::new(MOUNTINFO))?))
}

fn cpuset_mount() -> Result<PathBuf, CgroupError> {
    cgroup_mounts()?
        .into_iter()
        .find(|m| !m.unified && m.controllers.iter().any(|c| c == "cpuset"))
        .map(|m| m.mount_point)
        .ok_or(CgroupError::NoCpusetMount)
}

/// The cpuset cgroup directory of a process, e.g.
/// `/sys/fs/cgroup/cpuset/kubepods/pod<uid>/<container id>`.
pub fn cpuset_dir_of(pid: u32) -> Result<PathBuf, CgroupError> {
    let source = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let entries = parse_proc_cgroup(&read_to_string(&source)?, &source)?;
    let entry = entries
        .into_iter()
        .find(|e| e.controllers.iter().any(|c| c == "cpuset"))
        .ok_or(CgroupError::NoCpusetCgroup { pid })?;
    Ok(cpuset_mount()?.join(entry.path.trim_start_matches('/')))
}

/// What a cpuset cgroup directory says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupCpuset {
    pub dir: PathBuf,
    pub cpus: CpuSet,
    pub mems: CpuSet,
}

pub fn read_cpuset_dir(dir: &Path) -> Result<CgroupCpuset, CgroupError> {
    Ok(CgroupCpuset {
        dir: dir.to_path_buf(),
        cpus: read_cpulist(&dir.join("cpuset.cpus"))?,
        mems: read_cpulist(&dir.join("cpuset.mems"))?,
    })
}

/// Everything that says where a container may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCpus {
    /// From the container's cgroup (`cpuset.cpus`, `cpuset.mems`).
    pub cgroup: CgroupCpuset,
    /// `Cpus_allowed_list` of a process started inside the container.
    pub allowed_inside: CpuSet,
}

/// Reads a container's cpuset from its cgroup and from inside it.
pub async fn container_cpus(cri: &mut CriClient, id: &str) -> Result<ContainerCpus, CgroupError> {
    let pid = cri.container_pid(id).await?;
    let cgroup = read_cpuset_dir(&cpuset_dir_of(pid)?)?;
    Ok(ContainerCpus {
        cgroup,
        allowed_inside: cpus_allowed_inside(cri, id).await?,
    })
}

/// `Cpus_allowed_list` of a process exec'd in the container.
pub async fn cpus_allowed_inside(cri: &mut CriClient, id: &str) -> Result<CpuSet, CgroupError> {
    let status = cri.exec_ok(id, &["cat", "/proc/self/status"]).await?;
    let value = parse_cpus_allowed_list(&status).ok_or_else(|| CgroupError::NoCpusAllowed {
        id: id.to_string(),
        output: status.clone(),
    })?;
    CpuSet::parse_cpulist(value).map_err(|source| CgroupError::CpusAllowed {
        id: id.to_string(),
        value: value.to_string(),
        source,
    })
}

/// The environment a process exec'd in the container sees.
pub async fn container_env(
    cri: &mut CriClient,
    id: &str,
) -> Result<BTreeMap<String, String>, CgroupError> {
    Ok(parse_env(&cri.exec_ok(id, &["env"]).await?))
}

/// Directories of `relative` (e.g. `kubepods/pod<uid>`) that exist in any
/// mounted hierarchy.
pub fn existing_dirs(relative: &str) -> Result<Vec<PathBuf>, CgroupError> {
    let relative = relative.trim_start_matches('/');
    Ok(cgroup_mounts()?
        .into_iter()
        .map(|m| m.mount_point.join(relative))
        .filter(|dir| dir.is_dir())
        .collect())
}

fn procs_of(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills every process in `dir` and its children and removes them, deepest
/// first. A missing directory is not an error.
pub fn remove_cgroup_tree(dir: &Path) -> Result<(), CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    // A frozen cgroup would hold its processes through SIGKILL.
    let freezer_state = dir.join("freezer.state");
    if freezer_state.exists() {
        let _ = std::fs::write(&freezer_state, "THAWED");
    }
    // Processes can take a moment to exit after SIGKILL, and an rmdir of a
    // cgroup whose last task is exiting answers EBUSY: retry briefly.
    let mut last_error = None;
    for _ in 0..500 {
        let pids = procs_of(dir);
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last_error = Some(e),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let pids = procs_of(dir);
    if !pids.is_empty() {
        return Err(CgroupError::Busy {
            path: dir.to_path_buf(),
            pids,
        });
    }
    Err(CgroupError::Remove {
        path: dir.to_path_buf(),
        source: last_error.unwrap_or_else(|| std::io::Error::other("rmdir kept failing")),
    })
}

/// Removes `relative` (e.g. `kubepods/pod<uid>`) from every mounted
/// hierarchy, killing what still runs in it.
pub fn remove_everywhere(relative: &str) -> Result<(), CgroupError> {
    for dir in existing_dirs(relative)? {
        remove_cgroup_tree(&dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO_SAMPLE: &str = "\
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

    #[test]
    fn mounts_list_each_hierarchy_once_with_controllers() {
        let mounts = parse_cgroup_mounts(MOUNTINFO_SAMPLE);
        let summary: Vec<(String, bool, Vec<String>)> = mounts
            .iter()
            .map(|m| {
                (
                    m.mount_point.to_string_lossy().to_string(),
                    m.unified,
                    m.controllers.clone(),
                )
            })
            .collect();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            summary,
            vec![
                ("/sys/fs/cgroup/cpu".into(), false, s(&["cpu"])),
                ("/sys/fs/cgroup/cpuset".into(), false, s(&["cpuset"])),
                (
                    "/sys/fs/cgroup/cpu,cpuacct".into(),
                    false,
                    s(&["cpu", "cpuacct"])
                ),
                ("/sys/fs/cgroup/systemd".into(), false, s(&["name=systemd"])),
                ("/sys/fs/cgroup/unified".into(), true, vec![]),
                ("/mnt/with space".into(), false, s(&["pids"])),
            ]
        );
    }

    #[test]
    fn proc_cgroup_lines_parse() {
        let text = "12:cpuset:/kubepods/podu/abc\n1:name=systemd:/x\n0::/\n";
        let entries = parse_proc_cgroup(text, Path::new("/proc/1/cgroup")).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].controllers, vec!["cpuset"]);
        assert_eq!(entries[0].path, "/kubepods/podu/abc");
        assert_eq!(entries[2].hierarchy_id, 0);
        assert!(entries[2].controllers.is_empty());
        for bad in ["nocolons", "x:cpu:/", "3:cpu"] {
            let err = parse_proc_cgroup(bad, Path::new("/proc/1/cgroup")).unwrap_err();
            assert!(err.to_string().contains("/proc/1/cgroup"), "{bad}: {err}");
        }
    }

    #[test]
    fn cpus_allowed_list_is_found() {
        let table = [
            (
                "Name:\tcat\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n",
                Some("0-1"),
            ),
            ("Cpus_allowed_list:\t0,2-3", Some("0,2-3")),
            ("Name:\tcat\n", None),
        ];
        for (status, expected) in table {
            assert_eq!(parse_cpus_allowed_list(status), expected, "{status:?}");
        }
    }

    #[test]
    fn env_output_parses_with_equals_in_values() {
        let env = parse_env("PATH=/bin\nA=b=c\nnot a var\n=x\nEMPTY=\n");
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert_eq!(env.get("A").map(String::as_str), Some("b=c"));
        assert_eq!(env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(env.len(), 3);
    }

    proptest::proptest! {
        #[test]
        fn env_round_trips(vars in proptest::collection::btree_map("[A-Z_][A-Z0-9_]{0,8}", "[ -~]{0,16}", 0..8)) {
            let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            proptest::prop_assert_eq!(parse_env(&text), vars);
        }

        #[test]
        fn mount_paths_unescape_any_byte(name in "[a-z ]{1,12}") {
            let escaped = name.replace(' ', "\\040");
            proptest::prop_assert_eq!(unescape_mount_path(&escaped), name);
        }
    }

    #[test]
    fn missing_cgroup_tree_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        remove_cgroup_tree(&dir.path().join("absent")).unwrap();
    }
}
