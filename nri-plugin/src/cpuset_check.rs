//! The read-back of containers' cpusets: on a timer, every running
//! container's cgroup is read and compared with the cpuset last applied to
//! it. An update that rides in an event reply carries `ignore_failure` (a
//! container gone meanwhile must not fail another's create), a runtime may
//! report as done an update that never reached the cgroup, and someone else
//! (an operator, another agent) may write a cgroup; until the next pool
//! change nothing else would notice a shared container left on a claim's
//! CPUs, or a claim container off them.
//!
//! A container found on another cpuset twice in a row, with nothing applied
//! to it in between, is planned again: one reading could race an update the
//! runtime is still applying. A container whose repairs do not hold (some
//! other agent keeps writing its cgroup) is left alone after
//! [`MAX_REPAIRS`], and said so once.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use shared_state::CpuSet;

use crate::partition::plan::{container_cgroup, CgroupPathError};

/// Repairs of one container that did not hold before it is left alone.
pub const MAX_REPAIRS: u32 = 3;

/// Why a container's cpuset could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadBackError {
    #[error(transparent)]
    Path(#[from] CgroupPathError),
    #[error("{}: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {text:?} is not a cpulist", file.display())]
    Parse { file: PathBuf, text: String },
}

/// Where containers' `cpuset.cpus` files are: the cgroup v2 hierarchy, or
/// cgroup v1's cpuset hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupCpusets {
    cpuset_root: PathBuf,
    v1: bool,
}

impl CgroupCpusets {
    /// The cpuset files under `cgroup_root` (`--cgroup-root`): the root
    /// itself on cgroup v2, its `cpuset/` (or itself) on cgroup v1. `None`
    /// when neither is there.
    pub fn find(cgroup_root: &Path) -> Option<Self> {
        if cgroup_root.join("cgroup.controllers").is_file() {
            return Some(CgroupCpusets {
                cpuset_root: cgroup_root.to_path_buf(),
                v1: false,
            });
        }
        [cgroup_root.join("cpuset"), cgroup_root.to_path_buf()]
            .into_iter()
            .find(|dir| dir.join("cpuset.cpus").is_file())
            .map(|cpuset_root| CgroupCpusets {
                cpuset_root,
                v1: true,
            })
    }

    /// What a cgroup given `applied` holds on this kernel: on cgroup v1 the
    /// kernel takes a CPU that goes offline out of every cpuset (the root's
    /// is the online CPUs), so a claim container on a CPU gone offline is
    /// not drifted; cgroup v2 keeps `cpuset.cpus` as written.
    fn as_held(&self, applied: &CpuSet, v1_online: Option<&CpuSet>) -> CpuSet {
        match v1_online {
            Some(online) if self.v1 => applied.intersection(online),
            _ => applied.clone(),
        }
    }

    /// cgroup v1: the root cpuset's CPUs (the online ones); `None` on cgroup
    /// v2 or when unreadable.
    fn v1_online(&self) -> Option<CpuSet> {
        if !self.v1 {
            return None;
        }
        let text = std::fs::read_to_string(self.cpuset_root.join("cpuset.cpus")).ok()?;
        CpuSet::parse_cpulist(text.trim()).ok()
    }

    /// The cpuset a container's cgroup holds. `None` when its cgroup or the
    /// file is not there (the container stopped meanwhile, or the cpuset
    /// controller is not enabled down to it): nothing to compare.
    pub fn read(&self, cgroups_path: &str) -> Result<Option<CpuSet>, ReadBackError> {
        let file = self
            .cpuset_root
            .join(container_cgroup(cgroups_path)?)
            .join("cpuset.cpus");
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ReadBackError::Read { file, source }),
        };
        CpuSet::parse_cpulist(text.trim())
            .map(Some)
            .map_err(|_| ReadBackError::Parse {
                file,
                text: text.trim().to_string(),
            })
    }
}

/// One container read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub container_id: String,
    /// The cpuset last applied to it when its cgroup was read.
    pub applied: CpuSet,
    /// What its cgroup holds.
    pub found: CpuSet,
}

/// What to do about a container whose cgroup holds another cpuset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Plan its cpuset again.
    Repair(Reading),
    /// Its repairs did not hold [`MAX_REPAIRS`] times: left alone from now.
    GiveUp(Reading),
}

/// Decides from successive passes which containers drifted (see the module
/// docs); plain data, no I/O.
#[derive(Debug, Default)]
pub struct DriftJudge {
    /// Found once on another cpuset: (applied, found) at that pass.
    suspects: HashMap<String, (CpuSet, CpuSet)>,
    /// Confirmed drifts of a container since it last held what was applied.
    drifts: HashMap<String, u32>,
}

impl DriftJudge {
    /// Judges one pass over every container read. A container not in it
    /// (gone, or unreadable) and one holding its cpuset start afresh.
    pub fn pass(&mut self, readings: Vec<Reading>) -> Vec<Verdict> {
        let mut suspects = HashMap::new();
        let mut drifts = HashMap::new();
        let mut verdicts = Vec::new();
        for reading in readings {
            if reading.found == reading.applied {
                continue;
            }
            let id = reading.container_id.clone();
            let before = self.drifts.get(&id).copied().unwrap_or(0);
            let confirmed = self.suspects.get(&id).is_some_and(|(applied, found)| {
                *applied == reading.applied && *found == reading.found
            });
            if !confirmed {
                suspects.insert(id.clone(), (reading.applied.clone(), reading.found.clone()));
                if before > 0 {
                    drifts.insert(id, before);
                }
                continue;
            }
            let count = before.saturating_add(1);
            drifts.insert(id, count);
            if count <= MAX_REPAIRS {
                verdicts.push(Verdict::Repair(reading));
            } else if count == MAX_REPAIRS + 1 {
                verdicts.push(Verdict::GiveUp(reading));
            }
        }
        self.suspects = suspects;
        self.drifts = drifts;
        verdicts
    }
}

/// The read-back's state: the containers' cgroups paths (from the NRI
/// events) and the judge.
#[derive(Debug)]
pub struct CpusetReadBack {
    cgroups: CgroupCpusets,
    /// Container id → its OCI `linux.cgroupsPath`.
    paths: Mutex<HashMap<String, String>>,
    judge: Mutex<DriftJudge>,
    /// Whether an unreadable cgroup was logged (once per process).
    warned: std::sync::atomic::AtomicBool,
}

impl CpusetReadBack {
    pub fn new(cgroups: CgroupCpusets) -> Self {
        CpusetReadBack {
            cgroups,
            paths: Mutex::default(),
            judge: Mutex::default(),
            warned: Default::default(),
        }
    }

    /// A container the runtime created (or listed at Synchronize).
    pub fn note(&self, container_id: &str, cgroups_path: &str) {
        if !cgroups_path.is_empty() {
            shared_state::sync::lock(&self.paths)
                .insert(container_id.to_string(), cgroups_path.to_string());
        }
    }

    /// A container stopped or removed: no longer read.
    pub fn forget(&self, container_id: &str) {
        shared_state::sync::lock(&self.paths).remove(container_id);
    }

    /// The containers the runtime lists now, replacing what was known.
    pub fn replace_all<'c>(&self, containers: impl IntoIterator<Item = (&'c str, &'c str)>) {
        let mut paths = shared_state::sync::lock(&self.paths);
        paths.clear();
        for (id, cgroups_path) in containers {
            if !cgroups_path.is_empty() {
                paths.insert(id.to_string(), cgroups_path.to_string());
            }
        }
    }

    /// Reads back the cgroups of `applied` (container, cpuset last applied)
    /// and judges the pass.
    pub fn check(&self, applied: Vec<(String, CpuSet)>) -> Vec<Verdict> {
        let paths: Vec<(String, CpuSet, String)> = {
            let known = shared_state::sync::lock(&self.paths);
            applied
                .into_iter()
                .filter_map(|(id, cpus)| known.get(&id).cloned().map(|p| (id, cpus, p)))
                .collect()
        };
        let v1_online = self.cgroups.v1_online();
        let mut readings = Vec::with_capacity(paths.len());
        for (container_id, applied, cgroups_path) in paths {
            match self.cgroups.read(&cgroups_path) {
                Ok(Some(found)) if found == self.cgroups.as_held(&applied, v1_online.as_ref()) => {
                    readings.push(Reading {
                        container_id,
                        found: applied.clone(),
                        applied,
                    })
                }
                Ok(Some(found)) => readings.push(Reading {
                    container_id,
                    applied,
                    found,
                }),
                Ok(None) => {}
                Err(error) => {
                    if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::warn!(
                            container = %container_id, %error,
                            "cannot read a container's cpuset back (said once); it is not checked"
                        );
                    }
                }
            }
        }
        shared_state::sync::lock(&self.judge).pass(readings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn reading(id: &str, applied: &str, found: &str) -> Reading {
        Reading {
            container_id: id.into(),
            applied: set(applied),
            found: set(found),
        }
    }

    fn repairs(verdicts: &[Verdict]) -> Vec<&str> {
        verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Repair(r) => Some(r.container_id.as_str()),
                Verdict::GiveUp(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_drift_is_repaired_when_seen_twice_the_same() {
        // (pass readings, containers repaired after that pass)
        let passes: Vec<(Vec<Reading>, Vec<&str>)> = vec![
            (
                vec![
                    reading("ok", "1-3", "1-3"),
                    reading("racing", "1-3", "1-7"),
                    reading("moved", "1-3", "1"),
                    reading("drifted", "4", "1-7"),
                ],
                vec![],
            ),
            (
                vec![
                    reading("ok", "1-3", "1-3"),
                    // The update it raced has landed.
                    reading("racing", "1-3", "1-3"),
                    // Someone wrote it again, differently: a new suspect.
                    reading("moved", "1-3", "2"),
                    reading("drifted", "4", "1-7"),
                ],
                vec!["drifted"],
            ),
            (
                vec![
                    // Applied anew since (a pool change): read afresh.
                    reading("moved", "1-2", "2"),
                    reading("drifted", "4", "4"),
                ],
                vec![],
            ),
            (vec![reading("moved", "1-2", "2")], vec!["moved"]),
        ];
        let mut judge = DriftJudge::default();
        for (i, (readings, want)) in passes.into_iter().enumerate() {
            assert_eq!(repairs(&judge.pass(readings)), want, "pass {i}");
        }
    }

    #[test]
    fn repairs_that_do_not_hold_end_with_one_give_up() {
        let mut judge = DriftJudge::default();
        let mut repaired = 0;
        let mut given_up = Vec::new();
        for pass in 0..20 {
            // Each repair lands (applied "4") and is overwritten again.
            for verdict in judge.pass(vec![reading("c", "4", "1-7")]) {
                match verdict {
                    Verdict::Repair(_) => repaired += 1,
                    Verdict::GiveUp(r) => given_up.push((pass, r.container_id)),
                }
            }
        }
        assert_eq!(repaired, MAX_REPAIRS);
        assert_eq!(
            given_up,
            vec![(7, "c".to_string())],
            "once, after the repairs"
        );
        // Holding again starts afresh: a later drift is repaired.
        judge.pass(vec![reading("c", "4", "4")]);
        judge.pass(vec![reading("c", "4", "1")]);
        assert_eq!(
            repairs(&judge.pass(vec![reading("c", "4", "1")])),
            vec!["c"]
        );
    }

    #[test]
    fn cpusets_are_read_from_the_v1_or_v2_hierarchy() {
        let dir = tempfile::tempdir().expect("tmp");
        let v2 = dir.path().join("v2");
        let cgroup = v2.join("kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope");
        std::fs::create_dir_all(&cgroup).expect("mkdir");
        std::fs::write(v2.join("cgroup.controllers"), "cpuset cpu\n").expect("v2");
        std::fs::write(cgroup.join("cpuset.cpus"), "1-3,7\n").expect("cpus");
        let v1 = dir.path().join("v1");
        std::fs::create_dir_all(v1.join("cpuset/kubepods/pod1/abc")).expect("mkdir");
        std::fs::write(v1.join("cpuset/cpuset.cpus"), "0-7\n").expect("root");
        std::fs::write(v1.join("cpuset/kubepods/pod1/abc/cpuset.cpus"), "2\n").expect("cpus");
        std::fs::write(v1.join("cpuset/kubepods/pod1/bad"), "").expect("file");

        let v2 = CgroupCpusets::find(&v2).expect("v2");
        assert_eq!(
            v2.read("kubepods-pod1.slice:cri-containerd:abc")
                .expect("read"),
            Some(set("1-3,7"))
        );
        assert_eq!(
            v2.read("kubepods-pod1.slice:cri-containerd:gone")
                .expect("gone"),
            None
        );
        let v1 = CgroupCpusets::find(&v1).expect("v1");
        assert_eq!(v1.read("/kubepods/pod1/abc").expect("read"), Some(set("2")));
        assert!(matches!(v1.read(""), Err(ReadBackError::Path(_))));
        std::fs::create_dir_all(dir.path().join("v1/cpuset/kubepods/pod1/junk")).expect("mkdir");
        std::fs::write(
            dir.path().join("v1/cpuset/kubepods/pod1/junk/cpuset.cpus"),
            "x\n",
        )
        .expect("junk");
        assert!(matches!(
            v1.read("/kubepods/pod1/junk"),
            Err(ReadBackError::Parse { .. })
        ));
        assert!(CgroupCpusets::find(&dir.path().join("none")).is_none());
    }

    #[test]
    fn on_cgroup_v1_a_cpu_gone_offline_is_no_drift() {
        let dir = tempfile::tempdir().expect("tmp");
        let cpuset = dir.path().join("cpuset");
        for (rel, cpus) in [("", "0-2,4-7"), ("c", "3-4"), ("d", "4")] {
            std::fs::create_dir_all(cpuset.join(rel)).expect("mkdir");
            std::fs::write(cpuset.join(rel).join("cpuset.cpus"), cpus).expect("cpus");
        }
        let check = CpusetReadBack::new(CgroupCpusets::find(dir.path()).expect("v1"));
        check.replace_all([("c", "/c"), ("d", "/d")]);
        // c was given 3-4 and holds it although 3 is offline (as written
        // here); d was given 3-4 and the kernel took the offline 3 out.
        let applied = vec![("c".to_string(), set("3-4")), ("d".to_string(), set("3-4"))];
        check.check(applied.clone());
        assert!(check.check(applied).is_empty(), "neither drifted");
        // Control: with 3 online again, d's cgroup lacks it.
        std::fs::write(cpuset.join("cpuset.cpus"), "0-7").expect("online");
        let applied = vec![("d".to_string(), set("3-4"))];
        check.check(applied.clone());
        assert_eq!(repairs(&check.check(applied)), vec!["d"]);
    }

    #[test]
    fn only_known_containers_are_read() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset\n").expect("v2");
        for (name, cpus) in [("a", "1"), ("b", "2")] {
            std::fs::create_dir_all(dir.path().join(name)).expect("mkdir");
            std::fs::write(dir.path().join(name).join("cpuset.cpus"), cpus).expect("cpus");
        }
        let check = CpusetReadBack::new(CgroupCpusets::find(dir.path()).expect("v2"));
        check.replace_all([("a", "/a"), ("b", "/b")]);
        check.forget("b");
        let applied = vec![("a".to_string(), set("3")), ("b".to_string(), set("3"))];
        assert!(check.check(applied.clone()).is_empty(), "first sighting");
        assert_eq!(repairs(&check.check(applied)), vec!["a"], "b is forgotten");
    }
}
