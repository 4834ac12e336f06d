//! Why the node's devices, and so its ResourceSlices, cannot be built.

use shared_state::CpuSet;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("the topology has no online CPUs")]
    NoOnlineCpus,
    #[error("reserved CPUs {reserved}: CPUs {not_online} are not online (online: {online})")]
    ReservedNotOnline {
        reserved: CpuSet,
        not_online: CpuSet,
        online: CpuSet,
    },
    #[error("node name {0:?} is not a lowercase DNS subdomain of at most 253 characters")]
    InvalidNodeName(String),
    #[error("driver name {0:?} is not a lowercase DNS subdomain of at most 63 characters")]
    InvalidDriverName(String),
}
