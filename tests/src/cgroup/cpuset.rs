//! Reading back a cgroup's cpuset files, v1 or v2: what was requested and
//! what the kernel grants.

use std::path::{Path, PathBuf};

use shared_state::CpuSet;

use super::hierarchy::cpuset_hierarchy;
use super::{parse_cpulist_at, CgroupError};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::test_files::write_files;

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
}
