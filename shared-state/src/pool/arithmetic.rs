//! Pool arithmetic: the shared pool, the kind of a container and the cpuset
//! each kind should have, as pure functions.

use super::PoolError;
use crate::cpuset::CpuSet;
use std::fmt;

/// Kubelet's `cpu.shares` for a container without a CPU request
/// (`max(2, milliCPU*1024/1000)`); anything above it means a request was made.
pub const NO_REQUEST_CPU_SHARES: u64 = 2;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::fixtures::*;

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
}
