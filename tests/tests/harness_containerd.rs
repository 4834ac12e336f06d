//! The node harness against the real containerd and real cgroups: pods run on
//! a private containerd, cpusets are read back from cgroups (v1 or v2) and
//! from inside the containers, CDI specs reach container environments, and
//! cleanup leaves nothing behind. Needs root and `scripts/install-deps.sh`.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dra_cpu_tests::cgroup;
use dra_cpu_tests::cgroup::container::{container_cpus, container_env};
use dra_cpu_tests::containerd::cleanup::{instance_processes, reap_stale_instances};
use dra_cpu_tests::containerd::config::{shim_socket_path, ContainerdOptions, InstancePaths};
use dra_cpu_tests::containerd::{Containerd, CRI_NAMESPACE};
use dra_cpu_tests::cri::new_uid;
use dra_cpu_tests::cri::resources::kubelet_cpu_resources;
use dra_cpu_tests::cri::spec::{pod_cgroup_parent, ContainerSpec};
use shared_state::CpuSet;

/// Set (to a parent directory) when this binary is re-run as a test owner
/// that gets killed mid-test.
const CRASH_HELPER_ENV: &str = "DRA_CPU_HARNESS_CRASH_PARENT";

async fn start() -> Containerd {
    match Containerd::start(ContainerdOptions::default()).await {
        Ok(c) => c,
        Err(e) => panic!("cannot start the private containerd: {e}"),
    }
}

fn online() -> CpuSet {
    cgroup::online_cpus().expect("online CPUs")
}

/// The memory nodes of the root cpuset cgroup: every memory node.
fn all_mems() -> CpuSet {
    cgroup::cpuset::all_memory_nodes().expect("memory nodes of the root cpuset cgroup")
}

/// Writes a CDI spec the way the driver does: temp file, fsync, rename.
fn write_cdi_spec(dir: &Path, claim_uid: &str, cpus: &str) -> PathBuf {
    let spec = serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": "dra.k8s.io/cpu",
        "devices": [{
            "name": format!("claim-{claim_uid}"),
            "containerEdits": {"env": [format!("DRA_CPUSET_{claim_uid}={cpus}")]}
        }],
        "containerEdits": {}
    });
    let path = dir.join(format!("dra.cpu-claim-{claim_uid}.json"));
    let tmp = dir.join(format!(".dra.cpu-claim-{claim_uid}.json.tmp"));
    let file = std::fs::File::create(&tmp).unwrap();
    serde_json::to_writer(&file, &spec).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// What must be gone once an instance is cleaned.
fn assert_nothing_left(paths: &InstancePaths, pod_uids: &[String], task_ids: &[String]) {
    assert!(!paths.dir.exists(), "{} still exists", paths.dir.display());
    assert_eq!(
        instance_processes(paths),
        Vec::<u32>::new(),
        "processes left"
    );
    for uid in pod_uids {
        let left = cgroup::removal::existing_dirs(&pod_cgroup_parent(uid)).unwrap();
        assert!(left.is_empty(), "pod cgroups left: {left:?}");
    }
    for id in task_ids {
        let socket = shim_socket_path(&paths.cri_socket(), CRI_NAMESPACE, id);
        assert!(!socket.exists(), "shim socket left: {}", socket.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(paths.dir.to_string_lossy().as_ref()),
        "mounts left under {}",
        paths.dir.display()
    );
}

#[tokio::test]
async fn pod_with_two_containers_runs_and_cpusets_read_back() {
    let node = start().await;
    let mut cri = node.cri().await.unwrap();
    let uid = new_uid();
    let pod = cri.run_pod("two", "default", &uid).await.unwrap();
    let first = cri
        .run_container(
            &pod,
            &ContainerSpec::sleeper("first").with_cpu(Some(100), None),
        )
        .await
        .unwrap();
    let second = cri
        .run_container(&pod, &ContainerSpec::sleeper("second"))
        .await
        .unwrap();

    let listed = cri.list_containers(Some(&pod.id)).await.unwrap();
    let mut listed_ids: Vec<_> = listed.iter().map(|c| c.id.clone()).collect();
    listed_ids.sort();
    let mut expected = vec![first.clone(), second.clone()];
    expected.sort();
    assert_eq!(listed_ids, expected);

    for id in [&first, &second] {
        let cpus = container_cpus(&mut cri, id).await.unwrap();
        // The kubelet cgroup shape: /kubepods/pod<uid>/<container id>.
        assert!(
            cpus.cgroup.dir.ends_with(format!("kubepods/pod{uid}/{id}")),
            "cgroup dir {}",
            cpus.cgroup.dir.display()
        );
        // No plugin runs: containers get every online CPU and memory node.
        assert_eq!(cpus.cgroup.cpus, online(), "cgroup cpus of {id}");
        assert_eq!(cpus.allowed_inside, online(), "Cpus_allowed_list of {id}");
        assert_eq!(cpus.cgroup.mems, all_mems(), "cgroup mems of {id}");
        // Nobody wrote its cpuset: v1 copies the parent's into cpuset.cpus,
        // v2 leaves it empty and the effective set is what is reported.
        let expected_source = match cpus.cgroup.version {
            cgroup::cpuset::CgroupVersion::V1 => cgroup::cpuset::CpusetSource::Requested,
            cgroup::cpuset::CgroupVersion::V2 => cgroup::cpuset::CpusetSource::Effective,
        };
        assert_eq!(cpus.cgroup.cpus_detail.source, expected_source, "{id}");
    }
    // Kubelet's shares reached the cgroup: 100m is 102 shares (v1
    // `cpu.shares`; on v2 runc's conversion of them in `cpu.weight`).
    let pid = cri.container_pid(&first).await.unwrap();
    let weight = cgroup::weight::cpu_weight_of(pid).unwrap();
    assert!(weight.matches_shares(102), "{weight:?}");

    cri.delete_pod(&pod.id).await.unwrap();
    assert!(cri.list_containers(Some(&pod.id)).await.unwrap().is_empty());
    let paths = node.paths().clone();
    node.stop().unwrap();
    assert_nothing_left(&paths, &[uid], &[first, second, pod.id]);
}

#[tokio::test]
async fn cdi_spec_puts_its_env_into_the_container() {
    let node = start().await;
    let mut cri = node.cri().await.unwrap();
    let claim_uid = new_uid();
    write_cdi_spec(&node.cdi_dir(), &claim_uid, "0");
    let pod = cri.run_pod("cdi", "default", &new_uid()).await.unwrap();
    let device = format!("dra.k8s.io/cpu=claim-{claim_uid}");

    // Kubelet's path since CRI v1.28: the CDI_devices field.
    let with_field = cri
        .run_container(
            &pod,
            &ContainerSpec::sleeper("field").with_cdi_device(&device),
        )
        .await
        .unwrap();
    let env = container_env(&mut cri, &with_field).await.unwrap();
    let key = format!("DRA_CPUSET_{claim_uid}");
    assert_eq!(env.get(&key).map(String::as_str), Some("0"), "env: {env:?}");

    // The older annotation form kubelet also sets, on its own.
    let with_annotation = cri
        .run_container(
            &pod,
            &ContainerSpec::sleeper("annotation")
                .with_annotation("cdi.k8s.io/dra-cpu_claim", &device),
        )
        .await
        .unwrap();
    let env = container_env(&mut cri, &with_annotation).await.unwrap();
    assert_eq!(env.get(&key).map(String::as_str), Some("0"), "env: {env:?}");

    let plain = cri
        .run_container(&pod, &ContainerSpec::sleeper("plain"))
        .await
        .unwrap();
    let env: BTreeMap<_, _> = container_env(&mut cri, &plain).await.unwrap();
    assert!(!env.contains_key(&key), "env without the device: {env:?}");

    // An unknown device is refused by the runtime, with its reason.
    let refused = cri
        .create_container(
            &pod,
            &ContainerSpec::sleeper("unknown").with_cdi_device("dra.k8s.io/cpu=claim-none"),
        )
        .await
        .unwrap_err();
    let message = refused.runtime_message().unwrap_or_default().to_string();
    assert!(message.contains("claim-none"), "refusal: {refused}");
    node.stop().unwrap();
}

#[tokio::test]
async fn update_container_resources_changes_the_cgroup_cpuset() {
    let node = start().await;
    let mut cri = node.cri().await.unwrap();
    let pod = cri.run_pod("update", "default", &new_uid()).await.unwrap();
    let id = cri
        .run_container(
            &pod,
            &ContainerSpec::sleeper("c").with_cpu(Some(500), Some(1000)),
        )
        .await
        .unwrap();
    let first_cpu = online().first().unwrap();
    let mut resources = kubelet_cpu_resources(Some(500), Some(1000));
    resources.cpuset_cpus = first_cpu.to_string();
    cri.update_container_resources(&id, resources.clone())
        .await
        .unwrap();
    let cpus = container_cpus(&mut cri, &id).await.unwrap();
    let expected: CpuSet = [first_cpu].into_iter().collect();
    assert_eq!(cpus.cgroup.cpus, expected);
    assert_eq!(cpus.allowed_inside, expected);

    resources.cpuset_cpus = online().to_cpulist();
    cri.update_container_resources(&id, resources)
        .await
        .unwrap();
    let cpus = container_cpus(&mut cri, &id).await.unwrap();
    assert_eq!(cpus.cgroup.cpus, online());
    assert_eq!(cpus.allowed_inside, online());

    // A cpuset outside the machine is refused, with the runtime's reason.
    let mut impossible = kubelet_cpu_resources(Some(500), Some(1000));
    impossible.cpuset_cpus = "4095".into();
    let refused = cri
        .update_container_resources(&id, impossible)
        .await
        .unwrap_err();
    assert!(refused.runtime_message().is_some(), "{refused}");
    assert_eq!(
        container_cpus(&mut cri, &id).await.unwrap().cgroup.cpus,
        online()
    );
    node.stop().unwrap();
}

#[tokio::test]
async fn two_instances_at_once_do_not_collide() {
    let (a, b) = tokio::join!(start(), start());
    assert_ne!(a.dir(), b.dir());
    let (mut cri_a, mut cri_b) = (a.cri().await.unwrap(), b.cri().await.unwrap());
    // Same pod name and namespace on both nodes: only UIDs differ.
    let (uid_a, uid_b) = (new_uid(), new_uid());
    let pod_a = cri_a.run_pod("same", "default", &uid_a).await.unwrap();
    let pod_b = cri_b.run_pod("same", "default", &uid_b).await.unwrap();
    let c_a = cri_a
        .run_container(&pod_a, &ContainerSpec::sleeper("c"))
        .await
        .unwrap();
    let c_b = cri_b
        .run_container(&pod_b, &ContainerSpec::sleeper("c"))
        .await
        .unwrap();
    let ids =
        |pods: Vec<k8s_cri::v1::PodSandbox>| pods.into_iter().map(|p| p.id).collect::<Vec<_>>();
    assert_eq!(
        ids(cri_a.list_pods().await.unwrap()),
        vec![pod_a.id.clone()]
    );
    assert_eq!(
        ids(cri_b.list_pods().await.unwrap()),
        vec![pod_b.id.clone()]
    );

    // Stopping one leaves the other working.
    let paths_a = a.paths().clone();
    a.stop().unwrap();
    assert_nothing_left(&paths_a, &[uid_a], &[c_a, pod_a.id]);
    let out = cri_b.exec_ok(&c_b, &["echo", "alive"]).await.unwrap();
    assert_eq!(out.trim(), "alive");
    assert_eq!(
        container_cpus(&mut cri_b, &c_b).await.unwrap().cgroup.cpus,
        online()
    );
    let paths_b = b.paths().clone();
    // Dropping cleans as stop does, with the pod still running.
    drop(b);
    assert_nothing_left(&paths_b, &[uid_b], &[c_b, pod_b.id]);
}

#[tokio::test]
async fn containers_survive_a_containerd_restart() {
    let mut node = start().await;
    let mut cri = node.cri().await.unwrap();
    let pod = cri.run_pod("restart", "default", &new_uid()).await.unwrap();
    let id = cri
        .run_container(&pod, &ContainerSpec::sleeper("c"))
        .await
        .unwrap();
    let pid_before = cri.container_pid(&id).await.unwrap();
    let containerd_before = node.pid().unwrap();
    node.restart().await.unwrap();
    assert_ne!(node.pid().unwrap(), containerd_before);
    assert!(node.nri_socket().exists());
    let mut cri = node.cri().await.unwrap();
    assert_eq!(cri.container_pid(&id).await.unwrap(), pid_before);
    assert_eq!(
        cri.exec_ok(&id, &["echo", "ok"]).await.unwrap().trim(),
        "ok"
    );
    node.stop().unwrap();
}

/// Not a test on its own: the owner process `a_crashed_run_is_reaped_by_the_next`
/// starts and then kills with SIGKILL.
#[tokio::test]
#[ignore = "helper process of a_crashed_run_is_reaped_by_the_next"]
async fn crash_helper_owner() {
    let Ok(parent) = std::env::var(CRASH_HELPER_ENV) else {
        return;
    };
    let node = Containerd::start(ContainerdOptions {
        parent_dir: PathBuf::from(&parent),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut cri = node.cri().await.unwrap();
    let uid = new_uid();
    let pod = cri.run_pod("crash", "default", &uid).await.unwrap();
    let id = cri
        .run_container(&pod, &ContainerSpec::sleeper("c"))
        .await
        .unwrap();
    let report = format!("{}\n{uid}\n{id}\n{}\n", node.dir().display(), pod.id);
    std::fs::write(Path::new(&parent).join("ready.tmp"), report).unwrap();
    std::fs::rename(
        Path::new(&parent).join("ready.tmp"),
        Path::new(&parent).join("ready"),
    )
    .unwrap();
    // Killed here; the Containerd is never dropped.
    std::mem::forget(node);
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// Kills the helper and reaps what it left even when an assertion fails, so
/// a failing run does not leave a containerd behind.
struct HelperGuard {
    child: std::process::Child,
    parent: tempfile::TempDir,
}

impl Drop for HelperGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        reap_stale_instances(self.parent.path());
    }
}

#[tokio::test]
async fn a_crashed_run_is_reaped_by_the_next() {
    let parent = tempfile::Builder::new()
        .prefix("dcpu-reap-")
        .tempdir_in("/tmp")
        .unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_helper_owner", "--ignored", "--nocapture"])
        .env(CRASH_HELPER_ENV, parent.path())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut guard = HelperGuard { child, parent };
    let (helper, parent) = (&mut guard.child, &guard.parent);
    let ready = parent.path().join("ready");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready.exists() {
        if let Ok(Some(status)) = helper.try_wait() {
            panic!("crash helper exited early: {status}");
        }
        assert!(Instant::now() < deadline, "crash helper never got ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = std::fs::read_to_string(&ready).unwrap();
    let lines: Vec<&str> = report.lines().collect();
    let paths = InstancePaths {
        dir: PathBuf::from(lines[0]),
    };
    let (uid, container, sandbox) = (lines[1].to_string(), lines[2], lines[3]);
    helper.kill().unwrap();
    helper.wait().unwrap();

    // The crash left a running containerd, shims, a container and its cgroups.
    assert!(!instance_processes(&paths).is_empty());
    assert!(!cgroup::removal::existing_dirs(&pod_cgroup_parent(&uid))
        .unwrap()
        .is_empty());

    let reaped = reap_stale_instances(parent.path());
    assert_eq!(reaped, vec![paths.dir.clone()]);
    assert_nothing_left(
        &paths,
        &[uid],
        &[container.to_string(), sandbox.to_string()],
    );

    // And the next run starts normally.
    let node = Containerd::start(ContainerdOptions {
        parent_dir: parent.path().to_path_buf(),
        ..Default::default()
    })
    .await
    .unwrap();
    node.stop().unwrap();
    drop(guard);
}

const ROUNDS: usize = 5;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Prints how long a containerd start, a pod start (sandbox and one
/// container) and a whole start-to-clean cycle take on this machine. Only
/// the work is asserted, never the time.
#[tokio::test]
async fn harness_timings() {
    let (mut bare_starts, mut starts, mut pods, mut cycles) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let bare = Instant::now();
        let node = Containerd::start(ContainerdOptions {
            import_image: false,
            ..Default::default()
        })
        .await
        .unwrap();
        bare_starts.push(bare.elapsed());
        assert!(node.nri_socket().exists());
        node.stop().unwrap();

        let cycle = Instant::now();
        let node = start().await;
        starts.push(cycle.elapsed());
        let mut cri = node.cri().await.unwrap();
        let pod_start = Instant::now();
        let pod = cri.run_pod("timing", "default", &new_uid()).await.unwrap();
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper("c"))
            .await
            .unwrap();
        pods.push(pod_start.elapsed());
        assert_eq!(
            container_cpus(&mut cri, &id).await.unwrap().cgroup.cpus,
            online()
        );
        node.stop().unwrap();
        cycles.push(cycle.elapsed());
    }
    eprintln!(
        "harness timings (median of {ROUNDS}): containerd start {:?} without image, {:?} with \
         image import; pod start (sandbox + 1 container) {:?}; whole cycle (start, pod, \
         read-back, stop, cleanup) {:?}",
        median(bare_starts),
        median(starts),
        median(pods),
        median(cycles)
    );
}
