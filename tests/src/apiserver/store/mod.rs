//! The object store behind the fake API server: one global, monotonically
//! increasing resourceVersion, object identity (uid, creationTimestamp,
//! generation), optimistic concurrency, and an event log that watches replay
//! from any resourceVersion.

mod admission;
mod apply;
pub mod error;
pub mod events;
pub mod resource_types;
pub mod write;

use super::version::{FeatureGates, KubernetesVersion, SliceSchema};
use error::ApiError;
use events::{EventType, Filter, StoredEvent};
use resource_types::ResourceType;
use serde_json::{json, Map, Value};
use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use tokio::sync::broadcast;

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
}

#[cfg(test)]
mod tests {
    use super::resource_types::Subresource;
    use super::resource_types::{NODES, RESOURCE_SLICES};
    use super::*;
    use crate::apiserver::selector::FieldRequirement;

    pub(super) fn slice(name: &str, node: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "dra.cpu", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "cpudev000"}]}
        })
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
}
