//! The example plugin itself, kept apart from `main.rs` so the end-to-end
//! tests run exactly this code against a real containerd.
//!
//! Behaviour, driven by container annotations:
//! - `example.dra.cpu/cpuset=<cpulist>`: the container is created pinned to
//!   `<cpulist>`; at Synchronize, running containers carrying it are
//!   re-pinned (they may have been created while the plugin was away).
//! - `example.dra.cpu/also-update=<container-id>:<cpulist>`: in the same
//!   CreateContainer reply, another running container is re-pinned.
//! - `example.dra.cpu/fail=<text>`: creation is refused with `<text>`.
//! - `example.dra.cpu/panic=<text>`: the handler panics (the client turns
//!   this into an error reply and keeps serving).
//!
//! Every event is logged to stderr and kept in memory.

use std::sync::Mutex;

use async_trait::async_trait;
use dra_cpu_nri::events::EventMask;
use dra_cpu_nri::plugin::{ContainerCreation, NriPlugin, PluginError, RuntimeInfo};
use dra_cpu_proto::nri::api::{
    Container, ContainerAdjustment, ContainerUpdate, Event, LinuxCPU, LinuxContainerAdjustment,
    LinuxContainerUpdate, LinuxResources, PodSandbox,
};

pub const CPUSET_ANNOTATION: &str = "example.dra.cpu/cpuset";
pub const ALSO_UPDATE_ANNOTATION: &str = "example.dra.cpu/also-update";
pub const FAIL_ANNOTATION: &str = "example.dra.cpu/fail";
pub const PANIC_ANNOTATION: &str = "example.dra.cpu/panic";

/// One event the plugin saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Configure {
        runtime: String,
        version: String,
    },
    Synchronize {
        pods: usize,
        containers: Vec<String>,
    },
    RunPodSandbox(String),
    StopPodSandbox(String),
    RemovePodSandbox(String),
    CreateContainer(String),
    StartContainer(String),
    StopContainer(String),
    RemoveContainer(String),
    Shutdown,
}

#[derive(Debug, Default)]
pub struct PinByAnnotation {
    seen: Mutex<Vec<Seen>>,
}

impl PinByAnnotation {
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything seen so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        shared_state::sync::lock(&self.seen).clone()
    }

    fn record(&self, event: Seen) {
        eprintln!("nri example: {event:?}");
        shared_state::sync::lock(&self.seen).push(event);
    }
}

/// Accepts Linux cpulists such as `0`, `0-3`, `1,4-5`.
pub fn valid_cpulist(text: &str) -> bool {
    !text.is_empty()
        && text.split(',').all(|range| {
            let mut ends = range.splitn(2, '-');
            let first = ends.next().map(|s| s.parse::<u32>());
            let second = ends.next().map(|s| s.parse::<u32>());
            match (first, second) {
                (Some(Ok(_)), None) => true,
                (Some(Ok(a)), Some(Ok(b))) => a <= b,
                _ => false,
            }
        })
}

/// `<container-id>:<cpulist>` from the also-update annotation.
pub fn parse_also_update(value: &str) -> Result<(String, String), PluginError> {
    match value.split_once(':') {
        Some((id, cpus)) if !id.is_empty() && valid_cpulist(cpus) => {
            Ok((id.to_string(), cpus.to_string()))
        }
        _ => Err(PluginError::failed(format!(
            "{ALSO_UPDATE_ANNOTATION}={value:?}: expected <container-id>:<cpulist>"
        ))),
    }
}

fn resources_with_cpus(cpus: &str) -> LinuxResources {
    let mut cpu = LinuxCPU::new();
    cpu.cpus = cpus.to_string();
    let mut resources = LinuxResources::new();
    resources.cpu = Some(cpu).into();
    resources
}

/// An update pinning a running container to `cpus`.
pub fn pin_update(container_id: &str, cpus: &str) -> ContainerUpdate {
    let mut linux = LinuxContainerUpdate::new();
    linux.resources = Some(resources_with_cpus(cpus)).into();
    let mut update = ContainerUpdate::new();
    update.container_id = container_id.to_string();
    update.linux = Some(linux).into();
    update
}

fn cpuset_of(container: &Container) -> Result<Option<String>, PluginError> {
    match container.annotations.get(CPUSET_ANNOTATION) {
        None => Ok(None),
        Some(cpus) if valid_cpulist(cpus) => Ok(Some(cpus.clone())),
        Some(cpus) => Err(PluginError::failed(format!(
            "{CPUSET_ANNOTATION}={cpus:?} on container {} is not a cpulist",
            container.name
        ))),
    }
}

#[async_trait]
impl NriPlugin for PinByAnnotation {
    fn events(&self) -> EventMask {
        EventMask::of(&[
            Event::RUN_POD_SANDBOX,
            Event::STOP_POD_SANDBOX,
            Event::REMOVE_POD_SANDBOX,
            Event::CREATE_CONTAINER,
            Event::START_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
        ])
    }

    async fn configure(&self, runtime: &RuntimeInfo, _config: &str) -> Result<(), PluginError> {
        self.record(Seen::Configure {
            runtime: runtime.runtime_name.clone(),
            version: runtime.runtime_version.clone(),
        });
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        self.record(Seen::Synchronize {
            pods: pods.len(),
            containers: containers.iter().map(|c| c.id.clone()).collect(),
        });
        let mut updates = Vec::new();
        for container in &containers {
            match cpuset_of(container) {
                Ok(Some(cpus)) => updates.push(pin_update(&container.id, &cpus)),
                Ok(None) => {}
                // One bad annotation must not stop the repair of the others.
                Err(err) => eprintln!("nri example: skipping {}: {err}", container.id),
            }
        }
        Ok(updates)
    }

    async fn shutdown(&self) {
        self.record(Seen::Shutdown);
    }

    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.record(Seen::RunPodSandbox(pod.id));
        Ok(())
    }

    async fn stop_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.record(Seen::StopPodSandbox(pod.id));
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.record(Seen::RemovePodSandbox(pod.id));
        Ok(())
    }

    async fn create_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<ContainerCreation, PluginError> {
        self.record(Seen::CreateContainer(container.name.clone()));
        if let Some(text) = container.annotations.get(FAIL_ANNOTATION) {
            return Err(PluginError::failed(text.clone()));
        }
        if let Some(text) = container.annotations.get(PANIC_ANNOTATION) {
            panic!("{text}");
        }
        let mut creation = ContainerCreation::default();
        if let Some(cpus) = cpuset_of(&container)? {
            let mut linux = LinuxContainerAdjustment::new();
            linux.resources = Some(resources_with_cpus(&cpus)).into();
            let mut adjust = ContainerAdjustment::new();
            adjust.linux = Some(linux).into();
            creation.adjust = Some(adjust);
        }
        if let Some(value) = container.annotations.get(ALSO_UPDATE_ANNOTATION) {
            let (id, cpus) = parse_also_update(value)?;
            creation.update.push(pin_update(&id, &cpus));
        }
        Ok(creation)
    }

    async fn start_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<(), PluginError> {
        self.record(Seen::StartContainer(container.id));
        Ok(())
    }

    async fn stop_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        self.record(Seen::StopContainer(container.id));
        Ok(Vec::new())
    }

    async fn remove_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<(), PluginError> {
        self.record(Seen::RemoveContainer(container.id));
        Ok(())
    }
}
