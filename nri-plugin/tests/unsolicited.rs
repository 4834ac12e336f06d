//! How a pool change reaches running containers, end to end through the
//! real plugin (`DraCpuPlugin`, `Enforcer`, `run_with_reconnect`) and a fake
//! NRI runtime speaking ttrpc over the multiplexed Unix socket. A runtime
//! with NRI ≥ 0.12.1 (or `--unsolicited-updates=always`) gets the change as
//! an unsolicited `UpdateContainers` right away; any other runtime (or
//! `never`) gets it in the reply to its next event. An update the runtime
//! reports as failed stays due and rides on the next reply.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dra_cpu_proto::nri::api::{self, Container, ContainerUpdate, PodSandbox};
use dra_cpu_proto::nri::api_ttrpc::{self, PluginClient};
use dra_cpu_proto::nri::mux::{Multiplexer, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use dra_cpu_proto::nri::{run_with_reconnect, NriClientOptions, NriUpdater, SocketSource};
use nri_plugin::config::UnsolicitedUpdates;
use nri_plugin::enforcer::Enforcer;
use nri_plugin::metrics::Metrics;
use nri_plugin::nri::DraCpuPlugin;
use nri_plugin::resolve::{ClaimResolver, Resolution};
use nri_plugin::view::NodeView;
use shared_state::{ClaimAssignment, CpuSet};
use tokio::sync::Notify;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::TtrpcContext;

/// Claim of the running mixed container `m`.
const CLAIM_A: &str = "a0a0a0a0-0000-4000-8000-00000000000a";
/// Claim prepared and unprepared during the test, used by container `b`.
const CLAIM_B: &str = "b0b0b0b0-0000-4000-8000-00000000000b";
const POD_M: &str = "11111111-0000-4000-8000-000000000001";
const POD_B: &str = "22222222-0000-4000-8000-000000000002";
const POD_S: &str = "33333333-0000-4000-8000-000000000003";

fn set(s: &str) -> CpuSet {
    CpuSet::parse_cpulist(s).expect("cpulist")
}

fn claim(uid: &str, cpus: &str, pod: &str) -> ClaimAssignment {
    ClaimAssignment {
        claim_uid: uid.into(),
        namespace: "ns".into(),
        name: "claim".into(),
        consumer_pods: vec![pod.into()],
        devices: Vec::new(),
        cpus: set(cpus),
        prepared_at_unix_ms: 0,
        pod_claim_name: None,
    }
}

/// Every claim the test uses is handed to the view directly.
struct NoLookups;

#[async_trait]
impl ClaimResolver for NoLookups {
    async fn resolve(&self, _claim_uid: &str) -> Resolution {
        Resolution::NotPrepared
    }
}

/// What the fake runtime's `Runtime` service saw, and how it answers.
#[derive(Default)]
struct RuntimeLog {
    registered: bool,
    updates: Vec<Vec<(String, String)>>,
    /// Containers whose updates the runtime reports as failed.
    fail: HashSet<String>,
}

struct FakeRuntimeService {
    log: Arc<Mutex<RuntimeLog>>,
    registered: Arc<Notify>,
}

fn cpus_of(u: &ContainerUpdate) -> String {
    u.linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|c| c.cpus.clone())
        .unwrap_or_default()
}

fn listed(updates: &[ContainerUpdate]) -> Vec<(String, String)> {
    updates
        .iter()
        .map(|u| (u.container_id.clone(), cpus_of(u)))
        .collect()
}

#[async_trait]
impl api_ttrpc::Runtime for FakeRuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        self.log.lock().unwrap().registered = true;
        self.registered.notify_one();
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let mut log = self.log.lock().unwrap();
        let mut rsp = api::UpdateContainersResponse::new();
        rsp.failed = req
            .update
            .iter()
            .filter(|u| log.fail.contains(&u.container_id))
            .cloned()
            .collect();
        log.updates.push(listed(&req.update));
        Ok(rsp)
    }
}

/// The runtime end of one accepted plugin connection.
struct FakeRuntime {
    plugin: PluginClient,
    log: Arc<Mutex<RuntimeLog>>,
    _server: ttrpc::r#async::Server,
    _mux: Multiplexer,
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_duration(Duration::from_secs(5))
}

impl FakeRuntime {
    /// Accepts the plugin on `listener` and waits for its registration.
    async fn accept(listener: &tokio::net::UnixListener) -> FakeRuntime {
        let (stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("the plugin connects")
            .expect("accept");
        let (mux, mut conns) =
            Multiplexer::start(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]).unwrap();
        let runtime_conn = conns.pop().unwrap();
        let plugin_conn = conns.pop().unwrap();
        let log = Arc::new(Mutex::new(RuntimeLog::default()));
        let registered = Arc::new(Notify::new());
        let accepted = futures::stream::once(async move { Ok::<_, std::io::Error>(runtime_conn) });
        let mut server = ttrpc::r#async::Server::new()
            .add_listener(Listener::new(futures::StreamExt::chain(
                accepted,
                futures::stream::pending(),
            )))
            .register_service(api_ttrpc::create_runtime(Arc::new(FakeRuntimeService {
                log: log.clone(),
                registered: registered.clone(),
            })));
        server.start().await.unwrap();
        let plugin = PluginClient::new(ttrpc::r#async::Client::new(Socket::new(plugin_conn)));
        tokio::time::timeout(Duration::from_secs(10), registered.notified())
            .await
            .expect("RegisterPlugin");
        FakeRuntime {
            plugin,
            log,
            _server: server,
            _mux: mux,
        }
    }

    fn unsolicited(&self) -> Vec<Vec<(String, String)>> {
        self.log.lock().unwrap().updates.clone()
    }

    async fn configure(&self, name: &str, version: &str, nri_version: &str) {
        let mut req = api::ConfigureRequest::new();
        req.runtime_name = name.into();
        req.runtime_version = version.into();
        req.NRI_version = nri_version.into();
        req.registration_timeout = 5000;
        req.request_timeout = 2000;
        self.plugin.configure(ctx(), &req).await.expect("Configure");
    }

    async fn synchronize(&self, containers: Vec<Container>) -> Vec<(String, String)> {
        let mut req = api::SynchronizeRequest::new();
        req.pods = [POD_S, POD_M].iter().map(|uid| pod(uid)).collect();
        req.containers = containers;
        let rsp = self
            .plugin
            .synchronize(ctx(), &req)
            .await
            .expect("Synchronize");
        listed(&rsp.update)
    }

    /// CreateContainer: the new container's cpuset and the other updates.
    async fn create(&self, c: Container) -> (String, Vec<(String, String)>) {
        let mut req = api::CreateContainerRequest::new();
        req.pod = Some(pod(&pod_uid_of(&c))).into();
        req.container = Some(c).into();
        let rsp = self
            .plugin
            .create_container(ctx(), &req)
            .await
            .expect("CreateContainer");
        let own = rsp
            .adjust
            .as_ref()
            .and_then(|a| a.linux.as_ref())
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.cpu.as_ref())
            .map(|c| c.cpus.clone())
            .unwrap_or_default();
        (own, listed(&rsp.update))
    }

    async fn remove(&self, c: Container) {
        let mut req = api::RemoveContainerRequest::new();
        req.pod = Some(pod(&pod_uid_of(&c))).into();
        req.container = Some(c).into();
        self.plugin
            .remove_container(ctx(), &req)
            .await
            .expect("RemoveContainer");
    }
}

/// Pod sandboxes are named by their UID in this test.
fn pod(uid: &str) -> PodSandbox {
    let mut p = PodSandbox::new();
    p.id = uid.into();
    p.uid = uid.into();
    p.name = format!("pod-{}", &uid[..8]);
    p.namespace = "ns".into();
    p
}

fn pod_uid_of(c: &Container) -> String {
    c.pod_sandbox_id.clone()
}

fn container(id: &str, pod_uid: &str, env: &[String], shares: u64, cpus: &str) -> Container {
    let mut c = Container::new();
    c.id = id.into();
    c.name = format!("name-{id}");
    c.pod_sandbox_id = pod_uid.into();
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

fn updates(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(id, cpus)| (id.to_string(), cpus.to_string()))
        .collect()
}

async fn wait_connected(updater: &NriUpdater) {
    for _ in 0..500 {
        if updater.is_connected() && updater.runtime_info().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the plugin never recorded its runtime connection");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Unsolicited,
    Deferred,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Unsolicited => "unsolicited",
            Way::Deferred => "deferred",
        }
    }
}

struct Case {
    name: &'static str,
    runtime: (&'static str, &'static str, &'static str),
    policy: UnsolicitedUpdates,
    /// Container whose unsolicited update the runtime reports as failed.
    fail: Option<&'static str>,
    way: Way,
}

/// Only the NRI version decides safety; the runtime name and version are
/// what such a runtime would report.
const SAFE: (&str, &str, &str) = ("containerd", "2.2.0", "v0.12.1");
/// Debian's containerd 1.7.24 is built with NRI 0.6.1, which sends no NRI
/// version at Configure.
const CONTAINERD_1_7: (&str, &str, &str) = ("containerd", "1.7.24", "");
const NRI_0_6_1: (&str, &str, &str) = ("containerd", "1.7.24", "v0.6.1");

async fn run_case(case: &Case, dir: &Path) {
    let name = case.name;
    // CPUs 0-7; claim A (6-7) is the mixed container's, prepared before
    // nri-plugin started; claim B (4-5) comes and goes during the test.
    let mut view = NodeView::new(set("0-7"), CpuSet::new(), true, None);
    view.apply_prepared(1, claim(CLAIM_A, "6-7", POD_M))
        .expect("claim A");
    let metrics = Arc::new(Metrics::new());
    let updater = NriUpdater::new();
    let enforcer = Arc::new(Enforcer::new(
        view,
        metrics.clone(),
        updater.clone(),
        case.policy,
    ));
    let plugin = Arc::new(DraCpuPlugin::new(enforcer.clone(), Arc::new(NoLookups)));

    let socket = dir.join(format!("{name}.sock"));
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let stop = tokio_util::sync::CancellationToken::new();
    let nri = tokio::spawn(run_with_reconnect(
        plugin,
        SocketSource::Path(socket),
        NriClientOptions::new("dracpu", "10"),
        updater.clone(),
        stop.clone().cancelled_owned(),
    ));
    let mut connection = updater.connection();
    let runtime = FakeRuntime::accept(&listener).await;
    let (rt_name, rt_version, nri_version) = case.runtime;
    runtime.configure(rt_name, rt_version, nri_version).await;

    // A shared container and a mixed one (claim A, a CPU request), both
    // unpinned: Synchronize pins them.
    let env_a = [format!("DRA_CPUSET_{CLAIM_A}=6-7")];
    let shared = container("s", POD_S, &[], 2, "");
    let mixed = container("m", POD_M, &env_a, 512, "");
    let synced = runtime.synchronize(vec![shared, mixed]).await;
    assert_eq!(synced, updates(&[("m", "0-7"), ("s", "0-5")]), "{name}");
    wait_connected(&updater).await;
    assert!(
        *connection.borrow_and_update(),
        "{name}: connection followed"
    );
    let pool_changes = |m: &Metrics| {
        (
            m.pool_change_count("unsolicited"),
            m.pool_change_count("deferred"),
        )
    };
    let expect_way = |before: (u64, u64), after: (u64, u64), what: &str| {
        let want = match case.way {
            Way::Unsolicited => (before.0 + 1, before.1),
            Way::Deferred => (before.0, before.1 + 1),
        };
        assert_eq!(
            after, want,
            "{name}: pool changes (unsolicited, deferred) after {what}"
        );
    };

    // Claim B is prepared: the pool shrinks to 0-3.
    let before = pool_changes(&metrics);
    enforcer
        .apply_prepared(2, claim(CLAIM_B, "4-5", POD_B))
        .await
        .expect("prepare B");
    expect_way(before, pool_changes(&metrics), "the prepare");
    let shrunk = updates(&[("m", "0-3,6-7"), ("s", "0-3")]);
    let sent = match case.way {
        Way::Unsolicited => vec![shrunk.clone()],
        Way::Deferred => Vec::new(),
    };
    assert_eq!(runtime.unsolicited(), sent, "{name}: after the prepare");

    // Claim B's container is created (the shrink rides on its reply unless
    // it went out already), then removed.
    let env_b = [format!("DRA_CPUSET_{CLAIM_B}=4-5")];
    let b = container("b", POD_B, &env_b, 2, "");
    let (own, others) = runtime.create(b.clone()).await;
    assert_eq!(own, "4-5", "{name}");
    let want = match case.way {
        Way::Unsolicited => Vec::new(),
        Way::Deferred => shrunk.clone(),
    };
    assert_eq!(others, want, "{name}: reply to b's creation");
    runtime.remove(b).await;
    assert_eq!(
        metrics.applied_revision.load(Ordering::Relaxed),
        2,
        "{name}: the shrink is applied"
    );

    // Claim B is unprepared: the pool grows back to 0-5.
    if let Some(id) = case.fail {
        runtime.log.lock().unwrap().fail.insert(id.to_string());
    }
    let before = pool_changes(&metrics);
    let sent_before = runtime.unsolicited().len();
    enforcer
        .apply_unprepared(3, CLAIM_B)
        .await
        .expect("unprepare B");
    expect_way(before, pool_changes(&metrics), "the unprepare");
    let grown = updates(&[("m", "0-7"), ("s", "0-5")]);
    match case.way {
        Way::Unsolicited => {
            assert_eq!(
                &runtime.unsolicited()[sent_before..],
                std::slice::from_ref(&grown),
                "{name}: the runtime got the grown pool"
            );
        }
        Way::Deferred => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                runtime.unsolicited().len(),
                sent_before,
                "{name}: no unsolicited update on this runtime"
            );
        }
    }
    // What is still due: nothing after a full unsolicited update, the failed
    // container after a partial one, everything when deferred.
    let due = match (case.way, case.fail) {
        (Way::Unsolicited, None) => Vec::new(),
        (Way::Unsolicited, Some(failed)) => grown
            .iter()
            .filter(|(id, _)| id == failed)
            .cloned()
            .collect(),
        (Way::Deferred, _) => grown.clone(),
    };
    let applied = metrics.applied_revision.load(Ordering::Relaxed);
    assert_eq!(
        applied,
        if due.is_empty() { 3 } else { 2 },
        "{name}: applied revision before the next event"
    );

    // The next event: a new shared container. Its reply carries exactly
    // what is still due, and afterwards nothing is.
    let (own, others) = runtime.create(container("n", POD_S, &[], 2, "")).await;
    assert_eq!(own, "0-5", "{name}: the new shared container");
    assert_eq!(others, due, "{name}: reply to the next creation");
    assert_eq!(
        metrics.applied_revision.load(Ordering::Relaxed),
        3,
        "{name}: applied after the reply"
    );
    let (_, again) = runtime.create(container("n2", POD_S, &[], 2, "")).await;
    assert!(again.is_empty(), "{name}: nothing repeated: {again:?}");
    assert_eq!(
        runtime.unsolicited().len(),
        match case.way {
            Way::Unsolicited => 2,
            Way::Deferred => 0,
        },
        "{name}: events never cause unsolicited updates"
    );
    let text = metrics.render();
    let line = format!(
        "nri_plugin_pool_changes_total{{way=\"{}\"}} 2",
        case.way.label()
    );
    assert!(text.contains(&line), "{name}: {line} in\n{text}");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), nri)
        .await
        .expect("the NRI task stops")
        .expect("join")
        .expect("run_with_reconnect");
    assert!(
        !*connection.borrow_and_update(),
        "{name}: the lost connection is followed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_changes_go_out_unsolicited_only_where_allowed() {
    let cases = [
        Case {
            name: "safe-auto",
            runtime: SAFE,
            policy: UnsolicitedUpdates::Auto,
            fail: None,
            way: Way::Unsolicited,
        },
        Case {
            name: "containerd-1.7-auto",
            runtime: CONTAINERD_1_7,
            policy: UnsolicitedUpdates::Auto,
            fail: None,
            way: Way::Deferred,
        },
        Case {
            name: "nri-0.6.1-auto",
            runtime: NRI_0_6_1,
            policy: UnsolicitedUpdates::Auto,
            fail: None,
            way: Way::Deferred,
        },
        Case {
            name: "safe-never",
            runtime: SAFE,
            policy: UnsolicitedUpdates::Never,
            fail: None,
            way: Way::Deferred,
        },
        Case {
            name: "containerd-1.7-always",
            runtime: CONTAINERD_1_7,
            policy: UnsolicitedUpdates::Always,
            fail: None,
            way: Way::Unsolicited,
        },
        Case {
            name: "safe-auto-one-update-fails",
            runtime: SAFE,
            policy: UnsolicitedUpdates::Auto,
            fail: Some("m"),
            way: Way::Unsolicited,
        },
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for case in &cases {
        run_case(case, dir.path()).await;
    }
}
