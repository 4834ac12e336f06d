//! The ResourceClaim objects tests hand to dra-plugin: one builder of a claim
//! the scheduler has allocated (one device result, reserved for one pod), so
//! every test and benchmark writes the same object the same way.

use crate::node::DRIVER_NAME;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, ResourceClaim, ResourceClaimConsumerReference,
    ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use shared_state::assignment::CPU_CAPACITY;
use std::collections::BTreeMap;

/// The pod a claim is reserved for unless a test names another.
pub const DEFAULT_POD_NAME: &str = "pod";
/// That pod's UID.
pub const DEFAULT_POD_UID: &str = "feedbeef-0000-4000-8000-000000000000";

/// A claim allocated `cpus` CPUs of `device` in `pool` for request `cpus`,
/// reserved for one pod; the setters change one part each.
#[derive(Debug, Clone)]
pub struct AllocatedClaim {
    namespace: String,
    name: String,
    uid: Option<String>,
    annotations: Option<BTreeMap<String, String>>,
    empty_spec: bool,
    request: String,
    pool: String,
    device: String,
    cpus: String,
    configs: Option<Vec<DeviceAllocationConfiguration>>,
    pod_name: String,
    pod_uid: String,
}

impl AllocatedClaim {
    /// Claim `namespace/name` of `cpus` CPUs of `device` in `pool`, without a
    /// UID (the API server assigns one) and without a spec.
    pub fn new(namespace: &str, name: &str, pool: &str, device: &str, cpus: impl ToString) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: None,
            annotations: None,
            empty_spec: false,
            request: "cpus".into(),
            pool: pool.into(),
            device: device.into(),
            cpus: cpus.to_string(),
            configs: None,
            pod_name: DEFAULT_POD_NAME.into(),
            pod_uid: DEFAULT_POD_UID.into(),
        }
    }

    /// The object's UID, as the kubelet names the claim.
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// Annotations on the object (`None`: no annotation map at all).
    pub fn annotations(mut self, annotations: Option<BTreeMap<String, String>>) -> Self {
        self.annotations = annotations;
        self
    }

    /// An empty spec, as an API server that validates claims wants one.
    pub fn empty_spec(mut self) -> Self {
        self.empty_spec = true;
        self
    }

    /// The request the result answers (default `cpus`).
    pub fn request(mut self, request: &str) -> Self {
        self.request = request.into();
        self
    }

    /// Opaque configuration in the allocation.
    pub fn configs(mut self, configs: Vec<DeviceAllocationConfiguration>) -> Self {
        self.configs = Some(configs);
        self
    }

    /// The pod the claim is reserved for.
    pub fn reserved_for(mut self, pod_name: &str, pod_uid: &str) -> Self {
        self.pod_name = pod_name.into();
        self.pod_uid = pod_uid.into();
        self
    }

    pub fn build(self) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(self.name),
                namespace: Some(self.namespace),
                uid: self.uid,
                annotations: self.annotations,
                ..Default::default()
            },
            spec: self.empty_spec.then(ResourceClaimSpec::default),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            request: self.request,
                            driver: DRIVER_NAME.into(),
                            pool: self.pool,
                            device: self.device,
                            consumed_capacity: Some(
                                [(CPU_CAPACITY.to_string(), Quantity(self.cpus))].into(),
                            ),
                            ..Default::default()
                        }]),
                        config: self.configs,
                    }),
                    ..Default::default()
                }),
                reserved_for: Some(vec![ResourceClaimConsumerReference {
                    api_group: None,
                    resource: "pods".into(),
                    name: self.pod_name,
                    uid: self.pod_uid,
                }]),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_name_one_cpu_result_reserved_for_the_default_pod() {
        let claim = AllocatedClaim::new("ns", "c", "node-a", "cpudevnuma001", 3).build();
        assert_eq!(claim.metadata.uid, None);
        assert!(claim.spec.is_none());
        let status = claim.status.expect("status");
        let results = status
            .allocation
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .expect("results");
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].request, "cpus");
        assert_eq!(results[0].driver, DRIVER_NAME);
        assert_eq!(results[0].pool, "node-a");
        assert_eq!(results[0].device, "cpudevnuma001");
        let capacity = results[0].consumed_capacity.as_ref().expect("capacity");
        assert_eq!(capacity.get(CPU_CAPACITY), Some(&Quantity("3".into())));
        let pods = status.reserved_for.expect("reserved for");
        assert_eq!(pods[0].name, DEFAULT_POD_NAME);
        assert_eq!(pods[0].uid, DEFAULT_POD_UID);
    }

    #[test]
    fn setters_reach_the_object() {
        let claim = AllocatedClaim::new("ns", "c", "p", "d", 1)
            .uid("u")
            .empty_spec()
            .request("big")
            .reserved_for("pod-b", "b-uid")
            .annotations(Some([("k".to_string(), "v".to_string())].into()))
            .configs(Vec::new())
            .build();
        assert_eq!(claim.metadata.uid.as_deref(), Some("u"));
        assert!(claim.spec.is_some());
        assert_eq!(
            claim.metadata.annotations.and_then(|a| a.get("k").cloned()),
            Some("v".to_string())
        );
        let status = claim.status.expect("status");
        let devices = status.allocation.and_then(|a| a.devices).expect("devices");
        assert_eq!(devices.config, Some(Vec::new()));
        assert_eq!(devices.results.expect("results")[0].request, "big");
        assert_eq!(status.reserved_for.expect("pods")[0].uid, "b-uid");
    }
}
