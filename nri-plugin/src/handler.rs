//! NRI events turned into cpuset decisions, over plain data.
//!
//! [`NodeView`] is nri-plugin's picture of the node: the CPUs, the prepared
//! claims (from dra-plugin's snapshot and deltas, or provisionally from CDI
//! specs while dra-plugin is away) and the containers, kept in a
//! [`PoolState`]. Every method is synchronous and does no I/O, so it can run
//! under a lock on the NRI hot path. The one slow step, asking about a claim
//! the view has not heard of, goes through the [`ClaimResolver`] seam in
//! [`admit_container`] and [`synchronize_containers`], outside the lock.
//!
//! Planning never records an update as applied: callers send what a method
//! returns and then call [`NodeView::mark_applied`] with what they sent.

// A refusal is built once per refused container and carries the names the
// user needs to read; its size does not matter off the success path.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use shared_state::claim_env::{parse_claim_env, ClaimEnvError, ClaimRef};
use shared_state::pool::{ContainerKind, PoolError, PoolState, Update};
use shared_state::topology::Topology;
use shared_state::{ClaimAssignment, CpuSet, NodeSnapshot};

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

/// Where the CPUs of a claim came from when the view learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOrigin {
    /// dra-plugin's snapshot, a delta, or a Lookup answer.
    DraPlugin,
    /// The claim's CDI spec on disk, read while dra-plugin was unreachable.
    /// Such a claim is provisional: the CDI spec names its CPUs but not the
    /// pod it is reserved for, so the first pod whose container names it
    /// becomes its consumer, and the next snapshot replaces it.
    CdiSpec,
}

/// The answer of a [`ClaimResolver`] about one claim UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// dra-plugin answered with the prepared claim.
    Prepared(ClaimAssignment),
    /// dra-plugin answered that the claim is not prepared on this node.
    NotPrepared,
    /// dra-plugin could not be asked; the claim's CDI spec says these CPUs.
    FromCdi(CpuSet),
    /// dra-plugin could not be asked and no usable CDI spec was found; the
    /// text says what was tried.
    Unverifiable(String),
}

/// Asks about a claim the view does not know yet. Implementations bound the
/// time they take: the NRI runtime waits at most 2 s for a reply.
#[async_trait::async_trait]
pub trait ClaimResolver: Send + Sync {
    async fn resolve(&self, claim_uid: &str) -> Resolution;
}

/// Why a container is refused at creation. The text reaches the user through
/// the runtime's CreateContainer error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("dra-cpu refuses container {container} ({name} in pod {pod_uid}): {source}")]
    Env {
        container: String,
        name: String,
        pod_uid: String,
        #[source]
        source: ClaimEnvError,
    },
    #[error("dra-cpu refuses container {name} in pod {pod_uid}: {source}")]
    Pool {
        name: String,
        pod_uid: String,
        #[source]
        source: PoolError,
    },
    #[error("dra-cpu refuses container {container} ({name} in pod {pod_uid}): claim {claim_uid} is not prepared on this node (dra-plugin says so)")]
    NotPrepared {
        container: String,
        name: String,
        pod_uid: String,
        claim_uid: String,
    },
    #[error("dra-cpu refuses container {container} ({name} in pod {pod_uid}): claim {claim_uid} cannot be verified: {reason}")]
    Unverifiable {
        container: String,
        name: String,
        pod_uid: String,
        claim_uid: String,
        reason: String,
    },
    #[error("dra-cpu refuses container {container} ({name} in pod {pod_uid}): claim {claim_uid} from its CDI spec: {source}")]
    BadCdiClaim {
        container: String,
        name: String,
        pod_uid: String,
        claim_uid: String,
        #[source]
        source: PoolError,
    },
}

impl Refusal {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Env { .. } => "bad-env",
            Refusal::NotPrepared { .. } => "claim-not-prepared",
            Refusal::Unverifiable { .. } => "claim-unverifiable",
            Refusal::BadCdiClaim { .. } => "bad-cdi-claim",
            Refusal::Pool { source, .. } => pool_reason(source),
        }
    }
}

fn pool_reason(error: &PoolError) -> &'static str {
    match error {
        PoolError::Claim { source, .. } => match source {
            ClaimEnvError::UnknownClaim { .. } => "claim-not-prepared",
            ClaimEnvError::CpusMismatch { .. } => "cpus-mismatch",
            ClaimEnvError::WrongPod { .. } => "wrong-pod",
            _ => "bad-env",
        },
        PoolError::Container { source, .. } => pool_reason(source),
        PoolError::EmptySharedPool { .. } => "empty-shared-pool",
        PoolError::NoClaimCpus { .. } => "no-claim-cpus",
        PoolError::ClaimOwned(_) => "claim-owned",
        PoolError::EmptyClaim { .. }
        | PoolError::ClaimOutsideAllocatable { .. }
        | PoolError::ClaimOverlap { .. } => "bad-claim",
    }
}

/// The decision for a container being created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateDecision {
    pub kind: ContainerKind,
    /// The container's cpuset; never empty.
    pub cpuset: CpuSet,
    /// NUMA nodes for `cpuset.mems` (`--align-memory`, claim containers only):
    /// those of every CPU in `cpuset`.
    pub mems: Option<CpuSet>,
    /// Cpusets of other containers to change in the same reply.
    pub updates: Vec<Update>,
    /// The claims the container holds.
    pub claims: Vec<String>,
}

/// The decision for a container whose resources the runtime is updating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateDecision {
    /// The container's kind before and after; `None` for a container the
    /// view does not know (it is left as the runtime has it).
    pub kinds: Option<(ContainerKind, ContainerKind)>,
    /// New `cpuset.mems` for the container itself (`--align-memory`, when
    /// its kind changed).
    pub mems: Option<CpuSet>,
    /// Cpusets to apply, the container's own included, sorted by id.
    pub updates: Vec<Update>,
}

/// The outcome of a Synchronize.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Every container whose cpuset must change, sorted by id.
    pub updates: Vec<Update>,
    /// Running containers whose claims did not validate; they are placed on
    /// the shared pool, never on claim CPUs.
    pub demoted: Vec<(String, String)>,
}

/// Refusal of a coordination event that does not fit the view.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("event at revision {got} is not after the applied revision {applied}; resubscribing")]
    StaleRevision { got: u64, applied: u64 },
    #[error("{0}")]
    Pool(#[from] PoolError),
}

/// CPU → NUMA node, for `--align-memory`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumaMap {
    /// Indexed by CPU id; `None` for CPUs the topology does not list.
    numa_of: Vec<Option<u32>>,
}

impl NumaMap {
    pub fn from_topology(topology: &Topology) -> Self {
        let len = topology.cpus.iter().map(|c| c.id as usize + 1).max();
        let mut numa_of = vec![None; len.unwrap_or(0)];
        for cpu in &topology.cpus {
            if let Some(slot) = numa_of.get_mut(cpu.id as usize) {
                *slot = Some(cpu.numa);
            }
        }
        NumaMap { numa_of }
    }

    /// The NUMA nodes of `cpus`; `None` if any CPU's node is unknown (then
    /// memory is left unrestricted rather than guessed).
    pub fn nodes_of(&self, cpus: &CpuSet) -> Option<CpuSet> {
        let mut nodes = CpuSet::new();
        for cpu in cpus.iter() {
            nodes.insert(self.numa_of.get(cpu as usize).copied().flatten()?);
        }
        (!nodes.is_empty()).then_some(nodes)
    }
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
    /// Whether a snapshot from dra-plugin has been applied.
    has_snapshot: bool,
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
            has_snapshot: false,
        }
    }

    pub fn pool(&self) -> &PoolState {
        &self.pool
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn has_snapshot(&self) -> bool {
        self.has_snapshot
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

    /// Record cpusets as sent to the runtime.
    pub fn mark_applied(&mut self, updates: &[Update]) {
        self.pool.mark_applied(updates);
    }

    /// The claims a container names. Refused when its `DRA_CPUSET_*`
    /// variables are malformed.
    pub fn claim_refs(info: &ContainerInfo) -> Result<Vec<ClaimRef>, Refusal> {
        parse_claim_env(&info.env).map_err(|source| Refusal::Env {
            container: info.id.clone(),
            name: info.name.clone(),
            pod_uid: info.pod_uid.clone(),
            source,
        })
    }

    /// Decide the cpuset of a container being created. `Err(Ok(uid))`: claim
    /// `uid` is not known yet and must be resolved first; `Err(Err(_))`: the
    /// container is refused. Nothing changes on error.
    pub fn create(
        &mut self,
        info: &ContainerInfo,
    ) -> Result<CreateDecision, Result<String, Refusal>> {
        let refs = Self::claim_refs(info).map_err(Err)?;
        self.adopt_provisional(&refs, &info.pod_uid);
        let admission = self
            .pool
            .admit(&info.id, &info.pod_uid, &info.name, &refs, info.cpu_shares)
            .map_err(|source| match source.unknown_claim() {
                Some(uid) => Ok(uid.to_string()),
                None => Err(Refusal::Pool {
                    name: info.name.clone(),
                    pod_uid: info.pod_uid.clone(),
                    source,
                }),
            })?;
        // The memory nodes of every CPU the container runs on: an exclusive
        // container's claim, a mixed container's claim and the shared pool
        // (its memory must not be confined to the claim's node while it
        // also runs on the others).
        let mems = match (admission.kind, &self.numa) {
            (ContainerKind::Shared, _) | (_, None) => None,
            (_, Some(numa)) => numa.nodes_of(&admission.cpuset),
        };
        Ok(CreateDecision {
            kind: admission.kind,
            cpuset: admission.cpuset,
            mems,
            updates: admission.updates,
            claims: refs.into_iter().map(|r| r.claim_uid).collect(),
        })
    }

    /// A provisional claim has no known consumer; the first pod naming it
    /// becomes one, after which the usual one-container rule protects it.
    fn adopt_provisional(&mut self, refs: &[ClaimRef], pod_uid: &str) {
        for r in refs {
            if !self.provisional.contains(&r.claim_uid) {
                continue;
            }
            let Some(claim) = self.pool.claim(&r.claim_uid) else {
                continue;
            };
            if !claim.consumer_pods.is_empty() {
                continue;
            }
            let mut adopted = claim.clone();
            adopted.consumer_pods.push(pod_uid.to_string());
            // Replacing a claim with the same CPUs cannot fail validation.
            if self.pool.add_claim(adopted).is_err() {
                tracing::warn!(claim = %r.claim_uid, "could not adopt a provisional claim");
            }
        }
    }

    /// Add a claim learned outside the watch stream (a Lookup answer or a
    /// CDI spec). Returns the updates it makes due; they are not applied.
    pub fn learn_claim(
        &mut self,
        assignment: ClaimAssignment,
        origin: ClaimOrigin,
    ) -> Result<Vec<Update>, PoolError> {
        let uid = assignment.claim_uid.clone();
        let updates = self.pool.add_claim(assignment)?;
        match origin {
            ClaimOrigin::DraPlugin => self.provisional.remove(&uid),
            ClaimOrigin::CdiSpec => self.provisional.insert(uid),
        };
        Ok(updates)
    }

    /// Replace claims and CPUs with a snapshot; containers stay.
    pub fn apply_snapshot(&mut self, snapshot: NodeSnapshot) -> Result<Vec<Update>, ViewError> {
        if snapshot.mixed_allocation_mode != self.mixed_mode {
            tracing::warn!(
                dra_plugin = snapshot.mixed_allocation_mode,
                nri_plugin = self.mixed_mode,
                "dra-plugin and nri-plugin disagree on --mixed-allocation-mode; nri-plugin's setting decides container kinds"
            );
        }
        let updates = self.pool.resync(
            snapshot.allocatable,
            snapshot.reserved,
            self.mixed_mode,
            snapshot.claims,
        )?;
        self.provisional.clear();
        self.revision = snapshot.revision;
        self.has_snapshot = true;
        Ok(updates)
    }

    fn check_revision(&self, revision: u64) -> Result<(), ViewError> {
        if revision <= self.revision {
            return Err(ViewError::StaleRevision {
                got: revision,
                applied: self.revision,
            });
        }
        Ok(())
    }

    /// A claim was prepared. Refused if the revision goes backwards.
    pub fn apply_prepared(
        &mut self,
        revision: u64,
        assignment: ClaimAssignment,
    ) -> Result<Vec<Update>, ViewError> {
        self.check_revision(revision)?;
        let updates = self.learn_claim(assignment, ClaimOrigin::DraPlugin)?;
        self.revision = revision;
        Ok(updates)
    }

    /// A claim was unprepared: its CPUs return to the shared pool.
    pub fn apply_unprepared(
        &mut self,
        revision: u64,
        claim_uid: &str,
    ) -> Result<Vec<Update>, ViewError> {
        self.check_revision(revision)?;
        self.provisional.remove(claim_uid);
        self.revision = revision;
        Ok(self.pool.remove_claim(claim_uid))
    }

    /// A container stopped: it leaves the view (its claim stays prepared, so
    /// a restarted container gets the same CPUs). Returns pending updates of
    /// the remaining containers.
    pub fn stop_container(&mut self, container_id: &str) -> Vec<Update> {
        self.pool.remove_container(container_id);
        self.pool.plan_updates()
    }

    /// The runtime removed a container.
    pub fn remove_container(&mut self, container_id: &str) {
        self.pool.remove_container(container_id);
    }

    /// The runtime is updating a container's resources: kubelet resizing a
    /// pod in place sends CRI `UpdateContainerResources` with the new CPU
    /// request as `cpu.shares`, which the runtime passes to NRI
    /// `UpdateContainer`. The container is re-classified at once (a claim
    /// container gaining a request in mixed mode becomes mixed, one losing it
    /// becomes exclusive; a shared container stays shared), so later pool
    /// changes follow its new kind. The updates always include the
    /// container's own cpuset: the runtime merges it over the CRI request,
    /// so a cpuset in that request (or none) cannot unpin the container.
    pub fn update_container(&mut self, info: &ContainerInfo) -> UpdateDecision {
        let mut kinds = None;
        if let Some(entry) = self.pool.container(&info.id).cloned() {
            let refs: Vec<ClaimRef> = entry
                .claims
                .iter()
                .filter_map(|uid| self.pool.claim(uid))
                .map(|c| ClaimRef {
                    claim_uid: c.claim_uid.clone(),
                    cpus: c.cpus.clone(),
                })
                .collect();
            let shares = info.cpu_shares.or(entry.cpu_shares);
            match self
                .pool
                .place(&info.id, &entry.pod_uid, &entry.name, &refs, shares)
            {
                Ok(placed) => kinds = Some((entry.kind, placed.kind)),
                Err(err) => {
                    tracing::warn!(container = %info.id, error = %err, "keeping the container's placement");
                    kinds = Some((entry.kind, entry.kind));
                }
            }
        }
        let mut updates = self.pool.plan_updates();
        let own = self.pool.planned_cpuset(&info.id);
        if let Some(own) = &own {
            if !updates.iter().any(|(id, _)| id == &info.id) {
                updates.push((info.id.clone(), own.clone()));
                updates.sort_by(|a, b| a.0.cmp(&b.0));
            }
        }
        // A kind change moves the container's memory with its CPUs, as at
        // creation: the NUMA nodes of every CPU it now runs on.
        let mems = match (kinds, &self.numa, &own) {
            (Some((before, after)), Some(numa), Some(own))
                if before != after && after != ContainerKind::Shared =>
            {
                numa.nodes_of(own)
            }
            _ => None,
        };
        UpdateDecision {
            kinds,
            mems,
            updates,
        }
    }

    /// Rebuild the container view from the runtime's list and return the
    /// updates that put every running container on its correct cpuset.
    /// Claims must already be resolved (see [`synchronize_containers`]);
    /// a container whose claims do not validate is placed as shared.
    /// Every container is placed first and the updates are planned once at
    /// the end, so the work grows linearly with the number of containers.
    pub fn synchronize(&mut self, containers: &[ContainerInfo]) -> SyncOutcome {
        let running: Vec<&ContainerInfo> = containers.iter().filter(|c| !c.stopped).collect();
        let keep: BTreeSet<&str> = running.iter().map(|c| c.id.as_str()).collect();
        let known: Vec<String> = self.pool.containers().keys().cloned().collect();
        for id in known {
            if !keep.contains(id.as_str()) {
                self.pool.remove_container(&id);
            }
        }
        let mut demoted = Vec::new();
        // Claim containers first, so a forged copy of a claim never takes it
        // from its owner by sorting earlier.
        let mut ordered = running.clone();
        ordered.sort_by_key(|c| {
            (
                c.env.iter().all(|e| !e.starts_with("DRA_CPUSET_")),
                c.id.clone(),
            )
        });
        for info in ordered {
            let refs = Self::claim_refs(info);
            self.adopt_provisional(refs.as_deref().unwrap_or(&[]), &info.pod_uid);
            let admitted = match refs {
                Ok(refs) => self
                    .pool
                    .place(&info.id, &info.pod_uid, &info.name, &refs, info.cpu_shares)
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(reason) = admitted {
                demoted.push((info.id.clone(), reason));
                if let Err(err) =
                    self.pool
                        .place(&info.id, &info.pod_uid, &info.name, &[], info.cpu_shares)
                {
                    // Shared pool empty: the container keeps what it has.
                    tracing::warn!(container = %info.id, error = %err, "cannot place container");
                    continue;
                }
            }
            // What the runtime reports is what the container has now.
            self.pool
                .mark_applied(&[(info.id.clone(), info.cpus.clone())]);
        }
        SyncOutcome {
            updates: self.pool.plan_updates(),
            demoted,
        }
    }
}

/// Claim UIDs that containers name but the view does not know, in order.
pub fn unknown_claims(view: &NodeView, containers: &[ContainerInfo]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for info in containers.iter().filter(|c| !c.stopped) {
        let Ok(refs) = NodeView::claim_refs(info) else {
            continue;
        };
        for r in refs {
            if view.pool().claim(&r.claim_uid).is_none() && !out.contains(&r.claim_uid) {
                out.push(r.claim_uid);
            }
        }
    }
    out
}

fn lock(view: &Mutex<NodeView>) -> std::sync::MutexGuard<'_, NodeView> {
    // The view is plain data; a panic elsewhere cannot leave it half-written
    // in a way that is worse than refusing to serve.
    match view.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A claim from a CDI spec as the view stores it (no consumer yet).
pub fn cdi_claim(claim_uid: &str, cpus: CpuSet) -> ClaimAssignment {
    ClaimAssignment {
        claim_uid: claim_uid.to_string(),
        namespace: String::new(),
        name: String::new(),
        consumer_pods: Vec::new(),
        devices: Vec::new(),
        cpus,
        prepared_at_unix_ms: 0,
        pod_claim_name: None,
    }
}

/// Teach the view about one claim through the resolver.
async fn resolve_into<R: ClaimResolver + ?Sized>(
    view: &Mutex<NodeView>,
    resolver: &R,
    claim_uid: &str,
) -> Result<(), ResolveFailure> {
    learn_resolution(view, claim_uid, resolver.resolve(claim_uid).await)
}

fn learn_resolution(
    view: &Mutex<NodeView>,
    claim_uid: &str,
    resolution: Resolution,
) -> Result<(), ResolveFailure> {
    match resolution {
        Resolution::Prepared(assignment) => lock(view)
            .learn_claim(assignment, ClaimOrigin::DraPlugin)
            .map(|_| ())
            .map_err(ResolveFailure::Pool),
        Resolution::FromCdi(cpus) => lock(view)
            .learn_claim(cdi_claim(claim_uid, cpus), ClaimOrigin::CdiSpec)
            .map(|_| ())
            .map_err(ResolveFailure::Cdi),
        Resolution::NotPrepared => Err(ResolveFailure::NotPrepared),
        Resolution::Unverifiable(reason) => Err(ResolveFailure::Unverifiable(reason)),
    }
}

enum ResolveFailure {
    NotPrepared,
    Unverifiable(String),
    Pool(PoolError),
    Cdi(PoolError),
}

/// CreateContainer: decide, resolving unknown claims through `resolver`
/// (each claim at most once). The returned updates are not marked applied.
pub async fn admit_container<R: ClaimResolver + ?Sized>(
    view: &Mutex<NodeView>,
    info: &ContainerInfo,
    resolver: &R,
) -> Result<CreateDecision, Refusal> {
    let mut asked: Vec<String> = Vec::new();
    loop {
        let uid = match lock(view).create(info) {
            Ok(decision) => return Ok(decision),
            Err(Err(refusal)) => return Err(refusal),
            Err(Ok(uid)) => uid,
        };
        if asked.contains(&uid) {
            // Resolved but gone again (unprepared meanwhile).
            return Err(Refusal::NotPrepared {
                container: info.id.clone(),
                name: info.name.clone(),
                pod_uid: info.pod_uid.clone(),
                claim_uid: uid,
            });
        }
        let failure = resolve_into(view, resolver, &uid).await;
        let base = || (info.id.clone(), info.name.clone(), info.pod_uid.clone());
        match failure {
            Ok(()) => {}
            Err(ResolveFailure::NotPrepared) => {
                let (container, name, pod_uid) = base();
                return Err(Refusal::NotPrepared {
                    container,
                    name,
                    pod_uid,
                    claim_uid: uid,
                });
            }
            Err(ResolveFailure::Unverifiable(reason)) => {
                let (container, name, pod_uid) = base();
                return Err(Refusal::Unverifiable {
                    container,
                    name,
                    pod_uid,
                    claim_uid: uid,
                    reason,
                });
            }
            Err(ResolveFailure::Pool(source)) => {
                return Err(Refusal::Pool {
                    name: info.name.clone(),
                    pod_uid: info.pod_uid.clone(),
                    source,
                })
            }
            Err(ResolveFailure::Cdi(source)) => {
                let (container, name, pod_uid) = base();
                return Err(Refusal::BadCdiClaim {
                    container,
                    name,
                    pod_uid,
                    claim_uid: uid,
                    source,
                });
            }
        }
        asked.push(uid);
    }
}

/// Synchronize: resolve the claims running containers name, then rebuild.
pub async fn synchronize_containers<R: ClaimResolver + ?Sized>(
    view: &Mutex<NodeView>,
    containers: &[ContainerInfo],
    resolver: &R,
) -> SyncOutcome {
    let unknown = unknown_claims(&lock(view), containers);
    // Concurrently: each resolution is bounded, and so is their sum only if
    // they do not queue behind each other.
    let answers = futures::future::join_all(unknown.iter().map(|uid| resolver.resolve(uid))).await;
    for (uid, answer) in unknown.iter().zip(answers) {
        if learn_resolution(view, uid, answer).is_err() {
            tracing::warn!(claim = %uid, "claim of a running container could not be resolved");
        }
    }
    lock(view).synchronize(containers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const POD_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
    const POD_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";
    const CLAIM_1: &str = "c1c1c1c1-0000-4000-8000-000000000001";
    const CLAIM_2: &str = "c2c2c2c2-0000-4000-8000-000000000002";

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn claim(uid: &str, cpus: &str, pod: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: uid.into(),
            namespace: "default".into(),
            name: "c".into(),
            consumer_pods: vec![pod.into()],
            devices: Vec::new(),
            cpus: set(cpus),
            prepared_at_unix_ms: 1,
            pod_claim_name: None,
        }
    }

    fn container(id: &str, pod: &str, env: &[&str], shares: Option<u64>) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: format!("n-{id}"),
            pod_uid: pod.into(),
            env: env.iter().map(|e| e.to_string()).collect(),
            cpu_shares: shares,
            ..Default::default()
        }
    }

    fn env(uid: &str, cpus: &str) -> String {
        format!("DRA_CPUSET_{uid}={cpus}")
    }

    fn view(mixed: bool) -> NodeView {
        NodeView::new(set("0-7"), set("0"), mixed, None)
    }

    fn updates(list: &[(&str, &str)]) -> Vec<Update> {
        list.iter().map(|(i, c)| (i.to_string(), set(c))).collect()
    }

    /// A resolver answering from a table and counting calls.
    #[derive(Default)]
    struct TableResolver {
        answers: HashMap<String, Resolution>,
        calls: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl ClaimResolver for TableResolver {
        async fn resolve(&self, claim_uid: &str) -> Resolution {
            lock_calls(&self.calls).push(claim_uid.to_string());
            self.answers
                .get(claim_uid)
                .cloned()
                .unwrap_or_else(|| Resolution::Unverifiable("no answer in table".into()))
        }
    }

    fn lock_calls(m: &Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
        m.lock().expect("calls")
    }

    #[test]
    fn kinds_and_cpusets_table() {
        // (mixed mode, env, shares, kind, cpuset)
        let e1 = env(CLAIM_1, "2-3");
        type Case<'a> = (bool, Vec<&'a str>, Option<u64>, ContainerKind, &'a str);
        let cases: Vec<Case> = vec![
            (false, vec![], None, ContainerKind::Shared, "1,4-7"),
            (true, vec![], Some(1024), ContainerKind::Shared, "1,4-7"),
            (false, vec![&e1], None, ContainerKind::Exclusive, "2-3"),
            (
                false,
                vec![&e1],
                Some(1024),
                ContainerKind::Exclusive,
                "2-3",
            ),
            (true, vec![&e1], Some(2), ContainerKind::Exclusive, "2-3"),
            (true, vec![&e1], None, ContainerKind::Exclusive, "2-3"),
            (true, vec![&e1], Some(3), ContainerKind::Mixed, "1-7"),
            (
                true,
                vec![&e1, "OTHER=1"],
                Some(512),
                ContainerKind::Mixed,
                "1-7",
            ),
        ];
        for (mixed, env, shares, kind, cpus) in cases {
            let mut v = view(mixed);
            v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
                .expect("claim");
            let d = v
                .create(&container("new", POD_A, &env, shares))
                .unwrap_or_else(|e| panic!("{env:?} {shares:?}: {e:?}"));
            assert_eq!(
                (d.kind, d.cpuset),
                (kind, set(cpus)),
                "{mixed} {env:?} {shares:?}"
            );
        }
    }

    #[test]
    fn refusals_table() {
        let owner_env = env(CLAIM_1, "2-3");
        let cases: Vec<(&str, ContainerInfo, &str, &str)> = vec![
            (
                "forged cpus",
                container("x", POD_A, &[&env(CLAIM_1, "2-4")], None),
                "cpus-mismatch",
                "the container environment says CPUs 2-4 but the claim was prepared with 2-3",
            ),
            (
                "other pod",
                container("x", POD_B, &[&owner_env], None),
                "wrong-pod",
                "not for pod bbbbbbbb",
            ),
            (
                "second container",
                container("x", POD_A, &[&owner_env], None),
                "claim-owned",
                "already belongs to container owner",
            ),
            (
                "malformed",
                container("x", POD_A, &["DRA_CPUSET_XYZ=1"], None),
                "bad-env",
                "is not a Kubernetes UID",
            ),
            (
                "empty list",
                container("x", POD_A, &[&format!("DRA_CPUSET_{CLAIM_2}=")], None),
                "bad-env",
                "the cpulist is empty",
            ),
        ];
        for (what, info, reason, text) in cases {
            let mut v = view(false);
            v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
                .expect("claim");
            let mut owner = container("owner", POD_A, &[&owner_env], None);
            owner.name = "app".into();
            v.create(&owner).expect("owner");
            let before = v.pool().containers().len();
            let refusal = match v.create(&info) {
                Err(Err(r)) => r,
                other => panic!("{what}: {other:?}"),
            };
            assert_eq!(refusal.reason(), reason, "{what}");
            assert!(refusal.to_string().contains(text), "{what}: {refusal}");
            assert!(
                refusal.to_string().starts_with("dra-cpu refuses container"),
                "{refusal}"
            );
            assert_eq!(v.pool().containers().len(), before, "{what}: nothing added");
        }
    }

    #[test]
    fn unknown_claim_asks_for_resolution() {
        let mut v = view(false);
        let info = container("x", POD_A, &[&env(CLAIM_2, "5")], None);
        assert_eq!(v.create(&info), Err(Ok(CLAIM_2.to_string())));
    }

    #[test]
    fn claim_container_shrinks_shared_and_mixed_in_the_same_reply() {
        let mut v = view(true);
        let shared = v.create(&container("s", POD_B, &[], None)).expect("shared");
        assert_eq!(shared.cpuset, set("1-7"));
        v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
            .expect("claim 1");
        let mixed = v
            .create(&container("m", POD_A, &[&env(CLAIM_1, "2-3")], Some(100)))
            .expect("mixed");
        assert_eq!(mixed.cpuset, set("1-7"));
        // The shrink of "s" was deferred; it rides on this reply.
        assert_eq!(mixed.updates, updates(&[("s", "1,4-7")]));
        v.mark_applied(&mixed.updates);

        let shrink = v
            .apply_prepared(2, claim(CLAIM_2, "6", POD_B))
            .expect("claim 2");
        assert_eq!(shrink, updates(&[("m", "1-5,7"), ("s", "1,4-5,7")]));
        let excl = v
            .create(&container("e", POD_B, &[&env(CLAIM_2, "6")], None))
            .expect("excl");
        assert_eq!(excl.cpuset, set("6"));
        assert_eq!(excl.updates, shrink, "deferred shrink sent with the create");
        v.mark_applied(&excl.updates);
        assert!(v.pending_updates().is_empty());

        // Unprepare grows them back.
        let grow = v.apply_unprepared(3, CLAIM_2).expect("unprepare");
        assert_eq!(
            grow,
            updates(&[("e", "1,4-7"), ("m", "1-7"), ("s", "1,4-7")])
        );
    }

    #[test]
    fn empty_shared_pool_refuses_shared_and_keeps_existing() {
        let mut v = NodeView::new(set("0-1"), set(""), false, None);
        v.create(&container("s", POD_B, &[], None)).expect("shared");
        v.apply_prepared(1, claim(CLAIM_1, "0-1", POD_A))
            .expect("all CPUs");
        assert_eq!(v.stranded(), vec!["s".to_string()]);
        assert!(v.pending_updates().is_empty(), "no empty cpuset planned");
        let r = match v.create(&container("t", POD_B, &[], None)) {
            Err(Err(r)) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.reason(), "empty-shared-pool");
        assert!(r.to_string().contains("the shared pool is empty"), "{r}");
    }

    #[test]
    fn align_memory_sets_the_claims_numa_nodes() {
        use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
        let topo = build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 1,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        let numa = NumaMap::from_topology(&topo);
        assert_eq!(numa.nodes_of(&set("0-3")), Some(set("0")));
        assert_eq!(numa.nodes_of(&set("3-4")), Some(set("0-1")));
        assert_eq!(numa.nodes_of(&set("9")), None, "unknown CPU: no guess");
        let mut v = NodeView::new(set("0-7"), set(""), true, Some(numa));
        v.apply_prepared(1, claim(CLAIM_1, "5-6", POD_A))
            .expect("claim");
        v.apply_prepared(2, claim(CLAIM_2, "7", POD_B))
            .expect("claim");
        let excl = v
            .create(&container("e", POD_A, &[&env(CLAIM_1, "5-6")], None))
            .expect("exclusive");
        assert_eq!(excl.kind, ContainerKind::Exclusive);
        assert_eq!(
            excl.mems,
            Some(set("1")),
            "an exclusive container: its claim's node"
        );
        let mixed = v
            .create(&container("m", POD_B, &[&env(CLAIM_2, "7")], Some(100)))
            .expect("mixed");
        assert_eq!(mixed.kind, ContainerKind::Mixed);
        assert_eq!(mixed.cpuset, set("0-4,7"));
        assert_eq!(
            mixed.mems,
            Some(set("0-1")),
            "a mixed container: its claim's node and the shared pool's nodes"
        );
        let shared = v.create(&container("s", POD_B, &[], None)).expect("shared");
        assert_eq!(shared.mems, None);
    }

    #[test]
    fn stale_revisions_are_refused() {
        let mut v = view(false);
        v.apply_snapshot(NodeSnapshot {
            revision: 5,
            allocatable: set("1-7"),
            reserved: set("0"),
            mixed_allocation_mode: false,
            claims: vec![],
        })
        .expect("snapshot");
        let err = v
            .apply_prepared(5, claim(CLAIM_1, "2", POD_A))
            .expect_err("stale");
        assert_eq!(err, ViewError::StaleRevision { got: 5, applied: 5 });
        assert!(v.pool().claim(CLAIM_1).is_none());
        assert!(v.apply_unprepared(4, CLAIM_1).is_err());
        v.apply_prepared(6, claim(CLAIM_1, "2", POD_A))
            .expect("next");
        assert_eq!(v.revision(), 6);
    }

    #[test]
    fn synchronize_repairs_every_container_and_demotes_forgeries() {
        let mut v = view(false);
        v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
            .expect("claim");
        let mut owner = container("owner", POD_A, &[&env(CLAIM_1, "2-3")], None);
        owner.cpus = set("0-7"); // created while nri-plugin was down
        let mut shared = container("shared", POD_B, &[], None);
        shared.cpus = set("0-7");
        let mut forger = container("aaa-forger", POD_B, &[&env(CLAIM_1, "2-3")], None);
        forger.cpus = set("0-7");
        let mut right = container("right", POD_B, &[], None);
        right.cpus = set("1,4-7");
        let mut stopped = container("stopped", POD_B, &[], None);
        stopped.stopped = true;
        v.create(&container("gone", POD_B, &[], None)).expect("old");

        let out = v.synchronize(&[owner, shared, forger, right, stopped]);
        assert_eq!(
            out.updates,
            updates(&[
                ("aaa-forger", "1,4-7"),
                ("owner", "2-3"),
                ("shared", "1,4-7")
            ])
        );
        assert_eq!(out.demoted.len(), 1);
        assert_eq!(out.demoted[0].0, "aaa-forger");
        assert!(
            out.demoted[0].1.contains("not for pod"),
            "{:?}",
            out.demoted
        );
        assert!(
            v.pool().container("gone").is_none(),
            "gone from the runtime"
        );
        assert!(v.pool().container("stopped").is_none());
        assert_eq!(v.pool().claim_owner(CLAIM_1), Some("owner"));
    }

    #[test]
    fn update_container_reclassifies_and_repins_itself() {
        use ContainerKind::{Exclusive, Mixed, Shared};
        // (mixed mode, has a claim, shares at creation, shares updated to,
        //  kinds before and after, the container's own cpuset after).
        // Allocatable 1-7 (0 reserved), the claim holds 2-3: pool 1,4-7.
        type Case = (
            bool,
            bool,
            Option<u64>,
            Option<u64>,
            (ContainerKind, ContainerKind),
            &'static str,
        );
        let cases: [Case; 9] = [
            (true, true, Some(2), Some(512), (Exclusive, Mixed), "1-7"),
            (true, true, None, Some(3), (Exclusive, Mixed), "1-7"),
            (true, true, Some(512), Some(2), (Mixed, Exclusive), "2-3"),
            (true, true, Some(512), Some(1024), (Mixed, Mixed), "1-7"),
            (true, true, Some(2), Some(2), (Exclusive, Exclusive), "2-3"),
            // Mode off: a request never makes a claim container mixed.
            (
                false,
                true,
                Some(2),
                Some(512),
                (Exclusive, Exclusive),
                "2-3",
            ),
            // A shared container keeps the shared pool whatever it requests.
            (true, false, Some(512), Some(2), (Shared, Shared), "1,4-7"),
            (true, false, Some(2), Some(512), (Shared, Shared), "1,4-7"),
            (false, false, None, Some(100), (Shared, Shared), "1,4-7"),
        ];
        for (i, (mixed, has_claim, at_create, to, kinds, own)) in cases.into_iter().enumerate() {
            let mut v = view(mixed);
            v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
                .expect("claim");
            let claim_env = env(CLAIM_1, "2-3");
            let envs: Vec<&str> = if has_claim { vec![&claim_env] } else { vec![] };
            let mut info = container("c", POD_A, &envs, at_create);
            let created = v.create(&info).expect("created");
            v.mark_applied(&[("c".to_string(), created.cpuset)]);
            info.cpu_shares = to;
            let decision = v.update_container(&info);
            assert_eq!(decision.kinds, Some(kinds), "case {i}");
            assert_eq!(decision.updates, updates(&[("c", own)]), "case {i}");
            assert_eq!(
                v.pool().container("c").map(|e| e.kind),
                Some(kinds.1),
                "case {i}"
            );
            v.mark_applied(&decision.updates);
            // Unchanged: still re-pins itself, so the update cannot unpin it.
            let again = v.update_container(&info);
            assert_eq!(again.kinds, Some((kinds.1, kinds.1)), "case {i}");
            assert_eq!(again.updates, updates(&[("c", own)]), "case {i}");
        }
        let unknown = view(true).update_container(&container("unknown", POD_A, &[], Some(512)));
        assert_eq!((unknown.kinds, unknown.updates), (None, Vec::new()));
    }

    #[test]
    fn an_update_without_shares_keeps_the_request_the_view_knows() {
        let mut v = view(true);
        v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
            .expect("claim");
        let info = container("m", POD_A, &[&env(CLAIM_1, "2-3")], Some(512));
        v.create(&info).expect("mixed");
        let decision = v.update_container(&ContainerInfo {
            cpu_shares: None,
            ..info
        });
        assert_eq!(
            decision.kinds,
            Some((ContainerKind::Mixed, ContainerKind::Mixed))
        );
        assert_eq!(decision.updates, updates(&[("m", "1-7")]));
    }

    #[test]
    fn later_pool_changes_follow_the_kind_a_resize_gave() {
        // Two claim containers resized in opposite directions; a later claim
        // shrinks the one that became mixed and leaves the one that became
        // exclusive alone, and its unprepare grows only the mixed one back.
        let mut v = view(true);
        v.apply_prepared(1, claim(CLAIM_1, "2", POD_A))
            .expect("claim 1");
        v.apply_prepared(2, claim(CLAIM_2, "3", POD_B))
            .expect("claim 2");
        let mut to_mixed = container("m", POD_A, &[&env(CLAIM_1, "2")], Some(2));
        let mut to_excl = container("x", POD_B, &[&env(CLAIM_2, "3")], Some(512));
        let shared = container("s", POD_B, &[], Some(512));
        for info in [&to_mixed, &to_excl, &shared] {
            let d = v.create(info).expect("created");
            v.mark_applied(&[(info.id.clone(), d.cpuset)]);
            v.mark_applied(&d.updates);
        }
        to_mixed.cpu_shares = Some(256);
        to_excl.cpu_shares = Some(2);
        for info in [&to_mixed, &to_excl] {
            let d = v.update_container(info);
            v.mark_applied(&d.updates);
        }
        assert_eq!(
            v.pool().container("m").map(|e| e.kind),
            Some(ContainerKind::Mixed)
        );
        assert_eq!(
            v.pool().container("x").map(|e| e.kind),
            Some(ContainerKind::Exclusive)
        );

        let later = "c3c3c3c3-0000-4000-8000-000000000003";
        let shrink = v
            .apply_prepared(3, claim(later, "7", POD_B))
            .expect("later claim");
        assert_eq!(shrink, updates(&[("m", "1-2,4-6"), ("s", "1,4-6")]));
        v.mark_applied(&shrink);
        let grow = v.apply_unprepared(4, later).expect("unprepare");
        assert_eq!(grow, updates(&[("m", "1-2,4-7"), ("s", "1,4-7")]));
    }

    #[test]
    fn a_kind_change_moves_memory_with_the_cpus_under_align_memory() {
        use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
        let topo = build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 1,
            sibling_numbering: SiblingNumbering::Adjacent,
        });
        let mut v = NodeView::new(
            set("0-7"),
            set(""),
            true,
            Some(NumaMap::from_topology(&topo)),
        );
        v.apply_prepared(1, claim(CLAIM_1, "6", POD_A))
            .expect("claim");
        let mut info = container("c", POD_A, &[&env(CLAIM_1, "6")], None);
        let created = v.create(&info).expect("exclusive");
        assert_eq!(created.mems, Some(set("1")));
        v.mark_applied(&[("c".to_string(), created.cpuset)]);
        // (shares updated to, own cpuset, mems sent): only a kind change
        // moves memory, to the nodes of every CPU the container now runs on.
        let steps = [
            (512, "0-7", Some(set("0-1"))),
            (100, "0-7", None),
            (2, "6", Some(set("1"))),
            (2, "6", None),
        ];
        for (shares, own, mems) in steps {
            info.cpu_shares = Some(shares);
            let d = v.update_container(&info);
            assert_eq!(d.updates, updates(&[("c", own)]), "shares {shares}");
            assert_eq!(d.mems, mems, "shares {shares}");
            v.mark_applied(&d.updates);
        }
        let shared = container("s", POD_A, &[], Some(2));
        v.create(&shared).expect("shared");
        let d = v.update_container(&ContainerInfo {
            cpu_shares: Some(512),
            ..shared
        });
        assert_eq!(
            d.mems, None,
            "a shared container's memory is never confined"
        );
    }

    #[test]
    fn stop_keeps_the_reservation_and_restart_gets_the_same_cpus() {
        let mut v = view(false);
        v.apply_prepared(1, claim(CLAIM_1, "4-5", POD_A))
            .expect("claim");
        let mut first = container("first", POD_A, &[&env(CLAIM_1, "4-5")], None);
        first.name = "app".into();
        v.create(&first).expect("first");
        assert!(v.stop_container("first").is_empty());
        assert_eq!(v.pool().shared(), set("1-3,6-7"), "reservation kept");
        let mut second = first.clone();
        second.id = "second".into();
        assert_eq!(v.create(&second).expect("restart").cpuset, set("4-5"));
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn resolution_paths_table() {
        let info = container("x", POD_A, &[&env(CLAIM_2, "5")], None);
        // (answer, expected Ok cpuset or refusal reason, claim is provisional)
        let cases: Vec<(Resolution, Result<&str, &str>, bool)> = vec![
            (
                Resolution::Prepared(claim(CLAIM_2, "5", POD_A)),
                Ok("5"),
                false,
            ),
            (
                Resolution::Prepared(claim(CLAIM_2, "5", POD_B)),
                Err("wrong-pod"),
                false,
            ),
            (
                Resolution::Prepared(claim(CLAIM_2, "6", POD_A)),
                Err("cpus-mismatch"),
                false,
            ),
            (Resolution::NotPrepared, Err("claim-not-prepared"), false),
            (Resolution::FromCdi(set("5")), Ok("5"), true),
            (Resolution::FromCdi(set("4")), Err("cpus-mismatch"), true),
            (Resolution::FromCdi(set("2")), Err("bad-cdi-claim"), false),
            (
                Resolution::Unverifiable("dra-plugin down, no spec".into()),
                Err("claim-unverifiable"),
                false,
            ),
        ];
        for (answer, want, provisional) in cases {
            let mut v = view(false);
            v.apply_prepared(1, claim(CLAIM_1, "2", POD_B))
                .expect("claim 1");
            let view = Mutex::new(v);
            let resolver = TableResolver {
                answers: HashMap::from([(CLAIM_2.to_string(), answer.clone())]),
                ..Default::default()
            };
            let got = run(admit_container(&view, &info, &resolver));
            match (&got, want) {
                (Ok(d), Ok(cpus)) => assert_eq!(d.cpuset, set(cpus), "{answer:?}"),
                (Err(r), Err(reason)) => {
                    assert_eq!(r.reason(), reason, "{answer:?}: {r}");
                    assert!(r.to_string().contains(CLAIM_2), "{r}");
                }
                _ => panic!("{answer:?}: got {got:?}, want {want:?}"),
            }
            assert_eq!(lock_calls(&resolver.calls).len(), 1, "asked once");
            assert_eq!(
                lock(&view).is_provisional(CLAIM_2),
                provisional,
                "{answer:?}"
            );
        }
    }

    #[test]
    fn provisional_claim_serves_one_pod_and_a_snapshot_replaces_it() {
        let view = Mutex::new(view(false));
        let resolver = TableResolver {
            answers: HashMap::from([(CLAIM_2.to_string(), Resolution::FromCdi(set("5")))]),
            ..Default::default()
        };
        let first = container("a", POD_A, &[&env(CLAIM_2, "5")], None);
        run(admit_container(&view, &first, &resolver)).expect("first pod adopts");
        let other = container("b", POD_B, &[&env(CLAIM_2, "5")], None);
        let r = run(admit_container(&view, &other, &resolver)).expect_err("second pod");
        assert_eq!(r.reason(), "wrong-pod");
        let up = lock(&view)
            .apply_snapshot(NodeSnapshot {
                revision: 3,
                allocatable: set("1-7"),
                reserved: set("0"),
                mixed_allocation_mode: false,
                claims: vec![],
            })
            .expect("snapshot");
        // dra-plugin does not know the claim: its CPUs return to the pool.
        assert_eq!(up, updates(&[("a", "1-7")]));
        assert!(!lock(&view).is_provisional(CLAIM_2));
    }

    #[test]
    fn synchronize_resolves_unknown_claims_first() {
        let view = Mutex::new(view(false));
        let resolver = TableResolver {
            answers: HashMap::from([(
                CLAIM_2.to_string(),
                Resolution::Prepared(claim(CLAIM_2, "6-7", POD_A)),
            )]),
            ..Default::default()
        };
        let mut c = container("c", POD_A, &[&env(CLAIM_2, "6-7")], None);
        c.cpus = set("0-7");
        let mut s = container("s", POD_B, &[], None);
        s.cpus = set("0-7");
        let out = run(synchronize_containers(
            &view,
            &[c.clone(), s.clone(), c],
            &resolver,
        ));
        assert_eq!(out.updates, updates(&[("c", "6-7"), ("s", "1-5")]));
        assert_eq!(*lock_calls(&resolver.calls), vec![CLAIM_2.to_string()]);
    }

    /// Answers only once every claim of the Synchronize has been asked, so
    /// it completes only if the questions are in flight together.
    struct AllAtOnce {
        barrier: tokio::sync::Barrier,
    }

    #[async_trait::async_trait]
    impl ClaimResolver for AllAtOnce {
        async fn resolve(&self, claim_uid: &str) -> Resolution {
            self.barrier.wait().await;
            let cpus = if claim_uid == CLAIM_1 { "2" } else { "3" };
            Resolution::Prepared(claim(claim_uid, cpus, POD_A))
        }
    }

    #[test]
    fn synchronize_asks_about_all_unknown_claims_at_once() {
        let view = Mutex::new(view(false));
        let resolver = AllAtOnce {
            barrier: tokio::sync::Barrier::new(2),
        };
        let a = container("a", POD_A, &[&env(CLAIM_1, "2")], None);
        let b = container("b", POD_A, &[&env(CLAIM_2, "3")], None);
        let out = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(async {
                // Deadlock detection only: one at a time never passes the barrier.
                tokio::time::timeout(
                    std::time::Duration::from_secs(30),
                    synchronize_containers(&view, &[a, b], &resolver),
                )
                .await
                .expect("the claims were asked one at a time")
            });
        assert_eq!(out.updates, updates(&[("a", "2"), ("b", "3")]));
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
                        match v.create(&container(&id, POD_A, &env, Some(if flag { 100 } else { 2 }))) {
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
                prop_assert!(sent.iter().all(|(_, c)| !c.is_empty()));
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
