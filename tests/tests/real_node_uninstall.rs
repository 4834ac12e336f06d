//! `helm uninstall` on the real node leaves nothing of the driver behind: no
//! ResourceSlice, no CDI spec, no kubelet socket, and no container held off
//! CPUs. Run by scripts/real-node-tests.sh after tests/tests/real_node.rs,
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
    node.wait("the driver's pods gone", Duration::from_secs(180), || {
        let pods = node.get_json(&["pods", "-n", "dra-cpu"])?;
        match pods["items"].as_array().map(Vec::len).unwrap_or(0) {
            0 => Ok(Ok(())),
            n => Ok(Err(format!("{n} pods left"))),
        }
    })
    .unwrap();

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
