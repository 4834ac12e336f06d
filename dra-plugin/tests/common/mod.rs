//! A node for dra-plugin tests: the daemon's real `run` loop on real Unix
//! sockets in a temporary directory, its real sled store and CDI directory,
//! a sysfs fixture for the topology, the fake API server for claims and
//! slices, and the kubelet DRA stand-in registering and calling it.

#![allow(dead_code)]

use dra_cpu_tests::apiserver::FakeApiServer;
use dra_cpu_tests::claims::AllocatedClaim;
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra};
use dra_plugin::config::{Config, DeviceMode, GroupBy, Settings};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const NODE: &str = "node-a";
pub const DRIVER: &str = "dra.cpu";
/// Two sockets, four NUMA nodes of 32 CPUs, siblings N and N+64.
pub const FIXTURE: &str = "intel-2s-snc2-ht-128";
/// Generous bound for things that happen in milliseconds; only a hung
/// daemon gets near it.
pub const WAIT: Duration = Duration::from_secs(20);

pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("DRA_CPU_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/sysfs"),
    }
}

/// One allocation result: driver, pool, device, consumed CPUs.
pub type RawResult = (String, String, String, Option<String>);

pub struct Node {
    pub dir: tempfile::TempDir,
    pub api: FakeApiServer,
    pub config: Config,
    pub topology: Topology,
}

fn unpack(name: &str, into: &Path) {
    let archive = fixtures_dir().join(format!("{name}.tar.gz"));
    let file = std::fs::File::open(&archive)
        .unwrap_or_else(|e| panic!("opening fixture {}: {e}", archive.display()));
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(into)
        .unwrap_or_else(|e| panic!("unpacking {}: {e}", archive.display()));
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
        unpack(FIXTURE, &sysfs);
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
                    ..Default::default()
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

/// A 2-socket machine, one NUMA node and one L3 each, 8 cores of 2 threads
/// per socket: 32 CPUs, core N has threads N and N+16.
pub fn two_socket_topology() -> Topology {
    shared_state::topology::synthetic::build(&shared_state::topology::synthetic::Shape {
        sockets: 2,
        numa_per_socket: 1,
        l3_per_numa: 1,
        cores_per_l3: 8,
        threads_per_core: 2,
        sibling_numbering: shared_state::topology::synthetic::SiblingNumbering::Split,
    })
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
