//! `loadBalancing: off` on cgroup v1, where there are no partitions.
//!
//! Kernel facts this relies on (Documentation/admin-guide/cgroup-v1/cpusets.rst,
//! "sched_load_balance"): the scheduler's domains are built from the cpusets
//! whose `cpuset.sched_load_balance` is 1, found by walking down from the
//! root and going below a cpuset only where its flag is 0. A CPU is left out
//! of load balancing when no cpuset reached that way holds it. So:
//! - the root's flag must be 0. That changes how the whole node is
//!   balanced, so it is the node operator's to set (with the system's
//!   processes in a balanced cpuset of their own); it is checked here and
//!   never written;
//! - in kubelet's tree (`kubepods`, the outermost ancestor of a container's
//!   cgroup), every cgroup whose `cpuset.cpus` holds an isolated CPU gets 0:
//!   `kubepods` itself, the QoS and pod cgroups, each pod sandbox's, and
//!   the claim's container; every other keeps 1 (a shared container's
//!   cpuset never holds a claim's CPU, so the shared pool stays balanced);
//! - outside kubelet's tree, a cpuset that balances an isolated CPU would
//!   undo it: it is named in the refusal, not changed.
//!
//! Nothing is recorded: the flags are the record. The tree is brought to
//! that rule as a whole, at a pod sandbox's and any container's start, at a
//! claim container's stop, after every claim change and on the timer, so a
//! pod created since (its cgroups start at 1 with every CPU), or a flag a
//! killed nri-plugin left at 0 where the kernel looks, is put right by the
//! next pass, and a cgroup no isolated CPU needs balances again. (A 0 left
//! below a cgroup that balances again is never looked at, by the kernel or
//! by the walk, and changes nothing.)

use std::io;
use std::path::{Path, PathBuf};

use shared_state::CpuSet;

use super::PartitionError;

pub const LOAD_BALANCE: &str = "cpuset.sched_load_balance";
pub const CPUS: &str = "cpuset.cpus";

/// Whether a cgroup of kubelet's tree should balance while `isolated` CPUs
/// are out of load balancing.
pub fn should_balance(cpus: &CpuSet, isolated: &CpuSet) -> bool {
    cpus.is_disjoint(isolated)
}

/// Whether a walk that found a cgroup balancing (`was`) and leaves it
/// balancing (`now`) or not goes below it. Below a cgroup that balanced
/// and still does, the kernel never looks, and a child's CPUs are its
/// parent's, so nothing there holds an isolated CPU; anywhere else a
/// child may need its flag changed.
pub fn goes_below(was: bool, now: bool) -> bool {
    !(was && now)
}

/// `cpuset.sched_load_balance`'s text as a flag.
pub fn parse_flag(text: &str) -> Option<bool> {
    match text.trim() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// Whether an error says the cgroup is gone.
fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

/// The cgroup v1 cpuset hierarchy (its mount, `<cgroup-root>/cpuset`).
#[derive(Debug, Clone)]
pub struct SchedLoadBalance {
    root: PathBuf,
}

/// One flag changed by a pass: the cgroup (relative to the hierarchy's
/// root) and whether it balances now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagWrite {
    pub dir: PathBuf,
    pub balances: bool,
}

impl SchedLoadBalance {
    /// The v1 cpuset hierarchy under a cgroup root, if there is one: the
    /// root itself or its `cpuset/` (not on a cgroup v2 root).
    pub fn find(cgroup_root: &Path) -> Option<SchedLoadBalance> {
        if cgroup_root.join("cgroup.controllers").exists() {
            return None;
        }
        [cgroup_root.join("cpuset"), cgroup_root.to_path_buf()]
            .into_iter()
            .find(|dir| dir.join(LOAD_BALANCE).is_file())
            .map(|root| SchedLoadBalance { root })
    }

    /// The v1 cpuset hierarchy's mount: where this writes.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn file(&self, dir: &Path, name: &str) -> PathBuf {
        self.root.join(dir).join(name)
    }

    /// A cgroup's file, trimmed; `None` when the cgroup is gone.
    fn read(&self, dir: &Path, name: &str) -> Result<Option<String>, PartitionError> {
        let file = self.file(dir, name);
        match std::fs::read_to_string(&file) {
            Ok(text) => Ok(Some(text.trim().to_string())),
            Err(source) if gone(&source) => Ok(None),
            Err(source) => Err(PartitionError::Read { file, source }),
        }
    }

    /// A cgroup's CPUs and flag; `None` when it is gone.
    fn state(&self, dir: &Path) -> Result<Option<(CpuSet, bool)>, PartitionError> {
        let (Some(cpus), Some(flag)) = (self.read(dir, CPUS)?, self.read(dir, LOAD_BALANCE)?)
        else {
            return Ok(None);
        };
        let parsed_cpus = CpuSet::parse_cpulist(&cpus).map_err(|_| PartitionError::Parse {
            file: self.file(dir, CPUS),
            text: cpus.clone(),
        })?;
        let balances = parse_flag(&flag).ok_or_else(|| PartitionError::Flag {
            file: self.file(dir, LOAD_BALANCE),
            text: flag,
        })?;
        Ok(Some((parsed_cpus, balances)))
    }

    fn children(&self, dir: &Path) -> Result<Vec<PathBuf>, PartitionError> {
        let here = self.root.join(dir);
        let entries = match std::fs::read_dir(&here) {
            Ok(entries) => entries,
            Err(source) if gone(&source) => return Ok(Vec::new()),
            Err(source) => return Err(PartitionError::Read { file: here, source }),
        };
        let mut children: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| dir.join(e.file_name()))
            .collect();
        children.sort();
        Ok(children)
    }

    /// Brings kubelet's tree below each of `tops` to the rule: 0 where a
    /// cgroup's CPUs hold an `isolated` CPU, 1 elsewhere. Top down, so a
    /// parent stops balancing before its children are looked at. Returns
    /// the flags it changed; a cgroup removed meanwhile is skipped.
    pub fn bring_to_rule(
        &self,
        tops: &[PathBuf],
        isolated: &CpuSet,
    ) -> Result<Vec<FlagWrite>, PartitionError> {
        let mut written = Vec::new();
        let mut pending: Vec<PathBuf> = tops.to_vec();
        while let Some(dir) = pending.pop() {
            let Some((cpus, was)) = self.state(&dir)? else {
                continue;
            };
            let now = should_balance(&cpus, isolated);
            if now != was {
                let file = self.file(&dir, LOAD_BALANCE);
                match std::fs::write(&file, if now { "1\n" } else { "0\n" }) {
                    Ok(()) => written.push(FlagWrite {
                        dir: dir.clone(),
                        balances: now,
                    }),
                    // Removed between the read and the write (ENODEV:
                    // opened just before its cgroup went).
                    Err(e) if gone(&e) => continue,
                    Err(source) => return Err(PartitionError::Io { file, source }),
                }
            }
            if goes_below(was, now) {
                pending.extend(self.children(&dir)?.into_iter().rev());
            }
        }
        Ok(written)
    }

    /// Whether the kernel can take `isolated` out of load balancing with
    /// kubelet's tree (`tops`) brought to the rule: the root's flag is 0,
    /// and no cpuset outside the tree balances one of them.
    pub fn check_outside(&self, tops: &[PathBuf], isolated: &CpuSet) -> Result<(), PartitionError> {
        let root = PathBuf::new();
        if !self.root_unbalanced()? {
            return Err(PartitionError::RootBalances {
                file: self.file(&root, LOAD_BALANCE),
            });
        }
        let mut pending = self.children(&root)?;
        while let Some(dir) = pending.pop() {
            if tops.contains(&dir) {
                continue;
            }
            let Some((cpus, balances)) = self.state(&dir)? else {
                continue;
            };
            if !balances {
                pending.extend(self.children(&dir)?);
            } else if !should_balance(&cpus, isolated) {
                return Err(PartitionError::BalancedOutside {
                    file: self.file(&dir, LOAD_BALANCE),
                    cpus: cpus.intersection(isolated),
                });
            }
        }
        Ok(())
    }

    /// Whether the root cpuset's flag is 0, as the node's operator sets it
    /// for `loadBalancing: off`.
    pub fn root_unbalanced(&self) -> Result<bool, PartitionError> {
        let file = self.file(Path::new(""), LOAD_BALANCE);
        match std::fs::read_to_string(&file) {
            Ok(text) => parse_flag(&text)
                .map(|balances| !balances)
                .ok_or(PartitionError::Flag { file, text }),
            Err(source) => Err(PartitionError::Read { file, source }),
        }
    }

    /// A cgroup's CPUs when it does not balance (`None`: it balances, or
    /// is gone).
    pub fn unbalanced_cpus(&self, dir: &Path) -> Result<Option<CpuSet>, PartitionError> {
        Ok(self
            .state(dir)?
            .and_then(|(cpus, balances)| (!balances).then_some(cpus)))
    }

    /// Whether a cgroup balances now (`None`: gone).
    pub fn balances(&self, dir: &Path) -> Result<Option<bool>, PartitionError> {
        Ok(self.state(dir)?.map(|(_, balances)| balances))
    }

    /// Whether a cgroup's cpuset holds any of `cpus` (`false`: gone).
    pub fn holds_any(&self, dir: &Path, cpus: &CpuSet) -> Result<bool, PartitionError> {
        Ok(self
            .state(dir)?
            .is_some_and(|(held, _)| !held.is_disjoint(cpus)))
    }

    /// The file of a cgroup's flag, for messages.
    pub fn flag_file(&self, dir: &Path) -> PathBuf {
        self.file(dir, LOAD_BALANCE)
    }
}

#[cfg(test)]
pub(crate) mod fake_tree {
    use super::{CPUS, LOAD_BALANCE};

    /// A cgroup v1 root (`cpuset/` under the returned directory) with the
    /// root's flag as given and `dirs` (relative to the hierarchy), each
    /// `(path, cpus)` balancing, as new cpusets do.
    pub fn make(root_flag: &str, dirs: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("cpuset");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::write(root.join(CPUS), "0-7\n").expect("cpus");
        std::fs::write(root.join(LOAD_BALANCE), format!("{root_flag}\n")).expect("flag");
        for (d, cpus) in dirs {
            add(&dir, d, cpus);
        }
        dir
    }

    /// A cgroup made after the tree (`path`, relative to the hierarchy),
    /// balancing, as the kernel makes it.
    pub fn add(dir: &tempfile::TempDir, path: &str, cpus: &str) {
        let path = dir.path().join("cpuset").join(path);
        std::fs::create_dir_all(&path).expect("mkdir");
        std::fs::write(path.join(CPUS), format!("{cpus}\n")).expect("cpus");
        std::fs::write(path.join(LOAD_BALANCE), "1\n").expect("flag");
    }

    /// Turns a cgroup's flag off, as an nri-plugin before this one left it.
    pub fn unbalance(dir: &tempfile::TempDir, path: &str) {
        let file = dir.path().join("cpuset").join(path).join(LOAD_BALANCE);
        std::fs::write(file, "0\n").expect("flag");
    }

    /// The flag of a cgroup of the tree.
    pub fn flag(dir: &tempfile::TempDir, path: &str) -> String {
        crate::partition::fake_tree::read(dir, &format!("cpuset/{path}/{LOAD_BALANCE}"))
    }
}

#[cfg(test)]
mod tests {
    use super::fake_tree::{flag, make};
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    #[test]
    fn the_rule_table() {
        // (cgroup's CPUs, isolated, balances, goes below when it balanced)
        let cases = [
            ("0-7", "", true, false),
            ("0-7", "2-3", false, true),
            ("0-1", "2-3", true, false),
            ("2", "2-3", false, true),
            ("", "2-3", true, false),
        ];
        for (cpus, isolated, balances, below) in cases {
            let now = should_balance(&set(cpus), &set(isolated));
            assert_eq!(now, balances, "{cpus} with {isolated} isolated");
            assert_eq!(
                goes_below(true, now),
                below,
                "{cpus} with {isolated} isolated"
            );
            assert!(
                goes_below(false, now),
                "a cgroup that did not balance is always walked"
            );
        }
        assert_eq!(parse_flag("1\n"), Some(true));
        assert_eq!(parse_flag("0"), Some(false));
        assert_eq!(parse_flag("yes"), None);
    }

    const POD: &[(&str, &str)] = &[
        ("kubepods", "0-7"),
        ("kubepods/burstable", "0-7"),
        ("kubepods/burstable/pod1", "0-7"),
        ("kubepods/burstable/pod1/sandbox", "0-7"),
        ("kubepods/burstable/pod1/c", "2-3"),
        ("kubepods/besteffort", "0-7"),
        ("kubepods/besteffort/pod2", "0-7"),
        ("kubepods/besteffort/pod2/s", "0-1,4-7"),
    ];

    /// Isolating 2-3 turns off every cgroup holding them and leaves the
    /// shared container balancing; a second pass writes nothing; giving
    /// them back turns every one on again. Control: before the pass, the
    /// claim's container balances.
    #[test]
    fn a_pass_takes_the_claims_cpus_out_and_gives_them_back() {
        let dir = make("0", POD);
        let v1 = SchedLoadBalance::find(dir.path()).expect("a v1 hierarchy");
        let tops = [PathBuf::from("kubepods")];
        assert_eq!(flag(&dir, "kubepods/burstable/pod1/c"), "1");

        v1.check_outside(&tops, &set("2-3"))
            .expect("nothing outside");
        let written = v1.bring_to_rule(&tops, &set("2-3")).expect("isolate");
        let off: Vec<_> = written
            .iter()
            .map(|w| (w.dir.to_str().unwrap_or(""), w.balances))
            .collect();
        assert_eq!(
            off,
            vec![
                ("kubepods", false),
                ("kubepods/besteffort", false),
                ("kubepods/besteffort/pod2", false),
                ("kubepods/burstable", false),
                ("kubepods/burstable/pod1", false),
                ("kubepods/burstable/pod1/c", false),
                ("kubepods/burstable/pod1/sandbox", false),
            ]
        );
        assert_eq!(flag(&dir, "kubepods/besteffort/pod2/s"), "1");
        assert!(v1
            .bring_to_rule(&tops, &set("2-3"))
            .expect("again")
            .is_empty());

        let back = v1.bring_to_rule(&tops, &CpuSet::new()).expect("release");
        assert_eq!(back.len(), 7);
        assert!(back.iter().all(|w| w.balances));
        for (d, _) in POD {
            assert_eq!(flag(&dir, d), "1", "{d}");
        }
    }

    /// A pod created after the isolation (its cgroups balancing with every
    /// CPU) is put right by the next pass; one that holds none of the
    /// claim's CPUs is left balancing.
    #[test]
    fn a_pod_created_since_is_put_right_by_the_next_pass() {
        let dir = make("0", POD);
        let v1 = SchedLoadBalance::find(dir.path()).expect("v1");
        let tops = [PathBuf::from("kubepods")];
        v1.bring_to_rule(&tops, &set("2-3")).expect("isolate");
        super::fake_tree::add(&dir, "kubepods/besteffort/pod3", "0-7");
        assert_eq!(flag(&dir, "kubepods/besteffort/pod3"), "1");
        let written = v1.bring_to_rule(&tops, &set("2-3")).expect("pass");
        assert_eq!(
            written,
            vec![FlagWrite {
                dir: "kubepods/besteffort/pod3".into(),
                balances: false
            }]
        );
    }

    #[test]
    fn a_balancing_root_or_a_balancing_cpuset_outside_is_refused_by_name() {
        let dir = make("1", POD);
        let v1 = SchedLoadBalance::find(dir.path()).expect("v1");
        let tops = [PathBuf::from("kubepods")];
        let err = v1
            .check_outside(&tops, &set("2-3"))
            .expect_err("root balances");
        assert!(
            err.to_string().contains("cpuset/cpuset.sched_load_balance"),
            "{err}"
        );
        assert!(
            err.to_string().contains("root cpuset balances every CPU"),
            "{err}"
        );

        let mut dirs = POD.to_vec();
        dirs.extend([("system", "0-1"), ("machine.slice", "0-7")]);
        let dir = make("0", &dirs);
        let v1 = SchedLoadBalance::find(dir.path()).expect("v1");
        let err = v1
            .check_outside(&tops, &set("2-3"))
            .expect_err("machine.slice");
        assert!(
            err.to_string()
                .contains("machine.slice/cpuset.sched_load_balance"),
            "{err}"
        );
        assert!(err.to_string().contains("2-3"), "{err}");
        // The operator's system cpuset on other CPUs is what is wanted.
        std::fs::write(
            dir.path().join("cpuset/machine.slice").join(LOAD_BALANCE),
            "0\n",
        )
        .expect("flag");
        v1.check_outside(&tops, &set("2-3")).expect("prepared node");
    }

    #[test]
    fn only_a_cgroup_v1_cpuset_hierarchy_is_found() {
        let dir = make("0", &[]);
        assert!(SchedLoadBalance::find(dir.path()).is_some());
        assert!(
            SchedLoadBalance::find(&dir.path().join("cpuset")).is_some(),
            "mounted alone"
        );
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu\n").expect("v2");
        assert!(SchedLoadBalance::find(dir.path()).is_none());
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(SchedLoadBalance::find(empty.path()).is_none());
    }
}
