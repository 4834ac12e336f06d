//! The subscription to dra-plugin: apply its snapshot and deltas to the
//! view, report the applied revision, reconnect with backoff; and the
//! [`ClaimResolver`] that asks dra-plugin (or, when it is down, the CDI spec
//! on disk) about a claim the view has not heard of.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::transport::connect_unix;

use crate::cdi_fallback;
use crate::handler::{ClaimResolver, Resolution};
use crate::plugin::Enforcer;

/// Time allowed for one Lookup, connection included; the CDI fallback runs
/// after it, and the whole resolution stays far inside NRI's 2 s.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(300);
/// dra-plugin heartbeats every 10 s; three missed ones mean a dead stream.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(35);
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub use dra_cpu_proto::coordination::{
    claim_from_message, snapshot_from_message, MessageError as CoordinationError,
};

/// Asks dra-plugin by Lookup; falls back to the CDI spec when dra-plugin
/// does not answer.
#[derive(Debug, Clone)]
pub struct CoordinationResolver {
    pub socket: PathBuf,
    pub cdi_dir: PathBuf,
}

async fn lookup(socket: &Path, claim_uid: &str) -> Result<coord::LookupResponse, String> {
    let channel = connect_unix(socket).await.map_err(|e| e.to_string())?;
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    client
        .lookup(coord::LookupRequest {
            claim_uid: claim_uid.to_string(),
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("Lookup: {}", status.message()))
}

#[async_trait::async_trait]
impl ClaimResolver for CoordinationResolver {
    async fn resolve(&self, claim_uid: &str) -> Resolution {
        let asked = tokio::time::timeout(LOOKUP_TIMEOUT, lookup(&self.socket, claim_uid)).await;
        let why_not = match asked {
            Ok(Ok(answer)) => {
                return match answer.claim.filter(|_| answer.found) {
                    None => Resolution::NotPrepared,
                    Some(claim) => match claim_from_message(&claim) {
                        Ok(a) if a.claim_uid == claim_uid => Resolution::Prepared(a),
                        Ok(a) => Resolution::Unverifiable(format!(
                            "dra-plugin answered about claim {} instead",
                            a.claim_uid
                        )),
                        Err(e) => Resolution::Unverifiable(format!("dra-plugin sent {e}")),
                    },
                };
            }
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {LOOKUP_TIMEOUT:?}"),
        };
        tracing::warn!(claim = %claim_uid, reason = %why_not, "dra-plugin unavailable; checking the CDI spec");
        match cdi_fallback::read_claim_cpus(&self.cdi_dir, claim_uid) {
            Ok(cpus) => Resolution::FromCdi(cpus),
            Err(e) => Resolution::Unverifiable(format!(
                "dra-plugin at {} is unavailable ({why_not}) and {e}",
                self.socket.display()
            )),
        }
    }
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
    let mut backoff = Duration::ZERO;
    loop {
        let ended = tokio::select! {
            () = &mut stop => return,
            ended = subscribe_once(&enforcer, &socket, &subscriber, &mut backoff) => ended,
        };
        enforcer
            .metrics
            .coordination_connected
            .store(false, Ordering::Relaxed);
        match ended {
            Ok(()) => {
                tracing::warn!(socket = %socket.display(), "dra-plugin ended the watch stream")
            }
            Err(e) => {
                tracing::warn!(socket = %socket.display(), error = %e, "watch of dra-plugin failed")
            }
        }
        backoff = if backoff.is_zero() {
            INITIAL_BACKOFF
        } else {
            (backoff * 2).min(MAX_BACKOFF)
        };
        tracing::info!(delay = ?backoff, "resubscribing to dra-plugin");
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(backoff) => {}
        }
    }
}

async fn subscribe_once(
    enforcer: &Enforcer,
    socket: &Path,
    subscriber: &str,
    backoff: &mut Duration,
) -> Result<(), String> {
    let channel = connect_unix(socket).await.map_err(|e| e.to_string())?;
    let mut client = coord::coordination_client::CoordinationClient::new(channel);
    let from_revision = enforcer.view_revision();
    let mut stream = client
        .watch(coord::WatchRequest {
            from_revision,
            subscriber: subscriber.to_string(),
        })
        .await
        .map_err(|s| format!("Watch: {}", s.message()))?
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
            .map_err(|_| format!("nothing received for {STREAM_IDLE_TIMEOUT:?}"))?
            .map_err(|s| format!("Watch stream: {}", s.message()))?;
        let Some(event) = message else {
            return Ok(());
        };
        let Some(event) = event.event else {
            continue;
        };
        if first && !matches!(event, coord::watch_event::Event::Snapshot(_)) {
            return Err("the stream did not start with a snapshot".into());
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
                    return Err(format!("dropping snapshot {}: {e}", s.revision));
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
        applied.map_err(|e| e.to_string())?;
        if first {
            first = false;
            *backoff = Duration::ZERO;
            enforcer
                .metrics
                .coordination_connected
                .store(true, Ordering::Relaxed);
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
    let applied_revision = enforcer.metrics.applied_revision.load(Ordering::Relaxed);
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
    use shared_state::CpuSet;

    #[tokio::test]
    async fn resolver_falls_back_to_cdi_when_dra_plugin_is_down() {
        let dir = tempfile::tempdir().expect("dir");
        let uid = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
        let resolver = CoordinationResolver {
            socket: dir.path().join("absent.sock"),
            cdi_dir: dir.path().to_path_buf(),
        };
        match resolver.resolve(uid).await {
            Resolution::Unverifiable(reason) => {
                assert!(
                    reason.contains("absent.sock") && reason.contains("no CDI spec"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        let spec = serde_json::json!({
            "cdiVersion": "0.6.0", "kind": "dra.k8s.io/cpu",
            "devices": [{"name": format!("claim-{uid}"), "containerEdits": {"env": [format!("DRA_CPUSET_{uid}=1")]}}],
        });
        std::fs::write(cdi_fallback::spec_path(dir.path(), uid), spec.to_string()).expect("spec");
        assert_eq!(
            resolver.resolve(uid).await,
            Resolution::FromCdi(CpuSet::parse_cpulist("1").expect("set"))
        );
    }
}
