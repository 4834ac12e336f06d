//! Which containers hold an isolated partition made by this process, and
//! which running containers still wait for one.
//!
//! A container's claim may ask `loadBalancing: off` before nri-plugin knows
//! it does: a restarted nri-plugin starts from the claims' CDI specs, which
//! carry CPUs but no tuning, and the runtime's Synchronize or a
//! StartContainer can come before dra-plugin's snapshot. Such a container
//! runs unisolated until the claim is known; [`PartitionKeeper::reconcile`]
//! makes its partition then (after every claim change and on a timer), and
//! tries a partition the kernel refused again the same way.

use std::collections::HashMap;
use std::sync::Mutex;

use shared_state::CpuSet;

use super::{Isolated, IsolatedPartitions, PartitionError};

/// A claim container: its OCI `linux.cgroupsPath` and the CPUs of its
/// claims (for a mixed container, fewer than its cpuset), which are the
/// CPUs of its partition when it holds one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClaimContainer {
    cgroups_path: String,
    cpus: CpuSet,
}

#[derive(Debug, Default)]
struct Containers {
    /// Running claim containers (seen at Synchronize or StartContainer),
    /// until they stop.
    running: HashMap<String, ClaimContainer>,
    /// Containers holding a partition of these CPUs.
    held: HashMap<String, ClaimContainer>,
    /// Running containers whose partition the kernel refused, with the
    /// CPUs refused: logged once, tried again at each reconcile.
    refused: HashMap<String, CpuSet>,
}

/// What [`PartitionKeeper::reconcile`] did to one container.
#[derive(Debug)]
pub enum Reconciled {
    Made {
        container: String,
        cpus: CpuSet,
    },
    Refused {
        container: String,
        cpus: CpuSet,
        error: PartitionError,
        first: bool,
    },
}

/// The isolated partitions of this process's containers. One lock covers
/// the bookkeeping and the cgroupfs writes, so a container stopping while
/// its partition is being made cannot leave its CPUs in its ancestors.
#[derive(Debug)]
pub struct PartitionKeeper {
    partitions: IsolatedPartitions,
    containers: Mutex<Containers>,
}

/// The CPUs the containers of `held` hold isolated, but `except`'s.
fn held_cpus(held: &HashMap<String, ClaimContainer>, except: Option<&str>) -> CpuSet {
    held.iter()
        .filter(|(id, _)| Some(id.as_str()) != except)
        .fold(CpuSet::new(), |all, (_, h)| all.union(&h.cpus))
}

impl PartitionKeeper {
    pub fn new(partitions: IsolatedPartitions) -> Self {
        PartitionKeeper {
            partitions,
            containers: Mutex::new(Containers::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Containers> {
        shared_state::sync::lock(&self.containers)
    }

    /// The CPUs held isolated now, but `except`'s: those of the containers
    /// holding them, and on cgroup v1 also the claim CPUs of running claim
    /// containers whose own cgroup does not balance though no record says
    /// why (a restarted nri-plugin, before dra-plugin tells their tuning):
    /// on v1 the flags are the only record, so they are kept until the
    /// claim is known. Only the claims' CPUs: a mixed container's cpuset
    /// also holds the shared pool, which only claim CPUs ever take out of
    /// balancing.
    fn isolated_now(&self, containers: &Containers, except: Option<&str>) -> CpuSet {
        let mut isolated = held_cpus(&containers.held, except);
        if self.partitions.is_v1() {
            for (id, running) in &containers.running {
                if Some(id.as_str()) == except || containers.held.contains_key(id) {
                    continue;
                }
                if let Some(cpus) = self.partitions.v1_unbalanced_cpus(&running.cgroups_path) {
                    isolated = isolated.union(&cpus.intersection(&running.cpus));
                }
            }
        }
        isolated
    }

    /// A running claim container and the CPUs of its claims, so that a
    /// partition its claim asks for later is made when the claim is known.
    pub fn note_running(&self, container_id: &str, cgroups_path: &str, claim_cpus: CpuSet) {
        self.lock().running.insert(
            container_id.to_string(),
            ClaimContainer {
                cgroups_path: cgroups_path.to_string(),
                cpus: claim_cpus,
            },
        );
    }

    /// Makes the partition of a container about to start (its claim asks
    /// for one). On success the container is remembered as holding it.
    pub fn isolate(
        &self,
        container_id: &str,
        cgroups_path: &str,
        cpus: &CpuSet,
    ) -> Result<Isolated, PartitionError> {
        let mut containers = self.lock();
        // A refused start does not run: it is not remembered, so no later
        // reconcile makes a partition of its cgroup.
        let others = self.isolated_now(&containers, Some(container_id));
        let isolated = self.partitions.isolate(cgroups_path, cpus, &others)?;
        containers.running.insert(
            container_id.to_string(),
            ClaimContainer {
                cgroups_path: cgroups_path.to_string(),
                cpus: cpus.clone(),
            },
        );
        containers.refused.remove(container_id);
        containers.held.insert(
            container_id.to_string(),
            ClaimContainer {
                cgroups_path: cgroups_path.to_string(),
                cpus: cpus.clone(),
            },
        );
        Ok(isolated)
    }

    /// Makes the partitions running containers lack: `wanted` gives the
    /// CPUs a container's claims ask to isolate (`None`: no partition).
    pub fn reconcile(&self, wanted: impl Fn(&str) -> Option<CpuSet>) -> Vec<Reconciled> {
        let mut containers = self.lock();
        let due: Vec<(String, String, CpuSet)> = containers
            .running
            .iter()
            .filter(|(id, _)| !containers.held.contains_key(*id))
            .filter_map(|(id, running)| {
                wanted(id).map(|cpus| (id.clone(), running.cgroups_path.clone(), cpus))
            })
            .collect();
        // Every container due is kept out of balancing while each is made
        // (cgroup v1 brings the whole tree to one rule at each).
        let due_cpus = due
            .iter()
            .fold(CpuSet::new(), |all, (_, _, cpus)| all.union(cpus));
        let mut done = Vec::new();
        for (id, cgroups_path, cpus) in due {
            // Another container of the claim (a restart of this one) holds
            // them: the partition stays with it.
            if containers.held.values().any(|h| !h.cpus.is_disjoint(&cpus)) {
                continue;
            }
            let others = self.isolated_now(&containers, Some(&id)).union(&due_cpus);
            match self.partitions.isolate(&cgroups_path, &cpus, &others) {
                Ok(Isolated::Made { .. }) | Ok(Isolated::Already { .. }) => {
                    containers.refused.remove(&id);
                    containers.held.insert(
                        id.clone(),
                        ClaimContainer {
                            cgroups_path,
                            cpus: cpus.clone(),
                        },
                    );
                    done.push(Reconciled::Made {
                        container: id,
                        cpus,
                    });
                }
                Err(error) => {
                    let first =
                        containers.refused.insert(id.clone(), cpus.clone()) != Some(cpus.clone());
                    done.push(Reconciled::Refused {
                        container: id,
                        cpus,
                        error,
                        first,
                    });
                }
            }
        }
        done
    }

    /// The container stopped or was removed: gives back its partition.
    /// `cgroups_path` is the event's; `view_cpus` what the view knows of
    /// the CPUs it should hold (after a restart of this process, the only
    /// knowledge). Returns the number of files written.
    pub fn release(
        &self,
        container_id: &str,
        cgroups_path: &str,
        view_cpus: Option<CpuSet>,
    ) -> Result<usize, PartitionError> {
        let mut containers = self.lock();
        containers.running.remove(container_id);
        containers.refused.remove(container_id);
        let recorded = containers.held.remove(container_id);
        let Some(held) = recorded.or_else(|| {
            view_cpus.map(|cpus| ClaimContainer {
                cgroups_path: cgroups_path.to_string(),
                cpus,
            })
        }) else {
            return Ok(0);
        };
        // Another container of the claim (kubelet's restart of it) may
        // hold the CPUs by now: they stay where it needs them.
        if containers
            .held
            .values()
            .any(|h| !h.cpus.is_disjoint(&held.cpus))
        {
            return Ok(0);
        }
        let still = self.isolated_now(&containers, None);
        self.partitions
            .release(&held.cgroups_path, &held.cpus, &still)
    }

    /// At Synchronize, `running` is every container the runtime lists: the
    /// others were removed while their events were missed (the runtime's
    /// connection was lost). They are forgotten, and a partition one of them
    /// held is given back (its cgroup is gone with it; the ancestors keep
    /// its CPUs as exclusive until then). Returns the partitions given back.
    pub fn forget_gone(
        &self,
        running: &std::collections::HashSet<&str>,
    ) -> Vec<(String, Result<usize, PartitionError>)> {
        let mut containers = self.lock();
        containers
            .running
            .retain(|id, _| running.contains(id.as_str()));
        containers
            .refused
            .retain(|id, _| running.contains(id.as_str()));
        let gone: Vec<String> = containers
            .held
            .keys()
            .filter(|id| !running.contains(id.as_str()))
            .cloned()
            .collect();
        let mut released = Vec::new();
        for id in gone {
            let Some(held) = containers.held.remove(&id) else {
                continue;
            };
            if containers
                .held
                .values()
                .any(|h| !h.cpus.is_disjoint(&held.cpus))
            {
                continue;
            }
            let still = self.isolated_now(&containers, None);
            released.push((
                id,
                self.partitions
                    .release(&held.cgroups_path, &held.cpus, &still),
            ));
        }
        released
    }

    /// Sweeps the exclusive CPUs no partition holds out of the ancestors of
    /// these cgroups (see [`IsolatedPartitions::sweep_stale_exclusive`]),
    /// under the lock that makes and gives back partitions.
    pub fn sweep_stale_exclusive<'p>(
        &self,
        cgroups_paths: impl IntoIterator<Item = &'p str>,
    ) -> Result<Vec<std::path::PathBuf>, PartitionError> {
        let containers = self.lock();
        let isolated = self.isolated_now(&containers, None);
        self.partitions
            .sweep_stale_exclusive(cgroups_paths, &isolated)
    }

    /// cgroup v1: brings kubelet's tree to the rule again for the CPUs held
    /// isolated, since a pod created after a claim's container started has
    /// its cgroups balancing every CPU (see [`super::v1`]). Returns the
    /// cgroups written; nothing on cgroup v2 or while nothing is held.
    pub fn refresh_v1(&self) -> Result<Vec<std::path::PathBuf>, PartitionError> {
        let containers = self.lock();
        if !self.partitions.is_v1() {
            return Ok(Vec::new());
        }
        let isolated = self.isolated_now(&containers, None);
        if isolated.is_empty() {
            return Ok(Vec::new());
        }
        let paths: Vec<&str> = containers
            .held
            .values()
            .map(|h| h.cgroups_path.as_str())
            .chain(containers.running.values().map(|r| r.cgroups_path.as_str()))
            .collect();
        self.partitions.sweep_stale_exclusive(paths, &isolated)
    }

    /// Whether this is cgroup v1 (see [`IsolatedPartitions::is_v1`]).
    pub fn is_v1(&self) -> bool {
        self.partitions.is_v1()
    }

    /// Containers remembered as holding a partition.
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake_tree::read;
    use super::super::plan::{EXCLUSIVE, PARTITION};
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn tree(dirs: &[&str]) -> (tempfile::TempDir, PartitionKeeper) {
        let dir = super::super::fake_tree::make(dirs);
        let keeper = PartitionKeeper::new(IsolatedPartitions::new(dir.path()));
        (dir, keeper)
    }

    #[test]
    fn a_running_container_gets_its_partition_once_its_claim_asks_for_one() {
        let (dir, keeper) = tree(&["kubepods", "kubepods/p", "kubepods/p/c", "kubepods/p/s"]);
        keeper.note_running("c", "/kubepods/p/c", set("2-3"));
        keeper.note_running("s", "/kubepods/p/s", set("5"));
        // The claim is not known to ask for it yet: nothing is written.
        assert!(keeper.reconcile(|_| None).is_empty());
        assert_eq!(read(&dir, "kubepods/p/c/cpuset.cpus.partition"), "member");
        // Now it is: made once, for that container only.
        let wanted = |id: &str| (id == "c").then(|| set("2-3"));
        let done = keeper.reconcile(wanted);
        assert!(
            matches!(done.as_slice(), [Reconciled::Made { container, cpus }] if container == "c" && *cpus == set("2-3")),
            "{done:?}"
        );
        assert_eq!(read(&dir, "kubepods/p/c/cpuset.cpus.partition"), "isolated");
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "2-3");
        assert_eq!(read(&dir, "kubepods/p/s/cpuset.cpus.partition"), "member");
        assert!(keeper.reconcile(wanted).is_empty(), "held: not made again");
        // Its stop gives it back, from the record.
        assert_eq!(
            keeper.release("c", "/kubepods/p/c", None).expect("release"),
            4
        );
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "");
        assert!(
            keeper.reconcile(wanted).is_empty(),
            "stopped: not made again"
        );
    }

    #[test]
    fn a_refused_partition_is_logged_once_and_tried_again() {
        let (dir, keeper) = tree(&["kubepods", "kubepods/p"]);
        // The container's exclusive file cannot be written yet.
        let c = dir.path().join("kubepods/p/c");
        std::fs::create_dir_all(c.join(EXCLUSIVE)).expect("mkdir");
        std::fs::write(c.join(PARTITION), "member\n").expect("partition");
        keeper.note_running("c", "/kubepods/p/c", set("4"));
        let wanted = |_: &str| Some(set("4"));
        let firsts: Vec<bool> = (0..2)
            .flat_map(|_| keeper.reconcile(wanted))
            .map(|r| match r {
                Reconciled::Refused { first, .. } => first,
                Reconciled::Made { .. } => panic!("made on a broken tree"),
            })
            .collect();
        assert_eq!(firsts, vec![true, false]);
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "", "undone");
        // The kernel takes it now.
        std::fs::remove_dir(c.join(EXCLUSIVE)).expect("rmdir");
        std::fs::write(c.join(EXCLUSIVE), "\n").expect("exclusive");
        assert!(matches!(
            keeper.reconcile(wanted).as_slice(),
            [Reconciled::Made { .. }]
        ));
        assert_eq!(read(&dir, "kubepods/p/c/cpuset.cpus.partition"), "isolated");
        assert_eq!(keeper.held(), 1);
    }

    #[test]
    fn containers_gone_unseen_are_forgotten_at_synchronize_and_their_cpus_given_back() {
        let (dir, keeper) = tree(&["kubepods", "kubepods/p", "kubepods/p/a", "kubepods/p/b"]);
        keeper
            .isolate("a", "/kubepods/p/a", &set("2-3"))
            .expect("a isolated");
        keeper.note_running("b", "/kubepods/p/b", set("4"));
        // a stopped and went while its events were missed: its cgroup too.
        std::fs::remove_dir_all(dir.path().join("kubepods/p/a")).expect("a's cgroup gone");
        let running = std::collections::HashSet::from(["b"]);
        let released = keeper.forget_gone(&running);
        assert!(
            matches!(released.as_slice(), [(id, Ok(n))] if id == "a" && *n > 0),
            "{released:?}"
        );
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "");
        assert_eq!(read(&dir, "kubepods/p/cpuset.cpus.exclusive"), "");
        assert_eq!(keeper.held(), 0);
        // b still runs: remembered, and made when its claim asks.
        assert!(matches!(
            keeper
                .reconcile(|id| (id == "b").then(|| set("4")))
                .as_slice(),
            [Reconciled::Made { .. }]
        ));
        // A second Synchronize gives nothing back twice.
        assert!(keeper.forget_gone(&running).is_empty());
    }

    #[test]
    fn cpus_held_by_another_container_of_the_claim_stay_with_it() {
        let (dir, keeper) = tree(&["kubepods", "kubepods/p", "kubepods/p/a", "kubepods/p/b"]);
        keeper
            .isolate("a", "/kubepods/p/a", &set("2-3"))
            .expect("a isolated");
        keeper.note_running("b", "/kubepods/p/b", set("2-3"));
        assert!(keeper.reconcile(|_| Some(set("2-3"))).is_empty());
        assert_eq!(read(&dir, "kubepods/p/b/cpuset.cpus.partition"), "member");
        // b's stop gives nothing back: a holds them.
        assert_eq!(
            keeper
                .release("b", "/kubepods/p/b", Some(set("2-3")))
                .expect("b"),
            0
        );
        assert_eq!(read(&dir, "kubepods/cpuset.cpus.exclusive"), "2-3");
    }

    /// cgroup v1: two claims' containers isolated in two pods; a pod
    /// created since is turned off by the refresh; the first stop keeps
    /// what the second still needs off (`kubepods`, its QoS and pod
    /// cgroups) and turns on what only the first needed; the last stop
    /// turns everything on. Control: a refresh with nothing held writes
    /// nothing (the new pod keeps balancing).
    #[test]
    fn on_cgroup_v1_each_stop_keeps_what_the_other_claims_still_need() {
        use super::super::v1::fake_tree::{add, flag, make};
        let dir = make(
            "0",
            &[
                ("kubepods", "0-7"),
                ("kubepods/pa", "0-7"),
                ("kubepods/pa/a", "2-3"),
                ("kubepods/pb", "0-7"),
                ("kubepods/pb/b", "4"),
                ("kubepods/ps", "0-7"),
                ("kubepods/ps/s", "0-1,5-7"),
            ],
        );
        let keeper = PartitionKeeper::new(IsolatedPartitions::new(dir.path()));
        add(&dir, "kubepods/pn", "0-7");
        assert!(keeper.refresh_v1().expect("nothing held").is_empty());
        assert_eq!(flag(&dir, "kubepods/pn"), "1");

        assert!(matches!(
            keeper.isolate("a", "/kubepods/pa/a", &set("2-3")),
            Ok(Isolated::Made { .. })
        ));
        keeper.isolate("b", "/kubepods/pb/b", &set("4")).expect("b");
        for d in [
            "kubepods",
            "kubepods/pa",
            "kubepods/pa/a",
            "kubepods/pb/b",
            "kubepods/ps",
            "kubepods/pn",
        ] {
            assert_eq!(flag(&dir, d), "0", "{d}");
        }
        assert_eq!(
            flag(&dir, "kubepods/ps/s"),
            "1",
            "the shared container balances"
        );

        add(&dir, "kubepods/pm", "0-7");
        assert_eq!(
            keeper.refresh_v1().expect("refresh"),
            vec![std::path::PathBuf::from("kubepods/pm")]
        );

        assert!(keeper.release("a", "/kubepods/pa/a", None).expect("a") > 0);
        assert_eq!(flag(&dir, "kubepods/pa/a"), "1", "only a needed it");
        for d in [
            "kubepods",
            "kubepods/pa",
            "kubepods/pb",
            "kubepods/pb/b",
            "kubepods/pm",
        ] {
            assert_eq!(flag(&dir, d), "0", "{d}: b's CPU 4 is still there");
        }
        keeper.release("b", "/kubepods/pb/b", None).expect("b");
        for d in [
            "kubepods",
            "kubepods/pa",
            "kubepods/pb",
            "kubepods/pb/b",
            "kubepods/pm",
            "kubepods/pn",
        ] {
            assert_eq!(flag(&dir, d), "1", "{d}");
        }
    }

    /// cgroup v1 after a restart of nri-plugin, before dra-plugin tells the
    /// claims' tuning: a running claim container whose cgroup does not
    /// balance keeps its CPUs out through the Synchronize sweep (the flags
    /// are the only record); one that balances is not presumed isolated
    /// (its pod's stale 0 is put back). Once the claim is known to ask, it
    /// is held; a node whose root balances is left alone by the sweep.
    #[test]
    fn on_cgroup_v1_a_restart_keeps_what_the_flags_say_until_the_claims_are_known() {
        use super::super::v1::fake_tree::{flag, make, unbalance};
        let tree = [
            ("kubepods", "0-7"),
            ("kubepods/pa", "0-7"),
            ("kubepods/pa/a", "2-3"),
            // A pod on other CPUs than a's.
            ("kubepods/pb", "4-7"),
            ("kubepods/pb/b", "4"),
        ];
        let dir = make("0", &tree);
        for d in ["kubepods", "kubepods/pa", "kubepods/pa/a", "kubepods/pb"] {
            unbalance(&dir, d);
        }
        let keeper = PartitionKeeper::new(IsolatedPartitions::new(dir.path()));
        keeper.note_running("a", "/kubepods/pa/a", set("2-3"));
        keeper.note_running("b", "/kubepods/pb/b", set("4"));
        let swept = keeper
            .sweep_stale_exclusive(["/kubepods/pa/a", "/kubepods/pb/b"])
            .expect("sweep");
        assert_eq!(swept, vec![std::path::PathBuf::from("kubepods/pb")]);
        for d in ["kubepods", "kubepods/pa", "kubepods/pa/a"] {
            assert_eq!(flag(&dir, d), "0", "{d}: a's CPUs stay out");
        }
        assert_eq!(flag(&dir, "kubepods/pb/b"), "1");
        assert!(matches!(
            keeper
                .reconcile(|id| (id == "a").then(|| set("2-3")))
                .as_slice(),
            [Reconciled::Made { .. }]
        ));
        assert_eq!(keeper.held(), 1);

        // The control: a node whose root balances keeps every flag as it is.
        let plain = make("1", &tree);
        unbalance(&plain, "kubepods/pb");
        let keeper = PartitionKeeper::new(IsolatedPartitions::new(plain.path()));
        assert!(keeper
            .sweep_stale_exclusive(["/kubepods/pb/b"])
            .expect("sweep")
            .is_empty());
        assert_eq!(flag(&plain, "kubepods/pb"), "0");
    }

    /// cgroup v1 after a restart of nri-plugin, before dra-plugin tells the
    /// claims' tuning: a running mixed container (its cpuset is its claim's
    /// CPU 2 and the shared pool 4-7) whose cgroup does not balance keeps
    /// only its claim's CPU out. A shared container on the pool, and the
    /// pod cgroup above it, are brought back to balancing by the sweep.
    /// Control: had the mixed container's whole cpuset been taken for
    /// isolated, the shared container (4-7) would have been turned off.
    #[test]
    fn on_cgroup_v1_a_restart_keeps_out_only_a_mixed_containers_claim_cpus() {
        use super::super::v1::fake_tree::{flag, make, unbalance};
        let dir = make(
            "0",
            &[
                ("kubepods", "0-7"),
                ("kubepods/pm", "0-7"),
                ("kubepods/pm/m", "2,4-7"),
                ("kubepods/ps", "0-7"),
                ("kubepods/ps/s", "4-7"),
            ],
        );
        for d in [
            "kubepods",
            "kubepods/pm",
            "kubepods/pm/m",
            "kubepods/ps",
            "kubepods/ps/s",
        ] {
            unbalance(&dir, d);
        }
        let keeper = PartitionKeeper::new(IsolatedPartitions::new(dir.path()));
        keeper.note_running("m", "/kubepods/pm/m", set("2"));
        keeper
            .sweep_stale_exclusive(["/kubepods/pm/m", "/kubepods/ps/s"])
            .expect("sweep");
        for d in ["kubepods", "kubepods/pm", "kubepods/pm/m", "kubepods/ps"] {
            assert_eq!(flag(&dir, d), "0", "{d}: the claim's CPU 2 stays out");
        }
        assert_eq!(
            flag(&dir, "kubepods/ps/s"),
            "1",
            "the shared container balances the pool"
        );
    }
}
