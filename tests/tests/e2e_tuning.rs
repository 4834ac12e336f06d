//! Claims' tuning on a real containerd, on this host's kernel: the CFS quota
//! of a claim's container read back from its cgroup (v1 `cpu.cfs_quota_us`
//! or v2 `cpu.max`), load balancing off on cgroup v1 read back from the
//! cpusets' `cpuset.sched_load_balance`, refusals by name with nothing
//! applied, and the device attributes that say what the node honours. The knobs of the node
//! itself (interrupts, idle states) are shown on the VM node's kernel
//! (`tests/tests/vm_node.rs`), where changing them harms no other work.
//! Needs root and containerd, as every `e2e_*` test.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cgroup::weight::cfs_quota_of;
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::kubelet_dra::Claim;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::claims::PreparedClaim;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::{PodIdentity, RunningPod};
use dra_cpu_tests::node::{Node, GROUPED_DEVICE};
use e2e_common::{devices, node};
use serde_json::{json, Value};

/// Pod `name` and its claim of one CPU, allocated by the scheduler, whose
/// opaque config asks `tuning`.
fn tuned_claim(node: &Node, name: &str, tuning: Value) -> (PodIdentity, Claim) {
    let pod = PodIdentity::new(name);
    let claim = node
        .allocate_claim_with_parameters(
            &format!("{name}-cpu"),
            GROUPED_DEVICE,
            1,
            &pod,
            json!({"apiVersion": "v1alpha1", "tuning": tuning}),
        )
        .must("allocating the claim");
    (pod, claim)
}

/// A pod whose container `app` asks 1 CPU and is limited to 1 CPU, with a
/// claim of one CPU whose opaque config asks `tuning`.
async fn limited_claim_pod(
    node: &mut Node,
    name: &str,
    tuning: Value,
) -> (Claim, RunningPod, String) {
    let (pod, claim) = tuned_claim(node, name, tuning);
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    let spec = ContainerSpec::sleeper("app").with_cpu(Some(1000), Some(1000));
    let (running, id) = node
        .start_claim_container(&pod, &prepared, spec)
        .await
        .must("the claim container on its CPU");
    (claim, running, id)
}

/// Pod `pod` whose container `app` uses the prepared claim and is limited
/// to 1 CPU, started without waiting for its cpuset (nri-plugin or
/// dra-plugin is away); its id.
async fn start_limited_pod(
    node: &mut Node,
    pod: &PodIdentity,
    prepared: &PreparedClaim,
    when: &str,
) -> (RunningPod, String) {
    let spec = ContainerSpec::sleeper("app")
        .with_cdi_device(&prepared.cdi_device)
        .with_cpu(Some(1000), Some(1000));
    let running = node
        .start_pod(pod, &[spec])
        .await
        .must(&format!("starting the pod {when}"));
    let id = running.id("app").to_string();
    (running, id)
}

async fn quota(node: &mut Node, id: &str) -> Option<u64> {
    let pid = node.cri.container_pid(id).await.must("container pid");
    cfs_quota_of(pid).must("reading the container's CFS quota")
}

/// Waits (30 s at most) until the container has no CFS quota.
async fn wait_no_quota(node: &mut Node, id: &str) {
    let waited = std::time::Instant::now();
    loop {
        let now = quota(node, id).await;
        if now.is_none() {
            return;
        }
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(30),
            "the container's quota is still {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn tuning_node() -> NodeOptions {
    NodeOptions {
        low_latency_tuning: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn cfs_quota_off_leaves_the_claim_container_without_quota_despite_its_limit() {
    let mut node = node(tuning_node()).await;
    let (claim, tuned, id) =
        limited_claim_pod(&mut node, "tuned", json!({"cfsQuota": "off"})).await;
    assert_eq!(
        quota(&mut node, &id).await,
        None,
        "the tuned container has a quota"
    );
    node.delete_pod(&tuned).await.must("deleting the tuned pod");
    node.unprepare(&claim).await.must("unpreparing its claim");

    // The control: the same pod and claim without the tuning keeps the
    // quota its CPU limit gives (1 CPU: 100 ms per 100 ms period).
    let (_claim, _plain, id) =
        limited_claim_pod(&mut node, "plain", json!({"cfsQuota": "default"})).await;
    assert_eq!(
        quota(&mut node, &id).await,
        Some(100_000),
        "the untuned container's quota"
    );
}

/// A container started while nri-plugin is away runs with the quota of its
/// CPU limit (the control: read before nri-plugin is back); the runtime's
/// Synchronize with the returning nri-plugin takes it off, with the cpuset.
#[tokio::test]
async fn cfs_quota_off_reaches_a_container_started_while_nri_plugin_was_away() {
    let mut node = node(tuning_node()).await;
    let (pod, claim) = tuned_claim(&node, "late", json!({"cfsQuota": "off"}));
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    node.kill_nri_plugin();
    let (_running, id) = start_limited_pod(&mut node, &pod, &prepared, "without nri-plugin").await;
    assert_eq!(
        quota(&mut node, &id).await,
        Some(100_000),
        "without nri-plugin the container has its limit's quota"
    );
    node.start_nri_plugin().await.must("nri-plugin back");
    node.wait_cpus(&id, &prepared.cpus)
        .await
        .must("the container on its claim's CPUs");
    wait_no_quota(&mut node, &id).await;
}

/// A container created while dra-plugin does not answer, after nri-plugin
/// restarted and synchronized, knows its claim from the CDI spec alone (no
/// tuning) and starts with its limit's quota; once dra-plugin answers and
/// its snapshot says the claim asks for no quota, the quota goes, without
/// another Synchronize (unsolicited on a runtime that takes it, else with
/// the next NRI event: a shared pod started here). The quota read back
/// while dra-plugin is held is the control: the window is real.
#[tokio::test]
async fn cfs_quota_off_reaches_a_container_created_while_dra_plugin_did_not_answer() {
    let mut node = node(tuning_node()).await;
    let (pod, claim) = tuned_claim(&node, "hung", json!({"cfsQuota": "off"}));
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    node.kill_nri_plugin();
    let held = node.hold_dra_plugin().await.must("holding dra-plugin");
    node.start_nri_plugin_unsubscribed()
        .await
        .must("nri-plugin registered with the runtime");
    let (_running, id) =
        start_limited_pod(&mut node, &pod, &prepared, "while dra-plugin is held").await;
    node.wait_cpus(&id, &prepared.cpus)
        .await
        .must("the container on its claim's CPUs from the CDI spec");
    assert!(held.is_stopped());
    assert_eq!(
        quota(&mut node, &id).await,
        Some(100_000),
        "untuned while nri-plugin knows the claim from its CDI spec alone"
    );
    held.release();
    node.wait_nri_ready(true)
        .await
        .must("nri-plugin subscribed to dra-plugin");
    let _event = node
        .start_pod(
            &PodIdentity::new("next-event"),
            &[ContainerSpec::sleeper("shared")],
        )
        .await
        .must("a shared pod, an NRI event");
    wait_no_quota(&mut node, &id).await;
}

#[tokio::test]
async fn tuning_the_node_cannot_honour_is_refused_by_name_with_nothing_applied() {
    let mut node = node(NodeOptions::default()).await;
    let irq_default = std::fs::read_to_string("/proc/irq/default_smp_affinity").ok();
    let cases = [
        (
            "irqs",
            json!({"irqs": "isolate"}),
            "tuning.irqs cannot be honoured on this node: low-latency tuning is off on this node",
        ),
        (
            "typo",
            json!({"irq": "isolate"}),
            "unknown key tuning.irq (known: irqs, cfsQuota, loadBalancing, idle, governor)",
        ),
        (
            "value",
            json!({"cfsQuota": "disable"}),
            "tuning.cfsQuota: \"disable\" is not one of \"off\", \"default\"",
        ),
    ];
    for (name, tuning, want) in cases {
        let (_pod, claim) = tuned_claim(&node, name, tuning);
        let error = match node.prepare(&claim).await {
            Ok(prepared) => panic!("{name}: prepared on CPUs {}", prepared.cpus),
            Err(e) => e.to_string(),
        };
        assert!(error.contains(want), "{name}: {error}");
    }
    assert!(
        node.stored_claims().await.must("stored claims").is_empty(),
        "a refused claim was stored"
    );
    assert!(
        !node
            .layout()
            .state_dir()
            .join("tuning-baseline.json")
            .exists(),
        "a refused claim left a tuning record"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/irq/default_smp_affinity").ok(),
        irq_default,
        "interrupts moved for a refused claim"
    );
    // Without --low-latency-tuning no tuning attribute is published.
    let slices = node.wait_slices().await.must("slices");
    for device in devices(&slices) {
        assert!(
            device
                .pointer("/attributes/dra.cpu~1cfsQuotaControl")
                .is_none(),
            "a tuning attribute without --low-latency-tuning: {device}"
        );
    }
}

#[tokio::test]
async fn the_devices_say_which_tuning_the_node_honours() {
    let mut node = node(tuning_node()).await;
    let slices = node.wait_slices().await.must("slices");
    let all = devices(&slices);
    assert!(!all.is_empty());
    for device in all {
        let attribute = |name: &str| {
            device
                .pointer(&format!("/attributes/dra.cpu~1{name}/bool"))
                .cloned()
        };
        assert_eq!(attribute("cfsQuotaControl"), Some(json!(true)), "{device}");
        // Offered where the host's cgroup v2 has remote partitions (the
        // root's cpuset.cpus.isolated, Linux 6.7+), or on cgroup v1 where
        // the root cpuset does not balance, and said so.
        let partitions = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpuset"))
            && std::path::Path::new("/sys/fs/cgroup/cpuset.cpus.isolated").exists()
            || std::fs::read_to_string(V1_ROOT_LOAD_BALANCE).is_ok_and(|f| f.trim() == "0");
        assert_eq!(
            attribute("isolatedPartition"),
            Some(json!(partitions)),
            "{device}"
        );
        assert!(attribute("irqIsolation").is_some(), "{device}");
        assert!(attribute("idleLatencyControl").is_some(), "{device}");
    }
}

const V1_ROOT_LOAD_BALANCE: &str = "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance";

/// A cgroup v1 node prepared for `loadBalancing: off` as its operator
/// would: the root cpuset's `sched_load_balance` turned off, and every other
/// top-level cpuset's than the node's (`kubepods`) too (on a test host,
/// what other software made). Put back as it was when dropped (a failed
/// test too).
struct RootUnbalanced {
    was: Vec<(std::path::PathBuf, String)>,
}

impl RootUnbalanced {
    fn set() -> RootUnbalanced {
        let root = std::path::Path::new(V1_ROOT_LOAD_BALANCE)
            .parent()
            .expect("the cpuset root");
        let mut files = vec![std::path::PathBuf::from(V1_ROOT_LOAD_BALANCE)];
        for entry in std::fs::read_dir(root).must("the cpuset root").flatten() {
            if entry.path().is_dir() && entry.file_name() != "kubepods" {
                files.push(entry.path().join("cpuset.sched_load_balance"));
            }
        }
        let mut prepared = RootUnbalanced { was: Vec::new() };
        for file in files {
            let was = std::fs::read_to_string(&file).must("a cpuset's flag");
            if was.trim() != "0" {
                std::fs::write(&file, "0\n").must("turning a cpuset's balancing off");
                prepared.was.push((file, was));
            }
        }
        prepared
    }
}

impl Drop for RootUnbalanced {
    fn drop(&mut self) {
        for (file, was) in self.was.iter().rev() {
            if let Err(e) = std::fs::write(file, was) {
                eprintln!("putting back {} failed: {e}", file.display());
            }
        }
    }
}

/// A cgroup's `cpuset.sched_load_balance`, as the kernel reads it back.
fn balances(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("cpuset.sched_load_balance"))
        .must(&format!("{}'s flag", dir.display()))
        .trim()
        .to_string()
}

/// Asserts that `dir` balances; if not, fails with the cgroup's CPUs and
/// nri-plugin's log. nri-plugin's pass at the claim container's start runs
/// after the shared pool's shrink reached the shared containers (in the
/// reply to the claim container's creation), so no wait: a shared container
/// that does not balance then is a fault to read in that log.
fn assert_balancing(node: &Node, dir: &std::path::Path, what: &str) {
    if balances(dir) != "1" {
        panic!(
            "{what} stopped balancing ({}, cpuset.cpus {:?}); nri-plugin's log:\n{}",
            dir.display(),
            std::fs::read_to_string(dir.join("cpuset.cpus")),
            std::fs::read_to_string(node.layout().nri_log()).unwrap_or_default()
        );
    }
}

async fn cpuset_dir(node: &mut Node, id: &str) -> std::path::PathBuf {
    let pid = node.cri.container_pid(id).await.must("container pid");
    dra_cpu_tests::cgroup::hierarchy::cpuset_dir_of(pid).must("the container's cpuset cgroup")
}

/// cgroup v1, which has no partitions: `loadBalancing: off` is refused by
/// name while the root cpuset balances (the control: nothing is turned off
/// without the operator's preparation); with the root's flag off, every
/// cpuset of kubelet's tree holding the claim's CPU stops balancing (the
/// claim's container, its pod, `kubepods`, and a pod started later), the
/// shared containers keep balancing, an untuned claim's container keeps
/// it, and after the pod's deletion and the unprepare every flag is 1
/// again. Read back from the host's kernel. The v2 partitions are shown
/// on the VM node.
#[tokio::test]
async fn load_balancing_off_on_cgroup_v1_turns_off_the_cpusets_that_hold_the_claims_cpus() {
    if !std::path::Path::new(V1_ROOT_LOAD_BALANCE).exists() {
        eprintln!("skipped: this host is not cgroup v1 (the VM node shows cgroup v2's partitions)");
        return;
    }
    {
        let node = node(tuning_node()).await;
        if std::fs::read_to_string(V1_ROOT_LOAD_BALANCE)
            .must("root")
            .trim()
            == "1"
        {
            let (_pod, claim) = tuned_claim(&node, "balancing", json!({"loadBalancing": "off"}));
            let error = match node.prepare(&claim).await {
                Ok(prepared) => {
                    panic!("prepared on CPUs {} while the root balances", prepared.cpus)
                }
                Err(e) => e.to_string(),
            };
            assert!(
                error.contains("tuning.loadBalancing cannot be honoured on this node")
                    && error.contains("its root cpuset balances every CPU"),
                "{error}"
            );
        }
    }
    let _root = RootUnbalanced::set();
    let mut node = node(tuning_node()).await;
    let slices = node.wait_slices().await.must("slices");
    for device in devices(&slices) {
        assert_eq!(
            device.pointer("/attributes/dra.cpu~1isolatedPartition/bool"),
            Some(&json!(true)),
            "{device}"
        );
    }
    let (_shared, shared_id) = e2e_common::shared_pod(&mut node, "shared", 100).await;
    let shared_dir = cpuset_dir(&mut node, &shared_id).await;
    let (pod, claim) = tuned_claim(&node, "unbalanced", json!({"loadBalancing": "off"}));
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    let (tuned, id) = node
        .start_claim_container(&pod, &prepared, ContainerSpec::sleeper("app"))
        .await
        .must("the claim container on its CPU");
    let container = cpuset_dir(&mut node, &id).await;
    let pod_dir = container.parent().expect("the pod's cgroup").to_path_buf();
    let kubepods = pod_dir.parent().expect("kubepods").to_path_buf();
    for dir in [&container, &pod_dir, &kubepods] {
        assert_eq!(
            balances(dir),
            "0",
            "{} balances the claim's CPU",
            dir.display()
        );
    }
    assert_balancing(&node, &shared_dir, "the shared container");

    // A pod started later: its pod cgroup holds every CPU, and balances
    // when made; its first container's start turns that off.
    let (_later, later_id) = e2e_common::shared_pod(&mut node, "later", 100).await;
    let later = cpuset_dir(&mut node, &later_id).await;
    assert_eq!(balances(&later), "1", "a shared container of the later pod");
    let later_pod = later.parent().expect("its pod").to_path_buf();
    assert_eq!(
        balances(&later_pod),
        "0",
        "the later pod's cgroup balances the claim's CPU"
    );

    // An untuned claim's container keeps balancing (its CPU is not isolated).
    node.delete_pod(&tuned).await.must("deleting the tuned pod");
    node.unprepare(&claim).await.must("unpreparing its claim");
    for dir in [&kubepods, &later_pod, &shared_dir] {
        assert_eq!(balances(dir), "1", "{} after the claim went", dir.display());
    }
    let (_claim, _plain, plain_id) =
        limited_claim_pod(&mut node, "plain", json!({"cfsQuota": "default"})).await;
    let plain = cpuset_dir(&mut node, &plain_id).await;
    assert_eq!(balances(&plain), "1", "an untuned claim's container");
    assert_eq!(balances(&kubepods), "1");
}
