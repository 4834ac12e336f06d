//! The coordination client: subscribe to dra-plugin's Watch stream, apply
//! its snapshot and deltas through the [`Enforcer`], report the applied
//! revision back, and resubscribe with backoff when the stream ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::coordination::MessageError;
use dra_cpu_transport::{connect_unix, TransportError};

use crate::enforcer::Enforcer;
use crate::view::ViewError;

/// dra-plugin heartbeats every 10 s; three missed ones mean a dead stream.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(35);
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

use dra_cpu_proto::coordination::{claim_from_message, snapshot_from_message};

/// The waits between resubscriptions: 100 ms, doubling up to 5 s, without
/// jitter and without end.
fn resubscribe_delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::new()
        .with_min_delay(INITIAL_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// Subscribe until `stop` resolves, reconnecting with backoff. While
/// disconnected the view is left as it was: containers keep being enforced
/// against the last known claims.
pub async fn run(
    enforcer: Arc<Enforcer>,
    socket: PathBuf,
    subscriber: String,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    tokio::pin!(stop);
    let mut delays = resubscribe_delays();
    loop {
        let mut started = false;
        let ended = tokio::select! {
            () = &mut stop => return,
            ended = subscribe_once(&enforcer, &socket, &subscriber, &mut started) => ended,
        };
        if started {
            // A stream that got going resets the backoff.
            delays = resubscribe_delays();
        }
        enforcer.health.set_coordination_connected(false);
        enforcer.view().stop_following();
        match ended {
            Ok(()) => {
                tracing::warn!(socket = %socket.display(), "dra-plugin ended the watch stream")
            }
            Err(e) => {
                tracing::warn!(socket = %socket.display(), error = %e, "watch of dra-plugin failed")
            }
        }
        let backoff = delays.next().unwrap_or(MAX_BACKOFF);
        tracing::info!(delay = ?backoff, "resubscribing to dra-plugin");
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(backoff) => {}
        }
    }
}

/// Why a subscription to dra-plugin's Watch stream ended.
#[derive(Debug, thiserror::Error)]
enum WatchError {
    #[error(transparent)]
    Connect(#[from] TransportError),
    #[error("Watch: {}", .0.message())]
    Watch(#[source] tonic::Status),
    #[error("nothing received for {:?}", STREAM_IDLE_TIMEOUT)]
    Idle,
    #[error("Watch stream: {}", .0.message())]
    Stream(#[source] tonic::Status),
    #[error("the stream did not start with a snapshot")]
    NoSnapshotFirst,
    #[error("dropping snapshot {revision}: {source}")]
    BadSnapshot {
        revision: u64,
        #[source]
        source: MessageError,
    },
    #[error(transparent)]
    Apply(#[from] ViewError),
}

async fn subscribe_once(
    enforcer: &Enforcer,
    socket: &Path,
    subscriber: &str,
    started: &mut bool,
) -> Result<(), WatchError> {
    let channel = connect_unix(socket).await?;
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    let from_revision = enforcer.view_revision();
    let mut stream = client
        .watch(coord::WatchRequest {
            from_revision,
            subscriber: subscriber.to_string(),
        })
        .await
        .map_err(WatchError::Watch)?
        .into_inner();
    let mut reported = 0u64;
    let mut first = true;
    loop {
        // Streaming::message is cancel safe: a report in between loses nothing.
        let received = tokio::select! {
            received = tokio::time::timeout(STREAM_IDLE_TIMEOUT, stream.message()) => received,
            () = enforcer.applied_changed.notified(), if !first => {
                report_applied(&mut client, enforcer, subscriber, &mut reported).await;
                continue;
            }
        };
        let message = received
            .map_err(|_| WatchError::Idle)?
            .map_err(WatchError::Stream)?;
        let Some(event) = message else {
            return Ok(());
        };
        let Some(event) = event.event else {
            continue;
        };
        if first && !matches!(event, coord::watch_event::Event::Snapshot(_)) {
            return Err(WatchError::NoSnapshotFirst);
        }
        use coord::watch_event::Event as E;
        let applied = match event {
            E::Snapshot(s) => match snapshot_from_message(&s) {
                Ok(snapshot) => {
                    tracing::info!(
                        revision = snapshot.revision,
                        from_revision,
                        claims = snapshot.claims.len(),
                        "applying dra-plugin snapshot"
                    );
                    enforcer.apply_snapshot(snapshot).await
                }
                Err(e) => {
                    // Keep the old view rather than free CPUs in use.
                    return Err(WatchError::BadSnapshot {
                        revision: s.revision,
                        source: e,
                    });
                }
            },
            E::ClaimPrepared(p) => match p.claim.as_ref().map(claim_from_message) {
                Some(Ok(claim)) => enforcer.apply_prepared(p.revision, claim).await,
                Some(Err(e)) => {
                    tracing::warn!(revision = p.revision, error = %e, "dropping ClaimPrepared");
                    continue;
                }
                None => {
                    tracing::warn!(
                        revision = p.revision,
                        "dropping ClaimPrepared without a claim"
                    );
                    continue;
                }
            },
            E::ClaimUnprepared(u) => enforcer.apply_unprepared(u.revision, &u.claim_uid).await,
            E::Heartbeat(_) => Ok(()),
        };
        applied?;
        if first {
            first = false;
            *started = true;
            enforcer.health.set_coordination_connected(true);
        }
        report_applied(&mut client, enforcer, subscriber, &mut reported).await;
    }
}

type CoordinationClient = coord::coordination_client::CoordinationClient<tonic::transport::Channel>;

/// Tell dra-plugin the applied revision if it changed since the last report.
async fn report_applied(
    client: &mut CoordinationClient,
    enforcer: &Enforcer,
    subscriber: &str,
    reported: &mut u64,
) {
    let applied_revision = enforcer.applied_revision();
    if applied_revision == *reported {
        return;
    }
    let report = coord::AppliedRevision {
        subscriber: subscriber.to_string(),
        revision: applied_revision,
    };
    match tokio::time::timeout(Duration::from_secs(1), client.report_applied(report)).await {
        Ok(Ok(_)) => *reported = applied_revision,
        Ok(Err(s)) => tracing::warn!(error = %s.message(), "ReportApplied failed"),
        Err(_) => tracing::warn!("ReportApplied timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resubscribe_delays_double_from_100ms_up_to_5s() {
        let ms: Vec<u128> = resubscribe_delays()
            .take(9)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }
}
