//! Runtime faults during a pod churn on the real containerd: nri-plugin
//! killed, dra-plugin unreachable, containerd restarted, each before or
//! after a claim pod and a shared pod are created, in a seeded random
//! order. After each recovery every live container's cpuset, read from its
//! cgroup and from inside it, is right. Needs root and
//! `scripts/install-deps.sh`, like the other node tests.
//!
//! `DRA_CPU_FAULT_ROUNDS` sets the rounds (9 by default, each fault three
//! times); `DRA_CPU_FAULT_SEED` replays an order.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::Node;
use dra_cpu_tests::seed::seed_from_env;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    NriPluginKilled,
    DraPluginDown,
    ContainerdRestarted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    BeforeCreate,
    AfterCreate,
}

/// Small, seedable: the point is a reproducible order.
fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

async fn inject(node: &mut Node, fault: Fault) {
    match fault {
        Fault::NriPluginKilled => node.kill_nri_plugin(),
        Fault::DraPluginDown => node.kill_dra_plugin(),
        Fault::ContainerdRestarted => node
            .restart_containerd()
            .await
            .must("restarting containerd"),
    }
}

async fn recover(node: &mut Node, fault: Fault) {
    match fault {
        Fault::NriPluginKilled => node.start_nri_plugin().await.must("starting nri-plugin"),
        Fault::DraPluginDown => {
            node.start_dra_plugin().await.must("starting dra-plugin");
            node.wait_nri_ready(true)
                .await
                .must("nri-plugin subscribed again");
        }
        Fault::ContainerdRestarted => {}
    }
}

#[tokio::test]
async fn every_cpuset_is_right_after_each_fault_of_a_pod_churn() {
    let rounds: usize = std::env::var("DRA_CPU_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let mut seed: u64 = seed_from_env("DRA_CPU_FAULT_SEED") | 1;
    eprintln!("fault order seed {seed} (DRA_CPU_FAULT_SEED replays it)");
    // Each fault equally often, in a shuffled order.
    let all_faults = [
        Fault::NriPluginKilled,
        Fault::DraPluginDown,
        Fault::ContainerdRestarted,
    ];
    let mut plan: Vec<(Fault, When)> = (0..rounds)
        .map(|i| {
            let when = if xorshift(&mut seed).is_multiple_of(2) {
                When::BeforeCreate
            } else {
                When::AfterCreate
            };
            (all_faults[i % 3], when)
        })
        .collect();
    for i in (1..plan.len()).rev() {
        let j = (xorshift(&mut seed) % (i as u64 + 1)) as usize;
        plan.swap(i, j);
    }

    let mut node = Node::start(NodeOptions::default())
        .await
        .must("starting the node");
    let all = node.allocatable().must("online CPUs");
    let watcher_pod = PodIdentity::new("watcher");
    let watcher = node
        .start_pod(
            &watcher_pod,
            &[ContainerSpec::sleeper("app").with_cpu(Some(200), None)],
        )
        .await
        .must("starting the watcher");
    let watcher = watcher.id("app").to_string();
    node.wait_cpus(&watcher, &all)
        .await
        .must("watcher on every CPU");

    let mut survived = Vec::new();
    for (round, (fault, when)) in plan.into_iter().enumerate() {
        let what = |step: &str| format!("round {round} ({fault:?} {when:?}): {step}");
        let pod = PodIdentity::new(&format!("churn-{round}"));
        let claim = node
            .create_claim(&format!("churn-{round}-cpu"), 1, &pod)
            .await
            .must(&what("preparing the claim"));
        if when == When::BeforeCreate {
            inject(&mut node, fault).await;
        }
        let claimed = node
            .start_pod(
                &pod,
                &[ContainerSpec::sleeper("app").with_cdi_device(&claim.cdi_device)],
            )
            .await
            .must(&what("starting the claim pod"));
        let shared_identity = PodIdentity::new(&format!("churn-{round}-shared"));
        let shared = node
            .start_pod(
                &shared_identity,
                &[ContainerSpec::sleeper("app").with_cpu(Some(100), None)],
            )
            .await
            .must(&what("starting the shared pod"));
        if when == When::AfterCreate {
            inject(&mut node, fault).await;
        }
        recover(&mut node, fault).await;

        let pool = all.difference(&claim.cpus);
        node.wait_cpus(claimed.id("app"), &claim.cpus)
            .await
            .must(&what("the claim container pinned"));
        node.wait_cpus(&watcher, &pool)
            .await
            .must(&what("the watcher on the shared pool"));
        node.wait_cpus(shared.id("app"), &pool)
            .await
            .must(&what("the shared pod on the shared pool"));

        node.delete_pod(&claimed)
            .await
            .must(&what("deleting the claim pod"));
        node.delete_pod(&shared)
            .await
            .must(&what("deleting the shared pod"));
        node.unprepare(&claim.claim)
            .await
            .must(&what("unpreparing"));
        node.after_unprepare()
            .await
            .must(&what("the event after unprepare"));
        node.wait_cpus(&watcher, &all)
            .await
            .must(&what("the watcher grown back"));
        for uid in [&pod.uid, &shared_identity.uid] {
            dra_cpu_tests::cgroup::removal::remove_everywhere(&format!("kubepods/pod{uid}"))
                .must("removing the pod cgroup, as kubelet does");
        }
        survived.push((fault, when));
    }
    eprintln!("faults survived: {} {:?}", survived.len(), survived);
    assert_eq!(survived.len(), rounds);
}
