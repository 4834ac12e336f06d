//! Where a request goes: which sockets, NUMA nodes and L3 groups, then which
//! cores and threads inside them.
//!
//! The order of preference is fewer sockets, then fewer NUMA nodes, then one
//! L3 group holding the whole request, then whole cores (or, spreading, one
//! thread per core). Each is weighed across the whole machine: an L3 group
//! that holds the request on any NUMA node that fits is found, not only one
//! inside the NUMA node with the fewest free CPUs.
//!
//! `plan` prices a choice as the number of sockets, NUMA nodes and L3 groups
//! it touches and whether its last group is short of whole cores;
//! `execute` makes the same choices and takes the CPUs. Above the L3 level
//! the tree is small (sockets, NUMA nodes and L3 groups only), so pricing
//! every fitting branch costs little; inside one L3 group the fill is the
//! best-fit walk of `tree.rs`.

use super::tree::{Counts, Metric};
use super::Allocator;
use crate::cpuset::CpuSet;

/// How the CPUs inside one L3 group are picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Inside {
    /// Whole cores first, then the threads of partly used cores.
    WholeCores,
    /// One thread per core first, then second threads.
    OneThreadPerCore,
}

/// The price of a placement, compared in field order (lower is better).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    sockets: u32,
    numa: u32,
    l3: u32,
    /// The group the last part lands in has too few whole cores (or, when
    /// spreading, too few cores) for it.
    short: bool,
}

impl Allocator {
    /// Choose `count` CPUs out of `available`; `available` holds at least
    /// `count` online CPUs.
    pub(super) fn place(&self, available: &CpuSet, count: usize, inside: Inside) -> CpuSet {
        if self.nodes.is_empty() || count == 0 {
            return CpuSet::new();
        }
        let mut counts = self.counts(available, inside == Inside::OneThreadPerCore);
        let mut out = Vec::with_capacity(count);
        self.execute(0, count as u32, inside, available, &mut counts, &mut out);
        out.into_iter().collect()
    }

    /// A node inside one socket, one NUMA node and one L3 group: the cores
    /// and threads are chosen by `fill_group`.
    fn is_group(&self, node: u32) -> bool {
        let n = &self.nodes[node as usize];
        n.is_core || n.spans.l3 <= 1
    }

    fn short(&self, node: u32, need: u32, inside: Inside, counts: &Counts) -> bool {
        let i = node as usize;
        match inside {
            Inside::WholeCores => counts.whole[i] < self.whole_part(need),
            Inside::OneThreadPerCore => counts.open[i] < need,
        }
    }

    /// The part of `need` that whole cores can hold.
    fn whole_part(&self, need: u32) -> u32 {
        let width = self.width as u32;
        need / width * width
    }

    /// The price of placing `need` CPUs inside `node` (which has that many
    /// free).
    fn plan(&self, node: u32, need: u32, inside: Inside, counts: &Counts) -> Cost {
        if self.is_group(node) {
            return Cost {
                sockets: 1,
                numa: 1,
                l3: 1,
                short: self.short(node, need, inside, counts),
            };
        }
        if let Some((_, cost)) = self.best_child(self.kids(node), need, inside, counts) {
            return cost;
        }
        let (whole_kids, rest, rest_need) = self.split(node, need, inside, counts);
        let spans = self.nodes[node as usize].spans;
        let mut cost = match rest {
            Some(kid) => self.plan(kid, rest_need, inside, counts),
            None => Cost {
                sockets: 0,
                numa: 0,
                l3: 0,
                short: false,
            },
        };
        for kid in whole_kids {
            let occ = self.occupied(kid, counts);
            cost.sockets += occ.sockets;
            cost.numa += occ.numa;
            cost.l3 += occ.l3;
        }
        // Inside one socket (or NUMA node) the parts share it.
        if spans.sockets == 1 {
            cost.sockets = 1;
        }
        if spans.numa == 1 {
            cost.numa = 1;
        }
        cost
    }

    /// The child among `kids` that holds `need` at the lowest price; ties go
    /// to the one with the fewest free CPUs (best fit), then the lowest CPU
    /// id.
    fn best_child(
        &self,
        kids: &[u32],
        need: u32,
        inside: Inside,
        counts: &Counts,
    ) -> Option<(u32, Cost)> {
        let mut best: Option<(u32, Cost)> = None;
        for &kid in kids {
            let free = counts.free[kid as usize];
            if free < need {
                continue;
            }
            let cost = self.plan(kid, need, inside, counts);
            let better = match best {
                None => true,
                Some((b, bc)) => (cost, free) < (bc, counts.free[b as usize]),
            };
            if better {
                best = Some((kid, cost));
            }
        }
        best
    }

    /// No child of `node` holds `need`: the children taken whole (most free
    /// CPUs first, so as few as possible) and the child that gets the rest,
    /// with how many it gets.
    fn split(
        &self,
        node: u32,
        need: u32,
        inside: Inside,
        counts: &Counts,
    ) -> (Vec<u32>, Option<u32>, u32) {
        let mut kids: Vec<u32> = self
            .kids(node)
            .iter()
            .copied()
            .filter(|&k| counts.free[k as usize] > 0)
            .collect();
        // Stable: equal children stay in lowest-CPU order.
        kids.sort_by_key(|&k| std::cmp::Reverse(counts.free[k as usize]));
        let mut left = need;
        let mut whole = Vec::new();
        let mut i = 0;
        while i < kids.len() && left > counts.free[kids[i] as usize] {
            left -= counts.free[kids[i] as usize];
            whole.push(kids[i]);
            i += 1;
        }
        if i == kids.len() {
            return (whole, None, 0);
        }
        // The rest fits in one of the children not taken whole; which one is
        // priced like any other choice.
        let rest = self
            .best_child(&kids[i..], left, inside, counts)
            .map(|(k, _)| k);
        (whole, rest, left)
    }

    fn execute(
        &self,
        node: u32,
        need: u32,
        inside: Inside,
        available: &CpuSet,
        counts: &mut Counts,
        out: &mut Vec<u32>,
    ) {
        if need == 0 {
            return;
        }
        if self.is_group(node) {
            self.fill_group(node, need, inside, available, counts, out);
            return;
        }
        if let Some((kid, _)) = self.best_child(self.kids(node), need, inside, counts) {
            self.execute(kid, need, inside, available, counts, out);
            return;
        }
        let (whole_kids, rest, rest_need) = self.split(node, need, inside, counts);
        for kid in whole_kids {
            self.take_all(kid, Metric::Free, available, counts, out);
        }
        if let Some(kid) = rest {
            self.execute(kid, rest_need, inside, available, counts, out);
        }
    }

    /// Inside one L3 group: the smallest sub-group (core type, cluster) that
    /// holds the request with whole cores (or one thread per core), best fit;
    /// then whole cores (or single threads of distinct cores), then the
    /// remaining threads, from the sub-group and then the rest of the group.
    fn fill_group(
        &self,
        group: u32,
        need: u32,
        inside: Inside,
        available: &CpuSet,
        counts: &mut Counts,
        out: &mut Vec<u32>,
    ) {
        let (first, first_need) = match inside {
            Inside::WholeCores => (Metric::Whole, self.whole_part(need)),
            Inside::OneThreadPerCore => (Metric::Spread, need),
        };
        let fits = |counts: &Counts, i: u32| {
            let i = i as usize;
            counts.free[i] >= need
                && match first {
                    Metric::Whole => counts.whole[i] >= first_need,
                    _ => counts.open[i] >= first_need,
                }
        };
        let mut scope = group;
        if fits(counts, scope) {
            loop {
                let best = self
                    .kids(scope)
                    .iter()
                    .copied()
                    .filter(|&k| !self.nodes[k as usize].is_core && fits(counts, k))
                    .min_by_key(|&k| counts.free[k as usize]);
                match best {
                    Some(k) => scope = k,
                    None => break,
                }
            }
        }
        let missing = self.fill(scope, first_need, first, available, counts, out);
        let rest = need - first_need + missing;
        let missing = self.fill(scope, rest, Metric::Free, available, counts, out);
        if missing > 0 {
            self.fill(group, missing, Metric::Free, available, counts, out);
        }
    }
}
