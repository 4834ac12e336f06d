//! The kubelet-facing DRA gRPC services: `v1.DRAPlugin`, `v1beta1.DRAPlugin`
//! (same calls, older kubelets) and `v1.DRAResourceHealth`.
//!
//! Kubelet sends only claim namespace, name and UID; the claim itself is read
//! from the API server, unless it is already prepared, in which case the
//! stored answer is returned without the API server (kubelet retries
//! prepares, and a restarted plugin must answer them from its store). Every
//! claim of a request gets an entry in the response, with an error string
//! where it failed.

use crate::claim_status::{
    cleared_status, now_rfc3339, prepared_status, results_of, status_has_entries,
    ClaimStatusWriter, CpuPlaces, RepairOutcome, ResultKey,
};
use crate::driver::{Driver, Prepared};
use crate::prepare::{ClaimRef, PrepareError};
use dra_cpu_daemon::upstream_metrics::OpResult;
use dra_cpu_proto::kubelet::{dra_v1, dra_v1beta1};
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// Why a ResourceClaim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClaimSourceError {
    /// The API server could not be asked, or refused.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Where ResourceClaims are read from.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim, `Ok(None)` if it does not exist, `Err` if the API server
    /// could not be asked.
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, ClaimSourceError>;
}

/// Claims from the API server through kube.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl KubeClaims {
    pub fn new(client: kube::Client) -> KubeClaims {
        KubeClaims { client }
    }
}

#[tonic::async_trait]
impl ClaimSource for KubeClaims {
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, ClaimSourceError> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?)
    }
}

/// The status body of a prepared claim with these results.
fn status_body(
    driver: &Driver,
    claim: &ClaimRef,
    results: &[ResultKey],
    prepared: &Prepared,
    places: &CpuPlaces,
) -> serde_json::Value {
    let catalog = driver.catalog();
    prepared_status(
        claim,
        &driver.options().driver_name,
        results,
        &prepared.assignment,
        |device| catalog.cpus_of(device).cloned(),
        places,
        &now_rfc3339(),
    )
}

/// The DRA service shared by both API versions.
#[derive(Clone)]
pub struct DraService {
    driver: Arc<Driver>,
    claims: Arc<dyn ClaimSource>,
    status: Option<(ClaimStatusWriter, Arc<CpuPlaces>)>,
}

impl DraService {
    pub fn new(driver: Arc<Driver>, claims: Arc<dyn ClaimSource>) -> DraService {
        DraService {
            driver,
            claims,
            status: None,
        }
    }

    /// Also write each claim's device status after prepare and unprepare.
    pub fn with_claim_status(mut self, writer: ClaimStatusWriter, places: CpuPlaces) -> DraService {
        self.status = Some((writer, Arc::new(places)));
        self
    }

    /// Prepare one claim: from the store if it is prepared, else from the
    /// API server object.
    pub async fn prepare_one(&self, claim: ClaimRef) -> Result<Prepared, PrepareError> {
        let span = tracing::info_span!(
            "prepare",
            claim_uid = %claim.uid, namespace = %claim.namespace, claim_name = %claim.name,
            pods = tracing::field::Empty, cpus = tracing::field::Empty
        );
        let started = std::time::Instant::now();
        let result = async {
            // A retry is answered from the store, without the API server; the
            // check may rewrite a lost CDI spec (fsync), so it runs off the
            // async workers like the prepare itself. A first prepare skips
            // that hop: the check is a lookup that cannot block.
            if !self.driver.needs_claim_object(&claim.uid) {
                let driver = self.driver.clone();
                let task_claim = claim.clone();
                let task_span = span.clone();
                let known = tokio::task::spawn_blocking(move || {
                    task_span.in_scope(|| driver.already_prepared(&task_claim))
                })
                .await
                .unwrap_or_else(|e| {
                    Some(Err(PrepareError::Internal {
                        claim: claim.to_string(),
                        reason: format!("prepare task failed: {e}"),
                    }))
                });
                if let Some(answer) = known {
                    if let Ok(prepared) = &answer {
                        self.repair_status(&claim, prepared);
                    }
                    return answer;
                }
            }
            let object = match self.claims.get(&claim.namespace, &claim.name).await {
                Ok(Some(object)) => object,
                Ok(None) => {
                    let e = PrepareError::ClaimNotFound {
                        claim: claim.to_string(),
                    };
                    self.driver.metrics().error("prepare", e.reason());
                    return Err(e);
                }
                Err(error) => {
                    let e = PrepareError::ApiServer {
                        claim: claim.to_string(),
                        reason: crate::api_client::error_chain(&error),
                    };
                    self.driver.metrics().error("prepare", e.reason());
                    return Err(e);
                }
            };
            let results = results_of(&object, &self.driver.options().driver_name);
            // Its own task: a prepare kubelet gives up on still ends, and no
            // thread waits for the group commit.
            let prepared = tokio::spawn(
                self.driver
                    .clone()
                    .prepare_async(claim.clone(), object)
                    .instrument(span.clone()),
            )
            .await
            .unwrap_or_else(|e| {
                Err(PrepareError::Internal {
                    claim: claim.to_string(),
                    reason: format!("prepare task failed: {e}"),
                })
            });
            if let (Ok(prepared), Some((writer, places))) = (&prepared, &self.status) {
                let body = status_body(&self.driver, &claim, &results, prepared, places);
                writer.spawn_apply(&claim, body, "prepare");
            }
            prepared
        }
        .instrument(span.clone())
        .await;
        match &result {
            Ok(prepared) => {
                span.record("cpus", tracing::field::display(&prepared.assignment.cpus));
                span.record(
                    "pods",
                    tracing::field::debug(&prepared.assignment.consumer_pods),
                );
            }
            Err(e) => tracing::warn!(parent: &span, error = %e, "prepare failed"),
        }
        self.driver
            .metrics()
            .upstream
            .record_prepare(OpResult::of(&result), started.elapsed());
        result
    }

    /// A prepare answered from the store makes no status body. If this
    /// process has not seen the claim's prepared status reach the server (the
    /// write was refused or gave up, or the process was restarted or stopped
    /// between the commit and the write), the claim is read in the
    /// background and its status written unless it is there.
    fn repair_status(&self, claim: &ClaimRef, prepared: &Prepared) {
        let Some((writer, places)) = &self.status else {
            return;
        };
        let Some(repair) = writer.begin_repair(&claim.uid) else {
            return;
        };
        let (writer, places) = (writer.clone(), places.clone());
        let (claims, driver) = (self.claims.clone(), self.driver.clone());
        let (claim, prepared) = (claim.clone(), prepared.clone());
        let span = tracing::debug_span!("repair_status", claim_uid = %claim.uid);
        tokio::spawn(
            async move {
                let driver_name = &driver.options().driver_name;
                let outcome = match claims.get(&claim.namespace, &claim.name).await {
                    Ok(Some(object)) if object.metadata.uid.as_deref() == Some(&claim.uid) => {
                        let results = results_of(&object, driver_name);
                        if status_has_entries(&object, driver_name, &results) {
                            RepairOutcome::AlreadyOnServer
                        } else {
                            RepairOutcome::Write(status_body(
                                &driver, &claim, &results, &prepared, &places,
                            ))
                        }
                    }
                    // Gone or replaced: its unprepare follows.
                    Ok(_) => RepairOutcome::Unread,
                    Err(error) => {
                        tracing::debug!(error = %crate::api_client::error_chain(&error),
                            "reading the claim to repair its status failed; tried again at its next prepare");
                        RepairOutcome::Unread
                    }
                };
                // Unprepared while it was read (the clear may be sent
                // already, leaving nothing newer to drop this body).
                let outcome = if driver.needs_claim_object(&claim.uid) {
                    RepairOutcome::Unread
                } else {
                    outcome
                };
                writer.finish_repair(repair, &claim, outcome);
            }
            .instrument(span),
        );
    }

    pub async fn unprepare_one(&self, claim: ClaimRef) -> Result<(), PrepareError> {
        let span = tracing::info_span!("unprepare", claim_uid = %claim.uid, namespace = %claim.namespace, claim_name = %claim.name);
        let started = std::time::Instant::now();
        let result = tokio::spawn(
            self.driver
                .clone()
                .unprepare_async(claim.clone())
                .instrument(span.clone()),
        )
        .await
        .unwrap_or_else(|e| {
            Err(PrepareError::Internal {
                claim: claim.to_string(),
                reason: format!("unprepare task failed: {e}"),
            })
        });
        match (&result, &self.status) {
            (Err(e), _) => tracing::warn!(parent: &span, error = %e, "unprepare failed"),
            (Ok(()), Some((writer, _))) => {
                writer.spawn_apply(&claim, cleared_status(&claim), "unprepare")
            }
            (Ok(()), None) => {}
        }
        self.driver
            .metrics()
            .upstream
            .record_unprepare(OpResult::of(&result), started.elapsed());
        result
    }

    /// Every claim of a request with its outcome, keyed by claim UID.
    pub async fn prepare_all(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Vec<(String, Result<Prepared, PrepareError>)> {
        let mut out = Vec::with_capacity(claims.len());
        for claim in claims {
            let uid = claim.uid.clone();
            out.push((uid, self.prepare_one(claim).await));
        }
        out
    }

    pub async fn unprepare_all(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Vec<(String, Result<(), PrepareError>)> {
        let mut out = Vec::with_capacity(claims.len());
        for claim in claims {
            let uid = claim.uid.clone();
            out.push((uid, self.unprepare_one(claim).await));
        }
        out
    }
}

/// The name kubelet matches a container's `resources.claims[].request`
/// against: a `firstAvailable` subrequest's result names `req/sub`, and
/// kubelet hands the device's CDI ids to a container naming `req` only if
/// `req` itself is listed (`pkg/kubelet/cm/dra/claiminfo.go`; the Go plugin
/// helper cuts at the first `/` the same way).
pub fn request_name(result_request: &str) -> &str {
    result_request
        .split_once('/')
        .map_or(result_request, |(request, _subrequest)| request)
}

/// One entry per device of the claim. The claim has one CDI device; the
/// first device of each request carries its id and the others none, so a
/// container naming one request, or none, receives it once per request
/// rather than once per CPU (kubelet hands a container the ids of every
/// device whose `request_names` match, without removing duplicates:
/// `cdiDevicesAsList` in `pkg/kubelet/cm/dra/claiminfo.go`).
fn devices_of(prepared: &Prepared) -> Vec<KubeletDevice> {
    let mut requests_given_the_id = std::collections::BTreeSet::new();
    prepared
        .assignment
        .devices
        .iter()
        .map(|d| {
            let request = request_name(&d.request);
            let cdi_device_ids = if requests_given_the_id.insert(request) {
                vec![prepared.cdi_device_id.clone()]
            } else {
                Vec::new()
            };
            KubeletDevice {
                request_names: vec![request.to_string()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids,
                share_id: d.share_id.clone(),
            }
        })
        .collect()
}

/// One device of a prepared claim as kubelet is told of it, in either API
/// version's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KubeletDevice {
    request_names: Vec<String>,
    pool_name: String,
    device_name: String,
    cdi_device_ids: Vec<String>,
    /// The allocation's `shareID`; only `v1.Device` has the field.
    share_id: Option<String>,
}

impl From<KubeletDevice> for dra_v1::Device {
    fn from(d: KubeletDevice) -> Self {
        dra_v1::Device {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
        }
    }
}

impl From<KubeletDevice> for dra_v1beta1::Device {
    fn from(d: KubeletDevice) -> Self {
        dra_v1beta1::Device {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
        }
    }
}

/// Stamps out one kubelet `DRAPlugin` service over the generated types of
/// `$api`: the API versions carry the same calls and messages and differ
/// only in their module path (and v1's optional `Device.share_id`, which
/// each version's `From<KubeletDevice>` settles), so one body serves both.
macro_rules! dra_plugin_service {
    ($(#[$meta:meta])* $service:ident, $api:ident) => {
        $(#[$meta])*
        pub struct $service(pub DraService);

        impl $service {
            /// The claims of a prepare or unprepare request.
            fn claim_refs(claims: Vec<$api::Claim>) -> Vec<ClaimRef> {
                claims
                    .into_iter()
                    .map(|claim| ClaimRef {
                        namespace: claim.namespace,
                        name: claim.name,
                        uid: claim.uid,
                    })
                    .collect()
            }
        }

        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for $service {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = Self::claim_refs(request.into_inner().claims);
                let mut response = HashMap::new();
                for (uid, outcome) in self.0.prepare_all(claims).await {
                    let entry = match outcome {
                        Ok(prepared) => $api::NodePrepareResourceResponse {
                            devices: devices_of(&prepared)
                                .into_iter()
                                .map($api::Device::from)
                                .collect(),
                            error: String::new(),
                        },
                        Err(e) => $api::NodePrepareResourceResponse {
                            devices: vec![],
                            error: e.to_string(),
                        },
                    };
                    response.insert(uid, entry);
                }
                Ok(Response::new($api::NodePrepareResourcesResponse {
                    claims: response,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims = Self::claim_refs(request.into_inner().claims);
                let claims = self
                    .0
                    .unprepare_all(claims)
                    .await
                    .into_iter()
                    .map(|(uid, outcome)| {
                        let error = outcome.err().map(|e| e.to_string()).unwrap_or_default();
                        (uid, $api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_plugin_service!(
    /// `v1.DRAPlugin`.
    DraV1, dra_v1
);

dra_plugin_service!(
    /// `v1beta1.DRAPlugin`.
    DraV1beta1, dra_v1beta1
);

#[cfg(test)]
mod tests {
    use super::{devices_of, dra_v1, request_name};
    use crate::driver::Prepared;
    use shared_state::{AllocatedDevice, ClaimAssignment, CpuSet};

    #[test]
    fn request_names_drop_the_subrequest_of_first_available() {
        for (result, want) in [
            ("cpus", "cpus"),
            ("cpus/big", "cpus"),
            ("cpus/big/extra", "cpus"),
            ("", ""),
            ("/sub", ""),
        ] {
            assert_eq!(request_name(result), want, "{result:?}");
        }
    }

    /// Claim `uid` prepared with `devices`, its CDI device
    /// `dra.k8s.io/cpu=claim-uid`.
    fn prepared(devices: Vec<AllocatedDevice>) -> Prepared {
        Prepared {
            assignment: ClaimAssignment {
                claim_uid: "uid".into(),
                namespace: "ns".into(),
                name: "claim".into(),
                consumer_pods: vec![],
                devices,
                cpus: CpuSet::new(),
                prepared_at_unix_ms: 0,
                pod_claim_name: None,
                tuning: Default::default(),
            },
            cdi_device_id: "dra.k8s.io/cpu=claim-uid".into(),
        }
    }

    /// A grouped device's share ID reaches kubelet through v1, the version
    /// that has the field (kubelet's PodResources API reports it).
    #[test]
    fn the_share_id_of_a_grouped_device_is_told_to_a_v1_kubelet() {
        let share = |id: Option<&str>| AllocatedDevice {
            request: "cpus".into(),
            pool: "node-a".into(),
            device: "cpudevnuma000".into(),
            consumed_cpus: Some(2),
            share_id: id.map(str::to_string),
        };
        for id in [Some("4f1e2d3c-0000-4000-8000-000000000001"), None] {
            let devices: Vec<dra_v1::Device> = devices_of(&prepared(vec![share(id)]))
                .into_iter()
                .map(dra_v1::Device::from)
                .collect();
            assert_eq!(devices.len(), 1);
            assert_eq!(devices[0].share_id.as_deref(), id);
            assert_eq!(devices[0].device_name, "cpudevnuma000");
        }
    }

    #[test]
    fn each_request_gets_the_claims_cdi_device_once() {
        let device = |request: &str, device: &str| AllocatedDevice {
            request: request.into(),
            pool: "node-a".into(),
            device: device.into(),
            consumed_cpus: None,
            share_id: None,
        };
        let prepared = prepared(vec![
            device("cpus/big", "cpudev000"),
            device("cpus/big", "cpudev001"),
            device("cpus/big", "cpudev002"),
            device("helper", "cpudev003"),
        ]);
        let id = || vec!["dra.k8s.io/cpu=claim-uid".to_string()];
        let got: Vec<(Vec<String>, String, Vec<String>)> = devices_of(&prepared)
            .into_iter()
            .map(|d| (d.request_names, d.device_name, d.cdi_device_ids))
            .collect();
        assert_eq!(
            got,
            vec![
                (vec!["cpus".to_string()], "cpudev000".to_string(), id()),
                (vec!["cpus".to_string()], "cpudev001".to_string(), vec![]),
                (vec!["cpus".to_string()], "cpudev002".to_string(), vec![]),
                (vec!["helper".to_string()], "cpudev003".to_string(), id()),
            ]
        );
    }
}
