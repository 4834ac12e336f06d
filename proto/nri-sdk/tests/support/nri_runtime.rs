//! An in-process NRI runtime for the NRI client's tests and benchmarks: the
//! runtime end of a socket pair, multiplexed as containerd does (conn 1: a
//! `Plugin` client, conn 2: this runtime's `Runtime` service), with the
//! client under test registered on the other end.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dra_cpu_nri::client::{NriClient, NriClientOptions};
use dra_cpu_nri::events::EventMask;
use dra_cpu_nri::mux::{Multiplexer, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use dra_cpu_nri::plugin::{ContainerCreation, NriPlugin, PluginError};
use dra_cpu_proto::nri::api::{self, Container, ContainerUpdate, Event, PodSandbox};
use dra_cpu_proto::nri::api_ttrpc::{self, PluginClient};
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::TtrpcContext;

/// What the runtime received on its `Runtime` service.
#[derive(Default)]
pub struct RuntimeLog {
    /// `(plugin_name, plugin_idx)` of every RegisterPlugin.
    pub registrations: Vec<(String, String)>,
    /// Every UpdateContainers request, in order.
    pub updates: Vec<Vec<ContainerUpdate>>,
}

struct RuntimeService(Arc<Mutex<RuntimeLog>>);

#[async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        self.0
            .lock()
            .unwrap()
            .registrations
            .push((req.plugin_name, req.plugin_idx));
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let mut rsp = api::UpdateContainersResponse::new();
        // The runtime reports updates of unknown containers as failed.
        rsp.failed = req
            .update
            .iter()
            .filter(|u| u.container_id.starts_with("unknown"))
            .cloned()
            .collect();
        self.0.lock().unwrap().updates.push(req.update);
        Ok(rsp)
    }
}

/// The runtime's end of one registered client.
pub struct InProcessRuntime {
    pub plugin: PluginClient,
    pub log: Arc<Mutex<RuntimeLog>>,
    _server: ttrpc::r#async::Server,
    _mux: Multiplexer,
}

/// Connects an [`NriClient`] serving `plugin` with `options` to a new
/// in-process runtime, registered.
pub async fn connect<P: NriPlugin>(
    plugin: Arc<P>,
    options: &NriClientOptions,
) -> (InProcessRuntime, NriClient) {
    let (plugin_end, runtime_end) = tokio::net::UnixStream::pair().unwrap();
    let (mux, mut conns) =
        Multiplexer::start(runtime_end, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]).unwrap();
    let runtime_conn = conns.pop().unwrap();
    let plugin_conn = conns.pop().unwrap();
    let log = Arc::new(Mutex::new(RuntimeLog::default()));
    let accepted = futures::stream::once(async move { Ok::<_, std::io::Error>(runtime_conn) });
    let mut server = ttrpc::r#async::Server::new()
        .add_listener(Listener::new(futures::StreamExt::chain(
            accepted,
            futures::stream::pending(),
        )))
        .register_service(api_ttrpc::create_runtime(Arc::new(RuntimeService(
            log.clone(),
        ))));
    server.start().await.unwrap();
    let plugin_client = PluginClient::new(ttrpc::r#async::Client::new(Socket::new(plugin_conn)));
    let client = NriClient::over(plugin_end, plugin, options).await.unwrap();
    (
        InProcessRuntime {
            plugin: plugin_client,
            log,
            _server: server,
            _mux: mux,
        },
        client,
    )
}

/// A plugin subscribed to container creation alone, answering every
/// creation with what its function makes.
pub struct CreateOnly(pub fn() -> ContainerCreation);

#[async_trait]
impl NriPlugin for CreateOnly {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER])
    }
    async fn create_container(
        &self,
        _pod: PodSandbox,
        _c: Container,
    ) -> Result<ContainerCreation, PluginError> {
        Ok((self.0)())
    }
}
