//! Pod sandboxes: run, stop, remove, list; and the ledger of pods created.

use std::collections::HashMap;
use std::io::Write;

use k8s_cri::v1 as cri;

use super::spec::host_network_namespaces;
use super::spec::{pod_cgroup_parent, PodSandbox};
use super::{call_error, CriClient, CriError};

impl CriClient {
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

    pub async fn list_pods(&mut self) -> Result<Vec<cri::PodSandbox>, CriError> {
        let response = self
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .map_err(call_error("ListPodSandbox"))?;
        Ok(response.into_inner().items)
    }
}
