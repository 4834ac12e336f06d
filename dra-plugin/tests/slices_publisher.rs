//! The ResourceSlice publisher against the fake API server, through the
//! real kube client: server-side apply, pool generation, stale slices,
//! restarts, a server without the node-allocatable feature, and the watch
//! that republishes what is deleted or altered behind its back.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{eventually, HANG_GUARD};
use dra_cpu_tests::apiserver::schema::validate_k8s_objects;
use dra_cpu_tests::apiserver::version::KubernetesVersion;
use dra_cpu_tests::apiserver::{FakeApiServer, FakeApiServerOptions};
use dra_plugin::devices::{DeviceMode, DeviceOptions, GroupBy};
use dra_plugin::metrics::Metrics;
use dra_plugin::publisher::status::PublishStatus;
use dra_plugin::publisher::{DesiredDevices, FallbackDevices, PublishError, Publisher};
use dra_plugin::slices::devices_for;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use serde_json::Value;
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// 300 CPUs: individual mode needs three slices, grouped mode one.
fn big_machine() -> Topology {
    common::smt2_topology(2, 1, 75)
}

fn devices(mode: DeviceMode) -> Vec<Device> {
    devices_for(
        &big_machine(),
        &DeviceOptions {
            mode,
            group_by: GroupBy::Numanode,
            reserved: CpuSet::new(),
            node_allocatable_mapping: true,
        },
    )
    .unwrap()
}

fn names(server: &FakeApiServer) -> Vec<String> {
    server
        .slices()
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect()
}

/// Writes: PATCHes that are not dry runs (the publisher's dry-run probe of
/// consumable capacity changes nothing).
fn patches(server: &FakeApiServer) -> usize {
    server
        .received()
        .iter()
        .filter(|r| r.method == "PATCH" && !r.path.contains("dryRun"))
        .count()
}

async fn publisher(server: &FakeApiServer) -> Publisher {
    Publisher::new(server.client().await.unwrap(), "dra.cpu", "node-1")
}

#[tokio::test]
async fn publish_creates_the_pool_owned_by_the_node() {
    let server = FakeApiServer::start().unwrap();
    let node = server.insert_node("node-1").unwrap();
    let mut p = publisher(&server).await;
    let outcome = p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    assert_eq!(outcome.generation, 1);
    assert_eq!(
        outcome.applied,
        vec!["node-1-dra.cpu-0", "node-1-dra.cpu-1", "node-1-dra.cpu-2"]
    );
    let stored = server.slices();
    assert_eq!(stored.len(), 3);
    let total: usize = stored
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(total, 300);
    for s in &stored {
        assert_eq!(s.spec.pool.name, "node-1");
        assert_eq!(
            (s.spec.pool.generation, s.spec.pool.resource_slice_count),
            (1, 3)
        );
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
        let managers: Vec<_> = s
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.as_deref())
            .collect();
        assert!(managers.contains(&"dra.cpu"), "{managers:?}");
    }
    // Server-side apply, forced, with the driver as field manager; and
    // what was sent is a valid 1.37 object.
    let applies: Vec<_> = server
        .received()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(applies.len(), 3);
    for r in &applies {
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert!(
            r.path.contains("fieldManager=dra.cpu") && r.path.contains("force=true"),
            "{}",
            r.path
        );
    }
    let bodies: Vec<Value> = applies.into_iter().map(|r| r.body).collect();
    validate_k8s_objects(&bodies, &["1.37.0"]).unwrap();

    // Nothing changed: nothing is written.
    let before = patches(&server);
    let again = p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    assert_eq!((again.generation, again.applied.len()), (1, 0));
    assert_eq!(again.unchanged.len(), 3);
    assert_eq!(patches(&server), before);
}

#[tokio::test]
async fn changed_devices_bump_the_generation_and_remove_stale_slices() {
    let server = FakeApiServer::start().unwrap();
    server.insert_node("node-1").unwrap();
    let mut p = publisher(&server).await;
    p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    let outcome = p.sync(&devices(DeviceMode::Grouped)).await.unwrap();
    assert_eq!(outcome.generation, 2);
    assert_eq!(outcome.applied, vec!["node-1-dra.cpu-0"]);
    assert_eq!(
        outcome.deleted,
        vec!["node-1-dra.cpu-1", "node-1-dra.cpu-2"]
    );
    let stored = server.slices();
    assert_eq!(names(&server), vec!["node-1-dra.cpu-0"]);
    let only = &stored[0];
    assert_eq!(
        (
            only.spec.pool.generation,
            only.spec.pool.resource_slice_count
        ),
        (2, 1)
    );
    let device_names: Vec<&str> = only
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(device_names, vec!["cpudevnuma000", "cpudevnuma001"]);
    // And back: every slice carries the new generation.
    let outcome = p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    assert_eq!(outcome.generation, 3);
    assert!(server.slices().iter().all(|s| s.spec.pool.generation == 3));
}

#[tokio::test]
async fn a_restarted_publisher_continues_from_the_server() {
    let server = FakeApiServer::start().unwrap();
    server.insert_node("node-1").unwrap();
    publisher(&server)
        .await
        .sync(&devices(DeviceMode::Grouped))
        .await
        .unwrap();
    let before = patches(&server);
    // Same devices after a restart: same generation, nothing written.
    let same = publisher(&server)
        .await
        .sync(&devices(DeviceMode::Grouped))
        .await
        .unwrap();
    assert_eq!((same.generation, same.applied.len()), (1, 0));
    assert_eq!(patches(&server), before);
    // Different devices after a restart: one above the server's.
    let changed = publisher(&server)
        .await
        .sync(&devices(DeviceMode::Individual))
        .await
        .unwrap();
    assert_eq!(changed.generation, 2);
    assert_eq!(changed.applied.len(), 3);
}

#[tokio::test]
async fn a_server_dropping_the_mapping_does_not_cause_republishing() {
    let mut options = FakeApiServerOptions::default();
    options.feature_gates.dra_node_allocatable_resources = false;
    let server = FakeApiServer::start_with(options).unwrap();
    server.insert_node("node-1").unwrap();
    let mut p = publisher(&server).await;
    p.sync(&devices(DeviceMode::Grouped)).await.unwrap();
    let stored = server.slice_values();
    assert!(
        stored[0]["spec"]["devices"][0]
            .get("nodeAllocatableResources")
            .is_none(),
        "the fake dropped the field as a server without the gate does"
    );
    let before = patches(&server);
    let again = p.sync(&devices(DeviceMode::Grouped)).await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(patches(&server), before);
    // Also across a restart: the dropped field is not a content change.
    let restarted = publisher(&server)
        .await
        .sync(&devices(DeviceMode::Grouped))
        .await
        .unwrap();
    assert_eq!((restarted.generation, restarted.applied.len()), (1, 0));
}

#[tokio::test]
async fn a_missing_node_is_a_clear_error() {
    let server = FakeApiServer::start().unwrap();
    let err = publisher(&server)
        .await
        .sync(&devices(DeviceMode::Grouped))
        .await
        .unwrap_err();
    assert!(matches!(err, PublishError::GetNode { .. }), "{err}");
    assert!(err.to_string().contains("reading node node-1"), "{err}");
    assert!(server.slices().is_empty());
}

#[tokio::test]
async fn run_republishes_what_is_deleted_or_altered_behind_its_back() {
    let server = FakeApiServer::start().unwrap();
    server.insert_node("node-1").unwrap();
    let p = publisher(&server).await;
    let (tx, rx) = watch::channel(Arc::new(DesiredDevices::from(devices(
        DeviceMode::Individual,
    ))));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(rx, async {
        let _ = stopped.await;
    }));
    eventually("three slices published", || server.slices().len() == 3).await;

    server.delete_slice_behind_back("node-1-dra.cpu-1").unwrap();
    eventually("deleted slice republished", || {
        names(&server).contains(&"node-1-dra.cpu-1".to_string())
    })
    .await;

    server
        .mutate_slice_behind_back("node-1-dra.cpu-2", |s| {
            if let Some(devices) = s.spec.devices.as_mut() {
                devices.truncate(1);
            }
        })
        .unwrap();
    eventually("altered slice restored", || {
        server
            .slices()
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some("node-1-dra.cpu-2"))
            .and_then(|s| s.spec.devices.as_ref().map(Vec::len))
            == Some(44)
    })
    .await;
    // Restoring what was there is not a new device set.
    assert!(server.slices().iter().all(|s| s.spec.pool.generation == 1));

    // A slice labelled as ours that the pool does not have is removed.
    let mut stray = server.slices()[0].clone();
    stray.metadata = kube::api::ObjectMeta {
        name: Some("node-1-dra.cpu-9".to_string()),
        labels: stray.metadata.labels.clone(),
        ..Default::default()
    };
    let api: kube::Api<ResourceSlice> = kube::Api::all(server.client().await.unwrap());
    api.create(&kube::api::PostParams::default(), &stray)
        .await
        .unwrap();
    eventually("stray slice removed", || {
        !names(&server).contains(&"node-1-dra.cpu-9".to_string())
    })
    .await;
    assert_eq!(server.slices().len(), 3);

    // New devices through the channel: new generation, stale slices go.
    tx.send(Arc::new(devices(DeviceMode::Grouped).into()))
        .unwrap();
    eventually("grouped pool replaces individual pool", || {
        let slices = server.slices();
        slices.len() == 1 && slices[0].spec.pool.generation == 2
    })
    .await;

    stop.send(()).unwrap();
    tokio::time::timeout(HANG_GUARD, task)
        .await
        .expect("run stops on shutdown")
        .unwrap();
}

/// A node name of the longest valid length (253 characters) still gets its
/// slices, under names the real schema accepts, found again by a restarted
/// publisher (nothing re-applied, generation unchanged).
#[tokio::test]
async fn a_node_name_of_253_characters_gets_its_slices() {
    let node_name = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(node_name.len(), 253);
    let server = FakeApiServer::start().unwrap();
    server.insert_node(&node_name).unwrap();
    let client = server.client().await.unwrap();
    let mut p = Publisher::new(client.clone(), "dra.cpu", &node_name);
    let outcome = p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    assert_eq!(outcome.applied.len(), 3, "{outcome:?}");
    for name in &outcome.applied {
        assert!(name.len() <= 253, "{name}");
    }
    let bodies: Vec<Value> = server
        .received()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.body)
        .collect();
    validate_k8s_objects(&bodies, &["1.37.0"]).unwrap();

    let mut restarted = Publisher::new(client, "dra.cpu", &node_name);
    let before = patches(&server);
    let again = restarted
        .sync(&devices(DeviceMode::Individual))
        .await
        .unwrap();
    assert_eq!((again.generation, again.applied.len()), (1, 0));
    assert_eq!(patches(&server), before);
}

fn server_at(version: KubernetesVersion) -> FakeApiServer {
    let server = FakeApiServer::start_with(FakeApiServerOptions::for_version(version)).unwrap();
    server.insert_node("node-1").unwrap();
    server
}

fn has_mapping(slices: &[ResourceSlice]) -> bool {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .any(|d| d.node_allocatable_resources.is_some())
}

#[tokio::test]
async fn each_release_gets_slices_it_accepts_with_the_mapping_only_from_137() {
    for version in KubernetesVersion::ALL {
        let mut options = FakeApiServerOptions::for_version(version);
        // Gates on, so that what the server keeps shows what was sent.
        options.feature_gates.dra_node_allocatable_resources = true;
        options.feature_gates.dra_consumable_capacity = true;
        let server = FakeApiServer::start_with(options).unwrap();
        server.insert_node("node-1").unwrap();
        let mut p = publisher(&server).await;
        let outcome = p.sync(&devices(DeviceMode::Grouped)).await.unwrap();
        assert_eq!(outcome.applied.len(), 1, "{version}");
        let mapped = version >= KubernetesVersion::V1_37;
        assert_eq!(p.mapping_supported(), Some(mapped), "{version}");
        assert_eq!(has_mapping(&server.slices()), mapped, "{version}");
        let refused = server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH")
            .count();
        assert_eq!(refused, 2, "{version}: one dry run, one apply, no refusal");
        assert!(
            server
                .requests()
                .iter()
                .any(|r| r.path.starts_with("/openapi/v3/apis/resource.k8s.io/v1")),
            "{version}: the OpenAPI document was read"
        );
    }
}

#[tokio::test]
async fn an_apply_refused_for_the_mapping_is_repeated_without_it() {
    // 1.37.0-beta.0: /version says 1.37, the schema is still 1.36's; the
    // OpenAPI document is not readable, so /version is all there is to go by.
    let server = server_at(KubernetesVersion::V1_36);
    server.set_version_answer(37, "v1.37.0-beta.0");
    server.fail_next("GET", "/openapi/v3", 403, usize::MAX);
    let status = Arc::new(PublishStatus::default());
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&server)
        .await
        .with_reporting(status.clone(), metrics.clone());
    let outcome = p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    assert_eq!(
        p.mapping_supported(),
        Some(false),
        "learned from the refusal"
    );
    assert_eq!(outcome.applied.len(), 3);
    assert!(!has_mapping(&server.slices()));
    let applies: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(
        applies.len(),
        4,
        "one refused apply, then three without the mapping: {applies:?}"
    );
    assert!(status.unready_reason().is_none());
    let again = p.sync(&devices(DeviceMode::Individual)).await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
}

#[tokio::test]
async fn a_refused_apply_shows_in_readiness_and_metrics_within_one_retry_then_clears() {
    let server = server_at(KubernetesVersion::V1_37);
    server.fail_next("PATCH", "/resourceslices/", 422, 2);
    let status = Arc::new(PublishStatus::default());
    let metrics = Arc::new(Metrics::new());
    let p = publisher(&server)
        .await
        .with_reporting(status.clone(), metrics.clone());
    let (_tx, rx) = watch::channel(Arc::new(DesiredDevices::from(devices(
        DeviceMode::Individual,
    ))));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(rx, async {
        let _ = stopped.await;
    }));
    eventually("the refusal is counted", || {
        metrics.publish_failures("apply", 422) == 1
    })
    .await;
    let reason = status
        .unready_reason()
        .expect("unready after the first refusal");
    assert!(
        reason.contains("applying ResourceSlice node-1-dra.cpu-0")
            && reason.contains("injected failure"),
        "{reason}"
    );
    assert!(metrics
        .render()
        .contains("dra_cpu_slice_publish_failures_total{stage=\"apply\",code=\"422\"}"));
    eventually("published after the faults pass", || {
        server.slices().len() == 3
    })
    .await;
    eventually("ready again", || status.unready_reason().is_none()).await;
    assert_eq!(metrics.publish_failures("apply", 422), 2);
    stop.send(()).unwrap();
    tokio::time::timeout(HANG_GUARD, task)
        .await
        .expect("run stops")
        .unwrap();
}

/// `--cpu-device-mode auto`: the individual devices built only when asked.
fn auto(mode_devices: Vec<Device>) -> DesiredDevices {
    DesiredDevices {
        devices: mode_devices,
        without_consumable_capacity: Some(Arc::new(FallbackDevices::lazy(|| {
            Ok(devices(DeviceMode::Individual))
        }))),
    }
}

fn fallback_built(desired: &DesiredDevices) -> bool {
    desired
        .without_consumable_capacity
        .as_deref()
        .and_then(FallbackDevices::if_built)
        .is_some()
}

#[tokio::test]
async fn without_consumable_capacity_auto_publishes_individual_devices_and_grouped_refuses() {
    for version in [KubernetesVersion::V1_34, KubernetesVersion::V1_35] {
        let server = server_at(version);
        let metrics = Arc::new(Metrics::new());
        let status = Arc::new(PublishStatus::default());
        let mut p = publisher(&server)
            .await
            .with_reporting(status.clone(), metrics.clone());
        let desired = auto(devices(DeviceMode::Grouped));
        assert!(!fallback_built(&desired), "built only when asked");
        let outcome = p.sync_desired(&desired).await.unwrap();
        assert_eq!(p.consumable_capacity(), Some(false), "{version}");
        assert!(fallback_built(&desired), "{version}: asked for");
        assert_eq!(
            outcome.applied.len(),
            3,
            "{version}: 300 individual devices"
        );
        let names: Vec<String> = server
            .slices()
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect();
        assert_eq!(names.len(), 300);
        assert!(names
            .iter()
            .all(|n| n.starts_with("cpudev") && !n.contains("numa")));
        assert!(
            status.unready_reason().is_none(),
            "{version}: auto is not a refusal"
        );
        assert!(metrics
            .render()
            .contains("dra_cpu_grouped_mode_unsupported 1"));

        // Explicit grouped: nothing published, and readiness says why.
        let server = server_at(version);
        let status = Arc::new(PublishStatus::default());
        let mut p = publisher(&server)
            .await
            .with_reporting(status.clone(), Arc::new(Metrics::new()));
        p.sync(&devices(DeviceMode::Grouped)).await.unwrap();
        let slices = server.slices();
        assert_eq!(slices.len(), 1, "{version}: an empty pool");
        assert!(slices[0]
            .spec
            .devices
            .as_deref()
            .unwrap_or_default()
            .is_empty());
        let reason = status.unready_reason().expect("grouped is refused");
        assert!(reason.contains("DRAConsumableCapacity"), "{reason}");
    }
    // 1.36 turns the gate on by default: auto stays grouped.
    let server = server_at(KubernetesVersion::V1_36);
    let mut p = publisher(&server).await;
    let desired = auto(devices(DeviceMode::Grouped));
    p.sync_desired(&desired).await.unwrap();
    assert_eq!(p.consumable_capacity(), Some(true));
    assert!(
        !fallback_built(&desired),
        "a server that keeps allowMultipleAllocations never needs the individual devices"
    );
    assert!(server.slices()[0].spec.devices.as_ref().unwrap()[0]
        .name
        .starts_with("cpudevnuma"));
}

#[tokio::test]
async fn fallback_devices_that_cannot_be_built_publish_nothing_and_readiness_says_why() {
    let server = server_at(KubernetesVersion::V1_34);
    let status = Arc::new(PublishStatus::default());
    let mut p = publisher(&server)
        .await
        .with_reporting(status.clone(), Arc::new(Metrics::new()));
    let desired = DesiredDevices {
        devices: devices(DeviceMode::Grouped),
        without_consumable_capacity: Some(Arc::new(FallbackDevices::lazy(|| {
            Err(anyhow::anyhow!("no online CPUs").into())
        }))),
    };
    p.sync_desired(&desired).await.unwrap();
    let published: usize = server
        .slices()
        .iter()
        .map(|s| s.spec.devices.as_deref().unwrap_or_default().len())
        .sum();
    assert_eq!(
        published, 0,
        "neither the grouped nor any individual device"
    );
    let reason = status.unready_reason().expect("not ready");
    assert!(
        reason.contains("allowMultipleAllocations") && reason.contains("no online CPUs"),
        "{reason}"
    );
}

#[tokio::test]
async fn an_unchanged_node_reapplies_nothing_across_watch_events_and_a_restart() {
    // Grouped devices whose capacity the server canonicalises ("1000" is
    // stored as "1k"), on a 1.37 server with its default gates (the mapping
    // dropped); and an empty pool (devices: [] stored as absent) on 1.34.
    let mut thousand = devices(DeviceMode::Grouped);
    for d in &mut thousand {
        for c in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            c.value = k8s_openapi::apimachinery::pkg::api::resource::Quantity("1000".to_string());
        }
    }
    let cases: Vec<(KubernetesVersion, DesiredDevices)> = vec![
        (KubernetesVersion::V1_37, auto(thousand)),
        (KubernetesVersion::V1_34, DesiredDevices::from(Vec::new())),
        (KubernetesVersion::V1_34, auto(devices(DeviceMode::Grouped))),
    ];
    for (version, desired) in cases {
        let server = server_at(version);
        let mut first = publisher(&server).await;
        let outcome = first.sync_desired(&desired).await.unwrap();
        let generation = outcome.generation;
        let applies = || {
            server
                .requests()
                .iter()
                .filter(|r| r.method == "PATCH" && !r.path.contains("dryRun"))
                .count()
        };
        let before = applies();
        let p = publisher(&server).await;
        let (_tx, rx) = watch::channel(Arc::new(desired.clone()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(p.run(rx, async {
            let _ = stopped.await;
        }));
        // The restarted publisher's first sync.
        eventually("the restarted publisher listed", || {
            server
                .requests()
                .iter()
                .filter(|r| r.method == "GET" && r.path.contains("watch"))
                .count()
                > 0
        })
        .await;
        let name = server.slices()[0].metadata.name.clone().unwrap();
        for i in 0..10 {
            server
                .mutate_slice_behind_back(&name, |s| {
                    s.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert("example.com/touched".to_string(), i.to_string());
                })
                .unwrap();
        }
        // Every event seen: the watch reported the last change.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop.send(()).unwrap();
        tokio::time::timeout(HANG_GUARD, task)
            .await
            .expect("run stops")
            .unwrap();
        assert_eq!(applies(), before, "{version}: nothing re-applied");
        assert!(
            server
                .slices()
                .iter()
                .all(|s| s.spec.pool.generation == generation),
            "{version}: generation unchanged"
        );
    }
}

#[tokio::test]
async fn expired_watches_and_failures_of_each_call_recover() {
    let server = server_at(KubernetesVersion::V1_37);
    // One failure of every call the publisher makes. (kube's client
    // retries 429, 503 and 504 itself: these codes reach the publisher.)
    // The dry-run fault comes first so that the dry run takes it.
    server.fail_next("GET", "/api/v1/nodes/node-1", 500, 1);
    server.fail_next("GET", "/openapi/v3", 500, 1);
    server.fail_next("GET", "/version", 500, 1);
    server.fail_next("PATCH", "dryRun", 500, 1);
    let status = Arc::new(PublishStatus::default());
    let metrics = Arc::new(Metrics::new());
    let p = publisher(&server)
        .await
        .with_reporting(status.clone(), metrics.clone());
    let (tx, rx) = watch::channel(Arc::new(auto(devices(DeviceMode::Grouped))));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(rx, async {
        let _ = stopped.await;
    }));
    eventually("published despite one failure of each call", || {
        server.slices().len() == 1 && status.unready_reason().is_none()
    })
    .await;
    // The watch lists too: the publisher's own LIST (and then its apply)
    // fails once only after the watch is up, on the resync a deletion
    // calls for.
    eventually("the watch is up", || {
        server
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path.contains("watch=true"))
    })
    .await;
    server.fail_next("GET", "/resourceslices?", 500, 1);
    server.fail_next("PATCH", "/resourceslices/", 409, 1);
    server.delete_slice_behind_back("node-1-dra.cpu-0").unwrap();
    eventually("republished after a failed list and a failed apply", || {
        server.slices().len() == 1 && metrics.publish_failures("apply", 409) == 1
    })
    .await;
    for (stage, code) in [
        ("get_node", 500),
        ("discover", 500),
        ("probe", 500),
        ("list", 500),
        ("apply", 409),
    ] {
        assert_eq!(
            metrics.publish_failures(stage, code),
            1,
            "{stage} {code}:\n{}",
            metrics.render()
        );
    }
    // Watches expire (410 in the stream): the watcher lists again, which
    // re-applies nothing.
    let writes = patches(&server);
    for _ in 0..3 {
        server.expire_watches();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eventually("the watch was re-established", || {
        server
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains("watch"))
            .count()
            >= 2
    })
    .await;
    assert_eq!(patches(&server), writes, "expiry is no reason to write");
    // The re-established watch still catches a deletion, and a failed
    // DELETE of a stale slice is retried.
    server.delete_slice_behind_back("node-1-dra.cpu-0").unwrap();
    eventually("republished after an expiry", || server.slices().len() == 1).await;
    tx.send(Arc::new(devices(DeviceMode::Individual).into()))
        .unwrap();
    eventually("individual pool replaces the grouped one", || {
        let slices = server.slices();
        slices.len() == 3 && slices.iter().all(|s| s.spec.pool.generation == 2)
    })
    .await;
    server.fail_next("DELETE", "/resourceslices/", 500, 1);
    tx.send(Arc::new(auto(devices(DeviceMode::Grouped))))
        .unwrap();
    eventually("grouped pool back despite a failed delete", || {
        let slices = server.slices();
        slices.len() == 1 && slices[0].spec.pool.generation == 3
    })
    .await;
    assert_eq!(metrics.publish_failures("delete", 500), 1);
    eventually("ready", || status.unready_reason().is_none()).await;
    stop.send(()).unwrap();
    tokio::time::timeout(HANG_GUARD, task)
        .await
        .expect("run stops")
        .unwrap();
}
