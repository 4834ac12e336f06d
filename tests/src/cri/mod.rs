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

pub mod containers;
mod pods;
pub mod resources;
pub mod spec;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_unique_and_uuid_shaped() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(a.matches('-').count(), 4, "{a}");
    }
}
