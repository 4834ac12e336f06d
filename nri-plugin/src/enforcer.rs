//! The enforcer: nri-plugin's view plus what makes it real on containers.
//! It applies dra-plugin's changes to the view and decides whether the
//! cpusets that change go out now (an unsolicited `UpdateContainers`) or
//! ride on the next event reply, and keeps `--host-cgroups` on the shared
//! pool.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use dra_cpu_nri::client::NriUpdater;
use shared_state::pool::Update;
use shared_state::{ClaimAssignment, NodeSnapshot};

use crate::config::UnsolicitedUpdates;
use crate::cpuset_check::{CpusetReadBack, Verdict};
use crate::health::Health;
use crate::host_cgroups::cpusets::host_cpuset;
use crate::host_cgroups::HostCgroups;
use crate::metrics::Metrics;
use crate::nri::messages::to_nri_updates;
use crate::partition::keeper::{PartitionKeeper, Reconciled};
use crate::partition::IsolatedPartitions;
use crate::view::{NodeView, ViewError};

/// The view plus everything needed to make it real on containers.
pub struct Enforcer {
    pub(crate) view: Mutex<NodeView>,
    pub metrics: Arc<Metrics>,
    /// Whether the runtime and dra-plugin are connected.
    pub health: Arc<Health>,
    pub(crate) updater: NriUpdater,
    pub(crate) policy: UnsolicitedUpdates,
    /// Set at Configure from the runtime's NRI version.
    pub(crate) runtime_safe: AtomicBool,
    /// Whether the last refresh saw stranded containers (logged once).
    over_committed: AtomicBool,
    /// The last view revision whose updates all reached the runtime (the
    /// `nri_plugin_applied_revision` gauge shows it; this is the state).
    applied_revision: AtomicU64,
    /// Signalled when the applied revision advances, so the subscription
    /// reports it to dra-plugin without waiting for the next stream event.
    pub applied_changed: Notify,
    /// `--host-cgroups`, when set: they follow the shared pool and the
    /// reserved CPUs at every pool change.
    host_cgroups: Mutex<Option<HostCgroups>>,
    /// Whether the last sync found no CPU for them (logged once).
    host_cgroups_starved: AtomicBool,
    /// Isolated partitions (`loadBalancing: off`); `None`: such a
    /// container's start is refused.
    pub(crate) partitions: Option<PartitionKeeper>,
    /// Signalled when an unsolicited update failed, so that
    /// [`Enforcer::resend_failed_updates`] sends what is still due again.
    update_failed: Notify,
    /// The read-back of containers' cpusets; `None`: not checked.
    pub(crate) cpuset_check: Option<CpusetReadBack>,
}

/// What became of a pool change's updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolChange {
    /// Nothing was due.
    Nothing,
    /// Sent as an unsolicited update, answered.
    Sent,
    /// Left for the next event reply: the runtime takes no unsolicited
    /// update (or none is connected).
    Deferred,
    /// The unsolicited update was refused or not answered in time: still
    /// due, sent again after a pause and with the next event reply.
    Failed,
}

/// The first pause before a failed unsolicited update is sent again; it
/// doubles after each failure up to [`RESEND_MAX_DELAY`].
pub const RESEND_FIRST_DELAY: Duration = Duration::from_secs(1);
pub const RESEND_MAX_DELAY: Duration = Duration::from_secs(16);

fn lock_view(view: &Mutex<NodeView>) -> MutexGuard<'_, NodeView> {
    shared_state::sync::lock(view)
}

fn lock_host(host: &Mutex<Option<HostCgroups>>) -> MutexGuard<'_, Option<HostCgroups>> {
    shared_state::sync::lock(host)
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
            health: Arc::default(),
            updater,
            policy,
            runtime_safe: AtomicBool::new(false),
            over_committed: AtomicBool::new(false),
            applied_revision: AtomicU64::new(0),
            applied_changed: Notify::new(),
            host_cgroups: Mutex::new(None),
            host_cgroups_starved: AtomicBool::new(false),
            partitions: None,
            update_failed: Notify::new(),
            cpuset_check: None,
        }
    }

    /// Makes isolated partitions under this cgroup v2 root.
    pub fn with_isolated_partitions(mut self, partitions: IsolatedPartitions) -> Self {
        self.partitions = Some(PartitionKeeper::new(partitions));
        self
    }

    /// Makes the isolated partitions running containers lack: their claim
    /// became known to ask for one (nri-plugin started from the CDI specs,
    /// which carry no tuning), or the kernel refused it before. Called
    /// after every claim change and on a timer; never fails.
    pub fn reconcile_partitions(&self) {
        let Some(keeper) = &self.partitions else {
            return;
        };
        // The keeper's lock is taken before the view's, here and nowhere
        // the other way round.
        for outcome in keeper.reconcile(|id| self.view().isolated_cpus(id)) {
            match outcome {
                Reconciled::Made { container, cpus } => tracing::info!(
                    %container, %cpus,
                    "isolated partition made for a running container: its claim asks for one"
                ),
                Reconciled::Refused {
                    container,
                    cpus,
                    error,
                    first: true,
                } => {
                    self.metrics.refused("isolated-partition");
                    tracing::warn!(
                        %container, %cpus, %error,
                        "a running container's claim asks for an isolated partition, which the kernel refused; it runs unisolated until it is taken"
                    )
                }
                Reconciled::Refused { .. } => {}
            }
        }
        self.refresh_v1_load_balancing();
    }

    /// cgroup v1: turns off the load balancing of cgroups created since the
    /// last pass that hold isolated CPUs (a new pod's). Never fails; a
    /// failure is logged and the next pass tries again.
    pub fn refresh_v1_load_balancing(&self) {
        let Some(keeper) = &self.partitions else {
            return;
        };
        match keeper.refresh_v1() {
            Ok(written) if written.is_empty() => {}
            Ok(written) => tracing::info!(
                cgroups = ?written,
                "cgroup v1: load balancing of these cgroups brought in step with the isolated CPUs"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "cgroup v1: bringing load balancing in step with the isolated CPUs failed"
            ),
        }
    }

    /// Reads containers' cpusets back from their cgroups (see
    /// [`Enforcer::check_container_cpusets`]).
    pub fn with_cpuset_check(mut self, check: CpusetReadBack) -> Self {
        self.cpuset_check = Some(check);
        self
    }

    /// Reads back every running container's cgroup cpuset and sends again
    /// the cpuset of those found drifted (see [`crate::cpuset_check`]):
    /// now where the runtime takes unsolicited updates, else with the next
    /// event reply. Called on a timer; never fails.
    pub async fn check_container_cpusets(&self) {
        let Some(check) = &self.cpuset_check else {
            return;
        };
        let applied = self.view().applied_cpusets();
        // The cgroups are read without the view's lock.
        let verdicts = check.check(applied);
        if verdicts.is_empty() {
            return;
        }
        let mut repairs = 0;
        let updates = {
            let mut view = self.view();
            for verdict in &verdicts {
                match verdict {
                    Verdict::Repair(r) => {
                        if view.note_found(&r.container_id, &r.applied, &r.found) {
                            repairs += 1;
                            self.metrics.cpuset_drift("repaired");
                            tracing::warn!(
                                container = %r.container_id, applied = %r.applied, found = %r.found,
                                "a container's cgroup holds another cpuset than the one applied to it; sending it again"
                            );
                        }
                    }
                    Verdict::GiveUp(r) => {
                        self.metrics.cpuset_drift("given_up");
                        tracing::error!(
                            container = %r.container_id, applied = %r.applied, found = %r.found,
                            "a container's cpuset was sent again and changed back each time: something else writes its cgroup; it is left as it is"
                        );
                    }
                }
            }
            view.pending_updates()
        };
        if repairs > 0 {
            self.after_pool_change(updates, "cpuset drift").await;
        }
    }

    /// Report connections through `health` (the one `/readyz` and the
    /// gauges answer from) instead of a health of its own.
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = health;
        self
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

    /// The last view revision whose updates all reached the runtime.
    pub fn applied_revision(&self) -> u64 {
        self.applied_revision.load(Ordering::Relaxed)
    }

    /// Gauges from the view; the applied revision advances only when no
    /// update is waiting to be sent.
    pub(crate) fn refresh(&self, view: &NodeView) {
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
            let before = self
                .applied_revision
                .swap(view.revision(), Ordering::Relaxed);
            m.applied_revision.store(view.revision(), Ordering::Relaxed);
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
    pub(crate) async fn after_pool_change(
        &self,
        updates: Vec<Update>,
        why: &'static str,
    ) -> PoolChange {
        self.sync_host_cgroups();
        if updates.is_empty() {
            self.refresh(&self.view());
            return PoolChange::Nothing;
        }
        let allowed = self
            .policy
            .allowed(self.runtime_safe.load(Ordering::Relaxed));
        if !allowed || !self.updater.is_connected() {
            self.metrics.pool_change("deferred");
            tracing::info!(
                why, updates = updates.len(), policy = ?self.policy,
                "pool change deferred to the next event reply (unsolicited updates are not safe on this runtime)"
            );
            self.refresh(&self.view());
            return PoolChange::Deferred;
        }
        let n = updates.len();
        match self
            .updater
            .update_containers(to_nri_updates(&updates))
            .await
        {
            Ok(failed) => {
                let failed: Vec<&str> = failed.iter().map(|f| f.container_id.as_str()).collect();
                let sent: Vec<Update> = updates
                    .into_iter()
                    .filter(|u| !failed.contains(&u.container_id.as_str()))
                    .collect();
                let mut view = self.view();
                view.mark_applied(&sent);
                // The view may have moved on while the call was out (a claim
                // prepared meanwhile planned nothing, the pool then being
                // recorded as before the call): what is due now goes again,
                // as after a failed call. Updates the runtime reported as
                // failed wait for the next event reply, as before.
                let moved_on = view
                    .pending_updates()
                    .iter()
                    .any(|u| !failed.contains(&u.container_id.as_str()));
                self.refresh(&view);
                drop(view);
                self.metrics.pool_change("unsolicited");
                self.metrics.updates_sent("unsolicited", sent.len());
                tracing::info!(why, updates = n, failed = ?failed, "pool change sent as an unsolicited update");
                if moved_on {
                    tracing::info!(
                        why,
                        "the pool changed while the update was out; sent again shortly"
                    );
                    self.update_failed.notify_one();
                }
                PoolChange::Sent
            }
            Err(e) => {
                // A runtime that runs `runc update` for each container can
                // take longer than the call's deadline on a loaded node, and
                // containerd gives up the rest of the call with it: the
                // updates stay due, and go again without waiting for an
                // event that may not come.
                self.metrics.pool_change("failed");
                tracing::warn!(
                    why, updates = n, error = %e,
                    "unsolicited update failed; sent again shortly, or with the next event reply"
                );
                self.refresh(&self.view());
                self.update_failed.notify_one();
                PoolChange::Failed
            }
        }
    }

    /// Sends again what a failed unsolicited update left due, after
    /// [`RESEND_FIRST_DELAY`], doubling the pause after each further failure
    /// up to [`RESEND_MAX_DELAY`], until it is answered or nothing is due
    /// (an event reply carried it). Runs for the process's life.
    pub async fn resend_failed_updates(&self) {
        loop {
            self.update_failed.notified().await;
            let mut delay = RESEND_FIRST_DELAY;
            loop {
                tokio::time::sleep(delay).await;
                let due = self.view().pending_updates();
                match self.after_pool_change(due, "resend").await {
                    PoolChange::Failed => delay = (delay * 2).min(RESEND_MAX_DELAY),
                    PoolChange::Nothing | PoolChange::Sent | PoolChange::Deferred => break,
                }
            }
        }
    }

    pub async fn apply_snapshot(&self, snapshot: NodeSnapshot) -> Result<(), ViewError> {
        let updates = self.view().apply_snapshot(snapshot)?;
        self.after_pool_change(updates, "snapshot").await;
        self.reconcile_partitions();
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
        self.reconcile_partitions();
        Ok(())
    }

    pub async fn apply_unprepared(&self, revision: u64, claim_uid: &str) -> Result<(), ViewError> {
        let updates = self.view().apply_unprepared(revision, claim_uid)?;
        tracing::info!(claim = %claim_uid, revision, "claim unprepared");
        self.after_pool_change(updates, "unprepare").await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{claim, run, set};
    use crate::view::ContainerInfo;
    use shared_state::CpuSet;

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
            enforcer.view().create(&shared).decided().expect("shared");
            let uid = "c1c1c1c1-0000-4000-8000-000000000001";
            run(enforcer.apply_prepared(1, claim(uid, "3", "q"))).expect("prepare");
            assert_eq!(metrics.pool_change_count("deferred"), 1, "{policy:?}");
            assert_eq!(metrics.pool_change_count("unsolicited"), 0);
            assert_eq!(
                enforcer.view().pending_updates(),
                crate::test_support::updates(&[("s", "0-2")]),
                "not recorded as applied"
            );
            assert_eq!(metrics.applied_revision.load(Ordering::Relaxed), 0);
            assert_eq!(metrics.view_revision.load(Ordering::Relaxed), 1);
        }
    }
}
