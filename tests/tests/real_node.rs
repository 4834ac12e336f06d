//! The driver on a real node: kube-apiserver, kube-controller-manager,
//! kube-scheduler and kubelet built from the Kubernetes modules, containerd
//! 2.x with NRI, the driver installed by `helm install` of `charts/dra-cpu`
//! (scripts/real-node-tests.sh brings it up, runs these, and takes it down).
//! Every cpuset is read from the container's cgroup and from inside it.
//!
//! Ignored in `cargo test`: they need the node (`-- --ignored`). They share
//! one node, so they take turns.

// Test support: a panic here fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dra_cpu_tests::cgroup::online_cpus;
use dra_cpu_tests::real_node::{
    claim_template_yaml, first_available_template_yaml, pod_yaml, RealNode, TestNamespace,
};
use serde_json::Value;
use shared_state::CpuSet;

/// One scenario at a time on the one node.
static NODE: Mutex<()> = Mutex::new(());

/// Generous: the machine may be busy with other work.
const POD_START: Duration = Duration::from_secs(240);
const CPUSET_CHANGE: Duration = Duration::from_secs(60);

const DRIVER: &str = "dra.cpu";
const DRIVER_NAMESPACE: &str = "dra-cpu";

fn node() -> (std::sync::MutexGuard<'static, ()>, RealNode) {
    let guard = NODE.lock().unwrap_or_else(|p| p.into_inner());
    let node = RealNode::find().expect("the real node (scripts/real-node.sh up)");
    (guard, node)
}

/// The driver's slices of this node.
fn slices(node: &RealNode) -> Vec<Value> {
    node.slices(DRIVER).unwrap()
}

fn devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn grouped(node: &RealNode) -> bool {
    node.publishes_grouped_devices().unwrap()
}

/// The CPUs a claim's container got: its cpuset (from the cgroup and inside),
/// checked to be the same both ways.
fn claim_cpus(node: &RealNode, ns: &str, pod: &str) -> CpuSet {
    let cpus = node.pod_cpus(ns, pod, "app").unwrap();
    assert_eq!(
        cpus.cgroup, cpus.inside,
        "{ns}/{pod}: cgroup and sched_getaffinity differ"
    );
    cpus.cgroup
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn slices_are_published_and_accepted_by_the_real_api_server() {
    let (_guard, node) = node();
    let online = online_cpus().unwrap();
    let found = node
        .wait("the driver's slices", Duration::from_secs(120), || {
            let s = slices(&node);
            if s.is_empty() {
                Ok(Err("no slice yet".to_string()))
            } else {
                Ok(Ok(s))
            }
        })
        .unwrap();
    let devices = devices(&found);
    assert!(!devices.is_empty(), "slices without devices: {found:?}");
    // Every allocatable CPU is published once: as a device (individual) or
    // as a share of a group's capacity (grouped).
    let published: u64 = devices
        .iter()
        .map(|d| match d["capacity"]["dra.cpu/cpu"]["value"].as_str() {
            Some(v) => v.parse::<u64>().unwrap(),
            None => 1,
        })
        .sum();
    assert_eq!(published, online.len() as u64, "devices: {devices:?}");
    for device in &devices {
        assert!(
            device["attributes"]["dra.cpu/numaNodeID"].is_object(),
            "{device}"
        );
    }
    // Owned by the Node, so they go with it.
    for slice in &found {
        assert_eq!(
            slice["metadata"]["ownerReferences"][0]["kind"], "Node",
            "{slice}"
        );
    }
    // As a user lists them.
    let table = node.kubectl(&["get", "resourceslices"]).unwrap();
    assert!(
        table.contains(node.name()) && table.contains(DRIVER),
        "{table}"
    );
    if node.kubernetes_minor() >= 36 {
        assert!(
            grouped(&node),
            "1.36+ keeps consumable capacity: grouped devices expected"
        );
    }
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn an_exclusive_claim_is_pinned_and_the_shared_pool_shrinks_and_grows_back() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "exclusive").unwrap();
    let online = online_cpus().unwrap();
    node.apply(&claim_template_yaml(&ns.name, "one-cpu", 1, grouped(&node)))
        .unwrap();

    node.apply(&pod_yaml(&ns.name, "shared", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "shared", POD_START).unwrap();
    node.wait_cpus(&ns.name, "shared", "app", &online, CPUSET_CHANGE)
        .unwrap();

    node.apply(&pod_yaml(
        &ns.name,
        "exclusive",
        None,
        &[("cpus", "one-cpu")],
    ))
    .unwrap();
    node.wait_running(&ns.name, "exclusive", POD_START).unwrap();
    let exclusive = claim_cpus(&node, &ns.name, "exclusive");
    assert_eq!(
        exclusive.len(),
        1,
        "one CPU asked for, got {}",
        exclusive.to_cpulist()
    );
    assert!(exclusive.is_subset(&online));
    // The running shared pod leaves the exclusive CPU.
    let pool = online.difference(&exclusive);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    // A shared pod started now gets the shrunk pool at once.
    node.apply(&pod_yaml(&ns.name, "shared-later", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "shared-later", POD_START)
        .unwrap();
    let later = node.pod_cpus(&ns.name, "shared-later", "app").unwrap();
    assert_eq!(
        (later.cgroup.clone(), later.inside.clone()),
        (pool.clone(), pool.clone())
    );

    // The claim as a user reads it: allocated by the real scheduler to this
    // driver's device on this node, and its CPUs in status.devices.
    let claims = node.get_json(&["resourceclaims", "-n", &ns.name]).unwrap();
    let claim = &claims["items"][0];
    let results = &claim["status"]["allocation"]["devices"]["results"];
    assert_eq!(results[0]["driver"], DRIVER, "{claim}");
    assert_eq!(results[0]["pool"], node.name(), "{claim}");
    let device_status = claim["status"]["devices"].to_string();
    assert!(
        device_status.contains(&format!("\"{}\"", exclusive.to_cpulist())),
        "status.devices does not name CPUs {}: {device_status}",
        exclusive.to_cpulist()
    );

    // Deleting the pod unprepares the claim and the pool grows back: at once
    // where the runtime's NRI is safe for updates outside an event
    // (containerd 2.4+, NRI 0.12.1), else with the next container event.
    let deleted = Instant::now();
    node.kubectl(&["delete", "pod", "-n", &ns.name, "exclusive", "--wait=false"])
        .unwrap();
    if !node.runtime_takes_unsolicited_updates() {
        node.wait_deleted(&ns.name, "exclusive", POD_START).unwrap();
        // The pool has grown in nri-plugin's view, not yet in the cgroups.
        std::thread::sleep(Duration::from_secs(2));
        let before = node.pod_cpus(&ns.name, "shared", "app").unwrap();
        assert_eq!(
            before.cgroup, pool,
            "grew without an event on a runtime that defers it"
        );
        node.apply(&pod_yaml(&ns.name, "next-event", Some("100m"), &[]))
            .unwrap();
        node.wait_running(&ns.name, "next-event", POD_START)
            .unwrap();
    }
    node.wait_cpus(&ns.name, "shared", "app", &online, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "shared-later", "app", &online, CPUSET_CHANGE)
        .unwrap();
    eprintln!(
        "real node: shared pods back on all CPUs {} ms after the exclusive pod's deletion",
        deleted.elapsed().as_millis()
    );
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_mixed_pod_gets_its_claim_and_the_shared_pool() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "mixed").unwrap();
    let online = online_cpus().unwrap();
    ns.start_shared_and_claim_pods("mixed", Some("250m"), POD_START)
        .unwrap();

    let env = node
        .kubectl(&["exec", "-n", &ns.name, "mixed", "-c", "app", "--", "env"])
        .unwrap();
    let claim_cpus: CpuSet = env
        .lines()
        .find_map(|l| l.strip_prefix("DRA_CPUSET_"))
        .and_then(|rest| rest.split_once('='))
        .map(|(_, cpus)| CpuSet::parse_cpulist(cpus).unwrap())
        .unwrap_or_else(|| panic!("no DRA_CPUSET_ env in the mixed container: {env}"));
    assert_eq!(claim_cpus.len(), 1);
    let pool = online.difference(&claim_cpus);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    // Mixed: its exclusive CPU and the shared pool.
    node.wait_cpus(
        &ns.name,
        "mixed",
        "app",
        &claim_cpus.union(&pool),
        CPUSET_CHANGE,
    )
    .unwrap();
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_first_available_claim_gets_the_alternative_that_fits() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "first-available").unwrap();
    let online = online_cpus().unwrap();
    // More CPUs than the node has first, then one: the real scheduler must
    // fall through to the second, and kubelet must hand the container the
    // device of request "cpus" although the allocation names "cpus/one".
    let too_many = online.len() as u32 * 8;
    node.apply(&first_available_template_yaml(
        &ns.name,
        "big-or-one",
        &[("big", too_many), ("one", 1)],
        grouped(&node),
    ))
    .unwrap();
    node.apply(&pod_yaml(
        &ns.name,
        "claim",
        None,
        &[("cpus", "big-or-one")],
    ))
    .unwrap();
    node.wait_running(&ns.name, "claim", POD_START).unwrap();
    let claims = node.get_json(&["resourceclaims", "-n", &ns.name]).unwrap();
    let result = &claims["items"][0]["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["request"], "cpus/one", "{result}");
    let cpus = claim_cpus(&node, &ns.name, "claim");
    assert_eq!(cpus.len(), 1, "got {}", cpus.to_cpulist());
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn the_drivers_credential_cannot_write_another_nodes_slice() {
    let (_guard, node) = node();
    let pods = node.get_json(&["pods", "-n", DRIVER_NAMESPACE]).unwrap();
    let pod = pods["items"]
        .as_array()
        .and_then(|items| items.first())
        .cloned()
        .expect("the driver's pod");
    let pod_name = pod["metadata"]["name"].as_str().unwrap();
    let account = pod["spec"]["serviceAccountName"].as_str().unwrap();
    // A token bound to the driver's pod, as the pod's own projected token is:
    // it carries the pod's node name.
    let token = node
        .kubectl(&[
            "create",
            "token",
            account,
            "-n",
            DRIVER_NAMESPACE,
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod_name}"),
            &format!(
                "--bound-object-uid={}",
                pod["metadata"]["uid"].as_str().unwrap()
            ),
        ])
        .unwrap();
    let token = token.trim();
    let slice = |node_name: &str, name: &str| {
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: {name}\nspec:\n  driver: {DRIVER}\n  nodeName: {node_name}\n  pool:\n    name: {node_name}\n    generation: 1\n    resourceSliceCount: 1\n  devices: []\n"
        )
    };
    let as_driver = [
        "--kubeconfig=/dev/null",
        "--server",
        "https://127.0.0.1:6443",
        "--certificate-authority",
    ];
    let ca = format!("{}/pki/ca.crt", node.fact("REAL_NODE_DIR"));
    let token_flag = format!("--token={token}");
    let mut extra: Vec<&str> = as_driver.to_vec();
    extra.push(&ca);
    extra.push(&token_flag);
    let refused = node
        .create_refused(&slice("another-node", "dcpu-forged-slice"), &extra)
        .unwrap();
    assert!(
        refused.contains("may write only the ResourceSlices of its own node"),
        "refused, but not by the chart's policy: {refused}"
    );
    // The control: the same credential may write a slice of its own node, so
    // the refusal above is about the node, not the credential.
    let own = slice(node.name(), "dcpu-own-slice-probe");
    let mut args = vec!["create", "-f", "-"];
    args.extend_from_slice(&extra);
    node.kubectl_stdin(&args, Some(&own)).unwrap();
    node.kubectl(&["delete", "resourceslice", "dcpu-own-slice-probe"])
        .unwrap();
}

/// The driver's pod on the node.
fn driver_pod(node: &RealNode) -> String {
    let pods = node.get_json(&["pods", "-n", DRIVER_NAMESPACE]).unwrap();
    pods["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string()
}

fn wait_driver_ready(node: &RealNode) {
    node.wait("the driver's pod ready", POD_START, || {
        let pods = node.get_json(&["pods", "-n", DRIVER_NAMESPACE])?;
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        let ready = items.len() == 1
            && items[0]["metadata"]["deletionTimestamp"].is_null()
            && items[0]["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|s| s.iter().all(|c| c["ready"] == true));
        if ready {
            Ok(Ok(()))
        } else {
            Ok(Err(format!("{}", pods["items"])))
        }
    })
    .unwrap();
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn restarts_keep_every_pods_cpus_and_new_pods_are_pinned() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "restarts").unwrap();
    let online = online_cpus().unwrap();
    ns.start_shared_and_claim_pods("exclusive", None, POD_START)
        .unwrap();
    let exclusive = claim_cpus(&node, &ns.name, "exclusive");
    let pool = online.difference(&exclusive);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();

    let check = |what: &str, round: usize| {
        node.wait_cpus(&ns.name, "exclusive", "app", &exclusive, CPUSET_CHANGE)
            .unwrap_or_else(|e| panic!("after {what}: the exclusive pod moved: {e}"));
        node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
            .unwrap_or_else(|e| panic!("after {what}: the shared pod moved: {e}"));
        // A pod started after it is pinned to the pool.
        let name = format!("after-{round}");
        node.apply(&pod_yaml(&ns.name, &name, Some("100m"), &[]))
            .unwrap();
        node.wait_running(&ns.name, &name, POD_START)
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
        node.wait_cpus(&ns.name, &name, "app", &pool, CPUSET_CHANGE)
            .unwrap_or_else(|e| panic!("after {what}: a new pod is not on the pool: {e}"));
        eprintln!("real node: {what}: every pod kept its CPUs, a new pod is on the pool");
    };

    // Each process of the driver killed alone: its container restarts in
    // place.
    for (round, container) in ["dra-plugin", "nri-plugin"].into_iter().enumerate() {
        let pod = driver_pod(&node);
        let id = node
            .container_id(DRIVER_NAMESPACE, &pod, container)
            .unwrap();
        node.script(&["ctr", "tasks", "kill", "-s", "SIGKILL", &id])
            .unwrap();
        node.wait("the container to restart", POD_START, || {
            let object = node.get_json(&["pod", "-n", DRIVER_NAMESPACE, &pod])?;
            let restarted = object["status"]["containerStatuses"]
                .as_array()
                .and_then(|s| s.iter().find(|c| c["name"] == container).cloned())
                .is_some_and(|c| c["restartCount"].as_u64().unwrap_or(0) > 0 && c["ready"] == true);
            if restarted {
                Ok(Ok(()))
            } else {
                Ok(Err(format!("{}", object["status"]["containerStatuses"])))
            }
        })
        .unwrap();
        check(&format!("{container} killed"), round);
    }
    // The DaemonSet's pod deleted: a new pod takes over from the store.
    let old = driver_pod(&node);
    node.kubectl(&["delete", "pod", "-n", DRIVER_NAMESPACE, &old, "--wait=true"])
        .unwrap();
    wait_driver_ready(&node);
    check("the driver's pod deleted", 2);
    node.script(&["restart", "containerd"]).unwrap();
    check("containerd restarted", 3);
    node.script(&["restart", "kubelet"]).unwrap();
    wait_driver_ready(&node);
    check("kubelet restarted", 4);
}
