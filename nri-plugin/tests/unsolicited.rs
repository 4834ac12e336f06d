//! How a pool change reaches running containers, end to end through the
//! real plugin (`DraCpuPlugin`, `Enforcer`, `run_with_reconnect`) and the
//! stand-in NRI runtime speaking ttrpc over the multiplexed Unix socket. A
//! runtime with NRI ≥ 0.12.1 (or `--unsolicited-updates=always`) gets the
//! change as an unsolicited `UpdateContainers` right away; any other runtime
//! (or `never`) gets it in the reply to its next event. An update the
//! runtime reports as failed stays due and rides on the next reply.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dra_cpu_nri::client::{run_with_reconnect, NriClientOptions, NriUpdater, SocketSource};
use dra_cpu_proto::nri::api::{Container, PodSandbox};
use dra_cpu_tests::nri_runtime::{self, CreateReply, NriRuntime, NriSession, Update};
use nri_plugin::config::UnsolicitedUpdates;
use nri_plugin::enforcer::{self, Enforcer};
use nri_plugin::metrics::Metrics;
use nri_plugin::nri::DraCpuPlugin;
use nri_plugin::resolve::{ClaimResolver, Resolution};
use nri_plugin::view::NodeView;
use shared_state::{ClaimAssignment, CpuSet};

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
        tuning: Default::default(),
    }
}

/// Every claim the test uses is handed to the view directly.
struct NoLookups;

#[async_trait]
impl ClaimResolver for NoLookups {
    async fn resolve(&self, _claim_uid: &str) -> Resolution {
        Resolution::NotPrepared { revision: u64::MAX }
    }
}

/// How long the plugin has to connect and register.
const CONNECT: Duration = Duration::from_secs(10);

/// Pod sandboxes are named by their UID in this test.
fn pod(uid: &str) -> PodSandbox {
    nri_runtime::pod(uid, &format!("pod-{}", &uid[..8]), "ns")
}

fn container(id: &str, pod_uid: &str, env: &[String], shares: u64, cpus: &str) -> Container {
    nri_runtime::container(id, &format!("name-{id}"), pod_uid, env, shares, cpus)
}

/// CreateContainer, which the plugin must not refuse.
async fn create(runtime: &NriSession, c: Container) -> CreateReply {
    let id = c.id.clone();
    let reply = runtime
        .create_container(pod(&c.pod_sandbox_id), c)
        .await
        .expect("CreateContainer");
    let refused = runtime.state().refused;
    assert!(!refused.contains_key(&id), "{id} refused: {refused:?}");
    reply
}

fn unsolicited(runtime: &NriSession) -> Vec<Vec<Update>> {
    runtime.state().unsolicited
}

fn updates(list: &[(&str, &str)]) -> Vec<Update> {
    list.iter()
        .map(|(id, cpus)| (id.to_string(), Some(cpus.to_string())))
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

/// The plugin under test connected to a stand-in runtime that has
/// configured it.
struct Connected {
    enforcer: Arc<Enforcer>,
    metrics: Arc<Metrics>,
    updater: NriUpdater,
    runtime: NriSession,
    stop: tokio_util::sync::CancellationToken,
    nri: tokio::task::JoinHandle<Result<(), dra_cpu_nri::client::NriError>>,
}

/// Starts the plugin over `view` with `policy` against a stand-in runtime
/// listening at `socket`, which registers and configures it as `runtime`
/// (name, version, NRI version).
async fn connect(
    view: NodeView,
    policy: UnsolicitedUpdates,
    socket: &Path,
    runtime: (&str, &str, &str),
) -> Connected {
    let metrics = Arc::new(Metrics::new());
    let updater = NriUpdater::new();
    let enforcer = Arc::new(Enforcer::new(
        view,
        metrics.clone(),
        updater.clone(),
        policy,
    ));
    let plugin = Arc::new(DraCpuPlugin::new(enforcer.clone(), Arc::new(NoLookups)));
    let listening = NriRuntime::bind(socket).expect("bind");
    let stop = tokio_util::sync::CancellationToken::new();
    let nri = tokio::spawn(run_with_reconnect(
        plugin,
        SocketSource::Path(socket.to_path_buf()),
        NriClientOptions::new("dracpu", "10"),
        updater.clone(),
        stop.clone().cancelled_owned(),
    ));
    let session = listening.accept(CONNECT).await.expect("RegisterPlugin");
    let (rt_name, rt_version, nri_version) = runtime;
    session
        .configure(rt_name, rt_version, nri_version)
        .await
        .expect("Configure");
    Connected {
        enforcer,
        metrics,
        updater,
        runtime: session,
        stop,
        nri,
    }
}

/// [`connect`] on a node of CPUs 0-7 with nothing reserved, mixed mode,
/// auto policy and a runtime safe for unsolicited updates, then one shared
/// container `s` synchronized onto the whole pool.
async fn connect_with_one_shared_container(socket: &Path) -> Connected {
    let view = NodeView::new(set("0-7"), CpuSet::new(), true, None);
    let connected = connect(view, UnsolicitedUpdates::Auto, socket, SAFE).await;
    let synced = connected
        .runtime
        .synchronize(vec![pod(POD_S)], vec![container("s", POD_S, &[], 2, "")])
        .await
        .expect("Synchronize");
    assert_eq!(synced, updates(&[("s", "0-7")]));
    wait_connected(&connected.updater).await;
    connected
}

/// Stops the plugin's NRI task and waits for it to end cleanly.
async fn stop_plugin(
    stop: tokio_util::sync::CancellationToken,
    nri: tokio::task::JoinHandle<Result<(), dra_cpu_nri::client::NriError>>,
) {
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), nri)
        .await
        .expect("the NRI task stops")
        .expect("join")
        .expect("run_with_reconnect");
}

async fn run_case(case: &Case, dir: &Path) {
    let name = case.name;
    // CPUs 0-7; claim A (6-7) is the mixed container's, prepared before
    // nri-plugin started; claim B (4-5) comes and goes during the test.
    let mut view = NodeView::new(set("0-7"), CpuSet::new(), true, None);
    view.apply_prepared(1, claim(CLAIM_A, "6-7", POD_M))
        .expect("claim A");
    let Connected {
        enforcer,
        metrics,
        updater,
        runtime,
        stop,
        nri,
    } = connect(
        view,
        case.policy,
        &dir.join(format!("{name}.sock")),
        case.runtime,
    )
    .await;
    let mut connection = updater.connection();

    // A shared container and a mixed one (claim A, a CPU request), both
    // unpinned: Synchronize pins them.
    let env_a = [format!("DRA_CPUSET_{CLAIM_A}=6-7")];
    let shared = container("s", POD_S, &[], 2, "");
    let mixed = container("m", POD_M, &env_a, 512, "");
    let synced = runtime
        .synchronize(vec![pod(POD_S), pod(POD_M)], vec![shared, mixed])
        .await
        .expect("Synchronize");
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
    assert_eq!(unsolicited(&runtime), sent, "{name}: after the prepare");

    // Claim B's container is created (the shrink rides on its reply unless
    // it went out already), then removed.
    let env_b = [format!("DRA_CPUSET_{CLAIM_B}=4-5")];
    let b = container("b", POD_B, &env_b, 2, "");
    let created = create(&runtime, b.clone()).await;
    assert_eq!(created.cpus.as_deref(), Some("4-5"), "{name}");
    let want = match case.way {
        Way::Unsolicited => Vec::new(),
        Way::Deferred => shrunk.clone(),
    };
    assert_eq!(created.updates, want, "{name}: reply to b's creation");
    runtime
        .remove_container(pod(POD_B), b)
        .await
        .expect("RemoveContainer");
    assert_eq!(
        metrics.applied_revision.load(Ordering::Relaxed),
        2,
        "{name}: the shrink is applied"
    );

    // Claim B is unprepared: the pool grows back to 0-5.
    if let Some(id) = case.fail {
        runtime.fail_updates_of(id);
    }
    let before = pool_changes(&metrics);
    let sent_before = unsolicited(&runtime).len();
    enforcer
        .apply_unprepared(3, CLAIM_B)
        .await
        .expect("unprepare B");
    expect_way(before, pool_changes(&metrics), "the unprepare");
    let grown = updates(&[("m", "0-7"), ("s", "0-5")]);
    match case.way {
        Way::Unsolicited => {
            assert_eq!(
                &unsolicited(&runtime)[sent_before..],
                std::slice::from_ref(&grown),
                "{name}: the runtime got the grown pool"
            );
        }
        Way::Deferred => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                unsolicited(&runtime).len(),
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
    let created = create(&runtime, container("n", POD_S, &[], 2, "")).await;
    assert_eq!(
        created.cpus.as_deref(),
        Some("0-5"),
        "{name}: the new shared container"
    );
    assert_eq!(created.updates, due, "{name}: reply to the next creation");
    assert_eq!(
        metrics.applied_revision.load(Ordering::Relaxed),
        3,
        "{name}: applied after the reply"
    );
    let again = create(&runtime, container("n2", POD_S, &[], 2, ""))
        .await
        .updates;
    assert!(again.is_empty(), "{name}: nothing repeated: {again:?}");
    assert_eq!(
        unsolicited(&runtime).len(),
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

/// An unsolicited update the runtime refuses whole (containerd does when
/// the call's deadline passes before its `runc update`s are done, as on a
/// loaded node) is sent again after a pause, with no event to carry it.
/// The control: with no resend task running, the shared container stays on
/// the old pool however long one waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_unsolicited_update_is_sent_again_without_an_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Connected {
        enforcer,
        metrics,
        runtime,
        stop,
        nri,
        ..
    } = connect_with_one_shared_container(&dir.path().join("refused.sock")).await;
    let shared_cpus = || runtime.state().cpusets.get("s").cloned().flatten();

    // Claim B prepared, its unsolicited update refused: still due.
    runtime.refuse_update_calls(1);
    enforcer
        .apply_prepared(2, claim(CLAIM_B, "4-5", POD_B))
        .await
        .expect("prepare B");
    assert_eq!(metrics.pool_change_count("failed"), 1);
    assert_eq!(unsolicited(&runtime).len(), 1, "the refused call");
    // The control: nothing else sends it.
    tokio::time::sleep(3 * enforcer::RESEND_FIRST_DELAY).await;
    assert_eq!(shared_cpus().as_deref(), Some("0-7"), "no resend task yet");
    assert_eq!(unsolicited(&runtime).len(), 1);

    // With the resend task: refused once more, then answered.
    runtime.refuse_update_calls(1);
    let resend = {
        let enforcer = enforcer.clone();
        tokio::spawn(async move { enforcer.resend_failed_updates().await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while shared_cpus().as_deref() != Some("0-3,6-7") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shrunk pool never reached the shared container: {:?}",
            runtime.state().unsolicited
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = unsolicited(&runtime);
    assert_eq!(
        calls,
        vec![
            updates(&[("s", "0-3,6-7")]),
            updates(&[("s", "0-3,6-7")]),
            updates(&[("s", "0-3,6-7")]),
        ],
        "refused, refused again, answered"
    );
    assert_eq!(metrics.pool_change_count("failed"), 2);
    assert_eq!(metrics.pool_change_count("unsolicited"), 1);
    assert_eq!(metrics.applied_revision.load(Ordering::Relaxed), 2);

    resend.abort();
    stop_plugin(stop, nri).await;
}

/// An unsolicited update that lands after the view moved on leaves the
/// runtime on a stale cpuset: claim A's unprepare grows the shared pool,
/// its call is held by a slow runtime, and claim B, prepared meanwhile on
/// the same CPU, needs no update since the view still records the shrunk
/// pool. When the held call lands the shared container is on B's CPU, and
/// the plugin sends the pool again without waiting for an event. Control
/// (run by hand): without the resend after a recorded answer the shared
/// container stays on B's CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_made_stale_in_flight_is_corrected_without_an_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Connected {
        enforcer,
        runtime,
        stop,
        nri,
        ..
    } = connect_with_one_shared_container(&dir.path().join("stale.sock")).await;
    let resend = {
        let enforcer = enforcer.clone();
        tokio::spawn(async move { enforcer.resend_failed_updates().await })
    };
    let shared_cpus = || runtime.state().cpusets.get("s").cloned().flatten();

    enforcer
        .apply_prepared(2, claim(CLAIM_A, "3", POD_M))
        .await
        .expect("prepare A");
    assert_eq!(shared_cpus().as_deref(), Some("0-2,4-7"));

    // A's unprepare: its growth is held by the runtime.
    runtime.hold_update_calls(1);
    let unprepare = {
        let enforcer = enforcer.clone();
        tokio::spawn(async move { enforcer.apply_unprepared(3, CLAIM_A).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runtime.state().held == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the growth never reached the runtime"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B on the same CPU: the view records s on 0-2,4-7 still, nothing to send.
    enforcer
        .apply_prepared(4, claim(CLAIM_B, "3", POD_B))
        .await
        .expect("prepare B");
    assert_eq!(
        unsolicited(&runtime).len(),
        2,
        "A's shrink, A's held growth"
    );

    runtime.release_held_update();
    unprepare.await.expect("join").expect("unprepare A");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while shared_cpus().as_deref() != Some("0-2,4-7") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shared container stays on claim B's CPU: {:?}, calls {:?}",
            shared_cpus(),
            runtime.state().unsolicited
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        unsolicited(&runtime),
        vec![
            updates(&[("s", "0-2,4-7")]),
            updates(&[("s", "0-7")]),
            updates(&[("s", "0-2,4-7")]),
        ],
        "shrink, the held growth, the pool sent again"
    );
    assert!(enforcer.view().pending_updates().is_empty());

    resend.abort();
    stop_plugin(stop, nri).await;
}

/// dra-plugin's snapshot after a CPU went offline (the same revision, the
/// CPU left out of the allocatable ones) moves running shared and mixed
/// containers off it at once on a safe runtime, and the next snapshot,
/// after it came back, moves them onto it again; the claim keeps its CPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_going_offline_leaves_running_containers_and_returns_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut view = NodeView::new(set("0-7"), CpuSet::new(), true, None);
    view.apply_prepared(1, claim(CLAIM_A, "6-7", POD_M))
        .expect("claim A");
    let Connected {
        enforcer,
        updater,
        runtime,
        stop,
        nri,
        ..
    } = connect(
        view,
        UnsolicitedUpdates::Auto,
        &dir.path().join("offline.sock"),
        SAFE,
    )
    .await;
    let env_a = [format!("DRA_CPUSET_{CLAIM_A}=6-7")];
    let synced = runtime
        .synchronize(
            vec![pod(POD_S), pod(POD_M)],
            vec![
                container("s", POD_S, &[], 2, ""),
                container("m", POD_M, &env_a, 512, ""),
            ],
        )
        .await
        .expect("Synchronize");
    assert_eq!(synced, updates(&[("m", "0-7"), ("s", "0-5")]));
    wait_connected(&updater).await;

    let snapshot = |allocatable: &str| shared_state::NodeSnapshot {
        revision: 1,
        allocatable: set(allocatable),
        reserved: CpuSet::new(),
        mixed_allocation_mode: true,
        claims: vec![claim(CLAIM_A, "6-7", POD_M)],
    };
    // CPU 3 went offline.
    enforcer
        .apply_snapshot(snapshot("0-2,4-7"))
        .await
        .expect("snapshot without CPU 3");
    assert_eq!(
        unsolicited(&runtime),
        vec![updates(&[("m", "0-2,4-7"), ("s", "0-2,4-5")])]
    );
    // And came back.
    enforcer
        .apply_snapshot(snapshot("0-7"))
        .await
        .expect("snapshot with CPU 3");
    assert_eq!(
        unsolicited(&runtime)[1..],
        [updates(&[("m", "0-7"), ("s", "0-5")])]
    );

    stop_plugin(stop, nri).await;
}
