//! The policies: packed, whole cores only, and one thread per core first,
//! each a walk of the topology tree under its own rule.

use super::place::Inside;
use super::{AllocError, Allocator};
use crate::cpuset::CpuSet;

impl Allocator {
    pub(super) fn packed(&self, available: &CpuSet, count: usize) -> CpuSet {
        self.place(available, count, Inside::WholeCores)
    }

    pub(super) fn whole_core_cpus(&self, available: &CpuSet) -> CpuSet {
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

    pub(super) fn full_cores(
        &self,
        available: &CpuSet,
        count: usize,
    ) -> Result<CpuSet, AllocError> {
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

    pub(super) fn distributed(&self, available: &CpuSet, count: usize) -> CpuSet {
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
    use crate::alloc::fixtures::*;
    use crate::alloc::{allocate, AllocError, Policy};
    use crate::cpuset::CpuSet;
    use crate::topology::synthetic::{build, Shape, SiblingNumbering};
    use crate::topology::Topology;

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

    /// 1 socket × 2 NUMA × 2 L3 × 2 cores × 2 threads, adjacent numbering:
    /// core c has CPUs 2c and 2c+1, L3 k holds CPUs 4k..4k+3, NUMA 0 holds
    /// 0-7 and NUMA 1 holds 8-15.
    fn two_l3_per_numa() -> Topology {
        build(&Shape {
            sockets: 1,
            numa_per_socket: 2,
            l3_per_numa: 2,
            cores_per_l3: 2,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Adjacent,
        })
    }

    /// 1 socket × 2 NUMA × 1 L3 × 4 cores × 2 threads, adjacent numbering:
    /// NUMA 0 holds cores 0-3 (CPUs 0-7), NUMA 1 cores 4-7 (CPUs 8-15).
    fn one_l3_per_numa() -> Topology {
        build(&Shape {
            sockets: 1,
            numa_per_socket: 2,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Adjacent,
        })
    }

    /// (what, topology, available, count, expected)
    type PlacementCase = (
        &'static str,
        fn() -> Topology,
        &'static str,
        usize,
        &'static str,
    );

    /// Where the order of preferences changes the answer: several L3 groups
    /// per NUMA node, NUMA nodes with unequal free CPUs, partly used cores.
    #[test]
    fn packed_preference_order_table() {
        let cases: &[PlacementCase] = &[
            // (what, topology, available, count, expected)
            (
                "the NUMA node with the fewest free CPUs holds 2 only across two L3 \
                 groups; one L3 group of the other node holds them: that one wins",
                two_l3_per_numa,
                "1,5,8-15",
                2,
                "8-9",
            ),
            (
                "the fitting L3 group with the fewest free CPUs on any node (best fit), \
                 its whole core before the partly used one",
                two_l3_per_numa,
                "1,5,8-10,12-15",
                2,
                "8-9",
            ),
            (
                "3 CPUs: one L3 group's whole core and the free thread of its \
                 partly used core",
                two_l3_per_numa,
                "1,5,8-10,12-15",
                3,
                "8-10",
            ),
            (
                "fewer NUMA nodes before whole cores: NUMA 0 holds 6 free CPUs with \
                 only 2 whole cores, and stays the only node used",
                one_l3_per_numa,
                "0-3,5,7,8-11,13",
                6,
                "0-3,5,7",
            ),
            (
                "unequal NUMA nodes, request larger than either: the one with more \
                 free CPUs is taken whole, the rest is a whole core of the other",
                one_l3_per_numa,
                "0-5,8-15",
                10,
                "0-1,8-15",
            ),
            (
                "a request no L3 group holds: two L3 groups of one NUMA node, the \
                 node with fewer free CPUs (best fit), a whole L3 group first",
                two_l3_per_numa,
                "0-7,9-15",
                6,
                "10-15",
            ),
        ];
        for (what, topology, avail, count, expected) in cases {
            let t = topology();
            let got = allocate(&t, &cs(avail), *count, Policy::Packed).unwrap();
            assert_eq!(
                got,
                cs(expected),
                "{what}: available {avail}, count {count}"
            );
        }
    }

    /// An offline thread is simply not there: its core's online thread
    /// serves a 1-CPU request before a whole core is split, and 2 CPUs
    /// come from a core with both threads online.
    #[test]
    fn packed_with_an_offline_sibling() {
        let mut t = small();
        t.cpus.retain(|c| c.id != 16);
        for c in &mut t.cpus {
            c.siblings.remove(16);
        }
        let online = t.online();
        assert_eq!(allocate(&t, &online, 1, Policy::Packed).unwrap(), cs("0"));
        assert_eq!(
            allocate(&t, &online, 2, Policy::Packed).unwrap(),
            cs("1,17")
        );
        let err = allocate(&t, &all(&small()), 1, Policy::Packed).unwrap_err();
        assert_eq!(err, AllocError::UnknownCpus { cpus: cs("16") });
    }

    #[test]
    fn distribute_across_cores_table() {
        let t = small();
        let cases: &[(&str, &str, usize, &str)] = &[
            // (what, available, count, expected)
            (
                "one thread of each of 4 cores of one L3 group",
                "0-31",
                4,
                "0-3",
            ),
            (
                "a core whose other thread is in use goes first",
                "0-16,18-31",
                1,
                "1",
            ),
            (
                "6 CPUs in one L3 group of 4 cores: one thread each, then 2 second threads, \
                 rather than a second L3 group",
                "0-31",
                6,
                "0-3,16-17",
            ),
            (
                "8 CPUs: one L3 group holds them, so its second threads come \
                 before a second L3 group",
                "0-31",
                8,
                "0-3,16-19",
            ),
        ];
        for (what, avail, count, expected) in cases {
            let got = allocate(&t, &cs(avail), *count, Policy::DistributeAcrossCores).unwrap();
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
}
