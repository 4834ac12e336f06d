//! Containers: create, start, exec, resize, stop, remove, status.

use k8s_cri::v1 as cri;

use super::resources::kubelet_resize_resources;
use super::spec::{ContainerSpec, PodSandbox};
use super::{call_error, CriClient, CriError};

/// How long an exec may run before the runtime gives up on it.
const EXEC_TIMEOUT_SECONDS: i64 = 30;

/// What an exec printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

impl CriClient {
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
