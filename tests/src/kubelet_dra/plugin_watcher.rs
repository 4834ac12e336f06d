//! Discovery and registration, as kubelet's plugin watcher runs them.

use dra_cpu_proto::kubelet::{registration, DRA_PLUGIN_TYPE, DRA_V1BETA1_VERSION, DRA_V1_VERSION};
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    connect, DraVersion, KubeletDra, KubeletDraError, GET_INFO_TIMEOUT, KUBELET_DRA_SERVICES,
    NOTIFY_TIMEOUT, POLL, RECONCILE,
};

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

    /// Counts `socket` as not seen, so the next look finds it again.
    pub fn forget(&mut self, socket: &Path) {
        self.seen.remove(socket);
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
    let channel = dra_cpu_transport::connect_unix_lazy(Path::new(&info.endpoint)).map_err(|e| {
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
        let mut failed: Option<KubeletDraError> = None;
        loop {
            let mut retry = false;
            for socket in seen.new_sockets(dir) {
                match register_socket(&socket, driver, version).await {
                    Ok(Some(kubelet)) => return Ok(kubelet),
                    Ok(None) => {}
                    // Kubelet's plugin manager registers again at its next
                    // reconcile (every second) a socket whose registration
                    // failed (a refused dial, a GetInfo past its 1 s
                    // deadline on a loaded node), as long as it is there.
                    Err(e @ (KubeletDraError::Connect { .. } | KubeletDraError::Call { .. })) => {
                        seen.forget(&socket);
                        failed = Some(e);
                        retry = true;
                    }
                    Err(e) => return Err(e),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(failed.unwrap_or_else(|| KubeletDraError::NoSocket {
                    driver: driver.to_string(),
                    dir: dir.to_path_buf(),
                    waited: wait,
                }));
            }
            tokio::time::sleep(if retry { RECONCILE } else { POLL }).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_cpu_proto::kubelet::{HEALTH_V1ALPHA1_VERSION, HEALTH_V1_VERSION};

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
