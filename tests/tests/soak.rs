//! Soak: pod create/delete cycles on the real containerd with dra-plugin and
//! nri-plugin as their own processes, rotating exclusive, mixed and shared
//! pods, next to a long-lived shared pod. Every cycle checks the new
//! container's cpuset and the long-lived pod's (cgroup and inside), and that
//! no container cgroup of the deleted pod is left. At the end: no claim in
//! dra-plugin's store, no CDI spec, no pod cgroup left,
//! file descriptors of both processes back to their level after warm-up and
//! resident memory within a stated bound.
//!
//! 100 cycles by default; `DRA_CPU_SOAK_CYCLES=1000` for the full run. Needs
//! root and `scripts/install-deps.sh`, like the other end-to-end tests.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::Node;
use e2e_common::{node, shared_pod};
use shared_state::CpuSet;

/// Descriptors a process may hold above its post-warm-up count at the end:
/// a reconnecting gRPC channel or a sled segment file may come and go.
const FD_SLACK: usize = 8;
/// Resident memory a process may gain from the post-warm-up level to the
/// end. sled's page cache and allocator arenas settle within a few MiB;
/// a per-cycle leak of even 32 KiB would exceed this over 1000 cycles.
const RSS_GROWTH_BOUND_KIB: u64 = 32 * 1024;
/// Cycles before the baseline is taken: first-use allocations are not leaks.
const WARM_UP: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    fds: usize,
    rss_kib: u64,
}

fn usage(pid: u32) -> Usage {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for {pid}"));
    Usage { fds, rss_kib }
}

fn pids(node: &Node) -> (u32, u32) {
    (
        node.dra_plugin_pid().expect("dra-plugin runs"),
        node.nri_plugin_pid().expect("nri-plugin runs"),
    )
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Exclusive,
    Mixed,
    Shared,
}

#[tokio::test]
async fn pod_cycles_leave_nothing_behind_and_keep_every_cpuset_right() {
    let cycles: usize = std::env::var("DRA_CPU_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut node = node(NodeOptions {
        mixed_allocation_mode: true,
        ..Default::default()
    })
    .await;
    let all = node.allocatable().must("online CPUs");
    let (_watcher, watcher) = shared_pod(&mut node, "watcher", 200).await;
    node.wait_cpus(&watcher, &all)
        .await
        .must("watcher on every CPU");
    let started_usage = {
        let (d, n) = pids(&node);
        (usage(d), usage(n))
    };
    let mut baseline = started_usage;
    let mut pod_uids = Vec::new();
    let started = std::time::Instant::now();
    let mut samples = 0usize;

    for cycle in 0..cycles {
        let kind = [Kind::Exclusive, Kind::Mixed, Kind::Shared][cycle % 3];
        let pod = PodIdentity::new(&format!("soak-{cycle}"));
        pod_uids.push(pod.uid.clone());
        let what = |step: &str| format!("cycle {cycle} ({kind:?}): {step}");
        match kind {
            Kind::Exclusive | Kind::Mixed => {
                let claim = node
                    .create_claim(&format!("soak-{cycle}-cpu"), 1, &pod)
                    .await
                    .must(&what("preparing the claim"));
                let request = matches!(kind, Kind::Mixed).then_some(500);
                let spec = ContainerSpec::sleeper("app")
                    .with_cdi_device(&claim.cdi_device)
                    .with_cpu(request, None);
                let running = node.start_pod(&pod, &[spec]).await.must(&what("starting"));
                let pool = all.difference(&claim.cpus);
                let want: CpuSet = match kind {
                    Kind::Exclusive => claim.cpus.clone(),
                    _ => claim.cpus.union(&pool),
                };
                node.wait_cpus(running.id("app"), &want)
                    .await
                    .must(&what("the claim container's cpuset"));
                node.wait_cpus(&watcher, &pool)
                    .await
                    .must(&what("the watcher off the claim's CPU"));
                samples += 2;
                node.delete_pod(&running).await.must(&what("deleting"));
                node.unprepare(&claim.claim)
                    .await
                    .must(&what("unpreparing"));
                node.after_unprepare().await.must(&what("after unprepare"));
                assert_eq!(
                    node.claim_cpus(&claim.claim.uid),
                    None,
                    "{}",
                    what("CDI spec left")
                );
            }
            Kind::Shared => {
                let spec = ContainerSpec::sleeper("app").with_cpu(Some(100), None);
                let running = node.start_pod(&pod, &[spec]).await.must(&what("starting"));
                node.wait_cpus(running.id("app"), &all)
                    .await
                    .must(&what("the shared container's cpuset"));
                samples += 1;
                node.delete_pod(&running).await.must(&what("deleting"));
            }
        }
        node.wait_cpus(&watcher, &all)
            .await
            .must(&what("the watcher grown back"));
        samples += 1;
        // The runtime removed the container cgroups; the pod-level cgroup is
        // kubelet's to remove, so the stand-in does that here.
        let relative = format!("kubepods/pod{}", pod.uid);
        let mut left = Vec::new();
        for dir in dra_cpu_tests::cgroup::removal::existing_dirs(&relative).must("pod cgroups") {
            left.extend(
                std::fs::read_dir(&dir)
                    .map(|d| {
                        d.filter_map(Result::ok)
                            .filter(|e| e.path().is_dir())
                            .map(|e| e.path())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default(),
            );
        }
        assert!(
            left.is_empty(),
            "{}: {left:?}",
            what("container cgroups left")
        );
        dra_cpu_tests::cgroup::removal::remove_everywhere(&relative)
            .must("removing the pod cgroup");
        if cycle + 1 == WARM_UP {
            let (d, n) = pids(&node);
            baseline = (usage(d), usage(n));
        }
    }

    let elapsed = started.elapsed();
    let (d, n) = pids(&node);
    let end = (usage(d), usage(n));
    eprintln!(
        "soak: {cycles} cycles in {:.0} s, {samples} cpuset samples; dra-plugin fds/RSS KiB start {:?} after warm-up {:?} end {:?}; nri-plugin start {:?} after warm-up {:?} end {:?}",
        elapsed.as_secs_f64(),
        started_usage.0,
        baseline.0,
        end.0,
        started_usage.1,
        baseline.1,
        end.1
    );
    for (name, base, now) in [
        ("dra-plugin", baseline.0, end.0),
        ("nri-plugin", baseline.1, end.1),
    ] {
        assert!(
            now.fds <= base.fds + FD_SLACK,
            "{name} holds {} descriptors, {} after warm-up",
            now.fds,
            base.fds
        );
        assert!(
            now.rss_kib <= base.rss_kib + RSS_GROWTH_BOUND_KIB,
            "{name} grew from {} KiB to {} KiB",
            base.rss_kib,
            now.rss_kib
        );
    }
    // Nothing left: no claim in the store, no spec, no pod cgroup.
    let claims = node.stored_claims().await.must("stored claims");
    assert!(claims.is_empty(), "claims left in the store: {claims:?}");
    let specs: Vec<_> = std::fs::read_dir(&node.layout().cdi_dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    assert!(specs.is_empty(), "CDI specs left: {specs:?}");
    let mut left = Vec::new();
    for uid in &pod_uids {
        left.extend(
            dra_cpu_tests::cgroup::removal::existing_dirs(&format!("kubepods/pod{uid}"))
                .must("looking for pod cgroups"),
        );
    }
    assert!(left.is_empty(), "pod cgroups left: {left:?}");
    // The long-lived pod was right throughout and still is.
    node.wait_cpus(&watcher, &all)
        .await
        .must("the watcher at the end");
}
