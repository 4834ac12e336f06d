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

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    /// `false` for a cgroup v1 hierarchy, `true` for the cgroup2 one.
    pub unified: bool,
    /// Controllers of the hierarchy: of a v1 one from its mount options
    /// (`cpu`, `cpuset`, `name=systemd`, ...); of the cgroup2 one what its
    /// root's `cgroup.controllers` lists (empty from [`parse_cgroup_mounts`],
    /// filled by [`cgroup_mounts`]).
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

/// Every cgroup hierarchy mounted on this machine; a cgroup2 mount lists the
/// controllers its root's `cgroup.controllers` offers.
pub fn cgroup_mounts() -> Result<Vec<CgroupMount>, CgroupError> {
    let mut mounts = parse_cgroup_mounts(&read_to_string(Path::new(MOUNTINFO))?);
    for mount in mounts.iter_mut().filter(|m| m.unified) {
        // Every cgroup2 root has this file; one that cannot be read offers
        // nothing, which find_cpuset_hierarchy reports by name.
        let listed = mount.mount_point.join("cgroup.controllers");
        mount.controllers = std::fs::read_to_string(&listed)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
    }
    Ok(mounts)
}

/// Where the cpuset controller lives on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpusetHierarchy {
    /// A cgroup v1 hierarchy with the cpuset controller, mounted here.
    V1 { mount_point: PathBuf },
    /// The cgroup2 hierarchy, mounted here, whose root offers cpuset.
    V2 { mount_point: PathBuf },
}

impl CpusetHierarchy {
    pub fn mount_point(&self) -> &Path {
        match self {
            CpusetHierarchy::V1 { mount_point } | CpusetHierarchy::V2 { mount_point } => {
                mount_point
            }
        }
    }

    /// The cgroup path of a process in this hierarchy, from the entries of
    /// its `/proc/<pid>/cgroup`: the `N:...cpuset...:/path` line on v1, the
    /// `0::/path` line on v2 (a hybrid host lists both kinds).
    pub fn path_of<'a>(&self, entries: &'a [ProcCgroup]) -> Option<&'a str> {
        entries
            .iter()
            .find(|e| match self {
                CpusetHierarchy::V1 { .. } => e.controllers.iter().any(|c| c == "cpuset"),
                CpusetHierarchy::V2 { .. } => e.hierarchy_id == 0 && e.controllers.is_empty(),
            })
            .map(|e| e.path.as_str())
    }

    /// The line [`CpusetHierarchy::path_of`] looks for, for error messages.
    pub fn wanted_line(&self) -> &'static str {
        match self {
            CpusetHierarchy::V1 { .. } => "`N:cpuset:/path`",
            CpusetHierarchy::V2 { .. } => "`0::/path`",
        }
    }

    /// The directory of cgroup `path` (as `/proc/<pid>/cgroup` writes it).
    pub fn dir_of(&self, path: &str) -> PathBuf {
        self.mount_point().join(path.trim_start_matches('/'))
    }
}

/// Picks the hierarchy that holds the cpuset controller. A v1 cpuset
/// hierarchy wins: when one is mounted the controller is bound to it and a
/// cgroup2 mount beside it (a hybrid host's `unified`) cannot offer it.
pub fn find_cpuset_hierarchy(mounts: &[CgroupMount]) -> Result<CpusetHierarchy, CgroupError> {
    let has_cpuset = |m: &&CgroupMount| m.controllers.iter().any(|c| c == "cpuset");
    if let Some(m) = mounts.iter().filter(|m| !m.unified).find(has_cpuset) {
        return Ok(CpusetHierarchy::V1 {
            mount_point: m.mount_point.clone(),
        });
    }
    if let Some(m) = mounts.iter().filter(|m| m.unified).find(has_cpuset) {
        return Ok(CpusetHierarchy::V2 {
            mount_point: m.mount_point.clone(),
        });
    }
    let cgroup2: Vec<String> = mounts
        .iter()
        .filter(|m| m.unified)
        .map(|m| {
            format!(
                "the cgroup2 mount {} offers only [{}] in cgroup.controllers",
                m.mount_point.display(),
                m.controllers.join(" ")
            )
        })
        .collect();
    Err(CgroupError::NoCpusetHierarchy {
        cgroup2: if cgroup2.is_empty() {
            "no cgroup2 hierarchy is mounted".to_string()
        } else {
            cgroup2.join("; ")
        },
    })
}

/// The hierarchy that holds the cpuset controller on this machine.
pub fn cpuset_hierarchy() -> Result<CpusetHierarchy, CgroupError> {
    find_cpuset_hierarchy(&cgroup_mounts()?)
}

/// On cgroup v2, lists `cpuset` in the `cgroup.subtree_control` of the
/// hierarchy's root, so that pod cgroups created below it get cpuset files.
/// runc enables every controller down a new cgroup's path too; doing it
/// first turns a missing controller into this clear error at start-up
/// instead of a runc failure inside CreateContainer. On v1 there is nothing
/// to enable. Returns the hierarchy.
pub fn enable_cpuset_for_pods() -> Result<CpusetHierarchy, CgroupError> {
    let hierarchy = cpuset_hierarchy()?;
    if let CpusetHierarchy::V2 { mount_point } = &hierarchy {
        let control = mount_point.join("cgroup.subtree_control");
        let enabled = read_to_string(&control)?;
        if !enabled.split_whitespace().any(|c| c == "cpuset") {
            std::fs::write(&control, "+cpuset").map_err(|source| CgroupError::Write {
                path: control.clone(),
                value: "+cpuset".to_string(),
                source,
            })?;
        }
    }
    Ok(hierarchy)
}

/// The cpuset cgroup directory of a process, e.g.
/// `/sys/fs/cgroup/cpuset/kubepods/pod<uid>/<container id>` on cgroup v1 or
/// `/sys/fs/cgroup/kubepods/pod<uid>/<container id>` on cgroup v2.
pub fn cpuset_dir_of(pid: u32) -> Result<PathBuf, CgroupError> {
    let hierarchy = cpuset_hierarchy()?;
    let source = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let entries = parse_proc_cgroup(&read_to_string(&source)?, &source)?;
    let path = hierarchy
        .path_of(&entries)
        .ok_or(CgroupError::NoCpusetCgroup {
            pid,
            wanted: hierarchy.wanted_line(),
        })?;
    Ok(hierarchy.dir_of(path))
}

/// Which file a reported set was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpusetSource {
    /// `cpuset.cpus` / `cpuset.mems`: what was written to the cgroup.
    Requested,
    /// `cpuset.cpus.effective` / `cpuset.mems.effective` (v2), or
    /// `cpuset.effective_cpus` / `cpuset.effective_mems` (v1): what the
    /// kernel grants. Reported when nothing was requested (an empty
    /// `cpuset.cpus` on v2 means "inherit the parent's").
    Effective,
}

/// One cpuset resource (CPUs or memory nodes) of a cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpusetValue {
    /// What this reports: the requested set when one was written, else the
    /// effective set; `source` says which.
    pub reported: CpuSet,
    pub source: CpusetSource,
    /// `None` when the file is empty (v2: not set) or absent (a root cgroup).
    pub requested: Option<CpuSet>,
    /// `None` only on an old v1 kernel without the effective files.
    pub effective: Option<CpuSet>,
}

/// The cgroup version of a directory, told by the files it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    /// The requested and the effective file of `cpus` (else mems).
    fn files(self, cpus: bool) -> (&'static str, &'static str) {
        match (self, cpus) {
            (CgroupVersion::V1, true) => ("cpuset.cpus", "cpuset.effective_cpus"),
            (CgroupVersion::V1, false) => ("cpuset.mems", "cpuset.effective_mems"),
            (CgroupVersion::V2, true) => ("cpuset.cpus", "cpuset.cpus.effective"),
            (CgroupVersion::V2, false) => ("cpuset.mems", "cpuset.mems.effective"),
        }
    }
}

/// Which version a cgroup directory holding `has(file)` files is, or why it
/// cannot be read as a cpuset cgroup. Only v2 directories have
/// `cgroup.controllers`; a v2 one without `cpuset.cpus.effective` is a
/// cgroup whose parent did not enable the cpuset controller.
pub fn cgroup_version_of(
    dir: &Path,
    has: impl Fn(&str) -> bool,
) -> Result<CgroupVersion, CgroupError> {
    if has("cgroup.controllers") {
        if has("cpuset.cpus.effective") {
            return Ok(CgroupVersion::V2);
        }
        return Err(CgroupError::CpusetNotEnabled {
            dir: dir.to_path_buf(),
            parent: dir.parent().unwrap_or(dir).to_path_buf(),
        });
    }
    if has("cpuset.cpus") {
        return Ok(CgroupVersion::V1);
    }
    Err(CgroupError::NotACgroup {
        dir: dir.to_path_buf(),
    })
}

/// Interprets the text of a requested and an effective cpuset file
/// (`None`: the file does not exist). An empty or absent requested file
/// means nothing was requested: the effective set is reported.
pub fn cpuset_value(
    requested: (&Path, Option<&str>),
    effective: (&Path, Option<&str>),
) -> Result<CpusetValue, CgroupError> {
    let parse = |(path, text): (&Path, Option<&str>)| -> Result<Option<CpuSet>, CgroupError> {
        match text.map(str::trim) {
            None | Some("") => Ok(None),
            Some(value) => parse_cpulist_at(path, value).map(Some),
        }
    };
    let requested_set = parse(requested)?;
    let effective_set = parse(effective)?;
    match (requested_set, effective_set) {
        (Some(set), effective) => Ok(CpusetValue {
            reported: set.clone(),
            source: CpusetSource::Requested,
            requested: Some(set),
            effective,
        }),
        (None, Some(set)) => Ok(CpusetValue {
            reported: set.clone(),
            source: CpusetSource::Effective,
            requested: None,
            effective: Some(set),
        }),
        // Both empty: a v2 cgroup with no CPUs (or nodes) at all is
        // reported as such, with the effective file as its source.
        (None, None) => Ok(CpusetValue {
            reported: CpuSet::default(),
            source: CpusetSource::Effective,
            requested: None,
            effective: effective.1.map(|_| CpuSet::default()),
        }),
    }
}

/// What a cpuset cgroup directory says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupCpuset {
    pub dir: PathBuf,
    pub version: CgroupVersion,
    /// The CPUs: `cpuset.cpus`, or the effective CPUs when that is empty.
    pub cpus: CpuSet,
    pub cpus_detail: CpusetValue,
    /// The memory nodes: `cpuset.mems`, or the effective nodes when empty.
    pub mems: CpuSet,
    pub mems_detail: CpusetValue,
}

/// Reads a cpuset cgroup directory of either version.
pub fn read_cpuset_dir(dir: &Path) -> Result<CgroupCpuset, CgroupError> {
    if !dir.is_dir() {
        return Err(CgroupError::Read {
            path: dir.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let version = cgroup_version_of(dir, |file| dir.join(file).exists())?;
    let read = |cpus: bool| -> Result<CpusetValue, CgroupError> {
        let (requested, effective) = version.files(cpus);
        let (requested, effective) = (dir.join(requested), dir.join(effective));
        let optional = |path: &Path| -> Result<Option<String>, CgroupError> {
            match std::fs::read_to_string(path) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(CgroupError::Read {
                    path: path.to_path_buf(),
                    source,
                }),
            }
        };
        let (requested_text, effective_text) = (optional(&requested)?, optional(&effective)?);
        cpuset_value(
            (&requested, requested_text.as_deref()),
            (&effective, effective_text.as_deref()),
        )
    };
    let cpus_detail = read(true)?;
    let mems_detail = read(false)?;
    Ok(CgroupCpuset {
        dir: dir.to_path_buf(),
        version,
        cpus: cpus_detail.reported.clone(),
        cpus_detail,
        mems: mems_detail.reported.clone(),
        mems_detail,
    })
}

/// Every memory node, as the root of the cpuset hierarchy grants them.
pub fn all_memory_nodes() -> Result<CpuSet, CgroupError> {
    Ok(read_cpuset_dir(cpuset_hierarchy()?.mount_point())?.mems)
}

/// A container's CPU weight as its cgroup holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuWeight {
    /// cgroup v1 `cpu.shares`.
    Shares(u64),
    /// cgroup v2 `cpu.weight` (1-10000), which runc derives from the shares.
    Weight(u64),
}

impl CpuWeight {
    /// Whether this is what the runtime writes for `shares` kubelet asked
    /// for. runc before 1.3.2 maps shares to `cpu.weight` linearly, later
    /// versions (and crun 1.23+) by a quadratic in log2(shares) that keeps
    /// the default 1024 at weight 100: both are accepted.
    pub fn matches_shares(self, shares: u64) -> bool {
        match self {
            CpuWeight::Shares(value) => value == shares,
            CpuWeight::Weight(value) => {
                value == shares_to_weight_linear(shares)
                    || value == shares_to_weight_quadratic(shares)
            }
        }
    }
}

/// runc < 1.3.2: `1 + (shares - 2) * 9999 / 262142`, clamped to the ranges.
pub fn shares_to_weight_linear(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// runc ≥ 1.3.2: `ceil(10^((l² + 125 l) / 612 - 7/34))` with `l = log2(shares)`.
pub fn shares_to_weight_quadratic(shares: u64) -> u64 {
    if shares <= 2 {
        return 1;
    }
    if shares >= 262_144 {
        return 10_000;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    10f64.powf(exponent).ceil() as u64
}

/// The CPU weight of process `pid`'s cgroup: `cpu.shares` of its v1 `cpu`
/// hierarchy, or `cpu.weight` of its cgroup v2 directory.
pub fn cpu_weight_of(pid: u32) -> Result<CpuWeight, CgroupError> {
    let source = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let entries = parse_proc_cgroup(&read_to_string(&source)?, &source)?;
    let mounts = cgroup_mounts()?;
    let parse = |path: PathBuf| -> Result<u64, CgroupError> {
        let text = read_to_string(&path)?;
        text.trim().parse().map_err(|_| CgroupError::Malformed {
            path,
            line: text.trim().to_string(),
        })
    };
    let v1_cpu = mounts
        .iter()
        .find(|m| !m.unified && m.controllers.iter().any(|c| c == "cpu"));
    if let Some(mount) = v1_cpu {
        let entry = entries
            .iter()
            .find(|e| e.controllers.iter().any(|c| c == "cpu"))
            .ok_or(CgroupError::NotInHierarchy {
                pid,
                controller: "cpu",
                wanted: "`N:cpu,...:/path`",
            })?;
        let dir = mount.mount_point.join(entry.path.trim_start_matches('/'));
        return Ok(CpuWeight::Shares(parse(dir.join("cpu.shares"))?));
    }
    let unified = mounts
        .iter()
        .find(|m| m.unified && m.controllers.iter().any(|c| c == "cpu"))
        .ok_or(CgroupError::NoController { controller: "cpu" })?;
    let entry = entries
        .iter()
        .find(|e| e.hierarchy_id == 0 && e.controllers.is_empty())
        .ok_or(CgroupError::NotInHierarchy {
            pid,
            controller: "cgroup v2",
            wanted: "`0::/path`",
        })?;
    let dir = unified.mount_point.join(entry.path.trim_start_matches('/'));
    Ok(CpuWeight::Weight(parse(dir.join("cpu.weight"))?))
}

/// Everything that says where a container may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCpus {
    /// From the container's cgroup (`cpuset.cpus`, `cpuset.mems`, or their
    /// effective sets when nothing was requested).
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
/// mounted hierarchy (every v1 one and the cgroup2 one).
pub fn existing_dirs(relative: &str) -> Result<Vec<PathBuf>, CgroupError> {
    let relative = relative.trim_start_matches('/');
    Ok(cgroup_mounts()?
        .into_iter()
        .map(|m| m.mount_point.join(relative))
        .filter(|dir| dir.is_dir())
        .collect())
}

/// The file operations removing a cgroup tree needs, so that the order of
/// kills and removals can be checked over a fake tree.
pub trait CgroupTreeFs {
    /// Sub-directories (child cgroups) of `dir`.
    fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>>;
    fn exists(&self, path: &Path) -> bool;
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()>;
    /// Pids listed in `dir/cgroup.procs` (none when unreadable).
    fn procs(&self, dir: &Path) -> Vec<i32>;
    fn sigkill(&self, pid: i32);
    fn rmdir(&self, dir: &Path) -> std::io::Result<()>;
    /// Waits a little before retrying an rmdir.
    fn pause(&self);
}

/// The real filesystem and signals.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealCgroupFs;

impl CgroupTreeFs for RealCgroupFs {
    fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(std::fs::read_dir(dir)?
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.path())
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        std::fs::write(path, value)
    }

    fn procs(&self, dir: &Path) -> Vec<i32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn sigkill(&self, pid: i32) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    fn rmdir(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::remove_dir(dir)
    }

    fn pause(&self) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many times an rmdir is retried (with [`CgroupTreeFs::pause`] between).
const RMDIR_ATTEMPTS: usize = 500;

/// Kills every process in `dir` and its children and removes them, deepest
/// first. A missing directory is not an error.
pub fn remove_cgroup_tree(dir: &Path) -> Result<(), CgroupError> {
    remove_cgroup_tree_with(&RealCgroupFs, dir)
}

/// [`remove_cgroup_tree`] over any [`CgroupTreeFs`].
///
/// On cgroup v2 with `cgroup.kill` one write at the top kills every process
/// of the subtree, also those forked while the tree is walked. Elsewhere
/// (v1, or v2 before Linux 5.14) every pid in each directory's
/// `cgroup.procs` gets SIGKILL, after a v1 freezer cgroup is thawed (a
/// frozen task would hold through SIGKILL; on v2 fatal signals reach frozen
/// tasks). The pids are killed again at every rmdir retry: a process can
/// take a moment to exit, and an rmdir of a cgroup whose last task is
/// exiting answers EBUSY.
pub fn remove_cgroup_tree_with(fs: &impl CgroupTreeFs, dir: &Path) -> Result<(), CgroupError> {
    remove_tree(fs, dir, false)
}

fn remove_tree(
    fs: &impl CgroupTreeFs,
    dir: &Path,
    subtree_killed: bool,
) -> Result<(), CgroupError> {
    let children = match fs.child_dirs(dir) {
        Ok(children) => children,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut killed = subtree_killed;
    let kill_file = dir.join("cgroup.kill");
    if !killed && fs.exists(&kill_file) {
        // A failed write leaves the per-pid SIGKILL below to do the work.
        killed = fs.write(&kill_file, "1").is_ok();
    }
    for child in children {
        remove_tree(fs, &child, killed)?;
    }
    let freezer_state = dir.join("freezer.state");
    if fs.exists(&freezer_state) {
        let _ = fs.write(&freezer_state, "THAWED");
    }
    let mut last_error = None;
    for _ in 0..RMDIR_ATTEMPTS {
        for pid in fs.procs(dir) {
            fs.sigkill(pid);
        }
        match fs.rmdir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last_error = Some(e),
        }
        fs.pause();
    }
    let pids = fs.procs(dir);
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

    const MOUNTINFO_V2: &str = "\
22 1 259:1 / / rw,relatime - ext4 /dev/vda rw
25 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
26 22 0:24 / /proc rw - proc proc rw
";

    const MOUNTINFO_HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";

    /// Mounts as `cgroup_mounts` gives them: a cgroup2 mount with what its
    /// root's cgroup.controllers would list.
    fn with_v2_controllers(text: &str, listed: &str) -> Vec<CgroupMount> {
        let mut mounts = parse_cgroup_mounts(text);
        for m in mounts.iter_mut().filter(|m| m.unified) {
            m.controllers = listed.split_whitespace().map(str::to_string).collect();
        }
        mounts
    }

    #[test]
    fn the_cpuset_hierarchy_is_found_on_v1_v2_and_hybrid_hosts() {
        let v1 = |p: &str| CpusetHierarchy::V1 {
            mount_point: p.into(),
        };
        let v2 = |p: &str| CpusetHierarchy::V2 {
            mount_point: p.into(),
        };
        let table = [
            // This machine's shape: v1 controllers and an empty unified mount.
            (MOUNTINFO_SAMPLE, "", Ok(v1("/sys/fs/cgroup/cpuset"))),
            (MOUNTINFO_HYBRID, "", Ok(v1("/sys/fs/cgroup/cpuset"))),
            // Hybrid: cpuset bound to v1 even if the kernel listed it in v2.
            (MOUNTINFO_HYBRID, "cpuset", Ok(v1("/sys/fs/cgroup/cpuset"))),
            (
                MOUNTINFO_V2,
                "cpuset cpu io memory hugetlb pids rdma misc",
                Ok(v2("/sys/fs/cgroup")),
            ),
            (
                MOUNTINFO_V2,
                "cpu io memory pids",
                Err("offers only [cpu io memory pids]"),
            ),
            (MOUNTINFO_V2, "", Err("offers only []")),
            (
                "22 1 259:1 / / rw - ext4 /dev/vda rw\n",
                "",
                Err("no cgroup2 hierarchy is mounted"),
            ),
        ];
        for (mountinfo, listed, expected) in table {
            let got = find_cpuset_hierarchy(&with_v2_controllers(mountinfo, listed));
            match (got, expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{listed:?} in {mountinfo}"),
                (Err(e), Err(part)) => {
                    let text = e.to_string();
                    assert!(text.contains(part), "{text}");
                    // The error says what to enable, and where.
                    assert!(text.contains("+cpuset"), "{text}");
                    assert!(text.contains("cgroup.controllers"), "{text}");
                }
                (got, want) => panic!("{listed:?} in {mountinfo}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_process_cgroup_is_its_cpuset_line_on_v1_and_its_0_line_on_v2() {
        let v1 = CpusetHierarchy::V1 {
            mount_point: "/sys/fs/cgroup/cpuset".into(),
        };
        let v2 = CpusetHierarchy::V2 {
            mount_point: "/sys/fs/cgroup".into(),
        };
        let hybrid = "12:cpuset:/kubepods/podu/c1\n4:cpu,cpuacct:/kubepods/podu/c1\n1:name=systemd:/x\n0::/kubepods/podu/c1\n";
        let v2_only = "0::/kubepods/podu/c2\n";
        let v1_only = "3:cpuset:/kubepods/podu/c3\n2:cpu:/\n";
        let table: [(&CpusetHierarchy, &str, Option<&str>); 6] = [
            (&v1, hybrid, Some("/sys/fs/cgroup/cpuset/kubepods/podu/c1")),
            (&v2, hybrid, Some("/sys/fs/cgroup/kubepods/podu/c1")),
            (&v2, v2_only, Some("/sys/fs/cgroup/kubepods/podu/c2")),
            (&v1, v2_only, None),
            (&v1, v1_only, Some("/sys/fs/cgroup/cpuset/kubepods/podu/c3")),
            (&v2, v1_only, None),
        ];
        for (hierarchy, text, want) in table {
            let entries = parse_proc_cgroup(text, Path::new("/proc/1/cgroup")).unwrap();
            let got = hierarchy.path_of(&entries).map(|p| hierarchy.dir_of(p));
            assert_eq!(got, want.map(PathBuf::from), "{hierarchy:?} {text:?}");
        }
        let missing = CgroupError::NoCpusetCgroup {
            pid: 7,
            wanted: v2.wanted_line(),
        };
        assert!(missing.to_string().contains("`0::/path`"), "{missing}");
    }

    #[test]
    fn cpuset_values_report_the_request_or_else_the_effective_set() {
        let (r, e) = (Path::new("cpuset.cpus"), Path::new("cpuset.cpus.effective"));
        let set = |s: &str| CpuSet::parse_cpulist(s).unwrap();
        let table = [
            // A pinned container: what was asked, and what the kernel grants.
            (
                Some("2-3\n"),
                Some("2-3\n"),
                set("2-3"),
                CpusetSource::Requested,
            ),
            // v2, nothing asked: cpuset.cpus is empty, the parent's set rules.
            (
                Some("\n"),
                Some("0-7\n"),
                set("0-7"),
                CpusetSource::Effective,
            ),
            // A v2 root has no cpuset.cpus at all.
            (None, Some("0-7\n"), set("0-7"), CpusetSource::Effective),
            // v1 before the effective files: the request is the answer.
            (Some("0-1\n"), None, set("0-1"), CpusetSource::Requested),
            // A request wider than what the parent grants keeps both.
            (
                Some("0-7"),
                Some("0-3"),
                set("0-7"),
                CpusetSource::Requested,
            ),
            (Some(""), Some(""), CpuSet::new(), CpusetSource::Effective),
        ];
        for (requested, effective, reported, source) in table {
            let value = cpuset_value((r, requested), (e, effective)).unwrap();
            assert_eq!(
                (&value.reported, value.source),
                (&reported, source),
                "{requested:?} / {effective:?}"
            );
            let asked = requested.map(str::trim).filter(|t| !t.is_empty());
            assert_eq!(value.requested, asked.map(set));
            assert_eq!(
                value.effective,
                effective.map(|t| if t.trim().is_empty() {
                    CpuSet::new()
                } else {
                    set(t)
                })
            );
        }
        let err = cpuset_value((r, Some("0-x")), (e, Some("0"))).unwrap_err();
        assert!(err.to_string().contains("cpuset.cpus"), "{err}");
    }

    #[test]
    fn the_version_of_a_cgroup_dir_follows_its_files() {
        let dir = Path::new("/sys/fs/cgroup/kubepods/podu/c");
        let has_all = |files: &'static [&'static str]| move |f: &str| files.contains(&f);
        assert_eq!(
            cgroup_version_of(
                dir,
                has_all(&[
                    "cgroup.controllers",
                    "cgroup.procs",
                    "cpuset.cpus",
                    "cpuset.cpus.effective"
                ])
            )
            .unwrap(),
            CgroupVersion::V2
        );
        assert_eq!(
            cgroup_version_of(
                dir,
                has_all(&["cgroup.procs", "cpuset.cpus", "cpuset.effective_cpus"])
            )
            .unwrap(),
            CgroupVersion::V1
        );
        let not_enabled = cgroup_version_of(
            dir,
            has_all(&["cgroup.controllers", "cgroup.procs", "cpu.weight"]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            not_enabled
                .contains("echo +cpuset > /sys/fs/cgroup/kubepods/podu/cgroup.subtree_control"),
            "{not_enabled}"
        );
        let neither = cgroup_version_of(dir, has_all(&["tasks"])).unwrap_err();
        assert!(
            matches!(neither, CgroupError::NotACgroup { .. }),
            "{neither}"
        );
    }

    fn write_files(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    #[test]
    fn cgroup_dirs_of_either_version_read_from_fake_trees() {
        let root = tempfile::tempdir().unwrap();
        // A cgroup2 tree as runc leaves it: root, pod, a pinned container and
        // one nobody pinned (empty cpuset.cpus and cpuset.mems).
        let v2 = root.path().join("v2");
        write_files(
            &v2,
            &[
                ("cgroup.controllers", "cpuset cpu io memory pids\n"),
                ("cgroup.subtree_control", "cpuset cpu memory pids\n"),
                ("cpuset.cpus.effective", "0-7\n"),
                ("cpuset.mems.effective", "0-1\n"),
            ],
        );
        let v2_files = |cpus: &str, effective: &str, mems: &str, mems_effective: &str| {
            vec![
                ("cgroup.controllers", "cpuset cpu memory pids\n".to_string()),
                ("cgroup.procs", String::new()),
                ("cpuset.cpus", format!("{cpus}\n")),
                ("cpuset.cpus.effective", format!("{effective}\n")),
                ("cpuset.mems", format!("{mems}\n")),
                ("cpuset.mems.effective", format!("{mems_effective}\n")),
            ]
        };
        let as_refs = |v: &[(&'static str, String)]| -> Vec<(&'static str, String)> { v.to_vec() };
        let pinned = v2.join("kubepods/podu/pinned");
        let free = v2.join("kubepods/podu/free");
        for (dir, files) in [
            (&pinned, as_refs(&v2_files("4-5", "4-5", "1", "1"))),
            (&free, as_refs(&v2_files("", "0-7", "", "0-1"))),
        ] {
            let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
            write_files(dir, &files);
        }
        let set = |s: &str| CpuSet::parse_cpulist(s).unwrap();

        let got = read_cpuset_dir(&pinned).unwrap();
        assert_eq!(got.version, CgroupVersion::V2);
        assert_eq!(
            (got.cpus.clone(), got.cpus_detail.source),
            (set("4-5"), CpusetSource::Requested)
        );
        assert_eq!(
            (got.mems.clone(), got.mems_detail.source),
            (set("1"), CpusetSource::Requested)
        );

        let got = read_cpuset_dir(&free).unwrap();
        assert_eq!(
            (got.cpus.clone(), got.cpus_detail.source),
            (set("0-7"), CpusetSource::Effective)
        );
        assert_eq!(got.cpus_detail.requested, None);
        assert_eq!(
            (got.mems.clone(), got.mems_detail.source),
            (set("0-1"), CpusetSource::Effective)
        );

        // The v2 root: only the effective files.
        let got = read_cpuset_dir(&v2).unwrap();
        assert_eq!((got.cpus, got.mems), (set("0-7"), set("0-1")));

        // A v2 cgroup whose parent did not enable cpuset.
        let bare = v2.join("system.slice");
        write_files(
            &bare,
            &[("cgroup.controllers", "cpu\n"), ("cgroup.procs", "")],
        );
        let err = read_cpuset_dir(&bare).unwrap_err().to_string();
        assert!(err.contains("+cpuset"), "{err}");
        assert!(
            err.contains(&v2.join("cgroup.subtree_control").display().to_string()),
            "{err}"
        );

        // A v1 cpuset cgroup.
        let v1 = root.path().join("v1/kubepods/podu/c");
        write_files(
            &v1,
            &[
                ("cgroup.procs", ""),
                ("cpuset.cpus", "1\n"),
                ("cpuset.effective_cpus", "1\n"),
                ("cpuset.mems", "0\n"),
                ("cpuset.effective_mems", "0\n"),
            ],
        );
        let got = read_cpuset_dir(&v1).unwrap();
        assert_eq!(got.version, CgroupVersion::V1);
        assert_eq!((got.cpus, got.mems), (set("1"), set("0")));
        assert_eq!(got.cpus_detail.effective, Some(set("1")));

        let missing = read_cpuset_dir(&root.path().join("absent")).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
    }

    #[test]
    fn cpu_weights_match_either_runc_conversion_of_the_shares() {
        // Values runc writes: linear before 1.3.2, quadratic after.
        let table = [
            (2, 1, 1),
            (102, 4, 17),
            (1024, 39, 100),
            (262_144, 10_000, 10_000),
        ];
        for (shares, linear, quadratic) in table {
            assert_eq!(shares_to_weight_linear(shares), linear, "{shares}");
            assert_eq!(shares_to_weight_quadratic(shares), quadratic, "{shares}");
            assert!(CpuWeight::Weight(linear).matches_shares(shares));
            assert!(CpuWeight::Weight(quadratic).matches_shares(shares));
        }
        assert!(CpuWeight::Shares(102).matches_shares(102));
        assert!(!CpuWeight::Shares(4).matches_shares(102));
        assert!(!CpuWeight::Weight(50).matches_shares(102));
    }

    /// A cgroup tree in memory: which directories exist, which have
    /// `cgroup.kill`, which pids each holds; every operation is logged.
    #[derive(Default)]
    struct FakeTree {
        dirs: std::cell::RefCell<BTreeMap<PathBuf, Vec<i32>>>,
        kill_files: bool,
        log: std::cell::RefCell<Vec<String>>,
    }

    impl FakeTree {
        fn new(kill_files: bool, dirs: &[(&str, &[i32])]) -> FakeTree {
            FakeTree {
                dirs: std::cell::RefCell::new(
                    dirs.iter()
                        .map(|(d, p)| (PathBuf::from(d), p.to_vec()))
                        .collect(),
                ),
                kill_files,
                log: Default::default(),
            }
        }
        fn log(&self, entry: String) {
            self.log.borrow_mut().push(entry);
        }
    }

    impl CgroupTreeFs for FakeTree {
        fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
            let dirs = self.dirs.borrow();
            if !dirs.contains_key(dir) {
                return Err(std::io::ErrorKind::NotFound.into());
            }
            Ok(dirs
                .keys()
                .filter(|d| d.parent() == Some(dir))
                .cloned()
                .collect())
        }
        fn exists(&self, path: &Path) -> bool {
            let name = path.file_name().and_then(|n| n.to_str());
            let dir = path.parent().map(|p| self.dirs.borrow().contains_key(p));
            dir == Some(true) && name == Some("cgroup.kill") && self.kill_files
        }
        fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
            self.log(format!("write {} {value}", path.display()));
            if path.ends_with("cgroup.kill") {
                let top = path.parent().unwrap_or(path).to_path_buf();
                for (dir, pids) in self.dirs.borrow_mut().iter_mut() {
                    if dir.starts_with(&top) {
                        pids.clear();
                    }
                }
            }
            Ok(())
        }
        fn procs(&self, dir: &Path) -> Vec<i32> {
            self.dirs.borrow().get(dir).cloned().unwrap_or_default()
        }
        fn sigkill(&self, pid: i32) {
            self.log(format!("kill {pid}"));
            for pids in self.dirs.borrow_mut().values_mut() {
                pids.retain(|p| *p != pid);
            }
        }
        fn rmdir(&self, dir: &Path) -> std::io::Result<()> {
            let busy = {
                let dirs = self.dirs.borrow();
                let populated = dirs.get(dir).map(|p| !p.is_empty()).unwrap_or(false);
                populated || dirs.keys().any(|d| d.parent() == Some(dir))
            };
            if busy {
                self.log(format!("rmdir {} busy", dir.display()));
                return Err(std::io::Error::from_raw_os_error(libc_ebusy()));
            }
            self.log(format!("rmdir {}", dir.display()));
            self.dirs.borrow_mut().remove(dir);
            Ok(())
        }
        fn pause(&self) {}
    }

    fn libc_ebusy() -> i32 {
        nix::errno::Errno::EBUSY as i32
    }

    #[test]
    fn v2_trees_die_by_one_cgroup_kill_then_go_leaf_first() {
        let tree = FakeTree::new(
            true,
            &[
                ("/cg/pod", &[]),
                ("/cg/pod/a", &[10, 11]),
                ("/cg/pod/b", &[12]),
                ("/cg/pod/b/x", &[13]),
            ],
        );
        remove_cgroup_tree_with(&tree, Path::new("/cg/pod")).unwrap();
        assert_eq!(
            *tree.log.borrow(),
            [
                "write /cg/pod/cgroup.kill 1",
                "rmdir /cg/pod/a",
                "rmdir /cg/pod/b/x",
                "rmdir /cg/pod/b",
                "rmdir /cg/pod",
            ]
        );
        assert!(tree.dirs.borrow().is_empty());
    }

    #[test]
    fn without_cgroup_kill_every_pid_gets_sigkill_leaf_first() {
        let tree = FakeTree::new(
            false,
            &[
                ("/cg/pod", &[9]),
                ("/cg/pod/a", &[10, 11]),
                ("/cg/pod/a/x", &[13]),
            ],
        );
        remove_cgroup_tree_with(&tree, Path::new("/cg/pod")).unwrap();
        assert_eq!(
            *tree.log.borrow(),
            [
                "kill 13",
                "rmdir /cg/pod/a/x",
                "kill 10",
                "kill 11",
                "rmdir /cg/pod/a",
                "kill 9",
                "rmdir /cg/pod",
            ]
        );
    }

    #[test]
    fn a_pid_that_never_dies_is_named_in_the_error() {
        struct Immortal(FakeTree);
        impl CgroupTreeFs for Immortal {
            fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
                self.0.child_dirs(dir)
            }
            fn exists(&self, path: &Path) -> bool {
                self.0.exists(path)
            }
            fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
                self.0.write(path, value)
            }
            fn procs(&self, dir: &Path) -> Vec<i32> {
                self.0.procs(dir)
            }
            fn sigkill(&self, _pid: i32) {}
            fn rmdir(&self, dir: &Path) -> std::io::Result<()> {
                self.0.rmdir(dir)
            }
            fn pause(&self) {}
        }
        let tree = Immortal(FakeTree::new(false, &[("/cg/pod", &[42])]));
        let err = remove_cgroup_tree_with(&tree, Path::new("/cg/pod")).unwrap_err();
        assert!(
            matches!(&err, CgroupError::Busy { pids, .. } if pids == &[42]),
            "{err}"
        );
    }

    #[test]
    fn missing_cgroup_tree_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        remove_cgroup_tree(&dir.path().join("absent")).unwrap();
    }
}
