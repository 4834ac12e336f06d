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
//! failed write) is logged (at warn the first time) and counted. A write
//! that may pass is tried again after a pause, and a prepared status still
//! missing when kubelet prepares the claim again is repaired then (see
//! [`ClaimStatusWriter`]).

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
    /// No answer within the writer's time limit.
    #[error("no answer within {}s", WRITE_TIMEOUT.as_secs())]
    TimedOut,
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

/// How often a write that failed for a reason that may pass (the API server
/// unreachable or failing) is tried in all, and the pause before the second
/// try; each later pause doubles (1 + 2 + 4 + 8 s).
const ATTEMPTS: u32 = 5;
const FIRST_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest one write may take, kube's own retries included, before it
/// counts as failed: the writer sends one at a time, so a hung write would
/// hold back every other claim's.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl ClaimStatusError {
    /// Whether the same write may succeed later: the server could not be
    /// reached or did not answer in time, or failed with a 5xx. 429, 503
    /// and 504 are not among them: kube's client has already tried those
    /// again, for minutes, before it returns them. A refusal of the write
    /// itself (4xx: a field the release does not have, no permission), or a
    /// request or answer that cannot be built or read, will not pass.
    fn may_pass(&self) -> bool {
        match self {
            ClaimStatusError::Api(kube::Error::Api(status)) => {
                status.code >= 500 && !matches!(status.code, 503 | 504)
            }
            ClaimStatusError::Api(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
            ClaimStatusError::Api(_) => false,
            ClaimStatusError::TimedOut => true,
        }
    }
}

/// A body waiting to be sent, and how many times it was tried.
struct Queued {
    claim: ClaimRef,
    body: Value,
    what: &'static str,
    attempt: u32,
}

/// What the writer knows of one claim's status writes.
#[derive(Default)]
struct ClaimWrites {
    /// Bumped by every body queued for the claim: a retry or repair begun
    /// under an older generation is stale (a newer body, an unprepare's
    /// among them, decides) and is dropped.
    generation: u64,
    /// The newest body not yet sent (an older one is never worth sending
    /// once a newer exists).
    queued: Option<Queued>,
    /// The claim's prepared status is on the server: written by this
    /// process, or found there by a repair.
    prepared_on_server: bool,
    /// A retry waits for its pause, or a repair reads the claim.
    repairing: bool,
    /// The worker has taken a body of the claim and not yet settled it.
    sending: bool,
}

/// Status writes waiting for the writer's one background task, by claim UID.
#[derive(Default)]
struct PendingWrites {
    claims: std::sync::Mutex<BTreeMap<String, ClaimWrites>>,
    wake: tokio::sync::Notify,
    worker_started: AtomicBool,
}

/// Writes claim statuses in the background, one at a time. A burst of
/// prepares would otherwise put one API request per claim in flight at
/// once, competing for the node's CPUs with the prepares themselves; a
/// queue that keeps only the newest body per claim sends each claim's final
/// state once the burst has passed, and never more requests at once than
/// one. A write that failed for a reason that may pass is tried again after
/// a pause (up to [`ATTEMPTS`] in all), unless a newer body replaced it.
#[derive(Clone)]
pub struct ClaimStatusWriter {
    sink: Arc<dyn ClaimStatusSink>,
    field_manager: String,
    pub stats: Arc<StatusWriteStats>,
    pending: Arc<PendingWrites>,
}

/// A repair of a claim's prepared status under way: see
/// [`ClaimStatusWriter::begin_repair`].
#[derive(Debug)]
#[must_use = "a repair must be finished or abandoned"]
pub struct Repair {
    uid: String,
    generation: u64,
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
    /// replaces a body of the same claim not yet sent, and any retry or
    /// repair of an older one.
    pub fn spawn_apply(&self, claim: &ClaimRef, body: Value, what: &'static str) {
        {
            let mut claims = shared_state::sync::lock(&self.pending.claims);
            let entry = claims.entry(claim.uid.clone()).or_default();
            // Retries and repairs of older bodies see the new generation
            // and drop theirs.
            entry.generation += 1;
            entry.repairing = false;
            entry.prepared_on_server = false;
            entry.queued = Some(Queued {
                claim: claim.clone(),
                body,
                what,
                attempt: 1,
            });
        }
        self.wake_worker();
    }

    fn wake_worker(&self) {
        if !self.pending.worker_started.swap(true, Ordering::AcqRel) {
            let writer = self.clone();
            tokio::spawn(async move { writer.drain_forever().await });
        }
        self.pending.wake.notify_one();
    }

    /// A prepare was answered from the store, so no status body was made
    /// for it. If this process has not seen the claim's prepared status
    /// reach the server (its write was refused or gave up, or the process
    /// was restarted, or stopped between the commit and the write) and
    /// nothing for the claim is queued, being sent or being repaired, the
    /// caller is to read the claim and [`finish_repair`](Self::finish_repair);
    /// `None` otherwise.
    pub fn begin_repair(&self, uid: &str) -> Option<Repair> {
        let mut claims = shared_state::sync::lock(&self.pending.claims);
        let entry = claims.entry(uid.to_string()).or_default();
        if entry.prepared_on_server || entry.repairing || entry.sending || entry.queued.is_some() {
            return None;
        }
        entry.repairing = true;
        Some(Repair {
            uid: uid.to_string(),
            generation: entry.generation,
        })
    }

    /// End a repair with what it found: a body to write is queued unless a
    /// newer body for the claim came meanwhile (an unprepare's clear decides
    /// then); a claim that could not be read is repaired at the next
    /// prepare answered from the store.
    pub fn finish_repair(&self, repair: Repair, claim: &ClaimRef, outcome: RepairOutcome) {
        {
            let mut claims = shared_state::sync::lock(&self.pending.claims);
            let Some(entry) = claims.get_mut(&repair.uid) else {
                return;
            };
            if entry.generation != repair.generation {
                return;
            }
            entry.repairing = false;
            match outcome {
                RepairOutcome::AlreadyOnServer => {
                    entry.prepared_on_server = true;
                    return;
                }
                RepairOutcome::Unread => return,
                RepairOutcome::Write(body) => {
                    entry.generation += 1;
                    entry.queued = Some(Queued {
                        claim: claim.clone(),
                        body,
                        what: "prepare (repair)",
                        attempt: 1,
                    });
                }
            }
        }
        self.wake_worker();
    }

    /// The background task: sends what is queued, lowest claim UID first,
    /// then sleeps until more is queued.
    async fn drain_forever(self) {
        loop {
            let batch: Vec<(String, u64, Queued)> = {
                let mut claims = shared_state::sync::lock(&self.pending.claims);
                claims
                    .iter_mut()
                    .filter_map(|(uid, entry)| {
                        let queued = entry.queued.take()?;
                        entry.sending = true;
                        Some((uid.clone(), entry.generation, queued))
                    })
                    .collect()
            };
            if batch.is_empty() {
                self.pending.wake.notified().await;
                continue;
            }
            for (uid, generation, queued) in batch {
                let outcome = self
                    .apply(&queued.claim, queued.body.clone(), queued.what)
                    .await;
                self.settle(uid, generation, queued, outcome);
            }
        }
    }

    /// Record what a sent body achieved: a prepared status on the server, a
    /// claim whose clear went through (forgotten), or a retry after a pause.
    fn settle(
        &self,
        uid: String,
        generation: u64,
        queued: Queued,
        outcome: Result<(), ClaimStatusError>,
    ) {
        let mut claims = shared_state::sync::lock(&self.pending.claims);
        let Some(entry) = claims.get_mut(&uid) else {
            return;
        };
        entry.sending = false;
        if entry.generation != generation {
            return;
        }
        let unprepare = queued.what == "unprepare";
        match outcome {
            // The claim is done with; a repair still reading it finds no
            // entry and drops what it read.
            Ok(()) if unprepare => {
                claims.remove(&uid);
            }
            Ok(()) => entry.prepared_on_server = true,
            Err(e) if e.may_pass() && queued.attempt < ATTEMPTS => {
                entry.repairing = true;
                let pause = FIRST_RETRY_PAUSE * 2u32.pow(queued.attempt - 1);
                let writer = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    writer.retry(uid, generation, queued);
                });
            }
            Err(_) if unprepare => {
                claims.remove(&uid);
            }
            Err(_) => {}
        }
    }

    /// Queue a failed body again after its pause, unless a newer body of
    /// the claim came meanwhile.
    fn retry(&self, uid: String, generation: u64, queued: Queued) {
        {
            let mut claims = shared_state::sync::lock(&self.pending.claims);
            let Some(entry) = claims.get_mut(&uid) else {
                return;
            };
            if entry.generation != generation {
                return;
            }
            entry.repairing = false;
            entry.queued = Some(Queued {
                attempt: queued.attempt + 1,
                ..queued
            });
        }
        self.wake_worker();
    }

    /// Bodies queued and not yet sent.
    pub fn queued(&self) -> usize {
        shared_state::sync::lock(&self.pending.claims)
            .values()
            .filter(|entry| entry.queued.is_some())
            .count()
    }

    /// Apply `body` now; the outcome is counted and logged, and returned
    /// only to decide a retry.
    pub async fn apply(
        &self,
        claim: &ClaimRef,
        body: Value,
        what: &'static str,
    ) -> Result<(), ClaimStatusError> {
        let write =
            self.sink
                .apply_status(&claim.namespace, &claim.name, &self.field_manager, body);
        let outcome = tokio::time::timeout(WRITE_TIMEOUT, write)
            .await
            .unwrap_or(Err(ClaimStatusError::TimedOut));
        match outcome {
            Ok(found) => {
                self.stats.written.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(claim = %claim, what, found, "claim status written");
                Ok(())
            }
            Err(error) => {
                let chain = crate::api_client::error_chain(&error);
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                if !self.stats.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(claim = %claim, what, error = %chain,
                        "writing the claim's device status failed (the prepare is not affected; a failure that may pass is tried again; later failures are logged at debug and counted in dra_cpu_claim_status_write_failures_total)");
                } else {
                    tracing::debug!(claim = %claim, what, error = %chain, "writing the claim's device status failed");
                }
                Err(error)
            }
        }
    }
}

/// What a repair found: see [`ClaimStatusWriter::finish_repair`].
#[derive(Debug)]
pub enum RepairOutcome {
    /// The claim's status already has this driver's entries.
    AlreadyOnServer,
    /// The claim could not be read; nothing to do until the next prepare.
    Unread,
    /// The body to write.
    Write(Value),
}

/// Whether the claim's status already holds an entry of `driver` for every
/// one of `results`.
pub fn status_has_entries(object: &ResourceClaim, driver: &str, results: &[ResultKey]) -> bool {
    let entries = object
        .status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    results.iter().all(|result| {
        entries.iter().any(|entry| {
            entry.driver == driver
                && entry.pool == result.pool
                && entry.device == result.device
                && entry.share_id == result.share_id
        })
    })
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
                share_id: None,
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
    async fn a_failed_write_is_counted() {
        let sink = Arc::new(Failing(AtomicU64::new(0)));
        let stats = Arc::new(StatusWriteStats::default());
        let writer = ClaimStatusWriter::new(sink.clone(), "dra.cpu", stats.clone());
        for _ in 0..2 {
            let outcome = writer
                .apply(&claim(), cleared_status(&claim()), "unprepare")
                .await;
            assert!(outcome.is_err_and(|e| !e.may_pass()), "a 422 will not pass");
        }
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

    /// Answers the first `fail` writes with `code`, then succeeds; keeps
    /// the `what` of every body it saw (its `v` field) in order.
    struct Flaky {
        code: u16,
        fail: AtomicU64,
        seen: std::sync::Mutex<Vec<String>>,
    }

    impl Flaky {
        fn new(code: u16, fail: u64) -> Arc<Flaky> {
            Arc::new(Flaky {
                code,
                fail: AtomicU64::new(fail),
                seen: std::sync::Mutex::new(Vec::new()),
            })
        }

        fn seen(&self) -> Vec<String> {
            shared_state::sync::lock(&self.seen).clone()
        }
    }

    #[tonic::async_trait]
    impl ClaimStatusSink for Flaky {
        async fn apply_status(
            &self,
            _: &str,
            _: &str,
            _: &str,
            body: Value,
        ) -> Result<bool, ClaimStatusError> {
            let v = body["v"].as_str().unwrap_or("clear").to_string();
            let failing = self
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            shared_state::sync::lock(&self.seen)
                .push(format!("{v}{}", if failing { " failed" } else { "" }));
            if failing {
                let mut status = kube::core::Status::failure("injected", "Injected");
                status.code = self.code;
                return Err(kube::Error::Api(status.boxed()).into());
            }
            Ok(true)
        }
    }

    /// Until the writer has nothing queued or waiting (paused time moves on
    /// by itself while every task sleeps).
    async fn settled(writer: &ClaimStatusWriter) {
        for _ in 0..1000 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let busy = shared_state::sync::lock(&writer.pending.claims)
                .values()
                .any(|e| e.queued.is_some() || e.repairing);
            if !busy {
                return;
            }
        }
        panic!("the writer never settled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_may_pass_is_tried_again_and_a_refused_one_is_not() {
        // 5xx may pass; 4xx are refusals of the body itself, and 429, 503
        // and 504 come back only once kube's client has tried them again.
        for (code, fail, want, pauses) in [
            (
                500,
                2,
                vec!["prepare failed", "prepare failed", "prepare"],
                1 + 2,
            ),
            (
                502,
                9,
                vec!["prepare failed"; ATTEMPTS as usize],
                1 + 2 + 4 + 8,
            ),
            (503, 1, vec!["prepare failed"], 0),
            (429, 1, vec!["prepare failed"], 0),
            (422, 1, vec!["prepare failed"], 0),
            (403, 1, vec!["prepare failed"], 0),
        ] {
            let sink = Flaky::new(code, fail);
            let writer = ClaimStatusWriter::new(sink.clone(), "dra.cpu", Arc::default());
            let started = tokio::time::Instant::now();
            writer.spawn_apply(&claim(), json!({"v": "prepare"}), "prepare");
            settled(&writer).await;
            assert_eq!(sink.seen(), want, "{code} failing {fail} times");
            // settled() looks every 100 ms of paused time.
            let waited = started.elapsed();
            let least = FIRST_RETRY_PAUSE * pauses;
            assert!(
                waited >= least && waited < least + std::time::Duration::from_millis(500),
                "{code}: {waited:?} for pauses of {least:?}"
            );
            let on_server = shared_state::sync::lock(&writer.pending.claims)
                .get(&claim().uid)
                .is_some_and(|e| e.prepared_on_server);
            assert_eq!(on_server, want.last() == Some(&"prepare"), "{code}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_waiting_for_its_pause_is_dropped_for_a_newer_body() {
        let sink = Flaky::new(500, 1);
        let writer = ClaimStatusWriter::new(sink.clone(), "dra.cpu", Arc::default());
        writer.spawn_apply(&claim(), json!({"v": "prepare"}), "prepare");
        // The prepare's body fails; the unprepare comes during the pause.
        for _ in 0..100 {
            if !sink.seen().is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        writer.spawn_apply(&claim(), cleared_status(&claim()), "unprepare");
        settled(&writer).await;
        tokio::time::sleep(FIRST_RETRY_PAUSE * 4).await;
        assert_eq!(sink.seen(), vec!["prepare failed", "clear"]);
        assert!(
            shared_state::sync::lock(&writer.pending.claims).is_empty(),
            "a cleared claim is forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_repair_writes_only_what_this_process_has_not_seen_written() {
        let sink = Flaky::new(500, 0);
        let writer = ClaimStatusWriter::new(sink.clone(), "dra.cpu", Arc::default());
        // Nothing known of the claim (a restarted process): repaired.
        let repair = writer.begin_repair(&claim().uid).expect("a repair begins");
        assert!(
            writer.begin_repair(&claim().uid).is_none(),
            "one repair at a time"
        );
        writer.finish_repair(
            repair,
            &claim(),
            RepairOutcome::Write(json!({"v": "repair"})),
        );
        settled(&writer).await;
        assert_eq!(sink.seen(), vec!["repair"]);
        // Written: no second repair.
        assert!(writer.begin_repair(&claim().uid).is_none());

        // Found on the server: nothing written, and no repair again.
        let other = ClaimRef {
            uid: "aaaaaaaa-0000-0000-0000-000000000002".into(),
            ..claim()
        };
        let repair = writer.begin_repair(&other.uid).expect("a repair begins");
        writer.finish_repair(repair, &other, RepairOutcome::AlreadyOnServer);
        assert!(writer.begin_repair(&other.uid).is_none());

        // Unread: the next prepare tries again.
        let third = ClaimRef {
            uid: "aaaaaaaa-0000-0000-0000-000000000003".into(),
            ..claim()
        };
        let repair = writer.begin_repair(&third.uid).expect("a repair begins");
        writer.finish_repair(repair, &third, RepairOutcome::Unread);
        let repair = writer.begin_repair(&third.uid).expect("tried again");
        // The claim is unprepared while the repair reads it: its body is
        // dropped, the clear decides.
        writer.spawn_apply(&third, cleared_status(&third), "unprepare");
        writer.finish_repair(repair, &third, RepairOutcome::Write(json!({"v": "stale"})));
        settled(&writer).await;
        assert_eq!(sink.seen(), vec!["repair", "clear"]);

        // The clear is sent and done with while a repair reads the claim:
        // the claim is forgotten and the repair's body dropped.
        let repair = writer.begin_repair(&claim().uid);
        assert!(repair.is_none(), "written, so no repair");
        let fourth = ClaimRef {
            uid: "aaaaaaaa-0000-0000-0000-000000000004".into(),
            ..claim()
        };
        let repair = writer.begin_repair(&fourth.uid).expect("a repair begins");
        writer.spawn_apply(&fourth, cleared_status(&fourth), "unprepare");
        settled(&writer).await;
        writer.finish_repair(repair, &fourth, RepairOutcome::Write(json!({"v": "stale"})));
        settled(&writer).await;
        assert_eq!(sink.seen(), vec!["repair", "clear", "clear"]);
        let left: Vec<String> = shared_state::sync::lock(&writer.pending.claims)
            .keys()
            .cloned()
            .collect();
        assert!(
            !left.contains(&fourth.uid),
            "the cleared claim is forgotten: {left:?}"
        );
    }
}
