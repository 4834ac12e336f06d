//! End-to-end KEP-5517: the ResourceSlices dra-plugin publishes for a real
//! node carry the node-allocatable mapping by default and not with
//! `--disable-node-allocatable-mapping`; claims are prepared and pinned
//! either way, and an API server that drops the field does not break
//! publishing. Against each Kubernetes release the fake API server plays
//! (1.34 with and without consumable capacity, 1.36, 1.37), the node
//! publishes only what that release accepts and a claim prepares end to
//! end. A prepared claim's status (KEP-4817 `status.devices`) tells which
//! CPUs it got, and is cleared at unprepare; a write the server failed is
//! tried again, one it refused is repaired at the claim's next prepare.
//! Needs root and `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::apiserver::schema::validate_k8s_objects;
use dra_cpu_tests::apiserver::FakeApiServerOptions;
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::read_back::metric_value;
use dra_cpu_tests::node::{Node, GROUPED_DEVICE};
use e2e_common::{devices, node};
use serde_json::Value;
use shared_state::assignment::CPU_CAPACITY;
use shared_state::topology::Topology;
use std::path::Path;

/// Whether a device's `nodeAllocatableResources.cpu` maps the CPU capacity
/// one to one (`capacityKey: dra.cpu/cpu`, `capacityMultiplier: "1"`),
/// wherever the mapping nests.
fn maps_cpu_capacity(device: &Value) -> bool {
    fn find(v: &Value) -> bool {
        match v {
            Value::Object(m) => {
                let key = m.get("capacityKey").and_then(Value::as_str) == Some(CPU_CAPACITY);
                let multiplier = m
                    .get("capacityMultiplier")
                    .map(|q| q.to_string().trim_matches('"').to_string());
                (key && multiplier.as_deref() == Some("1")) || m.values().any(find)
            }
            _ => false,
        }
    }
    device
        .pointer("/nodeAllocatableResources/cpu")
        .is_some_and(find)
}

/// A claim is prepared and its container pinned on this node.
async fn claims_work(node: &mut Node) {
    let pod = PodIdentity::new("pod-b");
    let claim = node
        .create_claim("pod-b-cpu", 1, &pod)
        .await
        .must("preparing a claim");
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let running = node.start_pod(&pod, &[spec]).await.must("claim pod");
    node.wait_cpus(running.id("app"), &claim.cpus)
        .await
        .must("claim container pinned");
}

#[tokio::test]
async fn published_slices_carry_the_node_allocatable_mapping_by_default() {
    let mut node = node(NodeOptions::default()).await;
    let all = node.allocatable().must("online CPUs");
    let slices = node.wait_slices().await.must("slices");
    let devices = devices(&slices);
    // One grouped device per NUMA node, each with that node's allocatable
    // CPUs as capacity: together, every allocatable CPU.
    let topology = Topology::discover(Path::new("/")).must("the host's CPU topology");
    let capacity_of = |d: &Value| {
        d.pointer(&format!(
            "/capacity/{}/value",
            CPU_CAPACITY.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .map(str::to_string)
    };
    let mut total = 0;
    for numa in topology.numa_nodes() {
        let name = format!("cpudevnuma{numa:03}");
        let device = devices
            .iter()
            .find(|d| d.get("name").and_then(Value::as_str) == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no {name} in {devices:?}"));
        let cpus = topology.cpus_in_numa(numa).intersection(&all).len();
        assert_eq!(
            capacity_of(device),
            Some(cpus.to_string()),
            "capacity of {name} is NUMA node {numa}'s allocatable CPUs: {device}"
        );
        total += cpus;
    }
    assert_eq!(total, all.len(), "the groups cover every allocatable CPU");
    let grouped = devices
        .iter()
        .find(|d| d.get("name").and_then(Value::as_str) == Some(GROUPED_DEVICE))
        .unwrap_or_else(|| panic!("no {GROUPED_DEVICE} in {devices:?}"));
    assert!(maps_cpu_capacity(grouped), "mapping missing: {grouped}");
    assert!(devices.iter().all(maps_cpu_capacity), "{devices:?}");
    validate_k8s_objects(&node.api().received_objects("ResourceSlice"), &["1.37.0"])
        .must("received slices against the 1.37 schema");
    claims_work(&mut node).await;
}

#[tokio::test]
async fn disabled_mapping_publishes_no_node_allocatable_resources() {
    // This node's kubelet stand-in talks DRA v1beta1, as older kubelets do.
    let mut node = node(NodeOptions {
        node_allocatable_mapping: false,
        dra_version: DraVersion::V1beta1,
        ..Default::default()
    })
    .await;
    let slices = node.wait_slices().await.must("slices");
    let devices = devices(&slices);
    assert!(!devices.is_empty());
    for device in &devices {
        assert!(device.get("nodeAllocatableResources").is_none(), "{device}");
    }
    let received = node.api().received_objects("ResourceSlice");
    assert!(!received.is_empty());
    assert!(
        devices_of_bodies(&received).all(|d| d.get("nodeAllocatableResources").is_none()),
        "nothing sent carries the mapping"
    );
    validate_k8s_objects(&received, &["1.34.0", "1.37.0"])
        .must("received slices against the 1.34 and 1.37 schemas");
    claims_work(&mut node).await;
}

#[tokio::test]
async fn an_api_server_without_the_feature_drops_the_mapping_and_publishing_still_works() {
    let mut node = node(NodeOptions {
        api_keeps_node_allocatable: false,
        ..Default::default()
    })
    .await;
    let slices = node.wait_slices().await.must("slices");
    let devices = devices(&slices);
    assert!(devices
        .iter()
        .any(|d| d.get("name").and_then(Value::as_str) == Some(GROUPED_DEVICE)));
    assert!(devices
        .iter()
        .all(|d| d.get("nodeAllocatableResources").is_none()));
    claims_work(&mut node).await;
}

fn devices_of_bodies(bodies: &[Value]) -> impl Iterator<Item = &Value> {
    bodies
        .iter()
        .filter_map(|s| s.pointer("/spec/devices").and_then(Value::as_array))
        .flatten()
}

/// A node against the fake API server playing `version` with `gates` over
/// its defaults: what is published, what was sent (strictly valid for that
/// release's schema), and a claim prepared and pinned.
async fn on_release(version: &str, gates: &str, grouped: bool, mapping: bool) {
    let api = FakeApiServerOptions::parse(version, gates).must("fake API server options");
    let mut node = node(NodeOptions {
        api,
        ..Default::default()
    })
    .await;
    let slices = node.wait_slices().await.must("slices");
    let devices = devices(&slices);
    let names: Vec<&str> = devices
        .iter()
        .filter_map(|d| d.get("name").and_then(Value::as_str))
        .collect();
    let all = node.allocatable().must("online CPUs");
    if grouped {
        assert!(
            names.contains(&GROUPED_DEVICE),
            "{version} {gates:?}: {names:?}"
        );
    } else {
        assert_eq!(
            names.len(),
            all.len(),
            "{version} {gates:?}: one device per CPU: {names:?}"
        );
        assert!(names
            .iter()
            .all(|n| n.starts_with("cpudev") && n[6..].chars().all(|c| c.is_ascii_digit())));
    }
    assert_eq!(
        devices
            .iter()
            .any(|d| d.get("nodeAllocatableResources").is_some()),
        mapping,
        "{version} {gates:?}: {devices:?}"
    );
    let received = node.api().received_objects("ResourceSlice");
    validate_k8s_objects(&received, &[&format!("{version}.0")])
        .must("everything sent is valid for this release's schema, strictly");
    let metrics = node.dra_metrics().await.unwrap_or_default();
    assert_eq!(
        metric_value(&metrics, "dra_cpu_grouped_mode_unsupported"),
        Some(if grouped { 0.0 } else { 1.0 }),
        "{version} {gates:?}"
    );
    assert!(
        !metrics.contains("dra_cpu_slice_publish_failures_total{"),
        "{version} {gates:?}: no publish failed:\n{metrics}"
    );
    claims_work(&mut node).await;
}

#[tokio::test]
async fn on_134_without_consumable_capacity_individual_devices_are_published_and_prepare() {
    on_release("1.34", "", false, false).await;
}

#[tokio::test]
async fn on_134_with_consumable_capacity_grouped_devices_are_published_and_prepare() {
    on_release("1.34", "DRAConsumableCapacity=true", true, false).await;
}

#[tokio::test]
async fn on_136_grouped_devices_are_published_without_the_mapping_and_prepare() {
    on_release("1.36", "DRANodeAllocatableResources=true", true, false).await;
}

#[tokio::test]
async fn on_137_with_its_gate_the_mapping_is_published() {
    on_release("1.37", "DRANodeAllocatableResources=true", true, true).await;
}

#[tokio::test]
async fn on_134_a_restarted_dra_plugin_reapplies_nothing_and_keeps_its_claims() {
    let api = FakeApiServerOptions::parse("1.34", "").must("fake API server options");
    let mut node = node(NodeOptions {
        api,
        ..Default::default()
    })
    .await;
    let before = node.wait_slices().await.must("slices");
    let pod = PodIdentity::new("pod-r");
    let claim = node
        .create_claim("pod-r-cpu", 1, &pod)
        .await
        .must("preparing an individual-device claim");
    let writes = |node: &Node| {
        node.api()
            .received()
            .iter()
            .filter(|r| {
                r.method == "PATCH"
                    && r.path.contains("/resourceslices")
                    && !r.path.contains("dryRun")
            })
            .count()
    };
    let written = writes(&node);
    node.kill_dra_plugin();
    node.start_dra_plugin()
        .await
        .must("starting dra-plugin again");
    // Ready means the restarted publisher has synced once (a failure would
    // have shown in /readyz); give its watch a moment more.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(writes(&node), written, "the restart re-applied a slice");
    let after = node.wait_slices().await.must("slices");
    let generations = |slices: &[Value]| -> Vec<Option<i64>> {
        slices
            .iter()
            .map(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64))
            .collect()
    };
    assert_eq!(generations(&after), generations(&before));
    let again = node.prepare(&claim.claim).await.must("preparing again");
    assert_eq!(again.cpus, claim.cpus, "the store kept the claim's CPUs");
}

/// The claim's `status.devices` entries as the fake API server stores them.
fn device_statuses(node: &Node, name: &str) -> Vec<Value> {
    let claim = node.api().claim("default", name).must("the claim");
    serde_json::to_value(claim.status.and_then(|s| s.devices).unwrap_or_default())
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

async fn wait_device_statuses(node: &Node, name: &str, want_entries: bool) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = device_statuses(node, name);
        if got.is_empty() != want_entries || std::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_prepared_claims_status_names_its_cpus_and_is_cleared_at_unprepare() {
    let node = node(NodeOptions::default()).await;
    let topology = Topology::discover(Path::new("/")).must("the host's CPU topology");
    let pod = PodIdentity::new("pod-s");
    let claim = node
        .create_claim("pod-s-cpu", 1, &pod)
        .await
        .must("preparing a claim");
    let entries = wait_device_statuses(&node, "pod-s-cpu", true).await;
    assert_eq!(entries.len(), 1, "one entry per result: {entries:?}");
    let entry = &entries[0];
    assert_eq!(entry["driver"], "dra.cpu");
    assert_eq!(entry["pool"], "node-a");
    assert_eq!(entry["device"], GROUPED_DEVICE);
    assert_eq!(
        entry["data"]["cpus"],
        claim.cpus.to_cpulist().as_str(),
        "{entry}"
    );
    assert_eq!(entry["data"]["cpuCount"], claim.cpus.len());
    let numa: Vec<u32> = claim
        .cpus
        .iter()
        .filter_map(|c| topology.cpu(c).map(|i| i.numa))
        .collect();
    assert_eq!(entry["data"]["numaNodes"], serde_json::json!(numa));
    assert_eq!(entry["conditions"][0]["type"], "Ready");
    assert_eq!(entry["conditions"][0]["status"], "True");
    let stored = node.api().claim("default", "pod-s-cpu").must("the claim");
    assert!(
        stored
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some(),
        "the status write keeps the scheduler's allocation"
    );
    // What dra-plugin sent is a valid ResourceClaim of 1.37.
    let sent: Vec<Value> = node
        .api()
        .received_objects("ResourceClaim")
        .into_iter()
        .filter(|o| o.pointer("/status/devices").is_some())
        .collect();
    assert!(!sent.is_empty(), "status applies received");
    validate_k8s_objects(&sent, &["1.37.0"]).must("status applies against the 1.37 schema");
    assert!(
        node.dra_metrics()
            .await
            .unwrap_or_default()
            .contains("dra_cpu_claim_status_writes_total 1"),
        "the write is counted"
    );

    node.unprepare(&claim.claim).await.must("unprepare");
    let left = wait_device_statuses(&node, "pod-s-cpu", false).await;
    assert!(left.is_empty(), "cleared at unprepare: {left:?}");
}

/// Waits until dra-plugin's metrics contain `line`.
async fn wait_metric(node: &Node, line: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = node.dra_metrics().await.unwrap_or_default();
        if text.contains(line) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no {line}: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_status_write_the_server_failed_is_tried_again() {
    let node = node(NodeOptions::default()).await;
    // 500 (kube's client itself tries 429, 503 and 504 again).
    node.api().fail_next("PATCH", "resourceclaims", 500, 2);
    let pod = PodIdentity::new("pod-t");
    let claim = node
        .create_claim("pod-t-cpu", 1, &pod)
        .await
        .must("prepare");
    // Two failures, then the third try (after 1 s and 2 s) lands.
    wait_metric(&node, "dra_cpu_claim_status_write_failures_total 2").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let entries = loop {
        let got = device_statuses(&node, "pod-t-cpu");
        if !got.is_empty() || std::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(entries.len(), 1, "written by a retry: {entries:?}");
    assert_eq!(entries[0]["data"]["cpus"], claim.cpus.to_cpulist());
}

#[tokio::test]
async fn a_status_lost_to_a_refused_write_is_repaired_at_the_claims_next_prepare() {
    let node = node(NodeOptions::default()).await;
    // A refusal (403) is not tried again: the status stays empty...
    node.api().fail_next("PATCH", "resourceclaims", 403, 1);
    let pod = PodIdentity::new("pod-r");
    let first = node
        .create_claim("pod-r-cpu", 1, &pod)
        .await
        .must("prepare");
    wait_metric(&node, "dra_cpu_claim_status_write_failures_total 1").await;
    // Requests for this claim: (GETs, PATCHes of its status).
    let calls = || {
        let lines = node.api().requests();
        let of = |method: &str, tail: &str| {
            lines
                .iter()
                .filter(|l| {
                    l.method == method
                        && l.path.split('?').next().is_some_and(|p| p.ends_with(tail))
                })
                .count()
        };
        (
            of("GET", "/resourceclaims/pod-r-cpu"),
            of("PATCH", "/resourceclaims/pod-r-cpu/status"),
        )
    };
    let (reads_before, patches) = calls();
    assert_eq!(patches, 1, "the refused write");
    // Longer than the first retry's pause: a refusal is not tried again.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(calls().1, 1, "a refused write is not tried again");
    assert!(
        device_statuses(&node, "pod-r-cpu").is_empty(),
        "the control: no status"
    );
    // ...until kubelet prepares the claim again (another container of the
    // pod, a kubelet restart): answered from the store, the claim read in
    // the background and its status repaired.
    let again = node.prepare(&first.claim).await.must("prepare again");
    assert_eq!(again.cpus, first.cpus);
    let entries = wait_device_statuses(&node, "pod-r-cpu", true).await;
    assert_eq!(entries.len(), 1, "repaired: {entries:?}");
    assert_eq!(entries[0]["data"]["cpus"], first.cpus.to_cpulist());
    wait_metric(&node, "dra_cpu_claim_status_writes_total 1").await;
    let (reads, patches) = calls();
    assert_eq!(
        (reads, patches),
        (reads_before + 1, 2),
        "one read, one write"
    );
    // Once there, a further prepare reads nothing and writes nothing.
    node.prepare(&first.claim)
        .await
        .must("prepare a third time");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        calls(),
        (reads, patches),
        "nothing more for a written status"
    );

    node.unprepare(&first.claim).await.must("unprepare");
    let left = wait_device_statuses(&node, "pod-r-cpu", false).await;
    assert!(left.is_empty(), "cleared at unprepare: {left:?}");
}

#[tokio::test]
async fn a_failing_status_write_never_fails_the_prepare() {
    let node = node(NodeOptions::default()).await;
    node.api().fail_next("PATCH", "resourceclaims", 500, 100);
    let pod = PodIdentity::new("pod-f");
    let claim = node
        .create_claim("pod-f-cpu", 1, &pod)
        .await
        .must("the prepare succeeds although the status write fails");
    assert_eq!(claim.cpus.len(), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = node.dra_metrics().await.unwrap_or_default();
        if text.contains("dra_cpu_claim_status_write_failures_total 1") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "failure not counted: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(device_statuses(&node, "pod-f-cpu").is_empty());
    node.wait_log(false, "writing the claim's device status failed")
        .await
        .must("the failure is logged");
}
