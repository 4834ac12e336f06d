//! The upstream driver's opaque cpuset config on a real node: an external
//! scheduler writes `status.allocation.devices.config[]` (`source:
//! FromClaim`, `opaque.driver: dra.cpu`, `parameters: {apiVersion: v1alpha1,
//! cpuConfig: {cpuset}}`) for the claim's request, and the claim's container
//! runs on exactly those CPUs, read from its cgroup and from inside it. A
//! config this driver refuses fails the prepare with its reason and leaves
//! no CDI spec behind. The invalid variants one by one are in
//! `dra-plugin/tests/opaque_config.rs`. Needs root and
//! `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::kubelet_dra::Claim;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::{Node, NodeError, GROUPED_DEVICE};
use e2e_common::node;
use serde_json::json;
use shared_state::CpuSet;

/// The allocatable CPUs of NUMA node 0, which the first grouped device
/// (`cpudevnuma000`) holds; every allocatable CPU on a machine without NUMA
/// nodes in sysfs.
fn numa0_allocatable(node: &Node) -> CpuSet {
    let all = node.allocatable().must("online CPUs");
    match std::fs::read_to_string("/sys/devices/system/node/node0/cpulist") {
        Ok(list) => CpuSet::parse_cpulist(list.trim())
            .must("node0 cpulist")
            .intersection(&all),
        Err(_) => all,
    }
}

/// The scheduler's claim of `cpus` from the first grouped device, with the
/// external scheduler's opaque cpuset config for its request.
fn claim_with_cpuset(
    node: &Node,
    name: &str,
    pod: &PodIdentity,
    cpus: &str,
    count: u32,
) -> Result<Claim, NodeError> {
    node.allocate_claim_with_parameters(
        name,
        GROUPED_DEVICE,
        count,
        pod,
        json!({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": cpus}}),
    )
}

trait MustSome<T> {
    fn must_some(self, what: &str) -> T;
}

impl<T> MustSome<T> for Option<T> {
    fn must_some(self, what: &str) -> T {
        match self {
            Some(v) => v,
            None => panic!("{what}: missing"),
        }
    }
}

#[tokio::test]
async fn an_opaque_cpuset_pins_the_container_to_exactly_those_cpus() {
    let mut node = node(NodeOptions {
        // The one CPU of a 2-CPU host may be the chosen one: this test is
        // about the config, not the shared pool's floor.
        min_shared_cpus: Some(0),
        ..Default::default()
    })
    .await;
    node.wait_slices().await.must("slices");
    // The highest CPU of the device: not what this driver picks by itself
    // (lowest free ids first in a packed group) unless the node has one.
    let local = numa0_allocatable(&node);
    let chosen_cpu = local
        .iter()
        .last()
        .must_some("an allocatable CPU on NUMA 0");
    let chosen = CpuSet::parse_cpulist(&chosen_cpu.to_string()).must("cpulist");

    let pod = PodIdentity::new("pod-opaque");
    let claim = claim_with_cpuset(&node, "pod-opaque-cpu", &pod, &chosen.to_cpulist(), 1)
        .must("allocating the claim");
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    assert_eq!(
        prepared.cpus, chosen,
        "the CDI spec gives the scheduler's CPUs"
    );
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&prepared.cdi_device);
    let running = node.start_pod(&pod, &[spec]).await.must("starting the pod");
    let id = running.id("app").to_string();
    let seen = node
        .wait_cpus(&id, &chosen)
        .await
        .must("pinned to the config's CPUs");
    assert_eq!(
        seen.allowed_inside, chosen,
        "Cpus_allowed_list inside the container"
    );
    node.delete_pod(&running).await.must("deleting the pod");
    node.unprepare(&claim).await.must("unpreparing");

    // A cpuset outside the allocated device is refused by name, and the
    // refused claim leaves no CDI spec.
    let outside = CpuSet::parse_cpulist("4095").must("cpulist");
    let pod = PodIdentity::new("pod-outside");
    let bad = claim_with_cpuset(&node, "pod-outside-cpu", &pod, &outside.to_cpulist(), 1)
        .must("allocating the claim");
    match node.prepare(&bad).await {
        Err(NodeError::Prepare { error, .. }) => {
            assert!(
                error.contains("4095") && error.contains("cpus"),
                "the refusal names the CPUs and the request: {error}"
            );
        }
        other => panic!("a cpuset outside the device must be refused: {other:?}"),
    }
    assert_eq!(
        node.claim_cpus(&bad.uid),
        None,
        "no CDI spec for a refused claim"
    );
}
