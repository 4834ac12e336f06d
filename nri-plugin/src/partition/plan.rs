//! The pure decisions of isolated partitions: where a container's cgroup
//! is, which files get which values, and what the kernel's answer means.

use std::path::{Component, Path, PathBuf};

use shared_state::CpuSet;

/// Why a container's `linux.cgroupsPath` names no cgroup below the root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgroupPathError {
    #[error("the container has no cgroups path")]
    Empty,
    #[error("systemd cgroups path {path:?} has no unit name")]
    NoUnitName { path: String },
    #[error("systemd slice {slice:?} does not end in .slice")]
    NotSliceSuffix { slice: String },
    #[error("systemd slice {slice:?} is not a slice name")]
    NotSliceName { slice: String },
    #[error("cgroups path {path:?} leaves the cgroup root")]
    LeavesRoot { path: String },
    #[error("cgroups path {path:?} is the root cgroup")]
    RootCgroup { path: String },
}

/// A container's cgroup, relative to the cgroup root, from its OCI
/// `linux.cgroupsPath`: the cgroupfs form (`/kubepods/pod<uid>/<id>`) or
/// the systemd form (`<slice>:<prefix>:<name>`, which systemd places at
/// the slice's path, each `-` of its name a level, then `<prefix>-<name>.scope`).
pub fn container_cgroup(cgroups_path: &str) -> Result<PathBuf, CgroupPathError> {
    let path = cgroups_path.trim();
    if path.is_empty() {
        return Err(CgroupPathError::Empty);
    }
    let relative = if !path.starts_with('/') && path.split(':').count() == 3 {
        let mut parts = path.split(':');
        let (slice, prefix, name) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        if name.is_empty() {
            return Err(CgroupPathError::NoUnitName { path: path.into() });
        }
        let mut dir = slice_dir(slice)?;
        dir.push(if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        });
        dir
    } else {
        PathBuf::from(path)
    };
    let mut out = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(CgroupPathError::LeavesRoot { path: path.into() })
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(CgroupPathError::RootCgroup { path: path.into() });
    }
    Ok(out)
}

/// The directory systemd gives a slice: `a-b-c.slice` is
/// `a.slice/a-b.slice/a-b-c.slice`; `-.slice` (or none) is the root.
fn slice_dir(slice: &str) -> Result<PathBuf, CgroupPathError> {
    if slice.is_empty() || slice == "-.slice" {
        return Ok(PathBuf::new());
    }
    let Some(stem) = slice.strip_suffix(".slice") else {
        return Err(CgroupPathError::NotSliceSuffix {
            slice: slice.into(),
        });
    };
    if stem.is_empty() || stem.contains('/') || stem.split('-').any(str::is_empty) {
        return Err(CgroupPathError::NotSliceName {
            slice: slice.into(),
        });
    }
    let mut dir = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        dir.push(format!("{prefix}.slice"));
    }
    Ok(dir)
}

/// The ancestors of a cgroup below the root, outermost first
/// (`a/b/c` -> `a`, `a/b`).
pub fn ancestors(cgroup: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = cgroup
        .ancestors()
        .skip(1)
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .collect();
    out.reverse();
    out
}

/// One write to a cgroup interface file: `file` of cgroup `dir` (relative
/// to the root) gets `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub dir: PathBuf,
    pub file: &'static str,
    pub value: String,
}

pub const EXCLUSIVE: &str = "cpuset.cpus.exclusive";
pub const PARTITION: &str = "cpuset.cpus.partition";

/// The writes that make `cgroup` an isolated remote partition of `cpus`,
/// given each ancestor's current `cpuset.cpus.exclusive` (outermost
/// first, as [`ancestors`] lists them): every ancestor's exclusive CPUs
/// grow by `cpus` from the top down (a cgroup's exclusive CPUs must be
/// its parent's), then the container's own, then its partition. An
/// ancestor that already holds them is not written.
pub fn isolate_writes(cgroup: &Path, ancestors: &[(PathBuf, CpuSet)], cpus: &CpuSet) -> Vec<Write> {
    let mut writes: Vec<Write> = ancestors
        .iter()
        .filter(|(_, exclusive)| !cpus.is_subset(exclusive))
        .map(|(dir, exclusive)| Write {
            dir: dir.clone(),
            file: EXCLUSIVE,
            value: exclusive.union(cpus).to_cpulist(),
        })
        .collect();
    writes.push(Write {
        dir: cgroup.to_path_buf(),
        file: EXCLUSIVE,
        value: cpus.to_cpulist(),
    });
    writes.push(Write {
        dir: cgroup.to_path_buf(),
        file: PARTITION,
        value: "isolated".into(),
    });
    writes
}

/// The writes that give `cpus` back, given the ancestors' current
/// exclusive CPUs (outermost first): the container's cgroup, when it is
/// still there, leaves its partition first (an ancestor losing the CPUs
/// would invalidate it), then the ancestors lose `cpus` from the bottom up
/// (a parent's exclusive CPUs must hold its children's). Ancestors without
/// them are not written.
pub fn release_writes(
    cgroup: Option<&Path>,
    ancestors: &[(PathBuf, CpuSet)],
    cpus: &CpuSet,
) -> Vec<Write> {
    let mut writes = Vec::new();
    if let Some(cgroup) = cgroup {
        writes.push(Write {
            dir: cgroup.to_path_buf(),
            file: PARTITION,
            value: "member".into(),
        });
        writes.push(Write {
            dir: cgroup.to_path_buf(),
            file: EXCLUSIVE,
            value: String::new(),
        });
    }
    writes.extend(
        ancestors
            .iter()
            .rev()
            .filter(|(_, exclusive)| !exclusive.is_disjoint(cpus))
            .map(|(dir, exclusive)| Write {
                dir: dir.clone(),
                file: EXCLUSIVE,
                value: exclusive.difference(cpus).to_cpulist(),
            }),
    );
    writes
}

/// The write that takes from a `member` cgroup the exclusive CPUs none of
/// its children holds, if any: a member's exclusive CPUs only pass to the
/// remote partitions below it, so those are left behind by a partition
/// whose container went while nobody gave its CPUs back (removed while
/// nri-plugin was down). A partition root's own exclusive CPUs are its own
/// and never taken.
pub fn stale_exclusive_write(
    dir: &Path,
    exclusive: &CpuSet,
    partition: &PartitionState,
    children: &[CpuSet],
) -> Option<Write> {
    if exclusive.is_empty() || *partition != PartitionState::Other("member".into()) {
        return None;
    }
    let held = children
        .iter()
        .fold(CpuSet::new(), |held, child| held.union(child));
    let kept = exclusive.intersection(&held);
    (kept != *exclusive).then(|| Write {
        dir: dir.to_path_buf(),
        file: EXCLUSIVE,
        value: kept.to_cpulist(),
    })
}

/// What `cpuset.cpus.partition` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionState {
    Isolated,
    /// A partition the kernel could not make, with its reason
    /// (`isolated invalid (Parent is not a partition root)`).
    Invalid(String),
    /// `member`, `root`, or anything else.
    Other(String),
}

pub fn partition_state(text: &str) -> PartitionState {
    let text = text.trim();
    if text == "isolated" {
        return PartitionState::Isolated;
    }
    if let Some(rest) = text
        .strip_prefix("isolated invalid")
        .or_else(|| text.strip_prefix("root invalid"))
    {
        let reason = rest
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim();
        return PartitionState::Invalid(if reason.is_empty() {
            "the kernel gave no reason".into()
        } else {
            reason.to_string()
        });
    }
    PartitionState::Other(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    #[test]
    fn container_cgroup_table() {
        let cases: [(&str, Result<&str, &str>); 9] = [
            (
                "/kubepods/besteffort/pod1/abc",
                Ok("kubepods/besteffort/pod1/abc"),
            ),
            ("/kubepods/pod1/abc", Ok("kubepods/pod1/abc")),
            (
                "kubepods-besteffort-pod1.slice:cri-containerd:abc",
                Ok("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope"),
            ),
            (
                "kubepods-pod1.slice:crio:abc",
                Ok("kubepods.slice/kubepods-pod1.slice/crio-abc.scope"),
            ),
            ("-.slice::abc", Ok("abc.scope")),
            ("", Err("no cgroups path")),
            ("/", Err("is the root cgroup")),
            ("/kubepods/../x", Err("leaves the cgroup root")),
            ("kubepods--x.slice:p:abc", Err("is not a slice name")),
        ];
        for (raw, want) in cases {
            match (container_cgroup(raw), want) {
                (Ok(got), Ok(path)) => assert_eq!(got, PathBuf::from(path), "{raw:?}"),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{raw:?}: {e}"),
                (got, want) => panic!("{raw:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn ancestors_are_below_the_root_outermost_first() {
        assert_eq!(
            ancestors(Path::new("a/b/c")),
            vec![PathBuf::from("a"), PathBuf::from("a/b")]
        );
        assert!(ancestors(Path::new("a")).is_empty());
    }

    fn w(dir: &str, file: &'static str, value: &str) -> Write {
        Write {
            dir: dir.into(),
            file,
            value: value.into(),
        }
    }

    #[test]
    fn isolate_grows_the_ancestors_top_down_then_the_container() {
        let ancestors = [
            (PathBuf::from("kubepods"), set("6")),
            (PathBuf::from("kubepods/pod1"), CpuSet::new()),
        ];
        assert_eq!(
            isolate_writes(Path::new("kubepods/pod1/c"), &ancestors, &set("2-3")),
            vec![
                w("kubepods", EXCLUSIVE, "2-3,6"),
                w("kubepods/pod1", EXCLUSIVE, "2-3"),
                w("kubepods/pod1/c", EXCLUSIVE, "2-3"),
                w("kubepods/pod1/c", PARTITION, "isolated"),
            ]
        );
        // Ancestors that hold the CPUs already (a restarted container).
        let held = [
            (PathBuf::from("kubepods"), set("2-3,6")),
            (PathBuf::from("kubepods/pod1"), set("2-3")),
        ];
        assert_eq!(
            isolate_writes(Path::new("kubepods/pod1/c"), &held, &set("2-3")),
            vec![
                w("kubepods/pod1/c", EXCLUSIVE, "2-3"),
                w("kubepods/pod1/c", PARTITION, "isolated"),
            ]
        );
    }

    #[test]
    fn release_leaves_the_partition_then_shrinks_the_ancestors_bottom_up() {
        let ancestors = [
            (PathBuf::from("kubepods"), set("2-3,6")),
            (PathBuf::from("kubepods/pod1"), set("2-3")),
        ];
        assert_eq!(
            release_writes(Some(Path::new("kubepods/pod1/c")), &ancestors, &set("2-3")),
            vec![
                w("kubepods/pod1/c", PARTITION, "member"),
                w("kubepods/pod1/c", EXCLUSIVE, ""),
                w("kubepods/pod1", EXCLUSIVE, ""),
                w("kubepods", EXCLUSIVE, "6"),
            ]
        );
        // The cgroup is gone and the ancestors were given back already:
        // nothing to do (a second release is harmless).
        let released = [
            (PathBuf::from("kubepods"), set("6")),
            (PathBuf::from("kubepods/pod1"), CpuSet::new()),
        ];
        assert!(release_writes(None, &released, &set("2-3")).is_empty());
    }

    #[test]
    fn partition_state_table() {
        for (text, want) in [
            ("isolated\n", PartitionState::Isolated),
            (
                "isolated invalid (Parent is not a partition root)",
                PartitionState::Invalid("Parent is not a partition root".into()),
            ),
            (
                "isolated invalid",
                PartitionState::Invalid("the kernel gave no reason".into()),
            ),
            ("member", PartitionState::Other("member".into())),
            ("root", PartitionState::Other("root".into())),
        ] {
            assert_eq!(partition_state(text), want, "{text:?}");
        }
    }

    #[test]
    fn stale_exclusive_cpus_leave_members_only() {
        let member = PartitionState::Other("member".into());
        // (exclusive, partition, children's exclusive, kept)
        let cases: Vec<(&str, PartitionState, Vec<&str>, Option<&str>)> = vec![
            // A child still holds 2-3; 6 is nobody's.
            ("2-3,6", member.clone(), vec!["2-3", ""], Some("2-3")),
            // Nothing below holds any.
            ("2-3", member.clone(), vec![], Some("")),
            // All held: nothing written.
            ("2-3", member.clone(), vec!["2", "3"], None),
            ("", member.clone(), vec![], None),
            // A partition root's exclusive CPUs are its own.
            ("2-3", PartitionState::Isolated, vec![], None),
            ("2-3", PartitionState::Other("root".into()), vec![], None),
            ("2-3", PartitionState::Invalid("x".into()), vec![], None),
        ];
        for (exclusive, partition, children, kept) in cases {
            let children: Vec<CpuSet> = children.into_iter().map(set).collect();
            let write = stale_exclusive_write(
                Path::new("kubepods"),
                &set(exclusive),
                &partition,
                &children,
            );
            assert_eq!(
                write.as_ref().map(|w| w.value.as_str()),
                kept.map(|k| set(k).to_cpulist()).as_deref(),
                "{exclusive} {partition:?}"
            );
            if let Some(w) = write {
                assert_eq!(
                    (w.dir.as_path(), w.file),
                    (Path::new("kubepods"), EXCLUSIVE)
                );
            }
        }
    }
}
