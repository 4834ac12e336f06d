use super::*;
use crate::config::UnsolicitedUpdates;
use crate::host_cgroups::HostCgroups;
use crate::metrics::Metrics;
use crate::test_support::{claim, not_prepared, prepared, run, set};
use crate::view::NodeView;
use dra_cpu_nri::client::NriUpdater;
use dra_cpu_proto::nri::api;
use shared_state::{ClaimAssignment, CpuSet};
use std::sync::atomic::Ordering;

struct NoClaims;

/// dra-plugin does not answer, and no CDI spec is readable.
struct Unreachable;

#[async_trait]
impl ClaimResolver for Unreachable {
    async fn resolve(&self, _claim_uid: &str) -> crate::resolve::Resolution {
        crate::resolve::Resolution::Unverifiable("dra-plugin does not answer".into())
    }
}

#[async_trait]
impl ClaimResolver for NoClaims {
    async fn resolve(&self, _claim_uid: &str) -> crate::resolve::Resolution {
        not_prepared()
    }
}

fn nri_container(id: &str, env: &[String]) -> Container {
    let mut c = Container::new();
    c.id = id.into();
    c.name = id.into();
    c.env = env.to_vec();
    c
}

fn resources(shares: u64, cpus: &str) -> LinuxResources {
    let mut cpu = api::LinuxCPU::new();
    let mut value = api::OptionalUInt64::new();
    value.value = shares;
    cpu.shares = Some(value).into();
    cpu.cpus = cpus.into();
    let mut r = LinuxResources::new();
    r.cpu = Some(cpu).into();
    r
}

/// Answers every Lookup with one prepared claim.
struct OneClaim(ClaimAssignment);

#[async_trait]
impl ClaimResolver for OneClaim {
    async fn resolve(&self, claim_uid: &str) -> crate::resolve::Resolution {
        if claim_uid == self.0.claim_uid {
            prepared(self.0.clone())
        } else {
            not_prepared()
        }
    }
}

#[test]
fn deferred_shrink_rides_on_the_next_create_and_is_then_applied() {
    let metrics = Arc::new(Metrics::new());
    let view = NodeView::new(set("0-3"), CpuSet::new(), false, None);
    let enforcer = Arc::new(Enforcer::new(
        view,
        metrics.clone(),
        NriUpdater::new(),
        UnsolicitedUpdates::Auto,
    ));
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
    let mut pod = PodSandbox::new();
    pod.uid = "q".into();
    let first = run(plugin.create_container(pod.clone(), nri_container("s", &[]))).expect("shared");
    assert!(first.update.is_empty());
    let uid = "c1c1c1c1-0000-4000-8000-000000000001";
    run(enforcer.apply_prepared(4, claim(uid, "3", "q"))).expect("prepare");

    let env = [format!("DRA_CPUSET_{uid}=3")];
    let reply = run(plugin.create_container(pod.clone(), nri_container("e", &env)))
        .expect("claim container");
    let cpus = |u: &ContainerUpdate| u.linux.resources.cpu.cpus.clone();
    assert_eq!(reply.adjust.expect("adjust").linux.resources.cpu.cpus, "3");
    assert_eq!(reply.update.len(), 1);
    assert_eq!(
        (
            reply.update[0].container_id.as_str(),
            cpus(&reply.update[0]).as_str()
        ),
        ("s", "0-2")
    );
    assert!(enforcer.view().pending_updates().is_empty());
    assert_eq!(metrics.applied_revision.load(Ordering::Relaxed), 4);

    // A forged copy is refused with the reason, and counted.
    let forged = [format!("DRA_CPUSET_{uid}=2")];
    let err = run(plugin.create_container(pod, nri_container("f", &forged))).expect_err("forged");
    assert!(
        err.to_string()
            .contains("says CPUs 2 but the claim was prepared with 3"),
        "{err}"
    );
    assert_eq!(metrics.refused_count("cpus-mismatch"), 1);
    let text = metrics.render();
    assert!(
        text.contains("nri_plugin_container_updates_total{path=\"reply\"} 1"),
        "{text}"
    );
}

#[test]
fn update_container_answers_the_new_kinds_cpuset_over_the_requests() {
    let metrics = Arc::new(Metrics::new());
    let view = NodeView::new(set("0-3"), CpuSet::new(), true, None);
    let enforcer = Arc::new(Enforcer::new(
        view,
        metrics,
        NriUpdater::new(),
        UnsolicitedUpdates::Never,
    ));
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
    let mut pod = PodSandbox::new();
    pod.uid = "q".into();
    let uid = "c1c1c1c1-0000-4000-8000-000000000001";
    run(enforcer.apply_prepared(1, claim(uid, "3", "q"))).expect("prepare");
    let env = [format!("DRA_CPUSET_{uid}=3")];
    let mut c = nri_container("c", &env);
    let mut linux = api::LinuxContainer::new();
    linux.resources = Some(resources(2, "")).into();
    c.linux = Some(linux).into();
    let created = run(plugin.create_container(pod.clone(), c.clone())).expect("created");
    assert_eq!(
        created.adjust.expect("adjust").linux.resources.cpu.cpus,
        "3"
    );
    // (shares and cpuset in the CRI request, cpuset answered): a cpuset in
    // the request never wins; shares 0 is "not in the request".
    let steps = [
        (512, "", "0-3"),
        (0, "0-3", "0-3"),
        (0, "", "0-3"),
        (2, "0-3", "3"),
        (0, "0-2", "3"),
    ];
    for (shares, requested, answered) in steps {
        let reply = run(plugin.update_container(
            pod.clone(),
            c.clone(),
            Some(resources(shares, requested)),
        ))
        .expect("update");
        let own: Vec<String> = reply
            .update
            .iter()
            .filter(|u| u.container_id == "c")
            .map(|u| u.linux.resources.cpu.cpus.clone())
            .collect();
        assert_eq!(
            own,
            vec![answered.to_string()],
            "shares {shares}, request {requested:?}"
        );
        assert!(reply.update.iter().all(|u| u.ignore_failure));
    }
}

#[test]
fn host_cgroups_follow_prepare_unprepare_and_a_claim_learned_at_create() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cgroup");
    let slice = root.join("system.slice");
    std::fs::create_dir_all(&slice).expect("mkdir");
    for d in [&root, &slice] {
        std::fs::write(d.join("cgroup.controllers"), "cpuset cpu\n").expect("controllers");
        std::fs::write(d.join("cgroup.subtree_control"), "cpuset\n").expect("subtree");
    }
    std::fs::write(slice.join("cpuset.cpus"), "\n").expect("cpus");
    let cpus = || {
        std::fs::read_to_string(slice.join("cpuset.cpus"))
            .expect("read")
            .trim()
            .to_string()
    };
    let host = HostCgroups::open(&root, &["system.slice".into()], &dir.path().join("state"))
        .expect("host cgroups");
    let metrics = Arc::new(Metrics::new());
    let view = NodeView::new(set("0-7"), set("0"), false, None);
    let late_uid = "c2c2c2c2-0000-4000-8000-000000000002";
    let enforcer = Arc::new(
        Enforcer::new(
            view,
            metrics.clone(),
            NriUpdater::new(),
            UnsolicitedUpdates::Auto,
        )
        .with_host_cgroups(host),
    );
    enforcer.sync_host_cgroups();
    assert_eq!(cpus(), "0-7", "shared pool 1-7 and reserved 0");

    let uid = "c1c1c1c1-0000-4000-8000-000000000001";
    run(enforcer.apply_prepared(1, claim(uid, "6-7", "q"))).expect("prepare");
    assert_eq!(cpus(), "0-5", "shrunk at the prepare, before any container");

    // A claim the view learns only at its container's CreateContainer
    // (dra-plugin's delta not here yet): shrunk before the reply.
    let plugin = DraCpuPlugin::new(
        enforcer.clone(),
        Arc::new(OneClaim(claim(late_uid, "4", "p"))),
    );
    let mut pod = PodSandbox::new();
    pod.uid = "p".into();
    let env = [format!("DRA_CPUSET_{late_uid}=4")];
    run(plugin.create_container(pod, nri_container("late", &env))).expect("create");
    assert_eq!(cpus(), "0-3,5");

    run(enforcer.apply_unprepared(2, uid)).expect("unprepare");
    assert_eq!(cpus(), "0-3,5-7", "grown back after the unprepare");
    assert_eq!(metrics.host_cgroup_write_count("ok"), 4);

    // A write that fails does not fail the container event that made
    // it due; it is counted and made again at the next change.
    let cpus_file = slice.join("cpuset.cpus");
    std::fs::remove_file(&cpus_file).expect("rm");
    std::fs::create_dir(&cpus_file).expect("a directory where the file was");
    let third = "c3c3c3c3-0000-4000-8000-000000000003";
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(OneClaim(claim(third, "6", "r"))));
    let mut pod = PodSandbox::new();
    pod.uid = "r".into();
    let env = [format!("DRA_CPUSET_{third}=6")];
    let reply = run(plugin.create_container(pod, nri_container("third", &env)))
        .expect("the container is placed although the host cgroup write failed");
    assert_eq!(reply.adjust.expect("adjust").linux.resources.cpu.cpus, "6");
    assert_eq!(metrics.host_cgroup_write_count("failed"), 1);
    std::fs::remove_dir(&cpus_file).expect("rmdir");
    std::fs::write(&cpus_file, "0-3,5-7\n").expect("file again");
    run(enforcer.apply_unprepared(3, third)).expect("unprepare");
    assert_eq!(cpus(), "0-3,5-7");
    run(enforcer.apply_prepared(4, claim(third, "6", "r"))).expect("prepare again");
    assert_eq!(cpus(), "0-3,5,7", "written at the next change");
    assert_eq!(metrics.host_cgroup_write_count("ok"), 5);

    enforcer.restore_host_cgroups();
    assert_eq!(cpus(), "", "the original value back");
    enforcer.sync_host_cgroups();
    assert_eq!(cpus(), "", "nothing is managed after the restore");
}

#[test]
fn a_claim_asking_load_balancing_off_gets_a_partition_at_start_and_gives_it_back_at_stop() {
    let dir = crate::partition::fake_tree::make(&[
        "kubepods",
        "kubepods/podq",
        "kubepods/podq/c",
        "kubepods/podq/s",
    ]);
    let read = |p: &str| crate::partition::fake_tree::read(&dir, p);
    let enforcer = partition_enforcer(
        NodeView::new(set("0-3"), CpuSet::new(), true, None),
        dir.path(),
    );
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
    let uid = "c1c1c1c1-0000-4000-8000-000000000001";
    let mut isolated = claim(uid, "2-3", "q");
    isolated.tuning.load_balancing_off = true;
    run(enforcer.apply_prepared(1, isolated)).expect("prepare");
    let mut pod = PodSandbox::new();
    pod.uid = "q".into();
    let with_path = |id: &str, env: &[String], path: &str| {
        let mut c = nri_container(id, env);
        let mut linux = api::LinuxContainer::new();
        linux.cgroups_path = path.into();
        linux.resources = Some(resources(1024, "")).into();
        c.linux = Some(linux).into();
        c
    };
    let env = [format!("DRA_CPUSET_{uid}=2-3")];
    let c = with_path("c", &env, "/kubepods/podq/c");
    let created = run(plugin.create_container(pod.clone(), c.clone())).expect("created");
    assert_eq!(
        created.adjust.expect("adjust").linux.resources.cpu.cpus,
        "2-3",
        "a CPU request in mixed mode does not add the shared pool"
    );
    // A shared container starts: nothing is written.
    let s = with_path("s", &[], "/kubepods/podq/s");
    run(plugin.create_container(pod.clone(), s.clone())).expect("shared");
    run(plugin.start_container(pod.clone(), s)).expect("shared start");
    assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "");

    run(plugin.start_container(pod.clone(), c.clone())).expect("start");
    assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "2-3");
    assert_eq!(read("kubepods/podq/cpuset.cpus.exclusive"), "2-3");
    assert_eq!(read("kubepods/podq/c/cpuset.cpus.exclusive"), "2-3");
    assert_eq!(read("kubepods/podq/c/cpuset.cpus.partition"), "isolated");

    run(plugin.stop_container(pod.clone(), c.clone())).expect("stop");
    assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "");
    assert_eq!(read("kubepods/podq/cpuset.cpus.exclusive"), "");
    assert_eq!(read("kubepods/podq/c/cpuset.cpus.partition"), "member");
    run(plugin.remove_container(pod.clone(), c)).expect("remove");

    // A plugin without partitions (a read-only cgroup root) does not ask
    // for StartContainer, and refuses the creation instead, by name; the
    // container leaves its view.
    assert!(plugin.events().contains(Event::START_CONTAINER));
    let bare_enforcer = Arc::new(Enforcer::new(
        NodeView::new(set("0-3"), CpuSet::new(), true, None),
        Arc::new(Metrics::new()),
        NriUpdater::new(),
        UnsolicitedUpdates::Never,
    ));
    let mut isolated = claim(uid, "2-3", "q");
    isolated.tuning.load_balancing_off = true;
    run(bare_enforcer.apply_prepared(1, isolated)).expect("prepare");
    let bare = DraCpuPlugin::new(bare_enforcer.clone(), Arc::new(NoClaims));
    assert!(!bare.events().contains(Event::START_CONTAINER));
    assert!(!bare.events().contains(Event::RUN_POD_SANDBOX));
    let again = with_path("c2", &env, "/kubepods/podq/c");
    let err = run(bare.create_container(pod.clone(), again)).expect_err("no partitions");
    assert!(
        err.to_string().contains("tuning.loadBalancing off"),
        "{err}"
    );
    assert!(bare_enforcer.view().pool().container("c2").is_none());
    assert_eq!(bare_enforcer.metrics.refused_count("isolated-partition"), 1);
    // A claim that asks nothing of the kind is placed as ever.
    let shared = with_path("s2", &[], "/kubepods/podq/s2");
    run(bare.create_container(pod, shared)).expect("a shared container");
}

/// A cgroup root this process may not write makes no partitions; a
/// writable one does.
#[test]
fn partitions_only_under_a_writable_cgroup_root() {
    let dir = tempfile::tempdir().expect("tmp");
    assert!(crate::partition::IsolatedPartitions::writable(dir.path()).is_some());
    assert!(crate::partition::IsolatedPartitions::writable(&dir.path().join("missing")).is_none());
    // On cgroup v1 the partitions' writes go to the cpuset mount below the
    // root. (A read-only mount, the chart's, is what e2e_pools runs
    // nri-plugin on: root ignores permission bits.)
    std::fs::create_dir_all(dir.path().join("cpuset")).expect("cpuset dir");
    std::fs::write(dir.path().join("cpuset/cpuset.sched_load_balance"), "1\n").expect("v1");
    // A v1 hierarchy's root reads r-x for everyone: the mount's flag
    // decides, not the mode.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("cpuset"),
        std::fs::Permissions::from_mode(0o555),
    )
    .expect("chmod");
    assert!(crate::partition::IsolatedPartitions::writable(dir.path()).is_some_and(|p| p.is_v1()));
}

/// An enforcer making isolated partitions under `root`.
fn partition_enforcer(view: NodeView, root: &std::path::Path) -> Arc<Enforcer> {
    Arc::new(
        Enforcer::new(
            view,
            Arc::new(Metrics::new()),
            NriUpdater::new(),
            UnsolicitedUpdates::Never,
        )
        .with_isolated_partitions(crate::partition::IsolatedPartitions::new(root)),
    )
}

/// A restarted nri-plugin knows a claim from its CDI spec only (CPUs, no
/// tuning) until dra-plugin's snapshot: a container of it that the runtime
/// reports running at Synchronize, or that starts, before the snapshot
/// gets its isolated partition when the snapshot says the claim asks for
/// one. Control: without the reconcile after the snapshot, both stay
/// `member`.
#[test]
fn a_partition_asked_by_a_claim_known_late_is_made_when_it_is_known() {
    let dir = crate::partition::fake_tree::make(&[
        "kubepods",
        "kubepods/podq",
        "kubepods/podq/run",
        "kubepods/podq/start",
        "kubepods/podq/other",
    ]);
    let read = |p: &str| crate::partition::fake_tree::read(&dir, p);
    let first = "c1c1c1c1-0000-4000-8000-000000000001";
    let second = "c2c2c2c2-0000-4000-8000-000000000002";
    let mut view = NodeView::new(set("0-7"), CpuSet::new(), false, None);
    for (uid, cpus) in [(first, "2-3"), (second, "4-5")] {
        view.learn_claim(
            crate::view::admission::cdi_claim(uid, set(cpus)),
            crate::view::claims::ClaimOrigin::CdiSpec,
        )
        .expect("from the CDI spec");
    }
    let enforcer = partition_enforcer(view, dir.path());
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(Unreachable));
    let mut pod = PodSandbox::new();
    pod.id = "sandbox-q".into();
    pod.uid = "q".into();
    let sandbox_id = pod.id.clone();
    let container = |id: &str, env: &[String], path: &str, state: api::ContainerState| {
        let mut c = nri_container(id, env);
        c.pod_sandbox_id = sandbox_id.clone();
        c.state = state.into();
        let mut linux = api::LinuxContainer::new();
        linux.cgroups_path = path.into();
        c.linux = Some(linux).into();
        c
    };
    let running = container(
        "run",
        &[format!("DRA_CPUSET_{first}=2-3")],
        "/kubepods/podq/run",
        api::ContainerState::CONTAINER_RUNNING,
    );
    let shared = container(
        "other",
        &[],
        "/kubepods/podq/other",
        api::ContainerState::CONTAINER_RUNNING,
    );
    run(plugin.synchronize(vec![pod.clone()], vec![running, shared])).expect("synchronize");
    let starting = container(
        "start",
        &[format!("DRA_CPUSET_{second}=4-5")],
        "/kubepods/podq/start",
        api::ContainerState::CONTAINER_CREATED,
    );
    run(plugin.create_container(pod.clone(), starting.clone())).expect("create");
    run(plugin.start_container(pod.clone(), starting.clone())).expect("start");
    assert_eq!(
        read("kubepods/podq/run/cpuset.cpus.partition"),
        "member",
        "tuning unknown yet"
    );
    assert_eq!(
        read("kubepods/podq/start/cpuset.cpus.partition"),
        "member",
        "tuning unknown yet"
    );

    let claims = [(first, "2-3"), (second, "4-5")]
        .into_iter()
        .map(|(uid, cpus)| {
            let mut c = claim(uid, cpus, "q");
            c.tuning.load_balancing_off = true;
            c
        })
        .collect();
    run(enforcer.apply_snapshot(shared_state::NodeSnapshot {
        revision: 1,
        allocatable: set("0-7"),
        reserved: CpuSet::new(),
        mixed_allocation_mode: false,
        claims,
    }))
    .expect("snapshot");
    assert_eq!(read("kubepods/podq/run/cpuset.cpus.partition"), "isolated");
    assert_eq!(
        read("kubepods/podq/start/cpuset.cpus.partition"),
        "isolated"
    );
    assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "2-5");
    assert_eq!(read("kubepods/podq/other/cpuset.cpus.partition"), "member");

    // Their stops give the CPUs back.
    run(plugin.stop_container(
        pod.clone(),
        container(
            "run",
            &[],
            "/kubepods/podq/run",
            api::ContainerState::CONTAINER_STOPPED,
        ),
    ))
    .expect("stop");
    run(plugin.stop_container(
        pod,
        container(
            "start",
            &[],
            "/kubepods/podq/start",
            api::ContainerState::CONTAINER_STOPPED,
        ),
    ))
    .expect("stop");
    assert_eq!(read("kubepods/cpuset.cpus.exclusive"), "");
    assert_eq!(read("kubepods/podq/run/cpuset.cpus.partition"), "member");
}

/// A container started while nri-plugin was away has the CFS quota of its
/// CPU limit: the Synchronize reply turns it off when its claim asks so,
/// on its cpuset, even when that cpuset needs no change; other containers'
/// quotas are left alone. Control: with the pool's quota debt
/// (`quota_due` in shared-state's planning) always false, the claim
/// container has no update at all.
#[test]
fn synchronize_turns_the_cfs_quota_off_for_claims_that_ask_so() {
    let enforcer = Arc::new(Enforcer::new(
        NodeView::new(set("0-7"), CpuSet::new(), false, None),
        Arc::new(Metrics::new()),
        NriUpdater::new(),
        UnsolicitedUpdates::Never,
    ));
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
    let uid = "c1c1c1c1-0000-4000-8000-000000000001";
    let mut quota_off = claim(uid, "2-3", "q");
    quota_off.tuning.cfs_quota_off = true;
    run(enforcer.apply_prepared(1, quota_off)).expect("prepare");
    let mut pod = PodSandbox::new();
    pod.id = "sandbox-q".into();
    pod.uid = "q".into();
    let running = |id: &str, env: &[String], cpus: &str| {
        let mut c = nri_container(id, env);
        c.pod_sandbox_id = "sandbox-q".into();
        c.state = api::ContainerState::CONTAINER_RUNNING.into();
        let mut linux = api::LinuxContainer::new();
        linux.resources = Some(resources(1024, cpus)).into();
        c.linux = Some(linux).into();
        c
    };
    let reply = run(plugin.synchronize(
        vec![pod],
        vec![
            running("claimed", &[format!("DRA_CPUSET_{uid}=2-3")], "2-3"),
            running("shared", &[], "0-7"),
        ],
    ))
    .expect("synchronize");
    let cpu_of = |id: &str| {
        reply
            .iter()
            .find(|u| u.container_id == id)
            .and_then(|u| u.linux.as_ref())
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.cpu.as_ref())
            .cloned()
    };
    let claimed = cpu_of("claimed").expect("an update for the claim container");
    assert_eq!(claimed.cpus, "2-3");
    assert_eq!(
        claimed.quota.as_ref().map(|q| q.value),
        Some(messages::NO_CFS_QUOTA)
    );
    let shared = cpu_of("shared").expect("the shared pool shrank: an update");
    assert_eq!(shared.cpus, "0-1,4-7");
    assert!(shared.quota.is_none(), "a shared container keeps its quota");
}

/// cgroup v1: nri-plugin asks for the pod sandbox's start there (and only
/// there), and a sandbox starting while a claim's CPUs are isolated has its
/// new pod cgroup, which holds every CPU, turned off at once. The control:
/// before the event the new pod's cgroup balances.
#[test]
fn on_cgroup_v1_a_sandbox_start_turns_its_new_pod_off_balancing() {
    use crate::partition::v1::fake_tree::{add, flag, make};
    let v2 = crate::partition::fake_tree::make(&["kubepods"]);
    std::fs::write(v2.path().join("cgroup.controllers"), "cpuset cpu\n").expect("v2 root");
    let view = || NodeView::new(set("0-7"), CpuSet::new(), true, None);
    let on_v2 = DraCpuPlugin::new(partition_enforcer(view(), v2.path()), Arc::new(NoClaims));
    assert!(!on_v2.events().contains(Event::RUN_POD_SANDBOX));

    let dir = make(
        "0",
        &[
            ("kubepods", "0-7"),
            ("kubepods/pa", "0-7"),
            ("kubepods/pa/a", "2-3"),
        ],
    );
    let enforcer = partition_enforcer(view(), dir.path());
    let plugin = DraCpuPlugin::new(enforcer.clone(), Arc::new(NoClaims));
    assert!(plugin.events().contains(Event::RUN_POD_SANDBOX));
    enforcer
        .partitions
        .as_ref()
        .expect("partitions")
        .isolate("a", "/kubepods/pa/a", &set("2-3"))
        .expect("a isolated");
    add(&dir, "kubepods/pn", "0-7");
    assert_eq!(flag(&dir, "kubepods/pn"), "1");
    run(plugin.run_pod_sandbox(PodSandbox::new())).expect("sandbox");
    assert_eq!(flag(&dir, "kubepods/pn"), "0");
}
