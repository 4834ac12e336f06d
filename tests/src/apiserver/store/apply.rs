//! Server-side apply and the managedFields it keeps.

use super::super::patch;
use super::super::version::undeclared_message;
use super::error::ApiError;
use super::resource_types::ResourceType;
use super::resource_types::Subresource;
use super::{key, metadata_mut, name_from_url, now_rfc3339, spec_part, Store};
use serde_json::{json, Map, Value};

impl Store {
    /// Server-side apply (`application/apply-patch+yaml`): creates the object
    /// if missing; otherwise replaces the fields the manager sends. Another
    /// manager's differing fields conflict unless `force`.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        applied: &Value,
        subresource: Subresource,
        field_manager: &str,
        force: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut applied = applied.clone();
        if rt.kind == "ResourceSlice" {
            // Server-side apply converts the configuration to the typed
            // schema first, whatever fieldValidation says, and a field the
            // schema does not declare fails the request with a 500
            // (structuredmerge.go, structured-merge-diff's ValidationErrors).
            let undeclared = self.slice_schema.undeclared_fields(&applied);
            if !undeclared.is_empty() {
                return Err(ApiError::new(
                    500,
                    "",
                    format!(
                        "failed to create typed patch object ({namespace}/{name}; {}, Kind={}): {}",
                        rt.api_version(),
                        rt.kind,
                        undeclared_message(&undeclared)
                    ),
                ));
            }
        }
        for (field, expected) in [
            ("apiVersion", rt.api_version()),
            ("kind", rt.kind.to_string()),
        ] {
            match applied.get(field).and_then(Value::as_str) {
                None => {
                    return Err(ApiError::bad_request(format!(
                        "{field} must be set in an apply configuration"
                    )))
                }
                Some(v) if v != expected => {
                    return Err(ApiError::bad_request(format!(
                        "the {field} of the body ({v:?}) does not match the path ({expected:?})"
                    )))
                }
                Some(_) => {}
            }
        }
        name_from_url(&mut applied, name)?;
        let existing = match self.get(rt, namespace, name) {
            Err(e) if e.code == 404 => {
                if subresource == Subresource::Status {
                    return Err(e);
                }
                let mut created = applied.clone();
                record_apply_ownership(&mut created, &applied, field_manager, &rt.api_version())?;
                return self.create(rt, namespace, created, None, dry_run);
            }
            other => other?,
        };
        if let Some(given) = applied
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            let current = existing
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            if given != current {
                return Err(ApiError::conflict(rt, name, "the object has been modified; please apply your changes to the latest version and try again"));
            }
        }
        let entries = existing
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mine = entries
            .iter()
            .find(|e| is_entry_of(e, field_manager, "Apply"));
        let owned = |what: &str| -> Vec<String> {
            mine.and_then(|e| e.pointer(&format!("/fieldsV1/{what}")))
                .and_then(Value::as_object)
                .map(|m| {
                    m.keys()
                        .filter_map(|k| k.strip_prefix("f:").map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let merged = match subresource {
            Subresource::Main => patch::apply_main(
                &existing,
                &applied,
                &owned_top_level(mine),
                &owned("f:metadata/f:labels"),
                &owned("f:metadata/f:annotations"),
            ),
            Subresource::Status => {
                let owned_devices: Vec<String> = mine
                    .and_then(|e| e.pointer("/fieldsV1/f:status/f:devices"))
                    .and_then(Value::as_object)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                patch::apply_status(&existing, &applied, &owned_devices)
            }
        };
        if !force {
            let others: Vec<&str> = entries
                .iter()
                .filter_map(|e| e.get("manager").and_then(Value::as_str))
                .filter(|m| *m != field_manager)
                .collect();
            let changed = match subresource {
                Subresource::Main => spec_part(&merged) != spec_part(&existing),
                Subresource::Status => merged.get("status") != existing.get("status"),
            };
            if changed {
                if let Some(other) = others.first() {
                    return Err(ApiError::conflict(
                        rt,
                        name,
                        &format!("Apply failed with 1 conflict: conflict with \"{other}\""),
                    ));
                }
            }
        }
        let mut merged = merged;
        record_apply_ownership(&mut merged, &applied, field_manager, &rt.api_version())?;
        if subresource == Subresource::Status {
            record_status_devices(&mut merged, &applied, field_manager);
        }
        let k = key(rt, namespace, name);
        self.commit_update(rt, k, existing, merged, None, dry_run)
    }
}

fn owned_top_level(entry: Option<&Value>) -> Vec<String> {
    entry
        .and_then(|e| e.get("fieldsV1"))
        .and_then(Value::as_object)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("f:"))
                .filter(|k| *k != "metadata")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A managedFields entry: `manager` owns `fields` (FieldsV1) through `operation`.
pub(super) fn managed_entry(
    manager: &str,
    operation: &str,
    api_version: &str,
    fields: Map<String, Value>,
) -> Value {
    json!({"manager": manager, "operation": operation, "apiVersion": api_version,
           "time": now_rfc3339(), "fieldsType": "FieldsV1", "fieldsV1": Value::Object(fields)})
}

/// Whether a managedFields entry is `manager`'s through `operation`.
fn is_entry_of(entry: &Value, manager: &str, operation: &str) -> bool {
    entry.get("manager").and_then(Value::as_str) == Some(manager)
        && entry.get("operation").and_then(Value::as_str) == Some(operation)
}

/// Records in `managedFields` that `manager` owns `fields` through
/// `operation`, in place of what it owned through that operation before: the
/// server keeps one entry per manager and operation.
pub(super) fn set_managed_entry(
    meta: &mut Map<String, Value>,
    manager: &str,
    operation: &str,
    api_version: &str,
    fields: Map<String, Value>,
) {
    let mut entries: Vec<Value> = meta
        .get("managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| !is_entry_of(e, manager, operation))
        .collect();
    entries.push(managed_entry(manager, operation, api_version, fields));
    meta.insert("managedFields".to_string(), Value::Array(entries));
}

/// Records in `managedFields` which fields `manager` applied, in the FieldsV1
/// shape (`f:spec`, `f:metadata: {f:labels: {f:key}}`), coarse at the top level.
/// The `status.devices` entries a manager's apply named, kept in its
/// managedFields entry as the API server keeps them
/// (`f:status: {f:devices: {k:{...}: {}}}`), so that its next apply removes
/// the ones it no longer names.
fn record_status_devices(object: &mut Value, applied: &Value, manager: &str) {
    let keys: Map<String, Value> = applied
        .pointer("/status/devices")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|d| (patch::device_status_key(d), json!({})))
                .collect()
        })
        .unwrap_or_default();
    let Some(entries) = object
        .pointer_mut("/metadata/managedFields")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for entry in entries
        .iter_mut()
        .filter(|e| is_entry_of(e, manager, "Apply"))
    {
        if let Some(fields) = entry.get_mut("fieldsV1").and_then(Value::as_object_mut) {
            fields.insert(
                "f:status".to_string(),
                json!({"f:devices": Value::Object(keys.clone())}),
            );
        }
    }
}

fn record_apply_ownership(
    object: &mut Value,
    applied: &Value,
    manager: &str,
    api_version: &str,
) -> Result<(), ApiError> {
    let mut fields = Map::new();
    for field in patch::applied_top_level_fields(applied) {
        fields.insert(format!("f:{field}"), json!({}));
    }
    let mut meta_fields = Map::new();
    for what in ["labels", "annotations"] {
        let keys = patch::applied_metadata_keys(applied, what);
        if !keys.is_empty() {
            meta_fields.insert(
                format!("f:{what}"),
                Value::Object(
                    keys.into_iter()
                        .map(|k| (format!("f:{k}"), json!({})))
                        .collect(),
                ),
            );
        }
    }
    if !meta_fields.is_empty() {
        fields.insert("f:metadata".to_string(), Value::Object(meta_fields));
    }
    set_managed_entry(metadata_mut(object)?, manager, "Apply", api_version, fields);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::store::resource_types::RESOURCE_SLICES;
    use crate::apiserver::store::tests::slice;

    /// Server-side apply of `body` to slice `a` by `manager`.
    fn apply_slice(
        s: &mut Store,
        body: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, ApiError> {
        s.apply(
            &RESOURCE_SLICES,
            "",
            "a",
            body,
            Subresource::Main,
            manager,
            force,
            false,
        )
    }

    #[test]
    fn apply_creates_then_replaces_and_detects_conflicts() {
        let mut s = Store::new();
        let created = apply_slice(&mut s, &slice("a", "n1"), "dra.cpu", true).unwrap();
        assert_eq!(
            created["metadata"]["managedFields"][0]["manager"],
            "dra.cpu"
        );
        let same = apply_slice(&mut s, &slice("a", "n1"), "dra.cpu", false).unwrap();
        assert_eq!(
            same["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
            "re-applying the same configuration is a no-op"
        );
        let mut other = slice("a", "n1");
        other["spec"]["devices"] = json!([]);
        let conflict = apply_slice(&mut s, &other, "someone-else", false).unwrap_err();
        assert_eq!((conflict.code, conflict.reason), (409, "Conflict"));
        let forced = apply_slice(&mut s, &other, "someone-else", true).unwrap();
        assert!(
            forced["spec"].get("devices").is_none(),
            "an empty list is omitted, as the server's encoding does"
        );
        assert_eq!(forced["metadata"]["uid"], created["metadata"]["uid"]);
        assert_eq!(forced["metadata"]["generation"], 2);
    }
}
