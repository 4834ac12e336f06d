//! nri-plugin's model of the node, over plain data.
//!
//! [`NodeView`] is nri-plugin's picture of the node: the CPUs, the prepared
//! claims (from dra-plugin's snapshot and deltas, or provisionally from CDI
//! specs while dra-plugin is away) and the containers, kept in a
//! [`PoolState`]. Every method is synchronous and does no I/O, so it can run
//! under a lock on the NRI hot path. The one slow step, asking about a claim
//! the view has not heard of, goes through the
//! [`ClaimResolver`](crate::resolve::ClaimResolver) seam in
//! [`admit_container`] and [`synchronize_containers`], outside the lock.
//!
//! Planning never records an update as applied: callers send what a method
//! returns and then call [`NodeView::mark_applied`] with what they sent.
//!
//! The rooms: [`claims`] (what dra-plugin prepared), [`planning`] (a
//! container's cpuset at create, resize, stop), [`synchronize`] (rebuilding
//! from the runtime's list), [`admission`] (the steps that may ask about an
//! unknown claim), [`refusal`] (why a container is refused), [`numa`]
//! (`--align-memory`).

// A refusal is built once per refused container and carries the names the
// user needs to read; its size does not matter off the success path.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, HashSet};

use shared_state::claim_env::{parse_claim_env, EnvClaim};
use shared_state::pool::state::PoolState;
use shared_state::pool::{PoolError, Update};
use shared_state::CpuSet;

pub mod admission;
pub mod claims;
pub mod numa;
pub mod planning;
pub mod refusal;
pub mod synchronize;

use numa::NumaMap;
use refusal::Refusal;

/// What nri-plugin needs to know about a container, taken from the NRI
/// `Container` and `PodSandbox` messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub pod_uid: String,
    pub pod_name: String,
    pub pod_namespace: String,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    /// `linux.resources.cpu.shares`; `None` when the runtime sent none.
    pub cpu_shares: Option<u64>,
    /// `linux.resources.cpu.cpus` as reported (empty: unpinned or unknown).
    pub cpus: CpuSet,
    /// The container has exited; it is not given updates.
    pub stopped: bool,
}

/// Refusal of a coordination event that does not fit the view.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("event at revision {got} is not after the applied revision {applied}; resubscribing")]
    StaleRevision { got: u64, applied: u64 },
    #[error("{0}")]
    Pool(#[from] PoolError),
}

/// nri-plugin's view of the node. See the module docs.
#[derive(Debug, Clone)]
pub struct NodeView {
    pool: PoolState,
    /// nri-plugin's own `--mixed-allocation-mode`; it decides the kinds.
    mixed_mode: bool,
    numa: Option<NumaMap>,
    /// Claims learned from CDI specs, not confirmed by dra-plugin.
    provisional: HashSet<String>,
    /// Revision of the last snapshot or delta in the view; 0 before any.
    revision: u64,
    /// Whether the view follows dra-plugin's stream: a snapshot was applied
    /// and the stream has not ended since. Only then is its revision a
    /// measure of what dra-plugin has told it.
    following: bool,
    /// Containers created but not yet started, with the cpuset their
    /// CreateContainer reply gave them.
    starting: HashMap<String, Update>,
}

impl NodeView {
    /// A view before dra-plugin has been heard: `allocatable` from the
    /// topology minus the reserved CPUs, no claims yet. `numa` is set with
    /// `--align-memory`.
    pub fn new(
        allocatable: CpuSet,
        reserved: CpuSet,
        mixed_mode: bool,
        numa: Option<NumaMap>,
    ) -> Self {
        NodeView {
            pool: PoolState::new(allocatable, reserved, mixed_mode),
            mixed_mode,
            numa,
            provisional: HashSet::new(),
            revision: 0,
            following: false,
            starting: HashMap::new(),
        }
    }

    pub fn pool(&self) -> &PoolState {
        &self.pool
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn follows_dra_plugin(&self) -> bool {
        self.following
    }

    /// dra-plugin's stream ended: until the next snapshot, no event comes,
    /// and a dra-plugin started again on a new store counts its revisions
    /// from its own start.
    pub fn stop_following(&mut self) {
        self.following = false;
    }

    pub fn is_provisional(&self, claim_uid: &str) -> bool {
        self.provisional.contains(claim_uid)
    }

    /// Updates not yet sent (deferred to the next event reply).
    pub fn pending_updates(&self) -> Vec<Update> {
        self.pool.plan_updates()
    }

    /// Whether any update is waiting to be sent, without building them.
    pub fn has_pending(&self) -> bool {
        self.pool.has_pending()
    }

    /// Containers left on a stale cpuset because the shared pool is empty.
    pub fn stranded(&self) -> Vec<String> {
        self.pool.stranded()
    }

    /// Record updates as sent to the runtime.
    pub fn mark_applied(&mut self, updates: &[Update]) {
        self.pool.mark_applied(updates);
    }

    /// The runtime was told to create the container with this (the
    /// CreateContainer reply, or what it reported at Synchronize).
    pub fn note_created(&mut self, created: Update) {
        self.starting.insert(created.container_id.clone(), created);
    }

    /// The container runs (PostStartContainer). Until now an update for it
    /// could be lost: containerd 2.x drops one for a container not yet in its
    /// store, and one for a container whose task exists but is not yet
    /// marked running only changes its stored spec, not its cgroup; both
    /// report success. So if its cpuset changed since the CreateContainer
    /// reply, or its CFS quota was turned off only after it, it is planned
    /// again from what it was created with. Returns the update to send
    /// again, when one must be.
    ///
    /// "Changed" is judged on the planned cpuset as well as on the one
    /// recorded as sent: an update still in flight (sent, its answer not yet
    /// back, so not yet recorded) may have reached the runtime before the
    /// container was marked running, and is then lost like the others.
    pub fn confirm_started(&mut self, container_id: &str) -> Option<Update> {
        let created = self.starting.remove(container_id)?;
        let entry = self.pool.container(container_id)?;
        let planned = self.pool.planned_cpuset(container_id);
        let quota_as_created = created.cfs_quota_off || !entry.wants_no_cfs_quota;
        if entry.cpuset == created.cpuset
            && planned.as_ref().is_none_or(|p| *p == created.cpuset)
            && quota_as_created
        {
            return None;
        }
        self.pool.mark_applied(std::slice::from_ref(&created));
        self.pool.planned_update(container_id)
    }

    /// Every running container with the cpuset last applied to it, for the
    /// read-back of their cgroups; containers still starting are left out
    /// (their cgroup may not hold the CreateContainer reply's cpuset yet),
    /// as are those given nothing yet.
    pub fn applied_cpusets(&self) -> Vec<(String, CpuSet)> {
        self.pool
            .containers()
            .iter()
            .filter(|(id, entry)| !entry.cpuset.is_empty() && !self.starting.contains_key(*id))
            .map(|(id, entry)| (id.clone(), entry.cpuset.clone()))
            .collect()
    }

    /// A container's cgroup was found holding `found`, not the `applied`
    /// cpuset: it is planned again (see [`PoolState::note_found`]).
    pub fn note_found(&mut self, container_id: &str, applied: &CpuSet, found: &CpuSet) -> bool {
        self.pool.note_found(container_id, applied, found)
    }

    /// The container stopped or is gone before it started.
    pub fn forget_starting(&mut self, container_id: &str) {
        self.starting.remove(container_id);
    }

    /// The claims a container names. Refused when its `DRA_CPUSET_*`
    /// variables are malformed.
    pub fn env_claims(info: &ContainerInfo) -> Result<Vec<EnvClaim>, Refusal> {
        parse_claim_env(&info.env).map_err(|source| Refusal::Env {
            container: info.id.clone(),
            name: info.name.clone(),
            pod_uid: info.pod_uid.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::*;
    use proptest::prelude::*;
    use shared_state::pool::arithmetic::ContainerKind;
    use shared_state::pool::Update;

    #[test]
    fn an_update_sent_before_the_container_ran_is_sent_again_at_start() {
        let mut v = view(false);
        // A shared container is created on the whole pool ...
        let created = v
            .create(&container("shared", POD_A, &[], Some(100)))
            .decided()
            .unwrap();
        v.mark_applied(&created.updates);
        let whole = created.cpuset.clone();
        v.note_created(Update::cpuset("shared", whole.clone()));
        // ... a claim is prepared before it runs, and the shrink sent for it
        // is recorded as applied (the runtime answered success) ...
        let shrink = v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_B)).unwrap();
        assert_eq!(shrink.len(), 1);
        v.mark_applied(&shrink);
        assert!(v.pending_updates().is_empty());
        let pool = shrink[0].cpuset.clone();
        // ... so at start it is sent again, from the create-time cpuset.
        assert_eq!(
            v.confirm_started("shared"),
            Some(Update::cpuset("shared", pool.clone()))
        );
        assert_eq!(
            v.pending_updates(),
            vec![Update::cpuset("shared", pool.clone())]
        );
        v.mark_applied(&v.pending_updates());
        // Once only: a second start report, or an unknown container, is nothing.
        assert_eq!(v.confirm_started("shared"), None);
        assert_eq!(v.confirm_started("unknown"), None);

        // The start reported while the shrink is still in flight (sent, not
        // yet answered, so not recorded as applied): it may have reached the
        // runtime before the container was marked running, so it is sent
        // again too.
        let racing = v
            .create(&container("racing", POD_A, &[], Some(100)))
            .decided()
            .unwrap();
        v.mark_applied(&racing.updates);
        v.note_created(Update::cpuset("racing", racing.cpuset.clone()));
        let in_flight = v.apply_prepared(2, claim(CLAIM_2, "1", POD_B)).unwrap();
        let racing_to = in_flight
            .iter()
            .find(|u| u.container_id == "racing")
            .map(|u| u.cpuset.clone())
            .unwrap();
        assert_ne!(racing_to, racing.cpuset);
        assert_eq!(
            v.confirm_started("racing"),
            Some(Update::cpuset("racing", racing_to.clone()))
        );
        // The resend is planned at once (PostStartContainer reads it under
        // the same lock); the in-flight answer arriving afterwards does not
        // take it back.
        let resend = v.pending_updates();
        assert!(resend.contains(&Update::cpuset("racing", racing_to.clone())));
        v.mark_applied(&in_flight);
        v.mark_applied(&resend);
        assert!(v.pending_updates().is_empty());

        // The control: a container whose cpuset did not change since its
        // creation is not sent anything.
        let other = v
            .create(&container("other", POD_A, &[], Some(100)))
            .decided()
            .unwrap();
        v.mark_applied(&other.updates);
        v.note_created(Update::cpuset("other", other.cpuset.clone()));
        assert_eq!(v.confirm_started("other"), None);
        assert!(v.pending_updates().is_empty());
        // Created while the plugin was away (learned at Synchronize, where
        // the runtime gave it no cpuset, or all CPUs): the reply's update
        // may not have reached it, so its start sends the planned cpuset.
        let away = v
            .create(&container("away", POD_A, &[], Some(100)))
            .decided()
            .unwrap();
        v.mark_applied(&away.updates);
        v.note_created(Update::cpuset("away", shared_state::CpuSet::new()));
        assert_eq!(
            v.confirm_started("away"),
            Some(Update::cpuset("away", away.cpuset.clone()))
        );
        // A container stopped before it started is forgotten.
        v.note_created(Update::cpuset("gone", whole));
        v.forget_starting("gone");
        assert_eq!(v.confirm_started("gone"), None);
    }

    proptest! {
        /// Whatever the order of events, no two running containers other than
        /// mixed/shared ones overlap, no update is empty, and after sending
        /// the planned updates every container sits on its planned cpuset.
        #[test]
        fn events_never_plan_empty_or_overlapping_cpusets(
            ops in proptest::collection::vec((0u8..5, 0usize..4, 0usize..3, any::<bool>()), 1..40)
        ) {
            let claims = [CLAIM_1, CLAIM_2, "c3c3c3c3-0000-4000-8000-000000000003"];
            let cpus = ["2-3", "4", "5-6"];
            let mut v = view(true);
            let mut revision = 0;
            for (op, c, k, flag) in ops {
                let id = format!("k{c}");
                let sent = match op {
                    0 => {
                        revision += 1;
                        v.apply_prepared(revision, claim(claims[k], cpus[k], POD_A)).unwrap_or_default()
                    }
                    1 => {
                        revision += 1;
                        v.apply_unprepared(revision, claims[k]).unwrap_or_default()
                    }
                    2 => {
                        let e = env(claims[k], cpus[k]);
                        let env: Vec<&str> = if flag { vec![&e] } else { vec![] };
                        match v.create(&container(&id, POD_A, &env, Some(if flag { 100 } else { 2 }))).decided() {
                            Ok(d) => {
                                prop_assert!(!d.cpuset.is_empty());
                                d.updates
                            }
                            Err(_) => Vec::new(),
                        }
                    }
                    3 => v.stop_container(&id),
                    _ => { v.remove_container(&id); Vec::new() }
                };
                prop_assert!(sent.iter().all(|u| !u.cpuset.is_empty()));
                if flag || op != 2 {
                    v.mark_applied(&sent);
                    prop_assert!(v.pending_updates().is_empty());
                }
            }
            v.mark_applied(&v.pending_updates());
            let pool = v.pool();
            for (id, entry) in pool.containers() {
                if let Some(planned) = pool.planned_cpuset(id) {
                    prop_assert_eq!(&entry.cpuset, &planned);
                }
                if entry.kind == ContainerKind::Shared {
                    prop_assert!(entry.cpuset.is_disjoint(pool.exclusive()) || pool.shared().is_empty());
                }
            }
        }
    }
}
