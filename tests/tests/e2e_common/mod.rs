//! What every end-to-end scenario shares: starting a node, and turning
//! errors into test failures that say what was being done.

#![allow(dead_code)]

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::{PodIdentity, RunningPod};
use dra_cpu_tests::node::Node;
use serde_json::Value;
use shared_state::CpuSet;

pub async fn node(options: NodeOptions) -> Node {
    Node::start(options).await.must("starting the node")
}

pub async fn node_with_mixed_mode(on: bool) -> Node {
    node(NodeOptions {
        mixed_allocation_mode: on,
        ..Default::default()
    })
    .await
}

/// A pod of one container `app` with `requests.cpu: <milli>m` and no claim.
pub async fn shared_pod(node: &mut Node, name: &str, milli: i64) -> (RunningPod, String) {
    let pod = PodIdentity::new(name);
    let running = node
        .start_pod(
            &pod,
            &[ContainerSpec::sleeper("app").with_cpu(Some(milli), None)],
        )
        .await
        .must(&format!("starting shared pod {name}"));
    let id = running.id("app").to_string();
    (running, id)
}

/// Every device of the given ResourceSlices.
pub fn devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .filter_map(|s| s.pointer("/spec/devices").and_then(Value::as_array))
        .flatten()
        .cloned()
        .collect()
}

pub fn set(list: &str) -> CpuSet {
    CpuSet::parse_cpulist(list).must("cpulist")
}

/// The `DRA_CPUSET_<uid>` variable a container sees, parsed.
pub async fn claim_env(node: &mut Node, id: &str, claim_uid: &str) -> Option<CpuSet> {
    let env = dra_cpu_tests::cgroup::container::container_env(&mut node.cri, id)
        .await
        .must("reading the container's environment");
    env.get(&format!("DRA_CPUSET_{claim_uid}"))
        .and_then(|v| CpuSet::parse_cpulist(v).ok())
}

/// Scheduler and kubelet for a pod whose one container `app` names a fresh
/// claim of one CPU and requests `request_milli`.
pub async fn claim_pod(
    node: &mut Node,
    name: &str,
    request_milli: Option<i64>,
) -> (PreparedClaim, RunningPod, String) {
    claim_pod_on(node, name, None, 1, request_milli).await
}

/// Like [`claim_pod`], a claim of `cpus` CPUs from grouped device `device`
/// (`None`: where the scheduler finds them).
pub async fn claim_pod_on(
    node: &mut Node,
    name: &str,
    device: Option<&str>,
    cpus: u32,
    request_milli: Option<i64>,
) -> (PreparedClaim, RunningPod, String) {
    let (_pod, claim, running) = node
        .start_claim_pod(name, device, cpus, request_milli)
        .await
        .must(&format!(
            "preparing the claim of {name} and starting its pod"
        ));
    let id = running.id("app").to_string();
    (claim, running, id)
}
