//! What a prepared claim holds: the record dra-plugin stores durably and
//! sends to nri-plugin.

use crate::cpuset::CpuSet;
use crate::tuning::request::Tuning;
use serde::{Deserialize, Serialize};

/// The consumable capacity of a grouped device, in whole CPUs: what a
/// grouped claim asks for and what [`AllocatedDevice::consumed_cpus`] reads.
pub const CPU_CAPACITY: &str = "dra.cpu/cpu";

/// One device of this driver in a claim's allocation result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    /// Request name in the claim spec.
    pub request: String,
    /// ResourceSlice pool (the node name).
    pub pool: String,
    /// Device name, e.g. `cpudevnuma000` or `cpudev005`.
    pub device: String,
    /// `consumedCapacity[CPU_CAPACITY]` for grouped devices; `None` for individual ones.
    pub consumed_cpus: Option<u32>,
    /// The allocation's `shareID`: a grouped device is allocated to several
    /// claims (consumable capacity), each share with its own ID. Kubelet
    /// reports it through its PodResources API. Absent in records written
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// A prepared ResourceClaim and the exact CPUs it was given on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimAssignment {
    pub claim_uid: String,
    pub namespace: String,
    pub name: String,
    /// UIDs of the pods in the claim's `status.reservedFor`.
    pub consumer_pods: Vec<String>,
    pub devices: Vec<AllocatedDevice>,
    pub cpus: CpuSet,
    /// Wall-clock time of the prepare, milliseconds since the Unix epoch.
    pub prepared_at_unix_ms: u64,
    /// The claim's `resource.kubernetes.io/pod-claim-name` annotation (set
    /// on claims made from a template): the device metadata file's path in
    /// the container is named by it. Absent in records written before it
    /// was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// What the claim asked of its CPUs beyond exclusivity (its opaque
    /// `tuning` config); empty in records written before tuning existed.
    #[serde(default, skip_serializing_if = "Tuning::is_empty")]
    pub tuning: Tuning,
}
