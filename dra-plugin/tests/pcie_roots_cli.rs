//! `dra-plugin slices --expose-pcie-roots` on the sysfs trees with PCI
//! devices in `tests/fixtures/sysfs-pci` (written by `make-fixtures.py`
//! there): every device carries the roots local to its CPUs, a NIC's and a
//! GPU's root (resolved as Kubernetes' `GetPCIeRootAttributeByPCIBusID`
//! does it for their drivers) is on the CPU devices of their NUMA node, and
//! the printed slices are valid for the Kubernetes 1.36 and 1.37 schemas.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{printed_slices, slices_output};
use dra_cpu_tests::apiserver::schema::validate_k8s_objects;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs-pci")
        .join(name)
}

/// A writable copy of the fixture `name`'s `sys` tree in a temporary
/// directory (removed when the guard is dropped).
fn copy_of_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let status = Command::new("cp")
        .arg("-a")
        .arg(fixture(name).join("sys"))
        .arg(dir.path())
        .status()
        .expect("cp");
    assert!(status.success());
    dir
}

/// Device name → its pcieRoot list (`None` without the attribute); the
/// attribute must be list-typed.
fn roots_by_device(slices: &[Value]) -> BTreeMap<String, Option<Vec<String>>> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .map(|d| {
            let name = d["name"].as_str().unwrap_or_default().to_string();
            let roots = d["attributes"].get(PCIE_ROOT).map(|attr| {
                assert!(attr.get("string").is_none(), "{name}: {attr}");
                attr["strings"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{name}: {attr} is not a list"))
                    .iter()
                    .map(|v| v.as_str().unwrap_or_default().to_string())
                    .collect()
            });
            (name, roots)
        })
        .collect()
}

fn cpu_of(device: &Value) -> i64 {
    device["attributes"]["dra.cpu/cpuID"]["int"]
        .as_i64()
        .expect("cpuID")
}

/// Device name and the pcieRoot list it should carry.
type Expected<'a> = Vec<(&'a str, Option<Vec<String>>)>;

fn list(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| s.to_string()).collect())
}

/// The pcieRoot another DRA driver publishes for PCI function `bdf`: the
/// first segment under `sys/devices` of where `sys/bus/pci/devices/<bdf>`
/// points (`resolvePCIeRoot` in k8s.io/dynamic-resource-allocation).
fn root_of_pci_function(sysfs: &Path, bdf: &str) -> String {
    let link = sysfs.join("sys/bus/pci/devices").join(bdf);
    let target = std::fs::read_link(&link).expect("bus link");
    let resolved = link.parent().expect("parent").join(target);
    let resolved = std::fs::canonicalize(resolved).expect("canonical");
    let devices = std::fs::canonicalize(sysfs.join("sys/devices")).expect("devices");
    let rest = resolved.strip_prefix(&devices).expect("under sys/devices");
    rest.components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .expect("first segment")
        .to_string()
}

#[test]
fn two_sockets_with_a_gpu_on_node_0_and_a_nic_on_node_1() {
    let root = fixture("2s-nic-node1-gpu-node0");
    let node0 = list(&["pci0000:00", "pci0000:40"]);
    let node1 = list(&["pci0000:80", "pci0000:c0"]);
    let grouped: [(&[&str], Expected); 3] = [
        (
            &["--group-by", "numanode"],
            vec![
                ("cpudevnuma000", node0.clone()),
                ("cpudevnuma001", node1.clone()),
            ],
        ),
        (
            &["--group-by", "socket"],
            vec![
                ("cpudevsocket000", node0.clone()),
                ("cpudevsocket001", node1.clone()),
            ],
        ),
        (
            &["--group-by", "machine"],
            vec![(
                "cpudevmachine",
                list(&["pci0000:00", "pci0000:40", "pci0000:80", "pci0000:c0"]),
            )],
        ),
    ];
    let mut printed = Vec::new();
    for (args, want) in grouped {
        let mut args = args.to_vec();
        args.push("--expose-pcie-roots");
        let objects = printed_slices(&root, &args);
        let got = roots_by_device(&objects);
        let want: BTreeMap<String, Option<Vec<String>>> =
            want.into_iter().map(|(n, r)| (n.to_string(), r)).collect();
        assert_eq!(got, want, "{args:?}");
        printed.extend(objects);
    }
    let individual = printed_slices(
        &root,
        &["--cpu-device-mode", "individual", "--expose-pcie-roots"],
    );
    let devices: Vec<&Value> = individual
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(devices.len(), 8);
    let by_cpu: BTreeMap<i64, Option<Vec<String>>> = devices
        .iter()
        .map(|d| {
            let name = d["name"].as_str().unwrap_or_default();
            (cpu_of(d), roots_by_device(&individual)[name].clone())
        })
        .collect();
    for (cpu, roots) in &by_cpu {
        let want = if [0, 1, 4, 5].contains(cpu) {
            &node0
        } else {
            &node1
        };
        assert_eq!(roots, want, "cpu {cpu}");
    }
    // The GPU's and the NIC's own pcieRoot, as their drivers publish it,
    // is on every CPU device of their NUMA node and on no other.
    for (bdf, cpus) in [
        ("0000:01:00.0", [0, 1, 4, 5]),
        ("0000:81:00.0", [2, 3, 6, 7]),
        ("0000:81:00.1", [2, 3, 6, 7]),
    ] {
        let pcie_root = root_of_pci_function(&root, bdf);
        for (cpu, roots) in &by_cpu {
            let has = roots.as_ref().is_some_and(|r| r.contains(&pcie_root));
            assert_eq!(has, cpus.contains(cpu), "{bdf} ({pcie_root}) on cpu {cpu}");
        }
    }
    printed.extend(individual);
    // Without the flag: no pcieRoot anywhere.
    let plain = printed_slices(&root, &["--cpu-device-mode", "individual"]);
    assert!(roots_by_device(&plain).values().all(Option::is_none));
    // List-typed attributes exist from 1.36 on (1.36 has the mapping under
    // another name, so its check goes without it).
    validate_k8s_objects(&printed, &["1.37.0"]).unwrap();
    let for_1_36: Vec<Value> = printed
        .into_iter()
        .map(|mut s| {
            for d in s["spec"]["devices"].as_array_mut().into_iter().flatten() {
                if let Some(d) = d.as_object_mut() {
                    d.remove("nodeAllocatableResources");
                }
            }
            s
        })
        .collect();
    validate_k8s_objects(&for_1_36, &["1.36.0"]).unwrap();
}

#[test]
fn a_root_without_numa_node_is_local_to_every_cpu() {
    let root = fixture("2n-root-without-node");
    let numa = printed_slices(&root, &["--expose-pcie-roots"]);
    let got = roots_by_device(&numa);
    // pci0000:00 says numa_node -1 (affinity: every CPU); pci0000:80 has no
    // affinity file and its functions name node 1.
    let want = BTreeMap::from([
        ("cpudevnuma000".to_string(), list(&["pci0000:00"])),
        (
            "cpudevnuma001".to_string(),
            list(&["pci0000:00", "pci0000:80"]),
        ),
    ]);
    assert_eq!(got, want);
    let individual = printed_slices(
        &root,
        &["--cpu-device-mode", "individual", "--expose-pcie-roots"],
    );
    let roots = roots_by_device(&individual);
    let devices: Vec<&Value> = individual
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect();
    for d in devices {
        let name = d["name"].as_str().unwrap_or_default();
        let want = if cpu_of(d) < 2 {
            list(&["pci0000:00"])
        } else {
            list(&["pci0000:00", "pci0000:80"])
        };
        assert_eq!(roots[name], want, "{name}");
    }
    assert_eq!(
        root_of_pci_function(&root, "0000:81:00.0"),
        "pci0000:80",
        "the NIC hangs off pci0000:80"
    );
    let mut all = numa;
    all.extend(individual);
    validate_k8s_objects(&all, &["1.37.0"]).unwrap();
}

#[test]
fn a_machine_without_pci_devices_prints_no_attribute_and_says_why() {
    let dir = copy_of_fixture("2n-root-without-node");
    std::fs::remove_dir_all(dir.path().join("sys/devices/pci0000:00")).expect("rm");
    std::fs::remove_dir_all(dir.path().join("sys/devices/pci0000:80")).expect("rm");
    let out = slices_output(dir.path(), &["--expose-pcie-roots"]);
    assert!(out.status.success());
    let printed: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert!(roots_by_device(&printed).values().all(Option::is_none));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no PCIe root complex under"), "{err}");
}

#[test]
fn garbage_in_the_pci_tree_fails_naming_the_file() {
    let dir = copy_of_fixture("2n-root-without-node");
    let bad = dir
        .path()
        .join("sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/numa_node");
    std::fs::write(&bad, "one\n").expect("write");
    // The flag off: the PCI tree is not read at all.
    assert!(slices_output(dir.path(), &[]).status.success());
    let out = slices_output(dir.path(), &["--expose-pcie-roots"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("0000:81:00.0/numa_node") && err.contains("\"one\\n\""),
        "{err}"
    );
}
