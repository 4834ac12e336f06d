//! The CPU topology of a node, discovered from sysfs.
//!
//! The data types here are what the allocator, the slice builder and the pool
//! logic read; discovery fills them from a sysfs root (`/` on a node, a tree
//! written by [`sysfs_tree`] in tests).

use crate::cpuset::CpuSet;
use discover::TopologyError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

/// Kind of core on hybrid parts; `Standard` everywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CoreType {
    #[serde(rename = "standard")]
    Standard,
    #[serde(rename = "p-core")]
    Performance,
    #[serde(rename = "e-core")]
    Efficiency,
}

impl CoreType {
    pub fn as_str(self) -> &'static str {
        match self {
            CoreType::Standard => "standard",
            CoreType::Performance => "p-core",
            CoreType::Efficiency => "e-core",
        }
    }
}

/// One online logical CPU.
///
/// A physical core is identified by `siblings`, not by `core`: `core_id`
/// repeats in every socket (and in every die on some parts), whereas a set of
/// hardware-thread ids belongs to exactly one core. See [`Topology::cores`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub id: u32,
    /// `physical_package_id`.
    pub socket: u32,
    /// `die_id`; 0 where the kernel does not report dies.
    pub die: u32,
    /// `cluster_id` as the kernel reports it; 0 where the file is absent.
    pub cluster: u32,
    /// `core_id`; unique only within a socket.
    pub core: u32,
    pub numa: u32,
    /// L3 cache id, `None` where the machine has no L3 (some Arm parts).
    pub l3: Option<u32>,
    pub core_type: CoreType,
    /// All hardware threads of this CPU's physical core, itself included.
    pub siblings: CpuSet,
}

#[cfg(test)]
impl CpuInfo {
    /// A hardware thread of a plain machine: one die, no clusters, standard
    /// cores.
    pub(crate) fn plain(
        id: u32,
        socket: u32,
        numa: u32,
        core: u32,
        l3: Option<u32>,
        siblings: CpuSet,
    ) -> CpuInfo {
        CpuInfo {
            id,
            socket,
            die: 0,
            cluster: 0,
            core,
            numa,
            l3,
            core_type: CoreType::Standard,
            siblings,
        }
    }
}

/// The online CPUs of a node, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub cpus: Vec<CpuInfo>,
    /// `devices/system/cpu/isolated`.
    pub isolated: CpuSet,
}

impl Topology {
    /// Discover the online CPUs under `sysfs_root`, the directory containing
    /// `sys/devices/system/cpu` (`/` on a node). See [`discover()`].
    pub fn discover(sysfs_root: &Path) -> Result<Topology, TopologyError> {
        discover::discover(sysfs_root)
    }

    /// All online CPUs.
    pub fn online(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }

    /// The CPU with this id, if it is online. `cpus` is sorted by id, so this
    /// is a binary search.
    pub fn cpu(&self, id: u32) -> Option<&CpuInfo> {
        self.cpus
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .and_then(|i| self.cpus.get(i))
    }

    /// Socket ids (`physical_package_id`), ascending.
    pub fn sockets(&self) -> Vec<u32> {
        sorted_unique(self.cpus.iter().map(|c| c.socket))
    }

    /// NUMA node ids that have online CPUs, ascending.
    pub fn numa_nodes(&self) -> Vec<u32> {
        sorted_unique(self.cpus.iter().map(|c| c.numa))
    }

    pub fn cpus_in_numa(&self, node: u32) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| c.numa == node)
            .map(|c| c.id)
            .collect()
    }

    pub fn cpus_in_socket(&self, socket: u32) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| c.socket == socket)
            .map(|c| c.id)
            .collect()
    }

    /// The CPUs sharing one L3. Groups are keyed by (socket, L3 id) so that a
    /// kernel numbering caches per socket cannot merge two sockets' caches.
    pub fn cpus_in_l3(&self, socket: u32, l3: u32) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| c.socket == socket && c.l3 == Some(l3))
            .map(|c| c.id)
            .collect()
    }

    /// Number of distinct L3 caches; 0 on machines without L3.
    pub fn l3_groups(&self) -> usize {
        self.cpus
            .iter()
            .filter_map(|c| c.l3.map(|l3| (c.socket, l3)))
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Hardware threads of the widest physical core (1 without SMT, 0 for an
    /// empty topology).
    pub fn smt_width(&self) -> usize {
        self.cpus
            .iter()
            .map(|c| c.siblings.len())
            .max()
            .unwrap_or(0)
    }

    /// Whether any physical core has more than one online hardware thread.
    pub fn smt_enabled(&self) -> bool {
        self.smt_width() > 1
    }

    /// The physical cores, each as the set of its online hardware threads,
    /// ordered by lowest CPU id.
    ///
    /// The sibling set is the identity of a physical core: `core_id` repeats
    /// across sockets (and across dies on some parts), while a set of thread
    /// ids cannot belong to two cores.
    pub fn cores(&self) -> Vec<CpuSet> {
        self.cpus
            .iter()
            .filter(|c| c.siblings.first() == Some(c.id))
            .map(|c| c.siblings.clone())
            .collect()
    }

    /// The physical core (all its online threads) of CPU `id`.
    pub fn core_of(&self, id: u32) -> Option<&CpuSet> {
        self.cpu(id).map(|c| &c.siblings)
    }

    /// The summary printed by `dra-plugin topology`.
    pub fn report(&self, reserved: &CpuSet) -> TopologyReport {
        TopologyReport {
            online: self.online(),
            sockets: self.sockets().len(),
            numa_nodes: self.numa_nodes().len(),
            l3_groups: self.l3_groups(),
            smt_width: self.smt_width(),
            isolated: self.isolated.clone(),
            reserved: reserved.clone(),
            cpus: self
                .cpus
                .iter()
                .map(|c| CpuReport {
                    id: c.id,
                    socket: c.socket,
                    numa: c.numa,
                    core: c.core,
                    l3: c.l3,
                    core_type: c.core_type,
                    siblings: c.siblings.clone(),
                })
                .collect(),
        }
    }
}

fn sorted_unique(ids: impl Iterator<Item = u32>) -> Vec<u32> {
    ids.collect::<BTreeSet<_>>().into_iter().collect()
}

/// Machine summary for the CLI; CPU sets print as cpulists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyReport {
    pub online: CpuSet,
    pub sockets: usize,
    pub numa_nodes: usize,
    pub l3_groups: usize,
    pub smt_width: usize,
    pub isolated: CpuSet,
    pub reserved: CpuSet,
    pub cpus: Vec<CpuReport>,
}

/// One CPU in a [`TopologyReport`]; `l3` is `null` where the machine has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuReport {
    pub id: u32,
    pub socket: u32,
    pub numa: u32,
    pub core: u32,
    pub l3: Option<u32>,
    pub core_type: CoreType,
    pub siblings: CpuSet,
}

pub mod discover;
pub mod pcie;
pub mod synthetic;
pub mod sysfs_tree;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn info(
        id: u32,
        socket: u32,
        numa: u32,
        core: u32,
        l3: Option<u32>,
        siblings: &str,
    ) -> CpuInfo {
        CpuInfo::plain(id, socket, numa, core, l3, set(siblings))
    }

    /// Two sockets, one core each with two threads (N, N+2); both sockets
    /// number their core 0 and their L3 0, as some kernels do.
    fn two_socket() -> Topology {
        Topology {
            cpus: vec![
                info(0, 0, 0, 0, Some(0), "0,2"),
                info(1, 1, 1, 0, Some(0), "1,3"),
                info(2, 0, 0, 0, Some(0), "0,2"),
                info(3, 1, 1, 0, Some(0), "1,3"),
            ],
            isolated: set("3"),
        }
    }

    #[test]
    fn queries() {
        let t = two_socket();
        assert_eq!(t.online(), set("0-3"));
        assert_eq!(t.cpu(2).map(|c| c.id), Some(2));
        assert!(t.cpu(4).is_none());
        assert_eq!(t.sockets(), vec![0, 1]);
        assert_eq!(t.numa_nodes(), vec![0, 1]);
        assert_eq!(t.cpus_in_numa(1), set("1,3"));
        assert_eq!(t.cpus_in_socket(0), set("0,2"));
        assert_eq!(t.cpus_in_socket(7), CpuSet::new());
        assert_eq!(t.cpus_in_l3(1, 0), set("1,3"));
        // Same core_id and L3 id in both sockets are still two cores, two L3s.
        assert_eq!(t.l3_groups(), 2);
        assert_eq!(t.cores(), vec![set("0,2"), set("1,3")]);
        assert_eq!(t.core_of(3), Some(&set("1,3")));
        assert_eq!(t.smt_width(), 2);
        assert!(t.smt_enabled());

        let empty = Topology {
            cpus: vec![],
            isolated: CpuSet::new(),
        };
        assert_eq!((empty.smt_width(), empty.l3_groups()), (0, 0));
        assert!(empty.cores().is_empty() && empty.online().is_empty());
    }

    #[test]
    fn report_json_shape() {
        let mut t = two_socket();
        t.cpus[1].l3 = None;
        t.cpus[1].core_type = CoreType::Efficiency;
        let json = serde_json::to_string(&t.report(&set("0"))).expect("json");
        let want = concat!(
            r#"{"online":"0-3","sockets":2,"numaNodes":2,"l3Groups":2,"smtWidth":2,"#,
            r#""isolated":"3","reserved":"0","cpus":["#,
            r#"{"id":0,"socket":0,"numa":0,"core":0,"l3":0,"coreType":"standard","siblings":"0,2"},"#,
            r#"{"id":1,"socket":1,"numa":1,"core":0,"l3":null,"coreType":"e-core","siblings":"1,3"},"#,
            r#"{"id":2,"socket":0,"numa":0,"core":0,"l3":0,"coreType":"standard","siblings":"0,2"},"#,
            r#"{"id":3,"socket":1,"numa":1,"core":0,"l3":0,"coreType":"standard","siblings":"1,3"}]}"#
        );
        assert_eq!(json, want);
        let back: TopologyReport = serde_json::from_str(&json).expect("parse back");
        assert_eq!(back, t.report(&set("0")));
    }

    proptest! {
        #[test]
        fn per_socket_and_per_numa_sets_partition_online(
            shape in proptest::collection::vec((0u32..4, 0u32..4), 1..64)
        ) {
            let cpus: Vec<CpuInfo> = shape
                .iter()
                .enumerate()
                .map(|(i, (socket, numa))| {
                    let id = i as u32;
                    info(id, *socket, *numa, id, None, &id.to_string())
                })
                .collect();
            let t = Topology { cpus, isolated: CpuSet::new() };
            let mut by_socket = CpuSet::new();
            for s in t.sockets() {
                let part = t.cpus_in_socket(s);
                prop_assert!(!part.is_empty() && by_socket.is_disjoint(&part));
                by_socket = by_socket.union(&part);
            }
            prop_assert_eq!(&by_socket, &t.online());
            let numa_total: usize = t.numa_nodes().iter().map(|n| t.cpus_in_numa(*n).len()).sum();
            prop_assert_eq!(numa_total, t.cpus.len());
            for c in &t.cpus {
                prop_assert_eq!(t.cpu(c.id), Some(c));
            }
        }
    }
}
