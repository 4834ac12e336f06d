//! The shared pool, container kinds and the cpuset every container should
//! have, as pure functions and a plain node view ([`PoolState`]).
//!
//! allocatable = online − reserved; exclusive = ∪ prepared claims' CPUs;
//! shared pool = allocatable − exclusive. A shared container runs on the shared
//! pool, an exclusive one on its claims' CPUs, a mixed one on both.
//!
//! [`PoolState`] never assumes an update reached the runtime: each container
//! keeps the cpuset last applied to it, every planning call returns the
//! containers whose correct cpuset differs from that, and the caller records
//! what it actually sent with [`PoolState::mark_applied`]. An update deferred
//! to the next event (runtimes where unsolicited updates are unsafe) is
//! therefore planned again until sent, and one made moot by a later change
//! disappears.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Bound;

use crate::assignment::ClaimAssignment;
use crate::claim_env::{validate_claims, ClaimEnvError, EnvClaim};
use crate::cpuset::CpuSet;

/// Kubelet's `cpu.shares` for a container without a CPU request
/// (`max(2, milliCPU*1024/1000)`); anything above it means a request was made.
pub const NO_REQUEST_CPU_SHARES: u64 = 2;

/// A cpuset to apply to one container: `(container id, cpuset)`.
pub type Update = (String, CpuSet);

/// How a container is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    /// No claim: runs on the shared pool.
    Shared,
    /// Claims only: runs on its claims' CPUs.
    Exclusive,
    /// Claims and a CPU request in mixed-allocation mode: claims' CPUs ∪ shared pool.
    Mixed,
}

impl fmt::Display for ContainerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ContainerKind::Shared => "shared",
            ContainerKind::Exclusive => "exclusive",
            ContainerKind::Mixed => "mixed",
        })
    }
}

/// Why a container or claim was refused. Each variant names what is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("container {container_id}: {source}")]
    Claim {
        container_id: String,
        #[source]
        source: ClaimEnvError,
    },
    #[error("container {container_id}: {source}")]
    Container {
        container_id: String,
        #[source]
        source: Box<PoolError>,
    },
    #[error("the shared pool is empty: every allocatable CPU ({allocatable}) is held by a claim, so there is no CPU left for containers without one")]
    EmptySharedPool { allocatable: CpuSet },
    #[error("a {kind} container needs the CPUs of at least one claim and names none")]
    NoClaimCpus { kind: ContainerKind },
    #[error("{0}")]
    ClaimOwned(Box<OwnershipConflict>),
    #[error("claim {claim_uid} has no CPUs")]
    EmptyClaim { claim_uid: String },
    #[error("claim {claim_uid}: CPUs {outside} are not allocatable on this node (allocatable: {allocatable})")]
    ClaimOutsideAllocatable {
        claim_uid: String,
        outside: CpuSet,
        allocatable: CpuSet,
    },
    #[error("claim {claim_uid}: CPUs {overlap} are already held by claim {other_claim}")]
    ClaimOverlap {
        claim_uid: String,
        other_claim: String,
        overlap: CpuSet,
    },
}

/// A container naming a claim that another container already owns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container_id} ({name} in pod {pod_uid}): claim {claim_uid} already belongs to container {owner_id} ({owner_name} in pod {owner_pod_uid}); a claim serves one container")]
pub struct OwnershipConflict {
    pub container_id: String,
    pub pod_uid: String,
    pub name: String,
    pub claim_uid: String,
    pub owner_id: String,
    pub owner_pod_uid: String,
    pub owner_name: String,
}

impl PoolError {
    /// The claim to look up before retrying, when a container was refused only
    /// because one of its claims is not known yet.
    pub fn unknown_claim(&self) -> Option<&str> {
        match self {
            PoolError::Claim { source, .. } => source.unknown_claim(),
            _ => None,
        }
    }
}

/// CPUs left for containers without a claim.
pub fn shared_pool(allocatable: &CpuSet, exclusive: &CpuSet) -> CpuSet {
    allocatable.difference(exclusive)
}

/// The kind of a container from whether it names claims, its `cpu.shares`
/// (`None`: no request) and the node's mixed-allocation mode.
pub fn classify(has_claims: bool, cpu_shares: Option<u64>, mixed_mode: bool) -> ContainerKind {
    let requests_cpu = cpu_shares.is_some_and(|s| s > NO_REQUEST_CPU_SHARES);
    match (has_claims, mixed_mode && requests_cpu) {
        (false, _) => ContainerKind::Shared,
        (true, true) => ContainerKind::Mixed,
        (true, false) => ContainerKind::Exclusive,
    }
}

/// The cpuset a new container of `kind` gets. Refuses an empty result, because
/// NRI reads an empty cpuset as "leave unchanged" and the container would run
/// on whatever CPUs it inherited.
pub fn container_cpuset(
    kind: ContainerKind,
    claim_cpus: &CpuSet,
    shared: &CpuSet,
) -> Result<CpuSet, PoolError> {
    if kind != ContainerKind::Shared && claim_cpus.is_empty() {
        return Err(PoolError::NoClaimCpus { kind });
    }
    match kind {
        ContainerKind::Shared if shared.is_empty() => Err(PoolError::EmptySharedPool {
            allocatable: CpuSet::new(),
        }),
        ContainerKind::Shared => Ok(shared.clone()),
        ContainerKind::Exclusive => Ok(claim_cpus.clone()),
        ContainerKind::Mixed => Ok(claim_cpus.union(shared)),
    }
}

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
}

/// The result of admitting a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The cpuset to give the container being created.
    pub cpuset: CpuSet,
    pub kind: ContainerKind,
    /// Other containers whose cpuset must change, sorted by container id.
    pub updates: Vec<Update>,
    /// Earlier instances of the same container (same pod and name) whose
    /// claims passed to this one, e.g. after a container restart.
    pub superseded: Vec<String>,
}

/// A container placed without planning the other containers' updates (see
/// [`PoolState::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The cpuset to give the container being placed.
    pub cpuset: CpuSet,
    pub kind: ContainerKind,
    /// Earlier instances of the same container whose claims passed to it.
    pub superseded: Vec<String>,
}

/// The node as nri-plugin sees it: CPUs, prepared claims and containers.
/// Claims never overlap and lie inside the allocatable CPUs.
#[derive(Debug, Clone, Default)]
pub struct PoolState {
    allocatable: CpuSet,
    reserved: CpuSet,
    mixed_mode: bool,
    claims: BTreeMap<String, ClaimAssignment>,
    /// ∪ of all claims' CPUs, kept up to date because claims are disjoint.
    exclusive: CpuSet,
    /// Keyed by container id; a BTreeMap so updates come out sorted.
    containers: BTreeMap<String, ContainerEntry>,
    /// Claim UID → the container that names it.
    owners: HashMap<String, String>,
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
        let placed = self.place(container_id, pod_uid, name, refs, cpu_shares)?;
        Ok(Admission {
            cpuset: placed.cpuset,
            kind: placed.kind,
            updates: self.plan_updates(),
            superseded: placed.superseded,
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
        let kind = classify(!refs.is_empty(), cpu_shares, self.mixed_mode);

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
        let uid = assignment.claim_uid.as_str();
        check_claim_cpus(&assignment, &self.allocatable)?;
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
    /// nothing changed, if any claim is invalid or two claims overlap.
    pub fn resync(
        &mut self,
        allocatable: CpuSet,
        reserved: CpuSet,
        mixed_mode: bool,
        claims: impl IntoIterator<Item = ClaimAssignment>,
    ) -> Result<Vec<Update>, PoolError> {
        let mut next = PoolState::new(allocatable, reserved, mixed_mode);
        for assignment in claims {
            next.add_claim(assignment)?;
        }
        next.containers = std::mem::take(&mut self.containers);
        next.owners = std::mem::take(&mut self.owners);
        let ids: Vec<String> = next.containers.keys().cloned().collect();
        for id in ids {
            let claim_cpus = next.claims_cpus(&next.containers[&id].claims);
            if let Some(entry) = next.containers.get_mut(&id) {
                entry.kind = classify(!entry.claims.is_empty(), entry.cpu_shares, mixed_mode);
                entry.claim_cpus = claim_cpus;
            }
        }
        *self = next;
        Ok(self.plan_updates())
    }

    /// Every container whose correct cpuset differs from the one last applied,
    /// sorted by container id. Containers whose correct cpuset would be empty
    /// are left out (see [`PoolState::stranded`]).
    pub fn plan_updates(&self) -> Vec<Update> {
        let shared = self.shared();
        self.containers
            .iter()
            .filter(|(_, entry)| !Self::is_current(entry, &shared))
            .filter_map(|(id, entry)| {
                let target = Self::target(entry, &shared)?;
                (*target != entry.cpuset).then(|| (id.clone(), target.into_owned()))
            })
            .collect()
    }

    /// Whether [`PoolState::plan_updates`] would return anything, without
    /// building the updates.
    pub fn has_pending(&self) -> bool {
        let shared = self.shared();
        self.containers.values().any(|entry| {
            !Self::is_current(entry, &shared)
                && Self::target(entry, &shared).is_some_and(|target| *target != entry.cpuset)
        })
    }

    /// Whether a container already has its correct cpuset, without building
    /// it: planning runs on every NRI event over every container, and the
    /// mixed union would otherwise be allocated for each mixed container.
    fn is_current(entry: &ContainerEntry, shared: &CpuSet) -> bool {
        let own = &entry.claim_cpus;
        match entry.kind {
            ContainerKind::Mixed if !own.is_empty() => {
                // own ⊆ exclusive and shared ∩ exclusive = ∅, so the union's
                // size is the sum and containment both ways means equality.
                own.is_subset(&entry.cpuset)
                    && shared.is_subset(&entry.cpuset)
                    && entry.cpuset.len() == own.len() + shared.len()
            }
            _ => false,
        }
    }

    /// The cpuset a container should have now; `None` for an unknown
    /// container or when it would be empty.
    pub fn planned_cpuset(&self, container_id: &str) -> Option<CpuSet> {
        let entry = self.containers.get(container_id)?;
        Self::target(entry, &self.shared()).map(Cow::into_owned)
    }

    /// Containers that cannot be given a correct cpuset because it would be
    /// empty (the shared pool is exhausted); they keep their last cpuset.
    pub fn stranded(&self) -> Vec<String> {
        let shared = self.shared();
        self.containers
            .iter()
            .filter(|(_, entry)| Self::target(entry, &shared).is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Record cpusets as applied to their containers (after they were sent to
    /// the runtime). Unknown container ids are ignored.
    pub fn mark_applied(&mut self, updates: &[Update]) {
        let Some(((first, _), _)) = updates.split_first() else {
            return;
        };
        let sorted = updates.windows(2).all(|w| w[0].0 < w[1].0);
        // A plan's updates are sorted like the containers: one merge walk
        // instead of a tree lookup per update, once there are enough of them.
        if !sorted || updates.len() < MERGE_THRESHOLD {
            for (id, cpus) in updates {
                if let Some(entry) = self.containers.get_mut(id) {
                    set_cpuset(entry, cpus);
                }
            }
            return;
        }
        let mut entries = self
            .containers
            .range_mut::<str, _>((Bound::Included(first.as_str()), Bound::Unbounded));
        let mut next = entries.next();
        for (id, cpus) in updates {
            while let Some((key, entry)) = next.as_mut() {
                match key.as_str().cmp(id.as_str()) {
                    Ordering::Less => next = entries.next(),
                    Ordering::Equal => {
                        set_cpuset(entry, cpus);
                        next = entries.next();
                        break;
                    }
                    // Unknown id: ignored.
                    Ordering::Greater => break,
                }
            }
            if next.is_none() {
                return;
            }
        }
    }

    fn target<'s>(entry: &'s ContainerEntry, shared: &'s CpuSet) -> Option<Cow<'s, CpuSet>> {
        let own = &entry.claim_cpus;
        let target = match entry.kind {
            ContainerKind::Shared => Cow::Borrowed(shared),
            // A claim container whose claims were all unprepared must leave
            // their CPUs, which may be handed to another claim.
            ContainerKind::Exclusive if own.is_empty() => Cow::Borrowed(shared),
            ContainerKind::Exclusive => Cow::Borrowed(own),
            ContainerKind::Mixed => Cow::Owned(own.union(shared)),
        };
        (!target.is_empty()).then_some(target)
    }

    /// Recompute the cached claim CPUs of the container naming `claim_uid`.
    fn refresh_owner_claim_cpus(&mut self, claim_uid: &str) {
        let Some(owner) = self.owners.get(claim_uid) else {
            return;
        };
        let Some(claims) = self.containers.get(owner).map(|e| e.claims.as_slice()) else {
            return;
        };
        let claim_cpus = self.claims_cpus(claims);
        if let Some(entry) = self.containers.get_mut(owner.as_str()) {
            entry.claim_cpus = claim_cpus;
        }
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

/// From this many updates on, [`PoolState::mark_applied`] walks the
/// containers once instead of looking each update up.
const MERGE_THRESHOLD: usize = 16;

fn set_cpuset(entry: &mut ContainerEntry, cpus: &CpuSet) {
    if entry.cpuset != *cpus {
        entry.cpuset = cpus.clone();
    }
}

fn check_claim_cpus(assignment: &ClaimAssignment, allocatable: &CpuSet) -> Result<(), PoolError> {
    if assignment.cpus.is_empty() {
        return Err(PoolError::EmptyClaim {
            claim_uid: assignment.claim_uid.clone(),
        });
    }
    let outside = assignment.cpus.difference(allocatable);
    if !outside.is_empty() {
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
    use proptest::prelude::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("valid cpulist")
    }

    fn claim(uid: &str, cpus: &str, pod: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: uid.to_string(),
            namespace: "default".to_string(),
            name: format!("claim-{uid}"),
            consumer_pods: vec![pod.to_string()],
            devices: Vec::new(),
            cpus: set(cpus),
            prepared_at_unix_ms: 0,
            pod_claim_name: None,
        }
    }

    fn cref(uid: &str, cpus: &str) -> EnvClaim {
        EnvClaim {
            claim_uid: uid.to_string(),
            cpus: set(cpus),
        }
    }

    fn updates(list: &[(&str, &str)]) -> Vec<Update> {
        list.iter()
            .map(|(id, c)| (id.to_string(), set(c)))
            .collect()
    }

    #[test]
    fn classify_table() {
        use ContainerKind::*;
        let cases = [
            (false, None, false, Shared),
            (false, Some(1024), true, Shared),
            (true, None, false, Exclusive),
            (true, None, true, Exclusive),
            (true, Some(2), true, Exclusive),
            (true, Some(3), true, Mixed),
            (true, Some(3), false, Exclusive),
            (true, Some(256), true, Mixed),
            (true, Some(0), true, Exclusive),
        ];
        for (claims, shares, mode, want) in cases {
            assert_eq!(
                classify(claims, shares, mode),
                want,
                "{claims} {shares:?} {mode}"
            );
        }
    }

    #[test]
    fn pool_math_and_container_cpusets() {
        assert_eq!(
            shared_pool(&set("0-15"), &set("2-3,8")),
            set("0-1,4-7,9-15")
        );
        assert_eq!(shared_pool(&set("0-3"), &set("0-3")), CpuSet::new());
        assert_eq!(shared_pool(&set("0-3"), &CpuSet::new()), set("0-3"));

        let shared = set("0-1,6-7");
        let claim = set("2-3");
        let ok = |k, c: &CpuSet, s: &CpuSet| container_cpuset(k, c, s).expect("non-empty");
        assert_eq!(ok(ContainerKind::Shared, &CpuSet::new(), &shared), shared);
        assert_eq!(ok(ContainerKind::Exclusive, &claim, &shared), claim);
        assert_eq!(ok(ContainerKind::Mixed, &claim, &shared), set("0-3,6-7"));
        assert_eq!(ok(ContainerKind::Mixed, &claim, &CpuSet::new()), claim);

        let err = container_cpuset(ContainerKind::Shared, &CpuSet::new(), &CpuSet::new())
            .expect_err("empty pool");
        assert!(err.to_string().contains("shared pool is empty"), "{err}");
        for kind in [ContainerKind::Exclusive, ContainerKind::Mixed] {
            let err = container_cpuset(kind, &CpuSet::new(), &shared).expect_err("no claim");
            assert_eq!(err, PoolError::NoClaimCpus { kind });
        }
    }

    fn node(mixed: bool) -> PoolState {
        PoolState::new(set("0-7"), set("0"), mixed)
    }

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
            (a.kind, a.cpuset.clone()),
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
            (a.kind, a.cpuset.clone()),
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
            (a.kind, a.cpuset.clone()),
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
    fn deferred_updates_are_planned_until_sent_and_dropped_when_moot() {
        let mut s = node(false);
        s.admit("c1", "p", "app", &[], None).expect("shared");
        let shrink = s.add_claim(claim("aa", "7", "p2")).expect("claim");
        assert_eq!(shrink, updates(&[("c1", "1-6")]));
        // Not sent: the next event's reply carries it.
        let a = s.admit("c2", "p", "other", &[], None).expect("shared");
        assert_eq!(a.cpuset, set("1-6"));
        assert_eq!(a.updates, updates(&[("c1", "1-6")]));
        // Unprepared before anything was sent: c1 already has the right set.
        let up = s.remove_claim("aa");
        assert_eq!(up, updates(&[("c2", "1-7")]));
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
        assert_eq!(a.cpuset, set("0-3"));
        // Freed again: c1 kept 0-3 and the orphaned c3 joins the pool it is
        // already on, so nothing needs sending.
        assert!(s.remove_claim("aa").is_empty());
        assert!(s.stranded().is_empty());
        assert_eq!(s.planned_cpuset("c1"), Some(set("0-3")));
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
        assert_eq!(a.cpuset, set("4-5"));
        assert_eq!(a.superseded, vec!["first".to_string()]);
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

    // ---- property test: every step agrees with a from-scratch computation.

    #[derive(Debug, Clone)]
    enum Op {
        AddClaim {
            claim: usize,
            cpus: Vec<u32>,
        },
        RemoveClaim {
            claim: usize,
        },
        Admit {
            container: usize,
            pod: usize,
            claims: Vec<usize>,
            shares: Option<u64>,
        },
        RemoveContainer {
            container: usize,
        },
        Resync {
            mixed: bool,
        },
    }

    const CPUS: u32 = 16;

    fn claim_uid(i: usize) -> String {
        format!("c{i:x}")
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0usize..6, proptest::collection::vec(1u32..CPUS, 1..4))
                .prop_map(|(claim, cpus)| Op::AddClaim { claim, cpus }),
            1 => (0usize..6).prop_map(|claim| Op::RemoveClaim { claim }),
            4 => (0usize..10, 0usize..3, proptest::collection::vec(0usize..6, 0..3),
                  proptest::option::of(prop_oneof![Just(2u64), Just(3u64), Just(1024u64)]))
                .prop_map(|(container, pod, claims, shares)| Op::Admit { container, pod, claims, shares }),
            1 => (0usize..10).prop_map(|container| Op::RemoveContainer { container }),
            1 => any::<bool>().prop_map(|mixed| Op::Resync { mixed }),
        ]
    }

    /// The cpuset a container should have, computed only from the claims and
    /// its kind, independently of the incremental bookkeeping.
    fn from_scratch(s: &PoolState, entry: &ContainerEntry) -> CpuSet {
        let exclusive: CpuSet = s.claims().values().flat_map(|c| c.cpus.iter()).collect();
        let shared: CpuSet = s
            .allocatable()
            .iter()
            .filter(|c| !exclusive.contains(*c))
            .collect();
        let own: CpuSet = entry
            .claims
            .iter()
            .filter_map(|u| s.claim(u))
            .flat_map(|c| c.cpus.iter())
            .collect();
        match entry.kind {
            ContainerKind::Shared => shared,
            ContainerKind::Exclusive if own.is_empty() => shared,
            ContainerKind::Exclusive => own,
            ContainerKind::Mixed => own.union(&shared),
        }
    }

    proptest! {
        #[test]
        fn every_step_matches_a_from_scratch_plan(mixed in any::<bool>(), ops in proptest::collection::vec(op(), 1..40)) {
            let mut s = PoolState::new((0..CPUS).collect(), set("0"), mixed);
            let pods = ["pod-0", "pod-1", "pod-2"];
            for op in ops {
                let applied = match op {
                    Op::AddClaim { claim: i, cpus } => {
                        let mut a = claim(&claim_uid(i), "", pods[i % 3]);
                        a.cpus = cpus.into_iter().collect();
                        let before = s.exclusive().clone();
                        match s.add_claim(a.clone()) {
                            Ok(up) => up,
                            Err(_) => {
                                prop_assert_eq!(s.exclusive(), &before);
                                Vec::new()
                            }
                        }
                    }
                    Op::RemoveClaim { claim } => s.remove_claim(&claim_uid(claim)),
                    Op::Admit { container, pod, claims, shares } => {
                        let refs: Vec<EnvClaim> = claims
                            .iter()
                            .filter_map(|i| s.claim(&claim_uid(*i)))
                            .map(|c| EnvClaim { claim_uid: c.claim_uid.clone(), cpus: c.cpus.clone() })
                            .collect();
                        let mut refs_dedup: Vec<EnvClaim> = Vec::new();
                        for r in refs {
                            if !refs_dedup.contains(&r) { refs_dedup.push(r); }
                        }
                        let id = format!("k{container}");
                        match s.admit(&id, pods[pod], &format!("n{container}"), &refs_dedup, shares) {
                            Ok(a) => {
                                prop_assert_eq!(Some(&a.cpuset), s.container(&id).map(|c| &c.cpuset));
                                prop_assert!(a.updates.iter().all(|(u, _)| u != &id));
                                a.updates
                            }
                            Err(_) => Vec::new(),
                        }
                    }
                    Op::RemoveContainer { container } => {
                        s.remove_container(&format!("k{container}"));
                        Vec::new()
                    }
                    Op::Resync { mixed } => {
                        let claims: Vec<ClaimAssignment> = s.claims().values().cloned().collect();
                        s.resync((0..CPUS).collect(), set("0"), mixed, claims).expect("valid claims")
                    }
                };
                prop_assert!(applied.windows(2).all(|w| w[0].0 < w[1].0), "sorted, unique");
                for (id, cpus) in &applied {
                    let entry = s.container(id).expect("update for a known container");
                    prop_assert_ne!(&entry.cpuset, cpus, "only changed containers");
                    prop_assert!(!cpus.is_empty());
                }
                prop_assert_eq!(s.has_pending(), !applied.is_empty());
                s.mark_applied(&applied);
                prop_assert!(s.plan_updates().is_empty());
                prop_assert!(!s.has_pending());

                let mut exclusive_seen = CpuSet::new();
                for (id, entry) in s.containers() {
                    let want = from_scratch(&s, entry);
                    if want.is_empty() {
                        prop_assert!(s.stranded().contains(id));
                        continue;
                    }
                    prop_assert_eq!(&entry.cpuset, &want, "container {}", id);
                    let own: Vec<&ClaimAssignment> = entry.claims.iter().filter_map(|u| s.claim(u)).collect();
                    if entry.kind == ContainerKind::Exclusive && !own.is_empty() {
                        prop_assert!(entry.cpuset.is_disjoint(&exclusive_seen), "exclusive overlap at {}", id);
                        exclusive_seen = exclusive_seen.union(&entry.cpuset);
                    }
                    for c in s.claims().values() {
                        if !own.iter().any(|o| o.claim_uid == c.claim_uid) {
                            prop_assert!(entry.cpuset.is_disjoint(&c.cpus), "{} on claim {}", id, c.claim_uid);
                        }
                    }
                    prop_assert!(entry.cpuset.is_disjoint(s.reserved()));
                }
                let mut owners = std::collections::HashSet::new();
                for entry in s.containers().values() {
                    for u in &entry.claims {
                        prop_assert!(owners.insert(u.clone()), "claim {} has two containers", u);
                    }
                }
            }
        }
    }

    // ---- property tests: the fast paths equal straightforward references.

    /// Marking by one lookup per update, as the reference for the merge walk.
    fn mark_by_lookup(s: &mut PoolState, updates: &[Update]) {
        for (id, cpus) in updates {
            if let Some(entry) = s.containers.get_mut(id) {
                entry.cpuset = cpus.clone();
            }
        }
    }

    fn cpusets(s: &PoolState) -> Vec<(String, CpuSet)> {
        s.containers()
            .iter()
            .map(|(id, e)| (id.clone(), e.cpuset.clone()))
            .collect()
    }

    proptest! {
        #[test]
        fn mark_applied_equals_one_lookup_per_update(
            known in proptest::collection::btree_set(0u32..200, 0..60),
            marks in proptest::collection::vec((0u32..220, 0u32..16), 0..80),
            sort in any::<bool>(),
        ) {
            let mut s = PoolState::new((0..16).collect(), CpuSet::new(), false);
            for k in &known {
                s.place(&format!("k{k:03}"), "p", &format!("n{k}"), &[], None).expect("shared");
            }
            // Ids known and unknown, sorted or not, repeated when unsorted.
            let mut updates: Vec<Update> = marks
                .iter()
                .map(|(k, cpu)| (format!("k{k:03}"), [*cpu].into_iter().collect()))
                .collect();
            if sort {
                updates.sort_by(|a, b| a.0.cmp(&b.0));
                updates.dedup_by(|a, b| a.0 == b.0);
            }
            let mut reference = s.clone();
            mark_by_lookup(&mut reference, &updates);
            s.mark_applied(&updates);
            prop_assert_eq!(cpusets(&s), cpusets(&reference));
        }

        /// Placing containers one by one and planning once at the end gives
        /// the state and the plan of admitting them one by one.
        #[test]
        fn placing_then_planning_once_equals_admitting_each(
            mixed in any::<bool>(),
            claims in proptest::collection::vec(proptest::collection::vec(1u32..CPUS, 1..4), 0..6),
            containers in proptest::collection::vec(
                (0usize..12, 0usize..3, proptest::collection::vec(0usize..6, 0..3),
                 proptest::option::of(prop_oneof![Just(2u64), Just(3u64), Just(1024u64)]),
                 proptest::collection::vec(0u32..CPUS, 0..4)),
                0..30),
        ) {
            let pods = ["pod-0", "pod-1", "pod-2"];
            let mut base = PoolState::new((0..CPUS).collect(), set("0"), mixed);
            for (i, cpus) in claims.into_iter().enumerate() {
                let mut a = claim(&claim_uid(i), "", pods[i % 3]);
                a.cpus = cpus.into_iter().collect();
                let _ = base.add_claim(a);
            }
            let mut admitted = base.clone();
            let mut placed = base;
            for (c, pod, claims, shares, reported) in containers {
                let mut refs: Vec<EnvClaim> = Vec::new();
                for i in claims {
                    if let Some(cl) = admitted.claim(&claim_uid(i)) {
                        let r = EnvClaim { claim_uid: cl.claim_uid.clone(), cpus: cl.cpus.clone() };
                        if !refs.contains(&r) { refs.push(r); }
                    }
                }
                let id = format!("k{c:02}");
                let name = format!("n{c}");
                let a = admitted.admit(&id, pods[pod], &name, &refs, shares);
                let p = placed.place(&id, pods[pod], &name, &refs, shares);
                match (a, p) {
                    (Ok(a), Ok(p)) => {
                        prop_assert_eq!((&a.cpuset, a.kind, &a.superseded), (&p.cpuset, p.kind, &p.superseded));
                        // What a runtime reports for the container.
                        let now: Update = (id.clone(), reported.into_iter().collect());
                        admitted.mark_applied(std::slice::from_ref(&now));
                        placed.mark_applied(std::slice::from_ref(&now));
                    }
                    (Err(a), Err(p)) => prop_assert_eq!(a, p),
                    (a, p) => prop_assert!(false, "admit {:?} but place {:?}", a, p),
                }
            }
            prop_assert_eq!(cpusets(&placed), cpusets(&admitted));
            prop_assert_eq!(placed.plan_updates(), admitted.plan_updates());
            prop_assert_eq!(placed.has_pending(), !admitted.plan_updates().is_empty());
        }
    }
}
