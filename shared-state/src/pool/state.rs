//! The node view: the claims prepared on the node and the containers the
//! runtime knows, with admission, placement and claim changes.

use super::arithmetic::{classify, container_cpuset, shared_pool, ContainerKind};
use super::{OwnershipConflict, PoolError, Update};
use crate::assignment::ClaimAssignment;
use crate::claim_env::{validate_claims, EnvClaim};
use crate::cpuset::CpuSet;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A container the node view knows about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEntry {
    pub pod_uid: String,
    pub name: String,
    /// Claim UIDs from its environment, validated at admission.
    pub claims: Vec<String>,
    /// `cpu.shares` as the runtime reported it; kept so the kind can be
    /// recomputed when the mixed-allocation mode changes.
    pub cpu_shares: Option<u64>,
    pub kind: ContainerKind,
    /// ∪ of the CPUs of its claims that are prepared now; kept current by
    /// [`PoolState`] so planning does no claim lookups.
    pub claim_cpus: CpuSet,
    /// The cpuset last applied to it (empty: not known).
    pub cpuset: CpuSet,
    /// One of its claims that are prepared now asks for no CFS quota
    /// (`tuning.cfsQuota: off`); kept current like `claim_cpus`.
    pub wants_no_cfs_quota: bool,
    /// What was last applied to it turned its CFS quota off (`false`: the
    /// quota is as the runtime set it, e.g. from the CPU limit).
    pub cfs_quota_off: bool,
}

/// The result of admitting a container: where it goes, and what that
/// changes for the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The container being created.
    pub placement: Placement,
    /// Other containers whose cpuset must change, sorted by container id.
    pub updates: Vec<Update>,
}

/// A container placed, without the other containers' updates (see
/// [`PoolState::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The cpuset to give the container being placed.
    pub cpuset: CpuSet,
    pub kind: ContainerKind,
    /// Earlier instances of the same container (same pod and name) whose
    /// claims passed to this one, e.g. after a container restart.
    pub superseded: Vec<String>,
}

/// The node as nri-plugin sees it: CPUs, prepared claims and containers.
/// Claims never overlap and lie inside the allocatable CPUs.
#[derive(Debug, Clone, Default)]
pub struct PoolState {
    pub(super) allocatable: CpuSet,
    pub(super) reserved: CpuSet,
    pub(super) mixed_mode: bool,
    pub(super) claims: BTreeMap<String, ClaimAssignment>,
    /// ∪ of all claims' CPUs, kept up to date because claims are disjoint.
    pub(super) exclusive: CpuSet,
    /// Keyed by container id; a BTreeMap so updates come out sorted.
    pub(super) containers: BTreeMap<String, ContainerEntry>,
    /// Claim UID → the container that names it.
    pub(super) owners: HashMap<String, String>,
    /// Containers whose claims want no CFS quota and whose quota was not
    /// turned off by what was applied to them (created before the claim's
    /// tuning was known, or reported by a Synchronize).
    pub(super) quota_due: BTreeSet<String>,
}

impl PoolState {
    /// `allocatable` is the CPUs pods may use; any `reserved` CPU in it is
    /// taken out, so passing the online CPUs is also correct.
    pub fn new(allocatable: CpuSet, reserved: CpuSet, mixed_mode: bool) -> Self {
        PoolState {
            allocatable: allocatable.difference(&reserved),
            reserved,
            mixed_mode,
            ..PoolState::default()
        }
    }

    pub fn allocatable(&self) -> &CpuSet {
        &self.allocatable
    }

    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    pub fn mixed_mode(&self) -> bool {
        self.mixed_mode
    }

    pub fn claims(&self) -> &BTreeMap<String, ClaimAssignment> {
        &self.claims
    }

    pub fn claim(&self, claim_uid: &str) -> Option<&ClaimAssignment> {
        self.claims.get(claim_uid)
    }

    pub fn containers(&self) -> &BTreeMap<String, ContainerEntry> {
        &self.containers
    }

    pub fn container(&self, container_id: &str) -> Option<&ContainerEntry> {
        self.containers.get(container_id)
    }

    /// The container that names a claim, if any.
    pub fn claim_owner(&self, claim_uid: &str) -> Option<&str> {
        self.owners.get(claim_uid).map(String::as_str)
    }

    /// CPUs held by prepared claims.
    pub fn exclusive(&self) -> &CpuSet {
        &self.exclusive
    }

    /// CPUs for containers without a claim.
    pub fn shared(&self) -> CpuSet {
        shared_pool(&self.allocatable, &self.exclusive)
    }

    /// Admit a container being created (or reported by a resync): validate
    /// its claims, check that no other container owns them, and compute its
    /// cpuset and the updates due to the other containers. On error nothing
    /// changes. Re-admitting a known id replaces its entry.
    pub fn admit(
        &mut self,
        container_id: &str,
        pod_uid: &str,
        name: &str,
        refs: &[EnvClaim],
        cpu_shares: Option<u64>,
    ) -> Result<Admission, PoolError> {
        let placement = self.place(container_id, pod_uid, name, refs, cpu_shares)?;
        Ok(Admission {
            placement,
            updates: self.plan_updates(),
        })
    }

    /// [`PoolState::admit`] without planning the other containers' updates:
    /// for callers that place many containers and then plan once (a
    /// Synchronize), or plan by other means. The state afterwards is the same
    /// as after `admit`; on error nothing changes.
    pub fn place(
        &mut self,
        container_id: &str,
        pod_uid: &str,
        name: &str,
        refs: &[EnvClaim],
        cpu_shares: Option<u64>,
    ) -> Result<Placement, PoolError> {
        let claim_cpus =
            validate_claims(refs, pod_uid, |uid| self.claims.get(uid)).map_err(|source| {
                PoolError::Claim {
                    container_id: container_id.to_string(),
                    source,
                }
            })?;
        // A claim in an isolated partition (`loadBalancing: off`) has its
        // container on its CPUs alone: the partition holds no other CPU.
        let mixed_mode = self.mixed_mode
            && !refs
                .iter()
                .any(|r| self.claims.get(&r.claim_uid).is_some_and(isolates));
        let kind = classify(!refs.is_empty(), cpu_shares, mixed_mode);

        let mut superseded: Vec<String> = Vec::new();
        for r in refs {
            let Some(owner_id) = self.owners.get(&r.claim_uid) else {
                continue;
            };
            if owner_id == container_id || superseded.contains(owner_id) {
                continue;
            }
            let Some(owner) = self.containers.get(owner_id) else {
                continue;
            };
            // Kubelet restarts a container by creating a new one with the
            // same name in the same pod; the claim's CPUs pass to it.
            if owner.pod_uid == pod_uid && owner.name == name {
                superseded.push(owner_id.clone());
                continue;
            }
            return Err(PoolError::ClaimOwned(Box::new(OwnershipConflict {
                container_id: container_id.to_string(),
                pod_uid: pod_uid.to_string(),
                name: name.to_string(),
                claim_uid: r.claim_uid.clone(),
                owner_id: owner_id.clone(),
                owner_pod_uid: owner.pod_uid.clone(),
                owner_name: owner.name.clone(),
            })));
        }

        let cpuset = container_cpuset(kind, &claim_cpus, &self.shared()).map_err(|e| {
            let source = match e {
                PoolError::EmptySharedPool { .. } => PoolError::EmptySharedPool {
                    allocatable: self.allocatable.clone(),
                },
                other => other,
            };
            PoolError::Container {
                container_id: container_id.to_string(),
                source: Box::new(source),
            }
        })?;

        self.remove_container(container_id);
        for old in &superseded {
            self.remove_container(old);
        }
        let claims: Vec<String> = refs.iter().map(|r| r.claim_uid.clone()).collect();
        let wants_no_cfs_quota = self.asks_no_cfs_quota(&claims);
        for uid in &claims {
            self.owners.insert(uid.clone(), container_id.to_string());
        }
        self.containers.insert(
            container_id.to_string(),
            ContainerEntry {
                pod_uid: pod_uid.to_string(),
                name: name.to_string(),
                claims,
                cpu_shares,
                kind,
                claim_cpus,
                cpuset: cpuset.clone(),
                wants_no_cfs_quota,
                // As with the cpuset, the placement is what the container
                // gets (the creation's own adjustment turns the quota off).
                cfs_quota_off: wants_no_cfs_quota,
            },
        );
        Ok(Placement {
            cpuset,
            kind,
            superseded,
        })
    }

    /// Forget a container (the runtime removed it). Its claims stay prepared:
    /// only [`PoolState::remove_claim`] frees CPUs.
    pub fn remove_container(&mut self, container_id: &str) -> Option<ContainerEntry> {
        let entry = self.containers.remove(container_id)?;
        if entry.wants_no_cfs_quota {
            self.quota_due.remove(container_id);
        }
        for uid in &entry.claims {
            if self.owners.get(uid).is_some_and(|o| o == container_id) {
                self.owners.remove(uid);
            }
        }
        Some(entry)
    }

    /// Add or replace a prepared claim and return the updates it makes due.
    /// Refused, with nothing changed, if it has no CPUs, holds CPUs outside
    /// the allocatable ones, or shares a CPU with another claim.
    pub fn add_claim(&mut self, assignment: ClaimAssignment) -> Result<Vec<Update>, PoolError> {
        self.insert_claim(assignment, OutsideAllocatable::Refused)
    }

    /// Add or replace a claim of dra-plugin's store (a watch event or a
    /// Lookup answer): as [`PoolState::add_claim`], but a claim holding
    /// CPUs outside the allocatable ones is kept, as a snapshot keeps it.
    /// The store is the truth of what was given; a CPU may go offline
    /// between a claim's decision and its event.
    pub fn add_stored_claim(
        &mut self,
        assignment: ClaimAssignment,
    ) -> Result<Vec<Update>, PoolError> {
        self.insert_claim(assignment, OutsideAllocatable::Kept)
    }

    fn insert_claim(
        &mut self,
        assignment: ClaimAssignment,
        outside: OutsideAllocatable,
    ) -> Result<Vec<Update>, PoolError> {
        let uid = assignment.claim_uid.as_str();
        check_claim_cpus(&assignment, &self.allocatable, outside)?;
        let others = match self.claims.get(uid) {
            Some(old) => self.exclusive.difference(&old.cpus),
            None => self.exclusive.clone(),
        };
        if !assignment.cpus.is_disjoint(&others) {
            return Err(self.overlap_error(&assignment));
        }
        self.exclusive = others.union(&assignment.cpus);
        let uid = assignment.claim_uid.clone();
        self.claims.insert(uid.clone(), assignment);
        self.refresh_owner_claim_cpus(&uid);
        Ok(self.plan_updates())
    }

    /// Remove a claim (unprepared) and return the updates that give its CPUs
    /// back. Removing an unknown claim changes nothing.
    pub fn remove_claim(&mut self, claim_uid: &str) -> Vec<Update> {
        if let Some(old) = self.claims.remove(claim_uid) {
            self.exclusive = self.exclusive.difference(&old.cpus);
            self.refresh_owner_claim_cpus(claim_uid);
        }
        self.plan_updates()
    }

    /// Replace the node's CPUs, mode and claims at once (a fresh snapshot),
    /// keeping the containers, and return the updates due. Refused, with
    /// nothing changed, if a claim has no CPUs or two claims overlap.
    ///
    /// Unlike [`PoolState::add_claim`], a claim holding CPUs that are no
    /// longer allocatable is kept: the snapshot is dra-plugin's store, and a
    /// claim prepared before a CPU went offline or became reserved still
    /// holds what its container runs on. Those CPUs are outside the shared
    /// pool either way; refusing the whole snapshot for it would leave every
    /// later change unapplied.
    pub fn resync(
        &mut self,
        allocatable: CpuSet,
        reserved: CpuSet,
        mixed_mode: bool,
        claims: impl IntoIterator<Item = ClaimAssignment>,
    ) -> Result<Vec<Update>, PoolError> {
        let mut next = PoolState::new(allocatable, reserved, mixed_mode);
        for assignment in claims {
            next.insert_claim(assignment, OutsideAllocatable::Kept)?;
        }
        next.containers = std::mem::take(&mut self.containers);
        next.owners = std::mem::take(&mut self.owners);
        next.quota_due = std::mem::take(&mut self.quota_due);
        let ids: Vec<String> = next.containers.keys().cloned().collect();
        // A container admitted on a claim then known only from its CDI spec
        // (which names no pod) keeps the claim only if the record names its
        // pod: another pod's copy of the claim's env goes to the shared
        // pool, and the claim's own pod can have it.
        for id in &ids {
            let Some(entry) = next.containers.get_mut(id) else {
                continue;
            };
            let claims = &next.claims;
            let pod = entry.pod_uid.as_str();
            let foreign: Vec<String> = entry
                .claims
                .iter()
                .filter(|uid| {
                    claims.get(uid.as_str()).is_some_and(|c| {
                        !c.consumer_pods.is_empty() && !c.consumer_pods.iter().any(|p| p == pod)
                    })
                })
                .cloned()
                .collect();
            entry.claims.retain(|uid| !foreign.contains(uid));
            for uid in &foreign {
                if next.owners.get(uid).is_some_and(|owner| owner == id) {
                    next.owners.remove(uid);
                }
            }
        }
        for id in ids {
            let claim_cpus = next.claims_cpus(&next.containers[&id].claims);
            let wants_no_cfs_quota = next.asks_no_cfs_quota(&next.containers[&id].claims);
            let isolated = next.containers[&id]
                .claims
                .iter()
                .any(|uid| next.claims.get(uid).is_some_and(isolates));
            if let Some(entry) = next.containers.get_mut(&id) {
                entry.kind = classify(
                    !entry.claims.is_empty(),
                    entry.cpu_shares,
                    mixed_mode && !isolated,
                );
                entry.claim_cpus = claim_cpus;
                entry.wants_no_cfs_quota = wants_no_cfs_quota;
                Self::note_quota(&mut next.quota_due, &id, entry);
            }
        }
        *self = next;
        Ok(self.plan_updates())
    }

    /// Recompute the cached claim CPUs and quota wish of the container
    /// naming `claim_uid`.
    fn refresh_owner_claim_cpus(&mut self, claim_uid: &str) {
        let Some(owner) = self.owners.get(claim_uid) else {
            return;
        };
        let Some(claims) = self.containers.get(owner).map(|e| e.claims.as_slice()) else {
            return;
        };
        let claim_cpus = self.claims_cpus(claims);
        let wants_no_cfs_quota = self.asks_no_cfs_quota(claims);
        if let Some(entry) = self.containers.get_mut(owner.as_str()) {
            entry.claim_cpus = claim_cpus;
            entry.wants_no_cfs_quota = wants_no_cfs_quota;
            Self::note_quota(&mut self.quota_due, owner, entry);
        }
    }

    /// Keeps `quota_due` true to the container's entry.
    pub(super) fn note_quota(quota_due: &mut BTreeSet<String>, id: &str, entry: &ContainerEntry) {
        if entry.wants_no_cfs_quota && !entry.cfs_quota_off {
            if !quota_due.contains(id) {
                quota_due.insert(id.to_string());
            }
        } else {
            quota_due.remove(id);
        }
    }

    /// Whether one of these claims, prepared now, asks for no CFS quota.
    fn asks_no_cfs_quota(&self, uids: &[String]) -> bool {
        uids.iter().any(|u| {
            self.claims
                .get(u)
                .is_some_and(|claim| claim.tuning.cfs_quota_off)
        })
    }

    /// The CPUs of the container's claims (`None`: the container runs on no
    /// claim). A mixed container's cpuset holds the shared pool besides.
    pub fn claim_cpus(&self, container_id: &str) -> Option<CpuSet> {
        let entry = self.containers.get(container_id)?;
        (!entry.claims.is_empty()).then(|| self.claims_cpus(&entry.claims))
    }

    /// The CPUs of the container's claims when one of them asks for an
    /// isolated partition (`tuning.loadBalancing: off`): all of them go in
    /// it, since the container runs on them alone.
    pub fn isolated_cpus(&self, container_id: &str) -> Option<CpuSet> {
        let entry = self.containers.get(container_id)?;
        entry
            .claims
            .iter()
            .any(|uid| self.claims.get(uid).is_some_and(isolates))
            .then(|| self.claims_cpus(&entry.claims))
    }

    fn claims_cpus(&self, uids: &[String]) -> CpuSet {
        let mut found = uids.iter().filter_map(|u| self.claims.get(u));
        let Some(first) = found.next() else {
            return CpuSet::new();
        };
        found.fold(first.cpus.clone(), |acc, c| acc.union(&c.cpus))
    }

    fn overlap_error(&self, assignment: &ClaimAssignment) -> PoolError {
        let other = self
            .claims
            .values()
            .filter(|c| c.claim_uid != assignment.claim_uid)
            .find(|c| !c.cpus.is_disjoint(&assignment.cpus));
        match other {
            Some(o) => PoolError::ClaimOverlap {
                claim_uid: assignment.claim_uid.clone(),
                other_claim: o.claim_uid.clone(),
                overlap: o.cpus.intersection(&assignment.cpus),
            },
            // Unreachable while `exclusive` is the union of the claims; still
            // reported as an overlap rather than trusted.
            None => PoolError::ClaimOverlap {
                claim_uid: assignment.claim_uid.clone(),
                other_claim: String::from("(unknown)"),
                overlap: self.exclusive.intersection(&assignment.cpus),
            },
        }
    }
}

/// Whether a claim asks for its CPUs in an isolated partition.
fn isolates(claim: &ClaimAssignment) -> bool {
    claim.tuning.load_balancing_off
}

/// What a claim holding CPUs outside the allocatable ones gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutsideAllocatable {
    /// A claim learned from a CDI spec alone: refused.
    Refused,
    /// A claim of dra-plugin's store (a snapshot, an event, a Lookup): kept.
    Kept,
}

fn check_claim_cpus(
    assignment: &ClaimAssignment,
    allocatable: &CpuSet,
    outside_allocatable: OutsideAllocatable,
) -> Result<(), PoolError> {
    if assignment.cpus.is_empty() {
        return Err(PoolError::EmptyClaim {
            claim_uid: assignment.claim_uid.clone(),
        });
    }
    let outside = assignment.cpus.difference(allocatable);
    if !outside.is_empty() && outside_allocatable == OutsideAllocatable::Refused {
        return Err(PoolError::ClaimOutsideAllocatable {
            claim_uid: assignment.claim_uid.clone(),
            outside,
            allocatable: allocatable.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::fixtures::*;

    #[test]
    fn reserved_cpus_never_reach_the_shared_pool() {
        let state = node(false);
        assert_eq!(state.allocatable(), &set("1-7"));
        assert_eq!(state.shared(), set("1-7"));
        assert_eq!(state.reserved(), &set("0"));
    }

    #[test]
    fn claims_shrink_and_grow_only_changed_containers() {
        let mut s = node(true);
        let a = s
            .admit("c-shared", "pod-1", "app", &[], None)
            .expect("shared");
        assert_eq!(
            (a.placement.kind, a.placement.cpuset.clone()),
            (ContainerKind::Shared, set("1-7"))
        );
        assert!(a.updates.is_empty());

        let up = s.add_claim(claim("aa", "2-3", "pod-2")).expect("claim");
        assert_eq!(up, updates(&[("c-shared", "1,4-7")]));
        s.mark_applied(&up);
        assert_eq!(s.exclusive(), &set("2-3"));

        let a = s
            .admit("c-mixed", "pod-2", "app", &[cref("aa", "2-3")], Some(512))
            .expect("mixed");
        assert_eq!(
            (a.placement.kind, a.placement.cpuset.clone()),
            (ContainerKind::Mixed, set("1-7"))
        );
        assert!(
            a.updates.is_empty(),
            "nothing else changes: {:?}",
            a.updates
        );

        s.add_claim(claim("bb", "5", "pod-3"))
            .map(|up| {
                assert_eq!(
                    up,
                    updates(&[("c-mixed", "1-4,6-7"), ("c-shared", "1,4,6-7")])
                );
                s.mark_applied(&up);
            })
            .expect("second claim");
        let a = s
            .admit("c-excl", "pod-3", "app", &[cref("bb", "5")], Some(2))
            .expect("exclusive");
        assert_eq!(
            (a.placement.kind, a.placement.cpuset.clone()),
            (ContainerKind::Exclusive, set("5"))
        );
        assert!(a.updates.is_empty());

        // A repeated prepare changes nothing.
        assert!(s
            .add_claim(claim("bb", "5", "pod-3"))
            .expect("same")
            .is_empty());

        let up = s.remove_claim("aa");
        // c-mixed already ran on aa's CPUs, so its set does not change.
        assert_eq!(up, updates(&[("c-shared", "1-4,6-7")]));
        s.mark_applied(&up);
        assert!(s.remove_claim("unknown").is_empty());
        assert!(s.plan_updates().is_empty());
    }

    #[test]
    fn a_claim_in_an_isolated_partition_is_never_mixed() {
        let mut s = node(true);
        let mut isolated = claim("aa", "2-3", "pod-2");
        isolated.tuning.load_balancing_off = true;
        s.add_claim(isolated.clone()).expect("isolated claim");
        s.add_claim(claim("bb", "5", "pod-3")).expect("plain claim");
        let a = s
            .admit("c-iso", "pod-2", "app", &[cref("aa", "2-3")], Some(512))
            .expect("isolated");
        assert_eq!(
            (a.placement.kind, a.placement.cpuset.clone()),
            (ContainerKind::Exclusive, set("2-3")),
            "a CPU request beside the claim does not add the shared pool"
        );
        assert_eq!(s.isolated_cpus("c-iso"), Some(set("2-3")));
        let b = s
            .admit("c-mixed", "pod-3", "app", &[cref("bb", "5")], Some(512))
            .expect("mixed");
        assert_eq!(b.placement.kind, ContainerKind::Mixed);
        assert_eq!(s.isolated_cpus("c-mixed"), None);
        assert_eq!(s.isolated_cpus("unknown"), None);
        // A mixed container's claim CPUs are its claim's, not its cpuset.
        assert_ne!(b.placement.cpuset, set("5"));
        assert_eq!(s.claim_cpus("c-mixed"), Some(set("5")));
        assert_eq!(s.claim_cpus("c-iso"), Some(set("2-3")));
        assert_eq!(s.claim_cpus("unknown"), None);
        // A fresh snapshot keeps the rule.
        s.resync(
            set("1-7"),
            set("0"),
            true,
            [isolated, claim("bb", "5", "pod-3")],
        )
        .expect("resync");
        assert_eq!(
            s.container("c-iso").map(|c| c.kind),
            Some(ContainerKind::Exclusive)
        );
    }

    #[test]
    fn empty_shared_pool_refuses_new_and_strands_existing_shared_containers() {
        let mut s = PoolState::new(set("0-3"), CpuSet::new(), false);
        s.admit("c1", "p", "app", &[], None).expect("shared");
        let up = s
            .add_claim(claim("aa", "0-3", "p2"))
            .expect("claim takes all");
        assert!(up.is_empty(), "an empty cpuset is never sent: {up:?}");
        assert_eq!(s.stranded(), vec!["c1".to_string()]);
        assert_eq!(s.planned_cpuset("c1"), None);
        let err = s
            .admit("c2", "p", "new", &[], None)
            .expect_err("empty pool");
        assert!(
            err.to_string()
                .contains("container c2: the shared pool is empty: every allocatable CPU (0-3)"),
            "{err}"
        );
        assert!(s.container("c2").is_none());
        // The claim container itself still runs.
        let a = s
            .admit("c3", "p2", "app", &[cref("aa", "0-3")], None)
            .expect("excl");
        assert_eq!(a.placement.cpuset, set("0-3"));
        // Freed again: c1 kept 0-3 and the orphaned c3 joins the pool it is
        // already on, so nothing needs sending.
        assert!(s.remove_claim("aa").is_empty());
        assert!(s.stranded().is_empty());
        assert_eq!(s.planned_cpuset("c1"), Some(set("0-3")));
    }

    /// A claim first known without its pod (from its CDI spec) was taken by
    /// a container of another pod; dra-plugin's snapshot naming the claim's
    /// pod sends that container to the shared pool and lets the claim's pod
    /// have the claim. Control: the claim's own pod's container keeps it.
    #[test]
    fn a_snapshot_takes_a_claim_from_a_pod_it_does_not_name() {
        for (holder_pod, keeps) in [("pod-b", false), ("pod-a", true)] {
            let mut s = node(false);
            let mut spec_only = claim("aa", "2-3", "pod-a");
            spec_only.consumer_pods.clear();
            s.add_claim(spec_only).expect("provisional claim");
            let mut adopted = claim("aa", "2-3", holder_pod);
            adopted.consumer_pods = vec![holder_pod.to_string()];
            s.add_claim(adopted).expect("adopted");
            s.admit("holder", holder_pod, "app", &[cref("aa", "2-3")], None)
                .expect("admitted while the claim named no other pod");

            let updates = s
                .resync(set("1-7"), set("0"), false, [claim("aa", "2-3", "pod-a")])
                .expect("snapshot");
            let entry = &s.containers()["holder"];
            if keeps {
                assert_eq!(entry.kind, ContainerKind::Exclusive);
                assert!(updates.is_empty(), "{updates:?}");
                continue;
            }
            assert_eq!(entry.kind, ContainerKind::Shared);
            assert!(entry.claims.is_empty());
            assert_eq!(s.planned_cpuset("holder"), Some(set("1,4-7")));
            s.admit("owner", "pod-a", "app", &[cref("aa", "2-3")], None)
                .expect("the claim's own pod");
        }
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let mut s = node(true);
        s.add_claim(claim("aa", "2-3", "pod-a")).expect("claim");
        s.admit("owner", "pod-a", "app", &[cref("aa", "2-3")], None)
            .expect("owner");

        let err = s
            .admit("thief", "pod-a", "sidecar", &[cref("aa", "2-3")], None)
            .expect_err("owned");
        assert!(
            err.to_string().contains(
                "claim aa already belongs to container owner (app in pod pod-a); a claim serves one container"
            ),
            "{err}"
        );
        let err = s
            .admit("forger", "pod-a", "x", &[cref("aa", "2-4")], None)
            .expect_err("forged");
        assert!(
            err.to_string()
                .contains("container forger: claim aa: the container environment says CPUs 2-4"),
            "{err}"
        );
        let err = s
            .admit("other-pod", "pod-b", "app", &[cref("aa", "2-3")], None)
            .expect_err("wrong pod");
        assert!(err.to_string().contains("not for pod pod-b"), "{err}");
        let err = s
            .admit("early", "pod-c", "app", &[cref("cc", "5")], None)
            .expect_err("unknown");
        assert_eq!(err.unknown_claim(), Some("cc"));
        assert_eq!(s.containers().len(), 1, "refusals leave nothing behind");

        let err = s
            .add_claim(claim("bb", "3-4", "pod-b"))
            .expect_err("overlap");
        assert_eq!(
            err,
            PoolError::ClaimOverlap {
                claim_uid: "bb".into(),
                other_claim: "aa".into(),
                overlap: set("3")
            }
        );
        assert!(err
            .to_string()
            .contains("claim bb: CPUs 3 are already held by claim aa"));
        let err = s
            .add_claim(claim("bb", "0,8", "pod-b"))
            .expect_err("outside");
        assert!(
            err.to_string().contains("CPUs 0,8 are not allocatable"),
            "{err}"
        );
        let err = s.add_claim(claim("bb", "", "pod-b")).expect_err("empty");
        assert!(err.to_string().contains("claim bb has no CPUs"));
        assert!(s.claim("bb").is_none());
        assert_eq!(s.exclusive(), &set("2-3"));
        // Replacing a claim's CPUs may overlap only its own old ones.
        let up = s.add_claim(claim("aa", "3-4", "pod-a")).expect("replace");
        assert_eq!(up, updates(&[("owner", "3-4")]));
        assert_eq!(s.exclusive(), &set("3-4"));
    }

    #[test]
    fn restart_keeps_the_reservation_and_passes_the_claim_on() {
        let mut s = node(false);
        s.add_claim(claim("aa", "4-5", "pod")).expect("claim");
        s.admit("first", "pod", "app", &[cref("aa", "4-5")], None)
            .expect("first");
        // Stopped, not yet removed: the claim stays reserved.
        assert_eq!(s.shared(), set("1-3,6-7"));
        let a = s
            .admit("second", "pod", "app", &[cref("aa", "4-5")], None)
            .expect("restart");
        assert_eq!(a.placement.cpuset, set("4-5"));
        assert_eq!(a.placement.superseded, vec!["first".to_string()]);
        assert_eq!(s.claim_owner("aa"), Some("second"));
        assert!(s.remove_container("first").is_none());
        assert!(s.remove_container("second").is_some());
        assert_eq!(s.claim_owner("aa"), None);
        assert_eq!(
            s.exclusive(),
            &set("4-5"),
            "removing a container keeps its claim"
        );
    }

    #[test]
    fn orphaned_claim_container_leaves_freed_cpus() {
        let mut s = node(false);
        s.add_claim(claim("aa", "4-5", "pod")).expect("claim");
        s.admit("c", "pod", "app", &[cref("aa", "4-5")], None)
            .expect("admit");
        assert_eq!(s.remove_claim("aa"), updates(&[("c", "1-7")]));
    }

    #[test]
    fn a_snapshot_keeps_a_claim_whose_cpus_are_no_longer_allocatable() {
        // CPU 7 went offline (or became reserved) while the claim held it;
        // dra-plugin restarted and its snapshot says so.
        let mut s = node(false);
        s.add_claim(claim("aa", "6-7", "pod")).expect("claim");
        s.admit("c", "pod", "app", &[cref("aa", "6-7")], None)
            .expect("excl");
        s.admit("sh", "p2", "app", &[], None).expect("shared");
        s.mark_applied(&s.plan_updates());

        let up = s
            .resync(
                set("0-6"),
                set("0"),
                false,
                [claim("aa", "6-7", "pod"), claim("bb", "2", "p3")],
            )
            .expect("a snapshot with a claim on a CPU no longer allocatable");
        assert_eq!(s.exclusive(), &set("2,6-7"));
        assert_eq!(s.shared(), set("1,3-5"));
        assert_eq!(up, updates(&[("sh", "1,3-5")]));
        // Learned from a CDI spec alone, such a claim is refused (from
        // dra-plugin's store it is kept, below).
        assert!(matches!(
            s.add_claim(claim("cc", "7", "p4")),
            Err(PoolError::ClaimOutsideAllocatable { .. })
        ));
        // Unprepared, its CPU outside the allocatable ones stays out of the pool.
        s.mark_applied(&up);
        s.remove_claim("aa");
        assert_eq!(s.shared(), set("1,3-6"));
        s.add_stored_claim(claim("cc", "7", "p4"))
            .expect("a stored claim on a CPU no longer allocatable");
        assert_eq!(s.exclusive(), &set("2,7"));
        assert_eq!(s.shared(), set("1,3-6"));
    }

    #[test]
    fn resync_replaces_claims_and_mode_atomically() {
        let mut s = node(false);
        s.add_claim(claim("aa", "2", "pod")).expect("claim");
        s.admit("c", "pod", "app", &[cref("aa", "2")], Some(100))
            .expect("excl");
        s.admit("sh", "p2", "app", &[], None).expect("shared");
        s.mark_applied(&s.plan_updates());

        let bad = s.resync(
            set("0-7"),
            set("0"),
            true,
            [claim("aa", "2-3", "pod"), claim("bb", "3", "p3")],
        );
        assert!(
            matches!(bad, Err(PoolError::ClaimOverlap { .. })),
            "{bad:?}"
        );
        assert!(!s.mixed_mode());
        assert_eq!(s.exclusive(), &set("2"));

        let up = s
            .resync(
                set("0-7"),
                set("0"),
                true,
                [claim("aa", "2", "pod"), claim("bb", "7", "p3")],
            )
            .expect("resync");
        assert_eq!(up, updates(&[("c", "1-6"), ("sh", "1,3-6")]));
        assert_eq!(s.container("c").map(|c| c.kind), Some(ContainerKind::Mixed));
    }
}
