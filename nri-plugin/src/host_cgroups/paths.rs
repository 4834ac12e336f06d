//! Which `--host-cgroups` entries are acceptable: a relative path under
//! the cgroup root, never the root, never above it, and never a cgroup that
//! holds (or is) a pod cgroup, which its containers' cpusets place.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::HostCgroupError;

/// Directory names of the pod cgroups kubelet creates (cgroupfs driver:
/// `kubepods`, systemd driver: `kubepods.slice` and its
/// `kubepods-<qos>.slice` children).
pub(super) fn is_pod_cgroup_name(name: &str) -> bool {
    name == "kubepods"
        || name == "kubepods.slice"
        || (name.starts_with("kubepods-") && name.ends_with(".slice"))
}

/// A `--host-cgroups` entry as a relative path under the cgroup root. A
/// leading `/` is accepted (it is how `/proc/PID/cgroup` writes them); `.`
/// components are dropped; `..`, the root itself and empty entries are
/// refused.
pub fn parse_cgroup_path(raw: &str) -> Result<PathBuf, HostCgroupError> {
    let bad = |reason| HostCgroupError::BadPath {
        path: raw.to_string(),
        reason,
    };
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(bad("an empty path"));
    }
    if trimmed.contains('\0') {
        return Err(bad("a NUL byte in the path"));
    }
    let mut out = PathBuf::new();
    for component in Path::new(trimmed).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                return Err(bad("'..' would leave the cgroup root"));
            }
            Component::Prefix(_) => return Err(bad("not a cgroup path")),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(bad(
            "the root cgroup holds the pods too; name a cgroup under it, e.g. system.slice",
        ));
    }
    if let Some(pods) = out
        .components()
        .find(|c| is_pod_cgroup_name(&c.as_os_str().to_string_lossy()))
    {
        return Err(HostCgroupError::HoldsPods {
            path: raw.to_string(),
            pods: PathBuf::from(pods.as_os_str()),
        });
    }
    Ok(out)
}

/// Checks that `dir` (the cgroup `path`) and its subtree hold no pod
/// cgroup. Symlinks are not followed (cgroupfs has none).
pub(super) fn find_pod_cgroup(dir: &Path, depth: usize) -> io::Result<Option<PathBuf>> {
    // cgroup trees are shallow; the bound only stops a pathological walk.
    if depth > 32 {
        return Ok(None);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        if is_pod_cgroup_name(&name.to_string_lossy()) {
            return Ok(Some(entry.path()));
        }
        if let Some(found) = find_pod_cgroup(&entry.path(), depth + 1)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_table() {
        let cases: [(&str, Result<&str, &str>); 12] = [
            ("system.slice", Ok("system.slice")),
            ("/system.slice", Ok("system.slice")),
            ("./system.slice/", Ok("system.slice")),
            ("a/./b", Ok("a/b")),
            (" system.slice ", Ok("system.slice")),
            ("", Err("an empty path")),
            ("/", Err("the root cgroup")),
            ("..", Err("'..'")),
            ("system.slice/../kubepods.slice", Err("'..'")),
            ("kubepods.slice", Err("holds pod cgroups")),
            ("kubepods/besteffort", Err("holds pod cgroups")),
            (
                "kubepods.slice/kubepods-burstable.slice",
                Err("holds pod cgroups"),
            ),
        ];
        for (raw, want) in cases {
            match (parse_cgroup_path(raw), want) {
                (Ok(got), Ok(path)) => assert_eq!(got, PathBuf::from(path), "{raw:?}"),
                (Err(e), Err(needle)) => {
                    let text = e.to_string();
                    assert!(text.contains(needle), "{raw:?}: {text}");
                    assert!(text.contains("--host-cgroups"), "{text}");
                }
                (got, want) => panic!("{raw:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn pod_cgroup_names() {
        for (name, pods) in [
            ("kubepods", true),
            ("kubepods.slice", true),
            ("kubepods-besteffort.slice", true),
            ("kubepods-burstable-pod1.slice", true),
            ("system.slice", false),
            ("kubepodsx", false),
            ("my-kubepods.slice", false),
        ] {
            assert_eq!(is_pod_cgroup_name(name), pods, "{name}");
        }
    }
}
