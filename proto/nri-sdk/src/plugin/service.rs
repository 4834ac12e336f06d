//! The ttrpc `Plugin` service: dispatches the runtime's calls to an
//! [`NriPlugin`], each under the handler guard.

use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use ttrpc::r#async::TtrpcContext;

use super::guard::{effective_handler_timeout, guard, HandlerFailure};
use super::{NriPlugin, PluginError, RuntimeInfo};
use crate::events::{state_change_target, StateChangeTarget};
use dra_cpu_proto::nri::api::{self, Container, PodSandbox};
use dra_cpu_proto::nri::api_ttrpc;

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
