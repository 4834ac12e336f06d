//! Rows measured inside this process on the product's own code: the
//! allocation at prepare time (row 6) and nri-plugin's CreateContainer and
//! Synchronize handling (rows 3 and 7c), on synthetic topologies.

use super::{summarize, Goal, Row};
use dra_cpu_nri::client::NriUpdater;
use dra_cpu_nri::plugin::NriPlugin;
use dra_cpu_proto::nri::api::{
    Container, CreateContainerResponse, LinuxCPU, LinuxContainer, LinuxResources, OptionalUInt64,
    PodSandbox,
};
use dra_plugin::devices::DeviceCatalog;
use dra_plugin::devices::{DeviceMode, GroupBy};
use dra_plugin::prepare::{resolve_cpus, ClaimRef, HeldCpus, ParsedClaim};
use nri_plugin::config::UnsolicitedUpdates;
use nri_plugin::enforcer::Enforcer;
use nri_plugin::metrics::Metrics;
use nri_plugin::nri::DraCpuPlugin;
use nri_plugin::resolve::{ClaimResolver, Resolution};
use nri_plugin::view::NodeView;
use protobuf::Message;
use shared_state::alloc::{Allocator, Policy};
use shared_state::topology::synthetic::{build, MACHINE_1024, MACHINE_512};
use shared_state::topology::Topology;
use shared_state::NodeSnapshot;
use shared_state::{AllocatedDevice, ClaimAssignment, CpuSet};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 2 sockets × 2 NUMA × 4 L3 × 32 cores × 2 threads = 1024 CPUs.
pub fn machine_1024() -> Topology {
    build(&MACHINE_1024)
}

/// 2 sockets × 2 NUMA × 2 L3 × 32 cores × 2 threads = 512 CPUs.
pub fn machine_512() -> Topology {
    build(&MACHINE_512)
}

/// A Kubernetes-shaped UID numbered `n` in family `family` (one hex digit).
pub fn uid(family: char, n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-00000000000{family}")
}

fn claim_ref(n: u32) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{n}"),
        uid: uid('c', n),
    }
}

fn grouped_device(device: &str, cpus: u32) -> AllocatedDevice {
    AllocatedDevice {
        request: "cpus".into(),
        pool: "node-a".into(),
        device: device.into(),
        consumed_cpus: Some(cpus),
        share_id: None,
    }
}

/// The claims of a node half full of grouped claims of mixed sizes, spread
/// over the NUMA nodes in turn, as dra-plugin itself would have chosen them.
fn half_full_node(
    catalog: &DeviceCatalog,
    allocator: &Allocator,
    numa_nodes: usize,
) -> Result<BTreeMap<String, CpuSet>, String> {
    let target = catalog.allocatable().len() / 2;
    let sizes = [1u32, 2, 3, 4, 8, 16];
    let mut held: BTreeMap<String, CpuSet> = BTreeMap::new();
    let mut taken = 0usize;
    let mut n = 0u32;
    while taken < target {
        let size = sizes[n as usize % sizes.len()];
        let numa = (n as usize / sizes.len()) % numa_nodes;
        let parsed = ParsedClaim {
            devices: vec![grouped_device(&format!("cpudevnuma{numa:03}"), size)],
            consumer_pods: vec![uid('p', n)],
            pod_claim_name: None,
        };
        let claim = claim_ref(n);
        let others = HeldCpus::of_map(&claim.uid, &held);
        let cpus = resolve_cpus(&claim, &parsed, catalog, allocator, &others, Policy::Packed)
            .map_err(|e| format!("filling the node: {e}"))?;
        taken += cpus.len();
        held.insert(claim.uid, cpus);
        n += 1;
    }
    Ok(held)
}

/// The trivial baseline: the `count` lowest free CPUs of `group`.
fn lowest_ids(group: &CpuSet, held: &BTreeMap<String, CpuSet>, count: usize) -> CpuSet {
    let mut taken = CpuSet::new();
    for cpus in held.values() {
        taken = taken.union(cpus);
    }
    group.difference(&taken).iter().take(count).collect()
}

fn time_each<T>(samples: usize, mut f: impl FnMut() -> T) -> Vec<Duration> {
    (0..samples)
        .map(|_| {
            let started = Instant::now();
            black_box(f());
            started.elapsed()
        })
        .collect()
}

/// Row 6: the grouped-mode pick and the individual-mode resolve of an
/// 8-CPU claim on a half-full 1024-CPU node, through dra-plugin's
/// `resolve_cpus` (the code NodePrepareResources runs), against the lowest
/// free ids.
pub fn allocation_rows(samples: usize) -> Vec<Row> {
    let goal = Goal::AtMost(Duration::from_micros(20));
    let topology = machine_1024();
    let allocator = Allocator::new(&topology);
    let none = CpuSet::new();
    let mut rows = Vec::new();

    let grouped = match DeviceCatalog::new(&topology, &none, DeviceMode::Grouped, GroupBy::Numanode)
    {
        Ok(c) => c,
        Err(e) => {
            return vec![Row::not_measured(
                "6",
                "allocation",
                goal,
                format!("grouped catalog: {e}"),
            )]
        }
    };
    let numa_nodes = topology.numa_nodes().len();
    let held = match half_full_node(&grouped, &allocator, numa_nodes) {
        Ok(h) => h,
        Err(e) => return vec![Row::not_measured("6", "allocation", goal, e)],
    };
    let numa0 = topology.cpus_in_numa(0);
    let claim = claim_ref(1_000_000);
    let parsed = ParsedClaim {
        devices: vec![grouped_device("cpudevnuma000", 8)],
        consumer_pods: vec![uid('p', 1_000_000)],
        pod_claim_name: None,
    };
    // The pick must give CPUs, or the timing measures an error path.
    // What the driver does per prepare: fold the other claims' CPUs, pick.
    let pick = || {
        let others = HeldCpus::of_map(&claim.uid, &held);
        resolve_cpus(
            &claim,
            &parsed,
            &grouped,
            &allocator,
            &others,
            Policy::Packed,
        )
    };
    match pick() {
        Ok(cpus) if cpus.len() == 8 && cpus.is_subset(&numa0) => {
            let measured = time_each(samples, pick);
            let baseline = time_each(samples, || lowest_ids(&numa0, &held, 8));
            rows.push(timed_row(
                "6a",
                &format!(
                    "grouped pick: 8 CPUs in NUMA 0 of 1024 CPUs, node half full ({} claims)",
                    held.len()
                ),
                goal,
                &measured,
                &baseline,
            ));
        }
        other => rows.push(Row::not_measured(
            "6a",
            "grouped pick",
            goal,
            format!("the pick did not give 8 CPUs of NUMA 0: {other:?}"),
        )),
    }

    let individual =
        match DeviceCatalog::new(&topology, &none, DeviceMode::Individual, GroupBy::Numanode) {
            Ok(c) => c,
            Err(e) => {
                rows.push(Row::not_measured(
                    "6b",
                    "individual resolve",
                    goal,
                    format!("individual catalog: {e}"),
                ));
                return rows;
            }
        };
    // The same occupancy; the claim names 8 free devices of NUMA 0.
    let mut taken = CpuSet::new();
    for cpus in held.values() {
        taken = taken.union(cpus);
    }
    let names: Vec<String> = individual
        .devices()
        .filter(|(_, cpus)| cpus.is_subset(&numa0) && cpus.is_disjoint(&taken))
        .take(8)
        .map(|(name, _)| name.to_string())
        .collect();
    let parsed = ParsedClaim {
        devices: names
            .iter()
            .map(|name| AllocatedDevice {
                request: "cpus".into(),
                pool: "node-a".into(),
                device: name.clone(),
                consumed_cpus: None,
                share_id: None,
            })
            .collect(),
        consumer_pods: vec![uid('p', 1_000_000)],
        pod_claim_name: None,
    };
    let resolve = || {
        let others = HeldCpus::of_map(&claim.uid, &held);
        resolve_cpus(
            &claim,
            &parsed,
            &individual,
            &allocator,
            &others,
            Policy::Packed,
        )
    };
    // Checked once, then timed.
    match resolve() {
        Ok(cpus) if cpus.len() == 8 => {
            let measured = time_each(samples, resolve);
            let baseline = time_each(samples, || lowest_ids(&numa0, &held, 8));
            rows.push(timed_row(
                "6b",
                "individual resolve: 8 named devices of 1024, node half full",
                goal,
                &measured,
                &baseline,
            ));
        }
        other => rows.push(Row::not_measured(
            "6b",
            "individual resolve",
            goal,
            format!("the resolve did not give 8 CPUs: {other:?}"),
        )),
    }
    rows
}

fn timed_row(
    id: &str,
    what: &str,
    goal: Goal,
    measured: &[Duration],
    baseline: &[Duration],
) -> Row {
    match (summarize(measured), summarize(baseline)) {
        (Some(m), Some(b)) => Row::timed(
            id,
            what,
            goal,
            &m,
            Some(("lowest free ids", &b)),
            m.median,
            false,
        ),
        _ => Row::not_measured(id, what, goal, "no samples"),
    }
}

/// Never asked: every claim of the benchmark is in the view already.
struct KnownClaimsOnly;

#[async_trait::async_trait]
impl ClaimResolver for KnownClaimsOnly {
    async fn resolve(&self, _claim_uid: &str) -> Resolution {
        Resolution::NotPrepared { revision: u64::MAX }
    }
}

fn shares(value: u64) -> LinuxResources {
    let mut s = OptionalUInt64::new();
    s.value = value;
    let mut cpu = LinuxCPU::new();
    cpu.shares = Some(s).into();
    let mut r = LinuxResources::new();
    r.cpu = Some(cpu).into();
    r
}

fn pod(n: u32) -> PodSandbox {
    let mut p = PodSandbox::new();
    p.id = format!("sandbox-{n}");
    p.uid = uid('p', n);
    p.name = format!("pod-{n}");
    p.namespace = "default".into();
    p
}

fn container(n: u32, env: Vec<String>, cpu_shares: u64) -> Container {
    let mut c = Container::new();
    c.id = format!("ctr-{n:05}");
    c.pod_sandbox_id = format!("sandbox-{n}");
    c.name = "app".into();
    c.env = env;
    let mut linux = LinuxContainer::new();
    linux.resources = Some(shares(cpu_shares)).into();
    c.linux = Some(linux).into();
    c
}

fn claim_env(claim: &ClaimAssignment) -> Vec<String> {
    vec![
        "PATH=/usr/bin".into(),
        format!("DRA_CPUSET_{}={}", claim.claim_uid, claim.cpus.to_cpulist()),
    ]
}

fn assignment(n: u32, cpus: CpuSet) -> ClaimAssignment {
    ClaimAssignment {
        claim_uid: uid('c', n),
        namespace: "default".into(),
        name: format!("claim-{n}"),
        consumer_pods: vec![uid('p', n)],
        devices: vec![grouped_device("cpudevnuma000", cpus.len() as u32)],
        cpus,
        prepared_at_unix_ms: 0,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

/// The node of row 3: 512 CPUs, 100 prepared claims of 2 CPUs, and 500
/// running containers: one per claim, 400 on the shared pool.
struct NriNode {
    topology: Topology,
    claims: Vec<ClaimAssignment>,
    pods: Vec<PodSandbox>,
    containers: Vec<Container>,
}

const CLAIMS: u32 = 100;
const CONTAINERS: u32 = 500;

fn nri_node() -> NriNode {
    let topology = machine_512();
    let online: Vec<u32> = topology.online().iter().collect();
    // Two CPUs per claim, from the top of the machine down, so the shared
    // pool is the low CPUs.
    let claims: Vec<ClaimAssignment> = (0..CLAIMS)
        .map(|n| {
            let hi = online.len() - 1 - 2 * n as usize;
            assignment(n, [online[hi], online[hi - 1]].into_iter().collect())
        })
        .collect();
    let mut pods = Vec::new();
    let mut containers = Vec::new();
    for n in 0..CONTAINERS {
        pods.push(pod(n));
        match claims.get(n as usize) {
            Some(claim) => containers.push(container(n, claim_env(claim), 2)),
            None => containers.push(container(n, vec!["PATH=/usr/bin".into()], 102)),
        }
    }
    NriNode {
        topology,
        claims,
        pods,
        containers,
    }
}

/// A fresh nri-plugin that has applied dra-plugin's snapshot of `node`, as
/// after it subscribes; the error says why the snapshot was refused.
async fn plugin_for(node: &NriNode) -> Result<(Arc<Enforcer>, DraCpuPlugin), String> {
    let view = NodeView::new(node.topology.online(), CpuSet::new(), false, None);
    let enforcer = Arc::new(Enforcer::new(
        view,
        Arc::new(Metrics::new()),
        NriUpdater::new(),
        UnsolicitedUpdates::Never,
    ));
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(KnownClaimsOnly));
    enforcer
        .apply_snapshot(snapshot(node))
        .await
        .map_err(|e| format!("snapshot: {e}"))?;
    Ok((enforcer, plugin))
}

fn snapshot(node: &NriNode) -> NodeSnapshot {
    NodeSnapshot {
        revision: 1,
        allocatable: node.topology.online(),
        reserved: CpuSet::new(),
        mixed_allocation_mode: false,
        claims: node.claims.clone(),
    }
}

/// The reply bytes as they go on the wire.
fn encode(reply: dra_cpu_nri::plugin::ContainerCreation) -> Result<Vec<u8>, String> {
    let mut rsp = CreateContainerResponse::new();
    rsp.adjust = reply.adjust.into();
    rsp.update = reply.update;
    rsp.evict = reply.evict;
    rsp.write_to_bytes().map_err(|e| e.to_string())
}

/// Row 3 (CreateContainer of a claim container right after its claim was
/// prepared: its cpuset plus the shrink of all 400 shared containers in the
/// reply) and row 7c (Synchronize of 500 containers into a fresh plugin),
/// through nri-plugin's own `NriPlugin` implementation, encoding included.
pub async fn nri_rows(create_samples: usize, sync_samples: usize) -> Vec<Row> {
    let node = nri_node();
    let create_goal = Goal::AtMost(Duration::from_micros(200));
    let what = "CreateContainer in nri-plugin's handler (512 CPUs, 500 containers, 100 claims), reply with 400 shared-pool updates, encoded";
    let sync_what = "nri-plugin Synchronize of 500 containers (handler, in process), 500 updates";
    let create_not_measured = |why: String| vec![Row::not_measured("3", what, create_goal, why)];

    // Synchronize: a fresh plugin each time, containers reported unpinned.
    let mut sync_times = Vec::new();
    let mut sync_updates = 0usize;
    for _ in 0..sync_samples {
        let (_, plugin) = match plugin_for(&node).await {
            Ok(plugin) => plugin,
            Err(why) => return create_not_measured(why),
        };
        let pods = node.pods.clone();
        let containers = node.containers.clone();
        let started = Instant::now();
        let result = plugin.synchronize(pods, containers).await;
        sync_times.push(started.elapsed());
        match result {
            Ok(updates) => sync_updates = updates.len(),
            Err(e) => {
                return vec![Row::not_measured(
                    "7c",
                    sync_what,
                    Goal::None,
                    format!("{e:?}"),
                )]
            }
        }
    }

    let (enforcer, plugin) = match plugin_for(&node).await {
        Ok(plugin) => plugin,
        Err(why) => return create_not_measured(why),
    };
    if let Err(e) = plugin
        .synchronize(node.pods.clone(), node.containers.clone())
        .await
    {
        return create_not_measured(format!("sync: {e:?}"));
    }
    // A claim taken from the shared pool, prepared and then created, again
    // and again; between samples it is unprepared and the pool given back.
    let free = enforcer.view().pool().shared();
    let free: Vec<u32> = free.iter().collect();
    let new_cpus: CpuSet = free.iter().rev().take(2).copied().collect();
    let mut revision = 1u64;
    let mut times = Vec::new();
    let mut updates_in_reply = 0usize;
    let mut reply_bytes = 0usize;
    for i in 0..create_samples {
        let n = 10_000 + i as u32;
        let claim = assignment(n, new_cpus.clone());
        revision += 1;
        if let Err(e) = enforcer.apply_prepared(revision, claim.clone()).await {
            return create_not_measured(format!("prepared: {e}"));
        }
        let pod = pod(n);
        let created = container(n, claim_env(&claim), 2);
        let started = Instant::now();
        let reply = plugin.create_container(pod.clone(), created.clone()).await;
        let encoded = reply.map_err(|e| format!("{e:?}")).and_then(|r| {
            updates_in_reply = r.update.len();
            encode(r)
        });
        times.push(started.elapsed());
        match encoded {
            Ok(bytes) => reply_bytes = bytes.len(),
            Err(e) => return create_not_measured(e),
        }
        if plugin.remove_container(pod, created).await.is_err() {
            return create_not_measured("remove failed".into());
        }
        revision += 1;
        if let Err(e) = enforcer.apply_unprepared(revision, &claim.claim_uid).await {
            return create_not_measured(format!("unprepared: {e}"));
        }
        let mut view = enforcer.view();
        let pending = view.pending_updates();
        view.mark_applied(&pending);
    }
    let mut rows = Vec::new();
    match summarize(&times) {
        Some(s) if updates_in_reply == (CONTAINERS - CLAIMS) as usize => {
            let mut row = Row::timed("3", what, create_goal, &s, None, s.p99, true);
            row.baseline = format!(
                "{} updates, {} reply bytes; goal on p99",
                updates_in_reply, reply_bytes
            );
            rows.push(row);
        }
        _ => rows.push(Row::not_measured(
            "3",
            what,
            create_goal,
            format!(
                "the reply carried {updates_in_reply} updates, expected {}",
                CONTAINERS - CLAIMS
            ),
        )),
    }
    rows.push(sync_row(sync_what, &sync_times, sync_updates));
    rows
}

fn sync_row(what: &str, times: &[Duration], updates: usize) -> Row {
    match summarize(times) {
        Some(s) => {
            let mut row = Row::timed("7c", what, Goal::None, &s, None, s.median, true);
            row.baseline = format!("{updates} updates in the reply");
            row
        }
        None => Row::not_measured("7c", what, Goal::None, "no samples"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_machines_have_their_sizes() {
        assert_eq!(machine_1024().online().len(), 1024);
        assert_eq!(machine_512().online().len(), 512);
    }

    #[test]
    fn the_nri_node_has_100_disjoint_claims_and_500_containers() {
        let node = nri_node();
        assert_eq!(node.claims.len(), 100);
        assert_eq!(node.containers.len(), 500);
        let mut all = CpuSet::new();
        for c in &node.claims {
            assert_eq!(c.cpus.len(), 2);
            assert!(all.is_disjoint(&c.cpus));
            all = all.union(&c.cpus);
        }
        let with_claim = node
            .containers
            .iter()
            .filter(|c| c.env.iter().any(|e| e.starts_with("DRA_CPUSET_")))
            .count();
        assert_eq!(with_claim, 100);
    }

    #[test]
    fn lowest_ids_skips_held_cpus() {
        let group: CpuSet = (0..8).collect();
        let held: BTreeMap<String, CpuSet> =
            [("a".to_string(), [0u32, 2].into_iter().collect())].into();
        let got = lowest_ids(&group, &held, 3);
        assert_eq!(got, [1u32, 3, 4].into_iter().collect());
    }

    #[tokio::test]
    async fn nri_rows_measure_a_reply_with_every_shared_update() {
        let rows = nri_rows(3, 1).await;
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0].id, "3");
        assert!(rows[0].baseline.starts_with("400 updates"), "{rows:?}");
        assert!(rows[1].baseline.starts_with("500 updates"), "{rows:?}");
    }

    #[test]
    fn allocation_rows_pick_and_resolve() {
        let rows = allocation_rows(3);
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec!["6a", "6b"], "{rows:?}");
        for row in &rows {
            assert!(row.ratio.is_some(), "{row:?}");
        }
    }
}
