//! End-to-end refusals: a container the product must not pin as asked is
//! refused at CreateContainer with a reason the user reads in the CRI error
//! and the operator in nri-plugin's log, and nothing else on the node
//! changes. Every check reads cgroups. Needs root and `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::cri::{new_uid, CriError};
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::read_back::log_messages_with;
use dra_cpu_tests::node::Node;
use e2e_common::{node, node_with_mixed_mode, shared_pod};
use serde_json::Value;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::path::Path;

/// What the user gets back from CreateContainer.
fn refusal_text(result: Result<String, CriError>, what: &str) -> String {
    match result {
        Ok(id) => panic!("{what}: container {id} was created, want a refusal"),
        Err(e) => e.runtime_message().unwrap_or_default().to_string(),
    }
}

/// The `reason` fields of nri-plugin's "container refused" log lines.
fn refusal_reasons(node: &Node) -> Vec<String> {
    log_messages_with(&node.nri_log(), "container refused")
        .iter()
        .filter_map(|v| v.pointer("/fields/reason").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// Every container's cpuset (cgroup and inside), to compare before and after.
async fn snapshot(node: &mut Node, ids: &[&str]) -> Vec<(CpuSet, CpuSet)> {
    let mut out = Vec::new();
    for id in ids {
        let now = node.cpus(id).await.must("reading a cpuset");
        out.push((now.cgroup.cpus, now.allowed_inside));
    }
    out
}

async fn claim_pod(node: &mut Node, name: &str) -> (PodIdentity, PreparedClaim, String) {
    let (pod, claim, running) = node
        .start_claim_pod(name, None, 1, None)
        .await
        .must("preparing a claim and starting its pod");
    node.wait_cpus(running.id("app"), &claim.cpus)
        .await
        .must("claim container pinned");
    (pod, claim, running.id("app").to_string())
}

#[tokio::test]
async fn forged_claim_environment_is_refused_and_changes_nothing() {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    let (_b, claim, b) = claim_pod(&mut node, "pod-b").await;
    node.wait_cpus(&a, &all.difference(&claim.cpus))
        .await
        .must("A off B's CPU");
    let before = snapshot(&mut node, &[&a, &b]).await;
    let other_cpus = all.difference(&claim.cpus);
    let uid = claim.claim.uid.clone();
    // (env name, env value, the reasons the refusal may give)
    let cases: Vec<(String, String, &[&str])> = vec![
        (
            format!("DRA_CPUSET_{}", new_uid()),
            claim.cpus.to_cpulist(),
            &["claim-not-prepared"],
        ),
        (
            format!("DRA_CPUSET_{uid}"),
            claim.cpus.to_cpulist(),
            &["wrong-pod", "claim-owned"],
        ),
        (
            format!("DRA_CPUSET_{uid}"),
            other_cpus.to_cpulist(),
            &["cpus-mismatch", "wrong-pod"],
        ),
        (
            format!("DRA_CPUSET_{uid}"),
            "not-a-cpulist".to_string(),
            &["bad-env"],
        ),
    ];
    for (i, (name, value, reasons)) in cases.into_iter().enumerate() {
        let refused_before = refusal_reasons(&node).len();
        let pod = PodIdentity::new(&format!("forger-{i}"));
        let sandbox = node
            .cri
            .run_pod(&pod.name, "default", &pod.uid)
            .await
            .must("forger sandbox");
        let spec = ContainerSpec::sleeper("app").with_env(&name, &value);
        let text = refusal_text(
            node.cri.create_container(&sandbox, &spec).await,
            &format!("case {i}: {name}={value}"),
        );
        assert!(
            text.contains("dra-cpu refuses container"),
            "case {i}: CRI error {text:?}"
        );
        let log = node
            .wait_log(true, "container refused")
            .await
            .must("refusal log line");
        assert!(log.len() > refused_before, "case {i}: a new log line");
        let reasons_now = refusal_reasons(&node);
        let reason = reasons_now.last().cloned().unwrap_or_default();
        assert!(
            reasons.contains(&reason.as_str()),
            "case {i}: reason {reason:?}, want one of {reasons:?}"
        );
        let left = node
            .cri
            .list_containers(Some(&sandbox.id))
            .await
            .must("listing the forger's containers");
        assert!(left.is_empty(), "case {i}: no container left: {left:?}");
        assert_eq!(
            snapshot(&mut node, &[&a, &b]).await,
            before,
            "case {i}: nothing else changes"
        );
        assert_eq!(node.claim_cpus(&uid), Some(claim.cpus.clone()));
        node.cri
            .delete_pod(&sandbox.id)
            .await
            .must("removing the forger");
    }
}

#[tokio::test]
async fn a_claim_named_by_two_containers_is_refused_for_the_second() {
    let mut node = node_with_mixed_mode(false).await;
    let pod = PodIdentity::new("pod-b");
    let claim = node
        .create_claim("pod-b-cpu", 1, &pod)
        .await
        .must("preparing the claim");
    let first = ContainerSpec::sleeper("first").with_cdi_device(&claim.cdi_device);
    let running = node.start_pod(&pod, &[first]).await.must("first container");
    let first_id = running.id("first").to_string();
    node.wait_cpus(&first_id, &claim.cpus)
        .await
        .must("first pinned");
    let before = snapshot(&mut node, &[&first_id]).await;

    let second = ContainerSpec::sleeper("second").with_cdi_device(&claim.cdi_device);
    let text = refusal_text(
        node.cri.create_container(&running.sandbox, &second).await,
        "second container of one claim",
    );
    assert!(
        text.contains("dra-cpu refuses container"),
        "CRI error {text:?}"
    );
    assert!(text.contains(&claim.claim.uid), "names the claim: {text:?}");
    node.wait_log(true, "container refused")
        .await
        .must("refusal log line");
    assert_eq!(
        refusal_reasons(&node).last().map(String::as_str),
        Some("claim-owned")
    );
    let containers = node
        .cri
        .list_containers(Some(&running.sandbox.id))
        .await
        .must("listing the pod's containers");
    assert_eq!(
        containers.len(),
        1,
        "only the first container: {containers:?}"
    );
    assert_eq!(snapshot(&mut node, &[&first_id]).await, before);
}

/// Claims of the CPUs of `free` but the `keep` highest, one claim per NUMA
/// node's grouped device (a claim cannot span devices): how a scheduler
/// would hand them out on any node shape.
async fn claim_all_but(
    node: &Node,
    prefix: &str,
    free: &CpuSet,
    keep: usize,
    pod: &PodIdentity,
) -> Vec<PreparedClaim> {
    let topology = Topology::discover(Path::new("/")).must("the host's CPU topology");
    let ids: Vec<u32> = free.iter().collect();
    let kept: CpuSet = ids[ids.len().saturating_sub(keep)..]
        .iter()
        .copied()
        .collect();
    let mut claims = Vec::new();
    for numa in topology.numa_nodes() {
        let take = topology
            .cpus_in_numa(numa)
            .intersection(free)
            .difference(&kept);
        if take.is_empty() {
            continue;
        }
        let claim = node
            .create_claim_on(
                &format!("{prefix}-{numa}"),
                &format!("cpudevnuma{numa:03}"),
                u32::try_from(take.len()).must("CPU count"),
                pod,
            )
            .await
            .must(&format!("the claim of NUMA node {numa}'s free CPUs {take}"));
        claims.push(claim);
    }
    claims
}

#[tokio::test]
async fn the_last_shared_cpu_is_kept_back_at_prepare_and_a_refused_claim_prepares_once_cpus_are_freed(
) {
    let mut node = node_with_mixed_mode(false).await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    node.wait_cpus(&a, &all).await.must("A on every CPU");
    let pool = all.clone();

    // Claims of every CPU but one are prepared; the shared pool is then
    // its floor (--min-shared-cpus, default 1).
    let taker = PodIdentity::new("pod-x");
    let claims = claim_all_but(&node, "pod-x-cpu", &pool, 1, &taker).await;
    assert!(!claims.is_empty(), "a node of {all} has CPUs to claim");
    let held = claims
        .iter()
        .fold(CpuSet::new(), |held, c| held.union(&c.cpus));
    let last = all.difference(&held);
    assert_eq!(last.len(), 1, "one CPU left in the shared pool: {last}");
    // An NRI event carries the pool change where the runtime takes no
    // unsolicited updates (containerd 1.7).
    node.nudge().await.must("an NRI event");
    node.wait_cpus(&a, &last)
        .await
        .must("A on the last shared CPU");
    let before = snapshot(&mut node, &[&a]).await;

    // The claim of that last CPU is refused at prepare, with its reason.
    let late = PodIdentity::new("pod-late");
    let topology = Topology::discover(Path::new("/")).must("the host's CPU topology");
    let numa = topology
        .numa_nodes()
        .into_iter()
        .find(|n| !topology.cpus_in_numa(*n).is_disjoint(&last));
    let numa = numa
        .ok_or("no NUMA node holds it")
        .must("the NUMA node of the last CPU");
    let late_claim = node
        .allocate_claim_on("pod-late-cpu", &format!("cpudevnuma{numa:03}"), 1, &late)
        .must("allocating the claim of the last CPU");
    let error = match node.prepare(&late_claim).await {
        Ok(prepared) => panic!("the last shared CPU was handed out: {}", prepared.cpus),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("in the shared pool") && error.contains("--min-shared-cpus"),
        "the refusal names the floor: {error}"
    );
    assert_eq!(
        snapshot(&mut node, &[&a]).await,
        before,
        "the shared container keeps the last CPU"
    );
    let stored: Vec<String> = node
        .stored_claims()
        .await
        .must("stored claims")
        .into_iter()
        .map(|c| c.uid)
        .collect();
    assert!(
        !stored.contains(&late_claim.uid),
        "a refused claim is not stored: {stored:?}"
    );

    // Kubelet retries; once a claim frees CPUs the same claim prepares.
    node.unprepare(&claims[0].claim).await.must("unpreparing");
    let prepared = node
        .prepare(&late_claim)
        .await
        .must("the refused claim, retried after CPUs were freed");
    assert_eq!(prepared.cpus.len(), 1);
    node.nudge().await.must("an NRI event");
    let pool = all.difference(&held.difference(&claims[0].cpus).union(&prepared.cpus));
    node.wait_cpus(&a, &pool).await.must("A follows the pool");
}

#[tokio::test]
async fn with_no_floor_an_exhausted_shared_pool_refuses_new_shared_containers_and_changes_nothing()
{
    let mut node = node(NodeOptions {
        min_shared_cpus: Some(0),
        ..Default::default()
    })
    .await;
    let all = node.allocatable().must("online CPUs");
    let (_pod_a, a) = shared_pod(&mut node, "pod-a", 500).await;
    let (_b, first, b) = claim_pod(&mut node, "pod-b").await;
    let pool = all.difference(&first.cpus);
    node.wait_cpus(&a, &pool).await.must("A off B's CPU");

    // --min-shared-cpus 0: claims of every CPU left are prepared (dra-plugin
    // does not know the containers); the refusal is nri-plugin's, at the
    // first shared container that would get an empty cpuset.
    let taker = PodIdentity::new("pod-x");
    let claims = claim_all_but(&node, "pod-x-cpu", &pool, 0, &taker).await;
    let taken = claims.iter().fold(CpuSet::new(), |t, c| t.union(&c.cpus));
    assert_eq!(taken, pool, "the claims take every CPU left");
    let before = snapshot(&mut node, &[&a, &b]).await;

    let late = PodIdentity::new("pod-late");
    let sandbox = node
        .cri
        .run_pod(&late.name, "default", &late.uid)
        .await
        .must("late sandbox");
    let spec = ContainerSpec::sleeper("app").with_cpu(Some(100), None);
    let text = refusal_text(
        node.cri.create_container(&sandbox, &spec).await,
        "a shared container with no shared CPU left",
    );
    assert!(
        text.contains("dra-cpu refuses container"),
        "CRI error {text:?}"
    );
    node.wait_log(true, "container refused")
        .await
        .must("refusal log line");
    assert_eq!(
        refusal_reasons(&node).last().map(String::as_str),
        Some("empty-shared-pool")
    );
    assert_eq!(
        snapshot(&mut node, &[&a, &b]).await,
        before,
        "running containers keep their cpusets"
    );

    // Once the claims go, shared containers start again.
    for claim in &claims {
        node.unprepare(&claim.claim).await.must("unpreparing");
    }
    let id = node
        .cri
        .run_container(&sandbox, &spec)
        .await
        .must("a shared container after the pool is back");
    node.wait_cpus(&id, &pool).await.must("on the shared pool");
    node.wait_cpus(&a, &pool).await.must("A on the shared pool");
}

/// A claim shared by name: kubelet prepares it once per node, so a pod the
/// scheduler adds to its `reservedFor` later is not in dra-plugin's record.
/// Its container is refused while the claim's `reservedFor` does not name
/// it (the control), and gets the claim's CPUs once it does and the first
/// pod's container is gone, without another prepare; the record names the
/// new pod from then on (it survives restarts).
#[tokio::test]
async fn a_pod_added_to_a_prepared_claims_reserved_for_gets_its_cpus() {
    let mut node = node_with_mixed_mode(false).await;
    let (pod_a, claim, running_a) = node
        .start_claim_pod("pod-a", None, 1, None)
        .await
        .must("pod A with its claim");
    node.wait_cpus(running_a.id("app"), &claim.cpus)
        .await
        .must("A on the claim's CPU");
    node.delete_pod(&running_a).await.must("pod A gone");
    let pod_b = PodIdentity::new("pod-b");
    let spec = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);

    // Not in reservedFor: refused, as a pod that forged the env would be.
    let sandbox = node
        .cri
        .run_pod(&pod_b.name, "default", &pod_b.uid)
        .await
        .must("B's sandbox");
    let text = refusal_text(
        node.cri.create_container(&sandbox, &spec).await,
        "B before it is in reservedFor",
    );
    assert!(text.contains("not for pod"), "CRI error {text:?}");
    assert_eq!(
        refusal_reasons(&node).last().map(String::as_str),
        Some("wrong-pod")
    );

    // The scheduler reserves the claim for B too.
    let api = node.api();
    let mut status = api
        .claim("default", &claim.claim.name)
        .must("reading the claim")
        .status
        .expect("a status");
    let mut reserved = status.reserved_for.take().unwrap_or_default();
    let mut b_ref = reserved[0].clone();
    b_ref.name = pod_b.name.clone();
    b_ref.uid = pod_b.uid.clone();
    reserved.push(b_ref);
    status.reserved_for = Some(reserved);
    api.set_claim_status("default", &claim.claim.name, status)
        .must("reserving the claim for B");

    // Kubelet tries a refused container again; so does this test, since
    // on a loaded machine dra-plugin's answer may come after nri-plugin
    // stopped waiting (the record it wrote serves the next attempt).
    let mut attempts = 0;
    let id = loop {
        attempts += 1;
        match node.cri.create_container(&sandbox, &spec).await {
            Ok(id) => break id,
            Err(e) if attempts < 5 => {
                eprintln!("attempt {attempts}: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => panic!("B's container, now that the claim is reserved for it: {e}"),
        }
    };
    node.cri.start_container(&id).await.must("starting B");
    node.wait_cpus(&id, &claim.cpus)
        .await
        .must("B on the claim's CPU");
    let stored = node.stored_claims().await.must("dra-plugin's store");
    let record = stored
        .iter()
        .find(|c| c.uid == claim.claim.uid)
        .expect("the claim is still prepared");
    assert_eq!(
        record.consumer_pod_uids,
        vec![pod_a.uid.clone(), pod_b.uid.clone()],
        "both pods recorded"
    );
}

/// One claim serves one container, but an init container that names it and
/// has exited holds it no more: the app container that names it next gets
/// its CPUs, as kubelet runs the two in turn.
#[tokio::test]
async fn an_exited_init_container_passes_its_claim_to_the_app_container() {
    let mut node = node_with_mixed_mode(false).await;
    let pod = PodIdentity::new("pod-init");
    let claim = node
        .create_claim("pod-init-cpu", 1, &pod)
        .await
        .must("the pod's claim");
    let sandbox = node
        .cri
        .run_pod(&pod.name, "default", &pod.uid)
        .await
        .must("sandbox");
    let mut init = ContainerSpec::sleeper("init").with_cdi_device(&claim.cdi_device);
    init.command = vec!["/bin/sh".into(), "-c".into(), "exit 0".into()];
    let init_id = node
        .cri
        .run_container(&sandbox, &init)
        .await
        .must("the init container, on the claim");
    let exited = k8s_cri::v1::ContainerState::ContainerExited as i32;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = node
            .cri
            .container_status(&init_id)
            .await
            .must("init's status");
        if status.status.as_ref().map(|s| s.state) == Some(exited) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "init did not exit: {:?}",
            status.status
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let app = ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device);
    let app_id = node
        .cri
        .run_container(&sandbox, &app)
        .await
        .must("the app container, once init has exited");
    node.wait_cpus(&app_id, &claim.cpus)
        .await
        .must("app on the claim's CPU");
}
