//! The daemon's state as `dra-plugin inspect` shows it: plain data the
//! state reader fills and the grid and its marks read.

use shared_state::CpuSet;

/// One prepared claim, as the grid needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCpus {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// UIDs of the pods the claim is reserved for.
    pub pods: Vec<String>,
    pub cpus: CpuSet,
    pub prepared_at_unix_ms: u64,
}

/// The daemon's state at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// Where it was read: `socket` or `store`.
    pub source: String,
    pub revision: u64,
    pub allocatable: CpuSet,
    pub reserved: CpuSet,
    pub claims: Vec<ClaimCpus>,
}
