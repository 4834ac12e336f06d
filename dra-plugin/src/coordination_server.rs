//! The `dracpu.v1.Coordination` service nri-plugin subscribes to.
//!
//! Watch sends a snapshot, then every change in revision order. Changes
//! reach subscribers through a bounded broadcast channel, so a prepare never
//! waits for a subscriber: one that falls more than
//! [`crate::driver::EVENT_BUFFER`] events behind is sent a fresh snapshot
//! instead of the deltas it missed.

use crate::driver::{Driver, StateEvent};
use crate::kubelet::dra_service::ClaimSource;
use crate::prepare::validation::reserved_pods;
use dra_cpu_proto::coordination::v1 as coord;
use shared_state::ClaimAssignment;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// How often a quiet stream gets a heartbeat.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// Time allowed for reading a claim from the API server when a Lookup names
/// a pod the claim's record does not: nri-plugin's CreateContainer waits for
/// the answer (`RESERVED_FOR_LOOKUP_TIMEOUT` in nri-plugin's `resolve.rs`),
/// and the store's commit comes after the read.
pub const RESERVED_FOR_READ_TIMEOUT: Duration = Duration::from_millis(500);

use dra_cpu_proto::coordination::claim_message;
use dra_cpu_proto::coordination::{
    heartbeat_event, prepared_event, snapshot_event, unprepared_event,
};

fn event_message(e: &StateEvent) -> coord::WatchEvent {
    match e {
        StateEvent::Prepared {
            revision,
            assignment,
        } => prepared_event(*revision, assignment),
        StateEvent::Unprepared {
            revision,
            claim_uid,
        } => unprepared_event(*revision, claim_uid),
        StateEvent::Node(snapshot) => snapshot_event(snapshot),
    }
}

pub struct CoordinationService {
    driver: Arc<Driver>,
    heartbeat: Duration,
    stopping: CancellationToken,
    /// Where a claim's `reservedFor` is read again for a Lookup naming a
    /// pod its record does not; without it such a Lookup answers the record.
    claims: Option<Arc<dyn ClaimSource>>,
}

impl CoordinationService {
    /// `stopping` cancelled ends every Watch stream, so that a graceful
    /// shutdown does not wait for subscribers that never hang up.
    pub fn new(
        driver: Arc<Driver>,
        heartbeat: Duration,
        stopping: CancellationToken,
    ) -> CoordinationService {
        CoordinationService {
            driver,
            heartbeat,
            stopping,
            claims: None,
        }
    }

    /// Read claims from `claims` when a Lookup names a pod a claim's record
    /// does not.
    pub fn with_claims(mut self, claims: Arc<dyn ClaimSource>) -> CoordinationService {
        self.claims = Some(claims);
        self
    }

    /// Looks for `pod_uid` in the claim's `status.reservedFor` on the API
    /// server and, when it is there, records the pods it names as the
    /// claim's consumers. A claim that cannot be read, or was replaced by
    /// another of the same name, changes nothing; the caller answers the
    /// record as it stands, which refuses the pod as before.
    async fn record_reserved_for(&self, recorded: &ClaimAssignment, pod_uid: &str) {
        let Some(claims) = &self.claims else {
            return;
        };
        let read = tokio::time::timeout(
            RESERVED_FOR_READ_TIMEOUT,
            claims.get(&recorded.namespace, &recorded.name),
        )
        .await;
        let object = match read {
            Ok(Ok(Some(object))) => object,
            Ok(Ok(None)) => {
                tracing::info!(claim_uid = %recorded.claim_uid, pod_uid, "claim no longer exists; its consumer pods stay as recorded");
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(claim_uid = %recorded.claim_uid, pod_uid, %error, "cannot read the claim's reservedFor");
                return;
            }
            Err(_) => {
                tracing::warn!(claim_uid = %recorded.claim_uid, pod_uid, timeout = ?RESERVED_FOR_READ_TIMEOUT, "the claim's reservedFor was not read in time");
                return;
            }
        };
        if object.metadata.uid.as_deref() != Some(recorded.claim_uid.as_str()) {
            tracing::info!(claim_uid = %recorded.claim_uid, pod_uid, "a claim of that name with another UID exists; consumer pods stay as recorded");
            return;
        }
        let reserved = reserved_pods(object.status.as_ref());
        if !reserved.iter().any(|p| p == pod_uid) {
            tracing::info!(claim_uid = %recorded.claim_uid, pod_uid, reserved_for = ?reserved, "the claim is not reserved for this pod");
            return;
        }
        let driver = self.driver.clone();
        let uid = recorded.claim_uid.clone();
        // The store's fsync blocks.
        match tokio::task::spawn_blocking(move || driver.add_consumers(&uid, &reserved)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(claim_uid = %recorded.claim_uid, pod_uid, %error, "cannot record the claim's new consumer pod");
            }
            Err(error) => {
                tracing::error!(claim_uid = %recorded.claim_uid, pod_uid, %error, "recording the claim's consumer pods failed");
            }
        }
    }
}

type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<coord::WatchEvent, Status>> + Send + 'static>>;

/// Decrements the subscriber gauge when a stream is dropped.
struct SubscriberGuard(Arc<Driver>);

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.0.metrics().subscribers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[tonic::async_trait]
impl coord::coordination_server::Coordination for CoordinationService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<coord::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let request = request.into_inner();
        let subscriber = request.subscriber.clone();
        let (snapshot, receiver) = self.driver.subscribe();
        tracing::info!(
            subscriber = %subscriber, from_revision = request.from_revision,
            revision = snapshot.revision, "subscriber connected"
        );
        self.driver
            .metrics()
            .subscribers
            .fetch_add(1, Ordering::Relaxed);
        let guard = SubscriberGuard(self.driver.clone());
        let driver = self.driver.clone();
        let heartbeat = self.heartbeat;
        let first = snapshot_event(&snapshot);
        let state = (receiver, driver, guard, subscriber, heartbeat);
        let rest = futures::stream::unfold(
            state,
            |(mut receiver, driver, guard, subscriber, heartbeat)| async move {
                let event = match tokio::time::timeout(heartbeat, receiver.recv()).await {
                    Err(_) => heartbeat_event(driver.revision()),
                    Ok(Ok(event)) => event_message(&event),
                    Ok(Err(RecvError::Lagged(missed))) => {
                        tracing::warn!(subscriber = %subscriber, missed, "subscriber fell behind; sending a fresh snapshot");
                        let (snapshot, fresh) = driver.subscribe();
                        receiver = fresh;
                        snapshot_event(&snapshot)
                    }
                    // The driver is gone: the process is shutting down.
                    Ok(Err(RecvError::Closed)) => return None,
                };
                Some((Ok(event), (receiver, driver, guard, subscriber, heartbeat)))
            },
        );
        let stream = futures::StreamExt::take_until(
            futures::StreamExt::chain(futures::stream::once(async { Ok(first) }), rest),
            self.stopping.clone().cancelled_owned(),
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn lookup(
        &self,
        request: Request<coord::LookupRequest>,
    ) -> Result<Response<coord::LookupResponse>, Status> {
        let request = request.into_inner();
        let span = tracing::info_span!(
            "lookup", claim_uid = %request.claim_uid, pod_uid = %request.pod_uid
        );
        async move {
            // The record and the revision it stands at, read together: the
            // subscriber compares the revision with the events it has
            // applied, and an answer read before an unprepare it has
            // already seen must not bring the claim back.
            let pod = request.pod_uid.as_str();
            let (mut claim, mut revision) = self.driver.prepared_at(&request.claim_uid);
            if let Some(recorded) = &claim {
                if !pod.is_empty() && !recorded.consumer_pods.iter().any(|p| p == pod) {
                    self.record_reserved_for(recorded, pod).await;
                    (claim, revision) = self.driver.prepared_at(&request.claim_uid);
                }
            }
            Ok(Response::new(coord::LookupResponse {
                found: claim.is_some(),
                claim: claim.as_ref().map(claim_message),
                revision,
            }))
        }
        .instrument(span)
        .await
    }

    async fn report_applied(
        &self,
        request: Request<coord::AppliedRevision>,
    ) -> Result<Response<coord::AppliedAck>, Status> {
        let report = request.into_inner();
        self.driver
            .metrics()
            .applied(&report.subscriber, report.revision);
        Ok(Response::new(coord::AppliedAck {
            current_revision: self.driver.revision(),
        }))
    }
}
