//! Choosing which CPUs a claim gets.
//!
//! The topology is turned once into a tree (machine → socket/NUMA → L3 →
//! core type → cluster → core → thread); each call counts, per tree node, the
//! free CPUs and the CPUs of wholly free cores, then walks down the tree.
//!
//! Packed (kubelet's `TakeByTopologyNUMAPacked` with uncore-cache alignment,
//! and the order it uses):
//! 1. Scope: descend to the smallest group that can hold the whole request
//!    with whole cores for its multiple-of-SMT-width part, choosing at each
//!    level the fitting group with the fewest free CPUs (best fit; ties go to
//!    the lowest CPU id). This is what keeps a request inside one socket, one
//!    NUMA node and one L3 whenever they can hold it.
//! 2. Whole cores: inside the scope, take `count / width * width` CPUs as
//!    whole free cores, again best fit per level; where no single child can
//!    hold the rest, the child with the most whole cores is taken whole, so
//!    whole sockets, NUMA nodes and L3 groups go first when the count covers
//!    them.
//! 3. Threads: the remainder comes from the core with the fewest free threads
//!    that still holds it, so a partly used core's free thread is used before
//!    a whole core is split.
//!
//! A user running latency-critical work pays for every cache boundary and
//! every shared core, which is why whole cores come before single threads
//! and why nothing here is random: the same state gives the same CPUs.

use crate::cpuset::CpuSet;
use crate::topology::{CpuInfo, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Packed => "packed",
            Policy::FullPcpusOnly => "full-pcpus-only",
            Policy::DistributeAcrossNuma => "distribute-across-numa",
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
#[error("unknown CPU allocation policy {0:?}: expected packed, full-pcpus-only or distribute-across-numa")]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "packed" => Ok(Policy::Packed),
            "full-pcpus-only" => Ok(Policy::FullPcpusOnly),
            "distribute-across-numa" => Ok(Policy::DistributeAcrossNuma),
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

const NO_PARENT: u32 = u32::MAX;

/// One group of the topology tree. Children are sorted by lowest CPU id,
/// which makes "first" the lowest-id tie-break everywhere.
#[derive(Debug, Clone)]
struct Node {
    parent: u32,
    /// Into `Allocator::children` for inner nodes, into `Allocator::threads`
    /// for cores.
    start: u32,
    end: u32,
    /// Range of this subtree's cores in `Allocator::cores` (pre-order).
    cores_start: u32,
    cores_end: u32,
    is_core: bool,
    /// Online CPUs in the subtree.
    size: u32,
}

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

/// Per-call counts, indexed like `Allocator::nodes`.
struct Counts {
    free: Vec<u32>,
    /// CPUs of wholly free cores.
    whole: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Metric {
    Whole,
    Free,
}

type LevelKey = fn(&CpuInfo) -> u64;

impl Allocator {
    pub fn new(topology: &Topology) -> Allocator {
        let numa_ids: std::collections::BTreeSet<u32> =
            topology.cpus.iter().map(|c| c.numa).collect();
        let socket_ids: std::collections::BTreeSet<u32> =
            topology.cpus.iter().map(|c| c.socket).collect();
        let socket_key: LevelKey = |c| u64::from(c.socket);
        let numa_key: LevelKey = |c| u64::from(c.numa);
        // The level with fewer groups is the coarser one: normally sockets
        // hold NUMA nodes, but a machine with NUMA off has one node over all
        // sockets.
        let (outer, inner) = if numa_ids.len() < socket_ids.len() {
            (numa_key, socket_key)
        } else {
            (socket_key, numa_key)
        };
        let levels: [LevelKey; 6] = [
            outer,
            inner,
            |c| c.l3.map_or(0, |l| u64::from(l) + 1),
            |c| c.core_type as u64,
            |c| u64::from(c.cluster),
            // A core is its sibling set; core_id alone repeats per socket.
            |c| u64::from(c.siblings.first().unwrap_or(c.id)),
        ];
        let mut alloc = Allocator {
            nodes: Vec::new(),
            children: Vec::new(),
            threads: Vec::new(),
            cores: Vec::new(),
            online: topology.cpus.iter().map(|c| c.id).collect(),
            numa_nodes: Vec::new(),
            width: 1,
            uniform_width: true,
        };
        let all: Vec<&CpuInfo> = topology.cpus.iter().collect();
        alloc.build(&all, &levels, NO_PARENT);
        let mut numa: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for c in &topology.cpus {
            numa.entry(c.numa).or_default().insert(c.id);
        }
        alloc.numa_nodes = numa.into_iter().collect();
        let widths: Vec<u32> = alloc
            .cores
            .iter()
            .map(|&n| alloc.nodes[n as usize].size)
            .collect();
        alloc.width = widths.iter().copied().max().unwrap_or(1).max(1) as usize;
        alloc.uniform_width = widths.iter().all(|&w| w as usize == alloc.width);
        alloc
    }

    /// Add the subtree for `cpus` (all sharing the keys of the levels above)
    /// and return its node index.
    fn build(&mut self, cpus: &[&CpuInfo], levels: &[LevelKey], parent: u32) -> u32 {
        let index = self.nodes.len() as u32;
        self.nodes.push(Node {
            parent,
            start: 0,
            end: 0,
            cores_start: self.cores.len() as u32,
            cores_end: 0,
            is_core: false,
            size: cpus.len() as u32,
        });
        // Skip levels that do not divide this group: fewer, more useful nodes.
        let mut rest = levels;
        let groups = loop {
            let Some((key, tail)) = rest.split_first() else {
                break None;
            };
            let mut by_key: BTreeMap<u64, Vec<&CpuInfo>> = BTreeMap::new();
            for c in cpus {
                by_key.entry(key(c)).or_default().push(c);
            }
            rest = tail;
            if by_key.len() > 1 || tail.is_empty() {
                let mut groups: Vec<Vec<&CpuInfo>> = by_key.into_values().collect();
                groups.sort_by_key(|g| g.iter().map(|c| c.id).min());
                break Some((groups, tail.is_empty()));
            }
        };
        match groups {
            // The last level (the core) produced the groups: they are cores.
            Some((groups, true)) => {
                let mut kids = Vec::with_capacity(groups.len());
                for group in groups {
                    kids.push(self.push_core(&group, index));
                }
                self.set_children(index, kids);
            }
            Some((groups, false)) => {
                let mut kids = Vec::with_capacity(groups.len());
                for group in groups {
                    kids.push(self.build(&group, rest, index));
                }
                self.set_children(index, kids);
            }
            None => {
                // No levels at all: treat the group as a single core.
                let core = self.push_core(cpus, index);
                self.set_children(index, vec![core]);
            }
        }
        self.nodes[index as usize].cores_end = self.cores.len() as u32;
        index
    }

    fn push_core(&mut self, cpus: &[&CpuInfo], parent: u32) -> u32 {
        let index = self.nodes.len() as u32;
        let mut ids: Vec<u32> = cpus.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        let start = self.threads.len() as u32;
        self.threads.extend_from_slice(&ids);
        self.nodes.push(Node {
            parent,
            start,
            end: self.threads.len() as u32,
            cores_start: self.cores.len() as u32,
            cores_end: self.cores.len() as u32 + 1,
            is_core: true,
            size: ids.len() as u32,
        });
        self.cores.push(index);
        index
    }

    fn set_children(&mut self, index: u32, kids: Vec<u32>) {
        let start = self.children.len() as u32;
        self.children.extend_from_slice(&kids);
        let node = &mut self.nodes[index as usize];
        node.start = start;
        node.end = self.children.len() as u32;
    }

    /// Hardware threads per core (the largest, on hybrid parts).
    pub fn smt_width(&self) -> usize {
        self.width
    }

    /// Choose `count` CPUs out of `available`.
    pub fn allocate(
        &self,
        available: &CpuSet,
        count: usize,
        policy: Policy,
    ) -> Result<CpuSet, AllocError> {
        if !available.is_subset(&self.online) {
            return Err(AllocError::UnknownCpus {
                cpus: available.difference(&self.online),
            });
        }
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
        if !available.is_subset(&self.online) {
            return Err(AllocError::UnknownCpus {
                cpus: available.difference(&self.online),
            });
        }
        self.allocate(&available.intersection(group), count, policy)
    }

    fn counts(&self, available: &CpuSet) -> Counts {
        let mut free = vec![0u32; self.nodes.len()];
        let mut whole = vec![0u32; self.nodes.len()];
        for &core in &self.cores {
            let node = &self.nodes[core as usize];
            let threads = &self.threads[node.start as usize..node.end as usize];
            let f = threads.iter().filter(|&&t| available.contains(t)).count() as u32;
            free[core as usize] = f;
            if f == node.size {
                whole[core as usize] = f;
            }
        }
        // Parents precede children in `nodes` (pre-order), so one backwards
        // pass sums every subtree.
        for i in (0..self.nodes.len()).rev() {
            let parent = self.nodes[i].parent;
            if parent != NO_PARENT {
                free[parent as usize] += free[i];
                whole[parent as usize] += whole[i];
            }
        }
        Counts { free, whole }
    }

    fn kids(&self, node: u32) -> &[u32] {
        let n = &self.nodes[node as usize];
        &self.children[n.start as usize..n.end as usize]
    }

    /// Take `k` free threads (lowest ids) of `core`, updating the counts of
    /// its ancestors.
    fn take_threads(
        &self,
        core: u32,
        k: u32,
        available: &CpuSet,
        counts: &mut Counts,
        out: &mut Vec<u32>,
    ) {
        let node = &self.nodes[core as usize];
        let was_whole = counts.whole[core as usize];
        let mut taken = 0u32;
        for &t in &self.threads[node.start as usize..node.end as usize] {
            if taken == k {
                break;
            }
            if available.contains(t) {
                out.push(t);
                taken += 1;
            }
        }
        // A touched core is no longer wholly free.
        let mut i = core;
        while i != NO_PARENT {
            counts.free[i as usize] -= taken;
            counts.whole[i as usize] -= was_whole;
            i = self.nodes[i as usize].parent;
        }
    }

    /// Take everything `metric` counts in the subtree of `node`: its wholly
    /// free cores, or all its free threads.
    fn take_all(
        &self,
        node: u32,
        metric: Metric,
        available: &CpuSet,
        counts: &mut Counts,
        out: &mut Vec<u32>,
    ) {
        let n = &self.nodes[node as usize];
        for &core in &self.cores[n.cores_start as usize..n.cores_end as usize] {
            let c = core as usize;
            let take = match metric {
                Metric::Whole => counts.whole[c],
                Metric::Free => counts.free[c],
            };
            if take > 0 {
                self.take_threads(core, take, available, counts, out);
            }
        }
    }

    /// Take `need` CPUs counted by `metric` from the subtree of `scope`,
    /// best fit per level. Returns how many could not be taken (non-zero only
    /// when the subtree has too few).
    fn fill(
        &self,
        scope: u32,
        mut need: u32,
        metric: Metric,
        available: &CpuSet,
        counts: &mut Counts,
        out: &mut Vec<u32>,
    ) -> u32 {
        let value = |counts: &Counts, i: u32| match metric {
            Metric::Whole => counts.whole[i as usize],
            Metric::Free => counts.free[i as usize],
        };
        let mut node = scope;
        while need > 0 {
            let n = &self.nodes[node as usize];
            if n.is_core {
                let have = value(counts, node);
                if have == 0 || (metric == Metric::Whole && have > need) {
                    return need;
                }
                let take = have.min(need);
                self.take_threads(node, take, available, counts, out);
                need -= take;
                return need;
            }
            let kids = self.kids(node);
            // Whole cores only go where they fit entirely.
            let usable = |counts: &Counts, k: u32| {
                metric == Metric::Free
                    || !self.nodes[k as usize].is_core
                    || counts.whole[k as usize] <= need
            };
            let best_fit = kids
                .iter()
                .copied()
                .filter(|&k| value(counts, k) >= need && usable(counts, k))
                .min_by_key(|&k| value(counts, k));
            if let Some(k) = best_fit {
                node = k;
                continue;
            }
            // Nothing holds the rest: take the largest child whole and go on.
            let largest = kids
                .iter()
                .copied()
                .filter(|&k| value(counts, k) > 0 && usable(counts, k))
                .fold(None::<u32>, |best, k| match best {
                    Some(b) if value(counts, b) >= value(counts, k) => Some(b),
                    _ => Some(k),
                });
            let Some(k) = largest else {
                return need;
            };
            let before = out.len();
            self.take_all(k, metric, available, counts, out);
            need = need.saturating_sub((out.len() - before) as u32);
        }
        0
    }

    /// The smallest group that holds `need` CPUs with `whole_need` of them in
    /// whole cores, best fit per level; the root when none does.
    fn scope(&self, need: u32, whole_need: u32, counts: &Counts) -> u32 {
        let fits =
            |i: u32| counts.free[i as usize] >= need && counts.whole[i as usize] >= whole_need;
        let mut node = 0u32;
        if !fits(node) {
            return node;
        }
        loop {
            let best = self
                .kids(node)
                .iter()
                .copied()
                .filter(|&k| !self.nodes[k as usize].is_core && fits(k))
                .min_by_key(|&k| counts.free[k as usize]);
            match best {
                Some(k) => node = k,
                None => return node,
            }
        }
    }

    fn packed(&self, available: &CpuSet, count: usize) -> CpuSet {
        if self.nodes.is_empty() {
            return CpuSet::new();
        }
        let mut counts = self.counts(available);
        let need = count as u32;
        let whole_need = need / self.width as u32 * self.width as u32;
        let scope = self.scope(need, whole_need, &counts);
        let mut out = Vec::with_capacity(count);
        let missing_whole = self.fill(
            scope,
            whole_need,
            Metric::Whole,
            available,
            &mut counts,
            &mut out,
        );
        let rest = need - whole_need + missing_whole;
        let missing = self.fill(scope, rest, Metric::Free, available, &mut counts, &mut out);
        if missing > 0 {
            // The scope is the root whenever the request is not held whole by
            // a group, and the root holds every available CPU, so this only
            // tops up from the whole machine if a smaller scope fell short.
            self.fill(0, missing, Metric::Free, available, &mut counts, &mut out);
        }
        out.into_iter().collect()
    }

    fn whole_core_cpus(&self, available: &CpuSet) -> CpuSet {
        let mut set = CpuSet::new();
        for &core in &self.cores {
            let n = &self.nodes[core as usize];
            let threads = &self.threads[n.start as usize..n.end as usize];
            if threads.iter().all(|&t| available.contains(t)) {
                set.extend(threads.iter().copied());
            }
        }
        set
    }

    fn full_cores(&self, available: &CpuSet, count: usize) -> Result<CpuSet, AllocError> {
        if self.uniform_width && !count.is_multiple_of(self.width) {
            return Err(AllocError::NotCoreMultiple {
                requested: count,
                width: self.width,
            });
        }
        let whole = self.whole_core_cpus(available);
        if count > whole.len() {
            return Err(AllocError::NotEnoughWholeCores {
                requested: count,
                whole_free: whole.len(),
            });
        }
        // With only whole cores available and a multiple of the width asked
        // for, packed never splits a core; on hybrid parts check it.
        let chosen = self.packed(&whole, count);
        if self.whole_core_cpus(&chosen).len() != count {
            return Err(AllocError::NoExactWholeCores { requested: count });
        }
        Ok(chosen)
    }

    fn distributed(&self, available: &CpuSet, count: usize) -> CpuSet {
        let width = self.width;
        let mut nodes: Vec<(usize, CpuSet)> = self
            .numa_nodes
            .iter()
            .map(|(_, cpus)| {
                let free = available.intersection(cpus);
                (free.len(), free)
            })
            .filter(|(n, _)| *n > 0)
            .collect();
        // Most free first (stable: lowest NUMA id on ties) so the spread
        // leaves the nodes as balanced as possible.
        nodes.sort_by_key(|n| std::cmp::Reverse(n.0));
        let chunks = count / width;
        let remainder = count % width;
        for k in 1..=nodes.len() {
            if chunks < k && k > 1 {
                break;
            }
            let mut shares: Vec<usize> = (0..k)
                .map(|i| (chunks / k + usize::from(i < chunks % k)) * width)
                .collect();
            shares[0] += remainder;
            if shares
                .iter()
                .zip(&nodes)
                .all(|(share, (free, _))| share <= free)
            {
                let mut result = CpuSet::new();
                for (share, (_, free)) in shares.iter().zip(&nodes) {
                    result = result.union(&self.packed(free, *share));
                }
                return result;
            }
        }
        // No even spread fits (the free CPUs are too lopsided): pack instead
        // of failing, since the CPUs exist.
        self.packed(available, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::synthetic::{build, Shape, SiblingNumbering};
    use proptest::prelude::*;

    fn cs(list: &str) -> CpuSet {
        CpuSet::parse_cpulist(list).unwrap()
    }

    /// 2 sockets × 1 NUMA × 2 L3 × 4 cores × 2 threads, split numbering:
    /// 32 CPUs, core N has threads N and N+16; L3 k holds cores 4k..4k+3.
    fn small() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 2,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    fn big() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 2,
            l3_per_numa: 4,
            cores_per_l3: 32,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    fn all(t: &Topology) -> CpuSet {
        t.cpus.iter().map(|c| c.id).collect()
    }

    #[test]
    fn policy_text_round_trips() {
        for (text, policy) in [
            ("packed", Policy::Packed),
            ("full-pcpus-only", Policy::FullPcpusOnly),
            ("distribute-across-numa", Policy::DistributeAcrossNuma),
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

    /// Table of packed picks on the small machine.
    #[test]
    fn packed_table() {
        let t = small();
        let cases: &[(&str, &str, usize, &str)] = &[
            // (what, available, count, expected)
            (
                "whole socket (NUMA node) when count equals its size",
                "0-31",
                16,
                "0-7,16-23",
            ),
            (
                "whole NUMA node of the fuller socket is not possible, the free one is taken",
                "1-31",
                16,
                "8-15,24-31",
            ),
            ("one L3 holds 8: whole L3", "0-31", 8, "0-3,16-19"),
            (
                "whole cores before threads: 4 CPUs are 2 whole cores",
                "0-31",
                4,
                "0-1,16-17",
            ),
            (
                "odd count: the free thread of a partly used core goes first",
                "0-15,17-31",
                3,
                "0-1,17",
            ),
            (
                "single CPU: partly used core's thread",
                "0-15,17-31",
                1,
                "0",
            ),
            (
                "best fit: the L3 with fewer free CPUs that still fits, not the lowest id",
                "0-3,6-31",
                4,
                "6-7,22-23",
            ),
            (
                "best fit socket: the fuller socket is used, the emptier stays whole",
                "0-7,9-31",
                2,
                "9,25",
            ),
        ];
        for (what, avail, count, expected) in cases {
            let got = allocate(&t, &cs(avail), *count, Policy::Packed).unwrap();
            assert_eq!(
                got,
                cs(expected),
                "{what}: available {avail}, count {count}"
            );
        }
    }

    #[test]
    fn packed_takes_whole_numa_on_big_machine() {
        let t = big();
        // NUMA 0 has 1 CPU used; NUMA 1 is whole and must be taken whole.
        let mut avail = all(&t);
        avail.remove(0);
        let got = allocate(&t, &avail, 256, Policy::Packed).unwrap();
        let numa1: CpuSet = t
            .cpus
            .iter()
            .filter(|c| c.numa == 1)
            .map(|c| c.id)
            .collect();
        assert_eq!(got, numa1);
    }

    #[test]
    fn packed_spans_l3_groups_with_whole_ones_first() {
        let t = small();
        // 12 CPUs: one whole L3 (8) plus 2 whole cores of the next L3 in the same socket.
        let got = allocate(&t, &all(&t), 12, Policy::Packed).unwrap();
        assert_eq!(got, cs("0-5,16-21"));
    }

    #[test]
    fn full_pcpus_only_table() {
        let t = small();
        let ok = allocate(&t, &cs("0-15,17-31"), 4, Policy::FullPcpusOnly).unwrap();
        assert_eq!(
            ok,
            cs("1-2,17-18"),
            "core 0 (0,16) is partly used and skipped"
        );
        assert_eq!(
            allocate(&t, &all(&t), 3, Policy::FullPcpusOnly),
            Err(AllocError::NotCoreMultiple {
                requested: 3,
                width: 2
            })
        );
        // Cores 0-7 (threads N, N+16) have their second thread used: 24 CPUs
        // free, but only cores 8-15 (16 CPUs) are whole.
        let avail = cs("0-15,24-31");
        let err = allocate(&t, &avail, 18, Policy::FullPcpusOnly).unwrap_err();
        assert_eq!(
            err,
            AllocError::NotEnoughWholeCores {
                requested: 18,
                whole_free: 16
            }
        );
        assert!(
            err.to_string()
                .contains("only 16 CPUs are in wholly free cores"),
            "{err}"
        );
    }

    #[test]
    fn distribute_spreads_evenly_over_numa_nodes() {
        // 2 NUMA nodes of 6 CPUs: 8 does not fit one, so 4 + 4.
        let t = build(&Shape {
            sockets: 1,
            numa_per_socket: 2,
            l3_per_numa: 1,
            cores_per_l3: 3,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        let got = allocate(&t, &all(&t), 8, Policy::DistributeAcrossNuma).unwrap();
        assert_eq!(got.len(), 8);
        let in_numa = |n: u32| {
            t.cpus
                .iter()
                .filter(|c| c.numa == n && got.contains(c.id))
                .count()
        };
        assert_eq!((in_numa(0), in_numa(1)), (4, 4));
        assert_eq!(got, cs("0-3,6-9"));
        // 4 fits one node: the fewest nodes win.
        let one = allocate(&t, &all(&t), 4, Policy::DistributeAcrossNuma).unwrap();
        assert_eq!(one, cs("0-3"));
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
                    0u8..3,
                )
            })
    }

    fn policy_of(p: u8) -> Policy {
        match p {
            0 => Policy::Packed,
            1 => Policy::FullPcpusOnly,
            _ => Policy::DistributeAcrossNuma,
        }
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
        /// `q * width + r`. If `available` holds at least `q` wholly free
        /// cores, the result contains at least `q` whole cores, and at most
        /// one core that was wholly free is split (some of its threads taken,
        /// not all).
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
            let whole_free = cores.iter().filter(|s| s.is_subset(&avail)).count();
            let whole_taken = cores.iter().filter(|s| s.is_subset(&got)).count();
            let split = cores
                .iter()
                .filter(|s| s.is_subset(&avail) && !s.is_subset(&got) && !s.is_disjoint(&got))
                .count();
            if whole_free >= count / width {
                prop_assert!(whole_taken >= count / width, "{} whole cores taken, {} needed", whole_taken, count / width);
            }
            prop_assert!(split <= 1, "{} wholly free cores split", split);
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
