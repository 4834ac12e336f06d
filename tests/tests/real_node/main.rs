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
use dra_cpu_tests::interrupts::KernelTuning;
use dra_cpu_tests::real_node::{
    claim_template_yaml, claim_yaml, first_available_template_yaml, metric_value, pod_yaml,
    PodSpec, RealNode, RealNodeError, TestNamespace,
};
use serde_json::Value;
use shared_state::CpuSet;

mod every_kind;
mod load_balancing_v1;
mod logs;
mod many_cpus;

/// One scenario at a time on the one node.
static NODE: Mutex<()> = Mutex::new(());

/// Generous: the machine may be busy with other work.
const POD_START: Duration = Duration::from_secs(240);
const CPUSET_CHANGE: Duration = Duration::from_secs(60);

const DRIVER: &str = "dra.cpu";
const DRIVER_NAMESPACE: &str = "dra-cpu";
/// The chart's metrics ports (values.yaml: draPlugin.metricsPort,
/// nri.metricsPort).
const DRA_PLUGIN_HTTP: u16 = 9440;
const NRI_PLUGIN_HTTP: u16 = 9441;

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

/// Whether the devices carry the node-allocatable mapping (KEP-5517: the
/// chart publishes it where the release has the field).
fn maps_node_allocatable(node: &RealNode) -> bool {
    devices(&slices(node))
        .iter()
        .any(|d| d["nodeAllocatableResources"].is_object())
}

/// The chart's values as installed, defaults included (`helm get values
/// --all`).
fn chart_values(node: &RealNode) -> Value {
    let printed = node
        .script(&[
            "helm",
            "get",
            "values",
            "dra-cpu",
            "-n",
            DRIVER_NAMESPACE,
            "--all",
            "-o",
            "json",
        ])
        .unwrap();
    serde_json::from_str(&printed).unwrap_or_else(|e| panic!("helm get values: {e}: {printed}"))
}

/// The type of attribute `name` of a device ("int", "bool", "string",
/// "version", "strings", ...), if it has it.
fn attribute_type(device: &Value, name: &str) -> Option<String> {
    device["attributes"][name]
        .as_object()
        .and_then(|value| value.keys().next().cloned())
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

/// The claim's own CPUs, from the `DRA_CPUSET_<claim>` env the CDI spec put
/// into the pod's `app` container (a mixed container runs on more).
fn claim_env_cpus(node: &RealNode, ns: &str, pod: &str) -> CpuSet {
    let env = node
        .kubectl(&["exec", "-n", ns, pod, "-c", "app", "--", "env"])
        .unwrap();
    env.lines()
        .find_map(|l| l.strip_prefix("DRA_CPUSET_"))
        .and_then(|rest| rest.split_once('='))
        .map(|(_, cpus)| CpuSet::parse_cpulist(cpus).unwrap())
        .unwrap_or_else(|| panic!("no DRA_CPUSET_ env in {ns}/{pod}: {env}"))
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
    let values = chart_values(&node);
    let group_by = values["draPlugin"]["groupBy"]
        .as_str()
        .unwrap_or("numanode");
    let mapping_off = values["draPlugin"]["disableNodeAllocatableMapping"] == true;
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
    // Upstream's attributes and their types, per mode.
    for device in &devices {
        let grouped_device = device["capacity"]["dra.cpu/cpu"].is_object();
        let wanted: &[(&str, &str)] = if grouped_device {
            // A group names what it groups, as upstream's do.
            match group_by {
                "numanode" => &[
                    ("dra.cpu/smtEnabled", "bool"),
                    ("dra.cpu/numCPUs", "int"),
                    ("resource.kubernetes.io/numaNode", "int"),
                    ("dra.cpu/numaNodeID", "int"),
                    ("dra.cpu/socketID", "int"),
                ],
                "socket" => &[
                    ("dra.cpu/smtEnabled", "bool"),
                    ("dra.cpu/numCPUs", "int"),
                    ("dra.cpu/socketID", "int"),
                ],
                _ => &[("dra.cpu/smtEnabled", "bool"), ("dra.cpu/numCPUs", "int")],
            }
        } else {
            &[
                ("resource.kubernetes.io/numaNode", "int"),
                ("dra.cpu/numaNodeID", "int"),
                ("dra.cpu/socketID", "int"),
                ("dra.cpu/smtEnabled", "bool"),
                ("dra.cpu/cacheL3ID", "int"),
                ("dra.cpu/coreType", "string"),
                ("dra.cpu/coreID", "int"),
                ("dra.cpu/cpuID", "int"),
            ]
        };
        for (name, kind) in wanted {
            assert_eq!(
                attribute_type(device, name).as_deref(),
                Some(*kind),
                "{name} of {device}"
            );
        }
        // The node-allocatable mapping on every device where the release
        // has the field and the chart does not turn it off, on none
        // elsewhere; CPUs one for one.
        let mapped = node.kubernetes_minor() >= 37 && !mapping_off;
        assert_eq!(
            device["nodeAllocatableResources"]["cpu"].is_object(),
            mapped,
            "the node-allocatable mapping on {device}"
        );
        if let Some(mapping) = device["nodeAllocatableResources"]["cpu"].as_object() {
            assert!(
                mapping.get("overhead").is_none_or(Value::is_null),
                "{device}"
            );
            let multiplier = if grouped_device {
                assert_eq!(mapping["mapping"]["capacityKey"], "dra.cpu/cpu", "{device}");
                &mapping["mapping"]["capacityMultiplier"]
            } else {
                &mapping["mapping"]["deviceMultiplier"]
            };
            assert!(multiplier == 1 || multiplier == "1", "{device}");
        }
        // PCIe roots, where a device has them: a list, never empty.
        if let Some(roots) = device["attributes"]["resource.kubernetes.io/pcieRoot"].as_object() {
            assert!(
                roots
                    .get("strings")
                    .and_then(Value::as_array)
                    .is_some_and(|l| !l.is_empty()),
                "{device}"
            );
        }
    }
    // Device.nodeAllocatableResources is in the API from 1.37; the driver
    // publishes it where the API server declares it.
    assert_eq!(
        maps_node_allocatable(&node),
        node.kubernetes_minor() >= 37 && !mapping_off,
        "the node-allocatable mapping is published exactly where the release has it"
    );
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
    // Every cpuset the shared pod takes from here on: the recorder the other
    // scenarios use to show nothing moved, shown here to see each move.
    let shared_history = node.record_cpus(&ns.name, "shared", "app").unwrap();

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

    // What the node has prepared, through the command the chart's NOTES
    // print, as a user copies it (this node's stateDir is not the default,
    // which the command without `--state-dir` would miss).
    let report = inspect_as_the_notes_say(&node);
    assert_eq!(report["source"], "socket", "{report}");
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let listed = report["claims"]
        .as_array()
        .and_then(|claims| claims.iter().find(|c| c["uid"] == uid))
        .unwrap_or_else(|| panic!("inspect does not list claim {uid}: {report}"));
    assert_eq!(listed["cpus"], exclusive.to_cpulist().as_str(), "{report}");
    assert_eq!(report["shared"], pool.to_cpulist().as_str(), "{report}");

    // Device health (KEP-4680): where the release reports it, the driver's
    // health stream reaches the container's status through kubelet.
    if node.kubernetes_minor() >= 36 {
        let health = node
            .wait(
                "the claim's device health in the pod status",
                CPUSET_CHANGE,
                || {
                    let object = node.get_json(&["pod", "-n", &ns.name, "exclusive"])?;
                    let statuses = object["status"]["containerStatuses"][0]
                        ["allocatedResourcesStatus"]
                        .clone();
                    let healthy = statuses.as_array().is_some_and(|s| {
                        s.iter().any(|r| {
                            r["name"] == "claim:cpus"
                                && r["resources"].as_array().is_some_and(|d| {
                                    !d.is_empty() && d.iter().all(|d| d["health"] == "Healthy")
                                })
                        })
                    });
                    if healthy {
                        Ok(Ok(statuses))
                    } else {
                        Ok(Err(statuses.to_string()))
                    }
                },
            )
            .unwrap();
        eprintln!("real node: device health in the pod status: {health}");
    }

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
    // Exactly two moves: shrunk once, grown back once, nothing in between.
    let history = shared_history.finish();
    assert_eq!(
        history.values,
        [online.clone(), pool.clone(), online.clone()],
        "the shared pod's cpusets: {}",
        history.describe()
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

    let claim_cpus = claim_env_cpus(&node, &ns.name, "mixed");
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

/// Runs the `dra-plugin inspect` command of the chart's NOTES (`helm get
/// notes`) in the driver's pod, `<pod>` filled in, and reads its JSON (what
/// it prints when stdout is not a terminal).
fn inspect_as_the_notes_say(node: &RealNode) -> Value {
    let notes = node
        .script(&["helm", "get", "notes", "dra-cpu", "-n", DRIVER_NAMESPACE])
        .unwrap();
    let line = notes
        .lines()
        .find(|l| l.contains("dra-plugin inspect"))
        .unwrap_or_else(|| panic!("no inspect command in the chart's NOTES:\n{notes}"));
    let pod = driver_pod(node);
    let args: Vec<String> = line
        .split_whitespace()
        .skip_while(|word| *word != "kubectl")
        .skip(1)
        .map(|word| match word {
            "<pod>" => pod.clone(),
            other => other.to_string(),
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let printed = node.kubectl(&args).unwrap();
    serde_json::from_str(&printed)
        .unwrap_or_else(|e| panic!("`{line}` printed no JSON ({e}): {printed}"))
}

/// The NUMA nodes of this node that hold CPUs, as the kernel lists them.
fn numa_nodes_with_cpus() -> usize {
    std::fs::read_dir("/sys/devices/system/node")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("node"))
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("cpulist"))
                        .is_ok_and(|l| !l.trim().is_empty())
                })
                .count()
        })
        .unwrap_or(1)
        .max(1)
}

/// Upstream's gatherinfo check (a tool in every driver pod reports the
/// topology the driver sees and its device mode): the troubleshooting
/// page's commands, run in the driver's pod as it says, see this node's
/// CPUs and NUMA nodes through the chart's mount of the host's `/sys`, and
/// `slices` prints the devices the running driver published.
#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn the_troubleshooting_commands_work_in_the_drivers_pod() {
    let (_guard, node) = node();
    wait_driver_ready(&node);
    let pod = driver_pod(&node);
    let exec = |args: &[&str]| {
        let mut all = vec![
            "exec",
            "-n",
            DRIVER_NAMESPACE,
            pod.as_str(),
            "-c",
            "dra-plugin",
            "--",
            "/usr/bin/dra-plugin",
        ];
        all.extend_from_slice(args);
        let printed = node.kubectl(&all).unwrap();
        serde_json::from_str::<Value>(&printed).unwrap_or_else(|e| {
            panic!(
                "dra-plugin {} printed no JSON ({e}): {printed}",
                args.join(" ")
            )
        })
    };

    let online = online_cpus().unwrap();
    let topology = exec(&["topology", "--sysfs-root", "/host"]);
    assert_eq!(
        topology["online"],
        online.to_cpulist().as_str(),
        "{topology}"
    );
    let mut ids: Vec<u64> = topology["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    let listed = ids.len();
    ids.dedup();
    assert_eq!(listed, ids.len(), "a CPU listed twice: {topology}");
    let want: Vec<u64> = online.iter().map(|c| c as u64).collect();
    assert_eq!(ids, want, "{topology}");
    assert_eq!(
        topology["numaNodes"].as_u64(),
        Some(numa_nodes_with_cpus() as u64),
        "{topology}"
    );

    // What the node would publish, with the chart's settings: the devices
    // the driver published.
    let values = chart_values(&node);
    let mode = if grouped(&node) {
        "grouped"
    } else {
        "individual"
    };
    let group_by = values["draPlugin"]["groupBy"]
        .as_str()
        .unwrap_or("numanode");
    let reserved = values["reservedCpus"].as_str().unwrap_or("");
    let mut args = vec![
        "slices",
        "--sysfs-root",
        "/host",
        "--cpu-device-mode",
        mode,
        "--group-by",
        group_by,
        "--reserved-cpus",
        reserved,
    ];
    if !maps_node_allocatable(&node) {
        args.push("--disable-node-allocatable-mapping");
    }
    let would = exec(&args);
    let names = |devices: Vec<Value>| {
        let mut names: Vec<(String, Value)> = devices
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap_or_default().to_string(),
                    d["capacity"].clone(),
                )
            })
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        names
    };
    assert_eq!(
        names(devices(would.as_array().unwrap())),
        names(devices(&slices(&node))),
        "`dra-plugin slices` in the pod and the published devices differ"
    );
}

/// SIGKILLs one container of the driver's pod and waits until kubelet has
/// restarted it and it is ready again.
fn kill_driver_container(node: &RealNode, container: &str) {
    let pod = driver_pod(node);
    let restarts = |object: &Value| {
        object["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|c| c["name"] == container).cloned())
            .map(|c| (c["restartCount"].as_u64().unwrap_or(0), c["ready"] == true))
            .unwrap_or((0, false))
    };
    let before = restarts(
        &node
            .get_json(&["pod", "-n", DRIVER_NAMESPACE, &pod])
            .unwrap(),
    )
    .0;
    let id = node
        .container_id(DRIVER_NAMESPACE, &pod, container)
        .unwrap();
    node.script(&["ctr", "tasks", "kill", "-s", "SIGKILL", &id])
        .unwrap();
    node.wait(&format!("{container} to restart"), POD_START, || {
        let object = node.get_json(&["pod", "-n", DRIVER_NAMESPACE, &pod])?;
        match restarts(&object) {
            (count, true) if count > before => Ok(Ok(())),
            _ => Ok(Err(format!("{}", object["status"]["containerStatuses"]))),
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
    // Not even for a moment, through every restart below.
    let exclusive_history = node.record_cpus(&ns.name, "exclusive", "app").unwrap();
    let shared_history = node.record_cpus(&ns.name, "shared", "app").unwrap();

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
        kill_driver_container(&node, container);
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
    let during =
        "both processes killed, the driver's pod deleted, containerd and kubelet restarted";
    exclusive_history.assert_held(&exclusive, during);
    shared_history.assert_held(&pool, during);
}

/// What kubelet says when the runtime refuses a container (NRI's
/// CreateContainer error).
const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_malformed_or_forged_cpuset_env_ends_in_create_container_error() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "forged-env").unwrap();
    // The control: the same pod without the env runs.
    node.apply(&pod_yaml(&ns.name, "plain", Some("100m"), &[]))
        .unwrap();
    let cases = [
        // Upstream's case: neither a claim UID nor a CPU list.
        ("malformed", "DRA_CPUSET_malformed_claim", "a-b"),
        // Well formed, but no claim of that UID is prepared on the node: a
        // container may not name CPUs for itself.
        (
            "forged",
            "DRA_CPUSET_3f1c9a2e-6b7d-4e8f-9a0b-1c2d3e4f5a6b",
            "0",
        ),
    ];
    for (pod, key, value) in cases {
        let mut spec = PodSpec::new(&ns.name, pod);
        spec.cpu_request = Some("100m");
        spec.env = vec![(key, value)];
        node.apply(&spec.yaml()).unwrap();
    }
    node.wait_running(&ns.name, "plain", POD_START).unwrap();
    for (pod, _, _) in cases {
        let message = node
            .wait_waiting_reason(&ns.name, pod, "app", CREATE_CONTAINER_ERROR, POD_START)
            .unwrap();
        assert!(
            message.contains("dra-cpu refuses container"),
            "{pod}: refused, but not by the driver: {message}"
        );
    }
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_claim_shared_by_two_pods_or_two_containers_is_refused_until_the_first_is_gone() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "shared-claim").unwrap();
    let grouped = grouped(&node);
    node.apply(&claim_yaml(&ns.name, "one", 1, grouped))
        .unwrap();
    let mut first = PodSpec::new(&ns.name, "first");
    first.claims = vec![("cpus", "one")];
    node.apply(&first.yaml()).unwrap();
    node.wait_running(&ns.name, "first", POD_START).unwrap();
    let cpus = claim_cpus(&node, &ns.name, "first");
    assert_eq!(cpus.len(), 1, "got {}", cpus.to_cpulist());

    // The API allows a claim in several pods; exclusive CPUs do not. Where
    // the devices carry the node-allocatable mapping (KEP-5517), the real
    // scheduler refuses to share such a claim; elsewhere the scheduler and
    // kubelet let the second pod through and the driver refuses its
    // container.
    let mut second = first.clone();
    second.name = "second";
    node.apply(&second.yaml()).unwrap();
    if maps_node_allocatable(&node) {
        let message = node
            .wait_unschedulable(&ns.name, "second", POD_START)
            .unwrap();
        assert!(
            message.contains("cannot be shared across pods"),
            "unschedulable for another reason: {message}"
        );
    } else {
        let message = node
            .wait_waiting_reason(&ns.name, "second", "app", CREATE_CONTAINER_ERROR, POD_START)
            .unwrap();
        assert!(
            message.contains("dra-cpu refuses container"),
            "refused, but not by the driver: {message}"
        );
    }
    // The first pod keeps its CPU.
    node.wait_cpus(&ns.name, "first", "app", &cpus, CPUSET_CHANGE)
        .unwrap();
    // Once the first pod is gone, the second gets the claim: scheduled
    // then, or, let through before, by kubelet's next attempt at its
    // container. Kubelet prepared the claim for the first pod alone and
    // does not prepare it again while a pod on the node still uses it, so
    // nri-plugin learns the second pod from the claim's reservedFor.
    node.kubectl(&["delete", "pod", "-n", &ns.name, "first", "--wait=true"])
        .unwrap();
    node.wait_running(&ns.name, "second", POD_START).unwrap();
    let taken = claim_env_cpus(&node, &ns.name, "second");
    assert_eq!(taken.len(), 1, "got {}", taken.to_cpulist());
    node.wait_cpus(&ns.name, "second", "app", &taken, CPUSET_CHANGE)
        .unwrap();
    node.kubectl(&["delete", "pod", "-n", &ns.name, "second", "--wait=true"])
        .unwrap();

    // Two containers of one pod on one claim: the first gets the CPU, the
    // second is refused.
    node.apply(&claim_template_yaml(&ns.name, "one-cpu", 1, grouped))
        .unwrap();
    let mut pair = PodSpec::new(&ns.name, "pair");
    pair.containers = vec!["app", "sidecar"];
    pair.templates = vec![("cpus", "one-cpu")];
    node.apply(&pair.yaml()).unwrap();
    let message = node
        .wait_waiting_reason(
            &ns.name,
            "pair",
            "sidecar",
            CREATE_CONTAINER_ERROR,
            POD_START,
        )
        .unwrap();
    assert!(
        message.contains("dra-cpu refuses container"),
        "refused, but not by the driver: {message}"
    );
    let app = node.pod_cpus(&ns.name, "pair", "app").unwrap();
    assert_eq!(app.cgroup.len(), 1, "app: {}", app.cgroup.to_cpulist());
}

/// An init container and the app container of one pod naming one claim:
/// one claim serves one container at a time, and kubelet runs them in turn,
/// so each gets the claim's CPU.
#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn an_init_container_and_the_app_container_use_one_claim_in_turn() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "init-claim").unwrap();
    let grouped = grouped(&node);
    node.apply(&claim_template_yaml(&ns.name, "one-cpu", 1, grouped))
        .unwrap();
    let mut pod = PodSpec::new(&ns.name, "staged");
    pod.init_containers = vec!["setup"];
    pod.templates = vec![("cpus", "one-cpu")];
    node.apply(&pod.yaml()).unwrap();
    node.wait_running(&ns.name, "staged", POD_START).unwrap();
    let cpus = claim_env_cpus(&node, &ns.name, "staged");
    assert_eq!(cpus.len(), 1, "got {}", cpus.to_cpulist());
    node.wait_cpus(&ns.name, "staged", "app", &cpus, CPUSET_CHANGE)
        .unwrap();
    let printed = node
        .kubectl(&["logs", "-n", &ns.name, "staged", "-c", "setup"])
        .unwrap();
    let setup_cpus = printed
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|list| CpuSet::parse_cpulist(list.trim()).unwrap());
    assert_eq!(setup_cpus, Some(cpus), "setup printed {printed:?}");

    // A grouped device's share carries the allocation's shareID; kubelet
    // records it with the device (its PodResources API reports it) only
    // when the driver's prepare answer names it.
    let claims = node.get_json(&["resourceclaims", "-n", &ns.name]).unwrap();
    let share_ids: Vec<String> = claims["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c["status"]["allocation"]["devices"]["results"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|r| r["driver"] == "dra.cpu")
        .filter_map(|r| r["shareID"].as_str().map(str::to_string))
        .collect();
    if grouped {
        assert!(!share_ids.is_empty(), "no shareID in {claims}");
    }
    let checkpoint = std::fs::read_to_string(
        std::path::Path::new(node.fact("REAL_NODE_KUBELET_DIR")).join("dra_manager_state"),
    )
    .unwrap();
    for id in &share_ids {
        assert!(
            checkpoint.contains(id.as_str()),
            "kubelet's DRA checkpoint lacks share {id}: {checkpoint}"
        );
    }
}

/// nri-plugin's count of containers whose cpuset it found drifted and sent
/// again.
fn drift_repairs(node: &RealNode) -> f64 {
    let text = node
        .pod_http(
            DRIVER_NAMESPACE,
            &driver_pod(node),
            NRI_PLUGIN_HTTP,
            "/metrics",
        )
        .unwrap();
    metric_value(
        &text,
        "nri_plugin_cpuset_drifts_total{verdict=\"repaired\"}",
    )
    .unwrap_or(0.0)
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_cpuset_written_behind_the_runtimes_back_is_found_and_sent_again() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "drift").unwrap();
    let online = online_cpus().unwrap();
    ns.start_shared_and_claim_pods("pinned", None, POD_START)
        .unwrap();
    let claim = claim_cpus(&node, &ns.name, "pinned");
    let pool = online.difference(&claim);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "pinned", "app", &claim, CPUSET_CHANGE)
        .unwrap();
    let repairs_before = drift_repairs(&node);

    // The shared pod onto the claim's CPU, the claim's pod off it, written
    // into their cgroups as an agent on the node could; the runtime's record
    // still holds what nri-plugin sent.
    let off_claim: CpuSet = pool.iter().take(1).collect();
    node.write_cgroup_cpus(&ns.name, "shared", "app", &online)
        .unwrap();
    node.write_cgroup_cpus(&ns.name, "pinned", "app", &off_claim)
        .unwrap();
    // Found within two of the chart's 10 s read-backs.
    node.wait("the drifts found", CPUSET_CHANGE, || {
        let repairs = drift_repairs(&node) - repairs_before;
        Ok(if repairs >= 2.0 {
            Ok(())
        } else {
            Err(format!("{repairs} repaired"))
        })
    })
    .unwrap();
    if !node.runtime_takes_unsolicited_updates() {
        // The repair rides on the next event's reply.
        node.apply(&pod_yaml(&ns.name, "nudge", Some("100m"), &[]))
            .unwrap();
        node.wait_running(&ns.name, "nudge", POD_START).unwrap();
    }
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "pinned", "app", &claim, CPUSET_CHANGE)
        .unwrap();
}

/// The upstream gauges of dra-plugin's /metrics: (allocated, available,
/// reserved, active claims).
fn gauges(node: &RealNode) -> (f64, f64, f64, f64) {
    let text = node
        .pod_http(
            DRIVER_NAMESPACE,
            &driver_pod(node),
            DRA_PLUGIN_HTTP,
            "/metrics",
        )
        .unwrap();
    let get = |name: &str| {
        metric_value(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    };
    (
        get("dra_cpu_allocated_cpus"),
        get("dra_cpu_available_cpus"),
        get("dra_cpu_reserved_cpus"),
        get("dra_cpu_resource_claims_active"),
    )
}

fn wait_gauges(node: &RealNode, what: &str, want: (f64, f64, f64, f64)) {
    node.wait(what, CPUSET_CHANGE, || {
        let got = gauges(node);
        if got == want {
            Ok(Ok(()))
        } else {
            Ok(Err(format!(
                "(allocated, available, reserved, claims) {got:?}, want {want:?}"
            )))
        }
    })
    .unwrap();
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn health_and_the_metric_gauges_follow_allocation_restart_and_deletion() {
    let (_guard, node) = node();
    let online = online_cpus().unwrap().len() as f64;
    let pod = driver_pod(&node);
    for port in [DRA_PLUGIN_HTTP, NRI_PLUGIN_HTTP] {
        let body = node
            .pod_http(DRIVER_NAMESPACE, &pod, port, "/healthz")
            .unwrap();
        assert!(
            body.trim().eq_ignore_ascii_case("ok"),
            "port {port}: {body}"
        );
    }
    let ns = TestNamespace::new(&node, "gauges").unwrap();
    let (allocated, available, reserved, claims) = gauges(&node);
    // Every CPU is allocated, available or reserved.
    assert_eq!(allocated + available + reserved, online);

    ns.start_shared_and_claim_pods("exclusive", None, POD_START)
        .unwrap();
    let after = (allocated + 1.0, available - 1.0, reserved, claims + 1.0);
    wait_gauges(&node, "the gauges after one claim of one CPU", after);
    // Rebuilt from the store after a restart.
    kill_driver_container(&node, "dra-plugin");
    wait_gauges(&node, "the gauges after dra-plugin's restart", after);
    node.kubectl(&["delete", "pod", "-n", &ns.name, "exclusive", "--wait=true"])
        .unwrap();
    wait_gauges(
        &node,
        "the gauges back after the pod's deletion",
        (allocated, available, reserved, claims),
    );
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_force_deleted_pods_claim_is_unprepared_and_its_cpus_return() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "force-delete").unwrap();
    let online = online_cpus().unwrap();
    let (allocated, available, reserved, claims) = gauges(&node);
    ns.start_shared_and_claim_pods("exclusive", None, POD_START)
        .unwrap();
    let exclusive = claim_cpus(&node, &ns.name, "exclusive");
    node.wait_cpus(
        &ns.name,
        "shared",
        "app",
        &online.difference(&exclusive),
        CPUSET_CHANGE,
    )
    .unwrap();
    // Gone from the API at once; kubelet still has to stop the container
    // and unprepare the claim.
    node.kubectl(&[
        "delete",
        "pod",
        "-n",
        &ns.name,
        "exclusive",
        "--force",
        "--grace-period=0",
    ])
    .unwrap();
    wait_gauges(
        &node,
        "the claim unprepared after the force deletion",
        (allocated, available, reserved, claims),
    );
    if !node.runtime_takes_unsolicited_updates() {
        node.apply(&pod_yaml(&ns.name, "next-event", Some("100m"), &[]))
            .unwrap();
    }
    node.wait_cpus(&ns.name, "shared", "app", &online, CPUSET_CHANGE)
        .unwrap();
    // The CPU can be had again.
    node.apply(&pod_yaml(&ns.name, "again", None, &[("cpus", "one-cpu")]))
        .unwrap();
    node.wait_running(&ns.name, "again", POD_START).unwrap();
    assert_eq!(claim_cpus(&node, &ns.name, "again").len(), 1);
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn helm_upgrade_to_a_new_image_moves_no_pods_cpus() {
    let (_guard, node) = node();
    // The chart's default strategy: the old pod goes before the new one
    // starts. Two instances at once would share one store and one NRI
    // registration, so no surge.
    let ds = node
        .get_json(&["daemonset", "-n", DRIVER_NAMESPACE, "dra-cpu"])
        .unwrap();
    let strategy = &ds["spec"]["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate", "{strategy}");
    assert!(
        strategy["rollingUpdate"]["maxSurge"] == 0 || strategy["rollingUpdate"]["maxSurge"] == "0",
        "{strategy}"
    );

    let ns = TestNamespace::new(&node, "upgrade").unwrap();
    let online = online_cpus().unwrap();
    ns.start_shared_and_claim_pods("exclusive", None, POD_START)
        .unwrap();
    let exclusive = claim_cpus(&node, &ns.name, "exclusive");
    let pool = online.difference(&exclusive);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    let old_pod = driver_pod(&node);
    let image = |pod: &str| {
        let object = node
            .get_json(&["pod", "-n", DRIVER_NAMESPACE, pod])
            .unwrap();
        object["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let old_image = image(&old_pod);
    let exclusive_history = node.record_cpus(&ns.name, "exclusive", "app").unwrap();
    let shared_history = node.record_cpus(&ns.name, "shared", "app").unwrap();
    // Another tag of the same build: the pod spec changes, so the DaemonSet
    // rolls (alternating, so that a second run upgrades again).
    let old_tag = old_image.rsplit_once(':').unwrap().1;
    let new_tag = match old_tag.strip_suffix("-upgraded") {
        Some(base) => base.to_string(),
        None => format!("{old_tag}-upgraded"),
    };
    let upgraded = std::process::Command::new(
        dra_cpu_tests::real_node::repo_root().join("scripts/real-node.sh"),
    )
    .arg("install")
    .env("DRA_CPU_IMAGE_TAG", &new_tag)
    .status()
    .unwrap();
    assert!(upgraded.success(), "helm upgrade failed");
    wait_driver_ready(&node);
    let new_pod = driver_pod(&node);
    assert_ne!(new_pod, old_pod, "the DaemonSet did not roll");
    assert!(image(&new_pod).ends_with(&format!(":{new_tag}")));
    // Nothing moved, and the new instance pins what starts now.
    node.wait_cpus(&ns.name, "exclusive", "app", &exclusive, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    node.apply(&pod_yaml(&ns.name, "after", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "after", POD_START).unwrap();
    node.wait_cpus(&ns.name, "after", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    exclusive_history.assert_held(&exclusive, "helm upgrade");
    shared_history.assert_held(&pool, "helm upgrade");
    // The claim is still the driver's, with the same CPUs in its status.
    let claims = node.get_json(&["resourceclaims", "-n", &ns.name]).unwrap();
    let status = claims["items"][0]["status"]["devices"].to_string();
    assert!(
        status.contains(&format!("\"{}\"", exclusive.to_cpulist())),
        "{status}"
    );
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn the_driver_stopped_and_back_moves_no_exclusive_cpu() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "driver-stopped").unwrap();
    let online = online_cpus().unwrap();
    ns.start_shared_and_claim_pods("exclusive", None, POD_START)
        .unwrap();
    let exclusive = claim_cpus(&node, &ns.name, "exclusive");
    let pool = online.difference(&exclusive);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    let exclusive_history = node.record_cpus(&ns.name, "exclusive", "app").unwrap();
    let shared_history = node.record_cpus(&ns.name, "shared", "app").unwrap();

    // Stopped as an operator would: the DaemonSet keeps to no node.
    let selector = |value: &str| {
        format!(
            r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{{"dra-cpu.test/stopped":{value}}}}}}}}}}}"#
        )
    };
    let patch = |value: &str| {
        node.kubectl(&[
            "patch",
            "daemonset",
            "-n",
            DRIVER_NAMESPACE,
            "dra-cpu",
            "--type=merge",
            "-p",
            &selector(value),
        ])
        .unwrap();
    };
    patch("\"true\"");
    node.wait("the driver's pod gone", POD_START, || {
        let pods = node.get_json(&["pods", "-n", DRIVER_NAMESPACE])?;
        match pods["items"].as_array().map(Vec::len) {
            Some(0) => Ok(Ok(())),
            _ => Ok(Err(pods["items"].to_string())),
        }
    })
    .unwrap();
    // Without the driver: the exclusive pod keeps its CPU, and a pod
    // without a claim still starts (the runtime places it as it would
    // without NRI plugins).
    node.wait_cpus(&ns.name, "exclusive", "app", &exclusive, CPUSET_CHANGE)
        .unwrap();
    node.apply(&pod_yaml(&ns.name, "while-stopped", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "while-stopped", POD_START)
        .unwrap();
    let stopped = node.pod_cpus(&ns.name, "while-stopped", "app").unwrap();
    assert!(
        pool.is_subset(&stopped.cgroup),
        "a pod started without the driver is kept off the pool: {}",
        stopped.cgroup.to_cpulist()
    );
    eprintln!(
        "real node: a pod started while the driver was stopped runs on CPUs {}",
        stopped.cgroup.to_cpulist()
    );

    patch("null");
    wait_driver_ready(&node);
    // Back: nothing exclusive moved, and the pod started meanwhile leaves
    // the exclusive CPU.
    node.wait_cpus(&ns.name, "exclusive", "app", &exclusive, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "while-stopped", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    exclusive_history.assert_held(&exclusive, "the driver stopped and back");
    shared_history.assert_held(&pool, "the driver stopped and back");
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn an_opaque_cpuset_config_gets_exactly_the_cpus_it_names() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "opaque").unwrap();
    let online = online_cpus().unwrap();
    let grouped = grouped(&node);
    // The last CPU: never the allocator's first choice on its own.
    let named = online.iter().last().unwrap();
    // The config as a user writes it in the claim; the real scheduler copies
    // it into the allocation (source FromClaim).
    let template = format!(
        "{}      config:\n        - requests: [cpus]\n          opaque:\n            driver: {DRIVER}\n            parameters:\n              apiVersion: v1alpha1\n              cpuConfig:\n                cpuset: \"{named}\"\n",
        claim_template_yaml(&ns.name, "named-cpu", 1, grouped)
    );
    node.apply(&template).unwrap();
    node.apply(&pod_yaml(
        &ns.name,
        "opaque",
        None,
        &[("cpus", "named-cpu")],
    ))
    .unwrap();
    node.wait_running(&ns.name, "opaque", POD_START).unwrap();
    let cpus = claim_cpus(&node, &ns.name, "opaque");
    let claims = node.get_json(&["resourceclaims", "-n", &ns.name]).unwrap();
    let allocation = &claims["items"][0]["status"]["allocation"]["devices"];
    assert_eq!(
        allocation["config"][0]["source"], "FromClaim",
        "{allocation}"
    );
    if grouped {
        // A grouped device's CPUs are the driver's to choose: the config's.
        assert_eq!(cpus.to_cpulist(), named.to_string());
    } else {
        // An individual device is one CPU, which the scheduler chose; the
        // config cannot move it.
        let device = allocation["results"][0]["device"].as_str().unwrap();
        let slices = slices(&node);
        let cpu_id = devices(&slices)
            .into_iter()
            .find(|d| d["name"] == device)
            .and_then(|d| d["attributes"]["dra.cpu/cpuID"]["int"].as_u64())
            .unwrap_or_else(|| panic!("no cpuID of device {device}"));
        assert_eq!(cpus.to_cpulist(), cpu_id.to_string());
    }
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn the_claims_device_metadata_files_are_inside_the_container() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "metadata").unwrap();
    node.apply(&claim_yaml(&ns.name, "metadata-claim", 1, grouped(&node)))
        .unwrap();
    let mut pod = PodSpec::new(&ns.name, "metadata");
    pod.claims = vec![("cpus", "metadata-claim")];
    node.apply(&pod.yaml()).unwrap();
    node.wait_running(&ns.name, "metadata", POD_START).unwrap();
    let cpus = claim_cpus(&node, &ns.name, "metadata");
    // KEP-5304: where kubelet's helper puts them, for a claim the pod names.
    let dir = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/metadata-claim/cpus";
    let files = node
        .kubectl(&[
            "exec", "-n", &ns.name, "metadata", "-c", "app", "--", "ls", dir,
        ])
        .unwrap();
    let file = files
        .lines()
        .find(|f| f.ends_with("-metadata.json"))
        .map(|f| format!("{dir}/{f}"))
        .unwrap_or_else(|| panic!("no metadata file in {dir}: {files}"));
    let file = file.as_str();
    let text = node
        .kubectl(&[
            "exec", "-n", &ns.name, "metadata", "-c", "app", "--", "cat", file,
        ])
        .unwrap();
    // A stream of the same object in each API version, newest first.
    let documents: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{file} is not a JSON stream ({e}): {text}"));
    let document = documents
        .first()
        .unwrap_or_else(|| panic!("{file} is empty"));
    assert_eq!(document["kind"], "DeviceMetadata", "{document}");
    let requests = document["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{document}");
    assert_eq!(requests[0]["name"], "cpus");
    let device = &requests[0]["devices"][0];
    assert_eq!(device["driver"], DRIVER, "{document}");
    assert_eq!(
        device["attributes"]["dra.cpu/allocatedNumCPUs"]["int"], 1,
        "{device}"
    );
    assert_eq!(
        device["attributes"]["dra.cpu/cpus"]["string"],
        cpus.to_cpulist().as_str(),
        "{device}"
    );
    // The device's published attributes come with it.
    let published = devices(&slices(&node))
        .into_iter()
        .find(|d| d["name"] == device["name"])
        .unwrap_or_else(|| panic!("device {} not in the slices", device["name"]));
    for (name, value) in published["attributes"].as_object().unwrap() {
        assert_eq!(&device["attributes"][name], value, "{name}");
    }
}

/// Waits until the claim of `pod` (made from its template) is allocated:
/// the scheduler is done, kubelet's prepare comes next.
fn wait_allocated(node: &RealNode, namespace: &str, pod: &str) {
    node.wait(&format!("the claim of {pod} allocated"), POD_START, || {
        let object = node.get_json(&["pod", "-n", namespace, pod])?;
        let Some(claim) =
            object["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()
        else {
            return Ok(Err(format!("no claim yet: {}", object["status"])));
        };
        let claim = node.get_json(&["resourceclaim", "-n", namespace, claim])?;
        if claim["status"]["allocation"].is_object() {
            Ok(Ok(()))
        } else {
            Ok(Err(claim["status"].to_string()))
        }
    })
    .unwrap();
}

/// Bytes received and not yet read on dra-plugin's end of its DRA socket:
/// `ss -x` in the node's network namespace. The server end of an accepted
/// Unix connection belongs to the namespace of the process that dialed
/// (kubelet), and carries the name the listener was bound to (dra-plugin
/// binds `.dra.sock.<n>.tmp` and renames it into place), so the match is on
/// `dra.sock` within it.
fn unread_on_dra_socket(node: &RealNode) -> Result<u64, RealNodeError> {
    let netns = format!("--net={}", node.fact("REAL_NODE_NETNS"));
    let output = std::process::Command::new("nsenter")
        .args([netns.as_str(), "ss", "-xanH"])
        .output()
        .map_err(|source| RealNodeError::Spawn {
            what: "nsenter ss -xanH".into(),
            source,
        })?;
    // A failed `ss` is said as such, not read as "nothing unread".
    if !output.status.success() {
        return Err(RealNodeError::Failed {
            what: format!("nsenter {netns} ss -xanH"),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    // Netid State Recv-Q Send-Q Local-Address Port Peer-Address Port
    Ok(text
        .lines()
        .filter(|line| line.contains("/dra.cpu/") && line.contains("dra.sock"))
        .filter_map(|line| line.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum())
}

/// Waits until kubelet's NodePrepareResources waits unread on the DRA
/// socket of a frozen dra-plugin ([`Frozen`]).
fn wait_prepare_unread(node: &RealNode) {
    node.wait(
        "kubelet's NodePrepareResources waiting on the frozen dra-plugin",
        CPUSET_CHANGE,
        || match unread_on_dra_socket(node)? {
            0 => Ok(Err("nothing unread on dra.sock".to_string())),
            unread => Ok(Ok(unread)),
        },
    )
    .unwrap();
}

/// A container of the node frozen (`ctr tasks pause`) until dropped, also
/// when the scenario fails.
struct Frozen<'a> {
    node: &'a RealNode,
    container: String,
}

impl<'a> Frozen<'a> {
    fn new(node: &'a RealNode, container: &str) -> Self {
        node.script(&["ctr", "tasks", "pause", container]).unwrap();
        Frozen {
            node,
            container: container.to_string(),
        }
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if let Err(e) = self
            .node
            .script(&["ctr", "tasks", "resume", &self.container])
        {
            eprintln!("real node: cannot thaw {}: {e}", self.container);
        }
    }
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn restarts_in_the_middle_of_pod_starts_lose_and_double_nothing() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "restart-midway").unwrap();
    let online = online_cpus().unwrap();
    let (allocated, available, reserved, claims) = gauges(&node);
    let one_claim = (allocated + 1.0, available - 1.0, reserved, claims + 1.0);
    node.apply(&claim_template_yaml(&ns.name, "one-cpu", 1, grouped(&node)))
        .unwrap();
    node.apply(&pod_yaml(&ns.name, "shared", Some("100m"), &[]))
        .unwrap();
    node.wait_running(&ns.name, "shared", POD_START).unwrap();

    // kubelet restarted while its prepare is in flight: dra-plugin's
    // container is frozen before the pod exists, so the NodePrepareResources
    // kubelet starts once the claim is allocated cannot finish; kubelet is
    // restarted, then dra-plugin thawed. It answers the dead call, and the
    // new kubelet prepares again.
    let prepared_lines = |claim: &str| {
        let logs = node
            .kubectl(&[
                "logs",
                "-n",
                DRIVER_NAMESPACE,
                &driver_pod(&node),
                "-c",
                "dra-plugin",
            ])
            .unwrap();
        logs.lines()
            .filter(|l| l.contains("claim prepared") && l.contains(claim))
            .count()
    };
    let dra_plugin = node
        .container_id(DRIVER_NAMESPACE, &driver_pod(&node), "dra-plugin")
        .unwrap();
    let frozen = Frozen::new(&node, &dra_plugin);
    node.apply(&pod_yaml(&ns.name, "first", None, &[("cpus", "one-cpu")]))
        .unwrap();
    wait_allocated(&node, &ns.name, "first");
    // kubelet's pod worker prepares first thing once the pod is bound: its
    // request waits unread on dra-plugin's DRA socket.
    wait_prepare_unread(&node);
    let pending = node.get_json(&["pod", "-n", &ns.name, "first"]).unwrap();
    assert_ne!(
        pending["status"]["phase"], "Running",
        "the pod ran with dra-plugin frozen: {}",
        pending["status"]
    );
    node.script(&["restart", "kubelet"]).unwrap();
    drop(frozen);
    node.wait_running(&ns.name, "first", POD_START).unwrap();
    let claim_name = node.get_json(&["pod", "-n", &ns.name, "first"]).unwrap()["status"]
        ["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        prepared_lines(&format!("{}/{claim_name}", ns.name)),
        1,
        "the claim was to be prepared once (a second prepare finds it prepared)"
    );
    let first = claim_cpus(&node, &ns.name, "first");
    assert_eq!(first.len(), 1, "got {}", first.to_cpulist());
    let pool = online.difference(&first);
    node.wait_cpus(&ns.name, "shared", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    wait_gauges(&node, "one claim after kubelet's restart", one_claim);

    // nri-plugin killed while a pod starts: it starts on the pool, and the
    // running pods do not move meanwhile.
    let first_history = node.record_cpus(&ns.name, "first", "app").unwrap();
    let shared_history = node.record_cpus(&ns.name, "shared", "app").unwrap();
    node.apply(&pod_yaml(&ns.name, "shared-2", Some("100m"), &[]))
        .unwrap();
    kill_driver_container(&node, "nri-plugin");
    node.wait_running(&ns.name, "shared-2", POD_START).unwrap();
    node.wait_cpus(&ns.name, "shared-2", "app", &pool, CPUSET_CHANGE)
        .unwrap();
    node.wait_cpus(&ns.name, "first", "app", &first, CPUSET_CHANGE)
        .unwrap();
    first_history.assert_held(&first, "nri-plugin killed while a pod started");
    shared_history.assert_held(&pool, "nri-plugin killed while a pod started");

    // dra-plugin killed while a claim is prepared: the claim is prepared
    // once, on one CPU, by the next instance or before the kill.
    node.kubectl(&["delete", "pod", "-n", &ns.name, "first", "--wait=true"])
        .unwrap();
    wait_gauges(&node, "no claim", (allocated, available, reserved, claims));
    node.apply(&pod_yaml(&ns.name, "second", None, &[("cpus", "one-cpu")]))
        .unwrap();
    wait_allocated(&node, &ns.name, "second");
    kill_driver_container(&node, "dra-plugin");
    node.wait_running(&ns.name, "second", POD_START).unwrap();
    let second = claim_cpus(&node, &ns.name, "second");
    assert_eq!(second.len(), 1, "got {}", second.to_cpulist());
    let pool = online.difference(&second);
    for pod in ["shared", "shared-2"] {
        node.wait_cpus(&ns.name, pod, "app", &pool, CPUSET_CHANGE)
            .unwrap();
    }
    wait_gauges(&node, "one claim after dra-plugin's restart", one_claim);
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn a_tuned_claim_gets_quiet_cpus_and_a_selector_on_the_nodes_tuning_works() {
    let (_guard, node) = node();
    let ns = TestNamespace::new(&node, "tuning").unwrap();
    let online = online_cpus().unwrap();
    let grouped = grouped(&node);
    let before = KernelTuning::read(&online).unwrap();
    let has_cpufreq = std::path::Path::new("/sys/devices/system/cpu/cpu0/cpufreq").exists();
    for device in devices(&slices(&node)) {
        assert_eq!(
            device["attributes"]["dra.cpu/irqIsolation"]["bool"], true,
            "{device}"
        );
        assert_eq!(
            device["attributes"]["dra.cpu/cfsQuotaControl"]["bool"], true,
            "{device}"
        );
    }
    // A claim that selects on the node's tuning attributes and asks for
    // interrupts off its CPUs, no CFS quota and no idle latency.
    let selected = |template: String, expression: &str| {
        template.replace(
            "            deviceClassName: dra.cpu\n",
            &format!("            deviceClassName: dra.cpu\n            selectors:\n              - cel:\n                  expression: '{expression}'\n"),
        )
    };
    let tuning = "      config:\n        - requests: [cpus]\n          opaque:\n            driver: dra.cpu\n            parameters:\n              apiVersion: v1alpha1\n              tuning:\n                irqs: isolate\n                cfsQuota: \"off\"\n                idle: {maxLatencyMicroseconds: 0}\n";
    let template = format!(
        "{}{tuning}",
        selected(
            claim_template_yaml(&ns.name, "quiet-cpu", 1, grouped),
            r#"device.attributes["dra.cpu"].irqIsolation == true && device.attributes["dra.cpu"].idleLatencyControl == true"#,
        )
    );
    node.apply(&template).unwrap();
    let mut pod = PodSpec::new(&ns.name, "quiet");
    pod.cpu_request = Some("500m");
    pod.cpu_limit = Some("500m");
    pod.templates = vec![("cpus", "quiet-cpu")];
    node.apply(&pod.yaml()).unwrap();
    node.wait_running(&ns.name, "quiet", POD_START).unwrap();
    // Its claim's CPUs: with a CPU request in mixed allocation mode the
    // container also runs on the shared pool, which tuning leaves alone.
    let cpus = claim_env_cpus(&node, &ns.name, "quiet");
    let now = KernelTuning::read(&online).unwrap();
    assert!(
        now.default_irq_affinity.is_disjoint(&cpus),
        "new interrupts may target {}, the claim holds {cpus}",
        now.default_irq_affinity
    );
    let left = now.movable_irqs_on(&cpus);
    assert!(
        left.is_empty(),
        "interrupts {left:?} still target the claim's CPUs {cpus}"
    );
    assert!(
        now.moved_since(&before) > 0,
        "no interrupt moved off {cpus}"
    );
    for cpu in cpus.iter() {
        if before.idle_latency.get(&cpu).is_some_and(Option::is_some) {
            assert_eq!(
                now.idle_latency.get(&cpu).cloned().flatten().as_deref(),
                Some("n/a"),
                "CPU {cpu} may still idle"
            );
        }
    }
    let id = node.container_id(&ns.name, "quiet", "app").unwrap();
    let pid = node.container_pid(&id).unwrap();
    assert_eq!(
        dra_cpu_tests::cgroup::weight::cfs_quota_of(pid).unwrap(),
        None,
        "the container of a claim asking cfsQuota off has a quota"
    );

    // A selector the node's attributes cannot meet (no cpufreq here): the
    // real scheduler leaves the pod unscheduled instead of failing a prepare.
    if !has_cpufreq {
        let governed = selected(
            claim_template_yaml(&ns.name, "governed-cpu", 1, grouped),
            r#"has(device.attributes["dra.cpu"].governors)"#,
        );
        node.apply(&governed).unwrap();
        let mut pod = PodSpec::new(&ns.name, "governed");
        pod.templates = vec![("cpus", "governed-cpu")];
        node.apply(&pod.yaml()).unwrap();
        let message = node
            .wait_unschedulable(&ns.name, "governed", POD_START)
            .unwrap();
        eprintln!("the governed pod: {message}");
        node.kubectl(&["delete", "pod", "-n", &ns.name, "governed", "--wait=true"])
            .unwrap();
    }

    // Deleted: kubelet unprepares the claim and the host is as before.
    node.kubectl(&["delete", "pod", "-n", &ns.name, "quiet", "--wait=true"])
        .unwrap();
    node.wait("the host's tuning put back", POD_START, || {
        let now =
            KernelTuning::read(&online).map_err(|e| RealNodeError::Unexpected(e.to_string()))?;
        Ok(if now == before {
            Ok(())
        } else {
            Err(format!("{now:?}, was {before:?}"))
        })
    })
    .unwrap();
}
