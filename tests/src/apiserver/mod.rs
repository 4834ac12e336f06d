//! A fake Kubernetes API server on 127.0.0.1 for tests: the product talks to
//! it through its real kube client and a kubeconfig, on the real REST paths
//! and JSON (discovery, resourceVersions, uids, watch events with bookmarks,
//! merge patch and server-side apply, 404/409/422 `Status` answers).
//!
//! It serves `resource.k8s.io/v1` ResourceSlices (create, get, list, watch,
//! update, patch, delete, with label and `spec.nodeName`/`spec.driver` field
//! selectors), ResourceClaims (get, list, watch, status), DeviceClasses and
//! core `v1` Nodes. Tests play the scheduler by setting claim status, and can
//! change slices behind the product's back. Every object body received is
//! recorded so tests can check it against the real schemas
//! ([`schema::validate_k8s_objects`]).
//!
//! It plays one Kubernetes release, 1.34 to 1.37, with its feature gates
//! ([`FakeApiServerOptions::for_version`], [`FakeApiServerOptions::parse`]):
//! an apply naming a ResourceSlice field that release's schema does not
//! declare gets the real HTTP 500, fields of disabled gates are dropped,
//! `/version` and `/openapi/v3/apis/resource.k8s.io/v1` answer for the
//! release, unsupported field selectors are a 400, empty lists and
//! non-canonical quantities come back as the real server stores them, and
//! [`FakeApiServer::expire_watches`] ends watches with an in-stream 410.

mod patch;
mod quantity;
mod rest;
pub mod schema;
mod selector;
pub mod store;
mod validate;
pub mod version;

use self::rest::{handle, lock, Shared};
use self::store::error::ApiError;
use self::store::resource_types::Subresource;
use self::store::resource_types::{DEVICE_CLASSES, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES};
use self::store::Store;
use self::version::{FeatureGates, KubernetesVersion, UnsupportedVersion};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimStatus, ResourceSlice,
};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request body the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub method: String,
    /// Path and query, e.g. `/apis/resource.k8s.io/v1/resourceslices/x?fieldManager=dra.cpu`.
    pub path: String,
    pub content_type: Option<String>,
    /// The body parsed from JSON (or YAML for apply patches); unparsable
    /// bodies are kept as a JSON string.
    pub body: Value,
}

/// One request line the server saw (every method, bodies or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLine {
    pub method: String,
    /// Path and decoded-as-sent query.
    pub path: String,
}

impl Received {
    pub fn kind(&self) -> Option<&str> {
        self.body.get("kind").and_then(Value::as_str)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FakeApiServerError {
    #[error("binding the fake API server to {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("starting the fake API server's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("writing the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("loading the kubeconfig {path}: {reason}")]
    KubeConfigLoad { path: PathBuf, reason: String },
    #[error("building a kube client from {path}: {source}")]
    Client { path: PathBuf, source: kube::Error },
    #[error("the fake API server refused {what}: {} ({})", .error.message, .error.code)]
    Refused { what: String, error: ApiError },
    #[error("converting {what}: {source}")]
    Convert {
        what: String,
        source: serde_json::Error,
    },
}

/// Options for [`FakeApiServer::start_with`].
#[derive(Debug, Clone)]
pub struct FakeApiServerOptions {
    /// How often a watch that allows bookmarks gets a BOOKMARK event.
    pub bookmark_interval: Duration,
    /// The release played (`--kubernetes-version`): schema, `/version`,
    /// `/openapi/v3`.
    pub kubernetes_version: KubernetesVersion,
    /// Its feature gates (`--feature-gates`).
    pub feature_gates: FeatureGates,
}

impl Default for FakeApiServerOptions {
    /// A 1.37 server with `DRANodeAllocatableResources` and
    /// `DRAListTypeAttributes` on (off by default in 1.37, where they are
    /// alpha): the release the driver's full contract
    /// needs. [`FakeApiServerOptions::for_version`] gives a release's
    /// defaults.
    fn default() -> Self {
        FakeApiServerOptions {
            bookmark_interval: Duration::from_secs(1),
            kubernetes_version: KubernetesVersion::V1_37,
            feature_gates: FeatureGates {
                dra_consumable_capacity: true,
                dra_node_allocatable_resources: true,
                dra_list_type_attributes: true,
            },
        }
    }
}

impl FakeApiServerOptions {
    /// `version` with its default feature gates.
    pub fn for_version(version: KubernetesVersion) -> Self {
        FakeApiServerOptions {
            kubernetes_version: version,
            feature_gates: FeatureGates::defaults(version),
            ..Default::default()
        }
    }

    /// `version` with `--feature-gates`-style overrides of its defaults
    /// (`DRAConsumableCapacity=true,...`).
    pub fn parse(version: &str, feature_gates: &str) -> Result<Self, String> {
        let version: KubernetesVersion = version
            .parse()
            .map_err(|e: UnsupportedVersion| e.to_string())?;
        let mut options = Self::for_version(version);
        options.feature_gates = options.feature_gates.with_flags(feature_gates)?;
        Ok(options)
    }
}

/// A running fake API server; dropping it stops the server.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts a server on 127.0.0.1 with a free port, on its own thread and
    /// runtime (so it serves sync and async tests alike), and writes a
    /// kubeconfig pointing at it.
    pub fn start() -> Result<FakeApiServer, FakeApiServerError> {
        Self::start_with(FakeApiServerOptions::default())
    }

    pub fn start_with(options: FakeApiServerOptions) -> Result<FakeApiServer, FakeApiServerError> {
        let bind_addr = "127.0.0.1:0";
        let bind_error = |source| FakeApiServerError::Bind {
            addr: bind_addr.to_string(),
            source,
        };
        let listener = std::net::TcpListener::bind(bind_addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let store = Store::for_version(options.kubernetes_version, options.feature_gates);
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            received: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            bookmark_interval: options.bookmark_interval,
            server_address: addr.to_string(),
            version_answer: Mutex::new(None),
            expiry: tokio::sync::watch::channel(0).0,
            compacted: Mutex::new(0),
        });
        let dir = tempfile::tempdir().map_err(FakeApiServerError::Runtime)?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&format!("http://{addr}"))).map_err(
            |source| FakeApiServerError::Kubeconfig {
                path: kubeconfig.clone(),
                source,
            },
        )?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(FakeApiServerError::Runtime)?;
        let (shutdown, mut shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fake-apiserver".to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(_) => return,
                    };
                    loop {
                        tokio::select! {
                            _ = &mut shutdown_rx => break,
                            accepted = listener.accept() => {
                                let Ok((stream, _)) = accepted else { continue };
                                let shared = serving.clone();
                                tokio::spawn(async move {
                                    let service = service_fn(move |request| handle(shared.clone(), request));
                                    // A client hanging up mid-request is not the server's failure.
                                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                                });
                            }
                        }
                    }
                });
            })
            .map_err(FakeApiServerError::Runtime)?;
        Ok(FakeApiServer {
            shared,
            addr,
            kubeconfig,
            _dir: dir,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig (no TLS, a dummy token) whose current context points here.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kube client built from [`Self::kubeconfig_path`] by kube's own
    /// kubeconfig loading, as the product builds its client.
    pub async fn client(&self) -> Result<kube::Client, FakeApiServerError> {
        let path = self.kubeconfig.clone();
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).map_err(|e| {
            FakeApiServerError::KubeConfigLoad {
                path: path.clone(),
                reason: e.to_string(),
            }
        })?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| FakeApiServerError::KubeConfigLoad {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        kube::Client::try_from(config).map_err(|source| FakeApiServerError::Client { path, source })
    }

    /// From now on, derive each created object's uid from `seed` and the
    /// object's kind, namespace and name, so a server started again after a
    /// reboot gives recreated claims the uids a driver stored before.
    pub fn seed_uids(&self, seed: u64) {
        lock(&self.shared.store).seed_uids(seed);
    }

    /// Creates a Node (with a uid, as slices' owner references need).
    pub fn insert_node(&self, name: &str) -> Result<Node, FakeApiServerError> {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
        let created = lock(&self.shared.store)
            .create(&NODES, "", node, None, false)
            .map_err(refused(format!("node {name}")))?;
        typed(created, &format!("node {name}"))
    }

    pub fn insert_device_class(
        &self,
        class: DeviceClass,
    ) -> Result<DeviceClass, FakeApiServerError> {
        let what = format!(
            "device class {}",
            class.metadata.name.as_deref().unwrap_or("")
        );
        let value = serde_json::to_value(&class).map_err(|source| FakeApiServerError::Convert {
            what: what.clone(),
            source,
        })?;
        let created = lock(&self.shared.store)
            .create(&DEVICE_CLASSES, "", value, None, false)
            .map_err(refused(what.clone()))?;
        typed(created, &what)
    }

    /// Creates a ResourceClaim in its `metadata.namespace` ("default" if unset).
    pub fn insert_claim(&self, claim: ResourceClaim) -> Result<ResourceClaim, FakeApiServerError> {
        let ns = claim
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let what = format!(
            "claim {ns}/{}",
            claim.metadata.name.as_deref().unwrap_or("")
        );
        let mut value =
            serde_json::to_value(&claim).map_err(|source| FakeApiServerError::Convert {
                what: what.clone(),
                source,
            })?;
        let status = value.as_object_mut().and_then(|m| m.remove("status"));
        let mut store = lock(&self.shared.store);
        let created = store
            .create(&RESOURCE_CLAIMS, &ns, value, None, false)
            .map_err(refused(what.clone()))?;
        let result = match status {
            Some(status) if !status.is_null() => {
                let mut with_status = created;
                with_status["status"] = status;
                let name = claim.metadata.name.as_deref().unwrap_or("");
                store
                    .update(
                        &RESOURCE_CLAIMS,
                        &ns,
                        name,
                        with_status,
                        Subresource::Status,
                        None,
                        false,
                    )
                    .map_err(refused(what.clone()))?
            }
            _ => created,
        };
        typed(result, &what)
    }

    /// Sets a claim's status (allocation and reservedFor), as the scheduler does.
    pub fn set_claim_status(
        &self,
        namespace: &str,
        name: &str,
        status: ResourceClaimStatus,
    ) -> Result<ResourceClaim, FakeApiServerError> {
        let what = format!("status of claim {namespace}/{name}");
        let status =
            serde_json::to_value(&status).map_err(|source| FakeApiServerError::Convert {
                what: what.clone(),
                source,
            })?;
        let mut store = lock(&self.shared.store);
        let mut claim = store
            .get(&RESOURCE_CLAIMS, namespace, name)
            .map_err(refused(what.clone()))?;
        claim["status"] = status;
        let updated = store
            .update(
                &RESOURCE_CLAIMS,
                namespace,
                name,
                claim,
                Subresource::Status,
                Some(("kube-scheduler", "Update")),
                false,
            )
            .map_err(refused(what.clone()))?;
        typed(updated, &what)
    }

    pub fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, FakeApiServerError> {
        let what = format!("claim {namespace}/{name}");
        let claim = lock(&self.shared.store)
            .get(&RESOURCE_CLAIMS, namespace, name)
            .map_err(refused(what.clone()))?;
        typed(claim, &what)
    }

    /// The devices named in the allocation results of every stored claim.
    pub fn allocated_devices(&self) -> Vec<String> {
        lock(&self.shared.store)
            .list(&RESOURCE_CLAIMS, &Default::default())
            .iter()
            .filter_map(|c| {
                c.pointer("/status/allocation/devices/results")
                    .and_then(Value::as_array)
            })
            .flatten()
            .filter_map(|r| r.get("device").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// The ResourceSlices stored now, ordered by name.
    pub fn slices(&self) -> Vec<ResourceSlice> {
        let values = lock(&self.shared.store).list(&RESOURCE_SLICES, &Default::default());
        values
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// The stored ResourceSlices as raw JSON, as a client would read them.
    pub fn slice_values(&self) -> Vec<Value> {
        lock(&self.shared.store).list(&RESOURCE_SLICES, &Default::default())
    }

    /// Every request body received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.received).clone()
    }

    /// The received bodies that are whole objects of `kind` (creates, updates
    /// and apply configurations; merge patches carry no kind).
    pub fn received_objects(&self, kind: &str) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|r| r.kind() == Some(kind))
            .map(|r| r.body)
            .collect()
    }

    pub fn clear_received(&self) {
        lock(&self.shared.received).clear();
        lock(&self.shared.requests).clear();
    }

    /// Every request line seen so far (including GETs and watches), in order.
    pub fn requests(&self) -> Vec<RequestLine> {
        lock(&self.shared.requests).clone()
    }

    /// Answers the next `times` requests with `method` whose path and query
    /// contain `path_contains` with an error `Status` of `code` (e.g. 500,
    /// 503, 409), to test the product's retries.
    pub fn fail_next(&self, method: &str, path_contains: &str, code: u16, times: usize) {
        lock(&self.shared.faults).push(rest::Fault {
            method: method.to_string(),
            path_contains: path_contains.to_string(),
            code,
            remaining: times,
        });
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).resource_version()
    }

    /// Deletes a slice as another actor would (watches see DELETED).
    pub fn delete_slice_behind_back(&self, name: &str) -> Result<(), FakeApiServerError> {
        lock(&self.shared.store)
            .delete(&RESOURCE_SLICES, "", name, None, None, false)
            .map(|_| ())
            .map_err(refused(format!("deleting slice {name}")))
    }

    /// Changes a slice as another actor would (watches see MODIFIED).
    pub fn mutate_slice_behind_back(
        &self,
        name: &str,
        mutate: impl FnOnce(&mut ResourceSlice),
    ) -> Result<ResourceSlice, FakeApiServerError> {
        let what = format!("slice {name}");
        let mut store = lock(&self.shared.store);
        let current = store
            .get(&RESOURCE_SLICES, "", name)
            .map_err(refused(what.clone()))?;
        let mut slice: ResourceSlice = typed(current, &what)?;
        mutate(&mut slice);
        let value = serde_json::to_value(&slice).map_err(|source| FakeApiServerError::Convert {
            what: what.clone(),
            source,
        })?;
        let updated = store
            .update(
                &RESOURCE_SLICES,
                "",
                name,
                value,
                Subresource::Main,
                Some(("someone-else", "Update")),
                false,
            )
            .map_err(refused(what.clone()))?;
        typed(updated, &what)
    }

    /// Switches the `DRANodeAllocatableResources` behaviour for later writes.
    pub fn set_node_allocatable_resources(&self, enabled: bool) {
        lock(&self.shared.store)
            .gates
            .dra_node_allocatable_resources = enabled;
    }

    /// Switches the `DRAConsumableCapacity` behaviour for later writes.
    pub fn set_consumable_capacity(&self, enabled: bool) {
        lock(&self.shared.store).gates.dra_consumable_capacity = enabled;
    }

    /// Makes `/version` claim `v1.<minor>.<rest>` (e.g. a 1.37.0-beta.0
    /// whose schema is still 1.36's) while the schema stays the release's.
    pub fn set_version_answer(&self, minor: u32, git_version: &str) {
        *lock(&self.shared.version_answer) = Some(json!({"major": "1",
            "minor": minor.to_string(), "gitVersion": git_version, "platform": "linux/amd64"}));
    }

    /// Ends every open watch as a real server does when the resource
    /// version it follows is compacted away: an ERROR event carrying a 410
    /// Expired `Status` inside the stream, then the end of the stream. A
    /// watch started afterwards from an older resource version gets the
    /// same at once; clients list again.
    pub fn expire_watches(&self) {
        let current = lock(&self.shared.store).resource_version();
        *lock(&self.shared.compacted) = current;
        self.shared.expiry.send_modify(|n| *n += 1);
    }

    /// The release this server plays.
    pub fn kubernetes_version(&self) -> KubernetesVersion {
        lock(&self.shared.store).version()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn refused(what: String) -> impl FnOnce(ApiError) -> FakeApiServerError {
    move |error| FakeApiServerError::Refused { what, error }
}

fn typed<T: k8s_openapi::serde::de::DeserializeOwned>(
    value: Value,
    what: &str,
) -> Result<T, FakeApiServerError> {
    serde_json::from_value(value).map_err(|source| FakeApiServerError::Convert {
        what: what.to_string(),
        source,
    })
}

/// The devices of a ResourceSlice, to change in place.
fn slice_devices_mut(slice: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    slice
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {server}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: default
current-context: fake
users:
- name: fake
  user:
    token: fake-token
"
    )
}
