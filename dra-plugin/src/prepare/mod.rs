//! From a ResourceClaim to the exact CPUs it gets on this node: the pure
//! decisions of NodePrepareResources.
//!
//! [`DeviceCatalog`] (in [`crate::devices`]) knows which CPUs each
//! published device stands for;
//! [`parse_claim`] takes this driver's allocation results out of a claim and
//! checks them; [`resolve_cpus`] turns them into CPUs that no other claim
//! holds. Nothing here touches the store, the disk or the network, so every
//! refusal can be tested directly, with its message.

use crate::devices::{DeviceCatalog, DeviceMode};
pub mod shared_pool;
pub mod validation;

use crate::opaque_config::{
    claim_tuning, cpusets_by_request, validate, NodeCpus, OpaqueConfigError,
};
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use shared_state::alloc::{AllocError, Allocator, Policy};
use shared_state::tuning::request::Tuning;
use shared_state::tuning::support::{NodeSupport, Unsupported};
use shared_state::{AllocatedDevice, CpuSet};
use std::collections::BTreeMap;

/// The consumable capacity a grouped device counts CPUs in (the one the
/// slices publish).
use shared_state::assignment::CPU_CAPACITY;

/// Why a claim reserved only for other consumers is refused: the CPUs of a
/// claim are pinned to the pod that consumes it, and nri-plugin admits a
/// claim container only from a pod the claim names. A reservation for a
/// PodGroup (alpha `DRAWorkloadResourceClaims`) names no pod.
fn not_pods_note(reserved_for: &[String]) -> String {
    if reserved_for.is_empty() {
        return String::new();
    }
    format!(
        " (reserved for {}): exclusive CPUs go to the one pod a claim is reserved for; reserve the claim for a pod",
        reserved_for.join(", ")
    )
}

/// A claim as kubelet names it in NodePrepareResources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// This driver's part of a claim's allocation, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedClaim {
    pub devices: Vec<AllocatedDevice>,
    /// UIDs of the pods in `status.reservedFor`.
    pub consumer_pods: Vec<String>,
    /// The claim's [`POD_CLAIM_NAME_ANNOTATION`], if set and not empty.
    pub pod_claim_name: Option<String>,
}

/// Set by the ResourceClaim controller on claims it makes from a template:
/// the pod-local claim name (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Why a claim could not be prepared. The message is what kubelet shows in
/// the pod's events, so each one says what is wrong and with what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    #[error("claim {claim}: {uid:?} is not a Kubernetes UID")]
    BadClaimUid { claim: String, uid: String },
    #[error("claim {claim} not found")]
    ClaimNotFound { claim: String },
    #[error("claim {claim}: reading it from the API server failed: {reason}")]
    ApiServer { claim: String, reason: String },
    #[error("claim {claim}: the API server has uid {found}, kubelet asked for {requested} (the claim was replaced)")]
    UidMismatch {
        claim: String,
        requested: String,
        found: String,
    },
    #[error("claim {claim} is not allocated")]
    NotAllocated { claim: String },
    #[error("claim {claim} has no allocation result for driver {driver}")]
    NotAllocatedToDriver { claim: String, driver: String },
    #[error(
        "claim {claim}: request {request} is allocated from pool {pool}, not from this node {node}"
    )]
    NotThisNode {
        claim: String,
        request: String,
        pool: String,
        node: String,
    },
    #[error(
        "claim {claim}: request {request} asks admin access to device {device}; dra.cpu gives CPUs to one claim at a time and the scheduler counts none for admin access, so it is not supported"
    )]
    AdminAccess {
        claim: String,
        request: String,
        device: String,
    },
    #[error("claim {claim} is not reserved for any pod{}", not_pods_note(.reserved_for))]
    NoConsumerPod {
        claim: String,
        /// Consumers the claim is reserved for that are not pods (e.g. a
        /// PodGroup of the alpha DRAWorkloadResourceClaims feature).
        reserved_for: Vec<String>,
    },
    #[error("claim {claim}: device {device} (request {request}) is not a device of this node")]
    DeviceUnknown {
        claim: String,
        request: String,
        device: String,
    },
    #[error("claim {claim}: device {device} is a grouped device but has no consumedCapacity {CPU_CAPACITY}")]
    MissingCapacity { claim: String, device: String },
    #[error("claim {claim}: device {device}: consumedCapacity {CPU_CAPACITY} {quantity:?} is not a whole positive number of CPUs")]
    CapacityNotWhole {
        claim: String,
        device: String,
        quantity: String,
    },
    #[error("claim {claim}: CPUs {cpus} of device {device} are already held by claim {holder}")]
    CpusHeld {
        claim: String,
        device: String,
        cpus: CpuSet,
        holder: String,
    },
    #[error("claim {claim}: device {device}: CPUs {cpus} are offline (taken offline since the node published its devices)")]
    CpusOffline {
        claim: String,
        device: String,
        cpus: CpuSet,
    },
    #[error("claim {claim}: device {device}: {requested} CPUs requested but only {free} CPUs of the group ({group}) are free{}", offline_note(.offline))]
    TooFewFree {
        claim: String,
        device: String,
        requested: usize,
        free: usize,
        group: CpuSet,
        /// CPUs of the group taken offline since the devices were published.
        offline: CpuSet,
    },
    #[error("claim {claim}: device {device}: {source}")]
    Allocation {
        claim: String,
        device: String,
        #[source]
        source: AllocError,
    },
    #[error("claim {claim}: {devices} devices exceed the limit of {limit} per claim")]
    TooManyDevices {
        claim: String,
        devices: usize,
        limit: usize,
    },
    #[error("claim {claim}: opaque cpuset config: {source}")]
    OpaqueConfig {
        claim: String,
        /// Boxed: the CPU sets it names would make every result large.
        #[source]
        source: Box<OpaqueConfigError>,
    },
    #[error(
        "claim {claim}: taking CPUs {cpus} would leave {} CPU(s) ({left}) in the shared pool, \
         fewer than the {min} that containers without a claim (this driver's own among them) \
         keep (--min-shared-cpus); the claim waits until other claims free CPUs",
        .left.len()
    )]
    SharedPoolFloor {
        claim: String,
        cpus: CpuSet,
        left: CpuSet,
        min: u32,
    },
    #[error("claim {claim}: {source}")]
    TuningUnsupported {
        claim: String,
        #[source]
        source: Unsupported,
    },
    #[error("claim {claim}: tuning its CPUs failed: {reason}")]
    Tuning { claim: String, reason: String },
    #[error("claim {claim}: store failure: {reason}")]
    Store { claim: String, reason: String },
    #[error("claim {claim}: writing its CDI spec failed: {reason}")]
    Cdi { claim: String, reason: String },
    #[error("claim {claim}: {reason}")]
    Internal { claim: String, reason: String },
}

/// The part of a refusal that names CPUs taken offline, if any.
fn offline_note(offline: &CpuSet) -> String {
    if offline.is_empty() {
        String::new()
    } else {
        format!(" (CPUs {offline} of it are offline)")
    }
}

impl PrepareError {
    /// A short label for the errors-by-reason metric.
    pub fn reason(&self) -> &'static str {
        match self {
            PrepareError::BadClaimUid { .. } => "bad_claim_uid",
            PrepareError::ClaimNotFound { .. } => "claim_not_found",
            PrepareError::ApiServer { .. } => "api_server",
            PrepareError::UidMismatch { .. } => "uid_mismatch",
            PrepareError::NotAllocated { .. } => "not_allocated",
            PrepareError::NotAllocatedToDriver { .. } => "not_allocated_to_driver",
            PrepareError::NotThisNode { .. } => "not_this_node",
            PrepareError::AdminAccess { .. } => "admin_access",
            PrepareError::NoConsumerPod { .. } => "no_consumer_pod",
            PrepareError::DeviceUnknown { .. } => "device_unknown",
            PrepareError::MissingCapacity { .. } => "missing_capacity",
            PrepareError::CapacityNotWhole { .. } => "capacity_not_whole",
            PrepareError::CpusHeld { .. } => "cpus_held",
            PrepareError::CpusOffline { .. } => "cpus_offline",
            PrepareError::TooFewFree { .. } => "too_few_free",
            PrepareError::Allocation { .. } => "allocation",
            PrepareError::TooManyDevices { .. } => "too_many_devices",
            PrepareError::OpaqueConfig { .. } => "opaque_config",
            PrepareError::SharedPoolFloor { .. } => "shared_pool_floor",
            PrepareError::TuningUnsupported { .. } => "tuning_unsupported",
            PrepareError::Tuning { .. } => "tuning",
            PrepareError::Store { .. } => "store",
            PrepareError::Cdi { .. } => "cdi",
            PrepareError::Internal { .. } => "internal",
        }
    }
}

/// The CPUs that claims other than the one being prepared hold, by claim,
/// borrowed from wherever they are kept, and their union, folded once.
/// On a node with many claims a prepare used to copy every claim's CPUs
/// and fold them twice, allocating a set per claim each time.
#[derive(Debug, Clone, Default)]
pub struct HeldCpus<'a> {
    by_claim: Vec<(&'a str, &'a CpuSet)>,
    taken: CpuSet,
}

impl<'a> HeldCpus<'a> {
    /// What the claims in `holders` (claim UID, CPUs) hold, leaving out
    /// `own`, the claim being prepared.
    pub fn others_than(
        own: &str,
        holders: impl IntoIterator<Item = (&'a str, &'a CpuSet)>,
    ) -> HeldCpus<'a> {
        let by_claim: Vec<(&'a str, &'a CpuSet)> =
            holders.into_iter().filter(|(uid, _)| *uid != own).collect();
        let mut taken = CpuSet::new();
        for (_, cpus) in &by_claim {
            taken.union_with(cpus);
        }
        HeldCpus { by_claim, taken }
    }

    /// [`Self::others_than`] over a map of claim UID to CPUs.
    pub fn of_map(own: &str, held: &'a BTreeMap<String, CpuSet>) -> HeldCpus<'a> {
        HeldCpus::others_than(own, held.iter().map(|(uid, cpus)| (uid.as_str(), cpus)))
    }

    /// Every CPU another claim holds.
    pub fn taken(&self) -> &CpuSet {
        &self.taken
    }

    /// A claim that holds some of `cpus`, for a refusal's message.
    fn holder_of(&self, cpus: &CpuSet) -> String {
        self.by_claim
            .iter()
            .find(|(_, held)| !held.is_disjoint(cpus))
            .map(|(uid, _)| uid.to_string())
            .unwrap_or_default()
    }
}

/// The CPUs a parsed claim gets, given the CPUs other claims hold.
///
/// Individual devices give their CPU, which must not be held by another
/// claim. Grouped devices give `consumed_cpus` CPUs chosen by `policy`
/// inside the group among CPUs no other claim holds and no earlier device of
/// this claim took.
pub fn resolve_cpus(
    claim: &ClaimRef,
    parsed: &ParsedClaim,
    catalog: &DeviceCatalog,
    allocator: &Allocator,
    held: &HeldCpus<'_>,
    policy: Policy,
) -> Result<CpuSet, PrepareError> {
    resolve_cpus_configured(
        claim,
        parsed,
        &BTreeMap::new(),
        catalog,
        allocator,
        held,
        &CpuSet::new(),
        policy,
    )
}

/// The opaque cpuset each request of this driver is given by the claim's
/// `status.allocation.devices.config[]` (see [`crate::opaque_config`]).
pub fn opaque_cpusets(
    claim: &ClaimRef,
    object: &ResourceClaim,
    parsed: &ParsedClaim,
    driver: &str,
) -> Result<BTreeMap<String, CpuSet>, PrepareError> {
    let configs = allocation_configs(object);
    let mut requests: Vec<&str> = parsed.devices.iter().map(|d| d.request.as_str()).collect();
    requests.sort_unstable();
    requests.dedup();
    cpusets_by_request(configs, driver, &requests).map_err(|source| PrepareError::OpaqueConfig {
        claim: claim.to_string(),
        source: Box::new(source),
    })
}

/// The tuning the claim's configs ask for (see
/// [`crate::opaque_config::claim_tuning`]), refused by name when this node
/// cannot honour a knob of it.
pub fn requested_tuning(
    claim: &ClaimRef,
    object: &ResourceClaim,
    parsed: &ParsedClaim,
    driver: &str,
    support: &NodeSupport,
) -> Result<Tuning, PrepareError> {
    let mut requests: Vec<&str> = parsed.devices.iter().map(|d| d.request.as_str()).collect();
    requests.sort_unstable();
    requests.dedup();
    let tuning = claim_tuning(allocation_configs(object), driver, &requests).map_err(|source| {
        PrepareError::OpaqueConfig {
            claim: claim.to_string(),
            source: Box::new(source),
        }
    })?;
    support
        .check(&tuning)
        .map_err(|source| PrepareError::TuningUnsupported {
            claim: claim.to_string(),
            source,
        })?;
    Ok(tuning)
}

fn allocation_configs(object: &ResourceClaim) -> &[DeviceAllocationConfiguration] {
    object
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default()
}

/// [`resolve_cpus`], with the CPUs of requests that an opaque config sets
/// (grouped devices only) taken from `cpusets` once they are checked, and
/// `offline` (CPUs of the node taken offline since it published its
/// devices) given to nobody: an individual device on one is refused, a
/// group picks among its online CPUs.
#[allow(clippy::too_many_arguments)]
pub fn resolve_cpus_configured(
    claim: &ClaimRef,
    parsed: &ParsedClaim,
    cpusets: &BTreeMap<String, CpuSet>,
    catalog: &DeviceCatalog,
    allocator: &Allocator,
    held: &HeldCpus<'_>,
    offline: &CpuSet,
    policy: Policy,
) -> Result<CpuSet, PrepareError> {
    let name = claim.to_string();
    let taken = held.taken();
    let node = catalog.node_cpus();
    let online_now = node.online.difference(offline);
    let mut chosen = CpuSet::new();
    for device in &parsed.devices {
        let (mode, group) = catalog
            .mode_of(&device.device)
            .zip(catalog.cpus_of(&device.device))
            .ok_or_else(|| PrepareError::DeviceUnknown {
                claim: name.clone(),
                request: device.request.clone(),
                device: device.device.clone(),
            })?;
        match mode {
            DeviceMode::Individual => {
                let down = group.intersection(offline);
                if !down.is_empty() {
                    return Err(PrepareError::CpusOffline {
                        claim: name,
                        device: device.device.clone(),
                        cpus: down,
                    });
                }
                let clash = group.intersection(taken);
                if !clash.is_empty() {
                    let holder = held.holder_of(&clash);
                    return Err(PrepareError::CpusHeld {
                        claim: name,
                        device: device.device.clone(),
                        cpus: clash,
                        holder,
                    });
                }
                chosen = chosen.union(group);
            }
            DeviceMode::Grouped => {
                let count = device
                    .consumed_cpus
                    .ok_or_else(|| PrepareError::MissingCapacity {
                        claim: name.clone(),
                        device: device.device.clone(),
                    })? as usize;
                if let Some(cpus) = cpusets.get(&device.request) {
                    let opaque_error = |source| PrepareError::OpaqueConfig {
                        claim: name.clone(),
                        source: Box::new(source),
                    };
                    let devices = parsed
                        .devices
                        .iter()
                        .filter(|d| d.request == device.request)
                        .count();
                    if devices != 1 {
                        return Err(opaque_error(OpaqueConfigError::SeveralDevices {
                            request: device.request.clone(),
                            devices,
                        }));
                    }
                    validate(
                        &device.request,
                        cpus,
                        count,
                        NodeCpus {
                            online: &online_now,
                            reserved: node.reserved,
                        },
                        (&device.device, group),
                        &taken.union(&chosen),
                        |clash| {
                            if clash.is_disjoint(&chosen) {
                                format!("claim {}", held.holder_of(clash))
                            } else {
                                "another request of this claim".to_string()
                            }
                        },
                    )
                    .map_err(opaque_error)?;
                    chosen = chosen.union(cpus);
                    continue;
                }
                let free = group
                    .difference(taken)
                    .difference(&chosen)
                    .difference(offline);
                if count > free.len() {
                    return Err(PrepareError::TooFewFree {
                        claim: name,
                        device: device.device.clone(),
                        requested: count,
                        free: free.len(),
                        group: group.clone(),
                        offline: group.intersection(offline),
                    });
                }
                let picked = allocator.allocate(&free, count, policy).map_err(|source| {
                    PrepareError::Allocation {
                        claim: name.clone(),
                        device: device.device.clone(),
                        source,
                    }
                })?;
                chosen = chosen.union(&picked);
            }
        }
    }
    Ok(chosen)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::devices::GroupBy;
    use proptest::prelude::*;
    use shared_state::topology::synthetic;
    use shared_state::topology::Topology;

    pub(crate) fn individual_device_name(n: usize) -> String {
        format!("cpudev{n:03}")
    }

    pub(crate) fn catalog(
        topo: &Topology,
        reserved: &CpuSet,
        mode: DeviceMode,
        group_by: GroupBy,
    ) -> DeviceCatalog {
        match DeviceCatalog::new(topo, reserved, mode, group_by) {
            Ok(c) => c,
            Err(e) => panic!("catalog: {e}"),
        }
    }

    pub const UID_A: &str = "aaaaaaaa-0000-0000-0000-000000000001";
    pub const UID_B: &str = "bbbbbbbb-0000-0000-0000-000000000002";
    pub(crate) const POD: &str = "cccccccc-0000-0000-0000-000000000003";

    pub(crate) fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    pub(crate) fn claim_ref(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: uid.into(),
        }
    }

    /// 2 sockets with one NUMA node each, 4 cores per socket, SMT 2: 16
    /// CPUs whose siblings are (n, n+8), as on Intel servers.
    pub fn topology() -> Topology {
        synthetic::build(&synthetic::Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 2,
            sibling_numbering: synthetic::SiblingNumbering::Split,
        })
    }

    /// An allocated device and the CPUs the claim consumes from it.
    type DeviceUse<'a> = (&'a str, Option<u32>);

    fn parsed(devices: &[DeviceUse]) -> ParsedClaim {
        ParsedClaim {
            devices: devices
                .iter()
                .map(|(d, n)| AllocatedDevice {
                    request: "cpus".into(),
                    pool: "node-a".into(),
                    device: d.to_string(),
                    consumed_cpus: *n,
                    share_id: None,
                })
                .collect(),
            consumer_pods: vec![POD.into()],
            pod_claim_name: None,
        }
    }

    /// Claim A's CPUs for `devices` (all of request "cpus"), while other
    /// claims hold `held`.
    fn resolve_a(
        devices: &[DeviceUse],
        catalog: &DeviceCatalog,
        allocator: &Allocator,
        held: &BTreeMap<String, CpuSet>,
        policy: Policy,
    ) -> Result<CpuSet, PrepareError> {
        resolve_cpus(
            &claim_ref(UID_A),
            &parsed(devices),
            catalog,
            allocator,
            &HeldCpus::of_map(UID_A, held),
            policy,
        )
    }

    /// CPUs taken offline since the devices were published go to nobody:
    /// an individual device on one is refused by name, a group picks among
    /// its online CPUs and is refused when too few are left, and an opaque
    /// cpuset naming one is refused. Control: with nothing offline the same
    /// claims get those CPUs.
    #[test]
    fn offline_cpus_are_given_to_no_claim() {
        let topo = topology();
        let allocator = Allocator::new(&topo);
        let grouped = catalog(
            &topo,
            &CpuSet::new(),
            DeviceMode::Grouped,
            GroupBy::Numanode,
        );
        let individual = catalog(
            &topo,
            &CpuSet::new(),
            DeviceMode::Individual,
            GroupBy::Numanode,
        );
        let numa0 = topo.cpus_in_numa(0);
        let resolve = |devices: &[DeviceUse],
                       catalog: &DeviceCatalog,
                       cpusets: &BTreeMap<String, CpuSet>,
                       offline: &CpuSet| {
            resolve_cpus_configured(
                &claim_ref(UID_A),
                &parsed(devices),
                cpusets,
                catalog,
                &allocator,
                &HeldCpus::default(),
                offline,
                Policy::Packed,
            )
        };
        let none = BTreeMap::new();
        let dev0 = individual
            .cpus_of(&individual_device_name(0))
            .cloned()
            .unwrap_or_default();

        // Individual: the device's CPU offline.
        let error = resolve(&[("cpudev000", None)], &individual, &none, &dev0)
            .expect_err("an offline CPU's device");
        assert_eq!(error.reason(), "cpus_offline", "{error}");
        assert!(error.to_string().contains("are offline"), "{error}");
        assert_eq!(
            resolve(&[("cpudev000", None)], &individual, &none, &CpuSet::new()).ok(),
            Some(dev0.clone())
        );

        // Grouped: the whole group but one CPU asks for one too many; with
        // one fewer, every online CPU of the group and not the offline one.
        let first = numa0.first().unwrap_or(0);
        let off = set(&first.to_string());
        let all = numa0.len() as u32;
        let error = resolve(&[("cpudevnuma000", Some(all))], &grouped, &none, &off)
            .expect_err("more CPUs than are online");
        assert_eq!(error.reason(), "too_few_free", "{error}");
        assert!(
            error
                .to_string()
                .ends_with(&format!("(CPUs {first} of it are offline)")),
            "{error}"
        );
        let got = resolve(&[("cpudevnuma000", Some(all - 1))], &grouped, &none, &off)
            .expect("the online rest of the group");
        assert_eq!(got, numa0.difference(&off));
        assert_eq!(
            resolve(
                &[("cpudevnuma000", Some(all))],
                &grouped,
                &none,
                &CpuSet::new()
            )
            .ok(),
            Some(numa0.clone())
        );

        // An opaque cpuset naming the offline CPU.
        let named: BTreeMap<String, CpuSet> = [("cpus".to_string(), off.clone())].into();
        let error = resolve(&[("cpudevnuma000", Some(1))], &grouped, &named, &off)
            .expect_err("an opaque cpuset of an offline CPU");
        assert!(error.to_string().contains("not online"), "{error}");
        assert_eq!(
            resolve(
                &[("cpudevnuma000", Some(1))],
                &grouped,
                &named,
                &CpuSet::new()
            )
            .ok(),
            Some(off)
        );
    }

    #[test]
    fn resolve_table() {
        let topo = topology();
        let allocator = Allocator::new(&topo);
        let grouped = catalog(
            &topo,
            &CpuSet::new(),
            DeviceMode::Grouped,
            GroupBy::Numanode,
        );
        let individual = catalog(
            &topo,
            &CpuSet::new(),
            DeviceMode::Individual,
            GroupBy::Numanode,
        );
        let none_held = BTreeMap::new();
        let numa0 = topo.cpus_in_numa(0);
        let held_b: BTreeMap<String, CpuSet> = [(UID_B.to_string(), numa0.clone())].into();
        let cpu_of = |n: usize| {
            individual
                .cpus_of(&individual_device_name(n))
                .cloned()
                .unwrap_or_default()
        };
        let held_dev0: BTreeMap<String, CpuSet> = [(UID_B.to_string(), cpu_of(0))].into();

        // Grouped: 2 CPUs in NUMA 0, whole core.
        let got = resolve_a(
            &[("cpudevnuma000", Some(2))],
            &grouped,
            &allocator,
            &none_held,
            Policy::Packed,
        );
        let got = got.expect("grouped resolves");
        assert_eq!(got.len(), 2);
        assert!(got.is_subset(&numa0));
        assert_eq!(topo.core_of(got.first().unwrap_or(0)), Some(&got));

        // Grouped: the same claim's own record does not count as held.
        let own: BTreeMap<String, CpuSet> = [(UID_A.to_string(), numa0.clone())].into();
        assert!(resolve_a(
            &[("cpudevnuma000", Some(8))],
            &grouped,
            &allocator,
            &own,
            Policy::Packed
        )
        .is_ok());

        // Grouped: two devices of the same group never overlap.
        let two = resolve_a(
            &[("cpudevnuma000", Some(4)), ("cpudevnuma000", Some(4))],
            &grouped,
            &allocator,
            &none_held,
            Policy::Packed,
        )
        .expect("two halves");
        assert_eq!(two, numa0);

        // Individual: named devices.
        let got = resolve_a(
            &[("cpudev000", None), ("cpudev001", None)],
            &individual,
            &allocator,
            &none_held,
            Policy::Packed,
        )
        .expect("individual");
        assert_eq!(got, cpu_of(0).union(&cpu_of(1)));

        // Refusals: (what, devices, catalog, held, policy, in the message).
        let held_by_b = format!("of device cpudev000 are already held by claim {UID_B}");
        let refusals: [(&str, &[DeviceUse], _, _, _, &str); 5] = [
            (
                "grouped: the whole group held by another claim",
                &[("cpudevnuma000", Some(1))],
                &grouped,
                &held_b,
                Policy::Packed,
                "1 CPUs requested but only 0 CPUs of the group",
            ),
            (
                "grouped: missing capacity",
                &[("cpudevnuma000", None)],
                &grouped,
                &none_held,
                Policy::Packed,
                "has no consumedCapacity dra.cpu/cpu",
            ),
            (
                "unknown device",
                &[("cpudevnuma007", Some(1))],
                &grouped,
                &none_held,
                Policy::Packed,
                "device cpudevnuma007 (request cpus) is not a device of this node",
            ),
            (
                "full-pcpus-only with an odd count",
                &[("cpudevnuma000", Some(3))],
                &grouped,
                &none_held,
                Policy::FullPcpusOnly,
                "not a multiple of the 2 hardware threads",
            ),
            (
                "individual: a CPU held by another claim names the holder",
                &[("cpudev000", None)],
                &individual,
                &held_dev0,
                Policy::Packed,
                &held_by_b,
            ),
        ];
        for (what, devices, catalog, held, policy, fragment) in refusals {
            let msg = resolve_a(devices, catalog, &allocator, held, policy)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(msg.contains(fragment), "{what}: {msg}");
        }
    }

    #[test]
    fn an_auto_catalog_resolves_grouped_and_individual_devices_by_their_own_rules() {
        let topo = topology();
        let allocator = Allocator::new(&topo);
        let both = DeviceCatalog::for_modes(
            &topo,
            &CpuSet::new(),
            &[DeviceMode::Grouped, DeviceMode::Individual],
            GroupBy::Numanode,
        )
        .expect("plans");
        let individual = catalog(
            &topo,
            &CpuSet::new(),
            DeviceMode::Individual,
            GroupBy::Numanode,
        );
        let grouped = catalog(
            &topo,
            &CpuSet::new(),
            DeviceMode::Grouped,
            GroupBy::Numanode,
        );
        assert_eq!(
            both.devices().count(),
            individual.devices().count() + grouped.devices().count(),
            "no name collides"
        );
        assert_eq!(both.mode_of("cpudev000"), Some(DeviceMode::Individual));
        assert_eq!(both.mode_of("cpudevnuma000"), Some(DeviceMode::Grouped));
        // An individual device needs no consumed capacity; a grouped one does.
        let got = resolve_a(
            &[("cpudev000", None)],
            &both,
            &allocator,
            &BTreeMap::new(),
            Policy::Packed,
        )
        .expect("individual device resolves");
        assert_eq!(Some(&got), individual.cpus_of("cpudev000"));
        let err = resolve_a(
            &[("cpudevnuma000", None)],
            &both,
            &allocator,
            &BTreeMap::new(),
            Policy::Packed,
        );
        assert!(
            matches!(err, Err(PrepareError::MissingCapacity { .. })),
            "{err:?}"
        );
    }

    proptest! {
        /// Whatever other claims hold, a grouped resolve returns exactly the
        /// requested number of CPUs, inside the group, disjoint from theirs.
        #[test]
        fn grouped_resolve_never_overlaps(held_mask in 0u32..(1 << 16), count in 1u32..10, group in 0u32..2) {
            let topo = topology();
            let allocator = Allocator::new(&topo);
            let catalog = catalog(&topo, &CpuSet::new(), DeviceMode::Grouped, GroupBy::Numanode);
            let held_cpus: CpuSet = (0..16).filter(|i| held_mask & (1 << i) != 0).collect();
            let held: BTreeMap<String, CpuSet> = [(UID_B.to_string(), held_cpus.clone())].into();
            let device = format!("cpudevnuma{group:03}");
            let group_cpus = catalog.cpus_of(&device).cloned().unwrap_or_default();
            let free = group_cpus.difference(&held_cpus).len();
            match resolve_a(&[(&device, Some(count))], &catalog, &allocator, &held, Policy::Packed) {
                Ok(got) => {
                    prop_assert_eq!(got.len(), count as usize);
                    prop_assert!(got.is_subset(&group_cpus));
                    prop_assert!(got.is_disjoint(&held_cpus));
                }
                Err(PrepareError::TooFewFree { free: f, .. }) => {
                    prop_assert!(count as usize > free);
                    prop_assert_eq!(f, free);
                }
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
        }
    }
}
