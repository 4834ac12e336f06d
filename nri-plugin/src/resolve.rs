//! The resolver of claims the view has not heard of: ask dra-plugin by
//! Lookup over one lazily dialled channel; when it does not answer, read the
//! claim's CDI spec on disk (provisional, see
//! [`ClaimOrigin::CdiSpec`](crate::view::claims::ClaimOrigin::CdiSpec)).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dra_cpu_proto::coordination::claim_from_message;
use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_transport::{connect_unix_lazy, TransportError};
use shared_state::cdi_read::read_claim_cpus;
use shared_state::cdi_spec::claim_uid_of_file;
use shared_state::{ClaimAssignment, CpuSet};
use tonic::transport::Channel;

/// Time allowed for one Lookup, connection included; the CDI fallback runs
/// after it, and the whole resolution stays far inside the NRI handler's
/// 1.5 s.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(300);

/// The answer of a [`ClaimResolver`] about one claim UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// dra-plugin answered with the prepared claim, as it stood at the store
    /// revision `revision`.
    Prepared {
        claim: ClaimAssignment,
        revision: u64,
    },
    /// dra-plugin answered that the claim is not prepared on this node at
    /// the store revision `revision`.
    NotPrepared { revision: u64 },
    /// dra-plugin could not be asked; the claim's CDI spec says these CPUs.
    FromCdi(CpuSet),
    /// dra-plugin could not be asked and no usable CDI spec was found; the
    /// text says what was tried.
    Unverifiable(String),
}

/// Time allowed for a Lookup that names a pod: dra-plugin may read the
/// claim from the API server (500 ms at most) and record the pod before it
/// answers. Asked only within [`RESERVED_FOR_ASK_BEFORE`] of the
/// container's admission, so the whole of it stays inside the NRI
/// handler's 1.5 s.
pub const RESERVED_FOR_LOOKUP_TIMEOUT: Duration = Duration::from_millis(800);

/// How far into a container's admission a Lookup naming its pod may still
/// begin.
pub const RESERVED_FOR_ASK_BEFORE: Duration = Duration::from_millis(600);

/// Asks about a claim the view does not know yet. Implementations bound the
/// time they take: the NRI runtime waits at most 2 s for a reply.
#[async_trait::async_trait]
pub trait ClaimResolver: Send + Sync {
    async fn resolve(&self, claim_uid: &str) -> Resolution;

    /// Asks about a prepared claim whose record does not name `pod_uid` as
    /// a consumer: the answer names it when the claim's `reservedFor` does
    /// now. A resolver that cannot ask for a pod answers as
    /// [`ClaimResolver::resolve`].
    async fn resolve_for_pod(&self, claim_uid: &str, pod_uid: &str) -> Resolution {
        let _ = pod_uid;
        self.resolve(claim_uid).await
    }
}

/// Why dra-plugin gave no answer to a Lookup.
#[derive(Debug, thiserror::Error)]
enum LookupError {
    #[error("Lookup: {}", .0.message())]
    Refused(#[source] tonic::Status),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Asks dra-plugin by Lookup; falls back to the CDI spec when dra-plugin
/// does not answer. Every Lookup goes over one channel, dialled at the
/// first one and redialled after dra-plugin restarts, not over a new Unix
/// connection per unknown claim.
#[derive(Debug, Clone)]
pub struct CoordinationResolver {
    socket: PathBuf,
    cdi_dir: PathBuf,
    channel: Channel,
}

impl CoordinationResolver {
    /// A resolver for dra-plugin's coordination socket and the CDI spec
    /// directory. Nothing is dialled yet; must run inside a Tokio runtime.
    pub fn new(socket: PathBuf, cdi_dir: PathBuf) -> Result<Self, TransportError> {
        let channel = connect_unix_lazy(&socket)?;
        Ok(CoordinationResolver {
            socket,
            cdi_dir,
            channel,
        })
    }

    async fn lookup(
        &self,
        claim_uid: &str,
        pod_uid: &str,
    ) -> Result<coord::LookupResponse, LookupError> {
        let mut client = coord::coordination_client::CoordinationClient::new(self.channel.clone());
        client
            .lookup(coord::LookupRequest {
                claim_uid: claim_uid.to_string(),
                pod_uid: pod_uid.to_string(),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(LookupError::Refused)
    }
}

/// dra-plugin's answer about `claim_uid`.
fn answered(claim_uid: &str, answer: coord::LookupResponse) -> Resolution {
    let revision = answer.revision;
    match answer.claim.filter(|_| answer.found) {
        None => Resolution::NotPrepared { revision },
        Some(claim) => match claim_from_message(&claim) {
            Ok(a) if a.claim_uid == claim_uid => Resolution::Prepared { claim: a, revision },
            Ok(a) => Resolution::Unverifiable(format!(
                "dra-plugin answered about claim {} instead",
                a.claim_uid
            )),
            Err(e) => Resolution::Unverifiable(format!("dra-plugin sent {e}")),
        },
    }
}

#[async_trait::async_trait]
impl ClaimResolver for CoordinationResolver {
    async fn resolve(&self, claim_uid: &str) -> Resolution {
        let asked = tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup(claim_uid, "")).await;
        let why_not = match asked {
            Ok(Ok(answer)) => return answered(claim_uid, answer),
            Ok(Err(e)) => e,
            Err(_) => LookupError::Timeout(LOOKUP_TIMEOUT),
        };
        tracing::warn!(claim = %claim_uid, reason = %why_not, "dra-plugin unavailable; checking the CDI spec");
        match read_claim_cpus(&self.cdi_dir, claim_uid) {
            Ok(cpus) => Resolution::FromCdi(cpus),
            Err(e) => Resolution::Unverifiable(format!(
                "dra-plugin at {} is unavailable ({why_not}) and {e}",
                self.socket.display()
            )),
        }
    }

    /// No CDI fallback: a spec names no pod, so without dra-plugin's
    /// answer the record stands.
    async fn resolve_for_pod(&self, claim_uid: &str, pod_uid: &str) -> Resolution {
        let asked =
            tokio::time::timeout(RESERVED_FOR_LOOKUP_TIMEOUT, self.lookup(claim_uid, pod_uid))
                .await;
        match asked {
            Ok(Ok(answer)) => answered(claim_uid, answer),
            Ok(Err(e)) => Resolution::Unverifiable(e.to_string()),
            Err(_) => Resolution::Unverifiable(
                LookupError::Timeout(RESERVED_FOR_LOOKUP_TIMEOUT).to_string(),
            ),
        }
    }
}

/// Every claim with a readable spec in `cdi_dir`, for the view nri-plugin
/// starts with before dra-plugin answers. Unreadable specs are skipped.
pub fn scan_claims(cdi_dir: &Path) -> Vec<(String, CpuSet)> {
    let Ok(entries) = std::fs::read_dir(cdi_dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, CpuSet)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let uid = claim_uid_of_file(&name)?;
            match read_claim_cpus(cdi_dir, uid) {
                Ok(cpus) => Some((uid.to_string(), cpus)),
                Err(err) => {
                    tracing::warn!(error = %err, "skipping CDI spec");
                    None
                }
            }
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tonic::{Request, Response, Status};

    #[tokio::test]
    async fn resolver_falls_back_to_cdi_when_dra_plugin_is_down() {
        let dir = tempfile::tempdir().expect("dir");
        let uid = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
        let resolver =
            CoordinationResolver::new(dir.path().join("absent.sock"), dir.path().to_path_buf())
                .expect("resolver");
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
        std::fs::write(
            shared_state::cdi_read::spec_path(dir.path(), uid),
            spec.to_string(),
        )
        .expect("spec");
        assert_eq!(
            resolver.resolve(uid).await,
            Resolution::FromCdi(CpuSet::parse_cpulist("1").expect("set"))
        );
    }

    /// dra-plugin's Lookup, answering every claim as prepared on CPU 3.
    struct AnswersEveryLookup;

    #[tonic::async_trait]
    impl coord::coordination_server::Coordination for AnswersEveryLookup {
        type WatchStream = futures::stream::BoxStream<'static, Result<coord::WatchEvent, Status>>;

        async fn watch(
            &self,
            _request: Request<coord::WatchRequest>,
        ) -> Result<Response<Self::WatchStream>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn lookup(
            &self,
            request: Request<coord::LookupRequest>,
        ) -> Result<Response<coord::LookupResponse>, Status> {
            let uid = request.into_inner().claim_uid;
            Ok(Response::new(coord::LookupResponse {
                found: true,
                claim: Some(coord::Claim {
                    uid,
                    namespace: "ns".into(),
                    name: "c".into(),
                    consumer_pod_uids: vec!["pod".into()],
                    cpus: "3".into(),
                    prepared_at_unix_ms: 1,
                    tuning: None,
                }),
                revision: 1,
            }))
        }

        async fn report_applied(
            &self,
            _request: Request<coord::AppliedRevision>,
        ) -> Result<Response<coord::AppliedAck>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    #[tokio::test]
    async fn lookups_share_one_connection() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("coordination.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let incoming =
            tokio_stream::wrappers::UnixListenerStream::new(listener).inspect(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            });
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(coord::coordination_server::CoordinationServer::new(
                    AnswersEveryLookup,
                ))
                .serve_with_incoming(incoming),
        );
        let resolver =
            CoordinationResolver::new(socket, dir.path().to_path_buf()).expect("resolver");
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "dialled lazily");
        for uid in [
            "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10",
            "1c5f9b63-4d2e-4a8f-8b3c-7e6d5f4a3b21",
            "2d6a0c74-5e3f-4b9a-9c4d-8f7e6a5b4c32",
        ] {
            match resolver.resolve(uid).await {
                Resolution::Prepared { claim, revision } => {
                    assert_eq!(claim.claim_uid, uid);
                    assert_eq!(revision, 1, "the answer's revision");
                }
                other => panic!("{uid}: {other:?}"),
            }
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "three Lookups, one connection"
        );
        server.abort();
    }

    #[test]
    fn scan_finds_the_claims_whose_specs_read() {
        use shared_state::cdi_read::spec_path;
        use shared_state::cdi_spec::{spec_file_name, ClaimSpec};
        let dir = tempfile::tempdir().expect("dir");
        let uid = "0b4e8a52-3c1d-4f7e-9a2b-6d5c4e3f2a10";
        let cpus = CpuSet::parse_cpulist("1").expect("set");
        std::fs::write(
            spec_path(dir.path(), uid),
            ClaimSpec::new(uid, &cpus).to_json(),
        )
        .expect("write");
        std::fs::write(
            dir.path()
                .join(spec_file_name("7f3e2d1c-0b9a-4876-a5b4-c3d2e1f0a9b9")),
            "{}",
        )
        .expect("junk");
        std::fs::write(dir.path().join("other-vendor.json"), "{}").expect("other");
        assert_eq!(scan_claims(dir.path()), vec![(uid.to_string(), cpus)]);
        assert!(scan_claims(&dir.path().join("nope")).is_empty());
    }
}
