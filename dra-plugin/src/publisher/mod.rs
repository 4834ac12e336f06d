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

mod comparison;
pub mod server_support;
pub mod status;

use status::PublishStatus;

use crate::metrics::Metrics;
use crate::slice_error::SliceError;
use crate::slices::device_attributes::{has_pcie_roots, without_pcie_roots};
use crate::slices::{build_slices, field_selector, label_selector, NodeOwner, ATTR_PCIE_ROOT};
use comparison::{content_hash, slice_matches};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use server_support::{
    is_refused_pcie_roots, is_undeclared_mapping, shares_devices, without_mapping, MAPPING_FIELD,
    OPENAPI_RESOURCE_V1,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
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

/// What to publish, given the answers of the server.
#[derive(Debug, Clone, Default)]
pub struct DesiredDevices {
    /// What to publish where the server keeps everything.
    pub devices: Vec<Device>,
    /// What to publish instead of shareable `devices` on a server that drops
    /// `allowMultipleAllocations` (`--cpu-device-mode auto`: the individual
    /// devices). `None` refuses: nothing is published and readiness says why.
    pub without_consumable_capacity: Option<Arc<FallbackDevices>>,
}

/// The devices of a server without consumable capacity could not be
/// built; readiness says why.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct FallbackBuildError(#[from] pub anyhow::Error);

/// Builds the fallback devices.
type BuildDevices = dyn Fn() -> Result<Vec<Device>, FallbackBuildError> + Send + Sync;

/// The devices published on a server that drops `allowMultipleAllocations`,
/// built the first time they are asked for: a server that keeps the field
/// (1.36 and later by default) never needs them, and on a 1024-CPU node the
/// individual devices hold about 4 MiB.
pub struct FallbackDevices {
    built: OnceLock<Result<Vec<Device>, FallbackBuildError>>,
    build: Box<BuildDevices>,
}

impl FallbackDevices {
    /// Devices `build` makes when first asked for.
    pub fn lazy(
        build: impl Fn() -> Result<Vec<Device>, FallbackBuildError> + Send + Sync + 'static,
    ) -> FallbackDevices {
        FallbackDevices {
            built: OnceLock::new(),
            build: Box::new(build),
        }
    }

    /// The devices, built now if they were not yet.
    pub fn get(&self) -> Result<&[Device], &FallbackBuildError> {
        match self.built.get_or_init(|| (self.build)()) {
            Ok(devices) => Ok(devices),
            Err(reason) => Err(reason),
        }
    }

    /// The devices if something asked for them before.
    pub fn if_built(&self) -> Option<&[Device]> {
        self.built.get()?.as_deref().ok()
    }
}

impl std::fmt::Debug for FallbackDevices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.built.get() {
            None => f.write_str("FallbackDevices(not built)"),
            Some(Ok(devices)) => write!(f, "FallbackDevices({} devices)", devices.len()),
            Some(Err(reason)) => write!(f, "FallbackDevices(failed: {reason})"),
        }
    }
}

impl From<Vec<Device>> for DesiredDevices {
    fn from(devices: Vec<Device>) -> Self {
        DesiredDevices {
            devices,
            without_consumable_capacity: None,
        }
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

    /// Whether the server keeps `allowMultipleAllocations`, once learned.
    pub fn consumable_capacity(&self) -> Option<bool> {
        self.consumable_capacity
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
        self.learn_support_for(&desired.devices).await?;
        let base = self.fit(&desired.devices);
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
        let fallback = desired
            .without_consumable_capacity
            .as_deref()
            .map(FallbackDevices::get);
        Ok(match fallback {
            Some(Ok(fallback)) => {
                self.learn_support_for(fallback).await?;
                self.status.set_refusal(None);
                self.fit(fallback)
            }
            Some(Err(reason)) => {
                tracing::error!(node = %self.node, "cannot build the devices to publish without allowMultipleAllocations: {reason}");
                self.status.set_refusal(Some(format!(
                    "cannot build the devices to publish without allowMultipleAllocations: {reason}"
                )));
                Vec::new()
            }
            None => {
                self.status.set_refusal(Some(grouped_refusal()));
                Vec::new()
            }
        })
    }

    /// Asks the server, once, whether it declares what `devices` use: the
    /// node-allocatable mapping and list-typed attributes.
    async fn learn_support_for(&mut self, devices: &[Device]) -> Result<(), PublishError> {
        let wants_mapping = devices
            .iter()
            .any(|d| d.node_allocatable_resources.is_some());
        if wants_mapping && self.mapping.is_none() {
            let supported = self.learn_mapping_support().await?;
            if !supported {
                tracing::info!(node = %self.node, "the API server does not declare Device.{MAPPING_FIELD} (Kubernetes before 1.37): publishing without the node-allocatable mapping");
            }
            self.mapping = Some(supported);
        }
        if has_pcie_roots(devices) && self.list_attributes.is_none() {
            let supported = self.learn_list_attribute_support().await?;
            if !supported {
                tracing::info!(node = %self.node, "the API server does not declare list-typed attributes (Kubernetes before 1.36): publishing without {ATTR_PCIE_ROOT}");
            }
            self.list_attributes = Some(supported);
        }
        Ok(())
    }

    /// `devices` without what the server was found not to declare.
    fn fit(&self, devices: &[Device]) -> Vec<Device> {
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
    ///
    /// The devices are shared with the sender, not copied: on a 1024-CPU
    /// node one copy of them (the individual devices of `--cpu-device-mode
    /// auto`) is about 4 MiB.
    pub async fn run(
        mut self,
        mut desired: watch::Receiver<Arc<DesiredDevices>>,
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::devices::{DeviceMode, GroupBy};
    use crate::slices::devices_for;
    use crate::slices::tests::{machine_300, options};

    /// The devices of a 300-CPU node in `mode`.
    pub(crate) fn devices(mode: DeviceMode) -> Vec<Device> {
        devices_for(&machine_300(), &options(mode, GroupBy::Numanode, "")).unwrap()
    }
}
