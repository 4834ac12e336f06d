//! The API objects the scheduler and the chart leave for a node: allocated
//! and reserved ResourceClaims, the driver's DeviceClass.

use super::pods::PodIdentity;
use super::{DRIVER_NAME, GROUPED_DEVICE, NAMESPACE};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::{json, Value};
use shared_state::assignment::CPU_CAPACITY;

/// The ResourceClaim the scheduler would leave for a grouped-mode claim of
/// `cpus` CPUs on `node`, reserved for one pod.
pub fn allocated_claim(
    name: &str,
    node: &str,
    cpus: u32,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, serde_json::Error> {
    allocated_claim_on(name, node, GROUPED_DEVICE, cpus, pod_name, pod_uid)
}

/// Like [`allocated_claim`], from grouped device `device` (e.g.
/// `cpudevnuma001`, the second NUMA node's).
pub fn allocated_claim_on(
    name: &str,
    node: &str,
    device: &str,
    cpus: u32,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, serde_json::Error> {
    let request = json!({"name": "cpus", "exactly": cpu_capacity_request(cpus.to_string())});
    let result = grouped_result("cpus", node, device, cpus);
    scheduled_claim(name, node, request, vec![result], pod_name, pod_uid)
}

/// A ResourceClaim whose request `cpus` lists `firstAvailable` subrequests:
/// `big` (more CPUs than any node has) and `fit` (`cpus` CPUs), allocated by
/// the scheduler from `fit`, so its result names `cpus/fit`.
pub fn first_available_claim(
    name: &str,
    node: &str,
    cpus: u32,
    pod: &PodIdentity,
) -> Result<ResourceClaim, serde_json::Error> {
    let subrequest = |name: &str, cpus: String| {
        let mut subrequest = cpu_capacity_request(cpus);
        subrequest["name"] = json!(name);
        subrequest
    };
    let request = json!({
        "name": "cpus",
        "firstAvailable": [subrequest("big", "4096".into()), subrequest("fit", cpus.to_string())]
    });
    let result = grouped_result("cpus/fit", node, GROUPED_DEVICE, cpus);
    scheduled_claim(name, node, request, vec![result], &pod.name, &pod.uid)
}

/// The ResourceClaim the scheduler would leave for an individual-mode claim
/// of one CPU per device in `devices` on `node`, reserved for `pod`.
pub fn allocated_individual_claim(
    name: &str,
    node: &str,
    devices: &[String],
    pod: &PodIdentity,
) -> Result<ResourceClaim, serde_json::Error> {
    let request = json!({
        "name": "cpus",
        "exactly": {"deviceClassName": DRIVER_NAME, "count": devices.len()}
    });
    let results: Vec<Value> = devices
        .iter()
        .map(|device| json!({"request": "cpus", "driver": DRIVER_NAME, "pool": node, "device": device}))
        .collect();
    scheduled_claim(name, node, request, results, &pod.name, &pod.uid)
}

/// A request (or subrequest) of `cpus` CPUs of capacity from the driver's
/// DeviceClass.
fn cpu_capacity_request(cpus: String) -> Value {
    json!({"deviceClassName": DRIVER_NAME, "capacity": {"requests": {CPU_CAPACITY: cpus}}})
}

/// The allocation result of `cpus` CPUs of grouped device `device` for
/// `request`: the capacity the claim consumes.
fn grouped_result(request: &str, node: &str, device: &str, cpus: u32) -> Value {
    json!({
        "request": request,
        "driver": DRIVER_NAME,
        "pool": node,
        "device": device,
        "consumedCapacity": {CPU_CAPACITY: cpus.to_string()}
    })
}

/// ResourceClaim `name` of one device request, as the scheduler leaves it:
/// allocated on `node` with `results`, reserved for one pod.
fn scheduled_claim(
    name: &str,
    node: &str,
    request: Value,
    results: Vec<Value>,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ResourceClaim, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                    "key": "metadata.name", "operator": "In", "values": [node]
                }]}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]
        }
    }))
}

/// The DeviceClass of the driver, as the chart installs it.
pub fn device_class() -> Result<DeviceClass, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER_NAME}\"")}}]}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_from_a_named_device() {
        let claim = allocated_claim_on("c1", "node-a", "cpudevnuma001", 2, "p", "u").unwrap();
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap();
        assert_eq!(results[0].device, "cpudevnuma001");
    }

    #[test]
    fn claim_object_is_a_grouped_allocation_for_the_pod() {
        let claim = allocated_claim("c1", "node-a", 3, "pod-b", "uid-b").unwrap();
        let status = claim.status.as_ref().unwrap();
        let results = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .unwrap();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].driver, DRIVER_NAME);
        assert_eq!(results[0].pool, "node-a");
        assert_eq!(results[0].device, GROUPED_DEVICE);
        let consumed = results[0].consumed_capacity.as_ref().unwrap();
        assert_eq!(consumed[CPU_CAPACITY].0, "3");
        let reserved = status.reserved_for.as_ref().unwrap();
        assert_eq!(reserved[0].uid, "uid-b");
        assert_eq!(reserved[0].name, "pod-b");
        assert_eq!(reserved[0].resource, "pods");
        let class = device_class().unwrap();
        assert_eq!(class.metadata.name.as_deref(), Some(DRIVER_NAME));
    }
}
