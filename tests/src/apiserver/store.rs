//! The object store behind the fake API server: one global, monotonically
//! increasing resourceVersion, object identity (uid, creationTimestamp,
//! generation), optimistic concurrency, and an event log that watches replay
//! from any resourceVersion.

use super::patch;
use super::selector::{fields_match, labels_match, FieldRequirement, LabelRequirement};
use super::validate::{self, Cause};
use super::version::{
    drop_disabled_fields, drop_disabled_list_attributes, undeclared_message, FeatureGates,
    KubernetesVersion, SliceSchema,
};
use serde_json::{json, Map, Value};
use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use tokio::sync::broadcast;

/// A resource type the server knows (what discovery lists).
#[derive(Debug)]
pub struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub has_status: bool,
    /// Field labels accepted by `fieldSelector` besides metadata.name/namespace.
    pub selectable_fields: &'static [&'static str],
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// What the resource's field label conversion accepts: `metadata.name`
    /// everywhere, `metadata.namespace` only on namespaced resources
    /// (`generic.ObjectMetaFieldsSet`), and the type's own fields
    /// (ResourceSlices: `spec.nodeName` and `spec.driver`, resourceslice
    /// `strategy.go` `toSelectableFields`).
    pub fn supported_fields(&self) -> Vec<&'static str> {
        let mut fields = vec!["metadata.name"];
        if self.namespaced {
            fields.push("metadata.namespace");
        }
        fields.extend_from_slice(self.selectable_fields);
        fields
    }
}

pub const NODES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind: "Node",
    namespaced: false,
    has_status: true,
    selectable_fields: &["spec.unschedulable"],
};
pub const RESOURCE_SLICES: ResourceType = ResourceType {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceslices",
    singular: "resourceslice",
    kind: "ResourceSlice",
    namespaced: false,
    has_status: false,
    selectable_fields: &["spec.nodeName", "spec.driver"],
};
pub const RESOURCE_CLAIMS: ResourceType = ResourceType {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceclaims",
    singular: "resourceclaim",
    kind: "ResourceClaim",
    namespaced: true,
    has_status: true,
    selectable_fields: &[],
};
pub const DEVICE_CLASSES: ResourceType = ResourceType {
    group: "resource.k8s.io",
    version: "v1",
    plural: "deviceclasses",
    singular: "deviceclass",
    kind: "DeviceClass",
    namespaced: false,
    has_status: false,
    selectable_fields: &[],
};

pub const RESOURCE_TYPES: [&ResourceType; 4] =
    [&NODES, &RESOURCE_SLICES, &RESOURCE_CLAIMS, &DEVICE_CLASSES];

pub fn find_type(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCE_TYPES
        .into_iter()
        .find(|t| t.group == group && t.version == version && t.plural == plural)
}

/// An error answered as a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// An error about object `name` of `rt`, with the details the server
    /// gives such errors.
    fn about_object(
        rt: &ResourceType,
        name: &str,
        code: u16,
        reason: &'static str,
        message: String,
    ) -> Self {
        ApiError {
            details: Some(json!({"name": name, "group": rt.group, "kind": rt.plural})),
            ..Self::new(code, reason, message)
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", qualified(rt));
        Self::about_object(rt, name, 404, "NotFound", message)
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", qualified(rt));
        Self::about_object(rt, name, 409, "AlreadyExists", message)
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified(rt)
        );
        Self::about_object(rt, name, 409, "Conflict", message)
    }

    pub fn invalid(rt: &ResourceType, name: &str, causes: &[Cause]) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        ApiError {
            details: Some(json!({
                "name": name, "group": rt.group, "kind": rt.kind,
                "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
            })),
            ..Self::new(
                422,
                "Invalid",
                format!(
                    "{}.{} \"{name}\" is invalid: [{}]",
                    rt.kind,
                    rt.group,
                    summary.join(", ")
                ),
            )
        }
    }

    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        // An error the server has no reason for (StatusReasonUnknown) carries none.
        if self.reason.is_empty() {
            if let Some(m) = status.as_object_mut() {
                m.remove("reason");
            }
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

fn qualified(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.plural.to_string()
    } else {
        format!("{}.{}", rt.plural, rt.group)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as the store's event log and live watches see it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub resource_version: u64,
    pub plural: &'static str,
    pub group: &'static str,
    pub event_type: EventType,
    pub object: Value,
    /// The object before a modification (to tell a watch with a selector
    /// that an object left or entered its view).
    pub previous: Option<Value>,
}

/// What a list or watch filters on.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: Vec<LabelRequirement>,
    pub fields: Vec<FieldRequirement>,
}

impl Filter {
    pub fn matches(&self, object: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        ns_ok && labels_match(&self.labels, object) && fields_match(&self.fields, object)
    }

    /// The event a watch with this filter sees for a stored event, if any:
    /// an object that stops matching is reported DELETED, one that starts
    /// matching ADDED.
    pub fn view(&self, event: &StoredEvent) -> Option<(EventType, Value)> {
        let now = self.matches(&event.object);
        let before = event.previous.as_ref().is_some_and(|p| self.matches(p));
        match (event.event_type, before, now) {
            (EventType::Modified, true, false) => Some((EventType::Deleted, event.object.clone())),
            (EventType::Modified, false, true) => Some((EventType::Added, event.object.clone())),
            (EventType::Modified, false, false) => None,
            (t, _, true) => Some((t, event.object.clone())),
            (_, _, false) => None,
        }
    }
}

/// How a write treats the status of resources that have a status subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    group: &'static str,
    plural: &'static str,
    namespace: String,
    name: String,
}

fn key(rt: &'static ResourceType, namespace: &str, name: &str) -> Key {
    Key {
        group: rt.group,
        plural: rt.plural,
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

/// How many events a live watch can fall behind before it is ended (the
/// client then lists again, as after a real server's watch cache overflow).
const WATCH_CHANNEL_CAPACITY: usize = 4096;

pub struct Store {
    objects: BTreeMap<Key, Value>,
    events: Vec<Arc<StoredEvent>>,
    resource_version: u64,
    uid_counter: u64,
    random: RandomState,
    /// When set, a created object's uid is derived from this seed and the
    /// object's kind, namespace and name: a server started again with the
    /// same seed gives the same objects the same uids (a test that
    /// recreates its claims after a reboot needs the uids the driver
    /// stored before it).
    uid_seed: Option<u64>,
    live: broadcast::Sender<Arc<StoredEvent>>,
    /// The release played: its ResourceSlice schema decides which fields
    /// exist.
    version: KubernetesVersion,
    slice_schema: SliceSchema,
    /// Gated fields of a disabled gate are dropped on write.
    pub gates: FeatureGates,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

fn name_of(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A body names the object of its URL, or takes that name when it names none.
fn name_from_url(object: &mut Value, name: &str) -> Result<(), ApiError> {
    let body_name = name_of(object).to_string();
    if body_name.is_empty() {
        metadata_mut(object)?.insert("name".to_string(), json!(name));
    } else if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

fn metadata_mut(object: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    let meta = object.as_object_mut().map(|m| {
        m.entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()))
    });
    meta.and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

/// Everything outside metadata and status: a change here bumps generation.
fn spec_part(object: &Value) -> Value {
    let mut v = object.clone();
    if let Some(m) = v.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    v
}

impl Store {
    pub fn new() -> Self {
        let (live, _) = broadcast::channel(WATCH_CHANNEL_CAPACITY);
        Store {
            objects: BTreeMap::new(),
            events: Vec::new(),
            resource_version: 0,
            uid_counter: 0,
            random: RandomState::new(),
            uid_seed: None,
            live,
            version: KubernetesVersion::V1_37,
            slice_schema: SliceSchema::of(KubernetesVersion::V1_37),
            gates: FeatureGates {
                dra_consumable_capacity: true,
                dra_node_allocatable_resources: true,
                dra_list_type_attributes: true,
            },
        }
    }

    /// A store playing `version` with `gates`.
    pub fn for_version(version: KubernetesVersion, gates: FeatureGates) -> Self {
        Store {
            version,
            slice_schema: SliceSchema::of(version),
            gates,
            ..Store::new()
        }
    }

    pub fn version(&self) -> KubernetesVersion {
        self.version
    }

    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.live.subscribe()
    }

    /// Events of one resource type after `resource_version`, in order.
    pub fn events_since(&self, rt: &ResourceType, resource_version: u64) -> Vec<Arc<StoredEvent>> {
        let start = self
            .events
            .partition_point(|e| e.resource_version <= resource_version);
        self.events[start..]
            .iter()
            .filter(|e| e.plural == rt.plural && e.group == rt.group)
            .cloned()
            .collect()
    }

    /// Derive uids from `seed` and each object's identity from now on.
    pub fn seed_uids(&mut self, seed: u64) {
        self.uid_seed = Some(seed);
    }

    fn new_uid(&mut self, k: &Key) -> String {
        self.uid_counter += 1;
        let (a, b) = match self.uid_seed {
            // SipHash with fixed keys: the same on every run of the binary.
            Some(seed) => {
                let fixed = std::hash::BuildHasherDefault::<
                    std::collections::hash_map::DefaultHasher,
                >::default();
                (
                    fixed.hash_one((seed, k)),
                    fixed.hash_one((seed, k, 0x5eed_u64)),
                )
            }
            None => (
                self.random.hash_one(self.uid_counter),
                self.random.hash_one((self.uid_counter, 0x5eed_u64)),
            ),
        };
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    fn record(
        &mut self,
        rt: &'static ResourceType,
        event_type: EventType,
        object: Value,
        previous: Option<Value>,
    ) {
        let event = Arc::new(StoredEvent {
            resource_version: self.resource_version,
            plural: rt.plural,
            group: rt.group,
            event_type,
            object,
            previous,
        });
        self.events.push(event.clone());
        // No receivers is fine: nobody is watching.
        let _ = self.live.send(event);
    }

    pub fn get(
        &self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.objects
            .get(&key(rt, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    pub fn list(&self, rt: &'static ResourceType, filter: &Filter) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.group == rt.group && k.plural == rt.plural)
            .map(|(_, v)| v)
            .filter(|v| filter.matches(v))
            .cloned()
            .collect()
    }

    /// Type-checks the object against the typed API (unknown fields are
    /// dropped, as the real server prunes them) and runs the validation rules.
    fn admit(&self, rt: &'static ResourceType, object: Value) -> Result<Value, ApiError> {
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

    fn check_type_meta(rt: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
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

    fn check_namespace(
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

    fn commit_update(
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
fn managed_entry(
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
fn set_managed_entry(
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
    for device in super::slice_devices_mut(slice) {
        device.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
        if let Some(capacity) = device.get_mut("capacity").and_then(Value::as_object_mut) {
            for entry in capacity.values_mut() {
                if let Some(value) = entry.get_mut("value") {
                    if let Some(canonical) = value.as_str().and_then(super::quantity::canonical) {
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

    fn slice(name: &str, node: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "dra.cpu", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "cpudev000"}]}
        })
    }

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
    fn create_assigns_identity_and_increasing_versions() {
        let mut s = Store::new();
        let a = s
            .create(&RESOURCE_SLICES, "", slice("a", "n1"), None, false)
            .unwrap();
        let b = s
            .create(&RESOURCE_SLICES, "", slice("b", "n1"), None, false)
            .unwrap();
        let rv = |v: &Value| {
            v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        assert!(rv(&b) > rv(&a));
        assert_ne!(a["metadata"]["uid"], b["metadata"]["uid"]);
        assert_eq!(a["metadata"]["generation"], 1);
        assert!(a["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z'));
        let dup = s
            .create(&RESOURCE_SLICES, "", slice("a", "n2"), None, false)
            .unwrap_err();
        assert_eq!((dup.code, dup.reason), (409, "AlreadyExists"));
    }

    #[test]
    fn seeded_uids_follow_the_object_not_the_order_of_creation() {
        let uid = |s: &mut Store, name: &str| {
            s.create(&RESOURCE_SLICES, "", slice(name, "n1"), None, false)
                .unwrap()["metadata"]["uid"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let mut first = Store::new();
        first.seed_uids(7);
        let (a1, b1) = (uid(&mut first, "a"), uid(&mut first, "b"));
        let mut again = Store::new();
        again.seed_uids(7);
        // Another object first, then the same two in the other order.
        uid(&mut again, "other");
        let (b2, a2) = (uid(&mut again, "b"), uid(&mut again, "a"));
        assert_eq!((&a1, &b1), (&a2, &b2));
        assert_ne!(a1, b1);
        let mut other_seed = Store::new();
        other_seed.seed_uids(8);
        assert_ne!(uid(&mut other_seed, "a"), a1);
        // Unseeded stores stay random: two of them disagree.
        assert_ne!(uid(&mut Store::new(), "a"), uid(&mut Store::new(), "a"));
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
    fn events_replay_from_a_resource_version_and_filter_views() {
        let mut s = Store::new();
        s.create(&RESOURCE_SLICES, "", slice("a", "n1"), None, false)
            .unwrap();
        let after_first = s.resource_version();
        s.create(&RESOURCE_SLICES, "", slice("b", "n2"), None, false)
            .unwrap();
        s.merge_patch(
            &RESOURCE_SLICES,
            "",
            "a",
            &json!({"spec": {"nodeName": "n2", "pool": {"name": "n2"}}}),
            Subresource::Main,
            None,
            false,
        )
        .unwrap();
        s.delete(&RESOURCE_SLICES, "", "b", None, None, false)
            .unwrap();
        let events = s.events_since(&RESOURCE_SLICES, after_first);
        let kinds: Vec<_> = events.iter().map(|e| e.event_type).collect();
        assert_eq!(
            kinds,
            vec![EventType::Added, EventType::Modified, EventType::Deleted]
        );
        let on_n1 = Filter {
            fields: vec![FieldRequirement {
                field: "spec.nodeName".into(),
                value: "n1".into(),
                negated: false,
            }],
            ..Filter::default()
        };
        let views: Vec<_> = events
            .iter()
            .filter_map(|e| on_n1.view(e))
            .map(|(t, o)| (t, o["metadata"]["name"].clone()))
            .collect();
        assert_eq!(
            views,
            vec![(EventType::Deleted, json!("a"))],
            "a slice moving off the node leaves the view"
        );
        assert!(s.events_since(&NODES, 0).is_empty());
    }

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
