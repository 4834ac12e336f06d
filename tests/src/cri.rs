//! The CRI side of a kubelet stand-in: a client of containerd's CRI that
//! creates pods and containers the way kubelet does (host network, no
//! hostname, cgroup parent `/kubepods/pod<uid>`, CPU shares and CFS quota
//! computed from the CPU request and limit with kubelet's formulas).
//!
//! Pods always use host networking because these machines have no CNI.
//!
//! CDI devices: containerd 1.7.24 (Debian trixie) honours both the CRI
//! `CDI_devices` field that kubelet sends since CRI v1.28 and the older
//! `cdi.k8s.io/<name>` annotations; an unknown device makes CreateContainer
//! fail with the device name in the error. The harness tests check both.
//!
//! Not modelled: kubelet's QoS `oom_score_adj` (containerd runs with
//! `restrict_oom_score_adj`, which would clamp it anyway) and memory limits.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::image::WORKLOAD_IMAGE;

/// Kubelet's `cm.MinShares`: the shares of a container without a CPU request.
pub const MIN_SHARES: i64 = 2;
/// Kubelet's `cm.MaxShares`.
pub const MAX_SHARES: i64 = 262_144;
/// Kubelet's `cm.SharesPerCPU`.
pub const SHARES_PER_CPU: i64 = 1024;
/// Kubelet's default CFS period (`cm.QuotaPeriod`, microseconds).
pub const QUOTA_PERIOD: i64 = 100_000;
/// Kubelet's `cm.MinQuotaPeriod`: the smallest quota it ever sets.
pub const MIN_QUOTA: i64 = 1000;

/// How long an exec may run before the runtime gives up on it.
const EXEC_TIMEOUT_SECONDS: i64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("cannot connect to the CRI socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("CRI {call} failed ({code:?}): {message}")]
    Call {
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("CRI {call} answered without {what}")]
    Missing {
        call: &'static str,
        what: &'static str,
    },
    #[error("CRI verbose status of container {id} has no usable pid: {detail}")]
    NoPid { id: String, detail: String },
    #[error("cannot record pod uid {uid} in {path}: {source}")]
    Ledger {
        uid: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("exec {command:?} in container {id} exited {exit_code}: {stderr}")]
    ExecFailed {
        id: String,
        command: Vec<String>,
        exit_code: i32,
        stderr: String,
    },
}

impl CriError {
    /// The runtime's own error text, for asserting why a call was refused.
    pub fn runtime_message(&self) -> Option<&str> {
        match self {
            CriError::Call { message, .. } => Some(message),
            _ => None,
        }
    }
}

fn call_error(call: &'static str) -> impl FnOnce(tonic::Status) -> CriError {
    move |status| CriError::Call {
        call,
        code: status.code(),
        message: status.message().to_string(),
    }
}

/// Kubelet's `MilliCPUToShares`: `max(2, milli*1024/1000)`, capped at 262144;
/// no request (0) means the minimum.
pub fn milli_cpu_to_shares(milli_cpu: i64) -> i64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    (milli_cpu.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// Kubelet's `MilliCPUToQuota`: `milli*period/1000`, at least 1000; no limit
/// (0) means quota 0, which runtimes read as "unlimited".
pub fn milli_cpu_to_quota(milli_cpu: i64, period: i64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    (milli_cpu.saturating_mul(period) / 1000).max(MIN_QUOTA)
}

/// The CPU part of a container's resources as kubelet computes them
/// (`calculateLinuxResources` with the CFS quota on and the default period):
/// a missing request defaults to the limit; the period is always set.
pub fn kubelet_cpu_resources(
    request_milli: Option<i64>,
    limit_milli: Option<i64>,
) -> cri::LinuxContainerResources {
    let request = request_milli.unwrap_or(0);
    let limit = limit_milli.unwrap_or(0);
    let shares = if request == 0 && limit != 0 {
        milli_cpu_to_shares(limit)
    } else {
        milli_cpu_to_shares(request)
    };
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period: QUOTA_PERIOD,
        cpu_quota: milli_cpu_to_quota(limit, QUOTA_PERIOD),
        ..Default::default()
    }
}

/// What kubelet sends in CRI `UpdateContainerResources` when it resizes a
/// running container in place (`kuberuntime`'s `updateContainerResources`
/// calls `generateContainerResources`, the same `calculateLinuxResources` as
/// at creation): the new shares, quota and period, and no cpuset. (Only the
/// static CPU manager's reconcile sends `cpuset_cpus`, in an update of its
/// own.)
pub fn kubelet_resize_resources(
    request_milli: Option<i64>,
    limit_milli: Option<i64>,
) -> cri::LinuxContainerResources {
    kubelet_cpu_resources(request_milli, limit_milli)
}

/// A fresh UID in the kernel's UUID format, as the API server gives pods and
/// claims.
pub fn new_uid() -> String {
    if let Ok(uuid) = std::fs::read_to_string("/proc/sys/kernel/random/uuid") {
        return uuid.trim().to_string();
    }
    // Without procfs: time and a counter are unique within this machine.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = std::process::id();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (nanos >> 32) as u32,
        (nanos >> 16) as u16,
        pid & 0xfff,
        n & 0xfff,
        nanos as u64 & 0xffff_ffff_ffff
    )
}

/// The cgroup parent kubelet's cgroupfs driver gives a pod.
///
/// Pod UIDs are unique, so pods of concurrent harness instances never share a
/// cgroup; `/kubepods` itself is shared and left in place.
pub fn pod_cgroup_parent(uid: &str) -> String {
    format!("/kubepods/pod{uid}")
}

fn host_network_namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// A running pod sandbox and the config it was created with (CreateContainer
/// needs it again, as kubelet sends it).
#[derive(Debug, Clone)]
pub struct PodSandbox {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub config: cri::PodSandboxConfig,
}

/// What a pod spec says about one container, in the terms kubelet turns into
/// a CRI `ContainerConfig`.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    /// Replaces the image entrypoint (pod spec `command`).
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Fully qualified CDI device names (`vendor/class=name`), as kubelet
    /// passes prepared DRA claims.
    pub cdi_devices: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    /// `resources.requests.cpu` in millicores.
    pub cpu_request_milli: Option<i64>,
    /// `resources.limits.cpu` in millicores.
    pub cpu_limit_milli: Option<i64>,
}

impl ContainerSpec {
    /// A container of the test image that sleeps until stopped.
    pub fn sleeper(name: &str) -> Self {
        ContainerSpec {
            name: name.to_string(),
            image: WORKLOAD_IMAGE.to_string(),
            command: vec!["/bin/sleep".into(), "infinity".into()],
            args: Vec::new(),
            env: Vec::new(),
            cdi_devices: Vec::new(),
            annotations: BTreeMap::new(),
            cpu_request_milli: None,
            cpu_limit_milli: None,
        }
    }

    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    pub fn with_cdi_device(mut self, qualified_name: &str) -> Self {
        self.cdi_devices.push(qualified_name.to_string());
        self
    }

    pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    pub fn with_cpu(mut self, request_milli: Option<i64>, limit_milli: Option<i64>) -> Self {
        self.cpu_request_milli = request_milli;
        self.cpu_limit_milli = limit_milli;
        self
    }

    /// The CRI config kubelet would send for this container in `pod`.
    pub fn to_cri(&self, pod: &PodSandbox) -> cri::ContainerConfig {
        let labels = HashMap::from([
            (
                "io.kubernetes.container.name".to_string(),
                self.name.clone(),
            ),
            ("io.kubernetes.pod.name".to_string(), pod.name.clone()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                pod.namespace.clone(),
            ),
            ("io.kubernetes.pod.uid".to_string(), pod.uid.clone()),
        ]);
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: self.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: self.command.clone(),
            args: self.args.clone(),
            envs: self
                .env
                .iter()
                .map(|(key, value)| cri::KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            labels,
            annotations: self.annotations.clone().into_iter().collect(),
            log_path: if pod.config.log_directory.is_empty() {
                String::new()
            } else {
                format!("{}/0.log", self.name)
            },
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(kubelet_cpu_resources(
                    self.cpu_request_milli,
                    self.cpu_limit_milli,
                )),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(host_network_namespaces()),
                    ..Default::default()
                }),
            }),
            cdi_devices: self
                .cdi_devices
                .iter()
                .map(|name| cri::CdiDevice { name: name.clone() })
                .collect(),
            ..Default::default()
        }
    }
}

/// What an exec printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// A CRI client speaking to one containerd over its Unix socket.
#[derive(Debug, Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    socket: PathBuf,
    /// File where every pod UID is appended before its sandbox is created, so
    /// the owner of the containerd can remove pod cgroups even after a crash.
    pod_ledger: Option<PathBuf>,
    /// Parent of the pods' log directories (none: container output dropped).
    log_root: Option<PathBuf>,
}

impl CriClient {
    /// Connects to the CRI socket at `socket` (no request is made yet).
    pub async fn connect(socket: &Path) -> Result<Self, CriError> {
        let path = socket.to_path_buf();
        let connector_path = path.clone();
        // The URI is required by tonic but unused: every connection goes to
        // the Unix socket.
        let channel =
            Endpoint::from_static("http://[::1]:50051")
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = connector_path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|source| CriError::Connect {
                    path: path.clone(),
                    source,
                })?;
        Ok(CriClient {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            socket: path,
            pod_ledger: None,
            log_root: None,
        })
    }

    /// Records pod UIDs in `ledger` before creating their sandboxes.
    pub fn with_pod_ledger(mut self, ledger: PathBuf) -> Self {
        self.pod_ledger = Some(ledger);
        self
    }

    /// Gives every pod a log directory under `root`, like `/var/log/pods`.
    pub fn with_log_root(mut self, root: PathBuf) -> Self {
        self.log_root = Some(root);
        self
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub async fn version(&mut self) -> Result<cri::VersionResponse, CriError> {
        let response = self
            .runtime
            .version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await
            .map_err(call_error("Version"))?;
        Ok(response.into_inner())
    }

    /// Whether the CRI image service knows `image` (by tag or digest).
    pub async fn image_present(&mut self, image: &str) -> Result<bool, CriError> {
        let response = self
            .images
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .map_err(call_error("ImageStatus"))?;
        Ok(response.into_inner().image.is_some())
    }

    fn record_pod(&self, uid: &str) -> Result<(), CriError> {
        let Some(ledger) = &self.pod_ledger else {
            return Ok(());
        };
        let ledger_error = |source| CriError::Ledger {
            uid: uid.to_string(),
            path: ledger.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(ledger)
            .map_err(ledger_error)?;
        writeln!(file, "{uid}").map_err(ledger_error)?;
        file.sync_all().map_err(ledger_error)
    }

    /// RunPodSandbox as kubelet sends it for a host-network pod.
    pub async fn run_pod(
        &mut self,
        name: &str,
        namespace: &str,
        uid: &str,
    ) -> Result<PodSandbox, CriError> {
        self.record_pod(uid)?;
        let log_directory = match &self.log_root {
            Some(root) => {
                let dir = root.join(format!("{namespace}_{name}_{uid}"));
                // Best effort: without it containerd only loses the output.
                let _ = std::fs::create_dir_all(&dir);
                dir.to_string_lossy().to_string()
            }
            None => String::new(),
        };
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.to_string(),
                namespace: namespace.to_string(),
                attempt: 0,
            }),
            // Host network pods get no hostname of their own.
            hostname: String::new(),
            log_directory,
            labels: HashMap::from([
                ("io.kubernetes.pod.name".to_string(), name.to_string()),
                (
                    "io.kubernetes.pod.namespace".to_string(),
                    namespace.to_string(),
                ),
                ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
            ]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: pod_cgroup_parent(uid),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network_namespaces()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let response = self
            .runtime
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .map_err(call_error("RunPodSandbox"))?;
        Ok(PodSandbox {
            id: response.into_inner().pod_sandbox_id,
            name: name.to_string(),
            namespace: namespace.to_string(),
            uid: uid.to_string(),
            config,
        })
    }

    pub async fn create_container(
        &mut self,
        pod: &PodSandbox,
        spec: &ContainerSpec,
    ) -> Result<String, CriError> {
        let response = self
            .runtime
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(spec.to_cri(pod)),
                sandbox_config: Some(pod.config.clone()),
            })
            .await
            .map_err(call_error("CreateContainer"))?;
        Ok(response.into_inner().container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<(), CriError> {
        self.runtime
            .start_container(cri::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map_err(call_error("StartContainer"))?;
        Ok(())
    }

    /// CreateContainer then StartContainer, as kubelet does for each container.
    pub async fn run_container(
        &mut self,
        pod: &PodSandbox,
        spec: &ContainerSpec,
    ) -> Result<String, CriError> {
        let id = self.create_container(pod, spec).await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    pub async fn exec_sync(&mut self, id: &str, command: &[&str]) -> Result<ExecOutput, CriError> {
        let response = self
            .runtime
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.to_string(),
                cmd: command.iter().map(|s| s.to_string()).collect(),
                timeout: EXEC_TIMEOUT_SECONDS,
            })
            .await
            .map_err(call_error("ExecSync"))?
            .into_inner();
        Ok(ExecOutput {
            stdout: String::from_utf8_lossy(&response.stdout).to_string(),
            stderr: String::from_utf8_lossy(&response.stderr).to_string(),
            exit_code: response.exit_code,
        })
    }

    /// ExecSync that must exit 0; returns its stdout.
    pub async fn exec_ok(&mut self, id: &str, command: &[&str]) -> Result<String, CriError> {
        let output = self.exec_sync(id, command).await?;
        if output.exit_code != 0 {
            return Err(CriError::ExecFailed {
                id: id.to_string(),
                command: command.iter().map(|s| s.to_string()).collect(),
                exit_code: output.exit_code,
                stderr: output.stderr,
            });
        }
        Ok(output.stdout)
    }

    pub async fn stop_container(&mut self, id: &str, timeout_seconds: i64) -> Result<(), CriError> {
        self.runtime
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: timeout_seconds,
            })
            .await
            .map_err(call_error("StopContainer"))?;
        Ok(())
    }

    pub async fn remove_container(&mut self, id: &str) -> Result<(), CriError> {
        self.runtime
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map_err(call_error("RemoveContainer"))?;
        Ok(())
    }

    pub async fn stop_pod(&mut self, pod_sandbox_id: &str) -> Result<(), CriError> {
        self.runtime
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: pod_sandbox_id.to_string(),
            })
            .await
            .map_err(call_error("StopPodSandbox"))?;
        Ok(())
    }

    pub async fn remove_pod(&mut self, pod_sandbox_id: &str) -> Result<(), CriError> {
        self.runtime
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod_sandbox_id.to_string(),
            })
            .await
            .map_err(call_error("RemovePodSandbox"))?;
        Ok(())
    }

    /// StopPodSandbox then RemovePodSandbox (which removes its containers).
    pub async fn delete_pod(&mut self, pod_sandbox_id: &str) -> Result<(), CriError> {
        self.stop_pod(pod_sandbox_id).await?;
        self.remove_pod(pod_sandbox_id).await
    }

    pub async fn update_container_resources(
        &mut self,
        id: &str,
        resources: cri::LinuxContainerResources,
    ) -> Result<(), CriError> {
        self.runtime
            .update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: id.to_string(),
                linux: Some(resources),
                ..Default::default()
            })
            .await
            .map_err(call_error("UpdateContainerResources"))?;
        Ok(())
    }

    /// Kubelet's in-place resize of container `id` to a new CPU request and
    /// limit (see [`kubelet_resize_resources`]).
    pub async fn resize_container(
        &mut self,
        id: &str,
        request_milli: Option<i64>,
        limit_milli: Option<i64>,
    ) -> Result<(), CriError> {
        self.update_container_resources(id, kubelet_resize_resources(request_milli, limit_milli))
            .await
    }

    /// Containers, optionally only those of one pod sandbox.
    pub async fn list_containers(
        &mut self,
        pod_sandbox_id: Option<&str>,
    ) -> Result<Vec<cri::Container>, CriError> {
        let filter = pod_sandbox_id.map(|id| cri::ContainerFilter {
            pod_sandbox_id: id.to_string(),
            ..Default::default()
        });
        let response = self
            .runtime
            .list_containers(cri::ListContainersRequest { filter })
            .await
            .map_err(call_error("ListContainers"))?;
        Ok(response.into_inner().containers)
    }

    pub async fn list_pods(&mut self) -> Result<Vec<cri::PodSandbox>, CriError> {
        let response = self
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .map_err(call_error("ListPodSandbox"))?;
        Ok(response.into_inner().items)
    }

    /// ContainerStatus with the runtime's verbose info (`info` holds JSON
    /// with the pid and the OCI runtime spec).
    pub async fn container_status(
        &mut self,
        id: &str,
    ) -> Result<cri::ContainerStatusResponse, CriError> {
        let response = self
            .runtime
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .map_err(call_error("ContainerStatus"))?;
        Ok(response.into_inner())
    }

    /// The host PID of the container's init process.
    pub async fn container_pid(&mut self, id: &str) -> Result<u32, CriError> {
        let status = self.container_status(id).await?;
        let info = status.info.get("info").ok_or(CriError::NoPid {
            id: id.to_string(),
            detail: "verbose info has no \"info\" entry".into(),
        })?;
        pid_from_verbose_info(info).map_err(|detail| CriError::NoPid {
            id: id.to_string(),
            detail,
        })
    }
}

/// The `pid` field of containerd's verbose container info JSON.
pub fn pid_from_verbose_info(info: &str) -> Result<u32, String> {
    let value: serde_json::Value =
        serde_json::from_str(info).map_err(|e| format!("info is not JSON: {e}"))?;
    let pid = value
        .get("pid")
        .and_then(|p| p.as_u64())
        .ok_or_else(|| "info has no numeric \"pid\"".to_string())?;
    match u32::try_from(pid) {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(format!("pid {pid} is not a running process")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shares_match_kubelet() {
        // (milli CPU, expected shares) from kubelet's MilliCPUToShares.
        let table = [
            (0, 2),
            (1, 2),
            (2, 2),
            (3, 3),
            (100, 102),
            (250, 256),
            (1000, 1024),
            (1500, 1536),
            (256_000, 262_144),
            (300_000, 262_144),
        ];
        for (milli, shares) in table {
            assert_eq!(milli_cpu_to_shares(milli), shares, "milli {milli}");
        }
    }

    #[test]
    fn a_resize_sends_the_new_cpu_fields_and_no_cpuset() {
        // (request, limit, shares, quota) as kubelet computes them.
        let table = [
            (None, None, 2, 0),
            (Some(500), None, 512, 0),
            (Some(500), Some(1000), 512, 100_000),
            (None, Some(250), 256, 25_000),
        ];
        for (request, limit, shares, quota) in table {
            let r = kubelet_resize_resources(request, limit);
            assert_eq!(
                (r.cpu_shares, r.cpu_quota, r.cpu_period),
                (shares, quota, QUOTA_PERIOD),
                "{request:?} {limit:?}"
            );
            assert_eq!((r.cpuset_cpus.as_str(), r.cpuset_mems.as_str()), ("", ""));
        }
    }

    #[test]
    fn quota_matches_kubelet() {
        let table = [
            (0, 0),
            (1, 1000),
            (9, 1000),
            (10, 1000),
            (11, 1100),
            (500, 50_000),
            (1000, 100_000),
            (2500, 250_000),
        ];
        for (milli, quota) in table {
            assert_eq!(
                milli_cpu_to_quota(milli, QUOTA_PERIOD),
                quota,
                "milli {milli}"
            );
        }
    }

    #[test]
    fn container_resources_follow_request_and_limit() {
        // (request, limit, shares, quota)
        let table = [
            (None, None, 2, 0),
            (Some(500), None, 512, 0),
            (None, Some(2000), 2048, 200_000),
            (Some(250), Some(1000), 256, 100_000),
            (Some(1000), Some(1000), 1024, 100_000),
        ];
        for (request, limit, shares, quota) in table {
            let r = kubelet_cpu_resources(request, limit);
            assert_eq!(
                (r.cpu_shares, r.cpu_quota, r.cpu_period),
                (shares, quota, QUOTA_PERIOD),
                "request {request:?} limit {limit:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn shares_are_bounded_and_monotonic(a in 0i64..1_000_000, b in 0i64..1_000_000) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (s_lo, s_hi) = (milli_cpu_to_shares(lo), milli_cpu_to_shares(hi));
            prop_assert!((MIN_SHARES..=MAX_SHARES).contains(&s_lo));
            prop_assert!(s_lo <= s_hi);
            // The design's rule: a request of 3m or more gives shares above 2.
            prop_assert_eq!(milli_cpu_to_shares(hi) > MIN_SHARES, hi >= 3);
        }

        #[test]
        fn quota_is_zero_or_at_least_minimum(milli in 0i64..10_000_000) {
            let quota = milli_cpu_to_quota(milli, QUOTA_PERIOD);
            prop_assert!(quota == 0 || quota >= MIN_QUOTA);
            prop_assert_eq!(quota == 0, milli == 0);
        }
    }

    #[test]
    fn container_config_carries_cdi_devices_and_host_network() {
        let pod = PodSandbox {
            id: "sb".into(),
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u-1".into(),
            config: cri::PodSandboxConfig::default(),
        };
        let spec = ContainerSpec::sleeper("c")
            .with_cdi_device("dra.k8s.io/cpu=claim-1")
            .with_env("A", "1")
            .with_cpu(Some(100), None);
        let config = spec.to_cri(&pod);
        assert_eq!(config.cdi_devices[0].name, "dra.k8s.io/cpu=claim-1");
        assert_eq!(config.envs[0].key, "A");
        assert_eq!(config.labels["io.kubernetes.pod.uid"], "u-1");
        let linux = config.linux.unwrap();
        assert_eq!(linux.resources.unwrap().cpu_shares, 102);
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(pod_cgroup_parent("u-1"), "/kubepods/podu-1");
    }

    #[test]
    fn uids_are_unique_and_uuid_shaped() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(a.matches('-').count(), 4, "{a}");
    }

    #[test]
    fn pid_parsing_rejects_bad_info() {
        let table = [
            (r#"{"pid": 42}"#, Ok(42)),
            (r#"{"pid": 0}"#, Err(())),
            (r#"{"pid": "x"}"#, Err(())),
            (r#"{}"#, Err(())),
            ("not json", Err(())),
            (r#"{"pid": 99999999999}"#, Err(())),
        ];
        for (info, expected) in table {
            assert_eq!(
                pid_from_verbose_info(info).map_err(|_| ()),
                expected,
                "{info}"
            );
        }
    }
}
