//! Publishing `resource.kubernetes.io/pcieRoot` against the fake API server
//! of each release: left out before 1.36 (no list values in the schema),
//! refused by a 1.36/1.37 server without the `DRAListTypeAttributes` gate
//! and published again without it, kept where the gate is on, and split 64
//! devices to a slice while devices carry the list.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use dra_cpu_tests::apiserver::schema::validate_k8s_objects;
use dra_cpu_tests::apiserver::version::KubernetesVersion;
use dra_cpu_tests::apiserver::{FakeApiServer, FakeApiServerOptions};
use dra_plugin::devices::{DeviceMode, DeviceOptions, GroupBy};
use dra_plugin::metrics::Metrics;
use dra_plugin::publisher::status::PublishStatus;
use dra_plugin::publisher::Publisher;
use dra_plugin::slices::{devices_with_pcie_roots, ATTR_PCIE_ROOT};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use shared_state::topology::pcie::{Locality, PcieRoot, PcieRoots};
use shared_state::CpuSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// 100 CPUs on two NUMA nodes, one root on each node and one local to all.
fn devices() -> Vec<Device> {
    let topology = common::smt2_topology(1, 2, 25);
    let roots = PcieRoots::new(vec![
        PcieRoot {
            name: "pci0000:00".into(),
            locality: Locality::NumaNodes([0].into()),
        },
        PcieRoot {
            name: "pci0000:80".into(),
            locality: Locality::NumaNodes([1].into()),
        },
        PcieRoot {
            name: "pci0000:ff".into(),
            locality: Locality::Anywhere,
        },
    ]);
    let options = DeviceOptions {
        mode: DeviceMode::Individual,
        group_by: GroupBy::Numanode,
        reserved: CpuSet::new(),
        node_allocatable_mapping: false,
    };
    let (devices, left_out) = devices_with_pcie_roots(&topology, &options, Some(&roots)).unwrap();
    assert!(left_out.is_empty());
    devices
}

fn roots_on_server(slices: &[ResourceSlice]) -> Vec<Option<Vec<String>>> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| {
            d.attributes
                .as_ref()
                .and_then(|a| a.get(ATTR_PCIE_ROOT))
                .and_then(|a| a.strings.clone())
        })
        .collect()
}

#[tokio::test]
async fn each_release_and_gate_gets_slices_it_accepts() {
    let sent = devices();
    for version in KubernetesVersion::ALL {
        for gate in [false, true] {
            let what = format!("{version} DRAListTypeAttributes={gate}");
            let mut options = FakeApiServerOptions::for_version(version);
            options.feature_gates.dra_list_type_attributes = gate;
            let server = FakeApiServer::start_with(options).unwrap();
            server.insert_node("node-1").unwrap();
            let status = Arc::new(PublishStatus::default());
            let metrics = Arc::new(Metrics::new());
            let mut publisher = Publisher::new(server.client().await.unwrap(), "dra.cpu", "node-1")
                .with_reporting(status.clone(), metrics.clone());
            let outcome = publisher.sync(&sent).await.unwrap();
            let declared = version >= KubernetesVersion::V1_36;
            let kept = declared && gate;
            assert_eq!(publisher.list_attributes_supported(), Some(kept), "{what}");
            let stored = server.slices();
            let roots = roots_on_server(&stored);
            assert_eq!(roots.len(), 100, "{what}");
            if kept {
                // Every device has its node's root and the one local to all.
                assert!(
                    roots.iter().all(|r| r
                        .as_ref()
                        .is_some_and(|r| r.len() == 2 && r.contains(&"pci0000:ff".to_string()))),
                    "{what}: {roots:?}"
                );
                assert_eq!(outcome.applied.len(), 2, "{what}: 64 + 36 devices");
                let sizes: Vec<usize> = stored
                    .iter()
                    .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                    .collect();
                assert_eq!(sizes, vec![64, 36], "{what}");
            } else {
                assert!(roots.iter().all(Option::is_none), "{what}");
                assert_eq!(
                    outcome.applied.len(),
                    1,
                    "{what}: 100 devices fit one slice"
                );
            }
            // Before 1.36 nothing is refused (the attribute never goes out);
            // on 1.36+ without the gate, one refused apply teaches it.
            let applies = server
                .requests()
                .iter()
                .filter(|r| r.method == "PATCH")
                .count();
            let refused = usize::from(declared && !gate);
            assert_eq!(applies, outcome.applied.len() + refused, "{what}");
            assert!(status.unready_reason().is_none(), "{what}");
            assert_eq!(
                metrics.pcie_roots_published.load(Ordering::Relaxed),
                u64::from(kept),
                "{what}"
            );
            // What the server holds is a valid object of its release.
            let objects: Vec<serde_json::Value> = stored
                .iter()
                .map(|s| serde_json::to_value(s).unwrap())
                .map(|mut v| {
                    if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                        m.retain(|k, _| k == "name" || k == "labels" || k == "ownerReferences");
                    }
                    v
                })
                .collect();
            let release = format!("1.{}.0", version.minor());
            validate_k8s_objects(&objects, &[release.as_str()]).unwrap();
            // A second sync changes nothing.
            let again = publisher.sync(&sent).await.unwrap();
            assert!(again.applied.is_empty(), "{what}: {again:?}");
        }
    }
}

/// The daemon itself: `run` with `--expose-pcie-roots` on the fixture with
/// a GPU on node 0 and a NIC on node 1 publishes each NUMA device with its
/// node's roots; without the flag, none.
#[tokio::test]
async fn the_daemon_publishes_the_roots_of_the_fixture() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs-pci/2s-nic-node1-gpu-node0");
    for expose in [true, false] {
        let node = common::Node::with(dra_plugin::devices::DeviceMode::Grouped, |s| {
            s.sysfs_root = Some(fixture.clone());
            s.expose_pcie_roots = Some(expose);
        });
        let running = node.start(dra_cpu_tests::kubelet_dra::DraVersion::V1).await;
        let deadline = tokio::time::Instant::now() + common::WAIT;
        let published = loop {
            let slices = node.api.slices();
            if !slices.is_empty() {
                break slices;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no slices published"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let by_device: Vec<(String, Option<Vec<String>>)> = published
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| {
                let roots = d
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(ATTR_PCIE_ROOT))
                    .and_then(|a| a.strings.clone());
                (d.name.clone(), roots)
            })
            .collect();
        let list = |r: &[&str]| expose.then(|| r.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            by_device,
            vec![
                (
                    "cpudevnuma000".to_string(),
                    list(&["pci0000:00", "pci0000:40"])
                ),
                (
                    "cpudevnuma001".to_string(),
                    list(&["pci0000:80", "pci0000:c0"])
                ),
            ],
            "--expose-pcie-roots={expose}"
        );
        running.stop().await.unwrap();
    }
}
