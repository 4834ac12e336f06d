//! Real tonic servers and clients over Unix sockets in a temporary directory:
//! registration, DRA prepare on both API versions, the coordination Watch
//! stream, and the socket rules (mode, stale socket, peer uid, path length).
//! Every server here is served by `incoming_with_peer_check` alone, as
//! dra-plugin serves its coordination socket: no `:authority` rewrite, and
//! nothing a tonic client sends is refused.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::kubelet::{dra_v1, dra_v1beta1, registration};
use dra_cpu_transport::{
    bind_unix, connect_unix, connect_unix_lazy, connect_unix_with, incoming_with_peer_check,
    unix_endpoint, PeerPolicy, TransportError, MAX_UNIX_SOCKET_PATH_BYTES, OWNER_ONLY_SOCKET_MODE,
};
use futures::stream::BoxStream;
use futures::StreamExt;
use support::kubelet::dra_plugin_info;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::transport::server::{Router, UdsConnectInfo};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// The uid this test runs as, read from a file it just created.
fn own_uid() -> u32 {
    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().metadata().unwrap().uid()
}

/// A running server; dropping the handle without `stop` leaves the task
/// running until the test runtime ends.
struct RunningServer {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningServer {
    async fn stop(self) {
        self.shutdown.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

fn serve(router: Router, path: &Path, policy: PeerPolicy) -> RunningServer {
    let listener = bind_unix(path, OWNER_ONLY_SOCKET_MODE).unwrap();
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(router.serve_with_incoming_shutdown(
        incoming_with_peer_check(listener, policy),
        async {
            let _ = stopped.await;
        },
    ));
    RunningServer { shutdown, task }
}

// ---- registration ----

#[derive(Default)]
struct Registrar {
    calls: AtomicUsize,
    /// The peer uid tonic reported for the last GetInfo, from SO_PEERCRED.
    last_peer_uid: Mutex<Option<u32>>,
    statuses: Mutex<Vec<registration::RegistrationStatus>>,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        request: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let uid = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        *self.last_peer_uid.lock().unwrap() = uid;
        Ok(Response::new(dra_plugin_info()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        self.statuses.lock().unwrap().push(request.into_inner());
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

fn registration_router(registrar: &Arc<Registrar>) -> Router {
    Server::builder().add_service(
        registration::registration_server::RegistrationServer::from_arc(registrar.clone()),
    )
}

async fn get_info(path: &Path) -> Result<registration::PluginInfo, String> {
    let channel = connect_unix(path).await.map_err(|e| e.to_string())?;
    let mut client = registration::registration_client::RegistrationClient::new(channel);
    client
        .get_info(registration::InfoRequest {})
        .await
        .map(Response::into_inner)
        .map_err(|status| status.to_string())
}

#[tokio::test]
async fn registration_get_info_and_status_over_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugins_registry/dra.cpu-reg.sock");
    let registrar = Arc::new(Registrar::default());
    let server = serve(
        registration_router(&registrar),
        &path,
        PeerPolicy::allow_uids([own_uid()]),
    );

    let info = get_info(&path).await.unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "dra.cpu");
    assert_eq!(
        info.supported_versions,
        vec!["v1.DRAPlugin".to_string(), "v1beta1.DRAPlugin".to_string()]
    );
    assert_eq!(*registrar.last_peer_uid.lock().unwrap(), Some(own_uid()));

    let endpoint = unix_endpoint().connect_timeout(std::time::Duration::from_secs(5));
    let mut client = registration::registration_client::RegistrationClient::new(
        connect_unix_with(endpoint, &path).await.unwrap(),
    );
    client
        .notify_registration_status(registration::RegistrationStatus {
            plugin_registered: false,
            error: "driver name taken".into(),
        })
        .await
        .unwrap();
    let statuses = registrar.statuses.lock().unwrap().clone();
    assert_eq!(statuses.len(), 1);
    assert!(!statuses[0].plugin_registered);
    assert_eq!(statuses[0].error, "driver name taken");

    server.stop().await;
}

// ---- socket rules ----

#[tokio::test]
async fn socket_file_mode_is_what_was_asked() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o600, 0o660] {
        let path = dir.path().join(format!("m{mode:o}.sock"));
        let _listener = bind_unix(&path, mode).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            mode,
            "{}",
            path.display()
        );
    }
}

#[tokio::test]
async fn missing_parent_directories_are_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/c.sock");
    let _listener = bind_unix(&path, OWNER_ONLY_SOCKET_MODE).unwrap();
    assert!(path.parent().unwrap().is_dir());
}

#[tokio::test]
async fn stale_socket_file_is_replaced_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    // A crashed server leaves its socket file behind, with nobody listening.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(std::os::unix::net::UnixStream::connect(&path).is_err());
    // A plain bind cannot reuse the path while the stale file is there.
    assert!(std::os::unix::net::UnixListener::bind(&path).is_err());

    let registrar = Arc::new(Registrar::default());
    let server = serve(
        registration_router(&registrar),
        &path,
        PeerPolicy::allow_uids([own_uid()]),
    );
    assert_eq!(get_info(&path).await.unwrap().name, "dra.cpu");
    server.stop().await;
}

#[tokio::test]
async fn the_socket_accepts_as_soon_as_it_appears_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ready.sock");
    // A stale socket is replaced in place, never left missing.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let listener = bind_unix(&path, OWNER_ONLY_SOCKET_MODE).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ready.sock"]);
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
    assert_eq!(meta.permissions().mode() & 0o7777, OWNER_ONLY_SOCKET_MODE);
    // Already listening: the connection is queued before any accept.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = tokio::net::UnixStream::connect(&path).await.unwrap();
    let (mut server_side, _) = listener.accept().await.unwrap();
    client.write_all(b"ping").await.unwrap();
    let mut received = [0u8; 4];
    server_side.read_exact(&mut received).await.unwrap();
    assert_eq!(&received, b"ping");
}

#[tokio::test]
async fn a_regular_file_in_the_way_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("important.sock");
    std::fs::write(&path, b"not a socket").unwrap();
    let err = bind_unix(&path, OWNER_ONLY_SOCKET_MODE).unwrap_err();
    assert!(matches!(err, TransportError::NotASocket { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
}

#[tokio::test]
async fn too_long_socket_path_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let name = "s".repeat(MAX_UNIX_SOCKET_PATH_BYTES);
    let path = dir.path().join(name);
    let err = bind_unix(&path, OWNER_ONLY_SOCKET_MODE).unwrap_err();
    match &err {
        TransportError::PathTooLong { path: p, len } => {
            assert_eq!(p, &path);
            assert_eq!(*len, path.as_os_str().len());
        }
        other => panic!("expected PathTooLong, got {other:?}"),
    }
    assert!(err.to_string().contains("at most 107 bytes"), "{err}");
    assert!(!path.exists());
    assert!(matches!(
        connect_unix(&path).await.unwrap_err(),
        TransportError::PathTooLong { .. }
    ));
    assert!(matches!(
        connect_unix_lazy(&path).unwrap_err(),
        TransportError::PathTooLong { .. }
    ));
}

#[test]
fn binding_outside_a_runtime_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.sock");
    assert!(matches!(
        bind_unix(&path, OWNER_ONLY_SOCKET_MODE).unwrap_err(),
        TransportError::NoRuntime { .. }
    ));
}

#[tokio::test]
async fn connecting_to_a_missing_socket_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = connect_unix(&path).await.unwrap_err();
    assert!(matches!(err, TransportError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("absent.sock"), "{err}");
}

#[tokio::test]
async fn peer_with_another_uid_is_refused_and_own_uid_is_served() {
    let us = own_uid();
    assert_ne!(us, 12345, "the refusal case needs a uid other than 12345");
    let dir = tempfile::tempdir().unwrap();

    let refused_path = dir.path().join("refuse.sock");
    let refusing = Arc::new(Registrar::default());
    let refusing_server = serve(
        registration_router(&refusing),
        &refused_path,
        PeerPolicy::allow_uids([12345]),
    );
    for _ in 0..3 {
        let outcome = get_info(&refused_path).await;
        assert!(outcome.is_err(), "refused peer got {outcome:?}");
    }
    assert_eq!(refusing.calls.load(Ordering::SeqCst), 0);

    let served_path = dir.path().join("serve.sock");
    let serving = Arc::new(Registrar::default());
    let serving_server = serve(
        registration_router(&serving),
        &served_path,
        PeerPolicy::allow_uids([12345, us]),
    );
    assert_eq!(get_info(&served_path).await.unwrap().name, "dra.cpu");
    assert_eq!(serving.calls.load(Ordering::SeqCst), 1);

    // Turning peers away does not end the server.
    assert!(!refusing_server.task.is_finished());
    refusing_server.stop().await;
    serving_server.stop().await;
}

// ---- DRA v1 and v1beta1 on one socket ----

#[derive(Default)]
struct Preparer {
    prepared: Mutex<Vec<String>>,
}

fn cdi_id(uid: &str) -> String {
    format!("dra.k8s.io/cpu=claim-{uid}")
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for Preparer {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            self.prepared
                .lock()
                .unwrap()
                .push(format!("v1:{}", claim.uid));
            let answer = if claim.namespace.is_empty() {
                dra_v1::NodePrepareResourceResponse {
                    devices: vec![],
                    error: format!("claim {} has no namespace", claim.uid),
                }
            } else {
                dra_v1::NodePrepareResourceResponse {
                    devices: vec![dra_v1::Device {
                        request_names: vec![],
                        pool_name: "node-a".into(),
                        device_name: "cpudevnuma000".into(),
                        cdi_device_ids: vec![cdi_id(&claim.uid)],
                        share_id: None,
                    }],
                    error: String::new(),
                }
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(dra_v1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, dra_v1::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for Preparer {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|claim| {
                self.prepared
                    .lock()
                    .unwrap()
                    .push(format!("v1beta1:{}", claim.uid));
                let answer = dra_v1beta1::NodePrepareResourceResponse {
                    devices: vec![dra_v1beta1::Device {
                        request_names: vec![],
                        pool_name: "node-a".into(),
                        device_name: "cpudevnuma000".into(),
                        cdi_device_ids: vec![cdi_id(&claim.uid)],
                    }],
                    error: String::new(),
                };
                (claim.uid, answer)
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        _request: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by this test"))
    }
}

#[tokio::test]
async fn dra_v1_and_v1beta1_served_on_one_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dra.sock");
    let preparer = Arc::new(Preparer::default());
    let router = Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::from_arc(
            preparer.clone(),
        ))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::from_arc(
            preparer.clone(),
        ));
    let server = serve(router, &path, PeerPolicy::allow_uids([own_uid()]));
    let channel = connect_unix(&path).await.unwrap();

    let mut v1 = dra_v1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let answer = v1
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![
                dra_v1::Claim {
                    namespace: "default".into(),
                    uid: "u1".into(),
                    name: "c1".into(),
                },
                dra_v1::Claim {
                    namespace: String::new(),
                    uid: "u2".into(),
                    name: "c2".into(),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 2);
    assert_eq!(
        answer.claims["u1"].devices[0].cdi_device_ids,
        vec![cdi_id("u1")]
    );
    assert!(answer.claims["u1"].error.is_empty());
    assert_eq!(answer.claims["u2"].error, "claim u2 has no namespace");

    let unprepared = v1
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "default".into(),
                uid: "u1".into(),
                name: "c1".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims.keys().collect::<Vec<_>>(), vec!["u1"]);

    let mut beta = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
    let answer = beta
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: "default".into(),
                uid: "u3".into(),
                name: "c3".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["u3"].devices[0].device_name, "cpudevnuma000");

    assert_eq!(
        *preparer.prepared.lock().unwrap(),
        vec!["v1:u1", "v1:u2", "v1beta1:u3"]
    );
    server.stop().await;
}

// ---- coordination Watch, Lookup, ReportApplied ----

/// A small coordination server: a claim table with a revision, and a channel
/// per subscriber that every committed change is pushed to.
struct Coordinator {
    state: Mutex<CoordinatorState>,
}

struct CoordinatorState {
    revision: u64,
    claims: Vec<coord::Claim>,
    subscribers: Vec<mpsc::UnboundedSender<coord::WatchEvent>>,
    watch_requests: Vec<coord::WatchRequest>,
    applied: Vec<coord::AppliedRevision>,
}

impl Coordinator {
    fn new(claims: Vec<coord::Claim>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(CoordinatorState {
                revision: 1,
                claims,
                subscribers: Vec::new(),
                watch_requests: Vec::new(),
                applied: Vec::new(),
            }),
        })
    }

    fn subscriber_count(&self) -> usize {
        self.state.lock().unwrap().subscribers.len()
    }

    fn prepare(&self, claim: coord::Claim) {
        let mut state = self.state.lock().unwrap();
        state.revision += 1;
        state.claims.push(claim.clone());
        let event = coord::WatchEvent {
            event: Some(coord::watch_event::Event::ClaimPrepared(
                coord::ClaimPrepared {
                    revision: state.revision,
                    claim: Some(claim),
                },
            )),
        };
        state.subscribers.retain(|s| s.send(event.clone()).is_ok());
    }

    fn unprepare(&self, claim_uid: &str) {
        let mut state = self.state.lock().unwrap();
        state.revision += 1;
        state.claims.retain(|c| c.uid != claim_uid);
        let event = coord::WatchEvent {
            event: Some(coord::watch_event::Event::ClaimUnprepared(
                coord::ClaimUnprepared {
                    revision: state.revision,
                    claim_uid: claim_uid.into(),
                },
            )),
        };
        state.subscribers.retain(|s| s.send(event.clone()).is_ok());
    }
}

#[tonic::async_trait]
impl coord::coordination_server::Coordination for Coordinator {
    type WatchStream = BoxStream<'static, Result<coord::WatchEvent, Status>>;

    async fn watch(
        &self,
        request: Request<coord::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.state.lock().unwrap();
        state.watch_requests.push(request.into_inner());
        let snapshot = coord::WatchEvent {
            event: Some(coord::watch_event::Event::Snapshot(coord::Snapshot {
                revision: state.revision,
                allocatable: "1-7".into(),
                reserved: "0".into(),
                mixed_allocation_mode: true,
                claims: state.claims.clone(),
            })),
        };
        // Queued under the lock, so no delta can overtake the snapshot.
        tx.send(snapshot)
            .map_err(|_| Status::internal("subscriber channel closed"))?;
        state.subscribers.push(tx);
        let events = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|event| (Ok(event), rx))
        });
        Ok(Response::new(events.boxed()))
    }

    async fn lookup(
        &self,
        request: Request<coord::LookupRequest>,
    ) -> Result<Response<coord::LookupResponse>, Status> {
        let uid = request.into_inner().claim_uid;
        let state = self.state.lock().unwrap();
        let claim = state.claims.iter().find(|c| c.uid == uid).cloned();
        Ok(Response::new(coord::LookupResponse {
            found: claim.is_some(),
            claim,
            revision: state.revision,
        }))
    }

    async fn report_applied(
        &self,
        request: Request<coord::AppliedRevision>,
    ) -> Result<Response<coord::AppliedAck>, Status> {
        let mut state = self.state.lock().unwrap();
        state.applied.push(request.into_inner());
        Ok(Response::new(coord::AppliedAck {
            current_revision: state.revision,
        }))
    }
}

fn claim(uid: &str, cpus: &str, pod: &str) -> coord::Claim {
    coord::Claim {
        uid: uid.into(),
        namespace: "team".into(),
        name: format!("claim-{uid}"),
        consumer_pod_uids: vec![pod.into()],
        cpus: cpus.into(),
        prepared_at_unix_ms: 1_733_000_000_000,
        tuning: None,
    }
}

fn revision_of(event: &coord::WatchEvent) -> u64 {
    use coord::watch_event::Event;
    match event.event.as_ref().unwrap() {
        Event::Snapshot(s) => s.revision,
        Event::ClaimPrepared(p) => p.revision,
        Event::ClaimUnprepared(u) => u.revision,
        Event::Heartbeat(h) => h.revision,
    }
}

#[tokio::test]
async fn watch_streams_snapshot_then_ordered_deltas() {
    use coord::watch_event::Event;
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("coordination.sock");
    let coordinator = Coordinator::new(vec![claim("u1", "2-3", "pod-1")]);
    let server = serve(
        Server::builder().add_service(coord::coordination_server::CoordinationServer::from_arc(
            coordinator.clone(),
        )),
        &path,
        PeerPolicy::allow_uids([own_uid()]),
    );

    let mut client =
        coord::coordination_client::CoordinationClient::new(connect_unix_lazy(&path).unwrap());
    let mut events = client
        .watch(coord::WatchRequest {
            from_revision: 0,
            subscriber: "nri-plugin/test".into(),
        })
        .await
        .unwrap()
        .into_inner();

    let first = events.message().await.unwrap().unwrap();
    let Some(Event::Snapshot(snapshot)) = &first.event else {
        panic!("first event is not a snapshot: {first:?}");
    };
    assert_eq!(snapshot.revision, 1);
    assert_eq!(snapshot.allocatable, "1-7");
    assert_eq!(snapshot.reserved, "0");
    assert!(snapshot.mixed_allocation_mode);
    assert_eq!(snapshot.claims, vec![claim("u1", "2-3", "pod-1")]);
    assert_eq!(coordinator.subscriber_count(), 1);

    // Changes committed after the snapshot arrive as deltas, in order.
    coordinator.prepare(claim("u2", "4", "pod-2"));
    coordinator.unprepare("u1");
    let second = events.message().await.unwrap().unwrap();
    let third = events.message().await.unwrap().unwrap();
    assert_eq!(
        second.event,
        Some(Event::ClaimPrepared(coord::ClaimPrepared {
            revision: 2,
            claim: Some(claim("u2", "4", "pod-2")),
        }))
    );
    assert_eq!(
        third.event,
        Some(Event::ClaimUnprepared(coord::ClaimUnprepared {
            revision: 3,
            claim_uid: "u1".into(),
        }))
    );
    let revisions: Vec<u64> = [&first, &second, &third]
        .iter()
        .map(|e| revision_of(e))
        .collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");

    let found = client
        .lookup(coord::LookupRequest {
            claim_uid: "u2".into(),
            pod_uid: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(found.found);
    assert_eq!(found.claim, Some(claim("u2", "4", "pod-2")));
    assert_eq!(found.revision, 3);
    let gone = client
        .lookup(coord::LookupRequest {
            claim_uid: "u1".into(),
            pod_uid: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!gone.found);
    assert_eq!(gone.claim, None);

    let ack = client
        .report_applied(coord::AppliedRevision {
            subscriber: "nri-plugin/test".into(),
            revision: 3,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.current_revision, 3);
    {
        let state = coordinator.state.lock().unwrap();
        assert_eq!(state.watch_requests[0].subscriber, "nri-plugin/test");
        assert_eq!(state.applied.len(), 1);
        assert_eq!(state.applied[0].revision, 3);
    }

    // A second subscriber starts from a snapshot of the current state.
    let mut late = client
        .watch(coord::WatchRequest {
            from_revision: 3,
            subscriber: "late".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let Some(Event::Snapshot(snapshot)) = late.message().await.unwrap().unwrap().event else {
        panic!("late subscriber did not start with a snapshot");
    };
    assert_eq!(snapshot.revision, 3);
    assert_eq!(snapshot.claims, vec![claim("u2", "4", "pod-2")]);

    drop(events);
    drop(late);
    server.stop().await;
}

/// Speaks the first bytes of HTTP/2 on a Unix socket and prints whether the
/// server answered ("served") or hung up ("closed").
const HTTP2_PROBE: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
try:
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    data = s.recv(9)
except (BrokenPipeError, ConnectionResetError):
    # The server hung up before or while we spoke.
    data = b""
print("served" if data else "closed")
"#;

const NOBODY: u32 = 65534;

async fn probe_as_nobody(path: &Path) -> String {
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "this test runs its non-root peer with /usr/bin/python3"
    );
    let output = tokio::process::Command::new(python)
        .arg("-c")
        .arg(HTTP2_PROBE)
        .arg(path)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[tokio::test]
async fn non_root_process_is_refused_by_uid_even_when_file_mode_allows_it() {
    assert_eq!(
        own_uid(),
        0,
        "this test starts a peer as uid {NOBODY} and needs to run as root"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let registrar = Arc::new(Registrar::default());

    // World-writable sockets, so only the SO_PEERCRED check stands in the way.
    let start = |name: &str, policy: PeerPolicy| {
        let path = dir.path().join(name);
        let listener = bind_unix(&path, 0o666).unwrap();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            registration_router(&registrar).serve_with_incoming_shutdown(
                incoming_with_peer_check(listener, policy),
                async {
                    let _ = stopped.await;
                },
            ),
        );
        (path, RunningServer { shutdown, task })
    };
    let (root_only_path, root_only) = start("root-only.sock", PeerPolicy::root_only());
    let (open_path, open) = start("nobody-too.sock", PeerPolicy::allow_uids([0, NOBODY]));

    assert_eq!(probe_as_nobody(&root_only_path).await, "closed");
    assert_eq!(probe_as_nobody(&open_path).await, "served");
    // Root is still served by the root-only server.
    assert_eq!(get_info(&root_only_path).await.unwrap().name, "dra.cpu");

    root_only.stop().await;
    open.stop().await;
}
