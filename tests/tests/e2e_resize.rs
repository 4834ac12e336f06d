//! In-place resize on a real node: kubelet resizes a running container by
//! CRI `UpdateContainerResources` (new shares and quota, no cpuset);
//! containerd passes it to NRI `UpdateContainer` and merges nri-plugin's
//! answer over the request. The container's kind changes at once, and later
//! pool changes follow the new kind. Every check reads the container's
//! cgroup and the `Cpus_allowed_list` of a process inside it. Needs root and
//! `scripts/install-deps.sh`; `scripts/e2e-containerd2.sh` runs it on
//! containerd 2.x.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cgroup::weight::cpu_weight_of;
use dra_cpu_tests::cri::resources::milli_cpu_to_shares;
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::{PodIdentity, RunningPod};
use dra_cpu_tests::node::read_back::log_messages_with;
use dra_cpu_tests::node::Node;
use e2e_common::{claim_pod, node, shared_pod};

/// Mixed mode on; the shared pool's floor off, so a later claim may take
/// the last shared CPU of a two-CPU machine.
async fn mixed_node() -> Node {
    node(NodeOptions {
        mixed_allocation_mode: true,
        min_shared_cpus: Some(0),
        ..Default::default()
    })
    .await
}

/// Kubelet resizing container `id` to `request_milli`, then checking that
/// the runtime applied the new weight (the resize itself went through).
async fn resize(node: &mut Node, id: &str, request_milli: Option<i64>) {
    node.cri
        .resize_container(id, request_milli, None)
        .await
        .must(&format!("resizing {id} to {request_milli:?}"));
    let pid = node.cri.container_pid(id).await.must("the container's pid");
    let weight = cpu_weight_of(pid).must("the container's CPU weight");
    let shares = milli_cpu_to_shares(request_milli.unwrap_or(0)) as u64;
    assert!(
        weight.matches_shares(shares),
        "after the resize to {request_milli:?} the cgroup has {weight:?}, not {shares} shares"
    );
}

/// A claim of one CPU for a later pod, prepared and its pod started (its
/// CreateContainer reply carries the shrink), then deleted and unprepared
/// (the grow-back rides on the next event where it must).
struct LaterClaim {
    claim: PreparedClaim,
    pod: RunningPod,
}

async fn start_later_claim(node: &mut Node, name: &str) -> LaterClaim {
    let pod = PodIdentity::new(name);
    let claim = node
        .create_claim(&format!("{name}-cpu"), 1, &pod)
        .await
        .must("preparing the later claim");
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let running = node.start_pod(&pod, &[spec]).await.must("starting it");
    node.wait_cpus(running.id("app"), &claim.cpus)
        .await
        .must("the later claim's container pinned");
    LaterClaim {
        claim,
        pod: running,
    }
}

async fn end_later_claim(node: &mut Node, later: LaterClaim) {
    node.delete_pod(&later.pod).await.must("deleting its pod");
    node.unprepare(&later.claim.claim)
        .await
        .must("unpreparing it");
    node.after_unprepare()
        .await
        .must("the event after unprepare");
}

/// The kind changes nri-plugin logged, as (from, to).
fn kind_changes(node: &Node) -> Vec<(String, String)> {
    log_messages_with(&node.nri_log(), "container kind changed")
        .iter()
        .map(|v| {
            let field = |name: &str| {
                v.pointer(&format!("/fields/{name}"))
                    .and_then(|f| f.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            (field("from"), field("to"))
        })
        .collect()
}

#[tokio::test]
async fn an_exclusive_container_that_gains_a_cpu_request_becomes_mixed_and_later_claims_shrink_it()
{
    let mut node = mixed_node().await;
    let all = node.allocatable().must("online CPUs");
    let (claim, _pod, c) = claim_pod(&mut node, "pod-r", None).await;
    node.wait_cpus(&c, &claim.cpus)
        .await
        .must("exclusive before the resize");
    let pool = all.difference(&claim.cpus);

    resize(&mut node, &c, Some(500)).await;
    let mixed = node
        .wait_cpus(&c, &claim.cpus.union(&pool))
        .await
        .must("mixed at once after gaining a request");
    assert_eq!(mixed.allowed_inside, claim.cpus.union(&pool));
    assert_eq!(
        kind_changes(&node),
        vec![("exclusive".to_string(), "mixed".to_string())]
    );

    let later = start_later_claim(&mut node, "pod-x").await;
    let smaller = pool.difference(&later.claim.cpus);
    node.wait_cpus(&c, &claim.cpus.union(&smaller))
        .await
        .must("the later claim shrinks the container that became mixed");
    end_later_claim(&mut node, later).await;
    node.wait_cpus(&c, &claim.cpus.union(&pool))
        .await
        .must("and its unprepare grows it back");
}

#[tokio::test]
async fn a_mixed_container_that_drops_its_cpu_request_becomes_exclusive_and_pool_changes_pass_it_by(
) {
    let mut node = mixed_node().await;
    let all = node.allocatable().must("online CPUs");
    let (claim, _pod, c) = claim_pod(&mut node, "pod-r", Some(250)).await;
    let pool = all.difference(&claim.cpus);
    node.wait_cpus(&c, &claim.cpus.union(&pool))
        .await
        .must("mixed before the resize");

    resize(&mut node, &c, None).await;
    let exclusive = node
        .wait_cpus(&c, &claim.cpus)
        .await
        .must("exclusive at once after dropping its request");
    assert_eq!(exclusive.allowed_inside, claim.cpus);
    assert_eq!(
        kind_changes(&node),
        vec![("mixed".to_string(), "exclusive".to_string())]
    );

    // A later claim's shrink and its unprepare's grow-back: a container
    // still held as mixed would be given the shared pool again by the
    // grow-back, which rides on the reply to the event after the unprepare.
    let later = start_later_claim(&mut node, "pod-x").await;
    let now = node.cpus(&c).await.must("reading the container");
    assert_eq!(
        (&now.cgroup.cpus, &now.allowed_inside),
        (&claim.cpus, &claim.cpus)
    );
    end_later_claim(&mut node, later).await;
    let now = node.cpus(&c).await.must("reading the container");
    assert_eq!(
        (&now.cgroup.cpus, &now.allowed_inside),
        (&claim.cpus, &claim.cpus),
        "the grow-back passed the container that became exclusive by"
    );
}

#[tokio::test]
async fn a_shared_container_keeps_the_shared_pool_and_a_cpuset_in_the_request_never_wins() {
    let mut node = mixed_node().await;
    let all = node.allocatable().must("online CPUs");
    let (_shared, s) = shared_pod(&mut node, "pod-s", 500).await;
    let (claim, _pod, m) = claim_pod(&mut node, "pod-m", Some(250)).await;
    let pool = all.difference(&claim.cpus);
    let mixed = claim.cpus.union(&pool);
    node.wait_cpus(&s, &pool).await.must("shared on the pool");
    node.wait_cpus(&m, &mixed).await.must("mixed");

    for request in [None, Some(1000), Some(100)] {
        resize(&mut node, &s, request).await;
        let now = node.cpus(&s).await.must("reading the shared container");
        assert_eq!(
            (&now.cgroup.cpus, &now.allowed_inside),
            (&pool, &pool),
            "shared after a resize to {request:?}"
        );
    }
    assert!(kind_changes(&node).is_empty(), "{:?}", kind_changes(&node));

    // Kubelet's static CPU manager updates a cpuset alone
    // (`updateContainerCPUSet`: no shares, which NRI then reports as 0).
    // nri-plugin's answer is merged over the request's cpuset, and a request
    // without shares changes no kind.
    for (id, requested, want) in [(&s, &claim.cpus, &pool), (&m, &pool, &mixed)] {
        let cpuset_only = k8s_cri::v1::LinuxContainerResources {
            cpuset_cpus: requested.to_cpulist(),
            ..Default::default()
        };
        node.cri
            .update_container_resources(id, cpuset_only)
            .await
            .must("an update of the cpuset alone");
        let now = node.cpus(id).await.must("reading the container");
        assert_eq!(
            (&now.cgroup.cpus, &now.allowed_inside),
            (want, want),
            "{id} keeps {want}, not the request's {requested}"
        );
    }
    assert!(kind_changes(&node).is_empty(), "{:?}", kind_changes(&node));
}
