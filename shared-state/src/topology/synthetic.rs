//! Synthetic topologies built from a shape, for tests and benchmarks.
//!
//! The ids follow what real machines report so the allocator sees the same
//! numbering traps it meets on hardware: with [`SiblingNumbering::Split`]
//! the second thread of core `N` is CPU `N + cores_total` (Intel and AMD
//! servers); with [`SiblingNumbering::Adjacent`] the threads of a core are
//! consecutive (`2k`, `2k+1`).

use super::{CoreType, CpuInfo, Topology};
use crate::cpuset::CpuSet;

/// How the hardware threads of one core are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiblingNumbering {
    /// Threads of a core are consecutive ids.
    Adjacent,
    /// Thread `t` of core `N` is `N + t * cores_total`.
    Split,
}

/// The shape of a machine. Every count is per parent: a machine has
/// `sockets * numa_per_socket * l3_per_numa * cores_per_l3 * threads_per_core`
/// logical CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub sockets: u32,
    pub numa_per_socket: u32,
    pub l3_per_numa: u32,
    pub cores_per_l3: u32,
    pub threads_per_core: u32,
    pub sibling_numbering: SiblingNumbering,
}

/// The large machine of the benchmarks and the performance table:
/// 2 sockets × 2 NUMA × 4 L3 × 32 cores × 2 threads = 1024 CPUs, split
/// sibling numbering.
pub const MACHINE_1024: Shape = Shape {
    sockets: 2,
    numa_per_socket: 2,
    l3_per_numa: 4,
    cores_per_l3: 32,
    threads_per_core: 2,
    sibling_numbering: SiblingNumbering::Split,
};

/// [`MACHINE_1024`] with half the L3 groups: 2 sockets × 2 NUMA × 2 L3 ×
/// 32 cores × 2 threads = 512 CPUs.
pub const MACHINE_512: Shape = Shape {
    l3_per_numa: 2,
    ..MACHINE_1024
};

impl Shape {
    /// Number of physical cores of the whole machine.
    pub fn cores_total(&self) -> u32 {
        self.sockets * self.numa_per_socket * self.l3_per_numa * self.cores_per_l3
    }

    /// Number of logical CPUs of the whole machine.
    pub fn cpus_total(&self) -> u32 {
        self.cores_total() * self.threads_per_core
    }
}

/// Build the topology of `shape`, CPUs sorted by id, nothing isolated.
///
/// Core ids restart at 0 in every socket, as `topology/core_id` does. L3 ids
/// and NUMA ids are global. Shapes past [`crate::cpuset::MAX_CPUS`] CPUs are
/// truncated to the CPUs that fit, since a CPU set cannot name them.
pub fn build(shape: &Shape) -> Topology {
    let cores_total = shape.cores_total();
    let cores_per_numa = shape.l3_per_numa * shape.cores_per_l3;
    let cores_per_socket = shape.numa_per_socket * cores_per_numa;
    let threads = shape.threads_per_core;
    let cpu_id = |core: u32, thread: u32| -> u32 {
        match shape.sibling_numbering {
            SiblingNumbering::Adjacent => core * threads + thread,
            SiblingNumbering::Split => thread * cores_total + core,
        }
    };
    let limit = crate::cpuset::MAX_CPUS;
    let mut cpus = Vec::with_capacity(shape.cpus_total() as usize);
    for core in 0..cores_total {
        let siblings: CpuSet = (0..threads)
            .map(|t| cpu_id(core, t))
            .filter(|&id| id < limit)
            .collect();
        let socket = core / cores_per_socket.max(1);
        let numa = core / cores_per_numa.max(1);
        let l3 = core / shape.cores_per_l3.max(1);
        for thread in 0..threads {
            let id = cpu_id(core, thread);
            if id >= limit {
                continue;
            }
            cpus.push(CpuInfo {
                id,
                socket,
                die: 0,
                cluster: core % cores_per_socket.max(1),
                core: core % cores_per_socket.max(1),
                numa,
                l3: Some(l3),
                core_type: CoreType::Standard,
                siblings: siblings.clone(),
            });
        }
    }
    cpus.sort_by_key(|c| c.id);
    Topology {
        cpus,
        isolated: CpuSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(numbering: SiblingNumbering) -> Shape {
        Shape {
            sockets: 2,
            numa_per_socket: 2,
            l3_per_numa: 2,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: numbering,
        }
    }

    #[test]
    fn split_numbering_pairs_n_with_n_plus_cores_total() {
        let topo = build(&shape(SiblingNumbering::Split));
        assert_eq!(topo.cpus.len(), 64);
        let cpu5 = &topo.cpus[5];
        assert_eq!(cpu5.id, 5);
        assert_eq!(cpu5.siblings.to_cpulist(), "5,37");
        assert_eq!(topo.cpus[37].siblings.to_cpulist(), "5,37");
        assert_eq!(topo.cpus[37].core, cpu5.core);
    }

    #[test]
    fn adjacent_numbering_pairs_consecutive_ids() {
        let topo = build(&shape(SiblingNumbering::Adjacent));
        assert_eq!(topo.cpus[6].siblings.to_cpulist(), "6-7");
        assert_eq!(topo.cpus[7].core, topo.cpus[6].core);
    }

    #[test]
    fn groups_have_the_shape_sizes() {
        let topo = build(&shape(SiblingNumbering::Split));
        let count = |f: &dyn Fn(&CpuInfo) -> bool| topo.cpus.iter().filter(|c| f(c)).count();
        assert_eq!(count(&|c| c.socket == 1), 32);
        assert_eq!(count(&|c| c.numa == 3), 16);
        assert_eq!(count(&|c| c.l3 == Some(7)), 8);
        // Core ids restart per socket: core 0 exists in both sockets.
        assert_eq!(count(&|c| c.core == 0), 4);
        let ids: Vec<u32> = topo.cpus.iter().map(|c| c.id).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted);
    }

    #[test]
    fn big_machine_has_1024_cpus() {
        let topo = build(&MACHINE_1024);
        assert_eq!(topo.cpus.len(), 1024);
        assert_eq!(topo.cpus[1023].siblings.to_cpulist(), "511,1023");
        assert_eq!(topo.cpus[1023].numa, 3);
    }
}
