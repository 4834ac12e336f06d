//! The `dracpu.v1.Coordination` service nri-plugin subscribes to.
//!
//! Watch sends a snapshot, then every change in revision order. Changes
//! reach subscribers through a bounded broadcast channel, so a prepare never
//! waits for a subscriber: one that falls more than
//! [`crate::driver::EVENT_BUFFER`] events behind is sent a fresh snapshot
//! instead of the deltas it missed.

use crate::driver::{Driver, StateEvent};
use dra_cpu_proto::coordination::v1 as coord;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// How often a quiet stream gets a heartbeat.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

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
        let uid = request.into_inner().claim_uid;
        let revision = self.driver.revision();
        let claim = self.driver.prepared(&uid);
        Ok(Response::new(coord::LookupResponse {
            found: claim.is_some(),
            claim: claim.as_ref().map(claim_message),
            revision,
        }))
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
