//! Which Kubernetes release the fake API server plays, and its feature
//! gates: what the ResourceSlice schema of that release declares (apply of
//! an undeclared field is the real HTTP 500), which gated fields it drops,
//! and what `/version` and `/openapi/v3` answer.
//!
//! The schemas are the real ones, from the OpenAPI definitions shipped by
//! the PyPI package kubernetes-validate (`v1.3x.0-local-strict/_definitions.json`),
//! cut down to what a ResourceSlice reaches by `scripts/extract-slice-schemas.py`;
//! a test checks them against the installed package.

use serde_json::{json, Map, Value};
use std::fmt;
use std::str::FromStr;

/// A Kubernetes minor release the fake API server can play.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KubernetesVersion {
    V1_34,
    V1_35,
    V1_36,
    V1_37,
}

impl KubernetesVersion {
    pub const ALL: [KubernetesVersion; 4] = [
        KubernetesVersion::V1_34,
        KubernetesVersion::V1_35,
        KubernetesVersion::V1_36,
        KubernetesVersion::V1_37,
    ];

    pub fn minor(self) -> u32 {
        match self {
            KubernetesVersion::V1_34 => 34,
            KubernetesVersion::V1_35 => 35,
            KubernetesVersion::V1_36 => 36,
            KubernetesVersion::V1_37 => 37,
        }
    }

    /// `v1.3x.0`, as `/version` reports it.
    pub fn git_version(self) -> String {
        format!("v1.{}.0", self.minor())
    }

    /// The ResourceSlice definitions of this release (see the module docs).
    pub fn slice_schema(self) -> &'static str {
        match self {
            KubernetesVersion::V1_34 => include_str!("schemas/resourceslice-v1.34.json"),
            KubernetesVersion::V1_35 => include_str!("schemas/resourceslice-v1.35.json"),
            KubernetesVersion::V1_36 => include_str!("schemas/resourceslice-v1.36.json"),
            KubernetesVersion::V1_37 => include_str!("schemas/resourceslice-v1.37.json"),
        }
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported Kubernetes version {0:?}: the fake API server plays 1.34, 1.35, 1.36 and 1.37"
)]
pub struct UnsupportedVersion(pub String);

impl FromStr for KubernetesVersion {
    type Err = UnsupportedVersion;

    /// `1.34`, `v1.34` or `1.34.2`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim().trim_start_matches('v');
        let mut parts = trimmed.split('.');
        let minor = match (parts.next(), parts.next()) {
            (Some("1"), Some(minor)) => minor,
            _ => return Err(UnsupportedVersion(s.to_string())),
        };
        KubernetesVersion::ALL
            .into_iter()
            .find(|v| v.minor().to_string() == minor)
            .ok_or_else(|| UnsupportedVersion(s.to_string()))
    }
}

/// The feature gates of the API server that change what a ResourceSlice
/// keeps. A disabled gate drops its fields silently on write (the
/// `dropDisabledFields` of the resourceslice registry strategy); the
/// schema, and so the OpenAPI document, still declares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// `DRAConsumableCapacity` (KEP-5075): `allowMultipleAllocations` and
    /// `capacity[].requestPolicy` on devices. Alpha (off) in 1.34 and 1.35,
    /// beta (on) from 1.36.
    pub dra_consumable_capacity: bool,
    /// `DRANodeAllocatableResources` (KEP-5517): the node-allocatable mapping
    /// on devices (`nodeAllocatableResourceMappings` in 1.36,
    /// `nodeAllocatableResources` in 1.37). Alpha, off by default, in both.
    pub dra_node_allocatable_resources: bool,
    /// `DRAListTypeAttributes` (KEP-5491): list-typed device attributes
    /// (`bools`, `ints`, `strings`, `versions`). Declared from 1.36, alpha
    /// (off) in 1.36 and 1.37. Off, the values are dropped and the
    /// attribute left without a value fails validation (422).
    pub dra_list_type_attributes: bool,
}

impl FeatureGates {
    /// The gates' defaults in `version`.
    pub fn defaults(version: KubernetesVersion) -> FeatureGates {
        FeatureGates {
            dra_consumable_capacity: version >= KubernetesVersion::V1_36,
            dra_node_allocatable_resources: false,
            dra_list_type_attributes: false,
        }
    }

    /// Parses `Name=true,Other=false` as `--feature-gates` does, over `self`.
    pub fn with_flags(mut self, flags: &str) -> Result<FeatureGates, String> {
        for item in flags.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| format!("feature gate {item:?} is not Name=true|false"))?;
            let value: bool = value
                .parse()
                .map_err(|_| format!("feature gate {name}: {value:?} is not true or false"))?;
            match name {
                "DRAConsumableCapacity" => self.dra_consumable_capacity = value,
                "DRANodeAllocatableResources" => self.dra_node_allocatable_resources = value,
                "DRAListTypeAttributes" => self.dra_list_type_attributes = value,
                other => return Err(format!("unknown feature gate {other:?}")),
            }
        }
        Ok(self)
    }
}

/// A release's ResourceSlice schema, to find and drop undeclared fields.
#[derive(Debug, Clone)]
pub struct SliceSchema {
    definitions: Map<String, Value>,
}

const SLICE_ROOT: &str = "io.k8s.api.resource.v1.ResourceSlice";
const DEVICE: &str = "io.k8s.api.resource.v1.Device";

impl SliceSchema {
    pub fn of(version: KubernetesVersion) -> SliceSchema {
        // The embedded files are checked by a test; an unreadable one would
        // fail every slice test loudly through an empty schema.
        let definitions = serde_json::from_str::<Value>(version.slice_schema())
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        SliceSchema { definitions }
    }

    /// The field names a Device declares in this release.
    pub fn device_fields(&self) -> Vec<String> {
        self.definitions
            .get(DEVICE)
            .and_then(|d| d.get("properties"))
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Paths of the fields of `object` the schema does not declare, in the
    /// notation of structured-merge-diff (`.spec.devices[0].foo`).
    pub fn undeclared_fields(&self, object: &Value) -> Vec<String> {
        let mut found = Vec::new();
        self.walk(
            &json!({"$ref": SLICE_ROOT}),
            object,
            "",
            &mut Some(&mut found),
            &mut None,
        );
        found
    }

    /// Removes the fields the schema does not declare, as the server's
    /// decoder drops unknown fields of a create or update.
    pub fn prune(&self, object: &mut Value) {
        let snapshot = object.clone();
        let mut pointers = Vec::new();
        self.walk(
            &json!({"$ref": SLICE_ROOT}),
            &snapshot,
            "",
            &mut None,
            &mut Some(&mut pointers),
        );
        for pointer in pointers {
            let (parent, key) = match pointer.rsplit_once('/') {
                Some(split) => split,
                None => continue,
            };
            let key = key.replace("~1", "/").replace("~0", "~");
            if let Some(map) = object.pointer_mut(parent).and_then(Value::as_object_mut) {
                map.remove(&key);
            }
        }
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        let mut schema = schema;
        // References chain at most a few deep; the bound keeps a cyclic file
        // from hanging the server.
        for _ in 0..8 {
            match schema.get("$ref").and_then(Value::as_str) {
                Some(name) => match self.definitions.get(name) {
                    Some(def) => schema = def,
                    None => return schema,
                },
                None => match schema
                    .get("allOf")
                    .and_then(Value::as_array)
                    .and_then(|a| a.first())
                {
                    Some(first) => schema = first,
                    None => return schema,
                },
            }
        }
        schema
    }

    fn walk(
        &self,
        schema: &Value,
        value: &Value,
        path: &str,
        undeclared: &mut Option<&mut Vec<String>>,
        pointers: &mut Option<&mut Vec<String>>,
    ) {
        self.walk_at(schema, value, path, "", undeclared, pointers)
    }

    fn walk_at(
        &self,
        schema: &Value,
        value: &Value,
        path: &str,
        pointer: &str,
        undeclared: &mut Option<&mut Vec<String>>,
        pointers: &mut Option<&mut Vec<String>>,
    ) {
        let schema = self.resolve(schema);
        match value {
            Value::Object(map) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties").filter(|a| a.is_object());
                if properties.is_none() && additional.is_none() {
                    // Free-form (FieldsV1) or a scalar type given an object;
                    // types are not this check's business.
                    return;
                }
                for (key, child) in map {
                    let child_path = format!("{path}.{key}");
                    let child_pointer =
                        format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
                    match properties.and_then(|p| p.get(key)).or(additional) {
                        Some(child_schema) => self.walk_at(
                            child_schema,
                            child,
                            &child_path,
                            &child_pointer,
                            undeclared,
                            pointers,
                        ),
                        None => {
                            if let Some(found) = undeclared.as_deref_mut() {
                                found.push(child_path);
                            }
                            if let Some(found) = pointers.as_deref_mut() {
                                found.push(child_pointer);
                            }
                        }
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.walk_at(
                            item_schema,
                            item,
                            &format!("{path}[{i}]"),
                            &format!("{pointer}/{i}"),
                            undeclared,
                            pointers,
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

/// The error text of structured-merge-diff's `ValidationErrors` for these
/// paths: one error alone, several under `errors:`.
pub fn undeclared_message(paths: &[String]) -> String {
    let errors: Vec<String> = paths
        .iter()
        .map(|p| format!("{p}: field not declared in schema"))
        .collect();
    match errors.as_slice() {
        [one] => one.clone(),
        many => {
            let mut lines = vec!["errors:".to_string()];
            lines.extend(many.iter().map(|e| format!("  {e}")));
            lines.join("\n")
        }
    }
}

/// Drops the fields whose gates are off from a ResourceSlice.
pub fn drop_disabled_fields(gates: &FeatureGates, slice: &mut Value) {
    for device in super::slice_devices_mut(slice) {
        if !gates.dra_consumable_capacity {
            device.remove("allowMultipleAllocations");
            if let Some(capacity) = device.get_mut("capacity").and_then(Value::as_object_mut) {
                for entry in capacity.values_mut().filter_map(Value::as_object_mut) {
                    entry.remove("requestPolicy");
                }
            }
        }
        if !gates.dra_node_allocatable_resources {
            device.remove("nodeAllocatableResources");
            device.remove("nodeAllocatableResourceMappings");
        }
    }
}

/// Drops the list values of every device attribute when the
/// `DRAListTypeAttributes` gate is off, as the registry strategy does
/// before validation: an attribute that had only a list is left with no
/// value, which validation then refuses.
pub fn drop_disabled_list_attributes(gates: &FeatureGates, slice: &mut Value) {
    if gates.dra_list_type_attributes {
        return;
    }
    for device in super::slice_devices_mut(slice) {
        let Some(attributes) = device.get_mut("attributes").and_then(Value::as_object_mut) else {
            continue;
        };
        for attribute in attributes.values_mut().filter_map(Value::as_object_mut) {
            for list in ["bools", "ints", "strings", "versions"] {
                attribute.remove(list);
            }
        }
    }
}

/// The OpenAPI v3 document of `resource.k8s.io/v1` as far as this server
/// models it: the ResourceSlice definitions under `components.schemas`.
pub fn openapi_v3_resource_v1(version: KubernetesVersion) -> Value {
    let schema = SliceSchema::of(version);
    let schemas: Map<String, Value> = schema
        .definitions
        .iter()
        .map(|(name, def)| (name.clone(), with_component_refs(def)))
        .collect();
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": version.git_version()},
        "paths": {},
        "components": {"schemas": schemas},
    })
}

fn with_component_refs(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("$ref", Value::String(name)) => {
                            Value::String(format!("#/components/schemas/{name}"))
                        }
                        _ => with_component_refs(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(with_component_refs).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice_with(device: Value) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": "n-dra.cpu-0", "labels": {"a": "b"}},
               "spec": {"driver": "dra.cpu", "nodeName": "n",
                        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "cpudev000"}, device]}})
    }

    #[test]
    fn versions_parse_and_print() {
        for (text, want) in [
            ("1.34", Some(KubernetesVersion::V1_34)),
            ("v1.36", Some(KubernetesVersion::V1_36)),
            ("1.37.2", Some(KubernetesVersion::V1_37)),
            ("1.33", None),
            ("2.34", None),
            ("", None),
        ] {
            assert_eq!(text.parse::<KubernetesVersion>().ok(), want, "{text:?}");
        }
        assert_eq!(KubernetesVersion::V1_35.to_string(), "1.35");
        assert_eq!(KubernetesVersion::V1_35.git_version(), "v1.35.0");
    }

    #[test]
    fn mapping_fields_are_declared_only_where_the_release_has_them() {
        let mapping_137 = json!({"name": "d", "nodeAllocatableResources": {"cpu": {"mapping": {"deviceMultiplier": "1"}}}});
        let mapping_136 = json!({"name": "d", "nodeAllocatableResourceMappings": {"cpu": {"capacityKey": "dra.cpu/cpu"}}});
        let cases = [
            (
                KubernetesVersion::V1_34,
                &mapping_137,
                vec![".spec.devices[1].nodeAllocatableResources"],
            ),
            (
                KubernetesVersion::V1_35,
                &mapping_137,
                vec![".spec.devices[1].nodeAllocatableResources"],
            ),
            (
                KubernetesVersion::V1_36,
                &mapping_137,
                vec![".spec.devices[1].nodeAllocatableResources"],
            ),
            (KubernetesVersion::V1_36, &mapping_136, vec![]),
            (KubernetesVersion::V1_37, &mapping_137, vec![]),
            (
                KubernetesVersion::V1_37,
                &mapping_136,
                vec![".spec.devices[1].nodeAllocatableResourceMappings"],
            ),
            (
                KubernetesVersion::V1_34,
                &mapping_136,
                vec![".spec.devices[1].nodeAllocatableResourceMappings"],
            ),
        ];
        for (version, device, want) in cases {
            let got = SliceSchema::of(version).undeclared_fields(&slice_with(device.clone()));
            assert_eq!(got, want, "{version}");
        }
        let nested = json!({"name": "d", "capacity": {"dra.cpu/cpu": {"value": "4", "bogus": 1}}});
        assert_eq!(
            SliceSchema::of(KubernetesVersion::V1_34).undeclared_fields(&slice_with(nested)),
            vec![".spec.devices[1].capacity.dra.cpu/cpu.bogus"]
        );
        assert!(SliceSchema::of(KubernetesVersion::V1_34)
            .device_fields()
            .contains(&"allowMultipleAllocations".to_string()));
    }

    #[test]
    fn prune_drops_exactly_the_undeclared_fields() {
        let mut slice = slice_with(json!({"name": "d", "allowMultipleAllocations": true,
            "nodeAllocatableResources": {"cpu": {}}, "attributes": {"x/y": {"int": 1}}}));
        slice["spec"]["surprise"] = json!(1);
        SliceSchema::of(KubernetesVersion::V1_34).prune(&mut slice);
        assert_eq!(
            slice["spec"]["devices"][1],
            json!({"name": "d", "allowMultipleAllocations": true, "attributes": {"x/y": {"int": 1}}})
        );
        assert!(slice["spec"].get("surprise").is_none());
    }

    #[test]
    fn message_is_structured_merge_diffs() {
        assert_eq!(
            undeclared_message(&[".spec.a".to_string()]),
            ".spec.a: field not declared in schema"
        );
        assert_eq!(
            undeclared_message(&[".spec.a".to_string(), ".spec.b".to_string()]),
            "errors:\n  .spec.a: field not declared in schema\n  .spec.b: field not declared in schema"
        );
    }

    #[test]
    fn gates_default_per_release_and_parse() {
        assert!(!FeatureGates::defaults(KubernetesVersion::V1_35).dra_consumable_capacity);
        assert!(FeatureGates::defaults(KubernetesVersion::V1_36).dra_consumable_capacity);
        assert!(!FeatureGates::defaults(KubernetesVersion::V1_37).dra_node_allocatable_resources);
        let gates = FeatureGates::defaults(KubernetesVersion::V1_34)
            .with_flags("DRAConsumableCapacity=true, DRANodeAllocatableResources=true")
            .unwrap();
        assert!(gates.dra_consumable_capacity && gates.dra_node_allocatable_resources);
        assert!(gates.with_flags("Nope=true").is_err());
        assert!(!FeatureGates::defaults(KubernetesVersion::V1_37).dra_list_type_attributes);
        assert!(
            FeatureGates::defaults(KubernetesVersion::V1_36)
                .with_flags("DRAListTypeAttributes=true")
                .unwrap()
                .dra_list_type_attributes
        );
        assert!(gates.with_flags("DRAConsumableCapacity").is_err());
        let mut slice = slice_with(json!({"name": "g", "allowMultipleAllocations": true,
            "capacity": {"dra.cpu/cpu": {"value": "4", "requestPolicy": {"default": "1"}}},
            "nodeAllocatableResources": {"cpu": {}}}));
        drop_disabled_fields(
            &FeatureGates::defaults(KubernetesVersion::V1_34),
            &mut slice,
        );
        assert_eq!(
            slice["spec"]["devices"][1],
            json!({"name": "g", "capacity": {"dra.cpu/cpu": {"value": "4"}}})
        );
    }

    #[test]
    fn openapi_document_lists_the_release_device_fields() {
        let doc = openapi_v3_resource_v1(KubernetesVersion::V1_37);
        let device = &doc["components"]["schemas"][DEVICE];
        assert!(device["properties"]
            .get("nodeAllocatableResources")
            .is_some());
        assert_eq!(
            device["properties"]["capacity"]["additionalProperties"]["$ref"],
            "#/components/schemas/io.k8s.api.resource.v1.DeviceCapacity"
        );
        let doc = openapi_v3_resource_v1(KubernetesVersion::V1_34);
        assert!(doc["components"]["schemas"][DEVICE]["properties"]
            .get("nodeAllocatableResources")
            .is_none());
    }
}
