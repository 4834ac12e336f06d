//! What the store admits: type meta and namespace checked, the object
//! validated, typed and pruned to what the release played knows.

use super::super::validate;
use super::super::version::{drop_disabled_fields, drop_disabled_list_attributes};
use super::error::ApiError;
use super::resource_types::ResourceType;
use super::{metadata_mut, name_of, Store};
use serde_json::{json, Value};

impl Store {
    /// Type-checks the object against the typed API (unknown fields are
    /// dropped, as the real server prunes them) and runs the validation rules.
    pub(super) fn admit(
        &self,
        rt: &'static ResourceType,
        object: Value,
    ) -> Result<Value, ApiError> {
        let name = name_of(&object).to_string();
        let mut causes = Vec::new();
        let mut object = object;
        if rt.kind == "ResourceSlice" {
            // Before validation, as the registry strategy's PrepareFor*.
            drop_disabled_list_attributes(&self.gates, &mut object);
        }
        match rt.kind {
            "ResourceSlice" => causes.extend(validate::validate_resource_slice(&object)),
            "ResourceClaim" => {
                validate::validate_metadata_name(&object, &mut causes);
                causes.extend(validate::validate_resource_claim_status(&object));
            }
            _ => validate::validate_metadata_name(&object, &mut causes),
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(rt, &name, &causes));
        }
        if rt.kind == "ResourceSlice" {
            // The decoder drops what this release does not know.
            self.slice_schema.prune(&mut object);
        }
        let mut typed = match rt.kind {
            "ResourceSlice" => roundtrip::<k8s_openapi::api::resource::v1::ResourceSlice>(&object)
                .map(|typed| keep_release_fields(typed, &object)),
            "ResourceClaim" => roundtrip::<k8s_openapi::api::resource::v1::ResourceClaim>(&object),
            "DeviceClass" => roundtrip::<k8s_openapi::api::resource::v1::DeviceClass>(&object),
            "Node" => roundtrip::<k8s_openapi::api::core::v1::Node>(&object),
            _ => Ok(object),
        }
        .map_err(|e| ApiError::bad_request(format!("{} {name:?}: {e}", rt.kind)))?;
        if rt.kind == "ResourceSlice" {
            drop_disabled_fields(&self.gates, &mut typed);
            normalise_slice(&mut typed);
        }
        Ok(typed)
    }

    pub(super) fn check_type_meta(rt: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
        let api_version = rt.api_version();
        for (field, expected) in [("apiVersion", api_version.as_str()), ("kind", rt.kind)] {
            match object.get(field).and_then(Value::as_str) {
                None => {
                    if let Some(m) = object.as_object_mut() {
                        m.insert(field.to_string(), json!(expected));
                    }
                }
                Some(actual) if actual != expected => {
                    return Err(ApiError::bad_request(format!(
                    "the {field} of the body ({actual:?}) does not match the path ({expected:?})"
                )))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    pub(super) fn check_namespace(
        rt: &ResourceType,
        namespace: &str,
        object: &mut Value,
    ) -> Result<(), ApiError> {
        let meta = metadata_mut(object)?;
        if rt.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                None | Some("") => {
                    meta.insert("namespace".to_string(), json!(namespace));
                }
                Some(ns) if ns != namespace => {
                    return Err(ApiError::bad_request(format!(
                        "the namespace of the provided object ({ns}) does not match the namespace sent on the request ({namespace})"
                    )))
                }
                Some(_) => {}
            }
        } else {
            meta.remove("namespace");
        }
        Ok(())
    }
}

/// Fields of the release's Device that the 1.37 types used for the round
/// trip do not have (1.36's `nodeAllocatableResourceMappings`), copied back
/// from the pruned original.
fn keep_release_fields(mut typed: Value, original: &Value) -> Value {
    let originals = original.pointer("/spec/devices").and_then(Value::as_array);
    let Some(devices) = typed
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
    else {
        return typed;
    };
    for (i, device) in devices.iter_mut().enumerate() {
        let (Some(device), Some(source)) = (
            device.as_object_mut(),
            originals.and_then(|o| o.get(i)).and_then(Value::as_object),
        ) else {
            continue;
        };
        for (key, value) in source {
            if !device.contains_key(key) && !value.is_null() {
                device.insert(key.clone(), value.clone());
            }
        }
    }
    typed
}

/// What the server's encoding does to a stored ResourceSlice: empty lists
/// are omitted (`omitempty`), quantities are written in canonical form.
fn normalise_slice(slice: &mut Value) {
    if let Some(spec) = slice.get_mut("spec").and_then(Value::as_object_mut) {
        if spec
            .get("devices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
        {
            spec.remove("devices");
        }
    }
    for device in super::super::slice_devices_mut(slice) {
        device.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
        if let Some(capacity) = device.get_mut("capacity").and_then(Value::as_object_mut) {
            for entry in capacity.values_mut() {
                if let Some(value) = entry.get_mut("value") {
                    if let Some(canonical) =
                        value.as_str().and_then(super::super::quantity::canonical)
                    {
                        *value = Value::String(canonical);
                    }
                }
            }
        }
    }
}

fn roundtrip<T: k8s_openapi::serde::de::DeserializeOwned + k8s_openapi::serde::Serialize>(
    object: &Value,
) -> Result<Value, String> {
    let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::store::resource_types::RESOURCE_SLICES;
    use crate::apiserver::store::tests::slice;

    #[test]
    fn invalid_and_mistyped_objects_are_refused() {
        let mut s = Store::new();
        let mut no_driver = slice("a", "n1");
        no_driver["spec"].as_object_mut().unwrap().remove("driver");
        let e = s
            .create(&RESOURCE_SLICES, "", no_driver, None, false)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(
            e.to_status()["details"]["causes"][0]["field"],
            "spec.driver"
        );
        let mut mistyped = slice("a", "n1");
        mistyped["spec"]["devices"] = json!("not-a-list");
        assert_eq!(
            s.create(&RESOURCE_SLICES, "", mistyped, None, false)
                .unwrap_err()
                .code,
            400
        );
        let mut wrong_kind = slice("a", "n1");
        wrong_kind["kind"] = json!("DeviceClass");
        assert_eq!(
            s.create(&RESOURCE_SLICES, "", wrong_kind, None, false)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(s.resource_version(), 0, "refused writes leave no trace");
    }

    #[test]
    fn dropped_node_allocatable_resources_without_the_feature() {
        let mut s = Store::new();
        s.gates.dra_node_allocatable_resources = false;
        let mut with_mapping = slice("a", "n1");
        with_mapping["spec"]["devices"][0]["nodeAllocatableResources"] =
            json!({"cpu": {"mapping": {"deviceMultiplier": "1"}}});
        let stored = s
            .create(&RESOURCE_SLICES, "", with_mapping.clone(), None, false)
            .unwrap();
        assert!(stored["spec"]["devices"][0]
            .get("nodeAllocatableResources")
            .is_none());
        s.gates.dra_node_allocatable_resources = true;
        let stored = s
            .create(
                &RESOURCE_SLICES,
                "",
                {
                    with_mapping["metadata"]["name"] = json!("b");
                    with_mapping
                },
                None,
                false,
            )
            .unwrap();
        assert_eq!(
            stored["spec"]["devices"][0]["nodeAllocatableResources"]["cpu"]["mapping"]
                ["deviceMultiplier"],
            "1"
        );
    }
}
