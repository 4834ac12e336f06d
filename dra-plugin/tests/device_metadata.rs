//! KEP-5304 device metadata through the driver: written with the CDI spec
//! at prepare, removed at unprepare, rebuilt by start-up reconciliation,
//! and a failure leaves nothing behind.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use dra_plugin::cdi::CdiDir;
use dra_plugin::device_metadata::{published_attributes, DeviceMetadata};
use dra_plugin::devices::{DeviceCatalog, DeviceOptions};
use dra_plugin::devices::{DeviceMode, GroupBy};
use dra_plugin::driver::{Driver, DriverOptions};
use dra_plugin::metrics::Metrics;
use dra_plugin::prepare::{ClaimRef, POD_CLAIM_NAME_ANNOTATION};
use dra_plugin::slices::devices_for;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::Value;
use shared_state::alloc::Policy;
use shared_state::store::memory::MemoryStore;
use shared_state::store::AssignmentStore;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NODE: &str = "node-a";
const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// 2 sockets of one NUMA node, 4 cores of 2 threads each: 16 CPUs.
fn topology() -> Topology {
    common::smt2_topology(2, 1, 4)
}

/// Where one test keeps its files.
struct Dirs {
    _tmp: tempfile::TempDir,
    cdi: PathBuf,
    plugin_data: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    Dirs {
        cdi: tmp.path().join("cdi"),
        plugin_data: tmp.path().join("kubelet/plugins/dra.cpu"),
        _tmp: tmp,
    }
}

/// A driver as `dra-plugin run` builds it, with metadata on or off.
fn driver(store: Arc<dyn AssignmentStore>, dirs: &Dirs, metadata_on: bool) -> Driver {
    let topo = topology();
    let catalog = DeviceCatalog::new(
        &topo,
        &CpuSet::new(),
        DeviceMode::Grouped,
        GroupBy::Numanode,
    )
    .unwrap_or_else(|e| panic!("catalog: {e}"));
    let published = devices_for(
        &topo,
        &DeviceOptions {
            mode: DeviceMode::Grouped,
            group_by: GroupBy::Numanode,
            reserved: CpuSet::new(),
            node_allocatable_mapping: false,
        },
    )
    .unwrap_or_else(|e| panic!("devices: {e}"));
    let metadata = metadata_on.then(|| {
        DeviceMetadata::new(
            "dra.cpu",
            &dra_plugin::device_metadata::default_host_root(&dirs.plugin_data),
            published_attributes(&published),
            catalog
                .devices()
                .map(|(n, c)| (n.to_string(), c.clone()))
                .collect(),
        )
    });
    Driver::open(
        DriverOptions {
            driver_name: "dra.cpu".into(),
            node_name: NODE.into(),
            reserved: CpuSet::new(),
            policy: Policy::Packed,
            mixed_allocation_mode: false,
            min_shared_cpus: 1,
        },
        catalog,
        &topo,
        store,
        CdiDir::new(&dirs.cdi),
        Arc::new(Metrics::new()),
    )
    .unwrap_or_else(|e| panic!("driver: {e}"))
    .with_device_metadata(metadata)
}

fn claim(
    n: usize,
    name: &str,
    cpus: u32,
    pod_claim_name: Option<&str>,
) -> (ClaimRef, ResourceClaim) {
    let reference = ClaimRef {
        namespace: "team".into(),
        name: name.into(),
        uid: format!("{n:08x}-0000-4000-8000-000000000000"),
    };
    let object = common::allocated_claim_object(
        &reference,
        NODE,
        "cpudevnuma001",
        cpus,
        pod_claim_name.map(|p| [(POD_CLAIM_NAME_ANNOTATION.to_string(), p.to_string())].into()),
    );
    (reference, object)
}

/// The spec's mounts as (host path, container path).
fn mounts(cdi: &Path, uid: &str) -> Vec<(String, String)> {
    let text =
        std::fs::read(cdi.join(format!("dra.k8s.io-cpu_claim-{uid}.json"))).unwrap_or_default();
    let spec: Value = serde_json::from_slice(&text).unwrap_or_default();
    spec["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            assert_eq!(m["options"], serde_json::json!(["ro", "bind"]), "{m}");
            (
                m["hostPath"].as_str().unwrap_or_default().to_string(),
                m["containerPath"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The first object of a metadata file.
fn first_object(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::Deserializer::from_slice(&bytes)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_default()
}

#[test]
fn prepare_writes_the_metadata_its_spec_mounts_and_unprepare_removes_both() {
    let dirs = dirs();
    let store = Arc::new(MemoryStore::default());
    let driver = driver(store, &dirs, true);
    let (reference, object) = claim(1, "web-cpu", 2, None);
    let prepared = driver
        .prepare(&reference, &object)
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    let cdi = CdiDir::new(&dirs.cdi);
    // nri-plugin's strict reading still finds the CPUs.
    assert_eq!(
        cdi.read_cpus(&reference.uid),
        Some(prepared.assignment.cpus.clone())
    );
    let host = dirs
        .plugin_data
        .join("dra-device-metadata/team_web-cpu/cpus/metadata.json");
    assert_eq!(
        mounts(&dirs.cdi, &reference.uid),
        vec![(
            host.to_string_lossy().into_owned(),
            format!("{CONTAINER_DIR}/resourceclaims/web-cpu/cpus/dra.cpu-metadata.json")
        )]
    );
    let doc = first_object(&host);
    assert_eq!(doc["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    assert_eq!(doc["metadata"]["uid"], reference.uid.as_str());
    let device = &doc["requests"][0]["devices"][0];
    assert_eq!(device["name"], "cpudevnuma001");
    assert_eq!(
        device["attributes"]["dra.cpu/cpus"]["string"],
        prepared.assignment.cpus.to_cpulist().as_str()
    );
    assert_eq!(device["attributes"]["dra.cpu/allocatedNumCPUs"]["int"], 2);
    // A published attribute of the device.
    assert_eq!(
        device["attributes"]["resource.kubernetes.io/numaNode"]["int"],
        1
    );

    driver
        .unprepare(&reference)
        .unwrap_or_else(|e| panic!("unprepare: {e}"));
    assert_eq!(cdi.read_cpus(&reference.uid), None);
    assert!(!host.exists());
    assert!(!dirs
        .plugin_data
        .join("dra-device-metadata/team_web-cpu")
        .exists());
}

/// Metadata files that cannot be removed (here the claim's directory is
/// replaced by a file, which fails the listing even for root) do not keep
/// the claim: once its CDI spec is gone nothing mounts them, so the
/// unprepare succeeds and its CPUs are free for the next claim. Control:
/// the same claim's unprepare failed before.
#[test]
fn metadata_that_cannot_be_removed_does_not_keep_the_claims_cpus() {
    let dirs = dirs();
    let store = Arc::new(MemoryStore::default());
    let driver = driver(store.clone(), &dirs, true);
    let (reference, object) = claim(3, "stuck-cpu", 2, None);
    let prepared = driver
        .prepare(&reference, &object)
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    let claim_dir = dirs.plugin_data.join("dra-device-metadata/team_stuck-cpu");
    std::fs::remove_dir_all(&claim_dir).unwrap();
    std::fs::write(&claim_dir, b"not a directory").unwrap();

    driver
        .unprepare(&reference)
        .unwrap_or_else(|e| panic!("unprepare: {e}"));
    assert_eq!(CdiDir::new(&dirs.cdi).read_cpus(&reference.uid), None);
    assert!(
        store.list().unwrap().is_empty(),
        "the claim is still stored"
    );
    // Its CPUs go to the next claim of the same device.
    let (next, next_object) = claim(4, "next-cpu", 2, None);
    let again = driver
        .prepare(&next, &next_object)
        .unwrap_or_else(|e| panic!("prepare after: {e}"));
    assert_eq!(again.assignment.cpus, prepared.assignment.cpus);
}

#[test]
fn a_template_claim_is_mounted_under_its_pod_claim_name() {
    let dirs = dirs();
    let driver = driver(Arc::new(MemoryStore::default()), &dirs, true);
    let (reference, object) = claim(2, "pod-x-cpu-7fk2q", 1, Some("cpu"));
    driver
        .prepare(&reference, &object)
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    let found = mounts(&dirs.cdi, &reference.uid);
    assert_eq!(
        found.first().map(|(_, inside)| inside.as_str()),
        Some(
            format!("{CONTAINER_DIR}/resourceclaimtemplates/cpu/cpus/dra.cpu-metadata.json")
                .as_str()
        )
    );
    let host = PathBuf::from(found.first().map(|(h, _)| h.clone()).unwrap_or_default());
    assert_eq!(first_object(&host)["podClaimName"], "cpu");
    // Kept in the store, so reconciliation after a restart can rebuild it.
    assert_eq!(
        driver
            .prepared(&reference.uid)
            .and_then(|a| a.pod_claim_name),
        Some("cpu".to_string())
    );
}

#[test]
fn a_repeat_prepare_and_a_restart_rebuild_lost_files() {
    let dirs = dirs();
    let store: Arc<dyn AssignmentStore> = Arc::new(MemoryStore::default());
    let first = driver(store.clone(), &dirs, true);
    let (reference, object) = claim(3, "web-cpu", 2, None);
    first
        .prepare(&reference, &object)
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    let host = dirs
        .plugin_data
        .join("dra-device-metadata/team_web-cpu/cpus/metadata.json");
    let written = std::fs::read(&host).unwrap_or_default();
    // Lost behind our back: kubelet's retry puts it back.
    std::fs::remove_file(&host).unwrap_or_else(|e| panic!("{e}"));
    first
        .prepare(&reference, &object)
        .unwrap_or_else(|e| panic!("repeat: {e}"));
    assert_eq!(std::fs::read(&host).unwrap_or_default(), written);

    // A reboot: the CDI directory (tmpfs) is gone, the metadata file was
    // truncated by a power cut, and a claim unprepared while we were down
    // left files behind.
    drop(first);
    std::fs::remove_dir_all(&dirs.cdi).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&host, b"").unwrap_or_else(|e| panic!("{e}"));
    let stale = dirs
        .plugin_data
        .join("dra-device-metadata/team_gone/cpus/metadata.json");
    std::fs::create_dir_all(stale.parent().unwrap_or(&dirs.plugin_data))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&stale, b"{}").unwrap_or_else(|e| panic!("{e}"));
    let second = driver(store.clone(), &dirs, true);
    let reconciled = second
        .reconcile_cdi()
        .unwrap_or_else(|e| panic!("reconcile: {e}"));
    assert_eq!(reconciled.cdi.write.len(), 1);
    assert_eq!(reconciled.metadata.write.len(), 1);
    assert_eq!(reconciled.metadata.remove.len(), 1);
    assert_eq!(std::fs::read(&host).unwrap_or_default(), written);
    assert!(!stale.exists());
    assert_eq!(mounts(&dirs.cdi, &reference.uid).len(), 1);

    // Turned off: the spec loses its mount (and `run` removes the files).
    drop(second);
    let off = driver(store, &dirs, false);
    let reconciled = off
        .reconcile_cdi()
        .unwrap_or_else(|e| panic!("reconcile: {e}"));
    assert_eq!(reconciled.cdi.write.len(), 1);
    assert!(mounts(&dirs.cdi, &reference.uid).is_empty());
    assert!(CdiDir::new(&dirs.cdi).read_cpus(&reference.uid).is_some());
}

#[test]
fn a_metadata_failure_fails_the_prepare_and_leaves_nothing_behind() {
    let dirs = dirs();
    // A file where the metadata directory should be.
    std::fs::create_dir_all(&dirs.plugin_data).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dirs.plugin_data.join("dra-device-metadata"), b"x")
        .unwrap_or_else(|e| panic!("{e}"));
    let store = Arc::new(MemoryStore::default());
    let driver = driver(store.clone(), &dirs, true);
    let (reference, object) = claim(4, "web-cpu", 2, None);
    let error = driver
        .prepare(&reference, &object)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("dra-device-metadata"), "{error}");
    assert!(driver.prepared(&reference.uid).is_none());
    assert!(store.list().unwrap_or_default().is_empty());
    assert_eq!(CdiDir::new(&dirs.cdi).read_cpus(&reference.uid), None);

    // A claim whose name cannot be a path is refused before any commit.
    let dirs = self::dirs();
    let store = Arc::new(MemoryStore::default());
    let driver = self::driver(store.clone(), &dirs, true);
    let (mut reference, mut object) = claim(5, "web-cpu", 2, Some("../../etc"));
    reference.name = "web-cpu".into();
    object.metadata.name = Some("web-cpu".into());
    let error = driver
        .prepare(&reference, &object)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("pod claim name"), "{error}");
    assert!(store.list().unwrap_or_default().is_empty());
}
