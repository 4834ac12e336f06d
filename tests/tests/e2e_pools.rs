//! End-to-end pool scenarios on a real node: containerd with NRI, dra-plugin
//! and nri-plugin as their own processes, the fake API server, the kubelet
//! stand-ins. Every check reads the container's cgroup cpuset and the
//! `Cpus_allowed_list` of a process inside it. Needs root and
//! `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::{PodIdentity, RunningPod};
use dra_cpu_tests::node::read_back::log_messages_with;
use e2e_common::{claim_env, claim_pod, node, node_with_mixed_mode, shared_pod};

/// Kubelet deleting a claim pod: pod first, then unprepare.
async fn delete_claim_pod(
    node: &mut dra_cpu_tests::node::Node,
    claim: &PreparedClaim,
    pod: &RunningPod,
) {
    node.delete_pod(pod).await.must("deleting the claim pod");
    node.unprepare(&claim.claim).await.must("unpreparing");
    node.after_unprepare()
        .await
        .must("the event after unprepare");
}

#[tokio::test]
async fn exclusive_claim_pins_its_container_and_the_shared_pool_shrinks_and_grows_back() {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    node.wait_cpus(&a, &all).await.must("A on every CPU");

    let (claim, pod_b, b) = claim_pod(&mut node, "pod-b", None).await;
    assert_eq!(claim.cpus.len(), 1, "a 1-CPU claim got {}", claim.cpus);
    assert!(claim.cpus.is_subset(&all));
    let pinned = node.wait_cpus(&b, &claim.cpus).await.must("B pinned");
    assert_eq!(pinned.allowed_inside, claim.cpus);
    assert_eq!(
        claim_env(&mut node, &b, &claim.claim.uid).await,
        Some(claim.cpus.clone()),
        "B sees its claim's CPUs in its environment"
    );
    let pool = all.difference(&claim.cpus);
    node.wait_cpus(&a, &pool)
        .await
        .must("A shrinks off B's CPU");

    delete_claim_pod(&mut node, &claim, &pod_b).await;
    assert_eq!(
        node.claim_cpus(&claim.claim.uid),
        None,
        "the claim's CDI spec is gone after unprepare"
    );
    node.wait_cpus(&a, &all).await.must("A grows back");

    // Unsolicited updates only where the runtime is known to take them.
    let runtime = node.runtime_version().await.must("runtime version");
    let safe = node.unsolicited_updates_safe();
    if runtime.starts_with("containerd 1.") {
        assert_eq!(safe, Some(false), "{runtime} has NRI 0.6: not safe");
    }
    let log = node.nri_log();
    let unsolicited = log_messages_with(&log, "sent as an unsolicited update");
    let deferred = log_messages_with(&log, "pool change deferred");
    match safe {
        Some(true) => assert!(!unsolicited.is_empty(), "grow-back sent at once"),
        _ => {
            assert!(unsolicited.is_empty(), "{runtime}: {unsolicited:?}");
            assert!(
                !deferred.is_empty(),
                "{runtime}: the grow-back is deferred and says so"
            );
        }
    }
}

#[tokio::test]
async fn mixed_mode_on_gives_claim_and_pool_only_to_containers_that_request_cpu() {
    let mut node = node_with_mixed_mode(true).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    // (CPU request, whether the container gets the shared pool too)
    let cases = [(Some(250), true), (None, false), (Some(1), false)];
    for (i, (request, mixed)) in cases.into_iter().enumerate() {
        let (claim, pod, id) = claim_pod(&mut node, &format!("pod-m{i}"), request).await;
        let pool = all.difference(&claim.cpus);
        let want = if mixed {
            claim.cpus.union(&pool)
        } else {
            claim.cpus.clone()
        };
        node.wait_cpus(&id, &want)
            .await
            .must(&format!("case {i}: request {request:?}"));
        node.wait_cpus(&a, &pool).await.must(&format!(
            "case {i}: the shared container leaves the claim's CPU"
        ));
        delete_claim_pod(&mut node, &claim, &pod).await;
        node.wait_cpus(&a, &all)
            .await
            .must(&format!("case {i}: the shared container grows back"));
    }
}

#[tokio::test]
async fn mixed_mode_off_keeps_a_cpu_requesting_claim_container_exclusive() {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    let (claim, _pod, id) = claim_pod(&mut node, "pod-m", Some(250)).await;
    node.wait_cpus(&id, &claim.cpus)
        .await
        .must("exclusive only with the mode off");
    node.wait_cpus(&a, &all.difference(&claim.cpus))
        .await
        .must("the shared container leaves the claim's CPU");
}

#[tokio::test]
async fn a_later_claim_shrinks_shared_and_mixed_containers_and_its_unprepare_grows_them() {
    // On a two-CPU machine the second claim takes the last shared CPU: the
    // shared pool's floor is off here (e2e_refusals tests it).
    let mut node = node(NodeOptions {
        mixed_allocation_mode: true,
        min_shared_cpus: Some(0),
        ..Default::default()
    })
    .await;
    let all = node.allocatable().must("online CPUs");
    // A shared container needs a CPU left for it after both claims; on a
    // two-CPU machine only the mixed container can be watched shrinking.
    let with_shared = all.len() >= 3;
    let shared = if with_shared {
        Some(shared_pod(&mut node, "pod-a", 500).await.1)
    } else {
        eprintln!("{} CPUs: no CPU would stay for a shared container after two claims; checking the mixed container only", all.len());
        None
    };
    let (first, _pod_m, m) = claim_pod(&mut node, "pod-m", Some(250)).await;
    let pool = all.difference(&first.cpus);
    node.wait_cpus(&m, &first.cpus.union(&pool))
        .await
        .must("mixed before the second claim");

    let later = PodIdentity::new("pod-x");
    let second = node
        .create_claim("pod-x-cpu", 1, &later)
        .await
        .must("preparing the second claim");
    assert!(
        second.cpus.is_disjoint(&first.cpus),
        "{} vs {}",
        second.cpus,
        first.cpus
    );
    let smaller = pool.difference(&second.cpus);
    // Kubelet starts the claim's pod right after Prepare; its CreateContainer
    // reply carries the shrink.
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&second.cdi_device);
    let pod_x = node.start_pod(&later, &[spec]).await.must("starting pod-x");
    node.wait_cpus(pod_x.id("app"), &second.cpus)
        .await
        .must("pod-x pinned");
    node.wait_cpus(&m, &first.cpus.union(&smaller))
        .await
        .must("mixed shrinks by the second claim");
    if let Some(a) = &shared {
        node.wait_cpus(a, &smaller)
            .await
            .must("shared shrinks by the second claim");
    }

    delete_claim_pod(&mut node, &second, &pod_x).await;
    node.wait_cpus(&m, &first.cpus.union(&pool))
        .await
        .must("mixed grows back");
    if let Some(a) = &shared {
        node.wait_cpus(a, &pool).await.must("shared grows back");
    }
}

#[tokio::test]
async fn a_restarted_claim_container_keeps_its_cpus() {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    let (claim, pod_b, b) = claim_pod(&mut node, "pod-b", None).await;
    node.wait_cpus(&b, &claim.cpus).await.must("B pinned");

    // The container exits and kubelet creates it again in the same sandbox.
    node.cri.stop_container(&b, 0).await.must("stopping B");
    node.cri.remove_container(&b).await.must("removing B");
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let again = node
        .cri
        .run_container(&pod_b.sandbox, &spec)
        .await
        .must("creating B again");
    assert_ne!(again, b, "a new container");
    node.wait_cpus(&again, &claim.cpus)
        .await
        .must("the new B has the same CPUs");
    node.wait_cpus(&a, &all.difference(&claim.cpus))
        .await
        .must("A still off B's CPU");
    assert_eq!(node.claim_cpus(&claim.claim.uid), Some(claim.cpus.clone()));
}

/// A claim whose request lists `firstAvailable` subrequests is allocated from
/// `cpus/fit`; its container names `request: cpus`, as a pod spec does. The
/// kubelet stand-in hands it the CDI device only if dra-plugin answers
/// `request_names: ["cpus"]` (kubelet's `cdiDevicesAsList`), so the container
/// runs pinned to the claim's CPUs, not on the shared pool.
#[tokio::test]
async fn a_first_available_claim_pins_the_container_naming_its_request() {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_shared, a) = shared_pod(&mut node, "pod-a", 500).await;
    let pod = PodIdentity::new("pod-fa");
    let claim = node
        .allocate_first_available_claim("pod-fa-cpu", 1, &pod)
        .must("allocating the firstAvailable claim");
    let prepared = node
        .prepare_for_request(&claim, "cpus")
        .await
        .must("kubelet gives the container naming request cpus the claim's CDI device");
    assert_eq!(prepared.cpus.len(), 1, "got {}", prepared.cpus);
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&prepared.cdi_device);
    let running = node.start_pod(&pod, &[spec]).await.must("starting pod-fa");
    let id = running.id("app").to_string();
    let pinned = node
        .wait_cpus(&id, &prepared.cpus)
        .await
        .must("the container is pinned to its claim's CPUs");
    assert_eq!(pinned.allowed_inside, prepared.cpus);
    node.wait_cpus(&a, &all.difference(&prepared.cpus))
        .await
        .must("the shared container shrinks off the claim's CPU");
    delete_claim_pod(&mut node, &prepared, &running).await;
    node.wait_cpus(&a, &all)
        .await
        .must("the shared container grows back");
}

/// A cpuset written into a container's cgroup behind the runtime's back (as
/// an update the runtime dropped while reporting success would leave it) is
/// found by nri-plugin's read-back and sent again: a shared container put
/// on a claim's CPU leaves it, the claim container moved off its CPU gets it
/// back. The control is the same node with the read-back off, where neither
/// an event nor time brings them back.
#[tokio::test]
async fn a_cpuset_written_behind_the_runtimes_back_is_found_and_sent_again() {
    let mut node = node(NodeOptions {
        cpuset_check_seconds: Some(0),
        ..Default::default()
    })
    .await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    let (claim, _pod_b, b) = claim_pod(&mut node, "pod-b", None).await;
    let pool = all.difference(&claim.cpus);
    node.wait_cpus(&a, &pool).await.must("A on the shared pool");
    node.wait_cpus(&b, &claim.cpus).await.must("B on its claim");
    let off_claim: shared_state::CpuSet = pool.iter().take(1).collect();
    node.write_cgroup_cpus(&a, &all)
        .await
        .must("A written onto every CPU");
    node.write_cgroup_cpus(&b, &off_claim)
        .await
        .must("B written off its claim");

    // Control: read-back off.
    node.nudge().await.must("an event");
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        node.cpus(&a).await.must("A").cgroup.cpus,
        all,
        "control: without the read-back A stays on the claim's CPU"
    );
    assert_eq!(
        node.cpus(&b).await.must("B").cgroup.cpus,
        off_claim,
        "control: without the read-back B stays off its claim"
    );

    // The runtime's own record still holds what nri-plugin sent, so a
    // restart alone (its Synchronize) plans nothing: the read-back finds it,
    // through a read-only mount of the cgroups as the chart gives it.
    node.stop_nri_plugin();
    node.start_nri_plugin_with_cpuset_check_on_read_only_cgroups(1)
        .await
        .must("nri-plugin with the read-back every second");
    node.wait_log(true, "the cgroup root is not writable")
        .await
        .must("no partitions on a read-only cgroup root");
    node.wait_log(true, "holds another cpuset than the one applied")
        .await
        .must("the drift found");
    if node.unsolicited_updates_safe() != Some(true) {
        node.nudge().await.must("an event to carry the repair");
    }
    node.wait_cpus(&a, &pool)
        .await
        .must("A back on the shared pool");
    node.wait_cpus(&b, &claim.cpus)
        .await
        .must("B back on its claim");
    let metrics = node
        .nri_metrics()
        .await
        .expect("nri-plugin answers /metrics");
    assert_eq!(
        dra_cpu_tests::node::read_back::metric_value(
            &metrics,
            "nri_plugin_cpuset_drifts_total{verdict=\"repaired\"}"
        ),
        Some(2.0),
        "both containers counted once"
    );
}
