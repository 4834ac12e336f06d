//! The CPU topology of a node, discovered from sysfs.
//!
//! The data types here are what the allocator, the slice builder and the pool
//! logic read; discovery fills them from a sysfs root (`/` on a node, an
//! unpacked fixture in tests).

use crate::cpuset::CpuSet;
use serde::{Deserialize, Serialize};

/// Kind of core on hybrid parts; `Standard` everywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CoreType {
    #[serde(rename = "standard")]
    Standard,
    #[serde(rename = "p-core")]
    Performance,
    #[serde(rename = "e-core")]
    Efficiency,
}

impl CoreType {
    pub fn as_str(self) -> &'static str {
        match self {
            CoreType::Standard => "standard",
            CoreType::Performance => "p-core",
            CoreType::Efficiency => "e-core",
        }
    }
}

/// One online logical CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub id: u32,
    /// `physical_package_id`.
    pub socket: u32,
    pub die: u32,
    pub cluster: u32,
    /// `core_id`; unique only within a socket.
    pub core: u32,
    pub numa: u32,
    /// L3 cache id, `None` where the machine has no L3 (some Arm parts).
    pub l3: Option<u32>,
    pub core_type: CoreType,
    /// All hardware threads of this CPU's physical core, itself included.
    pub siblings: CpuSet,
}

/// The online CPUs of a node, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub cpus: Vec<CpuInfo>,
    /// `devices/system/cpu/isolated`.
    pub isolated: CpuSet,
}

pub mod discover;
pub mod synthetic;
