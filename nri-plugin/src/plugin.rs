//! The NRI side: the [`NriPlugin`] implementation that turns runtime events
//! into [`crate::handler`] decisions and replies, and the [`Enforcer`] that
//! also takes dra-plugin's changes and decides whether they go out now (an
//! unsolicited `UpdateContainers`) or ride on the next event reply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use async_trait::async_trait;
use dra_cpu_proto::nri::api::{
    self, Container, ContainerAdjustment, ContainerUpdate, Event, LinuxContainerAdjustment,
    LinuxContainerUpdate, LinuxResources, PodSandbox,
};
use dra_cpu_proto::nri::{
    ContainerCreation, ContainerUpdates, EventMask, NriPlugin, NriUpdater, PluginError, RuntimeInfo,
};
use shared_state::claim_env::parse_claim_env;
use shared_state::pool::Update;
use shared_state::upstream_metrics::{CpuAllocationMode, NriCallback, OpResult};
use shared_state::{ClaimAssignment, CpuSet};

use crate::config::UnsolicitedUpdates;
use crate::handler::{
    admit_container, synchronize_containers, ClaimResolver, ContainerInfo, CreateDecision,
    NodeView, UpdateDecision, ViewError,
};
use crate::host_cgroups::{host_cpuset, HostCgroups};
use crate::metrics::Metrics;
use shared_state::NodeSnapshot;

/// The view plus everything needed to make it real on containers.
pub struct Enforcer {
    view: Mutex<NodeView>,
    pub metrics: Arc<Metrics>,
    updater: NriUpdater,
    policy: UnsolicitedUpdates,
    /// Set at Configure from the runtime's NRI version.
    runtime_safe: AtomicBool,
    /// Whether the last refresh saw stranded containers (logged once).
    over_committed: AtomicBool,
    /// Signalled when the applied revision advances, so the subscription
    /// reports it to dra-plugin without waiting for the next stream event.
    pub applied_changed: Notify,
    /// `--host-cgroups`, when set: they follow the shared pool and the
    /// reserved CPUs at every pool change.
    host_cgroups: Mutex<Option<HostCgroups>>,
    /// Whether the last sync found no CPU for them (logged once).
    host_cgroups_starved: AtomicBool,
}

fn lock_view(view: &Mutex<NodeView>) -> MutexGuard<'_, NodeView> {
    match view.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn lock_host(host: &Mutex<Option<HostCgroups>>) -> MutexGuard<'_, Option<HostCgroups>> {
    match host.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Enforcer {
    pub fn new(
        view: NodeView,
        metrics: Arc<Metrics>,
        updater: NriUpdater,
        policy: UnsolicitedUpdates,
    ) -> Self {
        Enforcer {
            view: Mutex::new(view),
            metrics,
            updater,
            policy,
            runtime_safe: AtomicBool::new(false),
            over_committed: AtomicBool::new(false),
            applied_changed: Notify::new(),
            host_cgroups: Mutex::new(None),
            host_cgroups_starved: AtomicBool::new(false),
        }
    }

    /// Manage these host cgroups from now on.
    pub fn with_host_cgroups(self, host_cgroups: HostCgroups) -> Self {
        *lock_host(&self.host_cgroups) = Some(host_cgroups);
        self
    }

    /// Brings every host cgroup to the shared pool plus the reserved CPUs.
    /// Called after every change of the pool, before the container updates
    /// of that change go out, and before a CreateContainer is answered, so
    /// host daemons leave a claim's CPUs before its container starts. Writes
    /// only what changed; a failed write is logged and tried again at the
    /// next call, and never fails the event that called it.
    pub fn sync_host_cgroups(&self) {
        let mut guard = lock_host(&self.host_cgroups);
        let Some(host) = guard.as_mut() else {
            return;
        };
        let want = {
            let view = self.view();
            host_cpuset(&view.pool().shared(), view.pool().reserved())
        };
        let starved = want.is_none();
        if self.host_cgroups_starved.swap(starved, Ordering::Relaxed) != starved && starved {
            tracing::warn!("no shared or reserved CPU left: host cgroups keep their last cpuset");
        }
        if let Some(want) = want {
            let outcome = host.apply(&want);
            self.metrics
                .host_cgroup_writes(outcome.written, outcome.failed);
        }
    }

    /// Writes again every host cgroup whose cpuset someone else changed
    /// (systemd re-applying `AllowedCPUs=`); called on a timer.
    pub fn repair_host_cgroups(&self) {
        let drifted = lock_host(&self.host_cgroups)
            .as_mut()
            .map_or(0, HostCgroups::check_drift);
        if drifted > 0 {
            self.sync_host_cgroups();
        }
    }

    /// Gives the host cgroups their original cpusets back (clean stop).
    pub fn restore_host_cgroups(&self) {
        if let Some(mut host) = lock_host(&self.host_cgroups).take() {
            let outcome = host.restore();
            self.metrics
                .host_cgroup_writes(outcome.written, outcome.failed);
        }
    }

    pub fn view(&self) -> MutexGuard<'_, NodeView> {
        lock_view(&self.view)
    }

    pub fn view_revision(&self) -> u64 {
        self.view().revision()
    }

    /// Gauges from the view; the applied revision advances only when no
    /// update is waiting to be sent.
    fn refresh(&self, view: &NodeView) {
        let m = &self.metrics;
        let pool = view.pool();
        m.shared_cpus
            .store(pool.shared().len() as u64, Ordering::Relaxed);
        m.exclusive_cpus
            .store(pool.exclusive().len() as u64, Ordering::Relaxed);
        m.containers
            .store(pool.containers().len() as u64, Ordering::Relaxed);
        m.view_revision.store(view.revision(), Ordering::Relaxed);
        if !view.has_pending() {
            let before = m.applied_revision.swap(view.revision(), Ordering::Relaxed);
            if before != view.revision() {
                self.applied_changed.notify_one();
            }
        }
        let stranded = view.stranded();
        m.over_committed
            .store(stranded.len() as u64, Ordering::Relaxed);
        let was = self
            .over_committed
            .swap(!stranded.is_empty(), Ordering::Relaxed);
        if !stranded.is_empty() && !was {
            tracing::warn!(
                containers = ?stranded,
                "node over-committed: every allocatable CPU is held by a claim; shared containers keep their old cpuset"
            );
        }
    }

    /// Send `updates` (the full pending set after a pool change) now if the
    /// runtime allows unsolicited updates, else leave them for the next
    /// event reply.
    async fn after_pool_change(&self, updates: Vec<Update>, why: &'static str) {
        self.sync_host_cgroups();
        if updates.is_empty() {
            self.refresh(&self.view());
            return;
        }
        let allowed = self
            .policy
            .allowed(self.runtime_safe.load(Ordering::Relaxed));
        if allowed && self.updater.is_connected() {
            let n = updates.len();
            match self
                .updater
                .update_containers(to_nri_updates(&updates))
                .await
            {
                Ok(failed) => {
                    let failed: Vec<&str> =
                        failed.iter().map(|f| f.container_id.as_str()).collect();
                    let sent: Vec<Update> = updates
                        .into_iter()
                        .filter(|(id, _)| !failed.contains(&id.as_str()))
                        .collect();
                    let mut view = self.view();
                    view.mark_applied(&sent);
                    self.refresh(&view);
                    self.metrics.pool_change("unsolicited");
                    self.metrics.updates_sent("unsolicited", sent.len());
                    tracing::info!(why, updates = n, failed = ?failed, "pool change sent as an unsolicited update");
                    return;
                }
                Err(e) => {
                    tracing::warn!(why, error = %e, "unsolicited update failed; deferring to the next event reply")
                }
            }
        }
        self.metrics.pool_change("deferred");
        tracing::info!(
            why, updates = updates.len(), policy = ?self.policy,
            "pool change deferred to the next event reply (unsolicited updates are not safe on this runtime)"
        );
        self.refresh(&self.view());
    }

    pub async fn apply_snapshot(&self, snapshot: NodeSnapshot) -> Result<(), ViewError> {
        let updates = self.view().apply_snapshot(snapshot)?;
        self.after_pool_change(updates, "snapshot").await;
        Ok(())
    }

    pub async fn apply_prepared(
        &self,
        revision: u64,
        claim: ClaimAssignment,
    ) -> Result<(), ViewError> {
        let uid = claim.claim_uid.clone();
        let updates = self.view().apply_prepared(revision, claim)?;
        tracing::info!(claim = %uid, revision, "claim prepared");
        self.after_pool_change(updates, "prepare").await;
        Ok(())
    }

    pub async fn apply_unprepared(&self, revision: u64, claim_uid: &str) -> Result<(), ViewError> {
        let updates = self.view().apply_unprepared(revision, claim_uid)?;
        tracing::info!(claim = %claim_uid, revision, "claim unprepared");
        self.after_pool_change(updates, "unprepare").await;
        Ok(())
    }
}

fn cpu_resources(cpus: &CpuSet, mems: Option<&CpuSet>) -> LinuxResources {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = cpus.to_cpulist();
    if let Some(mems) = mems {
        cpu.mems = mems.to_cpulist();
    }
    let mut resources = LinuxResources::new();
    resources.cpu = Some(cpu).into();
    resources
}

/// NRI updates that set only the cpuset. A container may exit while its
/// update is in flight; that must not fail the event the update rides on.
pub fn to_nri_updates(updates: &[Update]) -> Vec<ContainerUpdate> {
    // Most updates of one reply carry the same shared pool: render each
    // distinct cpuset once.
    let mut rendered: Vec<(&CpuSet, LinuxResources)> = Vec::new();
    updates
        .iter()
        .map(|(id, cpus)| {
            let resources = match rendered.iter().find(|(seen, _)| *seen == cpus) {
                Some((_, r)) => r.clone(),
                None => {
                    let r = cpu_resources(cpus, None);
                    rendered.push((cpus, r.clone()));
                    r
                }
            };
            let mut linux = LinuxContainerUpdate::new();
            linux.resources = Some(resources).into();
            let mut u = ContainerUpdate::new();
            u.container_id = id.clone();
            u.linux = Some(linux).into();
            u.ignore_failure = true;
            u
        })
        .collect()
}

/// The UpdateContainer reply: the cpusets, with the updated container's
/// memory nodes when its kind change moved them.
pub fn update_reply(container_id: &str, decision: &UpdateDecision) -> Vec<ContainerUpdate> {
    let mut reply = to_nri_updates(&decision.updates);
    if let Some(mems) = &decision.mems {
        for u in reply.iter_mut().filter(|u| u.container_id == container_id) {
            if let Some(cpu) = u
                .linux
                .as_mut()
                .and_then(|l| l.resources.as_mut())
                .and_then(|r| r.cpu.as_mut())
            {
                cpu.mems = mems.to_cpulist();
            }
        }
    }
    reply
}

/// The CreateContainer reply of a decision.
pub fn creation_reply(decision: &CreateDecision) -> ContainerCreation {
    let mut linux = LinuxContainerAdjustment::new();
    linux.resources = Some(cpu_resources(&decision.cpuset, decision.mems.as_ref())).into();
    let mut adjust = ContainerAdjustment::new();
    adjust.linux = Some(linux).into();
    ContainerCreation {
        adjust: Some(adjust),
        update: to_nri_updates(&decision.updates),
        evict: Vec::new(),
    }
}

fn shares_of(resources: Option<&LinuxResources>) -> Option<u64> {
    resources
        .and_then(|r| r.cpu.as_ref())
        .and_then(|c| c.shares.as_ref())
        .map(|s| s.value)
}

fn cpus_of(resources: Option<&LinuxResources>) -> CpuSet {
    resources
        .and_then(|r| r.cpu.as_ref())
        .and_then(|c| CpuSet::parse_cpulist(&c.cpus).ok())
        .unwrap_or_default()
}

/// The container of an UpdateContainer with the CPU request it is being
/// updated to. The runtime builds the request's resources from CRI
/// `UpdateContainerResources`, where an unset `cpu_shares` is 0 (proto3) and
/// means "leave as is" (containerd's `WithResources` skips it); so only a
/// non-zero value is a new request. Without one, `cpu_shares` is `None` and
/// the view keeps the request it last saw for the container.
pub fn update_info(
    pod: &PodSandbox,
    container: &Container,
    requested: Option<&LinuxResources>,
) -> ContainerInfo {
    ContainerInfo {
        cpu_shares: shares_of(requested).filter(|s| *s > 0),
        ..container_info(pod, container)
    }
}

/// The plain data the handler needs from NRI's messages.
pub fn container_info(pod: &PodSandbox, container: &Container) -> ContainerInfo {
    let resources = container.linux.as_ref().and_then(|l| l.resources.as_ref());
    ContainerInfo {
        id: container.id.clone(),
        name: container.name.clone(),
        pod_uid: pod.uid.clone(),
        pod_name: pod.name.clone(),
        pod_namespace: pod.namespace.clone(),
        env: container.env.clone(),
        cpu_shares: shares_of(resources),
        cpus: cpus_of(resources),
        stopped: container.state.value() == api::ContainerState::CONTAINER_STOPPED as i32,
    }
}

/// Upstream's `cpu_allocation_mode` of a container: by the claims its
/// environment names, unknown when that environment does not parse.
fn allocation_mode(container: &Container) -> CpuAllocationMode {
    CpuAllocationMode::of_claim_count(parse_claim_env(&container.env).ok().map(|c| c.len()))
}

/// The NRI plugin of dra-cpu.
pub struct DraCpuPlugin {
    enforcer: Arc<Enforcer>,
    resolver: Arc<dyn ClaimResolver>,
}

impl DraCpuPlugin {
    pub fn new(enforcer: Arc<Enforcer>, resolver: Arc<dyn ClaimResolver>) -> Self {
        DraCpuPlugin { enforcer, resolver }
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
            Event::UPDATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
        ])
    }

    async fn configure(&self, runtime: &RuntimeInfo, _config: &str) -> Result<(), PluginError> {
        let safe = runtime.unsolicited_updates_safe();
        self.enforcer.runtime_safe.store(safe, Ordering::Relaxed);
        self.enforcer
            .metrics
            .nri_registered
            .store(true, Ordering::Relaxed);
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
        self.enforcer
            .metrics
            .updates_sent("synchronize", outcome.updates.len());
        // Registered means synchronized: from here on every event is seen.
        self.enforcer
            .metrics
            .nri_registered
            .store(true, Ordering::Relaxed);
        self.finish("Synchronize", "ok", started);
        self.enforcer
            .metrics
            .upstream
            .record_synchronize(OpResult::Success, started.elapsed());
        Ok(to_nri_updates(&outcome.updates))
    }

    async fn shutdown(&self) {
        self.enforcer
            .metrics
            .nri_registered
            .store(false, Ordering::Relaxed);
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
        let updates = self.enforcer.view().stop_container(&container.id);
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
        view.remove_container(&container.id);
        self.enforcer.refresh(&view);
        drop(view);
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
    use shared_state::pool::ContainerKind;

    #[test]
    fn upstream_allocation_mode_follows_the_claim_env() {
        let claim = "a1a1a1a1-0000-4000-8000-000000000001";
        let cases: [(Vec<String>, CpuAllocationMode); 3] = [
            (vec!["PATH=/bin".into()], CpuAllocationMode::Shared),
            (
                vec![shared_state::claim_env::cdi_env_var(claim, &set("2-3"))],
                CpuAllocationMode::Exclusive,
            ),
            (
                vec![format!("DRA_CPUSET_{claim}=not-a-cpulist")],
                CpuAllocationMode::Unknown,
            ),
        ];
        for (env, want) in cases {
            let mut container = Container::new();
            container.env = env.clone();
            assert_eq!(allocation_mode(&container), want, "{env:?}");
        }
    }

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("set")
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn claim(uid: &str, cpus: &str, pod: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: uid.into(),
            namespace: "ns".into(),
            name: "n".into(),
            consumer_pods: vec![pod.into()],
            devices: Vec::new(),
            cpus: set(cpus),
            prepared_at_unix_ms: 0,
            pod_claim_name: None,
        }
    }

    #[test]
    fn pool_changes_without_a_usable_runtime_wait_for_the_next_reply() {
        // Every policy ends deferred here: never/auto on an unsafe runtime by
        // choice, always because no runtime connection exists.
        for policy in [
            UnsolicitedUpdates::Never,
            UnsolicitedUpdates::Auto,
            UnsolicitedUpdates::Always,
        ] {
            let metrics = Arc::new(Metrics::new());
            let view = NodeView::new(set("0-3"), CpuSet::new(), false, None);
            let enforcer = Enforcer::new(view, metrics.clone(), NriUpdater::new(), policy);
            let shared = ContainerInfo {
                id: "s".into(),
                pod_uid: "p".into(),
                ..Default::default()
            };
            enforcer.view().create(&shared).expect("shared");
            let uid = "c1c1c1c1-0000-4000-8000-000000000001";
            run(enforcer.apply_prepared(1, claim(uid, "3", "q"))).expect("prepare");
            assert_eq!(metrics.pool_change_count("deferred"), 1, "{policy:?}");
            assert_eq!(metrics.pool_change_count("unsolicited"), 0);
            assert_eq!(
                enforcer.view().pending_updates(),
                vec![("s".to_string(), set("0-2"))],
                "not recorded as applied"
            );
            assert_eq!(metrics.applied_revision.load(Ordering::Relaxed), 0);
            assert_eq!(metrics.view_revision.load(Ordering::Relaxed), 1);
        }
    }

    struct NoClaims;

    #[async_trait]
    impl ClaimResolver for NoClaims {
        async fn resolve(&self, _claim_uid: &str) -> crate::handler::Resolution {
            crate::handler::Resolution::NotPrepared
        }
    }

    fn nri_container(id: &str, env: &[String]) -> Container {
        let mut c = Container::new();
        c.id = id.into();
        c.name = id.into();
        c.env = env.to_vec();
        c
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

    /// Answers every Lookup with one prepared claim.
    struct OneClaim(ClaimAssignment);

    #[async_trait]
    impl ClaimResolver for OneClaim {
        async fn resolve(&self, claim_uid: &str) -> crate::handler::Resolution {
            if claim_uid == self.0.claim_uid {
                crate::handler::Resolution::Prepared(self.0.clone())
            } else {
                crate::handler::Resolution::NotPrepared
            }
        }
    }

    #[test]
    fn update_reply_sets_mems_on_the_updated_container_only() {
        let decision = UpdateDecision {
            kinds: Some((ContainerKind::Exclusive, ContainerKind::Mixed)),
            mems: Some(set("0-1")),
            updates: vec![("a".into(), set("0-5")), ("c".into(), set("0-7"))],
        };
        let reply = update_reply("c", &decision);
        let cpu = |i: usize| {
            reply[i]
                .linux
                .resources
                .cpu
                .clone()
                .into_option()
                .expect("cpu")
        };
        assert_eq!((cpu(0).cpus.as_str(), cpu(0).mems.as_str()), ("0-5", ""));
        assert_eq!((cpu(1).cpus.as_str(), cpu(1).mems.as_str()), ("0-7", "0-1"));
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
    fn reply_sets_cpus_mems_and_other_updates() {
        let decision = CreateDecision {
            kind: ContainerKind::Exclusive,
            cpuset: set("2-3"),
            mems: Some(set("0")),
            updates: vec![("other".into(), set("1,4-7"))],
            claims: vec!["c".into()],
        };
        let reply = creation_reply(&decision);
        let adjust = reply.adjust.expect("adjust");
        let cpu = adjust
            .linux
            .resources
            .cpu
            .clone()
            .into_option()
            .expect("cpu");
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("2-3", "0"));
        assert_eq!(reply.update.len(), 1);
        let u = &reply.update[0];
        assert_eq!(u.container_id, "other");
        let cpu = u.linux.resources.cpu.clone().into_option().expect("cpu");
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("1,4-7", ""));
        assert!(cpu.shares.is_none(), "only the cpuset is touched");
        assert!(u.ignore_failure);
    }

    #[test]
    fn container_info_reads_shares_cpus_env_and_state() {
        let mut pod = PodSandbox::new();
        pod.uid = "pod-uid".into();
        let mut c = Container::new();
        c.id = "cid".into();
        c.env = vec!["A=1".into()];
        let mut cpu = api::LinuxCPU::new();
        let mut shares = api::OptionalUInt64::new();
        shares.value = 512;
        cpu.shares = Some(shares).into();
        cpu.cpus = "0-1".into();
        let mut res = LinuxResources::new();
        res.cpu = Some(cpu).into();
        let mut linux = api::LinuxContainer::new();
        linux.resources = Some(res).into();
        c.linux = Some(linux).into();
        c.state = api::ContainerState::CONTAINER_STOPPED.into();
        let info = container_info(&pod, &c);
        assert_eq!(info.pod_uid, "pod-uid");
        assert_eq!(info.cpu_shares, Some(512));
        assert_eq!(info.cpus, set("0-1"));
        assert!(info.stopped);
        let bare = container_info(&pod, &Container::new());
        assert_eq!(
            (bare.cpu_shares, bare.cpus.is_empty(), bare.stopped),
            (None, true, false)
        );
    }
}
