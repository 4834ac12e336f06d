//! Writes: create, replace (PUT), JSON merge patch and delete, with
//! optimistic concurrency and generation tracking.

use super::super::patch;
use super::apply::{managed_entry, set_managed_entry};
use super::error::ApiError;
use super::events::EventType;
use super::resource_types::{ResourceType, Subresource};
use super::{key, metadata_mut, name_from_url, name_of, now_rfc3339, spec_part, Key, Store};
use serde_json::{json, Map, Value};
use std::hash::BuildHasher;

impl Store {
    pub fn create(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        mut object: Value,
        manager: Option<(&str, &str)>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        Self::check_type_meta(rt, &mut object)?;
        Self::check_namespace(rt, namespace, &mut object)?;
        let generated = {
            let meta = metadata_mut(&mut object)?;
            let has_name = meta
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !has_name => Some(prefix.to_string()),
                _ => None,
            }
        };
        if let Some(prefix) = generated {
            let suffix = format!(
                "{:05x}",
                self.random.hash_one(self.uid_counter + 1) & 0xfffff
            );
            metadata_mut(&mut object)?
                .insert("name".to_string(), json!(format!("{prefix}{suffix}")));
        }
        let mut object = self.admit(rt, object)?;
        let name = name_of(&object).to_string();
        let k = key(rt, namespace, &name);
        if self.objects.contains_key(&k) {
            return Err(ApiError::already_exists(rt, &name));
        }
        if dry_run {
            return Ok(object);
        }
        let uid = self.new_uid(&k);
        self.resource_version += 1;
        let rv = self.resource_version.to_string();
        let meta = metadata_mut(&mut object)?;
        meta.insert("uid".to_string(), json!(uid));
        meta.insert("resourceVersion".to_string(), json!(rv));
        meta.insert("creationTimestamp".to_string(), json!(now_rfc3339()));
        meta.insert("generation".to_string(), json!(1));
        meta.remove("deletionTimestamp");
        if let Some((manager, operation)) = manager {
            meta.insert(
                "managedFields".to_string(),
                json!([managed_entry(
                    manager,
                    operation,
                    &rt.api_version(),
                    Map::new()
                )]),
            );
        }
        self.objects.insert(k, object.clone());
        self.record(rt, EventType::Added, object.clone(), None);
        Ok(object)
    }

    /// Replaces a stored object (PUT), keeping identity; a stale
    /// `metadata.resourceVersion` in the body is a 409 Conflict.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        mut object: Value,
        subresource: Subresource,
        manager: Option<(&str, &str)>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        Self::check_type_meta(rt, &mut object)?;
        Self::check_namespace(rt, namespace, &mut object)?;
        name_from_url(&mut object, name)?;
        let k = key(rt, namespace, name);
        let existing = self.get(rt, namespace, name)?;
        let current_rv = existing
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(given) = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            if !given.is_empty() && given != current_rv {
                return Err(ApiError::conflict(rt, name, "the object has been modified; please apply your changes to the latest version and try again"));
            }
        }
        if let Some(given) = object.pointer("/metadata/uid").and_then(Value::as_str) {
            let current = existing
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !given.is_empty() && given != current {
                return Err(ApiError::conflict(rt, name, &format!("Precondition failed: UID in precondition: {given}, UID in object meta: {current}")));
            }
        }
        let mut merged = match (subresource, rt.has_status) {
            (Subresource::Status, _) => {
                let mut m = existing.clone();
                if let Some(obj) = m.as_object_mut() {
                    match object.get("status") {
                        Some(s) => obj.insert("status".to_string(), s.clone()),
                        None => obj.remove("status"),
                    };
                }
                m
            }
            (Subresource::Main, true) => {
                let mut m = object.clone();
                if let Some(obj) = m.as_object_mut() {
                    match existing.get("status") {
                        Some(s) => obj.insert("status".to_string(), s.clone()),
                        None => obj.remove("status"),
                    };
                }
                m
            }
            (Subresource::Main, false) => object.clone(),
        };
        // Identity is the server's, whatever the body says.
        {
            let old_meta = existing.get("metadata").cloned().unwrap_or_default();
            let meta = metadata_mut(&mut merged)?;
            for field in ["uid", "creationTimestamp", "generation", "managedFields"] {
                match old_meta.get(field) {
                    Some(v) => meta.insert(field.to_string(), v.clone()),
                    None => meta.remove(field),
                };
            }
            if subresource == Subresource::Status {
                meta.insert("name".to_string(), json!(name));
            }
        }
        self.commit_update(rt, k, existing, merged, manager, dry_run)
    }

    pub(super) fn commit_update(
        &mut self,
        rt: &'static ResourceType,
        k: Key,
        existing: Value,
        merged: Value,
        manager: Option<(&str, &str)>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut merged = self.admit(rt, merged)?;
        let unchanged = {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(m) = v.pointer_mut("/metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                    m.remove("managedFields");
                }
                v
            };
            strip(&merged) == strip(&existing)
        };
        let generation = existing
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let new_generation = if spec_part(&merged) != spec_part(&existing) {
            generation + 1
        } else {
            generation
        };
        {
            let meta = metadata_mut(&mut merged)?;
            meta.insert("generation".to_string(), json!(new_generation));
            if let Some((manager, operation)) = manager {
                set_managed_entry(meta, manager, operation, &rt.api_version(), Map::new());
            }
        }
        if unchanged || dry_run {
            // A no-op write does not bump the resourceVersion or notify watches.
            let mut out = existing;
            if dry_run && !unchanged {
                out = merged;
            }
            return Ok(out);
        }
        self.resource_version += 1;
        metadata_mut(&mut merged)?.insert(
            "resourceVersion".to_string(),
            json!(self.resource_version.to_string()),
        );
        self.objects.insert(k, merged.clone());
        self.record(rt, EventType::Modified, merged.clone(), Some(existing));
        Ok(merged)
    }

    /// JSON merge patch of the main resource or its status.
    #[allow(clippy::too_many_arguments)]
    pub fn merge_patch(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        patch_body: &Value,
        subresource: Subresource,
        manager: Option<(&str, &str)>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let existing = self.get(rt, namespace, name)?;
        let mut patched = existing.clone();
        patch::merge_patch(&mut patched, patch_body);
        // A patch that names a resourceVersion is a precondition; otherwise
        // it applies to whatever is current.
        if patch_body.pointer("/metadata/resourceVersion").is_none() {
            if let Some(m) = patched
                .pointer_mut("/metadata")
                .and_then(Value::as_object_mut)
            {
                m.remove("resourceVersion");
            }
        }
        self.update(rt, namespace, name, patched, subresource, manager, dry_run)
    }

    pub fn delete(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        precondition_uid: Option<&str>,
        precondition_rv: Option<&str>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let k = key(rt, namespace, name);
        let existing = self.get(rt, namespace, name)?;
        if let Some(uid) = precondition_uid {
            let current = existing
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("");
            if uid != current {
                return Err(ApiError::conflict(rt, name, &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {current}")));
            }
        }
        if let Some(rv) = precondition_rv {
            let current = existing
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            if rv != current {
                return Err(ApiError::conflict(rt, name, "the object has been modified; please apply your changes to the latest version and try again"));
            }
        }
        if dry_run {
            return Ok(existing);
        }
        self.objects.remove(&k);
        self.resource_version += 1;
        let mut deleted = existing.clone();
        metadata_mut(&mut deleted)?.insert(
            "resourceVersion".to_string(),
            json!(self.resource_version.to_string()),
        );
        self.record(rt, EventType::Deleted, deleted.clone(), Some(existing));
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::store::events::Filter;
    use crate::apiserver::store::resource_types::{RESOURCE_CLAIMS, RESOURCE_SLICES};
    use crate::apiserver::store::tests::slice;
    use crate::apiserver::validate;

    /// A PUT of `body` to `name`, its main resource or its status.
    fn put(
        s: &mut Store,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        body: Value,
        subresource: Subresource,
    ) -> Result<Value, ApiError> {
        s.update(rt, namespace, name, body, subresource, None, false)
    }

    #[test]
    fn stale_update_conflicts_and_generation_tracks_spec() {
        let mut s = Store::new();
        let a = s
            .create(&RESOURCE_SLICES, "", slice("a", "n1"), None, false)
            .unwrap();
        let mut changed = a.clone();
        changed["spec"]["devices"] = json!([{"name": "cpudev001"}]);
        let updated = put(
            &mut s,
            &RESOURCE_SLICES,
            "",
            "a",
            changed.clone(),
            Subresource::Main,
        )
        .unwrap();
        assert_eq!(updated["metadata"]["generation"], 2);
        let stale = put(
            &mut s,
            &RESOURCE_SLICES,
            "",
            "a",
            changed,
            Subresource::Main,
        )
        .unwrap_err();
        assert_eq!((stale.code, stale.reason), (409, "Conflict"));
        let mut labelled = updated.clone();
        labelled["metadata"]["labels"] = json!({"x": "y"});
        let relabelled = put(
            &mut s,
            &RESOURCE_SLICES,
            "",
            "a",
            labelled,
            Subresource::Main,
        )
        .unwrap();
        assert_eq!(
            relabelled["metadata"]["generation"], 2,
            "metadata changes keep the generation"
        );
    }

    #[test]
    fn status_writes_touch_only_status() {
        let mut s = Store::new();
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "cpu", "exactly": {"deviceClassName": "dra.cpu", "count": 1}}]}}});
        let created = s
            .create(&RESOURCE_CLAIMS, "ns", claim, None, false)
            .unwrap();
        let mut with_status = created.clone();
        with_status["status"] = json!({"allocation": {"devices": {"results": [{"request": "cpu", "driver": "dra.cpu", "pool": "n1", "device": "cpudev000"}]}}});
        with_status["spec"] = json!({});
        let after = put(
            &mut s,
            &RESOURCE_CLAIMS,
            "ns",
            "c",
            with_status,
            Subresource::Status,
        )
        .unwrap();
        assert_eq!(
            after["spec"], created["spec"],
            "a status write keeps the spec"
        );
        assert_eq!(
            after["status"]["allocation"]["devices"]["results"][0]["device"],
            "cpudev000"
        );
        let mut main = after.clone();
        main["status"] = json!({});
        let kept = put(&mut s, &RESOURCE_CLAIMS, "ns", "c", main, Subresource::Main).unwrap();
        assert_eq!(
            kept["status"], after["status"],
            "a main-resource write keeps the status"
        );
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            "[a-z0-9./-]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 24, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("metadata".to_string()),
                        Just("spec".to_string()),
                        Just("name".to_string()),
                        Just("devices".to_string()),
                        Just("resourceVersion".to_string()),
                        "[a-z]{1,6}"
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bodies_never_panic_and_failures_change_nothing(bodies in proptest::collection::vec(json_value(), 1..6)) {
            let mut s = Store::new();
            s.create(&RESOURCE_SLICES, "", slice("a", "n1"), None, false).unwrap();
            for body in bodies {
                let before = (s.resource_version(), s.list(&RESOURCE_SLICES, &Filter::default()));
                let results = [
                    s.create(&RESOURCE_SLICES, "", body.clone(), None, false),
                    s.update(&RESOURCE_SLICES, "", "a", body.clone(), Subresource::Main, None, false),
                    s.merge_patch(&RESOURCE_SLICES, "", "a", &body, Subresource::Main, None, false),
                    s.apply(&RESOURCE_SLICES, "", "a", &body, Subresource::Main, "m", true, false),
                ];
                if results.iter().all(Result::is_err) {
                    proptest::prop_assert_eq!(before, (s.resource_version(), s.list(&RESOURCE_SLICES, &Filter::default())));
                }
                // Near-valid: one spec field replaced by the arbitrary value.
                for field in ["devices", "pool", "nodeName", "allNodes", "driver"] {
                    let mut near = s.get(&RESOURCE_SLICES, "", "a").unwrap_or_else(|_| slice("a", "n1"));
                    near["spec"][field] = body.clone();
                    near["metadata"].as_object_mut().map(|m| m.remove("resourceVersion"));
                    let before = (s.resource_version(), s.list(&RESOURCE_SLICES, &Filter::default()));
                    if s.update(&RESOURCE_SLICES, "", "a", near, Subresource::Main, None, false).is_err() {
                        proptest::prop_assert_eq!(&before, &(s.resource_version(), s.list(&RESOURCE_SLICES, &Filter::default())));
                    }
                }
                for stored in s.list(&RESOURCE_SLICES, &Filter::default()) {
                    proptest::prop_assert!(validate::validate_resource_slice(&stored).is_empty(), "stored an invalid slice {}", stored);
                }
            }
        }
    }
}
