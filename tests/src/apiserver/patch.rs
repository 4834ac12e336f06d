//! Patch semantics: JSON merge patch (RFC 7386) and the part of server-side
//! apply a single-owner driver relies on.

use serde_json::{Map, Value};

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch_map) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(target_map) = target {
                for (key, value) in patch_map {
                    if value.is_null() {
                        target_map.remove(key);
                    } else {
                        merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Top-level fields that server-side apply never takes from the applied
/// configuration wholesale.
const APPLY_SKIPPED: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];

/// Applies `applied` onto `existing` as server-side apply does for a manager
/// that owns every field it sends: each top-level field it sends (except
/// metadata and status) replaces the stored one, and `fields_before` (the top
/// level fields this manager applied last time) that it no longer sends are
/// removed. Labels and annotations merge key by key, with keys this manager
/// applied before and now omits removed. Returns the new object.
pub fn apply_main(
    existing: &Value,
    applied: &Value,
    fields_before: &[String],
    labels_before: &[String],
    annotations_before: &[String],
) -> Value {
    let mut out = existing.clone();
    let Some(out_map) = out.as_object_mut() else {
        return applied.clone();
    };
    let applied_map = applied.as_object().cloned().unwrap_or_default();
    for key in fields_before {
        if !APPLY_SKIPPED.contains(&key.as_str()) && !applied_map.contains_key(key) {
            out_map.remove(key);
        }
    }
    for (key, value) in &applied_map {
        if !APPLY_SKIPPED.contains(&key.as_str()) {
            out_map.insert(key.clone(), value.clone());
        }
    }
    let metadata = out_map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    for (field, before) in [
        ("labels", labels_before),
        ("annotations", annotations_before),
    ] {
        let given = applied
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object);
        let mut merged = metadata
            .get(field)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for key in before {
            if !given.is_some_and(|g| g.contains_key(key)) {
                merged.remove(key);
            }
        }
        if let Some(given) = given {
            for (k, v) in given {
                merged.insert(k.clone(), v.clone());
            }
        }
        if let Some(m) = metadata.as_object_mut() {
            if merged.is_empty() {
                m.remove(field);
            } else {
                m.insert(field.to_string(), Value::Object(merged));
            }
        }
    }
    if let Some(owners) = applied.pointer("/metadata/ownerReferences") {
        if let Some(m) = metadata.as_object_mut() {
            m.insert("ownerReferences".to_string(), owners.clone());
        }
    }
    out
}

/// The top-level fields a manager sets in an applied configuration, for
/// remembering ownership (what `managedFields` records).
/// The key server-side apply gives an entry of a ResourceClaim's
/// `status.devices` (a list-map keyed by driver, pool, device and, where
/// set, shareID): `k:{"device":..,"driver":..,"pool":..}`.
pub fn device_status_key(entry: &Value) -> String {
    let mut key = std::collections::BTreeMap::new();
    for field in ["driver", "pool", "device", "shareID"] {
        if let Some(v) = entry.get(field) {
            key.insert(field, v.clone());
        }
    }
    format!("k:{}", serde_json::to_string(&key).unwrap_or_default())
}

/// Server-side apply of a status by one manager: every top-level status
/// field the configuration names replaces the stored one and the others
/// stay (the fields other managers own, such as a claim's `allocation` and
/// `reservedFor`), except `devices`, a list-map: the entries this manager
/// applied before (`owned_devices`, their keys) and no longer names are
/// removed, the ones it names are set, other managers' entries stay.
pub fn apply_status(existing: &Value, applied: &Value, owned_devices: &[String]) -> Value {
    let mut merged = existing.clone();
    let Some(applied_status) = applied.get("status").and_then(Value::as_object) else {
        return merged;
    };
    let Some(object) = merged.as_object_mut() else {
        return merged;
    };
    let status = object
        .entry("status")
        .or_insert_with(|| Value::Object(Map::new()));
    if !status.is_object() {
        *status = Value::Object(Map::new());
    }
    let Some(status) = status.as_object_mut() else {
        return merged;
    };
    for (field, value) in applied_status {
        if field != "devices" {
            status.insert(field.clone(), value.clone());
            continue;
        }
        let named: Vec<Value> = value.as_array().cloned().unwrap_or_default();
        let named_keys: Vec<String> = named.iter().map(device_status_key).collect();
        let mut devices: Vec<Value> = status
            .get("devices")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|d| {
                let key = device_status_key(d);
                !named_keys.contains(&key) && !owned_devices.contains(&key)
            })
            .collect();
        devices.extend(named);
        if devices.is_empty() {
            status.remove("devices");
        } else {
            status.insert("devices".to_string(), Value::Array(devices));
        }
    }
    merged
}

pub fn applied_top_level_fields(applied: &Value) -> Vec<String> {
    applied
        .as_object()
        .map(|m| {
            m.keys()
                .filter(|k| !APPLY_SKIPPED.contains(&k.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

pub fn applied_metadata_keys(applied: &Value, field: &str) -> Vec<String> {
    applied
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_status_apply_keeps_what_it_does_not_name_and_drops_what_it_owned() {
        let entry = |device: &str, cpus: &str| json!({"driver": "dra.cpu", "pool": "n", "device": device, "data": {"cpus": cpus}});
        let other = json!({"driver": "gpu.example", "pool": "n", "device": "gpu0"});
        let existing = json!({"status": {
            "allocation": {"devices": {"results": [1]}},
            "reservedFor": [{"name": "pod"}],
            "devices": [other.clone(), entry("d0", "1")],
        }});
        let owned = vec![device_status_key(&entry("d0", "1"))];
        // This manager now names d1 only: d0 (its own) goes, the other
        // driver's entry and the allocation stay.
        let merged = apply_status(
            &existing,
            &json!({"status": {"devices": [entry("d1", "2")]}}),
            &owned,
        );
        assert_eq!(
            merged["status"]["allocation"],
            existing["status"]["allocation"]
        );
        assert_eq!(
            merged["status"]["reservedFor"],
            existing["status"]["reservedFor"]
        );
        assert_eq!(
            merged["status"]["devices"],
            json!([other.clone(), entry("d1", "2")])
        );
        // An entry it names again is replaced, not doubled.
        let again = apply_status(
            &merged,
            &json!({"status": {"devices": [entry("d1", "3")]}}),
            &[],
        );
        assert_eq!(
            again["status"]["devices"],
            json!([other.clone(), entry("d1", "3")])
        );
        // An empty list clears its entries only.
        let cleared = apply_status(
            &again,
            &json!({"status": {"devices": []}}),
            &[device_status_key(&entry("d1", "3"))],
        );
        assert_eq!(cleared["status"]["devices"], json!([other]));
        let none = apply_status(&existing, &json!({"status": {"devices": []}}), &owned);
        assert_eq!(
            none["status"]["devices"],
            json!([json!({"driver": "gpu.example", "pool": "n", "device": "gpu0"})])
        );
    }

    #[test]
    fn merge_patch_rfc7386_examples() {
        // The examples of RFC 7386 appendix A.
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            let mut t = target.clone();
            merge_patch(&mut t, &patch);
            assert_eq!(t, expected, "target {target} patch {patch}");
        }
    }

    #[test]
    fn apply_replaces_spec_keeps_identity_and_prunes_dropped_labels() {
        let existing = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s", "uid": "u", "resourceVersion": "7", "labels": {"mine": "1", "theirs": "2"}},
            "spec": {"driver": "dra.cpu", "devices": [{"name": "a"}, {"name": "b"}]},
            "extra": true
        });
        let applied = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s", "labels": {"new": "3"}},
            "spec": {"driver": "dra.cpu", "devices": [{"name": "a"}]}
        });
        let out = apply_main(
            &existing,
            &applied,
            &["spec".into(), "extra".into()],
            &["mine".into()],
            &[],
        );
        assert_eq!(out["spec"]["devices"], json!([{"name": "a"}]));
        assert_eq!(out["metadata"]["uid"], "u");
        assert_eq!(out["metadata"]["resourceVersion"], "7");
        assert_eq!(
            out["metadata"]["labels"],
            json!({"theirs": "2", "new": "3"})
        );
        assert!(
            out.get("extra").is_none(),
            "a field the manager stopped sending is removed"
        );
        assert_eq!(applied_top_level_fields(&applied), vec!["spec".to_string()]);
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|i| json!(i)),
            "[a-c]{0,3}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn merge_patch_is_idempotent(target in json_value(), patch in json_value()) {
            let mut once = target.clone();
            merge_patch(&mut once, &patch);
            let mut twice = once.clone();
            merge_patch(&mut twice, &patch);
            prop_assert_eq!(once, twice);
        }

        #[test]
        fn applying_the_same_configuration_twice_changes_nothing(spec in json_value(), labels in proptest::collection::btree_map("[a-d]", "[a-d]{1,3}", 0..4)) {
            let existing = json!({"metadata": {"name": "s", "uid": "u"}, "spec": {"old": 1}});
            let applied = json!({"metadata": {"name": "s", "labels": labels}, "spec": spec});
            let fields = applied_top_level_fields(&applied);
            let keys = applied_metadata_keys(&applied, "labels");
            let once = apply_main(&existing, &applied, &[], &[], &[]);
            let twice = apply_main(&once, &applied, &fields, &keys, &[]);
            prop_assert_eq!(&once, &twice);
            prop_assert_eq!(&once["spec"], &applied["spec"]);
        }
    }
}
