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
//!   [`KubeletRelease`] and [`HealthWatch`].

use dra_cpu_proto::kubelet::{
    dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration, DRA_PLUGIN_TYPE,
    DRA_V1BETA1_VERSION, DRA_V1_VERSION, HEALTH_V1ALPHA1_VERSION, HEALTH_V1_VERSION,
};
use dra_cpu_proto::transport::connect_unix;
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

/// How often the registry directory is looked at while waiting.
const POLL: Duration = Duration::from_millis(20);

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

/// Checks a `PluginInfo` as kubelet does and picks the DRA service: the
/// first entry of the plugin's list that a kubelet speaking up to `version`
/// serves (`validateSupportedServices`). `version` is `V1` for 1.34+
/// kubelets (v1 and v1beta1) and `V1beta1` for a kubelet that serves only
/// v1beta1, as 1.32 and 1.33 did.
pub fn validate_info(
    info: &registration::PluginInfo,
    version: DraVersion,
) -> Result<DraVersion, String> {
    if info.r#type != DRA_PLUGIN_TYPE {
        // The plugin watcher has no handler for other types.
        return Err(format!(
            "no handler registered for plugin type: {}",
            info.r#type
        ));
    }
    if info.supported_versions.is_empty() {
        return Err("empty list of supported gRPC services (aka supported versions)".to_string());
    }
    let served: &[&str] = match version {
        DraVersion::V1 => &KUBELET_DRA_SERVICES,
        DraVersion::V1beta1 => &[DRA_V1BETA1_VERSION],
    };
    let chosen = info
        .supported_versions
        .iter()
        .find(|v| served.contains(&v.as_str()));
    match chosen.map(String::as_str) {
        Some(DRA_V1_VERSION) => Ok(DraVersion::V1),
        Some(_) => Ok(DraVersion::V1beta1),
        None => Err(format!(
            "none of services supported by the plugin ({:?}) are supported by the kubelet ({served:?})",
            info.supported_versions
        )),
    }
}

/// The kubelet release whose health behaviour the stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletRelease {
    /// 1.34-1.36.0 with `ResourceHealthStatus` on: the v1alpha1 stream is
    /// opened for every plugin, whatever it advertises.
    V1_34,
    /// 1.37 (and 1.36.x with the backport of kubernetes #139477): the stream
    /// is opened only when advertised, v1 preferred (`pickHealthService`).
    V1_37,
}

/// The health API a kubelet opens a stream on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthApi {
    V1,
    V1alpha1,
}

impl KubeletRelease {
    /// Which health stream this kubelet opens for a plugin advertising
    /// `supported`, if any.
    pub fn health_api(self, supported: &[String]) -> Option<HealthApi> {
        let advertised = |v: &str| supported.iter().any(|s| s == v);
        match self {
            KubeletRelease::V1_34 => Some(HealthApi::V1alpha1),
            KubeletRelease::V1_37 if advertised(HEALTH_V1_VERSION) => Some(HealthApi::V1),
            KubeletRelease::V1_37 if advertised(HEALTH_V1ALPHA1_VERSION) => {
                Some(HealthApi::V1alpha1)
            }
            KubeletRelease::V1_37 => None,
        }
    }
}

/// The CDI device ids kubelet gives a container from a prepared claim: those
/// of every device whose `request_names` list the container's request, or of
/// every device when the container names no request (`cdiDevicesAsList`).
/// Duplicates are kept, as kubelet keeps them.
pub fn cdi_ids_for_container(devices: &[PreparedDevice], request: &str) -> Vec<String> {
    devices
        .iter()
        .filter(|d| {
            request.is_empty()
                || d.request_names.is_empty()
                || d.request_names.iter().any(|r| r == request)
        })
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// The sockets of a plugins-registry directory as kubelet's watcher last
/// saw them: path to inode. A path not seen before, or seen with another
/// inode (a new socket renamed onto it), is a new plugin to register.
#[derive(Debug, Clone, Default)]
pub struct RegistrySnapshot {
    seen: BTreeMap<PathBuf, u64>,
}

impl RegistrySnapshot {
    /// Everything in `dir` now counts as already registered.
    pub fn of(dir: &Path) -> RegistrySnapshot {
        let mut snapshot = RegistrySnapshot::default();
        snapshot.new_sockets(dir);
        snapshot
    }

    /// Sockets that appeared since the last look, and records them.
    pub fn new_sockets(&mut self, dir: &Path) -> Vec<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut fresh = Vec::new();
        for entry in entries.flatten() {
            // The watcher ignores names starting with "." (temporary files).
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.file_type().is_socket() {
                continue;
            }
            if self.seen.insert(path.clone(), meta.ino()) != Some(meta.ino()) {
                fresh.push(path);
            }
        }
        fresh.sort();
        fresh
    }
}

/// A registered plugin.
#[derive(Debug, Clone)]
pub struct KubeletDra {
    pub info: registration::PluginInfo,
    pub registration_socket: PathBuf,
    version: DraVersion,
    channel: Channel,
}

/// The request's claims as `$api` messages; the DRA API versions share
/// their message shapes and differ only in the generated module path.
macro_rules! claims_of {
    ($api:ident, $claims:expr) => {
        $claims
            .iter()
            .map(|c| $api::Claim {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
            })
            .collect()
    };
}

/// NodePrepareResources over `$api`, answers keyed by claim UID.
macro_rules! prepare_over {
    ($api:ident, $channel:expr, $claims:expr, $call_error:expr) => {{
        let mut request = tonic::Request::new($api::NodePrepareResourcesRequest {
            claims: claims_of!($api, $claims),
        });
        request.set_timeout(CALL_TIMEOUT);
        let mut client = $api::dra_plugin_client::DraPluginClient::new($channel.clone());
        client
            .node_prepare_resources(request)
            .await
            .map_err($call_error)?
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| PreparedDevice {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    PrepareOutcome {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect()
    }};
}

/// NodeUnprepareResources over `$api`: claim UID → error string.
macro_rules! unprepare_over {
    ($api:ident, $channel:expr, $claims:expr, $call_error:expr) => {{
        let mut request = tonic::Request::new($api::NodeUnprepareResourcesRequest {
            claims: claims_of!($api, $claims),
        });
        request.set_timeout(CALL_TIMEOUT);
        let mut client = $api::dra_plugin_client::DraPluginClient::new($channel.clone());
        client
            .node_unprepare_resources(request)
            .await
            .map_err($call_error)?
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| (uid, r.error))
            .collect()
    }};
}

async fn connect(path: &Path) -> Result<Channel, KubeletDraError> {
    connect_unix(path)
        .await
        .map_err(|e| KubeletDraError::Connect {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// One registration, as the plugin watcher runs it for a new socket:
/// GetInfo, validation, NotifyRegistrationStatus. `None` when the socket
/// belongs to another driver.
async fn register_socket(
    socket: &Path,
    driver: &str,
    version: DraVersion,
) -> Result<Option<KubeletDra>, KubeletDraError> {
    let call = |call: &'static str| {
        let path = socket.to_path_buf();
        move |status| KubeletDraError::Call { call, path, status }
    };
    let mut registrar =
        registration::registration_client::RegistrationClient::new(connect(socket).await?);
    let mut request = tonic::Request::new(registration::InfoRequest {});
    request.set_timeout(GET_INFO_TIMEOUT);
    let info = registrar
        .get_info(request)
        .await
        .map_err(call("GetInfo"))?
        .into_inner();
    if info.name != driver {
        return Ok(None);
    }
    let verdict = validate_info(&info, version);
    let mut status = tonic::Request::new(registration::RegistrationStatus {
        plugin_registered: verdict.is_ok(),
        error: verdict.clone().err().unwrap_or_default(),
    });
    status.set_timeout(NOTIFY_TIMEOUT);
    registrar
        .notify_registration_status(status)
        .await
        .map_err(call("NotifyRegistrationStatus"))?;
    let version = verdict.map_err(KubeletDraError::Invalid)?;
    // grpc.NewClient("unix:" + endpoint) connects lazily: a missing
    // endpoint is not a registration error, only the first call fails.
    let channel =
        dra_cpu_proto::transport::connect_unix_lazy(Path::new(&info.endpoint)).map_err(|e| {
            KubeletDraError::Connect {
                path: PathBuf::from(&info.endpoint),
                reason: e.to_string(),
            }
        })?;
    Ok(Some(KubeletDra {
        info,
        registration_socket: socket.to_path_buf(),
        version,
        channel,
    }))
}

/// Kubelet's checks on an answer: no claim it did not ask for, none left
/// out (`pkg/kubelet/cm/dra/manager.go`).
fn check_answered<'a>(
    claims: &[Claim],
    answered: impl Iterator<Item = &'a String>,
) -> Result<(), KubeletDraError> {
    let mut answered: Vec<&String> = answered.collect();
    if let Some(unknown) = answered
        .iter()
        .find(|uid| !claims.iter().any(|c| &&c.uid == *uid))
    {
        return Err(KubeletDraError::UnknownClaim((*unknown).clone()));
    }
    answered.sort();
    for claim in claims {
        if answered.binary_search(&&claim.uid).is_err() {
            return Err(KubeletDraError::MissingClaim(claim.uid.clone()));
        }
    }
    Ok(())
}

impl KubeletDra {
    /// Waits for a plugin of `driver` to appear in `dir`, registers it and
    /// connects to its endpoint. Every socket already in `dir` counts as new.
    pub async fn register(
        dir: &Path,
        driver: &str,
        version: DraVersion,
        wait: Duration,
    ) -> Result<KubeletDra, KubeletDraError> {
        KubeletDra::register_new(dir, RegistrySnapshot::default(), driver, version, wait).await
    }

    /// As [`KubeletDra::register`], for a plugin socket that appears after
    /// `seen` was taken: a restarted plugin renaming a new socket onto its
    /// old name is registered again, as kubelet's watcher registers it.
    /// Sockets of other drivers are asked for their info and left alone.
    pub async fn register_new(
        dir: &Path,
        mut seen: RegistrySnapshot,
        driver: &str,
        version: DraVersion,
        wait: Duration,
    ) -> Result<KubeletDra, KubeletDraError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            for socket in seen.new_sockets(dir) {
                if let Some(kubelet) = register_socket(&socket, driver, version).await? {
                    return Ok(kubelet);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KubeletDraError::NoSocket {
                    driver: driver.to_string(),
                    dir: dir.to_path_buf(),
                    waited: wait,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub fn version(&self) -> DraVersion {
        self.version
    }

    fn endpoint(&self) -> PathBuf {
        PathBuf::from(&self.info.endpoint)
    }

    /// NodePrepareResources; every requested claim must be answered.
    pub async fn prepare(
        &self,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, PrepareOutcome>, KubeletDraError> {
        let call_error = |status| KubeletDraError::Call {
            call: "NodePrepareResources",
            path: self.endpoint(),
            status,
        };
        let answers: BTreeMap<String, PrepareOutcome> = match self.version {
            DraVersion::V1 => prepare_over!(dra_v1, self.channel, claims, call_error),
            DraVersion::V1beta1 => prepare_over!(dra_v1beta1, self.channel, claims, call_error),
        };
        check_answered(claims, answers.keys())?;
        Ok(answers)
    }

    /// NodeUnprepareResources: claim UID → error string ("" on success).
    pub async fn unprepare(
        &self,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, String>, KubeletDraError> {
        let call_error = |status| KubeletDraError::Call {
            call: "NodeUnprepareResources",
            path: self.endpoint(),
            status,
        };
        let answers: BTreeMap<String, String> = match self.version {
            DraVersion::V1 => unprepare_over!(dra_v1, self.channel, claims, call_error),
            DraVersion::V1beta1 => unprepare_over!(dra_v1beta1, self.channel, claims, call_error),
        };
        check_answered(claims, answers.keys())?;
        Ok(answers)
    }
}

/// A device's health as kubelet holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceHealthState {
    Healthy,
    Unhealthy {
        message: String,
    },
    /// Never reported, or not for [`HEALTH_TIMEOUT`].
    Unknown,
}

/// What one report said of a device, stamped on receipt as kubelet does.
#[derive(Debug, Clone)]
struct Received {
    healthy: bool,
    message: String,
    at: tokio::time::Instant,
}

type ReceivedMap = std::sync::Arc<std::sync::Mutex<BTreeMap<(String, String), Received>>>;

/// An open health stream, read in the background as kubelet reads it.
pub struct HealthWatch {
    pub api: HealthApi,
    received: ReceivedMap,
    reports: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    reader: tokio::task::JoinHandle<Result<(), tonic::Status>>,
}

/// Reads `$stream` of `$api` messages into `$received` until it ends.
macro_rules! read_health {
    ($api:ident, $stream:expr, $received:expr, $reports:expr) => {{
        let mut stream = $stream;
        let received: ReceivedMap = $received;
        let reports = $reports;
        tokio::spawn(async move {
            while let Some(message) = stream.message().await? {
                let at = tokio::time::Instant::now();
                let mut map = shared_state::sync::lock(&received);
                for device in message.devices {
                    let Some(id) = device.device else { continue };
                    map.insert(
                        (id.pool_name, id.device_name),
                        Received {
                            healthy: device.health == $api::HealthStatus::Healthy as i32,
                            message: device.message,
                            at,
                        },
                    );
                }
                reports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
    }};
}

impl HealthWatch {
    /// The state of `device` of `pool` now.
    pub fn state(&self, pool: &str, device: &str) -> DeviceHealthState {
        let map = shared_state::sync::lock(&self.received);
        match map.get(&(pool.to_string(), device.to_string())) {
            Some(r) if r.at.elapsed() <= HEALTH_TIMEOUT && r.healthy => DeviceHealthState::Healthy,
            Some(r) if r.at.elapsed() <= HEALTH_TIMEOUT => DeviceHealthState::Unhealthy {
                message: r.message.clone(),
            },
            _ => DeviceHealthState::Unknown,
        }
    }

    /// Every device reported so far, with its state now.
    pub fn states(&self) -> BTreeMap<(String, String), DeviceHealthState> {
        let keys: Vec<(String, String)> = shared_state::sync::lock(&self.received)
            .keys()
            .cloned()
            .collect();
        keys.into_iter()
            .map(|(pool, device)| {
                let state = self.state(&pool, &device);
                ((pool, device), state)
            })
            .collect()
    }

    /// Reports received so far.
    pub fn reports(&self) -> usize {
        self.reports.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the stream is still open.
    pub fn is_open(&self) -> bool {
        !self.reader.is_finished()
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl KubeletDra {
    /// Opens the health stream a kubelet of `release` opens for this plugin,
    /// or `None` when that kubelet opens none.
    pub async fn watch_health(
        &self,
        release: KubeletRelease,
    ) -> Result<Option<HealthWatch>, KubeletDraError> {
        let Some(api) = release.health_api(&self.info.supported_versions) else {
            return Ok(None);
        };
        let received = ReceivedMap::default();
        let reports = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let call_error = |status| KubeletDraError::Call {
            call: "NodeWatchResources",
            path: self.endpoint(),
            status,
        };
        let reader = match api {
            HealthApi::V1 => {
                let stream = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
                    self.channel.clone(),
                )
                .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                .await
                .map_err(call_error)?
                .into_inner();
                read_health!(health_v1, stream, received.clone(), reports.clone())
            }
            HealthApi::V1alpha1 => {
                let stream =
                    health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
                        self.channel.clone(),
                    )
                    .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
                    .await
                    .map_err(call_error)?
                    .into_inner();
                read_health!(health_v1alpha1, stream, received.clone(), reports.clone())
            }
        };
        Ok(Some(HealthWatch {
            api,
            received,
            reports,
            reader,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(versions: &[&str], endpoint: &str) -> registration::PluginInfo {
        registration::PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: "dra.cpu".into(),
            endpoint: endpoint.into(),
            supported_versions: versions.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn validation_follows_validate_supported_services() {
        use DraVersion::{V1beta1, V1};
        let all = [
            DRA_V1_VERSION,
            DRA_V1BETA1_VERSION,
            HEALTH_V1_VERSION,
            HEALTH_V1ALPHA1_VERSION,
        ];
        let cases: Vec<(
            registration::PluginInfo,
            DraVersion,
            Result<DraVersion, &str>,
        )> = vec![
            (info(&all, "/x/dra.sock"), V1, Ok(V1)),
            // A kubelet serving only v1beta1 picks it from the same list.
            (info(&all, "/x/dra.sock"), V1beta1, Ok(V1beta1)),
            // The plugin's order decides, not the kubelet's preference.
            (
                info(&[DRA_V1BETA1_VERSION, DRA_V1_VERSION], "/x"),
                V1,
                Ok(V1beta1),
            ),
            (info(&[DRA_V1BETA1_VERSION], "/x"), V1, Ok(V1beta1)),
            // Entries kubelet does not serve are skipped.
            (info(&[HEALTH_V1_VERSION, DRA_V1_VERSION], "/x"), V1, Ok(V1)),
            (
                info(&[DRA_V1_VERSION], "/x"),
                V1beta1,
                Err("none of services"),
            ),
            (
                info(&["k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"], "/x"),
                V1,
                Err("none of services"),
            ),
            (info(&[], "/x"), V1, Err("empty list")),
            // The endpoint is not checked at registration.
            (info(&all, "/nonexistent/dra.sock"), V1, Ok(V1)),
            (
                registration::PluginInfo {
                    r#type: "CSIPlugin".into(),
                    ..info(&all, "/x")
                },
                V1,
                Err("no handler registered for plugin type"),
            ),
        ];
        for (i, (info, version, want)) in cases.into_iter().enumerate() {
            match (validate_info(&info, version), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "case {i}"),
                (Err(e), Err(fragment)) => assert!(e.contains(fragment), "case {i}: {e}"),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn health_stream_choice_follows_pick_health_service() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases = [
            (KubeletRelease::V1_37, list(&[DRA_V1_VERSION]), None),
            (
                KubeletRelease::V1_37,
                list(&[DRA_V1_VERSION, HEALTH_V1ALPHA1_VERSION]),
                Some(HealthApi::V1alpha1),
            ),
            (
                KubeletRelease::V1_37,
                list(&[HEALTH_V1ALPHA1_VERSION, HEALTH_V1_VERSION]),
                Some(HealthApi::V1),
            ),
            (
                KubeletRelease::V1_34,
                list(&[DRA_V1_VERSION]),
                Some(HealthApi::V1alpha1),
            ),
            (
                KubeletRelease::V1_34,
                list(&[HEALTH_V1_VERSION]),
                Some(HealthApi::V1alpha1),
            ),
        ];
        for (release, supported, want) in cases {
            assert_eq!(
                release.health_api(&supported),
                want,
                "{release:?} {supported:?}"
            );
        }
    }

    #[test]
    fn cdi_ids_follow_the_containers_request() {
        let device = |requests: &[&str], ids: &[&str]| PreparedDevice {
            request_names: requests.iter().map(|s| s.to_string()).collect(),
            pool_name: "node".into(),
            device_name: "d".into(),
            cdi_device_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        let devices = [
            device(&["cpus"], &["a"]),
            device(&["cpus"], &[]),
            device(&["helper"], &["a"]),
            device(&["cpus/big"], &["b"]),
        ];
        assert_eq!(cdi_ids_for_container(&devices, ""), ["a", "a", "b"]);
        assert_eq!(cdi_ids_for_container(&devices, "cpus"), ["a"]);
        assert_eq!(cdi_ids_for_container(&devices, "helper"), ["a"]);
        assert!(cdi_ids_for_container(&devices, "big").is_empty());
    }

    #[test]
    fn answers_must_cover_exactly_the_claims_asked_for() {
        let claim = |uid: &str| Claim {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
        };
        let asked = [claim("a"), claim("b")];
        let uids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_answered(&asked, uids(&["b", "a"]).iter()).is_ok());
        assert!(matches!(
            check_answered(&asked, uids(&["a"]).iter()),
            Err(KubeletDraError::MissingClaim(uid)) if uid == "b"
        ));
        assert!(matches!(
            check_answered(&asked, uids(&["a", "b", "c"]).iter()),
            Err(KubeletDraError::UnknownClaim(uid)) if uid == "c"
        ));
    }

    #[tokio::test]
    async fn a_socket_renamed_onto_a_registered_name_is_a_new_plugin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dra.cpu-reg.sock");
        let _first = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let _hidden = std::os::unix::net::UnixListener::bind(dir.path().join(".tmp.sock"))
            .expect("bind hidden");
        std::fs::write(dir.path().join("not-a-socket"), "x").expect("file");
        let mut seen = RegistrySnapshot::default();
        assert_eq!(seen.new_sockets(dir.path()), std::slice::from_ref(&path));
        assert!(seen.new_sockets(dir.path()).is_empty(), "seen once");
        // A restarted plugin binds a temporary name and renames it over.
        let temporary = dir.path().join(".dra.cpu-reg.sock.2.tmp");
        let _second = std::os::unix::net::UnixListener::bind(&temporary).expect("bind");
        assert!(
            seen.new_sockets(dir.path()).is_empty(),
            "dot names are ignored"
        );
        std::fs::rename(&temporary, &path).expect("rename");
        assert_eq!(seen.new_sockets(dir.path()), [path]);
    }
}
