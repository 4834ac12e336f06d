//! The plugin-side API: the [`NriPlugin`] trait a plugin implements, and the
//! ttrpc `Plugin` service that dispatches runtime calls to it.
//!
//! # Subscribing to events
//!
//! A plugin declares the events it handles in [`NriPlugin::events`] and
//! overrides the matching methods. The mask sent to the runtime at
//! `Configure` is exactly that declaration. Every event method the plugin
//! leaves alone answers [`PluginError::NotImplemented`], which goes on the
//! wire as ttrpc `UNIMPLEMENTED` (newer runtimes then retry the event as
//! `StateChange`, which ends in the same method and is acknowledged).
//!
//! # Guarantees of the service
//!
//! Every handler runs under a deadline ([`DEFAULT_HANDLER_TIMEOUT`], below
//! the runtime's 2 s request timeout) so the runtime always gets an answer in
//! time, and inside `catch_unwind`, so a panicking handler becomes an error
//! reply instead of a lost request or a dead plugin.

pub mod guard;
pub mod service;

use std::time::Duration;

use async_trait::async_trait;

use crate::events::EventMask;
use dra_cpu_proto::nri::api;
use dra_cpu_proto::nri::api::{
    Container, ContainerAdjustment, ContainerEviction, ContainerUpdate, LinuxResources, PodSandbox,
};

/// Deadline for one handler: well inside NRI's 2 s request timeout, leaving
/// room for the reply to travel.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_millis(1500);

/// What a handler can answer besides success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The plugin does not handle this event.
    #[error("not implemented by this plugin")]
    NotImplemented,
    /// The plugin refuses or failed; the text reaches the runtime (and, for
    /// container creation, the user).
    #[error("{0}")]
    Failed(String),
}

impl PluginError {
    pub fn failed(message: impl Into<String>) -> Self {
        PluginError::Failed(message.into())
    }
}

/// What the runtime told the plugin about itself at `Configure`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub runtime_name: String,
    pub runtime_version: String,
    /// NRI version of the runtime; runtimes before NRI 0.10 do not send it.
    pub nri_version: Option<String>,
    pub registration_timeout: Duration,
    pub request_timeout: Duration,
}

impl RuntimeInfo {
    pub fn from_request(req: &api::ConfigureRequest) -> Self {
        let millis = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
        RuntimeInfo {
            runtime_name: req.runtime_name.clone(),
            runtime_version: req.runtime_version.clone(),
            nri_version: (!req.NRI_version.is_empty()).then(|| req.NRI_version.clone()),
            registration_timeout: millis(req.registration_timeout),
            request_timeout: millis(req.request_timeout),
        }
    }

    /// Whether updates sent outside an event (`UpdateContainers`) are safe:
    /// runtimes with NRI older than 0.12.1 can deadlock on them. Runtimes
    /// that do not report their NRI version are older than that.
    pub fn unsolicited_updates_safe(&self) -> bool {
        self.nri_version
            .as_deref()
            .and_then(parse_version)
            .is_some_and(|v| v >= (0, 12, 1))
    }
}

/// Parses `v1.2.3` / `1.2.3` / `1.2.3-rc.1+meta` into a comparable triple.
pub fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// Answer to `CreateContainer`: changes to the new container and updates of
/// other running containers, applied by the runtime in the same step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerCreation {
    pub adjust: Option<ContainerAdjustment>,
    pub update: Vec<ContainerUpdate>,
    pub evict: Vec<ContainerEviction>,
}

/// Answer to `UpdateContainer`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUpdates {
    pub update: Vec<ContainerUpdate>,
    pub evict: Vec<ContainerEviction>,
}

/// Answer to `ValidateContainerAdjustment`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validation {
    pub reject: bool,
    pub reason: String,
}

/// An NRI plugin. See the module docs for how events are subscribed.
#[async_trait]
pub trait NriPlugin: Send + Sync + 'static {
    /// The events this plugin handles; sent to the runtime at `Configure`.
    fn events(&self) -> EventMask;

    /// The runtime introduced itself; `config` is the plugin's section of the
    /// runtime's NRI configuration, if any.
    async fn configure(&self, _runtime: &RuntimeInfo, _config: &str) -> Result<(), PluginError> {
        Ok(())
    }

    /// All pods and containers the runtime knows, after (re-)registration.
    /// The returned updates are applied to running containers.
    async fn synchronize(
        &self,
        _pods: Vec<PodSandbox>,
        _containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Ok(Vec::new())
    }

    /// The runtime is shutting down.
    async fn shutdown(&self) {}

    async fn run_pod_sandbox(&self, _pod: PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn update_pod_sandbox(
        &self,
        _pod: PodSandbox,
        _overhead: Option<LinuxResources>,
        _resources: Option<LinuxResources>,
    ) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn post_update_pod_sandbox(&self, _pod: PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn stop_pod_sandbox(&self, _pod: PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn remove_pod_sandbox(&self, _pod: PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    /// A container is being created: adjust it, and update others.
    async fn create_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<ContainerCreation, PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn post_create_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn start_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn post_start_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    /// A container's resources are being updated (e.g. by kubelet).
    async fn update_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
        _resources: Option<LinuxResources>,
    ) -> Result<ContainerUpdates, PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn post_update_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    /// A container stops; the returned updates go to remaining containers.
    async fn stop_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn remove_container(
        &self,
        _pod: PodSandbox,
        _container: Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::NotImplemented)
    }

    async fn validate_container_adjustment(
        &self,
        _request: api::ValidateContainerAdjustmentRequest,
    ) -> Result<Validation, PluginError> {
        Err(PluginError::NotImplemented)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parsing_table() {
        let cases = [
            ("v0.12.1", Some((0, 12, 1))),
            ("0.6.1", Some((0, 6, 1))),
            ("v1.0", Some((1, 0, 0))),
            ("v0.12.2-rc.1+dirty", Some((0, 12, 2))),
            ("", None),
            ("vx.1", None),
            ("1.2.3.4", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_version(text), want, "{text:?}");
        }
    }

    #[test]
    fn runtime_info_from_configure() {
        let mut req = api::ConfigureRequest::new();
        req.runtime_name = "containerd".into();
        req.runtime_version = "1.7.24".into();
        req.registration_timeout = 5000;
        req.request_timeout = -1;
        let info = RuntimeInfo::from_request(&req);
        assert_eq!(info.runtime_name, "containerd");
        assert_eq!(info.nri_version, None);
        assert_eq!(info.registration_timeout, Duration::from_secs(5));
        assert_eq!(info.request_timeout, Duration::ZERO);
    }

    #[test]
    fn unsolicited_updates_need_nri_0_12_1() {
        let info = |v: Option<&str>| RuntimeInfo {
            nri_version: v.map(str::to_string),
            ..Default::default()
        };
        assert!(!info(None).unsolicited_updates_safe());
        assert!(!info(Some("v0.6.1")).unsolicited_updates_safe());
        assert!(!info(Some("v0.12.0")).unsolicited_updates_safe());
        assert!(info(Some("v0.12.1")).unsolicited_updates_safe());
        assert!(info(Some("v1.0.0")).unsolicited_updates_safe());
        assert!(!info(Some("garbage")).unsolicited_updates_safe());
    }
}
