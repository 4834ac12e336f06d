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

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use ttrpc::r#async::TtrpcContext;

use super::api;
use super::api::{
    Container, ContainerAdjustment, ContainerEviction, ContainerUpdate, LinuxResources, PodSandbox,
};
use super::api_ttrpc;
use super::events::{state_change_target, EventMask, StateChangeTarget};

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

/// Shared slot for the runtime's self-description, filled at `Configure`.
#[derive(Debug, Clone, Default)]
pub struct RuntimeInfoCell(Arc<RwLock<Option<RuntimeInfo>>>);

impl RuntimeInfoCell {
    pub fn get(&self) -> Option<RuntimeInfo> {
        shared_state::sync::read(&self.0).clone()
    }

    fn set(&self, info: RuntimeInfo) {
        *shared_state::sync::write(&self.0) = Some(info);
    }
}

#[derive(Default)]
struct PendingSync {
    pods: Vec<PodSandbox>,
    containers: Vec<Container>,
}

/// The ttrpc `Plugin` service for one connection to the runtime.
pub struct PluginService<P: NriPlugin> {
    plugin: Arc<P>,
    runtime: RuntimeInfoCell,
    handler_timeout: Duration,
    pending_sync: Mutex<Option<PendingSync>>,
}

impl<P: NriPlugin> PluginService<P> {
    pub fn new(plugin: Arc<P>, runtime: RuntimeInfoCell, handler_timeout: Duration) -> Self {
        PluginService {
            plugin,
            runtime,
            handler_timeout,
            pending_sync: Mutex::new(None),
        }
    }

    /// The services map for a ttrpc server.
    pub fn into_services(self) -> std::collections::HashMap<String, ttrpc::r#async::Service> {
        api_ttrpc::create_plugin(Arc::new(self))
    }

    /// Runs one handler under the deadline and panic guard and converts the
    /// outcome into a ttrpc result.
    async fn guarded<T, F>(&self, method: &'static str, handler: F) -> ttrpc::Result<T>
    where
        F: Future<Output = Result<T, PluginError>> + Send,
    {
        let runtime_timeout = self.runtime.get().map(|info| info.request_timeout);
        let timeout = effective_handler_timeout(self.handler_timeout, runtime_timeout);
        match guard(method, timeout, handler).await {
            Ok(v) => Ok(v),
            Err(failure) => {
                if !matches!(failure, HandlerFailure::Plugin(PluginError::NotImplemented)) {
                    tracing::warn!(method, error = %failure, "NRI handler failed");
                }
                Err(failure.into_ttrpc(method))
            }
        }
    }

    fn take_sync(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
        more: bool,
    ) -> Option<PendingSync> {
        let mut slot = shared_state::sync::lock(&self.pending_sync);
        let pending = slot.get_or_insert_with(PendingSync::default);
        pending.pods.extend(pods);
        pending.containers.extend(containers);
        if more {
            None
        } else {
            slot.take()
        }
    }

    async fn dispatch_state_change(
        &self,
        event: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let value = event.event.value();
        let Some(target) = state_change_target(value) else {
            tracing::warn!(
                event = value,
                "ignoring StateChange for an event that cannot be a notification"
            );
            return Ok(api::Empty::new());
        };
        let pod = event.pod.into_option().unwrap_or_default();
        let container = event.container.into_option().unwrap_or_default();
        let p = &self.plugin;
        let result = match target {
            StateChangeTarget::RunPodSandbox => {
                self.guarded("StateChange/RunPodSandbox", p.run_pod_sandbox(pod))
                    .await
            }
            StateChangeTarget::StopPodSandbox => {
                self.guarded("StateChange/StopPodSandbox", p.stop_pod_sandbox(pod))
                    .await
            }
            StateChangeTarget::RemovePodSandbox => {
                self.guarded("StateChange/RemovePodSandbox", p.remove_pod_sandbox(pod))
                    .await
            }
            StateChangeTarget::PostUpdatePodSandbox => {
                self.guarded(
                    "StateChange/PostUpdatePodSandbox",
                    p.post_update_pod_sandbox(pod),
                )
                .await
            }
            StateChangeTarget::PostCreateContainer => {
                self.guarded(
                    "StateChange/PostCreateContainer",
                    p.post_create_container(pod, container),
                )
                .await
            }
            StateChangeTarget::StartContainer => {
                self.guarded(
                    "StateChange/StartContainer",
                    p.start_container(pod, container),
                )
                .await
            }
            StateChangeTarget::PostStartContainer => {
                self.guarded(
                    "StateChange/PostStartContainer",
                    p.post_start_container(pod, container),
                )
                .await
            }
            StateChangeTarget::PostUpdateContainer => {
                self.guarded(
                    "StateChange/PostUpdateContainer",
                    p.post_update_container(pod, container),
                )
                .await
            }
            StateChangeTarget::RemoveContainer => {
                self.guarded(
                    "StateChange/RemoveContainer",
                    p.remove_container(pod, container),
                )
                .await
            }
        };
        match result {
            Ok(()) => Ok(api::Empty::new()),
            // A notification the plugin does not handle is simply seen.
            Err(status) if is_unimplemented(&status) => Ok(api::Empty::new()),
            Err(status) => Err(status),
        }
    }
}

fn is_unimplemented(err: &ttrpc::Error) -> bool {
    matches!(err, ttrpc::Error::RpcStatus(s) if s.code() == ttrpc::Code::UNIMPLEMENTED)
}

/// Why a guarded handler did not produce a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerFailure {
    #[error(transparent)]
    Plugin(PluginError),
    #[error("handler did not answer within {0:?}")]
    Timeout(Duration),
    #[error("handler panicked: {0}")]
    Panicked(String),
}

impl HandlerFailure {
    /// The ttrpc status the runtime receives.
    pub fn into_ttrpc(self, method: &str) -> ttrpc::Error {
        let (code, message) = match &self {
            HandlerFailure::Plugin(PluginError::NotImplemented) => (
                ttrpc::Code::UNIMPLEMENTED,
                format!("{method} is not implemented by this plugin"),
            ),
            HandlerFailure::Plugin(PluginError::Failed(text)) => {
                (ttrpc::Code::UNKNOWN, text.clone())
            }
            HandlerFailure::Timeout(_) => {
                (ttrpc::Code::DEADLINE_EXCEEDED, format!("{method}: {self}"))
            }
            HandlerFailure::Panicked(_) => (ttrpc::Code::INTERNAL, format!("{method}: {self}")),
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
    }
}

/// The deadline for one handler: the configured one, shortened to three
/// quarters of the runtime's own request timeout when the runtime announced
/// a tighter one, so the reply still arrives before the runtime gives up.
pub fn effective_handler_timeout(
    configured: Duration,
    runtime_request_timeout: Option<Duration>,
) -> Duration {
    match runtime_request_timeout {
        Some(runtime) if !runtime.is_zero() => configured.min(runtime * 3 / 4),
        _ => configured,
    }
}

/// Runs `handler` with a deadline, turning a panic into a failure.
pub async fn guard<T, F>(
    method: &'static str,
    timeout: Duration,
    handler: F,
) -> Result<T, HandlerFailure>
where
    F: Future<Output = Result<T, PluginError>> + Send,
{
    let guarded = AssertUnwindSafe(handler).catch_unwind();
    match tokio::time::timeout(timeout, guarded).await {
        Err(_) => Err(HandlerFailure::Timeout(timeout)),
        Ok(Err(panic)) => {
            let text = panic_text(panic.as_ref());
            tracing::error!(method, panic = %text, "NRI handler panicked");
            Err(HandlerFailure::Panicked(text))
        }
        Ok(Ok(result)) => result.map_err(HandlerFailure::Plugin),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[async_trait]
impl<P: NriPlugin> api_ttrpc::Plugin for PluginService<P> {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let info = RuntimeInfo::from_request(&req);
        tracing::info!(
            runtime = %info.runtime_name,
            version = %info.runtime_version,
            nri = info.nri_version.as_deref().unwrap_or("unknown (before 0.10)"),
            "configuring NRI plugin"
        );
        self.runtime.set(info.clone());
        self.guarded("Configure", self.plugin.configure(&info, &req.config))
            .await?;
        let events = self.plugin.events();
        tracing::info!(events = %events, "subscribing to NRI events");
        let mut rsp = api::ConfigureResponse::new();
        rsp.events = events.bits();
        Ok(rsp)
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let mut rsp = api::SynchronizeResponse::new();
        let Some(all) = self.take_sync(req.pods, req.containers, req.more) else {
            // More chunks follow: acknowledge, answer on the last one.
            rsp.more = true;
            return Ok(rsp);
        };
        tracing::info!(
            pods = all.pods.len(),
            containers = all.containers.len(),
            "synchronizing with the runtime"
        );
        rsp.update = self
            .guarded(
                "Synchronize",
                self.plugin.synchronize(all.pods, all.containers),
            )
            .await?;
        Ok(rsp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        tracing::info!("runtime is shutting down");
        self.guarded("Shutdown", async {
            self.plugin.shutdown().await;
            Ok(())
        })
        .await?;
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        self.guarded("RunPodSandbox", self.plugin.run_pod_sandbox(pod))
            .await?;
        Ok(api::RunPodSandboxResponse::new())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let overhead = req.overhead_linux_resources.into_option();
        let resources = req.linux_resources.into_option();
        self.guarded(
            "UpdatePodSandbox",
            self.plugin.update_pod_sandbox(pod, overhead, resources),
        )
        .await?;
        Ok(api::UpdatePodSandboxResponse::new())
    }

    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        self.guarded(
            "PostUpdatePodSandbox",
            self.plugin.post_update_pod_sandbox(pod),
        )
        .await?;
        Ok(api::PostUpdatePodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        self.guarded("StopPodSandbox", self.plugin.stop_pod_sandbox(pod))
            .await?;
        Ok(api::StopPodSandboxResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        self.guarded("RemovePodSandbox", self.plugin.remove_pod_sandbox(pod))
            .await?;
        Ok(api::RemovePodSandboxResponse::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        let creation = self
            .guarded(
                "CreateContainer",
                self.plugin.create_container(pod, container),
            )
            .await?;
        let mut rsp = api::CreateContainerResponse::new();
        rsp.adjust = creation.adjust.into();
        rsp.update = creation.update;
        rsp.evict = creation.evict;
        Ok(rsp)
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        self.guarded(
            "PostCreateContainer",
            self.plugin.post_create_container(pod, container),
        )
        .await?;
        Ok(api::PostCreateContainerResponse::new())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        self.guarded(
            "StartContainer",
            self.plugin.start_container(pod, container),
        )
        .await?;
        Ok(api::StartContainerResponse::new())
    }

    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        self.guarded(
            "PostStartContainer",
            self.plugin.post_start_container(pod, container),
        )
        .await?;
        Ok(api::PostStartContainerResponse::new())
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        let resources = req.linux_resources.into_option();
        let updates = self
            .guarded(
                "UpdateContainer",
                self.plugin.update_container(pod, container, resources),
            )
            .await?;
        let mut rsp = api::UpdateContainerResponse::new();
        rsp.update = updates.update;
        rsp.evict = updates.evict;
        Ok(rsp)
    }

    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        self.guarded(
            "PostUpdateContainer",
            self.plugin.post_update_container(pod, container),
        )
        .await?;
        Ok(api::PostUpdateContainerResponse::new())
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        let update = self
            .guarded("StopContainer", self.plugin.stop_container(pod, container))
            .await?;
        let mut rsp = api::StopContainerResponse::new();
        rsp.update = update;
        Ok(rsp)
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        let pod = req.pod.into_option().unwrap_or_default();
        let container = req.container.into_option().unwrap_or_default();
        self.guarded(
            "RemoveContainer",
            self.plugin.remove_container(pod, container),
        )
        .await?;
        Ok(api::RemoveContainerResponse::new())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        self.dispatch_state_change(req).await
    }

    async fn validate_container_adjustment(
        &self,
        _ctx: &TtrpcContext,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<api::ValidateContainerAdjustmentResponse> {
        let verdict = self
            .guarded(
                "ValidateContainerAdjustment",
                self.plugin.validate_container_adjustment(req),
            )
            .await?;
        let mut rsp = api::ValidateContainerAdjustmentResponse::new();
        rsp.reject = verdict.reject;
        rsp.reason = verdict.reason;
        Ok(rsp)
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

    #[test]
    fn handler_timeout_stays_inside_the_runtime_timeout() {
        let ms = Duration::from_millis;
        let cases = [
            (ms(1500), None, ms(1500)),
            (ms(1500), Some(Duration::ZERO), ms(1500)),
            (ms(1500), Some(ms(2000)), ms(1500)),
            (ms(1500), Some(ms(1000)), ms(750)),
            (ms(1500), Some(ms(30_000)), ms(1500)),
        ];
        for (configured, runtime, want) in cases {
            assert_eq!(
                effective_handler_timeout(configured, runtime),
                want,
                "{configured:?} {runtime:?}"
            );
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

    #[tokio::test]
    async fn guard_turns_panic_into_failure() {
        let result: Result<(), _> = guard("Test", Duration::from_secs(5), async {
            if std::hint::black_box(true) {
                panic!("boom in handler");
            }
            Ok(())
        })
        .await;
        assert_eq!(
            result,
            Err(HandlerFailure::Panicked("boom in handler".into()))
        );
    }

    #[tokio::test]
    async fn guard_enforces_the_deadline() {
        let result: Result<(), _> = guard(
            "Test",
            Duration::from_millis(20),
            futures::future::pending(),
        )
        .await;
        assert_eq!(
            result,
            Err(HandlerFailure::Timeout(Duration::from_millis(20)))
        );
    }

    #[test]
    fn failures_map_to_ttrpc_codes() {
        let code = |f: HandlerFailure| match f.into_ttrpc("CreateContainer") {
            ttrpc::Error::RpcStatus(s) => (s.code(), s.message().to_string()),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            code(HandlerFailure::Plugin(PluginError::NotImplemented)).0,
            ttrpc::Code::UNIMPLEMENTED
        );
        assert_eq!(
            code(HandlerFailure::Plugin(PluginError::failed("no CPUs left"))),
            (ttrpc::Code::UNKNOWN, "no CPUs left".to_string())
        );
        assert_eq!(
            code(HandlerFailure::Timeout(Duration::from_secs(1))).0,
            ttrpc::Code::DEADLINE_EXCEEDED
        );
        let (c, m) = code(HandlerFailure::Panicked("x".into()));
        assert_eq!(c, ttrpc::Code::INTERNAL);
        assert!(
            m.contains("CreateContainer") && m.contains("panicked"),
            "{m}"
        );
    }
}
