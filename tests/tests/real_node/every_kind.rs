//! The lifecycle cases the host's scenarios run with an exclusive and a
//! shared pod, here with all three kinds at once (an exclusive pod of 2
//! CPUs, a mixed pod, a shared pod): a prepare in flight across a kubelet
//! restart, `helm upgrade` to a new image, and the mixed pod force-deleted.
//! Needs the CPUs of the VM node (`scripts/real-node-tests.sh --vm --
//! every_kind`); a smaller node skips it, saying so.

use super::many_cpus::{assert_disjoint, holds, start_every_kind, EveryKind};
use super::*;

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh --vm"]
fn every_kind_of_pod_holds_through_kubelet_restart_mid_prepare_helm_upgrade_and_force_delete() {
    let (_guard, node) = node();
    if !holds(&node, 4, "every kind of pod through the lifecycle") {
        return;
    }
    let ns = TestNamespace::new(&node, "every-kind").unwrap();
    let (allocated, available, reserved, claims) = gauges(&node);
    let EveryKind {
        exclusive,
        mixed,
        pool,
    } = start_every_kind(&node, &ns.name);
    let exclusive_history = node.record_cpus(&ns.name, "exclusive", "app").unwrap();

    // A claim pod whose prepare waits on a frozen dra-plugin while kubelet
    // restarts: prepared once, on a CPU nobody else holds.
    let dra_plugin = node
        .container_id(DRIVER_NAMESPACE, &driver_pod(&node), "dra-plugin")
        .unwrap();
    let frozen = Frozen::new(&node, &dra_plugin);
    node.apply(&pod_yaml(&ns.name, "late", None, &[("cpus", "one-cpu")]))
        .unwrap();
    wait_allocated(&node, &ns.name, "late");
    wait_prepare_unread(&node);
    node.script(&["restart", "kubelet"]).unwrap();
    drop(frozen);
    node.wait_running(&ns.name, "late", POD_START).unwrap();
    let late = claim_cpus(&node, &ns.name, "late");
    assert_eq!(late.len(), 1, "got {}", late.to_cpulist());
    assert_disjoint(&[
        ("exclusive".to_string(), exclusive.clone()),
        ("mixed".to_string(), mixed.clone()),
        ("late".to_string(), late.clone()),
    ]);
    let pool = pool.difference(&late);
    let three_claims = (allocated + 4.0, available - 4.0, reserved, claims + 3.0);
    wait_gauges(&node, "three claims after kubelet's restart", three_claims);

    // helm upgrade to another tag: a new driver pod, nothing moves, and it
    // pins what starts next.
    let old_pod = driver_pod(&node);
    let old_image = node
        .get_json(&["pod", "-n", DRIVER_NAMESPACE, &old_pod])
        .unwrap()["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string();
    let old_tag = old_image.rsplit_once(':').unwrap().1;
    let new_tag = match old_tag.strip_suffix("-upgraded") {
        Some(base) => base.to_string(),
        None => format!("{old_tag}-upgraded"),
    };
    let mixed_history = node.record_cpus(&ns.name, "mixed", "app").unwrap();
    let shared_history = node.record_cpus(&ns.name, "shared", "app").unwrap();
    let upgraded = std::process::Command::new(
        dra_cpu_tests::real_node::repo_root().join("scripts/real-node.sh"),
    )
    .arg("install")
    .env("DRA_CPU_IMAGE_TAG", &new_tag)
    .status()
    .unwrap();
    assert!(upgraded.success(), "helm upgrade failed");
    wait_driver_ready(&node);
    assert_ne!(driver_pod(&node), old_pod, "the DaemonSet did not roll");
    node.apply(&pod_yaml(&ns.name, "after-upgrade", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "after-upgrade", POD_START)
        .unwrap();
    node.wait_cpus(&ns.name, "after-upgrade", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    wait_gauges(&node, "three claims after the upgrade", three_claims);
    mixed_history.assert_held(&mixed.union(&pool), "helm upgrade");
    shared_history.assert_held(&pool, "helm upgrade");

    // The mixed pod force-deleted: its claim unprepared, its CPU back in the
    // shared pods' pool.
    node.kubectl(&[
        "delete",
        "pod",
        "-n",
        &ns.name,
        "mixed",
        "--force",
        "--grace-period=0",
    ])
    .unwrap();
    wait_gauges(
        &node,
        "two claims after the mixed pod's force deletion",
        (allocated + 3.0, available - 3.0, reserved, claims + 2.0),
    );
    if !node.runtime_takes_unsolicited_updates() {
        node.apply(&pod_yaml(&ns.name, "next-event", Some("100m"), &[]))
            .unwrap();
    }
    let grown = pool.union(&mixed);
    for pod in ["shared", "after-upgrade"] {
        node.wait_cpus(&ns.name, pod, "app", &grown, CPUSET_CHANGE)
            .unwrap();
    }
    exclusive_history.assert_held(
        &exclusive,
        "kubelet restarted mid-prepare, helm upgrade, a force deletion",
    );
}
