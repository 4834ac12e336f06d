//! A stand-in NRI runtime: it listens on a Unix socket as containerd does,
//! accepts a plugin's connection, multiplexes it (conn 1: the plugin's
//! `Plugin` service, conn 2: this runtime's `Runtime` service), speaks NRI
//! over ttrpc with the proto crate's types, and keeps every container's
//! cpuset as the plugin's replies and unsolicited updates leave it, the way
//! a runtime applies them. For where a real runtime cannot place containers
//! on the CPUs under test (a sysfs fixture larger than the machine).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use dra_cpu_nri::mux::{Multiplexer, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use dra_cpu_proto::nri::api::{self, Container, ContainerUpdate, PodSandbox};
use dra_cpu_proto::nri::api_ttrpc::{self, PluginClient};
use tokio::net::UnixListener;
use tokio::sync::Notify;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::TtrpcContext;

/// What NRI gives a plugin for one request (containerd's default is 2 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum NriRuntimeError {
    #[error("binding the NRI socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no plugin connected to {path} within {waited:?}")]
    NoPlugin { path: PathBuf, waited: Duration },
    #[error("accepting a plugin on {path}: {source}")]
    Accept {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("multiplexing the plugin's connection: {0}")]
    Mux(#[from] MuxError),
    #[error("the multiplexer did not open the plugin's and the runtime's connections")]
    Connections,
    #[error("starting the Runtime service: {0}")]
    Serve(#[source] ttrpc::Error),
    #[error("the plugin did not call RegisterPlugin within {0:?}")]
    NotRegistered(Duration),
    #[error("{call} to the plugin failed: {source}")]
    Call {
        call: &'static str,
        #[source]
        source: ttrpc::Error,
    },
}

/// A container's cpuset as the runtime holds it; `None` is unpinned.
pub type Cpus = Option<String>;

/// One container update as the plugin sent it: the container and the
/// cpuset it sets (`None`: it sets none).
pub type Update = (String, Cpus);

/// What the runtime knows: the plugin's registration, each container's
/// cpuset, and every container the plugin refused.
#[derive(Debug, Default, Clone)]
pub struct RuntimeState {
    /// `(plugin_name, plugin_idx)` of RegisterPlugin.
    pub registered: Option<(String, String)>,
    pub cpusets: BTreeMap<String, Cpus>,
    /// CreateContainer refusals: container id → the plugin's error.
    pub refused: BTreeMap<String, String>,
    /// Every UpdateContainers request received, in order.
    pub unsolicited: Vec<Vec<Update>>,
    /// Containers whose updates this runtime reports as failed (and does
    /// not apply), as a runtime does for a container it cannot update.
    pub failing: BTreeSet<String>,
    /// How many UpdateContainers calls to come are refused whole, nothing
    /// applied: what containerd answers when a call's deadline passes
    /// before its `runc update`s are done.
    pub refuse_calls: usize,
    /// How many UpdateContainers calls to come are held, received but
    /// neither applied nor answered until [`NriSession::release_held_update`]:
    /// a call whose `runc update`s take long.
    pub hold_calls: usize,
    /// Calls held now.
    pub held: usize,
}

impl RuntimeState {
    /// Apply the plugin's updates in order, as a runtime does; an update of
    /// a failing container is not applied.
    fn apply(&mut self, updates: &[ContainerUpdate]) {
        for u in updates {
            if self.failing.contains(&u.container_id) {
                continue;
            }
            if let Some(cpus) = update_cpus(u) {
                self.cpusets.insert(u.container_id.clone(), Some(cpus));
            }
        }
    }
}

fn lock(state: &Mutex<RuntimeState>) -> MutexGuard<'_, RuntimeState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cpuset an update sets, when it sets one (an empty string is NRI's
/// "leave unchanged").
pub fn update_cpus(u: &ContainerUpdate) -> Option<String> {
    u.linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|c| c.cpus.clone())
        .filter(|c| !c.is_empty())
}

/// `updates` as (container, cpuset) pairs, in order.
pub fn listed(updates: &[ContainerUpdate]) -> Vec<Update> {
    updates
        .iter()
        .map(|u| (u.container_id.clone(), update_cpus(u)))
        .collect()
}

struct RuntimeService {
    state: Arc<Mutex<RuntimeState>>,
    registered: Arc<Notify>,
    release: Arc<Notify>,
}

#[async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        lock(&self.state).registered = Some((req.plugin_name, req.plugin_idx));
        self.registered.notify_one();
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let hold = {
            let mut state = lock(&self.state);
            state.unsolicited.push(listed(&req.update));
            let hold = state.hold_calls > 0;
            if hold {
                state.hold_calls -= 1;
                state.held += 1;
            }
            hold
        };
        if hold {
            self.release.notified().await;
        }
        let mut state = lock(&self.state);
        if hold {
            state.held -= 1;
        }
        if state.refuse_calls > 0 {
            state.refuse_calls -= 1;
            return Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                ttrpc::Code::DEADLINE_EXCEEDED,
                "context deadline exceeded",
            )));
        }
        state.apply(&req.update);
        let mut rsp = api::UpdateContainersResponse::new();
        rsp.failed = req
            .update
            .into_iter()
            .filter(|u| state.failing.contains(&u.container_id))
            .collect();
        Ok(rsp)
    }
}

/// The runtime's listening socket.
pub struct NriRuntime {
    listener: UnixListener,
    path: PathBuf,
}

impl NriRuntime {
    pub fn bind(path: &Path) -> Result<NriRuntime, NriRuntimeError> {
        let listener = UnixListener::bind(path).map_err(|source| NriRuntimeError::Bind {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(NriRuntime {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accept one plugin and wait for its RegisterPlugin.
    pub async fn accept(&self, wait: Duration) -> Result<NriSession, NriRuntimeError> {
        let (stream, _) = tokio::time::timeout(wait, self.listener.accept())
            .await
            .map_err(|_| NriRuntimeError::NoPlugin {
                path: self.path.clone(),
                waited: wait,
            })?
            .map_err(|source| NriRuntimeError::Accept {
                path: self.path.clone(),
                source,
            })?;
        let (mux, conns) =
            Multiplexer::start(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN])?;
        let mut conns = conns.into_iter();
        let (Some(plugin_conn), Some(runtime_conn)) = (conns.next(), conns.next()) else {
            return Err(NriRuntimeError::Connections);
        };
        let state = Arc::new(Mutex::new(RuntimeState::default()));
        let registered = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let accepted = futures::stream::once(async move { Ok::<_, std::io::Error>(runtime_conn) });
        let mut server = ttrpc::r#async::Server::new()
            .add_listener(Listener::new(futures::StreamExt::chain(
                accepted,
                futures::stream::pending(),
            )))
            .register_service(api_ttrpc::create_runtime(Arc::new(RuntimeService {
                state: state.clone(),
                registered: registered.clone(),
                release: release.clone(),
            })));
        server.start().await.map_err(NriRuntimeError::Serve)?;
        let plugin = PluginClient::new(ttrpc::r#async::Client::new(Socket::new(plugin_conn)));
        tokio::time::timeout(wait, registered.notified())
            .await
            .map_err(|_| NriRuntimeError::NotRegistered(wait))?;
        Ok(NriSession {
            plugin,
            state,
            release,
            _server: server,
            _mux: mux,
        })
    }
}

/// The runtime's end of one registered plugin.
pub struct NriSession {
    plugin: PluginClient,
    state: Arc<Mutex<RuntimeState>>,
    release: Arc<Notify>,
    _server: ttrpc::r#async::Server,
    _mux: Multiplexer,
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_duration(REQUEST_TIMEOUT)
}

impl NriSession {
    /// Configure, as a runtime with these names and NRI version would.
    pub async fn configure(
        &self,
        runtime_name: &str,
        runtime_version: &str,
        nri_version: &str,
    ) -> Result<(), NriRuntimeError> {
        let mut req = api::ConfigureRequest::new();
        req.runtime_name = runtime_name.into();
        req.runtime_version = runtime_version.into();
        req.NRI_version = nri_version.into();
        req.registration_timeout = 5000;
        req.request_timeout = REQUEST_TIMEOUT.as_millis() as i64;
        self.plugin
            .configure(ctx(), &req)
            .await
            .map_err(|source| NriRuntimeError::Call {
                call: "Configure",
                source,
            })?;
        Ok(())
    }

    /// Synchronize with running `containers` (their cpusets as given) and
    /// apply the plugin's reply. Returns the updates it carried.
    pub async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<Update>, NriRuntimeError> {
        {
            let mut state = lock(&self.state);
            for c in &containers {
                state.cpusets.insert(c.id.clone(), container_cpus(c));
            }
        }
        let mut req = api::SynchronizeRequest::new();
        req.pods = pods;
        req.containers = containers;
        let rsp = self
            .plugin
            .synchronize(ctx(), &req)
            .await
            .map_err(|source| NriRuntimeError::Call {
                call: "Synchronize",
                source,
            })?;
        lock(&self.state).apply(&rsp.update);
        Ok(listed(&rsp.update))
    }

    /// CreateContainer: the container gets the reply's adjustment (or keeps
    /// its own cpuset), the reply's updates apply to the others. A refusal
    /// is recorded, not returned: it is the plugin's answer, not a fault of
    /// the runtime (the reply is then empty).
    pub async fn create_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<CreateReply, NriRuntimeError> {
        let id = container.id.clone();
        let own = container_cpus(&container);
        let mut req = api::CreateContainerRequest::new();
        req.pod = Some(pod).into();
        req.container = Some(container).into();
        match self.plugin.create_container(ctx(), &req).await {
            Ok(rsp) => {
                let adjusted = rsp
                    .adjust
                    .as_ref()
                    .and_then(|a| a.linux.as_ref())
                    .and_then(|l| l.resources.as_ref())
                    .and_then(|r| r.cpu.as_ref())
                    .map(|c| c.cpus.clone())
                    .filter(|c| !c.is_empty());
                let cpus = adjusted.or(own);
                let mut state = lock(&self.state);
                state.cpusets.insert(id, cpus.clone());
                state.apply(&rsp.update);
                Ok(CreateReply {
                    cpus,
                    updates: listed(&rsp.update),
                })
            }
            Err(ttrpc::Error::RpcStatus(status)) => {
                lock(&self.state)
                    .refused
                    .insert(id, status.message().to_string());
                Ok(CreateReply::default())
            }
            Err(source) => Err(NriRuntimeError::Call {
                call: "CreateContainer",
                source,
            }),
        }
    }

    /// RemoveContainer: the container is gone.
    pub async fn remove_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<(), NriRuntimeError> {
        let id = container.id.clone();
        let mut req = api::RemoveContainerRequest::new();
        req.pod = Some(pod).into();
        req.container = Some(container).into();
        self.plugin
            .remove_container(ctx(), &req)
            .await
            .map_err(|source| NriRuntimeError::Call {
                call: "RemoveContainer",
                source,
            })?;
        lock(&self.state).cpusets.remove(&id);
        Ok(())
    }

    /// From now on, report every update of container `id` as failed.
    pub fn fail_updates_of(&self, id: &str) {
        lock(&self.state).failing.insert(id.to_string());
    }

    /// Refuse the next `calls` UpdateContainers calls whole.
    pub fn refuse_update_calls(&self, calls: usize) {
        lock(&self.state).refuse_calls = calls;
    }

    /// Hold the next `calls` UpdateContainers calls: received (listed in
    /// `unsolicited`), applied and answered only when released.
    pub fn hold_update_calls(&self, calls: usize) {
        lock(&self.state).hold_calls = calls;
    }

    /// Let one held UpdateContainers call go on.
    pub fn release_held_update(&self) {
        self.release.notify_one();
    }

    /// What the runtime knows now.
    pub fn state(&self) -> RuntimeState {
        lock(&self.state).clone()
    }
}

/// The plugin's reply to CreateContainer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CreateReply {
    /// The container's cpuset: the reply's adjustment, else its own.
    pub cpus: Cpus,
    /// The updates of other containers the reply carried.
    pub updates: Vec<Update>,
}

/// A pod sandbox whose id is its UID.
pub fn pod(uid: &str, name: &str, namespace: &str) -> PodSandbox {
    let mut p = PodSandbox::new();
    p.id = uid.into();
    p.uid = uid.into();
    p.name = name.into();
    p.namespace = namespace.into();
    p
}

/// A running container of pod `pod_id` with environment `env`, CPU shares
/// (the request kubelet turns into `cpu.shares`) and cpuset (`""`: none).
pub fn container(
    id: &str,
    name: &str,
    pod_id: &str,
    env: &[String],
    shares: u64,
    cpus: &str,
) -> Container {
    let mut c = Container::new();
    c.id = id.into();
    c.name = name.into();
    c.pod_sandbox_id = pod_id.into();
    c.env = env.to_vec();
    c.state = api::ContainerState::CONTAINER_RUNNING.into();
    let mut cpu = api::LinuxCPU::new();
    let mut s = api::OptionalUInt64::new();
    s.value = shares;
    cpu.shares = Some(s).into();
    cpu.cpus = cpus.into();
    let mut res = api::LinuxResources::new();
    res.cpu = Some(cpu).into();
    let mut linux = api::LinuxContainer::new();
    linux.resources = Some(res).into();
    c.linux = Some(linux).into();
    c
}

/// A container's own cpuset as the runtime reports it.
fn container_cpus(c: &Container) -> Cpus {
    c.linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|c| c.cpus.clone())
        .filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(id: &str, cpus: &str) -> ContainerUpdate {
        let mut cpu = api::LinuxCPU::new();
        cpu.cpus = cpus.into();
        let mut res = api::LinuxResources::new();
        res.cpu = Some(cpu).into();
        let mut linux = api::LinuxContainerUpdate::new();
        linux.resources = Some(res).into();
        let mut u = ContainerUpdate::new();
        u.container_id = id.into();
        u.linux = Some(linux).into();
        u
    }

    #[test]
    fn updates_apply_in_order_and_an_empty_cpuset_changes_nothing() {
        let mut state = RuntimeState::default();
        state.cpusets.insert("a".into(), None);
        state.apply(&[update("a", "0-3"), update("b", "4"), update("a", "1")]);
        state.apply(&[update("b", "")]);
        assert_eq!(state.cpusets.get("a"), Some(&Some("1".to_string())));
        assert_eq!(state.cpusets.get("b"), Some(&Some("4".to_string())));
    }

    #[test]
    fn a_failing_containers_updates_are_not_applied() {
        let mut state = RuntimeState::default();
        state.failing.insert("a".into());
        state.apply(&[update("a", "0-3"), update("b", "4")]);
        assert_eq!(state.cpusets.get("a"), None);
        assert_eq!(state.cpusets.get("b"), Some(&Some("4".to_string())));
        assert_eq!(
            listed(&[update("a", "0-3"), update("b", "")]),
            vec![
                ("a".to_string(), Some("0-3".to_string())),
                ("b".to_string(), None)
            ]
        );
    }

    #[test]
    fn a_containers_own_cpuset_is_read_back() {
        let c = container("x", "n", "p", &[], 2, "2-3");
        assert_eq!(container_cpus(&c), Some("2-3".to_string()));
        assert_eq!(container_cpus(&container("y", "n", "p", &[], 2, "")), None);
    }
}
