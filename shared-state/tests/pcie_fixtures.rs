//! PCIe root discovery on the sysfs trees with PCI devices in
//! `tests/fixtures/sysfs-pci` (see `make-fixtures.py` there): the roots,
//! where each one's locality comes from, and the roots per NUMA node.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared_state::topology::pcie::{Locality, PcieRoots};
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs-pci")
        .join(name)
}

fn set(list: &str) -> CpuSet {
    CpuSet::parse_cpulist(list).expect("cpulist")
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A fixture, its roots with their locality, and the roots per NUMA node.
type Case = (
    &'static str,
    Vec<(&'static str, Locality)>,
    BTreeMap<u32, Vec<String>>,
);

#[test]
fn discovery_per_fixture_table() {
    let cases: [Case; 2] = [
        (
            "2s-nic-node1-gpu-node0",
            vec![
                ("pci0000:00", Locality::Cpus(set("0-1,4-5"))),
                ("pci0000:40", Locality::Cpus(set("0-1,4-5"))),
                ("pci0000:80", Locality::Cpus(set("2-3,6-7"))),
                ("pci0000:c0", Locality::Cpus(set("2-3,6-7"))),
            ],
            BTreeMap::from([
                (0, names(&["pci0000:00", "pci0000:40"])),
                (1, names(&["pci0000:80", "pci0000:c0"])),
            ]),
        ),
        (
            "2n-root-without-node",
            vec![
                ("pci0000:00", Locality::Cpus(set("0-3"))),
                // No cpulistaffinity: the functions' numa_node (1 and -1).
                ("pci0000:80", Locality::NumaNodes(BTreeSet::from([1]))),
            ],
            BTreeMap::from([
                (0, names(&["pci0000:00"])),
                (1, names(&["pci0000:00", "pci0000:80"])),
            ]),
        ),
    ];
    for (name, roots_want, by_node_want) in cases {
        let root = fixture(name);
        let topology = Topology::discover(&root).expect("topology");
        let roots = PcieRoots::discover(&root).expect("roots");
        let got: Vec<(&str, Locality)> = roots
            .roots()
            .iter()
            .map(|r| (r.name.as_str(), r.locality.clone()))
            .collect();
        assert_eq!(got, roots_want, "{name}");
        assert_eq!(roots.by_numa_node(&topology), by_node_want, "{name}");
        assert!(roots.cpus_without_root(&topology).is_empty(), "{name}");
    }
}

#[test]
fn a_tree_without_root_complexes_has_no_roots() {
    // A CPU-only tree: discovery finds nothing rather than failing.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("sys/devices/system/cpu")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("sys/devices/platform")).expect("mkdir");
    assert!(PcieRoots::discover(dir.path()).expect("roots").is_empty());
}
