//! The native NRI client against the real containerd of the harness: the
//! example plugin registers, synchronizes, pins a new container and updates
//! another in the same reply, reports handler errors and panics to the
//! runtime without dying, and comes back by itself after containerd restarts.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../proto/nri-sdk/examples/nri_pin_by_annotation/plugin.rs"]
mod pin_plugin;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dra_cpu_nri::client::{run_with_reconnect, NriClientOptions, NriUpdater, SocketSource};
use dra_cpu_nri::events::EventMask;
use dra_cpu_nri::plugin::{ContainerCreation, NriPlugin, PluginError};
use dra_cpu_proto::nri::api::{self, Container, Event, PodSandbox};
use dra_cpu_tests::cgroup::container::{container_cpus, container_env};
use dra_cpu_tests::containerd::config::ContainerdOptions;
use dra_cpu_tests::containerd::{Containerd, ContainerdError};
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::cri::CriClient;
use dra_cpu_tests::skip::skip_or_fail_in_ci;
use pin_plugin::{
    PinByAnnotation, Seen, ALSO_UPDATE_ANNOTATION, CPUSET_ANNOTATION, FAIL_ANNOTATION,
    PANIC_ANNOTATION,
};
use shared_state::cpuset::CpuSet;

/// Adds many environment variables to containers that ask for it, so
/// messages in both directions span several 4 KiB frames.
struct ManyEnv;

const MANY_ENV_ANNOTATION: &str = "test.dra.cpu/many-env";
const MANY: usize = 400;

fn env_pair(prefix: &str, i: usize) -> (String, String) {
    (
        format!("{prefix}_{i:04}"),
        format!("value-{i}-{}", "x".repeat(32)),
    )
}

#[async_trait]
impl NriPlugin for ManyEnv {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER])
    }

    async fn create_container(
        &self,
        _pod: PodSandbox,
        container: Container,
    ) -> Result<ContainerCreation, PluginError> {
        if !container.annotations.contains_key(MANY_ENV_ANNOTATION) {
            return Ok(ContainerCreation::default());
        }
        let seen = container
            .env
            .iter()
            .filter(|e| e.starts_with("FROM_SPEC_"))
            .count();
        if seen != MANY {
            return Err(PluginError::failed(format!(
                "request carried {seen} of {MANY} spec variables"
            )));
        }
        let mut adjust = api::ContainerAdjustment::new();
        adjust.env = (0..MANY)
            .map(|i| {
                let (key, value) = env_pair("FROM_PLUGIN", i);
                let mut kv = api::KeyValue::new();
                kv.key = key;
                kv.value = value;
                kv
            })
            .collect();
        Ok(ContainerCreation {
            adjust: Some(adjust),
            ..Default::default()
        })
    }
}

/// Upper bound for the runtime to deliver something; reaching it fails the
/// test with what was seen so far.
const EVENT_WAIT: Duration = Duration::from_secs(60);

async fn wait_for(plugin: &PinByAnnotation, what: &str, mut done: impl FnMut(&[Seen]) -> bool) {
    let started = Instant::now();
    loop {
        let seen = plugin.seen();
        if done(&seen) {
            return;
        }
        assert!(
            started.elapsed() < EVENT_WAIT,
            "plugin never saw {what}; saw {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn synchronizations(seen: &[Seen]) -> Vec<Vec<String>> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Synchronize { containers, .. } => Some(containers.clone()),
            _ => None,
        })
        .collect()
}

async fn cgroup_cpus(cri: &mut CriClient, id: &str) -> (CpuSet, CpuSet) {
    let cpus = container_cpus(cri, id)
        .await
        .expect("read container cpuset");
    (cpus.cgroup.cpus, cpus.allowed_inside)
}

fn cpus(list: &str) -> CpuSet {
    CpuSet::parse_cpulist(list).expect("cpulist")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_plugin_against_real_containerd() {
    let mut containerd = match Containerd::start(ContainerdOptions::default()).await {
        Ok(c) => c,
        Err(e @ ContainerdError::NotInstalled { .. }) => {
            skip_or_fail_in_ci(e);
            return;
        }
        Err(e) => panic!("starting containerd: {e}"),
    };
    let mut cri = containerd.cri().await.expect("CRI client");

    // A container that runs before the plugin exists: Synchronize must list it.
    let pod = cri
        .run_pod(
            "nri-early",
            "default",
            "0e0e0e0e-0000-4000-8000-000000000001",
        )
        .await
        .expect("pod");
    let early = cri
        .run_container(&pod, &ContainerSpec::sleeper("early"))
        .await
        .expect("early container");

    let plugin = Arc::new(PinByAnnotation::new());
    let updater = NriUpdater::new();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(run_with_reconnect(
        plugin.clone(),
        SocketSource::Path(containerd.nri_socket()),
        NriClientOptions::new("pin_by_annotation", "50"),
        updater.clone(),
        async {
            let _ = stop_rx.await;
        },
    ));

    wait_for(&plugin, "Synchronize with the early container", |seen| {
        synchronizations(seen).iter().any(|c| c.contains(&early))
    })
    .await;
    match plugin.seen().first() {
        Some(Seen::Configure { runtime, version }) => {
            assert!(runtime.contains("containerd"), "runtime name {runtime:?}");
            assert!(
                version.starts_with("1.7") || version.starts_with("v1.7"),
                "runtime version {version:?}"
            );
        }
        other => panic!("first event must be Configure, got {other:?}"),
    }
    let info = updater
        .runtime_info()
        .expect("runtime info after Configure");
    assert!(
        !info.unsolicited_updates_safe(),
        "containerd 1.7 (NRI 0.6.1) must not be trusted with unsolicited updates: {info:?}"
    );

    // CreateContainer: pin the new container and re-pin the early one in the
    // same reply.
    let pinned_spec = ContainerSpec::sleeper("pinned")
        .with_annotation(CPUSET_ANNOTATION, "1")
        .with_annotation(ALSO_UPDATE_ANNOTATION, &format!("{early}:0"));
    let pinned = cri
        .run_container(&pod, &pinned_spec)
        .await
        .expect("pinned container");
    assert_eq!(
        cgroup_cpus(&mut cri, &pinned).await,
        (cpus("1"), cpus("1")),
        "new container pinned"
    );
    assert_eq!(
        cgroup_cpus(&mut cri, &early).await,
        (cpus("0"), cpus("0")),
        "other container updated"
    );

    // Events delivered as StateChange by NRI 0.6.1 reach the same handlers.
    wait_for(&plugin, "StartContainer of the pinned container", |seen| {
        seen.contains(&Seen::StartContainer(pinned.clone()))
    })
    .await;

    // A handler error is reported to the runtime, which refuses the container.
    let refused = ContainerSpec::sleeper("refused")
        .with_annotation(FAIL_ANNOTATION, "no CPUs left for this one");
    let err = cri
        .create_container(&pod, &refused)
        .await
        .expect_err("creation must fail");
    let message = err.runtime_message().unwrap_or_default().to_string();
    assert!(
        message.contains("no CPUs left for this one"),
        "runtime error: {err}"
    );

    // So is a panic in a handler.
    let panicking =
        ContainerSpec::sleeper("panicking").with_annotation(PANIC_ANNOTATION, "handler bug");
    let err = cri
        .create_container(&pod, &panicking)
        .await
        .expect_err("creation must fail");
    let message = err.runtime_message().unwrap_or_default().to_string();
    assert!(
        message.contains("panicked") && message.contains("handler bug"),
        "runtime error: {err}"
    );

    // ... and the plugin is still serving.
    let after_errors = cri
        .run_container(
            &pod,
            &ContainerSpec::sleeper("after-errors").with_annotation(CPUSET_ANNOTATION, "0"),
        )
        .await
        .expect("container after handler errors");
    assert_eq!(cgroup_cpus(&mut cri, &after_errors).await.0, cpus("0"));

    // containerd restarts: the plugin reconnects and resynchronizes by itself.
    let syncs_before = synchronizations(&plugin.seen()).len();
    containerd.restart().await.expect("restart containerd");
    wait_for(&plugin, "a new Synchronize after the restart", |seen| {
        let syncs = synchronizations(seen);
        syncs.len() > syncs_before
            && syncs
                .last()
                .is_some_and(|c| c.contains(&early) && c.contains(&pinned))
    })
    .await;
    let mut cri = containerd.cri().await.expect("CRI client after restart");
    let after_restart_spec = ContainerSpec::sleeper("after-restart")
        .with_annotation(CPUSET_ANNOTATION, "0")
        .with_annotation(ALSO_UPDATE_ANNOTATION, &format!("{pinned}:0-1"));
    let after_restart = cri
        .run_container(&pod, &after_restart_spec)
        .await
        .expect("container after restart");
    assert_eq!(
        cgroup_cpus(&mut cri, &after_restart).await,
        (cpus("0"), cpus("0"))
    );
    assert_eq!(
        cgroup_cpus(&mut cri, &pinned).await,
        (cpus("0-1"), cpus("0-1"))
    );

    // Messages larger than one frame, in both directions, through the Go
    // runtime's multiplexer.
    let (big_stop_tx, big_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let big_updater = NriUpdater::new();
    let big_runner = tokio::spawn(run_with_reconnect(
        Arc::new(ManyEnv),
        SocketSource::Path(containerd.nri_socket()),
        NriClientOptions::new("many_env", "60"),
        big_updater.clone(),
        async {
            let _ = big_stop_rx.await;
        },
    ));
    let started = Instant::now();
    while big_updater.runtime_info().is_none() {
        assert!(
            started.elapsed() < EVENT_WAIT,
            "second plugin never configured"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut many_spec =
        ContainerSpec::sleeper("many-env").with_annotation(MANY_ENV_ANNOTATION, "yes");
    for i in 0..MANY {
        let (key, value) = env_pair("FROM_SPEC", i);
        many_spec = many_spec.with_env(&key, &value);
    }
    let many = cri
        .run_container(&pod, &many_spec)
        .await
        .expect("container with many variables");
    let env = container_env(&mut cri, &many)
        .await
        .expect("env inside container");
    for prefix in ["FROM_SPEC", "FROM_PLUGIN"] {
        for i in [0, MANY / 2, MANY - 1] {
            let (key, value) = env_pair(prefix, i);
            assert_eq!(env.get(&key), Some(&value), "{key} inside the container");
        }
        let count = env.keys().filter(|k| k.starts_with(prefix)).count();
        assert_eq!(count, MANY, "{prefix} variables inside the container");
    }
    let _ = big_stop_tx.send(());
    big_runner
        .await
        .expect("second runner task")
        .expect("second runner result");

    let _ = stop_tx.send(());
    runner.await.expect("runner task").expect("runner result");
    assert!(
        !updater.is_connected(),
        "stopped runner leaves no connection behind"
    );
    cri.delete_pod(&pod.id).await.expect("remove pod");
    containerd.stop().expect("clean up containerd");
}
