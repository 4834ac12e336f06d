//! Kubelet stand-in, DRA side: finds a plugin's registration socket in a
//! plugins-registry directory, registers it the way kubelet's plugin
//! watcher does, calls NodePrepareResources and NodeUnprepareResources over
//! the DRA API version it chose, and watches device health as a kubelet of a
//! chosen release does.
//!
//! Each rule follows the kubelet's sources (kubernetes/kubernetes):
//! - discovery (`pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go`):
//!   any socket in the registry directory whose name does not start with `.`
//!   is a plugin, whatever its name; a socket appearing under a name, or
//!   replacing the one there (a rename onto it), is a new registration.
//! - registration (`pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`):
//!   GetInfo within 1 s, NotifyRegistrationStatus within 5 s; a failed
//!   validation is reported back with `NotifyRegistrationStatus(false, why)`.
//! - validation (`pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`,
//!   `validateSupportedServices`): the type must be `DRAPlugin`, the list of
//!   supported services not empty, and the first entry, in the plugin's
//!   order, that kubelet serves is the DRA service used. Kubelet neither
//!   checks that the endpoint exists nor the order of the list.
//! - calls (`pkg/kubelet/cm/dra/plugin/dra_plugin.go`): 45 s deadline; an
//!   answer naming a claim UID that was not asked for, or leaving one out,
//!   fails the call (`pkg/kubelet/cm/dra/manager.go`).
//! - CDI devices per container (`pkg/kubelet/cm/dra/claiminfo.go`,
//!   `cdiDevicesAsList`): a container gets a device's ids if its
//!   `resources.claims[].request` is empty or listed in `request_names`.
//! - health (`pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`,
//!   `pickHealthService`; `pkg/kubelet/cm/dra/healthinfo.go`): see
//!   [`health::KubeletRelease`] and [`health::HealthWatch`].

pub mod calls;
pub mod health;
pub mod plugin_watcher;

use dra_cpu_proto::kubelet::{registration, DRA_V1BETA1_VERSION, DRA_V1_VERSION};
use dra_cpu_transport::connect_unix;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

/// How often the registry directory is looked at while waiting.
const POLL: Duration = Duration::from_millis(20);
/// How soon a failed registration is tried again (the plugin manager's
/// reconciler loop, `loopSleepDuration`).
const RECONCILE: Duration = Duration::from_secs(1);

/// `GetInfo` must answer within this (operation_generator.go).
pub const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// `NotifyRegistrationStatus` must answer within this (operation_generator.go).
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of NodePrepareResources and NodeUnprepareResources
/// (`defaultClientCallTimeout`, dra_plugin_manager.go).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// A device not named by a health report for this long is Unknown
/// (`healthTimeout`, healthinfo.go).
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// `servicesSupportedByKubelet` of 1.34+ kubelets, in kubelet's preference.
const KUBELET_DRA_SERVICES: [&str; 2] = [DRA_V1_VERSION, DRA_V1BETA1_VERSION];

/// The DRA API version calls go over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraVersion {
    V1,
    V1beta1,
}

impl DraVersion {
    pub fn advertised(self) -> &'static str {
        match self {
            DraVersion::V1 => DRA_V1_VERSION,
            DraVersion::V1beta1 => DRA_V1BETA1_VERSION,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KubeletDraError {
    #[error("no registration socket for driver {driver} appeared in {dir} within {waited:?}")]
    NoSocket {
        driver: String,
        dir: PathBuf,
        waited: Duration,
    },
    #[error("connecting to {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
    #[error("{call} on {path}: {status}")]
    Call {
        call: &'static str,
        path: PathBuf,
        status: tonic::Status,
    },
    #[error("registration refused: {0}")]
    Invalid(String),
    #[error("the plugin's answer has no entry for claim {0}")]
    MissingClaim(String),
    #[error("the plugin answered for claim {0}, which was not asked for")]
    UnknownClaim(String),
}

/// A claim as kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// The plugin's answer for one claim: devices, or an error string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareOutcome {
    pub devices: Vec<PreparedDevice>,
    pub error: String,
}

/// A registered plugin.
#[derive(Debug, Clone)]
pub struct KubeletDra {
    pub info: registration::PluginInfo,
    pub registration_socket: PathBuf,
    version: DraVersion,
    channel: Channel,
}

async fn connect(path: &Path) -> Result<Channel, KubeletDraError> {
    connect_unix(path)
        .await
        .map_err(|e| KubeletDraError::Connect {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

impl KubeletDra {
    pub fn version(&self) -> DraVersion {
        self.version
    }

    fn endpoint(&self) -> PathBuf {
        PathBuf::from(&self.info.endpoint)
    }
}
