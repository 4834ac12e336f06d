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
use dra_cpu_proto::nri::api::{
    self, Container, ContainerUpdate, Event, LinuxResources, PodSandbox,
};
use dra_cpu_proto::nri::events::EventMask;
use dra_cpu_proto::nri::plugin::{
    ContainerCreation, ContainerUpdates, NriPlugin, PluginError, RuntimeInfo,
};
use shared_state::pool::Update;
use shared_state::CpuSet;

use crate::enforcer::Enforcer;
use crate::partition::{Isolated, IsolatedPartitions};
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
    /// Isolated partitions (`loadBalancing: off`); `None`: such a
    /// container's start is refused.
    partitions: Option<IsolatedPartitions>,
    /// Containers given an isolated partition by this process: their
    /// cgroups path and CPUs, given back when they stop.
    isolated: std::sync::Mutex<HashMap<String, (String, CpuSet)>>,
}

impl DraCpuPlugin {
    pub fn new(enforcer: Arc<Enforcer>, resolver: Arc<dyn ClaimResolver>) -> Self {
        DraCpuPlugin {
            enforcer,
            resolver,
            partitions: None,
            isolated: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Makes isolated partitions under this cgroup v2 root.
    pub fn with_isolated_partitions(mut self, partitions: IsolatedPartitions) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// At Synchronize: running containers whose claim asks for an isolated
    /// partition get it if they lack it (started while this plugin was
    /// away), and are remembered either way, to be given back at their
    /// stop. A failure cannot stop a running container: it is logged.
    fn isolate_running(&self, containers: &[Container]) {
        let Some(partitions) = &self.partitions else {
            return;
        };
        for container in containers {
            if container.state.value() != api::ContainerState::CONTAINER_RUNNING as i32 {
                continue;
            }
            let Some(cpus) = self.enforcer.view().isolated_cpus(&container.id) else {
                continue;
            };
            let path = container
                .linux
                .as_ref()
                .map(|l| l.cgroups_path.clone())
                .unwrap_or_default();
            match partitions.isolate(&path, &cpus) {
                Ok(Isolated::Already { .. }) => {}
                Ok(Isolated::Made { cgroup }) => tracing::info!(
                    container = %container.id, name = %container.name, cpus = %cpus,
                    cgroup = %cgroup.display(),
                    "isolated partition made for a container that started while nri-plugin was away"
                ),
                Err(e) => {
                    tracing::warn!(
                        container = %container.id, name = %container.name, cpus = %cpus, error = %e,
                        "a running container's claim asks for an isolated partition, which the kernel refused; it runs unisolated"
                    );
                    continue;
                }
            }
            shared_state::sync::lock(&self.isolated).insert(container.id.clone(), (path, cpus));
        }
    }

    /// Gives back the isolated partition of a container that stopped (or
    /// was removed without a stop seen): its CPUs leave the ancestors'
    /// exclusive CPUs. `view_cpus` is what the view knows of it (after a
    /// restart of this process, the only knowledge). Never fails the event.
    fn release_partition(&self, container: &Container, view_cpus: Option<CpuSet>) {
        let recorded = shared_state::sync::lock(&self.isolated).remove(&container.id);
        let cgroups_path = container
            .linux
            .as_ref()
            .map(|l| l.cgroups_path.clone())
            .unwrap_or_default();
        let Some((path, cpus)) = recorded.or_else(|| view_cpus.map(|c| (cgroups_path, c))) else {
            return;
        };
        // Another container of the claim (kubelet's restart of it) may
        // hold the CPUs by now: they stay where it needs them.
        let taken = shared_state::sync::lock(&self.isolated)
            .values()
            .any(|(_, other)| !other.is_disjoint(&cpus));
        if taken {
            return;
        }
        let Some(partitions) = &self.partitions else {
            return;
        };
        match partitions.release(&path, &cpus) {
            Ok(0) => {}
            Ok(written) => tracing::info!(
                container = %container.id, name = %container.name, cpus = %cpus, written,
                "isolated partition given back"
            ),
            Err(e) => tracing::warn!(
                container = %container.id, name = %container.name, cpus = %cpus, error = %e,
                "giving back the isolated partition failed"
            ),
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
        EventMask::of(&[
            Event::CREATE_CONTAINER,
            Event::START_CONTAINER,
            Event::POST_START_CONTAINER,
            Event::UPDATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
        ])
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
                    view.note_created(&info.id, &info.cpus);
                }
            }
        }
        self.isolate_running(&containers);
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
            "create_container", container = %info.id, name = %info.name,
            pod = %info.pod_name, namespace = %info.pod_namespace, pod_uid = %info.pod_uid
        );
        match admit_container(&self.enforcer.view, &info, self.resolver.as_ref()).await {
            Ok(decision) => {
                // A claim learned just now (its Lookup answer) shrank the
                // pool: host daemons leave its CPUs before the reply.
                self.enforcer.sync_host_cgroups();
                let reply = creation_reply(&decision);
                self.send_in_reply(&decision.updates);
                self.enforcer
                    .view()
                    .note_created(&info.id, &decision.cpuset);
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
        let Some(cpus) = self.enforcer.view().isolated_cpus(&container.id) else {
            return Ok(());
        };
        let cgroups_path = container
            .linux
            .as_ref()
            .map(|l| l.cgroups_path.clone())
            .unwrap_or_default();
        let span = tracing::info_span!(
            "start_container", container = %container.id, name = %container.name,
            pod = %pod.name, namespace = %pod.namespace, cpus = %cpus
        );
        let outcome = match &self.partitions {
            Some(partitions) => partitions
                .isolate(&cgroups_path, &cpus)
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
                shared_state::sync::lock(&self.isolated)
                    .insert(container.id.clone(), (cgroups_path, cpus));
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
        tracing::debug!(container = %container.id, resend = ?resend.as_ref().map(CpuSet::to_cpulist), "container started");
        if let Some(planned) = resend {
            tracing::info!(
                container = %container.id, name = %container.name, pod = %pod.name,
                namespace = %pod.namespace, cpuset = %planned,
                "the pool changed while the container was starting; sending its cpuset again"
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
mod tests {
    use super::*;
    use crate::config::UnsolicitedUpdates;
    use crate::host_cgroups::HostCgroups;
    use crate::metrics::Metrics;
    use crate::test_support::{claim, run, set};
    use crate::view::NodeView;
    use dra_cpu_proto::nri::api;
    use dra_cpu_proto::nri::client::NriUpdater;
    use shared_state::{ClaimAssignment, CpuSet};
    use std::sync::atomic::Ordering;

    struct NoClaims;

    #[async_trait]
    impl ClaimResolver for NoClaims {
        async fn resolve(&self, _claim_uid: &str) -> crate::resolve::Resolution {
            crate::resolve::Resolution::NotPrepared
        }
    }

    fn nri_container(id: &str, env: &[String]) -> Container {
        let mut c = Container::new();
        c.id = id.into();
        c.name = id.into();
        c.env = env.to_vec();
        c
    }

    fn resources(shares: u64, cpus: &str) -> LinuxResources {
        let mut cpu = api::LinuxCPU::new();
        let mut value = api::OptionalUInt64::new();
        value.value = shares;
        cpu.shares = Some(value).into();
        cpu.cpus = cpus.into();
        let mut r = LinuxResources::new();
        r.cpu = Some(cpu).into();
        r
    }

    /// Answers every Lookup with one prepared claim.
    struct OneClaim(ClaimAssignment);

    #[async_trait]
    impl ClaimResolver for OneClaim {
        async fn resolve(&self, claim_uid: &str) -> crate::resolve::Resolution {
            if claim_uid == self.0.claim_uid {
                crate::resolve::Resolution::Prepared(self.0.clone())
            } else {
                crate::resolve::Resolution::NotPrepared
            }
        }
    }

    #[test]
    fn deferred_shrink_rides_on_the_next_create_and_is_then_applied() {
        let metrics = Arc::new(Metrics::new());
        let view = NodeView::new(set("0-3"), CpuSet::new(), false, None);
        let enforcer = Arc::new(Enforcer::new(
            view,
            metrics.clone(),
            NriUpdater::new(),
            UnsolicitedUpdates::Auto,
        ));
        let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
        let mut pod = PodSandbox::new();
        pod.uid = "q".into();
        let first =
            run(plugin.create_container(pod.clone(), nri_container("s", &[]))).expect("shared");
        assert!(first.update.is_empty());
        let uid = "c1c1c1c1-0000-4000-8000-000000000001";
        run(enforcer.apply_prepared(4, claim(uid, "3", "q"))).expect("prepare");

        let env = [format!("DRA_CPUSET_{uid}=3")];
        let reply = run(plugin.create_container(pod.clone(), nri_container("e", &env)))
            .expect("claim container");
        let cpus = |u: &ContainerUpdate| u.linux.resources.cpu.cpus.clone();
        assert_eq!(reply.adjust.expect("adjust").linux.resources.cpu.cpus, "3");
        assert_eq!(reply.update.len(), 1);
        assert_eq!(
            (
                reply.update[0].container_id.as_str(),
                cpus(&reply.update[0]).as_str()
            ),
            ("s", "0-2")
        );
        assert!(enforcer.view().pending_updates().is_empty());
        assert_eq!(metrics.applied_revision.load(Ordering::Relaxed), 4);

        // A forged copy is refused with the reason, and counted.
        let forged = [format!("DRA_CPUSET_{uid}=2")];
        let err =
            run(plugin.create_container(pod, nri_container("f", &forged))).expect_err("forged");
        assert!(
            err.to_string()
                .contains("says CPUs 2 but the claim was prepared with 3"),
            "{err}"
        );
        assert_eq!(metrics.refused_count("cpus-mismatch"), 1);
        let text = metrics.render();
        assert!(
            text.contains("nri_plugin_container_updates_total{path=\"reply\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn update_container_answers_the_new_kinds_cpuset_over_the_requests() {
        let metrics = Arc::new(Metrics::new());
        let view = NodeView::new(set("0-3"), CpuSet::new(), true, None);
        let enforcer = Arc::new(Enforcer::new(
            view,
            metrics,
            NriUpdater::new(),
            UnsolicitedUpdates::Never,
        ));
        let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
        let mut pod = PodSandbox::new();
        pod.uid = "q".into();
        let uid = "c1c1c1c1-0000-4000-8000-000000000001";
        run(enforcer.apply_prepared(1, claim(uid, "3", "q"))).expect("prepare");
        let env = [format!("DRA_CPUSET_{uid}=3")];
        let mut c = nri_container("c", &env);
        let mut linux = api::LinuxContainer::new();
        linux.resources = Some(resources(2, "")).into();
        c.linux = Some(linux).into();
        let created = run(plugin.create_container(pod.clone(), c.clone())).expect("created");
        assert_eq!(
            created.adjust.expect("adjust").linux.resources.cpu.cpus,
            "3"
        );
        // (shares and cpuset in the CRI request, cpuset answered): a cpuset in
        // the request never wins; shares 0 is "not in the request".
        let steps = [
            (512, "", "0-3"),
            (0, "0-3", "0-3"),
            (0, "", "0-3"),
            (2, "0-3", "3"),
            (0, "0-2", "3"),
        ];
        for (shares, requested, answered) in steps {
            let reply = run(plugin.update_container(
                pod.clone(),
                c.clone(),
                Some(resources(shares, requested)),
            ))
            .expect("update");
            let own: Vec<String> = reply
                .update
                .iter()
                .filter(|u| u.container_id == "c")
                .map(|u| u.linux.resources.cpu.cpus.clone())
                .collect();
            assert_eq!(
                own,
                vec![answered.to_string()],
                "shares {shares}, request {requested:?}"
            );
            assert!(reply.update.iter().all(|u| u.ignore_failure));
        }
    }

    #[test]
    fn host_cgroups_follow_prepare_unprepare_and_a_claim_learned_at_create() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("cgroup");
        let slice = root.join("system.slice");
        std::fs::create_dir_all(&slice).expect("mkdir");
        for d in [&root, &slice] {
            std::fs::write(d.join("cgroup.controllers"), "cpuset cpu\n").expect("controllers");
            std::fs::write(d.join("cgroup.subtree_control"), "cpuset\n").expect("subtree");
        }
        std::fs::write(slice.join("cpuset.cpus"), "\n").expect("cpus");
        let cpus = || {
            std::fs::read_to_string(slice.join("cpuset.cpus"))
                .expect("read")
                .trim()
                .to_string()
        };
        let host = HostCgroups::open(&root, &["system.slice".into()], &dir.path().join("state"))
            .expect("host cgroups");
        let metrics = Arc::new(Metrics::new());
        let view = NodeView::new(set("0-7"), set("0"), false, None);
        let late_uid = "c2c2c2c2-0000-4000-8000-000000000002";
        let enforcer = Arc::new(
            Enforcer::new(
                view,
                metrics.clone(),
                NriUpdater::new(),
                UnsolicitedUpdates::Auto,
            )
            .with_host_cgroups(host),
        );
        enforcer.sync_host_cgroups();
        assert_eq!(cpus(), "0-7", "shared pool 1-7 and reserved 0");

        let uid = "c1c1c1c1-0000-4000-8000-000000000001";
        run(enforcer.apply_prepared(1, claim(uid, "6-7", "q"))).expect("prepare");
        assert_eq!(cpus(), "0-5", "shrunk at the prepare, before any container");

        // A claim the view learns only at its container's CreateContainer
        // (dra-plugin's delta not here yet): shrunk before the reply.
        let plugin = DraCpuPlugin::new(
            enforcer.clone(),
            Arc::new(OneClaim(claim(late_uid, "4", "p"))),
        );
        let mut pod = PodSandbox::new();
        pod.uid = "p".into();
        let env = [format!("DRA_CPUSET_{late_uid}=4")];
        run(plugin.create_container(pod, nri_container("late", &env))).expect("create");
        assert_eq!(cpus(), "0-3,5");

        run(enforcer.apply_unprepared(2, uid)).expect("unprepare");
        assert_eq!(cpus(), "0-3,5-7", "grown back after the unprepare");
        assert_eq!(metrics.host_cgroup_write_count("ok"), 4);

        // A write that fails does not fail the container event that made
        // it due; it is counted and made again at the next change.
        let cpus_file = slice.join("cpuset.cpus");
        std::fs::remove_file(&cpus_file).expect("rm");
        std::fs::create_dir(&cpus_file).expect("a directory where the file was");
        let third = "c3c3c3c3-0000-4000-8000-000000000003";
        let plugin =
            DraCpuPlugin::new(enforcer.clone(), Arc::new(OneClaim(claim(third, "6", "r"))));
        let mut pod = PodSandbox::new();
        pod.uid = "r".into();
        let env = [format!("DRA_CPUSET_{third}=6")];
        let reply = run(plugin.create_container(pod, nri_container("third", &env)))
            .expect("the container is placed although the host cgroup write failed");
        assert_eq!(reply.adjust.expect("adjust").linux.resources.cpu.cpus, "6");
        assert_eq!(metrics.host_cgroup_write_count("failed"), 1);
        std::fs::remove_dir(&cpus_file).expect("rmdir");
        std::fs::write(&cpus_file, "0-3,5-7\n").expect("file again");
        run(enforcer.apply_unprepared(3, third)).expect("unprepare");
        assert_eq!(cpus(), "0-3,5-7");
        run(enforcer.apply_prepared(4, claim(third, "6", "r"))).expect("prepare again");
        assert_eq!(cpus(), "0-3,5,7", "written at the next change");
        assert_eq!(metrics.host_cgroup_write_count("ok"), 5);

        enforcer.restore_host_cgroups();
        assert_eq!(cpus(), "", "the original value back");
        enforcer.sync_host_cgroups();
        assert_eq!(cpus(), "", "nothing is managed after the restore");
    }

    #[test]
    fn a_claim_asking_load_balancing_off_gets_a_partition_at_start_and_gives_it_back_at_stop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exclusive = "cpuset.cpus.exclusive";
        let partition = "cpuset.cpus.partition";
        for d in [
            "kubepods",
            "kubepods/podq",
            "kubepods/podq/c",
            "kubepods/podq/s",
        ] {
            let path = dir.path().join(d);
            std::fs::create_dir_all(&path).expect("mkdir");
            std::fs::write(path.join(exclusive), "\n").expect("exclusive");
            std::fs::write(path.join(partition), "member\n").expect("partition");
        }
        let read = |p: &str| {
            std::fs::read_to_string(dir.path().join(p))
                .expect("read")
                .trim()
                .to_string()
        };
        let view = NodeView::new(set("0-3"), CpuSet::new(), true, None);
        let enforcer = Arc::new(Enforcer::new(
            view,
            Arc::new(Metrics::new()),
            NriUpdater::new(),
            UnsolicitedUpdates::Never,
        ));
        let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims))
            .with_isolated_partitions(IsolatedPartitions::new(dir.path()));
        let uid = "c1c1c1c1-0000-4000-8000-000000000001";
        let mut isolated = claim(uid, "2-3", "q");
        isolated.tuning.load_balancing_off = true;
        run(enforcer.apply_prepared(1, isolated)).expect("prepare");
        let mut pod = PodSandbox::new();
        pod.uid = "q".into();
        let with_path = |id: &str, env: &[String], path: &str| {
            let mut c = nri_container(id, env);
            let mut linux = api::LinuxContainer::new();
            linux.cgroups_path = path.into();
            linux.resources = Some(resources(1024, "")).into();
            c.linux = Some(linux).into();
            c
        };
        let env = [format!("DRA_CPUSET_{uid}=2-3")];
        let c = with_path("c", &env, "/kubepods/podq/c");
        let created = run(plugin.create_container(pod.clone(), c.clone())).expect("created");
        assert_eq!(
            created.adjust.expect("adjust").linux.resources.cpu.cpus,
            "2-3",
            "a CPU request in mixed mode does not add the shared pool"
        );
        // A shared container starts: nothing is written.
        let s = with_path("s", &[], "/kubepods/podq/s");
        run(plugin.create_container(pod.clone(), s.clone())).expect("shared");
        run(plugin.start_container(pod.clone(), s)).expect("shared start");
        assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "");

        run(plugin.start_container(pod.clone(), c.clone())).expect("start");
        assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "2-3");
        assert_eq!(read("kubepods/podq/cpuset.cpus.exclusive"), "2-3");
        assert_eq!(read("kubepods/podq/c/cpuset.cpus.exclusive"), "2-3");
        assert_eq!(read("kubepods/podq/c/cpuset.cpus.partition"), "isolated");

        run(plugin.stop_container(pod.clone(), c.clone())).expect("stop");
        assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "");
        assert_eq!(read("kubepods/podq/cpuset.cpus.exclusive"), "");
        assert_eq!(read("kubepods/podq/c/cpuset.cpus.partition"), "member");
        run(plugin.remove_container(pod.clone(), c)).expect("remove");

        // A plugin without partitions refuses the start, by name.
        let bare = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
        let again = with_path("c2", &env, "/kubepods/podq/c");
        run(bare.create_container(pod.clone(), again.clone())).expect("created again");
        let err = run(bare.start_container(pod, again)).expect_err("no partitions");
        assert!(
            err.to_string().contains("tuning.loadBalancing off"),
            "{err}"
        );
    }
}
