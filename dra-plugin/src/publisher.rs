//! Publishes this node's ResourceSlices and keeps them as built: server-side
//! apply (field manager = driver name, forced), the pool generation bumped
//! when the device set changes, slices of ours that should no longer exist
//! deleted, and a watch that republishes when a slice is deleted or altered
//! behind our back.
//!
//! Before the first publish it learns what the server accepts:
//! - whether a Device declares `nodeAllocatableResources` (KEP-5517, 1.37+),
//!   from the OpenAPI v3 document of `resource.k8s.io/v1`, or `/version`
//!   where that cannot be read. Server-side apply refuses a field its schema
//!   does not declare with an HTTP 500 for the whole slice, so the mapping
//!   goes only to servers that declare it; should an apply still be refused
//!   naming it, the slices are published again without it.
//!   1.36 has an older shape (`nodeAllocatableResourceMappings` with
//!   `capacityKey`/`allocationMultiplier`, alpha, off by default): it is not
//!   published, since nothing shows that the 1.36 kubelet and scheduler act
//!   on it, and a mapping nobody reads only risks a refused apply.
//! - whether the server keeps `allowMultipleAllocations` (the
//!   `DRAConsumableCapacity` gate, off by default on 1.34 and 1.35), from a
//!   dry-run apply of a grouped slice. Without it grouped devices cannot be
//!   shared: the individual devices are published instead when a fallback is
//!   given (`--cpu-device-mode auto`), otherwise nothing, and readiness says
//!   why.
//! - whether a DeviceAttribute declares list values (`strings`, KEP-5491,
//!   1.36+), where the devices carry `resource.kubernetes.io/pcieRoot`
//!   (`--expose-pcie-roots`). Before 1.36 the attribute is left out (an
//!   apply naming `strings` is refused whole), with a log line. 1.36 and
//!   1.37 declare it behind the alpha `DRAListTypeAttributes` gate; with the
//!   gate off the server drops the list and refuses the attribute left
//!   without a value (HTTP 422 naming it), and the slices are published
//!   again without it, with a warning and `dra_cpu_pcie_roots_published 0`.
//!
//! A failed publish is logged with the server's reason, counted in
//! `dra_cpu_slice_publish_failures_total` and makes `/readyz` unready with
//! the reason until a publish succeeds.
//!
//! What is on the server is compared with what we want in the server's
//! normalised form (canonical quantities, empty lists as absent), with
//! `nodeAllocatableResources` left out: an API server without the
//! `DRANodeAllocatableResources` feature gate drops that field, and treating
//! the loss as a difference would republish forever.

use crate::metrics::Metrics;
use crate::slices::{
    build_slices, field_selector, has_pcie_roots, label_selector, without_pcie_roots, NodeOwner,
    SliceError, ATTR_PCIE_ROOT,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The OpenAPI v3 document that declares the ResourceSlice fields.
pub const OPENAPI_RESOURCE_V1: &str = "/openapi/v3/apis/resource.k8s.io/v1";
const DEVICE_SCHEMA: &str = "io.k8s.api.resource.v1.Device";
const ATTRIBUTE_SCHEMA: &str = "io.k8s.api.resource.v1.DeviceAttribute";
/// The list value a pcieRoot attribute is published in.
const LIST_FIELD: &str = "strings";
/// The first release whose DeviceAttribute declares [`LIST_FIELD`].
const LIST_MINOR: u32 = 36;
/// The KEP-5517 mapping field in its 1.37 shape.
pub const MAPPING_FIELD: &str = "nodeAllocatableResources";
/// The first release whose Device declares [`MAPPING_FIELD`] (kubernetes
/// #140009 renamed 1.36's `nodeAllocatableResourceMappings`).
const MAPPING_MINOR: u32 = 37;

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
    #[error("learning which ResourceSlice fields the API server declares (GET {OPENAPI_RESOURCE_V1}: {openapi}; GET /version: {source})")]
    Discover {
        openapi: String,
        source: kube::Error,
    },
    #[error("dry-run apply of ResourceSlice {slice} (to learn whether the server keeps allowMultipleAllocations): {source}")]
    Probe { slice: String, source: kube::Error },
}

impl PublishError {
    /// The step that failed, as the failure metric labels it.
    pub fn stage(&self) -> &'static str {
        match self {
            PublishError::GetNode { .. } | PublishError::NodeWithoutUid { .. } => "get_node",
            PublishError::List { .. } => "list",
            PublishError::Apply { .. } => "apply",
            PublishError::Delete { .. } => "delete",
            PublishError::Build { .. } => "build",
            PublishError::Discover { .. } => "discover",
            PublishError::Probe { .. } => "probe",
        }
    }

    /// The HTTP status the server answered with, 0 if it did not answer.
    pub fn code(&self) -> u16 {
        match self {
            PublishError::GetNode { source, .. }
            | PublishError::List { source, .. }
            | PublishError::Apply { source, .. }
            | PublishError::Delete { source, .. }
            | PublishError::Discover { source, .. }
            | PublishError::Probe { source, .. } => match source {
                kube::Error::Api(status) => status.code,
                _ => 0,
            },
            PublishError::NodeWithoutUid { .. } | PublishError::Build { .. } => 0,
        }
    }

    fn kube_source(&self) -> Option<&kube::Error> {
        match self {
            PublishError::Apply { source, .. } | PublishError::Probe { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whether `error` is the server refusing an apply because its schema does
/// not declare the mapping field (structured-merge-diff's
/// `.spec.devices[N].nodeAllocatableResources: field not declared in schema`).
pub fn is_undeclared_mapping(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            status.code == 500
                && status
                    .message
                    .contains(&format!(".{MAPPING_FIELD}: field not declared in schema"))
        }
        _ => false,
    }
}

/// The field names of `io.k8s.api.resource.v1.Device` in an OpenAPI v3
/// document, or `None` if the document does not describe it.
pub fn declared_device_fields(openapi: &Value) -> Option<BTreeSet<String>> {
    declared_fields(openapi, DEVICE_SCHEMA)
}

/// The field names of `io.k8s.api.resource.v1.DeviceAttribute`.
pub fn declared_attribute_fields(openapi: &Value) -> Option<BTreeSet<String>> {
    declared_fields(openapi, ATTRIBUTE_SCHEMA)
}

fn declared_fields(openapi: &Value, schema: &str) -> Option<BTreeSet<String>> {
    let properties = openapi
        .pointer(&format!("/components/schemas/{schema}/properties"))?
        .as_object()?;
    Some(properties.keys().cloned().collect())
}

/// Whether `error` is the server refusing the pcieRoot attribute: a
/// validation error naming it (422; a 1.36/1.37 server without the
/// `DRAListTypeAttributes` gate drops the list and then finds the attribute
/// without a value), or a schema without list values (500, `.strings: field
/// not declared in schema`).
pub fn is_refused_pcie_roots(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            (status.code == 422 && status.message.contains(ATTR_PCIE_ROOT))
                || (status.code == 500
                    && status
                        .message
                        .contains(&format!(".{LIST_FIELD}: field not declared in schema")))
        }
        _ => false,
    }
}

/// The minor release of a `/version` answer (`"37"`, `"37+"` on some
/// distributions), if readable.
pub fn minor_release(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<u32> {
    if info.major.trim_end_matches('+') != "1" {
        return None;
    }
    let digits: String = info
        .minor
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Whether the server keeps `allowMultipleAllocations` on the devices of
/// `sent`, judged from what it answered (`returned`).
pub fn keeps_multiple_allocations(sent: &ResourceSlice, returned: &ResourceSlice) -> bool {
    let returned: BTreeMap<&str, &Device> = returned
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| (d.name.as_str(), d))
        .collect();
    sent.spec
        .devices
        .iter()
        .flatten()
        .filter(|d| d.allow_multiple_allocations == Some(true))
        .all(|d| {
            returned
                .get(d.name.as_str())
                .is_some_and(|r| r.allow_multiple_allocations == Some(true))
        })
}

/// The devices without the KEP-5517 mapping.
pub fn without_mapping(devices: &[Device]) -> Vec<Device> {
    devices
        .iter()
        .cloned()
        .map(|mut d| {
            d.node_allocatable_resources = None;
            d
        })
        .collect()
}

fn shares_devices(devices: &[Device]) -> bool {
    devices
        .iter()
        .any(|d| d.allow_multiple_allocations == Some(true))
}

/// What to publish, given the answers of the server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DesiredDevices {
    /// What to publish where the server keeps everything.
    pub devices: Vec<Device>,
    /// What to publish instead of shareable `devices` on a server that drops
    /// `allowMultipleAllocations` (`--cpu-device-mode auto`: the individual
    /// devices). `None` refuses: nothing is published and readiness says why.
    pub without_consumable_capacity: Option<Vec<Device>>,
}

impl From<Vec<Device>> for DesiredDevices {
    fn from(devices: Vec<Device>) -> Self {
        DesiredDevices {
            devices,
            without_consumable_capacity: None,
        }
    }
}

/// Why the node is not ready as far as publishing goes, shared with
/// `/readyz`.
#[derive(Debug, Default)]
pub struct PublishStatus {
    state: Mutex<StatusState>,
}

#[derive(Debug, Default, Clone)]
struct StatusState {
    /// The last publish failed, with this reason.
    failure: Option<String>,
    /// The configured devices cannot work on this server, for this reason.
    refusal: Option<String>,
}

impl PublishStatus {
    fn state(&self) -> std::sync::MutexGuard<'_, StatusState> {
        // Plain strings behind the lock: still fine after a panic elsewhere.
        shared_state::sync::lock(&self.state)
    }

    /// `Some(reason)` while publishing keeps the node from being ready.
    pub fn unready_reason(&self) -> Option<String> {
        let state = self.state();
        match (&state.refusal, &state.failure) {
            (None, None) => None,
            (Some(r), None) | (None, Some(r)) => Some(r.clone()),
            (Some(refusal), Some(failure)) => Some(format!("{refusal}; {failure}")),
        }
    }

    pub fn set_failure(&self, failure: Option<String>) {
        self.state().failure = failure;
    }

    pub fn set_refusal(&self, refusal: Option<String>) {
        self.state().refusal = refusal;
    }
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
    client: kube::Client,
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    driver: String,
    node: String,
    last: Option<Published>,
    /// Whether the server takes the mapping; `None` until learned.
    mapping: Option<bool>,
    /// Whether the server keeps `allowMultipleAllocations`; `None` until a
    /// dry-run apply told.
    consumable_capacity: Option<bool>,
    /// Whether the server takes list-typed attributes (pcieRoot); `None`
    /// until learned.
    list_attributes: Option<bool>,
    status: Arc<PublishStatus>,
    metrics: Arc<Metrics>,
}

impl Publisher {
    pub fn new(client: kube::Client, driver: &str, node: &str) -> Publisher {
        Publisher {
            slices: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            client,
            driver: driver.to_string(),
            node: node.to_string(),
            last: None,
            mapping: None,
            consumable_capacity: None,
            list_attributes: None,
            status: Arc::new(PublishStatus::default()),
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// Reports readiness through `status` and counts in `metrics`.
    pub fn with_reporting(mut self, status: Arc<PublishStatus>, metrics: Arc<Metrics>) -> Self {
        self.status = status;
        self.metrics = metrics;
        self
    }

    pub fn status(&self) -> Arc<PublishStatus> {
        self.status.clone()
    }

    /// Whether the server takes the mapping, once learned.
    pub fn mapping_supported(&self) -> Option<bool> {
        self.mapping
    }

    /// Whether the server takes list-typed attributes, once learned.
    pub fn list_attributes_supported(&self) -> Option<bool> {
        self.list_attributes
    }

    /// Whether this server's DeviceAttribute declares list values: from the
    /// OpenAPI v3 document, else from `/version`.
    async fn learn_list_attribute_support(&self) -> Result<bool, PublishError> {
        self.learn_field_support(ATTRIBUTE_SCHEMA, LIST_FIELD, LIST_MINOR, "list attributes")
            .await
    }

    /// Whether the server keeps `allowMultipleAllocations`, once learned.
    pub fn consumable_capacity(&self) -> Option<bool> {
        self.consumable_capacity
    }

    /// Whether this server's Device declares the mapping field: from the
    /// OpenAPI v3 document, else from `/version`.
    async fn learn_mapping_support(&self) -> Result<bool, PublishError> {
        self.learn_field_support(DEVICE_SCHEMA, MAPPING_FIELD, MAPPING_MINOR, "the mapping")
            .await
    }

    /// Whether `schema` of this server declares `field`: from the OpenAPI v3
    /// document (exactly what the server takes), else from `/version`
    /// (`field` came with release 1.`minor`).
    async fn learn_field_support(
        &self,
        schema: &str,
        field: &str,
        minor: u32,
        what: &str,
    ) -> Result<bool, PublishError> {
        let openapi = match http::Request::get(OPENAPI_RESOURCE_V1).body(Vec::new()) {
            Ok(request) => match self.client.request::<Value>(request).await {
                Ok(document) => match declared_fields(&document, schema) {
                    Some(fields) => return Ok(fields.contains(field)),
                    None => format!("no {schema} schema in the document"),
                },
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        let info =
            self.client
                .apiserver_version()
                .await
                .map_err(|source| PublishError::Discover {
                    openapi: openapi.clone(),
                    source,
                })?;
        tracing::info!(node = %self.node, "the OpenAPI document was not readable ({openapi}); judging {what} by /version {}.{}", info.major, info.minor);
        Ok(minor_release(&info).is_some_and(|release| release >= minor))
    }

    /// Whether the server keeps `allowMultipleAllocations`: a dry-run apply
    /// of the first slice with a shareable device, compared with the answer.
    async fn probe_consumable_capacity(
        &self,
        owner: &NodeOwner,
        devices: &[Device],
    ) -> Result<bool, PublishError> {
        let slices = build_slices(&self.driver, &self.node, Some(owner), devices.to_vec(), 1)
            .map_err(|source| PublishError::Build {
                node: self.node.clone(),
                source,
            })?;
        let Some(sent) = slices
            .into_iter()
            .find(|s| shares_devices(s.spec.devices.as_deref().unwrap_or_default()))
        else {
            return Ok(true);
        };
        let name = sent.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply(&self.driver).force().dry_run();
        let returned = self
            .slices
            .patch(&name, &params, &Patch::Apply(&sent))
            .await
            .map_err(|source| PublishError::Probe {
                slice: name.clone(),
                source,
            })?;
        Ok(keeps_multiple_allocations(&sent, &returned))
    }

    /// [`Self::sync_desired`] for devices without a fallback.
    pub async fn sync(&mut self, devices: &[Device]) -> Result<PublishOutcome, PublishError> {
        self.sync_desired(&DesiredDevices::from(devices.to_vec()))
            .await
    }

    /// Makes the server hold exactly the slices for `desired`, in the form
    /// the server accepts (see the module docs), writing only what differs.
    pub async fn sync_desired(
        &mut self,
        desired: &DesiredDevices,
    ) -> Result<PublishOutcome, PublishError> {
        loop {
            match self.sync_once(desired).await {
                Err(err)
                    if self.mapping == Some(true)
                        && err.kube_source().is_some_and(is_undeclared_mapping) =>
                {
                    // Bounded: the mapping is off from now on, so this arm
                    // cannot match again.
                    self.mapping = Some(false);
                    tracing::warn!(node = %self.node, "the API server refused the {MAPPING_FIELD} mapping ({err}); publishing without it");
                }
                Err(err)
                    if self.list_attributes == Some(true)
                        && err.kube_source().is_some_and(is_refused_pcie_roots) =>
                {
                    // Bounded as above.
                    self.list_attributes = Some(false);
                    tracing::warn!(node = %self.node, "the API server refused {ATTR_PCIE_ROOT} ({err}); is the DRAListTypeAttributes feature gate off? Publishing without it (--expose-pcie-roots has no effect on this cluster)");
                }
                other => return other,
            }
        }
    }

    fn list_params(&self) -> ListParams {
        ListParams::default()
            .labels(&label_selector(&self.driver))
            .fields(&field_selector(&self.node))
    }

    /// The devices to publish on this server, with the readiness and
    /// metrics that go with the choice.
    async fn effective_devices(
        &mut self,
        desired: &DesiredDevices,
        owner: &NodeOwner,
    ) -> Result<Vec<Device>, PublishError> {
        let wants_mapping = desired
            .devices
            .iter()
            .chain(desired.without_consumable_capacity.iter().flatten())
            .any(|d| d.node_allocatable_resources.is_some());
        if wants_mapping && self.mapping.is_none() {
            let supported = self.learn_mapping_support().await?;
            if !supported {
                tracing::info!(node = %self.node, "the API server does not declare Device.{MAPPING_FIELD} (Kubernetes before 1.37): publishing without the node-allocatable mapping");
            }
            self.mapping = Some(supported);
        }
        let wants_lists = has_pcie_roots(&desired.devices)
            || has_pcie_roots(
                desired
                    .without_consumable_capacity
                    .as_deref()
                    .unwrap_or_default(),
            );
        if wants_lists && self.list_attributes.is_none() {
            let supported = self.learn_list_attribute_support().await?;
            if !supported {
                tracing::info!(node = %self.node, "the API server does not declare list-typed attributes (Kubernetes before 1.36): publishing without {ATTR_PCIE_ROOT}");
            }
            self.list_attributes = Some(supported);
        }
        let fit = |devices: &[Device]| {
            let devices = if self.mapping == Some(true) {
                devices.to_vec()
            } else {
                without_mapping(devices)
            };
            if self.list_attributes == Some(false) {
                without_pcie_roots(&devices)
            } else {
                devices
            }
        };
        let base = fit(&desired.devices);
        if !shares_devices(&base) {
            self.status.set_refusal(None);
            return Ok(base);
        }
        if self.consumable_capacity.is_none() {
            let kept = self.probe_consumable_capacity(owner, &base).await?;
            self.metrics
                .grouped_mode_unsupported
                .store(u64::from(!kept), Ordering::Relaxed);
            if !kept {
                match desired.without_consumable_capacity {
                    Some(_) => {
                        tracing::warn!(node = %self.node, "the API server drops allowMultipleAllocations (DRAConsumableCapacity off): grouped devices cannot be shared there, publishing one device per CPU instead (--cpu-device-mode auto)")
                    }
                    None => tracing::error!(node = %self.node, "{}", grouped_refusal()),
                }
            }
            self.consumable_capacity = Some(kept);
        }
        if self.consumable_capacity == Some(true) {
            self.status.set_refusal(None);
            return Ok(base);
        }
        Ok(match &desired.without_consumable_capacity {
            Some(fallback) => {
                self.status.set_refusal(None);
                fit(fallback)
            }
            None => {
                self.status.set_refusal(Some(grouped_refusal()));
                Vec::new()
            }
        })
    }

    /// One publish with what is known of the server.
    ///
    /// Generation: the same devices keep the generation last published; new
    /// devices get one above both that and anything on the server. On the
    /// first sync of a process the server's slices are the memory: if they
    /// already say what we would, their generation is kept, otherwise the
    /// next one is used.
    async fn sync_once(
        &mut self,
        desired: &DesiredDevices,
    ) -> Result<PublishOutcome, PublishError> {
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
        let devices = self.effective_devices(desired, &owner).await?;
        let devices = devices.as_slice();
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
        let wanted: BTreeMap<String, ResourceSlice> = desired
            .iter()
            .filter_map(|s| s.metadata.name.clone().map(|n| (n, s.clone())))
            .collect();
        // Remembered before writing: a retry after a failed apply or delete
        // finishes this generation instead of starting another.
        self.last = Some(Published {
            content,
            generation,
            slices: wanted.clone(),
        });
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
        self.metrics.node_allocatable_mapping_published.store(
            u64::from(
                devices
                    .iter()
                    .any(|d| d.node_allocatable_resources.is_some()),
            ),
            Ordering::Relaxed,
        );
        self.metrics
            .pcie_roots_published
            .store(u64::from(has_pcie_roots(devices)), Ordering::Relaxed);
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
        mut desired: watch::Receiver<DesiredDevices>,
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
                match self.sync_desired(&devices).await {
                    Ok(outcome) => {
                        self.status.set_failure(None);
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
                        self.metrics.publish_failure(err.stage(), err.code());
                        self.status
                            .set_failure(Some(format!("publishing ResourceSlices failed: {err}")));
                        tracing::warn!(node = %self.node, retry_in = ?retry, stage = err.stage(), code = err.code(), "publishing ResourceSlices failed: {}", crate::api_client::error_chain(&err));
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

fn grouped_refusal() -> String {
    "--cpu-device-mode grouped needs the API server to keep allowMultipleAllocations (feature gate DRAConsumableCapacity, off by default before Kubernetes 1.36), and this one drops it: no devices are published; enable the gate (then restart dra-plugin) or use --cpu-device-mode auto or individual".to_string()
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
    use crate::slices::{devices_for, DeviceMode, DeviceOptions, GroupBy};
    use serde_json::json;
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
    fn openapi_and_version_answers_are_read() {
        let doc = json!({"components": {"schemas": {DEVICE_SCHEMA: {"properties":
            {"name": {}, "nodeAllocatableResources": {}}}}}});
        let fields = declared_device_fields(&doc).unwrap();
        assert!(fields.contains(MAPPING_FIELD) && fields.contains("name"));
        assert_eq!(declared_device_fields(&json!({"components": {}})), None);
        let info = |major: &str, minor: &str| k8s_openapi::apimachinery::pkg::version::Info {
            major: major.to_string(),
            minor: minor.to_string(),
            ..Default::default()
        };
        for (major, minor, want) in [
            ("1", "37", Some(37)),
            ("1", "36+", Some(36)),
            ("1", "", None),
            ("2", "1", None),
        ] {
            assert_eq!(minor_release(&info(major, minor)), want, "{major}.{minor}");
        }
    }

    #[test]
    fn refusals_of_the_pcie_root_list_are_recognised() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.to_string(),
                ..Default::default()
            }))
        };
        let cases = [
            // 1.36/1.37 without DRAListTypeAttributes: the list dropped,
            // the attribute left without a value.
            (422, r#"ResourceSlice.resource.k8s.io "n-dra.cpu-0" is invalid: spec.devices[0].attributes[resource.kubernetes.io/pcieRoot]: Invalid value: "": exactly one value must be specified"#, true),
            // A schema without list values.
            (500, "failed to create typed patch object (/n-dra.cpu-0; resource.k8s.io/v1, Kind=ResourceSlice): .spec.devices[0].attributes.resource.kubernetes.io/pcieRoot.strings: field not declared in schema", true),
            (422, r#"ResourceSlice.resource.k8s.io "n-dra.cpu-0" is invalid: spec.devices[0].name: Invalid value"#, false),
            (500, "failed to create typed patch object (...): .spec.devices[0].nodeAllocatableResources: field not declared in schema", false),
            (409, "resource.kubernetes.io/pcieRoot", false),
        ];
        for (code, message, want) in cases {
            assert_eq!(
                is_refused_pcie_roots(&status(code, message)),
                want,
                "{code} {message}"
            );
        }
        let doc = json!({"components": {"schemas": {ATTRIBUTE_SCHEMA: {"properties":
            {"string": {}, "strings": {}}}}}});
        assert!(declared_attribute_fields(&doc)
            .unwrap()
            .contains(LIST_FIELD));
        let old = json!({"components": {"schemas": {ATTRIBUTE_SCHEMA: {"properties":
            {"string": {}, "int": {}}}}}});
        assert!(!declared_attribute_fields(&old)
            .unwrap()
            .contains(LIST_FIELD));
    }

    #[test]
    fn refusals_and_dropped_sharing_are_recognised() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.to_string(),
                ..Default::default()
            }))
        };
        let refused = "failed to create typed patch object (/n-dra.cpu-0; resource.k8s.io/v1, Kind=ResourceSlice): .spec.devices[0].nodeAllocatableResources: field not declared in schema";
        assert!(is_undeclared_mapping(&status(500, refused)));
        assert!(!is_undeclared_mapping(&status(422, refused)));
        assert!(!is_undeclared_mapping(&status(
            500,
            "failed to create typed patch object (...): .spec.devices[0].other: field not declared in schema"
        )));
        let sent = build_slices("dra.cpu", "n", None, devices(DeviceMode::Grouped), 1)
            .unwrap()
            .remove(0);
        assert!(keeps_multiple_allocations(&sent, &sent));
        let mut stripped = sent.clone();
        for d in stripped.spec.devices.iter_mut().flatten() {
            d.allow_multiple_allocations = None;
        }
        assert!(!keeps_multiple_allocations(&sent, &stripped));
    }

    #[test]
    fn readiness_reasons_combine_and_clear() {
        let status = PublishStatus::default();
        assert_eq!(status.unready_reason(), None);
        status.set_failure(Some("f".into()));
        assert_eq!(status.unready_reason().as_deref(), Some("f"));
        status.set_refusal(Some("r".into()));
        assert_eq!(status.unready_reason().as_deref(), Some("r; f"));
        status.set_failure(None);
        status.set_refusal(None);
        assert_eq!(status.unready_reason(), None);
    }

    #[test]
    fn content_hash_tells_device_sets_apart() {
        let grouped = devices(DeviceMode::Grouped);
        let individual = devices(DeviceMode::Individual);
        assert_eq!(content_hash(&grouped), content_hash(&grouped.clone()));
        assert_ne!(content_hash(&grouped), content_hash(&individual));
    }
}
