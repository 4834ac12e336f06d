//! Publishes this node's ResourceSlices and keeps them as built: server-side
//! apply (field manager = driver name, forced), the pool generation bumped
//! when the device set changes, slices of ours that should no longer exist
//! deleted, and a watch that republishes when a slice is deleted or altered
//! behind our back.
//!
//! What is on the server is compared with what we want field by field, with
//! `nodeAllocatableResources` left out: an API server without the
//! `DRANodeAllocatableResources` feature gate drops that field, and treating
//! the loss as a difference would republish forever.

use crate::slices::{build_slices, field_selector, label_selector, NodeOwner, SliceError};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::Duration;
use tokio::sync::watch;

/// Events arriving within this window after the first are handled by one
/// resync (a slice deleted with its siblings, a burst of edits).
const DEBOUNCE: Duration = Duration::from_millis(300);
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("reading node {node} (the owner of its ResourceSlices): {source}")]
    GetNode { node: String, source: kube::Error },
    #[error("node {node} has no uid; cannot own ResourceSlices")]
    NodeWithoutUid { node: String },
    #[error("listing the ResourceSlices of node {node} ({selector}): {source}")]
    List {
        node: String,
        selector: String,
        source: kube::Error,
    },
    #[error("applying ResourceSlice {slice}: {source}")]
    Apply { slice: String, source: kube::Error },
    #[error("deleting stale ResourceSlice {slice}: {source}")]
    Delete { slice: String, source: kube::Error },
    #[error("building the ResourceSlices of node {node}: {source}")]
    Build { node: String, source: SliceError },
}

/// What one [`Publisher::sync`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishOutcome {
    pub generation: i64,
    /// Slices written (created or changed).
    pub applied: Vec<String>,
    /// Slices that already matched.
    pub unchanged: Vec<String>,
    /// Slices of ours removed because the pool no longer has them.
    pub deleted: Vec<String>,
}

#[derive(Debug, Clone)]
struct Published {
    content: u64,
    generation: i64,
    slices: BTreeMap<String, ResourceSlice>,
}

/// Publisher of one node's pool for one driver.
pub struct Publisher {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    driver: String,
    node: String,
    last: Option<Published>,
}

impl Publisher {
    pub fn new(client: kube::Client, driver: &str, node: &str) -> Publisher {
        Publisher {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            driver: driver.to_string(),
            node: node.to_string(),
            last: None,
        }
    }

    fn list_params(&self) -> ListParams {
        ListParams::default()
            .labels(&label_selector(&self.driver))
            .fields(&field_selector(&self.node))
    }

    /// Makes the server hold exactly the slices for `devices`, writing only
    /// what differs.
    ///
    /// Generation: the same devices keep the generation last published; new
    /// devices get one above both that and anything on the server. On the
    /// first sync of a process the server's slices are the memory: if they
    /// already say what we would, their generation is kept, otherwise the
    /// next one is used.
    pub async fn sync(&mut self, devices: &[Device]) -> Result<PublishOutcome, PublishError> {
        let node = self
            .nodes
            .get(&self.node)
            .await
            .map_err(|source| PublishError::GetNode {
                node: self.node.clone(),
                source,
            })?;
        let uid = node.metadata.uid.filter(|u| !u.is_empty()).ok_or_else(|| {
            PublishError::NodeWithoutUid {
                node: self.node.clone(),
            }
        })?;
        let owner = NodeOwner {
            name: self.node.clone(),
            uid,
        };
        let existing: BTreeMap<String, ResourceSlice> = self
            .slices
            .list(&self.list_params())
            .await
            .map_err(|source| PublishError::List {
                node: self.node.clone(),
                selector: label_selector(&self.driver),
                source,
            })?
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name.clone().map(|n| (n, s)))
            .collect();
        let build = |generation| {
            build_slices(
                &self.driver,
                &self.node,
                Some(&owner),
                devices.to_vec(),
                generation,
            )
            .map_err(|source| PublishError::Build {
                node: self.node.clone(),
                source,
            })
        };
        let content = content_hash(devices);
        let on_server = existing.values().map(|s| s.spec.pool.generation).max();
        let generation = match &self.last {
            Some(last) if last.content == content => last.generation,
            Some(last) => last.generation.max(on_server.unwrap_or(0)) + 1,
            None => match on_server {
                Some(current) if current > 0 => {
                    let same = build(current)?;
                    let all_match = same.len() == existing.len()
                        && same.iter().all(|want| {
                            want.metadata
                                .name
                                .as_ref()
                                .and_then(|n| existing.get(n))
                                .is_some_and(|have| slice_matches(want, have))
                        });
                    if all_match {
                        current
                    } else {
                        current + 1
                    }
                }
                _ => 1,
            },
        };
        let desired = build(generation)?;
        let mut outcome = PublishOutcome {
            generation,
            ..Default::default()
        };
        let params = PatchParams::apply(&self.driver).force();
        for want in &desired {
            let name = want.metadata.name.clone().unwrap_or_default();
            if existing
                .get(&name)
                .is_some_and(|have| slice_matches(want, have))
            {
                outcome.unchanged.push(name);
                continue;
            }
            self.slices
                .patch(&name, &params, &Patch::Apply(want))
                .await
                .map_err(|source| PublishError::Apply {
                    slice: name.clone(),
                    source,
                })?;
            outcome.applied.push(name);
        }
        // New slices first, stale ones after: the scheduler ignores slices of
        // an older generation, so the pool is never seen half-empty.
        let wanted: BTreeMap<String, ResourceSlice> = desired
            .into_iter()
            .filter_map(|s| s.metadata.name.clone().map(|n| (n, s)))
            .collect();
        for name in existing.keys().filter(|n| !wanted.contains_key(*n)) {
            match self.slices.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(PublishError::Delete {
                        slice: name.clone(),
                        source,
                    })
                }
            }
            outcome.deleted.push(name.clone());
        }
        self.last = Some(Published {
            content,
            generation,
            slices: wanted,
        });
        Ok(outcome)
    }

    /// Whether a watch event about `slice` calls for a resync: it is ours
    /// and no longer what we published, or it is one we did not publish.
    fn needs_resync(&self, event: &Event<ResourceSlice>) -> bool {
        let Some(last) = &self.last else {
            return true;
        };
        match event {
            Event::Apply(have) | Event::InitApply(have) => {
                match have.metadata.name.as_ref().and_then(|n| last.slices.get(n)) {
                    Some(want) => !slice_matches(want, have),
                    // Labelled as ours but not in the pool: delete it.
                    None => true,
                }
            }
            Event::Delete(gone) => gone
                .metadata
                .name
                .as_ref()
                .is_some_and(|n| last.slices.contains_key(n)),
            // A restarted watch may have missed deletions: check once.
            Event::InitDone => true,
            Event::Init => false,
        }
    }

    /// Publishes `desired` and keeps it published until `shutdown`
    /// completes: republishes when the devices change, when a slice is
    /// deleted or altered behind our back, and after failures (with
    /// backoff, since the API server may be away for a while).
    pub async fn run(
        mut self,
        mut desired: watch::Receiver<Vec<Device>>,
        shutdown: impl Future<Output = ()>,
    ) {
        let config = watcher::Config::default()
            .labels(&label_selector(&self.driver))
            .fields(&field_selector(&self.node));
        let events = watcher(self.slices.clone(), config).default_backoff();
        tokio::pin!(events);
        tokio::pin!(shutdown);
        let mut devices = desired.borrow_and_update().clone();
        let mut desired_open = true;
        let mut dirty = true;
        let mut retry = RETRY_FIRST;
        // When set, a resync is due at this instant (debounce or retry).
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            if dirty {
                dirty = false;
                match self.sync(&devices).await {
                    Ok(outcome) => {
                        retry = RETRY_FIRST;
                        due = None;
                        if !outcome.applied.is_empty() || !outcome.deleted.is_empty() {
                            tracing::info!(
                                node = %self.node,
                                generation = outcome.generation,
                                applied = ?outcome.applied,
                                deleted = ?outcome.deleted,
                                "published ResourceSlices"
                            );
                        }
                    }
                    Err(err) => {
                        tracing::warn!(node = %self.node, retry_in = ?retry, "publishing ResourceSlices failed: {}", crate::api_client::error_chain(&err));
                        due = Some(tokio::time::Instant::now() + retry);
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
            }
            let sleep_until = due;
            tokio::select! {
                () = &mut shutdown => return,
                changed = desired.changed(), if desired_open => {
                    if changed.is_ok() {
                        devices = desired.borrow_and_update().clone();
                        dirty = true;
                    } else {
                        // Nobody will send new devices: keep the last ones.
                        desired_open = false;
                    }
                }
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        if self.needs_resync(&event) && due.is_none() {
                            due = Some(tokio::time::Instant::now() + DEBOUNCE);
                        }
                    }
                    Some(Err(err)) => {
                        tracing::warn!(node = %self.node, "watching ResourceSlices: {}", crate::api_client::error_chain(&err));
                    }
                    // The watcher never ends by itself; if it does, stop
                    // watching but keep the last publish in place.
                    None => {
                        tracing::warn!(node = %self.node, "ResourceSlice watch ended");
                        (&mut shutdown).await;
                        return;
                    }
                },
                () = sleep_or_never(sleep_until) => {
                    due = None;
                    dirty = true;
                }
            }
        }
    }
}

async fn sleep_or_never(until: Option<tokio::time::Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn content_hash(devices: &[Device]) -> u64 {
    let mut hasher = DefaultHasher::new();
    // Serialising plain data cannot fail; an empty string would only make
    // the next sync compare everything again.
    serde_json::to_string(devices)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Removes `nodeAllocatableResources` from every device of a slice spec.
fn without_node_allocatable(mut spec: Value) -> Value {
    if let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) {
        for device in devices {
            if let Some(d) = device.as_object_mut() {
                d.remove("nodeAllocatableResources");
            }
        }
    }
    spec
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
fn slice_matches(want: &ResourceSlice, have: &ResourceSlice) -> bool {
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
    let spec = |s: &ResourceSlice| {
        serde_json::to_value(&s.spec)
            .map(without_node_allocatable)
            .ok()
    };
    let spec_ok = match (spec(want), spec(have)) {
        (Some(w), Some(h)) => json_contains(&w, &h),
        _ => false,
    };
    labels_ok && owners_ok && spec_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::{devices_for, DeviceMode, DeviceOptions, GroupBy};
    use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
    use shared_state::CpuSet;

    fn devices(mode: DeviceMode) -> Vec<Device> {
        let topology = build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 75,
            threads_per_core: 2,
            sibling_numbering: SiblingNumbering::Split,
        });
        devices_for(
            &topology,
            &DeviceOptions {
                mode,
                group_by: GroupBy::Numanode,
                reserved: CpuSet::new(),
                node_allocatable_mapping: true,
            },
        )
        .unwrap()
    }

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
    fn content_hash_tells_device_sets_apart() {
        let grouped = devices(DeviceMode::Grouped);
        let individual = devices(DeviceMode::Individual);
        assert_eq!(content_hash(&grouped), content_hash(&grouped.clone()));
        assert_ne!(content_hash(&grouped), content_hash(&individual));
    }
}
