//! The Device objects of the slices: each device's attributes (NUMA node,
//! socket, L3 cache, core, CPU, SMT), its consumable capacity and
//! node-allocatable mapping, and the PCIe roots local to its CPUs within
//! the API server's attribute limits.

use super::{
    ATTR_CACHE_L3_ID, ATTR_CFS_QUOTA_CONTROL, ATTR_CORE_ID, ATTR_CORE_TYPE, ATTR_CPU_ID,
    ATTR_GOVERNORS, ATTR_IDLE_LATENCY_CONTROL, ATTR_IRQ_ISOLATION, ATTR_ISOLATED_PARTITION,
    ATTR_NUMA_NODE, ATTR_NUMA_NODE_COMPAT, ATTR_NUMA_NODE_ID, ATTR_NUM_CPUS, ATTR_PCIE_ROOT,
    ATTR_SMT_ENABLED, ATTR_SOCKET_ID, MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    MAX_ATTRIBUTE_VALUES_PER_DEVICE, NO_L3_CACHE_ID,
};
use crate::devices::{DeviceCpus, DeviceScope};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, NodeAllocatableMapping, NodeAllocatableResource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use shared_state::assignment::CPU_CAPACITY;
use shared_state::topology::pcie::PcieRoots;
use shared_state::topology::Topology;
use shared_state::tuning::support::NodeSupport;
use shared_state::CpuSet;
use std::collections::BTreeMap;

fn int(value: impl Into<i64>) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value.into()),
        ..Default::default()
    }
}

fn boolean(value: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(value),
        ..Default::default()
    }
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_string()),
        ..Default::default()
    }
}

fn cpu_mapping(mapping: NodeAllocatableMapping) -> BTreeMap<String, NodeAllocatableResource> {
    BTreeMap::from([(
        "cpu".to_string(),
        NodeAllocatableResource {
            mapping: Some(mapping),
            overhead: None,
        },
    )])
}

fn numa_attributes(attributes: &mut BTreeMap<String, DeviceAttribute>, node: u32) {
    attributes.insert(ATTR_NUMA_NODE.to_string(), int(node));
    attributes.insert(ATTR_NUMA_NODE_ID.to_string(), int(node));
    attributes.insert(ATTR_NUMA_NODE_COMPAT.to_string(), int(node));
}

/// The `Device` objects for a plan from [`plan_devices`].
pub fn build_devices(
    topology: &Topology,
    planned: &[DeviceCpus],
    node_allocatable_mapping: bool,
) -> Vec<Device> {
    let smt_enabled = topology.smt_enabled();
    planned
        .iter()
        .map(|planned| {
            let mut attributes = BTreeMap::new();
            attributes.insert(ATTR_SMT_ENABLED.to_string(), boolean(smt_enabled));
            let count = i64::try_from(planned.cpus.len()).unwrap_or(i64::MAX);
            let grouped = |attributes: BTreeMap<String, DeviceAttribute>| Device {
                name: planned.name.clone(),
                attributes: Some(attributes),
                allow_multiple_allocations: Some(true),
                capacity: Some(BTreeMap::from([(
                    CPU_CAPACITY.to_string(),
                    DeviceCapacity {
                        value: Quantity(count.to_string()),
                        request_policy: None,
                    },
                )])),
                node_allocatable_resources: node_allocatable_mapping.then(|| {
                    cpu_mapping(NodeAllocatableMapping {
                        capacity_key: Some(CPU_CAPACITY.to_string()),
                        capacity_multiplier: Some(Quantity("1".to_string())),
                        device_multiplier: None,
                    })
                }),
                ..Default::default()
            };
            match planned.scope {
                DeviceScope::Cpu(id) => {
                    if let Some(cpu) = topology.cpu(id) {
                        numa_attributes(&mut attributes, cpu.numa);
                        attributes.insert(ATTR_SOCKET_ID.to_string(), int(cpu.socket));
                        attributes.insert(ATTR_CORE_ID.to_string(), int(cpu.core));
                        attributes.insert(ATTR_CPU_ID.to_string(), int(cpu.id));
                        attributes.insert(
                            ATTR_CACHE_L3_ID.to_string(),
                            int(cpu.l3.map_or(NO_L3_CACHE_ID, i64::from)),
                        );
                        attributes
                            .insert(ATTR_CORE_TYPE.to_string(), string(cpu.core_type.as_str()));
                    }
                    Device {
                        name: planned.name.clone(),
                        attributes: Some(attributes),
                        node_allocatable_resources: node_allocatable_mapping.then(|| {
                            cpu_mapping(NodeAllocatableMapping {
                                capacity_key: None,
                                capacity_multiplier: None,
                                device_multiplier: Some(Quantity("1".to_string())),
                            })
                        }),
                        ..Default::default()
                    }
                }
                DeviceScope::Numa { node, socket } => {
                    numa_attributes(&mut attributes, node);
                    attributes.insert(ATTR_SOCKET_ID.to_string(), int(socket));
                    attributes.insert(ATTR_NUM_CPUS.to_string(), int(count));
                    grouped(attributes)
                }
                DeviceScope::Socket(socket) => {
                    attributes.insert(ATTR_SOCKET_ID.to_string(), int(socket));
                    attributes.insert(ATTR_NUM_CPUS.to_string(), int(count));
                    grouped(attributes)
                }
                DeviceScope::Machine => {
                    attributes.insert(ATTR_NUM_CPUS.to_string(), int(count));
                    grouped(attributes)
                }
            }
        })
        .collect()
}

/// The longest string attribute value the API server takes.
const MAX_STRING_ATTRIBUTE_LEN: usize = 64;

/// Adds the tuning this node supports to every device (see
/// [`ATTR_IRQ_ISOLATION`]). A device without room for them (its PCIe roots
/// filled its limits) is left without and named in the result.
pub fn add_tuning_attributes(devices: &mut [Device], support: &NodeSupport) -> Vec<String> {
    let mut tuning = vec![
        (ATTR_IRQ_ISOLATION, boolean(support.irqs.is_none())),
        (ATTR_CFS_QUOTA_CONTROL, boolean(support.cfs_quota.is_none())),
        (
            ATTR_ISOLATED_PARTITION,
            boolean(support.load_balancing.is_none()),
        ),
        (ATTR_IDLE_LATENCY_CONTROL, boolean(support.idle.is_none())),
    ];
    if support.governor.is_none() {
        let mut governors = support.governors_text();
        while governors.len() > MAX_STRING_ATTRIBUTE_LEN {
            match governors.rfind(',') {
                Some(cut) => governors.truncate(cut),
                None => governors.clear(),
            }
        }
        if !governors.is_empty() {
            tuning.push((ATTR_GOVERNORS, string(&governors)));
        }
    }
    let mut left_out = Vec::new();
    for device in devices.iter_mut() {
        let attributes = device.attributes.get_or_insert_with(BTreeMap::new);
        let entries = attributes.len() + device.capacity.as_ref().map_or(0, BTreeMap::len);
        let values: usize = attributes.values().map(attribute_values).sum();
        if entries + tuning.len() > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE
            || values + tuning.len() > MAX_ATTRIBUTE_VALUES_PER_DEVICE
        {
            left_out.push(device.name.clone());
            continue;
        }
        for (name, value) in &tuning {
            attributes.insert(name.to_string(), value.clone());
        }
    }
    left_out
}

/// Whether `attribute` holds a list (`bools`, `ints`, `strings`, `versions`).
pub fn is_list_attribute(attribute: &DeviceAttribute) -> bool {
    attribute.bools.is_some()
        || attribute.ints.is_some()
        || attribute.strings.is_some()
        || attribute.versions.is_some()
}

/// How many attribute values the API server counts for `attribute`: each
/// item of a list, one for a scalar.
fn attribute_values(attribute: &DeviceAttribute) -> usize {
    if is_list_attribute(attribute) {
        attribute.bools.as_ref().map_or(0, Vec::len)
            + attribute.ints.as_ref().map_or(0, Vec::len)
            + attribute.strings.as_ref().map_or(0, Vec::len)
            + attribute.versions.as_ref().map_or(0, Vec::len)
    } else {
        1
    }
}

/// PCIe roots of one device that did not fit its attribute limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOutRoots {
    pub device: String,
    pub roots: Vec<String>,
}

/// Adds [`ATTR_PCIE_ROOT`] to every device of `devices` (as planned in
/// `planned`) that has a root local to one of its CPUs: the sorted names of
/// those roots. A device none is local to gets no attribute (the API server
/// refuses an empty list). Roots past the device's attribute limits (48
/// values, 32 attributes and capacities) are left out and returned, so the
/// caller can say so; the device keeps the ones that fit.
pub fn add_pcie_roots(
    devices: &mut [Device],
    planned: &[DeviceCpus],
    topology: &Topology,
    roots: &PcieRoots,
) -> Vec<LeftOutRoots> {
    let cpus_of: BTreeMap<&str, &CpuSet> =
        planned.iter().map(|p| (p.name.as_str(), &p.cpus)).collect();
    let mut left_out = Vec::new();
    for device in devices.iter_mut() {
        let Some(cpus) = cpus_of.get(device.name.as_str()) else {
            continue;
        };
        let mut local = roots.local_to(cpus, topology);
        if local.is_empty() {
            continue;
        }
        let attributes = device.attributes.get_or_insert_with(BTreeMap::new);
        attributes.remove(ATTR_PCIE_ROOT);
        let entries = attributes.len() + device.capacity.as_ref().map_or(0, BTreeMap::len);
        let values: usize = attributes.values().map(attribute_values).sum();
        let room = if entries >= MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE {
            0
        } else {
            MAX_ATTRIBUTE_VALUES_PER_DEVICE.saturating_sub(values)
        };
        if local.len() > room {
            left_out.push(LeftOutRoots {
                device: device.name.clone(),
                roots: local.split_off(room),
            });
        }
        if !local.is_empty() {
            attributes.insert(
                ATTR_PCIE_ROOT.to_string(),
                DeviceAttribute {
                    strings: Some(local),
                    ..Default::default()
                },
            );
        }
    }
    left_out
}

/// The devices without [`ATTR_PCIE_ROOT`], for servers that cannot carry it.
pub fn without_pcie_roots(devices: &[Device]) -> Vec<Device> {
    devices
        .iter()
        .cloned()
        .map(|mut d| {
            if let Some(attributes) = d.attributes.as_mut() {
                attributes.remove(ATTR_PCIE_ROOT);
            }
            d
        })
        .collect()
}

/// Whether any device carries [`ATTR_PCIE_ROOT`].
pub fn has_pcie_roots(devices: &[Device]) -> bool {
    devices.iter().any(|d| {
        d.attributes
            .as_ref()
            .is_some_and(|a| a.contains_key(ATTR_PCIE_ROOT))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{plan_devices, DeviceMode, DeviceOptions, GroupBy};
    use crate::slices::tests::{attr_int, attr_names, capacity, cs, machine, options};
    use crate::slices::{devices_for, devices_with_pcie_roots};
    use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
    use shared_state::topology::{CoreType, CpuInfo};
    use std::collections::BTreeSet;

    /// Four roots over [`machine`]: one by affinity on node 0, one by
    /// `numa_node` on node 1, one by affinity on node 2, one local to every
    /// CPU (`numa_node` -1). Node 3 has only the last.
    fn four_roots() -> PcieRoots {
        use shared_state::topology::pcie::{Locality, PcieRoot};
        PcieRoots::new(vec![
            PcieRoot {
                name: "pci0000:00".into(),
                locality: Locality::Cpus(cs("0-1,8-9")),
            },
            PcieRoot {
                name: "pci0000:40".into(),
                locality: Locality::NumaNodes([1].into()),
            },
            PcieRoot {
                name: "pci0000:80".into(),
                locality: Locality::Cpus(cs("4-5,12-13")),
            },
            PcieRoot {
                name: "pci0000:ff".into(),
                locality: Locality::Anywhere,
            },
        ])
    }

    /// Device name and the pcieRoot list it should carry.
    type Expected<'a> = Vec<(&'a str, Option<Vec<&'a str>>)>;

    fn pcie_roots_of(d: &Device) -> Option<Vec<&str>> {
        let attr = d.attributes.as_ref()?.get(ATTR_PCIE_ROOT)?;
        assert!(attr.string.is_none() && attr.int.is_none(), "{attr:?}");
        Some(attr.strings.as_ref()?.iter().map(String::as_str).collect())
    }

    #[test]
    fn pcie_roots_per_device_mode_table() {
        let t = machine();
        let roots = four_roots();
        let (a, b, c, d) = ("pci0000:00", "pci0000:40", "pci0000:80", "pci0000:ff");
        let cases: Vec<(DeviceOptions, Expected)> = vec![
            (
                options(DeviceMode::Grouped, GroupBy::Numanode, ""),
                vec![
                    ("cpudevnuma000", Some(vec![a, d])),
                    ("cpudevnuma001", Some(vec![b, d])),
                    ("cpudevnuma002", Some(vec![c, d])),
                    ("cpudevnuma003", Some(vec![d])),
                ],
            ),
            (
                options(DeviceMode::Grouped, GroupBy::Socket, ""),
                vec![
                    ("cpudevsocket000", Some(vec![a, b, d])),
                    ("cpudevsocket001", Some(vec![c, d])),
                ],
            ),
            (
                options(DeviceMode::Grouped, GroupBy::Machine, ""),
                vec![("cpudevmachine", Some(vec![a, b, c, d]))],
            ),
            // Node 0 all reserved: its root is local to no published CPU.
            (
                options(DeviceMode::Grouped, GroupBy::Socket, "0-1,8-9"),
                vec![
                    ("cpudevsocket000", Some(vec![b, d])),
                    ("cpudevsocket001", Some(vec![c, d])),
                ],
            ),
        ];
        for (opts, want) in cases {
            let (devices, left_out) = devices_with_pcie_roots(&t, &opts, Some(&roots)).unwrap();
            assert!(left_out.is_empty());
            let got: Vec<(&str, Option<Vec<&str>>)> = devices
                .iter()
                .map(|dev| (dev.name.as_str(), pcie_roots_of(dev)))
                .collect();
            assert_eq!(got, want, "{opts:?}");
        }
        // Individual: each CPU by its own node.
        let opts = options(DeviceMode::Individual, GroupBy::Numanode, "");
        let plan = plan_devices(&t, &opts).unwrap();
        let (devices, _) = devices_with_pcie_roots(&t, &opts, Some(&roots)).unwrap();
        assert_eq!(devices.len(), 16);
        for (planned, device) in plan.iter().zip(&devices) {
            let DeviceScope::Cpu(cpu) = planned.scope else {
                panic!("{planned:?}")
            };
            let want = match t.cpu(cpu).unwrap().numa {
                0 => vec![a, d],
                1 => vec![b, d],
                2 => vec![c, d],
                _ => vec![d],
            };
            assert_eq!(pcie_roots_of(device), Some(want), "cpu {cpu}");
        }
        // Without roots (flag off) nothing changes.
        let (plain, _) = devices_with_pcie_roots(&t, &opts, None).unwrap();
        assert_eq!(plain, devices_for(&t, &opts).unwrap());
        assert!(!has_pcie_roots(&plain) && has_pcie_roots(&devices));
        assert_eq!(without_pcie_roots(&devices), plain);
    }

    #[test]
    fn a_device_no_root_is_local_to_gets_no_attribute() {
        use shared_state::topology::pcie::{Locality, PcieRoot};
        let t = machine();
        let roots = PcieRoots::new(vec![PcieRoot {
            name: "pci0000:00".into(),
            locality: Locality::Cpus(cs("0")),
        }]);
        let opts = options(DeviceMode::Grouped, GroupBy::Numanode, "");
        let (devices, _) = devices_with_pcie_roots(&t, &opts, Some(&roots)).unwrap();
        let with: Vec<&str> = devices
            .iter()
            .filter(|d| pcie_roots_of(d).is_some())
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(with, vec!["cpudevnuma000"]);
        let (none, _) = devices_with_pcie_roots(&t, &opts, Some(&PcieRoots::default())).unwrap();
        assert!(!has_pcie_roots(&none));
    }

    #[test]
    fn pcie_roots_stop_at_the_attribute_value_limit() {
        use shared_state::topology::pcie::{Locality, PcieRoot};
        let t = machine();
        let many: Vec<PcieRoot> = (0..60)
            .map(|i| PcieRoot {
                name: format!("pci{i:04x}:00"),
                locality: Locality::Anywhere,
            })
            .collect();
        let roots = PcieRoots::new(many);
        for mode in [DeviceMode::Individual, DeviceMode::Grouped] {
            let opts = options(mode, GroupBy::Numanode, "");
            let (devices, left_out) = devices_with_pcie_roots(&t, &opts, Some(&roots)).unwrap();
            assert_eq!(left_out.len(), devices.len(), "{mode}");
            for (device, left) in devices.iter().zip(&left_out) {
                let attrs = device.attributes.as_ref().unwrap();
                let values: usize = attrs.values().map(attribute_values).sum();
                assert_eq!(values, MAX_ATTRIBUTE_VALUES_PER_DEVICE, "{}", device.name);
                let kept = pcie_roots_of(device).unwrap();
                assert_eq!(kept.len() + left.roots.len(), 60);
                // The first names are kept, the last ones reported.
                assert_eq!(kept[0], "pci0000:00");
                assert_eq!(left.roots.last().map(String::as_str), Some("pci003b:00"));
            }
        }
    }

    #[test]
    fn grouped_names_and_capacities_table() {
        let t = machine();
        let cases: Vec<(DeviceOptions, Vec<(&str, &str)>)> = vec![
            (
                options(DeviceMode::Grouped, GroupBy::Numanode, ""),
                vec![
                    ("cpudevnuma000", "4"),
                    ("cpudevnuma001", "4"),
                    ("cpudevnuma002", "4"),
                    ("cpudevnuma003", "4"),
                ],
            ),
            (
                options(DeviceMode::Grouped, GroupBy::Numanode, "0,8,2"),
                vec![
                    ("cpudevnuma000", "2"),
                    ("cpudevnuma001", "3"),
                    ("cpudevnuma002", "4"),
                    ("cpudevnuma003", "4"),
                ],
            ),
            (
                // A NUMA node whose CPUs are all reserved is not published.
                options(DeviceMode::Grouped, GroupBy::Numanode, "0-1,8-9"),
                vec![
                    ("cpudevnuma001", "4"),
                    ("cpudevnuma002", "4"),
                    ("cpudevnuma003", "4"),
                ],
            ),
            (
                options(DeviceMode::Grouped, GroupBy::Socket, "0"),
                vec![("cpudevsocket000", "7"), ("cpudevsocket001", "8")],
            ),
            (
                options(DeviceMode::Grouped, GroupBy::Machine, "0,8"),
                vec![("cpudevmachine", "14")],
            ),
        ];
        for (opts, expected) in cases {
            let devices = devices_for(&t, &opts).unwrap();
            let got: Vec<(&str, &str)> = devices
                .iter()
                .map(|d| (d.name.as_str(), capacity(d).unwrap()))
                .collect();
            assert_eq!(got, expected, "{opts:?}");
            for d in &devices {
                assert_eq!(d.allow_multiple_allocations, Some(true), "{}", d.name);
                let cap: i64 = capacity(d).unwrap().parse().unwrap();
                assert_eq!(attr_int(d, ATTR_NUM_CPUS), Some(cap), "{}", d.name);
            }
        }
    }

    #[test]
    fn attribute_sets_per_layout() {
        let t = machine();
        let first = |o: DeviceOptions| devices_for(&t, &o).unwrap().remove(0);
        let numa = first(options(DeviceMode::Grouped, GroupBy::Numanode, ""));
        assert_eq!(
            attr_names(&numa),
            BTreeSet::from([
                ATTR_NUMA_NODE_ID,
                ATTR_NUM_CPUS,
                ATTR_SMT_ENABLED,
                ATTR_SOCKET_ID,
                ATTR_NUMA_NODE_COMPAT,
                ATTR_NUMA_NODE
            ])
        );
        let socket = first(options(DeviceMode::Grouped, GroupBy::Socket, ""));
        assert_eq!(
            attr_names(&socket),
            BTreeSet::from([ATTR_NUM_CPUS, ATTR_SMT_ENABLED, ATTR_SOCKET_ID])
        );
        let whole = first(options(DeviceMode::Grouped, GroupBy::Machine, ""));
        assert_eq!(
            attr_names(&whole),
            BTreeSet::from([ATTR_NUM_CPUS, ATTR_SMT_ENABLED])
        );
        let cpu = first(options(DeviceMode::Individual, GroupBy::Numanode, ""));
        assert_eq!(
            attr_names(&cpu),
            BTreeSet::from([
                ATTR_CACHE_L3_ID,
                ATTR_CORE_ID,
                ATTR_CORE_TYPE,
                ATTR_CPU_ID,
                ATTR_NUMA_NODE_ID,
                ATTR_SMT_ENABLED,
                ATTR_SOCKET_ID,
                ATTR_NUMA_NODE_COMPAT,
                ATTR_NUMA_NODE
            ])
        );
        assert!(cpu.capacity.is_none() && cpu.allow_multiple_allocations.is_none());
        let attrs = cpu.attributes.as_ref().unwrap();
        assert_eq!(attrs[ATTR_SMT_ENABLED].bool, Some(true));
        assert_eq!(attrs[ATTR_CORE_TYPE].string.as_deref(), Some("standard"));
    }

    #[test]
    fn individual_numbering_keeps_siblings_consecutive() {
        let t = machine();
        let planned =
            plan_devices(&t, &options(DeviceMode::Individual, GroupBy::Machine, "")).unwrap();
        let order: Vec<u32> = planned.iter().map(|d| d.cpus.first().unwrap()).collect();
        assert_eq!(
            order,
            vec![0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]
        );
        assert_eq!(planned[3].name, "cpudev003");
        assert_eq!(planned[3].scope, DeviceScope::Cpu(9));

        // A reserved thread leaves its sibling alone, still in core order.
        let planned = plan_devices(
            &t,
            &options(DeviceMode::Individual, GroupBy::Machine, "0,9"),
        )
        .unwrap();
        let order: Vec<u32> = planned.iter().map(|d| d.cpus.first().unwrap()).collect();
        // Cores go by their lowest allocatable CPU: core {0,8} now starts at 8.
        assert_eq!(order[..5], [1, 2, 10, 3, 11]);
        assert_eq!(order.last(), Some(&8));
        assert_eq!(planned.len(), 14);
    }

    #[test]
    fn individual_attributes_follow_the_cpu() {
        let mut t = machine();
        // CPU 5 without L3 and as an e-core, as on Arm and hybrid parts.
        let idx = t.cpus.iter().position(|c| c.id == 5).unwrap();
        t.cpus[idx].l3 = None;
        t.cpus[idx].core_type = CoreType::Efficiency;
        let devices =
            devices_for(&t, &options(DeviceMode::Individual, GroupBy::Machine, "")).unwrap();
        let d5 = devices
            .iter()
            .find(|d| attr_int(d, ATTR_CPU_ID) == Some(5))
            .unwrap();
        let info: &CpuInfo = t.cpu(5).unwrap();
        assert_eq!(attr_int(d5, ATTR_CACHE_L3_ID), Some(-1));
        assert_eq!(attr_int(d5, ATTR_SOCKET_ID), Some(i64::from(info.socket)));
        assert_eq!(attr_int(d5, ATTR_NUMA_NODE), Some(i64::from(info.numa)));
        assert_eq!(attr_int(d5, ATTR_CORE_ID), Some(i64::from(info.core)));
        assert_eq!(
            d5.attributes.as_ref().unwrap()[ATTR_CORE_TYPE]
                .string
                .as_deref(),
            Some("e-core")
        );
        let d12 = devices
            .iter()
            .find(|d| attr_int(d, ATTR_CPU_ID) == Some(12))
            .unwrap();
        assert_eq!(attr_int(d12, ATTR_NUMA_NODE), Some(2));
        assert_eq!(attr_int(d12, ATTR_SOCKET_ID), Some(1));
        assert_eq!(attr_int(d12, ATTR_CACHE_L3_ID), Some(2));
    }

    #[test]
    fn smt_disabled_machine_says_so() {
        let t = build(&Shape {
            sockets: 1,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 1,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        for mode in [DeviceMode::Grouped, DeviceMode::Individual] {
            for d in devices_for(&t, &options(mode, GroupBy::Numanode, "")).unwrap() {
                assert_eq!(
                    d.attributes.as_ref().unwrap()[ATTR_SMT_ENABLED].bool,
                    Some(false)
                );
            }
        }
    }

    #[test]
    fn node_allocatable_mapping_on_and_off() {
        let t = machine();
        let json =
            |o: &DeviceOptions| serde_json::to_value(&devices_for(&t, o).unwrap()[0]).unwrap();
        let mut grouped = options(DeviceMode::Grouped, GroupBy::Numanode, "");
        assert_eq!(
            json(&grouped)["nodeAllocatableResources"],
            serde_json::json!({"cpu": {"mapping": {"capacityKey": "dra.cpu/cpu", "capacityMultiplier": "1"}}})
        );
        let mut individual = options(DeviceMode::Individual, GroupBy::Numanode, "");
        assert_eq!(
            json(&individual)["nodeAllocatableResources"],
            serde_json::json!({"cpu": {"mapping": {"deviceMultiplier": "1"}}})
        );
        grouped.node_allocatable_mapping = false;
        individual.node_allocatable_mapping = false;
        assert!(json(&grouped).get("nodeAllocatableResources").is_none());
        assert!(json(&individual).get("nodeAllocatableResources").is_none());
    }

    #[test]
    fn reserved_cpus_are_never_published() {
        let t = machine();
        let reserved = cs("0,5,13");
        for (mode, group_by) in [
            (DeviceMode::Individual, GroupBy::Numanode),
            (DeviceMode::Grouped, GroupBy::Numanode),
            (DeviceMode::Grouped, GroupBy::Socket),
            (DeviceMode::Grouped, GroupBy::Machine),
        ] {
            let opts = DeviceOptions {
                reserved: reserved.clone(),
                ..options(mode, group_by, "")
            };
            let planned = plan_devices(&t, &opts).unwrap();
            let published = planned.iter().fold(CpuSet::new(), |a, d| a.union(&d.cpus));
            assert_eq!(
                published,
                t.online().difference(&reserved),
                "{mode} {group_by}"
            );
            let devices = build_devices(&t, &planned, true);
            for d in devices {
                if let Some(cpu) = attr_int(&d, ATTR_CPU_ID) {
                    assert!(!reserved.contains(cpu as u32), "{}", d.name);
                }
            }
        }
    }

    #[test]
    fn tuning_attributes_say_what_the_node_honours() {
        let t = machine();
        let opts = options(DeviceMode::Individual, GroupBy::Numanode, "");
        let mut devices = devices_for(&t, &opts).unwrap();
        let support = NodeSupport {
            load_balancing: Some("not yet".into()),
            governor: None,
            governors: ["performance".to_string(), "powersave".to_string()].into(),
            ..NodeSupport::default()
        };
        assert_eq!(
            add_tuning_attributes(&mut devices, &support),
            Vec::<String>::new()
        );
        for device in &devices {
            let attributes = device.attributes.as_ref().unwrap();
            assert_eq!(attributes[ATTR_IRQ_ISOLATION].bool, Some(true));
            assert_eq!(attributes[ATTR_CFS_QUOTA_CONTROL].bool, Some(true));
            assert_eq!(attributes[ATTR_ISOLATED_PARTITION].bool, Some(false));
            assert_eq!(attributes[ATTR_IDLE_LATENCY_CONTROL].bool, Some(true));
            assert_eq!(
                attributes[ATTR_GOVERNORS].string.as_deref(),
                Some("performance,powersave")
            );
        }
        // Without cpufreq there is no governors attribute; everything is false when off.
        let mut devices = devices_for(&t, &opts).unwrap();
        add_tuning_attributes(&mut devices, &NodeSupport::none("off"));
        let attributes = devices[0].attributes.as_ref().unwrap();
        assert_eq!(attributes[ATTR_IRQ_ISOLATION].bool, Some(false));
        assert!(!attributes.contains_key(ATTR_GOVERNORS));
        // A governors list longer than an attribute value is cut at a comma.
        let many = NodeSupport {
            governor: None,
            governors: (0..12).map(|i| format!("governor{i:02}")).collect(),
            ..NodeSupport::default()
        };
        let mut devices = devices_for(&t, &opts).unwrap();
        add_tuning_attributes(&mut devices, &many);
        let text = devices[0].attributes.as_ref().unwrap()[ATTR_GOVERNORS]
            .string
            .clone()
            .unwrap();
        assert!(
            text.len() <= 64 && text.ends_with(|c: char| c.is_ascii_digit()),
            "{text}"
        );
    }
}
