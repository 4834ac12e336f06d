//! A few of the API server's own validation rules (those a DRA driver can
//! break), answered as 422 Invalid with field causes like the real server.

use serde_json::Value;
use std::collections::BTreeSet;

/// One reason an object is invalid, as a `StatusCause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.to_string(),
        message: "Required value".to_string(),
    }
}

fn invalid(field: &str, message: impl Into<String>) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.to_string(),
        message: message.into(),
    }
}

fn too_many(field: &str, max: usize, got: usize) -> Cause {
    Cause {
        reason: "FieldValueTooMany",
        field: field.to_string(),
        message: format!("must have at most {max} items, got {got}"),
    }
}

/// Lowercase RFC 1123 DNS label (device names, name segments).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Lowercase RFC 1123 DNS subdomain (object names, driver names) as
/// apimachinery's `IsDNS1123Subdomain` checks it: at most 253 characters
/// matching `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`,
/// whose parts have no length limit of their own (unlike a DNS label).
pub fn is_dns_subdomain(s: &str) -> bool {
    let is_part = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_part)
}

/// Attribute and capacity names: an optional DNS-subdomain domain, `/`, and a
/// C identifier of at most 32 characters.
fn is_qualified_device_name(s: &str) -> bool {
    let (domain, id) = match s.rsplit_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, s),
    };
    let id_ok = !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    id_ok && domain.is_none_or(|d| is_dns_subdomain(d) && d.len() <= 63)
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

pub fn validate_metadata_name(object: &Value, causes: &mut Vec<Cause>) {
    match str_at(object, "/metadata/name") {
        None | Some("") => causes.push(required("metadata.name")),
        Some(name) if !is_dns_subdomain(name) => causes.push(invalid(
            "metadata.name",
            format!("{name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        )),
        Some(_) => {}
    }
}

/// Per-slice limits from `resource.k8s.io/v1`.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// ... once a device carries a list-typed attribute (or taints, counters).
pub const MAX_DEVICES_PER_SLICE_WITH_ADVANCED_FEATURES: usize = 64;
/// Attribute values of one device, each list item counted.
pub const MAX_ATTRIBUTE_VALUES_PER_DEVICE: usize = 48;
const LIST_KINDS: [&str; 4] = ["bools", "ints", "strings", "versions"];
pub const MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: usize = 32;
pub const MAX_ALLOCATION_RESULTS: usize = 32;
pub const MAX_RESERVED_FOR: usize = 256;

pub fn validate_resource_slice(object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    validate_metadata_name(object, &mut causes);
    let Some(spec) = object.get("spec").filter(|s| s.is_object()) else {
        causes.push(required("spec"));
        return causes;
    };
    match spec.get("driver").and_then(Value::as_str) {
        None | Some("") => causes.push(required("spec.driver")),
        Some(d) if !is_dns_subdomain(d) || d.len() > 63 => causes.push(invalid(
            "spec.driver",
            format!("{d:?}: must be a DNS subdomain of at most 63 characters"),
        )),
        Some(_) => {}
    }
    match spec.get("pool") {
        None => causes.push(required("spec.pool")),
        Some(pool) => {
            match pool.get("name").and_then(Value::as_str) {
                None | Some("") => causes.push(required("spec.pool.name")),
                Some(_) => {}
            }
            match pool.get("generation").and_then(Value::as_i64) {
                None => causes.push(required("spec.pool.generation")),
                Some(g) if g < 0 => causes.push(invalid(
                    "spec.pool.generation",
                    format!("{g}: must be greater than or equal to 0"),
                )),
                Some(_) => {}
            }
            match pool.get("resourceSliceCount").and_then(Value::as_i64) {
                None => causes.push(required("spec.pool.resourceSliceCount")),
                Some(c) if c <= 0 => causes.push(invalid(
                    "spec.pool.resourceSliceCount",
                    format!("{c}: must be greater than zero"),
                )),
                Some(_) => {}
            }
        }
    }
    // Exactly one way of saying which nodes the slice applies to.
    let node_name = spec
        .get("nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let node_selector = spec.get("nodeSelector").is_some_and(|s| !s.is_null());
    let all_nodes = spec.get("allNodes").and_then(Value::as_bool) == Some(true);
    let per_device = spec.get("perDeviceNodeSelection").and_then(Value::as_bool) == Some(true);
    let set = [node_name, node_selector, all_nodes, per_device]
        .iter()
        .filter(|b| **b)
        .count();
    if set == 0 {
        causes.push(required("spec"));
        if let Some(last) = causes.last_mut() {
            last.message = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required".to_string();
        }
    } else if set > 1 {
        causes.push(invalid("spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set"));
    }
    if let Some(devices) = spec.get("devices").and_then(Value::as_array) {
        let has_lists = devices.iter().any(|d| {
            d.get("attributes")
                .and_then(Value::as_object)
                .is_some_and(|attrs| {
                    attrs.values().any(|a| {
                        LIST_KINDS
                            .iter()
                            .any(|k| a.get(*k).is_some_and(|v| !v.is_null()))
                    })
                })
        });
        let max_devices = if has_lists {
            MAX_DEVICES_PER_SLICE_WITH_ADVANCED_FEATURES
        } else {
            MAX_DEVICES_PER_SLICE
        };
        if devices.len() > max_devices {
            causes.push(too_many("spec.devices", max_devices, devices.len()));
        }
        let mut names = BTreeSet::new();
        for (i, device) in devices.iter().enumerate() {
            validate_device(
                device,
                &format!("spec.devices[{i}]"),
                &mut names,
                &mut causes,
            );
        }
    }
    causes
}

fn validate_device(
    device: &Value,
    path: &str,
    names: &mut BTreeSet<String>,
    causes: &mut Vec<Cause>,
) {
    match device.get("name").and_then(Value::as_str) {
        None | Some("") => causes.push(required(&format!("{path}.name"))),
        Some(name) => {
            if !is_dns_label(name) {
                causes.push(invalid(&format!("{path}.name"), format!("{name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
            }
            if !names.insert(name.to_string()) {
                causes.push(Cause {
                    reason: "FieldValueDuplicate",
                    field: format!("{path}.name"),
                    message: format!("Duplicate value: {name:?}"),
                });
            }
        }
    }
    let mut entries = 0usize;
    let mut values = 0usize;
    if let Some(attributes) = device.get("attributes").and_then(Value::as_object) {
        entries += attributes.len();
        for (key, attr) in attributes {
            let field = format!("{path}.attributes[{key}]");
            if !is_qualified_device_name(key) {
                causes.push(invalid(&field, format!("{key:?}: must be a C identifier of at most 32 characters, optionally prefixed by a DNS subdomain and '/'")));
            }
            let mut list_items = 0usize;
            for list in LIST_KINDS {
                let Some(items) = attr.get(list).filter(|v| !v.is_null()) else {
                    continue;
                };
                let items = items.as_array().map(Vec::as_slice).unwrap_or_default();
                if items.is_empty() {
                    causes.push(invalid(
                        &format!("{field}.{list}"),
                        "must not be empty if specified",
                    ));
                }
                list_items += items.len();
                if list == "strings" || list == "versions" {
                    for (i, item) in items.iter().enumerate() {
                        if item.as_str().is_some_and(|s| s.len() > 64) {
                            causes.push(invalid(
                                &format!("{field}.{list}[{i}]"),
                                "may not be longer than 64",
                            ));
                        }
                    }
                }
            }
            values += list_items.max(1);
            let kinds = ["bool", "int", "string", "version"]
                .iter()
                .chain(LIST_KINDS.iter())
                .filter(|k| attr.get(**k).is_some_and(|v| !v.is_null()))
                .count();
            if kinds != 1 {
                causes.push(invalid(
                    &field,
                    format!("exactly one value must be specified, found {kinds}"),
                ));
            }
            if let Some(s) = attr.get("string").and_then(Value::as_str) {
                if s.len() > 64 {
                    causes.push(invalid(
                        &format!("{field}.string"),
                        "may not be longer than 64",
                    ));
                }
            }
        }
    }
    if let Some(capacity) = device.get("capacity").and_then(Value::as_object) {
        entries += capacity.len();
        for (key, cap) in capacity {
            let field = format!("{path}.capacity[{key}]");
            if !is_qualified_device_name(key) {
                causes.push(invalid(&field, format!("{key:?}: must be a C identifier of at most 32 characters, optionally prefixed by a DNS subdomain and '/'")));
            }
            if cap.get("value").is_none_or(Value::is_null) {
                causes.push(required(&format!("{field}.value")));
            }
        }
    }
    if values > MAX_ATTRIBUTE_VALUES_PER_DEVICE {
        causes.push(invalid(
            path,
            format!("the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES_PER_DEVICE}, got {values}"),
        ));
    }
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE {
        causes.push(too_many(
            &format!("{path}.attributes"),
            MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
            entries,
        ));
    }
}

pub fn validate_resource_claim_status(object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(status) = object.get("status").filter(|s| !s.is_null()) else {
        return causes;
    };
    if let Some(results) = status
        .pointer("/allocation/devices/results")
        .and_then(Value::as_array)
    {
        if results.len() > MAX_ALLOCATION_RESULTS {
            causes.push(too_many(
                "status.allocation.devices.results",
                MAX_ALLOCATION_RESULTS,
                results.len(),
            ));
        }
        for (i, result) in results.iter().enumerate() {
            for field in ["request", "driver", "pool", "device"] {
                if result
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(required(&format!(
                        "status.allocation.devices.results[{i}].{field}"
                    )));
                }
            }
        }
    }
    if let Some(reserved) = status.get("reservedFor").and_then(Value::as_array) {
        if reserved.len() > MAX_RESERVED_FOR {
            causes.push(too_many(
                "status.reservedFor",
                MAX_RESERVED_FOR,
                reserved.len(),
            ));
        }
        let mut uids = BTreeSet::new();
        for (i, consumer) in reserved.iter().enumerate() {
            for field in ["resource", "name", "uid"] {
                if consumer
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(required(&format!("status.reservedFor[{i}].{field}")));
                }
            }
            if let Some(uid) = consumer.get("uid").and_then(Value::as_str) {
                if !uids.insert(uid.to_string()) {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        field: format!("status.reservedFor[{i}].uid"),
                        message: format!("Duplicate value: {uid:?}"),
                    });
                }
            }
        }
        if !reserved.is_empty() && status.get("allocation").is_none_or(Value::is_null) {
            causes.push(Cause {
                reason: "FieldValueForbidden",
                field: "status.reservedFor".to_string(),
                message: "Forbidden: may not be set when `allocation` is unset".to_string(),
            });
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn slice() -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "node-1-dra.cpu"},
            "spec": {
                "driver": "dra.cpu", "nodeName": "node-1",
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "cpudevnuma000",
                    "attributes": {"dra.cpu/numCPUs": {"int": 2}, "dra.cpu/smtEnabled": {"bool": true}},
                    "capacity": {"dra.cpu/cpu": {"value": "2"}}}]
            }
        })
    }

    fn fields(causes: &[Cause]) -> Vec<String> {
        causes.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn valid_slice_passes() {
        assert_eq!(validate_resource_slice(&slice()), vec![]);
    }

    #[test]
    fn slice_rules_table() {
        type Edit = fn(&mut Value);
        let cases: &[(&str, Edit, &str)] = &[
            (
                "no driver",
                |s| {
                    s["spec"].as_object_mut().map(|m| m.remove("driver"));
                },
                "spec.driver",
            ),
            (
                "upper-case driver",
                |s| s["spec"]["driver"] = json!("DRA.cpu"),
                "spec.driver",
            ),
            (
                "no pool",
                |s| {
                    s["spec"].as_object_mut().map(|m| m.remove("pool"));
                },
                "spec.pool",
            ),
            (
                "no pool name",
                |s| s["spec"]["pool"]["name"] = json!(""),
                "spec.pool.name",
            ),
            (
                "zero slice count",
                |s| s["spec"]["pool"]["resourceSliceCount"] = json!(0),
                "spec.pool.resourceSliceCount",
            ),
            (
                "no node",
                |s| {
                    s["spec"].as_object_mut().map(|m| m.remove("nodeName"));
                },
                "spec",
            ),
            (
                "two node modes",
                |s| s["spec"]["allNodes"] = json!(true),
                "spec",
            ),
            (
                "no name",
                |s| {
                    s["metadata"].as_object_mut().map(|m| m.remove("name"));
                },
                "metadata.name",
            ),
            (
                "device name",
                |s| s["spec"]["devices"][0]["name"] = json!("CPU_0"),
                "spec.devices[0].name",
            ),
            (
                "two value types",
                |s| {
                    s["spec"]["devices"][0]["attributes"]["dra.cpu/numCPUs"] =
                        json!({"int": 2, "string": "2"})
                },
                "spec.devices[0].attributes[dra.cpu/numCPUs]",
            ),
            (
                "no value type",
                |s| s["spec"]["devices"][0]["attributes"]["dra.cpu/numCPUs"] = json!({}),
                "spec.devices[0].attributes[dra.cpu/numCPUs]",
            ),
            (
                "bad attribute key",
                |s| s["spec"]["devices"][0]["attributes"]["dra.cpu/9x"] = json!({"int": 1}),
                "spec.devices[0].attributes[dra.cpu/9x]",
            ),
            (
                "empty list",
                |s| {
                    s["spec"]["devices"][0]["attributes"]["x.example.com/roots"] =
                        json!({"strings": []})
                },
                "spec.devices[0].attributes[x.example.com/roots].strings",
            ),
            (
                "list and scalar",
                |s| {
                    s["spec"]["devices"][0]["attributes"]["x.example.com/roots"] =
                        json!({"strings": ["a"], "string": "a"})
                },
                "spec.devices[0].attributes[x.example.com/roots]",
            ),
            (
                "long list item",
                |s| {
                    s["spec"]["devices"][0]["attributes"]["x.example.com/roots"] =
                        json!({"strings": ["a", "x".repeat(65)]})
                },
                "spec.devices[0].attributes[x.example.com/roots].strings[1]",
            ),
            (
                "too many attribute values",
                |s| {
                    let many: Vec<String> = (0..48).map(|i| format!("pci{i:04x}:00")).collect();
                    s["spec"]["devices"][0]["attributes"]["x.example.com/roots"] =
                        json!({ "strings": many });
                },
                "spec.devices[0]",
            ),
            (
                "capacity without value",
                |s| s["spec"]["devices"][0]["capacity"]["dra.cpu/cpu"] = json!({}),
                "spec.devices[0].capacity[dra.cpu/cpu].value",
            ),
            (
                "duplicate device",
                |s| {
                    let d = s["spec"]["devices"][0].clone();
                    if let Some(a) = s["spec"]["devices"].as_array_mut() {
                        a.push(d);
                    }
                },
                "spec.devices[1].name",
            ),
        ];
        for (what, edit, field) in cases {
            let mut s = slice();
            edit(&mut s);
            let causes = validate_resource_slice(&s);
            assert!(
                fields(&causes).iter().any(|f| f == field),
                "{what}: expected a cause on {field}, got {causes:?}"
            );
        }
    }

    #[test]
    fn claim_status_rules() {
        let ok = json!({"status": {"allocation": {"devices": {"results": [{"request": "r", "driver": "dra.cpu", "pool": "n", "device": "cpudev000"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}});
        assert_eq!(validate_resource_claim_status(&ok), vec![]);
        let mut dup = ok.clone();
        dup["status"]["reservedFor"] = json!([{"resource": "pods", "name": "p", "uid": "u1"}, {"resource": "pods", "name": "q", "uid": "u1"}]);
        assert_eq!(
            fields(&validate_resource_claim_status(&dup)),
            vec!["status.reservedFor[1].uid"]
        );
        let mut no_alloc = ok.clone();
        no_alloc["status"]
            .as_object_mut()
            .map(|m| m.remove("allocation"));
        assert_eq!(
            fields(&validate_resource_claim_status(&no_alloc)),
            vec!["status.reservedFor"]
        );
        let mut no_device = ok.clone();
        no_device["status"]["allocation"]["devices"]["results"][0]["device"] = json!("");
        assert_eq!(
            fields(&validate_resource_claim_status(&no_device)),
            vec!["status.allocation.devices.results[0].device"]
        );
    }

    #[test]
    fn too_many_devices_is_invalid() {
        let mut s = slice();
        let devices: Vec<Value> = (0..=MAX_DEVICES_PER_SLICE)
            .map(|i| json!({"name": format!("cpudev{i:03}")}))
            .collect();
        s["spec"]["devices"] = Value::Array(devices);
        assert_eq!(fields(&validate_resource_slice(&s)), vec!["spec.devices"]);
        s["spec"]["devices"].as_array_mut().map(|a| a.pop());
        assert_eq!(validate_resource_slice(&s), vec![]);
    }

    #[test]
    fn list_attributes_lower_the_devices_per_slice() {
        let mut s = slice();
        let device = |i: usize| json!({"name": format!("cpudev{i:03}"), "attributes": {"x.example.com/roots": {"strings": ["pci0000:00"]}}});
        s["spec"]["devices"] = Value::Array(
            (0..=MAX_DEVICES_PER_SLICE_WITH_ADVANCED_FEATURES)
                .map(device)
                .collect(),
        );
        assert_eq!(fields(&validate_resource_slice(&s)), vec!["spec.devices"]);
        s["spec"]["devices"].as_array_mut().map(|a| a.pop());
        assert_eq!(validate_resource_slice(&s), vec![]);
        // A list item is one value: 47 besides a one-item list still fits.
        let mut one = slice();
        let mut attrs = serde_json::Map::new();
        attrs.insert("x.example.com/roots".into(), json!({"strings": ["a"]}));
        one["spec"]["devices"][0]["attributes"] = Value::Object(attrs);
        assert_eq!(validate_resource_slice(&one), vec![]);
    }

    proptest! {
        #[test]
        fn dns_label_rule(s in "[a-z0-9-]{0,70}") {
            let expected = !s.is_empty() && s.len() <= 63 && !s.starts_with('-') && !s.ends_with('-');
            prop_assert_eq!(is_dns_label(&s), expected);
        }

        #[test]
        fn any_json_is_validated_without_panic(s in "\\PC{0,40}", n in any::<i64>()) {
            let mut v = slice();
            v["spec"]["pool"]["generation"] = json!(n);
            v["spec"]["devices"][0]["name"] = json!(s);
            let causes = validate_resource_slice(&v);
            prop_assert_eq!(causes.is_empty(), n >= 0 && is_dns_label(&s));
        }
    }
}
