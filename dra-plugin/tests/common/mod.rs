//! A node for dra-plugin tests: the daemon's real `run` loop on real Unix
//! sockets in a temporary directory, its real sled store and CDI directory,
//! a generated sysfs tree for the topology, the fake API server for claims and
//! slices, and the kubelet DRA stand-in registering and calling it.

#![allow(dead_code)]

pub mod checked_store;

use dra_cpu_tests::apiserver::FakeApiServer;
use dra_cpu_tests::claims::AllocatedClaim;
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra, PrepareOutcome};
use dra_plugin::config::Config;
use dra_plugin::devices::{DeviceMode, GroupBy};
use dra_plugin::settings::Settings;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use shared_state::topology::{sysfs_tree, Topology};
use shared_state::CpuSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const NODE: &str = "node-a";
pub const DRIVER: &str = "dra.cpu";
/// Two sockets, four NUMA nodes of 32 CPUs, siblings N and N+64.
pub const FIXTURE: &str = "intel-2s-snc2-ht-128";
/// The grouped devices of [`FIXTURE`], one per NUMA node, in order.
pub const FIXTURE_NUMA_DEVICES: [&str; 4] = [
    "cpudevnuma000",
    "cpudevnuma001",
    "cpudevnuma002",
    "cpudevnuma003",
];
/// Generous bound for things that happen in milliseconds; only a hung
/// daemon gets near it.
pub const WAIT: Duration = Duration::from_secs(20);
/// Guards a wait on the API server against a hang only; never a measure of
/// speed (a publisher's retries back off for seconds).
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// One allocation result: driver, pool, device, consumed CPUs.
pub type RawResult = (String, String, String, Option<String>);

pub struct Node {
    pub dir: tempfile::TempDir,
    pub api: FakeApiServer,
    pub config: Config,
    pub topology: Topology,
}

/// Write the sysfs tree of the named machine `name` (one of
/// [`sysfs_tree::NAMED`]) into `into`.
pub fn write_tree(name: &str, into: &Path) {
    sysfs_tree::write_named(name, into)
        .unwrap_or_else(|e| panic!("writing the sysfs tree {name}: {e}"));
}

/// The sysfs tree of machine `name` in a fresh temporary directory, its
/// root (removed when the returned guard is dropped).
pub fn written_tree(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tree(name, dir.path());
    dir
}

/// `dra-plugin slices` for node `node-1` over the sysfs root `root`, with
/// `extra` flags and no environment to fall back on.
pub fn slices_output(root: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("slices")
        .arg("--sysfs-root")
        .arg(root)
        .args(["--node-name", "node-1"])
        .args(extra)
        .env_remove("HOST_ROOT")
        .env_remove("NODE_NAME")
        .output()
        .expect("running dra-plugin")
}

/// The ResourceSlices `dra-plugin slices` prints, which must succeed.
pub fn printed_slices(root: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let out = slices_output(root, extra);
    assert!(
        out.status.success(),
        "slices {extra:?}: exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).expect("JSON output") {
        serde_json::Value::Array(items) => items,
        other => panic!("expected a JSON list, got {other}"),
    }
}

impl Node {
    pub fn new(mode: DeviceMode) -> Node {
        Node::with(mode, |_| {})
    }

    /// A node whose settings `adjust` may change before they are resolved.
    pub fn with(mode: DeviceMode, adjust: impl FnOnce(&mut Settings)) -> Node {
        // Under /tmp so that socket paths stay far below 107 bytes.
        let dir = tempfile::Builder::new()
            .prefix("dcpu")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let sysfs = dir.path().join("sysfs");
        write_tree(FIXTURE, &sysfs);
        let topology = Topology::discover(&sysfs).expect("fixture topology");
        let api = FakeApiServer::start().expect("fake API server");
        api.insert_node(NODE).expect("node");
        let mut settings = Settings {
            node_name: Some(NODE.into()),
            kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
            kubelet_root_dir: Some(dir.path().join("kubelet")),
            state_dir: Some(dir.path().join("state")),
            cdi_dir: Some(dir.path().join("cdi")),
            sysfs_root: Some(sysfs),
            cpu_device_mode: Some(mode.into()),
            group_by: Some(GroupBy::Numanode),
            metrics_address: Some("127.0.0.1:0".parse().expect("addr")),
            ..Settings::default()
        };
        adjust(&mut settings);
        let config = settings.resolve(None).expect("config");
        Node {
            dir,
            api,
            config,
            topology,
        }
    }

    /// The `dra-plugin run` flags that put the daemon on this node: its
    /// name, API server, kubelet, state, CDI and sysfs directories.
    pub fn run_flags(&self) -> Vec<String> {
        let c = &self.config;
        let kubeconfig = c.kubeconfig.as_deref().expect("kubeconfig");
        vec![
            format!("--node-name={}", c.node_name),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--kubelet-root-dir={}", c.kubelet_root_dir.display()),
            format!("--state-dir={}", c.state_dir.display()),
            format!("--cdi-dir={}", c.cdi_dir.display()),
            format!("--sysfs-root={}", c.sysfs_root.display()),
        ]
    }

    /// The arguments of `dra-plugin run` on this node with grouped devices
    /// by NUMA node and metrics on a free port, then `extra`.
    pub fn grouped_run_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = vec!["run".to_string()];
        args.extend(self.run_flags());
        args.extend(
            [
                "--cpu-device-mode=grouped",
                "--group-by=numanode",
                "--metrics-address=127.0.0.1:0",
            ]
            .iter()
            .chain(extra)
            .map(|a| a.to_string()),
        );
        args
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.config.kubelet_root_dir.join("plugins_registry")
    }

    /// Start the daemon and register it through the kubelet stand-in.
    pub async fn start(&self, version: DraVersion) -> Running {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let config = self.config.clone();
        let task = tokio::spawn(dra_plugin::run::run(config, shutdown.clone()));
        // Dropped (the test ended early), it stops the daemon too.
        let stop = shutdown.drop_guard();
        let kubelet = match KubeletDra::register(&self.registry_dir(), DRIVER, version, WAIT).await
        {
            Ok(k) => k,
            Err(e) => {
                if task.is_finished() {
                    match task.await {
                        Ok(Err(run_error)) => panic!("daemon exited: {run_error:#}"),
                        other => panic!("daemon exited: {other:?}"),
                    }
                }
                panic!("registration: {e}");
            }
        };
        Running {
            stop: Some(stop),
            task: Some(task),
            kubelet,
        }
    }

    /// Create a claim allocated with `results` (device, consumed CPUs) from
    /// this node's pool, reserved for `pod_uid`. Returns the claim's uid.
    pub fn claim(&self, name: &str, results: &[(&str, Option<&str>)], pod_uid: &str) -> Claim {
        let results: Vec<RawResult> = results
            .iter()
            .map(|(device, cap)| {
                (
                    DRIVER.to_string(),
                    NODE.to_string(),
                    device.to_string(),
                    cap.map(str::to_string),
                )
            })
            .collect();
        self.claim_raw(name, Some(results), Some(pod_uid))
    }

    /// Create a claim with results given as (driver, pool, device, capacity).
    pub fn claim_raw(
        &self,
        name: &str,
        results: Option<Vec<RawResult>>,
        pod_uid: Option<&str>,
    ) -> Claim {
        self.claim_configured(name, results, pod_uid, None)
    }

    /// [`Node::claim_raw`], with one opaque config of this driver from the
    /// claim for all its requests, whose parameters are `parameters`.
    pub fn claim_configured(
        &self,
        name: &str,
        results: Option<Vec<RawResult>>,
        pod_uid: Option<&str>,
        parameters: Option<serde_json::Value>,
    ) -> Claim {
        let config = parameters.map(|parameters| {
            vec![DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: None,
                opaque: Some(OpaqueDeviceConfiguration {
                    driver: DRIVER.into(),
                    parameters: RawExtension(parameters),
                }),
            }]
        });
        let results = results.map(|rs| {
            rs.into_iter()
                .enumerate()
                .map(
                    |(i, (driver, pool, device, cap))| DeviceRequestAllocationResult {
                        request: format!("cpus{i}"),
                        driver,
                        pool,
                        device,
                        consumed_capacity: cap
                            .map(|q| [("dra.cpu/cpu".to_string(), Quantity(q))].into()),
                        ..Default::default()
                    },
                )
                .collect::<Vec<_>>()
        });
        let status = results.map(|results| ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config,
                }),
                ..Default::default()
            }),
            reserved_for: pod_uid.map(|uid| {
                vec![ResourceClaimConsumerReference {
                    api_group: None,
                    resource: "pods".into(),
                    name: format!("pod-{name}"),
                    uid: uid.into(),
                }]
            }),
            ..Default::default()
        });
        let claim = ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(ResourceClaimSpec::default()),
            status,
        };
        let created = self.api.insert_claim(claim).expect("insert claim");
        Claim {
            namespace: "default".into(),
            name: name.into(),
            uid: created.metadata.uid.expect("server-assigned uid"),
        }
    }

    /// The CPUs the claim's CDI spec on disk names.
    pub fn cdi_cpus(&self, claim_uid: &str) -> Option<CpuSet> {
        dra_plugin::cdi::CdiDir::new(&self.config.cdi_dir).read_cpus(claim_uid)
    }

    pub fn cdi_spec(&self, claim_uid: &str) -> Option<serde_json::Value> {
        let path = dra_plugin::cdi::CdiDir::new(&self.config.cdi_dir).spec_path(claim_uid);
        let text = std::fs::read(path).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

pub struct Running {
    stop: Option<tokio_util::sync::DropGuard>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub kubelet: KubeletDra,
}

impl Running {
    /// Stop the daemon gracefully and return how its run loop ended.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        // Dropping the guard cancels the daemon's shutdown token.
        drop(self.stop.take());
        match self.task.take() {
            Some(task) => match tokio::time::timeout(WAIT, task).await {
                Ok(Ok(result)) => result,
                Ok(Err(e)) => Err(anyhow::anyhow!("daemon task: {e}")),
                Err(_) => Err(anyhow::anyhow!("daemon did not stop within {WAIT:?}")),
            },
            None => Ok(()),
        }
    }
}

/// `count` claims `c<i>` of 2 CPUs each, spread in turn over the fixture's
/// four NUMA nodes, each for its own pod.
pub fn storm_claims(node: &Node, count: usize) -> Vec<Claim> {
    (0..count)
        .map(|i| {
            let device = format!("cpudevnuma{:03}", i % 4);
            node.claim(
                &format!("c{i}"),
                &[(&device, Some("2"))],
                &pod_uid(i as u32),
            )
        })
        .collect()
}

/// What a storm test knows of a claim from the calls kubelet saw answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Last acknowledged call was a prepare, which got these CPUs.
    Prepared(CpuSet),
    /// Last acknowledged call was an unprepare (or the claim is untouched).
    Unprepared,
    /// A prepare was sent and not answered: either outcome is allowed, and
    /// repeating it must succeed.
    PrepareInFlight,
    /// Likewise for an unprepare.
    UnprepareInFlight,
}

/// A fake pod UID.
pub fn pod_uid(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-000000000000")
}

/// The CPUs a prepared claim got, read from its CDI spec's device id answer.
pub fn cpus_of(node: &Node, claim: &Claim) -> CpuSet {
    node.cdi_cpus(&claim.uid)
        .unwrap_or_else(|| panic!("no CDI spec for claim {}", claim.uid))
}

/// The running daemon's state through its coordination socket.
pub async fn snapshot(node: &Node) -> dra_plugin::cli::inspect_state::StateReport {
    dra_plugin::cli::inspect_state::from_socket(&node.config.coordination_socket)
        .await
        .expect("snapshot from the coordination socket")
}

/// Kubelet's NodePrepareResources for one claim: `None` when the call did
/// not get through (the daemon died), else the CPUs of its CDI spec; a
/// refusal fails the test.
pub async fn prepare_one(kubelet: &KubeletDra, node: &Node, claim: &Claim) -> Option<CpuSet> {
    let answers = kubelet.prepare(std::slice::from_ref(claim)).await.ok()?;
    let outcome = answers.get(&claim.uid).expect("an answer for every claim");
    assert_eq!(outcome.error, "", "prepare of {} refused", claim.name);
    assert_eq!(outcome.devices.len(), 1, "{outcome:?}");
    Some(
        node.cdi_cpus(&claim.uid)
            .expect("a CDI spec after an acknowledged prepare"),
    )
}

/// Kubelet's NodePrepareResources for one claim, which must get through:
/// the claim's answer, granted or refused.
pub async fn prepare_answer(kubelet: &KubeletDra, claim: &Claim) -> PrepareOutcome {
    let mut answers = kubelet
        .prepare(std::slice::from_ref(claim))
        .await
        .unwrap_or_else(|e| panic!("prepare of {}: {e}", claim.name));
    answers
        .remove(&claim.uid)
        .unwrap_or_else(|| panic!("no answer for {}", claim.uid))
}

/// Kubelet's NodePrepareResources for one claim, which must be granted: its
/// answer.
pub async fn prepare_ok(kubelet: &KubeletDra, claim: &Claim) -> PrepareOutcome {
    let outcome = prepare_answer(kubelet, claim).await;
    assert_eq!(outcome.error, "", "prepare of {} refused", claim.name);
    outcome
}

/// Wait until `condition` holds; only a hang makes it fail.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(HANG_GUARD, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never happened: {what}");
}

/// Kubelet's NodeUnprepareResources for one claim: `None` when the call did
/// not get through; a refusal fails the test.
pub async fn unprepare_one(kubelet: &KubeletDra, claim: &Claim) -> Option<()> {
    let answers = kubelet.unprepare(std::slice::from_ref(claim)).await.ok()?;
    assert_eq!(
        answers.get(&claim.uid).map(String::as_str),
        Some(""),
        "unprepare of {}",
        claim.name
    );
    Some(())
}

/// Unprepare every claim of `claims`, each answered; then the daemon holds
/// no claim.
pub async fn unprepare_all(kubelet: &KubeletDra, node: &Node, claims: &[Claim]) {
    for claim in claims {
        unprepare_one(kubelet, claim)
            .await
            .expect("final unprepare");
    }
    let report = snapshot(node).await;
    assert!(report.claims.is_empty(), "{:?}", report.claims);
}

/// The ResourceClaim the scheduler leaves for `reference`: `cpus` CPUs of
/// grouped device `device` in pool `pool` for request `cpus`, reserved for
/// one pod, with `annotations` on the object.
pub fn allocated_claim_object(
    reference: &dra_plugin::prepare::ClaimRef,
    pool: &str,
    device: &str,
    cpus: u32,
    annotations: Option<std::collections::BTreeMap<String, String>>,
) -> ResourceClaim {
    AllocatedClaim::new(&reference.namespace, &reference.name, pool, device, cpus)
        .uid(&reference.uid)
        .annotations(annotations)
        .build()
}

/// Claim `c<n>` of namespace `default`, its uid made from `n`, and its
/// object: `cpus` CPUs of grouped device `device` in pool `pool`, reserved
/// for one pod.
pub fn numbered_claim(
    n: usize,
    pool: &str,
    device: &str,
    cpus: u32,
) -> (dra_plugin::prepare::ClaimRef, ResourceClaim) {
    let reference = dra_plugin::prepare::ClaimRef {
        namespace: "default".into(),
        name: format!("c{n}"),
        uid: format!("{n:08x}-0000-4000-8000-000000000000"),
    };
    let object = allocated_claim_object(&reference, pool, device, cpus, None);
    (reference, object)
}

/// A synthetic machine of `sockets` sockets, `numa_per_socket` NUMA nodes
/// each with one L3 of `cores_per_numa` cores of 2 threads, the siblings
/// numbered apart as on Intel servers (core N has threads N and N + cores).
pub fn smt2_topology(sockets: u32, numa_per_socket: u32, cores_per_numa: u32) -> Topology {
    use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
    build(&Shape {
        sockets,
        numa_per_socket,
        l3_per_numa: 1,
        cores_per_l3: cores_per_numa,
        threads_per_core: 2,
        sibling_numbering: SiblingNumbering::Split,
    })
}

/// A 2-socket machine, one NUMA node and one L3 each, 8 cores of 2 threads
/// per socket: 32 CPUs, core N has threads N and N+16.
pub fn two_socket_topology() -> Topology {
    smt2_topology(2, 1, 8)
}

/// The driver of the in-process tests: [`two_socket_topology`], one device
/// per NUMA node, the packed policy, no reserved CPUs, node `node`, and
/// `min_shared_cpus` left to the shared pool.
pub fn in_process_driver(
    store: std::sync::Arc<dyn shared_state::store::AssignmentStore>,
    cdi: dra_plugin::cdi::CdiDir,
    node: &str,
    min_shared_cpus: u32,
) -> std::sync::Arc<dra_plugin::driver::Driver> {
    let topo = two_socket_topology();
    let catalog = dra_plugin::devices::DeviceCatalog::new(
        &topo,
        &CpuSet::new(),
        DeviceMode::Grouped,
        GroupBy::Numanode,
    )
    .expect("catalog");
    let options = dra_plugin::driver::DriverOptions {
        driver_name: DRIVER.into(),
        node_name: node.into(),
        reserved: CpuSet::new(),
        policy: shared_state::alloc::Policy::Packed,
        mixed_allocation_mode: false,
        min_shared_cpus,
    };
    std::sync::Arc::new(
        dra_plugin::driver::Driver::open(
            options,
            catalog,
            &topo,
            store,
            cdi,
            std::sync::Arc::new(dra_plugin::metrics::Metrics::new()),
        )
        .expect("driver"),
    )
}

/// Cuts the machine's power from inside: sysrq b reboots at once, with no
/// sync and no unmount (only in the VM node).
pub fn cut_power() -> ! {
    // sysrq b: reboot at once, no sync, no unmount.
    if let Err(e) = std::fs::write("/proc/sysrq-trigger", "b") {
        panic!("cutting the power through /proc/sysrq-trigger: {e}");
    }
    std::thread::sleep(Duration::from_secs(30));
    panic!("still running 30 s after sysrq b");
}
