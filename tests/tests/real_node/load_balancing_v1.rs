//! `loadBalancing: off` on a cgroup v1 node: the host's own kernel when
//! the host is cgroup v1 (the VM node is cgroup v2, where the claim gets
//! an isolated partition: scenario i of tests/tests/vm_node.rs).

use super::*;

use std::path::{Path, PathBuf};

use dra_cpu_tests::cgroup::hierarchy::cpuset_dir_of;

const CPUSET_ROOT: &str = "/sys/fs/cgroup/cpuset";
const FLAG: &str = "cpuset.sched_load_balance";

/// The operator's preparation of a cgroup v1 node (docs/user/tuning.md):
/// the root cpuset stops balancing, and so does every other cpuset outside
/// the node's cgroup root, top-level or below (on a test host, what other
/// tests left behind, such as the pod cgroups of a killed end-to-end run).
/// Put back as it was when dropped.
struct PreparedNode {
    was: Vec<(PathBuf, String)>,
}

impl PreparedNode {
    fn set(node_cgroup_root: &Path) -> PreparedNode {
        let root = Path::new(CPUSET_ROOT);
        // Parents before their children, so the walk's order is the
        // kernel's: a child is looked at only below a parent at 0.
        let mut dirs = vec![root.to_path_buf()];
        let mut next = 0;
        while next < dirs.len() {
            let dir = dirs[next].clone();
            next += 1;
            // A cgroup removed meanwhile has nothing left to prepare.
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() && path != node_cgroup_root {
                    dirs.push(path);
                }
            }
        }
        let mut prepared = PreparedNode { was: Vec::new() };
        for dir in dirs {
            let file = dir.join(FLAG);
            let Ok(was) = std::fs::read_to_string(&file) else {
                continue;
            };
            if was.trim() != "0" && std::fs::write(&file, "0\n").is_ok() {
                prepared.was.push((file, was));
            }
        }
        prepared
    }
}

impl Drop for PreparedNode {
    fn drop(&mut self) {
        for (file, was) in self.was.iter().rev() {
            if let Err(e) = std::fs::write(file, was) {
                eprintln!("putting back {} failed: {e}", file.display());
            }
        }
    }
}

fn flag(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(FLAG))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .trim()
        .to_string()
}

/// The host cpuset cgroup of a pod's `app` container.
fn app_cpuset_dir(node: &RealNode, ns: &str, pod: &str) -> PathBuf {
    let id = node.container_id(ns, pod, "app").unwrap();
    cpuset_dir_of(node.container_pid(&id).unwrap()).unwrap()
}

/// Waits until every device says whether it honours `loadBalancing: off`
/// as `want`.
fn wait_isolated_partition(node: &RealNode, want: bool) {
    node.wait(
        &format!("dra.cpu/isolatedPartition {want} on every device"),
        POD_START,
        || {
            let all = devices(&node.slices(DRIVER)?);
            let wrong: Vec<&Value> = all
                .iter()
                .filter(|d| d["attributes"]["dra.cpu/isolatedPartition"]["bool"] != want)
                .collect();
            Ok(if !all.is_empty() && wrong.is_empty() {
                Ok(())
            } else {
                Err(format!("{wrong:?}"))
            })
        },
    )
    .unwrap();
}

/// On a cgroup v1 node whose operator turned the root cpuset's balancing
/// off, a claim selecting `isolatedPartition` and asking `loadBalancing:
/// off` is scheduled, and every cpuset from the node's cgroup root down to
/// its container stops balancing, read back from the host's kernel, while
/// a shared pod's container keeps balancing; after the pod's deletion
/// every flag is 1 again. The control: before the preparation the node
/// does not offer it (the attribute is false, checked first).
#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn on_cgroup_v1_a_claim_asking_load_balancing_off_takes_its_cpus_out_of_balancing() {
    let (_guard, node) = node();
    if !Path::new(CPUSET_ROOT).join(FLAG).exists() {
        eprintln!("real node: SKIPPED: the node is not cgroup v1 (scenario i of the VM node shows cgroup v2's partitions)");
        return;
    }
    let root_balances = flag(Path::new(CPUSET_ROOT)) == "1";
    if root_balances {
        wait_isolated_partition(&node, false);
    }
    let ns = TestNamespace::new(&node, "balancing").unwrap();
    // The node's cgroup root (kubelet's --cgroup-root, or kubepods): the
    // top-level cpuset the driver's own pod lives in.
    let driver = driver_pod(&node);
    let driver_dir = cpuset_dir_of(
        node.container_pid(
            &node
                .container_id(DRIVER_NAMESPACE, &driver, "dra-plugin")
                .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    let relative = driver_dir.strip_prefix(CPUSET_ROOT).unwrap().to_path_buf();
    let top = Path::new(CPUSET_ROOT).join(relative.components().next().unwrap());
    let prepared = PreparedNode::set(&top);
    // dra-plugin reads the root's flag when it starts.
    kill_driver_container(&node, "dra-plugin");
    wait_isolated_partition(&node, true);

    node.apply(&pod_yaml(&ns.name, "plain", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "plain", POD_START).unwrap();
    let template = claim_template_yaml(&ns.name, "unbalanced-cpu", 1, grouped(&node)).replace(
        "            deviceClassName: dra.cpu\n",
        "            deviceClassName: dra.cpu\n            selectors:\n              - cel:\n                  expression: 'device.attributes[\"dra.cpu\"].isolatedPartition == true'\n",
    ) + "      config:\n        - requests: [cpus]\n          opaque:\n            driver: dra.cpu\n            parameters:\n              apiVersion: v1alpha1\n              tuning:\n                loadBalancing: \"off\"\n";
    node.apply(&template).unwrap();
    let mut pod = PodSpec::new(&ns.name, "unbalanced");
    pod.templates = vec![("cpus", "unbalanced-cpu")];
    node.apply(&pod.yaml()).unwrap();
    node.wait_running(&ns.name, "unbalanced", POD_START)
        .unwrap();
    let cpus = claim_cpus(&node, &ns.name, "unbalanced");

    let container = app_cpuset_dir(&node, &ns.name, "unbalanced");
    let mut dir = container.as_path();
    loop {
        assert_eq!(
            flag(dir),
            "0",
            "{} balances the claim's CPUs {cpus}",
            dir.display()
        );
        if dir == top {
            break;
        }
        dir = dir.parent().unwrap();
    }
    let plain = app_cpuset_dir(&node, &ns.name, "plain");
    assert_eq!(flag(&plain), "1", "the shared container stopped balancing");
    assert!(
        claim_cpus(&node, &ns.name, "plain").is_disjoint(&cpus),
        "the shared pod runs on the claim's CPUs"
    );

    node.kubectl(&["delete", "pod", "-n", &ns.name, "unbalanced", "--wait=true"])
        .unwrap();
    let plain_pod = plain.parent().unwrap().to_path_buf();
    node.wait("every cpuset balancing again", CPUSET_CHANGE, || {
        let left: Vec<String> = [top.as_path(), plain_pod.as_path(), plain.as_path()]
            .iter()
            .filter(|d| flag(d) != "1")
            .map(|d| d.display().to_string())
            .collect();
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?} still 0"))
        })
    })
    .unwrap();

    // The node as it was, and dra-plugin saying so again.
    drop(prepared);
    kill_driver_container(&node, "dra-plugin");
    wait_isolated_partition(&node, !root_balances);
}
