//! Choosing which CPUs a claim gets.
//!
//! The topology is turned once into a tree (machine → socket/NUMA → L3 →
//! core type → cluster → core → thread, `tree.rs`); each call counts, per
//! tree node, the free CPUs, the CPUs of wholly free cores and (spreading)
//! the cores with a free thread, then walks down the tree (`place.rs`).
//!
//! Packed (kubelet's `TakeByTopologyNUMAPacked` with uncore-cache alignment)
//! prefers, in this order:
//! 1. fewer sockets,
//! 2. fewer NUMA nodes,
//! 3. one L3 group that holds the whole request, looked for on every NUMA
//!    node that can hold it (not only inside the one with the fewest free
//!    CPUs), and otherwise as few L3 groups as possible,
//! 4. whole cores for the multiple-of-SMT-width part of the request, and the
//!    free thread of a partly used core before a whole core is split.
//!
//! Where a request fits in one group, the group that fits at the lowest price
//! is chosen, ties going to the one with the fewest free CPUs (best fit) and
//! then the lowest CPU id. Where it fits in none, the groups with the most
//! free CPUs are taken whole, so as few as possible are touched, and the rest
//! goes to the remaining group that holds it at the lowest price.
//!
//! Distribute-across-cores (kubelet's `distribute-cpus-across-cores`) makes
//! the same choice of sockets, NUMA nodes and L3 groups but takes one thread
//! per core before any second thread, so the claim's CPUs share no core with
//! each other while cores are left; a core whose other threads are already
//! in use goes first.
//!
//! A user running latency-critical work pays for every cache boundary and
//! every shared core, which is why whole cores come before single threads
//! and why nothing here is random: the same state gives the same CPUs.

use crate::cpuset::CpuSet;
use crate::topology::Topology;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How CPUs are chosen for a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Fewest sockets, NUMA nodes, L3 groups and cores; best fit.
    #[default]
    Packed,
    /// Like packed, but only whole physical cores: no SMT sibling is shared
    /// with another workload.
    FullPcpusOnly,
    /// Spread evenly, in core-sized chunks, over the fewest NUMA nodes that
    /// can hold the request.
    DistributeAcrossNuma,
    /// Like packed in sockets, NUMA nodes and L3 groups, but one thread per
    /// physical core before any core's second thread.
    DistributeAcrossCores,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Packed => "packed",
            Policy::FullPcpusOnly => "full-pcpus-only",
            Policy::DistributeAcrossNuma => "distribute-across-numa",
            Policy::DistributeAcrossCores => "distribute-across-cores",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An allocation policy name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CPU allocation policy {0:?}: expected packed, full-pcpus-only, distribute-across-numa or distribute-across-cores")]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "packed" => Ok(Policy::Packed),
            "full-pcpus-only" => Ok(Policy::FullPcpusOnly),
            "distribute-across-numa" => Ok(Policy::DistributeAcrossNuma),
            "distribute-across-cores" => Ok(Policy::DistributeAcrossCores),
            other => Err(UnknownPolicy(other.to_string())),
        }
    }
}

/// Why no CPUs were chosen. Nothing is partly allocated on error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("a request for 0 CPUs cannot be allocated")]
    ZeroCount,
    #[error("{requested} CPUs requested but only {free} are free")]
    NotEnoughCpus { requested: usize, free: usize },
    #[error(
        "policy full-pcpus-only: {requested} CPUs is not a multiple of the {width} hardware threads per core"
    )]
    NotCoreMultiple { requested: usize, width: usize },
    #[error(
        "policy full-pcpus-only: {requested} CPUs requested but only {whole_free} CPUs are in wholly free cores"
    )]
    NotEnoughWholeCores { requested: usize, whole_free: usize },
    #[error(
        "policy full-pcpus-only: no set of wholly free cores adds up to exactly {requested} CPUs"
    )]
    NoExactWholeCores { requested: usize },
    #[error("CPUs {cpus} are available but are not online CPUs of this node's topology")]
    UnknownCpus { cpus: CpuSet },
}

/// Allocate with a one-off [`Allocator`]. Callers that allocate repeatedly on
/// the same topology should keep an [`Allocator`].
pub fn allocate(
    topology: &Topology,
    available: &CpuSet,
    count: usize,
    policy: Policy,
) -> Result<CpuSet, AllocError> {
    Allocator::new(topology).allocate(available, count, policy)
}

/// Allocate inside `group` only (one NUMA node or socket in grouped mode).
pub fn allocate_in(
    topology: &Topology,
    available: &CpuSet,
    group: &CpuSet,
    count: usize,
    policy: Policy,
) -> Result<CpuSet, AllocError> {
    Allocator::new(topology).allocate_in(available, group, count, policy)
}

#[cfg(test)]
mod kubelet_cases;
mod place;
mod policies;
mod tree;

use place::Inside;
use tree::Node;

/// The topology tree, built once per topology.
#[derive(Debug, Clone)]
pub struct Allocator {
    nodes: Vec<Node>,
    children: Vec<u32>,
    threads: Vec<u32>,
    /// Core node indices in pre-order, so a subtree's cores are contiguous.
    cores: Vec<u32>,
    online: CpuSet,
    /// CPUs of each NUMA node, by ascending NUMA id.
    numa_nodes: Vec<(u32, CpuSet)>,
    /// Largest number of threads of one core.
    width: usize,
    /// Whether every core has `width` threads (false on hybrid parts).
    uniform_width: bool,
}

impl Allocator {
    /// Hardware threads per core (the largest, on hybrid parts).
    pub fn smt_width(&self) -> usize {
        self.width
    }

    /// Refuses CPUs this allocator's topology does not have online.
    fn check_online(&self, cpus: &CpuSet) -> Result<(), AllocError> {
        if cpus.is_subset(&self.online) {
            Ok(())
        } else {
            Err(AllocError::UnknownCpus {
                cpus: cpus.difference(&self.online),
            })
        }
    }

    /// Choose `count` CPUs out of `available`.
    pub fn allocate(
        &self,
        available: &CpuSet,
        count: usize,
        policy: Policy,
    ) -> Result<CpuSet, AllocError> {
        self.check_online(available)?;
        if count == 0 {
            return Err(AllocError::ZeroCount);
        }
        let free = available.len();
        if count > free {
            return Err(AllocError::NotEnoughCpus {
                requested: count,
                free,
            });
        }
        match policy {
            Policy::Packed => Ok(self.packed(available, count)),
            Policy::FullPcpusOnly => self.full_cores(available, count),
            Policy::DistributeAcrossNuma => Ok(self.distributed(available, count)),
            Policy::DistributeAcrossCores => {
                Ok(self.place(available, count, Inside::OneThreadPerCore))
            }
        }
    }

    /// Choose `count` CPUs out of `available ∩ group`.
    pub fn allocate_in(
        &self,
        available: &CpuSet,
        group: &CpuSet,
        count: usize,
        policy: Policy,
    ) -> Result<CpuSet, AllocError> {
        self.check_online(available)?;
        self.allocate(&available.intersection(group), count, policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::synthetic::{build, Shape, SiblingNumbering};
    use crate::topology::CpuInfo;
    use proptest::prelude::*;

    use crate::alloc::fixtures::*;
    #[test]
    fn policy_text_round_trips() {
        for (text, policy) in [
            ("packed", Policy::Packed),
            ("full-pcpus-only", Policy::FullPcpusOnly),
            ("distribute-across-numa", Policy::DistributeAcrossNuma),
            ("distribute-across-cores", Policy::DistributeAcrossCores),
        ] {
            assert_eq!(text.parse::<Policy>().unwrap(), policy);
            assert_eq!(policy.to_string(), text);
            assert_eq!(
                serde_json::to_string(&policy).unwrap(),
                format!("\"{text}\"")
            );
            assert_eq!(
                serde_json::from_str::<Policy>(&format!("\"{text}\"")).unwrap(),
                policy
            );
        }
        assert_eq!(Policy::default(), Policy::Packed);
        let err = "spread".parse::<Policy>().unwrap_err();
        assert!(err.to_string().contains("\"spread\""), "{err}");
    }

    #[test]
    fn errors_name_the_problem() {
        let t = small();
        assert_eq!(
            allocate(&t, &all(&t), 0, Policy::Packed),
            Err(AllocError::ZeroCount)
        );
        let err = allocate(&t, &cs("0-3"), 5, Policy::Packed).unwrap_err();
        assert_eq!(
            err,
            AllocError::NotEnoughCpus {
                requested: 5,
                free: 4
            }
        );
        assert_eq!(err.to_string(), "5 CPUs requested but only 4 are free");
        let err = allocate(&t, &cs("0-3,40-41"), 1, Policy::Packed).unwrap_err();
        assert_eq!(err, AllocError::UnknownCpus { cpus: cs("40-41") });
        assert!(err.to_string().contains("40-41"), "{err}");
    }

    #[test]
    fn allocate_in_stays_inside_the_group() {
        let t = small();
        let socket1: CpuSet = t
            .cpus
            .iter()
            .filter(|c| c.socket == 1)
            .map(|c| c.id)
            .collect();
        let got = allocate_in(&t, &all(&t), &socket1, 3, Policy::Packed).unwrap();
        assert_eq!(got, cs("8-9,24"));
        let err = allocate_in(&t, &all(&t), &socket1, 17, Policy::Packed).unwrap_err();
        assert_eq!(
            err,
            AllocError::NotEnoughCpus {
                requested: 17,
                free: 16
            }
        );
    }

    #[test]
    fn machine_without_l3_or_smt() {
        let mut t = build(&Shape {
            sockets: 1,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 8,
            threads_per_core: 1,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        for c in &mut t.cpus {
            c.l3 = None;
        }
        let got = allocate(&t, &cs("1-7"), 3, Policy::FullPcpusOnly).unwrap();
        assert_eq!(got, cs("1-3"));
    }

    fn arb_case() -> impl Strategy<Value = (Shape, Vec<bool>, usize, u8)> {
        (
            1u32..=2,
            1u32..=2,
            1u32..=2,
            1u32..=4,
            1u32..=2,
            any::<bool>(),
        )
            .prop_flat_map(|(s, n, l, c, th, split)| {
                let shape = Shape {
                    sockets: s,
                    numa_per_socket: n,
                    l3_per_numa: l,
                    cores_per_l3: c,
                    threads_per_core: th,
                    sibling_numbering: if split {
                        SiblingNumbering::Split
                    } else {
                        SiblingNumbering::Adjacent
                    },
                };
                let total = shape.cpus_total() as usize;
                (
                    Just(shape),
                    proptest::collection::vec(any::<bool>(), total),
                    1..=total,
                    0u8..4,
                )
            })
    }

    fn policy_of(p: u8) -> Policy {
        match p {
            0 => Policy::Packed,
            1 => Policy::FullPcpusOnly,
            2 => Policy::DistributeAcrossNuma,
            _ => Policy::DistributeAcrossCores,
        }
    }

    /// The simple baseline: sockets with the most free CPUs first (lowest id
    /// on ties), inside each the NUMA nodes with the most free CPUs first,
    /// CPUs in id order, until `count`.
    fn baseline_pick(t: &Topology, avail: &CpuSet, count: usize) -> CpuSet {
        let free_in = |f: &dyn Fn(&CpuInfo) -> bool| -> CpuSet {
            t.cpus
                .iter()
                .filter(|c| f(c) && avail.contains(c.id))
                .map(|c| c.id)
                .collect()
        };
        let mut sockets: Vec<u32> = t.cpus.iter().map(|c| c.socket).collect();
        sockets.sort_unstable();
        sockets.dedup();
        sockets.sort_by_key(|&s| std::cmp::Reverse(free_in(&|c| c.socket == s).len()));
        let mut out = Vec::new();
        for s in sockets {
            let mut numa: Vec<u32> = t
                .cpus
                .iter()
                .filter(|c| c.socket == s)
                .map(|c| c.numa)
                .collect();
            numa.sort_unstable();
            numa.dedup();
            numa.sort_by_key(|&n| {
                std::cmp::Reverse(free_in(&|c| c.socket == s && c.numa == n).len())
            });
            for n in numa {
                out.extend(free_in(&|c| c.socket == s && c.numa == n).iter());
            }
        }
        out.into_iter().take(count).collect()
    }

    fn spread_of(t: &Topology, cpus: &CpuSet) -> (usize, usize) {
        let mut sockets: Vec<u32> = t
            .cpus
            .iter()
            .filter(|c| cpus.contains(c.id))
            .map(|c| c.socket)
            .collect();
        let mut numa: Vec<u32> = t
            .cpus
            .iter()
            .filter(|c| cpus.contains(c.id))
            .map(|c| c.numa)
            .collect();
        sockets.sort_unstable();
        sockets.dedup();
        numa.sort_unstable();
        numa.dedup();
        (sockets.len(), numa.len())
    }

    proptest! {
        /// Any successful allocation is a subset of `available`, has exactly
        /// `count` CPUs, and is the same on a second call with a fresh
        /// allocator. Packed and distribute succeed whenever enough CPUs
        /// are free.
        #[test]
        fn result_is_exact_subset_and_deterministic((shape, mask, count, p) in arb_case()) {
            let t = build(&shape);
            let avail: CpuSet = t.cpus.iter().zip(&mask).filter(|(_, &m)| m).map(|(c, _)| c.id).collect();
            let policy = policy_of(p);
            let first = allocate(&t, &avail, count, policy);
            let second = Allocator::new(&t).allocate(&avail, count, policy);
            prop_assert_eq!(&first, &second);
            match first {
                Ok(got) => {
                    prop_assert!(got.is_subset(&avail));
                    prop_assert_eq!(got.len(), count);
                }
                Err(e) => {
                    if count > avail.len() {
                        prop_assert_eq!(e, AllocError::NotEnoughCpus { requested: count, free: avail.len() });
                    } else {
                        prop_assert_eq!(policy, Policy::FullPcpusOnly, "{} failed: {}", policy, e);
                    }
                }
            }
        }

        /// Packed and whole cores, checked from outside: write the request as
        /// `q * width + r`. Whole cores come after sockets, NUMA nodes and
        /// L3 groups, so: if the result lies in one L3 group whose free CPUs
        /// hold at least `q` wholly free cores, it contains at least `q`
        /// whole cores; and never is more than one wholly free core split
        /// (some of its threads taken, not all).
        #[test]
        fn packed_does_not_split_cores_needlessly((shape, mask, count, _p) in arb_case()) {
            let t = build(&shape);
            let avail: CpuSet = t.cpus.iter().zip(&mask).filter(|(_, &m)| m).map(|(c, _)| c.id).collect();
            prop_assume!(count <= avail.len());
            let got = allocate(&t, &avail, count, Policy::Packed).unwrap();
            let width = shape.threads_per_core as usize;
            let mut cores: Vec<CpuSet> = t.cpus.iter().map(|c| c.siblings.clone()).collect();
            cores.sort();
            cores.dedup();
            let mut groups: Vec<Option<u32>> = t.cpus.iter().filter(|c| got.contains(c.id)).map(|c| c.l3).collect();
            groups.dedup();
            if let [l3] = groups[..] {
                let in_group = |s: &CpuSet| s.iter().all(|id| t.cpu(id).is_some_and(|c| c.l3 == l3));
                let whole_free = cores.iter().filter(|s| in_group(s) && s.is_subset(&avail)).count();
                let whole_taken = cores.iter().filter(|s| s.is_subset(&got)).count();
                if whole_free >= count / width {
                    prop_assert!(whole_taken >= count / width, "{} whole cores taken, {} needed", whole_taken, count / width);
                }
            }
            let split = cores
                .iter()
                .filter(|s| s.is_subset(&avail) && !s.is_subset(&got) && !s.is_disjoint(&got))
                .count();
            prop_assert!(split <= 1, "{} wholly free cores split", split);
        }

        /// On random machines with offline and reserved CPUs and random
        /// occupancy, packed and distribute-across-cores always give exactly
        /// `count` free, online, unreserved CPUs, and never touch more
        /// sockets or NUMA nodes than the simple baseline: sockets with the
        /// most free CPUs first, inside each the NUMA nodes with the most
        /// free CPUs first, CPUs in id order.
        #[test]
        fn never_worse_than_the_baseline_and_always_valid(
            (shape, mask, count, p) in arb_case(),
            offline_seed in any::<u64>(),
            reserved_seed in any::<u64>(),
        ) {
            let full = build(&shape);
            let total = full.cpus.len() as u64;
            // Up to a quarter of the CPUs offline, never all of them; an
            // offline CPU is gone from its siblings' lists too, as in sysfs.
            let offline: CpuSet = (0..total.div_ceil(4))
                .map(|i| (offline_seed.rotate_left(i as u32 * 7) % total) as u32)
                .filter(|&id| id != 0 && offline_seed % 3 != 0)
                .collect();
            let mut t = full.clone();
            t.cpus.retain(|c| !offline.contains(c.id));
            for c in &mut t.cpus {
                c.siblings = c.siblings.difference(&offline);
            }
            let online = t.online();
            let reserved: CpuSet = online.iter().filter(|&id| (reserved_seed >> (id % 64)) & 1 == 1 && reserved_seed % 4 == 0).collect();
            let used: CpuSet = full.cpus.iter().zip(&mask).filter(|(_, &m)| !m).map(|(c, _)| c.id).collect();
            let avail = online.difference(&reserved).difference(&used);
            let policy = if p % 2 == 0 { Policy::Packed } else { Policy::DistributeAcrossCores };
            let got = allocate(&t, &avail, count, policy);
            if count > avail.len() {
                prop_assert_eq!(got, Err(AllocError::NotEnoughCpus { requested: count, free: avail.len() }));
                return Ok(());
            }
            let got = got.unwrap();
            prop_assert_eq!(got.len(), count);
            prop_assert!(got.is_subset(&avail));
            prop_assert!(got.is_subset(&online));
            prop_assert!(got.is_disjoint(&reserved));
            prop_assert!(got.is_disjoint(&used));
            let baseline = baseline_pick(&t, &avail, count);
            let (sockets, numa) = spread_of(&t, &got);
            let (base_sockets, base_numa) = spread_of(&t, &baseline);
            prop_assert!(sockets <= base_sockets, "{} sockets, baseline {}: {} vs {}", sockets, base_sockets, got, baseline);
            prop_assert!(numa <= base_numa, "{} NUMA nodes, baseline {}: {} vs {}", numa, base_numa, got, baseline);
        }

        /// Full-pcpus-only returns only whole cores.
        #[test]
        fn full_pcpus_only_returns_whole_cores((shape, mask, count, _p) in arb_case()) {
            let t = build(&shape);
            let avail: CpuSet = t.cpus.iter().zip(&mask).filter(|(_, &m)| m).map(|(c, _)| c.id).collect();
            if let Ok(got) = allocate(&t, &avail, count, Policy::FullPcpusOnly) {
                for c in &t.cpus {
                    if got.contains(c.id) {
                        prop_assert!(c.siblings.is_subset(&got));
                    }
                }
            }
        }
    }
}

/// Machines and CPU sets the unit tests of the allocator share.
#[cfg(test)]
mod fixtures {
    use crate::cpuset::CpuSet;
    use crate::topology::synthetic::{build, Shape, SiblingNumbering, MACHINE_1024};
    use crate::topology::Topology;

    pub(super) fn cs(list: &str) -> CpuSet {
        CpuSet::parse_cpulist(list).unwrap()
    }

    /// 2 sockets × 1 NUMA × 2 L3 × 4 cores × 2 threads, split numbering:
    /// 32 CPUs, core N has threads N and N+16; L3 k holds cores 4k..4k+3.
    pub(super) fn small() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 2,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    pub(super) fn big() -> Topology {
        build(&MACHINE_1024)
    }

    pub(super) fn all(t: &Topology) -> CpuSet {
        t.cpus.iter().map(|c| c.id).collect()
    }
}
