//! CPU → NUMA node, for `--align-memory`: the `cpuset.mems` that follow a
//! container's CPUs.

use shared_state::topology::Topology;
use shared_state::CpuSet;

/// CPU → NUMA node, for `--align-memory`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumaMap {
    /// Indexed by CPU id; `None` for CPUs the topology does not list.
    numa_of: Vec<Option<u32>>,
}

impl NumaMap {
    pub fn from_topology(topology: &Topology) -> Self {
        let len = topology.cpus.iter().map(|c| c.id as usize + 1).max();
        let mut numa_of = vec![None; len.unwrap_or(0)];
        for cpu in &topology.cpus {
            if let Some(slot) = numa_of.get_mut(cpu.id as usize) {
                *slot = Some(cpu.numa);
            }
        }
        NumaMap { numa_of }
    }

    /// The NUMA nodes of `cpus`; `None` if any CPU's node is unknown (then
    /// memory is left unrestricted rather than guessed).
    pub fn nodes_of(&self, cpus: &CpuSet) -> Option<CpuSet> {
        let mut nodes = CpuSet::new();
        for cpu in cpus.iter() {
            nodes.insert(self.numa_of.get(cpu as usize).copied().flatten()?);
        }
        (!nodes.is_empty()).then_some(nodes)
    }
}
