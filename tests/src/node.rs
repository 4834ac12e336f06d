//! A whole dra-cpu node for end-to-end tests and the demo: a private
//! containerd with NRI and CDI, the fake API server holding this Node and the
//! `dra.cpu` DeviceClass, `dra-plugin run` and `nri-plugin` as separate OS
//! processes started with their real flags, and the kubelet stand-ins (DRA
//! registration and prepare/unprepare, CRI pods and containers).
//!
//! Tests play the scheduler ([`Node::create_claim`] writes a ResourceClaim
//! with its allocation and reservation) and kubelet (prepare, then
//! RunPodSandbox and CreateContainer with the claim's CDI device). Every
//! cpuset is read back from the container's cgroup and from inside it.
//!
//! The binaries are found through `DRA_PLUGIN_BIN` / `NRI_PLUGIN_BIN`, else in
//! the workspace's `target/debug` or `target/release` (`cargo test
//! --workspace` builds them). Nodes of one test binary run one at a time: the
//! machine's CPUs are what every node allocates from.

use crate::apiserver::{FakeApiServer, FakeApiServerError, FakeApiServerOptions};
use crate::cgroup::{self, CgroupError, ContainerCpus};
use crate::containerd::{Containerd, ContainerdError, ContainerdOptions};
use crate::cri::{new_uid, ContainerSpec, CriClient, CriError, PodSandbox};
use crate::kubelet_dra::{
    cdi_ids_for_container, Claim, DraVersion, KubeletDra, KubeletDraError, RegistrySnapshot,
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::{json, Value};
use shared_state::CpuSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The driver name of the product (and of the DeviceClass).
pub const DRIVER_NAME: &str = "dra.cpu";
/// The grouped-mode device of NUMA node 0, the only one on this machine.
pub const GROUPED_DEVICE: &str = "cpudevnuma000";
/// The consumable capacity a grouped claim asks CPUs from.
pub use shared_state::assignment::CPU_CAPACITY;
/// The CDI kind dra-plugin writes claim specs under.
pub use shared_state::cdi_spec::CDI_KIND;
/// Namespace of the pods and claims of a node.
pub const NAMESPACE: &str = "default";
/// Environment variables naming the binaries to run.
pub const DRA_PLUGIN_BIN_ENV: &str = "DRA_PLUGIN_BIN";
pub const NRI_PLUGIN_BIN_ENV: &str = "NRI_PLUGIN_BIN";

/// How long a process or a cpuset may take to reach the state waited for.
/// Generous on purpose: two cores are shared by every build and test.
const SETTLE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

static ONE_NODE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "{what} binary not found (looked at {looked:?}); set ${env} or run `cargo build -p {what}`"
    )]
    NoBinary {
        what: &'static str,
        env: &'static str,
        looked: Vec<PathBuf>,
    },
    #[error("cannot create {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {bin}: {source}")]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} exited ({status}); log tail:\n{log_tail}")]
    Exited {
        what: &'static str,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error("{what} not ready after {waited:?}: {waiting_for}; log tail:\n{log_tail}")]
    NotReady {
        what: &'static str,
        waited: Duration,
        waiting_for: String,
        log_tail: String,
    },
    #[error("no free TCP port on 127.0.0.1: {0}")]
    Port(std::io::Error),
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error(transparent)]
    Api(#[from] FakeApiServerError),
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Kubelet(#[from] KubeletDraError),
    #[error("the DRA plugin is not registered with the kubelet stand-in")]
    NotRegistered,
    #[error("claim {claim}: {error}")]
    Prepare { claim: String, error: String },
    #[error("claim {claim}: unprepare failed: {error}")]
    Unprepare { claim: String, error: String },
    #[error("claim object {name}: {reason}")]
    ClaimObject { name: String, reason: String },
    #[error("container {id}: cpuset still {got} (cgroup) / {got_inside} (inside), want {want}, after {waited:?}")]
    Cpus {
        id: String,
        want: CpuSet,
        got: CpuSet,
        got_inside: CpuSet,
        waited: Duration,
    },
    #[error("{0} did not happen within {1:?}")]
    Timeout(String, Duration),
    #[error("reading dra-plugin's claims on its coordination socket: {0}")]
    Coordination(String),
}

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub node_name: String,
    /// `--mixed-allocation-mode` on both processes.
    pub mixed_allocation_mode: bool,
    /// Publish the KEP-5517 mapping (off: `--disable-node-allocatable-mapping`).
    pub node_allocatable_mapping: bool,
    /// The DRA API version the kubelet stand-in talks.
    pub dra_version: DraVersion,
    pub containerd: ContainerdOptions,
    /// The fake API server keeps `nodeAllocatableResources` (feature gate on).
    pub api_keeps_node_allocatable: bool,
    /// The release (and feature gates) the fake API server plays.
    pub api: FakeApiServerOptions,
    /// `--cpu-device-mode` of dra-plugin; its default (auto) when unset.
    pub cpu_device_mode: Option<String>,
    /// `--reserved-cpus` on both processes (a cpulist; none when empty).
    pub reserved_cpus: String,
    /// `--allocation-policy` of dra-plugin (its default when `None`).
    pub allocation_policy: Option<String>,
    /// `--align-memory` on nri-plugin.
    pub align_memory: bool,
    /// `--group-by` of dra-plugin's grouped devices (its default when `None`).
    pub group_by: Option<String>,
    /// `--min-shared-cpus` of dra-plugin (its default when `None`).
    pub min_shared_cpus: Option<u32>,
    /// `--host-cgroups` of nri-plugin (none when empty).
    pub host_cgroups: Vec<String>,
    /// KEP-5304 device metadata (off: `--disable-device-metadata`).
    pub device_metadata: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_name: "node-a".to_string(),
            mixed_allocation_mode: false,
            node_allocatable_mapping: true,
            dra_version: DraVersion::V1,
            containerd: ContainerdOptions::default(),
            api_keeps_node_allocatable: true,
            api: FakeApiServerOptions::default(),
            cpu_device_mode: None,
            reserved_cpus: String::new(),
            allocation_policy: None,
            align_memory: false,
            group_by: None,
            min_shared_cpus: None,
            host_cgroups: Vec::new(),
            device_metadata: true,
        }
    }
}

/// Where one node keeps its files (all under one short directory, so socket
/// paths stay far below the 107-byte limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    pub dir: PathBuf,
    pub nri_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub dra_metrics: SocketAddr,
    pub nri_metrics: SocketAddr,
}

impl NodeLayout {
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    pub fn plugins_registry(&self) -> PathBuf {
        self.kubelet_root().join("plugins_registry")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn coordination_socket(&self) -> PathBuf {
        self.state_dir().join("coordination.sock")
    }
    pub fn dra_log(&self) -> PathBuf {
        self.dir.join("dra-plugin.log")
    }
    pub fn nri_log(&self) -> PathBuf {
        self.dir.join("nri-plugin.log")
    }
    /// nri-plugin's `--state-dir`, the node's own so that no run sees
    /// another's host cgroups.
    pub fn nri_state_dir(&self) -> PathBuf {
        self.dir.join("nri-state")
    }
}

fn flag(on: bool, name: &str) -> Option<String> {
    on.then(|| name.to_string())
}

/// The flags of `dra-plugin run` for a node.
pub fn dra_plugin_args(layout: &NodeLayout, options: &NodeOptions) -> Vec<String> {
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    let mut args = vec![
        "run".to_string(),
        "--node-name".into(),
        options.node_name.clone(),
        "--kubeconfig".into(),
        path(layout.kubeconfig.clone()),
        "--kubelet-root-dir".into(),
        path(layout.kubelet_root()),
        "--state-dir".into(),
        path(layout.state_dir()),
        "--cdi-dir".into(),
        path(layout.cdi_dir.clone()),
        "--coordination-socket".into(),
        path(layout.coordination_socket()),
        "--sysfs-root".into(),
        "/".into(),
        "--metrics-address".into(),
        layout.dra_metrics.to_string(),
        "--log-format".into(),
        "json".into(),
    ];
    args.extend(flag(
        options.mixed_allocation_mode,
        "--mixed-allocation-mode",
    ));
    args.extend(flag(
        !options.node_allocatable_mapping,
        "--disable-node-allocatable-mapping",
    ));
    if let Some(mode) = &options.cpu_device_mode {
        args.push(format!("--cpu-device-mode={mode}"));
    }
    args.extend(reserved_cpus_args(options));
    if let Some(policy) = &options.allocation_policy {
        args.extend(["--allocation-policy".to_string(), policy.clone()]);
    }
    if let Some(group_by) = &options.group_by {
        args.extend(["--group-by".to_string(), group_by.clone()]);
    }
    if let Some(min) = options.min_shared_cpus {
        args.extend(["--min-shared-cpus".to_string(), min.to_string()]);
    }
    args.extend(flag(!options.device_metadata, "--disable-device-metadata"));
    args
}

/// `--reserved-cpus <list>`, the same on both processes; nothing when none
/// are reserved.
fn reserved_cpus_args(options: &NodeOptions) -> Vec<String> {
    if options.reserved_cpus.is_empty() {
        Vec::new()
    } else {
        vec!["--reserved-cpus".to_string(), options.reserved_cpus.clone()]
    }
}

/// The flags of `nri-plugin` for a node.
pub fn nri_plugin_args(layout: &NodeLayout, options: &NodeOptions) -> Vec<String> {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut args = vec![
        "--nri-socket".to_string(),
        path(&layout.nri_socket),
        "--coordination-socket".into(),
        path(&layout.coordination_socket()),
        "--cdi-dir".into(),
        path(&layout.cdi_dir),
        "--sysfs-root".into(),
        "/".into(),
        "--metrics-address".into(),
        layout.nri_metrics.to_string(),
        "--log-format".into(),
        "json".into(),
    ];
    args.extend(flag(
        options.mixed_allocation_mode,
        "--mixed-allocation-mode",
    ));
    args.extend(reserved_cpus_args(options));
    args.extend(flag(options.align_memory, "--align-memory"));
    args.extend(["--state-dir".to_string(), path(&layout.nri_state_dir())]);
    if !options.host_cgroups.is_empty() {
        args.extend(["--host-cgroups".to_string(), options.host_cgroups.join(",")]);
    }
    args
}

/// Where a binary may be: `$env`, else `<target>/debug/<name>`, else
/// `<target>/release/<name>`.
pub fn binary_candidates(name: &str, env_value: Option<&str>, target_dir: &Path) -> Vec<PathBuf> {
    match env_value.filter(|v| !v.is_empty()) {
        Some(path) => vec![PathBuf::from(path)],
        None => vec![
            target_dir.join("debug").join(name),
            target_dir.join("release").join(name),
        ],
    }
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    }
}

fn find_binary(name: &'static str, env: &'static str) -> Result<PathBuf, NodeError> {
    let env_value = std::env::var(env).ok();
    let looked = binary_candidates(name, env_value.as_deref(), &target_dir());
    looked
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or(NodeError::NoBinary {
            what: name,
            env,
            looked,
        })
}

/// The ResourceClaim the scheduler would leave for a grouped-mode claim of
/// `cpus` CPUs on `node`, reserved for one pod.
pub fn allocated_claim(
    name: &str,
    node: &str,
    cpus: u32,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, serde_json::Error> {
    allocated_claim_on(name, node, GROUPED_DEVICE, cpus, pod_name, pod_uid)
}

/// Like [`allocated_claim`], from grouped device `device` (e.g.
/// `cpudevnuma001`, the second NUMA node's).
pub fn allocated_claim_on(
    name: &str,
    node: &str,
    device: &str,
    cpus: u32,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, serde_json::Error> {
    let request = json!({"name": "cpus", "exactly": cpu_capacity_request(cpus.to_string())});
    let result = grouped_result("cpus", node, device, cpus);
    scheduled_claim(name, node, request, vec![result], pod_name, pod_uid)
}

/// A ResourceClaim whose request `cpus` lists `firstAvailable` subrequests:
/// `big` (more CPUs than any node has) and `fit` (`cpus` CPUs), allocated by
/// the scheduler from `fit`, so its result names `cpus/fit`.
pub fn first_available_claim(
    name: &str,
    node: &str,
    cpus: u32,
    pod: &PodIdentity,
) -> Result<ResourceClaim, serde_json::Error> {
    let subrequest = |name: &str, cpus: String| {
        let mut subrequest = cpu_capacity_request(cpus);
        subrequest["name"] = json!(name);
        subrequest
    };
    let request = json!({
        "name": "cpus",
        "firstAvailable": [subrequest("big", "4096".into()), subrequest("fit", cpus.to_string())]
    });
    let result = grouped_result("cpus/fit", node, GROUPED_DEVICE, cpus);
    scheduled_claim(name, node, request, vec![result], &pod.name, &pod.uid)
}

/// The ResourceClaim the scheduler would leave for an individual-mode claim
/// of one CPU per device in `devices` on `node`, reserved for `pod`.
pub fn allocated_individual_claim(
    name: &str,
    node: &str,
    devices: &[String],
    pod: &PodIdentity,
) -> Result<ResourceClaim, serde_json::Error> {
    let request = json!({
        "name": "cpus",
        "exactly": {"deviceClassName": DRIVER_NAME, "count": devices.len()}
    });
    let results: Vec<Value> = devices
        .iter()
        .map(|device| json!({"request": "cpus", "driver": DRIVER_NAME, "pool": node, "device": device}))
        .collect();
    scheduled_claim(name, node, request, results, &pod.name, &pod.uid)
}

/// A request (or subrequest) of `cpus` CPUs of capacity from the driver's
/// DeviceClass.
fn cpu_capacity_request(cpus: String) -> Value {
    json!({"deviceClassName": DRIVER_NAME, "capacity": {"requests": {CPU_CAPACITY: cpus}}})
}

/// The allocation result of `cpus` CPUs of grouped device `device` for
/// `request`: the capacity the claim consumes.
fn grouped_result(request: &str, node: &str, device: &str, cpus: u32) -> Value {
    json!({
        "request": request,
        "driver": DRIVER_NAME,
        "pool": node,
        "device": device,
        "consumedCapacity": {CPU_CAPACITY: cpus.to_string()}
    })
}

/// ResourceClaim `name` of one device request, as the scheduler leaves it:
/// allocated on `node` with `results`, reserved for one pod.
fn scheduled_claim(
    name: &str,
    node: &str,
    request: Value,
    results: Vec<Value>,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                    "key": "metadata.name", "operator": "In", "values": [node]
                }]}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]
        }
    }))
}

/// The DeviceClass of the driver, as the chart installs it.
pub fn device_class() -> Result<DeviceClass, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER_NAME}\"")}}]}
    }))
}

/// The value of an unlabelled sample `name` in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok())?
        })
}

/// The CPUs a CDI spec gives claim `claim_uid` (`DRA_CPUSET_<uid>=<cpulist>`
/// in any device's container edits).
pub fn cdi_spec_cpus(spec: &Value, claim_uid: &str) -> Option<CpuSet> {
    let prefix = format!("DRA_CPUSET_{claim_uid}=");
    spec.get("devices")?
        .as_array()?
        .iter()
        .filter_map(|d| d.pointer("/containerEdits/env")?.as_array())
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix(&prefix))
        .and_then(|list| CpuSet::parse_cpulist(list).ok())
}

/// The log lines (JSON, one per line) whose message contains `fragment`.
pub fn log_messages_with(log: &str, fragment: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v.pointer("/fields/message")
                .and_then(Value::as_str)
                .is_some_and(|m| m.contains(fragment))
        })
        .collect()
}

/// A pod's name and UID, known before the pod runs (the claim reserves it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: String,
    pub uid: String,
}

impl PodIdentity {
    pub fn new(name: &str) -> Self {
        PodIdentity {
            name: name.to_string(),
            uid: new_uid(),
        }
    }
}

/// A claim the scheduler allocated and the kubelet stand-in prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedClaim {
    pub claim: Claim,
    /// The qualified CDI device of the claim, for CreateContainer.
    pub cdi_device: String,
    /// The CPUs the claim's CDI spec gives it.
    pub cpus: CpuSet,
}

/// A running pod and its containers (name, id), in spec order.
#[derive(Debug, Clone)]
pub struct RunningPod {
    pub sandbox: PodSandbox,
    pub containers: Vec<(String, String)>,
}

impl RunningPod {
    /// The id of container `name`; empty when there is none.
    pub fn id(&self, name: &str) -> &str {
        self.containers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| id.as_str())
            .unwrap_or("")
    }
}

/// One product process.
#[derive(Debug)]
struct Process {
    what: &'static str,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn spawn(&mut self) -> Result<(), NodeError> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|source| NodeError::Dir {
                    path: self.log.clone(),
                    source,
                })
        };
        let (out, err) = (open()?, open()?);
        let child = Command::new(&self.bin)
            .args(&self.args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env_remove(NRI_SOCKET_INHERIT_ENV)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| NodeError::Spawn {
                bin: self.bin.clone(),
                source,
            })?;
        self.child = Some(child);
        Ok(())
    }

    fn check_running(&mut self) -> Result<(), NodeError> {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(NodeError::Exited {
                    what: self.what,
                    status,
                    log_tail: log_tail(&self.log),
                });
            }
        }
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash or an OOM kill would end it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it does not stop.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// nri-plugin would take an inherited NRI socket from this variable.
const NRI_SOCKET_INHERIT_ENV: &str = "NRI_PLUGIN_SOCKET";

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn free_port() -> Result<SocketAddr, NodeError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(NodeError::Port)?;
    listener.local_addr().map_err(NodeError::Port)
}

/// GET `path` on `addr` with a bare HTTP/1.0 request; the body on 200.
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

/// A running node. Dropping it stops both processes and containerd and
/// removes everything they created.
pub struct Node {
    options: NodeOptions,
    layout: NodeLayout,
    dra: Process,
    nri: Process,
    kubelet: Option<KubeletDra>,
    pub cri: CriClient,
    // Drop order: processes are stopped in `drop`, then containerd cleans
    // its pods, then the API server stops, then the directory goes.
    containerd: Containerd,
    api: FakeApiServer,
    _dir: tempfile::TempDir,
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
}

impl Node {
    /// Starts containerd, the fake API server (with the Node and the
    /// DeviceClass), dra-plugin (registered through the kubelet stand-in,
    /// slices published) and nri-plugin (registered with containerd and
    /// subscribed to dra-plugin).
    pub async fn start(options: NodeOptions) -> Result<Node, NodeError> {
        let guard = ONE_NODE_AT_A_TIME.lock().await;
        let dra_bin = find_binary("dra-plugin", DRA_PLUGIN_BIN_ENV)?;
        let nri_bin = find_binary("nri-plugin", NRI_PLUGIN_BIN_ENV)?;
        let dir = tempfile::Builder::new()
            .prefix("dcpu-node-")
            .rand_bytes(6)
            .tempdir_in("/tmp")
            .map_err(|source| NodeError::Dir {
                path: PathBuf::from("/tmp"),
                source,
            })?;
        let containerd = Containerd::start(options.containerd.clone()).await?;
        let mut api_options = options.api.clone();
        if !options.api_keeps_node_allocatable {
            api_options.feature_gates.dra_node_allocatable_resources = false;
        }
        let api = FakeApiServer::start_with(api_options)?;
        api.insert_node(&options.node_name)?;
        let class = device_class().map_err(|e| NodeError::ClaimObject {
            name: DRIVER_NAME.to_string(),
            reason: e.to_string(),
        })?;
        api.insert_device_class(class)?;
        let layout = NodeLayout {
            dir: dir.path().to_path_buf(),
            nri_socket: containerd.nri_socket(),
            cdi_dir: containerd.cdi_dir(),
            kubeconfig: api.kubeconfig_path().to_path_buf(),
            dra_metrics: free_port()?,
            nri_metrics: free_port()?,
        };
        for d in [layout.plugins_registry(), layout.state_dir()] {
            std::fs::create_dir_all(&d).map_err(|source| NodeError::Dir { path: d, source })?;
        }
        let cri = containerd.cri().await?;
        let dra = Process {
            what: "dra-plugin",
            bin: dra_bin,
            args: dra_plugin_args(&layout, &options),
            log: layout.dra_log(),
            child: None,
        };
        let nri = Process {
            what: "nri-plugin",
            bin: nri_bin,
            args: nri_plugin_args(&layout, &options),
            log: layout.nri_log(),
            child: None,
        };
        let mut node = Node {
            options,
            layout,
            dra,
            nri,
            kubelet: None,
            cri,
            containerd,
            api,
            _dir: dir,
            _one_at_a_time: guard,
        };
        node.start_dra_plugin().await?;
        node.wait_slices().await?;
        node.start_nri_plugin().await?;
        Ok(node)
    }

    pub fn options(&self) -> &NodeOptions {
        &self.options
    }
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }
    pub fn api(&self) -> &FakeApiServer {
        &self.api
    }
    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }
    pub fn dra_plugin_pid(&self) -> Option<u32> {
        self.dra.pid()
    }
    pub fn nri_plugin_pid(&self) -> Option<u32> {
        self.nri.pid()
    }
    pub fn dra_log(&self) -> String {
        std::fs::read_to_string(self.layout.dra_log()).unwrap_or_default()
    }
    /// dra-plugin's `/metrics` text, if it answers.
    pub async fn dra_metrics(&self) -> Option<String> {
        http_get(self.layout.dra_metrics, "/metrics").await
    }
    pub fn nri_log(&self) -> String {
        std::fs::read_to_string(self.layout.nri_log()).unwrap_or_default()
    }

    /// Starts dra-plugin and registers it with the kubelet stand-in.
    pub async fn start_dra_plugin(&mut self) -> Result<(), NodeError> {
        // A killed plugin leaves its registration socket behind. The new
        // one renames its socket onto that name, which kubelet's watcher
        // sees as a new plugin: so does this wait, which registers only a
        // socket that was not there before the start.
        let registry = self.layout.plugins_registry();
        let seen = RegistrySnapshot::of(&registry);
        self.kubelet = None;
        self.dra.spawn()?;
        let started = Instant::now();
        let version = self.options.dra_version;
        let register = KubeletDra::register_new(&registry, seen, DRIVER_NAME, version, SETTLE);
        tokio::pin!(register);
        let kubelet = loop {
            tokio::select! {
                registered = &mut register => break registered?,
                () = tokio::time::sleep(POLL) => self.dra.check_running()?,
            }
        };
        self.kubelet = Some(kubelet);
        self.wait_http_ok("dra-plugin", self.layout.dra_metrics, "/readyz", started)
            .await
    }

    /// Starts nri-plugin and waits until it is registered with containerd
    /// and subscribed to dra-plugin (when dra-plugin runs).
    pub async fn start_nri_plugin(&mut self) -> Result<(), NodeError> {
        self.nri.spawn()?;
        self.wait_nri_ready(self.dra.pid().is_some()).await
    }

    /// Waits until nri-plugin is registered with NRI and, when `subscribed`,
    /// subscribed to dra-plugin.
    pub async fn wait_nri_ready(&mut self, subscribed: bool) -> Result<(), NodeError> {
        let started = Instant::now();
        loop {
            self.nri.check_running()?;
            let metrics = http_get(self.layout.nri_metrics, "/metrics").await;
            let value = |name| {
                metrics
                    .as_deref()
                    .and_then(|m| metric_value(m, name))
                    .unwrap_or(0.0)
            };
            let registered = value("nri_plugin_nri_registered") == 1.0;
            let connected = value("nri_plugin_coordination_connected") == 1.0;
            if registered && (connected || !subscribed) {
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::NotReady {
                    what: "nri-plugin",
                    waited: started.elapsed(),
                    waiting_for: format!(
                        "registered with NRI: {registered}, subscribed to dra-plugin: {connected}"
                    ),
                    log_tail: log_tail(&self.layout.nri_log()),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_http_ok(
        &mut self,
        what: &'static str,
        addr: SocketAddr,
        path: &str,
        started: Instant,
    ) -> Result<(), NodeError> {
        loop {
            if what == "dra-plugin" {
                self.dra.check_running()?;
            } else {
                self.nri.check_running()?;
            }
            if http_get(addr, path).await.is_some() {
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                let log = if what == "dra-plugin" {
                    self.layout.dra_log()
                } else {
                    self.layout.nri_log()
                };
                return Err(NodeError::NotReady {
                    what,
                    waited: started.elapsed(),
                    waiting_for: format!("GET http://{addr}{path} to answer 200"),
                    log_tail: log_tail(&log),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// This node's ResourceSlices as the API server holds them.
    fn published_slices(&self) -> Vec<Value> {
        self.api
            .slice_values()
            .into_iter()
            .filter(|s| {
                s.pointer("/spec/nodeName").and_then(Value::as_str)
                    == Some(self.options.node_name.as_str())
            })
            .collect()
    }

    /// Waits until this node's ResourceSlices are published.
    pub async fn wait_slices(&mut self) -> Result<Vec<Value>, NodeError> {
        let started = Instant::now();
        loop {
            self.dra.check_running()?;
            let slices = self.published_slices();
            if !slices.is_empty() {
                return Ok(slices);
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::NotReady {
                    what: "dra-plugin",
                    waited: started.elapsed(),
                    waiting_for: "its ResourceSlices in the API server".into(),
                    log_tail: log_tail(&self.layout.dra_log()),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// kill -9 of dra-plugin.
    pub fn kill_dra_plugin(&mut self) {
        self.kubelet = None;
        self.dra.kill();
    }

    /// kill -9 of nri-plugin.
    pub fn kill_nri_plugin(&mut self) {
        self.nri.kill();
    }

    /// kill -9 of dra-plugin, then a fresh start on the same state.
    pub async fn restart_dra_plugin(&mut self) -> Result<(), NodeError> {
        self.kill_dra_plugin();
        self.start_dra_plugin().await?;
        // nri-plugin reconnects on its own; wait until it has.
        if self.nri.pid().is_some() {
            self.wait_nri_ready(true).await?;
        }
        Ok(())
    }

    /// SIGTERM to nri-plugin (a clean stop), waiting until it has exited.
    pub fn stop_nri_plugin(&mut self) {
        self.nri.stop();
    }

    /// Starts nri-plugin again with `--host-cgroups` set to `host_cgroups`
    /// (none when empty), every other flag as before.
    pub async fn start_nri_plugin_with_host_cgroups(
        &mut self,
        host_cgroups: &[&str],
    ) -> Result<(), NodeError> {
        self.options.host_cgroups = host_cgroups.iter().map(|c| c.to_string()).collect();
        self.nri.args = nri_plugin_args(&self.layout, &self.options);
        self.start_nri_plugin().await
    }

    /// kill -9 of nri-plugin, then a fresh start.
    pub async fn restart_nri_plugin(&mut self) -> Result<(), NodeError> {
        self.kill_nri_plugin();
        self.start_nri_plugin().await
    }

    /// Restarts containerd (containers keep running in their shims); waits
    /// until nri-plugin has registered with the new containerd.
    pub async fn restart_containerd(&mut self) -> Result<(), NodeError> {
        self.containerd.restart().await?;
        self.cri = self.containerd.cri().await?;
        // nri-plugin sees its connection drop and must reconnect itself.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            let metrics = http_get(self.layout.nri_metrics, "/metrics").await;
            if metrics
                .as_deref()
                .and_then(|m| metric_value(m, "nri_plugin_nri_registered"))
                == Some(0.0)
            {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.wait_nri_ready(self.dra.pid().is_some()).await
    }

    fn kubelet(&self) -> Result<&KubeletDra, NodeError> {
        self.kubelet.as_ref().ok_or(NodeError::NotRegistered)
    }

    /// Plays the scheduler: a ResourceClaim `name` of `cpus` CPUs from this
    /// node's grouped device, allocated and reserved for `pod`.
    pub fn allocate_claim(
        &self,
        name: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<Claim, NodeError> {
        // Plays the scheduler on what is published: the grouped device with
        // consumed capacity where there is one, else the first free
        // individual devices.
        let published: Vec<String> = self
            .published_slices()
            .iter()
            .filter_map(|s| s.pointer("/spec/devices").and_then(Value::as_array))
            .flatten()
            .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_string))
            .collect();
        if published.is_empty() || published.iter().any(|d| d == GROUPED_DEVICE) {
            return self.allocate_claim_on(name, GROUPED_DEVICE, cpus, pod);
        }
        let taken = self.api.allocated_devices();
        let mut free: Vec<String> = published
            .into_iter()
            .filter(|d| !taken.contains(d))
            .collect();
        free.sort();
        free.truncate(usize::try_from(cpus).unwrap_or(usize::MAX));
        let object = allocated_individual_claim(name, &self.options.node_name, &free, pod);
        self.store_claim(name, object)
    }

    /// Plays the scheduler: a ResourceClaim `name` of `cpus` CPUs from
    /// this node's grouped device `device`, allocated and reserved for `pod`.
    pub fn allocate_claim_on(
        &self,
        name: &str,
        device: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<Claim, NodeError> {
        let object = allocated_claim_on(
            name,
            &self.options.node_name,
            device,
            cpus,
            &pod.name,
            &pod.uid,
        );
        self.store_claim(name, object)
    }

    /// Stores a claim the scheduler allocated, as the API server holds it.
    fn store_claim(
        &self,
        name: &str,
        object: Result<ResourceClaim, serde_json::Error>,
    ) -> Result<Claim, NodeError> {
        let object = object.map_err(|e| NodeError::ClaimObject {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let stored = self.api.insert_claim(object)?;
        let uid = stored.metadata.uid.ok_or_else(|| NodeError::ClaimObject {
            name: name.to_string(),
            reason: "stored without a uid".into(),
        })?;
        Ok(Claim {
            namespace: NAMESPACE.to_string(),
            name: name.to_string(),
            uid,
        })
    }

    /// Plays kubelet: NodePrepareResources for one claim, used by a
    /// container that names no request of it.
    pub async fn prepare(&self, claim: &Claim) -> Result<PreparedClaim, NodeError> {
        self.prepare_for_request(claim, "").await
    }

    /// Plays kubelet: NodePrepareResources for one claim, used by a
    /// container whose `resources.claims[].request` is `request` (empty:
    /// none). The CDI device is the one kubelet would give that container.
    pub async fn prepare_for_request(
        &self,
        claim: &Claim,
        request: &str,
    ) -> Result<PreparedClaim, NodeError> {
        let answers = self.kubelet()?.prepare(std::slice::from_ref(claim)).await?;
        let outcome = answers
            .get(&claim.uid)
            .ok_or_else(|| KubeletDraError::MissingClaim(claim.uid.clone()))?;
        if !outcome.error.is_empty() {
            return Err(NodeError::Prepare {
                claim: format!("{}/{} ({})", claim.namespace, claim.name, claim.uid),
                error: outcome.error.clone(),
            });
        }
        let cdi_device = cdi_ids_for_container(&outcome.devices, request)
            .into_iter()
            .next()
            .ok_or_else(|| NodeError::Prepare {
                claim: claim.uid.clone(),
                error: format!(
                    "kubelet gives a container naming request {request:?} no CDI device of {outcome:?}"
                ),
            })?;
        let cpus = self
            .claim_cpus(&claim.uid)
            .ok_or_else(|| NodeError::Prepare {
                claim: claim.uid.clone(),
                error: format!(
                    "prepared but no CDI spec in {} gives it CPUs",
                    self.layout.cdi_dir.display()
                ),
            })?;
        Ok(PreparedClaim {
            claim: claim.clone(),
            cdi_device,
            cpus,
        })
    }

    /// Plays the scheduler for a claim with `firstAvailable` subrequests (see
    /// [`first_available_claim`]), allocated from its second choice.
    pub fn allocate_first_available_claim(
        &self,
        name: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<Claim, NodeError> {
        let object = first_available_claim(name, &self.options.node_name, cpus, pod);
        self.store_claim(name, object)
    }

    /// Scheduler then kubelet: allocate and prepare a claim of `cpus` CPUs.
    pub async fn create_claim(
        &self,
        name: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<PreparedClaim, NodeError> {
        let claim = self.allocate_claim(name, cpus, pod)?;
        self.prepare(&claim).await
    }

    /// Scheduler then kubelet: a claim of `cpus` CPUs from grouped device
    /// `device`.
    pub async fn create_claim_on(
        &self,
        name: &str,
        device: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<PreparedClaim, NodeError> {
        let claim = self.allocate_claim_on(name, device, cpus, pod)?;
        self.prepare(&claim).await
    }

    /// Scheduler and kubelet for pod `name`, whose one container `app` names
    /// a fresh claim `<name>-cpu` of `cpus` CPUs (from grouped device
    /// `device`, or where [`Node::allocate_claim`] finds them) and requests
    /// `request_milli`.
    pub async fn start_claim_pod(
        &mut self,
        name: &str,
        device: Option<&str>,
        cpus: u32,
        request_milli: Option<i64>,
    ) -> Result<(PodIdentity, PreparedClaim, RunningPod), NodeError> {
        let pod = PodIdentity::new(name);
        let claim_name = format!("{name}-cpu");
        let claim = match device {
            Some(device) => {
                self.create_claim_on(&claim_name, device, cpus, &pod)
                    .await?
            }
            None => self.create_claim(&claim_name, cpus, &pod).await?,
        };
        let spec = ContainerSpec::sleeper("app")
            .with_cdi_device(&claim.cdi_device)
            .with_cpu(request_milli, None);
        let running = self.start_pod(&pod, &[spec]).await?;
        Ok((pod, claim, running))
    }

    /// The claims dra-plugin's store holds, from the first event (the
    /// snapshot) of a coordination Watch.
    pub async fn stored_claims(
        &self,
    ) -> Result<Vec<dra_cpu_proto::coordination::v1::Claim>, NodeError> {
        use dra_cpu_proto::coordination::v1 as coord;
        let failed =
            |what: &str, e: &dyn std::fmt::Display| NodeError::Coordination(format!("{what}: {e}"));
        let channel = dra_cpu_proto::transport::connect_unix(&self.layout().coordination_socket())
            .await
            .map_err(|e| failed("connecting", &e))?;
        let mut client = coord::coordination_client::CoordinationClient::new(channel);
        let mut stream = client
            .watch(coord::WatchRequest {
                from_revision: 0,
                subscriber: "test-node".into(),
            })
            .await
            .map_err(|e| failed("Watch", &e))?
            .into_inner();
        match stream
            .message()
            .await
            .map_err(|e| failed("first event", &e))?
            .and_then(|e| e.event)
        {
            Some(coord::watch_event::Event::Snapshot(s)) => Ok(s.claims),
            other => Err(NodeError::Coordination(format!(
                "the first event is not a snapshot: {other:?}"
            ))),
        }
    }

    /// Plays kubelet: NodeUnprepareResources for one claim.
    pub async fn unprepare(&self, claim: &Claim) -> Result<(), NodeError> {
        let answers = self
            .kubelet()?
            .unprepare(std::slice::from_ref(claim))
            .await?;
        match answers.get(&claim.uid) {
            Some(error) if error.is_empty() => Ok(()),
            Some(error) => Err(NodeError::Unprepare {
                claim: claim.uid.clone(),
                error: error.clone(),
            }),
            None => Err(KubeletDraError::MissingClaim(claim.uid.clone()).into()),
        }
    }

    /// The CPUs this node's CDI specs give claim `claim_uid`.
    pub fn claim_cpus(&self, claim_uid: &str) -> Option<CpuSet> {
        let entries = std::fs::read_dir(&self.layout.cdi_dir).ok()?;
        entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
            .find_map(|spec| cdi_spec_cpus(&spec, claim_uid))
    }

    /// Plays kubelet: RunPodSandbox, then CreateContainer and StartContainer
    /// for each container.
    pub async fn start_pod(
        &mut self,
        pod: &PodIdentity,
        containers: &[ContainerSpec],
    ) -> Result<RunningPod, NodeError> {
        let sandbox = self.cri.run_pod(&pod.name, NAMESPACE, &pod.uid).await?;
        let mut running = RunningPod {
            sandbox,
            containers: Vec::new(),
        };
        for spec in containers {
            let id = self.cri.run_container(&running.sandbox, spec).await?;
            running.containers.push((spec.name.clone(), id));
        }
        Ok(running)
    }

    /// Plays kubelet deleting a pod: stop and remove its sandbox.
    pub async fn delete_pod(&mut self, pod: &RunningPod) -> Result<(), NodeError> {
        self.cri.delete_pod(&pod.sandbox.id).await?;
        Ok(())
    }

    /// Starts a shared container and removes it again: an NRI event whose
    /// reply carries the pool changes deferred on runtimes where unsolicited
    /// updates are not safe.
    pub async fn nudge(&mut self) -> Result<(), NodeError> {
        let pod = PodIdentity::new("nudge");
        let running = self
            .start_pod(
                &pod,
                &[ContainerSpec::sleeper("nudge").with_cpu(Some(10), None)],
            )
            .await?;
        self.delete_pod(&running).await
    }

    /// Whether nri-plugin decided this runtime takes unsolicited updates
    /// (from its log; `None` before it has registered).
    pub fn unsolicited_updates_safe(&self) -> Option<bool> {
        self.nri_log()
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|v| {
                v.pointer("/fields/unsolicited_updates_safe")
                    .and_then(Value::as_bool)
            })
    }

    /// The container runtime's name and version, as CRI reports them.
    pub async fn runtime_version(&mut self) -> Result<String, NodeError> {
        let v = self.cri.version().await?;
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    /// What nri-plugin logged of the NRI runtime when it registered: the
    /// runtime's NRI version (as the runtime reports it, if it does).
    pub fn nri_runtime_nri_version(&self) -> Option<String> {
        self.nri_log()
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| {
                v.pointer("/fields/message").and_then(Value::as_str)
                    == Some("configured by the NRI runtime")
            })
            .and_then(|v| v.pointer("/fields/nri").cloned())
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
            .filter(|v| v != "None")
    }

    /// After a claim is unprepared: make sure an event reaches nri-plugin if
    /// it has to wait for one to grow containers back.
    pub async fn after_unprepare(&mut self) -> Result<(), NodeError> {
        if self.unsolicited_updates_safe() != Some(true) {
            self.nudge().await?;
        }
        Ok(())
    }

    /// A container's cpuset now, from its cgroup and from inside it.
    pub async fn cpus(&mut self, id: &str) -> Result<ContainerCpus, NodeError> {
        Ok(cgroup::container_cpus(&mut self.cri, id).await?)
    }

    /// Waits until both the cgroup and the inside of container `id` say
    /// `want`; the error names what they said last.
    pub async fn wait_cpus(&mut self, id: &str, want: &CpuSet) -> Result<ContainerCpus, NodeError> {
        let started = Instant::now();
        loop {
            let now = self.cpus(id).await?;
            if &now.cgroup.cpus == want && &now.allowed_inside == want {
                return Ok(now);
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::Cpus {
                    id: id.to_string(),
                    want: want.clone(),
                    got: now.cgroup.cpus,
                    got_inside: now.allowed_inside,
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `log()` has a line whose message contains `fragment`.
    pub async fn wait_log(&self, nri: bool, fragment: &str) -> Result<Vec<Value>, NodeError> {
        let started = Instant::now();
        loop {
            let log = if nri { self.nri_log() } else { self.dra_log() };
            let found = log_messages_with(&log, fragment);
            if !found.is_empty() {
                return Ok(found);
            }
            if started.elapsed() > SETTLE {
                return Err(NodeError::Timeout(
                    format!("a log line containing {fragment:?}"),
                    started.elapsed(),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The CPUs containers may use: online CPUs but the reserved ones.
    pub fn allocatable(&self) -> Result<CpuSet, NodeError> {
        let online = cgroup::online_cpus()?;
        if self.options.reserved_cpus.is_empty() {
            return Ok(online);
        }
        let reserved = CpuSet::parse_cpulist(&self.options.reserved_cpus).map_err(|e| {
            NodeError::ClaimObject {
                name: "--reserved-cpus".into(),
                reason: format!("{:?}: {e}", self.options.reserved_cpus),
            }
        })?;
        Ok(online.difference(&reserved))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.nri.stop();
        self.dra.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout() -> NodeLayout {
        NodeLayout {
            dir: PathBuf::from("/tmp/dcpu-node-x"),
            nri_socket: PathBuf::from("/tmp/dcpu-y/nri.sock"),
            cdi_dir: PathBuf::from("/tmp/dcpu-y/cdi"),
            kubeconfig: PathBuf::from("/tmp/k/kubeconfig"),
            dra_metrics: "127.0.0.1:4000".parse().unwrap(),
            nri_metrics: "127.0.0.1:4001".parse().unwrap(),
        }
    }

    fn value_after(args: &[String], name: &str) -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    }

    #[test]
    fn process_flags_follow_the_options() {
        let cases = [
            (false, true, false, false),
            (true, true, true, false),
            (false, false, false, true),
            (true, false, true, true),
        ];
        for (mixed, mapping, want_mixed, want_disable) in cases {
            let options = NodeOptions {
                mixed_allocation_mode: mixed,
                node_allocatable_mapping: mapping,
                ..Default::default()
            };
            let dra = dra_plugin_args(&layout(), &options);
            let nri = nri_plugin_args(&layout(), &options);
            assert_eq!(dra[0], "run");
            assert_eq!(
                dra.contains(&"--mixed-allocation-mode".to_string()),
                want_mixed
            );
            assert_eq!(
                nri.contains(&"--mixed-allocation-mode".to_string()),
                want_mixed
            );
            assert_eq!(
                dra.contains(&"--disable-node-allocatable-mapping".to_string()),
                want_disable
            );
            assert_eq!(
                value_after(&dra, "--coordination-socket"),
                value_after(&nri, "--coordination-socket"),
                "both ends of the coordination socket"
            );
            assert_eq!(
                value_after(&dra, "--cdi-dir"),
                value_after(&nri, "--cdi-dir")
            );
            assert_eq!(
                value_after(&nri, "--nri-socket").as_deref(),
                Some("/tmp/dcpu-y/nri.sock")
            );
            assert_eq!(
                value_after(&dra, "--kubelet-root-dir").as_deref(),
                Some("/tmp/dcpu-node-x/kubelet")
            );
            assert_ne!(
                value_after(&dra, "--metrics-address"),
                value_after(&nri, "--metrics-address")
            );
        }
    }

    #[test]
    fn host_cgroups_reach_nri_plugin_only_and_its_state_stays_in_the_node_dir() {
        for (list, want) in [
            (vec![], None),
            (vec!["system.slice"], Some("system.slice")),
            (vec!["a.slice", "b.slice"], Some("a.slice,b.slice")),
        ] {
            let options = NodeOptions {
                host_cgroups: list.iter().map(|c| c.to_string()).collect(),
                ..Default::default()
            };
            let nri = nri_plugin_args(&layout(), &options);
            let dra = dra_plugin_args(&layout(), &options);
            assert_eq!(value_after(&nri, "--host-cgroups").as_deref(), want);
            assert!(!dra.contains(&"--host-cgroups".to_string()));
            assert_eq!(
                value_after(&nri, "--state-dir").map(PathBuf::from),
                Some(layout().nri_state_dir())
            );
        }
    }

    #[test]
    fn policy_reserved_cpus_and_memory_alignment_reach_the_right_process() {
        // (reserved, policy, align, group by) -> what each process gets.
        let cases = [
            ("", None, false, None),
            ("0,4", None, false, Some("socket")),
            ("", Some("full-pcpus-only"), false, None),
            ("1", Some("distribute-across-numa"), true, Some("machine")),
        ];
        for (reserved, policy, align, group_by) in cases {
            let options = NodeOptions {
                reserved_cpus: reserved.to_string(),
                allocation_policy: policy.map(str::to_string),
                align_memory: align,
                group_by: group_by.map(str::to_string),
                ..Default::default()
            };
            let dra = dra_plugin_args(&layout(), &options);
            let nri = nri_plugin_args(&layout(), &options);
            let want_reserved = (!reserved.is_empty()).then(|| reserved.to_string());
            assert_eq!(value_after(&dra, "--reserved-cpus"), want_reserved);
            assert_eq!(value_after(&nri, "--reserved-cpus"), want_reserved);
            assert_eq!(value_after(&dra, "--allocation-policy").as_deref(), policy);
            assert!(!nri.contains(&"--allocation-policy".to_string()));
            assert_eq!(value_after(&dra, "--group-by").as_deref(), group_by);
            assert!(!nri.contains(&"--group-by".to_string()));
            assert_eq!(nri.contains(&"--align-memory".to_string()), align);
            assert!(!dra.contains(&"--align-memory".to_string()));
        }
    }

    #[test]
    fn claim_from_a_named_device() {
        let claim = allocated_claim_on("c1", "node-a", "cpudevnuma001", 2, "p", "u").unwrap();
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap();
        assert_eq!(results[0].device, "cpudevnuma001");
    }

    #[test]
    fn binary_lookup_prefers_the_variable() {
        let target = Path::new("/w/target");
        let cases: [(Option<&str>, Vec<PathBuf>); 3] = [
            (
                Some("/opt/bin/dra-plugin"),
                vec!["/opt/bin/dra-plugin".into()],
            ),
            (
                Some(""),
                vec![
                    "/w/target/debug/dra-plugin".into(),
                    "/w/target/release/dra-plugin".into(),
                ],
            ),
            (
                None,
                vec![
                    "/w/target/debug/dra-plugin".into(),
                    "/w/target/release/dra-plugin".into(),
                ],
            ),
        ];
        for (env, want) in cases {
            assert_eq!(
                binary_candidates("dra-plugin", env, target),
                want,
                "{env:?}"
            );
        }
    }

    #[test]
    fn claim_object_is_a_grouped_allocation_for_the_pod() {
        let claim = allocated_claim("c1", "node-a", 3, "pod-b", "uid-b").unwrap();
        let status = claim.status.as_ref().unwrap();
        let results = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .unwrap();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].driver, DRIVER_NAME);
        assert_eq!(results[0].pool, "node-a");
        assert_eq!(results[0].device, GROUPED_DEVICE);
        let consumed = results[0].consumed_capacity.as_ref().unwrap();
        assert_eq!(consumed[CPU_CAPACITY].0, "3");
        let reserved = status.reserved_for.as_ref().unwrap();
        assert_eq!(reserved[0].uid, "uid-b");
        assert_eq!(reserved[0].name, "pod-b");
        assert_eq!(reserved[0].resource, "pods");
        let class = device_class().unwrap();
        assert_eq!(class.metadata.name.as_deref(), Some(DRIVER_NAME));
    }

    #[test]
    fn metric_values_table() {
        let text = "# HELP a x\n# TYPE a gauge\na 1\nab 2\nc{x=\"y\"} 3\nd notanumber\n";
        let cases = [
            ("a", Some(1.0)),
            ("ab", Some(2.0)),
            ("c", None),
            ("d", None),
            ("e", None),
        ];
        for (name, want) in cases {
            assert_eq!(metric_value(text, name), want, "{name}");
        }
    }

    #[test]
    fn cdi_spec_cpus_table() {
        let spec = |env: Value| {
            json!({"cdiVersion": "0.6.0", "kind": CDI_KIND,
                "devices": [{"name": "claim-u1", "containerEdits": {"env": env}}]})
        };
        let cases = [
            (spec(json!(["DRA_CPUSET_u1=1"])), "u1", Some("1")),
            (
                spec(json!(["X=1", "DRA_CPUSET_u1=0-3,8"])),
                "u1",
                Some("0-3,8"),
            ),
            (spec(json!(["DRA_CPUSET_u1=1"])), "u2", None),
            (spec(json!(["DRA_CPUSET_u1=x"])), "u1", None),
            (spec(json!("not a list")), "u1", None),
            (json!({"devices": "none"}), "u1", None),
        ];
        for (i, (spec, uid, want)) in cases.into_iter().enumerate() {
            let want = want.map(|w| CpuSet::parse_cpulist(w).unwrap());
            assert_eq!(cdi_spec_cpus(&spec, uid), want, "case {i}");
        }
    }

    #[test]
    fn log_lines_are_found_by_message() {
        let log = concat!(
            "{\"level\":\"WARN\",\"fields\":{\"message\":\"refusing container\",\"reason\":\"x\"}}\n",
            "not json\n",
            "{\"level\":\"INFO\",\"fields\":{\"message\":\"started\"}}\n",
        );
        assert_eq!(log_messages_with(log, "refusing").len(), 1);
        assert_eq!(log_messages_with(log, "start").len(), 1);
        assert!(log_messages_with(log, "absent").is_empty());
    }

    proptest! {
        #[test]
        fn metric_value_reads_back_any_gauge(name in "[a-z_]{1,20}", value in 0u32..1_000_000) {
            let text = format!("# TYPE {name} gauge\n{name} {value}\n{name}_other 7\n");
            prop_assert_eq!(metric_value(&text, &name), Some(f64::from(value)));
        }

        #[test]
        fn cdi_spec_cpus_reads_back_any_cpulist(cpus in proptest::collection::btree_set(0u32..256, 1..20)) {
            let set: CpuSet = cpus.iter().copied().collect();
            let spec = json!({"devices": [{"containerEdits": {"env": [format!("DRA_CPUSET_u={}", set.to_cpulist())]}}]});
            prop_assert_eq!(cdi_spec_cpus(&spec, "u"), Some(set));
        }
    }
}
