//! The pure core of dra-cpu: CPU sets, topology, allocation, pools, the
//! assignment store and the coordination types shared by dra-plugin and
//! nri-plugin. No I/O policy of either process lives here.

// The store's sync can be switched off only to show, in a test, that a
// power cut then loses acknowledged claims; a release build refuses it.
#[cfg(all(feature = "unsafe-no-sync", not(debug_assertions)))]
compile_error!("the unsafe-no-sync feature (no fdatasync of the store) is for test builds only");

pub mod alloc;
pub mod assignment;
pub mod cdi_read;
pub mod cdi_spec;
pub mod claim_env;
pub mod cpuset;
pub mod pool;
pub mod snapshot;
pub mod store;
pub mod sync;
pub mod topology;
pub mod tuning;

pub use assignment::{AllocatedDevice, ClaimAssignment};
pub use cpuset::{CpuSet, CpuSetError};
pub use snapshot::NodeSnapshot;
