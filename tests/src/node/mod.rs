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

pub mod claim_objects;
pub mod claims;
pub mod daemons;
pub mod layout;
pub mod pods;
mod process;
pub mod read_back;

use crate::apiserver::{FakeApiServer, FakeApiServerError};
use crate::cgroup::CgroupError;
use crate::containerd::{Containerd, ContainerdError};
use crate::cri::{CriClient, CriError};
use crate::kubelet_dra::{KubeletDra, KubeletDraError};
use claim_objects::device_class;
use layout::{dra_plugin_args, find_binary, nri_plugin_args, NodeLayout, NodeOptions};
use process::{free_port, http_get, Process};
use shared_state::CpuSet;
use std::path::PathBuf;
use std::time::Duration;

/// The driver name of the product (and of the DeviceClass).
pub const DRIVER_NAME: &str = "dra.cpu";
/// The grouped-mode device of NUMA node 0, the only one on this machine.
pub const GROUPED_DEVICE: &str = "cpudevnuma000";
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
    #[error("cannot hold dra-plugin: {0}")]
    Hold(String),
    #[error("claim {claim}: {error}")]
    Prepare { claim: String, error: String },
    #[error("claim {claim}: unprepare failed: {error}")]
    Unprepare { claim: String, error: String },
    #[error("claim object {name}: {reason}")]
    ClaimObject { name: String, reason: String },
    #[error(transparent)]
    Cpus(Box<CpusNotReached>),
    #[error("{0} did not happen within {1:?}")]
    Timeout(String, Duration),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading dra-plugin's claims on its coordination socket: {0}")]
    Coordination(String),
}

/// A container whose cpuset did not reach the wanted one in time: what its
/// cgroup and its inside said last, and nri-plugin's last log lines.
#[derive(Debug, thiserror::Error)]
#[error("container {id}: cpuset still {got} (cgroup) / {got_inside} (inside), want {want}, after {waited:?}; nri-plugin's last log lines:\n{nri_log_tail}")]
pub struct CpusNotReached {
    pub id: String,
    pub want: CpuSet,
    pub got: CpuSet,
    pub got_inside: CpuSet,
    pub waited: Duration,
    pub nri_log_tail: String,
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
            env: Vec::new(),
            read_only_bind: None,
            child: None,
        };
        let nri = Process {
            what: "nri-plugin",
            bin: nri_bin,
            args: nri_plugin_args(&layout, &options),
            log: layout.nri_log(),
            env: Vec::new(),
            read_only_bind: if options.read_only_cgroups {
                Some(daemons::read_only_bind(&layout)?)
            } else {
                None
            },
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
    /// nri-plugin's `/metrics` text, if it answers.
    pub async fn nri_metrics(&self) -> Option<String> {
        http_get(self.layout.nri_metrics, "/metrics").await
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.nri.stop();
        self.dra.stop();
    }
}
