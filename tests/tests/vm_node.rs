//! Scenarios only a bigger node shows, run inside the VM node of
//! `scripts/vm-node.sh` (a real kernel with 2 sockets, 2 NUMA nodes and SMT,
//! cgroup v2): every expectation is derived from the sysfs the guest's
//! kernel wrote, and every cpuset is read from the container's cgroup v2
//! files and from inside the container.
//!
//! The tests are `#[ignore]`d so a workspace run on a host skips them;
//! `scripts/vm-node-tests.sh` runs them with `--ignored` inside the VM, whose
//! init sets `DRA_CPU_VM_NODE`. Run anywhere else, they refuse.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::interrupts::{idle_latency_path, KernelTuning};
use dra_cpu_tests::irqbalance::IrqBalance;
use dra_cpu_tests::kubelet_dra::health::{DeviceHealthState, KubeletRelease};
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::read_back::log_messages_with;
use dra_cpu_tests::node::Node;
use e2e_common::{claim_pod_on, devices, node, shared_pod};
use serde_json::Value;
use shared_state::assignment::CPU_CAPACITY;
use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Set by the VM node's init to the shape it booted (e.g. `2x2x2,numa=2`).
const VM_NODE_ENV: &str = "DRA_CPU_VM_NODE";

/// The topology as the guest's kernel reports it in sysfs.
#[derive(Debug)]
struct KernelTopology {
    online: CpuSet,
    /// NUMA node -> its CPUs (`/sys/devices/system/node/nodeN/cpulist`).
    numa: BTreeMap<u32, CpuSet>,
    /// CPU -> its package (`topology/physical_package_id`).
    package: BTreeMap<u32, u32>,
    /// CPU -> the hardware threads of its core (`topology/thread_siblings_list`).
    siblings: BTreeMap<u32, CpuSet>,
    /// `/sys/devices/system/cpu/smt/active`.
    smt_active: bool,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
        .trim()
        .to_string()
}

fn cpulist(path: &str) -> CpuSet {
    let text = read(path);
    CpuSet::parse_cpulist(&text).unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

fn number(path: &str) -> u32 {
    let text = read(path);
    text.parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

impl KernelTopology {
    fn read() -> Self {
        let online = cpulist("/sys/devices/system/cpu/online");
        let mut numa = BTreeMap::new();
        let nodes = std::fs::read_dir("/sys/devices/system/node").must("NUMA nodes in sysfs");
        for entry in nodes.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            numa.insert(
                id,
                cpulist(&format!("/sys/devices/system/node/{name}/cpulist")),
            );
        }
        let mut package = BTreeMap::new();
        let mut siblings = BTreeMap::new();
        for cpu in online.iter() {
            let dir = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            package.insert(cpu, number(&format!("{dir}/physical_package_id")));
            siblings.insert(cpu, cpulist(&format!("{dir}/thread_siblings_list")));
        }
        let smt_active = Path::new("/sys/devices/system/cpu/smt/active").exists()
            && read("/sys/devices/system/cpu/smt/active") == "1";
        KernelTopology {
            online,
            numa,
            package,
            siblings,
            smt_active,
        }
    }

    fn second_numa_node(&self) -> u32 {
        self.numa
            .keys()
            .nth(1)
            .copied()
            .must_some("a second NUMA node")
    }

    fn numa_of(&self, cpus: &CpuSet) -> CpuSet {
        self.numa
            .iter()
            .filter(|(_, node_cpus)| !node_cpus.is_disjoint(cpus))
            .map(|(id, _)| *id)
            .collect()
    }
}

/// Refuses to run outside the VM node; returns its topology, checked to be
/// a shape these scenarios mean something on.
fn vm_node() -> KernelTopology {
    let shape = std::env::var(VM_NODE_ENV).unwrap_or_else(|_| {
        panic!(
            "refusing to run outside the VM node (${VM_NODE_ENV} unset): \
             run scripts/vm-node-tests.sh, which boots it and runs these tests inside"
        )
    });
    let topology = KernelTopology::read();
    assert!(
        topology.numa.len() >= 2 && topology.smt_active,
        "VM node {shape}: these scenarios need 2 or more NUMA nodes and SMT, the kernel reports {topology:?}"
    );
    eprintln!("VM node {shape}: kernel topology {topology:?}");
    topology
}

fn timed(name: &str, started: Instant) {
    eprintln!("scenario {name}: {:.1} s", started.elapsed().as_secs_f64());
}

fn int_attribute(device: &Value, name: &str) -> Option<i64> {
    device.get("attributes")?.get(name)?.get("int")?.as_i64()
}

/// A node started with `options`, its allocatable CPUs and the container
/// id of a shared pod (`requests.cpu: 500m`, no claim) on them.
async fn node_with_shared_pod(options: NodeOptions) -> (Node, CpuSet, String) {
    let mut node = node(options).await;
    let all = node.allocatable().must("allocatable CPUs");
    let (_shared, shared) = shared_pod(&mut node, "shared", 500).await;
    (node, all, shared)
}

fn numa_device(node: u32) -> String {
    format!("cpudevnuma{node:03}")
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn a_published_slices_match_the_kernels_topology() {
    let kernel = vm_node();
    let started = Instant::now();
    // One reserved CPU, so the capacity must leave it out.
    let reserved = kernel.online.first().must_some("an online CPU");
    let mut node = node(NodeOptions {
        reserved_cpus: reserved.to_string(),
        ..Default::default()
    })
    .await;
    let slices = node.wait_slices().await.must("slices");
    let devices = devices(&slices);
    assert_eq!(
        devices.len(),
        kernel.numa.len(),
        "one grouped device per NUMA node: {devices:?}"
    );
    for (numa, cpus) in &kernel.numa {
        let name = numa_device(*numa);
        let device = devices
            .iter()
            .find(|d| d.get("name").and_then(Value::as_str) == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no device {name} for NUMA node {numa}: {devices:?}"));
        let allocatable: CpuSet = cpus.iter().filter(|c| *c != reserved).collect();
        let want = i64::try_from(allocatable.len()).must("CPU count");
        for attr in [
            "resource.kubernetes.io/numaNode",
            "dra.cpu/numaNodeID",
            "dra.net/numaNode",
        ] {
            assert_eq!(
                int_attribute(device, attr),
                Some(i64::from(*numa)),
                "{name} {attr}: {device}"
            );
        }
        let packages: Vec<u32> = cpus
            .iter()
            .filter_map(|c| kernel.package.get(&c).copied())
            .collect();
        assert!(
            packages.windows(2).all(|w| w[0] == w[1]),
            "NUMA node {numa} spans packages {packages:?}"
        );
        assert_eq!(
            int_attribute(device, "dra.cpu/socketID"),
            packages.first().map(|p| i64::from(*p)),
            "{name} socketID: {device}"
        );
        assert_eq!(
            int_attribute(device, "dra.cpu/numCPUs"),
            Some(want),
            "{name}: {device}"
        );
        assert_eq!(
            device
                .pointer(&format!(
                    "/capacity/{}/value",
                    CPU_CAPACITY.replace('/', "~1")
                ))
                .and_then(Value::as_str),
            Some(want.to_string().as_str()),
            "{name} capacity: {device}"
        );
        assert_eq!(
            device
                .pointer("/attributes/dra.cpu~1smtEnabled/bool")
                .and_then(Value::as_bool),
            Some(kernel.smt_active),
            "{name} smtEnabled: {device}"
        );
        let mapping = device
            .pointer("/nodeAllocatableResources/cpu/mapping")
            .unwrap_or_else(|| panic!("{name}: no KEP-5517 mapping: {device}"));
        assert_eq!(
            mapping.get("capacityKey").and_then(Value::as_str),
            Some(CPU_CAPACITY),
            "{name}: {mapping}"
        );
        assert_eq!(
            mapping
                .get("capacityMultiplier")
                .map(|q| q.to_string().trim_matches('"').to_string())
                .as_deref(),
            Some("1"),
            "{name}: {mapping}"
        );
    }
    timed("a (slices)", started);
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn b_full_pcpus_only_claim_gets_both_threads_of_one_core() {
    let kernel = vm_node();
    let started = Instant::now();
    let (mut node, all, shared) = node_with_shared_pod(NodeOptions {
        allocation_policy: Some("full-pcpus-only".into()),
        ..Default::default()
    })
    .await;
    node.wait_cpus(&shared, &all)
        .await
        .must("shared on every CPU");

    let (claim, _pod, id) =
        claim_pod_on(&mut node, "whole-core", Some(&numa_device(0)), 2, None).await;
    let first = claim.cpus.first().must_some("a claimed CPU");
    assert_eq!(
        Some(&claim.cpus),
        kernel.siblings.get(&first),
        "a 2-CPU full-pcpus-only claim is one core's threads (kernel siblings of {first})"
    );
    node.wait_cpus(&id, &claim.cpus)
        .await
        .must("the claim container on the core");
    node.wait_cpus(&shared, &all.difference(&claim.cpus))
        .await
        .must("the shared container loses exactly those two");
    timed("b (full-pcpus-only)", started);
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn c_claim_on_the_second_numa_node_with_aligned_memory() {
    let kernel = vm_node();
    let started = Instant::now();
    let second = kernel.second_numa_node();
    let second_cpus = kernel.numa[&second].clone();
    let (mut node, all, shared) = node_with_shared_pod(NodeOptions {
        mixed_allocation_mode: true,
        align_memory: true,
        ..Default::default()
    })
    .await;

    let (exclusive, _pod, exclusive_id) =
        claim_pod_on(&mut node, "exclusive", Some(&numa_device(second)), 2, None).await;
    assert!(
        exclusive.cpus.is_subset(&second_cpus),
        "a claim on {} got {}, not CPUs of NUMA node {second} ({second_cpus})",
        numa_device(second),
        exclusive.cpus
    );
    let pinned = node
        .wait_cpus(&exclusive_id, &exclusive.cpus)
        .await
        .must("the exclusive container on its claim");
    assert_eq!(
        pinned.cgroup.mems,
        std::iter::once(second).collect::<CpuSet>(),
        "--align-memory: cpuset.mems of the exclusive container is its claim's node"
    );

    let (mixed, _pod, mixed_id) =
        claim_pod_on(&mut node, "mixed", Some(&numa_device(second)), 1, Some(250)).await;
    assert!(mixed.cpus.is_subset(&second_cpus));
    let pool = all.difference(&exclusive.cpus).difference(&mixed.cpus);
    let now = node
        .wait_cpus(&mixed_id, &mixed.cpus.union(&pool))
        .await
        .must("the mixed container on its claim and the shared pool");
    let want_mems = kernel.numa_of(&mixed.cpus.union(&pool));
    assert_eq!(
        now.cgroup.mems, want_mems,
        "a mixed container's cpuset.mems covers its claim's node and the shared pool's nodes"
    );
    node.wait_cpus(&shared, &pool)
        .await
        .must("the shared container on the shared pool");
    timed("c (NUMA node and memory)", started);
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn d_distribute_across_numa_spreads_four_cpus_evenly() {
    let kernel = vm_node();
    let started = Instant::now();
    // Spreading needs a device that spans the NUMA nodes: the machine's.
    // The policy spreads over the fewest NUMA nodes that can hold the
    // request (as kubelet's distribute-cpus-across-numa does), so with the
    // first CPU of every node reserved no single node holds 4 CPUs.
    let reserved: CpuSet = kernel.numa.values().filter_map(CpuSet::first).collect();
    let largest = kernel
        .numa
        .values()
        .map(|cpus| cpus.difference(&reserved).len())
        .max()
        .unwrap_or(0);
    assert!(
        largest < 4 && largest * kernel.numa.len() >= 4,
        "a shape where 4 CPUs need every NUMA node: {kernel:?}"
    );
    let (mut node, all, shared) = node_with_shared_pod(NodeOptions {
        allocation_policy: Some("distribute-across-numa".into()),
        group_by: Some("machine".into()),
        reserved_cpus: reserved.to_cpulist(),
        ..Default::default()
    })
    .await;
    let (claim, _pod, id) = claim_pod_on(&mut node, "spread", Some("cpudevmachine"), 4, None).await;
    let per_node: Vec<(u32, usize)> = kernel
        .numa
        .iter()
        .map(|(n, cpus)| (*n, cpus.intersection(&claim.cpus).len()))
        .collect();
    eprintln!(
        "distribute-across-numa 4 CPUs: {} per node {per_node:?}",
        claim.cpus
    );
    assert!(
        per_node
            .iter()
            .all(|(_, count)| *count == 4 / kernel.numa.len()),
        "4 CPUs split evenly over the NUMA nodes, got {} ({per_node:?})",
        claim.cpus
    );
    node.wait_cpus(&id, &claim.cpus).await.must("claim pinned");
    node.wait_cpus(&shared, &all.difference(&claim.cpus))
        .await
        .must("shared shrinks");
    timed("d (distribute-across-numa)", started);
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn e_three_claims_across_both_nodes_with_reserved_cpus() {
    let kernel = vm_node();
    let started = Instant::now();
    // The first CPU of each NUMA node is reserved.
    let reserved: CpuSet = kernel.numa.values().filter_map(CpuSet::first).collect();
    let (mut node, all, shared) = node_with_shared_pod(NodeOptions {
        mixed_allocation_mode: true,
        reserved_cpus: reserved.to_cpulist(),
        ..Default::default()
    })
    .await;
    assert!(all.is_disjoint(&reserved));
    node.wait_cpus(&shared, &all)
        .await
        .must("shared on every CPU but the reserved");
    let (mixed_claim, _mixed_pod, mixed) =
        claim_pod_on(&mut node, "mixed", Some(&numa_device(0)), 1, Some(250)).await;
    let mut held = mixed_claim.cpus.clone();
    let follow = |held: &CpuSet| all.difference(held);
    node.wait_cpus(&shared, &follow(&held))
        .await
        .must("shared after the mixed claim");
    node.wait_cpus(&mixed, &mixed_claim.cpus.union(&follow(&held)))
        .await
        .must("mixed after its claim");

    let numa_ids: Vec<u32> = kernel.numa.keys().copied().collect();
    let mut claims = Vec::new();
    for (i, numa) in [numa_ids[0], numa_ids[1], numa_ids[1]].iter().enumerate() {
        let (claim, pod, id) = claim_pod_on(
            &mut node,
            &format!("claim-{i}"),
            Some(&numa_device(*numa)),
            1,
            None,
        )
        .await;
        assert!(
            claim.cpus.is_subset(&kernel.numa[numa]) && claim.cpus.is_disjoint(&reserved),
            "claim {i} on node {numa} got {}",
            claim.cpus
        );
        assert!(claim.cpus.is_disjoint(&held), "claim {i}: no CPU twice");
        held = held.union(&claim.cpus);
        node.wait_cpus(&id, &claim.cpus).await.must("claim pinned");
        node.wait_cpus(&shared, &follow(&held))
            .await
            .must(&format!("shared after claim {i}"));
        node.wait_cpus(&mixed, &mixed_claim.cpus.union(&follow(&held)))
            .await
            .must(&format!("mixed after claim {i}"));
        claims.push((claim, pod, id));
    }

    // Claims of every CPU left but one, node by node: each is prepared and
    // pinned, and the shared and mixed containers follow down to that one.
    let last: CpuSet = follow(&held).iter().last().into_iter().collect();
    for (i, numa) in numa_ids.iter().enumerate() {
        let left = follow(&held)
            .intersection(&kernel.numa[numa])
            .difference(&last);
        if left.is_empty() {
            continue;
        }
        let (claim, _pod, id) = claim_pod_on(
            &mut node,
            &format!("taker-{i}"),
            Some(&numa_device(*numa)),
            u32::try_from(left.len()).must("count"),
            None,
        )
        .await;
        assert_eq!(claim.cpus, left, "the claim takes node {numa}'s CPUs left");
        held = held.union(&claim.cpus);
        eprintln!(
            "claim of node {numa}'s CPUs {}: shared pool now {:?}",
            claim.cpus,
            follow(&held).to_cpulist()
        );
        node.wait_cpus(&id, &claim.cpus).await.must("taker pinned");
        node.wait_cpus(&shared, &follow(&held))
            .await
            .must("shared on what is left");
        node.wait_cpus(&mixed, &mixed_claim.cpus.union(&follow(&held)))
            .await
            .must("mixed on its claim and what is left");
        claims.push((claim, _pod, id));
    }
    assert_eq!(follow(&held), last, "one shared CPU left");

    // The claim of that last CPU is refused at prepare (the shared pool
    // keeps --min-shared-cpus, default 1), with its reason, and nothing
    // running changes.
    let numa = numa_ids
        .iter()
        .find(|n| !kernel.numa[*n].is_disjoint(&last))
        .ok_or("no NUMA node holds it")
        .must("the NUMA node of the last CPU");
    let late = PodIdentity::new("late");
    let late_claim = node
        .allocate_claim_on("late-cpu", &numa_device(*numa), 1, &late)
        .must("allocating the claim of the last CPU");
    let error = match node.prepare(&late_claim).await {
        Ok(prepared) => panic!("the last shared CPU was handed out: {}", prepared.cpus),
        Err(e) => e.to_string(),
    };
    eprintln!("the claim of the last shared CPU {last}: {error}");
    assert!(
        error.contains("in the shared pool") && error.contains("--min-shared-cpus"),
        "the refusal names the floor: {error}"
    );
    node.wait_cpus(&shared, &last)
        .await
        .must("the shared container keeps the last CPU");
    node.wait_cpus(&mixed, &mixed_claim.cpus.union(&last))
        .await
        .must("mixed keeps its claim and the last CPU");
    for (claim, _pod, id) in &claims {
        node.wait_cpus(id, &claim.cpus)
            .await
            .must("claim containers keep their CPUs");
    }
    timed("e (three claims, reserved CPUs)", started);
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn f_kill_9_of_each_process_and_a_containerd_restart() {
    let kernel = vm_node();
    let started = Instant::now();
    let (mut node, all, shared) = node_with_shared_pod(NodeOptions {
        mixed_allocation_mode: true,
        ..Default::default()
    })
    .await;
    let second = kernel.second_numa_node();
    let (a, _pa, a_id) = claim_pod_on(&mut node, "excl", Some(&numa_device(second)), 2, None).await;
    let (m, _pm, m_id) =
        claim_pod_on(&mut node, "mixed", Some(&numa_device(0)), 1, Some(250)).await;
    let pool = all.difference(&a.cpus).difference(&m.cpus);
    for step in [
        "start",
        "dra-plugin kill -9",
        "nri-plugin kill -9",
        "containerd restart",
    ] {
        let t = Instant::now();
        match step {
            "dra-plugin kill -9" => node.restart_dra_plugin().await.must(step),
            "nri-plugin kill -9" => node.restart_nri_plugin().await.must(step),
            "containerd restart" => node.restart_containerd().await.must(step),
            _ => {}
        }
        node.wait_cpus(&a_id, &a.cpus).await.must(step);
        node.wait_cpus(&m_id, &m.cpus.union(&pool)).await.must(step);
        node.wait_cpus(&shared, &pool).await.must(step);
        eprintln!(
            "after {step}: every cpuset right in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    assert!(a.cpus.is_subset(&kernel.numa[&second]));
    timed("f (kill -9 and containerd restart)", started);
}

/// A host daemon stand-in: a busy loop in a cgroup of the host
/// (`system.slice`, made here when missing: the VM node has no systemd).
/// Killed, and the cgroup removed if it was made here, on drop.
struct BusyHostProcess {
    child: std::process::Child,
    cgroup: PathBuf,
    made: bool,
}

impl BusyHostProcess {
    fn start(cgroup: &Path) -> Self {
        let made = !cgroup.exists();
        if made {
            std::fs::create_dir(cgroup).must("making the host cgroup");
        }
        let child = std::process::Command::new("nice")
            .args(["-n", "19", "sh", "-c", "while :; do :; done"])
            .spawn()
            .must("starting the busy loop");
        let me = BusyHostProcess {
            child,
            cgroup: cgroup.to_path_buf(),
            made,
        };
        std::fs::write(me.cgroup.join("cgroup.procs"), me.child.id().to_string())
            .must("moving the busy loop into the host cgroup");
        me
    }

    fn status_field(&self, field: &str) -> String {
        let status = read(&format!("/proc/{}/status", self.child.id()));
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {field} in the busy loop's status"))
    }

    /// `Cpus_allowed_list` of the process.
    fn allowed(&self) -> CpuSet {
        let list = self.status_field("Cpus_allowed_list:");
        CpuSet::parse_cpulist(&list).must("Cpus_allowed_list")
    }

    /// The CPU it last ran on (`/proc/PID/stat` field 39).
    fn last_cpu(&self) -> u32 {
        let stat = read(&format!("/proc/{}/stat", self.child.id()));
        // Fields after the command name, which ends at the last ')'.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        after
            .split_whitespace()
            .nth(36)
            .and_then(|f| f.parse().ok())
            .must_some("the processor field of /proc/PID/stat")
    }

    fn effective(&self) -> CpuSet {
        cpulist(&self.cgroup.join("cpuset.cpus.effective").to_string_lossy())
    }

    fn requested(&self) -> String {
        read(&self.cgroup.join("cpuset.cpus").to_string_lossy())
    }

    /// Waits until the process may run on exactly `want` (and its cgroup's
    /// effective CPUs say the same); the time it took.
    async fn wait_allowed(&self, want: &CpuSet, what: &str) -> Duration {
        let started = Instant::now();
        loop {
            let (allowed, effective) = (self.allowed(), self.effective());
            if &allowed == want && &effective == want {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{what}: the host process may run on {allowed} (cgroup effective {effective}), want {want}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for BusyHostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.made {
            let _ = std::fs::remove_dir(&self.cgroup);
        }
    }
}

/// Position of the first log line matching `pick` in nri-plugin's log.
fn log_position(log: &str, pick: impl Fn(&Value) -> bool) -> Option<usize> {
    log_messages_with(log, "").iter().position(pick)
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn g_host_cgroups_leave_a_claims_cpus_before_its_container_starts() {
    let kernel = vm_node();
    let started = Instant::now();
    let online = kernel.online.clone();
    let second = kernel.second_numa_node();

    // The control: without --host-cgroups the host process keeps running
    // on a claim's CPUs. It starts once the node is up: under TCG a busy
    // vCPU slows the guest enough to miss kubelet's 1 s GetInfo.
    let mut node = node(NodeOptions::default()).await;
    let busy = BusyHostProcess::start(Path::new("/sys/fs/cgroup/system.slice"));
    let original = busy.requested();
    let (a, _pod_a, a_id) =
        claim_pod_on(&mut node, "control", Some(&numa_device(second)), 2, None).await;
    node.wait_cpus(&a_id, &a.cpus)
        .await
        .must("the claim container pinned");
    assert_eq!(
        busy.allowed(),
        online,
        "without --host-cgroups nothing moves it"
    );
    assert!(a.cpus.is_subset(&busy.allowed()));
    eprintln!(
        "control: claim {} pinned, the host process may still run on {}",
        a.cpus,
        busy.allowed()
    );

    // With it: at start, the host cgroup leaves the claim already prepared.
    node.stop_nri_plugin();
    node.start_nri_plugin_with_host_cgroups(&["system.slice"])
        .await
        .must("nri-plugin with --host-cgroups system.slice");
    let took = busy
        .wait_allowed(&online.difference(&a.cpus), "at nri-plugin's start")
        .await;
    eprintln!(
        "at start: host process off claim {} in {:.2} s",
        a.cpus,
        took.as_secs_f64()
    );

    // A claim prepared and its container created at once: when the
    // container has started, the host process has already left its CPUs,
    // read once, without waiting.
    let (b, pod_b, b_id) =
        claim_pod_on(&mut node, "exclusive", Some(&numa_device(0)), 2, None).await;
    let allowed_at_start = busy.allowed();
    let held = a.cpus.union(&b.cpus);
    assert_eq!(
        allowed_at_start,
        online.difference(&held),
        "right after the claim container {b_id} started, the host process may run on {allowed_at_start} (claims {held})"
    );
    assert_eq!(busy.effective(), online.difference(&held));
    node.wait_cpus(&b_id, &b.cpus).await.must("claim b pinned");
    // nri-plugin wrote the host cgroup before it answered the container's
    // CreateContainer.
    let log = node.nri_log();
    let want_list = online.difference(&held).to_cpulist();
    let written = log_position(&log, |v| {
        v.pointer("/fields/message").and_then(Value::as_str) == Some("host cgroup cpuset written")
            && v.pointer("/fields/cpus").and_then(Value::as_str) == Some(want_list.as_str())
    })
    .must_some("a host cgroup write without both claims' CPUs in nri-plugin's log");
    let placed = log_position(&log, |v| {
        v.pointer("/fields/message").and_then(Value::as_str) == Some("container placed")
            && v.pointer("/span/container").and_then(Value::as_str) == Some(b_id.as_str())
    })
    .must_some("the claim container's placement in nri-plugin's log");
    assert!(
        written < placed,
        "host cgroup written (line {written}) before the container was placed (line {placed})"
    );
    // The busy loop runs, and the scheduler moved it off the claims.
    let moved = Instant::now();
    while held.contains(busy.last_cpu()) {
        assert!(
            moved.elapsed() < Duration::from_secs(5),
            "the host process still runs on CPU {}",
            busy.last_cpu()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Pod deleted and claim unprepared: the host process comes back.
    node.delete_pod(&pod_b).await.must("deleting the claim pod");
    node.unprepare(&b.claim).await.must("unpreparing claim b");
    let took = busy
        .wait_allowed(&online.difference(&a.cpus), "after the unprepare")
        .await;
    eprintln!(
        "after unprepare: host process back on {} in {:.2} s",
        b.cpus,
        took.as_secs_f64()
    );

    // A clean stop gives the cgroup its own value back.
    node.stop_nri_plugin();
    let restored = busy.requested();
    assert!(
        restored == original || restored == online.to_cpulist(),
        "cpuset.cpus restored to {original:?} (or, where the kernel refuses to empty it while it holds processes, every CPU of its parent): {restored:?}"
    );
    eprintln!("after SIGTERM: cpuset.cpus {restored:?} (was {original:?})");
    busy.wait_allowed(&online, "after nri-plugin stopped").await;

    // Killed with the option on, started with it removed: the next start
    // restores what the last run managed.
    node.start_nri_plugin_with_host_cgroups(&["system.slice"])
        .await
        .must("nri-plugin with --host-cgroups again");
    busy.wait_allowed(&online.difference(&a.cpus), "on again")
        .await;
    node.kill_nri_plugin();
    assert_eq!(
        busy.allowed(),
        online.difference(&a.cpus),
        "kill -9 restores nothing"
    );
    node.start_nri_plugin_with_host_cgroups(&[])
        .await
        .must("nri-plugin without --host-cgroups");
    let restored = busy.requested();
    assert!(
        restored == original || restored == online.to_cpulist(),
        "restored at the start without the option: {restored:?}"
    );
    busy.wait_allowed(&online, "option removed").await;
    timed("g (host cgroups)", started);
}

/// Checks the kernel holds what a claim on `cpus` asking `irqs: isolate` and
/// `idle: {maxLatencyMicroseconds: 0}` should give, against `before`.
fn assert_tuned(before: &KernelTuning, cpus: &CpuSet, step: &str) {
    let online: CpuSet = before.idle_latency.keys().copied().collect();
    let now = KernelTuning::read(&online).must("the kernel's tuning");
    let left = now.movable_irqs_on(cpus);
    assert!(
        left.is_empty(),
        "{step}: interrupts {left:?} still target the claim's CPUs {cpus}: {:?}",
        now.irq_affinity
    );
    assert!(
        now.default_irq_affinity.is_disjoint(cpus),
        "{step}: new interrupts may target {}",
        now.default_irq_affinity
    );
    for cpu in cpus.iter() {
        if before.idle_latency.get(&cpu).is_some_and(Option::is_some) {
            assert_eq!(
                std::fs::read_to_string(idle_latency_path(cpu))
                    .ok()
                    .as_deref()
                    .map(str::trim),
                Some("n/a"),
                "{step}: CPU {cpu} may still idle"
            );
        }
    }
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn h_tuning_reaches_the_kernel_and_is_put_back_after_unprepare_and_crashes() {
    let kernel = vm_node();
    let started = Instant::now();
    let before = KernelTuning::read(&kernel.online).must("the kernel's tuning");
    let has_idle_bound = before.idle_latency.values().all(Option::is_some);
    let has_cpufreq = Path::new("/sys/devices/system/cpu/cpu0/cpufreq").exists();
    eprintln!(
        "kernel: {} interrupts, default affinity {}, idle bounds {}, cpufreq {}",
        before.irq_affinity.len(),
        before.default_irq_affinity,
        has_idle_bound,
        has_cpufreq
    );
    let (mut node, _all, _shared) = node_with_shared_pod(NodeOptions {
        low_latency_tuning: true,
        ..Default::default()
    })
    .await;

    // The devices say what the node honours.
    let slices = node.wait_slices().await.must("slices");
    for device in devices(&slices) {
        let attribute = |name: &str| {
            device
                .pointer(&format!("/attributes/dra.cpu~1{name}"))
                .cloned()
        };
        assert_eq!(
            attribute("irqIsolation"),
            Some(serde_json::json!({"bool": true})),
            "{device}"
        );
        assert_eq!(
            attribute("idleLatencyControl"),
            Some(serde_json::json!({"bool": has_idle_bound})),
            "{device}"
        );
        assert_eq!(attribute("governors").is_some(), has_cpufreq, "{device}");
    }
    let second = kernel.second_numa_node();
    let tuning = serde_json::json!({
        "apiVersion": "v1alpha1",
        "tuning": {"irqs": "isolate", "idle": {"maxLatencyMicroseconds": 0}, "cfsQuota": "off"}
    });
    if !has_cpufreq {
        // What the node lacks is refused at prepare, by name, with nothing set.
        let pod = PodIdentity::new("governed");
        let claim = node
            .allocate_claim_with_parameters(
                "governed-cpu",
                &numa_device(second),
                1,
                &pod,
                serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"irqs": "isolate", "governor": "performance"}}),
            )
            .must("allocating the governed claim");
        let error = node
            .prepare(&claim)
            .await
            .expect_err("a governor without cpufreq")
            .to_string();
        assert!(
            error.contains("tuning.governor cannot be honoured on this node"),
            "{error}"
        );
        assert_eq!(
            KernelTuning::read(&kernel.online).must("the kernel's tuning"),
            before,
            "a refused claim changed the kernel"
        );
    }
    if !has_idle_bound {
        eprintln!(
            "this kernel has no per-CPU idle bound: the claim asks interrupts and CFS quota only"
        );
    }
    let tuning = if has_idle_bound {
        tuning
    } else {
        serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"irqs": "isolate", "cfsQuota": "off"}})
    };

    // Prepared: the kernel holds the tuning; the container runs without quota.
    let pod = PodIdentity::new("tuned");
    let claim = node
        .allocate_claim_with_parameters("tuned-cpu", &numa_device(second), 2, &pod, tuning.clone())
        .must("allocating the tuned claim");
    let prepared = node.prepare(&claim).await.must("preparing the tuned claim");
    let cpus = prepared.cpus.clone();
    assert_tuned(&before, &cpus, "after prepare");
    let moved = KernelTuning::read(&kernel.online)
        .must("the kernel's tuning")
        .moved_since(&before);
    assert!(moved > 0, "no interrupt moved for the claim");
    let spec =
        dra_cpu_tests::cri::spec::ContainerSpec::sleeper("app").with_cpu(Some(2000), Some(2000));
    let (running, id) = node
        .start_claim_container(&pod, &prepared, spec)
        .await
        .must("the tuned container on its CPUs");
    let pid = node.cri.container_pid(&id).await.must("pid");
    assert_eq!(
        dra_cpu_tests::cgroup::weight::cfs_quota_of(pid).must("quota"),
        None,
        "the container of a claim asking cfsQuota off has a quota"
    );

    // kill -9 of either process changes nothing; a rewrite is repaired.
    node.restart_nri_plugin().await.must("nri-plugin kill -9");
    node.restart_dra_plugin().await.must("dra-plugin kill -9");
    assert_tuned(&before, &cpus, "after kill -9 of both");
    let rewritten = before
        .irq_affinity
        .keys()
        .copied()
        .find(|irq| {
            std::fs::write(
                format!("/proc/irq/{irq}/smp_affinity_list"),
                kernel.online.to_cpulist(),
            )
            .is_ok()
        })
        .must_some("an interrupt anybody may move");
    let repaired = Instant::now();
    loop {
        let affinity = cpulist(&format!("/proc/irq/{rewritten}/smp_affinity_list"));
        if affinity.is_disjoint(&cpus) {
            break;
        }
        assert!(
            repaired.elapsed() < Duration::from_secs(30),
            "interrupt {rewritten} moved back onto {cpus} and left there: {affinity}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "interrupt {rewritten} rewritten onto the claim's CPUs: repaired in {:.1} s",
        repaired.elapsed().as_secs_f64()
    );

    // Unprepared: everything is back.
    node.delete_pod(&running)
        .await
        .must("deleting the tuned pod");
    node.unprepare(&claim)
        .await
        .must("unpreparing the tuned claim");
    assert_eq!(
        KernelTuning::read(&kernel.online).must("the kernel's tuning"),
        before,
        "after unprepare"
    );

    // A crash between the store commit of an unprepare and putting the
    // tuning back: the next start puts it back.
    let pod = PodIdentity::new("crashed");
    let claim = node
        .allocate_claim_with_parameters("crashed-cpu", &numa_device(second), 2, &pod, tuning)
        .must("allocating the second tuned claim");
    let prepared = node.prepare(&claim).await.must("preparing it");
    assert_tuned(&before, &prepared.cpus, "second claim prepared");
    node.arm_dra_crash_point(Some("unprepare-after-store-commit"));
    node.restart_dra_plugin()
        .await
        .must("dra-plugin with the crash point armed");
    let answer = node.unprepare(&claim).await;
    assert!(
        answer.is_err(),
        "the unprepare was answered: the crash point did not fire"
    );
    node.wait_dra_plugin_exit()
        .await
        .must("dra-plugin crashing at its crash point");
    node.arm_dra_crash_point(None);
    assert_tuned(
        &before,
        &prepared.cpus,
        "crashed before putting the tuning back",
    );
    node.start_dra_plugin()
        .await
        .must("dra-plugin after the crash");
    assert_eq!(
        KernelTuning::read(&kernel.online).must("the kernel's tuning"),
        before,
        "after the restart that follows the crash"
    );
    timed("h (tuning)", started);
}

/// `Option` to a value, or a test failure naming what was missing.
trait MustSome<T> {
    fn must_some(self, what: &str) -> T;
}

impl<T> MustSome<T> for Option<T> {
    fn must_some(self, what: &str) -> T {
        self.unwrap_or_else(|| panic!("no {what}"))
    }
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup's `cpuset.cpus.exclusive`, or `None` where it has none (gone,
/// or no cpuset).
fn exclusive_of(dir: &Path) -> Option<CpuSet> {
    let text = std::fs::read_to_string(dir.join("cpuset.cpus.exclusive")).ok()?;
    Some(CpuSet::parse_cpulist(text.trim()).must("cpuset.cpus.exclusive"))
}

/// The root's `cpuset.cpus.isolated`: every CPU in an isolated partition.
fn root_isolated() -> CpuSet {
    cpulist(&format!("{CGROUP_ROOT}/cpuset.cpus.isolated"))
}

/// The ancestors of a cgroup below the root, outermost first.
fn ancestors_below_root(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = dir
        .ancestors()
        .skip(1)
        .take_while(|p| *p != Path::new(CGROUP_ROOT))
        .map(Path::to_path_buf)
        .collect();
    out.reverse();
    out
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn i_load_balancing_off_makes_an_isolated_partition_and_gives_it_back() {
    let kernel = vm_node();
    let started = Instant::now();
    let isolated_before = root_isolated();
    // Every cgroup of the pods' tree there is now, with its exclusive CPUs.
    let tree_before: BTreeMap<PathBuf, Option<CpuSet>> = std::fs::read_dir(CGROUP_ROOT)
        .must("reading the cgroup root")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let exclusive = exclusive_of(&p);
            (p, exclusive)
        })
        .collect();
    let (mut node, _all, shared) = node_with_shared_pod(NodeOptions {
        low_latency_tuning: true,
        ..Default::default()
    })
    .await;
    let slices = node.wait_slices().await.must("slices");
    for device in devices(&slices) {
        assert_eq!(
            device
                .pointer("/attributes/dra.cpu~1isolatedPartition")
                .cloned(),
            Some(serde_json::json!({"bool": true})),
            "cgroup v2 on Linux 6.12 offers isolated partitions: {device}"
        );
    }

    let second = kernel.second_numa_node();
    let pod = PodIdentity::new("isolated");
    let claim = node
        .allocate_claim_with_parameters(
            "isolated-cpu",
            &numa_device(second),
            2,
            &pod,
            serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"loadBalancing": "off"}}),
        )
        .must("allocating the isolated claim");
    let prepared = node
        .prepare(&claim)
        .await
        .must("preparing the isolated claim");
    let cpus = prepared.cpus.clone();
    let spec =
        dra_cpu_tests::cri::spec::ContainerSpec::sleeper("app").with_cpu(Some(2000), Some(2000));
    let (running, id) = node
        .start_claim_container(&pod, &prepared, spec)
        .await
        .must("the isolated container on its CPUs");
    let pid = node.cri.container_pid(&id).await.must("pid");
    let cgroup =
        dra_cpu_tests::cgroup::hierarchy::cpuset_dir_of(pid).must("the container's cgroup");
    let ancestors = ancestors_below_root(&cgroup);
    let check_isolated = |step: &str| {
        let partition = read(&cgroup.join("cpuset.cpus.partition").to_string_lossy());
        let isolated = root_isolated();
        let effective = cpulist(&cgroup.join("cpuset.cpus.effective").to_string_lossy());
        eprintln!(
            "{step}: {} cpuset.cpus.partition {partition:?}, effective {effective}; root cpuset.cpus.isolated {isolated}; ancestors' exclusive {:?}",
            cgroup.display(),
            ancestors
                .iter()
                .map(|a| (a.display().to_string(), exclusive_of(a).map(|c| c.to_cpulist())))
                .collect::<Vec<_>>()
        );
        assert_eq!(partition, "isolated", "{step}");
        assert_eq!(effective, cpus, "{step}");
        assert!(
            cpus.is_subset(&isolated),
            "{step}: root isolates {isolated}, want {cpus} in it"
        );
        assert_eq!(
            isolated.difference(&isolated_before),
            cpus,
            "{step}: only the claim's CPUs are newly isolated"
        );
        for a in &ancestors {
            assert!(
                exclusive_of(a).is_some_and(|e| cpus.is_subset(&e)),
                "{step}: {} does not hold the claim's CPUs as exclusive",
                a.display()
            );
        }
    };
    check_isolated("started");
    // The shared pool never had those CPUs; it still runs.
    node.wait_cpus(&shared, &kernel.online.difference(&cpus))
        .await
        .must("the shared pod");

    // kill -9 of nri-plugin changes nothing.
    node.restart_nri_plugin().await.must("nri-plugin kill -9");
    check_isolated("after nri-plugin kill -9");

    // Deleted and unprepared: the partition and the ancestors' exclusive
    // CPUs are as before.
    node.delete_pod(&running)
        .await
        .must("deleting the isolated pod");
    node.unprepare(&claim)
        .await
        .must("unpreparing the isolated claim");
    let isolated_after = root_isolated();
    eprintln!("after delete and unprepare: root cpuset.cpus.isolated {isolated_after:?} (before {isolated_before:?})");
    assert_eq!(isolated_after, isolated_before, "root cpuset.cpus.isolated");
    for a in &ancestors {
        let now = exclusive_of(a);
        let before = tree_before.get(a).cloned().flatten();
        eprintln!(
            "after delete and unprepare: {} exclusive {:?} (before {:?})",
            a.display(),
            now.as_ref().map(CpuSet::to_cpulist),
            before.as_ref().map(CpuSet::to_cpulist)
        );
        if now.is_some() {
            assert_eq!(
                now.unwrap_or_default(),
                before.unwrap_or_default(),
                "{}: cpuset.cpus.exclusive",
                a.display()
            );
        }
    }

    // A partition the kernel refuses: another cgroup holds the claim's CPUs
    // as exclusive. The start fails naming the file, and nothing is left.
    let pod = PodIdentity::new("blocked");
    let claim = node
        .allocate_claim_with_parameters(
            "blocked-cpu",
            &numa_device(second),
            2,
            &pod,
            serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"loadBalancing": "off"}}),
        )
        .must("allocating the blocked claim");
    let prepared = node.prepare(&claim).await.must("preparing it");
    let blocker = Path::new(CGROUP_ROOT).join("dra-cpu-test-blocker");
    std::fs::create_dir_all(&blocker).must("making the blocking cgroup");
    std::fs::write(
        blocker.join("cpuset.cpus.exclusive"),
        prepared.cpus.to_cpulist(),
    )
    .must("the blocking cgroup takes the claim's CPUs");
    let kubepods_before = ancestors.first().and_then(|a| exclusive_of(a));
    let spec = dra_cpu_tests::cri::spec::ContainerSpec::sleeper("app")
        .with_cdi_device(&prepared.cdi_device)
        .with_cpu(Some(2000), Some(2000));
    let sandbox = node
        .cri
        .run_pod(&pod.name, dra_cpu_tests::node::NAMESPACE, &pod.uid)
        .await
        .must("the blocked pod's sandbox");
    let refused = node.cri.run_container(&sandbox, &spec).await;
    let error = match &refused {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    eprintln!("blocked: the start answered {error:?}");
    assert!(
        error.contains("tuning.loadBalancing off") && error.contains("cpuset.cpus.exclusive"),
        "the start of a container whose partition the kernel refuses: {error:?}"
    );
    assert_eq!(
        root_isolated(),
        isolated_before,
        "a refused partition isolated CPUs"
    );
    assert_eq!(
        ancestors.first().and_then(|a| exclusive_of(a)),
        kubepods_before,
        "a refused partition left exclusive CPUs behind"
    );
    std::fs::remove_dir(&blocker).must("removing the blocking cgroup");
    node.cri
        .delete_pod(&sandbox.id)
        .await
        .must("deleting the blocked pod");
    node.unprepare(&claim)
        .await
        .must("unpreparing the blocked claim");

    // A container started while nri-plugin was away gets its partition once
    // nri-plugin is back and knows its claim asks for one, and gives it back
    // at its stop. dra-plugin is held (SIGSTOP) while nri-plugin starts, so
    // the runtime's Synchronize comes first and nri-plugin knows the claim
    // from its CDI spec alone, which carries no tuning: the partition is
    // made when dra-plugin's snapshot arrives.
    let pod = PodIdentity::new("late");
    let claim = node
        .allocate_claim_with_parameters(
            "late-cpu",
            &numa_device(second),
            2,
            &pod,
            serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"loadBalancing": "off"}}),
        )
        .must("allocating the late claim");
    let prepared = node.prepare(&claim).await.must("preparing it");
    node.kill_nri_plugin();
    let spec = dra_cpu_tests::cri::spec::ContainerSpec::sleeper("app")
        .with_cdi_device(&prepared.cdi_device)
        .with_cpu(Some(2000), Some(2000));
    let running = node
        .start_pod(&pod, &[spec])
        .await
        .must("starting the late pod without nri-plugin");
    let id = running.id("app").to_string();
    let pid = node.cri.container_pid(&id).await.must("pid");
    let cgroup =
        dra_cpu_tests::cgroup::hierarchy::cpuset_dir_of(pid).must("the late container's cgroup");
    let partition_file = cgroup.join("cpuset.cpus.partition");
    assert_eq!(
        read(&partition_file.to_string_lossy()),
        "member",
        "no partition without nri-plugin"
    );
    let held = node.hold_dra_plugin().await.must("holding dra-plugin");
    let held_since = Instant::now();
    let synchronized_before =
        log_messages_with(&node.nri_log(), "synchronized with the runtime").len();
    let log_from = node.nri_log().len();
    let back = node.start_nri_plugin_unsubscribed().await;
    // Registered is not yet synchronized: wait for the runtime's Synchronize.
    while log_messages_with(&node.nri_log(), "synchronized with the runtime").len()
        == synchronized_before
    {
        assert!(
            held_since.elapsed() < Duration::from_secs(60),
            "no Synchronize while dra-plugin was held; nri-plugin said:\n{}",
            &node.nri_log()[log_from..]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let partition_while_held = read(&partition_file.to_string_lossy());
    eprintln!(
        "late: nri-plugin registered while dra-plugin was held (stopped: {}); partition {partition_while_held:?}",
        held.is_stopped()
    );
    held.release();
    let released = Instant::now();
    back.must("nri-plugin back, registered with NRI");
    assert_eq!(
        partition_while_held, "member",
        "no partition while nri-plugin knows the claim from its CDI spec alone"
    );
    node.wait_nri_ready(true)
        .await
        .must("nri-plugin subscribed to dra-plugin");
    node.wait_cpus(&id, &prepared.cpus)
        .await
        .must("the late container on its CPUs");
    let waited = Instant::now();
    loop {
        let partition = read(&partition_file.to_string_lossy());
        if partition == "isolated" {
            break;
        }
        if waited.elapsed() > Duration::from_secs(20) {
            let said: Vec<String> = node
                .nri_log()
                .lines()
                .filter(|l| l.contains("partition") || l.contains("ynchroniz"))
                .map(str::to_string)
                .collect();
            panic!(
                "the late container's partition reads {partition:?}; nri-plugin said:\n{}",
                said.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for line in node.nri_log()[log_from..].lines() {
        eprintln!("late: nri-plugin: {line}");
    }
    let isolated = root_isolated();
    eprintln!(
        "late: {} cpuset.cpus.partition isolated {:.1} s after dra-plugin was released; root cpuset.cpus.isolated {isolated}",
        cgroup.display(),
        released.elapsed().as_secs_f64()
    );
    assert_eq!(isolated.difference(&isolated_before), prepared.cpus, "late");
    node.delete_pod(&running)
        .await
        .must("deleting the late pod");
    node.unprepare(&claim)
        .await
        .must("unpreparing the late claim");
    assert_eq!(root_isolated(), isolated_before, "after the late pod");
    assert_eq!(
        ancestors.first().and_then(|a| exclusive_of(a)),
        kubepods_before,
        "after the late pod: the outermost ancestor's exclusive CPUs"
    );

    // A container removed while nri-plugin is down takes its partition
    // with its cgroup, but its CPUs stay in the ancestors' exclusive CPUs:
    // nothing remembers them. The next nri-plugin's Synchronize sweeps
    // them out. The CPUs read back in `kubepods` while nri-plugin is away
    // are the control: without the sweep they stay.
    let pod = PodIdentity::new("gone");
    let claim = node
        .allocate_claim_with_parameters(
            "gone-cpu",
            &numa_device(second),
            2,
            &pod,
            serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"loadBalancing": "off"}}),
        )
        .must("allocating the gone claim");
    let prepared = node.prepare(&claim).await.must("preparing it");
    let spec =
        dra_cpu_tests::cri::spec::ContainerSpec::sleeper("app").with_cpu(Some(2000), Some(2000));
    let (running, _id) = node
        .start_claim_container(&pod, &prepared, spec)
        .await
        .must("the gone pod's container on its CPUs");
    assert_eq!(
        root_isolated().difference(&isolated_before),
        prepared.cpus,
        "gone: isolated"
    );
    node.kill_nri_plugin();
    node.delete_pod(&running)
        .await
        .must("deleting the gone pod while nri-plugin is down");
    let left = ancestors.first().and_then(|a| exclusive_of(a));
    eprintln!("gone: kubepods' exclusive CPUs with nri-plugin down: {left:?}");
    assert!(
        left.as_ref()
            .is_some_and(|left| prepared.cpus.is_subset(left)),
        "gone: the removed partition's CPUs are left in kubepods ({left:?})"
    );
    assert_eq!(
        root_isolated(),
        isolated_before,
        "gone: the partition went with its cgroup"
    );
    let back = Instant::now();
    node.start_nri_plugin().await.must("nri-plugin back");
    loop {
        let now = ancestors.first().and_then(|a| exclusive_of(a));
        if now == kubepods_before {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "gone: kubepods' exclusive CPUs still {now:?}, want {kubepods_before:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "gone: kubepods' exclusive CPUs swept {:.1} s after nri-plugin was started",
        back.elapsed().as_secs_f64()
    );
    node.unprepare(&claim)
        .await
        .must("unpreparing the gone claim");
    timed("i (isolated partition)", started);
}

/// Brings a CPU taken offline by a test back online, whatever the test's
/// end.
struct Offline(u32);

impl Offline {
    fn take(cpu: u32) -> Offline {
        std::fs::write(format!("/sys/devices/system/cpu/cpu{cpu}/online"), "0")
            .must("taking the CPU offline");
        Offline(cpu)
    }
}

impl Drop for Offline {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/sys/devices/system/cpu/cpu{}/online", self.0), "1");
    }
}

/// Waits until the health stream holds `want` for every device it named.
async fn wait_health(
    watch: &dra_cpu_tests::kubelet_dra::health::HealthWatch,
    step: &str,
    want: impl Fn(&str, &DeviceHealthState) -> bool,
) {
    let started = Instant::now();
    loop {
        let states = watch.states();
        if !states.is_empty() && states.iter().all(|((_, device), s)| want(device, s)) {
            eprintln!(
                "{step}: after {:.1} s {states:?}",
                started.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40) && watch.is_open(),
            "{step}: the health stream holds {states:?} (open: {})",
            watch.is_open()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until nri-plugin's shared pool has `want` CPUs (its gauge): the
/// node's change has reached its view, so a container created next is
/// planned from it.
async fn wait_nri_pool_size(node: &Node, want: usize, step: &str) {
    let started = Instant::now();
    loop {
        let size = node.nri_metrics().await.and_then(|m| {
            dra_cpu_tests::node::read_back::metric_value(&m, "nri_plugin_shared_pool_cpus")
        });
        if size == Some(want as f64) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "{step}: nri-plugin's shared pool has {size:?} CPUs, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A CPU of the real kernel taken offline turns the devices holding it
/// Unhealthy on kubelet's health stream, naming it, while the others stay
/// Healthy and a claim's container on the other NUMA node keeps its CPUs;
/// the shared pool leaves it: running shared containers are moved off it
/// and a shared container started meanwhile never gets it. Back online,
/// every device is Healthy again and the shared pool has it again.
#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn k_an_offline_cpu_turns_its_devices_unhealthy_until_it_is_back() {
    let kernel = vm_node();
    let started = Instant::now();
    let (mut node, _all, shared) = node_with_shared_pod(NodeOptions::default()).await;
    let slices = node.wait_slices().await.must("slices");
    let watch = node
        .watch_health(KubeletRelease::V1_37)
        .await
        .must("the health stream")
        .expect("a 1.37 kubelet opens the v1 health stream");
    wait_health(&watch, "online", |_, s| *s == DeviceHealthState::Healthy).await;

    // A claim; the last CPU of a NUMA node it is not on goes.
    let pod = PodIdentity::new("steady");
    let claim = node
        .allocate_claim("steady-cpu", 2, &pod)
        .must("allocating the claim");
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    let spec =
        dra_cpu_tests::cri::spec::ContainerSpec::sleeper("app").with_cpu(Some(2000), Some(2000));
    let (_running, id) = node
        .start_claim_container(&pod, &prepared, spec)
        .await
        .must("the claim container on its CPUs");
    let (numa, cpu) = kernel
        .numa
        .iter()
        .find(|(_, cpus)| cpus.is_disjoint(&prepared.cpus))
        .and_then(|(numa, cpus)| Some((*numa, cpus.iter().last()?)))
        .must_some("a NUMA node without the claim's CPUs");
    // The devices holding it: its NUMA node's grouped device and, where
    // devices are published per CPU too, its own.
    let holders = [numa_device(numa), format!("cpudev{cpu:03}")];
    assert!(
        devices(&slices)
            .iter()
            .any(|d| d.get("name").and_then(Value::as_str) == Some(holders[0].as_str())),
        "{} is published",
        holders[0]
    );
    let offline = Offline::take(cpu);
    let message = format!("CPUs {cpu} of this device are offline");
    wait_health(&watch, &format!("CPU {cpu} offline"), |device, s| {
        if holders.iter().any(|h| h == device) {
            *s == DeviceHealthState::Unhealthy {
                message: message.clone(),
            }
        } else {
            *s == DeviceHealthState::Healthy
        }
    })
    .await;
    node.wait_cpus(&id, &prepared.cpus)
        .await
        .must("the claim container keeps its CPUs");
    // The shared pool without the offline CPU: a shared pod started now gets
    // it (on cgroup v1 the kernel would refuse a cpuset naming the CPU), and
    // the running one is moved (at once where the runtime takes unsolicited
    // updates, at the new pod's creation otherwise).
    let pool = kernel.online.difference(&prepared.cpus);
    let without: CpuSet = pool.iter().filter(|&c| c != cpu).collect();
    wait_nri_pool_size(&node, without.len(), "CPU offline").await;
    let (_later, later) = shared_pod(&mut node, "later", 500).await;
    node.wait_cpus(&later, &without)
        .await
        .must("a shared pod started while the CPU is offline");
    node.wait_cpus(&shared, &without)
        .await
        .must("the running shared pod, moved off the offline CPU");
    drop(offline);
    wait_health(&watch, &format!("CPU {cpu} back"), |_, s| {
        *s == DeviceHealthState::Healthy
    })
    .await;
    wait_nri_pool_size(&node, pool.len(), "CPU back").await;
    // An event for runtimes that take pool changes only in their replies.
    let (_back, back) = shared_pod(&mut node, "back", 500).await;
    for (container, what) in [
        (&shared, "the first"),
        (&later, "the later"),
        (&back, "the new"),
    ] {
        node.wait_cpus(container, &pool)
            .await
            .must(&format!("{what} shared pod on the shared pool, CPU back"));
    }
    timed("k (offline CPU)", started);
}

/// Polls irqbalance until it bans exactly `want` (it shows a setting from
/// its next rescan on).
async fn wait_banned(daemon: &IrqBalance, want: &CpuSet, within: Duration, step: &str) {
    let started = Instant::now();
    loop {
        let banned = daemon.banned().must("irqbalance's setup");
        if banned == *want {
            eprintln!(
                "{step}: irqbalance bans {banned} after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            started.elapsed() < within,
            "{step}: irqbalance bans {banned}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
#[ignore = "runs inside the VM node: scripts/vm-node-tests.sh"]
async fn j_a_running_irqbalance_is_told_to_keep_off_a_claims_cpus_and_handed_back() {
    let kernel = vm_node();
    let started = Instant::now();
    let mut daemon = IrqBalance::start().must("irqbalance in the VM node");
    // A pass every second instead of ten, so settings show sooner. It takes
    // effect at a pass that is not a rescan: a daemon told `settings cpus`
    // before then shows it only after its first (10 s) pass.
    daemon
        .request("settings sleep 1")
        .must("irqbalance's sleep");
    let own = daemon.banned().must("irqbalance's own banned CPUs");
    let (mut node, _all, _shared) = node_with_shared_pod(NodeOptions {
        low_latency_tuning: true,
        ..Default::default()
    })
    .await;
    let second = kernel.second_numa_node();
    let pod = PodIdentity::new("quiet");
    let claim = node
        .allocate_claim_with_parameters(
            "quiet-cpu",
            &numa_device(second),
            2,
            &pod,
            serde_json::json!({"apiVersion": "v1alpha1", "tuning": {"irqs": "isolate"}}),
        )
        .must("allocating the claim");
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    let cpus = prepared.cpus.clone();
    // The control: on its own, irqbalance may put interrupts on them.
    assert!(
        own.is_disjoint(&cpus),
        "irqbalance banned the claim's CPUs {cpus} by itself ({own}): nothing here shows dra-plugin told it"
    );
    let told = own.union(&cpus);
    wait_banned(&daemon, &told, Duration::from_secs(30), "prepared").await;
    // Its own passes leave the claim's CPUs alone from then on.
    for _ in 0..12 {
        let left = KernelTuning::read(&kernel.online)
            .must("the kernel's tuning")
            .movable_irqs_on(&cpus);
        assert!(
            left.is_empty(),
            "interrupts {left:?} on the claim's CPUs {cpus} while irqbalance runs"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // dra-plugin killed: irqbalance keeps what it was told.
    node.restart_dra_plugin().await.must("dra-plugin kill -9");
    wait_banned(
        &daemon,
        &told,
        Duration::from_secs(5),
        "after kill -9 of dra-plugin",
    )
    .await;

    // irqbalance restarted: the new one knows nothing of it, and is told
    // within a repair period (10 s), shown after its next pass.
    drop(daemon);
    daemon = IrqBalance::start().must("irqbalance again");
    daemon
        .request("settings sleep 1")
        .must("irqbalance's sleep");
    eprintln!("irqbalance restarted as {}", daemon.name());
    wait_banned(
        &daemon,
        &told,
        Duration::from_secs(40),
        "irqbalance restarted",
    )
    .await;

    // Unprepared: handed back to its own configuration.
    node.unprepare(&claim).await.must("unpreparing the claim");
    wait_banned(&daemon, &own, Duration::from_secs(30), "unprepared").await;
    timed("j (irqbalance)", started);
}
