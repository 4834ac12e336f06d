//! The NRI client against an in-process runtime speaking real ttrpc over the
//! multiplexed socket. This covers what containerd 1.7 (NRI 0.6.1) never
//! does: dedicated RPCs for every event, chunked Synchronize, and the
//! `UNIMPLEMENTED` → `StateChange` fallback of newer runtimes.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dra_cpu_nri::client::{NriClient, NriClientOptions};
use dra_cpu_nri::events::EventMask;
use dra_cpu_nri::plugin::{ContainerCreation, NriPlugin, PluginError, RuntimeInfo};
use dra_cpu_proto::nri::api::{self, Container, ContainerUpdate, Event, PodSandbox};
use support::nri_runtime::{self, CreateOnly, InProcessRuntime};

const CALL: Duration = Duration::from_secs(10);

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_duration(CALL)
}

async fn connect<P: NriPlugin>(
    plugin: Arc<P>,
    handler_timeout: Duration,
) -> (InProcessRuntime, NriClient) {
    let mut options = NriClientOptions::new("test", "42");
    options.handler_timeout = handler_timeout;
    nri_runtime::connect(plugin, &options).await
}

fn status_code(err: ttrpc::Error) -> (ttrpc::Code, String) {
    match err {
        ttrpc::Error::RpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected an RPC status, got {other:?}"),
    }
}

fn container(id: &str) -> Container {
    let mut c = Container::new();
    c.id = id.to_string();
    c.name = format!("name-{id}");
    c
}

/// Records which handler ran; behaviour switches on the container name.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    synced: Mutex<Vec<(usize, usize)>>,
}

impl Recorder {
    fn note(&self, what: String) {
        self.calls.lock().unwrap().push(what);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl NriPlugin for Recorder {
    fn events(&self) -> EventMask {
        EventMask::of(&[
            Event::RUN_POD_SANDBOX,
            Event::STOP_POD_SANDBOX,
            Event::REMOVE_POD_SANDBOX,
            Event::POST_UPDATE_POD_SANDBOX,
            Event::CREATE_CONTAINER,
            Event::POST_CREATE_CONTAINER,
            Event::START_CONTAINER,
            Event::POST_START_CONTAINER,
            Event::POST_UPDATE_CONTAINER,
            Event::REMOVE_CONTAINER,
        ])
    }
    async fn configure(&self, runtime: &RuntimeInfo, config: &str) -> Result<(), PluginError> {
        self.note(format!("configure {} {config}", runtime.runtime_name));
        Ok(())
    }
    async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        self.synced
            .lock()
            .unwrap()
            .push((pods.len(), containers.len()));
        Ok(containers
            .iter()
            .take(2)
            .map(|c| {
                let mut u = ContainerUpdate::new();
                u.container_id = c.id.clone();
                u
            })
            .collect())
    }
    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.note(format!("run_pod_sandbox {}", pod.id));
        Ok(())
    }
    async fn stop_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.note(format!("stop_pod_sandbox {}", pod.id));
        Ok(())
    }
    async fn remove_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.note(format!("remove_pod_sandbox {}", pod.id));
        Ok(())
    }
    async fn post_update_pod_sandbox(&self, pod: PodSandbox) -> Result<(), PluginError> {
        self.note(format!("post_update_pod_sandbox {}", pod.id));
        Ok(())
    }
    async fn create_container(
        &self,
        _pod: PodSandbox,
        c: Container,
    ) -> Result<ContainerCreation, PluginError> {
        self.note(format!("create_container {}", c.id));
        match c.id.as_str() {
            "fails" => Err(PluginError::failed("refused: no exclusive CPUs left")),
            "panics" => panic!("bug in handler"),
            "hangs" => futures::future::pending().await,
            _ => Ok(ContainerCreation::default()),
        }
    }
    async fn post_create_container(
        &self,
        _pod: PodSandbox,
        c: Container,
    ) -> Result<(), PluginError> {
        self.note(format!("post_create_container {}", c.id));
        Ok(())
    }
    async fn start_container(&self, _pod: PodSandbox, c: Container) -> Result<(), PluginError> {
        self.note(format!("start_container {}", c.id));
        Ok(())
    }
    async fn post_start_container(
        &self,
        _pod: PodSandbox,
        c: Container,
    ) -> Result<(), PluginError> {
        self.note(format!("post_start_container {}", c.id));
        Ok(())
    }
    async fn post_update_container(
        &self,
        _pod: PodSandbox,
        c: Container,
    ) -> Result<(), PluginError> {
        self.note(format!("post_update_container {}", c.id));
        Ok(())
    }
    async fn remove_container(&self, _pod: PodSandbox, c: Container) -> Result<(), PluginError> {
        self.note(format!("remove_container {}", c.id));
        Ok(())
    }
}

/// Implements nothing but container creation, and changes nothing there.
fn create_only() -> Arc<CreateOnly> {
    Arc::new(CreateOnly(ContainerCreation::default))
}

async fn configure(runtime: &InProcessRuntime, nri_version: &str) -> api::ConfigureResponse {
    let mut req = api::ConfigureRequest::new();
    req.runtime_name = "fake-runtime".into();
    req.runtime_version = "0.0.1".into();
    req.NRI_version = nri_version.into();
    req.config = "cfg".into();
    runtime.plugin.configure(ctx(), &req).await.unwrap()
}

#[tokio::test]
async fn registers_and_configures_with_the_declared_event_mask() {
    let plugin = Arc::new(Recorder::default());
    let (runtime, client) = connect(plugin.clone(), Duration::from_secs(1)).await;
    assert_eq!(
        runtime.log.lock().unwrap().registrations,
        vec![("test".to_string(), "42".to_string())]
    );
    assert!(
        client.runtime_info().is_none(),
        "no runtime info before Configure"
    );

    let rsp = configure(&runtime, "v0.12.2").await;
    assert_eq!(rsp.events, plugin.events().bits());
    assert_eq!(
        rsp.events, 0x157f,
        "bits 1-7, 9, 11 and 13 of the declared events"
    );
    let info = client.runtime_info().unwrap();
    assert_eq!(info.runtime_name, "fake-runtime");
    assert!(info.unsolicited_updates_safe());
    assert_eq!(
        plugin.calls(),
        vec!["configure fake-runtime cfg".to_string()]
    );
}

#[tokio::test]
async fn unimplemented_rpcs_answer_unimplemented_and_state_change_still_succeeds() {
    let (runtime, _client) = connect(create_only(), Duration::from_secs(1)).await;
    let mut req = api::RunPodSandboxRequest::new();
    req.pod = Some(PodSandbox::new()).into();
    let (code, message) = status_code(
        runtime
            .plugin
            .run_pod_sandbox(ctx(), &req)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ttrpc::Code::UNIMPLEMENTED, "{message}");
    assert!(message.contains("RunPodSandbox"), "{message}");

    let (code, _) = status_code(
        runtime
            .plugin
            .stop_container(ctx(), &api::StopContainerRequest::new())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ttrpc::Code::UNIMPLEMENTED);

    // A newer runtime now falls back to StateChange: that must not fail.
    let mut event = api::StateChangeEvent::new();
    event.event = Event::RUN_POD_SANDBOX.into();
    runtime.plugin.state_change(ctx(), &event).await.unwrap();
}

#[tokio::test]
async fn state_change_and_dedicated_rpcs_reach_the_same_handlers() {
    let plugin = Arc::new(Recorder::default());
    let (runtime, _client) = connect(plugin.clone(), Duration::from_secs(1)).await;
    let cases = [
        (Event::RUN_POD_SANDBOX, "run_pod_sandbox pod-1"),
        (Event::STOP_POD_SANDBOX, "stop_pod_sandbox pod-1"),
        (Event::REMOVE_POD_SANDBOX, "remove_pod_sandbox pod-1"),
        (
            Event::POST_UPDATE_POD_SANDBOX,
            "post_update_pod_sandbox pod-1",
        ),
        (Event::POST_CREATE_CONTAINER, "post_create_container c-1"),
        (Event::START_CONTAINER, "start_container c-1"),
        (Event::POST_START_CONTAINER, "post_start_container c-1"),
        (Event::POST_UPDATE_CONTAINER, "post_update_container c-1"),
        (Event::REMOVE_CONTAINER, "remove_container c-1"),
    ];
    for (event, want) in cases {
        let mut pod = PodSandbox::new();
        pod.id = "pod-1".into();
        let mut req = api::StateChangeEvent::new();
        req.event = event.into();
        req.pod = Some(pod).into();
        req.container = Some(container("c-1")).into();
        runtime.plugin.state_change(ctx(), &req).await.unwrap();
        assert_eq!(
            plugin.calls().last().map(String::as_str),
            Some(want),
            "{event:?}"
        );
    }
    // Events with a reply payload are never notifications: acknowledged,
    // no handler runs.
    let before = plugin.calls().len();
    let mut req = api::StateChangeEvent::new();
    req.event = Event::CREATE_CONTAINER.into();
    runtime.plugin.state_change(ctx(), &req).await.unwrap();
    assert_eq!(plugin.calls().len(), before);

    let mut req = api::StartContainerRequest::new();
    req.container = Some(container("c-2")).into();
    runtime.plugin.start_container(ctx(), &req).await.unwrap();
    assert_eq!(
        plugin.calls().last().map(String::as_str),
        Some("start_container c-2")
    );
}

#[tokio::test]
async fn chunked_synchronize_is_answered_once_on_the_last_chunk() {
    let plugin = Arc::new(Recorder::default());
    let (runtime, _client) = connect(plugin.clone(), Duration::from_secs(1)).await;
    let chunk = |ids: &[&str], more: bool| {
        let mut req = api::SynchronizeRequest::new();
        req.pods = vec![PodSandbox::new()];
        req.containers = ids.iter().map(|id| container(id)).collect();
        req.more = more;
        req
    };
    let first = runtime
        .plugin
        .synchronize(ctx(), &chunk(&["a", "b"], true))
        .await
        .unwrap();
    assert!(first.more && first.update.is_empty());
    let second = runtime
        .plugin
        .synchronize(ctx(), &chunk(&["c"], true))
        .await
        .unwrap();
    assert!(second.more && second.update.is_empty());
    assert!(
        plugin.synced.lock().unwrap().is_empty(),
        "handler ran before the last chunk"
    );
    let last = runtime
        .plugin
        .synchronize(ctx(), &chunk(&["d"], false))
        .await
        .unwrap();
    assert!(!last.more);
    let updated: Vec<&str> = last
        .update
        .iter()
        .map(|u| u.container_id.as_str())
        .collect();
    assert_eq!(updated, vec!["a", "b"]);
    assert_eq!(*plugin.synced.lock().unwrap(), vec![(3, 4)]);

    // A following unchunked Synchronize starts from scratch.
    runtime
        .plugin
        .synchronize(ctx(), &chunk(&["x"], false))
        .await
        .unwrap();
    assert_eq!(plugin.synced.lock().unwrap().last(), Some(&(1, 1)));
}

#[tokio::test]
async fn large_synchronize_crosses_the_multiplexer_intact() {
    let plugin = Arc::new(Recorder::default());
    let (runtime, _client) = connect(plugin.clone(), Duration::from_secs(1)).await;
    let mut req = api::SynchronizeRequest::new();
    req.containers = (0..5000)
        .map(|i| {
            let mut c = container(&format!("container-{i:05}"));
            c.env = (0..10)
                .map(|j| format!("VARIABLE_{j}=value-{i}-{j}"))
                .collect();
            c
        })
        .collect();
    let size = protobuf::Message::compute_size(&req);
    assert!(size > 1 << 20, "request of {size} bytes is not large");
    let rsp = runtime.plugin.synchronize(ctx(), &req).await.unwrap();
    assert_eq!(rsp.update.len(), 2);
    assert_eq!(*plugin.synced.lock().unwrap(), vec![(0, 5000)]);
}

#[tokio::test]
async fn handler_errors_panics_and_hangs_become_error_replies() {
    let plugin = Arc::new(Recorder::default());
    let (runtime, _client) = connect(plugin.clone(), Duration::from_millis(200)).await;
    let create = |id: &str| {
        let mut req = api::CreateContainerRequest::new();
        req.container = Some(container(id)).into();
        req
    };
    let (code, message) = status_code(
        runtime
            .plugin
            .create_container(ctx(), &create("fails"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (ttrpc::Code::UNKNOWN, "refused: no exclusive CPUs left")
    );

    let (code, message) = status_code(
        runtime
            .plugin
            .create_container(ctx(), &create("panics"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ttrpc::Code::INTERNAL);
    assert!(message.contains("bug in handler"), "{message}");

    let (code, message) = status_code(
        runtime
            .plugin
            .create_container(ctx(), &create("hangs"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ttrpc::Code::DEADLINE_EXCEEDED, "{message}");

    // Still serving.
    runtime
        .plugin
        .create_container(ctx(), &create("fine"))
        .await
        .unwrap();
    assert_eq!(
        plugin.calls().last().map(String::as_str),
        Some("create_container fine")
    );
}

#[tokio::test]
async fn unsolicited_updates_reach_the_runtime() {
    let (runtime, client) = connect(create_only(), Duration::from_secs(1)).await;
    let update = |id: &str| {
        let mut u = ContainerUpdate::new();
        u.container_id = id.to_string();
        u
    };
    let failed = client
        .update_containers(vec![update("c-1"), update("unknown-2")])
        .await
        .unwrap();
    assert_eq!(
        failed
            .iter()
            .map(|u| u.container_id.as_str())
            .collect::<Vec<_>>(),
        vec!["unknown-2"]
    );
    let log = runtime.log.lock().unwrap();
    assert_eq!(log.updates.len(), 1);
    assert_eq!(log.updates[0].len(), 2);
}

#[tokio::test]
async fn runtime_going_away_ends_the_connection() {
    let (runtime, mut client) = connect(create_only(), Duration::from_secs(1)).await;
    drop(runtime);
    assert!(
        client.closed().await.is_ok(),
        "orderly close by the runtime"
    );
    assert!(
        client.update_containers(vec![]).await.is_err(),
        "no updates through a closed connection"
    );
}
