//! The whole state dra-plugin publishes to nri-plugin at one revision: what
//! dra-plugin's driver holds and what nri-plugin's view is rebuilt from.
//! Both processes use this one type; `dra_cpu_proto::coordination` converts
//! it to and from its wire message.

use crate::{ClaimAssignment, CpuSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub revision: u64,
    pub allocatable: CpuSet,
    pub reserved: CpuSet,
    pub mixed_allocation_mode: bool,
    pub claims: Vec<ClaimAssignment>,
}
