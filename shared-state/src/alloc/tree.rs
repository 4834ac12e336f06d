//! The topology tree the allocator walks, and the per-call counts on it.

use super::Allocator;
use crate::cpuset::CpuSet;
use crate::topology::{CpuInfo, Topology};
use std::collections::BTreeMap;

pub(super) const NO_PARENT: u32 = u32::MAX;

/// One group of the topology tree. Children are sorted by lowest CPU id,
/// which makes "first" the lowest-id tie-break everywhere.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) parent: u32,
    /// Into `Allocator::children` for inner nodes, into `Allocator::threads`
    /// for cores.
    pub(super) start: u32,
    pub(super) end: u32,
    /// Range of this subtree's cores in `Allocator::cores` (pre-order).
    pub(super) cores_start: u32,
    pub(super) cores_end: u32,
    pub(super) is_core: bool,
    /// Online CPUs in the subtree.
    pub(super) size: u32,
    /// How many sockets, NUMA nodes and L3 groups the subtree's online CPUs
    /// are in. An L3 group is counted per socket and NUMA node, and a NUMA
    /// node without L3 counts as one group, so `l3 == 1` means "inside one
    /// socket, one NUMA node and one L3".
    pub(super) spans: Spans,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Spans {
    pub(super) sockets: u32,
    pub(super) numa: u32,
    pub(super) l3: u32,
}

/// Per-call counts, indexed like `Allocator::nodes`.
pub(super) struct Counts {
    pub(super) free: Vec<u32>,
    /// CPUs of wholly free cores.
    pub(super) whole: Vec<u32>,
    /// Cores with at least one free thread not yet taken by the current
    /// one-thread-per-core pass; empty unless asked for (spreading), as
    /// packing never reads it.
    pub(super) open: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Metric {
    /// CPUs of wholly free cores.
    Whole,
    /// Free CPUs.
    Free,
    /// One free thread per core.
    Spread,
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
            spans: spans_of(cpus),
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
            spans: spans_of(cpus),
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

    pub(super) fn counts(&self, available: &CpuSet, with_open: bool) -> Counts {
        let n = self.nodes.len();
        let mut free = vec![0u32; n];
        let mut whole = vec![0u32; n];
        let mut open = if with_open { vec![0u32; n] } else { Vec::new() };
        for &core in &self.cores {
            let node = &self.nodes[core as usize];
            let threads = &self.threads[node.start as usize..node.end as usize];
            let f = threads.iter().filter(|&&t| available.contains(t)).count() as u32;
            free[core as usize] = f;
            if with_open {
                open[core as usize] = u32::from(f > 0);
            }
            if f == node.size {
                whole[core as usize] = f;
            }
        }
        // Parents precede children in `nodes` (pre-order), so one backwards
        // pass sums every subtree.
        for i in (0..n).rev() {
            let parent = self.nodes[i].parent;
            if parent != NO_PARENT {
                let p = parent as usize;
                free[p] += free[i];
                whole[p] += whole[i];
            }
        }
        if with_open {
            for i in (1..n).rev() {
                let parent = self.nodes[i].parent as usize;
                open[parent] += open[i];
            }
        }
        Counts { free, whole, open }
    }

    /// Sockets, NUMA nodes and L3 groups of `node`'s subtree holding a free
    /// CPU. Only asked of the few nodes above the L3 level, so it is
    /// counted on demand rather than for every node of every call.
    pub(super) fn occupied(&self, node: u32, counts: &Counts) -> Spans {
        let n = &self.nodes[node as usize];
        let has_free = u32::from(counts.free[node as usize] > 0);
        if n.is_core || n.spans.l3 <= 1 {
            return Spans {
                sockets: has_free,
                numa: has_free,
                l3: has_free,
            };
        }
        let mut occ = Spans::default();
        if has_free == 0 {
            return occ;
        }
        for &kid in self.kids(node) {
            let k = self.occupied(kid, counts);
            occ.sockets += k.sockets;
            occ.numa += k.numa;
            occ.l3 += k.l3;
        }
        // A socket or NUMA node counts once however many children hold its
        // free CPUs.
        if n.spans.sockets == 1 {
            occ.sockets = has_free;
        }
        if n.spans.numa == 1 {
            occ.numa = has_free;
        }
        occ
    }

    pub(super) fn kids(&self, node: u32) -> &[u32] {
        let n = &self.nodes[node as usize];
        &self.children[n.start as usize..n.end as usize]
    }

    /// Take `k` free threads (lowest ids) of `core`, updating the counts of
    /// its ancestors.
    pub(super) fn take_threads(
        &self,
        core: u32,
        k: u32,
        available: &CpuSet,
        counts: &mut Counts,
        out: &mut Vec<u32>,
    ) {
        let node = &self.nodes[core as usize];
        let was_whole = counts.whole[core as usize];
        let was_open = counts.open.get(core as usize).copied().unwrap_or(0);
        let threads = &self.threads[node.start as usize..node.end as usize];
        // Threads are taken lowest id first, so the ones an earlier pass of
        // this call took from this core are the first available ones.
        let available_here = threads.iter().filter(|&&t| available.contains(t)).count() as u32;
        let mut skip = available_here - counts.free[core as usize];
        let mut taken = 0u32;
        for &t in threads {
            if taken == k {
                break;
            }
            if available.contains(t) {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                out.push(t);
                taken += 1;
            }
        }
        // A touched core is no longer wholly free, and a one-thread-per-core
        // pass does not come back to it.
        let mut i = core;
        while i != NO_PARENT {
            counts.free[i as usize] -= taken;
            counts.whole[i as usize] -= was_whole;
            if was_open > 0 {
                counts.open[i as usize] -= was_open;
            }
            i = self.nodes[i as usize].parent;
        }
    }

    /// Take everything `metric` counts in the subtree of `node`: its wholly
    /// free cores, all its free threads, or one free thread of each core.
    pub(super) fn take_all(
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
                Metric::Spread => counts.open[c],
            };
            if take > 0 {
                self.take_threads(core, take, available, counts, out);
            }
        }
    }

    /// Take `need` CPUs counted by `metric` from the subtree of `scope`,
    /// best fit per level. Returns how many could not be taken (non-zero only
    /// when the subtree has too few).
    pub(super) fn fill(
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
            Metric::Spread => counts.open[i as usize],
        };
        // The value in the high half; spreading one thread per core, the
        // low half makes a core whose other threads are already in use come
        // first among equals: it costs no one a whole core.
        let fewest_first = |counts: &Counts, i: u32| -> u64 {
            let low = match metric {
                Metric::Spread => counts.free[i as usize],
                Metric::Whole | Metric::Free => 0,
            };
            u64::from(value(counts, i)) << 32 | u64::from(low)
        };
        let most_first = |counts: &Counts, i: u32| -> u64 {
            let low = match metric {
                Metric::Spread => u32::MAX - counts.free[i as usize],
                Metric::Whole | Metric::Free => 0,
            };
            u64::from(value(counts, i)) << 32 | u64::from(low)
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
                metric != Metric::Whole
                    || !self.nodes[k as usize].is_core
                    || counts.whole[k as usize] <= need
            };
            let best_fit = kids
                .iter()
                .copied()
                .filter(|&k| value(counts, k) >= need && usable(counts, k))
                .min_by_key(|&k| fewest_first(counts, k));
            if let Some(k) = best_fit {
                node = k;
                continue;
            }
            // Nothing holds the rest: take the largest child whole and go on
            // (the first of equals).
            let mut largest: Option<(u32, u64)> = None;
            for &k in kids {
                if value(counts, k) == 0 || !usable(counts, k) {
                    continue;
                }
                let key = most_first(counts, k);
                if largest.is_none_or(|(_, best)| key > best) {
                    largest = Some((k, key));
                }
            }
            let largest = largest.map(|(k, _)| k);
            let Some(k) = largest else {
                return need;
            };
            let before = out.len();
            self.take_all(k, metric, available, counts, out);
            need = need.saturating_sub((out.len() - before) as u32);
        }
        0
    }
}

/// Sockets, NUMA nodes and L3 groups `cpus` are in.
fn spans_of(cpus: &[&CpuInfo]) -> Spans {
    Spans {
        sockets: distinct(cpus, |c| (c.socket, 0, None)),
        numa: distinct(cpus, |c| (0, c.numa, None)),
        l3: distinct(cpus, |c| (c.socket, c.numa, c.l3)),
    }
}

/// How many distinct `key`s `cpus` have. A node holds few groups and its
/// CPUs come in runs of the same group, so a short list with a check of the
/// previous key beats sorting.
fn distinct(cpus: &[&CpuInfo], key: fn(&CpuInfo) -> (u32, u32, Option<u32>)) -> u32 {
    // Most tree nodes lie inside one group: answer those without allocating.
    let first = cpus.first().map(|c| key(c));
    if cpus.iter().all(|c| Some(key(c)) == first) {
        return u32::from(first.is_some());
    }
    let mut seen: Vec<(u32, u32, Option<u32>)> = Vec::new();
    let mut last = None;
    for c in cpus {
        let k = key(c);
        if last == Some(k) {
            continue;
        }
        last = Some(k);
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    seen.len() as u32
}
