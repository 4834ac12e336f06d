//! What we want against what the server holds: slice specs compared in
//! the server's normalised form (canonical quantities, empty lists as
//! absent, without the node-allocatable mapping a server may drop), and the
//! hash that tells a changed device set from the one last published.

use super::server_support::MAPPING_FIELD;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// A hash of the devices, to tell a changed device set from the last one.
pub(super) fn content_hash(devices: &[Device]) -> u64 {
    let mut hasher = DefaultHasher::new();
    // Serialising plain data cannot fail; an empty string would only make
    // the next sync compare everything again.
    serde_json::to_string(devices)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// A slice spec in the form the server stores it, for comparison: without
/// `nodeAllocatableResources` (a server without its gate drops it), empty
/// lists and maps and nulls left out (`omitempty`), capacity quantities in
/// canonical form (`1000` comes back as `1k`).
pub fn normalised_spec(mut spec: Value) -> Value {
    if let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) {
        for device in devices {
            if let Some(d) = device.as_object_mut() {
                d.remove(MAPPING_FIELD);
                if let Some(capacity) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                    for entry in capacity.values_mut() {
                        if let Some(value) = entry.get_mut("value") {
                            if let Some(canonical) =
                                value.as_str().and_then(crate::quantity::canonical)
                            {
                                *value = Value::String(canonical);
                            }
                        }
                    }
                }
            }
        }
    }
    drop_empty(&mut spec);
    spec
}

fn drop_empty(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for child in map.values_mut() {
                drop_empty(child);
            }
            map.retain(|_, v| !is_empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty),
        _ => {}
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

/// `want` is contained in `have`: every field we set has our value (the
/// server may add defaults of its own); lists must have the same length.
fn json_contains(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| json_contains(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| json_contains(a, b))
        }
        _ => want == have,
    }
}

/// Whether the server's `have` says what `want` says: our labels, our owner,
/// and our spec apart from `nodeAllocatableResources`.
pub(super) fn slice_matches(want: &ResourceSlice, have: &ResourceSlice) -> bool {
    let labels_ok = want.metadata.labels.iter().flatten().all(|(k, v)| {
        have.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .is_some_and(|hv| hv == v)
    });
    let owners_ok = want.metadata.owner_references.iter().flatten().all(|w| {
        have.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|h| h.uid == w.uid && h.kind == w.kind && h.name == w.name)
    });
    let spec = |s: &ResourceSlice| serde_json::to_value(&s.spec).map(normalised_spec).ok();
    let spec_ok = match (spec(want), spec(have)) {
        (Some(w), Some(h)) => json_contains(&w, &h),
        _ => false,
    };
    labels_ok && owners_ok && spec_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::DeviceMode;
    use crate::publisher::tests::devices;
    use crate::slices::{build_slices, NodeOwner};
    use serde_json::json;

    #[test]
    fn comparison_ignores_the_dropped_mapping_and_server_defaults() {
        let devices = devices(DeviceMode::Grouped);
        let owner = NodeOwner {
            name: "n".to_string(),
            uid: "u".to_string(),
        };
        let want = build_slices("dra.cpu", "n", Some(&owner), devices, 1)
            .unwrap()
            .remove(0);
        let mut have = want.clone();
        assert!(slice_matches(&want, &have));
        for d in have.spec.devices.iter_mut().flatten() {
            d.node_allocatable_resources = None;
            d.taints = Some(vec![]);
        }
        assert!(slice_matches(&want, &have), "dropped mapping and defaults");
        let mut changed = have.clone();
        if let Some(d) = changed.spec.devices.as_mut().and_then(|d| d.first_mut()) {
            d.name = "other".to_string();
        }
        assert!(!slice_matches(&want, &changed));
        let mut fewer = have.clone();
        fewer.spec.devices.as_mut().unwrap().pop();
        assert!(!slice_matches(&want, &fewer));
        let mut unowned = have.clone();
        unowned.metadata.owner_references = None;
        assert!(!slice_matches(&want, &unowned));
        let mut relabelled = have;
        relabelled.metadata.labels = None;
        assert!(!slice_matches(&want, &relabelled));
    }

    #[test]
    fn normalised_specs_compare_as_the_server_stores_them() {
        let want = json!({"driver": "d", "devices": [{"name": "a",
            "capacity": {"dra.cpu/cpu": {"value": "1000"}}, "taints": [],
            "nodeAllocatableResources": {"cpu": {}}}], "sharedCounters": []});
        let have = json!({"driver": "d", "devices": [{"name": "a",
            "capacity": {"dra.cpu/cpu": {"value": "1k"}}}]});
        assert_eq!(normalised_spec(want.clone()), normalised_spec(have.clone()));
        assert!(json_contains(
            &normalised_spec(want),
            &normalised_spec(have)
        ));
        let empty_pool = json!({"driver": "d", "devices": []});
        assert_eq!(normalised_spec(empty_pool), json!({"driver": "d"}));
        let other = json!({"driver": "d", "devices": [{"name": "a",
            "capacity": {"dra.cpu/cpu": {"value": "2k"}}}]});
        assert_ne!(
            normalised_spec(other),
            normalised_spec(json!({"driver": "d", "devices": [{"name": "a",
                "capacity": {"dra.cpu/cpu": {"value": "1000"}}}]}))
        );
    }

    #[test]
    fn content_hash_tells_device_sets_apart() {
        let grouped = devices(DeviceMode::Grouped);
        let individual = devices(DeviceMode::Individual);
        assert_eq!(content_hash(&grouped), content_hash(&grouped.clone()));
        assert_ne!(content_hash(&grouped), content_hash(&individual));
    }
}
