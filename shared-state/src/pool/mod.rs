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

pub mod arithmetic;
mod planning;
pub mod state;

use crate::claim_env::ClaimEnvError;
use crate::cpuset::CpuSet;
use arithmetic::ContainerKind;

/// What to apply to one container: its cpuset, and no CFS quota when one
/// of its claims asks for none (`tuning.cfsQuota: off`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub container_id: String,
    pub cpuset: CpuSet,
    /// Turn the container's CFS quota off with it; `false` leaves the quota
    /// as the runtime has it.
    pub cfs_quota_off: bool,
}

impl Update {
    /// A cpuset alone, the quota left as it is.
    pub fn cpuset(container_id: impl Into<String>, cpuset: CpuSet) -> Self {
        Update {
            container_id: container_id.into(),
            cpuset,
            cfs_quota_off: false,
        }
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

/// Builders the unit tests of every room of the pool share.
#[cfg(test)]
mod fixtures {
    use super::Update;
    use crate::assignment::ClaimAssignment;
    use crate::claim_env::EnvClaim;
    use crate::cpuset::CpuSet;

    pub(super) fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("valid cpulist")
    }

    pub(super) fn claim(uid: &str, cpus: &str, pod: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: uid.to_string(),
            namespace: "default".to_string(),
            name: format!("claim-{uid}"),
            consumer_pods: vec![pod.to_string()],
            devices: Vec::new(),
            cpus: set(cpus),
            prepared_at_unix_ms: 0,
            pod_claim_name: None,
            tuning: Default::default(),
        }
    }

    pub(super) fn cref(uid: &str, cpus: &str) -> EnvClaim {
        EnvClaim {
            claim_uid: uid.to_string(),
            cpus: set(cpus),
        }
    }

    pub(super) fn updates(list: &[(&str, &str)]) -> Vec<Update> {
        list.iter()
            .map(|(id, c)| Update::cpuset(*id, set(c)))
            .collect()
    }

    pub(super) fn node(mixed: bool) -> super::state::PoolState {
        super::state::PoolState::new(set("0-7"), set("0"), mixed)
    }
}
