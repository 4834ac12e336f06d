//! `topology` and `allocate`: read the node's topology and run the allocator
//! exactly as the plugin does, without a cluster. Operators use them to check
//! what a claim would get before scheduling latency-critical work.

use anyhow::{bail, Context};
use clap::Args;
use shared_state::alloc::{Allocator, Policy};
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::io::Write;
use std::path::PathBuf;

/// Where sysfs is and which CPUs are kept for system daemons.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Directory containing `sys/devices/system/cpu` (the host's `/`, or an
    /// unpacked sysfs fixture).
    #[arg(long, env = "HOST_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// CPUs kept for system daemons (cpulist); never allocated.
    #[arg(long, default_value = "")]
    pub reserved_cpus: CpuSet,
}

#[derive(Debug, Clone, Args)]
pub struct TopologyArgs {
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Debug, Clone, Args)]
pub struct AllocateArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Number of CPUs to allocate.
    #[arg(long)]
    pub count: usize,
    /// packed, full-pcpus-only, distribute-across-numa or
    /// distribute-across-cores.
    #[arg(long, default_value_t = Policy::Packed)]
    pub policy: Policy,
    /// Free CPUs to choose from (cpulist); all allocatable CPUs by default.
    #[arg(long)]
    pub available: Option<CpuSet>,
    /// Choose inside this NUMA node only, as a grouped-mode device does.
    #[arg(long)]
    pub numa: Option<u32>,
}

fn discover(node: &NodeArgs) -> anyhow::Result<Topology> {
    let topology = Topology::discover(&node.sysfs_root).with_context(|| {
        format!(
            "discovering the CPU topology under {}",
            node.sysfs_root.display()
        )
    })?;
    let online = topology.online();
    if !node.reserved_cpus.is_subset(&online) {
        bail!(
            "--reserved-cpus {}: CPUs {} are not online on this node (online: {})",
            node.reserved_cpus,
            node.reserved_cpus.difference(&online),
            online
        );
    }
    Ok(topology)
}

pub fn topology(args: &TopologyArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let topology = discover(&args.node)?;
    let report = topology.report(&args.node.reserved_cpus);
    serde_json::to_writer_pretty(&mut *out, &report).context("writing the topology report")?;
    writeln!(out).context("writing the topology report")?;
    Ok(())
}

pub fn allocate(args: &AllocateArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let topology = discover(&args.node)?;
    let chosen = choose(&topology, args)?;
    writeln!(out, "{chosen}").context("writing the chosen CPUs")?;
    Ok(())
}

/// The allocation itself, over an already discovered topology.
pub fn choose(topology: &Topology, args: &AllocateArgs) -> anyhow::Result<CpuSet> {
    let online = topology.online();
    let allocatable = online.difference(&args.node.reserved_cpus);
    let available = match &args.available {
        Some(list) => {
            if !list.is_subset(&online) {
                bail!(
                    "--available {list}: CPUs {} are not online on this node (online: {online})",
                    list.difference(&online)
                );
            }
            // Reserved CPUs are never handed out, even when listed as free.
            list.difference(&args.node.reserved_cpus)
        }
        None => allocatable,
    };
    let allocator = Allocator::new(topology);
    let chosen = match args.numa {
        Some(node) => {
            let group = topology.cpus_in_numa(node);
            if group.is_empty() {
                bail!(
                    "--numa {node}: no online CPUs in that NUMA node (nodes: {:?})",
                    topology.numa_nodes()
                );
            }
            allocator
                .allocate_in(&available, &group, args.count, args.policy)
                .with_context(|| format!("allocating {} CPUs in NUMA node {node}", args.count))?
        }
        None => allocator
            .allocate(&available, args.count, args.policy)
            .with_context(|| format!("allocating {} CPUs", args.count))?,
    };
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};

    fn machine() -> Topology {
        // 2 NUMA nodes of 4 cores × 2 threads, threads N and N+8.
        build(&Shape {
            sockets: 1,
            numa_per_socket: 2,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    fn args(count: usize) -> AllocateArgs {
        AllocateArgs {
            node: NodeArgs {
                sysfs_root: PathBuf::from("/nonexistent"),
                reserved_cpus: CpuSet::new(),
            },
            count,
            policy: Policy::Packed,
            available: None,
            numa: None,
        }
    }

    fn cs(list: &str) -> CpuSet {
        CpuSet::parse_cpulist(list).unwrap()
    }

    #[test]
    fn choose_table() {
        let t = machine();
        let cases: Vec<(&str, AllocateArgs, &str)> = vec![
            ("plain packed", args(2), "0,8"),
            (
                "reserved CPUs are skipped",
                AllocateArgs {
                    node: NodeArgs {
                        reserved_cpus: cs("0,8"),
                        ..args(2).node
                    },
                    ..args(2)
                },
                "1,9",
            ),
            (
                "reserved CPUs are skipped even when listed as available",
                AllocateArgs {
                    node: NodeArgs {
                        reserved_cpus: cs("0,8"),
                        ..args(2).node
                    },
                    available: Some(cs("0-15")),
                    ..args(2)
                },
                "1,9",
            ),
            (
                "grouped pick in NUMA node 1",
                AllocateArgs {
                    numa: Some(1),
                    ..args(3)
                },
                "4-5,12",
            ),
            (
                "available narrows the choice",
                AllocateArgs {
                    available: Some(cs("3,6-7,14-15")),
                    ..args(2)
                },
                "6,14",
            ),
        ];
        for (what, a, expected) in cases {
            assert_eq!(choose(&t, &a).unwrap(), cs(expected), "{what}");
        }
    }

    #[test]
    fn choose_errors_name_the_bad_input() {
        let t = machine();
        let err = choose(
            &t,
            &AllocateArgs {
                available: Some(cs("0-20")),
                ..args(1)
            },
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("CPUs 16-20 are not online"),
            "{err:#}"
        );
        let err = choose(
            &t,
            &AllocateArgs {
                numa: Some(7),
                ..args(1)
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("--numa 7"), "{err:#}");
        let err = choose(
            &t,
            &AllocateArgs {
                numa: Some(0),
                ..args(9)
            },
        )
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("9 CPUs requested but only 8 are free"),
            "{text}"
        );
    }
}
