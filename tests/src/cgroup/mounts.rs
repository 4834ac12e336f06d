//! The mounted cgroup hierarchies and a process's place in them.

use std::path::{Path, PathBuf};

use super::{read_to_string, CgroupError, MOUNTINFO};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::test_files::MOUNTINFO_SAMPLE;

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

    proptest::proptest! {
        #[test]
        fn mount_paths_unescape_any_byte(name in "[a-z ]{1,12}") {
            let escaped = name.replace(' ', "\\040");
            proptest::prop_assert_eq!(unescape_mount_path(&escaped), name);
        }
    }
}
