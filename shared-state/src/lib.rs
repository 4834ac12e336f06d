//! The pure core of dra-cpu: CPU sets, topology, allocation, pools, the
//! assignment store and the coordination types shared by dra-plugin and
//! nri-plugin. No I/O policy of either process lives here.

pub mod alloc;
pub mod assignment;
pub mod cdi_spec;
pub mod claim_env;
pub mod cpuset;
pub mod pool;
pub mod snapshot;
pub mod store;
pub mod topology;
pub mod upstream_metrics;

pub use assignment::{AllocatedDevice, ClaimAssignment};
pub use cpuset::{CpuSet, CpuSetError};
pub use snapshot::NodeSnapshot;
