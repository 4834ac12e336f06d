//! `helm uninstall` on the real node leaves nothing of the driver behind: no
//! ResourceSlice, no CDI spec, no kubelet socket, and no container held off
//! CPUs. Run by scripts/real-node-tests.sh after tests/tests/real_node/,
//! since it removes the driver (ignored in `cargo test`).

// Test support: a panic here fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use dra_cpu_tests::cgroup::online_cpus;
use dra_cpu_tests::real_node::{pod_yaml, RealNode, TestNamespace};

const DRIVER: &str = "dra.cpu";

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `helm uninstall` has taken the driver's pods away.
fn wait_driver_pods_gone(node: &RealNode) {
    node.wait("the driver's pods gone", Duration::from_secs(180), || {
        let pods = node.get_json(&["pods", "-n", "dra-cpu"])?;
        match pods["items"].as_array().map(Vec::len).unwrap_or(0) {
            0 => Ok(Ok(())),
            n => Ok(Err(format!("{n} pods left"))),
        }
    })
    .unwrap();
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn helm_uninstall_leaves_no_slice_spec_socket_or_cpuset() {
    let node = RealNode::find().expect("the real node (scripts/real-node.sh up)");
    let online = online_cpus().unwrap();
    let namespace = TestNamespace::new(&node, "uninstall").unwrap();
    let ns = namespace.name.as_str();
    namespace
        .start_shared_and_claim_pods("exclusive", None, Duration::from_secs(240))
        .unwrap();
    let cdi_dir = Path::new(node.fact("REAL_NODE_CDI_DIR")).to_path_buf();
    let kubelet_dir = Path::new(node.fact("REAL_NODE_KUBELET_DIR")).to_path_buf();
    // The control: while the driver runs, its spec and sockets are there and
    // the shared pod is held off the claim's CPU.
    assert!(
        !entries(&cdi_dir).is_empty(),
        "no CDI spec while a claim is prepared"
    );
    let registry = kubelet_dir.join("plugins_registry");
    assert!(
        entries(&registry).iter().any(|e| e.starts_with(DRIVER)),
        "no registration socket while the driver runs: {:?}",
        entries(&registry)
    );
    let shared = node.pod_cpus(ns, "shared", "app").unwrap();
    assert_ne!(
        shared.cgroup, online,
        "the shared pod was never held off the claim's CPU"
    );

    // The exclusive pod goes first, as a user drains claims before removing
    // the driver that unprepares them.
    node.kubectl(&["delete", "pod", "-n", ns, "exclusive", "--wait=true"])
        .unwrap();
    if !node.runtime_takes_unsolicited_updates() {
        // The pool's growth waits for a container event on this runtime
        // (NRI before 0.12.1): one comes before the driver is removed, or
        // the shared pod would keep the shrunk pool (README, "Runtimes").
        node.apply(&pod_yaml(ns, "next-event", Some("100m"), &[]))
            .unwrap();
        node.wait_running(ns, "next-event", Duration::from_secs(240))
            .unwrap();
    }
    node.script(&["uninstall"]).unwrap();
    wait_driver_pods_gone(&node);

    // Kubelet wipes an unregistered driver's slices after its grace period.
    node.wait("no slice of the driver", Duration::from_secs(180), || {
        let list = node.get_json(&["resourceslices"])?;
        let left: Vec<_> = list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s["spec"]["driver"] == DRIVER)
            .map(|s| s["metadata"]["name"].to_string())
            .collect();
        if left.is_empty() {
            Ok(Ok(()))
        } else {
            Ok(Err(format!("slices left: {left:?}")))
        }
    })
    .unwrap();
    assert_eq!(entries(&cdi_dir), Vec::<String>::new(), "CDI specs left");
    let sockets: Vec<String> = entries(&registry)
        .into_iter()
        .filter(|e| e.starts_with(DRIVER))
        .collect();
    assert!(sockets.is_empty(), "registration sockets left: {sockets:?}");
    let plugin_dir = kubelet_dir.join("plugins").join(DRIVER);
    let left: Vec<String> = entries(&plugin_dir)
        .into_iter()
        .filter(|e| e.ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "plugin sockets left: {left:?}");
    // The running shared pod is on every CPU again.
    node.wait_cpus(ns, "shared", "app", &online, Duration::from_secs(60))
        .unwrap();
}

/// Every interrupt's affinity and new interrupts' affinity, as the host's
/// kernel says now.
fn interrupt_affinities() -> (Vec<(String, String)>, String) {
    let mut irqs: Vec<(String, String)> = std::fs::read_dir("/proc/irq")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("smp_affinity_list")).ok()?;
            Some((
                e.file_name().to_string_lossy().to_string(),
                text.trim().to_string(),
            ))
        })
        .collect();
    irqs.sort();
    let default = std::fs::read_to_string("/proc/irq/default_smp_affinity").unwrap();
    (irqs, default.trim().to_string())
}

/// Runs after the test above (alphabetically, one at a time): the driver is
/// installed again, a claim that isolated its CPU from interrupts is still
/// prepared when the driver is removed, and the removal puts the host's
/// interrupts back, since nothing will unprepare that claim any more.
#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn tuning_of_a_claim_still_prepared_is_put_back_when_the_driver_is_removed() {
    let node = RealNode::find().expect("the real node (scripts/real-node.sh up)");
    let before = interrupt_affinities();
    node.script(&["install"]).unwrap();
    let namespace = TestNamespace::new(&node, "uninstall-tuned").unwrap();
    let ns = namespace.name.clone();
    let grouped = node.publishes_grouped_devices().unwrap();
    let template = format!(
        "{}      config:\n        - requests: [cpus]\n          opaque:\n            driver: {DRIVER}\n            parameters:\n              apiVersion: v1alpha1\n              tuning:\n                irqs: isolate\n",
        dra_cpu_tests::real_node::claim_template_yaml(&ns, "quiet-cpu", 1, grouped)
    );
    node.apply(&template).unwrap();
    node.apply(&pod_yaml(&ns, "quiet", None, &[("cpus", "quiet-cpu")]))
        .unwrap();
    node.wait_running(&ns, "quiet", Duration::from_secs(240))
        .unwrap();
    // The control: while the driver runs, the claim's CPU is kept free of
    // new interrupts.
    let tuned = interrupt_affinities();
    assert_ne!(tuned.1, before.1, "the claim's CPU was never isolated");

    node.script(&["uninstall"]).unwrap();
    wait_driver_pods_gone(&node);
    assert_eq!(
        interrupt_affinities(),
        before,
        "the host's interrupts after the driver was removed under a tuned claim"
    );
    // The claim can no longer be unprepared, so deleting the namespace
    // would wait for nothing: the node is torn down after this test.
    std::mem::forget(namespace);
}
