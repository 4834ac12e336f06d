//! Why a container is refused at creation: the user-facing text the runtime
//! returns from CreateContainer, and the short label counted in metrics.

use shared_state::claim_env::ClaimEnvError;
use shared_state::pool::PoolError;
use shared_state::CpuSet;

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
    #[error("dra-cpu refuses container {container} ({name} in pod {pod_uid}): its claim asks tuning.loadBalancing off for CPUs {cpus}, and this nri-plugin makes no isolated partitions (its cgroup root is not writable: the chart mounts it so with draPlugin.lowLatencyTuning)")]
    Unisolable {
        container: String,
        name: String,
        pod_uid: String,
        cpus: CpuSet,
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
            Refusal::Unisolable { .. } => "isolated-partition",
            Refusal::Pool { source, .. } => pool_reason(source),
        }
    }
}

impl Refusal {
    /// The claim whose record does not name the container's pod, when that
    /// is why the container is refused.
    pub fn wrong_pod_claim(&self) -> Option<&str> {
        match self {
            Refusal::Pool { source, .. } => wrong_pod_claim(source),
            _ => None,
        }
    }
}

fn wrong_pod_claim(error: &PoolError) -> Option<&str> {
    match error {
        PoolError::Claim {
            source: ClaimEnvError::WrongPod { claim_uid, .. },
            ..
        } => Some(claim_uid),
        PoolError::Container { source, .. } => wrong_pod_claim(source),
        _ => None,
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
