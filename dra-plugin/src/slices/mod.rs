//! The ResourceSlices that publish this node's CPUs, built from the discovered
//! topology and the device options. Pure: the same input always gives the
//! same objects, so the publisher can compare what it wants with what the API
//! server holds, and `dra-plugin slices` prints exactly what would be sent.
//!
//! Contract (compatible with the upstream CPU DRA driver):
//! - individual mode: one device per allocatable CPU, `cpudev%03d`, numbered
//!   core by core so the hardware threads of one core get consecutive numbers
//!   (the scheduler hands out devices in order, which keeps a small claim on
//!   whole cores);
//! - grouped mode: one device per NUMA node (`cpudevnuma%03d`), socket
//!   (`cpudevsocket%03d`) or the whole machine (`cpudevmachine`), shareable,
//!   with consumable capacity `dra.cpu/cpu` = its allocatable CPUs;
//! - reserved CPUs are never published;
//! - at most [`MAX_DEVICES_PER_SLICE`] devices per slice
//!   ([`MAX_DEVICES_PER_SLICE_WITH_LIST_ATTRIBUTES`] once a device carries a
//!   list-typed attribute); one pool per node, named after the node, split
//!   over as many slices as needed;
//! - with `--expose-pcie-roots`, `resource.kubernetes.io/pcieRoot` (a list of
//!   strings, KEP-5491) on every device: the PCIe roots local to any of its
//!   CPUs (see [`shared_state::topology::pcie`]).

pub mod device_attributes;

use crate::devices::{plan_devices, DeviceOptions};
use crate::k8s_names::{is_dns_subdomain, is_driver_name};
use crate::slice_error::SliceError;
use device_attributes::{add_pcie_roots, build_devices, is_list_attribute, LeftOutRoots};
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use shared_state::topology::pcie::PcieRoots;
use shared_state::topology::Topology;
use std::collections::BTreeMap;

/// The API server refuses a slice with more devices than this.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// ... and, from 1.36, with more than this once any of its devices carries a
/// list-typed attribute (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
pub const MAX_DEVICES_PER_SLICE_WITH_LIST_ATTRIBUTES: usize = 64;
/// Attribute values of one device, each item of a list counted
/// (`ResourceSliceMaxAttributeValuesPerDevice`).
pub const MAX_ATTRIBUTE_VALUES_PER_DEVICE: usize = 48;
/// Attributes and capacities of one device
/// (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`).
pub const MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: usize = 32;
/// Label on every slice this product publishes, with [`MANAGED_BY`].
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "dra-cpu";
/// Label carrying the driver name, so two installations with different
/// driver names on one node never touch each other's slices.
pub const LABEL_DRIVER: &str = "dra.cpu/driver";

pub const ATTR_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
pub const ATTR_NUMA_NODE_ID: &str = "dra.cpu/numaNodeID";
pub const ATTR_NUMA_NODE_COMPAT: &str = "dra.net/numaNode";
pub const ATTR_SOCKET_ID: &str = "dra.cpu/socketID";
pub const ATTR_CACHE_L3_ID: &str = "dra.cpu/cacheL3ID";
pub const ATTR_CORE_ID: &str = "dra.cpu/coreID";
pub const ATTR_CPU_ID: &str = "dra.cpu/cpuID";
pub const ATTR_CORE_TYPE: &str = "dra.cpu/coreType";
pub const ATTR_SMT_ENABLED: &str = "dra.cpu/smtEnabled";
pub const ATTR_NUM_CPUS: &str = "dra.cpu/numCPUs";
/// The standard PCIe root attribute, list-typed as the upstream driver
/// publishes it (`strings`; the `DRAListTypeAttributes` gate, 1.36+).
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Tuning a claim may ask for on this node (with `--low-latency-tuning`),
/// so that a selector can require it: device interrupts kept off its CPUs,
/// CFS quota off, load balancing off, an idle-state bound, and the cpufreq
/// governors offered (comma-separated; absent without cpufreq).
pub const ATTR_IRQ_ISOLATION: &str = "dra.cpu/irqIsolation";
pub const ATTR_CFS_QUOTA_CONTROL: &str = "dra.cpu/cfsQuotaControl";
pub const ATTR_ISOLATED_PARTITION: &str = "dra.cpu/isolatedPartition";
pub const ATTR_IDLE_LATENCY_CONTROL: &str = "dra.cpu/idleLatencyControl";
pub const ATTR_GOVERNORS: &str = "dra.cpu/governors";

/// `cacheL3ID` of a CPU without an L3 cache (some Arm parts), as the upstream
/// driver publishes it, so selectors written for it keep working.
pub(crate) const NO_L3_CACHE_ID: i64 = -1;

/// The Node that owns the slices (they go when the Node goes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOwner {
    pub name: String,
    pub uid: String,
}

/// Devices per slice for these devices: fewer once one carries a list.
pub fn max_devices_per_slice(devices: &[Device]) -> usize {
    let any_list = devices.iter().any(|d| {
        d.attributes
            .iter()
            .flat_map(BTreeMap::values)
            .any(is_list_attribute)
    });
    if any_list {
        MAX_DEVICES_PER_SLICE_WITH_LIST_ATTRIBUTES
    } else {
        MAX_DEVICES_PER_SLICE
    }
}

/// The driver name as it appears in slice names: already a DNS subdomain
/// once validated, but anything else is folded to `-` so a name never fails
/// on a character.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

/// Longest object name the API server takes (a DNS subdomain).
const MAX_NAME_LEN: usize = 253;

/// `<node>-<driver>-<index>`: deterministic, so a restart addresses the
/// same objects and server-side apply updates them in place. A node name of
/// any valid length (up to 253 characters) still gets a valid name: where
/// the full name is too long, `<node>-<driver>` is cut short and a hash of
/// it keeps names of different nodes apart, `<start>-<hash>-<index>` (the
/// Go plugin helper lets the API server truncate a `generateName` instead,
/// which gives random names that a restart cannot find again).
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let base = format!("{node}-{}", sanitize(driver));
    let full = format!("{base}-{index}");
    if full.len() <= MAX_NAME_LEN {
        return full;
    }
    let suffix = format!("-{:016x}-{index}", fnv1a64(base.as_bytes()));
    let keep = MAX_NAME_LEN.saturating_sub(suffix.len());
    // Every character of `base` is ASCII, so any cut is a char boundary; a
    // name part must end with a letter or digit.
    let start = base[..keep.min(base.len())].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{start}{suffix}")
}

/// FNV-1a, 64 bits: a stable hash (the same on every build and machine),
/// which slice names need and `std`'s hasher does not promise.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The labels on every slice of ours.
pub fn slice_labels(driver: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_DRIVER.to_string(), driver.to_string()),
    ])
}

/// Label selector matching exactly the slices [`slice_labels`] marks.
pub fn label_selector(driver: &str) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_DRIVER}={driver}")
}

/// Field selector for this node's slices.
pub fn field_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// The pool's slices: devices in order, [`max_devices_per_slice`] per slice,
/// every slice carrying the pool's generation and slice count. A node
/// without allocatable CPUs still gets one empty slice, which tells the
/// scheduler the pool exists and is empty.
pub fn build_slices(
    driver: &str,
    node: &str,
    owner: Option<&NodeOwner>,
    devices: Vec<Device>,
    generation: i64,
) -> Result<Vec<ResourceSlice>, SliceError> {
    if !is_dns_subdomain(node) {
        return Err(SliceError::InvalidNodeName(node.to_string()));
    }
    if !is_driver_name(driver) {
        return Err(SliceError::InvalidDriverName(driver.to_string()));
    }
    let per_slice = max_devices_per_slice(&devices);
    let mut chunks: Vec<Vec<Device>> = Vec::new();
    let mut devices = devices.into_iter().peekable();
    while devices.peek().is_some() {
        chunks.push(devices.by_ref().take(per_slice).collect());
    }
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    let owner_references = owner.map(|o| {
        vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Node".to_string(),
            name: o.name.clone(),
            uid: o.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    chunks
        .into_iter()
        .enumerate()
        .map(|(index, devices)| {
            let name = slice_name(node, driver, index);
            Ok(ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some(slice_labels(driver)),
                    owner_references: owner_references.clone(),
                    ..Default::default()
                },
                spec: ResourceSliceSpec {
                    driver: driver.to_string(),
                    node_name: Some(node.to_string()),
                    pool: ResourcePool {
                        name: node.to_string(),
                        generation,
                        resource_slice_count: count,
                    },
                    devices: Some(devices),
                    ..Default::default()
                },
            })
        })
        .collect()
}

/// Topology and options to the devices to publish, in one step.
pub fn devices_for(
    topology: &Topology,
    options: &DeviceOptions,
) -> Result<Vec<Device>, SliceError> {
    let planned = plan_devices(topology, options)?;
    Ok(build_devices(
        topology,
        &planned,
        options.node_allocatable_mapping,
    ))
}

/// [`devices_for`], with [`ATTR_PCIE_ROOT`] from `roots` where given; the
/// roots left out of a device for its attribute limits come back too.
pub fn devices_with_pcie_roots(
    topology: &Topology,
    options: &DeviceOptions,
    roots: Option<&PcieRoots>,
) -> Result<(Vec<Device>, Vec<LeftOutRoots>), SliceError> {
    let planned = plan_devices(topology, options)?;
    let mut devices = build_devices(topology, &planned, options.node_allocatable_mapping);
    let left_out = match roots {
        Some(roots) => add_pcie_roots(&mut devices, &planned, topology, roots),
        None => Vec::new(),
    };
    Ok((devices, left_out))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::devices::{DeviceMode, GroupBy};
    use proptest::prelude::*;
    use shared_state::assignment::CPU_CAPACITY;
    use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
    use shared_state::CpuSet;
    use std::collections::BTreeSet;

    pub(crate) fn cs(list: &str) -> CpuSet {
        CpuSet::parse_cpulist(list).unwrap()
    }

    /// 2 sockets × 2 NUMA nodes × 2 cores × 2 threads = 16 CPUs, threads of
    /// core N are N and N+8.
    pub(crate) fn machine() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 2,
            l3_per_numa: 1,
            cores_per_l3: 2,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    /// 2 sockets × 75 cores × 2 threads: 300 CPUs, more individual devices
    /// than two slices hold.
    pub(crate) fn machine_300() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 75,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    pub(crate) fn options(mode: DeviceMode, group_by: GroupBy, reserved: &str) -> DeviceOptions {
        DeviceOptions {
            mode,
            group_by,
            reserved: cs(reserved),
            node_allocatable_mapping: true,
        }
    }

    pub(crate) fn attr_names(d: &Device) -> BTreeSet<&str> {
        d.attributes
            .as_ref()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect()
    }

    pub(crate) fn attr_int(d: &Device, key: &str) -> Option<i64> {
        d.attributes.as_ref()?.get(key)?.int
    }

    pub(crate) fn capacity(d: &Device) -> Option<&str> {
        Some(d.capacity.as_ref()?.get(CPU_CAPACITY)?.value.0.as_str())
    }

    #[test]
    fn list_attributes_halve_the_devices_per_slice() {
        let t = build(&Shape {
            sockets: 1,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 50,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        let opts = options(DeviceMode::Individual, GroupBy::Numanode, "");
        let sizes = |devices: Vec<Device>| -> Vec<usize> {
            build_slices("dra.cpu", "n", None, devices, 1)
                .unwrap()
                .iter()
                .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                .collect()
        };
        let plain = devices_for(&t, &opts).unwrap();
        assert_eq!(sizes(plain), vec![100]);
        let one_root = PcieRoots::new(vec![shared_state::topology::pcie::PcieRoot {
            name: "pci0000:00".into(),
            locality: shared_state::topology::pcie::Locality::Anywhere,
        }]);
        let (with, _) = devices_with_pcie_roots(&t, &opts, Some(&one_root)).unwrap();
        assert_eq!(sizes(with), vec![64, 36]);
    }

    #[test]
    fn errors_name_the_bad_input() {
        let t = machine();
        let err = plan_devices(
            &t,
            &options(DeviceMode::Grouped, GroupBy::Numanode, "3,16-17"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "reserved CPUs 3,16-17: CPUs 16-17 are not online (online: 0-15)"
        );
        let empty = Topology {
            cpus: vec![],
            isolated: CpuSet::new(),
        };
        assert_eq!(
            plan_devices(
                &empty,
                &options(DeviceMode::Individual, GroupBy::Numanode, "")
            ),
            Err(SliceError::NoOnlineCpus)
        );
        let err = build_slices("dra.cpu", "Node_1", None, vec![], 1).unwrap_err();
        assert!(err.to_string().contains("\"Node_1\""), "{err}");
        let err = build_slices("DRA.cpu", "node-1", None, vec![], 1).unwrap_err();
        assert!(err.to_string().contains("\"DRA.cpu\""), "{err}");
        let long_node = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(55)
        );
        assert_eq!(long_node.len(), 247);
        let slices = build_slices("dra.cpu", &long_node, None, vec![], 1).expect("a long node");
        let name = slices[0].metadata.name.clone().unwrap_or_default();
        assert!(name.len() <= 253 && is_dns_subdomain(&name), "{name}");
    }

    #[test]
    fn slice_names_of_long_node_names_stay_valid_distinct_and_stable() {
        let label = |c: &str, n: usize| c.repeat(n);
        let longest = format!(
            "{}.{}.{}.{}",
            label("a", 63),
            label("b", 63),
            label("c", 63),
            label("d", 61)
        );
        assert_eq!(longest.len(), 253);
        let nodes = [
            "node-1".to_string(),
            label("n", 63),
            format!("{}.{}.{}", label("x", 63), label("y", 63), label("z", 63)),
            longest.clone(),
            format!("{}e", &longest[..252]),
            // A cut that would end on '.' or '-'.
            format!("{}.{}", label("p", 230), label("q", 22)),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for node in &nodes {
            assert!(is_dns_subdomain(node), "fixture {node}");
            for index in [0, 7, 1234] {
                let name = slice_name(node, "dra.cpu", index);
                assert!(name.len() <= 253, "{} chars: {name}", name.len());
                assert!(is_dns_subdomain(&name), "not a DNS subdomain: {name}");
                assert!(name.ends_with(&format!("-{index}")), "{name}");
                assert_eq!(name, slice_name(node, "dra.cpu", index), "stable");
                assert!(seen.insert(name.clone()), "{name} given twice");
            }
        }
        // Short names keep the plain form, so existing slices are found.
        assert_eq!(slice_name("node-1", "dra.cpu", 3), "node-1-dra.cpu-3");
    }

    #[test]
    fn every_cpu_reserved_gives_one_empty_slice() {
        let t = machine();
        let devices = devices_for(
            &t,
            &options(DeviceMode::Individual, GroupBy::Numanode, "0-15"),
        )
        .unwrap();
        assert!(devices.is_empty());
        let slices = build_slices("dra.cpu", "node-1", None, devices, 3).unwrap();
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
        assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
    }

    #[test]
    fn slices_split_at_128_devices() {
        let big = machine_300();
        let devices = devices_for(
            &big,
            &options(DeviceMode::Individual, GroupBy::Numanode, ""),
        )
        .unwrap();
        assert_eq!(devices.len(), 300);
        let owner = NodeOwner {
            name: "node-1".to_string(),
            uid: "u-1".to_string(),
        };
        let slices = build_slices("dra.cpu", "node-1", Some(&owner), devices, 7).unwrap();
        let sizes: Vec<usize> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, vec![128, 128, 44]);
        let names: Vec<&str> = slices
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(
            names,
            vec!["node-1-dra.cpu-0", "node-1-dra.cpu-1", "node-1-dra.cpu-2"]
        );
        for s in &slices {
            assert_eq!(s.spec.pool.name, "node-1");
            assert_eq!(s.spec.pool.generation, 7);
            assert_eq!(s.spec.pool.resource_slice_count, 3);
            assert_eq!(s.spec.node_name.as_deref(), Some("node-1"));
            assert_eq!(s.spec.driver, "dra.cpu");
            assert_eq!(s.metadata.labels.as_ref(), Some(&slice_labels("dra.cpu")));
            let refs = s.metadata.owner_references.as_ref().unwrap();
            assert_eq!(
                (refs[0].kind.as_str(), refs[0].uid.as_str()),
                ("Node", "u-1")
            );
        }
        // Devices stay in order across the split.
        assert_eq!(
            slices[1].spec.devices.as_ref().unwrap()[0].name,
            "cpudev128"
        );
    }

    #[test]
    fn names_and_selectors() {
        assert_eq!(slice_name("node-1", "dra.cpu", 0), "node-1-dra.cpu-0");
        assert_eq!(slice_name("n", "Weird_Driver", 2), "n-weird-driver-2");
        assert_eq!(
            label_selector("dra.cpu"),
            "app.kubernetes.io/managed-by=dra-cpu,dra.cpu/driver=dra.cpu"
        );
        assert_eq!(field_selector("node-1"), "spec.nodeName=node-1");
    }

    fn arb_shape() -> impl Strategy<Value = Shape> {
        (1u32..3, 1u32..3, 1u32..3, 1u32..6, 1u32..3, any::<bool>()).prop_map(
            |(sockets, numa, l3, cores, threads, split)| Shape {
                sockets,
                numa_per_socket: numa,
                l3_per_numa: l3,
                cores_per_l3: cores,
                threads_per_core: threads,
                sibling_numbering: if split {
                    SiblingNumbering::Split
                } else {
                    SiblingNumbering::Adjacent
                },
            },
        )
    }

    proptest! {
        #[test]
        fn published_devices_cover_exactly_the_allocatable_cpus(
            shape in arb_shape(),
            reserved_bits in any::<u64>(),
            mode_index in 0usize..4,
        ) {
            let t = build(&shape);
            let reserved: CpuSet = t.online().iter().filter(|c| reserved_bits >> (c % 64) & 1 == 1).collect();
            let (mode, group_by) = [
                (DeviceMode::Individual, GroupBy::Numanode),
                (DeviceMode::Grouped, GroupBy::Numanode),
                (DeviceMode::Grouped, GroupBy::Socket),
                (DeviceMode::Grouped, GroupBy::Machine),
            ][mode_index];
            let opts = DeviceOptions { mode, group_by, reserved: reserved.clone(), node_allocatable_mapping: true };
            let planned = plan_devices(&t, &opts).unwrap();
            let allocatable = t.online().difference(&reserved);
            // Groups are disjoint and together exactly the allocatable CPUs.
            let mut union = CpuSet::new();
            for d in &planned {
                prop_assert!(!d.cpus.is_empty());
                prop_assert!(union.is_disjoint(&d.cpus));
                union = union.union(&d.cpus);
            }
            prop_assert_eq!(&union, &allocatable);
            let names: BTreeSet<&str> = planned.iter().map(|d| d.name.as_str()).collect();
            prop_assert_eq!(names.len(), planned.len());
            if mode == DeviceMode::Individual {
                // Threads of one core form one run of consecutive numbers.
                let cores: Vec<&CpuSet> = planned.iter().map(|d| t.core_of(d.cpus.first().unwrap()).unwrap()).collect();
                let mut seen: Vec<&CpuSet> = Vec::new();
                for (i, core) in cores.iter().enumerate() {
                    if i > 0 && cores[i - 1] != *core {
                        prop_assert!(!seen.contains(core), "core {} split", core);
                    }
                    seen.push(core);
                }
            }
            let devices = build_devices(&t, &planned, true);
            let slices = build_slices("dra.cpu", "node-1", None, devices, 1).unwrap();
            let total: usize = slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
            prop_assert_eq!(total, planned.len());
            for s in &slices {
                prop_assert!(s.spec.devices.as_ref().map_or(0, Vec::len) <= MAX_DEVICES_PER_SLICE);
                prop_assert_eq!(s.spec.pool.resource_slice_count as usize, slices.len());
            }
        }
    }
}
