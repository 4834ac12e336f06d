//! The kubelet stand-in's plugin registration against a tiny plugin: a
//! registration server on a real Unix socket in a plugins-registry
//! directory, and a DRA v1 server on the endpoint it advertises.
//!
//! A valid plugin is registered, told so with
//! `NotifyRegistrationStatus(registered = true)` and then called on its
//! endpoint; an invalid one is told `NotifyRegistrationStatus(registered =
//! false, error)` with the same reason the stand-in reports to its caller.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_cpu_proto::kubelet::registration::registration_server::{Registration, RegistrationServer};
use dra_cpu_proto::kubelet::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use dra_cpu_proto::kubelet::{dra_v1, DRA_PLUGIN_TYPE, DRA_V1BETA1_VERSION, DRA_V1_VERSION};
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra, KubeletDraError};
use dra_cpu_transport::{bind_unix, incoming_for_kubelet, PeerPolicy};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

const DRIVER: &str = "tiny.test.example.com";
const WAIT: Duration = Duration::from_secs(10);

/// The registration side of the tiny plugin: answers GetInfo with a fixed
/// `PluginInfo` and records every status kubelet notifies.
struct TinyRegistration {
    info: PluginInfo,
    notified: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for TinyRegistration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.notified.lock().unwrap().push(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The DRA side of the tiny plugin: prepares every claim as one device.
struct TinyDra;

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for TinyDra {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|claim| {
                let device = dra_v1::Device {
                    pool_name: "tiny-pool".into(),
                    device_name: format!("dev-{}", claim.name),
                    cdi_device_ids: vec![format!("example.com/tiny={}", claim.uid)],
                    ..Default::default()
                };
                let answer = dra_v1::NodePrepareResourceResponse {
                    devices: vec![device],
                    error: String::new(),
                };
                (claim.uid, answer)
            })
            .collect();
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
            .map(|claim| (claim.uid, Default::default()))
            .collect();
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

/// A tonic server on a Unix socket, stopped on drop of `shutdown`.
struct Running {
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

fn own_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn serve(path: &Path, router: tonic::transport::server::Router) -> Running {
    let listener = bind_unix(path, 0o600).unwrap();
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(router.serve_with_incoming_shutdown(
        incoming_for_kubelet(listener, PeerPolicy::allow_uids([own_uid()])),
        async {
            let _ = stopped.await;
        },
    ));
    Running {
        shutdown: Some(shutdown),
        task,
    }
}

/// The tiny plugin: a plugins-registry directory holding its registration
/// socket, and its DRA endpoint socket in a plugin directory next to it.
struct TinyPlugin {
    _root: tempfile::TempDir,
    registry: PathBuf,
    endpoint: PathBuf,
    notified: Arc<Mutex<Vec<RegistrationStatus>>>,
    servers: Vec<Running>,
}

impl TinyPlugin {
    /// Starts the DRA server on the endpoint, then the registration server
    /// answering GetInfo with `info(endpoint)`.
    fn start(info: impl FnOnce(&str) -> PluginInfo) -> TinyPlugin {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join("plugins_registry");
        let endpoint = root.path().join("plugins").join(DRIVER).join("dra.sock");
        let dra = serve(
            &endpoint,
            Server::builder().add_service(dra_v1::dra_plugin_server::DraPluginServer::new(TinyDra)),
        );
        let notified = Arc::new(Mutex::new(Vec::new()));
        let registration = TinyRegistration {
            info: info(endpoint.to_str().unwrap()),
            notified: notified.clone(),
        };
        let registrar = serve(
            &registry.join(format!("{DRIVER}-reg.sock")),
            Server::builder().add_service(RegistrationServer::new(registration)),
        );
        TinyPlugin {
            _root: root,
            registry,
            endpoint,
            notified,
            servers: vec![dra, registrar],
        }
    }

    fn notified(&self) -> Vec<RegistrationStatus> {
        self.notified.lock().unwrap().clone()
    }

    async fn stop(self) {
        for server in self.servers {
            server.stop().await;
        }
    }
}

fn valid_info(endpoint: &str) -> PluginInfo {
    PluginInfo {
        r#type: DRA_PLUGIN_TYPE.into(),
        name: DRIVER.into(),
        endpoint: endpoint.into(),
        supported_versions: vec![DRA_V1_VERSION.into(), DRA_V1BETA1_VERSION.into()],
    }
}

#[tokio::test]
async fn valid_plugin_is_registered_told_so_and_called_on_its_endpoint() {
    let plugin = TinyPlugin::start(valid_info);
    let kubelet = KubeletDra::register(&plugin.registry, DRIVER, DraVersion::V1, WAIT)
        .await
        .expect("a valid plugin registers");

    assert_eq!(
        plugin.notified(),
        vec![RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }]
    );
    assert_eq!(kubelet.version(), DraVersion::V1);
    assert_eq!(kubelet.info, valid_info(plugin.endpoint.to_str().unwrap()));
    assert_eq!(
        kubelet.registration_socket,
        plugin.registry.join(format!("{DRIVER}-reg.sock"))
    );

    // The stand-in talks to the endpoint the plugin advertised.
    let claim = Claim {
        namespace: "default".into(),
        name: "tiny-claim".into(),
        uid: "uid-1".into(),
    };
    let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let outcome = &prepared["uid-1"];
    assert_eq!(outcome.error, "");
    assert_eq!(outcome.devices.len(), 1);
    assert_eq!(outcome.devices[0].pool_name, "tiny-pool");
    assert_eq!(outcome.devices[0].device_name, "dev-tiny-claim");
    assert_eq!(
        outcome.devices[0].cdi_device_ids,
        ["example.com/tiny=uid-1"]
    );
    let unprepared = kubelet.unprepare(&[claim]).await.unwrap();
    assert_eq!(unprepared["uid-1"], "");

    plugin.stop().await;
}

/// Registers a plugin whose GetInfo answers `info`, and checks that it is
/// refused, that the plugin is told so with a reason containing `why`, and
/// that the stand-in reports that same reason.
async fn assert_refused(case: &str, info: impl FnOnce(&str) -> PluginInfo, why: &str) {
    let plugin = TinyPlugin::start(info);
    let result = KubeletDra::register(&plugin.registry, DRIVER, DraVersion::V1, WAIT).await;

    let notified = plugin.notified();
    assert_eq!(notified.len(), 1, "{case}: notifications {notified:?}");
    let status = &notified[0];
    assert!(!status.plugin_registered, "{case}: {status:?}");
    assert!(
        status.error.contains(why),
        "{case}: the plugin was told {:?}, expected it to mention {why:?}",
        status.error
    );
    match result {
        Err(KubeletDraError::Invalid(reported)) => assert_eq!(
            reported, status.error,
            "{case}: the stand-in reports what it told the plugin"
        ),
        Err(other) => panic!("{case}: refused for another reason: {other}"),
        Ok(kubelet) => panic!("{case}: registered {:?}", kubelet.info),
    }
    plugin.stop().await;
}

#[tokio::test]
async fn plugin_of_the_wrong_type_is_refused_and_told_why() {
    assert_refused(
        "CSI plugin",
        |endpoint| PluginInfo {
            r#type: "CSIPlugin".into(),
            ..valid_info(endpoint)
        },
        "no handler registered for plugin type: CSIPlugin",
    )
    .await;
}

#[tokio::test]
async fn plugin_without_supported_versions_is_refused_and_told_why() {
    assert_refused(
        "no supported versions",
        |endpoint| PluginInfo {
            supported_versions: vec![],
            ..valid_info(endpoint)
        },
        "empty list of supported gRPC services",
    )
    .await;
}

#[tokio::test]
async fn plugin_serving_no_dra_service_kubelet_knows_is_refused_and_told_why() {
    assert_refused(
        "gRPC service names instead of versions",
        |endpoint| PluginInfo {
            supported_versions: vec!["k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin".into()],
            ..valid_info(endpoint)
        },
        "none of services supported by the plugin",
    )
    .await;
}

/// Kubelet does not look at the endpoint when it registers a plugin (its
/// gRPC client connects lazily): the registration succeeds and the first
/// call fails.
#[tokio::test]
async fn plugin_whose_endpoint_is_missing_registers_and_its_calls_fail() {
    let plugin = TinyPlugin::start(|endpoint| PluginInfo {
        endpoint: format!("{endpoint}.missing"),
        ..valid_info(endpoint)
    });
    let kubelet = KubeletDra::register(&plugin.registry, DRIVER, DraVersion::V1, WAIT)
        .await
        .expect("registered without looking at the endpoint");
    assert_eq!(
        plugin.notified(),
        vec![RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }]
    );
    let claim = Claim {
        namespace: "default".into(),
        name: "tiny-claim".into(),
        uid: "uid-1".into(),
    };
    match kubelet.prepare(&[claim]).await {
        Err(KubeletDraError::Call { call, .. }) => assert_eq!(call, "NodePrepareResources"),
        other => panic!("a call to a missing endpoint: {other:?}"),
    }
    plugin.stop().await;
}

/// A socket of another driver is asked for its info and left alone: the
/// stand-in plays kubelet for one driver only.
#[tokio::test]
async fn plugin_for_another_driver_is_left_alone() {
    let plugin = TinyPlugin::start(|endpoint| PluginInfo {
        name: "other.example.com".into(),
        ..valid_info(endpoint)
    });
    let wait = Duration::from_secs(1);
    let result = KubeletDra::register(&plugin.registry, DRIVER, DraVersion::V1, wait).await;
    assert!(
        matches!(result, Err(KubeletDraError::NoSocket { .. })),
        "{:?}",
        result.map(|k| k.info)
    );
    assert_eq!(plugin.notified(), vec![]);
    plugin.stop().await;
}
