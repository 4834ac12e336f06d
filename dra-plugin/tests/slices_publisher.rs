//! The ResourceSlice publisher against the fake API server, through the
//! real kube client: server-side apply, pool generation, stale slices,
//! restarts, a server without the node-allocatable feature, and the watch
//! that republishes what is deleted or altered behind its back.

use dra_cpu_tests::apiserver::{validate_k8s_objects, FakeApiServer, FakeApiServerOptions};
use dra_plugin::publisher::{PublishError, Publisher};
use dra_plugin::slices::{devices_for, DeviceMode, DeviceOptions, GroupBy};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use serde_json::Value;
use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
use shared_state::topology::Topology;
use shared_state::CpuSet;
use std::time::Duration;
use tokio::sync::watch;

/// Guards against a hang only; never a measure of speed.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// 300 CPUs: individual mode needs three slices, grouped mode one.
fn big_machine() -> Topology {
    build(&Shape {
        sockets: 2,
        numa_per_socket: 1,
        l3_per_numa: 1,
        cores_per_l3: 75,
        threads_per_core: 2,
        sibling_numbering: SiblingNumbering::Split,
    })
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

fn patches(server: &FakeApiServer) -> usize {
    server
        .received()
        .iter()
        .filter(|r| r.method == "PATCH")
        .count()
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(HANG_GUARD, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never happened: {what}");
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
    let server = FakeApiServer::start_with(FakeApiServerOptions {
        node_allocatable_resources: false,
        ..Default::default()
    })
    .unwrap();
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
    let (tx, rx) = watch::channel(devices(DeviceMode::Individual));
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
    tx.send(devices(DeviceMode::Grouped)).unwrap();
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
