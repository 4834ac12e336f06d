//! Isolated cpuset partitions (`tuning.loadBalancing: off`): the container
//! of such a claim gets a cgroup v2 cpuset partition of its own, of type
//! `isolated`, which takes its CPUs out of the scheduler's load balancing
//! (and out of unbound workqueues).
//!
//! Kernel facts this relies on (Documentation/admin-guide/cgroup-v2.rst,
//! Linux 6.7+ for remote partitions):
//! - A partition whose parent is not a partition root is a remote
//!   partition; it needs its CPUs in `cpuset.cpus.exclusive` of every
//!   ancestor below the root, written from the top down, and in its own.
//!   A cgroup's exclusive CPUs are never a sibling's.
//! - Writing `isolated` to `cpuset.cpus.partition` makes it; the file then
//!   reads `isolated`, or `isolated invalid (<reason>)` when the kernel
//!   could not. The root's `cpuset.cpus.isolated` lists every isolated CPU.
//! - An ancestor losing the CPUs invalidates the partition; removing the
//!   container's cgroup dissolves it. So the CPUs are given back from the
//!   container up.
//!
//! The decisions are in [`plan`]; [`IsolatedPartitions`] is the thin
//! writer. Nothing is recorded on disk: the kernel's files are the record
//! (a restarted nri-plugin finds the ancestors' exclusive CPUs as they are
//! and gives them back when the container stops).
//!
//! On cgroup v1, which has no partitions, the same calls turn the claim's
//! CPUs out of load balancing with `cpuset.sched_load_balance` ([`v1`]).

use std::io;
use std::path::{Path, PathBuf};

use shared_state::CpuSet;

pub mod keeper;
pub mod plan;
pub mod v1;

use plan::{
    ancestors, container_cgroup, isolate_writes, partition_state, release_writes,
    stale_exclusive_write, CgroupPathError, PartitionState, Write, EXCLUSIVE, PARTITION,
};
use v1::SchedLoadBalance;

/// Why a container could not get its isolated partition.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(transparent)]
    Path(#[from] CgroupPathError),
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {}", file.display(), match source.kind() { io::ErrorKind::NotFound => "missing (the cpuset controller is not enabled down to the container)".to_string(), _ => source.to_string() })]
    Read {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {text:?} is not a cpulist", file.display())]
    Parse { file: PathBuf, text: String },
    #[error("the kernel refused the isolated partition: {reason} ({} reads {text:?})", file.display())]
    Invalid {
        file: PathBuf,
        reason: String,
        text: String,
    },
    #[error("cgroup v1: {reason} ({} reads {text:?})", file.display())]
    NotUnbalanced {
        file: PathBuf,
        reason: String,
        text: String,
    },
    #[error("{}: {text:?} is not 0 or 1", file.display())]
    Flag { file: PathBuf, text: String },
    #[error("cgroup v1: the root cpuset balances every CPU ({} is not 0), so no cpuset below can leave load balancing; the node's operator turns it off (docs/user/tuning.md)", file.display())]
    RootBalances { file: PathBuf },
    #[error("cgroup v1: {} is 1 outside kubelet's tree and its cpuset holds the claim's CPUs {cpus}, which it keeps balanced; the node's operator gives it other CPUs or turns it off", file.display())]
    BalancedOutside { file: PathBuf, cpus: CpuSet },
}

/// What [`IsolatedPartitions::isolate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolated {
    /// The partition was made.
    Made { cgroup: PathBuf },
    /// It was there already (a restarted nri-plugin, a repeated event).
    Already { cgroup: PathBuf },
}

/// The cgroupfs side of isolated partitions, under the cgroup root
/// (`--cgroup-root`): cgroup v2 partitions, or on cgroup v1 the
/// load-balancing flags of kubelet's tree.
#[derive(Debug, Clone)]
pub struct IsolatedPartitions {
    root: PathBuf,
    v1: Option<SchedLoadBalance>,
}

/// The outermost ancestor of a container's cgroup (`kubepods`), or the
/// cgroup itself when it has none.
fn top_of(cgroup: &Path) -> PathBuf {
    ancestors(cgroup)
        .into_iter()
        .next()
        .unwrap_or_else(|| cgroup.to_path_buf())
}

impl IsolatedPartitions {
    pub fn new(root: &Path) -> Self {
        IsolatedPartitions {
            root: root.to_path_buf(),
            v1: SchedLoadBalance::find(root),
        }
    }

    /// Partitions under `root` unless the cpuset hierarchy (the root on
    /// cgroup v2, its v1 cpuset mount) is mounted read-only, as the chart
    /// mounts it without low-latency tuning: no partition can be made there,
    /// and the container events that only serve them are not asked for.
    /// The mount's flag decides, not the directory's mode: a v1 hierarchy's
    /// root reads `r-x` for everyone, and root writes its files without
    /// `CAP_DAC_OVERRIDE`.
    pub fn writable(root: &Path) -> Option<Self> {
        let partitions = Self::new(root);
        let written = partitions.v1.as_ref().map_or(root, SchedLoadBalance::root);
        let mount = nix::sys::statvfs::statvfs(written).ok()?;
        (!mount
            .flags()
            .contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
        .then_some(partitions)
    }

    /// Whether this is cgroup v1, where kubelet's whole tree is kept to
    /// the rule (a pod created since a claim's container started needs its
    /// flags turned off too; see [`v1`]).
    pub fn is_v1(&self) -> bool {
        self.v1.is_some()
    }

    /// cgroup v1: the CPUs of a container's cgroup when it does not
    /// balance (`None` elsewhere, on cgroup v2, or when unreadable).
    pub fn v1_unbalanced_cpus(&self, cgroups_path: &str) -> Option<CpuSet> {
        let v1 = self.v1.as_ref()?;
        let cgroup = container_cgroup(cgroups_path).ok()?;
        v1.unbalanced_cpus(&cgroup).ok().flatten()
    }

    /// cgroup v1: turns the claim's CPUs out of load balancing, with
    /// `others` (the CPUs other containers hold isolated) kept out.
    fn isolate_v1(
        &self,
        v1: &SchedLoadBalance,
        cgroup: PathBuf,
        cpus: &CpuSet,
        others: &CpuSet,
    ) -> Result<Isolated, PartitionError> {
        let tops = [top_of(&cgroup)];
        let isolated = cpus.union(others);
        v1.check_outside(&tops, &isolated)?;
        let before = v1.balances(&cgroup)?;
        v1.bring_to_rule(&tops, &isolated)?;
        match v1.balances(&cgroup)? {
            Some(false) if before == Some(false) => Ok(Isolated::Already { cgroup }),
            Some(false) => Ok(Isolated::Made { cgroup }),
            found => {
                // Give back what this pass turned off for it.
                if let Err(undo) = v1.bring_to_rule(&tops, others) {
                    tracing::warn!(cgroup = %cgroup.display(), error = %undo, "giving back the load balancing of a refused container failed");
                }
                let (reason, text) = match found {
                    Some(_) if v1.holds_any(&cgroup, cpus)? => {
                        ("the container still balances the claim's CPUs", "1")
                    }
                    Some(_) => ("the container's cpuset holds none of the claim's CPUs", "1"),
                    None => (
                        "the container has no cgroup in the cpuset hierarchy",
                        "nothing",
                    ),
                };
                Err(PartitionError::NotUnbalanced {
                    file: v1.flag_file(&cgroup),
                    reason: reason.into(),
                    text: text.into(),
                })
            }
        }
    }

    fn file(&self, dir: &Path, name: &str) -> PathBuf {
        self.root.join(dir).join(name)
    }

    fn read(&self, dir: &Path, name: &str) -> Result<String, PartitionError> {
        let file = self.file(dir, name);
        std::fs::read_to_string(&file)
            .map(|t| t.trim().to_string())
            .map_err(|source| PartitionError::Read { file, source })
    }

    fn read_cpus(&self, dir: &Path) -> Result<CpuSet, PartitionError> {
        let text = self.read(dir, EXCLUSIVE)?;
        CpuSet::parse_cpulist(&text).map_err(|_| PartitionError::Parse {
            file: self.file(dir, EXCLUSIVE),
            text,
        })
    }

    /// Each ancestor with its exclusive CPUs, outermost first.
    fn ancestors_of(&self, cgroup: &Path) -> Result<Vec<(PathBuf, CpuSet)>, PartitionError> {
        ancestors(cgroup)
            .into_iter()
            .map(|dir| Ok((dir.clone(), self.read_cpus(&dir)?)))
            .collect()
    }

    fn apply(&self, writes: &[Write]) -> Result<(), PartitionError> {
        for w in writes {
            let file = self.file(&w.dir, w.file);
            // One write with a newline: an empty value must still reach
            // the kernel's handler.
            std::fs::write(&file, format!("{}\n", w.value))
                .map_err(|source| PartitionError::Io { file, source })?;
        }
        Ok(())
    }

    /// Makes the cgroup of `cgroups_path` (the container's OCI
    /// `linux.cgroupsPath`) an isolated partition of `cpus`. On failure
    /// everything written is given back, and the error says why (the
    /// kernel's reason when it refused).
    /// `others`: the CPUs other containers hold isolated now (cgroup v1
    /// keeps them out; a partition is the container's alone).
    pub fn isolate(
        &self,
        cgroups_path: &str,
        cpus: &CpuSet,
        others: &CpuSet,
    ) -> Result<Isolated, PartitionError> {
        let cgroup = container_cgroup(cgroups_path).map_err(PartitionError::Path)?;
        if let Some(v1) = &self.v1 {
            return self.isolate_v1(v1, cgroup, cpus, others);
        }
        if partition_state(&self.read(&cgroup, PARTITION)?) == PartitionState::Isolated
            && self.read_cpus(&cgroup)? == *cpus
        {
            return Ok(Isolated::Already { cgroup });
        }
        let ancestors = self.ancestors_of(&cgroup)?;
        let result = self
            .apply(&isolate_writes(&cgroup, &ancestors, cpus))
            .and_then(|()| {
                let text = self.read(&cgroup, PARTITION)?;
                match partition_state(&text) {
                    PartitionState::Isolated => Ok(()),
                    PartitionState::Invalid(reason) => Err(PartitionError::Invalid {
                        file: self.file(&cgroup, PARTITION),
                        reason,
                        text,
                    }),
                    PartitionState::Other(_) => Err(PartitionError::Invalid {
                        file: self.file(&cgroup, PARTITION),
                        reason: "the partition did not take".into(),
                        text,
                    }),
                }
            });
        match result {
            Ok(()) => Ok(Isolated::Made { cgroup }),
            Err(e) => {
                if let Err(undo) = self.release(cgroups_path, cpus, others) {
                    tracing::warn!(cgroup = %cgroup.display(), error = %undo, "giving back a refused partition's CPUs failed");
                }
                Err(e)
            }
        }
    }

    /// Gives `cpus` back: the container's cgroup (if it is still there)
    /// leaves its partition, and every ancestor still there loses them.
    /// Returns the number of files written; a second call writes nothing.
    /// `still`: the CPUs other containers hold isolated (cgroup v1 keeps
    /// them out of load balancing).
    pub fn release(
        &self,
        cgroups_path: &str,
        cpus: &CpuSet,
        still: &CpuSet,
    ) -> Result<usize, PartitionError> {
        let cgroup = container_cgroup(cgroups_path).map_err(PartitionError::Path)?;
        if let Some(v1) = &self.v1 {
            return Ok(v1.bring_to_rule(&[top_of(&cgroup)], still)?.len());
        }
        // The container's own files: only when it still holds a partition
        // or exclusive CPUs; a failure here must not keep the ancestors'.
        let own_held = self.root.join(&cgroup).is_dir()
            && (self.read_cpus(&cgroup).map_or(true, |c| !c.is_empty())
                || self.read(&cgroup, PARTITION).map_or(true, |t| {
                    partition_state(&t) != PartitionState::Other("member".into())
                }));
        let mut first_error = None;
        let mut written = 0;
        if own_held {
            for w in release_writes(Some(cgroup.as_path()), &[], cpus) {
                match self.apply(std::slice::from_ref(&w)) {
                    Ok(()) => written += 1,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        let mut held = Vec::new();
        for dir in ancestors(&cgroup) {
            if !self.root.join(&dir).join(EXCLUSIVE).exists() {
                // Removed already (a pod's cgroup after the pod), or
                // never had cpuset: nothing of ours is there.
                continue;
            }
            let cpus_there = self.read_cpus(&dir)?;
            held.push((dir, cpus_there));
        }
        let writes = release_writes(None, &held, cpus);
        self.apply(&writes)?;
        written += writes.len();
        match first_error {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}

impl IsolatedPartitions {
    /// Takes the exclusive CPUs no cgroup below holds out of the subtrees
    /// the running containers live in (their OCI `linux.cgroupsPath`; the
    /// walk starts at each one's outermost ancestor, `kubepods`): what a
    /// partition leaves in `kubepods`, its QoS cgroup and its pod cgroup
    /// when its container is removed while nri-plugin is down, and nobody
    /// gives its CPUs back. Bottom up, so a parent sees its children swept;
    /// only cgroups with exclusive CPUs are descended into (a child's are
    /// always its parent's). Returns the cgroups written.
    /// On cgroup v1 it brings those subtrees' load-balancing flags to the
    /// rule for the CPUs `isolated` now (see [`v1`]).
    pub fn sweep_stale_exclusive<'p>(
        &self,
        cgroups_paths: impl IntoIterator<Item = &'p str>,
        isolated: &CpuSet,
    ) -> Result<Vec<PathBuf>, PartitionError> {
        let mut tops: Vec<PathBuf> = cgroups_paths
            .into_iter()
            .filter_map(|path| container_cgroup(path).ok())
            .filter_map(|cgroup| ancestors(&cgroup).into_iter().next())
            .collect();
        tops.sort();
        tops.dedup();
        if let Some(v1) = &self.v1 {
            // Where the root balances, no flag below matters and none is
            // this driver's: an ordinary cgroup v1 node is left alone.
            if !v1.root_unbalanced()? {
                return Ok(Vec::new());
            }
            let written = v1.bring_to_rule(&tops, isolated)?;
            return Ok(written.into_iter().map(|w| w.dir).collect());
        }
        let mut swept = Vec::new();
        for top in tops {
            self.sweep_below(&top, &mut swept)?;
        }
        Ok(swept)
    }

    /// Sweeps `dir` and what is below it; returns its exclusive CPUs after.
    fn sweep_below(&self, dir: &Path, swept: &mut Vec<PathBuf>) -> Result<CpuSet, PartitionError> {
        let exclusive = match self.read_cpus(dir) {
            Ok(cpus) => cpus,
            // Gone meanwhile, or no cpuset here: it holds nothing.
            Err(PartitionError::Read { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                return Ok(CpuSet::new())
            }
            Err(e) => return Err(e),
        };
        if exclusive.is_empty() {
            return Ok(exclusive);
        }
        let here = self.root.join(dir);
        let entries = std::fs::read_dir(&here).map_err(|source| PartitionError::Read {
            file: here.clone(),
            source,
        })?;
        let mut children = Vec::new();
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                children.push(self.sweep_below(&dir.join(entry.file_name()), swept)?);
            }
        }
        let partition = partition_state(&self.read(dir, PARTITION)?);
        match stale_exclusive_write(dir, &exclusive, &partition, &children) {
            Some(write) => {
                self.apply(std::slice::from_ref(&write))?;
                swept.push(dir.to_path_buf());
                self.read_cpus(dir)
            }
            None => Ok(exclusive),
        }
    }
}

/// A fake cgroup tree for tests: plain files, so the partition file reads
/// back what was written (`isolated`), as a kernel that accepted it would.
#[cfg(test)]
pub(crate) mod fake_tree {
    use super::plan::{EXCLUSIVE, PARTITION};

    /// `dirs` (relative to the tree's root), each with an empty
    /// `cpuset.cpus.exclusive` and a `member` partition.
    pub fn make(dirs: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in dirs {
            let path = dir.path().join(d);
            std::fs::create_dir_all(&path).expect("mkdir");
            std::fs::write(path.join(EXCLUSIVE), "\n").expect("exclusive");
            std::fs::write(path.join(PARTITION), "member\n").expect("partition");
        }
        dir
    }

    /// A file of the tree, trimmed.
    pub fn read(dir: &tempfile::TempDir, path: &str) -> String {
        std::fs::read_to_string(dir.path().join(path))
            .expect("read")
            .trim()
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    use super::fake_tree::read;

    fn tree(dirs: &[&str]) -> (tempfile::TempDir, IsolatedPartitions) {
        let dir = super::fake_tree::make(dirs);
        let partitions = IsolatedPartitions::new(dir.path());
        (dir, partitions)
    }

    #[test]
    fn isolate_then_release_on_a_cgroupfs_tree() {
        let (dir, p) = tree(&["kubepods", "kubepods/pod1", "kubepods/pod1/c"]);
        std::fs::write(dir.path().join("kubepods").join(EXCLUSIVE), "6\n").expect("other claim");
        let made = p
            .isolate("/kubepods/pod1/c", &set("2-3"), &CpuSet::new())
            .expect("isolate");
        assert_eq!(
            made,
            Isolated::Made {
                cgroup: "kubepods/pod1/c".into()
            }
        );
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "2-3,6");
        assert_eq!(read(&dir, "kubepods/pod1/cpuset.cpus.exclusive"), "2-3");
        assert_eq!(read(&dir, "kubepods/pod1/c/cpuset.cpus.exclusive"), "2-3");
        assert_eq!(
            read(&dir, "kubepods/pod1/c/cpuset.cpus.partition"),
            "isolated"
        );
        assert!(matches!(
            p.isolate("/kubepods/pod1/c", &set("2-3"), &CpuSet::new()),
            Ok(Isolated::Already { .. })
        ));

        assert_eq!(
            p.release("/kubepods/pod1/c", &set("2-3"), &CpuSet::new())
                .expect("release"),
            4
        );
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "6");
        assert_eq!(read(&dir, "kubepods/pod1/cpuset.cpus.exclusive"), "");
        assert_eq!(
            read(&dir, "kubepods/pod1/c/cpuset.cpus.partition"),
            "member"
        );
        assert_eq!(
            p.release("/kubepods/pod1/c", &set("2-3"), &CpuSet::new())
                .expect("again"),
            0
        );
    }

    #[test]
    fn a_failed_partition_write_is_undone_and_named() {
        let (dir, p) = tree(&["kubepods", "kubepods/pod1"]);
        // The container's exclusive file cannot be written (a directory
        // where the file should be), after its ancestors were: they get
        // their CPUs back.
        let c = dir.path().join("kubepods/pod1/c");
        std::fs::create_dir_all(c.join(EXCLUSIVE)).expect("mkdir");
        std::fs::write(c.join(PARTITION), "member\n").expect("partition");
        let err = p
            .isolate("/kubepods/pod1/c", &set("2-3"), &CpuSet::new())
            .expect_err("refused");
        assert!(err.to_string().contains("c/cpuset.cpus.exclusive"), "{err}");
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "");
        assert_eq!(read(&dir, "kubepods/pod1/cpuset.cpus.exclusive"), "");
        assert_eq!(
            read(&dir, "kubepods/pod1/c/cpuset.cpus.partition"),
            "member"
        );
    }

    #[test]
    fn a_cgroup_without_cpuset_files_is_refused_by_name() {
        let (dir, p) = tree(&["kubepods"]);
        std::fs::create_dir_all(dir.path().join("kubepods/pod1/c")).expect("mkdir");
        let err = p
            .isolate("/kubepods/pod1/c", &set("2"), &CpuSet::new())
            .expect_err("no cpuset files");
        assert!(
            err.to_string().contains("cpuset controller is not enabled"),
            "{err}"
        );
    }

    /// A pod removed while nri-plugin was down left 6 in `kubepods` and its
    /// QoS cgroup: the sweep takes it out, bottom up, and keeps 2-3, which
    /// a running container's partition still holds. A second sweep writes
    /// nothing. Control: without the sweep, 6 stays (read before it).
    #[test]
    fn a_sweep_takes_exclusive_cpus_no_partition_holds() {
        let (dir, p) = tree(&[
            "kubepods",
            "kubepods/burstable",
            "kubepods/burstable/pod1",
            "kubepods/burstable/pod1/c",
            "kubepods/besteffort",
            "kubepods/besteffort/pod2/s",
        ]);
        p.isolate("/kubepods/burstable/pod1/c", &set("2-3"), &CpuSet::new())
            .expect("isolate");
        for d in ["kubepods", "kubepods/burstable"] {
            std::fs::write(dir.path().join(d).join(EXCLUSIVE), "2-3,6\n").expect("left behind");
        }
        assert_eq!(
            read(&dir, "kubepods/burstable/cpuset.cpus.exclusive"),
            "2-3,6"
        );
        let paths = ["/kubepods/burstable/pod1/c", "/kubepods/besteffort/pod2/s"];
        let swept = p.sweep_stale_exclusive(paths, &set("2-3")).expect("sweep");
        assert_eq!(
            swept,
            vec![
                PathBuf::from("kubepods/burstable"),
                PathBuf::from("kubepods")
            ]
        );
        for d in ["kubepods", "kubepods/burstable", "kubepods/burstable/pod1"] {
            assert_eq!(
                read(&dir, &format!("{d}/cpuset.cpus.exclusive")),
                "2-3",
                "{d}"
            );
        }
        assert_eq!(
            read(&dir, "kubepods/burstable/pod1/c/cpuset.cpus.partition"),
            "isolated"
        );
        assert!(p
            .sweep_stale_exclusive(paths, &set("2-3"))
            .expect("again")
            .is_empty());
    }

    /// cgroup v1: a container whose cpuset does not hold the claim's CPUs
    /// (or that has no cgroup) is refused by name, and what the pass turned
    /// off for it balances again; another claim's CPUs stay out.
    #[test]
    fn on_cgroup_v1_a_container_off_its_claims_cpus_is_refused_and_undone() {
        use super::v1::fake_tree::{flag, make};
        let dir = make(
            "0",
            &[
                ("kubepods", "0-7"),
                ("kubepods/p", "0-7"),
                ("kubepods/p/wrong", "0-1"),
                ("kubepods/q", "0-7"),
                ("kubepods/q/other", "6"),
            ],
        );
        let p = IsolatedPartitions::new(dir.path());
        assert!(p.is_v1());
        p.isolate("/kubepods/q/other", &set("6"), &CpuSet::new())
            .expect("the other claim");
        let err = p
            .isolate("/kubepods/p/wrong", &set("2-3"), &set("6"))
            .expect_err("its cpuset holds 0-1");
        assert!(
            err.to_string().contains("holds none of the claim's CPUs"),
            "{err}"
        );
        assert_eq!(flag(&dir, "kubepods/p/wrong"), "1");
        for d in ["kubepods", "kubepods/p", "kubepods/q", "kubepods/q/other"] {
            assert_eq!(flag(&dir, d), "0", "{d} holds the other claim's CPU 6");
        }
        let err = p
            .isolate("/kubepods/p/gone", &set("2-3"), &set("6"))
            .expect_err("no cgroup");
        assert!(
            err.to_string()
                .contains("has no cgroup in the cpuset hierarchy"),
            "{err}"
        );
    }
}
