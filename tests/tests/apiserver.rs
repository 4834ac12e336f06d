//! The fake API server driven by the real kube client, as the product drives
//! the real API server: CRUD, server-side apply, selectors, watches with
//! bookmarks, status, error codes, and the received objects checked against
//! the Kubernetes 1.34 and 1.37 schemas.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::apiserver::schema::{
    validate_k8s_objects, validate_k8s_objects_with, without_node_allocatable_resources,
};
use dra_cpu_tests::apiserver::version::KubernetesVersion;
use dra_cpu_tests::apiserver::{FakeApiServer, FakeApiServerOptions};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::serde::Serialize;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::{json, Value};
use std::time::Duration;

const VERSIONS: [&str; 2] = ["1.34.0", "1.37.0"];
/// Guards against a hung stream only; never a measure of speed.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn slice_json(name: &str, node: &str, devices: usize) -> Value {
    let devices: Vec<Value> = (0..devices)
        .map(|i| {
            json!({
                "name": format!("cpudev{i:03}"),
                "attributes": {
                    "dra.cpu/cpuID": {"int": i},
                    "dra.cpu/coreType": {"string": "standard"},
                    "dra.cpu/smtEnabled": {"bool": false},
                    "resource.kubernetes.io/numaNode": {"int": 0}
                }
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"app": "dra-cpu"}},
        "spec": {
            "driver": "dra.cpu", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices
        }
    })
}

fn slice(name: &str, node: &str, devices: usize) -> ResourceSlice {
    serde_json::from_value(slice_json(name, node, devices)).expect("test slice is a ResourceSlice")
}

fn names(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

fn device_count(s: &ResourceSlice) -> usize {
    s.spec.devices.as_ref().map_or(0, Vec::len)
}

fn rv(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("numeric resourceVersion")
}

fn api_code(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected an API status error, got {other:?}"),
    }
}

/// Server-side apply as the driver applies: field manager `dra.cpu`, forced.
async fn apply_as_driver<K, P>(api: &Api<K>, name: &str, body: P) -> kube::Result<K>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
    P: Serialize + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("dra.cpu").force(),
        &Patch::Apply(body),
    )
    .await
}

/// Creates slice `name` on `node` with `devices` devices.
async fn create_slice(
    slices: &Api<ResourceSlice>,
    name: &str,
    node: &str,
    devices: usize,
) -> ResourceSlice {
    slices
        .create(&PostParams::default(), &slice(name, node, devices))
        .await
        .unwrap_or_else(|e| panic!("creating slice {name}: {e}"))
}

/// The next event of a watch (the watcher's or a raw watch stream).
async fn next_event<S, T, E>(stream: &mut S) -> T
where
    S: Stream<Item = Result<T, E>> + Unpin,
    E: std::fmt::Display,
{
    match tokio::time::timeout(HANG_GUARD, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("watch error: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("watch produced nothing"),
    }
}

#[tokio::test]
async fn slices_create_apply_list_and_delete_with_the_real_client() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client);

    let created = create_slice(&slices, "node-1-dra.cpu-0", "node-1", 2).await;
    let uid = created.metadata.uid.clone().expect("uid assigned");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.creation_timestamp.is_some());

    let applied = apply_as_driver(
        &slices,
        "node-1-dra.cpu-0",
        slice("node-1-dra.cpu-0", "node-1", 4),
    )
    .await
    .unwrap();
    assert_eq!(
        applied.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "apply keeps the object's identity"
    );
    assert_eq!(device_count(&applied), 4);
    assert_eq!(applied.metadata.generation, Some(2));
    assert!(rv(&applied.metadata) > rv(&created.metadata));
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&"dra.cpu".to_string()),
        "managers {managers:?}"
    );

    // Apply also creates.
    apply_as_driver(
        &slices,
        "node-2-dra.cpu-0",
        slice("node-2-dra.cpu-0", "node-2", 1),
    )
    .await
    .unwrap();
    let mut unlabelled = slice("node-1-other", "node-1", 1);
    unlabelled.metadata.labels = None;
    unlabelled.spec.driver = "other.example.com".to_string();
    slices
        .create(&PostParams::default(), &unlabelled)
        .await
        .unwrap();

    let on_node_1 = slices
        .list(&ListParams::default().fields("spec.nodeName=node-1"))
        .await
        .unwrap();
    assert_eq!(
        names(&on_node_1.items),
        vec!["node-1-dra.cpu-0", "node-1-other"]
    );
    let ours_on_node_1 = slices
        .list(&ListParams::default().fields("spec.nodeName=node-1,spec.driver=dra.cpu"))
        .await
        .unwrap();
    assert_eq!(names(&ours_on_node_1.items), vec!["node-1-dra.cpu-0"]);
    let labelled = slices
        .list(&ListParams::default().labels("app=dra-cpu"))
        .await
        .unwrap();
    assert_eq!(
        names(&labelled.items),
        vec!["node-1-dra.cpu-0", "node-2-dra.cpu-0"]
    );
    assert!(
        on_node_1.metadata.resource_version.is_some(),
        "lists carry a resourceVersion"
    );
    let unsupported = slices
        .list(&ListParams::default().fields("spec.allNodes=true"))
        .await
        .unwrap_err();
    assert_eq!(api_code(unsupported).0, 400);

    let merged = slices
        .patch(
            "node-1-dra.cpu-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"extra": "x"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("extra"))
            .map(String::as_str),
        Some("x")
    );
    assert_eq!(
        merged.metadata.generation,
        Some(2),
        "a label change keeps the generation"
    );

    slices
        .delete("node-1-dra.cpu-0", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        names(&server.slices()),
        vec!["node-1-other", "node-2-dra.cpu-0"]
    );
    let gone = slices
        .delete("node-1-dra.cpu-0", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(gone).0, 404);
    slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=dra-cpu"),
        )
        .await
        .unwrap();
    assert_eq!(names(&server.slices()), vec!["node-1-other"]);

    let received: Vec<_> = server
        .received()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert!(received.iter().any(|r| r.content_type.as_deref()
        == Some("application/apply-patch+yaml")
        && r.path.contains("fieldManager=dra.cpu")
        && r.path.contains("force=true")));
    assert!(received
        .iter()
        .any(|r| r.content_type.as_deref() == Some("application/merge-patch+json")));
}

#[tokio::test]
async fn errors_are_kubernetes_status_objects() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());

    let (code, reason) = api_code(slices.get("absent").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert!(slices.get_opt("absent").await.unwrap().is_none());

    let first = create_slice(&slices, "s", "node-1", 1).await;
    let (code, reason) = api_code(
        slices
            .create(&PostParams::default(), &slice("s", "node-1", 1))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    let mut newer = first.clone();
    newer.spec.devices = Some(vec![]);
    let replaced = slices
        .replace("s", &PostParams::default(), &newer)
        .await
        .unwrap();
    assert!(rv(&replaced.metadata) > rv(&first.metadata));
    let (code, reason) = api_code(
        slices
            .replace("s", &PostParams::default(), &newer)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, reason.as_str()),
        (409, "Conflict"),
        "a stale resourceVersion conflicts"
    );

    let mut no_pool_name = slice("t", "node-1", 1);
    no_pool_name.spec.pool.name = String::new();
    let (code, reason) = api_code(
        slices
            .create(&PostParams::default(), &no_pool_name)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));

    // Two value types in one attribute pass the OpenAPI schema; the server's
    // own validation refuses them.
    let mut two_types = slice_json("u", "node-1", 1);
    two_types["spec"]["devices"][0]["attributes"]["dra.cpu/cpuID"] =
        json!({"int": 0, "string": "0"});
    assert!(validate_k8s_objects(std::slice::from_ref(&two_types), &VERSIONS).is_ok());
    let two_types: ResourceSlice = serde_json::from_value(two_types).unwrap();
    let (code, _) = api_code(
        slices
            .create(&PostParams::default(), &two_types)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);

    let missing_manager = slices
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Apply(slice("s", "node-1", 1)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_code(missing_manager).0,
        400,
        "apply without fieldManager is refused"
    );
    assert_eq!(
        names(&server.slices()),
        vec!["s"],
        "refused writes store nothing"
    );
}

#[tokio::test]
async fn watcher_sees_added_modified_deleted_on_its_node() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client);
    create_slice(&slices, "pre-existing", "node-1", 1).await;

    for streaming in [false, true] {
        let mut config = watcher::Config::default().fields("spec.nodeName=node-1");
        if streaming {
            config = config.streaming_lists();
        }
        let mut events = watcher(slices.clone(), config).boxed();
        let mut initial = Vec::new();
        loop {
            match next_event(&mut events).await {
                watcher::Event::Init => {}
                watcher::Event::InitApply(s) => initial.extend(s.metadata.name),
                watcher::Event::InitDone => break,
                other => panic!("unexpected event before InitDone: {other:?}"),
            }
        }
        assert_eq!(
            initial,
            vec!["pre-existing"],
            "streaming lists: {streaming}"
        );

        let name = format!("watched-{streaming}");
        create_slice(&slices, &name, "node-1", 1).await;
        create_slice(&slices, &format!("elsewhere-{streaming}"), "node-2", 1).await;
        match next_event(&mut events).await {
            watcher::Event::Apply(s) => assert_eq!(
                (s.metadata.name.as_deref(), device_count(&s)),
                (Some(name.as_str()), 1)
            ),
            other => panic!("expected the added slice, got {other:?}"),
        }
        apply_as_driver(&slices, &name, slice(&name, "node-1", 3))
            .await
            .unwrap();
        match next_event(&mut events).await {
            watcher::Event::Apply(s) => assert_eq!(
                (s.metadata.name.as_deref(), device_count(&s)),
                (Some(name.as_str()), 3)
            ),
            other => panic!("expected the modified slice, got {other:?}"),
        }
        server
            .mutate_slice_behind_back(&name, |s| s.spec.devices = Some(vec![]))
            .unwrap();
        match next_event(&mut events).await {
            watcher::Event::Apply(s) => assert_eq!(device_count(&s), 0),
            other => panic!("expected the slice changed behind the product's back, got {other:?}"),
        }
        server.delete_slice_behind_back(&name).unwrap();
        match next_event(&mut events).await {
            watcher::Event::Delete(s) => {
                assert_eq!(s.metadata.name.as_deref(), Some(name.as_str()))
            }
            other => panic!("expected the deleted slice, got {other:?}"),
        }
    }
    assert!(
        server.received().iter().all(|r| r.method != "GET"),
        "bodiless GETs are not recorded as objects"
    );
    let watches: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains("watch=true"))
        .map(|r| r.path)
        .collect();
    assert!(
        watches
            .iter()
            .any(|p| p.contains("sendInitialEvents=true")
                && p.contains("fieldSelector=spec.nodeName")),
        "{watches:?}"
    );
    assert!(
        watches
            .iter()
            .any(|p| !p.contains("sendInitialEvents") && p.contains("resourceVersion=")),
        "{watches:?}"
    );
}

#[tokio::test]
async fn injected_failures_are_answered_then_the_server_serves_again() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client);
    let params = PatchParams::apply("dra.cpu").force();
    let config = Patch::Apply(slice("s", "node-1", 1));
    let patches = |server: &FakeApiServer| {
        server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH")
            .count()
    };

    server.fail_next("PATCH", "/resourceslices/s", 500, 1);
    let (code, reason) = api_code(slices.patch("s", &params, &config).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (500, "InternalError"));
    assert!(
        server.slices().is_empty(),
        "a failed request stores nothing"
    );
    assert_eq!(patches(&server), 1);

    // kube's client retries 503 by itself (its default retry policy).
    server.fail_next("PATCH", "/resourceslices/s", 503, 2);
    slices.patch("s", &params, &config).await.unwrap();
    assert_eq!(
        patches(&server),
        4,
        "two refused attempts, then the one served"
    );
    assert_eq!(names(&server.slices()), vec!["s"]);
}
#[tokio::test]
async fn watches_resume_from_a_resource_version_and_get_bookmarks() {
    let server = FakeApiServer::start_with(FakeApiServerOptions {
        bookmark_interval: Duration::from_millis(50),
        ..Default::default()
    })
    .unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client);
    let a = create_slice(&slices, "a", "node-1", 1).await;
    create_slice(&slices, "b", "node-1", 1).await;
    slices.delete("a", &DeleteParams::default()).await.unwrap();

    let from = a.metadata.resource_version.clone().unwrap();
    let mut stream = slices
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            &from,
        )
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    let bookmark_rv = loop {
        let event = next_event(&mut stream).await;
        match event {
            WatchEvent::Added(s) => {
                seen.push(format!("ADDED {}", s.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Modified(s) => {
                seen.push(format!("MODIFIED {}", s.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Deleted(s) => {
                seen.push(format!("DELETED {}", s.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Bookmark(b) => break b.metadata.resource_version,
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    };
    assert_eq!(
        seen,
        vec!["ADDED b", "DELETED a"],
        "events after the given resourceVersion, in order"
    );
    assert_eq!(bookmark_rv, server.resource_version().to_string());

    let bad = slices.watch(&WatchParams::default(), "not-a-number").await;
    let first = match bad {
        Ok(s) => s.boxed().next().await.map(|r| r.is_err()),
        Err(_) => Some(true),
    };
    assert_eq!(first, Some(true), "an invalid resourceVersion is refused");
}

#[tokio::test]
async fn claims_nodes_and_device_classes_as_the_scheduler_left_them() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let node = server.insert_node("node-1").unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let fetched = nodes.get("node-1").await.unwrap();
    assert_eq!(fetched.metadata.uid, node.metadata.uid);
    assert!(fetched.metadata.uid.is_some());

    let class: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "dra.cpu"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"dra.cpu\""}}]}}))
    .unwrap();
    server.insert_device_class(class).unwrap();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let fetched_class = classes.get("dra.cpu").await.unwrap();
    assert_eq!(
        fetched_class
            .spec
            .and_then(|s| s.selectors)
            .map(|s| s.len()),
        Some(1)
    );

    let claim: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "cpus", "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "cpu", "exactly": {"deviceClassName": "dra.cpu", "count": 1}}]}}}))
    .unwrap();
    let inserted = server.insert_claim(claim).unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "team");
    assert!(claims.get("cpus").await.unwrap().status.is_none());

    let status = serde_json::from_value(json!({
        "allocation": {"devices": {"results": [{"request": "cpu", "driver": "dra.cpu", "pool": "node-1", "device": "cpudevnuma000",
            "consumedCapacity": {"dra.cpu/cpu": "2"}}]}},
        "reservedFor": [{"resource": "pods", "name": "app", "uid": "pod-uid-1"}]
    }))
    .unwrap();
    server.set_claim_status("team", "cpus", status).unwrap();
    let allocated = claims.get("cpus").await.unwrap();
    assert_eq!(allocated.metadata.uid, inserted.metadata.uid);
    let status = allocated.status.expect("status set");
    let result = &status
        .allocation
        .as_ref()
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .expect("results")[0];
    assert_eq!(
        (result.driver.as_str(), result.device.as_str()),
        ("dra.cpu", "cpudevnuma000")
    );
    assert_eq!(
        result
            .consumed_capacity
            .as_ref()
            .and_then(|c| c.get("dra.cpu/cpu"))
            .map(|q| q.0.as_str()),
        Some("2")
    );
    assert_eq!(
        status.reserved_for.as_ref().map(|r| r[0].uid.as_str()),
        Some("pod-uid-1")
    );

    // The status subresource through the client; a status write keeps the spec.
    let patched = claims
        .patch_status(
            "cpus",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"reservedFor": null}})),
        )
        .await
        .unwrap();
    assert!(patched
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_none());
    assert_eq!(
        patched
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref())
            .map(Vec::len),
        Some(1)
    );
    let all: Api<ResourceClaim> = Api::all(client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let other_ns: Api<ResourceClaim> = Api::namespaced(client, "elsewhere");
    assert_eq!(api_code(other_ns.get("cpus").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn discovery_finds_the_served_resources() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.37.0");
    let discovery = kube::discovery::Discovery::new(client).run().await.unwrap();
    let group = discovery
        .get("resource.k8s.io")
        .expect("resource.k8s.io discovered");
    let kinds: Vec<(String, bool)> = group
        .recommended_resources()
        .into_iter()
        .map(|(r, caps)| (r.kind, caps.scope == kube::discovery::Scope::Namespaced))
        .collect();
    assert!(
        kinds.contains(&("ResourceSlice".to_string(), false)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("ResourceClaim".to_string(), true)),
        "{kinds:?}"
    );
    assert!(discovery
        .get("")
        .is_some_and(|core| core.recommended_kind("Node").is_some()));
}

#[tokio::test]
async fn received_slices_validate_against_the_1_34_and_1_37_schemas() {
    let server = FakeApiServer::start().unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client);
    create_slice(&slices, "plain", "node-1", 3).await;
    apply_as_driver(&slices, "applied", slice("applied", "node-1", 2))
        .await
        .unwrap();
    let received = server.received_objects("ResourceSlice");
    assert_eq!(received.len(), 2);
    validate_k8s_objects(&received, &VERSIONS).unwrap();
    validate_k8s_objects(&server.slice_values(), &VERSIONS).unwrap();

    // KEP-5517's field is in the 1.37 schema only; the product's two
    // shapes (grouped: consumed capacity, individual: per device).
    let mut mapped = slice_json("mapped", "node-1", 2);
    mapped["spec"]["devices"][0]["nodeAllocatableResources"] =
        json!({"cpu": {"mapping": {"capacityKey": "dra.cpu/cpu", "capacityMultiplier": "1"}}});
    mapped["spec"]["devices"][1]["nodeAllocatableResources"] =
        json!({"cpu": {"mapping": {"deviceMultiplier": "1"}}});
    let mapped = [mapped];
    validate_k8s_objects(&mapped, &["1.37.0"]).unwrap();
    let strict_old = validate_k8s_objects(&mapped, &["1.34.0"]).unwrap_err();
    assert!(
        strict_old.contains("nodeAllocatableResources"),
        "{strict_old}"
    );
    validate_k8s_objects_with(&mapped, &["1.34.0"], false).unwrap();
    validate_k8s_objects(&without_node_allocatable_resources(&mapped), &VERSIONS).unwrap();
    let mut misspelt = mapped.clone();
    misspelt[0]["spec"]["devices"][1]["nodeAllocatableResources"] =
        json!({"cpu": {"mapping": {"deviceMultiplyer": "1"}}});
    assert!(
        validate_k8s_objects(&misspelt, &["1.37.0"]).is_err(),
        "strict mode catches a misspelt field"
    );
}

#[tokio::test]
async fn the_schema_check_catches_invalid_objects() {
    let mut no_driver = slice_json("x", "node-1", 1);
    no_driver["spec"].as_object_mut().unwrap().remove("driver");
    let err = validate_k8s_objects(&[no_driver], &VERSIONS).unwrap_err();
    assert!(
        err.contains("1.34") && err.contains("1.37") && err.contains("driver"),
        "{err}"
    );

    let mut wrong_type = slice_json("y", "node-1", 1);
    wrong_type["spec"]["devices"][0]["attributes"]["dra.cpu/cpuID"] = json!({"int": "zero"});
    let err = validate_k8s_objects(&[wrong_type], &VERSIONS).unwrap_err();
    assert!(err.contains("zero"), "{err}");

    let unknown_kind = json!({"apiVersion": "resource.k8s.io/v1", "kind": "NoSuchKind", "metadata": {"name": "z"}});
    assert!(
        validate_k8s_objects(&[unknown_kind], &VERSIONS).is_err(),
        "a kind without a schema is not a pass"
    );
}

#[tokio::test]
async fn a_server_without_the_node_allocatable_gate_drops_the_mapping() {
    let mut options = FakeApiServerOptions::default();
    options.feature_gates.dra_node_allocatable_resources = false;
    let server = FakeApiServer::start_with(options).unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(client);
    let mut mapped = slice_json("mapped", "node-1", 1);
    mapped["spec"]["devices"][0]["nodeAllocatableResources"] =
        json!({"cpu": {"mapping": {"deviceMultiplier": "1"}}});
    let mapped: ResourceSlice = serde_json::from_value(mapped).unwrap();
    let stored = apply_as_driver(&slices, "mapped", &mapped).await.unwrap();
    assert!(stored.spec.devices.as_ref().unwrap()[0]
        .node_allocatable_resources
        .is_none());
    server.set_node_allocatable_resources(true);
    let stored = apply_as_driver(&slices, "mapped", &mapped).await.unwrap();
    assert!(stored.spec.devices.as_ref().unwrap()[0]
        .node_allocatable_resources
        .is_some());
}

/// What the product's publisher sends at most: a grouped device with
/// consumable capacity and the 1.37 mapping.
fn grouped_mapped_slice(name: &str) -> Value {
    let mut slice = slice_json(name, "node-1", 1);
    slice["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
    slice["spec"]["devices"][0]["capacity"] = json!({"dra.cpu/cpu": {"value": "1000"}});
    slice["spec"]["devices"][0]["nodeAllocatableResources"] =
        json!({"cpu": {"mapping": {"capacityKey": "dra.cpu/cpu", "capacityMultiplier": "1"}}});
    slice
}

#[tokio::test]
async fn each_release_refuses_an_apply_naming_a_field_its_schema_lacks() {
    for version in KubernetesVersion::ALL {
        let server = FakeApiServer::start_with(FakeApiServerOptions::for_version(version)).unwrap();
        let client = server.client().await.unwrap();
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        let applied: ResourceSlice =
            serde_json::from_value(grouped_mapped_slice("node-1-dra.cpu-0")).unwrap();
        let result = apply_as_driver(&slices, "node-1-dra.cpu-0", &applied).await;
        let info = client.apiserver_version().await.unwrap();
        assert_eq!(
            info.minor,
            version.minor().to_string(),
            "/version of {version}"
        );
        if version < KubernetesVersion::V1_37 {
            let Err(kube::Error::Api(status)) = result else {
                panic!(
                    "{version}: an apply with nodeAllocatableResources was accepted: {result:?}"
                );
            };
            assert_eq!(status.code, 500, "{version}: {status:?}");
            assert_eq!(
                status.message,
                "failed to create typed patch object (/node-1-dra.cpu-0; resource.k8s.io/v1, Kind=ResourceSlice): \
                 .spec.devices[0].nodeAllocatableResources: field not declared in schema",
                "{version}"
            );
            assert!(status.reason.is_empty(), "{version}: {status:?}");
            assert!(server.slices().is_empty(), "{version}: nothing stored");
        } else {
            let stored = result.unwrap();
            let device = &stored.spec.devices.as_ref().unwrap()[0];
            assert!(
                device.node_allocatable_resources.is_none(),
                "1.37 declares the field but its gate is off by default"
            );
            assert_eq!(device.allow_multiple_allocations, Some(true));
            assert_eq!(
                device.capacity.as_ref().unwrap()["dra.cpu/cpu"].value.0,
                "1k",
                "canonical quantity"
            );
        }
    }
}

#[tokio::test]
async fn consumable_capacity_is_dropped_where_its_gate_is_off() {
    for (version, gates, kept) in [
        (KubernetesVersion::V1_34, "", false),
        (KubernetesVersion::V1_35, "", false),
        (KubernetesVersion::V1_34, "DRAConsumableCapacity=true", true),
        (KubernetesVersion::V1_36, "", true),
        (
            KubernetesVersion::V1_36,
            "DRAConsumableCapacity=false",
            false,
        ),
    ] {
        let server = FakeApiServer::start_with(
            FakeApiServerOptions::parse(&version.to_string(), gates).unwrap(),
        )
        .unwrap();
        let slices: Api<ResourceSlice> = Api::all(server.client().await.unwrap());
        let mut body = grouped_mapped_slice("s");
        body["spec"]["devices"][0]
            .as_object_mut()
            .unwrap()
            .remove("nodeAllocatableResources");
        let applied: ResourceSlice = serde_json::from_value(body).unwrap();
        let stored = apply_as_driver(&slices, "s", &applied).await.unwrap();
        let device = &stored.spec.devices.as_ref().unwrap()[0];
        assert_eq!(
            device.allow_multiple_allocations.is_some(),
            kept,
            "{version} {gates:?}"
        );
    }
}

#[tokio::test]
async fn the_136_mapping_shape_is_kept_on_136_with_its_gate() {
    let server = FakeApiServer::start_with(
        FakeApiServerOptions::parse("1.36", "DRANodeAllocatableResources=true").unwrap(),
    )
    .unwrap();
    let client = server.client().await.unwrap();
    let slices: Api<kube::core::DynamicObject> = Api::all_with(
        client,
        &kube::core::ApiResource::erase::<ResourceSlice>(&()),
    );
    let mut body = slice_json("s", "node-1", 1);
    body["spec"]["devices"][0]["nodeAllocatableResourceMappings"] =
        json!({"cpu": {"capacityKey": "dra.cpu/cpu"}});
    let applied: kube::core::DynamicObject = serde_json::from_value(body).unwrap();
    let stored = apply_as_driver(&slices, "s", &applied).await.unwrap();
    assert_eq!(
        stored.data["spec"]["devices"][0]["nodeAllocatableResourceMappings"]["cpu"]["capacityKey"],
        "dra.cpu/cpu"
    );
}

#[tokio::test]
async fn resource_slice_field_selectors_are_the_real_servers() {
    let server = FakeApiServer::start().unwrap();
    let slices: Api<ResourceSlice> = Api::all(server.client().await.unwrap());
    for selector in ["spec.nodeName=n", "spec.driver=dra.cpu", "metadata.name=x"] {
        slices
            .list(&ListParams::default().fields(selector))
            .await
            .unwrap_or_else(|e| panic!("{selector}: {e}"));
    }
    for selector in ["spec.pool.name=n", "metadata.namespace=default"] {
        let Err(kube::Error::Api(status)) =
            slices.list(&ListParams::default().fields(selector)).await
        else {
            panic!("{selector} was accepted");
        };
        assert_eq!(status.code, 400, "{selector}");
        let field = selector.split('=').next().unwrap();
        assert_eq!(
            status.message,
            format!("field label not supported: {field}")
        );
    }
}

#[tokio::test]
async fn openapi_v3_says_which_device_fields_each_release_declares() {
    for version in KubernetesVersion::ALL {
        let server = FakeApiServer::start_with(FakeApiServerOptions::for_version(version)).unwrap();
        let client = server.client().await.unwrap();
        let request = http::Request::get("/openapi/v3/apis/resource.k8s.io/v1")
            .body(Vec::new())
            .unwrap();
        let doc: Value = client.request(request).await.unwrap();
        let fields = &doc["components"]["schemas"]["io.k8s.api.resource.v1.Device"]["properties"];
        assert_eq!(
            fields.get("nodeAllocatableResources").is_some(),
            version == KubernetesVersion::V1_37,
            "{version}"
        );
        assert_eq!(
            fields.get("nodeAllocatableResourceMappings").is_some(),
            version == KubernetesVersion::V1_36,
            "{version}"
        );
    }
}

#[test]
fn embedded_slice_schemas_are_kubernetes_validates() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/extract-slice-schemas.py"
    );
    let output = match std::process::Command::new("python3")
        .arg(script)
        .arg("--check")
        .output()
    {
        Ok(o) => o,
        Err(e) => return dra_cpu_tests::skip::skip_or_fail_in_ci(format!("python3: {e}")),
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("No module named") {
        return dra_cpu_tests::skip::skip_or_fail_in_ci(format!("kubernetes-validate: {stderr}"));
    }
    assert!(output.status.success(), "{stderr}");
}

#[tokio::test]
async fn an_expired_watch_ends_with_a_410_error_event_in_the_stream() {
    let server = FakeApiServer::start().unwrap();
    let slices: Api<ResourceSlice> = Api::all(server.client().await.unwrap());
    let first = create_slice(&slices, "a", "node-1", 1).await;
    let rv = first.metadata.resource_version.clone().unwrap();
    let stream = slices.watch(&WatchParams::default(), &rv).await.unwrap();
    futures::pin_mut!(stream);
    create_slice(&slices, "b", "node-1", 1).await;
    let event = next_event(&mut stream).await;
    assert!(matches!(event, WatchEvent::Added(_)), "{event:?}");
    server.expire_watches();
    let event = next_event(&mut stream).await;
    let WatchEvent::Error(status) = event else {
        panic!("expected an ERROR event, got {event:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    assert!(
        status.message.starts_with("too old resource version: "),
        "{}",
        status.message
    );
    assert!(
        tokio::time::timeout(HANG_GUARD, stream.next())
            .await
            .expect("ends")
            .is_none(),
        "the stream ends after the error"
    );
    // Resuming from the compacted version fails the same way at once.
    let stream = slices.watch(&WatchParams::default(), &rv).await.unwrap();
    futures::pin_mut!(stream);
    let event = next_event(&mut stream).await;
    assert!(matches!(event, WatchEvent::Error(s) if s.code == 410));
    // From the current version it works.
    let current = server.resource_version().to_string();
    let stream = slices
        .watch(&WatchParams::default(), &current)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    create_slice(&slices, "c", "node-1", 1).await;
    let event = next_event(&mut stream).await;
    assert!(matches!(event, WatchEvent::Added(s) if s.metadata.name.as_deref() == Some("c")));
}
