//! The claim's device status (KEP-4817 `status.devices[]`): after a
//! prepare, each result of this driver says which CPUs it got, on which
//! NUMA nodes and sockets, with a `Ready` condition; at unprepare the
//! entries go. `kubectl get resourceclaim NAME -o yaml` then answers an
//! operator's first question without a shell on the node.
//!
//! Written by server-side apply on the `status` subresource under this
//! driver's field manager, so an apply of an empty list removes exactly the
//! entries this driver wrote. The write runs after the prepare has answered
//! kubelet and never fails it: an API server without the field (or any
//! failed write) is logged (at warn the first time) and counted.

use crate::prepare::ClaimRef;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{json, Value};
use shared_state::topology::Topology;
use shared_state::{ClaimAssignment, CpuSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Why a status apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimStatusError {
    /// The API server could not be asked, or refused.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Where status applies go.
#[tonic::async_trait]
pub trait ClaimStatusSink: Send + Sync + 'static {
    /// Server-side apply `body` to the claim's status as `field_manager`.
    /// `Ok(false)`: the claim no longer exists.
    async fn apply_status(
        &self,
        namespace: &str,
        name: &str,
        field_manager: &str,
        body: Value,
    ) -> Result<bool, ClaimStatusError>;
}

/// The API server through kube.
#[derive(Clone)]
pub struct KubeClaimStatus {
    client: kube::Client,
}

impl KubeClaimStatus {
    pub fn new(client: kube::Client) -> KubeClaimStatus {
        KubeClaimStatus { client }
    }
}

#[tonic::async_trait]
impl ClaimStatusSink for KubeClaimStatus {
    async fn apply_status(
        &self,
        namespace: &str,
        name: &str,
        field_manager: &str,
        body: Value,
    ) -> Result<bool, ClaimStatusError> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        let params = kube::api::PatchParams::apply(field_manager).force();
        match api
            .patch_status(name, &params, &kube::api::Patch::Apply(body))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Where each CPU sits, for the `data` of an entry.
#[derive(Debug, Clone, Default)]
pub struct CpuPlaces {
    numa: BTreeMap<u32, u32>,
    socket: BTreeMap<u32, u32>,
}

impl CpuPlaces {
    pub fn of(topology: &Topology) -> CpuPlaces {
        let mut places = CpuPlaces::default();
        for id in topology.online().iter() {
            if let Some(info) = topology.cpu(id) {
                places.numa.insert(id, info.numa);
                places.socket.insert(id, info.socket);
            }
        }
        places
    }
}

/// One allocation result of this driver, as the claim's status names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultKey {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
}

/// The results of `driver` in the claim's allocation.
pub fn results_of(object: &ResourceClaim, driver: &str) -> Vec<ResultKey> {
    object
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .map(|results| {
            results
                .iter()
                .filter(|r| r.driver == driver)
                .map(|r| ResultKey {
                    request: r.request.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    share_id: r.share_id.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The apply body that sets one entry per result: the claim's CPUs inside
/// that device (`cpus_of_device`), their NUMA nodes and sockets, and a
/// `Ready` condition. `metadata.uid` makes the server refuse the write if
/// the claim was replaced meanwhile.
pub fn prepared_status(
    claim: &ClaimRef,
    driver: &str,
    results: &[ResultKey],
    assignment: &ClaimAssignment,
    cpus_of_device: impl Fn(&str) -> Option<CpuSet>,
    places: &CpuPlaces,
    now_rfc3339: &str,
) -> Value {
    let devices: Vec<Value> = results
        .iter()
        .map(|result| {
            let cpus = cpus_of_device(&result.device)
                .map(|group| group.intersection(&assignment.cpus))
                .unwrap_or_default();
            let numa: BTreeSet<u32> = cpus.iter().filter_map(|c| places.numa.get(&c).copied()).collect();
            let sockets: BTreeSet<u32> = cpus.iter().filter_map(|c| places.socket.get(&c).copied()).collect();
            let mut entry = json!({
                "driver": driver,
                "pool": result.pool,
                "device": result.device,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": format!("CPUs {} pinned through DRA_CPUSET_{}", assignment.cpus, claim.uid),
                    "lastTransitionTime": now_rfc3339,
                }],
                "data": {
                    "request": result.request,
                    "cpus": cpus.to_cpulist(),
                    "cpuCount": cpus.len(),
                    "numaNodes": numa,
                    "sockets": sockets,
                    "claimCpus": assignment.cpus.to_cpulist(),
                },
            });
            if let (Some(id), Some(map)) = (&result.share_id, entry.as_object_mut()) {
                map.insert("shareID".into(), json!(id));
            }
            entry
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": devices},
    })
}

/// Now, as the API server writes times (seconds, UTC).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// The apply body that drops every entry this field manager wrote.
pub fn cleared_status(claim: &ClaimRef) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": []},
    })
}

/// Counts and the warn-once latch of status writes.
#[derive(Debug, Default)]
pub struct StatusWriteStats {
    pub written: AtomicU64,
    pub failed: AtomicU64,
    warned: AtomicBool,
}

/// Status writes waiting for the writer's one background task: the newest
/// body per claim (an older one is never worth sending once a newer exists).
#[derive(Default)]
struct PendingWrites {
    bodies: std::sync::Mutex<BTreeMap<String, (ClaimRef, Value, &'static str)>>,
    wake: tokio::sync::Notify,
    worker_started: AtomicBool,
}

/// Writes claim statuses in the background, one at a time. A burst of
/// prepares would otherwise put one API request per claim in flight at
/// once, competing for the node's CPUs with the prepares themselves; a
/// queue that keeps only the newest body per claim sends each claim's final
/// state once the burst has passed, and never more requests at once than
/// one.
#[derive(Clone)]
pub struct ClaimStatusWriter {
    sink: Arc<dyn ClaimStatusSink>,
    field_manager: String,
    pub stats: Arc<StatusWriteStats>,
    pending: Arc<PendingWrites>,
}

impl ClaimStatusWriter {
    pub fn new(
        sink: Arc<dyn ClaimStatusSink>,
        field_manager: &str,
        stats: Arc<StatusWriteStats>,
    ) -> Self {
        ClaimStatusWriter {
            sink,
            field_manager: field_manager.to_string(),
            stats,
            pending: Arc::new(PendingWrites::default()),
        }
    }

    /// Queue `body` for the claim's status without making anyone wait; it
    /// replaces a body of the same claim not yet sent.
    pub fn spawn_apply(&self, claim: &ClaimRef, body: Value, what: &'static str) {
        {
            let mut bodies = shared_state::sync::lock(&self.pending.bodies);
            bodies.insert(claim.uid.clone(), (claim.clone(), body, what));
        }
        if !self.pending.worker_started.swap(true, Ordering::AcqRel) {
            let writer = self.clone();
            tokio::spawn(async move { writer.drain_forever().await });
        }
        self.pending.wake.notify_one();
    }

    /// The background task: sends what is queued, oldest claim key first,
    /// then sleeps until more is queued.
    async fn drain_forever(self) {
        loop {
            let batch = std::mem::take(&mut *shared_state::sync::lock(&self.pending.bodies));
            if batch.is_empty() {
                self.pending.wake.notified().await;
                continue;
            }
            for (_, (claim, body, what)) in batch {
                self.apply(&claim, body, what).await;
            }
        }
    }

    /// Bodies queued and not yet sent.
    pub fn queued(&self) -> usize {
        shared_state::sync::lock(&self.pending.bodies).len()
    }

    /// Apply `body` now; the outcome is counted and logged, never returned.
    pub async fn apply(&self, claim: &ClaimRef, body: Value, what: &'static str) {
        match self
            .sink
            .apply_status(&claim.namespace, &claim.name, &self.field_manager, body)
            .await
        {
            Ok(found) => {
                self.stats.written.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(claim = %claim, what, found, "claim status written");
            }
            Err(error) => {
                let error = crate::api_client::error_chain(&error);
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                if !self.stats.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(claim = %claim, what, %error,
                        "writing the claim's device status failed (the prepare is not affected; later failures are logged at debug and counted in dra_cpu_claim_status_write_failures_total)");
                } else {
                    tracing::debug!(claim = %claim, what, %error, "writing the claim's device status failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_state::AllocatedDevice;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).unwrap_or_default()
    }

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "aaaaaaaa-0000-0000-0000-000000000001".into(),
        }
    }

    fn assignment(cpus: &str) -> ClaimAssignment {
        ClaimAssignment {
            claim_uid: claim().uid,
            namespace: "ns".into(),
            name: "c".into(),
            consumer_pods: vec!["p".into()],
            devices: vec![AllocatedDevice {
                request: "cpus".into(),
                pool: "node-a".into(),
                device: "cpudevnuma000".into(),
                consumed_cpus: Some(2),
            }],
            cpus: set(cpus),
            prepared_at_unix_ms: 1,
            pod_claim_name: None,
            tuning: Default::default(),
        }
    }

    fn places() -> CpuPlaces {
        let mut p = CpuPlaces::default();
        for cpu in 0..8 {
            p.numa.insert(cpu, cpu / 4);
            p.socket.insert(cpu, cpu / 4);
        }
        p
    }

    fn key(device: &str, share: Option<&str>) -> ResultKey {
        ResultKey {
            request: "cpus".into(),
            pool: "node-a".into(),
            device: device.into(),
            share_id: share.map(str::to_string),
        }
    }

    #[test]
    fn each_result_says_its_cpus_and_where_they_are() {
        let groups = |d: &str| match d {
            "cpudevnuma000" => Some(set("0-3")),
            "cpudevnuma001" => Some(set("4-7")),
            "cpudev005" => Some(set("5")),
            _ => None,
        };
        let body = prepared_status(
            &claim(),
            "dra.cpu",
            &[
                key("cpudevnuma000", Some("0a1b")),
                key("cpudevnuma001", None),
                key("cpudev005", None),
            ],
            &assignment("2-3,5-6"),
            groups,
            &places(),
            "2026-12-03T00:00:00Z",
        );
        let devices = body
            .pointer("/status/devices")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert_eq!(devices.len(), 3);
        assert_eq!(devices[0]["device"], "cpudevnuma000");
        assert_eq!(devices[0]["shareID"], "0a1b");
        assert_eq!(devices[0]["data"]["cpus"], "2-3");
        assert_eq!(devices[0]["data"]["cpuCount"], 2);
        assert_eq!(devices[0]["data"]["numaNodes"], json!([0]));
        assert_eq!(devices[1]["data"]["cpus"], "5-6");
        assert_eq!(devices[1]["data"]["numaNodes"], json!([1]));
        assert!(devices[1].get("shareID").is_none());
        assert_eq!(devices[2]["data"]["cpus"], "5");
        assert_eq!(devices[0]["conditions"][0]["type"], "Ready");
        assert_eq!(devices[0]["conditions"][0]["status"], "True");
        assert_eq!(body["metadata"]["uid"], claim().uid);
        assert_eq!(cleared_status(&claim())["status"]["devices"], json!([]));
    }

    struct Failing(AtomicU64);

    #[tonic::async_trait]
    impl ClaimStatusSink for Failing {
        async fn apply_status(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: Value,
        ) -> Result<bool, ClaimStatusError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            let status = kube::core::Status::failure("field not declared in schema", "Invalid");
            Err(kube::Error::Api(status.boxed()).into())
        }
    }

    #[tokio::test]
    async fn a_failed_write_is_counted_and_returns_nothing() {
        let sink = Arc::new(Failing(AtomicU64::new(0)));
        let stats = Arc::new(StatusWriteStats::default());
        let writer = ClaimStatusWriter::new(sink.clone(), "dra.cpu", stats.clone());
        writer
            .apply(&claim(), cleared_status(&claim()), "unprepare")
            .await;
        writer
            .apply(&claim(), cleared_status(&claim()), "unprepare")
            .await;
        assert_eq!(sink.0.load(Ordering::Relaxed), 2);
        assert_eq!(stats.failed.load(Ordering::Relaxed), 2);
        assert_eq!(stats.written.load(Ordering::Relaxed), 0);
    }

    /// Counts the writes in flight at once and keeps every body it saw.
    struct Recording {
        in_flight: AtomicU64,
        most_in_flight: AtomicU64,
        seen: std::sync::Mutex<Vec<(String, Value)>>,
    }

    #[tonic::async_trait]
    impl ClaimStatusSink for Recording {
        async fn apply_status(
            &self,
            _: &str,
            name: &str,
            _: &str,
            body: Value,
        ) -> Result<bool, ClaimStatusError> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            shared_state::sync::lock(&self.seen).push((name.to_string(), body));
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(true)
        }
    }

    #[tokio::test]
    async fn queued_writes_go_one_at_a_time_and_only_the_newest_body_of_a_claim() {
        let sink = Arc::new(Recording {
            in_flight: AtomicU64::new(0),
            most_in_flight: AtomicU64::new(0),
            seen: std::sync::Mutex::new(Vec::new()),
        });
        let stats = Arc::new(StatusWriteStats::default());
        let writer = ClaimStatusWriter::new(sink.clone(), "dra.cpu", stats.clone());
        let named = |i: usize| ClaimRef {
            namespace: "ns".into(),
            name: format!("c{i}"),
            uid: format!("00000000-0000-4000-8000-{i:012}"),
        };
        for i in 0..32 {
            writer.spawn_apply(&named(i), json!({"n": i, "v": "prepare"}), "prepare");
        }
        // Claim 3 is unprepared before its prepared status went out: only
        // the cleared body may reach the server after this point.
        writer.spawn_apply(&named(3), cleared_status(&named(3)), "unprepare");
        for _ in 0..400 {
            if stats.written.load(Ordering::Relaxed) >= 32 && writer.queued() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let seen = shared_state::sync::lock(&sink.seen).clone();
        assert_eq!(
            sink.most_in_flight.load(Ordering::SeqCst),
            1,
            "one write at a time"
        );
        let last_of_3 = seen
            .iter()
            .rev()
            .find(|(name, _)| name == "c3")
            .map(|(_, b)| b.clone());
        assert_eq!(last_of_3, Some(cleared_status(&named(3))), "{seen:?}");
        let names: BTreeSet<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 32, "every claim written: {names:?}");
        assert!(
            seen.len() <= 33,
            "no more than one stale body: {}",
            seen.len()
        );
    }
}
