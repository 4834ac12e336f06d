//! `dra-plugin slices`: the ResourceSlices a first publish from this node
//! would send, printed as JSON, built by the same code as the publisher's.

use crate::devices::{DeviceMode, DeviceOptions, GroupBy};
use crate::slices::device_attributes::LeftOutRoots;
use crate::slices::{
    build_slices, devices_with_pcie_roots, NodeOwner, ATTR_PCIE_ROOT,
    MAX_ATTRIBUTE_VALUES_PER_DEVICE,
};
use anyhow::Context;
use clap::Args;
use shared_state::topology::pcie::PcieRoots;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `dra-plugin slices`.
#[derive(Debug, Clone, Args)]
pub struct SlicesArgs {
    /// Directory containing `sys/devices/system/cpu` (the host's `/`, or an
    /// unpacked sysfs fixture).
    #[arg(long, env = "HOST_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Node the slices are for; also the pool name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Uid of the Node object, for the owner reference (left out without it).
    #[arg(long)]
    pub node_uid: Option<String>,
    #[arg(long, default_value = "dra.cpu")]
    pub driver_name: String,
    #[arg(long, value_enum, default_value_t = DeviceMode::Grouped)]
    pub cpu_device_mode: DeviceMode,
    #[arg(long, value_enum, default_value_t = GroupBy::Numanode)]
    pub group_by: GroupBy,
    /// CPUs kept for system daemons (cpulist); never published.
    #[arg(long, default_value = "")]
    pub reserved_cpus: CpuSet,
    /// Leave out the KEP-5517 `nodeAllocatableResources` mapping.
    #[arg(long)]
    pub disable_node_allocatable_mapping: bool,
    /// Add `resource.kubernetes.io/pcieRoot` (the PCIe roots local to each
    /// device's CPUs, read under `sys/devices`).
    #[arg(long)]
    pub expose_pcie_roots: bool,
}

/// `dra-plugin slices`: print, as a JSON list, the slices a first publish
/// from this node would send (generation 1).
pub fn print(args: &SlicesArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let topology = Topology::discover(&args.sysfs_root).with_context(|| {
        format!(
            "discovering the CPU topology under {}",
            args.sysfs_root.display()
        )
    })?;
    let options = DeviceOptions {
        mode: args.cpu_device_mode,
        group_by: args.group_by,
        reserved: args.reserved_cpus.clone(),
        node_allocatable_mapping: !args.disable_node_allocatable_mapping,
    };
    let roots = if args.expose_pcie_roots {
        let roots = PcieRoots::discover(&args.sysfs_root).with_context(|| {
            format!(
                "discovering the PCIe roots under {}",
                args.sysfs_root.join("sys/devices").display()
            )
        })?;
        if roots.is_empty() {
            eprintln!(
                "no PCIe root complex under {}: no device gets {ATTR_PCIE_ROOT}",
                args.sysfs_root.join("sys/devices").display()
            );
        }
        Some(roots)
    } else {
        None
    };
    let (devices, left_out) = devices_with_pcie_roots(&topology, &options, roots.as_ref())?;
    for LeftOutRoots { device, roots } in &left_out {
        eprintln!("device {device}: PCIe roots {roots:?} left out of {ATTR_PCIE_ROOT} (at most {MAX_ATTRIBUTE_VALUES_PER_DEVICE} attribute values per device)");
    }
    let owner = args.node_uid.as_ref().map(|uid| NodeOwner {
        name: args.node_name.clone(),
        uid: uid.clone(),
    });
    let slices = build_slices(
        &args.driver_name,
        &args.node_name,
        owner.as_ref(),
        devices,
        1,
    )?;
    serde_json::to_writer_pretty(&mut *out, &slices).context("writing the slices")?;
    writeln!(out).context("writing the slices")?;
    Ok(())
}
