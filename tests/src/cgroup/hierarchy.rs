//! Where the cpuset controller lives: a v1 hierarchy of its own or the
//! cgroup2 one.

use std::path::{Path, PathBuf};

use super::mounts::{cgroup_mounts, parse_proc_cgroup, CgroupMount, ProcCgroup};
use super::{read_to_string, CgroupError};

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
        enable_cpuset_below(mount_point)?;
    }
    Ok(hierarchy)
}

/// Lists `cpuset` in `dir/cgroup.subtree_control` unless it is there.
/// Returns whether it wrote.
pub fn enable_cpuset_below(dir: &Path) -> Result<bool, CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = read_to_string(&control)?;
    if enabled.split_whitespace().any(|c| c == "cpuset") {
        return Ok(false);
    }
    std::fs::write(&control, "+cpuset").map_err(|source| CgroupError::Write {
        path: control.clone(),
        value: "+cpuset".to_string(),
        source,
    })?;
    Ok(true)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::cpuset::{read_cpuset_dir, CpusetSource};
    use crate::cgroup::mounts::parse_cgroup_mounts;
    use crate::cgroup::test_files::{write_files, MOUNTINFO_SAMPLE};
    use shared_state::CpuSet;

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
    fn cpuset_is_enabled_below_a_v2_root_only_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("cgroup.subtree_control");
        for (before, wrote, after) in [
            ("cpu memory pids\n", true, "+cpuset"),
            ("\n", true, "+cpuset"),
            ("cpuset cpu\n", false, "cpuset cpu\n"),
        ] {
            std::fs::write(&control, before).unwrap();
            assert_eq!(
                enable_cpuset_below(dir.path()).unwrap(),
                wrote,
                "{before:?}"
            );
            assert_eq!(std::fs::read_to_string(&control).unwrap(), after);
        }
        let err = enable_cpuset_below(&dir.path().join("absent")).unwrap_err();
        assert!(err.to_string().contains("cgroup.subtree_control"), "{err}");
    }

    /// The whole lookup on a fake cgroup v2 host: mountinfo, the root's
    /// controllers, a process's `/proc/<pid>/cgroup`, its cgroup's files.
    #[test]
    fn a_container_cpuset_is_found_and_read_on_a_fake_v2_host() {
        let root = tempfile::tempdir().unwrap();
        let mount = root.path().join("sys/fs/cgroup");
        write_files(
            &mount,
            &[
                ("cgroup.controllers", "cpuset cpu io memory pids\n"),
                ("cpuset.cpus.effective", "0-7\n"),
                ("cpuset.mems.effective", "0-1\n"),
            ],
        );
        let container = mount.join("kubepods/podu/c1");
        write_files(
            &container,
            &[
                ("cgroup.controllers", "cpuset cpu memory pids\n"),
                ("cpuset.cpus", "2-3\n"),
                ("cpuset.cpus.effective", "2-3\n"),
                ("cpuset.mems", "\n"),
                ("cpuset.mems.effective", "0-1\n"),
            ],
        );
        let mountinfo = format!(
            "22 1 259:1 / / rw - ext4 /dev/vda rw\n25 22 0:23 / {} rw - cgroup2 cgroup2 rw\n",
            mount.display()
        );
        let mut mounts = parse_cgroup_mounts(&mountinfo);
        for m in mounts.iter_mut().filter(|m| m.unified) {
            m.controllers = std::fs::read_to_string(m.mount_point.join("cgroup.controllers"))
                .unwrap()
                .split_whitespace()
                .map(str::to_string)
                .collect();
        }
        let hierarchy = find_cpuset_hierarchy(&mounts).unwrap();
        assert_eq!(
            hierarchy,
            CpusetHierarchy::V2 {
                mount_point: mount.clone()
            }
        );
        let entries =
            parse_proc_cgroup("0::/kubepods/podu/c1\n", Path::new("/proc/9/cgroup")).unwrap();
        let dir = hierarchy.dir_of(hierarchy.path_of(&entries).unwrap());
        assert_eq!(dir, container);
        let got = read_cpuset_dir(&dir).unwrap();
        let set = |s: &str| CpuSet::parse_cpulist(s).unwrap();
        assert_eq!(
            (got.cpus, got.cpus_detail.source),
            (set("2-3"), CpusetSource::Requested)
        );
        assert_eq!(
            (got.mems, got.mems_detail.source),
            (set("0-1"), CpusetSource::Effective)
        );
    }
}
