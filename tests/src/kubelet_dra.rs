//! Kubelet stand-in, DRA side: finds a plugin's registration socket in a
//! plugins-registry directory, registers it the way kubelet's plugin
//! watcher does, and then calls NodePrepareResources and
//! NodeUnprepareResources over the DRA API version it negotiated.
//!
//! Validation follows kubelet: the type must be `DRAPlugin`, the name the
//! expected driver, the endpoint an existing socket, and the supported
//! versions (newest first) must contain a version kubelet speaks. A failed
//! validation is reported back with `NotifyRegistrationStatus(false, why)`,
//! as kubelet does, and returned as an error.

use dra_cpu_proto::kubelet::{
    dra_v1, dra_v1beta1, registration, DRA_PLUGIN_TYPE, DRA_V1BETA1_VERSION, DRA_V1_VERSION,
};
use dra_cpu_proto::transport::connect_unix;
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

/// How often the registry directory is looked at while waiting.
const POLL: Duration = Duration::from_millis(20);

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

/// Checks a `PluginInfo` like kubelet and picks the version to talk.
pub fn validate_info(
    info: &registration::PluginInfo,
    driver: &str,
    version: DraVersion,
) -> Result<(), String> {
    if info.r#type != DRA_PLUGIN_TYPE {
        return Err(format!(
            "plugin type {:?}, expected {DRA_PLUGIN_TYPE:?}",
            info.r#type
        ));
    }
    if info.name != driver {
        return Err(format!("plugin name {:?}, expected {driver:?}", info.name));
    }
    if info.endpoint.is_empty() {
        return Err("empty endpoint".to_string());
    }
    let endpoint_is_socket = std::fs::metadata(&info.endpoint)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if !endpoint_is_socket {
        return Err(format!("endpoint {} is not a socket", info.endpoint));
    }
    let known = [DRA_V1_VERSION, DRA_V1BETA1_VERSION];
    let first_known = info
        .supported_versions
        .iter()
        .position(|v| known.contains(&v.as_str()));
    match first_known {
        None => {
            return Err(format!(
                "none of the supported versions {:?} is one of {known:?}",
                info.supported_versions
            ))
        }
        Some(i)
            if info.supported_versions[i] != DRA_V1_VERSION
                && info.supported_versions.iter().any(|v| v == DRA_V1_VERSION) =>
        {
            return Err(format!(
                "supported versions {:?} are not newest first",
                info.supported_versions
            ))
        }
        Some(_) => {}
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| v == version.advertised())
    {
        return Err(format!(
            "version {} not among {:?}",
            version.advertised(),
            info.supported_versions
        ));
    }
    Ok(())
}

/// A registered plugin.
#[derive(Debug, Clone)]
pub struct KubeletDra {
    pub info: registration::PluginInfo,
    pub registration_socket: PathBuf,
    version: DraVersion,
    channel: Channel,
}

fn find_socket(dir: &Path, driver: &str) -> Option<PathBuf> {
    let wanted = format!("{driver}-reg.sock");
    let path = dir.join(wanted);
    let is_socket = std::fs::metadata(&path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    is_socket.then_some(path)
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
        let request = $api::NodePrepareResourcesRequest {
            claims: claims_of!($api, $claims),
        };
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
        let request = $api::NodeUnprepareResourcesRequest {
            claims: claims_of!($api, $claims),
        };
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

impl KubeletDra {
    /// Wait for `<dir>/<driver>-reg.sock`, then register it and connect to
    /// its endpoint for `version` calls.
    pub async fn register(
        dir: &Path,
        driver: &str,
        version: DraVersion,
        wait: Duration,
    ) -> Result<KubeletDra, KubeletDraError> {
        let deadline = tokio::time::Instant::now() + wait;
        let socket = loop {
            if let Some(socket) = find_socket(dir, driver) {
                break socket;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KubeletDraError::NoSocket {
                    driver: driver.to_string(),
                    dir: dir.to_path_buf(),
                    waited: wait,
                });
            }
            tokio::time::sleep(POLL).await;
        };
        let connect = |path: PathBuf| async move {
            connect_unix(&path)
                .await
                .map_err(|e| KubeletDraError::Connect {
                    path: path.clone(),
                    reason: e.to_string(),
                })
        };
        let mut registrar = registration::registration_client::RegistrationClient::new(
            connect(socket.clone()).await?,
        );
        let info = registrar
            .get_info(registration::InfoRequest {})
            .await
            .map_err(|status| KubeletDraError::Call {
                call: "GetInfo",
                path: socket.clone(),
                status,
            })?
            .into_inner();
        let verdict = validate_info(&info, driver, version);
        let status = registration::RegistrationStatus {
            plugin_registered: verdict.is_ok(),
            error: verdict.clone().err().unwrap_or_default(),
        };
        registrar
            .notify_registration_status(status)
            .await
            .map_err(|status| KubeletDraError::Call {
                call: "NotifyRegistrationStatus",
                path: socket.clone(),
                status,
            })?;
        verdict.map_err(KubeletDraError::Invalid)?;
        let channel = connect(PathBuf::from(&info.endpoint)).await?;
        Ok(KubeletDra {
            info,
            registration_socket: socket,
            version,
            channel,
        })
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
        for claim in claims {
            if !answers.contains_key(&claim.uid) {
                return Err(KubeletDraError::MissingClaim(claim.uid.clone()));
            }
        }
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
        for claim in claims {
            if !answers.contains_key(&claim.uid) {
                return Err(KubeletDraError::MissingClaim(claim.uid.clone()));
            }
        }
        Ok(answers)
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

    #[tokio::test]
    async fn validation_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("dra.sock");
        let _listener = tokio::net::UnixListener::bind(&sock).expect("bind");
        let endpoint = sock.to_string_lossy().into_owned();
        let both = [DRA_V1_VERSION, DRA_V1BETA1_VERSION];
        let cases: Vec<(registration::PluginInfo, DraVersion, Option<&str>)> = vec![
            (info(&both, &endpoint), DraVersion::V1, None),
            (info(&both, &endpoint), DraVersion::V1beta1, None),
            (
                info(&[DRA_V1BETA1_VERSION], &endpoint),
                DraVersion::V1,
                Some("not among"),
            ),
            (
                info(&[DRA_V1BETA1_VERSION, DRA_V1_VERSION], &endpoint),
                DraVersion::V1,
                Some("newest first"),
            ),
            (
                info(&["k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"], &endpoint),
                DraVersion::V1,
                Some("none of the supported versions"),
            ),
            (
                info(&both, "/nonexistent/dra.sock"),
                DraVersion::V1,
                Some("is not a socket"),
            ),
            (
                registration::PluginInfo {
                    r#type: "CSIPlugin".into(),
                    ..info(&both, &endpoint)
                },
                DraVersion::V1,
                Some("plugin type"),
            ),
            (
                registration::PluginInfo {
                    name: "other".into(),
                    ..info(&both, &endpoint)
                },
                DraVersion::V1,
                Some("plugin name"),
            ),
        ];
        for (i, (info, version, want)) in cases.into_iter().enumerate() {
            match (validate_info(&info, "dra.cpu", version), want) {
                (Ok(()), None) => {}
                (Err(e), Some(fragment)) => assert!(e.contains(fragment), "case {i}: {e}"),
                (got, want) => panic!("case {i}: got {got:?}, want error {want:?}"),
            }
        }
    }
}
