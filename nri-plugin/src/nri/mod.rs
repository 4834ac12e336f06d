//! The NRI adapter: [`DraCpuPlugin`], the [`NriPlugin`] implementation that
//! turns the runtime's events into view decisions (through the
//! [`Enforcer`]) and answers with the replies built in [`messages`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::metrics::upstream::NriCallback;
use async_trait::async_trait;
use dra_cpu_daemon::upstream_metrics::OpResult;
use dra_cpu_nri::events::EventMask;
use dra_cpu_nri::plugin::{
    ContainerCreation, ContainerUpdates, NriPlugin, PluginError, RuntimeInfo,
};
use dra_cpu_proto::nri::api::{
    self, Container, ContainerUpdate, Event, LinuxResources, PodSandbox,
};
use shared_state::pool::Update;
use shared_state::CpuSet;

use crate::enforcer::Enforcer;
use crate::partition::Isolated;
use crate::resolve::ClaimResolver;
use crate::view::admission::{admit_container, synchronize_containers};
use crate::view::ContainerInfo;

pub mod messages;

use messages::allocation_mode;
use messages::{container_info, creation_reply, to_nri_updates, update_info, update_reply};

/// The NRI plugin of dra-cpu.
pub struct DraCpuPlugin {
    enforcer: Arc<Enforcer>,
    resolver: Arc<dyn ClaimResolver>,
}

/// The OCI `linux.cgroupsPath` the runtime reported for a container.
fn cgroups_path(container: &Container) -> String {
    container
        .linux
        .as_ref()
        .map(|l| l.cgroups_path.clone())
        .unwrap_or_default()
}

impl DraCpuPlugin {
    pub fn new(enforcer: Arc<Enforcer>, resolver: Arc<dyn ClaimResolver>) -> Self {
        DraCpuPlugin { enforcer, resolver }
    }

    /// At Synchronize: running claim containers are remembered, and those
    /// whose claim asks for an isolated partition get it if they lack it
    /// (started while this plugin was away); one whose claim is known only
    /// from its CDI spec gets it once dra-plugin tells its tuning.
    fn isolate_running(&self, containers: &[Container]) {
        let Some(keeper) = &self.enforcer.partitions else {
            return;
        };
        let listed: std::collections::HashSet<&str> =
            containers.iter().map(|c| c.id.as_str()).collect();
        for (container, outcome) in keeper.forget_gone(&listed) {
            match outcome {
                Ok(written) => tracing::info!(
                    %container, written,
                    "isolated partition of a container gone while its stop was not seen given back"
                ),
                Err(e) => tracing::warn!(
                    %container, error = %e,
                    "giving back the isolated partition of a container gone unseen failed"
                ),
            }
        }
        for container in containers {
            if container.state.value() != api::ContainerState::CONTAINER_RUNNING as i32 {
                continue;
            }
            let claim_cpus = self.enforcer.view().claim_cpus(&container.id);
            if let Some(claim_cpus) = claim_cpus {
                keeper.note_running(&container.id, &cgroups_path(container), claim_cpus);
            }
        }
        self.enforcer.reconcile_partitions();
        // A partition whose container was removed while this process was
        // down left its CPUs in the ancestors' exclusive CPUs: nothing else
        // remembers them.
        let paths: Vec<String> = containers.iter().map(cgroups_path).collect();
        match keeper.sweep_stale_exclusive(paths.iter().map(String::as_str)) {
            Ok(swept) if swept.is_empty() => {}
            Ok(swept) => tracing::info!(
                cgroups = ?swept,
                "exclusive CPUs no partition holds any more taken from these cgroups"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "sweeping exclusive CPUs no partition holds failed"
            ),
        }
    }

    /// Gives back the isolated partition of a container that stopped (or
    /// was removed without a stop seen): its CPUs leave the ancestors'
    /// exclusive CPUs. `view_cpus` is what the view knows of it (after a
    /// restart of this process, the only knowledge). Never fails the event.
    fn release_partition(&self, container: &Container, view_cpus: Option<CpuSet>) {
        let Some(keeper) = &self.enforcer.partitions else {
            return;
        };
        match keeper.release(&container.id, &cgroups_path(container), view_cpus) {
            Ok(0) => {}
            Ok(written) => tracing::info!(
                container = %container.id, name = %container.name, written,
                "isolated partition given back"
            ),
            Err(e) => tracing::warn!(
                container = %container.id, name = %container.name, error = %e,
                "giving back the isolated partition failed"
            ),
        }
    }

    /// A container stopped or removed: its cgroup is no longer read back.
    fn forget_cgroup(&self, container_id: &str) {
        if let Some(check) = &self.enforcer.cpuset_check {
            check.forget(container_id);
        }
    }

    fn finish(&self, event: &'static str, result: &'static str, started: Instant) {
        self.enforcer
            .metrics
            .event(event, result, started.elapsed());
    }

    /// Upstream's callback duration series, labelled by the container's
    /// claims as upstream labels them.
    fn upstream_container(
        &self,
        callback: NriCallback,
        result: OpResult,
        container: &Container,
        started: Instant,
    ) {
        self.enforcer.metrics.upstream.record_container(
            callback,
            result,
            allocation_mode(container),
            started.elapsed(),
        );
    }

    /// Pending updates sent in a reply: record them as applied.
    fn send_in_reply(&self, updates: &[Update]) {
        let mut view = self.enforcer.view();
        view.mark_applied(updates);
        self.enforcer.refresh(&view);
        self.enforcer.metrics.updates_sent("reply", updates.len());
    }
}

#[async_trait]
impl NriPlugin for DraCpuPlugin {
    fn events(&self) -> EventMask {
        let mut events = vec![
            Event::CREATE_CONTAINER,
            Event::POST_START_CONTAINER,
            Event::UPDATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
        ];
        // Each event asked for is a round trip in every container's (or
        // pod's) start: these serve isolated partitions alone.
        if let Some(keeper) = &self.enforcer.partitions {
            events.push(Event::START_CONTAINER);
            // cgroup v1: a new pod's cgroups balance every CPU from their
            // making, the sandbox's too; the earliest event is its start.
            if keeper.is_v1() {
                events.push(Event::RUN_POD_SANDBOX);
            }
        }
        EventMask::of(&events)
    }

    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        let _span =
            tracing::debug_span!("run_pod_sandbox", pod = %pod.name, namespace = %pod.namespace)
                .entered();
        self.enforcer.refresh_v1_load_balancing();
        Ok(())
    }

    async fn configure(&self, runtime: &RuntimeInfo, _config: &str) -> Result<(), PluginError> {
        let safe = runtime.unsolicited_updates_safe();
        self.enforcer.runtime_safe.store(safe, Ordering::Relaxed);
        self.enforcer.health.set_nri_registered(true);
        tracing::info!(
            runtime = %runtime.runtime_name, version = %runtime.runtime_version,
            nri = ?runtime.nri_version, unsolicited_updates_safe = safe,
            policy = ?self.enforcer.policy,
            "configured by the NRI runtime"
        );
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        let started = Instant::now();
        let pods: HashMap<&str, &PodSandbox> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let empty = PodSandbox::new();
        let infos: Vec<ContainerInfo> = containers
            .iter()
            .map(|c| {
                container_info(
                    pods.get(c.pod_sandbox_id.as_str())
                        .copied()
                        .unwrap_or(&empty),
                    c,
                )
            })
            .collect();
        let outcome =
            synchronize_containers(&self.enforcer.view, &infos, self.resolver.as_ref()).await;
        self.enforcer.sync_host_cgroups();
        for (id, reason) in &outcome.demoted {
            tracing::warn!(container = %id, %reason, "running container's claims do not validate; placing it on the shared pool");
        }
        let span = tracing::info_span!("synchronize", containers = infos.len());
        span.in_scope(|| {
            tracing::info!(
                updates = outcome.updates.len(),
                demoted = outcome.demoted.len(),
                "synchronized with the runtime"
            );
        });
        self.send_in_reply(&outcome.updates);
        // A container created while this plugin was away and not yet running
        // may not take the reply's update (see
        // `NodeView::confirm_started`): remember the cpuset the runtime gave
        // it, so that its PostStartContainer sends the planned one again.
        {
            let mut view = self.enforcer.view();
            for (container, info) in containers.iter().zip(&infos) {
                if container.state.value() == api::ContainerState::CONTAINER_CREATED as i32 {
                    view.note_created(Update::cpuset(info.id.clone(), info.cpus.clone()));
                }
            }
        }
        self.isolate_running(&containers);
        if let Some(check) = &self.enforcer.cpuset_check {
            let paths: Vec<(&str, String)> = containers
                .iter()
                .map(|c| (c.id.as_str(), cgroups_path(c)))
                .collect();
            check.replace_all(paths.iter().map(|(id, path)| (*id, path.as_str())));
        }
        self.enforcer
            .metrics
            .updates_sent("synchronize", outcome.updates.len());
        // Registered means synchronized: from here on every event is seen.
        self.enforcer.health.set_nri_registered(true);
        self.finish("Synchronize", "ok", started);
        self.enforcer
            .metrics
            .upstream
            .record_synchronize(OpResult::Success, started.elapsed());
        // A container started while this plugin was away runs with the CFS
        // quota of its CPU limit: the claims that ask for none have their
        // update in the outcome.
        Ok(to_nri_updates(&outcome.updates))
    }

    async fn shutdown(&self) {
        self.enforcer.health.set_nri_registered(false);
        tracing::info!("the NRI runtime is shutting down");
    }

    async fn create_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<ContainerCreation, PluginError> {
        let started = Instant::now();
        let info = container_info(&pod, &container);
        let span = tracing::info_span!(
            "create_container", container = %info.id, container_name = %info.name,
            pod = %info.pod_name, namespace = %info.pod_namespace, pod_uid = %info.pod_uid
        );
        let mut admitted =
            admit_container(&self.enforcer.view, &info, self.resolver.as_ref()).await;
        // Without isolated partitions (a read-only cgroup root) StartContainer
        // is not asked for: a container of a claim asking for one is refused
        // now instead.
        if admitted.is_ok() && self.enforcer.partitions.is_none() {
            if let Err(refusal) = self.enforcer.view().refuse_unisolable(&info) {
                admitted = Err(refusal);
            }
        }
        match admitted {
            Ok(decision) => {
                // A claim learned just now (its Lookup answer) shrank the
                // pool: host daemons leave its CPUs before the reply.
                self.enforcer.sync_host_cgroups();
                let reply = creation_reply(&decision);
                self.send_in_reply(&decision.updates);
                self.enforcer.view().note_created(Update {
                    container_id: info.id.clone(),
                    cpuset: decision.cpuset.clone(),
                    cfs_quota_off: decision.cfs_quota_off,
                });
                if let Some(check) = &self.enforcer.cpuset_check {
                    check.note(&info.id, &cgroups_path(&container));
                }
                span.in_scope(|| {
                    tracing::info!(
                        kind = %decision.kind, cpuset = %decision.cpuset,
                        mems = ?decision.mems.as_ref().map(CpuSet::to_cpulist),
                        claims = ?decision.claims, other_updates = decision.updates.len(),
                        "container placed"
                    )
                });
                self.finish("CreateContainer", "ok", started);
                self.upstream_container(
                    NriCallback::CreateContainer,
                    OpResult::Success,
                    &container,
                    started,
                );
                Ok(reply)
            }
            Err(refusal) => {
                span.in_scope(|| tracing::warn!(reason = refusal.reason(), error = %refusal, "container refused"));
                self.enforcer.metrics.refused(refusal.reason());
                self.finish("CreateContainer", "refused", started);
                self.upstream_container(
                    NriCallback::CreateContainer,
                    OpResult::Error,
                    &container,
                    started,
                );
                Err(PluginError::failed(refusal.to_string()))
            }
        }
    }

    /// The container is about to start, its cgroup made: a container of a
    /// claim asking `loadBalancing: off` gets its isolated partition now,
    /// before its process runs. A partition the kernel refuses fails the
    /// start, with the kernel's reason, and nothing is left behind.
    async fn start_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<(), PluginError> {
        let started = Instant::now();
        let cgroups_path = cgroups_path(&container);
        let (cpus, claim_cpus) = {
            let view = self.enforcer.view();
            (
                view.isolated_cpus(&container.id),
                view.claim_cpus(&container.id),
            )
        };
        let Some(cpus) = cpus else {
            // Its claim may turn out to ask for a partition once dra-plugin
            // tells more than the CDI spec did.
            if let (Some(claim_cpus), Some(keeper)) = (claim_cpus, &self.enforcer.partitions) {
                keeper.note_running(&container.id, &cgroups_path, claim_cpus);
            }
            // On cgroup v1 its pod's cgroups, new, balance every CPU.
            self.enforcer.refresh_v1_load_balancing();
            return Ok(());
        };
        let span = tracing::info_span!(
            "start_container", container = %container.id, container_name = %container.name,
            pod = %pod.name, namespace = %pod.namespace, cpus = %cpus
        );
        let outcome = match &self.enforcer.partitions {
            Some(keeper) => keeper
                .isolate(&container.id, &cgroups_path, &cpus)
                .map_err(|e| e.to_string()),
            None => Err("this nri-plugin makes no isolated partitions".to_string()),
        };
        match outcome {
            Ok(isolated) => {
                let cgroup = match &isolated {
                    Isolated::Made { cgroup } | Isolated::Already { cgroup } => cgroup.clone(),
                };
                span.in_scope(|| {
                    tracing::info!(
                        cgroup = %cgroup.display(), already = matches!(isolated, Isolated::Already { .. }),
                        "isolated partition made: no load balancing on the claim's CPUs"
                    )
                });
                self.finish("StartContainer", "ok", started);
                Ok(())
            }
            Err(reason) => {
                span.in_scope(|| tracing::warn!(%reason, "isolated partition refused; the container does not start"));
                self.enforcer.metrics.refused("isolated-partition");
                self.finish("StartContainer", "refused", started);
                Err(PluginError::failed(format!(
                    "tuning.loadBalancing off for container {} of pod {}/{}: {reason}",
                    container.name, pod.namespace, pod.name
                )))
            }
        }
    }

    /// The container runs: an update sent to it before that may not have
    /// reached its cgroup (see [`crate::view::NodeView::confirm_started`]);
    /// send it again.
    async fn post_start_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<(), PluginError> {
        let started = Instant::now();
        // The updates are planned under the same lock as the confirmation:
        // an update in flight whose answer lands in between would otherwise
        // be recorded as applied and drop the resend.
        let (resend, updates) = {
            let mut view = self.enforcer.view();
            let resend = view.confirm_started(&container.id);
            let updates = match resend {
                Some(_) => view.pending_updates(),
                None => Vec::new(),
            };
            (resend, updates)
        };
        tracing::debug!(container = %container.id, resend = ?resend.as_ref().map(|u| u.cpuset.to_cpulist()), "container started");
        if let Some(planned) = resend {
            tracing::info!(
                container = %container.id, name = %container.name, pod = %pod.name,
                namespace = %pod.namespace, cpuset = %planned.cpuset,
                cfs_quota_off = planned.cfs_quota_off,
                "the pool or the claim's tuning changed while the container was starting; sending its update again"
            );
            self.enforcer
                .after_pool_change(updates, "changed while starting")
                .await;
        }
        self.finish("PostStartContainer", "ok", started);
        Ok(())
    }

    async fn update_container(
        &self,
        pod: PodSandbox,
        container: Container,
        resources: Option<LinuxResources>,
    ) -> Result<ContainerUpdates, PluginError> {
        let started = Instant::now();
        let info = update_info(&pod, &container, resources.as_ref());
        let decision = self.enforcer.view().update_container(&info);
        self.send_in_reply(&decision.updates);
        match decision.kinds {
            Some((before, after)) if before != after => tracing::info!(
                container = %info.id, name = %container.name, pod = %pod.name,
                namespace = %pod.namespace, cpu_shares = ?info.cpu_shares,
                from = %before, to = %after, updates = decision.updates.len(),
                "container kind changed by a resource update"
            ),
            _ => {
                tracing::debug!(container = %info.id, updates = decision.updates.len(), "container update")
            }
        }
        self.finish("UpdateContainer", "ok", started);
        Ok(ContainerUpdates {
            update: update_reply(&info.id, &decision),
            evict: Vec::new(),
        })
    }

    async fn stop_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        let started = Instant::now();
        let (updates, isolated) = {
            let mut view = self.enforcer.view();
            view.forget_starting(&container.id);
            let isolated = view.isolated_cpus(&container.id);
            (view.stop_container(&container.id), isolated)
        };
        self.release_partition(&container, isolated);
        self.forget_cgroup(&container.id);
        self.send_in_reply(&updates);
        tracing::debug!(container = %container.id, updates = updates.len(), "container stopped");
        self.finish("StopContainer", "ok", started);
        self.upstream_container(
            NriCallback::StopContainer,
            OpResult::Success,
            &container,
            started,
        );
        Ok(to_nri_updates(&updates))
    }

    async fn remove_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<(), PluginError> {
        let started = Instant::now();
        let mut view = self.enforcer.view();
        view.forget_starting(&container.id);
        let isolated = view.isolated_cpus(&container.id);
        view.remove_container(&container.id);
        self.enforcer.refresh(&view);
        drop(view);
        self.release_partition(&container, isolated);
        self.forget_cgroup(&container.id);
        self.finish("RemoveContainer", "ok", started);
        self.upstream_container(
            NriCallback::RemoveContainer,
            OpResult::Success,
            &container,
            started,
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests;
