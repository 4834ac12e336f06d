//! `v1.DRAResourceHealth` on the DRA socket, as kubelet calls it: a first
//! answer at once listing every device of this node's pool as healthy, a
//! stream that then stays open (kubelet reads a closed stream as the plugin
//! going away) and reports a device whose CPU goes offline, and that ends
//! when the daemon stops rather than holding it up. The periodic re-send is
//! tested in `dra-plugin/src/kubelet/device_health.rs` on a paused clock.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pod_uid, prepare_ok, Node, FIXTURE_NUMA_DEVICES, NODE, WAIT};
use dra_cpu_proto::kubelet::health_v1;
use dra_cpu_tests::kubelet_dra::health::{DeviceHealthState, HealthApi, KubeletRelease};
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_cpu_transport::connect_unix;
use dra_plugin::devices::DeviceMode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

async fn watch(node: &Node) -> tonic::Streaming<health_v1::NodeWatchResourcesResponse> {
    let channel = connect_unix(&node.config.dra_socket())
        .await
        .expect("connect to the DRA socket");
    health_v1::dra_resource_health_client::DraResourceHealthClient::new(channel)
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .expect("NodeWatchResources")
        .into_inner()
}

/// The first answer of a fresh watch, within [`WAIT`].
async fn first_answer(
    node: &Node,
) -> (
    Vec<health_v1::DeviceHealth>,
    tonic::Streaming<health_v1::NodeWatchResourcesResponse>,
) {
    let mut stream = watch(node).await;
    let first = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("an answer in time")
        .expect("a healthy stream")
        .expect("a first message");
    (first.devices, stream)
}

fn assert_all_healthy(devices: &[health_v1::DeviceHealth], since: i64, when: &str) {
    for d in devices {
        let id = d.device.as_ref().expect("device identifier");
        assert_eq!(id.pool_name, NODE, "{when}: pool of {}", id.device_name);
        assert_eq!(
            d.health,
            health_v1::HealthStatus::Healthy as i32,
            "{when}: {} not healthy",
            id.device_name
        );
        assert!(
            (since..=unix_now()).contains(&d.last_updated_time),
            "{when}: {} updated at {}, not during the call",
            id.device_name,
            d.last_updated_time
        );
        assert_eq!(
            d.health_check_timeout_seconds, 30,
            "{when}: kubelet's timeout, stated"
        );
        assert_eq!(d.message, "", "{when}");
    }
}

fn names(devices: &[health_v1::DeviceHealth]) -> Vec<String> {
    devices
        .iter()
        .map(|d| d.device.as_ref().expect("id").device_name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_reports_every_device_healthy_and_ends_at_shutdown() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let since = unix_now();
    let (devices, mut stream) = first_answer(&node).await;
    assert_eq!(names(&devices), FIXTURE_NUMA_DEVICES);
    assert_all_healthy(&devices, since, "idle node");

    // A device with a prepared claim is still listed, still healthy.
    let claim = node.claim("web", &[("cpudevnuma002", Some("4"))], &pod_uid(1));
    prepare_ok(&running.kubelet, &claim).await;
    let since = unix_now();
    let (again, mut second) = first_answer(&node).await;
    assert_eq!(names(&again), names(&devices));
    assert_all_healthy(&again, since, "with a prepared claim");

    // Nothing more is sent, and the stream stays open.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err(),
        "the watch sent a second message or closed"
    );

    // Stopping the daemon is not held up by open watches, and ends them.
    tokio::time::timeout(WAIT, running.stop())
        .await
        .expect("the daemon stops with two watches open")
        .expect("clean stop");
    for stream in [&mut stream, &mut second] {
        let end = tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("the watch ends with the daemon");
        assert!(!matches!(end, Ok(Some(_))), "{end:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_lists_each_cpu_in_individual_mode() {
    let node = Node::new(DeviceMode::Individual);
    let running = node.start(DraVersion::V1).await;
    let since = unix_now();
    let (devices, _stream) = first_answer(&node).await;
    let listed = names(&devices);
    let unique: std::collections::BTreeSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "a device listed twice");
    // No CPUs are reserved in this fixture: one device per online CPU.
    assert_eq!(listed.len(), node.topology.online().len());
    assert_all_healthy(&devices, since, "individual mode");
    running.stop().await.expect("clean stop");
}

/// Kubelets of 1.34 watch health through `v1alpha1.DRAResourceHealth`: the
/// same devices, healthy, on a stream that stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_answers_the_v1alpha1_api_too() {
    use dra_cpu_proto::kubelet::health_v1alpha1 as alpha;
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let since = unix_now();
    let (v1_devices, _v1_stream) = first_answer(&node).await;
    let channel = connect_unix(&node.config.dra_socket())
        .await
        .expect("connect to the DRA socket");
    let mut stream = alpha::dra_resource_health_client::DraResourceHealthClient::new(channel)
        .node_watch_resources(alpha::NodeWatchResourcesRequest {})
        .await
        .expect("v1alpha1 NodeWatchResources is served")
        .into_inner();
    let first = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("an answer in time")
        .expect("a healthy stream")
        .expect("a first message");
    let alpha_names: Vec<String> = first
        .devices
        .iter()
        .map(|d| {
            let id = d.device.as_ref().expect("device identifier");
            assert_eq!(id.pool_name, NODE);
            assert_eq!(
                d.health,
                alpha::HealthStatus::Healthy as i32,
                "{}",
                id.device_name
            );
            assert!((since..=unix_now()).contains(&d.last_updated_time));
            id.device_name.clone()
        })
        .collect();
    assert_eq!(alpha_names, names(&v1_devices));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err(),
        "the v1alpha1 watch sent a second message or closed"
    );
    running.stop().await.expect("clean stop");
}

/// A CPU the kernel takes offline turns the device holding it Unhealthy on
/// the open stream within a poll, with a message naming the CPU, and Healthy
/// again when it comes back; the other devices stay Healthy throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_going_offline_turns_its_device_unhealthy_and_back() {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let (devices, mut stream) = first_answer(&node).await;
    assert!(devices
        .iter()
        .all(|d| d.health == health_v1::HealthStatus::Healthy as i32));
    let online_file = node.config.sysfs_root.join("sys/devices/system/cpu/online");
    let online = node.topology.online();
    let victim = online.iter().last().expect("an online CPU");
    let mut fewer = online.clone();
    fewer.remove(victim);
    std::fs::write(&online_file, format!("{fewer}\n")).expect("take a CPU offline");

    // The change arrives within a few polls, not after the 10 s period.
    let (all, unhealthy) = next_with(&mut stream, true).await;
    assert_eq!(all.len(), devices.len(), "every device is still reported");
    assert_eq!(unhealthy.len(), 1, "{unhealthy:?}");
    assert_eq!(
        unhealthy[0].message,
        format!("CPUs {victim} of this device are offline")
    );

    std::fs::write(&online_file, format!("{online}\n")).expect("bring the CPU back");
    let (all, unhealthy) = next_with(&mut stream, false).await;
    assert!(unhealthy.is_empty());
    assert!(all
        .iter()
        .all(|d| d.health == health_v1::HealthStatus::Healthy as i32 && d.message.is_empty()));
    running.stop().await.expect("clean stop");
}

/// The next report whose set of Unhealthy devices is empty or not as asked:
/// every device, and the unhealthy ones.
async fn next_with(
    stream: &mut tonic::Streaming<health_v1::NodeWatchResourcesResponse>,
    want_unhealthy: bool,
) -> (Vec<health_v1::DeviceHealth>, Vec<health_v1::DeviceHealth>) {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("a report within 5 s")
            .expect("a healthy stream")
            .expect("a message");
        let unhealthy: Vec<_> = message
            .devices
            .iter()
            .filter(|d| d.health == health_v1::HealthStatus::Unhealthy as i32)
            .cloned()
            .collect();
        if unhealthy.is_empty() != want_unhealthy {
            return (message.devices, unhealthy);
        }
    }
}

/// Watches health as a kubelet of `release` does for [`KEEP_KNOWN_FOR`],
/// checking every second that every published device is Healthy and none
/// turned Unknown (kubelet's 30 s timeout), and that reports kept coming.
async fn stays_healthy_for_a_kubelet_of(release: KubeletRelease, want_api: HealthApi) {
    let node = Node::new(DeviceMode::Grouped);
    let running = node.start(DraVersion::V1).await;
    let watch = running
        .kubelet
        .watch_health(release)
        .await
        .expect("NodeWatchResources")
        .expect("this kubelet opens a health stream for dra-plugin");
    assert_eq!(watch.api, want_api);
    let devices: Vec<String> = {
        let (first, _stream) = first_answer(&node).await;
        names(&first)
    };
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    // The first report may take a moment to arrive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    while started.elapsed() < KEEP_KNOWN_FOR {
        ticks.tick().await;
        assert!(watch.is_open(), "{release:?}: the stream closed");
        for device in &devices {
            assert_eq!(
                watch.state(NODE, device),
                DeviceHealthState::Healthy,
                "{release:?}: {device} after {:?}",
                started.elapsed()
            );
        }
    }
    // A report at least every 10 s, so two lost ones still keep it known.
    let reports = watch.reports();
    let at_least = (KEEP_KNOWN_FOR.as_secs() / 10) as usize;
    assert!(
        reports >= at_least,
        "{release:?}: {reports} reports in {KEEP_KNOWN_FOR:?}"
    );
    running.stop().await.expect("clean stop");
}

/// Four times kubelet's 30 s Unknown timeout.
const KEEP_KNOWN_FOR: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_37_kubelet_opens_v1_and_sees_no_device_unknown_for_two_minutes() {
    stays_healthy_for_a_kubelet_of(KubeletRelease::V1_37, HealthApi::V1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_34_kubelet_opens_v1alpha1_and_sees_no_device_unknown_for_two_minutes() {
    stays_healthy_for_a_kubelet_of(KubeletRelease::V1_34, HealthApi::V1alpha1).await;
}
