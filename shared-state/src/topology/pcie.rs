//! PCIe root complexes and the CPUs local to each, from a sysfs root.
//!
//! A root complex is a directory `sys/devices/pci<domain>:<bus>` (the kernel
//! names it `"pci%04x:%02x"`, so a domain past `ffff`, as Intel VMD uses,
//! has more digits). Its name is the value of the standard attribute
//! `resource.kubernetes.io/pcieRoot` that other DRA drivers publish for
//! their devices (`k8s.io/dynamic-resource-allocation/deviceattribute`'s
//! `GetPCIeRootAttributeByPCIBusID` takes the first path segment under
//! `/sys/devices` of a PCI device), so a CPU device carrying the roots local
//! to its CPUs can be matched with a NIC or GPU by `matchAttribute`.
//!
//! Which CPUs are local to a root, in this order:
//! 1. the root bus's `pci_bus/<domain>:<bus>/cpulistaffinity`, the kernel's
//!    own answer and what the upstream driver reads;
//! 2. where that file is absent, the NUMA nodes the root's PCI devices name
//!    in their `numa_node` files (every PCI function below the root, bridges
//!    included);
//! 3. where no device names a node (`numa_node` is `-1`: the firmware gave
//!    the host bridge no proximity domain, common in VMs and on one-node
//!    machines), the root is local to every CPU. That is what the kernel
//!    itself reports for such a bus (its `cpulistaffinity` is every online
//!    CPU on x86), so the upstream driver publishes the same, and a NIC
//!    there can still be matched with CPUs of any node.
//!
//! Reading is strict where a file exists: a `cpulistaffinity` or
//! `numa_node` that does not parse is an error naming the path and its
//! content. Entries of `sys/devices` that are not root complexes are skipped.

use super::discover::files::{dir_entries, parse_cpulist_at, quote, read_optional};
use super::discover::TopologyError;
use super::Topology;
use crate::cpuset::CpuSet;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// PCI bridges nest a few levels deep; the bound keeps a malformed tree
/// (or a bind mount looping back) from walking forever.
const MAX_PCI_DEPTH: usize = 16;

/// Where a root's locality came from, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locality {
    /// The root bus's `cpulistaffinity`.
    Cpus(CpuSet),
    /// The nodes named by the root's devices' `numa_node` (no affinity file).
    NumaNodes(BTreeSet<u32>),
    /// No device names a node: local to every CPU.
    Anywhere,
}

/// One PCIe root complex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcieRoot {
    /// `pci<domain>:<bus>`, e.g. `pci0000:00`.
    pub name: String,
    pub locality: Locality,
}

impl PcieRoot {
    /// Whether any CPU of `cpus` is local to this root.
    pub fn is_local_to_any(&self, cpus: &CpuSet, topology: &Topology) -> bool {
        match &self.locality {
            Locality::Cpus(local) => !local.is_disjoint(cpus),
            Locality::NumaNodes(nodes) => cpus
                .iter()
                .filter_map(|id| topology.cpu(id))
                .any(|cpu| nodes.contains(&cpu.numa)),
            Locality::Anywhere => !cpus.is_empty(),
        }
    }
}

/// The PCIe roots of a machine, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PcieRoots {
    roots: Vec<PcieRoot>,
}

impl PcieRoots {
    pub fn new(mut roots: Vec<PcieRoot>) -> PcieRoots {
        roots.sort_by(|a, b| a.name.cmp(&b.name));
        roots.dedup_by(|a, b| a.name == b.name);
        PcieRoots { roots }
    }

    /// The root complexes under `sysfs_root` (the directory holding `sys/`).
    /// A tree without `sys/devices` has none.
    pub fn discover(sysfs_root: &Path) -> Result<PcieRoots, TopologyError> {
        let devices = sysfs_root.join("sys/devices");
        let mut roots = Vec::new();
        for (name, dir) in dir_entries(&devices)? {
            let Some((domain, bus)) = parse_root_name(&name) else {
                continue;
            };
            let affinity = dir
                .join("pci_bus")
                .join(format!("{domain}:{bus}"))
                .join("cpulistaffinity");
            let locality = match read_optional(&affinity)? {
                Some((path, text)) => Locality::Cpus(parse_cpulist_at(&path, &text)?),
                None => {
                    let mut nodes = BTreeSet::new();
                    collect_numa_nodes(&dir, 0, &mut nodes)?;
                    if nodes.is_empty() {
                        Locality::Anywhere
                    } else {
                        Locality::NumaNodes(nodes)
                    }
                }
            };
            roots.push(PcieRoot { name, locality });
        }
        Ok(PcieRoots::new(roots))
    }

    pub fn roots(&self) -> &[PcieRoot] {
        &self.roots
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The names of the roots local to any CPU of `cpus`, sorted: the
    /// `pcieRoot` list of a device standing for those CPUs (a group's union,
    /// as the upstream driver publishes it).
    pub fn local_to(&self, cpus: &CpuSet, topology: &Topology) -> Vec<String> {
        self.roots
            .iter()
            .filter(|root| root.is_local_to_any(cpus, topology))
            .map(|root| root.name.clone())
            .collect()
    }

    /// NUMA node → the roots local to its online CPUs, for every node with
    /// online CPUs.
    pub fn by_numa_node(&self, topology: &Topology) -> BTreeMap<u32, Vec<String>> {
        topology
            .numa_nodes()
            .into_iter()
            .map(|node| (node, self.local_to(&topology.cpus_in_numa(node), topology)))
            .collect()
    }

    /// Online CPUs local to no root (worth a log line: their devices carry
    /// no `pcieRoot`).
    pub fn cpus_without_root(&self, topology: &Topology) -> CpuSet {
        topology
            .cpus
            .iter()
            .filter(|cpu| {
                let one: CpuSet = std::iter::once(cpu.id).collect();
                !self.roots.iter().any(|r| r.is_local_to_any(&one, topology))
            })
            .map(|cpu| cpu.id)
            .collect()
    }
}

/// `pci<domain>:<bus>` as the kernel writes it: lowercase hex, a domain of
/// at least four digits (more past `ffff`), a bus of two. Returns the
/// domain and bus text.
pub fn parse_root_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("pci")?;
    let (domain, bus) = rest.split_once(':')?;
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let ok = (4..=8).contains(&domain.len()) && bus.len() == 2 && hex(domain) && hex(bus);
    ok.then_some((domain, bus))
}

/// A PCI function's directory name, `<domain>:<bus>:<device>.<function>`.
fn is_pci_function_name(name: &str) -> bool {
    let hex = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let Some((domain_bus, dev_fn)) = name.rsplit_once(':') else {
        return false;
    };
    let Some((domain, bus)) = domain_bus.split_once(':') else {
        return false;
    };
    let Some((device, function)) = dev_fn.split_once('.') else {
        return false;
    };
    domain.len() >= 4
        && hex(domain)
        && bus.len() == 2
        && hex(bus)
        && device.len() == 2
        && hex(device)
        && function.len() == 1
        && function.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

/// The nodes named by the `numa_node` files of the PCI functions under
/// `dir`. Only real directories with a PCI function's name are entered: the
/// links of a device (`driver`, `subsystem`, `firmware_node`) lead back up
/// the tree.
fn collect_numa_nodes(
    dir: &Path,
    depth: usize,
    nodes: &mut BTreeSet<u32>,
) -> Result<(), TopologyError> {
    if depth > MAX_PCI_DEPTH {
        return Ok(());
    }
    for (name, path) in dir_entries(dir)? {
        if !is_pci_function_name(&name) {
            continue;
        }
        let is_dir = std::fs::symlink_metadata(&path)
            .map(|m| m.file_type().is_dir())
            .unwrap_or(false);
        if !is_dir {
            continue;
        }
        if let Some((file, text)) = read_optional(&path.join("numa_node"))? {
            if let Some(node) = parse_numa_node(&file, &text)? {
                nodes.insert(node);
            }
        }
        collect_numa_nodes(&path, depth + 1, nodes)?;
    }
    Ok(())
}

/// A PCI function's `numa_node`: a node id, or `-1` (no proximity
/// information) as `None`.
fn parse_numa_node(path: &Path, text: &str) -> Result<Option<u32>, TopologyError> {
    let t = text.trim();
    if t == "-1" {
        return Ok(None);
    }
    t.parse::<u32>()
        .map(Some)
        .map_err(|_| TopologyError::Malformed {
            path: path.to_path_buf(),
            content: quote(text),
            reason: "expected a NUMA node id or -1".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::synthetic::{build, Shape, SiblingNumbering};
    use std::fs;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    /// 2 sockets, one NUMA node each, 2 cores × 2 threads per socket:
    /// node 0 = 0,1,4,5; node 1 = 2,3,6,7.
    fn two_nodes() -> Topology {
        build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 2,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        })
    }

    struct Tree(tempfile::TempDir);

    impl Tree {
        fn new() -> Tree {
            Tree(tempfile::tempdir().expect("tempdir"))
        }
        fn write(&self, rel: &str, content: &str) -> &Tree {
            let p = self.0.path().join("sys/devices").join(rel);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(p, content).expect("write");
            self
        }
        fn root(&self) -> &Path {
            self.0.path()
        }
    }

    #[test]
    fn root_names_table() {
        let cases = [
            ("pci0000:00", Some(("0000", "00"))),
            ("pci0000:c0", Some(("0000", "c0"))),
            ("pci10000:00", Some(("10000", "00"))),
            ("pci0000:0", None),
            ("pci000:00", None),
            ("pci0000:C0", None),
            ("pci0000-00", None),
            // Domain 0xe0000 prints so: the name is not "pcie" plus more.
            ("pcie0000:00", Some(("e0000", "00"))),
            ("pcig000:00", None),
            ("platform", None),
            ("pci0000:00:01.0", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(parse_root_name(name), want, "{name:?}");
        }
        assert!(is_pci_function_name("0000:00:01.0"));
        assert!(is_pci_function_name("10000:e1:00.7"));
        assert!(!is_pci_function_name("0000:00:01.8"));
        assert!(!is_pci_function_name("pci_bus"));
        assert!(!is_pci_function_name("0000:00:1.0"));
    }

    #[test]
    fn locality_sources_table() {
        let t = Tree::new();
        // Affinity file wins over the devices' numa_node.
        t.write("pci0000:00/pci_bus/0000:00/cpulistaffinity", "0-1,4-5\n")
            .write("pci0000:00/0000:00:00.0/numa_node", "1\n");
        // No affinity file: the nodes of the devices, nested ones included.
        t.write("pci0000:80/0000:80:01.0/numa_node", "-1\n")
            .write("pci0000:80/0000:80:01.0/0000:81:00.0/numa_node", "1\n");
        // No node anywhere: local to every CPU.
        t.write("pci0000:40/0000:40:00.0/numa_node", "-1\n");
        // Not roots.
        t.write("platform/serial8250/numa_node", "7\n")
            .write("system/cpu/online", "0-7\n");
        let roots = PcieRoots::discover(t.root()).expect("discover");
        let got: Vec<(&str, &Locality)> = roots
            .roots()
            .iter()
            .map(|r| (r.name.as_str(), &r.locality))
            .collect();
        assert_eq!(
            got,
            vec![
                ("pci0000:00", &Locality::Cpus(set("0-1,4-5"))),
                ("pci0000:40", &Locality::Anywhere),
                ("pci0000:80", &Locality::NumaNodes(BTreeSet::from([1]))),
            ]
        );
    }

    #[test]
    fn roots_per_device_cpus_and_per_node() {
        let topo = two_nodes();
        let roots = PcieRoots::new(vec![
            PcieRoot {
                name: "pci0000:80".into(),
                locality: Locality::NumaNodes(BTreeSet::from([1])),
            },
            PcieRoot {
                name: "pci0000:00".into(),
                locality: Locality::Cpus(set("0-1,4-5")),
            },
            PcieRoot {
                name: "pci0000:40".into(),
                locality: Locality::Anywhere,
            },
            PcieRoot {
                name: "pci0000:c0".into(),
                locality: Locality::Cpus(CpuSet::new()),
            },
        ]);
        let cases = [
            ("0", vec!["pci0000:00", "pci0000:40"]),
            ("6", vec!["pci0000:40", "pci0000:80"]),
            ("1-2", vec!["pci0000:00", "pci0000:40", "pci0000:80"]),
            ("", vec![]),
        ];
        for (cpus, want) in cases {
            assert_eq!(roots.local_to(&set(cpus), &topo), want, "cpus {cpus:?}");
        }
        assert_eq!(
            roots.by_numa_node(&topo),
            BTreeMap::from([
                (0, vec!["pci0000:00".to_string(), "pci0000:40".to_string()]),
                (1, vec!["pci0000:40".to_string(), "pci0000:80".to_string()]),
            ])
        );
        assert_eq!(roots.cpus_without_root(&topo), CpuSet::new());
        let only_node0 = PcieRoots::new(vec![PcieRoot {
            name: "pci0000:00".into(),
            locality: Locality::Cpus(set("0-1,4-5")),
        }]);
        assert_eq!(only_node0.cpus_without_root(&topo), set("2-3,6-7"));
    }

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let cases = [
            ("pci0000:00/pci_bus/0000:00/cpulistaffinity", "zero\n"),
            ("pci0000:00/0000:00:00.0/numa_node", "node0\n"),
            ("pci0000:00/0000:00:00.0/numa_node", "-2\n"),
            ("pci0000:00/0000:00:01.0/0000:01:00.0/numa_node", "\u{0}\n"),
        ];
        for (rel, content) in cases {
            let t = Tree::new();
            t.write(rel, content);
            let err = PcieRoots::discover(t.root()).expect_err(rel);
            let text = err.to_string();
            assert!(text.contains(rel), "{rel}: {text}");
        }
    }

    #[test]
    fn a_tree_without_devices_has_no_roots() {
        let t = Tree::new();
        assert!(PcieRoots::discover(t.root()).expect("discover").is_empty());
        fs::create_dir_all(t.root().join("sys/devices/pci0000:00")).expect("mkdir");
        let roots = PcieRoots::discover(t.root()).expect("discover");
        assert_eq!(roots.roots()[0].locality, Locality::Anywhere);
    }

    #[test]
    fn links_out_of_the_tree_are_not_followed() {
        let t = Tree::new();
        t.write("pci0000:00/0000:00:00.0/numa_node", "-1\n");
        // A link named like a PCI function pointing back at the root.
        std::os::unix::fs::symlink(
            t.root().join("sys/devices/pci0000:00"),
            t.root()
                .join("sys/devices/pci0000:00/0000:00:00.0/0000:00:1f.0"),
        )
        .expect("symlink");
        t.write("other/0000:00:02.0/numa_node", "1\n");
        let roots = PcieRoots::discover(t.root()).expect("discover");
        assert_eq!(roots.roots()[0].locality, Locality::Anywhere);
    }
}
