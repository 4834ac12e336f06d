//! Pods and containers as kubelet describes them to the runtime.

use std::collections::{BTreeMap, HashMap};

use k8s_cri::v1 as cri;

use super::resources::kubelet_cpu_resources;
use crate::image::WORKLOAD_IMAGE;

/// The cgroup parent kubelet's cgroupfs driver gives a pod.
///
/// Pod UIDs are unique, so pods of concurrent harness instances never share a
/// cgroup; `/kubepods` itself is shared and left in place.
pub fn pod_cgroup_parent(uid: &str) -> String {
    format!("/kubepods/pod{uid}")
}

pub(super) fn host_network_namespaces() -> cri::NamespaceOption {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
