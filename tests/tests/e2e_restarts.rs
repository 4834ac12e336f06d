//! End-to-end restarts: kill -9 of nri-plugin between two pod starts, kill -9
//! of dra-plugin with claims prepared, a containerd restart. After each,
//! every container's cpuset (cgroup and inside) is right and new claims
//! work. Needs root and `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::pods::RunningPod;
use dra_cpu_tests::node::Node;
use e2e_common::{claim_pod, node_with_mixed_mode, shared_pod};
use shared_state::CpuSet;

/// A node with shared pod A and claim pod B, B pinned to its claim and A
/// on the rest: the node, its CPUs, A's container, B's claim, pod and
/// container, and the shared pool.
async fn shared_and_claim_pods() -> (
    Node,
    CpuSet,
    String,
    PreparedClaim,
    RunningPod,
    String,
    CpuSet,
) {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    let (claim, pod_b, b) = claim_pod(&mut node, "pod-b", None).await;
    let pool = all.difference(&claim.cpus);
    node.wait_cpus(&b, &claim.cpus).await.must("B pinned");
    node.wait_cpus(&a, &pool).await.must("A off B's CPU");
    (node, all, a, claim, pod_b, b, pool)
}

/// New claims work: the old claim pod goes, the shared container grows
/// back, a new claim pod is pinned and the shared container shrinks again.
async fn new_claims_work(
    node: &mut Node,
    all: &CpuSet,
    shared: &str,
    old: (&PreparedClaim, &RunningPod),
) -> CpuSet {
    node.delete_pod(old.1)
        .await
        .must("deleting the old claim pod");
    node.unprepare(&old.0.claim)
        .await
        .must("unpreparing the old claim");
    node.after_unprepare()
        .await
        .must("the event after unprepare");
    node.wait_cpus(shared, all).await.must("shared grows back");
    let (claim, _pod, id) = claim_pod(node, "pod-new", None).await;
    node.wait_cpus(&id, &claim.cpus)
        .await
        .must("new claim pinned");
    let pool = all.difference(&claim.cpus);
    node.wait_cpus(shared, &pool)
        .await
        .must("shared shrinks for the new claim");
    pool
}

#[tokio::test]
async fn nri_plugin_killed_between_two_pod_starts_repairs_every_container() {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    node.wait_cpus(&a, &all).await.must("A on every CPU");

    node.kill_nri_plugin();
    // Kubelet goes on: a claim pod starts while nobody pins it.
    let (claim, pod_b, b) = claim_pod(&mut node, "pod-b", None).await;
    let (_pod_c, c) = shared_pod(&mut node, "pod-c", 500).await;
    let unpinned = node.cpus(&b).await.must("B while nri-plugin is down");
    assert_eq!(
        unpinned.cgroup.cpus, all,
        "nothing pins a container while nri-plugin is down"
    );
    node.start_nri_plugin()
        .await
        .must("starting nri-plugin again");

    let pool = all.difference(&claim.cpus);
    node.wait_cpus(&b, &claim.cpus)
        .await
        .must("B pinned by the resync");
    node.wait_cpus(&a, &pool)
        .await
        .must("A shrunk by the resync");
    node.wait_cpus(&c, &pool)
        .await
        .must("C shrunk by the resync");
    new_claims_work(&mut node, &all, &a, (&claim, &pod_b)).await;
}

#[tokio::test]
async fn dra_plugin_killed_with_claims_prepared_restarts_from_its_store() {
    let (mut node, all, a, claim, pod_b, b, pool) = shared_and_claim_pods().await;

    node.kill_dra_plugin();
    // nri-plugin keeps enforcing; a restarted claim container is checked
    // against the CDI spec on disk.
    node.cri.stop_container(&b, 0).await.must("stopping B");
    node.cri.remove_container(&b).await.must("removing B");
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let b = node
        .cri
        .run_container(&pod_b.sandbox, &spec)
        .await
        .must("creating B again while dra-plugin is down");
    node.wait_cpus(&b, &claim.cpus)
        .await
        .must("B pinned while dra-plugin is down");
    node.wait_cpus(&a, &pool).await.must("A unchanged");

    node.start_dra_plugin()
        .await
        .must("starting dra-plugin again");
    node.wait_nri_ready(true)
        .await
        .must("nri-plugin subscribed again");
    // Kubelet retries prepares it is unsure of: the same CPUs come back.
    let again = node.prepare(&claim.claim).await.must("preparing again");
    assert_eq!(again.cpus, claim.cpus, "the store kept the claim's CPUs");
    assert_eq!(again.cdi_device, claim.cdi_device);
    node.wait_cpus(&b, &claim.cpus).await.must("B still pinned");
    node.wait_cpus(&a, &pool).await.must("A still off B's CPU");
    let mut pod_b = pod_b;
    pod_b.containers = vec![("app".to_string(), b)];
    new_claims_work(&mut node, &all, &a, (&claim, &pod_b)).await;
}

#[tokio::test]
async fn containerd_restart_keeps_every_cpuset_and_claims_keep_working() {
    let (mut node, all, a, claim, pod_b, b, pool) = shared_and_claim_pods().await;

    node.restart_containerd()
        .await
        .must("restarting containerd");
    node.wait_cpus(&b, &claim.cpus)
        .await
        .must("B pinned after the restart");
    node.wait_cpus(&a, &pool)
        .await
        .must("A on the pool after the restart");
    let (_pod_c, c) = shared_pod(&mut node, "pod-c", 500).await;
    node.wait_cpus(&c, &pool)
        .await
        .must("a new shared container on the pool");
    let pool = new_claims_work(&mut node, &all, &a, (&claim, &pod_b)).await;
    node.wait_cpus(&c, &pool).await.must("C follows the pool");
}
