//! The devices this node publishes: the device modes (one device per CPU,
//! or one per group of CPUs with consumable capacity), the plan of which
//! CPUs each device stands for, and the catalog prepare resolves device
//! names through. The slices and prepare read the same plan, so a device
//! name in an allocation result means exactly the CPUs published for it.

use crate::opaque_config::NodeCpus;
use crate::slice_error::SliceError;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::fmt;

/// How CPUs are exposed as devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceMode {
    /// One device per group of CPUs, with consumable capacity `dra.cpu/cpu`.
    #[default]
    Grouped,
    /// One device per allocatable logical CPU.
    Individual,
}

/// The `--cpu-device-mode` setting: a device mode, or `auto`, grouped where
/// the API server keeps `allowMultipleAllocations` (consumable capacity)
/// and individual where it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuDeviceMode {
    /// Grouped where the API server supports consumable capacity, else individual.
    #[default]
    Auto,
    /// Grouped only: refused (nothing published) where the server drops
    /// `allowMultipleAllocations`.
    Grouped,
    Individual,
}

impl CpuDeviceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuDeviceMode::Auto => "auto",
            CpuDeviceMode::Grouped => "grouped",
            CpuDeviceMode::Individual => "individual",
        }
    }

    /// The device modes whose devices may be published, preferred first.
    pub fn modes(self) -> &'static [DeviceMode] {
        match self {
            CpuDeviceMode::Auto => &[DeviceMode::Grouped, DeviceMode::Individual],
            CpuDeviceMode::Grouped => &[DeviceMode::Grouped],
            CpuDeviceMode::Individual => &[DeviceMode::Individual],
        }
    }
}

impl From<DeviceMode> for CpuDeviceMode {
    fn from(mode: DeviceMode) -> Self {
        match mode {
            DeviceMode::Grouped => CpuDeviceMode::Grouped,
            DeviceMode::Individual => CpuDeviceMode::Individual,
        }
    }
}

impl fmt::Display for CpuDeviceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one grouped device covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    #[default]
    Numanode,
    Socket,
    Machine,
}

impl DeviceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceMode::Grouped => "grouped",
            DeviceMode::Individual => "individual",
        }
    }
}

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Numanode => "numanode",
            GroupBy::Socket => "socket",
            GroupBy::Machine => "machine",
        }
    }
}

impl fmt::Display for DeviceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything besides the topology that decides the published devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOptions {
    pub mode: DeviceMode,
    pub group_by: GroupBy,
    /// Kept for system daemons; never published.
    pub reserved: CpuSet,
    /// Publish the KEP-5517 `nodeAllocatableResources` mapping.
    pub node_allocatable_mapping: bool,
}

/// What a published device stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceScope {
    Cpu(u32),
    Numa { node: u32, socket: u32 },
    Socket(u32),
    Machine,
}

/// A device name and the allocatable CPUs behind it. Prepare resolves the
/// device names of an allocation result through the same list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCpus {
    pub name: String,
    pub scope: DeviceScope,
    pub cpus: CpuSet,
}

/// The devices to publish and the CPUs each stands for, in publishing order.
///
/// Individual devices are numbered core by core: cores ordered by their
/// lowest allocatable CPU, threads of a core in id order, so SMT siblings get
/// consecutive numbers whatever the kernel's numbering. Groups without an
/// allocatable CPU are left out.
pub fn plan_devices(
    topology: &Topology,
    options: &DeviceOptions,
) -> Result<Vec<DeviceCpus>, SliceError> {
    let online = topology.online();
    if online.is_empty() {
        return Err(SliceError::NoOnlineCpus);
    }
    if !options.reserved.is_subset(&online) {
        return Err(SliceError::ReservedNotOnline {
            reserved: options.reserved.clone(),
            not_online: options.reserved.difference(&online),
            online,
        });
    }
    let allocatable = |set: CpuSet| set.difference(&options.reserved);
    let planned = match (options.mode, options.group_by) {
        (DeviceMode::Individual, _) => {
            let mut cores: Vec<CpuSet> = topology
                .cores()
                .into_iter()
                .map(allocatable)
                .filter(|c| !c.is_empty())
                .collect();
            cores.sort_by_key(|c| c.first());
            cores
                .iter()
                .flat_map(|core| core.iter())
                .enumerate()
                .map(|(number, cpu)| DeviceCpus {
                    name: format!("cpudev{number:03}"),
                    scope: DeviceScope::Cpu(cpu),
                    cpus: std::iter::once(cpu).collect(),
                })
                .collect()
        }
        (DeviceMode::Grouped, GroupBy::Numanode) => topology
            .numa_nodes()
            .into_iter()
            .filter_map(|node| {
                let cpus = allocatable(topology.cpus_in_numa(node));
                // A NUMA node lies inside one socket; take it from any CPU.
                let socket = cpus.first().and_then(|c| topology.cpu(c))?.socket;
                Some(DeviceCpus {
                    name: format!("cpudevnuma{node:03}"),
                    scope: DeviceScope::Numa { node, socket },
                    cpus,
                })
            })
            .collect(),
        (DeviceMode::Grouped, GroupBy::Socket) => topology
            .sockets()
            .into_iter()
            .map(|socket| DeviceCpus {
                name: format!("cpudevsocket{socket:03}"),
                scope: DeviceScope::Socket(socket),
                cpus: allocatable(topology.cpus_in_socket(socket)),
            })
            .filter(|d| !d.cpus.is_empty())
            .collect(),
        (DeviceMode::Grouped, GroupBy::Machine) => {
            let cpus = allocatable(online);
            if cpus.is_empty() {
                Vec::new()
            } else {
                vec![DeviceCpus {
                    name: "cpudevmachine".to_string(),
                    scope: DeviceScope::Machine,
                    cpus,
                }]
            }
        }
    };
    Ok(planned)
}

/// Which CPUs each device of this node stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCatalog {
    devices: BTreeMap<String, (DeviceMode, CpuSet)>,
    allocatable: CpuSet,
    online: CpuSet,
    reserved: CpuSet,
}

impl DeviceCatalog {
    /// The devices published for `topology` minus `reserved`, from the
    /// same plan the ResourceSlices are built from, so a device name in an
    /// allocation result means exactly the CPUs that were published for it.
    pub fn new(
        topology: &Topology,
        reserved: &CpuSet,
        mode: DeviceMode,
        group_by: GroupBy,
    ) -> Result<DeviceCatalog, SliceError> {
        Self::for_modes(topology, reserved, &[mode], group_by)
    }

    /// The devices of every mode in `modes` (`--cpu-device-mode auto`
    /// publishes grouped or individual devices depending on the API server;
    /// their names never collide: `cpudev%03d` against `cpudevnuma%03d`,
    /// `cpudevsocket%03d` and `cpudevmachine`).
    pub fn for_modes(
        topology: &Topology,
        reserved: &CpuSet,
        modes: &[DeviceMode],
        group_by: GroupBy,
    ) -> Result<DeviceCatalog, SliceError> {
        let mut devices = BTreeMap::new();
        for &mode in modes {
            let options = DeviceOptions {
                mode,
                group_by,
                reserved: reserved.clone(),
                node_allocatable_mapping: false,
            };
            for d in plan_devices(topology, &options)? {
                devices.insert(d.name, (mode, d.cpus));
            }
        }
        Ok(DeviceCatalog {
            devices,
            allocatable: topology.online().difference(reserved),
            online: topology.online().clone(),
            reserved: reserved.clone(),
        })
    }

    /// How a device is allocated: whole (individual) or by consumed
    /// capacity (grouped).
    pub fn mode_of(&self, device: &str) -> Option<DeviceMode> {
        self.devices.get(device).map(|(mode, _)| *mode)
    }

    /// What an opaque cpuset config is checked against.
    pub fn node_cpus(&self) -> NodeCpus<'_> {
        NodeCpus {
            online: &self.online,
            reserved: &self.reserved,
        }
    }

    /// Online CPUs minus reserved ones.
    pub fn allocatable(&self) -> &CpuSet {
        &self.allocatable
    }

    /// The CPUs of one device, if it exists.
    pub fn cpus_of(&self, device: &str) -> Option<&CpuSet> {
        self.devices.get(device).map(|(_, cpus)| cpus)
    }

    /// Every device name with its CPUs, sorted by name.
    pub fn devices(&self) -> impl Iterator<Item = (&str, &CpuSet)> {
        self.devices
            .iter()
            .map(|(name, (_, cpus))| (name.as_str(), cpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::tests::{catalog, individual_device_name, topology};

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    #[test]
    fn individual_numbering_keeps_siblings_consecutive_and_skips_reserved() {
        let topo = topology();
        let catalog = catalog(&topo, &set("0"), DeviceMode::Individual, GroupBy::Numanode);
        // Cores are (n, n+8); CPU 0 is reserved, so core (0, 8) keeps only 8
        // and sorts last by its lowest allocatable CPU.
        let expected = [1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 8];
        let got: Vec<(String, String)> = catalog
            .devices()
            .map(|(n, c)| (n.to_string(), c.to_cpulist()))
            .collect();
        let want: Vec<(String, String)> = expected
            .iter()
            .enumerate()
            .map(|(n, cpu)| (individual_device_name(n), cpu.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn grouped_devices_per_grouping() {
        let topo = topology();
        let reserved = set("0-1");
        let cases: [(GroupBy, &[(&str, CpuSet)]); 3] = [
            (
                GroupBy::Numanode,
                &[
                    ("cpudevnuma000", topo.cpus_in_numa(0).difference(&reserved)),
                    ("cpudevnuma001", topo.cpus_in_numa(1).difference(&reserved)),
                ],
            ),
            (
                GroupBy::Socket,
                &[
                    (
                        "cpudevsocket000",
                        topo.cpus_in_socket(0).difference(&reserved),
                    ),
                    (
                        "cpudevsocket001",
                        topo.cpus_in_socket(1).difference(&reserved),
                    ),
                ],
            ),
            (
                GroupBy::Machine,
                &[("cpudevmachine", topo.online().difference(&reserved))],
            ),
        ];
        for (group_by, want) in cases {
            let catalog = catalog(&topo, &reserved, DeviceMode::Grouped, group_by);
            let got: Vec<(&str, CpuSet)> = catalog.devices().map(|(n, c)| (n, c.clone())).collect();
            assert_eq!(got, want.to_vec(), "{group_by:?}");
            assert!(got.iter().all(|(_, c)| c.is_disjoint(&reserved)));
        }
    }

    #[test]
    fn modes_parse_as_flags_and_config_values() {
        assert_eq!(
            DeviceMode::from_str("individual", false),
            Ok(DeviceMode::Individual)
        );
        assert_eq!(GroupBy::from_str("numanode", false), Ok(GroupBy::Numanode));
        assert!(GroupBy::from_str("numa", false).is_err());
        let parsed: GroupBy = serde_json::from_str("\"socket\"").unwrap();
        assert_eq!(parsed, GroupBy::Socket);
        assert_eq!(DeviceMode::Grouped.to_string(), "grouped");
    }
}
